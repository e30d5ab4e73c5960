"""The same run in the real stacks' own words: a `TrainConfig` as DeepSpeed, Megatron-LM and torchtitan config.

    to_deepspeed(cfg, dp)                 the ds_config.json dict (from_deepspeed reads it back to the same config)
    to_deepspeed(cfg, dp, megatron=True)  the ds_config.json that goes with Megatron-DeepSpeed's command line
    to_megatron(cfg, dp, model)           Megatron-LM's pretrain_gpt.py arguments, as an argv list
    to_torchtitan(cfg, dp, model)         torchtitan's TOML job config (the sections of v0.2.2's JobConfig)

Each exporter either writes a setting the target reads with the same meaning, or raises `ExportError` naming
the setting and the target ("what a target cannot express is an error"). Where the target holds the setting
with a narrower scope (Megatron-LM never decays biases and LayerNorm weights), the export goes through and
`notes()` says so. `TABLE` is the one mapping the exporters follow; chapter 14 prints it and a test pins the
exporters to it.

Sources the names are checked against (paths at the snapshot commits; DeepSpeed's are also checked live
by `check_deepspeed` when `deepspeed` imports):
    DeepSpeed 0.19.8       deepspeed/runtime/config.py (DeepSpeedConfig, DEEPSPEED_OPTIMIZERS, ADAM_W_MODE),
                           deepspeed/runtime/zero/config.py (DeepSpeedZeroConfig, pydantic, extra keys forbidden),
                           deepspeed/runtime/engine.py (_do_optimizer_sanity_check: bf16 + stage 0 + a pipeline
                           -> BF16_Optimizer, which shards the optimizer states: BLOOM's "stage 0")
    Megatron-LM d98e8a6    megatron/training/arguments.py (explicit flags), megatron/training/argument_utils.py
                           (dataclass field foo_bar -> --foo-bar; a True default -> --no-foo-bar),
                           megatron/core/{model_parallel_config,transformer/transformer_config}.py,
                           megatron/core/optimizer/{optimizer_config,__init__}.py, megatron/training/config/*.py
    torchtitan v0.2.2      torchtitan/config/job_config.py (the last release configured by TOML; the Python
                           config registry replaced it in #2386)
"""
from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass

from .config import GPTConfig, TrainConfig

TARGETS = ("deepspeed", "megatron", "torchtitan")


class ExportError(ValueError):
    """A setting the target cannot express; the message names the setting, the target and what to change."""


def _refuse(target: str, field: str, value, why: str) -> ExportError:
    return ExportError(f"export to {target}: {field}={value!r} cannot be expressed: {why}")


def _default(name: str):
    f = next((f for f in dataclasses.fields(TrainConfig) if f.name == name), None)
    return None if f is None else f.default


def _get(cfg: TrainConfig, name: str):
    """A field's value, or its default where this TrainConfig has no such field (fields added by newer code)."""
    return getattr(cfg, name, _default(name))


def _split(total: int, parts: int, what: str) -> int:
    if total % parts:
        raise ExportError(f"export: {what}: {total} does not split into {parts} equal parts")
    return total // parts


# --8<-- [start:table]
# One row per TrainConfig field: what each stack calls it. "—" starts a refusal: the exporter raises
# ExportError when the field differs from its default (the text after the dash says why).
TABLE: tuple[tuple[str, str, str, str], ...] = (
    # field, DeepSpeed ds_config.json, Megatron-LM flag, torchtitan v0.2.2 TOML
    ("tp", "— on Megatron-DeepSpeed's command line", "--tensor-model-parallel-size",
     "parallelism.tensor_parallel_degree"),
    ("pp", "— on Megatron-DeepSpeed's command line", "--pipeline-model-parallel-size",
     "parallelism.pipeline_parallel_degree"),
    ("cp", "— DeepSpeed's context parallelism is Ulysses (all-to-all over heads), not ring attention",
     "--context-parallel-size",
     "— not mapped: this exporter does not write torchtitan's context-parallel options"),
    ("cp_attention", "— DeepSpeed-Ulysses is wired in the model code (deepspeed.sequence.layer.DistributedAttention) "
     "and Megatron-DeepSpeed's --ds-sequence-parallel-size, not ds_config.json",
     "--cp-comm-type p2p|a2a (a2a: Ulysses' head split, on the same mirrored chunks)",
     "— torchtitan v0.2.2 has no head-split context parallelism (its rotate method 'alltoall' still passes K/V "
     "around the ring)"),
    ("ep", "— expert parallelism is set in DeepSpeed-MoE's model code (MoE(ep_size=…)), not ds_config.json",
     "— the exported model is dense (minimega.moe models are not exported)",
     "— the exported model is dense (minimega.moe models are not exported)"),
    ("zero_stage", "zero_optimization.stage",
     "1: --use-distributed-optimizer; 2, 3: + --use-megatron-fsdp --data-parallel-sharding-strategy "
     "optim_grads|optim_grads_params",
     "0: data_parallel_replicate_degree; 2, 3: data_parallel_shard_degree + fsdp_reshard_after_forward; "
     "1: — FSDP2 has no optimizer-only sharding"),
    ("sequence_parallel", "— on Megatron-DeepSpeed's command line", "--sequence-parallel",
     "always on with tensor_parallel_degree > 1 (— tp without it)"),
    ("activation_checkpointing", "— on Megatron-DeepSpeed's command line",
     "--recompute-granularity full|selective, --recompute-method uniform --recompute-num-layers 1",
     "activation_checkpoint.mode none|full (— selective: its op-level policy saves other tensors)"),
    ("checkpoint_every", "— on Megatron-DeepSpeed's command line",
     "— block method recomputes the first N layers of a stage, not every k-th",
     "— selective_ac_option N picks layers N-1, 2N-1, …, not 0, k, 2k, …"),
    ("schedule", "— DeepSpeed's pipeline engine runs 1F1B", "1f1b (default); interleaved: see virtual_stages; "
     "— gpipe", "parallelism.pipeline_parallel_schedule GPipe|1F1B|Interleaved1F1B"),
    ("micro_batches", "gradient_accumulation_steps (the pipeline's micro-batches)",
     "--micro-batch-size = batch / (dp · micro_batches)", "parallelism.pipeline_parallel_microbatch_size"),
    ("virtual_stages", "— DeepSpeed's pipeline engine has no interleaving",
     "--num-layers-per-virtual-pipeline-stage", "parallelism.pipeline_parallel_layers_per_stage"),
    ("batch_size", "train_batch_size", "--global-batch-size", "training.global_batch_size"),
    ("seq_len", "— the data loader's business", "--seq-length", "training.seq_len"),
    ("gradient_accumulation_steps", "gradient_accumulation_steps, train_micro_batch_size_per_gpu",
     "--micro-batch-size = batch / (dp · accumulation)", "training.local_batch_size = batch / (dp · accumulation)"),
    ("gradient_clipping", "gradient_clipping", "--clip-grad", "training.max_norm (inf: off)"),
    ("optimizer", "optimizer.type AdamW|Adam (adam_w_mode false)|SGD",
     "--optimizer adam|sgd (adam is AdamW; — Adam with weight decay)", "optimizer.name AdamW|Adam (— SGD)"),
    ("lr", "optimizer.params.lr", "--lr, --lr-decay-style constant",
     "optimizer.lr, lr_scheduler.warmup_steps 0, decay_ratio 0"),
    ("betas", "optimizer.params.betas", "--adam-beta1, --adam-beta2", "optimizer.beta1, optimizer.beta2"),
    ("eps", "optimizer.params.eps", "--adam-eps", "optimizer.eps"),
    ("weight_decay", "optimizer.params.weight_decay", "--weight-decay (not on biases and LayerNorm weights)",
     "optimizer.weight_decay"),
    ("seed", "— seed in your script (torch.manual_seed)", "--seed", "debug.seed"),
    ("precision", "bf16.enabled | fp16.enabled", "--bf16 | --fp16",
     "— fp32 only (mixed_precision_param float32): bf16 gradients are reduced in float32 there, fp16 has no "
     "loss scaler"),
    ("offload_optimizer", "zero_optimization.offload_optimizer.device cpu", "--optimizer-cpu-offload",
     "— enable_cpu_offload also moves parameters and gradients"),
    ("bucket_mb", "zero_optimization.reduce_bucket_size (stage 0)", "--ddp-bucket-size",
     "— FSDP2 reduces one unit per call, no bucket size"),
    ("param_persistence_threshold", "zero_optimization.stage3_param_persistence_threshold",
     "— Megatron-FSDP has no persistence threshold", "— FSDP2 shards every wrapped unit"),
    ("prefetch", "zero_optimization.stage3_prefetch_bucket_size (0: off)", "— Megatron-FSDP always prefetches",
     "— FSDP2 always prefetches the next unit"),
    ("overlap_comm", "zero_optimization.overlap_comm", "--overlap-grad-reduce (+ --overlap-param-gather)",
     "— FSDP2 always overlaps"),
    ("loss_scale", "fp16.loss_scale", "--loss-scale", "— (no fp16)"),
    ("initial_scale_power", "fp16.initial_scale_power", "--initial-loss-scale 2**power", "— (no fp16)"),
    ("loss_scale_window", "fp16.loss_scale_window", "--loss-scale-window", "— (no fp16)"),
    ("hysteresis", "fp16.hysteresis", "--hysteresis", "— (no fp16)"),
    ("min_loss_scale", "fp16.min_loss_scale (an integer)", "--min-loss-scale", "— (no fp16)"),
)
# --8<-- [end:table]


def markdown_table() -> str:
    """`TABLE` as the Markdown table chapter 14 prints (a test keeps the page equal to this)."""
    rows = ["| minimega `TrainConfig` | DeepSpeed `ds_config.json` | Megatron-LM | torchtitan (TOML) |",
            "| --- | --- | --- | --- |"]
    for field, *cells in TABLE:
        rows.append("| " + " | ".join([f"`{field}`", *(c.replace("|", "\\|") for c in cells)]) + " |")
    return "\n".join(rows)


# ------------------------------------------------------------------------------------------------
# DeepSpeed

# On Megatron-DeepSpeed's command line, not in ds_config.json (BLOOM's launch passes them as flags).
_MEGATRON_SIDE = ("tp", "pp", "sequence_parallel", "activation_checkpointing", "checkpoint_every", "schedule",
                  "virtual_stages", "seq_len", "seed")


# --8<-- [start:to_deepspeed]
def to_deepspeed(cfg: TrainConfig, dp: int, *, megatron: bool = False) -> dict:
    """The ds_config.json of a run on `dp` data-parallel ranks.

    Args:
        cfg: the run.
        dp: data-parallel degree (world size / (tp · pp)).
        megatron: the config that goes with Megatron-DeepSpeed's command line (`to_megatron`): tp, pp, the
            schedule, recomputation, the sequence length, the seed and the optimizer live there, so they are
            not refused here and no "optimizer" section is written (BLOOM's ds_config has none).
    Raises:
        ExportError: a setting ds_config.json cannot hold, named.
    """
    target = "deepspeed"
    if _get(cfg, "cp_attention") != "ring":
        raise _refuse(target, "cp_attention", _get(cfg, "cp_attention"), "DeepSpeed-Ulysses is wired in the model "
                      "code (DistributedAttention) and Megatron-DeepSpeed's --ds-sequence-parallel-size, not "
                      "ds_config.json (set cp=1)")
    if _get(cfg, "cp") != 1:
        raise _refuse(target, "cp", _get(cfg, "cp"), "DeepSpeed's context parallelism is Ulysses (all-to-all over "
                      "heads), not minimega's ring attention (set cp=1)")
    if _get(cfg, "ep") != 1:
        raise _refuse(target, "ep", _get(cfg, "ep"), "the exported model is dense; minimega.moe models are not "
                      "exported (set ep=1)")
    if not megatron and (set_here := [n for n in _MEGATRON_SIDE if _get(cfg, n) != _default(n)]):
        named = ", ".join(f"{n}={_get(cfg, n)!r}" for n in set_here)
        raise ExportError(f"export to deepspeed: {named} cannot be expressed: ds_config.json has no such keys; "
                          "they go on Megatron-DeepSpeed's command line (export --megatron, and --deepspeed "
                          "--megatron-deepspeed for its ds_config)")
    if cfg.pp > 1 and cfg.schedule == "gpipe":
        raise _refuse(target, "schedule", cfg.schedule, "DeepSpeed's pipeline engine runs 1F1B")
    if cfg.virtual_stages > 1:
        raise _refuse(target, "virtual_stages", cfg.virtual_stages, "DeepSpeed's pipeline engine has no interleaving")
    steps = cfg.micro_batches if cfg.pp > 1 else cfg.gradient_accumulation_steps
    micro = _split(cfg.batch_size, dp * steps, "batch_size / (dp · accumulation steps)")
    ds: dict = {"train_batch_size": cfg.batch_size, "train_micro_batch_size_per_gpu": micro,
                "gradient_accumulation_steps": steps, "gradient_clipping": cfg.gradient_clipping}
    if megatron:
        pass          # Megatron-DeepSpeed builds the optimizer from its own flags and hands it to DeepSpeed
    elif cfg.optimizer == "sgd":        # not a DeepSpeed optimizer: the engine falls back to torch.optim.SGD by name
        ds["optimizer"] = {"type": "SGD", "params": {"lr": cfg.lr, "weight_decay": cfg.weight_decay}}
    else:
        params = {"lr": cfg.lr, "betas": list(cfg.betas), "eps": cfg.eps, "weight_decay": cfg.weight_decay}
        if cfg.optimizer == "adam":
            params["adam_w_mode"] = False   # DeepSpeed's "Adam" decouples weight decay unless told not to
        ds["optimizer"] = {"type": {"adamw": "AdamW", "adam": "Adam"}[cfg.optimizer], "params": params}
    # --8<-- [start:deepspeed_zero]
    stage = cfg.zero_stage
    if megatron and cfg.pp > 1 and cfg.precision == "bf16" and stage == 1:
        stage = 0     # bf16 + stage 0 + a pipeline is DeepSpeed's BF16_Optimizer: ZeRO-1 (BLOOM's choice)
    zero: dict = {"stage": stage}
    if _get(cfg, "overlap_comm") != (stage == 3):        # DeepSpeed's default: on at stage 3 only
        zero["overlap_comm"] = _get(cfg, "overlap_comm")
    if cfg.bucket_mb != _default("bucket_mb"):
        if cfg.zero_stage:
            raise _refuse(target, "bucket_mb", cfg.bucket_mb, "minimega's ZeRO reduces one unit per call; "
                          "reduce_bucket_size sizes DeepSpeed's ZeRO buckets, a different thing")
        zero["reduce_bucket_size"] = round(cfg.bucket_mb * 2**20 / 4)          # MiB of fp32 -> elements
    if cfg.zero_stage == 3:
        # DeepSpeed keeps parameters under 1e5 elements whole by default; minimega shards all (threshold 0)
        zero["stage3_param_persistence_threshold"] = cfg.param_persistence_threshold
        if not cfg.prefetch:
            zero["stage3_prefetch_bucket_size"] = 0
    if cfg.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu"}
    ds["zero_optimization"] = zero
    # --8<-- [end:deepspeed_zero]
    if cfg.precision == "bf16":
        ds["bf16"] = {"enabled": True}
    elif cfg.precision == "fp16":
        if cfg.min_loss_scale != int(cfg.min_loss_scale):
            raise _refuse(target, "min_loss_scale", cfg.min_loss_scale, "DeepSpeed's fp16.min_loss_scale is an "
                          "integer (DeepSpeedFP16Config); use a whole number")
        fp16 = {"enabled": True, "initial_scale_power": cfg.initial_scale_power,
                "loss_scale_window": cfg.loss_scale_window, "hysteresis": cfg.hysteresis,
                "min_loss_scale": int(cfg.min_loss_scale)}
        if cfg.loss_scale:
            fp16["loss_scale"] = cfg.loss_scale
        ds["fp16"] = fp16
    return ds
# --8<-- [end:to_deepspeed]


def check_deepspeed(ds: dict, dp: int) -> str:
    """Parse `ds` with DeepSpeed's own config classes and compare what they read with what was written.

    Returns the DeepSpeed version it was checked against. Raises ImportError without DeepSpeed and
    ValueError when DeepSpeed reads a value differently (or refuses a key).
    """
    import os
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed
    from deepspeed.runtime import constants as ds_constants
    from deepspeed.runtime.config import DeepSpeedConfig
    from deepspeed.runtime.zero.config import ZERO_OPTIMIZATION

    # Without a process group DeepSpeedConfig assumes one rank: check train_batch_size = micro · steps · dp here.
    if ds["train_batch_size"] != ds["train_micro_batch_size_per_gpu"] * ds["gradient_accumulation_steps"] * dp:
        raise ValueError("ds_config: train_batch_size != train_micro_batch_size_per_gpu * "
                         "gradient_accumulation_steps * dp")
    one_rank = {**ds, "train_batch_size": ds["train_micro_batch_size_per_gpu"] * ds["gradient_accumulation_steps"]}
    parsed = DeepSpeedConfig(one_rank)
    known = {v for k, v in vars(ds_constants).items() if k.isupper() and isinstance(v, str)} | {ZERO_OPTIMIZATION}
    if unknown := sorted(set(ds) - known):
        raise ValueError(f"ds_config: DeepSpeed {deepspeed.__version__} has no top-level key(s) {unknown}")
    z, want = parsed.zero_config, ds["zero_optimization"]
    read = {"gradient_accumulation_steps": parsed.gradient_accumulation_steps,
            "train_micro_batch_size_per_gpu": parsed.train_micro_batch_size_per_gpu,
            "gradient_clipping": parsed.gradient_clipping, "stage": int(z.stage),
            "overlap_comm": z.overlap_comm, "reduce_bucket_size": z.reduce_bucket_size,
            "stage3_param_persistence_threshold": z.param_persistence_threshold,
            "stage3_prefetch_bucket_size": z.prefetch_bucket_size,
            "offload": getattr(z.offload_optimizer.device, "value", z.offload_optimizer.device)
            if z.offload_optimizer else "none",
            "bf16": parsed.bfloat16_config.enabled, "fp16": parsed.float16_config.enabled,
            "optimizer": parsed.optimizer_name, "optimizer_params": parsed.optimizer_params}
    expect = {"gradient_accumulation_steps": ds["gradient_accumulation_steps"],
              "train_micro_batch_size_per_gpu": ds["train_micro_batch_size_per_gpu"],
              "gradient_clipping": ds["gradient_clipping"], "stage": want["stage"],
              "bf16": "bf16" in ds, "fp16": "fp16" in ds,
              "offload": want.get("offload_optimizer", {}).get("device", "none")}
    if "optimizer" in ds:
        kind = ds["optimizer"]["type"]
        expect["optimizer"] = kind if kind == "SGD" else kind.lower()
        expect["optimizer_params"] = ds["optimizer"]["params"]
    for key in ("overlap_comm", "reduce_bucket_size", "stage3_param_persistence_threshold",
                "stage3_prefetch_bucket_size"):
        if key in want:
            expect[key] = want[key]
    for key, value in expect.items():
        if read[key] != value:
            raise ValueError(f"ds_config: DeepSpeed {deepspeed.__version__} reads {key} as {read[key]!r}, "
                             f"written {value!r}")
    if "fp16" in ds:
        fp = parsed.float16_config
        for key in ("initial_scale_power", "loss_scale_window", "hysteresis", "min_loss_scale", "loss_scale"):
            if key in ds["fp16"] and getattr(fp, key) != ds["fp16"][key]:
                raise ValueError(f"ds_config: DeepSpeed reads fp16.{key} as {getattr(fp, key)!r}, "
                                 f"written {ds['fp16'][key]!r}")
    return deepspeed.__version__


# ------------------------------------------------------------------------------------------------
# Megatron-LM

# Every flag to_megatron may write, with where Megatron-LM (d98e8a6) defines it. A test checks that no
# other flag is ever written. "factory" = generated from the dataclass field by ArgumentGroupFactory.
MEGATRON_FLAGS = {
    "--tensor-model-parallel-size": "core/model_parallel_config.py L55 (factory)",
    "--pipeline-model-parallel-size": "core/model_parallel_config.py L83 (factory)",
    "--num-layers-per-virtual-pipeline-stage": "training/arguments.py L3114",
    "--sequence-parallel": "core/model_parallel_config.py L94 (factory)",
    "--recompute-granularity": "core/transformer/transformer_config.py L532 (factory)",
    "--recompute-method": "core/transformer/transformer_config.py L543 (factory)",
    "--recompute-num-layers": "core/transformer/transformer_config.py L551 (factory)",
    "--use-distributed-optimizer": "training/arguments.py L3156",
    "--use-megatron-fsdp": "training/config/common_config.py L92 (factory)",
    "--data-parallel-sharding-strategy": "training/arguments.py L3190",
    "--overlap-grad-reduce": "training/arguments.py L3121",
    "--overlap-param-gather": "training/arguments.py L3148",
    "--ddp-bucket-size": "training/arguments.py L3125",
    "--optimizer-cpu-offload": "training/arguments.py L2918",
    "--micro-batch-size": "training/config/training_config.py L11 (factory)",
    "--global-batch-size": "training/config/training_config.py L15 (factory)",
    "--seq-length": "training/arguments.py L3305",
    "--bf16": "core/model_parallel_config.py L180 (factory)",
    "--fp16": "core/model_parallel_config.py L177 (factory)",
    "--loss-scale": "training/arguments.py L3055",
    "--initial-loss-scale": "training/arguments.py L3059",
    "--min-loss-scale": "training/arguments.py L3061",
    "--loss-scale-window": "training/arguments.py L3063",
    "--hysteresis": "training/arguments.py L3065",
    "--clip-grad": "training/arguments.py L2615",
    "--optimizer": "training/arguments.py L2913",
    "--lr": "training/arguments.py L2984",
    "--lr-decay-style": "training/config/training_config.py L169 (factory)",
    "--adam-beta1": "training/arguments.py L2617",
    "--adam-beta2": "training/arguments.py L2620",
    "--adam-eps": "training/arguments.py L2623",
    "--sgd-momentum": "training/arguments.py L2626",
    "--weight-decay": "training/arguments.py L2611",
    "--seed": "training/config/common_config.py L10 (factory)",
    "--num-layers": "core/transformer/transformer_config.py L65 (factory)",
    "--hidden-size": "core/transformer/transformer_config.py L145 (factory)",
    "--num-attention-heads": "core/transformer/transformer_config.py L148 (factory)",
    "--ffn-hidden-size": "core/transformer/transformer_config.py L180 (factory)",
    "--max-position-embeddings": "training/arguments.py L2394",
    "--hidden-dropout": "core/transformer/transformer_config.py L188 (factory)",
    "--attention-dropout": "core/transformer/transformer_config.py L191 (factory)",
    "--untie-embeddings-and-output-weights": "training/arguments.py L2460",
    "--disable-bias-linear": "core/transformer/transformer_config.py L212 (factory, a True default)",
}


def _num(v) -> str:
    return repr(float(v)) if isinstance(v, float) else str(v)


# --8<-- [start:to_megatron]
def to_megatron(cfg: TrainConfig, dp: int, model: GPTConfig) -> list[str]:
    """Megatron-LM's `pretrain_gpt.py` arguments for the run (model shape included), as an argv list.

    Every value is written, defaults included, where Megatron's default differs from minimega's (clip 1.0,
    weight decay 0.01, beta2 0.999, linear lr decay, dropout 0.1, seed 1234).
    """
    target = "megatron"
    if _get(cfg, "ep") != 1:
        raise _refuse(target, "ep", _get(cfg, "ep"), "the exported model is dense; minimega.moe models are not "
                      "exported (set ep=1)")
    a: list[tuple[str, object]] = [("--tensor-model-parallel-size", cfg.tp), ("--pipeline-model-parallel-size", cfg.pp)]
    if _get(cfg, "cp") != 1:      # Megatron's ring (cp_comm_type p2p, the default) with the same mirrored chunks
        a.append(("--context-parallel-size", cfg.cp))
        if _get(cfg, "cp_attention") == "ulysses":      # a2a: heads scattered over cp, DeepSpeed-Ulysses' scheme
            a.append(("--cp-comm-type", "a2a"))
    if cfg.pp > 1:
        if cfg.schedule == "gpipe":
            raise _refuse(target, "schedule", cfg.schedule, "Megatron-LM runs 1F1B and interleaved 1F1B only")
        if cfg.schedule == "interleaved_1f1b":
            a.append(("--num-layers-per-virtual-pipeline-stage",
                      _split(model.n_layer, cfg.pp * cfg.virtual_stages, "n_layer / (pp · virtual_stages)")))
    if cfg.sequence_parallel:
        a.append(("--sequence-parallel", None))
    if cfg.activation_checkpointing == "full":
        if cfg.checkpoint_every != 1:
            raise _refuse(target, "checkpoint_every", cfg.checkpoint_every, "Megatron-LM's --recompute-method block "
                          "recomputes the first N layers of each stage, not every k-th; use 1")
        a += [("--recompute-granularity", "full"), ("--recompute-method", "uniform"), ("--recompute-num-layers", 1)]
    elif cfg.activation_checkpointing == "selective":
        a.append(("--recompute-granularity", "selective"))    # recompute_modules default ["core_attn"]
    if cfg.zero_stage == 1:
        a.append(("--use-distributed-optimizer", None))
    elif cfg.zero_stage in (2, 3):
        # Megatron-FSDP (v1, the default) runs on the distributed optimizer: arguments.py L1124-1135
        a += [("--use-megatron-fsdp", None), ("--use-distributed-optimizer", None),
              ("--data-parallel-sharding-strategy", {2: "optim_grads", 3: "optim_grads_params"}[cfg.zero_stage])]
        if cfg.param_persistence_threshold:
            raise _refuse(target, "param_persistence_threshold", cfg.param_persistence_threshold,
                          "Megatron-FSDP has no persistence threshold")
        if not cfg.prefetch:
            raise _refuse(target, "prefetch", cfg.prefetch, "Megatron-FSDP always prefetches")
    if _get(cfg, "overlap_comm"):
        a.append(("--overlap-grad-reduce", None))
        if cfg.zero_stage == 1:
            a.append(("--overlap-param-gather", None))
    if cfg.bucket_mb != _default("bucket_mb"):
        a.append(("--ddp-bucket-size", round(cfg.bucket_mb * 2**20 / 4)))           # elements
    if cfg.offload_optimizer:
        a.append(("--optimizer-cpu-offload", None))
    steps = cfg.micro_batches if cfg.pp > 1 else cfg.gradient_accumulation_steps
    a += [("--micro-batch-size", _split(cfg.batch_size, dp * steps, "batch_size / (dp · micro-batches)")),
          ("--global-batch-size", cfg.batch_size), ("--seq-length", cfg.seq_len or model.block_size)]
    if cfg.precision == "bf16":
        a.append(("--bf16", None))
    elif cfg.precision == "fp16":
        a.append(("--fp16", None))
        if cfg.loss_scale:
            a.append(("--loss-scale", cfg.loss_scale))
        else:
            a += [("--initial-loss-scale", 2 ** cfg.initial_scale_power), ("--min-loss-scale", cfg.min_loss_scale),
                  ("--loss-scale-window", cfg.loss_scale_window), ("--hysteresis", cfg.hysteresis)]
    a.append(("--clip-grad", float(cfg.gradient_clipping)))
    if cfg.optimizer == "sgd":
        a += [("--optimizer", "sgd"), ("--sgd-momentum", 0.0)]
    else:
        if cfg.optimizer == "adam" and cfg.weight_decay:
            raise _refuse(target, "optimizer", cfg.optimizer, "Megatron-LM's adam always decouples weight decay "
                          "(AdamW); use optimizer='adamw' or weight_decay=0")
        a += [("--optimizer", "adam"), ("--adam-beta1", cfg.betas[0]), ("--adam-beta2", cfg.betas[1]),
              ("--adam-eps", cfg.eps)]
    a += [("--lr", cfg.lr), ("--lr-decay-style", "constant"), ("--weight-decay", float(cfg.weight_decay)),
          ("--seed", cfg.seed)]
    a += [("--num-layers", model.n_layer), ("--hidden-size", model.n_embd), ("--num-attention-heads", model.n_head),
          ("--ffn-hidden-size", model.mlp_hidden), ("--max-position-embeddings", model.block_size),
          ("--hidden-dropout", float(model.dropout)), ("--attention-dropout", float(model.dropout)),
          ("--untie-embeddings-and-output-weights", None)]
    if not model.bias:
        a.append(("--disable-bias-linear", None))
    argv: list[str] = []
    for flag, value in a:
        argv += [flag] if value is None else [flag, _num(value)]
    return argv
# --8<-- [end:to_megatron]


# ------------------------------------------------------------------------------------------------
# torchtitan

# Every key to_torchtitan may write, per section, as torchtitan v0.2.2's JobConfig defines it
# (torchtitan/config/job_config.py at tag v0.2.2: class Training L243, Parallelism L312, Optimizer L134,
# LRScheduler L169, ActivationCheckpoint L651, Debug L985). A test checks that no other key is written.
TORCHTITAN_KEYS = {
    "training": {"local_batch_size", "global_batch_size", "seq_len", "max_norm", "mixed_precision_param"},
    "parallelism": {"data_parallel_replicate_degree", "data_parallel_shard_degree", "fsdp_reshard_after_forward",
                    "tensor_parallel_degree", "pipeline_parallel_degree", "pipeline_parallel_schedule",
                    "pipeline_parallel_microbatch_size", "pipeline_parallel_layers_per_stage"},
    "optimizer": {"name", "lr", "beta1", "beta2", "eps", "weight_decay"},
    "lr_scheduler": {"warmup_steps", "decay_ratio"},
    "activation_checkpoint": {"mode"},
    "debug": {"seed"},
}


def torchtitan_sections(cfg: TrainConfig, dp: int, model: GPTConfig) -> dict[str, dict]:
    """torchtitan's job config for the run, as {section: {key: value}}."""
    target = "torchtitan"
    if _get(cfg, "cp_attention") != "ring":
        raise _refuse(target, "cp_attention", _get(cfg, "cp_attention"), "torchtitan v0.2.2 has no head-split "
                      "context parallelism (its rotate method 'alltoall' still passes K/V around the ring)")
    if _get(cfg, "cp") != 1:
        raise _refuse(target, "cp", _get(cfg, "cp"), "this exporter does not write torchtitan's context-parallel "
                      "options (set cp=1)")
    if _get(cfg, "ep") != 1:
        raise _refuse(target, "ep", _get(cfg, "ep"), "the exported model is dense; minimega.moe models are not "
                      "exported (set ep=1)")

    def refuse_unless_default(name, why):
        if _get(cfg, name) != _default(name):
            raise _refuse(target, name, _get(cfg, name), why)

    if cfg.precision == "bf16":
        raise _refuse(target, "precision", "bf16", "minimega reduces bf16 gradients in bf16; torchtitan v0.2.2 "
                      "reduces in float32 only (training.mixed_precision_reduce)")
    if cfg.precision == "fp16":
        scaler = "".join(f", {n}={_get(cfg, n)!r}" for n in ("loss_scale", "initial_scale_power", "loss_scale_window",
                                                            "hysteresis", "min_loss_scale") if _get(cfg, n) != _default(n))
        raise ExportError(f"export to torchtitan: precision='fp16'{scaler} cannot be expressed: torchtitan has no "
                          "fp16 loss scaler; use fp32")
    if cfg.zero_stage == 1:
        raise _refuse(target, "zero_stage", 1, "FSDP2 shards parameters and gradients too; it has no "
                      "optimizer-only sharding (use zero_stage 2 or 3)")
    if cfg.tp > 1 and not cfg.sequence_parallel:
        raise _refuse(target, "sequence_parallel", False, "torchtitan's tensor parallelism always shards the "
                      "norms along the sequence; set sequence_parallel=True")
    if cfg.activation_checkpointing == "selective":
        raise _refuse(target, "activation_checkpointing", "selective", "torchtitan's op-level selective policy "
                      "saves matmul outputs and recomputes the rest, not minimega's attention-core recompute")
    refuse_unless_default("checkpoint_every", "selective_ac_option N checkpoints layers N-1, 2N-1, …, not 0, k, 2k, …")
    refuse_unless_default("offload_optimizer", "training.enable_cpu_offload also moves parameters and gradients")
    refuse_unless_default("bucket_mb", "FSDP2 reduces one unit per call; there is no bucket size")
    refuse_unless_default("param_persistence_threshold", "FSDP2 shards every wrapped unit")
    refuse_unless_default("prefetch", "FSDP2 always prefetches the next unit")
    refuse_unless_default("overlap_comm", "FSDP2 always overlaps communication")
    if cfg.optimizer == "sgd":
        raise _refuse(target, "optimizer", "sgd", "torchtitan v0.2.2 builds Adam and AdamW only")
    steps = cfg.micro_batches if cfg.pp > 1 else cfg.gradient_accumulation_steps
    local = _split(cfg.batch_size, dp * (1 if cfg.pp > 1 else steps), "batch_size / (dp · accumulation)")
    training = {"local_batch_size": local, "global_batch_size": cfg.batch_size, "seq_len": cfg.seq_len or model.block_size,
                "max_norm": cfg.gradient_clipping or math.inf, "mixed_precision_param": "float32"}
    par: dict = {"data_parallel_replicate_degree": dp if cfg.zero_stage == 0 else 1,
                 "data_parallel_shard_degree": 1 if cfg.zero_stage == 0 else dp,
                 "tensor_parallel_degree": cfg.tp, "pipeline_parallel_degree": cfg.pp}
    if cfg.zero_stage:
        par["fsdp_reshard_after_forward"] = "always" if cfg.zero_stage == 3 else "never"
    if cfg.pp > 1:
        par["pipeline_parallel_schedule"] = {"gpipe": "GPipe", "1f1b": "1F1B",
                                             "interleaved_1f1b": "Interleaved1F1B"}[cfg.schedule]
        par["pipeline_parallel_microbatch_size"] = _split(local, cfg.micro_batches, "local batch / micro_batches")
        par["pipeline_parallel_layers_per_stage"] = _split(model.n_layer, cfg.pp * cfg.virtual_stages,
                                                           "n_layer / (pp · virtual_stages)")
    return {"training": training, "parallelism": par,
            "optimizer": {"name": "AdamW" if cfg.optimizer == "adamw" else "Adam", "lr": cfg.lr,
                          "beta1": cfg.betas[0], "beta2": cfg.betas[1], "eps": cfg.eps,
                          "weight_decay": cfg.weight_decay},
            "lr_scheduler": {"warmup_steps": 0, "decay_ratio": 0.0},       # a constant learning rate
            "activation_checkpoint": {"mode": "full" if cfg.activation_checkpointing == "full" else "none"},
            "debug": {"seed": cfg.seed}}


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return "inf" if math.isinf(v) else repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    return str(v)


def to_torchtitan(cfg: TrainConfig, dp: int, model: GPTConfig) -> str:
    """The TOML job config (torchtitan v0.2.2's sections); `tomllib.loads` reads it back."""
    out = []
    for section, keys in torchtitan_sections(cfg, dp, model).items():
        out.append(f"[{section}]")
        out += [f"{k} = {_toml_value(v)}" for k, v in keys.items()]
        out.append("")
    return "\n".join(out)


# ------------------------------------------------------------------------------------------------
# Notes and presets

def notes(cfg: TrainConfig, target: str, model: GPTConfig | None = None) -> list[str]:
    """What the export carries with a narrower or different scope on the target (not refused, but not identical)."""
    out = []
    if target == "megatron":
        if model is not None and not model.bias:
            out.append("Megatron-LM's LayerNorm always has a bias; minimega's GPT has none when bias=False")
        if cfg.weight_decay:
            out.append("Megatron-LM skips weight decay on biases and 1-D weights (LayerNorm); minimega decays "
                       "every tensor (megatron/core/optimizer/__init__.py L110-120)")
    return out


@dataclass(frozen=True)
class Preset:
    """A published run: the model shape, the TrainConfig and the data-parallel degree it ran with."""
    model: GPTConfig
    train: TrainConfig
    dp: int
    source: str


# --8<-- [start:bloom]
def bloom_176b() -> Preset:
    """BLOOM-176B's parallel layout, precision and optimizer (bigscience tr11-176B-ml, 384 A100s, 48 nodes).

    70 layers, hidden 14336, 112 heads, sequence 2048, vocabulary padded to 250880; TP=4, PP=12, DP=8;
    micro-batch 2, global batch 2048; bf16 with DeepSpeed's BF16_Optimizer (ZeRO-1 at "stage 0");
    full activation checkpointing; Adam (0.9, 0.95, 1e-8), lr 6e-5, weight decay 0.1, clip 1.0, seed 42.
    Sources: bigscience-workshop/bigscience train/tr11-176B-ml/tr11-176B-ml.slurm L63-147 and README.md L178-187.
    Differences from BLOOM's model that a GPTConfig cannot state: ALiBi instead of learned positions,
    a LayerNorm after the embedding, tied embeddings (`notes`). The lr schedule (warm-up, cosine decay)
    and the batch-size ramp-up are not TrainConfig fields: minimega keeps lr constant.
    """
    model = GPTConfig(vocab_size=250880, block_size=2048, n_layer=70, n_head=112, n_embd=14336, bias=True, dropout=0.0)
    train = TrainConfig(tp=4, pp=12, zero_stage=1, precision="bf16", activation_checkpointing="full",
                        schedule="1f1b", micro_batches=2048 // (8 * 2), batch_size=2048, seq_len=2048,
                        gradient_clipping=1.0, optimizer="adamw", lr=6e-5, betas=(0.9, 0.95), eps=1e-8,
                        weight_decay=0.1, seed=42, overlap_comm=False)
    return Preset(model=model, train=train, dp=8,
                  source="bigscience-workshop/bigscience train/tr11-176B-ml/tr11-176B-ml.slurm")
# --8<-- [end:bloom]


PRESETS = {"bloom-176b": bloom_176b}


# ------------------------------------------------------------------------------------------------
# minimega export-config

def add_export_parser(sub) -> None:
    """`minimega export-config --deepspeed | --megatron | --torchtitan` (TrainConfig flags as in `train`)."""
    from .cli import _add_config_flags
    p = sub.add_parser("export-config", help="write a run's config for DeepSpeed, Megatron-LM or torchtitan",
                       description="Export a TrainConfig (flags as in `minimega train`) to a real stack's config. "
                                   "A setting the target cannot express is an error naming it.")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--deepspeed", dest="target", action="store_const", const="deepspeed",
                       help="ds_config.json (with --megatron-deepspeed: the one that goes with Megatron-DeepSpeed)")
    which.add_argument("--megatron", dest="target", action="store_const", const="megatron",
                       help="Megatron-LM pretrain_gpt.py arguments")
    which.add_argument("--torchtitan", dest="target", action="store_const", const="torchtitan",
                       help="torchtitan (v0.2.2) TOML job config")
    p.add_argument("--megatron-deepspeed", action="store_true",
                   help="with --deepspeed: tp, pp, recomputation, seq_len and seed go on Megatron-DeepSpeed's command line")
    p.add_argument("--preset", default="tiny", choices=["tiny", "small", "gpt2", *PRESETS],
                   help="model shape; a published run's name also sets its TrainConfig and dp (default: tiny)")
    p.add_argument("--nproc", type=int, default=None,
                   help="ranks; dp = nproc / (tp * pp * cp) (default: the preset's dp, or 1)")
    p.add_argument("--config", default=None, help="start from a DeepSpeed-style JSON config; flags override it")
    p.add_argument("--out", default=None, help="write to this file instead of standard output")
    p.add_argument("--no-check", action="store_true", help="do not parse the ds_config with DeepSpeed's own classes")
    _add_config_flags(p)
    p.set_defaults(func=_cmd_export)


def _cmd_export(args) -> int:
    import sys
    from pathlib import Path

    from .cli import build_train_config
    preset = PRESETS[args.preset]() if args.preset in PRESETS else None
    model = preset.model if preset else GPTConfig.preset(args.preset)
    overrides = {f.name: getattr(args, f.name) for f in dataclasses.fields(TrainConfig)
                 if getattr(args, f.name, None) is not None}
    tp, pp = overrides.get("tp", preset.train.tp if preset else 1), overrides.get("pp", preset.train.pp if preset else 1)
    cp = overrides.get("cp", 1)
    if args.nproc is not None:
        if args.nproc < 1 or args.nproc % (tp * pp * cp):
            raise ValueError(f"--nproc {args.nproc} is not a positive multiple of tp * pp * cp = {tp * pp * cp}")
        dp = args.nproc // (tp * pp * cp)
    else:
        dp = preset.dp if preset else 1
    if preset and not args.config:
        cfg = preset.train.replace(**{k: tuple(v) if k == "betas" else v for k, v in overrides.items()})
    else:
        cfg = build_train_config(args, dp)
    if args.megatron_deepspeed and args.target != "deepspeed":
        raise ValueError("--megatron-deepspeed goes with --deepspeed")
    if args.target == "deepspeed":
        ds = to_deepspeed(cfg, dp, megatron=args.megatron_deepspeed)
        text = json.dumps(ds, indent=2) + "\n"
        if not args.no_check:
            try:
                version = check_deepspeed(ds, dp)
                print(f"minimega export-config: checked against DeepSpeed {version}'s config classes", file=sys.stderr)
            except ImportError:
                print("minimega export-config: deepspeed is not installed; keys not checked against its classes",
                      file=sys.stderr)
    elif args.target == "megatron":
        argv = to_megatron(cfg, dp, model)
        pairs, i = [], 0
        while i < len(argv):
            has_value = i + 1 < len(argv) and not argv[i + 1].startswith("--")
            pairs.append(" ".join(argv[i:i + 2]) if has_value else argv[i])
            i += 2 if has_value else 1
        text = "pretrain_gpt.py \\\n    " + " \\\n    ".join(pairs) + "\n"
    else:
        text = to_torchtitan(cfg, dp, model)
    for note in notes(cfg, args.target, model):
        print(f"minimega export-config: note: {note}", file=sys.stderr)
    if args.out:
        Path(args.out).write_text(text)
        print(f"wrote {args.out}", file=sys.stderr)
    else:
        print(text, end="")
    return 0
