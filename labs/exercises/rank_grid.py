"""Exercise (lab 09-3d-parallel): which ranks talk to which in a dp × tp × pp job.

minimega (like Megatron-LM) lays the world's ranks on a grid ``arange(world).view(pp, dp, tp)``: tensor parallelism
innermost, so the ranks of a tp group are consecutive (on one node, over NVLink: tp all-reduces activations in every
layer); then data parallelism; pipeline stages outermost (they exchange only one activation per micro-batch).

A *group* along a dimension is a set of ranks that differ only in their coordinate along it: each tp group runs the
tensor-parallel all-reduces, each dp group the gradient all-reduce, each pp group is one pipeline.

Complete ``group_ranks``; the lab's check compares it with `minimega.ParallelDims.group_ranks` for many layouts.
"""
from __future__ import annotations


def group_ranks(dp: int, tp: int, pp: int, dim: str) -> list[list[int]]:
    """Every group of ranks along ``dim`` ('dp', 'tp' or 'pp'), each listed in increasing rank order.

    Example: dp=2, tp=2, pp=1 gives tp groups [[0, 1], [2, 3]] and dp groups [[0, 2], [1, 3]].

    Returns:
        world / size(dim) lists of size(dim) global ranks each; the groups may come in any order.
    """
    raise NotImplementedError("exercise: complete group_ranks in labs/exercises/rank_grid.py")
