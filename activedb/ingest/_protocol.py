"""The one protocol of a micro-batch: :func:`run_batch` runs any :class:`BatchHandler` (``_rules_handler``,
``_queries_handler``, ``_tpg_handler``, ``composite_feed``, ``_atomic``'s failed partition) exactly once; the
sink, the scale-out tasks and dead-letter replays all reach it.  Design note: the package's ``README.md``
("One micro-batch", "Four paths for a batch").

Thread-safety: a handler is called by one batch at a time (Spark's ``foreachBatch``); the engines
behind the handlers refuse concurrent batches themselves.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from activedb import lowlevel
from activedb.deadletters import Letter
from activedb.errors import BatchAlreadyCommitted, SerializationConflict
from activedb.ingest._failures import find_culprits, is_poison_failure, trial
from activedb.ingest._ledger import IngestionLedger, batch_committed
from activedb.ingest._letters import BatchLetters, SinkContext, no_cyclic_gc
from activedb.ingest._mapping import RawEvent
from activedb.ingest._outcome import BatchOutcome, PhaseTimings
from activedb.ingest.errors import first_line
from activedb.tracing import BatchTrace

if TYPE_CHECKING:  # pragma: no cover
    from activedb.txn import Transaction

__all__ = ["BatchHandler", "BatchInput", "run_batch"]

logger = logging.getLogger("activedb.ingest")


@dataclass(frozen=True)
class BatchInput:
    """One micro-batch as a handler sees it.  Immutable.

    ``rows``: the batch as fetched (a ``pyarrow.Table`` or a list of dicts); ``events``: the rows
    that validated, sorted by application time (empty if the handler validates itself);
    ``letters``: the dead letters (``activedb.deadletters.Letter``) of the rows the sink already
    rejected — the handler adds its own and stores them all; ``dead_letters`` is the batch's dead-letter
    sink: ``dead_letters.for_events([(event, reason), …])`` makes letters keeping the original rows of
    events of this batch, ``dead_letters.insert(tx, letters)`` stores them in ``tx``."""

    rows: Any
    events: tuple[RawEvent, ...]
    letters: tuple[Letter, ...]
    query_id: str
    query_name: str
    batch_id: int
    watermark: dt.datetime | None
    dead_letters: BatchLetters

    def holds(self, event: Any) -> bool:
        """Whether ``event`` is one of this batch's ``events`` (the same object; an engine's event
        points back to it as its ``origin``)."""
        return id(event) in self._event_ids

    @functools.cached_property
    def _event_ids(self) -> frozenset[int]:
        return frozenset(map(id, self.events))

    def at_commit(self, ledger: Any, *, refused_may_come_again: bool = False) -> dict[str, Any]:
        """The keyword arguments of ``activedb.batch.apply_at_commit`` (and ``apply_lowered``) for this batch's
        ``events``: labelled with its query and batch id; inside the commit, before the ledger's write, the
        ledger's counts (``on_result``) and the dead letters — the batch's own and one per aborted event,
        ``aborted: <reason>``, keeping the row Spark delivered (``letters``; ``event.position`` of a result is
        the index in ``events``, whose own ``.position`` is its Arrow row).  ``refused_may_come_again``: the
        ledger records the ids of the applied events only (as the rule path does: a refused one may come
        again)."""
        events, base = self.events, list(self.letters)

        def counts(result: Any, connection: Any) -> None:
            ledger.events = result.committed_count
            ledger.dead_letters = len(base) + len(result.dead_letters)
            if refused_may_come_again and result.dead_letters and ledger.query_name is not None:
                refused = {event.position for event, _ in result.dead_letters}
                ledger.event_ids = [event.event_id for position, event in enumerate(events) if position not in refused]

        def letters(result: Any) -> list[Letter]:
            return base + self.dead_letters.for_events(
                [(events[event.position], f"aborted: {reason}") for event, reason in result.dead_letters])

        return {"query_id": self.query_id, "batch_id": self.batch_id, "on_result": counts, "letters": letters}


class BatchHandler:
    """Where a micro-batch's events go (module docstring): a path overrides ``handle`` and what it does
    differently from these defaults."""

    #: The path's name, for messages and statistics (``"rules"``, ``"queries"``, ``"tpg"``, ``"composite"``).
    name = "handler"
    #: True: the sink dead-letters rows older than the batch's watermark before ``handle`` (Spark's
    #: lateness rule).  False: the handler's engine decides lateness itself.
    late_rows_are_dead_letters = True
    #: True: the sink runs ``rows_to_events`` and passes the events; False: the handler reads
    #: ``BatchInput.rows`` itself (``events`` and ``letters`` are then empty).
    validates_rows = True
    #: True: ``apply_events(tx, events)`` applies any subset of the batch's events, so a commit
    #: PostgreSQL refuses is searched for its culprits (trial flushes) instead of failing the batch.
    searches_poison = False

    def accepted_types(self) -> frozenset[str] | None:
        """Event types the sink accepts when ``ingest(known_types=…)`` is not given (None: any)."""
        return None

    def handle(self, tx: Transaction, batch: BatchInput, ledger: IngestionLedger) -> None:
        """Apply ``batch`` inside ``tx`` (the batch's top-level transaction) and set the ledger's
        ``events`` and ``dead_letters`` — now, or in a commit participant enlisted here that writes
        before the ledger.  Raise to fail the batch (``tx`` then aborts and nothing is kept)."""
        raise NotImplementedError

    def apply_events(self, tx: Transaction, events: list[RawEvent]) -> None:
        """Apply ``events`` in ``tx`` for a trial flush (only called if ``searches_poison``)."""
        raise NotImplementedError

    def retries_refused(self, batch: BatchInput, failure: BaseException) -> bool:
        """PostgreSQL refused the commit of ``batch`` for a value (a poison failure): True if the handler's next
        attempt applies the batch as ``apply_events`` does, where the attempt that failed did not — trial flushes
        could not reproduce the refusal, so the batch is re-run without a culprit search and a refusal of that
        attempt is searched then.  Default False: the trials apply it as the failed attempt did."""
        return False

    def end_of_stream(self, db: Any, query_name: str, query_id: str | None = None) -> int:
        """The source ended: release what the engine still holds back, in a transaction of its own;
        returns how many events that processed.  Idempotent.  ``query_id``: the ledger id of the run
        (its dead letters are kept under it), if the sink has seen a batch.  Nothing is held back here."""
        return 0

    def close(self) -> None:
        """Release the path's resources (the TPG path's worker processes); nothing here."""


def run_batch(context: SinkContext, handler: BatchHandler, rows: Any, batch_id: int, *, query_id: str,
              watermark: dt.datetime | None, timings: PhaseTimings, punctuate: bool = True,
              participants: tuple = ()) -> BatchOutcome:
    """One batch through ``handler``, exactly once; returns its outcome.  ``context``: what the calling
    :class:`~spark_bridge._sink.IngestSink` shares with its batch paths; ``participants``: more commit
    participants of the batch's transaction (lineage, a replay's mark), enlisted before the ledger.
    Raises only when the batch could not be committed (PostgreSQL unusable, conflicts beyond
    ``batch_attempts``, a refused commit the handler cannot search)."""
    row_count = rows.num_rows if hasattr(rows, "num_rows") else len(rows)
    trace = None if context.tracing is None else context.tracing.start(query_id, batch_id, row_count, timings.to_arrow)
    if trace is None:       # no SDK configured: no span
        return _run_batch(context, handler, rows, row_count, batch_id, query_id, watermark, timings, punctuate,
                          participants, None)
    try:
        outcome = _run_batch(context, handler, rows, row_count, batch_id, query_id, watermark, timings, punctuate,
                             participants, trace)
    except BaseException as error:
        trace.end(None, error)
        raise
    trace.end(outcome)
    return outcome


def _run_batch(context: SinkContext, handler: BatchHandler, rows: Any, row_count: int, batch_id: int, query_id: str,
               watermark: dt.datetime | None, timings: PhaseTimings, punctuate: bool, participants: tuple,
               trace: BatchTrace | None) -> BatchOutcome:
    """:func:`run_batch`'s work; ``trace``: the batch's spans (None: not traced)."""
    book = context.book
    began = time.perf_counter() - timings.to_arrow
    # A replay of a committed batch is skipped before anything runs; the batch after the one this sink committed
    # last cannot be one (BatchBook.follows_committed): its round trips to the ledger are saved.
    if not book.follows_committed(query_id, batch_id) and batch_committed(context.db, query_id, batch_id):
        return book.skipped(query_id, batch_id, row_count, watermark, timings, began)

    with no_cyclic_gc():    # until the tree has ended, then one young collection (_batch.no_cyclic_gc)
        started = time.perf_counter()
        good: list[RawEvent] = []
        letters: list[Letter] = []
        dead = BatchLetters(context.db, rows, query_id, batch_id)
        if handler.validates_rows:
            good, letters = context.validate(rows, dead, watermark, context.accepted_types(handler),
                                             handler.late_rows_are_dead_letters)
        timings = timings + PhaseTimings(validate=time.perf_counter() - started)

        batch = BatchInput(
            rows=rows, events=tuple(good), letters=tuple(letters), query_id=query_id, query_name=context.query_name,
            batch_id=batch_id, watermark=watermark, dead_letters=dead)
        attempt = 0
        unreproduced = False      # a refusal no trial reproduced was met once: the batch was re-run as it was
        while True:
            attempt += 1
            started = time.perf_counter()
            # (Without a listener the ledger has nothing to do at about_to_commit: the COMMIT rides with the last
            # statement of the flush.)
            ledger = IngestionLedger(context.db, query_id, batch_id,
                                     on_flush=functools.partial(book.phase, "flush") if book.hears_phases else None)
            ledger.watermark = watermark
            if context.mapping.id_column is not None:
                ledger.query_name = context.event_ids_under
                ledger.event_ids = [event.event_id for event in batch.events]
            try:
                with context.db.transaction(name=f"ingest:{context.query_name}", participants=list(participants)) as tx:
                    if trace is not None:       # the firings in tx's tree are the batch's
                        trace.transaction(tx)
                    # Re-run until it commits: an aborted attempt is no outcome for the detached rules it fired.
                    context.db.outbox.mark_replayed(tx)
                    handler.handle(tx, batch, ledger)
                    if trace is not None:       # the commit's span, ended by a participant's committed/aborted
                        trace.commit_started(tx)
                    lowlevel.enlist(tx, ledger)        # last: a participant the handler enlisted writes the counts first
                    exit_began = time.perf_counter()
            except BatchAlreadyCommitted:
                return book.skipped(query_id, batch_id, row_count, watermark, timings, began)
            except SerializationConflict:
                if attempt >= context.batch_attempts:
                    raise
                logger.info("batch %s of %s conflicted with another process; re-running it (%d of %d)",
                            batch_id, query_id, attempt + 1, context.batch_attempts)
                continue
            except Exception as failure:
                if not (handler.searches_poison and is_poison_failure(failure)):
                    raise
                if not handler.retries_refused(batch, failure):
                    batch, unreproduced = _without_culprits(context, handler, batch, failure, unreproduced)
                attempt -= 1       # not a conflict: the batch gets its attempts again
                continue
            break
        book.committed(query_id, batch_id)
        del batch, good, letters, dead, tx    # gone before the young collection (no_cyclic_gc) scans them
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


def _without_culprits(context: SinkContext, handler: BatchHandler, batch: BatchInput, failure: BaseException,
                      unreproduced: bool) -> tuple[BatchInput, bool]:
    """PostgreSQL refused the batch's commit because of what some event wrote (a key too large for its
    index, a constraint): the batch without those events, which become dead letters; and whether a refusal
    no trial reproduced has been met.  The first such refusal re-runs the batch as it is (it may have been
    another transaction's doing); the second names the batch's last event (``find_culprits``)."""
    culprits = find_culprits(
        lambda events: trial(context.db, context.query_name, handler.apply_events, events), list(batch.events),
        failure, blame_unreproduced=unreproduced)
    if not culprits:
        logger.warning("batch %s of %s: PostgreSQL refused its commit (%s) but no trial of its events reproduces "
                       "that; re-running the batch as it is", batch.batch_id, batch.query_id, first_line(failure))
        return batch, True
    logger.warning("batch %s of %s: PostgreSQL refused the writes of %d event(s); they become dead letters and "
                   "the batch is applied without them", batch.batch_id, batch.query_id, len(culprits))
    gone = {id(event) for event, _ in culprits}
    letters = batch.dead_letters.for_events(culprits)
    return dataclasses.replace(batch, events=tuple(event for event in batch.events if id(event) not in gone),
                               letters=batch.letters + tuple(letters)), unreproduced


def end_of_stream(query_or_sink: Any) -> int:
    """Tell the engine behind a query made by ``ingest(…, queries=…)`` that its (bounded) source has
    ended: events its reorder buffer still holds are released (``punctuation=END_OF_STREAM``) and
    processed in a transaction of their own.  Call it after the query terminated (``availableNow``);
    afterwards every new event of the engine is late.  Returns how many events that processed (0 for
    the other paths).  Idempotent."""
    sink = getattr(query_or_sink, "activedb_sink", query_or_sink)
    return sink.handler.end_of_stream(sink.db, sink.query_name, sink.statistics().query_id)
