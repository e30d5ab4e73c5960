"""Activation checkpointing: same gradients as storing everything (dropout included), and the bytes it saves."""
import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import minimega as mm
from minimega import data
from minimega.train.activation_checkpoint import apply_activation_checkpointing, saved_activation_bytes
from minimega.estimate import gpt_activation_bytes_per_layer
from parity import max_rel_error, parity_config, reference_run

SEQ = 32


def _grads(mode, every=1, dropout=0.1):
    """Gradients of one forward/backward with dropout on, and the next number the RNG draws afterwards."""
    torch.manual_seed(0)
    model = apply_activation_checkpointing(mm.GPT(mm.GPTConfig.tiny(block_size=SEQ, dropout=dropout)), mode, every)
    x, y = data.global_batch(0, 8, SEQ, seed=0, vocab_size=256)
    torch.manual_seed(1)
    _, loss = model(x, y)
    loss.backward()
    return {n: p.grad for n, p in model.named_parameters()}, torch.rand(1).item()


@pytest.mark.parametrize("mode,every", [("full", 1), ("full", 2), ("selective", 1)],
                         ids=["full", "full-every2", "selective"])
def test_gradients_equal_no_checkpointing_with_dropout(mode, every):
    ref, ref_next = _grads("none")
    got, got_next = _grads(mode, every)
    assert max_rel_error(got, ref) <= 1e-6
    assert got_next == ref_next          # recomputation replays dropout in a fork: the RNG stream moves on as usual
    # The replay matters: dropout draws differ between calls, so without restoring the RNG the grads would not match.
    assert max_rel_error(_grads_without_replay(), ref) > 1e-3


def _grads_without_replay():
    """Full recomputation that does not restore the RNG state: the control that shows what the replay buys."""
    torch.manual_seed(0)
    model = mm.GPT(mm.GPTConfig.tiny(block_size=SEQ, dropout=0.1))
    for block in model.blocks:
        block.forward = _no_replay(type(block).forward.__get__(block))
    x, y = data.global_batch(0, 8, SEQ, seed=0, vocab_size=256)
    torch.manual_seed(1)
    _, loss = model(x, y)
    loss.backward()
    return {n: p.grad for n, p in model.named_parameters()}


def _no_replay(fn):
    from minimega.train.activation_checkpoint import _Checkpoint

    class NoReplay(_Checkpoint):
        @staticmethod
        def forward(ctx, fn, *inputs):
            out = _Checkpoint.forward(ctx, fn, *inputs)
            ctx.cpu_rng = torch.get_rng_state()   # the state *after* the first forward: different masks
            return out
    return lambda *inputs: NoReplay.apply(fn, *inputs)


@pytest.mark.parametrize("preset", ["tiny", "small"])
@pytest.mark.parametrize("attention", ["flash", "math"])
def test_saved_bytes_per_layer_match_formula(preset, attention):
    dropout = 0.1 if attention == "math" else 0.0   # PyTorch's CPU fused attention has no dropout
    cfg = mm.GPTConfig.preset(preset, dropout=dropout)
    b, s, h, a = 8, SEQ, cfg.n_embd, cfg.n_head
    measured = {}
    for mode in ("none", "selective", "full"):
        torch.manual_seed(0)
        model = apply_activation_checkpointing(mm.GPT(cfg), mode)
        x = torch.randn(b, s, h, requires_grad=True)
        with sdpa_kernel(SDPBackend.MATH if attention == "math" else SDPBackend.FLASH_ATTENTION):
            measured[mode] = saved_activation_bytes(model.blocks[0], x)
        want = gpt_activation_bytes_per_layer(s, b, h, a, recompute=mode, dropout=dropout > 0, attention=attention)
        print(f"{preset} {attention} {mode}: measured {measured[mode]} B, formula {want:.0f} B")
        assert abs(measured[mode] - want) <= 0.05 * want
    assert measured["full"] == b * s * h * 4          # only the block input
    assert measured["full"] < measured["selective"] < measured["none"]


def test_formula_reproduces_korthikanti_table2():
    # 16-bit activations, 1-byte masks, dropout, unfused attention: Table 2 (arXiv:2205.05198), plus 16sb for LN stats.
    s, b, h, a, t = 2048, 1, 12288, 96, 8           # GPT-3 175B
    kw = dict(act_bytes=2, mask_bytes=1, dropout=True, attention="math")
    extra = 16 * s * b
    assert gpt_activation_bytes_per_layer(s, b, h, a, **kw) - extra == pytest.approx(s * b * h * (34 + 5 * a * s / h))
    assert gpt_activation_bytes_per_layer(s, b, h, a, tp=t, **kw) - extra == pytest.approx(
        s * b * h * (10 + 24 / t + 5 * a * s / (h * t)))
    assert gpt_activation_bytes_per_layer(s, b, h, a, tp=t, recompute="selective", **kw) - extra == pytest.approx(
        s * b * h * (10 + 24 / t))
    assert gpt_activation_bytes_per_layer(s, b, h, a, tp=t, recompute="full", **kw) == s * b * h * 2
    # training-stacks.md §2.5: 578.8 MB per layer for TP (t = 8), 2868.9 MB without parallelism.
    assert (gpt_activation_bytes_per_layer(s, b, h, a, tp=t, **kw) - extra) / 1e6 == pytest.approx(578.8, abs=0.05)
    assert (gpt_activation_bytes_per_layer(s, b, h, a, **kw) - extra) / 1e6 == pytest.approx(2868.9, abs=0.05)


@pytest.mark.parametrize("mode", ["full", "selective"])
def test_engine_with_checkpointing_matches_single_process(mode):
    model_config = mm.GPTConfig.tiny(block_size=SEQ)
    config = parity_config(activation_checkpointing=mode, checkpoint_every=2 if mode == "full" else 1)
    ref, ref_losses = reference_run(model_config, config, 3, seq_len=SEQ)
    mesh = mm.init_mesh()
    torch.manual_seed(config.seed)
    engine = mm.initialize(mm.GPT(model_config), config, mesh)
    for batch in data.batches(mesh, 3, config.batch_size, SEQ, seed=config.seed):
        engine.train_step(batch)
    assert max_rel_error(engine.full_state_dict(), ref) <= 1e-5
    assert engine.losses == pytest.approx(ref_losses, rel=1e-6)


def test_bad_mode_is_refused():
    with pytest.raises(ValueError, match="choose one of"):
        apply_activation_checkpointing(mm.GPT(mm.GPTConfig.tiny()), "some")
