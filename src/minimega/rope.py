"""Rotary position embeddings (RoPE, Su et al. 2021, arXiv:2104.09864), as Llama applies them.

No position table: each head's query and key features are taken in pairs (2i, 2i+1), and pair i of the token at
position m is turned by the angle m · θ_i, θ_i = base^(-2i/hs). A rotation keeps lengths, and the dot product of
a query at m with a key at n depends on the angle difference (m - n) · θ_i only: attention sees relative
positions. Llama 3 uses base 500000 (Llama Team 2024, arXiv:2407.21783, §3.2); the original paper 10000.

The pairs are adjacent features, as in Meta's reference code (``torch.view_as_complex`` of (…, hs/2, 2)); the
Hugging Face port pairs feature i with i + hs/2 instead and permutes the q and k weights to match.

Shapes: positions (T,) → cos, sin (T, hs/2); q or k (B, nh, T, hs) → the same shape, rotated.
"""
from __future__ import annotations

import torch


def rope_angles(positions: torch.Tensor, head_size: int, base: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of m · θ_i for each position m and pair i, fp32, each (T, hs/2)."""
    pairs = torch.arange(0, head_size, 2, device=positions.device, dtype=torch.float32)   # 2i, (hs/2,)
    inv_freq = 1.0 / (base ** (pairs / head_size))                                          # θ_i
    angles = positions.to(torch.float32)[:, None] * inv_freq[None, :]                       # (T, hs/2)
    return angles.cos(), angles.sin()


# --8<-- [start:apply_rope]
def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Turn each pair (x_2i, x_2i+1) of every head by its angle: (a, b) → (a·cos − b·sin, a·sin + b·cos).

    Computed in fp32 and returned in ``x``'s dtype. x: (B, nh, T, hs); cos, sin: (T, hs/2).
    """
    a, b = x.to(torch.float32).unflatten(-1, (-1, 2)).unbind(-1)                # 2 × (B, nh, T, hs/2)
    out = torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1)          # (B, nh, T, hs/2, 2)
    return out.flatten(-2).to(x.dtype)                                          # (B, nh, T, hs)
# --8<-- [end:apply_rope]
