"""The plain write path against a real PostgreSQL, without Spark: ledger and atomicity."""

from __future__ import annotations

import datetime as dt

import psycopg
import pyarrow as pa
import pytest

from benchmarks.plain_write import PlainWriteSink, psycopg_conninfo
from spark_bridge.errors import SparkBridgeError

UTC = dt.timezone.utc


@pytest.fixture(scope="module")
def conninfo(database_url):
    info = psycopg_conninfo(database_url)
    with psycopg.connect(info, autocommit=True) as connection:
        connection.execute(
            "CREATE TABLE plain_ledger (query_id text, batch_id bigint, transaction_id text NOT NULL,"
            " events int, PRIMARY KEY (query_id, batch_id))"
        )
        connection.execute("CREATE TABLE plain_rows (type text, key text, ts timestamptz, room int, note text)")
    return info


def _table(count: int, start: int = 0) -> pa.Table:
    return pa.table(
        {
            "type": ["enter"] * count,
            "key": [f"p{start + index}" for index in range(count)],
            "ts": pa.array(
                [dt.datetime(2024, 5, 1, tzinfo=UTC) + dt.timedelta(seconds=start + index) for index in range(count)],
                pa.timestamp("us", tz="UTC"),
            ),
            "room": pa.array([index % 7 for index in range(count)], pa.int32()),
            "note": [None, "", 'comma, "quote"\nnewline'] * (count // 3) + [None] * (count % 3),
        }
    )


def _rows(conninfo: str, query_id: str) -> list[tuple]:
    with psycopg.connect(conninfo) as connection:
        return connection.execute(
            "SELECT r.key, r.ts, r.room, r.note FROM plain_rows r WHERE r.type = %s ORDER BY r.ts", (query_id,)
        ).fetchall()


@pytest.mark.parametrize("method", ["copy", "executemany"])
def test_each_batch_once_and_values_round_trip(conninfo, method):
    query_id = f"q-{method}"
    sink = PlainWriteSink(
        conninfo,
        "plain_rows",
        ledger_table="plain_ledger",
        query_id=query_id,
        method=method,
        ledger_values={"transaction_id": "plain-write"},
        ledger_count_column="events",
    )
    table = _table(9).set_column(0, "type", pa.array([query_id] * 9))
    assert sink.write_batch(table, 0) is True
    assert sink.write_batch(table, 0) is False  # replayed batch id: skipped
    assert sink.write_batch(table.slice(0, 0), 1) is True  # an empty batch is still recorded
    stats = sink.statistics()
    sink.close()
    assert (stats.batches_written, stats.batches_skipped, stats.rows_written) == (2, 1, 9)

    rows = _rows(conninfo, query_id)
    assert len(rows) == 9
    assert rows[0] == ("p0", dt.datetime(2024, 5, 1, tzinfo=UTC), 0, None)
    assert [row[3] for row in rows[:3]] == [None, "", 'comma, "quote"\nnewline']  # NULL vs '' kept apart
    with psycopg.connect(conninfo) as connection:
        ledger = connection.execute(
            "SELECT batch_id, transaction_id, events FROM plain_ledger WHERE query_id = %s ORDER BY 1", (query_id,)
        ).fetchall()
    assert ledger == [(0, "plain-write", 9), (1, "plain-write", 0)]


def test_a_failed_batch_leaves_neither_rows_nor_ledger_row(conninfo):
    sink = PlainWriteSink(
        conninfo, "plain_rows", ledger_table="plain_ledger", query_id="q-fail",
        ledger_values={"transaction_id": "plain-write"},
    )
    good = _table(3).set_column(0, "type", pa.array(["q-fail"] * 3))
    bad = good.set_column(3, "room", pa.array(["not a number"] * 3))  # COPY rejects it
    with pytest.raises(psycopg.errors.InvalidTextRepresentation):
        sink.write_batch(bad, 0)
    assert _rows(conninfo, "q-fail") == []
    assert sink.write_batch(good, 0) is True  # the same batch id is still free
    sink.close()
    assert len(_rows(conninfo, "q-fail")) == 3


def test_a_query_id_is_required(conninfo):
    with pytest.raises(SparkBridgeError, match="query_id"):
        PlainWriteSink(conninfo, "plain_rows", ledger_table="plain_ledger").write_batch(_table(1), 0)


def test_executemany_with_on_conflict_upserts_each_row_once_per_batch(conninfo):
    with psycopg.connect(conninfo, autocommit=True) as connection:
        connection.execute("CREATE TABLE plain_counters (key int PRIMARY KEY, n bigint NOT NULL)")
    sink = PlainWriteSink(conninfo, "plain_counters", ledger_table="plain_ledger", query_id="q-upsert",
                          method="executemany", ledger_values={"transaction_id": "plain-write"},
                          on_conflict="(key) DO UPDATE SET n = plain_counters.n + EXCLUDED.n")
    batch = pa.table({"key": pa.array([1, 2, 1, 1], pa.int32()), "n": pa.array([1] * 4, pa.int64())})
    assert sink.write_batch(batch, 0) is True and sink.write_batch(batch, 1) is True
    assert sink.write_batch(batch, 1) is False      # a replayed batch adds nothing
    sink.close()
    with psycopg.connect(conninfo) as connection:
        assert connection.execute("SELECT key, n FROM plain_counters ORDER BY key").fetchall() == [(1, 6), (2, 2)]
    with pytest.raises(SparkBridgeError, match="COPY cannot upsert"):
        PlainWriteSink(conninfo, "plain_counters", on_conflict="(key) DO NOTHING")
