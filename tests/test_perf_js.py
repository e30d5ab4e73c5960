"""The step-time calculator and planner in JavaScript (course/assets/javascripts/perf.js) against minimega.analysis.perf."""
import json
import random
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from minimega import estimate as est
from minimega.analysis import perf, plan as perf_plan

NODE = shutil.which("node")
PERF_JS = Path(__file__).resolve().parents[1] / "course" / "assets" / "javascripts" / "perf.js"
RUNNER = """
const p = require(process.argv[1]);
const jobs = JSON.parse(require('fs').readFileSync(0, 'utf8'));
const out = jobs.map(j => { try {
  if (j.kind === 'step') { const r = p.stepTime(j.cfg, j.hw); delete r.memory; return r; }
  return p.plan(j.model, j.n, j.B, j.hw, j.opts);
} catch (e) { return {error: e.message}; } });
process.stdout.write(JSON.stringify(out));
"""
pytestmark = pytest.mark.skipif(NODE is None, reason="needs node")
KEYS = ("compute", "forward", "backward", "recompute", "tp_comm", "ep_comm", "cp_comm", "p2p", "bubble", "stack_overhead", "dp_comm",
        "offload", "optimizer", "disk", "total", "tokens_per_s", "tflops_per_gpu", "model_tflops_per_gpu", "mfu", "hfu", "micro_batches", "n_gpus", "fits")


def _run(jobs):
    proc = subprocess.run([NODE, "-e", RUNNER, str(PERF_JS)], input=json.dumps(jobs), capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _random_config(rng):
    heads = rng.choice([4, 8, 12, 16, 32, 64, 96, 112, 128])
    tp = rng.choice([t for t in (1, 2, 4, 8, 16) if heads % t == 0])
    pp = rng.choice([1, 1, 2, 4, 8, 12, 35])
    stage = rng.randrange(4) if pp == 1 else rng.randrange(2)
    dp, b = rng.choice([1, 2, 8, 64, 384]), rng.choice([1, 2, 4])
    m = rng.choice([1, 2, 8, 32, 128]) * (pp if rng.random() < 0.5 else 1)
    schedule, v = "1f1b", 1
    layers = rng.randint(1, 64) * pp
    if pp > 1 and m % pp == 0 and rng.random() < 0.4:
        schedule, v = "interleaved", 2
        layers = 2 * layers
    elif pp > 1 and rng.random() < 0.3:
        schedule = "zb_h1"
    precision = rng.choice([p for p in est.PRECISIONS if p != "fp8"])     # fp8: `_with_fp8_and_nvme` below
    attention = rng.choice(est.ATTENTION)
    cp = rng.choice([1, 1, 2, 4, 8]) if attention == "fused" else 1       # ring attention is a fused kernel
    cfg = dict(cp=cp, layers=layers, hidden=heads * rng.choice([64, 128]), heads=heads, vocab=rng.randint(1000, 260000),
                seq_len=rng.choice([512, 2048, 8192]), micro_batch=b, precision=precision, zero_stage=stage, tp=tp,
                dp=dp, pp=pp, sp=rng.random() < 0.5, recompute=rng.choice(est.RECOMPUTE), schedule=schedule,
                virtual_stages=v, attention=attention, position_embedding=rng.random() < 0.5,
                fp32_grads=rng.random() < 0.5 and precision in ("mixed", "fp16"), pp_partition=rng.choice(est.PP_PARTITION),
                global_batch=dp * b * m, dropout=rng.random() < 0.5, stack=rng.choice(sorted(perf.STACKS)),
                bucket_bytes=rng.choice([25e6, 5e8]),
                offload=rng.choice(["none"] + (["optimizer"] if stage else []) + (["optimizer+params"] if stage == 3 else [])),
                overlap_comm=rng.random() < 0.7)
    if cp > 1 and heads % (tp * cp) == 0 and rng.random() < 0.5:
        cfg["cp_attention"] = "ulysses"                                       # all-to-all over heads
    return {**cfg, **(_random_experts(rng, dp, tp) if cfg["cp"] == 1 else {})}   # experts under cp: a test below


def _random_experts(rng, dp, tp):
    """A mixture of experts in about a third of the configurations (sp off then: refused with experts); those drawn
    with capacity factor 2 route dropless (which has no capacity), the others by capacity."""
    experts = rng.choice([0, 0, 1, 4, 8, 64])
    if not experts:
        return {}
    cf = rng.choice([0.5, 1.0, 1.25, 2.0])
    return dict(experts=experts, top_k=rng.randint(1, min(experts, 4)), sp=False, capacity_factor=cf,
                moe_dispatch="dropless" if cf == 2.0 else "capacity",
                ep=rng.choice([e for e in (1, 2, 4, 8) if experts % e == 0 and dp % e == 0]),
                expert_ffn=rng.choice([0, 0, 256, 1024]), shared_experts=rng.choice([0, 0, 1, 2]))   # DeepSeekMoE


def _assert_step_times_equal(cfgs, hws):
    """The JS step time equals Python's on each (config, hardware) pair, every key to 1e-9."""
    got = _run([{"kind": "step", "cfg": c, "hw": h} for c, h in zip(cfgs, hws)])
    for cfg, hw, js in zip(cfgs, hws, got):
        py = perf.step_time(perf.PerfConfig(**cfg), hw)
        assert "error" not in js, (cfg, js)
        for k in KEYS:
            assert js[k] == pytest.approx(py[k], rel=1e-9, abs=1e-12), (k, cfg, hw)


def test_step_time_js_matches_python_on_random_configs():
    rng = random.Random(1713)
    cfgs = [_random_config(rng) for _ in range(240)]
    hws = [rng.choice(sorted(perf.HARDWARE)) for _ in cfgs]
    _assert_step_times_equal(cfgs, hws)


def test_step_time_js_matches_python_with_dropless_experts_under_cp():
    """Experts routed dropless over a cp ring (s/cp tokens each, expert states over edp × cp), each key to 1e-9."""
    rng = random.Random(3301)
    cfgs = []
    while len(cfgs) < 60:
        cfg = _random_config(rng)
        if cfg["cp"] == 1:
            continue
        experts = rng.choice([4, 8, 64])
        ep = rng.choice([e for e in (1, 2, 4, 8) if experts % e == 0 and cfg["dp"] % e == 0])
        cfgs.append({**cfg, "experts": experts, "top_k": rng.randint(1, 4), "ep": ep, "sp": False,
                     "moe_dispatch": "dropless", "expert_ffn": rng.choice([0, 256]), "shared_experts": rng.choice([0, 1])})
    assert sum(c["ep"] > 1 for c in cfgs) > 10
    _assert_step_times_equal(cfgs, [rng.choice(sorted(perf.HARDWARE)) for _ in cfgs])


def test_step_time_js_rejects_what_python_rejects():
    base = dict(layers=24, hidden=1024, heads=16, vocab=50000, seq_len=1024, global_batch=64, dp=2)
    bad = [{**base, "zero_stage": 3, "pp": 2}, {**base, "global_batch": 63}, {**base, "schedule": "interleaved"},
           {**base, "virtual_stages": 2}, {**base, "stack": "jax"}, {**base, "offload": "optimizer+params"}, {**base, "tp": 3},
           {**base, "cp": 2}, {**base, "cp": 3, "attention": "fused"},
           {**base, "cp": 4, "tp": 8, "attention": "fused", "cp_attention": "ulysses"},
           {**base, "cp": 2, "attention": "fused", "cp_attention": "tree"},
           {**base, "precision": "fp8", "experts": 4, "dp": 4, "global_batch": 64},
           {**base, "offload_device": "nvme"}, {**base, "zero_stage": 1, "offload": "optimizer", "offload_device": "tape"}]
    for cfg, js in zip(bad, _run([{"kind": "step", "cfg": c, "hw": "h100"} for c in bad])):
        with pytest.raises(ValueError):
            perf.step_time(perf.PerfConfig(**cfg), "h100")
        assert "error" in js, cfg
    for hw in ("a100-40gb", "a100-80gb"):                 # no fp8 tensor cores: refused by name in both
        with pytest.raises(ValueError, match="no fp8 tensor cores"):
            perf.step_time(perf.PerfConfig(**base, precision="fp8"), hw)
        js = _run([{"kind": "step", "cfg": {**base, "precision": "fp8"}, "hw": hw}])[0]
        assert "no fp8 tensor cores" in js["error"], js


def test_planner_js_ranks_like_python():
    rng = random.Random(7)
    jobs = [("bloom-176b", 384, 2048, "a100-80gb", dict(recompute=("full",), schedules=("1f1b",), zero_stages=(0, 1),
                                                         sp=(False,))),
            ("mt-nlg-530b", 2240, 1920, "a100-80gb", {})]
    for _ in range(4):
        heads = rng.choice([16, 32, 64])
        model = dict(layers=rng.choice([24, 32, 48]), hidden=heads * 128, heads=heads, vocab=50257, seq_len=2048)
        jobs.append((model, rng.choice([16, 64, 128]), rng.choice([256, 512]), rng.choice(sorted(perf.HARDWARE)), {}))
    moe = dict(layers=24, hidden=2048, heads=16, vocab=50257, seq_len=2048, experts=8, top_k=2, capacity_factor=1.25)
    jobs.append((moe, 64, 256, "h100", dict(recompute=("none", "full"), micro_batches=(1, 2))))
    fine = dict(moe, experts=64, top_k=8, expert_ffn=1024, shared_experts=1, moe_dispatch="dropless",
                attention="fused", seq_len=32768, precision="bf16")   # DeepSeekMoE's shape, long, cp searched
    jobs.append((fine, 64, 64, "h100", dict(cps=(1, 2, 4), recompute=("none", "full"))))
    long = dict(layers=32, hidden=4096, heads=32, vocab=32000, seq_len=131072, precision="bf16", attention="fused",
                position_embedding=False)
    jobs.append((long, 64, 16, "h100", dict(cps=(1, 2, 4, 8, 16))))
    jobs.append((dict(long, heads=24, hidden=3072), 32, 32, "a100-80gb", dict(cps=(1, 4, 8), cp_attentions=("ulysses",),
                                                                             recompute=("none", "selective"))))
    shapes = [perf_plan.preset_shape(m) if isinstance(m, str) else m for m, *_ in jobs]
    got = _run([{"kind": "plan", "model": s, "n": n, "B": B, "hw": hw, "opts": {k: list(v) for k, v in o.items()}}
                for s, (_, n, B, hw, o) in zip(shapes, jobs)])
    for s, (_, n, B, hw, o), js in zip(shapes, jobs, got):
        py = perf_plan.plan(s, n, B, hw, **o)
        assert "error" not in js, js
        assert (js["searched"], js["fit"]) == (py["searched"], py["fit"])
        assert js["ranked"] == py["ranked"]
        if s.get("moe_dispatch") == "dropless":              # experts over a cp ring are searched, and some fit
            assert any("-cp" in name for name in py["ranked"]), py["ranked"][:5]
        for a, b in zip(js["top"], py["top"]):
            assert a["total"] == pytest.approx(b["total"], rel=1e-9) and a["memory_gb"] == pytest.approx(b["memory_gb"], rel=1e-9)


def test_step_time_js_matches_python_with_the_states_on_nvme():
    """The disk tier (NVMe reads and writes behind the CPU Adam) on random layouts with offload, each key to 1e-9."""
    rng = random.Random(8008)
    cfgs, hws = [], []
    while len(cfgs) < 120:
        cfg = _random_config(rng)
        if cfg["offload"] != "none":
            cfgs.append({**cfg, "offload_device": "nvme"})
            hws.append(rng.choice(sorted(perf.HARDWARE)))
    _assert_step_times_equal(cfgs, hws)
    # the disk term is live in this sample, not 0 everywhere
    assert sum(perf.step_time(perf.PerfConfig(**c), h)["disk"] > 0 for c, h in zip(cfgs, hws)) > 10


FP8_HW = tuple(sorted(k for k, h in perf.HARDWARE.items() if h.fp8_flops))


def test_step_time_js_matches_python_with_fp8_and_nvme():
    """fp8 (the linears at the fp8 rate, ZeRO-3's one-byte gathers) and the disk tier (NVMe reads and writes
    behind the CPU Adam), on random layouts and every preset with fp8 tensor cores, each key to 1e-9."""
    rng = random.Random(2209)
    cfgs, hws = [], []
    while len(cfgs) < 200:
        cfg = _random_config(rng)
        if cfg["pp"] == 1 and rng.random() < 0.3:
            cfg["zero_stage"] = 3                          # the fp8 gathers
        if rng.random() < 0.7 and not cfg.get("experts") and not cfg["fp32_grads"]:
            cfg["precision"] = "fp8"
        if cfg["offload"] != "none" and rng.random() < 0.7:
            cfg["offload_device"] = "nvme"
        cfgs.append(cfg)
        hws.append(rng.choice(FP8_HW))
    assert sum(c["precision"] == "fp8" for c in cfgs) > 40 and sum(c.get("offload_device") == "nvme" for c in cfgs) > 30
    assert sum(c["precision"] == "fp8" and c["zero_stage"] == 3 and c["dp"] * c["cp"] > 1 for c in cfgs) > 5
    _assert_step_times_equal(cfgs, hws)
    # the disk term is live in this sample, not 0 everywhere
    assert sum(perf.step_time(perf.PerfConfig(**c), h)["disk"] > 0 for c, h in zip(cfgs, hws)) > 10


NEW_HW = ("b200", "gb200-nvl72", "mi300x")


def test_step_time_js_matches_python_on_the_post_hopper_presets():
    """Every new preset, with tp, ep and cp groups that stay in a node, fill a 72-GPU rack, or straddle racks."""
    rng = random.Random(2026)
    cfgs, hws = [], []
    for _ in range(120):
        cfg = _random_config(rng)
        heads = rng.choice([64, 96, 128])
        cfg.update(heads=heads, hidden=heads * 64, tp=rng.choice([t for t in (1, 2, 4, 8, 16, 24, 32, 64) if heads % t == 0]))
        if cfg.get("cp_attention") == "ulysses" and heads % (cfg["tp"] * cfg["cp"]):
            del cfg["cp_attention"]
        cfgs.append(cfg)
        hws.append(rng.choice(NEW_HW))
    _assert_step_times_equal(cfgs, hws)
    assert {c["tp"] for c in cfgs} >= {16, 24, 32, 64} and set(hws) == set(NEW_HW)


def test_planner_js_ranks_like_python_on_the_post_hopper_presets():
    model = dict(layers=16, hidden=8192, heads=64, vocab=32000, seq_len=2048)
    jobs = [(model, 144, 288, "gb200-nvl72", {}), (model, 64, 128, "gb200-nvl72", {"tps": (16, 32, 64)}),
            (model, 64, 128, "mi300x", {}), (model, 64, 128, "b200", {"zero_stages": (0, 1)}),
            (model, 64, 128, "h100", {"tps": (8, 16)})]
    got = _run([{"kind": "plan", "model": m, "n": n, "B": B, "hw": hw, "opts": {k: list(v) for k, v in o.items()}}
                for m, n, B, hw, o in jobs])
    for (m, n, B, hw, o), js in zip(jobs, got):
        if hw == "h100":                       # tp 16 leaves the node: both refuse it by name
            with pytest.raises(ValueError, match="NVLink domain"):
                perf_plan.plan(m, n, B, hw, **o)
            assert "NVLink domain, 8 GPUs" in js["error"]
            continue
        py = perf_plan.plan(m, n, B, hw, **o)
        assert "error" not in js, js
        assert (js["searched"], js["fit"]) == (py["searched"], py["fit"]) and js["fit"] > 0
        assert js["ranked"] == py["ranked"]
        for a, b in zip(js["top"], py["top"]):
            assert a["total"] == pytest.approx(b["total"], rel=1e-9) and a["memory_gb"] == pytest.approx(b["memory_gb"], rel=1e-9)


def test_js_and_the_calculator_pages_carry_every_python_preset():
    proc = subprocess.run([NODE, "-e", "const p = require(process.argv[1]); const out = {};"
                           "for (const k in p.HARDWARE) out[k] = p.HARDWARE[k]; process.stdout.write(JSON.stringify(out));",
                           str(PERF_JS)], capture_output=True, text=True, timeout=60)
    js = json.loads(proc.stdout)
    assert sorted(js) == sorted(perf.HARDWARE)
    for name, hw in perf.HARDWARE.items():
        h = js[name]
        assert (h["name"], h["peak_flops"], h["hbm_bandwidth"], h["memory_bytes"], h["gpus_per_node"],
                h["nics_per_node"], h["mesh"]) == (hw.name, hw.peak_flops, hw.hbm_bandwidth, hw.memory_bytes,
                                                   hw.gpus_per_node, hw.nics_per_node, hw.mesh), name
        assert (h["nvlink_domain"] or h["gpus_per_node"]) == hw.domain
        assert (h["fp8_flops"], h["disk_read_bandwidth"], h["disk_write_bandwidth"]) == (
            hw.fp8_flops, hw.disk_read_bandwidth, hw.disk_write_bandwidth), name
        for tier in ("intra", "inter", "host"):
            assert (h[tier]["bandwidth"], h[tier]["alpha"]) == (getattr(hw, tier).bandwidth, getattr(hw, tier).alpha)
    for page in ("calculator.md", "calculator.nl.md"):
        text = (PERF_JS.parents[2] / page).read_text(encoding="utf-8")
        select = re.search(r'<select name="gpu">(.*?)</select>', text).group(1)
        assert sorted(re.findall(r'value="([^"]+)"', select)) == sorted(perf.HARDWARE), page
