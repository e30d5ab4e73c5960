"""``minimega trace compare DIR``: the measured parts of a step (from ``minimega train --trace DIR``) next to
``perf.step_time``'s prediction for the same model and layout."""
from __future__ import annotations

import argparse
import json
import statistics

from ..run import trace
from ..analysis import perf
from .hardware_args import add_hardware_args, hardware_from_args

PARTS = ("compute", "exposed_comm", "bubble", "optimizer", "other", "total")


def add_trace_parser(sub) -> None:
    p = sub.add_parser("trace", help="read the Chrome traces of `minimega train --trace DIR`")
    tsub = p.add_subparsers(dest="trace_command", required=True)
    c = tsub.add_parser("compare", help="measured parts of a step next to the step-time model's prediction",
                        description="Split every traced step into compute, exposed communication, pipeline bubble "
                                    "and optimizer (mean over ranks and over the steps after the first), and print "
                                    "perf.step_time's prediction for the same model and layout beside it.")
    c.add_argument("dir", help="the --trace directory of a `minimega train` run")
    add_hardware_args(c)
    c.add_argument("--calibration", default=None, metavar="FILE",
                   help="predict on this machine's measured rates: the JSON of `minimega calibrate --json` "
                        "(instead of --gpu/--custom)")
    c.add_argument("--json", action="store_true")
    c.set_defaults(func=_cmd_compare)


def perf_config(meta: dict) -> perf.PerfConfig:
    """The `PerfConfig` of a traced run (its model and TrainConfig, as `minimega train --trace` records them)."""
    model, cfg, layout = meta["model"], meta["config"], meta["layout"]
    if "n_experts" in model:
        raise ValueError("trace compare: mixture-of-experts runs are not compared (the trace holds no routing)")
    pp = cfg["pp"]
    m = cfg["micro_batches"] if pp > 1 else cfg["gradient_accumulation_steps"]
    dp = layout["dp"]
    micro_batch = cfg["batch_size"] // (dp * m)
    return perf.PerfConfig(
        layers=model["n_layer"], hidden=model["n_embd"], heads=model["n_head"], vocab=model["vocab_size"],
        seq_len=cfg["seq_len"] or model["block_size"], micro_batch=micro_batch, global_batch=cfg["batch_size"],
        precision="fp32" if cfg["precision"] == "fp32" else "mixed", fp32_grads=cfg["precision"] != "fp32",
        zero_stage=cfg["zero_stage"], tp=cfg["tp"], dp=dp, pp=pp, cp=cfg["cp"], sp=cfg["sequence_parallel"],
        recompute=cfg["activation_checkpointing"], virtual_stages=cfg["virtual_stages"],
        schedule="interleaved" if cfg["schedule"] == "interleaved_1f1b" else cfg["schedule"],
        offload="optimizer" if cfg["offload_optimizer"] else "none", attention="fused",
        dropout=model["dropout"] > 0, bucket_bytes=cfg["bucket_mb"] * 2 ** 20, overlap_comm=cfg["overlap_comm"])


def measured(directory) -> tuple[dict, dict, int]:
    """(mean seconds per part over ranks and steps after the first, the run's metadata, steps averaged)."""
    files = trace.rank_files(directory)
    if not files:
        raise ValueError(f"{directory}: no rank<r>.trace.json files (run `minimega train --trace {directory}`)")
    rows, meta = [], None
    for path in files:
        t = trace.read(path)
        meta = meta or t.get("otherData", {}).get("minimega")
        steps = trace.step_parts(t)
        rows += steps[1:] if len(steps) > 1 else steps           # the first step warms up (allocations, caches)
    if not rows or not isinstance(meta, dict) or "config" not in meta:
        raise ValueError(f"{directory}: the traces hold no steps or no run metadata")
    return {k: statistics.fmean(r[k] for r in rows) for k in PARTS}, meta, len(rows) // len(files)


def predicted(cfg: perf.PerfConfig, hw) -> dict:
    r = perf.step_time(cfg, hw)
    comm = r["tp_comm"] + r["ep_comm"] + r["cp_comm"] + r["p2p"] + r["dp_comm"] + r["offload"]
    return {"compute": r["compute"], "exposed_comm": comm, "bubble": r["bubble"], "optimizer": r["optimizer"],
            "other": r["stack_overhead"], "total": r["total"]}


def _cmd_compare(args: argparse.Namespace) -> int:
    got, meta, n = measured(args.dir)
    if args.calibration:
        from ..analysis.calibrate import cpu_hardware
        with open(args.calibration) as f:
            hw = cpu_hardware(json.load(f))
    else:
        hw = hardware_from_args(args)
    want = predicted(perf_config(meta), hw)
    if args.json:
        print(json.dumps({"measured": got, "predicted": want, "hardware": hw.name, "steps": n}))
        return 0
    print(f"one step, ms: measured (mean of {len(trace.rank_files(args.dir))} rank(s) x {n} step(s)) vs "
          f"predicted by perf.step_time on {hw.name}")
    print(f"  {'part':<14} {'measured':>10} {'predicted':>10}")
    for k in PARTS:
        print(f"  {k.replace('_', ' '):<14} {got[k] * 1e3:>10.3f} {want[k] * 1e3:>10.3f}")
    return 0
