"""Exercise (lab 08-pipeline-parallel): the order in which one pipeline rank runs its passes under 1F1B.

GPipe runs all m forwards, then all m backwards: rank 0 holds the activations of all m micro-batches at once.
1F1B (PipeDream-Flush, Narayanan et al. 2021) runs the same passes in another order on each rank:

    warm-up:      a few forwards, just enough to fill the pipeline below this rank
    steady state: one forward, one backward, one forward, one backward, ...
    cool-down:    the backwards still owed

so a rank never holds more than (its number of warm-up forwards + 1) micro-batches. Write the order as a list of
``("F", i)`` / ``("B", i)`` pairs, micro-batches in increasing order, then run the lab's check cell: it compares
your order with `minimega.pipeline.schedules` for many (p, m, rank).
"""
from __future__ import annotations


def one_f_one_b_order(p: int, m: int, rank: int) -> list[tuple[str, int]]:
    """The passes pipeline rank ``rank`` runs in one step of 1F1B, in order.

    Args:
        p: pipeline stages (ranks), rank 0 holds the first layers.
        m: micro-batches per step.
        rank: this rank's stage, 0 <= rank < p.

    Returns:
        2m pairs: ``("F", i)`` for the forward of micro-batch i, ``("B", i)`` for its backward.
    """
    raise NotImplementedError("exercise: complete one_f_one_b_order in labs/exercises/one_f_one_b.py")
