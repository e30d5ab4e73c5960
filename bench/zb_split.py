"""ZB-H1's split backward on the clock: B + W against one plain backward, and ZB-H1's step against 1F1B's.

    python bench/zb_split.py [--preset small] [--micro-batches 8] [--rounds 3] [--steps 4] [--rows 4] [--glibc-malloc]

1. One chunk (the last of pp 2: half the blocks, ln_f, the head), one process: the plain backward, the split
   (`pipeline.split`: B = input gradient keeping each weight's split-point gradient, W = weight gradients
   from there) and the former W (``autograd.backward(out, grad, inputs=params)``, which re-runs the chain),
   repeated interleaved; prints medians and B + W / backward, on the wall clock and in process CPU time (the
   work done, which the machine's other load disturbs less). Run at the step's micro-batch (1 row) and at
   ``--rows`` rows (a chunk big enough to time).
2. Two gloo ranks, pp 2, ``--micro-batches`` m: a 1F1B engine and a ZB-H1 engine on identical models and data,
   their steps alternating within each of ``--rounds`` rounds (so machine load drifts over both alike); prints
   the median step times (and each rank's CPU time per step), ZB-H1 / 1F1B, and each schedule's bubble: on the slot grid and on the wall clock
   (`Pipeline.bubble()`), plus the bytes the split holds from B to W and the minor page faults per step.

Both parts run under the ranks' allocator policy (`run.processes.keep_freed_memory`); ``--glibc-malloc`` runs
them under glibc's own, where the kept gradients send the split's allocations back to the kernel.
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import time

import torch
import torch.distributed as dist

import minimega as mm
from minimega import data
from minimega.pipeline import split
from minimega.pipeline.stage import split_model
from minimega.run.processes import keep_freed_memory


def chunk_times(preset: str, rows: int, reps: int = 7) -> dict:
    torch.manual_seed(0)
    cfg = mm.GPTConfig.preset(preset)
    chunk = split_model(mm.GPT(cfg), 1, 2)[0]
    params = list(chunk.parameters())
    h = torch.randn(rows, cfg.block_size, cfg.n_embd)
    y = torch.randint(0, cfg.vocab_size, (rows, cfg.block_size))

    def forward():
        inp = h.clone().requires_grad_()
        return inp, chunk.loss(chunk(inp), y)

    t = {k: [] for k in ("backward", "B", "W", "W_rerun")}
    cpu = {k: [] for k in t}                     # process CPU time: the work, less the machine's other load
    held = 0

    def clocks():
        return time.perf_counter(), time.process_time()

    def note(kind, since):
        now = clocks()
        t[kind].append(now[0] - since[0])
        cpu[kind].append(now[1] - since[1])
        return now
    for _ in range(reps + 1):
        inp, out = forward()
        c0 = clocks()
        torch.autograd.backward(out, inputs=params + [inp])
        note("backward", c0)
        inp, out = forward()
        c0 = clocks()
        _, owed = split.input_grad(out, None, inp, params)
        c1 = note("B", c0)
        held = owed.held_bytes
        split.weight_grad(owed)
        note("W", c1)
        inp, out = forward()
        torch.autograd.grad(out, inp, retain_graph=True)
        c0 = clocks()
        torch.autograd.backward(out, inputs=params)
        note("W_rerun", c0)
        for p in params:
            p.grad = None
    med = {k: statistics.median(v[1:]) for k, v in t.items()}
    mcpu = {k: statistics.median(v[1:]) for k, v in cpu.items()}
    return {**med, "ratio": (med["B"] + med["W"]) / med["backward"],
            "ratio_rerun": (med["B"] + med["W_rerun"]) / med["backward"],
            "cpu_ratio": (mcpu["B"] + mcpu["W"]) / mcpu["backward"],
            "cpu_ratio_rerun": (mcpu["B"] + mcpu["W_rerun"]) / mcpu["backward"], "held_bytes": held}


def _steps(preset: str, m: int, rounds: int, steps: int) -> dict:
    mesh = mm.init_mesh(mm.ParallelDims(pp=2))
    engines = {}
    for schedule in ("1f1b", "zb_h1"):
        torch.manual_seed(0)
        config = mm.TrainConfig(pp=2, micro_batches=m, schedule=schedule, batch_size=m, memory_peak_steps=0)
        engines[schedule] = mm.initialize(mm.GPT(mm.GPTConfig.preset(preset)), config, mesh)
    seq = mm.GPTConfig.preset(preset).block_size
    batches = list(data.batches(mesh, rounds * steps + 1, m, seq))
    times = {s: [] for s in engines}
    cpu = {s: [] for s in engines}
    faults = {s: [] for s in engines}                 # minor page faults: memory the kernel had to hand out again
    for s, e in engines.items():                      # warm-up step each
        e.train_step(batches[0])
    for r in range(rounds):
        order = list(engines) if r % 2 == 0 else list(engines)[::-1]
        for i in range(steps):
            for s in order:
                dist.barrier()
                t0, c0 = time.perf_counter(), time.process_time()
                f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
                engines[s].train_step(batches[1 + r * steps + i])
                times[s].append(time.perf_counter() - t0)
                cpu[s].append(time.process_time() - c0)
                faults[s].append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
    out = {s: {"step_s": statistics.median(v), "cpu_s": statistics.median(cpu[s]), "faults": statistics.median(faults[s]),
               **{k: e.pipeline.bubble()[k] for k in
                                                   ("idle_of_total", "wall_idle_of_total", "peak_split_bytes")}}
           for (s, v), e in zip(times.items(), engines.values())}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="small")
    ap.add_argument("--micro-batches", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=4, help="steps per schedule per round")
    ap.add_argument("--rows", type=int, default=4, help="rows of the bigger chunk timing")
    ap.add_argument("--glibc-malloc", action="store_true",
                    help="the ranks keep glibc's own allocator policy (MINIMEGA_MALLOC=glibc), not "
                         "`run.processes.keep_freed_memory`: the page faults the split costs without it")
    args = ap.parse_args()
    if args.glibc_malloc:
        os.environ["MINIMEGA_MALLOC"] = "glibc"       # the ranks take the launcher's environment
    keep_freed_memory()                               # the chunk timings below: as a rank runs them
    torch.set_num_threads(1)                          # the chunk timings: one thread (the ranks keep their own)
    for rows in (1, args.rows):
        c = chunk_times(args.preset, rows)
        print(f"chunk ({args.preset}, last of pp 2, {rows} x {mm.GPTConfig.preset(args.preset).block_size} tokens): "
              f"backward {c['backward'] * 1e3:.1f} ms, B {c['B'] * 1e3:.1f} + W {c['W'] * 1e3:.1f} ms; "
              f"B+W/backward {c['ratio']:.2f} wall, {c['cpu_ratio']:.2f} CPU time (W re-running the chain: "
              f"{c['ratio_rerun']:.2f}, {c['cpu_ratio_rerun']:.2f}); "
              f"held from B to W {c['held_bytes'] / 2**20:.2f} MiB")
    res = mm.launch(_steps, 2, args.preset, args.micro_batches, args.rounds, args.steps)
    for rank, r in enumerate(res):
        for s, v in r.items():
            print(f"rank {rank} {s:6s} step {v['step_s'] * 1e3:7.1f} ms (median of {args.rounds}x{args.steps}), "
                  f"this rank's CPU time {v['cpu_s'] * 1e3:7.1f} ms, {v['faults']:6.0f} page faults; "
                  f"bubble: grid {v['idle_of_total']:.3f}, wall clock {v['wall_idle_of_total']:.3f}; "
                  f"split held {v['peak_split_bytes'] / 2**20:.2f} MiB at peak")
    r0 = res[0]
    print(f"ZB-H1 / 1F1B step time: {r0['zb_h1']['step_s'] / r0['1f1b']['step_s']:.3f} "
          f"(pp 2, m {args.micro_batches}, {args.preset}, steps interleaved); CPU time per step ZB-H1 / 1F1B: "
          + ", ".join(f"rank {k} {r['zb_h1']['cpu_s'] / r['1f1b']['cpu_s']:.3f}" for k, r in enumerate(res)))


if __name__ == "__main__":
    main()
