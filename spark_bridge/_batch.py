"""What every path of a micro-batch shares with the sink that calls it: :class:`SinkContext`, the typed
interface a path gets instead of the sink itself (its database, mapping, names, attempts and
:class:`~spark_bridge._outcome.BatchBook`), and the validation of a batch's rows — bad rows, rows older
than the watermark and duplicate event ids become dead letters.  Design note: the package's
``README.md``."""

from __future__ import annotations

import contextlib
import datetime as dt
import gc
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from activedb.deadletters import Letter

from spark_bridge._ledger import ingested_event_ids
from spark_bridge._letters import BatchLetters
from spark_bridge._outcome import BatchBook
from spark_bridge.mapping import EventMapping, RawEvent, rows_to_events

__all__ = ["SinkContext", "no_cyclic_gc"]


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
    flush — and collect the youngest generation once after it.

    Every event leaves records that live until the batch's tree ends, so a collector running inside the
    batch scans a set that only grows, again and again, and promotes it to older generations; paused, the
    batch's objects stay in the youngest generation and the one collection after it frees what the tree
    left in reference cycles (measured: the package's ``README.md``, "Where the time goes now").  The
    pause is process-wide (detached rules running meanwhile run without it too; reference counting still
    frees acyclic objects).  A caller that disabled the collector itself keeps it disabled and gets no
    collection."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
            gc.collect(0)
