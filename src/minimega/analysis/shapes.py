"""Block shapes after GPT-2: grouped-query attention, a SwiGLU MLP of any width, untied embeddings, no biases.

A `MemoryConfig` (or anything with its fields) describes one of two blocks. GPT's (the defaults): a fused
QKV of 3h outputs, a 4h GELU MLP (two matrices), biases everywhere, LayerNorms with a weight and a bias, the
head tied to the token embedding. Llama's: ``kv_heads`` key/value heads shared by groups of query heads
(GQA, Ainslie et al. 2023, arXiv:2305.13245), so K and V have k = kv_heads · h/a outputs each; a SwiGLU MLP
of width f (Shazeer 2020, arXiv:2002.05202: down(silu(gate(x)) · up(x)), three h × f matrices); RMSNorm (a
weight only); no biases; an untied output head. Every count below is an integer, so the GPT block's numbers
come out exactly as the closed forms the course derives (12h² + 7h split over tp, 6h whole).
"""
from __future__ import annotations

from .flops import megatron_hardware_flops, megatron_model_flops, moe_extra_flops

MLPS = ("gelu", "swiglu")


# --8<-- [start:block_shape]
def kv_width(cfg) -> int:
    """k: outputs of the K projection (and of V), kv_heads · h/a; h without GQA (kv_heads 0)."""
    return cfg.kv_heads * (cfg.hidden // cfg.heads) if cfg.kv_heads else cfg.hidden


def ffn_width(cfg) -> int:
    """f: the MLP's inner width; 4h when ``ffn`` is 0 (GPT)."""
    return cfg.ffn or 4 * cfg.hidden


def block_matmul_params(cfg) -> int:
    """Weights of one block's matrices: Q and the output projection h² each, K and V h·k each, and the MLP's
    two (GELU) or three (SwiGLU) h·f. GPT: 4h² + 8h² = 12h². These are the parameters every token multiplies."""
    h, k, f = cfg.hidden, kv_width(cfg), ffn_width(cfg)
    return 2 * h * h + 2 * h * k + (3 if cfg.mlp == "swiglu" else 2) * h * f


def block_split_params(cfg) -> int:
    """Parameters of one block that tensor parallelism splits: every matrix and the column-parallel biases
    (Q, K, V: h + 2k; the MLP's up-projections: f each). GPT: 12h² + 7h."""
    h, k, f = cfg.hidden, kv_width(cfg), ffn_width(cfg)
    biases = (h + 2 * k + (2 if cfg.mlp == "swiglu" else 1) * f) if cfg.bias else 0
    return block_matmul_params(cfg) + biases


def block_whole_params(cfg) -> int:
    """Parameters of one block every tp rank holds whole: the two norms (LayerNorm 2h each, RMSNorm or a
    bias-free LayerNorm h) and the row-parallel biases (projection and MLP down, h each). GPT: 6h."""
    return 6 * cfg.hidden if cfg.bias else 2 * cfg.hidden
# --8<-- [end:block_shape]


def model_params(cfg) -> int:
    """All parameters of the model, dense blocks only: L blocks, the token embedding, the head when untied,
    a learned position table if any, and the final norm. Llama 3 8B: 8,030,261,248."""
    if getattr(cfg, "experts", 0):
        raise ValueError("model_params counts dense blocks; with experts use moe_params")
    h = cfg.hidden
    block = block_split_params(cfg) + block_whole_params(cfg)
    embed = cfg.vocab * h * (1 if cfg.tied else 2) + (cfg.seq_len * h if cfg.position_embedding else 0)
    return cfg.layers * block + embed + (2 * h if cfg.bias else h)


def is_gpt_shape(cfg) -> bool:
    """True for GPT's block (MHA, 4h GELU MLP): the FLOP formulas then keep Korthikanti's closed forms."""
    return kv_width(cfg) == cfg.hidden and ffn_width(cfg) == 4 * cfg.hidden and cfg.mlp == "gelu"


def shape_flops(cfg, batch: int) -> tuple[float, float, float]:
    """(model, selective, full) FLOPs of one iteration of `batch` sequences for any block shape.

    Each of the L·W block matmul weights (`block_matmul_params`) and the V·h head costs 2 FLOPs per token
    forward and 4 backward, 6 in all (8 with the forward recomputed); attention's QKᵀ and AV cost
    4·s·h per token and layer forward (query heads × head width = h, whatever kv_heads is), 12·s·h with
    the backward, 16 with a recomputed forward, 24 with the core recomputed twice as in Megatron's
    selective count. For GPT's shape these are Korthikanti's App. A 72BLsh²(1 + s/6h + V/12hL), its
    selective variant and Narayanan's Eq. 3 (`megatron_model_flops`, `megatron_hardware_flops`).
    """
    s, h, L = cfg.seq_len, cfg.hidden, cfg.layers
    tokens, weights, head = batch * s, L * block_matmul_params(cfg), cfg.vocab * h
    attn = tokens * L * s * h
    return (6 * tokens * (weights + head) + 12 * attn, 6 * tokens * (weights + head) + 24 * attn,
            8 * tokens * weights + 6 * tokens * head + 16 * attn)


def iteration_flops(cfg) -> tuple[float, float, float]:
    """(model, logged, hardware) FLOPs of one step of a `PerfConfig`: model FLOPs (what MFU divides), Narayanan's
    Eq. 3 with full recomputation (what Megatron-DeepSpeed's 2022 logs print) and what this run's recomputation
    really executes. GPT's shape: Korthikanti's closed forms plus the experts' (`moe_extra_flops`); any other
    shape: `shape_flops`."""
    B, s, L, h, V = cfg.global_batch, cfg.seq_len, cfg.layers, cfg.hidden, cfg.vocab
    if not is_gpt_shape(cfg):
        model, selective, logged = shape_flops(cfg, B)
        return model, logged, {"none": model, "full": logged, "selective": selective}[cfg.recompute]
    moe = moe_extra_flops(cfg)
    model = megatron_model_flops(B, s, L, h, V) + moe
    logged = megatron_hardware_flops(B, s, L, h, V) + moe * 4 / 3
    hw = {"none": model, "full": logged,
          "selective": 72 * B * L * s * h ** 2 * (1 + s / (3 * h) + V / (12 * h * L)) + moe}[cfg.recompute]
    return model, logged, hw
