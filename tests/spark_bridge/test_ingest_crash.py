"""SIGKILL the ingesting driver mid-stream, restart from the checkpoint: same result as no crash.

The driver (``spark_bridge._experiments.ingest_driver``) runs ``ingest`` with the test
application over five files (one micro-batch each); three driver processes, each its own
JVM:

1. run 1 is held **inside the engine's flush of batch 1** — the PostgreSQL transaction holds
   batch 1's ledger row, its effects and its dead letters, uncommitted — and killed:
   PostgreSQL rolls it back;
2. run 2 must re-run batch 1 (same id) and commit it, and is held after batch 3's database
   commit, before Spark's commit log, and killed;
3. run 3 must re-run batch 3, find it in the ledger and skip it, then finish.

The final state equals the same events applied directly (per key, per rule), every batch
is in the ledger once, every dead letter is there once.
"""

from __future__ import annotations

import pytest

import spark_bridge
from spark_bridge._baseline import psycopg_conninfo
from spark_bridge._experiments.crash_driver import kill_driver, read_log, wait_for_line
from spark_bridge._experiments.ingest_driver import start_ingest_driver
from tests.spark_bridge._streams import (
    APP_FILE,
    app_database,
    app_state,
    apply_directly,
    counter_workload,
    dead_letters,
    ledger,
    write_files,
)

pytestmark = [pytest.mark.spark, pytest.mark.slow]

FILES = 5
TIMEOUT_SECONDS = 180


def _assert_flush_is_open(url: str) -> None:
    """While run 1 is held: its flush transaction is open in PostgreSQL, batch 1 not visible."""
    import psycopg

    with psycopg.connect(psycopg_conninfo(url)) as connection:
        open_transactions = connection.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND state = 'idle in transaction' AND backend_xid IS NOT NULL").fetchone()[0]
        batches = [row[0] for row in connection.execute("SELECT batch_id FROM activedb_ingestion_ledger")]
    assert open_transactions == 1
    assert batches == [0]


def _steps(log) -> list[list[str]]:
    return [words for _, words in read_log(log) if words[0] in ("fetched", "flush", "committed", "skipped")]


def test_killed_inside_the_flush_and_after_the_commit_then_restarted_equals_an_uninterrupted_run(
        tmp_path, make_database_url):
    workload = counter_workload(files=FILES, rows_per_file=40, seed=5)
    write_files(tmp_path / "in", workload.batches)
    url = make_database_url("crashed")
    app_database(url).close()  # tables and rules exist before the first driver starts
    common = dict(app=APP_FILE, url=url, source=tmp_path / "in", checkpoint=tmp_path / "checkpoint",
                  query_name="crashy")
    logs = [tmp_path / f"run{number}.log" for number in (1, 2, 3)]
    processes = []
    try:
        processes.append(start_ingest_driver(log=logs[0], hold="flush:1", output=tmp_path / "run1.out", **common))
        wait_for_line(logs[0], lambda words: words[:1] == ["holding"], timeout=TIMEOUT_SECONDS, process=processes[-1])
        _assert_flush_is_open(url)
        kill_driver(processes[-1])

        processes.append(start_ingest_driver(log=logs[1], hold="committed:3", output=tmp_path / "run2.out",
                                             **common))
        wait_for_line(logs[1], lambda words: words[:1] == ["holding"], timeout=TIMEOUT_SECONDS, process=processes[-1])
        kill_driver(processes[-1])

        processes.append(start_ingest_driver(log=logs[2], output=tmp_path / "run3.out", **common))
        wait_for_line(logs[2], lambda words: words[:1] in (["finished"], ["failed"]), timeout=TIMEOUT_SECONDS,
                      process=processes[-1])
        assert processes[-1].wait(timeout=60) == 0, (tmp_path / "run3.out").read_text()[-3000:]
    finally:
        for process in processes:
            if process.poll() is None:
                kill_driver(process)

    run1, run2, run3 = (_steps(log) for log in logs)
    assert run1[-1] == ["flush", "1"]  # killed inside the flush, before PostgreSQL's commit
    assert run2[0] == ["fetched", "1"] and ["committed", "1"] in run2
    assert run2[-1] == ["committed", "3"]
    assert run3[:2] == [["fetched", "3"], ["skipped", "3"]]
    assert [words[1] for words in run3 if words[0] == "committed"] == ["4"]

    crashed = app_database(url)
    direct = app_database(make_database_url("uninterrupted"))
    try:
        reference = apply_directly(direct, workload.good)
        assert app_state(crashed) == app_state(direct)
        [status] = spark_bridge.ingestion_status(crashed, "crashy")
        assert status.rule_firings == reference.rule_firings
        assert [batch for _, batch, *_ in ledger(crashed)] == list(range(FILES))
        assert status.events == reference.applied
        letters = dead_letters(crashed)
        assert len(letters) == status.dead_letters == len(workload.malformed) + reference.rejected
        # No dead letter twice: (batch, raw row) pairs are unique.
        assert len({(batch, str(sorted(raw.items()))) for _, batch, _, raw in letters}) == len(letters)
    finally:
        crashed.close()
        direct.close()
