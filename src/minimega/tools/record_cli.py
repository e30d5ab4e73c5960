"""``minimega record``: run the small 2-rank jobs and write the course's JSON traces."""
from __future__ import annotations

import argparse

from ..figures.traces import DEFAULT_OUT, TRACES


def add_record_parser(subparsers) -> argparse.ArgumentParser:
    """Register ``record`` on an argparse subparsers object; the handler is `run_record`."""
    p = subparsers.add_parser("record", help="run small 2-rank jobs and write the course's JSON traces",
                              description="Train the tiny GPT on 2 gloo ranks (DDP, ZeRO, tensor and pipeline "
                                          "parallelism) and write "
                                          "what they measured under --out: " + ", ".join(f"{t}.json" for t in TRACES))
    p.add_argument("--out", default=str(DEFAULT_OUT), help=f"directory for the traces (default {DEFAULT_OUT})")
    p.add_argument("--steps", type=int, default=3, help="training steps per job (default 3)")
    p.add_argument("--bucket-mb", type=float, default=0.0625,
                   help="DDP bucket size in MiB (default 0.0625: several buckets for the tiny model)")
    p.add_argument("--only", nargs="+", choices=TRACES, default=list(TRACES), help="record only these traces")
    p.set_defaults(func=run_record)
    return p


def run_record(args: argparse.Namespace) -> int:
    """Handler for ``minimega record``; prints one line per trace written."""
    from ..figures.record import record         # torch: loaded when the jobs run, not for --help
    paths = record(args.out, args.steps, args.bucket_mb, tuple(args.only))
    for name, path in paths.items():
        print(f"wrote {path} ({path.stat().st_size / 1024:.1f} KiB)")
    return 0
