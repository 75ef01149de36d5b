"""SIGKILL the driver mid-stream, restart from the checkpoint: the same batch id comes back.

One scenario, three driver processes (each starts its own JVM, about 5-10 s):

1. run 1 is held inside batch 1's database transaction (rows and ledger row written, not
   committed) and killed: PostgreSQL rolls the transaction back;
2. run 2 must re-run batch 1 (same id, same rows, same query id) and commit it; it is
   then held after batch 3's database commit, before Spark's commit log, and killed;
3. run 3 must re-run batch 3 with the same id, find it in the ledger and skip it.

The final table holds every row exactly once and the ledger every batch id.
"""

from __future__ import annotations


import psycopg
import pytest

from benchmarks.plain_write import psycopg_conninfo
from tests.spark_bridge.drivers.crash_driver import kill_driver, read_log, start_driver
from tests.spark_bridge._streams import write_files
from tests.spark_bridge._waits import drivers, finish_driver, wait_for_driver_line

pytestmark = [pytest.mark.spark, pytest.mark.slow]

FILES = 5
ROWS_PER_FILE = 200


def _batches(log) -> list[list[str]]:
    return [words for _, words in read_log(log) if words[0] in ("batch", "committed", "skipped")]


def test_killed_driver_replays_the_planned_batch_and_the_ledger_makes_it_exactly_once(tmp_path, database_url):
    conninfo = psycopg_conninfo(database_url)
    with psycopg.connect(conninfo, autocommit=True) as connection:
        connection.execute(
            "CREATE TABLE crash_ledger (query_id text, batch_id bigint, row_count int, PRIMARY KEY (query_id, batch_id))"
        )
        connection.execute("CREATE TABLE crash_events (type text, key text, ts timestamptz, room int)")
    source = tmp_path / "in"
    write_files(source, [[{"type": "enter", "key": f"k{index}-{row}", "ts": "2024-05-01T12:00:00Z", "room": row}
                          for row in range(ROWS_PER_FILE)] for index in range(FILES)])
    common = dict(
        source=source, checkpoint=tmp_path / "checkpoint", dsn=conninfo, table="crash_events", ledger="crash_ledger"
    )
    logs = [tmp_path / f"run{number}.log" for number in (1, 2, 3)]
    with drivers() as processes:
        # Run 1: killed inside batch 1's database transaction.
        processes.append(start_driver(log=logs[0], hold="written:1", output=tmp_path / "run1.out", **common))
        wait_for_driver_line(logs[0], lambda words: words[:1] == ["holding"], process=processes[-1],
                             output=tmp_path / "run1.out", what="run 1's 'holding' line")
        kill_driver(processes[-1])

        # Run 2: re-runs batch 1; killed after batch 3's database commit.
        processes.append(start_driver(log=logs[1], hold="committed:3", output=tmp_path / "run2.out", **common))
        wait_for_driver_line(logs[1], lambda words: words[:1] == ["holding"], process=processes[-1],
                             output=tmp_path / "run2.out", what="run 2's 'holding' line")
        kill_driver(processes[-1])

        # Run 3: re-runs batch 3, skips it, finishes.
        processes.append(start_driver(log=logs[2], output=tmp_path / "run3.out", **common))
        finish_driver(logs[2], processes[-1], output=tmp_path / "run3.out", what="run 3's 'finished' line")

    run1, run2, run3 = (_batches(log) for log in logs)
    killed_in_run1 = next(words for words in run1 if words[:2] == ["batch", "1"])
    # The planned-but-uncommitted batch comes back first, same id, same rows, same query id.
    assert run2[0] == killed_in_run1
    assert ["committed", "1"] in run2
    killed_in_run2 = next(words for words in run2 if words[:2] == ["batch", "3"])
    assert run3[0] == killed_in_run2
    assert run3[1] == ["skipped", "3"]
    assert [words[1] for words in run3 if words[0] == "committed"] == ["4"]

    with psycopg.connect(conninfo) as connection:
        count, distinct = connection.execute("SELECT count(*), count(DISTINCT key) FROM crash_events").fetchone()
        ledger = connection.execute("SELECT batch_id, row_count FROM crash_ledger ORDER BY 1").fetchall()
    assert count == distinct == FILES * ROWS_PER_FILE
    assert ledger == [(batch, ROWS_PER_FILE) for batch in range(FILES)]
