"""`minimega calibrate`: this machine's matmul rate, memory bandwidth and gloo α, β per collective."""
from __future__ import annotations

import argparse
import json

from ..analysis.calibrate import calibrate


def add_calibrate_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("calibrate", help="measure this machine's matmul rate and gloo alpha/beta per collective",
                              description="A few seconds of microbenchmarks: matmul FLOP/s, memory bandwidth, per-op "
                                          "overhead, and alpha-beta of five gloo collectives.")
    p.add_argument("--world-size", type=int, default=2, help="ranks for the collectives (default 2)")
    p.add_argument("--reps", type=int, default=5, help="repeats per measurement (default 5, at most 50)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run_calibrate)
    return p


def run_calibrate(args: argparse.Namespace) -> int:
    if not 2 <= args.world_size <= 8:
        raise ValueError(f"--world-size {args.world_size}: use 2 to 8 local ranks")
    if not 1 <= args.reps <= 50:
        raise ValueError(f"--reps {args.reps}: use 1 to 50")
    cal = calibrate(args.world_size, args.reps)
    if args.json:
        print(json.dumps(cal, indent=2))
        return 0
    print(f"matmul {cal['matmul_flops'] / 1e9:.1f} GFLOP/s ({cal['threads']} threads), memory "
          f"{cal['memory_bandwidth'] / 1e9:.1f} GB/s, op overhead {cal['op_overhead'] * 1e6:.1f} us; "
          f"load {cal['load']:.1f} on {cal['cores']} cores")
    print(f"gloo, {cal['world_size']} ranks: {'op':<15} {'alpha us':>9} {'beta GB/s':>10}")
    for op, c in cal["collectives"].items():
        print(f"{'':<22}{op:<15} {c['alpha'] * 1e6:>9.1f} {c['beta'] / 1e9:>10.2f}")
    return 0
