"""`validate`: every check that can fail, made before any rank starts (no process group needed).

Together with `TrainConfig`'s own checks this decides, for any layout, whether the engine trains it;
`tests/test_composition.py` enumerates the whole space through it.
"""
from __future__ import annotations

from ..config import GPTConfig, TrainConfig
from ..mesh import ParallelDims
from ..parallel import context as cp_
from ..parallel.tensor import check_divisible
from ..pipeline import check as check_pipeline

# What this build of the engine can combine; anything else is refused before training starts.
_SUPPORTED = {"zero_stage": {0, 1, 2, 3}, "precision": {"fp32", "bf16", "fp16", "fp8"},
              "activation_checkpointing": {"none", "full", "selective"}}
# Pipeline settings that mean nothing without a pipeline: refused at pp = 1 unless left at their defaults.
_PIPELINE_ONLY = {"schedule": "1f1b", "micro_batches": 1, "virtual_stages": 1}


def validate(model_config: GPTConfig, config: TrainConfig, dims: ParallelDims, moe=None) -> None:
    """Every check that can fail, made before any rank starts (no process group needed), with the fix in the message.

    Together with `TrainConfig`'s own checks this decides, for any layout, whether the engine trains it;
    `tests/test_composition.py` enumerates the whole space through it. ``moe``: the model's
    `moe.MoEConfig` when it is a mixture of experts (what composes with it: `moe.check`).
    """
    for name, allowed in _SUPPORTED.items():
        if getattr(config, name) not in allowed:
            raise ValueError(f"TrainConfig.{name}={getattr(config, name)!r} is not supported by this engine "
                             f"(supported: {sorted(allowed)})")
    if config.tp != dims.tp or config.pp != dims.pp:
        raise ValueError(f"TrainConfig(tp={config.tp}, pp={config.pp}) does not match the mesh "
                         f"(tp={dims.tp}, pp={dims.pp}); build the mesh from the same numbers")
    if config.ep != dims.ep:
        raise ValueError(f"TrainConfig(ep={config.ep}) does not match the mesh (ep={dims.ep}); build the mesh "
                         f"from the same numbers")
    if moe is not None or dims.ep > 1:
        from ..parallel.moe.layer import check as check_moe     # only a mixture of experts loads it
        check_moe(moe, config, dims)
    if moe is not None and config.precision == "fp8":
        raise ValueError("precision='fp8' with a mixture of experts: the experts' linears are not converted; use bf16")
    cp_.check(model_config, config, dims)
    if config.zero_stage == 0 and config.precision != "fp32" and (wide := [
            f"{n}={getattr(dims, n)}" for n in ("tp", "pp", "cp") if getattr(dims, n) > 1]):
        raise ValueError(f"precision={config.precision!r} at zero_stage=0 with {', '.join(wide)}: DDP in 16 bits is "
                         f"built for data parallelism alone; use zero_stage=1 (the same step, masters sharded)")
    if moe is not None and config.zero_stage == 0 and config.precision != "fp32":
        raise ValueError(f"precision={config.precision!r} at zero_stage=0 with a mixture of experts: the experts' "
                         f"gradient sync keeps no fp32 copies; use zero_stage=1 or 2 (or precision='fp32')")
    if config.nvme_path is not None:
        from ..zero.nvme import check_directory
        check_directory(config.nvme_path)              # each rank's files go in a fresh directory under it
    config.rows_per_micro_step(dims.dp)
    if config.pp > 1:
        check_pipeline(config.schedule, config.pp, config.micro_batches, config.virtual_stages, model_config.n_layer)
        if config.gradient_accumulation_steps != 1:
            raise ValueError(f"pp={config.pp}: set micro_batches (the pipeline accumulates over them), not "
                             f"gradient_accumulation_steps={config.gradient_accumulation_steps}")
        if (config.batch_size // dims.dp) % config.micro_batches:
            raise ValueError(f"batch_size / dp = {config.batch_size} / {dims.dp} = "
                             f"{config.batch_size // dims.dp} rows per dp rank do not split into "
                             f"micro_batches={config.micro_batches}")
    else:
        for name, default in _PIPELINE_ONLY.items():
            if getattr(config, name) != default:
                raise ValueError(f"TrainConfig.{name}={getattr(config, name)!r} needs pp > 1 (there is no pipeline "
                                 f"to schedule); leave it at {default!r} or set pp")
    seq = config.seq_len or model_config.block_size
    if seq > model_config.block_size:
        raise ValueError(f"seq_len={seq} exceeds the model's block_size={model_config.block_size}")
    check_divisible(model_config, config.tp)
    if config.sequence_parallel and seq % config.tp:
        raise ValueError(f"sequence_parallel: seq_len={seq} is not divisible by tp={config.tp}")
