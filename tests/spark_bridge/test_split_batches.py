"""Atomic batches through the Spark bridge: lineage of every batch transaction, and a scale-out
batch one partition of which fails for good (``ingest(..., on_partition_failure=...)``).

* without Spark: ``IngestSink.process`` records, in the batch's own flush, that its transaction consumed
  the source batch — a scale-out partition (ledger id ``NAME@SPARK#pK``) the source ``NAME@SPARK`` — and
  records nothing with lineage off; a driver that died between the failed task's settlement and the
  compensation is resumed by the replay, once;
* real Spark (``local[2]``, two partitions, the ``app_split`` application whose poisoned key makes its
  partition's commit fail until a fix row exists), three batches, the poison in the second:
  - ``compensate``: the stream runs to its end; the committed partition of batch 1 is compensated, the
    failed one's rows are dead letters, and the counters equal batches 0 and 2 applied directly (batch 1
    left no effect); every row of batch 1 is counted once; ``activedb status`` shows the policy and the
    compensated batch;
  - ``forward``: the query stops at batch 1 with ``PartitionFailed`` (the other partition committed, the
    failure is *pending completion*); after the fix, restarting from the checkpoint completes it — the
    counters equal all rows applied directly, no partition applied twice.
"""

from __future__ import annotations

import datetime as dt
import re
import uuid
from contextlib import contextmanager

import pytest
import sqlalchemy as sa

import activedb
import spark_bridge
from spark_bridge import IngestSink
from spark_bridge.errors import IngestError, PartitionFailed
from tests.spark_bridge import app_split
from tests.spark_bridge._streams import (
    BASE_TIME,
    STREAM_TIMEOUT_SECONDS,
    apply_directly,
    counter_workload,
    iso,
    new_app_database,
    run_to_end,
    write_files,
)

APP_FILE = app_split.__file__


def counters(database) -> list[tuple]:
    with database.engine.connect() as connection:
        return sorted(tuple(row) for row in connection.execute(sa.text("SELECT * FROM counters")))


def query_rows(database, sql: str, **params) -> list[tuple]:
    with database.engine.connect() as connection:
        return [tuple(row) for row in connection.execute(sa.text(sql), params)]


def _row(seq: int, key: str, minute: int, amount: int = 5) -> dict:
    return {"type": "add", "key": key, "ts": iso(BASE_TIME + dt.timedelta(minutes=minute, seconds=seq % 50)),
            "amount": amount, "seq": seq}


# --- lineage, without Spark ------------------------------------------------------------------------------------

def test_every_batch_transaction_records_the_source_batch_it_consumed(make_database_url):
    database = new_app_database(make_database_url, "lineage", app_split)
    try:
        spark_id = str(uuid.uuid4())
        driver, partition = f"q@{spark_id}", f"q@{spark_id}#p1"
        sink = IngestSink(database, app_split.MAPPING, query_name="q")
        first = sink.process([_row(1, "a", 0)], 0, query_id=driver)
        second = sink.process([_row(2, "b", 0)], 1, query_id=partition)
        assert first.committed and second.committed
        [applied] = database.batches.composite((driver, 0))
        [partitioned] = database.batches.composite((driver, 1))        # the partition consumed the source batch
        ledger = dict(((q, b), t) for q, b, t in query_rows(
            database, "SELECT query_id, batch_id, transaction_id FROM activedb_ingestion_ledger"))
        assert (ledger[(driver, 0)], ledger[(partition, 1)]) == (applied, partitioned)
        assert database.batches.transaction(applied).name == "ingest:q"

        sink.lineage = False
        assert sink.process([_row(3, "c", 0)], 2, query_id=driver).committed
        assert query_rows(database, "SELECT count(*) FROM activedb_lineage_batches WHERE batch_id = '2'") == [(0,)]
    finally:
        database.close()


def test_a_driver_that_died_before_compensating_is_resumed_by_the_replay(make_database_url):
    """The failed task settled (dead letters, ledger row, *compensating*) and the driver died before it
    compensated: when Spark re-runs the batch every partition is skipped, and the driver resumes the
    compensation — once."""
    from activedb import atomic as _atomic

    database = new_app_database(make_database_url, "resume", app_split)
    try:
        source = f"q@{uuid.uuid4()}"
        sink = IngestSink(database, app_split.MAPPING, query_name="q")
        assert sink.process([_row(1, "a", 0), _row(2, "b", 0)], 4, query_id=f"{source}#p0").committed
        poisoned = [_row(3, app_split.POISON_KEY, 0)]
        with pytest.raises(app_split.PoisonedBatch) as refused:
            sink.process(poisoned, 4, query_id=f"{source}#p1")
        assert _atomic.settle_failed_partition(sink, poisoned, f"{source}#p1", 4, 1, 2, refused.value) == 1
        assert len(counters(database)) == 2 and _failures(database) == [(4, 1, "compensate", "compensating")]

        # The replay: the ledger has both partitions (skipped); the driver finds the interrupted settlement.
        assert not sink.process(poisoned, 4, query_id=f"{source}#p1").committed
        _atomic.after_replay(database, source, 4)
        assert counters(database) == [] and _failures(database) == [(4, 1, "compensate", "compensated")]
        _atomic.after_replay(database, source, 4)                     # again: nothing left to do
        assert query_rows(database, "SELECT count(*) FROM activedb_lineage WHERE compensates IS NOT NULL") == [(1,)]
        assert query_rows(database, "SELECT reason LIKE '%failed for good (PoisonedBatch%' FROM activedb_dead_letters"
                          ) == [(True,)]
    finally:
        database.close()


@pytest.mark.spark
def test_on_partition_failure_is_checked_and_belongs_to_the_scale_out_path(spark, tmp_path, make_database_url):
    database = new_app_database(make_database_url, "misuse", app_split)
    try:
        frame = spark.readStream.schema(app_split.SCHEMA).json(str(tmp_path))
        common = dict(mapping=app_split.MAPPING, query_name="x", checkpoint_location=str(tmp_path / "c"))
        with pytest.raises(IngestError, match="on_partition_failure= is for the scale-out path only"):
            spark_bridge.ingest(database, frame, on_partition_failure="compensate", **common)
        with pytest.raises(IngestError, match="'forward'.*'compensate'.*got 'undo'"):
            spark_bridge.ingest(database, frame, partition_by_key=2, app=APP_FILE, on_partition_failure="undo",
                                **common)
        with pytest.raises(IngestError, match=r"on_partition_failure='compensate' needs lineage"):
            spark_bridge.ingest(database, frame, partition_by_key=2, app=APP_FILE, on_partition_failure="compensate",
                                lineage=False, **common)
    finally:
        database.close()


def test_compensate_without_lineage_is_refused_as_it_could_undo_nothing(make_database_url):
    """``on_partition_failure='compensate'`` undoes the committed partitions of a failed batch by their lineage —
    which transactions consumed the batch.  With ``lineage=False`` none is recorded: the driver found nothing to undo
    (``UnknownBatch``), marked the batch *compensated* with 0 transactions, and the committed partitions' effects
    stayed, while the failed one's rows were dead letters — half a batch applied, reported as none.  The
    combination is refused when the sink is built (``ingest()``: before the query starts); ``forward`` needs no
    lineage and is taken without it."""
    database = new_app_database(make_database_url, "no_lineage", app_split)
    try:
        common = dict(partitions=2, app=APP_FILE, query_name="x")
        with pytest.raises(IngestError, match=r"on_partition_failure='compensate' needs lineage.*lineage=True.*"
                                              r"'forward'"):
            spark_bridge.PartitionedIngestSink(database, app_split.MAPPING, on_partition_failure="compensate",
                                               lineage=False, **common)
        spark_bridge.PartitionedIngestSink(database, app_split.MAPPING, on_partition_failure="forward",
                                           lineage=False, **common).close()
    finally:
        database.close()


@pytest.mark.spark
def test_connect_options_the_tasks_cannot_be_sent_are_refused_naming_the_option(spark, tmp_path, make_database_url):
    """The scale-out path sends ``connect_options`` to its Spark tasks (each connects with them in its own process),
    pickled as Spark pickles a task (cloudpickle).  One that cannot be pickled — a ``ManualClock``, which holds a lock
    — is refused by ``ingest()`` naming the option and what to do.  Before, the query started and its first batch
    failed with Spark's "Could not serialize object: TypeError: cannot pickle '_thread.lock' object", naming neither.
    A lambda ``victim_policy`` is sent (cloudpickle takes it)."""
    from activedb.clock import ManualClock

    database = new_app_database(make_database_url, "unsendable", app_split)
    try:
        frame = spark.readStream.schema(app_split.SCHEMA).json(str(tmp_path))
        common = dict(mapping=app_split.MAPPING, query_name="x", checkpoint_location=str(tmp_path / "c"),
                      partition_by_key=2, app=APP_FILE, start=False)
        with pytest.raises(IngestError, match=r"connect_options\['clock'\] .*cannot be sent to the scale-out "
                                              r"path's Spark tasks, .*_thread.lock.*leave it out"):
            spark_bridge.ingest(database, frame, connect_options={"clock": ManualClock()}, **common)
        writer = spark_bridge.ingest(database, frame, connect_options={"victim_policy": lambda cycle: cycle[0]},
                                     **common)
        assert spark_bridge.sink_of(writer).partitions == 2
    finally:
        database.close()


# --- a poisoned partition, real Spark ---------------------------------------------------------------------------

@contextmanager
def _poisoned(directory, make_database_url, name: str):
    """Three files written to ``directory``, file 1 also holding two ``add``s of the poisoned key (after its other
    rows' keys k0..k5); and two split databases, the stream's and the direct reference's, closed at the end.
    Yields (workload, poison rows, streamed database, direct database)."""
    workload = counter_workload(files=3, rows_per_file=24, seed=31, keys=6)
    poison = [_row(1000 + number, app_split.POISON_KEY, 1, amount=7) for number in range(2)]
    workload.batches[1].extend(poison)
    write_files(directory, workload.batches)
    streamed = new_app_database(make_database_url, name, app_split)
    direct = new_app_database(make_database_url, f"{name}_d", app_split)
    try:
        yield workload, poison, streamed, direct
    finally:
        streamed.close()
        direct.close()


def _ingest(spark, database, directory, checkpoint, policy, partitions=2):
    frame = spark.readStream.schema(app_split.SCHEMA).option("maxFilesPerTrigger", 1).json(str(directory))
    return spark_bridge.ingest(database, frame, mapping=app_split.MAPPING, query_name="split",
                               checkpoint_location=str(checkpoint), trigger={"availableNow": True},
                               partition_by_key=partitions, app=APP_FILE, on_partition_failure=policy)


def _good(workload, files) -> list[dict]:
    """The rows of ``files`` that validation accepts (``Workload.good`` in file order)."""
    per_file = len(workload.good) // 3
    return [row for index in files for row in workload.good[index * per_file:(index + 1) * per_file]]


def _ledger(database, batch_id) -> dict[str, tuple[int, int]]:
    return {query_id.rsplit("#", 1)[1]: (events, letters) for query_id, events, letters in query_rows(
        database, "SELECT query_id, events, dead_letters FROM activedb_ingestion_ledger WHERE batch_id = :b",
        b=batch_id)}


def _failures(database) -> list[tuple]:
    return query_rows(database, "SELECT batch_id, partition, policy, state FROM activedb_split_failures")


@pytest.mark.spark
def test_compensate_a_batch_whose_partition_fails_for_good(spark, tmp_path, make_database_url):
    with _poisoned(tmp_path / "in", make_database_url, "comp") as (workload, poison, streamed, direct):
        query = _ingest(spark, streamed, tmp_path / "in", tmp_path / "checkpoint", "compensate")
        run_to_end(query)                                   # the stream went on past the poisoned batch
        source = f"split@{query.id}"

        apply_directly(direct, _good(workload, [0, 2]))
        assert counters(streamed) == counters(direct)       # batch 1 left no effect on the application
        [(batch, failed, policy, state)] = _failures(streamed)
        assert (batch, policy, state) == (1, "compensate", "compensated")

        ledger = _ledger(streamed, 1)
        assert set(ledger) == {"p0", "p1"} and ledger[f"p{failed}"][0] == 0
        assert sum(events + letters for events, letters in ledger.values()) == len(workload.batches[1])
        letters = query_rows(streamed, "SELECT raw->>'seq' FROM activedb_dead_letters WHERE batch_id = 1 "
                                       "AND query_id = :q AND reason LIKE '%failed for good%'",
                             q=f"{source}#p{failed}")
        assert len(letters) == ledger[f"p{failed}"][1]        # the failed partition's rows, once each
        assert {str(row["seq"]) for row in poison} <= {seq for (seq,) in letters}

        # Lineage: both partitions of every batch consumed the source batch; batch 1's committed one was
        # compensated by a recorded transaction, and compensating again finds nothing left.
        assert len(streamed.batches.composite((source, 0))) == 2
        [committed] = streamed.batches.composite((source, 1))
        assert streamed.batches.transaction(committed).compensated_by is not None
        assert streamed.batches.settle_failed_split((source, 1), on_failure="compensate").compensated == []

        from click.testing import CliRunner

        from activedb.cli import main

        result = CliRunner().invoke(main, ["--url", streamed.url.render_as_string(hide_password=False), "status"],
                                    env={"COLUMNS": "250"})
        assert result.exit_code == 0, result.output
        assert "on_partition_failure=compensate" in result.output
        assert "compensated" in result.output and "PoisonedBatch" in result.output


@pytest.mark.spark
def test_forward_completes_the_batch_after_the_fix(spark, tmp_path, make_database_url):
    with _poisoned(tmp_path / "in", make_database_url, "fwd") as (workload, poison, streamed, direct):
        query = _ingest(spark, streamed, tmp_path / "in", tmp_path / "checkpoint", "forward")
        with pytest.raises(Exception):
            query.awaitTermination(STREAM_TIMEOUT_SECONDS)
        failed_batch, failure = spark_bridge.sink_of(query).last_failure()
        assert failed_batch == 1 and isinstance(failure, PartitionFailed), failure
        [(batch, failed, policy, state)] = _failures(streamed)
        assert (batch, policy, state) == (1, "forward", "pending completion")
        assert set(_ledger(streamed, 1)) == {f"p{1 - failed}"}   # the other partition committed

        with streamed.transaction() as tx:                       # the fix
            tx.insert("items", key=app_split.FIX_KEY, value=1)
        resumed = _ingest(spark, streamed, tmp_path / "in", tmp_path / "checkpoint", "forward")
        run_to_end(resumed)

        with direct.transaction() as tx:
            tx.insert("items", key=app_split.FIX_KEY, value=1)
        reference = apply_directly(direct, _good(workload, [0, 1, 2]) + poison)
        assert counters(streamed) == counters(direct)            # complete, nothing lost or doubled
        assert _failures(streamed) == [(1, failed, "forward", "completed")]
        rows = query_rows(streamed, "SELECT query_id, batch_id FROM activedb_ingestion_ledger")
        assert sorted(batch for _, batch in rows) == [0, 0, 1, 1, 2, 2]
        assert sum(events for events, _ in _ledger(streamed, 0).values()) + sum(
            events for batch in (1, 2) for events, _ in _ledger(streamed, batch).values()) == reference.applied
        assert len(streamed.batches.composite((f"split@{query.id}", 1))) == 2


@pytest.mark.spark
def test_forward_completes_a_batch_every_partition_of_which_had_failed(spark, tmp_path, make_database_url):
    """A batch none of whose partitions committed (here its one partition: ``partition_by_key=1``; a fault in
    every partition does the same) and that the restart after the fix applies whole: its failure turns
    *completed*.  The driver looked for a failure to complete only when the ledger skipped a partition of the
    batch, so such a batch stayed *pending completion* in ``activedb status`` for good."""
    with _poisoned(tmp_path / "in", make_database_url, "fwd_all") as (workload, poison, streamed, direct):
        query = _ingest(spark, streamed, tmp_path / "in", tmp_path / "checkpoint", "forward", partitions=1)
        with pytest.raises(Exception):
            query.awaitTermination(STREAM_TIMEOUT_SECONDS)
        assert _failures(streamed) == [(1, 0, "forward", "pending completion")]
        assert _ledger(streamed, 1) == {}                        # nothing of batch 1 committed

        with streamed.transaction() as tx:                       # the fix
            tx.insert("items", key=app_split.FIX_KEY, value=1)
        run_to_end(_ingest(spark, streamed, tmp_path / "in", tmp_path / "checkpoint", "forward", partitions=1))
        assert set(_ledger(streamed, 1)) == {"p0"}
        assert _failures(streamed) == [(1, 0, "forward", "completed")]
        assert [(row.batch_id, row.state) for row in activedb.atomic.split_status(streamed) if row.batch_id is not None
                ] == [(1, "completed")]


@pytest.mark.spark
def test_a_batch_resumed_partitioned_by_another_key_is_refused_not_split_otherwise(spark, tmp_path,
                                                                                  make_database_url):
    """A forward failure leaves batch 1 with one partition committed; the restart applies the others.  Restarted
    with another key column (the same number of partitions), the batch's rows hashed to other partitions: the
    committed partition's ledger row skipped rows it never had, and the rest went to the uncommitted one — some
    rows applied a second time, some never.  The ledger did not record the key.  Now the query's declared layout
    holds the key column and its Spark type, and the restart stops at that batch saying which key resumes it;
    resumed with it, the batch completes as before."""
    from pyspark.sql import functions as F

    with _poisoned(tmp_path / "in", make_database_url, "rekeyed") as (workload, poison, streamed, direct):
        query = _ingest(spark, streamed, tmp_path / "in", tmp_path / "checkpoint", "forward")
        with pytest.raises(Exception):
            query.awaitTermination(STREAM_TIMEOUT_SECONDS)
        [(_, failed, _, _)] = _failures(streamed)
        with streamed.transaction() as tx:                       # the fix
            tx.insert("items", key=app_split.FIX_KEY, value=1)
        before = (counters(streamed), _ledger(streamed, 1))

        frame = (spark.readStream.schema(app_split.SCHEMA).option("maxFilesPerTrigger", 1).json(str(tmp_path / "in"))
                 .withColumn("shard", F.concat(F.col("key"), F.lit("."))))
        rekeyed = spark_bridge.ingest(streamed, frame, mapping=activedb.ingest.EventMapping(
                                          "type", "shard", "ts", payload_columns=("amount", "seq")),
                                      query_name="split", checkpoint_location=str(tmp_path / "checkpoint"),
                                      trigger={"availableNow": True}, partition_by_key=2, app=APP_FILE,
                                      on_partition_failure="forward")
        with pytest.raises(Exception, match=r"batch 1 of this checkpoint .* partitioned by key 'key' \(string\), "
                                            r"and Spark runs it again now partitioned by 'shard' \(string\).*"
                                            r"Resume it with the key column 'key' \(string\)"):
            rekeyed.awaitTermination(STREAM_TIMEOUT_SECONDS)
        assert (counters(streamed), _ledger(streamed, 1)) == before
        assert _failures(streamed) == [(1, failed, "forward", "pending completion")]

        run_to_end(_ingest(spark, streamed, tmp_path / "in", tmp_path / "checkpoint", "forward"))
        with direct.transaction() as tx:
            tx.insert("items", key=app_split.FIX_KEY, value=1)
        apply_directly(direct, _good(workload, [0, 1, 2]) + poison)
        assert counters(streamed) == counters(direct)
        assert _failures(streamed) == [(1, failed, "forward", "completed")]


def test_a_replayed_batch_s_key_is_checked_by_column_and_spark_type_when_it_was_recorded(make_database_url):
    """Spark hashes a row to its partition by the key's value as its type (an ``int`` and a ``bigint`` of one value
    hash apart), so the layout a replayed batch is checked against is the partition count, the key column and its
    type.  A query declared before revision 0017_split_key has no key recorded: only its partition count is
    checked."""
    from spark_bridge._sink import check_layout

    database = new_app_database(make_database_url, "layout_key", app_split)
    try:
        query_id = f"q@{uuid.uuid4()}"
        sink = IngestSink(database, app_split.MAPPING, query_name="q")
        assert sink.process([_row(1, "a", 0)], 3, query_id=f"{query_id}#p0").committed
        activedb.atomic.declare_policy(database, query_id, "q", 2, activedb.atomic.SplitFailure.FORWARD,
                                       ("key", "int"))
        [declared] = [row for row in activedb.atomic.split_status(database, "q") if row.batch_id is None]
        assert (declared.partitions, declared.partition_key) == (2, ("key", "int"))
        check_layout(database, query_id, 3, 2, ("key", "int"))
        for other in (("key", "bigint"), ("worker", "int")):
            with pytest.raises(IngestError, match=rf"batch 3 .* partitioned by key 'key' \(int\), and Spark runs it "
                                                  rf"again now partitioned by '{other[0]}' \({other[1]}\)"):
                check_layout(database, query_id, 3, 2, other)
        with pytest.raises(IngestError, match=r"in 2 partitions, and Spark runs it again now in 3 partitions"):
            check_layout(database, query_id, 3, 3, ("key", "int"))
        activedb.atomic.declare_policy(database, query_id, "q", 2, activedb.atomic.SplitFailure.FORWARD)
        check_layout(database, query_id, 3, 2, ("key", "bigint"))       # (not recorded: not checked)
    finally:
        database.close()


@pytest.mark.spark
def test_an_application_file_that_is_not_there_is_refused_before_the_query_starts(spark, tmp_path, make_database_url):
    """``app=`` given as a ``.py`` path the scale-out tasks load (on a cluster ``ingest()`` sends the driver's copy):
    a path with no file there started the query, and its first batch's tasks failed with ``AppLoadError: no such
    application file``.  It is refused by ``ingest()`` (and a sink built directly), naming the path; a module name,
    which the tasks import from their own environment, is not looked up on the driver."""
    database = new_app_database(make_database_url, "no_app_file", app_split)
    try:
        frame = spark.readStream.schema(app_split.SCHEMA).json(str(tmp_path))
        missing = tmp_path / "nope.py"
        with pytest.raises(IngestError, match=rf"app={re.escape(repr(str(missing)))}: no such file.*\.py file"):
            spark_bridge.ingest(database, frame, mapping=app_split.MAPPING, query_name="x",
                                checkpoint_location=str(tmp_path / "c"), partition_by_key=2, app=str(missing))
        assert spark.streams.active == []
        with pytest.raises(IngestError, match=r"no such file"):
            spark_bridge.PartitionedIngestSink(database, app_split.MAPPING, partitions=2, app=missing,
                                               query_name="x")
        writer = spark_bridge.ingest(database, frame, mapping=app_split.MAPPING, query_name="x", start=False,
                                     checkpoint_location=str(tmp_path / "c"), partition_by_key=2,
                                     app="an_application_module_only_the_executors_have")
        spark_bridge.sink_of(writer).close()
    finally:
        database.close()


# --- the run's salt ----------------------------------------------------------------------------------------------

def _placement(spark, path, partitions: int, salt: int) -> dict[str, int]:
    """Rows per partition (``pN``) of the batch file ``path`` split as the scale-out path splits it with ``salt``:
    Spark's ``hash(key)`` of each row, then ``salted_hash`` mod ``partitions`` (Python's ``%``: Spark's ``pmod``)."""
    from pyspark.sql import functions as F

    from spark_bridge._scaleout import salted_hash

    found: dict[str, int] = {}
    for (key_hash,) in spark.read.schema(app_split.SCHEMA).json(str(path)).select(F.hash("key")).collect():
        part = f"p{salted_hash(key_hash, salt) % partitions}"
        found[part] = found.get(part, 0) + 1
    return found


def _row_counts(database, batch_id) -> dict[str, int]:
    return {query_id.rsplit("#", 1)[1]: rows for query_id, rows in query_rows(
        database, "SELECT query_id, row_count FROM activedb_ingestion_ledger WHERE batch_id = :b", b=batch_id)}


@pytest.mark.spark
def test_the_salted_split_is_spark_s_hash_of_the_key_and_the_salt(spark):
    """The scale-out path splits a run's batches by ``hash(key, salt) mod N``, and chooses the salt in the driver
    from Spark's ``hash(key)`` of its first batch's rows (``choose_salt``): ``salted_hash`` must be what Spark
    computes — for a string and a bigint key, a null key among them — and ``_by_key`` must place each row where it
    says; salt 0 is the key's hash alone (the split of runs recorded before salts)."""
    from pyspark.sql import functions as F

    from spark_bridge._scaleout import _by_key, salted_hash

    for values, key_type in ((["w0", "w1", "room 7", "", "ü", None] + [f"k{n}" for n in range(40)], "string"),
                             ([0, -1, 2**40, -(2**35), None] + list(range(100, 140)), "bigint")):
        frame = spark.createDataFrame([(value, index) for index, value in enumerate(values)],
                                      f"key {key_type}, n int")
        for salt in (0, 1, 7, 999):
            rows = frame.select("n", F.hash("key").alias("h"), F.hash("key", F.lit(salt).cast("int")).alias("hs")
                                ).collect()
            assert [salted_hash(row.h, salt) for row in rows] == [row.h if salt == 0 else row.hs for row in rows]
            hashes = {row.n: row.h for row in rows}
            placed = (_by_key(frame, "key", 3, salt).rdd
                      .mapPartitionsWithIndex(lambda index, part: [(row[1], index) for row in part]).collect())
            assert sorted(placed) == sorted((n, salted_hash(hashes[n], salt) % 3) for n in hashes), (key_type, salt)


def test_the_salt_is_the_smallest_one_whose_split_has_the_smallest_largest_partition():
    """``choose_salt`` compares the salts' splits of the first batch's rows per key hash by their largest
    partition (the critical path of the batch's tasks) and takes the smallest salt of the best: 0 when the key's
    hash alone splits evenly, which every salt ties."""
    from activedb.atomic import SALTS
    from spark_bridge._scaleout import salted_hash

    def choose_salt(key_counts, partitions):
        return activedb.atomic.choose_salt(key_counts, partitions, salted_hash)

    counts = [(hash_value, 100 + 13 * index) for index, hash_value in enumerate(range(-20, 20, 3))]

    def largest(salt, partitions):
        loads = [0] * partitions
        for key_hash, rows in counts:
            loads[salted_hash(key_hash, salt) % partitions] += rows
        return max(loads)

    for partitions in (2, 3, 5):
        chosen = choose_salt(counts, partitions)
        best = min(largest(salt, partitions) for salt in range(SALTS))
        assert largest(chosen, partitions) == best
        assert all(largest(salt, partitions) > best for salt in range(chosen)), partitions
    assert choose_salt([(0, 10), (1, 10)], 2) == 0          # (0 and 1 land apart: even already)
    assert choose_salt(counts, 1) == 0 and choose_salt([], 2) == 0


def test_a_replayed_batch_is_checked_against_the_run_s_recorded_salt(make_database_url):
    """A run's salt decides which partition each row of its batches lands in, so a batch the ledger holds in
    partitions and run again with another salt would have rows applied twice and others never: ``check_layout``
    refuses it, naming both salts.  A run recorded before salts (NULL) split with none, as salt 0 does."""
    from spark_bridge._sink import check_layout

    database = new_app_database(make_database_url, "layout_salt", app_split)
    try:
        query_id = f"q@{uuid.uuid4()}"
        sink = IngestSink(database, app_split.MAPPING, query_name="q")
        assert sink.process([_row(1, "a", 0)], 3, query_id=f"{query_id}#p0").committed
        policy = activedb.atomic.SplitFailure.FORWARD
        activedb.atomic.declare_policy(database, query_id, "q", 2, policy, ("key", "string"), salt=5)
        assert activedb.atomic.declared_layout(database, query_id).salt == 5
        check_layout(database, query_id, 3, 2, ("key", "string"), 5)
        check_layout(database, query_id, 4, 2, ("key", "string"), 6)         # (not in the ledger)
        for other in (0, None, 6):
            with pytest.raises(IngestError, match=rf"batch 3 .* in 2 partitions split with salt 5, and Spark runs it "
                                                  rf"again now split with salt {other or 0}"):
                check_layout(database, query_id, 3, 2, ("key", "string"), other)
        activedb.atomic.declare_policy(database, query_id, "q", 2, policy, ("key", "string"))   # (recorded before)
        assert activedb.atomic.declared_layout(database, query_id).salt is None
        check_layout(database, query_id, 3, 2, ("key", "string"), 0)
        check_layout(database, query_id, 3, 2, ("key", "string"))
        with pytest.raises(IngestError, match=r"split with salt 0, and Spark runs it again now split with salt 5"):
            check_layout(database, query_id, 3, 2, ("key", "string"), 5)
        assert activedb.atomic.declared_layout(database, "q@nothing") is None
    finally:
        database.close()


@pytest.mark.spark
def test_a_run_splits_every_batch_with_the_salt_it_chose_at_its_first_batch(spark, tmp_path, make_database_url):
    """The salt is chosen once, from the run's first batch (its rows per key hash, ``choose_salt``), and recorded
    with the run's layout (``activedb status`` shows it); every batch of the run is split with it, and so is the
    batch Spark re-delivers after a restart: the forward failure's committed partition is skipped and the other
    applied, with nothing doubled or lost."""
    from click.testing import CliRunner
    from pyspark.sql import functions as F

    from activedb.cli import main
    from spark_bridge._scaleout import salted_hash

    with _poisoned(tmp_path / "in", make_database_url, "salted") as (workload, poison, streamed, direct):
        first = tmp_path / "in" / "part-000.json"
        counts = spark.read.schema(app_split.SCHEMA).json(str(first)).groupBy(F.hash("key")).count().collect()
        salt = activedb.atomic.choose_salt([(row[0], row[1]) for row in counts], 2, salted_hash)
        assert salt != 0            # (this batch's keys split unevenly by their hash alone: 14 / 11 rows)
        query = _ingest(spark, streamed, tmp_path / "in", tmp_path / "checkpoint", "forward")
        with pytest.raises(Exception):
            query.awaitTermination(STREAM_TIMEOUT_SECONDS)
        source = f"split@{query.id}"
        assert activedb.atomic.declared_layout(streamed, source).salt == salt
        assert _row_counts(streamed, 0) == _placement(spark, first, 2, salt)
        [(_, failed, _, _)] = _failures(streamed)
        expected = _placement(spark, tmp_path / "in" / "part-001.json", 2, salt)
        assert _row_counts(streamed, 1) == {f"p{1 - failed}": expected[f"p{1 - failed}"]}

        with streamed.transaction() as tx:                       # the fix
            tx.insert("items", key=app_split.FIX_KEY, value=1)
        run_to_end(_ingest(spark, streamed, tmp_path / "in", tmp_path / "checkpoint", "forward"))
        assert activedb.atomic.declared_layout(streamed, source).salt == salt     # (kept, not chosen again)
        assert _row_counts(streamed, 1) == expected
        assert _row_counts(streamed, 2) == _placement(spark, tmp_path / "in" / "part-002.json", 2, salt)
        with direct.transaction() as tx:
            tx.insert("items", key=app_split.FIX_KEY, value=1)
        apply_directly(direct, _good(workload, [0, 1, 2]) + poison)
        assert counters(streamed) == counters(direct)
        result = CliRunner().invoke(main, ["--url", streamed.url.render_as_string(hide_password=False), "status"],
                                    env={"COLUMNS": "250"})
        assert result.exit_code == 0, result.output
        assert (f"(2 partitions, salt {salt})" if salt else "(2 partitions)") in result.output


@pytest.mark.spark
def test_a_run_recorded_before_salts_keeps_splitting_by_the_key_alone(spark, tmp_path, make_database_url):
    """A run whose layout was recorded before revision 0019_split_salt (salt NULL) split its batches by the key's
    hash alone; its batches — and one re-delivered after a restart — are split so still, whatever salt its next
    batch would choose, and its record stays without a salt."""
    with _poisoned(tmp_path / "in", make_database_url, "unsalted") as (workload, poison, streamed, direct):
        spark_id = str(uuid.uuid4())           # (the checkpoint's query id, as Spark writes it: the run's ledger id)
        (tmp_path / "checkpoint").mkdir()
        (tmp_path / "checkpoint" / "metadata").write_text(f'{{"id":"{spark_id}"}}\n')
        source = f"split@{spark_id}"
        activedb.atomic.declare_policy(streamed, source, "split", 2, activedb.atomic.SplitFailure.FORWARD,
                                       ("key", "string"))
        query = _ingest(spark, streamed, tmp_path / "in", tmp_path / "checkpoint", "forward")
        with pytest.raises(Exception):
            query.awaitTermination(STREAM_TIMEOUT_SECONDS)
        assert str(query.id) == spark_id
        assert _row_counts(streamed, 0) == _placement(spark, tmp_path / "in" / "part-000.json", 2, 0)
        with streamed.transaction() as tx:                       # the fix
            tx.insert("items", key=app_split.FIX_KEY, value=1)
        run_to_end(_ingest(spark, streamed, tmp_path / "in", tmp_path / "checkpoint", "forward"))
        for batch in (1, 2):
            assert _row_counts(streamed, batch) == _placement(spark, tmp_path / "in" / f"part-00{batch}.json", 2, 0)
        assert activedb.atomic.declared_layout(streamed, source).salt is None
        with direct.transaction() as tx:
            tx.insert("items", key=app_split.FIX_KEY, value=1)
        apply_directly(direct, _good(workload, [0, 1, 2]) + poison)
        assert counters(streamed) == counters(direct)
