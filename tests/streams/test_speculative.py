"""Matching on a predecessor's published, not yet final, pattern state (the design note's
"Matching order"): the commit dependency, and the restart when the predecessor aborts.

``A^1`` buffers its A in QP's partition of the worker and reads the worker's status (QA); a
rule on QA's output is left to run, so its state is not final until it ends.  ``B^5`` is
matched on that state at once (QP completes ``SEQ(A, B)``) and its rule writes the status.
"""

from __future__ import annotations

import contextlib
import threading

import pytest

from activedb import Coupling, streams
from activedb.testing import Watchdog, check_stream_history, wait_until
from tests.streams.conftest import set_status, statuses
from tests.streams.test_scheduler_examples import TIMEOUT, Feed, Gates, commits, request_of

DEFINITIONS = """
CREATE QUERY QP PATTERN SEQ(A, B) WHERE [HCW-ID] RETURN B.HCW-ID
CREATE RULE RP ON OUTPUT QP BEGIN UPDATE workerStatus SET status = 'warning' WHERE workerID = NEW.HCW-ID END
CREATE QUERY QA PATTERN SEQ(A) WHERE 'violation' != (SELECT status FROM workerStatus WHERE workerID = A.HCW-ID)
RETURN A.HCW-ID
"""
EVENTS = [streams.StreamEvent("A", 1, {"HCW-ID": "w1"}), streams.StreamEvent("B", 5, {"HCW-ID": "w1"})]


def engine_with(db, scheduler, action) -> streams.StreamEngine:
    engine = streams.StreamEngine(db, name="speculative", scheduler=scheduler, record_history=True)
    engine.create_stream("s", types=("A", "B"), attributes=("HCW-ID",))
    engine.define(DEFINITIONS)
    engine.rule("RA", on_output="QA", action=action, writes=["stream_alerts"])
    return engine


def edge(db, waiter, target) -> str | None:
    """The kind of the wait-for edge from ``waiter``'s subtransaction or one inside it (a
    speculative attempt runs in a child of it) to ``target``'s."""
    if waiter.node is None or target.node is None:
        return None
    graph = db.transactions.locks.wait_for_graph()
    for source in (waiter.node.id, *(node for node in graph if str(node).startswith(f"{waiter.node.id}."))):
        data = graph.get_edge_data(source, target.node.id)
        if data:
            return data.get("kind")
    return None


def writes_at(engine, ts) -> list[str]:
    """How the units that wrote at ``ts`` ended (``None``: not yet)."""
    history = engine.history.snapshot()
    ended = {op.unit: op.operation for op in history if op.kind == "end"}
    return [ended.get(op.unit) for op in history if op.kind == "write" and op.ts == ts]


@contextlib.contextmanager
def heard(db, table: str):
    """A deferred rule of the database on inserts into ``table``: an s-transaction that inserts there runs it
    at its commit, where it could still fail — its outcome is not decided before that commit."""
    db.rule(on=db.inserted(table), coupling=Coupling.DEFERRED, name=f"{table}_heard")(lambda tx, event: None)
    try:
        yield
    finally:
        db.rules.remove(f"{table}_heard")


@pytest.mark.parametrize("granularity", ["tuple", "table"])
@pytest.mark.parametrize("name", ["lwm", "s2pl"])
def test_the_dependent_runs_its_store_operations_before_the_stalled_predecessor_commits(db, name, granularity):
    """``A^1`` is stalled at ``finishing`` holding its read lock, its rule run; a rule of the database hears
    the table that rule wrote, so ``A^1``'s commit may still fail and its state is not final.  LWM: ``B^5``
    is matched on that state at once, writes, reaches ``finishing`` and then waits for ``A^1``'s end (the
    commit dependency, a ``stream-order`` edge).  S2PL: its write waits for the read lock."""
    set_status(db, w1="safe")
    gates = Gates(("A^1", "finishing"))
    scheduler = (streams.LWMScheduler if name == "lwm" else streams.S2PLScheduler)(granularity=granularity,
                                                                                   hooks=gates)
    engine = engine_with(db, scheduler, lambda tx, new: tx.insert("stream_alerts", worker=new["HCW-ID"]))
    with heard(db, "stream_alerts"), Watchdog(TIMEOUT, db.transactions.locks):
        feed = Feed(engine, EVENTS)
        wait_until(lambda: gates.reached("A^1", "finishing"), TIMEOUT, "A^1 to read and run its rule")
        first, second = request_of(scheduler, 1).owner, request_of(scheduler, 5).owner
        expected = "stream-order" if name == "lwm" else "stream-s2pl"
        if name == "lwm":
            # (B^5's order wait for A^1's published state, its first stream-order edge, may still be in the graph
            # after A^1 published it, until B^5's thread runs again: its commit dependency is waited for after its
            # finishing hook.)
            wait_until(lambda: gates.reached("B^5", "finishing"), TIMEOUT, "B^5 to match, write and reach finishing")
        wait_until(lambda: edge(db, second, first) == expected, TIMEOUT, f"B^5 to wait for A^1 ({expected})")
        assert writes_at(engine, 5) == ([None] if name == "lwm" else [])
        assert gates.reached("B^5", "finishing") == (name == "lwm")
        assert commits(engine) == []
        gates.open("A^1", "finishing")
        result = feed.join()
    assert commits(engine) == ["A^1", "B^5"]
    assert [(output.query, output.ts) for output in result.outputs] == [("QA", 1), ("QP", 5)]
    assert statuses(db) == {"w1": "warning"}
    check_stream_history(engine.history.snapshot()).assert_ok()
    assert scheduler.statistics().restarts == 0


@pytest.mark.parametrize("granularity", ["tuple", "table"])
def test_a_decided_predecessor_stalled_before_its_commit_holds_no_dependent_back_under_lwm(db, granularity):
    """The same with nothing left at ``A^1``'s commit: once its queries and rules ran, its state is final, and
    ``B^5`` commits while ``A^1`` is stalled (Active CEP Example 5's order)."""
    set_status(db, w1="safe")
    gates = Gates(("A^1", "finishing"))
    scheduler = streams.LWMScheduler(granularity=granularity, hooks=gates)
    engine = engine_with(db, scheduler, lambda tx, new: tx.insert("stream_alerts", worker=new["HCW-ID"]))
    with Watchdog(TIMEOUT, db.transactions.locks):
        feed = Feed(engine, EVENTS)
        wait_until(lambda: gates.reached("A^1", "finishing"), TIMEOUT, "A^1 to read and run its rule")
        wait_until(lambda: commits(engine) == ["B^5"], TIMEOUT, "B^5 to commit while A^1 is stalled")
        gates.open("A^1", "finishing")
        result = feed.join()
    assert commits(engine) == ["B^5", "A^1"]
    assert [(output.query, output.ts) for output in result.outputs] == [("QA", 1), ("QP", 5)]
    assert statuses(db) == {"w1": "warning"}
    check_stream_history(engine.history.snapshot()).assert_ok()
    assert scheduler.statistics().restarts == 0


@pytest.mark.parametrize("dependent_fails", [False, True], ids=["writes", "fails"])
@pytest.mark.parametrize("name", ["lwm", "s2pl"])
def test_the_dependent_of_an_aborted_predecessor_runs_again_on_the_installed_state(db, name, dependent_fails):
    """``A^1``'s rule is held, then fails: its event is a dead letter and its A was never in
    the state.  ``B^5``, matched on it meanwhile (LWM: it even wrote; ``fails``: a rule on
    that match raised), is aborted and run again on the state before ``A^1``: no match, no
    write, no dead letter of its own — SEI's result."""
    set_status(db, w1="safe")
    held, failing = threading.Event(), threading.Event()

    def fail(tx, new):
        failing.set()
        assert held.wait(TIMEOUT), "the test never released the rule"
        raise RuntimeError("the badge reader is offline")

    scheduler = streams.LWMScheduler() if name == "lwm" else streams.S2PLScheduler()
    engine = engine_with(db, scheduler, fail)
    if dependent_fails:
        engine.rule("RB", on_output="QP", action=lambda tx, new: 1 / 0, writes=["stream_alerts"], priority=9)
    with Watchdog(TIMEOUT, db.transactions.locks):
        feed = Feed(engine, EVENTS)
        wait_until(failing.is_set, TIMEOUT, "A^1's rule to run")
        first, second = request_of(scheduler, 1).owner, request_of(scheduler, 5).owner
        if dependent_fails:
            wait_until(lambda: edge(db, second, first) is not None, TIMEOUT, "B^5 to fail and wait for A^1's end")
        elif name == "lwm":
            wait_until(lambda: writes_at(engine, 5) == [None] and edge(db, second, first) == "stream-order",
                       TIMEOUT, "B^5 to write on A^1's state and wait for A^1's end")
        else:
            wait_until(lambda: edge(db, second, first) == "stream-s2pl", TIMEOUT, "B^5's write to wait for A^1")
        held.set()
        result = feed.join()
    assert [letter.event.describe() for letter in result.dead_letters] == ["A^1"]
    assert result.outputs == () and statuses(db) == {"w1": "safe"}
    # The first attempt's, matched on A^1's state (RB raises before RP writes, if it runs first).
    assert writes_at(engine, 5) in ([], ["aborted"]) if dependent_fails else writes_at(engine, 5) == ["aborted"]
    assert engine.statistics().events_failed == 1
    assert commits(engine) == ["B^5"]
    check_stream_history(engine.history.snapshot()).assert_ok()
    assert scheduler.statistics().restarts == 1
