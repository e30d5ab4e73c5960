"""The health side of ``minimega train``: the monitor on every step, the policy, rollback with skipped batches, the
throughput watch, and metrics as JSON lines and TensorBoard scalars (`minimega.train.health` holds the monitors)."""
from __future__ import annotations

import argparse
import importlib.util
import json
import math
import sys

from ..train.health import POLICIES, HealthMonitor, StepGuard, ThroughputWatch
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
    p.add_argument("--throughput-drop", type=positive_float, default=None, metavar="F",
                   help="warn, with the evidence, when a step's tokens/s falls below F times the median of the last "
                        "20 steps, e.g. 0.5 (default: not watched)")
    p.add_argument("--tensorboard", default=None, metavar="DIR",
                   help="write TensorBoard scalars per step to DIR (loss, grad norm, lr, tokens/s, memory; the "
                        "gradient norm costs one scalar all-reduce when no clipping or --on-spike computes it); "
                        "needs the tensorboard package")


def _watch_settings(args: argparse.Namespace) -> dict:
    """--metrics, --throughput-drop and --tensorboard (each works with or without --on-spike)."""
    drop = args.throughput_drop
    if drop is not None and not 0 < drop < 1:
        raise ValueError(f"--throughput-drop {drop}: a fraction of the median tokens/s, in (0, 1), e.g. 0.5")
    if args.tensorboard and importlib.util.find_spec("tensorboard") is None:
        raise ValueError("--tensorboard needs the tensorboard package, which is not installed: "
                         "pip install tensorboard (or pip install -e '.[test]')")
    return {k: v for k, v in (("metrics", args.metrics), ("throughput_drop", drop),
                              ("tensorboard", args.tensorboard)) if v is not None}


def health_settings(args: argparse.Namespace) -> dict | None:
    """The monitor's settings from the flags, or None; refuses what would do nothing."""
    policy = args.on_spike
    watch = _watch_settings(args)
    if policy is None:
        given = [f for f, v in (("--skip-batches", args.skip_batches), ("--spike-window", args.spike_window),
                                ("--spike-z", args.spike_z)) if v is not None]
        if given:
            raise ValueError(f"{', '.join(given)} only matter with --on-spike warn|skip|rollback")
        return watch or None
    if args.skip_batches is not None and policy != "rollback":
        raise ValueError(f"--skip-batches only matters with --on-spike rollback, not {policy}")
    if policy == "rollback" and not (args.save_every and (args.save_dir or args.resume)):
        raise ValueError("--on-spike rollback needs --save-dir and --save-every: it goes back to the last checkpoint")
    window = 50 if args.spike_window is None else args.spike_window
    if window < 2:
        raise ValueError(f"--spike-window {window}: a z-score needs at least 2 steps")
    return {"policy": policy, "window": window, "z": 6.0 if args.spike_z is None else args.spike_z,
            "skip_batches": 1 if args.skip_batches is None else args.skip_batches, **watch}


def _num(x):
    """JSON has no NaN or inf: those are written as strings."""
    return x if x is None or x == x and abs(x) != float("inf") else str(x)


class RunHealth:
    """One rank's health state for a run.

    Args:
        settings: None (no monitor), or ``{"policy", "window", "z", "skip_batches", "metrics", "throughput_drop",
            "tensorboard"}`` (each optional).
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
        self.last: tuple = (None, None)
        if self.guard is None and self.settings.get("tensorboard"):
            engine.step_guard = self._note                # the engine computes the norm for its guard hook
        drop = self.settings.get("throughput_drop")
        self.throughput = ThroughputWatch(fraction=drop) if drop else None
        self._metrics = open(settings["metrics"], "a") if settings and settings.get("metrics") and rank == 0 else None
        self._board = None
        if self.settings.get("tensorboard") and rank == 0:
            from torch.utils.tensorboard import SummaryWriter
            self._board = SummaryWriter(self.settings["tensorboard"])

    def _note(self, step: int, loss: float, grad_norm) -> bool:
        self.last = (loss, grad_norm)
        return True

    def batch_index(self, step: int) -> int:
        from .. import data                       # torch: loaded by a run, never by `minimega --help`
        return data.batch_index(step, self.skip)

    # --8<-- [start:after_step]
    def after_step(self, step: int, index: int, loss: float, tokens_per_s: float) -> bool:
        """Log the step; under 'rollback', reload the last good checkpoint and skip the offending batches.
        Returns True when the run went back (the caller continues from ``engine.step``)."""
        verdict = self.guard.latest if self.guard else None
        norm = (self.guard or self).last[1]
        if norm is None and self.engine.grad_norms:
            norm = self.engine.grad_norms[-1]
        self._write({"step": step, "batch": index, "loss": _num(loss), "grad_norm": _num(norm),
                     "tokens_per_s": tokens_per_s, "health": verdict.as_dict() if verdict else None})
        self._scalars(step, loss, norm, tokens_per_s)
        slow = self.throughput.check(step, tokens_per_s) if self.throughput else None
        if slow is not None:
            event = {"event": "throughput drop", "evidence": slow.as_dict()}
            self.events.append(event)
            self._write(event)
            self._say(f"health: {slow.describe()} (this rank's own step time; warned, nothing else done)")
        if verdict is None:
            return False
        self.guard.latest = None
        if self.guard.policy != "rollback":
            action = "applied anyway" if self.guard.policy == "warn" else "not applied"
            self._say(f"health: {verdict.describe()}; the step was {action} (batch {index})")
            return False
        self.engine.wait_for_save()                             # an async save in flight is the last good one
        from .. import checkpoint
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

    def _scalars(self, step: int, loss: float, norm, tokens_per_s: float) -> None:
        """TensorBoard scalars of one step (rank 0): loss, grad norm, lr, tokens/s, model-state bytes."""
        if self._board is None:
            return
        import torch
        rows = {"train/loss": loss, "train/grad_norm": norm, "train/lr": self.engine.config.lr,
                "train/tokens_per_s": tokens_per_s,
                "memory/model_states_bytes": float(sum(v for v in self.engine.memory_at_step.values()
                                                       if isinstance(v, (int, float))))}
        if torch.cuda.is_available() and self.engine.mesh.device.type == "cuda":
            rows["memory/cuda_allocated_bytes"] = float(torch.cuda.memory_allocated(self.engine.mesh.device))
        for tag, value in rows.items():
            if value is not None and math.isfinite(value):
                self._board.add_scalar(tag, value, step)
        self._board.flush()

    def close(self) -> None:
        if self._metrics is not None:
            self._metrics.close()
        if self._board is not None:
            self._board.close()
