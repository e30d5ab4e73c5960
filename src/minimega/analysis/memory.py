"""Model states per rank: the ZeRO paper's accounting, padded flat buffers, peak bytes during a step, checkpoints.

Pure functions of a few integers; no torch. Each implements one published formula and says which, so a
measurement (``run/measure.py``), a figure (``figures/plots.py``), the course's memory calculator and a quiz
answer agree on one number. The other estimators live beside this file, one concern each:
``communication.py`` (bytes on the wire), ``activations.py`` (saved activations), ``pipeline.py`` (bubbles),
``flops.py`` (parameters, FLOPs, time and money), ``calculator.py`` (everything per GPU). ``minimega.analysis``
(also importable as ``minimega.analysis``) gathers them all.

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

from ..sizes import padded_numel   # the one definition: the flat buffers (zero/flat.py) pad exactly this way

GB = 1e9

PRECISIONS = ("mixed", "bf16", "fp16", "fp32", "fp8")
STAGES = (0, 1, 2, 3)
RECOMPUTE = ("none", "selective", "full")
SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb_h1")
OFFLOAD = ("none", "optimizer", "optimizer+params")
OFFLOAD_DEVICES = ("cpu", "nvme")
PP_PARTITION = ("blocks", "blocks+embedding")
CP_ATTENTION = ("ring", "ulysses")


# --8<-- [start:state_bytes]
# --8<-- [start:state_bytes_c1]
def state_bytes_per_param(precision: str = "mixed") -> tuple[int, int, int]:
# --8<-- [end:state_bytes_c1]
    """Bytes per parameter for (parameters, gradients, optimizer states K) under Adam.

    "mixed" (also "fp16"): 16-bit params (2) and grads (2); K = 12 for the fp32 master
    copy (4), momentum (4) and variance (4) - the ZeRO paper's accounting, §3.1: 16 bytes.
    "bf16": bf16 params (2), gradients accumulated and reduced in fp32 (4, Megatron-LM's main grads,
    as minimega's bf16 policy keeps them), K = 12: 18 bytes, Megatron's bf16 row.
    "fp32": fp32 params (4) and grads (4); K = 8 for momentum and variance, no master copy.
    "fp8": as "bf16" (18 bytes): the fp8 linears (`minimega.train.fp8`, Transformer Engine's recipe) keep bf16 weights
    and cast them, the activations and the gradients to fp8 per matmul; the casts are transient, not states.
    """
    # --8<-- [start:state_bytes_c2]
    if precision in ("mixed", "fp16"):
        return 2, 2, 12
    if precision in ("bf16", "fp8"):
        return 2, 4, 12
    if precision == "fp32":
        return 4, 4, 8
    raise ValueError(f"precision {precision!r}: expected one of {PRECISIONS}")
    # --8<-- [end:state_bytes_c2]
# --8<-- [end:state_bytes]


def _check_stage_dp(stage: int, dp: int) -> None:
    if stage not in STAGES:
        raise ValueError(f"stage {stage!r}: expected one of {STAGES}")
    if not (isinstance(dp, int) and dp >= 1):
        raise ValueError(f"dp {dp!r}: expected an integer >= 1")


# --8<-- [start:model_state_bytes]
# --8<-- [start:state_breakdown]
# --8<-- [start:state_breakdown_c1]
def model_state_breakdown(n_params: float, dp: int, stage: int, precision: str = "mixed", *,
                          grad_bytes: int | None = None) -> dict:
# --8<-- [end:state_breakdown_c1]
    """Per-rank bytes of parameters, gradients and optimizer states (ZeRO paper, Fig. 1).

    Stage 0 (DDP) replicates all three. Each ZeRO stage shards one more of them over the dp ranks:
    stage 1 the optimizer states (P_os), stage 2 also the gradients (P_os+g), stage 3 also the
    parameters (P_os+g+p). `grad_bytes` overrides the gradient width: 4 for an fp16 ("mixed") model
    whose gradients accumulate in an fp32 buffer ("bf16" counts such a buffer already).
    """
    # --8<-- [start:state_breakdown_c2]
    _check_stage_dp(stage, dp)
    p, g, k = state_bytes_per_param(precision)
    g = g if grad_bytes is None else grad_bytes
    return {
        "params": p * n_params / (dp if stage >= 3 else 1),
        "grads": g * n_params / (dp if stage >= 2 else 1),
        "optimizer": k * n_params / (dp if stage >= 1 else 1),
    }
    # --8<-- [end:state_breakdown_c2]
# --8<-- [end:state_breakdown]


def model_state_bytes(n_params: float, dp: int, stage: int, precision: str = "mixed") -> float:
    """Model-state bytes per rank, the ZeRO paper's Figure 1 / Table 1 formulas.

        stage 0: (2 + 2 + K)·Ψ           stage 2: 2Ψ + (2 + K)·Ψ/N_d
        stage 1: 2Ψ + 2Ψ + K·Ψ/N_d       stage 3: (2 + 2 + K)·Ψ/N_d

    with K = 12 in mixed precision. Ψ = 7.5e9, N_d = 64 gives 120, 31.4, 16.6 and 1.9 GB.
    "bf16" puts 4 (fp32 gradients) for the second 2: 18Ψ without sharding, Megatron's bf16 row.
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
                      prefetch: bool = True, overlap: bool = True, offload: bool = False,
                      in_flight: int | None = 1, accumulation: int = 1) -> dict:
    """Peak bytes per rank by category during a step of minimega's DDP (stage 0) or ZeRO 1-3 with Adam.

    ``units``: the element count of each parameter, grouped by ZeRO unit in forward order (embeddings,
    each block, the head: `zero.stages.model_units`). With N_u a unit's numel, P_u = padded(N_u, dp),
    n = dp and e the bytes of the parameters' dtype (fp32: 4; bf16: 2, with fp32 masters, ZeRO only),
    each category's largest value over forward, backward and the step:

        params            stage 0-2: Σ N_u·e (0: unpadded) | stage 3: the shards, Σ P_u/n·e
        gathered          stage 3: the reused gather buffers (`zero.flat.GatherSlots`), S = 2 with prefetch (the unit
                          that computes and the next), 1 without; unit k in buffer k mod S, each as large as
                          its largest unit: Σ_s max_{k ≡ s} P_k·e | 0 at dp = 1 (the shard is the whole unit)
        master            bf16: the fp32 master shards, Σ P_u/n·4 (fp32: the shards are their own masters)
        grads             in fp32 under both policies (g = 4: bf16 gradients accumulate and reduce in fp32,
                          Megatron-LM's main_grad, see `precision`), handed to the optimizer in place:
                          stage 0: Σ N_u·g | 1: the flat buffers Σ P_u·g
                          stage 2-3: each shard is born when its unit's reduction retires and released after
                          the step; unit k's full gradients, N_k·g, live until its reduce-scatter starts, which
                          first retires the oldest in flight: with L = min(in_flight, units) and units in
                          backward order, max(max_k (Σ_{j retired by then} P_j/n + N_k), Σ P_u/n)·g, where
                          those retired are all but the L-1 started last; with ``accumulation`` > 1 the
                          second micro-step finds every shard there: Σ P_u/n·g + max_u N_u·g.
                          dp = 1 (no pool): unit k's gradient is flattened into a buffer of its own that becomes
                          its shard, beside its N_k·g: max_k (N_k + Σ_{j up to k} P_j)·g (accumulation > 1:
                          Σ P_u·g + max_u 2N_u·g; offload: max_u 2N_u·g)
                          bf16, stage 1: + the largest parameter's gradient in bf16 (max p·e), which lives beside
                          the whole buffer until the hook adds it into its fp32 main grad (stages 2-3: it lives
                          while its own main grad does not exist yet, so the unit's N_u·g stays the peak)
        optimizer_states  Adam's m and v in fp32: 2·Σ N_u·4 (stage 0) | 2·Σ P_u/n·4
        comm_buffers      what collectives in flight hold beyond the categories above:
                          stage 0: every bucket, Σ N_u·g (all are issued before the first is waited for)
                          stage 1-3: the reduce pool (`zero.flat.BufferPool`), L slots sized by the largest
                          unit, L = min(in_flight, units) (1 without overlap; ``in_flight=None``: no bound):
                          stage 1 the reduce-scatter outputs, L·max_u P_u/n·g (the input is the grads buffer);
                          stage 2-3 each unit's flattened gradient and its output, L·max_u P_u(1 + 1/n)·g;
                          none at dp = 1, where nothing is reduced
        optimizer_step_counters  torch's 0-d fp32 ``step`` per optimizer tensor: one per parameter
                          (stage 0), one per unit (1-3)

    ``offload`` (``offload_optimizer``, stages 1-3) counts the device only: master, optimizer states and
    step counters live on the host (0 here), and so do the reduced gradient shards, so grads are
    stage 1: the flat buffers Σ P_u·g | stage 2-3: one unit's full gradients, max_u N_u·g.

    Activations (tensors saved for backward) are those of `model.py` on the rank's rows in the same dtype:
    measured by `train.activation_checkpoint.saved_activation_bytes`, estimated by `gpt_activation_bytes_per_layer`.
    """
    _check_stage_dp(stage, dp)
    if precision not in ("fp32", "bf16") or (precision == "bf16" and stage == 0):
        raise ValueError(f"peak_memory_bytes: precision={precision!r} at stage {stage}; modelled: fp32 at "
                         "stages 0-3, bf16 at stages 1-3")
    if offload and stage == 0:
        raise ValueError("peak_memory_bytes: offload at stage 0; minimega offloads ZeRO's shards (stages 1-3)")
    e, g, n = (4 if precision == "fp32" else 2), 4, dp     # g: gradients are fp32 under both policies
    N = [sum(u) for u in units]
    P = [padded_numel(x, n) for x in N]
    shard_elems = sum(P) // n
    full, full_g = sum(N if stage == 0 else P) * e, sum(N if stage == 0 else P) * g
    masters = shard_elems * 4 if e != 4 else 0          # fp32 master shards
    # bf16: a parameter's backward gradient (e) lives until the hook adds it into its fp32 main grad
    fold = max(map(max, units)) * e if e != g else 0
    unit_grads = max(N) * g        # 2-3: the bf16 gradient comes while the unit's main grads are not all there
    if in_flight is not None and (isinstance(in_flight, bool) or not isinstance(in_flight, int) or in_flight < 1):
        raise ValueError(f"peak_memory_bytes: in_flight={in_flight!r}; expected an integer >= 1 or None (no bound)")
    slots = 1 if not overlap else min(in_flight or len(units), len(units))    # reductions in flight at most
    out = {"params": shard_elems * e if stage == 3 else full, "gathered": 0, "master": masters,
           "optimizer_states": 2 * 4 * (sum(N) if stage == 0 else shard_elems),
           "optimizer_step_counters": 4 * (sum(len(u) for u in units) if stage == 0 else len(units))}
    if stage == 3 and n > 1:
        gather = min(2 if prefetch else 1, len(P))               # buffers: the unit computing (+ the prefetched)
        out["gathered"] = e * sum(max(P[s::gather]) for s in range(gather))
    staged = max(a + b for a, b in zip(N, P)) * g if n == 1 else unit_grads    # dp = 1: + its own flat buffer
    if offload:                                          # on the host: not this device's bytes
        out.update(master=0, optimizer_states=0, optimizer_step_counters=0)
        out["grads"] = full_g + fold if stage < 2 else staged
    elif stage < 2:
        out["grads"] = full_g + fold
    elif accumulation > 1:
        out["grads"] = shard_elems * g + staged
    elif n == 1:                                         # every earlier unit's shard, this one's born beside N_k
        out["grads"] = g * max(N[k] + sum(P[k:]) for k in range(len(N)))
    else:
        out["grads"] = g * max(shard_elems, *_grads_at_each_start(N, P, n, slots))
    if stage == 0:
        out["comm_buffers"] = full_g
    elif n == 1:
        out["comm_buffers"] = 0                          # no pool: nothing is reduced across ranks
    elif stage == 1:
        out["comm_buffers"] = slots * max(P) // n * g
    else:
        out["comm_buffers"] = slots * (max(P) + max(P) // n) * g
    return out


def _grads_at_each_start(N: list[int], P: list[int], n: int, slots: int) -> list[int]:
    """Elements of gradient a ZeRO-2/3 rank holds as each unit's reduction starts (backward order): that unit's
    full gradients and the shards of the units retired so far, all but the ``slots - 1`` started last."""
    order = list(range(len(N)))[::-1]                  # the backward runs the units in reverse
    return [N[k] + sum(P[j] // n for j in order[:max(0, pos - (slots - 1))]) for pos, k in enumerate(order)]
# --8<-- [end:peak_memory]


# --8<-- [start:checkpoint]
# --8<-- [start:checkpoint_c1]
def checkpoint_bytes(n_params: float, precision: str = "mixed", *, optimizer: bool = True) -> float:
# --8<-- [end:checkpoint_c1]
    """Bytes of a full training checkpoint: the working weights plus, to resume, the optimizer states.

    Mixed precision: 2Ψ for the 16-bit weights and KΨ = 12Ψ for the fp32 master copy, momentum and
    variance. Gradients are not saved; they are rebuilt by the next backward. With
    ``optimizer=False`` only the weights (what inference needs).
    """
    # --8<-- [start:checkpoint_c2]
    p, _, k = state_bytes_per_param(precision)
    return (p + (k if optimizer else 0)) * n_params
    # --8<-- [end:checkpoint_c2]
# --8<-- [end:checkpoint]
