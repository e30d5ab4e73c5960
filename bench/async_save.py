"""Training time lost to a checkpoint: ``--async-save`` vs a blocking save, on the same run.

    python bench/async_save.py [--preset small] [--nproc 1] [--steps 8] [--repeats 3] [--seq 16]

Each repeat trains the same engine three times for ``--steps`` steps (one warm-up step first): with no save,
with one blocking save after the second step, and with one asynchronous save there (the run ends with
``wait_for_save``, so a save that has not finished is paid for). The time lost to a save is the run's wall time
minus the no-save run's; ratio = lost(async) / lost(blocking), the median over repeats (< 1/3 is the goal:
the step goes on while the shard is written, hashed and fsynced; what is left is the snapshot copy and the
writer thread's share of the CPU). Rank 0's numbers; every rank saves its shard.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time

import torch

import minimega as mm
from minimega import data
from minimega.launch import current_world_size


def _run(engine, mesh, config, steps: int, seq: int, save_dir: str | None) -> float:
    start = engine.step
    t = time.perf_counter()
    for batch in data.batches(mesh, steps, config.batch_size, seq, start=start):
        engine.train_step(batch)
        if save_dir is not None and engine.step == start + 2:
            engine.save(save_dir, keep=1)
    engine.wait_for_save()
    return time.perf_counter() - t


def worker(preset: str, steps: int, repeats: int, batch_size: int, seq: int) -> dict:
    mesh = mm.init_mesh(mm.ParallelDims.infer(current_world_size()))
    model_cfg = mm.GPTConfig.preset(preset)
    seq = min(seq, model_cfg.block_size)
    engines = {}
    for mode in ("blocking", "async"):
        config = mm.TrainConfig(batch_size=batch_size, zero_stage=1 if mesh.world_size > 1 else 0,
                                async_save=mode == "async")
        torch.manual_seed(0)
        engines[mode] = (mm.initialize(mm.GPT(model_cfg), config, mesh), config)
    walls = {"none": [], "blocking": [], "async": []}
    with tempfile.TemporaryDirectory(prefix="async-save-bench-") as tmp:
        for mode, (engine, config) in engines.items():
            _run(engine, mesh, config, 1, seq, None)              # warm-up: optimizer states exist
        for r in range(repeats):
            order = ("none", "blocking", "async") if r % 2 == 0 else ("async", "blocking", "none")
            for mode in order:
                engine, config = engines["blocking" if mode == "none" else mode]
                walls[mode].append(_run(engine, mesh, config, steps, seq, None if mode == "none" else f"{tmp}/{mode}"))
                print(f"repeat {r} {mode}: {walls[mode][-1]:.3f} s", file=sys.stderr, flush=True)
        saved = engines["async"][0]._saver.stats.get("bytes_written", 0)
    lost = {m: [w - n for w, n in zip(walls[m], walls["none"])] for m in ("blocking", "async")}
    return {"walls_s": walls, "lost_s": lost, "bytes_per_rank": saved}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="small", choices=["tiny", "small", "gpt2"])
    p.add_argument("--nproc", type=int, default=1)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--seq", type=int, default=16, help="tokens per sequence (short: the save, not the step, is measured)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch intra-op threads (default: torch's); on a machine with few cores leave one to the writer")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    run = (args.preset, args.steps, args.repeats, args.batch_size, args.seq)
    r = worker(*run) if args.nproc == 1 else mm.launch(worker, args.nproc, *run, timeout=600)[0]
    step = statistics.median(r["walls_s"]["none"]) / args.steps
    blocking, asynchronous = (statistics.median(r["lost_s"][m]) for m in ("blocking", "async"))
    out = {"preset": args.preset, "nproc": args.nproc, "bytes_per_rank": r["bytes_per_rank"], "step_s": step,
           "lost_blocking_s": blocking, "lost_async_s": asynchronous,
           "ratio": asynchronous / blocking if blocking > 0 else float("nan"), "raw": r}
    if args.json:
        print(json.dumps(out))
        return
    print(f"{args.preset}, {args.nproc} rank(s): {r['bytes_per_rank'] / 2**20:.1f} MiB per rank per save, "
          f"{step * 1e3:.0f} ms per step")
    print(f"  training time lost to one save: blocking {blocking:.3f} s, async {asynchronous:.3f} s "
          f"(median of {args.repeats}); ratio async / blocking = {out['ratio']:.3f}")


if __name__ == "__main__":
    main()
