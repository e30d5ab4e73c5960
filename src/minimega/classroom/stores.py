"""`open_store`: the store ``--db`` names. Sits above both stores so neither imports the other."""
from __future__ import annotations

from pathlib import Path

from .store import Store, StoreError
from .store_postgres import PostgresStore


def open_store(db: str | Path) -> "Store":
    """The store ``--db`` names: a ``postgresql://`` URL (PostgreSQL), else the path of a SQLite file."""
    text = str(db)
    if text.startswith(("postgresql://", "postgres://")):
        return PostgresStore(text)
    if "://" in text:
        raise StoreError(f"--db {text.split('://')[0]}://…: use a postgresql://user@host/dbname URL or the "
                         "path of a SQLite file")
    return Store(db)
