"""Router z-loss (ST-MoE) and auxiliary-loss-free balancing (DeepSeek-V3) against plain-torch computations.

Single process, no launch: the engine's dp × ep parity of both is in test_moe_dropless.py.
"""
from __future__ import annotations

import pytest
import torch

import minimega as mm
from minimega import data
from minimega.parallel.moe import layer as moe
from minimega.parallel.moe.balance import update_routing_bias

TINY = mm.GPTConfig.tiny(block_size=16, n_layer=2)


@pytest.mark.parametrize("dispatch", ["capacity", "dropless"])
def test_z_loss_is_the_mean_squared_logsumexp_of_the_router_logits(dispatch):
    """loss(c) − loss(0) = c · Σ_layers mean_t logsumexp(router logits)², the logits taken by forward hooks; the
    gradient of the difference is the z-loss's own (torch autograd on the hooked logits)."""
    x, y = data.global_batch(0, 2, TINY.block_size)
    c = 0.25
    torch.manual_seed(0)
    with_z = moe.MoEGPT(TINY, moe.MoEConfig(dispatch=dispatch, z_loss_coef=c))
    without = moe.MoEGPT(TINY, moe.MoEConfig(dispatch=dispatch))
    without.load_state_dict(with_z.state_dict())
    logits = []
    hooks = [m.router.register_forward_hook(lambda mod, inp, out: logits.append(out)) for m in with_z.moe_layers()]
    loss_z = with_z(x, y)[1]
    for h in hooks:
        h.remove()
    loss_0 = without(x, y)[1]
    z = sum(torch.log(torch.exp(t.double()).sum(-1)).square().mean() for t in logits)      # no logsumexp call
    assert (loss_z - loss_0).item() == pytest.approx(c * z.item(), rel=1e-5)
    w = with_z.blocks[0].mlp.router.weight
    got = torch.autograd.grad(loss_z, w, retain_graph=True)[0] - torch.autograd.grad(loss_0, without.blocks[0].mlp.router.weight)[0]
    want = torch.autograd.grad(c * z, w)[0]
    assert torch.allclose(got, want.float(), rtol=1e-4, atol=1e-7)


def _layer(rate=0.05, k=1, dispatch="dropless"):
    torch.manual_seed(0)
    layer = moe.MoELayer(mm.GPTConfig.tiny(n_embd=8, n_head=2), moe.MoEConfig(
        n_experts=4, top_k=k, dispatch=dispatch, bias_update_rate=rate, capacity_factor=4.0))
    torch.nn.init.normal_(layer.router.weight, std=0.5)
    for w in (layer.experts.fc, layer.experts.proj):     # a bare layer's experts are torch.empty until GPT's init
        torch.nn.init.normal_(w, std=0.02)
    return layer


@pytest.mark.parametrize("dispatch", ["capacity", "dropless"])
def test_the_bias_picks_the_experts_and_the_gates_stay_unbiased(dispatch):
    """A bias of +10 on expert 3 sends every token's first choice there; the gate is p_3 from the plain
    softmax (k = 1), so the output is p_3 · MLP_3(x) and the bias gets no gradient."""
    layer = _layer(dispatch=dispatch)
    layer.expert_bias[3] = 10.0
    x = torch.randn(2, 6, 8)
    y = layer(x)
    assert layer.routed.tolist() == [0, 0, 0, 12]
    p = torch.softmax(x @ layer.router.weight.t(), -1)[..., 3:4]
    mlp = torch.nn.functional.gelu(x @ layer.experts.fc[3].t()) @ layer.experts.proj[3].t()
    assert torch.allclose(y, p * mlp, rtol=1e-5, atol=1e-6)
    assert not layer.expert_bias.requires_grad and "expert_bias" in layer.state_dict()


def test_bias_update_follows_the_sign_of_the_load_gap_and_balances():
    """One update: b_e += γ · sign(mean − load_e) with the load counted here from the router's top-k of
    probs + b. Repeated updates on a fixed batch (no training) spread a router that prefers one expert."""
    layer = _layer(rate=0.01, k=2)
    with torch.no_grad():
        layer.router.weight[0] += 0.1                       # expert 0 wins nearly every token
    x = torch.rand(4, 16, 8) + 0.5
    p = torch.softmax(x @ layer.router.weight.t(), -1)
    load = torch.bincount((p + layer.expert_bias).topk(2, -1).indices.reshape(-1), minlength=4).double()
    before = layer.expert_bias.clone()
    layer(x)
    update_routing_bias([layer])
    assert torch.equal(layer.expert_bias, before + (0.01 * torch.sign(load.mean() - load)).float())
    assert layer.step_load.sum() == 0
    spread = [load.max().item() - load.min().item()]
    for _ in range(30):
        layer(x)
        spread.append((layer.step_load.max() - layer.step_load.min()).item())
        update_routing_bias([layer])
    assert spread[0] >= 50 and max(spread[-5:]) <= spread[0] / 4, spread


def test_rates_and_dispatch_are_checked():
    for bad in ({"z_loss_coef": -1.0}, {"bias_update_rate": float("nan")}, {"dispatch": "sparse"}):
        with pytest.raises(ValueError, match=f"MoEConfig.{next(iter(bad))}"):
            moe.MoEConfig(**bad)


def test_saving_with_routing_biases_is_refused_by_name(tmp_path):
    """The biases are buffers the checkpoint does not store: a save would resume with zero biases."""
    cfg = mm.TrainConfig(batch_size=2)
    engine = mm.initialize(moe.MoEGPT(TINY, moe.MoEConfig(bias_update_rate=0.01)), cfg, mm.init_mesh(mm.ParallelDims()))
    engine.train_step(data.global_batch(0, 2, TINY.block_size))
    layers = [m for m in engine.model.modules() if isinstance(m, moe.MoELayer)]
    assert layers and all(m.expert_bias.abs().sum() > 0 for m in layers)         # the engine moved them
    with pytest.raises(ValueError, match="bias_update_rate > 0 .* use bias_update_rate=0 to save"):
        engine.save(tmp_path / "ckpt")
    assert not any(tmp_path.iterdir())
