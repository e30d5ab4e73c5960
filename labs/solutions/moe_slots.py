"""Reference solution (lab 16-mixture-of-experts): slots in priority order, first choices first."""
from __future__ import annotations


def assign_slots(choices: list[list[int]], n_experts: int, capacity: int) -> list[list[int | None]]:
    """The slot each (token, choice) takes in its expert, or None when the expert is full."""
    filled = [0] * n_experts
    out = [[None] * len(c) for c in choices]
    k = max((len(c) for c in choices), default=0)
    for j in range(k):                       # all first choices, then all second choices, ...
        for t, c in enumerate(choices):      # in token order
            e = c[j]
            if filled[e] < capacity:
                out[t][j] = filled[e]
            filled[e] += 1
    return out
