"""The one batch protocol: :func:`run_batch` runs a batch through any :class:`BatchHandler` (the rule path
``_rules.py``, the engines' handlers beside them — ``activedb.streams``, ``activedb.batch``,
``activedb.composite``, ``activedb.capture`` — and a connector's own) exactly once; every connector reaches it
through :class:`~activedb.ingest.Ingestion`.  :class:`BatchContext` is what it gets of the ingestion (with the
validation of a batch's rows), :class:`BatchInput` what a handler gets of a batch.  Design note: ``README.md``
in this package ("One batch").

Thread-safety: a handler is called by one batch at a time (its connector's contract); the engines behind the
handlers refuse concurrent batches themselves.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeGuard, TypedDict

from activedb import lowlevel
from activedb._gc import no_cyclic_gc
from activedb.deadletters import FinalReason, Letter
from activedb.errors import BatchAlreadyCommitted, SerializationConflict
from activedb.ingest._failures import find_culprits, is_poison_failure, refused_writes, trial
from activedb.ingest._interface import Phase, RowEvent, Rows, row_count
from activedb.ingest._ledger import IngestionLedger, RecordedBatch, ingested_event_ids, recorded_batch
from activedb.ingest._letters import BatchLetters
from activedb.ingest._mapping import EventMapping, RawEvent, rows_to_events
from activedb.ingest._outcome import BatchBook, BatchOutcome, PhaseTimings
from activedb.ingest.errors import IngestError, first_line
from activedb.lazy import once
from activedb.ingest._watch import Watch, letters_written_ahead
from activedb.tracing import BatchTrace, BatchTracing

if TYPE_CHECKING:  # pragma: no cover
    import sqlalchemy as sa

    from activedb.ingest._database import IngestDatabase
    from activedb.txn import CommitParticipant, Transaction

__all__ = ["AppliedBatch", "AtCommit", "BatchContext", "BatchHandler", "BatchInput", "run_batch"]

logger = logging.getLogger("activedb.ingest")

_FLUSH, _COMMITTED = Phase.FLUSH, Phase.COMMITTED


class AppliedBatch(Protocol):
    """What :meth:`BatchInput.at_commit`'s callbacks read of a batch applied inside the commit
    (``activedb.batch.BatchResult`` is one): how many of its events committed, and each aborted one with why."""

    @property
    def committed_count(self) -> int: ...

    @property
    def dead_letters(self) -> Sequence[tuple[RowEvent, str]]: ...


class AtCommit(TypedDict):
    """The keyword arguments :meth:`BatchInput.at_commit` gives ``activedb.batch.apply_at_commit``."""

    query_id: str
    batch_id: int
    on_result: Callable[[AppliedBatch, sa.Connection], None]
    letters: Callable[[AppliedBatch], list[Letter]]


@dataclass(frozen=True)
class BatchInput:
    """One batch as a handler sees it.  Immutable.

    ``rows``: the batch as delivered (mappings, or a ``pyarrow.Table``); ``events``: its events sorted by
    application time — the rows that validated, or those the connector made itself (change capture) — each
    with ``position``, its row's index (empty if the handler reads the rows itself); ``letters``: the dead
    letters (``activedb.deadletters.Letter``) of the rows already rejected — the handler adds its own and stores
    them all; ``dead_letters`` is the batch's dead-letter sink: ``dead_letters.for_events([(event, reason), …])``
    makes letters keeping the original rows of events of this batch, ``dead_letters.insert(tx, letters)`` stores
    them in ``tx``.  ``query_id`` is the run's ledger id (a :class:`~activedb.ingest.LedgerId`'s text),
    ``query_name`` the source's name.  ``written_ahead``: how many of the batch's rows a deadline made dead letters
    ahead of it (a rule that did not return in an earlier run of the batch) — left out of ``events``, their letters
    stored already; the core counts them in the ledger's ``dead_letters``, a handler that counts failures of its
    own (capture's ``failed``) adds them."""

    rows: Rows
    events: tuple[Any, ...]
    letters: tuple[Letter, ...]
    query_id: str
    query_name: str
    batch_id: int
    watermark: dt.datetime | None
    dead_letters: BatchLetters
    written_ahead: int = 0

    def holds(self, event: object) -> TypeGuard[RowEvent]:
        """Whether ``event`` is one of this batch's ``events`` (the same object; an engine's event
        points back to it as its ``origin``)."""
        return id(event) in self._event_ids

    @once
    def _event_ids(self) -> frozenset[int]:
        return frozenset(map(id, self.events))

    def at_commit(self, ledger: IngestionLedger, *, refused_may_come_again: bool = False) -> AtCommit:
        """The keyword arguments of ``activedb.batch.apply_at_commit`` (and ``apply_lowered``) for this batch's
        ``events``: labelled with its query and batch id; inside the commit, before the ledger's write, the
        ledger's counts (``on_result``) and the dead letters — the batch's own and one per aborted event,
        ``aborted: <reason>`` (a ``FinalReason`` as it is), keeping the row as delivered (``letters``; ``event.position`` of a result is
        the index in ``events``, whose own ``.position`` is its row).  ``refused_may_come_again``: the
        ledger records the ids of the applied events only (as the rule path does: a refused one may come
        again)."""
        events, base = self.events, list(self.letters)

        def counts(result: AppliedBatch, connection: sa.Connection) -> None:
            ledger.events = result.committed_count
            ledger.dead_letters = len(base) + len(result.dead_letters)
            if refused_may_come_again and result.dead_letters and ledger.query_name is not None:
                refused = {event.position for event, _ in result.dead_letters}
                ledger.event_ids = [event.event_id for position, event in enumerate(events) if position not in refused]

        def letters(result: AppliedBatch) -> list[Letter]:
            return base + self.dead_letters.for_events(
                [(events[event.position], reason if isinstance(reason, FinalReason) else f"aborted: {reason}")
                 for event, reason in result.dead_letters])

        return {"query_id": self.query_id, "batch_id": self.batch_id, "on_result": counts, "letters": letters}


class BatchHandler:
    """Where a batch's events go: a handler overrides :meth:`handle` and what it does differently from these
    defaults (SQLAlchemy's style: each method's docstring is its contract).  A handler is bound to one
    database by the ingestion that takes it (:meth:`bind`) and runs one batch at a time."""

    #: The path's name, for messages and statistics (``"rules"``, ``"queries"``, ``"tpg"``, ``"composite"``, …).
    name = "handler"
    #: True: the core dead-letters rows older than the batch's watermark before ``handle`` (the lateness rule
    #: of a punctuated source).  False: the handler's engine decides lateness itself.
    late_rows_are_dead_letters = True
    #: True: the core validates the rows against the mapping (``rows_to_events``) and passes the events;
    #: False: the handler reads ``BatchInput.rows`` itself (``events`` and ``letters`` are then empty, unless
    #: the connector handed over its own events).
    validates_rows = True
    #: True: ``apply_events(tx, events)`` applies any subset of the batch's events, so a commit
    #: PostgreSQL refuses is searched for its culprits (trial flushes) instead of failing the batch.
    searches_poison = False

    def bind(self, db: IngestDatabase, mapping: EventMapping | None) -> None:
        """The ingestion that takes this handler feeds ``db`` with rows mapped by ``mapping`` (None: the rows are
        not mapped): called once, before the first batch; raise :class:`~activedb.ingest.errors.IngestError` if
        the handler cannot work with them.  Nothing to do here."""

    def accepted_types(self) -> frozenset[str] | None:
        """Event types accepted when the ingestion is given no ``known_types`` (None: any)."""
        return None

    def handle(self, tx: Transaction, batch: BatchInput, ledger: IngestionLedger) -> None:
        """Apply ``batch`` inside ``tx`` (the batch's top-level transaction) and set the ledger's
        ``events`` and ``dead_letters`` — now, or in a commit participant enlisted here that writes
        before the ledger.  Raise to fail the batch (``tx`` then aborts and nothing is kept)."""
        raise NotImplementedError

    def apply_events(self, tx: Transaction, events: list[Any]) -> None:
        """Apply ``events`` in ``tx`` for a trial flush (only called if ``searches_poison``)."""
        raise NotImplementedError

    def is_refusal(self, failure: BaseException) -> bool:
        """Whether the failed commit ``failure`` is PostgreSQL refusing what some events wrote, to be searched for
        them (only asked if ``searches_poison``).  Default: a value it cannot store or a constraint — SQLSTATE
        classes 22, 23, 54, as ``activedb.errors.classify`` says (``is_poison_failure``)."""
        return is_poison_failure(failure)

    def refusal_reason(self, event: Any, refusal: BaseException) -> str:
        """The dead-letter reason of an event whose writes PostgreSQL refused at the commit (``refusal``: what
        it raised in the trial that named the event)."""
        return refused_writes(refusal)

    def retries_refused(self, batch: BatchInput, failure: BaseException) -> bool:
        """PostgreSQL refused the commit of ``batch`` for a value (a poison failure): True if the handler's next
        attempt applies the batch as ``apply_events`` does, where the attempt that failed did not — trial flushes
        could not reproduce the refusal, so the batch is re-run without a culprit search and a refusal of that
        attempt is searched then.  Default False: the trials apply it as the failed attempt did."""
        return False

    def event_in_progress(self) -> RowEvent | None:
        """The event of the batch being applied now, if the handler applies them one by one (asked from another
        thread when a rule passes its deadline: that event becomes the dead letter, ``activedb.ingest.Deadlines``);
        None: no single event is to blame (the default)."""
        return None

    #: True: the handler's engine holds events back across batches (a reorder buffer) until the source ends
    #: (:meth:`release`); False: nothing is held back, and the end of the stream has nothing to do.
    holds_back = False

    def release(self, tx: Transaction, batch: BatchInput, ledger: IngestionLedger) -> None:
        """The source ended: release what the engine still holds back, inside ``tx`` — the run's end-of-stream
        batch (``END_OF_STREAM_BATCH``, no rows; ``Ingestion.end_of_stream``) — and set the ledger's ``events`` and
        ``dead_letters`` as :meth:`handle` does (``batch.dead_letters`` keeps the letters under the batch).  Called
        once per run: its ledger row makes a second call a skipped batch.  Only if :attr:`holds_back`."""
        raise NotImplementedError

    def close(self) -> None:
        """Release the path's resources (the TPG path's worker processes); nothing here."""


@dataclass(frozen=True)
class BatchContext:
    """What the batch protocol needs of the :class:`~activedb.ingest.Ingestion` that calls it (never the
    ingestion itself).  Immutable; ``book`` is thread-safe.

    ``known_types``: the event types the ingestion was given, None if not given (each handler then has its
    default); ``batch_attempts``: top-level attempts per batch on serialization conflicts; ``event_ids_under``:
    the source name event ids are kept under for duplicate detection."""

    db: IngestDatabase
    mapping: EventMapping | None
    query_name: str
    event_ids_under: str
    known_types: frozenset[str] | None
    batch_attempts: int
    book: BatchBook
    #: The spans of the batches (``activedb.tracing``; they are made only when an OpenTelemetry SDK is configured).
    tracing: BatchTracing
    #: What watches the batches (``Deadlines``): each attempt's top-level transaction is told to it.
    watch: Watch | None = None

    def accepted_types(self, handler: BatchHandler) -> frozenset[str] | None:
        """The event types accepted now: ``known_types`` if given, else the handler's (``handler.accepted_types()``,
        for the rules the stream types they listen to; None: any)."""
        return self.known_types if self.known_types is not None else handler.accepted_types()

    def validate(self, rows: Rows, dead: BatchLetters, watermark: dt.datetime | None,
                 accepted: frozenset[str] | None, late_rows_are_dead_letters: bool = True,
                 ) -> tuple[list[RawEvent], list[Letter]]:
        """The batch's valid events (sorted by application time) and the dead letters of the rest: rows
        ``rows_to_events`` rejects (or of a type not in ``accepted``; None: any), events older than
        ``watermark`` (if ``late_rows_are_dead_letters``) and duplicate ids."""
        mapping = self.mapping
        if mapping is None:
            raise IngestError("a batch of rows is validated against an EventMapping, and this ingestion has none: give "
                              "it one (feed(db, batches, mapping=...), Ingestion(db, mapping, ...))")
        good, bad = rows_to_events(rows, mapping, accepted)
        letters = dead.rejected(bad)
        if watermark is not None and late_rows_are_dead_letters:
            on_time = [event for event in good if event.ts >= watermark]
            if len(on_time) != len(good):
                letters += dead.for_events([(event, f"late: {mapping.ts_column} {event.ts.isoformat()} is older "
                                                    f"than the stream's watermark {watermark.isoformat()} (Spark's "
                                                    f"lateness rule)") for event in good if event.ts < watermark])
                good = on_time
        if mapping.id_column is not None:
            good, duplicates = self.without_duplicates(good)
            letters += dead.for_events(duplicates)
        return good, letters

    def without_duplicates(self, events: list[RawEvent]) -> tuple[list[RawEvent], list[tuple[RawEvent, str]]]:
        """Split off events whose id was already ingested under ``event_ids_under``, or appeared earlier in
        the batch (the first occurrence, in application-time order, is applied)."""
        seen = ingested_event_ids(self.db, self.event_ids_under,
                                  [event.event_id for event in events])  # type: ignore[misc]  # (an id column: ids)
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
                first[event.event_id] = event  # type: ignore[index]
                kept.append(event)
        return kept, duplicates


def run_batch(context: BatchContext, handler: BatchHandler, rows: Rows, batch_id: int, *, query_id: str,
              watermark: dt.datetime | None, timings: PhaseTimings, punctuate: bool = True,
              participants: tuple[CommitParticipant, ...] = (), events: Sequence[RowEvent] | None = None,
              fresh: bool = False) -> BatchOutcome:
    """One batch through ``handler``, exactly once; returns its outcome.  ``participants``: more commit
    participants of the batch's transaction (lineage, a replay's mark, capture's position), enlisted before the
    ledger; ``events``: the batch's events, made by the connector (nothing is validated then); ``fresh``: the
    connector vouches the ledger cannot have the batch but through a duplicate run (``Ingestion.process``).
    Raises only when the batch could not be committed (PostgreSQL unusable, conflicts beyond
    ``batch_attempts``, a refused commit the handler cannot search)."""
    count = row_count(rows)
    trace = context.tracing.start(query_id, batch_id, count, timings.to_arrow)
    try:
        outcome = _run_batch(context, handler, rows, count, batch_id, query_id, watermark, timings, punctuate,
                             participants, events, fresh, trace)
    except BaseException as error:
        if trace is not None:
            trace.end(None, error)
        raise
    if trace is not None:       # (None: no SDK configured, no span)
        trace.end(outcome)
    return outcome


def _run_batch(context: BatchContext, handler: BatchHandler, rows: Rows, row_count: int, batch_id: int,
               query_id: str, watermark: dt.datetime | None, timings: PhaseTimings, punctuate: bool,
               participants: tuple[CommitParticipant, ...], events: Sequence[RowEvent] | None, fresh: bool,
               trace: BatchTrace | None) -> BatchOutcome:
    """:func:`run_batch`'s work; ``trace``: the batch's spans (None: not traced)."""
    book = context.book
    began = time.perf_counter() - timings.to_arrow
    # A replay of a committed batch is skipped before anything runs; the batch after the one this ingestion
    # committed last cannot be one (BatchBook.follows_committed), nor a batch the connector vouches for: their
    # round trips to the ledger are saved (a duplicate run is refused at the commit).  A batch the ledger has is
    # compared with the rows it recorded: one that comes again with another count is refused (_skip).
    ahead: dict[int, int] = {}      # rows dead-lettered ahead of this batch (a rule past its deadline): left out
    if not (fresh or book.follows_committed(query_id, batch_id)):
        recorded = recorded_batch(context.db, query_id, batch_id)
        if recorded is not None:
            return _skip(context, recorded, query_id, batch_id, row_count, watermark, timings, began, fresh)
        ahead = letters_written_ahead(context.db, query_id, batch_id)
    elif fresh and not book.committed_any(query_id):
        # A batch the connector vouches for may still be the re-run of one a deadline gave up (in a process that
        # then ended): until this ingestion has committed one, the letters written ahead are asked for.
        ahead = letters_written_ahead(context.db, query_id, batch_id)

    with no_cyclic_gc():    # until the tree has ended, then one young collection (activedb._gc.no_cyclic_gc)
        started = time.perf_counter()
        good: list[Any] = []
        letters: list[Letter] = []
        dead = BatchLetters(rows, query_id, batch_id, context.mapping)
        if events is not None:
            good = list(events)
        elif handler.validates_rows:
            good, letters = context.validate(rows, dead, watermark, context.accepted_types(handler),
                                             handler.late_rows_are_dead_letters)
        if ahead:
            good = [event for event in good if event.position not in ahead]
        timings = timings + PhaseTimings(validate=time.perf_counter() - started)

        batch = BatchInput(
            rows=rows, events=tuple(good), letters=tuple(letters), query_id=query_id, query_name=context.query_name,
            batch_id=batch_id, watermark=watermark, dead_letters=dead, written_ahead=len(ahead))
        attempt = 0
        unreproduced = False      # a refusal no trial reproduced was met once: the batch was re-run as it was
        while True:
            attempt += 1
            started = time.perf_counter()
            # (Without a listener the ledger has nothing to do at about_to_commit: the COMMIT rides with the last
            # statement of the flush.)
            ledger = IngestionLedger(context.db, query_id, batch_id,
                                     on_flush=functools.partial(book.phase, _FLUSH) if book.hears_phases else None)
            ledger.watermark = watermark
            ledger.row_count = row_count
            if context.mapping is not None and context.mapping.id_column is not None:
                ledger.query_name = context.event_ids_under
                ledger.event_ids = [event.event_id for event in batch.events]
            try:
                with context.db.transaction(name=f"ingest:{context.query_name}", participants=list(participants)) as tx:
                    if trace is not None:       # the firings in tx's tree are the batch's
                        trace.transaction(tx)
                    if context.watch is not None:
                        context.watch.transaction(tx)
                    # Re-run until it commits: an aborted attempt is no outcome for the detached rules it fired.
                    context.db.outbox.mark_replayed(tx)
                    handler.handle(tx, batch, ledger)
                    ledger.dead_letters += batch.written_ahead   # rows whose letters a deadline wrote ahead of it
                    if trace is not None:       # the commit's span, ended by a participant's committed/aborted
                        trace.commit_started(tx)
                    lowlevel.enlist(tx, ledger)        # last: a participant the handler enlisted writes the counts first
                    exit_began = time.perf_counter()
            except BatchAlreadyCommitted:
                book.committed(query_id, batch_id)     # (a duplicate run's: the batch after it is not asked either)
                recorded = None if fresh else recorded_batch(context.db, query_id, batch_id)
                return _skip(context, recorded, query_id, batch_id, row_count, watermark, timings, began, fresh)
            except SerializationConflict:
                # Another process feeding the source may have committed this very batch meanwhile (what the attempt
                # conflicted with): then it is done, not to be re-run — nor a conflict to raise past the attempts.
                recorded = recorded_batch(context.db, query_id, batch_id)
                if recorded is not None:
                    return _skip(context, recorded, query_id, batch_id, row_count, watermark, timings, began, fresh)
                if attempt >= context.batch_attempts:
                    raise
                logger.info("batch %s of %s conflicted with another process; re-running it (%d of %d)",
                            batch_id, query_id, attempt + 1, context.batch_attempts)
                continue
            except Exception as failure:
                if not (handler.searches_poison and handler.is_refusal(failure)):
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
    book.phase(_COMMITTED, batch_id)
    if punctuate and watermark is not None:
        context.db.punctuate(context.query_name, watermark)
    outcome = BatchOutcome(query_id, batch_id, True, row_count, ledger.events, ledger.dead_letters,
                           dict(ledger.rule_firings), watermark, timings, attempt)
    return book.record(outcome, began)


def _skip(context: BatchContext, recorded: RecordedBatch | None, query_id: str, batch_id: int, row_count: int,
          watermark: dt.datetime | None, timings: PhaseTimings, began: float, fresh: bool) -> BatchOutcome:
    """The outcome of a batch the ledger has (``recorded``; None: not read) — skipped, unless it came again with
    another number of rows than it was committed with: then the source does not replay the same batches, and
    IngestError says so.  A batch the connector vouches for (``fresh``: capture, whose batch from the same position
    may hold more changes when another process committed it first) is not compared: its duplicate is a concurrent
    run's, which the connector handles."""
    if recorded is not None and not fresh:
        recorded.check_delivered_again(query_id, batch_id, row_count)
    return context.book.skipped(query_id, batch_id, row_count, watermark, timings, began)


def _without_culprits(context: BatchContext, handler: BatchHandler, batch: BatchInput, failure: BaseException,
                      unreproduced: bool) -> tuple[BatchInput, bool]:
    """PostgreSQL refused the batch's commit because of what some event wrote (a key too large for its
    index, a constraint): the batch without those events, which become dead letters; and whether a refusal
    no trial reproduced has been met.  The first such refusal re-runs the batch as it is (it may have been
    another transaction's doing); the second names the batch's last event (``find_culprits``)."""
    culprits = find_culprits(
        lambda events: trial(context.db, context.query_name, handler.apply_events, events, handler.is_refusal),
        list(batch.events),
        failure, handler.refusal_reason, blame_unreproduced=unreproduced)
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
