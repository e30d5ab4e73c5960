"""ZeRO stage 3 (Rajbhandari et al., arXiv:1910.02054): ZeRO-2 with the parameters sharded at rest too.

``Zero3(Zero2)``: at rest each unit holds only its shard. ``unshard()`` (all-gather) before the unit's forward
and again before its backward, ``reshard()`` (hand its buffer back) after each; the next unit's all-gather is
issued before the current unit computes (prefetch). Units of at most ``param_persistence_threshold`` elements
stay whole (DeepSpeed's ``stage3_param_persistence_threshold``).

The units are the model's own: ``module.units()`` lists its forward as a chain, ``(name, fn, modules)`` in order
(`model.GPT.units`, `pipeline.stage.StageChunk.units`), and ``module.finish`` turns the last output into what
``forward`` returns. ZeRO-3 runs that chain and names no part of the model, so a model of another shape needs
only its own ``units()``.
"""
from __future__ import annotations

import enum

import torch
import torch.nn as nn

from .. import comm
from .flat import FlatUnit, GatherSlots, model_units, split_units
from .stages import Zero2


# --8<-- [start:unit_state]
class UnitState(enum.Enum):
    """Where a ZeRO-3 unit's parameters are (FSDP2's ``ShardedState``); persistent units stay UNSHARDED."""

    SHARDED = "sharded"            # only this rank's shard exists; the flat buffer has no storage
    GATHERING = "gathering"        # storage allocated, all-gather in flight (a prefetch)
    UNSHARDED = "unsharded"        # the whole unit is in the flat buffer: forward or backward may run
# --8<-- [end:unit_state]


class Zero3(Zero2):
    """ZeRO stage 3: + parameters sharded at rest; gathered per unit just in time, with prefetch.

    ``module`` is any model with ``units()`` and ``finish()`` (see the module docstring): a `model.GPT`, whose
    ``finish`` returns ``(logits, loss)``, or a pipeline chunk, whose ``finish`` returns its output.
    """

    stage = 3

    def __init__(self, module: nn.Module, group: comm.Group, rank: int, config, make_optimizer,
                 model_parallel: tuple[comm.Group, ...] = ()):
        # _units (called by Zero1) sets self._plan, per FlatUnit (its model unit, persistent), and self.persistent.
        super().__init__(module, group, rank, config, make_optimizer, model_parallel)
        self._gathers: dict[str, comm.Handle] = {}
        self.state = {u.name: UnitState.UNSHARDED for u in self.units}
        # Forward order: per model unit (a step), its sharded FlatUnit (if any) and its persistent one (if any).
        self.step_names: list[str] = []
        self.steps: list[list[FlatUnit]] = []
        for u, (step, _) in zip(self.units, self._plan):
            if not self.step_names or self.step_names[-1] != step:
                self.step_names.append(step)
                self.steps.append([])
            self.steps[-1].append(u)
        sharded = [u for s in self.steps for u in s if u.name not in self.persistent]
        self.state.update({u.name: UnitState.SHARDED for u in sharded})          # at rest: only the shard
        # Gathered units in reused buffers (one computing, one prefetched); none at dp = 1: the shard is the unit.
        self.slots = GatherSlots(sharded, 2 if config.prefetch else 1) if sharded and group.size > 1 else None
        self._step_of = {name: k for k, name in enumerate(self.step_names)}

    def _units(self, module):
        """Each model unit cut in two (`flat.split_units`): the parameters `_whole` names stay whole (persistent)."""
        split = split_units(model_units(module), self._whole)
        self._plan = [(unit, persistent) for _, unit, persistent, _ in split]
        self.persistent = {name for name, _, persistent, _ in split if persistent}
        return [(name, params) for name, _, _, params in split]

    def _whole(self, params: list[tuple[str, nn.Parameter]]) -> set[str]:
        """The names of a unit's parameters kept whole: those of at most ``param_persistence_threshold`` elements."""
        return {n for n, p in params if p.numel() <= self.config.param_persistence_threshold}

    def _make_shard(self, unit: FlatUnit) -> torch.Tensor:
        shard = unit.flat[unit.start:unit.end]
        return shard if unit.name in self.persistent or self.group.size == 1 else shard.clone()   # outlives the flat

    # --8<-- [start:zero3_unshard]
    def unshard(self, k: int, prefetch: bool = False) -> None:
        """All-gather step k's sharded units (async when prefetching); without prefetch, wait for them."""
        for u in self.steps[k]:
            if self.state[u.name] is UnitState.SHARDED:
                if self.slots:
                    self.slots.take(u)
                self._event("all_gather_issued", unit=u.name, prefetch=prefetch)
                self._gathers[u.name] = self._gather(u, self.shards[self.units.index(u)])
                self.state[u.name] = UnitState.GATHERING
            if not prefetch and self.state[u.name] is UnitState.GATHERING:
                self._gathers.pop(u.name).wait()
                self.state[u.name] = UnitState.UNSHARDED

    def _gather(self, u: FlatUnit, shard: torch.Tensor) -> comm.Handle:
        return comm.all_gather(u.flat.data, shard, self.group, async_op=True, tag=u.name)  # .data: not seen by autograd

    def reshard(self, k: int) -> None:
        """Free step k's gathered parameters (the shard stays; persistent units and prefetches in flight stay)."""
        for u in self.steps[k]:
            self._release(u)
    # --8<-- [end:zero3_unshard]

    # --8<-- [start:zero3_forward]
    def forward(self, x: torch.Tensor, *rest):
        for name, fn, _ in self.module.units():              # the model's chain; a unit without parameters just runs
            k = self._step_of.get(name)
            if k is not None:
                self.unshard(k)
                if self.config.prefetch and k + 1 < len(self.steps):
                    self.unshard(k + 1, prefetch=True)         # overlaps with this unit's compute
            unit = self.steps[k][0].name if k is not None else name
            self._event("unit_forward_start", unit=unit)
            x = fn(x)
            self._event("unit_forward_end", unit=unit)
            if k is not None:
                if torch.is_grad_enabled():
                    x = _UnshardForBackward.apply(x, self, k)
                self.reshard(k)
        return self.module.finish(x, *rest)                    # GPT: (logits, loss); a pipeline chunk: x
    # --8<-- [end:zero3_forward]

    def _bucket_done(self, i: int) -> None:
        """Every gradient of unit i is in (synchronised or not): its backward is over, free the parameters."""
        self._release(self.units[i])

    def _release(self, unit: FlatUnit) -> None:
        """A whole unit (not persistent, not in flight) goes back to its shard; its buffer is free for the next."""
        if self.state[unit.name] is UnitState.UNSHARDED and unit.name not in self.persistent:
            if self.slots:
                self.slots.give_back(unit)
            self.state[unit.name] = UnitState.SHARDED

    def _gather_after_step(self) -> None:
        # Sharded units are refreshed by the next forward's all-gather; persistent ones now.
        for k in range(len(self.steps)):
            self.reshard(k)                                    # none should be whole here; stale if one were
        keep = [(u, s) for u, s in zip(self.units, self.shards) if u.name in self.persistent]
        if self.pool:
            self.pool.all_gather([u for u, _ in keep], [s for _, s in keep], self.group)


# --8<-- [start:zero3_backward]
class _UnshardForBackward(torch.autograd.Function):
    """Forward: identity. Backward: gather unit k's parameters (and prefetch unit k-1's) before its backward runs."""

    @staticmethod
    def forward(ctx, x, stage: Zero3, k: int):
        ctx.stage, ctx.k = stage, k
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        ctx.stage.unshard(ctx.k)
        if ctx.stage.config.prefetch and ctx.k > 0:
            ctx.stage.unshard(ctx.k - 1, prefetch=True)
        return grad, None, None
# --8<-- [end:zero3_backward]
