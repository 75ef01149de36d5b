"""Rows the store cannot address are refused at the call that names them, saying what to give: a table without a
primary key, an insert without its key columns, a timestamp key of the other kind of datetime; and a closed
``Database`` says to connect again."""

from __future__ import annotations

import datetime

import pytest
import sqlalchemy as sa

from activedb.errors import InvalidKey, TransactionError
from tests.conftest import open_db


@pytest.fixture(scope="module")
def key_tables(db):
    with db.engine.begin() as connection:
        connection.execute(sa.text("CREATE TABLE keyless_notes (note text)"))
        connection.execute(sa.text("CREATE TABLE pair_keyed (a integer, b integer, v text, PRIMARY KEY (a, b))"))
        connection.execute(sa.text("CREATE TABLE aware_stamps (at timestamptz PRIMARY KEY, v text)"))
        connection.execute(sa.text("CREATE TABLE naive_stamps (at timestamp PRIMARY KEY, v text)"))
    yield db
    with db.engine.begin() as connection:
        connection.execute(sa.text("DROP TABLE keyless_notes, pair_keyed, aware_stamps, naive_stamps"))


def count(db, table: str) -> int:
    with db.engine.connect() as connection:
        return connection.execute(sa.text(f"SELECT count(*) FROM {table}")).scalar_one()


def test_a_table_without_a_primary_key_is_refused_saying_activedb_needs_one(key_tables):
    with pytest.raises(InvalidKey, match=r"table 'keyless_notes' has no primary key; activedb needs one to address "
                                         r"rows"):
        key_tables.run(lambda tx: tx.write("keyless_notes", "k", note="x"))
    assert count(key_tables, "keyless_notes") == 0


@pytest.mark.parametrize("values, says", [
    ({"a": 1, "v": "x"}, "insert into 'pair_keyed' needs the key columns a, b: give b"),
    ({"v": "x"}, "insert into 'pair_keyed' needs the key columns a, b: give a, b"),
], ids=["one-of-two-missing", "none-given"])
def test_an_insert_without_its_key_columns_names_them(key_tables, values, says):
    with pytest.raises(InvalidKey) as raised:
        key_tables.run(lambda tx: tx.insert("pair_keyed", **values))
    assert says in str(raised.value)
    assert count(key_tables, "pair_keyed") == 0


@pytest.mark.parametrize("table, key, says", [
    ("aware_stamps", datetime.datetime(2026, 1, 1, 12, 0), "give an aware datetime"),
    ("naive_stamps", datetime.datetime(2026, 1, 1, 12, 0, tzinfo=datetime.timezone.utc), "give a naive datetime"),
], ids=["naive-for-timestamptz", "aware-for-timestamp"])
def test_a_timestamp_key_of_the_other_kind_of_datetime_is_refused_saying_which_to_give(key_tables, table, key, says):
    with pytest.raises(InvalidKey, match="a read by this key would not find its row") as raised:
        key_tables.run(lambda tx: tx.write(table, key, v="x"))
    assert says in str(raised.value)
    assert count(key_tables, table) == 0


def test_a_closed_database_says_to_connect_again(database_url, db_options):
    closed = open_db(database_url, db_options)
    closed.close()
    for call in (closed.transaction, lambda: closed.run(lambda tx: None)):
        with pytest.raises(TransactionError, match=r"this Database is closed; call activedb.connect\(\) again"):
            call()
