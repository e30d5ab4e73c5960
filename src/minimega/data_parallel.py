"""Data parallelism (DDP, ZeRO stage 0): every rank holds the whole model and averages gradients.

How it overlaps communication with the backward pass:

    Phase 1 (construction): parameters are grouped into buckets of about ``bucket_mb`` MiB, in
        *reverse* registration order, because backward produces the last layers' gradients first.
    Phase 2 (backward): a hook fires as each parameter's gradient is accumulated; when the last
        gradient of a bucket arrives, the bucket is flattened and its all-reduce is launched
        asynchronously, while autograd keeps computing earlier layers' gradients.
    Phase 3 (end of backward): wait for every bucket, divide by dp, copy the averages back into ``.grad``.

Inside ``no_sync()`` (gradient accumulation) the hooks do nothing: gradients just accumulate locally
and the next synchronised backward reduces the sum.
"""
from __future__ import annotations

import time
from contextlib import contextmanager

import torch
import torch.nn as nn

from . import comm


class _Bucket:
    def __init__(self, params: list[nn.Parameter], index: int):
        self.params, self.index = params, index
        self.numel = sum(p.numel() for p in params)
        self.buffer: torch.Tensor | None = None
        self.handle: comm.Handle | None = None
        self.ready = 0


class DataParallel(nn.Module):
    """Wrap ``module`` so gradients are averaged over ``group`` during backward.

    Args:
        module: the full model, identical on every rank (same seed).
        group: the data-parallel group (``mesh.dp_group``).
        bucket_mb: target bucket size in MiB (torch DDP's default is 25).
        broadcast_init: copy rank 0's parameters to every rank first (a safety net against unequal seeds).
    """

    def __init__(self, module: nn.Module, group: comm.Group, bucket_mb: float = 25.0, broadcast_init: bool = True):
        super().__init__()
        self.module, self.group = module, group
        self._sync = True
        self.timeline: list[dict] = []
        params = [p for p in module.parameters() if p.requires_grad]
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
        self._bucket_of = {p: b for b in self.buckets for p in b.params}
        self._callback_queued = False
        if group.size > 1:
            for p in params:
                p.register_post_accumulate_grad_hook(self._on_grad_ready)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    @contextmanager
    def no_sync(self):
        """Accumulate gradients locally; the first backward after the block reduces the sum."""
        old, self._sync = self._sync, False
        try:
            yield
        finally:
            self._sync = old

    # --8<-- [start:ddp_hook]
    def _on_grad_ready(self, p: nn.Parameter) -> None:
        if not self._sync:
            return
        if not self._callback_queued:    # run _finish once autograd has finished this backward
            torch.autograd.Variable._execution_engine.queue_callback(self._finish)
            self._callback_queued = True
        bucket = self._bucket_of[p]
        bucket.ready += 1
        if bucket.ready == len(bucket.params):
            self._launch(bucket)

    def _launch(self, bucket: _Bucket) -> None:
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in bucket.params]
        bucket.buffer = torch.cat([g.reshape(-1) for g in grads])              # (numel,) flat
        self.timeline.append({"event": "all_reduce_issued", "bucket": bucket.index, "time": time.perf_counter()})
        bucket.handle = comm.all_reduce(bucket.buffer, self.group, async_op=True, tag=f"bucket{bucket.index}")
    # --8<-- [end:ddp_hook]

    def _finish(self) -> None:
        self._callback_queued = False
        for bucket in self.buckets:
            if bucket.handle is None:        # a parameter that got no gradient: reduce zeros for it
                self._launch(bucket)
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
            bucket.buffer, bucket.handle, bucket.ready = None, None, 0
        self.timeline.append({"event": "grads_synced", "time": time.perf_counter()})
