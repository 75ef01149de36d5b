"""``connect()`` and the ``Database`` handle."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine, URL, make_url

from activedb import _embedded, _migrate
from activedb.errors import DatabaseUnavailable, UnknownTable

CONNECT_TIMEOUT_SECONDS = 5


def normalise_url(url: str | URL) -> URL:
    """Accept ``postgresql://`` / ``postgres://`` URLs and use the psycopg 3 driver."""
    try:
        parsed = make_url(url)
    except Exception as error:
        raise DatabaseUnavailable(f"not a database URL: {url!r} ({error}); expected postgresql://user:password@host:port/database") from error
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    if not parsed.drivername.startswith("postgresql"):
        raise DatabaseUnavailable(
            f"activedb needs PostgreSQL, got a {parsed.drivername!r} URL ({describe_url(parsed)})"
        )
    return parsed


def describe_url(url: URL) -> str:
    """Host, port and database with the password masked, for error messages."""
    host = url.host or url.query.get("host") or "localhost"
    port = f":{url.port}" if url.port else ""
    return f"host {host}{port}, database {url.database!r} ({url.render_as_string(hide_password=True)})"


def create_engine(url: URL, **options: Any) -> Engine:
    connect_args = {"connect_timeout": CONNECT_TIMEOUT_SECONDS}
    connect_args.update(options.pop("connect_args", {}))
    return sa.create_engine(url, connect_args=connect_args, pool_pre_ping=True, **options)


def check_reachable(engine: Engine) -> None:
    try:
        with engine.connect() as connection:
            connection.execute(sa.text("SELECT 1"))
    except sa.exc.OperationalError as error:
        reason = str(error.orig).strip().splitlines()[0] if error.orig else str(error).splitlines()[0]
        raise DatabaseUnavailable(
            f"cannot connect to PostgreSQL at {describe_url(engine.url)}: {reason}. "
            f"Check the URL (connect(url) or ACTIVEDB_DATABASE_URL) and that the server is running."
        ) from None


class Database:
    """A connected activedb database.

    Thread-safe: one ``Database`` is shared by every thread of a process.  It owns
    the SQLAlchemy engine (a connection pool), the reflected tables, the lock
    manager and the rule registry.
    """

    def __init__(self, engine: Engine, *, embedded: _embedded.EmbeddedServer | None = None):
        self.engine = engine
        self.embedded = embedded
        self._metadata = sa.MetaData()
        # Protects _metadata and _tables (reflection is lazy and may race).
        self._schema_mutex = threading.Lock()
        self._tables: dict[str, sa.Table] = {}
        self._closed = False
        self._init_engine_parts()

    def _init_engine_parts(self) -> None:
        """Hook for the transaction manager and rule registry (set up in subclasses/mixins)."""

    # --- schema ---------------------------------------------------------------------------

    @property
    def url(self) -> URL:
        return self.engine.url

    def describe(self) -> str:
        return describe_url(self.engine.url)

    def table(self, name: str | sa.Table) -> sa.Table:
        """The reflected ``Table`` called ``name``; tables come from migrations."""
        if isinstance(name, sa.Table):
            name = name.name
        table = self._tables.get(name)
        if table is not None:
            return table
        with self._schema_mutex:
            table = self._tables.get(name)
            if table is None:
                try:
                    table = sa.Table(name, self._metadata, autoload_with=self.engine)
                except sa.exc.NoSuchTableError:
                    raise UnknownTable(
                        f"no table {name!r} in {self.describe()}; tables are created by Alembic migrations "
                        f"(activedb.upgrade_app(db, 'path/to/migrations') for your own)"
                    ) from None
                self._tables[name] = table
        return table

    def refresh_schema(self) -> None:
        """Forget reflected tables (after running migrations in the same process)."""
        with self._schema_mutex:
            self._metadata = sa.MetaData()
            self._tables = {}

    # --- migrations -----------------------------------------------------------------------

    def upgrade(self, revision: str = "head") -> None:
        _migrate.upgrade(self.engine, revision)
        self.refresh_schema()

    def downgrade(self, revision: str) -> None:
        _migrate.downgrade(self.engine, revision)
        self.refresh_schema()

    def current_revision(self) -> str | None:
        return _migrate.current(self.engine)

    def upgrade_app(self, script_location: str | Path, revision: str = "head") -> None:
        """Run the application's own Alembic migrations on this database."""
        _migrate.upgrade_app(self.engine, script_location, revision)
        self.refresh_schema()

    def downgrade_app(self, script_location: str | Path, revision: str) -> None:
        _migrate.downgrade_app(self.engine, script_location, revision)
        self.refresh_schema()

    # --- lifecycle ------------------------------------------------------------------------

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.engine.dispose()

    def __enter__(self) -> "Database":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        kind = "embedded" if self.embedded else "external"
        return f"<activedb.Database {kind} {self.engine.url.render_as_string(hide_password=True)}>"


def resolve_url(url: str | URL | None, home: str | Path | None, keep_server: bool | None):
    """Return ``(sqlalchemy URL, embedded server or None)`` following the documented order."""
    if url is None:
        url = os.environ.get("ACTIVEDB_DATABASE_URL") or None
    if url is not None:
        return normalise_url(url), None
    server = _embedded.start(Path(home) if home else None, keep_running=keep_server)
    return make_url(server.url()), server


def connect(
    url: str | URL | None = None,
    *,
    home: str | Path | None = None,
    upgrade: bool = True,
    keep_server: bool | None = None,
    **engine_options: Any,
) -> Database:
    """Connect to activedb's database and bring its schema to head.

    * ``url`` (or ``ACTIVEDB_DATABASE_URL``): any PostgreSQL; ``postgresql://`` URLs
      use the psycopg 3 driver.
    * Neither: the embedded server under ``home`` (default ``ACTIVEDB_HOME``), started
      or reused; see ``activedb._embedded`` for its lifecycle.
    * ``upgrade=False`` skips ``alembic upgrade head`` (for ``activedb db`` commands).
    * ``keep_server=True`` leaves the embedded server running after the last user exits.
    """
    sa_url, server = resolve_url(url, home, keep_server)
    engine = create_engine(sa_url, **engine_options)
    check_reachable(engine)
    database = Database(engine, embedded=server)
    if upgrade:
        database.upgrade("head")
    return database
