"""ZeRO stages 1-3 (Rajbhandari et al., arXiv:1910.02054), each a subclass of the one before.

The model is cut into units (the embeddings, each block, the head); each unit is one flat buffer
padded to a multiple of dp, and dp rank r owns ``[r·N/dp, (r+1)·N/dp)`` of it (`flat.py`). The
fp32 master weights and Adam's moments exist for that shard only (`offload.py`).

``Zero1`` (optimizer states sharded):
    Phase 1 (backward): gradients accumulate in a full flat gradient buffer per unit.
    Phase 2 (end of backward): reduce-scatter each unit's buffer; rank r keeps the sum of its shard.
    Phase 3 (step): the optimizer updates this rank's master shard; all-gather the parameters.
``Zero2(Zero1)`` (+ gradients sharded): a unit's gradients are reduce-scattered from a backward hook
    as soon as its last gradient is ready, asynchronously, while autograd computes earlier units;
    the full gradients are then dropped, so a rank keeps only its shard's gradients (N/dp).
``Zero3(Zero2)`` (+ parameters sharded): at rest each unit holds only its shard. ``unshard()``
    (all-gather) before the unit's forward and again before its backward, ``reshard()`` (free the
    storage) after each; the next unit's all-gather is issued before the current unit computes
    (prefetch). Units whose parameters have at most ``param_persistence_threshold`` elements each
    stay whole (DeepSpeed's ``stage3_param_persistence_threshold``).

Communication per step, in elements of Ψ (the padded parameter count), per rank ×(dp-1)/dp:
stages 1 and 2 reduce-scatter Ψ + all-gather Ψ = 2Ψ (as DDP's all-reduce); stage 3 all-gathers Ψ in
forward and Ψ in backward and reduce-scatters Ψ = 3Ψ (1.5× DDP).
"""
from __future__ import annotations

import time
from contextlib import contextmanager

import torch
import torch.nn as nn

from .. import comm, measure, precision
from .flat import FlatUnit
from .offload import CPUOffloadStore, MasterStore


def model_units(module: nn.Module) -> list[tuple[str, list[tuple[str, nn.Parameter]]]]:
    """The GPT's units in forward order: ('embed', wte+wpe), ('blocks.i', block i), ('head', the rest).

    ``module`` may be a pipeline chunk: its blocks are keyed by their index in the full model, and the
    embed and head units exist only on the chunks that hold them.
    """
    named = list(module.named_parameters())
    embed = [(n, p) for n, p in named if n.startswith(("wte.", "wpe."))]
    blocks = [(f"blocks.{i}", [(f"blocks.{i}.{n}", p) for n, p in b.named_parameters()])
              for i, b in module.blocks.named_children()]
    taken = {n for n, _ in embed} | {n for _, ps in blocks for n, _ in ps}
    head = [(n, p) for n, p in named if n not in taken]
    return ([("embed", embed)] if embed else []) + blocks + ([("head", head)] if head else [])


class Zero1(nn.Module):
    """ZeRO stage 1: Adam's moments and the fp32 master weights are sharded over ``group``.

    Args:
        module: the full model, identical on every rank (same seed).
        group: the data-parallel group; ``rank`` this rank's index in it.
        config: the TrainConfig (precision, offload_optimizer, loss_scale, param_persistence_threshold, prefetch).
        make_optimizer: ``params -> torch.optim.Optimizer``, applied to this rank's master shards.
        model_parallel: the groups holding the model's other parts (tp, pp): an fp16 overflow on any of
            their ranks skips the step on all of them, so the replicas never diverge.
    """

    stage = 1

    def __init__(self, module: nn.Module, group: comm.Group, rank: int, config, make_optimizer,
                 model_parallel: tuple[comm.Group, ...] = ()):
        super().__init__()
        self.module, self.group, self.rank, self.config = module, group, rank, config
        self.model_parallel = model_parallel
        self.policy = precision.policy(config.precision)
        self.scaler = precision.make_scaler(self.policy, config)
        self.timeline: list[dict] = []
        self._sync, self._callback_queued, self._prepared, self._overflow = True, False, False, False
        with torch.no_grad():
            for p in module.parameters():
                comm.broadcast(p.data, group.ranks[0], group, tag="init")
        module.to(self.policy.param_dtype)
        self.units = [FlatUnit(name, params, group.size, rank, self.policy.param_dtype)
                      for name, params in self._units(module)]
        self._unit_of = {p: u for u in self.units for p in u.params}
        self._ready = {u.name: 0 for u in self.units}
        self.shards = [self._make_shard(u) for u in self.units]
        self.grad_shards = self._make_grad_buffers()
        store = CPUOffloadStore if config.offload_optimizer else MasterStore
        self.store = store(self.shards, make_optimizer)
        for p in self._unit_of:
            p.register_post_accumulate_grad_hook(self._on_grad_ready)

    # -- layout: what Zero2 and Zero3 override ---------------------------------------------------
    def _units(self, module):
        return model_units(module)

    def _make_shard(self, unit: FlatUnit) -> torch.Tensor:
        return unit.flat[unit.start:unit.end]          # a view: the parameters themselves

    def _make_grad_buffers(self) -> list[torch.Tensor]:
        """Full flat gradient buffers; each ``p.grad`` is a view, so autograd accumulates in place."""
        self.flat_grads = [torch.zeros_like(u.flat) for u in self.units]
        for u, g in zip(self.units, self.flat_grads):
            for p, view in zip(u.params, u.views(g)):
                p.grad = view
        return [g[u.start:u.end] for u, g in zip(self.units, self.flat_grads)]

    # -- forward and backward --------------------------------------------------------------------
    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """fp16: the loss times the scale, in fp32 (as DeepSpeed; the fp16 graph then sees scale · dL)."""
        return loss.float() * self.scaler.scale if self.scaler else loss

    @contextmanager
    def no_sync(self):
        """Gradient accumulation: skip the reduction; the next synchronised backward reduces the sum."""
        old, self._sync = self._sync, False
        try:
            yield
        finally:
            self._sync = old

    def _event(self, name: str, **extra) -> None:
        self.timeline.append({"event": name, "time": time.perf_counter(), **extra})

    def _on_grad_ready(self, p: nn.Parameter) -> None:
        if self._sync and not self._callback_queued:
            torch.autograd.Variable._execution_engine.queue_callback(self._finish_backward)
            self._callback_queued = True

    # --8<-- [start:zero1_reduce]
    def _finish_backward(self) -> None:
        """Phase 2: reduce-scatter every unit's full gradient buffer into this rank's shard."""
        self._callback_queued = False
        outs = [torch.empty_like(s) for s in self.grad_shards]
        handles = [comm.reduce_scatter(o, g, self.group, async_op=True, tag=u.name)
                   for u, o, g in zip(self.units, outs, self.flat_grads)]
        for h, o, s in zip(handles, outs, self.grad_shards):
            h.wait()
            s.copy_(o)
        self._event("grads_reduced")
    # --8<-- [end:zero1_reduce]

    # -- the step --------------------------------------------------------------------------------
    def _prepare(self) -> None:
        """Once per step: hand the (averaged, unscaled) gradient shards to the store; detect fp16 overflow."""
        if self._prepared:
            return
        self._prepared = True
        scale = self.scaler.scale if self.scaler else 1.0
        self.store.set_grads(self.grad_shards, self.group.size * scale)
        if self.scaler:
            flag = torch.tensor(float(precision.has_overflow(self.store.grads())), device=self.units[0].flat.device)
            for group in (self.group, *self.model_parallel):
                comm.all_reduce(flag, group, tag="overflow")
            self._overflow = flag.item() > 0

    def grad_sq_norm(self, weight=None) -> torch.Tensor:
        """Σ weight(name)·‖g‖² over the elements of this rank's gradient shards (float64, not reduced).

        ``weight`` (default 1) lets a caller count tp-replicated parameters once per tp group.
        """
        self._prepare()
        local = torch.zeros((), dtype=torch.float64, device=self.units[0].flat.device)
        for unit, master in zip(self.units, self.store.master):
            if master.grad is None:
                continue
            g = master.grad.to(local.device)
            for name, p, offset in zip(unit.names, unit.params, unit.offsets):
                lo, hi = max(offset, unit.start) - unit.start, min(offset + p.numel(), unit.end) - unit.start
                if hi > lo:                                    # the part of this parameter in the shard
                    local += (weight(name) if weight else 1.0) * g[lo:hi].double().pow(2).sum()
        return local

    def grad_norm(self) -> float:
        """Global L2 norm of the gradients: each element lives in exactly one rank's shard, counted once."""
        return comm.all_reduce(self.grad_sq_norm(), self.group, tag="grad_norm").sqrt().item()

    # --8<-- [start:clip]
    def clip_grad_norm_(self, max_norm: float, norm: float | None = None) -> float:
        """Scale every gradient shard by min(1, max_norm / (norm + 1e-6)), as torch.nn.utils.clip_grad_norm_.

        ``norm``: the global norm when the caller computed it over more groups than dp (tp, pp).
        """
        norm = self.grad_norm() if norm is None else norm
        if not self._overflow and norm + 1e-6 > max_norm:
            for g in self.store.grads():
                g.mul_(max_norm / (norm + 1e-6))
        return norm
    # --8<-- [end:clip]

    # --8<-- [start:zero1_step]
    def step(self) -> bool:
        """Phase 3: update this rank's master shard, then refresh the parameters. False if skipped (fp16 overflow)."""
        self._prepare()
        if self.scaler:
            self.scaler.update(self._overflow)
            if self._overflow:
                self._event("step_skipped", scale=self.scaler.scale)
                return False
        self.store.step()
        self._gather_after_step()
        return True

    def _gather_after_step(self) -> None:
        handles = [comm.all_gather(u.flat, s.clone(), self.group, async_op=True, tag=u.name)
                   for u, s in zip(self.units, self.shards)]
        for h in handles:
            h.wait()
    # --8<-- [end:zero1_step]

    def zero_grad(self, set_to_none: bool = True) -> None:
        for g in self.grad_buffers():
            g.zero_()
        self.store.zero_grad()
        self._prepared = self._overflow = False

    def grad_buffers(self) -> list[torch.Tensor]:
        return self.flat_grads

    # -- state and accounting --------------------------------------------------------------------
    @torch.no_grad()
    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """fp32 weights with the model's keys, on every rank: all-gather each unit's master shard."""
        out = {}
        for u, m in zip(self.units, self.store.master):
            full = torch.empty(u.padded, dtype=torch.float32, device=u.flat.device)
            comm.all_gather(full, m.detach().to(u.flat.device), self.group, tag="state_dict")
            out.update({n: v.cpu().clone() for n, v in zip(u.names, u.views(full))})
        return {n: out[n] for n, _ in self.module.named_parameters()}

    def memory(self) -> dict:
        """Bytes this rank holds by category (storages shared by views are counted once)."""
        params = [u.flat for u in self.units] + self.shards
        return {"params": measure.tensor_bytes(params),
                "grads": measure.tensor_bytes(self.grad_buffers() + [p.grad for p in self._unit_of]),
                **self.store.memory(), "optimizer_location": self.store.location}


# --8<-- [start:zero2_buffers]
class Zero2(Zero1):
    """ZeRO stage 2: + gradients sharded, reduce-scattered per unit from backward hooks (overlapped).

    Every micro-step reduces (DeepSpeed's semantics): full gradients never outlive their unit's
    backward, so gradient accumulation sums into the shard.
    """

    stage = 2

    def _make_grad_buffers(self) -> list[torch.Tensor]:
        self._pending: list[tuple[FlatUnit, torch.Tensor, comm.Handle]] = []
        self._launched: set[str] = set()
        return [torch.zeros(u.shard_numel, dtype=u.flat.dtype, device=u.flat.device) for u in self.units]

    def grad_buffers(self) -> list[torch.Tensor]:
        return self.grad_shards
# --8<-- [end:zero2_buffers]

    # --8<-- [start:zero2_hook]
    def _on_grad_ready(self, p: nn.Parameter) -> None:
        if not self._callback_queued:       # wait for the reductions once autograd has finished
            torch.autograd.Variable._execution_engine.queue_callback(self._finish_backward)
            self._callback_queued = True
        unit = self._unit_of[p]
        self._ready[unit.name] += 1
        if self._ready[unit.name] == len(unit.params):
            self._reduce_unit(unit)

    def _reduce_unit(self, unit: FlatUnit) -> None:
        flat = unit.flatten_grads()                            # (padded,) this rank's full gradient
        for p in unit.params:
            p.grad = None                                      # the full gradient is not kept
        out = torch.empty(unit.shard_numel, dtype=flat.dtype, device=flat.device)
        self._event("reduce_scatter_issued", unit=unit.name)
        handle = comm.reduce_scatter(out, flat, self.group, async_op=True, tag=unit.name)
        self._pending.append((unit, out, handle))
        self._launched.add(unit.name)

    def _finish_backward(self) -> None:
        self._callback_queued = False
        for unit in self.units:
            if unit.name not in self._launched:            # a unit that got no gradient: reduce zeros
                self._reduce_unit(unit)
        index = {u.name: i for i, u in enumerate(self.units)}
        for unit, out, handle in self._pending:
            handle.wait()
            self.grad_shards[index[unit.name]].add_(out)      # accumulate over micro-steps
        self._pending, self._launched = [], set()
        self._ready = {u.name: 0 for u in self.units}
        self._event("grads_reduced")
    # --8<-- [end:zero2_hook]


class Zero3(Zero2):
    """ZeRO stage 3: + parameters sharded at rest; gathered per unit just in time, with prefetch."""

    stage = 3

    def __init__(self, module: nn.Module, group: comm.Group, rank: int, config, make_optimizer,
                 model_parallel: tuple[comm.Group, ...] = ()):
        super().__init__(module, group, rank, config, make_optimizer, model_parallel)
        self._gathers: dict[str, comm.Handle] = {}
        # Forward order: per model unit, its sharded FlatUnit (if any) and its persistent one (if any).
        self.steps: list[list[FlatUnit]] = []
        for u in self.units:
            base = u.name.removesuffix(".persistent")
            if not self.steps or self.steps[-1][0].name.removesuffix(".persistent") != base:
                self.steps.append([])
            self.steps[-1].append(u)
        for u in self.units:
            if not self._persistent(u):
                u.free_storage()                               # at rest: only the shard

    def _units(self, module):
        """Split each unit: parameters with <= threshold elements form a '.persistent' unit kept whole."""
        limit = self.config.param_persistence_threshold
        out = []
        for name, params in model_units(module):
            big = [(n, p) for n, p in params if p.numel() > limit]
            small = [(n, p) for n, p in params if p.numel() <= limit]
            out += [(name, big)] if big else []
            out += [(name + ".persistent", small)] if small else []
        return out

    @staticmethod
    def _persistent(unit: FlatUnit) -> bool:
        return unit.name.endswith(".persistent")

    def _make_shard(self, unit: FlatUnit) -> torch.Tensor:
        shard = unit.flat[unit.start:unit.end]
        return shard if self._persistent(unit) else shard.clone()     # outlives the flat buffer

    # --8<-- [start:zero3_unshard]
    def unshard(self, k: int, prefetch: bool = False) -> None:
        """All-gather step k's sharded units (async when prefetching); without prefetch, wait for them."""
        for u, s in zip(self.units, self.shards):
            if u not in self.steps[k] or self._persistent(u):
                continue
            if not u.is_allocated() and u.name not in self._gathers:
                u.alloc_storage()
                self._event("all_gather_issued", unit=u.name, prefetch=prefetch)
                # .data: refilling the buffer is not an in-place op autograd should see.
                self._gathers[u.name] = comm.all_gather(u.flat.data, s, self.group, async_op=True, tag=u.name)
            if not prefetch and u.name in self._gathers:
                self._gathers.pop(u.name).wait()

    def reshard(self, k: int) -> None:
        """Free step k's gathered parameters (the shard stays)."""
        for u in self.steps[k]:
            if not self._persistent(u) and u.name not in self._gathers:
                u.free_storage()
    # --8<-- [end:zero3_unshard]

    # --8<-- [start:zero3_forward]
    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        m = self.module
        fns = [m.embed, *m.blocks, m.head]
        x = idx
        for k, fn in enumerate(fns):
            self.unshard(k)
            if self.config.prefetch and k + 1 < len(fns):
                self.unshard(k + 1, prefetch=True)             # overlaps with this unit's compute
            self._event("unit_forward_start", unit=self.steps[k][0].name)
            x = fn(x)
            self._event("unit_forward_end", unit=self.steps[k][0].name)
            if torch.is_grad_enabled():
                x = _UnshardForBackward.apply(x, self, k)
            self.reshard(k)
        logits = x                                             # (B, T, V)
        return logits, (m.loss(logits, targets) if targets is not None else None)
    # --8<-- [end:zero3_forward]

    def _reduce_unit(self, unit: FlatUnit) -> None:
        super()._reduce_unit(unit)
        if not self._persistent(unit):
            unit.free_storage()                                # backward of this unit is done

    def _gather_after_step(self) -> None:
        # Sharded units are refreshed by the next forward's all-gather; persistent ones now.
        for u, s in zip(self.units, self.shards):
            if self._persistent(u):
                comm.all_gather(u.flat, s.clone(), self.group, tag=u.name)


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
