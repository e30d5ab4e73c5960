"""Training time lost to checkpoints: ``--async-save`` vs a blocking save, on the same run.

    python bench/async_save.py [--preset small] [--nproc 1] [--saves 3] [--interval 8] [--repeats 5]

Each repeat trains the same engines three times for ``saves × interval`` steps: with no save, with a blocking
save every ``interval`` steps, and with an asynchronous save there (the first half an interval in, so the
last one has half an interval to finish; the run ends with ``wait_for_save``, so a save that has not
finished is paid for). The order of the three rotates from repeat to repeat. Time lost per save = (the run's
wall time minus the same repeat's no-save run) / saves; ratio = lost(async) / lost(blocking), each the
median over repeats. Goal < 1/3: the step goes on while the shard is written, hashed and fsynced, and what
is left is the snapshot copy and the writer thread's share of the machine.

Reading it: a step on a CPU uses every core torch is given, and the writer thread needs one of its own (to
hash and write), as a GPU job's writer uses a host core the GPU does not. So torch gets one core fewer than
the machine has (``--threads``, the same in all three runs). The spread of the no-save runs is printed: a
lost time smaller than it is noise. Rank 0's numbers; every rank saves its shard.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import torch

import minimega as mm
from minimega import data
from minimega.run.launch import current_world_size


def _run(engine, mesh, config, steps: int, interval: int, seq: int, save_dir: str | None) -> float:
    start = engine.step
    t = time.perf_counter()
    for batch in data.batches(mesh, steps, config.batch_size, seq, start=start):
        engine.train_step(batch)
        if save_dir is not None and (engine.step - start) % interval == interval // 2:
            engine.save(save_dir, keep=1)
    engine.wait_for_save()
    return time.perf_counter() - t


def worker(tmp: str, preset: str, saves: int, interval: int, repeats: int, batch_size: int, seq: int,
           threads: int) -> dict:
    torch.set_num_threads(threads)
    mesh = mm.init_mesh(mm.ParallelDims.infer(current_world_size()))
    model_cfg = mm.GPTConfig.preset(preset)
    seq = min(seq, model_cfg.block_size)
    engines = {}
    for mode in ("blocking", "async"):
        config = mm.TrainConfig(batch_size=batch_size * mesh.world_size, zero_stage=1 if mesh.world_size > 1 else 0,
                                async_save=mode == "async")
        torch.manual_seed(0)
        engines[mode] = (mm.initialize(mm.GPT(model_cfg), config, mesh), config)
    walls: dict[str, list[float]] = {"none": [], "blocking": [], "async": []}
    steps = saves * interval
    for mode, (engine, config) in engines.items():    # warm-up: optimizer states and the snapshot's buffers
        _run(engine, mesh, config, interval, interval, seq, f"{tmp}/{mode}")
    orders = [("none", "blocking", "async"), ("blocking", "async", "none"), ("async", "none", "blocking")]
    for r in range(repeats):
        for mode in orders[r % 3]:
            engine, config = engines["blocking" if mode == "none" else mode]
            directory = None if mode == "none" else f"{tmp}/{mode}"
            walls[mode].append(_run(engine, mesh, config, steps, interval, seq, directory))
            print(f"repeat {r} {mode}: {walls[mode][-1]:.3f} s", file=sys.stderr, flush=True)
    saved = engines["async"][0]._saver.stats.get("bytes_written", 0)
    lost = {m: [(w - n) / saves for w, n in zip(walls[m], walls["none"])] for m in ("blocking", "async")}
    return {"walls_s": walls, "lost_per_save_s": lost, "bytes_per_rank": saved}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="small", choices=["tiny", "small", "gpt2"])
    p.add_argument("--nproc", type=int, default=1)
    p.add_argument("--saves", type=int, default=3, help="saves per run")
    p.add_argument("--interval", type=int, default=8, help="steps between saves")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=1, help="sequences per rank per step")
    p.add_argument("--seq", type=int, default=16, help="tokens per sequence (short: the save, not the step, is measured)")
    cores = len(os.sched_getaffinity(0))
    p.add_argument("--threads", type=int, default=max(1, cores - 1),
                   help="torch intra-op threads per rank, the same in every run (default: the cores less one, "
                        "left to the writer thread)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    if args.interval < 2 or args.saves < 1:
        p.error("--interval must be >= 2 and --saves >= 1")
    threads = max(1, args.threads // args.nproc) if args.nproc > 1 else args.threads
    with tempfile.TemporaryDirectory(prefix="async-save-bench-") as tmp:    # shared by every rank
        run = (tmp, args.preset, args.saves, args.interval, args.repeats, args.batch_size, args.seq, threads)
        r = worker(*run) if args.nproc == 1 else mm.launch(worker, args.nproc, *run, timeout=1200)[0]
    none = r["walls_s"]["none"]
    step = statistics.median(none) / (args.saves * args.interval)
    blocking, asynchronous = (statistics.median(r["lost_per_save_s"][m]) for m in ("blocking", "async"))
    out = {"preset": args.preset, "nproc": args.nproc, "threads": threads, "bytes_per_rank": r["bytes_per_rank"],
           "step_s": step, "no_save_spread_s": max(none) - min(none), "lost_blocking_s": blocking,
           "lost_async_s": asynchronous, "ratio": asynchronous / blocking if blocking > 0 else float("nan"),
           "raw": r}
    if args.json:
        print(json.dumps(out))
        return
    print(f"{args.preset}, {args.nproc} rank(s), {threads} torch thread(s) each: "
          f"{r['bytes_per_rank'] / 2**20:.1f} MiB per rank per save, {step * 1e3:.0f} ms per step, "
          f"no-save runs spread {out['no_save_spread_s']:.3f} s")
    print(f"  training time lost per save: blocking {blocking:.3f} s, async {asynchronous:.3f} s "
          f"(median of {args.repeats}); ratio async / blocking = {out['ratio']:.3f}")


if __name__ == "__main__":
    main()
