"""Llama's blocks as GPTConfig options: grouped-query attention, SwiGLU, RoPE (`model.py`, `rope.py`,
`parallel/tensor_blocks.py`).

Oracles: the plain model (defaults, and n_kv_head = n_head, are GPT-2's model bit for bit), an attention written
out by hand here (explicit softmax, K/V heads repeated, RoPE as a complex-number rotation in float64), the analytic
parameter count of `analysis.shapes`, and the single-process model for every parallel layout (gradients after
steps 1 and 2, weights after STEPS steps), with one launch of 2 ranks for all layouts.
"""
from __future__ import annotations

import math
import traceback
from types import SimpleNamespace

import pytest
import torch

import minimega as mm
from minimega import data
from minimega.analysis import shapes
from minimega.train.engine import validate
from minimega.model import CausalSelfAttention
from minimega.rope import apply_rope, rope_angles
from minimega.parallel.tensor import check_divisible
from parity import assert_layout_matches, max_rel_error, parity_config

MODEL = mm.GPTConfig.tiny_llama(block_size=32)
SEQ = 32
STEPS = 3
GRAD_STEPS = 2


# --------------------------------------------------------------------------------------------------------------
# One process

def _run(config: mm.GPTConfig, seed: int = 0):
    torch.manual_seed(seed)
    model = mm.GPT(config)
    x, y = data.global_batch(0, 2, 16)
    _, loss = model(x, y)
    loss.backward()
    return model, loss


@pytest.mark.parametrize("explicit", [dict(n_kv_head=4), dict(n_kv_head=4, mlp="gelu", position="learned",
                                                              ffn_hidden=256)], ids=["n_kv_head=n_head", "all"])
def test_defaults_and_explicit_mha_are_the_plain_model_bit_for_bit(explicit):
    plain, plain_loss = _run(mm.GPTConfig.tiny())
    same, same_loss = _run(mm.GPTConfig.tiny(**explicit))
    assert [n for n, _ in same.named_parameters()] == [n for n, _ in plain.named_parameters()]
    assert torch.equal(same_loss, plain_loss)
    for (name, a), b in zip(plain.named_parameters(), same.parameters()):
        assert torch.equal(a, b) and torch.equal(a.grad, b.grad), name


def _gpt2_forward(model: mm.GPT, idx: torch.Tensor) -> torch.Tensor:
    """GPT-2's forward as model.py computed it before Llama's options existed, op for op, from the parameters."""
    F = torch.nn.functional
    B, T = idx.shape
    x = model.wte(idx) + model.wpe(torch.arange(T))
    for blk in model.blocks:
        h = F.layer_norm(x, (x.shape[-1],), blk.ln_1.weight)
        q, k, v = F.linear(h, blk.attn.qkv.weight).split(x.shape[-1], dim=-1)
        q, k, v = (t.view(B, T, 4, 16).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, 64)
        x = x + F.linear(y, blk.attn.proj.weight)
        h = F.layer_norm(x, (x.shape[-1],), blk.ln_2.weight)
        x = x + F.linear(F.gelu(F.linear(h, blk.mlp.fc.weight)), blk.mlp.proj.weight)
    return F.linear(F.layer_norm(x, (64,), model.ln_f.weight), model.lm_head.weight)


def test_default_model_is_gpt2_forward_bit_for_bit():
    torch.manual_seed(0)
    model = mm.GPT(mm.GPTConfig.tiny())
    x, _ = data.global_batch(0, 2, 16)
    with torch.no_grad():
        assert torch.equal(model(x)[0], _gpt2_forward(model, x))


def test_parameter_names_of_the_plain_model_are_unchanged():
    names = [n for n, _ in mm.GPT(mm.GPTConfig.tiny(n_layer=1)).named_parameters()]
    assert names == ["wte.weight", "wpe.weight", "blocks.0.ln_1.weight", "blocks.0.attn.qkv.weight",
                     "blocks.0.attn.proj.weight", "blocks.0.ln_2.weight", "blocks.0.mlp.fc.weight",
                     "blocks.0.mlp.proj.weight", "ln_f.weight", "lm_head.weight"]
    llama = dict(mm.GPT(mm.GPTConfig.tiny_llama(n_layer=1)).named_parameters())
    assert "wpe.weight" not in llama and llama["blocks.0.mlp.gate.weight"].shape == (176, 64)
    assert llama["blocks.0.attn.qkv.weight"].shape == (64 + 2 * 2 * 16, 64)       # [q; k; v]: D + 2 kv heads·hs


def _complex_rope(x: torch.Tensor, positions: torch.Tensor, base: float) -> torch.Tensor:
    """Meta's reference form, in float64: pairs (2i, 2i+1) as complex numbers times e^{i·m·θ_i}. x: (B, T, h, hs)."""
    hs = x.shape[-1]
    freqs = 1.0 / base ** (torch.arange(0, hs, 2, dtype=torch.float64) / hs)
    turn = torch.polar(torch.ones(len(positions), hs // 2, dtype=torch.float64),
                       torch.outer(positions.double(), freqs))                          # (T, hs/2)
    xc = torch.view_as_complex(x.double().reshape(*x.shape[:-1], hs // 2, 2))
    return torch.view_as_real(xc * turn[None, :, None, :]).flatten(-2)


def _reference_attention(attn: CausalSelfAttention, x: torch.Tensor, base: float | None) -> torch.Tensor:
    """The attention written out: q, k, v from the rows of qkv, K/V heads repeated for their query heads,
    complex RoPE, an explicit causal softmax, the output projection; float64."""
    B, T, D = x.shape
    nh, nkv, hs = attn.n_head, attn.n_kv_head, attn.head_size
    w = attn.qkv.weight.double()
    x = x.double()
    q = (x @ w[:nh * hs].T).view(B, T, nh, hs)
    k = (x @ w[nh * hs:(nh + nkv) * hs].T).view(B, T, nkv, hs)
    v = (x @ w[(nh + nkv) * hs:].T).view(B, T, nkv, hs)
    if base is not None:
        q, k = _complex_rope(q, torch.arange(T), base), _complex_rope(k, torch.arange(T), base)
    k, v = (t.repeat_interleave(nh // nkv, dim=2) for t in (k, v))                   # query head i reads i // g
    scores = torch.einsum("bthd,bshd->bhts", q, k) / math.sqrt(hs)
    scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    y = torch.einsum("bhts,bshd->bthd", scores.softmax(-1), v).reshape(B, T, D)
    return y @ attn.proj.weight.double().T


@pytest.mark.parametrize("kv,position", [(2, "learned"), (1, "learned"), (4, "rope"), (2, "rope")],
                         ids=["gqa2", "mqa", "mha-rope", "gqa2-rope"])
def test_attention_matches_a_written_out_reference(kv, position):
    cfg = mm.GPTConfig.tiny(n_kv_head=kv, position=position,
                            **({"rope_theta": 500000.0} if position == "rope" else {}))
    torch.manual_seed(0)
    attn = CausalSelfAttention(cfg)
    x = torch.randn(2, 16, 64, requires_grad=True)
    got = attn(x)
    want = _reference_attention(attn, x, cfg.rope_theta if position == "rope" else None)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6)
    # and the gradients reaching qkv's rows (q, k and v of each head group)
    g = torch.randn_like(got)
    (grad_got,) = torch.autograd.grad(got, attn.qkv.weight, g)
    (grad_want,) = torch.autograd.grad(want, attn.qkv.weight, g.double())
    err = ((grad_got.double() - grad_want).norm() / grad_want.norm()).item()          # fp32 against fp64
    assert err < 1e-5, f"qkv gradient {err:.1e} off the reference"


def test_rope_is_the_complex_rotation_and_sees_relative_positions():
    torch.manual_seed(0)
    x = torch.randn(2, 3, 10, 16)                                                   # (B, nh, T, hs)
    pos = torch.arange(5, 15)
    cos, sin = rope_angles(pos, 16, 500000.0)
    got = apply_rope(x, cos, sin)
    want = _complex_rope(x.transpose(1, 2), pos, 500000.0).transpose(1, 2)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6)
    # q·k after rotation depends on the positions' difference only: shift both by 7, same scores.
    q, k = torch.randn(1, 1, 10, 16), torch.randn(1, 1, 10, 16)
    c0, s0 = rope_angles(torch.arange(10), 16, 10000.0)
    c7, s7 = rope_angles(torch.arange(7, 17), 16, 10000.0)
    torch.testing.assert_close(apply_rope(q, c0, s0) @ apply_rope(k, c0, s0).mT,
                               apply_rope(q, c7, s7) @ apply_rope(k, c7, s7).mT, rtol=1e-4, atol=1e-5)


def test_swiglu_is_silu_gate_times_up_then_down():
    torch.manual_seed(0)
    mlp = mm.GPT(mm.GPTConfig.tiny_llama(n_layer=1)).blocks[0].mlp
    x = torch.randn(2, 5, 64)
    gate, up, down = (m.weight.detach() for m in (mlp.gate, mlp.fc, mlp.proj))
    a = x @ gate.T
    torch.testing.assert_close(mlp(x), ((a / (1 + torch.exp(-a))) * (x @ up.T)) @ down.T)


def _shape(cfg: mm.GPTConfig) -> SimpleNamespace:
    """`analysis.shapes`' view of a GPTConfig (its field names: hidden, kv_heads, ffn, ...)."""
    return SimpleNamespace(hidden=cfg.n_embd, heads=cfg.n_head, kv_heads=cfg.kv_heads, ffn=cfg.mlp_hidden,
                           mlp=cfg.mlp, bias=cfg.bias, layers=cfg.n_layer, vocab=cfg.vocab_size, tied=False,
                           seq_len=cfg.block_size, position_embedding=cfg.position == "learned", experts=0)


@pytest.mark.parametrize("cfg", [mm.GPTConfig.tiny(), mm.GPTConfig.tiny_llama(),
                                 mm.GPTConfig(vocab_size=1000, block_size=128, n_layer=3, n_head=8, n_embd=128,
                                              n_kv_head=2, mlp="swiglu", ffn_hidden=352, position="rope")],
                         ids=["gpt", "tiny-llama", "llama-shaped"])
def test_analytic_parameter_count_is_the_models(cfg):
    with torch.device("meta"):
        model = mm.GPT(cfg)
    assert shapes.model_params(_shape(cfg)) == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("kwargs,message", [
    (dict(n_kv_head=3), "n_kv_head=3 does not divide n_head=4"),
    (dict(n_kv_head=0), "n_kv_head must be a positive integer or None"),
    (dict(mlp="relu"), "GPTConfig.mlp='relu'; choose one of"),
    (dict(position="alibi"), "GPTConfig.position='alibi'; choose one of"),
    (dict(rope_theta=500000.0), "rope_theta=500000.0 has an effect only with position='rope'"),
    (dict(ffn_hidden=100, mlp_ratio=2), "ffn_hidden=100 and mlp_ratio=2 both set the MLP width"),
    (dict(n_embd=60, n_head=4, position="rope"), "head size n_embd/n_head = 15 is odd"),
])
def test_bad_llama_options_are_refused_by_name(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        mm.GPTConfig.tiny(**kwargs)


def test_tp_that_splits_a_kv_head_is_refused_by_name():
    with pytest.raises(ValueError, match=r"tp=4 does not divide n_kv_head=2 \(2 % 4 = 2\)"):
        check_divisible(MODEL, 4)
    with pytest.raises(ValueError, match="tp=4 does not divide n_kv_head=2"):
        validate(MODEL, mm.TrainConfig(tp=4, batch_size=8), mm.ParallelDims(tp=4))
    with pytest.raises(ValueError, match="tp=2 does not divide MLP width=175"):
        check_divisible(mm.GPTConfig.tiny_llama(ffn_hidden=175), 2)


def test_mixture_of_experts_with_swiglu_is_refused_by_name():
    from minimega.parallel.moe.layer import MoEGPT
    with pytest.raises(ValueError, match="GPTConfig.mlp='swiglu' is not built for them"):
        MoEGPT(MODEL)


def test_checkpoint_manifest_without_the_new_fields_is_the_plain_model(tmp_path):
    from dataclasses import asdict

    from minimega.checkpoint.manifest import ADDED_FIELDS, check_compatible
    old = {k: v for k, v in asdict(mm.GPTConfig.tiny()).items() if k not in ADDED_FIELDS}
    check_compatible({"model_config": old}, mm.GPTConfig.tiny(), tmp_path)          # accepted: the same model
    from minimega.checkpoint import CheckpointError
    with pytest.raises(CheckpointError, match="mlp='gelu' there vs 'swiglu' here"):
        check_compatible({"model_config": old}, mm.GPTConfig.tiny(mlp="swiglu"), tmp_path)


# --------------------------------------------------------------------------------------------------------------
# Parallel layouts on 2 and 4 ranks, against the single-process model

CASES = {   # name -> (ParallelDims kwargs, TrainConfig overrides); world size = the product of the dims
    "tp2": ({"tp": 2}, {"tp": 2}),
    "tp2-sp": ({"tp": 2}, {"tp": 2, "sequence_parallel": True}),
    "dp2-zero3": ({"dp": 2}, {"zero_stage": 3}),
    "pp2": ({"pp": 2}, {"pp": 2, "micro_batches": 2}),
    "cp2-ring": ({"cp": 2}, {"cp": 2}),
    "cp2-ulysses": ({"cp": 2}, {"cp": 2, "cp_attention": "ulysses"}),
    "tp2-selective": ({"tp": 2}, {"tp": 2, "activation_checkpointing": "selective"}),
    # 4 ranks: one kv head per tp rank, repeated for its 2 query heads before the ring or the all-to-alls
    "tp2-cp2-ring": ({"tp": 2, "cp": 2}, {"tp": 2, "cp": 2}),
    "tp2-cp2-ulysses": ({"tp": 2, "cp": 2}, {"tp": 2, "cp": 2, "cp_attention": "ulysses"}),
    "dp2-tp2-zero2-sp": ({"dp": 2, "tp": 2}, {"tp": 2, "zero_stage": 2, "sequence_parallel": True}),
}
SAVED = "tp2"            # its checkpoint is loaded by a dp2 ZeRO-1 engine: kv rows and gate land where they belong


def _cases(names: list[str], directory: str) -> dict:
    out = {}
    for name in names:
        try:
            dims, config = CASES[name][0], parity_config(**CASES[name][1])
            mesh = mm.init_mesh(mm.ParallelDims(**dims))
            torch.manual_seed(config.seed)
            engine = mm.initialize(mm.GPT(MODEL), config, mesh)
            grads: list[dict] = []
            keep = grads.append
            engine.before_step.append(lambda e, keep=keep: keep(e.full_grad_dict()) if e.step < GRAD_STEPS else None)
            for batch in data.batches(mesh, STEPS, config.batch_size, SEQ, seed=config.seed):
                engine.train_step(batch)
            out[name] = {"grads": grads, "state": engine.full_state_dict(), "losses": engine.losses}
            if name == SAVED:
                engine.save(directory)
                config = parity_config(zero_stage=1)
                other = mm.initialize(mm.GPT(MODEL), config, mm.init_mesh(mm.ParallelDims(dp=2)))
                other.load(directory)
                out[name]["loaded"] = other.full_state_dict()
        except Exception:                     # every rank reports; the parent names the case
            out[name] = {"error": traceback.format_exc()}
    return out


@pytest.fixture(scope="module")
def runs(request, tmp_path_factory) -> dict:
    wanted = {item.callspec.params.get("name") for item in request.session.items
              if item.module is request.module and hasattr(item, "callspec")}
    out = {}
    for world in (2, 4):                                   # one launch per world size
        names = [n for n in CASES if n in wanted and math.prod(CASES[n][0].values()) == world]
        if names:
            per_rank = mm.launch(_cases, world, names, str(tmp_path_factory.mktemp("llama_ckpt")), timeout=600)
            out.update({name: [r[name] for r in per_rank] for name in names})
    return out


@pytest.mark.parametrize("name", list(CASES))
def test_layout_matches_single_process(runs, name):
    got = assert_layout_matches(name, runs[name], MODEL, parity_config(**CASES[name][1]), STEPS, SEQ, GRAD_STEPS)
    if name == SAVED:
        assert max_rel_error(got["loaded"], got["state"]) == 0.0, "tp2 checkpoint loaded under dp2 differs"
