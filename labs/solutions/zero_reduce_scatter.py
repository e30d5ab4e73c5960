"""Reference solution to ``labs/exercises/zero_reduce_scatter.py``."""
from __future__ import annotations

import torch

from minimega import comm


def reduce_scatter_grads(grads: list[torch.Tensor], group: comm.Group) -> torch.Tensor:
    """This rank's shard of the unit's flat gradient, summed over ``group``: one padded reduce-scatter."""
    n = group.size
    flat = torch.cat([g.reshape(-1) for g in grads])                    # (numel,) in parameter order
    pad = (-flat.numel()) % n
    if pad:
        flat = torch.cat([flat, flat.new_zeros(pad)])                   # (padded,): n equal shards
    shard = flat.new_empty(flat.numel() // n)                           # (padded/n,)
    comm.reduce_scatter(shard, flat, group)                             # rank r: sum of shard r
    return shard
