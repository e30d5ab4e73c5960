"""The CUDA-event timing, checked on CPU with stand-in events: `CommLog` times a collective on the GPU from its
events, not the host's clock, and the engine's timeline stamps are events turned into seconds once, in
`report()`. (The tests that need CUDA itself are in `test_nccl.py`.)"""
import pytest
import torch

import minimega as mm
from minimega import comm
from minimega.comm import collectives
from minimega.comm import log as comm_log
from parity import parity_config


class _FakeEvent:
    """A stand-in for torch.cuda.Event: 'records' the order it was recorded in; 1 ms apart per record."""
    clock = 0

    def record(self):
        _FakeEvent.clock += 1
        self.at, self.synced = _FakeEvent.clock, False

    def synchronize(self):
        self.synced = True

    def elapsed_time(self, end):
        assert end.synced, "read an end event before it completed"
        return float(end.at - self.at)


def test_comm_log_times_gpu_collectives_with_events_not_host_clocks(monkeypatch):
    monkeypatch.setattr(comm_log, "_on_gpu", lambda tensor: True)
    monkeypatch.setattr(comm_log, "_cuda_event", _FakeEvent)
    group = comm.Group(None, [0, 1], "dp")
    t = torch.ones(4)
    work = type("Work", (), {"wait": lambda self: None, "is_completed": lambda self: True})
    with comm.CommLog() as log:
        call = collectives._issue("all_reduce", group, t, 4)
        collectives._finish(call, [work()], t, False)             # a blocking call: the end event right away
        sync = call.record
        call = collectives._issue("reduce_scatter", group, t, 4)
        handle = collectives._finish(call, [work()], t, True)     # async: no end until wait()
        rec = call.record
        assert rec.cuda_events[1] is None
        _FakeEvent.clock += 5                               # 5 ms of GPU work overlap the collective
        handle.wait()
    assert sync.seconds == pytest.approx(1e-3)              # from the events, not perf_counter
    assert rec.seconds == pytest.approx(6e-3)
    assert log.summary()["by_op"]["reduce_scatter"]["seconds"] == pytest.approx(6e-3)
    monkeypatch.setattr(comm_log, "_on_gpu", lambda tensor: False)
    with comm.CommLog():
        call = collectives._issue("all_reduce", group, t, 4)
        collectives._finish(call, [work()], t, False)
        host = call.record
    assert host.cuda_events is None and 0 <= host.seconds < 1


def test_engine_timeline_uses_cuda_events_resolved_once_in_report(monkeypatch):
    """The engine's stamps are events in stream order; report() synchronizes them and turns them into
    seconds after the first event's host time, once (a second report reads the same floats)."""
    from minimega import clock, data
    model_config = mm.GPTConfig.tiny(block_size=16)
    config = parity_config(gradient_accumulation_steps=2, zero_stage=1)
    made = []

    def event():
        made.append(_FakeEvent())
        return made[-1]

    monkeypatch.setattr(clock, "for_device", lambda device: clock.CudaClock(event=event, now=lambda: 100.0))
    engine = mm.initialize(mm.GPT(model_config), config, mm.init_mesh())
    _FakeEvent.clock = 0
    for batch in data.batches(engine.mesh, 2, config.batch_size, 16, seed=0):
        engine.train_step(batch)
    lent = engine.timeline + engine.wrapper.timeline              # ZeRO's events share the clock
    assert all(not isinstance(e["time"], float) for e in lent)      # nothing converted yet
    timeline = engine.report()["timeline"]
    steps = [e for e in timeline if "step" in e]
    micro = ["forward_start", "backward_start", "backward_end"]
    assert [e["event"] for e in steps[:10]] == ["step_start", *micro, *micro, "optimizer_start",
                                                "optimizer_step_end", "step_end"]
    assert len(steps) == 20 and len(timeline) == len(made) > 20 and all(ev.synced for ev in made)
    # the k-th event recorded (1 ms apart in the stand-in) sits k ms after the first one's host time
    assert sorted(e["time"] for e in timeline) == pytest.approx([100.0 + k * 1e-3 for k in range(len(made))])
    assert [e["time"] for e in engine.report()["timeline"]] == [e["time"] for e in timeline]   # converted once


def test_host_clock_is_kept_on_cpu():
    from minimega import clock
    assert isinstance(clock.for_device(torch.device("cpu")), clock.HostClock)
    assert isinstance(clock.for_device(torch.device("cuda", 0)), clock.CudaClock)
