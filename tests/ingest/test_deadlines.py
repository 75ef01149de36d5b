"""Deadlines of an ingestion (``Ingestion(deadlines=Deadlines(...))``, no Spark): a rule that does not return is seen
(the batch in progress, its oldest firing), its batch is given up at the rule's deadline — rolled back, its row lock
released at once, the event a dead letter written ahead of the batch — and a new process (a new connection, as
``activedb run`` restarts itself) applies the batch without that event, exactly once; the ledger accounts for every
row.  A batch's own deadline blames no event.

Deadlines are read from the database's clock: the test that looks at the stuck batch before its deadline drives a
``ManualClock``, so a busy machine that stalls the test's thread cannot let the deadline pass under it."""

from __future__ import annotations

import datetime as dt
import threading

import pytest
import sqlalchemy as sa

import activedb
from activedb import Coupling, deadletters, testing
from activedb.clock import ManualClock
from activedb.ingest import Deadlines, Ingestion, batches_in_progress
from activedb.ingest._watch import REPORT_AFTER_SECONDS
from activedb.ingest.errors import BatchDeadlineExceeded, IngestError
from tests._clocks import ReadPausingClock
from tests.spark_bridge import app_counters
from tests.spark_bridge._streams import (BASE_TIME, app_database, app_state, apply_directly, counter_locked, iso,
                                         new_app_database)

STUCK_SEQ = 99
TIMEOUT = 120


def _row(seq: int, key: str, amount: int = 5) -> dict:
    return {"type": "add", "key": key, "ts": iso(BASE_TIME + dt.timedelta(seconds=seq)), "amount": amount, "seq": seq}


@pytest.fixture()
def released():
    """The event the stuck rule waits on (set at the end, so that its thread ends with the test)."""
    event = threading.Event()
    yield event
    event.set()


def _stuck_database(url: str, released: threading.Event, started: threading.Event, clock: ManualClock | None = None):
    """The counters application whose ``apply_add`` reads its row for update and waits for ``released`` on the
    event of :data:`STUCK_SEQ` (a rule that does not return, as far as any deadline of a test goes); on ``clock``
    (None: the system's), whose one sleeper is then the watch's thread (no outbox recovery pass waits on it)."""
    database = (activedb.connect(url) if clock is None
                else activedb.connect(url, clock=clock, outbox_options={"recovery_interval": None}))
    database.upgrade_app(app_counters.MIGRATIONS)

    def apply_add_or_hang(tx, event) -> None:
        if event.payload["seq"] == STUCK_SEQ:
            tx.read("counters", event.key, for_update=True)
            started.set()
            released.wait()
        app_counters.apply_add(tx, event)

    database.rule(on=database.stream("add"), coupling=Coupling.IMMEDIATE, name="apply_add")(apply_add_or_hang)
    database.rule(on=database.stream("sub"), coupling=Coupling.IMMEDIATE, name="apply_sub")(app_counters.apply_sub)
    database.rule(on=database.modified("counters"), when=app_counters.crossed_a_hundred, coupling=Coupling.DEFERRED,
                  name="milestone")(app_counters.milestone)
    return database


def test_a_rule_past_its_deadline_is_a_dead_letter_and_a_new_process_applies_the_rest(make_database_url, released):
    url = make_database_url("deadline", migrations=(app_counters.MIGRATIONS,))
    first = [_row(1, "k1", 30), _row(2, "k2")]
    second = [_row(3, "k1"), _row(STUCK_SEQ, "k1"), _row(4, "k2")]
    started = threading.Event()
    clock = ManualClock()
    database = _stuck_database(url, released, started, clock)
    ingestion = Ingestion(database, app_counters.MAPPING, source="stuck", deadlines=Deadlines(rule=3))

    def advance(seconds: float) -> None:
        """Advance the clock once the watch's thread waits on it (it then looks at the batch at the new time)."""
        testing.wait_until(lambda: clock.sleepers == 1 or failures, TIMEOUT, "the watch to wait on the clock",
                           lambda: (clock, failures))
        clock.advance(seconds)
    try:
        ingestion.process(first, 0, query_id="stuck@run")
        failures = []

        def second_batch():
            try:
                ingestion.process(second, 1, query_id="stuck@run")
            except BaseException as error:
                failures.append(error)

        runner = threading.Thread(target=second_batch)
        runner.start()
        assert started.wait(TIMEOUT)
        testing.wait_until(lambda: (ingestion.batch_in_progress() or None) and ingestion.batch_in_progress().firing,
                           TIMEOUT, "the firing to be seen")
        seen = ingestion.batch_in_progress()
        assert (seen.batch_id, seen.rows, seen.firing.rule) == (1, 3, "apply_add") and "k1" in seen.firing.event
        assert seen.deadline_in == 3                # (the clock has not moved since the firing started)
        assert counter_locked(database.engine, "k1")
        advance(REPORT_AFTER_SECONDS)               # the batch has run long enough to be reported; 1 s to its deadline
        [report] = testing.wait_until(lambda: batches_in_progress(database, "stuck"), TIMEOUT,
                                      "the report in the database")
        assert (report.batch_id, report.firing_rule) == (1, "apply_add")
        assert ingestion.batch_in_progress().deadline_in == 3 - REPORT_AFTER_SECONDS
        assert counter_locked(database.engine, "k1") and failures == []       # not given up before its deadline
        advance(3 - REPORT_AFTER_SECONDS)           # the rule's deadline
        runner.join(TIMEOUT)
        assert not runner.is_alive(), "the batch was not given up at its rule's deadline"
        [error] = failures
        assert isinstance(error, BatchDeadlineExceeded) and error.batch_id == 1 and error.letter_id is not None
        assert "rule 'apply_add' did not return within its deadline of 3 s" in str(error)
        assert not counter_locked(database.engine, "k1")        # released at the deadline, the thread still waits
        assert batches_in_progress(database, "stuck") == [] and ingestion.batch_in_progress() is None
        with pytest.raises(IngestError, match="takes no more batches"):
            ingestion.process(second, 1, query_id="stuck@run")
    finally:
        ingestion.close()
    [letter] = deadletters.select(database)
    assert (letter.id, letter.batch_id, letter.position, letter.raw["seq"]) == (error.letter_id, 1, 1, STUCK_SEQ)
    database.close()

    # The new process: the counters' own rules, which take apply_add's name back from the stuck one.
    with pytest.warns(activedb.RuleDefinitionChangedWarning, match="'apply_add' was redefined"):
        restarted = app_database(url)
    try:
        again = Ingestion(restarted, app_counters.MAPPING, source="stuck", deadlines=Deadlines(rule=3))
        try:
            outcome = again.process(second, 1, query_id="stuck@run")
        finally:
            again.close()
        assert (outcome.committed, outcome.events, outcome.dead_letters) == (True, 2, 1)
        with restarted.engine.connect() as connection:
            ledger = connection.execute(sa.text(
                "SELECT batch_id, events, dead_letters FROM activedb_ingestion_ledger ORDER BY 1")).all()
        assert [tuple(row) for row in ledger] == [(0, 2, 0), (1, 2, 1)]
        direct = new_app_database(make_database_url, "deadline_direct")
        try:
            apply_directly(direct, first + [row for row in second if row["seq"] != STUCK_SEQ])
            assert app_state(restarted) == app_state(direct)
        finally:
            direct.close()
    finally:
        restarted.close()


def test_a_batch_past_its_own_deadline_blames_no_event(make_database_url, released):
    started = threading.Event()
    database = _stuck_database(make_database_url("batch_deadline", migrations=(app_counters.MIGRATIONS,)),
                               released, started)
    ingestion = Ingestion(database, app_counters.MAPPING, source="slow", deadlines=Deadlines(batch=2))
    try:
        with pytest.raises(BatchDeadlineExceeded, match="did not finish within its deadline of 2 s") as raised:
            ingestion.process([_row(STUCK_SEQ, "k1")], 0, query_id="slow@run")
        assert raised.value.letter_id is None and "a re-run runs it as it was" in str(raised.value)
        assert deadletters.select(database) == []
    finally:
        ingestion.close()
        database.close()


class _RowsReadLate(list):
    """A batch's rows whose reading (the batch's thread validating them) waits until ``go`` is set; ``reading`` is
    set when it starts."""

    def __init__(self, rows: list[dict], reading: threading.Event, go: threading.Event) -> None:
        super().__init__(rows)
        self.reading, self.go = reading, go

    def __iter__(self):
        self.reading.set()
        assert self.go.wait(TIMEOUT), "the test never let the rows be read"
        return super().__iter__()


class _BatchEnds(activedb.Observer):
    """How the batches' top-level transactions ended: ``"committed"`` or the abort's reason, in order."""

    def __init__(self) -> None:
        self.ends: list[object] = []

    def on_commit(self, transaction) -> None:
        if transaction.parent is None and (transaction.name or "").startswith("ingest:"):
            self.ends.append("committed")

    def on_abort(self, transaction, reason) -> None:
        if transaction.parent is None and (transaction.name or "").startswith("ingest:"):
            self.ends.append(reason)


def test_a_batch_given_up_before_its_transaction_began_never_commits(make_database_url, released):
    """The batch's deadline passes while its thread still reads its rows, before it began the batch's transaction:
    the watch had no tree to doom, and when the thread went on it began a transaction nothing doomed and committed
    the batch the caller had been told was given up ("nothing of the batch is applied").  That transaction is now
    doomed at its begin: it aborts for the deadline, and nothing of the batch is in the tables or the ledger."""
    clock = ManualClock()
    database = _stuck_database(make_database_url("late_begin", migrations=(app_counters.MIGRATIONS,)),
                               released, threading.Event(), clock)
    ends = database.observe(_BatchEnds())
    ingestion = Ingestion(database, app_counters.MAPPING, source="late", deadlines=Deadlines(batch=2))
    reading, go = threading.Event(), threading.Event()
    try:
        with pytest.raises(BatchDeadlineExceeded, match="did not finish within its deadline of 2 s"):
            def give_up_once_reading() -> None:
                assert reading.wait(TIMEOUT)
                testing.wait_until(lambda: clock.sleepers == 1, TIMEOUT, "the watch to wait on the clock",
                                   lambda: clock)
                clock.advance(2)

            helper = threading.Thread(target=give_up_once_reading)
            helper.start()
            try:
                ingestion.process(_RowsReadLate([_row(1, "k1"), _row(2, "k2")], reading, go), 0, query_id="late@run")
            finally:
                helper.join(TIMEOUT)
        go.set()                                 # the batch's thread goes on, into its transaction
        testing.wait_until(lambda: ends.ends, TIMEOUT, "the batch's transaction to end", lambda: ends.ends)
        [end] = ends.ends
        assert end != "committed" and "batch 0 of late@run: the batch did not finish within its deadline" in str(end)
        with database.engine.connect() as connection:
            assert connection.execute(sa.text("SELECT count(*) FROM counters")).scalar() == 0
            assert connection.execute(sa.text("SELECT count(*) FROM activedb_ingestion_ledger")).scalar() == 0
    finally:
        go.set()
        ingestion.close()
        database.close()


class _HangsAfterCommit(activedb.lowlevel.CommitParticipant):
    """A participant of the batch's transaction whose ``committed`` (after PostgreSQL committed) sets ``inside`` and
    waits for ``released`` — what runs after a batch's commit on its thread and does not return."""

    def __init__(self, inside: threading.Event, released: threading.Event) -> None:
        self.inside, self.released = inside, released

    def committed(self, transaction) -> None:
        self.inside.set()
        self.released.wait()


def test_a_batch_past_its_deadline_after_its_commit_is_said_to_be_committed(make_database_url, released):
    """The batch's deadline passes after its transaction committed, while its thread still runs what follows the
    commit (a participant's ``committed``; likewise an observer of the commit or the punctuation's stream queries):
    BatchDeadlineExceeded said the batch was rolled back, nothing of it applied, and a re-run would run it as it was —
    although its effects and ledger row were committed, and a re-run skips it.  It now says the batch committed."""
    clock = ManualClock()
    database = _stuck_database(make_database_url("late_after_commit", migrations=(app_counters.MIGRATIONS,)),
                               released, threading.Event(), clock)
    ingestion = Ingestion(database, app_counters.MAPPING, source="after", deadlines=Deadlines(batch=2))
    inside = threading.Event()
    try:
        def give_up_once_committed() -> None:
            assert inside.wait(TIMEOUT)
            testing.wait_until(lambda: clock.sleepers == 1, TIMEOUT, "the watch to wait on the clock", lambda: clock)
            clock.advance(2)

        helper = threading.Thread(target=give_up_once_committed)
        helper.start()
        try:
            with pytest.raises(BatchDeadlineExceeded, match="did not finish within its deadline of 2 s") as raised:
                ingestion.process([_row(1, "k1"), _row(2, "k2")], 0, query_id="after@run",
                                  participants=[_HangsAfterCommit(inside, released)])
        finally:
            helper.join(TIMEOUT)
        message = str(raised.value)
        with database.engine.connect() as connection:
            assert connection.execute(sa.text("SELECT count(*) FROM counters")).scalar() == 2
            assert connection.execute(sa.text("SELECT count(*) FROM activedb_ingestion_ledger")).scalar() == 1
        assert "rolled back" not in message and "nothing of it is applied" not in message, message
        assert "The batch had committed before (it is applied: a re-run skips it)" in message, message
        assert "takes no more batches" in message, message
    finally:
        released.set()
        ingestion.close()
        database.close()


@pytest.mark.parametrize("seconds", [10**400, float("nan"), 0, -1, "60", True])
def test_a_deadline_that_is_no_number_of_seconds_above_0_is_refused_saying_what_to_give(seconds):
    """``Deadlines(batch=…, rule=…)`` takes seconds > 0 or None: an int no float holds (10**400) let math.isfinite's
    OverflowError out instead of the IngestError the other values get."""
    for name in ("batch", "rule"):
        with pytest.raises(IngestError, match=rf"Deadlines\({name}=…\) takes a number of seconds > 0"):
            Deadlines(**{name: seconds})


def test_the_watch_passes_a_deadline_the_clock_passed_between_its_reading_and_its_sleep(make_database_url, released):
    """The waiting thread read the clock, computed how long until it should look again and slept that long
    (``Clock.wait``, relative): a ``ManualClock`` advanced between the read and the sleep moved the time it woke later
    by the advance, past the batch's deadline, and the batch was not given up.  It sleeps until a time on the clock
    now (``Clock.wait_until``): the advance passed it, so it looks again at once and gives the batch up."""
    clock = ReadPausingClock()
    database = _stuck_database(make_database_url("late_read", migrations=(app_counters.MIGRATIONS,)),
                               released, threading.Event(), clock)
    ingestion = Ingestion(database, app_counters.MAPPING, source="read", deadlines=Deadlines(batch=2))
    reading, go = threading.Event(), threading.Event()
    raised: list[BaseException] = []

    def process() -> None:
        try:
            ingestion.process(_RowsReadLate([_row(1, "k1")], reading, go), 0, query_id="read@run")
        except BaseException as error:
            raised.append(error)

    caller = threading.Thread(target=process, name="ingest-caller", daemon=True)
    try:
        caller.start()
        assert reading.wait(TIMEOUT), "the batch's thread never read its rows"
        testing.wait_until(lambda: clock.sleepers == 1, TIMEOUT, "the watch to wait on the clock", lambda: clock)
        clock.pause_next_read("ingest-caller")
        clock.advance(1)                # the watch looks again (a second later): its read of the clock is stopped
        assert clock.read.wait(TIMEOUT), "the watch never read the clock again"
        clock.advance(1)                # the batch's deadline, passed before the watch goes to sleep
        clock.go.set()
        caller.join(TIMEOUT)
        assert not caller.is_alive(), \
            f"the watch sleeps past the batch's deadline: {clock}, {clock.sleepers} sleeper(s)"
        [error] = raised
        assert isinstance(error, BatchDeadlineExceeded) and "did not finish within its deadline of 2 s" in str(error)
    finally:
        clock.go.set()
        go.set()
        clock.advance(3600)             # (a watch still asleep wakes: the test ends its threads)
        caller.join(TIMEOUT)
        ingestion.close()
        database.close()
