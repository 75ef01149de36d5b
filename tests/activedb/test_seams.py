"""The seams of the core: commit participants, observers, the typed slot, and the one wait-for graph
(gate waits and nested top-level transactions are edges of it: cycles are reported, never hang)."""

from __future__ import annotations

import logging
import threading

import pytest
import sqlalchemy as sa

from activedb import lowlevel
import activedb
from activedb import CommitParticipant, Coupling, Observer, testing
from activedb.errors import RuleFailed

TIMEOUT = 20


@pytest.fixture(autouse=True)
def clean(db):
    with db.engine.begin() as connection:
        for table in ("accounts", "items", "events_seen"):
            connection.execute(sa.text(f"DELETE FROM {table}"))
    yield
    for name in db.rules.names():
        db.rules.remove(name)
    db.rules.wait_idle(TIMEOUT)


class Recorder(CommitParticipant):
    def __init__(self, name, calls, table=None):
        self.name, self.calls, self.table = name, calls, table

    def before_flush(self, tx):
        self.calls.append((self.name, "before_flush"))

    def write(self, tx, connection):
        self.calls.append((self.name, "write"))
        if self.table:
            connection.execute(sa.text(f"INSERT INTO {self.table} (key, value) VALUES (:k, 1)"), {"k": self.name})

    def about_to_commit(self, tx, connection):
        self.calls.append((self.name, "about_to_commit"))

    def committed(self, tx):
        self.calls.append((self.name, "committed"))

    def aborted(self, tx, error):
        self.calls.append((self.name, "aborted", type(error).__name__))


def rows(db, table="items"):
    with db.engine.connect() as connection:
        return sorted(tuple(row) for row in connection.execute(sa.text(f"SELECT * FROM {table}")))


def test_participants_take_part_in_order_in_the_one_database_transaction(db):
    calls = []
    with db.transaction(participants=[Recorder("first", calls, "items")]) as tx:
        tx.write("accounts", 1, balance=1)
        with tx.subtransaction() as child:
            lowlevel.enlist(child, Recorder("child", calls, "items"))
        with pytest.raises(ValueError):
            with tx.subtransaction() as dropped:
                lowlevel.enlist(dropped, Recorder("dropped", calls, "items"))
                raise ValueError("this subtransaction aborts")
    assert calls == [("dropped", "aborted", "ValueError"),
                     ("first", "before_flush"), ("child", "before_flush"), ("first", "write"), ("child", "write"),
                     ("first", "about_to_commit"), ("child", "about_to_commit"),
                     ("first", "committed"), ("child", "committed")]
    assert [row[0] for row in rows(db)] == ["child", "first"]


def test_the_commit_rides_with_the_last_statement_unless_a_participant_acts_before_it(db):
    """``acts_before_commit``: a participant with nothing to do at ``about_to_commit`` is not asked, and when none
    acts the flush's last statement carries the COMMIT (the driver has no transaction open when SQLAlchemy then
    commits); one that acts is asked inside the transaction, before its COMMIT: what it writes there commits with
    the rest, and if it raises there nothing of the tree is written."""
    calls, open_at_commit = [], []

    class Quiet(Recorder):
        def acts_before_commit(self, tx):
            return False

        def about_to_commit(self, tx, connection):
            raise AssertionError("a participant that does not act before the commit is not asked")

    class Loud(Recorder):
        def about_to_commit(self, tx, connection):
            super().about_to_commit(tx, connection)
            connection.execute(sa.text("INSERT INTO items (key, value) VALUES ('loud, at commit', 1)"))

    class RefusesAtCommit(Recorder):
        def about_to_commit(self, tx, connection):
            connection.execute(sa.text("INSERT INTO items (key, value) VALUES ('refused at commit', 1)"))
            raise RuntimeError("refused just before the COMMIT")

    def heard_commit(connection):
        status = connection.connection.driver_connection.info.transaction_status
        open_at_commit.append(status.name)

    sa.event.listen(db.engine, "commit", heard_commit)
    try:
        with db.transaction(participants=[Quiet("quiet", calls, "items")]) as tx:
            tx.write("accounts", 3, balance=3)
        folded = list(open_at_commit)
        open_at_commit.clear()
        with db.transaction(participants=[Quiet("quiet 2", calls), Loud("loud", calls, "items")]) as tx:
            tx.write("accounts", 4, balance=4)
        with pytest.raises(RuntimeError):     # still before the COMMIT: nothing of that tree is written
            with db.transaction(participants=[RefusesAtCommit("refuses", calls)]) as tx:
                tx.write("accounts", 5, balance=5)
    finally:
        sa.event.remove(db.engine, "commit", heard_commit)
    assert folded == ["IDLE"] and open_at_commit == ["INTRANS"]
    assert ("loud", "about_to_commit") in calls and not any(name.startswith("quiet") and step == "about_to_commit"
                                                             for name, step, *_ in calls)
    assert [row[0] for row in rows(db)] == ["loud", "loud, at commit", "quiet"]
    assert [(row[0], row[-1]) for row in rows(db, "accounts")] == [(3, 3), (4, 4)]


def test_statements_along_ride_with_the_commit_and_a_failure_they_claim_is_raised(db):
    """``statements_along``: a participant's statements go in the flush's last round trip — sent inside the driver
    pipeline that carries the COMMIT, after every participant's ``write`` — and commit with the tree; when one fails,
    nothing of the tree is written, and the exception its ``refused`` returns is raised instead of the database
    error (an unclaimed failure stays activedb's ``DatabaseError`` with the SQLSTATE).  With a participant acting
    before the commit they are written before its ``about_to_commit``."""
    from psycopg.pq import PipelineStatus

    sent = []

    def heard(connection, cursor, statement, parameters, context, executemany):
        driver = connection.connection.driver_connection
        sent.append((statement.split()[0:3], PipelineStatus(driver.pgconn.pipeline_status).name))

    class Along(Recorder):
        def __init__(self, name, calls, claim=None, seen_at_commit=None):
            super().__init__(name, calls)
            self.claim, self.seen_at_commit = claim, seen_at_commit

        def statements_along(self, tx):
            self.calls.append((self.name, "statements_along"))
            return (activedb.Along("INSERT INTO items (key, value) VALUES (%s, 1)", (self.name,), self.claim),)

        def acts_before_commit(self, tx):
            return self.seen_at_commit is not None

        def about_to_commit(self, tx, connection):
            self.seen_at_commit.extend(connection.execute(sa.text("SELECT key FROM items")).scalars())

    class Claimed(Exception):
        pass

    def claim_duplicates(error):
        return Claimed(error.orig.diag.table_name) if error.orig.sqlstate == "23505" else None

    calls, seen = [], []
    sa.event.listen(db.engine, "before_cursor_execute", heard)
    try:
        with db.transaction(participants=[Along("along", calls), Recorder("plain", calls, "items")]) as tx:
            tx.write("accounts", 1, balance=1)
        with db.transaction(participants=[Along("no write set", calls)]):
            pass                                 # (the tree writes nothing: the log row alone carries the COMMIT)
    finally:
        sa.event.remove(db.engine, "before_cursor_execute", heard)
    assert calls[:4] == [("along", "before_flush"), ("plain", "before_flush"), ("along", "write"),
                         ("plain", "write")] and ("along", "statements_along") in calls
    along_sent = [pipeline for words, pipeline in sent if words == ["INSERT", "INTO", "items"]]
    assert along_sent == ["OFF", "ON", "ON"]     # the plain participant's write alone; the along ones in the pipeline
    assert [row[0] for row in rows(db)] == ["along", "no write set", "plain"]

    with pytest.raises(Claimed, match="items"):  # "along" again: a duplicate key, claimed
        with db.transaction(participants=[Along("along", calls, claim_duplicates)]) as tx:
            tx.write("accounts", 2, balance=2)
    with pytest.raises(activedb.DatabaseError) as refused:   # not claimed: the flush's own error
        with db.transaction(participants=[Along("along", calls)]) as tx:
            tx.write("accounts", 3, balance=3)
    assert refused.value.sqlstate == "23505"
    assert [row[0] for row in rows(db)] == ["along", "no write set", "plain"]
    assert [row[0] for row in rows(db, "accounts")] == [1]

    with db.transaction(participants=[Along("acting", calls, seen_at_commit=seen)]) as tx:
        tx.write("accounts", 4, balance=4)
    assert "acting" in seen and [row[0] for row in rows(db, "accounts")] == [1, 4]


def test_a_participant_that_raises_writes_nothing_and_hears_the_abort(db):
    calls = []

    class Refuses(Recorder):
        def write(self, tx, connection):
            super().write(tx, connection)
            raise RuntimeError("no")

    with pytest.raises(RuntimeError):
        with db.transaction(participants=[Recorder("ok", calls, "items"), Refuses("refuses", calls)]) as tx:
            tx.write("accounts", 2, balance=2)
    assert rows(db) == [] and rows(db, "accounts") == []
    assert calls[-2:] == [("ok", "aborted", "RuntimeError"), ("refuses", "aborted", "RuntimeError")]


def test_observers_hear_life_cycles_and_a_raising_observer_is_removed(db, caplog):
    heard = []

    class Listens(Observer):
        def on_begin(self, tx):
            heard.append(("begin", tx.is_top_level))

        def on_commit(self, tx):
            heard.append(("commit", tx.is_top_level))

        def on_abort(self, tx, reason):
            heard.append(("abort", type(reason).__name__))

        def on_firing_end(self, tx, firing, outcome):
            heard.append(("firing", firing.rule.name, outcome))

    class Breaks(Observer):
        def on_begin(self, tx):
            raise RuntimeError("observer bug")

    listens, breaks = db.observe(Listens()), db.observe(Breaks())
    try:
        db.rule(on=db.signalled("ping"), name="pong")(lambda tx, ev: None)
        with caplog.at_level(logging.ERROR, logger="activedb.observers"):
            with db.transaction() as tx:
                tx.signal("ping")
        assert breaks not in list(db.transactions.observers)
        assert "observer bug" in caplog.text
        assert heard == [("begin", True), ("begin", False), ("firing", "pong", "executed"), ("commit", False),
                         ("commit", True)]
    finally:
        db.transactions.observers.remove(listens)


def test_wait_children_waits_without_limit_for_an_infinite_timeout_and_refuses_no_number(db):
    """lowlevel.wait_children(tx, timeout=inf) raised OverflowError while a child ran, NaN ran out at once (a
    TimeoutError 'did not end within nan s'), -1 as well; inf now waits without limit and the others are a
    BadArgument naming the timeout, the child left running."""
    locks = db.transactions.locks
    started, gate = threading.Event(), threading.Event()

    def child(tx):
        started.set()                       # a worker runs it: the wait below blocks
        assert gate.wait(TIMEOUT)
        # The parent's wait for its children is an edge of the wait-for graph before its thread blocks.
        testing.wait_until(lambda: locks.statistics().registered_waits == 1, TIMEOUT, "the parent to wait")

    with testing.Watchdog(30, locks):
        with db.transaction() as tx:
            handle = tx.spawn(child, eager=True)
            assert started.wait(TIMEOUT)
            for timeout in (float("nan"), -1, "5"):
                with pytest.raises(activedb.BadArgument, match=rf"wait_children\(timeout={timeout!r}\)"):
                    lowlevel.wait_children(tx, timeout=timeout)
            assert handle.state is activedb.TxnState.ACTIVE
            gate.set()
            lowlevel.wait_children(tx, timeout=float("inf"))
            assert handle.state is activedb.TxnState.COMMITTED


def test_the_typed_slot_is_one_object_per_type_and_transaction(db):
    class Mine:
        def __init__(self):
            self.count = 0

    with db.transaction() as tx:
        assert lowlevel.slot(tx, Mine, create=False) is None
        lowlevel.slot(tx, Mine).count += 1
        lowlevel.slot(tx, Mine).count += 1
        assert lowlevel.slot(tx, Mine).count == 2
        with tx.subtransaction() as child:
            assert lowlevel.slot(child, Mine, create=False) is None


def test_an_action_waiting_for_its_condition_gives_way_when_the_condition_needs_its_row(db):
    """Gate wait vs lock wait (C-A sequential causally dependent coupling): the action, done, waits in the
    coupling gate for its condition (a sibling); the condition then needs the row the action keeps.  The
    cycle is found when it forms; the action volunteers, aborts, and runs again once the condition
    committed true.  Nothing polls."""
    action_wrote = threading.Event()
    gate = db.rules.gate

    def condition(tx, event):
        assert action_wrote.wait(TIMEOUT)
        testing.wait_until(lambda: gate.statistics().waiting_to_commit == 1, TIMEOUT, "the action's gate wait")
        tx.read("accounts", 9)                   # the row the action keeps: closes the cycle
        return True

    @db.rule(on=db.signalled("go"), when=condition, action_coupling=Coupling.SEQUENTIAL_CAUSALLY_DEPENDENT,
             name="compensate")
    def compensate(tx, event):
        current = tx.read("accounts", 9)
        tx.write("accounts", 9, balance=(current["balance"] if current else 0) + 100)
        action_wrote.set()

    class Aborts(Observer):
        def __init__(self):
            self.reasons = []

        def on_abort(self, transaction, reason):
            self.reasons.append(type(reason).__name__)

    aborts = db.observe(Aborts())
    try:
        with testing.Watchdog(60, db.transactions.locks):
            with db.transaction() as tx:
                tx.signal("go")
    finally:
        db.transactions.observers.remove(aborts)
    assert aborts.reasons == ["DeadlockDetected"]  # the first run of the action, and nothing else
    assert rows(db, "accounts") == [(9, None, 100)]
    assert db.rules.statistics().per_rule["compensate"].rerun_after_wait == 1   # the second run, counted


def test_a_rule_opening_its_own_top_level_on_its_triggers_row_is_a_deadlock_not_a_hang(db):
    @db.rule(on=db.inserted("items"), name="own_transaction")
    def own_transaction(tx, event):
        with db.transaction() as separate:          # a new top-level, waiting for the trigger's row
            separate.write("items", event.key, value=99)

    with testing.Watchdog(60, db.transactions.locks):
        with pytest.raises(RuleFailed) as raised:
            with db.transaction() as tx:
                tx.insert("items", key="k", value=1)
    assert isinstance(raised.value.__cause__, activedb.DeadlockDetected)
    assert "nested" in str(raised.value.__cause__)
    assert rows(db) == []
    # (The victim was the action's own top-level, not the firing's tree: the rule failed, it was not cancelled.)
    assert (db.rules.statistics().per_rule["own_transaction"].failed,
            db.rules.statistics().per_rule["own_transaction"].cancelled) == (1, 0)


def test_a_condition_that_raises_fails_the_firing_with_either_action_coupling(db):
    for action_coupling in (Coupling.IMMEDIATE, Coupling.SEQUENTIAL_CAUSALLY_DEPENDENT):
        name = f"broken_{action_coupling.value}"

        def broken(tx, event):
            raise ValueError("condition bug")

        db.rule(on=db.signalled(name), when=broken, action_coupling=action_coupling, name=name)(
            lambda tx, event: tx.write("accounts", 5, balance=5))
        with pytest.raises(RuleFailed, match="condition bug"):
            with db.transaction() as tx:
                tx.signal(name)
        assert db.rules.statistics().per_rule[name].failed == 1
    assert rows(db, "accounts") == []


def test_an_insert_event_carries_the_stored_row(db):
    seen = []
    db.rule(on=db.inserted("events_seen"), name="sees")(lambda tx, event: seen.append((event.key, event.new)))
    with db.transaction() as tx:
        key = tx.insert("events_seen", rule="r")
    assert seen == [(key, {"id": key, "rule": "r", "detail": None})]


@pytest.mark.parametrize("doom", [lowlevel.doom, lowlevel.abandon])
def test_doom_and_abandon_refuse_a_reason_that_is_no_exception_before_dooming(db, doom):
    """lowlevel.doom(tx, 'deadline passed') was taken: the tree's next operation then failed with Python's TypeError
    ('exception causes must derive from BaseException') raised from activedb's own raise … from reason, instead of
    the abort it stood for.  A reason that is no exception is a BadArgument naming it; the tree is not doomed."""
    with pytest.raises(activedb.TransactionAborted, match="deadline passed"):     # (its commit, once doomed)
        with db.transaction() as tx:
            with pytest.raises(activedb.BadArgument, match=r"reason.*'deadline passed'.*exception"):
                doom(tx, "deadline passed")
            tx.write("items", "d", value=1)                 # (not doomed: it goes on)
            doom(tx, TimeoutError("deadline passed"))
            with pytest.raises(activedb.TransactionAborted, match="deadline passed"):
                tx.write("items", "e", value=1)
