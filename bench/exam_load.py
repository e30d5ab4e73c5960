"""Load on a real `minimega serve` process over loopback: N clients, each a learner who signs in through the
development mailer, starts an attempt, answers every question, finishes and reads the review, again and
again for the given time. Reports requests/s and latency percentiles per endpoint, then checks the
database: every answer acknowledged with 200 is stored exactly once, every acknowledged finish is
recorded, and no attempt holds an answer nobody was told was recorded.

    python bench/exam_load.py [--clients 20] [--seconds 60] [--questions-per-chapter 3]
                              [--db postgresql://user@host/dbname] [--instances 2]

``--db`` as for `minimega serve` (default: a SQLite file in a temp folder; a PostgreSQL database should be
empty or one this script used before). ``--instances N`` starts N servers on the same database and one
signing key; client k talks to server k mod N, as behind a round-robin load balancer.
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Client:
    """One learner at a time over one keep-alive connection; records (endpoint, seconds, status)."""

    def __init__(self, port: int, log: list, acked: dict, stop: threading.Event, n: int):
        self.port, self.log, self.acked, self.stop, self.n = port, log, acked, stop, n
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        self.auth: dict = {}

    def call(self, name: str, method: str, path: str, body=None):
        data = None if body is None else json.dumps(body).encode()
        t = time.perf_counter()
        try:
            self.conn.request(method, path, body=data, headers={"Content-Type": "application/json", **self.auth})
            resp = self.conn.getresponse()
            payload = resp.read()
        except (OSError, http.client.HTTPException):
            self.conn.close()
            self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
            self.log.append((name, time.perf_counter() - t, 0))
            return 0, None
        self.log.append((name, time.perf_counter() - t, resp.status))
        return resp.status, json.loads(payload) if payload else None

    def run(self):
        i = 0
        while not self.stop.is_set():
            i += 1
            self.auth = {}
            status, sent = self.call("signin", "POST", "/api/v1/signin", {"email": f"c{self.n}-{i}@example.org"})
            if status != 200:
                continue
            token = sent["dev_link"].split("#signin=")[1]
            status, session = self.call("confirm", "POST", "/api/v1/signin/confirm", {"token": token})
            if status != 200:
                continue
            self.auth = {"Authorization": f"Bearer {session['session']}"}
            status, attempt = self.call("start", "POST", "/api/v1/attempts", {"display_name": f"Load {self.n}"})
            if status != 201:
                continue
            aid = attempt["attempt_id"]
            for q in attempt["questions"]:
                if self.stop.is_set():
                    break
                body = {"value": 1.0} if q["type"] == "numeric" else (
                    {"choice": 0} if q["type"] == "single" else {"choices": [0]})
                status, _ = self.call("answer", "POST", f"/api/v1/attempts/{aid}/answers/{q['number']}", body)
                if status == 200:
                    self.acked["answers"].add((aid, q["number"]))
            if self.stop.is_set():
                continue
            status, _ = self.call("finish", "POST", f"/api/v1/attempts/{aid}/finish")
            if status == 200:
                self.acked["finished"].add(aid)
            self.call("review", "GET", f"/api/v1/attempts/{aid}/review")


def percentile(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q / 100 * (len(values) - 1))))] if values else float("nan")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--questions-per-chapter", type=int, default=3)
    ap.add_argument("--db", help="SQLite file or postgresql:// URL (default: SQLite in a temp folder)")
    ap.add_argument("--instances", type=int, default=1, help="servers on the one database (default 1)")
    args = ap.parse_args(argv)
    if not 1 <= args.instances <= 8:
        raise SystemExit("--instances: 1 to 8")

    tmp = Path(tempfile.mkdtemp(prefix="exam-load-"))
    db = args.db or str(tmp / "var" / "classroom.sqlite3")
    ports = [free_port() for _ in range(args.instances)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))}
    sys.path.insert(0, str(ROOT / "src"))
    from minimega.classroom.keys import Keyring
    from minimega.classroom.stores import open_store
    Keyring.open(tmp / "keys", create=True)        # one signing key for every instance, made before they start
    servers = []
    for k, port in enumerate(ports):
        cmd = [sys.executable, "-m", "minimega.classroom.cli", "serve", "--port", str(port),
               "--var-dir", str(tmp / f"var{k}"), "--keys-dir", str(tmp / "keys"), "--db", db,
               "--site-dir", str(tmp / "site"), "--banks-dir", str(ROOT / "quizzes" / "exam"), "--no-build", "--min-attempt-s", "0", "--dev",
               "--questions-per-chapter", str(args.questions_per_chapter), "--attempts-per-day", "1000000",
               "--fail-cooldown-s", "0", "--ip-attempts-per-hour", "100000000", "--ip-requests-per-minute", "100000000",
               "--ip-signins-per-hour", "100000000"]
        servers.append(subprocess.Popen(cmd, env=env, cwd=tmp, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    try:
        deadline = time.monotonic() + 180
        for port, server in zip(ports, servers):
            while True:
                try:
                    c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
                    c.request("GET", "/api/v1/health")
                    if c.getresponse().status == 200:
                        break
                except OSError:
                    if time.monotonic() > deadline or server.poll() is not None:
                        raise SystemExit("a server did not start")
                    time.sleep(0.2)

        log: list = []
        acked = {"answers": set(), "finished": set()}
        stop = threading.Event()
        clients = [Client(ports[n % len(ports)], log, acked, stop, n) for n in range(args.clients)]
        threads = [threading.Thread(target=c.run) for c in clients]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        time.sleep(args.seconds)
        stop.set()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - t0
    finally:
        for server in servers:
            server.terminate()
        for server in servers:
            server.wait(timeout=30)

    by = defaultdict(list)
    for name, seconds, status in log:
        by[name].append((seconds, status))
    store = open_store(db)
    backend = "PostgreSQL" if store.shared else "SQLite WAL, synchronous=FULL"
    print(f"{args.clients} clients, {elapsed:.1f} s, loopback, {args.instances} x `minimega serve` ({backend})")
    print(f"{'endpoint':<9} {'requests':>8} {'req/s':>7} {'p50 ms':>7} {'p95 ms':>7} {'p99 ms':>7}  statuses")
    for name in ("signin", "confirm", "start", "answer", "finish", "review"):
        rows = by.get(name, [])
        ms = [s * 1000 for s, _ in rows]
        codes = dict(sorted(((c, sum(1 for _, x in rows if x == c)) for c in {x for _, x in rows})))
        print(f"{name:<9} {len(rows):>8} {len(rows) / elapsed:>7.1f} {percentile(ms, 50):>7.1f} "
              f"{percentile(ms, 95):>7.1f} {percentile(ms, 99):>7.1f}  {codes}")
    all_ms = [s * 1000 for _, s, _ in log]
    print(f"{'all':<9} {len(log):>8} {len(log) / elapsed:>7.1f} {percentile(all_ms, 50):>7.1f} "
          f"{percentile(all_ms, 95):>7.1f} {percentile(all_ms, 99):>7.1f}  "
          f"errors (status 0 or 5xx): {sum(1 for _, _, c in log if c == 0 or c >= 500)}")

    rows = store.fetchall("SELECT attempt_id, number, COUNT(*) FROM answers GROUP BY attempt_id, number")
    stored = {(a, n) for a, n, _ in rows}
    duplicated = sum(1 for *_, k in rows if k != 1)
    lost = len(acked["answers"] - stored)
    unacked = len(stored - acked["answers"])        # stored, though the client never saw the 200 (cut off by stop)
    finished = {r[0] for r in store.fetchall("SELECT id FROM attempts WHERE finished_at IS NOT NULL")}
    lost_finishes = len(acked["finished"] - finished)
    print(f"database: {len(stored)} answers stored, {len(acked['answers'])} acknowledged; lost {lost}, "
          f"duplicated {duplicated}, stored but unacknowledged {unacked}; finishes acknowledged "
          f"{len(acked['finished'])}, lost {lost_finishes}")
    ok = lost == 0 and duplicated == 0 and lost_finishes == 0
    print("OK: nothing lost or duplicated" if ok else "FAILED: see the counts above")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
