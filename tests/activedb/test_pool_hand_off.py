"""The worker pool hands a spawned child to a thread of its own only when something blocks (txn README,
"Spawned children: a thread only when something blocks"; ``activedb/txn/_pool.py``).

A fork/join parent runs its children itself; a spawner blocked where the pool cannot see it (a barrier, an
event) still has its children run by workers; a thread about to block gives the queue workers; an eager start
wakes one at once; a deep chain stays far from the recursion limit.  No sleeps: events, barriers and
observable-state waits with generous bounds, under a watchdog.
"""

from __future__ import annotations

import sys
import threading

import pytest

from activedb.txn import _pool
from lockmgr.testing import Watchdog, wait_until

BOUND = 60.0       # seconds: a generous bound for a loaded machine (the hand-off takes about a millisecond)


@pytest.fixture
def patient_pool(db):
    """The module's pool with a waker that does not act within a test: a child the parent runs itself may
    then take as long as a loaded machine makes it (else, after a millisecond without the pool seeing
    progress, the waker would hand its queued siblings to workers — correct, but not what is tested)."""
    pool = db.transactions.pool
    before, pool.hand_off_after = pool.hand_off_after, 3600.0
    yield pool
    pool.hand_off_after = before


def test_a_fork_join_parent_runs_its_children_itself(db, patient_pool):
    """Spawned children that the parent waits for right away run on the parent's thread, one after
    another: no worker is woken or started for them."""
    pool = patient_pool
    threads_before = pool.statistics()["threads"]
    ran_on: list[int] = []

    def child(tx, number):
        ran_on.append(threading.get_ident())
        tx.write("items", f"fork-{number}", value=number)
        return number

    with Watchdog(BOUND, db.transactions.locks):
        with db.transaction() as tx:
            handles = [tx.spawn(child, number) for number in range(10)]
            assert [handle.result() for handle in handles] == list(range(10))
    assert ran_on == [threading.get_ident()] * 10
    assert pool.statistics()["threads"] == threads_before


def test_a_deferred_group_on_threads_runs_on_the_committing_thread(db, patient_pool):
    """A priority group of deferred firings on threads (one spawned child each): the commit's wait for the
    group runs them all in its own thread, and every firing executes."""
    database = db
    assert database.rules.execution == "threads"
    ran_on: list[int] = []

    @database.rule(on=database.stream("hand_off_deferred"), coupling="deferred", name="hand_off_deferred")
    def record(tx, event):
        ran_on.append(threading.get_ident())
        tx.write("items", f"deferred-{event.key}", value=event.key)

    with Watchdog(BOUND, database.transactions.locks):
        with database.transaction() as tx:
            for number in range(20):
                tx.emit("hand_off_deferred", key=number)
    assert ran_on == [threading.get_ident()] * 20
    assert database.rules.statistics().per_rule["hand_off_deferred"].executed == 20


def test_siblings_that_wait_for_each_other_get_threads(db):
    """Three siblings meet at a barrier: the parent runs the first itself, which blocks in the barrier
    where the pool cannot see it; the pool, idle, gives the other two workers and all three pass."""
    barrier = threading.Barrier(3)
    passed: list[int] = []

    def sibling(tx, number):
        barrier.wait(timeout=BOUND)
        passed.append(number)

    with Watchdog(BOUND * 2, db.transactions.locks):
        with db.transaction() as tx:
            handles = [tx.spawn(sibling, number) for number in range(3)]
            for handle in handles:
                handle.result()
    assert sorted(passed) == [0, 1, 2]


def test_a_spawner_blocked_elsewhere_still_has_its_child_run(db):
    """The parent spawns and then waits on an event the child sets (not on the handle): the child still
    runs, on a worker."""
    started = threading.Event()
    ran_on: list[int] = []

    def child(tx):
        ran_on.append(threading.get_ident())
        started.set()

    with Watchdog(BOUND * 2, db.transactions.locks):
        with db.transaction() as tx:
            handle = tx.spawn(child)
            assert started.wait(BOUND), "the child never ran while its parent was blocked"
            handle.result()
    assert ran_on and ran_on[0] != threading.get_ident()


def test_an_eager_spawn_wakes_a_worker_at_once(db):
    """``spawn(..., eager=True)``: a worker runs the child while the parent has not waited at all."""
    started = threading.Event()

    def child(tx):
        started.set()
        return threading.get_ident()

    with Watchdog(BOUND * 2, db.transactions.locks):
        with db.transaction() as tx:
            handle = tx.spawn(child, eager=True)
            assert started.wait(BOUND)
            assert handle.result() != threading.get_ident()


def test_a_thread_about_to_block_gives_the_queue_workers():
    """``before_blocking``: every task queued so far gets a worker, though nobody waits for it."""
    pool = _pool.WorkerPool(4, name="test-hand-off", hand_off_after=3600.0)   # no waker within the test
    try:
        done = [threading.Event() for _ in range(3)]
        tasks = [pool.start(_pool.Task(event.set)) for event in done]
        assert all(task.state is _pool.TaskState.QUEUED for task in tasks)
        pool.before_blocking()
        for event in done:
            assert event.wait(BOUND), f"a queued task did not run: {pool.statistics()}"
        assert pool.statistics()["queued"] == 0
    finally:
        pool.shutdown()


def test_a_cancelled_task_never_runs_and_a_claimed_one_cannot_be_cancelled():
    """``cancel``: a queued task is done at once with no result and never runs, though a worker is given it
    afterwards; a task someone has claimed is not cancelled."""
    pool = _pool.WorkerPool(2, name="test-cancel", hand_off_after=3600.0)   # no waker within the test
    try:
        ran = threading.Event()
        cancelled = pool.start(_pool.Task(ran.set))
        assert cancelled.cancel() and cancelled.done() and cancelled.wait(0)
        assert cancelled.result is None and cancelled.error is None
        claimed = _pool.Task(ran.set)
        assert claimed.claim() and not claimed.cancel()
        marker = threading.Event()
        pool.start(_pool.Task(marker.set))
        pool.before_blocking()                     # a worker for what is queued: the cancelled one is skipped
        assert marker.wait(BOUND), f"the queued task did not run: {pool.statistics()}"
        assert not ran.is_set()
    finally:
        pool.shutdown()


def test_the_waker_gives_workers_when_the_pool_is_idle():
    """Nobody waits for the tasks and nobody blocks where the pool sees it: after the pool has been idle
    for ``hand_off_after``, the waker gives them workers."""
    pool = _pool.WorkerPool(2, name="test-waker", hand_off_after=0.001)
    try:
        done = [threading.Event() for _ in range(5)]
        for event in done:
            pool.start(_pool.Task(event.set))
        for event in done:
            assert event.wait(BOUND), f"a queued task did not run: {pool.statistics()}"
        wait_until(lambda: pool.statistics()["queued"] == 0, BOUND, "the queue to empty",
                   describe=pool.statistics)
    finally:
        pool.shutdown()


def _frames() -> int:
    """How many frames this thread's stack holds."""
    frame, count = sys._getframe(), 0
    while frame is not None:
        frame, count = frame.f_back, count + 1
    return count


def _chain(db, depth: int, recursion_limit: int | None = None) -> list[tuple[int, int, int]]:
    """Run a chain of ``depth`` spawned children below a top-level transaction, each spawning one and waiting
    for it (under ``recursion_limit``, if given, restored after); per level ``(remaining, thread, frames)``,
    outermost first."""
    seen: list[tuple[int, int, int]] = []

    def level(tx, remaining):
        seen.append((remaining, threading.get_ident(), _frames()))
        return 1 + tx.spawn(level, remaining - 1).result() if remaining else 0

    before = sys.getrecursionlimit()
    if recursion_limit is not None:
        sys.setrecursionlimit(recursion_limit)
    try:
        with Watchdog(BOUND * 2, db.transactions.locks):
            with db.transaction() as tx:
                assert tx.spawn(level, depth).result() == depth
    finally:
        sys.setrecursionlimit(before)
    assert [remaining for remaining, _, _ in seen] == list(range(depth, -1, -1))
    return seen


def _longest_run(seen: list[tuple[int, int, int]]) -> int:
    """The most consecutive levels one thread ran."""
    longest = run = 1
    for (_, before, _), (_, thread, _) in zip(seen, seen[1:]):
        run = run + 1 if thread == before else 1
        longest = max(longest, run)
    return longest


@pytest.fixture
def patient_waiters(monkeypatch):
    """A thread that left a task to a worker waits for one to claim it as long as a loaded machine makes it
    (the pool has workers enough), instead of running it itself after ``UNCLAIMED_GRACE``: the nesting the
    tests bound is then the pool's choice, not the machine's load."""
    monkeypatch.setattr(_pool, "UNCLAIMED_GRACE", BOUND)


@pytest.mark.parametrize("limit", [None, 300])
def test_a_deep_chain_of_spawned_children_stays_off_the_recursion_limit(db, patient_waiters, limit):
    """Each child spawns one and waits for it, 150 deep: a waiting thread nests the tasks it waits for while
    its stack is shallower than half of the recursion limit, then lets a worker's fresh stack go on (the pool
    has workers enough: 32) — also under a recursion limit lowered to 300."""
    seen = _chain(db, 150, limit)
    deepest = max(frames for _, _, frames in seen)
    ceiling = (limit or sys.getrecursionlimit()) // 2 + 4 * 15   # half the limit, plus a few levels' frames
    assert deepest <= ceiling, f"a level ran {deepest} frames deep (the limit {limit or sys.getrecursionlimit()})"
    assert len({thread for _, thread, _ in seen}) > 1, "150 levels on one thread: no worker took over"


def test_a_raised_recursion_limit_still_bounds_the_nesting(db, patient_waiters):
    """Under a recursion limit raised far up (100,000), a chain of 600 spawned children nests at most
    ``MAX_NESTED_TASKS`` tasks on one thread before a worker's fresh stack goes on."""
    longest = _longest_run(_chain(db, 600, 100_000))
    assert _pool.MAX_HELP_DEPTH < longest <= _pool.MAX_NESTED_TASKS + 1, f"{longest} levels in a row on one thread"


def test_a_chain_below_the_stack_budget_runs_on_one_thread(db, patient_pool):
    """A chain of 40 spawned children, each waiting for its one child, runs on the waiting thread alone
    (helped through fresh frame-stack chunks every ``FRESH_STACK_EVERY`` levels): no hand-off."""
    threads_before = patient_pool.statistics()["threads"]
    assert {thread for _, thread, _ in _chain(db, 40)} == {threading.get_ident()}
    assert patient_pool.statistics()["threads"] == threads_before


def test_a_task_in_a_fresh_chunk_returns_and_raises_as_called():
    """``_in_fresh_chunk`` is a call: the task's result and its exception reach the caller unchanged, and
    its frame asks for more than a 16 KiB chunk can give (what makes CPython start a new one)."""
    task = _pool.Task(lambda: 42)
    assert task.claim()
    _pool._in_fresh_chunk(task.run)
    assert task.result == 42 and task.error is None
    failing = _pool.Task(lambda: 1 / 0)
    assert failing.claim()
    _pool._in_fresh_chunk(failing.run)
    assert isinstance(failing.error, ZeroDivisionError)
    assert _pool._in_fresh_chunk.__code__.co_stacksize * 8 > 16 * 1024


@pytest.mark.parametrize("value", [0, -1.0])
def test_the_hand_off_delay_must_be_positive(value):
    with pytest.raises(ValueError, match="hand_off_after"):
        _pool.WorkerPool(2, hand_off_after=value)


def test_a_deep_waiter_runs_the_task_itself_when_no_worker_takes_it(monkeypatch):
    """A thread ``MAX_HELP_DEPTH`` deep whose stack is deep leaves a task to a worker; when none claims it
    (here the only one is busy, though the pool said one could take it), the waiter runs it itself after a
    short grace."""
    pool = _pool.WorkerPool(1, name="test-deep-waiter", hand_off_after=3600.0)
    release = threading.Event()
    try:
        busy = pool.start(_pool.Task(release.wait, BOUND), eager=True)
        wait_until(lambda: busy.state is _pool.TaskState.RUNNING, BOUND, "the only worker to be busy",
                   describe=pool.statistics)
        monkeypatch.setattr(pool, "can_take_more", lambda: True)   # the race: the worker was taken meanwhile
        task = pool.start(_pool.Task(threading.get_ident))
        monkeypatch.setattr(_pool._helping, "depth", _pool.MAX_HELP_DEPTH, raising=False)
        monkeypatch.setattr(_pool, "stack_is_deep", lambda: True)
        assert task.wait(BOUND)
        assert task.result == threading.get_ident()
    finally:
        release.set()
        pool.shutdown()
