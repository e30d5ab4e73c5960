"""`minimega.analysis.goodput`: failure rate vs GPU count, the Young/Daly interval, the time lost per failure."""
import math
import random

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
