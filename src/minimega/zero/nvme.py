"""The disk tier (ZeRO-Infinity, arXiv:2104.07857): each unit's fp32 master shard and optimizer states in a file.

`NVMeOffloadStore` is `CPUOffloadStore` with one more level: the gradient shards still arrive in host
memory and the step still runs on the host, but between steps a unit's master shard and Adam's
``exp_avg`` and ``exp_avg_sq`` live in one raw file of fixed size under ``nvme_path``:

    unit{i}.bin = [ master (n) | exp_avg (n) | exp_avg_sq (n) ]    fp32, n = the unit's shard, 12n bytes

(SGD without momentum keeps no state: only the first 4n bytes move.) Torch's 0-d ``step`` counters stay in memory. At the
step a small pool of I/O threads pipelines the units through ``IN_FLIGHT_UNITS`` = 3 staging buffers:

    Phase 1 (read ahead):  unit i+1's file is read into a free buffer while unit i is updated;
    Phase 2 (update):      torch's optimizer steps on unit i's buffer (its master and states point
                           there), and the updated master is copied into the parameter shard;
    Phase 3 (write behind): unit i's buffer is written back to its file while unit i+1 is updated.

So at most 3 units' files are in host memory at once (bytes in flight <= 3 x the largest unit file),
whatever the model's size. Per step every file is read once and written once: 2 x 12 bytes per element
of this rank's shards under Adam (`minimega.estimate.nvme_bytes_per_step`). The step drains its writes
before it returns, so between steps the files hold every value. Each file is unlinked as soon as it
is open and mapped (as ``tmpfile()`` does): it takes space on that drive only while the process lives
(``/proc/<pid>/fd`` lists it) and vanishes with the process however it ends, a kill or a restart
included. Outside the step (a checkpoint,
``full_state_dict``) the master and states are read and written through a shared memory map of the same
files (the page cache keeps both views coherent), so every other part of the engine works unchanged.

On CUDA the staging buffers are pinned, so the parameter upload from them is an asynchronous copy on the
offload copy stream; a buffer is refilled only after its upload has completed.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import weakref
from concurrent.futures import ThreadPoolExecutor

import torch

from ..run import measure
from .offload import CPUOffloadStore, MasterStore

IN_FLIGHT_UNITS = 3
"""Staging buffers: one unit being read, one being updated, one being written."""


def check_directory(nvme_path: str) -> None:
    """Refuses, by name, an ``nvme_path`` that is not an existing directory this user can write into."""
    if not isinstance(nvme_path, (str, os.PathLike)) or not str(nvme_path):
        raise ValueError(f"nvme_path={nvme_path!r}: expected the path of a directory (--nvme-path DIR)")
    if not os.path.isdir(nvme_path):
        what = "does not exist" if not os.path.exists(nvme_path) else "is not a directory"
        raise ValueError(f"nvme_path={str(nvme_path)!r} {what}: create the directory or point --nvme-path at one")
    if not os.access(nvme_path, os.W_OK | os.X_OK):
        raise ValueError(f"nvme_path={str(nvme_path)!r} is not writable: choose a directory this user can write")


def rank_directory(nvme_path: str, rank: int) -> str:
    """A fresh directory for this rank's files under ``nvme_path``, which must be a writable directory."""
    check_directory(nvme_path)
    return tempfile.mkdtemp(prefix=f"minimega-rank{rank}-", dir=nvme_path)


def _whole(io, fd: int, buf: memoryview, path: str, verb: str) -> int:
    """All of ``buf`` through ``io`` (os.preadv or os.pwritev) from offset 0: a short transfer continues where it
    stopped, none at all is an error naming the file."""
    done = 0
    while done < len(buf):
        n = io(fd, [buf[done:]], done)
        if n <= 0:
            raise OSError(f"{path}: {verb} {done} of {len(buf)} bytes")
        done += n
    return done


def _pread(fd: int, buf: memoryview, path: str) -> int:
    return _whole(os.preadv, fd, buf, path, "file ended after")


def _pwrite(fd: int, buf: memoryview, path: str) -> int:
    return _whole(os.pwritev, fd, buf, path, "wrote")


def _state_names(optimizer: torch.optim.Optimizer) -> tuple[str, ...]:
    """The per-element states the optimizer keeps; refuses an optimizer whose states this store cannot place."""
    if isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW)):
        if any(g.get("amsgrad") for g in optimizer.param_groups):
            raise ValueError("NVMe offload: amsgrad keeps a third state; use Adam/AdamW without amsgrad")
        return ("exp_avg", "exp_avg_sq")
    if isinstance(optimizer, torch.optim.SGD) and all(g["momentum"] == 0 for g in optimizer.param_groups):
        return ()
    raise ValueError(f"NVMe offload: {type(optimizer).__name__} is not supported; use AdamW, Adam or SGD")


def _cleanup(fds: list[int], pool: ThreadPoolExecutor, directory: str) -> None:
    pool.shutdown(wait=True)
    for fd in fds:
        os.close(fd)
    shutil.rmtree(directory, ignore_errors=True)


# --8<-- [start:nvme_store]
class NVMeOffloadStore(CPUOffloadStore):
    """ZeRO-Infinity's disk tier for the optimizer: master shards and states in files, streamed through 3 buffers.

    Args:
        shards, make_optimizer: as `MasterStore`.
        nvme_path: an existing writable directory; this store's files go in a fresh directory under it.
        rank: this process's global rank (in the directory's name).
    """

    location = "nvme"

    def __init__(self, shards: list[torch.Tensor], make_optimizer, nvme_path: str, rank: int = 0):
        if any(s.is_meta for s in shards):
            raise ValueError("NVMe offload needs real tensors (a dry run has none): drop nvme_path there")
        self.directory = rank_directory(nvme_path, rank)
        self.paths, self.fds, self.files = [], [], []            # per unit: path, descriptor, mapped tensor
        self.io = ThreadPoolExecutor(max_workers=2, thread_name_prefix="nvme")   # a read and a write at once
        self._finalizer = weakref.finalize(self, _cleanup, self.fds, self.io, self.directory)
        super().__init__(shards, make_optimizer)                 # each master is made by _master_of: on disk
        os.rmdir(self.directory)                                 # empty: each file was unlinked once open
        self.state_names = _state_names(self.optimizer)
        self.width = 1 + len(self.state_names)                   # fp32 values per shard element in a file
        biggest = max(m.numel() for m in self.master) * self.width
        self.staging = torch.empty(IN_FLIGHT_UNITS, biggest, pin_memory=self.pin)    # (buffers, elements)
        self.uploads: list = [None] * IN_FLIGHT_UNITS            # per buffer: the event its upload recorded
        self.traffic = {"read": 0, "written": 0}                 # bytes moved by the last step
        self.total = {"read": 0, "written": 0}                   # bytes moved by every step so far

    def _master_of(self, shard: torch.Tensor) -> torch.Tensor:
        """Unit i's file, sized for the master and the states (zeros); the master written; returns its mapping."""
        i, n = len(self.paths), shard.numel()
        path = os.path.join(self.directory, f"unit{i:03d}.bin")
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        self.paths.append(path)
        self.fds.append(fd)
        os.ftruncate(fd, n * 4 * 3)                               # room for Adam; SGD uses the first third
        master = shard.detach().to(device="cpu", dtype=torch.float32).contiguous()
        _pwrite(fd, memoryview(master.numpy()).cast("B"), path)
        self.files.append(torch.from_file(path, shared=True, size=n * 3, dtype=torch.float32))
        os.unlink(path)          # open and mapped: the space is freed when the process ends, however it ends
        return self.files[i][:n]

    def _on_disk(self, i: int) -> dict:
        """Unit i's master and states as views of its memory-mapped file (what they are between steps)."""
        n = self.master[i].numel()
        return {name: self.files[i][(k + 1) * n:(k + 2) * n] for k, name in enumerate(self.state_names)}

    def _buffer(self, slot: int, i: int) -> torch.Tensor:
        return self.staging[slot, :self.master[i].numel() * self.width]

    def _read(self, i: int, slot: int) -> int:
        """Phase 1 (an I/O thread): unit i's file into a staging buffer."""
        return _pread(self.fds[i], memoryview(self._buffer(slot, i).numpy()).cast("B"), self.paths[i])

    def _write(self, i: int, slot: int) -> int:
        """Phase 3 (an I/O thread): the staging buffer back into unit i's file."""
        return _pwrite(self.fds[i], memoryview(self._buffer(slot, i).numpy()).cast("B"), self.paths[i])

    def _update(self, i: int, slot: int, grad: torch.Tensor) -> None:
        """Phase 2: torch's optimizer steps unit i with its master and states pointing into the buffer."""
        m, n = self.master[i], self.master[i].numel()
        views = self._buffer(slot, i).view(self.width, n)         # (1 + states, n)
        state = self.optimizer.state[m]
        disk = self._on_disk(i)
        for k, name in enumerate(self.state_names):
            if name in state and state[name] is not disk[name]:   # replaced outside the step: adopt it
                views[k + 1].copy_(state[name])
            elif name not in state:                               # no state yet (a fresh run or a load without)
                views[k + 1].zero_()
            state[name] = views[k + 1]
        if self.state_names and "step" not in state:
            state["step"] = torch.tensor(0.0)                     # what torch's Adam starts with
        at_rest = m.data
        m.data, m.grad = views[0], grad
        self.optimizer.step()                                     # every other master's grad is None: skipped
        with self.copies.copying():
            self.copies.copy(self.shards[i], views[0])            # the parameters, in their dtype
        self.uploads[slot] = getattr(self.copies, "done", None)
        m.data, m.grad = at_rest, None
        state.update(disk)                                        # stale until the write lands: step() drains

    # --8<-- [start:nvme_step]
    @torch.no_grad()
    def step(self) -> None:
        """Phases 1-3 pipelined over the units: read i+1 and write i-1 while i is updated."""
        grads = [m.grad for m in self.master]
        for m in self.master:
            m.grad = None
        free, reads, writes = list(range(IN_FLIGHT_UNITS)), {}, []
        traffic = {"read": 0, "written": 0}

        def read_ahead(i: int) -> None:
            if not free:                                          # all buffers busy: wait for the oldest write
                slot, future = writes.pop(0)
                traffic["written"] += future.result()
                free.append(slot)
            slot = free.pop(0)
            if self.uploads[slot] is not None:                    # its last upload must have read it
                self.uploads[slot].synchronize()
                self.uploads[slot] = None
            reads[i] = slot, self.io.submit(self._read, i, slot)

        units = [i for i, g in enumerate(grads) if g is not None]
        if units:
            read_ahead(units[0])
        for k, i in enumerate(units):
            slot, future = reads.pop(i)
            traffic["read"] += future.result()
            if k + 1 < len(units):
                read_ahead(units[k + 1])
            self._update(i, slot, grads[i])
            writes.append((slot, self.io.submit(self._write, i, slot)))
        for _, future in writes:
            traffic["written"] += future.result()
        for m, g in zip(self.master, grads):
            m.grad = g
        if units:
            self.copies.compute_waits()                           # the next forward reads the parameters
        self.traffic = traffic
        self.total = {k: self.total[k] + v for k, v in traffic.items()}
    # --8<-- [end:nvme_step]
# --8<-- [end:nvme_store]

    def close(self) -> None:
        """Close the files (also done when the store is collected; their space goes with the last mapping)."""
        self._finalizer()

    def memory(self) -> dict:
        """Host memory: the gradient shards, the staging buffers and the step counters; the rest is on disk."""
        states = measure.optimizer_state_tensors(self.optimizer)
        return {"master": 0, "optimizer_states": 0,
                "optimizer_step_counters": measure.tensor_bytes(t for t in states if t.dim() == 0),
                "host_grads": measure.tensor_bytes(self.host_grads), "staging": measure.tensor_bytes([self.staging]),
                "nvme": sum(m.numel() * 4 * self.width for m in self.master)}
