"""How large a slow-connection flood the exam service survives on this machine.

Starts `minimega serve --dev` on loopback, then for each flood size opens that many connections that send part of
their headers and stop (from distinct 127.x.y.z addresses, within the per-address cap), probes /api/v1/health while
they are held, closes them, and reports the worst health latency. The largest size whose worst latency stays under
1 s is the answer. Loopback only; every connection is closed before the next size.

    PYTHONPATH=src python bench/exam_flood.py [--sizes 1000,2000,5000,10000,20000] [--json]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def health_s(port: int) -> float:
    t = time.monotonic()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/health", timeout=10) as r:
            r.read()
    except OSError:
        return float("inf")
    return time.monotonic() - t


def flood(port: int, n: int) -> dict:
    held, failed = [], 0
    t0 = time.monotonic()
    try:
        for i in range(n):
            s = socket.socket()
            try:
                s.bind((f"127.{1 + i // 60000}.{(i // 240) % 250}.{i % 240 + 1}", 0))
                s.settimeout(5)
                s.connect(("127.0.0.1", port))
                s.sendall(b"GET /api/v1/health HTTP/1.1\r\nHost: x\r\nX-Slow: ")
                held.append(s)
            except OSError:
                failed += 1
                s.close()
        opened = time.monotonic() - t0
        probes = [health_s(port) for _ in range(5)]
    finally:
        for s in held:
            s.close()
    return {"connections": n, "held": len(held), "refused": failed, "open_s": round(opened, 2),
            "health_worst_ms": round(max(probes) * 1000), "health_median_ms": round(sorted(probes)[2] * 1000)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1000,2000,5000,10000,20000")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    sizes = [int(x) for x in args.sizes.split(",")]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    tmp = Path(tempfile.mkdtemp(prefix="minimega-flood-"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))}
    log = open(tmp / "serve.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "minimega.classroom.cli", "serve", "--dev", "--no-build",
                             "--port", str(port), "--var-dir", str(tmp / "var"), "--site-dir", str(tmp / "site"),
                             "--limit-concurrency", str(max(sizes) + 1000)],
                            env=env, cwd=tmp, stdout=log, stderr=subprocess.STDOUT)
    rows = []
    try:
        deadline = time.monotonic() + 120
        while health_s(port) == float("inf"):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the service did not start; see {tmp / 'serve.log'}")
            time.sleep(0.3)
        for n in sizes:
            rows.append(flood(port, n))
            if not args.json:
                print(json.dumps(rows[-1]), flush=True)
            time.sleep(1)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()
    survived = []                                   # the largest size with it and every smaller one under 1 s
    for r in sorted(rows, key=lambda r: r["connections"]):
        if r["health_worst_ms"] >= 1000 or r["refused"]:
            break
        survived.append(r["connections"])
    log_lines = sum(1 for _ in open(tmp / "serve.log"))
    result = {"largest_flood_survived": max(survived, default=0), "rows": rows, "log_lines": log_lines,
              "open_files_limit": hard}
    print(json.dumps(result, indent=1) if args.json else
          f"largest flood with health under 1 s: {result['largest_flood_survived']} connections; "
          f"the service's log: {log_lines} lines")
    return 0


if __name__ == "__main__":
    sys.exit(main())
