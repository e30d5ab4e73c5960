"""`TrainConfig` → Megatron-LM's pretrain_gpt.py arguments and torchtitan v0.2.2's TOML job config."""
from __future__ import annotations

import json
import math

from ..config import GPTConfig, TrainConfig
from .export_table import MEASUREMENT, ExportError, default_of, get_field, refuse, split_evenly


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
    # Llama's blocks (GPTConfig n_kv_head, mlp, position): the _add_network_size_args group of training/arguments.py
    # (its add_argument calls, Megatron-LM main 2025-26; these five are not pinned to d98e8a6's line numbers).
    "--group-query-attention": "training/arguments.py, _add_network_size_args",
    "--num-query-groups": "training/arguments.py, _add_network_size_args",
    "--swiglu": "training/arguments.py, _add_network_size_args",
    "--position-embedding-type": "training/arguments.py, _add_network_size_args",
    "--rotary-base": "training/arguments.py, _add_network_size_args (type=int)",
    "--rotary-interleaved": "training/arguments.py, _add_network_size_args",
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
    if cfg.precision == "fp8":
        raise refuse(target, "precision", "fp8", "minimega's fp8 recipe (delayed scaling, history 1024, margin 0) is "
                      "not mapped to --fp8-format and its friends; use bf16")
    if get_field(cfg, "ep") != 1:
        raise refuse(target, "ep", get_field(cfg, "ep"), "the exported model is dense; minimega.parallel.moe.layer models are not "
                      "exported (set ep=1)")
    a: list[tuple[str, object]] = [("--tensor-model-parallel-size", cfg.tp), ("--pipeline-model-parallel-size", cfg.pp)]
    if get_field(cfg, "cp") != 1:      # Megatron's ring (cp_comm_type p2p, the default) with the same mirrored chunks
        a.append(("--context-parallel-size", cfg.cp))
        if get_field(cfg, "cp_attention") == "ulysses":      # a2a: heads scattered over cp, DeepSpeed-Ulysses' scheme
            a.append(("--cp-comm-type", "a2a"))
    if cfg.pp > 1:
        if cfg.schedule == "gpipe":
            raise refuse(target, "schedule", cfg.schedule, "Megatron-LM runs 1F1B and interleaved 1F1B only")
        if cfg.schedule == "zb_h1":
            raise refuse(target, "schedule", cfg.schedule, "Megatron-LM has no zero-bubble schedule (1F1B and "
                         "interleaved 1F1B only)")
        if cfg.schedule == "interleaved_1f1b":
            a.append(("--num-layers-per-virtual-pipeline-stage",
                      split_evenly(model.n_layer, cfg.pp * cfg.virtual_stages, "n_layer / (pp · virtual_stages)")))
    if cfg.sequence_parallel:
        a.append(("--sequence-parallel", None))
    if cfg.activation_checkpointing == "full":
        if cfg.checkpoint_every != 1:
            raise refuse(target, "checkpoint_every", cfg.checkpoint_every, "Megatron-LM's --recompute-method block "
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
            raise refuse(target, "param_persistence_threshold", cfg.param_persistence_threshold,
                          "Megatron-FSDP has no persistence threshold")
        if not cfg.prefetch:
            raise refuse(target, "prefetch", cfg.prefetch, "Megatron-FSDP always prefetches")
    if get_field(cfg, "reductions_in_flight") != default_of("reductions_in_flight"):
        raise refuse(target, "reductions_in_flight", get_field(cfg, "reductions_in_flight"),
                      "Megatron-LM has no cap on the reductions in flight")
    if get_field(cfg, "memory_peak_steps") != default_of("memory_peak_steps"):
        raise refuse(target, "memory_peak_steps", cfg.memory_peak_steps, MEASUREMENT)
    if get_field(cfg, "async_save"):
        raise refuse(target, "async_save", True, "how a checkpoint is written (blocking or in the background) is not carried by this export")
    if get_field(cfg, "overlap_comm"):
        a.append(("--overlap-grad-reduce", None))
        if cfg.zero_stage == 1:
            a.append(("--overlap-param-gather", None))
    if cfg.bucket_mb != default_of("bucket_mb"):
        a.append(("--ddp-bucket-size", round(cfg.bucket_mb * 2**20 / 4)))           # elements
    if get_field(cfg, "nvme_path") is not None:
        raise refuse(target, "nvme_path", get_field(cfg, "nvme_path"), "Megatron-LM offloads to host memory only")
    if cfg.offload_optimizer:
        a.append(("--optimizer-cpu-offload", None))
    steps = cfg.micro_batches if cfg.pp > 1 else cfg.gradient_accumulation_steps
    a += [("--micro-batch-size", split_evenly(cfg.batch_size, dp * steps, "batch_size / (dp · micro-batches)")),
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
            raise refuse(target, "optimizer", cfg.optimizer, "Megatron-LM's adam always decouples weight decay "
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
    a += _llama_flags(model)
    argv: list[str] = []
    for flag, value in a:
        argv += [flag] if value is None else [flag, _num(value)]
    return argv
# --8<-- [end:to_megatron]


def _llama_flags(model: GPTConfig) -> list[tuple[str, object]]:
    """Grouped-query attention, SwiGLU (Megatron's --ffn-hidden-size is then the width of each of gate and up, F,
    as minimega's) and RoPE on adjacent feature pairs (Megatron rotates halves unless --rotary-interleaved)."""
    a: list[tuple[str, object]] = []
    if model.kv_heads != model.n_head:
        a += [("--group-query-attention", None), ("--num-query-groups", model.kv_heads)]
    if model.mlp == "swiglu":
        a.append(("--swiglu", None))
    if model.position == "rope":
        if model.rope_theta != int(model.rope_theta):
            raise refuse("megatron", "rope_theta", model.rope_theta, "Megatron-LM's --rotary-base is an integer; "
                         "use a whole-number base")
        a += [("--position-embedding-type", "rope"), ("--rotary-base", int(model.rope_theta)),
              ("--rotary-interleaved", None)]
    return a


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
    if cfg.precision == "fp8":
        raise refuse(target, "precision", "fp8", "this exporter writes torchtitan's fp32 policy only; use fp32")
    if get_field(cfg, "cp_attention") != "ring":
        raise refuse(target, "cp_attention", get_field(cfg, "cp_attention"), "torchtitan v0.2.2 has no head-split "
                      "context parallelism (its rotate method 'alltoall' still passes K/V around the ring)")
    if get_field(cfg, "cp") != 1:
        raise refuse(target, "cp", get_field(cfg, "cp"), "this exporter does not write torchtitan's context-parallel "
                      "options (set cp=1)")
    if get_field(cfg, "ep") != 1:
        raise refuse(target, "ep", get_field(cfg, "ep"), "the exported model is dense; minimega.parallel.moe.layer models are not "
                      "exported (set ep=1)")

    def refuse_unless_default(name, why):
        if get_field(cfg, name) != default_of(name):
            raise refuse(target, name, get_field(cfg, name), why)

    if cfg.precision == "bf16":
        raise refuse(target, "precision", "bf16", "this exporter writes torchtitan's fp32 policy only "
                      "(mixed_precision_param float32); use fp32")
    if cfg.precision == "fp16":
        scaler = "".join(f", {n}={get_field(cfg, n)!r}" for n in ("loss_scale", "initial_scale_power", "loss_scale_window",
                                                            "hysteresis", "min_loss_scale") if get_field(cfg, n) != default_of(n))
        raise ExportError(f"export to torchtitan: precision='fp16'{scaler} cannot be expressed: torchtitan has no "
                          "fp16 loss scaler; use fp32")
    if cfg.zero_stage == 1:
        raise refuse(target, "zero_stage", 1, "FSDP2 shards parameters and gradients too; it has no "
                      "optimizer-only sharding (use zero_stage 2 or 3)")
    if cfg.tp > 1 and not cfg.sequence_parallel:
        raise refuse(target, "sequence_parallel", False, "torchtitan's tensor parallelism always shards the "
                      "norms along the sequence; set sequence_parallel=True")
    if cfg.activation_checkpointing == "selective":
        raise refuse(target, "activation_checkpointing", "selective", "torchtitan's op-level selective policy "
                      "saves matmul outputs and recomputes the rest, not minimega's attention-core recompute")
    refuse_unless_default("checkpoint_every", "selective_ac_option N checkpoints layers N-1, 2N-1, …, not 0, k, 2k, …")
    refuse_unless_default("nvme_path", "torchtitan offloads to host memory only")
    refuse_unless_default("memory_peak_steps", MEASUREMENT)
    refuse_unless_default("async_save", "how a checkpoint is written (blocking or in the background) is not carried by this export")
    refuse_unless_default("offload_optimizer", "training.enable_cpu_offload also moves parameters and gradients")
    refuse_unless_default("bucket_mb", "FSDP2 reduces one unit per call; there is no bucket size")
    refuse_unless_default("param_persistence_threshold", "FSDP2 shards every wrapped unit")
    refuse_unless_default("prefetch", "FSDP2 always prefetches the next unit")
    refuse_unless_default("overlap_comm", "FSDP2 always overlaps communication")
    refuse_unless_default("reductions_in_flight", "FSDP2's cap (set_reduce_scatter_max_input_buffers) is set in "
                          "code, not in the TOML")
    if cfg.optimizer == "sgd":
        raise refuse(target, "optimizer", "sgd", "torchtitan v0.2.2 builds Adam and AdamW only")
    steps = cfg.micro_batches if cfg.pp > 1 else cfg.gradient_accumulation_steps
    local = split_evenly(cfg.batch_size, dp * (1 if cfg.pp > 1 else steps), "batch_size / (dp · accumulation)")
    training = {"local_batch_size": local, "global_batch_size": cfg.batch_size, "seq_len": cfg.seq_len or model.block_size,
                "max_norm": cfg.gradient_clipping or math.inf, "mixed_precision_param": "float32"}
    par: dict = {"data_parallel_replicate_degree": dp if cfg.zero_stage == 0 else 1,
                 "data_parallel_shard_degree": 1 if cfg.zero_stage == 0 else dp,
                 "tensor_parallel_degree": cfg.tp, "pipeline_parallel_degree": cfg.pp}
    if cfg.zero_stage:
        par["fsdp_reshard_after_forward"] = "always" if cfg.zero_stage == 3 else "never"
    if cfg.pp > 1:
        if cfg.schedule == "zb_h1":
            raise refuse(target, "schedule", cfg.schedule, "torchtitan's zero-bubble schedules are the "
                         "interleaved and V-shaped ones (several stages per rank), not ZB-H1")
        par["pipeline_parallel_schedule"] = {"gpipe": "GPipe", "1f1b": "1F1B",
                                             "interleaved_1f1b": "Interleaved1F1B"}[cfg.schedule]
        par["pipeline_parallel_microbatch_size"] = split_evenly(local, cfg.micro_batches, "local batch / micro_batches")
        par["pipeline_parallel_layers_per_stage"] = split_evenly(model.n_layer, cfg.pp * cfg.virtual_stages,
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
