"""Reference solution (lab 15-long-context): chunk r and its mirror 2·cp - 1 - r."""
from __future__ import annotations


def rank_positions(seq_len: int, cp_rank: int, cp: int) -> list[int]:
    """The global positions of the tokens rank ``cp_rank`` of ``cp`` holds, in the order it holds them."""
    c = seq_len // (2 * cp)                       # tokens per chunk
    mirror = 2 * cp - 1 - cp_rank
    return list(range(cp_rank * c, (cp_rank + 1) * c)) + list(range(mirror * c, (mirror + 1) * c))
