"""Deadlock detection over held / retained / queued / commit edges, victim policies, fairness, timeouts,
and the error messages.  Threads are ordered by lockmgr.testing.Scenario (observable state, no sleeps)."""

from __future__ import annotations

import threading

import pytest

from lockmgr import (
    Deadlock,
    DeadlockCycle,
    DuplicateTransaction,
    ErrorClasses,
    LockManager,
    LockTimeout,
    Mode,
    RequestPending,
    TransactionNotActive,
    UnknownTransaction,
    VictimPolicy,
)
from lockmgr.testing import Scenario, wait_until
from tests.lockmgr._trees import commits, manager

IR, IW, R, RIW, W = Mode.IR, Mode.IW, Mode.READ, Mode.RIW, Mode.WRITE


def kinds(error: Deadlock) -> set[tuple]:
    return {(edge.waiter, edge.target, edge.kind) for edge in error.cycle}


@pytest.mark.parametrize("granted, wanted", [
    ({"A": ("x", W), "B": ("y", W)}, {"A": ("y", W), "B": ("x", W)}),   # each wants the row the other wrote
    ({"A": ("x", R), "B": ("x", R)}, {"A": ("x", W), "B": ("x", W)}),   # both upgrade a read (Rule 1)
], ids=["crossing", "conversion"])
def test_two_transactions_waiting_for_each_other_is_a_deadlock_and_only_the_victim_is_told(granted, wanted):
    lm = manager("A", "B")
    for tid, (resource, mode) in granted.items():
        lm.acquire(tid, resource, mode)
    with Scenario(lm) as scenario:
        a_waits = scenario.run("a", f"A wants {wanted['A']}", lambda: lm.acquire("A", *wanted["A"]), blocks=True)
        b_step = scenario.run("b", f"B wants {wanted['B']}", lambda: lm.acquire("B", *wanted["B"]), raises=Deadlock)
        error = b_step.error
        assert error.victim == "B" and error.requester == "B" and error.policy == "requester"
        assert kinds(error) == {("B", "A", "held"), ("A", "B", "held")}
        assert "lm.abort('B')" in str(error)
        assert repr(error) == f"Deadlock({str(error)!r})"     # (quoted by repr, a rule's failure, it reads as itself)
        scenario.still_blocked(a_waits)
        assert lm.statistics().waiting == 1 and lm.statistics().deadlocks == 1
        scenario.run("b", "B aborts", lambda: lm.abort("B"))
        scenario.finish(a_waits)
    assert dict(lm.holders(wanted["A"][0]).held) == {"A": W}


def test_a_child_waiting_for_a_lock_its_parent_holds_is_a_deadlock_through_the_commit_edge():
    lm = manager("P", "P.1")
    lm.acquire("P", "x", W)
    with pytest.raises(Deadlock) as caught:
        lm.acquire("P.1", "x", R)
    assert kinds(caught.value) == {("P.1", "P", "held"), ("P", "P.1", "commit")}
    assert lm.statistics().waiting == 0


def test_deadlock_created_by_inheritance_is_detected_when_the_waiter_is_redirected():
    """T2.a waits for T1.a's lock; T1 waits for T2's lock.  No cycle -- until T1.a commits and T1 retains
    the lock: then T2.a waits for T1 (retained), closing T1 -> T2 -> T2.a -> T1 (Concurrent Rule Execution §4.2.2:
    "deadlock detection is performed ... just before lock inheritance")."""
    lm = manager("T1", "T1.a", "T2", "T2.a")
    lm.acquire("T1.a", "x", W)
    lm.acquire("T2", "y", W)
    with Scenario(lm) as scenario:
        t2a = scenario.run("t2a", "T2.a wants x", lambda: lm.acquire("T2.a", "x", W), blocks=True)
        t1 = scenario.run("t1", "T1 wants y", lambda: lm.acquire("T1", "y", W), blocks=True)
        assert lm.statistics().deadlocks == 0
        commits(scenario, "T1.a")
        scenario.finish(t2a, raises=Deadlock)
        error = t2a.error
        assert error.victim == "T2.a"
        assert kinds(error) == {("T2.a", "T1", "retained"), ("T1", "T2", "held"), ("T2", "T2.a", "commit")}
        scenario.still_blocked(t1)
        scenario.run("t2a", "T2.a aborts", lambda: lm.abort("T2.a"))
        commits(scenario, "T2", t1)


def test_deadlock_across_three_trees_with_subtransactions():
    lm = manager("A", "A.1", "B", "B.1", "C", "C.1")
    lm.acquire("A.1", "a", W)
    lm.acquire("B.1", "b", W)
    lm.acquire("C.1", "c", W)
    with Scenario(lm) as scenario:
        first = scenario.run("a", "A.1 wants b", lambda: lm.acquire("A.1", "b", R), blocks=True)
        second = scenario.run("b", "B.1 wants c", lambda: lm.acquire("B.1", "c", R), blocks=True)
        third = scenario.run("c", "C.1 wants a", lambda: lm.acquire("C.1", "a", R), raises=Deadlock)
        assert kinds(third.error) == {("A.1", "B.1", "held"), ("B.1", "C.1", "held"), ("C.1", "A.1", "held")}
        scenario.run("c", "C aborts", lambda: lm.abort("C"))
        scenario.finish(second)
        commits(scenario, "B.1")
        commits(scenario, "B", first)


@pytest.mark.parametrize("policy", ["youngest", VictimPolicy.YOUNGEST, "smallest_tree", VictimPolicy.SMALLEST_TREE])
def test_victim_policies_can_choose_a_transaction_other_than_the_requester(policy):
    lm = manager("Old", "Old.1", "Young", victim_policy=policy)   # Old.1: a bigger subtree for smallest_tree
    lm.acquire("Old", "x", W)
    lm.acquire("Young", "y", W)
    with Scenario(lm) as scenario:
        young = scenario.run("young", "Young wants x", lambda: lm.acquire("Young", "x", W), blocks=True)
        old = scenario.run("old", "Old wants y (closes the cycle)", lambda: lm.acquire("Old", "y", W), blocks=True)
        scenario.finish(young, raises=Deadlock)
        assert young.error.victim == "Young" and young.error.requester == "Old"
        assert young.error.policy == policy
        scenario.still_blocked(old)
        scenario.run("young", "Young aborts", lambda: lm.abort("Young"))
        scenario.finish(old)


def test_a_callable_victim_policy_sees_the_cycle_and_its_candidates():
    seen: list[DeadlockCycle] = []

    def choose_b(cycle: DeadlockCycle):
        seen.append(cycle)
        return "B"

    lm = manager("A", "B", victim_policy=choose_b)
    lm.acquire("A", "x", W)
    lm.acquire("B", "y", W)
    with Scenario(lm) as scenario:
        b = scenario.run("b", "B wants x", lambda: lm.acquire("B", "x", W), blocks=True)
        a = scenario.run("a", "A wants y", lambda: lm.acquire("A", "y", W), blocks=True)
        scenario.finish(b, raises=Deadlock)
        scenario.run("b", "B aborts", lambda: lm.abort("B"))
        scenario.finish(a)
    (cycle,) = seen
    assert cycle.requester == "A"
    assert {candidate.tid for candidate in cycle.candidates} == {"A", "B"}
    assert b.error.policy == "choose_b"


def test_a_broken_callable_policy_falls_back_to_the_requester():
    def broken(cycle):
        raise RuntimeError("oops")

    lm = manager("A", "B", victim_policy=broken)
    lm.acquire("A", "x", W)
    lm.acquire("B", "y", W)
    with Scenario(lm) as scenario:
        a = scenario.run("a", "A wants y", lambda: lm.acquire("A", "y", W), blocks=True)
        b = scenario.run("b", "B wants x", lambda: lm.acquire("B", "x", W), raises=Deadlock)
        assert "victim policy raised RuntimeError('oops')" in str(b.error)
        scenario.run("b", "B aborts", lambda: lm.abort("B"))
        scenario.finish(a)


def test_unknown_victim_policy_is_refused():
    with pytest.raises(ValueError, match="unknown victim_policy"):
        LockManager(victim_policy="oldest")


# ---------------------------------------------------------------- fairness


def test_a_waiting_write_is_not_starved_by_a_stream_of_reads():
    lm = manager("Reader", "Writer")
    lm.acquire("Reader", "x", R)
    with Scenario(lm) as scenario:
        writer = scenario.run("w", "Writer wants x", lambda: lm.acquire("Writer", "x", W), blocks=True)
        for number in range(5):
            lm.begin(f"late{number}")
            assert not lm.try_acquire(f"late{number}", "x", R), "a new reader queues behind the waiting writer"
        late = scenario.run("late", "late0 reads x", lambda: lm.acquire("late0", "x", R), blocks=True)
        edges = lm.wait_for_graph().edges(data=True)
        assert ("late0", "Writer", {"kind": "queued", "resource": "x"}) in edges
        # ...but the reader's own subtransaction is not queued behind a writer that waits for its parent.
        lm.begin("Reader.1", parent="Reader")
        assert lm.try_acquire("Reader.1", "x", R)
        lm.commit("Reader.1")
        commits(scenario, "Reader", writer)
        scenario.still_blocked(late)
        commits(scenario, "Writer", late)


def test_a_cycle_caused_only_by_the_queue_is_broken_by_letting_the_queued_reader_go_first():
    lm = manager("T1", "T2", "T3")
    lm.acquire("T1", "x", R)
    lm.acquire("T3", "y", W)
    with Scenario(lm) as scenario:
        t2 = scenario.run("t2", "T2 wants to write x", lambda: lm.acquire("T2", "x", W), blocks=True)
        t3 = scenario.run("t3", "T3 reads x (queued behind T2)", lambda: lm.acquire("T3", "x", R), blocks=True)
        # T1 -> T3 (held y) closes T1 -> T3 -> T2 -> T1, whose T3 -> T2 edge exists only for fairness.
        t1 = scenario.run("t1", "T1 wants y", lambda: lm.acquire("T1", "y", W), blocks=True)
        scenario.finish(t3)
        statistics = lm.statistics()
        assert statistics.queue_jumps == 1 and statistics.deadlocks == 0
        assert dict(lm.holders("x").held) == {"T1": R, "T3": R}
        commits(scenario, "T3", t1)
        commits(scenario, "T1", t2)


def test_a_queue_of_writers_of_one_row_is_queued_looking_at_each_request_once_and_drained_one_pass_per_hand_off(
        monkeypatch):
    """300 writers of one row took about 20 s to queue and drain (activedb's explain test): every new waiter
    re-evaluated the whole queue, each request against every earlier one, and every hand-off did that twice — n³.
    Counted, not timed: Rule-1 evaluations (``_blockers``) while n writers queue and while they drain. The waits
    stay what they were (each writer waits for every earlier one, FIFO) and so does the grant order."""
    import lockmgr._queues

    looked = [0]
    evaluate = lockmgr._queues._blockers

    def counted(*arguments):
        looked[0] += 1
        return evaluate(*arguments)

    monkeypatch.setattr(lockmgr._queues, "_blockers", counted)
    writers = 40
    lm = manager("H", *(f"w{number}" for number in range(writers)))
    lm.acquire("H", "x", W)
    granted: list[int] = []
    failures: list[BaseException] = []

    def writer(number: int) -> None:
        try:
            lm.acquire(f"w{number}", "x", W)
            granted.append(number)
            lm.commit(f"w{number}")
        except BaseException as error:  # pragma: no cover - asserted below
            failures.append(error)

    threads = [threading.Thread(target=writer, args=(number,), daemon=True) for number in range(writers)]
    for number, thread in enumerate(threads):
        thread.start()
        wait_until(lambda: lm.statistics().waiting == number + 1, 10, f"writer {number} waiting")
    assert looked[0] == writers, f"queueing {writers} writers evaluated Rule 1 {looked[0]} times"
    graph = lm.wait_for_graph()
    queued = [edge for edge in graph.edges(data="kind") if edge[2] == "queued"]
    assert len(queued) == writers * (writers - 1) // 2, "each writer waits for every earlier one"
    looked[0] = 0
    lm.commit("H")
    for thread in threads:
        thread.join(10)
    assert failures == [] and not any(thread.is_alive() for thread in threads)
    assert granted == list(range(writers)), "granted in the order they queued"
    assert looked[0] <= writers * (writers + 1) // 2, (
        f"draining {writers} writers evaluated Rule 1 {looked[0]} times: more than one pass over the queue per hand-off")


# ---------------------------------------------------------------- timeouts and errors


def test_timeout_withdraws_the_request_and_lets_the_queue_behind_it_through():
    lm = manager("Reader", "Writer", "Late")
    lm.acquire("Reader", "x", R)
    with Scenario(lm) as scenario:
        writer = scenario.run("w", "Writer waits 0.2 s", lambda: lm.acquire("Writer", "x", W, timeout=0.2),
                              blocks=True)
        late = scenario.run("l", "Late reads x", lambda: lm.acquire("Late", "x", R), blocks=True)
        scenario.finish(writer, raises=LockTimeout)
        scenario.finish(late)
    assert "'Reader'" in str(writer.error) and "retry later or abort it" in str(writer.error)
    assert lm.statistics().timeouts == 1 and lm.statistics().waiting == 0
    assert dict(lm.holders("x").held) == {"Reader": R, "Late": R}


def test_wait_for_graph_exports_all_edge_kinds():
    lm = manager("T", "T.1", "U", "V")
    lm.acquire("T.1", "x", W)
    lm.commit("T.1")
    lm.begin("T.2", parent="T")
    lm.acquire("T.2", "z", W)
    with Scenario(lm) as scenario:
        u = scenario.run("u", "U wants x", lambda: lm.acquire("U", "x", R), blocks=True)
        v = scenario.run("v", "V wants z", lambda: lm.acquire("V", "z", R), blocks=True)
        graph = lm.wait_for_graph()
        assert graph.edges["U", "T"] == {"kind": "retained", "resource": "x"}
        assert graph.edges["V", "T.2"] == {"kind": "held", "resource": "z"}
        assert graph.edges["T", "T.2"] == {"kind": "commit"}
        assert graph.nodes["U"]["waiting_for"] == "x"
        scenario.run("t", "T aborts", lambda: lm.abort("T"))
        scenario.finish(u)
        scenario.finish(v)


def test_errors_say_what_to_do():
    lm = LockManager()
    with pytest.raises(UnknownTransaction, match=r"call lm.begin\('nobody'\)"):
        lm.acquire("nobody", "x", R)
    lm.begin("T")
    with pytest.raises(DuplicateTransaction):
        lm.begin("T")
    with pytest.raises(TypeError, match="lockmgr.Mode"):
        lm.acquire("T", "x", "READ")
    with pytest.raises(UnknownTransaction):
        lm.begin("C", parent="nobody")
    lm.commit("T")
    with pytest.raises(TransactionNotActive, match="is committed"):
        lm.acquire("T", "x", R)
    with pytest.raises(TransactionNotActive):
        lm.begin("C", parent="T")


def test_an_embedder_names_the_classes_raised_for_a_deadlock_and_a_timeout():
    class EmbedderError(Exception):
        pass

    class Victim(EmbedderError, Deadlock):
        pass

    class TimedOut(EmbedderError, LockTimeout):
        pass

    lm = manager("P", "P.1", "Q", error_classes=ErrorClasses(deadlock=Victim, lock_timeout=TimedOut))
    lm.acquire("P", "x", W)
    with pytest.raises(Victim) as caught:
        lm.acquire("P.1", "x", R)
    assert caught.value.victim == "P.1" and kinds(caught.value) == {("P.1", "P", "held"), ("P", "P.1", "commit")}
    with pytest.raises(TimedOut, match="retry later or abort it"):
        lm.acquire("Q", "x", R, timeout=0)
    with pytest.raises(TypeError, match="subclass of lockmgr.Deadlock"):
        ErrorClasses(deadlock=EmbedderError)


def test_an_unknown_policy_or_commit_edges_value_names_the_members():
    with pytest.raises(ValueError, match="requester, youngest, smallest_tree"):
        LockManager(victim_policy="oldest")
    with pytest.raises(ValueError, match="CommitEdges.STRUCTURAL"):
        LockManager(commit_edges="always")


def test_one_pending_request_per_transaction():
    lm = manager("A", "B")
    lm.acquire("A", "x", W)
    lm.acquire("A", "y", W)
    with Scenario(lm) as scenario:
        b = scenario.run("b1", "B wants x", lambda: lm.acquire("B", "x", W), blocks=True)
        scenario.run("b2", "B also wants y", lambda: lm.acquire("B", "y", W), raises=RequestPending)
        assert lm.try_acquire("B", "free", W), "an uncontended grant is not a second wait"
        scenario.run("b2", "B cannot commit while waiting", lambda: lm.commit("B"), raises=RequestPending)
        commits(scenario, "A", b)


def test_abort_from_another_thread_wakes_the_waiter_with_transaction_aborted():
    from lockmgr import AbortedTransaction

    lm = manager("A", "B")
    lm.acquire("A", "x", W)
    errors = []
    started = threading.Event()

    def body():
        started.set()
        try:
            lm.acquire("B", "x", W)
        except AbortedTransaction as error:
            errors.append(error)

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    wait_until(lambda: lm.statistics().waiting >= 1, timeout=60, message="B's request waiting")
    lm.abort("B")
    thread.join(10)
    assert not thread.is_alive() and len(errors) == 1
    assert "it aborted while it was waiting" in str(errors[0])
