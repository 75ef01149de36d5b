"""Turn the rows of a micro-batch into events, rejecting bad rows with a reason.

Public interface: :class:`EventMapping` (which columns give the event type, the key, the application
timestamp and the payload); :func:`rows_to_events` (rows — a ``pyarrow.Table`` or a list of dicts — to
``(good, bad)``: :class:`RawEvent` s sorted by application timestamp, :class:`Rejected` rows with a
reason and the raw row, JSON-safe); :func:`jsonable`.  The decisions on timestamps, keys, types, order,
corrupt records, lone surrogates and event ids: the package's ``README.md`` ("Validation").

Pure Python; an Arrow batch is validated by ``_arrow.py``, which imports pyarrow (only an Arrow batch gets there).
"""

from __future__ import annotations

import collections
import dataclasses
import datetime as dt
import itertools
import json
import math
import operator
import re
import sys
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, TypeGuard, TypeVar

from activedb.errors import InvalidChoice
from activedb.events import TimeUnit
from activedb.ingest._interface import Rows
from activedb.ingest.errors import IngestError, InvalidField, MappingError
from activedb.store import jsonable  # the one conversion into storable JSON (dead letters, logs)
from activedb.store import not_a_time  # the one test of pandas' NaT (the store refuses it too)

if TYPE_CHECKING:  # pragma: no cover
    import pyarrow as pa

__all__ = ["EventMapping", "RawEvent", "Rejected", "as_mapping", "check_columns", "jsonable", "rows_to_events"]

_UTC = dt.timezone.utc
EPOCH = dt.datetime(1970, 1, 1, tzinfo=_UTC)
TS_UNITS: Mapping[TimeUnit, int] = MappingProxyType({unit: unit.per_second for unit in TimeUnit})
_MISSING = object()  # a field absent from a row, as opposed to present and null
_INTERVAL_FIELDS = ("producer_column", "accuracy_column", "accuracy_minus_column", "accuracy_plus_column",
                    "local_ts_column", "heartbeat_type")


@dataclass(frozen=True)
class EventMapping:
    """Which columns of a batch make an event. Immutable; safe to share between threads.

    ``payload_columns=None`` means every column except those that make the event — type, key,
    timestamp and the accuracy-interval columns below — and the corrupt-record and line columns
    (:meth:`payload_columns_for`, for rows and Arrow alike); a list names exactly the payload columns (each
    must be present in a row, null values are allowed). ``type_map`` renames raw type values
    (for example numeric codes to names). ``ts_unit`` is the unit of numeric timestamps since the
    Unix epoch: an ``activedb.events.TimeUnit`` (``S``, ``MS``, ``US``; or its value, ``"ms"``). ``id_column`` names a column that
    identifies an event across re-sends (the sink then dead-letters an event whose id it has
    already ingested under the same query name; an ingestion whose handler reads the rows itself, as
    ``composite.CompositeHandler`` does, refuses a mapping with one); ``corrupt_column`` is Spark's corrupt-record
    column (rows where it holds text are rejected with the reason; ``None``: no such column);
    ``line_column`` holds each row's original line where the source keeps it (rows whose line has a
    lone surrogate are rejected: Spark replaced it by ``?``; ``None``: no such column).
    """

    type_column: str
    key_column: str
    ts_column: str
    payload_columns: tuple[str, ...] | None = None
    type_map: Mapping[Any, str] | None = field(default=None, hash=False)
    ts_unit: TimeUnit = TimeUnit.S
    # Accuracy-interval time (activedb.composite; see activedb/composite/_ingest.py).  The event's
    # interval is [ts − α⁻, ts + α⁺] with α from ``accuracy_column`` (both sides) or
    # ``accuracy_minus_column``/``accuracy_plus_column`` (seconds); ``producer_column`` names its producer,
    # ``local_ts_column`` its local clock reading; rows whose type is ``heartbeat_type`` are heartbeats.
    producer_column: str | None = None
    accuracy_column: str | None = None
    accuracy_minus_column: str | None = None
    accuracy_plus_column: str | None = None
    local_ts_column: str | None = None
    heartbeat_type: str | None = None
    id_column: str | None = None
    corrupt_column: str | None = "_corrupt_record"
    line_column: str | None = "_line"

    def __post_init__(self) -> None:
        for name in ("type_column", "key_column", "ts_column"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise MappingError(f"EventMapping.{name} must be a non-empty column name, got {value!r}")
        for name in (*_INTERVAL_FIELDS, "id_column", "corrupt_column", "line_column"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise MappingError(f"EventMapping.{name} must be a non-empty string or None, got {value!r}")
        if self.accuracy_column is not None and (self.accuracy_minus_column or self.accuracy_plus_column):
            raise MappingError("EventMapping: give accuracy_column (both sides) or accuracy_minus_column/"
                               "accuracy_plus_column, not both")
        if (self.accuracy_minus_column is None) != (self.accuracy_plus_column is None):
            raise MappingError("EventMapping: accuracy_minus_column and accuracy_plus_column go together")
        uses_intervals = any(getattr(self, name) is not None for name in _INTERVAL_FIELDS if name != "producer_column")
        if uses_intervals and self.producer_column is None:
            raise MappingError("EventMapping: accuracy, local timestamp and heartbeat columns need producer_column "
                               "(sync-points are kept per producer)")
        named = self._event_columns()
        if len(set(named)) != len(named):
            raise MappingError(f"EventMapping names one column for two purposes: {named}")
        if self.payload_columns is not None:
            given: object = self.payload_columns      # (as given: one text is refused with a hint)
            if isinstance(given, str):
                raise MappingError(f"EventMapping.payload_columns must be a list of column names, not one string; "
                                   f"did you mean [{self.payload_columns!r}]?")
            columns = tuple(self.payload_columns)
            for column in columns:
                if not isinstance(column, str) or not column:
                    raise MappingError(f"payload column names must be non-empty strings, got {column!r}")
            if len(set(columns)) != len(columns):
                raise MappingError(f"payload_columns has duplicates: {list(columns)}")
            object.__setattr__(self, "payload_columns", columns)
        if self.type_map is not None:
            if not isinstance(self.type_map, Mapping):
                raise MappingError(f"EventMapping.type_map maps raw type values to event types "
                                   f"({{1: 'enter', 2: 'leave'}}), got {self.type_map!r}")
            object.__setattr__(self, "type_map", MappingProxyType(dict(self.type_map)))
        try:
            object.__setattr__(self, "ts_unit", TimeUnit.parse(self.ts_unit, "EventMapping(ts_unit=...)"))
        except InvalidChoice as error:
            raise MappingError(str(error)) from None

    def payload_columns_for(self, columns: Iterable[str]) -> tuple[str, ...]:
        """The payload columns for a batch whose columns are ``columns`` (in that order)."""
        if self.payload_columns is not None:
            return self.payload_columns
        reserved = {*self._event_columns(), self.corrupt_column, self.line_column}
        return tuple(column for column in columns if column not in reserved)

    def _event_columns(self) -> list[str]:
        """The columns that make the event itself rather than its payload."""
        return [column for column in (self.type_column, self.key_column, self.ts_column, self.producer_column,
                                      self.accuracy_column, self.accuracy_minus_column, self.accuracy_plus_column,
                                      self.local_ts_column) if column is not None]


def as_mapping(mapping: object) -> "EventMapping":
    """``mapping`` as an :class:`EventMapping`: one already, or a dict of its keyword arguments — the
    form an application module can declare without importing spark_bridge, e.g.
    ``MAPPING = {"type_column": "type", "key_column": "worker", "ts_column": "ts", "payload_columns": ["room"]}``."""
    if isinstance(mapping, EventMapping):
        return mapping
    if isinstance(mapping, Mapping):
        try:
            return EventMapping(**mapping)
        except TypeError as error:
            names = ", ".join(field.name for field in dataclasses.fields(EventMapping))
            raise MappingError(f"a MAPPING dict takes EventMapping's arguments ({names}): {error}") from None
    raise MappingError(f"a mapping is an EventMapping or a dict of its arguments, got {mapping!r}")


def check_columns(columns: Sequence[str], mapping: EventMapping, *, before: str = "before feeding the batch",
                  rename: str = "") -> None:
    """Refuse a stream (a batch's source) whose ``columns`` lack one ``mapping`` names (but the corrupt-record and
    line columns, which a source may lack): every row of every batch would be a dead letter; or that has two columns
    of one name: every batch would fail in the mapping (``MappingError``), replay after replay, and the stream stop
    for good.  Raises :class:`~activedb.ingest.errors.IngestError` saying what to fix ``before`` (the connector's
    words: where the columns are to be fixed) and, for a repeated column, how to ``rename`` it.
    ``Ingestion.process`` asks it of an Arrow batch (a table's columns are the batch's; rows of mappings each have
    their own, and a missing field is that row's dead letter); a connector may ask it of its stream earlier, in its
    own words (``spark_bridge``'s ``ingest()``), and a replay of the letters' rows."""
    counts = collections.Counter(columns)       # (by hash: a wide stream's check stays linear in its columns)
    repeated = [column for column in columns if counts[column] > 1]
    if repeated:
        raise IngestError(
            f"the stream has {counts[repeated[0]]} columns named {repeated[0]!r} (its columns: "
            f"{list(columns)}); every batch would fail: rename or drop one{rename} {before}")
    named = [*mapping._event_columns(), *([] if mapping.id_column is None else [mapping.id_column])]
    missing = [column for column in [*named, *(mapping.payload_columns or ())] if column not in counts]
    if missing:
        raise IngestError(
            f"the stream has no column {missing[0]!r} named by the mapping (its columns: {list(columns)}); "
            f"fix the EventMapping or select/rename the columns {before}")


@dataclass(frozen=True, slots=True)
class RawEvent:
    """One validated row: an event not yet applied. Immutable (the payload dict is the
    caller's to leave alone); safe to share between threads."""

    event_type: str
    key: str | int
    # Invariant: ts.tzinfo is datetime.timezone.utc.
    ts: dt.datetime
    payload: Mapping[str, Any] = field(hash=False)
    position: int  # index of the row in the batch handed to rows_to_events
    event_id: str | None = None  # the id column's value as text (EventMapping.id_column), else None


def _raw_events_maker() -> Callable[[Sequence[object], Sequence[object], Sequence[object],
                                     Sequence[Mapping[str, object]], Sequence[int], Sequence[object]], list[RawEvent]]:
    """``[RawEvent(...), ...]`` for columns of values already validated (the converters' results at the positions
    without an error: nothing is checked here; the six columns of one length), more cheaply: the frozen
    dataclass's ``__init__`` sets each field through ``object.__setattr__``, a Python call per field and event;
    this makes the batch's instances and then sets one slot of all of them at a time, each a loop in C (``map`` of
    the slot's setter, drained by a zero-length ``deque``) — no Python step per event."""
    new = object.__new__
    setters = tuple(getattr(RawEvent, name).__set__
                    for name in ("event_type", "key", "ts", "payload", "position", "event_id"))

    def make(event_types: Sequence[object], keys: Sequence[object], timestamps: Sequence[object],
             payloads: Sequence[Mapping[str, object]], positions: Sequence[int], event_ids: Sequence[object]
             ) -> list[RawEvent]:
        events: list[RawEvent] = list(map(new, itertools.repeat(RawEvent, len(positions))))
        for setter, values in zip(setters, (event_types, keys, timestamps, payloads, positions, event_ids)):
            collections.deque(map(setter, events, values), maxlen=0)
        return events

    return make


raw_events = _raw_events_maker()


@dataclass(frozen=True, slots=True)
class Rejected:
    """A row that could not become an event: why, where, and the row itself.

    ``row`` is JSON-serialisable (a dead letter's readable form: ``jsonable(row, tagged=True)``); ``reason`` names the
    field and the problem in one sentence.
    """

    position: int  # index of the row in the batch, or -1 for a rejection that is no row of it
    reason: str
    row: Mapping[str, Any] = field(hash=False)


def _describe(value: object) -> str:
    text = repr(value)
    return f"{text if len(text) <= 60 else text[:57] + '...'} ({type(value).__name__})"


def to_utc(value: object, unit_divisor: int) -> dt.datetime:
    """Convert one timestamp value to an aware UTC datetime or raise InvalidField."""
    if isinstance(value, dt.datetime):
        if not_a_time(value):     # (pandas' NaT: a datetime that is no time)
            raise InvalidField(f"is {_describe(value)}, not a time (a missing value)")
        if value.tzinfo is None:
            return value.replace(tzinfo=_UTC)
        if value.tzinfo is _UTC:
            return value
        try:
            return value.astimezone(_UTC)
        except OverflowError:       # (a time whose offset takes it past year 1 or 9999 in UTC)
            raise InvalidField(f"is {_describe(value)}, out of the representable range in UTC") from None
    if isinstance(value, bool):
        raise InvalidField(f"is {_describe(value)}, not a timestamp")
    if isinstance(value, int):
        try:
            return EPOCH + dt.timedelta(microseconds=value * (1_000_000 // unit_divisor))
        except OverflowError:
            raise InvalidField(f"is {_describe(value)}, out of the representable range") from None
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidField(f"is {_describe(value)}, not a finite number")
        try:
            return EPOCH + dt.timedelta(microseconds=round(value * 1_000_000 / unit_divisor))
        except OverflowError:
            raise InvalidField(f"is {_describe(value)}, out of the representable range") from None
    if isinstance(value, str):
        try:
            parsed = dt.datetime.fromisoformat(value.strip())
        except ValueError:
            raise InvalidField(f"is {_describe(value)}, not an ISO-8601 timestamp") from None
        return to_utc(parsed, unit_divisor)
    if isinstance(value, dt.date):
        raise InvalidField(f"is {_describe(value)}, a date without a time")
    raise InvalidField(f"is {_describe(value)}, not a timestamp")


def corrupt_reason(line: object, values: Mapping[str, object], types: Mapping[str, str], mapping: "EventMapping") -> str:
    """Why Spark could not read ``line`` (the corrupt-record column's text) against the schema whose
    column types are ``types``; ``values`` is what Spark made of the row's other columns."""
    text = line if isinstance(line, str) else repr(line)
    shown = text if len(text) <= 80 else text[:77] + "..."
    try:
        parsed = json.loads(text)
    except ValueError as error:
        message = getattr(error, "msg", str(error))
        column = getattr(error, "colno", None)
        where = f" at column {column}" if column else ""
        return f"malformed JSON: {message}{where} in {shown!r}"
    if not isinstance(parsed, dict):
        return f"the line is a JSON {type(parsed).__name__}, not an object: {shown!r}"
    reserved = {mapping.corrupt_column}
    for name, value in parsed.items():
        if name in reserved or name not in types or value is None:
            continue
        if values.get(name) is None:
            return (f"field {name!r} is {_describe(value)}, which does not fit the stream's schema "
                    f"({name} {types[name]})")
    return f"Spark could not read the line against the stream's schema ({', '.join(f'{n} {t}' for n, t in types.items())}): {shown!r}"


#: A JSON escape of a surrogate code point (paired or not; :func:`lone_surrogate_reason` tells).
SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def lone_surrogate_reason(line: object, fields: Collection[str]) -> str | None:
    """Why the row of JSON text ``line`` cannot be trusted as Spark delivered it, or None: the value of one
    of its ``fields`` (the batch's columns) holds a lone surrogate, which Spark's string conversion replaced
    by ``?``.  Fields the schema does not read are not looked at."""
    if not isinstance(line, str) or SURROGATE_ESCAPE.search(line) is None:
        return None
    try:
        parsed = json.loads(line)
    except ValueError:
        return None                     # a malformed line: the corrupt-record column says why
    if not isinstance(parsed, dict):
        return None                     # not an object: the corrupt-record column says why
    field = next((name for name, value in parsed.items()
                  if name in fields and _holds_char_in(value, *_SURROGATES)), None)
    if field is None:
        return None
    return (f"field {field!a} holds a lone surrogate (a \\ud800-\\udfff escape without its pair), which Spark's string "
            f"conversion turns into '?': the row is not applied, its line is kept")


def invalid_utf8_reason(data: bytes, column: str, mapping: "EventMapping | None") -> str:
    """Why the value ``data`` of the text column ``column`` cannot be trusted: its bytes are not UTF-8.  A source
    that reads them as text (Spark's JSON parser, a Java string) replaces each such sequence by U+FFFD, a value
    no one sent; the row is a dead letter whose original keeps the bytes.  For the row's line (the mapping's
    ``line_column`` or ``corrupt_column``) the reason names the field of the JSON object that holds them."""
    text = data.decode("utf-8", "surrogateescape")        # each invalid byte b becomes the character U+DC00 + b
    starts = [index for index, char in enumerate(text) if "\udc80" <= char <= "\udcff"
              and not (index and "\udc80" <= text[index - 1] <= "\udcff")]
    first = starts[0]
    end = first
    while end < len(text) and "\udc80" <= text[end] <= "\udcff":
        end += 1
    run = bytes(ord(char) - 0xDC00 for char in text[first:end])
    offset = len(text[:first].encode("utf-8", "surrogateescape"))
    shown = " ".join(f"{byte:02X}" for byte in run[:12]) + (" ..." if len(run) > 12 else "")
    what = f"the bytes {shown} at byte {offset}"
    if run[:1] == b"\xed" and len(run) > 1 and 0xA0 <= run[1] <= 0xBF:
        what += " (a UTF-16 surrogate encoded as if it were a character: CESU-8 or WTF-8, not UTF-8)"
    if len(starts) > 1:
        what += f", and {len(starts) - 1} more sequence(s) that are not UTF-8"
    if mapping is not None and column in (mapping.line_column, mapping.corrupt_column):
        subject = "the line is not valid UTF-8"
        field = _field_holding_escapes(text)
        if field is not None:
            what = f"field {field!a} holds {what}"
    else:
        subject = f"column {column!a} is not valid UTF-8"
    return (f"{subject}: {what}; read as text they would become U+FFFD, a value no one sent: the row is not "
            f"applied, its dead letter keeps the bytes")


def _field_holding_escapes(text: str) -> str | None:
    """The first top-level field of the JSON object ``text`` (decoded with ``surrogateescape``) whose name or value
    holds an escaped byte, or None (not an object, or malformed)."""
    try:
        parsed = json.loads(text)
    except ValueError:
        return None
    if not isinstance(parsed, dict):
        return None
    return next((name for name, value in parsed.items()
                 if _holds_char_in(name, *_ESCAPED_BYTES) or _holds_char_in(value, *_ESCAPED_BYTES)), None)


#: The characters ``surrogateescape`` decodes an invalid byte into (U+DC80 + byte), as (first, last).
_ESCAPED_BYTES = ("\udc80", "\udcff")
#: The surrogates, as (first, last): one left in decoded JSON is lone (a pair was decoded into one character).
_SURROGATES = ("\ud800", "\udfff")


def _holds_char_in(value: object, first: str, last: str) -> bool:
    """Whether a string of the JSON value ``value`` (a field name, a text, nested in objects and arrays) holds a
    character from ``first`` to ``last``."""
    if isinstance(value, str):
        return any(first <= char <= last for char in value)
    if isinstance(value, dict):
        return any(_holds_char_in(name, first, last) or _holds_char_in(item, first, last)
                   for name, item in value.items())
    if isinstance(value, list):
        return any(_holds_char_in(item, first, last) for item in value)
    return False


def check_key(value: object) -> str | int:
    if isinstance(value, str):
        if value:
            return value
        raise InvalidField("is an empty string")
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise InvalidField(f"is {_describe(value)}, need a string or an integer")


# --- column-wise validation -------------------------------------------------------------
#
# A converter turns a raw value into the field's value or raises InvalidField; a column comes back as
# the converted values plus {position: reason}; a row keeps the first reason (id, type, key, timestamp).
# Arrow input takes the same converters column by column, in ``_arrow.py``.


_Converted = TypeVar("_Converted")


def convert_column(values: Sequence[object], convert: Callable[[object], _Converted], label: str
                   ) -> tuple[list[_Converted | None], dict[int, str]]:
    """Each value through ``convert``: the converted values (None where a value failed) and ``{position: reason}``."""
    converted: list[_Converted | None] = []
    errors: dict[int, str] = {}
    append = converted.append
    for position, value in enumerate(values):
        if value is None or value is _MISSING:
            errors[position] = f"{label} is null" if value is None else f"{label} is missing"
            append(None)
            continue
        try:
            append(convert(value))
        except InvalidField as exc:
            errors[position] = f"{label} {exc}"
            append(None)
    return converted, errors


def known_type_names(value: object, name: str, error: type[Exception] = MappingError, where: str = ""
                     ) -> frozenset[str] | None:
    """``value`` — given as ``name`` (``known_types=``, an application's ``KNOWN_TYPES``; ``where`` goes before it in
    a message) — as the event type names it holds; None for None (every type the handler takes).  Raises ``error``
    saying what to give for one text (a name, not a collection of them: it would be read letter by letter), what is
    no collection, a member that is no non-empty text (a type column's values are texts), and an empty collection
    (every row would be a dead letter)."""
    if value is None:
        return None
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise error(f"{where}{name} is {value!r}; give the event types as a list or a set of names, e.g. "
                    f"{name} = {{{value!r}}}")
    names = list(value)
    wrong = [member for member in names if not isinstance(member, str) or not member]
    if wrong:
        raise error(f"{where}{name} is {value!r}: {wrong[0]!r} in it is no event type; event types are non-empty "
                    f"strings (the values of the mapping's type column), e.g. {name} = {{'add', 'remove'}}")
    if not names:
        raise error(f"{where}{name} is empty: every row would be a dead letter (an unknown type); leave it out to "
                    f"take the types the handler takes")
    return frozenset(names)


def type_converter(mapping: EventMapping, known: frozenset[str] | None) -> Callable[[object], str]:
    type_map = mapping.type_map

    def convert(raw: object) -> str:
        event_type = raw
        if type_map is not None:
            try:
                event_type = type_map.get(raw, raw)
            except TypeError:  # unhashable raw value
                raise InvalidField(f"is {_describe(raw)}, need a string") from None
        if not isinstance(event_type, str) or not event_type:
            raise InvalidField(f"is {_describe(event_type)}, need a non-empty string")
        if known is not None and event_type not in known:
            listed = sorted(known)
            shown = ", ".join(map(repr, listed[:10])) + (", ..." if len(listed) > 10 else "")
            raise InvalidField(f"is {event_type!r}, not a known event type (known: {shown})")
        return event_type

    return convert


def rows_to_events(rows: Rows, mapping: EventMapping,
                   known_types: Collection[str] | None = None) -> tuple[list[RawEvent], list[Rejected]]:
    """Validate ``rows`` against ``mapping``; return ``(good, bad)``.

    ``rows`` is a ``pyarrow.Table`` / ``RecordBatch`` (for example from
    ``DataFrame.toArrow()``) or a sequence of dicts. ``good`` is sorted by timestamp,
    stable; ``bad`` is in input order. Every input row is in exactly one of the two
    lists. Never raises for bad data; raises :class:`~activedb.ingest.errors.MappingError`
    only when the batch itself is unusable (duplicate column names in a Table).
    """
    known = None if known_types is None else frozenset(known_types)
    unit_divisor = TS_UNITS[mapping.ts_unit]
    type_label = f"event type ({mapping.type_column!r})"
    key_label = f"key ({mapping.key_column!r})"
    ts_label = f"timestamp ({mapping.ts_column!r})"

    if is_arrow(rows):
        from activedb.ingest._arrow import table_to_events

        return table_to_events(rows, mapping, known, unit_divisor, (type_label, key_label, ts_label))

    rows = list(rows)       # (a sequence of mappings, or anything a user passed: every item is checked)
    errors: dict[int, str] = {}
    for position, row in enumerate(rows):
        if not isinstance(row, Mapping):
            errors[position] = f"row is {_describe(row)}, not a mapping of column to value"
    mappings = [row if isinstance(row, Mapping) else {} for row in rows]
    if mapping.corrupt_column is not None:
        for position, row in enumerate(mappings):
            line = row.get(mapping.corrupt_column)
            if line is not None and position not in errors:
                types = {name: type(value).__name__ for name, value in row.items() if name != mapping.corrupt_column}
                errors[position] = corrupt_reason(line, row, types, mapping)
    if mapping.line_column is not None:
        for position, row in enumerate(mappings):
            reason = lone_surrogate_reason(row.get(mapping.line_column), row.keys())
            if reason is not None:
                errors.setdefault(position, reason)
    fields = [(mapping.type_column, type_converter(mapping, known), type_label),
              (mapping.key_column, check_key, key_label),
              (mapping.ts_column, lambda value: to_utc(value, unit_divisor), ts_label)]
    if mapping.id_column is not None:       # its reason comes first
        fields.insert(0, (mapping.id_column, event_id, f"event id ({mapping.id_column!r})"))
    converted = []
    for column, convert, label in fields:
        values, column_errors = convert_column([row.get(column, _MISSING) for row in mappings], convert, label)
        converted.append(values)
        for position, reason in column_errors.items():
            errors.setdefault(position, reason)
    *id_columns, type_values, key_values, ts_values = converted
    id_values = id_columns[0] if id_columns else [None] * len(rows)

    # (payload_columns_for's: the columns that make the event, as the Arrow path leaves them out)
    reserved = {*mapping._event_columns(), mapping.corrupt_column, mapping.line_column}
    positions: list[int] = []
    payloads: list[dict[str, Any]] = []
    for position, row in enumerate(mappings):
        if position in errors:
            continue
        if mapping.payload_columns is None:
            payload = {name: value for name, value in row.items() if name not in reserved}
        else:
            absent = [name for name in mapping.payload_columns if name not in row]
            if absent:
                errors[position] = f"missing field {absent[0]!r}"
                continue
            payload = {name: row[name] for name in mapping.payload_columns}
        positions.append(position)
        payloads.append(payload)
    good = raw_events([type_values[position] for position in positions],
                      [key_values[position] for position in positions],
                      [ts_values[position] for position in positions], payloads, positions,
                      [id_values[position] for position in positions])

    bad = [Rejected(position, errors[position], jsonable(rows[position], tagged=True)
                    if isinstance(rows[position], Mapping) else {"value": jsonable(rows[position], tagged=True)})
           for position in sorted(errors)]
    good.sort(key=by_ts)
    return good, bad


def is_arrow(rows: object) -> TypeGuard[pa.Table | pa.RecordBatch]:
    """Whether ``rows`` is a ``pyarrow.Table`` or ``RecordBatch`` — asked without importing pyarrow: rows can be
    Arrow only if something imported it already (pyarrow is an extra, ``activedb[spark]``)."""
    pa = sys.modules.get("pyarrow")
    return pa is not None and isinstance(rows, (pa.Table, pa.RecordBatch))


def event_id(value: object) -> str:
    """An event id is what a key may be (a non-empty string, or an integer), as text."""
    return str(check_key(value))


#: A validated event's ``ts``: the sort key of a batch's events (in C: no Python call per event).
by_ts: Callable[[RawEvent], dt.datetime] = operator.attrgetter("ts")
