"""The disk tier (ZeRO-Infinity, arXiv:2104.07857): each unit's fp32 master shard and optimizer states in a file.

`NVMeOffloadStore` is `CPUOffloadStore` with one more level: the gradient shards still arrive in host
memory and the step still runs on the host, but between steps a unit's master shard and Adam's
``exp_avg`` and ``exp_avg_sq`` live in one raw file of fixed size under ``nvme_path``:

    unit{i}.bin = [ master (n) | exp_avg (n) | exp_avg_sq (n) | zeros to a 4 KiB multiple ]    fp32, 12n bytes + pad

(SGD without momentum keeps no state: only the first 4n bytes, padded, move.) Torch's 0-d ``step`` counters stay in
memory. The step's reads and writes go to the disk itself: each file is opened with ``O_DIRECT`` and moved whole,
4 KiB-aligned (``ALIGN``), into and out of ``IN_FLIGHT_UNITS`` = 3 staging buffers carved from one anonymous
``mmap`` (page-aligned, as ``O_DIRECT`` wants; registered as pinned memory on CUDA). The page cache is bypassed,
so the bytes really come from storage (``/proc/self/io``'s ``read_bytes``; `storage` counts them per step). A
file system that refuses ``O_DIRECT`` (tmpfs) is named in one line on stderr and the files go through the page
cache instead. A pool of 2 I/O threads pipelines the units:

    Phase 1 (read ahead):  unit i+1's file is read into a free buffer while unit i is updated;
    Phase 2 (update):      torch's optimizer steps on unit i's buffer (its master and states point
                           there), and the updated master is copied into the parameter shard;
    Phase 3 (write behind): unit i's buffer is written back to its file while unit i+1 is updated.

So at most 3 staging buffers' bytes are in flight (read, updated or written: <= 3 x the largest padded unit
file), whatever the model's size; the files themselves are not held in host memory. Per step every file is read
once and written once: 2 x 12 bytes per element of this rank's shards under Adam
(`minimega.estimate.nvme_bytes_per_step`; the padding adds less than 4 KiB per unit). The step drains its writes
before it returns, so between steps the files hold every value. Each file's space is allocated when it is made
(``posix_fallocate``: a full drive fails there, and the rank's folder is removed, not in the middle of a step),
and the file is unlinked as soon as it is open and mapped (as ``tmpfile()`` does): it takes space on that drive
only while the process lives (``/proc/<pid>/fd`` lists it) and vanishes with the process however it ends.
Outside the step (a checkpoint, ``full_state_dict``) the master and states are read and written through a shared
memory map of the same files; the kernel writes back a page dirtied there before a direct read of it, and drops
its cached pages after a direct write, so both views stay coherent and every other part of the engine works
unchanged. Only those occasional accesses go through the page cache.

On CUDA the staging buffers are pinned, so the parameter upload from them is an asynchronous copy on the
offload copy stream; a buffer is refilled only after its upload has completed.
"""
from __future__ import annotations

import errno
import mmap
import os
import shutil
import sys
import tempfile
import weakref
from concurrent.futures import ThreadPoolExecutor

import torch

from ..run import measure
from .offload import CPUOffloadStore, MasterStore

IN_FLIGHT_UNITS = 3
"""Staging buffers: one unit being read, one being updated, one being written."""
ALIGN = 4096
"""O_DIRECT's safe alignment of buffer addresses, lengths and file offsets (open(2): the logical block size
divides it on the drives in use)."""
_WARNED: set = set()


def aligned(nbytes: int) -> int:
    """``nbytes`` rounded up to a multiple of `ALIGN`."""
    return -(-nbytes // ALIGN) * ALIGN


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


def open_direct(path: str) -> int | None:
    """``path`` opened for reading and writing with ``O_DIRECT``, or None where the file system refuses it
    (EINVAL at open: tmpfs); the caller then goes through the page cache."""
    try:
        return os.open(path, os.O_RDWR | os.O_DIRECT)
    except OSError as e:
        if e.errno != errno.EINVAL:
            raise
        return None


def storage_io() -> dict:
    """This process's bytes fetched from and sent to the storage layer so far (``/proc/self/io``; page-cache
    hits excluded; every thread of the process counted)."""
    with open("/proc/self/io") as f:
        fields = dict(line.split(":") for line in f if line.strip())
    return {"read_bytes": int(fields["read_bytes"]), "write_bytes": int(fields["write_bytes"])}


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


def _cleanup(fds: list[int], pool: ThreadPoolExecutor, directory: str, pinned: list) -> None:
    pool.shutdown(wait=True)
    for fd in fds:
        os.close(fd)
    for ptr in pinned:
        torch.cuda.cudart().cudaHostUnregister(ptr)
    shutil.rmtree(directory, ignore_errors=True)


def staging_buffers(slots: int, slot_bytes: int, pin: bool) -> torch.Tensor:
    """(slots, slot_bytes / 4) fp32 staging buffers in one anonymous mmap: page-aligned, each slot a multiple of
    `ALIGN` long, so every slot meets O_DIRECT's rules; pinned (registered with CUDA) when ``pin``."""
    region = mmap.mmap(-1, slots * slot_bytes)
    buffers = torch.frombuffer(region, dtype=torch.float32).view(slots, slot_bytes // 4)
    if buffers.data_ptr() % ALIGN:
        raise RuntimeError(f"staging buffers at {buffers.data_ptr():#x}: not {ALIGN}-aligned")
    if pin:
        torch.cuda.cudart().cudaHostRegister(buffers.data_ptr(), slots * slot_bytes, 0)
    return buffers


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
        self.direct = True                                        # O_DIRECT on every file (False: page cache)
        self.io = ThreadPoolExecutor(max_workers=2, thread_name_prefix="nvme")   # a read and a write at once
        self._pinned: list = []
        self._finalizer = weakref.finalize(self, _cleanup, self.fds, self.io, self.directory, self._pinned)
        try:
            super().__init__(shards, make_optimizer)             # each master is made by _master_of: on disk
        except BaseException:
            self._finalizer()                                     # a failed start leaves no folder behind
            raise
        os.rmdir(self.directory)                                 # empty: each file was unlinked once open
        if not self.direct and nvme_path not in _WARNED:
            _WARNED.add(nvme_path)
            print(f"minimega: nvme_path={nvme_path!r} refuses O_DIRECT (tmpfs?): the NVMe tier goes through the "
                  "page cache there, so it saves no host memory; point --nvme-path at a block device", file=sys.stderr)
        self.state_names = _state_names(self.optimizer)
        self.width = 1 + len(self.state_names)                   # fp32 values per shard element in a file
        self.io_bytes = [aligned(m.numel() * 4 * self.width) for m in self.master]      # moved per unit, padded
        self.staging = staging_buffers(IN_FLIGHT_UNITS, max(self.io_bytes), self.pin)  # (buffers, elements)
        if self.pin:
            self._pinned.append(self.staging.data_ptr())
        self.in_flight_bound = self.staging.numel() * 4          # bytes read, updated or written at once, at most
        self.disk = [self._views(i) for i in range(len(self.master))]   # the states as they rest between steps
        self.uploads: list = [None] * IN_FLIGHT_UNITS            # per buffer: the event its upload recorded
        self.traffic = {"read": 0, "written": 0}                 # payload bytes moved by the last step
        self.total = {"read": 0, "written": 0}                   # payload bytes moved by every step so far
        self.storage = {"read_bytes": 0, "write_bytes": 0}       # /proc/self/io over the last step
        self.storage_total = {"read_bytes": 0, "write_bytes": 0, "steps": 0}

    def _master_of(self, shard: torch.Tensor) -> torch.Tensor:
        """Unit i's file, its space allocated for the master and the states (zeros); the master written, then the
        file opened again with O_DIRECT; returns the master's view of the file's shared mapping."""
        i, n = len(self.paths), shard.numel()
        path = os.path.join(self.directory, f"unit{i:03d}.bin")
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        self.paths.append(path)
        self.fds.append(fd)
        size = aligned(n * 4 * 3)                                 # room for Adam; SGD uses the first third
        try:
            os.posix_fallocate(fd, 0, size)
        except OSError as e:
            if e.errno != errno.ENOSPC:
                raise
            raise OSError(errno.ENOSPC, f"nvme_path: no space left for unit {i}'s {size:,} bytes in "
                                        f"{self.directory!r}; free space or point --nvme-path at a larger drive") from None
        master = shard.detach().to(device="cpu", dtype=torch.float32).contiguous()
        _pwrite(fd, memoryview(master.numpy()).cast("B"), path)
        zeros = bytes(min(size, 1 << 20))                         # the states' zeros, written: an allocated but
        for offset in range(n * 4, size, len(zeros)):             # unwritten extent reads back without the disk
            os.pwrite(fd, zeros[:size - offset], offset)
        os.fsync(fd)                                              # on the drive, then out of the page cache
        os.posix_fadvise(fd, 0, size, os.POSIX_FADV_DONTNEED)
        direct = open_direct(path)
        if direct is None:
            self.direct = False
        else:
            self.fds[i] = direct
            os.close(fd)
        self.files.append(torch.from_file(path, shared=True, size=size // 4, dtype=torch.float32))
        os.unlink(path)          # open and mapped: the space is freed when the process ends, however it ends
        return self.files[i][:n]

    def _views(self, i: int) -> dict:
        """Unit i's states as views of its memory-mapped file (what they are between steps)."""
        n = self.master[i].numel()
        return {name: self.files[i][(k + 1) * n:(k + 2) * n] for k, name in enumerate(self.state_names)}

    def _buffer(self, slot: int, i: int) -> torch.Tensor:
        return self.staging[slot, :self.master[i].numel() * self.width]

    def _raw(self, slot: int, i: int) -> memoryview:
        """The bytes of a staging buffer one transfer of unit i's file moves: a multiple of `ALIGN`, aligned."""
        return memoryview(self.staging[slot].numpy()).cast("B")[:self.io_bytes[i]]

    def _read(self, i: int, slot: int) -> int:
        """Phase 1 (an I/O thread): unit i's file into a staging buffer."""
        _pread(self.fds[i], self._raw(slot, i), self.paths[i])
        return self.master[i].numel() * 4 * self.width

    def _write(self, i: int, slot: int) -> int:
        """Phase 3 (an I/O thread): the staging buffer back into unit i's file."""
        _pwrite(self.fds[i], self._raw(slot, i), self.paths[i])
        return self.master[i].numel() * 4 * self.width

    def _update(self, i: int, slot: int, grad: torch.Tensor) -> None:
        """Phase 2: torch's optimizer steps unit i with its master and states pointing into the buffer."""
        m, n = self.master[i], self.master[i].numel()
        views = self._buffer(slot, i).view(self.width, n)         # (1 + states, n)
        state = self.optimizer.state[m]
        disk = self.disk[i]
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
        before = storage_io()
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
        after = storage_io()
        self.storage = {k: after[k] - before[k] for k in after}
        self.storage_total = {"steps": self.storage_total["steps"] + 1,
                              **{k: self.storage_total[k] + v for k, v in self.storage.items()}}
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
                "host_grads": measure.tensor_bytes(self.host_grads), "staging": self.staging.numel() * 4,
                "nvme": sum(m.numel() * 4 * self.width for m in self.master)}
