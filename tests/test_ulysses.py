"""Ulysses attention (context parallelism by all-to-all over heads): the single-process `model.GPT` is the oracle.

One launch per world size (2 and 4 ranks), each running several layouts; every case trains STEPS steps and
must end within 1e-5 (per-tensor norm-relative) of the single-process run on the same global batches, send
exactly the closed-form all-to-all bytes, and save per rank 1/cp of one process's activations plus the one
extra (B, T/cp, D/tp) tensor per layer the module docstring names.
"""
from __future__ import annotations

import math
import traceback

import pytest
import torch

import minimega as mm
from minimega.parallel import context as cpm
from minimega import estimate as est
from minimega.parallel import ulysses
from minimega.train.engine import validate
from cp_support import TINY, single_process_activation_bytes, train_case
from parity import assert_case_matches, parity_config, reference_run

STEPS = 4      # the gradient itself: test_grad_parity.py; these steps check the optimizer path


def _exchange_order(cp: int) -> tuple[list[int], list[int]]:
    """Rank function: seq_to_heads of a tensor holding each token's global position, and back."""
    mesh = mm.init_mesh(mm.ParallelDims(cp=cp))
    T, nh = 8 * cp, 2 * cp
    pos = torch.arange(T, dtype=torch.float32).view(1, 1, T, 1).expand(1, nh, T, 1)            # (1, nh, T, 1)
    mine = cpm.shard_sequence(pos.transpose(1, 2), mesh.cp_rank, cp).transpose(1, 2)           # (1, nh, T/cp, 1)
    heads = ulysses.seq_to_heads(mine.contiguous(), mesh.cp_group, "test")                      # (1, nh/cp, T, 1)
    back = ulysses.heads_to_seq(heads, mesh.cp_group, "test")
    assert torch.equal(back, mine)
    return heads[0, 0, :, 0].int().tolist(), [nh // cp]


def _cases(cases):
    """Rank function: train each (dp, cp, config) case; report state, losses, all-to-all records, activations."""
    out = []
    for dp, cp, config in cases:
        try:
            engine, mesh, act = train_case(dp, cp, config, STEPS)
            report = engine.report()
            a2a = [e for e in report["comm_events"] if e["group"] == "cp"]
            state = engine.full_state_dict()                                   # collective: every rank calls it
            out.append({"state": state if mesh.rank == 0 else None, "losses": report["losses"],
                        "ops": sorted({e["op"] for e in a2a}), "a2a_sent": sum(e["sent_bytes"] for e in a2a),
                        "a2a_calls": len(a2a), "a2a_payloads": sorted({e["bytes"] for e in a2a}),
                        "activation_bytes": act})
        except Exception:
            out.append({"error": traceback.format_exc()})
    return out


U = {"cp_attention": "ulysses"}
CASES = {   # world size -> [(id, dp, cp, TrainConfig overrides)]
    2: [("cp2", 1, 2, U), ("cp2-selective-recompute", 1, 2, {**U, "activation_checkpointing": "selective"})],
    4: [("cp4", 1, 4, U), ("cp2-dp2", 2, 2, U), ("cp2-tp2", 1, 2, {**U, "tp": 2})],
}


@pytest.fixture(scope="module")
def ref():
    return reference_run(TINY, parity_config(), STEPS)


@pytest.mark.parametrize("world", sorted(CASES), ids=lambda w: f"world{w}")
def test_ulysses_matches_single_process(world, ref):
    ref_state, ref_losses = ref
    cases = CASES[world]
    results = mm.launch(_cases, world, [(dp, cp, parity_config(cp=cp, **kw)) for _, dp, cp, kw in cases], timeout=600)
    for i, (name, dp, cp, kw) in enumerate(cases):
        per_rank = [r[i] for r in results]
        assert_case_matches(name, per_rank, ref_state, ref_losses, "GPT", STEPS)
        # CommLog: only all-to-alls over cp, each of one (B/dp, T/cp, D/tp) fp32 buffer, 8 per layer and step
        # (12 when the attention core is recomputed); the sum is the estimator's closed form, exactly.
        tp, recompute = kw.get("tp", 1), kw.get("activation_checkpointing", "none") != "none"
        rows = 8 // dp
        payload = rows * (TINY.block_size // cp) * (TINY.n_embd // tp) * 4
        want = STEPS * est.cp_ulysses_bytes(TINY.n_layer, rows, TINY.block_size, TINY.n_embd, cp, tp,
                                            recompute=recompute)
        for r in per_rank:
            assert r["ops"] == ["all_to_all"], f"{name}: {r['ops']}"
            assert r["a2a_payloads"] == [payload], f"{name}: {r['a2a_payloads']} != [{payload}]"
            assert r["a2a_calls"] == STEPS * TINY.n_layer * (12 if recompute else 8), f"{name}: {r['a2a_calls']}"
            assert r["a2a_sent"] == want, f"{name}: all-to-all {r['a2a_sent']} != {want}"
        # Saved activations: one process's for the same rows over cp, plus the kernel's head-split output.
        if tp == 1 and not recompute:
            shape = est.MemoryConfig(layers=TINY.n_layer, hidden=TINY.n_embd, heads=TINY.n_head, vocab=256,
                                     seq_len=TINY.block_size, micro_batch=rows, precision="fp32", cp=cp, dp=dp,
                                     attention="fused", cp_attention="ulysses")
            extra = TINY.n_layer * est.ulysses_activation_bytes(shape)[0]     # the estimator's term, as measured
            assert extra == TINY.n_layer * rows * (TINY.block_size // cp) * TINY.n_embd * 4
            want_act = single_process_activation_bytes(rows) / cp + extra
            for r in per_rank:
                assert abs(r["activation_bytes"] - want_act) <= 4, \
                    f"{name}: {r['activation_bytes']} saved bytes per rank, want {want_act:.0f}"


def test_exchange_puts_the_sequence_in_order():
    """After the all-to-all every rank holds all T positions in order (the causal mask needs it), for its heads."""
    for cp in (2, 4):
        got = mm.launch(_exchange_order, cp, cp, timeout=120)
        for heads, (local_heads,) in got:
            assert heads == list(range(8 * cp)) and local_heads == 2


def test_ulysses_sends_less_than_the_ring():
    """Per layer: ring (6cp-4)·B·(T/cp)·(D/tp) elements, Ulysses 8(cp-1)/cp·B·(T/cp)·(D/tp): less from cp = 2 on."""
    args = (1, 1, 4096, 4096)
    for cp in (2, 4, 8):
        ring, uly = est.cp_ring_bytes(*args, cp), est.cp_ulysses_bytes(*args, cp)
        assert uly < ring
        assert math.isclose(ring / uly, (6 * cp - 4) / (8 * (cp - 1) / cp))
    assert est.cp_bytes("ulysses", *args, 4) == est.cp_ulysses_bytes(*args, 4)
    with pytest.raises(ValueError, match="cp attention 'tree'"):
        est.cp_bytes("tree", *args, 4)


def test_step_time_counts_eight_all_to_alls_per_layer_on_the_critical_path():
    """perf: cp_comm is 8 all-to-alls per layer and micro-batch (12 with recomputation), hidden by nothing."""
    from minimega.analysis import perf
    base = dict(layers=32, hidden=4096, heads=32, vocab=32000, seq_len=32768, cp=8, dp=8, global_batch=8,
                attention="fused", precision="bf16", zero_stage=1)
    hw = perf.hardware("h100")
    for recompute, n in (("none", 8), ("selective", 12), ("full", 12)):
        cfg = perf.PerfConfig(**base, recompute=recompute, cp_attention="ulysses")
        a2a = perf.collective_time("all_to_all", 1 * (32768 // 8) * 4096 * 2, 8, hw.link(8))
        got = perf.step_time(cfg, hw)["cp_comm"]
        assert math.isclose(got, cfg.micro_batches * 32 * n * a2a, rel_tol=1e-12), (recompute, got)
        assert perf.step_time(perf.replace(cfg, overlap_comm=False), hw)["cp_comm"] == got
    ring = perf.PerfConfig(**base)
    uly = perf.replace(ring, cp_attention="ulysses")
    mem = {c.cp_attention: est.memory_per_gpu(c.memory_config()) for c in (ring, uly)}
    assert mem["ulysses"]["activations"] - mem["ring"]["activations"] == 32 * 2 * (32768 // 8) * 4096
    with pytest.raises(ValueError, match=r"heads=32 is not divisible by tp\*cp = 8\*8 = 64"):
        perf.PerfConfig(**base, tp=8, cp_attention="ulysses").check()


@pytest.mark.parametrize("change, dims, message", [
    (dict(cp=2, tp=4), dict(cp=2, tp=4), r"n_head=4 is not divisible by tp\*cp = 8"),
    (dict(cp=8), dict(cp=8), r"n_head=4 is not divisible by tp\*cp = 8"),
    (dict(cp=2, pp=2), dict(cp=2, pp=2), r"cp=2 does not compose with pp=2"),
], ids=["heads-tp-cp", "heads-cp", "pp"])
def test_refusals_name_the_setting(change, dims, message):
    config = parity_config(cp_attention="ulysses", **change)
    with pytest.raises(ValueError, match=message):
        validate(TINY, config, mm.ParallelDims(**dims))


def test_config_refuses_ulysses_without_cp_and_unknown_variants():
    with pytest.raises(ValueError, match=r"cp_attention='ulysses' has an effect only with cp > 1"):
        mm.TrainConfig(cp_attention="ulysses")
    with pytest.raises(ValueError, match=r"cp_attention='tree'; choose one of \('ring', 'ulysses'\)"):
        mm.TrainConfig(cp=2, cp_attention="tree")


def test_cli_trains_with_ulysses(capsys):
    """`minimega train --cp 2 --cp-attention ulysses` trains what dp = 2 trains; a bad head split is refused by name."""
    import json
    from minimega.tools.cli import main
    runs = {}
    for flags in ([], ["--cp", "2", "--cp-attention", "ulysses"]):
        assert main(["train", "--nproc", "2", "--steps", "2", "--json", *flags]) == 0
        runs[bool(flags)] = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["losses"]
    assert max(abs(a - b) / b for a, b in zip(runs[True], runs[False])) <= 1e-5, runs
    assert main(["train", "--nproc", "8", "--cp", "8", "--cp-attention", "ulysses", "--steps", "1"]) == 2
    assert "n_head=4 is not divisible by tp*cp = 8" in capsys.readouterr().err
    assert main(["train", "--cp-attention", "ulysses", "--steps", "1"]) == 2
    assert "--cp-attention='ulysses' has an effect only with cp > 1" in capsys.readouterr().err
