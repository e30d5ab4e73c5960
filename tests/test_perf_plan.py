"""minimega.analysis.plan: the layout search, its constraints, and where the published layouts rank."""
import json

import pytest

from minimega import estimate as est
from minimega.analysis import perf
from minimega.analysis import plan as perf_plan
from minimega.analysis.hardware import HARDWARE
from minimega.tools.cli import main

# What Megatron-DeepSpeed offered BLOOM and MT-NLG (training-stacks.md feature table): full recomputation only,
# no interleaved schedule, ZeRO <= 1 with pipelines, no Megatron sequence parallelism.
DEEPSPEED_2022 = dict(recompute=("full",), schedules=("1f1b",), zero_stages=(0, 1), sp=(False,))


def _shape(name, **extra):
    keep = ("layers", "hidden", "heads", "vocab", "seq_len", "precision", "fp32_grads", "position_embedding",
            "pp_partition")
    return {**{k: v for k, v in est.PRESETS[name].items() if k in keep}, "stack": "megatron-deepspeed", **extra}


def test_mt_nlg_published_layout_ranks_in_the_top_5():
    res = perf_plan.plan(_shape("mt-nlg-530b"), 2240, 1920, "a100-80gb", **DEEPSPEED_2022)
    assert perf_plan.rank_of(res, "dp8-tp8-pp35 z1 full b1 1f1b") <= 5, res["ranked"][:10]


def test_bloom_published_layout():
    """BLOOM's grid (dp8-tp4-pp12, ZeRO-1) ranks first; with its micro-batch of 2 it ranks 7th: the model has no
    term that rewards larger GEMMs, so b = 2 only doubles the bubble, (p-1)/m = 11/128 against 11/256."""
    res = perf_plan.plan(_shape("bloom-176b", dropout=False), 384, 2048, "a100-80gb", **DEEPSPEED_2022)
    assert res["ranked"][0] == "dp8-tp4-pp12 z1 full b1 1f1b"
    assert perf_plan.rank_of(res, "dp8-tp4-pp12 z1 full b2 1f1b") <= 10


def test_plan_rows_fit_are_sorted_and_obey_the_rules():
    model = dict(layers=24, hidden=2048, heads=16, vocab=51200, seq_len=2048)
    res = perf_plan.plan(model, 64, 512, "a100-40gb", top=5000, memory_fraction=0.5, tokens=1e10,
                         price_per_gpu_hour=3.0)
    rows = res["top"]
    assert len(rows) == res["fit"] > 10 and res["searched"] > res["fit"]
    speeds = [r["tokens_per_s"] for r in rows]
    assert speeds == sorted(speeds, reverse=True)
    for r in rows:
        c = r["config"]
        assert r["memory_gb"] <= 20 + 1e-9
        assert c["dp"] * c["tp"] * c["pp"] == 64 and c["tp"] <= 8 and 16 % c["tp"] == 0
        assert not (c["zero_stage"] >= 2 and c["pp"] > 1)
        assert r["cost"] == pytest.approx(3.0 * r["gpu_hours"])
        again = perf.step_time(perf.PerfConfig(**{k: v for k, v in c.items() if k != "micro_batches"}), "a100-40gb")
        assert again["total"] == r["total"]
    assert {r["config"]["zero_stage"] for r in rows} == {0, 1, 2, 3}
    assert {r["config"]["recompute"] for r in rows} == {"none", "selective", "full"}


def test_plan_cli_json_and_errors(capsys):
    assert main(["plan", "--model", "gpt2-124m", "--gpus", "8", "--global-batch", "64", "--json", "--top", "3",
                 "--tokens", "1e9"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["top"]) == 3 and out["top"][0]["days"] > 0
    assert main(["plan", "--model", "mt-nlg-530b", "--nodes", "280", "--global-batch", "1920", "--recompute", "full",
                 "--schedules", "1f1b", "--zero-stages", "0", "1", "--no-sp", "--top", "5"]) == 0
    assert "dp8-tp8-pp35 z1 full b1 1f1b " in capsys.readouterr().out
    assert main(["plan", "--model", "gpt2-124m", "--gpus", "8", "--nodes", "1", "--global-batch", "64"]) == 2
    assert "exactly one of --nodes and --gpus" in capsys.readouterr().err
    assert main(["plan", "--gpus", "8", "--global-batch", "64"]) == 2
    assert "--layers" in capsys.readouterr().err
    assert main(["plan", "--model", "gpt2-124m", "--gpus", "8", "--global-batch", "64", "--custom", "peak_tflops=1"]) == 2
    assert "missing" in capsys.readouterr().err


# A 7B-class model (Llama-2 7B's shape: 32 layers, h = 4096, 32 heads, RoPE) at s = 131072 on 64 GPUs of 80 GB.
LONG = dict(layers=32, hidden=4096, heads=32, vocab=32000, seq_len=131072, precision="bf16", attention="fused",
            position_embedding=False)


def test_long_sequences_plan_context_parallelism_first():
    """At s = 131072 every layout without cp is slower than the best one with it, and the plan's #1 uses cp > 1."""
    without = perf_plan.plan(LONG, 64, 16, "h100", top=1)
    with_cp = perf_plan.plan(LONG, 64, 16, "h100", top=3000, cps=(1, 2, 4, 8, 16))
    best = with_cp["top"][0]
    assert best["config"]["cp"] > 1, best["layout"]
    assert (best["config"]["cp"], best["config"]["cp_attention"]) == (8, "ring"), best["layout"]   # chapter 15 says so
    assert not without["top"] or best["tokens_per_s"] > without["top"][0]["tokens_per_s"]
    assert with_cp["searched"] > without["searched"]
    # The search keeps the engine's rules: no cp with pp or sp; 2·cp chunks; Ulysses only where tp·cp divides heads.
    variants = set()
    for r in with_cp["top"]:
        c = r["config"]
        assert c["dp"] * c["cp"] * c["tp"] * c["pp"] == 64
        if c["cp"] > 1:
            assert c["pp"] == 1 and not c["sp"] and LONG["seq_len"] % (2 * c["cp"]) == 0
            assert c["cp_attention"] == "ring" or LONG["heads"] % (c["tp"] * c["cp"]) == 0
            variants.add(c["cp_attention"])
            assert r["layout"].split()[-1] == c["cp_attention"] and f"-cp{c['cp']}-" in r["layout"]
    assert variants == {"ring", "ulysses"}
    only = perf_plan.plan(LONG, 64, 16, "h100", top=3000, cps=(4,), cp_attentions=("ulysses",))
    assert only["fit"] and all(r["config"]["cp"] == 4 and r["config"]["cp_attention"] == "ulysses" for r in only["top"])
    unfused = perf_plan.plan({**LONG, "attention": "unfused"}, 64, 16, "h100", top=0, cps=(1, 2))
    assert unfused["searched"] == perf_plan.plan({**LONG, "attention": "unfused"}, 64, 16, "h100", top=0)["searched"]


def test_plan_cli_searches_cp(capsys):
    argv = ["plan", "--layers", "32", "--hidden", "4096", "--heads", "32", "--vocab", "32000", "--seq-len", "131072",
            "--attention", "fused", "--precision", "bf16", "--gpus", "64", "--gpu", "h100", "--global-batch", "16",
            "--top", "3"]
    assert main([*argv, "--cp", "1", "2", "4", "8", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["top"][0]["config"]["cp"] > 1 and "-cp" in out["top"][0]["layout"]
    assert main([*argv, "--cp", "8", "--cp-attention", "ulysses"]) == 0
    text = capsys.readouterr().out.split("\nlayout   ")[0]          # the table, not its legend
    assert "-cp8-" in text and " ulysses" in text and " ring" not in text
    assert main([*argv, "--cp-attention", "ulysses"]) == 2
    assert "--cp-attention has an effect only with --cp" in capsys.readouterr().err
    assert main([*argv, "--cp", "0"]) == 2


def test_plan_prints_model_tflops_that_mfu_divides_and_a_legend_for_its_codes(capsys):
    assert main(["plan", "--model", "bloom-176b", "--nodes", "48", "--global-batch", "2048", "--recompute", "full",
                 "--top", "3"]) == 0
    out = capsys.readouterr().out
    for needle in ("legend below", "zK: ZeRO stage", "bN: micro-batch size", "sp: sequence parallelism",
                   "MFU = model TF/s / peak", "logged TF/s", "seconds per step, by part"):
        assert needle in out, needle
    peak = HARDWARE["a100-80gb"].peak_flops
    rows = [line.split() for line in out.splitlines() if line[:2].strip().isdigit()]
    assert len(rows) == 3
    for row in rows:
        cols = row[row.index("sp") + 1:] if "sp" in row else row
        model_tf, mfu, logged = float(cols[2]), float(cols[3].rstrip("%")) / 100, float(cols[4])
        assert abs(model_tf * 1e12 / peak - mfu) < 0.002 and logged > model_tf     # full recomputation: 4/3 more


def test_tp_spans_the_nvlink_domain_not_the_node():
    """On 8-GPU nodes tp stops at 8; on GB200 NVL72 it may reach the 72-GPU rack (tp 16, 32, 64 here)."""
    model = dict(layers=8, hidden=8192, heads=64, vocab=32000, seq_len=2048)
    tps = {hw: {c.tp for c in perf_plan.layouts(model, 144, 144, HARDWARE[hw], zero_stages=(1,), recompute=("full",),
                                                 micro_batches=(1,), sp=(False,), schedules=("1f1b",))}
           for hw in ("h100", "gb200-nvl72", "mi300x")}
    assert tps["h100"] == tps["mi300x"] == {1, 2, 4, 8}
    assert tps["gb200-nvl72"] == {1, 2, 4, 8, 16}                 # 144's divisors that divide 64 heads, <= 72
    assert {c.tp for c in perf_plan.layouts(model, 64, 64, HARDWARE["gb200-nvl72"], zero_stages=(0,), sp=(False,),
                                            recompute=("full",), micro_batches=(1,))} == {1, 2, 4, 8, 16, 32, 64}


def test_asked_for_tp_beyond_the_domain_is_refused_by_name(capsys):
    model = dict(layers=8, hidden=8192, heads=64, vocab=32000, seq_len=2048)
    with pytest.raises(ValueError, match=r"tp \[16\]: tensor parallelism stays inside one NVLink domain, 8 GPUs"):
        perf_plan.plan(model, 64, 64, "h100", tps=(8, 16))
    res = perf_plan.plan(model, 64, 64, "gb200-nvl72", tps=(16, 32), top=1000)
    assert res["fit"] > 0 and {r["config"]["tp"] for r in res["top"]} == {16, 32}
    assert main(["plan", "--layers", "8", "--hidden", "8192", "--heads", "64", "--vocab", "32000", "--seq-len", "2048",
                 "--gpus", "64", "--global-batch", "64", "--gpu", "b200", "--tp", "16"]) == 2
    assert "tp [16]: tensor parallelism stays inside one NVLink domain, 8 GPUs on B200" in capsys.readouterr().err
    assert main(["plan", "--layers", "8", "--hidden", "8192", "--heads", "64", "--vocab", "32000", "--seq-len", "2048",
                 "--gpus", "64", "--global-batch", "64", "--gpu", "gb200-nvl72", "--tp", "16", "--top", "2"]) == 0
    assert "-tp16-" in capsys.readouterr().out


def test_plan_flags_an_mfu_above_what_published_runs_of_its_size_report(capsys):
    """Llama 3 8B on 64 H100s: the model predicts 60.7 % MFU; LLaMA-2-7B on 64 H100 (picotron) reports 38 %, the
    22B of Korthikanti et al. (2022, Table 5) 41.5 %: one caveat line. BLOOM's 36.7 % is inside its range."""
    from minimega.analysis.published_mfu import mfu_caveat, published_mfu_range
    lo, hi, sources = published_mfu_range(8_030_261_248)
    assert (lo, hi) == (0.38, 0.415) and len(sources) == 2
    assert mfu_caveat(176e9, 0.367) is None and mfu_caveat(8e9, 0.41) is None
    assert main(["plan", "--model", "llama3-8b", "--gpus", "64", "--gpu", "h100", "--global-batch", "512",
                 "--tp", "2", "--zero-stages", "1", "--recompute", "none", "--top", "1"]) == 0
    caveats = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("caveat:")]
    assert len(caveats) == 1 and "60.7%" in caveats[0] and "38-41.5%" in caveats[0], caveats


def test_the_web_planner_carries_the_cli_legend_in_both_languages():
    """Every layout code the calculator pages explain under the planner's table is one `minimega plan` explains."""
    import re
    from pathlib import Path

    from minimega.tools.plan_cli import LEGEND
    root = Path(__file__).resolve().parents[1] / "course"
    for page in ("calculator.md", "calculator.nl.md"):
        codes = re.findall(r"<dt>(.*?)</dt>", (root / page).read_text(encoding="utf-8"))
        assert len(codes) >= 7, page
        for code in codes:
            assert all(word in LEGEND for word in code.replace("%", "").split()), (page, code)
