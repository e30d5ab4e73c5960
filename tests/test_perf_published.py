"""The performance model against published runs on A100 clusters: each row predicted within ±20%.

The model's one fitted number per source is named where it is fitted: the A100 matmul efficiency on
Korthikanti Table 4 (one 22B layer) and the Megatron-DeepSpeed stack factor on MT-NLG at 2240 GPUs
(``perf.STACKS``). Every other row is a prediction from the published configuration.
"""
import pytest

from minimega.analysis import perf
from minimega.analysis.perf import PerfConfig

A100 = perf.hardware("a100-80gb")
TOL = 0.20

# Narayanan et al. 2021 (arXiv:2104.04473) Table 1, weak scaling on A100 80GB, V = 51200, s = 2048, full
# recomputation (Eq. 3): params B, heads, h, layers, t, p, GPUs, batch, TFLOP/s per GPU. The table does not
# print the micro-batch size; the model runs b = 1 with the non-interleaved 1F1B schedule.
NARAYANAN_TABLE1 = [
    (1.7, 24, 2304, 24, 1, 1, 32, 512, 137), (3.6, 32, 3072, 30, 2, 1, 64, 512, 138),
    (7.5, 32, 4096, 36, 4, 1, 128, 512, 142), (18.4, 48, 6144, 40, 8, 1, 256, 1024, 135),
    (39.1, 64, 8192, 48, 8, 2, 512, 1536, 138), (76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140),
    (145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148), (310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155),
    (529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163), (1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163),
]

# Korthikanti et al. 2022 (arXiv:2205.05198): Table 3 layouts (dp = 1, V = 51200, s = 2048) and Table 5
# seconds per iteration with full recomputation and with selective recomputation + sequence parallelism,
# and the MFU of the latter: name, heads, h, layers, t, p, batch, micro-batch, full s, present s, MFU %.
KORTHIKANTI_TABLE5 = [
    ("22B", 64, 6144, 48, 8, 1, 4, 4, 1.42, 1.10, 41.5), ("175B", 96, 12288, 96, 8, 8, 64, 1, 18.13, 13.75, 51.4),
    ("530B", 128, 20480, 105, 8, 35, 280, 1, 49.05, 37.83, 56.0), ("1T", 160, 25600, 128, 8, 64, 512, 1, 94.42, 71.49, 56.3),
]

# MT-NLG 530B (Smith et al. 2022, arXiv:2201.11990 §2.4): TP 8 x PP 35, global batch 1920, GPUs, seconds per
# iteration, TFLOP/s per GPU. The 2240-GPU row fits perf.STACKS["megatron-deepspeed"]; the others are predicted.
MT_NLG = [(2240, 60.1, 126), (2800, 50.2, 121), (3360, 44.4, 113)]


def _rel(got, want):
    return abs(got - want) / want


@pytest.mark.parametrize("row", NARAYANAN_TABLE1, ids=[f"{r[0]}B" for r in NARAYANAN_TABLE1])
def test_narayanan_table1_tflops_per_gpu(row):
    _, a, h, L, t, p, n, B, tflops = row
    cfg = PerfConfig(layers=L, hidden=h, heads=a, vocab=51200, seq_len=2048, micro_batch=1, tp=t, pp=p,
                     dp=n // (t * p), global_batch=B, recompute="full")
    got = perf.step_time(cfg, A100)
    assert _rel(got["tflops_per_gpu"], tflops) < TOL, (row, got["tflops_per_gpu"])
    assert got["fits"], got["memory"]["total"]


@pytest.mark.parametrize("row", KORTHIKANTI_TABLE5, ids=[r[0] for r in KORTHIKANTI_TABLE5])
def test_korthikanti_table5_seconds_and_mfu(row):
    _, a, h, L, t, p, B, b, full_s, sel_s, mfu = row
    base = dict(layers=L, hidden=h, heads=a, vocab=51200, seq_len=2048, micro_batch=b, tp=t, pp=p, dp=1, global_batch=B)
    full = perf.step_time(PerfConfig(**base, recompute="full"), A100)
    sel = perf.step_time(PerfConfig(**base, recompute="selective", sp=True), A100)
    assert _rel(full["total"], full_s) < TOL, full["total"]
    assert _rel(sel["total"], sel_s) < TOL, sel["total"]
    assert _rel(sel["mfu"] * 100, mfu) < TOL, sel["mfu"]
    # the paper's point: selective recomputation is 29-32% faster; the model must see most of that gain
    assert full["total"] / sel["total"] > 1.2


def test_korthikanti_table4_one_layer_fits_the_matmul_efficiency():
    """The one layer the A100 matmul efficiency is fitted on: 22B, b = 4, t = 8, 19.6 ms forward + backward."""
    cfg = PerfConfig(layers=1, hidden=6144, heads=64, vocab=51200, seq_len=2048, micro_batch=4, tp=8, global_batch=4)
    lt = perf.layer_times(cfg, A100)
    assert _rel(sum(lt.values()), 19.6e-3) < 0.1
    full = perf.layer_times(perf.replace(cfg, recompute="full"), A100)
    assert _rel(sum(full.values()), 27.2e-3) < 0.1        # Table 4's full-recompute row: a prediction


@pytest.mark.parametrize("row", MT_NLG, ids=[f"{r[0]}gpus" for r in MT_NLG])
def test_mt_nlg_530b(row):
    n, seconds, tflops = row
    cfg = perf.preset_config("mt-nlg-530b", dp=n // 280, global_batch=1920)
    got = perf.step_time(cfg, A100)
    assert _rel(got["total"], seconds) < TOL, got["total"]
    assert _rel(got["tflops_per_gpu"], tflops) < TOL, got["tflops_per_gpu"]


def test_bloom_176b():
    """BigScience tr11 notes: 384 A100 80GB, TP 4 x PP 12 x DP 8, 104.70 s per iteration, 149.77 TFLOP/s per GPU."""
    got = perf.step_time(perf.preset_config("bloom-176b"), A100)
    assert _rel(got["total"], 104.70) < TOL, got["total"]
    assert _rel(got["tflops_per_gpu"], 149.77) < TOL, got["tflops_per_gpu"]
    assert got["fits"]


# Narayanan et al. 2021 Table 2: ZeRO-3 without model parallelism (DeepSpeed) against PTD-P (Megatron) on the
# 174.6B model (GPT-3 shape: 96 layers, h = 12288, 96 heads), TFLOP/s per GPU at 384 / 768 / 1536 GPUs.
# Our reference note does not carry the batch; the model runs a fixed global batch of 1536 (4 / 2 / 1 sequences
# per GPU under ZeRO-3, one micro-batch each) and full recomputation.
NARAYANAN_TABLE2 = [(384, 144, 153), (768, 88, 149), (1536, 44, 141)]


@pytest.mark.parametrize("row", NARAYANAN_TABLE2, ids=[f"{r[0]}gpus" for r in NARAYANAN_TABLE2])
def test_narayanan_table2_zero3_against_ptdp(row):
    n, zero3, ptdp = row
    shape = dict(layers=96, hidden=12288, heads=96, vocab=51200, seq_len=2048, global_batch=1536, recompute="full")
    z = perf.step_time(PerfConfig(**shape, dp=n, zero_stage=3, micro_batch=1536 // n, stack="megatron-deepspeed"), A100)
    p = perf.step_time(PerfConfig(**shape, dp=n // 64, tp=8, pp=8, micro_batch=1), A100)
    assert _rel(z["tflops_per_gpu"], zero3) < TOL, z["tflops_per_gpu"]
    assert _rel(p["tflops_per_gpu"], ptdp) < TOL, p["tflops_per_gpu"]


def test_zero3_collapse_is_exposed_gathers():
    """Why ZeRO-3 collapses: each GPU's compute halves with the GPUs, its per-layer gathers do not."""
    shape = dict(layers=96, hidden=12288, heads=96, vocab=51200, seq_len=2048, global_batch=1536, recompute="full")
    r = [perf.step_time(PerfConfig(**shape, dp=n, zero_stage=3, micro_batch=1536 // n), A100) for n in (384, 1536)]
    assert r[0]["compute"] / r[1]["compute"] == pytest.approx(4, rel=0.01)
    assert r[1]["dp_comm"] > 5 * r[0]["dp_comm"] and r[1]["dp_comm"] > r[1]["compute"]
