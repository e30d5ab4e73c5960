"""minimega.analysis.perf: the α-β collectives, the roofline, the overlap rules (no process group, no torch)."""
import math
from dataclasses import replace

import pytest

from minimega import estimate as est
from minimega.analysis import perf, plan
from minimega.analysis.perf import PerfConfig
from minimega.analysis.hardware import HARDWARE, Link, parse_custom

A100 = perf.hardware("a100-80gb")
LINK = Link(name="test", bandwidth=100e9, alpha=1e-5, efficiency=1.0)


def test_ring_collectives_are_the_estimators_ring_time():
    for op in ("all_reduce", "reduce_scatter", "all_gather"):
        assert perf.collective_time(op, 1e9, 8, LINK) == est.ring_time(op, 1e9, 8, 1e-5, 100e9)
    # all-reduce = reduce-scatter + all-gather, in both terms
    assert perf.collective_time("all_reduce", 1e9, 8, LINK) == pytest.approx(
        perf.collective_time("reduce_scatter", 1e9, 8, LINK) + perf.collective_time("all_gather", 1e9, 8, LINK))


def test_tree_all_reduce_wins_on_latency_and_loses_on_bandwidth():
    n = 1024
    small, big = 1e3, 1e10
    assert perf.collective_time("all_reduce", small, n, LINK, "tree") < perf.collective_time("all_reduce", small, n, LINK)
    # on few ranks the ring's 2(n-1)/n·S beats the tree's 2S
    assert perf.collective_time("all_reduce", big, 4, LINK, "tree") > perf.collective_time("all_reduce", big, 4, LINK)
    assert perf.collective_time("all_reduce", 0, n, LINK, "tree") == pytest.approx(2 * math.log2(n) * 1e-5)


def test_all_to_all_and_send_recv():
    assert perf.collective_time("all_to_all", 8e9, 8, LINK) == pytest.approx(7 * 1e-5 + 7 / 8 * 8e9 / 100e9)
    assert perf.collective_time("send_recv", 1e9, 2, LINK) == pytest.approx(1e-5 + 1e9 / 100e9)
    assert perf.collective_time("all_gather", 1e9, 1, LINK) == 0.0


def test_collective_refuses_what_it_does_not_model():
    with pytest.raises(ValueError, match="tree.*all_reduce only"):
        perf.collective_time("reduce_scatter", 1e6, 8, LINK, "tree")
    with pytest.raises(ValueError, match="broadcast"):
        perf.collective_time("broadcast", 1e6, 8, LINK)


def test_link_tier_follows_the_group_span():
    assert A100.link(8) is A100.intra
    ib = A100.link(16)
    assert ib.bandwidth == 25e9 and ib.alpha == A100.inter.alpha        # one HDR NIC per GPU
    custom = parse_custom("peak_tflops=100,hbm_gbs=1000,memory_gb=24,nvlink_gbs=50,ib_gbs=12.5,nics=2,gpus_per_node=4")
    assert custom.link(8).bandwidth == 12.5e9 * 2 / 4
    with pytest.raises(ValueError, match="bogus"):
        parse_custom("peak_tflops=1,bogus=3")
    with pytest.raises(ValueError, match="missing"):
        parse_custom("peak_tflops=1")


def test_hardware_presets_are_the_datasheets():
    assert HARDWARE["a100-40gb"].peak_flops == HARDWARE["a100-80gb"].peak_flops == 312e12
    assert HARDWARE["h100"].peak_flops == HARDWARE["h200"].peak_flops == 989e12
    assert (HARDWARE["a100-40gb"].hbm_bandwidth, HARDWARE["a100-80gb"].hbm_bandwidth) == (1555e9, 2039e9)
    assert (HARDWARE["h100"].hbm_bandwidth, HARDWARE["h200"].hbm_bandwidth) == (3350e9, 4800e9)
    with pytest.raises(ValueError, match="a100-80gb"):
        perf.hardware("v100")


def _gpt3(**kw):
    base = dict(layers=96, hidden=12288, heads=96, vocab=51200, seq_len=2048, micro_batch=1, tp=8, pp=8,
                global_batch=64)
    return PerfConfig(**{**base, **kw})


def test_roofline_gemms_are_compute_bound_elementwise_memory_bound():
    rows = {r["op"]: r for r in perf.roofline(_gpt3(), A100)}
    for op in ("qkv", "fc1", "fc2", "logits"):
        assert rows[op]["bound"] == "compute", rows[op]
    for op in ("softmax", "gelu", "layernorm", "dropout+residual"):
        assert rows[op]["bound"] == "memory", rows[op]
    # matmul FLOPs of a layer: 24·s·b·h²(1 + s/(6h)) / t forward (Narayanan Eq. 3's per-layer term / 4)
    c = _gpt3()
    flops = sum(f for name, f, _ in perf.layer_ops(c) if name in ("qkv", "scores q·kᵀ", "scores·v", "proj", "fc1", "fc2"))
    assert flops == pytest.approx(24 * 2048 * 12288 ** 2 * (1 + 2048 / (6 * 12288)) / 8)


def test_full_recompute_costs_one_forward_more_8_over_6():
    none = perf.step_time(_gpt3(), A100)
    full = perf.step_time(_gpt3(recompute="full"), A100)
    assert full["compute"] / none["compute"] == pytest.approx(8 / 6, rel=0.02)   # the head is not recomputed
    sel = perf.step_time(_gpt3(recompute="selective"), A100)
    assert none["compute"] < sel["compute"] < full["compute"]


def test_bubble_is_p_minus_1_over_v_m_slots():
    r = perf.step_time(_gpt3(), A100)
    slot = (r["compute"] + r["tp_comm"] + r["p2p"]) / r["micro_batches"]
    assert r["bubble"] / (64 * slot) == pytest.approx(est.bubble_ratio(8, 64))     # (p-1)/m
    inter = perf.step_time(_gpt3(schedule="interleaved", virtual_stages=2), A100)
    assert inter["bubble"] < r["bubble"] and inter["p2p"] == pytest.approx(2 * r["p2p"])


def test_zb_h1_bubble_is_a_third_of_1f1b_when_f_b_w_cost_the_same():
    """Qi et al. 2023 §2.1: ZB-H1 idles (p-1)(t_F + t_B - t_W), 1F1B (p-1)(t_F + t_B + t_W): a third when the
    three passes cost the same. Without tp, cp and recomputation the model's backward is twice its forward, so
    only the p2p transfers (in every slot, not split) keep the ratio above 1/3."""
    cfg = _gpt3(tp=1, dp=8, zero_stage=1)
    ref, zb = perf.step_time(cfg, A100), perf.step_time(replace(cfg, schedule="zb_h1"), A100)
    assert zb["compute"] == ref["compute"] and zb["memory"] == ref["memory"]
    slot = ref["bubble"] / (cfg.pp - 1)
    p2p = ref["p2p"] / ref["micro_batches"]
    assert zb["bubble"] / ref["bubble"] == pytest.approx((slot - p2p) / 3 / slot + p2p / slot, rel=1e-2)
    assert 1 / 3 < zb["bubble"] / ref["bubble"] < 0.34


def test_dp_reduction_overlaps_without_pp_and_waits_for_the_flush_with_pp():
    shape = dict(layers=24, hidden=2048, heads=16, vocab=51200, seq_len=2048, micro_batch=4, global_batch=32)
    flat = perf.step_time(PerfConfig(**shape, dp=8), A100)
    grads = est.stage_params(PerfConfig(**shape, dp=8).memory_config()) * 2
    k = math.ceil(grads / 25e6)
    bucket = perf.collective_time("all_reduce", grads / k, 8, A100.intra)
    assert flat["dp_comm"] == pytest.approx(bucket)          # all but the last bucket hide behind the backward
    piped = perf.step_time(PerfConfig(**shape, dp=8, pp=2), A100)
    grads2 = est.stage_params(PerfConfig(**shape, dp=8, pp=2).memory_config()) * 2
    k2 = math.ceil(grads2 / 25e6)
    assert piped["dp_comm"] == pytest.approx(k2 * perf.collective_time("all_reduce", grads2 / k2, 8, A100.intra))


def test_micro_batches_are_derived_not_given():
    assert _gpt3(dp=2, micro_batch=2, global_batch=64).micro_batches == 16
    assert perf.replace(_gpt3(), dp=2).micro_batches == 32
    with pytest.raises(TypeError, match="micro_batches"):
        _gpt3(micro_batches=7)


def test_outputs_are_consistent():
    c = _gpt3(dp=2, global_batch=128)
    r = perf.step_time(c, "a100-80gb")
    parts = ("compute", "tp_comm", "p2p", "bubble", "stack_overhead", "dp_comm", "offload", "optimizer", "disk")
    assert r["total"] == pytest.approx(sum(r[p] for p in parts))
    assert r["tokens_per_s"] == pytest.approx(128 * 2048 / r["total"])
    assert r["memory"] == est.memory_per_gpu(c.memory_config())
    assert r["mfu"] == pytest.approx(est.megatron_model_flops(128, 2048, 96, 12288, 51200) / r["total"] / 128 / 312e12)
    days = plan.days_and_cost(r, 300e9, 2.0, 128, 2048)
    assert days["gpu_hours"] == pytest.approx(300e9 / (128 * 2048) * r["total"] * 128 / 3600)
    assert days["cost"] == pytest.approx(2.0 * days["gpu_hours"])


@pytest.mark.parametrize("kw, match", [
    (dict(dp=2, global_batch=63), "multiple of dp"),
    (dict(zero_stage=3, dp=2, global_batch=64), "ZeRO-2/3 do not compose"),
    (dict(schedule="interleaved", virtual_stages=1), "interleaved"),
    (dict(virtual_stages=2), "needs schedule='interleaved'"),
    (dict(schedule="interleaved", virtual_stages=5), "multiple of pp"),
    (dict(stack="jax"), "stack"),
    (dict(offload="optimizer+params"), "offload"),
])
def test_bad_layouts_are_refused_by_name(kw, match):
    with pytest.raises(ValueError, match=match):
        perf.step_time(_gpt3(**kw), A100)


def test_offload_moves_adam_to_host_memory_and_pays_pcie():
    """ZeRO-Offload on one A100 node: the shard's gradients go down PCIe Gen4 (32 GB/s one way, 0.8 of it)
    behind the last backward, Adam runs at host memory bandwidth (51.2 GB/s per GPU), the 16-bit shard
    comes back up, exposed. Closed form, term by term."""
    c = PerfConfig(layers=40, hidden=5120, heads=40, vocab=50257, seq_len=2048, precision="mixed", dp=8,
                   zero_stage=2, micro_batch=4, global_batch=32, dropout=False, bucket_bytes=5e8)
    off = replace(c, offload="optimizer")
    r, ro = perf.step_time(c, A100), perf.step_time(off, A100)
    shard = est.stage_params(c.memory_config()) / 8
    assert r["offload"] == 0.0 and ro["dp_comm"] == r["dp_comm"] and ro["compute"] == r["compute"]
    assert ro["optimizer"] == pytest.approx(shard * (24 + 2 + 2) / (51.2e9 * 0.8))
    assert ro["optimizer"] / r["optimizer"] == pytest.approx(2039 / 51.2)          # HBM vs host memory
    last_bwd = perf.microbatch_time(c, A100)["backward"]
    down, up = (10e-6 + shard * 2 / (32e9 * 0.8)), (10e-6 + shard * 2 / (32e9 * 0.8))
    assert ro["offload"] == pytest.approx(max(0.0, down - last_bwd) + up)
    assert ro["total"] > r["total"]
    # with a pipeline the gradients wait for the flush: all of the copy is exposed
    p = replace(off, zero_stage=1, pp=2, global_batch=64)
    assert perf.step_time(p, A100)["offload"] == pytest.approx(2 * (10e-6 + est.stage_params(
        p.memory_config()) / 8 * 2 / (32e9 * 0.8)))
    # parameters offloaded too (ZeRO-3): each layer's shard comes up before its gather
    z3 = replace(c, zero_stage=3)
    assert perf.step_time(replace(z3, offload="optimizer+params"), A100)["dp_comm"] > perf.step_time(z3, A100)["dp_comm"]
    # H100's PCIe Gen5 halves the copies
    assert perf.step_time(off, "h100")["offload"] < ro["offload"]


def test_overlap_comm_off_exposes_every_collective():
    """DeepSpeed's overlap_comm=false (or a CPU with no core for gloo): the buckets no longer hide behind the
    last backward, ZeRO-3's gathers no longer behind the neighbouring layer."""
    c = _gpt3(tp=1, pp=1, dp=64, global_batch=64, layers=8, bucket_bytes=25e6)
    on, off = perf.step_time(c, A100), perf.step_time(replace(c, overlap_comm=False), A100)
    n = est.stage_params(c.memory_config())
    total, _ = perf._bucketed("all_reduce", n * 2, 64, A100.link(64), 25e6)
    assert off["dp_comm"] == pytest.approx(total) and on["dp_comm"] < total
    z3 = replace(c, zero_stage=3)
    lt = perf.layer_times(z3, A100)               # on: each gather hides behind its layer's compute
    layer_bytes = (12 * 12288 ** 2 + 7 * 12288) * 2
    ag = perf.collective_time("all_gather", layer_bytes, 64, A100.link(64))
    rs = perf.collective_time("reduce_scatter", layer_bytes, 64, A100.link(64))
    off3 = perf.step_time(replace(z3, overlap_comm=False), A100)["dp_comm"]
    assert off3 == pytest.approx((8 + 1) * (2 * ag + rs))
    assert perf.step_time(z3, A100)["dp_comm"] < off3 - 8 * min(ag, lt["forward"]) + 1e-9
    with pytest.raises(ValueError, match="overlap_comm"):
        perf.step_time(replace(c, overlap_comm="no"), A100)


def test_context_parallel_time_splits_the_work_and_adds_the_ring():
    """cp: each rank does 1/cp of every FLOP (load-balanced causal attention, counted full as before), and the
    ring's hops (cp-1 forward, 2cp-1 backward, cp-1 more under recomputation) hide behind the attention core."""
    cfg = PerfConfig(layers=32, hidden=4096, heads=32, vocab=50257, seq_len=131072, attention="fused", tp=8, dp=2,
                     global_batch=2, precision="bf16", recompute="selective")
    two = replace(cfg, cp=2)
    assert sum(f for _, f, _ in perf.layer_ops(two)) == pytest.approx(sum(f for _, f, _ in perf.layer_ops(cfg)) / 2,
                                                                       rel=1e-12)
    hw = HARDWARE["h100"]
    hop = perf.collective_time("send_recv", 2 * 65536 * 512 * 2, 2, hw.link(16))
    core = sum(perf.op_time(f, b, hw) for n, f, b in perf.layer_ops(two) if n in perf.ATTENTION_CORE)
    bare = replace(two, overlap_comm=False)
    assert perf.layer_times(bare, hw)["cp_comm"] == pytest.approx((1 + 3 + 1) * hop, rel=1e-12)
    hidden = perf.layer_times(two, hw)["cp_comm"]
    assert hidden == pytest.approx(2 * max(0.0, hop - core) + max(0.0, 3 * hop - 2 * core), rel=1e-12, abs=1e-15)
    out = perf.step_time(two, hw)
    assert out["n_gpus"] == 32 and out["cp_comm"] == pytest.approx(32 * hidden, rel=1e-12)
    assert out["total"] == pytest.approx(sum(out[k] for k in ("compute", "tp_comm", "cp_comm", "p2p", "bubble",
                                                              "stack_overhead", "dp_comm", "offload", "optimizer",
                                                              "disk")))


# ---------------------------------------------------------------------------------------------
# FP8: the blocks' linears at the fp8 rate, the rest bf16; ZeRO-3 gathers one byte per linear weight

H100 = HARDWARE["h100"]


def test_fp8_runs_only_the_linear_gemms_at_the_fp8_rate():
    """GPT-3's layer on H100 (tp 8): each linear GEMM is compute-bound, so fp8 takes 989/1979 of its bf16 time
    (the datasheet's dense BF16 and FP8 rates); attention's core, the norms, GELU and the head are unchanged."""
    bf16, fp8 = _gpt3(precision="bf16"), _gpt3(precision="fp8")
    assert H100.fp8_flops == 3958e12 / 2                    # H100 SXM datasheet: 3,958 TFLOP/s with sparsity
    want = {}
    for name, f, b in perf.layer_ops(bf16):
        t16 = max(f / (989e12 * 0.75), b / (3350e9 * 0.8))
        t8 = max(f / (1979e12 * 0.75), b / (3350e9 * 0.8)) if name in ("qkv", "proj", "fc1", "fc2") else t16
        want[name] = want.get(name, 0.0) + t8
    assert perf.layer_times(fp8, H100)["forward"] == pytest.approx(sum(want.values()), rel=1e-12)
    assert perf.layer_times(fp8, H100)["backward"] == pytest.approx(2 * sum(want.values()), rel=1e-12)
    rows = {r["op"]: r["seconds"] for r in perf.roofline(fp8, H100)}
    rows16 = {r["op"]: r["seconds"] for r in perf.roofline(bf16, H100)}
    for op in ("qkv", "proj", "fc1", "fc2"):
        assert rows[op] / rows16[op] == pytest.approx(989 / 1979, rel=1e-12)
    for op in ("scores q·kᵀ", "softmax", "scores·v", "gelu", "logits", "cross-entropy"):
        assert rows[op] == rows16[op]
    fused = {r["op"]: r for r in perf.roofline(_gpt3(precision="fp8", attention="fused"), H100)}
    assert fused["attention (fused)"]["bound"] == "compute"          # so the rate shows: bf16, as TE runs it
    f, b = fused["attention (fused)"]["flops"], fused["attention (fused)"]["bytes"]
    assert fused["attention (fused)"]["seconds"] == max(f / (989e12 * 0.75), b / (3350e9 * 0.8))
    r8, r16 = perf.step_time(fp8, H100), perf.step_time(bf16, H100)
    assert r8["tp_comm"] == r16["tp_comm"] and r8["p2p"] == r16["p2p"] and r8["memory"] == r16["memory"]
    assert r8["compute"] < r16["compute"] and r8["mfu"] > r16["mfu"]    # MFU stays over the 16-bit peak


def test_fp8_swiglu_runs_gate_up_and_down_at_the_fp8_rate():
    llama = PerfConfig(**{**est.PRESETS["llama3-8b"], "precision": "fp8"}, global_batch=1)
    bf16 = replace(llama, precision="bf16")
    rows = {r["op"]: r["seconds"] for r in perf.roofline(llama, H100)}
    rows16 = {r["op"]: r["seconds"] for r in perf.roofline(bf16, H100)}
    for op in ("gate", "up", "fc2", "qkv", "proj"):
        assert rows[op] / rows16[op] == pytest.approx(989 / 1979, rel=1e-12), op
    assert rows["silu·mul"] == rows16["silu·mul"]


def test_fp8_zero3_gathers_the_linear_weights_in_one_byte():
    """minimega's Zero3Fp8 all-gathers each block's linear weights as E4M3 (12h² bytes over tp for GPT) and keeps
    the LayerNorms and biases whole; the gradients' reduce-scatter keeps bf16's fp32 width. Overlap off: every
    layer pays its forward and backward gathers and its reduce-scatter, and the first two and last one more."""
    c = _gpt3(tp=1, pp=1, dp=64, global_batch=64, layers=8, zero_stage=3, overlap_comm=False)
    link, h = H100.link(64), 12288
    for precision, gather_bytes in (("bf16", (12 * h * h + 13 * h - 6 * h) * 2), ("fp8", 12 * h * h)):
        ag = perf.collective_time("all_gather", gather_bytes, 64, link)
        rs = perf.collective_time("reduce_scatter", (12 * h * h + 7 * h) * 4, 64, link)
        got = perf.step_time(replace(c, precision=precision), H100)["dp_comm"]
        assert got == pytest.approx((8 + 1) * (2 * ag + rs), rel=1e-12), precision
    ag16 = perf.collective_time("all_gather", (12 * h * h + 7 * h) * 2, 64, link)
    ag8 = perf.collective_time("all_gather", 12 * h * h, 64, link)
    assert (ag8 - 63 * link.alpha) / (ag16 - 63 * link.alpha) == pytest.approx(0.5, rel=1e-3)   # half the bytes


@pytest.mark.parametrize("hw", ["a100-40gb", "a100-80gb"])
def test_fp8_is_refused_by_name_where_the_gpu_has_no_fp8_tensor_cores(hw):
    with pytest.raises(ValueError, match=r"precision='fp8' on A100.*no fp8 tensor cores.*bf16"):
        perf.step_time(_gpt3(precision="fp8"), hw)
    no_fp8 = parse_custom("peak_tflops=312,hbm_gbs=2039,memory_gb=80,nvlink_gbs=300,ib_gbs=25")
    with pytest.raises(ValueError, match="no fp8 tensor cores"):
        perf.step_time(_gpt3(precision="fp8"), no_fp8)
    custom = parse_custom("peak_tflops=989,hbm_gbs=3350,memory_gb=80,nvlink_gbs=450,ib_gbs=50,fp8_tflops=1979")
    assert perf.step_time(_gpt3(precision="fp8"), custom)["total"] > 0


def test_fp8_with_experts_is_refused_by_name():
    moe = PerfConfig(layers=4, hidden=1024, heads=16, vocab=50257, seq_len=1024, experts=8, dp=8, global_batch=8,
                     precision="fp8")
    with pytest.raises(ValueError, match="fp8.*experts=8.*not converted"):
        perf.step_time(moe, H100)
