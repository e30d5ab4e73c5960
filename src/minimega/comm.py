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
"""
from __future__ import annotations

import time
from collections import defaultdict
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
    """Bytes this rank sends under the ring model."""
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
        """{'by_op': {op: {calls, bytes, sent_bytes, seconds}}, 'by_group': {...}, 'sent_bytes': total}."""
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


class Handle:
    """In-flight communication; ``wait()`` blocks until it is done (and stamps the records' end time)."""

    def __init__(self, works=(), records=(), result=None):
        self._works = [w for w in works if w is not None]
        self._records = [r for r in records if r is not None]
        self.result = result

    def wait(self):
        if self._works:
            for work in self._works:
                work.wait()
            self._works = []
            if WATCH is not None:
                WATCH.leave()
            now = time.perf_counter()
            for rec in self._records:
                _stamp_end(rec, now)
        return self.result

    def is_completed(self) -> bool:
        return all(w.is_completed() for w in self._works)


def _finish(work, rec, result, async_op):
    if async_op:
        return Handle([work], [rec], result)
    if WATCH is not None:
        WATCH.leave()
    if rec is not None:
        _stamp_end(rec, time.perf_counter())
    return result


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
def all_reduce(tensor: torch.Tensor, group: Group, *, async_op: bool = False, tag: str = ""):
    """Sum ``tensor`` in place over ``group``. Returns the tensor, or a `Handle` when async."""
    if group.size == 1:
        return Handle(result=tensor) if async_op else tensor
    rec = _record("all_reduce", group, tensor, tensor.numel(), tag)
    work = dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group.pg, async_op=async_op)
    return _finish(work, rec, tensor, async_op)


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
    work = _reduce_scatter(output, input, op=dist.ReduceOp.SUM, group=group.pg, async_op=async_op)
    return _finish(work, rec, output, async_op)


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
    work = _all_gather(output, input, group=group.pg, async_op=async_op)
    return _finish(work, rec, output, async_op)
# --8<-- [end:collectives]


def broadcast(tensor: torch.Tensor, src: int, group: Group, *, async_op: bool = False, tag: str = ""):
    """Copy ``tensor`` from global rank ``src`` to every rank of ``group``, in place."""
    if group.size == 1:
        return Handle(result=tensor) if async_op else tensor
    rec = _record("broadcast", group, tensor, tensor.numel(), tag)
    work = dist.broadcast(tensor, src=src, group=group.pg, async_op=async_op)
    return _finish(work, rec, tensor, async_op)


def send(tensor: torch.Tensor, dst: int, group: Group, *, tag: str = "") -> None:
    rec = _record("send", group, tensor, tensor.numel(), tag)
    dist.send(tensor, dst=dst, group=group.pg)
    _finish(None, rec, None, False)


def recv(tensor: torch.Tensor, src: int, group: Group, *, tag: str = "") -> torch.Tensor:
    rec = _record("recv", group, tensor, tensor.numel(), tag)
    dist.recv(tensor, src=src, group=group.pg)
    return _finish(None, rec, tensor, False)


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
