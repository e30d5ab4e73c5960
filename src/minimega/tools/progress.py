"""Training progress for people and for logs: a tqdm bar on a terminal, plain lines anywhere else.

A bar redraws one line with carriage returns; written to a file or a pipe (a CI log, ``2> run.log``) that
becomes one line thousands of characters long. So the caller decides once, in the process that owns the
terminal (ranks may not see it), and the ranks draw whichever it chose.
"""
from __future__ import annotations

import io
import os
import sys
from typing import TextIO

BAR, LINES = "bar", "lines"


def mode_for(stream: TextIO) -> str:
    """``"bar"`` when `stream` is a terminal, else ``"lines"``."""
    isatty = getattr(stream, "isatty", None)
    return BAR if isatty is not None and isatty() else LINES


def _columns(stream: TextIO) -> int:
    """The terminal's width, 0 if `stream` is no terminal or the terminal does not say."""
    try:
        return os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        return 0


class StepProgress:
    """Steps done, loss and tokens/s for one run.

    Args:
        total: steps this run will take.
        mode: ``"bar"`` (tqdm, redrawn in place) or ``"lines"`` (one plain line at about every tenth of the
            run and at the last step, so a log of a 1,000-step run gets 10 short lines).
        stream: where to write (default: sys.stderr, next to the launcher's messages).
    """

    def __init__(self, total: int, mode: str, stream: TextIO | None = None):
        if mode not in (BAR, LINES):
            raise ValueError(f"progress mode must be {BAR!r} or {LINES!r}, got {mode!r}")
        self.total, self.mode, self.stream = total, mode, stream or sys.stderr
        self.every = max(1, total // 10)
        self.bar = None
        if mode == BAR:
            from tqdm import tqdm
            resizes = _columns(self.stream) > 0           # a terminal that reports no size gets 80 columns
            self.bar = tqdm(total=total, file=self.stream, unit="step", dynamic_ncols=resizes,
                            ncols=None if resizes else 80, leave=True,
                            bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}{postfix}]")

    def update(self, done: int, loss: float, tokens_per_s: float) -> None:
        """`done` steps finished (1-based), the last one's loss and the mean throughput so far."""
        if self.bar is not None:
            self.bar.set_postfix_str(f"loss {loss:.4f} | {tokens_per_s:,.0f} tok/s", refresh=False)
            self.bar.update(done - self.bar.n)
        elif done % self.every == 0 or done == self.total:
            print(f"step {done}/{self.total}  loss {loss:.4f}  {tokens_per_s:,.0f} tok/s", file=self.stream,
                  flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
