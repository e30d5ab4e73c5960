"""Integer rules the core and the estimators share, with no torch: the estimators (`minimega.analysis`) import
them from here, so a prediction and the code cannot disagree, and `minimega plan`, `estimate` and the exam
service start without loading torch.

    padded_numel        a flat buffer's length: numel rounded up to a multiple of dp (zero/flat.py)
    moe_capacity        an expert's slots per sequence (parallel/moe/layer.py)
    moe_alltoall_bytes  the bytes a rank sends in a step's all-to-alls
"""
from __future__ import annotations

import math


def padded_numel(numel: int, dp: int) -> int:
    """`numel` rounded up to a multiple of dp: the length of a flat buffer that splits evenly."""
    return -(-int(numel) // dp) * dp


# --8<-- [start:moe_capacity]
def moe_capacity(seq_len: int, n_experts: int, top_k: int, capacity_factor: float) -> int:
    """Slots per expert in one sequence: min(T, ceil(capacity_factor · k · T / E)) (GShard, Switch)."""
    return max(1, min(seq_len, math.ceil(capacity_factor * top_k * seq_len / n_experts)))


def moe_alltoall_bytes(n_layer: int, rows: int, seq_len: int, d_model: int, ep: int, n_experts: int,
                       top_k: int, capacity_factor: float, bytes_per_elem: int = 4) -> float:
    """Bytes one rank sends in a training step's all-to-alls: 4 per MoE layer (dispatch and combine, forward
    and backward), each (ep-1)/ep of the (E, rows · C, D) slot buffer; ``rows``: this rank's sequences."""
    slots = n_experts * rows * moe_capacity(seq_len, n_experts, top_k, capacity_factor) * d_model
    return 4 * n_layer * (ep - 1) / ep * slots * bytes_per_elem
# --8<-- [end:moe_capacity]
