"""PostgreSQL for the exam service: one database shared by several `minimega serve` instances.

`PostgresStore` runs `Store`'s queries unchanged but for the dialect:

- placeholders ``?`` become psycopg's ``%s``; ``REAL`` columns become ``DOUBLE PRECISION`` (PostgreSQL's
  ``REAL`` is 4 bytes: a Unix time in it would lose minutes);
- connections come from a `psycopg_pool.ConnectionPool` (autocommit, one transaction per `write`);
- reads that precede a write lock their row: ``FOR UPDATE`` (finish, redeem, revoke) or ``FOR SHARE``
  (answers, so answers to one attempt run side by side but never beside its finish);
- a check-then-insert on rows that do not exist yet (attempts per day, sign-ins per hour, rate
  windows, migrations) first takes ``pg_advisory_xact_lock(scope, hashtext(key))``, which the
  database releases at commit or rollback, so a crashed instance never leaves it held;
- the schema version is ``MAX(version)`` of ``schema_migrations``.

Transactions run at READ COMMITTED, PostgreSQL's default: with the locks above, every statement
sees what committed before the lock was granted. The URL may carry a password; libpq also reads
``PGPASSWORD`` and ``~/.pgpass``, which keep it out of ``ps``. Errors name the database without it.
"""
from __future__ import annotations

import re
from contextlib import contextmanager

from .store import Row, Store, StoreError

LOCK_SCOPES = {"migrate": 1, "attempts": 2, "signins": 3, "rate": 4}
"""First key of ``pg_advisory_xact_lock(int, int)``: what the lock guards."""


def _row_factory(cursor):
    names = {d.name: i for i, d in enumerate(cursor.description or ())}
    return lambda values: Row(names, values)


def redact(url: str) -> str:
    """``postgresql://user@host:port/dbname``: the URL without its password or options."""
    from psycopg.conninfo import conninfo_to_dict

    try:
        d = conninfo_to_dict(url)
    except Exception:                       # noqa: BLE001 (a malformed URL: show nothing of it)
        return "postgresql://…"
    host = d.get("host", "")
    where = f"{host}:{d['port']}" if d.get("port") else host
    return f"postgresql://{d.get('user', '') + '@' if d.get('user') else ''}{where}/{d.get('dbname', '')}"


class _Tx:
    """A connection inside one transaction, speaking `Store`'s ``?`` placeholders."""

    def __init__(self, conn):
        self.conn = conn

    def execute(self, sql: str, params=()):
        return self.conn.execute(sql.replace("?", "%s"), params or None)

    def executemany(self, sql: str, rows):
        with self.conn.cursor() as cur:
            cur.executemany(sql.replace("?", "%s"), rows)


class PostgresStore(Store):
    FOR_UPDATE = " FOR UPDATE"
    FOR_SHARE = " FOR SHARE"
    shared = True

    def __init__(self, url: str, *, pool_size: int = 10, connect_timeout_s: float = 15.0):
        try:
            import psycopg
            from psycopg_pool import ConnectionPool, PoolTimeout
        except ImportError:
            raise StoreError("--db postgresql://… needs psycopg 3 and psycopg-pool: "
                             "pip install 'psycopg[binary]' psycopg-pool (or the serve extra)") from None
        self.url = url
        self._psycopg = psycopg
        self._rate_calls = 0
        self.pool = ConnectionPool(url, min_size=1, max_size=pool_size, open=False, name="minimega",
                                   kwargs={"autocommit": True, "row_factory": _row_factory},
                                   timeout=connect_timeout_s)
        try:
            self.pool.open(wait=True, timeout=connect_timeout_s)
        except (PoolTimeout, psycopg.Error) as err:
            self.pool.close()
            raise StoreError(f"cannot connect to {self.where} within {connect_timeout_s:g} s: "
                             f"{str(err).splitlines()[0][:200]}") from None
        self.migrate()

    @property
    def where(self) -> str:
        return redact(self.url)

    # --- connections ---------------------------------------------------------------------------

    def conn(self):
        raise StoreError("PostgresStore has no per-thread connection: use write(), snapshot(), fetchone()")

    @contextmanager
    def write(self):
        with self.pool.connection() as conn, conn.transaction():
            yield _Tx(conn)

    @contextmanager
    def snapshot(self):
        with self.pool.connection() as conn, conn.transaction():
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
            yield _Tx(conn)

    def fetchone(self, sql: str, params=()):
        with self.pool.connection() as conn:
            return _Tx(conn).execute(sql, params).fetchone()

    def fetchall(self, sql: str, params=()) -> list:
        with self.pool.connection() as conn:
            return _Tx(conn).execute(sql, params).fetchall()

    def close(self) -> None:
        self.pool.close()

    # --- dialect -------------------------------------------------------------------------------

    def _serialize(self, c, scope: str, key: str) -> None:
        c.execute("SELECT pg_advisory_xact_lock(?, hashtext(?))", (LOCK_SCOPES[scope], key))

    def _flush_erased(self) -> None:
        """VACUUM the tables an erasure touched, so the space of the erased row versions is reclaimed soon.
        PostgreSQL does not overwrite it at once: the old versions stay in free space (and in backups and WAL
        archives) until reused; the operator's retention of those is part of the erasure."""
        with self.pool.connection() as conn:
            conn.execute("VACUUM answers, attempt_items, attempts, credentials, signins, sessions")

    def _is_unique_violation(self, err: Exception) -> bool:
        return isinstance(err, self._psycopg.errors.UniqueViolation)

    def _ddl(self, sql: str) -> str:
        return re.sub(r"\bREAL\b", "DOUBLE PRECISION", sql)

    def _version(self, c) -> int:
        return int(c.execute("SELECT COALESCE(MAX(version), 0) FROM schema_migrations").fetchone()[0])

    def _set_version(self, c, version: int) -> None:
        """The row `migrate` inserts into schema_migrations is the version."""
