"""Everything per GPU: the memory calculator's inputs (`MemoryConfig`), its answer (`memory_per_gpu`) and presets.

The site's calculator (``course/assets/javascripts/calculator.js``) is tested against `memory_per_gpu`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .activations import ATTENTION, activation_bytes_per_layer, moe_activation_delta, recompute_working_bytes
from .disk import nvme_bytes_per_step
from .memory import (CP_ATTENTION, OFFLOAD, OFFLOAD_DEVICES, PP_PARTITION, PRECISIONS, RECOMPUTE, SCHEDULES,
                     _check_stage_dp, model_state_breakdown, model_state_placement, state_bytes_per_param)
from .pipeline import in_flight_microbatches
from .shapes import MLPS, block_split_params, block_whole_params, kv_width


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
    """Vocabulary V (the token embedding is tied to the output head unless `tied` is False)."""
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
    offload_device: str = "cpu"
    """Where offload keeps the fp32 master and the optimizer states: 'cpu' (host memory) or 'nvme' (files on the node's
    drives, ZeRO-Infinity's disk tier: `TrainConfig.nvme_path`, DeepSpeed's ``offload_optimizer.device: nvme``). The
    gradient shards and, with 'optimizer+params', the 16-bit parameters stay in host memory (`disk.nvme_placement`)."""
    attention: str = "unfused"
    """'unfused' stores the as²b attention scores (Korthikanti's table); 'fused' (FlashAttention,
    SDPA) stores one fp32 log-sum-exp per row and head instead."""
    position_embedding: bool = True
    """A learned s × h position table (GPT-2, GPT-3, MT-NLG); False for ALiBi or RoPE (BLOOM, Llama)."""
    fp32_grads: bool = False
    """fp16 ("mixed", "fp16") gradients accumulate in an fp32 buffer, 4 bytes per parameter instead of 2
    (Megatron's ``--accumulate-allreduce-grads-in-fp32``); "bf16" counts that buffer already (Megatron's
    main grads, DeepSpeed's BF16_Optimizer, minimega's bf16 policy) and "fp32" has nothing to widen."""
    pp_partition: str = "blocks"
    """'blocks': every stage holds ceil(L/p) blocks, the first one also the embedding.
    'blocks+embedding': the embedding counts as one more layer to balance (Megatron-DeepSpeed's
    `type:transformer|embedding`), so the first stage holds ceil((L+2)/p) - 1 blocks."""
    experts: int = 0
    """E experts in every block's MLP, as minimega's `moe.MoEGPT` builds them (no biases, a D·E router); 0: a dense
    MLP. The experts run whole on every tp rank, E/ep of them per rank, replicated over the dp/ep ranks of their
    expert-data-parallel group; from zero_stage 1 on their optimizer states are sharded over that group
    (ZeRO-1 over edp, as minimega's `moe.zero` and DeepSpeed-MoE), their parameters and gradients stay whole."""
    top_k: int = 2
    """Experts each token is sent to (with experts > 0)."""
    capacity_factor: float = 1.25
    """Slots per expert and sequence = capacity_factor · top_k · s / E, rounded up (`moe_capacity`)."""
    ep: int = 1
    """Expert parallelism, carved out of dp: E/ep experts per rank, all-to-all dispatch and combine."""
    expert_ffn: int = 0
    """Each expert's inner width F (with experts > 0); 0: 4·hidden. DeepSeekMoE's fine-grained experts: m·E
    experts of F/m, top m·k (minimega's ``MoEConfig.expert_hidden``)."""
    moe_dispatch: str = "capacity"
    """How tokens reach the experts (``MoEConfig.dispatch``): 'capacity', GShard's slots of C per expert and
    sequence with a one-hot dispatch (quadratic in s); 'dropless', sorted by expert, nothing dropped or padded,
    the only one that composes with cp."""
    shared_experts: int = 0
    """S always-active experts (DeepSeekMoE; ``MoEConfig.n_shared_experts``): one h × S·F × h MLP every token
    passes, whole on every tp rank, its states counted with the non-expert ones (ZeRO over dp)."""
    kv_heads: int = 0
    """Key/value heads (grouped-query attention, ``shapes.kv_width``); 0: one per query head (GPT)."""
    ffn: int = 0
    """The MLP's inner width f; 0: 4·hidden (GPT)."""
    mlp: str = "gelu"
    """'gelu': two h × f matrices (GPT); 'swiglu': three (Llama), saving four f-wide tensors per token."""
    tied: bool = True
    """False: the output head is a V × h matrix of its own (Llama), on the last pipeline stage."""
    bias: bool = True
    """False: no biases and norms with a weight only (RMSNorm, Llama; minimega's `GPTConfig`)."""

    def check(self) -> None:
        for name in ("layers", "hidden", "heads", "vocab", "seq_len", "micro_batch", "tp", "dp", "pp", "cp",
                     "micro_batches", "virtual_stages"):
            if not (isinstance(getattr(self, name), int) and getattr(self, name) >= 1):
                raise ValueError(f"{name}={getattr(self, name)!r}: expected an integer >= 1")
        if self.precision not in PRECISIONS or self.recompute not in RECOMPUTE \
                or self.schedule not in SCHEDULES or self.offload not in OFFLOAD \
                or self.attention not in ATTENTION or self.pp_partition not in PP_PARTITION:
            raise ValueError(f"unknown option in {self}")
        for name in ("sp", "position_embedding", "fp32_grads", "tied", "bias"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}={getattr(self, name)!r}: expected True or False")
        if self.fp32_grads and self.precision in ("fp32", "bf16", "fp8"):
            raise ValueError(f"fp32_grads=True: gradients are already fp32 with precision={self.precision!r}; "
                             "use precision='mixed' or 'fp16', or drop fp32_grads")
        _check_stage_dp(self.zero_stage, self.dp)
        if self.hidden % self.heads or self.heads % self.tp:
            raise ValueError(f"hidden={self.hidden}, heads={self.heads}, tp={self.tp}: "
                             "heads must divide hidden and tp must divide heads")
        if self.offload != "none" and self.zero_stage == 0:
            raise ValueError(f"offload={self.offload!r} needs zero_stage >= 1 (ZeRO-Offload moves ZeRO's optimizer "
                             "shards, as minimega and DeepSpeed do); set zero_stage or offload='none'")
        if self.offload == "optimizer+params" and self.zero_stage != 3:
            raise ValueError("offload='optimizer+params' needs zero_stage=3 (parameters are offloaded as shards)")
        if self.offload_device not in OFFLOAD_DEVICES:
            raise ValueError(f"offload_device={self.offload_device!r}: expected one of {OFFLOAD_DEVICES}")
        if self.offload_device == "nvme" and self.offload == "none":
            raise ValueError("offload_device='nvme' needs offload='optimizer' or 'optimizer+params' (the disk tier holds "
                             "what offload moves off the GPU; --offload --nvme-path DIR); set offload or "
                             "offload_device='cpu'")
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
        self._check_shape()
        self._check_experts()

    def _check_shape(self) -> None:
        for name in ("kv_heads", "ffn"):
            v = getattr(self, name)
            if not (isinstance(v, int) and not isinstance(v, bool) and v >= 0):
                raise ValueError(f"{name}={v!r}: expected an integer >= 0 (0 for GPT's default)")
        if self.mlp not in MLPS:
            raise ValueError(f"mlp={self.mlp!r}: expected one of {MLPS}")
        kv = self.kv_heads or self.heads
        if self.heads % kv or kv % self.tp:
            raise ValueError(f"kv_heads={self.kv_heads}, heads={self.heads}, tp={self.tp}: kv_heads must divide heads "
                             "and tp must divide kv_heads (each tp rank holds whole key/value heads)")
        if self.cp > 1 and self.cp_attention == "ulysses" and kv % (self.tp * self.cp):
            raise ValueError(f"cp_attention='ulysses': kv_heads={kv} is not divisible by tp*cp = {self.tp * self.cp}")
        if self.experts and (self.kv_heads or self.ffn or self.mlp != "gelu" or not self.bias):
            raise ValueError("experts > 0 models minimega's MoE block (GPT's attention and 4h GELU experts): "
                             "leave kv_heads, ffn, mlp and bias at their defaults")

    def _check_experts(self) -> None:
        for name in ("experts", "expert_ffn", "shared_experts"):
            v = getattr(self, name)
            if not (isinstance(v, int) and not isinstance(v, bool) and v >= 0):
                raise ValueError(f"{name}={v!r}: expected an integer >= 0 (0 for the default)")
        if not (isinstance(self.ep, int) and not isinstance(self.ep, bool) and self.ep >= 1):
            raise ValueError(f"ep={self.ep!r}: expected an integer >= 1")
        if self.moe_dispatch not in ("capacity", "dropless"):
            raise ValueError(f"moe_dispatch={self.moe_dispatch!r}: expected 'capacity' or 'dropless'")
        if self.experts == 0:
            if self.ep > 1:
                raise ValueError(f"ep={self.ep} needs experts > 0: a dense MLP has no experts to split")
            if self.moe_dispatch != "capacity":
                raise ValueError(f"moe_dispatch={self.moe_dispatch!r} needs experts > 0; leave it at 'capacity'")
            if self.expert_ffn or self.shared_experts:
                raise ValueError(f"expert_ffn={self.expert_ffn}, shared_experts={self.shared_experts} shape experts: "
                                 "they need experts > 0; leave them at 0 for a dense MLP")
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
        if self.cp > 1 and self.moe_dispatch == "capacity":
            raise ValueError(f"cp={self.cp} with experts and moe_dispatch='capacity': capacity is a budget per whole "
                             "sequence, which cp would cut; use moe_dispatch='dropless' (as the engine does) or cp=1")


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
    each TP rank. With experts: `stage_param_split`. Other block shapes (GQA, SwiGLU, no biases, an untied
    head): `shapes.block_split_params` and `shapes.block_whole_params`.
    """
    return sum(stage_param_split(cfg))


def block_params(cfg: MemoryConfig) -> tuple[float, float]:
    """(non-expert, expert) parameters of one block on one GPU. A MoE block has attention's (4h² + 3h)/t + 5h
    (its LayerNorms and the projection bias whole), an h·E router, S shared experts 2h·S·F and E/ep experts of
    2h·F each (F = expert_ffn or 4h: 8h²), all whole over tp."""
    h, t = cfg.hidden, cfg.tp
    if not cfg.experts:                     # GPT: (12h² + 7h)/t + 6h; any shape: `shapes.block_split_params`
        return block_split_params(cfg) / t + block_whole_params(cfg), 0.0
    f = cfg.expert_ffn or 4 * h
    return ((4 * h * h + 3 * h) / t + 5 * h + h * cfg.experts + 2 * h * cfg.shared_experts * f,
            cfg.experts / cfg.ep * 2 * h * f)


def stage_param_split(cfg: MemoryConfig) -> tuple[float, float]:
    """(non-expert, expert) parameters on one GPU of the first pipeline stage; expert is 0 for a dense model."""
    h, t = cfg.hidden, cfg.tp
    dense, expert = block_params(cfg)
    positions = cfg.seq_len * h if cfg.position_embedding else 0
    final_norm = 2 * h if cfg.bias else h
    embed = cfg.vocab * h / t + positions + (final_norm if cfg.pp == 1 else 0)
    if not cfg.tied and cfg.pp == 1:        # the head's own V × h; with pp > 1 it sits on the last stage
        embed += cfg.vocab * h / t
    return stage_blocks(cfg) * dense + embed, stage_blocks(cfg) * expert


def memory_per_gpu(cfg: MemoryConfig) -> dict:
    """Bytes per GPU by category: model states under ZeRO and offload, plus activations.

    Model states: `model_state_breakdown` of the stage's parameters over dp (dp · cp under context
    parallelism: the cp ranks hold the same parameters). Activations, of the rank's s/cp tokens:
    `activation_bytes_per_layer` × the first stage's blocks × `in_flight_microbatches`, plus the
    recomputation working set (`recompute_working_bytes`, one layer of one micro-batch).
    ZeRO-3 also holds, one block at a time, the parameters it gathers from the other ranks
    ("gathered": a block's 16-bit parameters times (1 - 1/N_d)). Offload splits the states by location
    (`model_state_placement`; "cpu" is the host's share; with ``offload_device='nvme'`` "nvme" is the disk's,
    `disk.nvme_bytes_per_step`, taken from the host's). With experts the expert parameters and gradients are
    whole on every rank (`stage_param_split`), their optimizer states too at stage 0 and sharded over the dp/ep
    ranks of their edp group (times cp: the cp ranks hold the same experts) from stage 1 on, all on the GPU, and each block's activations change by `moe_activation_delta`
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
    nvme = nvme_bytes_per_step(n_dense, replicas, cfg.zero_stage)["read"] if cfg.offload_device == "nvme" else 0.0
    cpu -= nvme                             # the master and Adam's states: 12 bytes a shard element, on disk
    if n_expert:                            # experts: whole on each rank of their expert-data-parallel group,
        edp, stage = cfg.dp // cfg.ep * cfg.cp, min(cfg.zero_stage, 1)   # (edp x cp); Adam's states sharded from 1
        for k, v in model_state_breakdown(n_expert, edp, stage, cfg.precision, grad_bytes=grad_bytes).items():
            states[k] += v                  # stepped by their own optimizer on the GPU (offload or not)
    p_bytes = state_bytes_per_param(cfg.precision)[0]
    h, t = cfg.hidden, cfg.tp
    gathered = p_bytes * block_params(cfg)[0] * (1 - 1 / replicas) if cfg.zero_stage == 3 else 0.0
    act = dict(tp=t, sp=cfg.sp and t > 1, recompute=cfg.recompute, attention=cfg.attention,
               act_bytes=4 if cfg.precision == "fp32" else 2, kv_heads=cfg.kv_heads, ffn=cfg.ffn, mlp=cfg.mlp)
    shape = (cfg.seq_len // cfg.cp, cfg.micro_batch, h, cfg.heads)      # this rank's tokens of each sequence
    moe = moe_activation_delta(*shape[:3], cfg.experts, cfg.top_k, cfg.capacity_factor, tp=t, act_bytes=act["act_bytes"],
                               dispatch=cfg.moe_dispatch, expert_hidden=cfg.expert_ffn or None,
                               n_shared=cfg.shared_experts) if cfg.experts else 0.0
    uly_kept, uly_working = ulysses_activation_bytes(cfg)
    per_layer = activation_bytes_per_layer(*shape, **act) + (0.0 if cfg.recompute == "full" else moe) + uly_kept
    in_flight = in_flight_microbatches(cfg.pp, cfg.micro_batches, cfg.schedule, cfg.virtual_stages) \
        if cfg.pp > 1 else 1.0
    out = {**states, "gathered": gathered, "activations": per_layer * stage_blocks(cfg) * in_flight,
           "recompute": recompute_working_bytes(*shape, **act) + (moe if cfg.recompute == "full" else 0.0)
           + uly_working}
    out["total"] = sum(out.values())
    out["cpu"] = cpu
    out["nvme"] = nvme
    out["stage_params"] = n_dense + n_expert
    return out


def ulysses_activation_bytes(cfg: MemoryConfig) -> tuple[float, float]:
    """(kept per layer, recompute working set) that Ulysses attention adds to ring attention's bytes.

    The attention kernel keeps its output head-split, (b, a/(t·cp), s, h/a), for its backward, while the
    output projection keeps its input sequence-split, (b, s/cp, h/t): e · b · (s/cp) · h/t bytes more per
    layer than ring attention, whose projection input is a view of the kernel's output (measured in
    tests/test_ulysses.py). Recomputation drops it: with 'full' the working set holds it again, with
    'selective' the recomputed core holds its head-split q, k, v and output (four of it; k and v are k/h of it
    under GQA). (0, 0) for ring or cp = 1.
    """
    if cfg.cp == 1 or cfg.cp_attention != "ulysses":
        return 0.0, 0.0
    rows = (4 if cfg.precision == "fp32" else 2) * cfg.micro_batch * (cfg.seq_len // cfg.cp)
    one, kv = rows * cfg.hidden / cfg.tp, rows * kv_width(cfg) / cfg.tp
    return (one if cfg.recompute == "none" else 0.0), {"none": 0.0, "full": one, "selective": 2 * one + 2 * kv}[cfg.recompute]
# --8<-- [end:memory_per_gpu]


PRESETS = {
    "gpt2-124m": dict(layers=12, hidden=768, heads=12, vocab=50257, seq_len=1024),
    "zero-7.5b": dict(layers=36, hidden=4096, heads=32, vocab=51200, seq_len=2048, dp=64),
    "bloom-176b": dict(layers=70, hidden=14336, heads=112, vocab=250880, seq_len=2048, micro_batch=2,
                       precision="bf16", zero_stage=1, tp=4, dp=8, pp=12, recompute="full",
                       micro_batches=128, position_embedding=False, pp_partition="blocks+embedding"),
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
not shard (4 bytes per parameter, which precision="bf16" counts). One GPU of stage 0 holds about 3.98B
parameters.

mt-nlg-530b: Smith et al. 2022 (arXiv:2201.11990) and Korthikanti Table 3: 105 layers, h = 20480,
128 heads, V = 51200, TP 8 x PP 35, micro-batch 1; DP 8 on 2240 GPUs with global batch 1920, so
m = 240; its data parallelism is ZeRO-powered (stage 1, the stage DeepSpeed's pipeline engine runs
with) and it recomputes activations (full checkpointing per layer).
"""

LLAMA = dict(mlp="swiglu", precision="bf16", attention="fused", position_embedding=False, tied=False, bias=False)
"""What the Llama presets share: SwiGLU, bf16, a fused attention kernel, RoPE (no position table), an untied
head, RMSNorm and no biases (Touvron et al. 2023, arXiv:2307.09288 §2.2; Llama 3, arXiv:2407.21783 §3.2)."""

# --8<-- [start:llama_presets]
LLAMA_PRESETS = {
    "llama2-7b": dict(LLAMA, layers=32, hidden=4096, heads=32, ffn=11008, vocab=32000, seq_len=4096),
    "llama2-70b": dict(LLAMA, layers=80, hidden=8192, heads=64, kv_heads=8, ffn=28672, vocab=32000, seq_len=4096),
    "llama3-8b": dict(LLAMA, layers=32, hidden=4096, heads=32, kv_heads=8, ffn=14336, vocab=128256, seq_len=8192),
    "llama3-70b": dict(LLAMA, layers=80, hidden=8192, heads=64, kv_heads=8, ffn=28672, vocab=128256, seq_len=8192),
    "llama3-405b": dict(LLAMA, layers=126, hidden=16384, heads=128, kv_heads=8, ffn=53248, vocab=128256,
                        seq_len=8192),
}
# --8<-- [end:llama_presets]
"""Llama shapes, the model only (dp = tp = pp = 1 until a layout is chosen: ``minimega plan --model llama3-405b``).

Llama 2 (Touvron et al. 2023, arXiv:2307.09288): Table 1 gives the 4k context and GQA for the 70B (not the
7B); layers, width, heads, key/value heads and the SwiGLU width are those of Meta's released ``config.json``
(Llama-2-7b-hf: 32 layers, hidden_size 4096, 32 heads, 32 key/value heads, intermediate_size 11008,
vocab_size 32000; Llama-2-70b-hf: 80, 8192, 64, 8, 28672, 32000). Parameters: 6,738,415,616 and
68,976,648,192 (published: 6.74B and 68.98B).

Llama 3 (Llama Team 2024, "The Llama 3 Herd of Models", arXiv:2407.21783, Table 3): 8B / 70B / 405B have
32 / 80 / 126 layers, model dimension 4096 / 8192 / 16384, FFN dimension 14336 / 28672 / 53248, 32 / 64 / 128
attention heads and 8 key/value heads, a 128K vocabulary (the released configs: vocab_size 128256); 8K
sequences in pre-training (§3.4.1). Parameters: 8,030,261,248, 70,553,706,496 and 405,853,388,800
(published: 8.03B, 70.6B and 405B). ``tests/test_shapes.py`` checks each against the published count.
"""
PRESETS.update(LLAMA_PRESETS)
