"""What each stack calls each `TrainConfig` field (`TABLE`), and the helpers every exporter shares.

"—" in a cell starts a refusal: the exporter raises `ExportError` naming the field and the target when the
field differs from its default, with the text after the dash saying why.
"""
from __future__ import annotations

import dataclasses

from ..config import TrainConfig

TARGETS = ("deepspeed", "megatron", "torchtitan")


class ExportError(ValueError):
    """A setting the target cannot express; the message names the setting, the target and what to change."""


MEASUREMENT = "a measurement of minimega's engine (the per-op peak sampling), not carried by this export"


def refuse(target: str, field: str, value, why: str) -> ExportError:
    return ExportError(f"export to {target}: {field}={value!r} cannot be expressed: {why}")


def default_of(name: str):
    f = next((f for f in dataclasses.fields(TrainConfig) if f.name == name), None)
    return None if f is None else f.default


def get_field(cfg: TrainConfig, name: str):
    """A field's value, or its default where this TrainConfig has no such field (fields added by newer code)."""
    return getattr(cfg, name, default_of(name))


def split_evenly(total: int, parts: int, what: str) -> int:
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
     "— the exported model is dense (minimega.parallel.moe.layer models are not exported)",
     "— the exported model is dense (minimega.parallel.moe.layer models are not exported)"),
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
    ("precision", "bf16.enabled (+ fp32 grad_accum_dtype and communication_data_type) | fp16.enabled",
     "--bf16 | --fp16",
     "— fp32 only (mixed_precision_param float32): bf16 (float32 reduce) is not written here, fp16 has no "
     "loss scaler"),
    ("offload_optimizer", "zero_optimization.offload_optimizer.device cpu", "--optimizer-cpu-offload",
     "— enable_cpu_offload also moves parameters and gradients"),
    ("nvme_path", "zero_optimization.offload_optimizer.device nvme + nvme_path",
     "— Megatron-LM offloads to host memory only", "— torchtitan offloads to host memory only"),
    ("bucket_mb", "zero_optimization.reduce_bucket_size (stage 0)", "--ddp-bucket-size",
     "— FSDP2 reduces one unit per call, no bucket size"),
    ("param_persistence_threshold", "zero_optimization.stage3_param_persistence_threshold",
     "— Megatron-FSDP has no persistence threshold", "— FSDP2 shards every wrapped unit"),
    ("prefetch", "zero_optimization.stage3_prefetch_bucket_size (0: off)", "— Megatron-FSDP always prefetches",
     "— FSDP2 always prefetches the next unit"),
    ("overlap_comm", "zero_optimization.overlap_comm", "--overlap-grad-reduce (+ --overlap-param-gather)",
     "— FSDP2 always overlaps"),
    ("memory_peak_steps", *[f"— {MEASUREMENT}"] * 3),
    ("async_save", "— how a checkpoint is written (blocking or in the background) is not carried by this export", "— how a checkpoint is written (blocking or in the background) is not carried by this export", "— how a checkpoint is written (blocking or in the background) is not carried by this export"),
    ("reductions_in_flight", "— DeepSpeed bounds its reductions by reduce_bucket_size (bytes), not a count",
     "— Megatron-LM has no cap on the reductions in flight",
     "— FSDP2's cap (set_reduce_scatter_max_input_buffers, default 1) is set in code, not in the TOML"),
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
