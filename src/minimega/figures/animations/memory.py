"""Chapters 1, 5, 6 and 11, where memory is the point: every frame carries the bytes on one rank.

    memory-stack   GPT-2 124M on 4 ranks: parameters, gradients, optimizer states, activations stack up
                   (`estimate.state_bytes_per_param`, `activation_bytes_per_layer`), then ZeRO 1-3 split them
                   (`model_state_breakdown`)
    offload-nvme   the recorded tiny GPT's units under ZeRO-2 with the optimizer on NVMe: where each unit's
                   states live (`nvme_placement`) and what moves per unit in the backward and the step
    recompute      GPT-2 124M, full recomputation: the layer inputs kept, each layer rebuilt in the backward
                   (`activation_bytes_per_layer(recompute="full")`, `recompute_working_bytes`)
    fsdp-unit      one unit's life under ZeRO-3 / FSDP2: `zero.stage3.UnitState` from gather to reshard
"""
from __future__ import annotations

from minimega import estimate as est
from minimega.figures.animations._base import _w, bytes_meter, cell, frame, size, words
from minimega.figures.animations.zero import zero_units

GPT2 = dict(n_layer=12, hidden=768, heads=12, vocab=50257, seq=1024, micro_batch=8)


def gpt2_params() -> int:
    g = GPT2
    return est.gpt_params(g["n_layer"], g["hidden"], g["vocab"], g["seq"])


def gpt2_layer_activations(recompute: str = "none") -> float:
    g = GPT2
    return est.activation_bytes_per_layer(g["seq"], g["micro_batch"], g["hidden"], g["heads"], recompute=recompute)


# ------------------------------------------------------------------------------------------------

def memory_stack(dp: int = 4, precision: str = "mixed") -> dict:
    """Bytes per rank of GPT-2 124M's four kinds of memory, stacked one kind per frame, then split by ZeRO."""
    n, acts = gpt2_params(), GPT2["n_layer"] * gpt2_layer_activations()
    p, g, k = est.state_bytes_per_param(precision)
    kinds = ("param", "grad", "optim", "act")
    held = {kind: [0.0] * dp for kind in kinds}
    frames = []

    def snap(caption, row=None):
        cells = [[cell(kind if held[kind][r] else "none", words(lambda lang, b=held[kind][r]: size(b, lang)) if held[kind][r]
                       else "·") for r in range(dp)] for kind in kinds]
        frames.append(frame(cells, caption, [(row, r) for r in range(dp)] if row is not None else (),
                            bytes_meter(sum(held[kind][0] for kind in kinds))))

    snap(words(lambda lang: (f"GPT-2 124M ({n / 1e6:.0f} M parameters) on {dp} ranks, before training: nothing held."
                             if lang == "en" else
                             f"GPT-2 124M ({n / 1e6:.0f} M parameters) op {dp} ranks, voor de training: nog niets.")))
    steps = [("param", p * n, ("16-bit parameters: {b} bytes × Ψ = {v} on every rank.",
                               "16-bit-parameters: {b} bytes × Ψ = {v} op elke rank.")),
             ("grad", g * n, ("Gradients, {b} bytes × Ψ = {v}, filled by the backward.",
                              "Gradiënten, {b} bytes × Ψ = {v}, gevuld door de backward.")),
             ("optim", k * n, ("Adam's fp32 master, momentum and variance: K = {b} bytes × Ψ = {v}.",
                               "Adams fp32-master, momentum en variantie: K = {b} bytes × Ψ = {v}.")),
             ("act", acts, ("Activations for the backward, s = {s}, b = {mb}: {L} layers × {per} = {v}, more than "
                            "all model states together.",
                            "Activaties voor de backward, s = {s}, b = {mb}: {L} lagen × {per} = {v}, meer dan "
                            "alle modelstates samen."))]
    for row, (kind, b, (en, nl)) in enumerate(steps):
        held[kind] = [b] * dp
        per_param = b / n
        snap(words(lambda lang: (en if lang == "en" else nl).format(
            b=f"{per_param:.0f}", v=size(b, lang), s=GPT2["seq"], mb=GPT2["micro_batch"], L=GPT2["n_layer"],
            per=size(gpt2_layer_activations(), lang))), row)
    for stage in (1, 2, 3):
        split = est.model_state_breakdown(n, dp, stage, precision)
        for kind, key in (("param", "params"), ("grad", "grads"), ("optim", "optimizer")):
            held[kind] = [split[key]] * dp
        total = est.model_state_bytes(n, dp, stage, precision)
        what = {1: _w("the optimizer states", "de optimizer-states"),
                2: _w("the gradients too", "ook de gradiënten"), 3: _w("the parameters too", "ook de parameters")}[stage]
        snap(words(lambda lang: (f"ZeRO-{stage} shards {what[lang]} over N_d = {dp}: model states {size(total, lang)} "
                                 "per rank; the activations stay." if lang == "en" else
                                 f"ZeRO-{stage} shardt {what[lang]} over N_d = {dp}: modelstates {size(total, lang)} "
                                 "per rank; de activaties blijven.")), {1: 2, 2: 1, 3: 0}[stage])
    legend = {"param": _w("parameters", "parameters"), "grad": _w("gradients", "gradiënten"),
              "optim": _w("optimizer states", "optimizer-states"), "act": _w("activations", "activaties"),
              "none": _w("nothing yet", "nog niets")}
    return {"name": "memory-stack", "dp": dp, "n_params": n, "precision": precision,
            "title": _w(f"Where the bytes go: GPT-2 124M on {dp} ranks", f"Waar de bytes heen gaan: GPT-2 124M op {dp} ranks"),
            "rows": [legend[k] for k in kinds], "cols": [_w(f"rank {r}", f"rank {r}") for r in range(dp)],
            "legend": legend, "frames": frames, "meter_label": _w("Bytes on rank 0", "Bytes op rank 0")}


# ------------------------------------------------------------------------------------------------

def offload_nvme(dp: int = 2, stage: int = 2, precision: str = "mixed") -> dict:
    """Per unit of the recorded tiny GPT: GPU, host and NVMe bytes under ZeRO-Infinity's optimizer on NVMe."""
    units = zero_units()
    names = [u["name"] for u in units]
    place = {u["name"]: est.nvme_placement(u["padded"], dp, stage, precision) for u in units}
    io = {u["name"]: est.nvme_bytes_per_step(u["padded"], dp, stage) for u in units}
    p, g, _ = est.state_bytes_per_param(precision)
    gpu_rest = sum(pl["params"] + pl["grads"] for pl in place.values())
    rows = ("gpu", "cpu", "nvme")
    frames = []

    def snap(caption, active=(), extra=0.0, where=None):
        where = where or {}
        cells = [[cell(where.get((row, n), row), words(lambda lang, b=place[n][key]: size(b, lang)))
                  for n in names] for row, key in (("gpu", "params"), ("cpu", "cpu"), ("nvme", "nvme"))]
        frames.append(frame(cells, caption, active, bytes_meter(gpu_rest + extra)))

    total = {k: sum(pl[k] for pl in place.values()) for k in ("params", "cpu", "nvme")}
    snap(words(lambda lang: (f"At rest, rank 0 of {dp}: 16-bit parameters on the GPU ({size(total['params'], lang)}), "
                             f"its fp32 gradient shards in host memory ({size(total['cpu'], lang)}), master weights "
                             f"and Adam's states on NVMe ({size(total['nvme'], lang)})." if lang == "en" else
                             f"In rust, rank 0 van {dp}: 16-bit-parameters op de GPU ({size(total['params'], lang)}), "
                             f"fp32-gradiëntshards in het hostgeheugen ({size(total['cpu'], lang)}), masterweights en "
                             f"Adams states op NVMe ({size(total['nvme'], lang)}).")))
    for k, n in reversed(list(enumerate(names))):
        grad = g * next(u["padded"] for u in units if u["name"] == n)
        snap(words(lambda lang: (f"Backward, {n}: its gradient ({size(grad, lang)}) is reduce-scattered on the GPU; "
                                 "the shard goes down to the host and is summed there in fp32." if lang == "en" else
                                 f"Backward, {n}: de gradiënt ({size(grad, lang)}) wordt op de GPU gereduce-scatterd; "
                                 "de shard gaat naar de host en wordt daar in fp32 opgeteld.")),
             [(0, k), (1, k)], grad, {("gpu", n): "gpu", ("cpu", n): "moving"})
    for k, n in enumerate(names):
        read, up = io[n]["read"], p * next(u["padded"] for u in units if u["name"] == n) / dp
        snap(words(lambda lang: (f"Step, {n}: read {size(read, lang)} of master and Adam states from NVMe, Adam on "
                                 f"the CPU, write them back; the updated 16-bit shard ({size(up, lang)}) goes up to "
                                 "the GPU." if lang == "en" else
                                 f"Stap, {n}: lees {size(read, lang)} master en Adam-states van NVMe, Adam op de CPU, "
                                 f"terugschrijven; de bijgewerkte 16-bit-shard ({size(up, lang)}) gaat naar de GPU.")),
             [(0, k), (1, k), (2, k)], 0.0, {("nvme", n): "moving", ("cpu", n): "moving", ("gpu", n): "moving"})
    return {"name": "offload-nvme", "dp": dp, "stage": stage, "precision": precision,
            "title": _w(f"ZeRO-{stage} with the optimizer on NVMe: rank 0 of {dp}, unit by unit",
                        f"ZeRO-{stage} met de optimizer op NVMe: rank 0 van {dp}, unit per unit"),
            "rows": [_w("GPU", "GPU"), _w("CPU (host)", "CPU (host)"), _w("NVMe", "NVMe")],
            "cols": [_w(n, n) for n in names],
            "legend": {"gpu": _w("on the GPU", "op de GPU"), "cpu": _w("in host memory", "in hostgeheugen"),
                       "nvme": _w("on NVMe", "op NVMe"), "moving": _w("moving now", "nu in beweging")},
            "frames": frames, "meter_label": _w("Bytes on rank 0's GPU", "Bytes op de GPU van rank 0")}


# ------------------------------------------------------------------------------------------------

def recompute() -> dict:
    """Full recomputation on GPT-2 124M: each layer keeps its input; the backward rebuilds one layer at a time."""
    L = GPT2["n_layer"]
    kept_b, inside_b = gpt2_layer_activations("full"), est.recompute_working_bytes(
        GPT2["seq"], GPT2["micro_batch"], GPT2["hidden"], GPT2["heads"], recompute="full")
    kept, inside = [False] * L, ["none"] * L
    frames = []

    def snap(caption, active=()):
        cells = [[cell("kept" if kept[l] else "none", "■" if kept[l] else "·") for l in range(L)],
                 [cell(inside[l], {"work": "F", "rebuilt": "R"}.get(inside[l], "·")) for l in range(L)]]
        held = sum(kept) * kept_b + sum(s != "none" for s in inside) * inside_b
        frames.append(frame(cells, caption, active, bytes_meter(held)))

    snap(words(lambda lang: (f"GPT-2 124M, s = {GPT2['seq']}, b = {GPT2['micro_batch']}, full recomputation. Without "
                             f"it the {L} layers would keep {size(L * inside_b, lang)} for the backward." if lang == "en"
                             else f"GPT-2 124M, s = {GPT2['seq']}, b = {GPT2['micro_batch']}, volledige herberekening. "
                             f"Zonder houden de {L} lagen {size(L * inside_b, lang)} vast voor de backward.")))
    for l in range(L):
        kept[l], inside[l] = True, "work"
        if l:
            inside[l - 1] = "none"
        snap(words(lambda lang: (f"Forward, layer {l + 1}: keep its input ({size(kept_b, lang)}, 2sbh), compute "
                                 f"inside it ({size(inside_b, lang)}) and drop that right after." if lang == "en" else
                                 f"Forward, laag {l + 1}: bewaar de invoer ({size(kept_b, lang)}, 2sbh), reken erin "
                                 f"({size(inside_b, lang)}) en laat dat meteen los.")), [(0, l), (1, l)])
    inside[L - 1] = "none"
    for l in reversed(range(L)):
        inside[l] = "rebuilt"
        if l < L - 1:
            inside[l + 1], kept[l + 1] = "none", False
        snap(words(lambda lang: (f"Backward, layer {l + 1}: rerun its forward from the kept input, rebuilding "
                                 f"{size(inside_b, lang)}, then take its gradient and free it." if lang == "en" else
                                 f"Backward, laag {l + 1}: herhaal de forward vanaf de bewaarde invoer, "
                                 f"{size(inside_b, lang)} opnieuw, neem de gradiënt en geef het vrij.")), [(1, l)])
    inside[0], kept[0] = "none", False
    snap(words(lambda lang: (f"Done. The peak was {size(L * kept_b + inside_b, lang)} instead of "
                             f"{size(L * inside_b, lang)}, for one more forward of compute." if lang == "en" else
                             f"Klaar. De piek was {size(L * kept_b + inside_b, lang)} in plaats van "
                             f"{size(L * inside_b, lang)}, voor één forward extra rekenwerk.")))
    return {"name": "recompute", "n_layer": L, "kept_bytes": kept_b, "working_bytes": inside_b,
            "title": _w(f"Full recomputation, GPT-2 124M: {L} layers", f"Volledige herberekening, GPT-2 124M: {L} lagen"),
            "rows": [_w("layer input (kept)", "laaginvoer (bewaard)"), _w("inside the layer", "binnen de laag")],
            "cols": [_w(str(l + 1), str(l + 1)) for l in range(L)], "compact": True,
            "legend": {"kept": _w("kept", "bewaard"), "work": _w("computed, then dropped", "berekend, dan losgelaten"),
                       "rebuilt": _w("rebuilt for the backward", "herbouwd voor de backward"),
                       "none": _w("not held", "niet aanwezig")},
            "frames": frames, "meter_label": _w("Activation bytes on this rank", "Activatiebytes op deze rank")}
