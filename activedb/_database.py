"""``connect()`` and the ``Database`` handle."""

from __future__ import annotations

import contextlib
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
    options.setdefault("pool_size", 10)
    options.setdefault("max_overflow", 30)
    return sa.create_engine(url, connect_args=connect_args, **options)


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

    def __init__(self, engine: Engine, *, embedded: _embedded.EmbeddedServer | None = None,
                 **manager_options: Any):
        self.engine = engine
        self.embedded = embedded
        self._metadata = sa.MetaData()
        # Protects _metadata, _tables and _watermarks (reflection is lazy and may race).
        self._schema_mutex = threading.Lock()
        self._tables: dict[str, sa.Table] = {}
        self._watermarks: dict[str, Any] = {}   # protected by _schema_mutex
        self._closed = False
        from activedb._rules import RuleManager
        from activedb._transaction import TransactionManager

        rule_options = {name: manager_options.pop(name) for name in
                        ("max_cascade_depth", "max_deferred_cycles", "rule_execution") if name in manager_options}
        if "rule_execution" in rule_options:
            rule_options["execution"] = rule_options.pop("rule_execution")
        self.transactions = TransactionManager(self, **manager_options)
        self.rules = RuleManager(self, **rule_options)
        self.transactions.hooks = self.rules

    # --- rules and events -------------------------------------------------------------------

    def rule(self, *, on, when=None, coupling="immediate", action_coupling="immediate", priority=None,
             name: str | None = None, enabled: bool = True):
        """Decorator declaring an ECA rule on this database::

            @db.rule(on=db.updated("worker_status"), when=lambda tx, ev: ev.new["status"] == "violation",
                     coupling=Coupling.DEFERRED, priority=10)
            def alert(tx, ev): tx.insert("alerts", worker=ev.key, kind="violation", at=0.0)

        Decorating a ``Rule`` subclass registers an instance of it.  Returns the Rule.
        """
        from activedb._rules import FunctionRule, Rule

        def decorate(target):
            if isinstance(target, type) and issubclass(target, Rule):
                instance = target()
                instance.name = name or instance.name or target.__name__
                return self.rules.add(instance)
            if not callable(target):
                from activedb.errors import RuleError

                raise RuleError(f"@db.rule decorates a function (tx, event) or a Rule subclass, got {target!r}")
            return self.rules.add(FunctionRule(target, on=on, when=when, coupling=coupling,
                                               action_coupling=action_coupling, priority=priority,
                                               enabled=enabled, name=name))
        return decorate

    def inserted(self, table: str):
        return self._data_spec("inserted", table)

    def updated(self, table: str):
        return self._data_spec("updated", table)

    def deleted(self, table: str):
        return self._data_spec("deleted", table)

    def modified(self, table: str):
        """Any of inserted, updated, deleted on ``table``."""
        return self._data_spec("modified", table)

    def signalled(self, name: str):
        """Application events raised with ``tx.signal(name, **payload)``."""
        from activedb._events import EventSpec

        return EventSpec("signal", name)

    def stream(self, event_type: str):
        """Stream events of ``event_type`` (``tx.emit``; the Spark bridge)."""
        from activedb._events import EventSpec

        return EventSpec("stream", event_type)

    def began(self, name: str | None = None):
        """Top-level transactions began (only those started with ``db.transaction(name=name)``
        when ``name`` is given; detached rules run in transactions named ``rule:<rule name>``)."""
        from activedb._events import EventSpec

        return EventSpec("began", name)

    def committed(self, name: str | None = None):
        """Top-level transactions committed (only those started with ``db.transaction(name=name)``
        when ``name`` is given; detached rules run in transactions named ``rule:<rule name>``)."""
        from activedb._events import EventSpec

        return EventSpec("committed", name)

    def aborted(self, name: str | None = None):
        """Top-level transactions aborted (only those started with ``db.transaction(name=name)``
        when ``name`` is given; detached rules run in transactions named ``rule:<rule name>``)."""
        from activedb._events import EventSpec

        return EventSpec("aborted", name)

    def _data_spec(self, kind: str, table: str):
        from activedb._events import EventSpec
        from activedb.errors import RuleError

        if not isinstance(table, str):
            raise RuleError(f"db.{kind}() takes a table name, got {table!r}")
        self.table(table)   # unknown tables are rejected at declaration
        return EventSpec(kind, table)

    # --- transactions ---------------------------------------------------------------------

    @contextlib.contextmanager
    def transaction(self, *, name: str | None = None, batch: tuple[str, int] | None = None, _firing=None):
        """``with db.transaction() as tx:`` — a top-level transaction.

        Commits when the block ends normally, aborts when it raises.  ``batch=(query_id,
        batch_id)`` records the pair in the ingestion ledger in the same PostgreSQL
        transaction; a pair already recorded raises ``BatchAlreadyCommitted``.
        """
        from activedb._transaction import TxnState

        self._check_open()
        transaction = self.transactions.begin(name=name, batch=batch)
        transaction.firing = _firing
        self.transactions.hooks.on_begin(transaction)
        try:
            yield transaction
        except BaseException as error:
            if transaction.state in (TxnState.ACTIVE, TxnState.COMMITTING):
                transaction.abort(error)
            raise
        if transaction.state is TxnState.ACTIVE:
            transaction.commit()

    def run(self, function, *args: Any, retries: int = 3, **kwargs: Any) -> Any:
        """Run ``function(tx, *args, **kwargs)`` in a top-level transaction, re-running it
        (at most ``retries`` more times) on a serialization conflict or deadlock."""
        from lockmgr import Deadlock

        from activedb.errors import SerializationConflict

        for attempt in range(retries + 1):
            try:
                with self.transaction() as transaction:
                    return function(transaction, *args, **kwargs)
            except (SerializationConflict, Deadlock):
                if attempt == retries:
                    raise

    def batch_committed(self, query_id: str, batch_id: int) -> bool:
        """True if ``(query_id, batch_id)`` is in the ingestion ledger (its effects are committed)."""
        ledger = self.table("activedb_ingestion_ledger")
        with self.engine.connect() as connection:
            return connection.execute(sa.select(ledger.c.batch_id).where(
                ledger.c.query_id == query_id, ledger.c.batch_id == batch_id)).first() is not None

    def punctuate(self, source: str, watermark: Any) -> None:
        """Record a punctuation: no event of ``source`` older than ``watermark`` will come.

        The stream bridge passes Spark's event-time watermark here; stream-transaction
        schedulers read it with :meth:`watermark`.  A punctuation never moves backwards.
        """
        with self._schema_mutex:
            current = self._watermarks.get(source)
            if current is None or watermark > current:
                self._watermarks[source] = watermark

    def watermark(self, source: str) -> Any:
        """The latest punctuation of ``source`` (None before the first)."""
        with self._schema_mutex:
            return self._watermarks.get(source)

    def set_granularity(self, table: str, granularity: str) -> None:
        """Lock ``table`` per row (``"tuple"``, the default) or as a whole (``"table"``)."""
        self.transactions.set_granularity(table, granularity)

    @property
    def history(self):
        """The history recorder (``connect(record_history=True)``), or None."""
        return self.transactions.recorder

    def _check_open(self) -> None:
        if self._closed:
            from activedb.errors import TransactionError

            raise TransactionError("this Database is closed; call activedb.connect() again")

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
        manager = getattr(self, "transactions", None)
        if manager is not None:
            manager.forget_schema()

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
            self.transactions.pool.shutdown(wait=False)
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
    record_history: bool = False,
    max_workers: int = 32,
    victim_policy: Any = "requester",
    lock_timeout: float | None = None,
    max_cascade_depth: int = 16,
    max_deferred_cycles: int = 100,
    rule_execution: str = "threads",
    **engine_options: Any,
) -> Database:
    """Connect to activedb's database and bring its schema to head.

    * ``url`` (or ``ACTIVEDB_DATABASE_URL``): any PostgreSQL; ``postgresql://`` URLs
      use the psycopg 3 driver.
    * Neither: the embedded server under ``home`` (default ``ACTIVEDB_HOME``), started
      or reused; see ``activedb._embedded`` for its lifecycle.
    * ``upgrade=False`` skips ``alembic upgrade head`` (for ``activedb db`` commands).
    * ``keep_server=True`` leaves the embedded server running after the last user exits.
    * ``record_history=True`` records every transaction operation (``db.history``) for
      ``activedb.testing.check_history``; ``max_workers`` bounds the subtransaction
      threads; ``victim_policy`` is the lock manager's deadlock victim policy;
      ``lock_timeout`` (seconds) bounds every lock wait (default: wait).
    * ``max_cascade_depth`` bounds rule cascades, ``max_deferred_cycles`` deferred cycles;
      ``rule_execution="inline"`` runs equal-priority rules one after the other in the
      triggering thread instead of concurrently on worker threads.
    """
    sa_url, server = resolve_url(url, home, keep_server)
    engine = create_engine(sa_url, **engine_options)
    check_reachable(engine)
    database = Database(engine, embedded=server, record_history=record_history, max_workers=max_workers,
                        victim_policy=victim_policy, lock_timeout=lock_timeout,
                        max_cascade_depth=max_cascade_depth, max_deferred_cycles=max_deferred_cycles,
                        rule_execution=rule_execution)
    if upgrade:
        database.upgrade("head")
    return database
