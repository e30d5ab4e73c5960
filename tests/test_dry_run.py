"""`minimega dry-run`: the real engine for one rank on meta tensors and a fake process group, against the estimate.

The oracle is `analysis.layout`, an account of the same rank from the layout's integers alone, itself checked
against `model.GPT`'s parameter count. The models are scaled down with BLOOM's awkward traits: 7 layers over 3
stages leave a remainder (BLOOM: 70 over 12), and a vocabulary of 250 does not split over tp = 4 (it is padded).
"""
import pytest
import torch
import torch.distributed as dist

import minimega as mm
from minimega.analysis import layout
from minimega.analysis.dry_run import check_rank, dry_run, sample_ranks
from minimega.pipeline import stage as pipeline_stage

SHAPE = dict(vocab_size=250, block_size=32, n_layer=7, n_head=4, n_embd=32, bias=True)
LLAMA = dict(vocab_size=250, block_size=32, n_layer=7, n_head=4, n_embd=32, n_kv_head=2, mlp="swiglu",
             ffn_hidden=88, position="rope", rope_theta=500000.0, bias=False)
"""Llama-shaped at the same scale: 2 key/value heads for 4 query heads, a SwiGLU MLP of 88, RoPE, no biases."""

LAYOUTS = {   # id: (dp, tp, pp, zero_stage, precision, recompute, micro-steps)
    "dp2-tp4-pp3-z1-bf16-full": (2, 4, 3, 1, "bf16", "full", 4),
    "dp3-tp2-pp3-z2-bf16-full": (3, 2, 3, 2, "bf16", "full", 3),
    "dp3-tp2-pp1-z2-bf16": (3, 2, 1, 2, "bf16", "none", 2),
    "dp2-tp2-pp2-z0-fp32-selective": (2, 2, 2, 0, "fp32", "selective", 2),
    "dp1-tp2-pp3-z1-bf16-full": (1, 2, 3, 1, "bf16", "full", 4),     # GPT-3's Table 3 layout has dp = 1
}
ZERO3 = {   # checked on rank 0 only (one dry run each): the first stage is where m = 2 shows
    "dp2-tp2-pp3-z3-bf16-full": (2, 2, 3, 3, "bf16", "full", 2),     # m = 2: the last micro-batch reduces
    "dp3-tp2-pp1-z3-fp32": (3, 2, 1, 3, "fp32", "none", 2),
}


def _layout(dp, tp, pp, stage, precision, recompute, steps):
    split = dict(micro_batches=steps) if pp > 1 else dict(gradient_accumulation_steps=steps)
    config = mm.TrainConfig(tp=tp, pp=pp, zero_stage=stage, precision=precision, activation_checkpointing=recompute,
                            batch_size=dp * steps * 2, **split)
    return config, mm.ParallelDims(dp=dp, tp=tp, pp=pp)


@pytest.mark.parametrize("name", LAYOUTS)
def test_dry_run_equals_the_estimate(name):
    config, dims = _layout(*LAYOUTS[name])
    for rank in sample_ranks(dims):
        result = check_rank(SHAPE, config, dims, rank)
        assert result["differs"] == [], (name, rank, result["memory_peak"], result["estimate"], result["comm_sent"])
        assert result["memory_peak"]["params"] > 0 and result["comm_sent"]
    assert not dist.is_initialized()                     # the fake world is gone again


@pytest.mark.parametrize("name", ZERO3)
def test_zero3_equals_the_estimate(name):
    """ZeRO-3 against `layout`, and its calls counted by hand: every unit of the chunk is all-gathered before its
    forward and before its backward in each of 2 micro-batches, and reduce-scattered once (pp > 1) or once per
    micro-step (pp = 1)."""
    config, dims = _layout(*ZERO3[name])
    result = check_rank(SHAPE, config, dims, 0)
    assert result["differs"] == [], (result["memory_peak"], result["estimate"], result["comm_sent"])
    units, reductions = (1 + 3, 1) if dims.pp > 1 else (1 + 7 + 1, 2)
    dp = result["comm"]["dp"]
    assert dp["all_gather"]["calls"] == 2 * 2 * units and dp["reduce_scatter"]["calls"] == reductions * units
    assert result["memory_peak"]["gathered"] > 0


def test_check_rank_refuses_what_layout_does_not_model():
    with pytest.raises(ValueError, match="param_persistence_threshold=64"):
        check_rank(SHAPE, mm.TrainConfig(zero_stage=3, param_persistence_threshold=64), mm.ParallelDims(dp=2), 0)


def test_dry_run_equals_the_estimate_with_two_reductions_in_flight():
    """Two pool slots: the reduce pool and the gradient shards retired while the backward runs both change."""
    import dataclasses
    config, dims = _layout(*LAYOUTS["dp3-tp2-pp1-z2-bf16"])
    config = dataclasses.replace(config, reductions_in_flight=2)
    result = check_rank(SHAPE, config, dims, 0)
    assert result["differs"] == [], (result["memory_peak"], result["estimate"])
    one = check_rank(SHAPE, dataclasses.replace(config, reductions_in_flight=1), dims, 0)
    assert result["memory_peak"]["comm_buffers"] > one["memory_peak"]["comm_buffers"]


LLAMA_LAYOUTS = {
    "dp2-tp2-pp3-z1-bf16-full": (2, 2, 3, 1, "bf16", "full", 4),
    "dp2-tp2-pp2-z0-fp32-selective": (2, 2, 2, 0, "fp32", "selective", 2),
    "dp2-tp2-pp1-z3-bf16": (2, 2, 1, 3, "bf16", "none", 2),
}


@pytest.mark.parametrize("name", LLAMA_LAYOUTS)
def test_llama_shaped_dry_run_equals_the_estimate(name):
    """GQA's narrower qkv rows (split over tp), SwiGLU's gate and no position table, on every sampled rank."""
    config, dims = _layout(*LLAMA_LAYOUTS[name])
    for rank in sample_ranks(dims):
        result = check_rank(LLAMA, config, dims, rank)
        assert result["differs"] == [], (name, rank, result["memory_peak"], result["estimate"], result["comm_sent"])
        assert result["params"] == sum(map(sum, layout.rank_units(LLAMA, dims.tp, dims.pp, result["coords"][0])))
    model = mm.GPT(mm.GPTConfig(**LLAMA))
    from minimega.zero.stages import model_units
    assert [sorted(u) for u in layout.rank_units(LLAMA)] == \
        [sorted(p.numel() for _, p in ps) for _, ps in model_units(model)]


def test_layout_counts_the_reference_model():
    """Summed over the stages (tp = 1), the units hold exactly `model.GPT`'s parameters, in the same units."""
    model = mm.GPT(mm.GPTConfig(**SHAPE))
    for pp in (1, 2, 3, 7):
        units = [u for r in range(pp) for u in layout.rank_units(SHAPE, 1, pp, r)]
        assert sum(map(sum, units)) == model.num_params()
    from minimega.zero.stages import model_units
    assert [sorted(u) for u in layout.rank_units(SHAPE)] == \
        [sorted(p.numel() for _, p in ps) for _, ps in model_units(model)]
    # tp = 4: each rank holds ceil(250 / 4) = 63 rows of wte and of the head (252 padded rows in all)
    first, last = layout.rank_units(SHAPE, 4, 3, 0), layout.rank_units(SHAPE, 4, 3, 2)
    assert first[0][0] == last[-1][-1] == 63 * 32


def _remainder_on_the_last_stages(n_layer, chunks):
    """A plausible partitioning bug: the extra blocks on the *last* chunks; every chunk still gets blocks."""
    base, extra = divmod(n_layer, chunks)
    sizes = [base + (k >= chunks - extra) for k in range(chunks)]
    starts = [sum(sizes[:k]) for k in range(chunks)]
    return [range(s, s + n) for s, n in zip(starts, sizes)]


def test_a_layout_bug_only_visible_at_scale_is_caught(monkeypatch):
    """7 layers over 3 stages: the dry run of the first stage shows a partitioning rule the estimate does not
    share. (Every small-layout parity test would pass with this bug: the model is still whole.)"""
    config, dims = _layout(*LAYOUTS["dp2-tp4-pp3-z1-bf16-full"])
    assert check_rank(SHAPE, config, dims, 0)["differs"] == []
    monkeypatch.setattr(pipeline_stage, "layer_bounds", _remainder_on_the_last_stages)
    caught = check_rank(SHAPE, config, dims, 0)
    assert {"params", "grads", "optimizer_states"} <= set(caught["differs"])
    assert "comm:dp" in caught["differs"] and "comm:tp" in caught["differs"]


def test_the_vocabulary_padding_is_counted_to_the_byte():
    """V = 250 over tp = 4: the last tp rank's wte and head shards hold 2 padded rows; the dry run's bytes say so."""
    config, dims = _layout(*LAYOUTS["dp2-tp4-pp3-z1-bf16-full"])
    last = dims.rank_of(2, 1, 3)
    got = dry_run(mm.GPTConfig(**SHAPE), config, dims, last)
    assert got["params"] == sum(map(sum, layout.rank_units(SHAPE, 4, 3, 2)))
    unpadded = dict(SHAPE, vocab_size=248)                              # 62 rows per rank, nothing padded
    assert got["params"] - sum(map(sum, layout.rank_units(unpadded, 4, 3, 2))) == 32


def test_dry_run_refuses_what_it_cannot_build():
    config, dims = _layout(*LAYOUTS["dp3-tp2-pp1-z2-bf16"])
    with pytest.raises(ValueError, match="outside the world"):
        dry_run(mm.GPTConfig(**SHAPE), config, dims, dims.world_size)
    with pytest.raises(ValueError, match="tensor parallelism"):
        dry_run(mm.GPTConfig(**dict(SHAPE, n_head=3, n_embd=33)), config, dims, 0)
    assert not dist.is_initialized()


def test_cli_layout_defaults_to_the_published_one():
    from minimega.tools.cli import build_parser
    from minimega.tools.dry_run_cli import layout_of
    args = build_parser().parse_args(["dry-run", "--model", "bloom-176b"])
    shape, config, dims = layout_of(args)
    assert (dims.dp, dims.tp, dims.pp, config.zero_stage, config.micro_batches, config.batch_size) == \
        (8, 4, 12, 1, 128, 2048)
    assert (shape["n_layer"], shape["n_embd"], shape["vocab_size"]) == (70, 14336, 250880)
    shape, config, dims = layout_of(build_parser().parse_args(["dry-run", "--model", "llama3-405b"]))
    assert (dims.dp, dims.tp, dims.pp, config.micro_batches, config.batch_size) == (64, 8, 16, 32, 2048)
    assert shape == dict(vocab_size=128256, block_size=8192, n_layer=126, n_head=128, n_embd=16384, bias=False,
                         n_kv_head=8, ffn_hidden=53248, mlp="swiglu", position="rope", rope_theta=500000.0)
    with torch.device("meta"):
        assert mm.GPT(mm.GPTConfig(**shape)).num_params() == 405_853_388_800          # Llama 3's published count


def test_comm_model_reduces_gradients_in_their_own_width():
    """bf16 under minimega: fp32 main grads reduce-scattered (4 bytes), bf16 parameters all-gathered (2 bytes)."""
    from minimega.analysis import comm_bytes_per_step
    psi, dp = 1_000_000, 8
    assert comm_bytes_per_step(psi, dp, 1, 2, grad_bytes=4) == pytest.approx((dp - 1) / dp * psi * (4 + 2))
    assert comm_bytes_per_step(psi, dp, 0, 2, grad_bytes=4) == pytest.approx(2 * (dp - 1) / dp * psi * 4)
    assert comm_bytes_per_step(psi, dp, 2, 2) == comm_bytes_per_step(psi, dp, 2, 2, grad_bytes=2)


def test_plan_verify_dry_runs_its_top_picks(capsys):
    """`minimega plan --verify 2` on a small model: both picks dry-run on one rank, equal to layout's estimate;
    a pick the engine cannot build as planned (grouped-query attention here) is named, not run."""
    import json
    from minimega.tools.cli import main
    small = ["plan", "--layers", "4", "--hidden", "64", "--heads", "4", "--vocab", "250", "--seq-len", "32",
             "--precision", "bf16", "--gpus", "4", "--global-batch", "8", "--tp", "1", "2", "--top", "2"]
    assert main(small + ["--verify", "2", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["top"]
    assert [r["verify"]["differs"] for r in rows] == [[], []]
    states, estimate = rows[0]["verify"]["model_state_bytes"]
    assert states == estimate > 0 and rows[0]["verify"]["comm_bytes"][0] > 0
    main(small + ["--kv-heads", "2", "--verify", "1"])
    assert "verify #1: not dry-run: kv_heads=2" in capsys.readouterr().out


PUBLISHED = ("bloom-176b", "mt-nlg-530b", "gpt3-175b", "llama3-405b")


@pytest.mark.slow          # ~25 s of CPU each (the peak sampler after every meta op dominates: measure.sample)
@pytest.mark.parametrize("model", PUBLISHED)
def test_published_model_at_its_layout_equals_the_estimate(model):
    """The published shape at its published dp x tp x pp, ZeRO stage, recomputation and micro-batch, on the last
    stage's last tp and dp rank (the padded vocabulary's tail, the head and the tied embedding's gradient):
    parameters, gradients, master and optimizer states, buffers and every group's bytes equal `layout`'s. The step
    runs m = pp micro-batches (the pipeline full, every rule exercised) instead of the published 128 or more: the
    bytes per micro-batch do not change with m, and the meta-tensor step stays a few seconds. The whole published
    batch is what `minimega dry-run --model NAME` runs (BLOOM's three sampled ranks: equal as well)."""
    from minimega.analysis.layout import published
    from minimega.tools.cli import build_parser
    from minimega.tools.dry_run_cli import layout_of
    preset = published(model)
    batch = preset["dp"] * preset.get("micro_batch", 1) * preset["pp"]
    shape, config, dims = layout_of(build_parser().parse_args(["dry-run", "--model", model,
                                                                "--global-batch", str(batch)]))
    assert (dims.dp, dims.tp, dims.pp) == (preset["dp"], preset["tp"], preset["pp"])
    result = check_rank(shape, config, dims, sample_ranks(dims)[-1])
    assert result["differs"] == [], (model, result["memory_peak"], result["estimate"], result["comm_sent"])
    assert set(result["comm_sent"]) == {"dp", "tp", "pp"} - ({"dp"} if dims.dp == 1 else set())
    assert result["memory_peak"]["grads"] > 0 and result["memory_peak"]["optimizer_states"] > 0
