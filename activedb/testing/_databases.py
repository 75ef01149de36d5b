"""Throw-away databases for tests, on the embedded server or on a server given by URL: what the pytest plugin
(``activedb.testing.pytest_plugin``) and the project's own ``tests/conftest.py`` make their databases with.

A test database is a copy of a *template* — a database migrated once per session and set of migrations
(activedb's own revisions, then the application's Alembic directories in order) — made with ``CREATE DATABASE …
TEMPLATE``, which copies files instead of running the migrations again; it is dropped with ``DROP DATABASE … WITH
(FORCE)`` (PostgreSQL 13 or later; :func:`drop_database` says what it does about autovacuum).  Names carry the process
id, so concurrent test sessions never meet; comments carry the session (:class:`SessionMark`), so a later session
drops what a killed one left (:meth:`Templates.drop_leftovers`).

Thread-safety: :class:`Templates` is used by one thread (pytest's); ``_mutex`` protects its counters anyway.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Protocol

from activedb.errors import Unconnected, connect_advice, libpq_timeout, why_not_connected
from activedb.testing.errors import DatabaseFixtureError

if TYPE_CHECKING:  # pragma: no cover
    import psycopg
    import sqlalchemy as sa

__all__ = ["Server", "ServerAtUrl", "SessionMark", "Templates", "create_database", "drop_database"]


class Server(Protocol):
    """A PostgreSQL server tests may create databases on: the embedded server's handle, or :class:`ServerAtUrl`."""

    def url(self, database: str) -> str:
        """The SQLAlchemy URL of ``database`` on this server (with its password: never print it unmasked)."""
        ...

    def conninfo(self, database: str) -> str:
        """A libpq connection string for ``database`` (psycopg)."""
        ...


@dataclass(frozen=True)
class ServerAtUrl:
    """A server given by the URL of a user that may create databases: the URL's host, port, user, password and
    options, any database name; the URL's own database (else ``postgres``) is where databases are made and dropped
    from, so it must be one the user may connect to."""

    base: sa.URL

    @classmethod
    def parse(cls, url: str) -> "ServerAtUrl":
        import sqlalchemy as sa

        from activedb._url import normalise_url

        return cls(sa.make_url(normalise_url(url)))

    def url(self, database: str) -> str:
        return self.base.set(drivername="postgresql+psycopg", database=database).render_as_string(hide_password=False)

    def conninfo(self, database: str) -> str:
        from psycopg.conninfo import make_conninfo

        parts: dict[str, Any] = {"host": self.base.host, "port": self.base.port, "user": self.base.username,
                                 "password": self.base.password, "dbname": database, **self.base.query}
        return make_conninfo(**{key: value for key, value in parts.items() if value is not None})


#: The database test databases are made and dropped from when the server's URL names none (and on the embedded server).
MAINTENANCE_DATABASE = "postgres"


@contextlib.contextmanager
def _admin(server: Server, doing: str) -> Iterator["psycopg.Connection[tuple[object, ...]]"]:
    """An autocommit connection to the database the server's URL names — a user of managed PostgreSQL may often
    connect to that one only —, else to ``postgres``, to ``doing`` there; a failure is a one-line
    :class:`DatabaseFixtureError` naming the server (password masked) and where it was given.  The connection waits
    at most the ``connect_timeout`` of the server's connection string, else ``activedb.connect``'s default
    (``EngineOptions.connect_timeout``): a host that drops the packets is given up then, not after the operating
    system's TCP timeout."""
    import psycopg
    import sqlalchemy as sa
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    from activedb import EngineOptions
    from activedb._url import describe_url

    named = server.base.database if isinstance(server, ServerAtUrl) else None
    database = named or MAINTENANCE_DATABASE
    conninfo = server.conninfo(database)
    given = conninfo_to_dict(conninfo).get("connect_timeout")
    if given is None:
        conninfo = make_conninfo(conninfo, connect_timeout=EngineOptions.connect_timeout)
    elif not _a_timeout(given):          # (psycopg's ProgrammingError, with no server named, else)
        raise DatabaseFixtureError(
            f"the test server {describe_url(sa.make_url(server.url(database)))} has connect_timeout={given!r}: give "
            f"?connect_timeout=SECONDS, a whole number of seconds (0 waits without end), in the URL of "
            f"--activedb-url, the activedb_url setting or ACTIVEDB_TEST_URL")
    what = "connect to"
    try:
        with psycopg.connect(conninfo, autocommit=True) as admin:
            what = doing
            yield admin
    except psycopg.Error as error:
        said = str(error).strip().splitlines()
        if what == "connect to":
            seconds = given if given is not None else EngineOptions.connect_timeout
            hint = _connect_hint(server, database, why_not_connected(error, libpq_timeout(seconds)), seconds)
        elif isinstance(error, psycopg.errors.InsufficientPrivilege) and doing.startswith("create database"):
            hint = (f" (the user may not create databases: ALTER ROLE {_user(server)} CREATEDB, as a superuser, or "
                    f"give the URL of a user that may)")
        else:
            hint = ""
        raise DatabaseFixtureError(
            f"cannot {what} the test server {describe_url(sa.make_url(server.url(database)))}: "
            f"{said[0] if said else type(error).__name__}{hint}; the server is the one of --activedb-url, the "
            f"activedb_url setting or ACTIVEDB_TEST_URL (a user that may create databases), else the embedded "
            f"one") from None


def _a_timeout(value: object) -> bool:
    """Whether libpq (and psycopg) take ``value`` for a ``connect_timeout``: a number of seconds, written as text."""
    try:
        int(float(str(value)))
    except (ValueError, OverflowError):      # (not a number; an infinity)
        return False
    return True


def _user(server: Server) -> str:
    return (server.base.username if isinstance(server, ServerAtUrl) else None) or "the user"


def _connect_hint(server: Server, database: str, why: Unconnected, waited: object) -> str:
    """What to do about a failed connection to ``database`` (``waited``: the connect_timeout), in parentheses; ""
    when nothing sure can be said.  A URL that names no database makes the test databases from ``postgres``: a user
    refused there is told to name one."""
    user = _user(server)
    if why is Unconnected.NOT_PERMITTED and isinstance(server, ServerAtUrl) and not server.base.database:
        return (f" (the URL names no database, so the test databases are made from {MAINTENANCE_DATABASE!r}: "
                f"name in the URL a database this user may connect to, or GRANT CONNECT ON DATABASE "
                f"{MAINTENANCE_DATABASE} TO {user})")
    advice = connect_advice(why, user=user, database=database, waited=waited)
    return f" ({advice})" if advice else ""


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


#: How long :func:`drop_database` keeps trying while processes it may not end are in the database.
DROP_PATIENCE_SECONDS = 60.0


def drop_database(server: Server, name: str, *, patience: float = DROP_PATIENCE_SECONDS) -> None:
    """Drop ``name`` if it exists, ending the sessions still connected to it.

    ``WITH (FORCE)`` ends the sessions, but only those the user may signal: a user who is not a superuser may not
    end an autovacuum worker, and autovacuum may visit any database at any moment; PostgreSQL then refuses the
    whole drop ("must be a member of the role whose process is being terminated").  A plain ``DROP DATABASE`` asks
    autovacuum workers to leave and waits up to 5 s for them (and for nothing else), so on that refusal the drop is
    tried plainly, then forced again, for ``patience`` seconds; after that a :class:`DatabaseFixtureError` names the
    processes still there.
    """
    import psycopg.errors

    deadline = time.monotonic() + patience
    with _admin(server, f"drop database {name!r} on") as admin:
        while True:
            try:
                admin.execute(f"DROP DATABASE IF EXISTS {_quoted(name)} WITH (FORCE)")
                return
            except psycopg.errors.InsufficientPrivilege:
                pass
            try:
                admin.execute(f"DROP DATABASE IF EXISTS {_quoted(name)}")
                return
            except psycopg.errors.ObjectInUse:
                pass
            if time.monotonic() >= deadline:
                staying = admin.execute(
                    "SELECT pid, coalesce(backend_type, 'type hidden') || coalesce(', role ' || usename, '') "
                    "FROM pg_stat_activity WHERE datname = %s ORDER BY pid", (name,)).fetchall()
                listed = ", ".join(f"pid {pid} ({what})" for pid, what in staying) or "none now"
                raise DatabaseFixtureError(
                    f"cannot drop database {name!r} on the test server: after {patience:g} s processes this user "
                    f"may not end are still connected to it ({listed}); end them (pg_terminate_backend as a "
                    f"superuser) or grant the test user pg_signal_backend, then drop it")


def create_database(server: Server, name: str, template: str | None = None, *, comment: str | None = None) -> str:
    """A fresh database ``name`` (dropped first if it exists), empty or a copy of ``template``, with ``comment``
    (``COMMENT ON DATABASE``; a copy has none of its template's); returns its URL."""
    from psycopg import sql

    drop_database(server, name)
    with _admin(server, f"create database {name!r} on") as admin:
        copy = f" TEMPLATE {_quoted(template)}" if template else ""
        admin.execute(f"CREATE DATABASE {_quoted(name)}{copy}")
        if comment is not None:
            admin.execute(sql.SQL("COMMENT ON DATABASE {} IS {}").format(sql.Identifier(name), sql.Literal(comment)))
    return server.url(name)


#: How the comment of every database :class:`Templates` makes begins; the rest is the JSON of its session's
#: :class:`SessionMark`.
SESSION_MARK = "activedb test session "


@dataclass(frozen=True)
class SessionMark:
    """Who made a test database: the machine (host name and, on Linux, the kernel's boot id and the process's PID
    namespace: the same pid elsewhere is another process), the process id and the process's start time (clock
    ticks since boot, Linux; None elsewhere: a pid reused since is then taken for the session, which only keeps a
    leftover)."""

    machine: str
    pid: int
    started: int | None

    @classmethod
    def of_this_process(cls) -> "SessionMark":
        return cls(_machine(), os.getpid(), _start_ticks(os.getpid()))

    def comment(self) -> str:
        return SESSION_MARK + json.dumps({"machine": self.machine, "pid": self.pid, "started": self.started})

    @classmethod
    def parse(cls, comment: str | None) -> "SessionMark | None":
        """The mark a comment carries; None if it carries none (a database :class:`Templates` did not make)."""
        if not comment or not comment.startswith(SESSION_MARK):
            return None
        try:
            fields = json.loads(comment[len(SESSION_MARK):])
            machine, pid, started = fields["machine"], fields["pid"], fields["started"]
        except (ValueError, TypeError, KeyError):
            return None
        if not isinstance(machine, str) or type(pid) is not int or not (started is None or type(started) is int):
            return None
        return cls(machine, pid, started)

    def gone(self) -> bool:
        """Whether the session's process has ended, as far as this process can prove it: on this machine, no
        process of that pid, or a zombie, or one started at another time; a session of another machine is never
        proved gone."""
        if self.machine != _machine():
            return False
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:           # (a process of another user: it exists)
            pass
        state = _proc_stat(self.pid)
        if state is None:
            return False
        return state[0] == "Z" or (self.started is not None and state[1] != self.started)


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """The state and start time (clock ticks since boot) of process ``pid`` from ``/proc`` (Linux); None elsewhere
    or if it cannot be read."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
        fields = text[text.rindex(")") + 2:].split()      # (the command in parentheses may hold spaces)
        return fields[0], int(fields[19])
    except (OSError, ValueError, IndexError):
        return None


def _start_ticks(pid: int) -> int | None:
    state = _proc_stat(pid)
    return state[1] if state is not None else None


def _machine() -> str:
    """This machine as the process ids of its processes are meaningful on: the host name, and on Linux the boot id
    and this process's PID namespace."""
    import socket

    parts = [socket.gethostname()]
    with contextlib.suppress(OSError):
        parts.append("boot " + Path("/proc/sys/kernel/random/boot_id").read_text().strip())
    with contextlib.suppress(OSError):
        parts.append(os.readlink("/proc/self/ns/pid"))
    return " ".join(parts)


#: How long :meth:`Templates.drop_leftovers` keeps trying to drop one leftover before it leaves it for a later session.
LEFTOVER_PATIENCE_SECONDS = 5.0


class Templates:
    """The session's template databases on ``server``, one per list of application migrations, each migrated
    when first asked for (activedb's schema at head, then each directory in order) and dropped by :meth:`close`;
    and the test databases copied from them.  Every database it makes carries the session's :class:`SessionMark`
    as its comment, from which :meth:`drop_leftovers` of a later session knows it for a leftover once this
    process is gone (killed before its teardown)."""

    def __init__(self, server: Server, prefix: str = "activedb_test") -> None:
        self.server = server
        self.prefix = f"{prefix}_{os.getpid()}"
        self.mark = SessionMark.of_this_process()
        self._mutex = threading.Lock()        # protects _templates and _numbers
        self._templates: dict[tuple[Path, ...], str] = {}
        self._numbers = itertools.count(1)

    def template(self, migrations: Iterable[Path]) -> str:
        """The name of the template database migrated with ``migrations`` (made now if it is the first time)."""
        import activedb

        key = tuple(Path(directory).resolve() for directory in migrations)
        with self._mutex:
            name = self._templates.get(key)
        if name is not None:
            return name
        digest = hashlib.sha1("\n".join(map(str, key)).encode()).hexdigest()[:8]
        name = f"{self.prefix}_template_{digest}"
        url = create_database(self.server, name, comment=self.mark.comment())
        try:
            database = activedb.connect(url)
            try:
                for directory in key:
                    database.upgrade_app(directory)
            finally:
                database.close()
        except BaseException:
            drop_database(self.server, name)      # (not recorded yet: close() would never drop it)
            raise
        with self._mutex:
            self._templates[key] = name
        return name

    def database(self, migrations: Iterable[Path] = ()) -> tuple[str, str]:
        """A fresh database migrated with ``migrations``: its name and URL (drop it with :func:`drop_database`)."""
        template = self.template(migrations)
        with self._mutex:
            name = f"{self.prefix}_{next(self._numbers)}"
        return name, create_database(self.server, name, template, comment=self.mark.comment())

    def drop_leftovers(self) -> list[str]:
        """Drop the databases that sessions whose process is gone left on the server (a pytest killed before its
        teardown); their names.  Only those proved to be such: owned by this user, their comment a
        :class:`SessionMark` (no other database has one), of a session on this machine whose process has ended
        (:meth:`SessionMark.gone`) — never a database of a live session (another pytest, a pytest-xdist worker of
        this run), one of another machine, or one this kit did not make.  A leftover that cannot be dropped within
        ``LEFTOVER_PATIENCE_SECONDS`` (a session of another role inside) is left for a later session."""
        with _admin(self.server, "list the test databases on") as admin:
            rows = admin.execute(
                "SELECT datname, shobj_description(oid, 'pg_database') FROM pg_database "
                "WHERE datdba = (SELECT oid FROM pg_roles WHERE rolname = current_user) ORDER BY datname").fetchall()
        dropped: list[str] = []
        for name, comment in rows:
            mark = SessionMark.parse(comment if isinstance(comment, str) else None)
            if mark is None or mark == self.mark or not mark.gone():
                continue
            try:
                drop_database(self.server, str(name), patience=LEFTOVER_PATIENCE_SECONDS)
            except DatabaseFixtureError:
                continue
            dropped.append(str(name))
        return dropped

    def close(self) -> None:
        """Drop the templates."""
        with self._mutex:
            names, self._templates = list(self._templates.values()), {}
        for name in names:
            drop_database(self.server, name)
