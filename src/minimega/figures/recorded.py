"""Figures drawn from recorded runs (``minimega record``'s JSON traces in ``course/data``): what really moved.

Each takes ``lang`` ("en" or "nl") like the estimator figures in ``plots.py``.
"""
from __future__ import annotations

import plotly.graph_objects as go

from minimega import estimate as est
from .checkpoint_plan import DATA, read_plan_figure
from .palette import COLOURS, REFERENCE
from .palette import label as category_label
from .style import PALETTE, STAGE_NAMES, house_layout
from .words import num, words


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
    from minimega.figures.record import load
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
    house_layout(fig, t("DDP on {world} ranks: {buckets} buckets start their all-reduce during the backward (step {step}, recorded)")
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
    house_layout(fig, t("Model states per rank, measured after a backward (tiny GPT, fp32 AdamW)"), "",
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
    house_layout(fig, t("Bytes each rank sends per step, by layer: tiny GPT, t = {t}, b = {b}, s = {s}, h = {h} (recorded)")
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
    house_layout(fig, t("Activations one block keeps per rank, by recomputation mode (b = {b}, s = {s}, h = {h}, a = {a}, "
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
    house_layout(fig, t("Model states on rank 0 at the optimizer step, N_d = {dp} (tiny GPT, fp32 AdamW, recorded)").format(dp=dp),
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
    house_layout(fig, t("What gloo sends per rank, over the ring model's (n−1)/n·S per phase (TCP payload, loopback)"),
            t("buffer S, KiB (log scale)"), t("measured ÷ ring model"), lang)
    fig.update_xaxes(type="log", tickvals=sorted({r["bytes"] / 1024 for r in tr["rows"]}))
    fig.add_hline(y=1, line=dict(width=1, dash="dash"), annotation_text=t("ring model"),
                  annotation_position="bottom right")
    for n in (2, 4):            # reduce-scatter from n reduces: a ring reduce-scatter of each chunk plus a gather
        fig.add_hline(y=1 + 1 / n, line=dict(width=1, dash="dot"), annotation_position="top right",
                      annotation_text=t("1 + 1/n at n = {n}").format(n=n))
    fig.update_yaxes(range=[0.8, max(1.9, 1.05 * top)])     # every measured point stays on the plot
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
    house_layout(fig, t("ZeRO-3 forward on rank 0 of {world}: block k+1's all-gather is issued before block k computes "
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
    house_layout(fig, t("One recorded step, p = {p}, m = {m}: both idle (p−1)/(m+p−1) = {share} of slots").format(
                p=p, m=m, share=num(est.bubble_fraction(p, m, "1f1b"), ".0%", lang)),
            t("time from the start of the step (ms)"), "", lang, barmode="overlay",
            uniformtext=dict(minsize=9, mode="hide"))   # a span too narrow for "F3" drops it, not shrinks it
    fig.update_yaxes(categoryorder="array", categoryarray=rows[::-1])
    return fig


def checkpoint_read_plan(lang: str = "en") -> go.Figure:
    """Which new rank reads which box of which saved file (recorded: `minimega.figures.checkpoint_plan`)."""
    return read_plan_figure(DATA, lang)
