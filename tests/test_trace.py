"""`minimega.run.trace`: the Chrome traces of ``minimega train --trace`` and ``minimega trace compare``."""
import contextlib
import io
import json
from collections import defaultdict

import jsonschema
import pytest

from minimega.run import trace
from minimega.tools.cli import main

# The Trace Event Format (Google's "Trace Event Format" document, the JSON Object Format): what chrome://tracing
# and Perfetto's JSON importer read. Complete events ("X") need ts and dur in microseconds; metadata ("M")
# events name processes and threads.
EVENT = {
    "type": "object",
    "required": ["name", "ph", "pid", "tid"],
    "properties": {
        "name": {"type": "string"}, "cat": {"type": "string"}, "ph": {"enum": ["X", "M"]},
        "pid": {"type": "integer", "minimum": 0}, "tid": {"type": "integer", "minimum": 0},
        "ts": {"type": "number", "minimum": 0}, "dur": {"type": "number", "minimum": 0},
        "args": {"type": "object"},
    },
    "allOf": [
        {"if": {"properties": {"ph": {"const": "X"}}}, "then": {"required": ["ts", "dur", "cat", "args"]}},
        {"if": {"properties": {"ph": {"const": "M"}}},
         "then": {"properties": {"name": {"enum": ["process_name", "process_sort_index", "thread_name",
                                                   "thread_sort_index"]}}, "required": ["args"]}},
    ],
}
TRACE = {"type": "object", "required": ["traceEvents"],
         "properties": {"traceEvents": {"type": "array", "items": EVENT}, "displayTimeUnit": {"enum": ["ms", "ns"]},
                        "otherData": {"type": "object"}}}


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    """A 2-rank ZeRO-3 run with a checkpoint save, traced."""
    root = tmp_path_factory.mktemp("traced")
    out, printed = root / "trace", io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(["train", "--nproc", "2", "--zero-stage", "3", "--steps", "3", "--save-dir", str(root / "ck"),
                     "--save-every", "2", "--trace", str(out), "--json"]) == 0
    (root / "summary.json").write_text(printed.getvalue().strip().splitlines()[-1])
    return root


def _nested_or_disjoint(slices) -> bool:
    """A viewer stacks slices on one track only if each pair is nested or disjoint."""
    stack = []
    for s in sorted(slices, key=lambda s: (s["ts"], -s["dur"])):
        while stack and stack[-1] <= s["ts"] + 1e-3:
            stack.pop()
        end = s["ts"] + s["dur"]
        if stack and end > stack[-1] + 1e-3:
            return False
        stack.append(end)
    return True


def test_two_rank_zero3_trace_is_valid_with_one_track_per_rank_and_separate_lanes(traced):
    out = traced / "trace"
    files = trace.rank_files(out)
    assert [f.name for f in files] == ["rank0.trace.json", "rank1.trace.json"]
    merged = json.loads((out / "all.trace.json").read_text())
    for doc in [json.loads(f.read_text()) for f in files] + [merged]:
        jsonschema.validate(doc, TRACE)
    events = merged["traceEvents"]
    procs = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert procs == {0: "rank 0", 1: "rank 1"}
    lanes = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"}
    cats = defaultdict(set)
    for e in events:
        if e["ph"] == "X":
            cats[(e["pid"], e["tid"])].add(e["cat"])
    for rank in (0, 1):
        mine = {lanes[k]: c for k, c in cats.items() if k[0] == rank}
        assert mine["compute"] == {"compute", "optimizer"} and mine["step"] == {"step"}
        assert mine["checkpoint"] == {"checkpoint"}
        assert any(n.startswith("comm in flight") for n in mine) and any(n.startswith("comm wait") for n in mine)
        assert all(c <= {"comm"} for n, c in mine.items() if n.startswith("comm in flight"))
        assert all(c <= {"comm_wait"} for n, c in mine.items() if n.startswith("comm wait"))
        assert sum(e["name"] == "forward" for e in events if e["pid"] == rank) == 3
    by_track = defaultdict(list)
    for e in events:
        if e["ph"] == "X":
            by_track[(e["pid"], e["tid"])].append(e)
    assert all(_nested_or_disjoint(v) for v in by_track.values())
    # bytes: every collective's ring-model bytes add up to what the run reports; a save's bytes are its shard file
    summary = json.loads((traced / "summary.json").read_text())
    sent = sum(e["args"]["sent_bytes"] for e in events if e.get("cat") == "comm")
    assert sent == pytest.approx(summary["algorithmic_bytes_sent_all_ranks"])
    assert {e["args"]["op"] for e in events if e.get("cat") == "comm"} >= {"all_gather", "reduce_scatter"}
    saves = [e for e in events if e.get("cat") == "checkpoint"]
    assert len(saves) == 2
    for s in saves:
        shard = traced / "ck" / "step-00000002" / f"shard-{s['pid']:05d}.safetensors"
        assert s["args"]["step"] == 2 and s["args"]["bytes"] == shard.stat().st_size


def test_trace_compare_prints_measured_next_to_predicted(traced, capsys):
    out = traced / "trace"
    assert main(["trace", "compare", str(out)]) == 0
    text = capsys.readouterr().out
    assert "measured" in text and "predicted" in text
    rows = {line.split()[0]: line.split()[-2:] for line in text.splitlines()[2:]}
    assert set(rows) == {"compute", "exposed", "bubble", "optimizer", "other", "total"}
    assert main(["trace", "compare", str(out), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["measured"]["total"] > 0 and got["predicted"]["total"] > 0
    parts = ("compute", "exposed_comm", "bubble", "optimizer", "other")
    for side in ("measured", "predicted"):
        assert sum(got[side][k] for k in parts) == pytest.approx(got[side]["total"])
    assert got["measured"]["exposed_comm"] > 0 and got["measured"]["bubble"] == 0    # ZeRO-3 waits, no pipeline


def test_step_parts_on_a_hand_made_trace():
    """Intervals chosen by hand: compute [0, 10] ms blocked in [8, 12], optimizer [12, 14], step [0, 15]."""
    ms = 1e3
    x = lambda cat, a, b, **args: {"ph": "X", "cat": cat, "name": cat, "ts": a * ms, "dur": (b - a) * ms,  # noqa: E731
                                   "pid": 0, "tid": 1, "args": args}
    t = {"traceEvents": [x("step", 0, 15, step=0), x("compute", 0, 6), x("compute", 6, 10), x("comm", 2, 12),
                         x("comm_wait", 8, 12), x("optimizer", 12, 14)]}
    (p,) = trace.step_parts(t)
    assert p["total"] == pytest.approx(15e-3) and p["compute"] == pytest.approx(8e-3)
    assert p["exposed_comm"] == pytest.approx(4e-3) and p["optimizer"] == pytest.approx(2e-3)
    assert p["bubble"] == 0 and p["other"] == pytest.approx(1e-3)


def test_compare_refuses_what_is_not_a_trace(tmp_path):
    assert main(["trace", "compare", str(tmp_path)]) == 2
    (tmp_path / "rank0.trace.json").write_text('{"traceEvents": [{"ph": "X", "ts": "soon"}]}')
    assert main(["trace", "compare", str(tmp_path)]) == 2
