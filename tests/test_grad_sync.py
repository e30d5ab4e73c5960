"""The gradient-sync protocol (`minimega.parallel.grad_sync`): right gradients, reduced once per bucket per step.

The layout under test is BLOOM-176B's (dp × pp with ZeRO-1) with full activation checkpointing: a
checkpointed block runs a nested backward, which is where an end-of-backward callback used to fire once
per block. Several layouts share one 4-rank launch (each builds its own mesh).
"""
from collections import Counter

import pytest
import torch

import minimega as mm
from minimega import data
from minimega.parallel.data_parallel import DataParallel
from parity import max_rel_error, parity_config, reference_run, trained

STEPS = 4      # the gradient itself: test_grad_parity.py; these steps check the optimizer path
TINY = mm.GPTConfig.tiny(block_size=32)          # 4 layers, every ZeRO unit divisible by 2


def _train(dp, config):
    engine, mesh, _ = trained(TINY, config, mm.ParallelDims(dp=dp, tp=config.tp, pp=config.pp), STEPS, 32)
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


# ------------------------------------------------------------------------------------------------
# ZeRO's in-flight limit, seen by an observer of `minimega.comm` (the collectives themselves, not ZeRO's books).

class _CountInFlight:
    """Reduce-scatters issued and not yet done; ``most`` is the largest number at once."""

    def __init__(self):
        self.now, self.most = set(), 0

    def issued(self, call):
        if call.op == "reduce_scatter":
            self.now.add(id(call))
            self.most = max(self.most, len(self.now))

    def waiting(self, call):
        pass

    def done(self, call):
        self.now.discard(id(call))


def _in_flight_worker(cases):
    from minimega import comm
    mesh = mm.init_mesh(mm.ParallelDims(dp=2))
    out = {}
    for stage, limit, ga in cases:
        config = mm.TrainConfig(zero_stage=stage, reductions_in_flight=limit, gradient_accumulation_steps=ga)
        torch.manual_seed(0)
        engine = mm.initialize(mm.GPT(TINY), config, mesh)
        zero = engine.zero_stages[0]
        counter, shards_between_micro_steps = _CountInFlight(), []
        real = zero.finish_grad_sync

        def finish():
            real()
            shards_between_micro_steps.append(sum(g is not None for g in zero.grad_shards))
        zero.finish_grad_sync = finish
        with comm.observing(counter):
            for batch in data.batches(mesh, 2, 8, 32):
                engine.train_step(batch)
        out[(stage, limit, ga)] = {"most": counter.most, "slots": len(zero.pool.slots), "units": len(zero.units),
                                   "after_step": sum(g is not None for g in zero.grad_shards),
                                   "between": shards_between_micro_steps}
    return out


def test_at_most_the_limit_of_reductions_is_in_flight_and_shards_go_after_the_step():
    """FSDP2's default (one reduce-scatter in flight) and two; every unit has its gradient shard after each
    micro-step's sync (accumulation keeps them), none after the optimizer step (released)."""
    cases = [(2, 1, 1), (3, 1, 1), (3, 2, 2)]
    result = mm.launch(_in_flight_worker, 2, cases, timeout=300)[0]
    for stage, limit, ga in cases:
        got = result[(stage, limit, ga)]
        assert got["units"] > limit
        assert got["most"] == limit, (stage, limit, got)            # reached, never exceeded
        assert got["slots"] == limit                                 # the pool never grew past the limit
        assert got["between"] == [got["units"]] * (2 * ga)
        assert got["after_step"] == 0


def test_reductions_in_flight_is_refused_where_it_does_nothing():
    with pytest.raises(ValueError, match="reductions_in_flight=2 has an effect only with zero_stage >= 1"):
        mm.TrainConfig(zero_stage=0, reductions_in_flight=2)
    with pytest.raises(ValueError, match="reductions_in_flight=2 has an effect only"):
        mm.TrainConfig(zero_stage=2, overlap_comm=False, reductions_in_flight=2)
    with pytest.raises(ValueError, match="reductions_in_flight must be a positive integer"):
        mm.TrainConfig(zero_stage=2, reductions_in_flight=0)
