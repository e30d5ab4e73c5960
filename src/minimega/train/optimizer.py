"""The engine's one optimizer: every part that steps this rank's parameters, stepped together.

What steps depends on the layout, and each part answers the same three calls (``step() -> bool`` — False
when an fp16 overflow skipped it —, ``zero_grad()``, ``memory() -> dict``):

    DDP (zero_stage 0)      `TorchOptimizer`: torch's optimizer over the full local parameters
    ZeRO 1-3                the chunk's ZeRO wrapper (`zero.Zero1` …): it owns the fp32 master shard and its
                            optimizer states, steps them and all-gathers the parameters; one per pipeline chunk
    experts under ZeRO      `moe.zero.ExpertZero1`: the experts' Adam states sharded over edp
"""
from __future__ import annotations

import torch
import torch.nn as nn

from ..run import measure
from ..config import TrainConfig


def make_optimizer(params, config: TrainConfig) -> torch.optim.Optimizer:
    """The optimizer named in the config (torch's implementations: they are the reference)."""
    if config.optimizer == "sgd":
        return torch.optim.SGD(params, lr=config.lr, weight_decay=config.weight_decay)
    cls = torch.optim.AdamW if config.optimizer == "adamw" else torch.optim.Adam
    return cls(params, lr=config.lr, betas=config.betas, eps=config.eps, weight_decay=config.weight_decay,
               foreach=False)


class TorchOptimizer:
    """DDP's part: torch's optimizer over ``module``'s parameters (every dp rank takes the same step).

    ``wrappers``: the `DataParallel` wrappers training them (one per pipeline chunk). In 16 bits the parameters it
    steps are their fp32 masters; under fp16 an overflow on any rank skips the step (each wrapper's loss scaler).
    """

    def __init__(self, module: nn.Module, config: TrainConfig, wrappers=()):
        self.module, self.optimizer = module, make_optimizer(module.parameters(), config)
        self.wrappers = list(wrappers)

    def step(self) -> bool:
        scaled = [w for w in self.wrappers if w.scaler]
        if scaled:
            overflow = any([w.overflow() for w in scaled])      # a list: every wrapper's collective runs
            for w in scaled:
                w.scaler.update(overflow)
            if overflow:
                return False
        self.optimizer.step()
        return True

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def memory(self) -> dict:
        out = measure.model_state_bytes(self.module, self.optimizer)
        low = [t for w in self.wrappers for t in getattr(w, "low_copies", ())]
        if low:                                      # 16-bit compute: the parameters are the fp32 masters
            out["master"], out["params"] = out["params"], measure.tensor_bytes(low)
        return out


class Optimizers:
    """The parts that step this rank's parameters (see the module docstring), as one optimizer."""

    def __init__(self, parts: list):
        self.parts = list(parts)

    def step(self) -> bool:
        """Step every part (each one's collectives line up across ranks); False if any skipped its step."""
        return all([part.step() for part in self.parts])

    def zero_grad(self, set_to_none: bool = True) -> None:
        for part in self.parts:
            part.zero_grad(set_to_none)

    def memory(self) -> dict:
        """Bytes this rank holds by category, summed over the parts."""
        out: dict = {}
        for part in self.parts:
            for k, v in part.memory().items():
                out[k] = out.get(k, 0) + v if isinstance(v, (int, float)) else v
        return out

    @property
    def state(self) -> dict:
        """torch's per-parameter state under DDP (checkpoints read and fill it); ZeRO keeps its states in its
        shards instead (`zero.state`), so this is empty there."""
        torch_parts = [p for p in self.parts if isinstance(p, TorchOptimizer)]
        return torch_parts[0].optimizer.state if torch_parts else {}
