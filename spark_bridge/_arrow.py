"""The Arrow path of :func:`spark_bridge.mapping.rows_to_events`: a ``pyarrow.Table`` or ``RecordBatch`` (from
``DataFrame.toArrow()``) validated one column at a time.

Columns whose Arrow type and statistics already prove every value valid (a string column without nulls or empty
strings, an integer key column without nulls, a timestamp column without nulls, a finite float timestamp column in
``datetime``'s range, converted by Arrow compute) skip the per-value converter.  Everything else goes through the
same converters as the row path (``mapping.convert_column`` and friends): both paths give the same values and reasons.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from activedb.store import jsonable

from spark_bridge.errors import MappingError
from spark_bridge.mapping import (
    EPOCH, SURROGATE_ESCAPE, EventMapping, RawEvent, Rejected, by_ts, check_key, convert_column, corrupt_reason,
    event_id, lone_surrogate_reason, raw_event, to_utc, type_converter,
)

__all__ = ["arrow_values", "jsonable_rows", "table_to_events"]

#: The microseconds from EPOCH that ``datetime`` can hold (``to_utc`` rejects the rest as out of range).
_MIN_MICROS, _MAX_MICROS = ((limit.replace(tzinfo=dt.timezone.utc) - EPOCH) // dt.timedelta(microseconds=1)
                            for limit in (dt.datetime.min, dt.datetime.max))


#: Microseconds from the epoch within which ``datetime.fromtimestamp(micros / 1e6, UTC)`` is exact: below 2**32
#: seconds a double's spacing is under a microsecond, so the quotient is within half a microsecond of the whole
#: number of microseconds it stands for, and ``fromtimestamp`` rounds to the nearest one (years 1833 to 2106).
_EXACT_FLOAT_MICROS = 2**32 * 1_000_000


def arrow_values(column: Any) -> list[Any]:
    """``column.to_pylist()``, with timestamps as aware UTC datetimes built fast.

    ``to_pylist`` on a zoned timestamp column builds a ``ZoneInfo`` datetime per value
    (about 3 µs each); going through int64 microseconds costs about 0.5 µs, and
    ``fromtimestamp`` of the seconds as a float about 0.25 µs where that is exact (``_EXACT_FLOAT_MICROS``).
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    if pa.types.is_timestamp(column.type):
        micros = column.cast(pa.timestamp("us", tz=column.type.tz), safe=False).cast(pa.int64())
        values = micros.to_pylist()
        if len(micros) and not micros.null_count:
            low, high = pc.min_max(micros).values()
            if -_EXACT_FLOAT_MICROS < low.as_py() and high.as_py() < _EXACT_FLOAT_MICROS:
                at, utc = dt.datetime.fromtimestamp, dt.timezone.utc
                return [at(value / 1e6, utc) for value in values]
        epoch, delta = EPOCH, dt.timedelta
        return [None if value is None else epoch + delta(microseconds=value) for value in values]
    return column.to_pylist()


def _arrow_column_is_clean_text(column: Any) -> bool:
    """Every value is a non-null, non-empty string (decided without Python loops)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    return ((pa.types.is_string(column.type) or pa.types.is_large_string(column.type)) and not column.null_count
            and (len(column) == 0 or pc.min(pc.utf8_length(column)).as_py() > 0))


def _arrow_type_column(column: Any, mapping: EventMapping, known: frozenset[str] | None,
                       label: str) -> tuple[list[Any], dict[int, str]]:
    import pyarrow as pa
    import pyarrow.compute as pc

    if mapping.type_map is None and _arrow_column_is_clean_text(column):
        if known is None or pc.all(pc.is_in(column, value_set=pa.array(sorted(known), column.type))).as_py():
            return column.to_pylist(), {}
    return convert_column(column.to_pylist(), type_converter(mapping, known), label)


def _arrow_key_column(column: Any, label: str) -> tuple[list[Any], dict[int, str]]:
    import pyarrow as pa

    if _arrow_column_is_clean_text(column) or (pa.types.is_integer(column.type) and not column.null_count):
        return column.to_pylist(), {}
    return convert_column(column.to_pylist(), check_key, label)


def _arrow_ts_column(column: Any, unit_divisor: int, label: str) -> tuple[list[Any], dict[int, str]]:
    import pyarrow as pa
    import pyarrow.compute as pc

    if (pa.types.is_floating(column.type) and len(column) and not column.null_count
            and pc.all(pc.is_finite(column)).as_py()):
        # to_utc's float branch, same float operations and rounding; out of datetime's range: per value (its reason)
        micros = pc.round(pc.divide(pc.multiply(column.cast(pa.float64()), 1e6), float(unit_divisor)), 0,
                          "half_to_even")
        low, high = pc.min_max(micros).values()
        if _MIN_MICROS <= low.as_py() and high.as_py() <= _MAX_MICROS:
            column = micros.cast(pa.int64()).cast(pa.timestamp("us", "UTC"))
    if pa.types.is_timestamp(column.type):
        values = arrow_values(column)
        errors = {position: f"{label} is null" for position, value in enumerate(values) if value is None}
        return values, errors
    return convert_column(arrow_values(column), lambda value: to_utc(value, unit_divisor), label)


def table_to_events(table: Any, mapping: EventMapping, known: frozenset[str] | None, unit_divisor: int,
                    labels: tuple[str, str, str]) -> tuple[list[RawEvent], list[Rejected]]:
    names = list(table.schema.names)
    if len(set(names)) != len(names):
        raise MappingError(f"the batch has duplicate column names: {names}; rename them before mapping")
    count = table.num_rows
    payload_names = mapping.payload_columns_for(names)
    absent = [name for name in (mapping.type_column, mapping.key_column, mapping.ts_column, *payload_names)
              if name not in names]
    if absent:
        reason = f"missing field {absent[0]!r}: the batch has no such column (columns: {names})"
        return [], _arrow_rejections(table, {position: reason for position in range(count)})

    type_label, key_label, ts_label = labels
    corrupt = _arrow_corrupt_rows(table, mapping)
    type_values, type_errors = _arrow_type_column(table.column(mapping.type_column), mapping, known, type_label)
    key_values, key_errors = _arrow_key_column(table.column(mapping.key_column), key_label)
    ts_values, ts_errors = _arrow_ts_column(table.column(mapping.ts_column), unit_divisor, ts_label)
    errors = dict(corrupt)
    for position, reason in _arrow_lone_surrogate_rows(table, mapping).items():
        errors.setdefault(position, reason)
    id_values: list[Any] = [None] * count
    id_errors: dict[int, str] = {}
    if mapping.id_column is not None:
        if mapping.id_column not in names:
            id_errors = {position: f"missing field {mapping.id_column!r} (the event id)" for position in range(count)}
        else:
            id_values, id_errors = convert_column(arrow_values(table.column(mapping.id_column)), event_id,
                                                   f"event id ({mapping.id_column!r})")
    for column_errors in (type_errors, key_errors, ts_errors, id_errors):
        for position, reason in column_errors.items():
            errors.setdefault(position, reason)

    payload_columns = [arrow_values(table.column(name)) for name in payload_names]
    if len(payload_names) == 1:              # (the common case: a dict per row without a tuple and a zip)
        name = payload_names[0]
        payloads = [{name: value} for value in payload_columns[0]]
    elif payload_names:
        payloads = [dict(zip(payload_names, row)) for row in zip(*payload_columns)]
    else:
        payloads = [{} for _ in range(count)]
    good = [raw_event(event_type, key, ts, payload, position, event_id)
            for position, (event_type, key, ts, payload, event_id)
            in enumerate(zip(type_values, key_values, ts_values, payloads, id_values)) if position not in errors]
    good.sort(key=by_ts)
    return good, _arrow_rejections(table, errors)


def _arrow_corrupt_rows(table: Any, mapping: EventMapping) -> dict[int, str]:
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


def _arrow_lone_surrogate_rows(table: Any, mapping: EventMapping) -> dict[int, str]:
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


def _arrow_rejections(table: Any, errors: Mapping[int, str]) -> list[Rejected]:
    """Rejected entries, in input order, each with its raw row made JSON-serialisable."""
    if not errors:
        return []
    positions = sorted(errors)
    return [Rejected(position, errors[position], row)
            for position, row in zip(positions, jsonable_rows(table.take(positions)))]


def jsonable_rows(table: Any) -> list[dict[str, Any]]:
    """The rows of ``table`` as dicts of storable JSON values."""
    names = table.schema.names
    columns = [arrow_values(table.column(index)) for index in range(table.num_columns)]
    return [{name: jsonable(values[index]) for name, values in zip(names, columns)} for index in range(table.num_rows)]
