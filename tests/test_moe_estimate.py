"""Mixture of experts in the estimator and the time model, against minimega's own `MoEGPT`.

The activation count is measured (``saved_tensors_hooks``) on the real layer and must match exactly; the
model states, the all-to-all time and the FLOPs are checked against the closed forms `parallel/moe/layer.py` already
pins (`moe_model_state_bytes`, `moe_alltoall_time`) and against a dense model when one expert is forced.
"""
import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import minimega as mm
from minimega import estimate as est
from minimega.analysis import perf
from minimega.train.activation_checkpoint import saved_activation_bytes
from minimega.parallel.moe.layer import MoEConfig, MoEGPT

SHAPES = [(32, 2, 64, 4, 4, 2, 1.25), (64, 1, 64, 4, 8, 1, 1.0), (64, 4, 128, 4, 4, 2, 2.0),
          (128, 2, 64, 4, 16, 2, 1.25), (48, 3, 32, 2, 6, 3, 0.5)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "s{}-b{}-h{}-a{}-E{}-k{}-cf{}".format(*s))
def test_moe_block_activations_are_measured_exactly(shape):
    s, b, h, a, E, k, cf = shape
    torch.manual_seed(0)
    cfg = mm.GPTConfig(n_layer=1, n_head=a, n_embd=h, block_size=s, vocab_size=256, bias=False, dropout=0.0)
    block = MoEGPT(cfg, MoEConfig(n_experts=E, top_k=k, capacity_factor=cf)).blocks[0]
    x = torch.randn(b, s, h, requires_grad=True)
    assert saved_activation_bytes(block.mlp, x) == est.moe_mlp_activation_bytes(s, b, h, E, k, cf)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        measured = saved_activation_bytes(block, x)
    assert measured == est.gpt_activation_bytes_per_layer(s, b, h, a, attention="flash") + \
        est.moe_activation_delta(s, b, h, E, k, cf)


def test_the_one_hot_dispatch_is_quadratic_in_sequence_length():
    """GShard's dense dispatch keeps N·E·C·(k+2) elements with C ∝ s: doubling s quadruples that term."""
    def onehot(s):
        C = est.moe_capacity(s, 8, 2, 1.25)
        return s * 8 * C * 4
    grow = [est.moe_mlp_activation_bytes(s, 1, 64, 8, 2, 1.25) for s in (1024, 2048, 4096)]
    assert onehot(2048) == 4 * onehot(1024)
    assert grow[2] / grow[1] > 3.5 and grow[1] / grow[0] > 3.5


def _moe_cfg(**kw):
    base = dict(layers=4, hidden=256, heads=4, vocab=1024, seq_len=128, micro_batch=2, precision="fp32", dp=4,
                experts=8, top_k=2, capacity_factor=1.25, ep=2)
    return est.MemoryConfig(**{**base, **kw})


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_states_put_experts_outside_zero(stage):
    cfg = _moe_cfg(zero_stage=stage)
    n_dense, n_expert = est.stage_param_split(cfg)
    assert n_expert == cfg.layers * cfg.experts / cfg.ep * 8 * cfg.hidden ** 2
    mem = est.memory_per_gpu(cfg)
    states = mem["params"] + mem["grads"] + mem["optimizer"]
    assert states == pytest.approx(est.moe_model_state_bytes(n_dense, n_expert * cfg.ep, cfg.dp, cfg.ep, stage, "fp32"))
    # the experts of minimega's MoEGPT, per rank after `shard_experts`: the same count
    model = MoEGPT(mm.GPTConfig(n_layer=4, n_head=4, n_embd=256, block_size=128, vocab_size=1024, bias=False),
                   MoEConfig(n_experts=8))
    experts = sum(p.numel() for layer in model.moe_layers() for p in layer.experts.parameters())
    assert n_expert == experts / cfg.ep


def test_activations_and_recompute_with_experts():
    dense = est.memory_per_gpu(_moe_cfg(experts=0, ep=1))
    moe = est.memory_per_gpu(_moe_cfg())
    delta = est.moe_activation_delta(128, 2, 256, 8, 2, 1.25, act_bytes=4)
    assert moe["activations"] - dense["activations"] == pytest.approx(4 * delta)
    full_d, full_m = (est.memory_per_gpu(_moe_cfg(recompute="full", **kw)) for kw in ({"experts": 0, "ep": 1}, {}))
    assert full_m["activations"] == full_d["activations"]             # only the block inputs are kept
    assert full_m["recompute"] - full_d["recompute"] == pytest.approx(delta)


@pytest.mark.parametrize("kw,match", [({"ep": 3}, "must divide"), ({"top_k": 9}, "top_k"),
                                      ({"capacity_factor": 0.0}, "capacity_factor"),
                                      ({"experts": 0}, "needs experts"), ({"sp": True, "tp": 2}, "sp=True"),
                                      ({"experts": -2, "ep": 1}, "experts=")])
def test_bad_expert_settings_are_refused_by_name(kw, match):
    with pytest.raises(ValueError, match=match):
        est.memory_per_gpu(_moe_cfg(**kw))


def _step(**kw):
    base = dict(layers=8, hidden=2048, heads=16, vocab=50257, seq_len=2048, micro_batch=2, dp=16,
                global_batch=128, experts=8, top_k=2, capacity_factor=1.25, ep=4)
    return perf.step_time(perf.PerfConfig(**{**base, **kw}), "h100")


def test_all_to_all_time_is_the_closed_form_on_the_critical_path():
    r = _step()
    hw = perf.hardware("h100")
    m = r["micro_batches"]
    one = perf.moe_alltoall_time(8, 2, 2048, 2048, 4, 8, 2, 1.25, hw.link(4), bytes_per_elem=2)
    assert r["ep_comm"] == pytest.approx(m * one)
    assert _step(ep=1)["ep_comm"] == 0
    assert _step(recompute="full")["ep_comm"] == pytest.approx(1.5 * r["ep_comm"])     # the forward's two again
    parts = ("compute", "tp_comm", "ep_comm", "p2p", "bubble", "stack_overhead", "dp_comm", "offload", "optimizer")
    assert r["total"] == pytest.approx(sum(r[k] for k in parts))


def test_one_expert_costs_what_the_dense_mlp_costs():
    """E = 1, k = 1, capacity 1: every token takes its one slot. The experts' GEMMs are the dense MLP's, the
    extra model FLOPs only the router's 6·B·s·L·h·E."""
    dense = perf.PerfConfig(layers=8, hidden=1024, heads=16, vocab=50257, seq_len=1024, micro_batch=2, global_batch=2)
    one = perf.replace(dense, experts=1, top_k=1, capacity_factor=1.0)
    ops_d, ops_m = dict((n, f) for n, f, _ in perf.layer_ops(dense)), dict((n, f) for n, f, _ in perf.layer_ops(one))
    for d, m in (("fc1", "expert fc1"), ("gelu", "expert gelu"), ("fc2", "expert fc2")):
        assert ops_m[m] == ops_d[d]
    # an expert of width F costs a dense MLP of width F; a shared expert, every token's, costs the dense MLP
    narrow = dict((n, f) for n, f, _ in perf.layer_ops(perf.replace(one, expert_ffn=2048, shared_experts=1)))
    dense_f = dict((n, f) for n, f, _ in perf.layer_ops(perf.replace(dense, ffn=2048)))
    for d in ("fc1", "gelu", "fc2"):
        assert narrow["expert " + d] == dense_f[d] and narrow["shared " + d] == dense_f[d]
    assert est.moe_extra_flops(one) == 6 * 2 * 1024 * 8 * 1024 * 1
    top2 = perf.replace(one, experts=8, top_k=2)
    assert est.moe_extra_flops(top2) == 48 * 2 * 1024 * 8 * 1024 ** 2 + 6 * 2 * 1024 * 8 * 1024 * 8
    # DeepSeekMoE's shapes: the layer's own FLOPs (`moe_mlp_flops_per_token`, counted by torch in test_moe_shared.py)
    # less the dense MLP's 48h² per token, for every token of every layer
    fine = perf.replace(top2, experts=64, top_k=8, expert_ffn=256, shared_experts=2)
    per_token = est.moe_mlp_flops_per_token(1024, 64, 8, expert_hidden=256, n_shared=2) - 48 * 1024 ** 2
    assert est.moe_extra_flops(fine) == 2 * 1024 * 8 * per_token


def test_expert_gradients_reduce_over_the_expert_data_parallel_group():
    """dp 16, ep 4: experts all-reduce over 4 ranks; 16 experts at ep = dp leave them nothing to reduce."""
    no_overlap = dict(overlap_comm=False, experts=16)
    hw = perf.hardware("h100")
    n_expert = 8 * 16 / 4 * 8 * 2048 ** 2
    bucketed = perf._bucketed("all_reduce", n_expert * 2, 4, hw.link(16), 25e6)[0]
    assert _step(ep=4, **no_overlap)["dp_comm"] - _step(ep=16, **no_overlap)["dp_comm"] == pytest.approx(bucketed)
    dense_only = perf.step_time(perf.PerfConfig(layers=8, hidden=2048, heads=16, vocab=50257, seq_len=2048,
                                                micro_batch=2, dp=16, global_batch=128, overlap_comm=False), "h100")
    assert dense_only["dp_comm"] > _step(ep=16, **no_overlap)["dp_comm"] > 0        # the MLP left the dense reduction


def test_plan_searches_expert_parallelism(capsys):
    from minimega.tools.cli import main
    from minimega.analysis.plan import plan
    moe = dict(layers=24, hidden=2048, heads=16, vocab=50257, seq_len=2048, experts=8)
    res = plan(moe, 64, 256, "h100", top=3, recompute=("none",), micro_batches=(2,))
    eps = {c.split("-")[1] for c in res["ranked"]}
    assert eps == {"ep1", "ep2", "ep4", "ep8"}           # every divisor of 8 that divides dp
    assert not any(" sp" in c for c in res["ranked"])    # sequence parallelism cuts routing groups: not searched
    assert main(["plan", "--layers", "24", "--hidden", "2048", "--heads", "16", "--vocab", "50257", "--seq-len", "2048",
                 "--experts", "8", "--gpus", "64", "--global-batch", "256", "--gpu", "h100", "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert res["top"][0]["layout"] in out and " ep" in out.splitlines()[2]          # the column headings
