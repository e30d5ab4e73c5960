"""Exam API: sign-in, no key shipped, answers recorded without feedback, review after, identity-keyed limits,
cooldown, resume, HTTP hardening, concurrency, migrations, fuzzing."""
import html
import json
import math
import sqlite3
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from fastapi.testclient import TestClient

from classroom_support import BANKS, answer_key, make_config, pass_exam, sign_in
from minimega.classroom import credential
from minimega.classroom.exam import CHAPTERS, load_exam_banks
from minimega.classroom.quiz import load_banks
from minimega.classroom.service import create_app
from minimega.classroom.store import MIGRATIONS, Store, StoreError


class Clock:
    """Real time, advanced by hand, started no later than 20:00 UTC: a test that moves it a few hours on stays
    within the UTC day its daily limits count (a run at 22:00 once crossed midnight and found the limit reset)."""

    def __init__(self):
        now = time.time()
        self.t = min(now, now // 86_400 * 86_400 + 20 * 3600)

    def __call__(self):
        return self.t


@pytest.fixture()
def clock():
    return Clock()


@pytest.fixture()
def client(tmp_path, clock):
    app = create_app(make_config(tmp_path, attempts_per_day=2), clock=clock)
    with TestClient(app) as c:
        yield c


def start(client, auth, name="Grace Hopper"):
    r = client.post("/api/v1/attempts", json={"display_name": name}, headers=auth)
    assert r.status_code == 201, r.text
    return r.json()


def test_banks_cover_every_chapter():
    banks = load_exam_banks(BANKS, per_chapter=3)
    assert set(CHAPTERS) <= set(banks)


def test_questions_ship_no_key_and_are_stratified(client):
    auth = sign_in(client)
    attempt = start(client, auth)
    assert [q["chapter"] for q in attempt["questions"]] == sorted(CHAPTERS)
    text = json.dumps(attempt)
    for q in attempt["questions"]:
        assert set(q) == {"number", "chapter", "chapter_title", "type", "question", "choices", "unit"}
    for bank in load_banks(BANKS):
        for it in bank.items:
            assert it.parametric or it.explain == "" or it.explain not in text
            assert all(c.explain not in text for c in it.choices)
    assert '"correct"' not in text and '"answer"' not in text and '"explain' not in text


def test_answers_are_recorded_locked_and_say_nothing(client):
    auth = sign_in(client)
    attempt = start(client, auth)
    aid = attempt["attempt_id"]
    key = answer_key(client.app.state.store, aid)
    r = client.post(f"/api/v1/attempts/{aid}/answers/1", json=key[1][1], headers=auth)       # wrong
    assert r.status_code == 200 and r.json() == {"number": 1, "recorded": True, "answered": 1, "total": len(CHAPTERS)}
    right = client.post(f"/api/v1/attempts/{aid}/answers/2", json=key[2][0], headers=auth)   # right
    assert right.json() == {"number": 2, "recorded": True, "answered": 2, "total": len(CHAPTERS)}  # same words
    again = client.post(f"/api/v1/attempts/{aid}/answers/1", json=key[1][0], headers=auth)
    assert again.status_code == 409 and "locked" in again.json()["detail"]
    assert client.post(f"/api/v1/attempts/{aid}/answers/99", json={"choice": 0}, headers=auth).status_code == 404
    assert client.post(f"/api/v1/attempts/{aid}/answers/3", json={"colour": "red"}, headers=auth).status_code == 422
    assert client.get(f"/api/v1/attempts/{aid}/review", headers=auth).status_code == 409   # not before the end
    fin = client.post(f"/api/v1/attempts/{aid}/finish", headers=auth).json()
    assert (fin["score"], fin["passed"], fin["credential"]) == (1, False, None)
    assert client.post(f"/api/v1/attempts/{aid}/answers/4", json={"choice": 0}, headers=auth).status_code == 409


def test_review_after_finish_gives_values_and_ideas_but_no_choice_keys(client):
    auth = sign_in(client)
    attempt = start(client, auth)
    aid = attempt["attempt_id"]
    key = answer_key(client.app.state.store, aid)
    for n in (1, 2, 3):
        client.post(f"/api/v1/attempts/{aid}/answers/{n}", json=key[n][n % 2], headers=auth)
    client.post(f"/api/v1/attempts/{aid}/finish", headers=auth)
    review = client.get(f"/api/v1/attempts/{aid}/review", headers=auth).json()
    assert review["score"] == 1 and len(review["items"]) == len(CHAPTERS)  # only question 2 was right
    for item in review["items"]:
        n = item["number"]
        assert item["correct"] == (n == 2)
        if item["type"] == "numeric":
            assert item["answer"] == pytest.approx(key[n][0]["value"], rel=0.06) and item["explain"]
        else:
            assert item["key"] is None and item["explains"] == [] and item["explain"]     # right or wrong, the idea
            keyed = {item["choices"][i] for i in ([key[n][0]["choice"]] if "choice" in key[n][0] else key[n][0]["choices"])}
            assert not any(text in item["explain"] for text in keyed)         # never naming the key
    assert [i["response"] for i in review["items"][:3]] == [key[1][1], key[2][0], key[3][1]]
    other = sign_in(client)                               # someone else cannot read it
    assert client.get(f"/api/v1/attempts/{aid}/review", headers=other).status_code == 404


def test_sign_in_link_works_once_and_expires(client, clock):
    r = client.post("/api/v1/signin", json={"email": "alan@example.org"})
    link = r.json()["dev_link"]
    assert link.startswith("http://127.0.0.1:8000/exam/#signin=")
    assert client.app.state.mailer.outbox[-1][0] == "alan@example.org" and link in client.app.state.mailer.outbox[-1][2]
    token = link.split("#signin=")[1]
    assert client.post("/api/v1/signin/confirm", json={"token": token}).status_code == 200
    assert client.post("/api/v1/signin/confirm", json={"token": token}).status_code == 401       # used
    late = client.post("/api/v1/signin", json={"email": "alan@example.org"}).json()["dev_link"].split("#signin=")[1]
    clock.t += 16 * 60
    assert client.post("/api/v1/signin/confirm", json={"token": late}).status_code == 401        # expired
    assert client.post("/api/v1/signin/confirm", json={"token": "x" * 43}).status_code == 401
    assert client.post("/api/v1/signin", json={"email": "not an address"}).status_code == 422


def test_attempts_need_the_owners_session(client):
    assert client.post("/api/v1/attempts", json={"display_name": "Eve"}).status_code == 401
    alice, mallory = sign_in(client, "alice@example.org"), sign_in(client, "mallory@example.org")
    aid = start(client, alice, "Alice")["attempt_id"]
    for method, path, body in (("GET", f"/api/v1/attempts/{aid}", None),
                               ("POST", f"/api/v1/attempts/{aid}/answers/1", {"choice": 0}),
                               ("POST", f"/api/v1/attempts/{aid}/finish", None)):
        assert client.request(method, path, json=body, headers=mallory).status_code == 404
        assert client.request(method, path, json=body).status_code == 401
    assert client.get(f"/api/v1/attempts/{aid}", headers=alice).status_code == 200
    assert client.post("/api/v1/signout", headers=alice).status_code == 204
    assert client.get(f"/api/v1/attempts/{aid}", headers=alice).status_code == 401


def test_limits_are_keyed_on_the_verified_email(client, clock):
    auth = sign_in(client, "alan@example.org")
    first = start(client, auth, "Alan Turing")
    again = start(client, auth, "Someone Else")                   # an open attempt is resumed, not re-spent
    assert again["attempt_id"] == first["attempt_id"] and again["resumed"] is True
    client.post(f"/api/v1/attempts/{first['attempt_id']}/finish", headers=auth)       # 0 right: a fail
    r = client.post("/api/v1/attempts", json={"display_name": "Alan"}, headers=auth)
    assert r.status_code == 429 and "cooldown" in r.json()["detail"]
    clock.t += 3601
    second = start(client, sign_in(client, "ALAN@example.org"), "Alan")             # same address, new session
    client.post(f"/api/v1/attempts/{second['attempt_id']}/finish", headers=auth)
    clock.t += 3601
    r = client.post("/api/v1/attempts", json={"display_name": "Alan"}, headers=auth)
    assert r.status_code == 429 and "2 of 2" in r.json()["detail"]
    me = client.get("/api/v1/me", headers=auth).json()
    assert me["attempts_left_today"] == 0 and me["last_attempt"] == second["attempt_id"]
    start(client, sign_in(client, "grace@example.org"), "Alan Turing")             # the same name: another learner
    clock.t += 86_400                                                              # next UTC day
    assert client.get("/api/v1/me", headers=auth).status_code == 401                  # the 12 h session ended
    start(client, sign_in(client, "alan@example.org"), "Alan")


def test_reload_resumes_with_the_answers_given(client):
    auth = sign_in(client)
    attempt = start(client, auth)
    aid = attempt["attempt_id"]
    key = answer_key(client.app.state.store, aid)
    client.post(f"/api/v1/attempts/{aid}/answers/4", json=key[4][0], headers=auth)
    me = client.get("/api/v1/me", headers=auth).json()
    assert me["open_attempt"] == aid
    state = client.get(f"/api/v1/attempts/{aid}?questions=true", headers=auth).json()
    assert state["questions"] == attempt["questions"]                   # same draw, same numbers, same order
    assert state["answered"] == [4] and state["responses"] == {"4": key[4][0]}


def test_per_ip_rate_limit_counts_invalid_requests(tmp_path):
    app = create_app(make_config(tmp_path, ip_attempts_per_hour=2, ip_requests_per_minute=5))
    with TestClient(app) as c:
        auth = sign_in(c)
        codes = [c.post("/api/v1/attempts", json={"display_name": f"L{i}"}, headers=auth).status_code for i in range(3)]
        assert codes == [201, 201, 429]
        bad = [c.post("/api/v1/attempts/x/answers/1", json={"choice": True}, headers=auth).status_code for _ in range(6)]
        assert bad[:3] == [422] * 3 and bad[-1] == 429


def test_body_limit_and_short_422s(client):
    auth = sign_in(client)
    huge = client.post("/api/v1/attempts", content=b'{"display_name": "' + b"A" * 20_000_000 + b'"}',
                       headers={**auth, "Content-Type": "application/json"})
    assert huge.status_code == 413 and len(huge.content) < 200

    def chunks():
        yield b'{"display_name": "'
        for _ in range(100):
            yield b"B" * 10_000
        yield b'"}'
    streamed = client.post("/api/v1/attempts", content=chunks(), headers={**auth, "Content-Type": "application/json"})
    assert streamed.status_code == 413
    big = "x" * 15_000
    r = client.post("/api/v1/attempts", json={"display_name": big}, headers=auth)
    assert r.status_code == 422 and big[:100] not in r.text and len(r.text) < 500
    r = client.post("/api/v1/attempts", json=[1] * 3000, headers=auth)
    assert r.status_code == 422 and len(r.text) < 500


@pytest.mark.parametrize("name", [
    "\u3164", "Eve\u3164", "Eve\U000e0041\U000e0042", "E" + "\u0301" * 60, "Eve\u202e", "Eve\u200b", "Eve\x00",
    "Eve\nMallory", " ", "", "x" * 101, "\u2800", "Eve\u00a0Smith", "\u115f\u1160",
])
def test_invisible_or_oversized_names_are_refused(client, name):
    r = client.post("/api/v1/attempts", json={"display_name": name}, headers=sign_in(client))
    assert r.status_code == 422, (name, r.text)
    assert "display name" in r.json()["detail"] or "display_name" in r.json()["detail"]


def test_names_are_nfc_normalised_and_accents_allowed(client):
    auth = sign_in(client)
    attempt = start(client, auth, "Jose\u0301  Nguye\u0302\u0303n")       # decomposed, with 2 marks, double space
    assert attempt["display_name"] == "Jos\u00e9 Nguy\u1ec5n"


@pytest.mark.parametrize("payload", [{"choice": True}, {"choice": "1"}, {"value": "1.9 bananas"}, {"value": True},
                                     {"choices": [True]}, {"choice": 1.0}, {"value": None}, {"value": "x" * 65}])
# a value may be text ("31.4 GB": the unit is checked, tests/test_exam_units.py), never a bool, a list or junk
def test_strict_json_types(client, payload):
    auth = sign_in(client)
    aid = start(client, auth)["attempt_id"]
    assert client.post(f"/api/v1/attempts/{aid}/answers/1", json=payload, headers=auth).status_code == 422


def test_expired_and_unknown_attempts(client, clock):
    auth = sign_in(client)
    aid = start(client, auth)["attempt_id"]
    key = answer_key(client.app.state.store, aid)
    assert client.post("/api/v1/attempts/nope/answers/1", json={"choice": 0}, headers=auth).status_code == 404
    assert client.post("/api/v1/attempts/nope/finish", headers=auth).status_code == 404
    assert client.get("/api/v1/attempts/nope", headers=auth).status_code == 404
    clock.t += 3 * 3600 + 1
    r = client.post(f"/api/v1/attempts/{aid}/answers/1", json=key[1][0], headers=auth)
    assert r.status_code == 410 and "expired" in r.json()["detail"]
    assert client.post(f"/api/v1/attempts/{aid}/finish", headers=auth).status_code == 410
    assert client.get(f"/api/v1/attempts/{aid}", headers=auth).json()["expired"] is True
    assert client.get(f"/api/v1/attempts/{aid}/review", headers=auth).status_code == 200   # over: reviewable
    assert client.get("/api/v1/me", headers=auth).json()["open_attempt"] is None


def test_pass_issues_a_verifiable_credential_once(client):
    fin = pass_exam(client)
    assert fin["passed"] and fin["score"] == fin["total"] == len(CHAPTERS)
    code = fin["credential"]["code"]
    cred = client.get(f"/api/v1/credentials/{code}").json()
    status = client.get(cred["credentialStatus"]["statusListCredential"].replace("http://127.0.0.1:8000", "")).json()
    did = client.get("/.well-known/did.json").json()
    trusted = {m["publicKeyMultibase"] for m in did["verificationMethod"]}
    result = credential.verify(cred, trusted_keys=trusted, status_list_credential=status)
    assert result.valid, result.errors
    assert result.claims["name"] == "Ada Lovelace" and result.revocation.startswith("not revoked")
    ids = [i for i in cred["credentialSubject"]["identifier"] if i["identityType"] == "emailAddress"]
    assert len(ids) == 1 and ids[0]["hashed"] and "ada@" not in json.dumps(cred)      # the verified email, hashed
    html = client.get(f"/certificates/{code}")
    assert html.status_code == 200 and "Ada Lovelace" in html.text and "<svg" in html.text
    svg = client.get(f"/certificates/{code}.svg")
    from minimega.classroom.certificate import unbake_svg
    assert unbake_svg(svg.text) == cred
    assert client.get("/api/v1/credentials/0000-0000-0000-0000-0").status_code == 404


def test_display_name_is_escaped(client):
    fin = pass_exam(client, name="<script>alert(1)</script> Eve", email=None)
    code = fin["credential"]["code"]
    cred = client.get(f"/api/v1/credentials/{code}").json()
    assert cred["credentialSubject"]["identifier"][0]["identityHash"] == "<script>alert(1)</script> Eve"
    page = client.get(f"/certificates/{code}").text
    assert "<script>alert" not in page and "&lt;script&gt;" in page


def test_concurrent_answers_no_lost_or_duplicated_rows(client):
    auths = [sign_in(client) for _ in range(4)]
    attempts = [(a, start(client, a, f"Learner {i}")) for i, a in enumerate(auths)]
    keys = {at["attempt_id"]: answer_key(client.app.state.store, at["attempt_id"]) for _, at in attempts}
    jobs = [(a, at["attempt_id"], q["number"]) for a, at in attempts for q in at["questions"]] * 3

    def send(job):
        auth, aid, n = job
        return client.post(f"/api/v1/attempts/{aid}/answers/{n}", json=keys[aid][n][0], headers=auth).status_code

    with ThreadPoolExecutor(8) as pool:
        codes = list(pool.map(send, jobs))
    n = 4 * len(CHAPTERS)                                       # 4 attempts, one question per chapter
    assert codes.count(200) == n and codes.count(409) == 2 * n
    rows = client.app.state.store.conn().execute(
        "SELECT attempt_id, number, COUNT(*), SUM(correct) FROM answers GROUP BY attempt_id, number").fetchall()
    assert len(rows) == n and all(r[2] == 1 and r[3] == 1 for r in rows)


def test_revocation_flips_the_signed_status_list(client):
    code = pass_exam(client)["credential"]["code"]
    cred = client.get(f"/api/v1/credentials/{code}").json()
    path = cred["credentialStatus"]["statusListCredential"].replace("http://127.0.0.1:8000", "")
    assert client.app.state.issuer.revoke(code, "test") is True
    result = credential.verify(cred, status_list_credential=client.get(path).json())
    assert not result.valid and result.revocation.startswith("revoked")


def test_migrations_are_versioned_and_refuse_newer(tmp_path):
    db = tmp_path / "c.sqlite3"
    con = sqlite3.connect(db)                     # a database left at version 2 by an older minimega
    for version, _, sql in MIGRATIONS[:2]:
        con.executescript(sql + f"; PRAGMA user_version={version};")
    con.execute("INSERT INTO attempts (id, learner_key, display_name, ip, day, created_at, expires_at, total) "
                "VALUES ('old', 'k', 'Old', 'ip', '2026-01-01', 0, 1, 33)")
    con.commit()
    con.close()
    store = Store(db)
    assert store.schema_version() == MIGRATIONS[-1][0] >= 5
    assert store.conn().execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    indexes = {r[0] for r in store.conn().execute("SELECT name FROM sqlite_master WHERE type='index'")}
    assert {"attempts_by_learner_day", "attempts_by_learner_finished", "signins_by_learner_created"} <= indexes
    assert store.attempt("old")["seed"] is None                         # old rows kept, new columns empty
    assert store.attempt("old")["lang"] == "en"                         # an attempt from before languages: English
    store.conn().execute(f"PRAGMA user_version={MIGRATIONS[-1][0] + 1}")
    with pytest.raises(StoreError, match="newer"):
        Store(db)


def test_no_mailer_configured_is_refused(tmp_path):
    with pytest.raises(ValueError, match="--smtp-host.*--dev"):
        create_app(make_config(tmp_path, dev=False))


def test_exam_info_states_the_rules(client):
    info = client.get("/api/v1/exam").json()
    n = len(CHAPTERS)                                   # one question per chapter; 80% pass, rounded up
    assert (info["questions"], info["pass_mark"], info["attempts_per_day"]) == (n, math.ceil(0.8 * n), 2)
    assert info["rules"].startswith(f"{n} questions") and f"{math.ceil(0.8 * n)} correct answers" in info["rules"]
    assert "2 attempts per UTC day" in info["rules"] and "1 hour later" in info["rules"]


def test_openapi_fuzz_finds_no_server_error(tmp_path):
    schemathesis = pytest.importorskip("schemathesis")
    from hypothesis import HealthCheck, settings

    app = create_app(make_config(tmp_path))
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    failures, calls = [], []
    for op in schema.get_all_operations():
        operation = op.ok()

        @settings(max_examples=15, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        def run(case):
            response = case.call()
            calls.append(operation.label)
            if response.status_code >= 500:
                failures.append((operation.label, response.status_code, response.text[:200]))

        strategy = operation.as_strategy()
        from hypothesis import given
        given(strategy)(run)()
    assert len(set(calls)) >= 12 and len(calls) > 100, (len(calls), sorted(set(calls)))
    assert not failures, failures


def test_did_web_service_rotation_keeps_old_credentials_verifiable(tmp_path):
    config = make_config(tmp_path, issuer_did="did:web:127.0.0.1%3A8000")
    app = create_app(config)
    with TestClient(app) as client:
        first = pass_exam(client, "Old Key")["credential"]["code"]
        app.state.issuer.keyring.rotate(config.keys_path)
        second = pass_exam(client, "New Key")["credential"]["code"]
        did = client.get("/.well-known/did.json").json()
        assert did["id"] == "did:web:127.0.0.1%3A8000" and len(did["assertionMethod"]) == 2
        creds = [client.get(f"/api/v1/credentials/{c}").json() for c in (first, second)]
        assert creds[0]["proof"][0]["verificationMethod"] != creds[1]["proof"][0]["verificationMethod"]
        trusted = {m["publicKeyMultibase"] for m in did["verificationMethod"]}
        for cred in creds:
            status = client.get(cred["credentialStatus"]["statusListCredential"].replace(config.base_url, "")).json()
            result = credential.verify(cred, did_documents={did["id"]: did}, trusted_keys=trusted,
                                       status_list_credential=status)
            assert result.valid and result.claims["issuer_id"] == did["id"], result.errors


def test_options_are_shuffled_per_attempt():
    """Server-side: the right option of a 4-option item lands on every shown position across attempts."""
    import random

    from minimega.classroom.exam import draw
    banks = load_exam_banks(BANKS, 3)
    items = {(b.chapter, it.id): it for b in banks.values() for it in b.items}
    positions: dict = {}
    for seed in range(300):
        for chapter, item_id, order, params in draw(banks, 3, random.Random(seed)):
            item = items[(chapter, item_id)]
            if item.type == "single" and len(item.choices) == 4:
                key = next(i for i, c in enumerate(item.choices) if c.correct)
                positions.setdefault(item_id, set()).add(order.index(key))
                assert params is None
            if item.parametric:
                assert params and set(params) == set(item.params)
    assert positions and all(p == {0, 1, 2, 3} for p in positions.values()), positions


@pytest.mark.parametrize("trust, expected", [([], [200, 200, 429]), (["--forwarded-allow-ips", "127.0.0.1"], [200, 200, 200])])
def test_forwarded_for_is_trusted_only_when_configured(tmp_path, trust, expected):
    """`minimega serve`'s uvicorn options: by default X-Forwarded-For from loopback cannot pick the address
    the per-IP limits count."""
    import argparse
    import socket
    import threading
    import urllib.error
    import urllib.request

    uvicorn = pytest.importorskip("uvicorn")
    from minimega.classroom.cli import add_serve_parser, uvicorn_options

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    parser = argparse.ArgumentParser()
    add_serve_parser(parser.add_subparsers())
    args = parser.parse_args(["serve", "--port", str(port), "--dev", *trust])
    app = create_app(make_config(tmp_path, ip_signins_per_hour=2, base_url=f"http://127.0.0.1:{port}"))
    server = uvicorn.Server(uvicorn.Config(app, **uvicorn_options(args)))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    codes = []
    for i in range(3):
        req = urllib.request.Request(f"http://127.0.0.1:{port}/api/v1/signin", method="POST",
                                     data=json.dumps({"email": f"x{i}@example.org"}).encode(),
                                     headers={"Content-Type": "application/json", "X-Forwarded-For": f"203.0.{113 + i}.1"})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                codes.append(r.status)
        except urllib.error.HTTPError as e:
            codes.append(e.code)
    server.should_exit = True
    thread.join(timeout=10)
    assert codes == expected


def test_smtp_mailer_sends_the_link(tmp_path):
    """SmtpMailer against a minimal local SMTP server (plain, no TLS): the link arrives in the body."""
    import socket
    import threading

    from minimega.classroom.mailer import SmtpMailer

    received = []
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)

    def serve():
        conn, _ = srv.accept()
        f = conn.makefile("rwb")
        f.write(b"220 test ESMTP\r\n")
        f.flush()
        data = False
        for line in f:
            if data:
                if line == b".\r\n":
                    data = False
                    f.write(b"250 queued\r\n")
                else:
                    received.append(line.decode())
            elif line.upper().startswith(b"EHLO"):
                f.write(b"250 test\r\n")
            elif line.upper().startswith(b"DATA"):
                data = True
                f.write(b"354 go\r\n")
            elif line.upper().startswith(b"QUIT"):
                f.write(b"221 bye\r\n")
                f.flush()
                break
            else:
                f.write(b"250 ok\r\n")
            f.flush()
        conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    mailer = SmtpMailer("127.0.0.1", srv.getsockname()[1], "exam@course.example", starttls=False)
    app = create_app(make_config(tmp_path, dev=False, smtp_host="127.0.0.1"), mailer=mailer)
    with TestClient(app) as c:
        r = c.post("/api/v1/signin", json={"email": "ada@example.org"})
    thread.join(timeout=10)
    srv.close()
    assert r.status_code == 200 and r.json()["dev_link"] is None       # not in development: the link only goes by mail
    body = "".join(received)
    assert "To: ada@example.org" in body and "/exam/#signin=" in body


def test_bare_exam_page_without_a_site(client):
    assert client.get("/", follow_redirects=False).headers["location"] == "http://127.0.0.1:8000/exam/"   # on --base-url
    page = client.get("/exam/")
    assert page.status_code == 200 and page.headers["content-language"] == "en"
    assert '<html lang="en">' in page.text and "<h1>Graded exam</h1>" in page.text and 'rel="icon"' in page.text
    assert '<script src="/exam-app/exam.js">' in page.text and 'href="/exam-app/exam.css"' in page.text
    for id_ in ("mm-exam-signin-form", "mm-exam-start-form", "mm-exam-finish", "mm-exam-review"):
        assert f'id="{id_}"' in page.text
    rules = client.get("/api/v1/exam").json()["rules"]                 # this service's numbers, not the defaults'
    assert f'<p id="mm-exam-rules">{html.escape(rules)}</p>' in page.text and "{{" not in page.text
    assert '<a href="/nl/exam/" hreflang="nl" lang="nl">Nederlands</a>' in page.text
    for asset in ("exam.js", "exam.css"):
        assert client.get(f"/exam-app/{asset}").status_code == 200
    assert client.get("/favicon.ico").status_code == 204


def test_bare_exam_page_in_dutch_at_the_sites_dutch_path(client):
    """/nl/exam/ is the bare page's Dutch twin, as it is the built site's; the path alone picks the language."""
    assert client.get("/nl/", follow_redirects=False).headers["location"] == "http://127.0.0.1:8000/nl/exam/"
    page = client.get("/nl/exam/")
    assert page.status_code == 200 and page.headers["content-language"] == "nl"
    assert '<html lang="nl">' in page.text and "<h1>Examen met certificaat</h1>" in page.text
    assert "Stuur me een inloglink" in page.text and "Send me a sign-in link" not in page.text
    rules = client.get("/api/v1/exam", params={"lang": "nl"}).json()["rules"]
    assert rules.split()[1] == "vragen," and f'<p id="mm-exam-rules">{html.escape(rules)}</p>' in page.text
    assert '<a href="/exam/" hreflang="en" lang="en">English</a>' in page.text
    assert '<script src="/exam-app/exam.js">' in page.text
    english = client.get("/exam/", headers={"Accept-Language": "nl-NL,nl;q=0.9"})    # a header chooses nothing
    assert '<html lang="en">' in english.text and english.headers["content-language"] == "en"
    for other in ("/fr/exam/", "/de/", "/nl/exam/index.html"):
        assert client.get(other, follow_redirects=False).status_code == 404, other
    # the query string chooses nothing either: not the page, not its language, not where / redirects
    assert client.get("/exam/?path=/nl/exam/&lang=nl").text == english.text
    assert client.get("/?path=//elsewhere.example", follow_redirects=False).headers["location"] == \
        "http://127.0.0.1:8000/exam/"


def test_bare_exam_page_refuses_a_language_it_has_no_words_for(tmp_path, monkeypatch):
    from minimega.classroom import bare_page
    monkeypatch.delitem(bare_page.WORDS, "nl")
    with pytest.raises(ValueError, match=r"the bare exam page has no words for \['nl'\]"):
        create_app(make_config(tmp_path))


def test_a_built_site_replaces_the_bare_page(tmp_path):
    (tmp_path / "site" / "nl" / "exam").mkdir(parents=True)
    (tmp_path / "site" / "index.html").write_text("<html lang=en>home</html>")
    (tmp_path / "site" / "nl" / "exam" / "index.html").write_text("<html lang=nl>site</html>")
    with TestClient(create_app(make_config(tmp_path))) as c:
        assert c.get("/").text == "<html lang=en>home</html>" and c.get("/nl/exam/").text == "<html lang=nl>site</html>"
        assert c.get("/exam/").status_code == 404                      # the site has no English exam page here


def test_two_apps_on_postgres_share_sessions_limits_and_credentials(tmp_path, postgres_server):
    """Two service instances (apps) on one PostgreSQL database: a session made on one works on the other, the
    per-address start limit and the learner's daily limit are counted across both, and a pass issued on one
    verifies against the keys and the status list the other serves."""
    db = postgres_server.new_database()
    apps = [create_app(make_config(tmp_path, db=db, ip_attempts_per_hour=3, attempts_per_day=2))
            for _ in range(2)]
    with TestClient(apps[0]) as a, TestClient(apps[1]) as b:
        fin = pass_exam(a, "Ada on A", "ada@example.org")                        # start 1 of 3 for this address
        code = fin["credential"]["code"]
        cred = b.get(f"/api/v1/credentials/{code}").json()
        status = b.get(cred["credentialStatus"]["statusListCredential"].replace("http://127.0.0.1:8000", "")).json()
        did = b.get("/.well-known/did.json").json()
        result = credential.verify(cred, trusted_keys={m["publicKeyMultibase"] for m in did["verificationMethod"]},
                                   status_list_credential=status)
        assert result.valid and result.claims["name"] == "Ada on A", result.errors
        auth = sign_in(a, "ada@example.org")
        aid = start(b, auth, "Ada")["attempt_id"]                                 # start 2: daily limit 2 of 2
        assert b.post(f"/api/v1/attempts/{aid}/finish", headers=auth).status_code == 200
        r = a.post("/api/v1/attempts", json={"display_name": "Ada"}, headers=auth)  # start 3: learner limit
        assert r.status_code == 429 and "2 of 2" in r.json()["detail"]
        r = b.post("/api/v1/attempts", json={"display_name": "Bo"}, headers=sign_in(b))   # start 4: address limit
        assert r.status_code == 429 and "too many requests" in r.json()["detail"]
        assert apps[1].state.issuer.revoke(code, "test") is True                  # revoked on B, seen on A
        status = a.get(cred["credentialStatus"]["statusListCredential"].replace("http://127.0.0.1:8000", "")).json()
        assert credential.verify(cred, status_list_credential=status).revocation.startswith("revoked")
    for app in apps:
        app.state.store.close()
