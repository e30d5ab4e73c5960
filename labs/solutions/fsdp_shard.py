"""Reference solution to ``labs/exercises/fsdp_shard.py``."""
from __future__ import annotations

import torch


def fsdp_local_shard(full: torch.Tensor, world: int, rank: int) -> torch.Tensor:
    """torch.chunk along dim 0; ranks past the last chunk hold zero rows."""
    chunks = torch.chunk(full, world, dim=0)
    if rank < len(chunks):
        return chunks[rank]
    return full.new_empty((0, *full.shape[1:]))
