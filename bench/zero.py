"""Step time of minimega's ZeRO stages vs torch's counterparts on the same run (gloo ranks).

    python bench/zero.py [--steps 10] [--presets tiny small] [--nproc 2]

    stage 0  vs torch DistributedDataParallel
    stage 1  vs torch DDP + ZeroRedundancyOptimizer (optimizer states sharded)
    stage 2  vs torch FSDP2 fully_shard(reshard_after_forward=False)
    stage 3  vs torch FSDP2 fully_shard (per block + root)

and, when `deepspeed` is importable, DeepSpeed at the same stage. Each pair runs in the same launched
job, alternating, on identical data; ratio = minimega / other (median step time; < 1: minimega faster).
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist

import minimega as mm
from minimega import data
from minimega.tools import peers
from minimega.engine import make_optimizer
from minimega.tools.export_config import to_deepspeed


def _timed(step_fn, mesh, steps, batch, seq):
    times = []
    for x, y in data.batches(mesh, steps + 2, batch, seq):
        dist.barrier()
        t = time.perf_counter()
        step_fn(x, y)
        times.append(time.perf_counter() - t)
    return statistics.median(times[2:])


def _ours(model_cfg, stage, mesh, steps, batch, seq):
    torch.manual_seed(0)
    engine = mm.initialize(mm.GPT(model_cfg), mm.TrainConfig(batch_size=batch, zero_stage=stage), mesh)
    return _timed(lambda x, y: engine.train_step((x, y)), mesh, steps, batch, seq)


def _torch(model_cfg, stage, mesh, steps, batch, seq):
    torch.manual_seed(0)
    model = mm.GPT(model_cfg)
    config = mm.TrainConfig(batch_size=batch)
    if stage <= 1:
        from torch.nn.parallel import DistributedDataParallel
        model = DistributedDataParallel(model)
        if stage == 1:
            from torch.distributed.optim import ZeroRedundancyOptimizer
            opt = ZeroRedundancyOptimizer(model.parameters(), torch.optim.AdamW, lr=config.lr, betas=config.betas,
                                          eps=config.eps, weight_decay=config.weight_decay, foreach=False)
        else:
            opt = make_optimizer(model.parameters(), config)
    else:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        device_mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        for block in model.blocks:
            fully_shard(block, mesh=device_mesh, reshard_after_forward=stage == 3)
        fully_shard(model, mesh=device_mesh, reshard_after_forward=stage == 3)
        opt = make_optimizer(model.parameters(), config)

    def step(x, y):
        _, loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss = loss.detach().clone()
        dist.all_reduce(loss)                      # the engine also reports the global loss
    return _timed(step, mesh, steps, batch, seq)


def _deepspeed(model_cfg, stage, mesh, steps, batch, seq):
    """DeepSpeed's engine on the same run: the ds_config export_config writes, torch's AdamW as in peers.py."""
    if peers.deepspeed_missing():
        return None
    import importlib

    import deepspeed
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None    # inference-only kernel, no JIT
    torch.manual_seed(0)
    model = mm.GPT(model_cfg)
    config = mm.TrainConfig(batch_size=batch, zero_stage=stage)
    ds_config = to_deepspeed(config, dist.get_world_size())
    ds_config.pop("optimizer")
    ds_config["steps_per_print"] = 10**9
    engine, *_ = deepspeed.initialize(model=model, optimizer=make_optimizer(model.parameters(), config),
                                      config=ds_config)

    def step(x, y):
        _, loss = engine(x, y)
        engine.backward(loss)
        engine.step()
    return _timed(step, mesh, steps, batch, seq)


def _bench(preset, stages, steps, batch, seq, with_deepspeed):
    mesh = mm.init_mesh(mm.ParallelDims(dp=dist.get_world_size()))
    cfg = mm.GPTConfig.preset(preset)
    rows = {}
    for stage in stages:
        ours, theirs = [], []
        for _ in range(2):                         # alternate to share any drift in machine load
            ours.append(_ours(cfg, stage, mesh, steps, batch, seq))
            theirs.append(_torch(cfg, stage, mesh, steps, batch, seq))
        ds = _deepspeed(cfg, stage, mesh, steps, batch, seq) if with_deepspeed else None
        rows[stage] = (min(ours), min(theirs), ds)
    return rows


TORCH_NAME = {0: "DDP", 1: "DDP+ZeRO-Opt", 2: "FSDP2 no-reshard", 3: "FSDP2"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--presets", nargs="+", default=["tiny", "small"])
    parser.add_argument("--stages", nargs="+", type=int, default=[0, 1, 2, 3])
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--deepspeed", action="store_true", help="also time DeepSpeed (if installed)")
    args = parser.parse_args()
    if args.deepspeed:
        os.environ.setdefault("DS_ACCELERATOR", "cpu")          # the launched ranks inherit it
    print(f"| preset | stage | minimega s/step | torch | torch s/step | ratio | DeepSpeed s/step | ratio |")
    print("|---|---|---|---|---|---|---|---|")
    for preset in args.presets:
        batch, seq = (8, 64) if preset == "tiny" else (8, 128)
        rows = mm.launch(_bench, args.nproc, preset, args.stages, args.steps, batch, seq, args.deepspeed,
                         backend="gloo" if args.deepspeed else "auto")[0]     # DeepSpeed runs on its CPU accelerator
        for stage, (ours, theirs, ds) in rows.items():
            ds_cols = f"{ds:.4f} | {ours / ds:.3f}" if ds else "- | -"
            print(f"| {preset} | {stage} | {ours:.4f} | {TORCH_NAME[stage]} | {theirs:.4f} | {ours / theirs:.3f} "
                  f"| {ds_cols} |")


if __name__ == "__main__":
    main()
