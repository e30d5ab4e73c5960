"""FP8 linears: the casts, the delayed-scaling recipe, the fp8 matmul against fp32, underflow without scaling."""
import pytest
import torch
import torch.nn.functional as F

from minimega.train import fp8
from minimega.train.fp8 import E4M3, E5M2


def test_formats_and_saturating_cast():
    assert fp8.FP8_MAX == {E4M3: 448.0, E5M2: 57344.0}
    one = torch.ones(())
    q = fp8.quantize(torch.tensor([1e6, -1e6, 0.3]), one, E4M3)
    assert q.float().tolist()[:2] == [448.0, -448.0]                     # saturates, no NaN
    assert abs(q.float()[2].item() - 0.3) <= 0.3 * 2 ** -4               # 3 mantissa bits: half an ulp
    assert fp8.quantize(torch.tensor([1e-6]), one, E5M2).item() == 0.0   # below 2^-16: flushed to 0


def test_delayed_scaling_follows_the_recipe():
    """TE's recipe: scale = (fp8 max / max(history)) / 2^margin; the history rolls by one, slot 0 zeroed."""
    s = fp8.DelayedScaling(E4M3, history_len=3, margin=1)
    s.update()
    assert s.scale.item() == 1.0                                         # an empty history keeps the scale
    for amax in (2.0, 8.0, 1.0, 0.5, 0.25):
        s.observe(torch.tensor([-amax, amax / 3]))
        s.observe(torch.tensor([amax / 2]))                             # micro-steps fold into one slot
        s.update()
    # The last three amaxes (1, 0.5, 0.25) are in the window: 8 has dropped out.
    assert s.scale.item() == pytest.approx(448.0 / 1.0 / 2)
    assert s.amax_history[0].item() == 0.0 and sorted(s.amax_history.tolist()) == [0.0, 0.25, 0.5]


def _linear_case(seed=0, grad_size=1.0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(32, 24, generator=g)
    w = torch.randn(16, 24, generator=g) * 0.02
    dy = torch.randn(32, 16, generator=g) * grad_size
    return x, w, dy


def _fp8_grads(x, w, dy, meta):
    x, w = x.clone().requires_grad_(), w.clone().requires_grad_()
    y = fp8._Fp8LinearFn.apply(x, w, None, meta)
    y.backward(dy)
    return y.detach(), x.grad, w.grad


def _rel(a, b):
    return ((a - b).norm() / b.norm()).item()


def test_fp8_linear_matches_fp32_once_scaled():
    """Forward and both gradients against F.linear in fp32: E4M3 keeps ~2^-4 per element, E5M2 ~2^-3;
    summed over K = 24 or M = 32 terms the norm-relative error stays under 10% (stated bound)."""
    x, w, dy = _linear_case()
    meta = fp8.Fp8Meta(history_len=4)
    _fp8_grads(x, w, dy, meta)
    meta.update()                                                       # step 2 casts with learned scales
    y, gx, gw = _fp8_grads(x, w, dy, meta)
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
    yr = F.linear(xr, wr)
    yr.backward(dy)
    errors = _rel(y, yr.detach()), _rel(gx, xr.grad), _rel(gw, wr.grad)
    print("fp8 linear vs fp32, norm-relative (y, dx, dw):", [f"{e:.3f}" for e in errors])
    assert max(errors) < 0.1, errors
    assert min(errors) > 0                                              # really rounded


def test_delayed_scaling_keeps_small_gradients_out_of_underflow():
    """Gradients of ~1e-6 (a loss scaled down, a deep layer): cast to E5M2 with scale 1 nearly all become 0
    (its smallest subnormal is 2^-16 = 1.5e-5); after one step of amax history the scale maps their max to
    57344 and none is 0. Zeros counted in the cast gradient and in the weight gradient it produces."""
    x, w, dy = _linear_case(grad_size=1e-6)
    meta = fp8.Fp8Meta(history_len=4)
    unscaled = fp8.quantize(dy, meta.grad_output.scale, E5M2)
    _, _, gw_unscaled = _fp8_grads(x, w, dy, meta)
    meta.update()
    scaled = fp8.quantize(dy, meta.grad_output.scale, E5M2)
    _, _, gw_scaled = _fp8_grads(x, w, dy, meta)
    zeros = [(t == 0).float().mean().item() for t in (unscaled, gw_unscaled, scaled, gw_scaled)]
    print("zero fraction: E5M2 dy, dW without scaling; with:", zeros)
    assert zeros[0] > 0.9 and zeros[1] > 0.5                             # underflow
    assert zeros[2] < 0.01 and zeros[3] == 0.0                           # scaled: kept
    assert meta.grad_output.scale.item() > 1e9
    assert _rel(gw_scaled, dy.t() @ x) < 0.1


def test_convert_swaps_the_block_linears_only():
    import minimega as mm
    torch.manual_seed(0)
    model = mm.GPT(mm.GPTConfig.tiny(n_layer=2))
    before = {n: p.clone() for n, p in model.named_parameters()}
    linears = fp8.convert(model, history_len=8)
    assert len(linears) == 2 * 4 and type(model.lm_head) is torch.nn.Linear
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())
    x = torch.randint(0, 256, (2, 16))
    _, loss = model(x, x)
    loss.backward()
    assert all(m.fp8.grad_output.amax_history[0] > 0 for m in linears)
    fp8.update_scales([model])
    assert all(m.fp8.weight.scale.item() != 1.0 for m in linears)


def _train(precision_name: str, steps: int, model_config, **overrides):
    import minimega as mm
    from minimega import data
    mesh = mm.init_mesh()
    config = mm.TrainConfig(zero_stage=1, precision=precision_name, seed=1, lr=3e-3, **overrides)
    torch.manual_seed(config.seed)
    engine = mm.initialize(mm.GPT(model_config), config, mesh)
    for batch in data.batches(mesh, steps, config.batch_size, model_config.block_size, seed=config.seed):
        engine.train_step(batch)
    return engine


@pytest.mark.slow
def test_fp8_training_tracks_bf16_over_50_steps():
    """One process, ZeRO-1, the tests' small tiny model (D = 32, T = 16, two blocks), 50 steps, same seed and
    batches. Stated bound: every step's loss within 8% of bf16's, the mean of the last 10 within 1% (measured on
    an earlier machine: 4.9% at worst, early, and equal last-10 means; with the E5M2 gradients left unscaled: 6.4%
    and 1.8%. On the 2026-12-06 machine the same code, fa0b7e0's included, gives one spike of 6.9% at step 37, the
    other steps within 1.5%, and last-10 means 0.9% apart: the CPU's kernels round differently). (Slow:
    two 50-step runs; the cheap checks of the same path are the linear's tests above and the ZeRO-3 test.)"""
    import minimega as mm
    small = mm.GPTConfig.tiny(n_embd=32, block_size=16, n_layer=2)
    bf16, fp8_run = _train("bf16", 50, small), _train("fp8", 50, small)
    assert len(fp8.fp8_linears(fp8_run.model)) == 8 and not fp8.fp8_linears(bf16.model)
    a, b = torch.tensor(bf16.losses), torch.tensor(fp8_run.losses)
    rel = ((b - a).abs() / a)
    print(f"fp8 vs bf16 over 50 steps: max rel {rel.max():.4f}, last-10 means {a[-10:].mean():.4f} "
          f"{b[-10:].mean():.4f}")
    assert a[-1] < a[0] - 1.0 and b[-1] < b[0] - 1.0                    # both learn
    assert 0 < rel.max() < 0.08                                          # rounded, and close
    assert abs(b[-10:].mean() - a[-10:].mean()) < 0.01 * a[-10:].mean()


def test_fp8_is_refused_where_it_is_not_built():
    import minimega as mm
    for layout in (dict(tp=2), dict(pp=2), dict(cp=2)):
        with pytest.raises(ValueError, match="precision='fp8' with"):
            mm.TrainConfig(zero_stage=1, precision="fp8", **layout)
    with pytest.raises(ValueError, match="needs zero_stage >= 1"):
        mm.TrainConfig(precision="fp8")
    from minimega.tools.export_deepspeed import to_deepspeed
    from minimega.tools.export_megatron import to_megatron, to_torchtitan
    cfg = mm.TrainConfig(zero_stage=1, precision="fp8")
    engine = mm.initialize(mm.GPT(mm.GPTConfig.tiny(n_layer=1)), cfg, mm.init_mesh())
    for io in (engine.save, engine.load):
        with pytest.raises(ValueError, match="precision='fp8' keeps per-tensor amax histories"):
            io("/nonexistent-fp8-checkpoint")
    for export in (lambda: to_deepspeed(cfg, 2), lambda: to_megatron(cfg, 2, mm.GPTConfig.tiny()),
                   lambda: to_torchtitan(cfg, 2, mm.GPTConfig.tiny())):
        with pytest.raises(ValueError, match="precision='fp8' cannot be expressed"):
            export()


# ---- ZeRO-3 gathers the fp8 linears' weights in E4M3 ---------------------------------------------------------

GATHER_MODEL = dict(n_embd=32, block_size=16, n_layer=2)
STEPS = 2


def _gather_bytes(_):
    """dp 2: ZeRO-3 in bf16 and in fp8, STEPS steps each; the CommLog's all-gather bytes per unit, the losses;
    under fp8 also a block's gathered weight and the E4M3 cast of the whole bf16 weight, made here."""
    import torch.distributed as dist
    import minimega as mm
    from minimega import data
    model_config = mm.GPTConfig.tiny(**GATHER_MODEL)
    mesh = mm.init_mesh(mm.ParallelDims(dp=dist.get_world_size()))
    out = {}
    for name in ("bf16", "fp8"):
        # LayerNorm weights whole in both runs (fp8 keeps them whole anyway): the block units then match.
        config = mm.TrainConfig(zero_stage=3, precision=name, seed=1, lr=3e-3,
                                param_persistence_threshold=model_config.n_embd)
        torch.manual_seed(config.seed)
        engine = mm.initialize(mm.GPT(model_config), config, mesh)
        for batch in data.batches(mesh, STEPS, config.batch_size, model_config.block_size, seed=config.seed):
            engine.train_step(batch)
        gathers = {}
        for e in engine.comm_log.events():
            if e["op"] == "all_gather" and e["tag"].startswith(("blocks.", "embed", "head")):
                gathers.setdefault(e["tag"], []).append((e["bytes"], e["dtype"]))
        out[name] = (engine.losses, gathers, type(engine.wrapper).__name__, _gathered_weight(engine), engine.memory())
    return out


def _gathered_weight(engine):
    """(block 1's gathered mlp.fc weight, the E4M3 round trip of the bf16 copy of its fp32 master) or None."""
    if engine.config.precision != "fp8":
        return None
    master = engine.full_state_dict()["blocks.1.mlp.fc.weight"].to(torch.bfloat16)
    linear, stage = engine.model.blocks[1].mlp.fc, engine.wrapper
    k = stage.step_names.index("blocks.1")
    stage.unshard(k)
    got = linear.weight.detach().clone()
    stage.reshard(k)
    scale = linear.fp8.weight.scale
    return got, fp8.dequantize(fp8.quantize(master, scale, E4M3), scale, torch.bfloat16), scale.item()


@pytest.fixture(scope="module")
def gathered():
    import minimega as mm
    return mm.launch(_gather_bytes, 2, None, timeout=300)[0]


def test_zero3_fp8_gathers_half_the_block_bytes(gathered):
    """The CommLog at fp8 vs bf16: every block all-gather moves 12·D² elements (the four linear weights; the
    LayerNorms stay whole) at 1 byte instead of 2, forward and backward, every step: exactly half. The
    embeddings and the head are not fp8 and move the same bytes in both."""
    (_, bf16, kind_bf16, _, _), (_, fp8_, kind_fp8, _, _) = gathered["bf16"], gathered["fp8"]
    assert (kind_bf16, kind_fp8) == ("Zero3", "Zero3Fp8")
    d, steps = GATHER_MODEL["n_embd"], STEPS
    for i in range(GATHER_MODEL["n_layer"]):
        tag = f"blocks.{i}"
        assert bf16[tag] == [(2 * 12 * d * d, "bfloat16")] * 2 * steps
        assert fp8_[tag] == [(12 * d * d, "uint8")] * 2 * steps
    for tag in ("embed", "head"):
        assert fp8_[tag] == bf16[tag]
    block = [sum(b for b, _ in run[f"blocks.{i}"]) for run in (bf16, fp8_) for i in range(2)]
    print(f"block all-gather bytes over {STEPS} steps, bf16 vs fp8:", block[:2], block[2:])


def test_zero3_fp8_gathers_the_e4m3_cast_of_the_weight(gathered):
    """What arrives is the weight the fp8 linear multiplies: the gathered block weight equals, exactly, the
    E4M3 cast (with the weight's delayed scale) of the whole bf16 weight, cast back; and training goes on
    (losses within 8% of bf16's)."""
    losses, _, _, (got, expected, scale), _ = gathered["fp8"]
    assert scale != 1.0 and torch.equal(got, expected)
    assert losses == pytest.approx(gathered["bf16"][0], rel=8e-2)


def test_fp8_model_states_cost_what_bf16_costs(gathered):
    """The estimator's fp8 row (2 + 4 + 12 bytes a parameter, bf16's) against the engine: at ZeRO-3 the fp8
    run holds exactly the bytes the bf16 run holds, category by category (the fp8 casts are transient)."""
    from minimega import estimate as est
    assert est.state_bytes_per_param("fp8") == est.state_bytes_per_param("bf16") == (2, 4, 12)
    assert gathered["fp8"][4] == gathered["bf16"][4]



def test_scaling_stays_on_the_device_without_host_reads():
    """A linear's forward, backward and scale update on the meta device, where any read back to the host
    (``.cpu()``, ``.item()``, ``if tensor``) raises: the history and scales follow the tensors there, and no
    op asks for a value (``_local_scalar_dense``)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Reads(TorchDispatchMode):
        seen: list = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten._local_scalar_dense.default:
                self.seen.append(func)
            return func(*args, **(kwargs or {}))

    meta = fp8.Fp8Meta(history_len=4)
    x = torch.randn(32, 24, device="meta", requires_grad=True)
    w = torch.randn(16, 24, device="meta", requires_grad=True)
    with Reads() as reads:
        fp8._Fp8LinearFn.apply(x, w, None, meta).backward(torch.randn(32, 16, device="meta"))
        meta.update()
    assert reads.seen == []
    assert all(s.amax_history.device.type == s.scale.device.type == "meta" for s in meta.states())


def test_evaluation_leaves_the_amax_history_untouched():
    """An engine's eval_step between training steps: every fp8 linear's history and scales are as the training
    step left them (and a training step does change them: the check can see a change)."""
    import minimega as mm
    from minimega import data
    cfg = mm.GPTConfig.tiny(n_embd=32, block_size=16, n_layer=1)
    engine = _train("fp8", 1, cfg)
    linears = fp8.fp8_linears(engine.model)

    def snapshot():
        return [(s.amax_history.clone(), s.scale.clone()) for m in linears for s in m.fp8.states()]

    def same(a, b):
        return all(torch.equal(h, g) and torch.equal(s, t) for (h, s), (g, t) in zip(a, b))
    before = snapshot()
    engine.eval_step(data.global_batch(0, 8, 16, split="val"))
    assert same(snapshot(), before)
    engine.train_step(next(data.batches(engine.mesh, 1, 8, 16, seed=5)))
    assert not same(snapshot(), before)
