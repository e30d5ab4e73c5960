"""The site's step-through animations (minimega.figures.animations) equal the package they picture.

Pipeline grids equal `pipeline.schedules.plan`; the ZeRO phases' collectives equal the `CommLog` of a real
2-rank run (one launch, stages 1 to 3); the ring all-reduce's chunk moves add up to the ring model's bytes;
Megatron's f/g all-reduces to `tp_comm_elements_per_layer`; ring attention's hops to `parallel.context`.
"""
import pytest
import torch

import minimega as mm
from minimega import estimate as est
from minimega.figures import animations as fa
from minimega.parallel.context import chunk_ids, visibility
from minimega.pipeline import schedules


@pytest.mark.parametrize("kind", ["gpipe", "1f1b", "interleaved", "zb_h1"])
def test_pipeline_grid_equals_the_schedule(kind):
    anim = fa.pipeline(kind, p=4, m=8)
    schedule, v = fa.SCHEDULE_OF[kind]
    grid = schedules.plan(schedule, 4, 8, v).grid
    want = [[None if a is None else fa._slot(a, 4, v)["t"] for a in row] for row in grid]
    assert fa.grid_of(anim) == want
    # every action of the schedule, once, on its rank, in the schedule's order
    for r, row in enumerate(grid):
        assert [a for a in row if a is not None] == schedules.ORDERS[schedule](4, 8, v, r)
    assert len(anim["frames"]) == len(grid[0]) + 1                 # one frame per tick, plus the empty grid
    for t, frame in enumerate(anim["frames"]):                    # tick t shows exactly the first t columns
        shown = [sum(c["s"] != "future" for c in row) for row in frame["cells"]]
        assert shown == [t] * 4


def _zero_worker(stages):
    """One step of the tiny GPT per ZeRO stage on dp = 2 (prefetch off, so the log is in program order)."""
    from minimega import data
    mesh = mm.init_mesh(mm.ParallelDims(dp=2))
    cfg = mm.GPTConfig.tiny()
    out = {}
    for stage in stages:
        torch.manual_seed(1)
        config = mm.TrainConfig(batch_size=8, seed=1, zero_stage=stage, prefetch=False) if stage == 3 else \
            mm.TrainConfig(batch_size=8, seed=1, zero_stage=stage)
        engine = mm.initialize(mm.GPT(cfg), config, mesh)
        steps = list(data.batches(mesh, 2, 8, cfg.block_size, seed=1))
        engine.train_step(steps[0])                    # warm-up: the first step's log holds set-up collectives
        start = len(engine.report()["comm_events"])
        engine.train_step(steps[1])
        events = engine.report()["comm_events"][start:]
        out[stage] = {"events": [(e["op"], e["tag"], e["elements"]) for e in events if e["group"].startswith("dp")],
                      "units": [{"name": u.name, "numel": u.numel, "padded": u.padded} for u in engine.wrapper.units]}
    return out


@pytest.fixture(scope="module")
def zero_runs():
    return mm.launch(_zero_worker, 2, (1, 2, 3))


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_zero_phases_equal_a_recorded_commlog(zero_runs, stage):
    for rank in zero_runs:
        run = rank[stage]
        assert run["units"] == fa.zero_units()              # the animation's units are the recorded run's
        assert fa.zero_comm(fa.zero(stage)) == run["events"], f"rank's CommLog under stage {stage}"


def test_zero3_gathers_before_use_and_frees_after():
    anim = fa.zero(3)
    names = [u["name"] for u in fa.zero_units()]
    first, last = anim["frames"][0]["cells"], anim["frames"][-1]["cells"]
    assert all(c["s"] == "shard" for row in (first[0], first[2]) for c in row)          # at rest: shards only
    assert all(c["s"] == "shard" for c in last[0]) and all(c["s"] == "none" for c in last[1])
    for f in anim["frames"]:                          # never more than one unit whole outside its gather window
        whole = [names[k] for k, c in enumerate(f["cells"][0]) if c["s"] == "full"]
        assert len(whole) <= 1
        if f.get("comm") and f["comm"]["op"] == "all_gather":
            assert whole == [f["comm"]["tag"]]
    gathers = [f["comm"]["tag"] for f in anim["frames"] if f.get("comm") and f["comm"]["op"] == "all_gather"]
    assert gathers == names + names[::-1]              # twice per step: forward, then backward in reverse


@pytest.mark.parametrize("n", [2, 4, 8])
def test_ring_all_reduce_moves_equal_the_ring_model(n):
    size = 3 * 2**20
    anim = fa.ring_all_reduce(n, size)
    moves = [mv for f in anim["frames"] for mv in f["moves"]]
    assert len(anim["frames"]) - 1 == 2 * (n - 1)                                   # ring_time's step count
    for r in range(n):
        sent = sum(mv["bytes"] for mv in moves if mv["from"] == r)
        assert sent == pytest.approx(est.ring_bytes("all_reduce", size, n))
        assert {mv["to"] for mv in moves if mv["from"] == r} == {(r + 1) % n}       # only to the next rank
    for f in anim["frames"][1:]:                      # each step: every rank sends exactly one chunk
        assert sorted(mv["from"] for mv in f["moves"]) == list(range(n))
    rs = [f for f in anim["frames"] if f["phase"] == "reduce_scatter"][-1]
    assert sorted((r, c) for r, row in enumerate(rs["cells"]) for c, cell in enumerate(row)
                  if cell["s"] == "full") == [(r, (r + 1) % n) for r in range(n)]   # one summed chunk each
    assert all(c["s"] == "full" for row in anim["frames"][-1]["cells"] for c in row)


def test_megatron_fg_equals_the_tp_model():
    anim = fa.megatron_fg(tp=2, seq=64, micro_batch=8, hidden=64)
    comms = [f["comm"] for f in anim["frames"] if f.get("comm")]
    assert [(c["region"], c["pass"]) for c in comms] == [("g", "fwd"), ("g", "fwd"), ("f", "bwd"), ("f", "bwd")]
    sent = sum(est.ring_bytes(c["op"], c["elements"], 2) for c in comms)
    assert sent == est.tp_comm_elements_per_layer(64, 8, 64, 2)
    # the regions' directions are the package's: f forward and g backward are identities
    from minimega.parallel import tensor as tp
    assert "Forward: identity. Backward: all-reduce" in tp._CopyToTP.__doc__ and "`f`" in tp._CopyToTP.__doc__
    assert "Forward: all-reduce (sum) over tp. Backward: identity" in tp._ReduceFromTP.__doc__


@pytest.mark.parametrize("cp", [2, 4])
def test_ring_attention_hops_equal_context_parallel(cp):
    anim = fa.ring_attention(cp)
    assert len(anim["frames"]) == cp + 1
    for hop, frame in enumerate(anim["frames"][1:]):
        for r in range(cp):
            assert {c for rr, c in frame["active"] if rr == r} == set(chunk_ids((r - hop) % cp, cp))
            for kc in chunk_ids((r - hop) % cp, cp):
                modes = {visibility(q, kc) for q in chunk_ids(r, cp)}
                state = frame["cells"][r][kc]["s"]
                assert state == ("causal" if "causal" in modes else "full" if "full" in modes else "masked")
    final = anim["frames"][-1]["cells"]
    assert all(c["s"] != "none" for row in final for c in row)                      # every rank saw every chunk


@pytest.mark.parametrize("lang", ["en", "nl"])
def test_every_animation_has_its_words_in_both_languages(lang):
    for name in fa.BUILDERS:
        anim = fa.animation(name, lang)
        texts = [anim["title"]] + [f["caption"] for f in anim["frames"]] + anim["rows"] + anim["cols"]
        assert all(isinstance(t, str) and t for t in texts), name
        assert all(isinstance(v, str) for v in anim["legend"].values()), name
        states = {c["s"] for f in anim["frames"] for row in f["cells"] for c in row}
        assert states <= set(anim["legend"]) | {"future"}, (name, states - set(anim["legend"]))
