"""`minimega.analysis.goodput`: failure rate vs GPU count, the Young/Daly interval, the time lost per failure."""
import json
import re
import math
import random
import shutil
import subprocess
from pathlib import Path

import pytest

from minimega import analysis as est


def test_llama3_rate_and_linear_scaling():
    # Llama 3 (arXiv:2407.21783, 3.3.4): 419 unexpected interruptions in 54 days on 16,384 GPUs
    assert est.failures_per_day(16384) == pytest.approx(419 / 54)
    assert est.mtbf_hours(16384) == pytest.approx(24 * 54 / 419)          # about one every 3.1 hours
    assert est.mtbf_hours(1024) == pytest.approx(16 * est.mtbf_hours(16384))
    assert est.failures_per_day(8, failures=1, days=1, at_gpus=8) == 1
    with pytest.raises(ValueError, match="gpus must be a finite number > 0"):
        est.failures_per_day(0)


def test_young_daly_interval_is_the_minimum_of_the_waste():
    for save, mtbf, restart in ((60.0, 3 * 3600.0, 0.0), (5.0, 3600.0, 300.0), (600.0, 48 * 3600.0, 60.0)):
        best = min((est.checkpoint_waste(t, save, mtbf, restart), t)
                   for t in (save * 1.01 ** k for k in range(2000)))[1]      # a grid search, not the formula
        assert est.young_daly_interval(save, mtbf) == pytest.approx(best, rel=0.01)
        tau = est.young_daly_interval(save, mtbf)
        assert est.checkpoint_waste(tau, save, mtbf, restart) == pytest.approx(
            math.sqrt(2 * save / mtbf) + restart / mtbf)
        assert est.goodput(tau, save, mtbf, restart) == pytest.approx(1 - est.checkpoint_waste(tau, save, mtbf, restart))


def test_lost_per_failure_matches_a_simulation():
    """Failures at random times (exponential gaps): each redoes the work since the last checkpoint, plus the restart."""
    rng, tau, restart = random.Random(0), 600.0, 120.0       # tau << mtbf: the first-order regime
    lost = []
    for _ in range(20000):
        at = rng.expovariate(1 / (3 * 3600))              # when, in seconds of work, the failure strikes
        lost.append(at % tau + restart)                   # the work since the last save, redone; then the restart
    assert sum(lost) / len(lost) == pytest.approx(est.lost_per_failure(tau, restart), rel=0.02)


def test_the_durable_write_term_matches_a_simulation():
    """An asynchronous save started at k*tau counts only once its write is durable at k*tau + W: a failure in
    [k*tau, k*tau + W) falls back to the save before. Simulated failures against tau/2 + W + R."""
    rng, tau, restart = random.Random(2), 600.0, 30.0
    for durable in (0.0, 60.0, 450.0):
        lost = []
        for _ in range(20000):
            at = 10 * tau + rng.expovariate(1 / (3 * 3600))                 # well past the run's first save
            saves = [k * tau for k in range(int(at // tau) + 1)]              # started so far
            done = [t for t in saves if t + durable <= at]                    # durable when the failure strikes
            lost.append(at - max(done) + restart)
        assert sum(lost) / len(lost) == pytest.approx(est.lost_per_failure(tau, restart, durable), rel=0.02), durable
    with pytest.raises(ValueError, match="one save is in flight at a time"):
        est.lost_per_failure(60.0, 0.0, 61.0)


def test_async_save_waste_at_131k_gpus_counts_the_write():
    """The chapter-10 table's last row: a 5 s copy alone says 8.5 %; its 60 s write to durable makes it 12.8 %."""
    mtbf = 3600 * est.mtbf_hours(131072)
    copy_only = est.checkpoint_waste(est.young_daly_interval(5, mtbf), 5, mtbf)
    tau = est.young_daly_interval(5, mtbf, 60)
    with_write = est.checkpoint_waste(tau, 5, mtbf, 0, 60)
    assert round(100 * copy_only, 1) == 8.5 and round(100 * with_write, 1) == 12.8
    assert with_write == pytest.approx(math.sqrt(2 * 5 / mtbf) + 60 / mtbf)
    # the interval never drops below the write (one save in flight): a grid search over tau >= W agrees
    best = min((est.checkpoint_waste(t, 1, 1000, 0, 200), t) for t in (200 * 1.001 ** k for k in range(5000)))[1]
    assert est.young_daly_interval(1, 1000, 200) == pytest.approx(best, rel=0.002) == 200


GOODPUT_JS = Path(__file__).resolve().parents[1] / "course" / "assets" / "javascripts" / "goodput.js"


@pytest.mark.skipif(shutil.which("node") is None, reason="needs node")
def test_the_calculator_page_computes_what_the_python_computes():
    """`goodput.js` (the calculator page's "How often to save") under Node, on random inputs, against this module."""
    rng = random.Random(1)
    cases = [(16384, 60.0, 600.0, 419, 54, 16384, 0.0), (131072, 5.0, 0.0, 419, 54, 16384, 60.0)] + [
        (rng.randint(8, 131072), rng.uniform(1, 900), rng.uniform(0, 3600), rng.randint(1, 2000), rng.uniform(1, 90),
         rng.randint(8, 32768), rng.choice([0.0, rng.uniform(0, 1800)])) for _ in range(50)]
    script = ("const g = require(process.argv[1]); const cases = JSON.parse(require('fs').readFileSync(0, 'utf8'));"
              "process.stdout.write(JSON.stringify(cases.map(c => g.plan(c[0], c[1], c[2], "
              "{failures: c[3], days: c[4], at_gpus: c[5]}, c[6]))));")
    proc = subprocess.run([shutil.which("node"), "-e", script, str(GOODPUT_JS)], input=json.dumps(cases),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    for (gpus, save, restart, failures, days, at, durable), js in zip(cases, json.loads(proc.stdout)):
        rate = dict(failures=failures, days=days, at_gpus=at)
        mtbf = 3600 * est.mtbf_hours(gpus, **rate)
        tau = est.young_daly_interval(save, mtbf, durable)
        python = {"failures_per_day": est.failures_per_day(gpus, **rate), "mtbf_hours": mtbf / 3600,
                  "interval_s": tau, "lost_per_failure_s": est.lost_per_failure(tau, restart, durable),
                  "waste": est.checkpoint_waste(tau, save, mtbf, restart, durable),
                  "goodput": est.goodput(tau, save, mtbf, restart, durable)}
        assert js.keys() == python.keys()
        for k, v in python.items():
            assert js[k] == pytest.approx(v, rel=1e-12, abs=1e-15), (k, gpus, save, restart)


@pytest.mark.parametrize("page", ["10-checkpoints.md", "10-checkpoints.nl.md"])
def test_chapter10_table_counts_the_write_to_durable(page):
    """The asynchronous column of chapter 10's table (5 s copy, 60 s write) is sqrt(2 δ/M) + W/M, in both languages."""
    from minimega.classroom.quiz import evaluate
    text = (Path(__file__).resolve().parents[1] / "course" / page).read_text(encoding="utf-8")
    rows = [line for line in text.splitlines() if line.startswith("| 1") and "young_daly_interval" in line]
    assert len(rows) == 3, rows
    for row, gpus in zip(rows, (1024, 16384, 131072)):
        shown = re.findall(r'num\("([^"]+)"', row)
        mtbf = 54 * 86400 / 419 * 16384 / gpus
        assert evaluate(shown[-1]) == pytest.approx(100 * (math.sqrt(2 * 5 / mtbf) + 60 / mtbf), rel=1e-12), (page, gpus)
        assert evaluate(shown[-2]) == pytest.approx(math.sqrt(2 * 5 * mtbf) / 60, rel=1e-12)
        assert evaluate(shown[3]) == pytest.approx(100 * math.sqrt(2 * 60 / mtbf), rel=1e-12)     # blocking: W = 0
