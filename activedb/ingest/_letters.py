"""What every path of a micro-batch shares with the sink that calls it: :class:`SinkContext` (the typed
interface a path gets instead of the sink, with the validation of a batch's rows), :class:`BatchLetters`
(the batch's typed dead-letter sink) and :func:`no_cyclic_gc`.  Design note: the package's ``README.md``."""

from __future__ import annotations

import contextlib
import datetime as dt
import gc
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from activedb import deadletters
from activedb.deadletters import Letter
from activedb.ingest._ledger import ingested_event_ids
from activedb.ingest._mapping import EventMapping, RawEvent, Rejected, rows_to_events
from activedb.ingest._outcome import BatchBook
from activedb.tracing import BatchTracing

if TYPE_CHECKING:  # pragma: no cover
    from activedb.txn import Transaction

__all__ = ["BatchLetters", "SinkContext", "no_cyclic_gc"]


class BatchLetters:
    """Dead letters of batch ``batch_id`` of ledger query ``query_id``, whose rows are ``rows`` (a
    ``pyarrow.Table``/``RecordBatch`` or a list), each keeping its row exactly as Spark (or the caller)
    delivered it, inserted through :func:`activedb.deadletters.insert`.  Immutable after construction;
    safe to share."""

    def __init__(self, db: Any, rows: Any, query_id: str, batch_id: int | None):
        self._catalog = db.catalog
        self._rows = rows
        self.query_id = query_id
        self.batch_id = batch_id

    def rejected(self, bad: Iterable[Rejected]) -> list[Letter]:
        """Letters for rows ``rows_to_events`` rejected."""
        bad = list(bad)
        from_rows = [item for item in bad if item.position >= 0]
        originals = dict(zip(map(id, from_rows), self._originals([item.position for item in from_rows])))
        # A rejection that is no row of the batch (position -1: e.g. a composition heartbeat out of order)
        # keeps what it describes.
        return [Letter(item.reason, originals.get(id(item), item.row), item.row) for item in bad]

    def for_events(self, failed: Sequence[tuple[RawEvent, str]]) -> list[Letter]:
        """Letters for events of this batch, each ``(event, reason)``, with the row each came from."""
        originals = self._originals([event.position for event, _ in failed])
        return [Letter(reason, original, _shown(original)) for (_, reason), original in zip(failed, originals)]

    def insert(self, tx: Transaction, letters: Sequence[Letter]) -> None:
        """Insert ``letters`` in ``tx`` (they commit with the batch)."""
        deadletters.insert(tx, self._catalog, self.query_id, self.batch_id, letters)

    def _originals(self, positions: list[int]) -> list[Any]:
        rows = self._rows
        if hasattr(rows, "take"):
            return [rows.take([position]) for position in positions]
        return [rows[position] for position in positions]


def _shown(original: Any) -> dict | None:
    """The readable form (``raw``) of a one-row Arrow table: its columns made storable JSON; None for any
    other row (``Letter.raw`` makes it)."""
    if hasattr(original, "to_pylist") and hasattr(original, "schema"):
        from activedb.ingest._arrow import jsonable_rows

        return jsonable_rows(original)[0]
    return None


@dataclass(frozen=True)
class SinkContext:
    """What a batch path (the rule path, a ``BatchHandler``) needs from its ``IngestSink``.  Immutable;
    ``book`` is thread-safe.

    ``known_types``: the event types given to ``ingest(known_types=…)``, None if not given (each path
    then has its default); ``batch_attempts``: top-level attempts per batch on serialization conflicts;
    ``event_ids_under``: the query name event ids are kept under for duplicate detection."""

    db: Any
    mapping: EventMapping
    query_name: str
    event_ids_under: str
    known_types: frozenset[str] | None
    batch_attempts: int
    book: BatchBook
    #: The spans of the batches (``activedb.tracing``; they are made only when an OpenTelemetry SDK is configured).
    tracing: BatchTracing | None = None

    def accepted_types(self, handler: Any) -> frozenset[str] | None:
        """The event types accepted now: ``known_types`` if given, else the path's (``handler.accepted_types()``,
        for the rules the stream types they listen to; None: any)."""
        return self.known_types if self.known_types is not None else handler.accepted_types()

    def validate(self, rows: Any, dead: BatchLetters, watermark: dt.datetime | None,
                 accepted: frozenset[str] | None, late_rows_are_dead_letters: bool = True,
                 ) -> tuple[list[RawEvent], list[Letter]]:
        """The batch's valid events (sorted by application time) and the dead letters of the rest: rows
        ``rows_to_events`` rejects (or of a type not in ``accepted``; None: any), events older than
        ``watermark`` (Spark's lateness rule; if ``late_rows_are_dead_letters``) and duplicate ids."""
        good, bad = rows_to_events(rows, self.mapping, accepted)
        letters = dead.rejected(bad)
        if watermark is not None and late_rows_are_dead_letters:
            on_time = [event for event in good if event.ts >= watermark]
            if len(on_time) != len(good):
                letters += dead.for_events([(event, f"late: {self.mapping.ts_column} {event.ts.isoformat()} is older "
                                                    f"than the stream's watermark {watermark.isoformat()} (Spark's "
                                                    f"lateness rule)") for event in good if event.ts < watermark])
                good = on_time
        if self.mapping.id_column is not None:
            good, duplicates = self.without_duplicates(good)
            letters += dead.for_events(duplicates)
        return good, letters

    def without_duplicates(self, events: list[RawEvent]) -> tuple[list[RawEvent], list[tuple[RawEvent, str]]]:
        """Split off events whose id was already ingested under ``event_ids_under``, or appeared earlier in
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


@contextlib.contextmanager
def no_cyclic_gc() -> Iterator[None]:
    """Pause the cyclic garbage collector for one batch — validation, the events, the commit and its
    flush — and collect the youngest generation once after it: every event leaves records that live until
    the batch's tree ends, which a collector inside the batch would rescan again and again (why and what
    it saves: the package's ``README.md``, "Where the time goes now").  The pause is process-wide.  A
    caller that disabled the collector itself keeps it disabled and gets no collection."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
            gc.collect(0)
