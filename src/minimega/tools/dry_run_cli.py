"""`minimega dry-run`: the real engine for ranks of a published layout, on meta tensors and a fake process group.

Each sampled rank is built and stepped once (`analysis.dry_run`); its bytes by category and its collectives'
bytes are printed next to `analysis.layout`'s account of the same rank, and the command fails (exit 1) where
the two differ. Example:

    minimega dry-run --model bloom-176b --dp 8 --tp 4 --pp 12 --zero-stage 1 --recompute full \\
        --micro-batch 2 --global-batch 2048 --json
    minimega dry-run --model llama3-405b --rank 0     # GQA, SwiGLU, RoPE; dp 64 x tp 8 x pp 16 as published
"""
from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from ..analysis import GB
from ..analysis.layout import REFUSED_MODELS, gpt_shape, published
from ..config import TrainConfig
from .args import nonnegative_int, positive_int

if TYPE_CHECKING:
    from ..mesh import ParallelDims

MODELS = ("bloom-176b", "mt-nlg-530b", "gpt3-175b", "llama3-405b")
CATEGORIES = ("params", "gathered", "master", "grads", "optimizer_states", "optimizer_step_counters", "comm_buffers")


def add_dry_run_parser(subparsers) -> argparse.ArgumentParser:
    """Register ``dry-run`` on an argparse subparsers object; the handler is `run_dry_run`."""
    p = subparsers.add_parser("dry-run", help="build and step the real engine for ranks of a large layout, "
                                              "without allocating (meta tensors, a fake process group)",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, choices=MODELS + tuple(REFUSED_MODELS),
                   help="a published model (its layout is the default for every flag below)")
    for flag in ("dp", "tp", "pp"):
        p.add_argument(f"--{flag}", type=positive_int, default=None, help=f"{flag} degree (default: published)")
    p.add_argument("--zero-stage", type=int, choices=(0, 1, 2, 3), default=None,
                   help="ZeRO stage (default: published; 3 gathers each unit before its forward and its backward)")
    p.add_argument("--recompute", choices=("none", "selective", "full"), default=None, help="activation recomputation")
    p.add_argument("--micro-batch", type=positive_int, default=None, help="rows per micro-batch b")
    p.add_argument("--global-batch", type=positive_int, default=None, help="rows per step over all dp ranks")
    p.add_argument("--precision", choices=("bf16", "fp32"), default="bf16", help="default bf16")
    p.add_argument("--rank", type=nonnegative_int, action="append", default=None,
                   help="global rank to stand in for (repeatable; default: first and last pipeline stage, "
                        "first and last tp and dp rank)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=run_dry_run)
    return p


def layout_of(args: argparse.Namespace) -> tuple[dict, TrainConfig, ParallelDims]:
    """The model shape, TrainConfig and ParallelDims the flags name, published values filling the gaps."""
    from ..mesh import ParallelDims              # torch: loaded when the command runs, not for --help
    try:
        preset = published(args.model)
    except ValueError as e:
        raise SystemExit(f"--model {args.model}: {e}") from None
    dp, tp, pp = (getattr(args, k) or preset.get(k, 1) for k in ("dp", "tp", "pp"))
    b = args.micro_batch or preset.get("micro_batch", 1)
    batch = args.global_batch or preset.get("micro_batches", 1) * preset.get("dp", 1) * preset.get("micro_batch", 1)
    stage = preset.get("zero_stage", 1) if args.zero_stage is None else args.zero_stage
    if batch % (dp * b):
        raise SystemExit(f"--global-batch {batch} is not divisible by dp * micro-batch = {dp} * {b} = {dp * b}")
    steps = batch // (dp * b)
    split = dict(micro_batches=steps) if pp > 1 else dict(gradient_accumulation_steps=steps)
    try:
        config = TrainConfig(tp=tp, pp=pp, zero_stage=stage, precision=args.precision, batch_size=batch,
                             activation_checkpointing=args.recompute or preset.get("recompute", "none"), **split)
        dims = ParallelDims(dp=dp, tp=tp, pp=pp)
    except ValueError as e:
        raise SystemExit(f"dry-run: {e}") from None
    return gpt_shape(preset), config, dims


def run_dry_run(args: argparse.Namespace) -> int:
    """Handler for ``minimega dry-run``; prints, and returns 1 when a rank differs from the estimate."""
    from ..analysis.dry_run import check_rank, sample_ranks
    shape, config, dims = layout_of(args)
    ranks = args.rank or sample_ranks(dims)
    if bad := [r for r in ranks if r >= dims.world_size]:
        raise SystemExit(f"--rank {bad[0]}: the layout has {dims.world_size} ranks (0 to {dims.world_size - 1})")
    results = []
    for rank in ranks:
        try:
            results.append(check_rank(shape, config, dims, rank))
        except ValueError as e:
            raise SystemExit(f"dry-run: {e}") from None
    if args.json:
        print(json.dumps({"model": args.model, "shape": shape, "dims": dict(dp=dims.dp, tp=dims.tp, pp=dims.pp),
                          "zero_stage": config.zero_stage,
                          "batch_size": config.batch_size, "ranks": results}, indent=2))
    else:
        _print_table(args.model, dims, config, results)
    return 1 if any(r["differs"] for r in results) else 0


def _print_table(model: str, dims: ParallelDims, config: TrainConfig, results: list[dict]) -> None:
    print(f"{model}: dp {dims.dp} x tp {dims.tp} x pp {dims.pp} = {dims.world_size} ranks, ZeRO-{config.zero_stage}, "
          f"{config.precision}, global batch {config.batch_size}; GB = 1e9 bytes; dry run | estimate")
    for r in results:
        pp_rank, dp_rank, tp_rank = r["coords"]
        print(f"rank {r['rank']} (pp {pp_rank}, dp {dp_rank}, tp {tp_rank}): {r['params']:,} parameters, "
              f"{r['seconds']:.1f} s")
        for c in CATEGORIES:
            got, want = r["memory_peak"][c], r["estimate"]["memory"][c]
            print(f"  {c:<24} {got / GB:>12.6f} {want / GB:>12.6f}  {'=' if got == want else 'DIFFERS'}")
        print(f"  {'activations (peak)':<24} {r['memory_peak']['activations'] / GB:>12.6f}")
        for g, want in r["estimate"]["comm"].items():
            got = r["comm_sent"].get(g, 0.0)
            print(f"  sent over {g:<14} {got / GB:>12.6f} {want / GB:>12.6f}  "
                  f"{'DIFFERS' if f'comm:{g}' in r['differs'] else '='}")
