"""Plotly figure builders shared by the labs and the course site."""
from __future__ import annotations

import plotly.graph_objects as go

_COLOURS = {"forward": "#4C78A8", "backward": "#F58518", "send": "#54A24B", "recv": "#B279A2",
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
            if e.get("step") != step or e.get("kind") not in _COLOURS:
                continue
            label = e["kind"] if "micro" not in e else f"{e['kind']} micro {e['micro']} chunk {e['chunk']}"
            fig.add_trace(go.Bar(
                x=[(e["end"] - e["start"]) * 1e3], base=[(e["start"] - origin) * 1e3], y=[f"rank {rank}"],
                orientation="h", marker_color=_COLOURS[e["kind"]], name=e["kind"], legendgroup=e["kind"],
                showlegend=e["kind"] not in seen, hovertext=label,
                text=[f"{e['kind'][0].upper()}{e['micro']}" if "micro" in e else ""], textposition="inside"))
            seen.add(e["kind"])
    fig.update_layout(barmode="overlay", title=title or f"pipeline schedule, step {step} (gaps are idle)",
                      xaxis_title="time since the step started (ms)", yaxis_title="pipeline rank",
                      yaxis_autorange="reversed", template="plotly_white")
    return fig
