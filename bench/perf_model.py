"""Predicted vs measured step time of minimega itself on this machine (gloo ranks, CPU).

    python bench/perf_model.py [--steps 3] [--seq 128] [--only dp2-z3 ...]

`minimega calibrate`'s measurements (matmul rate, memory bandwidth, per-op overhead, gloo α and β per
collective) go into `perf_calibrate.predict_minimega`, which runs the same `perf.step_time` as the GPU
predictions; each layout is then trained for a few steps and its median step time compared. The
machine's load (1-minute average) is printed with the table: on a shared machine every ratio moves with it.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import torch.distributed as dist

import minimega as mm
from minimega import data
from minimega.perf import PerfConfig
from minimega.perf_calibrate import calibrate, measure_compute_now, predict_minimega

# name: (dp, tp, pp, TrainConfig overrides)
LAYOUTS = {
    "dp1": (1, 1, 1, {}),
    "dp2-z0": (2, 1, 1, {}),
    "dp2-z1": (2, 1, 1, {"zero_stage": 1}),
    "dp2-z2": (2, 1, 1, {"zero_stage": 2}),
    "dp2-z3": (2, 1, 1, {"zero_stage": 3}),
    "dp2-z0-full": (2, 1, 1, {"activation_checkpointing": "full"}),
    "dp2-z0-selective": (2, 1, 1, {"activation_checkpointing": "selective"}),
    "dp2-z0-ga2": (2, 1, 1, {"gradient_accumulation_steps": 2}),
    "dp4-z0": (4, 1, 1, {}),
    "dp4-z3": (4, 1, 1, {"zero_stage": 3}),
    "tp2": (1, 2, 1, {}),
    "pp2-m2": (1, 1, 2, {"micro_batches": 2}),
    "pp2-m4": (1, 1, 2, {"micro_batches": 4}),
    "dp2-tp2": (2, 2, 1, {}),
    "dp2-pp2-m2": (2, 1, 2, {"micro_batches": 2}),
    "tp2-pp2-m2": (1, 2, 2, {"micro_batches": 2}),
}


def _worker(dims, overrides, steps, batch, seq):
    dp, tp, pp = dims
    mesh = mm.init_mesh(mm.ParallelDims(dp=dp, tp=tp, pp=pp))
    cfg = mm.TrainConfig(tp=tp, pp=pp, batch_size=batch, seq_len=seq, **overrides)
    engine = mm.initialize(mm.GPT(mm.GPTConfig.small()), cfg, mesh)
    times = []
    for x, y in data.batches(mesh, steps + 1, batch, seq):
        dist.barrier()
        t = time.perf_counter()
        engine.train_step((x, y))
        dist.barrier()
        times.append(time.perf_counter() - t)
    return statistics.median(times[1:])


def perf_config(dims, overrides, batch, seq) -> PerfConfig:
    """minimega's `small` GPT and this layout as the model's inputs."""
    dp, tp, pp = dims
    m = overrides.get("micro_batches", 1) if pp > 1 else overrides.get("gradient_accumulation_steps", 1)
    g = mm.GPTConfig.small()
    return PerfConfig(layers=g.n_layer, hidden=g.n_embd, heads=g.n_head, vocab=g.vocab_size, seq_len=seq,
                      precision="fp32", attention="fused", dropout=False, dp=dp, tp=tp, pp=pp,
                      zero_stage=overrides.get("zero_stage", 0),
                      recompute=overrides.get("activation_checkpointing", "none"),
                      micro_batch=batch // (dp * m), global_batch=batch, bucket_bytes=25 * 2 ** 20)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--only", nargs="*", default=None)
    args = ap.parse_args()
    load0 = os.getloadavg()[0]
    cal = calibrate(2)
    print(f"calibration: matmul {cal['matmul_flops'] / 1e9:.1f} GFLOP/s, memory {cal['memory_bandwidth'] / 1e9:.1f} GB/s, "
          f"op {cal['op_overhead'] * 1e6:.1f} us, gloo all_reduce alpha {cal['collectives']['all_reduce']['alpha'] * 1e6:.0f} us "
          f"beta {cal['collectives']['all_reduce']['beta'] / 1e9:.2f} GB/s; load {load0:.1f} on {os.cpu_count()} cores")
    print("| layout | ranks | load | GFLOP/s per thread | predicted s | measured s | measured / predicted | within ±30% |")
    print("|---|---|---|---|---|---|---|---|")
    hits = total = 0
    for name, (dp, tp, pp, ov) in LAYOUTS.items():
        if args.only and name not in args.only:
            continue
        cal.update(measure_compute_now())           # the load moves: re-measure the rates next to each run
        pred = predict_minimega(cal, perf_config((dp, tp, pp), ov, args.batch, args.seq))["total"]
        meas = mm.launch(_worker, dp * tp * pp, (dp, tp, pp), ov, args.steps, args.batch, args.seq, backend="gloo")[0]
        ok = abs(meas / pred - 1) <= 0.3
        hits, total = hits + ok, total + 1
        print(f"| {name} | {dp * tp * pp} | {cal['load']:.1f} | {cal['matmul_flops'] / 1e9:.1f} | {pred:.3f} | {meas:.3f} "
              f"| {meas / pred:.2f} | {'yes' if ok else 'NO'} |", flush=True)
    print(f"\n{hits}/{total} within ±30%; load average now {os.getloadavg()[0]:.1f} (was {load0:.1f})")


if __name__ == "__main__":
    main()
