"""LWM with a writer that also reads (the read-heavy mixes of Active CEP §6: readN Reads per s-transaction, a
quarter of them writing): the writer's Write runs before its other queries, and the low-water mark moves past
it once it has written — not after all its Reads (the design note's "Writes first under LWM").

``W^1`` fires ``RW`` (worker w1's status to warning, a Read and a Write) and evaluates ``QC``, a query without
a rule that reads a cell; ``R^2`` reads w1's status.  ``W^1`` is held at the first Read after its Write (the
engine's ``store_operation`` hook) and at ``finishing``; what each step waits for is read from the history, the
hooks and the wait-for graph — no sleeps.  SEI's result is the reference.
"""

from __future__ import annotations

import random
import threading

import pytest
import sqlalchemy as sa

from activedb import streams
from activedb.testing import Watchdog, check_stream_history, wait_until
from tests.streams.conftest import set_status, statuses
from tests.streams.test_overlay import OverlayCase
from tests.streams.test_randomized import reset as reset_cases
from tests.streams.test_scheduler_examples import TIMEOUT, Feed, Gates, commits, edge, request_of
from tests.streams.test_schedulers_randomized import Case
from tests.streams.test_schedulers_randomized import outcome as scheduler_outcome

DEFINITIONS = """
CREATE QUERY QW PATTERN SEQ(W) RETURN W.HCW-ID
CREATE RULE RW ON OUTPUT QW BEGIN UPDATE workerStatus SET status = 'warning' WHERE workerID = NEW.HCW-ID END
CREATE QUERY QC PATTERN SEQ(W) WHERE 1 / (SELECT value FROM stream_cells WHERE cell = W.c) > 0 RETURN W.HCW-ID
CREATE QUERY QR PATTERN SEQ(R) WHERE 'violation' != (SELECT status FROM workerStatus WHERE workerID = R.HCW-ID)
RETURN R.HCW-ID
"""


class HeldAfterWrite(Gates):
    """Gates at the scheduler's hooks, and one more: ``W^1``'s first store operation that is a Read after a
    Write of its own (``read-after-write``)."""

    def __init__(self, *held: tuple[str, str]):
        super().__init__(("W^1", "read-after-write"), *held)
        self._local = threading.local()

    def started(self, stransaction) -> None:
        self._local.event, self._local.wrote = stransaction.event.describe(), False
        super().started(stransaction)

    def operation(self, kind: str) -> None:
        event = getattr(self._local, "event", None)
        if kind == "write":
            self._local.wrote = True
        elif event == "W^1" and self._local.wrote:
            self._local.wrote = False
            self.hold(event, "read-after-write")


class HeldEngine(streams.StreamEngine):
    """An engine whose store operations pass through the test's gates (the documented extension hook)."""

    def __init__(self, *args, gates: HeldAfterWrite, **options):
        self.gates = gates
        super().__init__(*args, **options)

    def store_operation(self, kind: str) -> None:
        self.gates.operation(kind)


def engine_with(db, scheduler, name: str, gates: HeldAfterWrite | None = None) -> streams.StreamEngine:
    options = dict(name=name, scheduler=scheduler, record_history=True)
    engine = HeldEngine(db, gates=gates, **options) if gates is not None else streams.StreamEngine(db, **options)
    engine.create_stream("s", types=("W", "R"), attributes=("HCW-ID", "c"))
    engine.define(DEFINITIONS)
    return engine


def events(seed: int) -> list[streams.StreamEvent]:
    """``W^1`` and ``R^2`` of w1, and a reader of w2 at 3 (no conflict), in an arrival order drawn by ``seed``."""
    drawn = [streams.StreamEvent("W", 1, {"HCW-ID": "w1", "c": 1}), streams.StreamEvent("R", 2, {"HCW-ID": "w1"}),
             streams.StreamEvent("R", 3, {"HCW-ID": "w2"})]
    random.Random(seed).shuffle(drawn)
    return drawn


def reset(db, cell_value: int) -> None:
    set_status(db, w1="safe", w2="safe")
    with db.engine.begin() as connection:
        connection.execute(sa.text("INSERT INTO stream_cells (cell, value) VALUES (1, :v) ON CONFLICT (cell) DO "
                                   "UPDATE SET value = excluded.value"), {"v": cell_value})


def outcome(db, engine, result) -> tuple:
    reads = sorted((op.ts, (op.value or {}).get("status")) for op in engine.history.snapshot()
                   if op.kind == "read" and op.origin == "QR" and _committed(engine, op.unit))
    return (statuses(db), reads, [(output.query, output.ts) for output in result.outputs],
            [letter.event.describe() for letter in result.dead_letters])


def _committed(engine, unit: str) -> bool:
    return any(op.kind == "end" and op.unit == unit and op.operation == "committed" for op in engine.history.snapshot())


@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize("granularity", ["tuple", "table"])
@pytest.mark.parametrize("cell", [1, 0], ids=["writer-decided", "writer-fails-after-writing"])
def test_a_reader_is_not_held_behind_a_writer_s_other_reads(db, cell, granularity, seed):
    """``W^1`` writes w1's status, then (held) still has QC to evaluate.  LWM moved the low-water mark past it
    when it wrote: ``R^2`` reads W^1's version (warning) and finishes everything but its commit while ``W^1``
    is held — its commit waits for ``W^1`` to be decided.  ``writer-decided``: QC passes, ``R^2`` commits
    while ``W^1`` is still held at ``finishing``.  ``writer-fails-after-writing``: QC divides by zero after
    ``W^1`` wrote, ``W^1`` aborts (a dead letter), and ``R^2``, which read its version, is run again and reads
    the status from before it (safe).  Either way the result is SEI's and Definition 6 holds."""
    reset(db, cell)
    reference = engine_with(db, "sei", f"writes-first-sei-{seed}")
    expected = outcome(db, reference, reference.feed(events(seed), punctuation=streams.END_OF_STREAM))
    reset(db, cell)
    gates = HeldAfterWrite(("W^1", "finishing"))
    scheduler = streams.LWMScheduler(granularity=granularity, hooks=gates)
    engine = engine_with(db, scheduler, f"writes-first-lwm-{seed}", gates)
    with Watchdog(TIMEOUT, db.transactions.locks):
        feed = Feed(engine, events(seed))
        wait_until(lambda: gates.reached("W^1", "read-after-write"), TIMEOUT,
                   "W^1 to write first and reach QC's Read")
        writer, reader = request_of(scheduler, 1).owner, request_of(scheduler, 2).owner
        wait_until(lambda: gates.reached("R^2", "finishing"), TIMEOUT,
                   "R^2 to read W^1's version and finish everything but its commit while W^1 is held")
        assert [(op.ts, op.value["status"]) for op in engine.history.snapshot()
                if op.kind == "read" and op.origin == "QR" and op.ts == 2] == [(2, "warning")]
        wait_until(lambda: edge(db, reader, writer) == "stream-order", TIMEOUT, "R^2's commit to wait for W^1")
        assert not writer.ended and "R^2" not in commits(engine)
        gates.open("W^1", "read-after-write")
        if cell:
            wait_until(lambda: "R^2" in commits(engine), TIMEOUT, "R^2 to commit while W^1 is held at finishing")
            assert gates.reached("W^1", "finishing") and not writer.ended
        gates.open_all()
        result = feed.join()
    assert outcome(db, engine, result) == expected
    order = commits(engine)
    if cell:
        assert order.index("R^2") < order.index("W^1") and scheduler.statistics().restarts == 0
    else:
        assert "W^1" not in order and scheduler.statistics().restarts == 1
    assert scheduler.statistics().early_releases == 1
    check_stream_history(engine.history.snapshot()).assert_ok()



CHAINED = """
CREATE QUERY QW PATTERN SEQ(W) RETURN W.HCW-ID, W.mark
CREATE RULE RW ON OUTPUT QW BEGIN UPDATE workerStatus SET status = status + NEW.mark WHERE workerID = NEW.HCW-ID END
CREATE QUERY QC PATTERN SEQ(W) WHERE 1 / (SELECT value FROM stream_cells WHERE cell = W.c) > 0 RETURN W.HCW-ID
CREATE QUERY QR PATTERN SEQ(R) WHERE 'violation' != (SELECT status FROM workerStatus WHERE workerID = R.HCW-ID)
RETURN R.HCW-ID
"""


def chained_engine(db, scheduler, name: str, gates: HeldAfterWrite | None = None) -> streams.StreamEngine:
    options = dict(name=name, scheduler=scheduler, record_history=True)
    engine = HeldEngine(db, gates=gates, **options) if gates is not None else streams.StreamEngine(db, **options)
    engine.create_stream("s", types=("W", "R"), attributes=("HCW-ID", "c", "mark"))
    engine.define(CHAINED)
    return engine


@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize("granularity", ["tuple", "table"])
def test_a_chain_of_early_writers_is_run_again_when_the_first_fails(db, granularity, seed):
    """``W^1`` appends 1 to w1's status and releases its write lock, held before QC (which then fails: a division
    by zero); ``W^2`` appends 2 on top of W^1's version — in an attempt, it releases early too — and ``R^3``
    reads W^2's version.  When ``W^1`` fails, ``W^2`` takes its locks back and runs again on the status before
    ``W^1`` (safe2), and ``R^3``, which depended on ``W^2``'s first attempt, runs again and reads safe2: SEI's
    result, Definition 6 on the history."""
    drawn = [streams.StreamEvent("W", 1, {"HCW-ID": "w1", "c": 1, "mark": "1"}),
             streams.StreamEvent("W", 2, {"HCW-ID": "w1", "c": 2, "mark": "2"}),
             streams.StreamEvent("R", 3, {"HCW-ID": "w1"})]
    random.Random(seed).shuffle(drawn)

    def prepare() -> None:
        reset(db, 0)
        with db.engine.begin() as connection:
            connection.execute(sa.text("INSERT INTO stream_cells (cell, value) VALUES (2, 1) ON CONFLICT (cell) DO "
                                       "UPDATE SET value = excluded.value"))

    prepare()
    reference = chained_engine(db, "sei", f"chained-sei-{seed}")
    expected = outcome(db, reference, reference.feed(drawn, punctuation=streams.END_OF_STREAM))
    assert expected[0]["w1"] == "safe2" and expected[1] == [(3, "safe2")]
    prepare()
    gates = HeldAfterWrite()
    scheduler = streams.LWMScheduler(granularity=granularity, hooks=gates)
    engine = chained_engine(db, scheduler, f"chained-lwm-{seed}", gates)
    with Watchdog(TIMEOUT, db.transactions.locks):
        feed = Feed(engine, drawn)
        wait_until(lambda: gates.reached("W^1", "read-after-write"), TIMEOUT, "W^1 to write and release")
        wait_until(lambda: [(op.ts, op.value["status"]) for op in engine.history.snapshot()
                            if op.kind == "read" and op.origin == "QR"] == [(3, "safe12")], TIMEOUT,
                   "R^3 to read W^2's version, built on W^1's")
        first, second, reader = (request_of(scheduler, ts).owner for ts in (1, 2, 3))
        wait_until(lambda: edge(db, second, first) == "stream-order" and edge(db, reader, second) == "stream-order",
                   TIMEOUT, "W^2 to wait for W^1's decision and R^3 for W^2's")
        assert commits(engine) == []
        gates.open_all()
        result = feed.join()
    assert outcome(db, engine, result) == expected
    assert commits(engine) == ["W^2", "R^3"] and scheduler.statistics().restarts == 2
    check_stream_history(engine.history.snapshot()).assert_ok()


# Cases of the overlay's drawing whose batches leave Writes in the versions (most do not: their plans read no
# row their rules write).
DEFERRING = [(4, "tuple"), (5, "table"), (9, "tuple"), (10, "tuple"), (10, "table")]


@pytest.mark.parametrize(("number", "granularity"), DEFERRING)
def test_deferred_writes_leave_sei_s_result(db, number, granularity):
    """LWM's Writes of rows the batch's plans read stay in the versions and are made in the batch's transaction
    at its end (the design note's "What a Read sees").  The overlay's randomised cases reach every kind of them:
    an INSERT keyed by the event (a duplicate key when the cell exists), a DELETE then an INSERT of one cell, a
    value the column refuses (the event's dead letter, not the batch's failure), a patch of a cell no row holds
    (an upsert: the columns not given keep PostgreSQL's defaults).  The store, outputs, dead letters and Writes
    are SEI's."""
    case = OverlayCase(number)
    reset_cases(db)
    reference = case.engine(db, f"deferred-sei-{granularity}", lowered=False)
    result = reference.feed(case.events, punctuation=streams.END_OF_STREAM)
    expected = scheduler_outcome(db, reference, list(result.outputs), list(result.dead_letters))
    reset_cases(db)
    scheduler = streams.LWMScheduler(granularity=granularity, workers=8)
    engine = Case.engine(case, db, f"deferred-lwm-{granularity}", scheduler)
    for rule in case.extra:
        engine.define(rule)
    with Watchdog(60, db.transactions.locks):
        result = engine.feed(case.events, punctuation=streams.END_OF_STREAM)
    got = scheduler_outcome(db, engine, list(result.outputs), list(result.dead_letters))
    for part in ("store", "dead letters", "firings", "processed"):
        assert got[part] == expected[part], f"{part} differ from SEI's; {case.describe()}"
    assert scheduler.statistics().deferred_writes > 0
    check_stream_history(engine.history.snapshot()).assert_ok()
