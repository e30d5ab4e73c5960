"""3D parallelism: tensor × pipeline × data parallel (DDP or ZeRO) trains exactly like the single-process model.

Several layouts share one 4-rank launch (each builds its own mesh): launches are the expensive part.
"""
import pytest

import minimega as mm
from parity import max_rel_error, parity_config, reference_run, trained

STEPS = 4      # the gradient itself: test_grad_parity.py; these steps check the optimizer path
TINY = mm.GPTConfig.tiny(block_size=32)          # 4 layers, every ZeRO unit divisible by 2


def _train(dp, config):
    engine, mesh, _ = trained(TINY, config, mm.ParallelDims(dp=dp, tp=config.tp, pp=config.pp), STEPS, 32)
    report = engine.report()
    return {"state": engine.full_state_dict(), "losses": engine.losses, "norms": engine.grad_norms,
            "rank": mesh.rank, "memory": report["memory"], "by_op": report["comm"]["by_op"],
            "units": sum(len(s.units) for s in engine.zero_stages)}


def _cases(cases):
    return [_train(*case) for case in cases]


# (id, dp, TrainConfig overrides). Clipping at 0.5 is active on every step (the norm starts near 2), so a
# norm that counted a replicated parameter twice, or missed a shard, would move the weights.
LAYOUTS = [
    ("tp2-pp2-1f1b", 1, dict(tp=2, pp=2, schedule="1f1b", micro_batches=4, gradient_clipping=0.5)),
    ("tp2-pp2-interleaved-sp", 1, dict(tp=2, pp=2, schedule="interleaved_1f1b", micro_batches=4,
                                       virtual_stages=2, sequence_parallel=True, gradient_clipping=0.5)),
    ("dp2-tp2-zero1", 2, dict(tp=2, zero_stage=1, gradient_clipping=0.5)),
    ("dp2-tp2-zero2", 2, dict(tp=2, zero_stage=2, gradient_clipping=0.5)),
    ("dp2-tp2-zero3-sp", 2, dict(tp=2, zero_stage=3, sequence_parallel=True, gradient_clipping=0.5)),
    ("dp2-pp2-zero1-1f1b", 2, dict(pp=2, zero_stage=1, schedule="1f1b", micro_batches=4, gradient_clipping=0.5)),
]


# bf16 storage with fp32 master shards: the BLOOM recipe's precision; compared with fp32 at bf16 tolerance.
BF16 = ("dp2-pp2-zero1-bf16", 2, dict(pp=2, zero_stage=1, schedule="1f1b", micro_batches=4, precision="bf16"))


@pytest.fixture(scope="module")
def runs():
    cases = LAYOUTS + [BF16]
    results = mm.launch(_cases, 4, [(dp, parity_config(**kw)) for _, dp, kw in cases], timeout=600)
    return {name: [rank[i] for rank in results] for i, (name, _, _) in enumerate(cases)}


@pytest.mark.parametrize("name, dp, overrides", LAYOUTS, ids=[c[0] for c in LAYOUTS])
def test_matches_single_process(runs, name, dp, overrides):
    norms: list[float] = []
    ref, ref_losses = reference_run(TINY, parity_config(**overrides), STEPS, seq_len=32, norms=norms)
    for r in runs[name]:                          # every rank consolidates the same, correct model
        assert max_rel_error(r["state"], ref) <= 1e-5, (name, r["rank"])
        assert r["losses"] == pytest.approx(ref_losses, rel=1e-5)
        assert r["norms"] == pytest.approx(norms, rel=1e-5)
    assert min(norms) > 0.5                       # clipping acted on every step


def test_zero1_under_a_pipeline_shards_the_optimizer_and_reduces_once_per_step(runs):
    ranks = runs["dp2-pp2-zero1-1f1b"]
    # Adam's two fp32 moments exist once over the 4 ranks: each stage's units split over dp (no padding).
    assert sum(r["memory"]["optimizer_states"] for r in ranks) == 8 * mm.GPT(TINY).num_params()
    for r in ranks:    # one reduce-scatter per unit per step, not one per micro-batch
        assert r["by_op"]["reduce_scatter"]["calls"] == STEPS * r["units"]


def test_bf16_pipeline_with_zero1_tracks_fp32(runs):
    ref, ref_losses = reference_run(TINY, parity_config(), STEPS, seq_len=32)
    for r in runs[BF16[0]]:
        assert r["losses"] == pytest.approx(ref_losses, abs=3e-2)
        assert max_rel_error(r["state"], ref) < 3e-2
        # The fp32 master copy covers 1/dp of the stage: at dp 2, 4 bytes × N/2 = the 2 bytes × N of bf16 weights.
        assert r["memory"]["master"] == r["memory"]["params"] > 0


@pytest.mark.parametrize("overrides, message", [
    (dict(pp=2, zero_stage=1, precision="fp16"), "precision='fp16' with pp=2"),
], ids=["pp-fp16"])
def test_what_does_not_compose_is_refused_by_the_config(overrides, message):
    with pytest.raises(ValueError, match=message):
        mm.TrainConfig(**overrides)
