"""``spark_bridge.ingest`` on its other paths, with real Spark (``local[2]``, the session fixture) and
real PostgreSQL; every stream is a few JSON-lines files read with ``availableNow`` (one file per batch).

* **queries** — Active CEP's Q1/R1 as printed (plus Q2 and the app-level edges of
  ``tests/streams/test_disorder.py``) fed through Spark under each scheduler (SEI, S2PL, LWM) leave
  the store exactly as the same events fed straight to a SEI engine; a row older than a punctuation
  the engine already released is a dead letter naming it; a batch Spark re-runs after a lost commit
  is skipped by the ledger (SEI case); ``end_of_stream`` releases what the reorder buffer held;
* **tpg** — the Streaming Ledger workload through the TPG planner equals the serial reference
  (state, per-batch committed/aborted counts, dead letters with their reasons);
* **composite** — interval events from two producers through ``ingest(handler=CompositeHandler(…))`` give the
  composite events the engine gives the same rows directly;
* **misuse** — argument combinations that cannot work are refused with what to do instead.
"""

from __future__ import annotations

import datetime as dt
import os
import random
from pathlib import Path

import pytest
import sqlalchemy as sa

import activedb
import spark_bridge
from activedb import batch, composite, streams
from benchmarks import MIGRATIONS as BENCH_MIGRATIONS
from spark_bridge.errors import IngestError
from tests.composite._workload import pair_rows, pairs_engine
from tests.conftest import APP_MIGRATIONS
from tests.spark_bridge import app_ledger
from tests.spark_bridge._streams import run_to_end, write_files
from tests.streams.conftest import BADGE_TYPES
from tests.streams.test_disorder import engine as disorder_engine

pytestmark = pytest.mark.spark

SEED = int(os.environ.get("ACTIVEDB_SPARK_PATHS_SEED", "4242"))
UTC = dt.timezone.utc
BASE = dt.datetime(2024, 5, 1, 8, 0, tzinfo=UTC)
WORKERS = 4
BADGE_SCHEMA = "type STRING, `HCW-ID` STRING, ts TIMESTAMP, location STRING"
BADGE_MAPPING = spark_bridge.EventMapping("type", "HCW-ID", "ts", payload_columns=["location"])


def _database(url: str, *directories: Path) -> activedb.Database:
    database = activedb.connect(url)
    for directory in directories:
        database.upgrade_app(directory)
    return database


def _hygiene(db, scheduler="sei") -> streams.StreamEngine:
    return disorder_engine(db, name="hygiene", scheduler=scheduler, record_history=False, record_dead_letters=False)


def _reset_hygiene(db) -> None:
    with db.engine.begin() as connection:
        connection.execute(sa.text("TRUNCATE workerstatus, stream_alerts, activedb_stream_state, activedb_dead_letters, "
                                   "activedb_ingestion_ledger"))
        connection.execute(sa.text("INSERT INTO workerstatus VALUES " + ", ".join(
            f"('w{number}', 'safe')" for number in range(WORKERS))))


def _store(db) -> tuple:
    with db.engine.connect() as connection:
        statuses = sorted(connection.execute(sa.text("SELECT workerid, status FROM workerstatus")).all())
        alerts = sorted(connection.execute(sa.text("SELECT worker, location FROM stream_alerts")).all())
    return [tuple(row) for row in statuses], [tuple(row) for row in alerts]


def _badge_batches(rng: random.Random) -> tuple[list[list[dict]], list[dict], dict]:
    """Three batches of badge rows, each shuffled, a few rows moved into the next batch (disorder within
    the watermark delay), and one row in the last batch older than the punctuation released after the
    second (late).  Returns (batches, the good rows, the late row)."""
    rows, ts = [], 0
    for _ in range(120):
        ts += rng.choice((0, 1, 2, 3))
        rows.append({"type": rng.choice(BADGE_TYPES), "HCW-ID": f"w{rng.randrange(WORKERS)}",
                     "ts": (BASE + dt.timedelta(seconds=ts)).isoformat(), "location": f"r{rng.randrange(3)}"})
    batches = [rows[0:40], rows[40:80], rows[80:120]]
    for index in (0, 1):                          # the last rows of a batch arrive with the next one
        moved, batches[index] = batches[index][-3:], batches[index][:-3]
        batches[index + 1] = moved + batches[index + 1]
    late = {"type": "ENTER", "HCW-ID": "w0", "ts": BASE.isoformat(), "location": "r9"}
    batches[2].append(late)
    for batch in batches:
        rng.shuffle(batch)
    good = [row for batch in batches for row in batch if row is not late]
    return batches, good, late


def _badge_events(rows: list[dict]) -> list[streams.StreamEvent]:
    return [streams.StreamEvent(row["type"], dt.datetime.fromisoformat(row["ts"]),
                                {"HCW-ID": row["HCW-ID"], "location": row["location"]}) for row in rows]


@pytest.fixture(scope="module")
def hygiene_databases(make_database_url):
    url = make_database_url("queries")
    streamed = _database(url, APP_MIGRATIONS)
    direct = _database(make_database_url("queries_direct"), APP_MIGRATIONS)
    yield streamed, direct, url
    streamed.close()
    direct.close()


@pytest.mark.parametrize("scheduler", ["sei", "s2pl", "lwm"])
def test_queries_through_spark_equal_the_engine_fed_directly_with_each_scheduler(
        spark, tmp_path, hygiene_databases, scheduler):
    streamed, direct, url = hygiene_databases
    batches, good, late = _badge_batches(random.Random(SEED))
    write_files(tmp_path / "in", batches)
    _reset_hygiene(streamed)
    _reset_hygiene(direct)
    reference = _hygiene(direct, "sei")
    expected_outputs = reference.feed(_badge_events(good), punctuation=streams.END_OF_STREAM)

    def start(database, scheduler_argument):
        frame = spark.readStream.schema(BADGE_SCHEMA).option("maxFilesPerTrigger", 1).json(str(tmp_path / "in"))
        return spark_bridge.ingest(database, frame, mapping=BADGE_MAPPING, query_name="badges",
                                   checkpoint_location=str(tmp_path / "checkpoint"), trigger={"availableNow": True},
                                   watermark_delay="20 seconds",
                                   handler=streams.QueriesHandler(lambda db, scheduler: _hygiene(db, scheduler),
                                                                  scheduler=scheduler_argument))

    query = start(streamed, scheduler)
    run_to_end(query)
    sink = spark_bridge.sink_of(query)
    [engine] = sink.handler.engines
    assert engine.scheduler.name == scheduler
    with streamed.engine.connect() as connection:
        letters = connection.execute(sa.text(
            "SELECT query_id, batch_id, reason, raw FROM activedb_dead_letters ORDER BY id")).all()
        ledger = connection.execute(sa.text(
            "SELECT batch_id, events, dead_letters FROM activedb_ingestion_ledger ORDER BY batch_id")).all()
    [(query_id, batch_id, reason, raw)] = letters
    assert (query_id, batch_id) == (f"badges@{query.id}", 2)
    assert reason.startswith("late: ENTER^") and "older than the punctuation" in reason, reason
    released = BASE + dt.timedelta(seconds=max(
        (dt.datetime.fromisoformat(row["ts"]) - BASE).total_seconds() for row in batches[0])) - dt.timedelta(seconds=20)
    assert released.isoformat() in reason                  # the punctuation it names: batch 1's watermark
    assert raw["location"] == "r9"                         # the raw row as it came
    assert [tuple(row) for row in ledger] == [(0, ledger[0][1], 0), (1, ledger[1][1], 0), (2, ledger[2][1], 1)]
    held = len(engine.buffered())
    assert held > 0, "the last watermark leaves events in the reorder buffer"
    assert sum(row[1] for row in ledger) + held == len(good)

    if scheduler == "sei":
        # Lose Spark's commit of the last batch: the restarted query (a new engine, state loaded from the
        # database) re-runs batch 2, which the ledger skips — nothing is applied twice.
        before = _store(streamed)
        (tmp_path / "checkpoint" / "commits" / "2").unlink()
        resumed = _database(url)
        try:
            again = start(resumed, "sei")
            run_to_end(again)
            replay = spark_bridge.sink_of(again).statistics()
            assert (replay.batches, replay.batches_skipped, replay.last_batch_id) == (0, 1, 2)
            assert _store(streamed) == before
            [resumed_engine] = spark_bridge.sink_of(again).handler.engines
            assert spark_bridge.end_of_stream(again) == held        # the saved buffer, released once
            assert spark_bridge.end_of_stream(again) == 0
            assert resumed_engine.buffered() == []
        finally:
            resumed.close()
    else:
        assert spark_bridge.end_of_stream(query) == held
    assert _store(streamed) == _store(direct)
    assert _store(direct)[1], "the workload must make Q1 fire"
    assert len(expected_outputs.outputs) > 0


def test_tpg_through_spark_equals_the_serial_reference(spark, tmp_path, make_database_url):
    rows = app_ledger.rows(seed=SEED, size=300)
    batches = [rows[0:100], rows[100:200], rows[200:300]]
    write_files(tmp_path / "in", batches)
    database = _database(make_database_url("tpg"), BENCH_MIGRATIONS)
    try:
        app_ledger.reset(database)
        frame = (spark.readStream.schema(app_ledger.SCHEMA).option("maxFilesPerTrigger", 1)
                 .json(str(tmp_path / "in")))
        query = spark_bridge.ingest(database, frame, mapping=app_ledger.MAPPING, query_name="ledger",
                                    checkpoint_location=str(tmp_path / "checkpoint"), trigger={"availableNow": True},
                                    handler=batch.TpgHandler(app_ledger.TRANSACTIONS()))
        run_to_end(query)
        final, outcomes = app_ledger.serial_reference(batches)
        assert app_ledger.stored_state(database) == final
        with database.engine.connect() as connection:
            ledger = connection.execute(sa.text(
                "SELECT batch_id, events, dead_letters FROM activedb_ingestion_ledger ORDER BY batch_id")).all()
            letters = connection.execute(sa.text(
                "SELECT batch_id, reason, raw FROM activedb_dead_letters ORDER BY id")).all()
        assert [tuple(row) for row in ledger] == [(index, committed, len(aborted))
                                                  for index, (committed, aborted) in enumerate(outcomes)]
        for index, (_, aborted) in enumerate(outcomes):
            assert sorted(reason.removeprefix("aborted: ") for batch_id, reason, _ in letters
                          if batch_id == index) == aborted
        assert any(outcome[1] for outcome in outcomes), "the workload must abort some transfers"
        assert all(raw["type"] == "transfer" for _, _, raw in letters)   # the raw rows, as they came
        assert spark_bridge.sink_of(query).handler.last_pending.mode == "at commit"
    finally:
        database.close()


def test_composition_through_spark_equals_the_engine_fed_directly(spark, tmp_path, make_database_url):
    mapping = spark_bridge.EventMapping("type", "k", "ts", producer_column="producer", accuracy_column="accuracy",
                                        heartbeat_type="heartbeat", payload_columns=["id"])
    schema = "type STRING, k STRING, ts DOUBLE, producer STRING, accuracy DOUBLE, id STRING"
    rows = pair_rows()
    rows.append({"type": "A", "k": "x", "ts": 130.0, "producer": "P7", "accuracy": 0.01, "id": "stranger"})
    batches = [rows[0:9], rows[9:18], rows[18:]]
    write_files(tmp_path / "in", batches)

    from activedb.composite._ingest import feed_batch

    direct = pairs_engine(None)
    expected = [dict(item.payload()) for batch in batches for item in feed_batch(direct, batch, mapping).composites]
    database = _database(make_database_url("composite"))
    try:
        engine = pairs_engine(database)
        frame = spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).json(str(tmp_path / "in"))
        query = spark_bridge.ingest(database, frame, mapping=mapping, query_name="pairs",
                                    checkpoint_location=str(tmp_path / "checkpoint"), trigger={"availableNow": True},
                                    handler=composite.CompositeHandler(engine))
        run_to_end(query)
        with database.engine.connect() as connection:
            ledger = connection.execute(sa.text(
                "SELECT sum(events), sum(dead_letters) FROM activedb_ingestion_ledger")).one()
            [reason] = connection.execute(sa.text("SELECT reason FROM activedb_dead_letters")).scalars().all()
        assert expected, "the rows must compose"
        assert tuple(ledger) == (len(expected), 1)
        assert "'P7' has not joined" in reason
    finally:
        database.close()


def test_argument_combinations_that_cannot_work_are_refused(spark, tmp_path, make_database_url):
    database = _database(make_database_url("misuse"), APP_MIGRATIONS)
    try:
        frame = spark.readStream.schema(BADGE_SCHEMA).json(str(tmp_path))
        common = dict(mapping=BADGE_MAPPING, query_name="q", checkpoint_location=str(tmp_path / "ck"), start=False)
        sei_engine = _hygiene(database, "sei")
        cases = [
            (lambda: dict(handler=batch.TpgHandler(app_ledger.TRANSACTIONS()), partition_by_key=2, app="x"),
             "StateTransactions\\(processes=N\\)"),
            (lambda: dict(handler=streams.QueriesHandler(sei_engine, scheduler="lwm")), "scheduler='lwm'"),
            (lambda: dict(handler=streams.QueriesHandler(sei_engine, scheduler="2pl")), "unknown scheduler"),
            (lambda: dict(handler=batch.TpgHandler(object())), "needs transactions"),
            (lambda: dict(queries=sei_engine), "QueriesHandler"),             # the options of before say where
            (lambda: dict(executor="tpg"), "TpgHandler"),
            (lambda: dict(handler=streams.QueriesHandler(streams.StreamEngine(database, name="own"))),
             "record_dead_letters=False"),
            (lambda: dict(handler=composite.CompositeHandler(composite.CompositionEngine(name="c"))), "producer_column"),
        ]
        for options, message in cases:
            with pytest.raises(IngestError, match=message):
                spark_bridge.ingest(database, frame, **common, **options())
        writer = spark_bridge.ingest(database, frame, **common,
                                     handler=streams.QueriesHandler(sei_engine, scheduler="sei"))
        assert spark_bridge.sink_of(writer).handler.engines == (sei_engine,)
    finally:
        database.close()
