"""One readable step: one optimizer type, bounded logs with totals kept, the watchdog's wait clock started
when a rank waits, memory recorded after a resume."""
import pytest
import torch

import minimega as mm
from minimega import clock, comm, data
from minimega.comm import collectives
from minimega.run import measure
from minimega.comm.log import CommLog, ring_bytes
from minimega.train.optimizer import Optimizers, TorchOptimizer
from minimega.run.watchdog import RankStatus, _STATUS_BYTES, read_status

PAIR = comm.Group(None, [0, 1], "dp")          # observers only: no process group is touched below


class _Work:
    def wait(self):
        pass


def _collective(op="all_reduce", numel=8, async_op=False):
    t = torch.ones(numel)
    call = collectives._issue(op, PAIR, t, numel, "test", (t,))
    return collectives._finish(call, [_Work()], t, async_op), call


def test_a_window_keeps_the_newest_items_and_hands_over_the_rest():
    dropped = []
    w = clock.Recent(3, on_drop=dropped.extend)
    for i in range(20):
        w.append(i)
        assert len(w) <= 6
    assert list(w) == list(range(20 - len(w), 20)) and w.dropped == 20 - len(w) == len(dropped)
    assert dropped == list(range(w.dropped))
    with pytest.raises(ValueError, match="limit must be >= 1"):
        clock.Recent(0)


def test_the_comm_log_keeps_a_window_and_totals_for_the_whole_run():
    with CommLog(window=4) as log:
        for _ in range(50):
            _collective()
    assert len(log.records) <= 8 and log.records.dropped >= 42
    summary = log.summary()
    assert summary["calls"] == 50 == summary["by_op"]["all_reduce"]["calls"]
    assert summary["by_op"]["all_reduce"]["bytes"] == 50 * 8 * 4
    assert log.total_sent() == pytest.approx(50 * ring_bytes("all_reduce", 32, 2))
    assert log.total_sent(group="dp") == log.total_sent() and log.total_sent(op="all_gather") == 0


def _status(tmp_path) -> RankStatus:
    path = tmp_path / "status"
    path.write_bytes(b"\0" * _STATUS_BYTES)
    return RankStatus(path)


def test_the_wait_clock_starts_when_the_rank_waits_not_when_it_issues(tmp_path):
    status = _status(tmp_path)
    status.beat()
    with comm.observing(status):
        handle, call = _collective("reduce_scatter", async_op=True)
        snap = read_status(tmp_path / "status")
        assert snap["op"] == "reduce_scatter" and snap["count"] == 1
        assert snap["waiting"] == 0.0            # issued, not waited on: a long backward here is no hang
        seen = []
        status_waiting = status.waiting

        def spy(c):
            status_waiting(c)
            seen.append(read_status(tmp_path / "status")["waiting"])
        status.waiting = spy
        handle.wait()
    assert seen and seen[0] > 0.0                 # blocked: the clock ran
    assert read_status(tmp_path / "status")["waiting"] == 0.0


def test_a_synchronous_call_waits_from_the_start(tmp_path):
    status = _status(tmp_path)
    status.beat()
    seen = []

    class Peek:
        def issued(self, call):
            pass

        def waiting(self, call):                  # after the status's own hook: it attached first
            seen.append(status.waiting_since)

        def done(self, call):
            pass
    with comm.observing(status), comm.observing(Peek()):
        _collective("all_reduce")
    assert seen[0] > 0.0 and status.waiting_since == 0.0


def _engine(**overrides):
    torch.manual_seed(0)
    config = mm.TrainConfig(batch_size=4, **overrides)
    return mm.initialize(mm.GPT(mm.GPTConfig.tiny()), config, mm.init_mesh())


@pytest.mark.parametrize("stage", [0, 1, 3])
def test_the_engine_has_one_optimizer_type(stage):
    engine = _engine(zero_stage=stage)
    assert type(engine.optimizer) is Optimizers
    assert (type(engine.optimizer.parts[0]) is TorchOptimizer) == (stage == 0)
    assert engine.optimizer.step() is True


def test_memory_is_recorded_after_a_resume(tmp_path):
    engine = _engine(zero_stage=1)
    mesh = engine.mesh
    for batch in data.batches(mesh, 3, 4, 32):
        engine.train_step(batch)
    engine.save(tmp_path)
    again = _engine(zero_stage=1)
    assert again.load(tmp_path) == 3
    for batch in data.batches(mesh, 1, 4, 32, start=3):
        again.train_step(batch)
    report = again.report()
    assert report["memory_at_step"]["params"] > 0 and report["memory_at_step"]["optimizer_states"] > 0
    assert report["memory_peak"]["total"] == 0            # sampling costs: only steps 0, 1 and when asked
    again.track_peak()
    for batch in data.batches(mesh, 1, 4, 32, start=4):
        again.train_step(batch)
    assert again.report()["memory_peak"]["total"] >= report["memory_at_step"]["params"] > 0


@pytest.mark.parametrize("first", [0, 1, 3])
def test_peaks_are_sampled_in_the_first_memory_peak_steps_and_when_asked(first, monkeypatch):
    sampled, track = [], measure.PeakTracker.track
    monkeypatch.setattr(measure.PeakTracker, "track", lambda self: (sampled.append(engine.step), track(self))[1])
    engine = _engine(zero_stage=1, memory_peak_steps=first)
    for i, batch in enumerate(data.batches(engine.mesh, 5, 4, 32)):
        if i == 4:
            engine.track_peak()
        engine.train_step(batch)
    assert sampled == [*range(first), 4]
    assert engine.report()["memory_peak"]["total"] >= engine.report()["memory_at_step"]["params"] > 0


@pytest.mark.parametrize("stage", [0, 3])
def test_sampling_the_peak_changes_no_number(stage):
    runs = []
    for first in (2, 0):
        engine = _engine(zero_stage=stage, memory_peak_steps=first, gradient_clipping=0.5)
        for batch in data.batches(engine.mesh, 2, 4, 32):
            engine.train_step(batch)
        runs.append((engine.losses, engine.grad_norms, engine.full_state_dict()))
    (losses, norms, state), (losses0, norms0, state0) = runs
    assert losses == losses0 and norms == norms0 and state.keys() == state0.keys()
    assert all(torch.equal(state[k], state0[k]) for k in state)


def _long_run(steps, window):
    mesh = mm.init_mesh(mm.ParallelDims(dp=2))
    torch.manual_seed(0)
    engine = mm.initialize(mm.GPT(mm.GPTConfig.tiny()), mm.TrainConfig(batch_size=4, zero_stage=3), mesh)
    logs = [engine.comm_log.records, engine.timeline, engine.wrapper.timeline]
    for log in logs:
        log.limit = window
    sizes = []
    for batch in data.batches(mesh, steps, 4, 32):
        engine.train_step(batch)
        sizes.append(sum(len(log) for log in logs))
    first = engine.comm_per_step[0]
    return {"sizes": sizes, "calls": engine.comm_log.summary()["calls"], "dropped": logs[0].dropped,
            "sent": engine.comm_log.total_sent(), "per_step_sent": sum(engine.comm_per_step), "first": first}


def test_zero3_logs_stay_bounded_over_a_long_run_and_keep_their_totals():
    steps, window = 40, 32
    for r in mm.launch(_long_run, 2, steps, window):
        assert max(r["sizes"]) <= 3 * 2 * window                     # three windows, each at most 2·limit
        assert r["dropped"] > 0                                       # the window did fill
        assert r["sizes"][-1] <= max(r["sizes"][: steps // 2] or [0]) + 2 * window
        assert r["sent"] == pytest.approx(r["per_step_sent"]) and r["sent"] == pytest.approx(steps * r["first"])
