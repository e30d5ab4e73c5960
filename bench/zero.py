"""Step time and peak memory of minimega's ZeRO stages vs torch and DeepSpeed on the same run (gloo ranks).

    python bench/zero.py [--stages 0 1 2 3] [--sides minimega torch deepspeed] [--repeats 3] [--steps 6]
                         [--model 23m] [--nproc 2] [--allocator returned|default]

    stage 0  vs torch DistributedDataParallel
    stage 1  vs torch DDP + ZeroRedundancyOptimizer (optimizer states sharded)
    stage 2  vs torch FSDP2 fully_shard(reshard_after_forward=False)
    stage 3  vs torch FSDP2 fully_shard (per block + root)

and DeepSpeed at the same stage (its engine on the exported ds_config, torch's AdamW), when installed.
Same `minimega.GPT`, seed and batches, fp32, AdamW, on every side.

Each side runs in a process of its own (its ranks forked from a fresh launcher), so one side's freed
memory never counts in the next one's RSS. The sides are interleaved, A B C A B C ..., ``--repeats``
times, so that a change in the machine's load falls on all of them alike. Per run and rank:

- step time: the median over ``--steps`` steps after two warm-up steps (barrier, step, the slowest rank);
- peak RSS above the baseline: ``VmHWM`` during the steps (reset through ``/proc/self/clear_refs`` after the
  model is built) minus ``VmRSS`` before the model was built (after ``malloc_trim``), the worse rank.

``--allocator returned`` (default) fixes glibc's mmap threshold at 128 KiB (``mallopt(M_MMAP_THRESHOLD)``)
so that every large buffer is unmapped as soon as it is freed and RSS follows the live tensors;
``default`` leaves glibc as it is (freed blocks stay in the process and count in RSS; the ranks run with
``MINIMEGA_MALLOC=glibc``, so without `run.processes.keep_freed_memory`).

The table shows, per side, the min and median over the repeats of each run's step time, and the min and
median peak; ratio = minimega / other (< 1: minimega faster or smaller), from the medians.

Reading the noise: step times on a shared CPU move with other people's load (the launcher prints the load
average before and after). A time ratio is a finding only when the min ratio and the median ratio agree
(within ~10 %) and the load average did not jump during the run; otherwise rerun. Peak RSS barely depends
on load: the peaks of the repeats agree within a few MiB, so the memory ratios hold from one run to the next.
"""
from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.distributed as dist

import minimega as mm
from minimega import data
from minimega.train.engine import make_optimizer

MODELS = {"23m": dict(n_layer=13), "small": {}}          # GPTConfig.small(**...): 23.3M and 10.9M parameters
TORCH_NAME = {0: "DDP", 1: "DDP+ZeRO-Opt", 2: "FSDP2 no-reshard", 3: "FSDP2"}
SIDES = ("minimega", "torch", "deepspeed")


def _status(field: str) -> int:
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(field)


def _trimmed_rss() -> int:
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    return _status("VmRSS")


def _build(side, model_cfg, stage, mesh, batch):
    """() -> the step function ``(x, y) -> None`` of one side."""
    torch.manual_seed(0)
    model = mm.GPT(model_cfg)
    config = mm.TrainConfig(batch_size=batch, zero_stage=stage)
    if side == "minimega":
        engine = mm.initialize(model, config, mesh)
        return lambda x, y: engine.train_step((x, y))
    if side == "deepspeed":
        import importlib

        import deepspeed
        from minimega.tools.export_config import to_deepspeed
        importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None    # inference-only, no JIT
        ds_config = to_deepspeed(config, dist.get_world_size())
        ds_config.pop("optimizer")
        ds_config["steps_per_print"] = 10**9
        engine, *_ = deepspeed.initialize(model=model, optimizer=make_optimizer(model.parameters(), config),
                                          config=ds_config)

        def ds_step(x, y):
            _, loss = engine(x, y)
            engine.backward(loss)
            engine.step()
        return ds_step
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
    return step


def _side(side, model, stage, steps, batch, seq, allocator):
    """One rank of one side: (median step time of the slowest rank, peak bytes above the baseline)."""
    if allocator == "returned":
        ctypes.CDLL("libc.so.6").mallopt(-3, 1 << 17)          # M_MMAP_THRESHOLD, fixed (not adaptive)
        ctypes.CDLL("libc.so.6").mallopt(-1, 1 << 17)          # M_TRIM_THRESHOLD: glibc's, not the ranks' 1 GiB
    mesh = mm.init_mesh(mm.ParallelDims(dp=dist.get_world_size()))
    dist.barrier()
    base = _trimmed_rss()
    step = _build(side, mm.GPTConfig.small(**MODELS[model]), stage, mesh, batch)
    _trimmed_rss()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")                                           # VmHWM := VmRSS: the peak of the steps only
    times = []
    for x, y in data.batches(mesh, steps + 2, batch, seq):
        dist.barrier()
        t = time.perf_counter()
        step(x, y)
        times.append(time.perf_counter() - t)
    slowest = torch.tensor(times[2:], dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    peak = torch.tensor(float(_status("VmHWM") - base), dtype=torch.float64)
    dist.all_reduce(peak, op=dist.ReduceOp.MAX)
    return statistics.median(slowest.tolist()), peak.item()


def _one(args) -> None:
    """The child process: one side, one stage; prints one JSON line."""
    if args.side == "deepspeed":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")         # the launched ranks inherit it
    if args.allocator == "default":
        os.environ["MINIMEGA_MALLOC"] = "glibc"                # glibc's own policy, not `keep_freed_memory`
    s, peak = mm.launch(_side, args.nproc, args.side, args.model, args.one, args.steps, 8, 128, args.allocator,
                        backend="gloo")[0]
    print(json.dumps({"s": s, "peak": peak}))


def _run(args, side, stage) -> dict | None:
    cmd = [sys.executable, __file__, "--one", str(stage), "--side", side, "--steps", str(args.steps),
           "--model", args.model, "--nproc", str(args.nproc), "--allocator", args.allocator]
    done = subprocess.run(cmd, capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        print(f"{side} stage {stage} failed:\n{done.stderr[-2000:]}", file=sys.stderr)
        return None
    return json.loads(lines[-1])


def _deepspeed_missing() -> bool:
    from minimega.tools import peers
    return bool(peers.deepspeed_missing())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--model", choices=sorted(MODELS), default="23m")
    parser.add_argument("--stages", nargs="+", type=int, choices=[0, 1, 2, 3], default=[0, 1, 2, 3])
    parser.add_argument("--sides", nargs="+", choices=SIDES, default=list(SIDES))
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--allocator", choices=["returned", "default"], default="returned")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)            # the child: this stage ...
    parser.add_argument("--side", choices=SIDES, help=argparse.SUPPRESS)      # ... on this side
    args = parser.parse_args()
    if args.steps < 1 or args.repeats < 1:
        parser.error("--steps and --repeats must be >= 1")
    if args.one is not None:
        return _one(args)
    sides = [s for s in args.sides if s != "deepspeed" or not _deepspeed_missing()]
    print(f"load average before: {os.getloadavg()}", flush=True)
    runs = {(side, stage): [] for stage in args.stages for side in sides}
    for _ in range(args.repeats):
        for stage in args.stages:
            for side in sides:
                if (r := _run(args, side, stage)) is not None:
                    runs[side, stage].append(r)
    print(f"load average after: {os.getloadavg()}\n")
    mib = 2 ** 20
    print("| stage | side | runs | s/step min | median | peak MiB min | median | time ratio (min, median) "
          "| peak ratio (min, median) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for stage in args.stages:
        ours = runs.get(("minimega", stage), [])
        for side in sides:
            got = runs[side, stage]
            if not got:
                continue
            s, p = [r["s"] for r in got], [r["peak"] for r in got]
            name = f"torch {TORCH_NAME[stage]}" if side == "torch" else side
            ratios = "| - | -"
            if side != "minimega" and ours:
                os_, op = [r["s"] for r in ours], [r["peak"] for r in ours]
                ratios = (f"| {min(os_) / min(s):.3f}, {statistics.median(os_) / statistics.median(s):.3f} "
                          f"| {min(op) / min(p):.3f}, {statistics.median(op) / statistics.median(p):.3f}")
            print(f"| {stage} | {name} | {len(got)} | {min(s):.4f} | {statistics.median(s):.4f} | {min(p) / mib:.0f} "
                  f"| {statistics.median(p) / mib:.0f} {ratios} |")


if __name__ == "__main__":
    main()
