"""minimega.perf_plan: the layout search, its constraints, and where the published layouts rank."""
import json

import pytest

from minimega import estimate as est
from minimega import perf
from minimega import perf_plan
from minimega.cli import main

# What Megatron-DeepSpeed offered BLOOM and MT-NLG (training-stacks.md feature table): full recomputation only,
# no interleaved schedule, ZeRO <= 1 with pipelines, no Megatron sequence parallelism.
DEEPSPEED_2022 = dict(recompute=("full",), schedules=("1f1b",), zero_stages=(0, 1), sp=(False,))


def _shape(name, **extra):
    keep = ("layers", "hidden", "heads", "vocab", "seq_len", "precision", "fp32_grads", "position_embedding",
            "pp_partition")
    return {**{k: v for k, v in est.PRESETS[name].items() if k in keep}, "stack": "megatron-deepspeed", **extra}


def test_mt_nlg_published_layout_ranks_in_the_top_5():
    res = perf.plan(_shape("mt-nlg-530b"), 2240, 1920, "a100-80gb", **DEEPSPEED_2022)
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
