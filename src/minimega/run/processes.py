"""The ranks as processes: a forkserver that has imported torch once, and how ranks are started, named,
tied to their parent and stopped. `run/launch.py` decides what runs and reads what comes back."""
from __future__ import annotations

import ctypes
import multiprocessing as mp
import os
import signal
import threading
import sys
import time
from contextlib import contextmanager
from pathlib import Path


def die_with_parent() -> None:
    """Ask Linux to SIGKILL this rank if its parent (the forkserver) goes away. The launcher, which is not
    the parent, is watched by `_guard`; this one also reaches a rank that is stopped (SIGSTOP)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)   # PR_SET_PDEATHSIG
    except OSError:
        pass


def name_process(name: str) -> None:
    """Show ``minimega-rank3`` in ps/top (the kernel keeps 15 bytes)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(15, name.encode()[:15], 0, 0, 0)   # PR_SET_NAME
    except OSError:
        pass


M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3          # glibc's mallopt() parameters (malloc.h)


def allocator_policy() -> str:
    """``MINIMEGA_MALLOC``: "" (the ranks keep what they free) or "glibc"; anything else refused by name."""
    choice = os.environ.get("MINIMEGA_MALLOC", "")
    if choice not in ("", "glibc"):
        raise ValueError(f"MINIMEGA_MALLOC={choice!r}: the one value is 'glibc' (glibc's own allocator policy); "
                         "unset it for the ranks' default (freed memory kept)")
    return choice


def keep_freed_memory() -> None:
    """Keep the blocks this rank frees for its next tensors, instead of handing them back to the kernel.

    glibc serves a large allocation with a fresh mmap and unmaps it on free (past a threshold it adapts
    as it goes), so a tensor that outlives the next few allocations can send every later one to the
    kernel for zeroed pages again: under ZB-H1 (gradients kept from B to W) the last stage took ~14,000
    page faults per step, 1F1B ~5 (`bench/zb_split.py` prints both). With the threshold fixed at 1 GiB
    and the heap's free top kept, a step reuses the last step's memory: what jemalloc or tcmalloc do for
    PyTorch on CPU. ``MINIMEGA_MALLOC=glibc`` leaves glibc's defaults (to measure the difference); any
    other value is refused."""
    if allocator_policy() == "glibc":
        return
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:                                  # not glibc (musl, macOS): its allocator, its defaults
        return
    libc.mallopt(M_MMAP_THRESHOLD, 1 << 30)          # fixed, so blocks under 1 GiB come from the heap
    libc.mallopt(M_TRIM_THRESHOLD, 1 << 30)          # the heap's free top kept up to 1 GiB


_CONTEXT = None
_SOURCE_STAMP: float | None = None        # minimega's source mtime when the running forkserver started


def source_stamp() -> float:
    """The newest mtime among minimega's own source files: an edit makes the preloaded copy stale."""
    root = Path(__file__).parents[1]                 # the package (this file is in minimega/run/)
    return max((p.stat().st_mtime for p in root.rglob("*.py")), default=0.0)


def stop_forkserver() -> None:
    """Stop the forkserver (alive or dead); the next start launches a fresh one."""
    from multiprocessing import forkserver
    server = forkserver._forkserver
    try:
        server._stop()
    except (ChildProcessError, OSError):            # it had died already: forget it
        with server._lock:
            server._forkserver_pid = server._forkserver_alive_fd = server._forkserver_address = None


def forkserver_context():
    """A forkserver that has imported torch once; every later rank is a cheap fork of it.

    It is restarted when minimega's source changed since it started (its preloaded modules would run the
    old code); a forkserver that died is restarted by multiprocessing itself on the next start.
    """
    global _CONTEXT, _SOURCE_STAMP
    if _CONTEXT is None:
        if "forkserver" in mp.get_all_start_methods():
            _CONTEXT = mp.get_context("forkserver")
            # torch._dynamo too: every torch.optim.Optimizer imports it on construction, which costs each
            # rank seconds (measured 2-15 s per launch on 2 busy cores) unless the forkserver already holds it.
            _CONTEXT.set_forkserver_preload(["torch", "torch.distributed", "torch._dynamo", "minimega.train.engine",
                                           "minimega.run.launch"])
        else:
            _CONTEXT = mp.get_context("spawn")
    if _CONTEXT.get_start_method() == "forkserver":
        stamp = source_stamp()
        if _SOURCE_STAMP is not None and stamp != _SOURCE_STAMP:
            stop_forkserver()
        _SOURCE_STAMP = stamp
    return _CONTEXT


class ForkserverDied(RuntimeError):
    """The forkserver went away while ranks were being started."""


def start_all(procs: list) -> None:
    """Start every rank; if the forkserver dies under us, stop those started and say so."""
    try:
        for p in procs:
            p.start()
    except (EOFError, ConnectionError, FileNotFoundError, OSError) as exc:
        terminate(procs)
        raise ForkserverDied(f"{type(exc).__name__}: {exc or 'connection closed'}") from None


@contextmanager
def main_module_hidden():
    """Start ranks without re-running the caller's ``__main__`` script in each of them.

    multiprocessing normally re-imports the main script in every child (hence the usual
    ``if __name__ == "__main__"`` guard). Ranks never need it: workers must live in importable modules.
    """
    main = sys.modules.get("__main__")
    saved = {k: main.__dict__[k] for k in ("__file__", "__spec__") if main is not None and k in main.__dict__}
    try:
        if main is not None:
            main.__dict__.pop("__file__", None)
            main.__spec__ = None
        yield
    finally:
        if main is not None:
            main.__dict__.update(saved)
            if "__spec__" not in saved:
                del main.__spec__


def terminate(procs: list, grace: float = 2.0) -> None:
    procs = [p for p in procs if p.pid is not None]          # only those that started
    for p in procs:
        if p.is_alive():
            p.terminate()
            try:
                os.kill(p.pid, signal.SIGCONT)               # a stopped rank takes SIGTERM only once resumed
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + grace
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join(5)


def forward_signals_to(signals: tuple, procs: list) -> dict:
    """Pass each of ``signals`` on to the live ranks as SIGUSR1; returns the handlers it replaced (main thread only)."""
    if not signals or threading.current_thread() is not threading.main_thread():
        return {}

    def notice(signum, frame):
        for p in procs:
            if p.pid is not None and p.exitcode is None:
                try:
                    os.kill(p.pid, signal.SIGUSR1)
                except ProcessLookupError:
                    pass
    return {s: signal.signal(s, notice) for s in signals}


def end_rank(code: int) -> None:
    """End a rank that a scheduler started (srun, torchrun) with ``code``, its work done and saved.

    Python's teardown can only turn a good status into a bad one: gloo's worker threads may still hold
    tensors when the interpreter is torn down, and taking the GIL there aborts the process (status 134,
    "terminate called without an active exception"), where Slurm's job script waits for 75 ("requeue me").
    So the process group is destroyed while Python is whole, the output flushed, and the process left at once.
    """
    import torch.distributed as dist
    try:
        if dist.is_initialized():
            dist.destroy_process_group()
    finally:
        sys.stdout.flush(), sys.stderr.flush()
        os._exit(code)
