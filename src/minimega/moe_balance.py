"""Auxiliary-loss-free load balancing (DeepSeek-V3, arXiv:2412.19437): a routing bias moved by the load.

With ``MoEConfig.bias_update_rate`` = γ > 0 every MoE layer keeps a per-expert bias b (a buffer: it is in
the state dict and the checkpoint). The router picks each token's top-k of ``probs + b``; the gates stay the
unbiased probabilities, so b steers the choice without entering the loss or its gradient. After every
optimizer step each layer's load c_e (the assignments its experts got over the whole global batch, all
micro-batches) moves the bias:

    b_e ← b_e + γ · sign(mean_e(c) − c_e)        overloaded experts become less attractive, idle ones more

The counts of the dp ranks are summed first (one all-reduce of layers × E integers), so every rank applies
the same update as a single process on the global batch; tp ranks route the same tokens and sum over their
own dp group, which holds one tp rank. (DeepSeek-V3 biases sigmoid affinities; minimega's router is the
softmax of `minimega.moe`, so the bias is added to its probabilities.)
"""
from __future__ import annotations

import torch

from . import comm
from .comm import Group


# --8<-- [start:update_routing_bias]
@torch.no_grad()
def update_routing_bias(layers: list, group: Group | None = None) -> None:
    """After a step: b += γ · sign(mean load − load) in every layer with γ > 0, the loads summed over ``group``
    (the data-parallel ranks); the step's load counters restart at zero."""
    layers = [m for m in layers if m.moe.bias_update_rate]
    if not layers:
        return
    load = torch.stack([m.step_load for m in layers])                 # (L, E) this rank's assignments
    if group is not None:
        comm.all_reduce(load, group, tag="moe_load")
    load = load.double()
    for m, c in zip(layers, load):
        m.expert_bias += (m.moe.bias_update_rate * torch.sign(c.mean() - c)).to(m.expert_bias.dtype)
        m.step_load.zero_()
# --8<-- [end:update_routing_bias]
