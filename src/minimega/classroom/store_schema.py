"""The store's schema (numbered migrations) and the types both stores share: errors and `Row`."""
from __future__ import annotations


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
    (4, "per-address rate limits shared by every instance", """
        CREATE TABLE rate_hits (
            bucket       TEXT NOT NULL,             -- which limit: signin, start, api
            key          TEXT NOT NULL,             -- the client address
            hit_at       REAL NOT NULL              -- when (Unix seconds)
        );
        CREATE INDEX rate_hits_by_key ON rate_hits(bucket, key, hit_at);
    """),
    (5, "the language an attempt is taken in", """
        ALTER TABLE attempts ADD COLUMN lang TEXT NOT NULL DEFAULT 'en';  -- items, review and certificate text
    """),
    (6, "erasure at a learner's request", """
        ALTER TABLE attempts ADD COLUMN erased_at REAL;              -- personal fields blanked, answers deleted
        ALTER TABLE credentials ADD COLUMN erased_at REAL;           -- document deleted, code and status bit kept
    """),
]
ERASED = "erased"
"""The learner key and display name of an erased attempt (no personal data; counts per day start afresh)."""


class StoreError(RuntimeError):
    pass


class Conflict(StoreError):
    """The write would break a rule: answered twice, finished twice, ..."""


class OpenAttempt(Conflict):
    """The learner already has an unfinished, unexpired attempt: resume it (`attempt_id`) instead."""

    def __init__(self, attempt_id: str):
        super().__init__(f"attempt {attempt_id} is still open")
        self.attempt_id = attempt_id


class Duplicate(Conflict):
    """A unique key is taken (a credential's code or status index, or its attempt already has one)."""


class Row:
    """A result row read by column name (``row["score"]``) or position (``row[0]``), like `sqlite3.Row`."""

    __slots__ = ("_index", "_values")

    def __init__(self, index: dict[str, int], values):
        self._index, self._values = index, tuple(values)

    def __getitem__(self, key):
        return self._values[self._index[key]] if isinstance(key, str) else self._values[key]

    def __len__(self):
        return len(self._values)

    def __iter__(self):
        return iter(self._values)

    def keys(self) -> list[str]:
        return list(self._index)

    def __repr__(self):
        return f"Row({dict(zip(self._index, self._values))!r})"
