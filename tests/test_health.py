"""`minimega.train.health` and ``minimega train --on-spike``: the monitor, skipped steps, rollback with skipped batches."""
import contextlib
import io
import json
import math
import statistics

import pytest

from minimega import data
from minimega.train.health import HealthMonitor, StepGuard, ThroughputWatch
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
    # a NaN injected at batch k: the monitor sees it, the run goes back to step 2 and skips batch k; its saves are
    # asynchronous (the rollback waits for the one in flight) and it writes TensorBoard scalars
    metrics = tmp_path / "m.jsonl"
    got = _train("--save-dir", str(tmp_path / "rb"), "--save-every", "2", "--on-spike", "rollback", "--async-save",
                 "--metrics", str(metrics), "--tensorboard", str(tmp_path / "tb"), env=str(k), monkeypatch=monkeypatch)
    (event,) = got["health"]
    assert event["event"] == "rollback" and event["batch"] == k and event["to_step"] == 2 and event["skipped"] == [k]
    assert event["evidence"]["kind"] == "non-finite loss"
    assert got["skipped_batches"] == [k]          # (the ranks' log line goes to a stderr a forkserver may hold)
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [r["batch"] for r in rows if "batch" in r and "event" not in r] == [0, 1, 2, 3, 2, 4, 5, 6]
    assert _shards(tmp_path / "rb", 6) == _shards(tmp_path / "ref", 6)         # weights, Adam states: bit-equal
    assert got["losses"][-1] == ref["losses"][-1]
    _tensorboard_holds_the_metrics(tmp_path / "tb", [r for r in rows if "event" not in r])
    # skip: the step is not applied and batch k is spent: 5 updates on batches 0-2, 4, 5 = the reference's step 5
    _train("--save-dir", str(tmp_path / "sk"), "--save-every", "6", "--on-spike", "skip", env=str(k),
           monkeypatch=monkeypatch)
    assert _shards(tmp_path / "sk", 6) == _shards(tmp_path / "ref", 5)


def _tensorboard_holds_the_metrics(directory, rows):
    """The event file, read back by tensorboard's own reader, holds every finite loss and grad norm of the JSONL."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    board = EventAccumulator(str(directory))
    board.Reload()
    tags = set(board.Tags()["scalars"])
    assert {"train/loss", "train/grad_norm", "train/lr", "train/tokens_per_s", "memory/model_states_bytes"} <= tags
    for tag, key in (("train/loss", "loss"), ("train/grad_norm", "grad_norm"), ("train/tokens_per_s", "tokens_per_s")):
        want = [(r["step"], r[key]) for r in rows if isinstance(r[key], float) and math.isfinite(r[key])]
        got = [(e.step, e.value) for e in board.Scalars(tag)]
        assert [s for s, _ in got] == [s for s, _ in want], tag
        assert [v for _, v in got] == pytest.approx([v for _, v in want], rel=1e-6), tag     # stored as float32
    assert [e.value for e in board.Scalars("train/lr")] == pytest.approx([1e-3] * len(want))
    assert all(e.value > 0 for e in board.Scalars("memory/model_states_bytes"))


def test_throughput_watch_flags_a_step_below_a_fraction_of_the_median():
    w = ThroughputWatch(fraction=0.5, window=4, min_history=3)
    rates = [100.0, 120.0, 90.0]
    assert [w.check(i, r) for i, r in enumerate(rates)] == [None] * 3          # no verdict before min_history
    assert w.check(3, 50.0) is None                                            # exactly half: not below
    v = w.check(4, 40.0)                                                        # median of 100, 120, 90, 50 = 95
    assert v.kind == "throughput drop" and v.median == statistics.median([100, 120, 90, 50]) and v.window == 4
    assert "40 tokens/s is below 0.5 x the median 95 tokens/s of the last 4 steps" in v.describe()
    for _ in range(4):
        w.check(5, 40.0)
    assert w.check(9, 40.0) is None                     # a run that stays slower stops being flagged
    with pytest.raises(ValueError, match="fraction"):
        ThroughputWatch(fraction=1.5)


def test_watch_flags_are_refused_by_name(capsys, monkeypatch):
    assert main(["train", "--throughput-drop", "2"]) == 2
    assert "--throughput-drop 2.0: a fraction" in capsys.readouterr().err
    from minimega.tools import health_run
    real = health_run.importlib.util.find_spec
    monkeypatch.setattr(health_run.importlib.util, "find_spec", lambda name, *a: None if name == "tensorboard"
                        else real(name, *a))
    assert main(["train", "--tensorboard", "tb"]) == 2
    assert "--tensorboard needs the tensorboard package" in capsys.readouterr().err


def test_health_flags_that_would_do_nothing_are_refused(capsys):
    assert main(["train", "--skip-batches", "2"]) == 2
    assert "--on-spike" in capsys.readouterr().err
    assert main(["train", "--on-spike", "skip", "--skip-batches", "2"]) == 2
    assert "rollback" in capsys.readouterr().err
    assert main(["train", "--on-spike", "rollback"]) == 2
    assert "--save-every" in capsys.readouterr().err


def test_rollback_waits_for_the_save_in_flight(tmp_path):
    """One process, asynchronous saves: the save at step 4 has its writer held while steps 5 and 6 train; a NaN at
    step 7 rolls back. Resolving the checkpoint before that save is committed would pick step 2's; the rollback
    waits (the writer is released 0.5 s into the wait) and goes back to step 4."""
    import threading
    import torch
    import minimega as mm
    from minimega.checkpoint import saving
    from minimega.tools.health_run import RunHealth
    mesh = mm.init_mesh()
    config = mm.TrainConfig(async_save=True, seed=1, memory_peak_steps=0)
    torch.manual_seed(config.seed)
    engine = mm.initialize(mm.GPT(mm.GPTConfig.tiny(n_embd=32, block_size=16, n_layer=1)), config, mesh)
    health = RunHealth(engine, {"policy": "rollback", "window": 8, "z": 6.0, "skip_batches": 1},
                       save_dir=tmp_path, rank=0)
    release, real_write = threading.Event(), saving.write_safetensors

    def held_write(*args, **kwargs):
        assert release.wait(60), "the held writer was never released"
        return real_write(*args, **kwargs)

    def step():
        engine.train_step(next(data.batches(mesh, 1, config.batch_size, 16, seed=1, start=engine.step)))
    for _ in range(2):
        step()
    engine.save(tmp_path)
    engine.wait_for_save()                                       # step 2: committed
    saving.write_safetensors = held_write
    try:
        for _ in range(2):
            step()
        engine.save(tmp_path)                                    # step 4: held
        for _ in range(3):                                       # steps 5-7 train while it is held
            step()
        assert engine._saver.in_flight
        health.guard(engine.step, math.nan, 1.0)                 # step 7's loss: NaN
        threading.Timer(0.5, release.set).start()
        assert health.after_step(engine.step, 6, math.nan, 1.0) is True
    finally:
        release.set()
        saving.write_safetensors = real_write
    assert health.events[-1]["to_step"] == engine.step == 4
