"""run/measure.py's tensor-by-tensor counts agree with torch's own MemTracker (single process, stage 0)."""
import torch
from torch.distributed._tools.mem_tracker import MemTracker

import minimega as mm
from minimega import data
from minimega.run import measure
from minimega.train.engine import make_optimizer


def test_model_state_bytes_equal_torch_memtracker():
    torch.manual_seed(0)
    model = mm.GPT(mm.GPTConfig.tiny())
    opt = make_optimizer(model.parameters(), mm.TrainConfig())
    x, y = data.global_batch(0, 4, 32)

    def step():
        _, loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=False)

    step()                                   # Adam's states exist from here on
    tracker = MemTracker()
    tracker.track_external(model, opt)
    with tracker:
        step()
    peak = {str(k).split(".")[-1]: v for k, v in tracker.get_tracker_snapshot("peak")[torch.device("cpu")].items()}
    ours = measure.model_state_bytes(model, opt)
    psi = model.num_params()
    assert ours["params"] == peak["PARAM"] == 4 * psi
    assert ours["grads"] == peak["GRAD"] == 4 * psi
    assert ours["optimizer_states"] + ours["optimizer_step_counters"] == peak["OPT"]
    assert ours["optimizer_states"] == 8 * psi


# ------------------------------------------------------------------------------------------------
# Peak memory through forward and backward, against `estimate.peak_memory_bytes`.

import pytest  # noqa: E402

from minimega import estimate  # noqa: E402
from minimega.train import activation_checkpoint
from minimega.zero.stages import model_units  # noqa: E402

# Odd widths so that units do not split evenly over dp: the padding is part of what is checked.
PEAK_MODEL = dict(vocab_size=255, block_size=64, n_layer=3, n_head=3, n_embd=33)
PEAK_RUNS = {"stage0": dict(zero_stage=0), "stage1": dict(zero_stage=1), "stage2": dict(zero_stage=2),
             "stage3": dict(zero_stage=3), "stage3-no-prefetch": dict(zero_stage=3, prefetch=False),
             "stage2-sync": dict(zero_stage=2, overlap_comm=False),
             "stage1-in-flight-2": dict(zero_stage=1, reductions_in_flight=2),
             "stage3-in-flight-3": dict(zero_stage=3, reductions_in_flight=3),
             "stage2-accumulate": dict(zero_stage=2, gradient_accumulation_steps=2),
             **{f"stage{s}-bf16": dict(zero_stage=s, precision="bf16") for s in (1, 2, 3)}}
# dp = 1: nothing is reduced or gathered across ranks, so no pool and no gather buffers.
PEAK_RUNS_DP1 = {k: PEAK_RUNS[k] for k in ("stage1", "stage2", "stage3", "stage2-accumulate", "stage3-bf16")}


def _peak_worker(runs):
    import torch.distributed as dist
    mesh = mm.init_mesh(mm.ParallelDims(dp=dist.get_world_size()))
    out = {}
    for name, overrides in runs.items():
        config = mm.TrainConfig(batch_size=8, seed=0, **overrides)
        torch.manual_seed(0)
        engine = mm.initialize(mm.GPT(mm.GPTConfig(**PEAK_MODEL)), config, mesh)
        batches = list(data.batches(mesh, 2, 8, 64))
        for batch in batches:
            engine.train_step(batch)
        torch.manual_seed(0)
        ref = mm.GPT(mm.GPTConfig(**PEAK_MODEL)).to(engine.zero_stages[0].policy.param_dtype if config.zero_stage
                                                    else torch.float32)   # the single-process model, this rank's rows
        micro = [t.chunk(config.gradient_accumulation_steps)[0] for t in batches[-1]]     # one micro-step's rows
        out[name] = {"peak": engine.report()["memory_peak"],
                     "activations": activation_checkpoint.saved_activation_bytes(ref, *micro)}
    return out


@pytest.mark.parametrize("dp", [1, 2, 4])
def test_memory_peak_equals_the_formulas(dp):
    units = [[p.numel() for _, p in params] for _, params in model_units(mm.GPT(mm.GPTConfig(**PEAK_MODEL)))]
    assert dp == 1 or any(sum(u) % dp for u in units)         # some unit is padded
    runs = PEAK_RUNS if dp > 1 else PEAK_RUNS_DP1
    results = mm.launch(_peak_worker, dp, runs, timeout=300)
    for rank, result in enumerate(results):
        for name, overrides in runs.items():
            got = result[name]["peak"]
            want = estimate.peak_memory_bytes(units, dp, overrides["zero_stage"],
                                              precision=overrides.get("precision", "fp32"),
                                              prefetch=overrides.get("prefetch", True),
                                              overlap=overrides.get("overlap_comm", True),
                                              in_flight=overrides.get("reductions_in_flight", 1),
                                              accumulation=overrides.get("gradient_accumulation_steps", 1))
            for category, value in want.items():
                assert got[category] == value, f"dp{dp} {name} rank {rank}: {category} {got[category]} != {value}"
            assert got["activations"] == result[name]["activations"], (name, got["activations"])
            assert got["total"] == sum(got["at_peak_total"].values())
            assert got["total"] <= sum(got[c] for c in measure.CATEGORIES)
    if dp == 1:
        assert all(r["peak"]["comm_buffers"] == r["peak"]["gathered"] == 0 for r in results[0].values())
        return
    # What ZeRO-3 buys at the peak, in this run's bytes: two gathered units rather than the whole model.
    z3, z0 = results[0]["stage3"]["peak"], results[0]["stage0"]["peak"]
    assert z3["params"] + z3["gathered"] < z0["params"]
    # And what the in-flight limit buys: one reduction in flight holds less than all of them would.
    unbounded = estimate.peak_memory_bytes(units, dp, 3, in_flight=None)
    assert z3["comm_buffers"] + z3["grads"] < unbounded["comm_buffers"] + unbounded["grads"]
