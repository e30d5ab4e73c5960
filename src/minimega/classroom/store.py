"""SQLite storage for attempts, answers and credentials.

- WAL journal with ``synchronous=FULL``: a write acknowledged to a learner survives the process
  being killed (and power loss); readers never block the writer.
- Every write runs in ``BEGIN IMMEDIATE``, so two threads answering the same question cannot both
  pass the "not answered yet" check: the primary key ``(attempt_id, number)`` of ``answers`` is
  the lock, and the loser gets `Conflict`.
- Migrations are numbered SQL scripts; ``PRAGMA user_version`` records the last one applied and
  ``schema_migrations`` when. A database from a newer minimega is refused rather than guessed at.
- One connection per thread (sqlite3 connections are not shared across threads).
"""
from __future__ import annotations

import json
import secrets
import sqlite3
import threading
import time
from contextlib import contextmanager
from pathlib import Path

MIGRATIONS: list[tuple[int, str, str]] = [
    (1, "attempts, answers, credentials", """
        CREATE TABLE attempts (
            id           TEXT PRIMARY KEY,          -- 128-bit random token, the learner's handle
            learner_key  TEXT NOT NULL,             -- hash of email, else of the display name
            display_name TEXT NOT NULL,
            email_id     TEXT,                      -- JSON IdentityObject: salted hash, never the email
            ip           TEXT NOT NULL,
            day          TEXT NOT NULL,             -- UTC date, for per-day limits
            created_at   REAL NOT NULL,
            expires_at   REAL NOT NULL,
            finished_at  REAL,
            score        INTEGER,
            total        INTEGER NOT NULL,
            passed       INTEGER
        );
        CREATE TABLE attempt_items (
            attempt_id   TEXT NOT NULL REFERENCES attempts(id),
            number       INTEGER NOT NULL,          -- 1-based question number shown to the learner
            chapter      INTEGER NOT NULL,
            item_id      TEXT NOT NULL,
            choice_order TEXT NOT NULL,             -- JSON: shown position -> bank index
            PRIMARY KEY (attempt_id, number)
        );
        CREATE TABLE answers (
            attempt_id   TEXT NOT NULL REFERENCES attempts(id),
            number       INTEGER NOT NULL,
            response     TEXT NOT NULL,             -- JSON, in shown positions
            correct      INTEGER NOT NULL,
            answered_at  REAL NOT NULL,
            PRIMARY KEY (attempt_id, number)        -- one answer per question: the lock
        );
        CREATE TABLE credentials (
            id           TEXT PRIMARY KEY,          -- urn:uuid
            code         TEXT NOT NULL UNIQUE,      -- human verification code
            attempt_id   TEXT NOT NULL UNIQUE REFERENCES attempts(id),
            status_list  TEXT NOT NULL,             -- which list: the signing key's fingerprint
            status_index INTEGER NOT NULL,
            issued_at    REAL NOT NULL,
            document     TEXT NOT NULL,             -- the signed credential, as issued
            revoked_at   REAL,
            revoked_why  TEXT,
            UNIQUE (status_list, status_index)
        );
        CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
        INSERT INTO meta VALUES ('status_version', '0');
    """),
    (2, "index for per-learner daily limits", """
        CREATE INDEX attempts_by_learner_day ON attempts(learner_key, day);
        CREATE INDEX attempts_by_ip_created ON attempts(ip, created_at);
    """),
    (3, "email sign-in, sessions, parametric items, seeds", """
        CREATE TABLE signins (
            token_hash   TEXT PRIMARY KEY,          -- SHA-256 of the mailed one-time token
            learner_key  TEXT NOT NULL,             -- keyed hash of the verified email
            email_id     TEXT NOT NULL,             -- JSON IdentityObject (salted hash) for the credential
            created_at   REAL NOT NULL,
            expires_at   REAL NOT NULL,
            used_at      REAL
        );
        CREATE INDEX signins_by_learner_created ON signins(learner_key, created_at);
        CREATE TABLE sessions (
            token_hash   TEXT PRIMARY KEY,          -- SHA-256 of the bearer token the page keeps
            learner_key  TEXT NOT NULL,
            email_id     TEXT NOT NULL,
            created_at   REAL NOT NULL,
            expires_at   REAL NOT NULL
        );
        ALTER TABLE attempts ADD COLUMN seed TEXT;                -- the draw's seed (hex), for audits
        ALTER TABLE attempt_items ADD COLUMN params TEXT;         -- JSON values of a parametric item
        CREATE INDEX attempts_by_learner_finished ON attempts(learner_key, finished_at);
    """),
    (4, "the language an attempt is taken in", """
        ALTER TABLE attempts ADD COLUMN lang TEXT NOT NULL DEFAULT 'en';  -- items, review and certificate text
    """),
]


class StoreError(RuntimeError):
    pass


class Conflict(StoreError):
    """The write would break a rule: answered twice, finished twice, ..."""


class Store:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)   # learner data: owner only
        self._local = threading.local()
        self.migrate()

    # --- connections -------------------------------------------------------------------------

    def conn(self) -> sqlite3.Connection:
        c = getattr(self._local, "conn", None)
        if c is None:
            c = sqlite3.connect(self.path, isolation_level=None, timeout=30)
            c.row_factory = sqlite3.Row
            c.execute("PRAGMA journal_mode=WAL")
            c.execute("PRAGMA synchronous=FULL")
            c.execute("PRAGMA foreign_keys=ON")
            c.execute("PRAGMA busy_timeout=30000")
            self._local.conn = c
        return c

    @contextmanager
    def write(self):
        c = self.conn()
        c.execute("BEGIN IMMEDIATE")
        try:
            yield c
        except BaseException:
            c.execute("ROLLBACK")
            raise
        c.execute("COMMIT")

    def migrate(self) -> int:
        c = self.conn()
        with self.write():
            c.execute("CREATE TABLE IF NOT EXISTS schema_migrations "
                      "(version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at REAL NOT NULL)")
        current = c.execute("PRAGMA user_version").fetchone()[0]
        latest = MIGRATIONS[-1][0]
        if current > latest:
            raise StoreError(f"{self.path} has schema version {current}, newer than this minimega "
                             f"({latest}); upgrade minimega or point --db elsewhere")
        for version, name, sql in MIGRATIONS:
            if version <= current:
                continue
            with self.write():       # executescript would commit on its own: run statements one by one
                for stmt in filter(str.strip, sql.split(";")):
                    c.execute(stmt)
                c.execute("INSERT INTO schema_migrations VALUES (?, ?, ?)", (version, name, time.time()))
                c.execute(f"PRAGMA user_version={version}")
        return latest

    def pepper(self) -> bytes:
        """A random secret of this database, for keyed hashes of learner identities."""
        with self.write() as c:
            row = c.execute("SELECT value FROM meta WHERE key='pepper'").fetchone()
            if row is None:
                value = secrets.token_hex(32)
                c.execute("INSERT INTO meta VALUES ('pepper', ?)", (value,))
                return bytes.fromhex(value)
        return bytes.fromhex(row[0])

    def schema_version(self) -> int:
        return self.conn().execute("PRAGMA user_version").fetchone()[0]

    # --- attempts ----------------------------------------------------------------------------

    def create_attempt(self, *, learner_key: str, display_name: str, email_id: dict | None, ip: str,
                       day: str, now: float, ttl_s: float, items: list[tuple], per_day: int,
                       cooldown_s: float = 0.0, seed: str | None = None, lang: str = "en") -> str:
        """Insert an attempt and its drawn items; `Conflict` if the learner used up today's attempts or
        failed less than `cooldown_s` ago. Items are (chapter, item id, choice order[, params]); `lang` is
        the language its items are served and its certificate is written in."""
        attempt_id = secrets.token_urlsafe(16)
        with self.write() as c:
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

    def open_attempt(self, learner_key: str, now: float) -> sqlite3.Row | None:
        """The learner's unfinished, unexpired attempt (the newest), if any."""
        return self.conn().execute(
            "SELECT * FROM attempts WHERE learner_key=? AND finished_at IS NULL AND expires_at>=? "
            "ORDER BY created_at DESC LIMIT 1", (learner_key, now)).fetchone()

    def last_attempt(self, learner_key: str) -> sqlite3.Row | None:
        return self.conn().execute("SELECT * FROM attempts WHERE learner_key=? ORDER BY created_at DESC LIMIT 1",
                                   (learner_key,)).fetchone()

    def cooldown_until(self, learner_key: str, cooldown_s: float) -> float | None:
        last_fail = self.conn().execute("SELECT MAX(finished_at) FROM attempts WHERE learner_key=? AND passed=0",
                                        (learner_key,)).fetchone()[0]
        return None if last_fail is None else last_fail + cooldown_s

    # --- sign-in and sessions ----------------------------------------------------------------

    def create_signin(self, *, token_hash: str, learner_key: str, email_id: dict, now: float, ttl_s: float,
                      per_hour: int) -> None:
        """Record a mailed one-time token; `Conflict` past `per_hour` links for this address."""
        with self.write() as c:
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
            row = c.execute("SELECT * FROM signins WHERE token_hash=?", (token_hash,)).fetchone()
            if row is None or row["used_at"] is not None or now > row["expires_at"]:
                raise Conflict("this sign-in link is unknown, used or expired: ask for a new one")
            c.execute("UPDATE signins SET used_at=? WHERE token_hash=?", (now, token_hash))
            c.execute("INSERT INTO sessions VALUES (?,?,?,?,?)",
                      (session_hash, row["learner_key"], row["email_id"], now, now + session_ttl_s))
        return row["learner_key"]

    def session(self, session_hash: str, now: float) -> sqlite3.Row | None:
        return self.conn().execute("SELECT * FROM sessions WHERE token_hash=? AND expires_at>=?",
                                   (session_hash, now)).fetchone()

    def end_session(self, session_hash: str) -> None:
        with self.write() as c:
            c.execute("DELETE FROM sessions WHERE token_hash=?", (session_hash,))

    def attempts_today(self, learner_key: str, day: str) -> int:
        return self.conn().execute("SELECT COUNT(*) FROM attempts WHERE learner_key=? AND day=?",
                                   (learner_key, day)).fetchone()[0]

    def attempt(self, attempt_id: str) -> sqlite3.Row | None:
        return self.conn().execute("SELECT * FROM attempts WHERE id=?", (attempt_id,)).fetchone()

    def items(self, attempt_id: str) -> list[sqlite3.Row]:
        return self.conn().execute("SELECT * FROM attempt_items WHERE attempt_id=? ORDER BY number",
                                   (attempt_id,)).fetchall()

    def item(self, attempt_id: str, number: int) -> sqlite3.Row | None:
        return self.conn().execute("SELECT * FROM attempt_items WHERE attempt_id=? AND number=?",
                                   (attempt_id, number)).fetchone()

    def answers(self, attempt_id: str) -> list[sqlite3.Row]:
        return self.conn().execute("SELECT * FROM answers WHERE attempt_id=? ORDER BY number",
                                   (attempt_id,)).fetchall()

    def record_answer(self, attempt_id: str, number: int, response, correct: bool, now: float) -> int:
        """Store one answer; `Conflict` if answered already or the attempt is closed. Returns #answered."""
        with self.write() as c:
            row = c.execute("SELECT finished_at, expires_at FROM attempts WHERE id=?", (attempt_id,)).fetchone()
            if row["finished_at"] is not None:
                raise Conflict("this attempt is finished; answers are locked")
            if now > row["expires_at"]:
                raise Conflict("this attempt has expired")
            try:
                c.execute("INSERT INTO answers VALUES (?,?,?,?,?)",
                          (attempt_id, number, json.dumps(response), int(correct), now))
            except sqlite3.IntegrityError:
                raise Conflict(f"question {number} is already answered; answers are locked") from None
            return c.execute("SELECT COUNT(*) FROM answers WHERE attempt_id=?", (attempt_id,)).fetchone()[0]

    def finish_attempt(self, attempt_id: str, now: float, pass_fraction: float) -> tuple[int, int, bool]:
        """Score and close the attempt exactly once; returns (score, total, passed)."""
        with self.write() as c:
            row = c.execute("SELECT finished_at, expires_at, total FROM attempts WHERE id=?",
                            (attempt_id,)).fetchone()
            if row["finished_at"] is not None:
                raise Conflict("this attempt is already finished")
            if now > row["expires_at"]:
                raise Conflict("this attempt has expired")
            score = c.execute("SELECT COALESCE(SUM(correct), 0) FROM answers WHERE attempt_id=?",
                              (attempt_id,)).fetchone()[0]
            passed = score >= pass_fraction * row["total"] - 1e-9
            c.execute("UPDATE attempts SET finished_at=?, score=?, passed=? WHERE id=?",
                      (now, score, int(passed), attempt_id))
        return score, row["total"], passed

    # --- credentials -------------------------------------------------------------------------

    def store_credential(self, *, credential_id: str, code: str, attempt_id: str, status_list: str,
                         status_index: int, document: dict, now: float) -> None:
        """Insert an issued credential; sqlite3.IntegrityError if the code or index is taken (retry)."""
        with self.write() as c:
            c.execute("INSERT INTO credentials (id, code, attempt_id, status_list, status_index, issued_at, "
                      "document) VALUES (?,?,?,?,?,?,?)",
                      (credential_id, code, attempt_id, status_list, status_index, now, json.dumps(document)))

    def credential_by_code(self, code: str) -> sqlite3.Row | None:
        return self.conn().execute("SELECT * FROM credentials WHERE code=?", (code,)).fetchone()

    def credential_by_attempt(self, attempt_id: str) -> sqlite3.Row | None:
        return self.conn().execute("SELECT * FROM credentials WHERE attempt_id=?", (attempt_id,)).fetchone()

    def revoke(self, code: str, reason: str, now: float) -> bool:
        """Flip the credential's status bit; False if it was revoked already. KeyError if unknown."""
        with self.write() as c:
            row = c.execute("SELECT revoked_at FROM credentials WHERE code=?", (code,)).fetchone()
            if row is None:
                raise KeyError(code)
            if row["revoked_at"] is not None:
                return False
            c.execute("UPDATE credentials SET revoked_at=?, revoked_why=? WHERE code=?", (now, reason, code))
            c.execute("UPDATE meta SET value=CAST(value AS INTEGER)+1 WHERE key='status_version'")
        return True

    def status_lists(self) -> set[str]:
        return {r[0] for r in self.conn().execute("SELECT DISTINCT status_list FROM credentials")}

    def revocation_state(self, status_list: str) -> tuple[int, set[int]]:
        """(status version, revoked indices of one list), read in one snapshot."""
        c = self.conn()
        c.execute("BEGIN")
        try:
            version = int(c.execute("SELECT value FROM meta WHERE key='status_version'").fetchone()[0])
            revoked = {r[0] for r in c.execute(
                "SELECT status_index FROM credentials WHERE status_list=? AND revoked_at IS NOT NULL",
                (status_list,))}
        finally:
            c.execute("COMMIT")
        return version, revoked
