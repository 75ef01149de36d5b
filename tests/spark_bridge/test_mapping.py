"""rows_to_events: validation, rejection reasons, ordering, Arrow and dict inputs agree."""

from __future__ import annotations

import datetime as dt
import json
import math
from decimal import Decimal

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_bridge.errors import MappingError
from activedb.ingest._mapping import EventMapping, RawEvent, Rejected, jsonable, rows_to_events
from tests.spark_bridge._streams import CountedName

UTC = dt.timezone.utc
T0 = dt.datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
MAPPING = EventMapping("type", "key", "ts")


def _ts(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def _arrow(rows: list[dict], schema: pa.Schema) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=schema)


SCHEMA = pa.schema(
    [("type", pa.string()), ("key", pa.string()), ("ts", pa.timestamp("us", tz="UTC")), ("room", pa.int64())]
)


def test_good_rows_become_events_sorted_by_time_and_stable():
    rows = [
        {"type": "enter", "key": "p1", "ts": _ts(3), "room": 1},
        {"type": "wash", "key": "p2", "ts": _ts(1), "room": 2},
        {"type": "leave", "key": "p1", "ts": _ts(3), "room": 1},  # same time as row 0
        {"type": "enter", "key": "p3", "ts": _ts(2), "room": 3},
    ]
    for batch in (rows, _arrow(rows, SCHEMA)):
        good, bad = rows_to_events(batch, MAPPING)
        assert bad == []
        assert [event.position for event in good] == [1, 3, 0, 2]
        assert good[0] == RawEvent("wash", "p2", _ts(1), {"room": 2}, 1)
        assert all(event.ts.tzinfo is UTC for event in good)


def test_the_good_rows_among_rejected_ones_become_the_events_the_dataclass_makes_with_their_own_positions():
    """The events are made column by column (``raw_events``), the rejected rows left out of every column: each event
    is the one ``RawEvent(...)`` makes of its row — type, key, ts, payload, position and id kept together."""
    mapping = EventMapping("type", "key", "ts", payload_columns=["room"], id_column="id")
    rows = [{"type": "enter", "key": f"p{n}", "ts": _ts(10 - n), "room": n, "id": f"e{n}"} for n in range(8)]
    rows[1]["type"] = None
    rows[4]["key"] = ""
    rows[6]["ts"] = None
    schema = pa.schema([*SCHEMA, ("id", pa.string())])
    for batch in (rows, _arrow(rows, schema)):
        good, bad = rows_to_events(batch, mapping)
        assert [rejected.position for rejected in bad] == [1, 4, 6]
        assert good == [RawEvent("enter", f"p{n}", _ts(10 - n), {"room": n}, n, f"e{n}") for n in (7, 5, 3, 2, 0)]
        assert [event.payload for event in good] == [{"room": n} for n in (7, 5, 3, 2, 0)]   # (hash=False: compared here)


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        ({"key": "p", "ts": 1.0}, "event type ('type') is missing"),
        ({"type": None, "key": "p", "ts": 1.0}, "event type ('type') is null"),
        ({"type": "", "key": "p", "ts": 1.0}, "need a non-empty string"),
        ({"type": 7, "key": "p", "ts": 1.0}, "event type ('type') is 7 (int)"),
        ({"type": "enter", "ts": 1.0}, "key ('key') is missing"),
        ({"type": "enter", "key": None, "ts": 1.0}, "key ('key') is null"),
        ({"type": "enter", "key": "", "ts": 1.0}, "key ('key') is an empty string"),
        ({"type": "enter", "key": 1.5, "ts": 1.0}, "key ('key') is 1.5 (float), need a string or an integer"),
        ({"type": "enter", "key": True, "ts": 1.0}, "key ('key') is True (bool)"),
        ({"type": "enter", "key": "p"}, "timestamp ('ts') is missing"),
        ({"type": "enter", "key": "p", "ts": None}, "timestamp ('ts') is null"),
        ({"type": "enter", "key": "p", "ts": "yesterday"}, "not an ISO-8601 timestamp"),
        ({"type": "enter", "key": "p", "ts": math.nan}, "not a finite number"),
        ({"type": "enter", "key": "p", "ts": math.inf}, "not a finite number"),
        ({"type": "enter", "key": "p", "ts": 10**30}, "out of the representable range"),
        ({"type": "enter", "key": "p", "ts": False}, "is False (bool), not a timestamp"),
        ({"type": "enter", "key": "p", "ts": dt.date(2024, 1, 1)}, "a date without a time"),
        ({"type": "enter", "key": "p", "ts": [1]}, "not a timestamp"),
    ],
)
def test_bad_row_reasons(row, reason):
    good, bad = rows_to_events([row], MAPPING)
    assert good == []
    assert len(bad) == 1 and bad[0].position == 0
    assert reason in bad[0].reason
    json.dumps(bad[0].row)  # the raw row is JSON-serialisable


def test_first_bad_field_wins_in_type_key_ts_order():
    good, bad = rows_to_events([{"type": None, "key": None, "ts": None}], MAPPING)
    assert [rejected.reason for rejected in bad] == ["event type ('type') is null"]


def test_unknown_types_are_rejected_only_when_known_types_given():
    rows = [{"type": "enter", "key": "p", "ts": 1}, {"type": "dance", "key": "p", "ts": 2}]
    good, bad = rows_to_events(rows, MAPPING)
    assert len(good) == 2 and bad == []
    for batch in (rows, _arrow(rows, pa.schema([("type", pa.string()), ("key", pa.string()), ("ts", pa.int64())]))):
        good, bad = rows_to_events(batch, MAPPING, known_types={"enter", "leave"})
        assert [event.event_type for event in good] == ["enter"]
        assert bad[0].position == 1
        assert bad[0].reason == "event type ('type') is 'dance', not a known event type (known: 'enter', 'leave')"
        assert bad[0].row == {"type": "dance", "key": "p", "ts": 2}


def test_type_map_renames_before_the_known_check():
    mapping = EventMapping("code", "key", "ts", type_map={1: "enter", 2: "leave"})
    rows = [{"code": 1, "key": "p", "ts": 0}, {"code": 2, "key": "p", "ts": 1}, {"code": 3, "key": "p", "ts": 2}]
    good, bad = rows_to_events(rows, mapping, known_types={"enter", "leave"})
    assert [event.event_type for event in good] == ["enter", "leave"]
    assert "3 (int)" in bad[0].reason


@pytest.mark.parametrize(
    ("value", "unit", "expected"),
    [
        (1_700_000_000, "s", dt.datetime(2023, 11, 14, 22, 13, 20, tzinfo=UTC)),
        (1_700_000_000.25, "s", dt.datetime(2023, 11, 14, 22, 13, 20, 250000, tzinfo=UTC)),
        (1_700_000_000_250, "ms", dt.datetime(2023, 11, 14, 22, 13, 20, 250000, tzinfo=UTC)),
        (1_700_000_000_000_001, "us", dt.datetime(2023, 11, 14, 22, 13, 20, 1, tzinfo=UTC)),
        ("2024-05-01T14:00:00+02:00", "s", T0),
        ("2024-05-01T12:00:00Z", "s", T0),
        ("2024-05-01 12:00:00", "s", T0),  # no offset: UTC
        (dt.datetime(2024, 5, 1, 12, 0), "s", T0),  # naive (TIMESTAMP_NTZ): UTC
        (dt.datetime(2024, 5, 1, 14, 0, tzinfo=dt.timezone(dt.timedelta(hours=2))), "s", T0),
    ],
)
def test_timestamp_conversions(value, unit, expected):
    mapping = EventMapping("type", "key", "ts", ts_unit=unit)
    good, bad = rows_to_events([{"type": "enter", "key": "p", "ts": value}], mapping)
    assert bad == []
    assert good[0].ts == expected and good[0].ts.tzinfo is UTC


def test_payload_columns_default_explicit_and_missing():
    rows = [{"type": "enter", "key": 7, "ts": 1, "room": 3, "note": None}]
    good, _ = rows_to_events(rows, MAPPING)
    assert good[0].payload == {"room": 3, "note": None} and good[0].key == 7
    good, _ = rows_to_events(rows, EventMapping("type", "key", "ts", payload_columns=["note", "ts"]))
    assert good[0].payload == {"note": None, "ts": 1}
    good, bad = rows_to_events(rows, EventMapping("type", "key", "ts", payload_columns=["floor"]))
    assert good == [] and bad[0].reason == "missing field 'floor'"


def test_the_default_payload_leaves_out_every_column_that_makes_the_event_for_dicts_as_for_arrow():
    """``payload_columns=None``: the payload is every column but those of the event itself — the producer, accuracy
    and local-timestamp columns too (``EventMapping.payload_columns_for``) — whether the rows are dicts or an Arrow
    table.  Dicts kept those columns in the payload, so the same row gave a rule another payload through feed
    than through Spark."""
    mapping = EventMapping("type", "key", "ts", producer_column="producer", accuracy_minus_column="minus",
                           accuracy_plus_column="plus", local_ts_column="local", id_column="id")
    rows = [{"type": "enter", "key": "a", "ts": 1.0, "producer": "p1", "minus": 0.1, "plus": 0.2, "local": 1.5,
             "id": "e1", "room": 3}]
    for batch in (rows, pa.Table.from_pylist(rows)):
        good, bad = rows_to_events(batch, mapping)
        assert bad == [] and good[0].payload == {"id": "e1", "room": 3}, type(batch)


def test_a_row_with_a_bad_event_id_and_another_bad_field_is_rejected_for_its_id_for_dicts_as_for_arrow():
    """The first reason of a row is its id's, then its type's, key's and timestamp's — the dict path's order; the
    Arrow path named the type, key or timestamp before a bad id, so one row got two different dead-letter reasons."""
    mapping = EventMapping("type", "key", "ts", id_column="id")
    rows = [{"type": None, "key": "a", "ts": 1.0, "id": None}, {"type": "enter", "key": None, "ts": None, "id": ""},
            {"type": "enter", "key": "a", "ts": 1e20, "id": None}]
    expected = ["event id ('id') is null", "event id ('id') is an empty string", "event id ('id') is null"]
    for batch in (rows, pa.Table.from_pylist(rows)):
        good, bad = rows_to_events(batch, mapping)
        assert good == [] and [rejected.reason for rejected in bad] == expected, type(batch)


def test_arrow_batch_without_a_mapped_column_rejects_every_row():
    table = pa.table({"type": ["enter", "leave"], "key": ["a", "b"]})
    good, bad = rows_to_events(table, MAPPING)
    assert good == []
    assert [rejected.position for rejected in bad] == [0, 1]
    assert bad[0].reason.startswith("missing field 'ts': the batch has no such column")
    assert bad[1].row == {"type": "leave", "key": "b"}


def test_arrow_rows_with_nulls_and_bad_values_are_rejected_individually():
    table = pa.table(
        {
            "type": pa.array(["enter", None, "leave", "", "enter"]),
            "key": pa.array(["a", "b", None, "d", "e"]),
            "ts": pa.array([_ts(1), _ts(2), _ts(3), _ts(4), None], pa.timestamp("us", tz="UTC")),
        }
    )
    good, bad = rows_to_events(table, MAPPING)
    assert [event.position for event in good] == [0]
    assert [(rejected.position, rejected.reason) for rejected in bad] == [
        (1, "event type ('type') is null"),
        (2, "key ('key') is null"),
        (3, "event type ('type') is '' (str), need a non-empty string"),
        (4, "timestamp ('ts') is null"),
    ]
    assert bad[0].row == {"type": None, "key": "b", "ts": "2024-05-01T12:00:02+00:00"}


def test_arrow_integer_keys_and_numeric_timestamps():
    table = pa.table({"type": ["enter", "enter"], "key": pa.array([5, 6], pa.int32()), "ts": [2.5, 1.0]})
    good, bad = rows_to_events(table, MAPPING)
    assert bad == [] and [(event.key, event.position) for event in good] == [(6, 1), (5, 0)]


def test_arrow_nanosecond_and_naive_timestamps():
    table = pa.table(
        {
            "type": ["enter", "enter"],
            "key": ["a", "b"],
            "ts": pa.array([1_000_000_001_999, 2_000_000_000_000], pa.timestamp("ns")),
        }
    )
    good, _ = rows_to_events(table, MAPPING)
    assert [event.ts for event in good] == [
        dt.datetime(1970, 1, 1, 0, 16, 40, 1, tzinfo=UTC),  # truncated to microseconds
        dt.datetime(1970, 1, 1, 0, 33, 20, tzinfo=UTC),
    ]


def test_non_mapping_rows_are_rejected():
    good, bad = rows_to_events([("enter", "p", 1)], MAPPING)
    assert good == [] and bad[0].row == {"value": ["enter", "p", 1]}
    assert "not a mapping" in bad[0].reason


def test_duplicate_arrow_columns_are_a_mapping_error():
    table = pa.Table.from_arrays([pa.array(["a"]), pa.array(["b"])], names=["key", "key"])
    with pytest.raises(MappingError, match="duplicate column names"):
        rows_to_events(table, MAPPING)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"type_column": "", "key_column": "k", "ts_column": "t"},
        {"type_column": "a", "key_column": "k", "ts_column": "t", "payload_columns": "x"},
        {"type_column": "a", "key_column": "k", "ts_column": "t", "payload_columns": ["x", "x"]},
        {"type_column": "a", "key_column": "k", "ts_column": "t", "ts_unit": "minutes"},
    ],
)
def test_malformed_mappings_raise(kwargs):
    with pytest.raises(MappingError):
        EventMapping(**kwargs)


def test_the_timestamp_unit_is_a_time_unit():
    from activedb.events import TimeUnit

    assert EventMapping("t", "k", "ts", ts_unit="ms").ts_unit is TimeUnit.MS
    assert EventMapping("t", "k", "ts").ts_unit is TimeUnit.S and TimeUnit.US.per_second == 1_000_000
    with pytest.raises(MappingError, match=r"ts_unit=\.\.\.\)='minutes' is not a TimeUnit: use one of TimeUnit.S"):
        EventMapping("t", "k", "ts", ts_unit="minutes")


def test_mapping_is_immutable_and_hashable():
    mapping = EventMapping("t", "k", "ts", payload_columns=["a"], type_map={1: "x"})
    assert mapping.payload_columns == ("a",)
    hash(mapping)
    with pytest.raises(AttributeError):
        mapping.type_column = "other"  # type: ignore[misc]
    with pytest.raises(TypeError):
        mapping.type_map[2] = "y"  # type: ignore[index]


def test_jsonable():
    value = {
        "when": T0,
        "day": dt.date(2024, 1, 2),
        "price": Decimal("1.10"),
        "blob": b"\x00\x01",
        "nan": math.nan,
        1: (1, 2),
        "nested": {"set": {3}},
        "other": object,
    }
    converted = jsonable(value)
    json.dumps(converted, allow_nan=False)
    assert converted["when"] == "2024-05-01T12:00:00+00:00"
    assert converted["price"] == "1.10" and converted["blob"] == "AAE=" and converted["nan"] == "nan"
    assert converted["1"] == [1, 2] and converted["nested"] == {"set": [3]}


_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**20), max_value=10**20),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=5),
    st.sampled_from(["enter", "leave", "2024-01-01T00:00:00Z", "p1"]),
    st.datetimes(timezones=st.just(UTC)),
)
_rows = st.lists(
    st.dictionaries(st.sampled_from(["type", "key", "ts", "extra"]), _values, max_size=4), max_size=20
)


@settings(max_examples=200, deadline=None)
@given(_rows)
def test_every_row_is_either_good_or_bad_and_good_is_sorted(rows):
    good, bad = rows_to_events(rows, MAPPING, known_types={"enter", "leave"})
    positions = sorted([event.position for event in good] + [rejected.position for rejected in bad])
    assert positions == list(range(len(rows)))
    keys = [(event.ts, event.position) for event in good]
    assert keys == sorted(keys)  # by time, ties in input order
    for rejected in bad:
        assert isinstance(rejected, Rejected) and rejected.reason
        json.dumps(rejected.row, allow_nan=False)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.floats(-1e11, 1e11), st.floats(allow_nan=False),    # halves, datetime's limits:
                          st.sampled_from([0.5, 2.5, -1.5, -62135596800.5, 253402300799.9999995])), max_size=20),
       st.sampled_from(["s", "ms", "us"]), st.sampled_from([1, 16_384]))
def test_a_float_timestamp_column_converts_as_each_value_does(seconds, unit, vector_rows):
    """Arrow's float columns are converted column-wise (_arrow.py), by Arrow compute from ``_VECTOR_ROWS`` rows
    (lowered here to 1), in Python below: same datetimes, same reasons as row by row."""
    from activedb.ingest import _arrow

    mapping = EventMapping("type", "key", "ts", ts_unit=unit)
    saved, _arrow._VECTOR_ROWS = _arrow._VECTOR_ROWS, vector_rows
    try:
        _check_float_column(seconds, mapping)
    finally:
        _arrow._VECTOR_ROWS = saved


def _check_float_column(seconds, mapping):
    table = pa.table({"type": ["a"] * len(seconds), "key": ["k"] * len(seconds), "ts": pa.array(seconds, pa.float64())})
    by_column, by_value = (rows_to_events(rows, mapping) for rows in (table, table.to_pylist()))
    assert [(event.ts, event.position) for event in by_column[0]] == [(e.ts, e.position) for e in by_value[0]]
    assert [(item.position, item.reason) for item in by_column[1]] == [(i.position, i.reason) for i in by_value[1]]


@pytest.mark.parametrize("as_arrow", [True, False])
def test_a_line_with_a_lone_surrogate_rejects_its_row_whatever_spark_made_of_it(as_arrow):
    """The original line (``_line``) shows what Spark's string conversion hid behind a '?'."""
    lines = ['{"type": "a", "key": "k\\ud800x", "ts": 1}',            # lone high surrogate: rejected
             '{"type": "a", "key": "k\\ud83d\\ude00x", "ts": 2}',     # a pair: one character, fine
             '{"type": "a", "key": "k\\\\ud800x", "ts": 3}',          # an escaped backslash, not an escape
             '{"type": "a", "key": "k?x", "ts": 4, "unread": "\\udc00"}',   # a field the batch does not have
             None]                                                     # no line kept: nothing to check
    columns = {"type": ["a"] * 5, "key": ["k?x", "k\U0001F600x", "k\\ud800x", "k?x", "k?x"], "ts": [1, 2, 3, 4, 5],
               "_line": lines}
    rows = pa.table(columns) if as_arrow else [dict(zip(columns, values)) for values in zip(*columns.values())]
    good, bad = rows_to_events(rows, MAPPING)
    assert [event.position for event in good] == [1, 2, 3, 4]
    assert all("_line" not in event.payload for event in good)
    [rejected] = bad
    assert rejected.position == 0 and rejected.reason.startswith("field 'key' holds a lone surrogate")
    assert "turns into '?'" in rejected.reason and json.loads(rejected.row["_line"])["key"] == "k\ud800x"


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(min_value=-2**32 * 10**6 + 1, max_value=2**32 * 10**6 - 1), min_size=1, max_size=40),
       st.sampled_from(["UTC", "Europe/Berlin", "America/Los_Angeles"]))
def test_arrow_timestamps_within_the_float_range_are_the_exact_microseconds(micros, zone):
    """The fast path of ``arrow_values`` (seconds as a float, ``fromtimestamp``) gives the datetime of exactly those
    microseconds, as aware UTC datetimes, whatever the column's zone; outside its range and with nulls the exact
    path is taken."""
    from activedb.ingest._arrow import arrow_values

    epoch = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
    column = pa.array(micros, pa.int64()).cast(pa.timestamp("us", tz=zone))
    values = arrow_values(column)
    assert values == [epoch + dt.timedelta(microseconds=value) for value in micros]
    assert all(value.tzinfo is dt.timezone.utc for value in values)


def test_arrow_timestamps_outside_the_float_range_or_with_nulls_are_exact_too():
    from activedb.ingest._arrow import arrow_values

    epoch = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
    far = [-62135596800 * 10**6, 253402300799 * 10**6 + 999999, 2**32 * 10**6 + 123457, 1_700_000_000_000_001]
    assert arrow_values(pa.array(far, pa.int64()).cast(pa.timestamp("us", tz="UTC"))) == [
        epoch + dt.timedelta(microseconds=value) for value in far]
    with_null = pa.array([1_700_000_000_000_001, None], pa.int64()).cast(pa.timestamp("us", tz="UTC"))
    assert arrow_values(with_null) == [epoch + dt.timedelta(microseconds=1_700_000_000_000_001), None]


@pytest.mark.parametrize("type_map", [["a"], [("a", "A")], "ab"], ids=["a-list", "pairs", "a-text"])
def test_a_type_map_that_is_no_mapping_is_a_mapping_error(type_map):
    """``type_map`` maps raw type values to event types: a list failed with dict()'s ValueError ('dictionary update
    sequence element #0 has length 1'), and a list of pairs or a two-letter text were taken as the mapping they
    are not."""
    with pytest.raises(MappingError, match=r"EventMapping.type_map maps raw type values to event types"):
        EventMapping("type", "key", "ts", type_map=type_map)


def test_arrow_timestamps_beyond_what_a_datetime_holds_reject_their_rows_and_spare_the_rest():
    """Spark's timestamps reach year 294247 and Arrow's further; Python's ``datetime`` ends at year 9999.  A batch with
    one such value in its time or in a payload column rejects that row (a dead letter saying so), and every other row
    is an event: the conversion raised OverflowError for the whole batch, so a connector's every retry failed the
    same way and the stream stopped for good."""
    beyond = 300_000_000_000 * 10**6            # about year 11476, in microseconds from the epoch
    good_ts = 1_700_000_000 * 10**6
    table = pa.table({
        "type": ["enter", "enter", "enter", "enter"],
        "key": ["a", "b", "c", "d"],
        "ts": pa.array([good_ts, beyond, -beyond, good_ts + 1], pa.int64()).cast(pa.timestamp("us", tz="UTC")),
        "seen": pa.array([good_ts, good_ts, good_ts, beyond], pa.int64()).cast(pa.timestamp("us", tz="UTC")),
    })
    good, bad = rows_to_events(table, EventMapping("type", "key", "ts", payload_columns=("seen",)))
    assert [event.position for event in good] == [0]
    assert [rejected.position for rejected in bad] == [1, 2, 3]
    assert all("out of the representable range" in rejected.reason for rejected in bad), bad
    assert "timestamp ('ts')" in bad[0].reason and "'seen'" in bad[2].reason, bad


def test_an_arrow_event_id_beyond_what_a_datetime_holds_rejects_its_row_as_a_datetime_id_does():
    good_ts, beyond = 1_700_000_000 * 10**6, 300_000_000_000 * 10**6
    table = pa.table({"type": ["enter", "enter"], "key": ["a", "b"], "ts": [1.0, 2.0],
                      "id": pa.array([good_ts, beyond], pa.int64()).cast(pa.timestamp("us", tz="UTC"))})
    good, bad = rows_to_events(table, EventMapping("type", "key", "ts", id_column="id"))
    assert good == [] and [rejected.position for rejected in bad] == [0, 1]
    assert "out of the representable range" in bad[1].reason and "event id ('id')" in bad[1].reason, bad


def test_a_wide_arrow_batch_is_checked_against_its_mapping_in_comparisons_linear_in_its_columns():
    """A batch's columns were checked against the ones the mapping needs by list membership (``name not in names``
    for every payload column): comparisons quadratic in the columns, so a stream of wide rows paid for it in every
    batch, whatever its number of rows (seconds per batch at 20,000 columns).  Counted, not timed: the machine is
    shared."""
    width = 2_000
    columns = {"type": ["add"], "key": ["k"], "ts": [dt.datetime(2024, 5, 1, 12, 0, tzinfo=dt.timezone.utc)]}
    columns.update({f"c{index}": [index] for index in range(width)})
    mapping = EventMapping("type", "key", "ts", payload_columns=[CountedName(f"c{index}") for index in range(width)])
    CountedName.compared = 0
    events, rejected = rows_to_events(pa.table(columns), mapping)
    assert (len(events), rejected, len(events[0].payload)) == (1, [], width)
    assert CountedName.compared < 10 * width, f"{CountedName.compared} comparisons of {width} payload column names"
