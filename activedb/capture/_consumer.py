"""The capture consumer: captured changes become events for the rules on ``db.captured(...)``, exactly
once and in PostgreSQL's commit order.  Design note: ``README.md`` in this package.

One **batch** is one top-level activedb transaction (named ``capture:<consumer>``):

1. from the consumer's position ``(commit position, change id)`` — read from PostgreSQL when it starts
   leading, then kept — read where the next ``batch_size`` changes end, and each table's changes up to
   there, in commit order, then statement order; their old and new rows come back typed (PostgreSQL
   turns the captured ``jsonb`` into the table's row type);
2. for each change, in that order, run every enabled rule on ``db.captured(table, kind)`` that matches,
   in priority groups (higher first; equal priorities one after the other, in declaration order), each
   firing as a subtransaction — or, when that cannot be told apart, a chunk of firings in one (re-run
   one per subtransaction if any raises): a failing rule aborts only its own work (it is logged,
   counted and kept as a dead letter); a firing that was a deadlock victim or met a serialization
   conflict is re-run;
3. the commit participant :class:`_PositionWriter` advances the position with one compare-and-set
   ``UPDATE`` from where the batch started (no row: :class:`CaptureConflict`, another process took over
   and nothing of this batch is kept) — in the same PostgreSQL transaction as the rules' effects.

So a crash anywhere before PostgreSQL's COMMIT leaves the position and the effects as they were (the
batch runs again), and after it both moved (the batch is never run again): no reaction lost, none
repeated.  Only one consumer of a name works at a time: it holds the session advisory lock
``leadership_lock`` on its listener connection (others wait in ``STANDBY`` and take over when that
session ends, e.g. when the process is killed); the compare-and-set in step 3 makes two leaders (a lock
lost with its connection while the batch ran) harmless.

Thread-safety: a consumer runs batches one at a time (``_run_mutex``); ``start()`` runs them on its own
thread, and ``run_once()`` is then refused.  ``_mutex`` protects the counters, the state and the fetch
numbers (``_progress`` is its condition).  Neither is held while calling the hook ``on_step``; SQL and
rules run under ``_run_mutex`` only.  Order: ``_run_mutex`` before ``_mutex``.
"""

from __future__ import annotations

import datetime as dt
import enum
import logging
import random
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import sqlalchemy as sa

from coupling import Coupling, priority_groups
from lockmgr import Deadlock

from activedb import deadletters
from activedb.capture import _sql
from activedb.capture.errors import CaptureConflict, CaptureError, CaptureNotInstalled, ConsumerStopped
from activedb.errors import (
    DatabaseError,
    DatabaseUnavailable,
    SerializationConflict,
    TransactionAborted,
    UnknownTable,
)
from activedb.events import Event, EventKind, Origin
from activedb.rules import Fired, Firing, FiringOutcome, Rule
from activedb.txn import CommitParticipant

if TYPE_CHECKING:  # pragma: no cover
    import psycopg

    from activedb._handle import DatabaseHandle as Database
    from activedb.txn import Transaction

logger = logging.getLogger("activedb.capture")

_KINDS = {"I": EventKind.INSERTED, "U": EventKind.UPDATED, "D": EventKind.DELETED}
#: A firing that is a deadlock victim or meets a serialization conflict runs again this often in its
#: batch; then the whole batch is retried.
FIRING_ATTEMPTS = 3
#: Firings run together in one subtransaction (when that cannot be told apart from one each).
CHUNK_FIRINGS = 100
#: How many commits one pruning round removes at most.
PRUNE_LIMIT = 1000
_TRANSIENT = (Deadlock, SerializationConflict)


class ConsumerState(enum.Enum):
    """``NEW`` → (``STANDBY`` ⇄ ``LEADING``) → ``STOPPED``.  ``STANDBY``: another consumer of the same
    name leads (or the listener connection is down); ``LEADING``: this one holds the name's lock."""

    NEW = "new"
    STANDBY = "standby"
    LEADING = "leading"
    STOPPED = "stopped"


class Step(enum.Enum):
    """The points of a batch that ``on_step(step, detail)`` hears of (monitoring; tests kill there)."""

    LEADING = "leading"        # became the leader of its name (detail: 0)
    FETCHED = "fetched"        # a batch was read (detail: changes)
    FIRED = "fired"            # its rules ran; the flush is next (detail: firings)
    WRITING = "writing"        # inside the flush, before the position row is checked and advanced
    WRITTEN = "written"        # everything written, PostgreSQL's COMMIT is next
    COMMITTED = "committed"    # the batch committed (detail: changes)
    PRUNED = "pruned"          # consumed changes were pruned (detail: commits removed)
    IDLE = "idle"              # caught up: waiting for a notification


@dataclass(frozen=True, order=True)
class Position:
    """Where a consumer is: every change up to and including ``change_id`` of the commit at ``commit``
    is handled (and every change of an earlier commit).  ``(0, 0)``: nothing yet."""

    commit: int = 0
    change_id: int = 0


@dataclass(frozen=True)
class CapturedChange:
    """One captured change, as read from the change table (the rows come separately, typed)."""

    position: int
    change_id: int
    xid: int
    table: str
    operation: str
    committed_at: dt.datetime

    @property
    def at(self) -> Position:
        return Position(self.position, self.change_id)

    def describe(self) -> str:
        return (f"captured {_KINDS[self.operation].value} on {self.table!r} (change {self.change_id} of "
                f"transaction {self.xid}, commit position {self.position})")


@dataclass(frozen=True)
class ConsumerStatistics:
    """A consumer's counters since it was created.  ``lag_seconds``: age of the oldest change of its last
    batch when it was read (None before the first batch)."""

    name: str
    state: ConsumerState
    position: Position
    batches: int
    changes: int
    firings: int
    failed: int
    retried_batches: int
    conflicts: int
    pruned_commits: int
    lag_seconds: float | None
    fetch_seconds: float          # reading changes and their typed rows
    rules_seconds: float          # running the rules (the batch's transaction body)
    commit_seconds: float         # the batch's flush: effects, position, COMMIT


@dataclass
class _Result:
    """What one firing of a batch came to (``inline``: it ran in a subtransaction shared with others)."""

    change: CapturedChange
    firing: Firing
    outcome: FiringOutcome
    error: BaseException | None
    inline: bool


class _RetryBatch(Exception):
    """A firing kept failing transiently: abort the batch and run it again."""


@dataclass
class _DeadLetter:
    change: CapturedChange
    reason: str
    rule: str | None = None
    key: Any = None


class _PositionWriter(CommitParticipant):
    """Advances the consumer's position in the batch's PostgreSQL transaction, after checking it is
    still where the batch started; writes the batch's dead letters there too."""

    def __init__(self, consumer: "CaptureConsumer", start: Position, end: Position, handled: int):
        self.consumer = consumer
        self.start = start
        self.end = end
        self.handled = handled
        self.dead_letters: list[_DeadLetter] = []

    def write(self, transaction: "Transaction", connection: sa.Connection) -> None:
        consumer = self.consumer
        consumer._step(Step.WRITING, self.handled)
        advanced = connection.execute(sa.text(_sql.ADVANCE_POSITION), {
            "name": consumer.name, "position": self.end.commit, "change_id": self.end.change_id,
            "handled": self.handled, "failed": len(self.dead_letters), "start_position": self.start.commit,
            "start_change_id": self.start.change_id}).first()
        if advanced is None:
            raise CaptureConflict(
                f"capture consumer {consumer.name!r}: its position is no longer {self.start}, where this batch "
                f"started (another process consumes under the same name); nothing of the batch was kept — "
                f"the consumer reads its position again")
        if self.dead_letters:
            connection.execute(consumer._database.table(deadletters.TABLE).insert(), [
                row for letter in self.dead_letters for row in deadletters.table_rows(
                    f"capture:{consumer.name}", letter.change.position, [deadletters.Letter(letter.reason, {
                        "consumer": consumer.name, "table": letter.change.table,
                        "operation": _KINDS[letter.change.operation].value, "xid": letter.change.xid,
                        "commit_position": letter.change.position, "change_id": letter.change.change_id,
                        "rule": letter.rule, "key": letter.key})])])

    def about_to_commit(self, transaction: "Transaction", connection: sa.Connection) -> None:
        self.consumer._step(Step.WRITTEN, self.handled)


class CaptureConsumer:
    """Consumes the captured changes of one database under a name (``db.capture.consumer(name)``).

    * ``batch_size``: changes per batch (one activedb transaction each);
    * ``retention``: how long consumed changes are kept before pruning (seconds or a ``timedelta``;
      default 0: pruned once every consumer has handled them); ``prune_interval``: seconds between
      pruning rounds;
    * ``idle_wait``: seconds a caught-up consumer waits for a notification before looking again (a
      standby also tries to take over then);
    * ``behind_seconds``: a batch whose oldest change is older than this logs a warning that the
      consumer is behind (at most once a minute);
    * ``max_retries``: a batch that meets serialization conflicts or deadlocks runs again this often
      before ``run_once`` gives up for now (the position stays; the next call tries again);
    * ``on_step(step, detail)``: called at each :class:`Step` (exceptions propagate: it is a monitoring
      and test hook).

    Thread-safety: see the module docstring.
    """

    def __init__(self, database: "Database", name: str = "default", *, batch_size: int = 500,
                 retention: float | dt.timedelta = 0.0, prune_interval: float = 5.0, idle_wait: float = 5.0,
                 behind_seconds: float = 60.0, max_retries: int = 5,
                 on_step: Callable[[Step, int], None] | None = None):
        if not isinstance(name, str) or not name:
            raise CaptureError(f"a consumer name is a non-empty string, got {name!r}")
        if batch_size < 1:
            raise CaptureError(f"batch_size must be at least 1, got {batch_size}")
        self._database = database
        self.name = name
        self.batch_size = batch_size
        self.retention_seconds = retention.total_seconds() if isinstance(retention, dt.timedelta) else float(retention)
        if self.retention_seconds < 0:
            raise CaptureError(f"retention must not be negative, got {retention!r}")
        self.prune_interval = prune_interval
        self.idle_wait = idle_wait
        self.behind_seconds = behind_seconds
        self.max_retries = max_retries
        self.on_step = on_step
        # One batch at a time; protects _listener, _statements, _known_position, _firing_numbers, _last_prune.
        self._run_mutex = threading.Lock()
        self._mutex = threading.Lock()          # protects the fields below
        self._progress = threading.Condition(self._mutex)
        self._state = ConsumerState.NEW
        self._position = Position()
        self._counters = dict(batches=0, changes=0, firings=0, failed=0, retried_batches=0, conflicts=0,
                              pruned_commits=0, fetch_seconds=0.0, rules_seconds=0.0, commit_seconds=0.0)
        self._lag: float | None = None
        self._fetches_begun = 0                 # fetch numbers, to wait for a fetch that began later
        self._last_empty_fetch = 0              # number of the last fetch that found nothing
        self._last_behind_warning = 0.0
        self._firing_numbers = 0
        self._listener: "psycopg.Connection | None" = None
        self._statements: dict[tuple, Any] = {}     # per (table, columns): the typed changes query
        # The position as this consumer last committed it while leading (None: read it from PostgreSQL).
        self._known_position: Position | None = None
        self._last_prune = 0.0
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._loop_error: BaseException | None = None

    # --- state ---------------------------------------------------------------------------------

    @property
    def state(self) -> ConsumerState:
        return self._state

    @property
    def position(self) -> Position:
        """The position this consumer last committed (or read)."""
        return self._position

    @property
    def leadership_lock(self) -> tuple[int, int]:
        """The session advisory lock ``(classid, objid)`` the leader of this name holds (``pg_locks``)."""
        return _sql.CONSUMER_LOCK_CLASS, _sql.consumer_lock_key(self.name)

    def statistics(self) -> ConsumerStatistics:
        with self._mutex:
            return ConsumerStatistics(name=self.name, state=self._state, position=self._position,
                                      lag_seconds=self._lag, **self._counters)

    def _count(self, **increments: float) -> None:
        with self._mutex:
            for what, amount in increments.items():
                self._counters[what] += amount

    def _step(self, step: Step, detail: int = 0) -> None:
        hook = self.on_step
        if hook is not None:
            hook(step, detail)

    # --- running ---------------------------------------------------------------------------------

    def run_once(self) -> int:
        """Run one batch if this consumer leads its name; returns the number of changes handled (0: none
        pending, another consumer leads, or the batch must be tried again later)."""
        if self._thread is not None:
            raise CaptureError(f"capture consumer {self.name!r} runs on its own thread (start()); "
                               f"use wait_caught_up() instead of run_once()")
        return self._run_once()

    def run_until_caught_up(self, max_batches: int | None = None, *, lead_timeout: float = 0.0) -> int:
        """Run batches until one finds nothing pending (or ``max_batches`` ran); returns the changes
        handled.  Waits up to ``lead_timeout`` seconds for another consumer of this name to let go of the
        lead (in PostgreSQL: a lock wait), then raises :class:`CaptureError` if it still leads."""
        if self._thread is not None:
            raise CaptureError(f"capture consumer {self.name!r} runs on its own thread (start()); "
                               f"use wait_caught_up() instead")
        total = batches = 0
        if lead_timeout > 0:
            with self._run_mutex:
                self._check_open()
                self._lead(wait=lead_timeout)
        while max_batches is None or batches < max_batches:
            handled = self.run_once()
            batches += 1
            if handled == 0:
                if self._state is not ConsumerState.LEADING:
                    raise CaptureError(f"capture consumer {self.name!r} is on standby: another process consumes "
                                       f"under this name; stop it or use another name")
                break
            total += handled
        return total

    def start(self) -> "CaptureConsumer":
        """Run batches on a thread of its own until :meth:`stop`; waits for notifications when caught up."""
        self._check_open()
        if self._thread is not None:
            raise CaptureError(f"capture consumer {self.name!r} is already running")
        self._stopping.clear()
        self._thread = threading.Thread(target=self._loop, name=f"activedb-capture-{self.name}", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float | None = 30.0) -> None:
        """Stop the thread after the batch in progress (it commits or not, as it would anyway)."""
        thread = self._thread
        if thread is None:
            return
        self._stopping.set()
        self._wake("stop")
        thread.join(timeout)
        if thread.is_alive():
            raise CaptureError(f"capture consumer {self.name!r} did not stop within {timeout} s "
                               f"(a rule of the batch in progress may be blocked)")
        self._thread = None

    def close(self) -> None:
        """Stop, release the leadership (the listener connection) and refuse further batches."""
        self.stop()
        with self._run_mutex:
            self._close_listener()
            with self._mutex:
                self._state = ConsumerState.STOPPED
                self._progress.notify_all()

    def wait_caught_up(self, timeout: float = 30.0) -> Position:
        """Wait until a fetch that began after this call found nothing pending (every change committed
        before the call is handled); returns the position.  For a consumer running on its thread."""
        deadline = time.monotonic() + timeout
        with self._mutex:
            begun = self._fetches_begun
        self._wake("poke")
        with self._progress:
            while self._last_empty_fetch <= begun:
                if self._loop_error is not None:
                    raise CaptureError(f"capture consumer {self.name!r} stopped: {self._loop_error!r}") \
                        from self._loop_error
                if self._state is ConsumerState.STOPPED:
                    raise ConsumerStopped(f"capture consumer {self.name!r} is stopped")
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"capture consumer {self.name!r} not caught up within {timeout} s "
                                       f"(state {self._state.value}, position {self._position})")
                self._progress.wait(remaining)
            return self._position

    def _loop(self) -> None:
        try:
            while not self._stopping.is_set():
                try:
                    handled = self._run_once()
                except (DatabaseUnavailable, CaptureNotInstalled) as error:
                    logger.error("capture consumer %r: %s", self.name, error)
                    self._stopping.wait(self.idle_wait)      # the server or the schema is not there yet
                    continue
                if handled == 0 and not self._stopping.is_set():
                    self._wait_for_changes()
        except BaseException as error:   # a bug or a hook that raised: visible to waiters, then re-raised
            with self._mutex:
                self._loop_error = error
                self._progress.notify_all()
            raise

    def _run_once(self) -> int:
        with self._run_mutex:
            self._check_open()
            if not self._lead():
                return 0
            handled = self._run_batch(self.batch_size)
            self._maybe_prune()
            return handled

    def _check_open(self) -> None:
        if self._state is ConsumerState.STOPPED:
            raise ConsumerStopped(f"capture consumer {self.name!r} was closed; create a new one")

    # --- leadership and notifications ------------------------------------------------------------

    def _connect_listener(self) -> "psycopg.Connection":
        import psycopg

        url = self._database.engine.url.set(drivername="postgresql")
        try:
            connection = psycopg.connect(url.render_as_string(hide_password=False), autocommit=True,
                                         connect_timeout=5)
            connection.execute(f"LISTEN {_sql.CHANNEL}")
        except psycopg.OperationalError as error:
            raise DatabaseUnavailable(f"capture consumer {self.name!r} cannot connect to PostgreSQL "
                                      f"({self._database.describe()}): {str(error).strip()}") from None
        return connection

    def _close_listener(self) -> None:
        """Caller holds ``_run_mutex``."""
        listener, self._listener = self._listener, None
        if listener is not None:
            try:
                listener.close()   # ends the session: the leadership lock is released
            except Exception:      # already broken
                pass

    def _lead(self, wait: float = 0.0) -> bool:
        """True if this consumer leads its name (taking the lock if it is free, or once it is within
        ``wait`` seconds).  Caller holds ``_run_mutex``."""
        import psycopg

        if self._state is ConsumerState.LEADING:
            try:
                self._drain_notifications()      # also finds out whether the session (and its lock) is still there
                return True
            except psycopg.OperationalError as error:
                logger.warning("capture consumer %r lost its listener connection and with it the lead (%s)",
                               self.name, str(error).strip())
                self._close_listener()
        if self._listener is None or self._listener.closed:
            self._listener = None
            with self._mutex:
                self._state = ConsumerState.STANDBY
            self._listener = self._connect_listener()
        try:
            if wait > 0:
                got = self._wait_for_lock(wait)
            else:
                got = self._listener.execute("SELECT pg_try_advisory_lock(%s, %s)",
                                             self.leadership_lock).fetchone()[0]
        except psycopg.OperationalError as error:
            self._close_listener()
            raise DatabaseUnavailable(f"capture consumer {self.name!r} lost its connection: {error}") from None
        if not got:
            with self._mutex:
                self._state = ConsumerState.STANDBY
            return False
        self._register()
        self._known_position = None
        with self._mutex:
            self._state = ConsumerState.LEADING
        logger.info("capture consumer %r leads (position %s)", self.name, self._position)
        self._step(Step.LEADING, 0)
        return True

    def _wait_for_lock(self, seconds: float) -> bool:
        """Wait in PostgreSQL (a lock wait bounded by ``lock_timeout``) for the name's lock."""
        import psycopg

        listener = self._listener
        listener.execute(f"SET lock_timeout = {int(seconds * 1000)}")
        try:
            listener.execute("SELECT pg_advisory_lock(%s, %s)", self.leadership_lock)
            return True
        except psycopg.errors.LockNotAvailable:
            return False
        finally:
            listener.execute("RESET lock_timeout")

    def _register(self) -> None:
        try:
            with self._database.engine.begin() as connection:
                connection.execute(sa.text(_sql.REGISTER_CONSUMER), {"name": self.name})
        except sa.exc.ProgrammingError as error:
            if getattr(error.orig, "sqlstate", None) == "42P01":
                raise CaptureNotInstalled(
                    f"activedb's capture tables are missing in {self._database.describe()}; upgrade activedb's "
                    f"schema (activedb db upgrade, or db.upgrade())") from None
            raise

    def _wake(self, why: str) -> None:
        """Interrupt the consumer's wait for notifications (``stop``, ``poke``)."""
        try:
            with self._database.engine.begin() as connection:
                connection.execute(sa.text("SELECT pg_notify(:channel, :payload)"),
                                   {"channel": _sql.CHANNEL, "payload": why})
        except sa.exc.DBAPIError as error:
            logger.warning("capture consumer %r: could not notify (%s)", self.name, error)

    def _wait_for_changes(self) -> None:
        """Wait on the listener connection for a commit notification (or ``idle_wait``).  Loop thread only,
        outside ``_run_mutex`` (no batch runs meanwhile: batches run on this thread)."""
        import psycopg

        listener = self._listener
        self._step(Step.IDLE, 0)
        if listener is None:
            self._stopping.wait(self.idle_wait)
            return
        try:
            for _ in listener.notifies(timeout=self.idle_wait, stop_after=1):
                pass
        except psycopg.OperationalError as error:
            logger.warning("capture consumer %r: listener connection lost (%s); reconnecting", self.name, error)
            with self._run_mutex:
                self._close_listener()
                with self._mutex:
                    self._state = ConsumerState.STANDBY

    def _drain_notifications(self) -> None:
        """Drop notifications already received (this batch reads what they announced).  Caller holds
        ``_run_mutex``."""
        listener = self._listener
        if listener is not None:
            for _ in listener.notifies(timeout=0):
                pass

    # --- one batch -----------------------------------------------------------------------------

    def _run_batch(self, limit: int) -> int:
        """Caller holds ``_run_mutex``."""
        attempt = 0
        while True:
            attempt += 1
            start = self._known_position
            if start is None:
                start = self._known_position = self._read_position()
            with self._mutex:
                self._fetches_begun += 1
                fetch = self._fetches_begun
            began = time.perf_counter()
            changes = self._fetch(start, limit)
            self._count(fetch_seconds=time.perf_counter() - began)
            if not changes:
                with self._mutex:
                    self._position = start
                    self._last_empty_fetch = fetch
                    self._progress.notify_all()
                return 0
            self._note_lag(changes[0][0])
            self._step(Step.FETCHED, len(changes))
            try:
                try:
                    handled = self._apply(start, changes)
                except BaseException:
                    self._known_position = None   # read it again: whatever happened, PostgreSQL knows
                    raise
                self._known_position = changes[-1][0].at
                return handled
            except CaptureConflict as error:
                logger.warning("%s", error)
                self._count(conflicts=1)
                return 0
            except (_RetryBatch, TransactionAborted, *_TRANSIENT) as error:
                self._count(retried_batches=1)
                if attempt > self.max_retries:
                    logger.warning("capture consumer %r: batch at %s failed %d times (%r); trying again later",
                                   self.name, start, attempt, error)
                    return 0
                # Jittered back-off between retries of the batch (not used to order threads).
                time.sleep(random.uniform(0.5, 1.5) * min(0.5, 0.002 * 2 ** attempt))
            except DatabaseError as error:
                # PostgreSQL refused the batch's effects (a constraint, a value too large …): find the change
                # whose reactions cannot commit by halving the batch; at one change, keep it as a dead letter.
                if len(changes) > 1:
                    limit = max(1, len(changes) // 2)
                    logger.warning("capture consumer %r: batch of %d at %s refused (%s); retrying with %d",
                                   self.name, len(changes), start, error, limit)
                    continue
                return self._give_up(start, changes[0], error)

    def _read_position(self) -> Position:
        with self._database.engine.connect() as connection:
            row = connection.execute(sa.text(_sql.READ_POSITION), {"name": self.name}).first()
        if row is None:    # removed by db.capture.drop_consumer while running: start again
            self._register()
            return Position()
        return Position(row.position, row.change_id)

    def _fetch(self, start: Position, limit: int) -> list[tuple[CapturedChange, Event | None, str | None]]:
        """The next changes after ``start``, in order, with their events (None and a reason for a change
        that cannot become one, e.g. of a table that no longer exists): where the batch ends, then each
        table's changes in that range with typed rows."""
        with self._database.engine.connect() as connection:
            bounds = connection.execute(sa.text(_sql.BATCH_BOUNDS), {
                "position": start.commit, "change_id": start.change_id, "limit": limit}).first()
            if bounds is None:
                return []
            end = Position(bounds.position, bounds.id)
            result = []
            for table_name in sorted(bounds.tables):
                try:
                    result.extend(self._changes_of(connection, table_name, start, end))
                except sa.exc.ProgrammingError as error:   # dropped (or its type changed) after capture
                    if getattr(error.orig, "sqlstate", None) not in ("42P01", "42704"):
                        raise
                    connection.rollback()
                    result.extend(self._undeliverable(connection, table_name, start, end,
                                                      f"table {table_name!r} no longer exists"))
                except UnknownTable as error:
                    result.extend(self._undeliverable(connection, table_name, start, end, str(error)))
        if len(bounds.tables) > 1:
            result.sort(key=lambda entry: (entry[0].position, entry[0].change_id))
        return result

    def _changes_of(self, connection: sa.Connection, table_name: str, start: Position, end: Position):
        table = self._database.table(table_name)
        columns = list(table.columns)
        names = [column.name for column in columns]
        key_indexes = [names.index(column.name) for column in table.primary_key.columns]
        statement = self._statements.get((table_name, tuple(names)))
        if statement is None:
            statement = sa.text(_sql.changes_of(table_name, names)).columns(
                sa.column("position", sa.BigInteger), sa.column("id", sa.BigInteger), sa.column("xid", sa.Text),
                sa.column("operation", sa.Text), sa.column("committed_at", sa.DateTime(timezone=True)),
                *[sa.column(f"o_{index}", column.type) for index, column in enumerate(columns)],
                *[sa.column(f"n_{index}", column.type) for index, column in enumerate(columns)])
            self._statements[(table_name, tuple(names))] = statement
        rows = connection.execute(statement, {
            "table": table_name, "first_position": start.commit, "first_change": start.change_id,
            "last_position": end.commit, "last_change": end.change_id})
        width = len(names)
        entries = []
        for row in rows:
            change = CapturedChange(row[0], row[1], int(row[2]), table_name, row[3], row[4])
            values = tuple(row)
            kind = _KINDS[change.operation]
            old = dict(zip(names, values[5:5 + width])) if kind is not EventKind.INSERTED else None
            new = dict(zip(names, values[5 + width:])) if kind is not EventKind.DELETED else None
            image = values[5 + width:] if new is not None else values[5:5 + width]
            key = tuple(image[index] for index in key_indexes) if key_indexes else None
            if key is not None and len(key) == 1:
                key = key[0]
            event = Event(kind, table_name, key, old, new,
                          payload={"xid": change.xid, "commit_position": change.position,
                                   "change_id": change.change_id, "committed_at": change.committed_at},
                          transaction=f"pg:{change.xid}", origin=Origin.EXTERNAL)
            entries.append((change, event, None))
        return entries

    def _undeliverable(self, connection: sa.Connection, table_name: str, start: Position, end: Position,
                       reason: str):
        rows = connection.execute(sa.text(_sql.changes_of_without_rows()), {
            "table": table_name, "first_position": start.commit, "first_change": start.change_id,
            "last_position": end.commit, "last_change": end.change_id})
        entries = []
        for row in rows:
            change = CapturedChange(row.position, row.id, int(row.xid), table_name, row.operation, row.committed_at)
            entries.append((change, None, f"{change.describe()} cannot be delivered: {reason}"))
        return entries

    def _rules_by_table(self) -> dict[str, list[Rule]]:
        found: dict[str, list[Rule]] = {}
        for rule in self._database.rules:
            if rule.enabled and rule.on.origin is Origin.EXTERNAL:
                found.setdefault(rule.on.source, []).append(rule)
        return found

    def _apply(self, start: Position, changes: list) -> int:
        end = changes[-1][0].at
        writer = _PositionWriter(self, start, end, len(changes))
        planned = self._plan(changes, writer)
        results: list[_Result] = []
        began = time.perf_counter()
        with self._database.transaction(name=f"capture:{self.name}", participants=[writer]) as transaction:
            inline = self._may_share_a_subtransaction(planned)
            for first in range(0, len(planned), CHUNK_FIRINGS):
                results.extend(self._run_chunk(transaction, planned[first:first + CHUNK_FIRINGS], inline))
            for result in results:
                if result.outcome is FiringOutcome.FAILED:
                    firing = result.firing
                    writer.dead_letters.append(_DeadLetter(
                        result.change, f"rule {firing.rule.name!r} failed on {result.change.describe()}: "
                        f"{result.error!r}", rule=firing.rule.name, key=firing.event.key))
            self._step(Step.FIRED, len(results))
            fired = time.perf_counter()
        # Committed: the position and the effects are durable together.
        committed = time.perf_counter()
        rules = self._database.rules
        for result in results:
            rules.count(result.firing.rule, "fired")
            if result.outcome is FiringOutcome.EXECUTED:
                rules.count(result.firing.rule, "executed")
        with self._mutex:
            self._position = end
            counters = self._counters
            counters["batches"] += 1
            counters["changes"] += len(changes)
            counters["firings"] += len(results)
            counters["failed"] += len(writer.dead_letters)
            counters["rules_seconds"] += fired - began
            counters["commit_seconds"] += committed - fired
            self._progress.notify_all()
        self._step(Step.COMMITTED, len(changes))
        return len(changes)

    def _plan(self, changes: list, writer: _PositionWriter) -> list[tuple[CapturedChange, Firing]]:
        """The batch's firings in order: changes in commit order, each change's rules in priority groups
        (equal priorities in declaration order).  Changes that cannot become events are dead letters."""
        rules_by_table = self._rules_by_table()
        planned = []
        for change, event, problem in changes:
            if event is None:
                writer.dead_letters.append(_DeadLetter(change, problem))
                logger.error("capture consumer %r: %s", self.name, problem)
                continue
            candidates = [rule for rule in rules_by_table.get(change.table, ()) if rule.on.matches(event)]
            if not candidates:
                continue
            firings = [Firing(rule, event, (rule.name,), rule.coupling, self._next_firing_number())
                       for rule in candidates]
            for group in (priority_groups(firings) if len(firings) > 1 else (firings,)):
                planned.extend((change, firing) for firing in group)
        return planned

    def _may_share_a_subtransaction(self, planned: list[tuple[CapturedChange, Firing]]) -> bool:
        """Whether firings may run together in one subtransaction (re-run one by one if any fails): only if
        that cannot be told apart from one subtransaction each — no deferred rule is enabled (a deferred
        rule fired by a firing runs when the firing's transaction commits) and every rule couples its
        action immediately (C-A sequential needs the rule manager's parallel siblings)."""
        if any(rule.enabled and rule.coupling is Coupling.DEFERRED for rule in self._database.rules):
            return False
        return all(firing.rule.action_coupling is Coupling.IMMEDIATE for _, firing in planned)

    def _run_chunk(self, transaction: "Transaction", chunk: list[tuple[CapturedChange, Firing]],
                   inline: bool) -> list["_Result"]:
        """Run ``chunk``'s firings through the rule manager: together in one subtransaction if ``inline`` (the
        fast path), and one subtransaction each if not, or if any of them raised there (nothing of the
        shared one is kept)."""
        if inline and chunk:
            try:
                fired = transaction.run_subtransaction(self._database.rules.fire, [firing for _, firing in chunk],
                                                       shared=True, name=f"capture:{self.name}:rules")
                return [_Result(change, firing, outcome, None, inline=True)
                        for (change, firing), (outcome, _) in zip(chunk, fired)]
            except Exception as error:       # re-run one by one: the failing firing alone is discarded
                logger.info("capture consumer %r: a firing of a chunk of %d raised (%r); running them one by one",
                            self.name, len(chunk), error)
        results = []
        for change, firing in chunk:
            outcome, error = self._fire(transaction, firing)
            results.append(_Result(change, firing, outcome, error, inline=False))
        return results

    def _next_firing_number(self) -> int:
        self._firing_numbers += 1      # under _run_mutex
        return self._firing_numbers

    def _fire(self, transaction: "Transaction", firing: Firing) -> Fired:
        """Run one firing in its own subtransaction of the batch, again while it fails transiently."""
        transient: BaseException | None = None
        for _ in range(FIRING_ATTEMPTS):
            try:
                (fired,) = self._database.rules.fire(transaction, [firing])
                if not isinstance(fired.error, _TRANSIENT):
                    return fired
                transient = fired.error
            except _TRANSIENT as error:
                transient = error
        raise _RetryBatch(f"rule {firing.rule.name!r} kept failing on {firing.event.describe()}: {transient!r}")

    def _give_up(self, start: Position, entry, error: DatabaseError) -> int:
        """The reactions to one change cannot commit: advance past it, keeping it as a dead letter."""
        change = entry[0]
        writer = _PositionWriter(self, start, change.at, 1)
        writer.dead_letters.append(_DeadLetter(
            change, f"the reactions to {change.describe()} cannot be committed: {error}",
            key=entry[1].key if entry[1] is not None else None))
        logger.error("capture consumer %r: %s; kept as a dead letter, going on", self.name, writer.dead_letters[0].reason)
        self._known_position = None
        with self._database.transaction(name=f"capture:{self.name}", participants=[writer]):
            pass
        self._known_position = change.at
        with self._mutex:
            self._position = change.at
            self._counters["batches"] += 1
            self._counters["changes"] += 1
            self._counters["failed"] += 1
            self._progress.notify_all()
        self._step(Step.COMMITTED, 1)
        return 1

    def _note_lag(self, change: CapturedChange) -> None:
        now = dt.datetime.now(dt.timezone.utc)
        lag = max(0.0, (now - change.committed_at).total_seconds())
        warn = False
        with self._mutex:
            self._lag = lag
            if lag > self.behind_seconds and time.monotonic() - self._last_behind_warning > 60.0:
                self._last_behind_warning = time.monotonic()
                warn = True
        if warn:
            logger.warning("capture consumer %r is behind: the oldest change it is handling committed %.0f s ago "
                           "(see activedb capture status for the backlog)", self.name, lag)

    # --- pruning ---------------------------------------------------------------------------------

    def _maybe_prune(self) -> None:
        """Caller holds ``_run_mutex``."""
        now = time.monotonic()
        if now - self._last_prune < self.prune_interval:
            return
        self._last_prune = now
        pruned = prune(self._database.engine, self.retention_seconds)
        if pruned:
            self._count(pruned_commits=pruned)
            self._step(Step.PRUNED, pruned)


def prune(engine: sa.Engine, retention_seconds: float, limit: int = PRUNE_LIMIT) -> int:
    """Remove changes every consumer has handled and that committed more than ``retention_seconds`` ago
    (at most ``limit`` commits); returns the number of commits removed."""
    with engine.begin() as connection:
        rows = connection.execute(sa.text(_sql.PRUNABLE), {"retention_seconds": retention_seconds,
                                                           "limit": limit}).all()
        if not rows:
            return 0
        connection.execute(sa.text(_sql.PRUNE_CHANGES), {"xids": [str(row.xid) for row in rows]})
        connection.execute(sa.text(_sql.PRUNE_COMMITS), {"positions": [row.position for row in rows]})
    return len(rows)
