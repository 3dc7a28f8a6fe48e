"""A real PostgreSQL server for tests and benchmarks, in a scratch folder on a free port.

    with PostgresServer() as pg:
        url = pg.create_database()          # postgresql://postgres@127.0.0.1:PORT/gl_1
        store = open_store(url)

``initdb`` refuses to run as root, so as root the server runs as the ``postgres`` user (Debian's
``postgresql`` package makes it); the tests themselves stay root. ``fsync=off``: a test server
loses nothing that matters when the machine crashes. Stopped (``pg_ctl -m fast``) on exit.
Its folder is a fresh one under the system's temporary directory unless given (the ``postgres``
user must be able to reach it: pytest's own temporary folders are private to root), removed on
``close()``. ``find_bin()`` says where the binaries are, or None when PostgreSQL is not installed.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path
from types import TracebackType

_SEARCH = ("/usr/lib/postgresql/{v}/bin",)
_VERSIONS = ("17", "16", "15", "14")


def find_bin() -> Path | None:
    """The folder with ``initdb`` and ``pg_ctl`` (Debian keeps them out of PATH), or None."""
    for version in _VERSIONS:
        for pattern in _SEARCH:
            folder = Path(pattern.format(v=version))
            if (folder / "initdb").exists() and (folder / "pg_ctl").exists():
                return folder
    found = shutil.which("initdb")
    return Path(found).parent if found else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PostgresServer:
    """One PostgreSQL server: ``start()``, ``create_database()``, ``stop()`` / ``start()`` again."""

    def __init__(self, folder: Path | str | None = None, *, port: int | None = None) -> None:
        self._own = folder is None
        self.folder = Path(folder or tempfile.mkdtemp(prefix="gpulayer-pg-"))
        self.port = port or free_port()
        self.bin = find_bin()
        self._names = itertools.count(1)
        self._as_root = os.geteuid() == 0

    @property
    def data(self) -> Path:
        return self.folder / "data"

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def _run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        if self.bin is None:
            raise RuntimeError("PostgreSQL is not installed (apt-get install postgresql)")
        cmd = [str(self.bin / argv[0]), *argv[1:]]
        if self._as_root:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        # Run from a folder the postgres user may enter (the caller's cwd may be a 0700 home).
        return subprocess.run(
            cmd, check=check, capture_output=True, text=True, cwd=self.folder, timeout=60
        )

    def start(self) -> PostgresServer:
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / "sock").mkdir(exist_ok=True)
        if self._as_root:
            shutil.chown(self.folder, "postgres")
            shutil.chown(self.folder / "sock", "postgres")
        if not (self.data / "PG_VERSION").exists():
            self._run(
                "initdb",
                "-D",
                str(self.data),
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--locale=C.UTF-8",
                "--no-sync",
            )
        options = (
            f"-p {self.port} -k {self.folder / 'sock'} -c listen_addresses=127.0.0.1 "
            "-c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200"
        )
        self._run(
            "pg_ctl", "-D", str(self.data), "-l", str(self.folder / "server.log"), "-w", "-o",
            options, "start",
        )  # fmt: skip
        return self

    def stop(self) -> None:
        if self.bin is not None and (self.data / "postmaster.pid").exists():
            self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop", check=False)

    def close(self) -> None:
        """Stop the server and, when the folder was made here, remove it."""
        self.stop()
        if self._own:
            shutil.rmtree(self.folder, ignore_errors=True)

    def create_database(self, name: str | None = None) -> str:
        """A new empty database; its URL."""
        name = name or f"gl_{os.getpid()}_{next(self._names)}"
        self.sql(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def sql(self, statement: str, database: str = "postgres") -> str:
        """Run one statement with ``psql`` (the test's view behind the store's back)."""
        out = self._run(
            "psql",
            "-h",
            "127.0.0.1",
            "-p",
            str(self.port),
            "-U",
            "postgres",
            "-d",
            database,
            "-At",
            "-v",
            "ON_ERROR_STOP=1",
            "-c",
            statement,
        )
        return out.stdout.strip()

    def log(self) -> str:
        with contextlib.suppress(OSError):
            return (self.folder / "server.log").read_text(errors="replace")
        return ""

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


__all__ = ["PostgresServer", "find_bin", "free_port"]
