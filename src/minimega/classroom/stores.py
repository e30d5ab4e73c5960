"""`open_store`: the store ``--db`` names. Sits above both stores so neither imports the other."""
from __future__ import annotations

import stat
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


def secure_var_dir(path: Path) -> None:
    """The service's folder (database, keys, pepper): created 0700; an existing one that its group or others can
    read is refused, with the command that fixes it."""
    path = Path(path)
    if path.exists():
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & 0o077:
            raise StoreError(f"{path} is open to its group or others (mode {mode:04o}) and holds learner data and "
                             f"keys: run `chmod 700 {path}` and start again")
        return
    path.mkdir(parents=True, mode=0o700)
    path.chmod(0o700)
