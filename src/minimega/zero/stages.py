"""ZeRO stages 1-3 (Rajbhandari et al., arXiv:1910.02054), each a subclass of the one before.

The model is cut into units (the embeddings, each block, the head); each unit is one flat buffer padded to a
multiple of dp, and dp rank r owns ``[r·N/dp, (r+1)·N/dp)`` of it (`flat.py`). The fp32 master weights and
Adam's moments exist for that shard only (`offload.py`).

Gradients follow `parallel.grad_sync`'s protocol, one bucket per unit: a hook starts a unit's reduce-scatter
when its last gradient is in, ``finish_grad_sync()`` (called after backward) waits.

``Zero1`` (optimizer states sharded):
    Phase 1 (backward): gradients accumulate in a full flat gradient buffer per unit; when a unit's
        last gradient is in, its buffer's reduce-scatter starts (async); rank r will keep its shard's sum.
    Phase 2 (``finish_grad_sync()``): wait for every unit and write the reduced shard into the buffer
        (with ``offload_optimizer``: copy it to the host's fp32 buffer instead and drop the device's copy).
    Phase 3 (step): the optimizer updates this rank's master shard; all-gather the parameters.
``Zero2(Zero1)`` (+ gradients sharded): the unit's gradients are flattened into the reduce-scatter's
    input and the full gradients dropped, so a rank keeps only its shard's gradients (N/dp), or with
    offload none at all (each reduced shard goes to the host as it arrives; ZeRO-Offload). Gradient
    accumulation reduces on every micro-step (DeepSpeed's semantics); under ``no_sync()`` (the pipeline's
    micro-batches before the last) the full gradients accumulate and the last backward reduces them once.
``Zero3(Zero2)`` (+ parameters sharded, `stage3.py`): at rest each unit holds only its shard. ``unshard()`` (all-gather)
    before the unit's forward and again before its backward, ``reshard()`` (hand its buffer back) after each;
    the next unit's all-gather is issued before the current unit computes (prefetch). Units of at most
    ``param_persistence_threshold`` elements stay whole (DeepSpeed's ``stage3_param_persistence_threshold``).

Communication per step, in elements of Ψ (the padded parameter count), per rank ×(dp-1)/dp: stages 1 and 2
reduce-scatter Ψ + all-gather Ψ = 2Ψ (as DDP's all-reduce); stage 3 gathers Ψ twice and reduce-scatters Ψ = 3Ψ.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from .. import clock, comm
from ..run import measure
from ..train import precision
from ..parallel.grad_sync import GradSync, dp_named_parameters
from .flat import BufferPool, FlatUnit, gather_fp32, model_units  # noqa: F401  (model_units: imported from here too)
from .store import make_store


class Zero1(GradSync, nn.Module):
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
    grads_sharded = True

    def __init__(self, module: nn.Module, group: comm.Group, rank: int, config, make_optimizer,
                 model_parallel: tuple[comm.Group, ...] = ()):
        super().__init__()
        self.module, self.group, self.rank, self.config = module, group, rank, config
        self.model_parallel = model_parallel
        self.policy = precision.policy(config.precision)
        self.scaler = precision.make_scaler(self.policy, config)
        if self.policy.accumulate_dtype != self.policy.param_dtype:       # bf16: fp32 gradients (grad_sync)
            self.main_grad_dtype = self.policy.accumulate_dtype
        self.timeline: list[dict] = clock.Recent()          # the newest events (a long run stays bounded)
        self.clock = clock.HostClock()           # the engine lends its own (CUDA events on a GPU)
        self._prepared, self._overflow = False, False
        with torch.no_grad():
            for _, p in dp_named_parameters(module):
                comm.broadcast(p.data, group.ranks[0], group, tag="init")
        module.to(self.policy.param_dtype)
        self.units = [FlatUnit(name, params, group.size, rank, self.policy.param_dtype)
                      for name, params in self._units(module)]
        self._unit_of = {p: u for u in self.units for p in u.params}
        self.shards = [self._make_shard(u) for u in self.units]
        self.store = make_store(self.shards, make_optimizer, config, group.ranks[rank])   # device, host or disk
        self.grad_shards = self._make_grad_buffers()      # on the device; none under offload (the host keeps them)
        # A slot per reduction in flight (one without overlap); no pool at dp = 1, where nothing is reduced.
        self.max_in_flight = config.reductions_in_flight if config.overlap_comm else 1
        self.pool = BufferPool(self.max_in_flight, max(u.padded for u in self.units), group.size,
                               self.policy.accumulate_dtype, self.units[0].flat.device,
                               full=self.stage >= 2) if group.size > 1 else None
        self._staging: dict[int, torch.Tensor] = {}       # dp = 1, stages 2-3: a unit's flattened gradient, until retired
        self._reducing: dict[int, tuple[int, torch.Tensor, comm.Handle]] = {}    # unit -> (pool slot, output, handle)
        self._watch([u.params for u in self.units], main_grads=self._main_views)

    # -- layout: what Zero2 and Zero3 override ---------------------------------------------------
    def _units(self, module):
        return model_units(module)

    def _make_shard(self, unit: FlatUnit) -> torch.Tensor:
        return unit.flat[unit.start:unit.end]          # a view: the parameters themselves

    def _make_grad_buffers(self) -> list[torch.Tensor]:
        """Full flat gradient buffers (the policy's accumulation dtype); each ``p.grad`` is a view, so autograd
        accumulates in place; under bf16 the views are the fp32 ``main_grads`` the hooks add into instead.

        Returns this rank's shard of each (a view), where the reduced sum is written; none under offload.
        """
        self.flat_grads = [torch.zeros_like(u.flat, dtype=self.policy.accumulate_dtype) for u in self.units]
        self._main_views = {}
        for u, g in zip(self.units, self.flat_grads):
            for p, view in zip(u.params, u.views(g)):
                if self.main_grad_dtype is None:
                    p.grad = view
                else:
                    self._main_views[p] = view
        if self.store.keeps_grads:
            return []
        return [g[u.start:u.end] for u, g in zip(self.units, self.flat_grads)]

    # -- forward and backward --------------------------------------------------------------------
    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """fp16: the loss times the scale, in fp32 (as DeepSpeed; the fp16 graph then sees scale · dL)."""
        return loss.float() * self.scaler.scale if self.scaler else loss

    def _event(self, name: str, **extra) -> None:
        self.timeline.append({"event": name, "time": self.clock.stamp(), **extra})

    # --8<-- [start:zero1_reduce]
    # --8<-- [start:tour_reduce_scatter]
    def _start(self, i: int) -> None:
        """Phase 1: unit i's gradients are all in: start its reduce-scatter in a pool slot (`GradSync` made room)."""
        unit = self.units[i]
        k, buffer, out = self.pool.take(unit.padded) if self.pool else (None, None, None)
        full = self._reduce_input(i, buffer)
        out = full if out is None else out          # dp = 1: the sum is the gradient itself (comm copies nothing)
        self._event("reduce_scatter_issued", unit=unit.name)
        self._reducing[i] = k, out, comm.reduce_scatter(out, full, self.group, async_op=True, tag=unit.name)
    # --8<-- [end:tour_reduce_scatter]

    def _reduce_input(self, i: int, buffer: torch.Tensor | None) -> torch.Tensor:
        return self.flat_grads[i]                      # ZeRO-1 reduces the unit's own gradient buffer

    # --8<-- [start:tour_wait]
    def _retire(self, i: int) -> None:
        """Wait for unit i's reduce-scatter, keep its shard of the sum, give its pool slot back.

        Under offload the store takes the shard to the host at once (see `offload.py`); the slot's next
        reduction waits (on the device) until that copy has read it.
        """
        k, out, handle = self._reducing.pop(i)
        handle.wait()
        if self.store.keeps_grads:
            self.store.receive_grad(i, out)
            self.store.copies.reads_done()
        else:
            self._write_shard(i, out)
        self._staging.pop(i, None)
        if self.pool:
            self.pool.give_back(k)
    # --8<-- [end:tour_wait]

    def _complete(self) -> None:
        """Phase 2 (from ``finish_grad_sync()``): retire the reductions still in flight, oldest first."""
        while self._in_flight:
            self._retire(self._in_flight.pop(0))
        if self.store.keeps_grads:
            self.store.grads_received()
        self._event("grads_reduced")

    def _write_shard(self, i: int, reduced: torch.Tensor) -> None:
        self.grad_shards[i].copy_(reduced)
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
            self._overflow = not flag.is_meta and flag.item() > 0      # meta (a dry run): no values, no overflow

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

    def scale_grads_(self, coef: float) -> None:
        """Multiply this rank's gradient shards by ``coef`` (clipping); nothing on a step fp16 will skip."""
        if not self._overflow:
            for g in self.store.grads():
                g.mul_(coef)

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

    # --8<-- [start:tour_gather]
    def _gather_after_step(self) -> None:
        if self.pool:                                                  # dp = 1: the shards are the units
            self.pool.all_gather(self.units, self.shards, self.group)     # through the reductions' slots
    # --8<-- [end:tour_gather]
    # --8<-- [end:zero1_step]

    def zero_grad(self, set_to_none: bool = True) -> None:
        for g in self.grad_buffers():
            g.zero_()
        self.store.zero_grad()
        self._prepared = self._overflow = False

    def grad_buffers(self) -> list[torch.Tensor]:
        return self.flat_grads

    # -- state and accounting --------------------------------------------------------------------
    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """fp32 weights with the model's keys, on every rank: all-gather each unit's master shard."""
        return self._gather_shards(self.store.master, "state_dict")

    def full_grad_dict(self) -> dict[str, torch.Tensor]:
        """The fp32 gradients the next step applies (averaged over dp, unscaled, clipped when the engine has
        clipped), with the model's keys, on every rank; between the last backward and ``step()``."""
        self._prepare()
        return self._gather_shards([m.grad if m.grad is not None else torch.zeros_like(m)
                                    for m in self.store.master], "grad_dict")

    def _gather_shards(self, shards: list[torch.Tensor], tag: str) -> dict[str, torch.Tensor]:
        out = gather_fp32(self.units, shards, self.group, tag)
        return {n: out[n] for n, _ in dp_named_parameters(self.module)}

    def memory(self) -> dict:
        """Bytes this rank holds by category (storages shared by views are counted once). ``params`` and ``grads`` are
        on the device; ``master``, ``optimizer_states`` and the step counters
        where ``optimizer_location`` says; ``host_grads`` (offload only) in host memory.
        """
        return {"params": measure.tensor_bytes(self.shards),    # a view's whole storage: ZeRO-1/2's flat buffers
                "grads": measure.tensor_bytes(self.grad_buffers() + [p.grad for p in self._unit_of]),
                **self.store.memory(), "optimizer_location": self.store.location}


# --8<-- [start:zero2_buffers]
class Zero2(Zero1):
    """ZeRO stage 2: + gradients sharded, reduce-scattered per unit from backward hooks (overlapped).

    Every micro-step reduces (DeepSpeed's semantics): full gradients never outlive their unit's
    backward, so gradient accumulation sums into the shard.
    """

    stage = 2
    reduce_every_micro_step = True

    def _make_grad_buffers(self) -> list:
        """No buffers yet: a unit's shard is created by its first reduction and released after the step."""
        self._main_views = {}                                  # main_grads live only until their unit reduces
        if self.store.keeps_grads:                             # offload: the shards accumulate on the host
            return []
        return [None] * len(self.units)

    def grad_buffers(self) -> list[torch.Tensor]:
        return [g for g in self.grad_shards if g is not None] + list(self._staging.values())
# --8<-- [end:zero2_buffers]

    # --8<-- [start:zero2_hook]
    def _reduce_input(self, i: int, buffer: torch.Tensor) -> torch.Tensor:
        unit = self.units[i]
        if buffer is None:                                     # dp = 1 (no pool): a buffer of its own, a gradient
            buffer = self._staging[i] = torch.empty(unit.padded, dtype=self.policy.accumulate_dtype,
                                                    device=unit.flat.device)
        flat = unit.flatten_grads(self.main_grads, out=buffer)   # (padded,) this rank's full gradient, in a pool slot
        for p in unit.params:
            p.grad = None                                      # the full gradient is not kept
            self.main_grads.pop(p, None)
        return flat

    def _write_shard(self, i: int, reduced: torch.Tensor) -> None:
        if self.grad_shards[i] is None:                        # the first micro-step: the shard is born
            self.grad_shards[i] = reduced.clone() if self.pool else reduced     # dp = 1: the buffer is the shard
        else:
            self.grad_shards[i].add_(reduced)                 # accumulate over micro-steps
    # --8<-- [end:zero2_hook]

    def zero_grad(self, set_to_none: bool = True) -> None:
        """After the step: release the gradient shards (FSDP2 frees them too); the next backward makes new ones."""
        if not self.store.keeps_grads:
            self.grad_shards = [None] * len(self.units)
        self.store.zero_grad()
        self._prepared = self._overflow = False
