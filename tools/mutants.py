"""Mutants on record: break the core on purpose, one small change at a time, and see which test goes red.

Each mutant in tools/mutants.toml names a file under src/, an ``old`` string found there exactly once, the
``new`` string that replaces it, and the tests that should catch it (``tests``: pytest paths, ``k``: a -k
expression, kept narrow so the run stays short). For each mutant the runner copies src/ to a temporary
folder, applies the one replacement there (the working tree is never touched), runs the tests against
the copy (``PYTHONPATH``) and records whether they failed: a mutant is *killed* when its tests fail, and
*survives* when they pass. It prints a table (mutant, killed by, seconds) and exits non-zero when one
survives or its tests could not run.

    python tools/mutants.py                 # every mutant (``make mutants``)
    python tools/mutants.py --only NAME ... # some
    python tools/mutants.py --check         # each old string is found exactly once (no test run)
    python tools/mutants.py --markdown FILE # also write the table as Markdown
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIST = ROOT / "tools" / "mutants.toml"
FIELDS = {"name", "file", "old", "new", "tests", "k", "why"}


def load(path: Path = LIST) -> list[dict]:
    """The mutants, each checked for its fields, a unique name and a file under src/."""
    mutants = tomllib.loads(path.read_text())["mutant"]
    names = set()
    for m in mutants:
        missing, extra = {"name", "file", "old", "new", "tests"} - set(m), set(m) - FIELDS
        if missing or extra:
            raise ValueError(f"mutant {m.get('name')!r}: missing {sorted(missing)}, unknown {sorted(extra)}")
        if m["name"] in names:
            raise ValueError(f"mutant {m['name']!r} is listed twice")
        names.add(m["name"])
        if m["old"] == m["new"]:
            raise ValueError(f"mutant {m['name']!r}: new equals old")
        if not m["file"].startswith("src/") or ".." in Path(m["file"]).parts:
            raise ValueError(f"mutant {m['name']!r}: file {m['file']!r} is not under src/")
    return mutants


def problems(mutants: list[dict], root: Path = ROOT) -> list[str]:
    """What stops a mutant from applying to the source under ``root``: a missing file, or an old string
    found other than exactly once."""
    out = []
    for m in mutants:
        path = root / m["file"]
        if not path.is_file():
            out.append(f"{m['name']}: {m['file']} does not exist")
            continue
        n = path.read_text().count(m["old"])
        if n != 1:
            out.append(f"{m['name']}: old string found {n} times in {m['file']} (expected once)")
        for t in m["tests"]:
            if not (root / t.split("::")[0]).is_file():
                out.append(f"{m['name']}: test file {t} does not exist")
    return out


def run_one(m: dict, src_copy: Path, timeout: float) -> dict:
    """Apply ``m`` to the copy of src/, run its tests against it, undo; returns the row of the table."""
    path = src_copy.parent / m["file"]
    original = path.read_text()
    path.write_text(original.replace(m["old"], m["new"], 1))
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "--no-header", *m["tests"]]
    if m.get("k"):
        cmd += ["-k", m["k"]]
    env = {**os.environ, "PYTHONPATH": str(src_copy), "PYTHONDONTWRITEBYTECODE": "1"}
    t = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
        rc, out = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as exc:
        rc, out = None, (exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes) else ""
    finally:
        path.write_text(original)
    seconds = time.perf_counter() - t
    failed = re.findall(r"^(?:FAILED|ERROR) (\S+)", out, re.M)
    errors = re.findall(r"^E\s+(\S.*)$", out, re.M)              # pytest's first explanation line
    detail = errors[0][:160] if errors else ""
    if rc is None:                             # inconclusive: a slow machine, or a mutant that hangs
        status, by = "TIMEOUT", f"after {timeout:.0f} s"
    elif rc == 1:
        status, by = "killed", failed[0] if failed else "a failing test"
    elif rc == 0:
        status, by = "SURVIVED", "-"
    else:                                      # 2-5: interrupted, internal error, usage, nothing collected
        status, by = "NOT RUN", f"pytest exit {rc}: " + (out.strip().splitlines() or ["no output"])[-1]
    return {"name": m["name"], "status": status, "by": by, "seconds": seconds, "detail": detail}


def table(rows: list[dict]) -> str:
    lines = ["| mutant | killed by | seconds | first failure line |", "|---|---|---:|---|"]
    for r in rows:
        by = r["by"] if r["status"] == "killed" else f"**{r['status']}** {r['by']}"
        detail = r["detail"].replace("|", "\\|").replace("`", "'")
        lines.append(f"| {r['name']} | `{by}` | {r['seconds']:.0f} | {detail} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="+", metavar="NAME", help="run only these mutants")
    ap.add_argument("--check", action="store_true", help="check that every mutant applies; run nothing")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per mutant's tests (default 600)")
    ap.add_argument("--markdown", type=Path, help="also write the table to this file")
    args = ap.parse_args(argv)
    mutants = load()
    if args.only:
        unknown = sorted(set(args.only) - {m["name"] for m in mutants})
        if unknown:
            ap.error(f"unknown mutant(s) {unknown}")
        by_name = {m["name"]: m for m in mutants}
        mutants = [by_name[n] for n in dict.fromkeys(args.only)]          # in the order asked
    bad = problems(mutants)
    if bad or args.check:
        print("\n".join(bad) or f"{len(mutants)} mutants apply cleanly")
        return 1 if bad else 0
    rows = []
    with tempfile.TemporaryDirectory(prefix="mutants-") as tmp:
        src_copy = Path(tmp) / "src"
        shutil.copytree(ROOT / "src", src_copy, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        for i, m in enumerate(mutants, 1):
            row = run_one(m, src_copy, args.timeout)
            rows.append(row)
            print(f"[{i}/{len(mutants)}] {row['name']}: {row['status']} by {row['by']} ({row['seconds']:.0f} s)"
                  f"\n    {row['detail']}", flush=True)
    text = table(rows)
    total = sum(r["seconds"] for r in rows)
    killed = sum(r["status"] == "killed" for r in rows)
    summary = f"{killed} of {len(rows)} mutants killed in {total / 60:.1f} min"
    print(f"\n{text}\n\n{summary}")
    if args.markdown:
        args.markdown.write_text(f"{text}\n\n{summary}\n")
    return 0 if killed == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
