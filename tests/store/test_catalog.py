"""``Catalog.table``: the reflected tables a name finds, and what a name that cannot be one gets.  Real
PostgreSQL."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

import activedb


@pytest.mark.parametrize("name", [None, 5, ("accounts",)])
def test_a_table_named_by_anything_but_a_string_or_a_table_is_an_unknown_table_saying_how_to_name_it(db, name):
    # (before: SQLAlchemy's AssertionError "use quoted_name.construct() for None passthrough", a TypeError for 5)
    with pytest.raises(activedb.UnknownTable, match="a table is named by a string or a sqlalchemy Table, got"):
        db.table(name)
    with pytest.raises(activedb.UnknownTable, match="a table is named by a string"):
        db.catalog.table(name)
    assert db.table("accounts").name == "accounts"


def test_a_read_postgresql_refuses_is_a_database_error_naming_the_sqlstate(db):
    """A read of committed rows that PostgreSQL refuses (here a column dropped behind the ``Database``'s back, as
    another process's migration does; a role without SELECT alike) is a ``DatabaseError`` with the SQLSTATE and
    PostgreSQL's message, as ``Catalog.autocommit_connection`` and the README's table of database failures say —
    for ``tx.read``, ``tx.read_many``, ``tx.scan`` and the existence check of ``tx.insert``.  (Before: SQLAlchemy's
    ``ProgrammingError``, no ``ActivedbError``; only a lost connection was turned into one.)  The statement names a
    column the program never named, so the hint says the table may have changed since this process read it and to
    call ``db.schema.refresh()`` (before: "Fix what the message says, then retry")."""
    with db.engine.begin() as connection:
        connection.execute(sa.text("CREATE TABLE dropped_later (id integer PRIMARY KEY, gone text)"))
    db.run(lambda tx: tx.write("dropped_later", 1, gone="x"))
    with db.engine.begin() as connection:
        connection.execute(sa.text("ALTER TABLE dropped_later DROP COLUMN gone"))
    reads = {"read": lambda tx: tx.read("dropped_later", 1), "read_many": lambda tx: tx.read_many("dropped_later", [1]),
             "scan": lambda tx: tx.scan("dropped_later", {"id": 1}), "insert": lambda tx: tx.insert("dropped_later", id=2)}
    for name, read in reads.items():
        with pytest.raises(activedb.DatabaseError, match=r"SQLSTATE 42703\): column .*gone.* does not exist\. The table "
                                                         r"may have changed since this process read it .*call "
                                                         r"db\.schema\.refresh\(\) and retry") as caught:
            with db.transaction() as tx:
                read(tx)
        assert caught.value.sqlstate == "42703", name
    db.schema.refresh()                           # the table as it is now: reads work again
    with db.transaction() as tx:
        assert tx.read("dropped_later", 1) == {"id": 1}


@pytest.mark.parametrize("change, sqlstate", [("ALTER TABLE {table} DROP COLUMN gone", "42703"),
                                              ("ALTER TABLE {table} RENAME TO {table}_renamed", "42P01")])
def test_a_commit_refused_for_a_column_or_table_gone_since_says_to_refresh(db, change, sqlstate):
    """A column dropped (or the table renamed) by another process's migration between a transaction's write and its
    commit: the commit is refused with PostgreSQL's undefined_column (42703) or undefined_table (42P01), and said
    only "Check the message above" — the reads' hint (the table may have changed since this process read it, call
    ``db.schema.refresh()``) was not given at commit.  It is now, and the refresh lets the transaction run again."""
    table = f"gone_at_commit_{sqlstate.lower()}"
    with db.engine.begin() as connection:
        connection.execute(sa.text(f"CREATE TABLE {table} (id integer PRIMARY KEY, gone text)"))
    with pytest.raises(activedb.DatabaseError, match=rf"SQLSTATE {sqlstate}\).*nothing was written\. The table may "
                                                     r"have changed since this process read it .*call "
                                                     r"db\.schema\.refresh\(\) and retry") as caught:
        with db.transaction() as tx:
            tx.write(table, 1, gone="x")
            with db.engine.begin() as connection:
                connection.execute(sa.text(change.format(table=table)))
    assert caught.value.sqlstate == sqlstate
    with db.engine.begin() as connection:
        connection.execute(sa.text(f"ALTER TABLE IF EXISTS {table}_renamed RENAME TO {table}"))
    db.schema.refresh()
    db.run(lambda tx: tx.write(table, 1))
