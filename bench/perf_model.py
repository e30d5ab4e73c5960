"""Predicted vs measured step time of minimega itself on this machine (gloo ranks, CPU).

    python bench/perf_model.py [--steps 3] [--seq 128] [--only dp2-z3 ...]

`minimega calibrate`'s measurements (gloo α and β per collective, at the layout's world size) and the compute rates each rank measures
right before each of its steps (matmul FLOP/s, memory bandwidth, per-op cost: the same microbenchmarks, run
where and when the step runs, so a shared machine's changing load is seen by both) go into
`perf_calibrate.predict_minimega`, which runs the same `perf.step_time` as the GPU predictions. Each layout
trains a few steps; its median step time is compared. The load (1-minute average) is printed with each row.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import torch.distributed as dist

import minimega as mm
from minimega import data
from minimega.analysis.perf import PerfConfig
from minimega.analysis.calibrate import calibrate, measure_compute, predict_minimega

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
    """Median step time, and the compute rates this rank measured right before each step (with its own threads,
    next to the other ranks and whatever else the machine runs): the load the step saw, not an earlier one."""
    dp, tp, pp = dims
    mesh = mm.init_mesh(mm.ParallelDims(dp=dp, tp=tp, pp=pp))
    cfg = mm.TrainConfig(tp=tp, pp=pp, batch_size=batch, seq_len=seq, **overrides)
    engine = mm.initialize(mm.GPT(mm.GPTConfig.small()), cfg, mesh)
    times, rates = [], []
    # steps 0 and 1 are instrumented (Engine samples peak memory on every op until step 2): not timed
    for x, y in data.batches(mesh, steps + 2, batch, seq):
        before = measure_compute(reps=3)
        dist.barrier()
        t = time.perf_counter()
        engine.train_step((x, y))
        dist.barrier()
        times.append(time.perf_counter() - t)
        rates += [before, measure_compute(reps=3)]          # the load before and after the step
    keys = ("matmul_flops", "memory_bandwidth", "stream_bandwidth", "op_overhead", "adam_rate")
    return statistics.median(times[2:]), {k: statistics.median(r[k] for r in rates[4:]) for k in keys}


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
    cals = {2: calibrate(2), 4: calibrate(4)}        # gloo's α and β as 2 and as 4 ranks on these cores see them
    cal = cals[2]
    print(f"calibration: matmul {cal['matmul_flops'] / 1e9:.1f} GFLOP/s, memory {cal['memory_bandwidth'] / 1e9:.1f} GB/s, "
          f"op {cal['op_overhead'] * 1e6:.1f} us, gloo all_reduce alpha {cal['collectives']['all_reduce']['alpha'] * 1e6:.0f} us "
          f"beta {cal['collectives']['all_reduce']['beta'] / 1e9:.2f} GB/s; load {load0:.1f} on {os.cpu_count()} cores")
    print("| layout | ranks | load | GFLOP/s per thread | predicted s | measured s | measured / predicted | within ±30% |")
    print("|---|---|---|---|---|---|---|---|")
    hits = total = 0
    for name, (dp, tp, pp, ov) in LAYOUTS.items():
        if args.only and name not in args.only:
            continue
        out = mm.launch(_worker, dp * tp * pp, (dp, tp, pp), ov, args.steps, args.batch, args.seq, backend="gloo")
        meas = max(o[0] for o in out)
        rates = {k: statistics.median(o[1][k] for o in out) for k in out[0][1]}
        # the rates were measured by the ranks themselves, so they already carry the sharing: no load term
        w = dp * tp * pp
        run_cal = {**cals[max(2, w)], **rates, "all_threads": rates, "load": 0.0, "cores": w}
        pred = predict_minimega(run_cal, perf_config((dp, tp, pp), ov, args.batch, args.seq))["total"]
        cal = {**cal, "load": os.getloadavg()[0], "matmul_flops": rates["matmul_flops"]}
        ok = abs(meas / pred - 1) <= 0.3
        hits, total = hits + ok, total + 1
        print(f"| {name} | {dp * tp * pp} | {cal['load']:.1f} | {cal['matmul_flops'] / 1e9:.1f} | {pred:.3f} | {meas:.3f} "
              f"| {meas / pred:.2f} | {'yes' if ok else 'NO'} |", flush=True)
    print(f"\n{hits}/{total} within ±30%; load average now {os.getloadavg()[0]:.1f} (was {load0:.1f})")


if __name__ == "__main__":
    main()
