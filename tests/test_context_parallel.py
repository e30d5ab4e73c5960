"""Context parallelism (ring attention, load-balanced causal chunks): the single-process `model.GPT` is the oracle.

One launch per world size (2 and 4 ranks), each running several layouts; every case trains STEPS steps and
must end within 1e-5 (per-tensor norm-relative) of the single-process run on the same global batches,
send the closed-form ring bytes, and save per rank 1/cp of the activations one process saves.
"""
from __future__ import annotations

import math
import traceback

import pytest
import torch

import minimega as mm
from minimega.parallel import context as cpm
from minimega import data
from minimega import estimate as est
from minimega.train.engine import validate
from cp_support import TINY, single_process_activation_bytes, train_case
from parity import assert_case_matches, max_rel_error, parity_config, reference_run

STEPS = 4      # the gradient itself: test_grad_parity.py; these steps check the optimizer path
RESUMED = 2


def _cases(cases, save_dir=None, save_case=0):
    """Rank function: train each (dp, cp, config) case; report state, losses, ring bytes, activation bytes."""
    out = []
    for i, (dp, cp, config) in enumerate(cases):
        try:
            engine, mesh, act = train_case(dp, cp, config, STEPS)
            report = engine.report()
            state = engine.full_state_dict()
            if save_dir and i == save_case:
                engine.save(save_dir)
            ring = [e for e in report["comm_events"] if e["group"] == "cp"]
            out.append({"state": state if mesh.rank == 0 else None, "losses": report["losses"],
                        "ring_sent": sum(e["sent_bytes"] for e in ring),
                        "ring_sends": sum(e["op"] == "send" for e in ring),
                        "grad_groups": sorted({e["group"] for e in report["comm_events"] if e["group"] != "cp"}),
                        "memory": report["memory_at_step"],
                        "activation_bytes": act})
        except Exception:
            out.append({"error": traceback.format_exc()})
    return out


CASES = {   # world size -> [(id, dp, cp, TrainConfig overrides)]
    2: [("cp2", 1, 2, {}), ("cp2-full-recompute", 1, 2, {"activation_checkpointing": "full"}),
        ("cp2-selective-recompute", 1, 2, {"activation_checkpointing": "selective"})],
    4: [("cp4", 1, 4, {}), ("cp2-dp2", 2, 2, {}), ("cp2-dp2-zero2", 2, 2, {"zero_stage": 2}),
        ("cp2-tp2", 1, 2, {"tp": 2})],
}


@pytest.fixture(scope="module")
def ref():
    config = parity_config()
    return (reference_run(TINY, config, STEPS), reference_run(TINY, config, STEPS + RESUMED),
            reference_run(TINY, config, STEPS + 2 * RESUMED))


@pytest.mark.parametrize("world", sorted(CASES), ids=lambda w: f"world{w}")
def test_context_parallel_matches_single_process(world, ref, tmp_path):
    (ref_state, ref_losses), _, _ = ref
    cases = CASES[world]
    results = mm.launch(_cases, world, [(dp, cp, parity_config(cp=cp, **kw)) for _, dp, cp, kw in cases],
                        str(tmp_path / "ckpt"), 0, timeout=600)
    for i, (name, dp, cp, kw) in enumerate(cases):
        per_rank = [r[i] for r in results]
        assert_case_matches(name, per_rank, ref_state, ref_losses, "GPT", STEPS)
        # CommLog: the ring's sends are the closed form (forward cp-1 K/V, backward cp-1 K/V and cp dK/dV).
        # Recomputation (whole blocks or attention cores) runs the forward's ring once more.
        tp, recompute = kw.get("tp", 1), kw.get("activation_checkpointing", "none") != "none"
        want = STEPS * est.cp_ring_bytes(TINY.n_layer, 8 // dp, TINY.block_size, TINY.n_embd, cp, tp,
                                         recompute=recompute)
        for r in per_rank:
            assert math.isclose(r["ring_sent"], want, rel_tol=1e-12), f"{name}: ring {r['ring_sent']} != {want}"
            assert r["ring_sends"] == STEPS * TINY.n_layer * 2 * (3 * cp - 2 + (cp - 1) * recompute), name
            # Gradients are averaged over dp × cp (one group), never over dp alone.
            assert "dp_cp" in r["grad_groups"] and "dp" not in r["grad_groups"], f"{name}: {r['grad_groups']}"
        # Model states: the estimator's, ZeRO over the dp·cp ranks that hold the same parameters (tp = 1).
        if tp == 1:
            want_mem = est.model_state_bytes(mm.GPT(TINY).num_params(), dp * cp, kw.get("zero_stage", 0), "fp32")
            for r in per_rank:
                m = r["memory"]
                got_mem = m["params"] + m["grads"] + m["optimizer_states"] + m.get("master", 0)
                assert math.isclose(got_mem, want_mem, rel_tol=1e-3), f"{name}: measured {got_mem} != estimate {want_mem}"
        # Saved activations per rank: one process's for the same B/dp rows, divided by cp (the 0-d loss
        # aside: 4 bytes). Checked where only cp and dp change (tp splits some of them once more).
        if tp == 1 and not recompute:
            want_act = single_process_activation_bytes(8 // dp) / cp
            for r in per_rank:
                assert abs(r["activation_bytes"] - want_act) <= 4, \
                    f"{name}: {r['activation_bytes']} saved bytes per rank, want {want_act:.0f} (1/cp of one process's)"
    if world == 2:
        _check_resharding(ref, results[0][0]["state"], tmp_path)


def _resume(directory, config, dims, steps, start, save_dir=None):
    """Rank function: load a checkpoint under ``dims``, train ``steps`` more; full state (and save)."""
    mesh = mm.init_mesh(dims)
    torch.manual_seed(config.seed)
    engine = mm.initialize(mm.GPT(TINY), config, mesh)
    assert engine.load(directory) == start
    loaded = engine.full_state_dict()
    for batch in data.batches(mesh, steps, config.batch_size, TINY.block_size, seed=config.seed, start=start):
        engine.train_step(batch)
    if save_dir:
        engine.save(save_dir)
    return loaded, engine.full_state_dict()


def _check_resharding(ref, saved_state, tmp_path):
    """The cp2 checkpoint loads at cp1 and resumes like the single process; that run's checkpoint loads at cp2."""
    _, (ref_resumed, _), (ref_twice, _) = ref
    loaded, resumed = _resume(str(tmp_path / "ckpt"), parity_config(), mm.ParallelDims(), RESUMED, STEPS,
                              save_dir=str(tmp_path / "ckpt1"))
    assert max_rel_error(loaded, saved_state) == 0.0
    err = max_rel_error(resumed, ref_resumed)
    assert err <= 1e-5, f"cp2 → cp1: {err:.2e} off the single-process run after {STEPS + RESUMED} steps"
    back = mm.launch(_resume, 2, str(tmp_path / "ckpt1"), parity_config(cp=2), mm.ParallelDims(cp=2), RESUMED,
                     STEPS + RESUMED, timeout=300)
    assert max_rel_error(back[0][0], resumed) == 0.0
    err = max_rel_error(back[0][1], ref_twice)
    assert err <= 1e-5, f"cp1 → cp2: {err:.2e} off the single-process run after {STEPS + 2 * RESUMED} steps"


def test_shards_are_mirrored_chunks_and_positions_are_global():
    t = torch.arange(16).view(1, 16)
    assert cpm.shard_sequence(t, 0, 2).tolist() == [[0, 1, 2, 3, 12, 13, 14, 15]]
    assert cpm.shard_sequence(t, 1, 2).tolist() == [[4, 5, 6, 7, 8, 9, 10, 11]]
    assert cpm.shard_sequence(t, 1, 4).tolist() == [[2, 3, 12, 13]]
    for cp in (1, 2, 4):
        parts = [cpm.shard_sequence(t, r, cp) for r in range(cp)]
        assert torch.equal(cpm.unshard_sequence(parts, cp), t)
        for r in range(cp):
            assert torch.equal(cpm.positions(16 // cp, r, cp), parts[r][0])
    # Causal work per rank is balanced: every rank's two chunks see 2·cp + 1 key chunks (diagonals included).
    for cp in (2, 4, 8):
        work = [sum(cpm.visibility(q, k) is not None for q in cpm.chunk_ids(r, cp) for k in range(2 * cp))
                for r in range(cp)]
        assert work == [2 * cp + 1] * cp
    assert [cpm.visibility(1, k) for k in (0, 1, 2)] == ["full", "causal", None]


def test_cp_groups_sit_inside_the_grid():
    dims = mm.ParallelDims(dp=2, cp=2, tp=2)
    assert dims.world_size == 8
    assert dims.group_ranks("tp") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert dims.group_ranks("cp") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert dims.group_ranks("dp") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert dims.group_ranks("dp_cp") == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert [(dims.coords(r), dims.cp_coord(r)) for r in (0, 3, 6)] == [((0, 0, 0), 0), ((0, 0, 1), 1), ((0, 1, 0), 1)]
    assert all(dims.rank_of(*dims.coords(r), dims.cp_coord(r)) == r for r in range(8))
    with pytest.raises(ValueError, match=r"dp\*cp\*tp\*pp = 2\*2\*1\*1 = 4 != world size 2"):
        mm.ParallelDims(dp=2, cp=2).check(2)
    assert mm.ParallelDims.infer(8, tp=2, cp=2) == dims


@pytest.mark.parametrize("change, message", [
    (dict(cp=3), r"seq_len=32 is not divisible by 2\*cp = 6"),
    (dict(cp=2, pp=2), r"cp=2 does not compose with pp=2"),
    (dict(cp=2, tp=2, sequence_parallel=True), r"cp=2 does not compose with sequence_parallel=True"),
], ids=["seq-not-divisible", "pp", "sequence-parallel"])
def test_refusals_name_the_setting(change, message):
    config = parity_config(**change)
    dims = mm.ParallelDims(cp=config.cp, tp=config.tp, pp=config.pp)
    with pytest.raises(ValueError, match=message):
        validate(TINY, config, dims)


def test_refusals_of_dropout_experts_and_a_mismatched_mesh():
    from minimega.parallel.moe import layer as moe
    with pytest.raises(ValueError, match="TrainConfig.cp=2 is not supported with a mixture-of-experts model; use "
                                         "dispatch='dropless'"):      # capacity routing: dropless composes
        validate(TINY, parity_config(cp=2), mm.ParallelDims(cp=2), moe.MoEConfig())
    with pytest.raises(ValueError, match=r"GPTConfig.dropout=0.1 is not supported .* use dropout=0"):
        validate(mm.GPTConfig.tiny(block_size=32, dropout=0.1), parity_config(cp=2), mm.ParallelDims(cp=2))
    with pytest.raises(ValueError, match=r"TrainConfig\(cp=1\) does not match the mesh \(cp=2\)"):
        validate(TINY, parity_config(), mm.ParallelDims(cp=2))


def test_cli_trains_with_context_parallelism(capsys):
    """`minimega train --cp 2` on 2 ranks trains what `--nproc 2` (dp = 2) trains; a bad split is refused by name."""
    import json
    from minimega.tools.cli import main
    runs = {}
    for flags in ([], ["--cp", "2"]):
        assert main(["train", "--nproc", "2", "--steps", "2", "--json", *flags]) == 0
        runs[bool(flags)] = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["losses"]
    assert max(abs(a - b) / b for a, b in zip(runs[True], runs[False])) <= 1e-5, runs
    assert main(["train", "--nproc", "2", "--cp", "2", "--seq-len", "30", "--steps", "1"]) == 2
    assert "seq_len=30 is not divisible by 2*cp = 4" in capsys.readouterr().err
