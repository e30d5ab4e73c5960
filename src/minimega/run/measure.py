"""Measured bytes per rank, by category: what each rank really holds, counted tensor by tensor.

Counting resident tensors is exact and repeatable (unlike RSS or the profiler's memory timeline, which
vary run to run on CPU), so tests can compare these numbers with `minimega.analysis` exactly.
Tensors that share storage are counted once.
"""
from __future__ import annotations

import weakref
from contextlib import contextmanager
from typing import Iterable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .. import comm


def storage_id(t: torch.Tensor) -> int:
    """The identity of the storage behind ``t``, shared by all its views.

    Not its address: a meta tensor (`minimega dry-run`) has a size but no address (every ``data_ptr()`` is
    0), and an emptied storage (ZeRO-3's reshard) has none either; the storage object itself is unique.
    """
    return t.untyped_storage()._cdata


def same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    return storage_id(a) == storage_id(b)


def tensor_bytes(tensors: Iterable[torch.Tensor | None], seen: set | None = None) -> int:
    """Bytes of the distinct storages behind ``tensors`` (None entries are skipped)."""
    seen = set() if seen is None else seen
    total = 0
    for t in tensors:            # the peak tracker calls this after every op: `storage_id` inlined, no isinstance
        if t is None:            # (a tensor's isinstance check is a metaclass call: a third of this loop's time)
            continue
        try:
            storage = t.untyped_storage()
        except AttributeError:   # not a tensor
            continue
        key = storage._cdata
        if key not in seen:
            seen.add(key)
            total += storage.nbytes()
    return total


def optimizer_state_tensors(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """Every tensor in an optimizer's state (Adam's exp_avg, exp_avg_sq, step)."""
    return [v for state in optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor)]


def model_state_bytes(module: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None) -> dict:
    """{'params', 'grads', 'optimizer_states', 'optimizer_step_counters'} bytes of an unsharded module.

    'optimizer_states' are the moments (Adam's m and v: the ZeRO paper's K); torch keeps one 0-d
    ``step`` counter per parameter tensor besides, counted apart.
    """
    params = list(module.parameters())
    states = optimizer_state_tensors(optimizer) if optimizer else []
    return {
        "params": tensor_bytes(params),
        "grads": tensor_bytes(p.grad for p in params),
        "optimizer_states": tensor_bytes(t for t in states if t.dim() > 0),
        "optimizer_step_counters": tensor_bytes(t for t in states if t.dim() == 0),
    }


# ------------------------------------------------------------------------------------------------
# Peaks through forward and backward.

# [Note: how the peak is sampled]
# Bytes at rest say nothing about the moment a ZeRO-3 rank holds two gathered units, the saved
# activations and the gradient buffers in flight together. `PeakTracker` samples every category after
# every tensor operation (a TorchDispatchMode, which autograd's backward on this thread runs under too),
# whenever a collective is issued or completes (its `InFlight` observer of `comm`), and whenever autograd saves a
# tensor for backward. Each sample counts distinct storages once, in the order of `CATEGORIES`: a
# parameter saved by a matmul is a parameter, not an activation; a gathered unit that is also an
# all-gather's output is gathered, not a comm buffer.
CATEGORIES = ("params", "gathered", "master", "grads", "optimizer_states", "optimizer_step_counters",
              "comm_buffers", "activations")


class _SampleEveryOp(TorchDispatchMode):
    def __init__(self, sample):
        super().__init__()
        self._sample = sample

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not func.is_view:        # a view allocates nothing (half the ops of a step): no category can grow in it
            self._sample()
        return out


class _Saved:
    """What autograd keeps instead of a saved tensor while tracking: the tensor, registered as live."""

    __slots__ = ("tensor", "live", "__weakref__")

    def __init__(self, tensor: torch.Tensor, live: dict):
        self.tensor, self.live = tensor, live
        live[id(self)] = tensor

    def __del__(self):
        self.live.pop(id(self), None)


class InFlight:
    """An observer of `minimega.comm`: the buffers of every collective issued and not yet done, and a
    callback each time that set changes (the peak tracker samples memory there)."""

    def __init__(self, on_change=None):
        self.buffers: dict[int, tuple] = {}
        self.on_change = on_change

    def issued(self, call) -> None:
        self.buffers[id(call)] = call.buffers
        self._changed()

    def waiting(self, call) -> None:
        pass

    def done(self, call) -> None:
        if self.buffers.pop(id(call), None) is not None:
            self._changed()

    def tensors(self) -> list[torch.Tensor]:
        return [t for ts in self.buffers.values() for t in ts]

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()


class PeakTracker:
    """Peak bytes by category (`CATEGORIES`) while active (``with tracker.track(): ...``).

    Args:
        state: ``() -> {category: tensors}`` for the model-state categories (params, gathered, master,
            grads, optimizer_states, optimizer_step_counters) at the moment it is called, and the reduce
            buffer pools (comm_buffers, held whether or not a reduction is in flight); the buffers of
            collectives in flight (beyond those) and activations (tensors saved for backward) are tracked here.

    ``peak[c]`` is the largest value category ``c`` reached; ``peak["total"]`` the largest sum at one
    moment and ``at_peak`` the categories at that moment.
    """

    def __init__(self, state):
        self.state = state
        self.peak = {c: 0 for c in (*CATEGORIES, "total")}
        self.at_peak: dict = {}
        self._live: dict[int, torch.Tensor] = {}
        self._busy = False
        self.in_flight = InFlight(on_change=self.sample)

    def sample(self) -> None:
        if self._busy:
            return
        self._busy = True
        try:
            seen: set = set()
            now = {c: 0 for c in CATEGORIES}
            for c, tensors in self.state().items():
                now[c] += tensor_bytes(tensors, seen)
            now["comm_buffers"] += tensor_bytes(self.in_flight.tensors(), seen)     # beyond the pools' (state)
            now["activations"] = tensor_bytes(list(self._live.values()), seen)
            for c, v in now.items():
                self.peak[c] = max(self.peak[c], v)
            total = sum(now.values())
            if total > self.peak["total"]:
                self.peak["total"], self.at_peak = total, now
        finally:
            self._busy = False

    def _pack(self, t: torch.Tensor):
        saved = _Saved(t, self._live)
        self.sample()
        return saved

    @staticmethod
    def _unpack(saved: _Saved) -> torch.Tensor:
        return saved.tensor

    @contextmanager
    def track(self):
        with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack), \
                comm.observing(self.in_flight), _SampleEveryOp(self.sample):
            self.sample()
            yield self
        self.sample()

    def report(self) -> dict:
        return {**self.peak, "at_peak_total": dict(self.at_peak)}


_PARAMETERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _parameters(module: torch.nn.Module) -> list[torch.Tensor]:
    """A wrapper's parameters, listed once: the peak tracker asks after every op, and walking the module tree
    each time was most of a tracked step (a wrapped module keeps its parameter objects for its whole life)."""
    if module not in _PARAMETERS:
        _PARAMETERS[module] = list(module.parameters())
    return _PARAMETERS[module]


def state_tensors(dp_wrappers, optimizer=None) -> dict[str, list[torch.Tensor]]:
    """The model-state tensors of one rank's device by category, for `PeakTracker` (an offloading store's
    host tensors are left out: on a CPU-only run too, they are not the device's).

    Args:
        dp_wrappers: the rank's data-parallel wrappers (`DataParallel` or a ZeRO stage), one per chunk.
        optimizer: the torch optimizer for DDP (ZeRO stages carry their own).
    """
    out = {c: [] for c in (*CATEGORIES[:6], "comm_buffers")}
    for w in dp_wrappers:
        if hasattr(w, "units"):                                    # a ZeRO stage
            for u, s in zip(w.units, w.shards):
                # A unit sharded at rest (ZeRO-3) keeps its shard in storage of its own; its full flat
                # buffer is then a gathered copy, present only between unshard and reshard.
                if not same_storage(s, u.flat):
                    out["params"].append(s)
                    out["gathered"].append(u.flat)
                else:
                    out["params"].append(u.flat)
            out["grads"] += list(w.grad_buffers()) + [p.grad for u in w.units for p in u.params]
            out["grads"] += list(getattr(w, "main_grads", {}).values())     # bf16: the fp32 accumulators
            out["comm_buffers"] += w.pool.tensors() if getattr(w, "pool", None) else []    # reduce buffers, reused
            states = []
            if w.store.location == "device":      # offloaded (CPUOffloadStore): host memory, not this device's
                out["master"] += list(w.store.master)
                out["grads"] += [m.grad for m in w.store.master]
                states = optimizer_state_tensors(w.store.optimizer)
        else:
            params, low = _parameters(w), getattr(w, "low_copies", [])
            out["params"] += low or params                              # DDP in 16 bits: its copies; the
            out["master"] += [getattr(w, "_master", {}).get(p, p.data) for p in params] if low else []   # fp32
            out["grads"] += [p.grad for p in params] + list(getattr(w, "main_grads", {}).values())
            states = optimizer_state_tensors(optimizer) if optimizer is not None else []
        out["optimizer_states"] += [t for t in states if t.dim() > 0]
        out["optimizer_step_counters"] += [t for t in states if t.dim() == 0]
    return out


# ------------------------------------------------------------------------------------------------
# What gloo really sends.

# [Note: algorithmic bytes and wire bytes]
# `comm.CommLog` counts the ring model applied to tensor sizes: the bytes a bandwidth-optimal algorithm
# must send, the yardstick of the papers. What a backend sends can differ: its own algorithm and message
# headers. Gloo's all-reduce is a ring (``gloo/allreduce.cc``: a ring reduce-scatter, then a ring all-gather,
# in segments). Its fused reduce-scatter and all-gather are not used (`comm.collectives._in_place_only`: they go through a
# temporary buffer per call); `comm` builds the all-gather from n broadcasts, the ring's bytes, and the
# reduce-scatter from n reduces: each reduce is a ring reduce-scatter of its chunk and then a gather of the
# pieces to its root, (1 + 1/n) times the ring model in all. (Torch's fused gloo reduce-scatter is an
# all-reduce of the whole input: twice the model.) The log's ``wire_bytes`` counts the (1 + 1/n); `wire_bytes` measures it on the sockets themselves: the
# kernel's per-socket ``tcpi_bytes_sent`` (TCP payload bytes, headers of the TCP/IP layers excluded, gloo's own included).
_TCPI_BYTES_SENT = 200          # offsets of tcpi_bytes_sent and tcpi_bytes_retrans (u64) in struct tcp_info
_TCPI_BYTES_RETRANS = 208       # (Linux >= 4.19); a retransmitted segment is sent twice but delivered once


def tcp_bytes_sent() -> int:
    """Payload bytes this process has sent on all its TCP sockets so far, retransmissions not counted
    twice (Linux ``TCP_INFO``: tcpi_bytes_sent - tcpi_bytes_retrans)."""
    import os
    import socket
    import struct
    total = 0
    for name in os.listdir("/proc/self/fd"):
        try:
            fd = os.dup(int(name))
        except (OSError, ValueError):
            continue                                    # closed meanwhile (e.g. the listing's own fd)
        try:
            s = socket.socket(fileno=fd)
        except OSError:
            os.close(fd)                                # not a socket
            continue
        try:
            if s.family in (socket.AF_INET, socket.AF_INET6) and s.type == socket.SOCK_STREAM:
                info = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
                if len(info) >= _TCPI_BYTES_RETRANS + 8:
                    sent, retrans = struct.unpack_from("QQ", info, _TCPI_BYTES_SENT)
                    total += sent - retrans
        except OSError:
            pass
        finally:
            s.close()
    return total


WIRE_OPS = ("all_reduce", "reduce_scatter", "all_gather")


def wire_bytes(op: str, numel: int, group: comm.Group, repeats: int = 3) -> float:
    """Bytes this rank sends per call of ``op`` on a full buffer of ``numel`` fp32 elements, measured.

    Call on every rank of ``group`` together (it runs the collective ``repeats`` times between two
    readings of `tcp_bytes_sent`; nothing else may communicate meanwhile).
    """
    if op not in WIRE_OPS:
        raise ValueError(f"wire_bytes: op={op!r}; choose one of {WIRE_OPS}")
    if numel % group.size:
        raise ValueError(f"wire_bytes: numel={numel} must be a multiple of the group size {group.size}")
    full = torch.ones(numel)
    shard = torch.ones(numel // group.size)
    run = {"all_reduce": lambda: comm.all_reduce(full, group),
           "reduce_scatter": lambda: comm.reduce_scatter(shard, full, group),
           "all_gather": lambda: comm.all_gather(full, shard, group)}[op]
    run()                                                   # connections and buffers warm
    comm.barrier(group)
    before = tcp_bytes_sent()
    for _ in range(repeats):
        run()
    sent = tcp_bytes_sent() - before
    comm.barrier(group)
    return sent / repeats


def wire_table(numels: list[int], ops=WIRE_OPS) -> list[dict]:
    """Measured vs ring-model bytes per rank for each op and size, on the world group (run on every rank),
    and the bytes per call the `CommLog` counted as sent on the wire (``logged``)."""
    import torch.distributed as dist
    group = comm.Group(None, list(range(dist.get_world_size())), "world")
    rows = []
    for op in ops:
        for numel in numels:
            with comm.CommLog() as log:
                measured = wire_bytes(op, numel, group)
            calls = log.summary()["by_op"][op]["calls"]
            rows.append({"op": op, "ranks": group.size, "bytes": numel * 4, "measured": measured,
                         "model": comm.ring_bytes(op, numel * 4, group.size),
                         "logged": log.total_sent(op, key="wire_bytes") / calls})
    return rows
