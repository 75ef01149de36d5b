"""What a connector holds: :class:`Ingestion` — one source's batches into ``db`` through one handler, exactly
once (:func:`~activedb.ingest._protocol.run_batch`), with the statistics every connector reports.  Design note:
``README.md`` in this package ("The interface", "One batch").

Thread-safety: the ingestion's :class:`~activedb.ingest._outcome.BatchBook` keeps the statistics under its own
mutex; :meth:`Ingestion.process` may be called from several threads (each call runs its own top-level
transaction), but a handler runs one batch at a time, so a connector calls it for one batch at a time per
handler (Spark's ``foreachBatch`` does).  No mutex is held while calling the handler or PostgreSQL.
"""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING

from activedb.errors import check_seconds, check_switch, check_whole_number
from activedb.ingest._interface import LedgerId, Phase, ReservedSource, RowEvent, Rows, _split
from activedb.ingest._ledger import (END_OF_STREAM_BATCH, IngestionLedger, check_source_name,
                                     check_source_owner, last_watermark)
from activedb.ingest._mapping import EventMapping, as_mapping, check_columns, is_arrow, known_type_names
from activedb.ingest._outcome import BatchBook, BatchOutcome, IngestStatistics, PhaseTimings
from activedb.ingest._protocol import BatchContext, BatchHandler, BatchInput, run_batch
from activedb.ingest._rules import RulesHandler
from activedb.ingest._watch import BatchInProgress, Deadlines, Watch
from activedb.ingest.errors import IngestError, MappingError
from activedb.tracing import BatchTracing

from activedb.ingest._database import IngestDatabase, check_database

if TYPE_CHECKING:  # pragma: no cover
    from activedb.txn import CommitParticipant, Transaction

__all__ = ["IngestDatabase", "Ingestion"]

_UTC = dt.timezone.utc


class Ingestion:
    """Batches of the source ``source`` into ``db`` through ``handler`` (the rules by default: :class:`RulesHandler`).

    * ``mapping`` — which columns make an event (an :class:`EventMapping` or a dict of its arguments); None for a
      handler that reads the rows itself or a connector that hands over events (change capture);
    * ``source`` — the stable name of the source: the ledger ids' first part, the punctuation source, the name
      of the batches' transactions (``ingest:<source>``); at most ``SOURCE_NAME_BYTES`` (2048) bytes in UTF-8,
      without a NUL or a lone surrogate; a name beginning with a :class:`ReservedSource` (``replay:``,
      ``capture:``) is refused unless ``owner`` is it;
    * ``known_types`` — the event types accepted (default: the handler's, for the rules the types they listen to);
    * ``batch_attempts`` — top-level attempts of a batch that meets serialization conflicts;
    * ``on_phase(phase, batch_id)`` — hears every :class:`Phase` of every batch (a seam for crash tests);
    * ``lineage`` — every batch transaction records the source batch it consumed (``db.batches``, the atomic
      batch features; the design note says where it is on);
    * ``event_ids_under`` — the source name whose ingested event ids count for duplicate detection
      (``EventMapping.id_column``; default ``source``; a dead-letter replay passes the original source).
    * ``deadlines`` — how long a batch and a rule firing in it may run (:class:`Deadlines`); given, the batches run
      on a thread of the ingestion's own while the caller waits with the deadlines, and the batch in progress is
      seen (:meth:`batch_in_progress`, ``activedb status``).  None (the default): the batch runs on the caller's
      thread, without deadlines.
    * ``owner`` — the extender tier, for activedb's own connectors only: the :class:`ReservedSource` whose name
      ``source`` is (the replay of dead letters, a change-capture consumer); None (the default) for any other.

    Thread-safety: see the module docstring.
    """

    def __init__(self, db: IngestDatabase, mapping: EventMapping | Mapping[str, object] | None = None, *, source: str,
                 handler: BatchHandler | None = None, known_types: Collection[str] | None = None,
                 batch_attempts: int = 3, on_phase: Callable[[Phase, int], None] | None = None, lineage: bool = False,
                 event_ids_under: str | None = None, deadlines: Deadlines | None = None,
                 owner: ReservedSource | None = None) -> None:
        check_database("Ingestion", db)
        if mapping is not None:
            try:
                mapping = as_mapping(mapping)
            except MappingError as error:
                raise IngestError(f"mapping: {error}") from None
        check_source_name("Ingestion", "source", source)
        check_source_owner("Ingestion", source, owner)
        check_whole_number("Ingestion", "batch_attempts", batch_attempts, 1, " (top-level attempts of a batch)",
                           error=IngestError)
        check_switch("Ingestion", "lineage", lineage, error=IngestError)
        if event_ids_under is not None and not isinstance(event_ids_under, str):
            raise IngestError(f"Ingestion(event_ids_under={event_ids_under!r}) takes a source's name (the source "
                              f"whose ingested event ids count for duplicates), or None for this ingestion's source")
        if event_ids_under is not None:
            check_source_name("Ingestion", "event_ids_under", event_ids_under)
        if on_phase is not None and not callable(on_phase):
            raise IngestError(f"Ingestion(on_phase={on_phase!r}) takes a function of (phase, batch_id), called with "
                              f"every phase of every batch, or None")
        handler = RulesHandler() if handler is None else handler
        if not isinstance(handler, BatchHandler):
            raise IngestError(f"handler must be an activedb.ingest.BatchHandler (RulesHandler, "
                              f"streams.QueriesHandler, batch.TpgHandler, composite.CompositeHandler, …), got "
                              f"{handler!r}")
        if mapping is not None and mapping.id_column is not None and not handler.validates_rows:
            # (The ids are checked among the rows the core validates, which such a handler reads itself.)
            raise IngestError(
                f"mapping id_column={mapping.id_column!r}: the {handler.name} handler ({type(handler).__name__}) reads "
                f"the rows itself, and duplicate event ids are found only among rows the ingestion validates — none "
                f"would be; drop id_column from the mapping and remove duplicate rows before they come (Spark: "
                f"frame.dropDuplicatesWithinWatermark([{mapping.id_column!r}]))")
        known_types = known_type_names(known_types, "known_types", IngestError)
        if deadlines is not None and not isinstance(deadlines, Deadlines):
            raise IngestError(f"deadlines must be an activedb.ingest.Deadlines (or None), got {deadlines!r}")
        handler.bind(db, mapping)
        self.db = db
        self.mapping = mapping
        self.source = source
        #: Where the batches go; bound to ``db`` here, never changed.
        self.handler = handler
        self.lineage = lineage
        #: What the batch protocol needs of this ingestion (``run_batch`` gets it, not the ingestion).
        self.context = BatchContext(db, mapping, source, event_ids_under or source,
                                   known_types, batch_attempts,
                                   BatchBook(source, on_phase, wall=db.clock.wall), BatchTracing(db, source),
                                   None if deadlines is None else Watch(db, source, deadlines, mapping))
        self._book = self.context.book

    @property
    def query_name(self) -> str:
        """The source name (what ``ingest()`` calls the query's name)."""
        return self.source

    def process(self, rows: Rows, batch_id: int, *, query_id: str, watermark: dt.datetime | None = None,
                extra_timings: PhaseTimings | None = None, punctuate: bool = True,
                participants: Collection[CommitParticipant] = (), events: Sequence[RowEvent] | None = None,
                fresh: bool = False) -> BatchOutcome:
        """Apply batch ``batch_id`` of the run ``query_id`` (a :class:`LedgerId`'s text) — ``rows``, a sequence of
        mappings or a ``pyarrow.Table``/``RecordBatch`` — exactly once; returns its outcome.

        ``watermark``: events older are dead letters, and it is punctuated after the commit (``punctuate=False``:
        the caller does); ``participants``: more commit participants of the batch's transaction (a replay's mark,
        capture's position), before the ledger; ``events``: the batch's events when the connector made them
        itself (change capture), each with ``position``, its row's index — nothing is validated then; ``fresh``:
        the connector vouches that the ledger cannot have the batch but through a duplicate run (its position
        commits with the ledger row), so the ledger is not asked first (a duplicate is refused at the commit).
        An Arrow batch whose columns do not fit the mapping (one it names missing, one repeated: ``check_columns``)
        is refused before anything is applied.  Otherwise raises only when the batch could not be committed
        (PostgreSQL unusable, conflicts beyond ``batch_attempts``, a refused commit the handler cannot search); the
        batch may then be re-run."""
        _check_query_id(query_id)
        _check_source(query_id, self.source)
        _check_batch_id(batch_id, query_id)
        _check_rows(rows, batch_id, query_id)
        if self.mapping is not None and events is None and self.handler.validates_rows and is_arrow(rows):
            check_columns(rows.schema.names, self.mapping, before="before feeding the batch; nothing was applied")
        if watermark is not None and not (isinstance(watermark, dt.datetime) and watermark.tzinfo is not None):
            raise IngestError(f"batch {batch_id} of {query_id}: a watermark is an aware datetime (UTC), as Batch "
                              f"takes it, got {watermark!r}; nothing was applied")
        with self._book.in_batch():
            try:
                if self.lineage:
                    participants = (*participants, self.db.batches.consuming(
                        str(LedgerId.parse(query_id).whole()), batch_id))
                run = functools.partial(run_batch, self.context, self.handler, rows, batch_id, query_id=query_id,
                                        watermark=watermark, timings=extra_timings or PhaseTimings(),
                                        punctuate=punctuate, participants=tuple(participants), events=events,
                                        fresh=fresh)
                watch = self.context.watch
                if watch is not None:
                    return watch.run(query_id, batch_id, rows, run, self.handler.event_in_progress)
                with self._book.running(query_id, batch_id, rows):
                    return run()
            except BaseException as error:      # last_failure() (activedb run's restart after a deadline reads it)
                self._book.failed(batch_id, error)
                raise

    def reject(self, rows: Rows, batch_id: int, *, query_id: str, reason: str,
               participants: Collection[CommitParticipant] = ()) -> BatchOutcome:
        """Give up on batch ``batch_id`` of the run ``query_id``: every row a dead letter with ``reason`` (kept
        exactly as delivered), committed with the batch's ledger row — so the batch counts as done and a
        re-delivery is skipped — in one transaction with ``participants`` (a connector's record of why: the Spark
        scale-out path's failed partition).  Exactly once, as :meth:`process`."""
        _check_query_id(query_id)
        _check_source(query_id, self.source)
        _check_batch_id(batch_id, query_id)
        _check_rows(rows, batch_id, query_id)
        if not isinstance(reason, str):
            raise IngestError(f"Ingestion.reject(reason={reason!r}) takes a text: the dead letters' reason, one sentence "
                              f"saying why the batch was given up; nothing was applied")
        with self._book.in_batch():
            return run_batch(self.context, _Rejected(reason), rows, batch_id, query_id=query_id, watermark=None,
                             timings=PhaseTimings(), punctuate=False, participants=tuple(participants))

    def resume(self, query_id: str) -> None:
        """A run resumes (a restarted process): punctuate again the last watermark the ledger recorded for it
        (punctuations live in memory; every batch's ledger row keeps its watermark)."""
        _check_query_id(query_id)
        _check_source(query_id, self.source)
        resumed = last_watermark(self.db, query_id)
        if resumed is not None:
            self.db.punctuate(self.source, resumed.astimezone(_UTC))
        self._book.running_as(query_id)

    def known_types(self) -> frozenset[str] | None:
        """The event types accepted now (``known_types``, else the handler's)."""
        return self.context.accepted_types(self.handler)

    def end_of_stream(self, query_id: str | None = None) -> int:
        """The source ended: the handler releases what its engine still holds back (``streams``) in the run's
        end-of-stream batch — number ``END_OF_STREAM_BATCH``, exactly once, with its ledger row, so that the ledger
        accounts for every row delivered —; returns how many events that applied (0 for a handler that holds
        nothing back, or a second call).  ``query_id``: the run (default: the last one this ingestion saw)."""
        if query_id is not None:
            _check_query_id(query_id)
            _check_source(query_id, self.source)
        query_id = query_id or self._book.statistics().query_id
        if not self.handler.holds_back or query_id is None:
            return 0
        with self._book.in_batch():
            outcome = run_batch(self.context, _EndOfStream(self.handler), [], END_OF_STREAM_BATCH,
                                query_id=query_id, watermark=None, timings=PhaseTimings(), punctuate=False)
        return outcome.events if outcome.committed else 0

    # -- statistics (the book's) --------------------------------------------------------------

    def phase(self, phase: Phase, batch_id: int) -> None:
        """Tell ``on_phase`` that batch ``batch_id`` reached ``phase`` (a connector's own phases: ``FETCHED``).
        ``phase``: a :class:`Phase` or its value (``"fetched"``); ``on_phase`` hears the member.  Anything else
        raises :class:`~activedb.errors.InvalidChoice` naming the members."""
        self._book.phase(Phase.parse(phase, "Ingestion.phase(phase=...)"), batch_id)

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until no batch is being processed; False if ``timeout`` passed first."""
        check_seconds("wait_idle", "timeout", timeout, none="no limit", error=IngestError)
        return self._book.wait_idle(timeout)

    def last_failure(self) -> tuple[int, BaseException] | None:
        """``(batch id, the exception)`` of the last batch that raised out of the ingestion, or None."""
        return self._book.last_failure()

    def recent_outcomes(self) -> list[BatchOutcome]:
        """The last :data:`~activedb.ingest._outcome.RECENT_OUTCOMES` batches' outcomes, oldest first."""
        return self._book.recent_outcomes()

    def statistics(self) -> IngestStatistics:
        """A consistent snapshot of the counters (see :class:`IngestStatistics`)."""
        return self._book.statistics()

    def batch_in_progress(self) -> BatchInProgress | None:
        """The batch running now (None between batches): how long, and — with :class:`Deadlines` — its oldest rule
        firing still running and the time to its first deadline."""
        watch = self.context.watch
        return watch.in_progress() if watch is not None else self._book.in_progress()

    def close(self) -> None:
        """Release the handler's resources (the TPG path's worker processes), the tracing's observer and the
        deadlines' thread."""
        self.handler.close()
        self.context.tracing.close()
        if self.context.watch is not None:
            self.context.watch.close()


class _EndOfStream(BatchHandler):
    """The batch path of :meth:`Ingestion.end_of_stream`: the handler's :meth:`~BatchHandler.release`."""

    name = "end of stream"
    validates_rows = False

    def __init__(self, handler: BatchHandler) -> None:
        self.handler = handler

    def handle(self, tx: Transaction, batch: BatchInput, ledger: IngestionLedger) -> None:
        self.handler.release(tx, batch, ledger)


class _Rejected(BatchHandler):
    """The batch path of :meth:`Ingestion.reject`: every row a dead letter with ``reason``."""

    name = "rejected"
    validates_rows = False

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def handle(self, tx: Transaction, batch: BatchInput, ledger: IngestionLedger) -> None:
        letters = batch.dead_letters.all_rows(self.reason)
        batch.dead_letters.insert(tx, letters)
        ledger.dead_letters = len(letters)


def _check_query_id(query_id: object) -> None:
    """Raise IngestError unless ``query_id`` is a ledger id's text (what ``ingestion_status`` reads back)."""
    try:
        if isinstance(query_id, str):
            parts = _split(query_id)
            if parts is not None:   # (the source is the ingestion's, checked where it was made; a blank run in
                check_source_name("LedgerId", "run", parts[1], run=True)    # the checker's words, not parse's)
            LedgerId.parse(query_id)
            return
    except ValueError:
        pass
    raise IngestError(f"query_id {query_id!r} is no ledger id: give str(LedgerId(source, run)) — "
                      f"'SOURCE@RUN', or a source's name alone; nothing was applied")


def _check_source(query_id: str, source: str) -> None:
    """Raise IngestError unless ``query_id`` (a ledger id's text) is a run of ``source``, the ingestion's: a run of
    another source would be applied, resumed or released under the wrong name."""
    own = LedgerId.parse(query_id).source
    if own != source:
        raise IngestError(f"query_id {query_id!r} is a run of source {own!r}, not of this ingestion's source "
                          f"{source!r}: give str(LedgerId({source!r}, run)), or an Ingestion of source {own!r}; "
                          f"nothing was applied")


def _check_rows(rows: object, batch_id: int, query_id: str) -> None:
    """Raise IngestError unless ``rows`` is a batch of rows: a sequence of rows (mappings) or an Arrow table."""
    if isinstance(rows, (Mapping, str, bytes)):
        # (One row where a batch of rows belongs: its field names would be taken for rows, each rejected.)
        raise IngestError(f"batch {batch_id} of {query_id} is one {type(rows).__name__}, not a batch of rows: a batch "
                          f"is a sequence of rows (mappings) or an Arrow table — feed(db, [[row, ...], ...]); a "
                          f"batch of one row is [row]; nothing was applied")
    if not (isinstance(rows, Sequence) or is_arrow(rows)):
        # (Its rows are counted, read by position and kept in their letters: a list, not an iterator.)
        name = type(rows).__name__
        if type(rows).__module__.split(".")[0] == "pandas" and name == "DataFrame":
            # (list(frame) gives its column names, each then a row that is no mapping.)
            raise IngestError(f"batch {batch_id} of {query_id} is a pandas DataFrame, not a batch of rows: give "
                              f"pyarrow.Table.from_pandas(frame) (an Arrow table), or frame.to_dict('records') (its "
                              f"rows as dicts); nothing was applied")
        what = "None" if rows is None else f"{'an' if name[0] in 'aeiou' else 'a'} {name}"
        raise IngestError(f"batch {batch_id} of {query_id} is {what}, not a batch of rows: a batch is a sequence of "
                          f"rows (mappings) or an Arrow table — list(...) an iterator's rows; nothing was applied")


def _check_batch_id(batch_id: object, query_id: str) -> None:
    """Raise IngestError unless ``batch_id`` is a batch number a connector may give: an integer from 0 that the
    ledger's bigint holds (negative numbers are the ledger's own: ``END_OF_STREAM_BATCH``)."""
    if isinstance(batch_id, bool) or not isinstance(batch_id, int) or not 0 <= batch_id < 2**63:
        raise IngestError(f"batch {batch_id!r} of {query_id}: a batch number is an integer from 0 (below 2**63), as "
                          f"Batch takes it — number a source's batches 0, 1, 2, …; nothing was applied")
