"""Lazily run subtransactions (savepoints): an embedder takes a child's locks in its parent's name, then
``drop_holds`` is the child's abort, ``retain`` its commit, and ``hand_down`` gives the child, once
registered, exactly the table it would have had (lockmgr/README.md §9)."""

from __future__ import annotations

from lockmgr import Mode
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
