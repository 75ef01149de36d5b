"""The rule-layer sink: one micro-batch → one activedb transaction, exactly once.

:class:`IngestSink` is the ``foreachBatch`` callable behind :func:`spark_bridge.ingest`.
For batch ``b`` of the query with ledger id ``q`` (see ``_ledger.py``):

1. ``batch_df.toArrow()`` — always, even for a batch that will be skipped: running the
   batch is what feeds Spark's event-time statistics, so skipping the job on a replay
   would hold the next batches' watermark back and make a restarted run differ from an
   uninterrupted one;
2. ``batch_committed(db, q, b)`` — a replayed batch that already committed stops here;
3. :func:`~spark_bridge.mapping.rows_to_events` — rows become events sorted by
   application time, bad rows become dead letters; events older than the batch's
   watermark become dead letters too (*late*, Spark's own lateness rule), so that no
   applied event contradicts a punctuation already given;
4. ``with db.transaction(participants=[ledger]) as tx`` — every event in its own
   subtransaction (``sub.emit``: the rules on ``db.stream(type)`` fire inside it); a failing
   event aborts only its subtransaction and becomes a dead letter; dead letters are inserted
   in ``tx``; the :class:`~spark_bridge._ledger.IngestionLedger` participant gets ``events``
   (applied), ``dead_letters`` and ``watermark`` and writes the ledger row inside the engine's
   flush, so the ledger row, the effects and the dead letters commit in **one** PostgreSQL
   transaction. ``BatchAlreadyCommitted`` at the flush (a concurrent duplicate) means
   skipped; a ``SerializationConflict`` (another process changed rows the batch read)
   re-runs the whole batch, at most ``batch_attempts`` times;
5. ``db.punctuate(query_name, watermark)`` once the batch committed.

The per-batch work (steps 2–5) is :meth:`IngestSink.process`, which also runs without Spark
(a ``pyarrow.Table`` or a list of dicts) and inside the scale-out tasks.

Thread-safety: ``_mutex`` protects the statistics and the per-query bookkeeping; Spark
calls ``foreachBatch`` one batch at a time per query, and :meth:`process` may also be
called from several threads (each call runs its own top-level transaction). No mutex is
held while calling Spark, the engine or PostgreSQL.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import datetime as dt
import gc
import logging
import threading
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from activedb import CommitParticipant, TxnState
from activedb.deadletters import Letter

from spark_bridge._atomic import lineage_participants
from spark_bridge._letters import BatchLetters
from spark_bridge._ledger import (
    IngestionLedger,
    batch_committed,
    check_not_renamed,
    ingested_event_ids,
    last_watermark,
    ledger_query_id,
)
from spark_bridge.errors import IngestError, MappingError
from spark_bridge.mapping import EventMapping, RawEvent, as_mapping, rows_to_events

__all__ = ["BatchOutcome", "IngestSink", "IngestStatistics", "PhaseTimings"]

logger = logging.getLogger("spark_bridge.ingest")

_UTC = dt.timezone.utc
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=_UTC)
_QUERY_ID_PROPERTY = "sql.streaming.queryId"
_ACTIVE = TxnState.ACTIVE


def _emit(sub: Any, event: RawEvent) -> None:
    """The body of an event's subtransaction: hand it to the rules on ``db.stream(type)``."""
    sub.emit(event.event_type, key=event.key, ts=event.ts, payload=event.payload)

#: Phases reported to ``on_phase(phase, batch_id)``:
#: ``fetched``  — rows are in Python (after ``toArrow``), nothing written;
#: ``flush``    — inside the engine's flush: the PostgreSQL transaction holds the ledger
#:                row, the effects and the dead letters, and is about to commit;
#: ``committed`` — the batch committed (before the punctuation and before Spark's commit log);
#: ``skipped``  — the ledger already had the batch.
PHASES = ("fetched", "flush", "committed", "skipped")

#: How many batch outcomes :meth:`IngestSink.recent_outcomes` keeps (like Spark's recentProgress).
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
    transaction log, commit) and the lock release after it.
    """

    to_arrow: float = 0.0
    validate: float = 0.0
    engine: float = 0.0
    commit: float = 0.0
    flush: float = 0.0

    def __add__(self, other: "PhaseTimings") -> "PhaseTimings":
        return PhaseTimings(*(mine + theirs for mine, theirs in zip(self.as_tuple(), other.as_tuple())))

    def as_tuple(self) -> tuple[float, float, float, float, float]:
        return (self.to_arrow, self.validate, self.engine, self.commit, self.flush)

    @property
    def total(self) -> float:
        return sum(self.as_tuple())


@dataclass(frozen=True)
class BatchOutcome:
    """What :meth:`IngestSink.process` did with one batch. Immutable."""

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

    ``events_per_second`` is over the wall time from the first batch's start to the last
    batch's end (so it does not decay while the stream is idle);
    ``last_batch_events_per_second`` over the last committed batch's time in the sink.
    ``watermark_lag_seconds`` is wall-clock now minus the watermark (None without one).
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


def _walk_causes(error: BaseException):
    from activedb.errors import causes

    return causes(error)


def _is_infrastructure_failure(error: BaseException) -> bool:
    """True if ``error`` means PostgreSQL is unusable (the batch must fail, not the event)."""
    import sqlalchemy as sa

    from activedb.errors import DatabaseUnavailable

    return any(isinstance(cause, (DatabaseUnavailable, sa.exc.OperationalError, sa.exc.InterfaceError))
               for cause in _walk_causes(error))


def _conflict_in(error: BaseException) -> BaseException | None:
    """The ``SerializationConflict`` behind ``error``, if another process (or a sequence reset) got in the way:
    not the event's fault — the batch is re-run."""
    from activedb.errors import SerializationConflict

    return next((cause for cause in _walk_causes(error) if isinstance(cause, SerializationConflict)), None)


def _is_deadlock(error: BaseException) -> bool:
    from lockmgr import Deadlock

    return any(isinstance(cause, Deadlock) for cause in _walk_causes(error))


def _is_poison_failure(error: BaseException) -> bool:
    """PostgreSQL refused the commit because of the values written (a data exception, an integrity or a
    size limit: SQLSTATE classes 22, 23, 54, or the engine's own DuplicateKey/InvalidValue at the flush) —
    something an event caused, as opposed to the server (disk full, connection) or a conflict."""
    from activedb.errors import DatabaseError, DuplicateKey, InvalidValue

    if _is_infrastructure_failure(error):
        return False
    if isinstance(error, (DuplicateKey, InvalidValue)):
        return True
    return isinstance(error, DatabaseError) and (error.sqlstate or "")[:2] in ("22", "23", "54")


def _poison_reason(error: BaseException) -> str:
    text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return f"PostgreSQL refused this event's writes at the commit: {text}"


def _reason_of(pairs: list[tuple[Any, str]]) -> Callable[[Any], str]:
    reasons = {id(item): reason for item, reason in pairs}
    return lambda item: reasons[id(item)]


class _TrialPassed(Exception):
    """A trial flush got everything written: roll it back."""


class _TrialStop(CommitParticipant):
    """Turns a flush into a trial: everything is written, then the transaction is rolled back."""

    def about_to_commit(self, transaction: Any, connection: Any) -> None:
        raise _TrialPassed()


def _rejection_reason(error: BaseException) -> str:
    from activedb.errors import CascadeLimitExceeded, RuleFailed

    if isinstance(error, RuleFailed):
        return f"rejected by rule {error.rule!r}: {error}"
    if isinstance(error, CascadeLimitExceeded):
        return f"rule cascade limit: {error}"
    return f"event processing failed: {type(error).__name__}: {error}"


@contextlib.contextmanager
def _no_cyclic_gc():
    """Pause the cyclic garbage collector while a batch's events run.  Every event leaves records that
    live until the batch's tree ends (the lock manager keeps a committed subtransaction's record while
    its tree runs), so the collector would scan a set that only grows, again and again: 12-15 µs of CPU
    per event with one immediate rule, a fifth of the engine's time.  Pausing it changes no peak
    memory (those records are alive anyway); what becomes garbage when the tree ends is collected once
    the collector runs again.  (The pause is process-wide: detached rules running meanwhile run without
    it too; acyclic objects are still freed at once by reference counting.)"""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class IngestSink:
    """``foreachBatch`` callable applying each micro-batch to ``db`` through its rules.

    Arguments (see :func:`spark_bridge.ingest` for the full story):

    * ``query_name`` — the stable name of the query: the punctuation source, and the
      first half of the ledger's query id;
    * ``known_types`` — event types accepted; ``None`` means the types the rules of
      ``db`` listen to (``db.stream(type)``) at the time of each batch;
    * ``prefetch`` — ``{table: how}`` tables to load in one query per batch before the
      events run; ``how`` is ``None`` (the event's key is the row key), a payload field
      name, or a callable ``RawEvent -> key``;
    * ``spark_session`` — the session the query was started from (to read the batch's
      watermark); ``None`` means no watermark unless :meth:`process` is given one;
    * ``on_phase(phase, batch_id)`` — a seam for crash tests (:data:`PHASES`);
    * ``batch_attempts`` — top-level attempts per batch on serialization conflicts;
      ``event_attempts`` — attempts per event when a rule is chosen as deadlock victim;
    * ``handler`` — a ``_handler.BatchHandler`` (stream queries, TPG, composition) that takes the
      batches instead of the per-event rule path (``ingest`` builds it from its arguments);
    * ``event_ids_under`` — the query name whose ingested event ids count for duplicate detection
      (default ``query_name``; a dead-letter replay passes the original query's name).

    Thread-safety: see the module docstring.
    """

    #: Record each batch transaction's lineage (it consumed the source batch; ``spark_bridge/_atomic.py``),
    #: in its own flush. ``ingest(..., lineage=False)`` sets it False on the sink.
    record_lineage: bool = True

    def __init__(
        self,
        db: Any,
        mapping: EventMapping,
        *,
        query_name: str,
        known_types: Collection[str] | None = None,
        prefetch: Mapping[str, Any] | None = None,
        spark_session: Any = None,
        on_phase: Callable[[str, int], None] | None = None,
        batch_attempts: int = 3,
        event_attempts: int = 3,
        handler: Any = None,
        event_ids_under: str | None = None,
    ) -> None:
        try:
            mapping = as_mapping(mapping)
        except MappingError as error:
            raise IngestError(f"mapping: {error}") from None
        if not isinstance(query_name, str) or not query_name.strip():
            raise IngestError("query_name must be a non-empty string (it names the query in the ledger)")
        if batch_attempts < 1 or event_attempts < 1:
            raise IngestError("batch_attempts and event_attempts must be at least 1")
        self.db = db
        self.mapping = mapping
        self.query_name = query_name
        self._known_types = None if known_types is None else frozenset(known_types)
        self._prefetch = dict(prefetch or {})
        self._spark_session = spark_session
        self._on_phase = on_phase
        self._batch_attempts = batch_attempts
        self._event_attempts = event_attempts
        #: Where the batches go instead of the per-event rule path (``_handler.BatchHandler``: queries,
        #: tpg, composite), or None.  Set once here, never changed.
        self.handler = handler
        #: The query name event ids are kept under for duplicate detection (``EventMapping.id_column``): the
        #: query's own name, or for a dead-letter replay the name of the query the letter came from — one
        #: scope for a query and its replays.
        self.event_ids_under = event_ids_under or query_name
        # self._mutex protects everything below.
        self._mutex = threading.Lock()
        self._checked_spark_ids: set[str] = set()
        self._watermark_warning_given = False
        self._query_id: str | None = None
        self._batches = 0
        self._batches_skipped = 0
        self._last_batch_id: int | None = None
        self._rows = 0
        self._events = 0
        self._dead_letters = 0
        self._rule_firings: dict[str, int] = {}
        self._watermark: dt.datetime | None = None
        self._timings = PhaseTimings()
        self._seconds_in_sink = 0.0
        self._first_batch_began: float | None = None
        self._last_batch_ended: float | None = None
        self._last_batch_rate: float | None = None
        self._recent: collections.deque[BatchOutcome] = collections.deque(maxlen=RECENT_OUTCOMES)
        self._last_failure: tuple[int, BaseException] | None = None
        self._in_batch = 0  # Invariant: number of __call__/process calls currently running (>= 0)
        self._idle = threading.Condition(self._mutex)

    # -- foreachBatch entry point -------------------------------------------------------------

    def __call__(self, batch_df: Any, batch_id: int) -> None:
        self._enter()
        try:
            spark_query_id = batch_df.sparkSession.sparkContext.getLocalProperty(_QUERY_ID_PROPERTY)
            if not spark_query_id:
                raise IngestError("IngestSink must run as foreachBatch of a streaming query (no query id)")
            query_id = self._query_id_for(spark_query_id)
            started = time.perf_counter()
            table = batch_df.toArrow()
            to_arrow = time.perf_counter() - started
            watermark = self.spark_watermark(spark_query_id)
            self._phase("fetched", batch_id)
            self.process(table, batch_id, query_id=query_id, watermark=watermark,
                         extra_timings=PhaseTimings(to_arrow=to_arrow), _counted=True)
        except BaseException as error:
            self._failed(batch_id, error)
            raise
        finally:
            self._leave()

    def _failed(self, batch_id: int, error: BaseException) -> None:
        """Remember why a batch failed: Spark wraps the error in a Java stack trace (what ``activedb run``
        prints is this instead)."""
        with self._mutex:
            self._last_failure = (batch_id, error)

    def last_failure(self) -> tuple[int, BaseException] | None:
        """``(batch id, the Python exception)`` of the last batch that raised out of the sink, or None."""
        with self._mutex:
            return self._last_failure

    def spark_watermark(self, spark_query_id: str) -> dt.datetime | None:
        """Spark's event-time watermark of the batch now running in query ``spark_query_id``.

        That is ``batchWatermarkMs`` of the batch's offset-log entry: the maximum event time
        of the batches before it minus the delay given to ``withWatermark``; the same value
        when Spark re-runs the batch after a restart. ``None`` when the query declares no
        watermark (Spark reports 0), when the sink has no ``spark_session``, or when this
        Spark version does not expose it (logged once).
        """
        session = self._spark_session
        if session is None:
            return None
        try:
            query = session.streams.get(spark_query_id)
            if query is None:
                return None
            # StreamExecution.lastExecution is the IncrementalExecution of the running batch.
            millis = int(query._jsq.streamingQuery().lastExecution().offsetSeqMetadata().batchWatermarkMs())
        except Exception as error:  # py4j: an internal API that may move between Spark versions
            with self._mutex:
                warn, self._watermark_warning_given = not self._watermark_warning_given, True
            if warn:
                logger.warning("cannot read the batch watermark from Spark (%r); no punctuation is given", error)
            return None
        return None if millis <= 0 else _EPOCH + dt.timedelta(milliseconds=millis)

    # -- one batch ----------------------------------------------------------------------------

    def process(
        self,
        rows: Any,
        batch_id: int,
        *,
        query_id: str,
        watermark: dt.datetime | None = None,
        extra_timings: PhaseTimings | None = None,
        punctuate: bool = True,
        participants: Collection[Any] = (),
        _counted: bool = False,
    ) -> BatchOutcome:
        """Apply one batch (a ``pyarrow.Table``/``RecordBatch`` or a list of dicts) as
        ``(query_id, batch_id)``, exactly once. ``watermark``: events older than it are dead
        letters, and it is punctuated after the commit (``punctuate=False``: the caller does).
        Raises only when the batch could not be committed (PostgreSQL unusable, conflicts
        beyond ``batch_attempts``); the batch may then be re-run.  ``participants``: more commit
        participants of the batch's transaction (a dead-letter replay marks its letter there); one that
        raises ``BatchAlreadyCommitted`` makes the batch skipped."""
        if not _counted:
            self._enter()
        try:
            participants = (*participants, *lineage_participants(self.db, query_id, batch_id, self.record_lineage))
            return self._process(rows, batch_id, query_id, watermark, extra_timings or PhaseTimings(), punctuate,
                                 participants)
        finally:
            if not _counted:
                self._leave()

    def _process(self, rows, batch_id, query_id, watermark, timings, punctuate, participants=()) -> BatchOutcome:
        if self.handler is not None:
            from spark_bridge._handler import process_with_handler

            return process_with_handler(self, self.handler, rows, batch_id, query_id, watermark, timings, punctuate,
                                        participants)
        began = time.perf_counter() - timings.to_arrow
        row_count = rows.num_rows if hasattr(rows, "num_rows") else len(rows)
        if batch_committed(self.db, query_id, batch_id):
            return self._skipped(query_id, batch_id, row_count, watermark, timings, began)

        started = time.perf_counter()
        with _no_cyclic_gc():        # 100k new events at once: the collector would rescan them repeatedly
            good, bad = rows_to_events(rows, self.mapping, self.known_types())
        dead = BatchLetters(self.db, rows, query_id, batch_id)
        letters = dead.rejected(bad)
        if watermark is not None:
            on_time = [event for event in good if event.ts >= watermark]
            if len(on_time) != len(good):
                late = [event for event in good if event.ts < watermark]
                letters += dead.for_events(late, lambda event: (
                    f"late: {self.mapping.ts_column} {event.ts.isoformat()} is older than the stream's "
                    f"watermark {watermark.isoformat()} (Spark's lateness rule)"))
                good = on_time
        if self.mapping.id_column is not None:
            good, duplicates = self._without_duplicates(good)
            letters += dead.for_events([event for event, _ in duplicates], _reason_of(duplicates))
        timings = timings + PhaseTimings(validate=time.perf_counter() - started)

        from activedb.errors import BatchAlreadyCommitted, SerializationConflict

        attempt = 0
        while True:
            attempt += 1
            try:
                applied, dead_letters, firings, phase_timings = self._apply(
                    dead, good, letters, watermark, participants)
                break
            except BatchAlreadyCommitted:
                return self._skipped(query_id, batch_id, row_count, watermark, timings, began)
            except SerializationConflict:
                if attempt >= self._batch_attempts:
                    raise
                logger.info("batch %s of %s conflicted with another process; re-running it (%d of %d)",
                            batch_id, query_id, attempt + 1, self._batch_attempts)
            except Exception as failure:
                if not _is_poison_failure(failure):
                    raise
                # PostgreSQL refused the batch's commit because of what some event wrote (a key too large
                # for its index, a constraint): find those events, dead-letter them, apply the rest.
                culprits = self._find_culprits(good, failure)
                logger.warning("batch %s of %s: PostgreSQL refused the writes of %d event(s); they become dead "
                               "letters and the batch is applied without them", batch_id, query_id, len(culprits))
                letters = letters + dead.for_events([event for event, _ in culprits], _reason_of(culprits))
                gone = {id(event) for event, _ in culprits}
                good = [event for event in good if id(event) not in gone]
                attempt -= 1       # not a conflict: the batch gets its attempts again
        timings = timings + phase_timings
        self._phase("committed", batch_id)
        if punctuate and watermark is not None:
            self.db.punctuate(self.query_name, watermark)
        outcome = BatchOutcome(query_id, batch_id, True, row_count, applied, dead_letters, firings, watermark,
                               timings, attempt)
        self._record(outcome, began)
        return outcome

    def _apply(self, dead: BatchLetters, events: list[RawEvent], letters: list[Letter], watermark: dt.datetime | None,
               participants: tuple = ()):
        """One top-level transaction for the batch; returns (applied, dead letters, firings, timings)."""
        started = time.perf_counter()
        ledger = IngestionLedger(self.db, dead.query_id, dead.batch_id, on_flush=self._flush_reached)
        if self.mapping.id_column is not None:
            ledger.query_name = self.event_ids_under
        with self.db.transaction(name=f"ingest:{self.query_name}", participants=[ledger, *participants]) as tx:
            # The batch is re-run until it commits (by this sink after a conflict, by Spark after a crash):
            # an aborted attempt is not an outcome for the detached rules it fired.
            self.db.outbox.mark_replayed(tx)
            self._prefetch_rows(tx, events)
            applied = 0
            failed: list[tuple[RawEvent, str]] = []
            with _no_cyclic_gc():
                for event in events:
                    reason = self._apply_event(tx, event)
                    if reason is None:
                        applied += 1
                    else:
                        failed.append((event, reason))
            if failed:
                letters = letters + dead.for_events([event for event, _ in failed], _reason_of(failed))
            if self.mapping.id_column is not None:    # the ids of the events applied: a rejected one may come again
                refused = {id(event) for event, _ in failed}
                ledger.event_ids = [event.event_id for event in events if id(event) not in refused]
            dead.insert(tx, letters)
            ledger.events = applied
            ledger.dead_letters = len(letters)
            ledger.watermark = watermark
            exit_began = time.perf_counter()
        # Leaving the block committed the transaction, flush included (or raised).
        ended = time.perf_counter()
        flush_began = ledger.flush_began or ended
        timings = PhaseTimings(engine=exit_began - started, commit=max(0.0, flush_began - exit_began),
                               flush=ended - min(max(flush_began, exit_began), ended))
        return applied, len(letters), dict(ledger.rule_firings), timings

    # -- poison: events whose writes PostgreSQL refuses ---------------------------------------------

    def _trial(self, events: list[RawEvent]) -> BaseException | None:
        """Apply ``events`` in a transaction that is flushed and then rolled back; the refusal of a poison
        failure, or None if PostgreSQL took everything."""
        stop = _TrialStop()
        try:
            with self.db.transaction(name=f"trial:{self.query_name}", participants=[stop]) as tx:
                self.db.outbox.mark_replayed(tx)
                self._prefetch_rows(tx, events)
                for event in events:
                    self._apply_event(tx, event)
        except _TrialPassed:
            return None
        except Exception as failure:
            if _is_poison_failure(failure):
                return failure
            raise
        raise AssertionError("unreachable: a trial never commits")

    def _find_culprits(self, events: list[RawEvent], failure: BaseException) -> list[tuple[RawEvent, str]]:
        """The events whose writes make PostgreSQL refuse the batch, each with PostgreSQL's reason.

        Halves are tried on their own (flushed and rolled back), recursively: a poison event makes every set
        it is in fail, so about 2n event applications and log2(n) rounds find one.  If a failure needs events
        of both halves (two events inserting the same key), the first prefix of the batch that fails names
        the culprit instead.  If even no event at all fails, the batch itself is the problem: raised."""
        if not events or self._trial([]) is not None:
            raise failure

        def search(subset: list[RawEvent], known: BaseException | None) -> list[tuple[RawEvent, str]]:
            refusal = known if known is not None else self._trial(subset)
            if refusal is None:
                return []
            if len(subset) == 1:
                return [(subset[0], _poison_reason(refusal))]
            middle = len(subset) // 2
            found = search(subset[:middle], None) + search(subset[middle:], None)
            if found:
                return found
            low, high = 1, len(subset)           # subset[:high] fails; find the shortest failing prefix
            while low < high:
                probe = (low + high) // 2
                if self._trial(subset[:probe]) is None:
                    low = probe + 1
                else:
                    high = probe
            culprit = subset[low - 1]
            return [(culprit, _poison_reason(self._trial(subset[:low]) or refusal)
                     + " (together with an earlier event of the batch)")]

        return search(events, failure)

    def _without_duplicates(self, events: list[RawEvent]) -> tuple[list[RawEvent], list[tuple[RawEvent, str]]]:
        """Split off events whose id was already ingested under this query name, or appeared earlier in
        the batch (the first occurrence, in application-time order, is applied)."""
        seen = ingested_event_ids(self.db, self.event_ids_under, [event.event_id for event in events])
        first: dict[str, RawEvent] = {}
        kept, duplicates = [], []
        for event in events:
            if event.event_id in seen:
                query_id, batch = seen[event.event_id]
                duplicates.append((event, f"duplicate: event id {event.event_id!r} was already ingested in batch "
                                          f"{batch} of {query_id}"))
            elif event.event_id in first:
                duplicates.append((event, f"duplicate: event id {event.event_id!r} appears more than once in "
                                          f"this batch (row {first[event.event_id].position} was applied)"))
            else:
                first[event.event_id] = event
                kept.append(event)
        return kept, duplicates

    def _apply_event(self, tx: Any, event: RawEvent) -> str | None:
        """Run ``event`` in its own subtransaction of ``tx``; None if it committed, else why not.

        Raises when the batch itself cannot go on (``tx`` unusable, PostgreSQL down)."""
        for attempt in range(1, self._event_attempts + 1):
            try:
                tx.run_subtransaction(_emit, event, name=f"event:{event.event_type}")
                return None
            except Exception as failure:
                conflict = _conflict_in(failure)
                if conflict is not None:
                    raise conflict from failure   # not the event's fault: the whole batch is re-run
                if _is_infrastructure_failure(failure) or not tx.state is _ACTIVE:
                    raise
                if _is_deadlock(failure) and attempt < self._event_attempts:
                    continue
                return _rejection_reason(failure)
        raise AssertionError("unreachable: the last attempt returns or raises")

    # -- helpers ------------------------------------------------------------------------------

    def known_types(self) -> frozenset[str] | None:
        """The event types accepted now: ``known_types`` if given, else the stream types
        the rules of ``db`` listen to (``None`` — anything — if no rule listens to any)."""
        if self._known_types is not None:
            return self._known_types
        return self.db.rules.stream_types() or None

    def _prefetch_rows(self, tx: Any, events: list[RawEvent]) -> None:
        for table, how in self._prefetch.items():
            if how is None:
                keys = [event.key for event in events]
            elif callable(how):
                keys = [how(event) for event in events]
            else:
                keys = [event.payload.get(how) for event in events]
            keys = [key for key in dict.fromkeys(keys) if key is not None]
            if keys:
                tx.prefetch(table, keys)

    def _query_id_for(self, spark_query_id: str) -> str:
        with self._mutex:
            checked = spark_query_id in self._checked_spark_ids
        query_id = ledger_query_id(self.query_name, spark_query_id)
        if not checked:
            check_not_renamed(self.db, self.query_name, spark_query_id)
            # A restarted driver punctuates again what the ledger last recorded (punctuations
            # live in memory; the ledger row of every batch keeps its watermark durably).
            resumed = last_watermark(self.db, query_id)
            if resumed is not None:
                self.db.punctuate(self.query_name, resumed.astimezone(_UTC))
            with self._mutex:
                self._checked_spark_ids.add(spark_query_id)
        with self._mutex:
            self._query_id = query_id
        return query_id

    def _flush_reached(self, batch_id: int) -> None:
        self._phase("flush", batch_id)

    def _phase(self, phase: str, batch_id: int) -> None:
        if self._on_phase is not None:
            self._on_phase(phase, batch_id)

    def _skipped(self, query_id, batch_id, row_count, watermark, timings, began) -> BatchOutcome:
        self._phase("skipped", batch_id)
        outcome = BatchOutcome(query_id, batch_id, False, row_count, 0, 0, {}, watermark, timings)
        self._record(outcome, began)
        return outcome

    # -- statistics ---------------------------------------------------------------------------

    def _enter(self) -> None:
        with self._mutex:
            self._in_batch += 1
            if self._first_batch_began is None:
                self._first_batch_began = time.perf_counter()

    def _leave(self) -> None:
        with self._mutex:
            self._in_batch -= 1
            self._idle.notify_all()

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until no batch is being processed; False if ``timeout`` passed first."""
        with self._idle:
            return self._idle.wait_for(lambda: self._in_batch == 0, timeout)

    def _record(self, outcome: BatchOutcome, began: float) -> None:
        ended = time.perf_counter()
        elapsed = ended - began
        outcome = dataclasses.replace(outcome, seconds=elapsed)
        with self._mutex:
            self._last_batch_ended = ended
            self._query_id = self._query_id or outcome.query_id
            self._last_batch_id = outcome.batch_id
            self._rows += outcome.rows
            self._timings = self._timings + outcome.timings
            self._seconds_in_sink += elapsed
            self._recent.append(outcome)
            if outcome.watermark is not None and (self._watermark is None or outcome.watermark > self._watermark):
                self._watermark = outcome.watermark
            if not outcome.committed:
                self._batches_skipped += 1
                return
            self._batches += 1
            self._events += outcome.events
            self._dead_letters += outcome.dead_letters
            for rule, count in outcome.rule_firings.items():
                self._rule_firings[rule] = self._rule_firings.get(rule, 0) + count
            self._last_batch_rate = outcome.events / elapsed if elapsed > 0 else None

    def record_outcome(self, outcome: BatchOutcome, began: float) -> None:
        """Count a batch processed elsewhere (the scale-out tasks) in these statistics."""
        self._record(outcome, began)

    def recent_outcomes(self) -> list[BatchOutcome]:
        """The last :data:`RECENT_OUTCOMES` batches' outcomes, oldest first."""
        with self._mutex:
            return list(self._recent)

    def statistics(self) -> IngestStatistics:
        """A consistent snapshot of the counters (see :class:`IngestStatistics`)."""
        with self._mutex:
            watermark = self._watermark
            elapsed = (0.0 if self._first_batch_began is None or self._last_batch_ended is None
                       else self._last_batch_ended - self._first_batch_began)
            snapshot = IngestStatistics(
                query_name=self.query_name,
                query_id=self._query_id,
                batches=self._batches,
                batches_skipped=self._batches_skipped,
                last_batch_id=self._last_batch_id,
                rows=self._rows,
                events=self._events,
                dead_letters=self._dead_letters,
                rule_firings=dict(self._rule_firings),
                watermark=watermark,
                watermark_lag_seconds=None,
                events_per_second=self._events / elapsed if elapsed > 0 else 0.0,
                last_batch_events_per_second=self._last_batch_rate,
                seconds_in_sink=self._seconds_in_sink,
                timings=self._timings,
            )
        if watermark is None:
            return snapshot
        return dataclasses.replace(snapshot,
                                   watermark_lag_seconds=(dt.datetime.now(_UTC) - watermark).total_seconds())

    def close(self) -> None:
        """Release the handler's resources (the TPG path's worker processes); nothing else to release."""
        close = getattr(self.handler, "close", None)
        if callable(close):
            close()
