"""Capture is part of the schema history: an application's revision enables it, its downgrade removes
everything it installed; activedb's own revision ``0004_capture`` round-trips too."""

from __future__ import annotations

import psycopg
import sqlalchemy as sa

import activedb
from activedb import _migrate
from tests.capture.conftest import MIGRATIONS, libpq


def schema_objects(db) -> set[str]:
    """Every table, index, sequence, trigger, constraint and function of the public schema, by name."""
    with db.engine.connect() as connection:
        return set(connection.execute(sa.text("""
            SELECT 'relation:' || relname FROM pg_class
             WHERE relnamespace = 'public'::regnamespace AND relkind IN ('r', 'S', 'i', 'v')
            UNION ALL
            SELECT 'trigger:' || tgrelid::regclass || ':' || tgname FROM pg_trigger WHERE NOT tgisinternal
            UNION ALL
            SELECT 'constraint:' || conrelid::regclass || ':' || conname FROM pg_constraint
             WHERE connamespace = 'public'::regnamespace
            UNION ALL
            SELECT 'function:' || proname FROM pg_proc WHERE pronamespace = 'public'::regnamespace
        """)).scalars())


def rows(db, sql: str) -> list[tuple]:
    with db.engine.connect() as connection:
        return [tuple(row) for row in connection.execute(sa.text(sql))]


def test_the_applications_capture_revision_round_trips(database_url):
    db = activedb.connect(database_url)
    try:
        db.upgrade_app(MIGRATIONS, "c0001")
        before = schema_objects(db)
        db.upgrade_app(MIGRATIONS, "c0002")
        installed = schema_objects(db) - before
        assert installed == {"trigger:orders:activedb_capture", "trigger:typed_samples:activedb_capture"}
        assert rows(db, "SELECT table_name FROM activedb_capture_tables ORDER BY 1") == [("orders",),
                                                                                         ("typed_samples",)]
        with psycopg.connect(libpq(database_url), autocommit=True) as psql:
            psql.execute("INSERT INTO orders (id, customer, amount) VALUES (1, 'a', 1)")
            psql.execute("INSERT INTO order_log (rule, kind) VALUES ('not', 'captured')")
        assert rows(db, "SELECT table_oid::regclass::text FROM activedb_capture_changes") == [("orders",)]

        db.schema.downgrade_app(MIGRATIONS, "c0001")
        assert schema_objects(db) == before
        assert rows(db, "SELECT count(*) FROM activedb_capture_tables") == [(0,)]
        assert rows(db, "SELECT count(*) FROM activedb_capture_changes") == [(0,)]
        assert rows(db, "SELECT count(*) FROM activedb_capture_commits") == [(0,)]
        with psycopg.connect(libpq(database_url), autocommit=True) as psql:
            psql.execute("INSERT INTO orders (id, customer, amount) VALUES (2, 'a', 1)")
        assert rows(db, "SELECT count(*) FROM activedb_capture_changes") == [(0,)]

        db.upgrade_app(MIGRATIONS, "c0002")
        assert schema_objects(db) - before == installed
    finally:
        db.close()


def test_activedbs_capture_revision_round_trips_and_takes_the_per_table_triggers_with_it(database_url):
    db = activedb.connect(database_url)
    try:
        db.upgrade_app(MIGRATIONS, "c0002")          # capture on, from the application's revision
        with_capture = schema_objects(db)
        db.schema.downgrade("0003_removed_rules_and_replays")
        without = schema_objects(db)
        assert not {name for name in without if "activedb_capture" in name}
        assert with_capture - without >= {"relation:activedb_capture_changes", "function:activedb_capture_row",
                                          "trigger:orders:activedb_capture", "function:activedb_capture_sequence"}
        # The application's downgrade still works once activedb's capture tables are gone (idempotent).
        db.schema.downgrade_app(MIGRATIONS, "c0001")
        # Enabling capture without activedb's tables says what to do.
        try:
            db.upgrade_app(MIGRATIONS, "c0002")
        except activedb.MigrationError as error:
            assert "capture tables are missing" in str(error)
        else:
            raise AssertionError("enable_capture ran without activedb's capture tables")
        db.schema.upgrade("head")
        assert db.schema.current_revision() == _migrate.head()
        db.upgrade_app(MIGRATIONS, "c0002")
        assert schema_objects(db) == with_capture
    finally:
        db.close()


def test_capture_revisions_print_as_offline_sql():
    activedbs = _migrate.offline_sql("postgresql+psycopg://", "upgrade", "head")
    assert "CREATE CONSTRAINT TRIGGER activedb_capture_sequence" in activedbs
    assert "DROP TABLE activedb_capture_changes" in _migrate.offline_sql(
        "postgresql+psycopg://", "downgrade", "0004_capture:0003_removed_rules_and_replays")


def test_the_log_row_revision_upgrades_a_log_with_rows_and_round_trips(database_url):
    db = activedb.connect(database_url)
    try:
        db.upgrade_app(MIGRATIONS, "c0002")
        db.schema.downgrade("0009_dead_letter_originals")
        db.run(lambda tx: tx.insert("orders", id=90, customer="own", amount=1))    # a log row written before
        assert "trigger:activedb_transaction_log:activedb_capture_own_writes" in schema_objects(db)
        db.schema.upgrade("head")
        assert "trigger:activedb_transaction_log:activedb_capture_own_writes" not in schema_objects(db)
        assert rows(db, "SELECT prosecdef, proconfig FROM pg_proc WHERE proname = 'activedb_capture_sequence'") \
            == [(True, ["search_path=pg_catalog, pg_temp"])]
        assert rows(db, "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid "
                        "AND a.attnum = ANY(i.indkey) WHERE i.indrelid = 'activedb_transaction_log'::regclass "
                        "AND i.indisprimary") == [("transaction_id",)]
        db.run(lambda tx: tx.insert("orders", id=91, customer="own", amount=1))
        assert rows(db, "SELECT count(*) FROM activedb_transaction_log") >= [(2,)]
        assert rows(db, "SELECT count(*) FROM activedb_capture_changes WHERE table_oid = 'orders'::regclass "
                        "AND (new_row ->> 'id')::int IN (90, 91)") == [(0,)]
    finally:
        db.close()


def test_the_trust_revision_keeps_pending_changes_across_its_upgrade_and_downgrade(database_url):
    """``0013_capture_trust`` turns the change rows' table names into oids and back, and takes EXECUTE on the
    capture functions from PUBLIC (and gives it back)."""
    executable = ("SELECT has_function_privilege('public', 'activedb_capture_row()', 'EXECUTE'), "
                  "has_function_privilege('public', 'activedb_capture_sequence()', 'EXECUTE')")
    db = activedb.connect(database_url)
    seen = []
    try:
        db.upgrade_app(MIGRATIONS, "c0002")
        with db.engine.begin() as connection:
            connection.execute(sa.text("TRUNCATE orders, activedb_capture_changes, activedb_capture_commits, "
                                       "activedb_capture_consumers"))
        db.schema.downgrade("0012_stream_state_as_json")
        assert rows(db, executable) == [(True, True)]

        def insert(key: int) -> None:
            with psycopg.connect(libpq(database_url), autocommit=True) as psql:
                psql.execute("INSERT INTO orders (id, customer, amount) VALUES (%s, 'a', 1)", (key,))

        insert(1)                                       # recorded by name
        db.schema.upgrade("head")
        assert rows(db, executable) == [(False, False)]
        insert(2)                                       # recorded by oid
        assert rows(db, "SELECT table_oid::regclass::text, first_of_transaction FROM activedb_capture_changes "
                        "ORDER BY id") == [("orders", True), ("orders", True)]
        db.schema.downgrade("0012_stream_state_as_json")
        assert rows(db, "SELECT table_name FROM activedb_capture_changes ORDER BY id") == [("orders",), ("orders",)]
        db.schema.upgrade("head")

        @db.rule(on=db.captured("orders", "inserted"), coupling="detached")
        def collect(tx, event):
            seen.append(event.key)

        db.capture.consumer().run_until_caught_up()
        assert seen == [1, 2]
    finally:
        db.close()


def test_the_consumer_ids_revision_gives_each_registered_consumer_an_id_its_locks_are_keyed_by_and_round_trips(
        database_url):
    """``0020_capture_consumer_ids`` gives the consumers registered before it ids of their own (distinct: a name's
    advisory locks are keyed by its row's id, no longer by a hash two names could share), keeps their positions, and
    its downgrade drops the column and keeps the rows."""
    db = activedb.connect(database_url)
    try:
        db.schema.downgrade("0019_split_salt")
        with db.engine.begin() as connection:
            connection.execute(sa.text("DELETE FROM activedb_capture_consumers"))    # (the module's database)
            connection.execute(sa.text("INSERT INTO activedb_capture_consumers (name, position, change_id) "
                                       "VALUES ('before-a', 7, 3), ('before-b', 0, 0)"))
        db.schema.upgrade("head")
        ids = dict(rows(db, "SELECT name, id FROM activedb_capture_consumers"))
        assert sorted(ids) == ["before-a", "before-b"] and None not in ids.values() and len(set(ids.values())) == 2
        consumer = db.capture.consumer("before-a")
        try:
            assert consumer.run_until_caught_up() == 0
            assert consumer.leadership_lock is not None and consumer.leadership_lock[1] == ids["before-a"]
            assert consumer.position == activedb.capture.Position(7, 3)
        finally:
            consumer.close()
        db.schema.downgrade("0019_split_salt")
        assert rows(db, "SELECT name, position, change_id FROM activedb_capture_consumers ORDER BY name") == [
            ("before-a", 7, 3), ("before-b", 0, 0)]
        db.schema.upgrade("head")
        assert len(set(dict(rows(db, "SELECT name, id FROM activedb_capture_consumers")).values())) == 2
    finally:
        db.close()
