"""Run one function on `world_size` ranks and bring back what each returned.

`launch(fn, world_size, *args)` starts one process per rank, joins them into a process group through
a rendezvous *file* (no fixed ports, so parallel test runs never collide), calls `fn(*args)` on
every rank and returns the results in rank order.

Failure is the common case when learning, so the launcher is built around it:

- a rank that raises: its traceback is written to a file; the caller gets one `WorkerError` naming
  the rank, the exception and the original traceback;
- a rank that dies without raising (``os._exit``, a signal, a crash in native code): the parent sees
  the exit code and reports that instead;
- either way the surviving ranks are terminated at once, so a peer blocked in a collective never
  keeps the caller waiting; ``timeout`` bounds everything else (a deadlock among live ranks).

Workers are forked from a *forkserver* that has already imported torch and minimega, so starting a
rank costs a fork instead of a fresh 3-second ``import torch``. Under ``torchrun`` (RANK and
WORLD_SIZE set in the environment) nothing is spawned: this process is one rank, it joins the group
from the environment, runs ``fn`` and gathers every rank's result.
"""
from __future__ import annotations

import ctypes
import multiprocessing as mp
import os
import pickle
import signal
import sys
import tempfile
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

__all__ = ["launch", "WorkerError", "LaunchTimeout", "resolve_backend", "current_world_size"]

_ENV_FLAG = "MINIMEGA_WORKER"          # set in spawned ranks, so a nested launch() is refused clearly


class WorkerError(RuntimeError):
    """A rank failed. ``rank`` is the first rank that failed; ``remote_traceback`` is its traceback."""

    def __init__(self, message: str, rank: int, exc_type: str = "", remote_traceback: str = ""):
        super().__init__(message)
        self.rank, self.exc_type, self.remote_traceback = rank, exc_type, remote_traceback


class LaunchTimeout(WorkerError, TimeoutError):
    """The job ran past ``timeout``; every rank was killed."""


def resolve_backend(backend: str, world_size: int) -> str:
    """'auto' means NCCL with one GPU per rank when enough GPUs exist, else gloo on CPU."""
    if backend == "auto":
        return "nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= world_size else "gloo"
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend={backend!r}; choose 'auto', 'gloo' or 'nccl'")
    if backend == "nccl" and torch.cuda.device_count() < world_size:
        raise ValueError(f"backend='nccl' needs one GPU per rank: world_size={world_size} but "
                         f"{torch.cuda.device_count()} CUDA device(s) are visible; use backend='gloo'")
    return backend


def current_world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


# ------------------------------------------------------------------------------------------------
# Checks made before any process starts.

def _check_picklable(fn, args) -> None:
    name = getattr(fn, "__qualname__", repr(fn))
    module = getattr(fn, "__module__", None)
    if not callable(fn):
        raise TypeError(f"launch() needs a function to run on every rank, got {type(fn).__name__}")
    if name == "<lambda>" or "<locals>" in name:
        raise TypeError(f"launch() cannot send {name!r} to other processes: lambdas and nested functions "
                        "cannot be pickled. Define the worker at module level in an importable .py file.")
    if module == "__main__" and not hasattr(sys.modules.get("__main__"), "__file__"):
        raise TypeError(f"launch() cannot send {name!r} to other processes: it was defined in a notebook "
                        "cell or an interactive session (module __main__). Put the worker in a .py file next "
                        "to the notebook and import it (e.g. `from workers import train`).")
    try:
        if module != "__main__":    # a script's function travels as file path + name (_ScriptFunction)
            pickle.dumps(fn)
    except Exception as exc:
        raise TypeError(f"launch() cannot pickle the worker {name!r}: {exc}. Define it at module level "
                        "in an importable module.") from None
    try:
        pickle.dumps(args)
    except Exception as exc:
        raise TypeError(f"launch() cannot pickle the arguments for {name!r}: {exc}") from None


# ------------------------------------------------------------------------------------------------
# What runs inside each rank.

@dataclass
class _ScriptFunction:
    """A worker defined in the ``__main__`` script: each rank loads that file as ``__mp_main__``
    (so its ``if __name__ == "__main__":`` block does not run again) and looks the function up."""

    path: str
    qualname: str

    def resolve(self):
        import importlib.util
        spec = importlib.util.spec_from_file_location("__mp_main__", self.path)
        module = importlib.util.module_from_spec(spec)
        sys.modules["__mp_main__"] = module
        spec.loader.exec_module(module)
        return getattr(module, self.qualname)


@dataclass
class _Job:
    fn: object
    args: tuple
    world_size: int
    backend: str
    workdir: str
    threads: int
    timeout_s: float | None


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL this rank if its parent goes away, so no rank outlives the job."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)   # PR_SET_PDEATHSIG
    except OSError:
        pass


def _write_atomic(path: Path, payload: object) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(pickle.dumps(payload))
    os.replace(tmp, path)


def _init_group(rank: int, world_size: int, backend: str, init_method: str, timeout_s: float | None):
    kwargs = {"timeout": timedelta(seconds=timeout_s)} if timeout_s else {}
    if backend == "nccl":
        torch.cuda.set_device(rank % torch.cuda.device_count())
        kwargs["device_id"] = torch.device("cuda", torch.cuda.current_device())
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world_size, **kwargs)


def _rank_main(rank: int, job: _Job) -> None:
    _die_with_parent()
    os.environ.update({_ENV_FLAG: "1", "RANK": str(rank), "WORLD_SIZE": str(job.world_size),
                       "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(job.world_size)})
    torch.set_num_threads(job.threads)
    out = Path(job.workdir)
    try:
        _init_group(rank, job.world_size, job.backend, f"file://{out / 'rendezvous'}", job.timeout_s)
        fn = job.fn.resolve() if isinstance(job.fn, _ScriptFunction) else job.fn
        result = fn(*job.args)
        _write_atomic(out / f"result-{rank}.pkl", result)
    except BaseException as exc:   # noqa: BLE001 - everything goes back to the caller, named by rank
        _write_atomic(out / f"error-{rank}.pkl", {
            "time": time.time(), "type": type(exc).__name__, "message": str(exc),
            "traceback": traceback.format_exc()})
        sys.stdout.flush(), sys.stderr.flush()
        os._exit(1)                 # skip destroy_process_group: peers may be gone
    try:
        dist.destroy_process_group()
    finally:
        sys.stdout.flush(), sys.stderr.flush()
        os._exit(0)


# ------------------------------------------------------------------------------------------------
# The parent: start, watch, tear down.

_CONTEXT = None


def _context():
    """A forkserver that has imported torch once; every later rank is a cheap fork of it."""
    global _CONTEXT
    if _CONTEXT is None:
        if "forkserver" in mp.get_all_start_methods():
            _CONTEXT = mp.get_context("forkserver")
            # torch._dynamo too: every torch.optim.Optimizer imports it on construction, which costs each
            # rank seconds (measured 2-15 s per launch on 2 busy cores) unless the forkserver already holds it.
            _CONTEXT.set_forkserver_preload(["torch", "torch.distributed", "torch._dynamo", "minimega"])
        else:
            _CONTEXT = mp.get_context("spawn")
    return _CONTEXT


@contextmanager
def _main_module_hidden():
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


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code} without raising (os._exit, sys.exit or a crash in native code)"


def _terminate(procs: list, grace: float = 2.0) -> None:
    procs = [p for p in procs if p.pid is not None]          # only those that started
    for p in procs:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + grace
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join(5)


def _failure(rank: int, code: int, workdir: Path, seen_at: float) -> dict:
    path = workdir / f"error-{rank}.pkl"
    if path.exists():
        info = pickle.loads(path.read_bytes())
        return {"rank": rank, "hard": False, "time": info["time"], "type": info["type"],
                "message": info["message"], "traceback": info["traceback"]}
    # A rank that died without raising is the likeliest root cause: its peers' errors are collateral.
    return {"rank": rank, "hard": True, "time": seen_at, "type": "", "message": _describe_exit(code),
            "traceback": ""}


def _raise_failure(failures: list[dict], world_size: int) -> None:
    first = min(failures, key=lambda f: (not f["hard"], f["time"]))
    head = (f"rank {first['rank']} of {world_size} failed with {first['type']}: {first['message']}"
            if first["type"] else f"rank {first['rank']} of {world_size} {first['message']}")
    others = [f for f in failures if f is not first]
    lines = [head]
    if others:
        lines.append("then: " + "; ".join(
            f"rank {f['rank']} " + (f"raised {f['type']}" if f["type"] else f["message"].split(" (")[0])
            for f in sorted(others, key=lambda f: f["rank"])))
        lines.append("(the other ranks were stopped)")
    if first["traceback"]:
        lines += ["", f"--- traceback from rank {first['rank']} ---", first["traceback"].rstrip()]
    raise WorkerError("\n".join(lines), first["rank"], first["type"], first["traceback"])


def _under_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ and _ENV_FLAG not in os.environ


def _launch_torchrun(fn, world_size: int, args: tuple, backend: str, timeout) -> list:
    env_world = int(os.environ["WORLD_SIZE"])
    if env_world != world_size:
        raise ValueError(f"launch(world_size={world_size}) under torchrun with WORLD_SIZE={env_world}: "
                         "pass --nproc_per_node to match, or call launch with the same world size")
    if not dist.is_initialized():
        _init_group(int(os.environ["RANK"]), world_size, backend, "env://", timeout)
    result = fn(*args)
    results = [None] * world_size
    dist.all_gather_object(results, result)
    return results


def launch(fn, world_size: int, *args, backend: str = "auto", timeout: float | None = None,
           threads: int | None = None) -> list:
    """Run ``fn(*args)`` on ``world_size`` ranks and return the results in rank order.

    Args:
        fn: a module-level function in an importable module (it is pickled by reference).
        world_size: number of ranks (processes), >= 1.
        args: passed to ``fn`` on every rank; must pickle.
        backend: 'auto' (NCCL with one GPU per rank when there are enough GPUs, else gloo), 'gloo', 'nccl'.
        timeout: seconds for the whole job (and for each collective); None waits as long as ranks live.
        threads: torch intra-op threads per rank; default splits the CPU cores evenly across ranks.

    Returns:
        ``[fn(*args) on rank 0, ..., on rank world_size-1]``.

    Raises:
        WorkerError: a rank raised or died; the message names the rank and carries its traceback.
        LaunchTimeout: the job ran past ``timeout``.
    """
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        raise ValueError(f"launch(): world_size must be an integer >= 1, got {world_size!r}")
    if timeout is not None and timeout <= 0:
        raise ValueError(f"launch(): timeout must be positive seconds or None, got {timeout!r}")
    backend = resolve_backend(backend, world_size)
    if _under_torchrun():
        return _launch_torchrun(fn, world_size, args, backend, timeout)
    if os.environ.get(_ENV_FLAG):
        raise RuntimeError("launch() was called inside a rank that launch() started; call the worker directly "
                           "(a script that calls launch() at top level needs an `if __name__ == \"__main__\":` guard)")
    _check_picklable(fn, args)
    threads = threads or max(1, (os.cpu_count() or 1) // world_size)
    if getattr(fn, "__module__", None) == "__main__":
        fn = _ScriptFunction(os.path.abspath(sys.modules["__main__"].__file__), fn.__qualname__)

    ctx = _context()
    with tempfile.TemporaryDirectory(prefix="minimega-") as tmp:
        workdir = Path(tmp)
        job = _Job(fn, args, world_size, backend, tmp, threads, timeout)
        procs = [ctx.Process(target=_rank_main, args=(r, job), name=f"minimega-rank{r}", daemon=True)
                 for r in range(world_size)]
        start = time.monotonic()
        try:
            with _main_module_hidden():
                for p in procs:
                    p.start()
            failures: list[dict] = []
            settle_until = None
            while True:
                for r, p in enumerate(procs):
                    if p.exitcode not in (None, 0) and all(f["rank"] != r for f in failures):
                        failures.append(_failure(r, p.exitcode, workdir, time.time()))
                if failures:
                    # Give peers a moment to report their own errors, so the root cause is picked by time.
                    settle_until = settle_until or time.monotonic() + 0.5
                    if time.monotonic() >= settle_until or all(p.exitcode is not None for p in procs):
                        _terminate(procs)
                        _raise_failure(failures, world_size)
                elif all(p.exitcode == 0 for p in procs):
                    break
                if timeout is not None and time.monotonic() - start > timeout:
                    alive = [r for r, p in enumerate(procs) if p.exitcode is None]
                    _terminate(procs)
                    raise LaunchTimeout(f"job ran past timeout={timeout}s; ranks {alive} were still running "
                                        "(a deadlock: mismatched collectives or a rank waiting on a peer?) "
                                        "and were killed", alive[0] if alive else -1)
                time.sleep(0.02)
        except BaseException:
            _terminate(procs)
            raise
        results = []
        for r in range(world_size):
            path = workdir / f"result-{r}.pkl"
            if not path.exists():
                raise WorkerError(f"rank {r} exited cleanly but left no result", r)
            results.append(pickle.loads(path.read_bytes()))
        return results
