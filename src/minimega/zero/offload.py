"""Where the fp32 master weights and the optimizer states of this rank's shards live, and where the step runs.

`MasterStore` keeps them next to the parameters. With fp32 parameters the master weights *are* the
parameter shards (no copy: ZeRO's K counts Adam's m and v only); with bf16/fp16 parameters the store
holds an fp32 copy of each shard.

`CPUOffloadStore` (ZeRO-Offload, arXiv:2101.06840) keeps an fp32 master copy and the optimizer
states in host memory (pinned when CUDA is present) and runs the step there:

    Phase 1: copy this rank's gradient shards to the host (fp32), unscaled and averaged.
    Phase 2: the optimizer steps on the host copies.
    Phase 3: copy the updated master shards back into the parameter shards (cast to their dtype).

On CUDA the copies of phases 1 and 3 run on a dedicated copy stream (`CopyStream`), ordered by events:
the gradient copy starts after the reduce compute has queued, the host waits for it before stepping,
and compute waits (on the GPU, not the host) for the parameter upload before the next forward.

On a CPU-only run the host *is* the device, but the store is still a separate set of tensors with
its own bytes, so the code path and the memory it costs are real and measured.
"""
from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.nn as nn

from .. import measure


class MasterStore:
    """fp32 master shards + a torch optimizer over them, on the parameters' device.

    Args:
        shards: this rank's parameter shards, one per unit (any dtype; 1-D).
        make_optimizer: ``params -> torch.optim.Optimizer`` (the engine's, so the math is torch's).
    """

    location = "device"

    def __init__(self, shards: list[torch.Tensor], make_optimizer):
        self.shards = shards
        self.master = [nn.Parameter(self._master_of(s), requires_grad=False) for s in shards]
        self.optimizer = make_optimizer(self.master)

    def _master_of(self, shard: torch.Tensor) -> torch.Tensor:
        # fp32 shards are their own master (same storage); low-precision ones get an fp32 copy.
        return shard if shard.dtype == torch.float32 else shard.detach().float().clone()

    @property
    def aliased(self) -> bool:
        return all(m.data_ptr() == s.data_ptr() for m, s in zip(self.master, self.shards))

    # --8<-- [start:master_phases]
    def set_grads(self, grads: list[torch.Tensor], divide_by: float) -> None:
        """Phase 1: ``master.grad = grad / divide_by`` in fp32 (divide_by = dp · loss scale)."""
        for m, g in zip(self.master, grads):
            g32 = g if g.dtype == torch.float32 else g.float()      # fp32: in place, no copy
            m.grad = g32.div_(divide_by)

    def grads(self) -> list[torch.Tensor]:
        return [m.grad for m in self.master if m.grad is not None]

    @torch.no_grad()
    def step(self) -> None:
        """Phases 2 and 3: step on the master shards, write them back into the parameter shards."""
        self.optimizer.step()
        if not self.aliased:
            for s, m in zip(self.shards, self.master):
                s.copy_(m.to(device=s.device, dtype=s.dtype))
    # --8<-- [end:master_phases]

    def zero_grad(self) -> None:
        for m in self.master:
            m.grad = None

    def memory(self) -> dict:
        """Bytes by category: the fp32 master copy (0 when aliased) and the optimizer's moments."""
        states = measure.optimizer_state_tensors(self.optimizer)
        return {"master": 0 if self.aliased else measure.tensor_bytes(self.master),
                "optimizer_states": measure.tensor_bytes(t for t in states if t.dim() > 0),
                "optimizer_step_counters": measure.tensor_bytes(t for t in states if t.dim() == 0)}


# --8<-- [start:copy_stream]
class HostCopies:
    """Where offload's device<->host copies run. On CPU: in order, on the host; nothing to wait for."""

    @contextmanager
    def copying(self):
        yield

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        dst.copy_(src, non_blocking=True)     # async only between a GPU and pinned host memory

    def host_waits(self) -> None:
        pass

    def compute_waits(self) -> None:
        pass


class CopyStream(HostCopies):
    """CUDA: the copies run on their own stream, so compute does not stall behind them.

    Args:
        stream, event, current, use: ``torch.cuda``'s ``Stream()``, ``Event``, ``current_stream`` and
            ``stream`` (tests pass stand-ins that record the order of operations).
    """

    def __init__(self, stream=None, event=None, current=None, use=None):
        self.stream = stream or torch.cuda.Stream()
        self._event, self._current = event or torch.cuda.Event, current or torch.cuda.current_stream
        self._use = use or torch.cuda.stream
        self.done = None

    @contextmanager
    def copying(self):
        self.stream.wait_stream(self._current())        # after what compute queued: the reduce, the step
        with self._use(self.stream):
            yield
        self.done = self._event()
        self.done.record(self.stream)

    def host_waits(self) -> None:                        # the CPU step reads the gradients
        self.done.synchronize()

    def compute_waits(self) -> None:                     # the next forward reads the parameters
        self._current().wait_event(self.done)
# --8<-- [end:copy_stream]


# --8<-- [start:cpu_offload]
class CPUOffloadStore(MasterStore):
    """ZeRO-Offload: master shards and optimizer states in host memory; the step runs on the host."""

    location = "cpu"

    def __init__(self, shards: list[torch.Tensor], make_optimizer):
        super().__init__(shards, make_optimizer)
        self.copies = CopyStream() if any(s.is_cuda for s in shards) else HostCopies()

    def _master_of(self, shard: torch.Tensor) -> torch.Tensor:
        host = torch.empty(shard.shape, dtype=torch.float32, device="cpu",
                           pin_memory=torch.cuda.is_available())
        return host.copy_(shard.detach())        # always a separate copy, even for fp32 on a CPU run

    @property
    def aliased(self) -> bool:
        return False

    def set_grads(self, grads: list[torch.Tensor], divide_by: float) -> None:
        """Phase 1: gradients into fresh (pinned) fp32 host buffers; the host waits for them, compute does not."""
        host = [torch.empty(m.shape, dtype=torch.float32, pin_memory=torch.cuda.is_available())
                for m in self.master]
        with self.copies.copying():
            for h, g in zip(host, grads):
                self.copies.copy(h, g.detach())
        self.copies.host_waits()
        for m, h in zip(self.master, host):
            m.grad = h.div_(divide_by)

    @torch.no_grad()
    def step(self) -> None:
        """Phases 2 and 3: step on the host, upload on the copy stream; compute waits for the upload.

        The next step writes the master shards only after the next `host_waits()`, which follows this
        upload on the same (in-order) copy stream, so the upload never reads a half-written master.
        """
        self.optimizer.step()
        with self.copies.copying():
            for s, m in zip(self.shards, self.master):
                self.copies.copy(s, m)           # casts to the parameter's dtype
        self.copies.compute_waits()
# --8<-- [end:cpu_offload]
