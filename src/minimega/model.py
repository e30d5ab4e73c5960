"""The single-device GPT: the reference every parallel layout is measured against.

nanoGPT-shaped: token and position embeddings, ``n_layer`` pre-LayerNorm blocks (causal self-attention
through ``scaled_dot_product_attention``, then a GELU MLP), a final LayerNorm and a linear head.

Llama's blocks are options of the same model (`GPTConfig`): grouped-query attention (``n_kv_head`` key/value
heads, the qkv rows [q; k; v] then D + 2·n_kv_head·hs), a SwiGLU MLP (``mlp='swiglu'``: one more matrix,
``gate``) and rotary positions (``position='rope'``: no ``wpe`` table; q and k rotated, `minimega.rope`).
The defaults build GPT-2's blocks with the same parameters, names and initialisation as before they existed.

The head is **not** tied to the token embedding. Tying would make the first and last pipeline stages
share one weight (and need an extra all-reduce of its gradient); untied, every parameter lives in
exactly one place under every layout, which keeps the parallel code and its tests simple.

The forward is split into ``embed`` → ``blocks`` → ``head`` → ``loss`` so the parallel wrappers
(pipeline stages, ZeRO-3's per-block gathering) reuse the pieces instead of re-implementing them.
"""
from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from .config import GPTConfig
from .rope import apply_rope, rope_angles


# --8<-- [start:attention]
class CausalSelfAttention(nn.Module):
    """Causal self-attention; ``qkv`` is one ((nh + 2·nkv)·hs, D) projection with rows [q; k; v].

    ``n_head`` and ``n_kv_head`` are the heads *this module holds*: all of them on one device, n_head/tp and
    n_kv_head/tp when tensor parallelism splits the heads across ranks. Query head i reads key/value head
    i // (n_head/n_kv_head) (grouped-query attention; n_kv_head = n_head is plain multi-head attention).
    With ``rope_theta`` set, q and k are rotated by their positions (`positions`) before the core.
    """

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.n_head, self.n_kv_head = config.n_head, config.kv_heads
        self.head_size, self.dropout = config.head_size, config.dropout
        self.rope_theta = config.rope_theta if config.position == "rope" else None
        kv = 2 * self.n_kv_head * self.head_size
        self.qkv = nn.Linear(config.n_embd, config.n_embd + kv, bias=config.bias)
        self.proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        qkv = self.qkv(x)                                # T read after qkv: tensor parallelism may gather it
        B, T, _ = qkv.shape
        hs, widths = self.head_size, (self.n_head * self.head_size,) + (self.n_kv_head * self.head_size,) * 2
        q, k, v = qkv.split(widths, dim=-1)                                    # (B, T, nh*hs), 2 × (B, T, nkv*hs)
        q = q.view(B, T, self.n_head, hs).transpose(1, 2)                      # (B, nh, T, hs)
        k, v = (t.view(B, T, self.n_kv_head, hs).transpose(1, 2) for t in (k, v))    # (B, nkv, T, hs)
        if self.rope_theta is not None:
            cos, sin = rope_angles(self.positions(T, device=q.device), hs, self.rope_theta)   # (T, hs/2)
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        y = self.core(q, k, v)                                                 # (B, nh, T, hs)
        y = y.transpose(1, 2).reshape(B, T, self.n_head * hs)                  # (B, T, nh*hs)
        return self.resid_dropout(self.proj(y))                                # (B, T, D)

    def positions(self, T: int, device=None) -> torch.Tensor:
        """The (T,) places of the tokens this module sees, 0 … T-1 (context parallelism: their global places)."""
        return torch.arange(T, device=device)

    def core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """softmax(QK^T / sqrt(hs)) V under a causal mask: what selective recomputation redoes."""
        return F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0,
                                              is_causal=True, enable_gqa=self.n_kv_head != self.n_head)
# --8<-- [end:attention]


class MLP(nn.Module):
    """D → F → D with GELU; F = mlp_ratio · D."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.fc = nn.Linear(config.n_embd, config.mlp_hidden, bias=config.bias)
        self.proj = nn.Linear(config.mlp_hidden, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.proj(F.gelu(self.fc(x))))                     # (B, T, F) inside


class SwiGLU(nn.Module):
    """D → F → D: proj(silu(gate(x)) ∘ fc(x)) (Shazeer 2020, arXiv:2002.05202); Llama's w1 = gate, w3 = fc, w2 = proj."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.gate = nn.Linear(config.n_embd, config.mlp_hidden, bias=config.bias)
        self.fc = nn.Linear(config.n_embd, config.mlp_hidden, bias=config.bias)
        self.proj = nn.Linear(config.mlp_hidden, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.proj(F.silu(self.gate(x)) * self.fc(x)))     # (B, T, F) inside


# --8<-- [start:block]
# --8<-- [start:block_c1]
class Block(nn.Module):
# --8<-- [end:block_c1]
    """Pre-LN transformer block: x + attn(ln_1(x)), then x + mlp(ln_2(x))."""

    # --8<-- [start:block_c2]
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = SwiGLU(config) if config.mlp == "swiglu" else MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:                        # x: (B, T, D)
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))
    # --8<-- [end:block_c2]
# --8<-- [end:block]


class GPT(nn.Module):
    """The reference model. ``torch.manual_seed(s)`` before construction fixes the initialisation.

    Parameters (bias=False): V·D (wte) + T·D (wpe) + L·(12D² + 2D) (blocks) + D (ln_f) + D·V (head).
    ``tiny()``: 234,048; ``small()``: 10,916,736; ``gpt2()``: 163,007,232. With Llama's options a block has
    2D² + 2D·k (k = n_kv_head·hs) + 3D·F (SwiGLU) + 2D, and RoPE no T·D table (`analysis.shapes.model_params`).
    """

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        # RoPE has no table: wpe is None, and the checkpoints, ZeRO units and pipeline chunks simply lack it.
        self.wpe = nn.Embedding(config.block_size, config.n_embd) if config.position == "learned" else None
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.apply(self._init_weights)
        # GPT-2's scaled init of the projections that write into the residual stream.
        for name, p in self.named_parameters():
            if name.endswith("attn.proj.weight") or name.endswith("mlp.proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def embed(self, idx: torch.Tensor) -> torch.Tensor:
        """(B, T) token ids → (B, T, D) residual stream. The parallel forms change only where the positions
        come from (context parallelism) and which rows of them a rank keeps (sequence parallelism).
        With RoPE the positions enter in the attention instead (`CausalSelfAttention.positions`)."""
        x, pos = self.wte(idx), self.positions(idx)                             # (B, T, D), (T,)
        return self.drop(x if self.wpe is None else x + self.position_embedding(pos))   # (B, T, D)

    def positions(self, idx: torch.Tensor) -> torch.Tensor:
        """Each token's place in its sequence, (T,): 0 … T-1 here."""
        T = idx.shape[1]
        if T > self.config.block_size:
            raise ValueError(f"sequence length {T} exceeds block_size={self.config.block_size}")
        return torch.arange(T, device=idx.device)

    def position_embedding(self, pos: torch.Tensor) -> torch.Tensor:
        return self.wpe(pos)                                                    # (T, D)

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, D) → (B, T, V) logits."""
        return self.lm_head(self.ln_f(x))

    @staticmethod
    def loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy over every token of the batch."""
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        """nanoGPT's convention: returns ``(logits, loss)``; ``loss`` is None without targets."""
        x = self.embed(idx)
        for block in self.blocks:
            x = block(x)
        logits = self.head(x)                                                  # (B, T, V)
        return self.finish(logits, targets)

    def units(self) -> list[tuple[str, Callable, list[nn.Module]]]:
        """The forward as a chain of units, in order: ``(name, fn, modules)``, where ``fn`` maps the previous unit's
        output to the next one's input and ``modules`` hold the unit's parameters (None: absent, e.g. RoPE's wpe).
        ``forward(idx, targets)`` is ``finish(fn_n(...fn_1(idx)), targets)``. ZeRO-3 gathers and frees the
        parameters one unit at a time along this chain (`zero.flat.model_units`), naming no part itself."""
        blocks = [(f"blocks.{i}", b, [b]) for i, b in enumerate(self.blocks)]
        return [("embed", self.embed, [self.wte, self.wpe]), *blocks, ("head", self.head, [self.ln_f, self.lm_head])]

    def finish(self, logits: torch.Tensor, targets: torch.Tensor | None = None):
        """What ``forward`` returns from the last unit's output: ``(logits, loss)``."""
        return logits, (self.loss(logits, targets) if targets is not None else None)
