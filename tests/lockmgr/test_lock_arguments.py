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
