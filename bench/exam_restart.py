"""How quickly the exam service is healthy again after `kill -9`, idle, and where its start-up time goes.

Starts `minimega serve` (a private bank written to a temporary folder, SQLite, no site build) on loopback, waits
for /api/v1/health, kills it with SIGKILL, starts it again on the same var/ and database, and reports the seconds
from the second start to the first healthy answer. Apart, in fresh interpreters: the import of the service
(`minimega.classroom.service` with FastAPI) and the bank loading with its sample-overlap check. Target: healthy
within 5 s of the kill (OPERATING.md).

    PYTHONPATH=src python bench/exam_restart.py [--json]
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def healthy_after(proc, port: int, limit_s: float = 60) -> float:
    t = time.monotonic()
    while time.monotonic() - t < limit_s:
        if proc.poll() is not None:
            raise SystemExit(f"serve exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/health", timeout=1) as r:
                if r.status == 200:
                    return time.monotonic() - t
        except OSError:
            time.sleep(0.02)
    raise SystemExit(f"not healthy within {limit_s} s")


def timed(code: str) -> float:
    out = subprocess.run([sys.executable, "-c", f"import time; t = time.perf_counter(); {code}; "
                          "print(time.perf_counter() - t)"], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT / "src")}, cwd=ROOT)
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    from bank_support import write_private_bank

    with tempfile.TemporaryDirectory() as tmp:
        bank = write_private_bank(Path(tmp) / "bank")
        port = free_port()
        cmd = [sys.executable, "-m", "minimega", "serve", "--no-build", "--dev", "--port", str(port), "--var-dir",
               str(Path(tmp) / "var"), "--site-dir", str(Path(tmp) / "site"), "--exam-banks", str(bank)]
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
        first = subprocess.Popen(cmd, cwd=tmp, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        cold = healthy_after(first, port)
        first.send_signal(signal.SIGKILL)
        first.wait()
        t = time.monotonic()
        second = subprocess.Popen(cmd, cwd=tmp, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        healthy_after(second, port)
        restart = time.monotonic() - t                 # from the new process's start to its first healthy answer
        second.send_signal(signal.SIGKILL)
        second.wait()
        imports = timed("import minimega.classroom.service")
        banks_s = timed(f"from minimega.classroom import banks, checkbank; b = banks.open_bank_set({str(bank)!r}, 3); "
                        "banks.load_translations; checkbank.sample_overlap(b)")
    result = {"first_start_s": round(cold, 2), "restart_after_kill9_s": round(restart, 2),
              "import_service_s": round(imports, 2), "bank_load_and_overlap_s": round(banks_s, 2)}
    if args.json:
        print(json.dumps(result))
    else:
        print(f"first start healthy in {cold:.2f} s; after kill -9 healthy in {restart:.2f} s "
              f"(imports {imports:.2f} s, bank loading + sample-overlap check {banks_s:.2f} s)")


if __name__ == "__main__":
    main()
