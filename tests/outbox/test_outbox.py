"""``db.outbox.recover()`` whose claim lost its connection (``activedb/outbox/README.md``, "Recovery and several
processes"): the caller gets a ``DatabaseUnavailable`` saying what became of the claim, and the claimed records —
this process's if the claim committed, the dead owner's if not — run once, at the next pass.  On the package's own
server (``conftest.py``): a claim that committed is held at its COMMIT by a synchronous-replication wait (committed
locally) while the database is cut off; one that did not is cut off after its UPDATE, before its COMMIT."""

from __future__ import annotations

import secrets
import threading
import types

import pytest
import sqlalchemy as sa

import activedb
from activedb import Coupling, Event, EventKind
from activedb.outbox import _records
from activedb.testing import wait_until
from tests.outbox.conftest import TIMEOUT, back, cut_off, wait_for_the_standby


@pytest.mark.parametrize("committed", [True, False], ids=["claim-committed", "claim-not-committed"])
def test_a_claim_that_lost_its_connection_is_unavailable_and_its_records_run_once_at_the_next_pass(own_server,
                                                                                                  committed):
    home, embedded = own_server
    database = activedb.connect(home=home, outbox_options={"recovery_interval": None})
    dead = secrets.randbits(62) + 1                 # another process's liveness key, held until it "dies" below
    lock = _records.LivenessLock(database.engine, dead)
    try:
        with database.engine.begin() as connection:
            connection.execute(sa.text("TRUNCATE events_seen, activedb_outbox RESTART IDENTITY"))
        lock.take()
        ids, storage = database.outbox.draw_ids(3)
        records = [_records.NewRecord(record_id, "claimed", Coupling.DETACHED.value,
                                      _records.encode_event(Event(EventKind.SIGNAL, "claim", payload={"n": str(n)})),
                                      ["claimed"], f"T{n}", None, "committed") for n, record_id in enumerate(ids)]
        with database.engine.begin() as connection:
            assert _records.insert(connection, records, dead, database.catalog.sequence_of(database.outbox.info, "id"),
                                   storage)
        # Declaring the rule wakes a recovery pass. It is let run now, while the dead owner's lock is held (it claims
        # nothing), so that no pass of the recovery thread claims the records after the release below, in place of
        # this test's recover().
        claimers: set[int] = set()

        def count_claims(connection, cursor, statement, parameters, context, executemany):
            if "SET owner = " in statement:
                claimers.add(threading.get_ident())

        sa.event.listen(database.engine, "after_cursor_execute", count_claims)
        database.rule(on=database.signalled("claim"), coupling=Coupling.DETACHED, name="claimed")(
            lambda tx, event: tx.insert("events_seen", rule="claimed", detail=event.payload["n"]))
        assert database.outbox.recover() == 0           # (starts the recovery thread, whose woken pass follows)
        wait_until(lambda: claimers - {threading.get_ident()}, TIMEOUT, "the recovery pass the rule's declaration woke")
        sa.event.remove(database.engine, "after_cursor_execute", count_claims)
        claim: dict[str, object] = {}

        def break_the_claim(connection, cursor, statement, parameters, context, executemany):
            if "SET owner = " in statement and "pid" not in claim and claim.get("thread") == threading.get_ident():
                claim["pid"] = cursor.connection.info.backend_pid
                if committed:
                    cursor.connection.execute("SET LOCAL synchronous_commit = on")
                else:
                    cut_off(embedded)

        sa.event.listen(database.engine, "after_cursor_execute", break_the_claim)
        lock.release()                               # that process died: its records are claimable

        def recover() -> None:
            claim["thread"] = threading.get_ident()
            try:
                database.outbox.recover()
            except BaseException as error:
                claim["error"] = error

        recovering = threading.Thread(target=recover)
        recovering.start()
        if committed:
            wait_for_the_standby(embedded, lambda: claim.get("pid"))
            cut_off(embedded)
        recovering.join(TIMEOUT)
        assert not recovering.is_alive()
        sa.event.remove(database.engine, "after_cursor_execute", break_the_claim)
        error = claim.get("error")
        assert isinstance(error, activedb.DatabaseUnavailable), error
        assert "lost the connection to PostgreSQL" in str(error) and "claiming" in str(error), error
        assert "recover()" in str(error) and "once" in str(error), error
        back(embedded)
        with database.engine.connect() as connection:
            owners = set(connection.execute(sa.text("SELECT owner FROM activedb_outbox")).scalars())
        if committed:
            assert owners == {database.outbox.owner}
        else:
            # (the dead owner's still — unless the recovery pass that declaring the rule woke ran once the database was
            # back, and claimed them then, as it may: the next pass claims them either way)
            assert owners in ({dead}, {database.outbox.owner}), owners
        database.outbox.recover()
        database.rules.wait_idle(TIMEOUT)
        with database.engine.connect() as connection:
            seen = sorted(connection.execute(sa.text("SELECT rule, detail FROM events_seen")).all())
            statuses = connection.execute(sa.text("SELECT DISTINCT status FROM activedb_outbox")).scalars().all()
        assert seen == [("claimed", "0"), ("claimed", "1"), ("claimed", "2")]
        assert statuses == ["done"]
    finally:
        back(embedded)
        lock.release()
        database.close()


@pytest.fixture
def quiet(migrated):
    """A database of the session's server whose outbox runs no recovery pass of its own."""
    database = activedb.connect(migrated, outbox_options={"recovery_interval": None})
    yield database
    database.close()


def driver_error(lost: bool) -> sa.exc.DBAPIError:
    """What SQLAlchemy raises for a statement PostgreSQL refused (or whose connection broke, which SQLAlchemy found
    so: ``connection_invalidated``): its text holds the statement and its parameters — here an event's payload."""
    import psycopg

    orig = (psycopg.OperationalError("server closed the connection unexpectedly\n\tThis probably means the server "
                                     "terminated abnormally") if lost else
            psycopg.errors.UniqueViolation('duplicate key value violates unique constraint "activedb_outbox_pkey"\n'
                                           "DETAIL:  Key (id)=(7) already exists."))
    kind = sa.exc.OperationalError if lost else sa.exc.IntegrityError
    return kind("INSERT INTO activedb_outbox (id, event) VALUES (%(id)s, %(event)s)",
                {"id": 7, "event": '{"card": "4111-secret"}'}, orig, connection_invalidated=lost)


def assert_one_line_without_parameters(caplog, words: str) -> None:
    [record] = [record for record in caplog.records if words in record.getMessage()]
    message = record.getMessage()
    assert "4111-secret" not in message and "[SQL" not in message and "\n" not in message, message
    assert record.exc_info is None, "a traceback for a database failure"


@pytest.mark.parametrize("lost", [True, False], ids=["lost", "refused"])
def test_firings_that_could_not_be_recorded_are_logged_in_one_line_without_the_statement_s_parameters(quiet, caplog,
                                                                                                      monkeypatch, lost):
    """``record_now`` logged the driver's error whole: its text carries the INSERT and its parameters, the firings'
    events (user data in the log), over several lines."""
    def fails(count, since=None):
        raise driver_error(lost)

    monkeypatch.setattr(quiet.outbox, "draw_ids", fails)
    firing = types.SimpleNamespace(rule=types.SimpleNamespace(name="alert"), event=Event(EventKind.SIGNAL, "go"),
                                   coupling=Coupling.DETACHED, chain=())      # (what a record is made of)
    quiet.outbox.record_now([(firing, "T1", None, True)], retries=0)
    assert_one_line_without_parameters(caplog, "could not record 1 detached firing(s)")
    assert "UniqueViolation" in caplog.text or "OperationalError" in caplog.text


def test_a_record_that_fails_alone_is_logged_in_one_line_without_the_statement_s_parameters(quiet, caplog):
    quiet.outbox.fail_unmade(-1, driver_error(False))     # (no record -1: nothing to mark)
    assert_one_line_without_parameters(caplog, "outbox record -1 cannot be run")
    assert "(SQLSTATE 23505)" in caplog.text


def test_a_group_runner_that_lost_its_connection_logs_one_line_and_no_traceback(quiet, caplog, monkeypatch):
    """A group runner that met a lost connection outside its group's transaction (reading which records are still
    its own after a take-over, say) logged a full traceback ending in the driver's error, statement and parameters
    — for an outage, not a bug.  It is one line now; anything else still gets its traceback."""
    from activedb.outbox._executor import Work

    executor = quiet.outbox._executor

    def lost(group, *, retried):
        raise driver_error(True)

    monkeypatch.setattr(executor, "_run", lost)
    firing = types.SimpleNamespace(rule=types.SimpleNamespace(name="alert"))
    executor.submit([Work(-1, firing)])
    assert executor.wait_idle(TIMEOUT)
    assert_one_line_without_parameters(caplog, "wait for the next recovery pass")
    with executor._mutex:
        executor._parked.clear()           # (nothing to run: the record does not exist)


def test_a_paced_runner_takes_what_is_ready_when_its_pacer_returns_and_one_pacer_paces_at_a_time(quiet):
    """``Outbox.pace_takes`` (the interleaving runner's hook): a runner with ready firings calls the pacer before it
    takes them as a group, and takes what is ready when the pacer returns — so firings of a tree that commits while
    it waits join that group."""
    from activedb.errors import OutboxError

    db = quiet
    with db.engine.begin() as connection:
        connection.execute(sa.text("TRUNCATE events_seen"))
    db.rule(on=db.signalled("paced"), coupling=Coupling.DETACHED, name="paced")(
        lambda tx, event: tx.insert("events_seen", rule="paced", detail=event.payload["n"]))
    db.outbox.wait_idle(TIMEOUT)
    waiting, go = threading.Event(), threading.Event()

    class Pacer:
        def before_take(self) -> None:
            waiting.set()
            assert go.wait(TIMEOUT), "the test did not let the runner take"

    stop = db.outbox.pace_takes(Pacer())
    try:
        with pytest.raises(OutboxError, match="paced already"):
            db.outbox.pace_takes(Pacer())
        groups = db.outbox.statistics().groups
        with db.transaction() as tx:
            tx.signal("paced", n="1")
        assert waiting.wait(TIMEOUT), "no runner called the pacer"
        with db.transaction() as tx:                    # commits while the runner waits to take
            tx.signal("paced", n="2")
        go.set()
        db.outbox.wait_idle(TIMEOUT)
        assert db.outbox.statistics().groups == groups + 1, "the two trees' firings ran in more than one group"
    finally:
        go.set()
        stop()
    with db.engine.connect() as connection:
        seen = connection.execute(sa.text("SELECT detail FROM events_seen WHERE rule = 'paced' ORDER BY detail"))
        assert seen.scalars().all() == ["1", "2"]
