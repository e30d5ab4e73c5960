"""Collectives: the only module that calls `torch.distributed`'s communication functions.

Every call goes through here so that a `CommLog` can record what moved where: the op, the group,
the dtype, the element count, the payload and the bytes each rank *sends* under the ring model

    all-reduce      2(n-1)/n * S     (a reduce-scatter followed by an all-gather)
    reduce-scatter   (n-1)/n * S     S = the full (unsharded) buffer
    all-gather       (n-1)/n * S     S = the full (gathered) buffer
    broadcast, send  S

and the wall time. Recording is off unless a `CommLog` is active (``with log:``); then a call costs
one list check. Groups of one rank return immediately without touching torch.distributed, so the
single-process reference and a 4-rank job run the same code.

Only SUM is used on the wire (`ReduceOp.AVG` is not portable across backends): averaging is a
divide afterwards. Async calls return a `Handle` whose ``wait()`` also records completion time.

The byte counts are *algorithmic*: the ring model applied to tensor sizes, the yardstick the papers use.
What gloo really puts on the wire (its own algorithms, headers) is measured by `minimega.measure.wire_bytes`.

Two switches exist so that tests can see overlap rather than assume it (see [Note: a wire you can slow down]):
``overlap(False)`` makes every async call complete before it returns (DeepSpeed's ``overlap_comm=false``;
`TrainConfig.overlap_comm`), and ``delay(seconds)`` (or ``MINIMEGA_COMM_DELAY_MS``) makes each collective
occupy a simulated wire for that long.
"""
from __future__ import annotations

import os
import time
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


@dataclass(frozen=True)
class Group:
    """A process group with its member ranks and a name ('dp', 'tp', 'pp', 'world')."""

    pg: object
    ranks: list[int]
    name: str

    @property
    def size(self) -> int:
        return len(self.ranks)

    def rank_of(self, global_rank: int) -> int:
        return self.ranks.index(global_rank)

    def __repr__(self) -> str:
        return f"Group({self.name}, ranks={self.ranks})"


# ------------------------------------------------------------------------------------------------
# The log.

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
    cuda_events: tuple | None = None
    """On CUDA: (start, end) `torch.cuda.Event`s recorded on the current stream; they time the GPU's work,
    where the host clocks above only time the enqueue of an asynchronous kernel."""

    @property
    def seconds(self) -> float:
        if self.cuda_events is not None and self.cuda_events[1] is not None:
            self.cuda_events[1].synchronize()
            return self.cuda_events[0].elapsed_time(self.cuda_events[1]) / 1e3      # ms -> s
        return (self.end or self.start) - self.start


@dataclass
class CommLog:
    """Records collectives while active (``with log: ...``); summaries by op and by group."""

    records: list[CommRecord] = field(default_factory=list)

    def __enter__(self):
        _ACTIVE.append(self)
        return self

    def __exit__(self, *exc):
        _ACTIVE.remove(self)

    def clear(self) -> None:
        self.records.clear()

    def total_sent(self, op: str | None = None, group: str | None = None) -> float:
        return sum(r.sent_bytes for r in self.records
                   if (op is None or r.op == op) and (group is None or r.group == group))

    def summary(self) -> dict:
        """{'by_op': {op: {calls, bytes, sent_bytes, seconds}}, 'by_group': {...}, 'sent_bytes': total}.

        ``sent_bytes`` are algorithmic (ring model over payload sizes), not bytes measured on the wire."""
        def table(key):
            out = defaultdict(lambda: {"calls": 0, "bytes": 0, "sent_bytes": 0.0, "seconds": 0.0})
            for r in self.records:
                row = out[getattr(r, key)]
                row["calls"] += 1
                row["bytes"] += r.bytes
                row["sent_bytes"] += r.sent_bytes
                row["seconds"] += r.seconds
            return dict(out)
        return {"by_op": table("op"), "by_group": table("group"), "sent_bytes": self.total_sent(),
                "calls": len(self.records)}

    def events(self) -> list[dict]:
        """The records as plain dicts (for reports, plots and JSON traces)."""
        return [dict(op=r.op, group=r.group, dtype=r.dtype, elements=r.elements, bytes=r.bytes,
                     sent_bytes=r.sent_bytes, start=r.start, end=r.end, tag=r.tag) for r in self.records]


_ACTIVE: list[CommLog] = []
WATCH = None
"""In a rank that `minimega.launch` started: its `RankStatus`, told each collective entered and left, so
the launcher's watchdog can name the last collective a stuck rank entered."""


# --8<-- [start:record]
def _record(op: str, group: Group, tensor: torch.Tensor, elements: int, tag: str = "") -> CommRecord | None:
    if WATCH is not None:
        WATCH.enter(op, group.name)
    if not _ACTIVE:
        return None
    size = elements * tensor.element_size()
    rec = CommRecord(op, group.name, group.size, str(tensor.dtype).removeprefix("torch."), elements, size,
                     _RING_FACTOR[op](group.size) * size, time.perf_counter(), tag=tag)
    if _on_gpu(tensor):
        rec.cuda_events = (_cuda_event(), None)
        rec.cuda_events[0].record()
    for log in _ACTIVE:
        log.records.append(rec)
    return rec
# --8<-- [end:record]


# ------------------------------------------------------------------------------------------------
# Overlap switches.

# [Note: a wire you can slow down]
# On two CPU cores a collective of a tiny model takes microseconds, so "the all-reduce overlapped with
# backward" cannot be told apart from "it ran synchronously" by timing. With a delay D, each collective
# occupies one simulated wire per process for D seconds, one after another as on a real link:
#
#     ready_at = max(now, wire_free_at) + D;   wire_free_at = ready_at
#
# and its handle's wait() returns no earlier than ready_at. Compute done between issue and wait hides
# the delay; a synchronous call (or any call under ``overlap(False)``) pays all of it at once. A step of
# k collectives therefore costs about k·D more when nothing overlaps and much less when they are hidden.
#
# ``blocked_seconds()`` sums the time this process spent waiting for communication (inside ``wait()`` or a
# synchronous call): the exposed part of communication, which load on the machine does not inflate
# (slower compute only hides more), so tests compare it rather than noisy step times.
def _env_delay() -> float:
    text = os.environ.get("MINIMEGA_COMM_DELAY_MS", "0")
    try:
        ms = float(text)
    except ValueError:
        ms = float("nan")
    if not ms >= 0 or ms == float("inf"):
        raise ValueError(f"MINIMEGA_COMM_DELAY_MS={text!r}: set a number of milliseconds >= 0, or unset it")
    return ms / 1e3


_STATE = {"delay": _env_delay(), "overlap": True, "wire_free_at": 0.0, "blocked": 0.0}


def blocked_seconds() -> float:
    """Total seconds this process has spent blocked on collectives (waits and synchronous calls)."""
    return _STATE["blocked"]


@contextmanager
def delay(seconds: float):
    """Within the block, every collective over more than one rank takes at least ``seconds`` on the wire."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 <= seconds < float("inf"):
        raise ValueError(f"comm.delay: seconds must be a finite number >= 0, got {seconds!r}")
    old, _STATE["delay"] = _STATE["delay"], float(seconds)
    try:
        yield
    finally:
        _STATE["delay"] = old


@contextmanager
def overlap(enabled: bool = True):
    """``overlap(False)``: every ``async_op=True`` call completes before it returns (nothing overlaps)."""
    old, _STATE["overlap"] = _STATE["overlap"], bool(enabled)
    try:
        yield
    finally:
        _STATE["overlap"] = old


def _ready_at() -> float:
    """When a collective issued now is done on the simulated wire (now, without a delay)."""
    now = time.perf_counter()
    if _STATE["delay"] <= 0:
        return now
    _STATE["wire_free_at"] = max(now, _STATE["wire_free_at"]) + _STATE["delay"]
    return _STATE["wire_free_at"]


def _sleep_until(t: float) -> None:
    remaining = t - time.perf_counter()
    if remaining > 0:
        time.sleep(remaining)


class Handle:
    """In-flight communication; ``wait()`` blocks until it is done (and stamps the records' end time)."""

    def __init__(self, works=(), records=(), result=None, ready_at: float = 0.0, buffers=()):
        self._works = [w for w in works if w is not None]
        self._records = [r for r in records if r is not None]
        self._pending = bool(self._works)
        self._ready_at = ready_at
        self.result = result
        if self._pending and buffers:
            _in_flight(id(self), buffers)

    def wait(self):
        if self._pending:
            t = time.perf_counter()
            for work in self._works:
                work.wait()
            _sleep_until(self._ready_at)
            _STATE["blocked"] += time.perf_counter() - t
            self._works, self._pending = [], False
            if WATCH is not None:
                WATCH.leave()
            now = time.perf_counter()
            for rec in self._records:
                _stamp_end(rec, now)
            _in_flight(id(self), ())
        return self.result


# The buffers of collectives issued and not yet waited for, and callbacks run whenever that set changes
# (`measure.PeakTracker` samples memory there).
_IN_FLIGHT: dict = {"buffers": {}, "watchers": []}


def _in_flight(key, buffers) -> None:
    if buffers:
        _IN_FLIGHT["buffers"][key] = list(buffers)
    else:
        _IN_FLIGHT["buffers"].pop(key, None)
    for watch in _IN_FLIGHT["watchers"]:
        watch()


def in_flight_tensors() -> list[torch.Tensor]:
    """The input and output tensors of every collective issued and not yet complete."""
    return [t for ts in _IN_FLIGHT["buffers"].values() for t in ts]


@contextmanager
def watch_in_flight(callback):
    """Call ``callback()`` each time a collective is issued or completes (for memory sampling)."""
    _IN_FLIGHT["watchers"].append(callback)
    try:
        yield
    finally:
        _IN_FLIGHT["watchers"].remove(callback)


def _finish(work, rec, result, async_op, ready_at: float = 0.0, buffers=()):
    if async_op and _STATE["overlap"]:
        return Handle([work], [rec], result, ready_at, buffers)
    if work is not None:
        Handle([work], [rec], result, ready_at, buffers).wait()
    else:
        _sleep_until(ready_at)
        if WATCH is not None:
            WATCH.leave()
        if rec is not None:
            _stamp_end(rec, time.perf_counter())
    return Handle(result=result) if async_op else result


def _on_gpu(tensor: torch.Tensor) -> bool:
    return tensor.is_cuda


def _cuda_event():
    return torch.cuda.Event(enable_timing=True)


def _stamp_end(rec: CommRecord, now: float) -> None:
    """The host time, and on CUDA an end event in stream order (after ``wait()``, the current stream has
    been made to wait for the collective, so the event completes when the collective does)."""
    rec.end = now
    if rec.cuda_events is not None:
        rec.cuda_events = (rec.cuda_events[0], _cuda_event())
        rec.cuda_events[1].record()


# ------------------------------------------------------------------------------------------------
# Collectives.

# --8<-- [start:collectives]
# --8<-- [start:all_reduce]
def all_reduce(tensor: torch.Tensor, group: Group, *, async_op: bool = False, tag: str = ""):
    """Sum ``tensor`` in place over ``group``. Returns the tensor, or a `Handle` when async."""
    if group.size == 1:
        return Handle(result=tensor) if async_op else tensor
    rec = _record("all_reduce", group, tensor, tensor.numel(), tag)
    work = dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group.pg, async_op=True)
    return _finish(work, rec, tensor, async_op, _ready_at(), (tensor,))
# --8<-- [end:all_reduce]


def all_reduce_mean(tensor: torch.Tensor, group: Group, *, tag: str = "") -> torch.Tensor:
    """Average in place over ``group`` (a SUM, then a divide: portable across backends)."""
    all_reduce(tensor, group, tag=tag)
    if group.size > 1:
        tensor.div_(group.size)
    return tensor


def reduce_scatter(output: torch.Tensor, input: torch.Tensor, group: Group, *, async_op: bool = False,
                   tag: str = ""):
    """Sum ``input`` (n * k elements) over ``group``; rank i receives chunk i (k elements) in ``output``."""
    if input.numel() != output.numel() * group.size:
        raise ValueError(f"reduce_scatter: input has {input.numel()} elements, expected "
                         f"{output.numel()} * {group.size} = {output.numel() * group.size}")
    if group.size == 1:
        output.copy_(input.view_as(output))
        return Handle(result=output) if async_op else output
    rec = _record("reduce_scatter", group, input, input.numel(), tag)
    work = _reduce_scatter(output, input, op=dist.ReduceOp.SUM, group=group.pg, async_op=True)
    return _finish(work, rec, output, async_op, _ready_at(), (input, output))


def all_gather(output: torch.Tensor, input: torch.Tensor, group: Group, *, async_op: bool = False,
               tag: str = ""):
    """Concatenate every rank's ``input`` (k elements) into ``output`` (n * k elements), rank order."""
    if output.numel() != input.numel() * group.size:
        raise ValueError(f"all_gather: output has {output.numel()} elements, expected "
                         f"{input.numel()} * {group.size} = {input.numel() * group.size}")
    if group.size == 1:
        output.copy_(input.view_as(output))
        return Handle(result=output) if async_op else output
    rec = _record("all_gather", group, output, output.numel(), tag)
    work = _all_gather(output, input, group=group.pg, async_op=True)
    return _finish(work, rec, output, async_op, _ready_at(), (input, output))
# --8<-- [end:collectives]


def broadcast(tensor: torch.Tensor, src: int, group: Group, *, async_op: bool = False, tag: str = ""):
    """Copy ``tensor`` from global rank ``src`` to every rank of ``group``, in place."""
    if group.size == 1:
        return Handle(result=tensor) if async_op else tensor
    rec = _record("broadcast", group, tensor, tensor.numel(), tag)
    work = dist.broadcast(tensor, src=src, group=group.pg, async_op=True)
    return _finish(work, rec, tensor, async_op, _ready_at(), (tensor,))


def all_to_all(output: torch.Tensor, input: torch.Tensor, group: Group, *, tag: str = "") -> torch.Tensor:
    """Rank i sends chunk j of ``input`` (n equal chunks) to rank j and receives rank j's chunk i in ``output``."""
    if not (input.is_contiguous() and output.is_contiguous()):
        raise ValueError("all_to_all: input and output must be contiguous (the chunks are read and written as "
                         "flat memory); pass tensor.contiguous() and torch.empty(shape) buffers")
    if group.size == 1:
        return output.copy_(input)
    rec = _record("all_to_all", group, input, input.numel(), tag)
    dist.all_to_all_single(output, input, group=group.pg)
    return _finish(None, rec, output, False, _ready_at(), (input, output))


def send(tensor: torch.Tensor, dst: int, group: Group, *, tag: str = "") -> None:
    rec = _record("send", group, tensor, tensor.numel(), tag)
    dist.send(tensor, dst=dst, group=group.pg)
    _finish(None, rec, None, False, _ready_at(), (tensor,))


def recv(tensor: torch.Tensor, src: int, group: Group, *, tag: str = "") -> torch.Tensor:
    rec = _record("recv", group, tensor, tensor.numel(), tag)
    dist.recv(tensor, src=src, group=group.pg)
    return _finish(None, rec, tensor, False, _ready_at(), (tensor,))


@dataclass
class P2P:
    """One point-to-point transfer for `batch_p2p`: ``kind`` is 'send' or 'recv', ``peer`` a global rank."""

    kind: str
    tensor: torch.Tensor
    peer: int
    tag: str = ""


def batch_p2p(ops: list[P2P], group: Group) -> Handle:
    """Issue sends and receives together (no ordering deadlock between neighbours); wait on the handle."""
    if not ops:
        return Handle()
    records = [_record(op.kind, group, op.tensor, op.tensor.numel(), op.tag) for op in ops]
    fns = {"send": dist.isend, "recv": dist.irecv}
    works = dist.batch_isend_irecv([dist.P2POp(fns[op.kind], op.tensor, op.peer, group.pg) for op in ops])
    return Handle(works, records, [op.tensor for op in ops])


def barrier(group: Group) -> None:
    if group.size > 1:
        if WATCH is not None:
            WATCH.enter("barrier", group.name)
        dist.barrier(group=group.pg)
        if WATCH is not None:
            WATCH.leave()


def all_gather_object(obj, group: Group) -> list:
    """Gather any picklable object from every rank of ``group`` (for reports, not for tensors)."""
    if group.size == 1:
        return [obj]
    out = [None] * group.size
    if WATCH is not None:
        WATCH.enter("all_gather_object", group.name)
    dist.all_gather_object(out, obj, group=group.pg)
    if WATCH is not None:
        WATCH.leave()
    return out
