"""Hot keys: read-modify-write with ``tx.read(table, key, for_update=True)``.

* in one process, the update lock makes two read-modify-writes of one row queue at the read — with plain
  reads both read, both convert to WRITE, and one is a deadlock victim (shown step by step);
* 8 threads incrementing 2 counters commit every increment at the first attempt;
* across two engines (two lock managers: two processes, as far as PostgreSQL can tell) the row lock taken
  at the read orders them in PostgreSQL: the second waits (observed in ``pg_locks``) and reads the first's
  result — no validation failure, no re-run;
* a tree that also scans flushes at SERIALIZABLE (its held locks are let go and taken again at the flush);
* across two engines, plain read-then-write flushes of one row queue at the validation (the row locked
  ``FOR UPDATE``, not ``FOR SHARE``): the second fails its check when the first commits and is re-run,
  instead of both passing it and deadlocking in PostgreSQL when both UPDATE the row;
* with the history recorded, a flush in the held transaction keeps its rows in the lock manager until the flush is
  recorded, so the next tree's read is recorded after it (handed over, the read could be recorded first, as read
  from the initial state: a false precedence cycle);
* across two engines, a flush holding its table locks (it relied on an absent row) does not wait for a row the
  other's flush holds: it gives up and tries again instead of closing a cycle only PostgreSQL's deadlock detector
  would break, a second later;
* a cycle through two processes' lock managers and PostgreSQL's row locks (or through one process's and a plain
  client's row locks), which no single detector sees, has one victim: each engine publishes its part of it.
"""

from __future__ import annotations

import ast
import contextlib
import os
import queue
import subprocess
import sys
import threading

import pytest
import sqlalchemy as sa

from activedb import lowlevel
import activedb
from activedb import testing
from activedb.errors import SerializationConflict
from activedb.txn import CommitParticipant
from tests._tables import balances, refill, row_locked
from tests.activedb import _cycle_peer

TIMEOUT = 30


@pytest.fixture(autouse=True)
def counters(db):
    refill(db, "accounts", "(id, balance) VALUES (1, 0), (2, 0)")


def test_plain_reads_deadlock_on_conversion_and_update_locks_queue_instead(db):
    locks = db.transactions.locks
    first_read, second_read = threading.Event(), threading.Event()
    outcome = {}

    def increment(name, own_read, other_read, for_update):
        try:
            with db.transaction() as tx:
                row = tx.read("accounts", 1, for_update=for_update)
                own_read.set()
                if not for_update:
                    assert other_read.wait(TIMEOUT)          # both have read: now both convert
                tx.write("accounts", 1, balance=row["balance"] + 1)
            outcome[name] = "committed"
        except activedb.DeadlockDetected:
            outcome[name] = "deadlock"

    with testing.Watchdog(60, locks):
        for for_update in (False, True):
            outcome.clear()
            first_read.clear(), second_read.clear()
            first = threading.Thread(target=increment, args=("first", first_read, second_read, for_update))
            first.start()
            assert first_read.wait(TIMEOUT)
            second = threading.Thread(target=increment, args=("second", second_read, first_read, for_update))
            second.start()
            first.join(TIMEOUT), second.join(TIMEOUT)
            if for_update:
                assert outcome == {"first": "committed", "second": "committed"}
            else:
                assert sorted(outcome.values()) == ["committed", "deadlock"]
    assert balances(db)[1] == 3


def test_eight_threads_on_two_hot_counters_commit_every_increment_at_the_first_attempt(db):
    attempts = []
    per_thread = 15

    def increment(tx, key):
        attempts.append(key)
        row = tx.read("accounts", key, for_update=True)
        tx.write("accounts", key, balance=row["balance"] + 1)

    def worker(number):
        for step in range(per_thread):
            db.run(increment, 1 + (number + step) % 2)

    with testing.Watchdog(120, db.transactions.locks):
        threads = [threading.Thread(target=worker, args=(number,)) for number in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
    assert balances(db) == {1: 4 * per_thread, 2: 4 * per_thread}
    assert len(attempts) == 8 * per_thread                  # no deadlock, no conflict: nothing re-ran


def _waiting_for_a_row_lock(db) -> bool:
    with db.engine.connect() as connection:
        return connection.execute(sa.text(
            "SELECT count(*) FROM pg_locks WHERE NOT granted AND locktype IN ('transactionid', 'tuple')"
        )).scalar() > 0


def test_across_engines_the_row_lock_orders_the_writers_without_a_rerun(db, database_url):
    other = activedb.connect(database_url)
    try:
        second_done = threading.Event()
        attempts = []

        def increment(tx):
            attempts.append(1)
            row = tx.read("accounts", 1, for_update=True)
            tx.write("accounts", 1, balance=row["balance"] + 1)

        def second():
            other.run(increment)
            second_done.set()

        with db.transaction() as tx:
            row = tx.read("accounts", 1, for_update=True)
            thread = threading.Thread(target=second)
            thread.start()
            testing.wait_until(lambda: _waiting_for_a_row_lock(db), TIMEOUT, "the other engine waiting for the row lock")
            assert not second_done.is_set()
            tx.write("accounts", 1, balance=row["balance"] + 10)
        thread.join(TIMEOUT)
        assert second_done.is_set()
        assert balances(db)[1] == 11 and attempts == [1]
    finally:
        other.close()


def test_a_tree_that_also_scans_locks_again_at_a_serializable_flush(db):
    with db.transaction() as tx:
        row = tx.read("accounts", 2, for_update=True)
        others = tx.scan("accounts", lambda image: image["id"] != 2)
        tx.write("accounts", 2, balance=row["balance"] + len(others))
    assert balances(db)[2] == 1



def _terminate_idle_in_transaction(db) -> int:
    """End the session holding the tree's rows read for update (this database's one session idle in a transaction)
    from a connection outside the pool, waiting until it has ended; how many were ended."""
    import psycopg

    url = db.engine.url
    with psycopg.connect(host=url.host or url.query["host"], port=url.port, user=url.username, password=url.password,
                         dbname="postgres", autocommit=True) as admin:
        return admin.execute(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid, 30000)) FROM pg_stat_activity "
            "WHERE datname = %s AND state = 'idle in transaction'", (url.database,)).fetchone()[0]


@pytest.mark.parametrize("relies_on", ["a scan", "an absent row"])
def test_a_serializable_flush_after_the_held_session_was_lost_locks_again_and_commits(db, relies_on):
    """The held locks are let go before a flush at SERIALIZABLE: a session that ended meanwhile (terminated, the
    server's idle-in-transaction timeout) let them go already, and the flush locks the rows again and validates them
    as when the session lives — not a driver error from rolling back the lost session."""
    with db.transaction() as tx:
        row = tx.read("accounts", 2, for_update=True)
        assert _terminate_idle_in_transaction(db) == 1
        if relies_on == "a scan":
            tx.scan("accounts", lambda image: image["id"] != 2)
        else:
            assert tx.read("accounts", 404) is None
        tx.write("accounts", 2, balance=row["balance"] + 5)
    assert balances(db) == {1: 0, 2: 5}
    with db.transaction() as tx:                             # the next tree reads for update as ever
        row = tx.read("accounts", 2, for_update=True)
        tx.write("accounts", 2, balance=row["balance"] + 1)
    assert balances(db) == {1: 0, 2: 6}

def test_db_run_learns_update_intent_from_a_read_then_write_that_deadlocked(db):
    """Plain ``tx.read`` then ``tx.write`` of one row by two ``db.run`` calls at once: both read, both
    convert, one is the deadlock victim and is re-run.  The re-run, and every later run of the function,
    reads that table for update: a third run, paused after its read, holds the UPDATE lock."""
    both_read = threading.Barrier(2, timeout=TIMEOUT)
    paused, resume = threading.Event(), threading.Event()
    attempts = []
    phase = {"colliding": True}

    def increment(tx):
        attempts.append(tx.id)
        row = tx.read("accounts", 1)
        if phase["colliding"] and len(attempts) <= 2:
            both_read.wait()                                # both have read: now both convert to WRITE
        elif not phase["colliding"]:
            paused.set()
            assert resume.wait(TIMEOUT)
        tx.write("accounts", 1, balance=row["balance"] + 1)

    with testing.Watchdog(60, db.transactions.locks):
        runs = [threading.Thread(target=db.run, args=(increment,), kwargs={"retries": 5}) for _ in range(2)]
        for run in runs:
            run.start()
        for run in runs:
            run.join(TIMEOUT)
        assert len(attempts) == 3, attempts                 # one of the two was re-run once
        phase["colliding"] = False
        third = threading.Thread(target=db.run, args=(increment,))
        third.start()
        assert paused.wait(TIMEOUT)
        held = db.transactions.locking.holders("accounts", (1,)).held
        resume.set()
        third.join(TIMEOUT)
    assert "UPDATE" in {mode.name for mode in held.values()}, held
    assert balances(db)[1] == 3                             # no update lost


class _PausedAfterValidation(CommitParticipant):
    """Pauses the flush after its validation (``write`` is the step after it), until released."""

    def __init__(self):
        self.reached, self.release = threading.Event(), threading.Event()

    def write(self, transaction, connection):
        self.reached.set()
        assert self.release.wait(TIMEOUT)


def test_from_its_held_flush_on_a_tree_leaves_its_rows_to_postgresql_and_the_next_tree_waits_there(db):
    """A tree's rows read for update are guarded by PostgreSQL's row lock alone once its flush starts: the next
    tree of the same process is granted its UPDATE lock meanwhile, waits for the row in PostgreSQL and reads
    the first one's result — no re-run, no update lost."""
    pause, attempts = _PausedAfterValidation(), []

    def first():
        with db.transaction(participants=[pause]) as tx:
            row = tx.read("accounts", 1, for_update=True)
            tx.write("accounts", 1, balance=row["balance"] + 10)

    def increment(tx):
        attempts.append(1)
        row = tx.read("accounts", 1, for_update=True)
        tx.write("accounts", 1, balance=row["balance"] + 1)

    with testing.Watchdog(60, db.transactions.locks):
        flushing, second = threading.Thread(target=first), threading.Thread(target=db.run, args=(increment,))
        flushing.start()
        assert pause.reached.wait(TIMEOUT)
        second.start()
        testing.wait_until(lambda: _waiting_for_a_row_lock(db), TIMEOUT, "the second tree waiting in PostgreSQL")
        held = db.transactions.locking.holders("accounts", (1,)).held
        pause.release.set()
        flushing.join(TIMEOUT), second.join(TIMEOUT)
    assert [mode.name for mode in held.values()] == ["UPDATE"], held
    assert balances(db)[1] == 11 and attempts == [1]


def test_with_the_history_recorded_a_held_flush_is_recorded_before_the_next_tree_reads_its_row(database_url,
                                                                                              monkeypatch):
    """With ``record_history=True`` the flush in the held transaction keeps its rows in the lock manager until the
    flush is recorded: the next tree's read for update waits there, and reads the row after the history says who
    wrote it.  (Handed over to PostgreSQL at the flush, the next tree's read returned at the COMMIT and could be
    recorded before the flush — as read from the initial state although it saw the first tree's value: a false
    "not conflict serializable".)  The first tree's recording of its flush waits here until the second tree has
    either read the row or waits in the lock manager for it, so that the recording order is decided either way."""
    recording = activedb.connect(database_url, record_history=True)
    try:
        recorder = recording.history
        pause, second_read, roots = _PausedAfterValidation(), threading.Event(), {}

        def heard(op):
            if op.kind == "read" and op.table == "accounts" and op.root == roots.get("second"):
                second_read.set()

        def waits_in_the_lock_manager() -> bool:       # for a lock (not in PostgreSQL: a "row-lock" edge)
            graph = recording.transactions.locks.wait_for_graph(timeout=TIMEOUT)
            return any(kind in ("held", "retained", "queued") for _, _, kind in graph.edges(data="kind"))

        record_flush = recorder.record_flush

        def record_flush_once_the_second_tree_read_or_waits(root, images):
            if root == roots.get("first"):
                testing.wait_until(lambda: second_read.is_set() or waits_in_the_lock_manager(), TIMEOUT,
                                   "the second tree having read the row or waiting for it in the lock manager")
            record_flush(root, images)

        monkeypatch.setattr(recorder, "record_flush", record_flush_once_the_second_tree_read_or_waits)
        stop_listening = recorder.listen(heard)

        def first():
            with recording.transaction(participants=[pause]) as tx:
                roots["first"] = tx.id
                row = tx.read("accounts", 1, for_update=True)
                tx.write("accounts", 1, balance=row["balance"] + 10)

        def second():
            with recording.transaction() as tx:
                roots["second"] = tx.id
                row = tx.read("accounts", 1, for_update=True)
                tx.write("accounts", 1, balance=row["balance"] + 1)

        try:
            with testing.Watchdog(60, recording.transactions.locks):
                flushing, reading = threading.Thread(target=first), threading.Thread(target=second)
                flushing.start()
                assert pause.reached.wait(TIMEOUT)
                reading.start()
                testing.wait_until(lambda: _waiting_for_a_row_lock(recording) or waits_in_the_lock_manager(),
                                   TIMEOUT, "the second tree waiting for the row")
                pause.release.set()
                flushing.join(TIMEOUT), reading.join(TIMEOUT)
        finally:
            stop_listening()
        assert not flushing.is_alive() and not reading.is_alive()
        ops = recorder.snapshot()
        report = testing.check_history(ops)
        assert report.ok, (report.violations, [(op.sequence, op.kind, op.transaction, op.value, op.read_from)
                                               for op in ops if op.kind in ("read", "flush")])
        assert balances(recording)[1] == 11
    finally:
        recording.close()


def test_across_engines_plain_read_then_write_flushes_queue_at_the_validation(db, database_url):
    other = activedb.connect(database_url)
    try:
        first, second = _PausedAfterValidation(), _PausedAfterValidation()
        second.release.set()
        attempts = []

        def increment(tx, participant):
            attempts.append(participant)
            row = tx.read("accounts", 1)                    # plain: validated at the flush
            lowlevel.enlist(tx, participant)
            tx.write("accounts", 1, balance=row["balance"] + 1)

        errors = []

        def run(database, participant):
            try:
                database.run(increment, participant, retries=5)
            except BaseException as error:                  # reported below with what was seen
                errors.append(error)

        with testing.Watchdog(60, db.transactions.locks):
            one = threading.Thread(target=run, args=(db, first))
            one.start()
            assert first.reached.wait(TIMEOUT)              # validated (row locked), not yet written
            two = threading.Thread(target=run, args=(other, second))
            two.start()
            testing.wait_until(lambda: _waiting_for_a_row_lock(db), TIMEOUT, "the other engine's flush waiting for the row")
            assert not second.reached.is_set(), "the second flush passed its validation while the first held the row"
            first.release.set()
            one.join(TIMEOUT), two.join(TIMEOUT)
        assert errors == []
        assert attempts == [first, second, second]          # the second failed its check once and was re-run
        assert balances(db)[1] == 2                         # no update lost
    finally:
        other.close()


def test_across_engines_a_flush_holding_its_table_locks_does_not_wait_for_a_row(db, database_url):
    """A flush that relies on an absent row locks its table SHARE ROW EXCLUSIVE first; if it then waited for a
    row that another engine's flush has locked (validated, not yet written), that flush would wait for the
    table at its first write and PostgreSQL would break the cycle only after its deadlock_timeout (a second
    each: most of the two-process list-append history's time).  It does not wait: it gives up the attempt and
    tries again, and with the row held throughout it ends with ``SerializationConflict``, nothing written; the
    other flush then commits.  PostgreSQL detected no deadlock."""
    other = activedb.connect(database_url)
    try:
        pause, outcome = _PausedAfterValidation(), {}

        def holds_row_one():
            with db.transaction(participants=[pause]) as tx:
                row = tx.read("accounts", 1)                # read, then written: locked FOR UPDATE at validation
                tx.write("accounts", 1, balance=row["balance"] + 1)

        def relies_on_an_absent_row():
            try:
                with other.transaction() as tx:
                    assert tx.read("accounts", 999) is None     # absence: the flush takes the table lock
                    tx.read("accounts", 1)
                    tx.write("accounts", 2, balance=5)
                outcome["flush"] = "committed"
            except BaseException as error:                  # checked below
                outcome["flush"] = error

        deadlocks = _deadlocks_detected(db)
        with testing.Watchdog(90, db.transactions.locks):
            holder = threading.Thread(target=holds_row_one)
            holder.start()
            assert pause.reached.wait(TIMEOUT)              # row 1 locked FOR UPDATE, the table not yet written
            relier = threading.Thread(target=relies_on_an_absent_row)
            relier.start()
            relier.join(TIMEOUT)
            waited = relier.is_alive()
            pause.release.set()
            holder.join(TIMEOUT)
            relier.join(TIMEOUT)
        assert not waited, "the flush holding the table lock waited for the row"
        assert isinstance(outcome["flush"], SerializationConflict), outcome
        assert balances(db) == {1: 1, 2: 0}
        assert _deadlocks_detected(db) == deadlocks
    finally:
        other.close()


def _deadlocks_detected(db) -> int:
    with db.engine.connect() as connection:
        return connection.execute(sa.text(
            "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()")).scalar()


def _logged(db, log_id: str) -> bool:
    with db.engine.connect() as connection:
        return connection.execute(sa.text("SELECT count(*) FROM activedb_transaction_log WHERE transaction_id = :id"),
                                  {"id": log_id}).scalar() == 1


def test_a_flush_in_the_held_transaction_that_fails_at_its_last_statement_writes_nothing_and_lets_the_row_go(db):
    """The held flush sends its COMMIT with its last statement (one round trip): a refusal of that statement
    — another process inserted the row this tree inserts — is the same ``DuplicateKey``, nothing is
    committed (the earlier statement of the write set neither), and the row lock is gone."""
    with pytest.raises(activedb.DuplicateKey):
        with db.transaction() as tx:
            row = tx.read("accounts", 1, for_update=True)
            tx.write("accounts", 1, balance=row["balance"] + 7)
            tx.insert("accounts", id=3, balance=1)           # absent now ...
            with db.engine.begin() as other:                 # ... and inserted by another client meanwhile
                other.execute(sa.text("INSERT INTO accounts (id, balance) VALUES (3, 99)"))
            log_id = tx.log_id
    assert balances(db) == {1: 0, 2: 0, 3: 99}
    assert not _logged(db, log_id)
    with db.transaction() as tx:                             # nobody holds row 1 any more
        row = tx.read("accounts", 1, for_update=True)
        tx.write("accounts", 1, balance=row["balance"] + 1)
    assert balances(db)[1] == 1


@pytest.mark.parametrize("for_update", [True, False], ids=["held flush", "flush"])
def test_a_write_waiting_past_the_lock_timeout_in_the_flush_is_a_database_error_naming_55p03(db, monkeypatch,
                                                                                             for_update):
    """A statement of the flush other than the validation's row locks — here the write of a row another connection
    holds ``FOR UPDATE`` — that waits past the lock timeout (the one the read for update or the validation set for the
    rest of the transaction) is a ``DatabaseError`` naming 55P03 (txn README, "What the flush validates"), in the
    flush in the held transaction as in any other; nothing is written and the row read is let go.  Before, the held
    flush made every 55P03 a ``SerializationConflict`` (a conflict ``Database.run`` re-runs), its own validation's
    and the database's alike."""
    from activedb.txn import _flush, _rowlocks
    monkeypatch.setattr(_rowlocks, "LOCK_TIMEOUT", "200ms")     # (the read for update's, for the held transaction)
    monkeypatch.setattr(_flush, "LOCK_TIMEOUT", "200ms")        # (the validation's)
    with db.engine.connect() as other:
        other.execute(sa.text("SELECT * FROM accounts WHERE id = 2 FOR UPDATE"))     # held until the block ends
        with pytest.raises(activedb.DatabaseError, match="55P03") as raised:
            with db.transaction() as tx:
                row = tx.read("accounts", 1, for_update=for_update)
                tx.write("accounts", 1, balance=row["balance"] + 1)
                tx.write("accounts", 2, balance=5)          # a blind write: not validated, it waits at its UPDATE
                log_id = tx.log_id
        other.rollback()
    assert raised.value.sqlstate == "55P03" and not isinstance(raised.value, SerializationConflict)
    assert balances(db) == {1: 0, 2: 0} and not _logged(db, log_id)
    with db.transaction() as tx:                             # nobody holds row 1 any more
        tx.write("accounts", 1, balance=tx.read("accounts", 1, for_update=True)["balance"] + 1)
    assert balances(db) == {1: 1, 2: 0}


class _SeesItsCommitAhead(CommitParticipant):
    """Writes at ``about_to_commit`` (the step before COMMIT) and notes whether the tree was committed then."""

    def __init__(self, db):
        self.db, self.committed_before = db, None

    def about_to_commit(self, transaction, connection):
        self.committed_before = _logged(self.db, transaction.log_id)
        connection.execute(sa.text("UPDATE accounts SET balance = balance + 100 WHERE id = 2"))


def test_a_participant_writing_at_about_to_commit_writes_before_the_held_transaction_commits(db):
    participant = _SeesItsCommitAhead(db)
    with db.transaction(participants=[participant]) as tx:
        row = tx.read("accounts", 1, for_update=True)
        tx.write("accounts", 1, balance=row["balance"] + 1)
        log_id = tx.log_id
    assert participant.committed_before is False
    assert _logged(db, log_id) and balances(db) == {1: 1, 2: 100}


def test_an_abandoned_tree_releases_its_row_locks_now_and_never_commits(db):
    """``lowlevel.abandon`` from another thread, while the tree's thread waits (a rule that does not return): the
    row the tree read for update is free for another process at once, and — the tree had not begun to commit — for
    another tree of this process too (its lock-manager locks released); when the thread goes on, its next operation
    raises the reason and nothing of the tree is written."""
    reading, release = threading.Event(), threading.Event()
    trees, outcome = [], {}

    def hold():
        try:
            with db.transaction() as tx:
                trees.append(tx)
                tx.read("accounts", 1, for_update=True)
                reading.set()
                assert release.wait(TIMEOUT * 4)     # (longer than the other tree's wait below)
                tx.write("accounts", 1, balance=99)
            outcome["end"] = "committed"
        except Exception as error:
            outcome["end"] = error

    def locked_elsewhere() -> bool:
        return row_locked(db.engine, "accounts", "id", 1)

    thread = threading.Thread(target=hold)
    thread.start()
    assert reading.wait(TIMEOUT)
    assert locked_elsewhere()
    reason = RuntimeError("past its deadline")
    lowlevel.abandon(trees[0], reason)
    assert not locked_elsewhere()
    other = threading.Thread(target=lambda: db.run(lambda tx: tx.write("accounts", 1, balance=5)))
    other.start()                   # (another tree of this process writes the abandoned tree's row)
    other.join(TIMEOUT)
    assert not other.is_alive(), f"another tree waited for the abandoned one: {db.transactions.locks.statistics()}"
    release.set()
    thread.join(TIMEOUT)
    assert isinstance(outcome["end"], activedb.TransactionAborted) and outcome["end"].__cause__ is reason
    assert balances(db)[1] == 5


def test_a_flush_that_would_wait_in_postgresql_for_a_tree_waiting_for_it_in_the_lock_manager_is_a_deadlock(db):
    """A cycle through both lock systems: tree A read row 1 plainly (a READ lock), tree B read it for update (an
    UPDATE lock, which admits A's read, and the row locked FOR UPDATE in PostgreSQL) and writes it, so B waits in
    the lock manager for A; A's commit validates its read with FOR SHARE, which would wait in PostgreSQL for B.  The
    flush tells the lock manager that it waits for B (a registered wait), the lock manager sees the cycle, and one
    of them is the deadlock's victim — before, both waited forever: neither detector saw both edges."""
    outcome: dict[str, str] = {}
    a_read = threading.Event()

    def tree_b():
        try:
            with db.transaction() as tx:
                row = tx.read("accounts", 1, for_update=True)
                tx.write("accounts", 1, balance=row["balance"] + 1)
            outcome["B"] = "committed"
        except activedb.DeadlockDetected:
            outcome["B"] = "deadlock"

    with testing.Watchdog(60, db.transactions.locks):
        b = threading.Thread(target=tree_b)
        try:
            with db.transaction() as tx:
                tx.read("accounts", 1)
                b.start()
                testing.wait_until(lambda: db.transactions.locks.statistics().waiting == 1, TIMEOUT,
                                   "B waiting in the lock manager for A's read lock")
            outcome["A"] = "committed"
        except activedb.DeadlockDetected:
            outcome["A"] = "deadlock"
        b.join(TIMEOUT)
        assert not b.is_alive()
    assert sorted(outcome.values()) == ["committed", "deadlock"], outcome
    assert balances(db)[1] == (1 if outcome["B"] == "committed" else 0)


def test_a_tree_closing_that_cycle_after_the_flush_waits_in_postgresql_is_the_victim(db):
    """The same cycle closed the other way round: A's flush already waits in PostgreSQL for B's row (its wait
    registered) when B writes the row and waits for A in the lock manager: B is the victim (a flush blocked in
    PostgreSQL cannot be one), its abort lets the row go, and A commits."""
    outcome: dict[str, str] = {}
    b_read, b_write = threading.Event(), threading.Event()

    def tree_a():
        with db.transaction() as tx:
            tx.read("accounts", 1)
            a_read.set()
            assert b_read.wait(TIMEOUT)
        outcome["A"] = "committed"

    def tree_b():
        try:
            with db.transaction() as tx:
                row = tx.read("accounts", 1, for_update=True)
                b_read.set()
                assert b_write.wait(TIMEOUT)
                tx.write("accounts", 1, balance=row["balance"] + 1)
            outcome["B"] = "committed"
        except activedb.DeadlockDetected:
            outcome["B"] = "deadlock"

    a_read = threading.Event()
    with testing.Watchdog(60, db.transactions.locks):
        a, b = threading.Thread(target=tree_a), threading.Thread(target=tree_b)
        a.start()
        assert a_read.wait(TIMEOUT)
        b.start()
        testing.wait_until(lambda: db.transactions.locks.statistics().registered_waits == 1, TIMEOUT,
                           "A's flush waiting for B's row (its registered wait)")
        b_write.set()
        a.join(TIMEOUT), b.join(TIMEOUT)
        assert not a.is_alive() and not b.is_alive()
    assert outcome == {"A": "committed", "B": "deadlock"}
    assert balances(db)[1] == 0


class _ChildGivesUp(Exception):
    """Raised by a child whose script aborts it."""


def test_a_childs_wait_in_postgresql_for_another_tree_is_the_childs_edge_of_the_wait_for_graph(db):
    """Tree A keeps row 1 locked in PostgreSQL after the child that read it for update aborted (the child's UPDATE
    lock went with it, the tree's row lock stays until the tree ends).  Tree B's child reads row 2 plainly and row 1
    for update: it waits in PostgreSQL for A, and that wait is an edge of the wait-for graph from the child, the
    node that waits (not from its root).  A then writes row 2 and would wait in the lock manager for B's child: the
    cycle is found at once and A is the victim, its abort lets row 1 go, and B commits.  Without the child's edge
    neither detector saw both waits (B's child gave up after the read's lock timeout)."""
    locks, outcome = db.transactions.locks, {}

    def row_lock_edges():
        return [(source, target) for source, target, kind in locks.wait_for_graph().edges(data="kind")
                if kind == "row-lock"]

    def child_of_b(child):
        child.read("accounts", 2)
        row = child.read("accounts", 1, for_update=True)
        child.write("accounts", 1, balance=row["balance"] + 1)

    def tree_b():
        with db.transaction() as tx:
            tx.spawn(child_of_b).result(TIMEOUT)
        outcome["B"] = "committed"

    with testing.Watchdog(60, locks):
        b = threading.Thread(target=tree_b)
        try:
            with db.transaction() as tx:
                with pytest.raises(_ChildGivesUp):
                    with tx.subtransaction() as child:
                        child.read("accounts", 1, for_update=True)
                        raise _ChildGivesUp
                b.start()
                testing.wait_until(row_lock_edges, TIMEOUT, "B's child waiting in PostgreSQL for A's row (its edge)")
                [(waiter, holder)] = row_lock_edges()
                tx.write("accounts", 2, balance=5)
            outcome["A"] = "committed"
        except activedb.DeadlockDetected:
            outcome["A"] = "deadlock"
        b.join(TIMEOUT)
        assert not b.is_alive()
    assert holder == tx.id and "." in waiter, (waiter, holder)     # B's child waits for tree A
    assert outcome == {"A": "deadlock", "B": "committed"}
    assert balances(db) == {1: 1, 2: 0}


def test_a_read_for_update_waiting_for_a_flush_that_locked_its_row_first_is_an_edge_postgresql_names(db):
    """A cycle one of whose edges only PostgreSQL knows: tree F's flush validates row 1 (``FOR SHARE``, locked) and
    then waits for item x, which tree D holds ``FOR UPDATE`` (that wait is registered: D is x's listed holder).  Tree
    C then reads row 1 for update and waits in PostgreSQL for F — no tree is row 1's listed holder and F's statement
    that locked it had ended, so nothing was registered before C's statement was sent.  D then writes row 4, which C
    wrote: D waits for C in the lock manager.  PostgreSQL sees C -> F -> D and no cycle (D does not wait there), the
    lock manager saw D -> C and F -> D.  C's statement, asked about after it waited ``CHECK_AFTER``
    (``pg_blocking_pids``), adds C -> F: D's request closes the cycle and D is the victim; its abort lets x go, F
    commits, then C.  Before, C gave up after its lock timeout (10 s) with a ``SerializationConflict``."""
    refill(db, "accounts", "(id, balance) VALUES (1, 0), (2, 0), (3, 0), (4, 0)")
    refill(db, "items", "(key, value) VALUES ('x', 0)")
    locks, outcome = db.transactions.locks, {}
    d_locked, c_wrote, c_go, d_go = (threading.Event() for _ in range(4))
    ids: dict[str, str] = {}

    def row_lock_edges():
        return {(source, target) for source, target, kind in locks.wait_for_graph().edges(data="kind")
                if kind == "row-lock"}

    def tree(name, body):
        def run():
            try:
                with db.transaction() as tx:
                    ids[name] = tx.id
                    body(tx)
                outcome[name] = "committed"
            except activedb.DeadlockDetected:
                outcome[name] = "deadlock"
            except Exception as error:          # (reported by the assertion below)
                outcome[name] = repr(error)
        return threading.Thread(target=run, name=f"tree {name}")

    def body_d(tx):
        tx.read("items", "x", for_update=True)
        d_locked.set()
        assert d_go.wait(TIMEOUT)
        tx.write("accounts", 4, balance=40)

    def body_c(tx):
        tx.write("accounts", 4, balance=4)
        c_wrote.set()
        assert c_go.wait(TIMEOUT)
        tx.read("accounts", 1, for_update=True)

    def body_f(tx):
        tx.read("accounts", 1)
        tx.read("items", "x")
        tx.write("accounts", 3, balance=3)

    trees = [tree("D", body_d), tree("C", body_c), tree("F", body_f)]
    with testing.Watchdog(90, locks):
        trees[0].start(), trees[1].start()
        assert d_locked.wait(TIMEOUT) and c_wrote.wait(TIMEOUT)
        trees[2].start()
        testing.wait_until(lambda: len(row_lock_edges()) == 1 and _waiting_for_a_row_lock(db), TIMEOUT,
                           "F's flush waiting in PostgreSQL for D's item (its registered wait)")
        assert row_lock_edges() == {(ids["F"], ids["D"])}
        c_go.set()
        testing.wait_until(lambda: (ids["C"], ids["F"]) in row_lock_edges(), TIMEOUT,
                           "C's wait in PostgreSQL for F's flush, an edge once PostgreSQL was asked")
        d_go.set()
        for thread in trees:
            thread.join(TIMEOUT)
        assert not any(thread.is_alive() for thread in trees)
    assert outcome == {"C": "committed", "D": "deadlock", "F": "committed"}
    assert balances(db) == {1: 0, 2: 0, 3: 3, 4: 4}
    assert row_lock_edges() == set()


def _lock_in_postgresql_only(tx, key) -> None:
    """Row ``key`` locked in PostgreSQL by ``tx``'s tree but not in the lock manager: the child that read it for update
    aborted (its UPDATE lock went with it, the tree's row lock stays until the tree ends), so another tree's read for
    update of it waits in PostgreSQL, not in the lock manager."""
    with pytest.raises(_ChildGivesUp):
        with tx.subtransaction() as child:
            child.read("accounts", key, for_update=True)
            raise _ChildGivesUp


def test_a_child_waiting_for_its_trees_statement_waits_for_that_child_in_the_wait_for_graph(db):
    """A tree's reads for update run one at a time on its connection: child A1's read of row 1 waits in PostgreSQL
    for tree B, and child A2's read of row 2 waits for A1's statement to end.  A2 wrote row 3; B writes it and waits
    for A2 in the lock manager.  A2's wait for A1 is an edge too (``RowLocks._turn``), so B's request closes the
    cycle B -> A2 -> A1 -> B and B is the victim; its abort lets row 1 go and tree A commits.  Before, that wait was
    seen by no detector: A1 gave up after its lock timeout (10 s)."""
    refill(db, "accounts", "(id, balance) VALUES (1, 0), (2, 0), (3, 0)")
    locks, outcome, ids = db.transactions.locks, {}, {}
    b_locked, b_go, a2_wrote, a2_go = (threading.Event() for _ in range(4))

    def row_lock_edges():
        return {(source, target) for source, target, kind in locks.wait_for_graph().edges(data="kind")
                if kind == "row-lock"}

    def a1(child):
        ids["A1"] = child.id
        row = child.read("accounts", 1, for_update=True)
        child.write("accounts", 1, balance=row["balance"] + 1)

    def a2(child):
        ids["A2"] = child.id
        child.write("accounts", 3, balance=3)
        a2_wrote.set()
        assert a2_go.wait(TIMEOUT)
        row = child.read("accounts", 2, for_update=True)
        child.write("accounts", 2, balance=row["balance"] + 2)

    def tree_a():
        try:
            with db.transaction() as tx:
                second = tx.spawn(a2)
                assert a2_wrote.wait(TIMEOUT)
                tx.spawn(a1).result(TIMEOUT)
                second.result(TIMEOUT)
            outcome["A"] = "committed"
        except Exception as error:
            outcome["A"] = repr(error)

    def tree_b():
        try:
            with db.transaction() as tx:
                ids["B"] = tx.id
                _lock_in_postgresql_only(tx, 1)
                b_locked.set()
                assert b_go.wait(TIMEOUT)
                tx.write("accounts", 3, balance=30)
            outcome["B"] = "committed"
        except activedb.DeadlockDetected:
            outcome["B"] = "deadlock"

    with testing.Watchdog(90, locks):
        b, a = threading.Thread(target=tree_b), threading.Thread(target=tree_a)
        b.start()
        assert b_locked.wait(TIMEOUT)
        a.start()
        testing.wait_until(lambda: "A1" in ids and (ids["A1"], ids["B"]) in row_lock_edges(), TIMEOUT,
                           "A1 waiting in PostgreSQL for B's row (its registered wait)")
        a2_go.set()
        testing.wait_until(lambda: (ids["A2"], ids["A1"]) in row_lock_edges(), TIMEOUT,
                           "A2 waiting for A1's statement on the tree's connection (an edge)")
        b_go.set()
        a.join(TIMEOUT), b.join(TIMEOUT)
        assert not a.is_alive() and not b.is_alive()
    assert outcome == {"A": "committed", "B": "deadlock"}
    assert balances(db) == {1: 1, 2: 2, 3: 3}


def _waiting_for_row_locks(db) -> int:
    with db.engine.connect() as connection:
        return connection.execute(sa.text(
            "SELECT count(DISTINCT pid) FROM pg_locks WHERE NOT granted AND locktype IN ('transactionid', 'tuple')"
        )).scalar()


class _Peer:
    """The other process of a cycle (``tests/activedb/_cycle_peer.py``): its own engine, driven by lines on its stdin;
    what it prints is read by a thread into a queue."""

    def __init__(self, database_url: str) -> None:
        self.process = subprocess.Popen([sys.executable, "-m", "tests.activedb._cycle_peer", database_url],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=lambda: [self.lines.put(line.strip()) for line in self.process.stdout],
                         daemon=True).start()
        self.expect("ready")

    def send(self, line: str) -> None:
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()

    def expect(self, prefix: str) -> str:
        """The next line the peer prints, which must start with ``prefix``."""
        try:
            line = self.lines.get(timeout=TIMEOUT)
        except queue.Empty:
            raise AssertionError(f"the peer process printed nothing in {TIMEOUT} s (expected {prefix!r}; "
                                 f"its exit code: {self.process.poll()})") from None
        assert line.startswith(prefix), (prefix, line)
        return line

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.send("")
            self.process.stdin.close()
        try:
            self.process.wait(TIMEOUT)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def test_a_cycle_through_two_processes_lock_managers_and_postgresql_has_one_victim(db, database_url):
    """Two processes (two engines), two trees each.  A1 holds row 1 and A2 row 3 (this process); B1 holds row 2 and
    B2 row 4 (the other), each read for update.  A2 then reads row 2 and waits in PostgreSQL for B1; B2 reads row 1
    and waits in PostgreSQL for A1; A1 reads row 3 and waits in this process's lock manager for A2; B1 reads row 4
    and waits in the other's lock manager for B2.  No detector sees the cycle A2 -> B1 -> B2 -> A1 -> A2: PostgreSQL
    sees two waits, each lock manager one.  Each process publishes what only it knows (its waiting statement, and
    which of its backends' trees wait for it), and the statement of A2 or B2 with the higher backend pid is the one
    victim; its abort lets the cycle go and the three others commit.  Before, one of the two statements gave up after
    its lock timeout (10 s) with a ``SerializationConflict``."""
    refill(db, "accounts", "(id, balance) VALUES (1, 0), (2, 0), (3, 0), (4, 0)")
    holds = {"A1": (1, 3), "A2": (3, 2), "B1": (2, 4), "B2": (4, 1)}
    held = {name: threading.Event() for name in ("A1", "A2")}
    go = {name: threading.Event() for name in ("A1", "A2")}
    outcome: dict[str, object] = {}
    threads = [_cycle_peer.reads_for_update_then_increments(db, name, holds[name], held[name].set, go[name], outcome)
               for name in ("A1", "A2")]
    peer = _Peer(database_url)
    try:
        with testing.Watchdog(90, db.transactions.locks):
            for thread in threads:
                thread.start()
            assert held["A1"].wait(TIMEOUT) and held["A2"].wait(TIMEOUT)
            for name in ("B1", "B2"):
                peer.send(f"tree {name} {holds[name][0]} {holds[name][1]}")
                peer.expect(f"held {name}")
            go["A2"].set()
            testing.wait_until(lambda: _waiting_for_row_locks(db) == 1, TIMEOUT, "A2 waiting in PostgreSQL for B1")
            peer.send("go B2")
            testing.wait_until(lambda: _waiting_for_row_locks(db) == 2, TIMEOUT, "B2 waiting in PostgreSQL for A1")
            go["A1"].set()
            testing.wait_until(lambda: db.transactions.locks.statistics().waiting == 1, TIMEOUT,
                               "A1 waiting in this process's lock manager for A2")
            peer.send("go B1")
            for _ in range(2):
                _, name, result = peer.expect("outcome").split(" ", 2)
                outcome[name] = result
            for thread in threads:
                thread.join(TIMEOUT)
            assert not any(thread.is_alive() for thread in threads)
    finally:
        peer.close()
    victims = [name for name, result in outcome.items()
               if isinstance(result, activedb.DeadlockDetected) or str(result).startswith("deadlock")]
    assert victims in (["A2"], ["B2"]) and len(outcome) == 4, outcome
    assert "lock managers of more than one process" in str(outcome[victims[0]])
    # the other process's backends named after it (their sessions' application_name, "activedb PID")
    told = str(outcome["A2"]) if victims == ["A2"] else ast.literal_eval(outcome["B2"].split(" ", 1)[1])  # (peer: repr)
    other = peer.process.pid if victims == ["A2"] else os.getpid()
    assert f"application 'activedb {other}', active: " in told, told
    assert all(result == "committed" for name, result in outcome.items() if name not in victims), outcome
    expected = {1: 0, 2: 0, 3: 0, 4: 0}
    for name, rows in holds.items():
        if name not in victims:
            for key in rows:
                expected[key] += 1
    assert balances(db) == expected
    assert peer.process.returncode == 0


def _plain_client(db, held, go, outcome, backend: list[int] | None = None) -> threading.Thread:
    """A thread of a client that is not activedb (application name "plain client"): it locks row 4 of accounts, sets
    ``held``, waits for ``go``, adds 10 to row 1 (waiting for whoever holds it) and commits; ``outcome["client"]`` is
    "committed" then.  Its backend's pid is appended to ``backend``."""
    def run():
        with db.engine.begin() as connection:
            connection.exec_driver_sql("SET application_name = 'plain client'")
            if backend is not None:
                backend.append(connection.exec_driver_sql("SELECT pg_backend_pid()").scalar_one())
            connection.execute(sa.text("SELECT * FROM accounts WHERE id = 4 FOR UPDATE"))
            held.set()
            assert go.wait(TIMEOUT)
            connection.execute(sa.text("UPDATE accounts SET balance = balance + 10 WHERE id = 1"))
        outcome["client"] = "committed"
    return threading.Thread(target=run, name="client")


def _publishing_backends(db) -> list[int]:
    """The backends holding published edges of a cycle across engines (``_acrossengines``)."""
    from activedb.txn import _acrossengines

    with db.engine.connect() as connection:
        return connection.execute(sa.text(
            "SELECT DISTINCT pid FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1 AND granted "
            "AND ((classid::bigint << 32) | objid::bigint) >> :shift = :tag"),
            {"shift": 2 * _acrossengines.PID_BITS, "tag": _acrossengines.TAG}).scalars().all()


@pytest.mark.parametrize("db", [{"explain_deadlocks": True}], indirect=True, ids=["explained"])
@pytest.mark.parametrize("closed_by", ["T2's statement", "the client's, after the published edge was lost"])
def test_a_cycle_through_the_lock_manager_and_another_clients_row_locks_has_this_engines_statement_as_victim(
        db, closed_by):
    """One engine and a plain PostgreSQL client (not activedb).  Tree T1 holds row 1, tree T2 row 3 (each read for
    update); the client locks row 4 and then waits in PostgreSQL for row 1; T1 reads row 3 and waits in the lock
    manager for T2; T2 reads row 4 and waits in PostgreSQL for the client.  PostgreSQL sees T2 -> client -> T1, the
    lock manager T1 -> T2.  The engine's published edges close the cycle and T2's statement, the only one of it that
    can be told, is the victim: T1 commits, then the client.  Before, T2 gave up after its lock timeout (10 s).  The
    deadlock's picture (``explain_deadlocks=True``) draws the client's backend and the cycle through it.

    Closed by T2's statement (the last wait), or by the client's after T2 and T1 waited: then the engine published
    T1's wait for T2's statement on a session of its own, which is terminated before the cycle closes — the edge goes
    with it; the engine's next statement on the lost session fails, it opens another and publishes its edge there."""
    refill(db, "accounts", "(id, balance) VALUES (1, 0), (2, 0), (3, 0), (4, 0)")
    holds = {"T1": (1, 3), "T2": (3, 4)}
    held = {name: threading.Event() for name in (*holds, "client")}
    go = {name: threading.Event() for name in (*holds, "client")}
    outcome: dict[str, object] = {}
    threads = {name: _cycle_peer.reads_for_update_then_increments(db, name, rows, held[name].set, go[name], outcome)
               for name, rows in holds.items()}
    client_backend: list[int] = []
    threads["client"] = _plain_client(db, held["client"], go["client"], outcome, client_backend)
    with testing.Watchdog(90, db.transactions.locks):
        for name, thread in threads.items():
            thread.start()
            assert held[name].wait(TIMEOUT)
        if closed_by == "T2's statement":
            go["client"].set()
            testing.wait_until(lambda: _waiting_for_row_locks(db) == 1, TIMEOUT, "the client waiting for T1's row")
            go["T1"].set()
            testing.wait_until(lambda: db.transactions.locks.statistics().waiting == 1, TIMEOUT,
                               "T1 waiting in the lock manager for T2")
            go["T2"].set()
        else:
            go["T2"].set()
            testing.wait_until(lambda: _waiting_for_row_locks(db) == 1, TIMEOUT, "T2 waiting for the client's row")
            go["T1"].set()
            testing.wait_until(lambda: len(_publishing_backends(db)) == 1, TIMEOUT,
                               "T1 waiting in the lock manager for T2, whose statement waits for the client: published")
            [board] = _publishing_backends(db)
            with db.engine.connect() as connection:
                assert connection.execute(sa.text("SELECT pg_terminate_backend(:pid, 30000)"), {"pid": board}).scalar()
            # (Its session's edge is gone with it; the engine's checker may already have published it again on a
            # session of its own — what the test is about — so the old backend is what must be missing.)
            assert board not in _publishing_backends(db)
            go["client"].set()
        for thread in threads.values():
            thread.join(TIMEOUT)
        assert not any(thread.is_alive() for thread in threads.values())
    victim = outcome.pop("T2")
    assert isinstance(victim, activedb.DeadlockDetected), outcome
    assert outcome == {"T1": "committed", "client": "committed"}
    assert balances(db) == {1: 11, 2: 0, 3: 1, 4: 0}
    picture = victim.explanation        # (the client's backend drawn as a box of its own, in the cycle)
    [client] = [node.tid for node in picture.nodes if node.state == "outside this process"]
    assert client.startswith("backend ") and picture.victim == victim.victim
    assert {(edge.kind, client in (edge.waiter, edge.target)) for edge in picture.edges if edge.in_cycle} == {
        ("row-lock", True), ("tree", False)}
    # the message says what the other side was as the cycle was found (the client's waiting statement)
    assert client == f"backend {client_backend[0]}" and (
        f"Backend {client_backend[0]}: application 'plain client', active: UPDATE accounts SET balance = balance + 10 "
        f"WHERE id = 1.") in str(victim), str(victim)
    # ... and so do the error's ``outside`` and the picture: the client's box is named by what PostgreSQL showed
    seen = "application 'plain client', active: UPDATE accounts SET balance = balance + 10 WHERE id = 1"
    assert victim.outside == {client: seen}
    assert [node.name for node in picture.nodes if node.tid == client] == [seen]
    assert f"{client} {seen} [outside this process]" in picture.text(), picture.text()


def test_a_statement_waiting_in_postgresql_after_its_tree_was_aborted_is_cancelled(db):
    """Tree A's child waits in PostgreSQL for tree B's row; A's own thread gives up meanwhile, and the tree is
    aborted in the lock manager while the child's statement still waits.  Asked about, the statement is found to be
    an aborted tree's and cancelled: the child ends with ``TransactionAborted`` saying so, and the tree's row locks go
    now — not when the wait ends (B's lock, here held to the end, or the statement's 10 s lock timeout)."""
    refill(db, "accounts", "(id, balance) VALUES (1, 0), (2, 0)")
    locks, errors, ids = db.transactions.locks, {}, {}
    b_locked, b_go = threading.Event(), threading.Event()

    def child(node):
        ids["child"] = node.id
        try:
            node.read("accounts", 2, for_update=True)
            node.read("accounts", 1, for_update=True)
        except Exception as error:
            errors["child"] = error
            raise

    def tree_b():
        with db.transaction() as tx:
            ids["B"] = tx.id
            _lock_in_postgresql_only(tx, 1)
            b_locked.set()
            assert b_go.wait(TIMEOUT)

    with testing.Watchdog(90, locks):
        b = threading.Thread(target=tree_b)
        b.start()
        assert b_locked.wait(TIMEOUT)
        with pytest.raises(_ChildGivesUp):
            with db.transaction() as tx:
                tx.spawn(child)
                testing.wait_until(lambda: "child" in ids and (ids["child"], ids["B"]) in
                                   {(s, t) for s, t, k in locks.wait_for_graph().edges(data="kind") if k == "row-lock"},
                                   TIMEOUT, "the child waiting in PostgreSQL for B's row")
                raise _ChildGivesUp
        testing.wait_until(lambda: "child" in errors, TIMEOUT, "the child's statement cancelled")
        assert not row_locked(db.engine, "accounts", "id", 2), "the aborted tree's row lock went with its abort"
        b_go.set()
        b.join(TIMEOUT)
        assert not b.is_alive()
    assert isinstance(errors["child"], activedb.TransactionAborted), repr(errors["child"])
    assert "cancelled" in str(errors["child"])




def test_the_thread_asking_postgresql_about_waiting_statements_ends_when_its_database_closes(db, database_url,
                                                                                            monkeypatch):
    """A read for update starts the checker thread of its database (``ServerWaits``), which looks while a statement
    waits.  Closing the database ends it at its next look, although a read still waits in PostgreSQL (here for a row
    another connection holds until the test lets it go; the read's own lock timeout longer than the test's wait)."""
    from activedb.txn import _rowlocks

    monkeypatch.setattr(_rowlocks, "LOCK_TIMEOUT", f"{3 * TIMEOUT}s")
    other = activedb.connect(database_url)
    name, outcome = other.transactions.server_waits.thread_name, {}

    def running() -> bool:
        return any(thread.name == name for thread in threading.enumerate())

    def reads_the_held_row() -> None:
        try:
            with other.transaction() as tx:
                tx.read("accounts", 1, for_update=True)
            outcome["read"] = "committed"
        except Exception as error:              # (its database closed meanwhile: what it meets is not the point)
            outcome["read"] = repr(error)

    with db.engine.connect() as holder:
        holder.execute(sa.text("SELECT 1 FROM accounts WHERE id = 1 FOR UPDATE"))
        reader = threading.Thread(target=reads_the_held_row)
        try:
            reader.start()
            testing.wait_until(lambda: running() and _waiting_for_a_row_lock(db), TIMEOUT,
                               "the read waiting in PostgreSQL, the checker thread looking")
            other.close()
            testing.wait_until(lambda: not running(), TIMEOUT, "the checker thread's end after the close")
        finally:
            holder.rollback()
            reader.join(TIMEOUT)
            other.close()
    assert not reader.is_alive() and "read" in outcome
