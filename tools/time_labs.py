"""Time every lab: run each notebook's code cells (labs/NN-slug.ipynb) in order as one
process from labs/, with the reference solutions (MINIMEGA_LAB_SOLUTIONS=1) and plots not shown, and
write the wall-clock seconds to labs/run-times.json, which the Start here page's time-per-chapter table
reads (tools/learner_hook.py).

    python tools/time_labs.py                 # all labs
    python tools/time_labs.py 03-zero         # one
"""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "labs" / "run-times.json"
RUN = ("import json, sys, plotly.basedatatypes as b; b.BaseFigure.show = lambda *a, **k: None\n"
       "cells = [''.join(c['source']) for c in json.load(open(sys.argv[1]))['cells'] if c['cell_type'] == 'code']\n"
       "ns = {'__name__': '__main__'}\n"
       "for code in cells: exec(compile(code, sys.argv[1], 'exec'), ns)\n")


def time_lab(source: Path) -> float:
    env = {**os.environ, "MINIMEGA_LAB_SOLUTIONS": "1", "PYTHONPATH": os.pathsep.join(
        [str(ROOT / "src"), str(ROOT / "labs"), os.environ.get("PYTHONPATH", "")])}
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", RUN, str(source)], cwd=ROOT / "labs", env=env,
                          capture_output=True, text=True, timeout=900)
    took = time.monotonic() - t0
    if proc.returncode:
        raise SystemExit(f"{source.name} failed:\n{proc.stderr[-2000:]}")
    return took


def main(argv: list[str]) -> int:
    data = json.loads(OUT.read_text(encoding="utf-8")) if OUT.exists() else {"seconds": {}}
    for source in sorted((ROOT / "labs").glob("[0-9][0-9]-*.ipynb")):
        if argv and source.stem not in argv:
            continue
        data["seconds"][source.stem] = round(time_lab(source), 1)
        print(f"{source.stem}: {data['seconds'][source.stem]} s", flush=True)
    data["machine"] = f"{platform.machine()}, {os.cpu_count()} CPU cores (shared), gloo"
    data["seconds"] = dict(sorted(data["seconds"].items()))
    OUT.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
