"""Data parallelism (DDP, ZeRO stage 0): every rank holds the whole model and averages gradients.

How it overlaps communication with the backward pass (the protocol of `minimega.parallel.grad_sync`):

    Phase 1 (construction): parameters are grouped into buckets of about ``bucket_mb`` MiB, in
        *reverse* registration order, because backward produces the last layers' gradients first.
    Phase 2 (backward): a hook fires as each parameter's gradient is accumulated; when the last
        gradient of a bucket arrives, the bucket is flattened and its all-reduce is launched
        asynchronously, while autograd keeps computing earlier layers' gradients.
    Phase 3 (``finish_grad_sync()``, called after backward): wait for every bucket, divide by dp, copy
        the averages back into ``.grad``.

Inside ``no_sync()`` (gradient accumulation) the hooks start nothing: gradients just accumulate locally
and the next synchronised backward reduces the sum.

Mixed precision (``precision='bf16'`` or ``'fp16'``; torch DDP's ``mixed_precision``): the parameters stay fp32
between steps (they are the master weights the optimizer updates) and are swapped for 16-bit copies for the
forward and backward; each backward's 16-bit gradient is added into an fp32 buffer (`grad_sync`'s ``main_grad``),
reduced in fp32 and written to the fp32 parameter's ``.grad``. fp16 scales the loss (`precision.DynamicLossScaler`):
``finish_grad_sync`` divides by the scale, `step` skips the update on an overflow on any rank.
"""
from __future__ import annotations


import torch
import torch.nn as nn

from .. import clock, comm
from ..train import precision as precision_
from .grad_sync import GradSync, dp_named_parameters


class _Bucket:
    def __init__(self, params: list[nn.Parameter], index: int):
        self.params, self.index = params, index
        self.numel = sum(p.numel() for p in params)
        self.buffer: torch.Tensor | None = None
        self.handle: comm.Handle | None = None


class DataParallel(GradSync, nn.Module):
    """Wrap ``module`` so gradients are averaged over ``group``: started in backward, finished by ``finish_grad_sync()``.

    Args:
        module: the full model, identical on every rank (same seed).
        group: the data-parallel group (``mesh.dp_group``).
        bucket_mb: target bucket size in MiB (torch DDP's default is 25).
        broadcast_init: copy rank 0's parameters to every rank first (a safety net against unequal seeds).
        config: a `TrainConfig`: its ``precision`` (fp32, bf16, fp16) and fp16's loss-scaler settings.
        model_parallel: the groups holding the model's other parts (tp, pp): an fp16 overflow on any rank skips
            the step everywhere.
    """

    def __init__(self, module: nn.Module, group: comm.Group, bucket_mb: float = 25.0, broadcast_init: bool = True,
                 config=None, model_parallel=()):
        super().__init__()
        self.module, self.group, self.model_parallel = module, group, model_parallel
        self.policy = precision_.policy(config.precision if config is not None else "fp32")
        self.scaler = precision_.make_scaler(self.policy, config)
        self.compute_dtype = self.policy.param_dtype
        if self.policy.has_master_copy:                     # fp32 masters, 16-bit copies for compute
            self.main_grad_dtype = torch.float32
            self._low = {p: torch.empty_like(p, dtype=self.compute_dtype) for p in module.parameters()}
            self._master: dict = {}                         # while swapped: parameter -> its fp32 data
        self.timeline: list[dict] = clock.Recent()          # the newest events (a long run stays bounded)
        self.clock = clock.HostClock()           # the engine lends its own (CUDA events on a GPU)
        params = [p for _, p in dp_named_parameters(module) if p.requires_grad]
        if broadcast_init:
            with torch.no_grad():
                for p in params:
                    comm.broadcast(p.data, group.ranks[0], group, tag="init")
        limit = max(1, int(bucket_mb * 2**20))
        self.buckets: list[_Bucket] = []
        current: list[nn.Parameter] = []
        for p in reversed(params):
            current.append(p)
            if sum(q.numel() * q.element_size() for q in current) >= limit:
                self.buckets.append(_Bucket(current, len(self.buckets)))
                current = []
        if current:
            self.buckets.append(_Bucket(current, len(self.buckets)))
        # One rank has nothing to average, but 16-bit gradients still go through the fp32 buffers.
        self._watch([b.params for b in self.buckets], hooks=group.size > 1 or self.policy.has_master_copy)

    @property
    def low_copies(self) -> list[torch.Tensor]:
        """The 16-bit copies the forward and backward compute with (none in fp32)."""
        return list(self._low.values()) if self.policy.has_master_copy else []

    def forward(self, *args, **kwargs):
        if self.policy.has_master_copy and not self._master:
            self._to_compute_dtype()
        out = self.module(*args, **kwargs)
        if self.policy.has_master_copy and not torch.is_grad_enabled():
            self._to_master()                               # evaluation: no backward will hand them back
        return out

    @torch.no_grad()
    def _to_compute_dtype(self) -> None:
        """The 16-bit copies of the fp32 parameters, in their place for the forward and backward."""
        for p, low in self._low.items():
            self._master[p] = p.data
            p.data = low.copy_(p.data)

    def _to_master(self) -> None:
        """The fp32 parameters back in place (the optimizer steps them; checkpoints read them)."""
        for p, master in self._master.items():
            p.data = master
        self._master = {}

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """fp16: the loss times the scale (backward then sees scaled gradients); else the loss."""
        return loss.float() * self.scaler.scale if self.scaler else loss

    # --8<-- [start:ddp_hook]
    # --8<-- [start:ddp_hook_c1]
    def _start(self, i: int) -> None:
    # --8<-- [end:ddp_hook_c1]
        """Phase 2: bucket i's last gradient is in; flatten the bucket and launch its all-reduce."""
        # --8<-- [start:ddp_hook_c2]
        bucket = self.buckets[i]
        grads = [self._grad(p) for p in bucket.params]
        bucket.buffer = torch.cat([g.reshape(-1) for g in grads])              # (numel,) flat
        self.timeline.append({"event": "all_reduce_issued", "bucket": bucket.index, "time": self.clock.stamp()})
        bucket.handle = comm.all_reduce(bucket.buffer, self.group, async_op=True, tag=f"bucket{bucket.index}")
        # --8<-- [end:ddp_hook_c2]
    # --8<-- [end:ddp_hook]

    # --8<-- [start:ddp_finish]
    # --8<-- [start:ddp_finish_c1]
    def _complete(self) -> None:
    # --8<-- [end:ddp_finish_c1]
        """Phase 3 (from ``finish_grad_sync()``): wait for each bucket, average, write back into ``.grad``."""
        if self.policy.has_master_copy:
            self._to_master()                               # fp32 parameters take the fp32 averages
        # --8<-- [start:ddp_finish_c2]
        for bucket in self.buckets:
            bucket.handle.wait()
            bucket.buffer.div_(self.group.size * (self.scaler.scale if self.scaler else 1.0))
            offset = 0
            for p in bucket.params:
                n = p.numel()
                if p.grad is None:
                    p.grad = bucket.buffer[offset:offset + n].view_as(p).clone()
                else:
                    p.grad.copy_(bucket.buffer[offset:offset + n].view_as(p))
                offset += n
            bucket.buffer, bucket.handle = None, None
        self.main_grads.clear()
        self.timeline.append({"event": "grads_synced", "time": self.clock.stamp()})
        # --8<-- [end:ddp_finish_c2]
    # --8<-- [end:ddp_finish]

    def _grad(self, p: nn.Parameter) -> torch.Tensor:
        """This rank's gradient of ``p`` (the fp32 sum under 16-bit compute); zeros if it got none."""
        g = self.main_grads.get(p) if self.main_grad_dtype is not None else p.grad
        return g if g is not None else torch.zeros_like(p, dtype=self.main_grad_dtype or p.dtype)

    def overflow(self) -> bool:
        """fp16: whether any gradient of any rank holding the model is inf or nan (a collective over tp, pp;
        dp ranks agree already: they hold the same averages); False without loss scaling."""
        if not self.scaler:
            return False
        grads = [p.grad for p in self.module.parameters() if p.grad is not None]
        flag = torch.tensor(float(precision_.has_overflow(grads)), device=grads[0].device if grads else None)
        for group in self.model_parallel:
            comm.all_reduce(flag, group, tag="overflow")
        return bool(flag.item() > 0)

    # -- clipping (see grad_sync.clip_grad_norm_) --------------------------------------------------
    def grad_sq_norm(self, weight=None) -> torch.Tensor:
        """Σ weight(name)·‖g‖² over the module's gradients (float64, not reduced over any group)."""
        device = next(self.module.parameters()).device
        sq = torch.zeros((), dtype=torch.float64, device=device)
        for name, p in dp_named_parameters(self.module):
            if p.grad is not None:
                sq += (weight(name) if weight else 1.0) * p.grad.detach().double().pow(2).sum()
        return sq

    def scale_grads_(self, coef: float) -> None:
        for _, p in dp_named_parameters(self.module):
            if p.grad is not None:
                p.grad.mul_(coef)
