"""Asynchronous checkpoints: take a snapshot now, write the files while the next steps train.

A blocking save stops every rank for the whole write: the shard bytes go to disk, are hashed and fsynced,
and only then does the next step start. Here the rank pays only for a copy of what it owns:

    Phase 1 (training thread, every rank): wait for the previous save (at most one is in flight); copy the
             tensors `saving.prepare` names into host buffers (kept from one save to the next): on the CPU a
             plain copy; on CUDA a copy on a side stream into pinned memory, which the training stream waits
             for (an event) before its next kernels can overwrite the weights. The CPU thread does not wait.
    Phase 2 (a background thread, every rank): once the copy is done, `saving.commit`, the same atomic commit
             as a blocking save: write and fsync the shard, gather the chunk lists, rank 0 writes and fsyncs the
             manifest and publishes the directory. Its collectives run on a gloo group of its own, so they never
             interleave with the training thread's, and are not announced to `comm`'s observers (the watchdog
             and the logs follow the training thread).

A kill during phase 2 leaves a ``.tmp-step-N`` directory and nothing else: ``latest`` still names the previous
checkpoint, complete. The cost is host memory for one copy of the rank's state (torch DCP's ``async_save``
and DeepSpeed's Nebula make the same trade).
"""
from __future__ import annotations

import os
import threading
from contextlib import nullcontext
from pathlib import Path

import torch

from ..comm import Group
from .manifest import step_dir
from .saving import commit, prepare


# --8<-- [start:snapshot]
def snapshot(items: list, buffers: list | None = None) -> tuple[list, object]:
    """``items`` with every tensor replaced by a host copy, and the CUDA event after which the copies hold their
    values (None when nothing came from a GPU). ``buffers``: host tensors from the previous snapshot, reused
    where shape and dtype agree."""
    cuda = [t.device for *_, t in items if t.is_cuda]
    side = torch.cuda.Stream(cuda[0]) if cuda else None
    if side is not None:
        side.wait_stream(torch.cuda.current_stream(cuda[0]))     # copy what the step just wrote
    out = []
    with torch.cuda.stream(side) if side is not None else nullcontext():
        for i, (key, dtype, shape, t) in enumerate(items):
            old = buffers[i] if buffers and i < len(buffers) else None
            host = old if old is not None and old.dtype == t.dtype and old.shape == t.shape else \
                torch.empty(t.shape, dtype=t.dtype, pin_memory=t.is_cuda)
            host.copy_(t.detach(), non_blocking=t.is_cuda)
            if t.is_cuda:
                t.record_stream(side)
            out.append((key, dtype, shape, host))
    if side is None:
        return out, None
    done = side.record_event()
    torch.cuda.current_stream(cuda[0]).wait_event(done)   # the next kernels overwrite the weights after the copy
    return out, done
# --8<-- [end:snapshot]


class AsyncSaver:
    """One rank's asynchronous saves: at most one in flight, committed by a background thread.

    Every rank calls `start` at the same step (as for a blocking save) and `wait` before anything that needs the
    checkpoint on disk (the next save, a load, the end of training)."""

    def __init__(self, mesh):
        self.mesh, self._thread, self._error, self._buffers = mesh, None, None, None
        self.path: Path | None = None
        """The checkpoint of the save started last."""
        self.stats: dict = {}
        """``bytes_written`` by this rank in the save committed last."""
        world = mesh.world
        if world.size > 1:                              # every rank creates it, at the first save, in step
            import torch.distributed as dist
            world = Group(dist.new_group(world.ranks, backend="gloo"), world.ranks, "save")
        self.group = world

    @property
    def in_flight(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # --8<-- [start:async_start]
    def start(self, engine, directory: str | os.PathLike, keep: int = 3) -> Path:
        """Snapshot this rank's state and return; the files are written and committed in the background."""
        self.wait()                                      # at most one save in flight
        job = prepare(engine, directory)                 # views of this rank's memory ...
        job.items, ready = snapshot(job.items, self._buffers)   # ... copied before the next step changes them
        self._buffers = [t for *_, t in job.items]
        self.path = job.root / step_dir(job.step)
        self._thread = threading.Thread(target=self._commit, args=(job, ready, keep), daemon=True,
                                        name=f"minimega-save-{job.step}")
        self._thread.start()
        return self.path

    def _commit(self, job, ready, keep: int) -> None:
        try:
            if ready is not None:
                ready.synchronize()                      # the copies on the side stream are done
            stats: dict = {}
            commit(job, self.group, keep, stats, observed=False)
            self.stats = stats
        except BaseException as exc:                     # handed to the training thread by `wait`
            self._error = exc
    # --8<-- [end:async_start]

    def wait(self) -> None:
        """Block until the save in flight is committed (on every rank: the commit ends in a barrier); raise its
        error, if it had one."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise RuntimeError(f"checkpoint: the asynchronous save to {self.path} failed: "
                               f"{type(error).__name__}: {error}") from error
