"""The store's contract, on SQLite and on a real PostgreSQL server: migrations once, one pepper, an answer
stored once, a finish once and never beside an answer, limits that hold when several store objects
(service instances) race, one credential per attempt, revocation, shared rate windows.

Each race opens a store object per worker, so on PostgreSQL every worker has its own connection pool,
as separate service processes would; nothing in the store may rely on a lock inside one process."""
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from minimega.classroom.store import MIGRATIONS, Conflict, Duplicate, OpenAttempt, Store, StoreError
from minimega.classroom.stores import open_store

BACKENDS = ["sqlite", "postgresql"]


@pytest.fixture(params=BACKENDS)
def opener(request, tmp_path):
    """A function that opens one more store on this test's (fresh) database."""
    if request.param == "sqlite":
        where = tmp_path / "var" / "classroom.sqlite3"
    else:
        where = request.getfixturevalue("postgres_server").new_database()
    opened = []

    def open_one():
        opened.append(open_store(where))
        return opened[-1]
    open_one.backend = request.param
    yield open_one
    for s in opened:
        s.close()


def race(fn, n: int):
    """Run fn(i) for i < n on n threads released together; returns results or exceptions in order."""
    barrier = threading.Barrier(n)

    def run(i):
        barrier.wait()
        try:
            return fn(i)
        except Exception as err:           # noqa: BLE001 (the caller counts outcomes)
            return err
    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(run, range(n)))


def new_attempt(store, learner="k", n_items=6, now=None, per_day=100, ttl_s=3600):
    return store.create_attempt(learner_key=learner, display_name="Ada", email_id=None, ip="ip",
                                day="2026-01-01", now=now or time.time(), ttl_s=ttl_s,
                                items=[(1, f"item{i}", [0, 1]) for i in range(n_items)], per_day=per_day)


def test_migrations_apply_once_and_refuse_a_newer_schema(opener):
    stores = race(lambda i: opener(), 4)                  # four instances starting at once on an empty database
    assert all(isinstance(s, Store) for s in stores), stores
    latest = MIGRATIONS[-1][0]
    assert {s.schema_version() for s in stores} == {latest}
    rows = stores[0].fetchall("SELECT version FROM schema_migrations ORDER BY version")
    assert [r[0] for r in rows] == [v for v, _, _ in MIGRATIONS]
    with stores[0].write() as c:                          # a newer minimega migrated this database
        c.execute("INSERT INTO schema_migrations VALUES (?, ?, ?)", (latest + 1, "future", time.time()))
        if opener.backend == "sqlite":
            c.execute(f"PRAGMA user_version={latest + 1}")
    with pytest.raises(StoreError, match="newer"):
        opener()


def test_one_pepper_per_database_kept_outside_it(opener, tmp_path):
    from minimega.classroom.pepper import load_pepper

    stores = [opener() for _ in range(4)]
    peppers = race(lambda i: load_pepper(tmp_path / "keys", stores[i], env={}), 4)
    assert len(set(peppers)) == 1 and len(peppers[0]) == 32, peppers
    assert oct((tmp_path / "keys" / "pepper").stat().st_mode & 0o777) == "0o600"
    if opener.backend == "sqlite":                        # the database file never holds it
        raw = b"".join(p.read_bytes() for p in (tmp_path / "var").glob("classroom.sqlite3*"))
        assert peppers[0].hex().encode() not in raw and peppers[0] not in raw
    with pytest.raises(StoreError, match="another pepper"):    # an instance with its own pepper refuses
        load_pepper(tmp_path / "other-keys", stores[0], env={})
    with pytest.raises(StoreError, match="chmod 600"):
        (tmp_path / "keys" / "pepper").chmod(0o644)
        load_pepper(tmp_path / "keys", stores[0], env={})


def test_a_pepper_an_older_version_kept_in_the_database_moves_out(opener, tmp_path):
    from minimega.classroom.pepper import load_pepper

    store = opener()
    old = "ab" * 32
    with store.write() as c:
        c.execute("INSERT INTO meta VALUES ('pepper', ?)", (old,))
    assert load_pepper(tmp_path / "keys", store, env={}) == bytes.fromhex(old)      # same learners, same keys
    assert store.take_legacy_pepper() is None and (tmp_path / "keys" / "pepper").read_text().strip() == old


def test_rows_read_by_name_and_position(opener):
    store = opener()
    aid = new_attempt(store)
    row = store.attempt(aid)
    assert row["id"] == row[0] == aid and row["display_name"] == "Ada" and row["total"] == 6
    assert isinstance(row["created_at"], float) and abs(row["created_at"] - time.time()) < 60   # not 4-byte REAL


def test_answers_once_and_finish_once_across_instances(opener):
    """Per trial, two workers per question on 4 stores and two finishes racing them (the finish a little later
    each trial): every acknowledged answer is stored once and counted in the score, none is stored
    unacknowledged, exactly one finish wins. Without the attempt's row lock on PostgreSQL an answer slips in
    after the score was summed in about half the trials."""
    stores = [opener() for _ in range(4)]
    n_items = 10
    jobs = [("answer", n) for n in range(1, n_items + 1) for _ in range(2)] + [("finish", None)] * 2
    for trial in range(10):
        aid = new_attempt(stores[0], learner=f"k{trial}", n_items=n_items)

        def work(i):
            kind, n = jobs[i]
            store = stores[i % len(stores)]
            if kind == "finish":
                time.sleep(0.002 * (trial % 5))
                return store.finish_attempt(aid, time.time(), pass_fraction=0.5)
            return store.record_answer(aid, n, {"choice": 0}, correct=n % 2 == 0, now=time.time())

        out = race(work, len(jobs))
        finishes = [r for (kind, _), r in zip(jobs, out) if kind == "finish"]
        won = [r for r in finishes if isinstance(r, tuple)]
        assert len(won) == 1 and sum(isinstance(r, Conflict) for r in finishes) == 1, finishes
        answers = [(n, r) for (kind, n), r in zip(jobs, out) if kind == "answer"]
        assert all(isinstance(r, (int, Conflict)) for _, r in answers), answers
        acked = [n for n, r in answers if isinstance(r, int)]
        assert len(acked) == len(set(acked))                 # one acknowledgement per question, never two
        stored = stores[1].answers(aid)
        assert sorted(r["number"] for r in stored) == sorted(acked), trial
        score, total, _ = won[0]
        assert (score, total) == (sum(1 for n in acked if n % 2 == 0), n_items), trial
        assert stores[2].attempt(aid)["score"] == score


def test_attempt_and_signin_limits_hold_across_instances(opener):
    stores = [opener() for _ in range(4)]
    made = race(lambda i: new_attempt(stores[i % 4], learner="open"), 8)        # one open attempt per learner
    (first,) = [r for r in made if isinstance(r, str)]
    assert all(isinstance(r, OpenAttempt) and r.attempt_id == first for r in made if r != first), made
    stores[0].finish_attempt(new_attempt(stores[0], learner="same", per_day=2), time.time(), 0.5)
    made = race(lambda i: new_attempt(stores[i % 4], learner="same", per_day=2), 8)
    assert sum(isinstance(r, str) for r in made) == 1                         # the second of two today
    assert all(isinstance(r, OpenAttempt) for r in made if not isinstance(r, str))
    stores[0].finish_attempt(next(r for r in made if isinstance(r, str)), time.time(), 0.5)
    refused = race(lambda i: new_attempt(stores[i % 4], learner="same", per_day=2), 4)
    assert all(isinstance(r, Conflict) and "2 of 2" in str(r) for r in refused), refused
    now = time.time()
    sent = race(lambda i: stores[i % 4].create_signin(token_hash=f"t{i}", learner_key="same", email_id={},
                                                      now=now, ttl_s=900, per_hour=3), 8)
    assert sum(r is None for r in sent) == 3 and all(isinstance(r, Conflict) for r in sent if r is not None)
    token = next(f"t{i}" for i, r in enumerate(sent) if r is None)
    redeemed = race(lambda i: stores[i % 4].redeem_signin(token_hash=token, session_hash=f"s{i}", now=now,
                                                          session_ttl_s=60), 6)
    assert sum(r == "same" for r in redeemed) == 1 and sum(isinstance(r, Conflict) for r in redeemed) == 5
    assert len(stores[0].fetchall("SELECT * FROM sessions")) == 1


def test_one_credential_per_attempt(opener):
    stores = [opener() for _ in range(3)]
    aid, other = new_attempt(stores[0]), new_attempt(stores[0], learner="k2")

    def store_one(i):
        stores[i % 3].store_credential(credential_id=f"urn:uuid:{i}", code=f"CODE-{i}", attempt_id=aid,
                                       status_list="fp", status_index=i, document={"i": i}, now=time.time())
        return i
    out = race(store_one, 6)
    assert sum(isinstance(r, int) for r in out) == 1 and sum(isinstance(r, Duplicate) for r in out) == 5
    winner = next(r for r in out if isinstance(r, int))
    assert stores[1].credential_by_attempt(aid)["code"] == f"CODE-{winner}"
    with pytest.raises(Duplicate):                       # the code is taken, for another attempt too
        stores[2].store_credential(credential_id="urn:uuid:x", code=f"CODE-{winner}", attempt_id=other,
                                   status_list="fp", status_index=999, document={}, now=time.time())


def test_revocation_once_and_in_one_snapshot(opener):
    store = opener()
    aid = new_attempt(store)
    store.store_credential(credential_id="urn:uuid:1", code="C1", attempt_id=aid, status_list="fp",
                           status_index=77, document={}, now=time.time())
    assert store.revocation_state("fp") == (0, set())
    flips = race(lambda i: opener().revoke("C1", "test", time.time()), 4)
    assert sorted(flips, key=str) == [False, False, False, True]
    assert store.revocation_state("fp") == (1, {77}) and store.status_lists() == {"fp"}
    with pytest.raises(KeyError):
        store.revoke("NOPE", "", time.time())


def test_erasure_removes_one_learner_and_keeps_the_status_bits(opener, tmp_path):
    store, other = opener(), opener()
    now = time.time()
    ids = {}
    for learner, name in (("k", "Grace Hopper"), ("j", "Ada Lovelace")):
        store.create_signin(token_hash=f"t-{learner}", learner_key=learner, email_id={"h": learner}, now=now,
                            ttl_s=600, per_hour=5)
        store.redeem_signin(token_hash=f"t-{learner}", session_hash=f"s-{learner}", now=now, session_ttl_s=600)
        aid = store.create_attempt(learner_key=learner, display_name=name, email_id={"h": learner}, ip="10.1.2.3",
                                   day="2026-01-01", now=now, ttl_s=3600, items=[(1, "a", [0, 1]), (1, "b", [1, 0])],
                                   per_day=5)
        store.record_answer(aid, 1, [0], True, now)
        store.finish_attempt(aid, now, pass_fraction=0.5)
        store.store_credential(credential_id=f"urn:uuid:{learner}", code=f"C-{learner}", attempt_id=aid,
                               status_list="fp", status_index=len(ids), now=now,
                               document={"name": name, "proof": "z" * 6000})   # a real one spills into overflow pages
        ids[learner] = aid
    open_one = new_attempt(store, learner="k")                    # an open attempt is ended too
    store.revoke("C-j", "test", now)
    before = store.revocation_state("fp")

    counts = other.erase_learner("k", now + 1)
    assert counts == {"attempts": 2, "answers": 1, "attempt_items": 2 + 6, "credentials": 1, "signins": 1,
                      "sessions": 1}
    for aid in (ids["k"], open_one):
        row = store.attempt(aid)
        assert (row["learner_key"], row["display_name"], row["email_id"], row["ip"]) == ("erased", "erased", None, "")
        assert row["erased_at"] == pytest.approx(now + 1) and row["expires_at"] <= now + 1
        assert store.items(aid) == [] and store.answers(aid) == []
    assert store.attempt(ids["k"])["score"] == 1                  # what is not personal stays
    erased = store.credential_by_code("C-k")
    assert erased["document"] == "" and erased["erased_at"] is not None and erased["status_index"] == 0
    assert store.revocation_state("fp") == before                 # nothing revoked, nothing freed
    with pytest.raises(Duplicate):                                # the erased index is never handed out again
        store.store_credential(credential_id="urn:uuid:n", code="C-n", attempt_id=new_attempt(store, learner="n"),
                               status_list="fp", status_index=0, document={}, now=now)
    assert store.session("s-k", now) is None and store.open_attempt("k", now) is None
    assert store.session("s-j", now) is not None                  # the other learner is untouched
    assert store.attempt(ids["j"])["display_name"] == "Ada Lovelace" and len(store.items(ids["j"])) == 2
    assert json.loads(store.credential_by_code("C-j")["document"])["name"] == "Ada Lovelace"
    assert other.erase_learner("k", now + 2) == dict.fromkeys(counts, 0)
    if opener.backend == "sqlite":                                # nothing of the name left in the files
        files = list((tmp_path / "var").glob("classroom.sqlite3*"))
        assert files and all(b"Grace Hopper" not in f.read_bytes() for f in files)
        assert any(b"Ada Lovelace" in f.read_bytes() for f in files)


def test_rate_window_is_shared_and_slides(opener):
    a, b = opener(), opener()
    t = 1_000_000.0
    assert [s.rate_hit("api", "10.0.0.1", limit=3, window_s=60, now=t + i) for i, s in enumerate((a, b, a))] == [None] * 3
    retry = b.rate_hit("api", "10.0.0.1", limit=3, window_s=60, now=t + 10)
    assert retry == pytest.approx(50)                    # the first hit leaves the window at t + 60
    assert a.rate_hit("api", "10.0.0.2", limit=3, window_s=60, now=t + 10) is None       # another address
    assert a.rate_hit("start", "10.0.0.1", limit=3, window_s=60, now=t + 10) is None     # another limit
    assert b.rate_hit("api", "10.0.0.1", limit=3, window_s=60, now=t + 60.5) is None    # slid past the first
    stores = [opener() for _ in range(4)]
    hits = race(lambda i: stores[i % 4].rate_hit("signin", "10.9.9.9", limit=5, window_s=3600, now=t), 12)
    assert sum(r is None for r in hits) == 5


def test_unknown_schemes_are_refused(tmp_path):
    with pytest.raises(StoreError, match="postgresql://"):
        open_store("mysql://u@h/db")


def test_postgres_errors_name_the_database_without_its_password(postgres_server):
    from minimega.classroom.store_postgres import PostgresStore

    with pytest.raises(StoreError) as err:
        PostgresStore(f"postgresql://postgres:s3cret@127.0.0.1:{postgres_server.port}/no_such_db",
                      connect_timeout_s=2)
    text = str(err.value)
    assert "no_such_db" in text and "s3cret" not in text and "cannot connect" in text


def test_instances_opening_a_new_sqlite_database_at_once_all_start(tmp_path):
    """SQLite's switch to WAL takes its lock without the busy handler: four instances opening a new file at
    once failed with "database is locked" in about 1 race in 11 until the switch was retried."""
    for trial in range(40):
        where = tmp_path / f"t{trial}" / "classroom.sqlite3"
        stores = race(lambda i: open_store(where), 4)
        assert all(isinstance(s, Store) for s in stores), (trial, stores)
        for s in stores:
            s.close()
