"""``connect()`` and the ``Database`` handle."""

from __future__ import annotations

import dataclasses
import os
import random
import re
import time
import warnings
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Never, NoReturn, TypeVar, Unpack, overload

import sqlalchemy as sa
from sqlalchemy.engine import Engine, URL, make_url
from sqlalchemy.log import InstanceLogger

from coupling import Coupling

from activedb import lowlevel
from activedb import _embedded, _migrate
from activedb._config import Config, ConnectKeywords, EngineOptions, configured
from activedb._logfile import route_to_home_log
from activedb._url import describe_url, mask_secrets, normalise_url
from activedb.atomic import Batches
from activedb.capture import CaptureManager
from activedb.capture.errors import CaptureNotEnabledWarning
from activedb.clock import SYSTEM_CLOCK, Clock
from activedb.errors import (INSUFFICIENT_PRIVILEGE, BadArgument, BadDatabaseURL, DeadlockDetected, RuleError,
                             RuleFailed, SerializationConflict, TransactionError, causes, check_plain_function,
                             check_seconds, check_switch, check_whole_number, database_failure, libpq_timeout,
                             sqlstate_of)
from activedb.events import Event, EventKind, EventSpec, Origin, Punctuations, Watermark
from activedb.outbox import Outbox
from activedb.rules import FunctionRule, Rule, RuleManager
from activedb.store import Catalog
from activedb.txn import CommitParticipant, Observer, ReadBase, Transaction, TransactionBlock, TransactionManager

if TYPE_CHECKING:
    from activedb.explain import Explanation
    from activedb.ingest import BatchLowering
    from activedb.txn import HistoryRecorder

_Result = TypeVar("_Result")
_Observer = TypeVar("_Observer", bound=Observer)

_CLOSED = ("this Database is closed; call activedb.connect() again, and make anew on the new Database what was made on "
           "this one (a StreamEngine, a CompositionEngine given db=, …: each keeps the Database it was given)")


def create_engine(url: URL, options: EngineOptions = EngineOptions()) -> Engine:
    """The SQLAlchemy engine (a connection pool) for ``url`` as ``options`` say (``activedb.EngineOptions``); its
    pool logs under its own name, routed to activedb's log file."""
    return sa.create_engine(url, **{"pool_logging_name": "activedb", **options.keywords(url)})


def _close_entry(dbapi_connection: object, entry: sa.pool.ConnectionPoolEntry) -> None:
    entry.close()       # (its DBAPI connection: None if invalidated already; the entry is checked out again anew)


def _logger_name(pool: sa.Pool) -> str:
    """The name of ``pool``'s logger: SQLAlchemy's ``pool.logger`` is a ``logging.Logger``, or with ``echo_pool``
    an ``InstanceLogger`` that wraps one (``.logger``)."""
    logger = pool.logger
    return logger.logger.name if isinstance(logger, InstanceLogger) else logger.name


#: libpq's refusal of a URL option's value: 'invalid sslmode value: "bogus"' (also target_session_attrs, ...).
_BAD_OPTION_VALUE = re.compile(r'invalid \w+ value: "')


def check_reachable(engine: Engine, connect_timeout: float | None = None) -> None:
    """Connect once: a URL the driver refuses is a :class:`BadDatabaseURL`, every other failure the
    documented error of :func:`activedb.errors.database_failure` (unavailable with what to do about its cause,
    refused, disk full).  ``connect_timeout``: the seconds libpq waits, named in the advice if nothing answered."""
    try:
        with engine.connect() as connection:
            connection.execute(sa.text("SELECT 1"))
    except (sa.exc.ProgrammingError, sa.exc.ArgumentError, sa.exc.OperationalError) as error:
        reason = mask_secrets(str(getattr(error, "orig", None) or error).strip().splitlines()[0])
        # libpq refuses an option's value (?sslmode=bogus) as an OperationalError, before contacting a server;
        # every other OperationalError is the server's (unreachable, refused, ...).
        if isinstance(error, sa.exc.OperationalError) and _BAD_OPTION_VALUE.search(reason) is None:
            raise database_failure(error, "connecting", describe_url(engine.url),
                                   server_log=_embedded.log_of_url(engine.url),
                                   connect_timeout=connect_timeout) from None
        raise BadDatabaseURL(
            f"the database URL {describe_url(engine.url)} cannot be used: {reason}. Fix the URL (connect(url), "
            f"ACTIVEDB_DATABASE_URL or the command line's --url): options go in ?name=value and must be libpq's "
            f"(https://www.postgresql.org/docs/current/libpq-connect.html#LIBPQ-PARAMKEYWORDS)") from None
    except sa.exc.DBAPIError as error:
        raise database_failure(error, "connecting", describe_url(engine.url),
                               server_log=_embedded.log_of_url(engine.url), connect_timeout=connect_timeout) from None


def _kind(kind: EventKind, allowed: tuple[EventKind, ...], call: str) -> EventKind:
    parsed = next((member for member in allowed if member == kind), None)   # a str Enum: "committed" matches
    if parsed is None:
        raise RuleError(f"{call}: the kind is one of {', '.join(member.value for member in allowed)}")
    return parsed


def _event_name(name: str | None, call: str) -> str | None:
    """``name`` if it is None (any) or a non-empty text; else a RuleError (a spec no event would ever match)."""
    if name is not None and (not isinstance(name, str) or not name):
        raise RuleError(f"{call} takes a name (a non-empty text, or None for any): no event is named by {name!r}")
    return name


def _data_spec(catalog: Catalog, kind: EventKind, table: str, call: str | None = None) -> EventSpec:
    """The spec of ``kind`` on ``table``; ``call`` names the method in errors (default ``db.<kind>``)."""
    if not isinstance(table, str):
        raise RuleError(f"{call or f'db.{kind.value}'}() takes a table name, got {table!r}")
    catalog.table(table)   # unknown tables are rejected at declaration
    return EventSpec(kind, table)


def _retried(error: BaseException | None) -> bool:
    """The aborts ``Database.run`` answers with another attempt."""
    return isinstance(error, (SerializationConflict, DeadlockDetected))


class Database:
    """A connected activedb database.

    Thread-safe: one ``Database`` is shared by every thread of a process.  It wires together the
    SQLAlchemy engine (a connection pool), the :class:`~activedb.store.Catalog` of reflected tables, the
    :class:`~activedb.txn.TransactionManager` (``db.transactions``) and the
    :class:`~activedb.rules.RuleManager` (``db.rules``); it holds no state of its own beyond that.
    """

    def __init__(self, engine: Engine, config: Config | None = None, *,
                 embedded: _embedded.EmbeddedServer | None = None):
        config = config if config is not None else Config()
        self.engine = engine
        #: How this database was set up (``activedb.Config``, frozen; ``connect()``'s keywords are in it).
        self.config = config
        #: The clock of system time (``activedb.clock``): what rules read as "now", composite engines' timeouts,
        #: the outbox's recovery passes, an ingestion's deadlines.  ``ManualClock`` in tests.
        self.clock: Clock = config.clock if config.clock is not None else SYSTEM_CLOCK
        self.embedded = embedded
        self._closed = False
        # Hot keys: per function run by ``run``, the tables whose plain reads it learned to make for update.
        self._update_intent: dict[object, frozenset[str]] = {}
        self.catalog = Catalog(engine, self.describe)
        self.transactions = TransactionManager(
            self.catalog, max_workers=config.max_workers, victim_policy=config.victim_policy,
            flush_retries=config.flush_retries, record_history=config.record_history, lock_timeout=config.lock_timeout,
            snapshot_on_deadlock=config.explain_deadlocks)
        #: Reflected tables, per-table lock granularity, migrations (``activedb._migrate.Schema``).
        self.schema = _migrate.Schema(engine, self.catalog, self.transactions.locking)
        self.rules = RuleManager(self.catalog, self.transactions, max_cascade_depth=config.max_cascade_depth,
                                 max_deferred_cycles=config.max_deferred_cycles, execution=config.rule_execution)
        #: Detached-family firings, recorded durably and run exactly once (``activedb/outbox/README.md``).
        self.outbox = Outbox(self.catalog, self.transactions, self.rules, config.outbox, clock=self.clock)
        self.punctuations = Punctuations()
        if config.explain_deadlocks:
            from activedb.explain import DeadlockExplainer

            self.observe(DeadlockExplainer(self))
        #: Change capture (``db.capture("orders")``, consumers, status): see ``activedb/capture/README.md``.
        self.capture = CaptureManager(self)
        #: Atomic batches (lineage, scover, compensation): see ``activedb/atomic/README.md``.
        self.batches = Batches(self)

    # --- rules and events -------------------------------------------------------------------

    @overload
    def rule(self, *, on: EventSpec, when: Callable[[Transaction, Event], bool] | None = None,
             coupling: Coupling = Coupling.IMMEDIATE, action_coupling: Coupling = Coupling.IMMEDIATE,
             priority: float | None = None, name: str | None = None, enabled: bool = True, replace: bool = False
             ) -> Callable[[Callable[[Transaction, Event], object] | type[Rule]], Rule]: ...

    @overload
    def rule(self, misplaced: Never, /) -> NoReturn: ...     # (``@db.rule`` without its call: refused, also by mypy)

    def rule(self, *misplaced: object, on: EventSpec | None = None,
             when: Callable[[Transaction, Event], bool] | None = None,
             coupling: Coupling = Coupling.IMMEDIATE, action_coupling: Coupling = Coupling.IMMEDIATE,
             priority: float | None = None, name: str | None = None, enabled: bool = True, replace: bool = False
             ) -> Callable[[Callable[[Transaction, Event], object] | type[Rule]], Rule]:
        """Decorator declaring an ECA rule on this database::

            @db.rule(on=db.updated("worker_status"), when=lambda tx, ev: ev.new["status"] == "violation",
                     coupling=Coupling.DEFERRED, priority=10)
            def alert(tx, ev): tx.insert("alerts", worker=ev.key, kind="violation", at=0.0)

        Decorating a ``Rule`` subclass registers an instance of it, with the decorator's settings (the class's own
        where the decorator leaves its default).  Returns the Rule.  ``coupling`` and
        ``action_coupling`` are :class:`~activedb.Coupling` members (their values' strings, ``"deferred"``, are
        accepted too).  ``priority`` orders the immediate rules one event fires (and a deferred cycle's): higher
        first, those of equal priority concurrently (no order among them promised), None after every number.  A
        second rule of one name is
        refused unless ``replace=True`` (it then takes the first one's place, as ``db.rules.add(rule, replace=True)``
        does: a module or notebook cell run again).  The action and
        ``when`` are plain functions called with ``(tx, event)`` in the firing's thread: an ``async def`` or a generator
        function (whose call runs none of its body) is refused, and a firing whose action or ``when`` returns a
        coroutine or a generator (a plain function handing one back) fails with ``RuleFailed``.  ``on`` is required
        (over a ``Rule`` subclass, its own may stand in): ``@db.rule`` without its call, or without ``on``, raises
        ``RuleError`` saying how to write it.
        """
        if misplaced:       # (``@db.rule`` over a function or class: Python passed it here, and ``on`` is missing)
            target = misplaced[0]
            named = getattr(target, "__name__", None)
            kind = "class" if isinstance(target, type) else "def"
            shown = f"{kind} {named}" if isinstance(named, str) else repr(target)
            raise RuleError(f"@db.rule is called with the event: write @db.rule(on=db.stream('name')) (or "
                            f"db.inserted('table'), ...) above {shown}, not @db.rule alone")
        check_switch("db.rule", "replace", replace, error=RuleError)     # ("false" is true: it would replace)
        check_switch("db.rule", "enabled", enabled, error=RuleError)     # (1 == True: no flag PostgreSQL stores as such)

        def decorate(target: Callable[[Transaction, Event], object] | type[Rule]) -> Rule:
            if isinstance(target, type) and issubclass(target, Rule):
                instance = target()
                instance.name = name if name is not None else (instance.name or target.__name__)   # (given: as given)
                # The decorator's settings apply to the instance, as to a function's rule; the class's own stand
                # where the decorator leaves its default.
                if on is not None:
                    instance.on = on
                if when is not None:
                    setattr(instance, "condition", when)        # (an instance attribute: called as when(tx, event))
                if coupling is not Coupling.IMMEDIATE:
                    instance.coupling = coupling
                if action_coupling is not Coupling.IMMEDIATE:
                    instance.action_coupling = action_coupling
                if priority is not None:
                    instance.priority = priority
                if enabled is not True:
                    instance.enabled = enabled
                return self.rules.add(instance, replace=replace)
            if not callable(target):
                raise RuleError(f"@db.rule decorates a function (tx, event) or a Rule subclass, got {target!r}")
            if on is None:      # (a Rule subclass may have its own ``on``; a function has none)
                raise RuleError(f"rule {name or getattr(target, '__name__', target)!r}: db.rule() needs on=, the event "
                                f"the rule reacts to: write @db.rule(on=db.stream('name')) (or db.inserted('table'), "
                                f"db.updated('table'), ...)")
            return self.rules.add(FunctionRule(target, on=on, when=when, coupling=coupling,
                                               action_coupling=action_coupling, priority=priority,
                                               enabled=enabled, name=name), replace=replace)
        return decorate

    def inserted(self, table: str) -> EventSpec:
        return _data_spec(self.catalog, EventKind.INSERTED, table)

    def updated(self, table: str) -> EventSpec:
        return _data_spec(self.catalog, EventKind.UPDATED, table)

    def deleted(self, table: str) -> EventSpec:
        return _data_spec(self.catalog, EventKind.DELETED, table)

    def modified(self, table: str) -> EventSpec:
        """Any of inserted, updated, deleted on ``table``."""
        return _data_spec(self.catalog, EventKind.MODIFIED, table)

    def captured(self, table: str, kind: EventKind = EventKind.MODIFIED) -> EventSpec:
        """Committed changes to ``table`` made by **other PostgreSQL clients** (``kind``: inserted,
        updated, deleted or modified), heard through change capture (``db.capture(table)``) after the
        writer committed — so only the detached family of couplings applies.  activedb's own writes are
        not among them: they raise ``db.inserted(table)`` etc. in-process.  Warns
        (:class:`~activedb.capture.CaptureNotEnabledWarning`) if ``table`` is not captured; a view or a materialized
        view, which cannot be, is refused (:class:`~activedb.capture.CaptureError`: capture the tables it reads)."""
        parsed = _kind(kind, (EventKind.INSERTED, EventKind.UPDATED, EventKind.DELETED, EventKind.MODIFIED),
                       f"db.captured({table!r}, {kind!r})")
        spec = _data_spec(self.catalog, parsed, table, "db.captured")
        if not self.capture.is_captured(table):
            self.capture.check_capturable(table)       # (a view's refusal says what works: not the warning's advice)
            warnings.warn(f"table {table!r} is not captured: rules on db.captured({table!r}) fire once capture is "
                          f"enabled — db.capture({table!r}), or enable_capture(op, {table!r}) in a migration",
                          CaptureNotEnabledWarning, stacklevel=2)
        return EventSpec(spec.kind, spec.source, Origin.EXTERNAL)

    def signalled(self, name: str) -> EventSpec:
        """Application events raised with ``tx.signal(name, **payload)``."""
        return EventSpec(EventKind.SIGNAL, _event_name(name, f"db.signalled({name!r})"))

    def stream(self, event_type: str) -> EventSpec:
        """Stream events of ``event_type`` (``tx.emit``; the Spark bridge)."""
        return EventSpec(EventKind.STREAM, _event_name(event_type, f"db.stream({event_type!r})"))

    def transaction_event(self, kind: EventKind, name: str | None = None) -> EventSpec:
        """Top-level transactions that ``kind`` (``"began"``, ``"committed"`` or ``"aborted"``): only those
        started with ``db.transaction(name=name)`` when ``name`` is given; detached rules run in
        transactions named ``rule:<rule name>``."""
        return EventSpec(_kind(kind, (EventKind.BEGAN, EventKind.COMMITTED, EventKind.ABORTED),
                               f"db.transaction_event({kind!r})"),
                         _event_name(name, f"db.transaction_event({kind!r}, {name!r})"))

    @property
    def rule_lowering(self) -> BatchLowering:
        """How the ingestion core's rule path runs a micro-batch of stream events as one batch of state
        transactions when that is the same as firing their rules one by one — declared rules, and plain rules
        that only read and write their event's row (``activedb/batch/README.md``, "Plain rules lowered")."""
        from activedb.batch import RULE_LOWERING

        return RULE_LOWERING

    def observe(self, observer: _Observer) -> _Observer:
        """Add a passive :class:`~activedb.txn.Observer` of transaction and rule life cycles; returns it
        (``db.transactions.observers.remove(observer)`` removes it)."""
        self.transactions.observers.add(observer)
        return observer

    # --- transactions ---------------------------------------------------------------------

    def transaction(self, *, name: str | None = None, participants: Iterable[CommitParticipant] = (),
                    read_base: ReadBase | None = None) -> AbstractContextManager[Transaction]:
        """``with db.transaction() as tx:`` — a top-level transaction.

        Commits when the block ends normally, aborts when it raises.  ``participants`` take part in its
        commit (see :class:`~activedb.txn.CommitParticipant`: e.g. the Spark bridge's ingestion ledger,
        written in the same PostgreSQL transaction as the effects).  ``read_base`` replaces what the
        tree's reads see underneath its write sets (default: PostgreSQL's committed rows).
        """
        if self._closed:
            raise TransactionError(_CLOSED)
        if name is not None and not isinstance(name, str):
            raise BadArgument(f"db.transaction(name={name!r}) takes a text (or None for no name), got a "
                              f"{type(name).__name__}")
        return TransactionBlock(self.transactions.transaction(name=name, participants=participants,
                                                              read_base=read_base))

    def run(self, function: Callable[..., _Result], *args: object, retries: int = 3,  # type: ignore[return]
            backoff: float = 0.002, **kwargs: object) -> _Result:
        """Run ``function(tx, *args, **kwargs)`` — a plain function: an ``async def`` or a generator function, whose
        call runs none of its body, is refused (``BadArgument``) — in a top-level transaction, re-running it (at most
        ``retries`` more times) on a serialization conflict or a deadlock (also one of the rule firings it set off,
        which reaches it as ``RuleFailed``), after a jittered exponential
        back-off starting at ``backoff`` seconds (so that the transactions that collided do not collide
        again in lock step).  An attempt that is re-run is not an outcome for the rules: the detached and
        exclusive causally dependent firings of an aborted attempt are dropped (the attempt that commits
        fires its own; see :meth:`activedb.outbox.Outbox.mark_replayed`).

        Hot keys: when an attempt that read rows and then wrote them fails this way, the tables of those
        rows are learned for ``function`` (per function, in this ``Database``): from then on its plain
        ``tx.read`` of them reads for update (``for_update=True``), so that two runs queue at the read
        instead of colliding when both convert their read locks to write locks."""
        if self._closed:
            raise TransactionError(_CLOSED)
        # (retries below 0 would run no attempt and return None; a negative backoff fails time.sleep at a retry)
        check_whole_number("db.run", "retries", retries, 0,
                           " (how many times to run the function again after the first attempt)")
        check_seconds("db.run", "backoff", backoff, none=None)
        check_plain_function("db.run", function)      # (an async def: each attempt would commit without its work)
        site = getattr(function, "__code__", function)
        learned = self._update_intent.get(site, frozenset())
        for attempt in range(retries + 1):
            attempted = None
            try:
                with self.transactions.transaction(update_intent=learned) as transaction:
                    attempted = transaction
                    if attempt < retries:
                        # An attempt this loop re-runs leaves nothing behind, detached firings included.
                        self.outbox.mark_replayed(transaction, when=_retried)
                    return function(transaction, *args, **kwargs)
            except (SerializationConflict, DeadlockDetected, RuleFailed) as error:
                # A rule firing's conflict or deadlock reaches here as RuleFailed (its cause): the transaction's own.
                if not any(isinstance(cause, (SerializationConflict, DeadlockDetected)) for cause in causes(error)):
                    raise
                if attempted is not None and not lowlevel.read_then_written(attempted) <= learned:
                    learned = learned | lowlevel.read_then_written(attempted)
                    if len(self._update_intent) >= 4096:     # bounded: functions made on the fly
                        self._update_intent.clear()
                    self._update_intent[site] = learned
                if attempt == retries:
                    raise
                # Jittered back-off between retries (not used to order threads).
                time.sleep(random.uniform(0.5, 1.5) * min(0.5, backoff * 2 ** attempt))

    def punctuate(self, source: str, watermark: Watermark) -> None:
        """Record a punctuation: no event of ``source`` older than ``watermark`` will come.

        The stream bridge passes Spark's event-time watermark here; stream-transaction
        schedulers read it with :meth:`watermark`.  A stream engine (``activedb.streams``) takes ``source`` as its stream
        ``source`` names ignoring case, as an event's ``stream=``: ``db.punctuate("Badges", t)`` punctuates stream
        ``badges`` (``db.punctuations.marks()`` has every source as spelled).  A punctuation never moves backwards.  A watermark that is no
        finite number of seconds or aware datetime, or not of the kind of the source's earlier ones, raises
        :class:`~activedb.errors.InvalidTime`.
        """
        self.punctuations.punctuate(source, watermark)

    def watermark(self, source: str) -> Watermark | None:
        """The latest punctuation of ``source`` (None before the first)."""
        return self.punctuations.watermark(source)

    @property
    def history(self) -> HistoryRecorder | None:
        """The history recorder (``connect(record_history=True)``), or None."""
        return self.transactions.recorder

    # --- schema ---------------------------------------------------------------------------

    @property
    def url(self) -> URL:
        return self.engine.url

    def describe(self) -> str:
        return describe_url(self.engine.url)

    def table(self, name: str | sa.Table) -> sa.Table:
        """The reflected ``Table`` called ``name``; tables come from migrations."""
        return self.catalog.table(name)

    def upgrade_app(self, script_location: str | Path, revision: str = "head", *,
                    lock_timeout: float | None = _migrate.LOCK_TIMEOUT_SECONDS) -> None:
        """Run the application's own Alembic migrations on this database (``db.schema`` has the rest;
        ``lock_timeout``: seconds a statement waits for a table's lock before the run stops, nothing changed —
        ``db.schema.upgrade``)."""
        self.schema.upgrade_app(script_location, revision, lock_timeout=lock_timeout)

    # --- what is going on -------------------------------------------------------------------

    def explain(self, *, deadlock: BaseException | None = None) -> Explanation:
        """A consistent picture of this process's live transaction trees and the lock manager's wait-for
        graph (see :mod:`activedb.explain`): ``.graph`` (networkx), ``.render(path)`` (PNG/SVG), ``.text()``,
        ``.save(path)`` (JSON).  With ``deadlock=`` (a ``DeadlockDetected``, or an error caused by one) its
        cycle is marked, and the lock table is the one the deadlock carries when the database was connected
        with ``explain_deadlocks=True`` (taken when the cycle was found), else the current one."""
        from activedb import explain as explain_module

        return explain_module.explain(self, deadlock=deadlock)

    # --- lifecycle ------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the worker pool and close the connection pool.  The outbox's running group transactions are waited
        for first, up to 10 seconds (``activedb/outbox/README.md``, "Closing"); a connection given back later (by a
        group not waited for) is closed then, not kept.  A top-level transaction still open (in this thread or
        another) is not aborted: it may still commit, its deferred rules run, and its detached firings are recorded
        in the outbox for a later process that declares their rules (``activedb outbox`` lists them) — end
        transactions before closing.
        The embedded server stops when the last process using it exits (unless kept running)."""
        if not self._closed:
            self._closed = True
            self.capture.close()
            self.outbox.close()
            self.transactions.pool.shutdown(wait=False)
            self.transactions.server_waits.close()
            self.catalog.idle.close()
            # A thread still running (a detached rule that closed its own database, an outbox group not waited for)
            # gives its connection back to a disposed pool, which would keep it open until collected: closed instead
            # (listened before the dispose: the pool it makes takes the listener).
            sa.event.listen(self.engine.pool, "checkin", _close_entry)
            self.engine.dispose()

    def __enter__(self) -> "Database":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        kind = "embedded" if self.embedded else "external"
        return f"<activedb.Database {kind} {mask_secrets(self.engine.url.render_as_string(hide_password=True))}>"


def connect(url: str | URL | None = None, config: Config | None = None,
            **keywords: Unpack[ConnectKeywords]) -> Database:
    """Connect to activedb's database and bring its schema to head.

    * ``url`` (or ``ACTIVEDB_DATABASE_URL``): any PostgreSQL; ``postgresql://`` URLs use the psycopg 3 driver.
      Neither: the embedded server under ``config.home`` (default ``ACTIVEDB_HOME``), started or reused; see
      ``activedb._embedded`` for its lifecycle.
    * ``config``: an :class:`activedb.Config` (frozen; its docstring describes every field: the schema upgrade, the
      history recorder, workers, the deadlock victim policy, lock timeouts, rule cascades and execution, deadlock
      pictures, the clock, the outbox's ``OutboxOptions`` and the connection pool's ``EngineOptions``).
    * ``keywords``: the shorthand — each a field of ``Config``, replacing the default's (or ``config``'s):
      ``connect(url, rule_execution=RuleExecution.INLINE, lock_timeout=5)``; also ``outbox_options`` (a dict of
      ``OutboxOptions`` fields) and the pool's ``pool_size``, ``max_overflow``, ``pool_use_lifo`` and
      ``connect_timeout``.  An unknown keyword is a ``TypeError`` naming the ones there are, before anything is
      opened.

    The outbox starts with the connection (schema at head): recorded firings this database holds for rules
    registered later — left by a process that died — are claimed and run as soon as those rules are registered.

    With ``upgrade=False`` activedb's own schema is read once, not changed: a schema behind this activedb's head
    (an older revision, or downgraded to base) or at a revision it does not know is
    :class:`~activedb.errors.SchemaNotAtHead` saying where it is, what this activedb needs and what to run (``activedb
    db upgrade``); a database that never had activedb's tables is opened as it is.  activedb's tables without their
    version table (dropped by hand, left out of a restore) are refused with and without ``upgrade``, saying how to
    record the revision they are at (Alembic's ``stamp``): an upgrade would create them again.  (The commands, which manage
    the schema and apply their own rule to it, open a database with :func:`connect_as_is`.)
    """
    return _connected(url, configured(config, keywords), check_schema=True)


def connect_as_is(url: str | URL | None = None, config: Config | None = None,
                  **keywords: Unpack[ConnectKeywords]) -> Database:
    """:func:`connect` that neither upgrades activedb's own schema nor checks it, whatever ``upgrade`` says: the
    command line's way (``activedb.cli.open_database``: ``activedb db upgrade`` / ``downgrade`` / ``current`` take a
    schema at any revision, the other commands refuse one behind in their own words).  Internal: a program connects
    with :func:`connect`."""
    config = configured(config, keywords)
    return _connected(url, dataclasses.replace(config, upgrade=False), check_schema=False)


def _connected(url: str | URL | None, config: Config, *, check_schema: bool) -> Database:
    """:func:`connect` with ``config`` (its keywords applied); ``check_schema=False``: a schema ``config.upgrade``
    leaves alone is not checked either (:func:`connect_as_is`)."""
    if url is None:
        url = os.environ.get("ACTIVEDB_DATABASE_URL") or None       # neither: the embedded server
    home = config.home
    server = None if url is not None else _embedded.start(home, keep_running=config.keep_server)
    engine = create_engine(normalise_url(url) if url is not None else make_url(_server_url(server)), config.engine)
    route_to_home_log(server.data_directory.parent if server is not None else
                      home.expanduser() if home else _embedded.default_home(),
                      _logger_name(engine.pool))
    try:
        # (the timeout libpq was given: a connect_args' over the URL's, as SQLAlchemy passes them)
        connect_args = config.engine.keywords(engine.url)["connect_args"]
        assert isinstance(connect_args, dict)
        given = connect_args.get("connect_timeout", engine.url.query.get("connect_timeout"))
        check_reachable(engine, libpq_timeout(given))
        database = Database(engine, config, embedded=server)
    except BaseException:
        engine.dispose()
        raise
    try:
        if config.upgrade:
            database.schema.upgrade("head")
            database.outbox.start()
        elif check_schema:
            try:
                state, revision = database.schema.state()
            except sa.exc.ProgrammingError as error:
                if sqlstate_of(error) != INSUFFICIENT_PRIVILEGE:
                    raise
                # A role not granted the version table (one given only its own tables' rights) cannot tell where
                # activedb's schema is: opened as it is, as before the check (what it may not read it cannot use).
                state, revision = _migrate.SchemaState.AT_HEAD, None
            if state in (_migrate.SchemaState.BEHIND, _migrate.SchemaState.UNKNOWN,
                         _migrate.SchemaState.UNRECORDED):
                raise _migrate.not_at_head(state, revision, database.describe(),
                                  " (or connect without upgrade=False: connect() upgrades it)")
    except BaseException:
        database.close()            # (its pooled connections and threads: a caller retrying would pile them up)
        raise
    return database


def _server_url(server: _embedded.EmbeddedServer | None) -> str:
    """The embedded server's URL (started exactly when no URL was given)."""
    assert server is not None
    return server.url()
