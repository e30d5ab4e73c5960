"""The pepper: the secret every learner key is a keyed hash under (`identity.learner_key`).

It lives apart from the database, so a copied database file or backup alone does not let anyone test guessed
addresses against the learner keys in it: from ``$MINIMEGA_PEPPER`` (hex, 32 bytes or more; the way to give
several instances the same one), else the file ``pepper`` in the keys folder (0600, created on first start). A
database an older minimega kept its pepper in has it moved to that file, then deleted from the database. The
database records the pepper's fingerprint, so an instance started with a different pepper refuses to run
instead of splitting every learner in two.
"""
from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import stat
from pathlib import Path

from .store_schema import StoreError

ENV = "MINIMEGA_PEPPER"
FILE = "pepper"


def fingerprint(pepper: bytes) -> str:
    return hmac.new(pepper, b"minimega pepper fingerprint", hashlib.sha256).hexdigest()[:32]


def _parse(text: str, where: str) -> bytes:
    try:
        value = bytes.fromhex(text.strip())
    except ValueError:
        raise StoreError(f"{where}: not hex; generate one with `python -c 'import secrets; "
                         "print(secrets.token_hex(32))'`") from None
    if len(value) < 32:
        raise StoreError(f"{where}: {len(value)} bytes; a pepper is at least 32 (64 hex digits)")
    return value


def _read_file(path: Path) -> bytes:
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        raise StoreError(f"{path} is readable by others (mode {mode:04o}): run `chmod 600 {path}`")
    return _parse(path.read_text()[:1000], str(path))


def load_pepper(keys_dir: Path, store, env=os.environ) -> bytes:
    """The pepper (see the module), bound to `store`; `StoreError` saying what to change."""
    if env.get(ENV, "").strip():
        pepper = _parse(env[ENV], f"${ENV}")
    else:
        path = Path(keys_dir) / FILE
        if path.exists():
            pepper = _read_file(path)
        else:
            pepper = store.take_legacy_pepper() or secrets.token_bytes(32)
            Path(keys_dir).mkdir(parents=True, exist_ok=True, mode=0o700)
            tmp = path.with_name(f".{FILE}.{os.getpid()}.{secrets.token_hex(4)}")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(pepper.hex() + "\n")
                f.flush()
                os.fsync(f.fileno())
            try:
                os.link(tmp, path)                        # appears whole, or not at all: never half written
            except FileExistsError:                       # another instance wrote it a moment ago
                pepper = _read_file(path)
            finally:
                os.unlink(tmp)
    if store.bind_pepper(fingerprint(pepper)) != fingerprint(pepper):
        raise StoreError(f"{store.where} was keyed with another pepper: give every instance the same ${ENV} "
                         f"(or the same keys folder's {FILE} file)")
    if store.take_legacy_pepper() is not None:            # safe in the file (or the environment) now
        store.drop_legacy_pepper()
    return pepper
