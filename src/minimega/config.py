"""Configuration: the model (`GPTConfig`) and the training run (`TrainConfig`).

Both are frozen dataclasses with a docstring under every field; `minimega train` maps its flags
one-to-one onto `TrainConfig`'s fields, and `TrainConfig.from_deepspeed` reads the DeepSpeed JSON keys
a learner will meet again, rejecting every other key by name.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, fields, replace
from pathlib import Path


@dataclass(frozen=True, kw_only=True)
class GPTConfig:
    """A nanoGPT-shaped decoder: token + position embeddings, pre-LN blocks, causal attention, GELU MLP."""

    vocab_size: int = 256
    """Tokens; the shipped byte-level tokenizer needs 256 (smaller values fold token ids modulo V)."""
    block_size: int = 64
    """Longest sequence (T) the position embedding covers."""
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 64
    """Hidden size D; D / n_head is the head size."""
    mlp_ratio: int = 4
    """MLP width F = mlp_ratio * D."""
    dropout: float = 0.0
    bias: bool = False
    """Biases in Linear and LayerNorm. Off by default: the key projection's bias has an exactly zero
    gradient (softmax ignores a constant shift), and Adam turns that zero plus float noise into
    updates of size lr, which makes bit-level parity between layouts meaningless for that tensor."""

    def __post_init__(self):
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd", "mlp_ratio"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"GPTConfig.{name} must be a positive integer, got {value!r}")
        if self.n_embd % self.n_head:
            raise ValueError(f"GPTConfig: n_head={self.n_head} does not divide n_embd={self.n_embd}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"GPTConfig.dropout must lie in [0, 1), got {self.dropout}")

    @property
    def head_size(self) -> int:
        return self.n_embd // self.n_head

    @property
    def mlp_hidden(self) -> int:
        return self.mlp_ratio * self.n_embd

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
    def preset(cls, name: str, **overrides) -> "GPTConfig":
        presets = {"tiny": cls.tiny, "small": cls.small, "gpt2": cls.gpt2}
        if name not in presets:
            raise ValueError(f"unknown preset {name!r}; choose one of {sorted(presets)}")
        return presets[name](**overrides)


PRECISIONS = ("fp32", "bf16", "fp16")
CHECKPOINTING = ("none", "full", "selective")
SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b")
OPTIMIZERS = ("adamw", "adam", "sgd")


def _flag(*names: str, **extra) -> dict:
    """Field metadata: extra command-line spellings for `minimega train` (besides --field-name)."""
    return {"flags": names, **extra}


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """One training run: parallel layout, memory optimisations and the optimizer."""

    # Parallel layout (dp is whatever is left: world size / (tp * pp)).
    tp: int = 1
    """Tensor-parallel degree (Megatron-LM); divides n_head, n_embd and the MLP width."""
    pp: int = 1
    """Pipeline stages; at most n_layer."""
    zero_stage: int = field(default=0, metadata=_flag("--zero-stage", "--stage"))
    """0: DDP; 1: shard optimizer states; 2: + gradients; 3: + parameters (DeepSpeed's stages)."""
    sequence_parallel: bool = field(default=False, metadata=_flag("--sp"))
    """Shard LayerNorm/dropout activations along the sequence over the tp group (Korthikanti et al. 2022)."""
    activation_checkpointing: str = field(default="none", metadata=_flag("--ac"))
    """'none', 'full' (recompute every block) or 'selective' (recompute only the attention core)."""
    checkpoint_every: int = 1
    """With full checkpointing, recompute every k-th block only."""
    schedule: str = "1f1b"
    """Pipeline schedule: 'gpipe', '1f1b' or 'interleaved_1f1b'."""
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
    """'fp32', 'bf16' or 'fp16': the dtype parameters and gradients are stored and communicated in."""
    offload_optimizer: bool = field(default=False, metadata=_flag("--offload"))
    """Keep fp32 master weights and optimizer states in a CPU store and step there (ZeRO-Offload)."""
    bucket_mb: float = 25.0
    """Gradient bucket size (MiB) for DDP all-reduces and ZeRO-2 reduce-scatters."""
    param_persistence_threshold: int = 0
    """ZeRO-3: parameters with at most this many elements stay whole on every rank."""
    prefetch: bool = True
    """ZeRO-3: all-gather the next block's parameters while the current one computes."""
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

    def __post_init__(self):
        for name in ("tp", "pp", "micro_batches", "virtual_stages", "batch_size",
                     "gradient_accumulation_steps", "checkpoint_every"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"TrainConfig.{name} must be a positive integer, got {value!r}")
        if self.zero_stage not in (0, 1, 2, 3):
            raise ValueError(f"TrainConfig.zero_stage must be 0, 1, 2 or 3, got {self.zero_stage!r}")
        for name, allowed in (("precision", PRECISIONS), ("activation_checkpointing", CHECKPOINTING),
                              ("schedule", SCHEDULES), ("optimizer", OPTIMIZERS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"TrainConfig.{name}={getattr(self, name)!r}; choose one of {allowed}")
        if self.offload_optimizer and self.zero_stage == 0:
            raise ValueError("TrainConfig: offload_optimizer needs zero_stage >= 1 "
                             "(ZeRO-Offload moves the sharded optimizer states to the CPU)")
        if self.precision != "fp32" and self.zero_stage == 0:
            raise ValueError(f"TrainConfig: precision={self.precision!r} needs zero_stage >= 1 "
                             f"(the fp32 master weights live in the ZeRO optimizer's shards)")
        if self.sequence_parallel and self.tp == 1:
            raise ValueError("TrainConfig: sequence_parallel needs tp > 1")
        if self.pp > 1 and self.precision == "fp16":
            raise ValueError(f"TrainConfig: precision='fp16' with pp={self.pp}: the pipeline does not scale its "
                             "losses for fp16; use precision='bf16' (no loss scaling needed) or 'fp32'")
        if self.schedule != "interleaved_1f1b" and self.virtual_stages != 1:
            raise ValueError(f"TrainConfig: virtual_stages={self.virtual_stages} needs schedule='interleaved_1f1b'")
        if self.loss_scale_window < 1 or self.hysteresis < 1 or self.min_loss_scale <= 0 or self.loss_scale < 0:
            raise ValueError("TrainConfig: loss_scale_window and hysteresis must be >= 1, min_loss_scale > 0, "
                             "loss_scale >= 0")
        if self.gradient_clipping < 0 or self.lr <= 0 or self.bucket_mb <= 0:
            raise ValueError("TrainConfig: gradient_clipping must be >= 0, lr and bucket_mb > 0")
        if self.seq_len is not None and self.seq_len < 1:
            raise ValueError(f"TrainConfig.seq_len must be positive, got {self.seq_len}")

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
        """Build a config from a DeepSpeed JSON dict or file; unknown keys are rejected by name.

        Supported keys: train_batch_size, train_micro_batch_size_per_gpu, gradient_accumulation_steps,
        gradient_clipping, steps_per_print, wall_clock_breakdown, optimizer {type, params{lr, betas, eps,
        weight_decay}}, zero_optimization {stage, reduce_bucket_size, allgather_bucket_size, overlap_comm,
        contiguous_gradients, stage3_param_persistence_threshold, stage3_prefetch_bucket_size,
        offload_optimizer {device, pin_memory}}, bf16 {enabled}, fp16 {enabled, loss_scale,
        initial_scale_power, loss_scale_window, hysteresis, min_loss_scale}.

        Args:
            config: the dict, or a path to a JSON file.
            dp: data-parallel degree, needed to check train_batch_size = micro * accumulation * dp.
            overrides: TrainConfig fields that win over the file (e.g. ``tp=2``).
        """
        if not isinstance(config, dict):
            config = json.loads(Path(config).read_text())
        out: dict = {}

        def check(section: dict, allowed: set[str], where: str):
            if not isinstance(section, dict):
                raise ValueError(f"DeepSpeed config: '{where}' must be an object")
            if unknown := sorted(set(section) - allowed):
                raise ValueError(f"DeepSpeed config: unsupported key(s) {', '.join(where + '.' + k if where else k for k in unknown)}; "
                                 f"supported here: {', '.join(sorted(allowed))}")

        check(config, {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
                       "gradient_clipping", "optimizer", "zero_optimization", "bf16", "fp16",
                       "steps_per_print", "wall_clock_breakdown"}, "")
        ga = int(config.get("gradient_accumulation_steps", 1))
        out["gradient_accumulation_steps"] = ga
        tb, mb = config.get("train_batch_size"), config.get("train_micro_batch_size_per_gpu")
        if tb is not None:
            out["batch_size"] = int(tb)
        if mb is not None and dp is not None:
            if tb is not None and int(tb) != int(mb) * ga * dp:
                raise ValueError(f"DeepSpeed config: train_batch_size={tb} != train_micro_batch_size_per_gpu * "
                                 f"gradient_accumulation_steps * dp = {mb} * {ga} * {dp} = {int(mb) * ga * dp}")
            out["batch_size"] = int(mb) * ga * dp
        if "gradient_clipping" in config:
            out["gradient_clipping"] = float(config["gradient_clipping"])
        if "optimizer" in config:
            opt = config["optimizer"]
            check(opt, {"type", "params"}, "optimizer")
            kind = str(opt.get("type", "AdamW")).lower()
            if kind not in OPTIMIZERS:
                raise ValueError(f"DeepSpeed config: optimizer.type={opt.get('type')!r}; supported: AdamW, Adam, SGD")
            out["optimizer"] = kind
            params = opt.get("params", {})
            check(params, {"lr", "betas", "eps", "weight_decay"}, "optimizer.params")
            for k in ("lr", "eps", "weight_decay"):
                if k in params:
                    out[k] = float(params[k])
            if "betas" in params:
                out["betas"] = tuple(float(b) for b in params["betas"])
        if "zero_optimization" in config:
            z = config["zero_optimization"]
            check(z, {"stage", "reduce_bucket_size", "allgather_bucket_size", "overlap_comm", "contiguous_gradients",
                      "stage3_param_persistence_threshold", "stage3_prefetch_bucket_size", "offload_optimizer"},
                  "zero_optimization")
            out["zero_stage"] = z.get("stage", 0)
            if "reduce_bucket_size" in z:
                out["bucket_mb"] = float(z["reduce_bucket_size"]) * 4 / 2**20   # elements -> MiB of fp32
            if "stage3_param_persistence_threshold" in z:
                out["param_persistence_threshold"] = int(z["stage3_param_persistence_threshold"])
            if "offload_optimizer" in z:
                off = z["offload_optimizer"]
                check(off, {"device", "pin_memory"}, "zero_optimization.offload_optimizer")
                if off.get("device", "none") not in ("cpu", "none"):
                    raise ValueError(f"DeepSpeed config: offload_optimizer.device={off['device']!r}; supported: cpu, none")
                out["offload_optimizer"] = off.get("device", "none") == "cpu"
        bf16 = config.get("bf16", {}).get("enabled", False) if "bf16" in config else False
        fp16 = config.get("fp16", {}).get("enabled", False) if "fp16" in config else False
        if "bf16" in config:
            check(config["bf16"], {"enabled"}, "bf16")
        if "fp16" in config:
            check(config["fp16"], {"enabled", "loss_scale", "initial_scale_power", "loss_scale_window",
                                   "hysteresis", "min_loss_scale"}, "fp16")
            fp16_cfg = config["fp16"]
            if float(fp16_cfg.get("loss_scale", 0)) > 0:
                out["loss_scale"] = float(fp16_cfg["loss_scale"])
            for key, cast in (("initial_scale_power", int), ("loss_scale_window", int), ("hysteresis", int),
                              ("min_loss_scale", float)):
                if key in fp16_cfg:
                    out[key] = cast(fp16_cfg[key])
        if bf16 and fp16:
            raise ValueError("DeepSpeed config: fp16 and bf16 are both enabled; enable at most one")
        out["precision"] = "bf16" if bf16 else "fp16" if fp16 else "fp32"
        names = {f.name for f in fields(cls)}
        if unknown := sorted(set(overrides) - names):
            raise ValueError(f"TrainConfig has no field(s) {unknown}")
        return cls(**{**out, **overrides})
