"""Gloo reduce-scatter, three in-place-or-not constructions side by side: bytes on the wire, time, peak RSS.

    python bench/reduce_scatter_gloo.py [--nproc 2] [--calls 10]

    reduces     n in-place ``dist.reduce`` calls, chunk k summed into rank k (what `comm` runs on gloo)
    all-reduce  one in-place ``dist.all_reduce`` of the whole input, then the rank's slice
    gloo        torch's fused ``reduce_scatter_tensor`` (a temporary as big as the input per call)

Per rank: TCP payload bytes sent per call (`measure.tcp_bytes_sent`) over the ring model's (n-1)/n·S, the
count `CommLog` keeps as ``wire_bytes`` for the construction `comm` runs, milliseconds per call, and how far
the peak RSS rose over ``--calls`` calls on two reused buffers (``VmHWM`` reset through ``/proc/self/clear_refs``
after ``malloc_trim``). The constructions take turns per size, so load on the machine falls on all of them.
"""
from __future__ import annotations

import argparse
import ctypes
import gc
import statistics
import time

import torch
import torch.distributed as dist

import minimega as mm
from minimega import comm
from minimega.comm import collectives
from minimega.run import measure
from minimega.run.launch import current_world_size

HOWS = ("reduces", "all-reduce", "gloo")


def _status(field: str) -> int:
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(field)


def _call(how: str, full: torch.Tensor, shard: torch.Tensor, group) -> None:
    if how == "reduces":
        for work in collectives._reduce_scatter_by_reduces(full, group):
            work.wait()
    elif how == "all-reduce":
        dist.all_reduce(full, group=group.pg)
        shard.copy_(full.view(group.size, -1)[group.rank])
    else:
        dist.reduce_scatter_tensor(shard, full, group=group.pg)


def _bench(numels: list[int], calls: int, rounds: int) -> list[dict]:
    group = mm.init_mesh(mm.ParallelDims.infer(current_world_size())).world
    rows = []
    for numel in numels:
        seen = {how: {"wire": [], "ms": [], "rise": []} for how in HOWS}
        for _ in range(rounds):
            for how in HOWS:
                fulls, shard = [torch.ones(numel) for _ in range(2)], torch.zeros(numel // group.size)
                _call(how, fulls[0], shard, group)                       # connections and buffers warm
                dist.barrier()
                gc.collect()
                ctypes.CDLL("libc.so.6").malloc_trim(0)
                before = _status("VmRSS")
                with open("/proc/self/clear_refs", "w") as f:
                    f.write("5")
                sent, start = measure.tcp_bytes_sent(), time.perf_counter()
                for i in range(calls):
                    _call(how, fulls[i % 2], shard, group)
                seen[how]["ms"].append((time.perf_counter() - start) / calls * 1e3)
                seen[how]["wire"].append((measure.tcp_bytes_sent() - sent) / calls)
                seen[how]["rise"].append(_status("VmHWM") - before)
                dist.barrier()
        with comm.CommLog() as log:
            comm.reduce_scatter(shard, fulls[0], group)
        ring = comm.ring_bytes("reduce_scatter", numel * 4, group.size)
        rows.append({"bytes": numel * 4, "ring": ring, "logged": log.total_sent(key="wire_bytes"),
                     **{how: {k: statistics.median(v) for k, v in s.items()} for how, s in seen.items()}})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    numels = [2**14, 2**18, 2**21]
    ranks = mm.launch(_bench, args.nproc, numels, args.calls, args.rounds, timeout=1200)
    print(f"{args.nproc} gloo ranks (loopback), fp32, {args.calls} calls per round, median of {args.rounds} "
          f"interleaved rounds; worst rank. wire = TCP payload sent / ring model (n-1)/n·S\n")
    print("| S | construction | wire / ring | CommLog wire / ring | ms per call | peak RSS rise (MiB) |")
    print("|---|---|---|---|---|---|")
    for k, row in enumerate(ranks[0]):
        for how in HOWS:
            wire = max(r[k][how]["wire"] for r in ranks) / row["ring"]
            ms = max(r[k][how]["ms"] for r in ranks)
            rise = max(r[k][how]["rise"] for r in ranks) / 2**20
            logged = f"{row['logged'] / row['ring']:.3f}" if how == "reduces" else "-"
            print(f"| {row['bytes'] // 1024} KiB | {how} | {wire:.3f} | {logged} | {ms:.2f} | {rise:.1f} |")


if __name__ == "__main__":
    main()
