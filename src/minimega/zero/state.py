"""ZeRO's part of a checkpoint: which elements of which parameter this rank's shards hold.

A unit's flat buffer is ``[p_0 | p_1 | … | padding]`` and this rank owns ``[start, end)`` of it (`flat.py`).
`local_entries` intersects that range with each parameter's ``[offset, offset + numel)`` and returns
views of the fp32 master shard and of each optimizer-state shard for the intersection: the checkpoint
writes them as they are and reads straight into them (`minimega.checkpoint`), so nothing is gathered
over dp, on save or on load, whatever dp the checkpoint was written with.

`prepare_load` gives every master shard empty optimizer states of the kinds the checkpoint holds (so
the read plan has somewhere to put them); `finish_load` then refreshes the parameters from the masters
exactly as after an optimizer step.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Entry:
    """Elements ``[lo, hi)`` of parameter ``key``'s (local, TP-sliced) tensor shaped ``local_shape``; ``data`` holds them."""

    kind: str
    key: str
    data: torch.Tensor
    local_shape: tuple[int, ...]
    lo: int
    hi: int


def local_entries(stage) -> list[Entry]:
    """Views of this rank's master and optimizer-state shards, per parameter they overlap (ZeRO's step
    counter, one 0-d tensor per unit, is listed for each overlapping parameter, or the unit's first)."""
    out = []
    for unit, master in zip(stage.units, stage.store.master):
        states = sorted(stage.store.optimizer.state.get(master, {}).items())
        overlapping = []
        for key, p, off in zip(unit.names, unit.params, unit.offsets):
            lo, hi = max(off, unit.start), min(off + p.numel(), unit.end)
            if hi <= lo:
                continue
            overlapping.append(key)
            rng = slice(lo - unit.start, hi - unit.start)
            out.append(Entry("param", key, master.detach()[rng], tuple(p.shape), lo - off, hi - off))
            out += [Entry(kind, key, t[rng], tuple(p.shape), lo - off, hi - off) for kind, t in states if t.dim()]
        for key in overlapping or unit.names[:1]:
            out += [Entry(kind, key, t, (), 0, 1) for kind, t in states if not t.dim()]
    return out


@torch.no_grad()
def prepare_load(stage, kinds: dict[str, tuple[torch.dtype, bool]]) -> None:
    """Fresh optimizer state for every master shard: ``kinds`` maps a state name to (dtype, is 0-d)."""
    opt = stage.store.optimizer
    for master in stage.store.master:
        master.zero_()                                   # padding stays zero; the plan fills the rest
        old = opt.state.get(master, {})
        if kinds and set(old) == set(kinds) and all(
                t.dtype == kinds[k][0] and t.shape == (() if kinds[k][1] else master.shape) for k, t in old.items()):
            for t in old.values():                       # reuse the states a run already has: no new memory
                t.zero_()
            continue
        opt.state.pop(master, None)
        if kinds:
            opt.state[master] = {k: torch.zeros((), dtype=dt) if scalar else torch.zeros_like(master, dtype=dt)
                                 for k, (dt, scalar) in kinds.items()}


@torch.no_grad()
def finish_load(stage) -> None:
    """After the masters were filled: copy them into the parameter shards and re-gather, as after a step."""
    if not stage.store.aliased:
        for shard, master in zip(stage.shards, stage.store.master):
            shard.copy_(master.to(device=shard.device, dtype=shard.dtype))
    stage._gather_after_step()
