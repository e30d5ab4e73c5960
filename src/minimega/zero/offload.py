"""Where the gradient shards, the fp32 master weights and the optimizer states of this rank live, and where the step runs.

`MasterStore` keeps them next to the parameters. With fp32 parameters the master weights *are* the
parameter shards (no copy: ZeRO's K counts Adam's m and v only); with bf16/fp16 parameters the store
holds an fp32 copy of each shard. The ZeRO stage keeps the gradient shards on the device and hands
them over at the step (`set_grads`).

`CPUOffloadStore` (ZeRO-Offload, arXiv:2101.06840) keeps the gradient shards, an fp32 master copy and
the optimizer states in host memory (pinned when CUDA is present) and runs the step there:

    Phase 1 (backward): as soon as a unit's reduce-scatter is done, its reduced shard is copied to the
        host (`receive_grad`) and summed into the unit's fp32 host buffer (`grads_received`); the
        device's copy is dropped, so no gradient shard stays on the device until the step.
    Phase 2 (step): divide the host sums by dp · loss scale; the optimizer steps on the host.
    Phase 3: copy the updated master shards back into the parameter shards (cast to their dtype).

On CUDA the copies of phases 1 and 3 run on a dedicated copy stream (`CopyStream`), ordered by events:
each gradient copy starts after its reduce has been waited for on the compute stream, the host waits
for the copies before it sums them (and only then the device's reduce outputs are freed), and
compute waits (on the GPU, not the host) for the parameter upload before the next forward.

On a CPU-only run the host *is* the device, but the store is still a separate set of tensors with
its own bytes, so the code path and the memory it costs are real and measured.

One level further down, `nvme.NVMeOffloadStore` keeps the master shards and the optimizer states in files
between steps (ZeRO-Infinity's disk tier).
"""
from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.nn as nn

from ..run import measure


class MasterStore:
    """fp32 master shards + a torch optimizer over them, on the parameters' device.

    Args:
        shards: this rank's parameter shards, one per unit (any dtype; 1-D).
        make_optimizer: ``params -> torch.optim.Optimizer`` (the engine's, so the math is torch's).
    """

    location = "device"
    keeps_grads = False
    """Whether the reduced gradient shards go straight into the store (offload) instead of device buffers."""

    def __init__(self, shards: list[torch.Tensor], make_optimizer):
        self.shards = shards
        self.master = [nn.Parameter(self._master_of(s), requires_grad=False) for s in shards]
        self.optimizer = make_optimizer(self.master)

    def _master_of(self, shard: torch.Tensor) -> torch.Tensor:
        # fp32 shards are their own master (same storage); low-precision ones get an fp32 copy.
        return shard if shard.dtype == torch.float32 else shard.detach().float().clone()

    @property
    def aliased(self) -> bool:
        return all(measure.same_storage(m, s) for m, s in zip(self.master, self.shards))

    # --8<-- [start:master_phases]
    def set_grads(self, grads: list[torch.Tensor], divide_by: float) -> None:
        """Phase 1: ``master.grad = grad / divide_by`` in fp32 (divide_by = dp · loss scale)."""
        for m, g in zip(self.master, grads):
            if g is None:                                           # no backward since the last step
                m.grad = None
                continue
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

    def reads_done(self) -> None:
        """Later device work may overwrite what the copies read (a reused reduce buffer). On CPU: already so."""


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

    def host_waits(self) -> None:                        # the host sums the gradients, then steps on them
        if self.done is not None:
            self.done.synchronize()

    def compute_waits(self) -> None:                     # the next forward reads the parameters
        self._current().wait_event(self.done)

    def reads_done(self) -> None:                        # a reduce buffer the copy reads is about to be reused
        self._current().wait_stream(self.stream)
# --8<-- [end:copy_stream]


# --8<-- [start:cpu_offload]
class CPUOffloadStore(MasterStore):
    """ZeRO-Offload: gradient shards, master shards and optimizer states in host memory; the step runs on the host.

    Each unit's reduced gradient shard comes down as soon as its reduce is done (`receive_grad`) and is
    summed in fp32 on the host, as DeepSpeed does (its fp32 gradient partition in pinned host memory):
    the device keeps the parameters, and gradients only while a unit's backward and reduce are under way.
    """

    location = "cpu"
    keeps_grads = True

    def __init__(self, shards: list[torch.Tensor], make_optimizer):
        super().__init__(shards, make_optimizer)
        self.pin = torch.cuda.is_available()
        self.host_grads = [torch.zeros(m.shape, dtype=torch.float32, pin_memory=self.pin) for m in self.master]
        self.copies = CopyStream() if any(s.is_cuda for s in shards) else HostCopies()
        self._arriving: list[tuple[int, torch.Tensor]] = []        # (unit, its shard in the host's staging buffer)

    def _master_of(self, shard: torch.Tensor) -> torch.Tensor:
        host = torch.empty(shard.shape, dtype=torch.float32, device="cpu", pin_memory=torch.cuda.is_available())
        return host.copy_(shard.detach())        # always a separate copy, even for fp32 on a CPU run

    @property
    def aliased(self) -> bool:
        return False

    def receive_grad(self, i: int, shard: torch.Tensor) -> None:
        """Phase 1, per unit as soon as its reduce is waited for: copy its shard down (in its own dtype)."""
        staging = torch.empty(shard.shape, dtype=shard.dtype, pin_memory=self.pin)
        with self.copies.copying():              # after the reduce, on the copy stream
            self.copies.copy(staging, shard.detach())
        self._arriving.append((i, staging))

    def grads_received(self) -> None:
        """Phase 1, end of the backward: wait for the copies, sum them in fp32 (over micro-steps too).

        The caller frees the device's shards after this returns: the copies have read them by then.
        """
        self.copies.host_waits()
        for i, staging in self._arriving:
            self.host_grads[i].add_(staging)
        self._arriving = []

    def set_grads(self, grads: list[torch.Tensor], divide_by: float) -> None:
        """Phase 2 begins: the host sums, divided by dp · loss scale, become the master gradients."""
        if grads:
            raise RuntimeError(f"CPUOffloadStore.set_grads: {len(grads)} gradient shards on the device; under offload "
                               "the reduced shards go to the host as they arrive (receive_grad), none stay on the device")
        for m, h in zip(self.master, self.host_grads):
            m.grad = h.div_(divide_by)

    @torch.no_grad()
    def step(self) -> None:
        """Phases 2 and 3: step on the host, upload on the copy stream; compute waits for the upload.

        The next step writes the master shards only after the next `grads_received()` has waited for the
        copy stream, where this upload came first (in order), so the upload never reads a half-written master.
        """
        self.optimizer.step()
        with self.copies.copying():
            for s, m in zip(self.shards, self.master):
                self.copies.copy(s, m)           # casts to the parameter's dtype
        self.copies.compute_waits()

    def zero_grad(self) -> None:
        super().zero_grad()
        for h in self.host_grads:
            h.zero_()

    def memory(self) -> dict:
        """`MasterStore.memory`, all of it in host memory, plus the fp32 gradient shards there."""
        return {**super().memory(), "host_grads": measure.tensor_bytes(self.host_grads)}
# --8<-- [end:cpu_offload]
