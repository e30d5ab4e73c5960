"""A real PostgreSQL server for the test session: Debian's binaries, a cluster in a temp folder, a free port.

`initdb` and `pg_ctl` from ``/usr/lib/postgresql/<newest>/bin`` (or ``pg_config --bindir``) create and start
a throwaway cluster listening on 127.0.0.1 and on a unix socket inside the folder, trust authentication
(nothing else can reach it: loopback only, and the folder is private). PostgreSQL refuses to run as
root, so under root (CI containers) the server runs as the ``postgres`` user that Debian's package
creates, through ``runuser``. Each test gets a fresh database (`PostgresServer.new_database`).

The tests that need it skip, saying why, only where the binaries are absent (``apt-get install -y
postgresql``; ``.ci/run`` does it) or psycopg is not installed.
"""
from __future__ import annotations

import glob
import itertools
import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest


def find_bindir() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                   key=lambda p: int(Path(p).parts[-3]) if Path(p).parts[-3].isdigit() else 0)
    if found:
        return Path(found[-1]).parent
    if shutil.which("pg_config"):
        out = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True).stdout.strip()
        if out and (Path(out) / "initdb").exists():
            return Path(out)
    return Path(shutil.which("initdb")).parent if shutil.which("initdb") else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PostgresServer:
    """One cluster; `stop` kills it and removes its folder."""

    def __init__(self, bindir: Path, *, fsync: bool = False):
        self.bindir = bindir
        self.dir = Path(tempfile.mkdtemp(prefix="minimega-pg-"))
        self.as_user: list[str] = []
        if os.geteuid() == 0:
            import pwd
            try:
                user = pwd.getpwnam("postgres")
            except KeyError:
                shutil.rmtree(self.dir)
                raise RuntimeError("running as root and there is no 'postgres' user to run the server as "
                                   "(Debian's postgresql package creates it)") from None
            os.chown(self.dir, user.pw_uid, user.pw_gid)
            self.as_user = ["runuser", "-u", "postgres", "--"]
        self._names = itertools.count()
        data, log = self.dir / "data", self.dir / "server.log"
        self._run([str(bindir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8",
                   "--no-sync"])
        # fsync off by default: tests kill service processes, never the database, so its durability is not under test
        opts = (f"-c listen_addresses=127.0.0.1 -c unix_socket_directories={self.dir} -c max_connections=300 "
                f"-c fsync={'on' if fsync else 'off'}")
        for _ in range(5):                       # another process may take the free port first
            self.port = free_port()
            done = subprocess.run([*self.as_user, str(bindir / "pg_ctl"), "-D", str(data), "-l", str(log), "-w",
                                   "-t", "60", "-o", f"{opts} -p {self.port}", "start"],
                                  capture_output=True, text=True, timeout=90)
            if done.returncode == 0:
                break
        else:
            tail = log.read_text()[-2000:] if log.exists() else ""
            shutil.rmtree(self.dir, ignore_errors=True)
            raise RuntimeError(f"pg_ctl start failed: {done.stdout}{done.stderr}{tail}")
        self.data = data

    def _run(self, cmd: list[str]) -> None:
        done = subprocess.run([*self.as_user, *cmd], capture_output=True, text=True, timeout=120)
        if done.returncode:
            raise RuntimeError(f"{' '.join(cmd)} failed: {done.stdout}{done.stderr}")

    def url(self, dbname: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}"

    def new_database(self) -> str:
        """A fresh, empty database; returns its URL."""
        import psycopg

        name = f"t{os.getpid()}_{next(self._names)}"
        with psycopg.connect(self.url(), autocommit=True) as c:
            c.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def stop(self) -> None:
        subprocess.run([*self.as_user, str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop"],
                       capture_output=True, timeout=60)
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres_server():
    """The session's PostgreSQL server; skips with the reason where it cannot run here."""
    try:
        import psycopg  # noqa: F401
        import psycopg_pool  # noqa: F401
    except ImportError:
        pytest.skip("psycopg 3 and psycopg-pool are not installed (pip install 'psycopg[binary]' psycopg-pool)")
    bindir = find_bindir()
    if bindir is None:
        pytest.skip("PostgreSQL server binaries not found (Debian: apt-get install -y postgresql)")
    server = PostgresServer(bindir)
    yield server
    server.stop()
