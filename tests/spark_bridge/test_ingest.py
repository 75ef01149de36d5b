"""``spark_bridge.ingest`` on real Spark (``local[2]``) and real PostgreSQL.

Every test runs a JSON-lines file stream (one file per micro-batch, ``availableNow``)
through the test application ``app_counters`` and checks the database afterwards:

* the whole stream equals the same events applied directly (no Spark), per key and per
  rule, and a batch Spark re-runs after a lost commit is skipped by the ledger;
* malformed rows and payloads the rules reject are dead letters with reasons, the other
  rows are applied;
* out-of-order rows of a batch are applied in application-time order;
* the batch watermark is punctuated and events older than it are dead letters;
* the scale-out path (two partitions, two engines in Spark's Python workers) equals the
  direct run too;
* misuse gets clear errors (no checkpoint, a checkpoint resumed under another name).
"""

from __future__ import annotations

import datetime as dt
import re

import pytest

import activedb.ingest
import spark_bridge
from spark_bridge.errors import IngestError
from tests.spark_bridge import app_counters
from tests.spark_bridge._streams import (
    APP_FILE,
    BASE_TIME,
    STREAM_TIMEOUT_SECONDS,
    CountedName,
    app_database,
    app_state,
    apply_directly,
    counter_workload,
    dead_letters,
    iso,
    ledger,
    new_app_database,
    run_to_end,
    write_files,
)

UTC = dt.timezone.utc


def _stream(spark, directory):
    return spark.readStream.schema(app_counters.SCHEMA).option("maxFilesPerTrigger", 1).json(str(directory))


def _ingest(spark, database, directory, checkpoint, query_name, **options):
    return spark_bridge.ingest(database, _stream(spark, directory), mapping=app_counters.MAPPING,
                               query_name=query_name, checkpoint_location=str(checkpoint),
                               trigger={"availableNow": True}, **options)


def _refused_by_ingest_on_both_paths(database, frame, error, checkpoint, **options):
    """``ingest(frame, …)`` raises an IngestError matching ``error`` on the one-task path and on the scale-out path
    (two partitions)."""
    for path in ({}, dict(partition_by_key=2, app=APP_FILE)):
        with pytest.raises(IngestError, match=error):
            spark_bridge.ingest(database, frame, mapping=app_counters.MAPPING, query_name="x",
                                checkpoint_location=str(checkpoint), **path, **options)


def _direct_sink(spark, database, frame, name, checkpoint, *, scale_out=False):
    """``frame`` run to the end of its input as query ``name`` by a sink wired as ``foreachBatch`` directly — an
    ``IngestSink``, or (``scale_out``) a ``PartitionedIngestSink`` of two partitions: ``(sink, query)``."""
    if scale_out:
        sink: spark_bridge.IngestSink = spark_bridge.PartitionedIngestSink(
            database, app_counters.MAPPING, partitions=2, app=APP_FILE, query_name=name, spark_session=spark)
    else:
        sink = spark_bridge.IngestSink(database, app_counters.MAPPING, query_name=name, spark_session=spark)
    query = (frame.writeStream.foreachBatch(sink).queryName(name).option("checkpointLocation", str(checkpoint))
             .trigger(availableNow=True).start())
    return sink, query


def _refused_by_a_direct_sink(spark, database, frame, name, checkpoint, error, *, scale_out):
    """``_direct_sink(…)``'s query stops with ``error``, the sink's last failure an IngestError, nothing applied (no
    ledger row, no dead letter)."""
    sink, query = _direct_sink(spark, database, frame, name, checkpoint, scale_out=scale_out)
    with pytest.raises(Exception, match=error):
        query.awaitTermination(STREAM_TIMEOUT_SECONDS)
    failure = sink.last_failure()
    assert failure is not None and isinstance(failure[1], IngestError), failure
    assert (ledger(database), dead_letters(database)) == ([], [])


@pytest.mark.spark
def test_stream_to_the_end_equals_the_events_applied_directly_and_a_replay_is_skipped(
        spark, tmp_path, make_database_url):
    workload = counter_workload(files=4, rows_per_file=40, seed=11)
    write_files(tmp_path / "in", workload.batches)
    streamed_url = make_database_url("streamed", migrations=(app_counters.MIGRATIONS,))
    streamed, direct = app_database(streamed_url), new_app_database(make_database_url, "direct")
    resumed = None
    try:
        query = _ingest(spark, streamed, tmp_path / "in", tmp_path / "checkpoint", "counters",
                        watermark_delay="5 minutes")
        run_to_end(query)
        reference = apply_directly(direct, workload.good)

        assert app_state(streamed) == app_state(direct)
        assert app_state(streamed)["counters"], "the workload must change something"
        [status] = activedb.ingest.ingestion_status(streamed, "counters")
        assert status.rule_firings == reference.rule_firings
        assert (status.batches, status.last_batch_id, status.events) == (4, 3, reference.applied)
        letters = dead_letters(streamed)
        assert status.dead_letters == len(letters) == len(workload.malformed) + reference.rejected
        assert sum(reason.startswith("rejected by rule") for _, _, reason, _ in letters) == reference.rejected
        assert {query_id for query_id, *_ in letters} == {f"counters@{query.id}"}

        # The watermark: Spark's, per batch, punctuated once the batch committed.
        latest_before_last_batch = max(dt.datetime.fromisoformat(row["ts"].replace("Z", "+00:00"))
                                       for batch in workload.batches[:3] for row in batch if row["seq"] > 0)
        assert streamed.watermark("counters") == latest_before_last_batch - dt.timedelta(minutes=5)
        statistics = spark_bridge.sink_of(query).statistics()
        assert (statistics.batches, statistics.events, statistics.dead_letters) == (4, reference.applied,
                                                                                     len(letters))
        assert statistics.rule_firings == reference.rule_firings

        # Lose Spark's commit of the last batch, as a crash after the database commit would:
        # Spark re-runs batch 3 with the same id and query id; the ledger skips it.
        # A new engine instance (a restarted driver) is told the last recorded watermark.
        (tmp_path / "checkpoint" / "commits" / "3").unlink()
        before = app_state(streamed)
        resumed = app_database(streamed_url)
        again = _ingest(spark, resumed, tmp_path / "in", tmp_path / "checkpoint", "counters",
                        watermark_delay="5 minutes")
        run_to_end(again)
        assert again.id == query.id
        replay = spark_bridge.sink_of(again).statistics()
        assert (replay.batches, replay.batches_skipped, replay.last_batch_id) == (0, 1, 3)
        assert app_state(streamed) == before
        assert len(dead_letters(streamed)) == len(letters)
        assert [batch for _, batch, *_ in ledger(streamed)] == [0, 1, 2, 3]
        assert resumed.watermark("counters") == streamed.watermark("counters")
    finally:
        for database in (streamed, direct, resumed):
            if database is not None:
                database.close()


@pytest.mark.spark
def test_malformed_rows_and_rejected_payloads_become_dead_letters_and_the_rest_is_applied(
        spark, tmp_path, make_database_url):
    minute = BASE_TIME
    rows = [
        {"type": "add", "key": "a", "ts": iso(minute), "amount": 150, "seq": 1},
        {"type": "add", "key": None, "ts": iso(minute), "amount": 1, "seq": 2},          # null key
        {"type": "teleport", "key": "a", "ts": iso(minute), "amount": 1, "seq": 3},     # unknown type
        {"type": "add", "key": "a", "ts": "not a time", "amount": 1, "seq": 4},          # unparsable time
        {"type": "add", "key": "a", "ts": iso(minute + dt.timedelta(seconds=1)), "amount": -5, "seq": 5},  # rejected
        {"type": "sub", "key": "b", "ts": iso(minute + dt.timedelta(seconds=2)), "amount": 7, "seq": 6},   # overdrawn
        {"type": "sub", "key": "a", "ts": iso(minute + dt.timedelta(seconds=3)), "amount": 20, "seq": 7},
    ]
    write_files(tmp_path / "in", [rows])
    database = new_app_database(make_database_url, "letters")
    try:
        query = _ingest(spark, database, tmp_path / "in", tmp_path / "checkpoint", "letters")
        run_to_end(query)
        state = app_state(database)
        assert [(key, total, events, trail) for key, total, events, trail, _ in state["counters"]] == [
            ("a", 130, 2, "1,7")]
        assert state["milestones"] == [("a", 100, 1)]
        letters = {raw["seq"]: (reason, raw, batch) for _, batch, reason, raw in dead_letters(database)}
        assert sorted(letters) == [2, 3, 4, 5, 6]
        assert letters[2][0] == "key ('key') is null"
        assert letters[3][0].startswith("event type ('type') is 'teleport', not a known event type (known: 'add', "
                                        "'sub')")
        assert letters[4][0] == "timestamp ('ts') is null"
        assert letters[5][0].startswith("rejected by rule 'apply_add'") and "NegativeAmount" in letters[5][0]
        assert letters[6][0].startswith("rejected by rule 'apply_sub'") and "Overdrawn" in letters[6][0]
        assert letters[5][1] == {"type": "add", "key": "a", "ts": "2024-05-01T12:00:01+00:00", "amount": -5,
                                 "seq": 5}
        assert {batch for _, _, batch in letters.values()} == {0}
        assert ledger(database) == [(f"letters@{query.id}", 0, 2, 5)]
    finally:
        database.close()


@pytest.mark.spark
def test_out_of_order_rows_of_a_batch_are_applied_in_application_time_order(spark, tmp_path, make_database_url):
    # Arrival order is the reverse of application time; both keys interleave.
    rows = [{"type": "add", "key": f"k{seq % 2}", "ts": iso(BASE_TIME + dt.timedelta(seconds=seq)), "amount": 1,
             "seq": seq} for seq in range(20)]
    write_files(tmp_path / "in", [list(reversed(rows))])
    database = new_app_database(make_database_url, "order")
    try:
        run_to_end(_ingest(spark, database, tmp_path / "in", tmp_path / "checkpoint", "order"))
        trails = {key: trail for key, _, _, trail, _ in app_state(database)["counters"]}
        assert trails == {"k0": ",".join(str(seq) for seq in range(0, 20, 2)),
                          "k1": ",".join(str(seq) for seq in range(1, 20, 2))}
    finally:
        database.close()


@pytest.mark.spark
def test_the_watermark_is_punctuated_and_events_older_than_it_are_dead_letters(spark, tmp_path, make_database_url):
    def row(seq, minute, second):
        return {"type": "add", "key": "w", "ts": iso(BASE_TIME + dt.timedelta(minutes=minute, seconds=second)),
                "amount": 1, "seq": seq}

    batches = [
        [row(1, 0, 10), row(2, 0, 50)],
        [row(3, 1, 0), row(4, 0, 20), row(5, 0, 45)],  # watermark 0:50 - 10 s = 0:40: seq 4 is late
        [row(6, 1, 30)],                               # watermark 1:00 - 10 s = 0:50
    ]
    write_files(tmp_path / "in", batches)
    database = new_app_database(make_database_url, "watermark")
    try:
        query = _ingest(spark, database, tmp_path / "in", tmp_path / "checkpoint", "late", watermark_delay="10 seconds")
        run_to_end(query)
        trails = {key: trail for key, _, _, trail, _ in app_state(database)["counters"]}
        assert trails == {"w": "1,2,5,3,6"}
        [(reason, raw)] = [(reason, raw) for _, _, reason, raw in dead_letters(database)]
        assert raw["seq"] == 4
        assert reason.startswith("late: ts 2024-05-01T12:00:20+00:00 is older than the stream's watermark "
                                 "2024-05-01T12:00:40+00:00")
        assert database.watermark("late") == BASE_TIME + dt.timedelta(seconds=50)
        with database.engine.connect() as connection:
            import sqlalchemy as sa

            watermarks = connection.execute(sa.text(
                "SELECT batch_id, watermark FROM activedb_ingestion_ledger ORDER BY batch_id")).all()
        assert [(batch, None if mark is None else mark.astimezone(UTC)) for batch, mark in watermarks] == [
            (0, None), (1, BASE_TIME + dt.timedelta(seconds=40)), (2, BASE_TIME + dt.timedelta(seconds=50))]
        assert spark_bridge.sink_of(query).statistics().watermark_lag_seconds > 0
    finally:
        database.close()


@pytest.mark.spark
def test_a_sink_restarted_with_a_watermark_reads_it_though_its_first_run_had_none(spark, tmp_path, make_database_url):
    """The sink remembers per Spark query id whether its plan declares a watermark (not to ask the JVM every
    batch); a restart keeps the id but is a new run with a new plan, which is asked again."""
    def row(seq, second):
        return {"type": "add", "key": "w", "ts": iso(BASE_TIME + dt.timedelta(seconds=second)), "amount": 1, "seq": seq}

    write_files(tmp_path / "in", [[row(1, 10)], [row(2, 50)]])
    database = new_app_database(make_database_url, "rewatermark")
    try:
        query = _ingest(spark, database, tmp_path / "in", tmp_path / "checkpoint", "rewm")
        run_to_end(query)
        sink = spark_bridge.sink_of(query)
        write_files(tmp_path / "more", [[row(3, 60)], [row(4, 70)]])
        for path in sorted((tmp_path / "more").iterdir()):
            path.rename(tmp_path / "in" / f"more-{path.name}")
        restarted = (_stream(spark, tmp_path / "in").withWatermark("ts", "10 seconds").writeStream
                     .foreachBatch(sink).queryName("rewm").option("checkpointLocation", str(tmp_path / "checkpoint"))
                     .trigger(availableNow=True).start())
        run_to_end(restarted)
        assert restarted.id == query.id
        with database.engine.connect() as connection:
            import sqlalchemy as sa

            watermarks = connection.execute(sa.text(
                "SELECT batch_id, watermark FROM activedb_ingestion_ledger ORDER BY batch_id")).all()
        assert [(batch, None if mark is None else mark.astimezone(UTC)) for batch, mark in watermarks] == [
            (0, None), (1, None), (2, None), (3, BASE_TIME + dt.timedelta(seconds=50))]
    finally:
        database.close()


@pytest.mark.spark
def test_a_plan_without_a_watermark_node_is_not_taken_for_one_by_a_column_s_name(spark, tmp_path, make_database_url):
    """The sink asks Spark for the batch's watermark (three py4j calls a batch) only when the run's plan declares one;
    it searched the plan's text for "watermark", so a column (or a source path, a topic) named like one —
    ``watermark_x`` here — made every batch of the run ask for a watermark it never had.  The plan's
    ``EventTimeWatermark`` nodes say it; a watermark declared on the time column is still found."""
    from pyspark.sql import functions as F

    from spark_bridge import _sink

    write_files(tmp_path / "in", [[{"type": "add", "key": "w", "ts": iso(BASE_TIME), "amount": 1, "seq": 1}]])
    database = new_app_database(make_database_url, "namedlike")
    try:
        named = _stream(spark, tmp_path / "in").withColumn("watermark_x", F.lit(1))
        for name, frame, declared in (("named", named, False),
                                      ("declared", named.withWatermark("ts", "10 seconds"), True)):
            query = spark_bridge.ingest(database, frame, mapping=app_counters.MAPPING, query_name=name,
                                        checkpoint_location=str(tmp_path / f"checkpoint-{name}"),
                                        trigger={"availableNow": True})
            run_to_end(query)
            assert bool(_sink.watermark_columns(query._jsq.streamingQuery().logicalPlan())) is declared, name
    finally:
        database.close()


@pytest.mark.spark
def test_the_batches_after_start_returned_ask_spark_neither_the_query_id_nor_whether_it_still_runs(
        spark, tmp_path, make_database_url, monkeypatch):
    """``ingest()`` tells the run its query once ``start()`` returned (``_sink.QueryRun``): later batches read the
    id and the running execution from it, not from Spark.  Batch 0 is held at its ``fetched`` phase until
    ``ingest()`` has returned, so every later batch runs after it (batch 0 itself may run before or after); the
    ledger keys every batch under the query's id,
    and the watermark the plan declares is read for each batch."""
    import threading

    from spark_bridge import _sink

    def row(seq, second):
        return {"type": "add", "key": "w", "ts": iso(BASE_TIME + dt.timedelta(seconds=second)), "amount": 1, "seq": seq}

    write_files(tmp_path / "in", [[row(1, 10)], [row(2, 50)], [row(3, 70)]])
    asked, currents, returned = [], [], threading.Event()
    real_query_id, real_watermark = _sink.streaming_query_id, _sink.IngestSink.spark_watermark
    monkeypatch.setattr(_sink, "streaming_query_id", lambda frame: asked.append(1) or real_query_id(frame))

    def watermark(self, spark_query_id, *, current=None):
        currents.append(current is not None)
        return real_watermark(self, spark_query_id, current=current)

    monkeypatch.setattr(_sink.IngestSink, "spark_watermark", watermark)

    def hold_the_first(phase, batch_id):
        if phase == "fetched" and batch_id == 0:
            assert returned.wait(STREAM_TIMEOUT_SECONDS), "ingest() did not return while batch 0 waited"

    database = new_app_database(make_database_url, "known_run")
    try:
        query = _ingest(spark, database, tmp_path / "in", tmp_path / "checkpoint", "known", on_phase=hold_the_first,
                        watermark_delay="10 seconds")
        returned.set()
        run_to_end(query)
        # (batch 0 asks if it reached the question before start() returned: either may come first)
        assert len(currents) == 3 and currents[1:] == [True, True] and len(asked) == currents.count(False)
        assert [(query_id, batch) for query_id, batch, _, _ in ledger(database)] == [
            (f"known@{query.id}", batch) for batch in range(3)]
        with database.engine.connect() as connection:
            import sqlalchemy as sa

            watermarks = connection.execute(sa.text(
                "SELECT watermark FROM activedb_ingestion_ledger ORDER BY batch_id")).scalars().all()
        assert [None if mark is None else mark.astimezone(UTC) for mark in watermarks] == [
            None, BASE_TIME, BASE_TIME + dt.timedelta(seconds=40)]
    finally:
        database.close()


@pytest.mark.spark
def test_the_batches_of_a_run_share_one_python_session_wrapper(spark, tmp_path, make_database_url, monkeypatch):
    """``_foreach.foreach_batch``: PySpark's own foreachBatch wraps each batch's session in a new ``SparkSession``;
    ingest()'s run makes one for its three batches, and they are applied as ever."""
    from pyspark.sql import session as pyspark_session

    made, real_init = [], pyspark_session.SparkSession.__init__

    def counting_init(self, *args, **kwargs):
        made.append(1)
        real_init(self, *args, **kwargs)

    write_files(tmp_path / "in", [[{"type": "add", "key": "w", "ts": iso(BASE_TIME + dt.timedelta(seconds=second)),
                                    "amount": 1, "seq": second}] for second in (1, 2, 3)])
    database = new_app_database(make_database_url, "one_wrapper")
    try:
        query = _ingest(spark, database, tmp_path / "in", tmp_path / "checkpoint", "wrapper")
        monkeypatch.setattr(pyspark_session.SparkSession, "__init__", counting_init)
        run_to_end(query)
        monkeypatch.undo()
        assert len(made) <= 1 and [batch for _, batch, _, _ in ledger(database)] == [0, 1, 2]
        assert {key: trail for key, _, _, trail, _ in app_state(database)["counters"]} == {"w": "1,2,3"}
    finally:
        database.close()


@pytest.mark.spark
def test_a_writer_handed_back_unstarted_runs_its_batches_asking_spark_as_a_sink_does(spark, tmp_path,
                                                                                    make_database_url):
    """``start=False``: the writer keeps PySpark's ``foreachBatch`` callback and its run is never told the query
    (it could be started twice): each batch asks Spark for the query id, and the ledger keys them under it."""
    write_files(tmp_path / "in", [[{"type": "add", "key": "w", "ts": iso(BASE_TIME + dt.timedelta(seconds=second)),
                                    "amount": 1, "seq": second}] for second in (1, 2)])
    database = new_app_database(make_database_url, "unstarted")
    try:
        writer = _ingest(spark, database, tmp_path / "in", tmp_path / "checkpoint", "later", start=False)
        query = writer.start()
        run_to_end(query)
        assert [(query_id, batch) for query_id, batch, _, _ in ledger(database)] == [
            (f"later@{query.id}", 0), (f"later@{query.id}", 1)]
        assert {key: trail for key, _, _, trail, _ in app_state(database)["counters"]} == {"w": "1,2"}
    finally:
        database.close()


@pytest.mark.spark
def test_scale_out_path_applies_each_key_partition_in_its_own_engine(spark, tmp_path, make_database_url):
    workload = counter_workload(files=3, rows_per_file=40, seed=23, keys=8)
    write_files(tmp_path / "in", workload.batches)
    streamed = new_app_database(make_database_url, "scaled")
    direct = new_app_database(make_database_url, "scaled_direct")
    try:
        query = _ingest(spark, streamed, tmp_path / "in", tmp_path / "checkpoint", "scaled", partition_by_key=2,
                        app=APP_FILE)
        run_to_end(query)
        reference = apply_directly(direct, workload.good)
        assert app_state(streamed) == app_state(direct)
        rows = ledger(streamed)
        assert {query_id for query_id, *_ in rows} == {f"scaled@{query.id}#p0", f"scaled@{query.id}#p1"}
        assert sorted({batch for _, batch, *_ in rows}) == [0, 1, 2]
        [status] = activedb.ingest.ingestion_status(streamed, "scaled")
        assert (status.batches, status.partitions, status.events) == (3, 2, reference.applied)
        assert status.rule_firings == reference.rule_firings
        assert status.dead_letters == len(workload.malformed) + reference.rejected
        statistics = spark_bridge.sink_of(query).statistics()
        assert (statistics.batches, statistics.events) == (3, reference.applied)
        # Each key's events were applied by one engine: every key's rows are in one partition.
        assert streamed.watermark("scaled") is None  # no watermark declared, no punctuation
    finally:
        streamed.close()
        direct.close()


def test_ingest_needs_a_checkpoint_location():
    with pytest.raises(IngestError, match=r"checkpoint_location=DIR.*exactly-once"):
        spark_bridge.ingest(object(), object(), mapping=app_counters.MAPPING, query_name="nowhere")


def test_connect_options_without_the_scale_out_path_are_refused_as_app_is():
    """``connect_options`` go to the scale-out tasks' own ``activedb.connect``; without ``partition_by_key`` they were
    accepted and silently unused (``app=`` and ``on_partition_failure=`` are refused there)."""
    with pytest.raises(IngestError, match=r"connect_options= is for the scale-out path only \(with partition_by_key=N\)"):
        spark_bridge.IngestOptions(connect_options={"rule_execution": "inline"})
    assert spark_bridge.IngestOptions(partition_by_key=2, app="app.py", connect_options={}).connect_options == {}


def test_deadlines_on_the_scale_out_path_are_refused_not_ignored():
    """The scale-out path's batches run in Spark's tasks, which take no deadlines: ``deadlines=`` with
    ``partition_by_key`` was accepted and silently unused, so a rule that never returned held its batch for ever."""
    with pytest.raises(IngestError, match=r"deadlines= does not combine with partition_by_key="):
        spark_bridge.IngestOptions(partition_by_key=2, app="app.py",
                                   deadlines=activedb.ingest.Deadlines(batch=60.0, rule=5.0))


@pytest.mark.parametrize("start", ["no", 0, None])
def test_start_that_is_no_switch_is_refused(start):
    """``start`` was read by truth: ``ingest(…, start="no")`` started the query, ``start=0`` or ``None`` handed the
    writer back."""
    with pytest.raises(IngestError, match=r"ingest\(start=.*\) takes True or False"):
        spark_bridge.IngestOptions(start=start)


def test_the_stream_s_columns_are_checked_in_comparisons_linear_in_their_number():
    """``check_columns`` — asked by ``ingest()`` of its frame and by a sink of every batch — looked for a repeated
    column in the columns before each (``column in columns[:position]``, a copy each time) and for each mapped column
    in the list: quadratic in the columns, so a stream of wide rows paid for it in every batch (seconds at 20,000
    columns).  Counted, not timed: the machine is shared."""
    from spark_bridge._sink import check_columns

    width = 2_000
    names = [CountedName(name) for name in ("type", "key", "ts", *(f"c{index}" for index in range(width)))]
    CountedName.compared = 0
    check_columns(names, spark_bridge.EventMapping("type", "key", "ts",
                                                   payload_columns=[f"c{index}" for index in range(width)]))
    assert CountedName.compared < 10 * width, f"{CountedName.compared} comparisons of {width} columns' names"
    with pytest.raises(IngestError, match=r"the stream has 2 columns named 'c7'"):
        check_columns([*names, CountedName("c7")], app_counters.MAPPING)
    with pytest.raises(IngestError, match=r"the stream has no column 'c2000' named by the mapping"):
        check_columns(names, spark_bridge.EventMapping("type", "key", "ts", payload_columns=["c1", "c2000"]))


@pytest.mark.parametrize(("options", "error"), [
    ({"app": 3}, r"app=3 names the application .* a module name, a \.py path or a register\(db\) function"),
    ({"app": ""}, r"app='' names the application .* a module name, a \.py path or a register\(db\) function"),
    ({"app": "app.py", "connect_options": [("lock_timeout", 5.0)]},
     r"connect_options=\[\('lock_timeout', 5\.0\)\] takes a dict of activedb\.connect's keywords"),
    ({"app": "app.py", "connect_options": "lock_timeout=5"},
     r"connect_options='lock_timeout=5' takes a dict of activedb\.connect's keywords"),
    ({"app": "app.py", "connect_options": {5: 1}}, r"connect_options=\{5: 1\} takes a dict of activedb\.connect's")],
    ids=["app a number", "app empty", "options a list", "options a text", "options a number's name"])
def test_scale_out_options_of_the_wrong_kind_are_refused_before_spark_starts(options, error):
    """``app=3`` (or ``""``) started the query, and every task of the first batch failed loading an application named
    ``'3'``; ``connect_options`` that were no mapping failed ``ingest()`` with a bare ``TypeError: 'list' object is
    not a mapping``."""
    with pytest.raises(IngestError, match=error):
        spark_bridge.IngestOptions(partition_by_key=2, **options)


@pytest.mark.parametrize("trigger", [{"continuous": "1 second"}, {"realTime": "5 seconds"}])
def test_a_trigger_that_runs_no_micro_batches_is_refused_before_spark_starts(trigger):
    """``ingest()`` applies micro-batches through ``foreachBatch``, which Spark runs with neither the continuous nor the
    real-time trigger: ``trigger={"continuous": "1 second"}`` passed ``ingest()``'s checks and Spark's own error came
    out of ``start()`` (an ``AnalysisException``: *'foreachBatch' is not supported with continuous trigger*; for
    ``realTime`` an ``IllegalArgumentException`` suggesting a setting that bypasses the check), not an
    ``IngestError`` saying what to give."""
    with pytest.raises(IngestError, match=r"trigger=.* runs no micro-batches.*processing-time interval.*availableNow"):
        spark_bridge.IngestOptions(trigger=trigger)


@pytest.mark.parametrize("options", [{"trigger": 5}, {}, "availableNow"], ids=["dict", "empty dict", "text"])
def test_options_that_are_no_ingest_options_are_refused_with_what_to_give(options):
    """``ingest(…, options={"trigger": 5})`` failed with ``AttributeError: 'dict' object has no attribute
    'watermark_delay'``, and ``options={}`` ran with every default, as if nothing had been given."""
    with pytest.raises(IngestError, match=r"options= takes an IngestOptions\(…\).*or give its fields as keywords"):
        spark_bridge.ingest(object(), object(), mapping=app_counters.MAPPING, query_name="q", checkpoint_location="ck",
                            options=options)


@pytest.mark.spark
def test_the_scale_out_path_needs_the_app_and_app_needs_the_scale_out_path(spark, tmp_path, make_database_url):
    database = new_app_database(make_database_url, "misuse")
    try:
        frame = _stream(spark, tmp_path)
        with pytest.raises(IngestError, match="needs app="):
            spark_bridge.ingest(database, frame, mapping=app_counters.MAPPING, query_name="x",
                                checkpoint_location=str(tmp_path / "c"), partition_by_key=2)
        with pytest.raises(IngestError, match="scale-out path only"):
            spark_bridge.ingest(database, frame, mapping=app_counters.MAPPING, query_name="x",
                                checkpoint_location=str(tmp_path / "c"), app=APP_FILE)
        with pytest.raises(IngestError, match="no column 'worker'"):
            spark_bridge.ingest(database, frame, mapping=spark_bridge.EventMapping("type", "worker", "ts"),
                                query_name="x", checkpoint_location=str(tmp_path / "c"))
    finally:
        database.close()


@pytest.mark.spark
@pytest.mark.parametrize(("named", "missing"), [
    ({"id_column": "event_id"}, "event_id"), ({"producer_column": "producer"}, "producer"),
    ({"producer_column": "amount", "accuracy_column": "accuracy"}, "accuracy")], ids=["id", "producer", "accuracy"])
def test_a_column_the_mapping_names_beyond_type_key_and_time_must_be_in_the_stream(spark, tmp_path, database_url,
                                                                                   named, missing):
    """``ingest()`` checked only the type, key, time and payload columns: a mapping whose ``id_column`` (or an
    interval column) the stream lacks — a typo — started, and every row of every batch became a dead letter
    (*missing field 'event_id' (the event id)*)."""
    database = app_database(database_url)
    try:
        mapping = spark_bridge.EventMapping("type", "key", "ts", payload_columns=("seq",), **named)
        with pytest.raises(IngestError, match=f"the stream has no column '{missing}' named by the mapping"):
            spark_bridge.ingest(database, _stream(spark, tmp_path), mapping=mapping, query_name="x",
                                checkpoint_location=str(tmp_path / "c"))
        assert spark.streams.active == []
    finally:
        database.close()


@pytest.mark.spark
def test_a_trigger_spark_cannot_read_is_an_ingest_error_saying_what_to_give(spark, tmp_path, make_database_url):
    """A processing-time interval Spark does not read (a typo, a negative or not-a-number of seconds) or a keyword
    ``DataStreamWriter.trigger`` does not take was Spark's own error (an ``IllegalArgumentException`` from the JVM,
    or pyspark's), not an ``IngestError``: ``activedb run --trigger 5s`` ended in a traceback."""
    database = new_app_database(make_database_url, "trigger")
    try:
        for trigger in ("5s", -5, float("nan"), {"every": 5}):
            with pytest.raises(IngestError, match=r"trigger=.* is not one Spark takes .*'5 seconds'"):
                spark_bridge.ingest(database, _stream(spark, tmp_path), mapping=app_counters.MAPPING, query_name="x",
                                    checkpoint_location=str(tmp_path / "c"), trigger=trigger)
        assert spark.streams.active == []
    finally:
        database.close()


@pytest.mark.spark
def test_a_watermark_delay_spark_cannot_read_is_an_ingest_error_saying_what_to_give(spark, tmp_path,
                                                                                   make_database_url):
    """A watermark delay Spark does not read (a typo, a negative delay) was Spark's own error from ``withWatermark``,
    not an ``IngestError``: ``activedb run --watermark-delay 30s`` ended in a traceback."""
    database = new_app_database(make_database_url, "delay")
    try:
        for delay in ("30s", "-5 seconds", dt.timedelta(seconds=-5)):
            with pytest.raises(IngestError, match=r"watermark_delay=.* is not a delay Spark takes .*'30 seconds'"):
                spark_bridge.ingest(database, _stream(spark, tmp_path), mapping=app_counters.MAPPING, query_name="x",
                                    checkpoint_location=str(tmp_path / "c"), watermark_delay=delay)
    finally:
        database.close()


@pytest.mark.spark
def test_a_watermark_on_another_column_than_the_mapping_s_time_is_refused_naming_it(spark, tmp_path,
                                                                                  make_database_url):
    """Spark's watermark of a batch is the watermark of the column ``withWatermark`` was declared on (with several,
    their minimum); the sink judged the mapping's time column late by it and punctuated with it — a watermark on
    an arrival time, say, made events dead letters by another column's clock.  ``ingest()`` now refuses such a
    frame naming the column; a watermark on the time column (declared, or the column renamed after it) is taken.
    (With ``watermark_delay=`` besides, a frame's watermark is refused on any column: the next test.)"""
    from pyspark.sql import functions as F

    database = new_app_database(make_database_url, "wmcolumn")
    try:
        arriving = _stream(spark, tmp_path).withColumn("arrived", F.col("ts"))
        refused = {"declared": (arriving.withWatermark("arrived", "10 seconds"), {}),
                   "besides one on the time": (arriving.withWatermark("arrived", "10 seconds")
                                               .withWatermark("ts", "5 seconds"), {})}
        for case, (frame, options) in refused.items():
            with pytest.raises(IngestError, match=r"watermark on column 'arrived', not on the mapping's time column "
                                                  r"'ts'.*withWatermark\('ts', …\) or watermark_delay="):
                spark_bridge.ingest(database, frame, mapping=app_counters.MAPPING, query_name="x",
                                    checkpoint_location=str(tmp_path / "c"), **options)
            assert spark.streams.active == [], case
        renamed = (_stream(spark, tmp_path).withColumnRenamed("ts", "time").withWatermark("time", "10 seconds")
                   .withColumnRenamed("time", "ts"))
        for frame, options in [(arriving.withWatermark("ts", "10 seconds"), {}),
                               (arriving, {"watermark_delay": "5 seconds"}), (renamed, {})]:
            writer = spark_bridge.ingest(database, frame, mapping=app_counters.MAPPING, query_name="x",
                                         checkpoint_location=str(tmp_path / "c"), start=False, **options)
            assert spark_bridge.sink_of(writer) is not None
    finally:
        database.close()


@pytest.mark.spark
def test_a_watermark_on_another_column_is_refused_for_a_sink_wired_with_foreach_batch_directly(
        spark, tmp_path, make_database_url):
    """An ``IngestSink`` given ``spark_session`` may be wired as ``foreachBatch`` directly (as a restart does with
    ``sink_of(query)``); ``ingest()``'s refusal of a watermark on another column than the mapping's time did not
    apply there, so the sink judged the time column late by another column's watermark: here batch 1's event, an
    hour "behind" a watermark taken from its arrival time, became a dead letter.  The sink refuses such a run at its
    first batch with ``ingest()``'s error, before applying anything (the query stops; nothing is lost: Spark runs
    the batch again after a restart); a watermark on the time column, also renamed to it, is taken."""
    from pyspark.sql import functions as F

    def row(seq, second):
        return {"type": "add", "key": "w", "ts": iso(BASE_TIME + dt.timedelta(seconds=second)), "amount": 1,
                "seq": seq}

    write_files(tmp_path / "in", [[row(1, 10)], [row(2, 20)]])
    database = new_app_database(make_database_url, "wmdirect")
    try:
        arriving = (_stream(spark, tmp_path / "in").withColumn("arrived", F.col("ts") + F.expr("INTERVAL 1 HOUR"))
                    .withWatermark("arrived", "10 seconds"))
        renamed = (_stream(spark, tmp_path / "in").withColumnRenamed("ts", "time")
                   .withWatermark("time", "10 seconds").withColumnRenamed("time", "ts"))
        for name, frame in (("arriving", arriving), ("renamed", renamed)):
            _, query = _direct_sink(spark, database, frame, name, tmp_path / f"checkpoint-{name}")
            if name == "renamed":
                run_to_end(query)
                continue
            with pytest.raises(Exception, match=r"declares an event-time watermark on column 'arrived', not on the "
                                                r"mapping's time column 'ts'"):
                query.awaitTermination(STREAM_TIMEOUT_SECONDS)
            assert (ledger(database), dead_letters(database)) == ([], [])
        assert [batch for query_id, batch, *_ in ledger(database)] == [0, 1]
        assert dead_letters(database) == []
    finally:
        database.close()


@pytest.mark.spark
def test_a_query_name_already_running_is_an_ingest_error_saying_what_to_do(spark, tmp_path, make_database_url):
    """Starting a query whose name a query of the session already runs under was pyspark's
    ``IllegalArgumentException`` ("Cannot start query with name … as a query with that name is already active"),
    not an ``IngestError`` saying what to do."""
    (tmp_path / "in").mkdir()
    database = new_app_database(make_database_url, "samename")
    running = spark_bridge.ingest(database, _stream(spark, tmp_path / "in"), mapping=app_counters.MAPPING,
                                  query_name="twice", checkpoint_location=str(tmp_path / "c1"))
    try:
        with pytest.raises(IngestError, match=r"a query named 'twice' is already running in this Spark session.*"
                                              r"stop it \(query.stop\(\).*another query_name"):
            spark_bridge.ingest(database, _stream(spark, tmp_path / "in"), mapping=app_counters.MAPPING,
                                query_name="twice", checkpoint_location=str(tmp_path / "c2"))
        assert [query.id for query in spark.streams.active] == [running.id]
    finally:
        running.stop()
        database.close()


@pytest.mark.spark
def test_a_column_arrow_cannot_convert_is_refused_at_ingest_naming_it(spark, tmp_path, make_database_url):
    """Every batch of the one-task path goes through ``toArrow()``, which refuses some Spark types (a calendar
    interval from ``make_interval``, a year-month interval): each batch failed, replay after replay — the stream
    stopped for good, with nothing said at ``ingest()``.  Spark's schema tells which (pyspark's own conversion of
    it): ``ingest()`` refuses such a column, naming it; a day-time interval, which Arrow takes, is accepted."""
    from pyspark.sql import functions as F

    database = new_app_database(make_database_url, "arrowtypes")
    try:
        frame = _stream(spark, tmp_path)
        for column in (F.make_interval(F.lit(0), F.lit(0), F.lit(0), F.lit(1)), F.make_ym_interval(F.lit(1))):
            with pytest.raises(IngestError, match=r"column 'wait' \(interval.*\) cannot be converted to Arrow.*"
                                                  r"drop it, or cast it"):
                spark_bridge.ingest(database, frame.withColumn("wait", column), mapping=app_counters.MAPPING,
                                    query_name="x", checkpoint_location=str(tmp_path / "c"))
        assert spark.streams.active == []
        writer = spark_bridge.ingest(database, frame.withColumn("wait", F.make_dt_interval(F.lit(1))),
                                     mapping=app_counters.MAPPING, query_name="x",
                                     checkpoint_location=str(tmp_path / "c"), start=False)
        assert spark_bridge.sink_of(writer) is not None
    finally:
        database.close()


@pytest.mark.spark
def test_a_column_arrow_cannot_convert_is_refused_at_ingest_on_the_scale_out_path_too(spark, tmp_path,
                                                                                       make_database_url):
    """The scale-out path's tasks take their rows through ``mapInArrow``, whose Python side cannot wrap a year-month
    interval column (pyarrow: ``KeyError: 21``, before the task sees a row): ``ingest(…, partition_by_key=N)``
    (``activedb run --partitions N``) started, and every batch failed the same way, replay after replay — the stream
    stopped for good.  It is refused at ``ingest()`` as on the one-task path, naming the column, also inside a
    struct; a calendar interval, which ``mapInArrow`` carries (the one-task path's ``toArrow()`` does not), is
    accepted there as before."""
    from pyspark.sql import functions as F

    database = new_app_database(make_database_url, "arrowtypes_scaled")
    try:
        frame = _stream(spark, tmp_path)
        scaled = dict(mapping=app_counters.MAPPING, query_name="x", checkpoint_location=str(tmp_path / "c"),
                      partition_by_key=2, app=APP_FILE)
        for column in (F.make_ym_interval(F.lit(1), F.lit(2)), F.struct(F.make_ym_interval(F.lit(1)).alias("span"))):
            with pytest.raises(IngestError, match=r"column 'wait' \((interval year to month|struct<span:interval "
                                                  r"year to month>)\) cannot be converted to Arrow.*drop it, or cast it"):
                spark_bridge.ingest(database, frame.withColumn("wait", column), **scaled)
        assert spark.streams.active == []
        writer = spark_bridge.ingest(database, frame.withColumn("wait", F.make_interval(F.lit(0), F.lit(0), F.lit(0),
                                                                                        F.lit(1))),
                                     start=False, **scaled)
        assert spark_bridge.sink_of(writer) is not None
    finally:
        database.close()


@pytest.mark.spark
def test_a_struct_with_duplicate_field_names_is_refused_on_the_scale_out_path_as_on_the_one_task_path(
        spark, tmp_path, make_database_url):
    """A struct column with two fields of one name (``F.struct(F.lit(1).alias("x"), F.lit(2).alias("x"))``) passed
    ``ingest(…, partition_by_key=N)`` (``activedb run --partitions N``) and a ``PartitionedIngestSink`` wired with
    ``foreachBatch`` directly: every batch's ``mapInArrow`` job then failed in the JVM
    (``[DUPLICATED_FIELD_NAME_IN_ARROW_STRUCT]``), replay after replay — the stream stopped for good.  The one-task
    path refused it at ``ingest()``.  The scale-out path refuses it too, at ``ingest()`` and at a direct sink's first
    batch, naming the column, also inside an array; nothing is applied."""
    from pyspark.sql import functions as F

    write_files(tmp_path / "in", [[{"type": "add", "key": "k", "ts": iso(BASE_TIME), "amount": 1, "seq": 1}]])
    database = new_app_database(make_database_url, "duplicate_fields_scaled")
    pair = F.struct(F.lit(1).alias("x"), F.lit(2).alias("x"))
    error = r"column 'pair' \((array<)?struct<x:int,x:int>>?\) cannot be converted to Arrow.*[Dd]uplicate.*'x'"
    try:
        frame = _stream(spark, tmp_path / "in")
        for column in (pair, F.array(pair)):
            _refused_by_ingest_on_both_paths(database, frame.withColumn("pair", column), error, tmp_path / "c")
        assert spark.streams.active == []
        _refused_by_a_direct_sink(spark, database, frame.withColumn("pair", pair), "direct", tmp_path / "checkpoint",
                                  error, scale_out=True)
    finally:
        database.close()


@pytest.mark.spark
def test_two_columns_of_one_name_are_refused_by_ingest_and_by_a_sink_wired_directly(spark, tmp_path,
                                                                                      make_database_url):
    """A stream with two top-level columns of one name (``frame.select(..., F.lit("z").alias("key"))``) passed
    ``ingest()`` on both paths and a sink wired with ``foreachBatch`` directly: the query started and every batch
    then failed inside the sink (``MappingError: the batch has duplicate column names``), replay after replay — the
    stream stopped for good.  ``ingest()`` refuses it before any query starts, a direct sink (one task or scale-out)
    at its first batch, before applying anything, naming the column."""
    from pyspark.sql import functions as F

    write_files(tmp_path / "in", [[{"type": "add", "key": "k", "ts": iso(BASE_TIME), "amount": 1, "seq": 1}]])
    database = new_app_database(make_database_url, "duplicate_columns")
    error = r"the stream has 2 columns named 'key'.*rename or drop one"
    try:
        frame = _stream(spark, tmp_path / "in").select("type", "key", "ts", "amount", "seq", F.lit("z").alias("key"))
        _refused_by_ingest_on_both_paths(database, frame, error, tmp_path / "c", trigger={"availableNow": True})
        assert spark.streams.active == []
        for name in ("one_task", "scale_out"):
            _refused_by_a_direct_sink(spark, database, frame, name, tmp_path / f"checkpoint-{name}", error,
                                      scale_out=name == "scale_out")
    finally:
        database.close()


@pytest.mark.spark
@pytest.mark.parametrize("scale_out", [False, True], ids=["one task", "scale-out"])
def test_a_sink_wired_with_foreach_batch_directly_refuses_a_missing_or_unconvertible_column_as_ingest_does(
        spark, tmp_path, make_database_url, scale_out):
    """``ingest()`` refuses a column the mapping names that the stream lacks, and one a batch cannot be converted to
    Arrow with; an ``IngestSink`` (or ``PartitionedIngestSink``) wired as ``foreachBatch`` directly skipped both:
    a missing payload column made every row a dead letter (the data diverted, no error), and an unconvertible column
    failed every batch, replay after replay, with pyspark's or pyarrow's own error.  The sink refuses both at the
    first batch with ``ingest()``'s errors, before applying anything: the query stops, no ledger row, no dead
    letter."""
    from pyspark.sql import functions as F

    write_files(tmp_path / "in", [[{"type": "add", "key": "k", "ts": iso(BASE_TIME), "amount": 1, "seq": 1}]])
    database = new_app_database(make_database_url, "directcols" + ("_scaled" if scale_out else ""))
    unconvertible = (F.make_ym_interval(F.lit(1), F.lit(2)) if scale_out
                     else F.make_interval(F.lit(0), F.lit(0), F.lit(0), F.lit(1)))
    cases = {"missing": (_stream(spark, tmp_path / "in").drop("seq"),
                         r"the stream has no column 'seq' named by the mapping"),
             "unconvertible": (_stream(spark, tmp_path / "in").withColumn("wait", unconvertible),
                               r"column 'wait' \(interval.*\) cannot be converted to Arrow.*drop it, or cast it")}
    try:
        for name, (frame, error) in cases.items():
            _refused_by_a_direct_sink(spark, database, frame, name, tmp_path / f"checkpoint-{name}", error,
                                      scale_out=scale_out)
    finally:
        database.close()


@pytest.mark.spark
def test_a_batch_spark_re_runs_in_another_partition_layout_is_refused_not_applied_twice(spark, tmp_path,
                                                                                       make_database_url):
    """The ledger skips a replayed batch by its ids — ``q`` whole, ``q#pK`` per partition of the scale-out path —
    so a batch committed in two partitions and re-run after a restart whole, or in three partitions (whose hash puts
    keys elsewhere), was applied a second time in part (the counters counted 31 events of 15, or 22), and one
    committed whole and re-run in partitions likewise.  The restarted query stops at that batch instead, saying which layout
    resumes it; resumed in its own layout the batch is skipped."""
    workload = counter_workload(files=1, rows_per_file=20, seed=5, keys=6, malformed_per_file=0)
    write_files(tmp_path / "in", workload.batches)
    scaled = dict(partition_by_key=2, app=APP_FILE)
    for name, first, others in (("split", scaled, [{}, dict(partition_by_key=3, app=APP_FILE)]),
                                ("whole", {}, [scaled])):
        database = new_app_database(make_database_url, f"layout_{name}")
        checkpoint = tmp_path / f"checkpoint-{name}"
        try:
            run_to_end(_ingest(spark, database, tmp_path / "in", checkpoint, name, **first))
            state, rows = app_state(database), ledger(database)
            (checkpoint / "commits" / "0").unlink()       # lost, as a crash after the database commit loses it
            for options in others:
                query = _ingest(spark, database, tmp_path / "in", checkpoint, name, **options)
                resume = "with partition_by_key=2" if first else "without partition_by_key"
                with pytest.raises(Exception, match=f"batch 0 of this checkpoint .* Resume it {resume}"):
                    query.awaitTermination(STREAM_TIMEOUT_SECONDS)
                assert (app_state(database), ledger(database)) == (state, rows)
            again = _ingest(spark, database, tmp_path / "in", checkpoint, name, **first)
            run_to_end(again)
            assert spark_bridge.sink_of(again).statistics().batches_skipped == 1
            assert (app_state(database), ledger(database)) == (state, rows)
        finally:
            database.close()


@pytest.mark.spark
def test_end_of_stream_of_a_query_still_running_is_refused(spark, tmp_path, database_url):
    """``end_of_stream(query)`` is for a query that terminated: it releases what the engine holds back and makes
    every later event of the engine late.  A running query's was released at once, while Spark kept delivering
    batches (whose every event then became a late dead letter on the queries path)."""
    write_files(tmp_path / "in", [[{"type": "add", "key": "r", "ts": iso(BASE_TIME), "amount": 1, "seq": 1}]])
    database = app_database(database_url)
    query = spark_bridge.ingest(database, _stream(spark, tmp_path / "in"), mapping=app_counters.MAPPING,
                                query_name="running", checkpoint_location=str(tmp_path / "checkpoint"),
                                trigger="1 second")
    try:
        with pytest.raises(IngestError, match=r"query 'running' is still running: .*after the query terminated"):
            spark_bridge.end_of_stream(query)
    finally:
        query.stop()
        database.close()
    assert spark_bridge.end_of_stream(query) == 0          # stopped: the rule path holds nothing back


@pytest.mark.spark
def test_a_checkpoint_resumed_under_another_query_name_is_refused(spark, tmp_path, make_database_url):
    write_files(tmp_path / "in", [[{"type": "add", "key": "r", "ts": iso(BASE_TIME), "amount": 1, "seq": 1}]])
    database = new_app_database(make_database_url, "renamed")
    try:
        run_to_end(_ingest(spark, database, tmp_path / "in", tmp_path / "checkpoint", "original"))
        (tmp_path / "checkpoint" / "commits" / "0").unlink()
        renamed = _ingest(spark, database, tmp_path / "in", tmp_path / "checkpoint", "renamed")
        with pytest.raises(Exception, match="resume it with query_name='original'"):
            renamed.awaitTermination(60)
        assert [(key, events) for key, _, events, _, _ in app_state(database)["counters"]] == [("r", 1)]
    finally:
        database.close()


@pytest.mark.spark
@pytest.mark.parametrize("scale_out", [False, True], ids=["one task", "scale-out"])
def test_a_column_named_like_the_key_but_for_case_is_applied_as_on_the_one_task_path(spark, tmp_path,
                                                                                    make_database_url, scale_out):
    """Spark resolves names without regard to case (``spark.sql.caseSensitive=false``), Arrow and the mapping by the
    exact name.  A stream with the key column ``key`` and another column ``KEY`` (a payload column the rules do not
    read) ran on the one-task path, and on the scale-out path every batch failed in the repartition by key
    (``[AMBIGUOUS_REFERENCE] Reference `key` is ambiguous``), replay after replay: the stream stopped for good.
    Both paths now apply it alike; a mapping naming ``Key`` for a column ``key`` is refused by both."""
    from pyspark.sql import functions as F

    workload = counter_workload(files=2, rows_per_file=12, seed=31, keys=4)
    write_files(tmp_path / "in", workload.batches)
    name = "cased_scaled" if scale_out else "cased"
    streamed, direct = new_app_database(make_database_url, name), new_app_database(make_database_url, f"{name}_direct")
    options = dict(partition_by_key=2, app=APP_FILE) if scale_out else {}
    try:
        frame = _stream(spark, tmp_path / "in").select("*", F.lit("shadow").alias("KEY"))
        with pytest.raises(IngestError, match=r"the stream has no column 'Key' named by the mapping"):
            spark_bridge.ingest(streamed, frame, mapping=spark_bridge.EventMapping(
                "type", "Key", "ts", payload_columns=("amount", "seq")), query_name=name,
                checkpoint_location=str(tmp_path / "c"), **options)
        query = spark_bridge.ingest(streamed, frame, mapping=app_counters.MAPPING, query_name=name,
                                    checkpoint_location=str(tmp_path / "checkpoint"),
                                    trigger={"availableNow": True}, **options)
        run_to_end(query)
        apply_directly(direct, workload.good)
        assert app_state(streamed) == app_state(direct)
        assert sorted({batch for _, batch, *_ in ledger(streamed)}) == [0, 1]
    finally:
        streamed.close()
        direct.close()


@pytest.mark.spark
@pytest.mark.parametrize("scale_out", [False, True], ids=["one task", "scale-out"])
def test_a_watermark_delay_on_a_time_column_named_like_another_but_for_case_is_declared(spark, tmp_path,
                                                                                       make_database_url, scale_out):
    """``ingest(watermark_delay=…)`` declares the watermark with ``withWatermark(ts, delay)``, which Spark resolves
    without regard to case: with another column ``TS`` beside the time column ``ts`` (which the paths apply without
    a watermark) it failed with ``AMBIGUOUS_REFERENCE``, and ``ingest()`` said *watermark_delay='10 seconds' is not a
    delay Spark takes* — blaming a delay that was right.  The watermark is declared on the mapping's time column: rows
    behind it are late, and it is punctuated."""
    from pyspark.sql import functions as F

    def row(seq, minute, second):
        return {"type": "add", "key": "w", "ts": iso(BASE_TIME + dt.timedelta(minutes=minute, seconds=second)),
                "amount": 1, "seq": seq}

    write_files(tmp_path / "in", [[row(1, 0, 10), row(2, 0, 50)], [row(3, 1, 0), row(4, 0, 20)]])
    name = "cased_time_scaled" if scale_out else "cased_time"
    database = new_app_database(make_database_url, name)
    options = dict(partition_by_key=2, app=APP_FILE) if scale_out else {}
    try:
        frame = _stream(spark, tmp_path / "in").select("*", F.lit("local").alias("TS"))
        query = spark_bridge.ingest(database, frame, mapping=app_counters.MAPPING, query_name=name,
                                    checkpoint_location=str(tmp_path / "checkpoint"), watermark_delay="10 seconds",
                                    trigger={"availableNow": True}, **options)
        run_to_end(query)
        assert {key: trail for key, _, _, trail, _ in app_state(database)["counters"]} == {"w": "1,2,3"}
        assert [raw["seq"] for _, _, _, raw in dead_letters(database)] == [4]     # (behind 0:50 - 10 s)
        assert database.watermark(name) == BASE_TIME + dt.timedelta(seconds=40)
    finally:
        database.close()


@pytest.mark.spark
def test_a_watermark_delay_on_a_time_column_that_is_no_timestamp_says_how_to_convert_that_type(spark, tmp_path,
                                                                                               make_database_url):
    """``ingest(watermark_delay=…)`` needs the time column to be a Spark ``TIMESTAMP``.  A ``TIMESTAMP_NTZ`` passed its
    check and Spark's refusal (``EVENT_TIME_IS_NOT_ON_TIMESTAMP_TYPE``) came out as *watermark_delay='10 seconds' is
    not a delay Spark takes*, blaming the delay; and for every other type the advice was
    ``F.timestamp_seconds('ts')`` — which makes an ISO text null (every row then a dead letter) and reads a number
    of milliseconds (``EventMapping(ts_unit='ms')``) as seconds.  The error names the column's type and the
    conversion for it."""
    from pyspark.sql import functions as F

    database = new_app_database(make_database_url, "delay_types")
    frame = _stream(spark, tmp_path)
    cases = {"timestamp_ntz": (app_counters.MAPPING, r"F\.col\('ts'\)\.cast\('timestamp'\)"),
             "string": (app_counters.MAPPING, r"F\.to_timestamp\('ts'\)"),
             "date": (app_counters.MAPPING, r"F\.col\('ts'\)\.cast\('timestamp'\)"),
             "bigint": (app_counters.MAPPING, r"F\.timestamp_seconds\('ts'\)"),
             "double": (spark_bridge.EventMapping("type", "key", "ts", payload_columns=("amount", "seq"), ts_unit="ms"),
                        r"F\.timestamp_millis\('ts'\)")}
    try:
        for kind, (mapping, advice) in cases.items():
            with pytest.raises(IngestError, match=rf"watermark_delay needs 'ts' to be a Spark timestamp, but it is "
                                                  rf"{kind}; convert it first.*{advice}"):
                spark_bridge.ingest(database, frame.withColumn("ts", F.col("ts").cast(kind)), mapping=mapping,
                                    query_name="x", checkpoint_location=str(tmp_path / "c"),
                                    watermark_delay="10 seconds")
    finally:
        database.close()


@pytest.mark.spark
def test_a_watermark_delay_given_as_a_timedelta_is_the_delay_to_the_millisecond(spark, tmp_path, make_database_url):
    """A ``timedelta`` delay was turned into milliseconds through a float (``int(total_seconds() * 1000)``):
    ``timedelta(milliseconds=1001)`` became 1000 ms (``1.001 * 1000`` is ``1000.9999…``), so a row exactly at the
    watermark was dead-lettered as late."""
    def row(seq, seconds):
        return {"type": "add", "key": "w", "ts": iso(BASE_TIME + dt.timedelta(seconds=seconds)), "amount": 1, "seq": seq}

    write_files(tmp_path / "in", [[row(1, 10), row(2, 50)], [row(3, 60), row(4, 48.999)]])
    database = new_app_database(make_database_url, "delay_ms")
    try:
        query = _ingest(spark, database, tmp_path / "in", tmp_path / "checkpoint", "delay_ms",
                        watermark_delay=dt.timedelta(milliseconds=1001))
        run_to_end(query)
        assert dead_letters(database) == []       # (0:48.999 is the watermark itself: not older than it)
        assert {key: trail for key, _, _, trail, _ in app_state(database)["counters"]} == {"w": "1,2,4,3"}
        assert database.watermark("delay_ms") == BASE_TIME + dt.timedelta(seconds=48.999)
    finally:
        database.close()


@pytest.mark.spark
def test_connect_options_activedb_connect_refuses_are_refused_by_ingest_before_the_query_starts(spark, tmp_path,
                                                                                                make_database_url):
    """The scale-out tasks connect with ``connect_options``; one ``activedb.connect`` refuses (a misspelt keyword, a
    value out of range, a rule execution it does not know, ``upgrade``, which the task's own ``connect`` sets)
    started the query, which stopped at its first batch — in the tasks, after Spark had planned it — with the
    refusal, or (an unknown rule execution; ``upgrade`` given twice) with *a scale-out task … could not connect
    to …*, sending the user after the network, the server or the password.  ``ingest()`` refuses them before the
    query starts, naming ``connect_options`` and ``connect()``'s reason; a sink built directly as well."""
    write_files(tmp_path / "in", [[{"type": "add", "key": "k", "ts": iso(BASE_TIME), "amount": 1, "seq": 1}]])
    database = new_app_database(make_database_url, "bad_options")
    try:
        for options, reason in [({"lock_timout": 5.0}, r"unknown keyword\(s\) lock_timout"),
                                ({"lock_timeout": -1.0}, r"lock_timeout"),
                                ({"rule_execution": "sideways"}, r"rule_execution"),
                                ({"upgrade": True}, r"upgrade")]:
            with pytest.raises(IngestError, match=rf"connect_options .*refused by activedb\.connect.*{reason}"):
                _ingest(spark, database, tmp_path / "in", tmp_path / "checkpoint", "bad", partition_by_key=2,
                        app=APP_FILE, connect_options=options)
            assert spark.streams.active == []
            with pytest.raises(IngestError, match=rf"connect_options .*refused by activedb\.connect.*{reason}"):
                spark_bridge.PartitionedIngestSink(database, app_counters.MAPPING, partitions=2, app=APP_FILE,
                                                   query_name="bad", connect_options=options)
        assert (ledger(database), dead_letters(database)) == ([], [])
        run_to_end(_ingest(spark, database, tmp_path / "in", tmp_path / "checkpoint", "bad", partition_by_key=2,
                           app=APP_FILE, connect_options={"lock_timeout": 5.0}))
        assert [row[1:] for row in ledger(database)] == [(0, 1, 0), (0, 0, 0)]
    finally:
        database.close()


@pytest.mark.spark
@pytest.mark.parametrize("scale_out", [False, True], ids=["one task", "scale-out"])
def test_a_sink_s_event_ids_under_counts_on_the_scale_out_path_as_on_the_one_task_path(spark, tmp_path,
                                                                                      make_database_url, scale_out):
    """``PartitionedIngestSink`` takes ``IngestSink``'s options (``SinkOptions``) but its tasks built their
    ``Ingestion`` without ``event_ids_under`` and ``batch_attempts``: an event id already ingested under the source
    named by ``event_ids_under`` was a duplicate on the one-task path and applied again on the scale-out path (and
    the tasks re-ran a conflicting batch 3 times, whatever ``batch_attempts`` said)."""
    from activedb.ingest import feed

    mapping = spark_bridge.EventMapping("type", "key", "ts", payload_columns=("amount", "seq"), id_column="seq")
    rows = [{"type": "add", "key": "k", "ts": iso(BASE_TIME + dt.timedelta(seconds=seq)), "amount": 1, "seq": seq}
            for seq in (1, 2)]
    write_files(tmp_path / "in", [rows])
    name = "ids_scaled" if scale_out else "ids"
    database = new_app_database(make_database_url, name)
    try:
        feed(database, [[rows[0]]], source="earlier", mapping=mapping)        # (id 1 ingested under 'earlier')
        common = dict(query_name=name, spark_session=spark, event_ids_under="earlier", batch_attempts=5)
        if scale_out:
            sink: spark_bridge.IngestSink = spark_bridge.PartitionedIngestSink(database, mapping, partitions=2,
                                                                               app=APP_FILE, **common)
        else:
            sink = spark_bridge.IngestSink(database, mapping, **common)
        query = (_stream(spark, tmp_path / "in").writeStream.foreachBatch(sink).queryName(name)
                 .option("checkpointLocation", str(tmp_path / "checkpoint")).trigger(availableNow=True).start())
        run_to_end(query)
        assert [(reason.split(":")[0], raw["seq"]) for query_id, _, reason, raw in dead_letters(database)
                if query_id.startswith(name)] == [("duplicate", 1)]
        assert {key: trail for key, _, _, trail, _ in app_state(database)["counters"]} == {"k": "1,2"}
    finally:
        database.close()


@pytest.mark.spark
def test_an_ingest_that_fails_after_building_its_sink_leaves_nothing_on_the_database(spark, tmp_path,
                                                                                     make_database_url):
    """``ingest(…, deadlines=…)`` builds its sink — whose deadlines watch every rule firing of the database through an
    observer — before Spark takes the trigger and starts the query.  A trigger Spark refuses, or a query ``start()``
    refuses (an aggregation in append mode), raised with the sink left behind and its observer on the database for
    good: and a database with an observer lowers no batch of declared rules (every later batch of the process ran
    them event by event), besides the observer's two calls per firing.  The sink is closed when ``ingest()`` fails."""
    from pyspark.sql import functions as F

    database = new_app_database(make_database_url, "leftover")
    deadlines = activedb.ingest.Deadlines(batch=60.0, rule=5.0)
    try:
        before = list(database.transactions.observers)
        with pytest.raises(IngestError, match=r"trigger='5s' is not one Spark takes"):
            spark_bridge.ingest(database, _stream(spark, tmp_path), mapping=app_counters.MAPPING,
                                query_name="leftover", checkpoint_location=str(tmp_path / "c1"), trigger="5s",
                                deadlines=deadlines)
        assert list(database.transactions.observers) == before
        counted = _stream(spark, tmp_path).groupBy("key").count().withColumn("type", F.lit("add"))
        with pytest.raises(Exception, match=r"output mode: append\. This output mode is not supported"):
            spark_bridge.ingest(database, counted.withColumn("ts", F.current_timestamp()),
                                mapping=spark_bridge.EventMapping("type", "key", "ts"), query_name="leftover",
                                checkpoint_location=str(tmp_path / "c2"), deadlines=deadlines)
        assert list(database.transactions.observers) == before
        assert spark.streams.active == []
    finally:
        database.close()


@pytest.mark.spark
def test_a_watermark_delay_on_a_frame_that_declares_a_watermark_already_is_refused_before_spark_starts(
        spark, tmp_path, make_database_url):
    """``watermark_delay=`` declares ``withWatermark(ts, delay)`` on the frame; on a frame that declared one already
    the plan had two watermark nodes, which Spark refuses once a watermark is defined ("Redefining watermark is
    disallowed"): the query started, its first batch was applied, and its second failed — and every restart from the
    checkpoint failed the same way.  ``ingest()`` refuses the two together, naming the frame's watermark, and
    starts nothing."""
    write_files(tmp_path / "in", [[{"type": "add", "key": "k", "ts": iso(BASE_TIME + dt.timedelta(minutes=index)),
                                    "amount": 1, "seq": index}] for index in range(2)])
    database = new_app_database(make_database_url, "two_watermarks")
    try:
        stream = _stream(spark, tmp_path / "in")
        for frame in (stream.withWatermark("ts", "10 seconds"),
                      stream.withColumnRenamed("ts", "t").withWatermark("t", "1 minute").withColumnRenamed("t", "ts"),
                      stream.withColumn("arrived", stream.ts).withWatermark("arrived", "10 seconds")):
            with pytest.raises(IngestError, match=r"watermark_delay='5 seconds' would declare a second watermark .*"
                                                  r"frame declares one on column '(ts|t|arrived)' already.*either"):
                spark_bridge.ingest(database, frame, mapping=app_counters.MAPPING, query_name="twice",
                                    checkpoint_location=str(tmp_path / "c"), trigger={"availableNow": True},
                                    watermark_delay="5 seconds")
            assert spark.streams.active == []
        assert (ledger(database), dead_letters(database)) == ([], [])
        run_to_end(_ingest(spark, database, tmp_path / "in", tmp_path / "c", "twice", watermark_delay="5 seconds"))
        assert [row[1] for row in ledger(database)] == [0, 1]
    finally:
        database.close()


@pytest.mark.spark
def test_a_key_column_of_a_type_no_key_can_have_is_refused_at_ingest_naming_it(spark, tmp_path, make_database_url):
    """An event's key is a string or an integer: a key column of another Spark type (a map, an array, a struct,
    binary, a float or double — NaN —, a boolean, a decimal, a date) gives no row a key.  ``ingest()`` started the
    query anyway, and every row of every batch became a dead letter (``key ('key') is … need a string or an
    integer``), on the one-task path and on the scale-out path, which hashed its rows to partitions by that column
    first.  It is refused up front on both paths, naming the column and its type; the integer and text types are
    taken."""
    from pyspark.sql import functions as F

    database = new_app_database(make_database_url, "keytypes")
    try:
        frame = _stream(spark, tmp_path)
        refused = {"map<string,int>": F.create_map(F.col("key"), F.lit(1)), "array<string>": F.array("key"),
                   "struct<key:string>": F.struct("key"), "binary": F.col("key").cast("binary"),
                   "double": F.lit(float("nan")), "float": F.lit(1.5).cast("float"), "boolean": F.lit(True),
                   "decimal(10,0)": F.col("amount").cast("decimal(10,0)"), "date": F.to_date("ts")}
        for name, column in refused.items():
            _refused_by_ingest_on_both_paths(
                database, frame.withColumn("key", column),
                rf"^key column 'key' is {re.escape(name)}: .*string or an integer.*cast\('string'\)", tmp_path / "c")
            assert spark.streams.active == [], name
        for column in (F.col("amount"), F.col("amount").cast("bigint"), F.col("amount").cast("smallint"),
                       F.col("key")):
            for path in ({}, dict(partition_by_key=2, app=APP_FILE)):
                writer = spark_bridge.ingest(database, frame.withColumn("key", column), mapping=app_counters.MAPPING,
                                             query_name="x", checkpoint_location=str(tmp_path / "c"), start=False,
                                             **path)
                spark_bridge.sink_of(writer).close()
        # a scale-out sink wired with foreachBatch directly: at its first batch, before applying anything
        write_files(tmp_path / "in", [[{"type": "add", "key": "k", "ts": iso(BASE_TIME), "amount": 1, "seq": 1}]])
        _refused_by_a_direct_sink(spark, database, _stream(spark, tmp_path / "in").withColumn("key", F.lit(1.5)),
                                  "direct", tmp_path / "cd", r"key column 'key' is double", scale_out=True)
    finally:
        database.close()


@pytest.mark.spark
def test_a_one_task_sink_wired_with_foreach_batch_directly_refuses_a_key_column_no_key_can_have(
        spark, tmp_path, make_database_url):
    """``ingest()`` and a scale-out sink wired with ``foreachBatch`` directly refuse a key column of a type no key can
    have; an ``IngestSink`` wired so applied each batch, every row of it a dead letter (``key ('key') is 1.5 (float),
    need a string or an integer``), batch after batch.  It refuses the stream at its first batch with ``ingest()``'s
    error, before applying anything: the query stops, no ledger row, no dead letter."""
    from pyspark.sql import functions as F

    write_files(tmp_path / "in", [[{"type": "add", "key": "k", "ts": iso(BASE_TIME), "amount": 1, "seq": 1}]])
    database = new_app_database(make_database_url, "directkey")
    try:
        _refused_by_a_direct_sink(spark, database, _stream(spark, tmp_path / "in").withColumn("key", F.lit(1.5)),
                                  "direct", tmp_path / "cd", r"key column 'key' is double: .*string or an integer",
                                  scale_out=False)
    finally:
        database.close()


@pytest.mark.spark
def test_ingest_into_something_that_is_no_database_says_what_to_give(spark, tmp_path):
    """``ingest(url, frame, …)`` — a URL where the database goes — failed deep in the sink's set-up with
    ``AttributeError: 'str' object has no attribute 'clock'``.  It is an IngestError saying to connect first."""
    for given in ("postgresql://localhost/app", None):
        with pytest.raises(IngestError,
                           match=r"ingest\(\) feeds an activedb\.Database, got .*activedb\.connect\(url\)"):
            spark_bridge.ingest(given, _stream(spark, tmp_path), mapping=app_counters.MAPPING, query_name="x",
                                checkpoint_location=str(tmp_path / "c"))
        assert spark.streams.active == []


@pytest.mark.spark
def test_a_stream_into_a_database_without_any_rule_stops_at_its_first_batch_and_resumes_it_once_they_are_there(
        spark, tmp_path, make_database_url):
    """A query started in a process that declared no rule at all (the application's module not imported) applied
    every micro-batch with no rule run on its events and recorded each in the ledger: restarted from its checkpoint
    once the rules were registered, the query skipped them — every event lost, and nothing said.  Now its first batch
    is refused (``NoRuleRegistered``) before anything is applied or recorded: the query stops with the error, Spark
    keeps the batch uncommitted in the checkpoint, and the query restarted from it after the rules are registered
    applies the batch."""
    rows = [{"type": "add", "key": "nr", "ts": iso(BASE_TIME), "amount": 5, "seq": seq} for seq in range(3)]
    write_files(tmp_path / "in", [rows])
    database = activedb.connect(make_database_url("no_rule", migrations=(app_counters.MIGRATIONS,)))
    try:
        database.upgrade_app(app_counters.MIGRATIONS)
        assert database.rules.names() == []
        query = _ingest(spark, database, tmp_path / "in", tmp_path / "checkpoint", "unruled")
        with pytest.raises(Exception, match=r"no rule is registered on this database"):
            query.awaitTermination(STREAM_TIMEOUT_SECONDS)
        assert (ledger(database), dead_letters(database)) == ([], [])
        app_counters.register(database)
        run_to_end(_ingest(spark, database, tmp_path / "in", tmp_path / "checkpoint", "unruled"))
        [(query_id, batch, events, letters)] = ledger(database)
        assert (query_id.split("@")[0], batch, events, letters) == ("unruled", 0, 3, 0)
        assert app_state(database)["counters"], "the rules ran on the batch's events"
    finally:
        database.close()
