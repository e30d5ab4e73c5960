"""Precision policies: DeepSpeed's loss-scaler rules, fp16 overflow skipping, bf16/fp16 tracking fp32.

bf16/fp16 matmuls are ~100× slower than fp32 on this CPU, so the training checks use a tiny shape
(D = 32, T = 16, two blocks).
"""
import pytest
import torch
import torch.distributed as dist

import minimega as mm
from minimega import comm, data, precision, zero
from minimega.engine import make_optimizer

SMALL = mm.GPTConfig.tiny(n_embd=32, block_size=16, n_layer=2)
STEPS = 12


def test_policies_store_low_precision_with_fp32_master():
    assert precision.policy("fp32").has_master_copy is False
    assert precision.policy("bf16").param_dtype == torch.bfloat16 and not precision.policy("bf16").loss_scaling
    assert precision.policy("fp16").param_dtype == torch.float16 and precision.policy("fp16").loss_scaling
    with pytest.raises(ValueError, match="unknown precision 'fp8'"):
        precision.policy("fp8")


def test_dynamic_scaler_hysteresis_then_shrink_then_floor():
    s = precision.DynamicLossScaler()
    assert (s.scale, s.window, s.hysteresis, s.min_scale) == (2.0 ** 16, 1000, 2, 1.0)
    s.update(overflow=True)
    assert s.scale == 2.0 ** 16                  # the first overflow is absorbed by hysteresis
    s.update(overflow=True)
    assert s.scale == 2.0 ** 15                  # the second halves the scale
    s.update(overflow=True)
    assert s.scale == 2.0 ** 14                  # hysteresis stays spent until the scale grows again
    for _ in range(40):
        s.update(overflow=True)
    assert s.scale == 1.0 and s.skipped == 43    # never below min_scale


def test_dynamic_scaler_grows_after_a_clean_window_and_refills_hysteresis():
    s = precision.DynamicLossScaler(init_scale=8.0, window=4)
    for _ in range(3):
        s.update(overflow=False)
    assert s.scale == 8.0
    s.update(overflow=False)                     # the 4th clean step since the start
    assert s.scale == 16.0
    s.update(overflow=True)
    s.update(overflow=True)
    assert s.scale == 8.0 and s.cur_hysteresis == 1
    for _ in range(4):
        s.update(overflow=False)
    assert s.scale == 16.0 and s.cur_hysteresis == 2    # 4 clean steps after the last overflow


def test_static_scaler_counts_skips_and_keeps_its_scale():
    s = precision.make_scaler(precision.policy("fp16"), mm.TrainConfig(loss_scale=128.0, zero_stage=1, precision="fp16"))
    s.update(True)
    assert s.scale == 128.0 and s.skipped == 1
    assert precision.make_scaler(precision.policy("bf16")) is None


def test_deepspeed_fp16_settings_reach_the_dynamic_scaler():
    cfg = mm.TrainConfig.from_deepspeed({"zero_optimization": {"stage": 1}, "fp16": {
        "enabled": True, "initial_scale_power": 8, "loss_scale_window": 50, "hysteresis": 1, "min_loss_scale": 4}})
    s = precision.make_scaler(precision.policy("fp16"), cfg)
    assert (s.scale, s.window, s.hysteresis, s.min_scale) == (256.0, 50, 1, 4.0)
    s.update(True)                                       # hysteresis 1: the first overflow halves at once
    assert s.scale == 128.0


def test_fp16_overflow_skips_the_step_and_leaves_weights_alone():
    # One rank: a group of one never touches torch.distributed, so this runs in-process.
    group = comm.Group(None, [0], "dp")
    torch.manual_seed(0)
    config = mm.TrainConfig(zero_stage=2, precision="fp16")
    stage = zero.wrap(mm.GPT(SMALL), config, group, 0, lambda p: make_optimizer(p, config))
    x, y = data.global_batch(0, 2, 16)
    before = {k: v.clone() for k, v in stage.full_state_dict().items()}
    stage.scaler.scale = 1e30                    # loss * scale overflows fp16
    stage.scale_loss(stage(x, y)[1]).backward()
    stage.finish_grad_sync()
    assert stage.step() is False and stage.scaler.scale == 1e30 and stage.scaler.skipped == 1
    stage.zero_grad()
    assert all(torch.equal(v, before[k]) for k, v in stage.full_state_dict().items())
    stage.scale_loss(stage(x, y)[1]).backward()
    stage.finish_grad_sync()
    assert stage.step() is False and stage.scaler.scale == 5e29      # hysteresis spent: halved
    stage.zero_grad()
    stage.scaler.scale = 2.0 ** 8
    stage.scale_loss(stage(x, y)[1]).backward()
    stage.finish_grad_sync()
    assert stage.step() is True
    assert any(not torch.equal(v, before[k]) for k, v in stage.full_state_dict().items())


def _curves(_):
    mesh = mm.init_mesh(mm.ParallelDims(dp=dist.get_world_size()))
    out = {}
    # fp16 with a fixed scale: DeepSpeed's dynamic 2^16 overflows (and skips) the first steps, which
    # shifts the curve by those steps; the scaler's rules are tested above.
    for name, stage, scale in (("fp32", 2, 0.0), ("bf16", 2, 0.0), ("fp16", 3, 2.0 ** 10)):
        config = mm.TrainConfig(zero_stage=stage, precision=name, seed=1, lr=3e-3, loss_scale=scale)
        torch.manual_seed(config.seed)
        engine = mm.initialize(mm.GPT(SMALL), config, mesh)
        for batch in data.batches(mesh, STEPS, config.batch_size, 16, seed=config.seed):
            engine.train_step(batch)
        skipped = engine.model.scaler.skipped if engine.model.scaler else 0
        out[name] = (engine.losses, engine.report()["memory_at_step"], engine.model.units[0].flat.dtype, skipped)
    return out


def test_bf16_and_fp16_track_the_fp32_loss_curve():
    curves = mm.launch(_curves, 2, None, timeout=300)[0]
    fp32 = curves["fp32"][0]
    assert fp32[-1] < fp32[0] - 0.5                      # it learns
    for name, dtype in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
        losses, memory, stored, skipped = curves[name]
        assert stored == dtype and skipped == 0
        # Stated tolerance: within 2% of the fp32 loss at every step.
        assert losses == pytest.approx(fp32, rel=2e-2), name
    # Mixed-precision bytes at stage 2 (the ZeRO paper's 2Ψ + (2 + K)Ψ/N with K = 12: fp32 master + m + v).
    psi = mm.GPT(SMALL).num_params()
    memory = curves["bf16"][1]
    assert (memory["params"], memory["grads"]) == (2 * psi, 2 * psi // 2)
    assert memory["master"] + memory["optimizer_states"] == 12 * psi // 2
