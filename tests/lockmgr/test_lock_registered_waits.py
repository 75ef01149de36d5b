"""Registered waits (``LockManager.add_wait``): waits that are not lock waits join the one wait-for graph.

A cycle through any mix of lock waits and registered waits is found when its last edge is added; the
victim is told (a lock waiter's ``acquire`` raises, a registered waiter's ``on_victim`` is called, the
adder of the closing edge gets ``Deadlock`` from ``add_wait``); a waiter that volunteers is chosen first.
"""

from __future__ import annotations

import threading

import pytest

from lockmgr import Deadlock, LockManager, Mode, WaitForItself
from lockmgr.testing import wait_until
from tests.lockmgr._trees import manager


def test_a_registered_wait_closing_a_cycle_with_a_lock_wait_raises_for_its_adder():
    lm = manager("A", "B")
    lm.acquire("A", "x", Mode.WRITE)
    errors = []
    waiter = threading.Thread(target=lambda: _acquire_or_record(lm, "B", "x", errors))
    waiter.start()
    wait_until(lambda: lm.statistics().waiting == 1)
    with pytest.raises(Deadlock) as raised:          # A waits for B (e.g. B's commit): A -> B -> A
        lm.add_wait("A", ["B"], kind="dependency")
    assert [edge.kind for edge in raised.value.cycle] == ["dependency", "held"]
    assert lm.statistics().registered_waits == 0
    lm.abort("A")
    waiter.join(5)
    assert errors == [] and lm.holders("x").held == {"B": Mode.WRITE}


def test_a_lock_wait_closing_a_cycle_through_a_registered_wait_picks_the_volunteer():
    lm = manager("T")
    lm.begin("T.1", parent="T")                      # the trigger's subtransaction
    lm.begin("D")                                    # a dependent (a detached rule's transaction)
    lm.acquire("D", "row", Mode.WRITE)
    told = threading.Event()
    notices = []

    def on_victim(error):
        notices.append(error)
        told.set()

    wait = lm.add_wait("D", ["T"], kind="dependency", on_victim=on_victim, preferred_victim=True)
    errors = []
    trigger = threading.Thread(target=lambda: _acquire_or_record(lm, "T.1", "row", errors))
    trigger.start()                                  # T.1 -> D (held) -> T (dependency) -> T.1 (commit)
    assert told.wait(5)
    assert wait.cancelled and isinstance(notices[0], Deadlock) and notices[0].victim == "D"
    assert "volunteered" in str(notices[0])
    lm.abort("D")                                    # the dependent gives way: the trigger gets the row
    trigger.join(5)
    assert errors == [] and lm.holders("row").held == {"T.1": Mode.WRITE}


def test_released_waits_leave_no_edge_and_ended_targets_add_none():
    lm = manager("A", "B")
    with lm.add_wait("A", ["B", "nobody"], kind="nested") as wait:
        assert lm.statistics().registered_waits == 1
        assert [(a, b, data["kind"]) for a, b, data in lm.wait_for_graph().edges(data=True)] == [("A", "B", "nested")]
        assert lm.snapshot().waits["A"] == {"B": ("nested", None)}
    assert wait.status.value == "granted" and lm.statistics().registered_waits == 0
    assert list(lm.wait_for_graph().edges) == []
    lm.commit("B")
    assert lm.add_wait("A", ["B"]).targets == {}     # B ended: nothing to wait for


@pytest.mark.parametrize("targets", ["T.1", b"T.1"])
def test_one_target_given_as_a_text_is_refused_not_read_letter_by_letter(targets):
    """add_wait("B", "T.1") iterated the text: it registered B -> T (the letter 'T' is an active transaction), an
    edge to T.1's parent instead of T.1, and none at all for a tid none of whose letters is one — a cycle through
    the wait then went unseen.  It is a TypeError saying to write [tid], and nothing is registered."""
    lm = manager("T", "B")
    lm.begin("T.1", parent="T")
    with pytest.raises(TypeError, match=r"targets.*\[" + repr(targets).replace(".", r"\.") + r"\]"):
        lm.add_wait("B", targets, kind="dependency")
    assert lm.statistics().registered_waits == 0
    assert not lm.wait_for_graph().has_edge("B", "T")
    with lm.add_wait("B", ["T.1"], kind="dependency"):
        assert lm.wait_for_graph().has_edge("B", "T.1") and lm.statistics().registered_waits == 1


def test_a_waiter_that_cannot_be_told_is_never_chosen():
    lm = manager("A", "B")
    lm.acquire("B", "x", Mode.WRITE)
    lm.add_wait("B", ["A"], kind="nested")           # no on_victim: B's thread cannot be interrupted
    with pytest.raises(Deadlock) as raised:          # so the lock waiter that closes the cycle is the victim
        lm.acquire("A", "x", Mode.WRITE)
    assert raised.value.victim == "A"


def test_abort_drops_the_registered_waits_of_the_aborted():
    lm = manager("A", "B")
    lm.add_wait("A", ["B"])
    lm.abort("A")
    assert lm.statistics().registered_waits == 0


def _acquire_or_record(lm, tid, resource, errors):
    try:
        lm.acquire(tid, resource, Mode.WRITE, timeout=10)
    except Exception as error:  # recorded for the test to assert on
        errors.append(error)


def test_retain_turns_holds_into_retains_in_place_and_lets_descendants_in():
    lm = manager("P", commit_edges="declared")
    lm.acquire("P", "row", Mode.WRITE)
    lm.begin("P.1", parent="P")                      # a spawned child: the parent does not wait for it yet
    errors = []
    child = threading.Thread(target=lambda: _acquire_or_record(lm, "P.1", "row", errors))
    child.start()
    wait_until(lambda: lm.statistics().waiting == 1)  # a wait, not a deadlock: nobody waits for P.1 yet
    assert lm.holders("row").held == {"P": Mode.WRITE}
    lm.retain("P")                                   # P is about to wait for its child
    child.join(5)
    assert errors == []
    holders = lm.holders("row")
    assert holders.held == {"P.1": Mode.WRITE} and holders.retained == {"P": Mode.WRITE}
    lm.begin("Q")                                    # an outsider is still kept away by the retained lock
    assert not lm.try_acquire("Q", "row", Mode.READ)


def test_declared_commit_edges_count_while_the_parent_waits_or_for_an_inline_child():
    lm = manager("P", "X", commit_edges="declared")
    lm.acquire("X", "row", Mode.WRITE)
    lm.begin("P.1", parent="P", awaited=True)        # inline: P waits for it all its life
    lm.acquire("P", "other", Mode.WRITE)
    lm.retain("P")
    lm.add_wait("P.1", ["X"], kind="nested")         # P.1's thread is blocked inside X
    with pytest.raises(Deadlock) as raised:          # X -> P (retained) -> P.1 (commit, inline) -> X
        lm.acquire("X", "other", Mode.WRITE)
    assert [edge.kind for edge in raised.value.cycle] == ["retained", "commit", "nested"]
    lm.begin("S")
    lm.begin("S.1", parent="S")                      # spawned: S does not wait for it yet
    lm.acquire("S", "s-row", Mode.WRITE)
    lm.begin("Y")
    lm.add_wait("S.1", ["Y"], kind="nested")         # S.1's thread is blocked inside Y
    with pytest.raises(Deadlock) as raised:          # only once S waits for S.1 is the cycle there
        with lm.add_wait("S", ["S.1"], kind="commit"):
            lm.acquire("Y", "s-row", Mode.WRITE)     # Y -> S (held) -> S.1 (commit) -> Y (nested)
    assert [edge.kind for edge in raised.value.cycle] == ["held", "commit", "nested"]
    lm.begin("Z")
    errors = []
    waiter = threading.Thread(target=lambda: _acquire_or_record(lm, "Z", "s-row", errors))
    waiter.start()                                   # without S's wait for S.1: Z simply waits for S
    wait_until(lambda: lm.statistics().waiting == 1)
    lm.commit("S.1")
    lm.commit("S")
    waiter.join(5)
    assert errors == []


def test_a_snapshot_has_the_declared_commit_edges_the_wait_for_graph_has():
    """With ``commit_edges="declared"`` a parent's edge to a child begun ``awaited=True`` (an inline child, a taken-over
    group's member on a thread) is in ``wait_for_graph()`` but was not in ``snapshot().waits`` — whose docstring said
    commit edges are every parent -> child pair, true only of structural edges — so ``db.explain()``, built from the
    snapshot, showed a group's owner waiting for its members on threads as waiting for nothing.  The snapshot's waits
    are now the graph's edges, less the structural ones (every pair, so implied by the tree)."""
    lm = manager("P", "X", commit_edges="declared")
    lm.begin("P.1", parent="P", awaited=True)        # P waits for it all its life
    lm.begin("P.2", parent="P")                      # spawned: no wait until P registers one
    lm.add_wait("P.2", ["X"], kind="nested")
    snapshot = lm.snapshot()
    graph = {(waiter, target): (data["kind"], data.get("resource"))
             for waiter, target, data in lm.wait_for_graph().edges(data=True)}
    assert snapshot.waits["P"] == {"P.1": ("commit", None)}
    assert {(waiter, target): edge for waiter, edges in snapshot.waits.items()
            for target, edge in edges.items()} == graph
    structural = manager("P", commit_edges="structural")
    structural.begin("P.1", parent="P", awaited=True)
    assert structural.snapshot().waits == {}         # every parent -> active child: implied by the tree


def test_before_wait_is_called_on_the_requesting_thread_before_a_request_that_may_wait_and_only_then():
    """``LockManager(before_wait=...)``: not for a grant the uncontended path makes; before a request that
    waits, on the requester's thread, where a wait it registers is part of the graph that request's edge
    closes a cycle in (the embedder's late registration, README §8)."""
    called: list[tuple[object, int]] = []

    def before_wait(tid):
        called.append((tid, threading.get_ident()))
        if tid == "A":
            lm.add_wait("B", ["A"], kind="commit")      # registered late: B waits for A

    lm = LockManager(before_wait=before_wait)
    for tid in ("A", "B"):
        lm.begin(tid)
    lm.acquire("A", "free", Mode.WRITE)                 # uncontended: not called
    lm.acquire("B", "x", Mode.WRITE)
    assert called == []
    with pytest.raises(Deadlock) as raised:             # A -> B (held) closes A -> B -> A with B's late wait
        lm.acquire("A", "x", Mode.WRITE)
    assert called == [("A", threading.get_ident())]
    assert raised.value.victim == "A" and {edge.kind for edge in raised.value.cycle} == {"held", "commit"}


@pytest.mark.parametrize("before_wait", [5, "register"])
def test_a_before_wait_that_is_not_callable_is_refused_when_the_manager_is_made(before_wait):
    """LockManager(before_wait=5) was taken, and every lock request the uncontended path could not grant then failed
    with "'int' object is not callable" — an error far from its cause, at the first contention; it is a TypeError
    naming the argument at once."""
    with pytest.raises(TypeError, match=r"before_wait.*callable"):
        LockManager(before_wait=before_wait)


@pytest.mark.parametrize("targets", [["A"], ["B", "A"]])
def test_a_wait_of_a_transaction_for_itself_is_refused_and_registers_nothing(targets):
    """A waiter among its own targets would wait for ever (it ends only after its wait): ``WaitForItself`` naming it
    and the wait's kind, nothing registered.  Before, the edge to itself was dropped and the wait returned as granted
    (or with the other edges only), so its caller waited for itself."""
    lm = manager("A", "B")
    with pytest.raises(WaitForItself, match=r"transaction 'A' cannot wait \(children\) for itself") as raised:
        lm.add_wait("A", targets, kind="children")
    assert raised.value.tid == "A" and lm.statistics().registered_waits == 0
    assert list(lm.wait_for_graph().edges) == []


@pytest.mark.parametrize("value", ["no", "False", 1, 0, None])
def test_a_preferred_victim_that_is_no_bool_is_refused(value):
    """``preferred_victim`` takes True or False: 'no' (or 1) was read by its truth value and volunteered the waiter as
    the victim of any cycle through it, 0 and None declined by accident.  Refused before anything is registered."""
    lm = manager("A", "B")
    with pytest.raises(TypeError, match=rf"add_wait\(preferred_victim={value!r}\) takes True or False"):
        lm.add_wait("A", ["B"], kind="dependency", preferred_victim=value)
    assert lm.statistics().registered_waits == 0


@pytest.mark.parametrize("value", ["no", 1, None])
def test_a_snapshot_on_deadlock_that_is_no_bool_is_refused(value):
    """``LockManager(snapshot_on_deadlock='no')`` took a full snapshot at every deadlock (a truthy text), None and 0
    none by accident: the switch takes True or False."""
    with pytest.raises(TypeError, match=rf"LockManager\(snapshot_on_deadlock={value!r}\) takes True or False"):
        LockManager(snapshot_on_deadlock=value)
