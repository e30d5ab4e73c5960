"""Step-through animations for the course site: each one a list of frames computed from the package.

An animation is a grid (rows × columns of cells) shown one frame at a time by
``course/assets/javascripts/animate.js``. Every frame gives each cell a state (a CSS class and a short
label), a caption in the page's language, and the data that moves in that frame. Nothing is drawn by
hand: the states come from the package, and tests/test_animations.py checks them against it.

    ring-all-reduce       n ranks × n chunks: which contributions each chunk holds after each ring step;
                          bytes per rank add up to `estimate.ring_bytes("all_reduce", S, n)`
    zero-1, zero-2, zero-3  per rank, per unit of the recorded tiny GPT (course/data/zero-prefetch.json):
                          parameters, gradients and optimizer states held at each phase of a step
                          (gather/free per unit under stage 3); the collectives equal a real run's CommLog
    megatron-fg           one transformer layer on tp = 2: what each rank computes, f and g, per pass;
                          bytes equal `estimate.tp_comm_elements_per_layer`
    pipeline-gpipe, pipeline-1f1b, pipeline-interleaved
                          the tick grid of `pipeline.schedules.plan` for 4 stages × 8 micro-batches
    ring-attention        cp = 4 ranks: which K/V chunks each rank holds at each hop (`parallel.context`)

`animation(name, lang)` returns the JSON-ready dict; the site hook (tools/learner_hook.py) embeds it in
the page that calls ``{{ animation("NAME") }}``.
"""
from __future__ import annotations

from minimega import estimate as est
from minimega.parallel.context import chunk_ids, visibility
from minimega.pipeline import schedules

LANGS = ("en", "nl")


def _w(en: str, nl: str) -> dict[str, str]:
    return {"en": en, "nl": nl}


# ------------------------------------------------------------------------------------------------
# Ring all-reduce: reduce-scatter then all-gather, one chunk per rank per step

def ring_all_reduce(n: int = 4, size_bytes: float = 4 * 2**20) -> dict:
    """Frames of a ring all-reduce of S bytes over n ranks, cut into n chunks.

    ``held[r][c]`` is the set of ranks whose contribution rank r's chunk c holds. Step s of the
    reduce-scatter: rank r sends chunk (r - s) mod n to rank r + 1, which adds it to its own; after
    n - 1 steps rank r holds the full sum of chunk (r + 1) mod n. The all-gather then passes the
    finished chunks on for n - 1 more steps. Each send is S/n bytes.
    """
    held = [[{r} for _ in range(n)] for r in range(n)]
    chunk = size_bytes / n
    frames = [_ring_frame(held, n, [], _w(
        f"Each of the {n} ranks holds its own gradient, cut into {n} chunks. Nothing has moved yet.",
        f"Elk van de {n} ranks heeft zijn eigen gradiënt, in {n} stukken. Er is nog niets verstuurd."))]
    for phase in ("reduce_scatter", "all_gather"):
        for s in range(n - 1):
            moves = []
            for r in range(n):
                c = (r - s) % n if phase == "reduce_scatter" else (r + 1 - s) % n
                moves.append({"from": r, "to": (r + 1) % n, "chunk": c, "bytes": chunk})
            before = [[set(x) for x in row] for row in held]
            for mv in moves:
                dst, c = mv["to"], mv["chunk"]
                held[dst][c] = (held[dst][c] | before[mv["from"]][c]) if phase == "reduce_scatter" \
                    else set(before[mv["from"]][c])
            kb = chunk / 2**10
            if phase == "reduce_scatter":
                cap = _w(f"Reduce-scatter, step {s + 1} of {n - 1}: every rank sends one chunk ({kb:,.0f} KiB) to "
                         "the next rank, which adds it to its own copy.",
                         f"Reduce-scatter, stap {s + 1} van {n - 1}: elke rank stuurt één stuk ({kb:,.0f} KiB) naar "
                         "de volgende rank, die het bij zijn eigen kopie optelt.")
            else:
                cap = _w(f"All-gather, step {s + 1} of {n - 1}: every rank passes on a finished chunk "
                         f"({kb:,.0f} KiB); the receiver overwrites its copy.",
                         f"All-gather, stap {s + 1} van {n - 1}: elke rank geeft een af stuk door "
                         f"({kb:,.0f} KiB); de ontvanger overschrijft zijn kopie.")
            frames.append(_ring_frame(held, n, moves, cap, phase))
    total = est.ring_bytes("all_reduce", size_bytes, n) / 2**20
    frames[-1]["caption"] = {k: v + (f" Done: every rank sent {total:.1f} MiB = 2(n−1)/n · S." if k == "en" else
                                     f" Klaar: elke rank stuurde {total:.1f} MiB = 2(n−1)/n · S.".replace(".", ",", 1))
                             for k, v in frames[-1]["caption"].items()}
    return {"name": "ring-all-reduce", "n": n, "size_bytes": size_bytes,
            "title": _w(f"Ring all-reduce over {n} ranks", f"Ring-all-reduce over {n} ranks"),
            "rows": [_w(f"rank {r}", f"rank {r}") for r in range(n)],
            "cols": [_w(f"chunk {c}", f"stuk {c}") for c in range(n)],
            "legend": {"own": _w("own part only", "alleen eigen deel"), "partial": _w("partial sum", "deelsom"),
                       "full": _w("sum of all ranks", "som van alle ranks")},
            "frames": frames}


def _ring_frame(held, n, moves, caption, phase=None) -> dict:
    def state(s):
        return "full" if len(s) == n else "own" if len(s) == 1 else "partial"
    cells = [[{"s": state(held[r][c]), "t": "Σ" if len(held[r][c]) == n else "+".join(map(str, sorted(held[r][c])))}
              for c in range(n)] for r in range(n)]
    return {"cells": cells, "caption": caption, "moves": moves, "phase": phase,
            "active": [[mv["to"], mv["chunk"]] for mv in moves]}


# ------------------------------------------------------------------------------------------------
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
        frames.append({"cells": cells, "caption": caption, "comm": comm,
                       "active": [[3 * r + row, names.index(n)] for r in range(dp) for row, n in active]})

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
            "frames": frames}


def _label(state: str) -> str:
    return {"full": "■", "shard": "½", "none": "·"}[state]


def zero_comm(anim: dict) -> list[tuple[str, str, int]]:
    """The collectives of a ZeRO animation in order: (op, unit, elements)."""
    return [(f["comm"]["op"], f["comm"]["tag"], f["comm"]["elements"]) for f in anim["frames"] if f.get("comm")]


# ------------------------------------------------------------------------------------------------
# Megatron f and g: one transformer layer on tp = 2

def megatron_fg(tp: int = 2, seq: int = 64, micro_batch: int = 8, hidden: int = 64, heads: int = 4) -> dict:
    """What each tp rank computes and sends in one layer's forward and backward (Megatron-LM §3).

    Shapes from the tiny GPT (`GPTConfig.tiny`): D = hidden, heads split over tp, MLP width 4D split
    over tp. `f`: identity forward, all-reduce backward; `g`: all-reduce forward, identity backward.
    """
    F, h, bsh = 4 * hidden, heads, micro_batch * seq * hidden
    steps = [
        ("f", "attn", "fwd", None, _w("f (attention): forward is the identity; X (B, T, D) is on every rank.",
                                      "f (attention): forward is de identiteit; X (B, T, D) staat op elke rank.")),
        ("c", "attn", "fwd", None, _w(f"Each rank computes Q, K, V and attention for its {h // tp} of {h} heads "
                                      f"(W_qkv columns (D, 3D/{tp})).",
                                      f"Elke rank berekent Q, K, V en attention voor zijn {h // tp} van de {h} heads "
                                      f"(kolommen van W_qkv (D, 3D/{tp}))."), ),
        ("c", "proj", "fwd", None, _w(f"Output projection, rows split (D/{tp}, D): each rank holds a partial sum (B, T, D).",
                                      f"Uitvoerprojectie, rijen gesplitst (D/{tp}, D): elke rank heeft een deelsom (B, T, D).")),
        ("g", "proj", "fwd", "all_reduce", _w("g: all-reduce the partial sums; every rank has the attention output.",
                                              "g: all-reduce van de deelsommen; elke rank heeft de uitvoer van attention.")),
        ("f", "mlp", "fwd", None, _w("f (MLP): identity forward.", "f (MLP): identiteit in de forward.")),
        ("c", "mlp", "fwd", None, _w(f"fc1 columns (D, {F}/{tp}) and GeLU: each rank its own {F // tp} of {F} "
                                     "hidden units, no communication.",
                                     f"fc1-kolommen (D, {F}/{tp}) en GeLU: elke rank zijn eigen {F // tp} van {F} "
                                     "verborgen eenheden, zonder communicatie.")),
        ("c", "fc2", "fwd", None, _w(f"fc2 rows ({F}/{tp}, D): a partial sum (B, T, D) per rank.",
                                     f"fc2-rijen ({F}/{tp}, D): een deelsom (B, T, D) per rank.")),
        ("g", "fc2", "fwd", "all_reduce", _w("g: all-reduce; the layer's output is whole on every rank.",
                                             "g: all-reduce; de uitvoer van de laag is heel op elke rank.")),
        ("g", "fc2", "bwd", None, _w("Backward through g: the identity; the output gradient is already on every rank.",
                                     "Backward door g: de identiteit; de uitvoergradiënt staat al op elke rank.")),
        ("c", "mlp", "bwd", None, _w("Backward of fc2, GeLU and fc1 on each rank's columns: a partial dX per rank.",
                                     "Backward van fc2, GeLU en fc1 op de eigen kolommen: een gedeeltelijke dX per rank.")),
        ("f", "mlp", "bwd", "all_reduce", _w("Backward through f: all-reduce dX, the sum over both ranks' columns.",
                                             "Backward door f: all-reduce van dX, de som over de kolommen van beide ranks.")),
        ("g", "proj", "bwd", None, _w("Backward through attention's g: identity.", "Backward door g van attention: identiteit.")),
        ("c", "attn", "bwd", None, _w("Backward of the projection and each rank's heads: a partial dX.",
                                      "Backward van de projectie en de eigen heads: een gedeeltelijke dX.")),
        ("f", "attn", "bwd", "all_reduce", _w("Backward through f: all-reduce dX. Four all-reduces per layer in all.",
                                              "Backward door f: all-reduce van dX. Vier all-reduces per laag in totaal.")),
    ]
    cols = ["attn", "proj", "mlp", "fc2"]
    frames = []
    done: dict[str, str] = {}
    for kind, col, pas, comm_op, cap in steps:
        done[col] = f"{kind}-{pas}" if kind != "c" else f"c-{pas}"
        cells = []
        for r in range(tp):
            row = []
            for c in cols:
                s = done.get(c, "none")
                label = {"attn": f"heads {r * h // tp}–{(r + 1) * h // tp - 1}", "proj": "Σ" if "g-fwd" == s else "∂",
                         "mlp": f"{r * F // tp}–{(r + 1) * F // tp - 1}", "fc2": "Σ" if "g-fwd" == s else "∂"}[c]
                row.append({"s": s.split("-")[0] if s != "none" else "none", "t": label if s != "none" else "·"})
            cells.append(row)
        comm = {"op": comm_op, "elements": bsh, "region": kind, "pass": pas} if comm_op else None
        frames.append({"cells": cells, "caption": cap, "comm": comm,
                       "active": [[r, cols.index(col)] for r in range(tp)]})
    return {"name": "megatron-fg", "tp": tp, "seq": seq, "micro_batch": micro_batch, "hidden": hidden,
            "title": _w(f"Megatron f and g: one layer on tp = {tp}", f"Megatron f en g: één laag op tp = {tp}"),
            "rows": [_w(f"rank {r}", f"rank {r}") for r in range(tp)],
            "cols": [_w("attention heads", "attention-heads"), _w("out-proj", "uitvoerproj."),
                     _w("MLP fc1 cols", "MLP fc1-kol."), _w("MLP fc2", "MLP fc2")],
            "legend": {"f": _w("f region", "f-gebied"), "c": _w("local compute", "lokaal rekenwerk"),
                       "g": _w("g region", "g-gebied"), "none": _w("not yet", "nog niet")},
            "frames": frames}


# ------------------------------------------------------------------------------------------------
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
        frames.append({"cells": cells, "caption": cap, "active": [[r, t - 1] for r in range(p)] if t else []})
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
            "frames": frames, "compact": True}


def _slot(a, p: int, v: int) -> dict:
    if a is None:
        return {"s": "idle", "t": ""}
    text = f"{a.kind}{a.micro}" + ("′" * (a.chunk // p) if v > 1 else "")
    return {"s": a.kind, "t": text}


def grid_of(anim: dict) -> list[list[str | None]]:
    """The full tick grid an animation ends on, as texts (None where idle)."""
    return [[None if c["s"] == "idle" else c["t"] for c in row] for row in anim["frames"][-1]["cells"]]


# ------------------------------------------------------------------------------------------------
# Ring attention: which K/V chunks each rank holds per hop

def ring_attention(cp: int = 4) -> dict:
    """Per hop, each rank's K/V block (chunks `chunk_ids((r - hop) % cp)`) and how its queries see it."""
    n = 2 * cp
    seen = [[None] * n for _ in range(cp)]
    frames = [{"cells": _ra_cells(seen, cp, []), "active": [], "caption": _w(
        f"The sequence is cut into {n} chunks; rank r keeps chunks r and {n - 1}−r (queries, keys and values), "
        "so every rank has the same causal work.",
        f"De reeks is in {n} stukken geknipt; rank r houdt stukken r en {n - 1}−r (queries, keys en values), "
        "zodat elke rank evenveel causaal werk heeft.")}]
    for hop in range(cp):
        now = []
        for r in range(cp):
            for kc in chunk_ids((r - hop) % cp, cp):
                modes = [visibility(qc, kc) for qc in chunk_ids(r, cp)]
                s = "causal" if "causal" in modes else "full" if "full" in modes else "masked"
                seen[r][kc] = s
                now.append([r, kc])
        sends = _w(" Then each rank sends this K/V block to the next rank." if hop < cp - 1 else " No more sends.",
                   " Daarna stuurt elke rank dit K/V-blok naar de volgende rank." if hop < cp - 1 else
                   " Er wordt niets meer verstuurd.")
        cap = _w(f"Hop {hop}: rank r attends to the K/V block of rank r−{hop} (mod {cp}).",
                 f"Hop {hop}: rank r gebruikt het K/V-blok van rank r−{hop} (mod {cp}).")
        frames.append({"cells": _ra_cells(seen, cp, now), "active": now,
                       "caption": {k: cap[k] + sends[k] for k in LANGS}})
    return {"name": "ring-attention", "cp": cp,
            "title": _w(f"Ring attention on cp = {cp}", f"Ring attention op cp = {cp}"),
            "rows": [_w(f"rank {r} (Q {a}, {b})", f"rank {r} (Q {a}, {b})") for r, (a, b) in
                     ((r, chunk_ids(r, cp)) for r in range(cp))],
            "cols": [_w(f"K/V {c}", f"K/V {c}") for c in range(n)],
            "legend": {"full": _w("all keys earlier", "alle keys eerder"), "causal": _w("diagonal (masked)", "diagonaal (gemaskeerd)"),
                       "masked": _w("all later: skipped", "alle later: overgeslagen"), "none": _w("not seen yet", "nog niet gezien")},
            "frames": frames}


def _ra_cells(seen, cp, now):
    return [[{"s": seen[r][c] or "none", "t": "•" if [r, c] in now else ""} for c in range(2 * cp)]
            for r in range(cp)]


# ------------------------------------------------------------------------------------------------

BUILDERS = {
    "ring-all-reduce": ring_all_reduce,
    "zero-1": lambda: zero(1), "zero-2": lambda: zero(2), "zero-3": lambda: zero(3),
    "megatron-fg": megatron_fg,
    "pipeline-gpipe": lambda: pipeline("gpipe"), "pipeline-1f1b": lambda: pipeline("1f1b"),
    "pipeline-interleaved": lambda: pipeline("interleaved"), "pipeline-zb-h1": lambda: pipeline("zb_h1"),
    "ring-attention": ring_attention,
}


def localize(anim: dict, lang: str):
    """The animation with every {en, nl} word table replaced by `lang`'s words."""
    if isinstance(anim, dict):
        if set(anim) == set(LANGS):
            return anim[lang]
        return {k: localize(v, lang) for k, v in anim.items()}
    if isinstance(anim, list):
        return [localize(v, lang) for v in anim]
    return anim


def animation(name: str, lang: str = "en") -> dict:
    if name not in BUILDERS:
        raise KeyError(f"unknown animation {name!r}; have {sorted(BUILDERS)}")
    return localize(BUILDERS[name](), lang)
