"""How the parallelisms compose: each mesh dimension holds a different part of one global quantity.

A rank holds a piece of the model along each axis of the mesh:

    tp   sharded parameters: a disjoint slice each; replicated ones (LayerNorms, wpe, row-parallel biases)
         whole on every tp rank
    pp   disjoint chunks of blocks (the embedding on the first stage, the head on the last)
    dp   DDP: a full replica each; ZeRO: a disjoint shard of every unit's flat buffer

So a global quantity is assembled by summing over the axes that hold *different* elements and counting
replicas once:

    ‖∇‖² = Σ_ranks Σ_local params  w · ‖g‖²,  w = 1/tp for tp-replicated parameters, else 1,
           summed over tp and pp always, and over dp only under ZeRO (DDP's dp replicas are equal);
    full state dict: ZeRO gathers over dp, TP layers gather over tp (`full_like_param`), then the stages'
           disjoint dicts are merged over pp.

This is the 3D layout BLOOM-176B trained with (arXiv:2211.05100): TP inside a node, PP across nodes,
ZeRO-1 over data parallel. ZeRO-2/3 are not combined with pp: gradients would be reduce-scattered (and ZeRO-3
weights gathered) on every micro-batch, m times ZeRO-1's traffic; DeepSpeed's pipeline engine refuses
them too ("ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism").
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn as nn

from . import comm
from .comm import Group
from .tensor_parallel import sharded_params


# --8<-- [start:global_norm]
def tp_norm_weight(module: nn.Module, tp: int) -> Callable[[str], float]:
    """name → its weight in the squared gradient norm: 1 for tp-sharded parameters, 1/tp for replicated ones."""
    sharded = set(sharded_params(module))
    return lambda name: 1.0 if name in sharded or tp == 1 else 1.0 / tp


def weighted_sq_norm(module: nn.Module, tp: int) -> torch.Tensor:
    """Σ w·‖g‖² over ``module``'s local gradients (float64, not yet summed over any group)."""
    weight = tp_norm_weight(module, tp)
    device = next(module.parameters()).device
    sq = torch.zeros((), dtype=torch.float64, device=device)
    for name, p in module.named_parameters():
        if p.grad is not None:
            sq += weight(name) * p.grad.detach().double().pow(2).sum()
    return sq


def global_norm(local_sq: torch.Tensor, groups: list[Group]) -> float:
    """sqrt of ``local_sq`` summed over each of ``groups`` (the axes holding other elements of the model)."""
    for group in groups:
        comm.all_reduce(local_sq, group, tag="grad_norm")
    return local_sq.sqrt().item()
# --8<-- [end:global_norm]


def clip_coefficient(norm: float, max_norm: float) -> float:
    """min(1, max_norm / (norm + 1e-6)), as torch.nn.utils.clip_grad_norm_."""
    return min(1.0, max_norm / (norm + 1e-6))


# --8<-- [start:clip_zero]
def clip_zero_(stages: list[nn.Module], mesh, max_norm: float) -> float:
    """Clip ZeRO-sharded gradients by the global norm; ``stages`` are this rank's ZeRO wrappers (one per chunk).

    Every element is in one dp rank's shard, one tp rank's slice (or, replicated, weighted 1/tp) and one
    stage: the weighted squares are summed over dp, tp and pp.
    """
    sq = sum(s.grad_sq_norm(tp_norm_weight(s.module, mesh.tp_size)) for s in stages)
    norm = global_norm(sq, [mesh.dp_group, mesh.tp_group, mesh.pp_group])
    for s in stages:
        s.clip_grad_norm_(max_norm, norm=norm)
    return norm
# --8<-- [end:clip_zero]


class ChunkOptimizers:
    """A pipeline rank's optimizer when each chunk carries its own ZeRO-1 wrapper: steps them all.

    Args:
        stages: this rank's chunks' `Zero1` wrappers, in local order (the same count on every rank, so
            their collectives over dp line up).
    """

    def __init__(self, stages: list[nn.Module]):
        self.stages = stages

    def step(self) -> bool:
        return all([s.step() for s in self.stages])

    def zero_grad(self, set_to_none: bool = True) -> None:
        for s in self.stages:
            s.zero_grad(set_to_none)

    def memory(self) -> dict:
        """Bytes by category, summed over the chunks."""
        out: dict = {}
        for s in self.stages:
            for k, v in s.memory().items():
                out[k] = out.get(k, 0) + v if isinstance(v, (int, float)) else v
        return out
