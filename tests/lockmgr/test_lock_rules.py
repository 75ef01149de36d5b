"""Härder–Rothermel Rules 1–5 (Concurrent Rule Execution §3.1), one test per rule, plus the lock modes.

Single-threaded where the rule can be shown with ``try_acquire``; threads (driven by lockmgr.testing's
Scenario, never by sleeping) where a waiter must be woken.
"""

from __future__ import annotations

import itertools

import pytest

from lockmgr import LockTimeout, Mode, conflicts, covers, join
from lockmgr.testing import Scenario
from tests.lockmgr._trees import commits, held, manager, retained

IR, IW, R, U, RIW, W = Mode.IR, Mode.IW, Mode.READ, Mode.UPDATE, Mode.RIW, Mode.WRITE


# ---------------------------------------------------------------- the one conflict table


def test_conflict_table_is_the_multigranularity_matrix():
    expected_compatible = {
        IR: {IR, IW, R, U, RIW},
        IW: {IR, IW},
        R: {IR, R, U},
        U: {IR, R},
        RIW: {IR},
        W: set(),
    }
    for held_mode, wanted in itertools.product(Mode, Mode):
        assert conflicts(held_mode, wanted) == (wanted not in expected_compatible[held_mode])
        assert conflicts(held_mode, wanted) == conflicts(wanted, held_mode)


def test_join_and_covers_form_the_lattice():
    assert join(R, IW) is RIW and join(IR, IW) is IW and join(RIW, W) is W and join(R, R) is R
    assert covers(W, R) and covers(RIW, IW) and covers(RIW, R) and not covers(R, IW) and not covers(IW, R)
    assert join(R, U) is U and join(U, W) is W and join(U, IW) is RIW and covers(U, R) and not covers(U, IW)
    for a, b in itertools.product(Mode, Mode):
        upper = join(a, b)
        assert covers(upper, a) and covers(upper, b)


def test_two_read_modify_writes_with_update_locks_queue_instead_of_deadlocking():
    """The conversion deadlock the update mode exists for: with READ, both readers then both want WRITE
    (a cycle); with UPDATE the second waits at its read, and the first converts to WRITE while a plain
    reader still reads."""
    lm = manager("A", "B", "C")
    lm.acquire("A", "counter", U)
    assert not lm.try_acquire("B", "counter", U)          # the second updater waits at its read
    assert lm.try_acquire("C", "counter", R)              # readers are still admitted
    lm.commit("C")
    lm.acquire("A", "counter", W)                         # conversion: no other updater holds it
    lm.commit("A")
    assert lm.try_acquire("B", "counter", U)
    lm.commit("B")


# ---------------------------------------------------------------- Rule 1


def test_rule1_no_other_transaction_may_hold_a_conflicting_mode():
    lm = manager("A", "B")
    lm.acquire("A", "x", R)
    assert lm.try_acquire("B", "x", R), "READ is shared"
    assert not lm.try_acquire("B", "x", W), "WRITE conflicts with A's READ"
    lm.acquire("A", "y", W)
    assert not lm.try_acquire("B", "y", R)
    # "Held" binds the holder's own descendants too: only a retained lock is usable inside the sphere.
    lm.begin("A.1", parent="A")
    assert not lm.try_acquire("A.1", "y", R)
    assert held(lm, "y") == {"A": W}


def test_rule1_retainers_in_conflicting_mode_must_be_ancestors():
    lm = manager("T", "T.1", "T.2", "U")
    lm.acquire("T.1", "x", W)
    lm.commit("T.1")  # T now retains WRITE on x
    assert retained(lm, "x") == {"T": W}
    assert not lm.try_acquire("U", "x", R), "an outsider is kept out by T's retained WRITE"
    assert lm.try_acquire("T.2", "x", W), "a descendant of the retainer may acquire"
    lm.begin("T.2.1", parent="T.2")
    assert not lm.try_acquire("T.2.1", "x", R), "...but now T.2 holds it"
    assert not lm.try_acquire("T", "x", R), "T.2 holds WRITE now: not even the retainer may read it"


def test_rule1_a_retainer_uses_its_own_retained_lock():
    lm = manager("T", "T.1")
    lm.acquire("T.1", "x", W)
    lm.commit("T.1")
    assert lm.try_acquire("T", "x", W)
    assert held(lm, "x") == {"T": W} and retained(lm, "x") == {"T": W}


def test_rule1_upgrade_read_to_write():
    lm = manager("A", "B")
    lm.acquire("A", "x", R)
    lm.acquire("A", "x", W)  # alone: the upgrade is granted at once
    assert held(lm, "x") == {"A": W}
    lm.acquire("A", "x", R)  # already covered: a no-op
    assert held(lm, "x") == {"A": W}
    lm.acquire("B", "y", R)
    lm.acquire("A", "y", R)
    assert not lm.try_acquire("A", "y", W), "B's READ blocks A's upgrade"
    assert held(lm, "y") == {"A": R, "B": R}
    lm.acquire("A", "t", IW)
    lm.acquire("A", "t", R)
    assert held(lm, "t") == {"A": RIW}, "IW + READ is RIW (SIX)"


# Rule 1's conversion deadlock (two readers both upgrading) is a case of test_lock_deadlocks'
# test_two_transactions_waiting_for_each_other_is_a_deadlock_and_only_the_victim_is_told.


# ---------------------------------------------------------------- Rule 2


def test_rule2_parent_inherits_held_and_retained_locks_and_retains_them_in_the_same_modes():
    lm = manager("T", "T.1", "T.1.1")
    lm.acquire("T.1.1", "y", R)
    lm.commit("T.1.1")  # T.1 retains READ on y
    lm.acquire("T.1", "x", W)
    assert retained(lm, "y") == {"T.1": R}
    lm.commit("T.1")
    assert held(lm, "x") == {} and retained(lm, "x") == {"T": W}, "held WRITE becomes retained WRITE"
    assert retained(lm, "y") == {"T": R}, "retained READ stays retained READ, one level up"
    assert lm.statistics().inherited >= 2


def test_rule2_inherited_mode_joins_what_the_parent_already_retains():
    lm = manager("T", "T.1", "T.2")
    lm.acquire("T.1", "t", IW)
    lm.commit("T.1")
    lm.acquire("T.2", "t", R)
    lm.commit("T.2")
    assert retained(lm, "t") == {"T": RIW}


def test_rule2_inheritance_wakes_a_waiter_whose_common_ancestor_inherits():
    lm = manager("T", "T.1", "T.2")
    lm.acquire("T.1", "x", W)
    with Scenario(lm) as scenario:
        waiting = scenario.run("s2", "T.2 reads x", lambda: lm.acquire("T.2", "x", R), blocks=True)
        edges = lm.wait_for_graph().edges(data=True)
        assert ("T.2", "T.1", {"kind": "held", "resource": "x"}) in edges
        commits(scenario, "T.1", waiting)
    assert held(lm, "x") == {"T.2": R} and retained(lm, "x") == {"T": W}


def test_committing_with_active_children_is_refused():
    from lockmgr import ActiveChildren

    lm = manager("T", "T.1")
    with pytest.raises(ActiveChildren, match="children 'T.1' are still active"):
        lm.commit("T")
    lm.commit("T.1")
    lm.commit("T")
    assert lm.statistics().transactions == 0


# ---------------------------------------------------------------- Rule 3


def test_rule3_top_level_commit_releases_everything_and_wakes_waiters():
    lm = manager("T", "T.1", "U")
    lm.acquire("T.1", "x", W)
    lm.commit("T.1")
    lm.acquire("T", "y", R)
    with Scenario(lm) as scenario:
        waiting = scenario.run("u", "U writes x", lambda: lm.acquire("U", "x", W), blocks=True)
        edges = lm.wait_for_graph().edges(data=True)
        assert ("U", "T", {"kind": "retained", "resource": "x"}) in edges
        commits(scenario, "T", waiting)
    assert held(lm, "x") == {"U": W}
    assert not lm.holders("y")
    assert lm.statistics().locks == 1


# ---------------------------------------------------------------- Rule 4


def test_rule4_abort_releases_what_the_transaction_holds_or_retains_and_ancestors_keep_theirs():
    lm = manager("T", "T.1")
    lm.acquire("T.1", "x", W)
    lm.commit("T.1")  # T retains WRITE on x
    lm.begin("T.2", parent="T")
    lm.begin("T.2.1", parent="T.2")
    lm.acquire("T.2.1", "z", W)
    lm.commit("T.2.1")  # T.2 retains WRITE on z
    lm.acquire("T.2", "x", W)  # allowed: T, the retainer, is an ancestor
    lm.acquire("T.2", "y", R)
    lm.abort("T.2")
    assert held(lm, "x") == {} and retained(lm, "x") == {"T": W}, "the ancestor keeps its retained lock"
    assert not lm.holders("y") and not lm.holders("z"), "held and retained locks of T.2 are released"
    lm.begin("U")
    assert lm.try_acquire("U", "z", W)


def test_rule4_abort_aborts_active_descendants_and_a_waiting_descendant_is_told():
    from lockmgr import AbortedTransaction

    lm = manager("T", "T.1", "T.1.1", "U")
    lm.acquire("U", "busy", W)
    lm.acquire("T.1", "a", W)
    lm.acquire("T.1.1", "b", R)
    with Scenario(lm) as scenario:
        waiting = scenario.run("g", "T.1.1 waits for U", lambda: lm.acquire("T.1.1", "busy", R), blocks=True)
        scenario.run("t", "T aborts", lambda: lm.abort("T"))
        scenario.finish(waiting, raises=AbortedTransaction)
    assert "its ancestor 'T' aborted while it was waiting" in str(waiting.error)
    assert not lm.holders("a") and not lm.holders("b")
    assert held(lm, "busy") == {"U": W}
    assert lm.statistics().transactions == 1 and lm.statistics().waiting == 0
    with pytest.raises(AbortedTransaction, match="its ancestor 'T' aborted"):
        lm.acquire("T.1", "c", R)


def test_rule4_abort_of_a_holder_wakes_its_waiters():
    lm = manager("A", "B")
    lm.acquire("A", "x", W)
    with Scenario(lm) as scenario:
        waiting = scenario.run("b", "B reads x", lambda: lm.acquire("B", "x", R), blocks=True)
        scenario.run("a", "A aborts", lambda: lm.abort("A"))
        scenario.finish(waiting)
    assert held(lm, "x") == {"B": R}


# ---------------------------------------------------------------- Rule 5


def test_rule5_downgrade_holds_the_weaker_mode_and_retains_the_stronger():
    from lockmgr import InvalidDowngrade, LockNotHeld

    lm = manager("T", "T.1", "U")
    lm.acquire("T", "x", W)
    assert not lm.try_acquire("T.1", "x", R), "before: T holds WRITE, even its child must wait"
    lm.downgrade("T", "x", R)
    assert held(lm, "x") == {"T": R} and retained(lm, "x") == {"T": W}
    assert lm.try_acquire("T.1", "x", R), "after: the child may read (READ held, WRITE retained by an ancestor)"
    assert not lm.try_acquire("U", "x", R), "an outsider is still kept out by the retained WRITE"
    with pytest.raises(InvalidDowngrade):
        lm.downgrade("T", "x", W)
    with pytest.raises(LockNotHeld):
        lm.downgrade("U", "x", R)


def test_rule5_a_retainer_can_take_the_stronger_mode_back():
    lm = manager("T")
    lm.acquire("T", "x", W)
    lm.downgrade("T", "x", IR)
    assert held(lm, "x") == {"T": IR}
    lm.acquire("T", "x", W)
    assert held(lm, "x") == {"T": W} and retained(lm, "x") == {"T": W}


# ---------------------------------------------------------------- tables and tuples


def test_acquire_tuples_locks_each_key_as_acquire_tuple_does():
    lm = manager("A", "B", "C")
    lm.acquire_tuples("A", "accounts", [1, 2, 1], W)
    assert held(lm, "accounts") == {"A": IW}
    assert held(lm, ("accounts", 1)) == {"A": W} and held(lm, ("accounts", 2)) == {"A": W}
    lm.acquire_tuples("B", "accounts", [3, 4], R, resources=[("row", 3), ("row", 4)])   # an embedder's naming
    assert held(lm, ("row", 3)) == {"B": R} and held(lm, ("row", 4)) == {"B": R} and not lm.holders(("accounts", 3))
    lm.acquire("C", "ledger", R)
    lm.acquire_tuples("C", "ledger", [5, 6], R)
    assert not lm.holders(("ledger", 5)) and not lm.holders(("ledger", 6)), "a table READ covers its tuples"
    with pytest.raises(ValueError):
        lm.acquire_tuples("C", "ledger", [7, 8], R, resources=[("ledger", 7)])
    lm.acquire_tuples("C", "ledger", [], W)         # nothing asked: nothing taken
    assert held(lm, "ledger") == {"C": R}


@pytest.mark.parametrize("keys", ["ab", b"ab"])
def test_acquire_tuples_refuses_one_key_given_as_a_text_before_locking_anything(keys):
    """acquire_tuples('A', 'accounts', 'ab', W) iterated the text: it WRITE-locked the tuples 'a' and 'b' (for bytes
    the numbers 97 and 98), not the row 'ab'.  It is a TypeError saying to write [key], and nothing is locked."""
    lm = manager("A")
    with pytest.raises(TypeError, match=r"keys.*\[" + repr(keys) + r"\]"):
        lm.acquire_tuples("A", "accounts", keys, W)
    assert lm.statistics().locks == 0
    lm.acquire_tuples("A", "accounts", [keys], W)
    assert held(lm, ("accounts", keys)) == {"A": W} and lm.statistics().locks == 2


def test_acquire_tuples_that_meets_a_conflict_leaves_the_keys_before_it_locked():
    lm = manager("A", "B")
    lm.acquire_tuple("B", "accounts", 2, W)
    with pytest.raises(LockTimeout):            # (a wait that can only end by its timeout)
        lm.acquire_tuples("A", "accounts", [1, 2, 3], R, timeout=0.05)
    assert held(lm, ("accounts", 1)) == {"A": R}, "the key before the conflict stays locked"
    assert held(lm, ("accounts", 2)) == {"B": W} and not lm.holders(("accounts", 3))


def test_tuple_locks_take_the_matching_intention_lock_on_the_table():
    lm = manager("A", "B")
    lm.acquire_tuple("A", "accounts", 1, W)
    assert held(lm, "accounts") == {"A": IW} and held(lm, ("accounts", 1)) == {"A": W}
    lm.acquire_tuple("B", "accounts", 2, R)
    assert held(lm, "accounts") == {"A": IW, "B": IR}, "intention locks of different tuples are compatible"
    assert not lm.try_acquire("B", "accounts", R), "a table READ conflicts with A's IW"
    assert not lm.try_acquire("B", ("accounts", 1), R)
    lm.begin("C")
    lm.acquire("C", "ledger", R)
    lm.acquire_tuple("C", "ledger", 5, R)
    assert not lm.holders(("ledger", 5)), "a table READ already covers reading its tuples"
    lm.acquire_tuple("C", "ledger", 5, W)
    assert held(lm, "ledger") == {"C": RIW} and held(lm, ("ledger", 5)) == {"C": W}
    with pytest.raises(ValueError):
        lm.acquire_tuple("C", "ledger", 6, IW)


def test_a_timeout_of_infinity_waits_without_limit_and_nan_is_refused():
    # A timeout the clock cannot add (infinity, 1e300) made the wait raise OverflowError with the request left in
    # the queue: the transaction was then stuck with a request pending; NaN waited for ever where it is no number.
    lm = manager("A", "B")
    lm.acquire("A", "x", W)
    with Scenario(lm) as scenario:
        reader = scenario.run("B", "read x, no limit", lambda: lm.acquire("B", "x", R, timeout=float("inf")),
                              blocks=True)
        scenario.run("A", "commit", lambda: lm.commit("A"))
        scenario.finish(reader)
    assert held(lm, "x") == {"B": R}
    lm.begin("C")
    with pytest.raises(ValueError, match="timeout"):
        lm.acquire("C", "x", W, timeout=float("nan"))
    assert lm.statistics().waiting == 0 and lm.try_acquire("C", "y", R), "nothing is left queued for C"


def test_a_mode_that_is_no_mode_is_refused_naming_every_mode():
    lm = manager("A")
    with pytest.raises(TypeError) as refused:
        lm.acquire("A", "x", 2)                # type: ignore[arg-type]  # (what the test gives)
    assert all(mode.name in str(refused.value) for mode in Mode), "UPDATE was missing from the modes it named"
