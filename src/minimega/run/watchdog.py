"""The watchdog: every rank's heartbeat and last collective, and the launcher's verdict on who is stuck.

A collective has no idea how long to wait, and a rank that is stopped (SIGSTOP, a frozen node) or
deadlocked cannot report anything. So each rank that `minimega.run.launch` starts owns a small record in
shared memory (`RankStatus`, a memory-mapped file), and the launcher reads all of them:

- a *guard thread* in each rank beats every ``HEARTBEAT_S`` and ends the rank when its launcher dies;
- `minimega.comm` tells it every collective issued, waited on and done (``all_reduce#12 group dp``, waiting
  since the rank blocked on it);
- the launcher's `verdict` names the stuck rank: the one whose heartbeat is older than the timeout,
  else, when a collective has waited too long, the peer that is not in it, or is in another one.

Times are ``time.monotonic()``: one clock for every process on a Linux machine.
"""
from __future__ import annotations

import mmap
import multiprocessing as mp
import os
import shutil
import signal
import statistics
import struct
import time
from pathlib import Path

from ..comm.observers import attach

__all__ = ["RankStatus", "Stragglers", "read_status", "report_step", "verdict", "HEARTBEAT_S"]

HEARTBEAT_S = 0.5                      # how often each rank's guard thread beats (and checks its launcher)
_STARTUP_S = 60.0                      # a fresh rank imports the worker's module before its first beat
_GRACE_S = 3.0                         # beyond the timeout: lets the backend's own timeout error arrive first
_FROZEN_S = 5.0                         # a heartbeat this old while a peer reports an error: that rank is the root cause


# --8<-- [start:rank_status]
_HEARTBEAT = struct.Struct("<d")                   # offset 0, written by the guard thread only
_BODY = struct.Struct("<qqdqd24s16s")              # offset 8: version, count, waiting_since, step, busy, op, group
_STATUS_BYTES = _HEARTBEAT.size + _BODY.size


class RankStatus:
    """This rank's heartbeat and last collective, in shared memory the launcher reads.

    The main thread writes the body under a seqlock (``version`` odd while writing), so the launcher
    never reads half an update; the guard thread writes only the heartbeat. Times are
    ``time.monotonic()``, one clock for every process on the machine.
    """

    def __init__(self, path: Path):
        self._file = open(path, "r+b")
        self._map = mmap.mmap(self._file.fileno(), _STATUS_BYTES)
        self.version, self.count, self.step = 0, 0, -1
        self.waiting_since, self.op, self.group = 0.0, b"", b""
        self.busy, self._waited, self._stepped_at = 0.0, 0.0, 0.0     # busy: the last step's seconds not waiting

    def beat(self) -> None:
        _HEARTBEAT.pack_into(self._map, 0, time.monotonic())

    def _publish(self) -> None:
        self.version += 1                                   # odd: a write in progress
        _BODY.pack_into(self._map, 8, self.version, self.count, self.waiting_since, self.step, self.busy, self.op,
                        self.group)
        self.version += 1
        struct.pack_into("<q", self._map, 8, self.version)

    # An observer of `minimega.comm` (see `comm.observers`): the wait clock starts when the rank blocks
    # on a collective, not when an asynchronous one is issued (a long backward after issuing is no hang).
    def issued(self, call) -> None:
        """A collective was issued: count it; name it unless the rank is blocked in another one."""
        self.count += 1
        call.extra["count"] = self.count
        if not self.waiting_since:
            self._name(call)
        self._publish()

    def waiting(self, call) -> None:
        """The rank blocks on ``call``: name it and start the wait clock."""
        if "count" not in call.extra:                   # barrier, objects: blocking calls never issued
            self.count += 1
            call.extra["count"] = self.count
        self._name(call)
        self.waiting_since = self.waiting_since or time.monotonic()
        self._publish()

    def done(self, call) -> None:
        """The collective (or the wait on an async one) returned."""
        if self.waiting_since:
            self._waited += time.monotonic() - self.waiting_since
        self.waiting_since = 0.0
        self._publish()

    def _name(self, call) -> None:
        self.op, self.group = call.op.encode()[:24], call.group.name.encode()[:16]

    def report_step(self, step: int) -> None:
        """A step ended: publish it, and the seconds since the last one that this rank was not blocked in a
        collective (its own work: a slow rank waits least, its peers wait for it)."""
        now = time.monotonic()
        if self._stepped_at:
            self.busy = max(0.0, now - self._stepped_at - self._waited)
        self._stepped_at, self._waited, self.step = now, 0.0, step
        self._publish()


def read_status(path: Path) -> dict | None:
    """The launcher's side: a consistent snapshot of one rank's record (None until the rank wrote it)."""
    def version(raw: bytes) -> int:
        return struct.unpack_from("<q", raw, 8)[0]
    for _ in range(100):
        first, second = path.read_bytes()[:_STATUS_BYTES], path.read_bytes()[:_STATUS_BYTES]
        if version(first) % 2 == 0 and version(first) == version(second):    # no write in between
            break
    (heartbeat,) = _HEARTBEAT.unpack_from(second, 0)
    written, count, waiting, step, busy, op, group = _BODY.unpack_from(second, 8)
    if not heartbeat:
        return None
    if not written:
        step = -1
    return {"heartbeat": heartbeat, "count": count, "waiting": waiting, "step": step, "busy": busy,
            "op": op.rstrip(b"\0").decode(errors="replace"), "group": group.rstrip(b"\0").decode(errors="replace")}
# --8<-- [end:rank_status]


STATUS: RankStatus | None = None
"""In a rank that `minimega.run.launch` started: its record (`install` sets it and attaches it to `comm`)."""


def install(status: RankStatus) -> None:
    """Make ``status`` this rank's record: told every collective (`comm.observers`) and every step."""
    global STATUS
    STATUS = status
    attach(status)


def report_step(step: int) -> None:
    """Tell the launcher which step this rank is on (shown when the job fails; used by elastic restarts).

    A no-op outside a rank that `launch` started.
    """
    if STATUS is not None:
        STATUS.report_step(step)


# --8<-- [start:guard]
def guard(status: RankStatus, workdir: Path | None = None) -> None:
    """Each rank's guard thread: beat every HEARTBEAT_S, and end this rank the moment its launcher dies.

    The launcher is not this process's parent (the forkserver is), so a parent-death signal cannot see
    it. multiprocessing hands every child a *sentinel*: the read end of a pipe whose write end only the
    launcher holds. The kernel closes it when the launcher dies, however it dies (SIGKILL included), and
    the sentinel turns readable (EOF): nobody is left to collect this rank's result, nor to remove the
    job's work directory, so the rank removes it on the way out.
    """
    from multiprocessing.connection import wait
    parent = mp.parent_process()
    sentinel = parent.sentinel if parent is not None else None
    while True:
        status.beat()
        if sentinel is not None:
            if wait([sentinel], HEARTBEAT_S):
                if workdir is not None:
                    shutil.rmtree(workdir, ignore_errors=True)
                os.kill(os.getpid(), signal.SIGKILL)
        else:
            time.sleep(HEARTBEAT_S)
# --8<-- [end:guard]


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code} without raising (os._exit, sys.exit or a crash in native code)"


def process_state(pid: int | None) -> str:
    """'stopped', 'running', ... from /proc (Linux); '' where unknown."""
    try:
        code = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""
    return {"T": "stopped (SIGSTOP or a debugger)", "t": "stopped by a debugger", "R": "running",
            "S": "sleeping", "D": "in uninterruptible I/O", "Z": "exited"}.get(code, code)


def snapshots(workdir: Path, procs: list) -> list[dict]:
    """Every rank's record, and whether its process was alive when it was read."""
    out = []
    for r, p in enumerate(procs):
        try:
            snap = read_status(workdir / f"status-{r}")
        except OSError:
            snap = None
        out.append({"rank": r, "heartbeat": 0.0, "count": 0, "waiting": 0.0, "step": -1, "op": "", "group": "",
                    **(snap or {}), "alive": p.exitcode is None, "pid": p.pid, "exitcode": p.exitcode,
                    "state": process_state(p.pid) if p.exitcode is None else ""})
    return out


def collective(snap: dict) -> str:
    return f"{snap['op']}#{snap['count']} (group {snap['group']})" if snap["count"] else "no collective yet"


# --8<-- [start:verdict]
def verdict(snaps: list[dict], timeout: float, start: float) -> tuple[int, str] | None:
    """Who is stuck, and why, from every rank's record; None while all is well.

    1. a rank whose heartbeat is older than ``timeout`` is frozen (stopped, or hung holding the GIL);
    2. a rank that has waited in one collective longer than ``timeout`` is blocked by a peer: the culprit
       is a peer that is not in a collective at all (deadlocked or busy elsewhere), else one that entered
       a different collective (a mismatch), else the one furthest behind.
    """
    now = time.monotonic()
    alive = [s for s in snaps if s["alive"]]
    for s in alive:
        silent = now - (s["heartbeat"] or start)
        if silent > (timeout if s["heartbeat"] else max(timeout, _STARTUP_S)):
            state = s["state"]
            return s["rank"], (f"stopped responding: no heartbeat for {silent:.1f} s"
                               + (f" (process state: {state})" if state else "")
                               + f"; the last collective it entered: {collective(s)}")
    blocked = [s for s in alive if s["waiting"] and now - s["waiting"] > timeout + _GRACE_S]
    if not blocked:
        return None
    waiter = max(blocked, key=lambda s: now - s["waiting"])
    return culprit(waiter, alive, now)


def culprit(waiter: dict, alive: list[dict], now: float) -> tuple[int, str]:
    others = [s for s in alive if s is not waiter]
    waited = (f"rank {waiter['rank']} waited {now - waiter['waiting']:.1f} s in {collective(waiter)}"
              if waiter["waiting"] else f"rank {waiter['rank']} timed out after {collective(waiter)}")
    idle = [s for s in others if not s["waiting"]]
    if idle:
        s = min(idle, key=lambda s: s["count"])
        return s["rank"], (f"never joined: {waited}, while this rank is not in any collective "
                           f"(deadlocked or busy elsewhere); the last collective it entered: {collective(s)}")
    odd = [s for s in others if (s["op"], s["group"]) != (waiter["op"], waiter["group"])]
    if odd:
        s = odd[0]
        return s["rank"], (f"entered a different collective: {waited}, but this rank is in {collective(s)} "
                           "(mismatched collectives: every rank must call the same ones in the same order)")
    s = min(alive, key=lambda s: s["count"])
    return s["rank"], f"is furthest behind: {waited}; the last collective it entered: {collective(s)}"
# --8<-- [end:verdict]


# --8<-- [start:stragglers]
class Stragglers:
    """Names a rank whose own work per step (``busy``: step time minus time blocked in collectives) is, over
    its last ``window`` steps, more than ``factor`` times the median of its peers'. In a synchronous job every
    rank's step *lasts* as long as the slowest rank's, so wall time cannot tell them apart; the slow rank is
    the one that waits least. Each rank is named once."""

    def __init__(self, factor: float, window: int = 5):
        if not factor > 1 or window < 1:
            raise ValueError(f"stragglers: factor must be > 1 and window >= 1, got {factor!r}, {window!r}")
        self.factor, self.window = factor, window
        self.samples: dict[int, dict[int, float]] = {}           # rank -> {step: busy seconds}
        self.named: list[dict] = []

    def update(self, snaps: list[dict]) -> list[str]:
        """Read one round of snapshots; returns a log line for each rank newly found persistently slow."""
        for s in snaps:
            if s["step"] > 0 and s.get("busy", 0.0) > 0:
                steps = self.samples.setdefault(s["rank"], {})
                steps[s["step"]] = s["busy"]
                for old in sorted(steps)[:-self.window]:
                    del steps[old]
        if len(self.samples) < 2 or any(len(v) < self.window for v in self.samples.values()):
            return []
        med = {r: statistics.median(v.values()) for r, v in self.samples.items()}
        lines = []
        for r, mine in med.items():
            peers = statistics.median(m for q, m in med.items() if q != r)
            if mine > self.factor * peers and all(n["rank"] != r for n in self.named):
                step = max(self.samples[r])
                self.named.append({"rank": r, "step": step, "busy": mine, "peers": peers})
                lines.append(f"straggler: rank {r} is {mine / peers:.1f}x slower than its peers at step {step}: "
                             f"{mine:.3f} s of its own work per step vs {peers:.3f} s (medians of the last "
                             f"{self.window} steps, time waiting in collectives excluded)")
        return lines
# --8<-- [end:stragglers]


def table(snaps: list[dict], failures: list[dict] = ()) -> str:
    now = time.monotonic()
    raised = {f["rank"]: f["type"] for f in failures if f["type"]}
    rows = []
    for s in snaps:
        where = collective(s) + (f", waiting {now - s['waiting']:.1f} s" if s["waiting"] else "")
        step = f"step {s['step']}, " if s["step"] >= 0 else ""
        life = ("running until stopped by the launcher" if s["alive"] else f"raised {raised[s['rank']]}"
                if s["rank"] in raised else describe_exit(s["exitcode"]).split(" (")[0])
        rows.append(f"  rank {s['rank']}: {step}last entered {where}; {life}")
    return "\n".join(rows)
