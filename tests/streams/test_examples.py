"""Active CEP §2, Examples 1–3, as named steps.

One health-care worker, ``workerStatus`` holds his status (``safe`` before time 10), the
sub-stream ``exit^2, enter^10, exit^15`` (ENTER into another room than the EXIT, so Q1
matches at 10), Q1/R1 as printed in §3.1 and Q2 of §2.

* Under **SEI** the s-transactions run one at a time in timestamp order: Example 1's store
  and reads, and the Definition 6 checker passes.
* In the **unscheduled** mode every query is an operator of its own (push-based, no
  s-transactions); a sequencer puts the operators' steps in the order of the example
  (each step waits until the previous one has committed — no sleeps).  The checker
  reports Example 2's read-too-late and Example 3's write-too-late: proof that it can fail.
"""

from __future__ import annotations

import threading

import pytest

from activedb import streams
from activedb.testing import StreamAnomaly, Watchdog, check_stream_history
from tests.streams.conftest import badge, hygiene_engine, set_status, statuses

TIMEOUT = 20

SUBSTREAM = [badge("EXIT", 2, location="room1"), badge("ENTER", 10, location="room2"),
             badge("EXIT", 15, location="room2")]


class StepOrder:
    """The operators' steps in a given order: ``before`` blocks an operator until its step is
    next; ``after`` (called once the step committed) lets the next one go."""

    def __init__(self, steps: list[str]):
        self.steps = steps
        self.done: list[str] = []
        self._condition = threading.Condition()

    def before(self, query: str, event: streams.StreamEvent) -> None:
        name = f"{query} evaluates {event.describe()}"
        assert name in self.steps, f"unexpected step {name!r}"
        with self._condition:
            if not self._condition.wait_for(lambda: self.steps[len(self.done)] == name, TIMEOUT):
                raise AssertionError(f"step {name!r} never got its turn; done so far: {self.done}")

    def after(self, query: str, event: streams.StreamEvent) -> None:
        with self._condition:
            self.done.append(f"{query} evaluates {event.describe()}")
            self._condition.notify_all()


def reads(engine, origin: str) -> dict:
    """The status each Read of ``origin`` (a query) saw, by the read's timestamp."""
    return {op.ts: (op.value or {}).get("status") for op in engine.history.snapshot()
            if op.kind == "read" and op.origin == origin}


def run_unscheduled(db, steps: list[str]):
    order = StepOrder(steps)
    scheduler = streams.UnscheduledScheduler(before_step=order.before, after_step=order.after)
    engine = hygiene_engine(db, scheduler=scheduler)
    with Watchdog(TIMEOUT, db.transactions.locks):
        engine.feed(SUBSTREAM, punctuation=streams.END_OF_STREAM)
    assert order.done == steps
    return engine


def test_example_1_under_sei(db):
    set_status(db, w1="safe")
    engine = hygiene_engine(db)
    result = engine.feed(SUBSTREAM, punctuation=streams.END_OF_STREAM)

    # enter^10 matches Q1 (EXIT room1 at 2, no SANITIZE, ENTER room2 at 10, safe at 10); R1 writes warning.
    assert [(output.query, output.ts, dict(output.attributes)) for output in result.outputs] == [
        ("Q1", 10, {"HCW-ID": "w1", "location": "room2"})]
    assert statuses(db) == {"w1": "warning"}
    assert reads(engine, "Q2") == {2: "safe", 15: "warning"}     # Read_Q2 at 2 and at 15
    assert reads(engine, "Q1") == {10: "safe"}                   # Read_Q1 at 10
    check_stream_history(engine.history.snapshot()).assert_ok()


def test_example_1_q2_output_under_sei(db):
    """With a MASK 3 s before the second EXIT, Q2 matches at 15 because R1's write at 10 is seen."""
    set_status(db, w1="safe")
    engine = hygiene_engine(db)
    result = engine.feed([*SUBSTREAM, badge("MASK", 12, location="room2")], punctuation=streams.END_OF_STREAM)
    assert [(output.query, output.ts) for output in result.outputs] == [("Q1", 10), ("Q2", 15)]
    check_stream_history(engine.history.snapshot()).assert_ok()


def test_example_1_order_is_correct_in_the_unscheduled_mode_too(db):
    """The checker does not cry wolf: the unscheduled mode in Example 1's order is correct."""
    set_status(db, w1="safe")
    engine = run_unscheduled(db, ["Q1 evaluates EXIT^2", "Q2 evaluates EXIT^2", "Q1 evaluates ENTER^10",
                                  "Q1 evaluates EXIT^15", "Q2 evaluates EXIT^15"])
    assert reads(engine, "Q2") == {2: "safe", 15: "warning"}
    check_stream_history(engine.history.snapshot()).assert_ok()


def test_example_2_read_too_late(db):
    set_status(db, w1="safe")
    engine = run_unscheduled(db, ["Q1 evaluates EXIT^2", "Q1 evaluates ENTER^10",   # R1 writes warning (ts 10)
                                  "Q2 evaluates EXIT^2",                            # ... then Q2 reads at ts 2
                                  "Q1 evaluates EXIT^15", "Q2 evaluates EXIT^15"])
    assert reads(engine, "Q2")[2] == "warning"          # at application time 2 the worker was safe
    report = check_stream_history(engine.history.snapshot())
    assert not report.ok
    assert [violation.kind for violation in report.violations] == [StreamAnomaly.READ_TOO_LATE]
    (violation,) = report.violations
    assert (violation.read.origin, violation.read.ts) == ("Q2", 2)
    assert (violation.write.origin, violation.write.ts, violation.write.value) == ("R1", 10, {"status": "warning"})
    assert violation.read.sequence > violation.write.sequence     # crossed lines of Figure 2(b)


def test_example_3_write_too_late(db):
    set_status(db, w1="safe")
    engine = run_unscheduled(db, ["Q1 evaluates EXIT^2", "Q2 evaluates EXIT^2",
                                  "Q2 evaluates EXIT^15",                           # Q2 reads at ts 15 ...
                                  "Q1 evaluates ENTER^10",                          # ... before R1 writes at 10
                                  "Q1 evaluates EXIT^15"])
    assert reads(engine, "Q2")[15] == "safe"            # after application time 10 it should be warning
    report = check_stream_history(engine.history.snapshot())
    assert [violation.kind for violation in report.violations] == [StreamAnomaly.WRITE_TOO_LATE]
    (violation,) = report.violations
    assert violation.clause == "(1)"
    assert (violation.read.origin, violation.read.ts) == ("Q2", 15)
    assert (violation.write.origin, violation.write.ts) == ("R1", 10)
    assert violation.seen is None                       # Q2 saw the value from before the history
    assert violation.write.sequence > violation.read.sequence     # crossed the other way (Figure 2(c))
    assert "write-too-late" in violation.message and "R1" in violation.message


@pytest.mark.parametrize("positions", [(1, 0), (0, 1)], ids=["positions-agree", "positions-contradict"])
def test_writes_out_of_timestamp_order_are_write_too_late(db, positions):
    """Def. 6 (2) on a hand-made history: two writes of one row against their timestamps —
    judged by the timestamps whether the recorded positions agree with them or not."""
    history = streams.StreamHistory()
    for unit, ts, position in (("S1", 10, positions[0]), ("S0", 5, positions[1])):   # ts 10 runs before ts 5
        history.begin(unit, unit, f"e^{ts}", ts, (position, ()))
        history.write(unit, unit, f"e^{ts}", ts, (position, (1, 0, 1)), "R", "workerstatus", ("w1",),
                      {"status": str(ts)}, "write")
        history.end(unit, unit, f"e^{ts}", ts, (position, ()), True)
    report = check_stream_history(history.snapshot())
    assert [(violation.kind, violation.clause) for violation in report.violations] == [
        (StreamAnomaly.WRITE_TOO_LATE, "(2)")]
    assert (report.violations[0].write.ts, report.violations[0].seen.ts) == (5, 10)


def test_aborted_work_is_ignored_and_dirty_reads_are_reported():
    history = streams.StreamHistory()
    history.begin("A", "A", "e^1", 1, (0, ()))
    history.write("A", "A", "e^1", 1, (0, (1, 0, 1)), "R", "t", ("k",), {"v": 1}, "write")
    history.begin("B", "B", "e^2", 2, (1, ()))
    history.read("B", "B", "e^2", 2, (1, (0, 0, 1)), "Q", "t", ("k",), {"v": 1})   # sees A's write
    history.end("A", "A", "e^1", 1, (0, ()), False)                                 # ... which aborts
    history.end("B", "B", "e^2", 2, (1, ()), True)
    report = check_stream_history(history.snapshot())
    assert [violation.kind for violation in report.violations] == [StreamAnomaly.DIRTY_READ]


def test_a_scan_that_saw_a_write_of_aborted_work_is_a_dirty_read_also_of_a_row_no_committed_work_wrote():
    """A scan's read (``key`` None) is checked row by row over the rows committed work wrote: a row only aborted work
    wrote was never looked at, so a scan that saw it — the keyed read of it in the test above is a dirty read —
    passed the checker.  Every row the scan saw counts now."""
    history = streams.StreamHistory()
    history.begin("A", "A", "e^1", 1, (0, ()))
    history.write("A", "A", "e^1", 1, (0, (1, 0, 1)), "R", "t", ("k",), {"v": 1}, "write")
    history.begin("B", "B", "e^2", 2, (1, ()))
    history.read("B", "B", "e^2", 2, (1, (0, 0, 1)), "Q", "t", None, [{"v": 1}])     # a scan: sees A's write
    history.end("A", "A", "e^1", 1, (0, ()), False)                                 # ... which aborts
    history.end("B", "B", "e^2", 2, (1, ()), True)
    report = check_stream_history(history.snapshot())
    assert [violation.kind for violation in report.violations] == [StreamAnomaly.DIRTY_READ], report.violations
    assert "Read by Q of t (table)" in report.violations[0].message


def test_the_checker_judges_by_timestamps_not_by_the_recorded_order():
    """Definition 6 is about timestamps: a Read at ts 15 recorded (and positioned) before the
    Write at ts 10 it should have seen, with the value from before that Write, is a
    write-too-late — whatever order the engine recorded or declared."""
    history = streams.StreamHistory()
    history.begin("S15", "S15", "exit^15", 15, (0, ()))
    history.read("S15", "S15", "exit^15", 15, (0, (0, 0, 1)), "Q2", "workerstatus", ("w1",), {"status": "safe"})
    history.end("S15", "S15", "exit^15", 15, (0, ()), True)
    history.begin("S10", "S10", "enter^10", 10, (1, ()))
    history.write("S10", "S10", "enter^10", 10, (1, (1, 0, 1)), "R1", "workerstatus", ("w1",),
                  {"status": "warning"}, "write")
    history.end("S10", "S10", "enter^10", 10, (1, ()), True)
    report = check_stream_history(history.snapshot())
    assert [(violation.kind, violation.clause) for violation in report.violations] == [
        (StreamAnomaly.WRITE_TOO_LATE, "(1)")], report.violations
    (violation,) = report.violations
    assert (violation.read.origin, violation.read.ts, violation.write.origin, violation.write.ts) == (
        "Q2", 15, "R1", 10)
    assert violation.seen is None and "write-too-late" in violation.message



def test_the_checker_compares_the_value_read_with_the_write_it_saw():
    """A Read recorded after the Write at 10 (so the recorder says it saw it) that returned the
    value from before it: its value is not the one the timestamp-ordered Writes produce."""
    history = streams.StreamHistory()
    history.begin("S10", "S10", "enter^10", 10, (0, ()))
    history.write("S10", "S10", "enter^10", 10, (0, (1, 0, 1)), "R1", "workerstatus", ("w1",),
                  {"status": "warning"}, "write")
    history.end("S10", "S10", "enter^10", 10, (0, ()), True)
    history.begin("S15", "S15", "exit^15", 15, (1, ()))
    history.read("S15", "S15", "exit^15", 15, (1, (0, 0, 1)), "Q2", "workerstatus", ("w1",),
                 {"workerid": "w1", "status": "safe"})
    history.end("S15", "S15", "exit^15", 15, (1, ()), True)
    report = check_stream_history(history.snapshot())
    assert [violation.kind for violation in report.violations] == [StreamAnomaly.WRONG_VALUE]
    assert "'safe'" in report.violations[0].message and "'warning'" in report.violations[0].message
