"""Flat, padded parameter buffers and the shard arithmetic every ZeRO stage shares.

One *unit* (a parameter group: the embeddings, one transformer block, or the head) becomes one flat
buffer of ``padded = ceil(numel / dp) * dp`` elements, so that it splits into ``dp`` equal shards:

    flat  = [ p_0.view(-1) | p_1.view(-1) | ... | zeros (padding) ]          (padded,)
    shard = flat[r * padded/dp : (r+1) * padded/dp]                          (padded/dp,) on dp rank r

Every parameter of the unit is a *view* into ``flat``: writing the flat buffer (an all-gather)
updates the module's parameters without a copy, and ZeRO-3 frees the whole unit by resizing the
flat buffer's storage to zero bytes (the views, and any tensor autograd saved from them, see the
storage come back when it is refilled).
"""
from __future__ import annotations

import torch
import torch.nn as nn


def padded_numel(numel: int, dp: int) -> int:
    """`numel` rounded up to a multiple of dp: the length of a flat buffer that splits evenly."""
    return -(-int(numel) // dp) * dp


# --8<-- [start:shard_bounds]
def shard_bounds(numel: int, world: int, rank: int) -> tuple[int, int]:
    """``[start, end)`` of rank ``rank``'s shard of a flat buffer holding ``numel`` elements."""
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} is outside a group of {world}")
    size = padded_numel(numel, world) // world                 # ceil(numel / world)
    return rank * size, (rank + 1) * size
# --8<-- [end:shard_bounds]


class FlatUnit:
    """The parameters of one unit, laid out in one flat buffer of which this rank owns one shard.

    Args:
        name: for logs and timelines ('embed', 'blocks.0', 'head').
        params: ``(qualified name, parameter)`` pairs, in a fixed order identical on every rank.
        world, rank: the data-parallel group's size and this rank's place in it.
        dtype: the dtype parameters are stored and communicated in (the precision policy's).

    Shapes:
        flat (padded,), shard (padded/world,), grad shards (padded/world,).
    """

    def __init__(self, name: str, params: list[tuple[str, nn.Parameter]], world: int, rank: int,
                 dtype: torch.dtype):
        if not params:
            raise ValueError(f"unit {name!r} has no parameters")
        self.name, self.world, self.rank = name, world, rank
        self.names = [n for n, _ in params]
        self.params = [p for _, p in params]
        self.numel = sum(p.numel() for p in self.params)
        self.padded = padded_numel(self.numel, world)
        self.start, self.end = shard_bounds(self.numel, world, rank)
        self.offsets, offset = [], 0
        for p in self.params:
            self.offsets.append(offset)
            offset += p.numel()
        device = self.params[0].device
        self.flat = torch.zeros(self.padded, dtype=dtype, device=device)
        with torch.no_grad():
            for p, view in zip(self.params, self.views(self.flat)):
                view.copy_(p.detach())
                p.data = view          # the parameter now lives inside the flat buffer

    @property
    def shard_numel(self) -> int:
        return self.padded // self.world

    def views(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """Views of ``flat`` shaped like each parameter (padding excluded)."""
        return [flat[o:o + p.numel()].view_as(p) for o, p in zip(self.offsets, self.params)]

    def flatten_grads(self, grads: dict | None = None, dtype: torch.dtype | None = None) -> torch.Tensor:
        """A fresh padded flat buffer (``dtype``, default the parameters') holding every parameter's gradient:
        ``grads[p]`` when given (`grad_sync`'s ``main_grads``), else ``p.grad``; zeros where there is none."""
        flat = torch.zeros(self.padded, dtype=dtype or self.flat.dtype, device=self.flat.device)
        for p, view in zip(self.params, self.views(flat)):
            g = grads.get(p, p.grad) if grads else p.grad
            if g is not None:
                view.copy_(g)
        return flat

    # The storage trick behind ZeRO-3's reshard: the views stay valid while their bytes come and go.
    def free_storage(self) -> None:
        self.flat.untyped_storage().resize_(0)

    def alloc_storage(self) -> None:
        nbytes = self.padded * self.flat.element_size()
        if self.flat.untyped_storage().nbytes() != nbytes:
            self.flat.untyped_storage().resize_(nbytes)

    def is_allocated(self) -> bool:
        return self.flat.untyped_storage().nbytes() > 0
