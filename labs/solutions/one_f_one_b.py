"""Reference solution to ``labs/exercises/one_f_one_b.py``."""
from __future__ import annotations


def one_f_one_b_order(p: int, m: int, rank: int) -> list[tuple[str, int]]:
    """Warm-up forwards (p - rank - 1, at most m), then alternate F and B, then the remaining backwards."""
    warmup = min(p - rank - 1, m)
    order = [("F", i) for i in range(warmup)]
    for i in range(m - warmup):
        order += [("F", warmup + i), ("B", i)]
    return order + [("B", i) for i in range(m - warmup, m)]
