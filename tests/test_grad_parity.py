"""Gradients where they are sharp: the gradient each layout is about to apply equals the single-process one.

Weights after many Adam steps are a blunt instrument: Adam divides by sqrt(v), so a gradient 4× too large
moves the weights little (see issue 30). Here every layout's full gradient, consolidated by
`Engine.full_grad_dict` just before the optimizer step (a `before_step` callable), is compared with the
single-process run's after step 1 (with gradient accumulation or pipeline micro-batches: after one
accumulation window) and step 2, within `parity.grad_tolerance` of the dtype and the number of addends
whose order the layout changes; then a short weight check after STEPS steps covers the optimizer path.
All cases of the world size share one `minimega.run.launch`.
"""
from __future__ import annotations

import copy
import traceback

import pytest
import torch

import minimega as mm
from minimega import data
from parity import assert_layout_matches, grad_tolerance, max_rel_error, parity_config

MODEL = mm.GPTConfig.tiny(block_size=32)
SEQ = 32
STEPS = 3
GRAD_STEPS = 2                    # gradients compared in the first two steps (the second after an update)

# name -> (ParallelDims kwargs, TrainConfig overrides); every case runs on 4 ranks.
CASES = {
    "ddp-dp4": ({"dp": 4}, {"bucket_mb": 0.05}),
    "ddp-dp4-ga2-clip": ({"dp": 4}, {"gradient_accumulation_steps": 2, "gradient_clipping": 0.5}),
    "zero1-dp4": ({"dp": 4}, {"zero_stage": 1}),
    "zero2-dp4-ga2": ({"dp": 4}, {"zero_stage": 2, "gradient_accumulation_steps": 2}),
    "zero3-dp4-clip": ({"dp": 4}, {"zero_stage": 3, "gradient_clipping": 0.5}),
    "zero3-dp4-persist": ({"dp": 4}, {"zero_stage": 3, "param_persistence_threshold": 1000}),
    "zero1-dp2-tp2": ({"dp": 2, "tp": 2}, {"zero_stage": 1, "tp": 2}),
    "zero1-dp4-offload": ({"dp": 4}, {"zero_stage": 1, "offload_optimizer": True}),
    "zero2-dp2-pp2": ({"dp": 2, "pp": 2}, {"zero_stage": 2, "pp": 2, "micro_batches": 2}),
    "ddp-tp2-pp2-clip": ({"tp": 2, "pp": 2}, {"tp": 2, "pp": 2, "micro_batches": 4, "gradient_clipping": 0.5}),
    # zb_h1: the backward split into B (input gradient) and W (weight gradient), W later into the same buffers
    "ddp-pp4-zb_h1": ({"pp": 4}, {"pp": 4, "micro_batches": 4, "schedule": "zb_h1"}),
    "zero2-dp2-pp2-zb_h1": ({"dp": 2, "pp": 2}, {"zero_stage": 2, "pp": 2, "micro_batches": 4, "schedule": "zb_h1"}),
    "ddp-tp2-pp2-zb_h1": ({"tp": 2, "pp": 2}, {"tp": 2, "pp": 2, "micro_batches": 2, "schedule": "zb_h1",
                                               "gradient_clipping": 0.5}),
}


def _config(name: str) -> mm.TrainConfig:
    return parity_config(**CASES[name][1])


def _run_cases(names: list[str]) -> dict:
    """Every case on this rank: its gradients in the first GRAD_STEPS steps, its weights and losses after STEPS."""
    out = {}
    for name in names:
        try:
            dims, config = CASES[name][0], _config(name)
            mesh = mm.init_mesh(mm.ParallelDims(**dims))
            torch.manual_seed(config.seed)
            engine = mm.initialize(mm.GPT(MODEL), config, mesh)
            grads: list[dict] = []
            engine.before_step.append(lambda e: grads.append(e.full_grad_dict()) if e.step < GRAD_STEPS else None)
            for batch in data.batches(mesh, STEPS, config.batch_size, SEQ, seed=config.seed):
                engine.train_step(batch)
            out[name] = {"grads": grads, "state": engine.full_state_dict(), "losses": engine.losses}
        except Exception:                     # every rank reports; the parent names the case
            out[name] = {"error": traceback.format_exc()}
    return out


@pytest.fixture(scope="module")
def runs(request) -> dict:
    """Every selected case (a -k run launches only those), in one launch of 4 ranks."""
    wanted = {item.callspec.params.get("name") for item in request.session.items
              if item.module is request.module and hasattr(item, "callspec")}
    names = [n for n in CASES if n in wanted]
    per_rank = mm.launch(_run_cases, 4, names, timeout=600)
    return {name: [r[name] for r in per_rank] for name in names}


@pytest.mark.parametrize("name", list(CASES))
def test_gradient_matches_single_process(runs, name):
    got = assert_layout_matches(name, runs[name], MODEL, _config(name), STEPS, SEQ, GRAD_STEPS)
    for other in runs[name][1:]:              # every rank consolidates the same gradient
        assert max_rel_error(other["grads"][0], got["grads"][0]) == 0.0


def test_fp16_gradient_is_unscaled_and_matches_fp32():
    """One rank, ZeRO-2 under fp16 with a static loss scale: the gradient the step applies is the fp32 model's
    (the scale multiplied in and divided out again), within the fp16 tolerance."""
    from minimega import comm, zero
    from minimega.train.engine import make_optimizer
    group = comm.Group(None, [0], "dp")           # one rank: collectives return at once, no process group
    config = mm.TrainConfig(zero_stage=2, precision="fp16", loss_scale=2.0 ** 10)
    torch.manual_seed(0)
    reference = mm.GPT(MODEL)
    stage = zero.wrap(copy.deepcopy(reference), config, group, 0, lambda p: make_optimizer(p, config))
    x, y = data.global_batch(0, 2, SEQ)
    reference(x, y)[1].backward()
    stage.scale_loss(stage(x, y)[1]).backward()
    stage.finish_grad_sync()
    err = max_rel_error(stage.full_grad_dict(), {n: p.grad for n, p in reference.named_parameters()})
    tol = grad_tolerance("fp16", 2 * SEQ)
    assert err <= tol, f"fp16 gradient {err:.2e} off the fp32 one (tolerance {tol:.1e})"
