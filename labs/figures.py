"""Plotly figures the labs draw from `Engine.report()`s (the ones returned by `labs/workers.py`)."""
from __future__ import annotations

import plotly.graph_objects as go

MIB = 2**20


def memory_bars(reports: list[dict], title: str, labels: list[str] | None = None) -> go.Figure:
    """Bytes each rank holds, by category (``report["memory"]``), one group of bars per category.

    ``labels`` names the bars (default: the rank), e.g. to compare one rank of several layouts.
    """
    categories = list(reports[0]["memory"])
    labels = labels or [f"rank {r['rank']}" for r in reports]
    fig = go.Figure([go.Bar(name=label, x=categories,
                            y=[r["memory"][c] / MIB for c in categories],
                            text=[f"{r['memory'][c] / r['n_params']:.2f} B/param" for c in categories],
                            textposition="outside")
                     for label, r in zip(labels, reports)])
    fig.update_layout(title=title, barmode="group", yaxis_title="MiB on this rank", height=380,
                      margin=dict(t=60, b=40))
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

    ``rows``: ``(label, measured {category: bytes}, estimated {category: bytes})`` per layout.
    """
    scale = {"KiB": 2**10, "MiB": MIB, "GiB": 2**30}[unit]
    categories = list(rows[0][1])
    colours = ["#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2"]
    fig = go.Figure()
    for i, c in enumerate(categories):
        colour = colours[i % len(colours)]
        fig.add_bar(name=f"{c} (measured)", x=[label for label, _, _ in rows],
                    y=[m.get(c, 0) / scale for _, m, _ in rows], marker_color=colour, offsetgroup=2 * i)
        fig.add_bar(name=f"{c} (formula)", x=[label for label, _, _ in rows],
                    y=[e.get(c, 0) / scale for _, _, e in rows], marker_color=colour, offsetgroup=2 * i + 1,
                    marker_pattern_shape="/", opacity=0.6)
    fig.update_layout(title=title, barmode="group", yaxis_title=f"{unit} on one rank", height=400,
                      legend=dict(orientation="h", y=-0.2))
    return fig
