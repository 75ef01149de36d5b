"""The flush's statements go to psycopg directly (``activedb.store.apply_write_set``): every common column
type reaches PostgreSQL as SQLAlchemy would have sent it, whether a group of rows travels as one ``unnest``
statement (arrays per column) or row by row (one row, or a column that cannot be an array), and what
PostgreSQL refuses is reported as before.  Real PostgreSQL; the capture tests' ``typed_samples`` table
(one column per common type)."""

from __future__ import annotations

import datetime as dt
import decimal
import json
import uuid

import pytest
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
import sqlalchemy.dialects.postgresql.psycopg  # noqa: F401  (the dialect the store runs on)

from activedb.errors import DatabaseError, DuplicateKey
from activedb.store import Entry, EntryKind, TableInfo, apply_write_set, fetch_rows, lock_row
from tests.store.conftest import typed_samples_tables

UTC = dt.timezone.utc
PLUS_5 = dt.timezone(dt.timedelta(hours=5, minutes=30))


db_options = pytest.fixture(scope="module", name="db_options")(typed_samples_tables)


def sample(number: int) -> dict:
    return {
        "small": -32768 + number, "big": 9223372036854775807 - number,
        "exact": decimal.Decimal("12345678901234.123456") + number, "real": 0.1 + number, "flag": number % 2 == 0,
        "label": f"text 'quoted' \" {{braces}}, é \\ {number}",
        "at": dt.datetime(2024, 2, 29, 23, 59, 59, 123456, tzinfo=PLUS_5) + dt.timedelta(days=number),
        "naive": dt.datetime(2024, 1, 1) + dt.timedelta(seconds=number), "day": dt.date(2000, 1, 1) + dt.timedelta(days=number),
        "clock": dt.time(12, 34, 56, 500000), "span": dt.timedelta(days=1, hours=2, minutes=3, seconds=number),
        "doc": {"a": [1, 2.5, None], "b": {"c": "d", "n": number}, "quote": "\"{,}\""},
        "uid": uuid.UUID(int=number), "blob": b"\x00\xff\x10" + bytes([number]), "tags": ["x", None, f"z{number}"],
    }


def stored(db) -> dict[int, dict]:
    with db.engine.connect() as connection:
        return {row["id"]: {name: value for name, value in row.items() if name != "id"}
                for row in connection.execute(sa.text("SELECT * FROM typed_samples")).mappings()}


#: Columns that travel as arrays in one ``unnest`` statement; ``clock``, ``span`` (types the store does not
#: check) and ``tags`` (an array) make a group go row by row.
ARRAYABLE = ("small", "big", "exact", "real", "flag", "label", "at", "naive", "day", "doc", "uid", "blob")


class Statements:
    """The SQL the flush sends (SQLAlchemy's cursor event)."""

    def __init__(self, db):
        self.sent: list[str] = []
        self.engine = db.engine

    def __enter__(self):
        sa.event.listen(self.engine, "before_cursor_execute", self.remember)
        return self

    def __exit__(self, *exc):
        sa.event.remove(self.engine, "before_cursor_execute", self.remember)

    def remember(self, connection, cursor, statement, parameters, context, executemany):
        if "typed_samples" in statement:
            self.sent.append(statement)


@pytest.mark.parametrize("columns", ["arrayable", "all"])
@pytest.mark.parametrize("count", [1, 3, 200])
def test_every_common_type_is_stored_as_given_alone_and_in_groups(samples, count, columns):
    db = samples
    expected = {number: sample(number) for number in range(count)}
    if columns == "arrayable":
        expected = {number: {name: values[name] if name in ARRAYABLE else None for name in values}
                    for number, values in expected.items()}
    with Statements(db) as statements:
        with db.transaction() as tx:
            for number, values in expected.items():
                tx.insert("typed_samples", id=number, **{name: value for name, value in values.items()
                                                         if value is not None})
    assert stored(db) == expected
    assert ("unnest" in statements.sent[-1]) is (count > 1 and columns == "arrayable"), statements.sent
    with db.transaction() as tx:                      # upserts of two column sets
        for number in expected:
            tx.write("typed_samples", number, label=f"again {number}", doc=[number, "list"])
    with db.transaction() as tx:
        for number in expected:
            tx.write("typed_samples", number, small=number, doc=None)
    for number, values in expected.items():
        values.update(label=f"again {number}", doc=None, small=number)
    assert stored(db) == expected
    with db.transaction() as tx:
        for number in expected:
            if number % 2 == 0:
                tx.delete("typed_samples", number)
    assert stored(db) == {number: values for number, values in expected.items() if number % 2}


def test_mixed_python_types_in_one_column_are_stored_row_by_row(samples):
    db = samples
    values = [decimal.Decimal("1.5"), 2, 3.25, None]
    moments = [dt.datetime(2024, 1, 1, tzinfo=UTC), dt.datetime(2024, 1, 2, tzinfo=PLUS_5)]
    uids = [uuid.UUID(int=7), "00000000-0000-0000-0000-000000000008"]
    with db.transaction() as tx:
        for number, value in enumerate(values):
            tx.insert("typed_samples", id=number, exact=value, at=moments[number % 2], uid=uids[number % 2])
    rows = stored(db)
    assert [rows[number]["exact"] for number in range(4)] == [decimal.Decimal("1.5"), 2, decimal.Decimal("3.25"), None]
    assert [rows[number]["at"] for number in range(2)] == moments
    assert [rows[number]["uid"] for number in range(2)] == [uuid.UUID(int=7), uuid.UUID(int=8)]


@pytest.mark.parametrize("count", [1, 5])
def test_a_duplicate_key_at_the_flush_is_reported_as_before_and_nothing_is_written(samples, count):
    db = samples
    with db.transaction() as tx:
        tx.insert("typed_samples", id=0, label="first")
    info = db.catalog.table_info("typed_samples")
    writes = {("typed_samples", (number,)): Entry(EntryKind.INSERT, {"id": number, "label": "second"})
              for number in range(count)}
    with pytest.raises(DuplicateKey, match=r"typed_samples.*Key \(id\)=\(0\) already exists.*use write\(\)"):
        with db.engine.begin() as connection:
            apply_write_set(connection, {"typed_samples": info}, writes)
    assert stored(db)[0]["label"] == "first" and len(stored(db)) == 1


@pytest.mark.parametrize("count", [1, 5])
def test_an_insert_refused_by_a_unique_constraint_that_is_no_primary_key_is_the_constraints_refusal(db, count):
    """A UNIQUE constraint on other columns than the key refuses an insert as PostgreSQL refuses any constraint, a
    ``DatabaseError`` naming the constraint (activedb's README) — not ``DuplicateKey``, whose "a row with the same
    primary key" and "use write() to upsert" are wrong there (a write is refused alike)."""
    with db.engine.begin() as connection:
        connection.execute(sa.text("CREATE TABLE badges (id integer PRIMARY KEY, code text UNIQUE)"))
    try:
        with db.transaction() as tx:
            tx.insert("badges", id=0, code="taken")
        for refused in (lambda tx: [tx.insert("badges", id=number + 1, code="taken" if number == count - 1 else None)
                                    for number in range(count)],
                        lambda tx: tx.write("badges", count + 1, code="taken")):
            with pytest.raises(DatabaseError, match=r"SQLSTATE 23505.*badges_code_key.*nothing was written") as raised:
                with db.transaction() as tx:
                    refused(tx)
            assert not isinstance(raised.value, DuplicateKey) and raised.value.sqlstate == "23505"
        with pytest.raises(DuplicateKey, match=r"same primary key"):       # the key itself: as before
            with db.transaction() as tx:
                tx.insert("badges", id=9, code="mine")                     # absent now, inserted meanwhile
                with db.engine.begin() as connection:
                    connection.execute(sa.text("INSERT INTO badges (id, code) VALUES (9, 'theirs')"))
        with db.engine.connect() as connection:
            assert connection.execute(sa.text("SELECT id, code FROM badges ORDER BY id")).all() == [(0, "taken"),
                                                                                                  (9, "theirs")]
    finally:
        with db.engine.begin() as connection:
            connection.execute(sa.text("DROP TABLE badges"))


@pytest.mark.parametrize("count", [1, 5])
def test_a_value_postgresql_refuses_names_its_sqlstate(samples, count):
    db = samples
    with pytest.raises(DatabaseError, match=r"SQLSTATE 22003") as raised:   # beyond numeric(20, 6)
        with db.transaction() as tx:
            for number in range(count):
                tx.insert("typed_samples", id=number, exact=decimal.Decimal("1e15") if number == count - 1 else None)
    assert raised.value.sqlstate == "22003"
    assert stored(db) == {}


@pytest.mark.parametrize("lock", [None, "share", "update"])
def test_reading_many_rows_by_key_sends_one_array_and_finds_exactly_the_committed_ones(samples, lock):
    db = samples
    with db.transaction() as tx:
        for number in range(0, 300, 3):
            tx.insert("typed_samples", id=number, label=f"row {number}", doc={"n": number})
    info = db.catalog.table_info("typed_samples")
    with Statements(db) as statements:
        with db.engine.begin() as connection:
            found = fetch_rows(connection, info, [(number,) for number in range(300)], lock=lock)
    assert found == {(number,): {"id": number, **{name: None for name in ARRAYABLE + ("clock", "span", "tags")},
                                 "label": f"row {number}", "doc": {"n": number}} for number in range(0, 300, 3)}
    assert len(statements.sent) == 1 and "ANY(CAST(" in statements.sent[0], statements.sent


def test_a_row_locked_for_update_through_the_driver_reads_as_fetch_rows_reads_it(samples):
    """``lock_row`` (reads for update) sends its statement to the driver: the image must be the one
    ``fetch_rows`` (SQLAlchemy, with its result processors) gives — the flush compares the two."""
    db = samples
    with db.transaction() as tx:
        tx.insert("typed_samples", id=1, **sample(1))
        tx.insert("typed_samples", id=2, label="sparse")
    info = db.catalog.table_info("typed_samples")
    with db.engine.connect() as connection:
        with connection.begin():
            images = {key: lock_row(connection, info, (key,), lock_timeout="1s") for key in (1, 2, 3)}
            held = connection.execute(sa.text(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'transactionid' AND pid = pg_backend_pid() "
                "AND mode = 'ExclusiveLock'")).scalar()
        with connection.begin():
            committed = fetch_rows(connection, info, [(1,), (2,)])
    assert images == {1: committed[(1,)], 2: committed[(2,)], 3: None}
    assert images[1] == {"id": 1, **sample(1)}
    assert held == 1                                   # FOR UPDATE made the reader's transaction take an id


def test_a_refused_lock_row_is_sqlalchemys_error_with_the_sqlstate(samples):
    db = samples
    info = db.catalog.table_info("typed_samples")
    with db.transaction() as tx:
        tx.insert("typed_samples", id=1, label="locked")
    with db.engine.connect() as holder, db.engine.connect() as waiter:
        with holder.begin():
            assert lock_row(holder, info, (1,), lock_timeout="1s") is not None
            with waiter.begin(), pytest.raises(sa.exc.OperationalError) as caught:
                lock_row(waiter, info, (1,), lock_timeout="50ms")
    assert caught.value.orig.sqlstate == "55P03"      # lock_not_available: the bounded wait gave up


def test_arrays_are_cast_to_the_column_types_without_modifiers_so_nothing_is_cut():
    table = sa.Table("shapes", sa.MetaData(), sa.Column("id", sa.Integer, primary_key=True),
                     sa.Column("code", sa.CHAR(5)), sa.Column("name", sa.String(20)), sa.Column("amount", sa.Numeric(8, 2)),
                     sa.Column("at", sa.DateTime(timezone=True)), sa.Column("tags", postgresql.ARRAY(sa.Text)))
    info = TableInfo(table)
    dialect = postgresql.psycopg.dialect()
    assert info.array_types(dialect, ("id", "code", "name", "amount", "at")) == (
        "INTEGER", "BPCHAR", "VARCHAR", "NUMERIC", "TIMESTAMP WITH TIME ZONE")
    assert info.array_types(dialect, ("id", "tags")) is None      # an array column goes row by row


def test_every_common_type_written_after_a_read_for_update_is_stored_as_given(samples):
    """A tree that read a row for update flushes in the transaction that holds it, its last statement and
    ``COMMIT`` sent as one query whose parameters the driver binds on the client: every common type must
    arrive exactly as through the server-bound statements."""
    db = samples
    with db.transaction() as tx:
        tx.insert("typed_samples", id=1, label="before")
    expected = sample(5)
    with db.transaction() as tx:
        assert tx.read("typed_samples", 1, for_update=True)["label"] == "before"
        tx.write("typed_samples", 1, **expected)
    assert stored(db) == {1: expected}
    with db.transaction() as tx:                      # the row lock went with the COMMIT
        tx.read("typed_samples", 1, for_update=True)
        tx.write("typed_samples", 1, label=None, doc=None, blob=None)
    assert stored(db)[1] == {**expected, "label": None, "doc": None, "blob": None}


def test_a_group_of_rows_written_after_a_read_for_update_travels_as_arrays_bound_on_the_client(samples):
    """The held flush's last statement may be a group's ``unnest`` statement: its arrays are then bound on the
    client too, and every array-able type must arrive as given."""
    db = samples
    with db.transaction() as tx:
        tx.insert("typed_samples", id=0, label="before")
    expected = {number: {name: value if name in ARRAYABLE else None for name, value in sample(number).items()}
                for number in range(1, 4)}
    with Statements(db) as statements:
        with db.transaction() as tx:
            tx.read("typed_samples", 0, for_update=True)
            for number, values in expected.items():          # upserts (write): no read, so no SERIALIZABLE flush
                tx.write("typed_samples", number, **{name: value for name, value in values.items()
                                                     if value is not None})
    assert {number: values for number, values in stored(db).items() if number} == expected
    assert statements.sent == []          # lock_row and the last statement (with COMMIT) go to the driver


#: JSON values whose text arrays need escaping (quotes, backslashes, braces, commas, the word NULL), unicode,
#: nesting, and JSON null (Python None, where the column has ``none_as_null`` off).
AWKWARD_DOCS = [
    {"q": 'say "hi"', "b": "back\\slash \\\" both", "u": "é ☃ 𝄞 \u2028", "n": {"m": [1, None, 2.5, {"x": "}{,"}]}},
    'a "string" \\ alone', "NULL", "null", "", "{}", None, 0, -1.5, 10**30, True, [], {}, [None], ["{", "}", ",", " "],
    {"": "", " ": None, "\\": '"', "ключ": ["значение"]}, [[[[{"deep": ['"\\"']}]]]],
]


def stored_json_text(db) -> dict[int, str | None]:
    """Per row, ``doc`` as PostgreSQL prints it, and None for SQL NULL (JSON null prints as ``null``)."""
    with db.engine.connect() as connection:
        return dict(connection.execute(sa.text("SELECT id, doc::text FROM typed_samples")).all())


def expected_json_text(db, docs: dict[int, object]) -> dict[int, str]:
    with db.engine.connect() as connection:
        return {number: connection.execute(sa.text("SELECT CAST(:doc AS jsonb)::text"), {"doc": json.dumps(doc)}).scalar()
                for number, doc in docs.items()}


def write_rows(db, held: bool, rows) -> None:
    """Write each ``(id, values)`` of ``rows`` into ``typed_samples`` in one transaction; ``held``: after a read
    for update of row 0, so that the flush runs in that row-lock connection's transaction and its last statement
    is bound on the client (folded with its COMMIT)."""
    with db.transaction() as tx:
        if held:
            tx.read("typed_samples", 0, for_update=True)
        for number, values in rows:
            tx.write("typed_samples", number, **values)


@pytest.mark.parametrize("held", [False, True], ids=["server-bound", "client-bound"])
def test_json_arrays_store_exactly_what_one_row_at_a_time_stores(samples, held):
    """A group's JSON column travels as one array (in the driver's binary format when bound on the server):
    every value is stored as ``jsonb`` holds it one at a time — quotes, backslashes, unicode, nesting — and
    JSON null stays apart from SQL NULL (a row that does not name the column)."""
    db = samples
    docs = dict(enumerate(AWKWARD_DOCS, start=1))
    with db.transaction() as tx:
        tx.insert("typed_samples", id=0, label="lock me")
    with Statements(db) as statements:
        write_rows(db, held, [*((number, {"doc": doc}) for number, doc in docs.items()),
                              *((number, {"label": "no doc"}) for number in range(100, 103))])
    assert stored_json_text(db) == {0: None, **expected_json_text(db, docs), 100: None, 101: None, 102: None}
    assert stored_json_text(db)[7] == "null"      # AWKWARD_DOCS[6], JSON null
    if not held:
        assert any("%b::JSONB[]" in statement for statement in statements.sent), statements.sent
    write_rows(db, held, ((number, {"doc": [doc, "again"]}) for number, doc in docs.items()))   # written again
    assert stored_json_text(db) == {0: None, 100: None, 101: None, 102: None, **expected_json_text(
        db, {number: [doc, "again"] for number, doc in docs.items()})}


#: Strings a text array must escape or quote (quotes, backslashes, braces, commas, blanks, the word NULL, the
#: empty string), unicode, and SQL NULL.
AWKWARD_LABELS = ['say "hi"', "back\\slash \\\" both", "{a,b}", " padded ", "NULL", "null", "", ",", "é ☃ 𝄞 \u2028",
                  "line\nbreak\ttab", None]


@pytest.mark.parametrize("held", [False, True], ids=["server-bound", "client-bound"])
def test_integer_and_text_arrays_store_exactly_what_one_row_at_a_time_stores(samples, held):
    """A group's text columns travel as arrays in the driver's binary format when the statement is bound on the
    server (no text array to escape, no per-element quoting test), as text arrays when it is bound on the client;
    a column of exact integers as one array literal (``int_array``): either way every value is stored as given —
    the integer types' limits, awkward strings, SQL NULL.  (A value out of the column's range never reaches the
    array: the store refuses it at the write, ``InvalidValue``.)"""
    db = samples
    rows = {number: {"label": label, "small": (-32768, 32767, 0)[number % 3],
                     "big": (-9223372036854775808, 9223372036854775807, -1)[number % 3]}
            for number, label in enumerate(AWKWARD_LABELS, start=1)}
    with db.transaction() as tx:
        tx.insert("typed_samples", id=0, label="lock me")
    with Statements(db) as statements:
        write_rows(db, held, rows.items())
    found = stored(db)
    assert {number: {name: found[number][name] for name in ("label", "small", "big")} for number in rows} == rows
    if not held:        # (a statement bound on the client goes to the driver's own cursor: not seen here)
        assert any(all(cast in statement for cast in ("%s::SMALLINT[]", "%s::BIGINT[]", "%b::TEXT[]"))
                   for statement in statements.sent), statements.sent
    write_rows(db, held, ((number, {"label": None if values["label"] else "was empty or NULL",    # written again
                                    "small": -values["small"] - 1 if values["small"] < 0 else values["small"]})
                          for number, values in rows.items()))
    found = stored(db)
    assert {number: (found[number]["label"], found[number]["small"]) for number in rows} == {
        number: (None if values["label"] else "was empty or NULL",
                 -values["small"] - 1 if values["small"] < 0 else values["small"]) for number, values in rows.items()}


@pytest.mark.parametrize("held", [False, True], ids=["server-bound", "client-bound"])
def test_float_and_text_array_literals_store_exactly_what_the_driver_would(samples, held):
    """A column of exact floats goes as one array literal (each ``repr``), and so, in a statement bound on the
    client, does a column of strings (each quoted and escaped): the awkward strings, float extremes, negative
    zero, the specials and SQL NULL among floats are stored as given; a string with NUL is refused as before."""
    db = samples
    labels = [label for label in AWKWARD_LABELS if label is not None]
    reals = [0.1, -0.0, 1.7976931348623157e308, 5e-324, -1 / 3, 1e16, 123456789.125, float("inf"), float("-inf"),
             float("nan")]
    rows = {number: {"label": label, "real": real} for number, (label, real) in enumerate(zip(labels, reals), start=1)}
    with db.transaction() as tx:
        tx.insert("typed_samples", id=0, label="lock me")
    write_rows(db, held, rows.items())
    found = stored(db)
    assert {number: (found[number]["label"], repr(found[number]["real"])) for number in rows} == {
        number: (values["label"], repr(values["real"])) for number, values in rows.items()}
    write_rows(db, held, ((number, {"real": None if number % 3 else -values["real"]}) for number, values in rows.items()))
    found = stored(db)
    assert {number: repr(found[number]["real"]) for number in rows} == {
        number: repr(None if number % 3 else -values["real"]) for number, values in rows.items()}
    with pytest.raises(Exception, match="NUL"):
        write_rows(db, held, [(20, {"label": "a\x00b"}), (21, {"label": "c"})])
    assert 20 not in stored(db)


@pytest.mark.parametrize("held", [False, True], ids=["server-bound", "client-bound"])
def test_integer_columns_travel_as_one_array_literal_and_store_exactly_what_the_driver_would(samples, held):
    """A column of exact integers — the key included — goes as one array literal (``int_array``): the limits of
    each integer type, negative numbers and zero are stored as given, and read back by key through the same
    literal; a column that mixes integers and SQL NULL takes the driver's array (NULL stays NULL), and so does a
    column of ``bool``."""
    db = samples
    limits = {-2147483648: (-32768, -9223372036854775808), -1: (-1, -1), 0: (0, 0), 7: (32767, 9223372036854775807),
              2147483647: (12, -9223372036854775807)}
    with db.transaction() as tx:
        tx.insert("typed_samples", id=1, label="lock me")
    with Statements(db) as statements:
        write_rows(db, held, [(number, {"small": small, "big": big}) for number, (small, big) in limits.items()])
        write_rows(db, held, [(number, {"small": small, "flag": number % 2 == 0})
                              for number, small in ((10, None), (11, 5), (12, None), (13, -5))])
    found = stored(db)
    assert {number: (found[number]["small"], found[number]["big"]) for number in limits} == limits
    assert {number: (found[number]["small"], found[number]["flag"]) for number in (10, 11, 12, 13)} == {
        10: (None, True), 11: (5, False), 12: (None, True), 13: (-5, False)}
    if not held:        # (a statement bound on the client goes to the driver's own cursor: not seen here)
        assert any("%s::INTEGER[]" in statement and "%s::SMALLINT[]" in statement and "%s::BIGINT[]" in statement
                   for statement in statements.sent), statements.sent
        assert any("%b::SMALLINT[]" in statement and "%s::BOOLEAN[]" in statement and "%s::INTEGER[]" in statement
                   for statement in statements.sent), statements.sent
    info = db.catalog.table_info("typed_samples")
    with db.engine.begin() as connection:
        read = fetch_rows(connection, info, [(number,) for number in (*limits, 99, -99)], lock="update")
    assert {key: (row["small"], row["big"]) for key, row in read.items()} == {(number,): pair
                                                                             for number, pair in limits.items()}


@pytest.mark.parametrize("lock", [None, "share", "update"])
def test_rows_read_by_key_from_the_driver_are_the_images_sqlalchemy_reads(samples, lock):
    """``fetch_rows`` of a one-column key reads the driver's rows itself (each column through its type's result
    processor): every common type's image is the one SQLAlchemy's own ``SELECT`` gives, NULLs included, whatever
    the lock — prefetched images and the flush's re-read are compared with each other and with ``lock_row``'s."""
    db = samples
    with db.transaction() as tx:
        for number in range(1, 6):
            tx.insert("typed_samples", id=number, **sample(number))
        tx.insert("typed_samples", id=6, label="the rest NULL")
    info = db.catalog.table_info("typed_samples")
    with db.engine.begin() as connection:
        reference = {(row["id"],): dict(row) for row in connection.execute(sa.select(info.table)).mappings()}
        found = fetch_rows(connection, info, [(number,) for number in range(0, 9)], lock=lock)
    assert found == reference and len(found) == 6
    assert {key: {name: type(value) for name, value in image.items()} for key, image in found.items()} == {
        key: {name: type(value) for name, value in image.items()} for key, image in reference.items()}
    # A table none of whose columns has a result processor (``typed_samples``' array column has one): the rows
    # are made without a call per value.
    with db.engine.begin() as connection:
        connection.execute(sa.text("TRUNCATE orders"))
        connection.execute(sa.text("INSERT INTO orders (id, customer, amount) VALUES (-1, 'a', 1.50), (7, 'b', 0)"))
    orders = db.catalog.table_info("orders")
    with db.engine.begin() as connection:
        reference = {(row["id"],): dict(row) for row in connection.execute(sa.select(orders.table)).mappings()}
        found = fetch_rows(connection, orders, [(-1,), (7,), (8,)], lock=lock)
        connection.execute(sa.text("TRUNCATE orders"))
    assert found == reference and set(found) == {(-1,), (7,)}


def test_a_row_locked_elsewhere_fails_a_nowait_read_by_key_with_sqlalchemys_error(samples):
    """``fetch_rows(..., nowait=True)`` (the flush's re-read while it holds table locks) refuses a row another
    transaction has locked with SQLSTATE 55P03, as SQLAlchemy's ``OperationalError`` — what the flush retries."""
    db = samples
    with db.transaction() as tx:
        tx.insert("typed_samples", id=1, label="locked")
    info = db.catalog.table_info("typed_samples")
    with db.engine.connect() as holder, db.engine.connect() as reader:
        holder.execute(sa.text("SELECT id FROM typed_samples WHERE id = 1 FOR UPDATE"))
        with pytest.raises(sa.exc.OperationalError) as raised:
            fetch_rows(reader, info, [(1,), (2,)], lock="share", nowait=True)
        assert getattr(raised.value.orig, "sqlstate", None) == "55P03"
        reader.rollback()
        holder.rollback()


class FlushStatements:
    """The statements a flush makes of its plan, as (kind, rows) — whichever way each is sent (the last one may go with
    the COMMIT as one query string, which SQLAlchemy's cursor events do not see): a spy on ``_sql._statement``,
    which builds each one's SQL and parameters — of table ``table``; ``parameters``: the rows each statement sent row
    by row carries, as the driver is handed them."""

    def __init__(self, monkeypatch, table: str = "typed_samples"):
        from activedb.store import _sql

        self.made: list[tuple[str, int]] = []
        self.parameters: list[list[tuple]] = []
        build = _sql._statement

        def spy(connection, info, kind, order, columns, binary=True):
            statement, parameters = build(connection, info, kind, order, columns, binary)
            if info.name == table:
                self.made.append((kind, len(columns[0])))
                if "unnest" not in statement:
                    self.parameters.append(parameters if isinstance(parameters, list) else [parameters])
            return statement, parameters

        monkeypatch.setattr(_sql, "_statement", spy)

    def take(self) -> list[tuple[str, int]]:
        made, self.made = self.made, []
        return made


def test_a_flush_of_more_rows_than_one_statement_carries_writes_them_all_in_several_statements(samples, monkeypatch):
    """A table's rows of one kind and column set go out in statements of at most ``ROWS_PER_STATEMENT`` rows and
    ``STATEMENT_BYTES`` of values (both lowered here), one after another in the flush's transaction, every row
    stored as given; a group within both bounds is one statement, as before.  Before, a flush sent one statement per
    table, kind and column set however many rows and bytes it carried — one array per column, each a value
    PostgreSQL takes at most 1 GB of."""
    from activedb.store import _sql, _statements

    db = samples
    made = FlushStatements(monkeypatch)
    expected = {number: sample(number) for number in range(8)}
    for values in expected.values():
        for name in values:
            values[name] = values[name] if name in ARRAYABLE else None

    def insert_all(rows: dict) -> None:
        with db.transaction() as tx:
            for number, values in rows.items():
                tx.insert("typed_samples", id=number, **{name: value for name, value in values.items()
                                                         if value is not None})

    insert_all(expected)
    assert made.take() == [("insert", 8)]       # (the bounds as shipped: one statement)
    assert stored(db) == expected
    with db.engine.begin() as connection:
        connection.execute(sa.text("TRUNCATE typed_samples"))
    monkeypatch.setattr(_sql, "ROWS_PER_STATEMENT", 3)
    with Statements(db) as statements:
        insert_all(expected)
    assert made.take() == [("insert", 3), ("insert", 3), ("insert", 2)]
    assert all("unnest" in statement for statement in statements.sent if statement.startswith("INSERT"))
    assert stored(db) == expected
    with db.transaction() as tx:
        for number in expected:
            tx.write("typed_samples", number, label=f"again {number}")
    assert made.take() == [("upsert", 3), ("upsert", 3), ("upsert", 2)]
    assert {number: row["label"] for number, row in stored(db).items()} == {
        number: f"again {number}" for number in expected}
    with db.transaction() as tx:
        for number in expected:
            tx.delete("typed_samples", number)
    assert made.take() == [("delete", 3), ("delete", 3), ("delete", 2)]
    assert stored(db) == {}

    monkeypatch.setattr(_sql, "ROWS_PER_STATEMENT", 10_000)
    monkeypatch.setattr(_statements, "STATEMENT_BYTES", 2_500)
    labels = {number: {"label": str(number) * 1_000, "doc": {"n": number}} for number in range(7)}
    labels[3]["doc"] = {"big": "x" * 5_000}         # (larger alone than a statement: one of its own)
    insert_all(labels)
    assert made.take() == [("insert", 2), ("insert", 1), ("insert", 1), ("insert", 2), ("insert", 1)]
    assert {number: {"label": row["label"], "doc": row["doc"]} for number, row in stored(db).items()} == labels


def test_a_failure_in_a_later_statement_of_a_flush_leaves_nothing_of_the_earlier_ones(samples, monkeypatch):
    """The statements of one flush's rows run in one PostgreSQL transaction: when a later one fails (a key
    committed by another session meanwhile), the rows the earlier ones wrote are not kept."""
    from activedb.store import _sql

    db = samples
    made = FlushStatements(monkeypatch)
    monkeypatch.setattr(_sql, "ROWS_PER_STATEMENT", 3)
    with pytest.raises(DuplicateKey, match=r"typed_samples.*\(id\)=\(6\) already exists"):
        with db.transaction() as tx:
            for number in range(7):
                tx.insert("typed_samples", id=number, label=f"mine {number}")
            with db.engine.begin() as connection:
                connection.execute(sa.text("INSERT INTO typed_samples (id, label) VALUES (6, 'theirs')"))
    assert made.take() == [("insert", 3), ("insert", 3), ("insert", 1)]
    assert stored(db) == {6: {**{name: None for name in sample(0)}, "label": "theirs"}}


class JsonEncodings:
    """How many times each ``doc`` value ``{"n": number, …}`` of a flush is encoded as JSON, by number: by the store's
    measuring encoder (``_sql._json_parts``) and by the driver's (psycopg's JSON dumper's ``dumps``), each call
    counted."""

    def __init__(self, monkeypatch):
        from psycopg.types import json as psycopg_json

        from activedb.store import _sql

        self.counted: dict[int, int] = {}
        measure, dumps = _sql._json_parts, psycopg_json._JsonDumper._dumps

        def counted(encode):
            def encoding(value, *rest):
                if isinstance(value, dict) and "n" in value:
                    self.counted[value["n"]] = self.counted.get(value["n"], 0) + 1
                return encode(value, *rest)
            return encoding

        monkeypatch.setattr(_sql, "_json_parts", counted(measure))
        monkeypatch.setattr(psycopg_json._JsonDumper, "_dumps", counted(dumps))

    def take(self) -> dict[int, int]:
        counted, self.counted = self.counted, {}
        return counted


@pytest.mark.parametrize("rows_per_statement", [10_000, 3], ids=["one-statement", "split"])
def test_a_flush_encodes_each_json_value_once(samples, monkeypatch, rows_per_statement):
    """A JSON column's value is encoded once per flush — measured for the statement's bound as the text the driver
    sends, that text handed to the driver — whether the group goes in one statement or is split, in an ``unnest``
    of arrays or row by row; what is stored is what was given.  Before, the flush encoded each value to measure it
    (twice for a group it split: the total, then each row's) and the driver encoded it again."""
    from activedb.store import _sql

    db = samples
    monkeypatch.setattr(_sql, "ROWS_PER_STATEMENT", rows_per_statement)
    made = FlushStatements(monkeypatch)
    encodings = JsonEncodings(monkeypatch)
    docs = {number: {"n": number, "text": f"é \"{number}\"", "list": [1.5, None, {"deep": [number]}]}
            for number in range(8)}
    with db.transaction() as tx:
        for number, doc in docs.items():
            tx.insert("typed_samples", id=number, doc=doc)
    with db.transaction() as tx:        # (row by row: an array column, ``tags``, cannot travel in an array)
        for number, doc in docs.items():
            tx.insert("typed_samples", id=100 + number, doc={**doc, "n": 100 + number}, tags=["t", str(number)])
    assert encodings.take() == {number: 1 for number in [*docs, *(100 + number for number in docs)]}
    assert made.take() == [("insert", 8), ("insert", 8)] if rows_per_statement > 8 else [
        ("insert", 3), ("insert", 3), ("insert", 2)] * 2
    with db.transaction() as tx:
        for number, doc in docs.items():
            tx.write("typed_samples", number, doc={**doc, "text": "again"})
    assert encodings.take() == {number: 1 for number in docs}
    assert {number: row["doc"] for number, row in stored(db).items()} == {
        **{number: {**doc, "text": "again"} for number, doc in docs.items()},
        **{100 + number: {**doc, "n": 100 + number} for number, doc in docs.items()}}


@pytest.mark.parametrize("makes", ["text", "bytes"])
def test_a_flush_encodes_json_with_the_drivers_encoder_of_the_connection(samples, monkeypatch, makes):
    """The encoder the flush uses for a JSON column is the driver's (what the engine's ``json_serializer`` or
    psycopg's ``set_json_dumps`` makes it; one of text or of bytes, patched here), called once a value, and what it
    made is what is stored."""
    from psycopg.types import json as psycopg_json

    db = samples
    called: list[object] = []

    def dumps(value):
        called.append(value)
        text = json.dumps({**value, "encoded": True})
        return text if makes == "text" else text.encode()

    monkeypatch.setattr(psycopg_json._JsonDumper, "_dumps", dumps)
    with db.transaction() as tx:
        for number in range(3):
            tx.insert("typed_samples", id=number, doc={"n": number})
    assert called == [{"n": number} for number in range(3)]
    assert {number: row["doc"] for number, row in stored(db).items()} == {
        number: {"n": number, "encoded": True} for number in range(3)}

def test_the_store_encodes_json_as_the_driver_would(samples):
    """The text the flush hands the driver for a JSON value is the one the driver's own encoder (``json.dumps``)
    makes — what a ``json`` column keeps verbatim."""
    from activedb.store import _sql

    values = [None, True, 0, -1.5, "é \" \\ \x00", [], {}, {"a": [1, 2.5, None, {"b": "c"}], "d": {"e": "\u2028"}}]
    assert _sql._encoded_json(values) == [json.dumps(value) for value in values]


@pytest.mark.parametrize("path", ["array", "in-list"])
@pytest.mark.parametrize("lock", [None, "update"])
def test_reading_many_rows_by_key_sends_them_in_statements_within_the_bounds(samples, monkeypatch, lock, path):
    """``fetch_rows`` sends its keys in statements of at most ``ROWS_PER_STATEMENT`` keys and ``STATEMENT_BYTES`` of
    them (both lowered here), one after another in the caller's transaction — a one-column key's as one array each,
    or (a key that cannot travel in an array, forced here) as an ``IN`` list: every committed row is found and, with
    ``lock``, every one is locked until that transaction ends.  Before, a one-column key's keys all went in one array
    parameter, however many and however large, and an ``IN`` list took up to ``FETCH_CHUNK`` keys whatever their
    bytes."""
    from activedb.store import _sql, _statements

    db = samples
    if path == "in-list":
        monkeypatch.setattr(TableInfo, "select_by_key_array", lambda *arguments, **options: None)
    sign = "ANY(CAST(" if path == "array" else " IN ("
    with db.transaction() as tx:
        for number in range(0, 10):
            tx.insert("typed_samples", id=number, label=f"row {number}")
    info = db.catalog.table_info("typed_samples")
    keys = [(number,) for number in range(12)]
    expected = {(number,): {"id": number, **{name: None for name in ARRAYABLE + ("clock", "span", "tags")},
                            "label": f"row {number}"} for number in range(10)}
    for rows, statement_bytes, count in [(3, 2**20, 4), (10_000, 2 * _sql._FIXED_BYTES, 6), (10_000, 2**20, 1)]:
        monkeypatch.setattr(_sql, "ROWS_PER_STATEMENT", rows)
        monkeypatch.setattr(_statements, "STATEMENT_BYTES", statement_bytes)
        with Statements(db) as statements:
            with db.engine.begin() as connection:
                assert fetch_rows(connection, info, keys, lock=lock) == expected
                assert len(statements.sent) == count and all(sign in sql for sql in statements.sent), (
                    statements.sent)
                with db.engine.connect() as other:
                    locked = other.execute(sa.text(
                        "SELECT id FROM typed_samples WHERE id = ANY(:ids) FOR UPDATE SKIP LOCKED"),
                        {"ids": list(range(10))}).scalars().all()
                    other.rollback()
                assert sorted(locked) == ([] if lock else list(range(10)))


class ArrayEncodings:
    """How many times a flush encodes an array column's list value: by the store's measuring JSON encoder
    (``_sql._json_parts``, called with a list) and by the driver's array dumpers (psycopg's ``ListDumper`` and
    ``ListBinaryDumper``), each call counted."""

    def __init__(self, monkeypatch):
        from psycopg.types import array as psycopg_array

        from activedb.store import _sql

        self.counted = {"measured": 0, "dumped": 0}

        def counted(what, encode):
            def encoding(*arguments):
                if any(isinstance(argument, list) for argument in arguments):
                    self.counted[what] += 1
                return encode(*arguments)
            return encoding

        monkeypatch.setattr(_sql, "_json_parts", counted("measured", _sql._json_parts))
        for dumper in (psycopg_array.ListDumper, psycopg_array.ListBinaryDumper):
            monkeypatch.setattr(dumper, "dump", counted("dumped", dumper.dump))

    def take(self) -> dict[str, int]:
        counted, self.counted = self.counted, {"measured": 0, "dumped": 0}
        return counted


@pytest.fixture
def arrays(db):
    """``db`` with a table ``array_samples`` (an integer, a bigint, a float and a text array; dropped after)."""
    with db.engine.begin() as connection:
        connection.execute(sa.text("DROP TABLE IF EXISTS array_samples"))
        connection.execute(sa.text("CREATE TABLE array_samples (id bigint PRIMARY KEY, small integer[], big bigint[], "
                                   "real double precision[], tags text[], days date[])"))
    yield db
    with db.engine.begin() as connection:
        connection.execute(sa.text("DROP TABLE array_samples"))


def stored_arrays(db) -> dict[int, dict]:
    with db.engine.connect() as connection:
        return {row["id"]: {name: value for name, value in row.items() if name != "id" and value is not None}
                for row in connection.execute(sa.text("SELECT * FROM array_samples")).mappings()}


@pytest.mark.parametrize("rows_per_statement", [10_000, 3], ids=["one-statement", "split"])
def test_a_flush_encodes_each_array_value_once(arrays, monkeypatch, rows_per_statement):
    """An array column's list of integers, floats or texts (NULL elements, quotes, backslashes, braces, commas, the
    text ``NULL``, non-ASCII, empty lists included) is encoded once per flush: written as one array literal, whose
    length is what the statement's bound counts, and sent by the driver as it is; what is stored is what was given,
    whether the group goes in one statement or is split.  An array of other elements (dates) is left to the driver,
    measured as before.  Before, the flush encoded each list as JSON to measure it (twice for a group it split: the
    total, then each row's) and the driver then wrote its own array text of it."""
    from activedb.store import _sql

    db = arrays
    monkeypatch.setattr(_sql, "ROWS_PER_STATEMENT", rows_per_statement)
    made = FlushStatements(monkeypatch, "array_samples")
    encodings = ArrayEncodings(monkeypatch)
    given = {number: {"small": [number, None, -2147483648] if number % 2 else [number, 2147483647],
                      "big": [9223372036854775807 - number, -number],
                      "real": [0.1 + number, None, -1e300, float("inf")],
                      "tags": ([f'q"{number}', None, "back \\ slash", "{,}", "NULL", "é \u2028", ""] if number % 2
                               else ["plain", f"{number}"]) if number % 3 else []}
             for number in range(8)}
    with db.transaction() as tx:
        for number, values in given.items():
            tx.insert("array_samples", id=number, **values)
    assert encodings.take() == {"measured": 0, "dumped": 0}
    assert made.take() == [("insert", 8)] if rows_per_statement > 8 else [("insert", 3), ("insert", 3), ("insert", 2)]
    assert stored_arrays(db) == given
    days = {number: [dt.date(2000, 1, 1) + dt.timedelta(days=number), None] for number in range(8)}
    with db.transaction() as tx:        # (an update of existing rows: literals as the values of its SET)
        for number, values in days.items():
            tx.write("array_samples", number, days=values, tags=["again", None, f'"{number}"'])
    assert encodings.take()["measured"] >= len(days)        # (left to the driver, measured as before)
    assert {number: (row["days"], row["tags"]) for number, row in stored_arrays(db).items()} == {
        number: (values, ["again", None, f'"{number}"']) for number, values in days.items()}


@pytest.mark.parametrize("over", [0, 1, 10_000], ids=["at-the-bound", "one-over", "one-row-over-alone"])
def test_array_rows_near_and_over_the_statement_bound_are_split_so_no_statement_carries_more(arrays, monkeypatch,
                                                                                               over):
    """``STATEMENT_BYTES`` bounds what one statement of a flush carries (PostgreSQL takes at most 1 GB of one value
    and of one message, and the driver and the server hold a statement's parameters whole): a group of rows whose
    array texts together reach the bound exactly is one statement; a byte more and the last row goes in a statement of
    its own; a row larger than the bound alone is a statement of its own.  What the statements carry — the array
    texts sent, and the fixed-size key's bound — is never more than the bound for a statement of several rows, and
    every row is stored as given.  Lowered here to 1,000 bytes."""
    from activedb.store import _statements

    db = arrays
    monkeypatch.setattr(_statements, "STATEMENT_BYTES", 1_000)
    made = FlushStatements(monkeypatch, "array_samples")
    # Each row: its key counted at 40 bytes, its text array as a literal of 4 + the text's length ({"…"}).
    given = {number: ["x" * (250 - 40 - 4)] for number in range(4)}
    given[3] = ["y" * (250 - 40 - 4 + over)]
    with db.transaction() as tx:
        for number, tags in given.items():
            tx.insert("array_samples", id=number, tags=tags)
    assert [kind_rows[1] for kind_rows in made.take()] == ([4] if over == 0 else [3, 1])
    for statement_rows in made.parameters:
        carried = sum(40 + sum(len(value) for value in row if isinstance(value, str)) for row in statement_rows)
        assert len(statement_rows) == 1 or carried <= 1_000, (len(statement_rows), carried)
    assert {number: row["tags"] for number, row in stored_arrays(db).items()} == given
