"""Capture's trust model (``activedb/capture/README.md``, "Who may write what"): a second PostgreSQL role —
one that may connect, and write ``orders`` where a test grants it that — can neither forge captured changes
nor hide its own, and table names reach PostgreSQL quoted by its own rules.

On the embedded server the superuser creates the second role; against another server (``.ci/run``'s server
part) ``ACTIVEDB_TEST_OTHER_URL`` names one (``.ci/with-distribution-postgres`` creates it).
"""

from __future__ import annotations

import contextlib
import io
import re
import threading

import psycopg
import pytest
import sqlalchemy as sa
from psycopg import sql

import activedb
from activedb import UnknownTable
from activedb.capture import CaptureError, ConsumerState
from activedb.testing import Watchdog, wait_until
from tests._roles import other_role

TIMEOUT = 60


@pytest.fixture(scope="module")
def other(pg_server, database_url) -> str:
    """A libpq connection string of a second role, without any privilege of its own, on this module's database."""
    return other_role(pg_server, sa.make_url(database_url).database, "the trust tests need")[1]


def collect_inserted(db, table: str = "orders") -> list:
    seen: list = []

    @db.rule(on=db.captured(table, "inserted"), coupling="detached", name=f"collect_{len(db.rules.names())}")
    def collect(tx, event):
        seen.append(event.key)

    return seen


def dead_letters(db) -> list[str]:
    with db.engine.connect() as connection:
        return list(connection.execute(sa.text("SELECT reason FROM activedb_dead_letters ORDER BY 1")).scalars())


def test_a_second_role_cannot_forge_captured_changes(clean, conninfo, other):
    db = clean
    seen = collect_inserted(db)
    refused = []
    with psycopg.connect(other, autocommit=True) as mallory:
        role = mallory.execute("SELECT current_user, has_table_privilege('orders', 'INSERT')").fetchone()
        assert role[0] != db.engine.url.username and role[1] is False
        # A temporary table named like the captured one, with a trigger calling capture's function ...
        mallory.execute("CREATE TEMPORARY TABLE orders (id bigint PRIMARY KEY, customer text, amount numeric, "
                        "status text)")
        for function in ("activedb_capture_sequence", "activedb_capture_own_writes", "activedb_capture_row"):
            try:
                mallory.execute(f"CREATE TRIGGER activedb_capture AFTER INSERT ON pg_temp.orders "
                                f"FOR EACH ROW EXECUTE FUNCTION public.{function}()")
            except (psycopg.errors.InsufficientPrivilege, psycopg.errors.UndefinedFunction):
                refused.append(function)
            else:
                if function != "activedb_capture_row":
                    mallory.execute("DROP TRIGGER activedb_capture ON pg_temp.orders")
        mallory.execute("INSERT INTO pg_temp.orders VALUES (666, 'mallory', 1, 'new')")
        # ... nor can its own trigger function write capture's tables.
        for statement in ("INSERT INTO activedb_capture_changes (xid, table_oid, operation, new_row) "
                          "VALUES (pg_current_xact_id(), 'orders'::regclass, 'I', '{\"id\": 667}')",
                          "INSERT INTO activedb_capture_commits VALUES (999, pg_current_xact_id(), now())",
                          "UPDATE activedb_capture_tables SET table_oid = 'pg_temp.orders'::regclass"):
            with pytest.raises((psycopg.errors.InsufficientPrivilege, psycopg.errors.UndefinedColumn)):
                mallory.execute(statement)
    with psycopg.connect(conninfo, autocommit=True) as owner:
        owner.execute("INSERT INTO orders (id, customer, amount) VALUES (1, 'real', 1)")
    db.capture.consumer().run_until_caught_up()
    assert seen == [1]
    assert refused == ["activedb_capture_sequence", "activedb_capture_own_writes", "activedb_capture_row"]


def test_a_second_role_that_may_write_the_table_cannot_hide_its_changes(clean, other):
    db = clean
    seen = collect_inserted(db)
    with db.engine.begin() as connection:
        connection.execute(sa.text(f"GRANT INSERT, UPDATE, DELETE, SELECT ON orders TO {_role(other)}"))
    try:
        with psycopg.connect(other) as mallory:
            # activedb's own-write mark, set before writing (the row trigger) ...
            mallory.execute("SELECT set_config('activedb.capture_xact', 'activedb', true)")
            mallory.execute("INSERT INTO orders (id, customer, amount) VALUES (777, 'mallory', 1)")
            mallory.commit()
            # ... after writing (the commit sequencer) ...
            mallory.execute("INSERT INTO orders (id, customer, amount) VALUES (778, 'mallory', 1)")
            mallory.execute("SELECT set_config('activedb.capture_xact', 'activedb', true)")
            mallory.commit()
            # ... or claiming that its first change was already recorded (no commit position would follow).
            mallory.execute("SELECT set_config('activedb.capture_xact', pg_current_xact_id()::text, true)")
            mallory.execute("INSERT INTO orders (id, customer, amount) VALUES (779, 'mallory', 1)")
            mallory.commit()
            # Switching triggers off takes the table's owner or a superuser; deleting changes, activedb's role.
            for statement in ("SET session_replication_role = replica",
                              "ALTER TABLE orders DISABLE TRIGGER activedb_capture",
                              "DELETE FROM activedb_capture_changes"):
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    mallory.execute(statement)
                mallory.rollback()
        db.capture.consumer().run_until_caught_up()
        assert seen == [777, 778, 779]
        assert dead_letters(db) == []
    finally:
        with db.engine.begin() as connection:
            connection.execute(sa.text(f"REVOKE ALL ON orders FROM {_role(other)}"))


def _role(conninfo: str) -> str:
    return psycopg.conninfo.conninfo_to_dict(conninfo)["user"]


def test_a_trigger_activedb_did_not_install_delivers_nothing_as_a_captured_table(clean, conninfo):
    """Changes are recorded by table oid: ``orders`` of another schema, even with capture's function attached
    by hand (by a role allowed to), is not the captured ``orders``."""
    db = clean
    seen = collect_inserted(db)
    with psycopg.connect(conninfo, autocommit=True) as owner:
        owner.execute("DROP SCHEMA IF EXISTS elsewhere CASCADE")
        owner.execute("CREATE SCHEMA elsewhere")
        try:
            owner.execute("CREATE TABLE elsewhere.orders (LIKE public.orders INCLUDING ALL)")
            owner.execute("CREATE TRIGGER activedb_capture AFTER INSERT ON elsewhere.orders "
                          "FOR EACH ROW EXECUTE FUNCTION public.activedb_capture_row()")
            with pytest.raises(psycopg.errors.RaiseException, match="activedb_capture"):
                owner.execute("CREATE TRIGGER by_hand AFTER INSERT ON public.orders "
                              "FOR EACH ROW EXECUTE FUNCTION public.activedb_capture_row()")
                owner.execute("INSERT INTO public.orders (id, customer, amount) VALUES (556, 'by hand', 1)")
            owner.execute("DROP TRIGGER by_hand ON public.orders")
            owner.execute("INSERT INTO elsewhere.orders (id, customer, amount) VALUES (555, 'elsewhere', 1)")
            owner.execute("INSERT INTO public.orders (id, customer, amount) VALUES (2, 'real', 1)")
            db.capture.consumer().run_until_caught_up()
        finally:
            owner.execute("DROP TRIGGER IF EXISTS by_hand ON public.orders")
            owner.execute("DROP SCHEMA elsewhere CASCADE")
    assert seen == [2]
    [reason] = dead_letters(db)
    assert "elsewhere.orders" in reason and "not captured" in reason


@pytest.mark.parametrize("name", ['wei"rd$body$x', "it's \\ a $$ table"])
def test_table_names_are_quoted_by_postgresqls_rules(clean, conninfo, name):
    db = clean
    table = sa.Table(name, sa.MetaData(), sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=False),
                     sa.Column("note", sa.Text))
    table.create(db.engine)
    try:
        assert db.capture(name).trigger_installed
        seen = collect_inserted(db, name)
        with psycopg.connect(conninfo, autocommit=True) as psql:
            psql.execute(sql.SQL("INSERT INTO {} (id, note) VALUES (5, 'x')").format(sql.Identifier(name)))
        db.capture.consumer().run_until_caught_up()
        assert seen == [5]
        db.capture.remove(name)
        assert name not in {captured.name for captured in db.capture.tables()}
        with db.engine.connect() as connection:
            triggers = connection.execute(sa.text("SELECT count(*) FROM pg_trigger WHERE tgrelid = CAST(:t AS regclass)"),
                                          {"t": sql.Identifier(name).as_string()}).scalar()
        assert triggers == 0
    finally:
        for rule in db.rules.names():
            db.rules.remove(rule)
        table.drop(db.engine)


def test_enable_and_disable_capture_print_offline_sql_that_quotes_any_name(clean, conninfo):
    """``alembic upgrade --sql`` of an application's revision: the name is a literal in a ``set_config`` call,
    PostgreSQL quotes it where SQL needs it; the printed script runs as is (psql)."""
    from alembic.migration import MigrationContext
    from alembic.operations import Operations

    from activedb.capture.migration_ops import disable_capture, enable_capture

    db = clean
    name = "o'neil \"quoted\" $body$; DROP TABLE orders; --"
    table = sa.Table(name, sa.MetaData(), sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=False))
    table.create(db.engine)
    try:
        for step, installed in ((enable_capture, 1), (disable_capture, 0)):
            script = io.StringIO()
            context = MigrationContext.configure(dialect_name="postgresql", opts={
                "as_sql": True, "output_buffer": script, "literal_binds": True})
            step(Operations(context), name)
            with psycopg.connect(conninfo, autocommit=True) as psql:
                psql.execute(script.getvalue())
                triggers = psql.execute("SELECT count(*) FROM pg_trigger WHERE tgrelid = %s::regclass "
                                        "AND tgname = 'activedb_capture'", (sql.Identifier(name).as_string(),))
                assert triggers.fetchone() == (installed,)
            assert [captured.name for captured in db.capture.tables() if captured.name == name] == [name] * installed
        assert db.capture.is_captured("orders")
        with pytest.raises(UnknownTable, match="without NUL characters"):
            enable_capture(Operations(context), "no\x00such")
    finally:
        table.drop(db.engine)


def test_a_second_role_cannot_stall_capturing_commits(clean, conninfo, other):
    """Capturing commits take their turn on a table lock only activedb's role may take (an advisory lock, which
    any role may hold, made every capturing commit wait for whoever held it)."""
    db = clean
    seen = collect_inserted(db)
    with psycopg.connect(other, autocommit=True) as mallory:
        mallory.execute("SELECT pg_advisory_lock(1633968739, 0)")       # the sequencer's advisory lock until 0014
        with psycopg.connect(conninfo) as writer:
            writer.execute("SET lock_timeout = '20s'")                   # bounded: fails instead of hanging
            writer.execute("INSERT INTO orders (id, customer, amount) VALUES (3, 'not stalled', 1)")
            writer.commit()
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            mallory.execute("BEGIN; LOCK TABLE activedb_capture_sequencer IN SHARE ROW EXCLUSIVE MODE")
        mallory.execute("ROLLBACK")
    db.capture.consumer().run_until_caught_up()
    assert seen == [3]


def connected_as(other: str, database_url: str) -> activedb.Database:
    """activedb connected to the tests' database as the role of the libpq string ``other`` (its schema left as is)."""
    settings = psycopg.conninfo.conninfo_to_dict(other)
    return activedb.connect(sa.make_url(database_url).set(username=settings["user"], password=settings["password"]),
                            upgrade=False)


def test_a_role_without_the_privileges_capture_takes_is_told_which_and_the_grants_to_run(clean, database_url, other):
    """db.capture(table) by a role that lacks what it takes — TRIGGER on the table, EXECUTE on activedb_capture_row(),
    its rights on the registry — is refused naming every missing privilege and the GRANTs that give them; run by their
    owners, those GRANTs are enough.  It said only PostgreSQL's first refusal ("permission denied for table orders",
    then "… for function activedb_capture_row"), one privilege at a time and nothing of what to run."""
    db = clean
    role = _role(other)
    as_other = connected_as(other, database_url)
    try:
        with pytest.raises(CaptureError) as refused:
            as_other.capture("orders")
        said = str(refused.value)
        assert f"role {role} lacks" in said, said
        for privilege in ("TRIGGER on table public.orders", "EXECUTE on function public.activedb_capture_row()",
                          "SELECT, INSERT, UPDATE, DELETE on table public.activedb_capture_tables"):
            assert privilege in said, said
        grants = re.findall(r"GRANT [^;]+;", said)
        assert len(grants) == 3, said
        with db.engine.begin() as connection:        # activedb's role: the owner of orders and of capture's objects
            for grant in grants:
                connection.execute(sa.text(grant))
        assert as_other.capture("orders").trigger_installed
    finally:
        as_other.close()
        with db.engine.begin() as connection:
            connection.execute(sa.text(f"REVOKE ALL ON orders, activedb_capture_tables FROM {role}"))
            connection.execute(sa.text(f"REVOKE ALL ON FUNCTION activedb_capture_row() FROM {role}"))
    assert db.capture.is_captured("orders")


def test_a_consumer_whose_role_lacks_what_consuming_takes_is_told_which_and_the_grants_to_run(clean, database_url,
                                                                                               other):
    """A capture consumer connected as a role without its rights on capture's tables stops with a CaptureError
    naming every missing privilege and the GRANTs that give them, before it changes anything.  It raised
    SQLAlchemy's ProgrammingError "permission denied for table activedb_capture_consumers" with the statement (and
    after that grant the next table's, one at a time)."""
    db = clean
    role = _role(other)
    as_other = connected_as(other, database_url)
    try:
        with pytest.raises(CaptureError) as refused:
            as_other.capture.consumer().run_until_caught_up()
        said = str(refused.value)
        assert f"cannot consume as role {role}: the role lacks" in said, said
        for privilege in ("SELECT, INSERT, UPDATE on table public.activedb_capture_consumers",
                          "SELECT, DELETE on table public.activedb_capture_changes",
                          "SELECT, DELETE on table public.activedb_capture_commits",
                          "SELECT on table public.activedb_capture_tables"):
            assert privilege in said, said
        grants = re.findall(r"GRANT [^;]+;", said)
        assert len(grants) == 4, said
        with db.engine.begin() as connection:
            for grant in grants:
                connection.execute(sa.text(grant))
        try:        # what fails next (if anything) is no longer one of capture's own tables
            as_other.capture.consumer("second").run_until_caught_up()
        except Exception as error:  # noqa: BLE001 — (the ingestion's tables take their own grants)
            assert "activedb_capture_" not in str(error), error
    finally:
        as_other.close()
        with db.engine.begin() as connection:
            connection.execute(sa.text(f"REVOKE ALL ON activedb_capture_consumers, activedb_capture_changes, "
                                       f"activedb_capture_commits, activedb_capture_tables FROM {role}"))


@pytest.mark.parametrize("call, cannot, privileges", [
    (lambda capture: capture.status(), "cannot read capture's status as role",
     ("SELECT on table public.activedb_capture_consumers", "SELECT on table public.activedb_capture_changes",
      "SELECT on table public.activedb_capture_commits", "SELECT on table public.activedb_capture_tables")),
    (lambda capture: capture.prune(), "cannot prune captured changes as role",
     ("SELECT on table public.activedb_capture_consumers", "SELECT, DELETE on table public.activedb_capture_changes",
      "SELECT, DELETE on table public.activedb_capture_commits")),
], ids=["status", "prune"])
def test_status_and_prune_by_a_role_without_their_rights_say_which_and_the_grants_to_run(clean, database_url, other,
                                                                                        call, cannot, privileges):
    """db.capture.status() and prune() by a role without their rights on capture's tables raise a CaptureError naming
    every missing privilege and the GRANTs that give them (the consumer's check); those GRANTs are enough.  They raised
    SQLAlchemy's ProgrammingError "permission denied for table activedb_capture_…" with the statement."""
    db = clean
    role = _role(other)
    as_other = connected_as(other, database_url)
    try:
        with pytest.raises(CaptureError) as refused:
            call(as_other.capture)
        said = str(refused.value)
        assert f"{cannot} {role}: the role lacks" in said, said
        for privilege in privileges:
            assert privilege in said, said
        grants = re.findall(r"GRANT [^;]+;", said)
        assert len(grants) == len(privileges), said
        with db.engine.begin() as connection:
            for grant in grants:
                connection.execute(sa.text(grant))
        call(as_other.capture)
    finally:
        as_other.close()
        with db.engine.begin() as connection:
            connection.execute(sa.text(f"REVOKE ALL ON activedb_capture_consumers, activedb_capture_changes, "
                                       f"activedb_capture_commits, activedb_capture_tables FROM {role}"))


def test_remove_by_a_role_that_may_capture_but_does_not_own_the_table_says_who_can(clean, database_url, other):
    """A role with TRIGGER on a captured table (and what else capturing takes) may capture it, but dropping the
    trigger takes its ownership: db.capture.remove by that role is a CaptureError saying who may (the table's owner,
    or a superuser) and what to do, and changes nothing.  It said PostgreSQL's plain "must be owner of table
    orders"."""
    db = clean
    role = _role(other)
    with db.engine.connect() as connection:
        owner = connection.execute(sa.text("SELECT quote_ident(current_user)")).scalar_one()
        connection.execute(sa.text(f"GRANT TRIGGER ON orders TO {role}"))
        connection.execute(sa.text(f"GRANT EXECUTE ON FUNCTION activedb_capture_row() TO {role}"))
        connection.execute(sa.text(f"GRANT SELECT, INSERT, UPDATE, DELETE ON activedb_capture_tables TO {role}"))
        connection.commit()
    as_other = connected_as(other, database_url)
    try:
        assert as_other.capture("orders").trigger_installed          # TRIGGER is enough to capture it
        with pytest.raises(CaptureError) as refused:
            as_other.capture.remove("orders")
        said = str(refused.value)
        assert f"table public.orders is owned by role {owner}" in said, said
        assert "only its owner or a superuser" in said, said
        assert f"role {role} is neither" in said, said
        assert f"stop capturing it as role {owner} or as a superuser" in said, said
        assert "must be owner" not in said, said
        assert db.capture.is_captured("orders")                      # nothing changed
    finally:
        as_other.close()
        with db.engine.begin() as connection:
            connection.execute(sa.text(f"REVOKE ALL ON orders, activedb_capture_tables FROM {role}"))
            connection.execute(sa.text(f"REVOKE ALL ON FUNCTION activedb_capture_row() FROM {role}"))
    db.capture.remove("orders")                                      # its owner may
    assert not db.capture.is_captured("orders")


def _consumed_once(db, conninfo, name: str, key: int) -> None:
    """Consumer ``name`` (activedb's role) handles the insert of ``orders`` row ``key``, filing a batch of its run in
    the ingestion ledger, and is closed."""
    db.capture("orders")            # (an earlier test of the module stops capturing it)
    with psycopg.connect(conninfo, autocommit=True) as owner:
        owner.execute("INSERT INTO orders (id, customer, amount) VALUES (%s, 'dropped', 1)", (key,))
    consumer = db.capture.consumer(name)
    try:
        assert consumer.run_until_caught_up() >= 1
    finally:
        consumer.close()


def _registry_and_ledger(db, name: str) -> tuple[int, bool]:
    """How many rows consumer ``name`` has in the registry, and whether its run has batches in the ingestion
    ledger."""
    from activedb.capture._firing import source_of

    with db.engine.connect() as connection:
        return (connection.execute(sa.text("SELECT count(*) FROM activedb_capture_consumers WHERE name = :name"),
                                   {"name": name}).scalar_one(),
                connection.execute(sa.text("SELECT count(*) FROM activedb_ingestion_ledger WHERE query_id = :id"),
                                   {"id": source_of(name)}).scalar_one() > 0)


@contextlib.contextmanager
def _may_only_read_and_delete_the_registry_and_the_ledger(db, other: str, database_url: str):
    """activedb connected as the second role, granted SELECT and DELETE on capture's consumer registry and on the
    ingestion ledger, and nothing else of activedb's; revoked again at the end."""
    role = _role(other)
    with db.engine.begin() as connection:
        connection.execute(sa.text(f"GRANT SELECT, DELETE ON activedb_capture_consumers, activedb_ingestion_ledger "
                                   f"TO {role}"))
    as_other = connected_as(other, database_url)
    try:
        yield as_other
    finally:
        as_other.close()
        with db.engine.begin() as connection:
            connection.execute(sa.text(f"REVOKE ALL ON activedb_capture_consumers, activedb_ingestion_ledger "
                                       f"FROM {role}"))


def test_a_role_that_may_read_and_delete_the_registry_drops_consumer_names_and_no_running_one(
        clean, conninfo, database_url, other):
    """``db.capture.drop_consumer(name)`` of a name without a row in the registry inserted one, only to lock its id:
    a role with SELECT and DELETE on the registry (what dropping a row takes) was refused by PostgreSQL ("permission
    denied for table activedb_capture_consumers").  Such a role drops a name never registered (no row is left
    behind), a name whose row is gone but whose run the ledger still holds (the run forgotten), and a consumer that
    stopped (its row and its run); a consumer that runs is still refused, nothing dropped."""
    db = clean
    db.capture("orders")        # (before its rule, which would warn that it is not captured: an earlier test stops it)
    collect_inserted(db)
    _consumed_once(db, conninfo, "stopped", 1)
    _consumed_once(db, conninfo, "orphan", 2)
    with db.engine.begin() as connection:       # (its row deleted by hand: its run stays in the ledger)
        connection.execute(sa.text("DELETE FROM activedb_capture_consumers WHERE name = 'orphan'"))
    assert (_registry_and_ledger(db, "stopped"), _registry_and_ledger(db, "orphan")) == ((1, True), (0, True))
    running = db.capture.consumer("running")
    try:
        running.run_until_caught_up()
        assert running.state is ConsumerState.LEADING
        with _may_only_read_and_delete_the_registry_and_the_ledger(db, other, database_url) as as_other:
            as_other.capture.drop_consumer("never-registered")
            assert _registry_and_ledger(db, "never-registered") == (0, False)
            as_other.capture.drop_consumer("orphan")
            assert _registry_and_ledger(db, "orphan") == (0, False)
            as_other.capture.drop_consumer("stopped")
            assert _registry_and_ledger(db, "stopped") == (0, False)
            with pytest.raises(CaptureError, match=r"consumer 'running' is running.*stop it first.*nothing was "
                                                   r"dropped"):
                as_other.capture.drop_consumer("running")
        assert _registry_and_ledger(db, "running")[0] == 1
    finally:
        running.close()


def test_a_consumer_starting_while_its_unregistered_name_is_dropped_registers_it_once_the_drop_committed(
        clean, conninfo, database_url, other, monkeypatch):
    """A drop of a name without a row keeps consumers from registering the name until it has committed (it made the
    row itself before, which took INSERT): a consumer starting meanwhile neither registers nor leads while the drop
    is in progress — held here in its forgetting of the name's run, whose ledger row a session of the test locks —,
    then registers the name anew and leads, and the run the drop forgot stays forgotten."""
    from activedb.capture import _manager
    from activedb.capture._firing import source_of

    db = clean
    db.capture("orders")        # (before its rule, as above)
    collect_inserted(db)
    name = "dropped-while-starting"
    _consumed_once(db, conninfo, name, 1)
    with db.engine.begin() as connection:       # (its row deleted by hand; nothing retained for the next consumer)
        connection.execute(sa.text("DELETE FROM activedb_capture_consumers WHERE name = :name"), {"name": name})
        connection.execute(sa.text("TRUNCATE activedb_capture_changes, activedb_capture_commits"))
    assert _registry_and_ledger(db, name) == (0, True)
    # (the drop's lock waits are bounded by a lock timeout; here it waits for the test's session instead)
    monkeypatch.setattr(_manager, "_DROP_LOCK_WAIT_MS", 1000 * TIMEOUT)
    dropped: list[BaseException | None] = []
    with _may_only_read_and_delete_the_registry_and_the_ledger(db, other, database_url) as as_other, \
            Watchdog(TIMEOUT, db.transactions.locks), psycopg.connect(conninfo) as holder:
        holder.execute("SELECT 1 FROM activedb_ingestion_ledger WHERE query_id = %s FOR UPDATE", (source_of(name),))
        dropper = threading.Thread(target=lambda: dropped.append(_outcome(as_other.capture.drop_consumer, name)))
        dropper.start()
        consumer = None
        try:
            wait_until(lambda: dropped or _waiting_for_a_lock(conninfo, _role(other)), TIMEOUT,
                       "the drop to wait for the ledger's row", describe=lambda: f"{dropped}")
            assert dropped == [], dropped
            consumer = db.capture.start(name, idle_wait=3600)
            wait_until(lambda: consumer.state is ConsumerState.LEADING
                       or _waiting_for_a_lock(conninfo, db.engine.url.username, "advisory"), TIMEOUT,
                       "the consumer to wait for the drop", describe=lambda: f"{consumer.state}, {consumer.failure}")
            assert _registry_and_ledger(db, name) == (0, True) and consumer.state is not ConsumerState.LEADING
            holder.rollback()
            dropper.join(TIMEOUT)
            assert dropped == [None]
            wait_until(lambda: consumer.state is ConsumerState.LEADING, TIMEOUT, "the consumer to lead",
                       describe=lambda: f"{consumer.state}, {consumer.failure}, {db.capture.status()}")
            assert _registry_and_ledger(db, name) == (1, False)
            [listed] = db.capture.status().consumers
            assert (listed.name, listed.leader_pid, listed.handled) == (name, consumer.session_pid, 0)
        finally:
            holder.rollback()
            dropper.join(TIMEOUT)
            if consumer is not None:
                consumer.close()


def _outcome(call, *arguments) -> BaseException | None:
    try:
        call(*arguments)
    except BaseException as error:  # noqa: BLE001 — (what the test reports)
        return error
    return None


def _waiting_for_a_lock(conninfo: str, role: str, locktype: str | None = None) -> bool:
    """Whether a session of ``role`` waits for a lock (of ``locktype``, if given)."""
    with psycopg.connect(conninfo, autocommit=True) as psql:
        return psql.execute("SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
                            "WHERE NOT l.granted AND a.usename = %s AND (%s::text IS NULL OR l.locktype = %s)",
                            (role, locktype, locktype)).fetchone()[0] > 0
