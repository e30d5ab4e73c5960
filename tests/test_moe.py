"""Mixture of experts and expert parallelism: the single-process MoE model is the oracle.

One launch per world size (2 and 4 ranks), each running several layouts; every case trains STEPS steps
and must end within 1e-5 (per-tensor norm-relative) of the single-process `MoEGPT` run on the same global
batches, route and drop exactly the tokens it routes and drops, and send the closed-form all-to-all bytes.
"""
from __future__ import annotations

import copy
import json
import math
import traceback

import pytest
import torch

import minimega as mm
from minimega import data
from minimega.parallel.moe import layer as moe
from minimega.analysis import perf
from minimega import estimate as est
from minimega.train.engine import make_optimizer, validate
from minimega.parallel.moe.balance import update_routing_bias
from minimega.zero import padded_numel
from parity import assert_case_matches, max_rel_error, parity_config

STEPS = 4      # the gradient itself: test_grad_parity.py; these steps check the optimizer path
TINY = mm.GPTConfig.tiny(block_size=32)
MOE = moe.MoEConfig(n_experts=4, top_k=2, capacity_factor=1.25)     # C = ceil(1.25·2·32/4) = 20 of 32: drops


def reference(model_config, moe_config, config, steps, after=None, norms=None):
    """Single-process MoEGPT, torch's AdamW: final state, losses and per-layer routed/dropped counts
    (of the first ``steps`` steps); ``after`` more steps give a second state (for the resumed run).
    With ``config.gradient_clipping``: torch's clip_grad_norm_, each step's norm appended to ``norms``."""
    torch.manual_seed(config.seed)
    model = moe.MoEGPT(model_config, moe_config)
    opt = make_optimizer(model.parameters(), config)
    losses = []
    for i, (x, y) in enumerate(data.global_batches(steps + (after or 0), config.batch_size, model_config.block_size,
                                                   seed=config.seed)):
        if i == steps:
            state = {k: v.detach().clone() for k, v in model.state_dict().items()}
            counts = {"routed": [m.routed.tolist() for m in model.moe_layers()],
                      "dropped": [m.dropped.tolist() for m in model.moe_layers()]}
        _, loss = model(x, y)
        loss.backward()
        if config.gradient_clipping:
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), config.gradient_clipping)
            if norms is not None:
                norms.append(float(norm))
        opt.step()
        update_routing_bias(model.moe_layers())       # a no-op unless MoEConfig.bias_update_rate > 0
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    final = {k: v.detach().clone() for k, v in model.state_dict().items()}
    if not after:
        return final, losses, {"routed": [m.routed.tolist() for m in model.moe_layers()],
                               "dropped": [m.dropped.tolist() for m in model.moe_layers()]}
    return state, losses[:steps], counts, final


def _cases(cases, save_dir=None, save_cases=()):
    """Rank function: train each (dp, ep, config) case on its own mesh; report state, losses, counts, bytes.
    Each case i in ``save_cases`` saves a sharded checkpoint into ``save_dir``/i."""
    out = []
    for i, (dp, ep, config) in enumerate(cases):
        try:
            mesh = mm.init_mesh(mm.ParallelDims(dp=dp, tp=config.tp, ep=ep))
            torch.manual_seed(config.seed)
            engine = mm.initialize(moe.MoEGPT(TINY, MOE), config, mesh)
            for batch in data.batches(mesh, STEPS, config.batch_size, TINY.block_size, seed=config.seed):
                engine.train_step(batch)
            report = engine.report()
            state = engine.full_state_dict()
            if save_dir and i in save_cases:
                engine.save(f"{save_dir}/{i}")
            a2a = [e for e in report["comm_events"] if e["op"] == "all_to_all"]
            out.append({"state": state if mesh.rank == 0 else None, "losses": report["losses"],
                        "grad_norms": report["grad_norms"],
                        "memory": report["memory_at_step"],
                        "expert_memory": engine.experts.memory() if hasattr(engine.experts, "memory") else None,
                        "moe": report["moe"], "a2a_sent": sum(e["sent_bytes"] for e in a2a),
                        "a2a_calls": len(a2a), "a2a_group": sorted({e["group"] for e in a2a})})
        except Exception:
            out.append({"error": traceback.format_exc()})
    return out


CASES = {   # world size -> [(id, dp, ep, TrainConfig overrides)]
    2: [("dp2-ep2-ga2", 2, 2, {"gradient_accumulation_steps": 2})],
    4: [("dp4-ep4", 4, 4, {}), ("dp4-ep2-zero1", 4, 2, {"zero_stage": 1}), ("tp2-dp2-ep2", 2, 2, {"tp": 2})],
}


RESUMED = 2      # steps trained after loading the ep2 checkpoint at ep1
SAVED = {2: [0], 4: [1, 2]}     # the cases whose checkpoints are loaded at ep1: dp2-ep2, ZeRO-1 and tp2-dp2-ep2


@pytest.fixture(scope="module")
def ref():
    return reference(TINY, MOE, parity_config(ep=1), STEPS, after=RESUMED)


@pytest.mark.parametrize("world", sorted(CASES), ids=lambda w: f"world{w}")
def test_expert_parallel_matches_single_process(world, ref, tmp_path):
    ref_state, ref_losses, ref_counts, ref_resumed = ref
    cases = CASES[world]
    results = mm.launch(_cases, world, [(dp, ep, parity_config(ep=ep, **kw)) for _, dp, ep, kw in cases],
                        str(tmp_path / "ckpt"), SAVED[world], timeout=600)
    for i, (name, dp, ep, kw) in enumerate(cases):
        per_rank = [r[i] for r in results]
        assert_case_matches(name, per_rank, ref_state, ref_losses, "MoE", STEPS)
        # Routing is per sequence, so the dp ranks together route and drop exactly what one process does
        # (each tp rank routes the same tokens: tp replicas count them tp times).
        for key in ("routed", "dropped"):
            summed = torch.tensor([r["moe"][key] for r in per_rank]).sum(0)
            want = torch.tensor(ref_counts[key]) * kw.get("tp", 1)
            assert torch.equal(summed, want), f"{name}: {key} {summed.tolist()} != single process {want.tolist()}"
        # CommLog: 4 all-to-alls per layer and step (dispatch, combine; forward, backward), closed form.
        rows = 8 // dp
        want = STEPS * moe.alltoall_bytes(MOE, TINY.n_layer, rows, TINY.block_size, TINY.n_embd, ep)
        for r in per_rank:
            assert r["a2a_calls"] == (4 * TINY.n_layer * STEPS * kw.get("gradient_accumulation_steps", 1)
                                      if ep > 1 else 0), name
            assert math.isclose(r["a2a_sent"], want, rel_tol=1e-12), f"{name}: {r['a2a_sent']} != {want}"
        # Memory: the estimator's model states (non-expert under ZeRO over dp, E/ep experts whole) = measured.
        dense, experts = est.moe_params(TINY.n_layer, TINY.n_embd, TINY.vocab_size, TINY.block_size, MOE.n_experts)
        want_mem = est.moe_model_state_bytes(dense, experts, dp, ep, kw.get("zero_stage", 0), "fp32")
        for r in per_rank if kw.get("tp", 1) == 1 else ():      # the estimate covers tp = 1
            m = r["memory"]
            got_mem = m["params"] + m["grads"] + m["optimizer_states"] + m.get("master", 0)
            assert math.isclose(got_mem, want_mem, rel_tol=1e-3), f"{name}: measured {got_mem} != estimate {want_mem}"
        if kw.get("zero_stage"):      # ZeRO-1 over edp: Adam's m and v for 1/edp of this rank's padded experts
            edp, local = dp // ep, experts // ep
            for r in per_rank:
                got_opt = r["expert_memory"]["optimizer_states"]
                assert got_opt == 2 * 4 * padded_numel(local, edp) // edp, f"{name}: expert Adam states {got_opt} B"
    assert sum(ref_counts["dropped"][0]) > 0          # the capacity is tight enough to drop tokens
    # Each ep2 checkpoint (dp2-ep2, ZeRO-1 over edp, tp2 × ep2), resharded onto one process: same weights, Adam resumes.
    for i in SAVED[world]:
        zero = {"zero_stage": cases[i][3]["zero_stage"]} if "zero_stage" in cases[i][3] else {}    # loads into ZeRO-1
        loaded, resumed = _resume_at_ep1(str(tmp_path / "ckpt" / str(i)), parity_config(ep=1, **zero))
        assert max_rel_error(loaded, results[0][i]["state"]) == 0.0, cases[i][0]
        err = max_rel_error(resumed, ref_resumed)
        assert err <= 1e-5, f"{cases[i][0]} resumed at ep1: {err:.2e} off the single-process run after {STEPS + RESUMED} steps"


CLIP = 0.3        # below every step's norm (asserted): each of the STEPS steps clips
CLIPPED = {      # world size -> [(id, dp, ep, TrainConfig overrides)], each with gradient_clipping=CLIP
    2: [("dp2-ep2-clip", 2, 2, {})],
    4: [("tp2-dp2-ep2-clip", 2, 2, {"tp": 2}), ("dp4-ep2-clip", 4, 2, {}),     # dp4-ep2: edp 2 replicas
        ("dp4-ep2-zero1-clip", 4, 2, {"zero_stage": 1})],                           # edp 2 gradient shards
}


@pytest.fixture(scope="module")
def ref_clipped():
    norms = []
    state, losses, _ = reference(TINY, MOE, parity_config(ep=1, gradient_clipping=CLIP), STEPS, norms=norms)
    return state, losses, norms


@pytest.mark.parametrize("world", sorted(CLIPPED), ids=lambda w: f"world{w}")
def test_clipping_counts_every_expert_once(world, ref_clipped):
    """The global norm = the single process's: dense parameters once (dp replicas or ZeRO shards, tp slices),
    every expert once (summed over ep, not over its edp or tp replicas); the clipped run matches."""
    ref_state, ref_losses, ref_norms = ref_clipped
    assert min(ref_norms) > CLIP, f"norms {ref_norms}: the clip must bite on every step"
    cases = CLIPPED[world]
    results = mm.launch(_cases, world, [(dp, ep, parity_config(ep=ep, gradient_clipping=CLIP, **kw))
                                        for _, dp, ep, kw in cases], timeout=600)
    for i, (name, dp, ep, kw) in enumerate(cases):
        for r in results:
            assert "error" not in r[i], f"{name}: {r[i].get('error')}"
            norm_err = max(abs(a - b) / b for a, b in zip(r[i]["grad_norms"], ref_norms))
            assert len(r[i]["grad_norms"]) == STEPS and norm_err <= 1e-5, f"{name}: norms {norm_err:.2e} off"
        err = max_rel_error(results[0][i]["state"], ref_state)
        assert err <= 1e-5, f"{name}: weights {err:.2e} off the clipped single-process MoE after {STEPS} steps"
        assert max(abs(a - b) / abs(b) for a, b in zip(results[0][i]["losses"], ref_losses)) <= 1e-5, name


def copy_dense_into(moe_model: moe.MoEGPT, dense: mm.GPT) -> moe.MoEGPT:
    """A one-expert ``moe_model`` given ``dense``'s weights (each MLP becomes expert 0): the dense-equality check."""
    if moe_model.moe_config.n_experts != 1:
        raise ValueError("copy_dense_into: needs n_experts=1")
    out = copy.deepcopy(moe_model)
    state = dict(dense.state_dict())
    with torch.no_grad():
        for name, t in out.state_dict().items():
            if ".mlp.experts." in name:
                src = name.replace(".experts.fc", ".fc.weight").replace(".experts.proj", ".proj.weight")
                t.copy_(state[src].unsqueeze(0))
            elif ".mlp.router." not in name:
                t.copy_(state[name])
    return out


def test_one_expert_is_the_dense_model():
    """E = 1, k = 1, capacity ≥ T: the gate is softmax over one logit = 1 and every token is kept, so the MoE
    block is `model.MLP`; logits, gradients and 10 AdamW steps match the dense GPT with the same weights."""
    torch.manual_seed(3)
    dense = mm.GPT(TINY)
    one = copy_dense_into(moe.MoEGPT(TINY, moe.MoEConfig(n_experts=1, top_k=1, capacity_factor=1.0)), dense)
    x, y = data.global_batch(0, 4, TINY.block_size)
    (ld, lossd), (lm, lossm) = dense(x, y), one(x, y)
    assert torch.equal(ld, lm)
    # aux = E · f · P = 1 · 1 · 1 for each of the 4 layers: a constant with zero gradient.
    assert lossm.item() == pytest.approx(lossd.item() + 0.01 * TINY.n_layer, rel=1e-6)
    lossd.backward()
    lossm.backward()
    grads = dict(one.named_parameters())
    for n, p in dense.named_parameters():
        q = grads[n.replace(".mlp.fc.weight", ".mlp.experts.fc").replace(".mlp.proj.weight", ".mlp.experts.proj")]
        assert torch.allclose(q.grad.reshape(p.shape), p.grad, rtol=0, atol=1e-7), n
    assert grads["blocks.0.mlp.router.weight"].grad.abs().max() == 0
    config = parity_config()
    opt_d, opt_m = make_optimizer(dense.parameters(), config), make_optimizer(one.parameters(), config)
    for x, y in data.global_batches(STEPS, 8, TINY.block_size, seed=1):
        for model, opt in ((dense, opt_d), (one, opt_m)):
            opt.zero_grad(set_to_none=True)
            model(x, y)[1].backward()
            opt.step()
    w = one.state_dict()
    for k, v in dense.state_dict().items():
        k2 = k.replace(".mlp.fc.weight", ".mlp.experts.fc").replace(".mlp.proj.weight", ".mlp.experts.proj")
        assert torch.allclose(w[k2].reshape(v.shape), v, rtol=1e-5, atol=1e-7), k


def test_capacity_and_dropping_follow_gshard_priority():
    """Hand-built routing: 4 tokens all choose expert 0 first; capacity 2 keeps the first two in token order."""
    cfg = moe.MoEConfig(n_experts=2, top_k=1, capacity_factor=1.0)      # C = ceil(1·1·4/2) = 2
    layer = moe.MoELayer(mm.GPTConfig.tiny(n_embd=4, n_head=1), cfg)
    with torch.no_grad():
        layer.router.weight.copy_(torch.tensor([[1.0, 0, 0, 0], [-1.0, 0, 0, 0]]))
    x = torch.ones(1, 4, 4)
    dispatch, combine, aux, routed, dropped = layer.route(x)
    assert cfg.capacity(4) == 2
    assert routed.tolist() == [4, 0] and dropped.tolist() == [2, 0]
    assert dispatch[0, :, 0].tolist() == [[1, 0], [0, 1], [0, 0], [0, 0]]     # token t -> slot t, then full
    p0 = torch.softmax(torch.tensor([1.0, -1.0]), 0)
    assert torch.allclose(combine[0, :2, 0].sum(-1), p0[0].expand(2))        # k = 1: the raw probability
    assert aux.item() == pytest.approx(2 * (1.0 * p0[0].item()), rel=1e-6)    # E · f_0 · P_0 (f_1 = 0)
    # Top-2: first choices queue before second ones. Tokens 0, 1, 2 pick (0, 1), (0, 1), (0, 2), capacity 2:
    # expert 0 keeps tokens 0, 1 (token 2's first choice is third); expert 1 keeps tokens 0, 1; expert 2 token 2.
    top_i = torch.tensor([[[0, 1], [0, 1], [0, 2]]])                        # (B=1, T=3, k=2)
    choice, slot, kept = moe.assign_slots(top_i, 3, 2)                      # rows: choice j of token t = j·T + t
    assert kept[0].nonzero().tolist() == [[0, 0], [1, 0], [3, 1], [4, 1], [5, 2]]
    assert [int(slot[0, r, e]) for r, e in kept[0].nonzero().tolist()] == [0, 1, 0, 1, 0]


@pytest.mark.parametrize("change, message", [
    ({"tp": 2, "sequence_parallel": True}, "TrainConfig.sequence_parallel=True is not supported with a mixture"),
    ({"zero_stage": 3}, "TrainConfig.zero_stage=3 is not supported .* use zero_stage 0, 1 or 2"),
    ({"ep": 3}, "ep is carved out of dp and must divide it"),
], ids=["sp", "zero3", "ep-not-dividing-dp"])
def test_refusals_name_the_setting(change, message):
    config = parity_config(**change)
    with pytest.raises(ValueError, match=message):
        dims = mm.ParallelDims(dp=4 if "tp" not in change else 2, tp=config.tp, ep=config.ep)
        validate(TINY, config, dims, MOE)


def test_expert_parallel_needs_experts():
    with pytest.raises(ValueError, match="ep=2 needs a mixture-of-experts model"):
        validate(TINY, parity_config(ep=2), mm.ParallelDims(dp=2, ep=2))
    with pytest.raises(ValueError, match="ep=4 does not divide n_experts=6"):
        validate(TINY, parity_config(ep=4), mm.ParallelDims(dp=4, ep=4), moe.MoEConfig(n_experts=6))


def test_parameter_count_and_alltoall_time_formulas():
    """`estimate.moe_params` counts `MoEGPT`'s tensors; `perf.moe_alltoall_time` is α-β over those bytes."""
    model = moe.MoEGPT(TINY, MOE)
    dense, experts = est.moe_params(TINY.n_layer, TINY.n_embd, TINY.vocab_size, TINY.block_size, MOE.n_experts)
    assert experts == sum(p.numel() for _, p in moe.expert_params(model))
    assert dense + experts == model.num_params()
    link = perf.Link(name="test", bandwidth=100e9, alpha=5e-6, efficiency=1.0)
    t = perf.moe_alltoall_time(24, 4, 4096, 4096, 8, 64, 2, 1.25, link)
    sent = est.moe_alltoall_bytes(24, 4, 4096, 4096, 8, 64, 2, 1.25, bytes_per_elem=2)
    assert t == pytest.approx(4 * 24 * 7 * 5e-6 + sent / 100e9, rel=1e-12)



def _resume_at_ep1(directory: str, config: mm.TrainConfig) -> tuple[dict, dict]:
    """Load an ep2 checkpoint on one process (ep1: every expert here) and train RESUMED more steps."""
    engine = mm.initialize(moe.MoEGPT(TINY, MOE), config, mm.init_mesh(mm.ParallelDims()))
    assert engine.load(directory) == STEPS
    loaded = engine.full_state_dict()
    for batch in data.global_batches(RESUMED, config.batch_size, TINY.block_size, start=STEPS, seed=config.seed):
        engine.train_step(batch)
    return loaded, engine.full_state_dict()


def test_cli_trains_a_mixture_of_experts(capsys):
    """`minimega train --experts 4 --ep 2`: every token makes top_k assignments in every layer and step."""
    from minimega.tools.cli import main
    steps = 2
    assert main(["train", "--nproc", "2", "--ep", "2", "--experts", "4", "--top-k", "2", "--steps", str(steps),
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    tokens = 8 * mm.GPTConfig.tiny().block_size * steps                     # batch 8, block 64
    assert [sum(layer) for layer in out["moe"]["routed"]] == [2 * tokens] * 4
    assert all(0 <= d <= r for lr, ld in zip(out["moe"]["routed"], out["moe"]["dropped"]) for r, d in zip(lr, ld))
    assert main(["train", "--nproc", "2", "--ep", "2", "--steps", "1"]) == 2
    assert "ep=2 needs a mixture-of-experts model" in capsys.readouterr().err


def test_ep_groups_are_carved_out_of_dp():
    """dp 4 × tp 2 (world 8), ep 2: each dp group splits into runs of 2; edp joins the same place in each run."""
    dims = mm.ParallelDims(dp=4, tp=2, ep=2)
    assert dims.world_size == 8
    assert dims.group_ranks("dp") == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert dims.group_ranks("ep") == [[0, 2], [4, 6], [1, 3], [5, 7]]
    assert dims.group_ranks("edp") == [[0, 4], [2, 6], [1, 5], [3, 7]]
    with pytest.raises(ValueError, match="ep is carved out of dp and must divide it"):
        mm.ParallelDims(dp=4, ep=3)
