"""Block shapes after GPT-2 (analysis/shapes.py): GQA, SwiGLU, untied heads, bias-free blocks, the Llama presets.

The references are independent of the formulas: a GQA + SwiGLU model written here in plain PyTorch (its numel
and the bytes autograd saves), the published parameter counts, Korthikanti's closed forms for GPT's shape,
and the JavaScript ports run under Node.
"""
import json
import random
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from minimega import estimate as est
from minimega.train.activation_checkpoint import saved_activation_bytes
from minimega.analysis import perf
from minimega.tools.cli import main as cli_main

PUBLISHED = {"llama2-7b": 6.74e9, "llama2-70b": 68.98e9, "llama3-8b": 8.03e9, "llama3-70b": 70.6e9,
             "llama3-405b": 405e9}
"""Llama 2 paper (arXiv:2307.09288) and model cards: 6.74B, 68.98B; Llama 3 (arXiv:2407.21783, model cards):
8.03B, 70.6B, 405B."""


# ---------------------------------------------------------------------------------------------
# A Llama-style block and model in plain PyTorch

class Block(nn.Module):
    def __init__(self, h, a, kv, f, swiglu=True):
        super().__init__()
        self.a, self.kv, self.d = a, kv, h // a
        self.ln1, self.ln2 = nn.LayerNorm(h, bias=False), nn.LayerNorm(h, bias=False)   # h weights, as RMSNorm
        self.qkv = nn.Linear(h, h + 2 * kv * self.d, bias=False)
        self.proj = nn.Linear(h, h, bias=False)
        self.swiglu = swiglu
        self.gate, self.down = nn.Linear(h, f, bias=False), nn.Linear(f, h, bias=False)
        self.up = nn.Linear(h, f, bias=False) if swiglu else None

    def forward(self, x):
        B, T, h = x.shape
        q, k, v = self.qkv(self.ln1(x)).split([h, self.kv * self.d, self.kv * self.d], dim=-1)
        q = q.view(B, T, self.a, self.d).transpose(1, 2)
        k, v = (t.view(B, T, self.kv, self.d).transpose(1, 2) for t in (k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.kv != self.a)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, h))
        z = self.ln2(x)
        return x + self.down(F.silu(self.gate(z)) * self.up(z) if self.swiglu else F.gelu(self.gate(z)))


class Llama(nn.Module):
    def __init__(self, L, h, a, kv, f, V):
        super().__init__()
        self.emb, self.head = nn.Embedding(V, h), nn.Linear(h, V, bias=False)
        self.blocks = nn.ModuleList(Block(h, a, kv, f) for _ in range(L))
        self.norm = nn.LayerNorm(h, bias=False)


TINY = dict(layers=3, hidden=64, heads=8, kv_heads=2, ffn=96, vocab=101, seq_len=16, mlp="swiglu",
            position_embedding=False, tied=False, bias=False)


def test_parameter_count_equals_a_torch_gqa_swiglu_model():
    cfg = est.MemoryConfig(**TINY)
    ref = Llama(3, 64, 8, 2, 96, 101)
    assert est.model_params(cfg) == sum(p.numel() for p in ref.parameters())
    block = ref.blocks[0]
    assert est.block_matmul_params(cfg) == sum(m.weight.numel() for m in (block.qkv, block.proj, block.gate,
                                                                          block.up, block.down))
    assert est.memory_per_gpu(cfg)["stage_params"] == est.model_params(cfg)           # one GPU holds it all
    # tensor parallelism splits the matrices (2 ranks hold half each) and keeps the two norms whole
    tp2 = est.memory_per_gpu(est.MemoryConfig(**TINY, tp=2))["stage_params"]
    assert tp2 == 3 * (est.block_matmul_params(cfg) / 2 + 2 * 64) + 2 * 101 * 64 / 2 + 64


@pytest.mark.parametrize("kv,f,swiglu", [(2, 96, True), (8, 96, True), (1, 40, True), (4, 256, False)])
def test_activation_bytes_equal_what_autograd_saves(kv, f, swiglu):
    s, b, h, a = 32, 2, 64, 8
    torch.manual_seed(0)
    block = Block(h, a, kv, f, swiglu)
    x = torch.randn(b, s, h, requires_grad=True)
    measured = saved_activation_bytes(block, x)
    want = est.gpt_activation_bytes_per_layer(s, b, h, a, act_bytes=4, attention="flash", kv_heads=kv, ffn=f,
                                              mlp="swiglu" if swiglu else "gelu")
    assert measured == want
    # and Korthikanti's table differs from it only by what the paper's accounting adds or leaves out
    paper = est.activation_bytes_per_layer(s, b, h, a, attention="fused", act_bytes=4, mask_bytes=0, kv_heads=kv,
                                           ffn=f, mlp="swiglu" if swiglu else "gelu")
    assert paper == want - 16 * s * b


def test_gqa_and_swiglu_change_only_their_terms():
    s, b, h, a, t = 2048, 1, 8192, 64, 8
    mha = est.activation_bytes_per_layer(s, b, h, a, tp=t, attention="fused")
    gqa = est.activation_bytes_per_layer(s, b, h, a, tp=t, attention="fused", kv_heads=8)
    assert mha - gqa == 2 * s * b * (h - 8 * h // a) * 2 / t               # K and V, 2 bytes, split over tp
    glu = est.activation_bytes_per_layer(s, b, h, a, tp=t, attention="fused", ffn=28672, mlp="swiglu")
    assert glu - mha == s * b * (4 * 28672 - 8 * h) * 2 / t
    for rec in est.RECOMPUTE:                                                # full keeps the block input only
        kw = dict(tp=t, sp=True, recompute=rec, attention="fused", kv_heads=8, ffn=28672, mlp="swiglu")
        got = est.activation_bytes_per_layer(s, b, h, a, **kw)
        if rec == "full":
            assert got == 2 * s * b * h / t
        work = est.recompute_working_bytes(s, b, h, a, **kw)
        none = est.activation_bytes_per_layer(s, b, h, a, **{**kw, "recompute": "none"})
        assert work == {"none": 0, "selective": none - got, "full": none}[rec]


# ---------------------------------------------------------------------------------------------
# Presets, FLOPs, the time model

@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_llama_presets_land_on_the_published_parameter_counts(name):
    n = est.model_params(est.MemoryConfig(**est.PRESETS[name]))
    assert abs(n / PUBLISHED[name] - 1) < 0.01, (name, n)


def test_shape_flops_reduce_to_korthikanti_for_gpt_and_to_6n_plus_attention_otherwise():
    gpt = perf.PerfConfig(layers=24, hidden=2048, heads=16, vocab=50257, seq_len=2048, global_batch=8)
    model, selective, full = est.shape_flops(gpt, 8)
    assert model == pytest.approx(est.megatron_model_flops(8, 2048, 24, 2048, 50257), rel=1e-12)
    assert full == pytest.approx(est.megatron_hardware_flops(8, 2048, 24, 2048, 50257), rel=1e-12)
    llama = est.MemoryConfig(**est.PRESETS["llama3-8b"])
    matmul = llama.layers * est.block_matmul_params(llama) + llama.vocab * llama.hidden    # the embedding looks up
    per_token = est.flops_per_token(matmul, llama.layers, llama.heads, llama.hidden // llama.heads, llama.seq_len)
    assert est.shape_flops(llama, 1)[0] / llama.seq_len == pytest.approx(per_token, rel=1e-12)


def test_layer_ops_gemms_are_two_flops_per_weight_and_token():
    for name in ("llama2-7b", "llama3-70b", "gpt2-124m"):
        cfg = perf.preset_config(name, tp=4 if name != "gpt2-124m" else 1, micro_batch=2, global_batch=2)
        N = cfg.seq_len * cfg.micro_batch
        gemms = sum(f for op, f, _ in perf.layer_ops(cfg) if op in ("qkv", "proj", "fc1", "gate", "up", "fc2"))
        assert gemms == pytest.approx(2 * N * est.block_matmul_params(cfg) / cfg.tp, rel=1e-12)


def test_gqa_shrinks_the_ring_attention_hop_and_the_zero3_gathers():
    base = dict(layers=32, hidden=4096, heads=32, vocab=32000, seq_len=32768, attention="fused", cp=4,
                precision="bf16", global_batch=8, dp=2, zero_stage=3, overlap_comm=False)
    mha, gqa = (perf.step_time(perf.PerfConfig(**base, kv_heads=kv), "h100") for kv in (0, 8))
    assert gqa["cp_comm"] < mha["cp_comm"] and gqa["dp_comm"] < mha["dp_comm"]
    assert gqa["memory"]["params"] < mha["memory"]["params"]


@pytest.mark.parametrize("bad", [dict(kv_heads=3), dict(kv_heads=2, tp=4), dict(mlp="relu"), dict(ffn=-1),
                                 dict(tied=1), dict(bias="no"), dict(experts=4, mlp="swiglu"),
                                 dict(cp=4, attention="fused", cp_attention="ulysses", kv_heads=2)])
def test_shapes_refused_by_name(bad):
    cfg = dict(layers=2, hidden=64, heads=8, vocab=100, seq_len=64, **bad)
    with pytest.raises(ValueError, match=next(iter(bad)) if "experts" not in bad else "experts"):
        est.memory_per_gpu(est.MemoryConfig(**cfg))


def test_estimate_cli_takes_a_llama_preset(capsys):
    assert cli_main(["estimate", "--model", "llama3-405b", "--dp", "512", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["params"] == 405_853_388_800 and rep["model"] == "llama3-405b" and rep["dp"] == 512
    assert cli_main(["estimate", "--model", "llama3-8b", "--params", "8B"]) != 0
    assert "not allowed with argument --model" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# The JavaScript ports

NODE = shutil.which("node")
JS = Path(__file__).resolve().parents[1] / "course" / "assets" / "javascripts"
RUNNER = """
const calc = require(process.argv[1]), p = require(process.argv[2]);
const jobs = JSON.parse(require('fs').readFileSync(0, 'utf8'));
process.stdout.write(JSON.stringify(jobs.map(j => { try {
  if (j.kind === 'memory') return calc.memoryPerGpu(j.cfg);
  if (j.kind === 'plan') return p.plan(j.model, j.n, j.B, j.hw, {});
  const r = p.stepTime(j.cfg, j.hw); delete r.memory; return r;
} catch (e) { return {error: e.message}; } })));
"""


def _run(jobs):
    proc = subprocess.run([NODE, "-e", RUNNER, str(JS / "calculator.js"), str(JS / "perf.js")],
                          input=json.dumps(jobs), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _random_shape(rng):
    heads = rng.choice([8, 16, 32, 64, 128])
    kv = rng.choice([k for k in (0, 1, 2, 4, 8) if k == 0 or heads % k == 0])
    tp = rng.choice([t for t in (1, 2, 4, 8) if (kv or heads) % t == 0])
    return dict(layers=rng.randint(1, 40) * 2, hidden=heads * 128, heads=heads, kv_heads=kv, tp=tp,
                ffn=rng.choice([0, 11008, 14336, 28672]), mlp=rng.choice(["gelu", "swiglu"]),
                vocab=rng.choice([32000, 128256]), seq_len=rng.choice([2048, 8192]), tied=rng.random() < 0.5,
                bias=rng.random() < 0.5, position_embedding=rng.random() < 0.3, precision=rng.choice(["bf16", "mixed"]),
                recompute=rng.choice(est.RECOMPUTE), attention=rng.choice(est.ATTENTION), sp=rng.random() < 0.5,
                dp=rng.choice([1, 2, 8]), pp=rng.choice([1, 1, 2, 4]), micro_batch=rng.choice([1, 2]))


@pytest.mark.skipif(NODE is None, reason="needs node")
def test_js_equals_python_on_llama_presets_and_random_shapes():
    rng = random.Random(405)
    jobs, cfgs = [], []
    for name in est.LLAMA_PRESETS:
        cfgs.append(dict(est.PRESETS[name]))
        for layout in (dict(tp=8, pp=4, dp=4, zero_stage=1, recompute="full", sp=True, micro_batch=1),
                       dict(tp=8, dp=16, zero_stage=3, recompute="selective"),
                       dict(tp=2, cp=4, dp=2, zero_stage=1, cp_attention="ulysses"),
                       dict(tp=4, cp=2, dp=2, zero_stage=1, recompute="selective", overlap_comm=False)):   # ring
            cfgs.append({**est.PRESETS[name], **layout})
    for _ in range(60):
        c = _random_shape(rng)
        if c["pp"] > 1:
            c["zero_stage"] = rng.choice([0, 1])
        else:
            c["zero_stage"] = rng.randrange(4)
        cfgs.append(c)
    for c in cfgs:
        m = c.get("micro_batches", 4)
        fields = est.MemoryConfig.__dataclass_fields__
        jobs.append({"kind": "memory", "cfg": {**{k: v for k, v in c.items() if k in fields}, "micro_batches": m}})
        step = {k: v for k, v in c.items() if k != "micro_batches"}
        jobs.append({"kind": "step", "cfg": {**step, "global_batch": step.get("dp", 1) * step.get("micro_batch", 1) * 8},
                     "hw": rng.choice(sorted(perf.HARDWARE))})
    got = _run(jobs)
    for job, js in zip(jobs, got):
        assert "error" not in js, (job, js)
        if job["kind"] == "memory":
            py = est.memory_per_gpu(est.MemoryConfig(**job["cfg"]))
        else:
            py = perf.step_time(perf.PerfConfig(**job["cfg"]), job["hw"])
        for k, v in py.items():
            if k != "memory":
                assert js[k] == pytest.approx(v, rel=1e-9, abs=1e-12), (k, job)


@pytest.mark.skipif(NODE is None, reason="needs node")
def test_js_planner_ranks_llama_like_python():
    from minimega.analysis import plan as perf_plan
    jobs = [("llama3-8b", 64, 512, "h100"), ("llama2-70b", 128, 256, "a100-80gb")]
    shapes = [perf_plan.preset_shape(n) for n, *_ in jobs]
    got = _run([{"kind": "plan", "model": s, "n": n, "B": B, "hw": hw} for s, (_, n, B, hw) in zip(shapes, jobs)])
    for s, (_, n, B, hw), js in zip(shapes, jobs, got):
        py = perf_plan.plan(s, n, B, hw)
        assert js["ranked"] == py["ranked"] and py["fit"] > 0


@pytest.mark.skipif(NODE is None, reason="needs node")
def test_js_refuses_the_shapes_python_refuses():
    base = dict(layers=2, hidden=64, heads=8, vocab=100, seq_len=64)
    bad = [{**base, "kv_heads": 3}, {**base, "kv_heads": 2, "tp": 4}, {**base, "mlp": "relu"}, {**base, "ffn": -1},
           {**base, "experts": 4, "mlp": "swiglu"}, {**base, "experts": 4, "kv_heads": 2},
           {**base, "cp": 4, "attention": "fused", "cp_attention": "ulysses", "kv_heads": 2}]
    for cfg, js in zip(bad, _run([{"kind": "memory", "cfg": c} for c in bad])):
        with pytest.raises(ValueError):
            est.memory_per_gpu(est.MemoryConfig(**cfg))
        assert "error" in js, cfg


def test_plan_cli_searches_a_llama_preset(capsys):
    assert cli_main(["plan", "--model", "llama3-8b", "--gpus", "8", "--global-batch", "16", "--recompute", "full",
                     "--zero-stages", "3", "--no-sp", "--top", "1", "--json"]) == 0
    best = json.loads(capsys.readouterr().out)["top"][0]
    assert {k: best["config"][k] for k in ("kv_heads", "ffn", "mlp", "tied", "bias", "dropout")} == dict(
        kv_heads=8, ffn=14336, mlp="swiglu", tied=False, bias=False, dropout=False)
    layout = {k: v for k, v in best["config"].items() if k != "micro_batches"}       # derived from the batch
    assert best["memory_gb"] * 1e9 == pytest.approx(est.memory_per_gpu(perf.PerfConfig(**layout).memory_config())["total"])
