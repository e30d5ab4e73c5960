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
  keeps the caller waiting;
- a rank that stops without dying (SIGSTOP, a deadlock, mismatched collectives) is caught by the
  *watchdog*: every rank publishes a heartbeat and the last collective it entered (``all_reduce#12
  group dp``) in a small shared-memory record; the launcher ends the job when a heartbeat is older
  than ``timeout`` or a collective has waited longer than that, naming the rank and its collective
  (`minimega.run.watchdog`);
- the job dies with its launcher: each rank watches the launcher through a pipe whose write end only
  the launcher holds, so SIGKILL of a script, the CLI or a notebook kernel ends every rank (EOF).

Workers are forked from a *forkserver* that has already imported torch and minimega, so starting a
rank costs a fork instead of a fresh 3-second ``import torch``. The forkserver follows its caller:
each rank takes the caller's ``os.environ`` as it is at ``launch()``, and an edit to minimega's
source (newer mtime) or a dead forkserver starts a fresh one. Under ``torchrun`` (RANK and
WORLD_SIZE set in the environment) nothing is spawned: this process is one rank, it joins the group
from the environment, runs ``fn`` and gathers every rank's result.
"""
from __future__ import annotations

import atexit
import os
import pickle
import signal
import sys
import threading
import tempfile
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from .processes import (ForkserverDied, allocator_policy, die_with_parent, forkserver_context, forward_signals_to,
                        keep_freed_memory, main_module_hidden, name_process, start_all, stop_forkserver, terminate)
from .watchdog import (_FROZEN_S, _STATUS_BYTES, RankStatus, Stragglers, culprit, describe_exit, guard, install,
                       report_step, snapshots, table, verdict)

__all__ = ["launch", "WorkerError", "LaunchTimeout", "resolve_backend", "current_world_size", "report_step",
           "DEFAULT_TIMEOUT"]

_ENV_FLAG = "MINIMEGA_WORKER"          # set in spawned ranks, so a nested launch() is refused clearly
DEFAULT_TIMEOUT = 300.0
"""Seconds a collective may wait, or a rank stay silent, before the watchdog ends the job."""


class WorkerError(RuntimeError):
    """A rank failed. ``rank`` is the first rank that failed; ``remote_traceback`` is its traceback."""

    def __init__(self, message: str, rank: int, exc_type: str = "", remote_traceback: str = "",
                 ranks: list[dict] | None = None):
        super().__init__(message)
        self.rank, self.exc_type, self.remote_traceback = rank, exc_type, remote_traceback
        self.ranks = ranks or []
        """Each rank's last published status: step, last collective entered, heartbeat age (see `RankStatus`)."""

    @property
    def step(self) -> int | None:
        """The failed rank's last reported step (`report_step`), or None if it reported none."""
        steps = [r["step"] for r in self.ranks if r["rank"] == self.rank and r["step"] >= 0]
        return steps[0] if steps else None


class LaunchTimeout(WorkerError, TimeoutError):
    """The watchdog ended the job: a rank went silent or a collective waited past ``timeout``."""


def resolve_backend(backend: str, world_size: int, local_world_size: int | None = None,
                    device_count: int | None = None) -> str:
    """'auto' means NCCL when every rank *on this machine* has a GPU, else gloo on CPU.

    ``local_world_size`` is the number of ranks sharing this machine's GPUs: all of them for a local
    launch, ``LOCAL_WORLD_SIZE`` under torchrun across nodes (comparing the node's GPUs with the *global*
    world size would fall back to gloo on every multi-node job).
    """
    local = world_size if local_world_size is None else local_world_size
    gpus = (torch.cuda.device_count() if torch.cuda.is_available() else 0) if device_count is None else device_count
    if backend == "auto":
        return "nccl" if gpus >= local >= 1 else "gloo"
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend={backend!r}; choose 'auto', 'gloo' or 'nccl'")
    if backend == "nccl" and gpus < local:
        raise ValueError(f"backend='nccl' needs one GPU per rank: {local} rank(s) on this machine but "
                         f"{gpus} CUDA device(s) are visible; use backend='gloo'")
    return backend


def local_device_index(rank: int, env=None) -> int:
    """The GPU this rank drives: ``LOCAL_RANK`` (set by torchrun and by `launch`), else the global rank.

    Under torchrun across nodes rank 5 of a 2x4 job is local rank 1: ``rank % device_count()`` only
    agrees when every node holds exactly as many ranks as GPUs, so the local rank is used, never a modulo.
    """
    env = os.environ if env is None else env
    return int(env.get("LOCAL_RANK", rank))


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
    timeout_s: float
    env: dict
    """The caller's os.environ at launch(): the forkserver's own, frozen at its start, is replaced by it."""


def _write_atomic(path: Path, payload: object) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(pickle.dumps(payload))
    os.replace(tmp, path)


def _init_group(rank: int, world_size: int, backend: str, init_method: str, timeout_s: float | None):
    kwargs = {"timeout": timedelta(seconds=timeout_s)} if timeout_s else {}
    if backend == "nccl":
        index = local_device_index(rank)
        if index >= torch.cuda.device_count():
            raise RuntimeError(f"rank {rank}: LOCAL_RANK={index} but only {torch.cuda.device_count()} CUDA "
                               "device(s) are visible on this machine; start fewer ranks per node")
        torch.cuda.set_device(index)
        kwargs["device_id"] = torch.device("cuda", index)
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world_size, **kwargs)


def _rank_main(rank: int, job: _Job) -> None:
    die_with_parent()
    name_process(f"minimega-rank{rank}" if rank < 100 else f"mm-rank{rank}")
    os.environ.clear()                 # the caller's environment now, not the forkserver's from its start
    os.environ.update(job.env)
    os.environ.update({_ENV_FLAG: "1", "RANK": str(rank), "WORLD_SIZE": str(job.world_size),
                       "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(job.world_size)})
    torch.set_num_threads(job.threads)
    keep_freed_memory()
    out = Path(job.workdir)
    try:
        status = RankStatus(out / f"status-{rank}")
    except FileNotFoundError:          # the launcher ended this job (its folder removed) before this rank started
        return
    install(status)
    status.beat()
    threading.Thread(target=guard, args=(status, out), name="minimega-guard", daemon=True).start()
    try:
        # --8<-- [start:tour_rank]
        _init_group(rank, job.world_size, job.backend, f"file://{out / 'rendezvous'}", job.timeout_s)
        if job.world_size > 1:
            # gloo's connect can finish on one side first: a rank whose fn returns at once would close its
            # sockets while a peer is still connecting ("Connection closed by peer"). Meet once first.
            dist.barrier()
        fn = job.fn.resolve() if isinstance(job.fn, _ScriptFunction) else job.fn
        result = fn(*job.args)
        # --8<-- [end:tour_rank]
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

def _failure(rank: int, code: int, workdir: Path, seen_at: float) -> dict:
    path = workdir / f"error-{rank}.pkl"
    if path.exists():
        info = pickle.loads(path.read_bytes())
        return {"rank": rank, "hard": False, "time": info["time"], "type": info["type"],
                "message": info["message"], "traceback": info["traceback"]}
    # A rank that died without raising is the likeliest root cause: its peers' errors are collateral.
    return {"rank": rank, "hard": True, "time": seen_at, "type": "", "message": describe_exit(code),
            "traceback": ""}


_BACKEND_ERRORS = ("RuntimeError", "DistError", "DistBackendError", "DistNetworkError", "DistStoreError")
"""What a collective that gave up waiting raises (gloo: RuntimeError "Timed out waiting ...ms")."""


def _collateral(f: dict) -> bool:
    """A rank whose peer closed the connection: the peer failed first, whichever report arrived first."""
    return f["type"] in _BACKEND_ERRORS and "closed by peer" in f["message"].lower()


def _raise_failure(failures: list[dict], world_size: int, snaps: list[dict], timeout: float, start: float) -> None:
    first = min(failures, key=lambda f: (not f["hard"], _collateral(f), f["time"]))
    if not first["hard"]:
        # A peer's error is often collateral: it timed out waiting for a rank that froze or never came.
        now = time.monotonic()
        alive = [s for s in snaps if s["alive"]]
        frozen = [s for s in alive if now - (s["heartbeat"] or start) > min(_FROZEN_S, timeout / 2)
                  or s["state"].startswith("stopped")]
        timed_out = first["type"] in _BACKEND_ERRORS and any(w in first["message"].lower()
                                                              for w in ("timed out", "timeout"))
        if frozen or timed_out:
            stuck = (verdict(frozen, 0.0, start) if frozen
                       else culprit(snaps[first["rank"]], snaps, now))
            _raise_watchdog(stuck, world_size, snaps, timeout, failures,
                            f"rank {first['rank']} raised {first['type']}: {first['message'].splitlines()[0][:200]}")
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
    raise WorkerError("\n".join(lines), first["rank"], first["type"], first["traceback"], snaps)


def _raise_watchdog(stuck: tuple[int, str], world_size: int, snaps: list[dict], timeout: float,
                    failures: list[dict] = (), also: str = "") -> None:
    rank, why = stuck
    lines = [f"watchdog: rank {rank} of {world_size} {why}; every rank was stopped",
             *([f"(meanwhile {also})"] if also else []), table(snaps, failures),
             f"(timeout={timeout:g}s: raise it with --timeout or launch(timeout=) if a step legitimately takes longer)"]
    raise LaunchTimeout("\n".join(lines), rank, ranks=snaps)


def _under_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ and _ENV_FLAG not in os.environ


def _launch_torchrun(fn, world_size: int, args: tuple, backend: str, timeout) -> list:
    env_world = int(os.environ["WORLD_SIZE"])
    if env_world != world_size:
        raise ValueError(f"launch(world_size={world_size}) under torchrun with WORLD_SIZE={env_world}: "
                         "pass --nproc_per_node to match, or call launch with the same world size")
    if not dist.is_initialized():
        _init_group(int(os.environ["RANK"]), world_size, backend, "env://", timeout)
        # taken down before Python's teardown, which once aborted a preempted srun rank at exit (134, not 75)
        atexit.register(lambda: dist.is_initialized() and dist.destroy_process_group())
    result = fn(*args)
    results = [None] * world_size
    dist.all_gather_object(results, result)
    return results


CPUS_ENV = "MINIMEGA_CPUS"


def cpu_share() -> int:
    """The cores this process's jobs may use: ``$MINIMEGA_CPUS`` when set (a test runner's share of the machine:
    its workers run side by side), else every core. More intra-op threads than cores make torch's threads spin
    against each other."""
    value = os.environ.get(CPUS_ENV, "")
    if value:
        if not value.isdigit() or int(value) < 1:
            raise ValueError(f"${CPUS_ENV}={value!r}: a positive number of cores")
        return int(value)
    return os.cpu_count() or 1


def launch(fn, world_size: int, *args, backend: str = "auto", timeout: float | None = None,
           threads: int | None = None, stragglers: float | None = None, forward_signals: tuple = ()) -> list:
    """Run ``fn(*args)`` on ``world_size`` ranks and return the results in rank order.

    Args:
        fn: a module-level function in an importable module (it is pickled by reference).
        world_size: number of ranks (processes), >= 1.
        args: passed to ``fn`` on every rank; must pickle.
        backend: 'auto' (NCCL with one GPU per rank when there are enough GPUs, else gloo), 'gloo', 'nccl'.
        timeout: the watchdog's limit in seconds (None: DEFAULT_TIMEOUT, 300): the longest a collective may
            wait or a rank may go without a heartbeat before the job is ended, naming the stuck rank and
            the last collective it entered. It bounds waiting, not the job: a long run with live ranks
            goes on.
        threads: torch intra-op threads per rank; default splits `cpu_share()` cores evenly across ranks.
        stragglers: name on stderr a rank whose own work per step is persistently this many times its peers'
            (`watchdog.Stragglers`; ranks report their steps with `report_step`); None: not watched.
        forward_signals: signals this process passes on to every rank as SIGUSR1 while the job runs (a
            scheduler's preemption notice, or SIGTERM, reaches the launcher; the ranks decide together what to do).

    Returns:
        ``[fn(*args) on rank 0, ..., on rank world_size-1]``.

    Raises:
        WorkerError: a rank raised or died; the message names the rank and carries its traceback.
        LaunchTimeout: the watchdog ended the job (a rank froze, or a collective waited past ``timeout``).
    """
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        raise ValueError(f"launch(): world_size must be an integer >= 1, got {world_size!r}")
    if timeout is None:
        timeout = DEFAULT_TIMEOUT
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"launch(): timeout must be positive seconds (or None for {DEFAULT_TIMEOUT:g}), "
                         f"got {timeout!r}")
    if stragglers is not None:
        Stragglers(stragglers)                       # refused here if it could never name anyone
    if _under_torchrun():
        if stragglers is not None:
            raise ValueError("launch(stragglers=...): under torchrun the ranks' records are not read by this "
                             "process; leave stragglers=None")
        local = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
        return _launch_torchrun(fn, world_size, args, resolve_backend(backend, world_size, local), timeout)
    backend = resolve_backend(backend, world_size)
    if os.environ.get(_ENV_FLAG):
        raise RuntimeError("launch() was called inside a rank that launch() started; call the worker directly "
                           "(a script that calls launch() at top level needs an `if __name__ == \"__main__\":` guard)")
    _check_picklable(fn, args)
    allocator_policy()                                  # refused here, before any rank starts
    threads = threads or max(1, cpu_share() // world_size)
    if getattr(fn, "__module__", None) == "__main__":
        fn = _ScriptFunction(os.path.abspath(sys.modules["__main__"].__file__), fn.__qualname__)

    env = dict(os.environ)
    try:
        return _run(fn, args, world_size, backend, timeout, threads, env, stragglers, forward_signals)
    except ForkserverDied:
        # A fresh forkserver, a fresh work directory: a half-started rank of the first try, whose
        # launcher-side handle is gone, sees its sentinel close and ends itself without touching this one.
        stop_forkserver()
    try:
        return _run(fn, args, world_size, backend, timeout, threads, env, stragglers, forward_signals)
    except ForkserverDied as exc:
        raise RuntimeError(f"launch(): could not start the ranks: the forkserver died while starting them, "
                           f"twice ({exc}); is the machine out of memory or processes?") from None


def _run(fn, args: tuple, world_size: int, backend: str, timeout: float, threads: int, env: dict,
         stragglers: float | None = None, forward_signals: tuple = ()) -> list:
    """One job: start the ranks, watch them, tear down, collect the results."""
    ctx = forkserver_context()
    with tempfile.TemporaryDirectory(prefix="minimega-") as tmp:
        workdir = Path(tmp)
        for r in range(world_size):
            (workdir / f"status-{r}").write_bytes(bytes(_STATUS_BYTES))
        job = _Job(fn, args, world_size, backend, tmp, threads, timeout, env)
        procs = [ctx.Process(target=_rank_main, args=(r, job), name=f"minimega-rank{r}", daemon=True)
                 for r in range(world_size)]
        forwarding = forward_signals_to(forward_signals, procs)
        try:
            with main_module_hidden():
                start_all(procs)
            start = time.monotonic()                 # the forkserver is up: from here on, ranks must beat
            watch = Stragglers(stragglers) if stragglers else None
            failures: list[dict] = []
            settle_until = None
            next_check = start
            while True:
                for r, p in enumerate(procs):
                    if p.exitcode not in (None, 0) and all(f["rank"] != r for f in failures):
                        failures.append(_failure(r, p.exitcode, workdir, time.time()))
                if failures:
                    # Give peers a moment to report their own errors, so the root cause is picked by time.
                    settle_until = settle_until or time.monotonic() + 0.5
                    if time.monotonic() >= settle_until or all(p.exitcode is not None for p in procs):
                        snaps = snapshots(workdir, procs)
                        terminate(procs)
                        _raise_failure(failures, world_size, snaps, timeout, start)
                elif all(p.exitcode == 0 for p in procs):
                    break
                elif time.monotonic() >= next_check:
                    next_check = time.monotonic() + 0.25
                    snaps = snapshots(workdir, procs)
                    for line in watch.update(snaps) if watch else ():
                        print(f"\nminimega launch: {line}", file=sys.stderr, flush=True)
                    if stuck := verdict(snaps, timeout, start):
                        terminate(procs)
                        _raise_watchdog(stuck, world_size, snaps, timeout)
                time.sleep(0.02)
        except BaseException:
            terminate(procs)
            raise
        finally:
            for signum, old in forwarding.items():
                signal.signal(signum, old)
        results = []
        for r in range(world_size):
            path = workdir / f"result-{r}.pkl"
            if not path.exists():
                raise WorkerError(f"rank {r} exited cleanly but left no result", r)
            results.append(pickle.loads(path.read_bytes()))
        return results
