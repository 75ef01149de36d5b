"""The lock manager's arguments checked where they are given: a stripe count, error classes, a transaction id, a
child to hand down to and a timeout that cannot be used are refused at the call, saying what to give, and the
manager is left as it was."""

from __future__ import annotations

import math

import pytest

from lockmgr import LockManager, Mode


@pytest.mark.parametrize("options, error, says", [
    ({"stripes": 0}, ValueError, "stripes must be at least 1"),
    ({"error_classes": object()}, TypeError, "error_classes must be a lockmgr.ErrorClasses"),
], ids=["no-stripes", "error-classes-of-another-kind"])
def test_a_manager_of_options_it_cannot_use_is_refused(options, error, says):
    with pytest.raises(error, match=says):
        LockManager(**options)


def test_a_transaction_id_of_none_is_refused_and_registers_nothing():
    manager = LockManager()
    with pytest.raises(ValueError, match="None means 'no parent'"):
        manager.begin(None)
    assert manager.wait_for_graph().number_of_nodes() == 0


def test_holds_are_handed_down_only_to_a_child():
    manager = LockManager()
    manager.begin("T1")
    manager.begin("T2")
    manager.begin("T1.1", "T1")
    manager.acquire("T1", "row", Mode.WRITE)
    with pytest.raises(ValueError, match="hand_down: 'T2' is not a child of 'T1'"):
        manager.hand_down("T1", "T2")
    assert dict(manager.holders("row").held) == {"T1": Mode.WRITE}       # (still T1's)
    manager.hand_down("T1", "T1.1")      # (its own child: accepted)
    assert dict(manager.holders("row").held) == {"T1.1": Mode.WRITE}


@pytest.mark.parametrize("timeout", [-1.0, math.nan], ids=["negative", "nan"])
def test_a_wait_for_graph_timeout_below_zero_or_nan_is_refused(timeout):
    with pytest.raises(ValueError, match="timeout must be None or a number >= 0"):
        LockManager().wait_for_graph(timeout=timeout)


# --- the isolation tester's own failures: what a scenario that does not go as written says --------------------------

def scenario_failure(write) -> str:
    """The ScenarioError a scenario written by ``write(scenario, manager)`` fails with."""
    from lockmgr.testing import Scenario, ScenarioError

    manager = LockManager()
    for tid in ("T1", "T2"):
        manager.begin(tid)
    with pytest.raises(ScenarioError) as raised, Scenario(manager, timeout=60.0) as scenario:
        write(scenario, manager)
    return str(raised.value)


def test_a_step_written_to_block_that_finishes_says_so():
    said = scenario_failure(lambda s, lm: s.run("s1", "free row", lambda: lm.acquire("T1", "row", Mode.WRITE),
                                                blocks=True))
    assert said.startswith("step s1:'free row' was expected to block but finished: ok")


def test_a_step_that_raises_where_none_was_written_names_the_error():
    said = scenario_failure(lambda s, lm: s.run("s1", "unknown", lambda: lm.acquire("T9", "row", Mode.WRITE)))
    assert said.startswith("step s1:'unknown' raised ") and "T9" in said


def test_a_step_written_to_raise_that_returns_says_what_it_got():
    said = scenario_failure(lambda s, lm: s.run("s1", "granted", lambda: lm.acquire("T1", "row", Mode.READ),
                                                raises=TimeoutError))
    assert said == "step s1:'granted' should raise <class 'TimeoutError'> but got None"


def test_a_step_asserted_still_blocked_after_it_went_through_says_so():
    def write(scenario, manager):
        scenario.run("s1", "holds", lambda: manager.acquire("T1", "row", Mode.WRITE))
        waits = scenario.run("s2", "waits", lambda: manager.acquire("T2", "row", Mode.WRITE), blocks=True)
        scenario.run("s1", "commits", lambda: manager.commit("T1"))
        scenario.finish(waits)
        scenario.still_blocked(waits)

    said = scenario_failure(write)
    assert said.startswith("step ") and said.endswith("was expected to be still blocked"), said
