"""The `minimega` command: ``train``, ``checkpoint``, ``export-config``, ``serve`` (course site + exam), ``cert``.

Bad input is refused before any rank starts, in one line naming the flag (cli_args.py says how).

``minimega train`` maps its flags one-to-one onto `TrainConfig` fields (``--zero-stage``, ``--tp``,
``--sp`` …), generated from the dataclass so the two never drift apart.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import signal
import sys
import threading
import time
import typing

from .cli_args import Parser, flag_names, nonnegative_int, positive_float, positive_int
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


@functools.lru_cache(maxsize=1)
def _config_source() -> tuple[str, ...]:
    """TrainConfig's source lines, read once (parsing them per field cost seconds on every command)."""
    import inspect
    return tuple(inspect.getsource(TrainConfig).splitlines())


def _field_doc(name: str) -> str:
    """The docstring under a TrainConfig field (read from the source, shown in --help)."""
    lines = _config_source()
    for i, line in enumerate(lines):
        if line.strip().startswith(f"{name}:") and i + 1 < len(lines) and lines[i + 1].strip().startswith('"""'):
            return lines[i + 1].strip().strip('"')
    return ""


def _train_parser(sub) -> None:
    p = sub.add_parser("train", help="train the GPT on the shipped corpus across N local ranks",
                       description="Train on N local ranks (gloo on CPU, NCCL with one GPU per rank).")
    p.add_argument("--nproc", type=positive_int, default=1, help="number of ranks (processes) (default: 1)")
    p.add_argument("--dp", type=positive_int, default=None, help="data-parallel degree (default: nproc / (tp*pp))")
    p.add_argument("--steps", type=positive_int, default=20, help="optimizer steps (default: 20)")
    p.add_argument("--preset", default="tiny", choices=["tiny", "small", "gpt2"], help="model size (default: tiny)")
    p.add_argument("--config", default=None, help="a DeepSpeed-style JSON config; flags override it")
    p.add_argument("--backend", default="auto", choices=["auto", "gloo", "nccl"])
    p.add_argument("--json", action="store_true", help="print the final summary as JSON")
    p.add_argument("--save-dir", default=None, help="checkpoint directory (default: the --resume directory)")
    p.add_argument("--save-every", type=nonnegative_int, default=0, help="save a checkpoint every N steps (0: never)")
    p.add_argument("--resume", default=None, help="continue from the latest checkpoint in this directory")
    p.add_argument("--show-schedule", action="store_true", help="print the pipeline's rank x time grid of the last step")
    p.add_argument("--timeout", type=positive_float, default=300.0,
                   help="watchdog: seconds a collective may wait, or a rank stay silent, before the job is ended "
                        "naming the stuck rank (default: 300)")
    p.add_argument("--max-restarts", type=nonnegative_int, default=0,
                   help="when a rank dies, restart the job from the latest checkpoint in --save-dir up to N "
                        "times (default: 0)")
    p.add_argument("--min-nproc", type=positive_int, default=None,
                   help="let a restart drop the failed ranks and continue on as few as M ranks, resharding on "
                        "load (default: --nproc, i.e. always restart at full size)")
    p.add_argument("--experts", type=positive_int, default=None,
                   help="make every MLP a mixture of N experts (minimega.moe; default: dense)")
    p.add_argument("--top-k", type=positive_int, default=None, help="with --experts: experts per token (default: 2)")
    p.add_argument("--capacity-factor", type=positive_float, default=None,
                   help="with --experts: slots per expert = factor * top_k * T / E per sequence (default: 1.25)")
    _add_config_flags(p)
    p.set_defaults(func=_cmd_train)


def _moe_config(args: argparse.Namespace):
    """The MoEConfig the --experts/--top-k/--capacity-factor flags ask for, or None (a dense model)."""
    from .moe import MoEConfig
    given = {k: v for k, v in (("n_experts", args.experts), ("top_k", args.top_k),
                               ("capacity_factor", args.capacity_factor)) if v is not None}
    if given and "n_experts" not in given:
        raise ValueError("--top-k and --capacity-factor need --experts N (they shape a mixture of experts)")
    return MoEConfig(**given) if given else None


def build_train_config(args: argparse.Namespace, dp: int) -> TrainConfig:
    overrides = {f.name: getattr(args, f.name) for f in dataclasses.fields(TrainConfig)
                 if getattr(args, f.name, None) is not None}
    if "betas" in overrides:
        overrides["betas"] = tuple(overrides["betas"])
    if args.config:
        return TrainConfig.from_deepspeed(args.config, dp=dp, **overrides)
    return TrainConfig(**overrides)


FAULT_STEP_ENV = "MINIMEGA_FAULT_STEP"
"""Fault injection for tests and the lab: ``"<rank>:<step>"`` makes that rank SIGKILL itself once it has
finished that step, on the first attempt only (``MINIMEGA_RESTART_COUNT`` = 0), as a lost node would."""
RESTART_ENV = "MINIMEGA_RESTART_COUNT"
"""Which attempt this is (0 first); set by ``minimega train`` for its ranks, like torchrun's
TORCHELASTIC_RESTART_COUNT."""


def _maybe_fault(rank: int, step: int) -> None:
    spec = os.environ.get(FAULT_STEP_ENV)
    if not spec or os.environ.get(RESTART_ENV, "0") != "0":
        return
    try:
        fault_rank, fault_step = (int(v) for v in spec.split(":"))
    except ValueError:
        raise ValueError(f"{FAULT_STEP_ENV}={spec!r}: expected '<rank>:<step>', e.g. '1:7'") from None
    if (rank, step) == (fault_rank, fault_step):
        sys.stdout.flush(), sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)


def train_worker(preset: str, config: TrainConfig, steps: int, show: bool | str, ckpt: dict | None = None,
                 show_schedule: bool = False, moe=None) -> dict:
    """What every rank of ``minimega train`` runs; rank 0 shows the progress.

    ``show``: False for none, ``"bar"`` for a tqdm bar, ``"lines"`` (or True) for plain lines (progress.py);
    the launcher chooses, as it alone knows whether its output is a terminal.

    ``steps`` more steps are run from wherever the job starts, unless ``ckpt["until"]`` names the step to
    end at (an elastic restart resumes part-way and runs only what is left).
    """
    import torch

    from . import comm, data
    from .engine import initialize
    from .mesh import ParallelDims, init_mesh
    from .launch import current_world_size, report_step
    from .model import GPT

    dims = dataclasses.replace(ParallelDims.infer(current_world_size(), tp=config.tp, pp=config.pp, cp=config.cp),
                               ep=config.ep)
    mesh = init_mesh(dims)
    torch.manual_seed(config.seed)
    if moe is not None:
        from .moe import MoEGPT
        model = MoEGPT(GPTConfig.preset(preset), moe)
    else:
        model = GPT(GPTConfig.preset(preset))
    engine = initialize(model, config, mesh)
    ckpt = ckpt or {}
    if ckpt.get("resume"):
        engine.load(ckpt["resume"])
    first = engine.step
    report_step(first)
    if ckpt.get("until") is not None:
        steps = ckpt["until"] - first
    seq = config.seq_len or model.config.block_size
    tokens_per_step = config.batch_size * seq
    progress = None
    if show and mesh.rank == 0:
        from .progress import LINES, StepProgress
        progress = StepProgress(steps, LINES if show is True else show)
    start = time.perf_counter()
    for step, batch in enumerate(data.batches(mesh, steps, config.batch_size, seq, seed=config.seed, start=first)):
        loss = engine.train_step(batch)
        if ckpt.get("every") and engine.step % ckpt["every"] == 0:
            engine.save(ckpt["dir"])
        report_step(engine.step)
        _maybe_fault(mesh.rank, engine.step)
        if progress is not None:
            progress.update(step + 1, loss, tokens_per_step * (step + 1) / (time.perf_counter() - start))
    wall = time.perf_counter() - start
    if progress is not None:
        progress.close()
    sent = engine.comm_log.total_sent()
    total_sent = comm.all_reduce(torch.tensor([sent], dtype=torch.float64), mesh.world).item()
    return {"losses": engine.losses, "first_step": first, "wall_s": wall,
            "tokens_per_s": tokens_per_step * steps / wall if steps else 0.0,
            "sent_bytes_rank": sent, "sent_bytes_all_ranks": total_sent,
            "params": model.num_params(), "memory": engine.memory(),
            "moe": engine.experts.counts() if engine.experts is not None else None,
            "pipeline_timeline": engine.pipeline.events if show_schedule and engine.pipeline and mesh.dp_rank == 0
            and mesh.tp_rank == 0 else None}


def _checkpoint_step(directory) -> int:
    from . import checkpoint
    path = checkpoint.resolve(directory)          # fails here, before any rank starts, if there is none
    return int(json.loads((path / "manifest.json").read_text())["step"])


def _shrink(nproc: int, lost: int, min_nproc: int, config: TrainConfig) -> int | None:
    """The largest world size that fits without the lost ranks: >= min_nproc, a multiple of tp*pp, and a
    dp that divides the global batch. None if there is none."""
    for n in range(nproc - lost, min_nproc - 1, -1):
        if n % (config.tp * config.pp) == 0 and config.batch_size % (n // (config.tp * config.pp)) == 0:
            return n
    return None


def _progress(args: argparse.Namespace) -> bool | str:
    """What rank 0 shows: nothing under --json, a bar on a terminal, plain lines in a log or a pipe."""
    from .progress import mode_for
    return False if args.json else mode_for(sys.stderr)


# --8<-- [start:elastic]
def _run_elastic(args: argparse.Namespace, config: TrainConfig, ckpt: dict, min_nproc: int) -> list:
    """Launch; when a rank dies, relaunch from the latest complete checkpoint, as torchrun's elastic agent does.

    Every attempt is a fresh job: new processes, a new process group, the state read back from disk. A
    failed rank's slot is dropped only if ``--min-nproc`` allows it (torchrun's ``--nnodes=MIN:MAX``: a lost
    node does not come back); the checkpoint reshards onto the smaller world on load.
    """
    from . import checkpoint
    from .launch import LaunchTimeout, WorkerError, launch

    nproc, attempt = args.nproc, 0
    ckpt["restarts"] = []
    saved = os.environ.get(RESTART_ENV)
    while True:
        os.environ[RESTART_ENV] = str(attempt)        # the ranks get the launcher's environment as it is now
        try:
            return launch(train_worker, nproc, args.preset, config, args.steps, _progress(args), ckpt,
                          args.show_schedule, _moe_config(args), backend=args.backend, timeout=args.timeout)
        except WorkerError as err:
            if attempt >= args.max_restarts:
                raise
            attempt += 1
            latest = checkpoint.resolve_or_none(ckpt["dir"])
            resume_step = _checkpoint_step(latest) if latest else 0
            if nproc > min_nproc:
                smaller = _shrink(nproc, 1, min_nproc, config)
                nproc = smaller or nproc
            failed_at = err.step if err.step is not None else resume_step
            why = str(err).splitlines()[0]
            event = {"attempt": attempt, "rank": err.rank, "step": failed_at, "resume_step": resume_step,
                     "redone": max(0, failed_at - resume_step), "nproc": nproc,
                     "watchdog": isinstance(err, LaunchTimeout), "error": why}
            ckpt["restarts"].append(event)
            print(f"\nminimega train: restart {attempt}/{args.max_restarts}: rank {err.rank} failed at step "
                  f"{failed_at} ({why}); resuming on {nproc} rank(s) from "
                  + (f"the checkpoint at step {resume_step}" if latest else "step 0 (no checkpoint yet)")
                  + f": {event['redone']} step(s) redone", file=sys.stderr, flush=True)
            ckpt["resume"] = str(latest) if latest else None
        finally:
            if saved is None:
                os.environ.pop(RESTART_ENV, None)
            else:
                os.environ[RESTART_ENV] = saved
# --8<-- [end:elastic]


def _terminated(signum, frame):
    """SIGTERM (kill, a scheduler's preemption) unwinds like Ctrl-C: launch() stops the ranks on the way out."""
    raise SystemExit(128 + signum)


MOE_FLAGS = {"n_experts": "--experts", "top_k": "--top-k", "capacity_factor": "--capacity-factor"}


def _given_flags(args: argparse.Namespace) -> dict[str, str]:
    """{config field: the flag that set it} for the fields given on the command line (not from --config)."""
    fields = {f.name: f"--{f.name.replace('_', '-')}" for f in dataclasses.fields(TrainConfig)
              if getattr(args, f.name, None) is not None}
    moe = {"n_experts": args.experts, "top_k": args.top_k, "capacity_factor": args.capacity_factor}
    fields.update({name: flag for name, flag in MOE_FLAGS.items() if moe[name] is not None})
    if args.dp is not None:
        fields["dp"] = "--dp"
    return fields


def _check_train_args(args: argparse.Namespace):
    """Every refusal that needs no rank, before the job is announced: (dims, config, save_dir, min_nproc)."""
    from .engine import validate
    from .mesh import ParallelDims

    try:
        tp, pp = args.tp or 1, args.pp or 1
        dims = ParallelDims.infer(args.nproc, tp=tp, pp=pp, cp=args.cp or 1)
        dims = dataclasses.replace(dims, ep=args.ep or 1)
        if args.dp is not None:
            ParallelDims(dp=args.dp, tp=tp, pp=pp, cp=args.cp or 1).check(args.nproc)
        config = build_train_config(args, dims.dp)
        validate(GPTConfig.preset(args.preset), config, dims, _moe_config(args))
    except ValueError as err:
        raise ValueError(flag_names(str(err), _given_flags(args))) from None
    save_dir = args.save_dir or args.resume
    if args.save_every and not save_dir:
        raise ValueError("--save-every needs --save-dir (or --resume) to know where to write")
    if args.max_restarts and not args.save_every:
        raise ValueError("--max-restarts needs --save-dir and --save-every: a restart resumes from the latest "
                         "checkpoint (without one it would start over from step 0)")
    min_nproc = args.nproc if args.min_nproc is None else args.min_nproc
    if min_nproc > args.nproc:
        raise ValueError(f"--min-nproc must lie in [1, --nproc={args.nproc}], got {min_nproc}")
    if min_nproc < args.nproc and not args.max_restarts:
        raise ValueError("--min-nproc only matters with --max-restarts: a job that never restarts never shrinks")
    if args.resume:
        from . import checkpoint
        checkpoint.resolve(args.resume)          # fail here, before any rank starts, if there is none
    return dims, config, save_dir, min_nproc


def _cmd_train(args: argparse.Namespace) -> int:
    dims, config, save_dir, min_nproc = _check_train_args(args)
    pp = dims.pp
    print(f"minimega train: {args.nproc} rank(s), dp={dims.dp} tp={dims.tp} pp={dims.pp} cp={dims.cp} ep={dims.ep}, zero_stage="
          f"{config.zero_stage}, preset {args.preset}, {args.steps} steps", file=sys.stderr)
    start = _checkpoint_step(args.resume) if args.resume else 0
    ckpt = {"resume": args.resume, "every": args.save_every, "dir": save_dir, "until": start + args.steps}
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _terminated)
    results = _run_elastic(args, config, ckpt, min_nproc)
    if args.show_schedule and pp > 1:
        from .pipeline.printer import grid_from_timelines, legend, render
        rows = [r["pipeline_timeline"] for r in results if r["pipeline_timeline"] is not None]
        grid = grid_from_timelines(rows, step=args.steps - 1)
        print(render(grid), legend(grid), sep="\n", file=sys.stderr)
    r0 = results[0]
    losses = r0["losses"] or [float("nan")]           # a restart at the very end has no step left to run
    summary = {"first_loss": losses[0], "final_loss": losses[-1], "steps": args.steps,
               "nproc": len(results), "first_step": r0["first_step"], "restarts": ckpt.get("restarts", []),
               "wall_s": round(r0["wall_s"], 3), "tokens_per_s": round(r0["tokens_per_s"], 1),
               "params": r0["params"], "algorithmic_bytes_sent_all_ranks": r0["sent_bytes_all_ranks"],
               "losses": r0["losses"]}
    if r0.get("moe") is not None:      # tokens routed to and dropped by each expert, per layer, all ranks together
        summary["moe"] = {k: [[sum(c) for c in zip(*per_layer)] for per_layer in zip(*(r["moe"][k] for r in results))]
                          for k in ("routed", "dropped")}
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
    parser = Parser(prog="minimega", description="minimega: train, estimate, plan, export-config, checkpoint; serve the course and its exam; verify certificates.")
    sub = parser.add_subparsers(dest="command", required=True)
    _train_parser(sub)
    _checkpoint_parser(sub)
    from .classroom.checkbank import add_exam_parser
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
    add_exam_parser(sub)
    add_cert_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    from .checkpoint import CheckpointError
    from .launch import WorkerError

    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exit_:      # --help, or a refused command line (already explained on stderr)
        return exit_.code
    try:
        return args.func(args)
    except WorkerError as exc:       # a rank failed: its message already names it and carries its traceback
        print(f"\nminimega {args.command}: {exc}", file=sys.stderr)      # below any progress bar
        return 1
    except (ValueError, CheckpointError) as exc:   # configuration mistakes, unusable checkpoints: one line
        print(f"minimega {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
