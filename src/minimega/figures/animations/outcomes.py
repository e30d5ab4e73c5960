"""Chapters 16 and 17: tokens routed to experts and back; the capstone's predictions next to published numbers.

    moe-route   the tiny GPT's MoE layer (4 experts, top-1, capacity factor 1.25) on 2 ranks, 4 tokens each:
                the router's picks (`MoELayer.select`), who fits (`assign_slots`), the dispatch all-to-all,
                the experts, the combine; rank 0's bytes add up to `moe_alltoall_bytes`
    capstone    course/data/capstone.json (`minimega.figures.capstone`): one frame per published number
"""
from __future__ import annotations

import json

from minimega.figures.animations._base import _w, bytes_meter, cell, frame, meter, words
from minimega.figures.words import num

MOE = dict(n_experts=4, top_k=1, capacity_factor=1.25)


def routes(ep: int = 2, tokens: int = 4, seed: int = 0) -> dict:
    """Rank r's tokens (one sequence of `tokens`), their expert and whether they fit, from the real layer."""
    import torch
    from minimega import GPTConfig
    from minimega.parallel.moe.layer import MoEConfig, MoELayer, assign_slots
    cfg, moe = GPTConfig.tiny(), MoEConfig(**MOE)
    torch.manual_seed(seed)
    layer = MoELayer(cfg, moe)
    x = torch.randn(ep, tokens, cfg.n_embd)                       # (ranks, T, D): one sequence per rank
    with torch.no_grad():
        _, top_i, _, _ = layer.select(x)
    C = moe.capacity(tokens)
    expert, fits = [], []
    for r in range(ep):
        _, _, kept = assign_slots(top_i[r:r + 1], moe.n_experts, C)     # (1, kT, E)
        expert.append(top_i[r, :, 0].tolist())
        fits.append(kept[0].any(-1).tolist())
    return {"expert": expert, "fits": fits, "capacity": C, "d_model": cfg.n_embd, "ep": ep, "tokens": tokens}


def moe_route(ep: int = 2, tokens: int = 4) -> dict:
    from minimega.sizes import moe_alltoall_bytes
    R = routes(ep, tokens)
    E, C, D = MOE["n_experts"], R["capacity"], R["d_model"]
    per = E // ep
    owner = lambda e: e // per                                            # noqa: E731
    one_a2a = (ep - 1) / ep * E * C * D * 4                              # (E, C, D) fp32 slots, 1/ep stays home
    n = ep * tokens
    home = [t // tokens for t in range(n)]
    exp = [R["expert"][t // tokens][t % tokens] for t in range(n)]
    fit = [R["fits"][t // tokens][t % tokens] for t in range(n)]
    frames, sent = [], 0.0

    def snap(caption, place, state, text, active=True):
        cells = [[cell("none", "·") for _ in range(n)] for _ in range(ep)]
        for t in range(n):
            cells[place(t)][t] = cell(state(t), text(t))
        frames.append(frame(cells, caption, [(place(t), t) for t in range(n)] if active else (), bytes_meter(sent)))

    snap(_w(f"{n} tokens, {tokens} on each of {ep} ranks; rank r holds experts {per}r to {per}r + {per - 1}. "
            f"Each expert takes at most C = {C} tokens of a sequence (capacity factor {MOE['capacity_factor']}).",
            f"{n} tokens, {tokens} op elk van {ep} ranks; rank r heeft experts {per}r tot {per}r + {per - 1}. Elke "
            f"expert neemt hoogstens C = {C} tokens van een reeks (capaciteitsfactor "
            f"{num(MOE['capacity_factor'], '.2f', 'nl')})."),
         lambda t: home[t], lambda t: "own", lambda t: f"t{t}", False)
    dropped = [t for t in range(n) if not fit[t]]
    snap(words(lambda lang: ("The router picks one expert per token" if lang == "en" else "De router kiest één expert "
                             "per token") + (f"; {len(dropped)} over capacity: {', '.join(f't{t}' for t in dropped)}."
                                            if lang == "en" else f"; {len(dropped)} boven capaciteit: "
                                            f"{', '.join(f't{t}' for t in dropped)}.") if dropped else "."),
         lambda t: home[t], lambda t: "own" if fit[t] else "lost", lambda t: f"t{t}→e{exp[t]}")
    sent += one_a2a
    snap(words(lambda lang: (f"Dispatch all-to-all: each rank sends the (E, C, D) slots of the other rank's experts, "
                             f"{num(one_a2a, ',.0f', lang)} bytes; dropped tokens stay home." if lang == "en" else
                             f"Dispatch-all-to-all: elke rank stuurt de (E, C, D)-slots van de experts van de andere "
                             f"rank, {num(one_a2a, ',.0f', lang)} bytes; gedropte tokens blijven thuis.")),
         lambda t: owner(exp[t]) if fit[t] else home[t], lambda t: "shard" if fit[t] else "lost",
         lambda t: f"t{t}@e{exp[t]}" if fit[t] else f"t{t}")
    snap(_w("Each rank runs its experts on the slots of both ranks.", "Elke rank draait zijn experts op de slots van beide ranks."),
         lambda t: owner(exp[t]) if fit[t] else home[t], lambda t: "c" if fit[t] else "lost",
         lambda t: f"e{exp[t]}(t{t})" if fit[t] else f"t{t}")
    sent += one_a2a
    snap(words(lambda lang: (f"Combine all-to-all: the outputs go home ({num(one_a2a, ',.0f', lang)} bytes), weighted "
                             "by their gates; a dropped token passes on the residual alone." if lang == "en" else
                             f"Combine-all-to-all: de uitvoer gaat naar huis ({num(one_a2a, ',.0f', lang)} bytes), "
                             "gewogen met de gates; een gedropt token gaat alleen via de residu-verbinding.")),
         lambda t: home[t], lambda t: "full" if fit[t] else "lost", lambda t: f"y{t}")
    sent += 2 * one_a2a
    total = moe_alltoall_bytes(1, 1, tokens, D, ep, E, MOE["top_k"], MOE["capacity_factor"])
    snap(words(lambda lang: (f"Backward runs the same two all-to-alls on the gradients: rank 0 sent "
                             f"{num(sent, ',.0f', lang)} bytes this step, 4 · (ep−1)/ep · E · C · D · 4 = "
                             f"{num(total, ',.0f', lang)}." if lang == "en" else
                             f"De backward doet dezelfde twee all-to-alls op de gradiënten: rank 0 stuurde "
                             f"{num(sent, ',.0f', lang)} bytes deze stap, 4 · (ep−1)/ep · E · C · D · 4 = "
                             f"{num(total, ',.0f', lang)}.")),
         lambda t: home[t], lambda t: "full" if fit[t] else "lost", lambda t: f"y{t}", False)
    return {"name": "moe-route", "ep": ep, "tokens": tokens, "routes": R, "moe": MOE,
            "title": _w(f"Tokens through the all-to-all: {E} experts on {ep} ranks",
                        f"Tokens door de all-to-all: {E} experts op {ep} ranks"),
            "rows": [_w(f"rank {r} (e{per * r}–e{per * r + per - 1})", f"rank {r} (e{per * r}–e{per * r + per - 1})")
                     for r in range(ep)],
            "cols": [_w(f"t{t}", f"t{t}") for t in range(n)],
            "legend": {"own": _w("at home", "thuis"), "shard": _w("at its expert's rank", "bij de rank van zijn expert"),
                       "c": _w("expert computing", "expert rekent"), "full": _w("output home", "uitvoer thuis"),
                       "lost": _w("dropped (over capacity)", "gedropt (boven capaciteit)"), "none": _w("empty", "leeg")},
            "frames": frames, "meter_label": _w("All-to-all bytes rank 0 has sent", "All-to-all-bytes die rank 0 verstuurde")}


# ------------------------------------------------------------------------------------------------

def capstone() -> dict:
    """Each published number of the three capstone runs, with the prediction landing next to it."""
    from minimega.figures.capstone import DATA, QUANTITIES
    data = json.loads(DATA.read_text(encoding="utf-8"))
    band = data["band"]
    rows = [(run, row) for run in data["runs"] for row in run["rows"] if isinstance(row["published"], (int, float))]
    grid = [[cell("future") for _ in range(3)] for _ in rows]
    frames = [frame([list(r) for r in grid], words(lambda lang: (
        f"Three published runs, {len(rows)} published numbers; a prediction counts as close within "
        f"±{num(100 * band, '.0f', lang)} %." if lang == "en" else
        f"Drie gepubliceerde runs, {len(rows)} gepubliceerde getallen; een voorspelling telt als dichtbij binnen "
        f"±{num(100 * band, '.0f', lang)} %.")), (), meter(0, "d", f"/{len(rows)}"))]
    within = 0
    for i, (run, row) in enumerate(rows):
        ok = row["within_band"]
        within += bool(ok)
        pub = ("≤ " if row["at_most"] else "")
        grid[i] = [cell("shard", words(lambda lang: pub + num(row["published"], ",.0f", lang))),
                   cell("full", words(lambda lang: num(row["predicted"], ",.1f", lang))),
                   cell("work" if ok else "lost", words(lambda lang: num(100 * row["error"], "+.1f", lang) + " %"))]
        q = dict(zip(("en", "nl"), QUANTITIES[row["quantity"]]))
        frames.append(frame([list(r) for r in grid], words(lambda lang: (
            f"{run['title']}, {q[lang]}: published {pub}{num(row['published'], ',.0f', lang)}, predicted "
            f"{num(row['predicted'], ',.1f', lang)} ({num(100 * row['error'], '+.1f', lang)} %, "
            + ("within the band)." if ok else "outside the band: the chapter explains why).")
            if lang == "en" else
            f"{run['title']}, {q[lang]}: gepubliceerd {pub}{num(row['published'], ',.0f', lang)}, voorspeld "
            f"{num(row['predicted'], ',.1f', lang)} ({num(100 * row['error'], '+.1f', lang)} %, "
            + ("binnen de band)." if ok else "buiten de band: het hoofdstuk legt uit waarom)."))),
            [(i, c) for c in range(3)], meter(within, "d", f"/{len(rows)}")))
    return {"name": "capstone", "summary": data["summary"],
            "title": _w("Three predictions next to the published numbers", "Drie voorspellingen naast de gepubliceerde getallen"),
            "rows": [words(lambda lang, run=run, row=row: f"{run['title']}: " + QUANTITIES[row["quantity"]][lang == "nl"])
                     for run, row in rows],
            "cols": [_w("published", "gepubliceerd"), _w("predicted", "voorspeld"), _w("error", "fout")],
            "legend": {"shard": _w("published", "gepubliceerd"), "full": _w("predicted", "voorspeld"),
                       "work": _w("within the band", "binnen de band"), "lost": _w("outside the band", "buiten de band"),
                       "future": _w("not yet", "nog niet")},
            "frames": frames, "meter_label": _w("Within the band", "Binnen de band")}
