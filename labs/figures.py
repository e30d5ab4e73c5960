"""Plotly figures the labs draw from `Engine.report()`s (the ones returned by `labs/workers.py`).

Memory categories wear `minimega.figures.palette`'s colours and legend labels, as on the course site: the orange
of optimizer states in a lab is the orange of chapter 3's figures and the calculator. A measured category
(`minimega.run.measure.CATEGORIES`) that is one part of a palette category (fp32 masters and Adam's step
counters are optimizer states in the ZeRO paper's K) wears that category's colour with a pattern of its own.
"""
from __future__ import annotations

import math

import plotly.graph_objects as go

from minimega.figures import palette

MIB = 2**20

# measured key -> (palette category, detail shown after its label, bar pattern)
MEASURED = {
    "params": ("params", "", ""),
    "gathered": ("gathered", "", ""),
    "master": ("optimizer", "fp32 master weights", "x"),
    "grads": ("grads", "", ""),
    "optimizer_states": ("optimizer", "moments", ""),
    "optimizer_step_counters": ("optimizer", "step counters", "."),
    "activations": ("activations", "", ""),
    "host_grads": ("cpu", "fp32 gradients", "/"),
}


def category_style(key: str, detail: str = "") -> dict:
    """Name, colour and pattern of memory category `key`: a palette key (``"optimizer"``, ``"cpu"``, as
    `minimega.estimate.memory_per_gpu` writes them) or a measured one (``"optimizer_states"``, ``"master"``)."""
    if key in palette.COLOURS:
        cat, own, pattern = key, "", ""
    elif key in MEASURED:
        cat, own, pattern = MEASURED[key]
    else:
        raise KeyError(f"memory category {key!r}: labs/figures.py knows the palette's {', '.join(palette.COLOURS)} "
                       f"and the measured {', '.join(MEASURED)}")
    return {"name": palette.label(cat, ", ".join(d for d in (own, detail) if d)),
            "marker_color": palette.COLOURS[cat], "marker_pattern_shape": pattern}


def byte_categories(memory: dict) -> list[str]:
    """The keys of ``report["memory"]`` that count bytes (a ZeRO report also says where the optimizer lives)."""
    return [k for k, v in memory.items() if isinstance(v, (int, float)) and not isinstance(v, bool)]


def memory_bars(reports: list[dict], title: str, labels: list[str] | None = None) -> go.Figure:
    """Bytes each rank holds, by category (``report["memory"]``): a group of bars per rank, one per category.

    ``labels`` names the groups (default: the rank), e.g. to compare one rank of several layouts.
    """
    categories = byte_categories(reports[0]["memory"])
    labels = labels or [f"rank {r['rank']}" for r in reports]
    fig = go.Figure([go.Bar(x=labels, y=[r["memory"].get(c, 0) / MIB for r in reports],
                            text=[f"{r['memory'].get(c, 0) / r['n_params']:.2f} B/param" for r in reports],
                            textposition="outside", **category_style(c))
                     for c in categories])
    fig.update_layout(title=title, barmode="group", yaxis_title="MiB on this rank", height=380,
                      margin=dict(t=60, b=40), legend=dict(orientation="h", y=-0.15))
    return fig


def model_states_by_location(reports: list[dict], labels: list[str], title: str) -> go.Figure:
    """Rank 0's model states at the optimizer step (``report["memory_at_step"]``), stacked: parameters,
    gradients and optimizer states (fp32 masters + moments) on the device, or those states and the fp32
    gradient shard (``host_grads``) in CPU memory when the run offloaded them (``optimizer_location == "cpu"``)."""
    fig = go.Figure()
    mem = [r["memory_at_step"] for r in reports]
    states = [m.get("master", 0) + m["optimizer_states"] + m.get("host_grads", 0) for m in mem]
    on_cpu = [m["optimizer_location"] == "cpu" for m in mem]
    for key, ys in (("params", [m["params"] for m in mem]), ("grads", [m["grads"] for m in mem]),
                    ("optimizer", [0 if c else s for s, c in zip(states, on_cpu)]),
                    ("cpu", [s if c else 0 for s, c in zip(states, on_cpu)])):
        fig.add_bar(x=labels, y=[y / 1024 for y in ys], **category_style(key))
    fig.update_layout(title=title, barmode="stack", yaxis_title="KiB", height=360)
    return fig


def estimate_stack(rows: dict[str, dict], title: str, limit_gb: float | None = None, log: bool = False) -> go.Figure:
    """Estimated bytes per GPU (`minimega.estimate.memory_per_gpu`), one stacked bar per layout, by category."""
    gb = 1e9
    keys = ["params", "grads", "optimizer", "gathered", "activations", "recompute"]
    fig = go.Figure([go.Bar(x=list(rows), y=[r[k] / gb for r in rows.values()], **category_style(k)) for k in keys])
    if limit_gb:
        # a shape takes data units on a log axis, an annotation takes log10 of them: add_hline's own annotation
        # would sit at 10^80 and stretch the axis there
        fig.add_hline(y=limit_gb, line_dash="dash", line_color=palette.REFERENCE)
        fig.add_annotation(text=f"{limit_gb:g} GB per GPU", xref="paper", x=1, xanchor="right", yanchor="bottom",
                           y=math.log10(limit_gb) if log else limit_gb, showarrow=False)
    fig.update_layout(barmode="stack", title=title, yaxis_title="GB per GPU", yaxis_type="log" if log else None,
                      height=420)
    return fig


def activation_lines(xs: list, series: dict[str, list], title: str, xaxis_title: str, yaxis_title: str) -> go.Figure:
    """Activation bytes against `xs`, one line per setting: the palette's activations colour, told apart by
    dash and marker (as the course's activations figures do)."""
    dashes, symbols = ("solid", "dot", "dash", "dashdot"), ("circle", "square", "diamond", "x")
    fig = go.Figure([go.Scatter(x=xs, y=ys, name=name, mode="lines+markers",
                                line=dict(color=palette.COLOURS["activations"], dash=dashes[i % 4]),
                                marker=dict(symbol=symbols[i % 4], size=8))
                     for i, (name, ys) in enumerate(series.items())])
    fig.update_layout(title=title, xaxis_title=xaxis_title, yaxis_title=yaxis_title, height=360)
    return fig


def activation_bars(values: dict[str, float], title: str, yaxis_title: str) -> go.Figure:
    """One activation figure per setting, as bars in the palette's activations colour."""
    fig = go.Figure(go.Bar(x=list(values), y=list(values.values()), marker_color=palette.COLOURS["activations"],
                           name=palette.label("activations")))
    fig.update_layout(title=title, yaxis_title=yaxis_title, height=320)
    return fig


def comm_by_op(reports: list[dict], labels: list[str], title: str) -> go.Figure:
    """Bytes one rank sends per step (ring model), by collective, for several layouts side by side."""
    ops = sorted({op for r in reports for op in r["comm"]["by_op"]})
    fig = go.Figure([go.Bar(name=op, x=labels,
                            y=[r["comm"]["by_op"].get(op, {}).get("sent_bytes", 0) / len(r["losses"]) / 1024
                               for r in reports])
                     for op in ops])
    fig.update_layout(title=title, barmode="stack", yaxis_title="KiB sent per rank per step", height=360)
    return fig


def step_timeline(report: dict, step: int = -1) -> go.Figure:
    """One training step on one rank: forward, backward and optimizer, and each bucket's all-reduce.

    An all-reduce bar starts when the bucket's last gradient arrived (the hook issued it, asynchronously)
    and ends when the engine waited for it; bars that start inside the backward bar are overlapped with
    compute. Times are milliseconds from the step's start.
    """
    events = report["timeline"]
    steps = sorted({e["step"] for e in events if "step" in e})
    chosen = steps[step]
    mine = {e["event"]: e["time"] for e in events if e.get("step") == chosen}
    t0, t1 = mine["forward_start"], mine["optimizer_step_end"]
    ms = lambda t: 1e3 * (t - t0)                                                  # noqa: E731
    phases = [("forward", mine["forward_start"], mine["backward_start"], "#4c78a8"),
              ("backward (+ wait for all-reduces)", mine["backward_start"], mine["backward_end"], "#f58518"),
              ("optimizer step", mine["backward_end"], mine["optimizer_step_end"], "#54a24b")]
    fig = go.Figure()
    for name, a, b, colour in phases:
        fig.add_bar(y=["compute"], x=[ms(b) - ms(a)], base=[ms(a)], orientation="h", name=name,
                    marker_color=colour)
    buckets = [e for e in report["comm_events"] if e["op"] == "all_reduce" and e["tag"].startswith("bucket")
               and t0 <= e["start"] <= t1]
    fig.add_bar(y=[e["tag"] for e in buckets], x=[ms(e["end"] or e["start"]) - ms(e["start"]) for e in buckets],
                base=[ms(e["start"]) for e in buckets], orientation="h", name="all-reduce (issued → waited)",
                marker_color="#e45756",
                hovertext=[f"{e['bytes'] / 1024:.0f} KiB" for e in buckets])
    fig.update_layout(title=f"rank {report['rank']}, step {chosen}: {len(buckets)} bucket all-reduce(s)",
                      xaxis_title="ms since the step started", barmode="overlay",
                      height=220 + 16 * len(buckets), yaxis=dict(autorange="reversed"),
                      legend=dict(orientation="h", y=-0.25))
    return fig


def measured_vs_estimate(rows: list[tuple[str, dict, dict]], title: str, unit: str = "KiB") -> go.Figure:
    """Measured bytes (solid) next to the closed form (hatched), by category, one group per layout.

    ``rows``: ``(label, measured {category: bytes}, estimated {category: bytes})`` per layout; categories are
    measured keys (``"optimizer_states"``) or palette keys, each drawn in its palette colour.
    """
    scale = {"KiB": 2**10, "MiB": MIB, "GiB": 2**30}[unit]
    categories = list(rows[0][1])
    fig = go.Figure()
    for i, c in enumerate(categories):
        style = category_style(c)
        fig.add_bar(name=f"{style['name']} (measured)", x=[label for label, _, _ in rows],
                    y=[m.get(c, 0) / scale for _, m, _ in rows], marker_color=style["marker_color"],
                    marker_pattern_shape=style["marker_pattern_shape"], offsetgroup=2 * i)
        fig.add_bar(name=f"{style['name']} (formula)", x=[label for label, _, _ in rows],
                    y=[e.get(c, 0) / scale for _, _, e in rows], marker_color=style["marker_color"],
                    offsetgroup=2 * i + 1, marker_pattern_shape="/", opacity=0.6)
    fig.update_layout(title=title, barmode="group", yaxis_title=f"{unit} on one rank", height=400,
                      legend=dict(orientation="h", y=-0.2))
    return fig


def formula_lines(formulas: dict[str, tuple[list, list]], measured: dict[str, tuple[float, float]], title: str,
                  xaxis_title: str, yaxis_title: str) -> go.Figure:
    """Closed forms as lines (``name -> (xs, ys)``) with what was measured on them (``name -> (x, y)``) as
    large open markers of the same colour. Not memory categories: the colours are `palette.SERIES`."""
    fig = go.Figure()
    for i, (name, (xs, ys)) in enumerate(formulas.items()):
        colour = palette.SERIES[i % len(palette.SERIES)]
        fig.add_scatter(x=xs, y=ys, name=f"{name} (formula)", mode="lines+markers", line=dict(color=colour),
                        marker=dict(size=6))
        if name in measured:
            x, y = measured[name]
            fig.add_scatter(x=[x], y=[y], name=f"{name} (measured)", mode="markers",
                            marker=dict(color=colour, size=16, symbol="circle-open", line=dict(width=3)))
    fig.update_layout(title=title, xaxis_title=xaxis_title, yaxis_title=yaxis_title, height=360)
    fig.update_yaxes(rangemode="tozero")
    return fig
