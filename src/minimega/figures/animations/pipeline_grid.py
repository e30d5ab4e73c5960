"""Chapter 8: the tick grid of `pipeline.schedules.plan`."""
from __future__ import annotations

from minimega.figures.animations._base import LANGS, _w, meter
from minimega.pipeline import schedules


# Pipeline schedules: the tick grid of pipeline.schedules.plan

SCHEDULE_OF = {"gpipe": ("gpipe", 1), "1f1b": ("1f1b", 1), "interleaved": ("interleaved_1f1b", 2), "zb_h1": ("zb_h1", 1)}


def pipeline(kind: str, p: int = 4, m: int = 8) -> dict:
    """One frame per tick: the grid of `schedules.plan` filled up to that tick (F/B/W, micro-batch, chunk)."""
    schedule, v = SCHEDULE_OF[kind]
    grid = schedules.plan(schedule, p, m, v).grid
    ticks = len(grid[0])
    frames = []
    for t in range(ticks + 1):
        cells = [[_slot(grid[r][u], p, v) if u < t else {"s": "future", "t": ""} for u in range(ticks)]
                 for r in range(p)]
        busy = [grid[r][t - 1] for r in range(p)] if t else []
        if t == 0:
            cap = _w(f"{p} stages, {m} micro-batches: press step to advance one tick.",
                     f"{p} stages, {m} micro-batches: druk op stap om één tik verder te gaan.")
        else:
            run = ", ".join(f"{r}: {a}" for r, a in enumerate(busy) if a is not None)
            idle = sum(a is None for a in busy)
            cap = _w(f"Tick {t} of {ticks}. Running (stage: pass) {run}; {idle} idle.",
                     f"Tik {t} van {ticks}. Bezig (stage: pas) {run}; {idle} stil.")
        if t == ticks:
            idle = sum(a is None for row in grid for a in row)
            cap = {k: cap[k] + (f" Bubble: {idle} idle of {p * ticks} slots." if k == "en" else
                                f" Bubbel: {idle} stil van {p * ticks} slots.") for k in LANGS}
        gone = sum(a is None for row in grid for a in row[:t])
        frames.append({"cells": cells, "caption": cap, "active": [[r, t - 1] for r in range(p)] if t else [],
                       "meter": meter(gone, "d", f"/{p * ticks}")})
    titles = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved": f"interleaved 1F1B (v = {v})", "zb_h1": "ZB-H1"}
    split = schedule == "zb_h1"                    # B is the input gradient only, W the weight gradient
    legend = {"F": _w("forward", "forward"),
              "B": _w("input gradient", "inputgradiënt") if split else _w("backward", "backward"),
              **({"W": _w("weight gradient", "gewichtsgradiënt")} if split else {}), "idle": _w("idle", "stil")}
    return {"name": f"pipeline-{kind.replace('_', '-')}", "schedule": schedule, "p": p, "m": m, "v": v,
            "title": _w(f"{titles[kind]}: {p} stages × {m} micro-batches", f"{titles[kind]}: {p} stages × {m} micro-batches"),
            "rows": [_w(f"stage {r}", f"stage {r}") for r in range(p)],
            "cols": [_w(str(u + 1), str(u + 1)) for u in range(ticks)],
            "legend": legend,
            "frames": frames, "compact": True, "meter_label": _w("Idle slots so far", "Stille slots tot nu toe")}


def _slot(a, p: int, v: int) -> dict:
    if a is None:
        return {"s": "idle", "t": ""}
    text = f"{a.kind}{a.micro}" + ("′" * (a.chunk // p) if v > 1 else "")
    return {"s": a.kind, "t": text}


def grid_of(anim: dict) -> list[list[str | None]]:
    """The full tick grid an animation ends on, as texts (None where idle)."""
    return [[None if c["s"] == "idle" else c["t"] for c in row] for row in anim["frames"][-1]["cells"]]


