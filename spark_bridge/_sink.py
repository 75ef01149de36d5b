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

Thread-safety: the sink's :class:`~spark_bridge._outcome.BatchBook` keeps the statistics (its own
mutex); ``_mutex`` protects the per-query bookkeeping.  Spark calls ``foreachBatch`` one batch at a
time per query, and :meth:`process` may also be called from several threads (each call runs its own
top-level transaction).  No mutex is held while calling Spark, the engine or PostgreSQL.  The paths of a
batch get the sink's :class:`~spark_bridge._batch.SinkContext`, never the sink; failure
classification and the search for poison events are in ``_failures.py``.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Callable, Collection, Mapping
from typing import Any

from activedb import TxnState
from activedb.deadletters import Letter

from spark_bridge._atomic import lineage_participants
from spark_bridge._batch import SinkContext, no_cyclic_gc, reason_of
from spark_bridge._failures import (
    conflict_in,
    find_culprits,
    is_deadlock,
    is_infrastructure_failure,
    is_poison_failure,
    rejection_reason,
    trial,
)
from spark_bridge._letters import BatchLetters
from spark_bridge._ledger import IngestionLedger, batch_committed, check_not_renamed, last_watermark, ledger_query_id
from spark_bridge._outcome import PHASES, RECENT_OUTCOMES, BatchBook, BatchOutcome, IngestStatistics, PhaseTimings
from spark_bridge.errors import IngestError, MappingError
from spark_bridge.mapping import EventMapping, RawEvent, as_mapping

__all__ = ["PHASES", "RECENT_OUTCOMES", "BatchOutcome", "IngestSink", "IngestStatistics", "PhaseTimings"]

logger = logging.getLogger("spark_bridge.ingest")

_UTC = dt.timezone.utc
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=_UTC)
_QUERY_ID_PROPERTY = "sql.streaming.queryId"
_ACTIVE = TxnState.ACTIVE


def _emit(sub: Any, event: RawEvent) -> None:
    """The body of an event's subtransaction: hand it to the rules on ``db.stream(type)``."""
    sub.emit(event.event_type, key=event.key, ts=event.ts, payload=event.payload)

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
        self._event_attempts = event_attempts
        #: Where the batches go instead of the per-event rule path (``_handler.BatchHandler``: queries,
        #: tpg, composite), or None.  Set once here, never changed.
        self.handler = handler
        #: The query name event ids are kept under for duplicate detection (``EventMapping.id_column``): the
        #: query's own name, or for a dead-letter replay the name of the query the letter came from — one
        #: scope for a query and its replays.
        self.event_ids_under = event_ids_under or query_name
        #: What a batch path needs of this sink (``_handler.process_with_handler`` gets it, not the sink).
        self.context = SinkContext(db, mapping, query_name, self.event_ids_under, self._known_types, batch_attempts,
                                   BatchBook(query_name, on_phase))
        self._book = self.context.book
        # self._mutex protects the two fields below (the counters are the book's).
        self._mutex = threading.Lock()
        self._checked_spark_ids: set[str] = set()
        self._watermark_warning_given = False

    # -- foreachBatch entry point -------------------------------------------------------------

    def __call__(self, batch_df: Any, batch_id: int) -> None:
        self._book.enter()
        try:
            spark_query_id = batch_df.sparkSession.sparkContext.getLocalProperty(_QUERY_ID_PROPERTY)
            if not spark_query_id:
                raise IngestError("IngestSink must run as foreachBatch of a streaming query (no query id)")
            query_id = self._query_id_for(spark_query_id)
            started = time.perf_counter()
            table = batch_df.toArrow()
            to_arrow = time.perf_counter() - started
            watermark = self.spark_watermark(spark_query_id)
            self._book.phase("fetched", batch_id)
            self.process(table, batch_id, query_id=query_id, watermark=watermark,
                         extra_timings=PhaseTimings(to_arrow=to_arrow), _counted=True)
        except BaseException as error:
            # Remembered: Spark wraps the error in a Java stack trace (``activedb run`` prints this instead).
            self._book.failed(batch_id, error)
            raise
        finally:
            self._book.leave()

    def last_failure(self) -> tuple[int, BaseException] | None:
        """``(batch id, the Python exception)`` of the last batch that raised out of the sink, or None."""
        return self._book.last_failure()

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
            self._book.enter()
        try:
            participants = (*participants, *lineage_participants(self.db, query_id, batch_id, self.record_lineage))
            return self._process(rows, batch_id, query_id, watermark, extra_timings or PhaseTimings(), punctuate,
                                 participants)
        finally:
            if not _counted:
                self._book.leave()

    def _process(self, rows, batch_id, query_id, watermark, timings, punctuate, participants=()) -> BatchOutcome:
        if self.handler is not None:
            from spark_bridge._handler import process_with_handler

            return process_with_handler(self.context, self.handler, rows, batch_id, query_id, watermark, timings, punctuate,
                                        participants)
        began = time.perf_counter() - timings.to_arrow
        row_count = rows.num_rows if hasattr(rows, "num_rows") else len(rows)
        if batch_committed(self.db, query_id, batch_id):
            return self._book.skipped(query_id, batch_id, row_count, watermark, timings, began)

        started = time.perf_counter()
        dead = BatchLetters(self.db, rows, query_id, batch_id)
        good, letters = self.context.validate(rows, dead, watermark, self.known_types())
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
                return self._book.skipped(query_id, batch_id, row_count, watermark, timings, began)
            except SerializationConflict:
                if attempt >= self.context.batch_attempts:
                    raise
                logger.info("batch %s of %s conflicted with another process; re-running it (%d of %d)",
                            batch_id, query_id, attempt + 1, self.context.batch_attempts)
            except Exception as failure:
                if not is_poison_failure(failure):
                    raise
                # PostgreSQL refused the batch's commit because of what some event wrote (a key too large
                # for its index, a constraint): find those events, dead-letter them, apply the rest.
                culprits = find_culprits(
                    lambda events: trial(self.db, self.query_name, self._apply_events, events), good, failure)
                logger.warning("batch %s of %s: PostgreSQL refused the writes of %d event(s); they become dead "
                               "letters and the batch is applied without them", batch_id, query_id, len(culprits))
                letters = letters + dead.for_events([event for event, _ in culprits], reason_of(culprits))
                gone = {id(event) for event, _ in culprits}
                good = [event for event in good if id(event) not in gone]
                attempt -= 1       # not a conflict: the batch gets its attempts again
        timings = timings + phase_timings
        self._book.phase("committed", batch_id)
        if punctuate and watermark is not None:
            self.db.punctuate(self.query_name, watermark)
        outcome = BatchOutcome(query_id, batch_id, True, row_count, applied, dead_letters, firings, watermark,
                               timings, attempt)
        self._book.record(outcome, began)
        return outcome

    def _apply(self, dead: BatchLetters, events: list[RawEvent], letters: list[Letter], watermark: dt.datetime | None,
               participants: tuple = ()):
        """One top-level transaction for the batch; returns (applied, dead letters, firings, timings)."""
        started = time.perf_counter()
        ledger = IngestionLedger(self.db, dead.query_id, dead.batch_id, on_flush=self._book.flush_reached)
        if self.mapping.id_column is not None:
            ledger.query_name = self.event_ids_under
        with self.db.transaction(name=f"ingest:{self.query_name}", participants=[ledger, *participants]) as tx:
            # The batch is re-run until it commits (by this sink after a conflict, by Spark after a crash):
            # an aborted attempt is not an outcome for the detached rules it fired.
            self.db.outbox.mark_replayed(tx)
            self._prefetch_rows(tx, events)
            applied = 0
            failed: list[tuple[RawEvent, str]] = []
            with no_cyclic_gc():
                for event in events:
                    reason = self._apply_event(tx, event)
                    if reason is None:
                        applied += 1
                    else:
                        failed.append((event, reason))
            if failed:
                letters = letters + dead.for_events([event for event, _ in failed], reason_of(failed))
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

    def _apply_events(self, tx: Any, events: list[RawEvent]) -> None:
        """The events of a trial flush (``_failures.trial``), each in its own subtransaction of ``tx``."""
        self._prefetch_rows(tx, events)
        for event in events:
            self._apply_event(tx, event)

    def _apply_event(self, tx: Any, event: RawEvent) -> str | None:
        """Run ``event`` in its own subtransaction of ``tx``; None if it committed, else why not.

        Raises when the batch itself cannot go on (``tx`` unusable, PostgreSQL down)."""
        for attempt in range(1, self._event_attempts + 1):
            try:
                tx.run_subtransaction(_emit, event, name=f"event:{event.event_type}")
                return None
            except Exception as failure:
                conflict = conflict_in(failure)
                if conflict is not None:
                    raise conflict from failure   # not the event's fault: the whole batch is re-run
                if is_infrastructure_failure(failure) or not tx.state is _ACTIVE:
                    raise
                if is_deadlock(failure) and attempt < self._event_attempts:
                    continue
                return rejection_reason(failure)
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
        self._book.running_as(query_id)
        return query_id

    # -- statistics (the book's) --------------------------------------------------------------

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until no batch is being processed; False if ``timeout`` passed first."""
        return self._book.wait_idle(timeout)

    def record_outcome(self, outcome: BatchOutcome, began: float) -> None:
        """Count a batch processed elsewhere (the scale-out tasks) in these statistics."""
        self._book.record(outcome, began)

    def recent_outcomes(self) -> list[BatchOutcome]:
        """The last :data:`RECENT_OUTCOMES` batches' outcomes, oldest first."""
        return self._book.recent_outcomes()

    def statistics(self) -> IngestStatistics:
        """A consistent snapshot of the counters (see :class:`IngestStatistics`)."""
        return self._book.statistics()

    def close(self) -> None:
        """Release the handler's resources (the TPG path's worker processes); nothing else to release."""
        close = getattr(self.handler, "close", None)
        if callable(close):
            close()
