"""DDP (zero_stage 0) in bf16 and fp16: fp32 master weights, 16-bit forward and backward, gradients reduced in fp32.

The independent oracle is torch FSDP2 with ``MixedPrecisionPolicy(param_dtype=bf16 or fp16, reduce_dtype=fp32)``:
the same recipe (16-bit compute from the fp32 parameters, fp32 reduction, torch's AdamW on the fp32 parameters),
run by torch. torch DDP's own ``mixed_precision`` records device events that its CPU backend refuses ("cpu backend
doesn't support events"), so on CPU it cannot be the oracle (on CUDA it could be; no test compares with it yet).

Closed form of the bytes at the step (Ψ parameters, per rank): 16-bit copies 2Ψ, fp32 masters 4Ψ, fp32 gradients 4Ψ,
Adam's m and v 8Ψ: the 18 bytes per parameter of the course's bf16 row (chapter 1).
"""
import pytest
import torch
import torch.distributed as dist

import minimega as mm
from minimega import data
from minimega.train.engine import make_optimizer
from parity import max_rel_error, parity_config

MODEL = mm.GPTConfig.tiny(block_size=32)
STEPS = 3
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def _ours(config):
    mesh = mm.init_mesh(mm.ParallelDims(dp=dist.get_world_size()))
    torch.manual_seed(config.seed)
    engine = mm.initialize(mm.GPT(MODEL), config, mesh)
    grads = []
    engine.before_step.append(lambda e: grads.append(e.full_grad_dict()) if e.step == 0 else None)
    for batch in data.batches(mesh, STEPS, config.batch_size, 32, seed=config.seed):
        engine.train_step(batch)
    return {"state": engine.full_state_dict(), "grads": grads[0], "memory": engine.report()["memory_at_step"],
            "dtypes": {p.dtype for p in engine.model.parameters()}}


def _fsdp2(config):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    mesh = mm.init_mesh(mm.ParallelDims(dp=dist.get_world_size()))
    torch.manual_seed(config.seed)
    model = mm.GPT(MODEL)
    policy = MixedPrecisionPolicy(param_dtype=DTYPES[config.precision], reduce_dtype=torch.float32)
    fully_shard(model, mesh=init_device_mesh("cpu", (dist.get_world_size(),)), mp_policy=policy,
                reshard_after_forward=False)
    opt = make_optimizer(model.parameters(), config)
    scale, grads = config.loss_scale or 1.0, None          # fp16: torch's recipe with a static scale
    for x, y in data.batches(mesh, STEPS, config.batch_size, 32, seed=config.seed):
        _, loss = model(x, y)
        (loss.float() * scale).backward()
        for p in model.parameters():
            p.grad.div_(scale)
        grads = grads or {n: p.grad.full_tensor().clone() for n, p in model.named_parameters()}
        opt.step()
        opt.zero_grad(set_to_none=True)
    return {k: v.full_tensor().detach().clone() for k, v in model.state_dict().items()}, grads


def _overflow(config):
    """fp16 with a scale that overflows the first step: skipped on every rank, the scale halved, nothing moved."""
    mesh = mm.init_mesh(mm.ParallelDims(dp=dist.get_world_size()))
    torch.manual_seed(config.seed)
    engine = mm.initialize(mm.GPT(MODEL), config, mesh)
    before = engine.full_state_dict()
    engine.train_step(next(iter(data.batches(mesh, 1, config.batch_size, 32, seed=config.seed))))
    scaler = engine.wrapper.scaler
    return max_rel_error(engine.full_state_dict(), before), scaler.scale, scaler.skipped, engine.grad_norms


def _cases(configs):
    overflowing = configs[-1].replace(loss_scale=0.0, initial_scale_power=24, hysteresis=1, gradient_clipping=1.0)
    return [_ours(c) for c in configs] + [_fsdp2(c) for c in configs] + [_overflow(overflowing)]


def test_ddp_bf16_and_fp16_match_fsdp2_mixed_precision():
    """Both sides run the same 16-bit arithmetic, so they agree to fp32 rounding. (With clipping they drift apart by
    ~1e-4: the norm's last bits differ, an fp32 master moves by an ulp, and its 16-bit copy can round the other way.)"""
    configs = [parity_config(precision="bf16"), parity_config(precision="fp16", loss_scale=1024.0)]
    results = mm.launch(_cases, 2, configs, timeout=300)
    ours, theirs, overflow = results[0][:2], results[0][2:4], results[0][4]
    for config, got, (ref, ref_grads) in zip(configs, ours, theirs):
        err = max_rel_error(got["grads"], ref_grads)      # the sharp check: reduced in fp32, unscaled
        assert err <= 1e-6, f"{config.precision}: first gradient {err:.2e} off FSDP2's mixed precision"
        err = max_rel_error(got["state"], ref)
        assert err <= 1e-5, f"{config.precision}: weights {err:.2e} off FSDP2's mixed precision after {STEPS} steps"
        assert got["dtypes"] == {torch.float32}            # between steps the parameters are the fp32 masters
        psi = mm.GPT(MODEL).num_params()
        assert {k: got["memory"][k] for k in ("params", "master", "grads", "optimizer_states")} == {
            "params": 2 * psi, "master": 4 * psi, "grads": 4 * psi, "optimizer_states": 8 * psi}
    for other in results[1:]:                              # every rank ends on the same weights
        assert max_rel_error(other[0]["state"], ours[0]["state"]) == 0.0
    moved, scale, skipped, norms = overflow
    assert (moved, scale, skipped, norms) == (0.0, 2.0 ** 23, 1, []), "an fp16 overflow must skip the step"


def test_the_16_bit_copies_are_in_place_only_for_forward_and_backward():
    """Outside a step (and after an evaluation) the parameters are the fp32 masters."""
    results = mm.launch(_eval_then_dtypes, 1, parity_config(precision="bf16"), timeout=120)
    assert results[0] == ({torch.bfloat16}, {torch.float32}, {torch.float32})


def _eval_then_dtypes(config):
    mesh = mm.init_mesh(mm.ParallelDims(dp=1))
    torch.manual_seed(config.seed)
    engine = mm.initialize(mm.GPT(MODEL), config, mesh)
    seen = set()
    hook = engine.model.blocks[0].register_forward_hook(lambda m, a, out: seen.add(m.attn.qkv.weight.dtype))
    batch = next(iter(data.batches(mesh, 1, config.batch_size, 32, seed=config.seed)))
    engine.train_step(batch)
    after_step = {p.dtype for p in engine.model.parameters()}
    engine.eval_step(batch)
    hook.remove()
    return seen, after_step, {p.dtype for p in engine.model.parameters()}


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_ddp_accepts_16_bit_precisions_and_refuses_fp8(precision):
    assert mm.TrainConfig(zero_stage=0, precision=precision).precision == precision
    with pytest.raises(ValueError, match="fp8.*zero_stage >= 1"):
        mm.TrainConfig(zero_stage=0, precision="fp8")
