"""Reference solution to ``labs/exercises/alpha_beta.py``."""
from __future__ import annotations


def collective_seconds(op: str, size_bytes: float, n: int, alpha: float, beta: float) -> float:
    """steps · α + (bytes each rank sends) / β."""
    if op == "send_recv":
        return alpha + size_bytes / beta
    if n == 1:
        return 0.0
    steps, share = {"reduce_scatter": (n - 1, (n - 1) / n), "all_gather": (n - 1, (n - 1) / n),
                    "all_reduce": (2 * (n - 1), 2 * (n - 1) / n)}[op]
    return steps * alpha + share * size_bytes / beta
