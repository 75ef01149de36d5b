"""``tx.read_many`` / ``tx.write_many`` (``activedb/txn/_reads.py``, ``_writes.py``) on the real PostgreSQL: the
images as the node sees them loaded in one query, the locks at the granularity asked for, the
same data events and validation as the per-row operations."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

import activedb
from activedb.txn import BulkLock
from lockmgr import Mode


def committed(db, table):
    with db.engine.connect() as connection:
        return {row.id: row.balance for row in connection.execute(sa.text(f"SELECT id, balance FROM {table}"))}


@pytest.fixture()
def accounts(db):
    with db.engine.begin() as connection:
        connection.execute(sa.text("DELETE FROM accounts"))
        connection.execute(sa.text("INSERT INTO accounts (id, balance) SELECT n, n * 10 FROM generate_series(1, 6) n"))


def _statements(db):
    statements = []

    def record(connection, cursor, statement, *rest):
        statements.append(statement)

    sa.event.listen(db.engine, "before_cursor_execute", record)
    return statements, lambda: sa.event.remove(db.engine, "before_cursor_execute", record)


def test_read_many_returns_what_the_node_sees_in_one_query(db, accounts):
    with db.transaction() as tx:
        tx.write("accounts", 2, balance=222)
        statements, stop = _statements(db)
        try:
            images = tx.read_many("accounts", [1, 2, 9, 1])
        finally:
            stop()
        assert list(images) == [1, 2, 9]                       # keyed as given, each once
        assert images[1]["balance"] == 10 and images[2]["balance"] == 222 and images[9] is None
        assert sum("FROM accounts" in statement for statement in statements) == 1
        assert tx.read("accounts", 1)["balance"] == 10        # later reads need no round trip


@pytest.mark.parametrize("lock, row_mode, table_mode", [("read", Mode.READ, Mode.IR), ("write", Mode.WRITE, Mode.IW),
                                                         ("table", None, Mode.WRITE)])
def test_read_many_locks_at_the_granularity_asked(db, accounts, lock, row_mode, table_mode):
    locks = db.transactions.locks
    with db.transaction() as tx:
        tx.read_many("accounts", [3, 4], lock=lock)
        row = locks.holders(("row", "accounts", (3,)))
        assert (row.held.get(tx.id) if row else None) is row_mode
        assert locks.holders(("table", "accounts")).held.get(tx.id) is table_mode


def test_prefetch_read_locks_each_row_once_and_the_table_in_intention(db, accounts):
    locks = db.transactions.locks
    with db.transaction() as tx:
        tx.write("accounts", 2, balance=222)                 # WRITE on row 2 already: prefetch keeps it
        tx.prefetch("accounts", [1, 2, 3, 1])
        assert {key: locks.holders(("row", "accounts", (key,))).held.get(tx.id) for key in (1, 2, 3)} == {
            1: Mode.READ, 2: Mode.WRITE, 3: Mode.READ}
        assert locks.holders(("table", "accounts")).held.get(tx.id) is Mode.IW     # (IW covers the IR asked)
        assert tx.read("accounts", 3)["balance"] == 30


def test_read_many_images_are_validated_at_the_flush(db, accounts, database_url):
    other = activedb.connect(database_url)
    try:
        with pytest.raises(activedb.SerializationConflict):
            with db.transaction() as tx:
                images = tx.read_many("accounts", [5], lock="write")
                other.run(lambda o: o.write("accounts", 5, balance=0))   # another process commits in between
                tx.write("accounts", 5, balance=images[5]["balance"] + 1)
    finally:
        other.close()
    assert committed(db, "accounts")[5] == 0


@pytest.mark.parametrize("lock", [BulkLock.WRITE, BulkLock.TABLE])
def test_write_many_writes_deletes_and_raises_the_data_events(db, accounts, lock):
    seen = []
    db.rule(on=db.updated("accounts"), name="bulk_updates")(
        lambda tx, event: seen.append((event.key, event.new["balance"])))
    db.rule(on=db.deleted("accounts"), name="bulk_deletes")(lambda tx, event: seen.append((event.key, None)))
    try:
        with db.transaction() as tx:
            assert tx.write_many("accounts", {1: {"balance": 11}, 2: {"balance": 22}, 6: None}, lock=lock) == 3
            holders = db.transactions.locks.holders(("row", "accounts", (1,)))
            assert bool(holders) is (lock is BulkLock.WRITE)
    finally:
        db.rules.remove("bulk_updates")
        db.rules.remove("bulk_deletes")
    assert sorted(seen) == [(1, 11), (2, 22), (6, None)]
    assert committed(db, "accounts") == {1: 11, 2: 22, 3: 30, 4: 40, 5: 50}


def test_bulk_operations_check_what_they_are_given(db, accounts):
    with db.transaction() as tx:
        with pytest.raises(ValueError, match=r"use one of BulkLock.READ \('read'\), BulkLock.WRITE \('write'\), "
                                             r"BulkLock.TABLE \('table'\)"):
            tx.read_many("accounts", [1], lock="row")
        with pytest.raises(activedb.InvalidKey):
            tx.write_many("accounts", {1: {"id": 2, "balance": 1}})
        with pytest.raises(activedb.InvalidValue):
            tx.write_many("accounts", {1: {"balance": "ten"}})


def test_write_many_given_pairs_instead_of_a_mapping_says_what_it_takes(db, accounts):
    """``write_many`` takes ``{key: values or None}``: a list of ``(key, values)`` pairs is an error that shows the
    mapping to pass, not Python's ``'list' object has no attribute 'items'``; nothing is written."""
    with pytest.raises(TypeError, match=r"write_many\('accounts', rows\) takes a mapping \{key: values or None\}.*"
                                        r"list"):
        with db.transaction() as tx:
            tx.write_many("accounts", [(1, {"balance": 11})])
    assert committed(db, "accounts")[1] == 10


def test_write_many_given_a_row_that_is_no_mapping_says_what_it_takes(db, accounts):
    """A row's values must be a mapping of columns (or None, a delete): ``{1: 11}`` is an error naming the row and
    showing what to write, not Python's ``'int' object is not iterable`` (nor, for a text, ``dictionary update
    sequence element #0 ...``); nothing is written."""
    for values in (11, "eleven"):
        with pytest.raises(TypeError, match=r"write_many\('accounts', rows\): the values of row 1 .* mapping of "
                                            r"columns.*\{'column': value\}"):
            with db.transaction() as tx:
                tx.write_many("accounts", {1: values})
    assert committed(db, "accounts")[1] == 10


def test_read_many_and_prefetch_given_one_text_key_say_they_take_a_collection_of_keys(db):
    """A text is an iterable of its letters: ``read_many('items', 'abc')`` read and READ-locked the rows 'a', 'b' and
    'c' and returned ``{'a': None, 'b': None, 'c': None}`` — not the row 'abc', which exists — and ``prefetch`` loaded
    those letters' rows.  Both now say they take a collection of keys and show the call for one row; nothing is
    locked."""
    with db.engine.begin() as connection:
        connection.execute(sa.text("DELETE FROM items WHERE key IN ('abc', 'a', 'b', 'c')"))
        connection.execute(sa.text("INSERT INTO items (key, value) VALUES ('abc', 1)"))
    with db.transaction() as tx:
        with pytest.raises(TypeError, match=r"read_many\('items', keys\) takes a collection of keys, got the text "
                                            r"'abc'.*read_many\('items', \['abc'\]\)"):
            tx.read_many("items", "abc")
        with pytest.raises(TypeError, match=r"prefetch\('items', keys\) takes a collection of keys, got the text "
                                            r"'abc'.*prefetch\('items', \['abc'\]\)"):
            tx.prefetch("items", "abc")
        assert not any(db.transactions.locks.holders(("row", "items", (letter,))) for letter in "abc")
        assert tx.read_many("items", ["abc"]) == {"abc": {"key": "abc", "value": 1, "note": None}}


def test_read_many_and_prefetch_given_one_bytes_key_say_they_take_a_collection_of_keys(db):
    """Bytes are an iterable of their numbers: ``read_many('accounts', b'ab')`` READ-locked and returned the rows 97
    and 98 of an integer-keyed table — rows the caller never named — and ``prefetch`` loaded them; both refuse it as
    they refuse one text (1d7d9c9), nothing locked."""
    with db.engine.begin() as connection:
        connection.execute(sa.text("DELETE FROM accounts WHERE id IN (97, 98)"))
        connection.execute(sa.text("INSERT INTO accounts (id, balance) VALUES (97, 1), (98, 2)"))
    with db.transaction() as tx:
        for method in ("read_many", "prefetch"):
            with pytest.raises(TypeError, match=rf"{method}\('accounts', keys\) takes a collection of keys.*"
                                                rf"{method}\('accounts', \[b'ab'\]\)"):
                getattr(tx, method)("accounts", b"ab")
        assert not any(db.transactions.locks.holders(("row", "accounts", (number,))) for number in (97, 98))


def test_read_many_and_prefetch_given_no_collection_of_keys_say_what_to_give(db):
    """``read_many('accounts', None)`` (or one integer key) raised a bare ``TypeError: 'NoneType' object is not
    iterable`` from inside the loop over the keys.  Like the other calls given a value of the wrong type, both now
    raise ``BadArgument`` naming the call and saying to give a collection of keys; the transaction goes on."""
    with db.transaction() as tx:
        for method in ("read_many", "prefetch"):
            for keys in (None, 5):
                with pytest.raises(activedb.BadArgument, match=rf"{method}\('accounts', keys\) takes a collection "
                                                               rf"of keys.*got {keys!r}.*{method}\('accounts', \[key\]\)"):
                    getattr(tx, method)("accounts", keys)
        assert tx.read_many("accounts", []) == {}
