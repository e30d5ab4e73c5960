"""The reference GPT: shapes, parameter count, seeded init, causality, nanoGPT's (logits, loss)."""
import math

import pytest
import torch

import minimega as mm


def test_parameter_count_matches_the_formula():
    for cfg in (mm.GPTConfig.tiny(), mm.GPTConfig.small()):
        V, T, L, D = cfg.vocab_size, cfg.block_size, cfg.n_layer, cfg.n_embd
        assert mm.GPT(cfg).num_params() == V * D + T * D + L * (12 * D * D + 2 * D) + D + D * V
    cfg = mm.GPTConfig.tiny(bias=True)
    D, L = cfg.n_embd, cfg.n_layer
    assert mm.GPT(cfg).num_params() - mm.GPT(mm.GPTConfig.tiny()).num_params() == L * (11 * D) + D


def test_forward_shapes_loss_and_seeded_init():
    cfg = mm.GPTConfig.tiny()
    torch.manual_seed(0)
    a = mm.GPT(cfg)
    torch.manual_seed(0)
    b = mm.GPT(cfg)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    x = torch.randint(0, cfg.vocab_size, (2, 16))
    logits, loss = a(x, x)
    assert logits.shape == (2, 16, cfg.vocab_size)
    assert abs(loss.item() - math.log(cfg.vocab_size)) < 0.1          # near-uniform at init
    assert a(x)[1] is None


def test_attention_is_causal():
    torch.manual_seed(0)
    model = mm.GPT(mm.GPTConfig.tiny()).eval()
    x = torch.randint(0, 256, (1, 12))
    y = x.clone()
    y[0, 8:] = (y[0, 8:] + 1) % 256                                   # change only the future
    assert torch.allclose(model(x)[0][0, :8], model(y)[0][0, :8], atol=1e-6)


def test_bad_configs_are_refused():
    with pytest.raises(ValueError, match="n_head=3 does not divide n_embd=64"):
        mm.GPTConfig.tiny(n_head=3)
    with pytest.raises(ValueError, match="unknown preset 'huge'"):
        mm.GPTConfig.preset("huge")
    with pytest.raises(ValueError, match="exceeds block_size=64"):
        mm.GPT(mm.GPTConfig.tiny())(torch.zeros(1, 65, dtype=torch.long))
