"""What moved where: `CommLog`, the observer of `minimega.comm` that records every collective.

Each record holds the op, the group, the dtype, the element count, the payload and the bytes each rank
*sends* under the ring model

    all-reduce      2(n-1)/n * S     (a reduce-scatter followed by an all-gather)
    reduce-scatter   (n-1)/n * S     S = the full (unsharded) buffer
    all-gather       (n-1)/n * S     S = the full (gathered) buffer
    all-to-all       (n-1)/n * S
    broadcast, send  S

and the wall time (on CUDA, events on the stream). The byte counts are *algorithmic*: the ring model
applied to tensor sizes, the yardstick the papers use. Beside them each record counts ``wire_bytes``, what
the construction `comm` really ran sends: the same, except gloo's reduce-scatter, which `comm` builds from
n in-place reduces and which sends (1 + 1/n) times the ring's bytes. What gloo puts on the wire, headers
included, is measured by `minimega.run.measure.wire_bytes` (the two agree within the headers: `comm-wire.json`).

A log keeps its newest ``window`` records (a long run would otherwise grow it without end) and folds
the older ones into running totals, so `summary` and `total_sent` always cover the whole run.
"""
from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field

import torch

from ..clock import Recent
from .observers import attach, detach

# --8<-- [start:ring_factor]
_RING_FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "all_to_all": lambda n: (n - 1) / n,
    "send": lambda n: 1.0,
    "recv": lambda n: 0.0,
}
# --8<-- [end:ring_factor]


def ring_bytes(op: str, size_bytes: float, n: int) -> float:
    """Bytes each of `n` ranks sends for `op` on a buffer of `size_bytes` (the ring model above)."""
    return _RING_FACTOR[op](n) * size_bytes if n > 1 else 0.0


@dataclass
class CommRecord:
    op: str
    group: str
    group_size: int
    dtype: str
    elements: int
    bytes: int
    """Payload S: the full buffer for collectives, the message for p2p."""
    sent_bytes: float
    """Algorithmic bytes this rank sends: the ring model applied to the payload (gloo's real bytes differ:
    `measure.wire_bytes`)."""
    start: float
    end: float | None = None
    tag: str = ""
    wait: float | None = None
    """When this rank started blocking on it (host clock): ``wait`` to ``end`` is exposed, the rest hidden."""
    cuda_events: tuple | None = None
    """On CUDA: (start, end) `torch.cuda.Event`s recorded on the current stream; they time the GPU's work,
    where the host clocks above only time the enqueue of an asynchronous kernel."""
    wire_bytes: float | None = None
    """Payload bytes this rank really puts on the wire for the construction `comm` ran: the ring's bytes,
    except where `comm` builds an op from others (gloo's reduce-scatter from n reduces sends (1 + 1/n) times
    them, `comm.collectives._reduces_wire_factor`); transport headers aside (`measure.wire_bytes` counts those too)."""

    def __post_init__(self):
        if self.wire_bytes is None:
            self.wire_bytes = self.sent_bytes

    @property
    def seconds(self) -> float:
        if self.cuda_events is not None and self.cuda_events[1] is not None:
            self.cuda_events[1].synchronize()
            return self.cuda_events[0].elapsed_time(self.cuda_events[1]) / 1e3      # ms -> s
        return (self.end or self.start) - self.start


def _on_gpu(tensor: torch.Tensor) -> bool:
    return tensor.is_cuda


def _cuda_event():
    return torch.cuda.Event(enable_timing=True)


def _row() -> dict:
    return {"calls": 0, "bytes": 0, "sent_bytes": 0.0, "wire_bytes": 0.0, "seconds": 0.0}


@dataclass
class CommLog:
    """Records collectives while active (``with log: ...``); summaries by op and by group."""

    records: list[CommRecord] = field(default_factory=list)
    window: int = 4096
    """Records kept (the newest); older ones are folded into the totals."""

    def __post_init__(self):
        self.records = Recent(self.window, on_drop=self._fold, items=self.records)
        self._folded: dict = defaultdict(_row)           # (op, group) -> totals of the records dropped

    def __enter__(self):
        attach(self)                                       # the collectives tell every attached observer
        return self

    def __exit__(self, *exc):
        detach(self)

    # --8<-- [start:record]
    # --8<-- [start:record_c1]
    def issued(self, call) -> None:
    # --8<-- [end:record_c1]
        """A collective was issued: one record per call, shared by every active log."""
        # --8<-- [start:record_c2]
        if call.record is None:
            size = call.elements * call.tensor.element_size()
            call.record = CommRecord(call.op, call.group.name, call.group.size,
                                     str(call.tensor.dtype).removeprefix("torch."), call.elements, size,
                                     ring_bytes(call.op, size, call.group.size) if call.op != "recv" else 0.0,
                                     time.perf_counter(), tag=call.tag)
            if _on_gpu(call.tensor):
                call.record.cuda_events = (_cuda_event(), None)
                call.record.cuda_events[0].record()
        self.records.append(call.record)
        # --8<-- [end:record_c2]
    # --8<-- [end:record]

    def waiting(self, call) -> None:
        if call.record is not None and call.record.wait is None:
            call.record.wait = time.perf_counter()

    def done(self, call) -> None:
        """The host time, and on CUDA an end event in stream order (after ``wait()``, the current stream has
        been made to wait for the collective, so the event completes when the collective does)."""
        rec = call.record
        if rec is not None and rec.end is None:
            rec.end = time.perf_counter()
            if rec.cuda_events is not None:
                rec.cuda_events = (rec.cuda_events[0], _cuda_event())
                rec.cuda_events[1].record()

    def _fold(self, dropped: list[CommRecord]) -> None:
        for r in dropped:
            row = self._folded[(r.op, r.group)]
            row["calls"] += 1
            row["bytes"] += r.bytes
            row["sent_bytes"] += r.sent_bytes
            row["wire_bytes"] += r.wire_bytes
            row["seconds"] += r.seconds

    def clear(self) -> None:
        self.records.clear()
        self._folded.clear()

    def total_sent(self, op: str | None = None, group: str | None = None, *, key: str = "sent_bytes") -> float:
        """Algorithmic bytes sent (the ring model); ``key="wire_bytes"``: what this rank's constructions sent."""
        kept = sum(getattr(r, key) for r in self.records
                   if (op is None or r.op == op) and (group is None or r.group == group))
        return kept + sum(row[key] for (o, g), row in self._folded.items()
                          if (op is None or o == op) and (group is None or g == group))

    def summary(self) -> dict:
        """{'by_op': {op: {calls, bytes, sent_bytes, seconds}}, 'by_group': {...}, 'sent_bytes': total}, over
        the whole run (the records dropped from the window included).

        ``sent_bytes`` are algorithmic (ring model over payload sizes); ``wire_bytes`` what the constructions
        `comm` ran put on the wire (headers aside: `measure.wire_bytes` measures those too)."""
        def table(index):
            out = defaultdict(_row)
            for key, row in self._folded.items():
                for k, v in row.items():
                    out[key[index]][k] += v
            for r in self.records:
                row = out[(r.op, r.group)[index]]
                row["calls"] += 1
                row["bytes"] += r.bytes
                row["sent_bytes"] += r.sent_bytes
                row["wire_bytes"] += r.wire_bytes
                row["seconds"] += r.seconds
            return dict(out)
        by_op = table(0)
        return {"by_op": by_op, "by_group": table(1), "sent_bytes": self.total_sent(),
                "wire_bytes": self.total_sent(key="wire_bytes"), "calls": sum(row["calls"] for row in by_op.values())}

    def events(self) -> list[dict]:
        """The records in the window as plain dicts (for reports, plots and JSON traces)."""
        return [dict(op=r.op, group=r.group, dtype=r.dtype, elements=r.elements, bytes=r.bytes,
                     sent_bytes=r.sent_bytes, wire_bytes=r.wire_bytes, start=r.start, end=r.end, wait=r.wait, tag=r.tag) for r in self.records]
