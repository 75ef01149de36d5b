"""Deadlines and the batch in progress: :class:`Deadlines` (how long a batch, and a rule firing in it, may run),
:class:`BatchInProgress` and :class:`FiringInProgress` (what runs now: ``activedb run``'s progress line, the
metrics), :class:`Watch` (what a watched ingestion holds: the thread its batches run on, the clock of its rule
firings, the report of a long batch to the database, the deadlines) and :func:`batches_in_progress` (the reports,
as ``activedb status`` reads them).  Design note: the package's ``README.md``, "Deadlines and the batch in
progress".

Durations — how long a batch and its firings have run, hence the deadlines and when a batch is reported — are
read from the database's clock (``db.clock``, ``activedb.clock``): a test with a ``ManualClock`` passes a deadline
by advancing it, whatever the machine's load.  The times of day written to the report stay the system's calendar
(``activedb status`` compares them with the server's ``now()``).

Thread-safety: a :class:`Watch` runs one batch at a time (its ingestion's); ``Watch._mutex`` protects the batch
in progress (a leaf: no SQL or user code under it); :class:`FiringClock` needs none.  The
report is written by the thread that waits for the batch, never by the batch's own.
"""

from __future__ import annotations

import concurrent.futures
import datetime as dt
import logging
import os
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

import sqlalchemy as sa

from activedb import deadletters, lowlevel
from activedb.errors import finite_number, rule_past_deadline
from activedb.ingest._interface import RowEvent, row_count
from activedb.ingest._letters import BatchLetters
from activedb.ingest._outcome import BatchInProgress, FiringInProgress
from activedb.ingest.errors import BatchDeadlineExceeded, IngestError
from activedb.txn import FiringOutcome, FiringView, Observer, TxnState

if TYPE_CHECKING:  # pragma: no cover
    from activedb._handle import DatabaseHandle
    from activedb.clock import Clock
    from activedb.ingest._interface import Rows
    from activedb.ingest._mapping import EventMapping
    from activedb.txn import Transaction

__all__ = ["BatchInProgress", "BatchReport", "Deadlines", "FiringInProgress", "Watch", "batches_in_progress",
           "letters_written_ahead"]

logger = logging.getLogger("activedb.ingest")

_UTC = dt.timezone.utc
_T = TypeVar("_T")

PROGRESS_TABLE = "activedb_batches_in_progress"
#: A batch that has run this long is reported to the database (one that ends sooner costs no SQL).
REPORT_AFTER_SECONDS = 2.0
#: How often the report of a batch still running is refreshed (``reported_at``).
REPORT_EVERY_SECONDS = 5.0
#: A report older than this belongs to a process that stopped reporting (``BatchReport.stale``).
STALE_AFTER_SECONDS = 3 * REPORT_EVERY_SECONDS


@dataclass(frozen=True)
class Deadlines:
    """How long a batch may run and how long a rule firing in it may run, in seconds of the database's clock
    (``db.clock``; None: no limit); given to an ingestion (``Ingestion(deadlines=…)``,
    ``spark_bridge.ingest(deadlines=…)``), they also make its batch in progress visible (``activedb status``, the
    metrics).  ``Deadlines()`` watches without a limit.  Immutable.

    What a deadline does (the design note says why): the batch's transaction is doomed and its PostgreSQL
    transaction ended at once (row locks released); for a rule, the event it was running on becomes a dead letter
    at once, and a re-run of the batch leaves it out; the batch fails with :class:`BatchDeadlineExceeded` and the
    connector re-delivers it later.  The thread that does not return cannot be stopped: it is abandoned, and the
    ingestion takes no more batches — the process should end or restart (``activedb run`` and ``activedb capture
    consume`` restart themselves)."""

    batch: float | None = None
    rule: float | None = None

    def __post_init__(self) -> None:
        for name in ("batch", "rule"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not finite_number(value) or value <= 0):
                raise IngestError(f"Deadlines({name}=…) takes a number of seconds > 0, or None for no limit; "
                                  f"got {value!r}")


@dataclass(frozen=True)
class BatchReport:
    """A row of ``activedb_batches_in_progress``: a batch that had run :data:`REPORT_AFTER_SECONDS` when its
    process reported it.  ``stale``: not refreshed for :data:`STALE_AFTER_SECONDS` — the process stopped
    reporting (it was killed, or its machine is gone); ``seconds``: how long the batch has run by now."""

    query_id: str
    query_name: str
    batch_id: int
    rows: int
    host: str
    pid: int
    started_at: dt.datetime
    reported_at: dt.datetime
    deadline_at: dt.datetime | None
    firing_rule: str | None
    firing_event: str | None
    firing_started_at: dt.datetime | None
    seconds: float
    stale: bool


def batches_in_progress(db: DatabaseHandle, query_name: str | None = None) -> list[BatchReport]:
    """The batches in progress their processes reported (of source ``query_name``, or all), oldest first."""
    table = db.table(PROGRESS_TABLE)
    statement = sa.select(table, sa.func.now().label("now")).order_by(table.c.started_at)
    if query_name is not None:
        statement = statement.where(table.c.query_name == query_name)
    with db.engine.connect() as connection:
        rows = connection.execute(statement).mappings().all()
    return [BatchReport(**{name: row[name] for name in (
        "query_id", "query_name", "batch_id", "rows", "host", "pid", "started_at", "reported_at", "deadline_at",
        "firing_rule", "firing_event", "firing_started_at")},
        seconds=(row["now"] - row["started_at"]).total_seconds(),
        stale=(row["now"] - row["reported_at"]).total_seconds() > STALE_AFTER_SECONDS) for row in rows]


def letters_written_ahead(db: DatabaseHandle, query_id: str, batch_id: int) -> dict[int, int]:
    """``{row position: letter id}`` of the dead letters a deadline wrote ahead of batch ``batch_id`` of
    ``query_id`` (:meth:`Watch._abandon`): its re-run leaves those rows out."""
    table = db.table(deadletters.TABLE)
    with db.catalog.autocommit_connection() as connection:     # (a lost connection: DatabaseUnavailable)
        return deadletters.written_ahead(connection, table, query_id, batch_id)


class FiringClock(Observer):
    """The rule firings running now and since when, on ``clock`` (an :class:`~activedb.txn.Observer`; a database
    without a watched ingestion does not call its hooks).  Thread-safety: ``_running`` is changed and copied by
    single dict operations, each atomic under CPython's GIL — no mutex on a firing's path (two hooks per firing)."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._running: dict[int, tuple[Transaction, FiringView, float]] = {}   # id(firing) -> its transaction, it, since

    def on_firing_start(self, transaction: Transaction, firing: FiringView) -> None:
        self._running[id(firing)] = (transaction, firing, self._clock.now())

    def on_firing_end(self, transaction: Transaction, firing: FiringView, outcome: FiringOutcome) -> None:
        self._running.pop(id(firing), None)

    def oldest(self, root: Transaction) -> tuple[Transaction, FiringView, float] | None:
        """The oldest firing running in ``root``'s tree: ``(its transaction, the firing, since)``, or None."""
        running = [entry for entry in self._running.copy().values() if entry[0].root is root]
        return min(running, key=lambda entry: entry[2], default=None)


class _Runner:
    """A daemon thread running one call at a time: the batches of a watched ingestion run here, so that the
    connector's thread can wait with a deadline (a thread that never returns is abandoned with it: a daemon
    does not keep the process alive)."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._mutex = threading.Lock()     # protects _calls and _thread
        self._calls: list[Callable[[], None] | None] = []      # None: close()
        self._wake = threading.Condition(self._mutex)
        self._thread: threading.Thread | None = None

    def submit(self, function: Callable[[], _T]) -> concurrent.futures.Future[_T]:
        """Run ``function()`` on the runner's thread; the future of its outcome."""
        future: concurrent.futures.Future[_T] = concurrent.futures.Future()

        def call() -> None:
            future.set_running_or_notify_cancel()
            try:
                future.set_result(function())
            except BaseException as error:     # handed to the waiting thread, which raises it
                future.set_exception(error)

        with self._mutex:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
                self._thread.start()
            self._calls.append(call)
            self._wake.notify()
        return future

    def _loop(self) -> None:
        while True:
            with self._mutex:
                while not self._calls:
                    self._wake.wait()
                call = self._calls.pop(0)
            if call is None:       # close()
                return
            call()

    def close(self) -> None:
        with self._mutex:
            if self._thread is None:
                return
            self._calls.append(None)
            self._wake.notify()


@dataclass
class _Current:
    """The batch a watch runs now (the waiting thread reads it; ``root`` is set by the batch's thread)."""

    query_id: str
    batch_id: int
    rows: int
    started: float                  # the watch's clock.now()
    started_at: dt.datetime
    root: Transaction | None = None


class Watch:
    """What watches one ingestion's batches, given its :class:`Deadlines`: they run on a thread of their own
    (:meth:`run`) while the caller's thread waits, reports a batch that runs long to ``activedb_batches_in_progress``
    and enforces the deadlines.  Thread-safety: the module docstring."""

    def __init__(self, db: DatabaseHandle, source: str, deadlines: Deadlines,
                 mapping: EventMapping | None = None) -> None:
        self.db = db
        self.source = source
        self.deadlines = deadlines
        #: The batches' mapping (None: none), for the letter of a rule's event past its deadline (``BatchLetters``).
        self.mapping = mapping
        #: Where durations are read (the module docstring): the database's clock.
        self._time = db.clock
        self.clock = FiringClock(db.clock)
        db.observe(self.clock)
        self._runner = _Runner(f"activedb-ingest:{source}")
        self._mutex = threading.Lock()      # protects _current and abandoned
        self._current: _Current | None = None
        #: Why this watch abandoned a batch whose thread still runs: it takes no more batches.
        self.abandoned: BatchDeadlineExceeded | None = None
        self._host, self._pid = socket.gethostname(), os.getpid()

    # -- the batch in progress ----------------------------------------------------------------------

    def transaction(self, root: Transaction) -> None:
        """The batch's (next) top-level transaction (called by its thread, at each attempt).  A batch given up before
        its thread began this transaction (a batch deadline passed while it still read its rows) had no tree to
        doom: this one is doomed now, so that the batch never commits.  Under ``_mutex``, with :meth:`_abandon`'s
        reading of the root: one of the two dooms it."""
        with self._mutex:
            abandoned = self.abandoned
            if abandoned is None and self._current is not None:
                self._current.root = root
        if abandoned is not None:
            lowlevel.abandon(root, abandoned)

    def in_progress(self) -> BatchInProgress | None:
        """The batch running now, its oldest firing and the time to its first deadline; None between batches."""
        return self._in_progress(self._time.now())

    def _in_progress(self, now: float) -> BatchInProgress | None:
        """:meth:`in_progress` as of ``now`` (the watch's clock)."""
        with self._mutex:
            current = self._current
        if current is None:
            return None
        seconds = now - current.started
        firing = None
        remaining = [] if self.deadlines.batch is None else [self.deadlines.batch - seconds]
        oldest = None if current.root is None else self.clock.oldest(current.root)
        if oldest is not None:
            transaction, fired, since = oldest
            firing = FiringInProgress(fired.rule.name, fired.event.describe(), now - since, transaction.id)
            if self.deadlines.rule is not None:
                remaining.append(self.deadlines.rule - firing.seconds)
        return BatchInProgress(current.query_id, self.source, current.batch_id, current.rows, current.started_at,
                               seconds, firing, min(remaining, default=None))

    # -- running a batch ----------------------------------------------------------------------------

    def run(self, query_id: str, batch_id: int, rows: Rows, call: Callable[[], _T],
            event_in_progress: Callable[[], RowEvent | None]) -> _T:
        """``call()`` (the batch) on the watch's thread, waited for with the deadlines; its result, or its error
        raised.  Past a deadline the batch is abandoned (:meth:`_abandon`) and :class:`BatchDeadlineExceeded`
        raised.  ``rows``: the batch as delivered (a culprit's dead letter keeps its row); ``event_in_progress``:
        the handler's event running now (the culprit of a rule deadline)."""
        if self.abandoned is not None:
            raise IngestError(f"this ingestion abandoned a batch whose rule never returned ({self.abandoned}); it "
                              f"takes no more batches: end this process and start it again (activedb's commands that "
                              f"run an ingestion restart themselves)")
        with self._mutex:
            self._current = _Current(query_id, batch_id, row_count(rows), self._time.now(), dt.datetime.now(_UTC))
        reported = False
        try:
            handle = self._runner.submit(call)
            ended = threading.Event()       # set when the batch ends; a manual clock sets it when advanced
            handle.add_done_callback(lambda _: ended.set())
            next_report = REPORT_AFTER_SECONDS
            while True:
                ended.clear()               # (before looking: an end after the look sets it again)
                if handle.done():
                    break
                now = self._time.now()
                batch = self._in_progress(now)
                if batch is not None:       # (always: None is between batches)
                    if batch.deadline_in is not None and batch.deadline_in <= 0:
                        self._abandon(batch, rows, event_in_progress)      # raises
                    if batch.seconds >= next_report:
                        reported = self._report(batch) or reported
                        next_report = batch.seconds + REPORT_EVERY_SECONDS
                # (until a time on the clock, not for the time left: a clock moved since ``now`` still wakes it)
                self._time.wait_until(ended, self._next_look(batch, now, next_report))
        finally:
            with self._mutex:
                self._current = None
            if reported:
                self._unreport(query_id)
        return handle.result()

    @staticmethod
    def _next_look(batch: BatchInProgress | None, now: float, next_report: float) -> float:
        """When to look again at ``batch`` as it was at ``now`` (the watch's clock, whose scale the result is on):
        at the next report or the first deadline, at most a second later."""
        if batch is None:
            return now + 0.05
        until = [next_report - batch.seconds, 1.0]
        if batch.deadline_in is not None:
            until.append(batch.deadline_in)
        return now + max(0.01, min(until))

    def _abandon(self, batch: BatchInProgress, rows: Rows, event_in_progress: Callable[[], RowEvent | None]) -> None:
        """Give up ``batch``: its transaction is doomed and its PostgreSQL transaction ended now
        (``lowlevel.abandon``); past a rule's deadline, the event it runs on is a dead letter at once, which a re-run
        leaves out; the watch takes no more batches.  A batch whose transaction had committed (its thread still runs
        what follows the commit) is left as it is, and the error says it is applied.  Raises
        :class:`BatchDeadlineExceeded`."""
        firing = batch.firing
        rule_late = (firing is not None and self.deadlines.rule is not None and firing.seconds >= self.deadlines.rule)
        where = f"batch {batch.batch_id} of {batch.query_id}"
        if rule_late:
            assert firing is not None and self.deadlines.rule is not None
            what = (f"{rule_past_deadline(firing.rule, self.deadlines.rule)} (it has run {firing.seconds:,.0f} s on "
                    f"{firing.event})")
        else:
            running = ("" if firing is None
                       else f"; rule {firing.rule!r} has run {firing.seconds:,.0f} s on {firing.event}")
            what = (f"the batch did not finish within its deadline of {self.deadlines.batch:g} s ({batch.rows:,} rows"
                    f"{running})")
        error = BatchDeadlineExceeded(f"{where}: {what}", batch_id=batch.batch_id)
        with self._mutex:
            root = None if self._current is None else self._current.root
            self.abandoned = error
        # A batch whose transaction has committed is applied: what did not return runs after its commit on its thread
        # (a participant's ``committed``, an observer, the punctuation's stream queries); nothing is left to end.
        committed = root is not None and root.state is TxnState.COMMITTED
        if root is not None and not committed:
            lowlevel.abandon(root, error)
        culprit = event_in_progress() if rule_late and not committed else None
        if culprit is not None:
            assert firing is not None and self.deadlines.rule is not None
            reason = (f"{rule_past_deadline(firing.rule, self.deadlines.rule)} on this event: the batch was applied "
                      f"without it (fix the rule, then replay this dead letter)")
            letter = BatchLetters(rows, batch.query_id, batch.batch_id, self.mapping).for_events([(culprit, reason)])[0]
            try:
                error.letter_id = deadletters.insert_ahead(self.db, batch.query_id, batch.batch_id, culprit.position,
                                                           letter)
            except Exception as failure:       # (PostgreSQL unusable: the re-run meets the rule again)
                logger.exception("%s: the dead letter of the event whose rule did not return could not be written",
                                 where)
                error.letter_error = failure
        error.settle(blamed=culprit is not None, batch_deadline=not rule_late, committed=committed)
        raise error

    # -- the report -----------------------------------------------------------------------------------

    def _report(self, batch: BatchInProgress) -> bool:
        """Write (or refresh) ``batch``'s row of ``activedb_batches_in_progress``; False if it could not be written
        (the failure is logged: reporting never fails a batch)."""
        from sqlalchemy.dialects import postgresql

        now = dt.datetime.now(_UTC)
        firing = batch.firing
        values = {"query_id": batch.query_id, "query_name": batch.query_name, "batch_id": batch.batch_id,
                  "rows": batch.rows, "host": self._host, "pid": self._pid, "started_at": batch.started_at,
                  "reported_at": sa.func.now(),
                  "deadline_at": None if batch.deadline_in is None else now + dt.timedelta(seconds=batch.deadline_in),
                  "firing_rule": None if firing is None else firing.rule,
                  "firing_event": None if firing is None else firing.event,
                  "firing_started_at": None if firing is None else now - dt.timedelta(seconds=firing.seconds)}
        try:
            table = self.db.table(PROGRESS_TABLE)
            statement = postgresql.insert(table).values(**values)
            statement = statement.on_conflict_do_update(index_elements=[table.c.query_id], set_={
                name: statement.excluded[name] for name in values if name != "query_id"})
            with self.db.engine.begin() as connection:
                connection.execute(statement)
            return True
        except Exception:
            logger.warning("could not report batch %s of %s in progress", batch.batch_id, batch.query_id,
                           exc_info=True)
            return False

    def _unreport(self, query_id: str) -> None:
        try:
            table = self.db.table(PROGRESS_TABLE)
            with self.db.engine.begin() as connection:
                connection.execute(table.delete().where(table.c.query_id == query_id, table.c.pid == self._pid,
                                                        table.c.host == self._host))
        except Exception:
            logger.warning("could not remove the report of %s's batch in progress", query_id, exc_info=True)

    def close(self) -> None:
        """Stop the watch's thread (unless it was abandoned) and its clock."""
        self.db.transactions.observers.remove(self.clock)
        if self.abandoned is None:
            self._runner.close()

