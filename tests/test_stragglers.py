"""Stragglers: the watchdog's records carry each rank's own work per step; a persistently slow rank is named."""
import re

import pytest

from minimega.tools.cli import main
from minimega.run.watchdog import Stragglers


def _snaps(step, busy):
    return [{"rank": r, "step": step, "busy": b} for r, b in enumerate(busy)]


def test_a_rank_persistently_slower_by_the_factor_is_named_once_and_a_single_slow_step_is_not():
    w = Stragglers(2.0, window=5)
    for step in range(1, 20):
        slow = 0.9 if step == 3 else 0.1                      # one slow step on rank 0: noise, not a straggler
        assert w.update(_snaps(step, [slow, 0.1, 0.12, 0.11])) == []
    named = []
    for step in range(20, 30):
        named += w.update(_snaps(step, [0.1, 0.1, 0.35, 0.11]))
    assert len(named) == 1 and named[0].startswith("straggler: rank 2 is")
    assert w.named[0]["rank"] == 2 and w.named[0]["step"] == 22          # the 3rd slow step: 3 of the last 5
    assert w.named[0]["busy"] == pytest.approx(0.35) and w.named[0]["peers"] == pytest.approx(0.1)
    with pytest.raises(ValueError, match="factor"):
        Stragglers(1.0)


def test_a_rank_slowed_3x_is_named_within_20_steps(capfd, monkeypatch):
    monkeypatch.setenv("MINIMEGA_FAULT_SLOW", "1:3")          # rank 1 sleeps twice its step after each step
    assert main(["train", "--nproc", "2", "--steps", "20", "--straggler-factor", "2", "--json"]) == 0
    err = capfd.readouterr().err
    named = re.findall(r"straggler: rank (\d+) is ([\d.]+)x slower than its peers at step (\d+)", err)
    assert [r for r, _, _ in named] == ["1"], err
    (_, ratio, step), = named
    assert int(step) <= 20 and float(ratio) > 2


def test_straggler_factor_is_refused_where_it_cannot_name_anyone(capsys):
    assert main(["train", "--straggler-factor", "1"]) == 2
    assert main(["train", "--nproc", "1", "--straggler-factor", "2"]) == 2
    assert "--nproc" in capsys.readouterr().err
