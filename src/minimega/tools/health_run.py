"""The health side of ``minimega train``: the monitor on every step, the policy, rollback with skipped batches, and
metrics as JSON lines (`minimega.health` holds the monitor itself)."""
from __future__ import annotations

import argparse
import json
import sys

from .. import checkpoint, data
from ..health import POLICIES, HealthMonitor, StepGuard
from .args import nonnegative_int, positive_float, positive_int


def add_health_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--on-spike", choices=POLICIES, default=None,
                   help="watch every step (non-finite loss or gradients, loss spike, gradient-norm outlier) and "
                        "warn, skip the step, or roll back to the last checkpoint skipping the offending batches "
                        "(default: no monitor)")
    p.add_argument("--skip-batches", type=positive_int, default=None,
                   help="with --on-spike rollback: batches skipped from the offending one on (default: 1)")
    p.add_argument("--spike-window", type=positive_int, default=None,
                   help="with --on-spike: healthy steps the z-score is taken over (default: 50)")
    p.add_argument("--spike-z", type=positive_float, default=None,
                   help="with --on-spike: flag a loss or gradient norm this many std above the window's mean "
                        "(default: 6)")
    p.add_argument("--metrics", default=None, metavar="FILE",
                   help="append one JSON line per step (loss, gradient norm, tokens/s, verdict) and per rollback")
    p.add_argument("--skip-batch", type=nonnegative_int, action="append", default=None, metavar="INDEX",
                   help="never train on the batch of this index (repeatable): the data of a run that skipped it")


def health_settings(args: argparse.Namespace) -> dict | None:
    """The monitor's settings from the flags, or None; refuses what would do nothing."""
    policy = args.on_spike
    if policy is None:
        given = [f for f, v in (("--skip-batches", args.skip_batches), ("--spike-window", args.spike_window),
                                ("--spike-z", args.spike_z)) if v is not None]
        if given:
            raise ValueError(f"{', '.join(given)} only matter with --on-spike warn|skip|rollback")
        return {"metrics": args.metrics} if args.metrics else None
    if args.skip_batches is not None and policy != "rollback":
        raise ValueError(f"--skip-batches only matters with --on-spike rollback, not {policy}")
    if policy == "rollback" and not (args.save_every and (args.save_dir or args.resume)):
        raise ValueError("--on-spike rollback needs --save-dir and --save-every: it goes back to the last checkpoint")
    window = 50 if args.spike_window is None else args.spike_window
    if window < 2:
        raise ValueError(f"--spike-window {window}: a z-score needs at least 2 steps")
    return {"policy": policy, "window": window, "z": 6.0 if args.spike_z is None else args.spike_z,
            "skip_batches": 1 if args.skip_batches is None else args.skip_batches, "metrics": args.metrics}


def _num(x):
    """JSON has no NaN or inf: those are written as strings."""
    return x if x is None or x == x and abs(x) != float("inf") else str(x)


class RunHealth:
    """One rank's health state for a run.

    Args:
        settings: None (no monitor), or ``{"policy", "window", "z", "skip_batches", "metrics"}``.
        skip: batch indices never to train on (``--skip-batch``); a rollback adds the offending ones.
        save_dir: where the last good checkpoint lives (rollback reads it).
        rank: this rank; rank 0 writes the log lines and the metrics file.
    """

    def __init__(self, engine, settings: dict | None, skip=(), save_dir=None, rank: int = 0):
        self.engine, self.settings, self.save_dir, self.rank = engine, settings or {}, save_dir, rank
        self.skip = sorted(set(skip))
        self.events: list[dict] = []
        self.guard = None
        if settings and settings.get("policy"):
            self.guard = StepGuard(HealthMonitor(window=settings["window"], z=settings["z"],
                                                 min_history=min(10, settings["window"])), settings["policy"])
            engine.step_guard = self.guard
        self._metrics = open(settings["metrics"], "a") if settings and settings.get("metrics") and rank == 0 else None

    def batch_index(self, step: int) -> int:
        return data.batch_index(step, self.skip)

    # --8<-- [start:after_step]
    def after_step(self, step: int, index: int, loss: float, tokens_per_s: float) -> bool:
        """Log the step; under 'rollback', reload the last good checkpoint and skip the offending batches.
        Returns True when the run went back (the caller continues from ``engine.step``)."""
        verdict = self.guard.latest if self.guard else None
        norm = self.guard.last[1] if self.guard else (self.engine.grad_norms[-1] if self.engine.grad_norms else None)
        self._write({"step": step, "batch": index, "loss": _num(loss), "grad_norm": _num(norm),
                     "tokens_per_s": tokens_per_s, "health": verdict.as_dict() if verdict else None})
        if verdict is None:
            return False
        self.guard.latest = None
        if self.guard.policy != "rollback":
            action = "applied anyway" if self.guard.policy == "warn" else "not applied"
            self._say(f"health: {verdict.describe()}; the step was {action} (batch {index})")
            return False
        self.engine.wait_for_save()                             # an async save in flight is the last good one
        latest = checkpoint.resolve_or_none(self.save_dir) if self.save_dir else None
        if latest is None:
            raise RuntimeError(f"health: {verdict.describe()}; --on-spike rollback found no checkpoint in "
                               f"{self.save_dir} to go back to (save earlier: a smaller --save-every)")
        bad = []
        i = index
        while len(bad) < self.settings["skip_batches"]:          # this batch and the next ones not yet skipped
            if i not in self.skip:
                bad.append(i)
            i += 1
        self.skip = sorted(set(self.skip) | set(bad))
        back_to = self.engine.load(latest)
        self.guard.monitor.forget_after(back_to)
        event = {"event": "rollback", "at_step": step, "batch": index, "to_step": back_to, "skipped": bad,
                 "evidence": verdict.as_dict()}
        self.events.append(event)
        self._write(event)
        self._say(f"health: {verdict.describe()}; rolled back to the checkpoint at step {back_to} and skipping "
                  f"batch(es) {bad} (all skipped: {self.skip}; pass them as --skip-batch to resume this run)")
        return True
    # --8<-- [end:after_step]

    def _say(self, line: str) -> None:
        if self.rank == 0:
            print(f"\nminimega train: {line}", file=sys.stderr, flush=True)

    def _write(self, row: dict) -> None:
        if self._metrics is not None:
            self._metrics.write(json.dumps(row) + "\n")
            self._metrics.flush()

    def close(self) -> None:
        if self._metrics is not None:
            self._metrics.close()
