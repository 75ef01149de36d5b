"""What a micro-batch is handed to, besides the rules: the :class:`BatchHandler` interface and the
one loop that runs any handler exactly once.

The sink (``_sink.py``) keeps the per-event rule path built in.  ``ingest(..., queries=…)``,
``ingest(..., executor="tpg", transactions=…)`` and ``ingest(..., composition=…)`` give it a handler
instead, one per path, each in its own module:

=========================  ====================================  ==========================================
path                       module                                the batch goes to
=========================  ====================================  ==========================================
queries (stream engines)   ``_queries_handler.QueriesHandler``   ``engine.process(tx, events, punctuation=
                                                                 watermark, batch_id=b)`` per engine
tpg (state transactions)   ``_tpg_handler.TpgHandler``           ``activedb.batch.apply_at_commit`` (a commit
                                                                 participant that runs before the ledger)
composite (many producers) ``_composite_handler.                 ``composite_feed.feed_batch(engine, rows,
                           CompositeHandler``                    mapping, tx=tx)``
=========================  ====================================  ==========================================

The protocol of one batch (:func:`process_with_handler`) is the sink's own, step for step:
skip a batch the ledger has; validate rows (``rows_to_events``, unless the handler reads the rows
itself) — bad rows, duplicates and, where the handler wants it, rows older than Spark's watermark
become dead letters; then in **one** top-level transaction, marked replayed for the outbox,
``handler.handle(tx, batch, ledger)`` and *after it* the ledger participant (enlisted last, so a
participant the handler enlisted — the TPG batch — writes first and the ledger row sees its
counts); ``BatchAlreadyCommitted`` at the flush means skipped, ``SerializationConflict`` re-runs the
batch (at most ``batch_attempts``).  What the handler must do in ``handle``: hand the batch to its
engine inside ``tx``, get every dead letter into ``tx`` (itself, or through its engine), and leave
``ledger.events`` / ``ledger.dead_letters`` set by the time the ledger writes its row.

Not here (yet): the rule path's bisection of a batch PostgreSQL refuses at the commit (a poison
event) — with a handler such a batch fails, and ``activedb run`` says which; the scale-out path.

Thread-safety: a handler is called by one batch at a time (Spark's ``foreachBatch``); the engines
behind the handlers refuse concurrent batches themselves.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from activedb.deadletters import Letter

from spark_bridge._batch import SinkContext
from spark_bridge._ledger import IngestionLedger, batch_committed
from spark_bridge._letters import BatchLetters
from spark_bridge._outcome import BatchOutcome, PhaseTimings
from spark_bridge.mapping import RawEvent

__all__ = ["BatchHandler", "BatchInput", "process_with_handler"]

logger = logging.getLogger("spark_bridge.ingest")


@dataclass(frozen=True)
class BatchInput:
    """One micro-batch as a handler sees it.  Immutable.

    ``rows``: the batch as fetched (a ``pyarrow.Table`` or a list of dicts); ``events``: the rows
    that validated, sorted by application time (empty if the handler validates itself);
    ``letters``: the dead letters (``activedb.deadletters.Letter``) of the rows the sink already
    rejected — the handler adds its own and stores them all; ``dead_letters`` is the batch's dead-letter
    sink: ``dead_letters.for_events(events, reason)`` makes letters keeping the original rows of events of
    this batch, ``dead_letters.insert(tx, letters)`` stores them in ``tx``."""

    rows: Any
    events: tuple[RawEvent, ...]
    letters: tuple[Letter, ...]
    query_id: str
    query_name: str
    batch_id: int
    watermark: dt.datetime | None
    dead_letters: BatchLetters


@runtime_checkable
class BatchHandler(Protocol):
    """Where a micro-batch's events go instead of the per-event rule path (module docstring)."""

    #: The path's name, for messages and statistics (``"queries"``, ``"tpg"``, ``"composite"``).
    name: str
    #: True: the sink dead-letters rows older than the batch's watermark before ``handle`` (Spark's
    #: lateness rule, as on the rule path).  False: the handler's engine decides lateness itself.
    late_rows_are_dead_letters: bool
    #: True: the sink runs ``rows_to_events`` and passes the events; False: the handler reads
    #: ``BatchInput.rows`` itself (``events`` and ``letters`` are then empty).
    validates_rows: bool

    def accepted_types(self) -> frozenset[str] | None:
        """Event types the sink accepts when ``ingest(known_types=…)`` is not given (None: any)."""

    def handle(self, tx: Any, batch: BatchInput, ledger: IngestionLedger) -> None:
        """Apply ``batch`` inside ``tx`` (the batch's top-level transaction) and set the ledger's
        ``events`` and ``dead_letters`` — now, or in a commit participant enlisted here that writes
        before the ledger.  Raise to fail the batch (``tx`` then aborts and nothing is kept)."""

    def end_of_stream(self, db: Any, query_name: str, query_id: str | None = None) -> int:
        """The source ended: release what the engine still holds back, in a transaction of its own;
        returns how many events that processed.  Idempotent.  ``query_id``: the ledger id of the run
        (its dead letters are kept under it), if the sink has seen a batch."""


def process_with_handler(context: SinkContext, handler: BatchHandler, rows: Any, batch_id: int, query_id: str,
                         watermark: dt.datetime | None, timings: PhaseTimings, punctuate: bool,
                         participants: tuple) -> BatchOutcome:
    """One batch through ``handler``, exactly once; returns its outcome.

    ``context`` is what the calling :class:`~spark_bridge._sink.IngestSink` shares with its batch paths
    (database, mapping, names, attempts; its book records phases and statistics as on the rule path)."""
    from activedb.errors import BatchAlreadyCommitted, SerializationConflict

    book = context.book
    began = time.perf_counter() - timings.to_arrow
    row_count = rows.num_rows if hasattr(rows, "num_rows") else len(rows)
    if batch_committed(context.db, query_id, batch_id):
        return book.skipped(query_id, batch_id, row_count, watermark, timings, began)

    started = time.perf_counter()
    good: list[RawEvent] = []
    letters: list[Letter] = []
    dead = BatchLetters(context.db, rows, query_id, batch_id)
    if handler.validates_rows:
        accepted = context.known_types if context.known_types is not None else handler.accepted_types()
        good, letters = context.validate(rows, dead, watermark, accepted, handler.late_rows_are_dead_letters)
    timings = timings + PhaseTimings(validate=time.perf_counter() - started)

    batch = BatchInput(
        rows=rows, events=tuple(good), letters=tuple(letters), query_id=query_id, query_name=context.query_name,
        batch_id=batch_id, watermark=watermark, dead_letters=dead)
    attempt = 0
    while True:
        attempt += 1
        started = time.perf_counter()
        ledger = IngestionLedger(context.db, query_id, batch_id, on_flush=book.flush_reached)
        if context.mapping.id_column is not None:
            ledger.query_name = context.event_ids_under
            ledger.event_ids = [event.event_id for event in good]
        try:
            with context.db.transaction(name=f"ingest:{context.query_name}", participants=list(participants)) as tx:
                # Re-run until it commits: an aborted attempt is no outcome for the detached rules it fired.
                context.db.outbox.mark_replayed(tx)
                handler.handle(tx, batch, ledger)
                tx.enlist(ledger)        # last: a participant the handler enlisted writes the counts first
                exit_began = time.perf_counter()
        except BatchAlreadyCommitted:
            return book.skipped(query_id, batch_id, row_count, watermark, timings, began)
        except SerializationConflict:
            if attempt >= context.batch_attempts:
                raise
            logger.info("batch %s of %s conflicted with another process; re-running it (%d of %d)",
                        batch_id, query_id, attempt + 1, context.batch_attempts)
            continue
        break
    ended = time.perf_counter()
    flush_began = ledger.flush_began or ended
    timings = timings + PhaseTimings(engine=exit_began - started, commit=max(0.0, flush_began - exit_began),
                                     flush=ended - min(max(flush_began, exit_began), ended))
    book.phase("committed", batch_id)
    if punctuate and watermark is not None:
        context.db.punctuate(context.query_name, watermark)
    outcome = BatchOutcome(query_id, batch_id, True, row_count, ledger.events, ledger.dead_letters,
                           dict(ledger.rule_firings), watermark, timings, attempt)
    book.record(outcome, began)
    return outcome


def choose_handler(db: Any, mapping: Any, *, queries: Any = None, scheduler: Any = None, executor: str | None = None,
                   transactions: Any = None, composition: Any = None, partition_by_key: int | None = None,
                   prefetch: Any = None) -> BatchHandler | None:
    """The handler for ``ingest()``'s arguments (None: the rule path), after checking that they go
    together; every refusal says what to do instead."""
    from spark_bridge.errors import IngestError

    if executor not in (None, "rules", "tpg"):
        raise IngestError(f"executor must be 'rules' (the default: events through the rules, one subtransaction "
                          f"each) or 'tpg' (declared state transactions planned per batch); got {executor!r}")
    tpg = executor == "tpg"
    chosen = [name for name, given in (("queries=", queries is not None), ("executor='tpg'", tpg),
                                        ("composition=", composition is not None)) if given]
    if len(chosen) > 1:
        raise IngestError(
            f"{' and '.join(chosen)} are different paths for a batch; choose one per query (start two ingest() "
            f"queries over the same source, each with its own query_name and checkpoint, to feed both)")
    if transactions is not None and not tpg:
        raise IngestError("transactions= is for executor='tpg': pass ingest(…, executor='tpg', transactions=…)")
    if tpg and transactions is None:
        raise IngestError("executor='tpg' needs transactions=batch.StateTransactions() declaring each event type's "
                          "state transaction (see activedb/batch/README.md)")
    if scheduler is not None and queries is None:
        raise IngestError("scheduler= chooses the stream engine's scheduler (sei, s2pl, lwm): pass queries=engine "
                          "too; the rule path and executor='tpg' have no such choice")
    if not chosen:
        return None
    if partition_by_key is not None:
        instead = {"queries=": "for concurrency inside a batch use scheduler='s2pl' or 'lwm' (one engine orders "
                               "events across keys)",
                   "executor='tpg'": "the planner splits a batch into independent components itself: use "
                                     "batch.StateTransactions(processes=N)",
                   "composition=": "a composition spans producers and keys, so it runs in one engine"}[chosen[0]]
        raise IngestError(f"partition_by_key= (the scale-out path) does not combine with {chosen[0]}: {instead}")
    if prefetch:
        raise IngestError(f"prefetch= is for the rule path; with {chosen[0]} rows are loaded by the engine "
                          f"(stream engines prefetch what their access plans name; the TPG batch reads its declared "
                          f"rows FOR UPDATE)")
    if queries is not None:
        from spark_bridge._queries_handler import QueriesHandler, build_engines

        return QueriesHandler(build_engines(db, queries, scheduler), mapping.key_column)
    if tpg:
        from spark_bridge._tpg_handler import TpgHandler

        return TpgHandler(transactions)
    from spark_bridge._composite_handler import CompositeHandler

    return CompositeHandler(composition, mapping)


def end_of_stream(query_or_sink: Any) -> int:
    """Tell the engine behind a query made by ``ingest(…, queries=…)`` that its (bounded) source has
    ended: events its reorder buffer still holds are released (``punctuation=END_OF_STREAM``) and
    processed in a transaction of their own.  Call it after the query terminated (``availableNow``);
    afterwards every new event of the engine is late.  Returns how many events that processed (0 for
    the other paths).  Idempotent."""
    sink = getattr(query_or_sink, "activedb_sink", query_or_sink)
    handler = getattr(sink, "handler", None)
    if handler is None:
        return 0
    return handler.end_of_stream(sink.db, sink.query_name, sink.statistics().query_id)
