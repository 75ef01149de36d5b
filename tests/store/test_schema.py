"""``TableInfo`` (``activedb/store/_schema.py``) on tables reflected from PostgreSQL: what a row shows before
PostgreSQL fills it.  Real PostgreSQL."""

from __future__ import annotations

import datetime
import decimal
import re
import sys
from typing import Any

import pytest
import sqlalchemy as sa

import activedb
from activedb.streams._overlay import Overlay
from activedb.streams._view import Stamp, StoreView


def _inserted_and_stored(db, table):
    """The row 1 of ``table`` inserted without any other column: as the inserting transaction reads it, and as a
    later one reads it from PostgreSQL."""
    with db.transaction() as tx:
        tx.insert(table, id=1)
        fresh = tx.read(table, 1)
    with db.transaction() as tx:
        return fresh, tx.read(table, 1)


def test_a_new_row_shows_each_constant_default_as_the_stored_row_holds_it(db):
    """A row inserted without some columns shows them at their constant defaults (``TableInfo.blank_row``): in the
    inserting transaction's reads and its insert event's ``new`` ("the stored row", the events design note).  Each
    must be the value PostgreSQL stores and gives back: a ``numeric`` default is a ``Decimal`` (before: the float
    ``0.1``, which is not ``Decimal('0.10')``, and with which ``Decimal`` arithmetic fails), a text default holding
    ``::`` is its text and a ``jsonb`` default its value (before: ``None`` for both)."""
    with db.engine.begin() as connection:
        connection.execute(sa.text(
            "CREATE TABLE constant_defaults (id integer PRIMARY KEY, price numeric(10, 2) NOT NULL DEFAULT 0.10, "
            "amount numeric DEFAULT -5, label text DEFAULT 'a::b', tags jsonb NOT NULL DEFAULT '[\"x\", 1]', "
            "body json DEFAULT '{\"k\": null}', ratio double precision DEFAULT 1.5, count integer DEFAULT -3)"))
    fresh, stored = _inserted_and_stored(db, "constant_defaults")
    assert stored == {"id": 1, "price": decimal.Decimal("0.10"), "amount": decimal.Decimal(-5), "label": "a::b",
                      "tags": ["x", 1], "body": {"k": None}, "ratio": 1.5, "count": -3}
    assert fresh == stored
    assert {name: type(value) for name, value in fresh.items()} == {
        name: type(value) for name, value in stored.items()}


def test_an_array_column_refuses_at_the_write_an_element_postgresql_would_refuse(db):
    """Every element of an array column's value is checked as a value of its element type (None is NULL; a nested
    list is a further dimension), so that an element PostgreSQL would refuse fails the write with ``InvalidValue``
    naming the column and the element — the write alone (a rule's subtransaction fails alone), not the commit of
    the whole tree.  Before, an array passed as soon as it was a list: ``['x']`` in an ``integer[]``, an integer out
    of its range, a bool, a text holding NUL failed the commit (``DatabaseError``) with everything else it wrote."""
    with db.engine.begin() as connection:
        connection.execute(sa.text("CREATE TABLE with_arrays (id integer PRIMARY KEY, counts integer[], "
                                   "tags text[], days date[], grid smallint[][])"))
    refused = [("counts", [1, "x"], r"\[1\] is 'x' \(str\)"), ("counts", [True], r"\[0\] is True"),
               ("tags", ["a", "b\x00"], r"\[1\]: .*NUL"),
               ("days", [datetime.date(2026, 1, 1), datetime.datetime(2026, 1, 1, 12)], r"\[1\]: .*time of day"),
               ("grid", [[1, 2], [3, 2**15]], r"\[1\]\[1\]: 32768 is outside")]
    with db.transaction() as tx:
        for column, value, message in refused:
            with pytest.raises(activedb.InvalidValue, match=rf"with_arrays\.{column} .*element {message}"):
                tx.write("with_arrays", 1, **{column: value})
        tx.write("with_arrays", 1, counts=[1, None, -2], tags=("a", None), days=[datetime.date(2026, 1, 1)],
                 grid=[[1, 2], [3, None]])
    with db.transaction() as tx:
        assert tx.read("with_arrays", 1) == {"id": 1, "counts": [1, None, -2], "tags": ["a", None],
                                             "days": [datetime.date(2026, 1, 1)], "grid": [[1, 2], [3, None]]}



def test_an_array_column_refuses_at_the_write_a_shape_postgresql_would_refuse_or_lose(db):
    """A multidimensional array is rectangular in PostgreSQL: each level all sub-arrays or all elements (NULL is an
    element), the sub-arrays of one level of one length and depth, none empty. A value of any other shape fails the
    write with ``InvalidValue`` naming the column and the sub-array. Before, the element check walked each sub-list
    and let the shape through: a ragged ``[[1, 2], [3]]``, ``[1, [2]]``, ``[[1, 2], None]`` or ``[[]]`` failed the
    commit of the whole tree (``DatabaseError``, SQLSTATE 22P02), ``[[1], 2]`` with a bare ``TypeError`` from the
    driver, and ``[[[1]], [2]]`` was committed as ``[]`` — the array lost without an error."""
    with db.engine.begin() as connection:
        connection.execute(sa.text("CREATE TABLE shaped_arrays (id integer PRIMARY KEY, grid integer[], "
                                   "words text[])"))
    refused = [("grid", [[1, 2], [3]], r"\[1\] has 1 element\(s\) where \[0\] has 2"),
               ("grid", ((1,), (2, 3)), r"\[1\] has 2 element\(s\) where \[0\] has 1"),
               ("grid", [[[1], [2, 3]]], r"\[0\]\[1\] has 2 element\(s\) where \[0\]\[0\] has 1"),
               ("grid", [1, [2]], r"\[1\] is a sub-array where \[0\] is an element"),
               ("grid", [[1], 2], r"\[1\] is an element \(2\) where \[0\] is a sub-array"),
               ("grid", [[1, 2], None], r"\[1\] is an element \(None\) where \[0\] is a sub-array"),
               ("grid", [None, [1, 2]], r"\[1\] is a sub-array where \[0\] is an element"),
               ("grid", [[]], r"\[0\] is an empty sub-array"),
               ("grid", [[1], []], r"\[1\] is an empty sub-array"),
               ("grid", [[[1]], [2]], r"\[1\] has the shape \[1\] where \[0\] has \[1, 1\]"),
               ("words", [["a", "b"], ["c"]], r"\[1\] has 1 element\(s\) where \[0\] has 2")]
    for column, value, message in refused:
        with db.transaction() as tx:
            with pytest.raises(activedb.InvalidValue, match=rf"shaped_arrays\.{column} .*{message}"):
                tx.write("shaped_arrays", 1, **{column: value})
            with pytest.raises(activedb.InvalidValue, match=rf"shaped_arrays\.{column} .*{message}"):
                tx.write_many("shaped_arrays", {2: {column: value}})
    accepted = {1: [], 2: [[1, 2], [3, None]], 3: [(1, 2), [3, 4]], 4: [[[1]], [[2]]], 5: [None, 1]}
    with db.transaction() as tx:
        for key, value in accepted.items():
            tx.write("shaped_arrays", key, grid=value, words=[["a"], ["b"]])
    with db.transaction() as tx:
        assert {key: tx.read("shaped_arrays", key)["grid"] for key in accepted} == {
            1: [], 2: [[1, 2], [3, None]], 3: [[1, 2], [3, 4]], 4: [[[1]], [[2]]], 5: [None, 1]}

def test_a_time_or_interval_column_refuses_at_the_write_a_value_of_another_type(db):
    """A ``time``, ``timetz`` or ``interval`` column (of any precision or fields) takes a ``datetime.time`` or a
    ``timedelta``, or a text PostgreSQL parses, as before; a number, a bool or a ``date`` fails the write with
    ``InvalidValue`` naming the column. Before, no Python type was checked for them (SQLAlchemy reflects
    ``interval`` as its dialect's ``INTERVAL``, not the ``sa.Interval`` the check named, and ``time`` was not named
    at all): ``5`` failed the commit of the whole tree (``DatabaseError``, SQLSTATE 42804, "is of type interval but
    expression is of type smallint")."""
    with db.engine.begin() as connection:
        connection.execute(sa.text("CREATE TABLE timed_values (id integer PRIMARY KEY, at time, at0 time(0), "
                                   "zoned timetz, span interval, span0 interval(0), hours interval hour)"))
    db.schema.refresh()
    for column in ("at", "at0", "zoned", "span", "span0", "hours"):
        for value in (5, 1.5, True, datetime.date(2026, 1, 1)):
            with db.transaction() as tx:
                with pytest.raises(activedb.InvalidValue, match=rf"timed_values\.{column} is .*; got {re.escape(repr(value))}"):
                    tx.write("timed_values", 1, **{column: value})
    with db.transaction() as tx:     # (each row twice: a group of rows of one type per column, and row by row)
        for key in (1, 3):
            tx.write("timed_values", key, at=datetime.time(12, 0, 0, 600_000), at0=datetime.time(12, 0, 0, 600_000),
                     zoned=datetime.time(12, tzinfo=datetime.timezone.utc),
                     span=datetime.timedelta(hours=1, seconds=1), span0=datetime.timedelta(seconds=1.6),
                     hours=datetime.timedelta(hours=1, minutes=5))
    with db.transaction() as tx:
        for key in (2, 4):
            tx.write("timed_values", key, at="12:00", at0="12:00:00.6", zoned="12:00+00", span="1 hour",
                     span0="2 seconds", hours="1 hour")
    with db.transaction() as tx:
        tx.write("timed_values", 5, at=datetime.time(12), span="1 hour")
        tx.write("timed_values", 6, at="12:00", span=datetime.timedelta(hours=1))
    with db.transaction() as tx:
        for key in (5, 6):
            assert tx.read("timed_values", key) == {
                "id": key, "at": datetime.time(12), "at0": None, "zoned": None, "span": datetime.timedelta(hours=1),
                "span0": None, "hours": None}
        assert tx.read("timed_values", 3) == {**tx.read("timed_values", 1), "id": 3}
        assert tx.read("timed_values", 4) == {**tx.read("timed_values", 2), "id": 4}
        assert tx.read("timed_values", 1) == {
            "id": 1, "at": datetime.time(12, 0, 0, 600_000), "at0": datetime.time(12, 0, 1),
            "zoned": datetime.time(12, tzinfo=datetime.timezone.utc), "span": datetime.timedelta(hours=1, seconds=1),
            "span0": datetime.timedelta(seconds=2), "hours": datetime.timedelta(hours=1)}
        assert tx.read("timed_values", 2) == {
            "id": 2, "at": datetime.time(12), "at0": datetime.time(12, 0, 1),
            "zoned": datetime.time(12, tzinfo=datetime.timezone.utc), "span": datetime.timedelta(hours=1),
            "span0": datetime.timedelta(seconds=2), "hours": datetime.timedelta(hours=1)}


def test_a_char_n_key_names_its_row_as_postgresql_gives_it_back_padded(db):
    """A ``char(n)`` value comes back padded with spaces to ``n`` (PostgreSQL ignores trailing spaces when it
    compares such values): a key of such a column names the row PostgreSQL gives back (``'ab'`` is ``'ab   '`` of a
    ``char(5)``), as a uuid's text names its ``UUID`` — reads by the key, ``read_many``, ``insert``'s existence check
    and a scan's equalities find the row.  Before, ``tx.read('codes', 'ab')`` of the committed row was None (a read
    for update found it), ``insert`` failed at the commit with ``DuplicateKey``, and the scans found nothing."""
    with db.engine.begin() as connection:
        connection.execute(sa.text("CREATE TABLE codes (code char(5) PRIMARY KEY, tag char(3), uses integer)"))
    db.run(lambda tx: tx.write("codes", "ab", tag="x", uses=1))
    stored = {"code": "ab   ", "tag": "x  ", "uses": 1}
    with db.transaction() as tx:
        assert tx.read("codes", "ab") == stored
        assert tx.read_many("codes", ["ab"]) == {"ab": stored}
        assert tx.scan("codes", {"code": "ab"}) == [stored]
        assert tx.scan("codes", {"tag": "x"}) == [stored]
        with pytest.raises(activedb.DuplicateKey):
            tx.insert("codes", code="ab", uses=2)
        tx.write("codes", "ab", uses=2)
        assert tx.read("codes", "ab   ") == {**stored, "uses": 2}
    with db.engine.connect() as connection:
        assert connection.execute(sa.text("SELECT code, uses FROM codes")).all() == [("ab   ", 2)]


def test_a_timestamp_key_of_a_precision_names_the_row_postgresql_rounds_it_to(db):
    """A ``timestamptz(0)`` (``timestamp(p)``) column keeps ``p`` fractional digits, rounding a value half away from
    PostgreSQL's epoch (2000-01-01): a key with more digits names the row PostgreSQL stores and gives back, as a
    ``numeric(10, 2)`` key is rounded to its scale.  Before, ``tx.read`` by the key written returned None, and
    ``insert`` of it failed the commit with ``DuplicateKey``."""
    with db.engine.begin() as connection:
        connection.execute(sa.text("CREATE TABLE rounded_stamps (at timestamptz(0) PRIMARY KEY, uses integer)"))
    utc = datetime.timezone.utc
    given = {datetime.datetime(2026, 1, 1, 0, 0, 0, 600000, tzinfo=utc): datetime.datetime(2026, 1, 1, 0, 0, 1, tzinfo=utc),
             datetime.datetime(2026, 1, 2, 0, 0, 0, 500000, tzinfo=utc): datetime.datetime(2026, 1, 2, 0, 0, 1, tzinfo=utc),
             datetime.datetime(1999, 12, 31, 23, 59, 59, 500000, tzinfo=utc):
                 datetime.datetime(1999, 12, 31, 23, 59, 59, tzinfo=utc),
             datetime.datetime(2026, 1, 3, 5, 30, 0, 400000, tzinfo=datetime.timezone(datetime.timedelta(hours=5))):
                 datetime.datetime(2026, 1, 3, 0, 30, tzinfo=utc)}
    for number, key in enumerate(given):
        db.run(lambda tx: tx.write("rounded_stamps", key, uses=number))
    with db.engine.connect() as connection:
        assert set(connection.execute(sa.text("SELECT at FROM rounded_stamps")).scalars()) == set(given.values())
    with db.transaction() as tx:
        for number, (key, stored) in enumerate(given.items()):
            assert tx.read("rounded_stamps", key) == {"at": stored, "uses": number}, key
            with pytest.raises(activedb.DuplicateKey):
                tx.insert("rounded_stamps", at=key, uses=9)


def test_a_float_column_refuses_at_the_write_a_number_beyond_its_range(db):
    """A ``double precision`` column holds no integer or decimal beyond a double's range (``10**400``), and a
    ``real`` none beyond a float4's (``1e39``) nor one so close to 0 that it would be stored as 0 (``1e-50``):
    PostgreSQL refuses them ("out of range"), so the write does, with ``InvalidValue`` naming the column.  Before,
    they passed (any ``int``, ``float`` or ``Decimal`` did) and the commit failed with ``DatabaseError``, the whole
    tree with it.  What PostgreSQL takes still passes: the largest double, infinities, NaN, a real's subnormals."""
    with db.engine.begin() as connection:
        connection.execute(sa.text("CREATE TABLE float_ranges (id integer PRIMARY KEY, wide double precision, "
                                   "single real)"))
    refused = [("wide", 10**400), ("wide", -2**1100), ("wide", decimal.Decimal("1e400")),
               ("wide", decimal.Decimal("1e-400")), ("single", 1e39), ("single", -1e39), ("single", 10**40),
               ("single", 1e-50), ("single", decimal.Decimal("1e39"))]
    taken = [(1.7976931348623157e308, 3.4e38), (float("inf"), float("-inf")), (10**300, 1e-40), (-5, 2**100),
             (decimal.Decimal("1e300"), decimal.Decimal("-1.5"))]
    with db.transaction() as tx:
        for column, value in refused:
            with pytest.raises(activedb.InvalidValue, match=rf"float_ranges\.{column} .*outside the range|too close"):
                tx.write("float_ranges", 1, **{column: value})
        for number, (wide, single) in enumerate(taken):
            tx.write("float_ranges", number, wide=wide, single=single)
        tx.write("float_ranges", 99, wide=float("nan"), single=float("nan"))
    with db.engine.connect() as connection:
        assert connection.execute(sa.text("SELECT count(*) FROM float_ranges")).scalar() == len(taken) + 1


def test_a_table_keyed_by_an_array_or_json_column_is_refused_naming_the_column(db):
    """A primary key with an ``array``, ``json`` or ``jsonb`` column cannot name its rows in activedb: its values
    (lists, dicts) are no keys of the write sets, locks and row images, and PostgreSQL gives an array back as a list
    whatever was given.  A transaction's first use of such a table raises ``InvalidKey`` naming the table and the
    column and saying to key it by a surrogate column.  Before, a write of a list or dict key raised a bare
    ``TypeError: unhashable type`` from the lock manager, and a tuple written to an ``integer[]`` key was committed
    but never found by a read (the key came back as a list)."""
    with db.engine.begin() as connection:
        connection.execute(sa.text("CREATE TABLE array_keys (tags integer[] PRIMARY KEY, uses integer)"))
        connection.execute(sa.text("CREATE TABLE jsonb_keys (doc jsonb PRIMARY KEY, uses integer)"))
        connection.execute(sa.text("CREATE TABLE part_array_keys (id integer, tags text[], uses integer, "
                                   "PRIMARY KEY (id, tags))"))
        connection.execute(sa.text("INSERT INTO array_keys VALUES ('{1,2}', 1)"))
    uses = [("array_keys", "tags", "integer", lambda tx: tx.write("array_keys", (1, 2), uses=2)),
            ("array_keys", "tags", "integer", lambda tx: tx.read("array_keys", [1, 2])),
            ("array_keys", "tags", "integer", lambda tx: tx.scan("array_keys", {"uses": 1})),
            ("jsonb_keys", "doc", "jsonb", lambda tx: tx.write("jsonb_keys", {"a": 1}, uses=1)),
            ("jsonb_keys", "doc", "jsonb", lambda tx: tx.insert("jsonb_keys", doc=[1], uses=1)),
            ("part_array_keys", "tags", "text", lambda tx: tx.write("part_array_keys", (1, ("x",)), uses=1))]
    for table, column, kind, use in uses:
        with pytest.raises(activedb.InvalidKey, match=rf"table {table!r}.* column {column!r} \({kind}.*"
                                                      rf"not supported.*surrogate key"):
            with db.transaction() as tx:
                use(tx)
    with db.engine.connect() as connection:
        assert connection.execute(sa.text("SELECT tags, uses FROM array_keys")).all() == [([1, 2], 1)]
        assert connection.execute(sa.text("SELECT count(*) FROM jsonb_keys")).scalar() == 0


def test_a_nan_key_is_refused_at_the_read_and_the_write(db):
    """NaN equals nothing in Python, itself included, so a NaN key (a ``float`` of a float or ``numeric`` key column,
    a ``Decimal('NaN')``) names no row a read could find: the write of such a key is refused with ``InvalidKey``
    saying so, as are a read, an insert and a key of several columns holding one — and nothing is written.  Before,
    ``tx.write('nan_doubles', nan, ...)`` committed a row that no read by the key could find (a dict lookup by
    NaN)."""
    with db.engine.begin() as connection:
        connection.execute(sa.text("CREATE TABLE nan_doubles (k double precision PRIMARY KEY, uses integer)"))
        connection.execute(sa.text("CREATE TABLE nan_reals (k real PRIMARY KEY, uses integer)"))
        connection.execute(sa.text("CREATE TABLE nan_numerics (k numeric PRIMARY KEY, uses integer)"))
        connection.execute(sa.text("CREATE TABLE nan_pairs (id integer, k double precision, uses integer, "
                                   "PRIMARY KEY (id, k))"))
    nan = float("nan")
    uses = [lambda tx: tx.write("nan_doubles", nan, uses=1), lambda tx: tx.read("nan_doubles", nan),
            lambda tx: tx.insert("nan_doubles", k=nan, uses=1), lambda tx: tx.read_many("nan_doubles", [1.5, nan]),
            lambda tx: tx.write("nan_reals", nan, uses=1),
            lambda tx: tx.write("nan_numerics", nan, uses=1),
            lambda tx: tx.write("nan_numerics", decimal.Decimal("NaN"), uses=1),
            lambda tx: tx.read("nan_numerics", decimal.Decimal("NaN")),
            lambda tx: tx.write("nan_pairs", (1, nan), uses=1), lambda tx: tx.delete("nan_pairs", [1, nan])]
    for use in uses:
        with pytest.raises(activedb.InvalidKey, match=r"\.k is NaN.*no row"):
            with db.transaction() as tx:
                use(tx)
    with db.engine.connect() as connection:
        for table in ("nan_doubles", "nan_reals", "nan_numerics", "nan_pairs"):
            assert connection.execute(sa.text(f"SELECT count(*) FROM {table}")).scalar() == 0, table
    db.run(lambda tx: tx.write("nan_doubles", float("inf"), uses=1))      # (infinity equals itself: a key as any)
    with db.transaction() as tx:
        assert tx.read("nan_doubles", float("inf")) == {"k": float("inf"), "uses": 1}


def test_a_column_added_after_the_table_was_read_is_unknown_saying_to_refresh_the_schema(db):
    """A process reflects a table once; a column another process (its migration) adds afterwards is unknown here
    until ``db.schema.refresh()``.  ``UnknownColumn`` says so, and after the refresh the write goes through.  Before,
    the message listed the columns read earlier and nothing else, as if the column did not exist."""
    with db.engine.begin() as connection:
        connection.execute(sa.text("CREATE TABLE grown_later (id integer PRIMARY KEY, uses integer)"))
    db.run(lambda tx: tx.write("grown_later", 1, uses=1))
    with db.engine.begin() as connection:
        connection.execute(sa.text("ALTER TABLE grown_later ADD COLUMN note text"))
    with pytest.raises(activedb.UnknownColumn, match=r"no column 'note'; its columns are id, uses.*added since this "
                                                     r"process read the table.*db\.schema\.refresh\(\)"):
        db.run(lambda tx: tx.write("grown_later", 1, note="x"))
    db.schema.refresh()
    db.run(lambda tx: tx.write("grown_later", 1, note="x"))
    with db.transaction() as tx:
        assert tx.read("grown_later", 1) == {"id": 1, "uses": 1, "note": "x"}


def test_a_real_key_names_its_row_as_postgresql_stores_it_in_single_precision(db):
    """A ``real`` key is stored in single precision and printed as the fewest digits that read back as it (``0.1``),
    while the driver sends a ``float`` as ``double precision``, and PostgreSQL compares the two by widening the
    ``real`` (``0.10000000149011612``): a key names the row PostgreSQL gives back, and every statement compares it as
    a ``real`` — reads (one key of one column, a key of several), a scan's equality, a read for update, a delete
    and an update of the row alone, ``insert``'s existence check; a key that rounds to the same ``real``
    (``0.1000000001``) names the same row.  Before, the composite read, the near key's read and the scan found
    nothing, and a delete of the one row deleted nothing."""
    with db.engine.begin() as connection:
        connection.execute(sa.text("CREATE TABLE real_keys (k real PRIMARY KEY, uses integer)"))
        connection.execute(sa.text("CREATE TABLE real_pairs (a integer, k real, uses integer, PRIMARY KEY (a, k))"))
    db.run(lambda tx: (tx.write("real_keys", 0.1, uses=1), tx.write("real_keys", 0.3, uses=1),
                       tx.write("real_pairs", (1, 0.1), uses=1)))
    db.run(lambda tx: tx.write("real_keys", 0.1000000001, uses=2))
    with db.transaction() as tx:
        assert tx.read("real_keys", 0.1) == {"k": 0.1, "uses": 2}
        assert tx.read("real_keys", 0.1000000001) == {"k": 0.1, "uses": 2}
        assert tx.read_many("real_keys", [0.1000000001]) == {0.1000000001: {"k": 0.1, "uses": 2}}
        assert tx.read("real_pairs", (1, 0.1)) == {"a": 1, "k": 0.1, "uses": 1}
        assert tx.scan("real_keys", {"k": 0.1}) == [{"k": 0.1, "uses": 2}]
        with pytest.raises(activedb.DuplicateKey):
            tx.insert("real_keys", k=0.1000000001, uses=9)
    with db.transaction() as tx:
        assert tx.read("real_keys", 0.3, for_update=True) == {"k": 0.3, "uses": 1}
        tx.delete("real_keys", 0.3)
    db.run(lambda tx: tx.delete("real_pairs", (1, 0.1000000001)))
    with db.engine.connect() as connection:
        assert connection.execute(sa.text("SELECT k, uses FROM real_keys")).all() == [(0.1, 2)]
        assert connection.execute(sa.text("SELECT count(*) FROM real_pairs")).scalar() == 0


def test_a_real_value_is_normalised_to_what_postgresql_gives_back(db):
    """``TableInfo.normalised`` of a ``real`` column is the value PostgreSQL gives back for each of many floats of
    every magnitude a ``real`` holds, ints and decimals (the driver reads the ``real``'s printed digits)."""
    import random
    rng = random.Random(7)
    given = [rng.uniform(-1, 1) * 10.0 ** rng.randint(-37, 38) for _ in range(20000)]
    given += [0.1, 1 / 3, 2 / 3, 16777217, 3.4028234e38, 1.17549435e-38, 1e-40, 1.5e-45, -0.0, 123456789, decimal.Decimal("0.1")]
    with db.engine.begin() as connection:
        connection.execute(sa.text("CREATE TABLE real_values (k real PRIMARY KEY)"))
        stored = connection.execute(sa.text("SELECT CAST(CAST(x AS double precision) AS real) FROM unnest("
                                            "CAST(:given AS text[])) AS x"), {"given": [str(v) for v in given]}).scalars().all()
    info = db.catalog.table_info("real_values")
    assert [info.normalised("k", value) for value in given] == stored


def test_a_time_or_interval_key_of_a_precision_names_the_row_postgresql_rounds_it_to(db):
    """A ``time(p)`` / ``timetz(p)`` / ``interval(p)`` column keeps ``p`` fractional digits of its seconds, rounding
    half away from zero (an interval: its time of day part, the days apart, as the driver sends it): a key with more
    digits names the row PostgreSQL stores and gives back, as a ``timestamp(p)`` key does.  Before, ``tx.read`` by
    the key written returned None, ``insert`` of it failed the commit with ``DuplicateKey``, and two writes in one
    transaction by the key given and the key stored were two entries for one row, which failed the commit."""
    with db.engine.begin() as connection:
        connection.execute(sa.text("CREATE TABLE rounded_times (at time(0) PRIMARY KEY, uses integer)"))
        connection.execute(sa.text("CREATE TABLE rounded_zoned_times (at timetz(1) PRIMARY KEY, uses integer)"))
        connection.execute(sa.text("CREATE TABLE rounded_spans (span interval(0) PRIMARY KEY, uses integer)"))
    zone = datetime.timezone(datetime.timedelta(hours=2))
    given = {"rounded_times": {datetime.time(12, 0, 0, 400000): datetime.time(12),
                               datetime.time(12, 0, 1, 500000): datetime.time(12, 0, 2)},
             "rounded_zoned_times": {datetime.time(8, 0, 0, 450000, tzinfo=zone): datetime.time(8, 0, 0, 500000, tzinfo=zone),
                                     datetime.time(9, 0, 0, 960000, tzinfo=zone): datetime.time(9, 0, 1, tzinfo=zone)},
             "rounded_spans": {datetime.timedelta(seconds=5, microseconds=500000): datetime.timedelta(seconds=6),
                               datetime.timedelta(days=2, microseconds=400000): datetime.timedelta(days=2),
                               datetime.timedelta(microseconds=-400000): datetime.timedelta(0)}}
    column = {"rounded_times": "at", "rounded_zoned_times": "at", "rounded_spans": "span"}
    for table, keys in given.items():
        for number, key in enumerate(keys):
            db.run(lambda tx: tx.write(table, key, uses=number))
        with db.engine.connect() as connection:
            assert set(connection.execute(sa.text(f"SELECT {column[table]} FROM {table}")).scalars()) == set(
                keys.values()), table
    with db.transaction() as tx:
        for table, keys in given.items():
            for number, (key, stored) in enumerate(keys.items()):
                assert tx.read(table, key) == {column[table]: stored, "uses": number}, key
                with pytest.raises(activedb.DuplicateKey):
                    tx.insert(table, **{column[table]: key, "uses": 9})
    with db.transaction() as tx:
        tx.write("rounded_times", datetime.time(12, 0, 0, 400000), uses=7)
        tx.write("rounded_times", datetime.time(12), uses=8)
    with db.engine.connect() as connection:
        assert connection.execute(sa.text("SELECT uses FROM rounded_times WHERE at = '12:00'")).scalar() == 8


def test_a_new_row_shows_a_constant_date_timestamp_time_or_array_default_as_the_stored_row_holds_it(db):
    """``TableInfo.blank_row`` of a ``date``, ``timestamp``, ``timestamptz``, ``time`` and array column with a
    constant default is the value PostgreSQL stores and gives back (the row a transaction reads after its own insert
    and its insert event's ``new`` is the stored row).  Before, each was None until the row was read back from
    PostgreSQL after the commit."""
    with db.engine.begin() as connection:
        connection.execute(sa.text(
            "CREATE TABLE dated_defaults (id integer PRIMARY KEY, day date DEFAULT '2026-03-04', "
            "at timestamp DEFAULT '2026-03-04 05:06:07.89', at0 timestamp(0) DEFAULT '2026-03-04 05:06:07', "
            "zoned timestamptz DEFAULT '2026-03-04 05:06:07+02', clock time DEFAULT '05:06:07.5', "
            "counts integer[] DEFAULT '{1,-2,NULL}', empty integer[] NOT NULL DEFAULT '{}', "
            "built integer[] DEFAULT ARRAY[3, 4], "
            r"""tags text[] DEFAULT '{a,"b c","q\"x",NULL,"NULL"}', """
            "grid smallint[][] DEFAULT '{{1,2},{3,4}}', prices numeric[] DEFAULT '{0.10,2}', "
            "flags boolean[] DEFAULT '{t,f}', days date[] DEFAULT '{2026-01-02}', code char(3) DEFAULT 'x', "
            "ratio real DEFAULT 0.1000000001, stamps timestamp[] DEFAULT '{\"2026-01-02 03:04:05\"}')"))
    fresh, stored = _inserted_and_stored(db, "dated_defaults")
    assert stored["day"] == datetime.date(2026, 3, 4) and stored["tags"] == ["a", "b c", 'q"x', None, "NULL"]
    assert None not in (stored[name] for name in stored)
    assert fresh == stored
    assert {name: type(value) for name, value in fresh.items()} == {
        name: type(value) for name, value in stored.items()}


def test_a_value_of_a_real_or_a_time_of_a_precision_shows_as_postgresql_stores_it(db):
    """A non-key ``real``, ``time(p)``, ``timetz(p)``, ``timestamp(p)``, ``timestamptz(p)`` or ``interval(p)`` value
    written with more precision than the column keeps shows as PostgreSQL stores it — rounded, as such a key is — in
    ``tx.read`` after ``tx.write``/``tx.insert`` in the same tree, in ``write_many``'s, and in the row image a rule's
    data event carries, before and after the commit alike.  Before, the image was the value as given (``0.1000000001``,
    ``12:00:00.4``) until the row was read back from PostgreSQL."""
    with db.engine.begin() as connection:
        connection.execute(sa.text(
            "CREATE TABLE precise_values (k integer PRIMARY KEY, r real, t time(0), tz timetz(1), ts timestamp(0), "
            "tstz timestamptz(2), span interval(0))"))
    zone = datetime.timezone(datetime.timedelta(hours=2))
    given = {"r": 0.1000000001, "t": datetime.time(12, 0, 0, 600000),
             "tz": datetime.time(8, 0, 0, 450000, tzinfo=zone),
             "ts": datetime.datetime(2026, 3, 4, 5, 6, 7, 500000),
             "tstz": datetime.datetime(2026, 3, 4, 5, 6, 7, 123456, tzinfo=datetime.timezone.utc),
             "span": datetime.timedelta(seconds=5, microseconds=500000)}
    seen = []
    db.rule(on=db.inserted("precise_values"), name="precise_inserts")(lambda tx, event: seen.append(dict(event.new)))
    db.rule(on=db.updated("precise_values"), name="precise_updates")(lambda tx, event: seen.append(dict(event.new)))
    try:
        with db.transaction() as tx:
            tx.insert("precise_values", k=1, **given)
            tx.write("precise_values", 2, **given)
            tx.write_many("precise_values", {3: given})
            shown = [tx.read("precise_values", key) for key in (1, 2, 3)]
    finally:
        db.rules.remove("precise_inserts")
        db.rules.remove("precise_updates")
    with db.engine.connect() as connection:
        stored = {row.k: dict(row._mapping) for row in connection.execute(sa.text("SELECT * FROM precise_values"))}
    assert stored[1]["r"] == 0.1 and stored[1]["t"] == datetime.time(12, 0, 1)       # (what PostgreSQL did)
    assert shown == [stored[1], stored[2], stored[3]]
    assert seen and all(image == stored[image["k"]] for image in seen), seen
    with db.transaction() as tx:
        assert tx.read("precise_values", 1) == stored[1]


def test_an_interval_with_fields_is_truncated_as_postgresql_stores_it_key_and_value(db):
    """An ``interval`` column with a field restriction keeps only those fields, PostgreSQL truncating the finer
    ones (``interval HOUR``: 01:59:59 is 01:00:00; ``interval YEAR TO MONTH``: a ``timedelta``, which has no months,
    is 0; ``interval DAY TO SECOND(0)`` rounds its seconds): a key names the row PostgreSQL stores, and a value shows
    as stored in the tree that wrote it."""
    with db.engine.begin() as connection:
        connection.execute(sa.text(
            "CREATE TABLE field_spans (span interval HOUR PRIMARY KEY, months interval YEAR TO MONTH, "
            "days interval DAY, minutes interval DAY TO MINUTE, seconds interval DAY TO SECOND(0))"))
    key = datetime.timedelta(days=1, hours=1, minutes=59, seconds=59)
    values = {"months": datetime.timedelta(days=40, seconds=5), "days": datetime.timedelta(days=2, hours=23),
              "minutes": datetime.timedelta(hours=3, minutes=4, seconds=59, microseconds=999999),
              "seconds": datetime.timedelta(seconds=1, microseconds=500000)}
    with db.transaction() as tx:
        tx.write("field_spans", key, **values)
        shown = tx.read("field_spans", key)
    with db.engine.connect() as connection:
        stored = dict(connection.execute(sa.text("SELECT * FROM field_spans")).one()._mapping)
    assert stored["span"] == datetime.timedelta(days=1, hours=1)                      # (what PostgreSQL did)
    assert shown == stored
    with db.transaction() as tx:
        assert tx.read("field_spans", key) == stored
        with pytest.raises(activedb.DuplicateKey):
            tx.insert("field_spans", span=key)


def _nested_list(levels: int, inner: object) -> object:
    """``inner`` inside ``levels`` levels of lists, built without recursion."""
    value = inner
    for _ in range(levels):
        value = [value]
    return value


def test_a_value_nested_far_deeper_than_the_stack_is_refused_naming_its_column_and_nothing_is_written(db):
    """A value nested 100,000 levels deep (or one level deeper than ``EXACT_DEPTH``) given for an array or a
    ``jsonb`` column — written, or compared with in a scan — is refused with ``NestedTooDeep`` naming the column,
    the bound and what to do, and nothing is written; a value nested within the bound is written and found (an
    array to PostgreSQL's six dimensions).  The array check's walks are bounded themselves: they refuse the value
    beyond their bound however high Python's recursion limit is.  Before, they recursed with the value's nesting
    and the check caught the ``RecursionError`` of a value deeper than the stack: a scan's array one level deeper
    than the bound passed the check (PostgreSQL refused it: ``DatabaseError``), and with a higher recursion limit the
    walks of a value 100,000 levels deep ran for a minute and let it pass."""
    from activedb.store import EXACT_DEPTH
    with db.engine.begin() as connection:
        connection.execute(sa.text("CREATE TABLE deep_values (id integer PRIMARY KEY, grid integer[], doc jsonb)"))

    def refused(column: str, levels: int) -> Any:
        return pytest.raises(activedb.NestedTooDeep, match=(
            rf"'{column}' is a list nested {levels:,} levels deep, deeper than the {EXACT_DEPTH} levels a value may "
            rf"nest; flatten it or store it as JSON text"))

    for column, levels in (("grid", EXACT_DEPTH + 1), ("grid", 100_000), ("doc", EXACT_DEPTH + 1), ("doc", 100_000)):
        with db.transaction() as tx:
            with refused(column, levels):
                tx.scan("deep_values", {column: _nested_list(levels, 1)})
            with refused(column, levels):
                tx.write("deep_values", 1, **{column: _nested_list(levels, 1)})
            tx.write("deep_values", 2, doc=_nested_list(EXACT_DEPTH, 1), grid=_nested_list(6, 7))
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(1_000_000)       # (the bound refuses the value, not the interpreter's stack)
    try:
        with db.transaction() as tx:
            with refused("grid", 100_000):
                tx.scan("deep_values", {"grid": _nested_list(100_000, 1)})
            with refused("grid", 100_000):
                tx.write("deep_values", 1, grid=_nested_list(100_000, 1))
    finally:
        sys.setrecursionlimit(limit)
    with db.engine.connect() as connection:
        assert connection.execute(sa.text("SELECT id FROM deep_values")).scalars().all() == [2]
    with db.transaction() as tx:
        stored = {"id": 2, "doc": _nested_list(EXACT_DEPTH, 1), "grid": _nested_list(6, 7)}
        assert tx.read("deep_values", 2) == stored
        assert tx.scan("deep_values", {"grid": _nested_list(6, 7)}) == [stored]
        assert tx.scan("deep_values", {"doc": _nested_list(EXACT_DEPTH, 1)}) == [stored]


@pytest.mark.parametrize("dimensions", [7, 8, 200])
def test_an_array_of_more_dimensions_than_postgresql_s_six_is_refused_naming_its_column_and_nothing_is_written(
        db, dimensions):
    """An array column's value of more than six dimensions (PostgreSQL's most) — written, or compared with in a scan —
    is refused with ``InvalidValue`` naming the column, the limit and what to do, and nothing is written; six still
    work.  Before, a value of 7 to ``EXACT_DEPTH`` dimensions passed the check (its nesting within the bound, its shape
    rectangular) and PostgreSQL refused it: the scan, or the commit of the whole tree, failed with ``DatabaseError``
    (SQLSTATE 54000, "number of array dimensions (7) exceeds the maximum allowed (6)")."""
    with db.engine.begin() as connection:
        connection.execute(sa.text(f"CREATE TABLE dimensioned_{dimensions} (id integer PRIMARY KEY, grid integer[])"))
    table = f"dimensioned_{dimensions}"
    message = (rf"column {table}\.grid \([^)]*\): the array has {dimensions} dimensions, more than the 6 "
               rf"PostgreSQL takes; .*jsonb")
    with db.transaction() as tx:
        with pytest.raises(activedb.InvalidValue, match=message):
            tx.scan(table, {"grid": _nested_list(dimensions, 1)})
        with pytest.raises(activedb.InvalidValue, match=message):
            tx.write(table, 1, grid=_nested_list(dimensions, 1))
        with pytest.raises(activedb.InvalidValue, match=message):
            tx.write_many(table, {3: {"grid": _nested_list(dimensions, 1)}})
        tx.write(table, 2, grid=_nested_list(6, 7))
    with db.transaction() as tx:
        stored = {"id": 2, "grid": _nested_list(6, 7)}
        assert tx.scan(table, {"grid": _nested_list(6, 7)}) == [stored]
        assert tx.scan(table, {}) == [stored]


def test_a_value_refused_in_a_scan_says_the_scan_was_not_run_and_one_refused_in_a_write_that_nothing_was_written(db):
    """A value check's refusal names the operation it stopped: a scan's filter value says the scan was not run (a scan
    writes nothing, so "nothing was written" misled), a written value that nothing was written.  Before, every such
    refusal ended "; nothing was written", a scan's too."""
    with db.engine.begin() as connection:
        connection.execute(sa.text("CREATE TABLE scanned_refusals (id integer PRIMARY KEY, grid integer[], "
                                   "amount smallint)"))
    with db.transaction() as tx:
        for where in ({"grid": _nested_list(7, 1)}, {"amount": 2**20}):
            with pytest.raises(activedb.InvalidValue, match=r"; the scan was not run$") as refused:
                tx.scan("scanned_refusals", where)
            assert "nothing was written" not in str(refused.value)
        with pytest.raises(activedb.InvalidValue, match=r"; nothing was written$") as refused:
            tx.write("scanned_refusals", 1, grid=_nested_list(7, 1))
        assert "scan was not run" not in str(refused.value)
        with pytest.raises(activedb.InvalidValue, match=r"; nothing was written$"):
            tx.write("scanned_refusals", 1, amount=2**20)
        assert tx.scan("scanned_refusals", {"amount": 1}) == []


def test_a_key_refused_in_a_read_says_nothing_was_read_and_one_refused_in_a_write_that_nothing_was_written(db):
    """A key the column check refuses in a read (``tx.read``, for update too, a savepoint's, ``read_many``,
    ``prefetch``, a stream's Read on the store or on a batch's overlay) says the row was not read: a read writes
    nothing, so "nothing was written" misled; the same key written still says nothing was written.  Before,
    ``TableInfo.key``, shared by reads and writes, checked every key as a value to write."""
    with db.engine.begin() as connection:
        connection.execute(sa.text("CREATE TABLE probe_keys (id smallint PRIMARY KEY, n integer)"))

    def savepoint_read(tx):
        with tx.subtransaction() as savepoint:
            assert type(savepoint).__name__ == "Savepoint"      # (the lean run's read, not a frame's)
            savepoint.read("probe_keys", 2**20)

    reads = {"read": lambda tx: tx.read("probe_keys", 2**20),
             "read for update": lambda tx: tx.read("probe_keys", 2**20, for_update=True),
             "a savepoint's read": savepoint_read,
             "read_many": lambda tx: tx.read_many("probe_keys", [1, 2**20]),
             "prefetch": lambda tx: tx.prefetch("probe_keys", [1, 2**20]),
             "a stream's Read": lambda tx: StoreView(tx, Stamp("u", "S0", None, 0, 0)).read("probe_keys", 2**20),
             "a Read on an overlay": lambda tx: Overlay(tx).view(Stamp("u", "S0", None, 0, 0)).read("probe_keys",
                                                                                                   2**20)}
    with db.transaction() as tx:
        for how, read in reads.items():
            with pytest.raises(activedb.InvalidValue, match=r"1048576 is outside the column's range .*; nothing was "
                                                            r"read$") as refused:
                read(tx)
            assert "nothing was written" not in str(refused.value), how
        with pytest.raises(activedb.InvalidValue, match=r"1048576 is outside .*; nothing was written$") as refused:
            tx.write("probe_keys", 2**20, n=1)
        assert "nothing was read" not in str(refused.value)


def _refusing_table(db, operation: str) -> str:
    """A table of a text key and a NOT NULL integer, one per test (``refusing_<operation>``)."""
    table = f"refusing_{operation}"
    with db.engine.begin() as connection:
        connection.execute(sa.text(f"CREATE TABLE {table} (name text PRIMARY KEY, n integer NOT NULL)"))
    return table


def test_a_key_refused_for_its_type_in_a_read_says_nothing_was_read(db):
    """Every refusal of a key in a read ends the way a range refusal does, "; nothing was read" — its type, its
    number of columns alike (``Checked.READ``).  Before, only a
    refusal by the column's check said what was not done: ``tx.read("workerstatus", 5)`` of a TEXT key said "column
    workerstatus.workerid is TEXT; got 5 (int)" and no more."""
    refusing_table = _refusing_table(db, "read")
    with db.transaction() as tx:
        with pytest.raises(activedb.InvalidValue, match=r"^column refusing_\w+\.name is TEXT; got 5 \(int\); "
                                                        r"nothing was read$"):
            tx.read(refusing_table, 5)
        reads = {"a key's type": lambda: tx.read(refusing_table, 5),
                 "a key's columns": lambda: tx.read(refusing_table, ("a", "b")),
                 "a list key": lambda: tx.read(refusing_table, [5]),
                 "for update": lambda: tx.read(refusing_table, 5, for_update=True),
                 "read_many's key": lambda: tx.read_many(refusing_table, ["a", 5]),
                 "read_many's columns": lambda: tx.read_many(refusing_table, ["a", ("a", "b")]),
                 # (unhashable keys: before, a bare TypeError "unhashable type" from read_many's mapping)
                 "read_many's list key": lambda: tx.read_many(refusing_table, ["a", [5]]),
                 "read_many's dict key": lambda: tx.read_many(refusing_table, ["a", {"name": "a"}]),
                 "prefetch's list key": lambda: tx.prefetch(refusing_table, ["a", [5]]),
                 "prefetch": lambda: tx.prefetch(refusing_table, ["a", 5])}
        for how, read in reads.items():
            with pytest.raises(activedb.SchemaError, match=r"; nothing was read$") as refused:
                read()
            assert "nothing was written" not in str(refused.value), how


def test_a_key_or_value_refused_for_its_type_in_a_write_says_nothing_was_written(db):
    """Every refusal of a written key or value ends "; nothing was written" (``Checked.WRITE``): a key or a value of
    the wrong type, a key of the wrong number of columns, None for a NOT NULL column, a column the table has not.
    Before, only a refusal by the column's check (a range, a precision) said so."""
    refusing_table = _refusing_table(db, "write")
    with db.transaction() as tx:
        with pytest.raises(activedb.InvalidValue, match=r"^column refusing_\w+\.name is TEXT; got 5 \(int\); "
                                                        r"nothing was written$"):
            tx.write(refusing_table, 5, n=1)
        writes = {"a key's type": lambda: tx.write(refusing_table, 5, n=1),
                  "a key's columns": lambda: tx.write(refusing_table, ("a", "b"), n=1),
                  "a value's type": lambda: tx.write(refusing_table, "a", n="one"),
                  "a NOT NULL value": lambda: tx.write(refusing_table, "a", n=None),
                  "a column": lambda: tx.write(refusing_table, "a", n=1, missing=2),
                  "an insert's value": lambda: tx.insert(refusing_table, name="a", n="one"),
                  "write_many's value": lambda: tx.write_many(refusing_table, {"a": {"n": "one"}}),
                  # (two refusals of the key that no column check makes: before, they ended without saying so)
                  "an insert without its key": lambda: tx.insert(refusing_table, n=1),
                  "a write changing its key": lambda: tx.write(refusing_table, "a", name="b", n=1)}
        for how, write in writes.items():
            with pytest.raises(activedb.SchemaError, match=r"; nothing was written$") as refused:
                write()
            assert "nothing was read" not in str(refused.value), how
        assert tx.scan(refusing_table, {}) == []


def test_a_filter_value_refused_for_its_type_in_a_scan_says_the_scan_was_not_run(db):
    """Every refusal of a scan's filter value ends "; the scan was not run" (``Checked.SCAN``): its type, a column
    the table has not.  Before, only a refusal by the column's check said so."""
    refusing_table = _refusing_table(db, "scan")
    with db.transaction() as tx:
        with pytest.raises(activedb.InvalidValue, match=r"^column refusing_\w+\.n is INTEGER; got 'one' \(str\); "
                                                        r"the scan was not run$"):
            tx.scan(refusing_table, {"n": "one"})
        for where in ({"name": 5}, {"n": "one"}, {"missing": 1}):
            with pytest.raises(activedb.SchemaError, match=r"; the scan was not run$") as refused:
                tx.scan(refusing_table, where)
            assert "nothing was" not in str(refused.value), where
