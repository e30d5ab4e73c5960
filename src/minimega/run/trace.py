"""A trace you can open: the engine's timeline as Chrome trace event JSON (Perfetto, ``chrome://tracing``).

What the engine already records becomes one file per rank (`chrome_trace`, written by `write`):

    engine.timeline      step_start/end, forward/backward per micro-step, optimizer_start/step_end,
                         save_start/end (with the bytes written)                    -> lanes "step", "compute"
    pipeline.events      one slot per forward or backward of (chunk, micro)        -> lane "compute"
    comm_log.events()    every collective: issued (start), rank starts blocking (wait), done (end), with its
                         payload and ring-model bytes                               -> lanes "comm in flight",
                                                                                      "comm wait"

Each rank is one process track (``pid`` = rank) and each lane a thread track (``tid``). Collectives in flight
overlap one another (ZeRO-3 prefetches the next unit's gather while the previous one runs), and a trace viewer
stacks only properly nested slices on a track, so overlapping collectives are packed into as many "comm in
flight" lanes as needed. Times are microseconds of the host's monotonic clock (``time.perf_counter``: the same
clock in every process of one machine, so the ranks' files line up when merged).

`step_parts` reads a trace back and splits each step into what the step-time model predicts
(``analysis.perf.step_time``): compute, exposed communication (the rank blocked in a collective), pipeline
bubble (idle between slots) and the optimizer; ``minimega trace compare`` prints them side by side.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

LANES = {"step": 1, "compute": 2, "checkpoint": 3}
COMM_LANE, WAIT_LANE = 100, 200            # + k for the k-th packed lane
_US = 1e6


def _slice(name: str, cat: str, start: float, end: float, pid: int, tid: int, **args) -> dict:
    return {"name": name, "cat": cat, "ph": "X", "ts": start * _US, "dur": max(0.0, end - start) * _US,
            "pid": pid, "tid": tid, "args": args}


def _pack(slices: list[dict], base: int) -> list[dict]:
    """Give each slice the lowest lane ``base + k`` where it does not overlap the lane's previous slice."""
    ends: list[float] = []
    for s in sorted(slices, key=lambda s: s["ts"]):
        k = next((i for i, end in enumerate(ends) if end <= s["ts"]), len(ends))
        if k == len(ends):
            ends.append(0.0)
        ends[k] = s["ts"] + s["dur"]
        s["tid"] = base + k
    return slices


def _pairs(timeline: list[dict], begin: str, end: str, key=lambda e: (e.get("step"), e.get("micro"))):
    """(begin entry, end entry) for every ``begin`` closed by a later ``end`` with the same key."""
    open_, out = {}, []
    for e in sorted(timeline, key=lambda e: e["time"]):
        if e["event"] == begin:
            open_[key(e)] = e
        elif e["event"] == end and key(e) in open_:
            out.append((open_.pop(key(e)), e))
    return out


# --8<-- [start:chrome_trace]
def chrome_trace(report: dict, meta: dict | None = None) -> dict:
    """One rank's `Engine.report()` as a Chrome trace: ``{"traceEvents": [...], "otherData": {...}}``."""
    pid = report["rank"]
    timeline = [e for e in report["timeline"] if "event" in e and isinstance(e.get("time"), float)]
    events = []
    for a, b in _pairs(timeline, "step_start", "step_end", key=lambda e: e["step"]):
        events.append(_slice(f"step {a['step']}", "step", a["time"], b["time"], pid, LANES["step"], step=a["step"]))
    for a, b in _pairs(timeline, "forward_start", "backward_start"):
        events.append(_slice("forward", "compute", a["time"], b["time"], pid, LANES["compute"],
                             step=a["step"], micro=a["micro"]))
    for a, b in _pairs(timeline, "backward_start", "backward_end"):
        events.append(_slice("backward", "compute", a["time"], b["time"], pid, LANES["compute"],
                             step=a["step"], micro=a["micro"]))
    for e in timeline:                         # pipeline slots carry their own start and end
        if e.get("kind") in ("forward", "backward") and "tick" in e:
            events.append(_slice(f"{e['kind'][0].upper()}{e['micro']} chunk {e['chunk']}", "pipeline",
                                 e["start"], e["end"], pid, LANES["compute"], step=e["step"], micro=e["micro"],
                                 chunk=e["chunk"], tick=e["tick"]))
        elif e.get("kind") == "step" and "tick" in e:
            events.append(_slice("pipeline schedule", "pipeline_step", e["start"], e["end"], pid, LANES["step"] + 10,
                                 step=e["step"]))
    for a, b in _pairs(timeline, "optimizer_start", "optimizer_step_end", key=lambda e: e["step"]):
        events.append(_slice("optimizer", "optimizer", a["time"], b["time"], pid, LANES["compute"], step=a["step"],
                             state_bytes=report.get("memory_at_step", {}).get("master", 0)
                             + report.get("memory_at_step", {}).get("optimizer_states", 0)))
    for a, b in _pairs(timeline, "save_start", "save_end", key=lambda e: e["step"]):
        events.append(_slice("checkpoint save", "checkpoint", a["time"], b["time"], pid, LANES["checkpoint"],
                             step=a["step"], bytes=b.get("bytes", 0)))
    flight, waits = [], []
    for c in report["comm_events"]:
        end = c["end"] if c["end"] is not None else c["start"]
        args = dict(op=c["op"], group=c["group"], dtype=c["dtype"], bytes=c["bytes"], sent_bytes=c["sent_bytes"],
                    tag=c["tag"])
        flight.append(_slice(c["op"], "comm", c["start"], end, pid, COMM_LANE, **args))
        if c.get("wait") is not None:
            waits.append(_slice(f"wait {c['op']}", "comm_wait", c["wait"], end, pid, WAIT_LANE, **args))
    events += _pack(flight, COMM_LANE) + _pack(waits, WAIT_LANE)
    events.sort(key=lambda e: (e["ts"], -e["dur"]))           # parents before the slices nested in them
    names = {**{tid: lane for lane, tid in LANES.items()}, LANES["step"] + 10: "pipeline schedule"}
    names.update({e["tid"]: f"comm in flight {e['tid'] - COMM_LANE}" for e in events if e["cat"] == "comm"})
    names.update({e["tid"]: f"comm wait {e['tid'] - WAIT_LANE}" for e in events if e["cat"] == "comm_wait"})
    used = {e["tid"] for e in events} | {LANES["step"], LANES["compute"]}
    header = [{"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": f"rank {pid}"}},
              {"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0, "args": {"sort_index": pid}}]
    for tid in sorted(used):
        header += [{"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": names[tid]}},
                   {"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid, "args": {"sort_index": tid}}]
    return {"traceEvents": header + events, "displayTimeUnit": "ms",
            "otherData": {"minimega": {"rank": pid, "layout": report.get("layout", {}), **(meta or {})}}}
# --8<-- [end:chrome_trace]


def _write_json(path: Path, obj) -> Path:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(obj))
    os.replace(tmp, path)                      # a reader never sees half a file
    return path


def write(report: dict, directory, meta: dict | None = None) -> Path:
    """Write this rank's trace to ``directory/rank<r>.trace.json``."""
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    return _write_json(root / f"rank{report['rank']}.trace.json", chrome_trace(report, meta))


def rank_files(directory) -> list[Path]:
    """The per-rank trace files in ``directory``, in rank order."""
    files = [p for p in Path(directory).glob("rank*.trace.json") if p.name[4:-11].isdigit()]
    return sorted(files, key=lambda p: int(p.name[4:-11]))


def merge(directory) -> Path:
    """All ranks in one file, ``directory/all.trace.json``: one process track per rank, one view."""
    traces = [read(p) for p in rank_files(directory)]
    if not traces:
        raise ValueError(f"{directory}: no rank<r>.trace.json files")
    merged = {"traceEvents": [e for t in traces for e in t["traceEvents"]], "displayTimeUnit": "ms",
              "otherData": {"minimega": [t.get("otherData", {}).get("minimega") for t in traces]}}
    return _write_json(Path(directory) / "all.trace.json", merged)


# ---- reading a trace back: the measured parts of a step ---------------------------------------------

def _union(intervals) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        elif b > a:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _length(intervals) -> float:
    return sum(b - a for a, b in _union(intervals))


def _minus(intervals, holes) -> float:
    """Length of the union of ``intervals`` outside the union of ``holes``."""
    holes = _union(holes)
    total = 0.0
    for a, b in _union(intervals):
        total += b - a - _length([(max(a, c), min(b, d)) for c, d in holes if c < b and d > a])
    return total


# --8<-- [start:step_parts]
def step_parts(trace: dict) -> list[dict]:
    """Per step of one rank's trace: seconds of ``step`` (the whole), ``compute`` (forward and backward, not
    blocked), ``exposed_comm`` (blocked in a collective), ``bubble`` (pipeline idle between slots), ``optimizer``
    (clip and step, not blocked) and ``other`` (what is left: the loss metric, Python)."""
    slices = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    iv = lambda e: (e["ts"] / _US, (e["ts"] + e["dur"]) / _US)    # noqa: E731
    out = []
    for s in (e for e in slices if e["cat"] == "step"):
        a, b = iv(s)
        inside = [e for e in slices if e["ts"] >= s["ts"] and e["ts"] < s["ts"] + s["dur"]]
        waits = [iv(e) for e in inside if e["cat"] == "comm_wait"]
        work = [iv(e) for e in inside if e["cat"] in ("compute", "pipeline")]
        opt = [iv(e) for e in inside if e["cat"] == "optimizer"]
        sched = [iv(e) for e in inside if e["cat"] == "pipeline_step"]
        parts = {"step": s["args"]["step"], "total": b - a, "compute": _minus(work, waits),
                 "exposed_comm": _length([(max(a, c), min(b, d)) for c, d in waits if d > a and c < b]),
                 "bubble": _minus(sched, work + waits), "optimizer": _minus(opt, waits)}
        parts["other"] = max(0.0, parts["total"] - sum(parts[k] for k in ("compute", "exposed_comm", "bubble",
                                                                          "optimizer")))
        out.append(parts)
    return out
# --8<-- [end:step_parts]


def read(path) -> dict:
    """A trace file written by `write`, checked for the shape `step_parts` relies on (files are input)."""
    path = Path(path)
    if path.stat().st_size > 512 * 2 ** 20:
        raise ValueError(f"{path}: larger than 512 MiB; not a minimega trace")
    trace = json.loads(path.read_text())
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        raise ValueError(f"{path}: not a Chrome trace (no traceEvents list)")
    for e in trace["traceEvents"]:
        if not isinstance(e, dict) or e.get("ph") == "X" and not (
                isinstance(e.get("ts"), (int, float)) and isinstance(e.get("dur"), (int, float))
                and isinstance(e.get("cat"), str) and isinstance(e.get("args"), dict)
                and (e["cat"] != "step" or isinstance(e["args"].get("step"), int))):
            raise ValueError(f"{path}: malformed trace event {str(e)[:80]}")
    return trace
