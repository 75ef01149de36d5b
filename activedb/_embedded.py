"""The embedded PostgreSQL server (from the ``pgserver`` wheel).

``activedb.connect()`` with no URL uses a server whose data directory is
``$ACTIVEDB_HOME/pgdata`` (default ``ACTIVEDB_HOME``: ``$XDG_DATA_HOME/activedb``,
i.e. ``~/.local/share/activedb``).

Lifecycle (documented in README):

* The first process starts the server (``initdb`` on first use), later processes
  reuse it: the ``postmaster.pid`` file says which server runs, and pgserver's
  inter-process lock serialises start and stop, so there is never a second
  postmaster on one data directory.
* Every process that uses the server is listed in ``pgdata/.handle_pids.json``.
  When the last one exits normally the server is stopped cleanly (``pg_ctl stop``
  in an ``atexit`` hook).  ``keep_running=True`` (or ``ACTIVEDB_KEEP_SERVER=1``)
  leaves it running for the next process instead.
* A process killed with SIGKILL cannot unregister; its pid is pruned from the
  list by the next process that connects, so the server still stops when the
  last *living* user exits.  A stale ``postmaster.pid`` left by a crashed server
  is recognised (no such process) and the server is started again; PostgreSQL
  runs crash recovery from its WAL.
* A data directory written by another PostgreSQL major version, or one that is
  not a PostgreSQL data directory at all, is refused with a clear error;
  nothing is ever deleted.
"""

from __future__ import annotations

import json
import os
import subprocess
import warnings
from dataclasses import dataclass
from pathlib import Path

from activedb.errors import EmbeddedServerError

DATABASE_NAME = "activedb"


def default_home() -> Path:
    configured = os.environ.get("ACTIVEDB_HOME")
    if configured:
        return Path(configured).expanduser()
    data_home = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data_home) / "activedb"


def server_major_version() -> str:
    from pgserver._commands import POSTGRES_BIN_PATH

    output = subprocess.run(
        [str(POSTGRES_BIN_PATH / "postgres"), "--version"], capture_output=True, text=True, check=True
    ).stdout
    # "postgres (PostgreSQL) 16.2"
    return output.strip().split()[-1].split(".")[0]


@dataclass(frozen=True)
class EmbeddedServer:
    """A handle on the running embedded server; ``url`` is a SQLAlchemy URL."""

    data_directory: Path
    socket_directory: str
    pid: int

    def url(self, database: str = DATABASE_NAME) -> str:
        return f"postgresql+psycopg://postgres@/{database}?host={self.socket_directory}"


def _check_data_directory(pgdata: Path) -> None:
    """Refuse data directories we must not touch.  Never deletes anything."""
    if not pgdata.exists():
        return
    version_file = pgdata / "PG_VERSION"
    if version_file.exists():
        found = version_file.read_text().strip()
        expected = server_major_version()
        if found != expected:
            raise EmbeddedServerError(
                f"the data directory {pgdata} was created by PostgreSQL {found}, but the embedded server "
                f"is PostgreSQL {expected}; point ACTIVEDB_HOME at another directory, or migrate the data "
                f"with pg_upgrade/pg_dump first (nothing was deleted)"
            )
        return
    leftovers = [entry.name for entry in pgdata.iterdir() if entry.name not in {".handle_pids.json", "log"}]
    if leftovers:
        raise EmbeddedServerError(
            f"{pgdata} is not empty but is not a PostgreSQL data directory (no PG_VERSION; found "
            f"{', '.join(sorted(leftovers)[:5])}); move it away or set ACTIVEDB_HOME to another directory "
            f"(nothing was deleted)"
        )


def _prune_dead_users(pgdata: Path, *, registered: bool) -> None:
    """Drop pids of processes that died without unregistering (e.g. SIGKILL).  This process's own pid is
    kept if it is ``registered`` (it already uses the server: a second ``connect()``), and dropped
    otherwise (a dead process that had the same pid).

    Caller holds pgserver's inter-process lock.
    """
    import psutil

    handle_file = pgdata / ".handle_pids.json"
    if not handle_file.exists():
        return
    try:
        pids = json.loads(handle_file.read_text() or "[]")
    except json.JSONDecodeError:
        pids = []
    me = os.getpid()
    alive = [pid for pid in pids if (pid == me and registered) or (pid != me and psutil.pid_exists(pid))]
    if alive != pids:
        handle_file.write_text(json.dumps(alive))


def start(home: Path | None = None, *, keep_running: bool | None = None) -> EmbeddedServer:
    """Start, or reuse, the embedded server under ``home``; create the database."""
    warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set")
    try:
        import pgserver
        from pgserver.postgres_server import PostgresServer
    except ImportError as error:  # pragma: no cover - dependency of the package
        raise EmbeddedServerError(
            "the embedded database needs the 'pgserver' package: pip install pgserver "
            "(or set ACTIVEDB_DATABASE_URL to an existing PostgreSQL)"
        ) from error

    if keep_running is None:
        keep_running = os.environ.get("ACTIVEDB_KEEP_SERVER", "") not in ("", "0", "false", "no")
    home = (home or default_home()).expanduser().resolve()
    pgdata = home / "pgdata"
    try:
        home.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise EmbeddedServerError(f"cannot create ACTIVEDB_HOME {home}: {error}") from error
    _check_data_directory(pgdata)

    try:
        PostgresServer.runtime_path.mkdir(parents=True, exist_ok=True)
        with PostgresServer._lock:
            if pgdata.exists():
                _prune_dead_users(pgdata, registered=pgdata in PostgresServer._instances)
        server = pgserver.get_server(pgdata, cleanup_mode=None if keep_running else "stop")
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, AssertionError, OSError) as error:
        log_tail = _log_tail(pgdata / "log")
        raise EmbeddedServerError(
            f"the embedded PostgreSQL in {pgdata} did not start ({type(error).__name__}); "
            f"see the server log {pgdata / 'log'}; nothing was deleted.{log_tail}"
        ) from error

    info = server.get_postmaster_info()
    socket_directory = str(info.socket_dir)
    embedded = EmbeddedServer(pgdata, socket_directory, info.pid)
    _ensure_database(embedded)
    return embedded


def stop(home: Path) -> None:
    """Unregister this process from the server under ``home``; stops it if this was the last user."""
    from pgserver.postgres_server import PostgresServer

    pgdata = (Path(home).expanduser().resolve()) / "pgdata"
    server = PostgresServer._instances.get(pgdata)
    if server is not None:
        server.cleanup()


def _log_tail(log: Path, lines: int = 5) -> str:
    try:
        tail = log.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return ""
    return "\n  last server log lines:\n  " + "\n  ".join(tail) if tail else ""


def _ensure_database(server: EmbeddedServer, database: str = DATABASE_NAME) -> None:
    import psycopg

    conninfo = f"host={server.socket_directory} user=postgres dbname=postgres"
    with psycopg.connect(conninfo, autocommit=True) as connection:
        exists = connection.execute("SELECT 1 FROM pg_database WHERE datname = %s", (database,)).fetchone()
        if not exists:
            try:
                connection.execute(f'CREATE DATABASE "{database}"')
            except psycopg.errors.DuplicateDatabase:  # another process won the race
                pass
