"""Configuration: the model (`GPTConfig`) and the training run (`TrainConfig`).

Both are frozen dataclasses with a docstring under every field; `minimega train` maps its flags
one-to-one onto `TrainConfig`'s fields, and `TrainConfig.from_deepspeed` reads the DeepSpeed JSON keys
a learner will meet again: each key it accepts changes the run, every other key is refused by name.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

from .config_deepspeed import DS_MAX_BYTES, is_int as _is_int, is_real as _is_real, read_deepspeed


MLPS = ("gelu", "swiglu")
POSITIONS = ("learned", "rope")


@dataclass(frozen=True, kw_only=True)
class GPTConfig:
    """A nanoGPT-shaped decoder: token + position embeddings, pre-LN blocks, causal attention, GELU MLP.

    The defaults are GPT-2's blocks; ``n_kv_head``, ``mlp='swiglu'`` (+ ``ffn_hidden``) and ``position='rope'``
    give Llama's attention, MLP and positions (its norms stay bias-free LayerNorms here, not RMSNorm)."""

    vocab_size: int = 256
    """Tokens; the shipped byte-level tokenizer needs 256 (smaller values fold token ids modulo V)."""
    block_size: int = 64
    """Longest sequence (T) the position embedding covers."""
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 64
    """Hidden size D; D / n_head is the head size."""
    mlp_ratio: int = 4
    """MLP width F = mlp_ratio * D (unless ffn_hidden is set)."""
    dropout: float = 0.0
    bias: bool = False
    """Biases in Linear and LayerNorm. Off by default: the key projection's bias has an exactly zero gradient (softmax
    ignores a constant shift); Adam turns that zero plus float noise into lr-sized updates, so parity is meaningless."""
    n_kv_head: int | None = None
    """Key/value heads (grouped-query attention, Ainslie et al. 2023, arXiv:2305.13245): each serves
    n_head / n_kv_head query heads; must divide n_head. None: n_head (multi-head attention, GPT-2)."""
    mlp: str = "gelu"
    """'gelu': proj(gelu(fc(x))) (GPT-2); 'swiglu': proj(silu(gate(x)) * fc(x)) (Shazeer 2020, arXiv:2002.05202; Llama)."""
    ffn_hidden: int | None = None
    """The MLP's inner width F (Llama 3 405B: 53248); None: mlp_ratio * D."""
    position: str = "learned"
    """'learned': a block_size x D position table added to the token embeddings (GPT-2); 'rope': no table, q and
    k rotated per head by their position (RoPE, Su et al. 2021, arXiv:2104.09864; Llama)."""
    rope_theta: float = 10000.0
    """RoPE's base: pair i of a head turns by position * theta^(-2i/hs). Llama 3 uses 500000. Only with 'rope'."""

    def __post_init__(self):
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd", "mlp_ratio"):
            value = getattr(self, name)
            if not _is_int(value) or value < 1:
                raise ValueError(f"GPTConfig.{name} must be a positive integer, got {value!r}")
        if self.n_embd % self.n_head:
            raise ValueError(f"GPTConfig: n_head={self.n_head} does not divide n_embd={self.n_embd}")
        self._check_llama_fields()
        if not _is_real(self.dropout) or not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"GPTConfig.dropout must be a number in [0, 1), got {self.dropout!r}")
        if not isinstance(self.bias, bool):
            raise ValueError(f"GPTConfig.bias must be True or False, got {self.bias!r}")

    def _check_llama_fields(self) -> None:
        """Grouped-query attention, the MLP kind and width, the positions: type, range, and what needs what."""
        for name in ("n_kv_head", "ffn_hidden"):
            value = getattr(self, name)
            if value is not None and (not _is_int(value) or value < 1):
                raise ValueError(f"GPTConfig.{name} must be a positive integer or None, got {value!r}")
        if self.n_head % self.kv_heads:
            raise ValueError(f"GPTConfig: n_kv_head={self.kv_heads} does not divide n_head={self.n_head} (each key/value "
                             f"head serves n_head/n_kv_head query heads); pick a divisor of {self.n_head}")
        if self.ffn_hidden is not None and self.mlp_ratio != 4:
            raise ValueError(f"GPTConfig: ffn_hidden={self.ffn_hidden} and mlp_ratio={self.mlp_ratio} both set the MLP "
                             f"width; set one (leave mlp_ratio=4 when ffn_hidden is given)")
        for name, allowed in (("mlp", MLPS), ("position", POSITIONS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"GPTConfig.{name}={getattr(self, name)!r}; choose one of {allowed}")
        if not _is_real(self.rope_theta) or self.rope_theta <= 1.0:
            raise ValueError(f"GPTConfig.rope_theta must be a number > 1, got {self.rope_theta!r}")
        if self.position != "rope" and self.rope_theta != 10000.0:
            raise ValueError(f"GPTConfig.rope_theta={self.rope_theta!r} has an effect only with position='rope'; "
                             f"remove it or set position='rope'")
        if self.position == "rope" and self.head_size % 2:
            raise ValueError(f"GPTConfig: position='rope' rotates pairs of a head's features; head size "
                             f"n_embd/n_head = {self.head_size} is odd, pick an even one")

    @property
    def head_size(self) -> int:
        return self.n_embd // self.n_head

    @property
    def kv_heads(self) -> int:
        """Key/value heads: n_kv_head, or n_head when it is None."""
        return self.n_head if self.n_kv_head is None else self.n_kv_head

    @property
    def mlp_hidden(self) -> int:
        return self.mlp_ratio * self.n_embd if self.ffn_hidden is None else self.ffn_hidden

    @classmethod
    def tiny(cls, **overrides) -> "GPTConfig":
        """234,048 parameters: trains in seconds on a CPU core; the preset every test uses."""
        return cls(**{**dict(vocab_size=256, block_size=64, n_layer=4, n_head=4, n_embd=64), **overrides})

    @classmethod
    def small(cls, **overrides) -> "GPTConfig":
        """10.9M parameters: a few steps per second on a laptop CPU."""
        return cls(**{**dict(vocab_size=256, block_size=256, n_layer=6, n_head=6, n_embd=384), **overrides})

    @classmethod
    def gpt2(cls, **overrides) -> "GPTConfig":
        """GPT-2 small's shape (12 x 768, vocabulary padded to 50304): 124M with a tied head, 163M here (untied). For GPUs."""
        return cls(**{**dict(vocab_size=50304, block_size=1024, n_layer=12, n_head=12, n_embd=768), **overrides})

    @classmethod
    def tiny_llama(cls, **overrides) -> "GPTConfig":
        """tiny()'s size with Llama's blocks: 2 key/value heads for 4 query heads, a SwiGLU MLP of width 176, RoPE
        with Llama 3's base 500000 (no position table). For tests of the Llama options."""
        return cls(**{**dict(vocab_size=256, block_size=64, n_layer=4, n_head=4, n_embd=64, n_kv_head=2,
                             mlp="swiglu", ffn_hidden=176, position="rope", rope_theta=500000.0), **overrides})

    @classmethod
    def preset(cls, name: str, **overrides) -> "GPTConfig":
        presets = {"tiny": cls.tiny, "small": cls.small, "gpt2": cls.gpt2, "tiny-llama": cls.tiny_llama}
        if name not in presets:
            raise ValueError(f"unknown preset {name!r}; choose one of {sorted(presets)}")
        return presets[name](**overrides)


PRECISIONS = ("fp32", "bf16", "fp16", "fp8")
CHECKPOINTING = ("none", "full", "selective")
SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b", "zb_h1")
OPTIMIZERS = ("adamw", "adam", "sgd")
CP_ATTENTION = ("ring", "ulysses")


def _check_zb_h1(cfg) -> None:
    """What the split backward (B now, W later from the kept graph) does not run: refused by name."""
    for name, bad, why in (
            ("zero_stage", cfg.zero_stage == 3, "ZeRO-3 frees a unit's parameters when its backward ends; "
                                                "use zero_stage <= 2"),
            ("activation_checkpointing", cfg.activation_checkpointing != "none",
             "a checkpointed block replays its whole backward inside B; use activation_checkpointing='none'"),
            ("cp", cfg.cp != 1, "context parallelism's ring backward is not split into B and W; use cp=1")):
        if bad:
            raise ValueError(f"TrainConfig: schedule='zb_h1' with {name}={getattr(cfg, name)!r}: {why} "
                             f"(or schedule='1f1b')")


def _flag(*names: str, **extra) -> dict:
    """Field metadata: extra command-line spellings for `minimega train` (besides --field-name)."""
    return {"flags": names, **extra}


# [Note: one rule per field]
# Each TrainConfig field is checked for its type and range before anything else, so that a typo in a
# JSON file or a notebook cell fails here, naming the field and what to write instead, rather than
# ten frames deep in torch or, worse, silently: ``True`` is an int in Python and ``"false"`` is truthy.
# Integers must be ints (not bools, not floats), flags must be bools (not 0/1), reals must be finite
# numbers (ints welcome), and each range is the one the code that reads the field needs.
_INT_MIN = {"tp": 1, "pp": 1, "cp": 1, "ep": 1, "micro_batches": 1, "virtual_stages": 1, "batch_size": 1,
            "gradient_accumulation_steps": 1, "checkpoint_every": 1, "seed": 0, "param_persistence_threshold": 0,
            "loss_scale_window": 1, "hysteresis": 1, "reductions_in_flight": 1, "memory_peak_steps": 0}
_REAL = {  # name: (lower bound, lower bound allowed?)
    "lr": (0.0, False), "eps": (0.0, False), "weight_decay": (0.0, True), "gradient_clipping": (0.0, True),
    "bucket_mb": (0.0, False), "loss_scale": (0.0, True), "min_loss_scale": (0.0, False)}
_BOOL = ("sequence_parallel", "offload_optimizer", "prefetch", "overlap_comm", "async_save")
_CHOICES = {"precision": PRECISIONS, "activation_checkpointing": CHECKPOINTING, "schedule": SCHEDULES,
            "optimizer": OPTIMIZERS, "cp_attention": CP_ATTENTION}


def _check_fields(cfg) -> None:
    """Type and range of every TrainConfig field; raises ValueError naming the field and the fix."""
    for name, low in _INT_MIN.items():
        value = getattr(cfg, name)
        if not _is_int(value) or value < low:
            kind = "a positive integer" if low == 1 else "an integer >= 0"
            raise ValueError(f"TrainConfig.{name} must be {kind}, got {value!r}")
    if not _is_int(cfg.zero_stage) or cfg.zero_stage not in (0, 1, 2, 3):
        raise ValueError(f"TrainConfig.zero_stage must be 0, 1, 2 or 3 (an int), got {cfg.zero_stage!r}")
    if cfg.seq_len is not None and (not _is_int(cfg.seq_len) or cfg.seq_len < 1):
        raise ValueError(f"TrainConfig.seq_len must be a positive integer or None, got {cfg.seq_len!r}")
    if not _is_int(cfg.initial_scale_power) or not 0 <= cfg.initial_scale_power <= 63:
        raise ValueError(f"TrainConfig.initial_scale_power must be an integer in [0, 63], got {cfg.initial_scale_power!r}")
    for name, (low, inclusive) in _REAL.items():
        value = getattr(cfg, name)
        if not _is_real(value) or value < low or (value == low and not inclusive):
            bound = ">= 0" if inclusive else "> 0"
            raise ValueError(f"TrainConfig.{name} must be a finite number {bound}, got {value!r}")
    for name in _BOOL:
        value = getattr(cfg, name)
        if not isinstance(value, bool):
            raise ValueError(f"TrainConfig.{name} must be True or False, got {value!r}")
    for name, allowed in _CHOICES.items():
        value = getattr(cfg, name)
        if not isinstance(value, str) or value not in allowed:
            raise ValueError(f"TrainConfig.{name}={value!r}; choose one of {allowed}")
    if cfg.nvme_path is not None and (not isinstance(cfg.nvme_path, str) or not cfg.nvme_path
                                      or "\x00" in cfg.nvme_path):
        raise ValueError(f"TrainConfig.nvme_path must be the path of a directory (a non-empty string) or None, "
                         f"got {cfg.nvme_path!r}")
    betas = cfg.betas
    if (not isinstance(betas, tuple) or len(betas) != 2
            or not all(_is_real(b) and 0.0 <= b < 1.0 for b in betas)):
        raise ValueError(f"TrainConfig.betas must be a tuple of two numbers in [0, 1), got {betas!r}")


# Fields that only some layouts read: a value other than the default elsewhere would be accepted and do
# nothing, so it is refused. (name, default, the condition under which the field is read, what it needs)
_ONLY_WHEN = (
    ("loss_scale", 0.0, lambda c: c.precision == "fp16", "precision='fp16'"),
    ("initial_scale_power", 16, lambda c: c.precision == "fp16", "precision='fp16'"),
    ("loss_scale_window", 1000, lambda c: c.precision == "fp16", "precision='fp16'"),
    ("hysteresis", 2, lambda c: c.precision == "fp16", "precision='fp16'"),
    ("min_loss_scale", 1.0, lambda c: c.precision == "fp16", "precision='fp16'"),
    ("prefetch", True, lambda c: c.zero_stage == 3, "zero_stage=3"),
    ("param_persistence_threshold", 0, lambda c: c.zero_stage == 3, "zero_stage=3"),
    ("reductions_in_flight", 1, lambda c: c.zero_stage >= 1 and c.overlap_comm, "zero_stage >= 1 and overlap_comm"),
    ("checkpoint_every", 1, lambda c: c.activation_checkpointing == "full", "activation_checkpointing='full'"),
    ("cp_attention", "ring", lambda c: c.cp > 1, "cp > 1"),
    ("nvme_path", None, lambda c: c.offload_optimizer, "offload_optimizer=True (--offload)"),
    ("micro_batches", 1, lambda c: c.pp > 1, "pp > 1 (without a pipeline use gradient_accumulation_steps)"),
    ("betas", (0.9, 0.95), lambda c: c.optimizer != "sgd", "optimizer='adamw' or 'adam'"),
    ("eps", 1e-8, lambda c: c.optimizer != "sgd", "optimizer='adamw' or 'adam'"),
)


def _check_used(cfg) -> None:
    for name, default, used, needs in _ONLY_WHEN:
        value = getattr(cfg, name)
        if value != default and not used(cfg):
            raise ValueError(f"TrainConfig.{name}={value!r} has an effect only with {needs}; "
                             f"remove it or set it back to {default!r}")


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """One training run: parallel layout, memory optimisations and the optimizer."""

    # Parallel layout (dp is whatever is left: world size / (tp * pp)).
    tp: int = 1
    """Tensor-parallel degree (Megatron-LM); divides n_head, n_kv_head, n_embd and the MLP width."""
    pp: int = 1
    """Pipeline stages; at most n_layer."""
    cp: int = 1
    """Context parallelism: each sequence split over cp ranks (two chunks each); seq_len must divide by 2·cp."""
    cp_attention: str = "ring"
    """With cp > 1: 'ring' (K/V passed around the ring) or 'ulysses' (all-to-all over heads; cp·tp divides n_head)."""
    ep: int = 1
    """Expert parallelism (mixture-of-experts models only): carved out of dp, divides dp and the expert count."""
    zero_stage: int = field(default=0, metadata=_flag("--zero-stage", "--stage"))
    """0: DDP; 1: shard optimizer states; 2: + gradients; 3: + parameters (DeepSpeed's stages)."""
    sequence_parallel: bool = field(default=False, metadata=_flag("--sp"))
    """Shard LayerNorm/dropout activations along the sequence over the tp group (Korthikanti et al. 2022)."""
    activation_checkpointing: str = field(default="none", metadata=_flag("--ac"))
    """'none', 'full' (recompute every block) or 'selective' (recompute only the attention core)."""
    checkpoint_every: int = 1
    """With full checkpointing, recompute every k-th block only."""
    schedule: str = "1f1b"
    """Pipeline schedule: 'gpipe', '1f1b', 'interleaved_1f1b' or 'zb_h1' (1F1B with the backward split, Qi et al. 2023)."""
    micro_batches: int = 1
    """Pipeline micro-batches per step (m)."""
    virtual_stages: int = 1
    """Model chunks per pipeline rank for the interleaved schedule (v)."""

    # Batch and optimizer.
    batch_size: int = 8
    """Global batch size in sequences (all dp ranks together, all accumulation steps together)."""
    seq_len: int | None = None
    """Tokens per sequence; defaults to the model's block_size."""
    gradient_accumulation_steps: int = 1
    """Micro-steps per optimizer step; each takes batch_size / (dp * accumulation) rows per rank."""
    gradient_clipping: float = 0.0
    """Clip the global gradient norm to this value (0 disables)."""
    optimizer: str = "adamw"
    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    weight_decay: float = 0.0
    seed: int = 0
    """Seeds the model init and the data order."""

    # Memory and communication.
    precision: str = "fp32"
    """'fp32', 'bf16' or 'fp16': the dtype parameters and gradients are stored and communicated in; 'fp8': bf16, with
    the blocks' linears in fp8 (E4M3 forward, E5M2 gradients, delayed scaling) and ZeRO-3 gathering them in fp8."""
    offload_optimizer: bool = field(default=False, metadata=_flag("--offload"))
    """Keep fp32 master weights and optimizer states in a CPU store and step there (ZeRO-Offload)."""
    nvme_path: str | None = None
    """With offload_optimizer: keep the master weights and optimizer states in files under this directory (ZeRO-Infinity)."""
    bucket_mb: float = 25.0
    """Gradient bucket size (MiB) for DDP all-reduces and ZeRO-2 reduce-scatters."""
    param_persistence_threshold: int = 0
    """ZeRO-3: parameters with at most this many elements stay whole on every rank."""
    prefetch: bool = True
    """ZeRO-3: all-gather the next block's parameters while the current one computes."""
    overlap_comm: bool = True
    """Run async collectives in the background (False: each completes before returning; DeepSpeed's ``overlap_comm``)."""
    reductions_in_flight: int = 1
    """ZeRO 1-3: at most this many gradient reductions in flight, each holding a unit's gradient (FSDP2's: 1)."""
    loss_scale: float = 0.0
    """fp16 only: 0 = dynamic loss scaling, > 0 = a fixed scale."""
    initial_scale_power: int = 16
    """fp16 dynamic scaling: the first scale is 2**initial_scale_power (DeepSpeed's default 16)."""
    loss_scale_window: int = 1000
    """fp16 dynamic scaling: clean steps before the scale doubles."""
    hysteresis: int = 2
    """fp16 dynamic scaling: overflows absorbed before the scale halves."""
    min_loss_scale: float = 1.0
    """fp16 dynamic scaling: the scale never drops below this."""

    # Measurement.
    memory_peak_steps: int = 2
    """Steps from the first whose peak bytes by category are sampled after every op (``report()["memory_peak"]``;
    later ones with ``Engine.track_peak``). 0 skips the sampling, which makes a step 2-3x slower on CPU."""

    # Checkpoints.
    async_save: bool = False
    """Engine.save copies the state and returns; a background thread writes and commits the files (one in flight)."""

    def __post_init__(self):
        _check_fields(self)
        if self.offload_optimizer and self.zero_stage == 0:
            raise ValueError("TrainConfig: offload_optimizer needs zero_stage >= 1 "
                             "(ZeRO-Offload moves the sharded optimizer states to the CPU)")
        if self.precision == "fp8" and self.zero_stage == 0:
            raise ValueError("TrainConfig: precision='fp8' needs zero_stage >= 1 (its fp32 masters and scales live "
                             "in the ZeRO optimizer's shards); use bf16 or fp16 with DDP")
        if self.sequence_parallel and self.tp == 1:
            raise ValueError("TrainConfig: sequence_parallel needs tp > 1")
        if self.pp > 1 and self.precision == "fp16":
            raise ValueError(f"TrainConfig: precision='fp16' with pp={self.pp}: the pipeline does not scale its "
                             "losses for fp16; use precision='bf16' (no loss scaling needed) or 'fp32'")
        if self.precision == "fp8" and (wide := [f"{n}={getattr(self, n)}" for n in ("tp", "pp", "cp", "ep")
                                                 if getattr(self, n) > 1]):
            raise ValueError(f"TrainConfig: precision='fp8' with {', '.join(wide)}: the fp8 linears are built for "
                             "dp-only layouts (ZeRO 1-3) here; set those to 1 or use precision='bf16'")
        if self.schedule != "interleaved_1f1b" and self.virtual_stages != 1:
            raise ValueError(f"TrainConfig: virtual_stages={self.virtual_stages} needs schedule='interleaved_1f1b'")
        if self.schedule == "zb_h1":
            _check_zb_h1(self)
        _check_used(self)

    def replace(self, **changes) -> "TrainConfig":
        return replace(self, **changes)

    def rows_per_micro_step(self, dp: int) -> int:
        """Rows each dp rank feeds per accumulation step; raises when the batch does not split evenly."""
        split = dp * self.gradient_accumulation_steps
        if self.batch_size % split:
            raise ValueError(f"batch_size={self.batch_size} is not divisible by dp * gradient_accumulation_steps "
                             f"= {dp} * {self.gradient_accumulation_steps} = {split}")
        return self.batch_size // split

    @classmethod
    def from_deepspeed(cls, config: dict | str | Path, *, dp: int | None = None, **overrides) -> "TrainConfig":
        """Build a config from a DeepSpeed JSON dict or file. Every key it accepts changes the run;
        every other key is refused by name (with the reason, where DeepSpeed has it and minimega does not).

        Read: train_batch_size, train_micro_batch_size_per_gpu (needs ``dp``), gradient_accumulation_steps,
        gradient_clipping, optimizer {type, params{lr, betas, eps, weight_decay, adam_w_mode}}, zero_optimization
        {stage, reduce_bucket_size (stage 0: DDP's buckets), overlap_comm (absent: DeepSpeed's default, on at stage 3
        only), stage3_param_persistence_threshold, stage3_prefetch_bucket_size (0 only: prefetch off),
        offload_optimizer {device (cpu, nvme), nvme_path}}, bf16 {enabled}, fp16 {enabled, loss_scale,
        initial_scale_power, loss_scale_window, hysteresis, min_loss_scale}, data_types {grad_accum_dtype} and communication_data_type
        ('fp32', bf16 only). Values are taken as JSON types: ``"false"`` is not a bool and ``"16"`` is not an int.

        Args:
            config: the dict, or a path to a JSON file (at most 1 MiB).
            dp: data-parallel degree, needed to check train_batch_size = micro * accumulation * dp.
            overrides: TrainConfig fields that win over the file (e.g. ``tp=2``).
        """
        if not isinstance(config, dict):
            path = Path(config)
            if path.stat().st_size > DS_MAX_BYTES:
                raise ValueError(f"DeepSpeed config {path}: {path.stat().st_size} bytes; a config is at most "
                                 f"{DS_MAX_BYTES} bytes")
            config = json.loads(path.read_text())
        names = {f.name for f in fields(cls)}
        if unknown := sorted(set(overrides) - names):
            raise ValueError(f"TrainConfig has no field(s) {unknown}")
        return cls(**{**read_deepspeed(config, dp), **overrides})
