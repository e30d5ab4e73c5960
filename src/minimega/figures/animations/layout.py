"""Chapters 9, 11, 14, 16 and 17: who talks to whom, one unit's life, settings, tokens and results.

    grid-3d        dp = tp = pp = 2: the 8 ranks on the grid (`ParallelDims.rank_of`) and the groups that talk
                   in each phase of a step (`ParallelDims.group_ranks`)
    fsdp-unit      one block of the recorded tiny GPT through a ZeRO-3 / FSDP2 step: `zero.stage3.UnitState`
    settings-flow  one run's settings, field by field, into DeepSpeed's JSON, Megatron-LM's flags and torchtitan's
                   TOML, read back from the exporters' output (`tools.export_table.TABLE` names the keys)
    moe-route      8 tokens on 2 ranks through the router (`moe.MoELayer.select`), capacity (`assign_slots`), the
                   dispatch all-to-all, the experts and the combine
    capstone       course/data/capstone.json: each prediction next to its published number
"""
from __future__ import annotations

from minimega import estimate as est
from minimega.figures.animations._base import _w, bytes_meter, cell, frame, meter, words
from minimega.figures.animations.zero import zero_units
from minimega.figures.words import num

GROUP = "ABCDEFGH"

# ------------------------------------------------------------------------------------------------

PHASES = (("tp", "fwd", _w("Forward: the tensor-parallel pairs all-reduce inside every layer (Megatron's g).",
                          "Forward: de tensor-parallelle paren doen een all-reduce in elke laag (Megatrons g).")),
          ("pp", "fwd", _w("Forward: stage 0 sends each micro-batch's activations to stage 1 (send/recv).",
                          "Forward: stage 0 stuurt de activaties van elke micro-batch naar stage 1 (send/recv).")),
          ("pp", "bwd", _w("Backward: stage 1 sends the activation gradients back to stage 0.",
                          "Backward: stage 1 stuurt de activatiegradiënten terug naar stage 0.")),
          ("tp", "bwd", _w("Backward: the tensor-parallel pairs all-reduce the input gradients (Megatron's f).",
                          "Backward: de tensor-parallelle paren doen een all-reduce van de inputgradiënten (Megatrons f).")),
          ("dp", "step", _w("Gradient sync: the ranks holding the same weights all-reduce their gradients.",
                           "Gradiëntsync: de ranks met dezelfde gewichten doen een all-reduce van hun gradiënten.")))


def grid_3d(dp: int = 2, tp: int = 2, pp: int = 2) -> dict:
    """Rows (pp stage, dp replica), columns tp rank; each phase marks every member of the groups that talk."""
    from minimega.mesh import ParallelDims
    dims = ParallelDims(dp=dp, tp=tp, pp=pp)
    where = {dims.rank_of(s, d, t): (s * dp + d, t) for s in range(pp) for d in range(dp) for t in range(tp)}
    base = [[None] * tp for _ in range(pp * dp)]
    for rank, (r, c) in where.items():
        base[r][c] = rank
    frames = [frame([[cell("none", f"r{base[r][c]}") for c in range(tp)] for r in range(pp * dp)], _w(
        f"{dims.world_size} ranks = pp {pp} × dp {dp} × tp {tp}; rank = (stage · dp + replica) · tp + tp rank.",
        f"{dims.world_size} ranks = pp {pp} × dp {dp} × tp {tp}; rank = (stage · dp + replica) · tp + tp-rank."),
        (), meter(0, "d"), groups=[])]
    for dim, _, cap in PHASES:
        groups = dims.group_ranks(dim)
        cells = [[cell("none", f"r{base[r][c]}") for c in range(tp)] for r in range(pp * dp)]
        for g, members in enumerate(groups):
            for rank in members:
                r, c = where[rank]
                cells[r][c] = cell(dim, f"r{rank}·{GROUP[g]}")
        listed = "; ".join(f"{GROUP[g]} {members}" for g, members in enumerate(groups))
        frames.append(frame(cells, {k: f"{v} {dim} groups: {listed}." if k == "en" else f"{v} {dim}-groepen: {listed}."
                                    for k, v in cap.items()},
                            [where[r] for m in groups for r in m], meter(len(groups), "d"), groups=groups, dim=dim))
    return {"name": "grid-3d", "dp": dp, "tp": tp, "pp": pp,
            "title": _w(f"3D parallelism: {dims.world_size} ranks and who talks to whom",
                        f"3D-parallellisme: {dims.world_size} ranks en wie met wie praat"),
            "rows": [_w(f"stage {s} · replica {d}", f"stage {s} · replica {d}") for s in range(pp) for d in range(dp)],
            "cols": [_w(f"tp {t}", f"tp {t}") for t in range(tp)],
            "legend": {"tp": _w("tensor-parallel group", "tensor-parallelle groep"), "pp": _w("pipeline pair", "pipelinepaar"),
                       "dp": _w("data-parallel group", "data-parallelle groep"), "none": _w("quiet", "stil")},
            "frames": frames, "meter_label": _w("Groups talking at once", "Groepen die tegelijk praten")}


# ------------------------------------------------------------------------------------------------

def fsdp_unit(unit: str = "blocks.1", dp: int = 2) -> dict:
    """One unit through a step under ZeRO-3 (FSDP2's life cycle): its `UnitState`, its parameters and gradients."""
    from minimega.zero.stage3 import UnitState
    n = next(u["padded"] for u in zero_units() if u["name"] == unit)
    p, g, k = est.state_bytes_per_param("mixed")
    S, G_, U = UnitState.SHARDED.value, UnitState.GATHERING.value, UnitState.UNSHARDED.value
    life = [  # state, params held, grads held, collective, words
        (S, "shard", "none", None, _w("At rest: only this rank's 1/N_d of the unit exists.",
                                      "In rust: alleen de 1/N_d van deze rank bestaat.")),
        (G_, "full", "none", "all_gather", _w("Prefetch while the unit before computes: storage for the whole unit, "
                                              "all-gather in flight.", "Prefetch terwijl de unit ervoor rekent: "
                                              "geheugen voor de hele unit, all-gather onderweg.")),
        (U, "full", "none", None, _w("Unsharded: the forward runs on the whole parameters.",
                                     "Unsharded: de forward draait op de hele parameters.")),
        (S, "shard", "none", None, _w("Resharded after the forward: the gathered copy is freed.",
                                      "Na de forward weer sharded: de verzamelde kopie wordt vrijgegeven.")),
        (G_, "full", "none", "all_gather", _w("Backward prefetch: gathered again.", "Prefetch voor de backward: opnieuw verzameld.")),
        (U, "full", "full", None, _w("Backward: the whole gradient of the unit appears.",
                                     "Backward: de hele gradiënt van de unit verschijnt.")),
        (S, "shard", "shard", "reduce_scatter", _w("Reduce-scatter: each rank keeps the sum of its shard; parameters "
                                                   "resharded.", "Reduce-scatter: elke rank houdt de som van zijn "
                                                   "shard; parameters weer sharded.")),
        (S, "shard", "none", None, _w("Optimizer step on the shard; the gradient shard is freed.",
                                      "Optimizer-stap op de shard; de gradiëntshard wordt vrijgegeven.")),
    ]
    share = {"full": 1.0, "shard": 1 / dp, "none": 0.0}
    frames = []
    for i, (state, P, G, op, cap) in enumerate(life):
        held = n * (p * share[P] + g * share[G] + k / dp)
        cells = [[cell("gpu" if state == U else "moving" if state == G_ else "none", state) for _ in range(dp)],
                 [cell(P, "■" if P == "full" else "½") for _ in range(dp)],
                 [cell(G, {"full": "■", "shard": "½"}.get(G, "·")) for _ in range(dp)]]
        extra = words(lambda lang: (f" {op.replace('_', '-')} of {num(n, ',', lang)} elements." if lang == "en" else
                                    f" {op.replace('_', '-')} van {num(n, ',', lang)} elementen.") if op else "")
        frames.append(frame(cells, {k_: f"{unit}: {v}{extra[k_]}" for k_, v in cap.items()},
                            [(r, c) for r in range(3) for c in range(dp)] if i else (), bytes_meter(held),
                            state=state, comm={"op": op, "elements": n} if op else None))
    return {"name": "fsdp-unit", "unit": unit, "dp": dp, "numel": n,
            "title": _w(f"The life of one FSDP unit ({unit}) in one step, dp = {dp}",
                        f"Het leven van één FSDP-unit ({unit}) in één stap, dp = {dp}"),
            "rows": [_w("UnitState", "UnitState"), _w("parameters (16-bit)", "parameters (16-bit)"),
                     _w("gradients", "gradiënten")],
            "cols": [_w(f"rank {r}", f"rank {r}") for r in range(dp)],
            "legend": {"full": _w("whole unit", "hele unit"), "shard": _w("1/N_d shard", "shard van 1/N_d"),
                       "gpu": _w("unsharded", "unsharded"), "moving": _w("gathering", "gathering"),
                       "none": _w("sharded / not held", "sharded / niet aanwezig")},
            "frames": frames, "meter_label": _w(f"Bytes of {unit} on rank 0 (P, G, O)", f"Bytes van {unit} op rank 0 (P, G, O)")}
