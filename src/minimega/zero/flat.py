"""Flat, padded parameter buffers and the shard arithmetic every ZeRO stage shares.

One *unit* (a parameter group: the embeddings, one transformer block, or the head) becomes one flat
buffer of ``padded = ceil(numel / dp) * dp`` elements, so that it splits into ``dp`` equal shards:

    flat  = [ p_0.view(-1) | p_1.view(-1) | ... | zeros (padding) ]          (padded,)
    shard = flat[r * padded/dp : (r+1) * padded/dp]                          (padded/dp,) on dp rank r

Every parameter of the unit is a *view* into ``flat``: writing the flat buffer (an all-gather)
updates the module's parameters without a copy. ZeRO-3 places each sharded unit's flat buffer in one of
a few buffers it reuses (`GatherSlots`): the views, and any tensor autograd saved from them, read
whatever was gathered there last, so a unit is gathered again before its backward.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from .. import comm
from ..parallel.grad_sync import dp_named_parameters
from ..sizes import padded_numel   # the rule the estimators share (minimega/sizes.py)


# --8<-- [start:shard_bounds]
# --8<-- [start:shard_bounds_c1]
def shard_bounds(numel: int, world: int, rank: int) -> tuple[int, int]:
# --8<-- [end:shard_bounds_c1]
    """``[start, end)`` of rank ``rank``'s shard of a flat buffer holding ``numel`` elements."""
    # --8<-- [start:shard_bounds_c2]
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} is outside a group of {world}")
    size = padded_numel(numel, world) // world                 # ceil(numel / world)
    return rank * size, (rank + 1) * size
    # --8<-- [end:shard_bounds_c2]
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

    def flatten_grads(self, grads: dict | None = None, dtype: torch.dtype | None = None,
                      out: torch.Tensor | None = None) -> torch.Tensor:
        """A padded flat buffer (``out``, a reused buffer of ``padded`` elements, else a fresh one of ``dtype``,
        default the parameters') holding every parameter's gradient: ``grads[p]`` when given (`grad_sync`'s
        ``main_grads``), else ``p.grad``; zeros where there is none."""
        if out is not None and out.numel() != self.padded:
            raise ValueError(f"flatten_grads: out has {out.numel()} elements, unit {self.name!r} needs {self.padded}")
        flat = out.zero_() if out is not None else torch.zeros(self.padded, dtype=dtype or self.flat.dtype,
                                                                device=self.flat.device)
        for p, view in zip(self.params, self.views(flat)):
            g = grads.get(p, p.grad) if grads else p.grad
            if g is not None:
                view.copy_(g)
        return flat

    def place(self, buffer: torch.Tensor) -> None:
        """Move the flat buffer (and the parameters, views of it) into ``buffer``'s first ``padded`` elements for good;
        the values are not carried over (ZeRO-3's `GatherSlots`: the next all-gather writes them)."""
        self.flat = buffer[:self.padded]
        with torch.no_grad():
            for p, view in zip(self.params, self.views(self.flat)):
                p.data = view


# --8<-- [start:buffer_pool]
class BufferPool:
    """Reduce buffers reused step after step: at most ``slots`` pairs (a full gradient, its reduced shard).

    Each slot holds a flat gradient of the largest unit (``numel``; none with ``full=False``, ZeRO-1, whose
    gradients are reduced from their own buffers) and its shard (``numel / world``); a unit takes the first
    ``padded`` elements of a free slot. Slots are created on first need and kept, so the bytes
    of the reductions in flight are bounded by the pool, ``slots · numel · (1 + 1/world)`` elements, whatever
    the allocator does with freed memory (on CPU, glibc keeps freed blocks around; on CUDA the caching
    allocator would reuse them too, but the pool makes the bound the same on both).
    """

    def __init__(self, slots: int, numel: int, world: int, dtype: torch.dtype, device: torch.device,
                 full: bool = True):
        if numel % world:
            raise ValueError(f"BufferPool: {numel} elements do not split over {world} ranks")
        self.limit, self.numel, self.world, self.dtype, self.device = slots, numel, world, dtype, device
        self.full = full
        self.slots: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.free: list[int] = []

    def take(self, padded: int) -> tuple[int, torch.Tensor | None, torch.Tensor]:
        """A free slot's index, its first ``padded`` elements (None without ``full``) and its first ``padded / world``."""
        if padded > self.numel:
            raise ValueError(f"BufferPool: a unit of {padded} elements exceeds the pool's {self.numel}")
        if not self.free:
            if len(self.slots) >= self.limit:
                raise RuntimeError(f"BufferPool: all {self.limit} slots in use; retire a reduction before starting one")
            full = torch.empty(self.numel, dtype=self.dtype, device=self.device) if self.full else None
            self.slots.append((full, torch.empty(self.numel // self.world, dtype=self.dtype, device=self.device)))
            self.free.append(len(self.slots) - 1)
        k = self.free.pop()
        full, shard = self.slots[k]
        return k, (full[:padded] if full is not None else None), shard[:padded // self.world]

    def take_shard(self, numel: int, dtype: torch.dtype) -> tuple[int, torch.Tensor]:
        """A free slot's index and ``numel`` elements of ``dtype`` (at most the pool's width) in its shard buffer:
        the input of an all-gather whose output is the unit itself."""
        width = -(-numel * dtype.itemsize // self.dtype.itemsize)        # in the pool's elements, rounded up
        k, _, shard = self.take(width * self.world)
        return k, shard.view(dtype)[:numel]

    def give_back(self, k: int) -> None:
        self.free.append(k)

    def all_gather(self, units: list[FlatUnit], shards: list[torch.Tensor], group: comm.Group) -> None:
        """Each unit's shard, copied into a slot, all-gathered into the unit's flat buffer, ``limit`` at once."""
        in_flight: list[tuple[int, comm.Handle]] = []
        for u, s in zip(units, shards):
            if len(in_flight) >= self.limit:
                k, handle = in_flight.pop(0)
                handle.wait()
                self.give_back(k)
            k, src = self.take_shard(s.numel(), s.dtype)
            in_flight.append((k, comm.all_gather(u.flat, src.copy_(s), group, async_op=True, tag=u.name)))
        for k, handle in in_flight:
            handle.wait()
            self.give_back(k)

    def tensors(self) -> list[torch.Tensor]:
        return [t for slot in self.slots for t in slot if t is not None]
# --8<-- [end:buffer_pool]


# --8<-- [start:gather_slots]
class GatherSlots:
    """ZeRO-3's gathered parameters in buffers reused step after step, not allocated per unit and freed.

    ``slots`` buffers (2 with prefetch: the unit that computes and the next one; 1 without); the j-th sharded unit
    in forward order lives in buffer ``j mod slots``, as large as the largest unit it serves. Neighbours never
    share a buffer, so the gathered bytes are bounded by Σ over buffers of their largest unit, whatever the
    allocator does with freed memory (glibc keeps it; FSDP2 relies on CUDA's caching allocator instead).
    Each unit's flat buffer and parameters are views into its buffer for good (`FlatUnit.place`): gathering
    writes the buffer, resharding hands it back. Taking a buffer that another unit still holds is refused:
    it would overwrite parameters in use.
    """

    def __init__(self, units: list[FlatUnit], slots: int):
        slots = min(slots, len(units))
        self.buffers = [torch.empty(max(u.padded for u in units[s::slots]), dtype=units[0].flat.dtype,
                                    device=units[0].flat.device) for s in range(slots)]
        self.slot = {u.name: j % slots for j, u in enumerate(units)}
        self.holder: list[str | None] = [None] * slots
        for u in units:
            u.place(self.buffers[self.slot[u.name]])

    def take(self, unit: FlatUnit) -> None:
        s = self.slot[unit.name]
        if self.holder[s] not in (None, unit.name):
            raise RuntimeError(f"GatherSlots: unit {unit.name!r} needs buffer {s}, which {self.holder[s]!r} still "
                               "holds; units are gathered in order, two neighbours at most")
        self.holder[s] = unit.name

    def give_back(self, unit: FlatUnit) -> None:
        s = self.slot[unit.name]
        if self.holder[s] == unit.name:
            self.holder[s] = None

    def tensors(self) -> list[torch.Tensor]:
        return list(self.buffers)
# --8<-- [end:gather_slots]


@torch.no_grad()
def gather_fp32(units: list[FlatUnit], shards: list[torch.Tensor], group: comm.Group, tag: str) -> dict:
    """{parameter name: its full fp32 value on the host}, all-gathered from each unit's shard (on every rank)."""
    out = {}
    for u, m in zip(units, shards):
        full = torch.empty(u.padded, dtype=torch.float32, device=u.flat.device)
        comm.all_gather(full, m.detach().float().to(u.flat.device), group, tag=tag)
        out.update({n: v.cpu().clone() for n, v in zip(u.names, u.views(full))})
    return out


def model_units(module: nn.Module) -> list[tuple[str, list[tuple[str, nn.Parameter]]]]:
    """The model's units in forward order, as ``module.units()`` lists them (`model.GPT.units`: 'embed', 'blocks.i',
    'head'), each with its ``(qualified name, parameter)`` pairs; units without one are left out.

    ``module`` may be a pipeline chunk: its blocks are keyed by their index in the full model, and the
    embed and head units exist only on the chunks that hold them. Every parameter the data-parallel
    group syncs must belong to exactly one unit: one that no unit lists would never be trained.
    """
    named = dp_named_parameters(module)             # experts sync themselves (see `minimega.parallel.moe.layer`)
    name_of = {id(p): n for n, p in named}
    out, taken = [], set()
    for unit, _, modules in module.units():
        params = []
        for m in modules:
            for p in (m.parameters() if m is not None else ()):
                if id(p) in name_of and id(p) not in taken:
                    taken.add(id(p))
                    params.append((name_of[id(p)], p))
        if params:
            out.append((unit, params))
    missing = [n for n, p in named if id(p) not in taken]
    if missing:
        raise ValueError(f"model_units: {type(module).__name__}.units() lists no unit holding {missing}; "
                         "add them to a unit's modules")
    return out


def split_units(units: list[tuple[str, list]], whole) -> list[tuple[str, str, bool, list]]:
    """ZeRO-3's cut of each unit in two: ``(flat unit name, model unit, persistent, params)``, the parameters
    ``whole(params)`` names (a set of names) in a persistent unit ``name.persistent`` kept whole on every rank,
    the rest in a unit sharded over dp; either is left out when empty. Forward order is kept."""
    out = []
    for name, params in units:
        keep = whole(params)
        for part, persistent in (([(n, p) for n, p in params if n not in keep], False),
                                 ([(n, p) for n, p in params if n in keep], True)):
            if part:
                out.append((name + ".persistent" if persistent else name, name, persistent, part))
    return out
