"""Storage for attempts, answers and credentials: SQLite (the embedded default) or PostgreSQL.

`Store` is the SQLite store and holds every query; `store_postgres.PostgresStore` overrides only what
differs: connections (a pool), placeholders, column types, row locks and advisory locks. `stores.open_store`
(`stores.open_store`) picks one from ``--db``: a ``postgresql://`` URL, else a SQLite file.

The guarantees, on both:

- An answer is stored once: the primary key ``(attempt_id, number)`` of ``answers`` is the lock, and
  the loser of a race gets `Conflict`. An answer and the finish of its attempt never interleave:
  SQLite runs every write in ``BEGIN IMMEDIATE`` (one writer at a time); PostgreSQL takes the
  attempt's row lock, shared by answers (``FOR SHARE``), exclusive for the finish (``FOR UPDATE``), so
  an answer acknowledged as recorded is always in the score, and none lands after it.
- A finish happens once (the row lock, then ``finished_at IS NULL`` is checked); a credential is stored
  once per attempt (``credentials.attempt_id UNIQUE``): the loser gets `Duplicate`.
- Limits are counted inside the transaction that spends them: attempts per day, sign-in mails per
  hour and per-address request windows (`rate_hit`). PostgreSQL serializes each learner's (or
  address's) check-and-insert with a transaction-scoped advisory lock, so several service
  instances on one database hold the same limits.
- SQLite: WAL journal with ``synchronous=FULL``: a write acknowledged to a learner survives the
  process being killed (and power loss); readers never block the writer. One connection per thread.
- Migrations are numbered SQL scripts, applied in order, each in its own transaction, by one
  process at a time; ``schema_migrations`` records when (SQLite also keeps ``PRAGMA user_version``).
  A database from a newer minimega is refused rather than guessed at.
"""
from __future__ import annotations

import json
import os
import secrets
import sqlite3
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from .store_schema import (  # noqa: F401  (re-exported: the store's public names)
    ERASED, MIGRATIONS, Conflict, Duplicate, OpenAttempt, Row, StoreError,
)


class Store:
    """SQLite. Subclasses change the dialect through the class attributes and the hooks marked below."""

    FOR_UPDATE = ""
    """Row lock of a read that is followed by a write (SQLite: ``BEGIN IMMEDIATE`` locks everything)."""
    FOR_SHARE = ""
    shared = False
    """True when several processes (service instances) may use the database at once."""
    RATE_PRUNE_EVERY = 1000
    """Every so many `rate_hit` calls, drop the bucket's expired hits of every address."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)   # learner data: owner only
        os.close(os.open(self.path, os.O_CREAT | os.O_RDWR, 0o600))        # created 0600 (SQLite copies the
        self.path.chmod(0o600)                                            # mode to its -wal and -shm files)
        self._local = threading.local()
        self._rate_calls = 0
        self.migrate()
        for extra in (self.path.with_name(self.path.name + "-wal"), self.path.with_name(self.path.name + "-shm")):
            if extra.exists():
                extra.chmod(0o600)

    @property
    def where(self) -> str:
        """The database, as errors name it (never a password)."""
        return str(self.path)

    # --- connections (hooks) -------------------------------------------------------------------

    def conn(self) -> sqlite3.Connection:
        c = getattr(self._local, "conn", None)
        if c is None:
            c = sqlite3.connect(self.path, isolation_level=None, timeout=30)
            c.row_factory = sqlite3.Row
            self._enter_wal(c)
            c.execute("PRAGMA synchronous=FULL")
            c.execute("PRAGMA foreign_keys=ON")
            c.execute("PRAGMA secure_delete=ON")            # erased rows are overwritten, not left in free pages
            c.execute("PRAGMA busy_timeout=30000")
            self._local.conn = c
        return c

    def _enter_wal(self, c: sqlite3.Connection, wait_s: float = 30.0) -> None:
        """Switch the file to WAL. The switch takes an exclusive lock without calling the busy handler,
        so instances opening a new database at once see "database is locked": retry until wait_s."""
        deadline = time.monotonic() + wait_s
        while True:
            try:
                mode = c.execute("PRAGMA journal_mode=WAL").fetchone()[0]
                break
            except sqlite3.OperationalError as err:
                if "locked" not in str(err) or time.monotonic() > deadline:
                    raise
                time.sleep(0.01)
        if mode.lower() != "wal":
            raise StoreError(f"{self.where}: SQLite would not use write-ahead logging (journal mode {mode!r}); "
                             "put --db on a local file system")

    @contextmanager
    def write(self):
        """One read-write transaction; yields an object with ``execute(sql, params)`` (``?`` placeholders)."""
        c = self.conn()
        c.execute("BEGIN IMMEDIATE")
        try:
            yield c
        except BaseException:
            c.execute("ROLLBACK")
            raise
        c.execute("COMMIT")

    @contextmanager
    def snapshot(self):
        """A read-only transaction: every query inside sees the same committed state."""
        c = self.conn()
        c.execute("BEGIN")
        try:
            yield c
        finally:
            c.execute("COMMIT")

    def fetchone(self, sql: str, params=()):
        return self.conn().execute(sql, params).fetchone()

    def fetchall(self, sql: str, params=()) -> list:
        return self.conn().execute(sql, params).fetchall()

    def close(self) -> None:
        c = getattr(self._local, "conn", None)
        if c is not None:
            c.close()
            self._local.conn = None

    def _serialize(self, c, scope: str, key: str) -> None:
        """Hold a lock on (scope, key) until the transaction ends (SQLite: BEGIN IMMEDIATE already does)."""

    def _flush_erased(self) -> None:
        """After an erasure: copy the write-ahead log into the file and empty it, so the old pages (which held
        the erased rows) leave the log too."""
        self.conn().execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def _is_unique_violation(self, err: Exception) -> bool:
        return isinstance(err, sqlite3.IntegrityError) and "UNIQUE" in str(err)

    def _ddl(self, sql: str) -> str:
        """A migration's SQL in this dialect."""
        return sql

    def _version(self, c) -> int:
        return c.execute("PRAGMA user_version").fetchone()[0]

    def _set_version(self, c, version: int) -> None:
        c.execute(f"PRAGMA user_version={int(version)}")

    # --- schema --------------------------------------------------------------------------------

    def migrate(self) -> int:
        latest = MIGRATIONS[-1][0]
        with self.write() as c:
            self._serialize(c, "migrate", "")
            c.execute(self._ddl("CREATE TABLE IF NOT EXISTS schema_migrations "
                                "(version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at REAL NOT NULL)"))
        for version, name, sql in MIGRATIONS:
            with self.write() as c:  # executescript would commit on its own: run statements one by one
                self._serialize(c, "migrate", "")          # two instances starting at once: one migrates
                current = self._version(c)
                if current > latest:
                    raise StoreError(f"{self.where} has schema version {current}, newer than this minimega "
                                     f"({latest}); upgrade minimega or point --db elsewhere")
                if version <= current:
                    continue
                for stmt in filter(str.strip, self._ddl(sql).split(";")):
                    c.execute(stmt)
                c.execute("INSERT INTO schema_migrations VALUES (?, ?, ?)", (version, name, time.time()))
                self._set_version(c, version)
        return latest

    def take_legacy_pepper(self) -> bytes | None:
        """The pepper an older minimega kept in this database (``meta``), or None. `drop_legacy_pepper` deletes
        it once it is safe elsewhere (`pepper.load_pepper`)."""
        row = self.fetchone("SELECT value FROM meta WHERE key='pepper'")
        return bytes.fromhex(row[0]) if row else None

    def drop_legacy_pepper(self) -> None:
        with self.write() as c:
            c.execute("DELETE FROM meta WHERE key='pepper'")

    def bind_pepper(self, fingerprint: str) -> str:
        """Record which pepper keys this database's learners (its fingerprint, never the pepper); returns the one
        recorded first, so an instance started with another pepper can refuse to run."""
        with self.write() as c:
            c.execute("INSERT INTO meta VALUES ('pepper_fingerprint', ?) ON CONFLICT (key) DO NOTHING", (fingerprint,))
            return c.execute("SELECT value FROM meta WHERE key='pepper_fingerprint'").fetchone()[0]

    def schema_version(self) -> int:
        with self.snapshot() as c:
            return self._version(c)

    # --- attempts ----------------------------------------------------------------------------

    def create_attempt(self, *, learner_key: str, display_name: str, email_id: dict | None, ip: str,
                       day: str, now: float, ttl_s: float, items: list[tuple], per_day: int,
                       cooldown_s: float = 0.0, seed: str | None = None, lang: str = "en") -> str:
        """Insert an attempt and its drawn items; `OpenAttempt` if the learner has one open (two clicks on
        "start", perhaps on two instances, make one attempt), `Conflict` if they used up today's attempts or
        failed less than `cooldown_s` ago. Items are (chapter, item id, choice order[, params]); `lang` is
        the language its items are served and its certificate is written in."""
        attempt_id = secrets.token_urlsafe(16)
        with self.write() as c:
            self._serialize(c, "attempts", learner_key)
            open_row = c.execute("SELECT id FROM attempts WHERE learner_key=? AND finished_at IS NULL AND expires_at>=? "
                                 "ORDER BY created_at DESC LIMIT 1", (learner_key, now)).fetchone()
            if open_row is not None:
                raise OpenAttempt(open_row[0])
            used = c.execute("SELECT COUNT(*) FROM attempts WHERE learner_key=? AND day=?",
                             (learner_key, day)).fetchone()[0]
            if used >= per_day:
                raise Conflict(f"attempt limit reached: {used} of {per_day} attempts used today (UTC)")
            last_fail = c.execute("SELECT MAX(finished_at) FROM attempts WHERE learner_key=? AND passed=0",
                                  (learner_key,)).fetchone()[0]
            if last_fail is not None and now < last_fail + cooldown_s:
                wait = int(last_fail + cooldown_s - now) + 1
                raise Conflict(f"cooldown after a failed attempt: the next one can start in {wait // 60} min {wait % 60} s")
            c.execute("INSERT INTO attempts (id, learner_key, display_name, email_id, ip, day, created_at, "
                      "expires_at, total, seed, lang) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                      (attempt_id, learner_key, display_name, json.dumps(email_id) if email_id else None,
                       ip, day, now, now + ttl_s, len(items), seed, lang))
            c.executemany("INSERT INTO attempt_items (attempt_id, number, chapter, item_id, choice_order, params) "
                          "VALUES (?,?,?,?,?,?)",
                          [(attempt_id, n, pick[0], pick[1], json.dumps(pick[2]),
                            json.dumps(pick[3]) if len(pick) > 3 and pick[3] else None)
                           for n, pick in enumerate(items, start=1)])
        return attempt_id

    def open_attempt(self, learner_key: str, now: float):
        """The learner's unfinished, unexpired attempt (the newest), if any."""
        return self.fetchone(
            "SELECT * FROM attempts WHERE learner_key=? AND finished_at IS NULL AND expires_at>=? "
            "ORDER BY created_at DESC LIMIT 1", (learner_key, now))

    def last_attempt(self, learner_key: str):
        return self.fetchone("SELECT * FROM attempts WHERE learner_key=? ORDER BY created_at DESC LIMIT 1",
                             (learner_key,))

    def cooldown_until(self, learner_key: str, cooldown_s: float) -> float | None:
        last_fail = self.fetchone("SELECT MAX(finished_at) FROM attempts WHERE learner_key=? AND passed=0",
                                  (learner_key,))[0]
        return None if last_fail is None else last_fail + cooldown_s

    # --- sign-in and sessions ----------------------------------------------------------------

    def create_signin(self, *, token_hash: str, learner_key: str, email_id: dict, now: float, ttl_s: float,
                      per_hour: int) -> None:
        """Record a mailed one-time token; `Conflict` past `per_hour` links for this address."""
        with self.write() as c:
            self._serialize(c, "signins", learner_key)
            sent = c.execute("SELECT COUNT(*) FROM signins WHERE learner_key=? AND created_at>?",
                             (learner_key, now - 3600)).fetchone()[0]
            if sent >= per_hour:
                raise Conflict(f"{sent} sign-in links sent to this address in the last hour; use one of them "
                               "or wait")
            c.execute("INSERT INTO signins VALUES (?,?,?,?,?,NULL)",
                      (token_hash, learner_key, json.dumps(email_id), now, now + ttl_s))

    def redeem_signin(self, *, token_hash: str, session_hash: str, now: float, session_ttl_s: float) -> str:
        """Spend a one-time token and open a session; returns the learner key. `Conflict` if unusable."""
        with self.write() as c:
            row = c.execute("SELECT * FROM signins WHERE token_hash=?" + self.FOR_UPDATE, (token_hash,)).fetchone()
            if row is None or row["used_at"] is not None or now > row["expires_at"]:
                raise Conflict("this sign-in link is unknown, used or expired: ask for a new one")
            c.execute("UPDATE signins SET used_at=? WHERE token_hash=?", (now, token_hash))
            c.execute("INSERT INTO sessions VALUES (?,?,?,?,?)",
                      (session_hash, row["learner_key"], row["email_id"], now, now + session_ttl_s))
        return row["learner_key"]

    def session(self, session_hash: str, now: float):
        return self.fetchone("SELECT * FROM sessions WHERE token_hash=? AND expires_at>=?", (session_hash, now))

    def end_session(self, session_hash: str) -> None:
        with self.write() as c:
            c.execute("DELETE FROM sessions WHERE token_hash=?", (session_hash,))

    def attempts_today(self, learner_key: str, day: str) -> int:
        return self.fetchone("SELECT COUNT(*) FROM attempts WHERE learner_key=? AND day=?", (learner_key, day))[0]

    def attempt(self, attempt_id: str):
        return self.fetchone("SELECT * FROM attempts WHERE id=?", (attempt_id,))

    def items(self, attempt_id: str) -> list:
        return self.fetchall("SELECT * FROM attempt_items WHERE attempt_id=? ORDER BY number", (attempt_id,))

    def item(self, attempt_id: str, number: int):
        return self.fetchone("SELECT * FROM attempt_items WHERE attempt_id=? AND number=?", (attempt_id, number))

    def answers(self, attempt_id: str) -> list:
        return self.fetchall("SELECT * FROM answers WHERE attempt_id=? ORDER BY number", (attempt_id,))

    def record_answer(self, attempt_id: str, number: int, response, correct: bool, now: float) -> int:
        """Store one answer; `Conflict` if answered already or the attempt is closed. Returns #answered."""
        with self.write() as c:
            row = c.execute("SELECT finished_at, expires_at FROM attempts WHERE id=?" + self.FOR_SHARE,
                            (attempt_id,)).fetchone()
            if row is None:
                raise Conflict("no such attempt")
            if row["finished_at"] is not None:
                raise Conflict("this attempt is finished; answers are locked")
            if now > row["expires_at"]:
                raise Conflict("this attempt has expired")
            try:
                c.execute("INSERT INTO answers VALUES (?,?,?,?,?)",
                          (attempt_id, number, json.dumps(response), int(correct), now))
            except Exception as err:
                if self._is_unique_violation(err):
                    raise Conflict(f"question {number} is already answered; answers are locked") from None
                raise
            return c.execute("SELECT COUNT(*) FROM answers WHERE attempt_id=?", (attempt_id,)).fetchone()[0]

    def finish_attempt(self, attempt_id: str, now: float, pass_fraction: float) -> tuple[int, int, bool]:
        """Score and close the attempt exactly once; returns (score, total, passed)."""
        with self.write() as c:
            row = c.execute("SELECT finished_at, expires_at, total FROM attempts WHERE id=?" + self.FOR_UPDATE,
                            (attempt_id,)).fetchone()
            if row is None:
                raise Conflict("no such attempt")
            if row["finished_at"] is not None:
                raise Conflict("this attempt is already finished")
            if now > row["expires_at"]:
                raise Conflict("this attempt has expired")
            score = int(c.execute("SELECT COALESCE(SUM(correct), 0) FROM answers WHERE attempt_id=?",
                                  (attempt_id,)).fetchone()[0])
            passed = score >= pass_fraction * row["total"] - 1e-9
            c.execute("UPDATE attempts SET finished_at=?, score=?, passed=? WHERE id=?",
                      (now, score, int(passed), attempt_id))
        return score, row["total"], passed

    # --- per-address limits --------------------------------------------------------------------

    def rate_hit(self, bucket: str, key: str, *, limit: int, window_s: float, now: float) -> float | None:
        """Count one event of `key` in a sliding window; None if allowed (and counted), else the seconds
        until the oldest counted event leaves the window (nothing counted)."""
        self._rate_calls += 1
        with self.write() as c:
            self._serialize(c, "rate", f"{bucket}|{key}")
            if self._rate_calls % self.RATE_PRUNE_EVERY == 0:      # addresses that went quiet
                c.execute("DELETE FROM rate_hits WHERE bucket=? AND hit_at<=?", (bucket, now - window_s))
            else:
                c.execute("DELETE FROM rate_hits WHERE bucket=? AND key=? AND hit_at<=?", (bucket, key, now - window_s))
            count, oldest = c.execute("SELECT COUNT(*), MIN(hit_at) FROM rate_hits WHERE bucket=? AND key=?",
                                      (bucket, key)).fetchone()
            if count >= limit:
                return oldest + window_s - now
            c.execute("INSERT INTO rate_hits VALUES (?,?,?)", (bucket, key, now))
        return None

    # --- credentials -------------------------------------------------------------------------

    def store_credential(self, *, credential_id: str, code: str, attempt_id: str, status_list: str,
                         status_index: int, document: dict, now: float) -> None:
        """Insert an issued credential; `Duplicate` if the code or index is taken (retry) or the attempt has one."""
        try:
            with self.write() as c:
                c.execute("INSERT INTO credentials (id, code, attempt_id, status_list, status_index, issued_at, "
                          "document) VALUES (?,?,?,?,?,?,?)",
                          (credential_id, code, attempt_id, status_list, status_index, now, json.dumps(document)))
        except Exception as err:
            if self._is_unique_violation(err):
                raise Duplicate(f"credential not stored: {str(err).splitlines()[0][:200]}") from None
            raise

    def credential_by_code(self, code: str):
        return self.fetchone("SELECT * FROM credentials WHERE code=?", (code,))

    def credentials_of(self, learner_key: str) -> list:
        """The learner's certificates that are still hosted (not erased), newest first: code, issued_at, revoked_at."""
        return self.fetchall("SELECT c.code, c.issued_at, c.revoked_at FROM credentials c JOIN attempts a "
                             "ON a.id = c.attempt_id WHERE a.learner_key=? AND c.erased_at IS NULL "
                             "ORDER BY c.issued_at DESC", (learner_key,))

    def credential_by_attempt(self, attempt_id: str):
        return self.fetchone("SELECT * FROM credentials WHERE attempt_id=?", (attempt_id,))

    def revoke(self, code: str, reason: str, now: float) -> bool:
        """Flip the credential's status bit; False if it was revoked already. KeyError if unknown."""
        with self.write() as c:
            row = c.execute("SELECT revoked_at FROM credentials WHERE code=?" + self.FOR_UPDATE, (code,)).fetchone()
            if row is None:
                raise KeyError(code)
            if row["revoked_at"] is not None:
                return False
            c.execute("UPDATE credentials SET revoked_at=?, revoked_why=? WHERE code=?", (now, reason, code))
            c.execute("UPDATE meta SET value=CAST(CAST(value AS INTEGER)+1 AS TEXT) WHERE key='status_version'")
        return True

    # --8<-- [start:erase_learner]
    def erase_learner(self, learner_key: str, now: float) -> dict[str, int]:
        """Erase what the store holds about one learner (GDPR art. 17), in one transaction.

        Deleted: sign-ins, sessions, every answer and drawn item of their attempts, the documents of their
        credentials (which carry the name). Blanked: each attempt's learner key, name, email hash and address
        (its score, dates and seed stay, with nothing that points to a person). Kept: each credential's
        verification code and status bit, so the index is never given to someone else (revoking that one would
        revoke the erased learner's copy) and the copy the learner holds still verifies offline, as not revoked.
        Returns the rows touched per table."""
        with self.write() as c:
            self._serialize(c, "attempts", learner_key)
            rows = c.execute("SELECT id, expires_at FROM attempts WHERE learner_key=?" + self.FOR_UPDATE,
                             (learner_key,)).fetchall()
            counts = {"attempts": len(rows), "answers": 0, "attempt_items": 0, "credentials": 0}
            for aid, expires_at in rows:
                for table in ("answers", "attempt_items"):
                    counts[table] += c.execute(f"DELETE FROM {table} WHERE attempt_id=?", (aid,)).rowcount
                counts["credentials"] += c.execute(
                    "UPDATE credentials SET document='', erased_at=? WHERE attempt_id=?", (now, aid)).rowcount
                c.execute("UPDATE attempts SET learner_key=?, display_name=?, email_id=NULL, ip='', expires_at=?, "
                          "erased_at=? WHERE id=?", (ERASED, ERASED, min(expires_at, now), now, aid))   # an open one ends
            for table in ("signins", "sessions"):
                counts[table] = c.execute(f"DELETE FROM {table} WHERE learner_key=?", (learner_key,)).rowcount
        self._flush_erased()
        return counts
    # --8<-- [end:erase_learner]

    def status_lists(self) -> set[str]:
        return {r[0] for r in self.fetchall("SELECT DISTINCT status_list FROM credentials")}

    def revocation_state(self, status_list: str) -> tuple[int, set[int]]:
        """(status version, revoked indices of one list), read in one snapshot."""
        with self.snapshot() as c:
            version = int(c.execute("SELECT value FROM meta WHERE key='status_version'").fetchone()[0])
            revoked = {r[0] for r in c.execute(
                "SELECT status_index FROM credentials WHERE status_list=? AND revoked_at IS NOT NULL",
                (status_list,)).fetchall()}
        return version, revoked
