"""``IngestSink.process`` without Spark: one batch (a list of dicts or an Arrow table) →
one top-level transaction with its ledger row, exactly once, on real PostgreSQL."""

from __future__ import annotations

import contextlib
import datetime as dt
import gc
import threading

import pyarrow as pa
import pytest
import sqlalchemy as sa

from activedb import lowlevel
from activedb.atomic import SplitFailure
import activedb
import activedb.ingest
import spark_bridge
from activedb.errors import DatabaseUnavailable, SerializationConflict
from lockmgr.testing import wait_until
from activedb.ingest import BatchHandler, RulesHandler
from spark_bridge import IngestOptions, IngestSink, ingest
from spark_bridge.errors import IngestError
from tests.spark_bridge import app_counters
from tests.spark_bridge._streams import BASE_TIME, app_state, dead_letters, ledger, new_app_database


def _event(seq: int, key: str = "k", *, kind: str = "add", amount: int = 1, seconds: float | None = None) -> dict:
    return {"type": kind, "key": key, "ts": BASE_TIME + dt.timedelta(seconds=seq if seconds is None else seconds),
            "amount": amount, "seq": seq}


@pytest.fixture()
def database(make_database_url, request):
    database = new_app_database(make_database_url, request.node.name[5:40])
    yield database
    database.close()


def test_a_batch_commits_with_its_ledger_row_and_a_replay_is_skipped(database):
    sink = IngestSink(database, app_counters.MAPPING, query_name="q")
    rows = [_event(seq, key=f"k{seq % 3}", amount=40) for seq in range(1, 10)]
    outcome = sink.process(rows, 7, query_id="q@test")
    assert (outcome.committed, outcome.rows, outcome.events, outcome.dead_letters) == (True, 9, 9, 0)
    assert outcome.rule_firings == {"apply_add": 9, "milestone": 9}
    state = app_state(database)

    again = sink.process(rows, 7, query_id="q@test")
    assert (again.committed, again.events) == (False, 0)
    assert app_state(database) == state
    assert ledger(database) == [("q@test", 7, 9, 0)]
    statistics = sink.statistics()
    assert (statistics.batches, statistics.batches_skipped, statistics.events, statistics.rows) == (1, 1, 9, 18)
    assert statistics.query_id == "q@test" and statistics.last_batch_id == 7
    assert statistics.timings.engine > 0 and statistics.timings.flush > 0
    sink.close()


def test_the_ledger_is_asked_about_a_batch_unless_the_sink_saw_the_one_before_committed(database):
    """Spark runs a query's batches in order: after batch b-1 committed, batch b is new to the ledger unless a
    duplicate run of the query committed it, which the ledger's row at the flush refuses — so the sink asks
    the ledger before running a batch only when it did not see the one before it committed."""
    asked: list[dict] = []

    def remember(connection, cursor, statement, parameters, context, executemany):
        if statement.lstrip().upper().startswith("SELECT") and "activedb_ingestion_ledger" in statement:
            asked.append(parameters)

    sink = IngestSink(database, app_counters.MAPPING, query_name="q")
    sa.event.listen(database.engine, "before_cursor_execute", remember)
    try:
        outcomes = [sink.process([_event(batch)], batch, query_id="q@asked") for batch in (3, 4, 5)]
        assert [outcome.committed for outcome in outcomes] == [True] * 3 and len(asked) == 1   # batch 3's
        replay = sink.process([_event(5)], 5, query_id="q@asked")
        assert not replay.committed and len(asked) == 2                    # asked, found, skipped
        assert sink.process([_event(6)], 6, query_id="q@asked").committed and len(asked) == 2
        assert sink.process([_event(8)], 8, query_id="q@asked").committed and len(asked) == 3   # after a gap
        with database.transaction(participants=[activedb.ingest.IngestionLedger(database, "q@asked", 9)]):
            pass                                                          # a duplicate run committed batch 9
        state = app_state(database)
        duplicate = sink.process([_event(9, amount=1000)], 9, query_id="q@asked")
        # Not asked before: refused at the flush — then asked what the duplicate run recorded, to compare its rows.
        assert not duplicate.committed and len(asked) == 4
        assert app_state(database) == state
        assert sink.process([_event(10)], 10, query_id="q@asked").committed and len(asked) == 4
    finally:
        sa.event.remove(database.engine, "before_cursor_execute", remember)
        sink.close()
    assert [batch for _, batch, _, _ in ledger(database)] == [3, 4, 5, 6, 8, 9, 10]


def test_events_are_applied_in_application_time_order_whatever_the_arrival_order(database):
    sink = IngestSink(database, app_counters.MAPPING, query_name="q")
    arrival = [5, 1, 4, 2, 3]
    table = pa.Table.from_pylist([_event(seq) for seq in arrival])
    sink.process(table, 0, query_id="q@order")
    [(key, total, events, trail, last_ts)] = app_state(database)["counters"]
    assert (trail, events) == ("1,2,3,4,5", 5)
    assert last_ts == BASE_TIME + dt.timedelta(seconds=5)


def test_bad_rows_and_rejected_events_are_dead_letters_in_the_same_transaction(database):
    sink = IngestSink(database, app_counters.MAPPING, query_name="q")
    rows = [_event(1, amount=5), _event(2, amount=-1), {**_event(3), "type": "nope"}, {**_event(4), "key": ""},
            _event(5, kind="sub", amount=50)]
    outcome = sink.process(rows, 0, query_id="q@letters")
    assert (outcome.events, outcome.dead_letters) == (1, 4)
    reasons = {raw["seq"]: reason for _, _, reason, raw in dead_letters(database)}
    assert reasons[2].startswith("rejected by rule 'apply_add'")
    assert reasons[3].startswith("event type ('type') is 'nope'")
    assert reasons[4] == "key ('key') is an empty string"
    assert reasons[5].startswith("rejected by rule 'apply_sub'")
    assert {(query, batch) for query, batch, _, _ in dead_letters(database)} == {("q@letters", 0)}
    assert ledger(database) == [("q@letters", 0, 1, 4)]


def test_events_older_than_the_watermark_are_late_and_the_watermark_is_punctuated(database):
    sink = IngestSink(database, app_counters.MAPPING, query_name="wm")
    watermark = BASE_TIME + dt.timedelta(seconds=10)
    outcome = sink.process([_event(5), _event(10), _event(15)], 0, query_id="wm@test", watermark=watermark)
    assert (outcome.events, outcome.dead_letters, outcome.watermark) == (2, 1, watermark)
    [(_, _, reason, raw)] = dead_letters(database)
    assert raw["seq"] == 5 and reason.startswith("late:")
    assert database.watermark("wm") == watermark
    with database.engine.connect() as connection:
        stored = connection.execute(sa.text("SELECT watermark FROM activedb_ingestion_ledger")).scalar_one()
    assert stored == watermark


def test_known_types_default_to_the_stream_types_the_rules_listen_to(database):
    sink = IngestSink(database, app_counters.MAPPING, query_name="q")
    assert sink.known_types() == frozenset({"add", "sub"})
    explicit = IngestSink(database, app_counters.MAPPING, query_name="q", known_types={"add"})
    outcome = explicit.process([_event(1), _event(2, kind="sub")], 0, query_id="q@known")
    assert (outcome.events, outcome.dead_letters) == (1, 1)


def test_prefetch_loads_the_keyed_rows_in_one_query(database):
    sink = IngestSink(database, app_counters.MAPPING, query_name="q", handler=RulesHandler({"counters": None}))
    sink.process([_event(seq, key=f"k{seq % 4}") for seq in range(1, 9)], 0, query_id="q@pre")
    selects = []

    def count(connection, cursor, statement, parameters, context, executemany):
        if statement.lstrip().upper().startswith("SELECT") and "counters" in statement:
            selects.append(statement)

    sa.event.listen(database.engine, "before_cursor_execute", count)
    try:
        sink.process([_event(seq, key=f"k{seq % 4}") for seq in range(9, 17)], 1, query_id="q@pre")
    finally:
        sa.event.remove(database.engine, "before_cursor_execute", count)
    # One prefetch, then the flush's validation re-read: no SELECT per event.
    assert len(selects) == 2
    assert [row[2] for row in app_state(database)["counters"]] == [4, 4, 4, 4]


def test_a_database_failure_inside_an_event_fails_the_batch_instead_of_dead_lettering_it(database):
    calls = threading.Event()

    def unreachable(tx, event):
        calls.set()
        raise DatabaseUnavailable("server went away")

    database.rule(on=database.stream("ping"), name="unreachable")(unreachable)
    sink = IngestSink(database, app_counters.MAPPING, query_name="q")
    with pytest.raises(Exception) as raised:
        sink.process([{**_event(1), "type": "ping"}, _event(2)], 0, query_id="q@down")
    assert calls.is_set()
    assert any(isinstance(cause, DatabaseUnavailable) for cause in (raised.value, raised.value.__cause__))
    assert ledger(database) == [] and dead_letters(database) == []
    assert not activedb.ingest.batch_committed(database, "q@down", 0)


def test_ingest_status_groups_ledger_rows_by_query_name(database):
    sink = IngestSink(database, app_counters.MAPPING, query_name="alpha")
    spark_id = "0b7ee7b6-2a1e-4bb1-8a6e-0b39c3c8d001"
    for batch in range(3):
        sink.process([_event(batch + 1, amount=60)], batch, query_id=activedb.ingest.ledger_query_id("alpha", spark_id))
    beta_sink = IngestSink(database, app_counters.MAPPING, query_name="beta")     # (a sink files under its own name)
    for partition in range(2):
        beta_sink.process([_event(10 + partition, key=f"p{partition}")], 0,
                          query_id=activedb.ingest.ledger_query_id("beta", spark_id.replace("d001", "d002"), partition))
    alpha, beta = activedb.ingest.ingestion_status(database)
    assert (alpha.query_name, alpha.batches, alpha.last_batch_id, alpha.events, alpha.partitions) == (
        "alpha", 3, 2, 3, None)
    assert alpha.rule_firings == {"apply_add": 3, "milestone": 3}
    assert (beta.query_name, beta.batches, beta.ledger_rows, beta.partitions) == ("beta", 1, 2, 2)
    assert activedb.ingest.parse_ledger_query_id(f"beta@{spark_id}#p1") == ("beta", spark_id, 1)
    assert activedb.ingest.parse_ledger_query_id("plain-uuid") == ("plain-uuid", None, None)


def test_a_failed_to_arrow_is_raised_as_itself_when_the_batch_schema_cannot_be_read_either(database):
    """When ``toArrow()`` fails, the sink asks Spark for the batch's schema to raise ``ingest()``'s error for a column
    Arrow cannot take.  If that question failed too (the session gone, py4j's connection closed), its error was
    raised and ``toArrow()``'s — the batch's real failure — was only its context: ``last_failure()`` and the query's
    error told of the schema.  The original is raised, as itself."""

    class Unreadable:
        """A batch whose job fails and whose schema cannot be read (py4j's errors, without Spark)."""

        class sparkSession:     # noqa: N801  (DataFrame's attribute)
            class sparkContext:     # noqa: N801
                @staticmethod
                def getLocalProperty(name):
                    return "0b7ee7b6-2a1e-4bb1-8a6e-0b39c3c8d0a1"

        def toArrow(self):      # noqa: N802
            raise RuntimeError("the batch's job failed: executor lost")

        @property
        def schema(self):
            raise ConnectionError("the Java side is gone")

    sink = IngestSink(database, app_counters.MAPPING, query_name="gone")
    with pytest.raises(RuntimeError, match="the batch's job failed") as raised:
        sink(Unreadable(), 0)
    assert not isinstance(raised.value.__context__, ConnectionError)
    failure = sink.last_failure()
    assert failure is not None and failure[1] is raised.value
    assert ledger(database) == [] and dead_letters(database) == []


def test_sink_arguments_are_checked(database):
    with pytest.raises(IngestError, match="EventMapping"):
        IngestSink(database, {"type": "t"}, query_name="q")
    with pytest.raises(IngestError, match="query_name"):
        IngestSink(database, app_counters.MAPPING, query_name=" ")


def test_the_ledger_participant_makes_a_batch_exactly_once(database):
    """The ledger row is written by a commit participant in the batch's own PostgreSQL transaction: a
    second transaction for the same (query, batch) fails at its flush and writes nothing."""
    first = activedb.ingest.IngestionLedger(database, "query-a", 7)
    with database.transaction(participants=[first]) as tx:
        tx.write("counters", "b", total=1)
    assert activedb.ingest.batch_committed(database, "query-a", 7)
    assert not activedb.ingest.batch_committed(database, "query-a", 8)
    with pytest.raises(activedb.BatchAlreadyCommitted, match="batch 7 of query 'query-a'"):
        with database.transaction(participants=[activedb.ingest.IngestionLedger(database, "query-a", 7)]) as tx:
            tx.write("counters", "b", total=2)
    with database.engine.connect() as connection:
        assert connection.execute(sa.text("SELECT total FROM counters WHERE key = 'b'")).scalar() == 1
    # With event ids (recorded in write, after the row): the duplicate is still told as such, not as a conflict
    # of its ids, and a ledger row of another batch that fails along the flush is not taken for a duplicate.
    for attempt in range(2):
        with_ids = activedb.ingest.IngestionLedger(database, "query-a", 9)
        with_ids.query_name, with_ids.event_ids = "query-a", ["e1", "e2"]
        with pytest.raises(activedb.BatchAlreadyCommitted, match="batch 9 of query 'query-a'") if attempt else \
                contextlib.nullcontext():
            with database.transaction(participants=[with_ids]) as tx:
                tx.write("counters", "c", total=attempt + 1)
    class DuplicateCounter(activedb.CommitParticipant):
        def statements_along(self, tx):                      # after the ledger's row, in the same round trip
            return (activedb.Along("INSERT INTO counters (key, total) VALUES ('b', 4)"),)

    other = activedb.ingest.IngestionLedger(database, "query-a", 8)
    with pytest.raises(activedb.DatabaseError) as refused:
        with database.transaction(participants=[other, DuplicateCounter()]):
            pass
    assert refused.value.sqlstate == "23505" and not activedb.ingest.batch_committed(database, "query-a", 8)
    with database.engine.connect() as connection:
        assert connection.execute(sa.text("SELECT total FROM counters WHERE key = 'b'")).scalar() == 1


def test_the_average_rate_does_not_decay_while_the_stream_is_idle(database):
    sink = IngestSink(database, app_counters.MAPPING, query_name="idle")
    sink.process([_event(seq, amount=1) for seq in range(1, 6)], 0, query_id="idle@rate")
    first = sink.statistics().events_per_second
    with database.engine.connect() as connection:      # time passes, no batch comes
        connection.execute(sa.text("SELECT pg_sleep(0.05)"))
    assert first > 0 and sink.statistics().events_per_second == first


# -- the one batch protocol with a handler of one's own; ingest()'s options checked in one place ---------

class Writer(BatchHandler):
    """Writes each event's amount to ``counters`` itself (no rules); an odd amount is a dead letter.  The
    first ``conflicts`` attempts write every event and then raise a serialization conflict."""

    name = "writer"

    def __init__(self, conflicts: int = 0) -> None:
        self.conflicts = conflicts
        self.attempts = 0

    def handle(self, tx, batch, ledger) -> None:
        self.attempts += 1
        conflict = self.attempts <= self.conflicts       # this attempt writes every event, then conflicts
        odd = [] if conflict else [event for event in batch.events if event.payload["amount"] % 2]
        for event in batch.events:
            if event not in odd:
                tx.write("counters", event.key, total=event.payload["amount"], events=1,
                         trail=str(event.payload["seq"]), last_ts=event.ts)
        if conflict:
            raise SerializationConflict("another process changed a row this batch read")
        letters = [*batch.letters, *batch.dead_letters.for_events([(event, "odd amount") for event in odd])]
        batch.dead_letters.insert(tx, letters)
        ledger.events = len(batch.events) - len(odd)
        ledger.dead_letters = len(letters)


def test_a_handler_of_ones_own_gets_ledger_dead_letters_conflict_reruns_and_replay_skips(database):
    handler = Writer(conflicts=1)
    sink = IngestSink(database, app_counters.MAPPING, query_name="own", handler=handler, known_types={"add"})
    rows = [_event(1, "a", amount=2), _event(2, "b", amount=3), {**_event(3, "c"), "type": "nope"}]
    outcome = sink.process(rows, 4, query_id="own@x")
    assert (outcome.committed, outcome.events, outcome.dead_letters, outcome.attempts) == (True, 1, 2, 2)
    assert [row[:2] for row in app_state(database)["counters"]] == [("a", 2)]    # the aborted attempt left nothing
    letters = {raw["seq"]: reason for _, _, reason, raw in dead_letters(database)}
    assert letters[2] == "odd amount" and letters[3].startswith("event type ('type') is 'nope'")
    assert ledger(database) == [("own@x", 4, 1, 2)]
    assert not sink.process(rows, 4, query_id="own@x").committed and handler.attempts == 2
    assert sink.known_types() == frozenset({"add"})


class CollectorWatch(Writer):
    """A ``Writer`` that notes whether the cyclic garbage collector runs while it handles the batch and
    while the batch's transaction flushes (a commit participant it enlists)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: dict[str, bool] = {}
        watch = self

        class Flush(activedb.CommitParticipant):
            def about_to_commit(self, transaction, connection) -> None:
                watch.seen["flush"] = gc.isenabled()

        self.participant = Flush()

    def handle(self, tx, batch, ledger) -> None:
        self.seen["handle"] = gc.isenabled()
        lowlevel.enlist(tx, self.participant)
        super().handle(tx, batch, ledger)


@pytest.mark.parametrize("collector_on", [True, False])
def test_the_collector_is_paused_for_the_whole_batch_and_left_as_the_caller_had_it(database, collector_on):
    """Paused from validation to the end of the commit (the batch's records live until its tree ends);
    afterwards enabled again, unless the caller had disabled it."""
    handler = CollectorWatch()
    sink = IngestSink(database, app_counters.MAPPING, query_name="gc", handler=handler, known_types={"add"})
    was = gc.isenabled()
    (gc.enable if collector_on else gc.disable)()
    try:
        outcome = sink.process([_event(1, "a", amount=2), _event(2, "b", amount=4)], 0, query_id="gc@x")
        after = gc.isenabled()
    finally:
        (gc.enable if was else gc.disable)()
    assert (outcome.committed, outcome.events) == (True, 2)
    assert handler.seen == {"handle": False, "flush": False}
    assert after is collector_on


def test_ingest_options_are_checked_in_one_place_before_spark_is_touched():
    with pytest.raises(IngestError, match="handler must be an activedb.ingest.BatchHandler"):
        IngestOptions(handler=object())
    with pytest.raises(IngestError, match="scale-out path only"):
        IngestOptions(app="app.py")
    with pytest.raises(IngestError, match="trigger must be"):
        IngestOptions(trigger=True)
    scale_out = dict(partition_by_key=2, app="app.py")
    assert IngestOptions(**scale_out, on_partition_failure="compensate").on_partition_failure is SplitFailure.COMPENSATE
    with pytest.raises(IngestError, match="'forward'.*'compensate'.*got 'undo'"):
        IngestOptions(**scale_out, on_partition_failure="undo")
    with pytest.raises(IngestError, match=r"RulesHandler\(lower_declared='no'\) takes True or False"):
        IngestOptions(handler=RulesHandler(lower_declared="no"))
    common = dict(mapping=app_counters.MAPPING, query_name="q", checkpoint_location="ck")
    with pytest.raises(IngestError, match="no option 'prefech'.*prefetch"):
        ingest(object(), object(), prefech={"counters": None}, **common)
    with pytest.raises(IngestError, match="not both"):
        ingest(object(), object(), options=IngestOptions(), lineage=False, **common)
    with pytest.raises(IngestError, match="needs a streaming DataFrame"):      # the options passed their checks
        ingest(object(), object(), options=IngestOptions(handler=RulesHandler({"counters": None})), **common)


def test_known_types_given_as_one_name_are_refused_with_what_to_give():
    """``ingest(…, known_types="add")`` — one name, not a collection of them — was read as the set of its letters, so
    every event of type ``add`` became a dead letter as an unknown type; it is refused, as an application's
    ``KNOWN_TYPES = "add"`` is."""
    with pytest.raises(IngestError, match=r"known_types is 'add'; give the event types as a list or a set of names, "
                                          r"e.g. known_types = \{'add'\}"):
        IngestOptions(known_types="add")
    with pytest.raises(IngestError, match="known_types is 3; give the event types as a list or a set of names"):
        IngestOptions(known_types=3)
    assert IngestOptions(known_types=["add", "sub"]).known_types == ["add", "sub"]


@pytest.mark.parametrize("first_commits", [True, False], ids=["first commits", "first aborts"])
def test_two_flushes_of_one_batch_at_once_commit_it_once(database, first_commits):
    """Two transactions write the ledger row of the same batch at once: the second's row (sent along its flush's last
    round trip) waits on the first's uncommitted key; if the first commits, the second is ``BatchAlreadyCommitted``
    and nothing of it is written (no transaction-log row); if the first aborts, the second commits.  Ordered by
    events and by PostgreSQL's own lock wait (pg_stat_activity), never by sleeping."""
    query = f"concurrent-{first_commits}"
    holding, release = threading.Event(), threading.Event()
    outcomes: dict[str, object] = {}
    log_ids: dict[str, str] = {}

    def hold(batch_id):               # the first flush, its ledger row written, just before its COMMIT
        holding.set()
        assert release.wait(60), "the test never released the first flush"
        if not first_commits:
            raise RuntimeError("the first flush gives up")

    def flush(name, on_flush):
        try:
            with database.transaction(participants=[activedb.ingest.IngestionLedger(database, query, 1,
                                                                                 on_flush=on_flush)]) as tx:
                log_ids[name] = tx.log_id
            outcomes[name] = "committed"
        except Exception as error:    # noqa: BLE001 - recorded and asserted on below
            outcomes[name] = error

    first = threading.Thread(target=flush, args=("first", hold), daemon=True)
    second = threading.Thread(target=flush, args=("second", None), daemon=True)
    first.start()
    assert holding.wait(60), "the first flush never reached its COMMIT"
    second.start()

    def ledger_waiter():
        with database.engine.connect() as connection:
            return connection.execute(sa.text(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND query LIKE 'INSERT INTO activedb_ingestion_ledger%'")).scalar()

    wait_until(ledger_waiter, 60, "the second flush to wait on the ledger's key", lambda: outcomes)
    release.set()
    for thread in (first, second):
        thread.join(60)
        assert not thread.is_alive(), f"a flush hung; outcomes so far {outcomes!r}"
    winner, loser = ("first", "second") if first_commits else ("second", "first")
    assert outcomes[winner] == "committed"
    expected = activedb.BatchAlreadyCommitted if first_commits else RuntimeError
    assert isinstance(outcomes[loser], expected), outcomes
    with database.engine.connect() as connection:
        ledger_ids = connection.execute(sa.text(
            "SELECT transaction_id FROM activedb_ingestion_ledger WHERE query_id = :q"), {"q": query}).scalars().all()
        logged = connection.execute(sa.text(
            "SELECT transaction_id FROM activedb_transaction_log WHERE transaction_id = ANY(:ids)"),
            {"ids": list(log_ids.values())}).scalars().all()
    assert ledger_ids == [log_ids[winner]] and logged == [log_ids[winner]]


def test_a_java_error_a_traceback_shows_past_a_rules_failure_is_bounded_for_spark_and_a_hidden_one_is_not():
    """``for_spark`` bounds an error whose traceback holds a Java call's error — Spark's pattern starts there — also
    when it is the context of what a rule raised (a ``RuleFailed``'s cause, whose contexts ``classify`` does not
    follow): the traceback shows it.  An error that hid its Java context (``raise … from None``) reaches Spark as
    itself: its traceback holds none."""
    from activedb.errors import RuleFailed
    from spark_bridge._foreach import BatchFailed, for_spark

    java_error = type("Py4JJavaError", (Exception,), {"__module__": "py4j.protocol"})

    def failed(hide: bool) -> BaseException:
        try:
            try:
                try:
                    raise java_error("An error occurred while calling o42.count.\n: java.lang.InterruptedException\n"
                                     "\tat java.base/java.lang.Object.wait(Native Method)")
                except Exception:
                    if hide:
                        raise ValueError("the rule's own error") from None
                    raise ValueError("the rule's own error")
            except ValueError as error:
                raise RuleFailed("rule 'r' failed", "r", None) from error
        except RuleFailed as failure:
            return failure

    bounded = for_spark(failed(hide=False), 3)
    assert isinstance(bounded, BatchFailed), bounded
    assert "java.lang.InterruptedException" in str(bounded) and "\tat " not in str(bounded)
    hidden = failed(hide=True)
    assert for_spark(hidden, 3) is hidden
