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

An asynchronous save (``--async-save``) shrinks ``save`` to the snapshot copy: tau* and the work redone per
failure shrink with its square root.
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


def young_daly_interval(save_s: float, mtbf_s: float) -> float:
    """The checkpoint interval (seconds of work between saves) that minimises the time lost:
    sqrt(2 * save * mtbf) (Young 1974; Daly 2006 to first order)."""
    _positive(save_s=save_s, mtbf_s=mtbf_s)
    return math.sqrt(2.0 * save_s * mtbf_s)


def lost_per_failure(interval_s: float, restart_s: float = 0.0) -> float:
    """Seconds lost to one failure: on average half an interval of work redone, plus the restart."""
    _positive(interval_s=interval_s)
    if not restart_s >= 0:
        raise ValueError(f"restart_s must be >= 0, got {restart_s!r}")
    return interval_s / 2.0 + restart_s


def checkpoint_waste(interval_s: float, save_s: float, mtbf_s: float, restart_s: float = 0.0) -> float:
    """Fraction of the run's time lost to saving and to failures: save / tau + (tau / 2 + restart) / mtbf."""
    _positive(save_s=save_s, mtbf_s=mtbf_s)
    return save_s / interval_s + lost_per_failure(interval_s, restart_s) / mtbf_s


def goodput(interval_s: float, save_s: float, mtbf_s: float, restart_s: float = 0.0) -> float:
    """Fraction of the run's time that is useful training (first order; at least 0)."""
    return max(0.0, 1.0 - checkpoint_waste(interval_s, save_s, mtbf_s, restart_s))
# --8<-- [end:goodput]
