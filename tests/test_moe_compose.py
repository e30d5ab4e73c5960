"""A mixture of experts composed with context parallelism and with ZeRO-2: the single-process `MoEGPT` is the oracle.

cp × ep (dropless dispatch): each cp rank routes its T/cp tokens of every sequence, sends them over its ep
group and its experts' gradients sum over edp × cp; the load-balancing loss's means (f_e, P_e) are pooled
over the ring, the routing biases' loads over dp·cp. ZeRO-2: the dense gradients are reduce-scattered over
dp on every micro-step, the experts' go their own way (ZeRO-1 over edp) once per step.

One launch per world size; every case compares each of its first GRAD_STEPS gradients (consolidated just
before the optimizer step, experts gathered over ep) with the single-process gradient within n·u
(`parity.grad_tolerance`), and its weights and losses after STEPS Adam steps within 1e-5. The checkpoints of
cp 2 and dp 2 × cp 2 × ep 2 (ZeRO-1 over edp × cp, a shared expert: a dense MLP) load on one process and
train on like it.
"""
from __future__ import annotations

import traceback

import pytest
import torch

import minimega as mm
from minimega import data
from minimega.parallel.moe import layer as moe
from minimega.train.engine import make_optimizer, validate
from minimega.parallel.moe.balance import update_routing_bias
from parity import assert_case_matches, assert_grads_match, max_rel_error, parity_config

STEPS, GRAD_STEPS = 3, 2
TINY = mm.GPTConfig.tiny(block_size=32)
SEQ = TINY.block_size
# aux 0.1 (ten times Switch's): the load-balancing loss's share of the router gradient is well above rounding
AUX = moe.MoEConfig(n_experts=4, top_k=2, dispatch="dropless", aux_loss_coef=0.1)
BALANCED = moe.MoEConfig(n_experts=4, top_k=2, dispatch="dropless", aux_loss_coef=0.1, z_loss_coef=0.1,
                         bias_update_rate=0.01)
SHARED = moe.MoEConfig(n_experts=4, top_k=2, dispatch="dropless", aux_loss_coef=0.1, n_shared_experts=1)  # dense
CAPACITY = moe.MoEConfig(n_experts=4, top_k=2, capacity_factor=1.25, aux_loss_coef=0.1)     # drops tokens

CASES = {   # world size -> [(id, ParallelDims, MoEConfig, TrainConfig overrides)]
    2: [("cp2-ep1", dict(cp=2), AUX, {"gradient_accumulation_steps": 2}),
        ("dp2-ep2-zero2-ga2", dict(dp=2, ep=2), CAPACITY, {"zero_stage": 2, "gradient_accumulation_steps": 2})],
    4: [("dp2-cp2-ep2-shared-zero1", dict(dp=2, cp=2, ep=2), SHARED, {"zero_stage": 1}),
        ("dp2-cp2-ep2-zloss-bias-ga2", dict(dp=2, cp=2, ep=2), BALANCED, {"gradient_accumulation_steps": 2}),
        ("dp4-ep2-zero2-ga2-clip", dict(dp=4, ep=2), CAPACITY,
         {"zero_stage": 2, "gradient_accumulation_steps": 2, "gradient_clipping": 0.5})],
}


def _config(dims: dict, overrides: dict) -> mm.TrainConfig:
    """Adam's eps 1e-6, not 1e-8: every seed leaves some expert weights a first gradient near 1e-9, whose
    rounding noise (~1e-10, another summation order) Adam's first step, g / (|g| + eps), turns into a
    lr-sized difference at eps 1e-8 (seed 1, cp 2: 1.6e-5 after 3 steps, see `parity_config`'s note)."""
    return parity_config(cp=dims.get("cp", 1), ep=dims.get("ep", 1), eps=1e-6, **overrides)


SAVED = ("cp2-ep1", "dp2-cp2-ep2-shared-zero1")      # saved after STEPS, loaded on one process, trained one step more


def reference(moe_config: moe.MoEConfig, config: mm.TrainConfig, steps: int = STEPS):
    """One process, torch's AdamW: the first GRAD_STEPS gradients (after clipping), final weights, losses."""
    torch.manual_seed(config.seed)
    model = moe.MoEGPT(TINY, moe_config)
    opt = make_optimizer(model.parameters(), config)
    ga, grads, losses = config.gradient_accumulation_steps, [], []
    for x, y in data.global_batches(steps, config.batch_size, SEQ, seed=config.seed):
        total = 0.0
        for xm, ym in zip(x.chunk(ga), y.chunk(ga)):
            _, loss = model(xm, ym)
            (loss / ga).backward()
            total += loss.item()
        if config.gradient_clipping:
            torch.nn.utils.clip_grad_norm_(model.parameters(), config.gradient_clipping)
        if len(grads) < GRAD_STEPS:
            grads.append({n: p.grad.detach().clone() for n, p in model.named_parameters()})
        opt.step()
        update_routing_bias(model.moe_layers())
        opt.zero_grad(set_to_none=True)
        losses.append(total / ga)
    return grads, {k: v.detach().clone() for k, v in model.state_dict().items()}, losses


def _ranks(cases, save_dir):
    out = []
    for name, dims, moe_config, overrides in cases:
        try:
            config = _config(dims, overrides)
            mesh = mm.init_mesh(mm.ParallelDims(**dims))
            torch.manual_seed(config.seed)
            engine = mm.initialize(moe.MoEGPT(TINY, moe_config), config, mesh)
            grads: list[dict] = []
            engine.before_step.append(lambda e: grads.append(e.full_grad_dict()) if e.step < GRAD_STEPS else None)
            for batch in data.batches(mesh, STEPS, config.batch_size, SEQ, seed=config.seed):
                engine.train_step(batch)
            report = engine.report()
            state = engine.full_state_dict()
            if name in SAVED:
                engine.save(f"{save_dir}/{name}")
            out.append({"state": state if mesh.rank == 0 else None, "grads": grads if mesh.rank == 0 else None,
                        "losses": report["losses"], "moe": report["moe"]})
        except Exception:
            out.append({"error": traceback.format_exc()})
    return out


@pytest.mark.parametrize("world", sorted(CASES), ids=lambda w: f"world{w}")
def test_moe_composes_with_cp_and_zero2(world, tmp_path):
    cases = CASES[world]
    results = mm.launch(_ranks, world, cases, str(tmp_path), timeout=900)
    for i, (name, dims, moe_config, overrides) in enumerate(cases):
        per_rank = [r[i] for r in results]
        for r in per_rank:
            assert "error" not in r, f"{name}: {r.get('error')}"
        config = _config(dims, overrides)
        ref_grads, ref_state, ref_losses = reference(moe_config, config)
        got = per_rank[0]
        errs = [max_rel_error(g, r) for g, r in zip(got["grads"], ref_grads)]
        print(f"{name}: gradient errors {[f'{e:.1e}' for e in errs]}, "
              f"weights {max_rel_error(got['state'], ref_state):.1e}")
        assert_grads_match(name, got["grads"], ref_grads, "fp32", config.batch_size * SEQ, GRAD_STEPS)
        assert_case_matches(name, per_rank, ref_state, ref_losses, "MoE", STEPS)
        if moe_config.bias_update_rate:            # the loads (summed over dp·cp) moved every layer's bias
            assert all(v.abs().sum() > 0 for k, v in ref_state.items() if k.endswith("expert_bias")), name
        if moe_config.dispatch == "dropless":      # the ranks' tokens together: every (token, choice) once
            summed = torch.tensor([r["moe"]["routed"] for r in per_rank]).sum(0)
            assert summed.sum() == TINY.n_layer * STEPS * config.batch_size * SEQ * moe_config.top_k, name
        if name in SAVED:                           # the experts' replicas over edp × cp each saved their share
            _, ref_next, _ = reference(moe_config, config, STEPS + 1)
            loaded, resumed = _resume_on_one_process(str(tmp_path / name), moe_config, config)
            assert max_rel_error(loaded, got["state"]) == 0.0, name
            assert max_rel_error(resumed, ref_next) <= 1e-5, f"{name}: resumed on one process"


def _resume_on_one_process(directory: str, moe_config: moe.MoEConfig, config: mm.TrainConfig):
    """Load a checkpoint on one process (cp 1, ep 1, same ZeRO stage) and train one step more."""
    single = parity_config(eps=config.eps, zero_stage=config.zero_stage)
    engine = mm.initialize(moe.MoEGPT(TINY, moe_config), single, mm.init_mesh(mm.ParallelDims()))
    assert engine.load(directory) == STEPS
    loaded = engine.full_state_dict()
    for batch in data.global_batches(1, config.batch_size, SEQ, start=STEPS, seed=config.seed):
        engine.train_step(batch)
    return loaded, engine.full_state_dict()


def test_cp_refuses_capacity_routing_by_name():
    """Capacity is a budget per whole sequence: cp would cut it; dropless dispatch composes."""
    with pytest.raises(ValueError, match=r"TrainConfig.cp=2 is not supported with a mixture-of-experts model; "
                                         r"use dispatch='dropless'"):
        validate(TINY, parity_config(cp=2), mm.ParallelDims(cp=2), CAPACITY)
    validate(TINY, parity_config(cp=2, ep=2), mm.ParallelDims(dp=2, cp=2, ep=2), AUX)


def test_zero3_is_refused_and_zero2_accepted():
    with pytest.raises(ValueError, match=r"TrainConfig.zero_stage=3 is not supported with a mixture-of-experts "
                                         r"model; use zero_stage 0, 1 or 2 \(ZeRO-3 would shard"):
        validate(TINY, parity_config(zero_stage=3, ep=2), mm.ParallelDims(dp=2, ep=2), CAPACITY)
    validate(TINY, parity_config(zero_stage=2, ep=2), mm.ParallelDims(dp=2, ep=2), CAPACITY)


def test_expert_groups_join_edp_and_cp():
    """dp 2 × cp 2, ep 2: each cp rank has its own ep group; the ranks holding the same experts are edp × cp."""
    dims = mm.ParallelDims(dp=2, cp=2, ep=2)
    assert dims.group_ranks("ep") == [[0, 2], [1, 3]]
    assert dims.group_ranks("edp_cp") == [[0, 1], [2, 3]]
    assert mm.ParallelDims(dp=4, cp=2, ep=2).group_ranks("edp_cp") == [[0, 1, 4, 5], [2, 3, 6, 7]]
