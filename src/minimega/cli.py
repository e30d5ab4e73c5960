"""The `minimega` command: ``train``, ``checkpoint``, ``export-config``, ``serve`` (course site + exam), ``cert``.

``minimega train`` maps its flags one-to-one onto `TrainConfig` fields (``--zero-stage``, ``--tp``,
``--sp`` …), generated from the dataclass so the two never drift apart.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
import typing

from .config import GPTConfig, TrainConfig


# ------------------------------------------------------------------------------------------------
# minimega train

def _add_config_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per TrainConfig field; defaults stay None so --config files are only overridden when set."""
    hints = typing.get_type_hints(TrainConfig)
    for f in dataclasses.fields(TrainConfig):
        flags = [f"--{f.name.replace('_', '-')}", *f.metadata.get("flags", ())]
        flags = list(dict.fromkeys(flags))
        doc = _field_doc(f.name)
        hint = hints[f.name]
        if hint is bool:
            parser.add_argument(*flags, dest=f.name, action=argparse.BooleanOptionalAction, default=None, help=doc)
        elif f.name == "betas":
            parser.add_argument(*flags, dest=f.name, type=float, nargs=2, default=None, help=doc)
        else:
            base = typing.get_args(hint)[0] if typing.get_origin(hint) in (typing.Union, getattr(__import__("types"), "UnionType", None)) else hint
            parser.add_argument(*flags, dest=f.name, type=base, default=None,
                                help=f"{doc} (default: {f.default})")


def _positive_int(text: str) -> int:
    """argparse type: an integer >= 1 (``--steps 0`` would train nothing and report nothing)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be >= 1")
    return value


def _field_doc(name: str) -> str:
    """The docstring under a TrainConfig field (read from the source, shown in --help)."""
    import inspect
    lines = inspect.getsource(TrainConfig).splitlines()
    for i, line in enumerate(lines):
        if line.strip().startswith(f"{name}:") and i + 1 < len(lines) and lines[i + 1].strip().startswith('"""'):
            return lines[i + 1].strip().strip('"')
    return ""


def _train_parser(sub) -> None:
    p = sub.add_parser("train", help="train the GPT on the shipped corpus across N local ranks",
                       description="Train on N local ranks (gloo on CPU, NCCL with one GPU per rank).")
    p.add_argument("--nproc", type=int, default=1, help="number of ranks (processes) (default: 1)")
    p.add_argument("--dp", type=int, default=None, help="data-parallel degree (default: nproc / (tp*pp))")
    p.add_argument("--steps", type=_positive_int, default=20, help="optimizer steps (default: 20)")
    p.add_argument("--preset", default="tiny", choices=["tiny", "small", "gpt2"], help="model size (default: tiny)")
    p.add_argument("--config", default=None, help="a DeepSpeed-style JSON config; flags override it")
    p.add_argument("--backend", default="auto", choices=["auto", "gloo", "nccl"])
    p.add_argument("--json", action="store_true", help="print the final summary as JSON")
    p.add_argument("--save-dir", default=None, help="checkpoint directory (default: the --resume directory)")
    p.add_argument("--save-every", type=int, default=0, help="save a checkpoint every N steps (0: never)")
    p.add_argument("--resume", default=None, help="continue from the latest checkpoint in this directory")
    p.add_argument("--show-schedule", action="store_true", help="print the pipeline's rank x time grid of the last step")
    _add_config_flags(p)
    p.set_defaults(func=_cmd_train)


def build_train_config(args: argparse.Namespace, dp: int) -> TrainConfig:
    overrides = {f.name: getattr(args, f.name) for f in dataclasses.fields(TrainConfig)
                 if getattr(args, f.name, None) is not None}
    if "betas" in overrides:
        overrides["betas"] = tuple(overrides["betas"])
    if args.config:
        return TrainConfig.from_deepspeed(args.config, dp=dp, **overrides)
    return TrainConfig(**overrides)


def train_worker(preset: str, config: TrainConfig, steps: int, show: bool, ckpt: dict | None = None,
                 show_schedule: bool = False) -> dict:
    """What every rank of ``minimega train`` runs; rank 0 draws the progress bar."""
    import torch

    from . import comm, data
    from .engine import initialize
    from .mesh import ParallelDims, init_mesh
    from .launch import current_world_size
    from .model import GPT

    dims = ParallelDims.infer(current_world_size(), tp=config.tp, pp=config.pp)
    mesh = init_mesh(dims)
    torch.manual_seed(config.seed)
    model = GPT(GPTConfig.preset(preset))
    engine = initialize(model, config, mesh)
    ckpt = ckpt or {}
    if ckpt.get("resume"):
        engine.load(ckpt["resume"])
    first = engine.step
    seq = config.seq_len or model.config.block_size
    tokens_per_step = config.batch_size * seq
    start = time.perf_counter()
    for step, batch in enumerate(data.batches(mesh, steps, config.batch_size, seq, seed=config.seed, start=first)):
        loss = engine.train_step(batch)
        if ckpt.get("every") and engine.step % ckpt["every"] == 0:
            engine.save(ckpt["dir"])
        if show and mesh.rank == 0:
            elapsed = time.perf_counter() - start
            done = (step + 1) / steps
            bar = "#" * int(24 * done) + "." * (24 - int(24 * done))
            print(f"\rstep {step + 1:>4}/{steps} [{bar}] loss {loss:7.4f} | "
                  f"{tokens_per_step * (step + 1) / elapsed:9.0f} tok/s", end="", file=sys.stderr, flush=True)
    wall = time.perf_counter() - start
    if show and mesh.rank == 0:
        print(file=sys.stderr)
    sent = engine.comm_log.total_sent()
    total_sent = comm.all_reduce(torch.tensor([sent], dtype=torch.float64), mesh.world).item()
    return {"losses": engine.losses, "wall_s": wall, "tokens_per_s": tokens_per_step * steps / wall,
            "sent_bytes_rank": sent, "sent_bytes_all_ranks": total_sent,
            "params": model.num_params(), "memory": engine.memory(),
            "pipeline_timeline": engine.pipeline.events if show_schedule and engine.pipeline and mesh.dp_rank == 0
            and mesh.tp_rank == 0 else None}


def _cmd_train(args: argparse.Namespace) -> int:
    from .launch import launch
    from .mesh import ParallelDims

    if args.nproc < 1:
        raise SystemExit(f"minimega train: --nproc must be >= 1, got {args.nproc}")
    tp, pp = args.tp or 1, args.pp or 1
    dims = ParallelDims.infer(args.nproc, tp=tp, pp=pp)
    if args.dp is not None:
        ParallelDims(dp=args.dp, tp=tp, pp=pp).check(args.nproc)
    config = build_train_config(args, dims.dp)
    from .engine import validate
    validate(GPTConfig.preset(args.preset), config, dims)     # before any rank starts
    print(f"minimega train: {args.nproc} rank(s), dp={dims.dp} tp={dims.tp} pp={dims.pp}, zero_stage="
          f"{config.zero_stage}, preset {args.preset}, {args.steps} steps", file=sys.stderr)
    if args.resume:
        from . import checkpoint
        checkpoint.resolve(args.resume)          # fail here, before any rank starts, if there is none
    save_dir = args.save_dir or args.resume
    if args.save_every and not save_dir:
        raise ValueError("--save-every needs --save-dir (or --resume) to know where to write")
    ckpt = {"resume": args.resume, "every": args.save_every, "dir": save_dir}
    results = launch(train_worker, args.nproc, args.preset, config, args.steps, not args.json, ckpt,
                     args.show_schedule, backend=args.backend)
    if args.show_schedule and pp > 1:
        from .pipeline.printer import grid_from_timelines, render
        rows = [r["pipeline_timeline"] for r in results if r["pipeline_timeline"] is not None]
        print(render(grid_from_timelines(rows, step=args.steps - 1)), file=sys.stderr)
    r0 = results[0]
    summary = {"first_loss": r0["losses"][0], "final_loss": r0["losses"][-1], "steps": args.steps,
               "wall_s": round(r0["wall_s"], 3), "tokens_per_s": round(r0["tokens_per_s"], 1),
               "params": r0["params"], "algorithmic_bytes_sent_all_ranks": r0["sent_bytes_all_ranks"],
               "losses": r0["losses"]}
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"loss {summary['first_loss']:.4f} -> {summary['final_loss']:.4f} in {summary['wall_s']:.1f} s "
              f"({summary['tokens_per_s']:.0f} tok/s); {summary['params']:,} parameters; "
              f"{summary['algorithmic_bytes_sent_all_ranks'] / 2**20:.2f} MiB sent by all ranks "
              f"(algorithmic: the ring model over tensor sizes)")
    return 0


# ------------------------------------------------------------------------------------------------
# minimega checkpoint

def _checkpoint_parser(sub) -> None:
    p = sub.add_parser("checkpoint", help="inspect or consolidate a distributed checkpoint")
    csub = p.add_subparsers(dest="action", required=True)
    c = csub.add_parser("consolidate", help="write full fp32 weights (model.py keys) to one safetensors file")
    c.add_argument("dir", help="checkpoint directory (a step-… folder, or its parent with 'latest')")
    c.add_argument("out", help="output .safetensors file")
    c.set_defaults(func=_cmd_consolidate)
    i = csub.add_parser("info", help="print a checkpoint's manifest summary after verifying checksums")
    i.add_argument("dir")
    i.set_defaults(func=_cmd_info)
    e = csub.add_parser("export", help="write a checkpoint for other tools: torch DCP, or one safetensors file")
    e.add_argument("dir", help="checkpoint directory (a step-… folder, or its parent with 'latest')")
    e.add_argument("out", help="output: a directory (dcp) or a .safetensors file")
    e.add_argument("--format", required=True, choices=["dcp", "safetensors"],
                   help="dcp: torch.distributed.checkpoint (dcp.load reads it into model.py's or FSDP2's state "
                        "dict); safetensors: consolidated fp32 weights")
    e.set_defaults(func=_cmd_export)
    m = csub.add_parser("import", help="a minimega checkpoint (weights) from a torch DCP directory of model.py's "
                                       "state dict (e.g. saved under FSDP2)")
    m.add_argument("source", help="the DCP directory")
    m.add_argument("dir", help="the minimega checkpoint directory to create (its step-… and 'latest')")
    m.add_argument("--preset", default="tiny", choices=["tiny", "small", "gpt2"], help="model size (default: tiny)")
    m.add_argument("--model-config", default="{}", help="GPTConfig overrides as JSON, e.g. '{\"block_size\": 32}'")
    m.add_argument("--step", type=int, default=0, help="the step to record (default: 0)")
    m.set_defaults(func=_cmd_import)


def _cmd_consolidate(args) -> int:
    from . import checkpoint
    out = checkpoint.consolidate(args.dir, args.out)
    print(f"wrote {out} ({out.stat().st_size / 2**20:.2f} MiB)")
    return 0


def _cmd_export(args) -> int:
    from . import checkpoint
    out = checkpoint.export_dcp(args.dir, args.out) if args.format == "dcp" else \
        checkpoint.export_safetensors(args.dir, args.out)
    print(f"wrote {out} ({args.format})")
    return 0


def _cmd_import(args) -> int:
    from . import checkpoint
    try:
        overrides = json.loads(args.model_config)
    except ValueError as exc:
        raise ValueError(f"--model-config is not JSON ({exc})") from None
    if not isinstance(overrides, dict):
        raise ValueError("--model-config must be a JSON object of GPTConfig fields")
    try:
        config = GPTConfig.preset(args.preset, **overrides)
    except TypeError as exc:
        raise ValueError(f"--model-config: {exc}") from None
    out = checkpoint.import_dcp(args.source, args.dir, config, step=args.step)
    print(f"wrote {out}")
    return 0


def _cmd_info(args) -> int:
    from . import checkpoint
    path, manifest = checkpoint.open_checked(args.dir, None)
    print(json.dumps({"path": str(path), "step": manifest["step"], "layout": manifest["layout"],
                      "files": len(manifest["files"]), "bytes": sum(f["bytes"] for f in manifest["files"].values()),
                      "tensors": len(manifest["tensors"]), "checks": "ok"}, indent=1))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="minimega", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    _train_parser(sub)
    _checkpoint_parser(sub)
    from .classroom.cli import add_cert_parser, add_serve_parser
    from .estimate import add_estimate_parser
    from .export_config import add_export_parser
    from .record import add_record_parser
    from .perf_calibrate import add_calibrate_parser
    from .perf_plan import add_plan_parser
    add_estimate_parser(sub)
    add_plan_parser(sub)
    add_calibrate_parser(sub)
    add_export_parser(sub)
    add_record_parser(sub)
    add_serve_parser(sub)
    add_cert_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    from .checkpoint import CheckpointError
    from .launch import WorkerError

    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except WorkerError as exc:       # a rank failed: its message already names it and carries its traceback
        print(f"minimega {args.command}: {exc}", file=sys.stderr)
        return 1
    except (ValueError, CheckpointError) as exc:   # configuration mistakes, unusable checkpoints: one line
        print(f"minimega {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
