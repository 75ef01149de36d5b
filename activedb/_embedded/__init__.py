"""The embedded PostgreSQL server (binaries from the ``pgserver`` wheel, managed here).

``activedb.connect()`` with no URL uses a server whose data directory is ``$ACTIVEDB_HOME/pgdata``
(default ``ACTIVEDB_HOME``: ``$XDG_DATA_HOME/activedb``, i.e. ``~/.local/share/activedb``).

Locked down (nothing of the user's is opened to anyone):

* **A home or data directory someone else could have made is refused**, as ssh's StrictModes and
  PostgreSQL's own data-directory check do: ``ACTIVEDB_HOME`` must belong to the user running activedb
  and the data directory to that user (as root: or to the service user below), neither writable by
  group or others.  The password file and the lock file are never opened through a symbolic link, and
  the password file only if it is a regular file of this user.
* **No permission of an existing directory is ever changed.**  Directories activedb creates are ``0700``
  (``ACTIVEDB_HOME`` and its parents that did not exist, the data directory, the socket directory).
* **The socket is in a directory only the server's owner can enter**: the data directory itself when
  its path is short enough for a unix socket (107 bytes), else ``$TMPDIR/activedb-<uid>-<hash>``,
  created ``0700`` — and refused if it exists with another owner or with any group/other permission
  (someone may have planted it).  No TCP listener.
* **Local connections authenticate** (``scram-sha-256``) with a password generated at ``initdb`` and
  kept in ``$ACTIVEDB_HOME/password`` (``0600``); the URL ``connect()`` builds carries it (masked in every
  message).  A data directory made by an older activedb with ``trust`` authentication is converted the
  first time it is used (password set, ``pg_hba.conf`` rewritten, configuration reloaded).

Who runs the server: PostgreSQL refuses to run as root.  As a normal user, the binaries run as that
user.  As root, they run in a **user namespace** in which root is mapped to an unprivileged uid
(``unshare --user --map-user``): PostgreSQL sees a non-root owner, while outside the namespace every file
and the server process belong to root — so a data directory under ``/root`` works and stays root's
alone (inside, it is ``nobody``: initdb needs a named user).  Where user namespaces are not available (some containers), the server runs as the system user
``pgserver`` (created if needed), whose data directory must be reachable without widening anything:
otherwise the error says which directory to choose.  A data directory an older activedb created for
``pgserver`` keeps being run as ``pgserver``.

Lifecycle (documented in README):

* The first process starts the server (``initdb`` on first use), later processes reuse it: the
  ``postmaster.pid`` file says which server runs, and a lock file in ``ACTIVEDB_HOME`` (``flock``)
  serialises start and stop (and the creation of the database), so there is never a second postmaster
  on one data directory, and processes starting together on a fresh home all succeed.
* Every process that uses the server is listed in ``pgdata/.handle_pids.json``.  When the last one exits
  normally the server is stopped cleanly (fast shutdown, in an ``atexit`` hook).  ``keep_running=True``
  (or ``ACTIVEDB_KEEP_SERVER=1``) leaves it running for the next process instead.
* A process killed with SIGKILL cannot unregister; its pid is pruned from the list by the next process
  that connects, so the server still stops when the last *living* user exits.  A stale
  ``postmaster.pid`` left by a crashed server is recognised (no such postgres process) and the server is
  started again; PostgreSQL runs crash recovery from its WAL.
* A data directory written by another PostgreSQL major version, or one that is not a PostgreSQL data
  directory at all, is refused with a clear error; nothing is ever deleted.

Modules, by job: this one the lifecycle (``start``/``stop``, the processes using the server, the
database); ``_files`` the files and their ownership (the checks above, the socket directory, the password
file, ``pg_hba.conf``); ``_server`` who runs the binaries, and the server process.

Thread-safety: ``_registry_mutex`` protects ``_registry`` (this process's registrations); the file lock
orders processes.  The file lock is taken before ``_registry_mutex``, never after.
"""

from __future__ import annotations

import atexit
import fcntl
import json
import os
import secrets
import threading
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

from activedb._embedded._files import (HANDLE_FILE, check_owned, data_directory_owners, make_private_directory,
                                       socket_directory_for, write_password)
from activedb._embedded._server import (SUPERUSER, check_data_directory, initdb, lock_down, postmaster,
                                        runner_for, start_postgres, stop_postgres, wait_ready)
from activedb.errors import EmbeddedServerError

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

class _FileLock:
    """``flock`` on ``ACTIVEDB_HOME/.server.lock``: one process at a time starts, registers or stops."""

    def __init__(self, path: Path):
        self._path = path
        self._descriptor: int | None = None

    def __enter__(self) -> "_FileLock":
        try:
            self._descriptor = os.open(self._path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError as error:
            raise EmbeddedServerError(
                f"cannot open the lock file {self._path} ({error}); if it is a symbolic link someone may have "
                f"planted it: remove it and connect again") from None
        fcntl.flock(self._descriptor, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc_info: object) -> None:
        fcntl.flock(self._descriptor, fcntl.LOCK_UN)
        os.close(self._descriptor)


@dataclass
class _Registration:
    home: Path
    keep_running: bool
    server: EmbeddedServer


_registry_mutex = threading.Lock()            # protects _registry
_registry: dict[Path, _Registration] = {}     # data directory -> this process's registration


def _handle_pids(pgdata: Path) -> list[int]:
    try:
        return json.loads((pgdata / HANDLE_FILE).read_text() or "[]")
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
        keep_running = os.environ.get("ACTIVEDB_KEEP_SERVER", "") not in ("", "0", "false", "no")
    home = (home or default_home()).expanduser().resolve()
    pgdata = home / "pgdata"
    check_owned(home, {os.geteuid()}, "ACTIVEDB_HOME")
    check_owned(pgdata, data_directory_owners(), "the data directory")
    try:
        make_private_directory(home, traversable=runner_for(pgdata).how == "service")
    except OSError as error:
        raise EmbeddedServerError(f"cannot create ACTIVEDB_HOME {home}: {error}") from error
    check_owned(home, {os.geteuid()}, "ACTIVEDB_HOME")       # again: made by someone else meanwhile?
    with _FileLock(home / LOCK_FILE):
        # Under the lock: another process may be initialising this data directory right now.
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
        if running is not None:
            current = EmbeddedServer(pgdata, running.socket_directory, running.pid, "")
            password = lock_down(pgdata, home, current, runner)
            _warn_if_not_private(running.socket_directory, pgdata)
        else:
            password = lock_down(pgdata, home, None, runner)
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
    with _FileLock(registration.home / LOCK_FILE):
        pids = [pid for pid in _handle_pids(pgdata) if pid != os.getpid()]
        _write_handle_pids(pgdata, pids)
        if pids or registration.keep_running:
            return
        running = postmaster(pgdata)
        stop_postgres(pgdata)
        if running is not None and Path(running.socket_directory) != pgdata:
            try:
                Path(running.socket_directory).rmdir()     # our private directory in the temp dir, now empty
            except OSError:
                pass


def log_of_url(url) -> str | None:
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


def _ensure_database(server: EmbeddedServer, database: str = DATABASE_NAME) -> None:
    import psycopg

    with psycopg.connect(server.conninfo("postgres"), autocommit=True) as connection:
        exists = connection.execute("SELECT 1 FROM pg_database WHERE datname = %s", (database,)).fetchone()
        if not exists:
            try:
                connection.execute(f'CREATE DATABASE "{database}"')
            except (psycopg.errors.DuplicateDatabase, psycopg.errors.UniqueViolation):
                pass                      # created meanwhile by a client that does not take our lock
