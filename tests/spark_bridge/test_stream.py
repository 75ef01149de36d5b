"""Real local Spark: a file-source stream through get_spark() and foreachBatch.

* rows arrive in Python through ``toArrow()`` and become events with ``rows_to_events``;
* the plain write path commits each batch with its ledger row, and a batch that Spark
  re-runs after a restart (same batch id) is recognised and skipped.
"""

from __future__ import annotations

import threading
from pathlib import Path

import psycopg
import pytest

from benchmarks.plain_write import PlainWriteSink, psycopg_conninfo
from activedb.ingest._mapping import EventMapping, rows_to_events
from tests.spark_bridge._streams import write_files

pytestmark = pytest.mark.spark

SCHEMA = "type STRING, key STRING, ts TIMESTAMP, room INT"
MAPPING = EventMapping("type", "key", "ts")
STREAM_TIMEOUT_SECONDS = 120


def _file_stream(spark, directory: Path):
    return spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(str(directory))


def _run_to_end(query) -> None:
    assert query.awaitTermination(STREAM_TIMEOUT_SECONDS), "stream did not finish in time"
    assert query.exception() is None, query.exception()


def test_file_stream_delivers_rows_as_events(spark, tmp_path):
    batches = [
        [
            {"type": "enter", "key": "p1", "ts": "2024-05-01T12:00:03Z", "room": 1},
            {"type": "wash", "key": "p1", "ts": "2024-05-01T12:00:01Z", "room": 1},  # out of order
            {"type": "leave", "key": "p2", "ts": "2024-05-01T12:00:02Z", "room": 2},
        ],
        [
            {"type": "enter", "key": None, "ts": "2024-05-01T12:01:00Z", "room": 3},  # null key
            {"type": "dance", "key": "p3", "ts": "2024-05-01T12:01:01Z", "room": 3},  # unknown type
            {"type": "enter", "key": "p3", "ts": "not a time", "room": 3},  # unparsable: null ts
            {"type": "leave", "key": "p3", "ts": "2024-05-01T12:01:02Z", "room": 3},
        ],
    ]
    write_files(tmp_path / "in", batches)
    results: dict[int, tuple] = {}
    lock = threading.Lock()  # protects results (foreachBatch runs on a py4j callback thread)

    def handle(batch_df, batch_id):
        good, bad = rows_to_events(batch_df.toArrow(), MAPPING, known_types={"enter", "leave", "wash"})
        with lock:
            results[batch_id] = (good, bad)

    query = (
        _file_stream(spark, tmp_path / "in")
        .writeStream.foreachBatch(handle)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    _run_to_end(query)

    assert sorted(results) == [0, 1]
    good, bad = results[0]
    assert bad == []
    assert [(event.event_type, event.ts.second) for event in good] == [("wash", 1), ("leave", 2), ("enter", 3)]
    assert good[0].payload == {"room": 1} and good[0].ts.tzinfo is not None

    good, bad = results[1]
    assert [(event.event_type, event.key) for event in good] == [("leave", "p3")]
    reasons = {rejected.row["type"] + "/" + str(rejected.row["key"]): rejected.reason for rejected in bad}
    assert reasons == {
        "enter/None": "key ('key') is null",
        "dance/p3": "event type ('type') is 'dance', not a known event type (known: 'enter', 'leave', 'wash')",
        "enter/p3": "timestamp ('ts') is null",
    }


def _create_tables(conninfo: str) -> None:
    with psycopg.connect(conninfo, autocommit=True) as connection:
        connection.execute(
            "CREATE TABLE stream_ledger (query_id text, batch_id bigint, row_count int,"
            " PRIMARY KEY (query_id, batch_id))"
        )
        connection.execute("CREATE TABLE stream_events (type text, key text, ts timestamptz, room int)")


def test_plain_write_is_exactly_once_when_spark_replays_a_batch(spark, tmp_path, database_url):
    conninfo = psycopg_conninfo(database_url)
    _create_tables(conninfo)
    batches = [
        [{"type": "enter", "key": f"p{batch}-{row}", "ts": f"2024-05-01T12:0{batch}:0{row}Z", "room": row}
         for row in range(5)]
        for batch in range(3)
    ]
    write_files(tmp_path / "in", batches)
    checkpoint = tmp_path / "checkpoint"

    def run(sink: PlainWriteSink):
        query = (
            _file_stream(spark, tmp_path / "in")
            .writeStream.foreachBatch(sink)
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        _run_to_end(query)
        return query

    first = PlainWriteSink(conninfo, "stream_events", ledger_table="stream_ledger", ledger_count_column="row_count")
    query = run(first)
    assert (first.statistics().batches_written, first.statistics().rows_written) == (3, 15)

    # Make batch 2 "planned but not committed", as a crash between the sink's commit and
    # Spark's commit-log write would leave it: Spark must re-run it with the same id.
    for leftover in (checkpoint / "commits").glob("*2*"):
        leftover.unlink()
    second = PlainWriteSink(conninfo, "stream_events", ledger_table="stream_ledger", ledger_count_column="row_count")
    again = run(second)
    first.close()
    second.close()

    assert again.id == query.id  # the query id lives in the checkpoint
    stats = second.statistics()
    assert (stats.batches_written, stats.batches_skipped) == (0, 1)
    with psycopg.connect(conninfo) as connection:
        assert connection.execute("SELECT count(*), count(DISTINCT key) FROM stream_events").fetchone() == (15, 15)
        ledger = connection.execute("SELECT query_id, batch_id, row_count FROM stream_ledger ORDER BY 2").fetchall()
    assert ledger == [(str(query.id), batch, 5) for batch in range(3)]
