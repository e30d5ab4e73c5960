"""Chapter 3: ZeRO stages 1-3, unit by unit, on the recorded tiny GPT."""
from __future__ import annotations

from minimega import estimate as est
from minimega.figures.animations._base import LANGS, _w, bytes_meter


# ZeRO stages 1-3 on the recorded tiny GPT, dp = 2

def zero_units() -> list[dict]:
    """The units (name, numel, padded) of the recorded ZeRO run (`minimega record`, tiny GPT, dp = 2)."""
    from minimega.figures import record
    return record.load("zero-prefetch")["units"]


def zero(stage: int, units: list[dict] | None = None, dp: int = 2) -> dict:
    """What each rank holds at each phase of one training step under ZeRO `stage`.

    Rows: per rank, its 16-bit parameters (P), gradients (G) and optimizer states (O); columns: the
    units the engine shards (embeddings, each block, the head). Each frame that communicates names the
    collective in ``comm`` (op, unit, elements: the whole unit, as `comm.CommLog` records it).
    """
    units = units or zero_units()
    names = [u["name"] for u in units]
    size = {u["name"]: u["padded"] for u in units}
    P = {n: "shard" if stage == 3 else "full" for n in names}
    G = {n: "none" for n in names}
    O = {n: "shard" for n in names}
    frames: list[dict] = []

    def snap(caption, comm=None, active=()):
        cells = []
        for _ in range(dp):
            cells += [[{"s": P[n], "t": _label(P[n])} for n in names],
                      [{"s": G[n], "t": _label(G[n])} for n in names],
                      [{"s": O[n], "t": _label(O[n])} for n in names]]
        p, g, k = est.state_bytes_per_param("mixed")            # 16-bit P and G, fp32 master + Adam: 2, 2, 12
        held = sum(size[n] * (p * share(P[n]) + g * share(G[n]) + k * share(O[n])) for n in names)
        frames.append({"cells": cells, "caption": caption, "comm": comm, "meter": bytes_meter(held),
                       "active": [[3 * r + row, names.index(n)] for r in range(dp) for row, n in active]})

    def share(state):
        return {"full": 1, "shard": 1 / dp, "none": 0}[state]

    def op(kind, n):
        return {"op": kind, "tag": n, "elements": size[n]}

    rest = {1: _w("At rest: every rank holds all 16-bit parameters and 1/N_d of the optimizer states.",
                  "In rust: elke rank heeft alle 16-bit-parameters en 1/N_d van de optimizer-states."),
            2: _w("At rest: every rank holds all 16-bit parameters and 1/N_d of the optimizer states.",
                  "In rust: elke rank heeft alle 16-bit-parameters en 1/N_d van de optimizer-states."),
            3: _w("At rest: every rank holds 1/N_d of every unit's parameters and optimizer states, nothing more.",
                  "In rust: elke rank heeft 1/N_d van de parameters en optimizer-states van elke unit, meer niet.")}
    snap(rest[stage])
    for n in names:                                        # forward
        if stage == 3:
            P[n] = "full"
            snap(_w(f"Forward, {n}: all-gather its parameters ({size[n]:,} elements) from the shards.",
                    f"Forward, {n}: all-gather van de parameters ({size[n]:,} elementen) uit de shards."),
                 op("all_gather", n), [(0, n)])
            P[n] = "shard"
            snap(_w(f"Forward, {n}: compute, then free the gathered parameters; only the shard stays.",
                    f"Forward, {n}: rekenen, dan de verzamelde parameters vrijgeven; alleen de shard blijft."),
                 None, [(0, n)])
        else:
            snap(_w(f"Forward, {n}: compute with the full parameters every rank keeps.",
                    f"Forward, {n}: rekenen met de volledige parameters die elke rank houdt."), None, [(0, n)])
    for n in reversed(names):                              # backward
        if stage == 3:
            P[n] = "full"
            snap(_w(f"Backward, {n}: all-gather its parameters again.",
                    f"Backward, {n}: opnieuw een all-gather van de parameters."), op("all_gather", n), [(0, n)])
        G[n] = "full"
        snap(_w(f"Backward, {n}: its full gradient is in, on every rank.",
                f"Backward, {n}: de volledige gradiënt is er, op elke rank."), None, [(1, n)])
        G[n] = "shard" if stage >= 2 else "full"
        if stage == 3:
            P[n] = "shard"
        free = {1: _w(" Stage 1 still keeps the full gradient until the step.",
                      " Stage 1 houdt de volledige gradiënt nog tot de stap."),
                2: _w(" The full gradient is freed; the summed shard stays.",
                      " De volledige gradiënt wordt vrijgegeven; de opgetelde shard blijft."),
                3: _w(" The full gradient and the gathered parameters are freed.",
                      " De volledige gradiënt en de verzamelde parameters worden vrijgegeven.")}[stage]
        snap({k: (f"Backward, {n}: reduce-scatter its gradient ({size[n]:,} elements): each rank gets the sum "
                  "of its shard." if k == "en" else
                  f"Backward, {n}: reduce-scatter van de gradiënt ({size[n]:,} elementen): elke rank krijgt de "
                  "som van zijn shard.") + free[k] for k in LANGS}, op("reduce_scatter", n), [(1, n)])
    for n in names:
        G[n] = "none"
    snap(_w("Optimizer step: each rank updates only its shard of the fp32 master weights with its shard of "
            "the gradient, then drops the gradients.",
            "Optimizer-stap: elke rank werkt alleen zijn shard van de fp32-masterweights bij met zijn shard "
            "van de gradiënt, en laat de gradiënten los."), None, [(2, n) for n in names])
    if stage < 3:
        for n in names:
            snap(_w(f"All-gather {n}'s updated parameters ({size[n]:,} elements): every rank has them all again.",
                    f"All-gather van de bijgewerkte parameters van {n} ({size[n]:,} elementen): elke rank heeft ze "
                    "weer allemaal."), op("all_gather", n), [(0, n)])
    else:
        frames[-1]["caption"] = {k: v + (" The next forward gathers them again." if k == "en" else
                                         " De volgende forward verzamelt ze opnieuw.") for k, v in frames[-1]["caption"].items()}
    rows = []
    for r in range(dp):
        rows += [_w(f"rank {r} · P (16-bit)", f"rank {r} · P (16-bit)"), _w(f"rank {r} · G", f"rank {r} · G"),
                 _w(f"rank {r} · O (fp32)", f"rank {r} · O (fp32)")]
    return {"name": f"zero-{stage}", "stage": stage, "dp": dp,
            "title": _w(f"ZeRO-{stage} on {dp} ranks: one training step", f"ZeRO-{stage} op {dp} ranks: één trainingsstap"),
            "rows": rows, "cols": [_w(n, n) for n in names],
            "legend": {"full": _w("whole unit", "hele unit"), "shard": _w("1/N_d shard", "shard van 1/N_d"),
                       "none": _w("not held", "niet aanwezig")},
            "frames": frames, "meter_label": _w("Bytes on rank 0 (P, G, O)", "Bytes op rank 0 (P, G, O)")}


def _label(state: str) -> str:
    return {"full": "■", "shard": "½", "none": "·"}[state]


def zero_comm(anim: dict) -> list[tuple[str, str, int]]:
    """The collectives of a ZeRO animation in order: (op, unit, elements)."""
    return [(f["comm"]["op"], f["comm"]["tag"], f["comm"]["elements"]) for f in anim["frames"] if f.get("comm")]


