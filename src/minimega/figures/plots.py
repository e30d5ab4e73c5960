"""Plotly figure builders shared by the course site and the labs.

Every figure here is drawn from `minimega.analysis` alone: the numbers on the site are the numbers
the package computes. `figure_html` writes one standalone page per figure (the site embeds it in an
iframe) that loads a self-hosted plotly.js, follows the parent page's light/dark scheme and fits its
width (figure_page.js). Memory categories wear `minimega.figures.palette`'s colours in every figure.

Every builder takes ``lang`` ("en" or "nl"): the same figure, numbers unchanged, its words through
`minimega.figures.words` (Dutch from a table keyed on the English text) and its numbers with the
language's decimal mark.
"""
from __future__ import annotations

import plotly.graph_objects as go

from minimega import estimate as est
from minimega.figures.words import num, words
from minimega.figures.palette import COLOURS, REFERENCE
from minimega.figures.palette import label as category_label

from minimega.figures.recorded import (activations_measured, checkpoint_read_plan, comm_wire, ddp_overlap,
                                         memory_measured, pipeline_recorded, pipeline_schedule,  # noqa: F401
                                         tp_comm_per_layer,
                                         zero_memory_measured, zero_prefetch)
from minimega.figures.style import PALETTE, STAGE_NAMES, figure_html, house_layout  # noqa: F401  (re-exported for the site and the labs)

def zero_memory_vs_dp(n_params: float = 7.5e9, dps=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024),
                      lang: str = "en") -> go.Figure:
    """Model-state GB per rank against N_d for each ZeRO stage (ZeRO paper Table 1 as curves)."""
    t = words(lang)
    fig = go.Figure()
    for st in est.STAGES:
        fig.add_scatter(x=list(dps), y=[est.model_state_bytes(n_params, d, st) / est.GB for d in dps],
                        mode="lines+markers", name=STAGE_NAMES[st],
                        hovertemplate="N_d=%{x}<br>%{y:.3g} GB<extra>" + STAGE_NAMES[st] + "</extra>")
    house_layout(fig, t("Model states per GPU, Ψ = {psi}B, mixed-precision Adam (K = 12)").format(psi=num(n_params / 1e9, "g", lang)),
            t("data-parallel degree N_d (log scale)"), t("GB per GPU (log scale)"), lang)
    fig.update_xaxes(type="log", tickvals=list(dps)[::2])
    fig.update_yaxes(type="log", dtick=1)           # decades only: no small 2…9 labels to crowd each other
    return fig


def zero_breakdown(n_params: float = 7.5e9, dp: int = 64, lang: str = "en") -> go.Figure:
    """Stacked params / grads / optimizer GB per stage: the ZeRO paper's Figure 1 as bars."""
    t = words(lang)
    cats = [("params", category_label("params", "2 B/param", lang)), ("grads", category_label("grads", "2 B/param", lang)),
            ("optimizer", category_label("optimizer", "K = 12 B/param", lang))]
    xs = [STAGE_NAMES[s] for s in est.STAGES]
    parts = [est.model_state_breakdown(n_params, dp, s) for s in est.STAGES]
    fig = go.Figure()
    for key, name in cats:
        fig.add_bar(x=xs, y=[p[key] / est.GB for p in parts], name=name, marker_color=COLOURS[key],
                    hovertemplate="%{y:.3g} GB<extra>" + name + "</extra>")
    totals = [sum(p.values()) / est.GB for p in parts]
    fig.add_scatter(x=xs, y=totals, mode="text", text=[f"{num(v, '.3g', lang)} GB" for v in totals], textposition="top center",
                    showlegend=False, hoverinfo="skip")
    house_layout(fig, t("Where the bytes go: Ψ = {psi}B on N_d = {dp} GPUs").format(psi=num(n_params / 1e9, "g", lang), dp=dp),
            "", "GB per GPU", lang, barmode="stack")
    fig.update_yaxes(range=[0, max(totals) * 1.15])
    return fig


def bytes_per_param(dp: int = 64, lang: str = "en") -> go.Figure:
    """Bytes per parameter per GPU for each stage and precision (mixed K=12, fp32 K=8)."""
    t = words(lang)
    fig = go.Figure()
    for prec, label in (("mixed", t("mixed precision (2 + 2 + 12)")), ("fp32", "fp32 (4 + 4 + 8)")):
        fig.add_bar(x=[STAGE_NAMES[s] for s in est.STAGES],
                    y=[est.model_state_bytes(1.0, dp, s, prec) for s in est.STAGES], name=label,
                    texttemplate="%{y:.3~g}", textposition="outside", textfont_size=11,   # "16", not "16.0"
                    hovertemplate="%{y:.4g} B/param<extra>" + label + "</extra>")
    house_layout(fig, t("Bytes per parameter per GPU at N_d = {dp}").format(dp=dp), "", t("bytes per parameter"), lang,
            barmode="group")
    return fig


def comm_vs_dp(n_params: float = 7.5e9, bytes_per_elem: int = 2, dps=(2, 4, 8, 16, 32, 64, 128),
               lang: str = "en") -> go.Figure:
    """Bytes each rank sends per step (ring model) for each stage against N_d."""
    t = words(lang)
    fig = go.Figure()
    for st, dash in zip(est.STAGES, ("solid", "dot", "dash", "solid")):
        fig.add_scatter(x=list(dps), y=[est.comm_bytes_per_step(n_params, d, st, bytes_per_elem) / est.GB for d in dps],
                        mode="lines+markers", name=STAGE_NAMES[st], line=dict(dash=dash),
                        hovertemplate="N_d=%{x}<br>%{y:.4g} GB<extra>" + STAGE_NAMES[st] + "</extra>")
    house_layout(fig, t("Sent per rank per step, Ψ = {psi}B in {bits}-bit (ring model)").format(
                psi=num(n_params / 1e9, "g", lang), bits=8 * bytes_per_elem),
            t("data-parallel degree N_d (log scale)"), t("GB sent per rank per step"), lang)
    fig.update_xaxes(type="log", tickvals=list(dps)[::2])
    return fig


def bubble_vs_microbatches(ms=tuple(range(1, 33)), ps=(2, 4, 8), lang: str = "en") -> go.Figure:
    """Pipeline bubble as a share of step time against micro-batches m."""
    t = words(lang)
    fig = go.Figure()
    for p in ps:
        fig.add_scatter(x=list(ms), y=[100 * est.bubble_fraction(p, m, "1f1b") for m in ms], mode="lines",
                        name=f"GPipe / 1F1B, p = {p}",
                        hovertemplate="m=%{x}<br>%{y:.1f}" + t("% idle") + "<extra>p=" + str(p) + "</extra>")
    for p in ps[1:2]:
        fig.add_scatter(x=list(ms), y=[100 * est.bubble_fraction(p, m, "interleaved", 2) for m in ms],
                        mode="lines", line=dict(dash="dash"), name=t("interleaved 1F1B, p = {p}, v = 2").format(p=p),
                        hovertemplate="m=%{x}<br>%{y:.1f}" + t("% idle") + "<extra>" + t("interleaved") + "</extra>")
    house_layout(fig, t("Pipeline bubble: (p−1)/(v·m + p−1) of each step is idle"), t("micro-batches per step m"),
            t("idle share of the step (%)"), lang)
    fig.update_yaxes(range=[0, 100])
    return fig


ACT_CASES = (("none (t = 1)", dict(tp=1)), ("TP t = 8", dict(tp=8)), ("TP + SP", dict(tp=8, sp=True)),
             ("TP + selective", dict(tp=8, recompute="selective")),
             ("TP + SP + selective", dict(tp=8, sp=True, recompute="selective")),
             ("full recompute", dict(tp=8, recompute="full")))


def activations_gpt3(lang: str = "en") -> go.Figure:
    """Per-layer activation MB for GPT-3 175B (s=2048, h=12288, a=96, b=1): Korthikanti Table 2."""
    t = words(lang)
    xs = [t(name) for name, _ in ACT_CASES]
    ys = [est.activation_bytes_per_layer(2048, 1, 12288, 96, **kw) / 1e6 for _, kw in ACT_CASES]
    fig = go.Figure(go.Bar(x=xs, y=ys, texttemplate="%{y:.1f}", textposition="outside", marker_color=COLOURS["activations"],
                           hovertemplate="%{y:.1f}" + t(" MB per layer") + "<extra></extra>"))
    fig.update_traces(name=category_label("activations", lang=lang))
    house_layout(fig, t("Activations one GPT-3 layer keeps for backward (s = 2048, b = 1)"), "",
            t("MB per layer per GPU (log scale)"), lang)
    fig.update_yaxes(type="log", dtick=1)
    return fig


def activations_vs_seq(hidden: int = 4096, heads: int = 32, layers: int = 36,
                       seqs=(512, 1024, 2048, 4096, 8192, 16384), lang: str = "en") -> go.Figure:
    """Whole-model activation GB against sequence length, with and without recomputation.

    Recomputed curves include the working set the backward rebuilds for one layer
    (`recompute_working_bytes`); the dashed curve is a fused attention kernel without recomputation.
    """
    t = words(lang)
    fig = go.Figure()
    # one category, four ways to keep it: the activations colour throughout, told apart by line and marker
    cases = (("no recomputation", "none", "unfused", "solid", "circle"),
             ("selective", "selective", "unfused", "dot", "square"),
             ("full recomputation", "full", "unfused", "dashdot", "diamond"),
             ("fused attention, no recomputation", "none", "fused", "dash", "x"))
    for case, rec, attn, dash, symbol in cases:
        case = t(case)
        name = category_label("activations", case, lang)
        ys = [(layers * est.activation_bytes_per_layer(s, 1, hidden, heads, recompute=rec, attention=attn)
               + est.recompute_working_bytes(s, 1, hidden, heads, recompute=rec, attention=attn)) / est.GB
              for s in seqs]
        fig.add_scatter(x=list(seqs), y=ys, mode="lines+markers", name=name,
                        line=dict(color=COLOURS["activations"], dash=dash), marker=dict(symbol=symbol, size=8),
                        hovertemplate="s=%{x}<br>%{y:.3g} GB<extra>" + case + "</extra>")
    house_layout(fig, t("Activations of {layers} layers, h = {hidden}, a = {heads}, b = 1, one GPU (with the recomputed layer)")
            .format(layers=layers, hidden=hidden, heads=heads),
            t("sequence length s (tokens, log scale)"), t("GB (log scale)"), lang)
    fig.update_xaxes(type="log", tickvals=list(seqs), ticktext=[f"{s // 1024}k" if s >= 1024 else str(s) for s in seqs])
    fig.update_yaxes(type="log", dtick=1)
    return fig


def tp_scaling(seq: int = 2048, hidden: int = 12288, heads: int = 96, ts=(1, 2, 4, 8, 16),
               lang: str = "en") -> go.Figure:
    """Per-layer activation MB with TP and TP+SP, and TP bytes sent per layer, against t."""
    t = words(lang)
    fig = go.Figure()
    fig.add_scatter(x=list(ts), y=[est.activation_bytes_per_layer(seq, 1, hidden, heads, tp=t) / 1e6 for t in ts],
                    name=category_label("activations", "TP", lang), mode="lines+markers",
                    line=dict(color=COLOURS["activations"]))
    fig.add_scatter(x=list(ts), y=[est.activation_bytes_per_layer(seq, 1, hidden, heads, tp=t, sp=True) / 1e6 for t in ts],
                    name=category_label("activations", "TP + SP", lang), mode="lines+markers",
                    line=dict(color=COLOURS["activations"], dash="dash"), marker=dict(symbol="square"))
    fig.add_scatter(x=list(ts), y=[2 * est.tp_comm_elements_per_layer(seq, 1, hidden, t) / 1e6 for t in ts],
                    name=t("sent per layer, fwd + bwd (16-bit)"), mode="lines+markers", line=dict(color=REFERENCE, dash="dot"))
    house_layout(fig, t("Tensor parallelism on a GPT-3 layer (s = 2048, b = 1)"), t("tensor-parallel degree t"),
            t("MB per GPU per layer"), lang)
    fig.update_xaxes(type="log", tickvals=list(ts))
    return fig


def presets_memory(lang: str = "en") -> go.Figure:
    """GB per GPU by category for the calculator's presets (first pipeline stage)."""
    names = [n for n in est.PRESETS if n not in est.LLAMA_PRESETS]   # with a layout; the Llama shapes have none
    outs = [est.memory_per_gpu(est.MemoryConfig(**est.PRESETS[n])) for n in names]
    fig = go.Figure()
    for key in ("params", "grads", "optimizer", "gathered", "activations", "recompute"):
        fig.add_bar(x=names, y=[o[key] / est.GB for o in outs], name=category_label(key, lang=lang),
                    marker_color=COLOURS[key], hovertemplate="%{y:.3g} GB<extra>" + category_label(key, lang=lang) + "</extra>")
    house_layout(fig, words(lang)("Memory per GPU for the calculator presets"), "", "GB per GPU", lang, barmode="stack")
    return fig


def offload_split(n_params: float = 7.5e9, dp: int = 1, lang: str = "en") -> go.Figure:
    """GPU, CPU and NVMe GB of model states without offload, with optimizer offload (to CPU memory, then to
    NVMe: `disk.nvme_placement`), with parameter offload."""
    t = words(lang)
    rows = []
    for name, stage, off in (("stage 2", 2, "none"), ("stage 2, optimizer to CPU", 2, "optimizer"),
                             ("stage 2, optimizer to NVMe", 2, "nvme"),
                             ("stage 3, all to CPU", 3, "optimizer+params")):
        parts = est.nvme_placement(n_params, dp, stage) if off == "nvme" else \
            est.model_state_placement(n_params, dp, stage, "mixed", off)
        cpu, nvme = parts.pop("cpu"), parts.pop("nvme", 0.0)
        rows.append((name if off == "none" else t(name), sum(parts.values()), cpu, nvme))
    fig = go.Figure()
    for i, (name, colour) in enumerate(((t("on the GPU"), REFERENCE), (category_label("cpu", lang=lang), COLOURS["cpu"]),
                                        (category_label("nvme", lang=lang), COLOURS["nvme"])), start=1):
        fig.add_bar(x=[r[0] for r in rows], y=[r[i] / est.GB for r in rows], name=name, marker_color=colour,
                    text=[num(r[i] / est.GB, ".3g", lang) if r[i] else "" for r in rows],   # no label on a 0 bar
                    texttemplate="%{text}", textposition="outside")
    where = "Model states of Ψ = {psi}B on {dp} GPUs: where they live" if dp > 1 else \
        "Model states of Ψ = {psi}B on {dp} GPU: where they live"
    house_layout(fig, t(where).format(psi=num(n_params / 1e9, "g", lang), dp=dp), "", "GB", lang, barmode="group")
    return fig


FIGURES = {
    "zero-memory-vs-dp": zero_memory_vs_dp,
    "zero-breakdown": zero_breakdown,
    "bytes-per-param": bytes_per_param,
    "comm-vs-dp": comm_vs_dp,
    "bubble-vs-microbatches": bubble_vs_microbatches,
    "activations-gpt3": activations_gpt3,
    "activations-vs-seq": activations_vs_seq,
    "tp-scaling": tp_scaling,
    "presets-memory": presets_memory,
    "offload-split": offload_split,
    "zero-memory-measured": zero_memory_measured,
    "zero-prefetch": zero_prefetch,
    "pipeline-recorded": pipeline_recorded,
    "ddp-overlap": ddp_overlap,
    "memory-measured": memory_measured,
    "tp-comm-per-layer": tp_comm_per_layer,
    "activations-measured": activations_measured,
    "comm-wire": comm_wire,
    "checkpoint-read-plan": checkpoint_read_plan,
}
