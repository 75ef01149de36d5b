"""Outbox records go to PostgreSQL in one statement (``jsonb_to_recordset`` of one JSON array) inside the
caller's transaction — in several, one after another, beyond ``RECORDS_PER_STATEMENT`` records or ``STATEMENT_BYTES``
of JSON —, and come back exactly: the event (through the exact JSON codec), the cascade chain
in order whatever characters its rule names hold, a missing trigger log id.  Real PostgreSQL."""

from __future__ import annotations

import datetime as dt
import threading

import pytest
import sqlalchemy as sa

import activedb
from activedb import Event, EventKind
from activedb.outbox import _records

CHAINS = [
    ["plain"],
    ["on_wash", "alert"],
    ['quote"d', "com,ma", "{braces}", "back\\slash", "NULL", "", "sp ace", "ünïcødé ✓"],
    ["a" * 300, "b"],
]
TIMEOUT = 60


def new_records(outbox, count: int) -> tuple[list[_records.NewRecord], int]:
    ids, storage = outbox.draw_ids(count)
    now = dt.datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=dt.timezone.utc)
    events = [Event(EventKind.SIGNAL, "hand", key=(number, "w\x00x"), new={"n": number, "text": 'a"b\\c'},
                    payload={"at": now, "items": (1, 2.5, None)}, ts=now) for number in range(count)]
    return [_records.NewRecord(record_id, f"rule{number % 3}", "detached", _records.encode_event(event),
                               CHAINS[number % len(CHAINS)], f"t{number}", None if number % 2 else f"log{number}",
                               "aborted" if number % 5 == 0 else "committed")
            for number, (record_id, event) in enumerate(zip(ids, events))], storage


def statements_during(engine: sa.Engine, action, seen: list[str] | None = None) -> list[str]:
    """The statements sent while ``action`` runs (also into ``seen``, which holds them if it raises)."""
    seen = [] if seen is None else seen

    def listen(connection, cursor, statement, parameters, context, executemany):
        seen.append(statement)

    sa.event.listen(engine, "before_cursor_execute", listen)
    try:
        action()
    finally:
        sa.event.remove(engine, "before_cursor_execute", listen)
    return seen


@pytest.mark.parametrize("count", [1, 2, 1500])
def test_records_are_inserted_in_one_statement_and_read_back_exactly(db, count):
    outbox = db.outbox
    records, storage = new_records(outbox, count)
    with db.engine.connect() as connection:
        with connection.begin() as transaction:
            statements = statements_during(db.engine, lambda: outbox.insert(connection, records, storage))
            rows = connection.execute(sa.text(
                "SELECT id, rule, coupling, event, chain, trigger_id, trigger_log_id, trigger_outcome, owner, "
                "status, attempts FROM activedb_outbox WHERE id = ANY(:ids) ORDER BY id"),
                {"ids": [record.id for record in records]}).all()
            transaction.rollback()
    assert len(statements) == 1, statements
    assert len(rows) == count
    for record, row in zip(sorted(records, key=lambda record: record.id), rows):
        assert (row.id, row.rule, row.coupling, row.chain, row.trigger_id, row.trigger_log_id,
                row.trigger_outcome, row.owner, row.status, row.attempts) == (
            record.id, record.rule, record.coupling, record.chain, record.trigger_id, record.trigger_log_id,
            record.trigger_outcome, outbox.owner, "pending", 0)
        assert row.event == record.event
        event = _records.decode_event(row.event)
        assert event.key[1] == "w\x00x" and event.payload["items"] == (1, 2.5, None)


def test_records_are_part_of_the_callers_transaction(db):
    outbox = db.outbox
    records, storage = new_records(outbox, 10)
    ids = [record.id for record in records]
    with db.engine.connect() as connection:
        with connection.begin() as transaction:
            outbox.insert(connection, records, storage)
            transaction.rollback()
        assert connection.execute(sa.text("SELECT count(*) FROM activedb_outbox WHERE id = ANY(:ids)"),
                                  {"ids": ids}).scalar() == 0


def outbox_inserts(statements: list[str]) -> int:
    return sum(statement.startswith("INSERT INTO activedb_outbox") for statement in statements)


@pytest.mark.parametrize("bound", ["records", "bytes"])
def test_a_flush_s_records_beyond_one_statement_s_bounds_go_in_several_statements_and_all_run(migrated, monkeypatch,
                                                                                             bound):
    """A tree whose detached firings' records are more than one statement carries (one JSON document, one value:
    PostgreSQL takes at most 1 GB of it) writes them in several statements of its flush, and every record runs.  They
    went as one statement however many, so a flush whose records' events passed 1 GB could not commit."""
    from activedb.store import _statements

    if bound == "records":
        monkeypatch.setattr(_records, "RECORDS_PER_STATEMENT", 3)          # 3 + 3 + 1
    else:
        monkeypatch.setattr(_statements, "STATEMENT_BYTES", 1)             # a record alone each
    database = activedb.connect(migrated, outbox_options={"recovery_interval": None})
    try:
        with database.engine.begin() as connection:
            connection.execute(sa.text("DELETE FROM events_seen WHERE rule = 'split'"))
            connection.execute(sa.text("DELETE FROM activedb_outbox WHERE rule = 'split'"))
        database.rule(on=database.signalled("split"), coupling=activedb.Coupling.DETACHED, name="split")(
            lambda tx, event: tx.insert("events_seen", rule="split", detail=event.payload["n"]))

        def signal_seven() -> None:
            with database.transaction() as tx:
                for number in range(7):
                    tx.signal("split", n=str(number))

        statements = statements_during(database.engine, signal_seven)
        database.outbox.wait_idle(TIMEOUT)
        assert outbox_inserts(statements) == (3 if bound == "records" else 7), statements
        with database.engine.connect() as connection:
            seen = connection.execute(sa.text("SELECT detail FROM events_seen WHERE rule = 'split'")).scalars().all()
            statuses = connection.execute(sa.text(
                "SELECT status, count(*) FROM activedb_outbox WHERE rule = 'split' GROUP BY status")).all()
        assert sorted(seen) == [str(number) for number in range(7)]
        assert dict(statuses) == {"done": 7}
    finally:
        database.close()


def test_a_failure_in_a_later_statement_keeps_none_of_the_records(db, monkeypatch):
    """The records' statements are one transaction's: the third failing (a record whose id another session committed
    meanwhile), the first two's records are not kept either."""
    monkeypatch.setattr(_records, "RECORDS_PER_STATEMENT", 3)
    outbox = db.outbox
    records, storage = new_records(outbox, 7)
    ids = [record.id for record in records]
    with db.engine.begin() as connection:                # another session takes the last record's id
        outbox.insert(connection, records[-1:], storage)
    statements: list[str] = []

    def insert_all() -> None:
        with db.engine.begin() as connection:
            outbox.insert(connection, records, storage)

    try:
        with pytest.raises(sa.exc.IntegrityError, match=r"duplicate key .*activedb_outbox"):
            statements_during(db.engine, insert_all, statements)
        with db.engine.connect() as connection:
            kept = connection.execute(sa.text("SELECT id FROM activedb_outbox WHERE id = ANY(:ids)"),
                                      {"ids": ids}).scalars().all()
        assert outbox_inserts(statements) == 3, statements
        assert kept == [ids[-1]], "the records of the statements before the failing one were kept"
    finally:
        with db.engine.begin() as connection:
            connection.execute(sa.text("DELETE FROM activedb_outbox WHERE id = ANY(:ids)"), {"ids": ids})


def test_no_records_send_no_statement(db):
    with db.engine.connect() as connection:
        assert statements_during(db.engine, lambda: db.outbox.insert(connection, [], 0)) == []


def test_the_liveness_lock_is_taken_again_after_an_attempt_that_failed(db, monkeypatch):
    """The liveness connection broke (a server restart, a terminated backend) and PostgreSQL refused the first
    attempt to take the lock again (still down): the next check takes it.  Every later check returned at once —
    no connection, so nothing to check — and the process ran on without its lock, its pending records claimable
    by any other process as a dead one's."""
    owner = 4_242_424_242

    def holders() -> int:
        with db.engine.connect() as connection:
            return connection.execute(sa.text(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 1 "
                "AND classid::bigint = :high AND objid::bigint = :low"),
                {"high": owner >> 32, "low": owner & 0xFFFFFFFF}).scalar()

    lock = _records.LivenessLock(db.engine, owner)
    lock.take()
    try:
        assert holders() == 1
        with db.engine.begin() as connection:          # its backend ends
            connection.execute(sa.text("SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' "
                                       "AND classid::bigint = :high AND objid::bigint = :low"),
                               {"high": owner >> 32, "low": owner & 0xFFFFFFFF})
        with monkeypatch.context() as down:            # PostgreSQL still down at the first attempt
            def refused():
                raise sa.exc.OperationalError("connect", {}, ConnectionRefusedError("the server is down"))

            down.setattr(db.engine, "raw_connection", refused)
            with pytest.raises(sa.exc.OperationalError):
                lock.check()
        lock.check()
        assert holders() == 1
    finally:
        lock.release()
    assert holders() == 0
    lock.check()                                       # released: nothing to hold, nothing taken
    assert holders() == 0


@pytest.mark.parametrize("when", [5, "conflicts", True])
def test_mark_replayed_with_a_when_that_is_no_function_is_refused_saying_what_to_give(db, when):
    """``Outbox.mark_replayed(tx, when=…)`` takes a function of the abort's reason: anything else is a ``BadArgument``
    at the call, the transaction untouched — it was kept, and the tree's abort then called it (``'int' object is not
    callable`` raised inside the abort of a tree that fired a detached rule)."""
    from activedb.errors import BadArgument

    with db.transaction() as tx:
        with pytest.raises(BadArgument, match=r"mark_replayed\(when=.*\) takes a function"):
            db.outbox.mark_replayed(tx, when=when)
        assert not db.outbox.recording(tx)


@pytest.mark.parametrize("timeout", [-1, -0.5, float("-inf")])
def test_wait_idle_with_a_negative_timeout_is_refused_saying_what_to_give(db, timeout):
    """``Outbox.wait_idle(timeout)`` takes None or a number of seconds from 0: a negative one was taken — with
    nothing queued it returned as if it had waited, with a firing queued it raised TimeoutError 'after -1 s'."""
    from activedb.errors import BadArgument

    with pytest.raises(BadArgument, match=r"wait_idle\(timeout=.*\) takes None .* a number of seconds of at least 0"):
        db.outbox.wait_idle(timeout)


def test_a_thread_stopped_while_it_looks_up_the_sequence_stops_no_other_database(migrated):
    """The outbox finds its table's sequence on the first draw of ids, with a query; a thread stopped in that
    query (a stalled connection, a crash point of a test) must not make another ``Database``'s first draw wait
    with it — as Python 3.11's ``functools.cached_property`` did: its lock, one for every instance, was held
    across the query."""
    stopped, second = activedb.connect(migrated), activedb.connect(migrated)
    inside, release = threading.Event(), threading.Event()

    def hold(connection, cursor, statement, parameters, context, executemany):
        if "pg_get_serial_sequence" in statement:
            inside.set()
            release.wait(TIMEOUT)

    sa.event.listen(stopped.engine, "before_cursor_execute", hold)
    drawn: dict[str, list[int]] = {}
    threads = [threading.Thread(target=lambda: drawn.setdefault("stopped", stopped.outbox.draw_ids(1)[0]), daemon=True),
               threading.Thread(target=lambda: drawn.setdefault("second", second.outbox.draw_ids(1)[0]), daemon=True)]
    try:
        threads[0].start()
        assert inside.wait(TIMEOUT), "the first thread never reached the sequence's query"
        threads[1].start()
        threads[1].join(TIMEOUT)
        assert "second" in drawn, f"the second database's first draw waited for the stopped one's (drawn: {drawn})"
        assert "stopped" not in drawn
        release.set()
        threads[0].join(TIMEOUT)
        assert len(drawn["stopped"]) == 1 and drawn["stopped"] != drawn["second"]
    finally:
        release.set()
        stopped.close()
        second.close()
