"""The MLP's ops in the step-time model's roofline when it is minimega's mixture of experts (`moe.MoELayer`).

``perf.layer_ops`` calls `moe_ops` for a block with ``experts > 0``: (name, FLOPs, bytes) of each op, one micro-batch,
one GPU, as ``layer_ops`` lists the dense block's.
"""
from __future__ import annotations

from ..sizes import moe_capacity


def moe_ops(cfg) -> list[tuple[str, float, float]]:
    """The MLP's ops when it is minimega's MoE layer (`moe.MoELayer`), whole on every tp rank.

    The router's GEMM and softmax over N tokens; GShard's dense dispatch and combine, each an N × E·C by h
    contraction per sequence; the experts' GEMMs and GELU over the R = b·E·C slots (rows this rank's
    experts receive after the all-to-all: E/ep experts × ep·b·C rows), their weights read once per expert.
    Capacity, not top-k alone, sets the expert FLOPs: a slot is computed whether a token filled it or not.
    ``moe_dispatch='dropless'`` (`moe.dropless`): no slots and no one-hot contraction; the N·k (token, choice) rows
    are gathered by their sorted index, the experts run on R = N·k rows (what a rank's experts receive when the
    load is even) and the outputs are scattered back and summed with the gates. N counts this rank's s/cp tokens.
    Each expert is h → F → h (F = ``expert_ffn``, 4h when 0); ``shared_experts`` S add one dense h → S·F → h
    MLP every token passes, and its output is added to the experts'.
    """
    s, b, h, E, k = cfg.seq_len // cfg.cp, cfg.micro_batch, cfg.hidden, cfg.experts, cfg.top_k
    e = 4 if cfg.precision == "fp32" else 2
    f = cfg.expert_ffn or 4 * h
    N, local = s * b, E / cfg.ep
    if cfg.moe_dispatch == "dropless":            # R = N·k rows, the average a rank's experts receive
        R = N * k
        dispatch = ("gather", 0.0, 2 * e * R * h + 8 * R)                 # rows by sorted index: read, write
        combine = ("scatter + combine", 2 * R * h, e * (R * h + R + N * h) + 8 * R)   # back, times the gates, summed
    else:                                          # R = b·E·C capacity slots, filled or not
        EC = E * moe_capacity(s, E, k, cfg.capacity_factor)
        R = b * EC
        mix = (2 * N * EC * h, e * (N * EC + N * h + b * EC * h))       # (b, s, E·C) × (b, s, h) per sequence
        dispatch, combine = ("dispatch", *mix), ("combine", *mix)
    ops = [("router", 2 * N * h * E, e * (N * h + h * E + N * E)),
           ("router softmax", 5 * N * E, 2 * e * N * E),
           dispatch,
           ("expert fc1", 2 * R * h * f, e * (R * h + local * f * h + R * f)),
           ("expert gelu", 8 * R * f, 2 * e * R * f),
           ("expert fc2", 2 * R * f * h, e * (R * f + local * f * h + R * h)),
           combine]
    if cfg.shared_experts:
        g = cfg.shared_experts * f
        ops += [("shared fc1", 2 * N * h * g, e * (N * h + g * h + N * g)),
                ("shared gelu", 8 * N * g, 2 * e * N * g),
                ("shared fc2", 2 * N * g * h, e * (N * g + g * h + N * h)),
                ("shared add", N * h, 3 * e * N * h)]
    return ops
