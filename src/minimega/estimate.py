"""Analytic estimators: bytes per rank, communication per step, pipeline bubbles, FLOPs.

Pure functions of a few integers; no torch. Each one implements one published formula and says
which, so a measurement (``measure.py``), a figure (``plots.py``), the course's memory calculator
(``course/assets/javascripts/calculator.js``, tested against `memory_per_gpu`) and a quiz answer all
agree on one number.

Notation (the papers' letters):
    Ψ  parameters (n_params)            N_d  data-parallel degree (dp)
    K  optimizer-state bytes/param      s, b, h, a, L, V  sequence, micro-batch, hidden, heads, layers, vocab
    t  tensor-parallel degree (tp)      p, m, v  pipeline stages, micro-batches, virtual stages per rank

Sources:
    ZeRO         Rajbhandari et al. 2020, arXiv:1910.02054 (Fig. 1, Table 1, §7)
    Megatron     Shoeybi et al. 2019, arXiv:1909.08053; Narayanan et al. 2021, arXiv:2104.04473
    Activations  Korthikanti et al. 2022, arXiv:2205.05198 (Table 2, App. A)
    GPipe        Huang et al. 2019, arXiv:1811.06965 §2.3
    PaLM         Chowdhery et al. 2022, arXiv:2204.02311 App. B (FLOPs per token, MFU)

Sizes are bytes; the course prints GB = 1e9 bytes, as the ZeRO paper does.
"""
from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass

GB = 1e9

PRECISIONS = ("mixed", "bf16", "fp16", "fp32")
STAGES = (0, 1, 2, 3)
RECOMPUTE = ("none", "selective", "full")
SCHEDULES = ("gpipe", "1f1b", "interleaved")
OFFLOAD = ("none", "optimizer", "optimizer+params")
PP_PARTITION = ("blocks", "blocks+embedding")
CP_ATTENTION = ("ring", "ulysses")


# ----------------------------------------------------------------------------------------------
# Model states (ZeRO paper)

# --8<-- [start:state_bytes]
def state_bytes_per_param(precision: str = "mixed") -> tuple[int, int, int]:
    """Bytes per parameter for (parameters, gradients, optimizer states K) under Adam.

    "mixed" (also "bf16", "fp16"): 16-bit params (2) and grads (2); K = 12 for the fp32 master
    copy (4), momentum (4) and variance (4) - the ZeRO paper's accounting, §3.1.
    "fp32": fp32 params (4) and grads (4); K = 8 for momentum and variance, no master copy.
    """
    if precision in ("mixed", "bf16", "fp16"):
        return 2, 2, 12
    if precision == "fp32":
        return 4, 4, 8
    raise ValueError(f"precision {precision!r}: expected one of {PRECISIONS}")
# --8<-- [end:state_bytes]


def _check_stage_dp(stage: int, dp: int) -> None:
    if stage not in STAGES:
        raise ValueError(f"stage {stage!r}: expected one of {STAGES}")
    if not (isinstance(dp, int) and dp >= 1):
        raise ValueError(f"dp {dp!r}: expected an integer >= 1")


# --8<-- [start:model_state_bytes]
# --8<-- [start:state_breakdown]
def model_state_breakdown(n_params: float, dp: int, stage: int, precision: str = "mixed", *,
                          grad_bytes: int | None = None) -> dict:
    """Per-rank bytes of parameters, gradients and optimizer states (ZeRO paper, Fig. 1).

    Stage 0 (DDP) replicates all three. Each ZeRO stage shards one more of them over the dp ranks:
    stage 1 the optimizer states (P_os), stage 2 also the gradients (P_os+g), stage 3 also the
    parameters (P_os+g+p). `grad_bytes` overrides the gradient width: 4 for a 16-bit model whose
    gradients accumulate in an fp32 buffer (DeepSpeed's BF16_Optimizer, Megatron's main grads).
    """
    _check_stage_dp(stage, dp)
    p, g, k = state_bytes_per_param(precision)
    g = g if grad_bytes is None else grad_bytes
    return {
        "params": p * n_params / (dp if stage >= 3 else 1),
        "grads": g * n_params / (dp if stage >= 2 else 1),
        "optimizer": k * n_params / (dp if stage >= 1 else 1),
    }
# --8<-- [end:state_breakdown]


def model_state_bytes(n_params: float, dp: int, stage: int, precision: str = "mixed") -> float:
    """Model-state bytes per rank, the ZeRO paper's Figure 1 / Table 1 formulas.

        stage 0: (2 + 2 + K)·Ψ           stage 2: 2Ψ + (2 + K)·Ψ/N_d
        stage 1: 2Ψ + 2Ψ + K·Ψ/N_d       stage 3: (2 + 2 + K)·Ψ/N_d

    with K = 12 in mixed precision. Ψ = 7.5e9, N_d = 64 gives 120, 31.4, 16.6 and 1.9 GB.
    """
    return sum(model_state_breakdown(n_params, dp, stage, precision).values())
# --8<-- [end:model_state_bytes]


# --8<-- [start:offload_placement]
def model_state_placement(n_params: float, dp: int, stage: int, precision: str = "mixed",
                          offload: str = "none", *, grad_bytes: int | None = None) -> dict:
    """`model_state_breakdown` split by location: {'params', 'grads', 'optimizer'} on the GPU, 'cpu' in host memory.

    Offload ('optimizer', ZeRO-Offload, arXiv:2101.06840) moves to host memory this rank's shard of the
    optimizer states with its fp32 master (K·Ψ/N_d; with fp32 parameters the host still needs its own fp32
    master, 4Ψ/N_d, as the GPU keeps its parameters) and of the gradients: each unit's reduced shard goes
    down as soon as it is reduced and is summed there in fp32 (4Ψ/N_d, DeepSpeed's pinned fp32 gradient
    partition). So the host holds (4 + 4 + 8)Ψ/N_d = 16Ψ/N_d whatever the precision: DeepSpeed's 16Ψ
    (before its 1.5 buffer factor) for optimizer offload, 18Ψ with the 16-bit parameters too.
    On the GPU the gradients vanish from stage 2 on (no shard waits there for the step); at stages 0-1,
    which do not shard gradients, the whole buffer the backward accumulates into stays (g·Ψ).
    'optimizer+params' (stage 3, ZeRO-Infinity) moves the 16-bit parameter shards to the host as well.
    """
    if offload not in OFFLOAD:
        raise ValueError(f"offload {offload!r}: expected one of {OFFLOAD}")
    out = model_state_breakdown(n_params, dp, stage, precision, grad_bytes=grad_bytes)
    out["cpu"] = 0.0
    if offload == "none":
        return out
    shard = n_params / (dp if stage >= 1 else 1)                  # this rank's part of the optimizer's work
    separate_master = 4 * shard if precision == "fp32" else 0.0   # K = 8 has no master; the host needs one
    out["cpu"] = out["optimizer"] + separate_master + 4 * shard
    out["optimizer"] = 0.0
    if stage >= 2:
        out["grads"] = 0.0
    if offload == "optimizer+params":
        out["cpu"] += out["params"]
        out["params"] = 0.0
    return out
# --8<-- [end:offload_placement]


def padded_numel(numel: int, dp: int) -> int:
    """`numel` rounded up to a multiple of dp: the length of a flat buffer that splits evenly."""
    return -(-int(numel) // dp) * dp


def model_state_bytes_padded(numels, dp: int, stage: int, precision: str = "mixed") -> float:
    """`model_state_bytes` for a ZeRO that keeps one flat buffer per parameter group.

    Rule (shared with the flat-buffer implementation in ``zero/flat.py``): each group's total numel is
    rounded up to a multiple of dp, ``padded = ceil(numel / dp) * dp``; a sharded state holds
    ``padded / dp`` elements per rank and a replicated one the whole padded buffer. Stage 0 keeps no
    flat shards and is not padded.

    Args:
        numels: element count of each parameter group (an int for one group).
    """
    _check_stage_dp(stage, dp)
    if isinstance(numels, (int, float)):
        numels = [numels]
    if stage == 0:
        return model_state_bytes(sum(numels), 1, 0, precision)
    return model_state_bytes(sum(padded_numel(n, dp) for n in numels), dp, stage, precision)


# --8<-- [start:peak_memory]
def peak_memory_bytes(units: list[list[int]], dp: int, stage: int, *, precision: str = "fp32",
                      prefetch: bool = True, overlap: bool = True, offload: bool = False) -> dict:
    """Peak bytes per rank by category during a step of minimega's DDP (stage 0) or ZeRO 1-3 with Adam.

    ``units``: the element count of each parameter, grouped by ZeRO unit in forward order (embeddings,
    each block, the head: `zero.stages.model_units`). With N_u a unit's numel, P_u = padded(N_u, dp),
    n = dp and e the bytes of the parameters' dtype (fp32: 4; bf16: 2, with fp32 masters, ZeRO only),
    each category's largest value over forward, backward and the step:

        params            stage 0-2: Σ N_u·e (0: unpadded) | stage 3: the shards, Σ P_u/n·e
        gathered          stage 3: max_k (P_k + P_k+1)·e, two neighbouring units (prefetch) | max_k P_k·e without
        master            bf16: the fp32 master shards, Σ P_u/n·4 (fp32: the shards are their own masters)
        grads             stage 0: Σ N_u·e | 1: the flat buffers Σ P_u·e
                          stage 2-3: the shards Σ P_u/n·e + one unit's full gradients max_u N_u·e (before
                          its reduce-scatter flattens them)
                          bf16, at the step: + the fp32 copies handed to the optimizer, Σ P_u/n·4
                          (stages 2-3: whichever of the two terms is larger)
        optimizer_states  Adam's m and v in fp32: 2·Σ N_u·4 (stage 0) | 2·Σ P_u/n·4
        comm_buffers      what collectives in flight hold beyond the categories above:
                          stage 0: every bucket, Σ N_u·e (all are issued before the first is waited for)
                          stage 1: the reduce-scatter outputs, Σ P_u/n·e (max_u P_u/n·e without overlap)
                          stage 2-3: each unit's flattened gradient and its output shard, Σ P_u(1 + 1/n)·e,
                          held until backward ends (max_u P_u(1 + 1/n)·e without overlap)
        optimizer_step_counters  torch's 0-d fp32 ``step`` per optimizer tensor: one per parameter
                          (stage 0), one per unit (1-3)

    ``offload`` (``offload_optimizer``, stages 1-3) counts the device only: master, optimizer states and
    step counters live on the host (0 here), and so do the reduced gradient shards, so grads are
    stage 1: the flat buffers Σ P_u·e | stage 2-3: one unit's full gradients, max_u N_u·e.

    Activations (tensors saved for backward) are those of `model.py` on the rank's rows in the same dtype:
    measured by `activation_checkpoint.saved_activation_bytes`, estimated by `gpt_activation_bytes_per_layer`.
    """
    _check_stage_dp(stage, dp)
    if precision not in ("fp32", "bf16") or (precision == "bf16" and stage == 0):
        raise ValueError(f"peak_memory_bytes: precision={precision!r} at stage {stage}; modelled: fp32 at "
                         "stages 0-3, bf16 at stages 1-3")
    if offload and stage == 0:
        raise ValueError("peak_memory_bytes: offload at stage 0; minimega offloads ZeRO's shards (stages 1-3)")
    e, n = (4 if precision == "fp32" else 2), dp
    N = [sum(u) for u in units]
    P = [padded_numel(x, n) for x in N]
    shard_elems = sum(P) // n
    full = sum(N if stage == 0 else P) * e
    masters = shard_elems * 4 if e != 4 else 0          # fp32 master shards, and at the step fp32 grad copies
    out = {"params": shard_elems * e if stage == 3 else full, "gathered": 0, "master": masters,
           "optimizer_states": 2 * 4 * (sum(N) if stage == 0 else shard_elems),
           "optimizer_step_counters": 4 * (sum(len(u) for u in units) if stage == 0 else len(units))}
    if stage == 3:
        out["gathered"] = e * (max(a + b for a, b in zip(P, P[1:])) if prefetch and len(P) > 1 else max(P))
    if offload:                                          # on the host: not this device's bytes
        out.update(master=0, optimizer_states=0, optimizer_step_counters=0)
        out["grads"] = full if stage < 2 else max(N) * e
    elif stage < 2:
        out["grads"] = full + masters
    else:
        out["grads"] = shard_elems * e + max(max(N) * e, masters)
    if stage == 0:
        out["comm_buffers"] = full
    elif stage == 1:
        out["comm_buffers"] = shard_elems * e if overlap else max(P) // n * e
    else:
        per_unit = [p * e + p // n * e for p in P]
        out["comm_buffers"] = sum(per_unit) if overlap else max(per_unit)
    return out
# --8<-- [end:peak_memory]


# ----------------------------------------------------------------------------------------------
# Data-parallel communication (ring model)

# --8<-- [start:comm_bytes]
def ring_bytes(op: str, size_bytes: float, n: int) -> float:
    """Bytes each rank sends for one collective over `n` ranks on a ring (nccl-tests' model).

    all-reduce: 2(n-1)/n · S (a reduce-scatter then an all-gather); reduce-scatter and all-gather of
    a full buffer of S bytes: (n-1)/n · S each.
    """
    if n <= 1:
        return 0.0
    factor = {"all_reduce": 2.0, "reduce_scatter": 1.0, "all_gather": 1.0}[op]
    return factor * (n - 1) / n * size_bytes


# --8<-- [start:ring_time]
def ring_time(op: str, size_bytes: float, n: int, alpha: float, bandwidth: float) -> float:
    """Seconds for one ring collective in the α-β model (Thakur, Rabenseifner and Gropp 2005).

    Each of the ring's steps pays a start-up latency α and moves one chunk at `bandwidth` bytes/s:
    all-reduce takes 2(n-1) steps, reduce-scatter and all-gather n-1 each, so
    t = steps·α + `ring_bytes`/bandwidth. The α term grows with n and not with the message, which is
    why many small messages (one per tensor) cost more than a few large buckets.
    """
    if n <= 1:
        return 0.0
    steps = {"all_reduce": 2, "reduce_scatter": 1, "all_gather": 1}[op] * (n - 1)
    return steps * alpha + ring_bytes(op, size_bytes, n) / bandwidth
# --8<-- [end:ring_time]


def comm_collectives(stage: int) -> tuple[str, ...]:
    """The collectives one step issues over a full-model-sized buffer (ZeRO paper §7).

    DDP: all-reduce the gradients. ZeRO-1/2: reduce-scatter the gradients, all-gather the updated
    parameters. ZeRO-3: all-gather the parameters in the forward and again in the backward, then
    reduce-scatter the gradients.
    """
    _check_stage_dp(stage, 1)
    return {0: ("all_reduce",), 1: ("reduce_scatter", "all_gather"),
            2: ("reduce_scatter", "all_gather"), 3: ("all_gather", "all_gather", "reduce_scatter")}[stage]


def comm_bytes_per_step(n_params: float, dp: int, stage: int, bytes_per_elem: int = 2) -> float:
    """Bytes each dp rank sends per optimizer step, ring model.

    Stages 0-2 move 2Ψ elements' worth (2(N_d-1)/N_d · Ψ exactly); stage 3 moves 3Ψ, 1.5× DDP.
    """
    _check_stage_dp(stage, dp)
    size = n_params * bytes_per_elem
    return sum(ring_bytes(op, size, dp) for op in comm_collectives(stage))
# --8<-- [end:comm_bytes]


def comm_volume_psi(stage: int) -> int:
    """The paper's per-step volume in units of Ψ elements (the large-N_d limit): 2, 2, 2, 3."""
    return sum(2 if op == "all_reduce" else 1 for op in comm_collectives(stage))


# ----------------------------------------------------------------------------------------------
# Model size and FLOPs

def gpt_params(n_layer: int, d_model: int, vocab: int, seq_len: int, *, tied: bool = True,
               bias: bool = True) -> int:
    """Parameters of a GPT-2-shaped model (learned positions, 4h MLP, final LayerNorm).

    With biases (GPT-2): per block 12h² + 13h; plus token (Vh) and position (sh) embeddings, the final
    LayerNorm (2h) and an untied head (Vh) when `tied` is False. Narayanan et al. Eq. 2 counts the
    same terms without the final LayerNorm: 12Lh²(1 + 13/(12h) + (V+s)/(12Lh)). Without biases
    (minimega's `GPTConfig` default, untied head): 12h² + 2h per block and h for the final LayerNorm.
    """
    h = d_model
    per_block = 12 * h * h + (13 * h if bias else 2 * h)
    final_ln = 2 * h if bias else h
    return n_layer * per_block + vocab * h + seq_len * h + final_ln + (0 if tied else vocab * h)


# --8<-- [start:moe_estimate]
def moe_capacity(seq_len: int, n_experts: int, top_k: int, capacity_factor: float) -> int:
    """Slots per expert in one sequence: min(T, ceil(capacity_factor · k · T / E)) (`minimega.moe`)."""
    return max(1, min(seq_len, math.ceil(capacity_factor * top_k * seq_len / n_experts)))


def moe_params(n_layer: int, d_model: int, vocab: int, seq_len: int, n_experts: int) -> tuple[int, int]:
    """(non-expert, expert) parameters of minimega's `MoEGPT` (no biases, untied head).

    Each block's 8D² MLP becomes E experts of 8D² and a D·E router; the rest is `gpt_params`'s GPT.
    """
    dense = gpt_params(n_layer, d_model, vocab, seq_len, tied=False, bias=False)
    experts = n_layer * n_experts * 8 * d_model * d_model
    return dense - n_layer * 8 * d_model * d_model + n_layer * d_model * n_experts, experts


def moe_model_state_bytes(n_dense: float, n_expert: float, dp: int, ep: int, stage: int,
                          precision: str = "mixed") -> float:
    """Model-state bytes per rank with expert parallelism carved out of dp.

    The non-expert parameters follow ZeRO over dp (`model_state_bytes`); a rank holds E/ep of the experts,
    whole, on each of the dp/ep ranks of its edp group. From stage 1 on their optimizer states are sharded
    over that group (ZeRO-1 over edp, `moe_zero.ExpertZero1`); their parameters and gradients stay whole.
    """
    if dp % ep:
        raise ValueError(f"ep={ep} must divide dp={dp}")
    return (model_state_bytes(n_dense, dp, stage, precision)
            + model_state_bytes(n_expert / ep, dp // ep, min(stage, 1), precision))


def moe_alltoall_bytes(n_layer: int, rows: int, seq_len: int, d_model: int, ep: int, n_experts: int,
                       top_k: int, capacity_factor: float, bytes_per_elem: int = 4) -> float:
    """Bytes one rank sends in a training step's all-to-alls: 4 per MoE layer (dispatch and combine, forward
    and backward), each (ep-1)/ep of the (E, rows · C, D) slot buffer; ``rows``: this rank's sequences."""
    slots = n_experts * rows * moe_capacity(seq_len, n_experts, top_k, capacity_factor) * d_model
    return 4 * n_layer * (ep - 1) / ep * slots * bytes_per_elem
# --8<-- [end:moe_estimate]


def moe_mlp_activation_bytes(seq_len: int, micro_batch: int, hidden: int, n_experts: int, top_k: int,
                             capacity_factor: float, *, act_bytes: int = 4) -> float:
    """Bytes one `moe.MoELayer` keeps for backward, one micro-batch, any ep (measured exactly in the tests).

    With N = s·b tokens, R = b·E·C slots (C = `moe_capacity`), e = `act_bytes`:

        router      its input N·h, the softmax output N·E, the top-k indices 8·N·k (int64); for k > 1 the
                    chosen probabilities and their sum N·(k + 1) (the gates are renormalised)
        aux loss    the per-sequence top-1 fractions b·E
        one-hot     the (token, choice) → slot map N·k·E·C for the combine weights, the dispatch mask and the
                    combine weights N·E·C each: N·E·C·(k + 2), GShard's dense dispatch, quadratic in s
        experts     their input R·h, the fc output and GELU output 2·R·4h, their output R·h for the combine

    The slot buffers hold b·E·C rows on every rank whatever ep is: the all-to-all moves rows, it does not
    change how many there are. Against a dense MLP's s·b·h·(1 + 8/t) (input, fc and GELU outputs) this
    is roughly (1 + 10·k·capacity_factor)·sbh plus the one-hot term.
    """
    s, b, h, E, k = seq_len, micro_batch, hidden, n_experts, top_k
    N, C = s * b, moe_capacity(seq_len, n_experts, top_k, capacity_factor)
    R = b * E * C
    routing = N * h + N * E + (N * (k + 1) if k > 1 else 0) + b * E + N * E * C * (k + 2)
    return act_bytes * (routing + 10 * R * h) + 8 * N * k


def moe_activation_delta(seq_len: int, micro_batch: int, hidden: int, n_experts: int, top_k: int,
                         capacity_factor: float, *, tp: int = 1, act_bytes: int = 4) -> float:
    """What a block's activations gain when its MLP becomes minimega's MoE layer: `moe_mlp_activation_bytes`
    (the layer runs whole on every tp rank) less the dense MLP's input (kept whole) and fc and GELU outputs
    (split over tp). The dense MLP's dropout mask stays: the MoE output is dropped out the same way."""
    sbh = seq_len * micro_batch * hidden
    dense = act_bytes * sbh * (1 + 8 / tp)
    return moe_mlp_activation_bytes(seq_len, micro_batch, hidden, n_experts, top_k, capacity_factor,
                                    act_bytes=act_bytes) - dense


# --8<-- [start:cp_estimate]
def cp_ring_bytes(n_layer: int, rows: int, seq_len: int, d_model: int, cp: int, tp: int = 1,
                  bytes_per_elem: int = 4, recompute: bool = False) -> float:
    """Bytes one rank sends in a training step's ring attention (`minimega.context_parallel`): per layer,
    forward cp-1 K/V blocks, backward cp-1 K/V blocks and cp dK/dV blocks, each block 2 · rows · (T/cp) ·
    (D/tp) elements: (6·cp - 4) · rows · (T/cp) · (D/tp) per layer; ``recompute`` (activation checkpointing
    of every block or of every attention core) runs the forward's ring once more: (8·cp - 6). cp = 1: 0."""
    if cp == 1:
        return 0.0
    blocks = (3 * cp - 2) + (cp - 1 if recompute else 0)                      # K/V-sized blocks sent per layer
    return n_layer * 2 * blocks * rows * (seq_len / cp) * (d_model / tp) * bytes_per_elem


def cp_ulysses_bytes(n_layer: int, rows: int, seq_len: int, d_model: int, cp: int, tp: int = 1,
                     bytes_per_elem: int = 4, recompute: bool = False) -> float:
    """Bytes one rank sends in a training step's Ulysses attention (`minimega.ulysses`): per layer four
    all-to-alls forward (q, k, v, output) and four backward, each over a rows · (T/cp) · (D/tp) buffer of
    which (cp-1)/cp leaves the rank: 8 · (cp-1)/cp · rows · (T/cp) · (D/tp) per layer; ``recompute`` runs
    the forward's four again (12). cp = 1: 0."""
    if cp == 1:
        return 0.0
    exchanges = 8 + (4 if recompute else 0)                                   # all-to-alls per layer
    return n_layer * exchanges * (cp - 1) / cp * rows * (seq_len / cp) * (d_model / tp) * bytes_per_elem


def cp_bytes(attention: str, *args, **kwargs) -> float:
    """`cp_ring_bytes` or `cp_ulysses_bytes` by ``attention`` ('ring' or 'ulysses', `TrainConfig.cp_attention`)."""
    if attention not in CP_ATTENTION:
        raise ValueError(f"cp attention {attention!r}: expected one of {CP_ATTENTION}")
    return (cp_ring_bytes if attention == "ring" else cp_ulysses_bytes)(*args, **kwargs)
# --8<-- [end:cp_estimate]


# --8<-- [start:flops]
def flops_per_token(n_params: float, n_layer: int, n_head: int, head_dim: int, seq_len: int) -> float:
    """Training FLOPs per token, PaLM App. B: 6N + 12·L·H·Q·T (forward 1/3, backward 2/3).

    N should exclude the position embedding (it does no matmul). GPT-2 124M: 855.1 MFLOP/token.
    """
    return 6 * n_params + 12 * n_layer * n_head * head_dim * seq_len


def mfu(tokens_per_s: float, flops_per_tok: float, peak_flops: float) -> float:
    """Model FLOPs utilisation: achieved model FLOP/s over the hardware peak (PaLM App. B)."""
    return tokens_per_s * flops_per_tok / peak_flops


def megatron_model_flops(batch: int, seq_len: int, n_layer: int, hidden: int, vocab: int) -> float:
    """Model FLOPs per iteration, Korthikanti et al. App. A: 72·B·L·s·h²·(1 + s/(6h) + V/(12hL))."""
    s, h, L = seq_len, hidden, n_layer
    return 72 * batch * L * s * h * h * (1 + s / (6 * h) + vocab / (12 * h * L))
# --8<-- [end:flops]


# ----------------------------------------------------------------------------------------------
# Activations (Korthikanti et al. 2022, Table 2)

# --8<-- [start:activations]
ATTENTION = ("unfused", "fused")


def activation_bytes_per_layer(seq_len: int, micro_batch: int, hidden: int, heads: int, *, tp: int = 1,
                               sp: bool = False, recompute: str = "none", attention: str = "unfused",
                               act_bytes: int = 2, mask_bytes: int = 1) -> float:
    """Bytes one transformer layer keeps for its backward, per micro-batch (Korthikanti Table 2).

    With 16-bit activations, 1-byte dropout masks and unfused attention this is the paper's table:

        none                    sbh(34 + 5as/h)
        TP                      sbh(10 + 24/t + 5as/(ht))
        TP + SP                 sbh(34/t + 5as/(ht))
        TP + selective          sbh(10 + 24/t)
        TP + SP + selective     sbh·34/t
        full recompute          2sbh (only the layer input; /t when SP shards it)

    The terms, in elements of `act_bytes` plus masks of `mask_bytes` (paper §4.1):
        kept whole under TP: 2 LayerNorm inputs, QKV input, MLP input (4sbh) + 2 dropout masks (2sbh)
        split by TP:         Q, K, V, projection input (4sbh), MLP up and GeLU outputs (8sbh)
        attention core:      softmax and its dropout (2as²b) + the dropout mask (as²b), split by TP
    Sequence parallelism splits the first group over t too; selective recompute drops the core.

    ``attention="fused"`` (FlashAttention, PyTorch SDPA, Megatron-core's default kernel) never stores
    the s² scores: the kernel recomputes them in its backward from Q, K, V and one fp32 log-sum-exp
    per row and head, 4asb bytes (/t). The quadratic term is then gone without any recomputation
    policy, and selective recomputation has only that log-sum-exp left to save.
    """
    if recompute not in RECOMPUTE:
        raise ValueError(f"recompute {recompute!r}: expected one of {RECOMPUTE}")
    if attention not in ATTENTION:
        raise ValueError(f"attention {attention!r}: expected one of {ATTENTION}")
    s, b, h, a, t = seq_len, micro_batch, hidden, heads, tp
    sbh = s * b * h
    if recompute == "full":
        return act_bytes * sbh / (t if sp else 1)
    whole = sbh * (4 * act_bytes + 2 * mask_bytes) / (t if sp else 1)
    split = sbh * 12 * act_bytes / t
    if recompute == "selective":
        core = 0.0
    elif attention == "fused":
        core = 4 * a * s * b / t
    else:
        core = a * s * s * b * (2 * act_bytes + mask_bytes) / t
    return whole + split + core


def recompute_working_bytes(seq_len: int, micro_batch: int, hidden: int, heads: int, *, tp: int = 1,
                            sp: bool = False, recompute: str = "none", attention: str = "unfused",
                            act_bytes: int = 2, mask_bytes: int = 1) -> float:
    """Bytes recomputation brings back during the backward, one layer and one micro-batch at a time.

    Full: the backward reruns one layer's forward and holds that layer's activations again, as if
    nothing were recomputed: `activation_bytes_per_layer(recompute="none")` (sbh(34 + 5as/h) on one
    GPU; the layer input it counts is shared with the checkpoint, and the gradient arriving from the
    layer above is the same size). Selective: that layer's attention core again (5as²b/t unfused).
    None: nothing. This term is added once, not per layer or per micro-batch in flight.
    """
    kw = dict(tp=tp, sp=sp, attention=attention, act_bytes=act_bytes, mask_bytes=mask_bytes)
    args = (seq_len, micro_batch, hidden, heads)
    if recompute not in RECOMPUTE:
        raise ValueError(f"recompute {recompute!r}: expected one of {RECOMPUTE}")
    if recompute == "none":
        return 0.0
    full = activation_bytes_per_layer(*args, recompute="none", **kw)
    if recompute == "full":
        return full
    return full - activation_bytes_per_layer(*args, recompute="selective", **kw)
# --8<-- [end:activations]


# --8<-- [start:gpt_activations]
def gpt_activation_bytes_per_layer(seq_len: int, micro_batch: int, hidden: int, heads: int, *, tp: int = 1,
                                   sp: bool = False, recompute: str = "none", act_bytes: int = 4,
                                   mask_bytes: int | None = None, dropout: bool = False,
                                   attention: str = "math") -> float:
    """Bytes one block of minimega's GPT (``model.py``) keeps for backward, per tp rank.

    `activation_bytes_per_layer` above is the paper's table; this is the same count adapted to the
    exact tensors our block saves, and the tests measure it (``saved_tensors_hooks``) to within 5%.
    Per element (e = `act_bytes`, m = `mask_bytes`: e for PyTorch's CPU dropout, 1 for its CUDA kernel):

        replicated region   LN inputs 2·sbh·e, their mean and rstd 4·sb·4 B (fp32), and with dropout two residual
                            masks 2·sbh·m: all /t under sequence parallelism.
                            The inputs of qkv and fc, 2·sbh·e, stay whole: the column-parallel matmul keeps the
                            gathered input (Megatron re-gathers instead; we trade that all-gather for memory).
        split over tp       qkv output 3·sbh·e (q, k, v are views of it), proj input sbh·e, fc output 4·sbh·e,
                            GELU output 4·sbh·e: 12·sbh·e / t.
        attention core      "math": softmax as²b·e, with dropout also its mask as²b·m and output as²b·e;
                            "flash" (fused, no dropout): only the log-sum-exp, asb·4 B; all /t (heads split).

    Against the paper (e = 2, m = 1, dropout, "math"): equal to `activation_bytes_per_layer` plus 16sb for the
    LayerNorm statistics it neglects, and under sequence parallelism plus 2sbh·e·(1 − 1/t) more for the kept
    gathered input: sbh(4 + 30/t + 5as/(ht)) rather than sbh(34/t + 5as/(ht)). ``recompute="selective"``
    drops the attention-core term; ``"full"`` keeps only the block input sbh·e (/t with SP), as in the paper.
    """
    if recompute not in RECOMPUTE:
        raise ValueError(f"recompute {recompute!r}: expected one of {RECOMPUTE}")
    if attention not in ("math", "flash"):
        raise ValueError(f"attention {attention!r}: expected 'math' or 'flash'")
    s, b, h, a, t, e = seq_len, micro_batch, hidden, heads, tp, act_bytes
    m = e if mask_bytes is None else mask_bytes
    rep = t if sp else 1
    if recompute == "full":
        return s * b * h * e / rep
    replicated = (2 * s * b * h * e + 16 * s * b + (2 * s * b * h * m if dropout else 0)) / rep
    replicated += 2 * s * b * h * e
    split = 12 * s * b * h * e / t
    if attention == "flash":
        core = a * s * b * 4 / t
    else:
        core = a * s * s * b * (e + (m + e if dropout else 0)) / t
    return replicated + split + (0 if recompute == "selective" else core)
# --8<-- [end:gpt_activations]


# --8<-- [start:tp_comm]
def tp_comm_elements_per_layer(seq_len: int, micro_batch: int, hidden: int, tp: int) -> float:
    """Elements each TP rank sends per layer per micro-batch, forward + backward (Narayanan §3.2).

    Two all-reduces forward and two backward, each on a (b, s, h) tensor, ring model: 8bsh(t-1)/t.
    Sequence parallelism swaps each all-reduce for an all-gather + reduce-scatter: the same volume.
    """
    return 8 * micro_batch * seq_len * hidden * (tp - 1) / tp
# --8<-- [end:tp_comm]


# --8<-- [start:checkpoint]
def checkpoint_bytes(n_params: float, precision: str = "mixed", *, optimizer: bool = True) -> float:
    """Bytes of a full training checkpoint: the working weights plus, to resume, the optimizer states.

    Mixed precision: 2Ψ for the 16-bit weights and KΨ = 12Ψ for the fp32 master copy, momentum and
    variance. Gradients are not saved; they are rebuilt by the next backward. With
    ``optimizer=False`` only the weights (what inference needs).
    """
    p, _, k = state_bytes_per_param(precision)
    return (p + (k if optimizer else 0)) * n_params
# --8<-- [end:checkpoint]


# ----------------------------------------------------------------------------------------------
# Pipeline parallelism

# --8<-- [start:bubble]
def bubble_ratio(p: int, m: int, v: int = 1) -> float:
    """Idle time over ideal compute time, t_pb / t_id = (p-1)/(v·m) (Narayanan §2.2).

    v = 1 for GPipe and 1F1B (same bubble, different memory); v > 1 for interleaved 1F1B.
    """
    return (p - 1) / (v * m)


def bubble_fraction(p: int, m: int, schedule: str = "1f1b", v: int = 1) -> float:
    """Share of the whole step the pipeline is idle: ratio / (1 + ratio).

    GPipe and 1F1B: (p-1)/(m+p-1) (GPipe §2.3); interleaved: (p-1)/(v·m + p-1).
    """
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule {schedule!r}: expected one of {SCHEDULES}")
    r = bubble_ratio(p, m, v if schedule == "interleaved" else 1)
    return r / (1 + r)


def in_flight_microbatches(p: int, m: int, schedule: str = "1f1b", v: int = 1) -> float:
    """Micro-batches whose activations the first stage holds at its peak, in units of its L/p layers.

    GPipe runs all m forwards first: m. 1F1B starts backwards after p warm-up forwards: min(p, m).
    Interleaved 1F1B holds min(p, m)·(1 + (p-1)/(p·v)) (Megatron's memory penalty,
    ``theoretical_memory_usage.py``).
    """
    if schedule == "gpipe":
        return float(m)
    if schedule == "1f1b":
        return float(min(p, m))
    if schedule == "interleaved":
        return min(p, m) * (1 + (p - 1) / (p * v))
    raise ValueError(f"schedule {schedule!r}: expected one of {SCHEDULES}")
# --8<-- [end:bubble]


# ----------------------------------------------------------------------------------------------
# Everything per GPU: the memory calculator

@dataclass(frozen=True, kw_only=True)
class MemoryConfig:
    """Inputs of the memory calculator (the Ultra-Scale Playbook's, plus PP and offload)."""
    layers: int
    """Transformer blocks L."""
    hidden: int
    """Model width h."""
    heads: int
    """Attention heads a."""
    vocab: int
    """Vocabulary V (the token embedding is tied to the output head)."""
    seq_len: int
    """Sequence length s."""
    micro_batch: int = 1
    """Micro-batch b, sequences per GPU per forward."""
    precision: str = "mixed"
    zero_stage: int = 0
    tp: int = 1
    dp: int = 1
    pp: int = 1
    cp: int = 1
    """Context parallelism: each sequence split over cp ranks (ring attention, a fused kernel): activations are
    those of s/cp tokens, and the parameters, replicated over dp · cp, are ZeRO-sharded over dp · cp."""
    cp_attention: str = "ring"
    """How attention sees the whole sequence under cp > 1: 'ring' (K/V passed around) or 'ulysses' (all-to-all
    over heads: a/(t·cp) heads per GPU, one more activation per layer, `ulysses_activation_bytes`)."""
    sp: bool = False
    """Megatron sequence parallelism (needs tp > 1 to change anything)."""
    recompute: str = "none"
    schedule: str = "1f1b"
    micro_batches: int = 1
    """Micro-batches m per step (pipeline)."""
    virtual_stages: int = 1
    """Model chunks v per pipeline rank (interleaved only)."""
    offload: str = "none"
    """'optimizer': the optimizer states and the reduced gradient shards live in CPU memory (ZeRO-Offload;
    stages 0-1 keep their unsharded gradient buffer on the GPU); 'optimizer+params': parameters too
    (ZeRO-Infinity with stage 3). See `model_state_placement`."""
    attention: str = "unfused"
    """'unfused' stores the as²b attention scores (Korthikanti's table); 'fused' (FlashAttention,
    SDPA) stores one fp32 log-sum-exp per row and head instead."""
    position_embedding: bool = True
    """A learned s × h position table (GPT-2, GPT-3, MT-NLG); False for ALiBi or RoPE (BLOOM, Llama)."""
    fp32_grads: bool = False
    """Gradients accumulate in an fp32 buffer, 4 bytes per parameter instead of 2 (DeepSpeed's
    BF16_Optimizer, Megatron's main grads); only for 16-bit precisions."""
    pp_partition: str = "blocks"
    """'blocks': every stage holds ceil(L/p) blocks, the first one also the embedding.
    'blocks+embedding': the embedding counts as one more layer to balance (Megatron-DeepSpeed's
    `type:transformer|embedding`), so the first stage holds ceil((L+2)/p) - 1 blocks."""
    experts: int = 0
    """E experts in every block's MLP, as minimega's `moe.MoEGPT` builds them (no biases, a D·E router); 0: a dense
    MLP. The experts run whole on every tp rank, E/ep of them per rank, replicated over the dp/ep ranks of their
    expert-data-parallel group; from zero_stage 1 on their optimizer states are sharded over that group
    (ZeRO-1 over edp, as minimega's `moe_zero` and DeepSpeed-MoE), their parameters and gradients stay whole."""
    top_k: int = 2
    """Experts each token is sent to (with experts > 0)."""
    capacity_factor: float = 1.25
    """Slots per expert and sequence = capacity_factor · top_k · s / E, rounded up (`moe_capacity`)."""
    ep: int = 1
    """Expert parallelism, carved out of dp: E/ep experts per rank, all-to-all dispatch and combine."""

    def check(self) -> None:
        for name in ("layers", "hidden", "heads", "vocab", "seq_len", "micro_batch", "tp", "dp", "pp", "cp",
                     "micro_batches", "virtual_stages"):
            if not (isinstance(getattr(self, name), int) and getattr(self, name) >= 1):
                raise ValueError(f"{name}={getattr(self, name)!r}: expected an integer >= 1")
        if self.precision not in PRECISIONS or self.recompute not in RECOMPUTE \
                or self.schedule not in SCHEDULES or self.offload not in OFFLOAD \
                or self.attention not in ATTENTION or self.pp_partition not in PP_PARTITION:
            raise ValueError(f"unknown option in {self}")
        for name in ("sp", "position_embedding", "fp32_grads"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}={getattr(self, name)!r}: expected True or False")
        if self.fp32_grads and self.precision == "fp32":
            raise ValueError("fp32_grads=True: gradients are already fp32 with precision='fp32'; "
                             "use a 16-bit precision or drop fp32_grads")
        _check_stage_dp(self.zero_stage, self.dp)
        if self.hidden % self.heads or self.heads % self.tp:
            raise ValueError(f"hidden={self.hidden}, heads={self.heads}, tp={self.tp}: "
                             "heads must divide hidden and tp must divide heads")
        if self.offload != "none" and self.zero_stage == 0:
            raise ValueError(f"offload={self.offload!r} needs zero_stage >= 1 (ZeRO-Offload moves ZeRO's optimizer "
                             "shards, as minimega and DeepSpeed do); set zero_stage or offload='none'")
        if self.offload == "optimizer+params" and self.zero_stage != 3:
            raise ValueError("offload='optimizer+params' needs zero_stage=3 (parameters are offloaded as shards)")
        if self.cp > 1 and self.attention != "fused":
            raise ValueError(f"cp={self.cp} runs ring attention, which never stores the s x s scores: "
                             "set attention='fused'")
        if self.cp_attention not in CP_ATTENTION:
            raise ValueError(f"cp_attention={self.cp_attention!r}: expected one of {CP_ATTENTION}")
        if self.cp > 1 and self.cp_attention == "ulysses" and self.heads % (self.tp * self.cp):
            raise ValueError(f"cp_attention='ulysses': heads={self.heads} is not divisible by tp*cp = "
                             f"{self.tp}*{self.cp} = {self.tp * self.cp}")
        if self.seq_len % (2 * self.cp):
            if self.cp > 1:
                raise ValueError(f"cp={self.cp}: seq_len={self.seq_len} is not divisible by 2*cp = {2 * self.cp}")
        self._check_experts()

    def _check_experts(self) -> None:
        if not (isinstance(self.experts, int) and not isinstance(self.experts, bool) and self.experts >= 0):
            raise ValueError(f"experts={self.experts!r}: expected an integer >= 0 (0 for a dense MLP)")
        if not (isinstance(self.ep, int) and not isinstance(self.ep, bool) and self.ep >= 1):
            raise ValueError(f"ep={self.ep!r}: expected an integer >= 1")
        if self.experts == 0:
            if self.ep > 1:
                raise ValueError(f"ep={self.ep} needs experts > 0: a dense MLP has no experts to split")
            return
        if not (isinstance(self.top_k, int) and 1 <= self.top_k <= self.experts):
            raise ValueError(f"top_k={self.top_k!r}: expected an integer from 1 to experts={self.experts}")
        if not (isinstance(self.capacity_factor, (int, float)) and math.isfinite(self.capacity_factor)
                and self.capacity_factor > 0):
            raise ValueError(f"capacity_factor={self.capacity_factor!r}: expected a finite number > 0")
        if self.experts % self.ep or self.dp % self.ep:
            raise ValueError(f"ep={self.ep} must divide experts={self.experts} and dp={self.dp} "
                             "(expert parallelism is carved out of data parallelism)")
        if self.sp and self.tp > 1:
            raise ValueError("sp=True with experts: sequence parallelism would cut the routing groups (whole "
                             "sequences) over tp; use sp=False")
        if self.cp > 1:
            raise ValueError(f"cp={self.cp} with experts: minimega's MoE layer routes whole sequences and does not "
                             "run under context parallelism; use cp=1")


# --8<-- [start:memory_per_gpu]
def stage_blocks(cfg: MemoryConfig) -> int:
    """Transformer blocks on the first pipeline stage (the one that also holds the embedding)."""
    if cfg.pp == 1:
        return cfg.layers
    if cfg.pp_partition == "blocks+embedding":
        return min(cfg.layers, math.ceil((cfg.layers + 2) / cfg.pp) - 1)
    return math.ceil(cfg.layers / cfg.pp)


def stage_params(cfg: MemoryConfig) -> float:
    """Parameters held by one GPU of the first pipeline stage (the fullest one).

    The first stage holds `stage_blocks` blocks and the embeddings. TP splits every weight matrix, the
    column-parallel biases (QKV 3h, MLP up 4h) and the vocabulary; LayerNorms (4h), the two
    row-parallel biases (2h) and the position embedding (if the model learns one) stay whole on
    each TP rank. With experts: `stage_param_split`.
    """
    return sum(stage_param_split(cfg))


def block_params(cfg: MemoryConfig) -> tuple[float, float]:
    """(non-expert, expert) parameters of one block on one GPU. A MoE block has attention's (4h² + 3h)/t + 5h
    (its LayerNorms and the projection bias whole), an h·E router, and E/ep experts of 8h² each, whole over tp."""
    h, t = cfg.hidden, cfg.tp
    if not cfg.experts:
        return (12 * h * h + 7 * h) / t + 6 * h, 0.0
    return (4 * h * h + 3 * h) / t + 5 * h + h * cfg.experts, cfg.experts / cfg.ep * 8 * h * h


def stage_param_split(cfg: MemoryConfig) -> tuple[float, float]:
    """(non-expert, expert) parameters on one GPU of the first pipeline stage; expert is 0 for a dense model."""
    h, t = cfg.hidden, cfg.tp
    dense, expert = block_params(cfg)
    positions = cfg.seq_len * h if cfg.position_embedding else 0
    embed = cfg.vocab * h / t + positions + (2 * h if cfg.pp == 1 else 0)  # final LayerNorm
    return stage_blocks(cfg) * dense + embed, stage_blocks(cfg) * expert


def memory_per_gpu(cfg: MemoryConfig) -> dict:
    """Bytes per GPU by category: model states under ZeRO and offload, plus activations.

    Model states: `model_state_breakdown` of the stage's parameters over dp (dp · cp under context
    parallelism: the cp ranks hold the same parameters). Activations, of the rank's s/cp tokens:
    `activation_bytes_per_layer` × the first stage's blocks × `in_flight_microbatches`, plus the
    recomputation working set (`recompute_working_bytes`, one layer of one micro-batch).
    ZeRO-3 also holds, one block at a time, the parameters it gathers from the other ranks
    ("gathered": a block's 16-bit parameters times (1 - 1/N_d)). Offload splits the states by location
    (`model_state_placement`; "cpu" is the host's share). With experts the expert parameters and gradients are
    whole on every rank (`stage_param_split`), their optimizer states too at stage 0 and sharded over the dp/ep
    ranks of their edp group from stage 1 on, all on the GPU, and each block's activations change by `moe_activation_delta`
    (minimega's MoE layer; with full recomputation only in the working set). Not counted:
    communication buckets, allocator fragmentation, the embedding/loss activations and logits.
    """
    cfg.check()
    n_dense, n_expert = stage_param_split(cfg)
    replicas = cfg.dp * cfg.cp                     # ranks holding the same parameters: ZeRO shards over them
    grad_bytes = 4 if cfg.fp32_grads else None
    states = model_state_placement(n_dense, replicas, cfg.zero_stage, cfg.precision, cfg.offload,
                                   grad_bytes=grad_bytes)
    cpu = states.pop("cpu")
    if n_expert:                            # experts: whole on each rank of their expert-data-parallel group,
        edp, stage = cfg.dp // cfg.ep, min(cfg.zero_stage, 1)      # Adam's states sharded over it from stage 1
        for k, v in model_state_breakdown(n_expert, edp, stage, cfg.precision, grad_bytes=grad_bytes).items():
            states[k] += v                  # stepped by their own optimizer on the GPU (offload or not)
    p_bytes = state_bytes_per_param(cfg.precision)[0]
    h, t = cfg.hidden, cfg.tp
    gathered = p_bytes * block_params(cfg)[0] * (1 - 1 / replicas) if cfg.zero_stage == 3 else 0.0
    act = dict(tp=t, sp=cfg.sp and t > 1, recompute=cfg.recompute, attention=cfg.attention,
               act_bytes=4 if cfg.precision == "fp32" else 2)
    shape = (cfg.seq_len // cfg.cp, cfg.micro_batch, h, cfg.heads)      # this rank's tokens of each sequence
    moe = moe_activation_delta(*shape[:3], cfg.experts, cfg.top_k, cfg.capacity_factor, tp=t,
                               act_bytes=act["act_bytes"]) if cfg.experts else 0.0
    uly_kept, uly_working = ulysses_activation_bytes(cfg)
    per_layer = activation_bytes_per_layer(*shape, **act) + (0.0 if cfg.recompute == "full" else moe) + uly_kept
    in_flight = in_flight_microbatches(cfg.pp, cfg.micro_batches, cfg.schedule, cfg.virtual_stages) \
        if cfg.pp > 1 else 1.0
    out = {**states, "gathered": gathered, "activations": per_layer * stage_blocks(cfg) * in_flight,
           "recompute": recompute_working_bytes(*shape, **act) + (moe if cfg.recompute == "full" else 0.0)
           + uly_working}
    out["total"] = sum(out.values())
    out["cpu"] = cpu
    out["stage_params"] = n_dense + n_expert
    return out


def ulysses_activation_bytes(cfg: MemoryConfig) -> tuple[float, float]:
    """(kept per layer, recompute working set) that Ulysses attention adds to ring attention's bytes.

    The attention kernel keeps its output head-split, (b, a/(t·cp), s, h/a), for its backward, while the
    output projection keeps its input sequence-split, (b, s/cp, h/t): e · b · (s/cp) · h/t bytes more per
    layer than ring attention, whose projection input is a view of the kernel's output (measured in
    tests/test_ulysses.py). Recomputation drops it: with 'full' the working set holds it again, with
    'selective' the recomputed core holds its head-split q, k, v and output (four of it). (0, 0) for ring or cp = 1.
    """
    if cfg.cp == 1 or cfg.cp_attention != "ulysses":
        return 0.0, 0.0
    one = (4 if cfg.precision == "fp32" else 2) * cfg.micro_batch * (cfg.seq_len // cfg.cp) * cfg.hidden / cfg.tp
    return (one if cfg.recompute == "none" else 0.0), {"none": 0.0, "full": one, "selective": 4 * one}[cfg.recompute]
# --8<-- [end:memory_per_gpu]


PRESETS = {
    "gpt2-124m": dict(layers=12, hidden=768, heads=12, vocab=50257, seq_len=1024),
    "zero-7.5b": dict(layers=36, hidden=4096, heads=32, vocab=51200, seq_len=2048, dp=64),
    "bloom-176b": dict(layers=70, hidden=14336, heads=112, vocab=250880, seq_len=2048, micro_batch=2,
                       precision="bf16", zero_stage=1, tp=4, dp=8, pp=12, recompute="full",
                       micro_batches=128, position_embedding=False, fp32_grads=True,
                       pp_partition="blocks+embedding"),
    "mt-nlg-530b": dict(layers=105, hidden=20480, heads=128, vocab=51200, seq_len=2048, micro_batch=1,
                        zero_stage=1, tp=8, dp=8, pp=35, recompute="full", micro_batches=240),
}
"""Model shapes and published layouts; every other input keeps `MemoryConfig`'s default.

gpt2-124m: GPT-2 small as in nanoGPT. zero-7.5b: the 7.5B shape of Narayanan et al. Table 1
(32 heads, h = 4096, 36 layers, V = 51200, s = 2048) at the ZeRO paper's N_d = 64.

bloom-176b: BigScience tr11 notes (``train/tr11-176B-ml/README.md``): 70 layers, h = 14336, 112 heads,
vocabulary 250880, TP 4 x PP 12 x DP 8, micro-batch 2, global batch 2048 so m = 2048 / (8 x 2) = 128,
bf16, activation checkpointing; ALiBi, so no learned position table; `--pp-partition-method
'type:transformer|embedding'`, so pp rank 0 holds the embedding and 5 blocks; DeepSpeed's
BF16_Optimizer "implements its own ZeRO Stage 1" and "accumulates grads in fp32" in a buffer it does
not shard (4 bytes per parameter). One GPU of stage 0 holds about 3.98B parameters.

mt-nlg-530b: Smith et al. 2022 (arXiv:2201.11990) and Korthikanti Table 3: 105 layers, h = 20480,
128 heads, V = 51200, TP 8 x PP 35, micro-batch 1; DP 8 on 2240 GPUs with global batch 1920, so
m = 240; its data parallelism is ZeRO-powered (stage 1, the stage DeepSpeed's pipeline engine runs
with) and it recomputes activations (full checkpointing per layer).
"""


# ----------------------------------------------------------------------------------------------
# Time, GPU-hours and money for a training run

# --8<-- [start:cost]
def megatron_hardware_flops(batch: int, seq_len: int, n_layer: int, hidden: int, vocab: int) -> float:
    """FLOPs per iteration with full recomputation, Narayanan et al. Eq. 3: 96·B·s·l·h²·(1 + s/(6h) + V/(16lh)).

    This is what Megatron-DeepSpeed's logs print as "TFLOPs" (hardware FLOPs, the forward counted
    twice). BLOOM's log line (B = 2048, s = 2048, l = 70, h = 14336, V = 250880, 104.70 s per
    iteration on 384 GPUs) gives back its 149.77 TFLOP/s per GPU.
    """
    s, h, l = seq_len, hidden, n_layer
    return 96 * batch * s * l * h * h * (1 + s / (6 * h) + vocab / (16 * l * h))


def achieved_flops_per_gpu(flops_per_iteration: float, seconds_per_iteration: float, n_gpus: int) -> float:
    """FLOP/s each GPU sustains: the iteration's FLOPs over its time and the GPUs that share it."""
    return flops_per_iteration / seconds_per_iteration / n_gpus


# --8<-- [start:training_seconds]
def training_seconds(tokens: float, n_params: float, n_gpus: int, flops_per_gpu: float, *,
                     recompute: bool = True) -> float:
    """End-to-end training time, Narayanan et al. Eq. 4: 8·T·P / (n·X) seconds.

    T tokens, P parameters, n GPUs each sustaining X FLOP/s. The 8 is 2 (forward) + 4 (backward) + 2
    (the forward again, recomputed); without recomputation it is 6. Restarts, evaluation and a
    batch-size ramp-up come on top: the real run is longer than this.
    """
    return (8 if recompute else 6) * tokens * n_params / (n_gpus * flops_per_gpu)
# --8<-- [end:training_seconds]


def gpu_hours(n_gpus: int, seconds: float) -> float:
    """GPU-hours: what clusters bill and what papers report, n GPUs held for `seconds`."""
    return n_gpus * seconds / 3600


def run_cost(gpu_hours_: float, price_per_gpu_hour: float, *, overhead: float = 0.0) -> float:
    """Money for a run: GPU-hours × the price of one, plus an `overhead` share (storage, network,
    failed and exploratory runs, people on call), e.g. 0.3 for 30% on top."""
    if price_per_gpu_hour < 0 or overhead < 0:
        raise ValueError("price_per_gpu_hour and overhead must be >= 0")
    return gpu_hours_ * price_per_gpu_hour * (1 + overhead)
# --8<-- [end:cost]


# ----------------------------------------------------------------------------------------------
# Batch arithmetic of a launch (ds_config.json, Megatron's command line)

def data_parallel_size(world: int, tp: int = 1, pp: int = 1) -> int:
    """dp = N / (tp · pp): the replicas a launch of `world` ranks leaves once tensor and pipeline
    parallelism have taken theirs. Refuses a world that the two degrees do not divide."""
    if min(world, tp, pp) < 1 or world % (tp * pp):
        raise ValueError(f"world={world} is not a positive multiple of tp*pp = {tp}*{pp}")
    return world // (tp * pp)


def accumulation_steps(global_batch: int, micro_batch: int, dp: int) -> int:
    """k = B / (b · dp): DeepSpeed's gradient_accumulation_steps, and the micro-batches m each pipeline
    runs per step under Megatron. DeepSpeed refuses a config where B != b · k · dp; so does this."""
    if min(global_batch, micro_batch, dp) < 1 or global_batch % (micro_batch * dp):
        raise ValueError(f"global_batch={global_batch} is not a positive multiple of micro_batch*dp = "
                         f"{micro_batch}*{dp}")
    return global_batch // (micro_batch * dp)


# ----------------------------------------------------------------------------------------------
# CLI: `minimega estimate`

def add_estimate_parser(subparsers) -> argparse.ArgumentParser:
    """Register ``estimate`` on an argparse subparsers object; the handler is `run_estimate`."""
    p = subparsers.add_parser("estimate", help="model-state bytes per rank and communication per step (ZeRO paper)",
                              description="Per-rank model-state memory (ZeRO paper Fig. 1) and ring communication "
                                          "volume per step. Example: minimega estimate --params 7.5e9 --dp 64")
    _add_estimate_args(p)
    p.set_defaults(func=run_estimate)
    return p


def _add_estimate_args(p: argparse.ArgumentParser) -> None:
    from .cli_args import positive_float, positive_int
    p.add_argument("--params", type=positive_float, required=True, help="parameter count Psi, e.g. 7.5e9")
    p.add_argument("--dp", type=positive_int, default=1, help="data-parallel degree N_d (default 1)")
    p.add_argument("--stage", type=int, choices=STAGES, default=None,
                   help="one ZeRO stage (default: all four)")
    p.add_argument("--precision", choices=PRECISIONS, default="mixed", help="default mixed (K = 12)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")


def estimate_report(n_params: float, dp: int, stages=STAGES, precision: str = "mixed") -> dict:
    """What `minimega estimate` prints, as a dict (bytes; GB = 1e9 bytes)."""
    grad_bytes = state_bytes_per_param(precision)[1]
    rows = []
    for st in stages:
        parts = model_state_breakdown(n_params, dp, st, precision)
        rows.append({"stage": st, **parts, "total": sum(parts.values()),
                     "comm_bytes_per_step": comm_bytes_per_step(n_params, dp, st, grad_bytes)})
    return {"params": n_params, "dp": dp, "precision": precision, "k": state_bytes_per_param(precision)[2],
            "stages": rows}


def run_estimate(args: argparse.Namespace) -> int:
    """Handler for ``minimega estimate``; prints and returns 0."""
    if args.dp < 1:
        raise SystemExit(f"--dp {args.dp}: must be >= 1")
    if not args.params > 0:
        raise SystemExit(f"--params {args.params}: must be > 0")
    stages = STAGES if args.stage is None else (args.stage,)
    rep = estimate_report(args.params, args.dp, stages, args.precision)
    if args.json:
        print(json.dumps(rep, indent=2))
        return 0
    print(f"Psi = {args.params:.4g} parameters, N_d = {args.dp}, {args.precision} (K = {rep['k']}); GB = 1e9 bytes")
    print(f"{'stage':>5} {'params':>10} {'grads':>10} {'optimizer':>10} {'total GB':>10} {'comm GB/step':>13}")
    for r in rep["stages"]:
        print(f"{r['stage']:>5} {r['params'] / GB:>10.3f} {r['grads'] / GB:>10.3f} {r['optimizer'] / GB:>10.3f} "
              f"{r['total'] / GB:>10.3f} {r['comm_bytes_per_step'] / GB:>13.3f}")
    return 0


def main(argv=None) -> int:
    """``python -m minimega.estimate --params 7.5e9 --dp 64``, the same as ``minimega estimate``."""
    p = argparse.ArgumentParser(prog="minimega estimate")
    _add_estimate_args(p)
    return run_estimate(p.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
