"""Rules react to committed changes of any PostgreSQL client: once per committed change, in commit order.

Writers are raw psycopg connections ("psql", "another service"); the rules of ``_app.register`` log
every firing into ``order_log`` in firing order.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import decimal
import re
import threading
import uuid
from collections.abc import Iterator

import psycopg
import pytest
import sqlalchemy as sa

import activedb
from activedb.capture import CaptureError, CaptureNotEnabledWarning, ConsumerState, Step
from activedb.events import EventKind, Origin
from activedb.ingest import Deadlines, ingestion_status
from activedb.ingest.errors import BatchDeadlineExceeded, IngestError
from activedb.testing import Watchdog, wait_until
from tests.capture import _app
from tests.capture.conftest import MIGRATIONS, leadership_lock

WATCHDOG_SECONDS = 60


def log_rows(db) -> list[tuple]:
    with db.engine.connect() as connection:
        return [tuple(row) for row in connection.execute(sa.text(
            "SELECT rule, kind, order_id, xid, commit_position, change_id FROM order_log ORDER BY id"))]


def logged(db, rule: str = "log_change") -> list[tuple[str, int]]:
    return [(kind, order_id) for name, kind, order_id, *_ in log_rows(db) if name == rule]


def test_raw_sql_writers_fire_rules_once_per_committed_change_in_commit_order(clean, conninfo):
    db = clean
    _app.register(db)
    first, second, third = (psycopg.connect(conninfo) for _ in range(3))
    try:
        # psql-style autocommit writes: one transaction each.
        with psycopg.connect(conninfo, autocommit=True) as psql:
            psql.execute("INSERT INTO orders (id, customer, amount) VALUES (1, 'ann', 10.50), (2, 'bob', 3)")
        # Write order: first, then second; commit order: second, then first.
        first.execute("UPDATE orders SET status = 'paid' WHERE id = 1")
        first.execute("INSERT INTO orders (id, customer, amount) VALUES (3, 'ann', 1)")
        second.execute("DELETE FROM orders WHERE id = 2")
        second.commit()
        first.commit()
        # A transaction that rolls back: no event.
        third.execute("INSERT INTO orders (id, customer, amount) VALUES (4, 'zed', 1)")
        third.rollback()
        # A savepoint rolled back inside a committed transaction: only what was kept.
        third.execute("INSERT INTO orders (id, customer, amount) VALUES (5, 'cy', 2)")
        with third.transaction():            # a savepoint
            third.execute("INSERT INTO orders (id, customer, amount) VALUES (6, 'cy', 3)")
            third.execute("SAVEPOINT inner_one")
            third.execute("UPDATE orders SET status = 'held' WHERE id = 5")
            third.execute("ROLLBACK TO SAVEPOINT inner_one")
        third.commit()
    finally:
        for connection in (first, second, third):
            connection.close()

    consumer = db.capture.consumer(batch_size=1)      # batches split transactions
    assert consumer.run_until_caught_up() == 7
    assert logged(db) == [("inserted", 1), ("inserted", 2),        # psql
                          ("deleted", 2),                          # second committed first
                          ("updated", 1), ("inserted", 3),         # then first, in statement order
                          ("inserted", 5), ("inserted", 6)]        # the savepoint's update rolled back
    rows = log_rows(db)
    positions = [row[4] for row in rows]
    assert positions == sorted(positions) and len(set(positions)) == 4      # four committed transactions
    assert len({row[5] for row in rows}) == len(rows)                       # each change once
    assert consumer.run_until_caught_up() == 0                              # nothing delivered twice
    with db.engine.connect() as connection:
        totals = dict(connection.execute(sa.text("SELECT customer, total FROM order_totals")).all())
    assert totals == {"ann": decimal.Decimal("11.50"), "bob": decimal.Decimal("3.00"), "cy": decimal.Decimal("5.00")}
    statistics = db.rules.statistics().per_rule
    assert statistics["log_change"].executed == 7 and statistics["running_total"].executed == 5


def test_events_carry_old_and_new_rows_the_writers_xid_and_commit_order(clean, conninfo):
    db = clean
    seen = []

    @db.rule(on=db.captured("orders"), coupling="detached")
    def remember(tx, event):
        seen.append(event)

    with psycopg.connect(conninfo) as writer:
        writer.execute("INSERT INTO orders (id, customer, amount) VALUES (7, 'dee', 1.25)")
        writer.execute("UPDATE orders SET amount = 2.5 WHERE id = 7")
        xid = int(writer.execute("SELECT pg_current_xact_id()::text").fetchone()[0])
        writer.commit()
    db.capture.consumer().run_until_caught_up()
    inserted, updated = seen
    assert inserted.kind is EventKind.INSERTED and inserted.origin is Origin.EXTERNAL
    assert inserted.source == "orders" and inserted.key == 7 and inserted.old is None
    assert inserted.new == {"id": 7, "customer": "dee", "amount": decimal.Decimal("1.25"), "status": "new"}
    assert updated.kind is EventKind.UPDATED
    assert updated.old["amount"] == decimal.Decimal("1.25") and updated.new["amount"] == decimal.Decimal("2.50")
    assert inserted.transaction == updated.transaction == f"pg:{xid}"
    assert inserted.payload["xid"] == xid
    assert inserted.payload["commit_position"] == updated.payload["commit_position"]
    assert inserted.payload["change_id"] < updated.payload["change_id"]
    assert isinstance(inserted.payload["committed_at"], dt.datetime)


def test_captured_rows_hold_the_values_an_activedb_read_gives(clean, conninfo):
    db = clean
    seen = {}

    @db.rule(on=db.captured("typed_samples", "inserted"), coupling="detached")
    def remember(tx, event):
        seen[event.key] = event.new

    with psycopg.connect(conninfo) as writer:
        writer.execute(
            "INSERT INTO typed_samples VALUES (1, -32768, 9223372036854775807, 12345678901234.123456, 0.1, true, "
            "'text ''quoted'' é', '2024-02-29 23:59:59.123456+05:30', '2024-01-01 00:00:00', '2000-01-01', "
            "'12:34:56.5', '1 day 02:03:04', '{\"a\": [1, 2.5, null], \"b\": {\"c\": \"d\"}}', "
            "'12345678-1234-5678-1234-567812345678', '\\x00ff10', ARRAY['x', NULL, 'z'])")
        writer.execute("INSERT INTO typed_samples (id) VALUES (2)")
        writer.commit()
    db.capture.consumer().run_until_caught_up()
    for key in (1, 2):
        assert seen[key] == db.run(lambda tx: tx.read("typed_samples", key))
    assert seen[1]["exact"] == decimal.Decimal("12345678901234.123456")
    assert seen[1]["span"] == dt.timedelta(days=1, hours=2, minutes=3, seconds=4)
    assert seen[1]["uid"] == uuid.UUID("12345678-1234-5678-1234-567812345678")
    assert seen[1]["blob"] == b"\x00\xff\x10" and seen[1]["tags"] == ["x", None, "z"]


def test_changes_made_by_activedb_are_not_delivered_twice(clean, conninfo):
    db = clean
    _app.register(db)
    in_process = []

    @db.rule(on=db.inserted("orders"), coupling="immediate")
    def own(tx, event):
        in_process.append(event.key)

    with db.transaction() as tx:
        tx.insert("orders", id=20, customer="own", amount=1)
        tx.write("orders", 20, status="paid")
    db.run(lambda tx: tx.delete("orders", 20))

    def two_statements(tx):     # the first statement's changes are captured, then dropped at the commit
        tx.insert("orders", id=23, customer="own", amount=1)
        tx.write("orders", 24, customer="own", amount=1)
    db.run(two_statements)
    with psycopg.connect(conninfo, autocommit=True) as psql:
        psql.execute("INSERT INTO orders (id, customer, amount) VALUES (21, 'ext', 2)")
    with db.engine.connect() as connection:
        captured = connection.execute(sa.text("SELECT count(*) FROM activedb_capture_changes")).scalar()
    assert captured == 1                                  # only the external insert
    consumer = db.capture.consumer()
    consumer.run_until_caught_up()
    assert in_process == [20, 23, 24]
    assert logged(db) == [("inserted", 21)]
    # The consumer's own effects (order_log, order_totals) are activedb writes too: if they were captured
    # tables they would raise in-process events only.  Capture one and run again.
    db.capture("order_totals")
    try:
        with psycopg.connect(conninfo, autocommit=True) as psql:
            psql.execute("INSERT INTO orders (id, customer, amount) VALUES (22, 'ext', 3)")
        consumer.run_until_caught_up()
        with db.engine.connect() as connection:
            tables = connection.execute(sa.text(
                "SELECT DISTINCT table_oid::regclass::text FROM activedb_capture_changes")).scalars()
            assert set(tables) <= {"orders"}
    finally:
        db.capture.remove("order_totals")


DOCUMENTED_MESSAGE = ("rule 'audit': on captured inserted(orders) the writer's transaction has already committed "
                      "when activedb hears of the change, so a rule with {coupling} coupling cannot run inside it; "
                      "use coupling='detached' (detached_causally_dependent and sequential_causally_dependent are "
                      "accepted and mean the same here). To react inside activedb's own transactions, declare the "
                      "rule on db.inserted('orders')")


@pytest.mark.parametrize("coupling", ["immediate", "deferred"])
def test_an_immediate_or_deferred_rule_on_captured_changes_is_rejected_with_the_documented_message(clean, coupling):
    db = clean
    with pytest.raises(activedb.RuleError) as raised:
        @db.rule(on=db.captured("orders", "inserted"), coupling=coupling)
        def audit(tx, event):
            pass
    assert str(raised.value) == DOCUMENTED_MESSAGE.format(coupling=coupling)     # activedb/capture/README.md
    assert "audit" not in db.rules.names()


def test_exclusive_rules_on_captured_changes_are_rejected_and_the_detached_family_accepted(clean):
    db = clean
    with pytest.raises(activedb.RuleError, match="would never run"):
        db.rule(on=db.captured("orders"), coupling="exclusive_causally_dependent")(lambda tx, event: None)
    for number, coupling in enumerate(["detached", "detached_causally_dependent", "sequential_causally_dependent"]):
        db.rule(on=db.captured("orders"), coupling=coupling, name=f"ok_{number}")(lambda tx, event: None)
    assert {"ok_0", "ok_1", "ok_2"} <= set(db.rules.names())
    with pytest.raises(activedb.RuleError, match="inserted, updated, deleted, modified"):
        db.captured("orders", "signal")


@pytest.mark.parametrize("table", [123, None, ["orders"]])
def test_db_captured_of_what_is_no_table_name_is_refused_naming_db_captured(clean, table):
    """db.captured(<not a string>) is refused naming the call it was: "db.captured() takes a table name, got 123".  It
    said "db.inserted() takes a table name" (or db.modified(), the default kind's), a call the program never made."""
    with pytest.raises(activedb.RuleError) as refused:
        clean.captured(table, EventKind.INSERTED)
    assert str(refused.value) == f"db.captured() takes a table name, got {table!r}"


def test_a_rule_on_a_table_that_is_not_captured_warns(clean):
    db = clean
    with pytest.warns(CaptureNotEnabledWarning, match=r"db.capture\('order_log'\)"):
        db.captured("order_log", "inserted")
    with pytest.raises(activedb.UnknownTable):
        db.captured("no_such_table")


def test_a_failing_rule_is_a_dead_letter_and_the_others_go_on(clean, conninfo):
    db = clean
    _app.register(db)

    @db.rule(on=db.captured("orders", "inserted"), coupling="detached", priority=5)
    def picky(tx, event):
        tx.insert("order_log", rule="picky", kind="before", order_id=event.key)   # discarded with the failure
        if event.key == 31:
            raise ValueError("no 31")

    with psycopg.connect(conninfo, autocommit=True) as psql:
        psql.execute("INSERT INTO orders (id, customer, amount) VALUES (30, 'a', 1), (31, 'a', 1), (32, 'a', 1)")
    consumer = db.capture.consumer()
    assert consumer.run_until_caught_up() == 3
    assert logged(db) == [("inserted", 30), ("inserted", 31), ("inserted", 32)]
    assert logged(db, "picky") == [("before", 30), ("before", 32)]
    with db.engine.connect() as connection:
        letters = connection.execute(sa.text("SELECT query_id, reason, raw FROM activedb_dead_letters")).all()
    [(query, reason, raw)] = letters
    assert query == "capture:default" and "rule 'picky' failed" in reason and "no 31" in reason
    assert raw["key"] == 31 and raw["rule"] == "picky" and raw["table"] == "orders"
    assert consumer.statistics().failed == 1
    [backlog] = db.capture.status().consumers             # caught up, but not "ok": a firing failed
    assert backlog.failed == 1 and backlog.changes == 0
    assert "consumer 'default' has 1 failed rule firings: `activedb dead-letters list --query capture:default`" \
        in " ".join(db.capture.status().warnings())


def test_a_captured_rule_whose_action_lets_a_nested_rules_failure_through_is_said_cancelled_as_the_counters_say(
        clean, conninfo):
    """A detached rule on captured changes whose action signals an event whose immediate rule raises, and lets the
    RuleFailed through: the rule manager counts the nested rule ``failed`` and the captured rule ``cancelled`` (it
    did not end itself), and the change's dead letter says so — the captured rule was cancelled, by the nested
    rule's failure, which it names.  Before, the letter said the captured rule failed, with the nested rule's error
    and not its name ("rule 'forwards' failed on ...: ValueError(...)"), while the counters said cancelled."""
    db = clean

    @db.rule(on=db.captured("orders", "inserted"), coupling="detached", name="forwards")
    def forwards(tx, event):
        tx.signal("checked", order=event.key)

    @db.rule(on=db.signalled("checked"), name="checks")
    def checks(tx, event):
        raise ValueError("the check breaks")

    with psycopg.connect(conninfo, autocommit=True) as psql:
        psql.execute("INSERT INTO orders (id, customer, amount) VALUES (41, 'a', 1)")
    consumer = db.capture.consumer()
    assert consumer.run_until_caught_up() == 1
    # (Each attempt counts: the chunk's shared run, then the firing alone — README, "Counters count attempts".)
    forwards, checks = (db.rules.statistics().per_rule[name] for name in ("forwards", "checks"))
    assert forwards.cancelled >= 1 and (forwards.failed, forwards.executed) == (0, 0), forwards
    assert checks.failed >= 1 and (checks.cancelled, checks.executed) == (0, 0), checks
    with db.engine.connect() as connection:
        [reason] = connection.execute(sa.text("SELECT reason FROM activedb_dead_letters")).scalars().all()
    assert reason.startswith("rule 'forwards' was cancelled on "), reason
    assert "rule 'checks' failed on signal checked" in reason and "the check breaks" in reason, reason


def test_each_attempt_of_a_captured_firing_counts_fired_and_one_outcome(clean, conninfo):
    """Three captured changes share a chunk's subtransaction; the second one's firing raises there, so that
    subtransaction aborts — undoing the first one's, which had run — and the three run again, one subtransaction
    each (README, "Counters count attempts").  Each attempt counts ``fired`` and ends in one outcome: the first
    firing executed once and was cancelled once (the shared run's abort undid it), the second failed twice, the
    third, which the shared run never reached, executed once — fired 5 = executed 2 + failed 2 + cancelled 1.  The
    batch's ledger row still counts the firings its changes caused, once each.  Before, ``fired`` counted each
    planned firing once whatever its attempts: fired 3 with 5 outcomes."""
    db = clean

    @db.rule(on=db.captured("orders", "inserted"), coupling="detached", name="counted_per_attempt")
    def counted_per_attempt(tx, event):
        if event.key == 41:
            raise ValueError("no 41")

    with psycopg.connect(conninfo, autocommit=True) as psql:
        psql.execute("INSERT INTO orders (id, customer, amount) VALUES (40, 'a', 1), (41, 'a', 1), (42, 'a', 1)")
    consumer = db.capture.consumer()
    assert consumer.run_until_caught_up() == 3
    counted = db.rules.statistics().per_rule["counted_per_attempt"]
    assert (counted.fired, counted.executed, counted.failed, counted.cancelled, counted.condition_false) \
        == (5, 2, 2, 1, 0), counted
    with db.engine.connect() as connection:
        [firings] = connection.execute(sa.text("SELECT rule_firings FROM activedb_ingestion_ledger")).scalars().all()
    assert firings["counted_per_attempt"] == 3, firings


def test_a_rule_that_never_returns_passes_its_deadline_its_change_is_a_dead_letter_and_the_next_is_applied(
        clean, conninfo):
    """A consumer given Deadlines (as `activedb run` takes them): a rule that never returns on one change fails its
    batch at the rule's deadline — nothing of the batch is applied, the change is a dead letter at once, the
    consumer takes no more batches — and a consumer of the name started again (a restarted process) applies the
    batch without that change, the next change included, and `capture status` counts the change as failed.  A
    consumer had no deadline: the rule held it for ever."""
    db = clean
    never = threading.Event()           # never set while the batch runs: only the deadline ends the wait

    @db.rule(on=db.captured("orders", "inserted"), coupling="detached", priority=10)
    def log(tx, event):
        tx.insert("order_log", rule="log", kind=event.kind.value, order_id=event.key)

    @db.rule(on=db.captured("orders", "inserted"), coupling="detached", priority=5)
    def hangs(tx, event):
        if event.key == 51:
            never.wait()

    with psycopg.connect(conninfo, autocommit=True) as psql:
        psql.execute("INSERT INTO orders (id, customer, amount) VALUES (50, 'a', 1), (51, 'b', 1), (52, 'c', 1)")
    consumer = db.capture.consumer(deadlines=Deadlines(rule=0.5, batch=WATCHDOG_SECONDS))
    try:
        with Watchdog(WATCHDOG_SECONDS, db.transactions.locks):
            with pytest.raises(BatchDeadlineExceeded) as passed:
                consumer.run_until_caught_up()
            assert "rule 'hangs' did not return within its deadline of 0.5 s" in str(passed.value)
            assert logged(db, "log") == []                       # nothing of the batch was applied
            with db.engine.connect() as connection:
                [(query, reason, raw)] = connection.execute(sa.text(
                    "SELECT query_id, reason, raw FROM activedb_dead_letters")).all()
            assert query == "capture:default" and "rule 'hangs' did not return within its deadline" in reason
            assert raw["key"] == 51 and raw["table"] == "orders", raw
            with pytest.raises(IngestError, match="takes no more batches"):
                consumer.run_once()
            consumer.close()
            again = db.capture.consumer(deadlines=Deadlines(rule=0.5, batch=WATCHDOG_SECONDS))
            assert again.run_until_caught_up() == 3
        assert logged(db, "log") == [("inserted", 50), ("inserted", 52)]
        [status] = ingestion_status(db, "capture:default")
        assert (status.batches, status.events, status.dead_letters) == (1, 2, 1)
        [consumed] = db.capture.status().consumers       # the change dead-lettered ahead counts as failed
        assert again.position.change_id > 0 and consumed.changes == 0 and consumed.failed == 1, consumed
    finally:
        never.set()


def test_a_capture_batch_is_a_batch_of_the_ingestion_core(clean, conninfo):
    """Each committed batch has its ledger row (source ``capture:<consumer>``, batch number the id of its first
    change), its dead letters are filed under it, and the rules' firings are the rule dispatcher's (recorded in
    the ledger row as in the transaction log); ``activedb status`` lists the consumer beside Spark's queries."""
    db = clean
    _app.register(db)

    @db.rule(on=db.captured("orders", "inserted"), coupling="detached")
    def picky(tx, event):
        if event.key == 41:
            raise ValueError("no 41")

    with psycopg.connect(conninfo, autocommit=True) as psql:
        psql.execute("INSERT INTO orders (id, customer, amount) VALUES (40, 'a', 1), (41, 'a', 1)")
        psql.execute("INSERT INTO orders (id, customer, amount) VALUES (42, 'a', 1)")
        first_ids = [row[0] for row in psql.execute(
            "SELECT min(id) FROM activedb_capture_changes GROUP BY xid ORDER BY 1").fetchall()]
    consumer = db.capture.consumer(batch_size=2)
    assert consumer.run_until_caught_up() == 3
    with db.engine.connect() as connection:
        ledger = connection.execute(sa.text(
            "SELECT query_id, batch_id, events, dead_letters, rule_firings FROM activedb_ingestion_ledger "
            "ORDER BY batch_id")).all()
        letters = connection.execute(sa.text("SELECT query_id, batch_id FROM activedb_dead_letters")).all()
    assert [row[:4] for row in ledger] == [("capture:default", first_ids[0], 2, 1),
                                           ("capture:default", first_ids[1], 1, 0)]
    assert ledger[0].rule_firings["picky"] == 2 and ledger[1].rule_firings["picky"] == 1
    assert letters == [("capture:default", first_ids[0])]
    [status] = ingestion_status(db, "capture:default")
    assert (status.batches, status.events, status.dead_letters, status.runs) == (2, 3, 1, ())
    statistics = consumer.ingestion.statistics()
    assert (statistics.batches, statistics.events, statistics.dead_letters) == (2, 3, 1)


def test_a_change_whose_reactions_postgresql_refuses_becomes_a_dead_letter(clean, conninfo):
    db = clean

    @db.rule(on=db.captured("orders", "inserted"), coupling="detached")
    def copy(tx, event):
        # order_totals.total is numeric(14, 2): 10**13 does not fit — PostgreSQL refuses it at the flush.
        amount = event.new["amount"] * (10 ** 12 if event.key == 42 else 1)
        tx.insert("order_totals", customer=f"c{event.key}", total=amount, orders=1)

    with psycopg.connect(conninfo, autocommit=True) as psql:
        psql.execute("INSERT INTO orders (id, customer, amount) VALUES "
                     "(40, 'a', 1), (41, 'a', 1), (42, 'a', 99), (43, 'a', 1), (44, 'a', 1)")
    consumer = db.capture.consumer(batch_size=5)
    assert consumer.run_until_caught_up() == 5
    with db.engine.connect() as connection:
        customers = connection.execute(sa.text("SELECT customer FROM order_totals ORDER BY 1")).scalars().all()
        reasons = connection.execute(sa.text("SELECT reason FROM activedb_dead_letters")).scalars().all()
    assert customers == ["c40", "c41", "c43", "c44"]
    [reason] = reasons
    assert "cannot be committed" in reason and "change" in reason


def test_two_concurrent_writers_are_delivered_in_their_commit_order(clean, conninfo):
    """Two writer threads insert concurrently, then each transaction takes a ticket (an UPDATE of one row,
    locked until its commit) and stores it in its order: the ticket order is the commit order, whatever
    order they wrote in.  The updates must arrive with increasing tickets, every insert before its update."""
    db = clean
    with psycopg.connect(conninfo, autocommit=True) as setup:
        setup.execute("INSERT INTO order_totals (customer) VALUES ('ticket')")    # order_totals is not captured
    seen: list[tuple[str, int, decimal.Decimal]] = []

    @db.rule(on=db.captured("orders"), coupling="detached")
    def remember(tx, event):
        seen.append((event.kind.value, event.key, event.new["amount"]))

    writers, per_writer = 2, 30
    start = threading.Barrier(writers)
    errors = []

    def write(number: int) -> None:
        try:
            with psycopg.connect(conninfo) as connection:
                start.wait(timeout=30)
                for index in range(per_writer):
                    order = number * 1000 + index
                    connection.execute("INSERT INTO orders (id, customer, amount) VALUES (%s, 'w', 0)", (order,))
                    ticket = connection.execute("UPDATE order_totals SET orders = orders + 1 WHERE customer = "
                                                "'ticket' RETURNING orders").fetchone()[0]
                    connection.execute("UPDATE orders SET amount = %s WHERE id = %s", (ticket, order))
                    connection.commit()
        except BaseException as error:   # reported by the main thread
            errors.append(error)

    with Watchdog(WATCHDOG_SECONDS, db.transactions.locks):
        threads = [threading.Thread(target=write, args=(number,)) for number in range(writers)]
        for thread in threads:
            thread.start()
        consumer = db.capture.start(idle_wait=0.2)
        for thread in threads:
            thread.join(WATCHDOG_SECONDS)
        assert not errors
        consumer.wait_caught_up(WATCHDOG_SECONDS)
        consumer.stop()
    assert len(seen) == 2 * writers * per_writer
    tickets = [int(amount) for kind, _, amount in seen if kind == "updated"]
    assert tickets == list(range(1, writers * per_writer + 1))
    for position in range(0, len(seen), 2):        # each transaction: its insert, then its update
        (first_kind, first_key, _), (second_kind, second_key, _) = seen[position:position + 2]
        assert (first_kind, second_kind) == ("inserted", "updated") and first_key == second_key


def test_consumers_of_one_name_never_both_handle_a_change_and_a_standby_takes_over(clean, conninfo):
    db = clean
    _app.register(db)
    with Watchdog(WATCHDOG_SECONDS, db.transactions.locks):
        first = db.capture.start(idle_wait=0.1)
        wait_until(lambda: first.state is ConsumerState.LEADING, 30, "the first consumer leads")
        second = db.capture.start(idle_wait=0.1)
        wait_until(lambda: second.state is ConsumerState.STANDBY, 30, "the second consumer waits")
        with psycopg.connect(conninfo) as writer:
            for order in range(50, 80):
                writer.execute("INSERT INTO orders (id, customer, amount) VALUES (%s, 'x', 1)", (order,))
                writer.commit()
        first.wait_caught_up(WATCHDOG_SECONDS)
        assert second.state is ConsumerState.STANDBY and second.statistics().changes == 0
        first.close()                                    # its session ends: the standby takes over
        wait_until(lambda: second.state is ConsumerState.LEADING, 30, "the standby takes over")
        with psycopg.connect(conninfo, autocommit=True) as psql:
            psql.execute("INSERT INTO orders (id, customer, amount) VALUES (80, 'x', 1)")
        second.wait_caught_up(WATCHDOG_SECONDS)
        second.close()
    assert logged(db) == [("inserted", order) for order in range(50, 81)]


def _standby_of(db, name: str = "default") -> list[tuple[int, int | None]]:
    """What ``db.capture.status()`` lists as standing by for consumer ``name``: (backend pid, process id)."""
    consumers = {consumer.name: consumer for consumer in db.capture.status().consumers}
    assert name in consumers, f"status lists no consumer {name!r}: {sorted(consumers)}"
    return [(standby.backend_pid, standby.process_id) for standby in consumers[name].standby]


def test_a_standby_consumer_is_listed_in_status_from_when_it_waits_until_it_stops(clean):
    """``db.capture.status()`` listed only a name's leader: a consumer standing by behind it was nowhere.  It is
    listed under its name — its session's backend pid and its process — from when it waits until it stops."""
    import os

    db = clean
    _app.register(db)
    with Watchdog(WATCHDOG_SECONDS, db.transactions.locks):
        first = db.capture.start(idle_wait=0.1)
        wait_until(lambda: first.state is ConsumerState.LEADING, 30, "the first consumer leads")
        assert _standby_of(db) == []
        second = db.capture.start(idle_wait=0.1)
        wait_until(lambda: _standby_of(db) != [], 30, "status to list the second consumer standing by",
                   describe=lambda: f"{second.state}, {db.capture.status()}")
        assert _standby_of(db) == [(second.session_pid, os.getpid())]
        [listed] = db.capture.status().consumers
        assert listed.leader_pid == first.session_pid != second.session_pid and second.state is ConsumerState.STANDBY
        second.close()                                   # gone with it
        assert _standby_of(db) == []
        first.close()


def test_a_leader_that_stops_wakes_the_standby_which_leads_at_once(clean):
    """A leader's ``close()`` released its lock silently: a consumer standing by noticed only when its ``idle_wait``
    ran out and it tried again.  The leader notifies as it lets go, and the standby takes over then (here its
    ``idle_wait`` is an hour: it must be woken)."""
    db = clean
    _app.register(db)
    with Watchdog(WATCHDOG_SECONDS, db.transactions.locks):
        first = db.capture.start()
        wait_until(lambda: first.state is ConsumerState.LEADING, 30, "the first consumer leads")
        second = db.capture.start(idle_wait=3600)
        wait_until(lambda: _standby_of(db) != [] and second.state is ConsumerState.STANDBY, 30,
                   "the second consumer to stand by", describe=lambda: f"{second.state}, {db.capture.status()}")
        first.close()
        wait_until(lambda: second.state is ConsumerState.LEADING, 30, "the standby to take over as it is woken",
                   describe=lambda: f"{second.state}, {db.capture.status()}")
        assert _standby_of(db) == [] and db.capture.status().consumers[0].leader_pid == second.session_pid
        second.close()


def test_a_consumer_that_never_led_is_listed_standing_by_under_its_name(clean, conninfo):
    """A consumer whose name another session holds (it never led, so its name had no position row) was missing from
    ``db.capture.status()``: its name is listed, led by that session, with the consumer standing by.  (The name's lock
    is keyed by its row's id: the holder registers the name to take it, as a consumer does as it first stands by.)"""
    db = clean
    _app.register(db)
    with psycopg.connect(conninfo, autocommit=True) as holder, Watchdog(WATCHDOG_SECONDS, db.transactions.locks):
        holder.execute("SELECT pg_advisory_lock(%s, %s)", leadership_lock(holder, "never-led"))
        assert [(consumer.name, consumer.standby) for consumer in db.capture.status().consumers] == [("never-led", ())]
        waiting = db.capture.start("never-led", idle_wait=0.1)
        wait_until(lambda: any(consumer.standby for consumer in db.capture.status().consumers), 30,
                   "status to list the consumer standing by", describe=lambda: f"{db.capture.status()}")
        [listed] = db.capture.status().consumers
        assert listed.name == "never-led" and listed.leader_pid == holder.info.backend_pid
        assert [standby.backend_pid for standby in listed.standby] == [waiting.session_pid]
        waiting.close()
        assert _standby_of(db, "never-led") == []


# Two consumer names whose lock keys were one under the key a name's hash gave, zlib.crc32(name) & 0x7FFFFFFF
# (0x59c7696a): found by hashing "consumer-0", "consumer-1", … until a key came a second time.
COLLIDING_NAMES = ("consumer-3985819", "consumer-4420602")


def test_consumers_of_two_names_whose_hashes_collide_lead_at_once(clean, conninfo):
    """A name's lead was the advisory lock of its name's hash: two names whose hashes collided shared it, so a
    consumer of one stood by behind a consumer of the other (``run_until_caught_up`` said it was on standby), and
    ``db.capture.status()`` gave both names the same leader.  A name's locks are those of its own row: both lead
    at once, each handles the change, and each name is listed led by its own consumer's session."""
    import zlib

    db = clean
    _app.register(db)
    first_name, second_name = COLLIDING_NAMES
    assert zlib.crc32(first_name.encode()) & 0x7FFFFFFF == zlib.crc32(second_name.encode()) & 0x7FFFFFFF
    with Watchdog(WATCHDOG_SECONDS, db.transactions.locks):
        first, second = db.capture.consumer(first_name), db.capture.consumer(second_name)
        try:
            # Both lead (and are registered: the first one's pruning keeps the change for the second) …
            assert first.run_until_caught_up() == 0 and second.run_until_caught_up() == 0
            with psycopg.connect(conninfo, autocommit=True) as psql:
                psql.execute("INSERT INTO orders (id, customer, amount) VALUES (95, 'x', 1)")
            # … and go on leading: each handles the change.
            assert first.run_until_caught_up() == 1 and second.run_until_caught_up() == 1
            assert first.state is ConsumerState.LEADING and second.state is ConsumerState.LEADING
            assert first.leadership_lock != second.leadership_lock
            leaders = {consumer.name: (consumer.leader_pid, consumer.standby)
                       for consumer in db.capture.status().consumers}
            assert leaders == {first_name: (first.session_pid, ()), second_name: (second.session_pid, ())}
            assert first.leader_pid() == first.session_pid != second.session_pid == second.leader_pid()
        finally:
            first.close()
            second.close()
    assert logged(db) == [("inserted", 95), ("inserted", 95)]


def test_status_lists_as_a_names_leader_no_session_of_another_database_on_the_server(clean, make_database_url):
    """An advisory lock belongs to its database, but the status read every database's from ``pg_locks``: a consumer
    of a name leading in another database on the same server was listed as the leader of that name here, where
    nothing ran under it (and its ``leader_pid()`` named it).  Only this database's locks count — here the name's row
    has the same id in both databases, so their locks have the same keys."""
    from activedb.capture import _sql

    db = clean
    _app.register(db)
    resting = db.capture.consumer("default")
    assert resting.run_until_caught_up() == 0
    resting.close()                                  # (registered here; nothing leads it)
    with db.engine.connect() as connection:
        key = connection.execute(sa.text("SELECT id FROM activedb_capture_consumers WHERE name = 'default'")).scalar()
    url = make_database_url("other_leader")
    other = activedb.connect(url)
    try:
        other.upgrade_app(MIGRATIONS, "c0002")
        with other.engine.begin() as connection:    # (its next id: the one the name has here)
            connection.execute(sa.text(f"ALTER TABLE activedb_capture_consumers ALTER COLUMN id RESTART WITH {key}"))
        _app.register(other)
        elsewhere = other.capture.consumer("default")
        try:
            assert elsewhere.run_until_caught_up() == 0 and elsewhere.state is ConsumerState.LEADING
            assert elsewhere.leadership_lock == (_sql.CONSUMER_LOCK_CLASS, key)     # (the key of the name's here)
            assert [consumer.leader_pid for consumer in other.capture.status().consumers] == [elsewhere.session_pid]
            [listed] = db.capture.status().consumers
            assert (listed.name, listed.leader_pid, listed.standby) == ("default", None, ())
            assert db.capture.consumer("default").leader_pid() is None
        finally:
            elsewhere.close()
    finally:
        other.close()


def test_a_batch_whose_position_moved_meanwhile_keeps_nothing(clean, conninfo, database_url):
    """The leader loses its lock (its session is terminated) while its batch runs; another process's
    consumer takes over and handles the changes; the first one's flush finds the position moved and keeps
    nothing."""
    db = clean

    def log_only(database) -> None:        # inserts only: the batch's own validation finds nothing changed
        database.rule(on=database.captured("orders", "inserted"), coupling="detached", name="log_change")(
            lambda tx, event: tx.insert("order_log", rule="log_change", kind=event.kind.value, order_id=event.key))

    log_only(db)
    fired, release = threading.Event(), threading.Event()

    def hold_after_rules(step: Step, detail: int) -> None:
        if step is Step.FIRED and not fired.is_set():
            fired.set()
            assert release.wait(WATCHDOG_SECONDS)

    with psycopg.connect(conninfo, autocommit=True) as psql:
        psql.execute("INSERT INTO orders (id, customer, amount) VALUES (90, 'x', 1), (91, 'x', 2)")
    slow = db.capture.consumer(on_step=hold_after_rules)
    result = {}
    with Watchdog(WATCHDOG_SECONDS, db.transactions.locks):
        runner = threading.Thread(target=lambda: result.setdefault("handled", slow.run_once()))
        runner.start()
        assert fired.wait(WATCHDOG_SECONDS)
        with psycopg.connect(conninfo, autocommit=True) as admin:
            terminated = admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' AND granted "
                "AND classid = %s::bigint::oid AND objid = %s::bigint::oid", slow.leadership_lock).fetchall()
            assert terminated == [(True,)]
        with activedb.connect(database_url) as other_process:     # its own lock manager, as another process
            log_only(other_process)
            assert other_process.capture.consumer().run_until_caught_up() == 2
        release.set()
        runner.join(WATCHDOG_SECONDS)
    assert result["handled"] == 0 and slow.statistics().conflicts == 1
    assert logged(db) == [("inserted", 90), ("inserted", 91)]
    assert slow.run_once() == 0                      # it reconnects: on standby or caught up, never twice
    assert logged(db) == [("inserted", 90), ("inserted", 91)]


def test_backlog_is_visible_a_consumer_far_behind_says_so_and_consumed_changes_are_pruned(clean, conninfo):
    db = clean
    _app.register(db)
    status = db.capture.status()
    assert status.installed and {table.name for table in status.tables} >= {"orders", "typed_samples"}
    with psycopg.connect(conninfo, autocommit=True) as psql:
        psql.execute("INSERT INTO orders (id, customer, amount) SELECT g, 'b', 1 FROM generate_series(100, 119) g")
        psql.execute("INSERT INTO typed_samples (id) VALUES (100)")
    status = db.capture.status()
    assert not status.consumers and status.retained_changes == 21
    assert {table.table: table.changes for table in status.unconsumed} == {"orders": 20, "typed_samples": 1}
    assert any("no consumer" in line for line in status.warnings())

    keeper = db.capture.consumer("keeper", batch_size=5, retention=dt.timedelta(hours=1), prune_interval=0)
    keeper.run_once()
    status = db.capture.status(behind_changes=10)
    [backlog] = status.consumers
    assert backlog.name == "keeper" and backlog.changes == 16 and backlog.behind
    assert {table.table: table.changes for table in backlog.tables} == {"orders": 15, "typed_samples": 1}
    assert any("'keeper' is far behind: 16 changes wait" in line for line in status.warnings())
    keeper.run_until_caught_up()
    status = db.capture.status(behind_changes=10)
    assert status.consumers[0].changes == 0 and not status.consumers[0].behind and not status.warnings()
    assert status.retained_changes == 21                      # kept for an hour
    assert db.capture.prune(retention=dt.timedelta(hours=1)) == 0
    assert db.capture.prune() == 2                            # every commit the consumer has handled whole
    assert db.capture.status().retained_changes == 0

    keeper.close()
    pruning = db.capture.consumer("keeper", prune_interval=0)
    with psycopg.connect(conninfo, autocommit=True) as psql:
        psql.execute("INSERT INTO orders (id, customer, amount) VALUES (120, 'b', 1)")
    pruning.run_until_caught_up()
    assert db.capture.status().retained_changes == 0          # (its round of pruning after the batch)
    pruning.close()                                           # a consumer that leads is not dropped
    db.capture.drop_consumer("keeper")
    assert db.capture.status().consumers == ()


@pytest.mark.parametrize("retention", [-1, dt.timedelta(seconds=-1), float("nan"), "1h"])
def test_a_retention_that_is_no_age_is_refused_by_prune_as_by_a_consumer(clean, retention):
    """db.capture.prune(retention=-1) pruned as 0 does (a consumer refuses it), and a text escaped from float() as a
    bare ValueError, from both."""
    with pytest.raises(CaptureError, match=r"retention.* takes a non-negative age"):
        clean.capture.prune(retention=retention)
    with pytest.raises(CaptureError, match=r"retention.* takes a non-negative age"):
        clean.capture.consumer("keeper", retention=retention)


def test_a_retention_longer_than_postgresql_can_subtract_keeps_changes_and_the_consumer_running(clean, conninfo):
    """A retention of "for ever" (``timedelta.max``, infinity, or anything past the year 1 before now) keeps the
    consumed changes: the pruning round that compared commit times with ``now() - retention`` made PostgreSQL
    compute a timestamp out of its range, and its error stopped the consumer for good.  A retention that is
    not a number is refused where it is given, as a negative one is."""
    db = clean
    _app.register(db)        # (a database without any rule refuses its batches)
    with pytest.raises(CaptureError, match="retention.* takes a non-negative age .*, got nan"):
        db.capture.consumer("keeper", retention=float("nan"))
    with psycopg.connect(conninfo, autocommit=True) as psql:
        psql.execute("INSERT INTO orders (id, customer, amount) VALUES (1, 'ann', 1)")
        psql.execute("INSERT INTO orders (id, customer, amount) VALUES (2, 'bob', 2)")
    keeper = db.capture.consumer("keeper", batch_size=1, retention=dt.timedelta.max, prune_interval=0)
    assert keeper.run_until_caught_up() == 2
    assert keeper.statistics().pruned_commits == 0 and db.capture.status().retained_changes == 2
    assert db.capture.prune(retention=float("inf")) == 0 and db.capture.prune(retention=1e13) == 0
    assert db.capture.prune() == 2                            # every commit the consumer has handled whole
    keeper.close()


@pytest.mark.parametrize("table", ["activedb_capture_changes", "activedb_capture_commits", "activedb_capture_tables",
                                   "activedb_capture_consumers", "activedb_capture_sequencer"])
def test_capture_refuses_its_own_tables_and_captured_writes_go_on(clean, conninfo, table):
    """``db.capture("activedb_capture_changes")`` (``activedb capture enable …``, or enable_capture in a revision)
    installed the row trigger on the change table itself: every captured write of every table then failed with
    "stack depth limit exceeded" (the trigger's insert fired the trigger); capturing the consumers' table made each
    position update a change to consume.  Capture's own tables are refused, saying why, and nothing is installed."""
    db = clean
    _app.register(db)        # (a database without any rule refuses its batches)
    with pytest.raises(CaptureError, match=f"{table}.* is one of change capture's own tables"):
        db.capture(table)
    assert table not in [captured.name for captured in db.capture.tables()]
    with psycopg.connect(conninfo, autocommit=True) as psql:
        psql.execute("INSERT INTO orders (id, customer, amount) VALUES (4242, 'still', 1)")
        assert psql.execute("SELECT count(*) FROM pg_trigger WHERE tgrelid = %s::regclass AND tgname = "
                            "'activedb_capture'", (table,)).fetchone() == (0,)
    assert db.capture.consumer().run_until_caught_up() == 1


def test_the_status_of_a_captured_table_dropped_says_to_stop_capturing_it(clean, conninfo):
    """A captured table dropped by another process: the status's warning offers stopping its capture (what works for a
    table that is gone) besides capturing it again (what works for one created again).  It said only "was it dropped
    and created again?: run db.capture('dropped_one')", which fails for a table that is gone ('no table …')."""
    db = clean
    with psycopg.connect(conninfo, autocommit=True) as psql:
        psql.execute("DROP TABLE IF EXISTS dropped_one")
        psql.execute("CREATE TABLE dropped_one (id integer PRIMARY KEY)")
    db.schema.refresh()
    db.capture("dropped_one")
    with psycopg.connect(conninfo, autocommit=True) as psql:
        psql.execute("DROP TABLE dropped_one")
    db.schema.refresh()
    [warning] = [line for line in db.capture.status().warnings() if "'dropped_one'" in line]
    assert "no capture trigger" in warning and "db.capture('dropped_one')" in warning, warning
    assert "activedb capture disable dropped_one" in warning and "db.capture.remove('dropped_one')" in warning, warning
    db.capture.remove("dropped_one")                    # (what the warning says works)
    assert not [line for line in db.capture.status().warnings() if "'dropped_one'" in line]


def test_a_captured_table_renamed_says_its_trigger_is_not_installed(clean, conninfo):
    """A captured table renamed by another process: its CapturedTable says trigger_installed=False (a bool, as typed,
    as for a table dropped), and `activedb capture status --json` false.  It was None (SQL's NULL: the name denotes no
    table, and NULL = oid is NULL), null in the JSON — a program testing `is False` took the table for fine."""
    db = clean
    with captured_then_renamed(db, conninfo):
        installed = {table.name: table.trigger_installed for table in db.capture.status().tables}
        assert installed["moving"] is False, installed


def _retained_of(db, table: str) -> int:
    with db.engine.connect() as connection:
        return connection.execute(sa.text("SELECT count(*) FROM activedb_capture_changes WHERE table_oid = "
                                          "to_regclass(:table)"), {"table": table}).scalar_one()


def test_remove_refuses_to_drop_pending_changes_unless_told_to(clean, conninfo):
    """``db.capture.remove(table)`` dropped the table's captured changes no consumer had handled yet, without a word:
    their rules never heard of them.  It refuses, saying how many are pending and what to do, and changes nothing;
    changes every consumer handled (kept by a retention) are no reason to refuse; ``discard_pending=True`` drops
    them on purpose and says how many."""
    from activedb.capture.errors import CapturePendingChanges

    db = clean
    _app.register(db)
    db.capture("order_log")
    try:
        with psycopg.connect(conninfo, autocommit=True) as psql:
            psql.execute("INSERT INTO order_log (rule, kind) VALUES ('external', 'x'), ('external', 'y')")
        with pytest.raises(CapturePendingChanges, match=(
                r"cannot stop capturing 'order_log': 2 of its captured changes are pending .* handle the pending changes first .*"
                r"db\.capture\.remove\('order_log', discard_pending=True\).*nothing was changed")) as refused:
            db.capture.remove("order_log")
        assert refused.value.pending == 2 and isinstance(refused.value, activedb.ActivedbError)
        assert db.capture.is_captured("order_log") and _retained_of(db, "order_log") == 2     # nothing changed

        db.capture.consumer(retention=float("inf")).run_until_caught_up()     # handled, and kept
        assert _retained_of(db, "order_log") == 2
        assert db.capture.remove("order_log") == 0 and not db.capture.is_captured("order_log")

        db.capture("order_log")
        with psycopg.connect(conninfo, autocommit=True) as psql:
            psql.execute("INSERT INTO order_log (rule, kind) VALUES ('external', 'z')")
        assert db.capture.remove("order_log", discard_pending=True) == 1
        assert not db.capture.is_captured("order_log") and _retained_of(db, "order_log") == 0
    finally:
        db.capture.remove("order_log", discard_pending=True)


def test_capture_can_be_turned_on_and_off_at_run_time(clean, conninfo):
    db = clean
    seen = []
    captured = db.capture("order_log")
    assert captured.name == "order_log" and captured.trigger_installed and db.capture.is_captured("order_log")

    @db.rule(on=db.captured("order_log", "inserted"), coupling="detached")
    def remember(tx, event):
        seen.append(event.new["rule"])

    with psycopg.connect(conninfo, autocommit=True) as psql:
        psql.execute("INSERT INTO order_log (rule, kind) VALUES ('external', 'x')")
        db.capture.remove("order_log", discard_pending=True)
        assert not db.capture.is_captured("order_log")
        psql.execute("INSERT INTO order_log (rule, kind) VALUES ('not captured', 'x')")
    db.capture.consumer().run_until_caught_up()
    assert seen == []                      # removing capture dropped the change not yet consumed
    with pytest.raises(activedb.UnknownTable):
        db.capture("no_such_table")


def test_deferred_rules_fired_by_a_captured_rule_run_before_the_next_change_is_handled(clean, conninfo):
    """A deferred in-process rule fired by a captured rule's action runs when that firing's transaction
    commits — before the next change's firing (so firings do not share one subtransaction then)."""
    db = clean

    @db.rule(on=db.captured("orders", "inserted"), coupling="detached")
    def first(tx, event):
        tx.insert("order_log", rule="first", kind="inserted", order_id=event.key)

    @db.rule(on=db.inserted("order_log"), when=lambda tx, event: event.new["rule"] == "first", coupling="deferred")
    def then(tx, event):
        tx.insert("order_log", rule="then", kind="inserted", order_id=event.new["order_id"])

    with psycopg.connect(conninfo, autocommit=True) as psql:
        psql.execute("INSERT INTO orders (id, customer, amount) VALUES (60, 'a', 1), (61, 'a', 1)")
    db.capture.consumer().run_until_caught_up()
    assert [(rule, order) for rule, _, order, *_ in log_rows(db)] == [("first", 60), ("then", 60),
                                                                      ("first", 61), ("then", 61)]


def test_run_until_caught_up_waits_for_the_lead_in_postgresql(clean, conninfo):
    db = clean
    _app.register(db)
    leader = db.capture.consumer()
    assert leader.run_until_caught_up() == 0 and leader.state is ConsumerState.LEADING
    other = db.capture.consumer()
    with pytest.raises(activedb.capture.CaptureError, match="on standby"):
        other.run_until_caught_up(lead_timeout=0.2)
    with psycopg.connect(conninfo, autocommit=True) as psql:
        psql.execute("INSERT INTO orders (id, customer, amount) VALUES (70, 'x', 1)")
    leader.close()
    assert other.run_until_caught_up(lead_timeout=30) == 1 and other.state is ConsumerState.LEADING


def test_a_lead_timeout_below_a_millisecond_still_bounds_the_wait_for_the_lead(clean):
    """``lead_timeout`` becomes PostgreSQL's ``lock_timeout`` in whole milliseconds; below one it was 0, which
    PostgreSQL reads as "no timeout": the call waited for the leader for ever instead of raising."""
    db = clean
    leader = db.capture.consumer()
    assert leader.run_until_caught_up() == 0 and leader.state is ConsumerState.LEADING
    other = db.capture.consumer()
    failures: list[BaseException] = []

    def lead() -> None:
        try:
            other.run_until_caught_up(lead_timeout=0.0004)
        except CaptureError as error:
            failures.append(error)

    waiting = threading.Thread(target=lead)
    waiting.start()
    waiting.join(WATCHDOG_SECONDS)          # (a bound a busy machine meets: the wait it checks is 1 ms)
    stuck = waiting.is_alive()
    leader.close()                       # (ends a wait that had no bound)
    waiting.join(WATCHDOG_SECONDS)
    assert not stuck, f"run_until_caught_up(lead_timeout=0.0004) still waited for the lead after {WATCHDOG_SECONDS} s"
    assert len(failures) == 1 and "on standby" in str(failures[0])


@contextlib.contextmanager
def captured_table(db, conninfo: str, name: str, columns: str) -> Iterator[None]:
    """A table ``name (columns)`` created by another process and captured here; dropped again afterwards."""
    with psycopg.connect(conninfo, autocommit=True) as psql:
        psql.execute(f"DROP TABLE IF EXISTS {name}")
        psql.execute(f"CREATE TABLE {name} ({columns})")
    try:
        db.schema.refresh()
        db.capture(name)
        yield
    finally:
        db.capture.remove(name)
        with psycopg.connect(conninfo, autocommit=True) as psql:
            psql.execute(f"DROP TABLE IF EXISTS {name}")
        db.schema.refresh()


def test_a_column_dropped_by_another_process_does_not_stop_the_consumer(clean, conninfo):
    """Another process drops a column of a captured table after this one read the table's layout: the changes
    made before and after are delivered (the dropped column no longer in the rows), not a ProgrammingError
    (undefined column) that stopped the consumer for good until the process read the schema again."""
    db = clean
    seen = []
    with captured_table(db, conninfo, "shrinking", "id integer PRIMARY KEY, kept text, dropped text"):
        @db.rule(on=db.captured("shrinking", "inserted"), coupling="detached")
        def remember(tx, event):
            seen.append(event.new)

        consumer = db.capture.consumer()
        with psycopg.connect(conninfo, autocommit=True) as psql:
            psql.execute("INSERT INTO shrinking VALUES (1, 'a', 'b')")
            consumer.run_until_caught_up()
            db.rules.wait_idle(WATCHDOG_SECONDS)
            assert seen == [{"id": 1, "kept": "a", "dropped": "b"}]
            psql.execute("INSERT INTO shrinking VALUES (2, 'c', 'd')")
            psql.execute("ALTER TABLE shrinking DROP COLUMN dropped")
            psql.execute("INSERT INTO shrinking VALUES (3, 'e')")
        consumer.run_until_caught_up()
        db.rules.wait_idle(WATCHDOG_SECONDS)
        assert seen[1:] == [{"id": 2, "kept": "c"}, {"id": 3, "kept": "e"}]


def test_a_column_added_by_another_process_while_the_consumer_runs_is_in_the_events_of_later_changes(
        clean, conninfo, monkeypatch):
    """Another process adds a column to a captured table while a consumer runs on its thread: the events of the
    changes made after carry it (and a change made before, read in the same batch, carries it as None), with no
    db.schema.refresh().  The consumer kept the layout it had read, so the new column was missing from every
    event until the process was restarted or refreshed, and a rule reading it met a KeyError, without a warning."""
    db = clean
    seen = []
    with captured_table(db, conninfo, "growing", "id integer PRIMARY KEY, kept text"):
        @db.rule(on=db.captured("growing", "modified"), coupling="detached")
        def remember(tx, event):
            seen.append((event.kind.value, event.new))

        refreshes = []
        refresh = db.catalog.refresh

        def counted_refresh() -> None:
            refreshes.append(1)
            refresh()

        monkeypatch.setattr(db.catalog, "refresh", counted_refresh)

        with Watchdog(WATCHDOG_SECONDS, db.transactions.locks):
            consumer = db.capture.start(idle_wait=0.1)
            try:
                with psycopg.connect(conninfo, autocommit=True) as psql:
                    psql.execute("INSERT INTO growing VALUES (1, 'a')")
                    consumer.wait_caught_up(WATCHDOG_SECONDS)
                    db.rules.wait_idle(WATCHDOG_SECONDS)
                    assert seen == [("inserted", {"id": 1, "kept": "a"})]
                    with psql.transaction():      # (one commit: the consumer reads both changes in one batch)
                        psql.execute("INSERT INTO growing VALUES (2, 'b')")
                        psql.execute("ALTER TABLE growing ADD COLUMN added integer DEFAULT 7")
                        psql.execute("INSERT INTO growing VALUES (3, 'c', 30)")
                    psql.execute("UPDATE growing SET added = 10 WHERE id = 1")
                    consumer.wait_caught_up(WATCHDOG_SECONDS)
                    db.rules.wait_idle(WATCHDOG_SECONDS)
                    psql.execute("INSERT INTO growing VALUES (4, 'd', 40)")
                    consumer.wait_caught_up(WATCHDOG_SECONDS)
                    db.rules.wait_idle(WATCHDOG_SECONDS)
            finally:
                consumer.stop()
        assert seen[1:] == [("inserted", {"id": 2, "kept": "b", "added": None}),
                            ("inserted", {"id": 3, "kept": "c", "added": 30}),
                            ("updated", {"id": 1, "kept": "a", "added": 10}),
                            ("inserted", {"id": 4, "kept": "d", "added": 40})], seen
        assert len(refreshes) == 1, f"the layouts were read again {len(refreshes)} times, not once"
        monkeypatch.undo()


def test_a_table_dropped_while_the_consumer_reads_it_again_after_a_dropped_column_does_not_stop_it(
        clean, conninfo, monkeypatch):
    """A column of a captured table is dropped, and the table itself while the consumer reads its layout again (a
    race with another process): its changes become dead letters saying there is no such table, and the consumer
    goes on.  The second reading ran inside the handler of the first one's error, so its error (the table is
    unknown) escaped the handlers of the same statement and stopped the consumer."""
    db = clean
    _app.register(db)        # (a database without any rule refuses its batches)
    with psycopg.connect(conninfo, autocommit=True) as psql:
        psql.execute("DROP TABLE IF EXISTS vanishing")
        psql.execute("CREATE TABLE vanishing (id integer PRIMARY KEY, kept text, dropped text)")
    try:
        db.schema.refresh()
        db.capture("vanishing")
        consumer = db.capture.consumer()
        assert consumer.run_until_caught_up() == 0                 # (the consumer has read the table's layout)
        db.table("vanishing")
        refresh = db.catalog.refresh

        def refresh_while_the_table_is_dropped() -> None:
            with psycopg.connect(conninfo, autocommit=True) as psql:
                psql.execute("DROP TABLE IF EXISTS vanishing")
            refresh()

        with psycopg.connect(conninfo, autocommit=True) as psql:
            psql.execute("INSERT INTO vanishing VALUES (1, 'a', 'b')")
            psql.execute("ALTER TABLE vanishing DROP COLUMN dropped")
        monkeypatch.setattr(db.catalog, "refresh", refresh_while_the_table_is_dropped)
        assert consumer.run_until_caught_up() == 1
        monkeypatch.undo()
        with db.engine.connect() as connection:
            reasons = connection.execute(sa.text("SELECT reason FROM activedb_dead_letters")).scalars().all()
        assert len(reasons) == 1 and "cannot be delivered: table 'vanishing' no longer exists" in reasons[0], reasons
        assert "migrations" not in reasons[0], reasons         # (the advice for a table never created)
        consumer.close()
    finally:
        monkeypatch.undo()
        db.capture.remove("vanishing")
        with psycopg.connect(conninfo, autocommit=True) as psql:
            psql.execute("DROP TABLE IF EXISTS vanishing")
        db.schema.refresh()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")   # (the first thread's end)
def test_a_consumer_started_again_after_its_thread_failed_does_not_report_the_old_failure(clean, conninfo):
    """A consumer whose thread died (here its ``on_step`` hook raised) and that the user stops and starts again
    runs: ``wait_caught_up`` waits for the new thread's batches.  The old thread's error was kept for good, so every
    ``wait_caught_up`` of the new run raised it at once, although the new thread consumed the changes."""
    db = clean
    _app.register(db)
    failures = ["once"]

    def fail_once(step: Step, detail: int) -> None:
        if step is Step.FETCHED and failures:
            raise RuntimeError(f"the monitoring hook failed {failures.pop()}")

    with psycopg.connect(conninfo, autocommit=True) as psql:
        psql.execute("INSERT INTO orders (id, customer, amount) VALUES (90, 'x', 1)")
    with Watchdog(WATCHDOG_SECONDS, db.transactions.locks):
        consumer = db.capture.start(idle_wait=0.1, on_step=fail_once)
        with pytest.raises(CaptureError, match="the monitoring hook failed once"):
            consumer.wait_caught_up(WATCHDOG_SECONDS)
        consumer.stop()
        consumer.start()
        try:
            consumer.wait_caught_up(WATCHDOG_SECONDS)
        finally:
            consumer.close()
    assert logged(db) == [("inserted", 90)]


@pytest.mark.parametrize("lead_timeout", [float("inf"), 30 * 24 * 3600.0])
def test_a_lead_timeout_of_for_ever_or_beyond_postgresqls_limit_waits_for_the_lead(clean, conninfo, lead_timeout):
    """``lead_timeout`` becomes PostgreSQL's ``lock_timeout`` in milliseconds, which stops at 2^31 - 1 (about 24.8
    days): infinity failed with OverflowError before anything was asked, a month with PostgreSQL's 'value out of
    range for lock_timeout' — neither a CaptureError, and no wait.  Both wait for the lead as long as it takes."""
    db = clean
    _app.register(db)
    leader = db.capture.consumer()
    assert leader.run_until_caught_up() == 0 and leader.state is ConsumerState.LEADING
    other = db.capture.consumer()
    outcome: list[object] = []

    def lead() -> None:
        try:
            outcome.append(other.run_until_caught_up(lead_timeout=lead_timeout))
        except Exception as error:
            outcome.append(error)

    waiting = threading.Thread(target=lead)
    with Watchdog(WATCHDOG_SECONDS, db.transactions.locks):
        waiting.start()
        wait_until(lambda: outcome or _waits_for_an_advisory_lock(conninfo), WATCHDOG_SECONDS,
                   "the second consumer waits for the lead")
        with psycopg.connect(conninfo, autocommit=True) as psql:
            psql.execute("INSERT INTO orders (id, customer, amount) VALUES (71, 'x', 1)")
        leader.close()
        waiting.join(WATCHDOG_SECONDS)
    other.close()
    assert outcome == [1] and logged(db) == [("inserted", 71)]


def _waits_for_an_advisory_lock(conninfo: str) -> bool:
    with psycopg.connect(conninfo, autocommit=True) as psql:
        return psql.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
                            ).fetchone()[0] > 0


def test_a_running_consumer_takes_a_timeout_of_for_ever(clean, conninfo):
    """``wait_caught_up(float("inf"))`` (no limit: the parameter takes no None) waits until caught up, and
    ``stop(timeout=float("inf"))`` until the thread ended: both failed with OverflowError (no thread wait may be that
    long) at once."""
    db = clean
    _app.register(db)
    with Watchdog(WATCHDOG_SECONDS, db.transactions.locks):
        consumer = db.capture.start(idle_wait=0.1)
        try:
            with psycopg.connect(conninfo, autocommit=True) as psql:
                psql.execute("INSERT INTO orders (id, customer, amount) VALUES (72, 'x', 1)")
            consumer.wait_caught_up(float("inf"))
            assert logged(db) == [("inserted", 72)]
            consumer.stop(timeout=float("inf"))
        finally:
            consumer.close()


@pytest.mark.parametrize("options", [
    {"batch_size": 2.5}, {"batch_size": "500"}, {"batch_size": True}, {"prune_interval": "5"},
    {"prune_interval": -1}, {"idle_wait": -1}, {"idle_wait": 0}, {"idle_wait": float("nan")},
    {"idle_wait": float("inf")}, {"idle_wait": 1e300},
    {"behind_seconds": None}, {"max_retries": None}, {"max_retries": -1}])
def test_consumer_options_of_the_wrong_kind_are_refused_where_they_are_given(clean, options):
    """A consumer's numbers are checked when it is made: before, some were accepted and broke it later — a
    ``prune_interval`` given as text raised TypeError on the consumer's thread after its first batch committed
    (stopping it for good), ``max_retries=None`` at the first retried batch, a negative or zero ``idle_wait`` made a
    caught-up consumer query PostgreSQL without a pause, ``batch_size=2.5`` reached SQL's LIMIT — and a text
    ``batch_size`` was a bare TypeError.  An ``idle_wait`` of for ever (or beyond ``threading.TIMEOUT_MAX``) passed,
    and the consumer's first pause after an unreachable server or a lost listener raised OverflowError, ending its
    thread; a consumer must look again after a pause, so it is refused."""
    with pytest.raises(CaptureError, match=rf"db\.capture\.consumer\({next(iter(options))}=.*\) takes"):
        clean.capture.consumer("checked", **options)


@pytest.mark.parametrize("call", [
    {"lead_timeout": None}, {"lead_timeout": "5"}, {"max_batches": "2"}, {"max_batches": -1}, {"max_batches": 1.5},
    {"timeout": None}, {"timeout": "30"}, {"timeout": float("nan")}])
def test_a_consumers_waits_refuse_arguments_of_the_wrong_kind(clean, call):
    """``run_until_caught_up(lead_timeout=None)`` (or a text) and ``max_batches="2"`` failed with a bare TypeError
    from a comparison, a negative ``max_batches`` ran nothing and said so by returning 0; ``wait_caught_up(None)``
    failed with a bare TypeError and ``wait_caught_up(nan)`` never timed out, spinning on its condition.  Each is a
    CaptureError naming the argument."""
    consumer = clean.capture.consumer("checked")
    try:
        name = next(iter(call))
        with pytest.raises(CaptureError, match=f"{name} must be"):
            if name == "timeout":
                consumer.wait_caught_up(**call)
            else:
                consumer.run_until_caught_up(**call)
    finally:
        consumer.close()


@pytest.mark.parametrize("bounds", [{"behind_changes": "100"}, {"behind_changes": None}, {"behind_changes": 1.5},
                                    {"behind_seconds": "60"}, {"behind_seconds": float("nan")}])
def test_status_refuses_behind_bounds_of_the_wrong_kind(clean, bounds):
    """``db.capture.status(behind_changes="100")`` failed with a bare TypeError from a comparison once a consumer
    existed (and passed without one), and a NaN ``behind_seconds`` made no consumer behind.  Each is a CaptureError
    naming the bound."""
    consumer = clean.capture.consumer("watched")
    consumer.run_until_caught_up()
    consumer.close()
    with pytest.raises(CaptureError, match=rf"db\.capture\.status\({next(iter(bounds))}=.*\) takes"):
        clean.capture.status(**bounds)


def test_waiting_for_a_consumer_that_does_not_run_says_so_at_once(clean):
    """``wait_caught_up`` is for a consumer running on its thread: on one never started (or stopped), nothing will
    ever catch up, so it says so at once (start it first).  It waited out its whole timeout and raised a
    TimeoutError that said nothing of the consumer not running."""
    consumer = clean.capture.consumer("idle")
    try:
        with pytest.raises(CaptureError, match=r"not running.*start\(\)"):
            consumer.wait_caught_up(5)
        consumer.start()
        consumer.wait_caught_up(WATCHDOG_SECONDS)
        consumer.stop()
        with pytest.raises(CaptureError, match=r"not running.*start\(\)"):
            consumer.wait_caught_up(5)
    finally:
        consumer.close()


def test_a_wait_for_a_consumer_held_back_ends_in_wait_timeout_saying_where_to_look(clean, conninfo):
    """A running consumer that cannot catch up within ``wait_caught_up``'s timeout (here: its position table locked by
    another session) ends the wait with ``WaitTimeout`` — an ``ActivedbError`` and a ``TimeoutError`` — that says
    where to look.  It was a bare TimeoutError, outside activedb's errors."""
    db = clean
    _app.register(db)
    with psycopg.connect(conninfo, autocommit=True) as psql:
        psql.execute("INSERT INTO orders (id, customer, amount) VALUES (91, 'x', 1)")
    with psycopg.connect(conninfo) as holder:
        holder.execute("LOCK TABLE activedb_capture_consumers IN ACCESS EXCLUSIVE MODE")
        consumer = db.capture.consumer("held")
        try:
            with Watchdog(WATCHDOG_SECONDS, db.transactions.locks):
                consumer.start()
                with pytest.raises(activedb.WaitTimeout, match=r"'held' not caught up within 0\.5 s.*capture "
                                                              r"status") as waited:
                    consumer.wait_caught_up(0.5)
                assert isinstance(waited.value, TimeoutError) and isinstance(waited.value, activedb.ActivedbError)
                holder.rollback()                   # (the lock let go: it catches up)
                consumer.wait_caught_up(WATCHDOG_SECONDS)
        finally:
            holder.rollback()
            consumer.close()


def test_run_until_caught_up_goes_on_after_a_conflict_and_says_when_it_gives_up(clean, conninfo, monkeypatch):
    """A batch another process committed meanwhile (CaptureConflict) is not the end: the consumer reads its
    position again and goes on.  A batch that keeps failing transiently beyond ``max_retries`` leaves changes
    pending, which ``run_until_caught_up`` says (a CaptureError) instead of returning as if caught up.  Both made
    it return 0 at once, changes still pending."""
    from activedb.capture._firing import RetryBatch
    from activedb.capture.errors import CaptureConflict

    db = clean
    _app.register(db)
    with psycopg.connect(conninfo, autocommit=True) as psql:
        for order in (81, 82, 83):
            psql.execute(f"INSERT INTO orders (id, customer, amount) VALUES ({order}, 'x', 1)")
    consumer = db.capture.consumer(batch_size=1, max_retries=0)
    apply = consumer._apply
    failures = [CaptureConflict("another process committed the batch")]

    def failing_once(start, changes):
        if failures:
            raise failures.pop()
        return apply(start, changes)

    try:
        monkeypatch.setattr(consumer, "_apply", failing_once)
        assert consumer.run_until_caught_up(max_batches=2) == 1      # the conflict, then one batch
        failures.append(RetryBatch("a firing kept failing transiently"))
        with pytest.raises(CaptureError, match=r"failed 1 times.*remain pending"):
            consumer.run_until_caught_up()
        assert logged(db) == [("inserted", 81)]
        assert consumer.run_until_caught_up() == 2
        assert logged(db) == [("inserted", 81), ("inserted", 82), ("inserted", 83)]
    finally:
        consumer.close()


def test_the_dead_letter_of_a_change_to_a_table_gone_by_its_name_says_what_happened(clean, conninfo):
    """A captured table renamed (or dropped while the consumer read it again) by another process: its pending
    changes become dead letters saying the table no longer exists under that name.  Their reason repeated the
    catalog's advice for a table that was never created — 'tables are created by Alembic migrations
    (db.upgrade_app…)' — which does not apply to a table that existed and was captured."""
    db = clean
    _app.register(db)        # (a database without any rule refuses its batches)
    with psycopg.connect(conninfo, autocommit=True) as psql:
        psql.execute("DROP TABLE IF EXISTS moving, moved")
        psql.execute("CREATE TABLE moving (id integer PRIMARY KEY, note text)")
    try:
        db.schema.refresh()
        db.capture("moving")
        consumer = db.capture.consumer()
        with psycopg.connect(conninfo, autocommit=True) as psql:
            psql.execute("INSERT INTO moving VALUES (1, 'a')")
            psql.execute("ALTER TABLE moving RENAME TO moved")
        db.schema.refresh()
        assert consumer.run_until_caught_up() == 1
        with db.engine.connect() as connection:
            reasons = connection.execute(sa.text("SELECT reason FROM activedb_dead_letters")).scalars().all()
        assert len(reasons) == 1 and "cannot be delivered: table 'moving' no longer exists" in reasons[0], reasons
        assert "migrations" not in reasons[0] and "upgrade_app" not in reasons[0], reasons
        assert "capture it again" in reasons[0], reasons
        consumer.close()
    finally:
        db.capture.remove("moving")
        with psycopg.connect(conninfo, autocommit=True) as psql:
            psql.execute("DROP TABLE IF EXISTS moving, moved")
        db.schema.refresh()


@contextlib.contextmanager
def captured_then_renamed(db, conninfo: str) -> Iterator[None]:
    """The table ``moving`` created and captured, then renamed ``moved`` by another process; afterwards capture of
    both names stopped and the table dropped."""
    with psycopg.connect(conninfo, autocommit=True) as psql:
        psql.execute("DROP TABLE IF EXISTS moving, moved")
        psql.execute("CREATE TABLE moving (id integer PRIMARY KEY, note text)")
    try:
        db.schema.refresh()
        db.capture("moving")
        with psycopg.connect(conninfo, autocommit=True) as psql:
            psql.execute("ALTER TABLE moving RENAME TO moved")
        db.schema.refresh()
        yield
    finally:
        for name in ("moving", "moved"):
            db.capture.remove(name)
        with psycopg.connect(conninfo, autocommit=True) as psql:
            psql.execute("DROP TABLE IF EXISTS moving, moved")
        db.schema.refresh()


def test_a_captured_table_renamed_is_captured_again_under_its_new_name(clean, conninfo):
    """A captured table renamed by another process is captured again under its new name — what the design note, the
    status and the dead letters of its changes say to do — and the changes made after the rename arrive under it.
    db.capture('moved') failed with PostgreSQL's 'duplicate key value violates unique constraint
    "activedb_capture_tables_table_oid_key"': the old name's registry row still held the table's oid."""
    db = clean
    with captured_then_renamed(db, conninfo):
        with psycopg.connect(conninfo, autocommit=True) as psql:
            psql.execute("INSERT INTO moved VALUES (1, 'after the rename')")
        captured = db.capture("moved")
        assert captured.name == "moved" and captured.trigger_installed
        assert [table.name for table in db.capture.tables() if table.name in ("moving", "moved")] == ["moved"]
        seen = []

        @db.rule(on=db.captured("moved", "inserted"), coupling="detached")
        def collect(tx, event):
            seen.append((event.source, event.key))

        with psycopg.connect(conninfo, autocommit=True) as psql:
            psql.execute("INSERT INTO moved VALUES (2, 'captured again')")
        assert db.capture.consumer().run_until_caught_up() == 2
        assert seen == [("moved", 1), ("moved", 2)]


def test_stopping_capture_of_a_table_renamed_since_leaves_nothing_of_its_capture_behind(clean, conninfo):
    """db.capture.remove(old name) of a captured table another process renamed drops its trigger too (the design
    note's invariant: nothing of the table's capture is left behind).  The trigger stayed on the renamed table, which
    went on recording every write into the change table, never pruned for a table nobody captures, each change a
    dead letter ("… is not captured")."""
    db = clean
    with captured_then_renamed(db, conninfo):
        db.capture.remove("moving")
        with psycopg.connect(conninfo, autocommit=True) as psql:
            psql.execute("INSERT INTO moved VALUES (1, 'no longer captured')")
            triggers = psql.execute("SELECT count(*) FROM pg_trigger WHERE tgrelid = 'moved'::regclass "
                                    "AND tgname = 'activedb_capture'").fetchone()[0]
            recorded = psql.execute("SELECT count(*) FROM activedb_capture_changes").fetchone()[0]
        assert (triggers, recorded) == (0, 0)
        assert db.capture.consumer().run_until_caught_up() == 0


def test_a_change_whose_captured_row_no_longer_fits_a_retyped_column_is_a_dead_letter_and_the_others_go_on(
        clean, conninfo):
    """Another process changes a column's type (``ALTER … TYPE integer USING …``) while changes of the table are
    pending: a change whose captured row no longer fits the new type becomes a dead letter saying so, the changes
    before and after it (which fit) are delivered, and the consumer goes on.  PostgreSQL's refusal to turn the
    captured row into the table's row type ("invalid input syntax for type integer") stopped the consumer — its
    thread, `activedb capture consume` — at that batch, every time it was started again."""
    db = clean
    seen = []
    with captured_table(db, conninfo, "retyped", "id integer PRIMARY KEY, amount text"):

        @db.rule(on=db.captured("retyped", "inserted"), coupling="detached")
        def remember(tx, event):
            seen.append(event.new)

        consumer = db.capture.consumer()
        assert consumer.run_until_caught_up() == 0             # (the consumer has read the table's layout)
        with psycopg.connect(conninfo, autocommit=True) as psql:
            psql.execute("INSERT INTO retyped VALUES (1, '10')")
            psql.execute("INSERT INTO retyped VALUES (2, 'ten')")
            psql.execute("INSERT INTO retyped VALUES (3, '30')")
            psql.execute("ALTER TABLE retyped ALTER COLUMN amount TYPE integer "
                         "USING CASE WHEN amount ~ '^[0-9]+$' THEN amount::integer END")
            psql.execute("INSERT INTO retyped VALUES (4, 40)")
        db.schema.refresh()
        assert consumer.run_until_caught_up() == 4
        db.rules.wait_idle(WATCHDOG_SECONDS)
        assert seen == [{"id": 1, "amount": 10}, {"id": 3, "amount": 30}, {"id": 4, "amount": 40}]
        with db.engine.connect() as connection:
            reasons = connection.execute(sa.text("SELECT reason FROM activedb_dead_letters")).scalars().all()
        assert len(reasons) == 1, reasons
        assert "cannot be delivered" in reasons[0] and "'retyped'" in reasons[0], reasons
        assert 'invalid input syntax for type integer: "ten"' in reasons[0], reasons
        assert consumer.failure is None
        consumer.close()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")   # (the thread's end, before)
def test_a_running_consumer_goes_on_after_its_pooled_connections_were_lost(clean, conninfo):
    """PostgreSQL ended the sessions of the database's pooled connections (a server restart, a failover, an
    administrator's pg_terminate_backend) while the consumer waited for changes: its next batch meets the lost
    connection, and the consumer waits ``idle_wait`` and goes on, as it does when the server cannot be reached.  The
    lost connection came out of the fetch as SQLAlchemy's OperationalError, which ended the consumer's thread for
    good: nothing more was consumed until the process was restarted."""
    db = clean
    _app.register(db)
    with Watchdog(WATCHDOG_SECONDS, db.transactions.locks):
        consumer = db.capture.start(idle_wait=0.1)
        try:
            consumer.wait_caught_up(WATCHDOG_SECONDS)
            with psycopg.connect(conninfo, autocommit=True) as admin:
                # Every client session of the database but this one and those holding advisory locks (the
                # consumer's listener, the outbox's liveness lock): the pool's connections.  (Not an autovacuum
                # worker busy in the database: a role that is no superuser may not end it.)
                ended = admin.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND backend_type = 'client backend' AND usename = current_user "
                    "AND pid <> pg_backend_pid() AND pid NOT IN (SELECT pid FROM pg_locks WHERE locktype = "
                    "'advisory' AND granted)").fetchall()
                assert ended and all(done for (done,) in ended)
                admin.execute("INSERT INTO orders (id, customer, amount) VALUES (73, 'x', 1)")
            consumer.wait_caught_up(WATCHDOG_SECONDS)
        finally:
            consumer.close()
    assert logged(db) == [("inserted", 73)]


@pytest.mark.parametrize("name", ["a@b", "orders@eu#p2"])
def test_a_consumer_name_with_an_at_sign_is_refused_as_a_consumer_name(clean, name):
    """A consumer's batches are filed in the ingestion ledger as ``capture:<name>``, a source without a run, which
    cannot hold '@'.  Such a name was refused by LedgerId with a BadArgument about ledger ids that told the user to
    'pass LedgerId.parse(...)' — nothing a consumer's caller passes; it is a CaptureError naming the consumer's name and
    what it may hold."""
    with pytest.raises(CaptureError, match=rf"a consumer name is a non-empty string without '@'.*got {name!r}"):
        clean.capture.consumer(name)


@pytest.mark.parametrize("name, what", [
    ("a\x00b", r"holds a NUL character \(\\x00\) at index 9"),
    ("a\udc80b", r"holds a lone UTF-16 surrogate \('\\udc80'\) at index 9"),
    ("n" * 2041, r"is a source name of 2049 bytes \(UTF-8\): a source name is at most 2048 bytes"),
], ids=["nul", "surrogate", "long"])
def test_a_consumer_name_the_ledger_cannot_hold_is_refused_as_a_consumer_name(clean, name, what):
    """A consumer's batches are filed in the ingestion ledger as ``capture:<name>``.  A name holding a NUL character,
    a lone surrogate, or too long for the ledger was refused by the consumer's Ingestion, "Ingestion(source='capture:…')
    …", an argument the caller never gave; ``drop_consumer`` of a name with a NUL failed with a bare
    sqlalchemy DataError.  Both are a CaptureError naming the consumer's name and what is wrong with it."""
    match = rf"consumer name {re.escape(repr(name[:40]))}.*: its source in the ingestion ledger, capture:<name>, {what}"
    with pytest.raises(CaptureError, match=match):
        clean.capture.consumer(name)
    with pytest.raises(CaptureError, match=match):
        clean.capture.drop_consumer(name)


def test_dropping_a_consumer_that_runs_is_refused_and_the_consumer_goes_on_exactly_once(clean, conninfo):
    """``db.capture.drop_consumer(name)`` forgets the position and the ledger run of a consumer that no longer runs
    (design note: a name that no longer runs holds pruning back until dropped).  Of a consumer that runs — it leads
    its name, here or in another process — it forgot them under it: its next batch found no position, started again
    from the oldest retained change and fired the rules again on changes they had handled.  It is now refused (a
    CaptureError saying to stop the consumer first), nothing dropped; once the consumer is closed, it is dropped."""
    db = clean
    _app.register(db)
    consumer = db.capture.consumer("dropped", retention=3600)      # its handled changes stay retained
    with psycopg.connect(conninfo, autocommit=True) as psql:
        psql.execute("INSERT INTO orders (id, customer, amount) VALUES (130, 'a', 1)")
    consumer.run_until_caught_up()
    assert logged(db) == [("inserted", 130)]
    with pytest.raises(CaptureError, match=r"consumer 'dropped' is running.*stop it first"):
        db.capture.drop_consumer("dropped")
    with psycopg.connect(conninfo, autocommit=True) as psql:
        psql.execute("INSERT INTO orders (id, customer, amount) VALUES (131, 'a', 1)")
    consumer.run_until_caught_up()
    assert logged(db) == [("inserted", 130), ("inserted", 131)]     # 130 not fired again
    consumer.close()
    db.capture.drop_consumer("dropped")
    assert db.capture.status().consumers == ()


def test_dropping_a_consumer_whose_ledger_rows_another_session_locks_is_refused_and_drops_nothing(
        clean, conninfo, monkeypatch):
    """A drop whose rows another session holds locked — here a session holding the name's ledger row ``FOR UPDATE``
    — waits for them as it waits for the name's locks, at most its lock timeout; past it, it is refused with a
    CaptureError saying what held it and that nothing was dropped (before, PostgreSQL's bare lock-timeout error), and
    the name's row and batches are still there; once the session is done, the drop goes through."""
    from activedb.capture import _manager
    from activedb.capture._firing import source_of

    db = clean
    _app.register(db)
    consumer = db.capture.consumer("held-ledger")
    with psycopg.connect(conninfo, autocommit=True) as psql:
        psql.execute("INSERT INTO orders (id, customer, amount) VALUES (140, 'a', 1)")
    consumer.run_until_caught_up()
    consumer.close()

    def registry_and_ledger() -> tuple[int, int]:
        with db.engine.connect() as connection:
            return (connection.execute(sa.text("SELECT count(*) FROM activedb_capture_consumers WHERE name = "
                                               "'held-ledger'")).scalar_one(),
                    connection.execute(sa.text("SELECT count(*) FROM activedb_ingestion_ledger WHERE query_id = :id"),
                                       {"id": source_of("held-ledger")}).scalar_one())

    before = registry_and_ledger()
    assert before[0] == 1 and before[1] >= 1, before
    monkeypatch.setattr(_manager, "_DROP_LOCK_WAIT_MS", 100)     # (the holder below never lets go meanwhile)
    with psycopg.connect(conninfo) as holder:
        holder.execute("SELECT 1 FROM activedb_ingestion_ledger WHERE query_id = %s FOR UPDATE",
                       (source_of("held-ledger"),))
        with pytest.raises(CaptureError, match=r"consumer 'held-ledger': .* locked by another session .*pg_locks "
                                               r"shows which.*nothing was dropped"):
            db.capture.drop_consumer("held-ledger")
        assert registry_and_ledger() == before
    db.capture.drop_consumer("held-ledger")
    assert registry_and_ledger() == (0, 0)


def test_dropping_a_consumer_name_with_a_consumer_standing_by_is_refused_and_it_stays_listed(clean, conninfo):
    """A consumer standing by for its name — here behind a session that held the lead and ended without a word, as a
    SIGKILL'd leader's does (no 'released' notification: the standby tries again only after its ``idle_wait``) — was
    no protection against ``drop_consumer``: the name's row went under it, ``db.capture.status()`` no longer listed
    the consumer although it still waited, and once it led it started from the oldest retained change, firing the
    rules again on what the name had handled.  A consumer standing by runs as a leader does: the drop is refused (a
    CaptureError naming it and saying to stop it first), nothing dropped, and it stays listed; once it is closed, the
    name is dropped."""
    db = clean
    _app.register(db)
    name = "standby-dropped"
    with Watchdog(WATCHDOG_SECONDS, db.transactions.locks):
        with psycopg.connect(conninfo, autocommit=True) as holder:
            holder.execute("SELECT pg_advisory_lock(%s, %s)", leadership_lock(holder, name))
            waiting = db.capture.start(name, idle_wait=3600)        # (woken only by a notification)
            wait_until(lambda: any(consumer.standby for consumer in db.capture.status().consumers), 30,
                       "status to list the consumer standing by",
                       describe=lambda: f"{waiting.state}, {db.capture.status()}")
        # The holder's session ended: the lead is free, and the consumer still waits (its idle_wait is an hour).
        wait_until(lambda: db.capture.status().consumers[0].leader_pid is None, 30, "the holder's lock to go",
                   describe=lambda: f"{db.capture.status()}")
        with pytest.raises(CaptureError, match=rf"consumer {name!r} has a consumer standing by: pid "
                                               rf"{waiting.session_pid} .*stop it first.*nothing was dropped"):
            db.capture.drop_consumer(name)
        assert waiting.state is ConsumerState.STANDBY
        assert [standby for standby, _ in _standby_of(db, name)] == [waiting.session_pid]
        waiting.close()
        db.capture.drop_consumer(name)
        assert db.capture.status().consumers == ()


def test_a_standby_whose_session_was_lost_while_its_name_was_dropped_is_listed_again(clean, conninfo):
    """A consumer standing by whose listener session is lost stands by nowhere until it reconnects: its name may be
    dropped then (nothing runs under it).  Reconnected, it stood by again without its name's row — it made sure of it
    only as it first stood by —, so ``db.capture.status()`` did not list it until it led.  A new session stands by
    as the first did: the name's row made sure of (anew, from the oldest retained change: the name was dropped), the
    consumer listed standing by."""
    from activedb.capture import Step

    db = clean
    _app.register(db)
    name = "standby-reconnects"
    idle, go_on = threading.Event(), threading.Event()

    def hold_when_idle(step: Step, detail: int) -> None:
        if step is Step.IDLE and not go_on.is_set():
            idle.set()
            assert go_on.wait(WATCHDOG_SECONDS), "the test never let the consumer go on"

    with Watchdog(WATCHDOG_SECONDS, db.transactions.locks), \
            psycopg.connect(conninfo, autocommit=True) as holder:
        lock = leadership_lock(holder, name)
        holder.execute("SELECT pg_advisory_lock(%s, %s)", lock)
        waiting = db.capture.start(name, idle_wait=3600, on_step=hold_when_idle)
        try:
            assert idle.wait(30), f"the consumer never waited: {waiting.state}, {waiting.failure}"
            assert [standby for standby, _ in _standby_of(db, name)] == [waiting.session_pid]
            lost = waiting.session_pid
            holder.execute("SELECT pg_terminate_backend(%s)", (lost,))      # its session lost while it is held
            wait_until(lambda: all(not consumer.standby for consumer in db.capture.status().consumers), 30,
                       "the lost session's standby lock to go", describe=lambda: f"{db.capture.status()}")
            holder.execute("SELECT pg_advisory_unlock(%s, %s)", lock)
            db.capture.drop_consumer(name)          # (nothing stands by or leads under the name now)
            assert db.capture.status().consumers == ()
            # (the name registered anew, from the oldest retained change, and its new row's lock held: the consumer
            # stands by again)
            holder.execute("SELECT pg_advisory_lock(%s, %s)", leadership_lock(holder, name))
            go_on.set()
            wait_until(lambda: any(consumer.standby for consumer in db.capture.status().consumers), 30,
                       "status to list the reconnected consumer standing by",
                       describe=lambda: f"{waiting.state}, {waiting.session_pid}, {db.capture.status()}")
            [listed] = db.capture.status().consumers
            assert listed.name == name and listed.handled == 0 and listed.leader_pid == holder.info.backend_pid
            assert [standby.backend_pid for standby in listed.standby] == [waiting.session_pid] != [lost]
        finally:
            go_on.set()
            waiting.close()


def test_a_consumer_whose_names_row_was_dropped_before_it_had_its_locks_leads_under_the_names_new_row(
        clean, conninfo):
    """A name's locks are keyed by the id of its row.  A consumer that read the id, then waited for the locks while
    the name was dropped (``drop_consumer`` holds both locks of the id for its transaction), would lead under an id
    that is no longer its name's: a consumer registering the name anew would lead under the new id at the same time,
    and ``db.capture.status()`` would not show it leading.  Once it has the locks, it finds the row gone, lets them go,
    registers the name anew and leads under the new row's id."""
    from activedb.capture import _sql

    db = clean
    _app.register(db)
    name = "dropped-while-waiting"
    with Watchdog(WATCHDOG_SECONDS, db.transactions.locks), psycopg.connect(conninfo) as dropper:
        _, old_id = leadership_lock(dropper, name)
        dropper.commit()
        # What drop_consumer does, held open: both locks of the id for the transaction, then the row deleted.
        dropper.execute("SELECT pg_advisory_xact_lock(%s, %s)", (_sql.STANDBY_LOCK_CLASS, old_id))
        dropper.execute("SELECT pg_advisory_xact_lock(%s, %s)", (_sql.CONSUMER_LOCK_CLASS, old_id))
        dropper.execute(f"DELETE FROM {_sql.CONSUMERS} WHERE name = %s", (name,))
        consumer = db.capture.start(name, idle_wait=3600)
        try:
            wait_until(lambda: _waits_for_an_advisory_lock(conninfo), 30, "the consumer to wait for the name's locks",
                       describe=lambda: f"{consumer.state}, {consumer.failure}")
            dropper.commit()
            wait_until(lambda: consumer.state is ConsumerState.LEADING, 30, "the consumer to lead",
                       describe=lambda: f"{consumer.state}, {consumer.failure}, {db.capture.status()}")
            with db.engine.connect() as connection:
                new_id = connection.execute(sa.text(f"SELECT id FROM {_sql.CONSUMERS} WHERE name = :name"),
                                            {"name": name}).scalar_one()
            assert new_id != old_id and consumer.leadership_lock == (_sql.CONSUMER_LOCK_CLASS, new_id)
            [listed] = db.capture.status().consumers
            assert (listed.name, listed.leader_pid, listed.standby) == (name, consumer.session_pid, ())
        finally:
            consumer.close()


def test_a_leader_whose_names_row_was_deleted_by_hand_leads_the_names_new_row_and_no_other_consumer_does(
        clean, conninfo):
    """A name's row deleted by hand (plain SQL, not ``drop_consumer``, which refuses while the name is led) under its
    leader: the leader made the row anew as its next batch read no position, but went on holding the locks of the
    old row's id — so ``db.capture.status()`` showed no leader for the name, and a second consumer of the name led it
    at the same time under the new row's id.  The leader leads anew: it lets go of the old id's locks and takes the
    new row's, and the second consumer stands by."""
    from activedb.capture import _sql

    db = clean
    _app.register(db)
    name = "deleted-by-hand"
    with Watchdog(WATCHDOG_SECONDS, db.transactions.locks):
        first = db.capture.consumer(name)
        second = db.capture.consumer(name)
        try:
            assert first.run_until_caught_up() == 0 and first.state is ConsumerState.LEADING
            with psycopg.connect(conninfo, autocommit=True) as psql:
                psql.execute(f"DELETE FROM {_sql.CONSUMERS} WHERE name = %s", (name,))
                psql.execute("INSERT INTO orders (id, customer, amount) VALUES (96, 'x', 1)")
            assert first.run_until_caught_up() == 1 and first.state is ConsumerState.LEADING
            with db.engine.connect() as connection:
                new_id = connection.execute(sa.text(f"SELECT id FROM {_sql.CONSUMERS} WHERE name = :name"),
                                            {"name": name}).scalar_one()
            assert first.leadership_lock == (_sql.CONSUMER_LOCK_CLASS, new_id)
            assert [(consumer.name, consumer.leader_pid) for consumer in db.capture.status().consumers] == [
                (name, first.session_pid)]
            assert second.run_once() == 0 and second.state is ConsumerState.STANDBY
        finally:
            first.close()
            second.close()
    assert logged(db) == [("inserted", 96)]


@pytest.mark.parametrize("name", [None, 5, "", "a@b"])
def test_dropping_what_is_no_consumer_name_is_refused_saying_what_one_is(clean, name):
    """``db.capture.drop_consumer(name)`` of what is no consumer name failed with a bare AttributeError from hashing it
    for the leader's lock (None, a number) or dropped nothing silently (empty, '@'); now a CaptureError says what a
    consumer name is, as ``db.capture.consumer(name)`` does."""
    with pytest.raises(CaptureError, match=r"a consumer name is a non-empty string without '@'"):
        clean.capture.drop_consumer(name)


def test_a_rule_that_changes_its_captured_event_changes_neither_its_next_attempt_nor_another_rules_event(clean, conninfo):
    """Each attempt of each firing of a captured change gets the event as captured: a rule that changes its event's
    ``new`` and ``payload`` and then fails transiently (a serialization conflict: run again in the batch) sees the
    captured values again, and so does the other rule on the change.  Before, the first firing got the
    ``CapturedEvent``'s own event and every attempt of a firing the same one: the re-run saw 'mallory' and the note —
    as a batch run again (``RetryBatch``, a refused reaction's search) re-planned from the changed event."""
    db = clean
    seen = []
    failures = [activedb.SerializationConflict("a transient failure, once")]

    @db.rule(on=db.captured("orders", "inserted"), coupling="detached", priority=2)
    def first(tx, event):
        seen.append(("first", event.new["customer"], dict(event.payload).get("note")))
        event.new["customer"] = "mallory"
        event.payload["note"] = "changed"
        if failures:
            raise failures.pop()

    @db.rule(on=db.captured("orders", "inserted"), coupling="detached", priority=1)
    def second(tx, event):
        seen.append(("second", event.new["customer"], dict(event.payload).get("note")))
        event.new["customer"] = "eve"

    with psycopg.connect(conninfo, autocommit=True) as psql:
        psql.execute("INSERT INTO orders (id, customer, amount) VALUES (40, 'ann', 1)")
    assert db.capture.consumer().run_until_caught_up() == 1
    assert seen == [("first", "ann", None), ("first", "ann", None), ("second", "ann", None)]


def test_a_consumer_of_a_database_without_any_rule_refuses_its_batch_and_keeps_its_position(clean, conninfo):
    """A consumer run in a process that declared no rule at all (the application's module not imported) took every
    captured change as handled, no rule run, and moved its position past them: the changes' reactions were lost for
    good, and nothing said.  Now the batch is refused with ``NoRuleRegistered`` before anything of it is applied or
    recorded — the position stays, no ledger row —, and once the rules are registered the same changes fire them."""
    from activedb.ingest.errors import NoRuleRegistered

    db = clean
    assert db.rules.names() == []
    with psycopg.connect(conninfo, autocommit=True) as psql:
        psql.execute("INSERT INTO orders (id, customer, amount) VALUES (80, 'nora', 1), (81, 'nora', 2)")
    consumer = db.capture.consumer()
    try:
        with pytest.raises(NoRuleRegistered, match=r"^capture consumer 'default', the batch of 2 change\(s\) from .*: "
                                                   r"no rule is registered on this database, .* nothing of it was "
                                                   r"applied or recorded\. Register the rules first"):
            consumer.run_until_caught_up()
        [backlog] = db.capture.status().consumers
        assert (backlog.name, backlog.changes) == ("default", 2)
        assert ingestion_status(db, "capture:default") == [] and logged(db) == []
        _app.register(db)
        assert consumer.run_until_caught_up() == 2
        assert logged(db) == [("inserted", 80), ("inserted", 81)]
    finally:
        consumer.close()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")   # (the thread's end)
def test_a_consumer_thread_of_a_database_without_any_rule_stops_saying_why_and_keeps_its_position(clean, conninfo,
                                                                                                  caplog):
    """The same refusal on a consumer run on its own thread (``start()``, from Python: ``activedb capture consume``
    refuses a rule-less application before it starts): the thread ends, logging why (a service that reads only its
    logs sees it), ``wait_caught_up`` raises naming ``NoRuleRegistered`` and what to do, ``failure`` holds it, and the
    position stays (``capture status``: the changes still pending)."""
    from activedb.ingest.errors import NoRuleRegistered

    db = clean
    with psycopg.connect(conninfo, autocommit=True) as psql:
        psql.execute("INSERT INTO orders (id, customer, amount) VALUES (82, 'nora', 1)")
    consumer = db.capture.consumer()
    try:
        consumer.start()
        with pytest.raises(CaptureError, match=r"^capture consumer 'default' stopped: NoRuleRegistered\(.*no rule is "
                                               r"registered on this database, .* Register the rules first: import the "
                                               r"module that declares them") as raised:
            consumer.wait_caught_up(60)
        assert isinstance(raised.value.__cause__, NoRuleRegistered) and consumer.failure is raised.value.__cause__
        stopped = [record.getMessage() for record in caplog.records if record.name == "activedb.capture"
                   and record.levelname == "ERROR" and "stopped" in record.getMessage()]
        assert stopped and stopped[0].startswith("capture consumer 'default' stopped: NoRuleRegistered: "), stopped
        [backlog] = db.capture.status().consumers
        assert (backlog.name, backlog.changes, backlog.handled) == ("default", 1, 0), backlog
    finally:
        consumer.close()


def test_the_listener_connects_as_the_databases_engine_does(clean, database_url):
    """The consumer's listener (the session holding LISTEN and the lead's lock) was a ``psycopg.connect`` of the URL
    alone: the engine's ``connect_args`` (TLS settings, say) were left out of it, and its timeout was 5 s whatever
    the URL said.  It is a session of the database's engine now, detached from the pool: an ``application_name``
    given as a ``connect_args`` is the listener's too."""
    own = activedb.connect(database_url, engine=activedb.EngineOptions(
        create_engine={"connect_args": {"application_name": "listener-test"}}))
    try:
        _app.register(own)
        consumer = own.capture.consumer("named-listener")
        assert consumer.run_until_caught_up() == 0 and consumer.state is ConsumerState.LEADING
        assert consumer.leadership_lock is not None
        lock_class, key = consumer.leadership_lock
        with clean.engine.connect() as connection:
            holders = connection.execute(sa.text(
                "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a USING (pid) WHERE l.locktype = "
                "'advisory' AND l.granted AND l.classid = :class AND l.objid = :key AND l.database = "
                "(SELECT oid FROM pg_database WHERE datname = current_database())"),
                {"class": lock_class, "key": key}).scalars().all()
        assert holders == ["listener-test"], holders
        consumer.close()
    finally:
        own.close()


def test_a_listener_that_cannot_connect_is_a_database_unavailable_with_the_advice_of_its_cause():
    """The consumer goes on after a ``DatabaseUnavailable`` from its listener (it tries again later): the listener
    made by the engine's pool met the driver's own ``OperationalError`` (a pool does not wrap it), which would have
    escaped the consumer's loop — caught while moving the listener onto the engine."""
    import socket
    import types

    from activedb.capture._leader import Listener
    from activedb.errors import DatabaseUnavailable

    with socket.socket() as probe:                  # a port nothing listens on: the connection is refused
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    engine = sa.create_engine(f"postgresql+psycopg://someone:secret@127.0.0.1:{port}/nowhere")
    handle = types.SimpleNamespace(engine=engine, describe=lambda: f"host 127.0.0.1:{port}, database 'nowhere'")
    try:
        with pytest.raises(DatabaseUnavailable) as caught:
            Listener(handle, "refused").connect()
    finally:
        engine.dispose()
    said = str(caught.value)
    assert said.startswith("capture consumer 'refused': cannot connect to PostgreSQL") and "secret" not in said, said
    assert "Nothing accepts connections there" in said, said
