"""Exercise (lab 03-zero): ZeRO-2's reduce-scatter of one unit's gradients.

When the last gradient of a unit (the embeddings, one block, the head) is ready, ZeRO-2 turns the unit's
gradients into one flat buffer and reduce-scatters it, so that dp rank r keeps only the *sum over ranks*
of its own shard, and drops the full gradients. The layout is `minimega/zero/flat.py`'s:

    flat  = [ g_0.view(-1) | g_1.view(-1) | ... | zeros ]      (padded,)  padded = ceil(numel / n) · n
    shard = sum over ranks of flat[r · padded/n : (r+1) · padded/n]        (padded/n,) on rank r

Use `minimega.comm.reduce_scatter(output, input, group)` (one call, one flat buffer), then run the lab's
check cell: it runs your function on 3 gloo ranks and compares it with minimega's layout and traffic.
"""
from __future__ import annotations

import torch

from minimega import comm


def reduce_scatter_grads(grads: list[torch.Tensor], group: comm.Group) -> torch.Tensor:
    """This rank's shard of the unit's flat gradient, summed over ``group``.

    Args:
        grads: the unit's gradients on this rank, in the unit's parameter order (any shapes).
        group: the data-parallel group; ``group.size`` is n, ``group.rank_of(torch.distributed.get_rank())``
            this rank's index r in it.

    Returns:
        A 1-D tensor of ``padded / n`` elements: the sum over ranks of elements ``[r·padded/n, (r+1)·padded/n)``
        of the padded flat gradient (not divided by n: the optimizer step divides later).

    Shapes:
        grads (*) each → flat (numel,) → padded (padded,) → reduce-scatter → shard (padded/n,).
    """
    raise NotImplementedError("exercise: complete reduce_scatter_grads in labs/exercises/zero_reduce_scatter.py")
