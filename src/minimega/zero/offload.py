"""Where the fp32 master weights and the optimizer states of this rank's shards live, and where the step runs.

`MasterStore` keeps them next to the parameters. With fp32 parameters the master weights *are* the
parameter shards (no copy: ZeRO's K counts Adam's m and v only); with bf16/fp16 parameters the store
holds an fp32 copy of each shard.

`CPUOffloadStore` (ZeRO-Offload, arXiv:2101.06840) keeps an fp32 master copy and the optimizer
states in host memory (pinned when CUDA is present) and runs the step there:

    Phase 1: copy this rank's gradient shards to the host (fp32), unscaled and averaged.
    Phase 2: the optimizer steps on the host copies.
    Phase 3: copy the updated master shards back into the parameter shards (cast to their dtype).

On a CPU-only run the host *is* the device, but the store is still a separate set of tensors with
its own bytes, so the code path and the memory it costs are real and measured.
"""
from __future__ import annotations

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


# --8<-- [start:cpu_offload]
class CPUOffloadStore(MasterStore):
    """ZeRO-Offload: master shards and optimizer states in host memory; the step runs on the host."""

    location = "cpu"

    def _master_of(self, shard: torch.Tensor) -> torch.Tensor:
        host = torch.empty(shard.shape, dtype=torch.float32, device="cpu",
                           pin_memory=torch.cuda.is_available())
        return host.copy_(shard.detach())        # always a separate copy, even for fp32 on a CPU run

    @property
    def aliased(self) -> bool:
        return False

    def set_grads(self, grads: list[torch.Tensor], divide_by: float) -> None:
        for m, g in zip(self.master, grads):
            m.grad = g.detach().to(device="cpu", dtype=torch.float32, copy=True).div_(divide_by)
# --8<-- [end:cpu_offload]
