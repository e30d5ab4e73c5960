"""Collectives: the only module that calls `torch.distributed`'s communication functions.

Every call goes through here and is announced to the attached observers (`comm.observers`): issued,
waited on, done. That one interface is how the `CommLog` (``comm/log.py``: what moved where, in ring-model
bytes), the simulated wire (``comm/wire.py``), the launcher's watchdog (``run/watchdog.py``) and the peak-memory
tracker (``run/measure.py``) see the traffic; the collectives themselves do nothing else. Groups of one rank
return immediately without touching torch.distributed, so the single-process reference and a 4-rank job
run the same code.

Only SUM is used on the wire (`ReduceOp.AVG` is not portable across backends): averaging is a divide
afterwards. Async calls return a `Handle`; its ``wait()`` is when the rank blocks.

``overlap(False)`` makes every async call complete before it returns (DeepSpeed's ``overlap_comm=false``;
`TrainConfig.overlap_comm`); ``delay(seconds)`` (or ``MINIMEGA_COMM_DELAY_MS``) makes each collective occupy
a simulated wire for that long (see ``comm/wire.py``), so tests can see overlap rather than assume it.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from .log import CommLog, CommRecord, ring_bytes  # noqa: F401  (the log is read as comm.CommLog)
from .observers import OBSERVERS, attach, detach, notify, observing  # noqa: F401
from .wire import WIRE, blocked_seconds, delay  # noqa: F401

attach(WIRE)        # the simulated wire first: it sleeps before the other observers stamp their times

_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def _in_place_only(group: "Group", tensor: torch.Tensor) -> bool:
    """Gloo on the CPU: build all-gathers and reduce-scatters from in-place collectives.

    Gloo runs an all-gather or a reduce-scatter through a temporary buffer as big as the whole tensor, a new
    one per call, and glibc keeps the freed blocks: a ZeRO-3 rank's memory then grows with every unit gathered,
    the opposite of what ZeRO is for. A broadcast and a reduce work in the tensor they are given. So an
    all-gather is n broadcasts (rank k sends chunk k into everyone's output) and a reduce-scatter n reduces
    (chunk k summed into rank k's copy): the ring's bytes for the gather, (1 + 1/n) times them for the
    reduce-scatter (`measure`'s note). NCCL has no such temporaries and keeps the fused calls."""
    return tensor.device.type == "cpu" and tensor.is_contiguous() and dist.get_backend(group.pg) == "gloo"


def _reduces_wire_factor(n: int) -> float:
    """Bytes n in-place reduces send per rank, over the ring's reduce-scatter bytes: (n-1)/n·S/n per reduce
    for the reduce-scatter of its chunk (n of them), and the gather to the root, S/n² from each other rank."""
    return 1 + 1 / n


# --8<-- [start:in_place_calls]
# --8<-- [start:in_place_calls_c1]
def _gather_by_broadcasts(output: torch.Tensor, input: torch.Tensor, group: "Group") -> list:
# --8<-- [end:in_place_calls_c1]
    """All-gather as n broadcasts: rank k's chunk goes straight into chunk k of every rank's ``output``."""
    # --8<-- [start:in_place_calls_c2]
    chunks = output.view(group.size, -1)
    if chunks[group.rank].data_ptr() != input.data_ptr():
        chunks[group.rank].copy_(input.view(-1))
    return [dist.broadcast(chunks[k], src=r, group=group.pg, async_op=True) for k, r in enumerate(group.ranks)]


def _reduce_scatter_by_reduces(input: torch.Tensor, group: "Group") -> list:
    # --8<-- [end:in_place_calls_c2]
    """Reduce-scatter as n reduces: chunk k of ``input`` is summed into rank k's own copy of it.

    Of the in-place constructions this is the cheapest on the wire: gloo's reduce of a chunk is a ring
    reduce-scatter of it, then a gather of the pieces to its root, so each rank sends (1 + 1/n) times the
    ring's (n-1)/n · S (`_reduces_wire_factor`). An in-place all-reduce of the whole input and a slice sends 2 times
    it (gloo's own reduce-scatter is that all-reduce plus a full-size temporary). Measured by
    ``bench/reduce_scatter_gloo.py``: 1.50x against 2.00x at 2 ranks, 1.25x against 2.00x at 4, peak RSS
    flat for both."""
    # --8<-- [start:in_place_calls_c3]
    chunks = input.view(group.size, -1)
    return [dist.reduce(chunks[k], dst=r, op=dist.ReduceOp.SUM, group=group.pg, async_op=True)
            for k, r in enumerate(group.ranks)]
    # --8<-- [end:in_place_calls_c3]
# --8<-- [end:in_place_calls]


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

    @property
    def rank(self) -> int:
        """This process's rank within the group (0 in a group of one, with or without a process group)."""
        return 0 if self.size == 1 else self.rank_of(dist.get_rank())

    def __repr__(self) -> str:
        return f"Group({self.name}, ranks={self.ranks})"


# --8<-- [start:call]
@dataclass(eq=False)
class Call:
    """One collective as the observers see it."""

    op: str
    group: Group
    tensor: torch.Tensor
    """The payload (its dtype and device); ``elements`` of it count."""
    elements: int
    tag: str = ""
    buffers: tuple = ()
    """The tensors in flight until it is done."""
    record: CommRecord | None = None            # set by the first CommLog that sees it
    ready_at: float = 0.0                       # set by the simulated wire
    wait_start: float = 0.0
    extra: dict = field(default_factory=dict)


def _issue(op: str, group: Group, tensor: torch.Tensor, elements: int, tag: str = "", buffers=()) -> Call:
    call = Call(op, group, tensor, elements, tag, tuple(buffers))
    notify("issued", call)
    return call
# --8<-- [end:call]


_STATE = {"overlap": True}


@contextmanager
def overlap(enabled: bool = True):
    """``overlap(False)``: every ``async_op=True`` call completes before it returns (nothing overlaps)."""
    old, _STATE["overlap"] = _STATE["overlap"], bool(enabled)
    try:
        yield
    finally:
        _STATE["overlap"] = old


class Handle:
    """In-flight communication; ``wait()`` blocks until it is done (the observers hear both moments)."""

    def __init__(self, calls=(), works=(), result=None, then=None):
        self._calls = list(calls)
        self._works = [w for w in works if w is not None]
        self._pending = bool(self._calls)
        self._then = then
        self.result = result

    def wait(self):
        if self._pending:
            self._pending = False
            for call in self._calls:
                notify("waiting", call)
            for work in self._works:
                work.wait()
            if self._then is not None:
                self._then()
            for call in self._calls:
                notify("done", call)
        return self.result


def _finish(call: Call, works: list, result, async_op: bool, then=None):
    """An async call returns its `Handle`; a synchronous one (or any under ``overlap(False)``) waits now.
    ``then``: run once the works are done, before the handle's waiter goes on."""
    handle = Handle([call], works, result, then)
    if async_op and _STATE["overlap"]:
        return handle
    handle.wait()
    return Handle(result=result) if async_op else result


def _blocking(call: Call, fn, result=None):
    """A call torch.distributed only offers synchronously: the rank waits in it from the start."""
    notify("waiting", call)
    fn()
    notify("done", call)
    return result


# ------------------------------------------------------------------------------------------------
# Collectives.

# --8<-- [start:collectives]
# --8<-- [start:all_reduce]
# --8<-- [start:all_reduce_c1]
def all_reduce(tensor: torch.Tensor, group: Group, *, async_op: bool = False, tag: str = ""):
# --8<-- [end:all_reduce_c1]
    """Sum ``tensor`` in place over ``group``. Returns the tensor, or a `Handle` when async."""
    # --8<-- [start:all_reduce_c2]
    if group.size == 1:
        return Handle(result=tensor) if async_op else tensor
    call = _issue("all_reduce", group, tensor, tensor.numel(), tag, (tensor,))
    work = dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group.pg, async_op=True)
    return _finish(call, [work], tensor, async_op)
    # --8<-- [end:all_reduce_c2]
# --8<-- [end:all_reduce]


def all_reduce_mean(tensor: torch.Tensor, group: Group, *, tag: str = "") -> torch.Tensor:
    """Average in place over ``group`` (a SUM, then a divide: portable across backends)."""
    all_reduce(tensor, group, tag=tag)
    if group.size > 1:
        tensor.div_(group.size)
    return tensor


def reduce_scatter(output: torch.Tensor, input: torch.Tensor, group: Group, *, async_op: bool = False,
                   tag: str = ""):
    """Sum ``input`` (n * k elements) over ``group``; rank i receives chunk i (k elements) in ``output``.

    ``input`` is scratch: its values afterwards are unspecified (on gloo the sums are built inside it)."""
    if input.numel() != output.numel() * group.size:
        raise ValueError(f"reduce_scatter: input has {input.numel()} elements, expected "
                         f"{output.numel()} * {group.size} = {output.numel() * group.size}")
    if group.size == 1:
        output.copy_(input.view_as(output))
        return Handle(result=output) if async_op else output
    call = _issue("reduce_scatter", group, input, input.numel(), tag, (input, output))
    if _in_place_only(group, input):             # this rank's chunk of the sum is copied out once it is in
        mine = input.view(group.size, -1)[group.rank]
        if call.record is not None:              # a CommLog saw it: count what the n reduces send
            call.record.wire_bytes = call.record.sent_bytes * _reduces_wire_factor(group.size)
        works = _reduce_scatter_by_reduces(input, group)
        return _finish(call, works, output, async_op, then=lambda: output.view(-1).copy_(mine))
    work = _reduce_scatter(output, input, op=dist.ReduceOp.SUM, group=group.pg, async_op=True)
    return _finish(call, [work], output, async_op)


def all_gather(output: torch.Tensor, input: torch.Tensor, group: Group, *, async_op: bool = False,
               tag: str = ""):
    """Concatenate every rank's ``input`` (k elements) into ``output`` (n * k elements), rank order."""
    if output.numel() != input.numel() * group.size:
        raise ValueError(f"all_gather: output has {output.numel()} elements, expected "
                         f"{input.numel()} * {group.size} = {input.numel() * group.size}")
    if group.size == 1:
        output.copy_(input.view_as(output))
        return Handle(result=output) if async_op else output
    call = _issue("all_gather", group, output, output.numel(), tag, (input, output))
    if _in_place_only(group, output):
        return _finish(call, _gather_by_broadcasts(output, input, group), output, async_op)
    work = _all_gather(output, input, group=group.pg, async_op=True)
    return _finish(call, [work], output, async_op)
# --8<-- [end:collectives]


def broadcast(tensor: torch.Tensor, src: int, group: Group, *, async_op: bool = False, tag: str = ""):
    """Copy ``tensor`` from global rank ``src`` to every rank of ``group``, in place."""
    if group.size == 1:
        return Handle(result=tensor) if async_op else tensor
    call = _issue("broadcast", group, tensor, tensor.numel(), tag, (tensor,))
    work = dist.broadcast(tensor, src=src, group=group.pg, async_op=True)
    return _finish(call, [work], tensor, async_op)


def all_to_all(output: torch.Tensor, input: torch.Tensor, group: Group, *, tag: str = "",
               send_rows: list[int] | None = None, recv_rows: list[int] | None = None) -> torch.Tensor:
    """Rank i sends chunk j of ``input`` (n equal chunks) to rank j and receives rank j's chunk i in ``output``.

    ``send_rows``/``recv_rows`` (both or neither): variable chunks along dim 0, ``send_rows[j]`` rows of
    ``input`` to rank j and ``recv_rows[j]`` rows from it; the log's sent bytes are then the rows that leave."""
    if not (input.is_contiguous() and output.is_contiguous()):
        raise ValueError("all_to_all: input and output must be contiguous (the chunks are read and written as "
                         "flat memory); pass tensor.contiguous() and torch.empty(shape) buffers")
    if (send_rows is None) != (recv_rows is None):
        raise ValueError("all_to_all: give both send_rows and recv_rows, or neither")
    if group.size == 1:
        return output.copy_(input)
    if send_rows is None:
        call = _issue("all_to_all", group, input, input.numel(), tag, (input, output))
        return _blocking(call, lambda: dist.all_to_all_single(output, input, group=group.pg), output)
    row = input[0].numel() if input.shape[0] else output[0].numel() if output.shape[0] else 0
    call = _issue("all_to_all", group, input, input.numel(), tag, (input, output))
    if call.record is not None:      # a CommLog saw it: the ring model would assume equal chunks
        call.record.sent_bytes = call.record.wire_bytes = \
            (input.shape[0] - send_rows[group.rank]) * row * input.element_size()
    return _blocking(call, lambda: dist.all_to_all_single(output, input, recv_rows, send_rows, group=group.pg),
                     output)


def send(tensor: torch.Tensor, dst: int, group: Group, *, tag: str = "") -> None:
    call = _issue("send", group, tensor, tensor.numel(), tag, (tensor,))
    _blocking(call, lambda: dist.send(tensor, dst=dst, group=group.pg))


def recv(tensor: torch.Tensor, src: int, group: Group, *, tag: str = "") -> torch.Tensor:
    call = _issue("recv", group, tensor, tensor.numel(), tag, (tensor,))
    return _blocking(call, lambda: dist.recv(tensor, src=src, group=group.pg), tensor)


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
    calls = [_issue(op.kind, group, op.tensor, op.tensor.numel(), op.tag, (op.tensor,)) for op in ops]
    fns = {"send": dist.isend, "recv": dist.irecv}
    works = dist.batch_isend_irecv([dist.P2POp(fns[op.kind], op.tensor, op.peer, group.pg) for op in ops])
    return Handle(calls, works, [op.tensor for op in ops])


_NOTHING = torch.empty(0)       # the payload of calls that carry none a log counts (barrier, objects)


def barrier(group: Group, *, observed: bool = True) -> None:
    """Wait until every rank of ``group`` arrives. ``observed=False``: not announced to the observers (they follow
    the training thread; a background thread's calls on a group of its own, like the async checkpoint's, stay out)."""
    if group.size > 1:
        if observed:
            _blocking(Call("barrier", group, _NOTHING, 0), lambda: dist.barrier(group=group.pg))
        else:
            dist.barrier(group=group.pg)


def any_rank(flag: bool, group: Group) -> bool:
    """Whether ``flag`` is set on any rank of ``group``: one all-reduce of one number, every rank gets the answer.

    Not announced to the observers: it is the training loop's question (has a preemption notice come?), not the
    model's traffic, so no `CommLog` counts it. A rank that stops answering is still named by its heartbeat."""
    if group.size == 1:
        return bool(flag)
    vote = torch.tensor([1 if flag else 0], dtype=torch.int32)
    if dist.get_backend(group.pg) == "nccl":
        vote = vote.cuda()
    dist.all_reduce(vote, op=dist.ReduceOp.SUM, group=group.pg)
    return bool(vote.item())


def all_gather_object(obj, group: Group, *, observed: bool = True) -> list:
    """Gather any picklable object from every rank of ``group`` (for reports, not for tensors); ``observed``: as in
    `barrier`."""
    if group.size == 1:
        return [obj]
    out = [None] * group.size
    if not observed:
        dist.all_gather_object(out, obj, group=group.pg)
        return out
    return _blocking(Call("all_gather_object", group, _NOTHING, 0), lambda: dist.all_gather_object(out, obj, group=group.pg),
                     out)
