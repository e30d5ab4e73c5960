"""minimega.estimate against the numbers the papers print (no process group, no torch)."""
import json
import math

import pytest

from minimega import estimate as est
from minimega.tools import estimate_cli

# ZeRO paper (arXiv:1910.02054) Table 1, GB per device, columns P_os / P_os+g / P_os+g+p.
ZERO_TABLE1 = {
    7.5e9: {1: (120, 120, 120), 4: (52.5, 41.25, 30), 16: (35.62, 21.56, 7.5), 64: (31.41, 16.64, 1.875),
            256: (30.35, 15.41, 0.469), 1024: (30.09, 15.10, 0.117)},
    128e9: {1: (2048, 2048, 2048), 4: (896, 704, 512), 16: (608, 368, 128), 64: (536, 284, 32),
            256: (518, 263, 8), 1024: (513.5, 257.75, 2)},
    1e12: {1: (16000, 16000, 16000), 4: (7000, 5500, 4000), 16: (4750, 2875, 1000), 64: (4187.5, 2218.75, 250),
           256: (4046.9, 2054.7, 62.5), 1024: (4011.7, 2013.7, 15.625)},
}


@pytest.mark.parametrize("psi", sorted(ZERO_TABLE1), ids=["7.5B", "128B", "1T"])
def test_zero_table1(psi):
    for dp, row in ZERO_TABLE1[psi].items():
        for stage, paper in zip((1, 2, 3), row):
            got = est.model_state_bytes(psi, dp, stage) / est.GB
            # the paper rounds to about 3 significant digits
            assert got == pytest.approx(paper, rel=5e-3), (psi, dp, stage)


def test_zero_figure1_rounded_as_printed():
    got = [est.model_state_bytes(7.5e9, 64, s) / est.GB for s in range(4)]
    assert [round(got[0]), round(got[1], 1), round(got[2], 1), round(got[3], 1)] == [120, 31.4, 16.6, 1.9]


def test_stage_formulas_and_precisions():
    psi, nd = 1000.0, 8
    assert est.model_state_bytes(psi, nd, 0) == 16 * psi
    assert est.model_state_bytes(psi, nd, 1) == 4 * psi + 12 * psi / nd
    assert est.model_state_bytes(psi, nd, 2) == 2 * psi + 14 * psi / nd
    assert est.model_state_bytes(psi, nd, 3) == 16 * psi / nd
    assert est.model_state_bytes(psi, nd, 2, "fp16") == est.model_state_bytes(psi, nd, 2, "mixed")
    # bf16 keeps fp32 gradients (Megatron's main grads): dist_optimizer.md's bf16 rows, 18 and 6 + 12/d
    assert est.model_state_bytes(psi, 1, 0, "bf16") / psi == 18
    assert est.model_state_bytes(psi, nd, 1, "bf16") / psi == 6 + 12 / nd
    assert est.model_state_bytes(psi, nd, 2, "bf16") == 2 * psi + 16 * psi / nd
    assert est.model_state_bytes(psi, 1, 0, "fp32") == 16 * psi  # 4 + 4 + 8, no master copy
    assert est.model_state_bytes(psi, nd, 1, "fp32") == 8 * psi + 8 * psi / nd
    # Megatron distributed optimizer, fp32 params and grads: 8 + 8/d bytes/param (dist_optimizer.md)
    assert est.model_state_bytes(psi, nd, 1, "fp32") / psi == 8 + 8 / nd
    with pytest.raises(ValueError, match="precision"):
        est.model_state_bytes(psi, nd, 1, "int8")
    with pytest.raises(ValueError, match="stage"):
        est.model_state_bytes(psi, nd, 4)
    with pytest.raises(ValueError, match="dp"):
        est.model_state_bytes(psi, 0, 1)


def test_stages_never_increase_memory():
    for dp in (1, 2, 3, 64):
        vals = [est.model_state_bytes(7.5e9, dp, s) for s in range(4)]
        assert vals == sorted(vals, reverse=True)


def test_padded_rounds_each_group_up_to_dp():
    assert est.padded_numel(10, 4) == 12 and est.padded_numel(12, 4) == 12 and est.padded_numel(1, 3) == 3
    # two groups of 10 at dp 4: each pads to 12, so shards are 3 + 3 elements
    assert est.model_state_bytes_padded([10, 10], 4, 3) == 16 * 24 / 4
    assert est.model_state_bytes_padded([10, 10], 4, 1) == 4 * 24 + 12 * 24 / 4
    assert est.model_state_bytes_padded(12, 4, 2) == est.model_state_bytes(12, 4, 2)
    assert est.model_state_bytes_padded([10, 10], 4, 0) == est.model_state_bytes(20, 1, 0)
    assert est.model_state_bytes_padded([7], 1, 3) == est.model_state_bytes(7, 1, 3)


def test_comm_volume_zero_section7():
    psi, b = 1e9, 2
    assert [est.comm_volume_psi(s) for s in range(4)] == [2, 2, 2, 3]
    for dp in (2, 8, 64):
        ring = (dp - 1) / dp
        assert est.comm_bytes_per_step(psi, dp, 0, b) == pytest.approx(2 * ring * psi * b)
        assert est.comm_bytes_per_step(psi, dp, 1, b) == est.comm_bytes_per_step(psi, dp, 0, b)
        assert est.comm_bytes_per_step(psi, dp, 2, b) == est.comm_bytes_per_step(psi, dp, 0, b)
        assert est.comm_bytes_per_step(psi, dp, 3, b) == pytest.approx(1.5 * est.comm_bytes_per_step(psi, dp, 0, b))
    assert est.comm_bytes_per_step(psi, 1, 3, b) == 0
    assert est.ring_bytes("all_reduce", 100, 4) == 150 and est.ring_bytes("all_gather", 100, 4) == 75


# Korthikanti et al. Table 2, GPT-3 175B (s=2048, h=12288, a=96) at b=1, t=8, MB per layer.
GPT3 = dict(seq_len=2048, micro_batch=1, hidden=12288, heads=96)


@pytest.mark.parametrize("kw,mb", [
    (dict(tp=1), 2868.9), (dict(tp=8), 578.8), (dict(tp=8, sp=True), 358.6),
    (dict(tp=8, recompute="selective"), 327.2), (dict(tp=8, sp=True, recompute="selective"), 107.0),
    (dict(tp=8, recompute="full"), 50.3),
], ids=["none", "tp", "tp-sp", "tp-sel", "tp-sp-sel", "full"])
def test_activation_table2_gpt3(kw, mb):
    assert est.activation_bytes_per_layer(**GPT3, **kw) / 1e6 == pytest.approx(mb, abs=0.05)


def test_activation_table2_closed_forms():
    s, b, h, a, t = 2048, 2, 20480, 128, 8
    sbh = s * b * h
    assert 5 * a * s / h == 64  # MT-NLG, as quoted in §2.5 of the paper's discussion
    f = lambda **kw: est.activation_bytes_per_layer(s, b, h, a, **kw)
    assert f() == pytest.approx(sbh * (34 + 5 * a * s / h))
    assert f(tp=t) == pytest.approx(sbh * (10 + 24 / t + 5 * a * s / (h * t)))
    assert f(tp=t, sp=True) == pytest.approx(sbh * (34 / t + 5 * a * s / (h * t)))
    assert f(tp=t, recompute="selective") == pytest.approx(sbh * (10 + 24 / t))
    assert f(tp=t, sp=True, recompute="selective") == pytest.approx(sbh * 34 / t)
    assert f(recompute="full") == 2 * sbh
    # fp32 activations: 16 sbh elements x 4 B + 2 sbh masks; 2 as^2b elements x 4 B + 1 mask
    assert f(act_bytes=4) == pytest.approx(sbh * 66 + a * s * s * b * 9)


def test_gpt_activation_formula_is_the_paper_plus_what_our_block_keeps():
    """The two per-layer counts differ by exactly the documented terms, on random shapes."""
    import random
    rng = random.Random(7)
    for _ in range(200):
        a = rng.choice([1, 2, 4, 8, 12, 32, 96])
        t = rng.choice([d for d in (1, 2, 4, 8) if a % d == 0])
        s, b, h = rng.choice([64, 512, 2048, 8192]), rng.randint(1, 8), a * rng.choice([16, 64, 128])
        for sp in (False, True):
            for rec in est.RECOMPUTE:
                paper = est.activation_bytes_per_layer(s, b, h, a, tp=t, sp=sp, recompute=rec)
                ours = est.gpt_activation_bytes_per_layer(s, b, h, a, tp=t, sp=sp, recompute=rec, act_bytes=2,
                                                          mask_bytes=1, dropout=True, attention="math")
                extra = 0 if rec == "full" else 16 * s * b / (t if sp else 1) + (
                    2 * s * b * h * 2 * (1 - 1 / t) if sp else 0)
                assert ours - paper == pytest.approx(extra, rel=1e-12, abs=1e-6), (s, b, h, a, t, sp, rec)
    # fused attention keeps only the log-sum-exp, asb fp32 values, in place of the s² terms
    assert est.gpt_activation_bytes_per_layer(64, 4, 64, 4, attention="flash") == (
        est.gpt_activation_bytes_per_layer(64, 4, 64, 4, recompute="selective") + 4 * 64 * 4 * 4)
    with pytest.raises(ValueError):
        est.gpt_activation_bytes_per_layer(64, 4, 64, 4, attention="sdpa")


def test_tp_comm_and_bubbles():
    assert est.tp_comm_elements_per_layer(2048, 1, 12288, 1) == 0
    assert est.tp_comm_elements_per_layer(2048, 1, 12288, 8) == 8 * 2048 * 12288 * 7 / 8
    # test vector p=4, m=8
    assert est.bubble_ratio(4, 8) == 0.375
    assert est.bubble_fraction(4, 8, "gpipe") == pytest.approx(3 / 11)
    assert est.bubble_fraction(4, 8, "1f1b") == pytest.approx(3 / 11)
    assert est.bubble_ratio(4, 8, v=2) == 0.1875
    assert est.bubble_fraction(4, 8, "interleaved", v=2) == pytest.approx(0.1875 / 1.1875)
    assert est.in_flight_microbatches(4, 8, "gpipe") == 8
    assert est.in_flight_microbatches(4, 8, "1f1b") == 4 and est.in_flight_microbatches(4, 2, "1f1b") == 2
    assert est.in_flight_microbatches(4, 8, "interleaved", v=2) == pytest.approx(4 * (1 + 3 / 8))


@pytest.mark.parametrize("p,m", [(2, 4), (4, 4), (4, 8), (8, 32)])
def test_zb_h1_bubble_and_memory_are_the_runtime_grids(p, m):
    """The estimator's ZB-H1 terms against the slot grid the pipeline runtime executes (t_F = t_B = t_W)."""
    from minimega.pipeline import bubble_slots, peak_in_flight, plan
    from minimega.pipeline.schedules import ORDERS
    grid = plan("zb_h1", p, m).grid
    assert all(bubble_slots(row)["idle_of_total"] == pytest.approx(est.bubble_fraction(p, m, "zb_h1")) for row in grid)
    assert est.bubble_fraction(p, m, "zb_h1") < est.bubble_fraction(p, m, "1f1b")
    assert est.in_flight_microbatches(p, m, "zb_h1") == max(peak_in_flight(ORDERS["zb_h1"](p, m, 1, r), until="W")
                                                            for r in range(p))


def test_flops_gpt2_and_korthikanti_mfu():
    n = est.gpt_params(12, 768, 50257, 1024)
    assert n == 124_439_808                                  # nanoGPT's GPT-2 124M
    n_no_wpe = n - 1024 * 768
    assert n_no_wpe / 1e6 == pytest.approx(123.65, abs=0.01)
    # nanoGPT's estimate_mfu terms: 6N = 741.9 MFLOP, attention 113.2 MFLOP (855.1 as the sum of the two)
    assert 6 * n_no_wpe / 1e6 == pytest.approx(741.9, abs=0.05)
    assert est.flops_per_token(0, 12, 12, 64, 1024) / 1e6 == pytest.approx(113.2, abs=0.05)
    assert est.flops_per_token(n_no_wpe, 12, 12, 64, 1024) / 1e6 == pytest.approx(855.1, rel=1e-4)
    # Korthikanti Table 5: 175B, global batch 64 on 64 A100 (312 TFLOP/s), 13.75 s/iteration -> MFU 51.4%
    f = est.megatron_model_flops(64, 2048, 96, 12288, 51200)
    assert f / 13.75 / 64 / 312e12 == pytest.approx(0.514, abs=0.0005)
    assert est.mfu(1000, 6e9, 1.2e13) == 0.5
    # Narayanan Eq. 2 counts the same terms (bar the final LayerNorm)
    L, h, V, s = 36, 4096, 51200, 2048
    eq2 = 12 * L * h * h * (1 + 13 / (12 * h) + (V + s) / (12 * L * h))
    assert est.gpt_params(L, h, V, s) - 2 * h == pytest.approx(eq2)


def test_memory_per_gpu_composes_the_parts():
    cfg = est.MemoryConfig(**est.PRESETS["zero-7.5b"])
    out = est.memory_per_gpu(cfg)
    n = est.stage_params(cfg)
    assert n == est.gpt_params(36, 4096, 51200, 2048)       # pp = tp = 1: the whole model
    assert out["params"] + out["grads"] + out["optimizer"] == est.model_state_bytes(n, 64, cfg.zero_stage)
    assert out["activations"] == 36 * est.activation_bytes_per_layer(2048, 1, 4096, 32)
    assert out["recompute"] == 0
    assert out["total"] == pytest.approx(sum(out[k] for k in ("params", "grads", "optimizer", "gathered", "activations",
                                                              "recompute")))
    # offload moves the optimizer states and this rank's gradient shard, summed in fp32 (4 bytes), to CPU memory;
    # from stage 2 on no gradient stays on the GPU, stage 1 keeps the unsharded buffer the backward fills
    for stage in (1, 2, 3):
        on = est.memory_per_gpu(est.MemoryConfig(**{**est.PRESETS["zero-7.5b"], "zero_stage": stage}))
        off = est.memory_per_gpu(est.MemoryConfig(**{**est.PRESETS["zero-7.5b"], "zero_stage": stage,
                                                     "offload": "optimizer"}))
        shard = n / (64 if stage else 1)
        assert off["cpu"] == pytest.approx(on["optimizer"] + 4 * shard, rel=1e-12)
        assert off["grads"] == (0 if stage >= 2 else on["grads"]) and off["optimizer"] == 0
        assert off["total"] == pytest.approx(on["total"] - on["optimizer"] - (on["grads"] if stage >= 2 else 0))
    # pipeline: first stage holds ceil(L/p) blocks x in-flight micro-batches
    bloom = est.MemoryConfig(**est.PRESETS["bloom-176b"])
    b = est.memory_per_gpu(bloom)
    per = est.activation_bytes_per_layer(2048, 2, 14336, 112, tp=4, recompute="full")
    assert b["activations"] == pytest.approx(per * 5 * 12)          # embedding + 5 blocks on stage 0
    gp = est.memory_per_gpu(est.MemoryConfig(**{**est.PRESETS["bloom-176b"], "schedule": "gpipe"}))
    assert gp["activations"] == pytest.approx(per * 5 * 128)
    with pytest.raises(ValueError, match="tp must divide heads"):
        est.memory_per_gpu(est.MemoryConfig(layers=2, hidden=64, heads=4, vocab=10, seq_len=8, tp=3))
    with pytest.raises(ValueError, match="zero_stage=3"):
        est.memory_per_gpu(est.MemoryConfig(layers=2, hidden=64, heads=4, vocab=10, seq_len=8, offload="optimizer+params",
                                            zero_stage=1, dp=2))
    with pytest.raises(ValueError, match="offload='optimizer' needs zero_stage >= 1"):     # the trainer refuses it too
        est.memory_per_gpu(est.MemoryConfig(layers=2, hidden=64, heads=4, vocab=10, seq_len=8, offload="optimizer"))


def test_bloom_layer_sizes_match_the_training_notes():
    # bigscience tr11 README: one layer 12h^2 + 13h = 2,466,437,120 params; embedding 250880 x 14336
    h = 14336
    assert est.gpt_params(1, h, 0, 0) - 2 * h == 2_466_437_120
    assert 250880 * h == 3_596_615_680


def test_checkpoint_bytes_bloom():
    # BLOOM tr11 README: "each checkpoint with fp32 optim states and bf16+fp32 weights is 2.3TB -
    # just the bf16 weights are 329GB" (binary units: 2^40 and 2^30 bytes), for the 176B model
    n = 176e9
    assert est.checkpoint_bytes(n, optimizer=False) / 2**30 == pytest.approx(329, abs=2)
    assert est.checkpoint_bytes(n) / 2**40 == pytest.approx(2.3, abs=0.06)
    assert est.checkpoint_bytes(1, "fp32") == 12


def test_cli_json(capsys):
    assert estimate_cli.main(["--params", "7.5e9", "--dp", "64", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert [round(r["total"] / 1e9, 1) for r in rep["stages"]] == [120.0, 31.4, 16.6, 1.9]
    assert rep["stages"][3]["comm_bytes_per_step"] == pytest.approx(1.5 * rep["stages"][0]["comm_bytes_per_step"])
    assert estimate_cli.main(["--params", "1e9", "--dp", "8", "--stage", "2"]) == 0
    text = capsys.readouterr().out
    assert "N_d = 8" in text and len(text.strip().splitlines()) == 3


def test_cli_parser_registers_on_subparsers():
    import argparse
    root = argparse.ArgumentParser(prog="minimega")
    estimate_cli.add_estimate_parser(root.add_subparsers(dest="cmd"))
    args = root.parse_args(["estimate", "--params", "7.5e9", "--dp", "64", "--stage", "3"])
    assert args.func is estimate_cli.run_estimate and args.stage == 3 and math.isclose(args.params, 7.5e9)


def test_gpt_params_counts_minimega_gpt():
    pytest.importorskip("torch")
    from minimega.config import GPTConfig
    from minimega.model import GPT
    for cfg in (GPTConfig.tiny(), GPTConfig.small(), GPTConfig.tiny(bias=True)):
        n = sum(p.numel() for p in GPT(cfg).parameters())
        assert n == est.gpt_params(cfg.n_layer, cfg.n_embd, cfg.vocab_size, cfg.block_size, tied=False,
                                   bias=cfg.bias), cfg


# ---------------------------------------------------------------------------------------------
# Published layouts as the sources describe them, and the terms the presets rely on

def test_recompute_working_set_is_one_layer_of_full_activations():
    # 36 layers, h = 4096, a = 32 (the 7.5B shape), s = 8192, b = 1, one GPU, unfused attention:
    # the backward reruns one layer and holds sbh(34 + 5as/h) = 11.9 GB again
    s, b, h, a = 8192, 1, 4096, 32
    ws = est.recompute_working_bytes(s, b, h, a, recompute="full")
    assert ws == s * b * h * (34 + 5 * a * s / h)
    assert round(ws / est.GB, 1) == 11.9
    assert est.recompute_working_bytes(s, b, h, a, recompute="none") == 0
    # selective: one layer's attention core, 5as²b bytes
    assert est.recompute_working_bytes(s, b, h, a, recompute="selective") == 5 * a * s * s * b
    # fused attention: the working set has no s² term either
    assert est.recompute_working_bytes(s, b, h, a, recompute="full", attention="fused") == pytest.approx(
        s * b * h * 34 + 4 * a * s * b)
    # it is counted once per GPU, not per layer or per micro-batch in flight
    cfg = dict(layers=36, hidden=h, heads=a, vocab=51200, seq_len=s, recompute="full")
    one = est.memory_per_gpu(est.MemoryConfig(**cfg))
    assert one["recompute"] == ws
    assert one["total"] == pytest.approx(one["params"] + one["grads"] + one["optimizer"]
                                         + 36 * 2 * s * b * h + ws)
    piped = est.memory_per_gpu(est.MemoryConfig(**cfg, pp=4, micro_batches=8))
    assert piped["recompute"] == ws


def test_fused_attention_drops_the_quadratic_term():
    s, b, h, a, t = 8192, 1, 4096, 32, 4
    sbh = s * b * h
    for kw in (dict(), dict(tp=t), dict(tp=t, sp=True)):
        unfused = est.activation_bytes_per_layer(s, b, h, a, **kw)
        fused = est.activation_bytes_per_layer(s, b, h, a, attention="fused", **kw)
        sel = est.activation_bytes_per_layer(s, b, h, a, recompute="selective", **kw)
        tt = kw.get("tp", 1)
        assert unfused - sel == pytest.approx(5 * a * s * s * b / tt)      # the as²b terms of Table 2
        assert fused - sel == pytest.approx(4 * a * s * b / tt)           # only the fp32 log-sum-exp
    # what selective recomputation still saves on top of a fused kernel: < 0.1% of the layer here
    fused = est.activation_bytes_per_layer(s, b, h, a, attention="fused")
    assert fused == pytest.approx(sbh * 34 + 4 * a * s * b)
    assert (fused - est.activation_bytes_per_layer(s, b, h, a, recompute="selective")) / fused < 1e-3
    # selective and full are the same whatever the kernel
    for rec in ("selective", "full"):
        assert est.activation_bytes_per_layer(s, b, h, a, recompute=rec, attention="fused") == \
            est.activation_bytes_per_layer(s, b, h, a, recompute=rec)
    with pytest.raises(ValueError, match="attention"):
        est.activation_bytes_per_layer(s, b, h, a, attention="flash")


def test_mt_nlg_preset_is_the_published_layout():
    cfg = est.MemoryConfig(**est.PRESETS["mt-nlg-530b"])
    assert (cfg.tp, cfg.pp, cfg.dp, cfg.zero_stage, cfg.recompute) == (8, 35, 8, 1, "full")
    assert cfg.tp * cfg.pp * cfg.dp == 2240 and 1920 // (cfg.dp * cfg.micro_batch) == cfg.micro_batches
    out = est.memory_per_gpu(cfg)
    # with ZeRO-1 data parallelism and full recomputation: about 20 GB of an 80 GB A100
    assert round(out["total"] / est.GB) == 21
    assert out["total"] < 80 * est.GB
    # the same layout without them needs more than an 80 GB GPU holds
    bare = est.memory_per_gpu(est.MemoryConfig(**{**est.PRESETS["mt-nlg-530b"], "zero_stage": 0, "recompute": "none"}))
    assert round(bare["total"] / est.GB) == 125


def test_bloom_preset_matches_the_tr11_notes():
    cfg = est.MemoryConfig(**est.PRESETS["bloom-176b"])
    h = 14336
    assert est.stage_blocks(cfg) == 5                               # "pp rank 0: [embed | 5 transformer blocks]"
    mid = est.MemoryConfig(**{**est.PRESETS["bloom-176b"], "pp_partition": "blocks"})
    assert est.stage_blocks(mid) == 6                               # ceil(70 / 12) without the rebalancing
    n = est.stage_params(cfg)
    assert n == 5 * ((12 * h * h + 7 * h) / 4 + 6 * h) + 250880 * h / 4   # no position table (ALiBi)
    assert round(n / 1e9, 2) == 3.98
    out = est.memory_per_gpu(cfg)
    assert out["params"] == 2 * n and out["grads"] == 4 * n          # bf16 weights, fp32 gradient buffer
    assert out["optimizer"] == 12 * n / 8                           # master + Adam sharded over DP 8
    # BF16_Optimizer is Megatron's bf16 / fp32-main-grads row: 6 + 12/d bytes per parameter
    assert (out["params"] + out["grads"] + out["optimizer"]) / n == 6 + 12 / 8
    assert out["total"] < 80 * est.GB
    for precision in ("fp32", "bf16"):           # gradients already fp32: the switch would change nothing
        with pytest.raises(ValueError, match="fp32_grads"):
            est.memory_per_gpu(est.MemoryConfig(**{**est.PRESETS["bloom-176b"], "precision": precision,
                                                   "fp32_grads": True}))
    with pytest.raises(ValueError, match="position_embedding"):
        est.memory_per_gpu(est.MemoryConfig(**{**est.PRESETS["bloom-176b"], "position_embedding": 0}))
    # a learned table and 16-bit gradients change exactly their own terms
    learned = est.memory_per_gpu(est.MemoryConfig(**{**est.PRESETS["bloom-176b"], "position_embedding": True}))
    assert learned["stage_params"] - n == 2048 * h
    g16 = est.memory_per_gpu(est.MemoryConfig(**{**est.PRESETS["bloom-176b"], "precision": "mixed"}))
    assert g16["grads"] == 2 * n
    g32 = est.memory_per_gpu(est.MemoryConfig(**{**est.PRESETS["bloom-176b"], "precision": "mixed", "fp32_grads": True}))
    assert g32 == out                               # fp16 with an fp32 buffer costs what bf16 does


def test_bloom_cost_from_its_log_and_paper():
    # tr11 README log line at the end of epoch one: GBS 2048, 104.70 s/iteration, "TFLOPs: 149.77"
    f = est.megatron_hardware_flops(2048, 2048, 70, 14336, 250880)
    assert est.achieved_flops_per_gpu(f, 104.70, 384) / 1e12 == pytest.approx(149.77, abs=0.02)
    # MT-NLG (Smith et al. 2022 §2.4): GBS 1920, 60.1 / 50.2 / 44.4 s on 2240 / 2800 / 3360 GPUs = 126 / 121 / 113
    mt = est.megatron_hardware_flops(1920, 2048, 105, 20480, 51200)
    for gpus, secs, paper in ((2240, 60.1, 126), (2800, 50.2, 121), (3360, 44.4, 113)):
        assert est.achieved_flops_per_gpu(mt, secs, gpus) / 1e12 == pytest.approx(paper, abs=1.0), gpus
    # Eq. 4 for the 325.0B tokens of epoch one at that rate: 92 days on 384 GPUs
    secs = est.training_seconds(325_001_773_056, 176.247e9, 384, 149.77e12)
    assert round(secs / 86400) == 92
    assert round(est.gpu_hours(384, secs), -3) == 850_000
    # the BLOOM paper reports 1,082,990 GPU-hours, about 3.5 months: 117.5 days of 384 GPUs
    assert est.gpu_hours(384, 117.5 * 86400) == pytest.approx(1_082_990, rel=1e-3)
    assert est.training_seconds(1, 1, 1, 1, recompute=False) == 6
    assert est.run_cost(1000, 2.0, overhead=0.25) == 2500
    with pytest.raises(ValueError):
        est.run_cost(1000, -1)


def test_ring_time_alpha_beta():
    # 2(n-1) latencies + 2(n-1)/n S / beta for an all-reduce; (n-1) each for reduce-scatter, all-gather
    assert est.ring_time("all_reduce", 25e6, 64, 10e-6, 25e9) == pytest.approx(126 * 10e-6 + 2 * 63 / 64 * 25e6 / 25e9)
    assert est.ring_time("all_gather", 100, 4, 1.0, 1.0) == 3 + 75
    assert est.ring_time("all_reduce", 1e9, 1, 1.0, 1.0) == 0
    # small messages are latency-bound, large ones bandwidth-bound
    small = est.ring_time("all_reduce", 1e5, 64, 10e-6, 25e9)
    assert 126 * 10e-6 / small > 0.9
    assert est.ring_time("all_reduce", 1e10, 64, 10e-6, 25e9) == pytest.approx(2 * 63 / 64 * 1e10 / 25e9, rel=2e-3)


# ------------------------------------------------------------------------------------------------
# Peak memory by category (the multi-rank measurement is in test_measure.py)

def test_peak_memory_formulas_against_the_at_rest_accounting():
    units = [[1000, 24], [5000, 7], [5000, 7], [3000]]          # embed, two blocks, head (odd sizes: padding)
    psi = sum(map(sum, units))
    for dp in (2, 4):
        for stage in range(4):
            peak = est.peak_memory_bytes(units, dp, stage)
            at_rest = est.model_state_bytes_padded([sum(u) for u in units], dp, stage, "fp32")
            # params + grads + Adam at rest is the ZeRO table; the peak adds what is transient
            rest = peak["params"] + peak["optimizer_states"] + (peak["grads"] if stage < 2 else 0)
            if stage >= 2:
                rest += sum(est.padded_numel(sum(u), dp) for u in units) // dp * 4     # the gradient shards
            assert rest == at_rest, (dp, stage)
    z3 = est.peak_memory_bytes(units, 4, 3)
    assert z3["gathered"] == 4 * (est.padded_numel(5007, 4) * 2)          # the two blocks, neighbours
    assert est.peak_memory_bytes(units, 4, 3, prefetch=False)["gathered"] == 4 * est.padded_numel(5007, 4)
    shards = sum(est.padded_numel(sum(u), 2) for u in units) // 2
    assert shards * 2 > psi                                              # padding counted per unit
    # One reduction in flight: as block 1's starts, the head's and block 2's have retired (their shards exist).
    assert est.peak_memory_bytes(units, 2, 2)["grads"] == 4 * (1500 + 2504 + 5007)
    assert est.peak_memory_bytes(units, 2, 2, accumulation=2)["grads"] == 4 * (shards + 5007)   # all shards there
    assert est.peak_memory_bytes(units, 2, 2, in_flight=None)["grads"] == 4 * shards           # none retired early
    assert est.peak_memory_bytes(units, 2, 2)["comm_buffers"] == 4 * (5008 + 2504)            # one pool slot
    assert est.peak_memory_bytes(units, 2, 2, in_flight=2)["comm_buffers"] == 2 * 4 * (5008 + 2504)
    bf16 = est.peak_memory_bytes(units, 2, 3, precision="bf16")
    assert bf16["master"] == 2 * bf16["params"]                        # fp32 masters of bf16 shards
    with pytest.raises(ValueError, match="precision='bf16' at stage 0"):
        est.peak_memory_bytes(units, 2, 0, precision="bf16")


def test_batch_arithmetic_matches_bloom_and_refuses_what_deepspeed_refuses():
    """BLOOM: 384 GPUs at TP 4 x PP 12 leave dp = 8, and 2048 / (2 * 8) = 128 accumulation steps (the
    exported ds_config's gradient_accumulation_steps). A batch that b * dp does not divide is refused."""
    from minimega.estimate import accumulation_steps, data_parallel_size
    assert data_parallel_size(384, 4, 12) == 8 and accumulation_steps(2048, 2, 8) == 128
    assert data_parallel_size(2800, 8, 35) == 10                        # MT-NLG at 2800 GPUs
    with pytest.raises(ValueError, match="tp\\*pp"):
        data_parallel_size(100, 8, 1)
    with pytest.raises(ValueError, match="micro_batch\\*dp"):
        accumulation_steps(16, 4, 3)                                    # chapter 14, problem 4's kind of file
    with pytest.raises(ValueError, match="micro_batch\\*dp"):
        accumulation_steps(0, 1, 1)


def test_context_parallel_divides_activations_and_shards_states_over_dp_cp():
    """cp ranks hold s/cp tokens (every activation term, fused attention) and the same parameters as their dp
    replicas: activations equal those of an s/cp sequence at cp = 1, ZeRO states those of dp·cp ranks."""
    base = dict(layers=32, hidden=4096, heads=32, vocab=50257, seq_len=32768, attention="fused", recompute="selective",
                zero_stage=3, tp=8, dp=4)
    one = est.memory_per_gpu(est.MemoryConfig(**base))
    four = est.memory_per_gpu(est.MemoryConfig(**base, cp=4))
    short = est.memory_per_gpu(est.MemoryConfig(**{**base, "seq_len": 8192}))
    wide = est.memory_per_gpu(est.MemoryConfig(**{**base, "dp": 16}))
    assert four["activations"] == short["activations"] == one["activations"] / 4
    for k in ("params", "grads", "optimizer", "gathered"):
        assert four[k] == wide[k], k
    # The ring's bytes per layer: (6cp - 4) blocks of rows · (s/cp) · (h/t) elements, by hand.
    assert est.cp_ring_bytes(1, 2, 32768, 4096, 4, 8, 2) == (6 * 4 - 4) * 2 * 8192 * 512 * 2
    assert est.cp_ring_bytes(1, 2, 32768, 4096, 4, 8, 2, recompute=True) == (8 * 4 - 6) * 2 * 8192 * 512 * 2
    assert est.cp_ring_bytes(4, 2, 32768, 4096, 1) == 0.0
    with pytest.raises(ValueError, match="cp=2 runs ring attention, which never stores the s x s scores"):
        est.memory_per_gpu(est.MemoryConfig(**{**base, "attention": "unfused", "cp": 2}))
    with pytest.raises(ValueError, match=r"seq_len=32768 is not divisible by 2\*cp = 6"):
        est.memory_per_gpu(est.MemoryConfig(**base, cp=3))
