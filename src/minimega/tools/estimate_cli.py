"""`minimega estimate`: model-state bytes per rank and communication per step, as a table or JSON."""
from __future__ import annotations

import argparse
import json

from ..analysis import (GB, PRECISIONS, PRESETS, STAGES, MemoryConfig, comm_bytes_per_step, model_params,
                        model_state_breakdown, state_bytes_per_param)
from .args import count, positive_int


def add_estimate_parser(subparsers) -> argparse.ArgumentParser:
    """Register ``estimate`` on an argparse subparsers object; the handler is `run_estimate`."""
    p = subparsers.add_parser("estimate", help="model-state bytes per rank and communication per step (ZeRO paper)",
                              description="Per-rank model-state memory (ZeRO paper Fig. 1) and ring communication "
                                          "volume per step. Examples: minimega estimate --params 7.5e9 --dp 64; "
                                          "minimega estimate --model llama3-405b --dp 512")
    _add_estimate_args(p)
    p.set_defaults(func=run_estimate)
    return p


def _add_estimate_args(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--params", type=count, help="parameter count Psi, e.g. 7.5e9, 7.5B or 125M")
    src.add_argument("--model", choices=sorted(PRESETS), help="a preset model: Psi is its parameter count")
    p.add_argument("--dp", type=positive_int, default=1, help="data-parallel degree N_d (default 1)")
    p.add_argument("--stage", type=int, choices=STAGES, default=None,
                   help="one ZeRO stage (default: all four)")
    p.add_argument("--precision", choices=PRECISIONS, default="mixed", help="default mixed (K = 12)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")


def estimate_report(n_params: float, dp: int, stages=STAGES, precision: str = "mixed") -> dict:
    """What `minimega estimate` prints, as a dict (bytes; GB = 1e9 bytes)."""
    grad_bytes = state_bytes_per_param(precision)[1]
    rows = []
    for st in stages:
        parts = model_state_breakdown(n_params, dp, st, precision)
        rows.append({"stage": st, **parts, "total": sum(parts.values()),
                     "comm_bytes_per_step": comm_bytes_per_step(n_params, dp, st, grad_bytes)})
    return {"params": n_params, "dp": dp, "precision": precision, "k": state_bytes_per_param(precision)[2],
            "stages": rows}


def run_estimate(args: argparse.Namespace) -> int:
    """Handler for ``minimega estimate``; prints and returns 0."""
    if args.dp < 1:
        raise SystemExit(f"--dp {args.dp}: must be >= 1")
    model = getattr(args, "model", None)
    if model is not None:
        if PRESETS[model].get("experts"):
            raise SystemExit(f"--model {model}: a mixture of experts; give --params (dense + expert parameters)")
        args.params = model_params(MemoryConfig(**PRESETS[model]))
    if not args.params > 0:
        raise SystemExit(f"--params {args.params}: must be > 0")
    stages = STAGES if args.stage is None else (args.stage,)
    rep = estimate_report(args.params, args.dp, stages, args.precision)
    if model is not None:
        rep["model"] = model
    if args.json:
        print(json.dumps(rep, indent=2))
        return 0
    name = f"{model}: " if model is not None else ""
    print(f"{name}Psi = {args.params:.4g} parameters, N_d = {args.dp}, {args.precision} (K = {rep['k']}); GB = 1e9 bytes")
    print(f"{'stage':>5} {'params':>10} {'grads':>10} {'optimizer':>10} {'total GB':>10} {'comm GB/step':>13}")
    for r in rep["stages"]:
        print(f"{r['stage']:>5} {r['params'] / GB:>10.3f} {r['grads'] / GB:>10.3f} {r['optimizer'] / GB:>10.3f} "
              f"{r['total'] / GB:>10.3f} {r['comm_bytes_per_step'] / GB:>13.3f}")
    return 0


def main(argv=None) -> int:
    """``python -m minimega.tools.estimate_cli --params 7.5B --dp 64``, the same as ``minimega estimate``."""
    p = argparse.ArgumentParser(prog="minimega estimate")
    _add_estimate_args(p)
    return run_estimate(p.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
