"""The Arrow path of :func:`activedb.ingest._mapping.rows_to_events`: a ``pyarrow.Table`` or ``RecordBatch`` (from
``DataFrame.toArrow()``) validated one column at a time.

Columns whose Arrow type and statistics already prove every value valid (a string column without nulls or empty
strings, an integer key column without nulls, a timestamp column without nulls, a finite float timestamp column in
``datetime``'s range) skip the per-value converter.  Everything else goes through the same converters as the row
path (``mapping.convert_column`` and friends): both paths give the same values and reasons.

The proofs run on the Python values every column is turned into anyway (``to_pylist``), with the builtins that loop
in C (``in``, ``set.issuperset``, ``min``, ``max``, ``map``), not with ``pyarrow.compute``: each compute call has a
fixed cost that a stream pays once per column and batch, and after Spark's turn between two micro-batches it is
cold: larger than the Python checks of a column of a micro-batch's size.
"""

from __future__ import annotations

import datetime as dt
import itertools
import math
import operator
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

from activedb.store import Json

from activedb.ingest._mapping import (
    EPOCH, SURROGATE_ESCAPE, EventMapping, RawEvent, Rejected, by_ts, check_key, convert_column, corrupt_reason,
    event_id, invalid_utf8_reason, lone_surrogate_reason, raw_events, to_utc, type_converter,
)
from activedb.ingest.errors import MappingError
from activedb.store import jsonable, tagged_key

if TYPE_CHECKING:  # pragma: no cover
    import pyarrow as pa

__all__ = ["arrow_values", "jsonable_rows", "table_to_events"]

#: The microseconds from EPOCH that ``datetime`` can hold (``to_utc`` rejects the rest as out of range).
_MIN_MICROS, _MAX_MICROS = ((limit.replace(tzinfo=dt.timezone.utc) - EPOCH) // dt.timedelta(microseconds=1)
                            for limit in (dt.datetime.min, dt.datetime.max))


#: Microseconds from the epoch within which ``datetime.fromtimestamp(micros / 1e6, UTC)`` is exact: below 2**32
#: seconds a double's spacing is under a microsecond, so the quotient is within half a microsecond of the whole
#: number of microseconds it stands for, and ``fromtimestamp`` rounds to the nearest one (years 1833 to 2106).
_EXACT_FLOAT_MICROS = 2**32 * 1_000_000


#: From this many rows a float timestamp column is converted by Arrow compute, whose fixed cost is then small
#: against the Python steps per value it saves.
_VECTOR_ROWS = 16_384


def arrow_values(column: pa.Array | pa.ChunkedArray) -> Sequence[object]:
    """``column.to_pylist()``, with timestamps as aware UTC datetimes built fast (:func:`_timestamps`)."""
    import pyarrow as pa

    if pa.types.is_timestamp(column.type):
        return _timestamps(column)
    listed: list[object] = column.to_pylist()
    return listed


class _Beyond(str):
    """A timestamp value ``datetime`` cannot hold (Arrow's and Spark's reach beyond year 9999), as its microseconds
    from the epoch in words: a text, so a dead letter's row can keep it; the row is rejected
    (:func:`_beyond_reasons`)."""

    __slots__ = ()


def _beyond(micros: int) -> _Beyond:
    return _Beyond(f"{micros} microseconds from 1970-01-01T00:00:00+00:00")


def _timestamps(column: pa.Array | pa.ChunkedArray) -> list[dt.datetime | _Beyond | None]:
    """A timestamp column as aware UTC datetimes (a value beyond ``datetime``'s range as a :class:`_Beyond`).
    ``to_pylist`` on a zoned timestamp column builds a ``ZoneInfo`` datetime per value, the slow way; going through
    int64 microseconds is cheaper, and ``fromtimestamp`` of the seconds as a float cheaper still where that is exact
    (``_EXACT_FLOAT_MICROS``)."""
    values = _as_micros(column)
    if values and not column.null_count:
        complete = cast("list[int]", values)        # (no None in it: no null)
        if _MIN_MICROS <= min(complete) and max(complete) <= _MAX_MICROS:
            return _micros_to_datetimes(complete)   # type: ignore[return-value]  # (no None in it either)
    epoch, delta, low, high = EPOCH, dt.timedelta, _MIN_MICROS, _MAX_MICROS
    return [None if value is None else epoch + delta(microseconds=value) if low <= value <= high else _beyond(value)
            for value in values]


#: Microseconds per unit of a timestamp column coarser than microseconds.
_MICROS_PER_UNIT = {"s": 1_000_000, "ms": 1_000}


def _as_micros(column: pa.Array | pa.ChunkedArray) -> list[int | None]:
    """A timestamp column's values as int microseconds from the epoch (None for null): nanoseconds truncated;
    seconds and milliseconds multiplied with overflow checked — a product beyond int64 (far beyond ``datetime``'s
    range) is made in Python, where it cannot wrap around into another time, and stays beyond the range."""
    import pyarrow as pa
    import pyarrow.compute as pc

    factor = _MICROS_PER_UNIT.get(column.type.unit)
    if factor is None:          # (us, ns: no multiplication)
        micros: list[int | None] = column.cast(pa.timestamp("us", tz=column.type.tz), safe=False).cast(
            pa.int64()).to_pylist()
        return micros
    raw = column.cast(pa.int64())
    try:
        micros = pc.multiply_checked(raw, factor).to_pylist()
    except pa.ArrowInvalid:     # (an overflow)
        micros = [None if value is None else value * factor for value in raw.to_pylist()]
    return micros


def _beyond_reasons(values: Sequence[object], label: str) -> dict[int, str]:
    """``{position: reason}`` for the values of a timestamp column that ``datetime`` cannot hold."""
    return {position: f"{label} is {value}, out of the representable range"
            for position, value in enumerate(values) if type(value) is _Beyond}


def _micros_to_datetimes(micros: list[int]) -> list[dt.datetime | None]:
    """Microseconds from EPOCH (ints, no None, within ``datetime``'s range) as aware UTC datetimes: by
    ``fromtimestamp`` of the seconds as a float where that is exact (``_EXACT_FLOAT_MICROS``), else by adding them
    to EPOCH."""
    if -_EXACT_FLOAT_MICROS < min(micros) and max(micros) < _EXACT_FLOAT_MICROS:
        seconds = map(operator.truediv, micros, itertools.repeat(1e6))        # (loops in C: no Python step a value)
        return list(map(dt.datetime.fromtimestamp, seconds, itertools.repeat(dt.timezone.utc)))
    epoch, delta = EPOCH, dt.timedelta
    return [epoch + delta(microseconds=value) for value in micros]


def _clean_text(column: pa.Array | pa.ChunkedArray, values: list[object]) -> bool:
    """Every value of ``column`` (``values``: its ``to_pylist()``) is a non-null, non-empty string."""
    import pyarrow as pa

    return ((pa.types.is_string(column.type) or pa.types.is_large_string(column.type)) and not column.null_count
            and "" not in values)


def _arrow_type_column(column: pa.Array | pa.ChunkedArray, mapping: EventMapping, known: frozenset[str] | None,
                       label: str) -> tuple[list[str | None], dict[int, str]]:
    values = column.to_pylist()
    if mapping.type_map is None and _clean_text(column, values) and (known is None or known.issuperset(values)):
        return values, {}
    return convert_column(values, type_converter(mapping, known), label)


def _arrow_key_column(column: pa.Array | pa.ChunkedArray, label: str) -> tuple[list[str | int | None], dict[int, str]]:
    import pyarrow as pa

    values = column.to_pylist()
    if _clean_text(column, values) or (pa.types.is_integer(column.type) and not column.null_count):
        return values, {}
    return convert_column(values, check_key, label)


def _vector_timestamps(column: pa.Array | pa.ChunkedArray, unit_divisor: int) -> pa.Array | pa.ChunkedArray:
    """A float column of seconds (or ``unit_divisor``-ths), no nulls, as a UTC timestamp column by Arrow compute —
    to_utc's float operations and rounding —, or ``column`` itself if a value is not finite or out of
    ``datetime``'s range (those take the converter per value)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if not pc.all(pc.is_finite(column)).as_py():
        return column
    micros = pc.round(pc.divide(pc.multiply(column.cast(pa.float64()), 1e6), float(unit_divisor)), 0, "half_to_even")
    low, high = pc.min_max(micros).values()
    if not (_MIN_MICROS <= low.as_py() and high.as_py() <= _MAX_MICROS):
        return column
    return micros.cast(pa.int64()).cast(pa.timestamp("us", "UTC"))


def _arrow_ts_column(column: pa.Array | pa.ChunkedArray, unit_divisor: int, label: str) -> tuple[list[dt.datetime | None], dict[int, str]]:
    import pyarrow as pa

    if pa.types.is_floating(column.type) and len(column) and not column.null_count:
        if len(column) >= _VECTOR_ROWS:
            column = _vector_timestamps(column, unit_divisor)    # (unchanged if not all finite and in range)
        else:
            values = column.to_pylist()
            if all(map(math.isfinite, values)):
                # to_utc's float branch — the same float operations and rounding (``round``: half to even) —, then
                # the microseconds as datetimes; out of datetime's range: per value (to_utc's reason)
                try:
                    micros = [round(value * 1_000_000 / unit_divisor) for value in values]
                except OverflowError:       # a product beyond a double's range
                    micros = None
                if micros is not None and _MIN_MICROS <= min(micros) and max(micros) <= _MAX_MICROS:
                    return _micros_to_datetimes(micros), {}
            return convert_column(values, lambda value: to_utc(value, unit_divisor), label)
    if pa.types.is_timestamp(column.type):
        timestamps = _timestamps(column)
        errors = {position: f"{label} is null" for position, value in enumerate(timestamps) if value is None}
        errors.update(_beyond_reasons(timestamps, label))
        return timestamps, errors     # type: ignore[return-value]  # (a _Beyond's row is rejected)
    return convert_column(arrow_values(column), lambda value: to_utc(value, unit_divisor), label)


def table_to_events(table: pa.Table | pa.RecordBatch, mapping: EventMapping, known: frozenset[str] | None, unit_divisor: int,
                    labels: tuple[str, str, str]) -> tuple[list[RawEvent], list[Rejected]]:
    import pyarrow as pa

    names = list(table.schema.names)
    present = set(names)    # (membership by hash: a wide batch's checks stay linear in its columns)
    if len(present) != len(names):
        raise MappingError(f"the batch has duplicate column names: {names}; rename them before mapping")
    table, invalid = _invalid_text_rows(table, mapping)
    count = table.num_rows
    payload_names = mapping.payload_columns_for(names)
    absent = [name for name in (mapping.type_column, mapping.key_column, mapping.ts_column, *payload_names)
              if name not in present]
    if absent:
        reason = f"missing field {absent[0]!r}: the batch has no such column (columns: {names})"
        return [], _arrow_rejections(table, {**{position: reason for position in range(count)}, **invalid})

    type_label, key_label, ts_label = labels
    corrupt = _arrow_corrupt_rows(table, mapping)
    for position, reason in invalid.items():         # the first cause: what Spark made of the bytes follows from it
        corrupt.pop(position, None)
    corrupt = {**invalid, **corrupt}
    type_values, type_errors = _arrow_type_column(table.column(mapping.type_column), mapping, known, type_label)
    key_values, key_errors = _arrow_key_column(table.column(mapping.key_column), key_label)
    ts_values, ts_errors = _arrow_ts_column(table.column(mapping.ts_column), unit_divisor, ts_label)
    errors = dict(corrupt)
    for position, reason in _arrow_lone_surrogate_rows(table, mapping).items():
        errors.setdefault(position, reason)
    id_values: list[str | None] = [None] * count
    id_errors: dict[int, str] = {}
    if mapping.id_column is not None:
        if mapping.id_column not in present:
            id_errors = {position: f"missing field {mapping.id_column!r} (the event id)" for position in range(count)}
        else:
            id_column, id_label = table.column(mapping.id_column), f"event id ({mapping.id_column!r})"
            values = arrow_values(id_column)
            id_values, id_errors = convert_column(values, event_id, id_label)
            if pa.types.is_timestamp(id_column.type):     # (a _Beyond is a text: the converter would take it)
                id_errors.update(_beyond_reasons(values, id_label))
    for column_errors in (id_errors, type_errors, key_errors, ts_errors):       # (the row path's order: the id first)
        for position, reason in column_errors.items():
            errors.setdefault(position, reason)

    payload_columns = [arrow_values(table.column(name)) for name in payload_names]
    for name, values in zip(payload_names, payload_columns):
        if pa.types.is_timestamp(table.schema.field(name).type):
            for position, reason in _beyond_reasons(values, f"column {name!r}").items():
                errors.setdefault(position, reason)
    if len(payload_names) == 1:              # (the common case: a dict per row without a tuple and a zip)
        name = payload_names[0]
        payloads = [{name: value} for value in payload_columns[0]]
    elif payload_names:
        payloads = [dict(zip(payload_names, row)) for row in zip(*payload_columns)]
    else:
        payloads = [{} for _ in range(count)]
    columns: tuple[Sequence[Any], ...] = (type_values, key_values, ts_values, payloads, range(count), id_values)
    if errors:          # (the rows without an error, each column in C)
        kept = [position not in errors for position in range(count)]
        columns = tuple(list(itertools.compress(column, kept)) for column in columns)
    good = raw_events(*columns)
    good.sort(key=by_ts)
    return good, _arrow_rejections(table, errors)


def _invalid_text_rows(table: pa.Table | pa.RecordBatch, mapping: EventMapping | None
                       ) -> tuple[pa.Table | pa.RecordBatch, dict[int, str]]:
    """``(table, {position: reason})`` for rows with a text value that is not UTF-8 (``mapping``: the batch's, whose
    line and corrupt-record columns a reason names the field of; None: rows that are not validated).

    Arrow does not check the bytes of a string column it is handed, and Spark hands over what it read: a line of
    a file source or a Kafka record's value keeps its bytes (``_line``, a corrupt record) while the values parsed
    from it hold U+FFFD instead.  One full validation per batch proves the common case clean; otherwise each such
    row is rejected with :func:`~activedb.ingest._mapping.invalid_utf8_reason`, and the table returned has those
    values made valid text (each bad byte as ``\\xNN``; null in a nested column) so that the rest of validation
    can read it — the row's dead letter keeps the original bytes (the letters take rows from the batch itself)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    try:
        table.validate(full=True)
        return table, {}
    except pa.ArrowInvalid:
        pass
    if isinstance(table, pa.RecordBatch):
        table = pa.Table.from_batches([table])
    reasons: dict[int, str] = {}
    columns = list(table.columns)
    for index, name in enumerate(table.schema.names):
        column = columns[index]
        try:
            column.validate(full=True)
            continue
        except pa.ArrowInvalid:
            pass
        if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
            repaired = []
            for position, data in enumerate(column.cast(pa.binary() if pa.types.is_string(column.type)
                                                        else pa.large_binary()).to_pylist()):
                try:
                    repaired.append(None if data is None else data.decode("utf-8"))
                except UnicodeDecodeError:
                    reasons.setdefault(position, invalid_utf8_reason(data, name, mapping))
                    repaired.append(data.decode("utf-8", "backslashreplace"))
            columns[index] = pa.array(repaired, type=column.type)
            continue
        bad = [False] * len(column)                         # a struct or list with text inside: row by row
        for position in range(len(column)):
            try:
                column.take([position]).validate(full=True)
            except pa.ArrowInvalid:
                bad[position] = True
                reasons.setdefault(position, f"column {name!a} holds text that is not valid UTF-8; read as text it "
                                             f"would become U+FFFD, a value no one sent: the row is not applied, "
                                             f"its dead letter keeps the bytes")
        columns[index] = pc.if_else(pa.array(bad), pa.scalar(None, column.type), column)
    return pa.Table.from_arrays(columns, schema=table.schema), reasons


def _arrow_corrupt_rows(table: pa.Table | pa.RecordBatch, mapping: EventMapping) -> dict[int, str]:
    """``{position: reason}`` for rows whose corrupt-record column holds text."""
    column_name = mapping.corrupt_column
    if column_name is None or column_name not in table.schema.names:
        return {}
    column = table.column(column_name)
    if column.null_count == len(column):
        return {}
    lines = column.to_pylist()
    positions = [position for position, line in enumerate(lines) if line is not None]
    subset = table.take(positions)
    names = [name for name in subset.schema.names if name not in (column_name, mapping.line_column)]
    types = {name: str(subset.schema.field(name).type) for name in names}
    columns = {name: arrow_values(subset.column(name)) for name in names}
    return {position: corrupt_reason(lines[position], {name: columns[name][index] for name in names}, types, mapping)
            for index, position in enumerate(positions)}


def _arrow_lone_surrogate_rows(table: pa.Table | pa.RecordBatch, mapping: EventMapping) -> dict[int, str]:
    """``{position: reason}`` for rows whose original line (``line_column``) holds a lone surrogate; the
    lines without any surrogate escape are passed over without a Python loop."""
    import pyarrow as pa
    import pyarrow.compute as pc

    column_name = mapping.line_column
    if column_name is None or column_name not in table.schema.names:
        return {}
    column = table.column(column_name)
    if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
        return {}
    suspects = pc.fill_null(pc.match_substring_regex(column, SURROGATE_ESCAPE.pattern), False)
    if not pc.any(suspects).as_py():
        return {}
    reasons = {}
    fields = frozenset(table.schema.names)
    for position, (suspect, line) in enumerate(zip(suspects.to_pylist(), column.to_pylist())):
        reason = lone_surrogate_reason(line, fields) if suspect else None
        if reason is not None:
            reasons[position] = reason
    return reasons


def _arrow_rejections(table: pa.Table | pa.RecordBatch, errors: Mapping[int, str]) -> list[Rejected]:
    """Rejected entries, in input order, each with its raw row made JSON-serialisable."""
    if not errors:
        return []
    positions = sorted(errors)
    return [Rejected(position, errors[position], row)
            for position, row in zip(positions, jsonable_rows(table.take(positions)))]


def jsonable_rows(table: pa.Table | pa.RecordBatch) -> list[dict[str, Json]]:
    """The rows of ``table`` as dicts of storable JSON values, as a dead letter shows them (``jsonable(value,
    tagged=True)``: bytes and non-finite floats tagged, a column's name that starts with ``$`` escaped)."""
    names = [tagged_key(name) for name in table.schema.names]
    columns = [arrow_values(table.column(index)) for index in range(table.num_columns)]
    return [{name: jsonable(values[index], tagged=True) for name, values in zip(names, columns)}
            for index in range(table.num_rows)]
