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
"""
from __future__ import annotations


import torch
import torch.nn as nn

from .. import clock, comm
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
    """

    def __init__(self, module: nn.Module, group: comm.Group, bucket_mb: float = 25.0, broadcast_init: bool = True):
        super().__init__()
        self.module, self.group = module, group
        self.timeline: list[dict] = clock.Window()          # the newest events (a long run stays bounded)
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
        self._watch([b.params for b in self.buckets], hooks=group.size > 1)   # one rank: nothing to average

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    # --8<-- [start:ddp_hook]
    # --8<-- [start:ddp_hook_c1]
    def _start(self, i: int) -> None:
    # --8<-- [end:ddp_hook_c1]
        """Phase 2: bucket i's last gradient is in; flatten the bucket and launch its all-reduce."""
        # --8<-- [start:ddp_hook_c2]
        bucket = self.buckets[i]
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in bucket.params]
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
        # --8<-- [start:ddp_finish_c2]
        for bucket in self.buckets:
            bucket.handle.wait()
            bucket.buffer.div_(self.group.size)
            offset = 0
            for p in bucket.params:
                n = p.numel()
                if p.grad is None:
                    p.grad = bucket.buffer[offset:offset + n].view_as(p).clone()
                else:
                    p.grad.copy_(bucket.buffer[offset:offset + n].view_as(p))
                offset += n
            bucket.buffer, bucket.handle = None, None
        self.timeline.append({"event": "grads_synced", "time": self.clock.stamp()})
        # --8<-- [end:ddp_finish_c2]
    # --8<-- [end:ddp_finish]

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
