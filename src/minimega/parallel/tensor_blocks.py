"""Tensor parallelism inside a block: the attention's heads and SwiGLU's width split over the tp group
(Megatron-LM, arXiv:1909.08053 §3). The layers themselves (column- and row-parallel linears) are
`tensor`'s; `ParallelGPT` builds them and hands them in here.

Attention.
Rank r of tp holds query heads [r·nh/tp, (r+1)·nh/tp) and, with grouped-query attention, key/value heads
[r·nkv/tp, (r+1)·nkv/tp): query head i reads kv head i // (nh/nkv), so those are exactly the kv heads its query
heads read, and the core runs on the rank's heads alone. qkv is column-parallel by those rows of each of its
[q; k; v] blocks, proj row-parallel (`tensor.ColumnParallelLinear`, `RowParallelLinear`, built by
`ParallelGPT` and handed in here). tp must divide n_kv_head (`tensor.check_divisible`): a kv head is
never split or copied across ranks here (Megatron replicates kv heads when tp > nkv; minimega refuses that).

Shapes on rank r: qkv (B, T, (nh + 2·nkv)·hs/tp) → q (B, nh/tp, T, hs), k, v (B, nkv/tp, T, hs) → y (B, T, D/tp)
→ proj → (B, T, D) (or (B, T/tp, D) under sequence parallelism). RoPE rotates q and k on every rank alike:
a token's angle depends on its position, not on its head.

SwiGLU. gate and fc (up) are column-parallel (W[F_tp, D] each), proj (down) row-parallel: rank r computes
silu(x G_r) ∘ (x U_r) on its F/tp columns, elementwise, so nothing is exchanged inside. The two column-parallel
linears read the same input through one `f` region (Megatron fuses them into one fc1 of 2F rows): one all-reduce
of the input gradient backward (one all-gather and one reduce-scatter under sequence parallelism), as GELU's MLP.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..model import CausalSelfAttention, SwiGLU
from .rng import RNGStream


class ParallelSelfAttention(CausalSelfAttention):
    """`model.CausalSelfAttention` on n_head/tp query and n_kv_head/tp key/value heads; its forward is the
    model's (T is read after qkv, which gathers it under sequence parallelism).

    Args:
        attn: the whole module (its head counts, dropout and RoPE base are read; its linears are not used).
        qkv, proj: ``attn.qkv`` column-parallel by the rows of [q; k; v], ``attn.proj`` row-parallel.
        tp: the tp group's size; rng: the tp rank's own dropout stream.
    """

    def __init__(self, attn: CausalSelfAttention, qkv: nn.Module, proj: nn.Module, tp: int, rng: RNGStream):
        nn.Module.__init__(self)
        self.n_head, self.n_kv_head = attn.n_head // tp, attn.n_kv_head // tp
        self.head_size, self.dropout, self.rope_theta = attn.head_size, attn.dropout, attn.rope_theta
        self.rng, self.qkv, self.proj = rng, qkv, proj
        self.resid_dropout = attn.resid_dropout

    def core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """The attention core on this rank's heads; its dropout draws from the tp rank's own stream."""
        if not (self.training and self.dropout > 0):
            return super().core(q, k, v)
        with self.rng:
            return super().core(q, k, v)


class ParallelSwiGLU(SwiGLU):
    """`model.SwiGLU` on F/tp of its width. Shapes: x (B, T, D) (or (B, T/tp, D) under sequence parallelism)
    → gate, fc (B, T, F/tp) → proj → (B, T, D) (or (B, T/tp, D)).

    Args:
        mlp: the whole module (its dropout is kept); gate, fc: column-parallel (`enter` is their `f` region,
        `local` the matmul alone); proj: row-parallel.
    """

    def __init__(self, mlp: SwiGLU, gate: nn.Module, fc: nn.Module, proj: nn.Module):
        nn.Module.__init__(self)
        self.gate, self.fc, self.proj, self.dropout = gate, fc, proj, mlp.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.fc.enter(x)                                                    # one `f` for gate and fc
        return self.dropout(self.proj(F.silu(self.gate.local(x)) * self.fc.local(x)))   # (B, T, F/tp) inside
