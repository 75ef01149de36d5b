"""``db.outbox.recover()`` whose claim lost its connection (``activedb/outbox/README.md``, "Recovery and several
processes"): the caller gets a ``DatabaseUnavailable`` saying what became of the claim, and the claimed records —
this process's if the claim committed, the dead owner's if not — run once, at the next pass.  On the package's own
server (``conftest.py``): a claim that committed is held at its COMMIT by a synchronous-replication wait (committed
locally) while the database is cut off; one that did not is cut off after its UPDATE, before its COMMIT."""

from __future__ import annotations

import secrets
import threading

import pytest
import sqlalchemy as sa

import activedb
from activedb import Coupling, Event, EventKind
from activedb.outbox import _records
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
        database.rule(on=database.signalled("claim"), coupling=Coupling.DETACHED, name="claimed")(
            lambda tx, event: tx.insert("events_seen", rule="claimed", detail=event.payload["n"]))
        claim: dict[str, object] = {}

        def break_the_claim(connection, cursor, statement, parameters, context, executemany):
            if "SET owner = " in statement and "pid" not in claim:      # (the first claim: this test's, or a pass's)
                claim["pid"] = cursor.connection.info.backend_pid
                if committed:
                    cursor.connection.execute("SET LOCAL synchronous_commit = on")
                else:
                    cut_off(embedded)

        sa.event.listen(database.engine, "after_cursor_execute", break_the_claim)
        lock.release()                               # that process died: its records are claimable

        def recover() -> None:
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
        assert owners == {database.outbox.owner if committed else dead}
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
