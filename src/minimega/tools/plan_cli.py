"""`minimega plan`: rank parallel layouts by predicted throughput, printed as a table or JSON."""
from __future__ import annotations

import argparse
import json

from .. import analysis as est
from ..analysis.memory import GB
from ..analysis.perf import STACKS
from ..analysis.plan import plan, preset_shape
from .args import count, fraction, nonnegative_float, nonnegative_int, positive_float, positive_int
from .hardware_args import add_hardware_args, hardware_from_args


LEGEND = """
layout   dpN-tpN-ppN: data, tensor and pipeline parallel degrees (-epN experts, -cpN context parallelism)
         zK: ZeRO stage K (0: DDP)   none | selective | full: activation recomputation   bN: micro-batch size
         gpipe | 1f1b | interleaved vV | zb_h1: pipeline schedule (V virtual stages)   sp: sequence parallelism
         ring | ulysses: context-parallel attention
model TF/s  model FLOPs per GPU per second (6N per token plus attention, no recomputation): MFU = model TF/s / peak
            ({peak:.0f} TF/s on this GPU)
logged TF/s hardware FLOPs with full recomputation (Narayanan et al. Eq. 3), the "TFLOPs" Megatron-DeepSpeed's
            2022 logs print (BLOOM, MT-NLG); today's Megatron-LM logs model FLOPs
GB       memory per GPU (model states, activations, buffers)
seconds  exposed time of each part of one step; they add up to s/step"""


def add_plan_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("plan", help="rank parallel layouts by predicted throughput (α-β + roofline model)",
                              description="Enumerate dp x tp x pp (x cp with --cp) x ZeRO x recomputation x micro-batch "
                                          "x schedule, drop what does not fit memory, print the fastest. Example: "
                                          "minimega plan "
                                          "--model bloom-176b --nodes 48 --global-batch 2048 --recompute full")
    g = p.add_argument_group("model")
    g.add_argument("--model", choices=sorted(est.PRESETS), default=None, help="a preset shape")
    for name in ("layers", "hidden", "heads", "vocab", "seq-len"):
        g.add_argument(f"--{name}", type=positive_int, default=None, help="overrides the preset")
    g.add_argument("--kv-heads", type=positive_int, default=None, help="key/value heads (grouped-query attention)")
    g.add_argument("--ffn", type=positive_int, default=None, help="the MLP's inner width (default 4 x hidden)")
    g.add_argument("--mlp", choices=est.MLPS, default=None, help="gelu (2 matrices) or swiglu (3)")
    g.add_argument("--precision", choices=est.PRECISIONS, default=None)
    g.add_argument("--fp32-grads", action="store_true", default=None, help="grads accumulate in fp32 (4 B/param)")
    g.add_argument("--no-dropout", action="store_true", help="the model has no dropout (BLOOM)")
    g.add_argument("--attention", choices=est.ATTENTION, default=None)
    g.add_argument("--experts", type=nonnegative_int, default=None, help="experts per MoE layer (the search adds ep)")
    g.add_argument("--top-k", type=positive_int, default=None, help="experts per token (with --experts; default 2)")
    g.add_argument("--capacity-factor", type=positive_float, default=None, help="with --experts; default 1.25")
    c = p.add_argument_group("cluster")
    add_hardware_args(c)
    c.add_argument("--nodes", type=positive_int, default=None,
                   help="nodes (GPUs = nodes x GPUs per node; a GB200 NVL72 node is a 4-GPU compute tray)")
    c.add_argument("--gpus", type=positive_int, default=None, help="total GPUs (instead of --nodes)")
    c.add_argument("--stack", choices=sorted(STACKS), default=None, help="pipeline engine (default: the preset's)")
    r = p.add_argument_group("run")
    r.add_argument("--global-batch", type=positive_int, required=True, help="sequences per step")
    r.add_argument("--tokens", type=count, default=None, help="training tokens, for days and cost (e.g. 300B)")
    r.add_argument("--price", type=nonnegative_float, default=2.0, help="$ per GPU-hour (default 2.0)")
    r.add_argument("--memory-fraction", type=fraction, default=0.9, help="share of GPU memory a layout may use (0.9)")
    s = p.add_argument_group("search")
    s.add_argument("--recompute", nargs="+", choices=est.RECOMPUTE, default=None)
    s.add_argument("--zero-stages", nargs="+", type=int, choices=est.STAGES, default=None)
    s.add_argument("--schedules", nargs="+", choices=est.SCHEDULES, default=None)
    s.add_argument("--no-sp", action="store_true", help="search without Megatron sequence parallelism")
    s.add_argument("--cp", nargs="+", type=positive_int, default=None, metavar="CP",
                   help="context-parallel degrees to search, e.g. --cp 1 2 4 8 (default: 1, no context parallelism; "
                        "needs --attention fused)")
    s.add_argument("--cp-attention", nargs="+", choices=est.CP_ATTENTION, default=None,
                   help="context-parallel attention to search with cp > 1 (default: ring ulysses)")
    s.add_argument("--tp", nargs="+", type=positive_int, default=None, metavar="TP",
                   help="tensor-parallel degrees to search (default: every divisor of the heads up to the NVLink "
                        "domain: 8 GPUs on DGX/HGX, 72 on GB200 NVL72; a larger one is refused)")
    s.add_argument("--top", type=positive_int, default=10, help="layouts to print (default 10)")
    s.add_argument("--verify", type=nonnegative_int, default=0, metavar="N",
                   help="dry-run the top N picks (one sampled rank each, minimega's GPT of this shape on meta tensors) "
                        "and print whether their model-state and collective bytes equal analysis.layout's estimate")
    s.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run_plan)
    return p


def _model_from_args(args) -> dict:
    model = preset_shape(args.model) if args.model else {}
    for k in ("layers", "hidden", "heads", "vocab", "seq_len", "precision", "fp32_grads", "attention", "stack",
              "experts", "top_k", "capacity_factor", "kv_heads", "ffn", "mlp"):
        if getattr(args, k) is not None:
            model[k] = getattr(args, k)
    if args.no_dropout:
        model["dropout"] = False
    missing = [k for k in ("layers", "hidden", "heads", "vocab", "seq_len") if k not in model]
    if missing:
        raise ValueError(f"give --model or all of --layers --hidden --heads --vocab --seq-len (missing {missing})")
    return model


def run_plan(args: argparse.Namespace) -> int:
    hw = hardware_from_args(args)
    if (args.nodes is None) == (args.gpus is None):
        raise ValueError("give exactly one of --nodes and --gpus")
    n = args.gpus if args.gpus is not None else args.nodes * hw.gpus_per_node
    opts = {k: tuple(getattr(args, a)) for k, a in (("recompute", "recompute"), ("zero_stages", "zero_stages"),
                                                    ("schedules", "schedules")) if getattr(args, a)}
    if args.no_sp:
        opts["sp"] = (False,)
    if args.tp:
        opts["tps"] = tuple(dict.fromkeys(args.tp))
    if args.cp:
        opts["cps"] = tuple(dict.fromkeys(args.cp))
    if args.cp_attention:
        if not args.cp or max(args.cp) == 1:
            raise ValueError("--cp-attention has an effect only with --cp searching a degree > 1 (e.g. --cp 1 2 4 8)")
        opts["cp_attentions"] = tuple(dict.fromkeys(args.cp_attention))
    res = plan(_model_from_args(args), n, args.global_batch, hw, top=args.top, memory_fraction=args.memory_fraction,
               tokens=args.tokens, price_per_gpu_hour=args.price, **opts)
    verified = _verify(_model_from_args(args), res["top"][:args.verify])
    caveat = _mfu_caveat(res["top"])
    if args.json:
        res = {k: v for k, v in res.items() if k != "ranked"} | {"mfu_caveat": caveat}
        for row, v in zip(res["top"], verified):
            row["verify"] = v
        print(json.dumps(res, indent=2, default=str))
        return 0
    print(f"{res['hardware']} x {n}: {res['searched']} layouts searched, {res['fit']} fit "
          f"{args.memory_fraction:.0%} of {hw.memory_bytes / GB:.0f} GB; NVLink domain {hw.domain} GPUs")
    w = max([38] + [len(r["layout"]) for r in res["top"]])
    ep, cp = any(r["ep_comm"] for r in res["top"]), any(r["cp_comm"] for r in res["top"])
    parts = ["compute", "tp", "p2p", "bubble", "stack", "dp"] + ["ep"] * ep + ["cp"] * cp
    keys = ["compute", "tp_comm", "p2p", "bubble", "stack_overhead", "dp_comm"] + ["ep_comm"] * ep + ["cp_comm"] * cp
    per_gpu = f"{'model':>6} {'':>5} {'logged':>6} {'':>5}"
    print(f"{'':>2} {'':<{w}} {'':>8} {'':>9} {per_gpu}  " + "seconds per step, by part".center(7 * len(parts)))
    head = (f"{'#':>2} {'layout (legend below)':<{w}} {'s/step':>8} {'tok/s':>9} {'TF/s':>6} {'MFU':>5} {'TF/s':>6} "
            f"{'GB':>5}  " + " ".join(f"{p:>6}" for p in parts))
    if args.tokens:
        head += f" {'days':>7} {'cost $':>11}"
    print(head)
    for i, r in enumerate(res["top"], 1):
        line = (f"{i:>2} {r['layout']:<{w}} {r['total']:>8.2f} {r['tokens_per_s']:>9.0f} "
                f"{r['model_tflops_per_gpu']:>6.1f} {r['mfu']:>5.1%} {r['tflops_per_gpu']:>6.1f} {r['memory_gb']:>5.1f}  "
                + " ".join(f"{r[k]:>6.2f}" for k in keys))
        if args.tokens:
            line += f" {r['days']:>7.1f} {r['cost']:>11,.0f}"
        print(line)
    for i, v in enumerate(verified, 1):
        print(_verify_line(i, v))
    if caveat:
        print(caveat)
    print(LEGEND.format(peak=hw.peak_flops / 1e12))
    return 1 if any(v.get("differs") for v in verified) else 0


def _mfu_caveat(rows: list[dict]) -> str | None:
    """`published_mfu.mfu_caveat` for the fastest layout (dense models: an MoE's MFU counts active parameters)."""
    if not rows or rows[0]["config"].get("experts"):
        return None
    from types import SimpleNamespace
    from ..analysis.published_mfu import mfu_caveat
    from ..analysis.shapes import model_params
    return mfu_caveat(model_params(SimpleNamespace(**rows[0]["config"])), rows[0]["mfu"])


def _verify(model: dict, rows: list[dict]) -> list[dict]:
    """`dry_run.verify_pick` of each row, reduced to what the table and the JSON print."""
    from ..analysis.dry_run import verify_pick
    out = []
    for row in rows:
        v = verify_pick(model, row["config"])
        out.append(v if "skipped" in v else {k: v[k] for k in ("rank", "coords", "differs", "model_state_bytes",
                                                                "comm_bytes", "seconds")})
    return out


def _verify_line(i: int, v: dict) -> str:
    if "skipped" in v:
        return f"verify #{i}: not dry-run: {v['skipped']}"
    (ms, ms_est), (cb, cb_est) = v["model_state_bytes"], v["comm_bytes"]
    verdict = "equal" if not v["differs"] else "DIFFERS in " + ", ".join(v["differs"])
    return (f"verify #{i}: rank {v['rank']} (pp, dp, tp) = {tuple(v['coords'])}: model states {ms:,} B dry run | "
            f"{ms_est:,} B estimate; collectives {cb:,.0f} B | {cb_est:,.0f} B sent per step: {verdict} "
            f"({v['seconds']:.1f} s)")
