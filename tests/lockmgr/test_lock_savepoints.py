"""Lazily run subtransactions (savepoints): an embedder takes a child's locks in its parent's name, then
``drop_holds`` is the child's abort, ``retain`` its commit, and ``hand_down`` gives the child, once
registered, exactly the table it would have had (lockmgr/README.md §9)."""

from __future__ import annotations

import pytest

from lockmgr import UNCHANGED, Mode
from lockmgr.testing import Scenario
from tests.lockmgr._trees import held, manager, retained

R, W, IW = Mode.READ, Mode.WRITE, Mode.IW


def test_drop_holds_releases_what_the_savepoint_took_and_keeps_the_parents_retains():
    lm = manager("P", commit_edges="declared")
    lm.acquire("P", "x", R)
    lm.retain("P")                                   # the parent's own lock, before the savepoint
    assert lm.try_acquire("P", "x", W) and lm.try_acquire_tuple("P", "t", 1, W)   # the savepoint's
    lm.drop_holds("P")                               # the savepoint aborts (Rule 4 for it)
    assert held(lm, "x") == {} and retained(lm, "x") == {"P": R}
    assert held(lm, ("t", 1)) == {} and held(lm, "t") == {}
    lm.begin("Q")
    assert lm.try_acquire("Q", ("t", 1), W) and not lm.try_acquire("Q", "x", W)
    lm.commit("Q")
    lm.commit("P")


def test_hand_down_moves_the_holds_and_the_wait_edges_to_the_child():
    lm = manager("P", "Q", commit_edges="declared")
    assert lm.try_acquire("P", "x", W)               # taken by P's lazily run child
    with Scenario(lm) as scenario:
        waiting = scenario.run("q", "Q wants x", lambda: lm.acquire("Q", "x", R), blocks=True)
        assert ("Q", "P", {"kind": "held", "resource": "x"}) in lm.wait_for_graph().edges(data=True)
        lm.begin("P.1", parent="P", awaited=True)
        lm.hand_down("P", "P.1")
        assert held(lm, "x") == {"P.1": W} and retained(lm, "x") == {}
        assert ("Q", "P.1", {"kind": "held", "resource": "x"}) in lm.wait_for_graph().edges(data=True)
        scenario.still_blocked(waiting)
        scenario.run("p", "P.1 aborts", lambda: lm.abort("P.1"))   # its lock goes with it: Q is granted
        scenario.finish(waiting)
    assert held(lm, "x") == {"Q": R}
    lm.commit("Q")
    lm.commit("P")


# --- grants retained at once (try_retain): the savepoint's commit costs nothing ---------------------------------

def test_try_retain_grants_as_the_parents_retain_and_records_what_it_changed():
    lm = manager("P", "Q", commit_edges="declared")
    lm.acquire("P", "x", R)
    lm.retain("P")                                   # the parent's own lock, before the savepoint
    grants: list = []
    assert lm.try_retain("P", "x", R, grants)        # covered by what P retains: nothing changes
    assert lm.try_retain("P", "x", W, grants) and lm.try_retain("P", "y", W, grants)
    assert grants == [("x", R, UNCHANGED), ("x", W, R), ("y", W, None)]
    assert held(lm, "x") == {} and retained(lm, "x") == {"P": W} and retained(lm, "y") == {"P": W}
    assert not lm.try_retain("Q", "y", R, [])        # another tree: refused, as against S's hold
    lm.begin("P.2", parent="P")                      # (after S committed) a descendant may have it
    assert lm.try_acquire("P.2", "y", W)
    lm.commit("P.2")
    lm.commit("P")
    assert lm.try_acquire("Q", "y", W)


def test_try_retain_refuses_behind_a_waiter_and_for_a_conflicting_holder():
    lm = manager("P", "Q", "Z", commit_edges="declared")
    assert lm.try_acquire("Q", "x", R)
    assert not lm.try_retain("P", "x", W, grants := [])
    assert grants == []
    with Scenario(lm) as scenario:
        waiting = scenario.run("z", "Z wants x", lambda: lm.acquire("Z", "x", W), blocks=True)
        assert not lm.try_retain("P", "x", R, [])    # compatible with Q, but Z queued first
        scenario.run("q", "Q commits", lambda: lm.commit("Q"))
        scenario.finish(waiting)
    lm.commit("Z")
    lm.commit("P")


def test_undo_retains_restores_what_the_parent_retained_and_admits_waiters():
    lm = manager("P", "Q", commit_edges="declared")
    lm.acquire("P", "x", R)
    lm.retain("P")
    grants: list = []
    assert lm.try_retain("P", "x", W, grants)
    assert lm.try_retain("P", ("table", "t"), IW, grants) and lm.try_retain("P", ("t", 1), W, grants)
    with Scenario(lm) as scenario:
        waiting = scenario.run("q", "Q wants (t, 1)", lambda: lm.acquire("Q", ("t", 1), R), blocks=True)
        scenario.run("p", "the savepoint aborts", lambda: lm.undo_retains("P", grants))
        scenario.finish(waiting)
    assert retained(lm, "x") == {"P": R} and retained(lm, ("table", "t")) == {}
    assert held(lm, ("t", 1)) == {"Q": R}
    lm.commit("Q")
    lm.commit("P")


def test_hand_down_retains_gives_the_child_its_grants_and_the_wait_edges():
    lm = manager("P", "Q", commit_edges="declared")
    lm.acquire("P", "x", R)
    lm.retain("P")
    grants: list = []
    assert lm.try_retain("P", "x", R, grants) and lm.try_retain("P", "x", W, grants)
    assert lm.try_retain("P", "y", W, grants)
    with Scenario(lm) as scenario:
        waiting = scenario.run("q", "Q wants y", lambda: lm.acquire("Q", "y", R), blocks=True)
        assert ("Q", "P", {"kind": "retained", "resource": "y"}) in lm.wait_for_graph().edges(data=True)
        lm.begin("P.1", parent="P", awaited=True)
        lm.hand_down_retains("P", "P.1", grants)
        assert held(lm, "x") == {"P.1": W} and retained(lm, "x") == {"P": R}
        assert held(lm, "y") == {"P.1": W} and retained(lm, "y") == {}
        assert ("Q", "P.1", {"kind": "held", "resource": "y"}) in lm.wait_for_graph().edges(data=True)
        scenario.still_blocked(waiting)
        scenario.run("p", "P.1 aborts", lambda: lm.abort("P.1"))
        scenario.finish(waiting)
    assert held(lm, "y") == {"Q": R} and retained(lm, "x") == {"P": R}
    lm.commit("Q")
    lm.commit("P")


def test_hand_down_retains_to_a_savepoints_savepoint_newest_first_held_and_retained():
    """A savepoint S1 of P opens one of its own, S2; both took their locks as P's retains.  Handed down newest
    first — S2's grants as held, S1's as retained (S1 waits for S2) — each restores P's entries to what they
    were before its grants: P keeps its own READ, S1 retains what it took, S2 holds what it took."""
    lm = manager("P", "Q", commit_edges="declared")
    lm.acquire("P", "x", R)
    lm.retain("P")
    first: list = []
    assert lm.try_retain("P", "x", W, first) and lm.try_retain("P", "y", R, first)     # S1's
    second: list = []
    assert lm.try_retain("P", "y", W, second) and lm.try_retain("P", "z", W, second)   # S2's
    lm.begin("P.1", parent="P", awaited=True)
    lm.begin("P.1.2", parent="P.1", awaited=True)
    with pytest.raises(ValueError):
        lm.hand_down_retains("P.1.2", "P.1", second)       # not a descendant
    lm.hand_down_retains("P", "P.1.2", second)
    lm.hand_down_retains("P", "P.1", first, retained=True)
    assert held(lm, "x") == {} and retained(lm, "x") == {"P": R, "P.1": W}
    assert held(lm, "y") == {"P.1.2": W} and retained(lm, "y") == {"P.1": R}
    assert held(lm, "z") == {"P.1.2": W} and retained(lm, "z") == {}
    assert not lm.try_acquire("Q", "y", R)                 # S2's WRITE keeps the other tree out
    lm.abort("P.1.2")                                      # Rule 4 for S2: S1's retains stay
    assert retained(lm, "y") == {"P.1": R} and held(lm, "z") == {}
    lm.commit("P.1")                                       # Rule 2: P retains what S1 retained
    assert lm.try_acquire("Q", "z", W) and not lm.try_acquire("Q", "x", R)
    lm.commit("Q")
    lm.commit("P")
