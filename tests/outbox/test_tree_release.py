"""Once a tree's outcome is told, its outbox participant lets go of the tree's firings: the nodes that fired
detached rules are freed by reference counting when the tree ends, not kept (through the root, which refers
to itself) until the cyclic collector runs — a micro-batch of events would keep thousands of them.  The
recorded firings still run.  Real PostgreSQL."""

from __future__ import annotations

import gc
import weakref

import pytest

from activedb import Coupling


@pytest.mark.parametrize("outcome", ["commit", "abort"])
def test_the_nodes_that_fired_detached_rules_are_freed_when_the_tree_ends(db, outcome):
    ran: list[str] = []

    @db.rule(on=db.stream(f"release_{outcome}"), coupling=Coupling.DETACHED, name=f"release_detached_{outcome}")
    def detached(tx, event):
        ran.append(event.key)

    kept: list[weakref.ref] = []
    enabled = gc.isenabled()
    gc.collect()
    gc.disable()        # what is freed below is freed by reference counting alone
    try:
        try:
            with db.transaction() as tx:
                for number in range(3):
                    with tx.subtransaction() as child:
                        child.emit(f"release_{outcome}", key=number)
                        kept.append(weakref.ref(child))
                if outcome == "abort":
                    raise RuntimeError("the application gives up")
        except RuntimeError:
            pass
        del tx, child
        assert [node() for node in kept] == [None, None, None]
    finally:
        if enabled:
            gc.enable()
    db.rules.wait_idle(60)
    assert sorted(ran) == [0, 1, 2]     # detached: runs whatever the trigger's outcome
