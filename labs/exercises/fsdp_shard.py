"""Exercise (lab 11-fsdp): the piece of a parameter FSDP2 keeps on one rank.

minimega's ZeRO (like DeepSpeed and FSDP1) concatenates a unit's parameters into one flat buffer and cuts *that*
into equal shards. FSDP2 (``torch.distributed.fsdp.fully_shard``) shards *each parameter* on its own, along its first
dimension, and keeps it as a `DTensor` with placement ``Shard(0)``; ``param.to_local()`` is this rank's piece.
The rows are cut the way ``torch.chunk`` cuts them: ceil(rows / world) rows per rank, so the last ranks may get fewer
rows, or none (FSDP2 pads internally for its collectives, but ``to_local()`` holds only real rows).

Complete ``fsdp_local_shard``; the lab's check applies ``fully_shard`` on 3 gloo ranks to parameters of awkward shapes
and compares your piece with each rank's ``to_local()``.
"""
from __future__ import annotations

import torch


def fsdp_local_shard(full: torch.Tensor, world: int, rank: int) -> torch.Tensor:
    """The rows of ``full`` that FSDP2 keeps on ``rank`` of ``world`` ranks.

    Args:
        full: the whole parameter, any shape with at least one dimension.
        world: ranks in the sharding mesh.
        rank: this rank, 0 <= rank < world.

    Returns:
        A tensor with ``full``'s trailing dimensions and this rank's rows (possibly zero of them).

    Shapes:
        full (R, *rest) → (rows_r, *rest), rows_r = this rank's share of R under torch.chunk.
    """
    raise NotImplementedError("exercise: complete fsdp_local_shard in labs/exercises/fsdp_shard.py")
