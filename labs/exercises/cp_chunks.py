"""Exercise (lab 15-long-context): which tokens a context-parallel rank holds.

Under a causal mask a query at position i attends to positions 0 .. i, so late tokens cost more attention
than early ones. To give every rank of a cp group the same work, the sequence of ``seq_len`` tokens is cut
into 2·cp equal chunks, and rank r holds two of them: chunk r (an early one) and chunk 2·cp - 1 - r (its
mirror at the end), in that order.

Complete ``rank_positions``; the lab's check compares it with `minimega.parallel.context` on many layouts.
"""
from __future__ import annotations


def rank_positions(seq_len: int, cp_rank: int, cp: int) -> list[int]:
    """The global positions (0-based) of the tokens rank ``cp_rank`` of ``cp`` holds, in the order it holds them.

    Args:
        seq_len: tokens per sequence, a multiple of 2·cp.
        cp_rank: this rank's place in the cp group, 0 .. cp-1.
        cp: ranks in the cp group.

    Returns:
        seq_len / cp positions: those of chunk ``cp_rank``, then those of chunk ``2·cp - 1 - cp_rank``.

    Example: seq_len 16, cp 2 -> rank 0 holds [0, 1, 2, 3, 12, 13, 14, 15], rank 1 [4, ..., 11].
    """
    raise NotImplementedError("exercise: complete rank_positions in labs/exercises/cp_chunks.py")
