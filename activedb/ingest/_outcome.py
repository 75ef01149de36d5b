"""What a sink reports: :class:`PhaseTimings`, :class:`BatchOutcome`, :class:`IngestStatistics`, and
:class:`BatchBook`, the bookkeeping of a sink's batches (the phases its ``on_phase`` hook hears, the
counters, the batches in progress) that every Spark path records through.  Design note: the package's
``README.md``."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import datetime as dt
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

from activedb.ingest._interface import Phase, Rows, row_count

__all__ = ["RECENT_OUTCOMES", "BatchBook", "BatchInProgress", "BatchOutcome", "FiringInProgress",
           "IngestStatistics", "PhaseTimings"]

_UTC = dt.timezone.utc

#: How many batch outcomes :meth:`Ingestion.recent_outcomes` keeps (like Spark's recentProgress).
RECENT_OUTCOMES = 100


@dataclass(frozen=True)
class PhaseTimings:
    """Seconds spent per phase (summed over batches). Immutable.

    ``to_arrow``: ``batch_df.toArrow()`` (runs the Spark job of the batch);
    ``validate``: ``rows_to_events`` and the late-event split;
    ``engine``: the per-event subtransactions (immediate rules, and deferred rules, which
    an event's subtransaction runs before it commits) plus the dead-letter inserts;
    ``commit``: the top-level commit up to its flush (top-level deferred rules, waiting
    for children);
    ``flush``: the engine's PostgreSQL transaction (validation, ledger row, write set,
    transaction log, commit), the lock release after it and the one collection of the batch's
    garbage (``activedb._gc.no_cyclic_gc``).
    """

    to_arrow: float = 0.0
    validate: float = 0.0
    engine: float = 0.0
    commit: float = 0.0
    flush: float = 0.0

    def __add__(self, other: "PhaseTimings") -> "PhaseTimings":
        # (Field by field: ``dataclasses.astuple`` deep-copies each value through a recursive walk, a cost per batch
        # the sink pays several times.)
        return PhaseTimings(self.to_arrow + other.to_arrow, self.validate + other.validate,
                            self.engine + other.engine, self.commit + other.commit, self.flush + other.flush)


@dataclass(frozen=True)
class BatchOutcome:
    """What :meth:`Ingestion.process <activedb.ingest.Ingestion.process>` did with one batch. Immutable."""

    query_id: str
    batch_id: int
    committed: bool  # False: the ledger already had (query_id, batch_id); nothing was applied
    rows: int
    events: int  # events applied (their subtransactions committed)
    dead_letters: int  # rejected rows + late events + events the rules rejected
    rule_firings: Mapping[str, int]
    watermark: dt.datetime | None
    timings: PhaseTimings
    attempts: int = 1  # top-level transactions it took (serialization conflicts re-run the batch)
    seconds: float = 0.0  # wall time in the sink, toArrow included (set when recorded)


@dataclass(frozen=True)
class IngestStatistics:
    """A snapshot of an ingestion's progress, for the CLI's progress line. Immutable.

    ``query_id`` is the ledger id of the last run the ingestion saw (None before any).
    ``events_per_second`` is over the wall time from the first batch's start to the last
    batch's end (so it does not decay while the stream is idle);
    ``last_batch_events_per_second`` over the last committed batch's time in the sink.
    ``watermark_lag_seconds`` is the time of day by the database's clock (``db.clock.wall()``, which a test may
    drive: ``activedb.clock.ManualClock``) minus the watermark (None without one).
    """

    query_name: str
    query_id: str | None
    batches: int
    batches_skipped: int
    last_batch_id: int | None
    rows: int
    events: int
    dead_letters: int
    rule_firings: Mapping[str, int]
    watermark: dt.datetime | None
    watermark_lag_seconds: float | None
    events_per_second: float
    last_batch_events_per_second: float | None
    seconds_in_sink: float
    timings: PhaseTimings = field(default_factory=PhaseTimings)


@dataclass(frozen=True)
class FiringInProgress:
    """The oldest rule firing still running in a batch.  Immutable."""

    rule: str
    event: str              # the event it runs on, described (``Event.describe()``)
    seconds: float          # how long it has run
    transaction: str        # the id of the transaction it runs in


@dataclass(frozen=True)
class BatchInProgress:
    """A batch an ingestion is running now.  Immutable.  ``firing``: its oldest rule firing still running (a
    watched ingestion's only); ``deadline_in``: seconds until its first deadline passes (None: no deadline)."""

    query_id: str           # the run's ledger id
    query_name: str         # the source
    batch_id: int
    rows: int
    started_at: dt.datetime
    seconds: float
    firing: FiringInProgress | None = None
    deadline_in: float | None = None


class BatchBook:
    """The bookkeeping of one sink's batches: ``on_phase(phase, batch_id)`` (a :class:`Phase`), the
    counters behind :class:`IngestStatistics`, the last :data:`RECENT_OUTCOMES` outcomes, the batches in
    progress and the last failure.

    Thread-safety: ``_mutex`` protects every field below it; ``on_phase`` is called without it.
    """

    def __init__(self, query_name: str, on_phase: Callable[[Phase, int], None] | None = None, *,
                 wall: Callable[[], dt.datetime]):
        self.query_name = query_name
        self._on_phase = on_phase
        #: The time of day the watermark's lag is measured against (the database's clock: ``db.clock.wall``).
        self._wall = wall
        self._mutex = threading.Lock()
        self._query_id: str | None = None
        self._counters = dict(batches=0, batches_skipped=0, rows=0, events=0, dead_letters=0, seconds_in_sink=0.0)
        self._last_batch_id: int | None = None
        #: ``(query id, batch id)`` of the last batch this book saw committed (applied, or found in the ledger).
        self._last_committed: tuple[str, int] | None = None
        self._rule_firings: collections.Counter[str] = collections.Counter()
        self._watermark: dt.datetime | None = None
        self._timings = PhaseTimings()
        self._first_batch_began: float | None = None
        self._last_batch_ended: float | None = None
        self._last_batch_rate: float | None = None
        self._recent: collections.deque[BatchOutcome] = collections.deque(maxlen=RECENT_OUTCOMES)
        self._last_failure: tuple[int, BaseException] | None = None
        self._in_batch = 0  # Invariant: number of __call__/process calls currently running (>= 0)
        #: The batch running on its caller's thread: (query id, batch id, rows, since: monotonic, since: UTC);
        #: replaced whole by one reference store, read without the mutex.
        self._current: tuple[str, int, int, float, dt.datetime] | None = None
        self._idle = threading.Condition(self._mutex)

    # -- phases -----------------------------------------------------------------------------------

    @property
    def hears_phases(self) -> bool:
        """Whether an ``on_phase`` listens (else :meth:`phase` does nothing, and a flush need not stop for it)."""
        return self._on_phase is not None

    def phase(self, phase: Phase, batch_id: int) -> None:
        """Tell ``on_phase`` that batch ``batch_id`` reached ``phase`` (a member: the callers inside the package
        pass one; :meth:`Ingestion.phase <activedb.ingest.Ingestion.phase>` parses a connector's)."""
        if self._on_phase is not None:
            self._on_phase(phase, batch_id)

    def skipped(self, query_id: str, batch_id: int, row_count: int, watermark: dt.datetime | None,
                timings: PhaseTimings, began: float) -> BatchOutcome:
        """Record a batch the ledger already had; returns its outcome.  Not as committed (:meth:`committed`): the batch
        after one the ledger had before it ran — a re-delivery — is likely re-delivered too, so
        :meth:`follows_committed` leaves it to the ledger."""
        self.phase(Phase.SKIPPED, batch_id)
        return self.record(BatchOutcome(query_id, batch_id, False, row_count, 0, 0, {}, watermark, timings), began)

    def committed(self, query_id: str, batch_id: int) -> None:
        """Batch ``batch_id`` of ``query_id`` committed (its transaction did, or its commit was refused as a duplicate
        run's)."""
        with self._mutex:
            self._last_committed = (query_id, batch_id)

    def committed_any(self, query_id: str) -> bool:
        """True if this book committed a batch of ``query_id`` last (:meth:`committed`)."""
        with self._mutex:
            return self._last_committed is not None and self._last_committed[0] == query_id

    def follows_committed(self, query_id: str, batch_id: int) -> bool:
        """True if the batch before ``batch_id`` of ``query_id`` is the last one this book committed (not one the
        ledger had before it ran: :meth:`skipped`): Spark runs a query's batches in order, so ``batch_id`` is then new
        to the ledger but for a duplicate run of the query, which the ledger's row at the flush refuses
        (``BatchAlreadyCommitted``)."""
        with self._mutex:
            return self._last_committed == (query_id, batch_id - 1)

    # -- batches in progress, failures ------------------------------------------------------------

    @contextlib.contextmanager
    def running(self, query_id: str, batch_id: int, rows: Rows) -> Iterator[None]:
        """Batch ``batch_id`` of ``query_id`` (``rows``) runs on the caller's thread while the block runs (an
        ingestion without deadlines: its :class:`~activedb.ingest._watch.Watch` knows its own)."""
        self._current = (query_id, batch_id, row_count(rows), time.monotonic(), dt.datetime.now(_UTC))  # (one store)
        try:
            yield
        finally:
            self._current = None

    def in_progress(self) -> BatchInProgress | None:
        """The batch running now, or None (its firings are not known here: a watched ingestion's are)."""
        current = self._current
        if current is None:
            return None
        query_id, batch_id, count, started, started_at = current
        return BatchInProgress(query_id, self.query_name, batch_id, count, started_at, time.monotonic() - started)

    @contextlib.contextmanager
    def in_batch(self) -> Iterator[None]:
        """Counts a batch in progress while the block runs (``wait_idle`` waits for none)."""
        with self._mutex:
            self._in_batch += 1
            if self._first_batch_began is None:
                self._first_batch_began = time.perf_counter()
        try:
            yield
        finally:
            with self._mutex:
                self._in_batch -= 1
                self._idle.notify_all()

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until no batch is being processed; False if ``timeout`` passed first (None or infinity: no limit)."""
        # (threading waits at most TIMEOUT_MAX, some 292 years, and raises OverflowError beyond: that is no limit)
        unbounded = timeout is None or timeout >= threading.TIMEOUT_MAX
        with self._idle:
            return self._idle.wait_for(lambda: self._in_batch == 0, None if unbounded else timeout)

    def failed(self, batch_id: int, error: BaseException) -> None:
        with self._mutex:
            self._last_failure = (batch_id, error)

    def last_failure(self) -> tuple[int, BaseException] | None:
        with self._mutex:
            return self._last_failure

    def running_as(self, query_id: str) -> None:
        """The ledger query id of the run (before its first batch is recorded)."""
        with self._mutex:
            self._query_id = query_id

    # -- outcomes and statistics ------------------------------------------------------------------

    def record(self, outcome: BatchOutcome, began: float) -> BatchOutcome:
        """Count ``outcome`` (a batch that began at ``time.perf_counter()`` ``began``); returns it with its ``seconds``,
        the outcome counted — the one to hand on.  A run's end-of-stream release (a negative batch number:
        ``END_OF_STREAM_BATCH``) adds its events and dead letters, not a batch."""
        ended = time.perf_counter()
        elapsed = ended - began
        outcome = dataclasses.replace(outcome, seconds=elapsed)
        release = outcome.batch_id < 0
        with self._mutex:
            counters = self._counters
            self._last_batch_ended = ended
            self._query_id = outcome.query_id       # the last run seen (Ingestion.end_of_stream's default)
            if not release:
                self._last_batch_id = outcome.batch_id
            counters["rows"] += outcome.rows
            self._timings = self._timings + outcome.timings
            counters["seconds_in_sink"] += elapsed
            self._recent.append(outcome)
            if outcome.watermark is not None and (self._watermark is None or outcome.watermark > self._watermark):
                self._watermark = outcome.watermark
            if not outcome.committed:
                counters["batches_skipped"] += 0 if release else 1
                return outcome
            counters["batches"] += 0 if release else 1
            counters["events"] += outcome.events
            counters["dead_letters"] += outcome.dead_letters
            self._rule_firings.update(outcome.rule_firings)
            self._last_batch_rate = outcome.events / elapsed if elapsed > 0 else None
        return outcome

    def recent_outcomes(self) -> list[BatchOutcome]:
        with self._mutex:
            return list(self._recent)

    def statistics(self) -> IngestStatistics:
        with self._mutex:
            watermark = self._watermark
            lag = None if watermark is None else (self._wall() - watermark).total_seconds()
            elapsed = (0.0 if self._first_batch_began is None or self._last_batch_ended is None
                       else self._last_batch_ended - self._first_batch_began)
            return IngestStatistics(
                query_name=self.query_name, query_id=self._query_id, last_batch_id=self._last_batch_id,
                rule_firings=dict(self._rule_firings), watermark=watermark, watermark_lag_seconds=lag,
                events_per_second=self._counters["events"] / elapsed if elapsed > 0 else 0.0,
                last_batch_events_per_second=self._last_batch_rate, timings=self._timings,
                **self._counters)  # type: ignore[arg-type]  # (counts ints, seconds_in_sink a float)
