"""Precision policies: DeepSpeed's loss-scaler rules, fp16 overflow skipping, bf16/fp16 tracking fp32.

bf16/fp16 matmuls are ~100× slower than fp32 on this CPU, so the training checks use a tiny shape
(D = 32, T = 16, two blocks).
"""
import pytest
import torch
import torch.distributed as dist

import minimega as mm
from minimega import comm, data, zero
from minimega.train import precision
from minimega.train.engine import make_optimizer

SMALL = mm.GPTConfig.tiny(n_embd=32, block_size=16, n_layer=2)
STEPS = 12


def test_policies_store_low_precision_with_fp32_master():
    assert precision.policy("fp32").has_master_copy is False
    assert precision.policy("bf16").param_dtype == torch.bfloat16 and not precision.policy("bf16").loss_scaling
    assert precision.policy("fp16").param_dtype == torch.float16 and precision.policy("fp16").loss_scaling
    with pytest.raises(ValueError, match="unknown precision 'fp4'"):
        precision.policy("fp4")


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
        skipped = engine.wrapper.scaler.skipped if engine.wrapper.scaler else 0
        out[name] = (engine.losses, engine.report()["memory_at_step"], engine.wrapper.units[0].flat.dtype, skipped)
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
    # Mixed-precision bytes at stage 2: bf16 parameters (2Ψ), fp32 gradient shards (4Ψ/N: accumulated and
    # reduced in fp32, Megatron-LM's main_grad) and K = 12 (fp32 master + m + v) per shard element.
    psi = mm.GPT(SMALL).num_params()
    memory = curves["bf16"][1]
    assert (memory["params"], memory["grads"]) == (2 * psi, 4 * psi // 2)
    assert memory["master"] + memory["optimizer_states"] == 12 * psi // 2


# ---- bf16 gradients accumulate and reduce in fp32 (Megatron-LM's main_grad) -------------------------------

GA_CONFIG = dict(batch_size=8, seed=1, precision="bf16", gradient_accumulation_steps=4)


def _first_gradients(stages: tuple[int, ...], precision_name: str = "bf16") -> dict:
    """Per ZeRO stage: the fp32 gradient the optimizer receives at step 0 (bf16, dp 2, 4 micro-steps), whole."""
    out = {}
    mesh = mm.init_mesh(mm.ParallelDims(dp=dist.get_world_size()))
    for stage in stages:
        config = mm.TrainConfig(zero_stage=stage, **{**GA_CONFIG, "precision": precision_name})
        torch.manual_seed(config.seed)
        engine = mm.initialize(mm.GPT(SMALL), config, mesh)
        wrapper, seen = engine.wrapper, {}
        real_step = wrapper.store.step

        def capture():
            for u, m in zip(wrapper.units, wrapper.store.master):          # this rank's shard of each unit, fp32
                full = torch.empty(u.padded, dtype=torch.float32)
                comm.all_gather(full, m.grad.detach().clone(), wrapper.group, tag="test")
                seen.update({n: v.clone() for n, v in zip(u.names, u.views(full))})
            real_step()
        wrapper.store.step = capture
        engine.train_step(next(iter(data.batches(mesh, 1, config.batch_size, 16, seed=config.seed))))
        out[stage] = seen
    # The references on a rank: a bf16 matmul's rounding depends on its summation order, hence on the
    # number of threads, which the launcher sets per rank.
    return out, _reference_gradients(low=True), _reference_gradients(low=False)


def _reference_gradients(low: bool) -> dict:
    """One process, the global batch in the engine's micro-steps (dp 2 × 4 micro-steps of B/8 rows: every
    gradient computed from the same rows, scaled by 1/8, a power of two, exact in bf16): fp32 throughout
    (``low`` False), or the bf16 model with each micro-step's gradient added into fp32 (``low``)."""
    torch.manual_seed(GA_CONFIG["seed"])
    model = mm.GPT(SMALL)
    if low:
        model.to(torch.bfloat16)
    parts = 2 * GA_CONFIG["gradient_accumulation_steps"]
    x, y = next(iter(data.global_batches(1, GA_CONFIG["batch_size"], 16, seed=GA_CONFIG["seed"])))
    main = {n: torch.zeros(p.shape) for n, p in model.named_parameters()}
    for xm, ym in zip(x.chunk(parts), y.chunk(parts)):
        (model(xm, ym)[1] / parts).backward()
        for n, p in model.named_parameters():
            main[n] += p.grad.float()
            p.grad = None
    return main


def test_bf16_gradients_accumulate_and_reduce_in_fp32():
    """bf16, dp 2, 4 micro-steps, ZeRO 1-3: the gradient the optimizer gets (measured directly, before Adam)
    equals one process's fp32 sum of the same bf16 micro-step gradients within 1e-3 (norm-relative, per
    tensor); only the order of the fp32 additions differs. Summed over micro-steps and reduced in bf16 it
    was off by bf16's rounding of the partial sums. The all-fp32 reference is printed too: its distance is
    bf16's compute error (each micro-step's forward and backward in bf16), which accumulation cannot remove."""
    got, ref_main, ref_fp32 = mm.launch(_first_gradients, 2, (1, 2, 3), timeout=240)[0]
    from parity import max_rel_error
    for stage, grads in got.items():
        err_main, err_fp32 = max_rel_error(grads, ref_main), max_rel_error(grads, ref_fp32)
        print(f"ZeRO-{stage} bf16 ga4 dp2: gradient vs one-process main_grad {err_main:.2e}, vs fp32 {err_fp32:.2e}")
        assert err_main <= 1e-3, (stage, err_main, err_fp32)
