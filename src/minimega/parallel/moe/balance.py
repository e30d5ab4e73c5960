"""Load balancing: the Switch aux loss's statistics pooled over the cp ring, and DeepSeek-V3's routing bias.

Pooled statistics (context parallelism). The load-balancing loss of `minimega.parallel.moe.layer` reads two means over each
sequence, f_e (first choices) and P_e (router probabilities). Under cp a rank holds T/cp tokens of every
sequence, so `sequence_means` sums its tokens' terms, all-reduces the sums over the cp group and divides by
the whole T: every cp rank then holds the single-process f_e and P_e. The all-reduce's backward is an
all-reduce of the gradients too (each rank's aux reads every rank's probabilities). Means over all tokens
(the router z-loss) need nothing: each rank's loss is a mean over the same number of tokens, and the
engine averages over dp·cp.

Auxiliary-loss-free load balancing (DeepSeek-V3, arXiv:2412.19437): a routing bias moved by the load.

With ``MoEConfig.bias_update_rate`` = γ > 0 every MoE layer keeps a per-expert bias b (a buffer: it is in
the state dict and the checkpoint). The router picks each token's top-k of ``probs + b``; the gates stay the
unbiased probabilities, so b steers the choice without entering the loss or its gradient. After every
optimizer step each layer's load c_e (the assignments its experts got over the whole global batch, all
micro-batches) moves the bias:

    b_e ← b_e + γ · sign(mean_e(c) − c_e)        overloaded experts become less attractive, idle ones more

The counts of the dp ranks are summed first (one all-reduce of layers × E integers; under cp over dp·cp,
each rank counting its own tokens), so every rank applies the same update as a single process on the global
batch; tp ranks route the same tokens and sum over their own group, which holds one tp rank. (DeepSeek-V3
biases sigmoid affinities; minimega's router is the softmax of `minimega.parallel.moe.layer`, so the bias is added to its
probabilities.)
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ... import comm
from ...comm import Group


class _SumOverGroup(torch.autograd.Function):
    """Forward: all-reduce (sum) over ``group``. Backward: all-reduce (sum) of the gradients: every rank's
    output reads every rank's input."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return comm.all_reduce(x.clone(), group, tag="moe_aux")

    @staticmethod
    def backward(ctx, grad):
        return comm.all_reduce(grad.clone(), ctx.group, tag="moe_aux_grad"), None


# --8<-- [start:sequence_means]
# --8<-- [start:sequence_means_c1]
def sequence_means(first_choice: torch.Tensor, probs: torch.Tensor, cp_group: Group | None = None):
# --8<-- [end:sequence_means_c1]
    """f_e and P_e of every sequence, (B, E) each: the share of first choices ``first_choice`` (B, T_local) that
    went to e and the mean of ``probs`` (B, T_local, E) over T; under cp the sums of the cp ranks' T/cp tokens,
    over the whole T."""
    # --8<-- [start:sequence_means_c2]
    first = F.one_hot(first_choice, probs.shape[-1]).to(probs.dtype)                # (B, T_local, E)
    if cp_group is None or cp_group.size == 1:
        return first.mean(1), probs.mean(1)
    sums = _SumOverGroup.apply(torch.stack([first.sum(1), probs.sum(1)]), cp_group)    # (2, B, E), whole T
    T = first.shape[1] * cp_group.size
    return sums[0] / T, sums[1] / T
    # --8<-- [end:sequence_means_c2]
# --8<-- [end:sequence_means]


# --8<-- [start:update_routing_bias]
# --8<-- [start:update_routing_bias_c1]
@torch.no_grad()
def update_routing_bias(layers: list, group: Group | None = None) -> None:
# --8<-- [end:update_routing_bias_c1]
    """After a step: b += γ · sign(mean load − load) in every layer with γ > 0, the loads summed over ``group``
    (the data-parallel ranks, times cp); the step's load counters restart at zero."""
    # --8<-- [start:update_routing_bias_c2]
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
    # --8<-- [end:update_routing_bias_c2]
# --8<-- [end:update_routing_bias]
