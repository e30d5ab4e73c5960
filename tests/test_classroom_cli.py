"""`cert verify | revoke | rotate-key` and a real `serve` process: round trip, bounded load test, kill -9."""
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from classroom_support import BANKS, ROOT, answer_key
from minimega.classroom.exam import CHAPTERS

ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))}


def cli(*args, **kw):
    """The real entry point, in a fresh process."""
    return subprocess.run([sys.executable, "-m", "minimega.classroom.cli", *map(str, args)],
                          capture_output=True, text=True, env=ENV, timeout=60, **kw)


class Ran:
    def __init__(self, returncode, stdout, stderr):
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


def cli_fast(capsys, *args):
    """The same `main`, in this process (no interpreter start-up per call)."""
    from minimega.classroom.cli import main

    capsys.readouterr()
    try:
        code = main([str(a) for a in args])
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else 2
        print(exit_.code, file=sys.stderr)
    out = capsys.readouterr()
    return Ran(code, out.out, out.err)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def call(base, method, path, body=None, headers=None):
    req = urllib.request.Request(base + path, method=method, data=None if body is None else json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("serve")
    port = free_port()
    log = open(tmp / "serve.log", "w")
    args = ["serve", "--port", port, "--var-dir", tmp / "var", "--site-dir", tmp / "site", "--banks-dir", BANKS,
            "--questions-per-chapter", 3, "--no-build", "--min-attempt-s", "0", "--ip-attempts-per-hour", 100000,
            "--ip-requests-per-minute", 1000000, "--attempts-per-day", 100, "--dev",
            "--ip-signins-per-hour", 100000]
    proc = subprocess.Popen([sys.executable, "-m", "minimega.classroom.cli", *map(str, args)],
                            stdout=log, stderr=subprocess.STDOUT, env=ENV, cwd=tmp)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120              # `import minimega` pulls in torch: slow on a busy machine
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if call(base, "GET", "/api/v1/health")[0] == 200:
                break
        except OSError:
            time.sleep(0.2)
    else:
        proc.kill()
        pytest.fail("server did not start: " + (tmp / "serve.log").read_text())
    yield {"base": base, "proc": proc, "tmp": tmp}
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    log.close()


def sign_in_http(base, email):
    status, sent = call(base, "POST", "/api/v1/signin", {"email": email})
    assert status == 200, sent
    status, session = call(base, "POST", "/api/v1/signin/confirm", {"token": sent["dev_link"].split("#signin=")[1]})
    assert status == 200, session
    return {"Authorization": f"Bearer {session['session']}"}


def pass_via_http(base, name, db):
    auth = sign_in_http(base, f"{name.replace(' ', '.').lower()}@example.org")
    status, attempt = call(base, "POST", "/api/v1/attempts", {"display_name": name}, auth)
    assert status == 201, attempt
    key = answer_key(db, attempt["attempt_id"])
    for q in attempt["questions"]:
        assert call(base, "POST", f"/api/v1/attempts/{attempt['attempt_id']}/answers/{q['number']}",
                    key[q["number"]][0], auth)[0] == 200
    status, fin = call(base, "POST", f"/api/v1/attempts/{attempt['attempt_id']}/finish", None, auth)
    assert status == 200 and fin["passed"]
    return fin["credential"]["code"]


def test_cli_round_trip_revoke_and_rotate(server, tmp_path, capsys):
    base, var = server["base"], server["tmp"] / "var"
    code = pass_via_http(base, "Katherine Johnson", var / "classroom.sqlite3")
    with urllib.request.urlopen(f"{base}/api/v1/credentials/{code}") as r:
        cred = json.loads(r.read())
    path = tmp_path / "cert.json"
    path.write_text(json.dumps(cred))

    untrusted = cli("cert", "verify", path, "--offline")        # nothing says this issuer is the course
    assert untrusted.returncode == 3, untrusted.stderr
    assert untrusted.stdout.startswith("NOT TRUSTED (signature valid, issuer not trusted)")
    offline = cli("cert", "verify", path, "--offline", "--trust", cred["issuer"]["id"])
    assert offline.returncode == 0, offline.stderr
    assert "VALID" in offline.stdout and "Katherine Johnson" in offline.stdout and "not checked (offline)" in offline.stdout
    online = cli_fast(capsys, "cert", "verify", code, "--issuer-url", base, "--json")   # trusts what BASE publishes
    result = json.loads(online.stdout)
    assert online.returncode == 0 and result["valid"] and result["revocation"].startswith("not revoked")
    assert {c["check"] for c in result["checks"] if c["status"] == "pass"} >= {"issuer trusted", "revocation"}
    assert result["trusted_issuers"][cred["issuer"]["id"]] == f"published by {base}"

    cred["credentialSubject"]["identifier"][0]["identityHash"] = "Someone Else"
    path.write_text(json.dumps(cred))
    tampered = cli_fast(capsys, "cert", "verify", path, "--offline", "--trust", cred["issuer"]["id"])
    assert tampered.returncode == 1 and "signature does not match" in tampered.stderr

    revoke = cli_fast(capsys, "cert", "revoke", code.lower(), "--reason", "test", "--var-dir", var)
    assert revoke.returncode == 0 and "revoked" in revoke.stdout
    after = json.loads(cli_fast(capsys, "cert", "verify", code, "--issuer-url", base, "--json").stdout)
    assert not after["valid"] and after["revocation"].startswith("revoked")
    assert cli_fast(capsys, "cert", "revoke", "ZZZZ-ZZZZ-ZZZZ-ZZZZ-Z", "--var-dir", var).returncode != 0

    svg_path = tmp_path / "cert.svg"
    code2 = pass_via_http(base, "Dorothy Vaughan", var / "classroom.sqlite3")
    with urllib.request.urlopen(f"{base}/certificates/{code2}.svg") as r:
        svg_path.write_bytes(r.read())
    assert cli_fast(capsys, "cert", "verify", svg_path, "--issuer-url", base).returncode == 0

    rotate = cli_fast(capsys, "cert", "rotate-key", "--var-dir", var)
    assert rotate.returncode == 0 and "older key(s) stay published" in rotate.stdout
    assert len(list((var / "keys").glob("key-*.pem"))) == 2
    listed = cli_fast(capsys, "cert", "keys", "--var-dir", var).stdout.splitlines()
    assert len(listed) == 2 and "signs new certificates" in listed[1] and listed[0].split()[0] in json.dumps(cred)


def test_erase_a_learner_and_their_copy_still_verifies(server, tmp_path, capsys):
    base, var = server["base"], server["tmp"] / "var"
    code = pass_via_http(base, "Grace Hopper", var / "classroom.sqlite3")
    with urllib.request.urlopen(f"{base}/api/v1/credentials/{code}") as r:
        held = tmp_path / "held.json"                               # the copy the learner keeps
        held.write_bytes(r.read())

    assert "--email" in cli_fast(capsys, "cert", "erase", "--var-dir", var).stderr       # who: required
    bad = cli_fast(capsys, "cert", "erase", "--email", "not-an-address", "--var-dir", var)
    assert bad.returncode != 0 and "--email" in bad.stderr
    erased = cli_fast(capsys, "cert", "erase", "--email", "Grace.Hopper@example.org", "--var-dir", var)
    assert erased.returncode == 0, erased.stderr
    assert erased.stdout.startswith("erased that address: 1 attempts,") and "1 credentials" in erased.stdout

    for path in (f"/api/v1/credentials/{code}", f"/certificates/{code}", f"/certificates/{code}.svg"):
        status, body = call(base, "GET", path)
        assert status == 410 and "erased at its holder's request" in body["detail"], (path, status, body)
    lookup = cli_fast(capsys, "cert", "verify", code, "--issuer-url", base)
    assert lookup.returncode != 0 and "HTTP 410 (this credential was erased" in lookup.stderr
    kept = json.loads(cli_fast(capsys, "cert", "verify", held, "--issuer-url", base, "--json").stdout)
    assert kept["valid"] and kept["revocation"].startswith("not revoked")
    assert b"Grace Hopper" not in (var / "classroom.sqlite3").read_bytes()

    again = cli_fast(capsys, "cert", "erase", "--code", code.lower(), "--var-dir", var)
    assert again.returncode == 0 and "erased already" in again.stdout
    none = cli_fast(capsys, "cert", "erase", "--email", "nobody@example.org", "--var-dir", var)
    assert none.returncode == 0 and none.stdout.startswith("nothing stored for that address")


LOAD_THREADS, LOAD_ANSWERS = 20, 2000


def test_load_every_answer_stored_once_and_survives_kill(server, capsys):
    base = server["base"]
    per_attempt = 3 * len(CHAPTERS)                       # --questions-per-chapter 3
    n_attempts = -(-LOAD_ANSWERS // per_attempt)
    db = server["tmp"] / "var" / "classroom.sqlite3"
    auths = [sign_in_http(base, f"load{i}@example.org") for i in range(n_attempts)]
    attempts = [call(base, "POST", "/api/v1/attempts", {"display_name": f"Load {i}"}, auth)[1]
                for i, auth in enumerate(auths)]
    keys = {a["attempt_id"]: (auth, answer_key(db, a["attempt_id"])) for a, auth in zip(attempts, auths)}
    jobs = [(a["attempt_id"], q) for a in attempts for q in a["questions"]][:LOAD_ANSWERS]

    def send(job):
        aid, q = job
        auth, key = keys[aid]
        return call(base, "POST", f"/api/v1/attempts/{aid}/answers/{q['number']}", key[q["number"]][0], auth)[0]

    t0 = time.perf_counter()
    with ThreadPoolExecutor(LOAD_THREADS) as pool:
        codes = list(pool.map(send, jobs))
    elapsed = time.perf_counter() - t0
    assert codes.count(200) == LOAD_ANSWERS
    with capsys.disabled():
        print(f"\n[load] {LOAD_ANSWERS} answers from {LOAD_THREADS} threads in {elapsed:.2f} s "
              f"= {LOAD_ANSWERS / elapsed:.0f} requests/s")

    server["proc"].send_signal(signal.SIGKILL)            # no shutdown, no checkpoint
    server["proc"].wait()
    import sqlite3
    con = sqlite3.connect(server["tmp"] / "var" / "classroom.sqlite3")
    ids = tuple(a["attempt_id"] for a in attempts)
    rows = con.execute(f"SELECT attempt_id, number, COUNT(*) FROM answers WHERE attempt_id IN ({','.join('?' * len(ids))}) "
                       "GROUP BY attempt_id, number", ids).fetchall()
    assert len(rows) == LOAD_ANSWERS and all(r[2] == 1 for r in rows)
    assert {(a, q["number"]) for a, q in jobs} == {(r[0], r[1]) for r in rows}


def test_serve_and_cert_help(capsys):
    for args in (["serve", "--help"], ["cert", "verify", "--help"], ["cert", "revoke", "--help"]):
        out = cli_fast(capsys, *args)
        assert out.returncode == 0 and "usage" in out.stdout
    assert "--issuer-url" in cli_fast(capsys, "cert", "verify", "--help").stdout
    assert cli_fast(capsys, "cert", "verify", "not-a-file-nor-code").returncode != 0
