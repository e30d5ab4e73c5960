"""Timestamps for the engine's timeline: the host clock on CPU, CUDA events on a GPU.

On a GPU the host runs ahead of the kernels it queues, so `time.perf_counter()` at a call site says when
the work was *queued*, not when it ran. `CudaClock.stamp()` records an event on the current stream instead
(it completes when the GPU reaches it, in stream order) and `resolve()` turns the events into seconds once,
lazily, after synchronizing them: the first event's host time plus the GPU time elapsed since it, so the
entries still sort with host-clock ones (`CommLog` records, the model's own timeline).
"""
from __future__ import annotations

import time

import torch


class HostClock:
    """CPU: a stamp is ``time.perf_counter()``; nothing to resolve."""

    def stamp(self) -> float:
        return time.perf_counter()

    def resolve(self, timeline: list[dict]) -> list[dict]:
        return timeline


class CudaClock:
    """CUDA: a stamp is an event recorded on the current stream; `resolve` converts them to seconds.

    Args:
        event: makes an event with ``record()``, ``synchronize()``, ``elapsed_time(end)`` (ms); tests pass
            stand-ins.
        now: the host clock read when the first event is recorded (its time on the timeline).
    """

    def __init__(self, event=lambda: torch.cuda.Event(enable_timing=True), now=time.perf_counter):
        self._event, self._now = event, now
        self.first, self.host_at_first = None, 0.0

    def stamp(self):
        event = self._event()
        event.record()
        if self.first is None:
            self.first, self.host_at_first = event, self._now()
        return event

    def resolve(self, timeline: list[dict]) -> list[dict]:
        """Replace each entry's event by seconds, in place (entries already converted are left alone)."""
        for entry in timeline:
            if not isinstance(entry["time"], float):
                entry["time"].synchronize()
                entry["time"] = self.host_at_first + self.first.elapsed_time(entry["time"]) / 1e3   # ms -> s
        return timeline


def for_device(device: torch.device) -> HostClock | CudaClock:
    return CudaClock() if torch.device(device).type == "cuda" else HostClock()


class Recent(list):
    """A list that keeps only its most recent items: appending past 2·limit drops the oldest down to ``limit``
    (amortized O(1) per append), hands them to ``on_drop`` and counts them in ``dropped``.

    The engine's timelines and the `CommLog` use it, so a run of any length holds a bounded window.
    """

    def __init__(self, limit: int = 4096, on_drop=None, items=()):
        if limit < 1:
            raise ValueError(f"Recent: limit must be >= 1, got {limit}")
        super().__init__(items)
        self.limit, self.on_drop, self.dropped = limit, on_drop, 0

    def append(self, item) -> None:
        super().append(item)
        if len(self) > 2 * self.limit:
            n = len(self) - self.limit
            if self.on_drop is not None:
                self.on_drop(self[:n])
            del self[:n]
            self.dropped += n
