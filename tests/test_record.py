"""The recorded traces under course/data: their numbers against the formulas, and a fresh recording's schema."""
import argparse
import json
from pathlib import Path

import pytest

from minimega import estimate as est
from minimega.figures import record
from minimega.tools import record_cli

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "course" / "data"
TINY_PARAMS = est.gpt_params(4, 64, 256, 64, tied=False, bias=False)


@pytest.fixture(scope="module")
def traces():
    return {name: record.load(name, DATA) for name in record.TRACES}


def test_ddp_trace_bytes_are_the_ring_all_reduce_of_4_psi(traces):
    tr = traces["ddp-overlap"]
    n = tr["source"]["world_size"]
    assert tr["n_params"] == TINY_PARAMS
    assert sum(b["numel"] for b in tr["buckets"]) == TINY_PARAMS          # every parameter in one bucket
    want = est.ring_bytes("all_reduce", 4 * TINY_PARAMS, n)                # 2(n-1)/n · 4Ψ
    for rank in tr["ranks"]:
        assert rank["sent_bytes_per_step"] == [want] * tr["source"]["steps"]
        for st in rank["steps"]:
            assert sum(b["bytes"] for b in st["buckets"]) == 4 * TINY_PARAMS
            assert sum(b["sent_bytes"] for b in st["buckets"]) == pytest.approx(want, rel=1e-12)
            assert sorted(b["index"] for b in st["buckets"]) == list(range(len(tr["buckets"])))
            # overlap: every bucket is issued inside the backward, and the first well before the last gradient
            issued = [b["issued"] for b in st["buckets"]]
            assert all(st["backward_start"] <= t <= st["grads_synced"] for t in issued)
            assert min(issued) < max(issued) <= st["backward_end"]
            assert st["forward_start"] < st["backward_start"] < st["backward_end"] <= st["optimizer_step_end"]


def test_memory_trace_is_16_bytes_per_parameter_under_ddp_and_split_under_tp(traces):
    tr = traces["memory"]
    dp, tp = tr["layouts"]
    n_tensors = 4 * 6 + 4           # per block: ln_1, qkv, proj, ln_2, fc, proj (no biases); wte, wpe, ln_f, head
    ddp = est.model_state_breakdown(TINY_PARAMS, 1, 0, "fp32")
    for r in dp["ranks"]:
        held = r["after_backward"]
        assert held["params"] == ddp["params"] and held["grads"] == ddp["grads"]
        assert held["optimizer_states"] == ddp["optimizer"]                  # Adam's m and v: 8 bytes/param
        assert held["optimizer_step_counters"] == 4 * n_tensors              # Adam's fp32 step, one per tensor
        assert r["after_step"]["grads"] == 0                                   # zero_grad(set_to_none=True)
    # tp = 2: blocks' matrices, the vocabulary-split embedding and head halve; LayerNorms and wpe stay whole
    t, (L, h, V, s) = tp["tp"], (4, 64, 256, 64)
    local = L * (12 * h * h // t + 2 * h) + 2 * (V // t) * h + s * h + h
    for r in tp["ranks"]:
        assert r["local_params"] == local
        assert r["after_backward"]["params"] == r["after_backward"]["grads"] == 4 * local


def test_tp_trace_sends_8bsh_per_block_and_the_collectives_of_each_mode(traces):
    tr = traces["tp-comm"]
    sh = tr["shape"]
    per_block = 4 * est.tp_comm_elements_per_layer(sh["s"], sh["b"], sh["h"], 2)
    for lay in tr["layouts"]:
        for rank in lay["ranks"]:
            rows = rank["per_step"]
            for i in range(sh["layers"]):
                mine = [r for r in rows if r["region"] == f"block {i}"]
                assert sum(r["sent_bytes"] for r in mine) == per_block
                want_ops = {"all_gather", "reduce_scatter"} if lay["sequence_parallel"] else {"all_reduce"}
                assert {r["op"] for r in mine} == want_ops
                for phase in ("forward", "backward"):
                    assert sum(r["calls"] for r in mine if r["phase"] == phase) == (4 if lay["sequence_parallel"] else 2)
            # the per-layer split accounts for everything the rank sent in a step
            assert sum(r["sent_bytes"] for r in rows) == pytest.approx(rank["sent_bytes_per_step"][0], rel=1e-12)
            assert set(rank["sent_bytes_per_step"]) == {rank["sent_bytes_per_step"][0]}


def test_activation_trace_matches_the_formula(traces):
    tr = traces["activations"]
    sh = tr["shape"]
    assert {(r["tp"], r["sp"], r["mode"]) for r in tr["rows"]} == {
        (t, sp, m) for t, sp in ((1, False), (2, False), (2, True)) for m in est.RECOMPUTE}
    for r in tr["rows"]:
        want = est.gpt_activation_bytes_per_layer(sh["s"], sh["b"], sh["h"], sh["a"], tp=r["tp"], sp=r["sp"],
                                                  recompute=r["mode"], act_bytes=4, dropout=True, attention="math")
        assert r["formula"] == want
        assert r["measured"] == want, r


def test_zero_memory_trace_is_the_padded_closed_form_per_stage(traces):
    tr = traces["zero-memory"]
    dp = tr["source"]["dp"]
    assert [s["stage"] for s in tr["stages"]] == [0, 1, 2, 3]
    assert tr["n_params"] == TINY_PARAMS
    measured_total = []
    for s in tr["stages"]:
        numels = [u["numel"] for u in s["units"]]
        assert sum(numels) == TINY_PARAMS
        if s["stage"]:
            # one flat buffer per unit: embeddings, 4 blocks, head; each padded to a multiple of dp
            assert [u["name"] for u in s["units"]] == ["embed", *(f"blocks.{i}" for i in range(4)), "head"]
            assert all(u["padded"] == est.padded_numel(u["numel"], dp) for u in s["units"])
        psi = sum(u["padded"] for u in s["units"])
        want = est.model_state_breakdown(psi, dp, s["stage"], "fp32")
        for r in s["ranks"]:
            m = r["memory_at_step"]
            assert m["params"] == want["params"], (s["stage"], r["rank"])
            assert m["grads"] == want["grads"], (s["stage"], r["rank"])
            assert m["optimizer_states"] == want["optimizer"], (s["stage"], r["rank"])
            assert m.get("master", 0) == 0                       # fp32: the shards are their own master
            assert m["params"] + m["grads"] + m["optimizer_states"] == \
                est.model_state_bytes_padded(numels, dp, s["stage"], "fp32")
        measured_total.append(sum(v for k, v in s["ranks"][0]["memory_at_step"].items() if k != "optimizer_step_counters"))
    assert measured_total == sorted(measured_total, reverse=True) and len(set(measured_total)) == 4


def test_zero3_prefetch_issues_the_next_gather_before_the_unit_computes(traces):
    tr = traces["zero-prefetch"]
    dp = tr["source"]["dp"]
    names = [u["name"] for u in tr["units"]]
    psi = sum(u["padded"] for u in tr["units"])
    for rank in tr["ranks"]:
        assert len(rank["steps"]) == tr["source"]["steps"]
        for st in rank["steps"]:
            units = st["units"]
            assert [u["unit"] for u in units] == names
            # the forward gathers every parameter once: Ψ_pad elements, ring cost (dp-1)/dp of its bytes
            assert sum(u["elements"] for u in units) == psi
            assert sum(u["sent_bytes"] for u in units) == pytest.approx(est.ring_bytes("all_gather", 4 * psi, dp))
            assert units[0]["prefetch"] is False and all(u["prefetch"] for u in units[1:])
            for prev, u in zip(units, units[1:]):
                assert u["issued"] < prev["forward_end"]        # in flight while the previous unit computes
                assert u["issued"] <= prev["forward_start"]
                assert prev["forward_end"] <= u["waited"] <= u["forward_start"]
            for u in units:
                assert u["issued"] <= u["waited"] <= u["forward_start"] < u["forward_end"] <= st["backward_start"]


def test_pipeline_trace_has_the_bubble_of_the_formula(traces):
    tr = traces["pipeline"]
    p, m = tr["p"], tr["m"]
    from minimega.pipeline.schedules import plan
    assert [s["schedule"] for s in tr["schedules"]] == ["gpipe", "1f1b"]
    for sch in tr["schedules"]:
        grid = plan(sch["schedule"], p, m).grid
        for r in sch["ranks"]:
            assert r["grid"] == [str(a) if a else None for a in grid[r["rank"]]]
            b = r["bubble"]
            assert b["ticks"] == 2 * (m + p - 1) and b["busy"] == 2 * m
            assert b["idle_of_total"] == pytest.approx(est.bubble_fraction(p, m, sch["schedule"]))
            assert b["idle_of_total"] == pytest.approx((p - 1) / (m + p - 1))
            # GPipe holds every micro-batch; 1F1B at most p - rank
            assert b["peak_in_flight"] == (m if sch["schedule"] == "gpipe" else p - r["rank"])
            for st in r["steps"]:
                computed = [s for s in st["spans"] if s["kind"] in ("forward", "backward")]
                # the wall-clock order of the passes is the grid's order
                assert [f"{s['kind'][0].upper()}{s['micro']}" for s in computed] == [a for a in r["grid"] if a]
                assert [s["tick"] for s in computed] == [t for t, a in enumerate(r["grid"]) if a]
                ends = [0.0] + [s["end"] for s in st["spans"]]
                assert all(s["start"] >= e for s, e in zip(st["spans"], ends))   # one thing at a time
                assert st["spans"][-1]["end"] <= st["end"]


def _schema(x):
    """The shape of a JSON value: dict keys and value types, recursively; lists by their first element."""
    if isinstance(x, dict):
        return {k: _schema(v) for k, v in sorted(x.items())}
    if isinstance(x, list):
        return [_schema(x[0])] if x else []
    return "number" if isinstance(x, (int, float)) and not isinstance(x, bool) else type(x).__name__


@pytest.mark.slow
def test_recording_again_gives_the_same_schema_and_bytes(tmp_path, traces):
    paths = record.record(tmp_path, steps=2, only=record.TRACES)
    assert sorted(paths) == sorted(record.TRACES)
    for name in record.TRACES:
        fresh, kept = json.loads(paths[name].read_text()), traces[name]
        assert _schema(fresh) == _schema(kept), name
    # byte counts do not depend on the run (times do)
    fresh = record.load("tp-comm", tmp_path)
    assert [lay["ranks"][0]["per_step"] for lay in fresh["layouts"]] == \
        [lay["ranks"][0]["per_step"] for lay in traces["tp-comm"]["layouts"]]
    assert record.load("memory", tmp_path)["layouts"] == traces["memory"]["layouts"]
    assert record.load("activations", tmp_path)["rows"] == traces["activations"]["rows"]
    assert [s["ranks"] for s in record.load("zero-memory", tmp_path)["stages"]] == \
        [s["ranks"] for s in traces["zero-memory"]["stages"]]
    assert [[r["grid"] for r in s["ranks"]] for s in record.load("pipeline", tmp_path)["schedules"]] == \
        [[r["grid"] for r in s["ranks"]] for s in traces["pipeline"]["schedules"]]


def test_cli_parser_and_refusals(tmp_path):
    p = argparse.ArgumentParser()
    record_cli.add_record_parser(p.add_subparsers())
    args = p.parse_args(["record", "--out", str(tmp_path), "--steps", "2", "--only", "memory"])
    assert args.func is record_cli.run_record and args.only == ["memory"] and args.steps == 2
    with pytest.raises(SystemExit):
        p.parse_args(["record", "--only", "interleaved"])
    with pytest.raises(ValueError, match="at least one step"):
        record.record(tmp_path, steps=0)
    with pytest.raises(FileNotFoundError, match="minimega record"):
        record.load("memory", tmp_path)
