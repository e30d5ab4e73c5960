"""Predicted step time, tokens/s and MFU of one training layout: an α-β + roofline model.

Pure functions of a few integers and a `Hardware` (``hardware.py``); no torch. Memory and FLOPs come from
the estimators beside it (``calculator.memory_per_gpu``, ``flops``): a plan never disagrees with the calculator.

The model, phase by phase, for the slowest pipeline stage of one step:

    1. Compute. Every op of a transformer layer (``layer_ops``) costs its roofline time
       max(FLOPs / (peak · matmul_efficiency), bytes / (HBM · memory_efficiency)): GEMMs are compute-bound,
       LayerNorm, softmax, dropout, GeLU and residual adds are memory-bound. Backward costs twice the
       forward; full recomputation adds one forward (8Ψ FLOPs per token instead of 6Ψ), selective
       recomputation only the attention core (Korthikanti et al. 2022).
    2. Tensor parallelism sits on the critical path: two all-reduces forward and two backward per layer
       on a (b, s, h) tensor (Narayanan et al. 2021 §3.2), two more when the forward is recomputed.
    3. Pipeline: (m + (p-1)/v) slots of one micro-batch's forward + backward on the slowest stage
       (bubble (p-1)/(v·m), §2.2), each slot also paying its two p2p transfers. ZB-H1 idles
       (p-1)(t_F + t_B - t_W) (Qi et al. 2023 §2.1), the weight gradient t_W half the backward: slot - backward.
    4. Data parallelism: DDP and ZeRO-1/2 reduce gradients in buckets that overlap the last backward
       when pp = 1; with pp > 1 the reduction waits for the pipeline flush (Megatron, DeepSpeed) and is
       exposed. ZeRO-1/2 then all-gather the updated parameters, exposed. ZeRO-3 gathers each layer's
       parameters before its forward and backward and reduce-scatters its gradients, per micro-batch,
       hiding each behind the neighbouring layer's compute: only the excess is exposed.
    5. The optimizer step: Adam reads and writes its states, memory-bound, on its shard.
    6. Offload (ZeRO-Offload, Ren et al. 2021): with offload='optimizer' the reduced gradient shard goes
       down PCIe during the last backward (only the excess is exposed; all of it with pp > 1), Adam runs
       on the CPU at host memory bandwidth, and the updated 16-bit shard comes back up, exposed, before
       the all-gather. With 'optimizer+params' (ZeRO-3) each layer's parameter shard also comes up PCIe
       before its gather, forward and backward, hidden behind compute like the gathers themselves. With
       offload_device='nvme' the states live on disk, read and written each step (``perf_offload``).
    7. Mixture of experts (``experts > 0``, minimega's `moe.MoELayer`): the MLP's ops become the router,
       the dense dispatch and combine and the experts' GEMMs over their capacity slots, each expert h → F → h
       (``expert_ffn``), plus the shared experts' dense MLP over every token (``shared_experts``; ``moe_ops``); the
       layer runs whole on every tp rank (one tp all-reduce per pass, not two); its four all-to-alls per
       layer and micro-batch sit on the critical path (``ep_comm``); expert gradients are all-reduced over
       the dp/ep ranks holding the same experts, bucketed like DDP's, or from zero_stage 1 on reduce-scattered
       and the experts all-gathered there, Adam stepping 1/(dp/ep) of them (ZeRO-1 over edp, `moe.zero`).
    8. FP8 (precision='fp8', Transformer Engine's recipe as `minimega.train.fp8` runs it): the blocks' linear GEMMs
       (`FP8_GEMMS`, forward and backward) run at `Hardware.fp8_flops`; attention's core, the head and the
       element-wise ops stay bf16. ZeRO-3 gathers the linears' weights as E4M3 bytes (`zero.fp8_gather`).

Collectives use the α-β model (Thakur, Rabenseifner and Gropp 2005, ``hardware.collective_time``) on the
link tier the group spans.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace

from .. import analysis as est
from .hardware import (ALGORITHMS, COLLECTIVES, HARDWARE, Hardware, Link, collective_time, hardware,
                       moe_alltoall_time)
from .perf_moe import moe_ops
from .perf_offload import optimizer_time

STACKS = {"megatron": 1.0, "megatron-deepspeed": 0.77}
"""Per-micro-batch efficiency of the training stack's pipeline engine relative to Megatron-LM's own.

The 530B shape (105 layers, h = 20480, TP 8 x PP 35) ran at 163 TFLOP/s per GPU under Megatron-LM
(Narayanan et al. 2021 Table 1, 2520 GPUs) and at 126 under Megatron-DeepSpeed (MT-NLG, Smith et al.
2022, 2240 GPUs), on the same A100 cluster type with nearly the same layout. Nothing in this model
(FLOPs, bytes, collectives) tells the two apart, so the ratio is fitted once, 126 / 163.4 (this model's
prediction for MT-NLG's layout) = 0.77, on that one row; MT-NLG at 2800 and 3360 GPUs and BLOOM-176B
(also Megatron-DeepSpeed) are then predictions."""


# ----------------------------------------------------------------------------------------------
# The layout

@dataclass(frozen=True, kw_only=True)
class PerfConfig(est.MemoryConfig):
    """A model, a layout and a global batch: the memory calculator's inputs plus what time needs.

    `micro_batches` is derived: m = global_batch / (dp · micro_batch).
    """
    micro_batches: int = field(default=1, init=False)
    """Derived, m = global_batch / (dp · micro_batch); not an argument."""
    global_batch: int = 1
    """Sequences per optimizer step B."""
    dropout: bool = True
    """Dropout after attention and on the residuals (GPT-3 and MT-NLG: 0.1; BLOOM: none)."""
    bucket_bytes: float = 25e6
    """Gradient bucket size for DDP/ZeRO-1/2 reductions (torch DDP's 25 MB)."""
    stack: str = "megatron"
    """Whose pipeline engine runs the step, one of `STACKS`."""
    overlap_comm: bool = True
    """False: nothing hides behind compute, every data-parallel collective and offload copy is exposed
    (DeepSpeed's ``overlap_comm: false``, `TrainConfig.overlap_comm`; or a CPU with no core free for the
    communication thread)."""

    def __post_init__(self):
        if not (isinstance(self.global_batch, int) and self.global_batch >= 1):
            raise ValueError(f"global_batch={self.global_batch!r}: expected an integer >= 1")
        per = self.dp * self.micro_batch
        if self.global_batch % per:
            raise ValueError(f"global_batch={self.global_batch} is not a multiple of dp*micro_batch = "
                             f"{self.dp}*{self.micro_batch} = {per}")
        object.__setattr__(self, "micro_batches", self.global_batch // per)

    def check(self) -> None:
        super().check()
        if self.precision == "fp8" and self.experts:
            raise ValueError(f"precision='fp8' with experts={self.experts}: minimega's fp8 linears are the dense blocks' "
                             "(the experts are not converted); use precision='bf16' or experts=0")
        if self.zero_stage >= 2 and self.pp > 1:
            raise ValueError(f"zero_stage={self.zero_stage} with pp={self.pp}: ZeRO-2/3 do not compose with "
                             "pipeline parallelism (they would reduce every micro-batch); use zero_stage <= 1")
        if self.schedule == "interleaved":
            if self.pp == 1 or self.virtual_stages < 2:
                raise ValueError("schedule='interleaved' needs pp > 1 and virtual_stages >= 2")
            if self.layers % (self.pp * self.virtual_stages):
                raise ValueError(f"interleaved: layers={self.layers} is not a multiple of pp*v = "
                                 f"{self.pp * self.virtual_stages}")
            if self.micro_batches % self.pp:
                raise ValueError(f"interleaved: micro-batches m={self.micro_batches} must be a multiple of pp={self.pp}")
        elif self.virtual_stages != 1:
            raise ValueError(f"virtual_stages={self.virtual_stages} needs schedule='interleaved'")
        if not isinstance(self.overlap_comm, bool):
            raise ValueError(f"overlap_comm={self.overlap_comm!r}: expected True or False")
        if self.stack not in STACKS:
            raise ValueError(f"stack={self.stack!r}: expected one of {sorted(STACKS)}")

    @property
    def n_gpus(self) -> int:
        return self.dp * self.cp * self.tp * self.pp

    def memory_config(self) -> est.MemoryConfig:
        names = {f for f in est.MemoryConfig.__dataclass_fields__}
        return est.MemoryConfig(**{k: v for k, v in asdict(self).items() if k in names})


# ----------------------------------------------------------------------------------------------
# Roofline: the ops of one layer

# --8<-- [start:layer_ops]
def layer_ops(cfg: PerfConfig) -> list[tuple[str, float, float]]:
    """(name, FLOPs, bytes moved to and from HBM) of one layer's forward, one micro-batch, one GPU.

    N = s·b tokens, h_t = h/t the local width, a_t = a/t the local heads, e bytes per element. Matmuls
    read both operands and write the result; element-wise ops read and write their tensors once
    (Megatron's fused scale-mask-softmax counts as one). Under sequence parallelism the replicated
    region (LayerNorms, dropout, residual) works on N/t tokens. "fused" attention (FlashAttention)
    never writes the s × s scores: its FLOPs stay, its bytes are q, k, v and the output. Under context
    parallelism N = (s/cp)·b, the rank's tokens; its queries still see all s keys (ring attention, fused).
    """
    s, b, h, a, t = cfg.seq_len, cfg.micro_batch, cfg.hidden, cfg.heads, cfg.tp
    e = 4 if cfg.precision == "fp32" else 2
    N, ht, at = s // cfg.cp * b, h / t, a / t
    qkv, kt, ft = (h + 2 * est.kv_width(cfg)) / t, est.kv_width(cfg) / t, est.ffn_width(cfg) / t   # GPT: 3h, h, 4h /t
    rep = t if (cfg.sp and t > 1) else 1
    drop = 1 if cfg.dropout else 0
    ops = [("layernorm", 8 * N * h / rep, 2 * N * h * e / rep),
           ("qkv", 2 * N * h * qkv, e * (N * h + h * qkv + N * qkv))]
    if cfg.attention == "fused":
        ops.append(("attention (fused)", 4 * N * s * ht, e * (2 * N * ht + 2 * N * kt)))
    else:
        scores = at * s * N                              # a/t · s · s · b elements
        ops += [("scores q·kᵀ", 2 * N * s * ht, e * (N * ht + N * kt + scores)),
                ("softmax", 5 * scores, 2 * e * scores)]
        if drop:
            ops.append(("attention dropout", scores, 2 * e * scores + scores))
        ops.append(("scores·v", 2 * N * s * ht, e * (scores + N * kt + N * ht)))
    ops += [("proj", 2 * N * ht * h, e * (N * ht + ht * h + N * h)),
            ("dropout+residual", 3 * N * h / rep, (3 * e + drop) * N * h / rep),
            ("layernorm", 8 * N * h / rep, 2 * N * h * e / rep)]
    up = ("fc1", 2 * N * h * ft, e * (N * h + h * ft + N * ft))
    down = ("fc2", 2 * N * ft * h, e * (N * ft + ft * h + N * h))
    if cfg.experts:
        ops += moe_ops(cfg)
    elif cfg.mlp == "swiglu":                 # gate and up GEMMs, silu(gate)·up (reads 2, writes 1), down
        ops += [("gate", *up[1:]), ("up", *up[1:]), ("silu·mul", 6 * N * ft, 3 * e * N * ft), down]
    else:
        ops += [up, ("gelu", 8 * N * ft, 2 * e * N * ft), down]
    ops.append(("dropout+residual", 3 * N * h / rep, (3 * e + drop) * N * h / rep))
    return ops
# --8<-- [end:layer_ops]


ATTENTION_CORE = ("scores q·kᵀ", "softmax", "attention dropout", "scores·v", "attention (fused)")
FP8_GEMMS = ("qkv", "proj", "fc1", "fc2", "gate", "up")
"""The ops `minimega.train.fp8.convert` turns into fp8 linears: the blocks' Linear layers, nothing else."""


def head_ops(cfg: PerfConfig) -> list[tuple[str, float, float]]:
    """The output layer's forward on the last stage: logits GEMM (vocabulary split over tp) and an fp32
    cross-entropy over the local logits."""
    N, h, Vt = cfg.seq_len // cfg.cp * cfg.micro_batch, cfg.hidden, cfg.vocab / cfg.tp
    e = 4 if cfg.precision == "fp32" else 2
    return [("logits", 2 * N * h * Vt, e * (N * h + h * Vt + N * Vt)),
            ("cross-entropy", 5 * N * Vt, (e + 4 + 4) * N * Vt)]


def _hw(hw: Hardware | str) -> Hardware:
    return hardware(hw) if isinstance(hw, str) else hw


def op_time(flops: float, bytes_: float, hw: Hardware, peak: float | None = None) -> float:
    """Roofline time of one op: the slower of its compute (at ``peak``, default the 16-bit rate) and its memory traffic."""
    return max(flops / ((peak or hw.peak_flops) * hw.matmul_efficiency),
               bytes_ / (hw.hbm_bandwidth * hw.memory_efficiency))


def op_peak(cfg: PerfConfig, hw: Hardware, name: str) -> float:
    """The tensor-core rate op `name` runs at: fp8 for the linears under precision='fp8', else 16-bit."""
    return hw.fp8_flops if cfg.precision == "fp8" and name in FP8_GEMMS else hw.peak_flops


def roofline(cfg: PerfConfig, hw: Hardware | str) -> list[dict]:
    """Each forward op with its arithmetic intensity (FLOP/byte) and whether it is compute- or memory-bound."""
    hw = _hw(hw)
    return [{"op": name, "flops": f, "bytes": by, "intensity": f / by, "bound": "compute" if f / by >= hw.ridge
             else "memory", "seconds": op_time(f, by, hw, op_peak(cfg, hw, name))}
            for name, f, by in layer_ops(cfg) + head_ops(cfg)]


# ----------------------------------------------------------------------------------------------
# One micro-batch on one stage

def _stage_layers(cfg: PerfConfig) -> tuple[int, int]:
    """(blocks on the first stage, blocks on the last): the last also holds the head."""
    if cfg.pp == 1:
        return cfg.layers, cfg.layers
    if cfg.pp_partition == "blocks+embedding":
        per = math.ceil((cfg.layers + 2) / cfg.pp)
        return min(cfg.layers, per - 1), min(cfg.layers, per - 1)
    per = math.ceil(cfg.layers / cfg.pp)
    return per, per


def layer_times(cfg: PerfConfig, hw: Hardware | str) -> dict:
    """Seconds of one layer for one micro-batch: forward, backward, recompute, TP and CP communication."""
    hw = _hw(hw)
    ops = layer_ops(cfg)
    fwd = sum(op_time(f, b, hw, op_peak(cfg, hw, name)) for name, f, b in ops)    # backward: twice, fp8 GEMMs too
    core = sum(op_time(f, b, hw) for name, f, b in ops if name in ATTENTION_CORE)
    recompute = {"none": 0.0, "selective": core, "full": fwd}[cfg.recompute]
    e = 4 if cfg.precision == "fp32" else 2
    tp_link = hw.link(cfg.tp, cfg.n_gpus)
    tokens = cfg.seq_len // cfg.cp * cfg.micro_batch
    ar = collective_time("all_reduce", tokens * cfg.hidden * e, cfg.tp, tp_link)
    per_pass = 1 if cfg.experts else 2                 # a MoE MLP is whole on every tp rank: no all-reduce of its own
    n_ar = 2 * per_pass + (per_pass if cfg.recompute == "full" else 0)
    ep_comm = 0.0
    if cfg.experts and cfg.ep > 1:                     # dispatch + combine, forward and backward (and the recompute)
        rows = (tokens * cfg.top_k if cfg.moe_dispatch == "dropless"       # the routed rows, or the capacity slots
                else cfg.micro_batch * cfg.experts * est.moe_capacity(cfg.seq_len, cfg.experts, cfg.top_k,
                                                                       cfg.capacity_factor))
        size = rows * cfg.hidden * e
        a2a = collective_time("all_to_all", size, cfg.ep, hw.link(cfg.tp * cfg.ep, cfg.n_gpus))
        ep_comm = (4 + (2 if cfg.recompute == "full" else 0)) * a2a
    cp_comm = ulysses_attention_time(cfg, hw) if cfg.cp_attention == "ulysses" else ring_attention_time(cfg, hw, core)
    return {"forward": fwd, "backward": 2 * fwd, "recompute": recompute, "tp_comm": n_ar * ar, "ep_comm": ep_comm,
            "cp_comm": cp_comm}


# --8<-- [start:ring_attention_time]
def ring_attention_time(cfg: PerfConfig, hw: Hardware | str, core: float) -> float:
    """Exposed seconds of one layer's ring attention (`minimega.parallel.context`), one micro-batch.

    A hop sends one K/V block, 2·b·(s/cp)·(h/t) elements, to the next rank of the ring (α + S/β on the link
    spanning cp·tp ranks). The forward makes cp-1 hops while computing the attention core (``core`` seconds),
    the backward 2·cp-1 (K/V and the dK/dV accumulators) behind twice that; only the excess shows, or all of
    it without overlap. Recomputation (selective or full) runs the forward's ring again.
    """
    if cfg.cp == 1:
        return 0.0
    hw = _hw(hw)
    e = 4 if cfg.precision == "fp32" else 2
    block = 2 * cfg.micro_batch * (cfg.seq_len // cfg.cp) * est.kv_width(cfg) / cfg.tp * e     # K and V
    hop = collective_time("send_recv", block, 2, hw.link(cfg.cp * cfg.tp, cfg.n_gpus))
    fwd, bwd = (cfg.cp - 1) * hop, (2 * cfg.cp - 1) * hop
    if cfg.overlap_comm:
        fwd, bwd = max(0.0, fwd - core), max(0.0, bwd - 2 * core)
    return fwd + bwd + (fwd if cfg.recompute != "none" else 0.0)
# --8<-- [end:ring_attention_time]


# --8<-- [start:ulysses_attention_time]
def ulysses_attention_time(cfg: PerfConfig, hw: Hardware | str) -> float:
    """Seconds of one layer's Ulysses all-to-alls (`minimega.parallel.ulysses`), one micro-batch.

    Four all-to-alls forward (q, k, v and the output) and four backward, each over this rank's
    b·(s/cp)·(h/t) elements on the link spanning cp·tp ranks; recomputation runs the forward's four again.
    All on the critical path: the attention kernel waits for q, k, v, and the projection for the output.
    """
    if cfg.cp == 1:
        return 0.0
    hw = _hw(hw)
    e = 4 if cfg.precision == "fp32" else 2
    rows, link = cfg.micro_batch * (cfg.seq_len // cfg.cp), hw.link(cfg.cp * cfg.tp, cfg.n_gpus)
    q_out = collective_time("all_to_all", rows * cfg.hidden / cfg.tp * e, cfg.cp, link)     # q and the output
    kv = collective_time("all_to_all", rows * est.kv_width(cfg) / cfg.tp * e, cfg.cp, link)  # k, v (GQA: k wide)
    return (2 + (1 if cfg.recompute != "none" else 0)) * (2 * q_out + 2 * kv)
# --8<-- [end:ulysses_attention_time]


def microbatch_time(cfg: PerfConfig, hw: Hardware | str) -> dict:
    """Forward + backward of one micro-batch on the slowest stage, by part (seconds)."""
    hw = _hw(hw)
    lt = layer_times(cfg, hw)
    first, last = _stage_layers(cfg)
    head = sum(op_time(f, b, hw) for _, f, b in head_ops(cfg)) * 3          # forward + 2x backward
    e = 4 if cfg.precision == "fp32" else 2
    head_tp = collective_time("all_reduce", cfg.seq_len // cfg.cp * cfg.micro_batch * cfg.hidden * e, cfg.tp,
                              hw.link(cfg.tp, cfg.n_gpus))
    per_layer = lt["forward"] + lt["backward"] + lt["recompute"]
    stages = {"first": first * per_layer + (0 if cfg.pp > 1 else head),
              "last": last * per_layer + head}
    slow = max(stages, key=stages.get)
    blocks = first if slow == "first" else last
    with_head = slow == "last" or cfg.pp == 1
    return {"forward": blocks * lt["forward"] + (head / 3 if with_head else 0),
            "backward": blocks * lt["backward"] + (2 * head / 3 if with_head else 0),
            "recompute": blocks * lt["recompute"],
            "tp_comm": blocks * lt["tp_comm"] + (head_tp if with_head else 0),
            "ep_comm": blocks * lt["ep_comm"], "cp_comm": blocks * lt["cp_comm"], "blocks": blocks}


# ----------------------------------------------------------------------------------------------
# The step

def _dp_group_span(cfg: PerfConfig) -> int:
    return cfg.tp * cfg.cp * cfg.dp     # grid (pp, dp, cp, tp): a dp·cp group spans tp·cp·dp consecutive ranks


def _bucketed(op: str, size: float, n: int, link: Link, bucket: float) -> tuple[float, float]:
    """(total seconds, seconds of the last bucket) for a reduction sent in buckets of `bucket` bytes."""
    k = max(1, math.ceil(size / bucket))
    one = collective_time(op, size / k, n, link)
    return k * one, one


# --8<-- [start:step_time]
def step_time(cfg: PerfConfig, hw: Hardware | str = "a100-80gb") -> dict:
    """Predicted seconds of one optimizer step, by part, with tokens/s, MFU and memory per GPU.

    Returns a dict: ``compute`` (forward + backward + recompute over all micro-batches), ``tp_comm``,
    ``ep_comm`` (the expert all-to-alls, on the critical path), ``cp_comm`` (exposed ring attention,
    `ring_attention_time`, or Ulysses' all-to-alls, `ulysses_attention_time`), ``p2p``, ``bubble``,
    ``stack_overhead`` (see `STACKS`), ``dp_comm`` (exposed; over dp·cp, the ranks holding the same
    parameters), ``offload`` (exposed PCIe transfers), ``optimizer`` (on the CPU when offloaded), ``disk`` (exposed
    NVMe reads and writes, `perf_offload.disk_time`), ``total``,
    ``tokens_per_s``, ``tflops_per_gpu`` (Narayanan's Eq. 3 hardware FLOPs with full recomputation, what
    Megatron-DeepSpeed's 2022 logs print), ``model_tflops_per_gpu`` (model FLOPs: what MFU divides by the peak),
    ``mfu`` (model FLOPs, Korthikanti App. A), ``hfu``, ``memory`` (`estimate.memory_per_gpu`), ``fits``.
    """
    hw = _hw(hw)
    hw.check()
    cfg.check()
    if cfg.precision == "fp8" and hw.fp8_flops is None:
        raise ValueError(f"precision='fp8' on {hw.name}: it has no fp8 tensor cores (Hardware.fp8_flops is None); "
                         "use precision='bf16' or a GPU with fp8 (h100, h200, b200, gb200-nvl72, mi300x)")
    mb = microbatch_time(cfg, hw)
    m, p, v = cfg.micro_batches, cfg.pp, cfg.virtual_stages
    e = 4 if cfg.precision == "fp32" else 2
    # p2p: one activation forward and one gradient backward per micro-batch and chunk boundary; with
    # tp > 1 each tp rank sends its 1/t slice (Narayanan §4.1, scatter/gather).
    p2p = 0.0
    if p > 1:
        msg = cfg.seq_len // cfg.cp * cfg.micro_batch * cfg.hidden * e / cfg.tp
        p2p = 2 * v * collective_time("send_recv", msg, 2, hw.link(cfg.n_gpus, cfg.n_gpus))
    slot = mb["forward"] + mb["backward"] + mb["recompute"] + mb["tp_comm"] + mb["ep_comm"] + mb["cp_comm"] + p2p
    bubble = (p - 1) / v * (slot - (mb["backward"] if cfg.schedule == "zb_h1" else 0.0)) if p > 1 else 0.0
    stack_overhead = (m + (p - 1) / v) * slot * (1 / STACKS[cfg.stack] - 1)
    # data parallelism: gradients averaged (ZeRO sharded) over the dp·cp ranks holding the same parameters
    n_stage, n_expert = est.stage_param_split(cfg.memory_config())
    replicas = cfg.dp * cfg.cp
    grad_b = est.state_bytes_per_param(cfg.precision)[1] if not cfg.fp32_grads else 4   # bf16: fp32 main grads
    link = hw.link(_dp_group_span(cfg), cfg.n_gpus)
    last_bwd = mb["backward"] + mb["recompute"]
    dp_comm = 0.0
    params_up = cfg.offload == "optimizer+params"
    if replicas > 1:
        if cfg.zero_stage == 3:
            lt = layer_times(cfg, hw)
            h = cfg.hidden
            layer_bytes = ((4 * h * h + 3 * h) / cfg.tp + h * cfg.experts + 2 * h * cfg.shared_experts * (cfg.expert_ffn
                                                                                                   or 4 * h)
                           if cfg.experts
                           else est.block_split_params(cfg) / cfg.tp) * e        # GPT: (12h² + 7h)/t
            fetch = collective_time("send_recv", layer_bytes / replicas, 2, hw.host) if params_up else 0.0
            gathered = est.block_matmul_params(cfg) / cfg.tp if cfg.precision == "fp8" else layer_bytes  # E4M3: 1 B
            ag = fetch + collective_time("all_gather", gathered, replicas, link)
            rs = collective_time("reduce_scatter", layer_bytes * grad_b / e, replicas, link)
            hide_f, hide_b = (lt["forward"], lt["backward"] + lt["recompute"]) if cfg.overlap_comm else (0.0, 0.0)
            per_layer = max(0.0, ag - hide_f) + max(0.0, ag + rs - hide_b)
            dp_comm = m * (mb["blocks"] * per_layer + 2 * ag + rs)        # the first gathers and last reduce wait
        else:
            op = "all_reduce" if cfg.zero_stage == 0 else "reduce_scatter"
            total, last = _bucketed(op, n_stage * grad_b, replicas, link, cfg.bucket_bytes)
            dp_comm = max(last, total - last_bwd) if p == 1 and cfg.overlap_comm else total
            if cfg.zero_stage in (1, 2):
                dp_comm += collective_time("all_gather", n_stage * e, replicas, link)
    edp = cfg.dp // cfg.ep * cfg.cp          # the ranks holding the same experts (edp, times cp)
    if n_expert and edp > 1:               # expert gradients over the expert-data-parallel group: an all-reduce,
        op = "all_reduce" if cfg.zero_stage == 0 else "reduce_scatter"      # or ZeRO-1's reduce-scatter + all-gather
        total, last = _bucketed(op, n_expert * grad_b, edp, link, cfg.bucket_bytes)
        dp_comm += max(last, total - last_bwd) if p == 1 and cfg.overlap_comm else total
        if cfg.zero_stage >= 1:
            dp_comm += collective_time("all_gather", n_expert * e, edp, link)
    # Adam on this rank's shard: on the GPU, or on the CPU with its copies, and its states on disk (`perf_offload`)
    shard = n_stage / (replicas if cfg.zero_stage >= 1 else 1) + n_expert / (edp if cfg.zero_stage >= 1 else 1)
    opt = optimizer_time(cfg, hw, n_stage, shard, grad_b, e, last_bwd)
    # --8<-- [start:step_total]
    compute = m * (mb["forward"] + mb["backward"] + mb["recompute"])
    out = {"compute": compute, "forward": m * mb["forward"], "backward": m * mb["backward"],
           "recompute": m * mb["recompute"], "tp_comm": m * mb["tp_comm"], "ep_comm": m * mb["ep_comm"],
           "cp_comm": m * mb["cp_comm"], "p2p": m * p2p,
           "bubble": bubble, "stack_overhead": stack_overhead, "dp_comm": dp_comm, **opt}
    out["total"] = (compute + out["tp_comm"] + out["ep_comm"] + out["cp_comm"] + out["p2p"] + bubble + stack_overhead
                    + dp_comm + opt["offload"] + opt["optimizer"] + opt["disk"])
    # --8<-- [end:step_total]
    tokens = cfg.global_batch * cfg.seq_len
    model_flops, logged, hw_flops = est.iteration_flops(cfg)         # any block shape (`shapes`)
    n = cfg.n_gpus
    mem = est.memory_per_gpu(cfg.memory_config())
    out.update(tokens_per_s=tokens / out["total"], micro_batches=m, n_gpus=n,
               tflops_per_gpu=logged / out["total"] / n / 1e12,
               model_tflops_per_gpu=model_flops / out["total"] / n / 1e12,
               mfu=model_flops / out["total"] / n / hw.peak_flops,
               hfu=hw_flops / out["total"] / n / hw.peak_flops,
               memory=mem, fits=mem["total"] <= hw.memory_bytes)
    return out
# --8<-- [end:step_time]


def preset_config(name: str, **overrides) -> PerfConfig:
    """A `PerfConfig` from an `estimate.PRESETS` shape (its layout too), global batch from its m, plus overrides."""
    if name not in est.PRESETS:
        raise ValueError(f"model preset {name!r}: expected one of {sorted(est.PRESETS)}")
    base = dict(est.PRESETS[name])
    m = base.pop("micro_batches", 1)
    base.setdefault("global_batch", m * base.get("dp", 1) * base.get("micro_batch", 1))
    if name == "bloom-176b" or name in est.LLAMA_PRESETS:            # BLOOM and Llama train without dropout
        base["dropout"] = False
    if name in ("bloom-176b", "mt-nlg-530b"):
        base["stack"] = "megatron-deepspeed"
    base.update(overrides)
    return PerfConfig(**base)


__all__ = ["ALGORITHMS", "COLLECTIVES", "HARDWARE", "PerfConfig", "collective_time", "hardware", "layer_ops",
           "layer_times", "microbatch_time", "moe_alltoall_time", "op_time", "preset_config", "roofline", "step_time",
           "replace"]
