"""The same run in DeepSpeed's own engine: `model.py`, the same data, the config `export_config` writes.

    run_pair(model_config, config, world_size, steps)  ->  {"minimega": rank 0's result, "deepspeed": rank 0's result}

Each rank builds `GPT(model_config)` from the same seed, takes the same rows of the same global batches
(`data.batches`), and trains it twice in one launched job: once with `minimega.initialize`, once with
`deepspeed.initialize(model, optimizer, config=to_deepspeed(config, dp))`. Both use torch's own AdamW
(`engine.make_optimizer`), so the update rule is the same code; what differs is who shards, reduces,
accumulates and clips. A result holds the global mean loss per step, the consolidated fp32 weights under
model.py's names (DeepSpeed: `safe_get_full_fp32_param`, its own gather of the master shards), and the
bytes this rank holds per category, counted on the tensors each engine keeps (`measure.tensor_bytes`).

DeepSpeed runs here on its CPU accelerator over the gloo group `minimega.run.launch` already set up. Two
things are left out on purpose: DeepSpeed's fused Adam (a JIT build of ~100 s; torch's AdamW is the
reference anyway) and its shared-memory all-reduce (`deepspeed_shm_comm`, a ~70 s JIT build on a fresh
machine, used only by `inference_all_reduce`, which training never calls).
"""
from __future__ import annotations

import importlib.util
import os

import torch

from .. import data
from ..run import measure
from ..config import GPTConfig, TrainConfig
from .export_config import to_deepspeed

SUPPORTED = "zero_stage 1-3, precision fp32/bf16, gradient_accumulation_steps, gradient_clipping, adamw/adam"


def deepspeed_missing() -> str | None:
    """Why DeepSpeed cannot run here, or None when it can."""
    if importlib.util.find_spec("deepspeed") is None:
        return "deepspeed is not installed (pip install 'minimega[deepspeed]', or deepspeed==0.19.8)"
    return None


def check(config: TrainConfig) -> None:
    """Refuse, by name, what the side-by-side run does not implement."""
    if config.zero_stage not in (1, 2, 3):
        raise ValueError(f"peers: zero_stage={config.zero_stage}; the side-by-side run covers ZeRO 1, 2 and 3")
    if config.precision not in ("fp32", "bf16"):
        raise ValueError(f"peers: precision={config.precision!r}; use 'fp32' or 'bf16' (DeepSpeed's fp16 loss "
                         "scaler is not wired here)")
    for name in ("tp", "pp"):
        if getattr(config, name) != 1:
            raise ValueError(f"peers: {name}={getattr(config, name)}; DeepSpeed's engine alone has no Megatron "
                             "tensor or pipeline parallelism (that is Megatron-DeepSpeed)")
    if config.offload_optimizer:
        raise ValueError("peers: offload_optimizer=True; DeepSpeed offloads with its own CPU Adam (a JIT build), "
                         "not torch's AdamW, so the two runs would not share an update rule")
    if config.optimizer == "sgd":
        raise ValueError("peers: optimizer='sgd'; DeepSpeed's ZeRO accepts only the optimizers it has tested "
                         "(Adam, AdamW)")


def _rank_bytes(params, master, states, grads) -> dict:
    states = list(states)
    return {"params": measure.tensor_bytes(params), "grads": measure.tensor_bytes(grads),
            "master": measure.tensor_bytes(master),
            "optimizer_states": measure.tensor_bytes(t for t in states if t.dim() > 0),
            "optimizer_step_counters": measure.tensor_bytes(t for t in states if t.dim() == 0)}


def _deepspeed_memory(engine, stage: int) -> dict:
    """Bytes this rank holds in DeepSpeed's engine, by minimega's categories.

    params: the 16-bit (or fp32) working weights the module computes with (ZeRO-3: this rank's `ds_tensor`
    shards); master: the fp32 partitions the wrapped torch optimizer steps; optimizer_states: its moments.
    """
    module_params = list(engine.module.parameters())
    if stage == 3:        # this rank's shards, plus whole copies of the parameters DeepSpeed keeps persistent
        params = [p.ds_tensor for p in module_params] + [p.data for p in module_params if getattr(p, "ds_persist", False)]
    else:
        params = [p.data for p in module_params]
    inner = engine.optimizer.optimizer                  # the torch AdamW DeepSpeed wraps
    # the fp32 partitions it steps (stage3.py / stage_1_and_2.py / bf16_optimizer.py names, DeepSpeed 0.19.8;
    # bf16 at stage 1 with fp32 gradient accumulation is BF16_Optimizer)
    opt = engine.optimizer
    master = list(opt.fp32_partitioned_groups_flat if stage == 3 else
                  opt.fp32_groups_flat_partition if hasattr(opt, "fp32_groups_flat_partition")
                  else opt.single_partition_of_fp32_groups)
    seen = {(t.untyped_storage().data_ptr(), t.device) for t in params}
    master = [p for p in master if (p.untyped_storage().data_ptr(), p.device) not in seen]
    states = [t for s in inner.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
    grads = [p.grad for p in module_params] + [p.grad for p in master]
    return _rank_bytes(params, master, states, grads)


def _mean_over_ranks(value: torch.Tensor) -> float:
    import torch.distributed as dist
    value = value.detach().to(torch.float64).clone()
    dist.all_reduce(value)
    return value.item() / dist.get_world_size()


# --8<-- [start:deepspeed_side]
def deepspeed_engine(model, config: TrainConfig, updates: dict | None = None):
    """Inside a launched rank: DeepSpeed's engine for ``model`` with the config `to_deepspeed` writes and torch's
    AdamW as its optimizer; ``updates`` change that config (a section's keys merged into it)."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import importlib
    import warnings

    import deepspeed
    import torch.distributed as dist

    from ..train.engine import make_optimizer

    # DeepSpeed calls torch.distributed's deprecated *_tensor collectives: one warning per call
    warnings.filterwarnings("ignore", message=r".*is deprecated\. Please use .*torch\.distributed", category=FutureWarning)
    # inference-only all-reduce kernel: skip its JIT build (see the module docstring). By module path:
    # `deepspeed.comm.torch` as an attribute is PyTorch itself (deepspeed.comm re-exports `torch`).
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
    deepspeed.init_distributed(dist_backend="gloo")          # adopts the process group launch() set up
    ds_config = to_deepspeed(config, dist.get_world_size())
    ds_config.pop("optimizer")                               # torch's AdamW, passed as the client optimizer
    ds_config["steps_per_print"] = 10**9
    for key, value in (updates or {}).items():
        if isinstance(value, dict) and isinstance(ds_config.get(key), dict):
            ds_config[key].update(value)
        else:
            ds_config[key] = value
    engine, *_ = deepspeed.initialize(model=model, optimizer=make_optimizer(model.parameters(), config),
                                      config=ds_config)
    return engine


def train_deepspeed(model_config: GPTConfig, config: TrainConfig, steps: int, seq_len: int | None = None) -> dict:
    """Inside a launched rank: train model.py with DeepSpeed's engine; losses, fp32 weights, bytes held."""
    import torch.distributed as dist

    from ..mesh import ParallelDims, init_mesh
    from ..model import GPT

    check(config)
    mesh = init_mesh(ParallelDims(dp=dist.get_world_size()))
    torch.manual_seed(config.seed)
    engine = deepspeed_engine(GPT(model_config), config)
    import deepspeed
    from deepspeed.utils import safe_get_full_fp32_param

    seq = seq_len or model_config.block_size
    ga, losses, norms = config.gradient_accumulation_steps, [], []
    for x, y in data.batches(mesh, steps, config.batch_size, seq, seed=config.seed):
        total = torch.zeros(())
        for xm, ym in zip(x.chunk(ga), y.chunk(ga)):
            _, loss = engine(xm, ym)
            engine.backward(loss)             # DeepSpeed divides by gradient_accumulation_steps itself
            engine.step()                     # steps the optimizer at the accumulation boundary only
            total += loss.detach().float()
        losses.append(_mean_over_ranks(total / ga))
        if config.gradient_clipping:
            norms.append(float(engine.get_global_grad_norm()))
    weights = {name: safe_get_full_fp32_param(p).detach().clone().float()
               for name, p in engine.module.named_parameters()}
    return {"losses": losses, "grad_norms": norms, "weights": weights,
            "memory": _deepspeed_memory(engine, config.zero_stage),
            "optimizer": type(engine.optimizer).__name__, "deepspeed": deepspeed.__version__}
# --8<-- [end:deepspeed_side]


def train_minimega(model_config: GPTConfig, config: TrainConfig, steps: int, seq_len: int | None = None) -> dict:
    """Inside a launched rank: the same run with minimega's engine."""
    import torch.distributed as dist

    from ..train.engine import initialize
    from ..mesh import ParallelDims, init_mesh
    from ..model import GPT

    mesh = init_mesh(ParallelDims(dp=dist.get_world_size()))
    torch.manual_seed(config.seed)
    engine = initialize(GPT(model_config), config, mesh)
    seq = seq_len or model_config.block_size
    for batch in data.batches(mesh, steps, config.batch_size, seq, seed=config.seed):
        engine.train_step(batch)
    return {"losses": list(engine.losses), "grad_norms": list(engine.grad_norms), "weights": engine.full_state_dict(),
            "memory": engine.memory()}


def pair_worker(model_config: GPTConfig, configs: list[TrainConfig], steps: int, seq_len: int | None = None) -> list:
    """Inside a launched rank: for each config, minimega then DeepSpeed on the same data (one job, many cases)."""
    out = []
    for config in configs:
        out.append({"config": config, "minimega": train_minimega(model_config, config, steps, seq_len),
                    "deepspeed": train_deepspeed(model_config, config, steps, seq_len)})
    return out


def run_pairs(model_config: GPTConfig, configs: list[TrainConfig], world_size: int = 2, steps: int = 10,
              seq_len: int | None = None, timeout: float | None = None) -> list[dict]:
    """Launch `world_size` ranks and run every config both ways; rank 0's results, one dict per config."""
    from ..run.launch import launch

    if reason := deepspeed_missing():
        raise RuntimeError(f"peers: {reason}")
    for config in configs:
        check(config)
    os.environ.setdefault("DS_ACCELERATOR", "cpu")        # the ranks follow this process's environment
    # gloo on CPU for both engines, also where CUDA exists: DeepSpeed runs on its CPU accelerator here
    return launch(pair_worker, world_size, model_config, list(configs), steps, seq_len, backend="gloo",
                  timeout=timeout)[0]


def max_relative_error(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """max over tensors of ||a - b|| / ||b|| (keys must match)."""
    if set(a) != set(b):
        raise ValueError(f"different tensors: {sorted(set(a) ^ set(b))}")
    return max(((a[k].float() - b[k].float()).norm() / b[k].float().norm().clamp_min(1e-30)).item() for k in a)
