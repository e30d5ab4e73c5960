"""Plotly figure builders shared by the course site and the labs.

Every figure here is drawn from `minimega.estimate` alone: the numbers on the site are the numbers
the package computes. `figure_html` writes one standalone page per figure (the site embeds it in an
iframe) that loads a self-hosted plotly.js, follows the parent page's light/dark scheme and fits its
width (figure_page.js). Memory categories wear `minimega.palette`'s colours in every figure.

Every builder takes ``lang`` ("en" or "nl"): the same figure, numbers unchanged, its words through
`minimega.figure_words` (Dutch from a table keyed on the English text) and its numbers with the
language's decimal mark.
"""
from __future__ import annotations

import html
import math
from pathlib import Path

import plotly.graph_objects as go

from minimega import estimate as est
from minimega.figure_words import SEPARATORS, num, words
from minimega.palette import COLOURS, REFERENCE, SERIES
from minimega.palette import label as category_label

STAGE_NAMES = {0: "DDP (stage 0)", 1: "ZeRO-1 (P_os)", 2: "ZeRO-2 (P_os+g)", 3: "ZeRO-3 (P_os+g+p)"}
PALETTE = SERIES


def _layout(fig: go.Figure, title: str, x: str, y: str, lang: str = "en", **kw) -> go.Figure:
    """The house layout, legible from a 390 px phone to a wide screen.

    The title and every axis push the margins out as far as they need (automargin), the legend sits
    below everything else, and nothing depends on a fixed pixel margin. On the site the figure's page
    rewraps the title and the category labels to the width it has (figure_page.js); `title` is kept
    whole in ``layout.meta`` for that. `lang` sets the decimal mark of plotly's own number formatting.
    """
    fig.update_layout(title=dict(text=title, x=0, xref="container", xanchor="left", y=1, yref="paper",
                                 yanchor="bottom", automargin=True, pad=dict(l=10, b=12), font=dict(size=15)),
                      meta=dict(title=title), margin=dict(l=10, r=10, t=10, b=10),
                      legend=dict(orientation="h", x=0, xanchor="left", xref="container", y=0, yanchor="bottom",
                                  yref="container"),
                      font=dict(family="system-ui, sans-serif", size=13), colorway=PALETTE,
                      paper_bgcolor="rgba(0,0,0,0)", plot_bgcolor="rgba(0,0,0,0)", **kw)
    if lang != "en":
        fig.update_layout(separators=SEPARATORS[lang])
    if x:
        fig.update_layout(xaxis_title_text=x)
    if y:
        fig.update_layout(yaxis_title_text=y)
    fig.update_xaxes(automargin=True, title_font_size=14)
    fig.update_yaxes(automargin=True, title_font_size=14)
    return fig


def zero_memory_vs_dp(n_params: float = 7.5e9, dps=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024),
                      lang: str = "en") -> go.Figure:
    """Model-state GB per rank against N_d for each ZeRO stage (ZeRO paper Table 1 as curves)."""
    t = words(lang)
    fig = go.Figure()
    for st in est.STAGES:
        fig.add_scatter(x=list(dps), y=[est.model_state_bytes(n_params, d, st) / est.GB for d in dps],
                        mode="lines+markers", name=STAGE_NAMES[st],
                        hovertemplate="N_d=%{x}<br>%{y:.3g} GB<extra>" + STAGE_NAMES[st] + "</extra>")
    _layout(fig, t("Model states per GPU, Ψ = {psi}B, mixed-precision Adam (K = 12)").format(psi=num(n_params / 1e9, "g", lang)),
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
    _layout(fig, t("Where the bytes go: Ψ = {psi}B on N_d = {dp} GPUs").format(psi=num(n_params / 1e9, "g", lang), dp=dp),
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
    _layout(fig, t("Bytes per parameter per GPU at N_d = {dp}").format(dp=dp), "", t("bytes per parameter"), lang,
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
    _layout(fig, t("Sent per rank per step, Ψ = {psi}B in {bits}-bit (ring model)").format(
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
    _layout(fig, t("Pipeline bubble: (p−1)/(v·m + p−1) of each step is idle"), t("micro-batches per step m"),
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
    _layout(fig, t("Activations one GPT-3 layer keeps for backward (s = 2048, b = 1)"), "",
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
    _layout(fig, t("Activations of {layers} layers, h = {hidden}, a = {heads}, b = 1, one GPU (with the recomputed layer)")
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
    _layout(fig, t("Tensor parallelism on a GPT-3 layer (s = 2048, b = 1)"), t("tensor-parallel degree t"),
            t("MB per GPU per layer"), lang)
    fig.update_xaxes(type="log", tickvals=list(ts))
    return fig


def presets_memory(lang: str = "en") -> go.Figure:
    """GB per GPU by category for the calculator's presets (first pipeline stage)."""
    names = list(est.PRESETS)
    outs = [est.memory_per_gpu(est.MemoryConfig(**est.PRESETS[n])) for n in names]
    fig = go.Figure()
    for key in ("params", "grads", "optimizer", "gathered", "activations", "recompute"):
        fig.add_bar(x=names, y=[o[key] / est.GB for o in outs], name=category_label(key, lang=lang),
                    marker_color=COLOURS[key], hovertemplate="%{y:.3g} GB<extra>" + category_label(key, lang=lang) + "</extra>")
    _layout(fig, words(lang)("Memory per GPU for the calculator presets"), "", "GB per GPU", lang, barmode="stack")
    return fig


def offload_split(n_params: float = 7.5e9, dp: int = 1, lang: str = "en") -> go.Figure:
    """GPU vs CPU GB of model states without offload, with optimizer offload, with parameter offload."""
    t = words(lang)
    rows = []
    for name, stage, off in (("stage 2", 2, "none"), ("stage 2 + offload optimizer", 2, "optimizer"),
                             ("stage 3 + offload optimizer + params", 3, "optimizer+params")):
        parts = est.model_state_placement(n_params, dp, stage, "mixed", off)
        cpu = parts.pop("cpu")
        rows.append((name if off == "none" else t(name), sum(parts.values()), cpu))
    fig = go.Figure()
    fig.add_bar(x=[r[0] for r in rows], y=[r[1] / est.GB for r in rows], name=t("on the GPU"), marker_color=REFERENCE,
                texttemplate="%{y:.3g}", textposition="outside")
    fig.add_bar(x=[r[0] for r in rows], y=[r[2] / est.GB for r in rows], name=category_label("cpu", lang=lang),
                marker_color=COLOURS["cpu"], texttemplate="%{y:.3g}", textposition="outside")
    where = "Model states of Ψ = {psi}B on {dp} GPUs: where they live" if dp > 1 else \
        "Model states of Ψ = {psi}B on {dp} GPU: where they live"
    _layout(fig, t(where).format(psi=num(n_params / 1e9, "g", lang), dp=dp), "", "GB", lang, barmode="group")
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
}

# Runs inside the figure's page: theme, fitting to the width, and the frame's height (see the file).
PAGE_SCRIPT = Path(__file__).with_name("figure_page.js")


def figure_html(fig: go.Figure, div_id: str, plotly_src: str, title: str = "", lang: str = "en") -> str:
    """A standalone HTML page for one figure in `lang`: self-hosted plotly.js, deterministic div id, theme-aware."""
    page = fig.to_html(full_html=True, include_plotlyjs=plotly_src, div_id=div_id,
                       post_script=PAGE_SCRIPT.read_text(encoding="utf-8"),
                       config={"displaylogo": False, "responsive": True,
                               "modeBarButtonsToRemove": ["sendDataToCloud", "select2d", "lasso2d"]},
                       default_width="100%", default_height="100%")
    head = ('<meta name="viewport" content="width=device-width, initial-scale=1"><title>'
            + html.escape(title or div_id) + "</title><style>html,body{margin:0;height:100%;"
            "background:transparent;overflow:hidden}</style>")
    if not lang.isalpha():
        raise ValueError(f"figure page language {lang!r}: expected a language code such as 'nl'")
    return page.replace("<html>", f'<html lang="{lang}">', 1).replace("<head>", "<head>" + head, 1)


# ---- the pipeline schedule, from the ranks' recorded timelines ------------------------------------

_PIPELINE_COLOURS = {"forward": "#4C78A8", "backward": "#F58518", "send": "#54A24B", "recv": "#B279A2",
                     "send_recv": "#9D755D"}


def pipeline_schedule(timelines: list[list[dict]], step: int = 0, title: str | None = None) -> go.Figure:
    """Rank × wall-clock chart of one pipeline step: forward, backward and p2p intervals; gaps are idle.

    Args:
        timelines: one recorded timeline per pipeline rank, in pp-rank order (``Engine.report()["timeline"]``).
        step: which optimizer step to draw.
    """
    fig = go.Figure()
    origin = min(e["start"] for events in timelines for e in events if e.get("step") == step and "kind" in e)
    seen = set()
    for rank, events in enumerate(timelines):
        for e in events:
            if e.get("step") != step or e.get("kind") not in _PIPELINE_COLOURS:
                continue
            label = e["kind"] if "micro" not in e else f"{e['kind']} micro {e['micro']} chunk {e['chunk']}"
            fig.add_trace(go.Bar(
                x=[(e["end"] - e["start"]) * 1e3], base=[(e["start"] - origin) * 1e3], y=[f"rank {rank}"],
                orientation="h", marker_color=_PIPELINE_COLOURS[e["kind"]], name=e["kind"], legendgroup=e["kind"],
                showlegend=e["kind"] not in seen, hovertext=label,
                text=[f"{e['kind'][0].upper()}{e['micro']}" if "micro" in e else ""], textposition="inside"))
            seen.add(e["kind"])
    fig.update_layout(barmode="overlay", title=title or f"pipeline schedule, step {step} (gaps are idle)",
                      xaxis_title="time since the step started (ms)", yaxis_title="pipeline rank",
                      yaxis_autorange="reversed", template="plotly_white")
    return fig


# ----------------------------------------------------------------------------------------------
# Figures from recorded runs: `minimega record` writes the traces (course/data/*.json); each figure
# reads one and draws what the ranks measured, next to the formula that predicts it.

def _trace(name: str) -> dict:
    from minimega.record import load
    return load(name)


def ddp_overlap(step: int = -1, lang: str = "en") -> go.Figure:
    """One DDP step per rank: forward, backward, optimizer, and when each bucket's all-reduce was issued."""
    t = words(lang)
    tr = _trace("ddp-overlap")
    fig = go.Figure()
    phases = (("forward", "forward_start", "backward_start", PALETTE[0]),
              ("backward", "backward_start", "backward_end", PALETTE[1]),
              (t("optimizer step"), "backward_end", "optimizer_step_end", PALETTE[5]))
    rows = []
    for r in tr["ranks"]:
        st = r["steps"][step]
        compute, comm = t("rank {rank} compute").format(rank=r["rank"]), t("rank {rank} all-reduce").format(rank=r["rank"])
        rows += [compute, comm]
        for label, a, b, color in phases:
            fig.add_bar(y=[compute], x=[st[b] - st[a]], base=[st[a]], orientation="h", name=label,
                        marker_color=color, legendgroup=label, showlegend=r["rank"] == 0,
                        hovertemplate=label + t(": %{base:.1f} to %{x:.1f} ms long") + f"<extra>rank {r['rank']}</extra>")
        buckets = st["buckets"]
        fig.add_bar(y=[comm] * len(buckets), x=[b["waited"] - b["issued"] for b in buckets],
                    base=[b["issued"] for b in buckets], orientation="h", name=t("bucket all-reduce, issued → waited on"),
                    marker_color=PALETTE[2], opacity=0.35, legendgroup="inflight", showlegend=r["rank"] == 0,
                    hoverinfo="skip")
        fig.add_scatter(y=[comm] * len(buckets), x=[b["issued"] for b in buckets], mode="markers",
                        marker=dict(symbol="diamond", size=9, color=PALETTE[3]), name=t("bucket issued"),
                        legendgroup="issued", showlegend=r["rank"] == 0,
                        customdata=[[b["index"], b["bytes"] / 1e3] for b in buckets],
                        hovertemplate=t("bucket %{customdata[0]} (%{customdata[1]:.0f} kB) issued at %{x:.1f} ms")
                                      + f"<extra>rank {r['rank']}</extra>")
    src = tr["source"]
    _layout(fig, t("DDP on {world} ranks: {buckets} buckets start their all-reduce during the backward (step {step}, recorded)")
            .format(world=src["world_size"], buckets=len(tr["buckets"]), step=tr["ranks"][0]["steps"][step]["step"]),
            t("time from the start of the step's forward (ms)"), "", lang, barmode="overlay")
    fig.update_yaxes(categoryorder="array", categoryarray=rows[::-1])
    return fig


def measured_states(lang: str = "en") -> tuple[tuple[str, str, str], ...]:
    """Recorded key, palette category, legend name: the model states a recorded run measures (fp32 AdamW)."""
    return (("params", "params", category_label("params", "fp32, 4 B", lang)),
            ("grads", "grads", category_label("grads", "fp32, 4 B", lang)),
            ("optimizer_states", "optimizer",
             category_label("optimizer", words(lang)("Adam momentum + variance, 8 B"), lang)))


def memory_measured(lang: str = "en") -> go.Figure:
    """Bytes each rank holds by category after a backward, measured, against 16 bytes per parameter."""
    t = words(lang)
    tr = _trace("memory")
    cats = measured_states(lang)
    xs, parts = [], []
    for lay in tr["layouts"]:
        for r in lay["ranks"]:
            xs.append(f"{lay['layout']} rank {r['rank']}")
            parts.append(r["after_backward"])
    fig = go.Figure()
    for key, cat, name in cats:
        fig.add_bar(x=xs, y=[p[key] / 1e6 for p in parts], name=name, marker_color=COLOURS[cat],
                    hovertemplate="%{y:.3f} MB<extra>" + name + "</extra>")
    n = tr["n_params"]
    ddp = est.model_state_bytes(n, 1, 0, "fp32") / 1e6
    fig.add_scatter(x=[x for x in xs if x.startswith("dp")], y=[ddp] * sum(x.startswith("dp") for x in xs),
                    mode="markers", marker=dict(symbol="line-ew-open", size=40, color=REFERENCE, line=dict(width=3)),
                    name=t("estimate: 16 B × Ψ, Ψ = {n}").format(n=num(n, ",", lang)),
                    hovertemplate="%{y:.3f} MB<extra>" + t("estimate") + "</extra>")
    _layout(fig, t("Model states per rank, measured after a backward (tiny GPT, fp32 AdamW)"), "",
            "MB per rank (1 MB = 10⁶ B)", lang, barmode="stack")
    return fig


def _region(name: str, t) -> str:
    """A recorded TP region's name in the figure's language ("block 2", "replicated grads"; the rest are terms)."""
    if name.startswith("block "):
        return t("block {i}").format(i=name.removeprefix("block "))
    return t(name) if name == "replicated grads" else name


def tp_comm_per_layer(lang: str = "en") -> go.Figure:
    """Bytes rank 0 sends per step in each layer under TP and TP + SP, with 8bsh(t−1)/t per block."""
    t = words(lang)
    tr = _trace("tp-comm")
    sh = tr["shape"]
    fig = go.Figure()
    ops = ("all_reduce", "all_gather", "reduce_scatter")
    cols = []
    for lay in tr["layouts"]:
        regions = list(dict.fromkeys(r["region"] for r in lay["ranks"][0]["per_step"]))
        cols.append((lay, regions))
    for op in ops:
        xs0, xs1, ys = [], [], []
        for lay, regions in cols:
            rows = lay["ranks"][0]["per_step"]
            for reg in regions:
                xs0.append("TP + SP" if lay["sequence_parallel"] else "TP")
                xs1.append(_region(reg, t))
                ys.append(sum(r["sent_bytes"] for r in rows if r["region"] == reg and r["op"] == op) / 1e3)
        if any(ys):
            fig.add_bar(x=[xs0, xs1], y=ys, name=op.replace("_", "-"),
                        hovertemplate="%{y:.1f} kB<extra>" + op.replace("_", "-") + "</extra>")
    per_block = est.tp_comm_elements_per_layer(sh["s"], sh["b"], sh["h"], tr["layouts"][0]["tp"]) * 4 / 1e3
    bx0, bx1 = [], []
    for lay, regions in cols:
        for reg in regions:
            if reg.startswith("block"):
                bx0.append("TP + SP" if lay["sequence_parallel"] else "TP")
                bx1.append(_region(reg, t))
    fig.add_scatter(x=[bx0, bx1], y=[per_block] * len(bx0), mode="markers",
                    marker=dict(symbol="line-ew-open", size=26, line=dict(width=3), color=PALETTE[4]),
                    name=t("8bsh(t−1)/t × 4 B per block (Narayanan et al.)"),
                    hovertemplate="%{y:.1f} kB<extra>" + t("formula") + "</extra>")
    _layout(fig, t("Bytes each rank sends per step, by layer: tiny GPT, t = {t}, b = {b}, s = {s}, h = {h} (recorded)")
            .format(t=tr["layouts"][0]["tp"], b=sh["b"], s=sh["s"], h=sh["h"]), "", t("kB sent per rank per step"),
            lang, barmode="stack")
    fig.update_xaxes(tickangle=-90)        # 14 bars: upright labels never run into their neighbours
    return fig


def activations_measured(lang: str = "en") -> go.Figure:
    """Bytes one block keeps for backward, measured with saved_tensors_hooks, against the formula."""
    t = words(lang)
    tr = _trace("activations")
    rows = [r for r in tr["rows"] if r["rank"] == 0]
    case = lambda r: "t = 1" if r["tp"] == 1 else (f"t = {r['tp']} + SP" if r["sp"] else f"t = {r['tp']}")
    x = [[case(r) for r in rows], [t(r["mode"]) for r in rows]]
    fig = go.Figure()
    fig.add_bar(x=x, y=[r["measured"] / 1e3 for r in rows],
                name=category_label("activations", t("measured, saved_tensors_hooks"), lang),
                marker_color=COLOURS["activations"], hovertemplate="%{y:.1f} kB<extra>" + t("measured") + "</extra>")
    fig.add_bar(x=x, y=[r["formula"] / 1e3 for r in rows], name=t("formula: gpt_activation_bytes_per_layer"),
                marker_color=REFERENCE, hovertemplate="%{y:.1f} kB<extra>" + t("formula") + "</extra>")
    sh = tr["shape"]
    _layout(fig, t("Activations one block keeps per rank, by recomputation mode (b = {b}, s = {s}, h = {h}, a = {a}, "
                   "fp32, dropout)").format(b=sh["b"], s=sh["s"], h=sh["h"], a=sh["a"]), "",
            t("kB kept for backward (1 kB = 10³ B)"), lang, barmode="group")
    return fig


def zero_memory_measured(lang: str = "en") -> go.Figure:
    """Bytes rank 0 holds at the optimizer step under DDP and ZeRO 1-3 (dp = 2), against the padded formula."""
    t = words(lang)
    tr = _trace("zero-memory")
    dp = tr["source"]["dp"]
    cats = measured_states(lang)
    xs = [STAGE_NAMES[s["stage"]] for s in tr["stages"]]
    mem = [s["ranks"][0]["memory_at_step"] for s in tr["stages"]]
    fig = go.Figure()
    for key, cat, name in cats:
        fig.add_bar(x=xs, y=[m[key] / 1e6 for m in mem], name=name, marker_color=COLOURS[cat],
                    hovertemplate="%{y:.3f} MB<extra>" + name + "</extra>")
    want = [est.model_state_bytes_padded([u["numel"] for u in s["units"]], dp, s["stage"], "fp32") / 1e6
            for s in tr["stages"]]
    fig.add_scatter(x=xs, y=want, mode="markers",
                    marker=dict(symbol="line-ew-open", size=40, color=REFERENCE, line=dict(width=3)),
                    name=t("model_state_bytes_padded (16, 12, 10, 8 B × Ψ_pad / stage)"),
                    hovertemplate="%{y:.3f} MB<extra>" + t("formula") + "</extra>")
    _layout(fig, t("Model states on rank 0 at the optimizer step, N_d = {dp} (tiny GPT, fp32 AdamW, recorded)").format(dp=dp),
            "", "MB per rank (1 MB = 10⁶ B)", lang, barmode="stack")
    return fig


def comm_wire(lang: str = "en") -> go.Figure:
    """Bytes each rank really sends per collective (TCP payload) over the ring model's, against buffer size."""
    t = words(lang)
    tr = _trace("comm-wire")
    fig = go.Figure()
    top = 0.0
    names = {"all_reduce": "all-reduce", "reduce_scatter": "reduce-scatter", "all_gather": "all-gather"}
    for i, op in enumerate(("all_reduce", "reduce_scatter", "all_gather")):
        for n, dash in ((2, "solid"), (4, "dot")):
            rows = [r for r in tr["rows"] if r["op"] == op and r["ranks"] == n]
            ratio = [max(r["measured"]) / r["model"] for r in rows]
            top = max([top, *ratio])
            label = t("{op}, {n} ranks").format(op=names[op], n=n)
            fig.add_scatter(x=[r["bytes"] / 1024 for r in rows], y=ratio, mode="lines+markers", name=label,
                            line=dict(color=PALETTE[i], dash=dash),
                            hovertemplate="S = %{x:.0f} KiB" + t("<br>measured / ring model = ") + "%{y:.3f}<extra>"
                                          + label + "</extra>")
    _layout(fig, t("What gloo sends per rank, over the ring model's (n−1)/n·S per phase (TCP payload, loopback)"),
            t("buffer S, KiB (log scale)"), t("measured ÷ ring model"), lang)
    fig.update_xaxes(type="log", tickvals=sorted({r["bytes"] / 1024 for r in tr["rows"]}))
    fig.add_hline(y=1, line=dict(width=1, dash="dash"), annotation_text=t("ring model"),
                  annotation_position="bottom right")
    fig.add_hline(y=2, line=dict(width=1, dash="dash"), annotation_text=t("2× (reduce-scatter as an all-reduce)"),
                  annotation_position="top right")
    fig.update_yaxes(range=[0.8, max(2.4, 1.05 * top)])     # every measured point stays on the plot
    return fig


def zero_prefetch(step: int = -1, lang: str = "en") -> go.Figure:
    """ZeRO-3 forward on rank 0: each unit's compute span and its all-gather in flight (issued → waited)."""
    t = words(lang)
    tr = _trace("zero-prefetch")
    st = tr["ranks"][0]["steps"][step]
    units = st["units"]
    rows = [u["unit"] for u in units]
    fig = go.Figure()
    fig.add_bar(y=rows, x=[u["waited"] - u["issued"] for u in units], base=[u["issued"] for u in units],
                orientation="h", name=t("all-gather in flight (issued → waited on)"), marker_color=PALETTE[2],
                opacity=0.45, customdata=[[u["bytes"] / 1e3] for u in units],
                hovertemplate=t("%{y}: gather of %{customdata[0]:.0f} kB, %{base:.2f} to %{x:.2f} ms long")
                + "<extra></extra>")
    fig.add_bar(y=rows, x=[u["forward_end"] - u["forward_start"] for u in units],
                base=[u["forward_start"] for u in units], orientation="h", name=t("unit forward"),
                marker_color=PALETTE[0], width=0.4,
                hovertemplate="%{y} forward" + t(": %{base:.2f} to %{x:.2f} ms long") + "<extra></extra>")
    fig.add_scatter(y=rows, x=[u["issued"] for u in units], mode="markers", name=t("all-gather issued"),
                    marker=dict(symbol="diamond", size=9, color=PALETTE[3]),
                    hovertemplate=t("%{y}: issued at %{x:.2f} ms") + "<extra></extra>")
    _layout(fig, t("ZeRO-3 forward on rank 0 of {world}: block k+1's all-gather is issued before block k computes "
                   "(step {step}, recorded)").format(world=tr["source"]["world_size"], step=st["step"]),
            t("time from the start of the step's forward (ms)"), "unit", lang, barmode="overlay")
    fig.update_yaxes(categoryorder="array", categoryarray=rows[::-1])
    return fig


def pipeline_recorded(step: int = -1, lang: str = "en") -> go.Figure:
    """GPipe and 1F1B at p = 2, m = 4: each rank's forward, backward and p2p spans of one recorded step."""
    t = words(lang)
    tr = _trace("pipeline")
    p, m = tr["p"], tr["m"]
    colours = {"forward": PALETTE[0], "backward": PALETTE[1], "send": PALETTE[5], "recv": PALETTE[5],
               "send_recv": PALETTE[5]}
    labels = {"forward": "forward", "backward": "backward", "send": "p2p (send / recv)",
              "recv": "p2p (send / recv)", "send_recv": "p2p (send / recv)"}
    names = {"gpipe": "GPipe", "1f1b": "1F1B"}
    fig, rows, seen = go.Figure(), [], set()
    for sch in tr["schedules"]:
        for r in sch["ranks"]:
            b = r["bubble"]
            row = t("{schedule} rank {rank}<br>({idle}/{ticks} slots idle)").format(
                schedule=names[sch["schedule"]], rank=r["rank"], idle=b["idle"], ticks=b["ticks"])
            rows.append(row)
            spans = r["steps"][step]["spans"]
            for kind in ("forward", "backward", "send", "recv", "send_recv"):
                mine = [s for s in spans if s["kind"] == kind]
                if not mine:
                    continue
                label = labels[kind]
                fig.add_bar(y=[row] * len(mine), x=[s["end"] - s["start"] for s in mine],
                            base=[s["start"] for s in mine], orientation="h", name=label,
                            marker_color=colours[kind], opacity=1.0 if kind in ("forward", "backward") else 0.5,
                            legendgroup=label, showlegend=label not in seen,
                            text=[f"{kind[0].upper()}{s['micro']}" if "micro" in s else "" for s in mine],
                            textposition="inside", insidetextanchor="middle", textangle=0,
                            hovertemplate=f"{kind} %{{text}}" + t(": %{base:.1f} to %{x:.1f} ms long")
                            + f"<extra>{row}</extra>")
                seen.add(label)
    _layout(fig, t("One recorded step, p = {p}, m = {m}: both idle (p−1)/(m+p−1) = {share} of slots").format(
                p=p, m=m, share=num(est.bubble_fraction(p, m, "1f1b"), ".0%", lang)),
            t("time from the start of the step (ms)"), "", lang, barmode="overlay",
            uniformtext=dict(minsize=9, mode="hide"))   # a span too narrow for "F3" drops it, not shrinks it
    fig.update_yaxes(categoryorder="array", categoryarray=rows[::-1])
    return fig


FIGURES.update({
    "zero-memory-measured": zero_memory_measured,
    "zero-prefetch": zero_prefetch,
    "pipeline-recorded": pipeline_recorded,
    "ddp-overlap": ddp_overlap,
    "memory-measured": memory_measured,
    "tp-comm-per-layer": tp_comm_per_layer,
    "activations-measured": activations_measured,
    "comm-wire": comm_wire,
})


def checkpoint_read_plan(lang: str = "en") -> go.Figure:
    """Which new rank reads which box of which saved file (recorded: `minimega.checkpoint.figure`)."""
    from minimega.checkpoint.figure import DATA, read_plan_figure
    return read_plan_figure(DATA, lang)


FIGURES["checkpoint-read-plan"] = checkpoint_read_plan
