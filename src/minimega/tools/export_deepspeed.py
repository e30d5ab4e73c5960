"""`TrainConfig` → ds_config.json (DeepSpeed 0.19.8), checked live against DeepSpeed's own config classes."""
from __future__ import annotations


from ..config import TrainConfig
from .export_table import MEASUREMENT, ExportError, default_of, get_field, refuse, split_evenly


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
    if cfg.precision == "fp8":
        raise refuse(target, "precision", "fp8", "DeepSpeed's config has no fp8 section (fp8 comes from Transformer "
                      "Engine in the model code); use bf16")
    if get_field(cfg, "cp_attention") != "ring":
        raise refuse(target, "cp_attention", get_field(cfg, "cp_attention"), "DeepSpeed-Ulysses is wired in the model "
                      "code (DistributedAttention) and Megatron-DeepSpeed's --ds-sequence-parallel-size, not "
                      "ds_config.json (set cp=1)")
    if get_field(cfg, "cp") != 1:
        raise refuse(target, "cp", get_field(cfg, "cp"), "DeepSpeed's context parallelism is Ulysses (all-to-all over "
                      "heads), not minimega's ring attention (set cp=1)")
    if get_field(cfg, "ep") != 1:
        raise refuse(target, "ep", get_field(cfg, "ep"), "the exported model is dense; minimega.parallel.moe.layer models are not "
                      "exported (set ep=1)")
    if not megatron and (set_here := [n for n in _MEGATRON_SIDE if get_field(cfg, n) != default_of(n)]):
        named = ", ".join(f"{n}={get_field(cfg, n)!r}" for n in set_here)
        raise ExportError(f"export to deepspeed: {named} cannot be expressed: ds_config.json has no such keys; "
                          "they go on Megatron-DeepSpeed's command line (export --megatron, and --deepspeed "
                          "--megatron-deepspeed for its ds_config)")
    if cfg.pp > 1 and cfg.schedule == "gpipe":
        raise refuse(target, "schedule", cfg.schedule, "DeepSpeed's pipeline engine runs 1F1B")
    if cfg.pp > 1 and cfg.schedule == "zb_h1":
        raise refuse(target, "schedule", cfg.schedule, "DeepSpeed's pipeline engine runs 1F1B (no B/W split)")
    if cfg.virtual_stages > 1:
        raise refuse(target, "virtual_stages", cfg.virtual_stages, "DeepSpeed's pipeline engine has no interleaving")
    steps = cfg.micro_batches if cfg.pp > 1 else cfg.gradient_accumulation_steps
    micro = split_evenly(cfg.batch_size, dp * steps, "batch_size / (dp · accumulation steps)")
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
    if get_field(cfg, "overlap_comm") != (stage == 3):        # DeepSpeed's default: on at stage 3 only
        zero["overlap_comm"] = get_field(cfg, "overlap_comm")
    if get_field(cfg, "reductions_in_flight") != default_of("reductions_in_flight"):
        raise refuse(target, "reductions_in_flight", get_field(cfg, "reductions_in_flight"), "DeepSpeed bounds its "
                      "reductions by reduce_bucket_size (bytes), not a count")
    if get_field(cfg, "memory_peak_steps") != default_of("memory_peak_steps"):
        raise refuse(target, "memory_peak_steps", cfg.memory_peak_steps, MEASUREMENT)
    if get_field(cfg, "async_save"):
        raise refuse(target, "async_save", True, "how a checkpoint is written (blocking or in the background) is not carried by this export")
    if cfg.bucket_mb != default_of("bucket_mb"):
        if cfg.zero_stage:
            raise refuse(target, "bucket_mb", cfg.bucket_mb, "minimega's ZeRO reduces one unit per call; "
                          "reduce_bucket_size sizes DeepSpeed's ZeRO buckets, a different thing")
        zero["reduce_bucket_size"] = round(cfg.bucket_mb * 2**20 / 4)          # MiB of fp32 -> elements
    if cfg.zero_stage == 3:
        # DeepSpeed keeps parameters under 1e5 elements whole by default; minimega shards all (threshold 0)
        zero["stage3_param_persistence_threshold"] = cfg.param_persistence_threshold
        if not cfg.prefetch:
            zero["stage3_prefetch_bucket_size"] = 0
    if cfg.offload_optimizer:
        nvme = get_field(cfg, "nvme_path")
        zero["offload_optimizer"] = {"device": "nvme", "nvme_path": nvme} if nvme else {"device": "cpu"}
    ds["zero_optimization"] = zero
    # --8<-- [end:deepspeed_zero]
    if cfg.precision == "bf16":
        ds["bf16"] = {"enabled": True}
        if stage >= 1:
            # minimega sums and reduces bf16 gradients in fp32 (main_grad); DeepSpeed's ZeRO-1 then runs its
            # BF16_Optimizer (train/engine.py _do_optimizer_sanity_check). Stage 0's BF16_Optimizer sums in fp32 already.
            ds["data_types"] = {"grad_accum_dtype": "fp32"}
            ds["communication_data_type"] = "fp32"
    elif cfg.precision == "fp16":
        if cfg.min_loss_scale != int(cfg.min_loss_scale):
            raise refuse(target, "min_loss_scale", cfg.min_loss_scale, "DeepSpeed's fp16.min_loss_scale is an "
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
    import torch
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
            "grad_accum_dtype": parsed.grad_accum_dtype, "communication_data_type": parsed.communication_data_type,
            "optimizer": parsed.optimizer_name, "optimizer_params": parsed.optimizer_params}
    expect = {"gradient_accumulation_steps": ds["gradient_accumulation_steps"],
              "train_micro_batch_size_per_gpu": ds["train_micro_batch_size_per_gpu"],
              "gradient_clipping": ds["gradient_clipping"], "stage": want["stage"],
              "bf16": "bf16" in ds, "fp16": "fp16" in ds,
              "grad_accum_dtype": ds.get("data_types", {}).get("grad_accum_dtype"),
              "communication_data_type": {None: None, "fp32": torch.float32}[ds.get("communication_data_type")],
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
