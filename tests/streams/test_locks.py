"""The stream lock tables on their own (pure logic, no database): Active CEP Example 4 for
S2PL and Example 5 for LWM at the lock table, as named steps on threads; the no-overtaking
rule and a mutant that breaks it; tuple and table granularity; App. F's punctuation guard
with a late event's lock; and a property test of the grant rule against a brute-force
reading of §5.2/§5.3.

A step that must block is checked by the table's own ``statistics().waiting`` (observable
state, no sleeps); every test runs under a watchdog.  ``ACTIVEDB_STREAMS_LOCK_EXAMPLES`` (default 150) sets how
many lock tables the property test tries (e.g. 20000 for a long run).
"""

from __future__ import annotations

import os
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from activedb import streams
from activedb.streams import LockMode, LWMLockTable, S2PLLockTable
from activedb.streams._locks import Owner
from activedb.testing import Watchdog, wait_until

R, W = LockMode.READ, LockMode.WRITE


@pytest.fixture(autouse=True)
def clean():
    """Pure logic: no database to clean (overrides the package's fixture)."""
    yield

TIMEOUT = 10
TABLE = "workerstatus"
KEY = ("w1",)


class Steps:
    """Operations on threads of their own; ``blocked`` means the table counts the waiter.  A context manager:
    the block runs under a watchdog."""

    def __init__(self, table):
        self.table = table
        self.threads: list[threading.Thread] = []
        self._watchdog = Watchdog(TIMEOUT)

    def __enter__(self) -> "Steps":
        """``with Steps(table) as steps:`` runs the block under a ``Watchdog(TIMEOUT)``."""
        self._watchdog.__enter__()
        return self

    def __exit__(self, *exc_info):
        return self._watchdog.__exit__(*exc_info)

    def run(self, label: str, action, *, blocks: bool = False) -> dict:
        outcome: dict = {}
        waiting_before = self.table.statistics().waiting

        def body():
            try:
                outcome["result"] = action()
            except BaseException as error:       # noqa: BLE001 - the test inspects it
                outcome["error"] = error
            outcome["done"] = True

        thread = threading.Thread(target=body, name=label, daemon=True)
        self.threads.append(thread)
        thread.start()
        if blocks:
            wait_until(lambda: self.table.statistics().waiting > waiting_before, TIMEOUT, f"{label} to block")
            assert "done" not in outcome, f"{label} was expected to block"
        else:
            thread.join(TIMEOUT)
            assert outcome.get("done"), f"{label} did not finish"
            assert "error" not in outcome, outcome.get("error")
        return outcome

    def finished(self, outcome: dict, label: str) -> None:
        wait_until(lambda: outcome.get("done"), TIMEOUT, f"{label} to finish")
        assert "error" not in outcome, outcome.get("error")


def owners(*stamps):
    return [Owner(position, ts, f"T{index + 1}") for index, (position, ts) in enumerate(stamps)]


def test_example_4_s2pl_queues_in_timestamp_order_without_overtaking():
    """Active CEP Example 4: T1 (exit^2) = {sl1}, T2 (enter^10) = {sl2, xl2}, T3 (exit^15) = {sl3}."""
    table = S2PLLockTable()
    t1, t2, t3 = owners((0, 2), (1, 10), (2, 15))
    table.insert(t1, [(TABLE, KEY, R)])
    table.insert(t2, [(TABLE, KEY, R), (TABLE, KEY, W)])
    table.insert(t3, [(TABLE, KEY, R)])
    assert [request.describe() for request in table.requests(TABLE)] == [
        "sl_T1(workerstatus['w1'])", "xl_T2(workerstatus['w1'])", "sl_T3(workerstatus['w1'])"]  # sl2 ⊂ xl2
    with Steps(table) as steps:
        steps.run("T1 reads at 2", lambda: table.acquire(t1, TABLE, KEY, R))
        t2_write = steps.run("T2 writes at 10", lambda: table.acquire(t2, TABLE, KEY, W), blocks=True)
        # T3's sl is compatible with T1's, but T2's xl waits before it: no overtaking.
        t3_read = steps.run("T3 reads at 15", lambda: table.acquire(t3, TABLE, KEY, R), blocks=True)
        assert {wait.waiter: wait.blocker for wait in table.waits()} == {"T2": "T1", "T3": "T2"}
        table.end(t1)                                  # read-too-late prevented: T2 writes after T1 read
        steps.finished(t2_write, "T2 writes at 10")
        assert {wait.waiter: wait.blocker for wait in table.waits()} == {"T3": "T2"}
        table.end(t2)                                  # write-too-late prevented: T3 reads after T2 wrote
        steps.finished(t3_read, "T3 reads at 15")
    assert table.statistics().waits == 2


class OvertakingS2PL(S2PLLockTable):
    """A deliberately broken S2PL: a request waits only for conflicting *held* requests, so a
    later compatible read passes an earlier waiting write (the classic reader preference)."""

    def blocker(self, request, mode):
        for other in self._tables[request.table].requests:
            if (other.owner is not request.owner and other.held and not other.owner.ended
                    and (other.key is None or request.key is None or other.key == request.key)
                    and (other.mode is W or request.mode is W)):
                return other.owner, False
        return None, False


def test_the_overtaking_mutant_lets_a_later_read_pass_an_earlier_waiting_write():
    table = OvertakingS2PL()
    t1, t2, t3 = owners((0, 2), (1, 10), (2, 15))
    table.insert(t1, [(TABLE, KEY, R)])
    table.insert(t2, [(TABLE, KEY, W)])
    table.insert(t3, [(TABLE, KEY, R)])
    with Steps(table) as steps:
        steps.run("T1 reads at 2", lambda: table.acquire(t1, TABLE, KEY, R))
        t2_write = steps.run("T2 writes at 10", lambda: table.acquire(t2, TABLE, KEY, W), blocks=True)
        steps.run("T3 reads at 15", lambda: table.acquire(t3, TABLE, KEY, R))     # granted: it overtook T2
        table.end(t1)
        table.end(t3)
        steps.finished(t2_write, "T2 writes at 10")


def test_example_5_lwm_grants_reads_below_the_low_water_mark():
    """Active CEP Example 5 / Fig. 4: while T2 (enter^10) is open, T1's read at 2 is granted
    and T3's read at 15 is delayed; once T2 ends the lwm is 18 (T4's write lock) and the
    read at 15 is granted."""
    table = LWMLockTable()
    t1, t2, t3, t4 = owners((0, 2), (1, 10), (2, 15), (3, 18))
    table.insert(t1, [(TABLE, KEY, R)])
    table.insert(t2, [(TABLE, KEY, R), (TABLE, KEY, W)])
    table.insert(t3, [(TABLE, KEY, R)])
    table.insert(t4, [(TABLE, KEY, R), (TABLE, KEY, W)])
    table.publish(streams.END_OF_STREAM)
    with Steps(table) as steps:
        assert table.lwm(TABLE, KEY) is t2
        steps.run("T2 reads at 10 (its own write lock is the lwm)", lambda: table.acquire(t2, TABLE, KEY, R))
        steps.run("T1 reads at 2 while T2 is open", lambda: table.acquire(t1, TABLE, KEY, R))
        t3_read = steps.run("T3 reads at 15", lambda: table.acquire(t3, TABLE, KEY, R), blocks=True)
        t4_write = steps.run("T4 writes at 18", lambda: table.acquire(t4, TABLE, KEY, W), blocks=True)
        steps.run("T2 writes at 10 (reads never block writes: T1 is still open)",
                  lambda: table.acquire(t2, TABLE, KEY, W))
        table.end(t2)
        assert table.lwm(TABLE, KEY) is t4                        # lwm = 18
        steps.finished(t3_read, "T3 reads at 15")
        steps.finished(t4_write, "T4 writes at 18")               # it is the oldest write lock now
    assert table.statistics().waits == 2


def test_lwm_writes_run_in_timestamp_order_and_reads_never_block_them():
    table = LWMLockTable()
    early, late = owners((0, 5), (1, 9))
    table.insert(early, [(TABLE, KEY, W)])
    table.insert(late, [(TABLE, KEY, W)])
    reader = Owner(2, 12, "R")            # a read lock blocks nobody
    table.insert(reader, [(TABLE, KEY, R)])
    with Steps(table) as steps:
        late_write = steps.run("write at 9", lambda: table.acquire(late, TABLE, KEY, W), blocks=True)
        steps.run("write at 5", lambda: table.acquire(early, TABLE, KEY, W))
        table.end(early)
        steps.finished(late_write, "write at 9")


def test_lwm_release_before_the_end_wakes_lock_waiters_not_order_waiters():
    """Algorithm 2 updates the lwm after the Write (Proposition 1: Write ≺ Up), not at the
    commit: ``release`` drops the writer's requests, so a later Read is granted, while who waits
    for its partition states (an order wait) still waits for its end."""
    table = LWMLockTable()
    writer, reader, follower = owners((0, 10), (1, 15), (2, 16))
    table.insert(writer, [(TABLE, KEY, R), (TABLE, KEY, W)])
    table.insert(reader, [(TABLE, KEY, R)])
    table.insert(follower, [(TABLE, KEY, R)])
    table.publish(streams.END_OF_STREAM)
    with Steps(table) as steps:
        steps.run("the writer writes at 10", lambda: table.acquire(writer, TABLE, KEY, W))
        read = steps.run("a read at 15", lambda: table.acquire(reader, TABLE, KEY, R), blocks=True)
        ordered = steps.run("an order wait", lambda: table.wait_for(follower, writer), blocks=True)
        table.release(writer)
        steps.finished(read, "a read at 15")
        assert table.lwm(TABLE, KEY) is None and not writer.ended
        assert [wait.waiter for wait in table.waits()] == ["T3"]
        table.end(writer)
        steps.finished(ordered, "an order wait")


def test_granularity_table_locks_cover_their_tuples():
    table = S2PLLockTable()
    writer, other_row, scanner, row_reader = owners((0, 1), (1, 2), (2, 3), (3, 4))
    table.insert(writer, [(TABLE, ("w1",), W)])
    table.insert(other_row, [(TABLE, ("w2",), R)])
    table.insert(scanner, [(TABLE, None, R)])
    table.insert(row_reader, [(TABLE, ("w1",), R)])
    with Steps(table) as steps:
        steps.run("read w2 (another row)", lambda: table.acquire(other_row, TABLE, ("w2",), R))
        scan = steps.run("scan the table", lambda: table.acquire(scanner, TABLE, None, R), blocks=True)
        # A read of a row the table-level request covers uses that request.
        assert table.request_for(scanner, TABLE, ("w9",), R).key is None
        read = steps.run("read w1", lambda: table.acquire(row_reader, TABLE, ("w1",), R), blocks=True)
        table.end(writer)
        steps.finished(scan, "scan the table")
        steps.finished(read, "read w1")
    with pytest.raises(streams.errors.UnplannedAccess, match="did not lock"):
        table.request_for(other_row, TABLE, ("w1",), R)
    with pytest.raises(streams.errors.UnplannedAccess):
        table.request_for(other_row, TABLE, ("w2",), W)


def test_lwm_table_write_lock_holds_back_tuple_reads_after_it():
    table = LWMLockTable()
    table_writer, tuple_reader, early_reader = owners((1, 5), (2, 10), (0, 1))
    table.insert(early_reader, [(TABLE, ("w1",), R)])
    table.insert(table_writer, [(TABLE, None, W)])
    table.insert(tuple_reader, [(TABLE, ("w1",), R)])
    with Steps(table) as steps:
        steps.run("read at 1", lambda: table.acquire(early_reader, TABLE, ("w1",), R))
        read = steps.run("read at 10", lambda: table.acquire(tuple_reader, TABLE, ("w1",), R), blocks=True)
        table.end(table_writer)
        steps.finished(read, "read at 10")


def test_punctuation_guard_with_a_late_event_appendix_f():
    """LWM over disordered input (App. F): the dispatcher inserts locks in arrival order;
    a read at 15 waits for the punctuation; the late event at 10 then lowers the lwm."""
    table = LWMLockTable()
    (reader,) = owners((15, 15))
    table.insert(reader, [(TABLE, KEY, R)])
    table.publish(12)                                  # nothing older than 12 will come
    with Steps(table) as steps:
        read = steps.run("read at 15", lambda: table.acquire(reader, TABLE, KEY, R), blocks=True)
        assert [wait.blocker for wait in table.waits()] == [None]          # held back by the punctuation
        late = Owner(10, 10, "late")
        table.insert(late, [(TABLE, KEY, W)])          # arrives after the read's event: lowers the lwm
        table.publish(20)
        wait_until(lambda: [wait.blocker for wait in table.waits()] == ["late"], TIMEOUT,
                   "the read to wait for the late write")
        steps.run("late write at 10", lambda: table.acquire(late, TABLE, KEY, W))
        table.end(late)
        steps.finished(read, "read at 15")
    assert table.statistics().punctuation_waits == 1


def test_s2pl_needs_its_requests_in_the_declared_order():
    table = S2PLLockTable()
    first, second = owners((5, 5), (3, 3))
    table.insert(first, [(TABLE, KEY, R)])
    with pytest.raises(streams.errors.SchedulerError, match="declared order"):
        table.insert(second, [(TABLE, KEY, R)])


def test_a_victim_is_woken_with_its_error():
    table = S2PLLockTable()
    holder, waiter = owners((0, 1), (1, 2))
    table.insert(holder, [(TABLE, KEY, W)])
    table.insert(waiter, [(TABLE, KEY, W)])
    with Steps(table) as steps:
        outcome = steps.run("waiter", lambda: table.acquire(waiter, TABLE, KEY, W), blocks=True)
        table.make_victim(waiter, RuntimeError("chosen as the victim"))
        wait_until(lambda: outcome.get("done"), TIMEOUT, "the victim to wake")
    assert str(outcome["error"]) == "chosen as the victim"


# --- the grant rule against a brute-force reading of §5.2 / §5.3 -------------------------------

def _overlap(a, b):
    return a.key is None or b.key is None or a.key == b.key


def reference_blocker(kind, requests, request):
    """The earliest live owner of an earlier request that holds ``request`` back."""
    blockers = []
    for other in requests:
        if other.owner is request.owner or other.owner.ended or other.owner.position >= request.owner.position:
            continue
        if not _overlap(other, request):
            continue
        if kind == "s2pl" and (other.mode is W or request.mode is W):
            blockers.append(other.owner)
        if kind == "lwm" and other.mode is W:
            blockers.append(other.owner)
    return min(blockers, key=lambda owner: owner.position) if blockers else None


requests_strategy = st.lists(
    st.lists(st.tuples(st.sampled_from([None, ("a",), ("b",), ("c",)]), st.sampled_from([R, W])),
             min_size=1, max_size=3),
    min_size=1, max_size=12)


@settings(max_examples=int(os.environ.get("ACTIVEDB_STREAMS_LOCK_EXAMPLES", "150")), deadline=None)
@given(requests_strategy, st.sets(st.integers(0, 11)), st.sampled_from(["s2pl", "lwm"]))
def test_grant_rule_matches_the_reference(plan, ended, kind):
    table = S2PLLockTable() if kind == "s2pl" else LWMLockTable()
    all_owners = [Owner(position, position, f"T{position}") for position in range(len(plan))]
    for owner, resources in zip(all_owners, plan):
        table.insert(owner, [(TABLE, key, mode) for key, mode in resources])
    for position in ended:
        if position < len(all_owners):
            table.end(all_owners[position])
    requests = table.requests(TABLE)
    for request in requests:
        if request.owner.ended:
            continue
        assert table.blocking(request) is reference_blocker(kind, requests, request), request.describe()
