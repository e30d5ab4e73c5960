"""Step time of minimega's DDP vs torch's DistributedDataParallel on the same run (2 gloo ranks).

    python bench/ddp.py [--steps 20] [--presets tiny small]

Both run in the same launched job, alternating, on identical data; the ratio is minimega / torch
(median step time; < 1 means minimega is faster). Performance claims live here, never in unit tests.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import minimega as mm
from minimega import data
from minimega.train.engine import make_optimizer


def _time_ours(model_cfg, config, mesh, steps, seq):
    torch.manual_seed(0)
    engine = mm.initialize(mm.GPT(model_cfg), config, mesh)
    times = []
    for batch in data.batches(mesh, steps + 2, config.batch_size, seq):
        dist.barrier()
        t = time.perf_counter()
        engine.train_step(batch)
        times.append(time.perf_counter() - t)
    return statistics.median(times[2:])


def _time_torch(model_cfg, config, mesh, steps, seq):
    torch.manual_seed(0)
    model = DistributedDataParallel(mm.GPT(model_cfg), bucket_cap_mb=config.bucket_mb)
    opt = make_optimizer(model.parameters(), config)
    times = []
    for x, y in data.batches(mesh, steps + 2, config.batch_size, seq):
        dist.barrier()
        t = time.perf_counter()
        _, loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss = loss.detach().clone()
        dist.all_reduce(loss)                      # the engine also reports the global loss
        times.append(time.perf_counter() - t)
    return statistics.median(times[2:])


def _bench(preset: str, steps: int, batch: int, seq: int):
    mesh = mm.init_mesh(mm.ParallelDims(dp=dist.get_world_size()))
    cfg = mm.GPTConfig.preset(preset)
    config = mm.TrainConfig(batch_size=batch)
    ours, theirs = [], []
    for _ in range(2):                             # alternate to share any drift in machine load
        ours.append(_time_ours(cfg, config, mesh, steps, seq))
        theirs.append(_time_torch(cfg, config, mesh, steps, seq))
    return min(ours), min(theirs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--presets", nargs="+", default=["tiny", "small"])
    parser.add_argument("--nproc", type=int, default=2)
    args = parser.parse_args()
    print(f"{'preset':<8}{'minimega s/step':>17}{'torch DDP s/step':>18}{'ratio':>8}")
    for preset in args.presets:
        batch, seq = (8, 64) if preset == "tiny" else (8, 128)
        ours, theirs = mm.launch(_bench, args.nproc, preset, args.steps, batch, seq)[0]
        print(f"{preset:<8}{ours:>17.4f}{theirs:>18.4f}{ours / theirs:>8.3f}")


if __name__ == "__main__":
    main()
