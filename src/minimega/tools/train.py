"""``minimega train``: the GPT on the shipped corpus across N local ranks, with restarts, checkpoints and a summary."""
from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import signal
import sys
import threading
import time

from ..config import GPTConfig, TrainConfig
from ..run.slurm import REQUEUE_EXIT
from .args import flag_names, nonnegative_float, nonnegative_int, positive_float, positive_int
from .elastic import checkpoint_step, maybe_fault, maybe_poison, maybe_slow, run_elastic
from .health_run import RunHealth, add_health_flags, health_settings
from .train_args import add_config_flags, build_train_config, given_flags, moe_config


def add_train_parser(sub) -> None:
    p = sub.add_parser("train", help="train the GPT on the shipped corpus across N local ranks",
                       description="Train on N local ranks (gloo on CPU, NCCL with one GPU per rank).")
    p.add_argument("--nproc", type=positive_int, default=None,
                   help="number of ranks (processes) (default: 1; under srun or torchrun the tasks they started)")
    p.add_argument("--dp", type=positive_int, default=None, help="data-parallel degree (default: nproc / (tp*pp))")
    p.add_argument("--steps", type=positive_int, default=None, help="optimizer steps (default: 20)")
    p.add_argument("--total-steps", type=positive_int, default=None, metavar="N",
                   help="end at step N counted from step 0 across resumes, instead of running --steps more: a "
                        "requeued job that repeats its command ends where an uninterrupted run would")
    p.add_argument("--preset", default="tiny", choices=["tiny", "small", "gpt2", "tiny-llama"],
                   help="model size; tiny-llama: tiny with GQA, SwiGLU and RoPE (default: tiny)")
    p.add_argument("--config", default=None, help="a DeepSpeed-style JSON config; flags override it")
    p.add_argument("--backend", default="auto", choices=["auto", "gloo", "nccl"])
    p.add_argument("--json", action="store_true", help="print the final summary as JSON")
    p.add_argument("--save-dir", default=None,
                   help="checkpoint directory (default: the --resume directory); with one, SIGUSR1 or SIGTERM "
                        "(a scheduler's preemption notice) ends the run after a step agreed by every rank, "
                        f"with a checkpoint, and exit status {REQUEUE_EXIT} (requeue me)")
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
                   help="make every MLP a mixture of N experts (minimega.parallel.moe.layer; default: dense)")
    p.add_argument("--top-k", type=positive_int, default=None, help="with --experts: experts per token (default: 2)")
    p.add_argument("--capacity-factor", type=positive_float, default=None,
                   help="with --experts: slots per expert = factor * top_k * T / E per sequence (default: 1.25)")
    p.add_argument("--moe-dispatch", choices=("capacity", "dropless"), default=None,
                   help="with --experts: 'capacity' drops tokens over capacity (GShard slots), 'dropless' sorts "
                        "them by expert and keeps every one (default: capacity)")
    p.add_argument("--moe-z-loss", type=nonnegative_float, default=None, metavar="C",
                   help="with --experts: add C * mean logsumexp(router logits)^2 per layer (ST-MoE; default: 0)")
    p.add_argument("--moe-bias-rate", type=nonnegative_float, default=None, metavar="G",
                   help="with --experts: auxiliary-loss-free balancing, a routing bias moved by G * "
                        "sign(mean load - load) after each step (DeepSeek-V3; default: 0, off)")
    p.add_argument("--shared-experts", type=nonnegative_int, default=None, metavar="S",
                   help="with --experts: S always-active experts, one dense MLP of hidden S*F every token passes, "
                        "added ungated (DeepSeekMoE; synced over dp, not split over ep; default: 0)")
    p.add_argument("--expert-hidden", type=positive_int, default=None, metavar="F",
                   help="with --experts: each expert's hidden width F (default: the dense MLP's 4*D); fine-grained "
                        "experts (DeepSeekMoE): m times the experts at F/m, m times the --top-k")
    p.add_argument("--trace", default=None, metavar="DIR",
                   help="write one Chrome trace per rank (DIR/rank<r>.trace.json) and all ranks in one "
                        "(DIR/all.trace.json): open them in Perfetto or chrome://tracing; "
                        "`minimega trace compare DIR` sets them next to the step-time model")
    p.add_argument("--straggler-factor", type=positive_float, default=None, metavar="F",
                   help="name in the log a rank whose own work per step (waiting in collectives excluded) is "
                        "persistently F times its peers', e.g. 2 (default: not watched)")
    add_health_flags(p)
    add_config_flags(p)
    p.set_defaults(func=_cmd_train)


def train_worker(preset: str, config: TrainConfig, steps: int, show: bool | str, ckpt: dict | None = None,
                 show_schedule: bool = False, moe=None, trace_dir: str | None = None) -> dict:
    """What every rank of ``minimega train`` runs; rank 0 shows the progress.

    ``show``: False for none, ``"bar"`` for a tqdm bar, ``"lines"`` (or True) for plain lines (progress.py);
    the launcher chooses, as it alone knows whether its output is a terminal.

    ``steps`` more steps are run from wherever the job starts, unless ``ckpt["until"]`` names the step to
    end at (an elastic restart resumes part-way and runs only what is left). ``trace_dir``: write this rank's
    Chrome trace there at the end (`minimega.run.trace`).
    """
    import torch

    from .. import comm
    from .. import data
    from ..train.engine import initialize
    from ..mesh import ParallelDims, init_mesh
    from ..run.launch import current_world_size, report_step
    from ..run.slurm import Preemption
    from ..model import GPT

    dims = dataclasses.replace(ParallelDims.infer(current_world_size(), tp=config.tp, pp=config.pp, cp=config.cp),
                               ep=config.ep)
    mesh = init_mesh(dims)
    torch.manual_seed(config.seed)
    if moe is not None:
        from ..parallel.moe.layer import MoEGPT
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
    health = RunHealth(engine, ckpt.get("health"), ckpt.get("skip_batches", ()), ckpt.get("dir"), mesh.rank)
    preempt = Preemption(ckpt["preempt"]) if ckpt.get("preempt") else None
    stopped = None
    start = last = time.perf_counter()
    while engine.step < first + steps:
        index = health.batch_index(engine.step)          # the step's batch, past the ones skipped
        batch = next(data.batches(mesh, 1, config.batch_size, seq, seed=config.seed, start=index))
        with maybe_poison(engine.parts, index):
            loss = engine.train_step(batch)
        maybe_slow(mesh.rank, time.perf_counter() - last)
        now = time.perf_counter()
        step_rate, last = tokens_per_step / (now - last), now           # this step's tokens/s, not a running mean
        if health.after_step(engine.step - 1, index, loss, step_rate):
            continue                                     # rolled back: engine.step is the checkpoint's
        if ckpt.get("every") and engine.step % ckpt["every"] == 0:
            engine.save(ckpt["dir"])
        report_step(engine.step)
        maybe_fault(mesh.rank, engine.step)
        if progress is not None:
            progress.update(engine.step - first, loss, step_rate)
        if preempt is not None and engine.step < first + steps and preempt.agreed(mesh.world):
            stopped = _save_for_requeue(engine, ckpt)
            break
    engine.wait_for_save()                               # an async save still in flight is committed
    if preempt is not None:
        preempt.close()
    wall, steps = time.perf_counter() - start, engine.step - first
    health.close()
    if progress is not None:
        progress.close()
    if trace_dir is not None:
        from ..run import trace
        trace.write(engine.report(), trace_dir, {"model": dataclasses.asdict(model.config), "preset": preset,
                                                 "config": dataclasses.asdict(config), "device": str(mesh.device),
                                                 "world_size": mesh.world_size, "first_step": first})
    sent = engine.comm_log.total_sent()
    total_sent = comm.all_reduce(torch.tensor([sent], dtype=torch.float64), mesh.world).item()
    return {"losses": engine.losses, "first_step": first, "wall_s": wall,
            "tokens_per_s": tokens_per_step * steps / wall if steps else 0.0,
            "sent_bytes_rank": sent, "sent_bytes_all_ranks": total_sent,
            "params": model.num_params(), "memory": memory_table(engine, config), "nvme": nvme_table(engine, config),
            "moe": engine.experts.counts() if engine.experts is not None else None,
            "health": health.events, "skipped_batches": health.skip, "preempted_at": stopped,
            "pipeline_timeline": engine.pipeline.events if show_schedule and engine.pipeline and mesh.dp_rank == 0
            and mesh.tp_rank == 0 else None}


# --8<-- [start:save_for_requeue]
def _save_for_requeue(engine, ckpt: dict) -> int:
    """Every rank agreed to stop after this step: finish an async save in flight, then write this step's
    checkpoint (the atomic sharded save) unless the periodic save just wrote it. Returns the step."""
    engine.wait_for_save()
    if not (ckpt.get("every") and engine.step % ckpt["every"] == 0):
        engine.save(ckpt["dir"])
        engine.wait_for_save()
    return engine.step
# --8<-- [end:save_for_requeue]


def memory_table(engine, config: TrainConfig) -> dict:
    """This rank's model-state bytes at the optimizer step (params, grads and states all live), measured, next to
    `minimega estimate`'s figure for the same layout: Ψ this rank's parameters (ZeRO: its units padded to a
    multiple of dp), sharded over the gradient group (dp, times cp), at the run's precision (bf16 keeps fp32
    gradients, Megatron's main grads: 2 + 4 + 12 bytes per parameter, not the fp16 "mixed" 2 + 2 + 12)."""
    measured = dict(engine.memory_at_step)
    rows = {"params": measured.get("params", 0), "grads": measured.get("grads", 0),
            "optimizer": measured.get("master", 0) + measured.get("optimizer_states", 0),
            "step counters": measured.get("optimizer_step_counters", 0)}
    out = {"measured": rows, "estimate": None, "estimate_command": None}
    if engine.experts is not None or config.offload_optimizer:
        return out                      # experts shard over edp, offload splits host and device: not one formula
    from ..analysis import model_state_breakdown
    if engine.zero_stages:
        psi = sum(u.padded for w in engine.zero_stages for u in w.units)
    else:
        psi = sum(p.numel() for p in engine.model.parameters())
    dp, precision = engine.mesh.grad_group.size, config.precision    # the estimate of this run's own precision
    out["estimate"] = model_state_breakdown(psi, dp, config.zero_stage, precision)
    out["estimate_command"] = (f"minimega estimate --params {psi} --dp {dp} --stage {config.zero_stage} "
                               f"--precision {precision}")
    return out


def nvme_table(engine, config: TrainConfig) -> dict | None:
    """With ``nvme_path``: this rank's bytes fetched from and sent to storage per optimizer step (``/proc/self/io``
    around the disk tier's steps: the drive's own count, page-cache hits excluded), next to
    `estimate.nvme_bytes_per_step` for this rank's padded shard (K = 12 under Adam, 4 under SGD)."""
    stores = [z.store for z in engine.zero_stages if getattr(z.store, "location", "") == "nvme"]
    if not stores:
        return None
    from ..analysis import nvme_bytes_per_step
    steps = max(1, stores[0].storage_total["steps"])
    shard = sum(m.numel() for s in stores for m in s.master)
    kind = "sgd" if stores[0].width == 1 else "adamw"
    want = nvme_bytes_per_step(shard * engine.mesh.grad_group.size, engine.mesh.grad_group.size,
                               config.zero_stage, kind)
    return {"read_bytes_per_step": sum(s.storage_total["read_bytes"] for s in stores) / steps,
            "write_bytes_per_step": sum(s.storage_total["write_bytes"] for s in stores) / steps,
            "estimate_per_step": {"read": want["read"], "write": want["write"]},
            "o_direct": all(s.direct for s in stores), "steps": stores[0].storage_total["steps"]}


def _print_memory(memory: dict) -> None:
    mib = 2 ** 20
    est = memory["estimate"]
    print(f"model states on rank 0 at the optimizer step, MiB (estimate: {memory['estimate_command'] or 'none for this layout'}):")
    print(f"  {'':<14} {'measured':>10} {'estimate':>10}")
    for name, value in memory["measured"].items():
        other = est.get(name) if est else None
        print(f"  {name:<14} {value / mib:>10.3f} {'' if other is None else f'{other / mib:>10.3f}'}")
    total = sum(v for k, v in memory["measured"].items() if k != "step counters")
    print(f"  {'total':<14} {total / mib:>10.3f} {'' if not est else f'{sum(est.values()) / mib:>10.3f}'}")


def _progress(args: argparse.Namespace) -> bool | str:
    """What rank 0 shows: nothing under --json, a bar on a terminal, plain lines in a log or a pipe."""
    from .progress import mode_for
    return False if args.json else mode_for(sys.stderr)


def _start(args: argparse.Namespace, config: TrainConfig, nproc: int, ckpt: dict) -> list:
    """One attempt of the job: ``nproc`` fresh ranks running `train_worker`."""
    from ..run.launch import launch
    forward = (signal.SIGUSR1, signal.SIGTERM) if ckpt.get("preempt") else ()
    return launch(train_worker, nproc, args.preset, config, args.steps, _progress(args), ckpt,
                  args.show_schedule, moe_config(args), args.trace, backend=args.backend, timeout=args.timeout,
                  stragglers=args.straggler_factor, forward_signals=forward)


def _fits(args: argparse.Namespace, dims, nproc: int) -> bool:
    """Whether the run's layout validates on ``nproc`` ranks (dp shrinks; tp, pp, cp and ep stay)."""
    from ..train.engine import validate
    from ..mesh import ParallelDims
    try:
        smaller = dataclasses.replace(ParallelDims.infer(nproc, tp=dims.tp, pp=dims.pp, cp=dims.cp), ep=dims.ep)
        validate(GPTConfig.preset(args.preset), build_train_config(args, smaller.dp), smaller, moe_config(args))
    except ValueError:
        return False
    return True


def _terminated(signum, frame):
    """SIGTERM (kill) unwinds like Ctrl-C: launch() stops the ranks on the way out. With a --save-dir the ranks
    hear SIGUSR1 and SIGTERM themselves while they run (launch's forward_signals), and stop with a checkpoint."""
    raise SystemExit(128 + signum)


def _this_rank() -> int:
    """This process's rank when a scheduler started it as one (srun task, torchrun worker), else 0 (the launcher)."""
    import os
    return int(os.environ["RANK"]) if "RANK" in os.environ and "WORLD_SIZE" in os.environ else 0


# --8<-- [start:ranks_from_scheduler]
def _ranks_from_scheduler(args: argparse.Namespace) -> bool:
    """Under srun (one task per rank) take the rank's environment from Slurm's; under torchrun, from torchrun's.
    Fills in --nproc from it; returns whether a scheduler started this process as one rank."""
    import os
    from ..run import slurm
    if slurm.in_srun_task():
        os.environ.update(slurm.rank_environment())
    if not ("RANK" in os.environ and "WORLD_SIZE" in os.environ) or os.environ.get("MINIMEGA_WORKER"):
        args.nproc = args.nproc or 1
        return False
    world = int(os.environ["WORLD_SIZE"])
    if args.nproc not in (None, world):
        raise ValueError(f"--nproc {args.nproc}, but the scheduler started {world} rank(s) (WORLD_SIZE={world}): "
                         "leave --nproc out under srun or torchrun")
    args.nproc = world
    import torch
    from ..run.launch import cpu_share
    from ..run.processes import keep_freed_memory
    torch.set_num_threads(max(1, cpu_share() // int(os.environ.get("LOCAL_WORLD_SIZE", world))))
    keep_freed_memory()
    return True
# --8<-- [end:ranks_from_scheduler]


def _check_train_args(args: argparse.Namespace):
    """Every refusal that needs no rank, before the job is announced: (dims, config, save_dir, min_nproc, the
    step to resume from), the checkpoint to resume included (`elastic.checkpoint_step`)."""
    from ..train.engine import validate
    from ..mesh import ParallelDims

    if args.steps is not None and args.total_steps is not None:
        raise ValueError("--steps and --total-steps both say when to end: give one")
    try:
        tp, pp = args.tp or 1, args.pp or 1
        dims = ParallelDims.infer(args.nproc, tp=tp, pp=pp, cp=args.cp or 1)
        dims = dataclasses.replace(dims, ep=args.ep or 1)
        if args.dp is not None:
            ParallelDims(dp=args.dp, tp=tp, pp=pp, cp=args.cp or 1).check(args.nproc)
        config = build_train_config(args, dims.dp)
        validate(GPTConfig.preset(args.preset), config, dims, moe_config(args))
    except ValueError as err:
        raise ValueError(flag_names(str(err), given_flags(args))) from None
    save_dir = args.save_dir or args.resume
    if args.save_every and not save_dir:
        raise ValueError("--save-every needs --save-dir (or --resume) to know where to write")
    if config.async_save and not args.save_every:
        raise ValueError("--async-save changes how checkpoints are written: it needs --save-every N (and --save-dir)")
    if args.max_restarts and not args.save_every:
        raise ValueError("--max-restarts needs --save-dir and --save-every: a restart resumes from the latest "
                         "checkpoint (without one it would start over from step 0)")
    min_nproc = args.nproc if args.min_nproc is None else args.min_nproc
    if min_nproc > args.nproc:
        raise ValueError(f"--min-nproc must lie in [1, --nproc={args.nproc}], got {min_nproc}")
    if min_nproc < args.nproc and not args.max_restarts:
        raise ValueError("--min-nproc only matters with --max-restarts: a job that never restarts never shrinks")
    start = checkpoint_step(args.resume, _model_config(args)) if args.resume else 0
    if args.total_steps is not None and args.total_steps < start:
        raise ValueError(f"--total-steps {args.total_steps}, but the checkpoint in {args.resume} is at step {start}")
    args.steps = 20 if args.total_steps is None and args.steps is None else args.steps
    args.steps = args.total_steps - start if args.steps is None else args.steps
    health_settings(args)                       # its refusals, before the job starts
    if args.straggler_factor is not None and not args.straggler_factor > 1:
        raise ValueError(f"--straggler-factor {args.straggler_factor}: a straggler is slower than its peers, "
                         "so the factor must be > 1 (e.g. 2)")
    if args.straggler_factor and args.nproc < 2:
        raise ValueError("--straggler-factor needs --nproc >= 2: a rank is slow only next to its peers")
    return dims, config, save_dir, min_nproc, start


def _model_config(args: argparse.Namespace):
    """The model config the ranks will build (what a checkpoint to resume must have been saved for)."""
    moe = moe_config(args)
    if moe is None:
        return GPTConfig.preset(args.preset)
    from ..parallel.moe.layer import MoEGPTConfig
    return MoEGPTConfig(**dataclasses.asdict(GPTConfig.preset(args.preset)), **dataclasses.asdict(moe))


def _cmd_train(args: argparse.Namespace) -> int:
    scheduled = _ranks_from_scheduler(args)
    code = _train_ranks(args, scheduled)
    if scheduled:                  # one rank of srun's or torchrun's: its status is the scheduler's signal
        from ..run.processes import end_rank
        end_rank(code)
    return code


def _train_ranks(args: argparse.Namespace, scheduled: bool) -> int:
    if scheduled and args.max_restarts:
        raise ValueError("--max-restarts restarts ranks this process started; under srun or torchrun the "
                         "scheduler restarts the job (sbatch --requeue): leave it out")
    dims, config, save_dir, min_nproc, start = _check_train_args(args)
    pp, rank0 = dims.pp, _this_rank() == 0
    if rank0:
        print(f"minimega train: {args.nproc} rank(s), dp={dims.dp} tp={dims.tp} pp={dims.pp} cp={dims.cp} ep={dims.ep}, zero_stage="
              f"{config.zero_stage}, preset {args.preset}, {args.steps} steps", file=sys.stderr)
    ckpt = {"resume": args.resume, "every": args.save_every, "dir": save_dir, "until": start + args.steps,
            "health": health_settings(args), "skip_batches": sorted(set(args.skip_batch or ())),
            "preempt": ((signal.SIGUSR1, signal.SIGTERM) if scheduled else (signal.SIGUSR1,)) if save_dir else ()}
    if threading.current_thread() is threading.main_thread() and not scheduled:
        signal.signal(signal.SIGTERM, _terminated)
    results = run_elastic(functools.partial(_start, args, config), args.nproc, ckpt, max_restarts=args.max_restarts,
                          min_nproc=min_nproc, fits=functools.partial(_fits, args, dims), model_config=_model_config(args))
    if not rank0:
        return REQUEUE_EXIT if results[0]["preempted_at"] is not None else 0
    if args.trace:
        from ..run import trace
        print(f"minimega train: traces in {args.trace} (all ranks: {trace.merge(args.trace)}); open them in "
              "https://ui.perfetto.dev or chrome://tracing", file=sys.stderr)
    if args.show_schedule and pp > 1:
        from ..pipeline.printer import grid_from_timelines, legend, render, wall_idle
        rows = [r["pipeline_timeline"] for r in results if r["pipeline_timeline"] is not None]
        grid = grid_from_timelines(rows, step=args.steps - 1)
        walls = ", ".join(f"rank {r} {w:.3f}" for r, w in enumerate(wall_idle(rows, step=args.steps - 1)))
        print(render(grid), legend(grid), f"  wall clock: idle share of the same step, measured: {walls} (the grid "
              "counts slots as if every pass took one; the clock times them)", sep="\n", file=sys.stderr)
    r0 = results[0]
    losses = r0["losses"] or [float("nan")]           # a restart at the very end has no step left to run
    summary = {"first_loss": losses[0], "final_loss": losses[-1], "steps": args.steps,
               "nproc": len(results), "first_step": r0["first_step"], "restarts": ckpt.get("restarts", []),
               "wall_s": round(r0["wall_s"], 3), "tokens_per_s": round(r0["tokens_per_s"], 1),
               "params": r0["params"], "algorithmic_bytes_sent_all_ranks": r0["sent_bytes_all_ranks"],
               "losses": r0["losses"], "memory_rank0": r0["memory"], "health": r0["health"],
               **({"nvme_per_rank": [r["nvme"] for r in results]} if r0.get("nvme") else {}),
               "skipped_batches": r0["skipped_batches"], "preempted": None}
    if r0["preempted_at"] is not None:
        summary["preempted"] = {"step": r0["preempted_at"], "checkpoint": save_dir, "exit": REQUEUE_EXIT}
        print(f"minimega train: preempted: every rank stopped after step {r0['preempted_at']}; checkpoint in "
              f"{save_dir}; exit {REQUEUE_EXIT} (requeue me: resume with --resume {save_dir})",
              file=sys.stderr, flush=True)
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
        _print_memory(r0["memory"])
    return REQUEUE_EXIT if summary["preempted"] else 0
