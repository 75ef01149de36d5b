"""The rule-layer sink: one micro-batch → one activedb transaction, exactly once.

:class:`IngestSink` is the ``foreachBatch`` callable behind :func:`spark_bridge.ingest`: ``toArrow()``
(always, also for a batch that will be skipped), then :func:`activedb.ingest._protocol.run_batch` with the
sink's handler through :meth:`IngestSink.process`, which also runs without Spark (a ``pyarrow.Table``
or a list of dicts) and inside the scale-out tasks.  Design note: the package's ``README.md`` ("One
micro-batch").

Thread-safety: the sink's :class:`~activedb.ingest._outcome.BatchBook` keeps the statistics (its own
mutex); ``_mutex`` protects the per-query bookkeeping.  Spark calls ``foreachBatch`` one batch at a
time per query, and :meth:`process` may also be called from several threads (each call runs its own
top-level transaction).  No mutex is held while calling Spark, the engine or PostgreSQL.  The paths of a
batch get the sink's :class:`~activedb.ingest._letters.SinkContext`, never the sink.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import threading
import time
from collections.abc import Callable, Collection, Mapping
from typing import Any

import sqlalchemy as sa

from activedb.ingest._ledger import LEDGER_TABLE, last_watermark, ledger_query_id, parse_ledger_query_id
from activedb.ingest._letters import SinkContext
from activedb.ingest._mapping import EPOCH, EventMapping, as_mapping
from activedb.ingest._outcome import BatchBook, BatchOutcome, IngestStatistics, PhaseTimings
from activedb.ingest._protocol import BatchHandler, run_batch
from activedb.ingest._rules import RulesHandler
from activedb.tracing import BatchTracing

from spark_bridge._atomic import lineage_participants
from spark_bridge._baseline import streaming_query_id
from spark_bridge.errors import IngestError, MappingError, QueryRenamedError

__all__ = ["IngestSink"]

logger = logging.getLogger("spark_bridge.ingest")

_UTC = dt.timezone.utc
_EXECUTIONS_KEPT = 64        # (Spark query ids a long-lived sink has seen: one per run; the cache stays bounded)


class IngestSink:
    """``foreachBatch`` callable applying each micro-batch to ``db`` through its handler (the rules by default).

    ``query_name``, ``known_types``, ``prefetch`` and ``on_phase`` are ``ingest()``'s (``IngestOptions``);
    ``spark_session`` — the session the query was started from (to read the batch's watermark; ``None``:
    no watermark unless :meth:`process` is given one); ``batch_attempts`` — top-level attempts per batch on
    serialization conflicts; ``event_attempts`` — attempts per event when a rule is chosen as deadlock
    victim; ``handler`` — a ``_handler.BatchHandler`` that takes the batches instead of the rule path
    (``_rules_handler.RulesHandler``); ``event_ids_under`` — the query name whose ingested event ids count
    for duplicate detection (default ``query_name``; a dead-letter replay passes the original query's name).

    Thread-safety: see the module docstring.
    """

    #: Record each batch transaction's lineage (it consumed the source batch; ``spark_bridge/_atomic.py``),
    #: in its own flush. ``ingest(..., lineage=False)`` sets it False on the sink.
    record_lineage: bool = True

    def __init__(self, db: Any, mapping: EventMapping, *, query_name: str, known_types: Collection[str] | None = None,
                 prefetch: Mapping[str, Any] | None = None, spark_session: Any = None,
                 on_phase: Callable[[str, int], None] | None = None, batch_attempts: int = 3, event_attempts: int = 3,
                 handler: BatchHandler | None = None, event_ids_under: str | None = None,
                 lower_declared: bool = True) -> None:
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
        self._spark_session = spark_session
        #: Where the batches go (``_handler.BatchHandler``: the rules by default; queries, tpg, composite).
        #: Set once here, never changed.
        self.handler: BatchHandler = handler or RulesHandler(db, prefetch, event_attempts,
                                                             lower_declared=lower_declared)
        #: Duplicate detection's scope (``EventMapping.id_column``): a query and its replays share one.
        self.event_ids_under = event_ids_under or query_name
        #: What a batch path needs of this sink (``_handler.run_batch`` gets it, not the sink).
        self.context = SinkContext(db, mapping, query_name, self.event_ids_under,
                                   None if known_types is None else frozenset(known_types), batch_attempts,
                                   BatchBook(query_name, on_phase), BatchTracing(db, query_name))
        self._book = self.context.book
        # self._mutex protects the three fields below (the counters are the book's).
        self._mutex = threading.Lock()
        self._checked_spark_ids: set[str] = set()
        self._watermark_warning_given = False
        #: Spark query id -> (its StreamExecution, a py4j handle; whether its plan declares a watermark): found
        #: once per run of the query (a restart from the checkpoint keeps the id, not the execution), so that a
        #: batch asks the JVM one question without a watermark and four with one, instead of six
        #: (``spark_watermark``).
        self._executions: dict[str, tuple[Any, bool]] = {}

    # -- foreachBatch entry point -------------------------------------------------------------

    def __call__(self, batch_df: Any, batch_id: int) -> None:
        self.call_in_run(batch_df, batch_id, None)

    def call_in_run(self, batch_df: Any, batch_id: int, run: "QueryRun | None") -> None:
        """``foreachBatch``'s call, by the :class:`QueryRun` of the query ``ingest()`` started (or None): a run
        that knows its query's id and execution spares the batch two questions to Spark."""
        with self._book.in_batch():
            try:
                spark_query_id, execution = run.known() if run is not None else (None, None)
                if spark_query_id is None:
                    spark_query_id = streaming_query_id(batch_df)
                if not spark_query_id:
                    raise IngestError(f"{type(self).__name__} must run as foreachBatch of a streaming query (no "
                                      f"query id)")
                self._spark_batch(batch_df, batch_id, spark_query_id, self._query_id_for(spark_query_id),
                                  execution=execution)
            except BaseException as error:
                # Remembered: Spark wraps the error in a Java stack trace (``activedb run`` prints this instead).
                self._book.failed(batch_id, error)
                raise

    def _spark_batch(self, batch_df: Any, batch_id: int, spark_query_id: str, query_id: str, *,
                     execution: Any = None) -> None:
        """Batch ``batch_id`` of ``foreachBatch`` as ``(query_id, batch_id)`` (the scale-out sink overrides it);
        ``execution``: the query's running ``StreamExecution`` if the caller knows it (``spark_watermark``)."""
        started = time.perf_counter()
        table = batch_df.toArrow()
        to_arrow = time.perf_counter() - started
        watermark = self.spark_watermark(spark_query_id, current=execution)
        self._book.phase("fetched", batch_id)
        self.process(table, batch_id, query_id=query_id, watermark=watermark,
                     extra_timings=PhaseTimings(to_arrow=to_arrow), _counted=True)

    def last_failure(self) -> tuple[int, BaseException] | None:
        """``(batch id, the Python exception)`` of the last batch that raised out of the sink, or None."""
        return self._book.last_failure()

    def spark_watermark(self, spark_query_id: str, *, current: Any = None) -> dt.datetime | None:
        """Spark's event-time watermark of the batch now running in query ``spark_query_id`` (the package's
        ``README.md``, "The watermark"); ``None`` without one, without a ``spark_session``, or when this
        Spark version does not expose it (logged once).  ``current``: the query's ``StreamExecution`` when the
        caller knows it is the running one (a :class:`QueryRun`): not asked whether it still is."""
        session = self._spark_session
        if session is None:
            return None
        try:
            with self._mutex:
                known = self._executions.get(spark_query_id)
            if current is not None:
                if known is None or known[0] is not current:
                    known = self._remember_execution(spark_query_id, current)
            elif known is None or not known[0].isActive():     # (a stopped execution: the query was restarted)
                query = session.streams.get(spark_query_id)
                if query is None:
                    return None
                known = self._remember_execution(spark_query_id, query._jsq.streamingQuery())
            execution, declared = known
            if not declared:
                return None
            # StreamExecution.lastExecution is the IncrementalExecution of the running batch.
            millis = int(execution.lastExecution().offsetSeqMetadata().batchWatermarkMs())
        except Exception as error:  # py4j: an internal API that may move between Spark versions
            with self._mutex:
                warn, self._watermark_warning_given = not self._watermark_warning_given, True
            if warn:
                logger.warning("cannot read the batch watermark from Spark (%r); no punctuation is given", error)
            return None
        return None if millis <= 0 else EPOCH + dt.timedelta(milliseconds=millis)

    def _remember_execution(self, spark_query_id: str, execution: Any) -> tuple[Any, bool]:
        """``(execution, whether its plan declares a watermark)``, kept as the query's known run."""
        known = (execution, _declares_watermark(execution))
        with self._mutex:
            if len(self._executions) >= _EXECUTIONS_KEPT:
                self._executions.clear()
            self._executions[spark_query_id] = known
        return known

    # -- one batch ----------------------------------------------------------------------------

    def process(self, rows: Any, batch_id: int, *, query_id: str, watermark: dt.datetime | None = None,
                extra_timings: PhaseTimings | None = None, punctuate: bool = True,
                participants: Collection[Any] = (), _counted: bool = False) -> BatchOutcome:
        """Apply one batch (a ``pyarrow.Table``/``RecordBatch`` or a list of dicts) as
        ``(query_id, batch_id)``, exactly once. ``watermark``: events older than it are dead
        letters, and it is punctuated after the commit (``punctuate=False``: the caller does).
        Raises only when the batch could not be committed (PostgreSQL unusable, conflicts
        beyond ``batch_attempts``); the batch may then be re-run.  ``participants``: more commit
        participants of the batch's transaction (a dead-letter replay marks its letter there); one that
        raises ``BatchAlreadyCommitted`` makes the batch skipped."""
        with contextlib.nullcontext() if _counted else self._book.in_batch():
            participants = (*participants, *lineage_participants(self.db, query_id, batch_id, self.record_lineage))
            return run_batch(self.context, self.handler, rows, batch_id, query_id=query_id, watermark=watermark,
                             timings=extra_timings or PhaseTimings(), punctuate=punctuate, participants=participants)

    # -- helpers ------------------------------------------------------------------------------

    def known_types(self) -> frozenset[str] | None:
        """The event types accepted now (``SinkContext.accepted_types``)."""
        return self.context.accepted_types(self.handler)

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

    def recent_outcomes(self) -> list[BatchOutcome]:
        """The last :data:`~activedb.ingest._outcome.RECENT_OUTCOMES` batches' outcomes, oldest first."""
        return self._book.recent_outcomes()

    def statistics(self) -> IngestStatistics:
        """A consistent snapshot of the counters (see :class:`IngestStatistics`)."""
        return self._book.statistics()

    def close(self) -> None:
        """Release the handler's resources (the TPG path's worker processes) and the tracing's observer."""
        self.handler.close()
        if self.context.tracing is not None:
            self.context.tracing.close()

def check_not_renamed(db: Any, query_name: str, spark_query_id: str) -> None:
    """Raise :class:`QueryRenamedError` if the ledger holds batches of
    ``spark_query_id`` (the checkpoint's query) under another query name."""
    ledger = db.table(LEDGER_TABLE)
    with db.engine.connect() as connection:
        others = connection.execute(sa.select(ledger.c.query_id).where(
            ledger.c.query_id.like(f"%@{spark_query_id}%")).distinct().limit(5)).scalars().all()
    names = sorted({parse_ledger_query_id(other)[0] for other in others} - {query_name})
    if names:
        raise QueryRenamedError(
            f"this checkpoint (Spark query id {spark_query_id}) was ingested as query {names[0]!r}, not "
            f"{query_name!r}; resume it with query_name={names[0]!r} (--query-name {names[0]}), or start "
            f"{query_name!r} from a new checkpoint directory")


def _declares_watermark(execution: Any) -> bool:
    """Whether the plan of ``execution`` (a ``StreamExecution``, py4j) has a watermark node (EventTimeWatermark, from
    ``withWatermark`` or SQL's ``WATERMARK``): a plan without one never has a watermark.  A "watermark" in some name
    only costs ``spark_watermark`` its questions."""
    return "watermark" in str(execution.logicalPlan().toString()).lower()


class QueryRun:
    """The ``foreachBatch`` callable of one run of a query that :func:`spark_bridge.ingest` starts: it hands each
    batch to ``sink`` together with what it knows of the run.  Once ``start()`` returned, ``ingest()`` calls
    :meth:`started` with the query: the run then knows the query's id and its ``StreamExecution``, and a batch asks
    Spark for neither — the id (a local property) and whether the execution the sink knows still runs cost a
    py4j call each, slow after Spark's turn.  A batch that began before
    :meth:`started` (the first may) asks, as a sink used directly does.

    One object per run, never handed out (``sink_of`` gives the sink): a restart is a new ``start()`` and so a new
    run, whose id and execution it learns again.  Thread-safety: the two are one tuple, replaced whole once (an
    attribute assignment: a batch on Spark's thread sees the old pair or the new one, never half of it)."""

    def __init__(self, sink: IngestSink) -> None:
        self.sink = sink
        self._known: tuple[str | None, Any] = (None, None)

    def started(self, query: Any) -> None:
        """``query`` (the ``StreamingQuery`` ``start()`` returned) is this run's."""
        self._known = (str(query.id), query._jsq.streamingQuery())

    def known(self) -> tuple[str | None, Any]:
        """(the run's Spark query id, its ``StreamExecution``), or (None, None) before :meth:`started`."""
        return self._known

    def __call__(self, batch_df: Any, batch_id: int) -> None:
        self.sink.call_in_run(batch_df, batch_id, self)
