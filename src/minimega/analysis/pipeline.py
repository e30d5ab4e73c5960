"""Pipeline bubbles and the micro-batches in flight per stage (GPipe §2.3, Narayanan et al. §2.2, Qi et al. §2.1)."""
from __future__ import annotations

from .memory import SCHEDULES


# --8<-- [start:bubble]
def bubble_ratio(p: int, m: int, v: int = 1) -> float:
    """Idle time over ideal compute time, t_pb / t_id = (p-1)/(v·m) (Narayanan §2.2).

    v = 1 for GPipe and 1F1B (same bubble, different memory); v > 1 for interleaved 1F1B.
    """
    return (p - 1) / (v * m)


def bubble_fraction(p: int, m: int, schedule: str = "1f1b", v: int = 1) -> float:
    """Share of the whole step the pipeline is idle: ratio / (1 + ratio).

    GPipe and 1F1B: (p-1)/(m+p-1) (GPipe §2.3); interleaved: (p-1)/(v·m + p-1).
    ZB-H1 (Qi et al. 2023, arXiv:2401.10241 §2.1) idles (p-1)(t_F + t_B - t_W) where 1F1B idles
    (p-1)(t_F + t_B + t_W); with the backward split into equal input- and weight-gradient halves
    (t_F = t_B = t_W, the paper's assumption) that is (p-1)/(3m + p-1), for m >= p.
    """
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule {schedule!r}: expected one of {SCHEDULES}")
    if schedule == "zb_h1":
        return (p - 1) / (3 * m + p - 1)
    r = bubble_ratio(p, m, v if schedule == "interleaved" else 1)
    return r / (1 + r)


def in_flight_microbatches(p: int, m: int, schedule: str = "1f1b", v: int = 1) -> float:
    """Micro-batches whose activations the first stage holds at its peak, in units of its L/p layers.

    GPipe runs all m forwards first: m. 1F1B starts backwards after p warm-up forwards: min(p, m).
    Interleaved 1F1B holds min(p, m)·(1 + (p-1)/(p·v)) (Megatron's memory penalty,
    ``theoretical_memory_usage.py``). ZB-H1 runs F and B in 1F1B's order and keeps a graph until its
    W no longer than the first stage holds one under 1F1B: min(p, m) (Qi et al. §2.1).
    """
    if schedule == "gpipe":
        return float(m)
    if schedule in ("1f1b", "zb_h1"):
        return float(min(p, m))
    if schedule == "interleaved":
        return min(p, m) * (1 + (p - 1) / (p * v))
    raise ValueError(f"schedule {schedule!r}: expected one of {SCHEDULES}")
# --8<-- [end:bubble]
