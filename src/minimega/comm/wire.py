"""A wire you can slow down: each collective occupies a simulated link for a set time (an observer of `comm`).

[Note: a wire you can slow down]
On two CPU cores a collective of a tiny model takes microseconds, so "the all-reduce overlapped with
backward" cannot be told apart from "it ran synchronously" by timing. With a delay D, each collective
occupies one simulated wire per process for D seconds, one after another as on a real link:

    ready_at = max(now, wire_free_at) + D;   wire_free_at = ready_at

and waiting on it returns no earlier than ready_at. Compute done between issue and wait hides the delay;
a synchronous call (or any call under ``comm.overlap(False)``) pays all of it at once. A step of k
collectives therefore costs about k·D more when nothing overlaps and much less when they are hidden.

`blocked_seconds()` sums the time this process spent waiting for communication (inside ``wait()`` or a
synchronous call): the exposed part of communication, which load on the machine does not inflate (slower
compute only hides more), so tests compare it rather than noisy step times.
"""
from __future__ import annotations

import os
import time
from contextlib import contextmanager


def _env_delay() -> float:
    text = os.environ.get("MINIMEGA_COMM_DELAY_MS", "0")
    try:
        ms = float(text)
    except ValueError:
        ms = float("nan")
    if not ms >= 0 or ms == float("inf"):
        raise ValueError(f"MINIMEGA_COMM_DELAY_MS={text!r}: set a number of milliseconds >= 0, or unset it")
    return ms / 1e3


class Wire:
    """The simulated link: a delay per collective (0: none), and the seconds spent blocked on collectives."""

    def __init__(self, delay: float = 0.0):
        self.delay, self.free_at, self.blocked = delay, 0.0, 0.0

    def issued(self, call) -> None:
        now = time.perf_counter()
        if self.delay > 0:
            self.free_at = max(now, self.free_at) + self.delay
        call.ready_at = self.free_at if self.delay > 0 else now

    def waiting(self, call) -> None:
        call.wait_start = time.perf_counter()
        remaining = call.ready_at - call.wait_start
        if remaining > 0:
            time.sleep(remaining)

    def done(self, call) -> None:
        self.blocked += time.perf_counter() - call.wait_start


WIRE = Wire(_env_delay())
"""This process's wire (`comm` attaches it first, so it sleeps before the other observers stamp times)."""


def blocked_seconds() -> float:
    """Total seconds this process has spent blocked on collectives (waits and synchronous calls)."""
    return WIRE.blocked


@contextmanager
def delay(seconds: float):
    """Within the block, every collective over more than one rank takes at least ``seconds`` on the wire."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 <= seconds < float("inf"):
        raise ValueError(f"comm.delay: seconds must be a finite number >= 0, got {seconds!r}")
    old, WIRE.delay = WIRE.delay, float(seconds)
    try:
        yield
    finally:
        WIRE.delay = old
