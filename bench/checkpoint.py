"""Checkpoint save and load, minimega (ZeRO-3) vs torch DCP under FSDP2, on the same model and ranks.

    python bench/checkpoint.py [--preset small] [--nproc 4] [--repeats 3]

Both sides save and load the same training state: fp32 weights and AdamW's two moments, sharded over
the ranks (minimega: `Engine.save` / `Engine.load` at ZeRO-3; torch: ``get_state_dict`` of an FSDP2
model and its optimizer, ``dcp.save``, then ``dcp.load`` + ``set_state_dict``). Each repeat runs both
in the same launched job, alternating, into fresh directories. Per rank, from the kernel's counters:
wall time, peak extra memory (``VmHWM`` reset through ``/proc/self/clear_refs``, minus ``VmRSS``
before, after ``malloc_trim``), bytes read (``rchar``). The table shows the worst rank's median, and
ratio = minimega / torch (< 1: minimega is faster or smaller).
"""
from __future__ import annotations

import argparse
import ctypes
import gc
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

import minimega as mm
from minimega import comm, data
from minimega.train.engine import make_optimizer


def _proc(path: str, field: str) -> int:
    for line in open(path):
        if line.startswith(field + ":"):
            return int(line.split()[1]) * (1024 if path.endswith("status") else 1)
    raise KeyError(field)


def _measured(fn) -> dict:
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    dist.barrier()
    base, read0 = _proc("/proc/self/status", "VmRSS"), _proc("/proc/self/io", "rchar")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    t = time.perf_counter()
    fn()
    dist.barrier()
    return {"s": time.perf_counter() - t, "peak": _proc("/proc/self/status", "VmHWM") - base,
            "read": _proc("/proc/self/io", "rchar") - read0}


def _ours(model_cfg, config, mesh, directory):
    torch.manual_seed(0)
    engine = mm.initialize(mm.GPT(model_cfg), config, mesh)
    for batch in data.batches(mesh, 1, config.batch_size, 64):
        engine.train_step(batch)
    save = _measured(lambda: engine.save(directory))
    torch.manual_seed(1)
    fresh = mm.initialize(mm.GPT(model_cfg), config, mesh)
    for batch in data.batches(mesh, 1, config.batch_size, 64):   # optimizer states exist, as on the torch side
        fresh.train_step(batch)
    load = _measured(lambda: fresh.load(directory))
    return save, load


def _torch(model_cfg, config, mesh, directory):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    def build(seed):
        torch.manual_seed(seed)
        model = mm.GPT(model_cfg)
        device_mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        for block in model.blocks:
            fully_shard(block, mesh=device_mesh)
        fully_shard(model, mesh=device_mesh)
        return model, make_optimizer(model.parameters(), config)

    model, opt = build(0)
    for x, y in data.batches(mesh, 1, config.batch_size, 64):
        model(x, y)[1].backward()
        opt.step()
        opt.zero_grad()

    def save():
        msd, osd = get_state_dict(model, opt)
        dcp.save({"model": msd, "optim": osd}, checkpoint_id=directory)
    saved = _measured(save)
    fresh, fresh_opt = build(1)
    for x, y in data.batches(mesh, 1, config.batch_size, 64):     # optimizer states exist: the load target
        fresh(x, y)[1].backward()
        fresh_opt.step()
        fresh_opt.zero_grad()

    def load():
        msd, osd = get_state_dict(fresh, fresh_opt)
        state = {"model": msd, "optim": osd}
        dcp.load(state, checkpoint_id=directory)
        set_state_dict(fresh, fresh_opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    return saved, _measured(load)


def _bench(preset: str, repeats: int, root: str) -> dict:
    mesh = mm.init_mesh(mm.ParallelDims(dp=dist.get_world_size()))
    model_cfg = mm.GPTConfig.preset(preset)
    config = mm.TrainConfig(zero_stage=3, batch_size=2 * mesh.world_size, seq_len=64)
    runs = {"minimega": [], "torch": []}
    for i in range(repeats):
        for name, fn in (("minimega", _ours), ("torch", _torch)):
            directory = Path(root) / f"{name}-{i}"
            runs[name].append(fn(model_cfg, config, mesh, str(directory)))
            comm.barrier(mesh.world)
    out = {}
    for name, results in runs.items():
        for phase, k in (("save", 0), ("load", 1)):
            for metric in ("s", "peak", "read"):
                out[(name, phase, metric)] = statistics.median(r[k][metric] for r in results)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="small", choices=["tiny", "small", "gpt2"])
    parser.add_argument("--nproc", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    params = mm.GPT(mm.GPTConfig.preset(args.preset)).num_params()
    with tempfile.TemporaryDirectory() as tmp:
        ranks = mm.launch(_bench, args.nproc, args.preset, args.repeats, tmp, timeout=1800)
    shard = 12 * params / args.nproc
    print(f"{args.preset}: {params:,} parameters, {args.nproc} ranks, ZeRO-3 vs FSDP2; a rank's share of "
          f"weights + AdamW moments = {shard / 2**20:.1f} MiB (worst rank, median of {args.repeats})\n")
    print("| phase | metric | minimega | torch DCP + FSDP2 | ratio |")
    print("|---|---|---|---|---|")
    for phase in ("save", "load"):
        for metric, unit, scale in (("s", "s", 1), ("peak", "MiB", 2**20), ("read", "MiB", 2**20)):
            ours = max(r[("minimega", phase, metric)] for r in ranks) / scale
            theirs = max(r[("torch", phase, metric)] for r in ranks) / scale
            label = {"s": "time", "peak": "peak extra memory", "read": "bytes read"}[metric]
            ratio = f"{ours / theirs:.2f}" if theirs > 0 else "-"
            print(f"| {phase} | {label} ({unit}) | {ours:.3f} | {theirs:.3f} | {ratio} |")


if __name__ == "__main__":
    main()
