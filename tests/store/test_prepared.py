"""A tree that reads a row for update sends ``BEGIN …; SELECT … FOR UPDATE`` and, at its flush, ``…; COMMIT`` as
query strings bound on the client; their statements run prepared on the server (``activedb.store._prepared``):
prepared once per connection, executed afterwards, and the registry of what is prepared stays right when the
driver deallocates everything at a rollback, when something else deallocates them, when a column changes type
under a prepared read, when a string that prepared a statement fails, and when more shapes come than are kept.
Real PostgreSQL; the capture tests' ``typed_samples`` table."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from activedb.errors import DuplicateKey
from activedb.store import Entry, EntryKind, TableInfo, apply_write_set, lock_row
from activedb.store import _prepared as prepared
from tests.store.conftest import typed_samples_tables


db_options = pytest.fixture(scope="module", name="db_options")(typed_samples_tables)


@pytest.fixture
def samples(samples):
    db = samples
    with db.transaction() as tx:
        for number in (1, 2):
            tx.insert("typed_samples", id=number, label="before", small=0)
    return db


def held_tree(db, key: int, **values) -> None:
    """A tree that reads row ``key`` for update and writes ``values`` into it: its flush runs in the transaction
    that holds the row, the last statement folded with ``COMMIT``."""
    with db.transaction() as tx:
        tx.read("typed_samples", key, for_update=True)
        tx.write("typed_samples", key, **values)


def on_server(connection) -> dict[str, int]:
    """This session's statements prepared by activedb: name → executions (generic and custom plans)."""
    found = dict(connection.exec_driver_sql(
        "SELECT name, generic_plans + custom_plans FROM pg_prepared_statements "
        "WHERE starts_with(name, 'activedb_')").all())
    connection.commit()           # (SQLAlchemy began a transaction: a connection given back inside one is closed)
    return found


class Kept:
    """The connection the trees of one thread ran on (``Catalog.idle`` keeps it), taken out for a look."""

    def __init__(self, db):
        self.idle = db.catalog.idle

    def __enter__(self):
        self.connection = self.idle.take()
        return self.connection

    def __exit__(self, *exc):
        self.idle.give_back(self.connection)


def labels(db) -> dict[int, str]:
    with db.engine.connect() as connection:
        return dict(connection.execute(sa.text("SELECT id, label FROM typed_samples ORDER BY id")).all())


def test_statements_are_prepared_by_the_first_tree_and_executed_by_the_next_ones(samples):
    db = samples
    for number in range(3):
        held_tree(db, 1, label=f"run {number}")
    assert labels(db) == {1: "run 2", 2: "before"}
    with Kept(db) as connection:
        names = prepared.prepared_names(connection)
        executed = on_server(connection)
    assert len(names) == 2 and any("FOR UPDATE" in statement for statement in names)   # the read and the write
    assert executed == {name: 3 for name in names.values()}          # prepared once, executed by every tree


def test_a_rollback_that_deallocates_every_statement_is_noticed_before_the_next_use(samples):
    """The driver sends ``DEALLOCATE ALL`` when it rolls back a connection on which it prepared statements of its
    own: the registry is checked against the server before the connection's next use — here a flush's last
    statement, which could not be sent again in its transaction."""
    db = samples
    info = db.catalog.table_info("typed_samples")
    infos = {"typed_samples": info}

    def write(label: str, along_id: int) -> None:
        apply_write_set(connection, infos, {("typed_samples", (1,)): Entry(EntryKind.PATCH, {"label": label})},
                        along=("INSERT INTO typed_samples (id, label) VALUES (%s, %s)", (along_id, "along")),
                        commit=True)

    with db.engine.connect() as connection:
        connection = connection.execution_options(isolation_level="AUTOCOMMIT")
        prepared.watch(connection)
        driver = connection.connection.driver_connection
        try:
            assert lock_row(connection, info, (1,), lock_timeout="1s", begin="READ COMMITTED") is not None
            write("first", 70)                                 # the read and the write are prepared
            assert len(prepared.prepared_names(connection)) == 2
            for _ in range(driver.prepare_threshold + 1):      # the driver prepares a statement of its own
                driver.execute("SELECT %s::int", (1,))
            connection.begin()                                 # as a tree's read for update does
            driver.execute("BEGIN")
            connection.rollback()                              # → ROLLBACK, then the driver's DEALLOCATE ALL
            assert on_server(connection) == {}
            driver.execute("BEGIN")
            write("second", 71)                                # the write's statement first: prepared again
            assert set(on_server(connection)) == set(prepared.prepared_names(connection).values())
        finally:
            connection.invalidate()
    assert labels(db) == {1: "second", 2: "before", 70: "along", 71: "along"}


def test_statements_deallocated_behind_the_registrys_back_are_prepared_again(samples):
    """``DEALLOCATE ALL`` sent on the connection without a rollback: the read for update fails once with SQLSTATE
    26000, rolls back its transaction and is sent again; the flush's statement is then prepared again too."""
    db = samples
    held_tree(db, 1, label="first")
    with Kept(db) as connection:
        connection.exec_driver_sql("DEALLOCATE ALL")
        connection.commit()
    held_tree(db, 1, label="second")
    held_tree(db, 2, label="third")
    assert labels(db) == {1: "second", 2: "third"}
    with Kept(db) as connection:
        names = prepared.prepared_names(connection)
        assert on_server(connection) == {name: 2 for name in names.values()}


def test_a_read_for_update_whose_column_changed_type_is_prepared_again(db):
    """A prepared ``SELECT`` whose column changed type fails with 0A000 ("cached plan must not change result
    type"): the read rolls back and prepares it again, and reads the row as PostgreSQL now has it."""
    table = sa.Table("reshaped", sa.MetaData(), sa.Column("id", sa.Integer, primary_key=True),
                     sa.Column("v", sa.Integer))
    info = TableInfo(table)
    with db.engine.connect() as connection:
        connection = connection.execution_options(isolation_level="AUTOCOMMIT")
        prepared.watch(connection)
        driver = connection.connection.driver_connection
        try:
            # A session's own table (not the schema: migrations make that), to change a column's type under it.
            connection.exec_driver_sql("CREATE TEMPORARY TABLE reshaped (id int PRIMARY KEY, v int)")
            connection.exec_driver_sql("INSERT INTO reshaped VALUES (1, 7)")
            assert lock_row(connection, info, (1,), lock_timeout="1s", begin="READ COMMITTED") == {"id": 1, "v": 7}
            driver.rollback()
            connection.exec_driver_sql("ALTER TABLE reshaped ALTER COLUMN v TYPE text")
            assert lock_row(connection, info, (1,), lock_timeout="1s", begin="READ COMMITTED") == {"id": 1, "v": "7"}
            driver.rollback()
            assert set(on_server(connection)) >= set(prepared.prepared_names(connection).values())
        finally:
            connection.invalidate()        # the temporary table goes with the session


def test_a_failing_string_that_prepared_a_statement_leaves_none_behind(samples):
    """The first flush of a shape fails after its ``PREPARE`` ran (the row it inserts exists): the statement is on
    the server but the registry cannot know it; the next use asks the server and deallocates it."""
    db = samples
    info = db.catalog.table_info("typed_samples")
    with db.engine.connect() as connection:
        connection = connection.execution_options(isolation_level="AUTOCOMMIT")
        prepared.watch(connection)
        driver = connection.connection.driver_connection
        assert lock_row(connection, info, (1,), lock_timeout="1s", begin="READ COMMITTED") is not None
        with pytest.raises(DuplicateKey):
            apply_write_set(connection, {"typed_samples": info},
                            {("typed_samples", (2,)): Entry(EntryKind.INSERT, {"label": "again"})},
                            along=("INSERT INTO typed_samples (id, label) VALUES (%s, %s)", (50, "along")), commit=True)
        driver.rollback()
        prepared.rolled_back(connection)
        left = set(on_server(connection)) - set(prepared.prepared_names(connection).values())
        assert len(left) == 1                                   # prepared by the string that failed
        assert lock_row(connection, info, (2,), lock_timeout="1s", begin="READ COMMITTED") is not None
        apply_write_set(connection, {"typed_samples": info},
                        {("typed_samples", (2,)): Entry(EntryKind.PATCH, {"label": "after"})},
                        along=("INSERT INTO typed_samples (id, label) VALUES (%s, %s)", (51, "along")), commit=True)
        names = prepared.prepared_names(connection)
        assert set(on_server(connection)) == set(names.values()) and len(names) == 2 and not left & set(names.values())
    assert labels(db) == {1: "before", 2: "after", 51: "along"}


def test_at_most_kept_statements_stay_prepared_per_connection(samples, monkeypatch):
    monkeypatch.setattr(prepared, "KEPT", 2)
    db = samples
    for column in ("label", "small", "big", "real"):       # the read and four write shapes
        held_tree(db, 1, **{column: 1 if column != "label" else "x"})
    with Kept(db) as connection:
        names = prepared.prepared_names(connection)
        assert len(names) == 2 and set(on_server(connection)) == set(names.values())


def test_without_the_drivers_prepared_statements_nothing_is_prepared(samples):
    """``prepare_threshold=None`` (what a pooler in transaction mode needs): the strings go as they are."""
    db = samples
    info = db.catalog.table_info("typed_samples")
    with db.engine.connect() as connection:
        connection = connection.execution_options(isolation_level="AUTOCOMMIT")
        driver = connection.connection.driver_connection
        driver.prepare_threshold = None
        try:
            before = on_server(connection), prepared.prepared_names(connection)  # (an earlier checkout's, if any)
            assert lock_row(connection, info, (1,), lock_timeout="1s", begin="READ COMMITTED")["label"] == "before"
            apply_write_set(connection, {"typed_samples": info},
                            {("typed_samples", (1,)): Entry(EntryKind.PATCH, {"label": "plain"})},
                            along=("INSERT INTO typed_samples (id, label) VALUES (%s, %s)", (60, "along")), commit=True)
            assert (on_server(connection), prepared.prepared_names(connection)) == before
        finally:
            connection.invalidate()
    assert labels(db)[1] == "plain"


def test_server_sql_numbers_the_parameters_and_keeps_escaped_percents():
    assert prepared.server_sql("SELECT %s, '%%', %s") == "SELECT $1, '%%', $2"
    with pytest.raises(ValueError):
        prepared.server_sql("SELECT %(name)s")
