"""`minimega.health` and ``minimega train --on-spike``: the monitor, skipped steps, rollback with skipped batches."""
import contextlib
import io
import json
import math
import statistics

import pytest

from minimega import data
from minimega.health import HealthMonitor, StepGuard
from minimega.tools.cli import main


def test_batch_index_is_the_step_th_batch_not_skipped():
    for skip in ([], [0], [3], [3, 4, 9], [5, 2, 2]):
        kept = [i for i in range(100) if i not in skip]           # the reference: the list itself
        assert [data.batch_index(s, skip) for s in range(50)] == kept[:50]


def test_monitor_flags_non_finite_and_z_score_outliers_with_the_evidence():
    m = HealthMonitor(window=8, z=4.0, min_history=4)
    assert m.check(0, float("nan"), 1.0).kind == "non-finite loss"
    assert m.check(0, 2.0, float("inf")).kind == "non-finite gradients"
    losses = [3.0, 2.9, 3.1, 3.0, 2.95, 3.05, 3.0, 2.9, 3.1, 3.0]
    for i, x in enumerate(losses):
        assert m.check(i, x, 1.0 + 0.01 * (i % 3)) is None, i
    recent = losses[-8:]
    mean, std = statistics.fmean(recent), statistics.pstdev(recent)
    spike = mean + 4.5 * std
    v = m.check(10, spike, 1.0)
    assert v.kind == "loss spike" and v.window == 8
    assert v.mean == pytest.approx(mean) and v.std == pytest.approx(std) and v.z == pytest.approx(4.5)
    assert m.check(10, mean + 3.5 * std, 1.01) is None           # under the threshold: healthy, remembered
    assert m.check(11, 3.0, 5.0).kind == "grad-norm outlier"
    m.forget_after(5)
    assert [h[0] for h in m.history] == [3, 4]         # the window kept steps 3-10; 5 on are forgotten
    with pytest.raises(ValueError, match="min_history"):
        HealthMonitor(window=4, min_history=8)


def test_guard_policies():
    for policy, applied in (("warn", True), ("skip", False), ("rollback", False)):
        g = StepGuard(HealthMonitor(window=4, min_history=2), policy)
        assert g(0, 3.0, 1.0) is True and g.latest is None
        assert g(1, math.nan, 1.0) is applied and g.latest.kind == "non-finite loss"
    with pytest.raises(ValueError, match="on_spike"):
        StepGuard(HealthMonitor(), "ignore")


def _train(*flags, env=None, monkeypatch=None):
    if env:
        monkeypatch.setenv("MINIMEGA_FAULT_NAN_BATCH", env)
    else:
        monkeypatch.delenv("MINIMEGA_FAULT_NAN_BATCH", raising=False)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["train", "--nproc", "2", "--zero-stage", "3", "--steps", "6", "--json", *flags]) == 0
    return json.loads(out.getvalue().strip().splitlines()[-1])


def _shards(directory, step):
    return [(directory / f"step-{step:08d}" / f"shard-{r:05d}.safetensors").read_bytes() for r in (0, 1)]


def test_nan_at_a_batch_rolls_back_skips_it_and_ends_bit_equal_to_a_run_without_it(tmp_path, monkeypatch):
    k = 3
    # the reference: a run that never sees batch k (no monitor at all); a checkpoint after every step
    ref = _train("--save-dir", str(tmp_path / "ref"), "--save-every", "1", "--skip-batch", str(k),
                 monkeypatch=monkeypatch)
    # a NaN injected at batch k: the monitor sees it, the run goes back to step 2 and skips batch k
    metrics = tmp_path / "m.jsonl"
    got = _train("--save-dir", str(tmp_path / "rb"), "--save-every", "2", "--on-spike", "rollback",
                 "--metrics", str(metrics), env=str(k), monkeypatch=monkeypatch)
    (event,) = got["health"]
    assert event["event"] == "rollback" and event["batch"] == k and event["to_step"] == 2 and event["skipped"] == [k]
    assert event["evidence"]["kind"] == "non-finite loss"
    assert got["skipped_batches"] == [k]          # (the ranks' log line goes to a stderr a forkserver may hold)
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [r["batch"] for r in rows if "batch" in r and "event" not in r] == [0, 1, 2, 3, 2, 4, 5, 6]
    assert _shards(tmp_path / "rb", 6) == _shards(tmp_path / "ref", 6)         # weights, Adam states: bit-equal
    assert got["losses"][-1] == ref["losses"][-1]
    # skip: the step is not applied and batch k is spent: 5 updates on batches 0-2, 4, 5 = the reference's step 5
    _train("--save-dir", str(tmp_path / "sk"), "--save-every", "6", "--on-spike", "skip", env=str(k),
           monkeypatch=monkeypatch)
    assert _shards(tmp_path / "sk", 6) == _shards(tmp_path / "ref", 5)


def test_health_flags_that_would_do_nothing_are_refused(capsys):
    assert main(["train", "--skip-batches", "2"]) == 2
    assert "--on-spike" in capsys.readouterr().err
    assert main(["train", "--on-spike", "skip", "--skip-batches", "2"]) == 2
    assert "rollback" in capsys.readouterr().err
    assert main(["train", "--on-spike", "rollback"]) == 2
    assert "--save-every" in capsys.readouterr().err
