"""The schedule printer: a rank × tick grid of what each pipeline rank did, from recorded timelines.

    rank 0 | F0 F1 F2 F3 .  .  .  B0 .  B1 .  B2 .  B3
    rank 1 | .  F0 F1 F2 .  .  B0 F3 B1 .  B2 .  B3 .
    ...
    idle 6/14 slots per rank = 0.429 (p-1)/(m+p-1) = 0.429

Cells are ``F<micro>`` / ``B<micro>`` / ``W<micro>`` (zb_h1's weight-gradient pass; with ``:<chunk>`` under virtual stages) and ``.`` for an idle slot.
"""
from __future__ import annotations

from .schedules import Plan


def grid_from_timelines(timelines: list[list[dict]], step: int = 0) -> list[list[str]]:
    """One row per pipeline rank (timelines in pp-rank order) from its recorded forward/backward events."""
    p = len(timelines)
    steps = [[e for e in events if e.get("step") == step] for events in timelines]
    interleaved = any(e.get("chunk", 0) >= p for events in steps for e in events)
    rows = []
    for events in steps:
        ticks = max(e["tick"] for e in events if e.get("kind") == "step")           # the step event closes the row
        row = ["."] * ticks
        for e in events:
            if e.get("kind") in ("forward", "backward", "weight"):
                row[e["tick"]] = f"{e['kind'][0].upper()}{e['micro']}" + (f":{e['chunk']}" if interleaved else "")
        rows.append(row)
    return rows


def wall_idle(timelines: list[list[dict]], step: int = 0) -> list[float]:
    """Each rank's measured idle share of one step: the step's wall time outside its F, B and W passes (waiting on
    a neighbour, the p2p exchanges) over the step's wall time; `Pipeline.bubble`'s ``wall_idle_of_total``."""
    out = []
    for events in timelines:
        ev = [e for e in events if e.get("step") == step]
        whole = next(e for e in ev if e.get("kind") == "step")
        span = whole["end"] - whole["start"]
        busy = sum(e["end"] - e["start"] for e in ev if e.get("kind") in ("forward", "backward", "weight"))
        out.append((span - busy) / span)
    return out


def grid_from_plan(plan: Plan) -> list[list[str]]:
    """The same grid, straight from a plan (no run needed)."""
    return [["." if a is None else f"{a.kind}{a.micro}" + (f":{a.chunk}" if plan.v > 1 else "") for a in row]
            for row in plan.grid]


def render(rows: list[list[str]]) -> str:
    """The grid as text, one line per rank, with each rank's idle slots counted at the end."""
    width = max(len(c) for row in rows for c in row)
    lines = []
    for r, row in enumerate(rows):
        idle = row.count(".")
        lines.append(f"rank {r} | " + " ".join(c.ljust(width) for c in row)
                     + f" | idle {idle}/{len(row)} = {idle / len(row):.3f}")
    return "\n".join(lines)


def legend(rows: list[list[str]]) -> str:
    """What the grid's cells and columns mean, printed under it (only the cell kinds it holds)."""
    cells = {c for row in rows for c in row}
    chunked = any(":" in c for c in cells)
    lines = ["legend: one row per pipeline rank, one column per time slot (tick), left to right",
             "  F<m>  forward of micro-batch m" + (" on model chunk :<c>" if chunked else ""),
             "  B<m>  backward of micro-batch m" + (" on model chunk :<c>" if chunked else "")
             + (" (its input gradient only)" if any(c.startswith("W") for c in cells) else ""),
             *(["  W<m>  weight gradient of micro-batch m (zb_h1: fills what would be idle slots)"]
               if any(c.startswith("W") for c in cells) else []),
             "  .     idle: the rank waits for its neighbour (the pipeline bubble)",
             "  idle  a rank's idle slots / all its slots; with p stages and m micro-batches GPipe and 1F1B "
             "idle (p-1)/(m+p-1)" + (", ZB-H1 (p-1)/(3m+p-1) for m >= p" if any(c.startswith("W") for c in cells)
                                     else "")]
    return "\n".join(lines)
