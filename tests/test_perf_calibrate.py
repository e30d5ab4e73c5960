"""minimega.analysis.calibrate: the plumbing on a tiny case (never a timing: the machine is shared)."""
import pytest

from minimega.analysis import perf
from minimega.analysis.calibrate import _fit, calibrate, cpu_hardware, predict_minimega


def test_fit_recovers_alpha_and_beta_of_each_formula():
    link = perf.Link(name="x", bandwidth=2e9, alpha=3e-5, efficiency=1.0)
    sizes = (4096, 1 << 22)
    for op in ("all_reduce", "reduce_scatter", "all_gather", "all_to_all", "send_recv"):
        times = [perf.collective_time(op, s, 4, link) for s in sizes]
        a, b = _fit(op, 4, sizes, times)
        assert a == pytest.approx(3e-5) and b == pytest.approx(2e9), op


def test_calibrate_and_predict_plumbing():
    cal = calibrate(2, reps=1, sizes=(4096, 65536))
    assert cal["matmul_flops"] > 0 and cal["memory_bandwidth"] > 0 and cal["op_overhead"] > 0 and cal["adam_rate"] > 0
    assert set(cal["collectives"]) == {"all_reduce", "reduce_scatter", "all_gather", "all_to_all", "send_recv"}
    hw = cpu_hardware(cal)
    ag = cal["collectives"]["all_gather"]
    assert perf.collective_time("all_gather", 1e6, 2, hw.intra) == pytest.approx(ag["alpha"] + 0.5e6 / ag["beta"])
    cfg = perf.PerfConfig(layers=2, hidden=64, heads=4, vocab=256, seq_len=64, precision="fp32", attention="fused",
                          dropout=False, dp=2, global_batch=8)
    one = predict_minimega(cal, cfg)
    four = predict_minimega(cal, perf.replace(cfg, dp=4))
    assert one["total"] > 0 and 0 < one["share"] <= 1
    assert four["share"] < one["share"]                       # four ranks share the same cores
    idle = predict_minimega({**cal, "load": 0.0, "cores": 2}, perf.replace(cfg, dp=4))
    assert idle["share"] == pytest.approx(0.5)                # 4 one-thread ranks on 2 idle cores

    # torch's AdamW on the rank's shard at the measured rate: ZeRO-1 halves it, offload adds the copies
    from minimega import estimate as est
    n = est.stage_params(cfg.memory_config())
    assert idle["optimizer"] == pytest.approx(n / cal["adam_rate"] / 0.5)
    z1 = predict_minimega({**cal, "load": 0.0, "cores": 2}, perf.replace(cfg, zero_stage=1))
    assert z1["optimizer"] == pytest.approx(n / 2 / cal["adam_rate"])
    off = predict_minimega({**cal, "load": 0.0, "cores": 2}, perf.replace(cfg, zero_stage=1, offload="optimizer"))
    assert off["optimizer"] > z1["optimizer"]
