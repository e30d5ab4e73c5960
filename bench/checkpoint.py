"""Checkpoint save and load time, and size on disk, for the tiny and small presets (2 gloo ranks).

    python bench/checkpoint.py [--presets tiny small] [--nproc 2] [--zero-stage 1]

Save = gather the layout-free state + every rank writes its shard + fsync + atomic rename.
Load = verify every checksum + read all shards + re-shard into this rank's layout.
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

import minimega as mm
from minimega import comm, data


def _bench(preset: str, stage: int, directory: str) -> dict:
    mesh = mm.init_mesh(mm.ParallelDims(dp=dist.get_world_size()))
    config = mm.TrainConfig(zero_stage=stage, batch_size=8)
    torch.manual_seed(0)
    engine = mm.initialize(mm.GPT(mm.GPTConfig.preset(preset)), config, mesh)
    for batch in data.batches(mesh, 1, 8, 64):
        engine.train_step(batch)                 # optimizer states exist
    comm.barrier(mesh.world)
    t = time.perf_counter()
    path = engine.save(directory)
    save_s = time.perf_counter() - t
    comm.barrier(mesh.world)
    t = time.perf_counter()
    engine.load(directory)
    load_s = time.perf_counter() - t
    size = sum(f.stat().st_size for f in Path(path).iterdir())
    return {"save_s": save_s, "load_s": load_s, "bytes": size, "params": mm.GPT(mm.GPTConfig.preset(preset)).num_params()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", nargs="+", default=["tiny", "small"])
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--zero-stage", type=int, default=1)
    args = parser.parse_args()
    print("| preset | parameters | ranks | zero stage | size on disk | save s | load s |")
    print("|---|---|---|---|---|---|---|")
    for preset in args.presets:
        with tempfile.TemporaryDirectory() as tmp:
            r = mm.launch(_bench, args.nproc, preset, args.zero_stage, tmp)[0]
        print(f"| {preset} | {r['params']:,} | {args.nproc} | {args.zero_stage} | {r['bytes'] / 2**20:.1f} MiB "
              f"| {r['save_s']:.3f} | {r['load_s']:.3f} |")


if __name__ == "__main__":
    main()
