"""Measured bytes per rank, by category: what each rank really holds, counted tensor by tensor.

Counting resident tensors is exact and repeatable (unlike RSS or the profiler's memory timeline, which
vary run to run on CPU), so tests can compare these numbers with `minimega.estimate` exactly.
Tensors that share storage are counted once.
"""
from __future__ import annotations

from typing import Iterable

import torch


def tensor_bytes(tensors: Iterable[torch.Tensor | None], seen: set | None = None) -> int:
    """Bytes of the distinct storages behind ``tensors`` (None entries are skipped)."""
    seen = set() if seen is None else seen
    total = 0
    for t in tensors:
        if t is None or not isinstance(t, torch.Tensor):
            continue
        storage = t.untyped_storage()
        key = (storage.data_ptr(), t.device)
        if key in seen:
            continue
        seen.add(key)
        total += storage.nbytes()
    return total


def optimizer_state_tensors(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """Every tensor in an optimizer's state (Adam's exp_avg, exp_avg_sq, step)."""
    return [v for state in optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor)]


def model_state_bytes(module: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None) -> dict:
    """{'params', 'grads', 'optimizer_states', 'optimizer_step_counters'} bytes of an unsharded module.

    'optimizer_states' are the moments (Adam's m and v: the ZeRO paper's K); torch keeps one 0-d
    ``step`` counter per parameter tensor besides, counted apart.
    """
    params = list(module.parameters())
    states = optimizer_state_tensors(optimizer) if optimizer else []
    return {
        "params": tensor_bytes(params),
        "grads": tensor_bytes(p.grad for p in params),
        "optimizer_states": tensor_bytes(t for t in states if t.dim() > 0),
        "optimizer_step_counters": tensor_bytes(t for t in states if t.dim() == 0),
    }
