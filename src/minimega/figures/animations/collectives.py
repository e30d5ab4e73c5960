"""Chapters 2, 7 and 15: the ring all-reduce, Megatron's f and g, ring attention."""
from __future__ import annotations

from minimega import estimate as est
from minimega.figures.animations._base import LANGS, _w, bytes_meter, meter
from minimega.parallel.context import chunk_ids, visibility
from minimega.figures.words import num


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
    sent = 0.0
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
            kb = {lang: num(chunk / 2**10, ",.0f", lang) for lang in LANGS}
            if phase == "reduce_scatter":
                cap = _w(f"Reduce-scatter, step {s + 1} of {n - 1}: every rank sends one chunk ({kb['en']} KiB) to "
                         "the next rank, which adds it to its own copy.",
                         f"Reduce-scatter, stap {s + 1} van {n - 1}: elke rank stuurt één stuk ({kb['nl']} KiB) naar "
                         "de volgende rank, die het bij zijn eigen kopie optelt.")
            else:
                cap = _w(f"All-gather, step {s + 1} of {n - 1}: every rank passes on a finished chunk "
                         f"({kb['en']} KiB); the receiver overwrites its copy.",
                         f"All-gather, stap {s + 1} van {n - 1}: elke rank geeft een af stuk door "
                         f"({kb['nl']} KiB); de ontvanger overschrijft zijn kopie.")
            frames.append(_ring_frame(held, n, moves, cap, phase))
            sent += chunk
            frames[-1]["meter"] = bytes_meter(sent)
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
            "frames": frames, "meter_label": _w("Bytes rank 0 has sent", "Bytes die rank 0 verstuurde")}


def _ring_frame(held, n, moves, caption, phase=None) -> dict:
    def state(s):
        return "full" if len(s) == n else "own" if len(s) == 1 else "partial"
    cells = [[{"s": state(held[r][c]), "t": "Σ" if len(held[r][c]) == n else "+".join(map(str, sorted(held[r][c])))}
              for c in range(n)] for r in range(n)]
    return {"cells": cells, "caption": caption, "moves": moves, "phase": phase,
            "active": [[mv["to"], mv["chunk"]] for mv in moves], "meter": bytes_meter(0)}



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
    sent = 0.0
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
        sent += est.ring_bytes(comm_op, bsh, tp) if comm_op else 0
        frames.append({"cells": cells, "caption": cap, "comm": comm, "meter": meter(sent, ",.0f"),
                       "active": [[r, cols.index(col)] for r in range(tp)]})
    return {"name": "megatron-fg", "tp": tp, "seq": seq, "micro_batch": micro_batch, "hidden": hidden,
            "title": _w(f"Megatron f and g: one layer on tp = {tp}", f"Megatron f en g: één laag op tp = {tp}"),
            "rows": [_w(f"rank {r}", f"rank {r}") for r in range(tp)],
            "cols": [_w("attention heads", "attention-heads"), _w("out-proj", "uitvoerproj."),
                     _w("MLP fc1 cols", "MLP fc1-kol."), _w("MLP fc2", "MLP fc2")],
            "legend": {"f": _w("f region", "f-gebied"), "c": _w("local compute", "lokaal rekenwerk"),
                       "g": _w("g region", "g-gebied"), "none": _w("not yet", "nog niet")},
            "frames": frames, "meter_label": _w("Elements rank 0 has sent in all-reduces",
                                                "Elementen die rank 0 in all-reduces verstuurde")}



# Ring attention: which K/V chunks each rank holds per hop

def ring_attention(cp: int = 4) -> dict:
    """Per hop, each rank's K/V block (chunks `chunk_ids((r - hop) % cp)`) and how its queries see it."""
    n = 2 * cp
    seen = [[None] * n for _ in range(cp)]
    frames = [{"cells": _ra_cells(seen, cp, []), "active": [], "meter": meter(0, "d"), "caption": _w(
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
                       "meter": meter(sum(s is not None for s in seen[0]), "d", f"/{n}"),
                       "caption": {k: cap[k] + sends[k] for k in LANGS}})
    return {"name": "ring-attention", "cp": cp,
            "title": _w(f"Ring attention on cp = {cp}", f"Ring attention op cp = {cp}"),
            "rows": [_w(f"rank {r} (Q {a}, {b})", f"rank {r} (Q {a}, {b})") for r, (a, b) in
                     ((r, chunk_ids(r, cp)) for r in range(cp))],
            "cols": [_w(f"K/V {c}", f"K/V {c}") for c in range(n)],
            "legend": {"full": _w("all keys earlier", "alle keys eerder"), "causal": _w("diagonal (masked)", "diagonaal (gemaskeerd)"),
                       "masked": _w("all later: skipped", "alle later: overgeslagen"), "none": _w("not seen yet", "nog niet gezien")},
            "frames": frames, "meter_label": _w("K/V chunks rank 0 has seen", "K/V-stukken die rank 0 zag")}


def _ra_cells(seen, cp, now):
    return [[{"s": seen[r][c] or "none", "t": "•" if [r, c] in now else ""} for c in range(2 * cp)]
            for r in range(cp)]


