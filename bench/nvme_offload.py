"""Step time of NVMe offload (master shards and Adam states in files) vs CPU offload (in host memory), as a ratio.

    python bench/nvme_offload.py [--nvme-path DIR] [--stages 1 2 3] [--model small] [--steps 4] [--repeats 2]

Same `minimega.GPT`, seed, batches and AdamW on both sides, ``offload_optimizer=True``, 2 gloo ranks; the
NVMe side adds ``nvme_path``. In one launch per stage the sides alternate, CPU NVMe CPU NVMe …, ``--repeats``
times, so a change in the machine's load falls on both alike. Per run: the median step time over ``--steps``
steps after one warm-up step (the slowest rank). The table shows the median over the repeats, the ratio
NVMe / CPU (> 1: the disk tier is slower), the bytes each rank's store moved per step next to
`estimate.nvme_bytes_per_step`, the bytes rank 0 fetched from and sent to storage per step (``/proc/self/io``
around the store's steps: the page cache's hits excluded; padding to 4 KiB included) and rank 0's resident host
memory after the run (``VmRSS``, the median over repeats).

Reading it: the disk tier adds a read and a write of 12 bytes per shard element per step, straight to the drive
(``O_DIRECT``); where the files sit decides the cost (on a real disk it is bounded by its bandwidth). ``df`` on the directory is printed with the table.

``--deepspeed`` adds DeepSpeed's ZeRO-Infinity beside stage 3 (ZeRO-3 with ``offload_optimizer.device = "nvme"``,
its ``async_io`` op on libaio: a JIT build of about a minute the first time, which needs ``libaio-dev``): the same
model, seed, batches and torch AdamW (``zero_force_ds_cpu_optimizer: false``, as `minimega.tools.peers` runs it),
interleaved with the other two sides in the same launch; its step time, disk bytes (``/proc/self/io`` around each
step: its aio threads are this process's) and RSS. The sides share each rank's process, so an RSS is the process's
after that side ran (DeepSpeed runs last in each repeat): read it as an upper bound, not a side's own footprint.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.distributed as dist

import minimega as mm
from minimega import data, estimate
from minimega.zero import model_units
from minimega.zero.nvme import storage_io


def _worker(stage: int, model: dict, steps: int, repeats: int, directory: str, deepspeed: bool = False) -> dict:
    import warnings                     # torch 2.13 marks the *_tensor collectives deprecated: one line per call
    warnings.filterwarnings("ignore", message=r".*is deprecated\. Please use .*torch\.distributed", category=FutureWarning)
    mesh = mm.init_mesh(mm.ParallelDims(dp=dist.get_world_size()))
    sides = ("cpu", "nvme", "deepspeed") if deepspeed else ("cpu", "nvme")
    times, rss = {s: [] for s in sides}, {s: [] for s in sides}
    traffic = storage = ds_storage = None
    for _ in range(repeats):
        for side in sides:
            if side == "deepspeed":
                took, ds_storage = _deepspeed_steps(mesh, model, steps, os.path.join(directory, "deepspeed"))
                times[side].append(took)
                rss[side].append(_rss())
                continue
            config = mm.TrainConfig(zero_stage=stage, offload_optimizer=True, batch_size=8, seed=0,
                                    nvme_path=directory if side == "nvme" else None)
            torch.manual_seed(0)
            engine = mm.initialize(mm.GPT(mm.GPTConfig.small(**model)), config, mesh)
            per_step = []
            for k, batch in enumerate(data.batches(mesh, steps + 1, 8, 64)):
                dist.barrier()
                start = time.perf_counter()
                engine.train_step(batch)
                elapsed = torch.tensor(time.perf_counter() - start)
                dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)       # the slowest rank sets the step
                if k:
                    per_step.append(elapsed.item())
            times[side].append(statistics.median(per_step))
            store = engine.zero_stages[0].store
            rss[side].append(_rss())
            if side == "nvme":
                traffic = dict(store.traffic)
                storage = {k: v / store.storage_total["steps"] for k, v in store.storage_total.items() if k != "steps"}
                store.close()
    return {"times": times, "traffic": traffic, "storage": storage, "rss": rss, "ds_storage": ds_storage}


def _deepspeed_steps(mesh, model: dict, steps: int, directory: str) -> tuple[float, dict]:
    """DeepSpeed ZeRO-3 with its optimizer states on NVMe: the median step time (slowest rank) over ``steps`` steps
    after one warm-up, and the storage bytes per step."""
    from minimega.tools.peers import deepspeed_engine

    config = mm.TrainConfig(zero_stage=3, offload_optimizer=True, batch_size=8, seed=0)
    torch.manual_seed(0)
    engine = deepspeed_engine(mm.GPT(mm.GPTConfig.small(**model)), config, {
        "zero_optimization": {"offload_optimizer": {"device": "nvme", "nvme_path": directory}},
        "zero_force_ds_cpu_optimizer": False})                 # torch's AdamW, the same as the other sides
    per_step, moved = [], {"read_bytes": 0, "write_bytes": 0}
    for k, (x, y) in enumerate(data.batches(mesh, steps + 1, 8, 64)):
        dist.barrier()
        before, start = storage_io(), time.perf_counter()
        _, loss = engine(x, y)
        engine.backward(loss)
        engine.step()
        elapsed = torch.tensor(time.perf_counter() - start)
        after = storage_io()
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        if k:
            per_step.append(elapsed.item())
            for key in moved:
                moved[key] += after[key] - before[key]
    engine.destroy()
    return statistics.median(per_step), {k: v / steps for k, v in moved.items()}


def _rss() -> int:
    """This rank's resident host memory now (``VmRSS``), bytes."""
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise KeyError("VmRSS")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nvme-path", default=None, help="directory for the files (default: a fresh one in /tmp)")
    parser.add_argument("--stages", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--model", choices=("small", "tiny"), default="small")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--deepspeed", action="store_true",
                        help="at stage 3, DeepSpeed's ZeRO-Infinity NVMe optimizer offload as a third side")
    args = parser.parse_args(argv)
    if args.deepspeed:
        os.environ.setdefault("DS_ACCELERATOR", "cpu")                   # the ranks follow this environment
    directory = args.nvme_path or tempfile.mkdtemp(prefix="minimega-nvme-bench-")
    model = {} if args.model == "small" else dict(block_size=64, n_layer=4, n_head=4, n_embd=64)
    units = [[p.numel() for _, p in params] for _, params in model_units(mm.GPT(mm.GPTConfig.small(**model)))]
    print(subprocess.run(["df", "-hT", directory], capture_output=True, text=True).stdout.strip())
    print(f"load average before: {os.getloadavg()[0]:.1f}")
    print(f"{'stage':>5}  {'CPU offload s':>13}  {'NVMe offload s':>14}  {'ratio':>6}  {'read/step':>11}  "
          f"{'written/step':>12}  {'estimated':>11}  {'disk read/step':>14}  {'disk written/step':>17}  "
          f"{'RSS CPU MiB':>11}  {'RSS NVMe MiB':>12}")
    beside = []
    for stage in args.stages:
        with_ds = args.deepspeed and stage == 3
        result = mm.launch(_worker, 2, stage, model, args.steps, args.repeats, directory, with_ds, timeout=900)[0]
        cpu, nvme = (statistics.median(result["times"][s]) for s in ("cpu", "nvme"))
        psi = sum(estimate.padded_numel(sum(u), 2) for u in units)
        want = estimate.nvme_bytes_per_step(psi, 2, stage)["read"]
        t, io = result["traffic"], result["storage"]
        rss = {s: statistics.median(result["rss"][s]) / 2**20 for s in ("cpu", "nvme")}
        print(f"{stage:>5}  {cpu:>13.3f}  {nvme:>14.3f}  {nvme / cpu:>6.2f}  {t['read']:>11,}  {t['written']:>12,}  "
              f"{int(want):>11,}  {io['read_bytes']:>14,.0f}  {io['write_bytes']:>17,.0f}  {rss['cpu']:>11.0f}  "
              f"{rss['nvme']:>12.0f}")
        if with_ds:
            ds = statistics.median(result["times"]["deepspeed"])
            beside.append((stage, cpu, nvme, ds, io, result["ds_storage"], rss["nvme"],
                           statistics.median(result["rss"]["deepspeed"]) / 2**20))
    for stage, cpu, nvme, ds, io, ds_io, rss_mm, rss_ds in beside:
        print(f"\nZeRO-{stage}, optimizer states on NVMe, side by side (interleaved in one launch):")
        print(f"{'':>10}  {'step s':>7}  {'/ CPU offload':>13}  {'disk read/step':>14}  {'disk written/step':>17}  "
              f"{'RSS MiB':>7}")
        for name, t, d, r in (("minimega", nvme, io, rss_mm), ("DeepSpeed", ds, ds_io, rss_ds)):
            print(f"{name:>10}  {t:>7.3f}  {t / cpu:>13.2f}  {d['read_bytes']:>14,.0f}  {d['write_bytes']:>17,.0f}  "
                  f"{r:>7.0f}")
    print(f"load average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    sys.exit(main())
