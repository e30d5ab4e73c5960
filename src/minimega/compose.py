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

The norm and the clipping for every layout are `grad_sync.clip_grad_norm_`.

This is the 3D layout BLOOM-176B trained with (arXiv:2211.05100): TP inside a node, PP across nodes,
ZeRO-1 over data parallel. ZeRO-2 and ZeRO-3 compose with pp too: each chunk accumulates its full
gradients over the micro-batches (``no_sync``) and reduce-scatters them once, after the last one, so
gradient traffic is ZeRO-1's; ZeRO-3 still all-gathers each unit's weights in every micro-batch's forward
and backward (2m gathers of the stage per step), which is why DeepSpeed's pipeline engine refuses it.
"""
from __future__ import annotations

import torch.nn as nn


class ChunkOptimizers:
    """A pipeline rank's optimizer when each chunk carries its own ZeRO wrapper: steps them all.

    Args:
        stages: this rank's chunks' ZeRO wrappers, in local order (the same count on every rank, so
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
