"""One rank of minimega's engine at any scale, from the layout's integers: what it holds and what it sends.

The estimators elsewhere count a model the way the papers do (parameters Ψ, per GPU of the fullest stage);
this file counts *minimega's* model (`model.GPT`: learned positions or RoPE, an untied head, biases if the config
has them, GPT's or Llama's blocks) the way minimega's engine lays it out, so that a dry run (`dry_run.py`) of the same rank can be
held against it to the byte:

    pipeline   the L blocks cut into p·v chunks of ⌊L/(p·v)⌋ blocks, the first L mod (p·v) chunks one more;
               chunk k on pp rank k mod p; the embeddings on chunk 0, the final LayerNorm and head on the last
    tensor     qkv, fc (SwiGLU: and gate) and the head split by output rows, proj by input columns (weights D/t or
               F/t wide), qkv's (D + 2k)/t rows (k = n_kv_head·hs), the vocabulary padded to t·⌈V/t⌉ rows;
               LayerNorms, wpe (none with RoPE) and the row-parallel biases whole
    ZeRO       one unit per chunk part (embeddings, each block, head), padded to a multiple of dp (`padded_numel`);
               ZeRO-3 keeps only the shards at rest and gathers one unit (and prefetches the next) at a time

Memory: `peak_memory_bytes` of these units. Communication per step, the ring model of `communication.py`
applied to what each group carries:

    dp   ZeRO 1-2: reduce-scatter every padded unit's gradients (4-byte main grads), all-gather its
         parameters; DDP (stage 0): all-reduce the unpadded gradients; ZeRO-3: all-gather every padded unit
         twice per micro-batch (before its forward and before its backward), reduce-scatter its gradients
         every micro-step (pp = 1) or once after the last micro-batch (pp > 1)
    tp   per micro-batch and block: 2 all-reduces of (b, s, D) forward and 2 backward (`tp_comm_elements_per_layer`),
         2 more when full recomputation runs the forward again; the embedding's forward all-reduce (chunk 0);
         on the last chunk the head's backward all-reduce and the vocab-parallel cross-entropy (an all-gather of
         t·b·s maxima, two all-reduces of b·s numbers)
    pp   per micro-batch, the (b, s, D) activation sent forward (all but the last chunk) and its gradient sent
         back (all but chunk 0)
"""
from __future__ import annotations

from .communication import comm_bytes_per_step, ring_bytes, tp_comm_elements_per_layer
from .memory import padded_numel, peak_memory_bytes

ELEM_BYTES = {"fp32": 4, "bf16": 2}
GRAD_BYTES = 4          # gradients accumulate and reduce in fp32 under both (bf16: Megatron's main_grad)


def chunk_sizes(n_layer: int, chunks: int) -> list[int]:
    """Blocks in each of the pipeline's ``chunks`` chunks (earlier chunks one more when they do not divide)."""
    if not 1 <= chunks <= n_layer:
        raise ValueError(f"{n_layer} layers cannot be cut into {chunks} chunks")
    return [n_layer // chunks + (k < n_layer % chunks) for k in range(chunks)]


def rank_units(shape: dict, tp: int = 1, pp: int = 1, pp_rank: int = 0, virtual_stages: int = 1) -> list[list[int]]:
    """The element count of each parameter this rank holds, grouped by ZeRO unit in forward order.

    ``shape``: ``vocab_size, block_size, n_layer, n_embd, mlp_ratio, bias`` and Llama's ``n_head, n_kv_head,
    mlp, ffn_hidden, position`` (`GPTConfig`'s names).
    """
    V, T, L, D = shape["vocab_size"], shape["block_size"], shape["n_layer"], shape["n_embd"]
    F, bias = shape.get("ffn_hidden") or shape.get("mlp_ratio", 4) * D, shape.get("bias", False)
    K = shape["n_kv_head"] * (D // shape["n_head"]) if shape.get("n_kv_head") else D     # K (and V) rows
    if D % tp or F % tp or K % tp:
        raise ValueError(f"tp={tp} does not divide n_embd={D}, the key/value width {K} and the MLP width {F}")
    vocab_rows = -(-V // tp)                                     # this rank's rows of the padded vocabulary
    ln = [D, D] if bias else [D]
    up = [F // tp * D] + ([F // tp] if bias else [])             # fc, and SwiGLU's gate before it
    block = (ln + [(D + 2 * K) // tp * D] + ([(D + 2 * K) // tp] if bias else []) + [D * D // tp] + ([D] if bias else [])
             + ln + up * (2 if shape.get("mlp") == "swiglu" else 1) + [D * F // tp] + ([D] if bias else []))
    table = [] if shape.get("position") == "rope" else [T * D]   # wpe (whole); RoPE has none
    chunks = pp * virtual_stages
    sizes = chunk_sizes(L, chunks)
    units = []
    for k in range(pp_rank, chunks, pp):
        if k == 0:
            units.append([vocab_rows * D] + table)                # wte (vocab-parallel), wpe (whole)
        units += [list(block) for _ in range(sizes[k])]
        if k == chunks - 1:
            units.append(ln + [vocab_rows * D])                   # ln_f, lm_head (vocab-parallel)
    return units


def rank_memory(units: list[list[int]], dp: int, zero_stage: int, precision: str = "bf16", *, tp: int = 1,
                pp: int = 1, pp_rank: int = 0, message_bytes: int = 0, in_flight: int = 1, overlap: bool = True,
                accumulation: int = 1, prefetch: bool = True, micro_batches: int = 1) -> dict:
    """Model-state bytes by category at the peak of a first step: `peak_memory_bytes`, and what a pipeline changes.

    ``in_flight``, ``overlap``, ``prefetch``: `TrainConfig`'s ``reductions_in_flight``, ``overlap_comm`` and
    ``prefetch`` (ZeRO-3); ``accumulation``: its gradient-accumulation micro-steps (pp = 1; a pipeline's
    micro-batches, ``micro_batches``, are not micro-steps here).

    Under pp every chunk accumulates its micro-batches' gradients whole (``no_sync``) and reduces them in the
    last one's backward (`_pipeline_grads`): with m ≥ 3 a ZeRO-2 or ZeRO-3 rank holds all of them, Σ N_u·4,
    when the bf16 gradient of the largest parameter arrives in the second micro-batch's backward; with m = 2
    the second is the last, whose reductions replace full gradients by shards as its backward goes; with
    m = 1 nothing is accumulated and the rank is a single micro-step's (`peak_memory_bytes`).
    Collectives beyond the reduce pool (``message_bytes``, (b, s, D)): one tick's pipeline send and receive,
    2 · ``message_bytes``, in flight together; a tp all-reduce of (b, s, D) during the backward; on every stage
    but the first the last backward's input gradient, sent back after it. The pool (`zero.flat.BufferPool`;
    none at dp = 1, where nothing is reduced) is created by the chunk's first reduction and kept: in a first step (the dry run's)
    the pipeline's earlier ticks run without it, the backward's tp all-reduces and the last send with it.
    From the second step on the pool is there all along (pp > 1: pool + 2 · ``message_bytes``).
    DDP (stage 0) holds its buckets only while they are in flight (none at dp = 1, a group of one issues
    no collective). Activations are not modelled here.
    """
    out = peak_memory_bytes(units, dp, zero_stage, precision=precision, in_flight=in_flight, overlap=overlap,
                            accumulation=accumulation if pp == 1 else 1, prefetch=prefetch)
    if pp > 1 and zero_stage >= 2 and micro_batches > 1:
        slots = 1 if not overlap else min(in_flight or len(units), len(units))
        out["grads"] = _pipeline_grads(units, dp, precision, slots, micro_batches)
    pipeline = 2 * message_bytes if pp > 1 else 0                         # a tick's send and receive together
    if zero_stage == 0:
        buckets = out["comm_buffers"] if dp > 1 else 0
        last_send = message_bytes if pp > 1 and pp_rank > 0 else 0
        out["comm_buffers"] = max(buckets + last_send, pipeline, message_bytes if tp > 1 else 0)
    else:
        beside_pool = message_bytes if tp > 1 or (pp > 1 and pp_rank > 0) else 0
        out["comm_buffers"] = max(out["comm_buffers"] + beside_pool, pipeline)
    return out


def _pipeline_grads(units: list[list[int]], dp: int, precision: str, slots: int, micro_batches: int) -> int:
    """Peak gradient bytes of a ZeRO-2/3 pipeline chunk over m ≥ 2 micro-batches (fp32 main grads, g = 4).

    The last micro-batch's backward meets every full main grad left by the earlier ones. Walking its units in
    backward order (position i, L = ``slots`` reductions in flight), two moments can be the peak: the bf16
    gradient of unit i's largest parameter arriving (max p·e) while units i.. hold full grads and the units
    before i - L hold their shards (those in flight sit in the pool, `comm_buffers`); and unit i's reduction
    starting, which first retires unit i - L (its shard is born). With m ≥ 3 the second micro-batch, which
    reduces nothing, meets every full main grad too: Σ N_u·4 + the largest bf16 gradient.
    """
    e = ELEM_BYTES[precision] if precision != "fp32" else 0      # fp32 gradients land in place: no fold
    N = [sum(u) for u in units][::-1]                              # backward order
    S = [padded_numel(x, dp) // dp for x in N]
    fold = [max(u) * e for u in units][::-1]
    peaks = [GRAD_BYTES * sum(S)]                                  # every shard, after the last reduction
    for i in range(len(N)):
        full = sum(N[i:]) * GRAD_BYTES
        if dp == 1:         # nothing to reduce: unit i's gradient is flattened into its shard beside its full grads
            peaks.append(full + sum(S[:i]) * GRAD_BYTES + max(fold[i], N[i] * GRAD_BYTES))
            continue
        peaks.append(full + sum(S[:max(0, i - slots)]) * GRAD_BYTES + fold[i])      # unit i's bf16 gradient
        peaks.append(full + sum(S[:max(0, i - slots + 1)]) * GRAD_BYTES)           # unit i's reduction starts
    if micro_batches > 2:
        peaks.append(sum(N) * GRAD_BYTES + max(fold))
    return max(peaks)


def rank_comm(shape: dict, units: list[list[int]], *, dp: int, tp: int, pp: int, pp_rank: int, zero_stage: int,
              precision: str, batch_size: int, micro_batches: int = 1, gradient_accumulation_steps: int = 1,
              recompute: str = "none") -> dict:
    """Ring-model bytes this rank sends in one step, by group ('dp', 'tp', 'pp'), for a layout with v = 1.

    ``batch_size``: the global batch; each dp rank runs ``batch_size/dp`` rows in ``micro_batches`` (pp > 1)
    or ``gradient_accumulation_steps`` micro-steps of b rows.
    """
    e, s, D = ELEM_BYTES[precision], shape.get("seq_len") or shape["block_size"], shape["n_embd"]
    steps = micro_batches if pp > 1 else gradient_accumulation_steps
    b = batch_size // dp // steps
    out = {"dp": 0.0, "tp": 0.0, "pp": 0.0}
    # dp: per unit, once per step (DDP and ZeRO-1 accumulate locally; the pipeline reduces after the last
    # micro-batch); ZeRO-2 without a pipeline reduce-scatters every micro-step.
    padded = sum(padded_numel(sum(u), dp) for u in units)
    if zero_stage == 0:                                          # DDP's buckets are not padded
        out["dp"] = comm_bytes_per_step(sum(map(sum, units)), dp, 0, e, grad_bytes=GRAD_BYTES)
    elif zero_stage in (1, 2):
        out["dp"] = comm_bytes_per_step(padded, dp, zero_stage, e, grad_bytes=GRAD_BYTES)
        if zero_stage == 2 and pp == 1:                          # + a reduce-scatter on every other micro-step
            out["dp"] += (steps - 1) * ring_bytes("reduce_scatter", padded * GRAD_BYTES, dp)
    else:                                                        # ZeRO-3: gathers per micro-batch
        out["dp"] = comm_bytes_per_step(padded, dp, 3, e, grad_bytes=GRAD_BYTES)     # one micro-step: 3 padded Ψ
        reductions = 1 if pp > 1 else steps                      # the pipeline reduces after its last micro-batch
        out["dp"] += (steps - 1) * 2 * ring_bytes("all_gather", padded * e, dp)
        out["dp"] += (reductions - 1) * ring_bytes("reduce_scatter", padded * GRAD_BYTES, dp)
    # tp: the blocks' f and g regions, the embedding, the head and the vocab-parallel cross-entropy.
    if tp > 1:
        blocks = len(units) - (pp_rank == 0) - (pp_rank == pp - 1)
        per_block = tp_comm_elements_per_layer(s, b, D, tp) * e              # 4 all-reduces of (b, s, D)
        if recompute == "full":
            per_block *= 1.5                                                 # the forward's 2 again
        ends = 0.0
        if pp_rank == 0:
            ends += ring_bytes("all_reduce", b * s * D * e, tp)              # vocab-parallel embedding
        if pp_rank == pp - 1:
            ends += ring_bytes("all_reduce", b * s * D * e, tp)              # the head's input gradient
            ends += ring_bytes("all_gather", tp * b * s * e, tp) + 2 * ring_bytes("all_reduce", b * s * e, tp)
        out["tp"] = steps * (blocks * per_block + ends)
    if pp > 1:
        out["pp"] = micro_batches * b * s * D * e * ((pp_rank < pp - 1) + (pp_rank > 0))
    return out


# Published models as minimega's GPT: their shapes, biases on (Megatron and BLOOM have them), and minimega's own
# learned positions and untied head (the model has no ALiBi or tied embedding); layouts as published. Llama 3 as
# Llama: GQA, SwiGLU, RoPE, no biases (its RMSNorms counted as minimega's bias-free LayerNorms: the same D each).
GPT3_175B = dict(layers=96, hidden=12288, heads=96, vocab=51200, seq_len=2048, micro_batch=1, zero_stage=1, tp=8,
                 dp=1, pp=8, recompute="full", micro_batches=64, precision="bf16")
"""GPT-3 175B as Korthikanti et al. 2022 (arXiv:2205.05198) Table 3 ran it: 96 layers, h = 12288, 96 heads,
s = 2048, V = 51200, TP 8 × PP 8 on 64 GPUs, global batch 64, micro-batch 1 (so dp = 1 and m = 64)."""
LLAMA3_405B_LAYOUT = dict(rope_theta=500000.0, tp=8, cp=1, pp=16, dp=64, micro_batch=1, micro_batches=32,
                          zero_stage=1, recompute="none", precision="bf16")
"""Llama 3 405B's 8K-sequence layout (Llama Team 2024, arXiv:2407.21783, Table 4, first row): TP 8, CP 1, PP 16,
DP 64 on 8,192 GPUs, 32 sequences of 8,192 tokens per dp rank (16M tokens per step), RoPE base 500000 (§3.2).
Not from the paper: micro-batch 1 (m = 32), ZeRO-1 (Llama 3 ran FSDP, parameters sharded too), plain 1F1B over
ceil/floor(126/16) blocks (Llama 3 interleaved its stages and left a layer off the first and the last)."""
REFUSED_MODELS: dict[str, str] = {}
"""Published models the dry run refuses by name, with why (none at present)."""


def published(name: str) -> dict:
    """A published model's shape and layout (`calculator.PRESETS`, `GPT3_175B`); refused models by name."""
    from .calculator import PRESETS
    if name in REFUSED_MODELS:
        raise ValueError(f"model {name!r}: {REFUSED_MODELS[name]}")
    table = {k: v for k, v in PRESETS.items() if k in ("bloom-176b", "mt-nlg-530b")} | {"gpt3-175b": GPT3_175B}
    table["llama3-405b"] = {**PRESETS["llama3-405b"], **LLAMA3_405B_LAYOUT}
    if name not in table:
        raise ValueError(f"model {name!r}: expected one of {sorted(table)}")
    return dict(table[name])


def gpt_shape(preset: dict) -> dict:
    """`GPTConfig` fields for a preset's shape (block_size = its sequence length; biases on unless it says
    ``bias=False``); Llama's ``kv_heads``, ``ffn``, ``mlp`` carried, and RoPE where it names its ``rope_theta``."""
    shape = dict(vocab_size=preset["vocab"], block_size=preset["seq_len"], n_layer=preset["layers"],
                 n_head=preset["heads"], n_embd=preset["hidden"], bias=preset.get("bias", True))
    for key, field in (("kv_heads", "n_kv_head"), ("ffn", "ffn_hidden")):
        if preset.get(key):
            shape[field] = preset[key]
    if preset.get("mlp", "gelu") != "gelu":
        shape["mlp"] = preset["mlp"]
    if "rope_theta" in preset:
        shape.update(position="rope", rope_theta=preset["rope_theta"])
    return shape
