"""The gradient-sync protocol (`minimega.grad_sync`): right gradients, reduced once per bucket per step.

The layout under test is BLOOM-176B's (dp × pp with ZeRO-1) with full activation checkpointing: a
checkpointed block runs a nested backward, which is where an end-of-backward callback used to fire once
per block. Several layouts share one 4-rank launch (each builds its own mesh).
"""
from collections import Counter

import pytest
import torch

import minimega as mm
from minimega import data
from minimega.data_parallel import DataParallel
from parity import max_rel_error, parity_config, reference_run

STEPS = 10
TINY = mm.GPTConfig.tiny(block_size=32)          # 4 layers, every ZeRO unit divisible by 2


def _train(dp, config):
    mesh = mm.init_mesh(mm.ParallelDims(dp=dp, tp=config.tp, pp=config.pp))
    torch.manual_seed(config.seed)
    engine = mm.initialize(mm.GPT(TINY), config, mesh)
    for batch in data.batches(mesh, STEPS, config.batch_size, 32, seed=config.seed):
        engine.train_step(batch)
    report = engine.report()
    # Gradient reductions over dp: DDP's bucket all-reduces, ZeRO's per-unit reduce-scatters (tag = bucket).
    reductions = Counter(e["tag"] for e in report["comm_events"]
                         if e["group"] == "dp" and e["op"] in ("all_reduce", "reduce_scatter")
                         and e["tag"] != "grad_norm")
    if config.zero_stage:
        buckets = [u.name for s in engine.zero_stages for u in s.units]
    else:
        buckets = [f"bucket{b.index}" for w in engine.sync_parts for b in w.buckets]
    return {"state": engine.full_state_dict(), "losses": engine.losses, "norms": engine.grad_norms,
            "rank": mesh.rank, "reductions": dict(reductions), "buckets": buckets}


def _cases(cases):
    return [_train(*case) for case in cases]


PP = dict(pp=2, schedule="1f1b", micro_batches=4, activation_checkpointing="full")
# (id, dp, TrainConfig overrides). bucket_mb=0.05 gives DDP several buckets per stage.
CASES = [
    ("dp2-pp2-zero1-ac-full", 2, dict(PP, zero_stage=1)),
    ("dp2-pp2-ddp-ac-full", 2, dict(PP, zero_stage=0, bucket_mb=0.05)),
    ("dp2-pp2-zero2-ac-full-clip", 2, dict(PP, zero_stage=2, gradient_clipping=0.5)),
    ("dp2-pp2-zero3-ac-full", 2, dict(PP, zero_stage=3)),
    ("dp2-tp2-ddp-ac-full-ga2-clip", 2, dict(tp=2, activation_checkpointing="full", gradient_accumulation_steps=2,
                                             gradient_clipping=0.5, bucket_mb=0.05)),
]


@pytest.fixture(scope="module")
def runs():
    results = mm.launch(_cases, 4, [(dp, parity_config(**kw)) for _, dp, kw in CASES], timeout=600)
    return {name: [rank[i] for rank in results] for i, (name, _, _) in enumerate(CASES)}


@pytest.mark.parametrize("name, dp, overrides", CASES, ids=[c[0] for c in CASES])
def test_matches_single_process_and_reduces_each_bucket_once_per_step(runs, name, dp, overrides):
    norms: list[float] = []
    ref, ref_losses = reference_run(TINY, parity_config(**overrides), STEPS, seq_len=32, norms=norms)
    for r in runs[name]:
        assert max_rel_error(r["state"], ref) <= 1e-5, (name, r["rank"])
        assert r["losses"] == pytest.approx(ref_losses, rel=1e-5)
        assert r["norms"] == pytest.approx(norms, rel=1e-5)
        # Exactly one reduction per bucket per step, on every rank: none missing, none repeated.
        assert len(r["buckets"]) == len(set(r["buckets"])) >= 1
        assert r["reductions"] == {b: STEPS for b in r["buckets"]}, (name, r["rank"])


def test_a_gradient_after_its_bucket_started_is_an_error():
    """Two backwards into the same buckets before finish_grad_sync(), the first not under no_sync: refused."""
    model = torch.nn.Linear(4, 4)
    wrapper = DataParallel(model, _FakeGroup(), broadcast_init=False)
    wrapper._watch([list(model.parameters())])            # hooks even on one rank, to exercise the protocol
    wrapper._start = lambda i: None
    model(torch.ones(1, 4)).sum().backward()
    with pytest.raises(RuntimeError, match="arrived after its reduction started"):
        model(torch.ones(1, 4)).sum().backward()


class _FakeGroup:
    size, ranks, name = 1, [0], "dp"
