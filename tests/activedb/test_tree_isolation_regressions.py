"""The three tree-isolation bugs, as found, each a regression test.

A. A subtransaction's second read of a row its parent wrote (without reading it first) returned the
   committed image instead of the parent's version: the child's cache of the committed image was
   consulted before the ancestors' write entries.
B. A parent that locked a row in its own operations while its child ran, then waited for that child
   (``handle.result()`` or commit), hung forever: the parent's locks sat in an internal holder the lock
   manager did not connect to the parent's wait.
C. Two sibling subtransactions that read one row before and after another process committed a new
   version of it both reached the flush with only one of the two images, so the flush validated the
   wrong one and committed a write based on a stale read.

Found later by the list-append history test (``tests/scenarios/test_list_append_history.py``):

D. A node whose ancestor had just aborted, waiting for its own child (``handle.result()``), got the lock
   manager's raw ``lockmgr.AbortedTransaction`` (registering the wait in the wait-for graph found the node
   aborted there) instead of waiting for the doomed child and raising activedb's ``TransactionAborted``.
F. (in its test's docstring) the same family on the begin path of a subtransaction.
G. A scan whose ancestor aborted while it ran returned committed rows without the ancestor's writes.
H. A spawned child whose ancestor's abort reached the lock manager just after the child had handed its
   effects to its parent stayed COMMITTING for good (its lock-manager commit raised outside the step that
   aborts a failed commit).
"""

from __future__ import annotations

import threading

import pytest
import sqlalchemy as sa

import activedb
from activedb import testing
from activedb.txn import Subtransactions
from tests._tables import balances, history_checked, refill

pytestmark = pytest.mark.db(record_history=True)

TIMEOUT = 10


@pytest.fixture(autouse=True)
def rows(db):
    refill(db, "accounts", "(id, balance) VALUES (1, 10), (2, 0)")
    with history_checked(db):
        yield


def test_a_child_rereading_a_row_its_parent_wrote_sees_the_parent_version(db):
    with db.transaction() as tx:
        tx.write("accounts", 1, balance=11)                  # no read before the write
        with tx.subtransaction() as child:
            assert child.read("accounts", 1)["balance"] == 11
            again = child.read("accounts", 1)
            assert again["balance"] == 11                    # was 10: the parent's write vanished
            child.write("accounts", 1, balance=again["balance"] + 1)
    assert balances(db)[1] == 12


def test_a_grandchild_and_spawned_child_see_the_same_versions(db):
    with db.transaction() as tx:
        tx.write("accounts", 1, balance=20)
        with tx.subtransaction() as child:
            child.read("accounts", 2)                        # caches a committed image in the child
            with child.subtransaction() as grandchild:
                assert grandchild.read("accounts", 1)["balance"] == 20
                assert grandchild.read("accounts", 1)["balance"] == 20
        assert tx.spawn(lambda c: [c.read("accounts", 1)["balance"] for _ in range(3)]).result(TIMEOUT) == [20] * 3


@pytest.mark.parametrize("parent_op", ["read", "write"])
@pytest.mark.parametrize("child_first", [True, False], ids=["child-asks-first", "parent-waits-first"])
@pytest.mark.parametrize("wait", ["result", "commit"])
def test_b_parent_that_locked_a_row_then_waits_for_its_child_does_not_hang(db, parent_op, child_first, wait):
    locks = db.transactions.locks
    parent_done = threading.Event()
    resource = ("row", "accounts", (1,))

    def child(c):
        assert parent_done.wait(TIMEOUT)
        if not child_first:
            # Wait until the parent waits for us: its lock on the row is then retained, not held.
            testing.wait_until(lambda: not locks.holders(resource).held, TIMEOUT, "the parent to wait")
        c.write("accounts", 1, balance=c.read("accounts", 1)["balance"] + 5)
        return "child done"

    with testing.Watchdog(30, locks):
        with db.transaction() as tx:
            handle = tx.spawn(child)
            if parent_op == "read":
                assert tx.read("accounts", 1)["balance"] == 10
            else:
                tx.write("accounts", 1, balance=100)
            waiting = locks.statistics().waiting
            parent_done.set()
            if child_first and handle.state is not activedb.TxnState.COMMITTED:
                # The child now asks for the row the parent's own operation locked, and waits.
                testing.wait_until(lambda: locks.statistics().waiting > waiting or handle.done(), TIMEOUT,
                                   "the child to wait for the parent's lock")
            if wait == "result":
                assert handle.result(TIMEOUT) == "child done"
                assert tx.read("accounts", 1)["balance"] == (15 if parent_op == "read" else 105)
    assert balances(db)[1] == (15 if parent_op == "read" else 105)


def test_c_siblings_that_read_different_committed_versions_cannot_commit(db):
    read_first = threading.Event()
    sibling_committed = threading.Event()

    def c1(child):
        seen = child.read("accounts", 1)["balance"]          # 10
        read_first.set()
        assert sibling_committed.wait(TIMEOUT)               # c1 is still active while c2 reads and commits
        return seen

    with pytest.raises(activedb.SerializationConflict):
        with db.transaction() as tx:
            first = tx.spawn(c1)
            assert read_first.wait(TIMEOUT)
            # Another process commits a new version of row 1 (a plain connection: no activedb lock).
            with db.engine.begin() as connection:
                connection.execute(sa.text("UPDATE accounts SET balance = 15 WHERE id = 1"))
            assert tx.spawn(lambda child: child.read("accounts", 1)["balance"]).result(TIMEOUT) == 15
            sibling_committed.set()
            seen = first.result(TIMEOUT)
            tx.spawn(lambda child: child.write("accounts", 2, balance=seen + 100)).result(TIMEOUT)
    assert balances(db) == {1: 15, 2: 0}                     # nothing of the tree was written


@pytest.mark.parametrize("holds_a_lock", [False, True], ids=["holding-nothing", "holding-a-row"])
def test_d_a_node_whose_ancestor_aborted_waits_for_its_child_and_raises_activedbs_error(db, holds_a_lock):
    """With ``holding-a-row`` the child locked a row after spawning, so waiting first makes its holds
    retained — a lock-manager call that the ancestor's abort has already made impossible."""
    locks = db.transactions.locks
    child_started, child_may_wait, grandchild_may_end = threading.Event(), threading.Event(), threading.Event()
    seen: list[BaseException] = []

    def grandchild(g):
        assert grandchild_may_end.wait(TIMEOUT)

    def child(c):
        handle = c.spawn(grandchild)
        if holds_a_lock:
            c.read("accounts", 1)
        child_started.set()
        assert child_may_wait.wait(TIMEOUT)       # the root's abort has reached the lock manager
        try:
            handle.result(TIMEOUT)
        except BaseException as error:
            seen.append(error)
            raise

    def release_once_aborted(tid: str) -> None:
        testing.wait_until(lambda: not locks.is_active(tid), TIMEOUT, "the abort to reach the lock manager")
        child_may_wait.set()
        grandchild_may_end.set()

    with testing.Watchdog(30, locks):
        with pytest.raises(RuntimeError, match="the root aborts"):
            with db.transaction() as tx:
                handle = tx.spawn(child)
                assert child_started.wait(TIMEOUT)
                helper = threading.Thread(target=release_once_aborted, args=(handle.transaction.id,))
                helper.start()
                raise RuntimeError("the root aborts")  # abort() waits for the child, which waits for its own
        helper.join(TIMEOUT)
    assert len(seen) == 1 and isinstance(seen[0], activedb.TransactionAborted), seen
    assert balances(db) == {1: 10, 2: 0}


def test_e_a_scan_sees_a_row_another_process_was_inserting_during_the_flush(db, database_url):
    """Write skew through a phantom across processes: T1 scans ``items`` for notes 'p' (none) and
    writes row x; another process's T2 reads x and blindly inserts a row with note 'p'.  T2's flush is
    held after its insert, before COMMIT; T1 commits meanwhile.  Either order alone is fine, but T1 must
    not commit without T2's row when T2 read x before T1's write: T1's flush waits for T2 (the scanned
    table is locked before validation), sees the new row and fails with ``SerializationConflict``."""
    with db.engine.begin() as connection:
        connection.execute(sa.text("DELETE FROM items"))
        connection.execute(sa.text("INSERT INTO items (key, value, note) VALUES ('x', 0, 'q')"))
    other = activedb.connect(database_url)          # a second Database: another process's engine
    inserted, release = threading.Event(), threading.Event()

    class HoldBeforeCommit(activedb.CommitParticipant):
        def about_to_commit(self, transaction, connection):
            inserted.set()                          # T2's insert is applied, not committed
            release.wait(TIMEOUT * 3)

    outcome: dict[str, object] = {}

    def t1() -> None:
        try:
            with db.transaction() as tx:
                found = tx.scan("items", {"note": "p"})
                tx.write("items", "x", value=len(found))
                inserted.wait(TIMEOUT * 3)
            outcome["t1"] = "committed"
        except activedb.SerializationConflict as error:
            outcome["t1"] = error

    try:
        with testing.Watchdog(TIMEOUT * 6, db.transactions.locks):
            worker = threading.Thread(target=t1)
            with other.transaction(participants=[HoldBeforeCommit()]) as tx:
                tx.read("items", "x")
                tx.insert("items", key="r", value=1, note="p")
                worker.start()
                # leaving the block flushes T2 and holds it in about_to_commit; then T1 commits
                threading.Thread(target=_release_when_waiting, args=(db, worker, release), daemon=True).start()
            worker.join(TIMEOUT * 6)
    finally:
        release.set()
        other.close()
    assert isinstance(outcome.get("t1"), activedb.SerializationConflict), outcome
    with db.engine.connect() as connection:
        assert dict(connection.execute(sa.text("SELECT key, value FROM items")).all()) == {"x": 0, "r": 1}


def _release_when_waiting(db, worker: threading.Thread, release: threading.Event) -> None:
    """Let T2 commit once T1's flush waits in PostgreSQL for a lock (or T1 already ended)."""
    def t1_waits() -> bool:
        if not worker.is_alive():
            return True
        with db.engine.connect() as connection:
            return bool(connection.execute(sa.text(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock'")).scalar())
    testing.wait_until(t1_waits, TIMEOUT * 3, "T1's flush to wait for a lock")
    release.set()


def abort_the_root_in_the_window(db, body, in_window: threading.Event, before=None) -> list[BaseException]:
    """Spawn ``body`` as the root's child "worker" (after ``before(tx)``, if given) and abort the root (it
    raises) as soon as the worker is ``in_window``.  Returns the list of the errors ``body`` raises (it may
    still be running)."""
    seen: list[BaseException] = []

    def worker(child):
        try:
            body(child)
        except BaseException as error:
            seen.append(error)
            raise

    with testing.Watchdog(30, db.transactions.locks):
        with pytest.raises(RuntimeError, match="the root aborts"):
            with db.transaction() as tx:
                if before is not None:
                    before(tx)
                tx.spawn(worker, name="worker")
                assert in_window.wait(TIMEOUT)
                raise RuntimeError("the root aborts")
    return seen


def held_until_aborted(db, step, in_window: threading.Event):
    """``step(node)`` of the locking layer, held for the node named "worker" (after ``in_window`` is set)
    until the root's abort has reached the lock manager (the worker is no longer active there)."""
    def held(node):
        if node.name == "worker":
            in_window.set()
            testing.wait_until(lambda: not db.transactions.locks.is_active(node.id), TIMEOUT,
                               "the root's abort to reach the lock manager")
        step(node)
    return held


@pytest.mark.parametrize("representation", [representation.value for representation in Subtransactions])
def test_f_a_subtransaction_opened_as_an_ancestor_aborts_fails_with_activedbs_error(db, monkeypatch,
                                                                                   representation):
    """F. A worker opening ``with tx.subtransaction()`` under a node whose ancestor was aborting got the
    lock manager's raw ``TransactionAborted`` from the child's begin (found by the list-append history
    test).  The interleaving is forced at the one point between the node's own check and the child's
    registration: the node's holds becoming retained, held here until the root's abort reached the lock
    manager."""
    monkeypatch.setattr(db.transactions, "subtransactions", Subtransactions(representation))
    locking = db.transactions.locking
    in_window, child_started = threading.Event(), threading.Event()
    def worker(c):
        c.read("accounts", 2)      # the worker holds a lock: its holds become retained before the child begins
        child_started.set()
        with c.subtransaction() as inner:
            inner.read("accounts", 1)

    monkeypatch.setattr(locking, "release_holds", held_until_aborted(db, locking.release_holds, in_window))
    # in the window: the worker passed its check, not yet its child's begin
    seen = abort_the_root_in_the_window(db, worker, in_window)
    assert child_started.is_set()
    assert len(seen) == 1 and type(seen[0]) is activedb.TransactionAborted, seen
    assert balances(db) == {1: 10, 2: 0}


def test_g_a_scan_whose_ancestor_aborts_meanwhile_fails_instead_of_missing_the_ancestors_write(db, monkeypatch):
    """G. A node scanning a table while its ancestor aborted returned the committed rows without the
    ancestor's writes (they were discarded between the scan's table lock and the merge of the tree's
    writes), so the scan saw a state that never existed — a backward read the list-append history test
    found about once in six runs under load.  The interleaving is forced between the scan's table lock
    and the rest of the scan: the worker's lock request returns only once the root has aborted."""
    locking = db.transactions.locking
    acquire = locking.acquire
    in_window = threading.Event()
    scanned: list[list[dict]] = []
    root_box: list = []

    def held_until_aborted(node, info, key, mode):
        acquire(node, info, key, mode)
        if node.name == "worker" and key is None:
            in_window.set()
            testing.wait_until(lambda: root_box[0].state is activedb.TxnState.ABORTED, TIMEOUT,
                               "the root to abort")

    def root_writes(tx):
        root_box.append(tx)
        tx.write("accounts", 1, balance=99)

    monkeypatch.setattr(locking, "acquire", held_until_aborted)
    # in the window: the worker holds the table lock, not yet its rows
    seen = abort_the_root_in_the_window(db, lambda child: scanned.append(child.scan("accounts")), in_window,
                                        before=root_writes)
    testing.wait_until(lambda: seen or scanned, TIMEOUT, "the worker to finish its scan")
    assert scanned == [] and len(seen) == 1 and type(seen[0]) is activedb.TransactionAborted, (scanned, seen)
    assert balances(db) == {1: 10, 2: 0}


def test_h_a_child_whose_ancestor_aborts_during_its_commit_ends_aborted(db, monkeypatch):
    """H. Found by the list-append history test on a clean CI run (a node left "committing" after its
    top-level transaction ended).  The interleaving is forced at the one point between the child's
    delegation to its parent and its lock-manager commit: held there until the root's abort reached the
    lock manager."""
    locking = db.transactions.locking
    in_window = threading.Event()
    nodes: list = []

    def body(child):
        nodes.append(child)
        child.write("accounts", 2, balance=5)

    monkeypatch.setattr(locking, "commit", held_until_aborted(db, locking.commit, in_window))
    seen = abort_the_root_in_the_window(db, body, in_window)
    [worker] = nodes
    assert worker.state is activedb.TxnState.ABORTED, worker
    assert len(seen) == 0    # the body returned; the commit after it failed
    assert balances(db) == {1: 10, 2: 0}
