"""The figures of Concurrent Rule Execution §4.2 as scenarios (Figure 7: control spheres; Figure 8:
wait-for-commit edges; Figure 9: waits for held and for retained locks — described in docs/papers.md):
named steps, one session (thread) per transaction, run in an
explicit order, with the expected history -- which step completed, which blocked -- written out as in a
PostgreSQL isolation spec.  Driven by lockmgr.testing.Scenario (no sleeps; blocking is observed on the lock
manager)."""

from __future__ import annotations

from lockmgr import LockManager, Mode
from lockmgr.testing import Scenario

R, W = Mode.READ, Mode.WRITE


def edges_of(lm, kind):
    return {(waiter, target) for waiter, target, data in lm.wait_for_graph().edges(data=True) if data["kind"] == kind}


def test_figure_7_control_spheres():
    """Figure 7: Ti's sphere S_i holds Tj, Tk, Tl, Tm (Tj's sphere S_j holds Tl, Tm).

    (a) Ti retains WRITE on O_i and nobody inside S_i has a lock on it: every transaction of S_i may acquire
        READ or WRITE; transactions outside S_i may not.
    (b) Once Tj acquires WRITE on O_i, no other transaction -- not even those inside S_j -- may acquire it.
    """
    lm = LockManager()
    # Ti.0 is a child that wrote O_i and committed before the figure begins: that is how Ti retains WRITE.
    for tid, parent in (("Ti", None), ("Ti.0", "Ti"), ("Tj", "Ti"), ("Tk", "Ti"), ("Tl", "Tj"), ("Tm", "Tj"),
                        ("Outsider", None)):
        lm.begin(tid, parent)
    with Scenario(lm) as s:
        s.run("Ti.0", "Ti.0 writes O_i", lambda: lm.acquire("Ti.0", "O_i", W))
        s.run("Ti.0", "Ti.0 commits: Ti retains WRITE", lambda: lm.commit("Ti.0"))
        assert dict(lm.holders("O_i").retained) == {"Ti": W}
        outsider = s.run("Outsider", "Outsider reads O_i", lambda: lm.acquire("Outsider", "O_i", R), blocks=True)
        # (a) inside S_i: READ by several at once, then WRITE by one.
        s.run("Tl", "Tl reads O_i", lambda: lm.acquire("Tl", "O_i", R))
        s.run("Tk", "Tk reads O_i", lambda: lm.acquire("Tk", "O_i", R))
        assert dict(lm.holders("O_i").held) == {"Tl": R, "Tk": R}
        s.run("Tl", "Tl commits: Tj retains READ", lambda: lm.commit("Tl"))
        s.run("Tk", "Tk commits: Ti retains READ (joined into WRITE)", lambda: lm.commit("Tk"))
        s.run("Tm", "Tm writes O_i", lambda: lm.acquire("Tm", "O_i", W))
        s.run("Tm", "Tm commits: Tj retains WRITE", lambda: lm.commit("Tm"))
        # (b) Tj acquires WRITE: nobody else, inside S_j or not, may acquire O_i now.
        s.run("Tj", "Tj writes O_i", lambda: lm.acquire("Tj", "O_i", W))
        lm.begin("Tn", parent="Tj")  # a new member of S_j
        lm.begin("Tp", parent="Ti")  # a new member of S_i outside S_j
        assert not lm.try_acquire("Tn", "O_i", R)
        assert not lm.try_acquire("Tp", "O_i", R)
        assert not lm.try_acquire("Ti", "O_i", R)
        s.still_blocked(outsider)
        for tid in ("Tn", "Tp"):
            lm.commit(tid)
        s.run("Tj", "Tj commits: Ti retains WRITE", lambda: lm.commit("Tj"))
        s.run("Ti", "Ti commits (top level): releases O_i", lambda: lm.commit("Ti"))
        s.finish(outsider)
    assert s.history == [
        ("Ti.0", "Ti.0 writes O_i", "ok"),
        ("Ti.0", "Ti.0 commits: Ti retains WRITE", "ok"),
        ("Outsider", "Outsider reads O_i", "blocked"),
        ("Tl", "Tl reads O_i", "ok"),
        ("Tk", "Tk reads O_i", "ok"),
        ("Tl", "Tl commits: Tj retains READ", "ok"),
        ("Tk", "Tk commits: Ti retains READ (joined into WRITE)", "ok"),
        ("Tm", "Tm writes O_i", "ok"),
        ("Tm", "Tm commits: Tj retains WRITE", "ok"),
        ("Tj", "Tj writes O_i", "ok"),
        ("Tj", "Tj commits: Ti retains WRITE", "ok"),
        ("Ti", "Ti commits (top level): releases O_i", "ok"),
        ("Outsider", "Outsider reads O_i", "ok"),
    ]
    assert dict(lm.holders("O_i").held) == {"Outsider": R}


def test_figure_8_wait_for_commit_relations():
    """Figure 8: T spawns Ti and Tj, Ti spawns Tk and Tl, Tj spawns Tm.  Each parent has a wait-for-commit
    edge to each active child, and cannot commit before its children end."""
    from lockmgr import ActiveChildren

    lm = LockManager()
    for tid, parent in (("T", None), ("Ti", "T"), ("Tj", "T"), ("Tk", "Ti"), ("Tl", "Ti"), ("Tm", "Tj")):
        lm.begin(tid, parent)
    assert edges_of(lm, "commit") == {("T", "Ti"), ("T", "Tj"), ("Ti", "Tk"), ("Ti", "Tl"), ("Tj", "Tm")}
    with Scenario(lm) as s:
        s.run("T", "T tries to commit", lambda: lm.commit("T"), raises=ActiveChildren)
        s.run("Ti", "Ti tries to commit", lambda: lm.commit("Ti"), raises=ActiveChildren)
        s.run("Tk", "Tk commits", lambda: lm.commit("Tk"))
        s.run("Tl", "Tl aborts", lambda: lm.abort("Tl"))
        assert edges_of(lm, "commit") == {("T", "Ti"), ("T", "Tj"), ("Tj", "Tm")}
        s.run("Ti", "Ti commits", lambda: lm.commit("Ti"))
        s.run("Tm", "Tm commits", lambda: lm.commit("Tm"))
        s.run("Tj", "Tj commits", lambda: lm.commit("Tj"))
        assert edges_of(lm, "commit") == set()
        s.run("T", "T commits", lambda: lm.commit("T"))
    assert [outcome for _, _, outcome in s.history] == [
        "ActiveChildren", "ActiveChildren", "ok", "ok", "ok", "ok", "ok", "ok",
    ]


def test_figure_9_wait_for_held_then_retained_lock():
    """Figure 9: Tj (child of Tk) holds WRITE on Obj_i when Ti asks for WRITE: Ti waits for the held lock (a).
    Tj commits; its parent Tk inherits and retains the lock, and Ti now waits for the retained lock (b) --
    until the first common ancestor of Ti and Tj, the top-level T, inherits it."""
    lm = LockManager()
    for tid, parent in (("T", None), ("Tk", "T"), ("Tj", "Tk"), ("Ti", "T")):
        lm.begin(tid, parent)
    with Scenario(lm) as s:
        s.run("Tj", "Tj writes Obj_i", lambda: lm.acquire("Tj", "Obj_i", W))
        ti = s.run("Ti", "Ti asks to write Obj_i", lambda: lm.acquire("Ti", "Obj_i", W), blocks=True)
        # (a) before the commit of Tj
        assert edges_of(lm, "held") == {("Ti", "Tj")}
        s.run("Tj", "Tj commits: Tk retains WRITE", lambda: lm.commit("Tj"))
        # (b) after the commit of Tj: Ti still waits, now for Tk's retained lock
        s.still_blocked(ti)
        assert edges_of(lm, "held") == set() and edges_of(lm, "retained") == {("Ti", "Tk")}
        assert dict(lm.holders("Obj_i").retained) == {"Tk": W}
        s.run("Tk", "Tk commits: T, the first common ancestor, retains WRITE", lambda: lm.commit("Tk"))
        s.finish(ti)
        assert dict(lm.holders("Obj_i").held) == {"Ti": W} and dict(lm.holders("Obj_i").retained) == {"T": W}
        s.run("Ti", "Ti commits", lambda: lm.commit("Ti"))
        s.run("T", "T commits", lambda: lm.commit("T"))
    assert s.history == [
        ("Tj", "Tj writes Obj_i", "ok"),
        ("Ti", "Ti asks to write Obj_i", "blocked"),
        ("Tj", "Tj commits: Tk retains WRITE", "ok"),
        ("Tk", "Tk commits: T, the first common ancestor, retains WRITE", "ok"),
        ("Ti", "Ti asks to write Obj_i", "ok"),
        ("Ti", "Ti commits", "ok"),
        ("T", "T commits", "ok"),
    ]
    assert lm.statistics().locks == 0
