"""Active CEP Example 4 (S2PL) and Example 5 (LWM) on the engine, as named steps; and the
deliberately broken schedulers the Definition 6 checker must catch.

One health-care worker, Q1/R1 as printed and Q2 (``tests/streams/conftest.py``), the
sub-stream ``exit^2, enter^10, exit^15`` (Example 5 adds ``enter^18``).  Each
s-transaction runs on a worker thread; :class:`Gates` holds chosen ones at the
scheduler's hooks (``started``: spawned, nothing done yet; ``finishing``: its queries and
rules ran, it still holds every lock) until the test opens the gate.  What each step
waits for is read from the lock table and from the lock manager's one wait-for graph —
observable state, no sleeps — under a watchdog.

``exit^2`` changes Q1's partition of the worker (an EXIT is buffered for ``SEQ(EXIT,
!SANITIZE, ENTER)``) and ``enter^10`` is matched on that state; the state is final once
``exit^2``'s queries and rules ran (if its commit runs no rule of the database), so ``enter^10``
does not wait for ``exit^2``'s end for it (at most for its matching, an edge of kind
``stream-order``): what orders the two is the lock rule alone — under S2PL ``xl2`` waits for
``sl1``; under LWM it is granted at once, and T2 commits before the stalled T1 (Active CEP
Example 5).
"""

from __future__ import annotations

import contextlib
import random
import threading

import pytest
import sqlalchemy as sa

from activedb import Coupling, streams
from activedb.testing import StreamAnomaly, Watchdog, check_stream_history, wait_until
from tests.streams.conftest import badge, hygiene_engine, set_status, statuses

TIMEOUT = 20
EXAMPLE = [badge("EXIT", 2, location="room1"), badge("ENTER", 10, location="room2"),
           badge("EXIT", 15, location="room2")]


class Gates(streams.SchedulerHooks):
    """Holds s-transactions (by event, e.g. ``ENTER^10``) at a hook until opened."""

    def __init__(self, *held: tuple[str, str]):
        self._gates = {point: threading.Event() for point in held}
        self._reached: set[tuple[str, str]] = set()
        self._mutex = threading.Lock()

    def started(self, stransaction) -> None:
        self._at(stransaction, "started")

    def finishing(self, stransaction) -> None:
        self._at(stransaction, "finishing")

    def _at(self, stransaction, point: str) -> None:
        self.hold(stransaction.event.describe(), point)

    def hold(self, event: str, point: str) -> None:
        """Note that ``event``'s s-transaction reached ``point``; wait there while its gate is closed."""
        key = (event, point)
        with self._mutex:
            self._reached.add(key)
        gate = self._gates.get(key)
        if gate is not None and not gate.wait(TIMEOUT):
            raise AssertionError(f"gate {key} was never opened")

    def reached(self, event: str, point: str) -> bool:
        with self._mutex:
            return (event, point) in self._reached

    def open(self, event: str, point: str) -> None:
        self._gates[(event, point)].set()

    def open_all(self) -> None:
        for gate in self._gates.values():
            gate.set()


class Feed:
    """``engine.feed`` on a thread of its own (the dispatcher); ``join`` returns its result."""

    def __init__(self, engine, events):
        self.outcome: dict = {}
        self.thread = threading.Thread(target=self._run, args=(engine, events), name="dispatcher", daemon=True)
        self.thread.start()

    def _run(self, engine, events) -> None:
        try:
            self.outcome["result"] = engine.feed(events, punctuation=streams.END_OF_STREAM)
        except BaseException as error:      # noqa: BLE001 - re-raised by join
            self.outcome["error"] = error

    def join(self):
        self.thread.join(TIMEOUT)
        assert not self.thread.is_alive(), "the batch did not end"
        if "error" in self.outcome:
            raise self.outcome["error"]
        return self.outcome["result"]


def reads(engine, origin: str) -> dict:
    return {op.ts: (op.value or {}).get("status") for op in engine.history.snapshot()
            if op.kind == "read" and op.origin == origin}


def request_of(scheduler, ts):
    """The (only) lock request of the s-transaction at ``ts`` on the worker's row (once the
    dispatcher, which spawns each s-transaction as soon as its locks are in, inserted it)."""
    def found():
        table = scheduler.last_lock_table
        return [] if table is None else [request for request in table.requests("workerstatus")
                                         if request.owner.ts == ts]
    wait_until(lambda: found(), TIMEOUT, f"the dispatcher to insert the lock request at {ts}")
    (request,) = found()
    return request


def edge(db, waiter, target) -> str | None:
    """The kind of the wait-for graph's edge from ``waiter``'s subtransaction — or from a descendant of it: a query
    the s-transaction evaluates may read in a child of it, which then waits in its own name — to ``target``'s."""
    if waiter.node is None or target.node is None:
        return None                       # not spawned yet
    graph = db.transactions.locks.wait_for_graph()
    for source, destination, data in graph.edges(data=True):
        if destination == target.node.id and _within(graph, source, waiter.node.id):
            return data.get("kind")
    return None


def _within(graph, tid, ancestor) -> bool:
    """Whether ``tid`` is ``ancestor`` or a descendant of it (the graph's ``parent`` attributes)."""
    while tid is not None:
        if tid == ancestor:
            return True
        tid = graph.nodes[tid].get("parent") if tid in graph.nodes else None
    return False


def no_aborts(engine) -> bool:
    return all(op.operation == "committed" for op in engine.history.snapshot() if op.kind == "end")


def test_example_4_under_s2pl(db):
    set_status(db, w1="safe")
    gates = Gates(("EXIT^2", "finishing"), ("ENTER^10", "finishing"))
    scheduler = streams.S2PLScheduler(hooks=gates)
    engine = hygiene_engine(db, scheduler=scheduler)
    deadlocks = db.transactions.locks.statistics().deadlocks

    # Algorithm 1's lock sets: T1 = {sl1}, T2 = {sl2, xl2}, T3 = {sl3} (sl2 is part of xl2).
    plans = {event.describe(): engine.access_plan(event) for event in EXAMPLE}
    row = streams.Resource("workerstatus", ("w1",))
    assert (plans["EXIT^2"].reads, plans["EXIT^2"].writes) == ({row}, frozenset())
    assert (plans["ENTER^10"].reads, plans["ENTER^10"].writes) == ({row}, {row})
    assert (plans["EXIT^15"].reads, plans["EXIT^15"].writes) == ({row}, frozenset())

    with Watchdog(TIMEOUT, db.transactions.locks):
        feed = Feed(engine, EXAMPLE)
        # Step 1: T1 read at 2 and holds sl1; T2 and T3 are open and wait for it.
        wait_until(lambda: gates.reached("EXIT^2", "finishing"), TIMEOUT, "T1 to finish its read")
        sl1, xl2, sl3 = (request_of(scheduler, ts) for ts in (2, 10, 15))
        assert [sl1.describe(), xl2.describe(), sl3.describe()] == [
            "sl_S0(workerstatus['w1'])", "xl_S1(workerstatus['w1'])", "sl_S2(workerstatus['w1'])"]
        assert sl1.held and not xl2.held
        assert scheduler.last_lock_table.blocking(xl2) is sl1.owner      # xl2 delayed until T1 releases
        assert scheduler.last_lock_table.blocking(sl3) is xl2.owner      # sl3 queued behind xl2: no overtaking
        wait_until(lambda: edge(db, xl2.owner, sl1.owner) == "stream-s2pl"
                   and edge(db, sl3.owner, xl2.owner) == "stream-s2pl", TIMEOUT, "T2 to wait for sl1, T3 for xl2")
        assert not gates.reached("ENTER^10", "finishing")

        # Step 2: T1 ends; T2 reads safe at 10, R1 writes warning; T2 holds xl2.
        gates.open("EXIT^2", "finishing")
        wait_until(lambda: gates.reached("ENTER^10", "finishing"), TIMEOUT, "T2 to finish")
        # T3 now waits for T2's xl2 — a lock wait, an edge of the one wait-for graph.
        wait_until(lambda: edge(db, sl3.owner, xl2.owner) == "stream-s2pl", TIMEOUT, "sl3 to wait for xl2")
        assert [(wait.waiter, wait.blocker) for wait in scheduler.last_lock_table.waits()] == [("S2", "S1")]
        assert 15 not in reads(engine, "Q2")

        # Step 3: T2 ends; sl3 is granted and Q2 reads warning at 15.
        gates.open("ENTER^10", "finishing")
        result = feed.join()

    assert [(output.query, output.ts) for output in result.outputs] == [("Q1", 10)]
    assert reads(engine, "Q2") == {2: "safe", 15: "warning"}
    assert statuses(db) == {"w1": "warning"}
    check_stream_history(engine.history.snapshot()).assert_ok()
    assert no_aborts(engine) and db.transactions.locks.statistics().deadlocks == deadlocks
    assert scheduler.statistics().lock_waits == 2


def test_example_5_under_lwm(db):
    """Active CEP Example 5: ``xl2`` at 10 is granted at once (read locks do not block writes),
    T2 commits while T1 still holds ``sl1``; ``sl3`` at 15 waits for the low-water mark, not
    for T1."""
    set_status(db, w1="safe")
    events = [*EXAMPLE, badge("ENTER", 18, location="room1")]
    gates = Gates(("EXIT^2", "finishing"), ("ENTER^10", "finishing"), ("EXIT^15", "finishing"))
    scheduler = streams.LWMScheduler(hooks=gates)
    engine = hygiene_engine(db, scheduler=scheduler)
    deadlocks = db.transactions.locks.statistics().deadlocks

    with Watchdog(TIMEOUT, db.transactions.locks):
        feed = Feed(engine, events)
        # T1 read at 2 (sl1 granted, it sees (-inf, safe)) and is held holding sl1; T2 reads safe
        # at 10 and writes (10, warning) meanwhile.
        wait_until(lambda: gates.reached("EXIT^2", "finishing") and gates.reached("ENTER^10", "finishing"),
                   TIMEOUT, "T1 to read and T2 to write while T1 holds sl1")
        owners = {ts: request_of(scheduler, ts).owner for ts in (2, 10, 15, 18)}
        table = scheduler.last_lock_table
        assert not owners[2].ended and reads(engine, "Q2") == {2: "safe"} and reads(engine, "Q1") == {10: "safe"}
        # sl3^15 is delayed by the lwm (T2 may still write at 10), not by T1.
        wait_until(lambda: edge(db, owners[15], owners[10]) == "stream-lwm", TIMEOUT, "sl3 to wait for the lwm")
        assert 15 not in reads(engine, "Q2")

        # T2 ends before T1: the lwm moves past 15, sl3^15 is granted and reads (10, warning).
        gates.open("ENTER^10", "finishing")
        wait_until(lambda: gates.reached("EXIT^15", "finishing"), TIMEOUT, "T3 to read")
        assert table.lwm("workerstatus", ("w1",)) in (owners[18], None)   # enter^18's write lock, or it ended
        assert owners[10].ended and not owners[2].ended
        assert reads(engine, "Q2") == {2: "safe", 15: "warning"}
        gates.open("EXIT^15", "finishing")
        gates.open("EXIT^2", "finishing")
        result = feed.join()

    history = engine.history.snapshot()
    (read_15,) = [op for op in history if op.kind == "read" and op.origin == "Q2" and op.ts == 15]
    (write_10,) = [op for op in history if op.kind == "write" and op.ts == 10]
    assert read_15.value == {"workerid": "w1", "status": "warning"} and read_15.read_from == write_10.sequence
    assert commits(engine).index("ENTER^10") < commits(engine).index("EXIT^2")
    assert reads(engine, "Q1") == {10: "safe", 18: "warning"}     # enter^18 reads after T2: no second match
    assert [(output.query, output.ts) for output in result.outputs] == [("Q1", 10)]
    assert statuses(db) == {"w1": "warning"}
    check_stream_history(history).assert_ok()
    assert no_aborts(engine) and db.transactions.locks.statistics().deadlocks == deadlocks
    assert scheduler.statistics().versions_written == 1


def commits(engine) -> list[str]:
    """The events whose s-transactions committed, in the order they committed."""
    return [op.event for op in engine.history.snapshot() if op.kind == "end" and op.operation == "committed"]


@pytest.mark.parametrize("granularity", ["tuple", "table"])
@pytest.mark.parametrize("name", ["lwm", "s2pl"])
def test_example_5_t2_commits_before_the_stalled_t1_under_lwm_only(db, name, granularity):
    """Q1/R1 as printed and Q2; ``exit^2, enter^10, exit^15``; T1 (``exit^2``) is stalled
    through the ``finishing`` hook, after its Read was granted.  LWM: T2 (``enter^10``) is
    granted its write lock at once and commits before T1.  S2PL: it waits for T1's read lock
    and commits after it.  Definition 6 holds either way."""
    set_status(db, w1="safe")
    gates = Gates(("EXIT^2", "finishing"))
    make = streams.LWMScheduler if name == "lwm" else streams.S2PLScheduler
    scheduler = make(granularity=granularity, hooks=gates)
    engine = hygiene_engine(db, scheduler=scheduler)
    with Watchdog(TIMEOUT, db.transactions.locks):
        feed = Feed(engine, EXAMPLE)
        wait_until(lambda: gates.reached("EXIT^2", "finishing"), TIMEOUT, "T1 to read at 2")
        t1 = request_of(scheduler, 2).owner
        if name == "lwm":
            wait_until(lambda: "ENTER^10" in commits(engine), TIMEOUT, "T2 to commit while T1 is stalled")
            assert "EXIT^2" not in commits(engine) and not t1.ended
        else:
            t2 = request_of(scheduler, 10).owner
            wait_until(lambda: edge(db, t2, t1) == "stream-s2pl", TIMEOUT, "T2 to wait for T1's read lock")
            assert commits(engine) == []
        gates.open("EXIT^2", "finishing")
        result = feed.join()
    order = commits(engine)
    assert sorted(order) == ["ENTER^10", "EXIT^15", "EXIT^2"]
    if name == "lwm":
        assert order.index("ENTER^10") < order.index("EXIT^2")
    else:
        assert order.index("EXIT^2") < order.index("ENTER^10")
    assert reads(engine, "Q2") == {2: "safe", 15: "warning"} and reads(engine, "Q1") == {10: "safe"}
    assert [(output.query, output.ts) for output in result.outputs] == [("Q1", 10)]
    assert statuses(db) == {"w1": "warning"}
    check_stream_history(engine.history.snapshot()).assert_ok()
    assert no_aborts(engine)


@pytest.mark.parametrize("name", ["lwm", "s2pl"])
def test_workers_bounds_the_unfinished_s_transactions_not_the_distance_from_the_oldest(db, name):
    """``workers=2``: with the oldest s-transaction stalled, a third independent one (another
    worker's row) still starts once the second has ended — at most 2 unfinished at once."""
    set_status(db, w1="safe", w2="safe", w3="safe")
    gates = Gates(("EXIT^2", "started"))
    scheduler = (streams.LWMScheduler if name == "lwm" else streams.S2PLScheduler)(workers=2, hooks=gates)
    engine = hygiene_engine(db, scheduler=scheduler)
    with Watchdog(TIMEOUT, db.transactions.locks):
        feed = Feed(engine, [badge("EXIT", 2, "w1"), badge("EXIT", 3, "w2"), badge("EXIT", 4, "w3")])
        wait_until(lambda: gates.reached("EXIT^4", "started"), TIMEOUT, "EXIT^4 to start beside the stalled EXIT^2")
        assert "EXIT^3" in commits(engine) and "EXIT^2" not in commits(engine)
        gates.open("EXIT^2", "started")
        feed.join()
    assert sorted(commits(engine)) == ["EXIT^2", "EXIT^3", "EXIT^4"]
    check_stream_history(engine.history.snapshot()).assert_ok()


def test_lwm_reads_never_block_writes_and_see_the_older_version(db):
    """A Read at 1 held back until after a Write at 5 committed still sees the value before
    it (multi-versioning); under S2PL the same Write waits for the Read instead."""
    for name, scheduler_class in (("lwm", streams.LWMScheduler), ("s2pl", streams.S2PLScheduler)):
        set_status(db, w1="safe")
        gates = Gates(("A^1", "started"))
        scheduler = scheduler_class(hooks=gates)
        engine = streams.StreamEngine(db, name=f"rw-{name}", scheduler=scheduler, record_history=True)
        engine.create_stream("s", types=("A", "B"), attributes=("HCW-ID",))
        engine.define("""
            CREATE QUERY QA PATTERN SEQ(A) WHERE 'safe' = (SELECT status FROM workerStatus WHERE workerID = A.HCW-ID)
            RETURN A.HCW-ID
            CREATE QUERY QB PATTERN SEQ(B) RETURN B.HCW-ID
            CREATE RULE RB ON OUTPUT QB BEGIN UPDATE workerStatus SET status = 'warning' WHERE workerID = NEW.HCW-ID END
        """)
        events = [streams.StreamEvent("A", 1, {"HCW-ID": "w1"}), streams.StreamEvent("B", 5, {"HCW-ID": "w1"})]
        with Watchdog(TIMEOUT, db.transactions.locks):
            feed = Feed(engine, events)
            wait_until(lambda: gates.reached("A^1", "started"), TIMEOUT, "the reader to be held")
            writer = request_of(scheduler, 5)
            if name == "lwm":
                wait_until(lambda: any(op.kind == "end" and op.ts == 5 for op in engine.history.snapshot()),
                           TIMEOUT, "the write at 5 to commit while the read at 1 is open")
            else:
                reader = request_of(scheduler, 1)
                wait_until(lambda: edge(db, writer.owner, reader.owner) == "stream-s2pl", TIMEOUT,
                           "the write at 5 to wait for the read at 1")
            gates.open("A^1", "started")
            result = feed.join()
        assert [output.query for output in result.outputs] == ["QA", "QB"]    # the read at 1 saw safe
        check_stream_history(engine.history.snapshot()).assert_ok()
        assert statuses(db) == {"w1": "warning"}


class OvertakingS2PL(streams.S2PLLockTable):
    """Broken on purpose: waits only for conflicting requests already *held*, so a later
    compatible read passes an earlier waiting write."""

    def blocker(self, request, mode):
        for other in self._tables[request.table].requests:
            if (other.owner is not request.owner and other.held and not other.owner.ended
                    and (other.key is None or request.key is None or other.key == request.key)
                    and (other.mode is streams.LockMode.WRITE or request.mode is streams.LockMode.WRITE)):
                return other.owner, False
        return None, False


class ReadAboveLWM(streams.LWMLockTable):
    """Broken on purpose: grants every Read, even above the low-water mark."""

    def blocker(self, request, mode):
        if mode is streams.LockMode.READ:
            return None, False
        return super().blocker(request, mode)


@pytest.mark.parametrize("scheduler_class, broken", [
    (streams.S2PLScheduler, None), (streams.S2PLScheduler, OvertakingS2PL),
    (streams.LWMScheduler, None), (streams.LWMScheduler, ReadAboveLWM)],
    ids=["s2pl", "s2pl-overtaking", "lwm", "lwm-read-above-lwm"])
def test_the_checker_catches_broken_schedulers(db, scheduler_class, broken):
    """T2 (enter^10) is held before it does anything; T3 (exit^15) then asks to read.  A
    correct scheduler makes T3 wait for T2's write; a broken one lets T3 read the value
    from before T2's write — the write-too-late of Example 3, which the checker reports."""
    set_status(db, w1="safe")
    gates = Gates(("ENTER^10", "started"))
    scheduler = scheduler_class(hooks=gates, lock_table=broken)
    engine = hygiene_engine(db, scheduler=scheduler)
    with Watchdog(TIMEOUT, db.transactions.locks):
        feed = Feed(engine, EXAMPLE)
        wait_until(lambda: gates.reached("ENTER^10", "started"), TIMEOUT, "T2 to be held")
        t2, t3 = request_of(scheduler, 10).owner, request_of(scheduler, 15).owner
        if broken is None:
            wait_until(lambda: edge(db, t3, t2) == scheduler.lock_table_class.kind, TIMEOUT, "T3 to wait for T2")
        else:
            wait_until(lambda: gates.reached("EXIT^15", "finishing"), TIMEOUT, "T3 to read past T2")
        gates.open("ENTER^10", "started")
        feed.join()
    report = check_stream_history(engine.history.snapshot())
    if broken is None:
        report.assert_ok()
        assert reads(engine, "Q2") == {2: "safe", 15: "warning"}
    else:
        assert reads(engine, "Q2") == {2: "safe", 15: "safe"}
        assert [(violation.kind, violation.clause) for violation in report.violations] == [
            (StreamAnomaly.WRITE_TOO_LATE, "(1)")]
        (violation,) = report.violations
        assert (violation.read.origin, violation.read.ts) == ("Q2", 15)
        assert (violation.write.origin, violation.write.ts) == ("R1", 10)


# Example 5 with a T1 that still has work after its pattern matched: QR reads the worker's status at his EXIT
# and its rule RR writes an alert (the reading query's output fires a rule, as a query-rule pair does).
READ_AT_EXIT = """
CREATE QUERY QR ON estream PATTERN SEQ(EXIT) WHERE 'safe' = (SELECT status FROM workerStatus WHERE workerID = EXIT.HCW-ID)
RETURN EXIT.HCW-ID, EXIT.location
CREATE RULE RR ON OUTPUT QR BEGIN INSERT INTO stream_alerts (worker, location) VALUES (NEW.HCW-ID, NEW.location) END
"""


def example_5_around(seed: int) -> list:
    """``exit^2`` (T1) and ``enter^10`` (T2) of worker w1, Q1 matching them, among events drawn by ``seed``: w1's
    before T1 that leave him safe and Q1's partition without an EXIT, MASKs of w1 between T1 and T2 (Q2's
    partition only), other workers' badge events (no EXIT between T1 and T2), and w1's after T2 (an EXIT reads
    T2's write)."""
    rng = random.Random(seed)

    def others(low: float, high: float, types=("EXIT", "ENTER", "SANITIZE", "MASK")) -> list:
        return [badge(rng.choice(types), round(rng.uniform(low, high), 3), rng.choice(("w2", "w3")),
                      rng.choice(("room1", "room2"))) for _ in range(rng.randint(1, 3))]

    before = [badge(rng.choice(("ENTER", "SANITIZE", "MASK")), round(rng.uniform(0.1, 1.9), 3), "w1")
              for _ in range(rng.randint(0, 2))]
    between = [badge("MASK", round(rng.uniform(2.1, 9.9), 3), "w1") for _ in range(rng.randint(0, 1))]
    after = [badge(rng.choice(("EXIT", "SANITIZE", "ENTER")), round(rng.uniform(10.1, 20), 3), "w1",
                   rng.choice(("room1", "room2"))) for _ in range(rng.randint(1, 2))]
    # No other EXIT between T1 and T2: its RR would insert an alert after T1's, wait for T1's write lock on the
    # alerts (the lock rule: T1 holds it while stalled) and, at table locks, hold T2 behind its own write lock.
    events = [*before, *others(0.1, 1.9), badge("EXIT", 2, "w1", "room1"), *between,
              *others(2.1, 9.9, ("ENTER", "SANITIZE", "MASK")),
              badge("ENTER", 10, "w1", "room2"), *after, *others(10.1, 20)]
    rng.shuffle(events)             # arrival order; the reorder buffer releases them in the declared order
    return events


def example_5_outcome(db, engine, result) -> tuple:
    with db.engine.connect() as connection:
        alerts = sorted(connection.execute(sa.text("SELECT worker, location FROM stream_alerts")).all())
    return statuses(db), alerts, [(output.query, output.ts, dict(output.attributes)) for output in result.outputs]


@pytest.mark.parametrize("commit_work", [False, True], ids=["decided", "rule-at-commit"])
@pytest.mark.parametrize("granularity", ["tuple", "table"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_example_5_t2_is_not_held_behind_t1_once_t1_is_decided(db, seed, granularity, commit_work):
    """Active CEP Example 5 under LWM with T1 (``exit^2``) stalled through ``finishing`` after its queries and
    rules ran — its reading query QR matched and RR wrote an alert.  T2 (``enter^10``) is matched on T1's EXIT
    and writes the worker's row at 10 while T1 still holds its read at 2.  ``decided``: nothing can abort T1
    any more, and T2 commits before it (the paper: "Before the s-transaction T2 ... ends, the read lock sl_1 is
    granted", and read locks do not block writes).  ``rule-at-commit``: a deferred rule of the database hears
    the alerts T1 wrote, so T1's commit may still fail and take its EXIT with it: T2 writes and finishes
    everything but its commit while T1 is stalled (the ``finishing`` hook), then waits for T1's commit.  The
    result is SEI's and Definition 6 holds, for events drawn around the two by ``seed``."""
    events = example_5_around(seed)
    set_status(db, w1="safe", w2="safe", w3="safe")
    reference = hygiene_engine(db, name=f"example-5-sei-{seed}")
    reference.define(READ_AT_EXIT)
    expected = example_5_outcome(db, reference, reference.feed(events, punctuation=streams.END_OF_STREAM))
    with db.engine.begin() as connection:
        connection.execute(sa.text("TRUNCATE stream_alerts"))
    set_status(db, w1="safe", w2="safe", w3="safe")
    gates = Gates(("EXIT^2", "finishing"))
    scheduler = streams.LWMScheduler(granularity=granularity, hooks=gates, workers=16)
    engine = hygiene_engine(db, name=f"example-5-lwm-{seed}", scheduler=scheduler)
    engine.define(READ_AT_EXIT)
    with contextlib.ExitStack() as stack:
        if commit_work:
            db.rule(on=db.inserted("stream_alerts"), coupling=Coupling.DEFERRED, name="alerts_heard")(
                lambda tx, event: None)
            stack.callback(db.rules.remove, "alerts_heard")
        stack.enter_context(Watchdog(TIMEOUT, db.transactions.locks))
        feed = Feed(engine, events)
        wait_until(lambda: gates.reached("EXIT^2", "finishing"), TIMEOUT, "T1 to run its queries and rules")
        t1, t2 = request_of(scheduler, 2).owner, request_of(scheduler, 10).owner
        if commit_work:
            wait_until(lambda: gates.reached("ENTER^10", "finishing"), TIMEOUT,
                       "T2 to write and finish everything but its commit while T1 is stalled")
            wait_until(lambda: edge(db, t2, t1) == "stream-order", TIMEOUT, "T2 to wait for T1's commit")
            assert "ENTER^10" not in commits(engine)
        else:
            wait_until(lambda: "ENTER^10" in commits(engine), TIMEOUT, "T2 to commit while T1 is stalled")
        assert [op.ts for op in engine.history.snapshot() if op.kind == "write" and op.origin == "R1"
                and op.key == ("w1",)] == [10]
        assert "EXIT^2" not in commits(engine) and not t1.ended
        gates.open("EXIT^2", "finishing")
        result = feed.join()
    order = commits(engine)
    assert (order.index("ENTER^10") > order.index("EXIT^2")) == commit_work
    assert example_5_outcome(db, engine, result) == expected
    check_stream_history(engine.history.snapshot()).assert_ok()
    assert no_aborts(engine) and scheduler.statistics().restarts == 0
