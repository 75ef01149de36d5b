"""Feeding a composition engine (``activedb.composite``) from the rows of a micro-batch:
:func:`rows_to_items` (rows — a ``pyarrow.Table``/``RecordBatch`` or dicts — to the engine's events with
accuracy-interval timestamps and heartbeats, plus rejected rows) and :func:`feed_batch` (then
``engine.process(tx, items)``, or ``engine.submit(items)`` without a transaction), and
:class:`CompositeHandler`, the batch path of an ingestion (``handler=CompositeHandler(engine)``).  Each producer's rows
are put back into detection order, so micro-batch boundaries never change a composition's result (the
design note ``activedb/composite/README.md``, "Ingestion").  Pure Python; Arrow rows only if pyarrow is there.
"""

from __future__ import annotations

import datetime as dt
import heapq
import reprlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Mapping, Sequence

from activedb.composite._engine import CompositionEngine, emit_composite
from activedb.composite._model import CompositeEvent, Heartbeat, describe_event, same_event
from activedb.composite._records import TimeoutPolicy
from activedb.errors import InvalidTime, finite_number
from activedb.events import Instant, Timestamp, elapsed
from activedb.ingest import (BatchHandler, BatchInput, EventMapping, IngestionLedger, Rejected, Rows, is_arrow,
                             run_as_event, to_utc)
from activedb.ingest.errors import IngestError, InvalidField, MappingError
from activedb.store import Json, jsonable
from activedb.streams import StreamEvent

if TYPE_CHECKING:  # pragma: no cover
    from activedb._handle import DatabaseHandle
    from activedb.txn import Transaction

__all__ = ["CompositeHandler", "FeedResult", "feed_batch", "rows_to_items"]

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)   # (the order of rows with no local clock reading)


@dataclass(frozen=True)
class FeedResult:
    """What one batch did: the inputs taken, the composite events produced, the rows rejected."""

    items: tuple[StreamEvent | Heartbeat, ...]
    composites: tuple[CompositeEvent, ...]
    rejected: tuple[Rejected, ...]


def _rows(rows: Rows) -> list[object]:
    if is_arrow(rows):
        table_rows: list[object] = rows.to_pylist()
        return table_rows
    return list(rows)       # (mappings of column to value, or anything a user passed: every item is checked)


def _seconds(value: object, label: str) -> float:
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not finite_number(value) or value < 0:
        raise InvalidField(f"{label} is {value!r}, need a non-negative number of seconds")
    return float(value)


def _local(value: object, label: str) -> float:
    if isinstance(value, dt.datetime):
        return (value if value.tzinfo else value.replace(tzinfo=dt.timezone.utc)).timestamp()
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not finite_number(value):
        raise InvalidField(f"{label} is {value!r}, need a number or a timestamp")
    return float(value)


def rows_to_items(rows: Rows, mapping: EventMapping) -> tuple[list[StreamEvent | Heartbeat], list[Rejected]]:
    """Validate ``rows``; return the engine's inputs (per producer in detection order, producers merged by
    lower bound) and the rejected rows.  Never raises for bad data."""
    items, rejected, _ = _rows_to_items(rows, mapping)
    return items, rejected


def _rows_to_items(rows: Rows, mapping: EventMapping) -> tuple[
        list[StreamEvent | Heartbeat], list[Rejected], dict[int, tuple[int, Mapping[str, object]]]]:
    """:func:`rows_to_items`, and the position in ``rows`` and the row of each input (by the input's ``id``)."""
    if not isinstance(mapping, EventMapping):
        raise MappingError(f"rows_to_items and feed_batch take an activedb.ingest.EventMapping, got {reprlib.repr(mapping)}: "
                           f"EventMapping(…, producer_column='producer', accuracy_column='accuracy')")
    if isinstance(rows, (Mapping, str, bytes)) or not (is_arrow(rows) or isinstance(rows, Iterable)):
        # (One row where a batch of rows belongs: its field names would be taken for rows, each rejected.)
        raise IngestError(f"rows is {type(rows).__name__} {reprlib.repr(rows)}, not a batch of rows: give a list of rows "
                          f"(mappings of column to value) or an Arrow table — a batch of one row is [row]; nothing "
                          f"was taken")
    if mapping.producer_column is None:
        raise MappingError("rows_to_items needs EventMapping(producer_column=…) (and accuracy columns for "
                           "intervals): a composition engine keeps its progress per producer")
    divisor = mapping.ts_unit.per_second
    per_producer: dict[str, list[tuple[tuple[Instant, Instant, int], Timestamp, StreamEvent | Heartbeat]]] = {}
    rejected: list[Rejected] = []
    rows_of: dict[int, tuple[int, Mapping[str, object]]] = {}
    for position, row in enumerate(_rows(rows)):
        if not isinstance(row, Mapping):
            rejected.append(Rejected(position, f"row is {row!r} ({type(row).__name__}), not a mapping of column to "
                                               f"value", {"value": jsonable(row)}))
            continue
        try:
            producer = row.get(mapping.producer_column)
            if not isinstance(producer, str) or not producer:
                raise InvalidField(f"producer ({mapping.producer_column!r}) is {producer!r}, need a non-empty string")
            raw_type = row.get(mapping.type_column)
            try:
                event_type = mapping.type_map.get(raw_type, raw_type) if mapping.type_map else raw_type
            except TypeError:             # an unhashable value (a list, a dict): refused below
                event_type = raw_type
            if not isinstance(event_type, str) or not event_type:
                raise InvalidField(f"event type ({mapping.type_column!r}) is {raw_type!r}, need a non-empty string")
            raw_ts = row.get(mapping.ts_column)
            if raw_ts is None:
                raise InvalidField(f"timestamp ({mapping.ts_column!r}) is null")
            try:
                reference = to_utc(raw_ts, divisor)
            except InvalidField as error:       # (its reason begins with "is …": the field's name goes first)
                raise InvalidField(f"timestamp ({mapping.ts_column!r}) {error}") from None
            if mapping.accuracy_column is not None:
                accuracy = f"accuracy ({mapping.accuracy_column!r})"
                minus = plus = _seconds(row.get(mapping.accuracy_column), accuracy)
            elif mapping.accuracy_minus_column is not None:
                accuracy = f"α⁻ ({mapping.accuracy_minus_column!r}), α⁺ ({mapping.accuracy_plus_column!r})"
                minus = _seconds(row.get(mapping.accuracy_minus_column), f"α⁻ ({mapping.accuracy_minus_column!r})")
                plus = _seconds(row.get(mapping.accuracy_plus_column),  # (both or neither)
                                f"α⁺ ({mapping.accuracy_plus_column!r})")
            else:
                accuracy, minus, plus = f"timestamp ({mapping.ts_column!r})", 0.0, 0.0
            local = None
            if mapping.local_ts_column is not None and row.get(mapping.local_ts_column) is not None:
                local = _local(row[mapping.local_ts_column], f"local timestamp ({mapping.local_ts_column!r})")
            try:
                stamp = Timestamp.at(reference, minus=minus, plus=plus, producer=producer, local=local)
            except InvalidTime:         # (only an accuracy can take the interval beyond datetime's years 1 to 9999)
                raise InvalidField(f"{accuracy} is {minus!r} s before, {plus!r} s after {reference.isoformat()}: out "
                                   f"of the representable range (years 1 to 9999)") from None
            if mapping.heartbeat_type is not None and event_type == mapping.heartbeat_type:
                item: StreamEvent | Heartbeat = Heartbeat(producer, stamp)
            else:
                key = row.get(mapping.key_column)
                payload_names = mapping.payload_columns_for(row.keys())
                absent = [name for name in payload_names if name not in row]
                if absent:
                    raise InvalidField(f"missing field {absent[0]!r}")
                attributes = {name: row[name] for name in payload_names}
                attributes[mapping.key_column] = key
                item = StreamEvent(event_type, stamp, attributes)
        except (InvalidField, ValueError) as error:     # ValueError: an interval the time model refuses
            reason = str(error) if isinstance(error, InvalidField) else f"timestamp: {error}"
            rejected.append(Rejected(position, reason, jsonable(row)))
            continue
        order = (stamp.local if stamp.local is not None else elapsed(_EPOCH, stamp.lower), stamp.lower, position)
        per_producer.setdefault(producer, []).append((order, stamp, item))
        rows_of[id(item)] = (position, row)
    sequences = []
    for producer in sorted(per_producer):
        entries = sorted(per_producer[producer], key=lambda entry: entry[0])
        sequences.append([((stamp.lower, producer, index), item) for index, (_, stamp, item) in enumerate(entries)])
    items = [item for _, item in heapq.merge(*sequences, key=lambda entry: entry[0])]
    return items, rejected, rows_of


def feed_batch(engine: CompositionEngine, rows: Rows, mapping: EventMapping, *, tx: Transaction | None = None
               ) -> FeedResult:
    """Feed one micro-batch: ``engine.process(tx, …)`` inside the batch's transaction (composites
    emitted, state restored if it aborts) or ``engine.submit(…)`` when ``tx`` is None."""
    items, rejected, rows_of = _rows_to_items(rows, mapping)
    # A refused input is rejected at its row's position: its dead letter keeps the row as delivered.
    members = engine.producers()
    accepted = []
    for item in items:
        producer = item.producer if isinstance(item, Heartbeat) else item.ts.producer
        info = members.get(producer)
        problem = None
        if info is not None and info.state == "left":
            problem = (f"producer {producer!r} left the composition engine (engine.leave(), or excluded after its "
                       f"timeout under on_timeout='exclude'): its events are no longer composed; replay this letter "
                       f"into an engine it is a member of")
        elif info is None or info.state != "joined":
            problem = (f"producer {producer!r} has not joined the composition engine (atomic membership: "
                       f"engine.join(producer, types=[…]) before it sends)")
        elif not isinstance(item, Heartbeat) and item.type not in info.types:
            problem = f"producer {producer!r} joined for {', '.join(info.types)}, not {item.type}"
        if problem is None:
            accepted.append(item)
        else:
            rejected.append(Rejected(*_at(rows_of, item, problem)))
    failed: list[tuple[CompositeEvent, str]] = []

    def emit(composite: CompositeEvent) -> None:
        """In ``tx``, each composite in a subtransaction of its own, as the rule path runs an event: a rule that
        raises aborts it alone, and its constituents become dead letters (below) instead of failing the batch."""
        assert tx is not None
        reason = run_as_event(tx, emit_composite, composite, f"composite:{composite.query}")
        if reason is not None:
            failed.append((composite, reason))

    composites, refused = engine._process_refusing(tx, accepted, emit if tx is not None else None)
    for item, error in refused:
        rejected.append(Rejected(*_at(rows_of, item, f"{type(error).__name__}: {error}", items, mapping)))
    lettered: set[int] = set()                  # (an arrival once, though several failed composites hold it)
    for composite, reason in failed:
        because = (f"{reason} — on the composite event of query {composite.query} "
                   f"({', '.join(describe_event(event) for event in composite.constituents)}), of which this event is "
                   f"one: the composition stands (its constituents are consumed as by any composition) and its "
                   f"rules' effects were undone; correct the rule, then replay these letters into an engine that has "
                   f"not composed past them (a CompositionEngine started afresh)")
        for constituent in composite.constituents:
            if id(constituent) not in lettered:
                lettered.add(id(constituent))
                rejected.append(Rejected(*_at(rows_of, constituent, because, items, mapping)))
    failures = {id(composite) for composite, _ in failed}
    refused_ids = {id(item) for item, _ in refused}
    taken = [item for item in accepted if id(item) not in refused_ids]
    return FeedResult(tuple(taken), tuple(composite for composite in composites if id(composite) not in failures),
                      tuple(rejected))


def _at(rows_of: dict[int, tuple[int, Mapping[str, object]]], item: StreamEvent | Heartbeat, reason: str,
        items: Sequence[StreamEvent | Heartbeat] = (), mapping: EventMapping | None = None
        ) -> tuple[int, str, dict[str, Json]]:
    """A rejection of ``item`` at its row's position, showing its row.  An event the engine hands back as it
    holds it (a RETURN refused it: ``CompositionEngine._process_refusing``) is found among ``items`` by its
    content; one of an earlier batch is no row of this one (position -1) and shows its type, producer,
    time and attributes."""
    found = rows_of.get(id(item))
    if found is None and isinstance(item, StreamEvent):
        found = next((rows_of[id(candidate)] for candidate in items if same_event(candidate, item)), None)
        if found is None:
            assert mapping is not None
            row: dict[str, object] = dict(item.attributes)
            row[mapping.type_column] = item.type
            row[mapping.ts_column] = str(item.ts)
            if mapping.producer_column is not None:
                row[mapping.producer_column] = item.ts.producer
            return -1, reason, jsonable(row)
    assert found is not None
    position, original = found
    return position, reason, jsonable(original)


class CompositeHandler(BatchHandler):
    """Each batch of an ingestion into the composition engine ``engine`` (design note and limits:
    ``README.md`` in this package, "Ingestion"), which reads the rows itself (``validates_rows = False``: a
    heartbeat row has no key, and the order that matters is per producer); the mapping must name the producer.
    Thread-safety: one batch at a time (the engine's own mutex guards its state)."""

    name = "composite"
    late_rows_are_dead_letters = False
    validates_rows = False

    def __init__(self, engine: CompositionEngine) -> None:
        if not isinstance(engine, CompositionEngine):
            raise IngestError(f"CompositeHandler takes an activedb.composite.CompositionEngine; got {engine!r}")
        self.engine = engine
        self.mapping: EventMapping | None = None       # set once by bind()

    def bind(self, db: DatabaseHandle, mapping: EventMapping | None) -> None:
        if mapping is None or mapping.producer_column is None:
            raise IngestError(
                "a composition needs a mapping that names the producer: EventMapping(…, producer_column='producer', "
                "accuracy_column='accuracy', heartbeat_type='heartbeat')")
        engine = self.engine
        if engine.timeout is not None and engine.on_timeout is TimeoutPolicy.RAISE:
            # (Raised inside a batch, ProducerTimeout failed it, and every delivery raised again: the clock only
            # moves on.  No row is at fault, so there is nothing to make a dead letter of.)
            raise IngestError(
                f"composition engine {engine.name} raises ProducerTimeout after {engine.timeout} s of a silent "
                f"producer (on_timeout='raise', the default); inside an ingestion that would fail the batch on every "
                f"delivery, and the stream would stop for good: build it with on_timeout='exclude' (the silent "
                f"producer is excluded and compositions go on; its later rows become dead letters), or with "
                f"timeout=None (compositions wait for it however long)")
        self.mapping = mapping

    def handle(self, tx: Transaction, batch: BatchInput, ledger: IngestionLedger) -> None:
        result = feed_batch(self.engine, batch.rows, self.mapping, tx=tx)  # type: ignore[arg-type]  # (bound)
        letters = list(batch.letters) + batch.dead_letters.rejected(result.rejected)
        batch.dead_letters.insert(tx, letters)
        ledger.events = len(result.composites)
        ledger.dead_letters = len(letters)
