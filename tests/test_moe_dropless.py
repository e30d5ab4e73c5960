"""Dropless MoE dispatch (`minimega.parallel.moe.dropless`): a dense plain-torch computation is the reference.

Single process: forced routings against the loop (outputs and gradients), no token dropped whatever the
capacity factor, the bytes autograd saves equal to the estimator. One world-2 launch: dp 2 × ep 2 with
variable all-to-alls trains as the single-process dropless model does, and sends the rows it routed away.
"""
from __future__ import annotations

import math
import traceback

import pytest
import torch
import torch.nn.functional as F

import minimega as mm
from minimega import data
from minimega.parallel.moe import layer as moe
from minimega import estimate as est
from minimega.train.activation_checkpoint import saved_activation_bytes
from parity import assert_case_matches, parity_config
from test_moe import reference

TINY = mm.GPTConfig.tiny(block_size=32)
DROPLESS = moe.MoEConfig(n_experts=4, top_k=2, capacity_factor=0.5, dispatch="dropless")
STEPS = 3


def dense_reference(layer: moe.MoELayer, x: torch.Tensor) -> torch.Tensor:
    """Every expert on every token, (B, T, E, D), weighted by a (B, T, E) gate matrix that is zero off the
    top-k: y = Σ_e w_e · MLP_e(x), from the layer's weights, with no sorting, slots or indices."""
    k = layer.moe.top_k
    p = torch.softmax(x @ layer.router.weight.t(), -1)                           # (B, T, E)
    top_p, top_i = p.topk(k, -1)
    gates = top_p / top_p.sum(-1, keepdim=True) if k > 1 else top_p
    w = torch.zeros_like(p).scatter(-1, top_i, gates)
    every = torch.stack([F.gelu(x @ fc.t()) @ proj.t() for fc, proj in zip(layer.experts.fc, layer.experts.proj)], 2)
    return (w.unsqueeze(-1) * every).sum(2)


def _layer(**kw) -> moe.MoELayer:
    torch.manual_seed(0)
    layer = moe.MoELayer(mm.GPTConfig.tiny(n_embd=16, n_head=2), moe.MoEConfig(**{"dispatch": "dropless", **kw}))
    for p in layer.parameters():
        torch.nn.init.normal_(p, std=0.3)
    return layer


@pytest.mark.parametrize("k", [1, 2])
def test_forced_routing_matches_the_loop_and_drops_nothing(k):
    """Every token's first choice forced onto expert 0 (a capacity path would keep C of them): outputs and
    gradients equal the dense reference's, at any capacity factor, and the counters show no drop."""
    for cf in (0.05, 1.0, 4.0):
        layer = _layer(n_experts=4, top_k=k, capacity_factor=cf)
        with torch.no_grad():
            layer.router.weight[0] += 5.0 * layer.router.weight.new_ones(16)
        x = (torch.rand(2, 12, 16) + 0.5).requires_grad_()          # positive: x · w_0 dominates
        y = layer(x)
        assert layer.routed[0] == 24 and layer.routed.sum() == 24 * k and layer.dropped.sum() == 0, cf
        x2 = x.detach().clone().requires_grad_()
        want = dense_reference(layer, x2)
        assert torch.allclose(y, want, rtol=1e-5, atol=1e-6), f"cf={cf}: {(y - want).abs().max():.2e}"
        grads = torch.autograd.grad(y.square().sum(), [x, *layer.parameters()])
        ref = torch.autograd.grad(want.square().sum(), [x2, *layer.parameters()])
        for g, r in zip(grads, ref):
            assert torch.allclose(g, r, rtol=1e-4, atol=1e-6), f"cf={cf}: grad {(g - r).abs().max():.2e}"


def test_dropless_equals_the_capacity_path_when_nothing_is_dropped():
    """With capacity ≥ T the capacity path drops nothing either: the two dispatches agree on a random routing."""
    cap = _layer(n_experts=4, top_k=2, dispatch="capacity", capacity_factor=2.0)      # C = T
    drop = _layer(n_experts=4, top_k=2)
    x = torch.randn(3, 10, 16)
    assert cap.moe.capacity(10) == 10
    assert torch.allclose(cap(x), drop(x), rtol=1e-5, atol=1e-6)
    assert torch.equal(cap.routed, drop.routed) and cap.dropped.sum() == 0


SHAPES = [(32, 2, 64, 4, 4, 2), (64, 1, 64, 4, 8, 1), (48, 3, 32, 2, 6, 3)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "s{}-b{}-h{}-a{}-E{}-k{}".format(*s))
def test_saved_bytes_equal_the_estimator_without_the_one_hot_term(shape):
    s, b, h, a, E, k = shape
    torch.manual_seed(0)
    cfg = mm.GPTConfig(n_layer=1, n_head=a, n_embd=h, block_size=s, vocab_size=256, bias=False, dropout=0.0)
    layer = moe.MoEGPT(cfg, moe.MoEConfig(n_experts=E, top_k=k, dispatch="dropless")).blocks[0].mlp
    x = torch.randn(b, s, h, requires_grad=True)
    measured = saved_activation_bytes(layer, x)
    assert measured == est.dropless_mlp_activation_bytes(s, b, h, E, k)
    assert measured == est.moe_mlp_activation_bytes(s, b, h, E, k, 1.25, dispatch="dropless")
    # the capacity path at C = T keeps the same rows padded to E·C plus N·E·C·(k + 2) one-hot elements
    C = est.moe_capacity(s, E, k, 100.0)
    assert est.moe_mlp_activation_bytes(s, b, h, E, k, 100.0) - measured > 4 * s * b * E * C * (k + 2)
    # linear in s: doubling the sequence doubles every term but the per-sequence top-1 fractions b·E and the
    # E int32 ends of the experts' row blocks
    assert est.dropless_mlp_activation_bytes(2 * s, b, h, E, k) == 2 * measured - 4 * b * E - 4 * E


def _ranks(cases):
    out = []
    for dp, ep, moe_config, config in cases:
        try:
            mesh = mm.init_mesh(mm.ParallelDims(dp=dp, ep=ep))
            torch.manual_seed(config.seed)
            engine = mm.initialize(moe.MoEGPT(TINY, moe_config), config, mesh)
            for batch in data.batches(mesh, STEPS, config.batch_size, TINY.block_size, seed=config.seed):
                engine.train_step(batch)
            report = engine.report()
            a2a = [e for e in report["comm_events"] if e["op"] == "all_to_all"]
            sent = {}
            for e in a2a:
                sent[e["tag"]] = sent.get(e["tag"], 0.0) + e["sent_bytes"]
            state = engine.full_state_dict()                     # a collective: every rank takes part
            out.append({"state": state if mesh.rank == 0 else None, "losses": report["losses"],
                        "moe": report["moe"], "sent": sent, "ep_rank": mesh.ep_rank})
        except Exception:
            out.append({"error": traceback.format_exc()})
    return out


BALANCED = moe.MoEConfig(n_experts=4, top_k=2, dispatch="dropless", z_loss_coef=0.1, bias_update_rate=0.01)
CASES = [("dp2-ep2-dropless-ga2", DROPLESS, {"gradient_accumulation_steps": 2}),
         ("dp2-ep2-dropless-zloss-bias-ga2", BALANCED, {"gradient_accumulation_steps": 2})]


@pytest.fixture(scope="module")
def launched():
    return mm.launch(_ranks, 2, [(2, 2, m, parity_config(ep=2, **kw)) for _, m, kw in CASES], timeout=600)


@pytest.mark.parametrize("case", range(len(CASES)), ids=[c[0] for c in CASES])
def test_expert_parallel_dropless_matches_single_process(launched, case):
    """Weights (the routing biases among them), losses, routed counts and all-to-all bytes; the second case
    adds the z-loss and the bias balancing, whose loads are summed over dp before every update."""
    name, moe_config, kw = CASES[case]
    ref_state, ref_losses, ref_counts = reference(TINY, moe_config, parity_config(**kw), STEPS)
    per_rank = [r[case] for r in launched]
    if moe_config.bias_update_rate:
        biases = [v for k, v in ref_state.items() if k.endswith("expert_bias")]
        assert len(biases) == TINY.n_layer and all(b.abs().sum() > 0 for b in biases), "the biases moved"
    assert_case_matches(name, per_rank, ref_state, ref_losses, "dropless MoE", STEPS)
    summed = torch.tensor([r["moe"]["routed"] for r in per_rank]).sum(0)
    assert torch.equal(summed, torch.tensor(ref_counts["routed"])), name
    assert summed.sum() == TINY.n_layer * STEPS * 8 * TINY.block_size * moe_config.top_k     # every pair kept
    assert all(sum(map(sum, r["moe"]["dropped"])) == 0 for r in per_rank)
    # Bytes: rank r sends the rows it routed to the other rank's experts (dispatch, and their gradients back
    # in combine's backward) and the rows its experts got from the other rank (combine, dispatch's backward).
    local = moe_config.n_experts // 2
    for r, other in ((per_rank[0], per_rank[1]), (per_rank[1], per_rank[0])):
        mine = range(r["ep_rank"] * local, (r["ep_rank"] + 1) * local)
        away = sum(n for layer in r["moe"]["routed"] for e, n in enumerate(layer) if e not in mine)
        home = sum(n for layer in other["moe"]["routed"] for e, n in enumerate(layer) if e in mine)
        row = TINY.n_embd * 4
        assert r["sent"]["moe_dispatch"] == r["sent"]["moe_combine_grad"] == away * row, name
        assert r["sent"]["moe_combine"] == r["sent"]["moe_dispatch_grad"] == home * row, name
        calls = TINY.n_layer * STEPS * kw["gradient_accumulation_steps"]
        assert math.isclose(r["sent"]["moe_counts"], calls * moe_config.n_experts * 8 / 2), name


def test_dropless_refuses_rows_the_grouped_matmul_cannot_take():
    """`Experts.grouped` runs on 16-byte rows (fp32: widths in multiples of 4): refused when the layer is built."""
    cfg = mm.GPTConfig(n_layer=1, n_head=2, n_embd=6, block_size=8, vocab_size=32, bias=False)
    with pytest.raises(ValueError, match="n_embd=6 and the expert width 24 must be multiples of 4"):
        moe.MoEGPT(cfg, moe.MoEConfig(dispatch="dropless"))
    moe.MoEGPT(cfg, moe.MoEConfig(dispatch="capacity"))          # the capacity path's batched matmul takes any width
