"""DeepSeekMoE's shared and fine-grained experts (`MoEConfig.n_shared_experts`, ``expert_hidden``).

The oracles: plain torch ops and `model.GPT`'s dense MLP for the shared experts (routed experts zeroed leave
only them), every expert run on every token for the routed ones, the single-process `MoEGPT` for dp 2 × ep 2
(gradients after the first step, weights after a few, a checkpoint loaded at ep 1), `sum(p.numel())`, the
bytes autograd saves and the FLOPs torch counts for the estimator.
"""
from __future__ import annotations

import math
import traceback

import pytest

import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

import minimega as mm
from minimega import data
from minimega.parallel.moe import layer as moe
from minimega import estimate as est
from minimega.train.activation_checkpoint import saved_activation_bytes
from parity import assert_case_matches, assert_grads_match, max_rel_error, parity_config
from test_moe import reference
from test_moe_dropless import dense_reference

TINY = mm.GPTConfig.tiny(block_size=32)
# Fine-grained: 8 experts of D/2 = 32 (one 4D expert split in 8), top 2, and one shared expert of 32.
FINE = moe.MoEConfig(n_experts=8, top_k=2, capacity_factor=1.25, expert_hidden=32, n_shared_experts=1)
STEPS = 3


def plain_mlp(x: torch.Tensor, fc: torch.Tensor, proj: torch.Tensor) -> torch.Tensor:
    """gelu(x fcᵀ) projᵀ with torch ops only: the shared experts' definition."""
    return F.gelu(x @ fc.t()) @ proj.t()


def _layer(dispatch: str, n_shared: int, **kw) -> moe.MoELayer:
    torch.manual_seed(0)
    cfg = moe.MoEConfig(n_experts=8, top_k=2, expert_hidden=16, n_shared_experts=n_shared, dispatch=dispatch,
                        **{"capacity_factor": 4.0, **kw})
    layer = moe.MoELayer(mm.GPTConfig.tiny(n_embd=16, n_head=2), cfg)
    for p in layer.parameters():
        torch.nn.init.normal_(p, std=0.3)
    return layer


@pytest.mark.parametrize("dispatch", ["capacity", "dropless"])
def test_zeroed_routed_experts_leave_the_shared_mlp(dispatch):
    """Routed experts all zero: the layer is its shared experts, a dense MLP of hidden S·F = 2·16, in value and
    in the gradients of the input and the shared weights; the model is `model.GPT` with those MLP weights."""
    layer = _layer(dispatch, n_shared=2)
    assert tuple(layer.shared.fc.weight.shape) == (32, 16) and tuple(layer.experts.fc.shape) == (8, 16, 16)
    with torch.no_grad():
        layer.experts.fc.zero_()
        layer.experts.proj.zero_()
    x = torch.randn(2, 12, 16, requires_grad=True)
    x2 = x.detach().clone().requires_grad_()
    want = plain_mlp(x2, layer.shared.fc.weight, layer.shared.proj.weight)
    y = layer(x)
    assert torch.allclose(y, want, rtol=1e-6, atol=1e-7), f"{(y - want).abs().max():.2e}"
    got = torch.autograd.grad(y.square().sum(), [x, layer.shared.fc.weight, layer.shared.proj.weight])
    ref = torch.autograd.grad(want.square().sum(), [x2, layer.shared.fc.weight, layer.shared.proj.weight])
    for g, r in zip(got, ref):
        assert torch.allclose(g, r, rtol=1e-5, atol=1e-6), f"{(g - r).abs().max():.2e}"
    # The whole model: MoEGPT(S = 1, F = 4D, routed experts zero) gives the dense GPT's logits, bit for bit.
    torch.manual_seed(3)
    dense = mm.GPT(TINY)
    one = moe.MoEGPT(TINY, moe.MoEConfig(n_experts=4, n_shared_experts=1, dispatch=dispatch))
    state = dense.state_dict()
    with torch.no_grad():
        for name, t in one.state_dict().items():
            if ".mlp.experts." in name:
                t.zero_()
            elif ".mlp.shared." in name:
                t.copy_(state[name.replace(".mlp.shared.", ".mlp.")])
            elif ".mlp.router." not in name:
                t.copy_(state[name])
    x, y = data.global_batch(0, 4, TINY.block_size)
    assert torch.equal(dense(x)[0], one(x)[0])


@pytest.mark.parametrize("dispatch", ["capacity", "dropless"])
def test_fine_grained_and_shared_experts_match_every_expert_on_every_token(dispatch):
    """E = 8 experts of F = D, top 2, S = 1 shared: y = Σ_e w_e · MLP_e(x) (w zero off the top-k, from the layer's
    router) + the shared MLP, computed with no slots, sorting or indices; capacity ≥ T keeps every token."""
    layer = _layer(dispatch, n_shared=1)
    x = torch.randn(3, 10, 16)
    want = dense_reference(layer, x) + plain_mlp(x, layer.shared.fc.weight, layer.shared.proj.weight)
    assert torch.allclose(layer(x), want, rtol=1e-5, atol=1e-6)
    assert layer.dropped.sum() == 0


def test_shared_experts_are_dense_parameters():
    """The shared MLP is not an expert: `expert_params` (ExpertGradSync, ZeRO-1 over edp, clipping over ep, the
    checkpoint's expert layout) never sees it, and the dp wrappers (`dp_named_parameters`) do."""
    from minimega.parallel.grad_sync import dp_named_parameters
    model = moe.MoEGPT(TINY, FINE)
    experts = {n for n, _ in moe.expert_params(model)}
    dense = {n for n, _ in dp_named_parameters(model)}
    shared = {n for n, _ in model.named_parameters() if ".mlp.shared." in n}
    assert len(shared) == 2 * TINY.n_layer and shared <= dense and not shared & experts
    assert experts == {n for n, _ in model.named_parameters() if ".mlp.experts." in n}


@pytest.mark.parametrize("bad, message", [
    ({"expert_hidden": 0}, "MoEConfig.expert_hidden must be a positive integer or None, got 0"),
    ({"expert_hidden": 2.5}, "MoEConfig.expert_hidden must be a positive integer"),
    ({"n_shared_experts": -1}, "MoEConfig.n_shared_experts must be an integer >= 0, got -1"),
])
def test_bad_settings_are_refused_by_name(bad, message):
    with pytest.raises(ValueError, match=message):
        moe.MoEConfig(**bad)


def test_estimator_counts_shared_and_fine_grained_experts():
    """Parameters: `moe_params` = Σ numel, the expert part = `expert_params`', and the memory calculator's split;
    activations: the bytes autograd saves in one layer, both dispatches; FLOPs: `moe_mlp_flops_per_token` =
    torch's count of the matmuls (dropless: exactly k experts per token, no empty slot), forward and backward."""
    model = moe.MoEGPT(TINY, FINE)
    dense, experts = est.moe_params(TINY.n_layer, TINY.n_embd, TINY.vocab_size, TINY.block_size, FINE.n_experts,
                                    expert_hidden=FINE.expert_hidden, n_shared=FINE.n_shared_experts)
    assert experts == sum(p.numel() for _, p in moe.expert_params(model))
    assert dense + experts == sum(p.numel() for p in model.parameters())
    # The memory calculator (`memory_per_gpu`; its JS twin: tests/test_site.py): E/ep experts of F on a rank, the
    # shared MLP with the non-expert parameters.
    mem = dict(layers=4, hidden=64, heads=4, vocab=256, seq_len=32, dp=2, ep=2, experts=8, expert_ffn=32)
    none, one = (est.stage_param_split(est.MemoryConfig(**mem, shared_experts=s)) for s in (0, 1))
    assert one[1] == experts / 2
    assert one[0] - none[0] == sum(p.numel() for n, p in model.named_parameters() if ".mlp.shared." in n)
    s, b, h = 32, 2, 16
    for dispatch in ("capacity", "dropless"):
        layer = _layer(dispatch, n_shared=2, capacity_factor=1.25)
        x = torch.randn(b, s, h, requires_grad=True)
        kw = dict(dispatch=dispatch, expert_hidden=16, n_shared=2)
        assert saved_activation_bytes(layer, x) == est.moe_mlp_activation_bytes(s, b, h, 8, 2, 1.25, **kw), dispatch
    layer = _layer("dropless", n_shared=2)
    x = torch.randn(b, s, h, requires_grad=True)
    # torch's counter has no formula for the grouped matmul: row block e of a (M, K) times its (K, N) costs 2·M·K·N
    # in all (forward, and each of its two backward grouped matmuls: a (K, M) by (M, N), or (M, N) by (N, K)).
    grouped = {torch.ops.aten._grouped_mm: lambda a, b, *args, out_shape=None, **kw: 2 * math.prod(a) * b[-1]}
    with FlopCounterMode(display=False, custom_mapping=grouped) as counter:
        layer(x).sum().backward()
    assert counter.get_total_flops() == b * s * est.moe_mlp_flops_per_token(h, 8, 2, expert_hidden=16, n_shared=2)
    # DeepSeekMoE's split leaves the expert FLOPs alone: E, F, k → 4E, F/4, 4k costs only the router's extra.
    coarse, fine = (est.moe_mlp_flops_per_token(64, e, k, expert_hidden=f) for e, k, f in ((8, 2, 256), (32, 8, 64)))
    assert fine - coarse == 6 * 64 * (32 - 8)


def _cases(cases, save_dir):
    """Rank function: train each (dp, ep, config) case with FINE; report state, losses and step-1 gradients
    (this rank's expert slices; the test joins them over ep). Case 1 saves a checkpoint into ``save_dir``."""
    out = []
    for i, (dp, ep, config) in enumerate(cases):
        try:
            mesh = mm.init_mesh(mm.ParallelDims(dp=dp, tp=config.tp, ep=ep))
            torch.manual_seed(config.seed)
            engine = mm.initialize(moe.MoEGPT(TINY, FINE), config, mesh)
            grads = []
            if not config.zero_stage:
                engine.before_step.append(lambda e: grads.append(
                    {n: p.grad.detach().clone() for n, p in e.model.named_parameters()}) if e.step == 0 else None)
            for batch in data.batches(mesh, STEPS, config.batch_size, TINY.block_size, seed=config.seed):
                engine.train_step(batch)
            state = engine.full_state_dict()
            if i == 1:
                engine.save(save_dir)
            report = engine.report()
            out.append({"state": state if mesh.rank == 0 else None, "losses": report["losses"],
                        "grad_norms": report["grad_norms"], "grads": grads})
        except Exception:
            out.append({"error": traceback.format_exc()})
    return out


def _reference_grads(config: mm.TrainConfig) -> dict:
    """The single-process MoEGPT's first-step gradients on the same global batch."""
    torch.manual_seed(config.seed)
    model = moe.MoEGPT(TINY, FINE)
    (x, y), = data.global_batches(1, config.batch_size, TINY.block_size, seed=config.seed)
    model(x, y)[1].backward()
    return {n: p.grad.detach().clone() for n, p in model.named_parameters()}


CLIP = 0.3        # below every step's norm (about 2): each step clips
NORM_ONLY = 1e9   # the norm is computed and logged, the gradients scaled by 1.0


def test_dp2_ep2_matches_single_process(tmp_path):
    """dp 2 × ep 2 (edp 1) with 8 fine-grained experts and a shared one: the step-1 gradients (shared MLP
    averaged over dp like attention, experts summed over ep's tokens) and the weights after STEPS steps under
    DDP, under ZeRO-1 with clipping, and under tp 2 (the MoE layer, shared MLP included, whole on each tp rank)
    equal the single-process run's, and so does every step's gradient norm (each parameter counted once, over
    ep, dp and tp); the ZeRO-1 checkpoint loads at ep 1. (Clipping under tp 2 as well ends 1.1e-5 off, in
    blocks.3.attn.proj, outside the MoE layer: Adam magnifying a near-zero gradient, see `parity_config`.)"""
    plain = parity_config(ep=2)
    zero, tp = parity_config(ep=2, zero_stage=1, gradient_clipping=CLIP), parity_config(tp=2, gradient_clipping=NORM_ONLY)
    results = mm.launch(_cases, 2, [(2, 2, plain), (2, 2, zero), (1, 1, tp)], str(tmp_path / "ckpt"), timeout=300)
    ref_grads = _reference_grads(parity_config())
    got = dict(results[0][0]["grads"][0]) if "error" not in results[0][0] else {}
    for name, g in got.items():        # experts: rank r holds rows [r·E/2, (r+1)·E/2)
        if ".mlp.experts." in name:
            got[name] = torch.cat([results[0][0]["grads"][0][name], results[1][0]["grads"][0][name]])
    for r in results:
        assert "error" not in r[0], r[0].get("error")
    assert_grads_match("dp2-ep2", [got], [ref_grads], "fp32", plain.batch_size * TINY.block_size, 1)
    for i, (name, config) in enumerate((("dp2-ep2", plain), ("dp2-ep2-zero1-clip", zero), ("tp2", tp))):
        norms = []
        ref_state, ref_losses, _ = reference(TINY, FINE, parity_config(ep=1, gradient_clipping=config.gradient_clipping),
                                             STEPS, norms=norms)
        assert_case_matches(name, [r[i] for r in results], ref_state, ref_losses, "fine-grained MoE", STEPS)
        for r in results:
            got_norms = r[i]["grad_norms"]
            assert len(got_norms) == len(norms) and all(abs(a - b) <= 1e-6 * b for a, b in zip(got_norms, norms)), \
                f"{name}: gradient norms {got_norms} != single process {norms}"
        assert config.gradient_clipping != CLIP or min(norms) > CLIP, f"{name}: norms {norms}, the clip must bite"
    engine = mm.initialize(moe.MoEGPT(TINY, FINE), parity_config(zero_stage=1), mm.init_mesh(mm.ParallelDims()))
    assert engine.load(str(tmp_path / "ckpt")) == STEPS
    assert max_rel_error(engine.full_state_dict(), results[0][1]["state"]) == 0.0


def test_cli_trains_shared_and_fine_grained_experts(capsys):
    """`minimega train --experts 8 --shared-experts 1 --expert-hidden 32` trains; the new flags without
    --experts, or a bad width, are refused by their flag names."""
    from minimega.tools.cli import main
    assert main(["train", "--nproc", "1", "--experts", "8", "--shared-experts", "1", "--expert-hidden", "32",
                 "--steps", "1", "--json"]) == 0
    capsys.readouterr()
    assert main(["train", "--nproc", "1", "--shared-experts", "1", "--steps", "1"]) == 2
    assert "--shared-experts need --experts N" in capsys.readouterr().err
    assert main(["train", "--nproc", "1", "--expert-hidden", "32", "--steps", "1"]) == 2
    assert "--expert-hidden need --experts N" in capsys.readouterr().err
