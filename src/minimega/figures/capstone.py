"""The capstone's predictions: three published runs predicted with minimega's planner, estimators and time model.

    python -m minimega.figures.capstone            # writes course/data/capstone.json
    python -m minimega.figures.capstone --check    # exits 1 if the committed file differs from a fresh prediction

For each run (`RUNS`): the planner (`plan.plan`) searches every layout of the model on the run's GPUs, and we
keep its top pick and the rank it gives the published grid; the time model (`perf.step_time`) predicts the
published layout's MFU, throughput or TFLOP/s; the memory estimators give its bytes per GPU. Chapter 17 renders
the tables from the JSON (`table_markdown`, called by tools/learner_hook.py), so no number on the page is typed by
hand. Every published number carries its source (`Published.source`); one that is not in the paper says so.

What the model cannot state is stated instead of hidden (the chapter lists it): DeepSeek-V3's fine-grained experts,
MLA, FP8 and DualPipe; Llama 3's interleaved stages over 126 layers; OPT's exact batch and recomputation.
The one expensive number, a dry run of Llama 3 405B's rank 0 (about 140 s), is recorded once in
course/data/capstone-llama3-405b-dry-run.json by ``minimega dry-run --model llama3-405b --rank 0 --json``;
here only the estimate it is held against is recomputed (`dry_run.rank_estimate`).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from .. import analysis as est
from ..analysis.hardware import HARDWARE, Link
from ..analysis.perf import PerfConfig, step_time
from ..analysis.plan import layout_name, plan, preset_shape, rank_of

ROOT = Path(__file__).resolve().parents[3]
DATA = ROOT / "course" / "data" / "capstone.json"
DRY_RUN = ROOT / "course" / "data" / "capstone-llama3-405b-dry-run.json"
GB = 1e9

LLAMA3 = "Llama Team 2024, The Llama 3 Herd of Models, arXiv:2407.21783"
DEEPSEEK = "DeepSeek-AI 2024, DeepSeek-V3 Technical Report, arXiv:2412.19437"
OPT = "Zhang et al. 2022, OPT: Open Pre-trained Transformer Language Models, arXiv:2205.01068"

BAND = 0.25
"""Relative error a prediction may have without an explanation: chapter 13's ±20% on Megatron runs on A100,
widened to 25% because these runs use what the model leaves out (FSDP, interleaving, MoE kernels)."""


@dataclass(frozen=True)
class Published:
    """A published number and where it is printed (``source``); ``unverified`` when no paper prints it."""
    value: float | str
    source: str
    unverified: bool = False


# --8<-- [start:h800]
H800 = replace(HARDWARE["h100"], name="H800 SXM 80GB",
               intra=Link(name="NVLink (H800)", bandwidth=160 * GB, alpha=5e-6),
               inter=Link(name="InfiniBand (H800 cluster)", bandwidth=50 * GB, alpha=10e-6))
# --8<-- [end:h800]
"""The H800 as DeepSeek-V3 §3.2.2 describes its cluster: "NVLink offers a bandwidth of 160 GB/s, roughly 3.2 times
that of IB (50 GB/s)", 8 GPUs a node (§3.1). Its compute and HBM are taken as the H100 SXM's (989 TFLOP/s bf16,
3.35 TB/s, 80 GB): an assumption, not from the report (§3.5.1 counts the same 132 SMs)."""

# --8<-- [start:deepseek_proxy]
DEEPSEEK_PROXY = dict(layers=61, hidden=7168, heads=128, vocab=129280, seq_len=4096, experts=64, top_k=1,
                      capacity_factor=1.0, precision="bf16", dropout=False, attention="fused",
                      position_embedding=False, tied=False)
# --8<-- [end:deepseek_proxy]
"""DeepSeek-V3 as minimega's MoE block can state it. The report (§4.2): 61 layers, hidden 7168, 128 heads, the first
3 MLPs dense and the rest MoE with 1 shared and 256 routed experts of width 2048, 8 routed per token; 4K
sequences; vocabulary 128K (129,280 in the released config). minimega's expert is a 4h GELU MLP, 8h² = 411M
parameters; DeepSeek's is a SwiGLU of 3·7168·2048 = 44M. One minimega expert per token (top-1, capacity 1.0:
no slot left empty on average) does about the FLOPs of DeepSeek's 8 routed + 1 shared experts (9 × 44M = 396M);
64 experts is the smallest count ep = 64 can split. The proxy's time is meaningful, its parameter count is not
(64 × 411M per layer): memory comes from the real counts instead (`deepseek_model_states`)."""
DEEPSEEK_ROUTED = 58 * 256 * 3 * 7168 * 2048
"""Routed-expert parameters: 58 MoE layers × 256 experts × a SwiGLU of 3 · 7168 · 2048 (§4.2)."""
DEEPSEEK_TOTAL = 671e9
"""Total parameters (abstract and §4.2: "671B total parameters, of which 37B are activated for each token")."""

OPT_SHAPE = dict(layers=96, hidden=12288, heads=96, vocab=50272, seq_len=2048, precision="fp16")
"""OPT-175B (Table 1: 96 layers, 96 heads, d_model 12288; §2.2: sequences of 2048, dropout 0.1; §2.4: FP16
weights, FP32 Adam). Vocabulary 50,272: the released configuration's (GPT-2's BPE, §2.3). ReLU, not GELU: the
same FLOPs and bytes in this model."""


def deepseek_model_states() -> float:
    """Model-state bytes per GPU of DeepSeek-V3 under PP16 × EP64 with ZeRO-1 over dp = 128 (2048 / 16), bf16 with
    fp32 gradients and Adam (`estimate.moe_model_state_bytes`), one pipeline stage holding 1/16 of every part."""
    dense = (DEEPSEEK_TOTAL - DEEPSEEK_ROUTED) / 16
    return est.moe_model_state_bytes(dense, DEEPSEEK_ROUTED / 16, 128, 64, 1, "bf16")


def _published_row(cfg: PerfConfig, hw) -> dict:
    r = step_time(cfg, hw)
    return {"layout": layout_name(cfg), "total_s": r["total"], "mfu": r["mfu"], "tokens_per_s": r["tokens_per_s"],
            "tflops_per_gpu": r["tflops_per_gpu"], "model_tflops_per_gpu": r["model_tflops_per_gpu"],
            "memory_gb": r["memory"]["total"] / GB, "activations_gb": r["memory"]["activations"] / GB,
            "grads_gb": r["memory"]["grads"] / GB, "bubble_s": r["bubble"], "ep_comm_s": r["ep_comm"],
            "fits": r["fits"]}


def _planner(shape: dict, gpus: int, batch: int, hw, grid: str, **options) -> dict:
    """The planner's top pick and the best rank of any layout on the published grid (dp, ep, tp, pp, ZeRO)."""
    result = plan(shape, gpus, batch, hw, top=1, **options)
    on_grid = [name for name in result["ranked"] if name.startswith(grid)]
    return {"searched": result["searched"], "fit": result["fit"], "top": result["top"][0]["layout"],
            "top_mfu": result["top"][0]["mfu"], "grid": grid,
            "grid_best": on_grid[0] if on_grid else None, "grid_rank": rank_of(result, on_grid[0]) if on_grid else None}


def llama3() -> dict:
    shape = preset_shape("llama3-405b")
    # --8<-- [start:llama3_predict]
    published = dict(est.PRESETS["llama3-405b"], dropout=False, tp=8, pp=16, micro_batch=1, zero_stage=1,
                     recompute="none", sp=True)
    p8k = _published_row(PerfConfig(**published, dp=64, global_batch=2048), "h100")
    p16k = _published_row(PerfConfig(**published, dp=128, global_batch=2048), "h100")
    full = _published_row(PerfConfig(**dict(published, recompute="full"), dp=64, global_batch=2048), "h100")
    # Llama interleaves V = 2 stages per pipeline rank (Figure 6); 126 layers do not split into 16 x 2 chunks, so
    # the what-if runs a 128-layer stand-in of the same width (its own FLOPs in its MFU)
    v2 = dict(published, layers=128, schedule="interleaved", virtual_stages=2)
    i8k = _published_row(PerfConfig(**v2, dp=64, global_batch=2048), "h100")
    i16k = _published_row(PerfConfig(**v2, dp=128, global_batch=2048), "h100")
    # --8<-- [end:llama3_predict]
    dry = json.loads(DRY_RUN.read_text(encoding="utf-8"))["ranks"][0]
    from ..analysis.dry_run import rank_estimate                   # imports torch: only where it is needed
    from ..analysis.layout import gpt_shape, published as published_layout
    from ..config import TrainConfig
    from ..mesh import ParallelDims
    preset = published_layout("llama3-405b")
    config = TrainConfig(tp=8, pp=16, zero_stage=1, precision="bf16", batch_size=2048, micro_batches=32)
    estimate = rank_estimate(gpt_shape(preset), config, ParallelDims(dp=64, tp=8, pp=16), 0)["memory"]
    source = f"{LLAMA3}, Table 4"
    return {
        "id": "llama3-405b", "title": "Llama 3 405B", "hardware": "h100", "gpus": 8192,
        "published_layout": Published("TP8 × CP1 × PP16 × DP64", source),
        "planner": _planner(shape, 8192, 2048, "h100", "dp64-tp8-pp16 z1", cps=(1,)),
        "predicted": {"8k": p8k, "16k": p16k, "8k_full": full, "8k_v2": i8k, "16k_v2": i16k,
                      "dry_run": {"model_states_gb": sum(dry["memory_peak"][k] for k in estimate) / GB,
                                  "estimate_gb": sum(estimate.values()) / GB,
                                  "activations_gb": dry["memory_peak"]["activations"] / GB,
                                  "equal": all(dry["memory_peak"][k] == v for k, v in estimate.items())}},
        "rows": [
            _row("mfu", p8k["mfu"] * 100, Published(43, source), "%"),
            _row("mfu_16k", p16k["mfu"] * 100, Published(41, source), "%", explained="gap-llama-bubble"),
            _row("mfu_v2", i8k["mfu"] * 100, Published(43, source), "%"),
            _row("mfu_16k_v2", i16k["mfu"] * 100, Published(41, source), "%"),
            _row("memory", p8k["memory_gb"], Published(80, f"{LLAMA3}, §3.3.1 and §3.3.2 (80GB HBM3; 8K sequences "
                                                           "without activation checkpointing)"), "GB",
                 explained="gap-llama-memory", at_most=True),
        ],
    }


def deepseek_v3() -> dict:
    source = f"{DEEPSEEK}, §3.2"
    row = _published_row(PerfConfig(**DEEPSEEK_PROXY, ep=64, tp=1, pp=16, dp=128, micro_batch=1, global_batch=15360,
                                    zero_stage=1, recompute="none"), H800)
    gpu_hours = 1e12 / (row["tokens_per_s"] / 2048) / 3600           # H800 GPU-hours per trillion tokens
    hidden = gpu_hours * (row["total_s"] - row["ep_comm_s"]) / row["total_s"]   # DualPipe hides the all-to-alls
    return {
        "id": "deepseek-v3", "title": "DeepSeek-V3", "hardware": "h800", "gpus": 2048,
        "published_layout": Published("PP16 × EP64 × DP (ZeRO-1), TP1", source),
        "planner": _planner(DEEPSEEK_PROXY, 2048, 15360, H800, "dp128-ep64-tp1-pp16 z1"),
        "predicted": {"published": row, "gpu_hours_per_t": gpu_hours, "gpu_hours_hidden_a2a": hidden,
                      "model_states_gb": deepseek_model_states() / GB},
        "rows": [
            _row("gpu_hours", gpu_hours / 1e3, Published(180, f"{DEEPSEEK}, §1 and Table 1 (180K H800 GPU hours "
                                                               "per trillion tokens)"), "K"),
            _row("gpu_hours_hidden", hidden / 1e3, Published(180, f"{DEEPSEEK}, §1 and Table 1"), "K"),
            _row("model_states", deepseek_model_states() / GB,
                 Published("—", f"{DEEPSEEK}: no bytes per GPU are printed; the run fits the H800's 80 GB"), "GB"),
        ],
    }


def opt_175b() -> dict:
    source = f"{OPT}, §2.4"
    # 992 sequences: 8 per dp rank, 2.03M tokens; Table 1 says "2M" (1024 sequences do not split over dp = 124)
    planner = _planner(OPT_SHAPE, 992, 992, "a100-80gb", "dp124-tp8-pp1 z3", sp=(False,))
    grid = planner["grid_best"]                                      # e.g. 'dp124-tp8-pp1 z3 full b8'
    recompute, b = grid.split()[2], int(grid.split()[3][1:])
    row = _published_row(PerfConfig(**OPT_SHAPE, tp=8, dp=124, micro_batch=b, global_batch=992, zero_stage=3,
                                    recompute=recompute), "a100-80gb")
    return {
        "id": "opt-175b", "title": "OPT-175B", "hardware": "a100-80gb", "gpus": 992,
        "published_layout": Published("FSDP × TP", f"{source}: FSDP with Megatron-LM tensor "
                                      "parallelism; the paper prints no TP degree"),
        "planner": planner,
        "predicted": {"published": row},
        "rows": [_row("tflops_hw", row["tflops_per_gpu"], Published(147, f"{source} (\"up to 147 TFLOP/s per GPU\")"),
                      "TFLOP/s"),
                 _row("tflops_model", row["model_tflops_per_gpu"], Published(147, f"{source}"), "TFLOP/s")],
    }


def _row(quantity: str, predicted: float, published: Published, unit: str, explained: str | None = None,
         at_most: bool = False) -> dict:
    """One line of the table: error = predicted / published - 1; within the band when |error| <= `BAND`, or, for a
    bound (``at_most``: the GPU's memory), when the prediction stays under it. ``explained``: the heading id of the
    chapter's section that explains a row outside the band."""
    number = isinstance(published.value, (int, float))
    error = predicted / published.value - 1 if number else None
    within = None if not number else (predicted <= published.value if at_most else abs(error) <= BAND)
    return {"quantity": quantity, "unit": unit, "predicted": predicted, "published": published.value,
            "at_most": at_most, "source": published.source, "unverified": published.unverified, "error": error,
            "within_band": within, "explained": explained}


RUNS = (llama3, deepseek_v3, opt_175b)


def _plain(value):
    """JSON-ready, floats rounded to 6 significant digits (the page shows 3; the test compares these)."""
    if isinstance(value, Published):
        return {"value": _plain(value.value), "source": value.source, "unverified": value.unverified}
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, float) and math.isfinite(value) and value != 0:
        return round(value, 5 - int(math.floor(math.log10(abs(value)))))
    return value


def predictions() -> dict:
    """Every run's predictions, as the committed JSON holds them."""
    runs = [_plain(run()) for run in RUNS]
    compared = [row for run in runs for row in run["rows"] if row["error"] is not None]
    return {"schema": 1, "band": BAND, "made_by": "python -m minimega.figures.capstone", "runs": runs,
            "summary": {"compared": len(compared), "within": sum(bool(row["within_band"]) for row in compared)}}


def write(path: Path = DATA) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(predictions(), indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return path


# ----------------------------------------------------------------------------------------------
# The page's tables (tools/learner_hook.py: {{ capstone_table("predictions") }}, {{ capstone_table("layouts") }})

WORDS = {
    "en": {"run": "run", "quantity": "quantity", "predicted": "predicted", "published": "published",
           "error": "error", "source": "source", "why": "why", "gpus": "GPUs", "layout": "published layout",
           "top": "planner's first pick", "grid": "best on the published grid", "rank": "its rank",
           "of": "of", "fit": "that fit", "none": "does not fit"},
    "nl": {"run": "run", "quantity": "grootheid", "predicted": "voorspeld", "published": "gepubliceerd",
           "error": "fout", "source": "bron", "why": "waarom", "gpus": "GPU's", "layout": "gepubliceerde layout",
           "top": "eerste keus van de planner", "grid": "beste op het gepubliceerde rooster", "rank": "zijn plaats",
           "of": "van", "fit": "die passen", "none": "past niet"},
}
QUANTITIES = {
    "mfu": ("MFU, 8,192 GPUs, 1F1B (%)", "MFU, 8.192 GPU's, 1F1B (%)"),
    "mfu_16k": ("MFU, 16,384 GPUs, 1F1B (%)", "MFU, 16.384 GPU's, 1F1B (%)"),
    "mfu_v2": ("MFU, 8,192 GPUs, interleaved v = 2, 128-layer stand-in (%)",
               "MFU, 8.192 GPU's, interleaved v = 2, stand-in met 128 lagen (%)"),
    "mfu_16k_v2": ("MFU, 16,384 GPUs, interleaved v = 2, 128-layer stand-in (%)",
                   "MFU, 16.384 GPU's, interleaved v = 2, stand-in met 128 lagen (%)"),
    "memory": ("memory per GPU, published layout (GB)", "geheugen per GPU, gepubliceerde layout (GB)"),
    "gpu_hours": ("H800 GPU-hours per trillion tokens (thousands)", "H800-GPU-uren per biljoen tokens (duizenden)"),
    "gpu_hours_hidden": ("the same, all-to-alls hidden as DualPipe does (thousands)",
                         "hetzelfde, all-to-alls verborgen zoals DualPipe doet (duizenden)"),
    "model_states": ("model states per GPU, real parameter counts (GB)",
                     "modeltoestanden per GPU, echte aantallen parameters (GB)"),
    "tflops_hw": ("TFLOP/s per GPU, hardware FLOPs (recomputation counted)",
                  "TFLOP/s per GPU, hardware-FLOPs (herberekening meegeteld)"),
    "tflops_model": ("TFLOP/s per GPU, model FLOPs", "TFLOP/s per GPU, model-FLOPs"),
}


def _number(value: float, lang: str, fmt: str = ",.1f") -> str:
    text = format(value, fmt)
    return text.replace(",", "\u2009").replace(".", ",") if lang == "nl" else text.replace(",", "\u2009")


def _cite(source: str) -> str:
    """The short citation the table shows: from the arXiv id to the first parenthesis or colon after it."""
    short = source[source.index("arXiv:"):] if "arXiv:" in source else source
    return short.split(" (")[0].split(": ")[0]


def value(run: str, path: str, fmt: str = ",.1f", lang: str = "en", data: dict | None = None) -> str:
    """One number of the committed JSON, formatted for the page: ``value("llama3-405b", "predicted.8k.mfu", ".1%")``;
    run ``"summary"`` reads the counts of rows compared and within the band; a string is returned as it is."""
    data = data or json.loads(DATA.read_text(encoding="utf-8"))
    node = data["summary"] if run == "summary" else next(r for r in data["runs"] if r["id"] == run)
    for key in path.split("."):
        node = node[int(key)] if isinstance(node, list) else node[key]
    if isinstance(node, str):
        return node
    if fmt.endswith("%"):
        return _number(100 * node, lang, fmt[:-1] + "f") + "%"
    return _number(node, lang, fmt)


def table_markdown(kind: str, lang: str = "en", data: dict | None = None) -> str:
    """A markdown table from the committed JSON: ``predictions`` (every row with its error and source) or
    ``layouts`` (the published grid, the planner's first pick and the grid's rank)."""
    data = data or json.loads(DATA.read_text(encoding="utf-8"))
    w, col = WORDS[lang], 0 if lang == "en" else 1
    if kind == "layouts":
        out = [f"| {w['run']} | {w['gpus']} | {w['layout']} | {w['top']} | {w['grid']} | {w['rank']} |",
               "| --- | ---: | --- | --- | --- | ---: |"]
        for run in data["runs"]:
            p = run["planner"]
            rank = f"{p['grid_rank']} {w['of']} {p['fit']} {w['fit']}" if p["grid_rank"] else w["none"]
            out.append(f"| {run['title']} | {_number(run['gpus'], lang, ',d')} | {run['published_layout']['value']} "
                       f"| `{p['top']}` | `{p['grid_best']}` | {rank} |")
        return "\n".join(out)
    if kind != "predictions":
        raise ValueError(f"capstone table {kind!r}: expected 'predictions' or 'layouts'")
    out = [f"| {w['run']} | {w['quantity']} | {w['predicted']} | {w['published']} | {w['error']} | {w['source']} |",
           "| --- | --- | ---: | ---: | ---: | --- |"]
    for run in data["runs"]:
        for row in run["rows"]:
            published = row["published"]
            if isinstance(published, (int, float)):
                published = ("≤ " if row["at_most"] else "") + _number(published, lang, ",.0f")
            error = "—" if row["error"] is None else _number(100 * row["error"], lang, "+.1f") + "%"
            if row["explained"]:
                error += f" ([{w['why']}](#{row['explained']}))"
            out.append(f"| {run['title']} | {QUANTITIES[row['quantity']][col]} | {_number(row['predicted'], lang)} "
                       f"| {published} | {error} | {_cite(row['source'])} |")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="compare with the committed file instead of writing it")
    args = ap.parse_args(argv)
    if args.check:
        same = json.loads(DATA.read_text(encoding="utf-8")) == predictions()
        print("capstone.json is up to date" if same else "capstone.json differs: run python -m minimega.figures.capstone")
        return 0 if same else 1
    print(write())
    return 0


if __name__ == "__main__":
    sys.exit(main())
