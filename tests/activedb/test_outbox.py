"""The outbox of detached-family firings (``activedb/outbox``), on real PostgreSQL.

* a record is written with the trigger's outcome, run in a group transaction and marked done there;
  firings the outcome rules out are cancelled, never written;
* many firings share few group commits; a member whose flush fails is isolated by splitting the group
  (the others commit), a member that raises fails alone — recorded with rule, trigger, event and error,
  shown by ``activedb outbox`` and run again by ``--retry``;
* a retried ``Database.run`` attempt leaves no detached firing behind;
* a tree that fires no detached-family rule enlists no outbox participant (``db.run`` included); one that
  fires later, after another participant, still gets its firings run exactly once, and the abort of a
  replayed attempt stays no outcome for a rule on the ``aborted`` event;
* a sequence reset (``TRUNCATE … RESTART IDENTITY``) never makes a cached generated key collide: the
  transaction is re-run with fresh keys, no detached insert is lost;
* events survive the round trip through the record exactly (datetimes, tuples, NUL characters, …).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import decimal
import json
import threading
import uuid

import pytest
import sqlalchemy as sa
from click.testing import CliRunner

import activedb
from activedb import Coupling, Event, EventKind, lowlevel
from activedb.cli import main
from activedb.clock import ManualClock
from activedb.errors import GeneratedKeysReset, OutboxError, RuleDefinitionChangedWarning, SerializationConflict
from activedb.outbox import _records
from activedb.testing import Watchdog, wait_until
from tests._clocks import ReadPausingClock
from tests._sessions import end_sessions, sessions
from tests._unshowable import Unshowable

TIMEOUT = 60


@pytest.fixture
def db(migrated):
    database = activedb.connect(migrated, outbox_options={"recovery_interval": None, "group_size": 64})
    with database.engine.begin() as connection:
        connection.execute(sa.text("TRUNCATE items, events_seen, accounts, activedb_outbox, activedb_rules "
                                   "RESTART IDENTITY"))
    yield database
    database.rules.wait_idle(TIMEOUT)
    database.close()


def seen(db) -> list[tuple]:
    with db.engine.connect() as connection:
        return sorted(tuple(row) for row in connection.execute(sa.text("SELECT rule, detail FROM events_seen")))


def records(db) -> list[tuple]:
    with db.engine.connect() as connection:
        return [tuple(row) for row in connection.execute(sa.text(
            "SELECT rule, status, trigger_outcome, error IS NOT NULL FROM activedb_outbox ORDER BY id"))]


@contextlib.contextmanager
def another_live_process(db, owner: int = 42):
    """Inside the block process ``owner`` is alive (it holds its liveness lock: no recovery pass claims its records);
    after it, it died."""
    lock = _records.LivenessLock(db.engine, owner)
    lock.take()
    try:
        yield
    finally:
        lock.release()


def signal_go(db, count: int) -> None:
    """Signal ``go`` ``count`` times (``n`` = 0, 1, …) in one transaction and wait for the detached firings."""
    with db.transaction() as tx:
        for number in range(count):
            tx.signal("go", n=number)
    db.rules.wait_idle(TIMEOUT)


def one_failed_firing(db, rule: str, *, amount: int):
    """Declare detached rule ``rule`` on signal ``pay``, which always raises, fire it once with ``amount`` and return
    its failure (``db.outbox.failures()``)."""
    def always_fails(tx, event):
        raise ZeroDivisionError("the exchange rate is zero")

    db.rule(on=db.signalled("pay"), coupling=Coupling.DETACHED, name=rule)(always_fails)
    with db.transaction() as tx:
        tx.signal("pay", amount=amount)
    db.rules.wait_idle(TIMEOUT)
    [failure] = db.outbox.failures()
    return failure


def test_a_record_carries_the_outcome_and_is_done_in_the_firings_own_flush(db):
    for mode in (Coupling.DETACHED, Coupling.DETACHED_CAUSALLY_DEPENDENT, Coupling.EXCLUSIVE_CAUSALLY_DEPENDENT):
        db.rule(on=db.signalled("go"), coupling=mode, name=mode.value)(
            lambda tx, event, name=mode.value: tx.insert("events_seen", rule=name, detail=event.payload["n"]))
    with db.transaction() as tx:
        tx.signal("go", n="1")
        with pytest.raises(RuntimeError):
            with tx.subtransaction() as child:           # a trigger that aborts inside a committed tree
                child.signal("go", n="2")
                raise RuntimeError("the event fails")
    db.rules.wait_idle(TIMEOUT)
    assert seen(db) == [("detached", "1"), ("detached", "2"), ("detached_causally_dependent", "1"),
                        ("exclusive_causally_dependent", "2")]
    assert sorted(records(db)) == [
        ("detached", "done", "aborted", False), ("detached", "done", "committed", False),
        ("detached_causally_dependent", "done", "committed", False),
        ("exclusive_causally_dependent", "done", "aborted", False)]
    counters = db.rules.statistics().per_rule
    assert counters["exclusive_causally_dependent"].cancelled == 1       # its trigger "1" committed
    assert counters["detached_causally_dependent"].cancelled == 1        # its trigger "2" aborted
    with db.engine.connect() as connection:                              # done in the group's own flush
        assert connection.execute(sa.text(
            "SELECT count(*) FROM activedb_outbox o JOIN activedb_transaction_log l "
            "ON l.transaction_id = o.transaction_id")).scalar() == 4


def test_a_trigger_below_an_aborted_subtransaction_effectively_aborted(db):
    for mode in (Coupling.DETACHED_CAUSALLY_DEPENDENT, Coupling.EXCLUSIVE_CAUSALLY_DEPENDENT):
        db.rule(on=db.signalled("go"), coupling=mode, name=mode.value)(
            lambda tx, event, name=mode.value: tx.insert("events_seen", rule=name, detail=event.payload["n"]))
    with db.transaction() as tx:
        with tx.subtransaction() as child:
            with child.subtransaction() as grandchild:   # committed, under a parent that commits
                grandchild.signal("go", n="1")
        with pytest.raises(RuntimeError):
            with tx.subtransaction() as child:
                with child.subtransaction() as grandchild:   # committed, under a parent that aborts
                    grandchild.signal("go", n="2")
                raise RuntimeError("the parent fails")
    db.rules.wait_idle(TIMEOUT)
    assert seen(db) == [("detached_causally_dependent", "1"), ("exclusive_causally_dependent", "2")]


def test_many_firings_share_few_group_commits(db):
    db.rule(on=db.signalled("go"), coupling=Coupling.DETACHED, name="many")(
        lambda tx, event: tx.insert("events_seen", rule="many", detail=str(event.payload["n"])))
    groups_before = db.outbox.statistics().groups
    with db.transaction() as tx:
        for number in range(300):
            tx.signal("go", n=number)
    db.rules.wait_idle(TIMEOUT)
    assert len(seen(db)) == 300
    groups = db.outbox.statistics().groups - groups_before
    assert 300 // 64 <= groups <= 300 // 16        # group_size 64: a handful of commits, not 300


def test_a_member_whose_writes_postgresql_refuses_fails_alone_and_the_rest_commit(db):
    @db.rule(on=db.signalled("go"), coupling=Coupling.DETACHED, name="sometimes_huge")
    def sometimes_huge(tx, event):
        number = event.payload["n"]
        key = "x" * 900_000 + uuid.uuid4().hex * 2000 if number == 7 else f"k{number}"   # too large to index
        tx.write("items", key, value=number)

    assert_seven_fails_alone(db, "sometimes_huge", "54000")


@pytest.mark.parametrize("abort", ["refused", "conflict"])
def test_a_group_that_aborts_after_its_members_actions_ran_counts_one_outcome_per_attempt(db, abort):
    """A group whose commit fails after its members' actions ran undoes those runs: each such attempt counted
    ``fired`` and must end in one outcome — ``cancelled`` when the member runs again, ``failed`` when it fails for good
    — so that ``fired`` stays the sum of the outcomes (rules README, "Counters count attempts").  ``refused``:
    PostgreSQL refuses one member's row at the flush (not retryable: the group is split until that member is alone);
    ``conflict``: another transaction changes the row the only member read, after its action ran and before its
    group's flush (a serialization conflict: the group runs again)."""
    rule = f"group_aborts_{abort}"
    changed = threading.Event()

    @db.rule(on=db.signalled("go"), coupling=Coupling.DETACHED, name=rule)
    def action(tx, event):
        number = event.payload["n"]
        if abort == "refused":
            key = "x" * 900_000 + uuid.uuid4().hex * 2000 if number == 7 else f"k{number}"   # too large to index
            tx.write("items", key, value=number)
            return
        current = tx.read("items", "counted")
        if not changed.is_set():            # (its first run only: the change its group's flush then finds)
            changed.set()
            with db.engine.begin() as connection:
                connection.execute(sa.text("UPDATE items SET value = value + 100 WHERE key = 'counted'"))
        tx.write("items", "counted", value=current["value"] + 1)

    if abort == "conflict":
        with db.transaction() as tx:
            tx.insert("items", key="counted", value=0)
    with db.transaction() as tx:
        for number in range(20 if abort == "refused" else 1):
            tx.signal("go", n=number)
    db.rules.wait_idle(TIMEOUT)
    counters = db.rules.statistics().per_rule[rule]
    assert counters.fired == (counters.executed + counters.failed + counters.cancelled + counters.condition_false), \
        counters
    if abort == "refused":
        assert (counters.executed, counters.failed) == (19, 1), counters
        assert counters.cancelled == counters.fired - 20 > 0, counters       # (each run undone by a split)
    else:
        assert (counters.fired, counters.executed, counters.cancelled, counters.failed) == (2, 1, 1, 0), counters
        with db.engine.connect() as connection:
            assert connection.execute(sa.text("SELECT value FROM items WHERE key = 'counted'")).scalar() == 101
    assert [status for _, status, *_ in records(db)].count("done") == (19 if abort == "refused" else 1)


class EndsItsSession(lowlevel.CommitParticipant):
    """Ends its own PostgreSQL session in the flush of the tree it was enlisted in: the connection breaks there,
    after the tree's work ran (PostgreSQL's ``pg_terminate_backend`` of the flush's own backend)."""

    def write(self, transaction, connection) -> None:
        connection.exec_driver_sql("SELECT pg_terminate_backend(pg_backend_pid())")


@pytest.mark.parametrize("then", ["recover", "close"])
def test_a_group_parked_after_its_members_actions_ran_counts_one_outcome_per_attempt(migrated, then):
    """A group whose flush loses its connection after its members' actions ran is parked for the next recovery pass:
    the attempt counted ``fired`` and its action ran, but nothing committed.  Run again (``recover``), that attempt
    ends ``cancelled`` and the run again ``executed``; dropped from memory by ``close()`` (its record stays pending
    for the next process), it ends ``cancelled`` too — ``fired`` stays the sum of the outcomes."""
    database = activedb.connect(migrated, outbox_options={"recovery_interval": None})
    with database.engine.begin() as connection:
        connection.execute(sa.text("TRUNCATE items, activedb_outbox RESTART IDENTITY"))
    rule = f"parked_then_{then}"
    broke = threading.Event()

    @database.rule(on=database.signalled("go"), coupling=Coupling.DETACHED, name=rule)
    def action(tx, event):
        tx.write("items", rule, value=1)
        if not broke.is_set():              # (its first run: its group's flush loses the connection)
            broke.set()
            lowlevel.enlist(tx, EndsItsSession())

    try:
        with database.transaction() as tx:
            tx.signal("go")
        wait_until(lambda: database.outbox.statistics().parked == 1, TIMEOUT, "the group parked",
                   lambda: (database.outbox.statistics(), records(database)))
        if then == "recover":
            database.outbox.recover()
            database.rules.wait_idle(TIMEOUT)
    finally:
        database.close()
    counters = database.rules.statistics().per_rule[rule]
    assert counters.fired == (counters.executed + counters.failed + counters.cancelled + counters.condition_false), \
        counters
    expected = (2, 1, 1) if then == "recover" else (1, 0, 1)
    assert (counters.fired, counters.executed, counters.cancelled) == expected, counters
    assert [status for _, status, *_ in records(database)] == ["done" if then == "recover" else "pending"]


def item_rows(db) -> list[tuple]:
    with db.engine.connect() as connection:
        return [tuple(row) for row in connection.execute(sa.text("SELECT key, value FROM items ORDER BY key"))]


def assert_the_next_process_runs_each_once(migrated, rule: str, action, statuses: list[str], rows, expected) -> None:
    """The database's next process (``migrated``'s last one closed), with ``action`` declared again as detached rule
    ``rule`` on signal ``go``, runs each pending record once: the records end as ``statuses``, ``rows(db)`` as
    ``expected``, and each run is counted ``fired`` and ``executed`` once."""
    following = activedb.connect(migrated, outbox_options={"recovery_interval": None})
    try:
        following.rule(on=following.signalled("go"), coupling=Coupling.DETACHED, name=rule)(action)
        ran = statuses.count("done")
        wait_until(lambda: following.outbox.statistics().done == ran, TIMEOUT, "the next process ran the records",
                   lambda: records(following))
        following.rules.wait_idle(TIMEOUT)
        assert [status for _, status, *_ in records(following)] == statuses
        assert rows(following) == expected
        counters = following.rules.statistics().per_rule[rule]
        assert (counters.fired, counters.executed, counters.cancelled, counters.failed) == (ran, ran, 0, 0), counters
    finally:
        following.close()


def test_a_group_that_loses_its_connection_after_close_is_dropped_cancelled_and_runs_once_in_the_next_process(
        migrated, caplog):
    """A group whose flush loses its connection after ``close()`` began (``close()`` waits for it) parks once closed:
    dropped from memory at once, as ``close()`` drops the parked ones — each member whose action ran counted
    ``cancelled`` (the group's abort undid that attempt), nothing of it written, every record pending for the
    database's next process, which runs each once.  The test holds the group's first member until ``close()`` has
    dropped the firing queued after the group (so the executor is closed), then lets the group's flush end its own
    session (``EndsItsSession``)."""
    database = activedb.connect(migrated, outbox_options={"recovery_interval": None, "group_size": 2,
                                                          "max_groups": 1})
    with database.engine.begin() as connection:
        connection.execute(sa.text("TRUNCATE items, activedb_outbox RESTART IDENTITY"))
    rule = "loses_its_connection_after_close"
    started, go_on = threading.Event(), threading.Event()

    def action(tx, event):
        number = event.payload["n"]
        tx.write("items", f"after_close_{number}", value=number)
        if number == 0 and not started.is_set():    # (the group's first member, its first run: held until close())
            started.set()
            assert go_on.wait(TIMEOUT), "the test never let the held member go on"
            lowlevel.enlist(tx, EndsItsSession())

    database.rule(on=database.signalled("go"), coupling=Coupling.DETACHED, name=rule)(action)

    def items() -> list[tuple]:
        with database.engine.connect() as connection:
            return connection.execute(sa.text("SELECT key, value FROM items WHERE key LIKE 'after_close_%' "
                                              "ORDER BY key")).all()

    closing = threading.Thread(target=database.close, name="closes-the-database")
    try:
        assert database.outbox.wait_recovery_idle(TIMEOUT), "the pass the rule's registration woke never ended"
        with caplog.at_level("WARNING", logger="activedb.outbox"):
            with database.transaction() as tx:
                for number in range(3):         # (a group of 0 and 1; 2 queued after it)
                    tx.signal("go", n=number)
            assert started.wait(TIMEOUT), "the group never started"
            assert database.outbox.running == 3, database.outbox.running
            closing.start()
            wait_until(lambda: database.outbox.running == 2, TIMEOUT, "close() dropped the firing queued after the group",
                       lambda: database.outbox.running)
            go_on.set()
            closing.join(TIMEOUT)
            assert not closing.is_alive(), "close() did not return once the group parked"
        assert (database.outbox.running, database.outbox.runners) == (0, 0)
        counters = database.rules.statistics().per_rule[rule]
        # (Each attempt ends in one outcome: 0 and 1 ran in the group its lost connection undid, 2 never ran.)
        assert counters.fired == (counters.executed + counters.failed + counters.cancelled
                                  + counters.condition_false), counters
        assert (counters.fired, counters.executed, counters.cancelled, counters.failed) == (3, 0, 3, 0), counters
        said = [record.getMessage() for record in caplog.records]
        assert not [message for message in said if "closing while" in message], said
        [lost] = [message for message in said if "PostgreSQL unreachable" in message]
        assert "next recovery pass" not in lost and "next process" in lost, lost
    finally:
        go_on.set()
        if closing.ident is not None:
            closing.join(TIMEOUT)
        database.close()
    assert items() == []
    assert [status for _, status, *_ in records(database)] == ["pending"] * 3
    assert_the_next_process_runs_each_once(migrated, rule, action, ["done"] * 3, item_rows, [
        ("after_close_0", 0), ("after_close_1", 1), ("after_close_2", 2)])


def assert_seven_fails_alone(db, rule: str, sqlstate: str) -> None:
    """Twenty signals ``go`` (n = 0..19) in one transaction, whose detached firings run as one group: the member
    for n = 7 fails alone with ``sqlstate``, the other 19 commit their ``items`` rows."""
    with db.transaction() as tx:
        for number in range(20):
            tx.signal("go", n=number)
    db.rules.wait_idle(TIMEOUT)
    with db.engine.connect() as connection:
        values = sorted(connection.execute(sa.text("SELECT value FROM items")).scalars())
    assert values == [number for number in range(20) if number != 7]
    statuses = [status for _, status, _, _ in records(db)]
    assert statuses.count("done") == 19 and statuses.count("failed") == 1
    assert db.outbox.statistics().splits >= 1
    [failure] = db.outbox.failures()
    assert failure.rule == rule and sqlstate in failure.error


def test_a_rule_error_whose_str_raises_is_recorded_failed_naming_its_type(db):
    """The failed record keeps the type of what the rule raised and why it shows no more, and the outbox goes on:
    before, taking the error's text for the record raised the str's own error out of the outbox's group runner."""
    def always_fails(tx, event):
        raise Unshowable()

    db.rule(on=db.signalled("pay"), coupling=Coupling.DETACHED, name="unshowable")(always_fails)
    with db.transaction() as tx:
        tx.signal("pay", amount=1)
    wait_until(lambda: db.outbox.failures(), TIMEOUT, "the detached rule's failed record",
               describe=lambda: records(db))
    [failure] = db.outbox.failures()
    assert failure.rule == "unshowable" and failure.error == "Unshowable: <str failed: RuntimeError: str broke>", \
        failure


def test_a_failing_rule_is_recorded_shown_and_retried(db, migrated):
    broken = threading.Event()
    broken.set()

    @db.rule(on=db.signalled("pay"), coupling=Coupling.DETACHED_CAUSALLY_DEPENDENT, name="ledger_entry")
    def ledger_entry(tx, event):
        if broken.is_set():
            raise ZeroDivisionError("the exchange rate is zero")
        tx.insert("events_seen", rule="ledger_entry", detail=str(event.payload["amount"]))

    with db.transaction(name="payment") as tx:
        tx.signal("pay", amount=12)
        trigger = tx.id
    db.rules.wait_idle(TIMEOUT)
    [failure] = db.outbox.failures()
    assert failure.rule == "ledger_entry" and failure.coupling == "detached_causally_dependent"
    assert failure.trigger.startswith(trigger) and failure.trigger_outcome == "committed"
    assert "signal pay" in failure.event and "ZeroDivisionError: the exchange rate is zero" in failure.error
    assert seen(db) == []

    runner = CliRunner()
    shown = runner.invoke(main, ["--url", migrated, "outbox"], env={"COLUMNS": "250"})
    assert shown.exit_code == 0, shown.output
    assert "ledger_entry" in shown.output and "exchange rate is zero" in shown.output
    # What the table leaves out is said in plain words, not in the ingestion's term ("lowered micro-batch").
    assert "lowered" not in shown.output, shown.output
    assert ("not listed: firings of detached rules that only insert rows, which the ingestion ran in the commit of "
            "the micro-batch that triggered them") in " ".join(shown.output.split()), shown.output
    as_json = json.loads(runner.invoke(main, ["--url", migrated, "outbox", "--json"]).output)
    assert as_json["statistics"]["failed"] == 1 and as_json["failed"][0]["id"] == failure.id

    broken.clear()                                       # the cause is fixed
    retried = runner.invoke(main, ["--url", migrated, "outbox", "--retry", str(failure.id)])
    assert retried.exit_code == 0 and "1 failed firing(s) are pending again" in retried.output
    # Pending is not run: the output says who runs it (a process that registers the rule) and how to run it now.
    assert "they run in a process that registers their rules" in retried.output, retried.output
    assert "activedb outbox --app APP" in retried.output
    assert seen(db) == []
    assert db.outbox.recover() == 1
    db.rules.wait_idle(TIMEOUT)
    assert seen(db) == [("ledger_entry", "12")]
    assert db.outbox.failures() == []


def test_a_detached_rule_whose_action_lets_a_nested_rules_failure_through_is_recorded_cancelled_by_it(db):
    """A detached rule whose action signals an event whose immediate rule raises, and lets the RuleFailed through:
    the rule manager counts the nested rule ``failed`` and the detached one ``cancelled`` (it did not end itself).
    Its record still needs a person (``failures()``, ``retry_failed``: nothing of it took effect), and its error says
    it was cancelled and which rule failed.  Before, the record said only the nested rule's error
    ("ValueError: the check breaks"), under the detached rule's name, as if that rule had raised it."""
    db.rule(on=db.signalled("pay"), coupling=Coupling.DETACHED, name="forwards")(
        lambda tx, event: tx.signal("checked"))

    @db.rule(on=db.signalled("checked"), name="checks")
    def checks(tx, event):
        raise ValueError("the check breaks")

    with db.transaction() as tx:
        tx.signal("pay", amount=1)
    db.rules.wait_idle(TIMEOUT)
    per_rule = db.rules.statistics().per_rule
    assert (per_rule["forwards"].fired, per_rule["forwards"].cancelled, per_rule["forwards"].failed) == (1, 1, 0)
    assert (per_rule["checks"].fired, per_rule["checks"].failed) == (1, 1)
    [failure] = db.outbox.failures()
    assert failure.rule == "forwards", failure
    assert failure.error.startswith("cancelled: rule 'checks'"), failure.error
    assert "ValueError: the check breaks" in failure.error, failure.error


def test_outbox_retry_of_ids_that_are_no_failed_firing_is_refused_naming_them_and_changes_nothing(db, migrated):
    """``activedb outbox --retry ID`` with an id no failed firing has (a typo, a done one) said "0 failed firing(s) are
    pending again", exit 0; it says which ids are not failed firings and where their ids are listed, as ``activedb
    rules enable`` does of an unknown name, and retries none of those given."""
    failure = one_failed_firing(db, "always_fails", amount=1)
    runner = CliRunner()
    for unknown in (failure.id + 1000, 2**70):
        result = runner.invoke(main, ["--url", migrated, "outbox", "--retry", str(failure.id), str(unknown)])
        assert result.exit_code == 1, result.output
        assert f"no failed firing with id {unknown}" in result.output and "activedb outbox" in result.output
        assert "nothing was changed" in result.output, result.output
        assert [one.id for one in db.outbox.failures()] == [failure.id]
    result = runner.invoke(main, ["--url", migrated, "outbox", "--retry", str(failure.id)])
    assert result.exit_code == 0 and "1 failed firing(s) are pending again" in result.output, result.output


def test_outbox_limit_zero_shows_every_failed_firing_as_dead_letters_limit_zero_does(db, migrated):
    """``activedb outbox --limit 0`` means all, as ``dead-letters list --limit 0`` does: it showed no failed firing
    at all (the statistics still counted them), so an operator asking for all of them saw none."""
    @db.rule(on=db.signalled("pay"), coupling=Coupling.DETACHED, name="always_fails")
    def always_fails(tx, event):
        raise ZeroDivisionError("the exchange rate is zero")

    for amount in (1, 2, 3):
        with db.transaction() as tx:
            tx.signal("pay", amount=amount)
    db.rules.wait_idle(TIMEOUT)
    runner = CliRunner()
    for limit, shown in (("0", 3), ("2", 2)):
        result = runner.invoke(main, ["--url", migrated, "outbox", "--limit", limit, "--json"])
        assert result.exit_code == 0, result.output
        as_json = json.loads(result.output)
        assert as_json["statistics"]["failed"] == 3 and len(as_json["failed"]) == shown, (limit, as_json)
    assert "(0: all)" in runner.invoke(main, ["outbox", "--help"]).output


def test_outbox_retry_with_app_runs_the_retried_firings_in_the_command(db, migrated, tmp_path):
    """``activedb outbox --retry --app APP`` registers APP's rules and runs the retried firings before it returns."""
    failure = one_failed_firing(db, "ledger_entry", amount=7)
    app = tmp_path / "ledger_app.py"
    app.write_text(
        "from activedb import Coupling\n\n\n"
        "def register(db):\n"
        "    @db.rule(on=db.signalled('pay'), coupling=Coupling.DETACHED, name='ledger_entry')\n"
        "    def ledger_entry(tx, event):\n"
        "        tx.insert('events_seen', rule='ledger_entry', detail=f\"fixed {event.payload['amount']}\")\n")
    with pytest.warns(RuleDefinitionChangedWarning):        # the fixed rule is a new version of it
        result = CliRunner().invoke(main, ["--url", migrated, "outbox", "--retry", str(failure.id), "--app", str(app)])
    assert result.exit_code == 0, result.output
    assert f"ran the pending firings of {app}'s rules: 1 done, 0 failed" in result.output, result.output
    assert seen(db) == [("ledger_entry", "fixed 7")]
    assert db.outbox.failures() == []


def test_done_records_older_than_an_age_are_pruned_and_the_rest_kept(db, migrated):
    """``db.outbox.prune(older_than=)`` and ``activedb outbox --prune-done SECONDS``: the records of firings done
    longer ago go; newer done ones, failed and pending ones stay (a failed one is still shown and retried)."""
    @db.rule(on=db.signalled("tick"), coupling=Coupling.DETACHED, name="tick_seen")
    def tick_seen(tx, event):
        if event.payload["n"] < 0:
            raise ValueError("a negative tick")
        tx.insert("events_seen", rule="tick_seen", detail=str(event.payload["n"]))

    for n in (1, 2, 3, -1):
        with db.transaction() as tx:
            tx.signal("tick", n=n)
    db.rules.wait_idle(TIMEOUT)
    with db.engine.begin() as connection:      # the first two ran an hour ago
        connection.execute(sa.text("UPDATE activedb_outbox SET finished_at = finished_at - interval '1 hour' "
                                   "WHERE event -> 'payload' ->> 'n' IN ('1', '2')"))
    assert db.outbox.prune(older_than=dt.timedelta(minutes=30)) == 2
    assert [(rule, status) for rule, status, _, _ in records(db)] == [("tick_seen", "done"), ("tick_seen", "failed")]
    result = CliRunner().invoke(main, ["--url", migrated, "outbox", "--prune-done", "0", "--json"])
    assert result.exit_code == 0, result.output
    assert "deleted 1 record(s) of firings done more than 0 s ago" in result.output
    assert [status for _, status, _, _ in records(db)] == ["failed"] and len(db.outbox.failures()) == 1
    assert seen(db) == [("tick_seen", "1"), ("tick_seen", "2"), ("tick_seen", "3")]       # (their effects stay)
    with pytest.raises(ValueError, match="non-negative age"):
        db.outbox.prune(older_than=-1)


@pytest.mark.parametrize("age", [-1, dt.timedelta(seconds=-1), float("nan"), "1h", None])
def test_prune_refuses_an_age_that_is_no_age_with_an_activedb_error(db, age):
    """A negative age (or NaN, or no number) was a bare ValueError — or for a text or None a TypeError from float() —,
    no ActivedbError; it is a BadArgument (still a ValueError) saying what to give."""
    with pytest.raises(activedb.BadArgument, match=r"outbox.prune\(older_than=...\) takes a non-negative age"):
        db.outbox.prune(older_than=age)


def test_an_attempt_database_run_retries_leaves_no_detached_firing(db):
    db.rule(on=db.signalled("go"), coupling=Coupling.DETACHED, name="once")(
        lambda tx, event: tx.insert("events_seen", rule="once", detail=str(event.payload["attempt"])))
    attempts = []

    def body(tx):
        attempts.append(1)
        tx.signal("go", attempt=len(attempts))
        if len(attempts) == 1:
            raise SerializationConflict("as if another process had changed a row this attempt read")

    db.run(body)
    db.rules.wait_idle(TIMEOUT)
    assert len(attempts) == 2 and seen(db) == [("once", "2")]




@pytest.mark.parametrize("where", ["the rule raises it", "the group's commit raises it"])
def test_a_detached_firing_run_again_after_a_serialization_conflict_counts_each_attempt(db, where):
    """A detached firing whose first run ends in a serialization conflict — raised by its action, or by its group
    transaction's commit after it ran — is run again by the outbox and commits.  Counters count attempts (rules
    README, "Counters count attempts"), as a captured firing run again does: ``fired`` twice, each attempt one
    outcome — the first ``failed`` (its action raised) or ``cancelled`` (its group's abort undid it), the second
    ``executed``.  Before, the second attempt counted no ``fired``: fired 1 with two outcomes, or with one when the
    group's abort left the first attempt in none."""
    name = "conflicts_once"
    conflicts: list[int] = []

    class ConflictOnce(lowlevel.CommitParticipant):
        def before_flush(self, transaction):
            if not conflicts:
                conflicts.append(1)
                raise SerializationConflict("as if another process had changed a row the group read")

    def action(tx, event):
        tx.insert("events_seen", rule=name, detail="ran")
        if where == "the rule raises it":
            if not conflicts:
                conflicts.append(1)
                raise SerializationConflict("as if another process had changed a row this attempt read")
        else:
            lowlevel.enlist(tx, ConflictOnce())

    db.rule(on=db.signalled(name), coupling=Coupling.DETACHED, name=name)(action)
    with db.transaction() as tx:
        tx.signal(name)
    db.rules.wait_idle(TIMEOUT)
    counters = db.rules.statistics().per_rule[name]
    assert conflicts == [1] and seen(db) == [(name, "ran")]
    assert records(db) == [(name, "done", "committed", False)]
    first = "failed" if where == "the rule raises it" else "cancelled"
    assert ((counters.fired, counters.executed, counters.failed, counters.cancelled, counters.condition_false)
            == (2, 1, int(first == "failed"), int(first == "cancelled"), 0)), counters


@pytest.mark.parametrize("whose", ["a dead process's record", "a record retry_failed made pending"])
def test_a_record_a_recovery_pass_runs_counts_fired_for_its_run(db, whose):
    """A recovery pass runs records this process's dispatch did not count (rules README, "Counters count attempts"):
    a dead process's — its ``fired`` was that process's —, or one ``retry_failed`` made pending again — its earlier
    attempt here counted ``fired`` and ``failed`` already.  Its run here is an attempt: ``fired`` once more, and its
    one outcome.  Before, the run counted its outcome with no ``fired``: fired 0 with executed 1, or fired 1 with
    failed 1 and executed 1."""
    name = "recovered_here"
    broken = threading.Event()

    def run(tx, event):
        if broken.is_set():
            raise ZeroDivisionError("the exchange rate is zero")
        tx.insert("events_seen", rule=name, detail=str(event.payload["n"]))

    if whose == "a dead process's record":
        event = json.dumps(_records.encode_event(Event(EventKind.SIGNAL, "go", payload={"n": 7}, transaction="T0")))
        with db.engine.begin() as connection:       # recorded by a process that died (owner 42 holds no lock)
            connection.execute(sa.text(
                "INSERT INTO activedb_outbox (rule, coupling, event, chain, trigger_id, trigger_outcome, owner) "
                "VALUES (:rule, 'detached', CAST(:event AS jsonb), '{}', 'T0', 'committed', 42)"),
                {"rule": name, "event": event})
        db.rule(on=db.signalled("go"), coupling=Coupling.DETACHED, name=name)(run)
        expected = (1, 1, 0, 0, 0)
    else:
        broken.set()
        db.rule(on=db.signalled("go"), coupling=Coupling.DETACHED, name=name)(run)
        with db.transaction() as tx:
            tx.signal("go", n=7)
        db.rules.wait_idle(TIMEOUT)
        [failure] = db.outbox.failures()
        broken.clear()
        assert db.outbox.retry_failed([failure.id]) == 1
        expected = (2, 1, 1, 0, 0)
    db.outbox.recover()             # (the registration's pass, or retry_failed's, may have claimed it already)
    wait_until(lambda: seen(db) == [(name, "7")], TIMEOUT, "the recovered record ran")
    db.rules.wait_idle(TIMEOUT)
    assert records(db) == [(name, "done", "committed", False)]
    counters = db.rules.statistics().per_rule[name]
    assert ((counters.fired, counters.executed, counters.failed, counters.cancelled, counters.condition_false)
            == expected), counters


def test_a_detached_firing_that_raises_when_run_again_after_its_groups_conflict_fails_for_good_at_once(db):
    """A firing whose group's commit raised a serialization conflict runs again; its action raises an error of its
    own then: that is the rule's failure, for good at once (README, "Failures and retries").  Before, the run again
    happened while the runner handled the conflict, so the rule's error had the conflict as its context and passed
    for a retryable failure: the firing ran a third time, counted fired 3, cancelled 1, failed 2."""
    name = "raises_after_conflict"
    runs: list[int] = []

    class ConflictOnce(lowlevel.CommitParticipant):
        def before_flush(self, transaction):
            if len(runs) == 1:
                raise SerializationConflict("as if another process had changed a row the group read")

    def action(tx, event):
        runs.append(1)
        if len(runs) == 1:
            lowlevel.enlist(tx, ConflictOnce())
        else:
            raise ZeroDivisionError("the exchange rate is zero")

    db.rule(on=db.signalled(name), coupling=Coupling.DETACHED, name=name)(action)
    with db.transaction() as tx:
        tx.signal(name)
    db.rules.wait_idle(TIMEOUT)
    counters = db.rules.statistics().per_rule[name]
    assert len(runs) == 2 and records(db) == [(name, "failed", "committed", True)]
    [failure] = db.outbox.failures()
    assert "ZeroDivisionError: the exchange rate is zero" in failure.error, failure.error
    assert ((counters.fired, counters.executed, counters.failed, counters.cancelled, counters.condition_false)
            == (2, 0, 1, 1, 0)), counters


def test_a_detached_rule_that_raises_its_own_error_while_handling_a_conflict_fails_for_good_at_once(db):
    """A detached rule that meets a serialization conflict and raises an error of its own in its ``except`` block:
    Python makes the conflict that error's context.  ``is_retryable`` (through ``activedb.errors.causes``) took it for
    the conflict, and the firing ran again up to the outbox's attempts (3 runs, the record failed only then).  The
    error is the rule's: it fails for good at once, one run."""
    name = "own_error_in_except"
    runs: list[int] = []

    def action(tx, event):
        runs.append(1)
        try:
            raise SerializationConflict("the account is busy")      # (what a helper of the rule's raised)
        except SerializationConflict:
            raise ZeroDivisionError("gave up on a busy account")

    db.rule(on=db.signalled(name), coupling=Coupling.DETACHED, name=name)(action)
    with db.transaction() as tx:
        tx.signal(name)
    db.rules.wait_idle(TIMEOUT)
    assert len(runs) == 1 and records(db) == [(name, "failed", "committed", True)], (runs, records(db))
    [failure] = db.outbox.failures()
    assert "ZeroDivisionError: gave up on a busy account" in failure.error, failure.error


def test_a_tree_that_fires_nothing_enlists_no_outbox_participant(db):
    db.rule(on=db.signalled("never"), coupling=Coupling.DETACHED, name="never")(lambda tx, event: None)
    seen_participants = []

    def body(tx):
        tx.write("accounts", 1, owner="ann", balance=10)
        seen_participants.append(db.outbox.recording(tx))

    for _ in range(3):
        db.run(body)
    with db.transaction() as tx:
        db.outbox.mark_replayed(tx)            # the Spark sink's policy: any abort is re-run
        tx.write("accounts", 2, owner="bob", balance=5)
        seen_participants.append(db.outbox.recording(tx))
    assert seen_participants == [False] * 4
    assert records(db) == []


def test_a_tree_that_fires_later_still_runs_its_firing_exactly_once(db):
    db.rule(on=db.signalled("late"), coupling=Coupling.DETACHED, name="late")(
        lambda tx, event: tx.insert("events_seen", rule="late", detail=str(event.payload["attempt"])))
    with db.transaction() as tx:
        tx.write("accounts", 1, owner="ann", balance=10)
    attempts, before, after = [], [], []

    def body(tx):
        attempts.append(1)
        row = tx.read("accounts", 1, for_update=True)      # enlists the row-lock participant first
        tx.write("accounts", 1, balance=row["balance"] + 1)
        before.append(db.outbox.recording(tx))
        tx.signal("late", attempt=len(attempts))
        after.append(db.outbox.recording(tx))
        if len(attempts) == 1:
            raise SerializationConflict("as if another process had changed a row this attempt read")

    db.run(body)
    db.rules.wait_idle(TIMEOUT)
    assert before == [False, False] and all(after)
    assert seen(db) == [("late", "2")]
    assert records(db) == [("late", "done", "committed", False)]


def test_a_rule_on_the_abort_sees_a_retried_attempt_as_no_outcome_and_a_failed_run_as_one(db):
    db.rule(on=db.transaction_event("aborted"), coupling=Coupling.DETACHED, name="on_abort")(
        lambda tx, event: tx.insert("events_seen", rule="on_abort", detail=event.transaction))
    attempts = []

    def conflict_once(tx):
        attempts.append(tx.id)
        tx.write("accounts", 1, owner="ann", balance=len(attempts))
        if len(attempts) == 1:
            raise SerializationConflict("as if another process had changed a row this attempt read")

    def fail(tx):
        attempts.append(tx.id)
        raise ValueError("the function's own error: an outcome")

    db.run(conflict_once)
    with pytest.raises(ValueError):
        db.run(fail)
    with pytest.raises(ValueError):            # the Spark sink's policy: any abort is re-run, none recorded
        with db.transaction() as tx:
            db.outbox.mark_replayed(tx)
            raise ValueError("a batch attempt the sink re-runs")
    db.rules.wait_idle(TIMEOUT)
    assert seen(db) == [("on_abort", attempts[2])]


def test_generated_keys_are_never_reused_after_the_sequence_was_reset(db):
    with db.transaction() as tx:
        first = tx.insert("events_seen", rule="before", detail="a")     # draws a block of keys
    with db.engine.begin() as connection:
        connection.execute(sa.text("TRUNCATE events_seen RESTART IDENTITY"))
        connection.execute(sa.text("INSERT INTO events_seen (rule, detail) SELECT 'other', n::text "
                                   "FROM generate_series(1, 5) AS n"))     # another writer takes 1..5
    with pytest.raises(GeneratedKeysReset, match="was reset"):
        with db.transaction() as tx:
            tx.insert("events_seen", rule="after", detail="b")          # a key from the old block
    key = db.run(lambda tx: tx.insert("events_seen", rule="after", detail="b"))   # fresh keys
    assert key > 5 and first == 1
    with db.engine.connect() as connection:
        assert connection.execute(sa.text("SELECT count(*) FROM events_seen")).scalar() == 6


def test_detached_inserts_survive_a_sequence_reset_between_their_trigger_and_them(db):
    release = threading.Event()

    @db.rule(on=db.signalled("go"), coupling=Coupling.DETACHED, name="insert_later")
    def insert_later(tx, event):
        release.wait(TIMEOUT)
        tx.insert("events_seen", rule="insert_later", detail=str(event.payload["n"]))

    with db.transaction() as tx:                      # warm the key block up
        tx.insert("events_seen", rule="warm", detail="0")
    with db.transaction() as tx:
        for number in range(10):
            tx.signal("go", n=number)
    with db.engine.begin() as connection:
        connection.execute(sa.text("TRUNCATE events_seen RESTART IDENTITY"))
    release.set()
    db.rules.wait_idle(TIMEOUT)
    assert [detail for rule, detail in seen(db)] == sorted(str(number) for number in range(10))
    assert {status for _, status, _, _ in records(db)} == {"done"}


def test_a_dropped_table_fails_only_the_firings_that_write_it_and_no_other_flush(db):
    """A table with a generated key dropped after this process drew keys from its sequence: the detached firing that
    still writes it fails for good saying the relation is gone, and nothing else is hurt — every flush that inserts
    generated keys asks about each sequence with cached blocks, and it cast a dropped one's name to regclass."""
    with db.engine.begin() as connection:
        connection.execute(sa.text("DROP TABLE IF EXISTS dropped_later"))
        connection.execute(sa.text("CREATE TABLE dropped_later (id serial PRIMARY KEY, detail text)"))

    @db.rule(on=db.signalled("keep"), coupling=Coupling.DETACHED, name="keeper")
    def keeper(tx, event):
        tx.insert("dropped_later", detail=str(event.payload["n"]))

    @db.rule(on=db.signalled("note"), coupling=Coupling.DETACHED, name="noter")
    def noter(tx, event):
        tx.insert("events_seen", rule="noter", detail=str(event.payload["n"]))

    with db.transaction() as tx:
        tx.signal("keep", n=1)                    # draws a block of dropped_later's keys: the rest stays cached
    db.rules.wait_idle(TIMEOUT)
    with db.engine.begin() as connection:
        connection.execute(sa.text("DROP TABLE dropped_later"))
    with db.transaction() as tx:
        tx.signal("keep", n=2)
        tx.signal("note", n=2)
    db.rules.wait_idle(TIMEOUT)
    with db.transaction() as tx:                  # an application transaction of the same process
        tx.insert("events_seen", rule="application", detail="3")
    assert seen(db) == [("application", "3"), ("noter", "2")]
    [failure] = db.outbox.failures()
    assert failure.rule == "keeper" and "dropped_later" in failure.error and "does not exist" in failure.error


def test_outbox_ids_cached_before_a_sequence_reset_are_never_written(db):
    """Record ids come from the catalog's cached blocks; the one INSERT checks the sequence was not reset since
    they were drawn and fails the flush with the retryable GeneratedKeysReset: the re-run records each firing
    once, with ids the sequence gave after the reset."""
    @db.rule(on=db.signalled("go"), coupling=Coupling.DETACHED, name="later")
    def later(tx, event):
        tx.insert("events_seen", rule="later", detail=str(event.payload["n"]))

    with db.transaction() as tx:
        tx.signal("go", n=0)                      # draws a block of record ids: the rest stays cached
    with db.engine.begin() as connection:         # reset, and another writer takes 1..10
        connection.execute(sa.text("DO $$ BEGIN EXECUTE format('ALTER SEQUENCE %s RESTART', "
                                   "pg_get_serial_sequence('activedb_outbox', 'id')); END $$"))
        connection.execute(sa.text("SELECT nextval(pg_get_serial_sequence('activedb_outbox', 'id')) "
                                   "FROM generate_series(1, 10)"))

    def fire(tx):
        for number in (1, 2, 3):
            tx.signal("go", n=number)

    with pytest.raises(GeneratedKeysReset, match="was reset"):
        with db.transaction() as tx:
            db.outbox.mark_replayed(tx)           # as the sink does: the attempt it re-runs leaves nothing
            fire(tx)
    db.run(fire)
    db.rules.wait_idle(TIMEOUT)
    assert seen(db) == [("later", str(number)) for number in range(4)]
    with db.engine.connect() as connection:
        ids = connection.execute(sa.text("SELECT id FROM activedb_outbox WHERE status = 'done' ORDER BY id")).scalars()
        assert list(ids)[1:] == [11, 12, 13]


def test_records_taken_over_while_their_group_ran_are_left_to_the_new_owner(db):
    """The group's done marks ride in its flush's last round trip and fail it if a record is no longer ours
    (RecordsTakenOver): nothing of the group is written, the other process runs them.  The other process is
    alive (it holds its liveness lock): a recovery pass of ours — the rule's registration wakes one, which may
    land anywhere — must not claim them back, neither while the group runs nor after (a dead owner 42 let it,
    and the test failed under load when the pass came after the take-over)."""
    taken = threading.Event()
    claimed = []

    @db.rule(on=db.signalled("go"), coupling=Coupling.DETACHED, name="taken")
    def taken_rule(tx, event):
        if not taken.is_set():
            taken.set()
            with db.engine.begin() as connection:         # another process claims the records meanwhile
                connection.execute(sa.text("UPDATE activedb_outbox SET owner = 42 WHERE rule = 'taken'"))
            claimed.append(db.outbox.recover())            # a recovery pass of ours while the group runs
        tx.insert("events_seen", rule="taken", detail=str(event.payload["n"]))

    splits = db.outbox.statistics().splits
    with another_live_process(db):
        signal_go(db, 3)
        claimed.append(db.outbox.recover())                # and one after it
        db.rules.wait_idle(TIMEOUT)
        assert taken.is_set() and claimed == [0, 0] and seen(db) == []
        assert db.outbox.statistics().splits == splits     # recognised as a take-over, not split as a failed group
        with db.engine.connect() as connection:
            assert connection.execute(sa.text("SELECT owner, status, count(*) FROM activedb_outbox GROUP BY 1, 2")
                                      ).all() == [(42, "pending", 3)]


@pytest.mark.parametrize("taken", ["every record", "the last record"])
def test_records_taken_over_from_a_group_with_a_failed_member_count_one_outcome_per_attempt_in_each_process(
        db, migrated, taken):
    """A group of three — the first executes (and another process takes records over meanwhile), the second raises
    (failed for good), the third executes — cannot commit its marks (RecordsTakenOver): its abort undid the executed
    ones (``cancelled``), the failed one stays counted ``failed`` once.  The members still ours run again here, each
    run an attempt (``fired`` once more, one outcome), and the one that raises fails for good at once; the taken ones
    run in the other process, once its owner died, claimed there: ``fired`` and one outcome each in its own counters
    (rules README, "Counters count attempts").  Before, the member that raised again after the take-over was retried
    (a third run here): its error, raised while the runner handled the RecordsTakenOver, had that conflict as its
    context, and passed for a retryable failure."""
    name = "taken_with_failure"
    first_run = threading.Event()
    runs: list[tuple[str, int]] = []

    def action(where: str):
        def run(tx, event):
            number = event.payload["n"]
            runs.append((where, number))
            if number == 0 and not first_run.is_set():
                first_run.set()
                with db.engine.begin() as connection:       # another (live) process takes records over meanwhile
                    connection.execute(sa.text(
                        "UPDATE activedb_outbox SET owner = 42 WHERE rule = :rule"
                        + (" AND id = (SELECT max(id) FROM activedb_outbox WHERE rule = :rule)"
                           if taken == "the last record" else "")), {"rule": name})
            if number == 1:
                raise ZeroDivisionError("the exchange rate is zero")
            tx.insert("events_seen", rule=where, detail=str(number))
        return run

    def counted(database) -> tuple[int, ...]:
        counters = database.rules.statistics().per_rule[name]
        return (counters.fired, counters.executed, counters.failed, counters.cancelled, counters.condition_false)

    db.rule(on=db.signalled("go"), coupling=Coupling.DETACHED, name=name)(action("here"))
    # The pass the registration wakes ends first: one that came late, after process 42 died, would claim its records
    # here, not in the other process (seen once under load: ('here', '2')).
    assert db.outbox.wait_recovery_idle(TIMEOUT), "the recovery pass woken by the rule's registration did not end"
    with another_live_process(db):                          # it dies after: its records wait for a recovery pass
        signal_go(db, 3)
    assert first_run.is_set()
    if taken == "every record":
        # fired 3: 0 and 2 executed and were undone (cancelled), 1 failed; nothing ran again here
        assert counted(db) == (3, 0, 1, 2, 0), db.rules.statistics().per_rule[name]
        assert seen(db) == []
    else:
        # fired 3 + 2: 2 was undone (cancelled) and taken; 0 ran twice (cancelled, executed), 1 twice (failed, failed)
        assert runs.count(("here", 1)) == 2, runs
        assert counted(db) == (5, 1, 2, 2, 0), db.rules.statistics().per_rule[name]
        assert seen(db) == [("here", "0")]
    other = activedb.connect(migrated, upgrade=False, outbox_options={"recovery_interval": None})
    try:
        other.rule(on=other.signalled("go"), coupling=Coupling.DETACHED, name=name)(action("there"))
        other.outbox.recover()          # (the registration's pass may have claimed them already)
        wait_until(lambda: other.outbox.statistics().pending == 0, TIMEOUT, "the taken records ran in the other process")
        other.rules.wait_idle(TIMEOUT)
        if taken == "every record":
            assert seen(db) == [("there", "0"), ("there", "2")]
            assert counted(other) == (3, 2, 1, 0, 0), other.rules.statistics().per_rule[name]
        else:
            assert seen(db) == [("here", "0"), ("there", "2")]
            assert counted(other) == (1, 1, 0, 0, 0), other.rules.statistics().per_rule[name]
    finally:
        other.close()
    assert counted(db) == ((3, 0, 1, 2, 0) if taken == "every record" else (5, 1, 2, 2, 0))
    with db.engine.connect() as connection:
        assert sorted(connection.execute(sa.text(
            "SELECT status, count(*) FROM activedb_outbox WHERE rule = :rule GROUP BY 1"), {"rule": name}).all()) == [
            ("done", 2), ("failed", 1)]


def test_a_members_write_refused_with_an_error_of_its_own_is_a_failure_not_a_take_over(db):
    """The group's marks ride in the round trip of its last writes; a write PostgreSQL refuses there (here a
    trigger raising division_by_zero) fails that member alone, as any refused write does — it is not read as the
    marks' "records taken over", which would leave every record of the group pending in this process."""
    with db.engine.begin() as connection:
        connection.execute(sa.text(
            "CREATE FUNCTION refuse_seven() RETURNS trigger LANGUAGE plpgsql AS "
            "$$ BEGIN IF NEW.value = 7 THEN RAISE division_by_zero; END IF; RETURN NEW; END $$"))
        connection.execute(sa.text("CREATE TRIGGER refuse_seven BEFORE INSERT OR UPDATE ON items "
                                   "FOR EACH ROW EXECUTE FUNCTION refuse_seven()"))
    try:
        @db.rule(on=db.signalled("go"), coupling=Coupling.DETACHED, name="refused_seven")
        def refused_seven(tx, event):
            tx.write("items", f"k{event.payload['n']}", value=event.payload["n"])

        assert_seven_fails_alone(db, "refused_seven", "22012")
    finally:
        with db.engine.begin() as connection:
            connection.execute(sa.text("DROP TRIGGER refuse_seven ON items; DROP FUNCTION refuse_seven()"))


def test_an_event_the_outbox_cannot_keep_is_refused_with_an_outbox_error_naming_the_rule(db):
    """A detached firing's event is recorded exactly (pickled where JSON cannot hold a value); a value nothing can
    keep (a lock) refuses the trigger's commit with an ``OutboxError`` naming the rule and what to pass instead —
    before, pickle's bare ``TypeError: cannot pickle '_thread.lock' object`` came out of the commit."""
    @db.rule(on=db.signalled("go"), coupling=Coupling.DETACHED, name="holds_a_lock")
    def holds_a_lock(tx, event):
        tx.insert("events_seen", rule="holds_a_lock", detail="ran")

    with pytest.raises(OutboxError, match=r"detached rule 'holds_a_lock' fired on signal go .*cannot keep .*"
                                          r"cannot pickle '_thread.lock' object.*picklable"):
        with db.transaction() as tx:
            tx.insert("items", key="held", value=1)
            tx.signal("go", lock=threading.Lock())
    db.rules.wait_idle(TIMEOUT)
    with db.engine.connect() as connection:
        assert connection.execute(sa.text("SELECT count(*) FROM items WHERE key = 'held'")).scalar() == 0
    assert seen(db) == []


def test_a_record_larger_than_record_bytes_refuses_the_commit_with_an_outbox_error_and_nothing_commits(
        db, monkeypatch):
    """A detached firing whose event's JSON is larger than ``RECORD_BYTES`` (lowered here: the real bound is a
    quarter of PostgreSQL's 1 GB) refuses its trigger's commit with an ``OutboxError`` naming the rule, the event,
    the size, the bound and what to pass instead; nothing of the tree commits and the rule never runs.  A record
    within the bound is recorded and run.  Before, one record over 1 GB went alone into its statement and PostgreSQL
    refused the commit with a bare ``DatabaseError``."""
    monkeypatch.setattr(_records, "RECORD_BYTES", 4000)

    @db.rule(on=db.signalled("go"), coupling=Coupling.DETACHED, name="takes_the_data")
    def takes_the_data(tx, event):
        tx.insert("events_seen", rule="takes_the_data", detail=str(len(event.payload["data"])))

    with pytest.raises(OutboxError, match=r"detached rule 'takes_the_data' fired on signal go .*: its outbox record is "
                                          r"\d+ bytes of JSON, more than the 4000 .*RECORD_BYTES.*a row's key"):
        with db.transaction() as tx:
            tx.insert("items", key="large", value=1)
            tx.signal("go", data="x" * 5000)
    with db.transaction() as tx:
        tx.insert("items", key="small", value=2)
        tx.signal("go", data="x" * 100)
    db.rules.wait_idle(TIMEOUT)
    with db.engine.connect() as connection:
        assert connection.execute(sa.text("SELECT key FROM items WHERE key IN ('large', 'small')")).scalars().all() == [
            "small"]
        assert connection.execute(sa.text(
            "SELECT count(*) FROM activedb_outbox WHERE rule = 'takes_the_data'")).scalar() == 1
    assert seen(db) == [("takes_the_data", "100")]


@pytest.mark.parametrize("how", ["the-commit-refused", "the-body-raised"])
def test_a_record_larger_than_record_bytes_at_an_abort_fails_its_rule_and_the_others_are_recorded(
        db, monkeypatch, caplog, how):
    """At an abort (the body raised, or the oversized record refused the commit) the tree's detached firings are
    recorded in a transaction of their own: one record beyond ``RECORD_BYTES`` (lowered here) made that insert
    raise, and every firing of the batch was counted ``lost`` and logged "they are lost".  Now the oversized firing
    alone fails for good, as one whose event the outbox cannot keep: counted failed for its rule, logged once with
    the size and the bound; the firing within the bound is recorded and run, and nothing is lost."""
    monkeypatch.setattr(_records, "RECORD_BYTES", 4000)
    db.rule(on=db.signalled("go"), coupling=Coupling.DETACHED, name="takes_the_data")(
        lambda tx, event: tx.insert("events_seen", rule="takes_the_data", detail=str(len(event.payload["data"]))))
    lost = db.outbox.statistics().lost
    with caplog.at_level("WARNING", logger="activedb.outbox"):
        with pytest.raises(OutboxError if how == "the-commit-refused" else ZeroDivisionError):
            with db.transaction() as tx:
                tx.signal("go", data="x" * 5000)
                tx.signal("go", data="x" * 100)
                if how == "the-body-raised":
                    raise ZeroDivisionError("the body failed")
        db.rules.wait_idle(TIMEOUT)
    assert seen(db) == [("takes_the_data", "100")]
    assert records(db) == [("takes_the_data", "done", "aborted", False)]
    assert db.outbox.statistics().lost == lost
    assert db.rules.statistics().per_rule["takes_the_data"].failed == 1
    messages = [(record.levelname, record.getMessage()) for record in caplog.records]
    assert not [message for _, message in messages if "are lost" in message], messages
    [(level, message)] = [(level, message) for level, message in messages if "takes_the_data" in message]
    assert level == "ERROR" and "fails for good" in message and "more than the 4000" in message, message


@pytest.mark.parametrize("how", ["the-commit-refused", "the-body-raised"])
def test_a_firing_the_outbox_cannot_keep_at_an_abort_fails_its_rule_and_is_not_lost(db, caplog, how):
    """A detached firing whose event the outbox cannot keep (a lambda in the payload) is refused again when its
    trigger's tree aborts (a detached firing runs after an abort too): it was counted in
    ``statistics().lost`` — "PostgreSQL unreachable at an abort", what an operator's alert watches — and logged as
    "could not record … they are lost", and the abort's other detached firings, recordable, were lost with it.  It
    is counted failed for its rule (a firing that failed for good, as a detached action that raises), logged once
    naming the rule and what to pass, and the others are recorded and run."""
    db.rule(on=db.signalled("go"), coupling=Coupling.DETACHED, name="holds_a_lambda")(
        lambda tx, event: tx.insert("events_seen", rule="holds_a_lambda", detail="ran"))
    db.rule(on=db.signalled("fine"), coupling=Coupling.DETACHED, name="keeps_going")(
        lambda tx, event: tx.insert("events_seen", rule="keeps_going", detail=str(event.payload["n"])))
    lost = db.outbox.statistics().lost
    with caplog.at_level("WARNING", logger="activedb.outbox"):
        with pytest.raises(OutboxError if how == "the-commit-refused" else ZeroDivisionError):
            with db.transaction() as tx:
                tx.signal("fine", n=1)
                tx.signal("go", call=lambda: None)
                if how == "the-body-raised":
                    raise ZeroDivisionError("the body failed")
        db.rules.wait_idle(TIMEOUT)
    assert seen(db) == [("keeps_going", "1")]
    assert records(db) == [("keeps_going", "done", "aborted", False)]
    assert db.outbox.statistics().lost == lost
    counters = db.rules.statistics().per_rule
    assert (counters["holds_a_lambda"].failed, counters["keeps_going"].failed) == (1, 0), counters
    messages = [(record.levelname, record.getMessage()) for record in caplog.records]
    assert not [message for _, message in messages if "are lost" in message], messages
    [(level, message)] = [(level, message) for level, message in messages if "holds_a_lambda" in message]
    assert level == "ERROR" and "cannot keep" in message and "fails for good" in message, message


def test_events_come_back_from_a_record_exactly():
    event = Event(EventKind.UPDATED, "t", key=("a", 1), old={"n": decimal.Decimal("1.50"), "$x": 1},
                  new={"at": dt.datetime(2024, 5, 1, 12, tzinfo=dt.timezone.utc), "nul": "a\x00b",
                       "lone": "\ud800", "bytes": b"\x00\x01", "nan": float("nan"), "day": dt.date(2024, 5, 1),
                       "set": {1, 2}, "nested": [{"when": dt.time(1, 2)}], 3: "int key"},
                  payload={"id": uuid.UUID(int=7), "span": dt.timedelta(seconds=90)}, ts=1.5, transaction="T1.2")
    encoded = json.loads(json.dumps(_records.encode_event(event)))      # what jsonb gives back
    decoded = _records.decode_event(encoded)
    assert decoded.kind is EventKind.UPDATED and decoded.key == ("a", 1)
    assert decoded.old == event.old and decoded.payload == event.payload and decoded.ts == 1.5
    assert {key: value for key, value in decoded.new.items() if key != "nan"} == {
        key: value for key, value in event.new.items() if key != "nan"}
    assert decoded.new["nan"] != decoded.new["nan"]                    # NaN, still a float
    assert "\\u0000" not in json.dumps(encoded)                        # nothing jsonb would refuse


def test_a_transaction_spanning_a_reset_sequence_never_collides_with_its_own_keys(db):
    """Stale keys cached before a reset, then a fresh block drawn in the same transaction, whose values
    overlap them: the draw notices the reset and the transaction is re-run — never a duplicate key."""
    with db.transaction() as tx:
        tx.insert("events_seen", rule="before", detail="0")          # a block of 64, 63 left cached
    with db.engine.begin() as connection:
        connection.execute(sa.text("TRUNCATE events_seen RESTART IDENTITY"))
    attempts = []

    def insert_many(tx):
        attempts.append(1)
        return [tx.insert("events_seen", rule="many", detail=str(number)) for number in range(100)]

    keys = db.run(insert_many)
    assert len(attempts) == 2 and len(set(keys)) == 100
    with db.engine.connect() as connection:
        assert connection.execute(sa.text("SELECT count(*) FROM events_seen")).scalar() == 100


@pytest.mark.parametrize("age", [float("inf"), dt.timedelta.max, 1e15])
def test_prune_with_an_age_beyond_the_calendar_forgets_nothing(db, age):
    """An age PostgreSQL cannot subtract from now() (infinity: "for ever", timedelta.max) forgets nothing, as
    db.batches.prune's does — it failed with PostgreSQL's DataError (interval out of range), also from
    `activedb outbox --prune-done inf`."""
    assert db.outbox.prune(older_than=age) == 0


@pytest.mark.parametrize("ids", [5, "12", ["x"], [None], [1.5], [True]])
def test_retry_failed_refuses_ids_that_are_no_record_ids(db, ids):
    """An id alone (5) was a TypeError ('int' object is not iterable), a text or ['x'] SQLAlchemy's DataError (no
    ActivedbError), [None] or [1.5] matched nothing (or another record) and said 'reset 0': each is a BadArgument."""
    with pytest.raises(activedb.BadArgument, match=r"retry_failed\(ids=.*\) takes record ids"):
        db.outbox.retry_failed(ids)
    assert db.outbox.retry_failed([]) == 0


@pytest.mark.parametrize("limit", [-1, "x", None])
def test_failures_refuses_a_limit_that_is_no_count(db, limit):
    """failures(limit=-1) or 'x' was SQLAlchemy's DataError from the LIMIT clause (no ActivedbError)."""
    with pytest.raises(activedb.BadArgument, match=r"failures\(limit=.*\) takes a whole number of at least 0"):
        db.outbox.failures(limit)



def test_wait_idle_for_ever_waits_until_the_firings_ran(db):
    """wait_idle(float('inf')) — "no limit", as None is — failed with OverflowError at once while a firing ran (no
    thread wait may be that long), where it should wait for it."""
    started, release = threading.Event(), threading.Event()

    @db.rule(on=db.signalled("slow_tick"), coupling=Coupling.DETACHED, name="slow_tick_seen")
    def slow_tick_seen(tx, event):
        started.set()
        release.wait(TIMEOUT)

    with db.transaction() as tx:
        tx.signal("slow_tick")
    assert started.wait(TIMEOUT)
    outcome = []

    def wait_for_ever():
        try:
            db.outbox.wait_idle(float("inf"))
            outcome.append("idle")
        except BaseException as error:
            outcome.append(error)

    waiter = threading.Thread(target=wait_for_ever)
    waiter.start()
    try:        # (the waiter in the executor's idle condition, or failed: the firing still runs either way)
        wait_until(lambda: outcome or db.outbox.idle_waiters, TIMEOUT, "the waiter waits")
    finally:
        release.set()
        waiter.join(TIMEOUT)
    assert outcome == ["idle"]


@pytest.mark.parametrize("limit", [-1, "x", None])
def test_recover_refuses_a_limit_that_is_no_count(db, limit):
    """recover(limit=-1) or 'x' reached the claim's LIMIT clause and came back as SQLAlchemy's DataError (no
    ActivedbError) once any rule was registered."""
    db.rule(on=db.signalled("never_sent"), coupling=Coupling.DETACHED, name="never_run")(lambda tx, event: None)
    with pytest.raises(activedb.BadArgument, match=r"outbox.recover\(limit=.*\) takes a whole number of at least 0"):
        db.outbox.recover(limit)
    assert db.outbox.recover(0) == 0


def test_a_recovery_interval_of_for_ever_keeps_the_recovery_thread_and_a_bad_one_is_refused(migrated):
    """``recovery_interval=float("inf")`` (no pass by the clock, as None) keeps the recovery thread: it died of
    OverflowError at its first wait (no thread wait may be that long), so retried firings were never run in that
    process.  An interval of zero or below (a pass after another without a pause, PostgreSQL queried without end)
    or not a number is refused where it is given."""
    for bad in (0, -1.0, float("nan"), "10"):
        with pytest.raises(activedb.BadArgument,
                           match=r"recovery_interval=.*\) takes None .* or a number of seconds above 0"):
            activedb.OutboxOptions(recovery_interval=bad)
    database = activedb.connect(migrated, outbox_options={"recovery_interval": float("inf")})
    try:
        broken = threading.Event()
        broken.set()

        @database.rule(on=database.signalled("pay"), coupling=Coupling.DETACHED, name="for_ever_entry")
        def entry(tx, event):
            if broken.is_set():
                raise ZeroDivisionError("the exchange rate is zero")
            tx.insert("events_seen", rule="for_ever_entry", detail=str(event.payload["amount"]))

        with database.transaction() as tx:
            tx.signal("pay", amount=7)
        database.rules.wait_idle(TIMEOUT)
        assert [failure.rule for failure in database.outbox.failures()] == ["for_ever_entry"]
        broken.clear()
        assert database.outbox.retry_failed() == 1          # pending again; the recovery thread runs it
        wait_until(lambda: ("for_ever_entry", "7") in seen(database), 30, "the retried firing ran")
    finally:
        database.close()


def test_an_outbox_whose_liveness_lock_could_not_be_taken_starts_at_the_next_attempt(migrated, monkeypatch):
    """The outbox starts on the first detached firing (here ``upgrade=False``: connect did not start it); when
    PostgreSQL refused its liveness lock then, the next start takes the lock and starts the recovery thread.  The
    outbox counted itself started before taking the lock, so every later start returned at once: the process ran
    on without its recovery thread (retried and parked firings never ran) and without its lock."""
    database = activedb.connect(migrated, upgrade=False, outbox_options={"recovery_interval": None})
    try:
        with monkeypatch.context() as down:
            def refused(self):
                raise sa.exc.OperationalError("connect", {}, ConnectionRefusedError("the server is down"))

            down.setattr(_records.LivenessLock, "take", refused)
            with pytest.raises(sa.exc.OperationalError):
                database.outbox.start()
        database.outbox.start()
        assert database.outbox.recovery_running
    finally:
        database.close()


def test_firings_handed_to_a_closed_outbox_end_cancelled_stay_pending_and_run_once_in_the_next_process(
        migrated, caplog):
    """A tree that commits once the outbox closed (``Database.close()`` runs while it commits) records its firings in
    its flush and hands them to the closed outbox: they are dropped from memory as ``close()`` drops the queued ones —
    each counted ``cancelled`` (its dispatch counted ``fired``), a warning saying that its record stays pending for the
    database's next process —, ``wait_idle`` returns at once, and the next process runs each record once."""
    database = activedb.connect(migrated, outbox_options={"recovery_interval": None})
    with database.engine.begin() as connection:
        connection.execute(sa.text("TRUNCATE items, activedb_outbox RESTART IDENTITY"))
    rule = "handed_over_after_close"

    def action(tx, event):
        number = event.payload["n"]
        tx.write("items", f"handed_after_close_{number}", value=number)

    database.rule(on=database.signalled("go"), coupling=Coupling.DETACHED, name=rule)(action)
    try:
        with caplog.at_level("WARNING", logger="activedb.outbox"):
            with database.transaction() as tx:
                for number in range(2):
                    tx.signal("go", n=number)
                database.outbox.close()         # (before the tree's flush: it records, then hands over)
        assert database.outbox.running == 0, database.outbox.running
        database.outbox.wait_idle(TIMEOUT)
        counters = database.rules.statistics().per_rule[rule]
        assert (counters.fired, counters.executed, counters.cancelled, counters.failed) == (2, 0, 2, 0), counters
        said = [record.getMessage() for record in caplog.records]
        [dropped] = [message for message in said if "closed" in message]
        assert "2 record(s)" in dropped and "next process" in dropped and rule in dropped, said
    finally:
        database.close()
    assert [status for _, status, *_ in records(database)] == ["pending"] * 2
    assert_the_next_process_runs_each_once(migrated, rule, action, ["done"] * 2, item_rows, [
        ("handed_after_close_0", 0), ("handed_after_close_1", 1)])


def test_failures_lists_the_most_recent_failure_first(db):
    """``failures()`` promises the most recent failures, newest first: a record retried (``retry_failed``) that
    failed again is the newest failure, though recorded before the others.  They were ordered by record id, so it
    was listed last (and left out by a ``limit`` when many firings had failed since it was recorded)."""
    @db.rule(on=db.signalled("pay"), coupling=Coupling.DETACHED, name="always_failing")
    def always_failing(tx, event):
        raise ZeroDivisionError(f"the exchange rate is zero for {event.payload['amount']}")

    for amount in (1, 2):
        with db.transaction() as tx:
            tx.signal("pay", amount=amount)
        db.rules.wait_idle(TIMEOUT)
    first, second = sorted(failure.id for failure in db.outbox.failures())
    assert db.outbox.retry_failed([first]) == 1
    db.rules.wait_idle(TIMEOUT)
    wait_until(lambda: len(db.outbox.failures()) == 2, TIMEOUT, "the retried firing failed again")
    assert [failure.id for failure in db.outbox.failures()] == [first, second]
    assert [failure.id for failure in db.outbox.failures(limit=1)] == [first]


@pytest.mark.parametrize("timeout", ["30", float("nan"), True])
def test_wait_idle_refuses_a_timeout_that_is_no_number_of_seconds(db, timeout):
    """``db.rules.wait_idle("30")`` failed with a bare TypeError from a comparison inside the wait, and ``nan`` was
    taken: with firings queued it spun on its condition (``Condition.wait(nan)`` returns at once) until they ran,
    never timing out.  Both are ``BadArgument`` naming the timeout."""
    with pytest.raises(activedb.BadArgument, match=r"wait_idle\(timeout=.*\) takes None"):
        db.rules.wait_idle(timeout)


def test_retry_failed_runs_the_records_also_in_a_process_whose_outbox_had_not_started(db, migrated):
    """``retry_failed`` promises a recovery pass.  It only woke the recovery thread, so in a process whose outbox had
    not started yet (``connect(upgrade=False)``, as the command line connects: no firing, no ``recover()`` so far)
    there was no thread to wake: the records became pending and stayed so, with no word said, although this
    process registered their rule.  It now starts the outbox (as a firing or ``recover()`` does) and its pass runs
    them."""
    broken = threading.Event()
    broken.set()

    def pay(tx, event):
        if broken.is_set():
            raise ZeroDivisionError("the exchange rate is zero")
        tx.insert("events_seen", rule="retried_later", detail=str(event.payload["amount"]))

    db.rule(on=db.signalled("pay"), coupling=Coupling.DETACHED, name="retried_later")(pay)
    with db.transaction() as tx:
        tx.signal("pay", amount=8)
    db.rules.wait_idle(TIMEOUT)
    [failure] = db.outbox.failures()
    db.rules.remove("retried_later")
    broken.clear()
    other = activedb.connect(migrated, upgrade=False, outbox_options={"recovery_interval": None})
    try:
        other.rule(on=other.signalled("pay"), coupling=Coupling.DETACHED, name="retried_later")(pay)
        assert other.outbox.retry_failed([failure.id]) == 1
        wait_until(lambda: ("retried_later", "8") in seen(other), 20, "the retried firing ran")
    finally:
        other.close()


def test_status_says_how_many_failed_firings_it_lists_of_how_many(db, migrated):
    """``activedb status`` lists the 20 most recent failed firings; with more than that failed, it said nothing of
    the rest (a table of 20 under a count of 21 read as if the count were wrong, and nothing said how to see the
    others).  It now says which of how many it lists, and which command lists them all."""
    @db.rule(on=db.signalled("pay"), coupling=Coupling.DETACHED, name="fails_many")
    def fails_many(tx, event):
        raise ZeroDivisionError("the exchange rate is zero")

    with db.transaction() as tx:
        for amount in range(21):
            tx.signal("pay", amount=amount)
    db.rules.wait_idle(TIMEOUT)
    wait_until(lambda: db.outbox.statistics().failed == 21, TIMEOUT, "every firing failed")
    result = CliRunner().invoke(main, ["--url", migrated, "status"])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "the 20 most recent of 21 failed firings" in text and "activedb outbox --limit 0" in text, text


def test_a_retried_failed_record_gets_its_retries_of_a_conflict_as_a_new_one(migrated):
    """A failed record made pending again (``retry_failed``) runs up to ``max_attempts`` times when it fails
    retryably, as a new firing does: the stored ``attempts`` counts the record's finishes (each failure for good
    adds one), the runners' count is its retryable failures in this run. The runners started their count at the
    stored one, so every failure for good so far took one run from the retried record's budget (here, with
    ``max_attempts=2``, a serialization conflict failed it for good at once)."""
    database = activedb.connect(migrated, outbox_options={"max_attempts": 2, "recovery_interval": None})
    try:
        runs = []

        @database.rule(on=database.signalled("pay"), coupling=Coupling.DETACHED, name="retried_budget")
        def pay(tx, event):
            runs.append(1)
            if len(runs) == 1:
                raise ZeroDivisionError("the exchange rate is zero")            # for good: failed
            if len(runs) == 2:
                raise SerializationConflict("as if another process had changed a row this attempt read")
            tx.insert("events_seen", rule="retried_budget", detail=str(event.payload["amount"]))

        with database.transaction() as tx:
            tx.signal("pay", amount=9)
        database.rules.wait_idle(TIMEOUT)
        mine = lambda: [failure for failure in database.outbox.failures() if failure.rule == "retried_budget"]
        [failure] = mine()
        assert failure.attempts == 1
        assert database.outbox.retry_failed([failure.id]) == 1
        wait_until(lambda: ("retried_budget", "9") in seen(database) or mine(), 30, "the retried firing ran or failed")
        assert mine() == [] and ("retried_budget", "9") in seen(database)
        assert len(runs) == 3
    finally:
        database.close()


def _failed_firings(db, count: int) -> None:
    """``count`` detached firings of rule ``fails_many`` that failed for good."""
    @db.rule(on=db.signalled("pay"), coupling=Coupling.DETACHED, name="fails_many")
    def fails_many(tx, event):
        raise ZeroDivisionError("the exchange rate is zero")

    with db.transaction() as tx:
        for amount in range(count):
            tx.signal("pay", amount=amount)
    db.rules.wait_idle(TIMEOUT)
    wait_until(lambda: db.outbox.statistics().failed == count, TIMEOUT, "every firing failed")


def test_status_json_lists_every_failed_firing(db, migrated):
    """``activedb status --json`` is "all of it as one object" (docs/cli.md): its ``detached_failures`` held only the
    20 most recent of 21 failed firings (the table's cut), with nothing in the JSON saying so."""
    _failed_firings(db, 21)
    result = CliRunner().invoke(main, ["--url", migrated, "status", "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.output)
    assert document["detached"]["failed"] == 21 and len(document["detached_failures"]) == 21


def test_outbox_says_how_many_failed_firings_it_lists_of_how_many(db, migrated):
    """``activedb outbox`` lists at most ``--limit`` (50) failed firings: with more failed it said nothing of the rest.
    It now says which of how many it lists, and how to list them all, as ``activedb status`` does."""
    _failed_firings(db, 51)
    result = CliRunner().invoke(main, ["--url", migrated, "outbox"])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "the 50 most recent of 51 failed firings" in text and "activedb outbox --limit 0" in text, text
    everything = " ".join(CliRunner().invoke(main, ["--url", migrated, "outbox", "--limit", "0"]).output.split())
    assert "most recent of" not in everything


@pytest.mark.parametrize("call", ["statistics", "failures"])
def test_reading_the_outbox_over_a_lost_connection_is_unavailable_and_the_next_read_works(db, call):
    """``db.outbox.statistics()`` and ``failures()`` meet a connection PostgreSQL ended (a restart,
    ``pg_terminate_backend``, a server timeout) as every read does: a ``DatabaseUnavailable`` saying so — not the
    driver's exception with the statement — and the next read works."""
    read = getattr(db.outbox, call)
    read()                              # (a connection kept)
    end_sessions(db)
    with pytest.raises(activedb.DatabaseUnavailable, match="lost the connection to PostgreSQL"):
        read()
    assert read() == read()


@pytest.mark.parametrize("call", ["prune", "retry_failed"])
def test_changing_the_outbox_over_a_lost_connection_is_unavailable_saying_to_call_again_and_the_next_call_works(db,
                                                                                                                call):
    """``db.outbox.prune(older_than=)`` and ``retry_failed()`` (``activedb outbox --prune-done``, ``--retry``) meet a
    connection PostgreSQL ended (a restart, ``pg_terminate_backend``, a server timeout): a ``DatabaseUnavailable``
    saying so, that the change was made whole or not at all and to call again — not the driver's exception with the
    statement; the next call makes it.  The recovery pass the rule's registration woke is waited for first: run late
    (a loaded machine), after the sessions ended, it met a broken connection before the change did, the pool
    reconnected, and the change made its change — no error to see."""
    if call == "prune":
        db.rule(on=db.signalled("tidy"), coupling=Coupling.DETACHED, name="tidy")(lambda tx, event: None)
        with db.transaction() as tx:
            tx.signal("tidy")
        db.rules.wait_idle(TIMEOUT)
        wait_until(lambda: db.outbox.statistics().done == 1, TIMEOUT, "the firing ran")
        change = lambda: db.outbox.prune(older_than=0)       # noqa: E731
    else:
        _failed_firings(db, 1)
        change = db.outbox.retry_failed
    assert db.outbox.wait_recovery_idle(TIMEOUT), "the recovery pass woken by the rule's registration did not end"
    end_sessions(db)
    with pytest.raises(activedb.DatabaseUnavailable, match="lost the connection to PostgreSQL") as caught:
        change()
    assert "or none" in str(caught.value) and "again" in str(caught.value), caught.value
    assert change() == 1


def test_a_record_whose_rule_is_removed_while_a_recovery_pass_claims_it_stays_pending(db):
    """A recovery pass claims the records of the rules registered when it starts; a rule removed meanwhile made the
    pass's lookup of it raise, and its record was marked failed for good (as an event that cannot be decoded is),
    although nothing had run.  It stays pending and unowned, as a record of a rule this process never registered
    does, and runs once the rule is declared again."""
    event = json.dumps(_records.encode_event(Event(EventKind.SIGNAL, "go", payload={"n": 7}, transaction="T0")))
    with db.engine.begin() as connection:      # a dead process's record, before the rule is registered here
        connection.execute(sa.text(
            "INSERT INTO activedb_outbox (rule, coupling, event, chain, trigger_id, trigger_outcome, owner) "
            "VALUES ('removed_meanwhile', 'detached', CAST(:event AS jsonb), '{}', 'T0', 'committed', 42)"),
            {"event": event})

    def run(tx, event):
        tx.insert("events_seen", rule="removed_meanwhile", detail=str(event.payload["n"]))

    passes: list[int] = []
    with db.engine.connect() as blocker:
        blocker.execute(sa.text("LOCK TABLE activedb_outbox IN SHARE ROW EXCLUSIVE MODE"))    # claims wait for it
        db.rule(on=db.signalled("go"), coupling=Coupling.DETACHED, name="removed_meanwhile")(run)
        recovery = threading.Thread(target=lambda: passes.append(db.outbox.recover()))
        recovery.start()

        def claim_waits() -> bool:
            with db.engine.connect() as connection:
                return connection.execute(sa.text(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND query LIKE '%UPDATE activedb_outbox AS o SET owner%'")).scalar_one() > 0

        wait_until(claim_waits, TIMEOUT, "a recovery pass's claim waiting for the table lock")
        db.rules.remove("removed_meanwhile")
        blocker.rollback()
    recovery.join(TIMEOUT)
    assert not recovery.is_alive() and passes == [0], passes
    db.rules.wait_idle(TIMEOUT)
    with db.engine.connect() as connection:
        assert connection.execute(sa.text("SELECT status, owner, attempts, error FROM activedb_outbox")).all() == [
            ("pending", None, 0, None)]
    assert db.outbox.failures() == [] and seen(db) == []
    db.rule(on=db.signalled("go"), coupling=Coupling.DETACHED, name="removed_meanwhile")(run)   # declared again
    db.outbox.recover()
    db.rules.wait_idle(TIMEOUT)
    assert seen(db) == [("removed_meanwhile", "7")]


@pytest.mark.parametrize("command, json_key", [("outbox", "pending_without_rule"),
                                                ("status", "detached_pending_without_rule")])
def test_outbox_flags_pending_firings_whose_rule_is_removed_or_not_declared_and_says_what_to_do(db, migrated, command,
                                                                                               json_key):
    """A pending record runs only in a process that registers its rule: one of a removed rule (or of a name the
    registry does not know: purged) stays pending for ever, and ``activedb outbox`` (and ``activedb status``) showed
    it as plainly pending, with no word why.  Both now name those rules, text and JSON, in the same words, saying what
    to do; a pending record of a declared rule (run by a live process) is not flagged."""
    for name in ("removed_rule", "declared_rule"):
        db.rule(on=db.signalled("go"), coupling=Coupling.DETACHED, name=name)(lambda tx, event: None)
    db.rules.remove("removed_rule")
    event = json.dumps(_records.encode_event(Event(EventKind.SIGNAL, "go", transaction="T0")))
    other_process = _records.LivenessLock(db.engine, 42)      # alive: nobody claims its records
    other_process.take()
    try:
        with db.engine.begin() as connection:
            for name in ("removed_rule", "removed_rule", "purged_rule", "declared_rule"):
                connection.execute(sa.text(
                    "INSERT INTO activedb_outbox (rule, coupling, event, chain, trigger_id, trigger_outcome, owner) "
                    "VALUES (:rule, 'detached', CAST(:event AS jsonb), '{}', 'T0', 'committed', 42)"),
                    {"rule": name, "event": event})
        runner = CliRunner()
        shown = runner.invoke(main, ["--url", migrated, command], env={"COLUMNS": "250"})
        assert shown.exit_code == 0, shown.output
        text = " ".join(shown.output.split())
        assert "3 pending firing(s) of rules no process runs: purged_rule (1, not in the rule registry), " \
               "removed_rule (2, removed)" in text, text
        assert "declare the rule again in a process that runs the outbox" in text, text
        assert "declared_rule (" not in text, text
        as_json = json.loads(runner.invoke(main, ["--url", migrated, command, "--json"]).output)
        assert [(one["rule"], one["pending"], one["registry"]) for one in as_json[json_key]] == [
            ("purged_rule", 1, "absent"), ("removed_rule", 2, "removed")], as_json
        assert all("declare the rule again" in one["what_to_do"] for one in as_json[json_key])
    finally:
        other_process.release()
        with db.engine.begin() as connection:
            connection.execute(sa.text("DELETE FROM activedb_outbox"))


def test_wait_idle_that_times_out_names_the_rules_of_the_firings_still_running(db):
    """``wait_idle``'s TimeoutError said only how many firings were queued or running: which rule held things up,
    and that a rule that never returns keeps one of the outbox's group runners, was left to guess.  It was a bare
    ``TimeoutError``, which an application catching ``ActivedbError`` (as the CLI does) let through: now a
    ``WaitTimeout``, an ``ActivedbError`` that is a ``TimeoutError`` too."""
    started, release = threading.Event(), threading.Event()

    @db.rule(on=db.signalled("go"), coupling=Coupling.DETACHED, name="slow_to_return")
    def slow_to_return(tx, event):
        started.set()
        release.wait(TIMEOUT)

    try:
        with db.transaction() as tx:
            tx.signal("go")
        assert started.wait(TIMEOUT), "the firing never started"
        with pytest.raises(activedb.WaitTimeout) as raised:
            db.rules.wait_idle(0.05)
        assert isinstance(raised.value, TimeoutError) and isinstance(raised.value, activedb.ActivedbError)
        text = str(raised.value)
        assert "running: slow_to_return (1)" in text, text
        assert "a rule that never returns holds one of the outbox's group runners" in text, text
        assert "OutboxOptions(rule_deadline=…): none now" in text, text
    finally:
        release.set()
    db.rules.wait_idle(TIMEOUT)


def test_a_detached_firing_that_fails_for_good_at_its_commit_counts_failed_once(db):
    """A detached firing whose action ran but whose group could not commit it (its table dropped meanwhile) is failed
    alone for good; ``db.rules.statistics()`` counted it neither executed nor failed, so the rule's counters (and the
    metrics made of them) showed a firing that had vanished."""
    with db.engine.begin() as connection:
        connection.execute(sa.text("DROP TABLE IF EXISTS dropped_before_commit"))
        # (a generated key: the insert reads nothing, so only the group's flush meets the dropped table)
        connection.execute(sa.text("CREATE TABLE dropped_before_commit (id serial PRIMARY KEY, detail text)"))

    @db.rule(on=db.signalled("keep"), coupling=Coupling.DETACHED, name="writes_dropped")
    def writes_dropped(tx, event):
        tx.insert("dropped_before_commit", detail=str(event.payload["n"]))

    with db.transaction() as tx:
        tx.signal("keep", n=1)                    # runs: the table is known to this process from now on
    db.rules.wait_idle(TIMEOUT)
    with db.engine.begin() as connection:
        connection.execute(sa.text("DROP TABLE dropped_before_commit"))
    with db.transaction() as tx:
        tx.signal("keep", n=2)
    db.rules.wait_idle(TIMEOUT)
    [failure] = db.outbox.failures()
    assert failure.rule == "writes_dropped" and "does not exist" in failure.error, failure
    counters = db.rules.statistics().per_rule["writes_dropped"]
    assert (counters.fired, counters.executed, counters.failed) == (2, 1, 1), counters


def test_close_waits_for_a_group_that_is_running_a_firing(migrated):
    """``Database.close()`` stopped the outbox and returned while a group runner was still running a firing: the
    firing committed after close() had returned (or, once another process took its record over, wrote nothing and
    ran there), so a program that closed and then read the table did not see it.  close() now waits, up to
    10 s (``CLOSE_WAIT``), for the groups running (outbox README, "Closing")."""
    database = activedb.connect(migrated, outbox_options={"recovery_interval": None})
    with database.engine.begin() as connection:
        connection.execute(sa.text("TRUNCATE events_seen, activedb_outbox"))
    started = threading.Event()

    @database.rule(on=database.signalled("go"), coupling=Coupling.DETACHED, name="runs_through_close")
    def runs_through_close(tx, event):
        started.set()
        wait_until(lambda: not database.outbox.recovery_running, TIMEOUT, "close() stopped the recovery thread")
        tx.insert("events_seen", rule="runs_through_close", detail="1")

    try:
        with database.transaction() as tx:
            tx.signal("go")
        assert started.wait(TIMEOUT), "the firing never started"
    finally:
        database.close()
    assert database.outbox.runners == 0
    reader = activedb.connect(migrated, upgrade=False)
    try:
        with reader.engine.connect() as connection:
            assert connection.execute(sa.text("SELECT rule, status FROM activedb_outbox")).all() == [
                ("runs_through_close", "done")]
            assert connection.execute(sa.text("SELECT detail FROM events_seen")).scalars().all() == ["1"]
    finally:
        reader.close()


def test_a_rule_that_closes_its_own_database_is_not_waited_for_by_that_close(migrated, monkeypatch, caplog):
    """``Database.close()`` waits for the outbox's running groups — but not for the group whose runner is the calling
    thread: a detached rule that closes its own database would wait for itself, up to ``CLOSE_WAIT`` seconds, and
    then warn that its own group still ran.  ``CLOSE_WAIT`` is made far longer than the test's watchdog, so a close
    that waits for its own runner shows as the watchdog's failure, not as a slow pass."""
    from activedb.outbox import _outbox

    monkeypatch.setattr(_outbox, "CLOSE_WAIT", TIMEOUT * 100)
    database = activedb.connect(migrated, outbox_options={"recovery_interval": None})
    with database.engine.begin() as connection:
        connection.execute(sa.text("TRUNCATE activedb_outbox"))
    closed = threading.Event()

    @database.rule(on=database.signalled("go"), coupling=Coupling.DETACHED, name="closes_its_database")
    def closes_its_database(tx, event):
        database.close()
        closed.set()

    try:
        with caplog.at_level("WARNING", logger="activedb.outbox"):
            with database.transaction() as tx:
                tx.signal("go")
            assert closed.wait(TIMEOUT), (
                f"close() called by the rule's own runner did not return within {TIMEOUT} s (it waits for that runner "
                f"itself: {database.outbox.runners} runner(s) left)")
            wait_until(lambda: database.outbox.runners == 0, TIMEOUT, "the rule's runner ended after its close()")
    finally:
        database.close()
    assert not [record.getMessage() for record in caplog.records if "closing while" in record.getMessage()]
    # The runner's group committed after the close its rule called: the connection it gave back then is closed, not
    # kept by the pool the close disposed (until collected) — else the module's database, on a server where the test
    # role may not end sessions, could not be dropped.
    url = database.engine.url
    wait_until(lambda: not sessions(url), 15, "no session of the closed database left in PostgreSQL",
               lambda: sessions(url))


@pytest.mark.parametrize("raised", [SystemExit(3), KeyboardInterrupt()], ids=["SystemExit", "KeyboardInterrupt"])
def test_a_detached_rule_that_raises_systemexit_or_keyboardinterrupt_fails_for_good_with_that_reason(db, migrated,
                                                                                                     raised):
    """A detached action that raises a BaseException that is no Exception (``sys.exit()`` in a rule, a
    KeyboardInterrupt its code raised) is the rule's failure, as any error it raises: its record is failed with that
    reason, shown by ``activedb outbox``, and counted failed; the other members of its group commit.  Before, the
    group runner logged a bug's traceback and parked the whole group for the next recovery pass, which ran it again,
    met the same error and parked it again, at every pass for ever: never settled, never shown, its group's other
    firings never run."""
    @db.rule(on=db.signalled("pay"), coupling=Coupling.DETACHED, name="exits")
    def exits(tx, event):
        if event.payload["amount"] == 2:
            raise raised
        tx.insert("events_seen", rule="exits", detail=str(event.payload["amount"]))

    with db.transaction() as tx:
        for amount in (1, 2, 3):
            tx.signal("pay", amount=amount)
    db.rules.wait_idle(TIMEOUT)
    for _ in range(3):                      # (passes: each ran the parked group again, and parked it again)
        db.outbox.recover()
        db.rules.wait_idle(TIMEOUT)
    [failure] = db.outbox.failures()
    assert failure.rule == "exits" and failure.error.startswith(type(raised).__name__), failure
    assert failure.attempts == 1, failure
    assert seen(db) == [("exits", "1"), ("exits", "3")]
    assert db.outbox.statistics().pending == 0
    counters = db.rules.statistics().per_rule["exits"]
    assert (counters.fired, counters.executed, counters.failed) == (3, 2, 1), counters
    shown = CliRunner().invoke(main, ["--url", migrated, "outbox"], env={"COLUMNS": "250"})
    assert shown.exit_code == 0 and type(raised).__name__ in shown.output, shown.output


@pytest.mark.parametrize("coupling", [Coupling.DETACHED, Coupling.DETACHED_CAUSALLY_DEPENDENT,
                                      Coupling.EXCLUSIVE_CAUSALLY_DEPENDENT])
def test_the_firings_of_an_attempt_its_owner_re_runs_count_cancelled(db, coupling):
    """A tree marked replayed (the Spark sink's policy, ``Database.run``'s on a conflict) aborts: its owner re-runs
    the same input, so the attempt leaves nothing — its detached-family firings are neither recorded nor run, whatever
    their mode.  Each was fired; stopped by the abort, it counts ``cancelled``, so ``fired`` is the sum of the
    outcomes.  Before, they were dropped uncounted: fired 1, no outcome."""
    name = f"replayed_{coupling.value}"
    ran = []
    db.rule(on=db.signalled(name), coupling=coupling, name=name)(lambda tx, event: ran.append(event))
    with pytest.raises(ValueError):
        with db.transaction() as tx:
            db.outbox.mark_replayed(tx)
            tx.signal(name)
            raise ValueError("a batch attempt the sink re-runs")
    db.rules.wait_idle(TIMEOUT)
    counters = db.rules.statistics().per_rule[name]
    assert ran == [] and records(db) == []
    assert (counters.fired, counters.executed, counters.failed, counters.cancelled,
            counters.condition_false) == (1, 0, 0, 1, 0), counters


def test_the_failed_firings_table_says_how_often_a_firing_failed_not_how_often_it_ran(db, migrated):
    """A detached firing that conflicts on every run is run ``max_attempts`` times, then fails for good: the counters
    count each run (``fired`` = max_attempts, rules README "Counters count attempts"), while the record's stored
    ``attempts`` counts how often it ended failed — 1.  ``activedb outbox`` showed that 1 under the header
    "attempts", beside metrics saying it ran five times; the column says "times failed" now."""
    import re

    name = "always_conflicts"

    def action(tx, event):
        raise SerializationConflict("as if another process had changed a row every attempt read")

    db.rule(on=db.signalled(name), coupling=Coupling.DETACHED, name=name)(action)
    with db.transaction() as tx:
        tx.signal(name)
    wait_until(lambda: db.outbox.failures(), TIMEOUT, "the detached rule's failed record",
               describe=lambda: records(db))
    db.rules.wait_idle(TIMEOUT)
    [failure] = db.outbox.failures()
    runs = db.rules.statistics().per_rule[name].fired
    assert failure.attempts == 1 and runs == db.outbox.options.max_attempts > 1, (failure, runs)
    shown = CliRunner().invoke(main, ["--url", migrated, "outbox"], env={"COLUMNS": "250"})
    assert shown.exit_code == 0, shown.output
    header = next(line for line in shown.output.splitlines() if re.search(r"\bid\b.*\brule\b.*\btrigger\b", line))
    assert "times failed" in header and "attempts" not in header, shown.output


def test_a_detached_firing_past_its_rule_deadline_is_given_up_and_the_firings_after_it_run(migrated, caplog):
    """A detached rule that never returned held its group runner for good: the firings queued behind it never ran,
    and nothing recorded the stuck firing as failed.  With ``OutboxOptions(rule_deadline=…)`` (seconds of
    ``db.clock``: a ``ManualClock`` passes it here) the firing is given up: its group transaction is doomed (what it
    wrote never commits, even once its thread returns), its record failed with a reason saying what to do, counted
    failed, logged once with the stuck thread's stack, and its runner freed.  ``--retry`` then runs it once."""
    clock = ManualClock()
    database = activedb.connect(migrated, clock=clock, outbox_options={
        "recovery_interval": None, "max_groups": 1, "rule_deadline": 30})
    with database.engine.begin() as connection:
        connection.execute(sa.text("TRUNCATE events_seen, activedb_outbox RESTART IDENTITY"))
    started, release, fixed = threading.Event(), threading.Event(), threading.Event()

    @database.rule(on=database.signalled("stuck"), coupling=Coupling.DETACHED, name="never_returns")
    def never_returns(tx, event):
        tx.insert("events_seen", rule="never_returns", detail="fixed" if fixed.is_set() else "stuck")
        if not fixed.is_set():
            started.set()
            release.wait(TIMEOUT * 10)         # set only at the end of the test

    @database.rule(on=database.signalled("next"), coupling=Coupling.DETACHED, name="runs_next")
    def runs_next(tx, event):
        tx.insert("events_seen", rule="runs_next", detail=event.payload["n"])

    try:
        with caplog.at_level("ERROR", logger="activedb.outbox"):
            try:
                with database.transaction() as tx:
                    tx.signal("stuck")
                assert started.wait(TIMEOUT), "the firing never started"
                with database.transaction() as tx:
                    tx.signal("next", n="1")            # behind the stuck firing: max_groups=1

                # (the outbox's deadline watcher sleeps on the clock until the stuck firing's deadline)
                wait_until(lambda: clock.sleepers >= 1, TIMEOUT, "the deadline watcher waits on the clock")
                clock.advance(31)
                wait_until(lambda: records(database)[:1] == [("never_returns", "failed", "committed", True)], TIMEOUT,
                           "the stuck firing given up", lambda: records(database))
                wait_until(lambda: ("runs_next", "1") in seen(database), TIMEOUT,
                           "the firing after the stuck one ran", lambda: seen(database))
                database.rules.wait_idle(TIMEOUT)     # (the given-up firing holds no runner any more)
                [failure] = database.outbox.failures()
                assert failure.rule == "never_returns", failure
                assert "rule 'never_returns' did not return within its deadline of 30 s" in failure.error, failure
                assert "activedb outbox --retry" in failure.error, failure
                # (counted by the deadline watcher once it marked the record failed)
                wait_until(lambda: database.rules.statistics().per_rule["never_returns"].failed == 1, TIMEOUT,
                           "the given-up firing counted failed", lambda: database.rules.statistics().per_rule)
                assert database.outbox.statistics().given_up == 1
            finally:
                release.set()
            wait_until(lambda: database.outbox.statistics().given_up == 0, TIMEOUT,
                       "the given-up firing's thread returned")
        assert seen(database) == [("runs_next", "1")], "the given-up firing's write committed"
        logged = [record for record in caplog.records if "did not return within its deadline" in record.getMessage()]
        assert len(logged) == 1, [record.getMessage() for record in logged]
        assert "release.wait" in logged[0].getMessage(), logged[0].getMessage()      # the stuck thread's stack
        counters = database.rules.statistics().per_rule["never_returns"]
        assert (counters.fired, counters.failed, counters.cancelled, counters.executed) == (1, 1, 0, 0), counters

        fixed.set()
        assert database.outbox.retry_failed([failure.id]) == 1
        wait_until(lambda: ("never_returns", "fixed") in seen(database), TIMEOUT, "the retried firing ran",
                   lambda: seen(database))
        database.rules.wait_idle(TIMEOUT)
        assert seen(database) == [("never_returns", "fixed"), ("runs_next", "1")]
        assert [status for rule, status, *_ in records(database)] == ["done", "done"]
    finally:
        release.set()
        database.close()
    executor = database.outbox._executor
    wait_until(lambda: executor._watcher is None, TIMEOUT, "the deadline watcher ended with close()")


@pytest.mark.parametrize("returns", ["executed", "condition_false"])
def test_a_given_up_firing_whose_thread_returns_normally_is_counted_once_failed(migrated, returns):
    """The give-up counted the firing's attempt failed; when its thread returns afterwards its outcome is not counted
    again: an action that returns (executed in the rule manager's eyes, but its group never commits) and a condition
    that returns false (which the rule manager counts ``condition_false`` as it returns) both leave the attempt
    counted once, failed — and nothing the firing wrote commits."""
    clock, release, rule = ManualClock(), threading.Event(), f"returns_late_{returns}"
    database = activedb.connect(migrated, clock=clock, outbox_options={"recovery_interval": None, "rule_deadline": 5})
    with database.engine.begin() as connection:
        connection.execute(sa.text("TRUNCATE events_seen, activedb_outbox RESTART IDENTITY"))
    started = threading.Event()

    def blocks(tx, event) -> None:
        tx.insert("events_seen", rule=rule, detail=returns)
        started.set()
        release.wait(TIMEOUT * 10)

    def condition(tx, event) -> bool:
        blocks(tx, event)
        return False

    if returns == "executed":
        database.rule(on=database.signalled("stuck"), coupling=Coupling.DETACHED, name=rule)(blocks)
    else:
        database.rule(on=database.signalled("stuck"), when=condition, coupling=Coupling.DETACHED,
                      name=rule)(lambda tx, event: None)
    try:
        pass_the_deadline_of_a_stuck_firing(database, clock, started)
        # (given up: its record marked failed, then counted so, by the deadline watcher)
        wait_until(lambda: database.rules.statistics().per_rule[rule].failed == 1, TIMEOUT,
                   "the firing given up", lambda: (records(database), database.rules.statistics().per_rule))
        assert database.outbox.statistics().given_up == 1
        release.set()
        wait_until(lambda: database.outbox.statistics().given_up == 0, TIMEOUT, "the given-up firing's thread returned")
        database.rules.wait_idle(TIMEOUT)
        counters = database.rules.statistics().per_rule[rule]
        assert (counters.fired, counters.failed, counters.executed, counters.condition_false, counters.cancelled) \
            == (1, 1, 0, 0, 0), counters
        statistics = database.outbox.statistics()
        assert (statistics.pending, statistics.done, statistics.failed) == (0, 0, 1), statistics
        assert statistics.per_rule == {rule: {"failed": 1}}, statistics
        assert [status for _, status, *_ in records(database)] == ["failed"]
        assert seen(database) == [], "the given-up firing's write committed"
    finally:
        release.set()
        database.close()


def test_a_firing_given_up_past_the_deadline_releases_its_locks_to_a_later_firing_on_the_same_row(migrated):
    """A given-up firing's thread kept the lock-manager locks of what it wrote until it returned: a later firing that
    writes the same row waited behind a thread that never returns.  The give-up ends the group transaction in the lock
    manager too (``lowlevel.abandon``: its tree doomed before it began to commit, so it never flushes): the later
    firing gets the row, commits, and the given-up firing's write never does, also once its thread returns."""
    clock, started, release = ManualClock(), threading.Event(), threading.Event()
    database = activedb.connect(migrated, clock=clock, outbox_options={"recovery_interval": None, "rule_deadline": 5})
    with database.engine.begin() as connection:
        connection.execute(sa.text("TRUNCATE items, activedb_outbox RESTART IDENTITY"))

    @database.rule(on=database.signalled("stuck"), coupling=Coupling.DETACHED, name="holds_the_row")
    def holds_the_row(tx, event):
        tx.write("items", "shared", value=int(event.payload.get("n", 1)))
        if event.payload.get("n") is None:
            started.set()
            release.wait(TIMEOUT * 10)     # set only at the end of the test

    def shared_value():
        with database.engine.connect() as connection:
            return connection.execute(sa.text("SELECT value FROM items WHERE key = 'shared'")).scalar()

    try:
        with Watchdog(TIMEOUT * 4, database.transactions.locks, on_fire=release.set):
            pass_the_deadline_of_a_stuck_firing(database, clock, started)
            # (given up: its record marked failed, then counted so, by the deadline watcher)
            wait_until(lambda: database.rules.statistics().per_rule["holds_the_row"].failed == 1, TIMEOUT,
                       "the firing given up", lambda: (records(database), database.outbox.statistics()))
            with database.transaction() as tx:
                tx.signal("stuck", n=2)         # a later firing on the same row, in a group of its own
            wait_until(lambda: shared_value() == 2, TIMEOUT, "the later firing on the same row committed",
                       lambda: (records(database), database.transactions.locks.statistics()))
            database.rules.wait_idle(TIMEOUT)
            assert database.outbox.statistics().given_up == 1
            assert [status for _, status, *_ in records(database)] == ["failed", "done"]
            release.set()
            wait_until(lambda: database.outbox.statistics().given_up == 0, TIMEOUT,
                       "the given-up firing's thread returned")
        assert shared_value() == 2, "the given-up firing's write committed"
        counters = database.rules.statistics().per_rule["holds_the_row"]
        assert (counters.fired, counters.executed, counters.failed, counters.cancelled) == (2, 1, 1, 0), counters
    finally:
        release.set()
        database.close()


def test_a_group_waiting_in_its_commit_past_the_rule_deadline_frees_its_runner_and_commits_when_it_can(migrated):
    """The rule deadline timed only the rules' runs: a group whose firings had returned but whose commit waited in
    PostgreSQL (another session holds a row it writes) held its runner, and the firings queued after it never ran
    while that session kept its lock.  Past the deadline the runner is released (a new one runs what is queued); the
    group is not given up — its commit may be under way in PostgreSQL —: it commits once the lock is free, its
    firing done and counted executed once, nothing failed."""
    clock = ManualClock()
    database = activedb.connect(migrated, clock=clock, outbox_options={"recovery_interval": None, "rule_deadline": 5})
    with database.engine.begin() as connection:
        connection.execute(sa.text("TRUNCATE items, activedb_outbox RESTART IDENTITY"))
        connection.execute(sa.text("INSERT INTO items (key, value) VALUES ('held', 0)"))

    @database.rule(on=database.signalled("held"), coupling=Coupling.DETACHED, name="writes_a_held_row")
    def writes_a_held_row(tx, event):
        tx.write("items", "held", value=1)

    @database.rule(on=database.signalled("next"), coupling=Coupling.DETACHED, name="runs_after_the_waiting_group")
    def runs_after_the_waiting_group(tx, event):
        tx.write("items", "next", value=2)

    def value(key):
        with database.engine.connect() as connection:
            return connection.execute(sa.text("SELECT value FROM items WHERE key = :key"), {"key": key}).scalar()

    def waiting_for_a_lock():
        with database.engine.connect() as connection:
            return connection.execute(sa.text("SELECT count(*) FROM pg_stat_activity WHERE datname = "
                                              "current_database() AND wait_event_type = 'Lock'")).scalar()

    holder = database.engine.connect()
    try:
        with Watchdog(TIMEOUT * 4, database.transactions.locks):
            transaction = holder.begin()
            holder.execute(sa.text("SELECT value FROM items WHERE key = 'held' FOR UPDATE"))
            with database.transaction() as tx:
                tx.signal("held")
            wait_until(lambda: waiting_for_a_lock() == 1, TIMEOUT, "the group's commit waits for the held row",
                       lambda: (records(database), database.outbox.statistics()))
            # (The deadline watcher sleeps until a time on the clock, Clock.wait_until: the advance passes the commit's
            # deadline whether the watcher sleeps yet, still times the firing, or has only just read the clock.)
            clock.advance(6)
            with database.transaction() as tx:
                tx.signal("next")
            wait_until(lambda: value("next") == 2, TIMEOUT, "the firing queued after the waiting group ran",
                       lambda: (records(database), database.outbox.statistics()))
            assert value("held") == 0 and waiting_for_a_lock() == 1
            transaction.rollback()
            database.rules.wait_idle(TIMEOUT)
        assert value("held") == 1
        assert [status for _, status, *_ in records(database)] == ["done", "done"]
        statistics = database.outbox.statistics()
        assert (statistics.given_up, statistics.failed) == (0, 0), statistics
        counters = database.rules.statistics().per_rule["writes_a_held_row"]
        assert (counters.fired, counters.executed, counters.failed, counters.cancelled) == (1, 1, 0, 0), counters
    finally:
        holder.close()
        database.close()


def pass_the_deadline_of_a_stuck_firing(database, clock: ManualClock, started: threading.Event) -> None:
    """Signal ``stuck``, wait for its firing to run (``started``) and for the deadline watcher to wait on ``clock``,
    then pass a rule deadline of 5 s: the watcher gives the firing up (after this returns)."""
    with database.transaction() as tx:
        tx.signal("stuck")
    assert started.wait(TIMEOUT), "the firing never started"
    wait_until(lambda: clock.sleepers >= 1, TIMEOUT, "the deadline watcher waits on the clock")
    clock.advance(6)


def stuck_firing(migrated, rule: str, release: threading.Event, **options):
    """A database (``connect(migrated, **options)``, its outbox empty) whose detached rule ``rule`` on signal ``stuck``
    blocks until ``release`` is set, and the event its firing sets once it runs."""
    database = activedb.connect(migrated, **options)
    with database.engine.begin() as connection:
        connection.execute(sa.text("TRUNCATE activedb_outbox RESTART IDENTITY"))
    started = threading.Event()

    def never_returns(tx, event):
        started.set()
        release.wait(TIMEOUT * 10)

    database.rule(on=database.signalled("stuck"), coupling=Coupling.DETACHED, name=rule)(never_returns)
    return database, started


def test_close_with_a_firing_that_never_returns_returns_and_names_it(migrated, monkeypatch, caplog):
    """``Database.close()`` with a detached firing that never returns waits a bounded time (``CLOSE_WAIT``) and then
    says which firing it left running: its rule, its event and its record."""
    from activedb.outbox import _outbox

    monkeypatch.setattr(_outbox, "CLOSE_WAIT", 0.05)
    release = threading.Event()
    database, started = stuck_firing(migrated, "never_returns_at_close", release,
                                     outbox_options={"recovery_interval": None})
    try:
        with database.transaction() as tx:
            tx.signal("stuck", n="7")
        assert started.wait(TIMEOUT), "the firing never started"
        with caplog.at_level("WARNING", logger="activedb.outbox"):
            database.close()
        [warning] = [record.getMessage() for record in caplog.records if "closing while" in record.getMessage()]
        assert "never_returns_at_close" in warning and "record 1" in warning and "stuck" in warning, warning
    finally:
        release.set()
        database.close()


def test_the_members_of_a_group_around_a_firing_given_up_run_again_once(migrated):
    """A group's firings before the one given up ran in its group transaction, which the give-up dooms, and those
    after it had not run: both run again, in another group, and commit once; the given-up firing's write never
    does."""
    clock = ManualClock()
    database = activedb.connect(migrated, clock=clock, outbox_options={
        "recovery_interval": None, "group_size": 64, "rule_deadline": 5})
    with database.engine.begin() as connection:
        connection.execute(sa.text("TRUNCATE events_seen, activedb_outbox RESTART IDENTITY"))
    started, release = threading.Event(), threading.Event()

    @database.rule(on=database.signalled("go"), coupling=Coupling.DETACHED, name="stuck_in_the_middle")
    def stuck_in_the_middle(tx, event):
        tx.insert("events_seen", rule="stuck_in_the_middle", detail=event.payload["n"])
        if event.payload["n"] == "2" and not release.is_set():
            started.set()
            release.wait(TIMEOUT * 10)

    try:
        with database.transaction() as tx:
            for number in ("1", "2", "3"):
                tx.signal("go", n=number)           # one group: 1 runs, 2 never returns, 3 waits behind it
        assert started.wait(TIMEOUT), "the firing never started"
        wait_until(lambda: clock.sleepers >= 1, TIMEOUT, "the deadline watcher waits on the clock")
        clock.advance(6)
        wait_until(lambda: seen(database) == [("stuck_in_the_middle", "1"), ("stuck_in_the_middle", "3")], TIMEOUT,
                   "the group's other members committed", lambda: (seen(database), records(database)))
        database.rules.wait_idle(TIMEOUT)
        assert [status for _, status, *_ in records(database)] == ["done", "failed", "done"]
    finally:
        release.set()
    wait_until(lambda: database.outbox.statistics().given_up == 0, TIMEOUT, "the given-up firing's thread returned")
    try:
        assert seen(database) == [("stuck_in_the_middle", "1"), ("stuck_in_the_middle", "3")]
        counters = database.rules.statistics().per_rule["stuck_in_the_middle"]
        # 1 ran twice (its first run undone: cancelled), 2 once (failed), 3 once.
        assert (counters.fired, counters.executed, counters.failed, counters.cancelled) == (4, 2, 1, 1), counters
    finally:
        database.close()


def test_the_members_a_give_up_after_close_puts_back_end_cancelled_and_run_once_in_the_next_process(
        migrated, monkeypatch, caplog):
    """A firing given up past the rule deadline after ``close()`` returned (it stopped waiting for the group, its
    ``CLOSE_WAIT`` over): the group's other members (1 ran in the doomed group, 3 never ran) are dropped from memory, as
    ``close()`` drops the queued ones (4, queued after the group) — each attempt counted ``cancelled``, a warning
    saying that their records stay pending for the database's next process — instead of being queued where no runner
    takes them; the next process runs each once."""
    from activedb.outbox import _outbox

    monkeypatch.setattr(_outbox, "CLOSE_WAIT", 0.05)
    clock, release = ManualClock(), threading.Event()
    database = activedb.connect(migrated, clock=clock, outbox_options={
        "recovery_interval": None, "group_size": 3, "max_groups": 1, "rule_deadline": 5})
    with database.engine.begin() as connection:
        connection.execute(sa.text("TRUNCATE events_seen, activedb_outbox RESTART IDENTITY"))
    rule, started = "given_up_after_close", threading.Event()

    def stuck_at_two(tx, event):
        tx.insert("events_seen", rule=rule, detail=event.payload["n"])
        if event.payload["n"] == "2" and not release.is_set():
            started.set()
            release.wait(TIMEOUT * 10)

    def counted():
        return database.rules.statistics().per_rule[rule]

    database.rule(on=database.signalled("go"), coupling=Coupling.DETACHED, name=rule)(stuck_at_two)
    try:
        with caplog.at_level("WARNING", logger="activedb.outbox"):
            with database.transaction() as tx:
                for number in ("1", "2", "3", "4"):
                    tx.signal("go", n=number)       # a group of 1, 2 (never returns), 3; 4 queued after it
            assert started.wait(TIMEOUT), "the firing never started"
            database.outbox.close()                 # (drops 4; the group still runs when it returns)
            assert database.outbox.running == 3, database.outbox.running
            wait_until(lambda: clock.sleepers >= 1, TIMEOUT, "the deadline watcher waits on the clock")
            clock.advance(6)
            wait_until(lambda: counted().failed == 1, TIMEOUT, "the firing given up was counted failed", counted)
        assert (database.outbox.running, database.outbox.runners) == (0, 0)
        assert database.outbox.statistics().given_up == 1
        # (1's run undone by the give-up, 2 given up, 3 and 4 never ran: one outcome each.)
        counters = counted()
        assert (counters.fired, counters.executed, counters.failed, counters.cancelled) == (4, 0, 1, 3), counters
        said = [record.getMessage() for record in caplog.records]
        [dropped] = [message for message in said if "given up" in message and "next process" in message]
        assert "2 record(s)" in dropped and rule in dropped, said
    finally:
        release.set()
    wait_until(lambda: database.outbox.statistics().given_up == 0, TIMEOUT, "the given-up firing's thread returned")
    database.close()
    assert [status for _, status, *_ in records(database)] == ["pending", "failed", "pending", "pending"]
    assert seen(database) == []
    assert_the_next_process_runs_each_once(migrated, rule, stuck_at_two, ["done", "failed", "done", "done"], seen,
                                           [(rule, "1"), (rule, "3"), (rule, "4")])


@pytest.mark.parametrize("value", [0, -1, float("nan"), float("inf"), "30", True])
def test_a_rule_deadline_that_is_no_positive_number_of_seconds_is_refused(value):
    with pytest.raises(activedb.BadArgument, match=r"OutboxOptions\(rule_deadline="):
        activedb.OutboxOptions(rule_deadline=value)


def test_close_after_a_firing_was_given_up_names_its_thread_still_running(migrated, caplog):
    """``close()`` after a firing was given up past the rule deadline does not wait for its thread (its runner was
    released) and says which firing it leaves running."""
    clock, release = ManualClock(), threading.Event()
    database, started = stuck_firing(migrated, "given_up_at_close", release, clock=clock,
                                     outbox_options={"recovery_interval": None, "rule_deadline": 5})
    try:
        pass_the_deadline_of_a_stuck_firing(database, clock, started)
        wait_until(lambda: database.outbox.statistics().given_up == 1, TIMEOUT, "the firing given up")
        with caplog.at_level("WARNING", logger="activedb.outbox"):
            database.close()
        [warning] = [record.getMessage() for record in caplog.records if "given up past the rule deadline still run"
                     in record.getMessage()]
        assert "rule 'given_up_at_close' on signal stuck" in warning and "(record 1)" in warning, warning
        assert not [record.getMessage() for record in caplog.records if "group transaction(s) still run" in
                    record.getMessage()]
    finally:
        release.set()
        database.close()


def test_the_deadline_watcher_wakes_for_a_deadline_the_clock_passed_between_its_reading_and_its_sleep(migrated):
    """The deadline watcher read ``clock.now()``, computed how long until the first deadline and slept that long
    (``Clock.wait``, a relative timeout): a ``ManualClock`` advanced between the read and the sleep started the sleep
    from the advanced time, so the deadline it slept until was later by the advance, and the stuck firing here was
    never given up.  The watcher sleeps until the deadline itself now (``Clock.wait_until``): an advance past it,
    before or during the sleep, ends the sleep."""
    clock, release = ReadPausingClock(), threading.Event()
    database, started = stuck_firing(migrated, "stuck_past_a_read", release, clock=clock, outbox_options={
        "recovery_interval": None, "max_groups": 1, "rule_deadline": 5})
    try:
        with database.transaction() as tx:
            tx.signal("stuck")
        assert started.wait(TIMEOUT), "the firing never started"
        executor = database.outbox._executor
        wait_until(lambda: not executor._watch_wake.is_set() and clock.sleepers == 1, TIMEOUT,
                   "the deadline watcher sleeps until the firing's deadline")
        # A wake-up (what a firing's or a commit's start gives the watcher, the only one to come here): the watcher's
        # next read of the clock is stopped, the clock passes the deadline, and only then does the watcher sleep.
        clock.pause_next_read("activedb-outbox-deadlines")
        executor._watch_wake.set()
        assert clock.read.wait(TIMEOUT), "the deadline watcher never read the clock again"
        clock.advance(6)
        clock.go.set()
        wait_until(lambda: [status for _, status, *_ in records(database)] == ["failed"], TIMEOUT,
                   "the firing given up", lambda: (records(database), clock, clock.sleepers))
        assert database.outbox.statistics().given_up == 1
    finally:
        release.set()
        clock.go.set()
        database.close()
