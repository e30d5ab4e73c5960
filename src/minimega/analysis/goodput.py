"""Goodput: how often a large run fails, how often to checkpoint, and what each failure costs.

Failures of independent parts add up: a job on n GPUs fails n times as often as one on one GPU, so its mean
time between failures (MTBF) is the per-GPU one divided by n. The reference point is Llama 3 (Dubey et al.
2024, arXiv:2407.21783, section 3.3.4): in a 54-day snapshot of pre-training on 16,384 H100 GPUs, 466 job
interruptions, 47 planned and 419 unexpected.

A run that saves every ``tau`` seconds of work, at a cost of ``save`` seconds of stalled training each time,
and meets a failure every ``mtbf`` seconds on average loses, to first order:

    saving         save / tau                  of its time
    a failure      tau / 2 + restart           (on average half an interval of work is redone, plus the restart)

    waste(tau) = save / tau + (tau / 2 + restart) / mtbf

Setting d waste / d tau = 0 gives Young's interval (J. W. Young, "A first order approximation to the optimum
checkpoint interval", CACM 17(9), 1974), which Daly refined to higher order (J. T. Daly, Future Generation
Computer Systems 22(3), 2006); both agree when save << mtbf:

    tau* = sqrt(2 * save * mtbf),   waste(tau*) = sqrt(2 * save / mtbf) + restart / mtbf

An asynchronous save (``--async-save``) shrinks ``save`` to the snapshot copy, but the checkpoint it starts is
of no use until its background write is durable, ``durable`` seconds later (fsync, manifest, ``latest``). Saves
start at 0, tau, 2 tau, ...; a failure at u seconds into an interval (u uniform on [0, tau)) finds the save
started at the interval's beginning durable only when u >= durable, and otherwise falls back one more interval:

    lost = u          if u >= durable        E[lost] = (1/tau) [ integral_0^tau u du + integral_0^durable tau du ]
         = u + tau    if u <  durable                = tau / 2 + durable

    waste(tau) = save / tau + (tau / 2 + durable + restart) / mtbf

``durable`` adds a constant, so Young's interval is unchanged, with one bound: at most one save is in flight, so
the next save cannot start before the write is durable (tau >= durable, where the derivation above holds), and
the waste is convex in tau, so the best interval is max(sqrt(2 save mtbf), durable). A blocking save is durable
when training resumes: durable = 0. The asynchronous save trades ``save`` for ``durable``: at 131,072 GPUs
(Llama 3's rate) a 5 s copy with a 60 s write wastes 12.8 %, not the 8.5 % the copy alone suggests, against
29.4 % for the blocking 60 s save.
"""
from __future__ import annotations

import math

__all__ = ["LLAMA3_GPUS", "LLAMA3_DAYS", "LLAMA3_UNEXPECTED", "failures_per_day", "mtbf_hours",
           "young_daly_interval", "checkpoint_waste", "lost_per_failure", "goodput"]

LLAMA3_GPUS = 16384
LLAMA3_DAYS = 54
LLAMA3_UNEXPECTED = 419
"""Unexpected interruptions in Llama 3's 54-day snapshot on 16,384 GPUs (arXiv:2407.21783, section 3.3.4)."""


def _positive(**values) -> None:
    for name, v in values.items():
        if not (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0):
            raise ValueError(f"{name} must be a finite number > 0, got {v!r}")


# --8<-- [start:goodput]
def failures_per_day(gpus: float, failures: float = LLAMA3_UNEXPECTED, days: float = LLAMA3_DAYS,
                     at_gpus: float = LLAMA3_GPUS) -> float:
    """Expected failures per day of a job on ``gpus`` GPUs, scaled linearly from a measured rate (default:
    Llama 3's 419 in 54 days on 16,384 GPUs, 7.8 a day)."""
    _positive(gpus=gpus, failures=failures, days=days, at_gpus=at_gpus)
    return failures / days * gpus / at_gpus


def mtbf_hours(gpus: float, **rate) -> float:
    """Mean time between the job's failures, hours (Llama 3's rate: 3.1 h at 16,384 GPUs)."""
    return 24.0 / failures_per_day(gpus, **rate)


def _non_negative(**values) -> None:
    for name, v in values.items():
        if not (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0):
            raise ValueError(f"{name} must be a finite number >= 0, got {v!r}")


def young_daly_interval(save_s: float, mtbf_s: float, durable_s: float = 0.0) -> float:
    """The checkpoint interval (seconds of work between saves) that minimises the time lost:
    sqrt(2 * save * mtbf) (Young 1974; Daly 2006 to first order), and no shorter than the time an asynchronous
    save's write takes to become durable (the next save waits for it)."""
    _positive(save_s=save_s, mtbf_s=mtbf_s)
    _non_negative(durable_s=durable_s)
    return max(math.sqrt(2.0 * save_s * mtbf_s), durable_s)


def lost_per_failure(interval_s: float, restart_s: float = 0.0, durable_s: float = 0.0) -> float:
    """Seconds lost to one failure: on average half an interval of work redone, plus the time the newest save
    takes to become durable (a failure before then falls back one more interval), plus the restart."""
    _positive(interval_s=interval_s)
    _non_negative(restart_s=restart_s, durable_s=durable_s)
    if durable_s > interval_s:
        raise ValueError(f"durable_s ({durable_s:g}) > interval_s ({interval_s:g}): one save is in flight at a "
                         "time, so save at most every durable_s seconds")
    return interval_s / 2.0 + durable_s + restart_s


def checkpoint_waste(interval_s: float, save_s: float, mtbf_s: float, restart_s: float = 0.0,
                     durable_s: float = 0.0) -> float:
    """Fraction of the run's time lost to saving and to failures:
    save / tau + (tau / 2 + durable + restart) / mtbf."""
    _positive(save_s=save_s, mtbf_s=mtbf_s)
    return save_s / interval_s + lost_per_failure(interval_s, restart_s, durable_s) / mtbf_s


def goodput(interval_s: float, save_s: float, mtbf_s: float, restart_s: float = 0.0, durable_s: float = 0.0) -> float:
    """Fraction of the run's time that is useful training (first order; at least 0)."""
    return max(0.0, 1.0 - checkpoint_waste(interval_s, save_s, mtbf_s, restart_s, durable_s))
# --8<-- [end:goodput]
