"""Exercise (lab 02-data-parallel): an all-reduce built from a reduce-scatter and an all-gather.

This is how the ring all-reduce that DDP uses moves its 2(n-1)/n · S bytes per rank:

    phase 1, reduce-scatter: rank i ends with chunk i of the sum      (sends (n-1)/n · S)
    phase 2, all-gather:     every rank collects every summed chunk   (sends (n-1)/n · S)

Use only `minimega.comm.reduce_scatter` and `minimega.comm.all_gather` (not `comm.all_reduce`), then
run the check cell of the lab: it runs your function on 2 gloo ranks and compares it with `comm.all_reduce`.
"""
from __future__ import annotations

import torch

from minimega import comm


def ring_all_reduce(tensor: torch.Tensor, group: comm.Group) -> torch.Tensor:
    """Sum ``tensor`` over the ranks of ``group``.

    Args:
        tensor: any shape; its element count need not divide by ``group.size``.
        group: the ranks to reduce over (``mesh.dp_group``); ``group.size`` is n.

    Returns:
        A tensor of the same shape holding the element-wise sum over the ranks (the input may be left as is).

    Shapes:
        flat (S,) → padded (n·k,) → reduce-scatter → shard (k,) → all-gather → (n·k,) → first S → tensor's shape.
    """
    raise NotImplementedError("exercise: complete ring_all_reduce in labs/exercises/ring_all_reduce.py")
