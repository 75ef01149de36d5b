"""The embedded PostgreSQL server (binaries from the ``pgserver`` wheel, managed here).

``activedb.connect()`` with no URL uses a server whose data directory is ``$ACTIVEDB_HOME/pgdata``.
Its lock-down, who runs it, its lifecycle and the mutex order: the design note, ``README.md``.

Thread-safety: ``_registry_mutex`` protects ``_registry``; the file lock is taken before it, never after.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import fcntl
import json
import os
import secrets
import threading
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

from activedb._embedded._files import (HANDLE_FILE, check_owned, check_path, data_directory_owners,
                                       make_private_directory, socket_directory_for, write_password)
from activedb._embedded._server import (SUPERUSER, RunAs, bin_directory, check_data_directory,
                                        discard_unfinished_initdb, initdb, lock_down, postmaster, runner_for,
                                        start_postgres, stop_postgres, wait_ready)
from activedb.errors import EmbeddedServerError

if TYPE_CHECKING:  # pragma: no cover
    import sqlalchemy as sa

DATABASE_NAME = "activedb"
LOCK_FILE = ".server.lock"


def default_home() -> Path:
    configured = os.environ.get("ACTIVEDB_HOME")
    if configured:
        return Path(configured).expanduser()
    data_home = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data_home) / "activedb"


@dataclass(frozen=True)
class EmbeddedServer:
    """A handle on the running embedded server."""

    data_directory: Path
    socket_directory: str
    pid: int
    password: str = field(repr=False)

    def url(self, database: str = DATABASE_NAME) -> str:
        """The SQLAlchemy URL of ``database`` (with the password: never print it unmasked)."""
        socket = urllib.parse.quote(self.socket_directory, safe="")
        return f"postgresql+psycopg://{SUPERUSER}:{urllib.parse.quote(self.password, safe='')}@/{database}?host={socket}"

    def conninfo(self, database: str = DATABASE_NAME) -> str:
        """A libpq connection string for ``database`` (for psycopg directly)."""
        from psycopg.conninfo import make_conninfo

        return make_conninfo(host=self.socket_directory, user=SUPERUSER, dbname=database, password=self.password)


# --- this process's registration ---------------------------------------------------------------

@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """``flock`` on ``ACTIVEDB_HOME/.server.lock``: one process at a time starts, registers or stops."""
    try:
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as error:
        if error.errno == errno.ELOOP:      # (O_NOFOLLOW: the file is a link)
            raise EmbeddedServerError(
                f"cannot open the lock file {path} ({error}); if it is a symbolic link someone may have "
                f"planted it: remove it and connect again") from None
        raise EmbeddedServerError(
            f"cannot create the lock file {path} ({error.strerror or error}): ACTIVEDB_HOME {path.parent} must be "
            f"writable by you — make it writable (chmod u+w {path.parent}) or set ACTIVEDB_HOME to a directory of your "
            f"own (nothing was touched)") from None
    fcntl.flock(descriptor, fcntl.LOCK_EX)
    try:
        yield
    finally:
        fcntl.flock(descriptor, fcntl.LOCK_UN)
        os.close(descriptor)


@dataclass
class _Registration:
    home: Path
    keep_running: bool
    server: EmbeddedServer


_registry_mutex = threading.Lock()            # protects _registry
_registry: dict[Path, _Registration] = {}     # data directory -> this process's registration


def _handle_pids(pgdata: Path) -> list[int]:
    try:
        pids: list[int] = json.loads((pgdata / HANDLE_FILE).read_text() or "[]")
        return pids
    except (FileNotFoundError, json.JSONDecodeError):
        return []


def _write_handle_pids(pgdata: Path, pids: list[int]) -> None:
    path = pgdata / HANDLE_FILE
    path.write_text(json.dumps(pids))
    if os.geteuid() == 0:
        info = pgdata.stat()
        os.chown(path, info.st_uid, info.st_gid)


def _prune_dead_users(pgdata: Path, *, registered: bool) -> None:
    """Drop pids of processes that died without unregistering (e.g. SIGKILL).  This process's own pid is
    kept if it is ``registered`` (it already uses the server: a second ``connect()``), and dropped
    otherwise (a dead process that had the same pid).  Caller holds the file lock."""
    import psutil

    pids = _handle_pids(pgdata)
    me = os.getpid()
    alive = [pid for pid in pids if (pid == me and registered) or (pid != me and psutil.pid_exists(pid))]
    if alive != pids:
        _write_handle_pids(pgdata, alive)


def start(home: Path | None = None, *, keep_running: bool | None = None) -> EmbeddedServer:
    """Start, or reuse, the embedded server under ``home``; create the database."""
    if keep_running is None:
        keep_running = os.environ.get("ACTIVEDB_KEEP_SERVER", "").strip().lower() not in ("", "0", "false", "no",
                                                                                            "off")
    bin_directory()         # the embedded extra missing: its one line, before anything is created
    home = (home or default_home()).expanduser()
    check_path(home if home.is_absolute() else Path.cwd() / home, "ACTIVEDB_HOME")
    home = home.resolve()
    pgdata = home / "pgdata"
    check_owned(home, {os.geteuid()}, "ACTIVEDB_HOME")
    check_owned(pgdata, data_directory_owners(), "the data directory")
    try:
        make_private_directory(home, traversable=runner_for(pgdata).how is RunAs.SERVICE)
    except OSError as error:
        raise EmbeddedServerError(f"cannot create ACTIVEDB_HOME {home}: {error}") from error
    check_owned(home, {os.geteuid()}, "ACTIVEDB_HOME")       # again: made by someone else meanwhile?
    with _file_lock(home / LOCK_FILE):
        # Under the lock: another process may be initialising this data directory right now.
        discard_unfinished_initdb(pgdata)
        check_data_directory(pgdata)
        runner = runner_for(pgdata)
        with _registry_mutex:
            registration = _registry.get(pgdata)
        if pgdata.exists():
            _prune_dead_users(pgdata, registered=registration is not None)
        fresh = not (pgdata / "PG_VERSION").exists()
        if fresh:
            password = secrets.token_urlsafe(24)
            write_password(home, password)
            initdb(pgdata, runner, password)
        running = postmaster(pgdata)
        if running is not None and running.status != "ready":
            running = wait_ready(pgdata)
        password = lock_down(pgdata, home, running, runner)
        if running is not None:
            _warn_if_not_private(running.socket_directory, pgdata)
        else:
            socket_directory = socket_directory_for(pgdata, runner)
            start_postgres(pgdata, socket_directory, runner)
            running = wait_ready(pgdata)
        server = EmbeddedServer(pgdata, running.socket_directory, running.pid, password)
        pids = _handle_pids(pgdata)
        if os.getpid() not in pids:
            _write_handle_pids(pgdata, [*pids, os.getpid()])
        with _registry_mutex:
            if pgdata not in _registry:
                _registry[pgdata] = _Registration(home, keep_running, server)
                atexit.register(_unregister, pgdata)
            else:
                _registry[pgdata].server = server
                _registry[pgdata].keep_running = _registry[pgdata].keep_running and keep_running
        _ensure_database(server)          # under the lock: processes starting together create it once
    return server


def _warn_if_not_private(socket_directory: str, pgdata: Path) -> None:
    import logging

    info = os.stat(socket_directory)
    if info.st_mode & 0o077:
        logging.getLogger("activedb").warning(
            "the running embedded server of %s (started by an older activedb) listens in %s, which other users "
            "may enter; stop it (it restarts locked down with the next connect)", pgdata, socket_directory)


def _unregister(pgdata: Path) -> None:
    """At exit (or ``stop``): remove this process; stop the server if it was the last user."""
    with _registry_mutex:
        registration = _registry.pop(pgdata, None)
    if registration is None:
        return
    with _file_lock(registration.home / LOCK_FILE):
        pids = [pid for pid in _handle_pids(pgdata) if pid != os.getpid()]
        _write_handle_pids(pgdata, pids)
        if pids or registration.keep_running:
            return
        try:
            running = postmaster(pgdata)
            stop_postgres(pgdata)
        except EmbeddedServerError as error:     # (at exit: said, not a traceback; the server is left running)
            import logging

            logging.getLogger("activedb").warning("the embedded server was not stopped: %s", error)
            return
        if running is not None and Path(running.socket_directory) != pgdata:
            with contextlib.suppress(OSError):
                Path(running.socket_directory).rmdir()     # our private directory in the temp dir, now empty


def log_of_url(url: sa.URL) -> str | None:
    """The log file of this process's embedded server that a SQLAlchemy ``url`` points at (its socket
    directory, ``?host=``), if any (for advice in error messages)."""
    socket = url.query.get("host")
    with _registry_mutex:
        for pgdata, registration in _registry.items():
            if registration.server.socket_directory == socket:
                return str(pgdata / "log")
    return None


def stop(home: Path) -> None:
    """Unregister this process from the server under ``home``; stops it if this was the last user."""
    _unregister((Path(home).expanduser().resolve()) / "pgdata")


def _ensure_database(server: EmbeddedServer) -> None:
    import psycopg

    with psycopg.connect(server.conninfo("postgres"), autocommit=True) as connection:
        exists = connection.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE_NAME,)).fetchone()
        if not exists:
            # Created meanwhile by a client that does not take our lock: fine.
            with contextlib.suppress(psycopg.errors.DuplicateDatabase, psycopg.errors.UniqueViolation):
                connection.execute(f'CREATE DATABASE "{DATABASE_NAME}"')
