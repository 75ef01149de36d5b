"""A thread that runs a spawned child it waits for keeps that wait's edge out of the lock manager until the
thread is about to block (txn README, "A helped child's wait edge, registered when needed";
``activedb/txn/_help_edges.py``).

The edge is not registered while the child runs unblocked, yet the pictures show it; it is registered before
the child's first lock wait, outermost first when children help children, so a deadlock through it is found
at the same edge with the same victim as when it was registered up front; and a parent's wait that closes a
cycle is the victim itself, its child going on.  Real PostgreSQL; no sleeps:
events and observable-state waits with generous bounds, under a watchdog.
"""

from __future__ import annotations

import threading

import pytest

import lockmgr
import activedb
from activedb import ActivedbError, DeadlockDetected
from lockmgr.testing import Watchdog, wait_until

BOUND = 60.0       # seconds: generous for a loaded machine


@pytest.fixture
def patient_pool(db):
    """A waker that does not act within a test: the child the parent runs stays on the parent's thread."""
    pool = db.transactions.pool
    before, pool.hand_off_after = pool.hand_off_after, 3600.0
    yield pool
    pool.hand_off_after = before


def _edges(db) -> set[tuple[str, str]]:
    return set(db.transactions.locks.wait_for_graph().edges())


def _tree_b(db, outcome: dict, b_holds_y: threading.Event, b_done: threading.Event) -> None:
    """Tree B: writes y, then x (waiting for A, which wrote it); its id and result into ``outcome``."""
    try:
        with db.transaction(name="B") as tx:
            outcome["B"] = tx.id
            tx.write("items", "y", value=2)
            b_holds_y.set()
            tx.write("items", "x", value=2)            # waits for A
        outcome["B result"] = "committed"
    except BaseException as error:                      # reported by the test
        outcome["B result"] = error
    finally:
        b_done.set()


def _with_b_waiting_for_x(db, tx, outcome: dict, b_done: threading.Event) -> threading.Thread:
    """In tree A (``tx``): write x, start tree B (:func:`_tree_b`) and return its thread once B waits for x."""
    outcome["A"] = tx.id
    tx.write("items", "x", value=1)
    b_holds_y = threading.Event()
    thread = threading.Thread(target=_tree_b, args=(db, outcome, b_holds_y, b_done))
    thread.start()
    assert b_holds_y.wait(BOUND)
    wait_until(lambda: db.transactions.locks.statistics().waiting == 1, BOUND, "B never waited for x")
    return thread


def test_a_helped_child_that_does_not_block_registers_no_wait_but_the_picture_shows_it(db, patient_pool):
    seen = {}

    def child(tx):
        parent = tx.parent
        seen["thread"] = threading.get_ident()
        seen["registered"] = (parent.id, tx.id) in _edges(db)
        seen["pictured"] = db.transactions.lock_snapshot().waits.get(parent.id, {}).get(tx.id)
        tx.write("items", "helped", value=1)

    with Watchdog(BOUND, db.transactions.locks):
        with db.transaction() as tx:
            tx.spawn(child).result()
    assert seen["thread"] == threading.get_ident()         # run by the waiting parent's thread
    assert seen["registered"] is False
    assert seen["pictured"] == ("commit", None)
    with db.transaction() as tx:
        assert tx.read("items", "helped")["value"] == 1


def test_a_deadlock_through_a_helped_child_is_found_with_the_same_victim(db, patient_pool):
    """Tree A writes x; tree B writes y and waits for x (B -> A); A's child, run by A's thread, asks for y:
    A's edge to the child is registered before the child's wait, which closes the cycle child -> B -> A ->
    child — the child, the requester, is the victim, as when A's wait was registered before the child ran."""
    b_done, outcome = threading.Event(), {}

    def child(tx):
        outcome["child"] = tx.id
        tx.write("items", "y", value=1)

    with Watchdog(BOUND, db.transactions.locks):
        with pytest.raises(DeadlockDetected) as raised:
            with db.transaction(name="A") as tx:
                thread = _with_b_waiting_for_x(db, tx, outcome, b_done)
                tx.spawn(child).result()
        assert b_done.wait(BOUND)
        thread.join(BOUND)
    error = raised.value
    assert isinstance(error, ActivedbError) and isinstance(error, lockmgr.Deadlock)   # activedb's, and lockmgr's
    assert "run its work again" in str(error) and "lm.abort" not in str(error)
    assert error.victim == outcome["child"]
    cycle = {(edge.waiter, edge.target): edge.kind for edge in error.cycle}
    assert cycle[(outcome["A"], outcome["child"])] == "commit"
    assert (outcome["child"], outcome["B"]) in cycle and (outcome["B"], outcome["A"]) in cycle
    assert outcome["B result"] == "committed"
    with db.transaction() as tx:
        assert tx.read("items", "x")["value"] == 2 and tx.read("items", "y")["value"] == 2


def test_children_helping_children_register_their_edges_outermost_first_when_the_innermost_blocks(
        db, patient_pool):
    """A runs its child C, which runs its child G; G waits for a row tree B holds: A -> C and C -> G are
    registered, with G's wait, while G waits; none of them once it got the row."""
    holding, release, waiting = threading.Event(), threading.Event(), {}

    def tree_b():
        with db.transaction(name="B") as tx:
            tx.write("items", "blocked", value=0)
            holding.set()
            assert release.wait(BOUND)

    def grandchild(tx):
        waiting["G"] = tx.id
        tx.write("items", "blocked", value=1)       # waits for B

    def child(tx):
        waiting["C"] = tx.id
        tx.spawn(grandchild).result()

    with Watchdog(BOUND, db.transactions.locks):
        thread = threading.Thread(target=tree_b)
        thread.start()
        assert holding.wait(BOUND)
        with db.transaction(name="A") as tx:
            waiting["A"] = tx.id
            helper = threading.Thread(target=lambda: (
                wait_until(lambda: db.transactions.locks.statistics().waiting == 1, BOUND, "G never waited"),
                waiting.setdefault("edges", _edges(db)), release.set()))
            helper.start()
            tx.spawn(child).result()
            helper.join(BOUND)
            after = _edges(db)
        thread.join(BOUND)
    assert {(waiting["A"], waiting["C"]), (waiting["C"], waiting["G"])} <= waiting["edges"]
    assert (waiting["A"], waiting["C"]) not in after and (waiting["C"], waiting["G"]) not in after
    with db.transaction() as tx:
        assert tx.read("items", "blocked")["value"] == 1


def test_a_parents_wait_that_is_the_victim_raises_and_the_child_goes_on(db):
    """Tree A writes x and spawns child C on a worker (``eager``); tree B writes y and waits for x (B -> A); C asks
    for y (C -> B).  A's ``handle.result()`` adds A -> C, which closes the cycle: A's wait is the victim and raises
    ``DeadlockDetected`` while C, still waiting, stays active (``handle.state``: the documented way to tell a
    refused wait from the child's own abort).  A then gives up: C aborts with it, B commits."""
    b_done, outcome = threading.Event(), {}

    def child(tx):
        tx.write("items", "y", value=1)                    # waits for B

    class GiveUp(Exception):
        pass

    locks = db.transactions.locks
    with Watchdog(BOUND, locks):
        with pytest.raises(GiveUp):
            with db.transaction(name="A") as tx:
                thread = _with_b_waiting_for_x(db, tx, outcome, b_done)
                handle = tx.spawn(child, eager=True)
                wait_until(lambda: locks.statistics().waiting == 2, BOUND, "the child never waited for y")
                with pytest.raises(DeadlockDetected) as raised:
                    handle.result(BOUND)
                outcome["state after the refused wait"] = handle.state
                raise GiveUp()
        assert b_done.wait(BOUND)
        thread.join(BOUND)
    error = raised.value
    assert error.victim == outcome["A"]
    assert {(edge.waiter, edge.target) for edge in error.cycle} == {
        (outcome["A"], handle.transaction.id), (handle.transaction.id, outcome["B"]), (outcome["B"], outcome["A"])}
    assert outcome["state after the refused wait"] is activedb.TxnState.ACTIVE
    assert handle.state is activedb.TxnState.ABORTED
    assert outcome["B result"] == "committed"
    with db.transaction() as tx:
        assert tx.read("items", "x")["value"] == 2 and tx.read("items", "y")["value"] == 2
