"""SIGKILL a driver ingesting with ``handler=TpgHandler(…)`` inside the commit of a batch, restart it from its
checkpoint: the state equals an uninterrupted run (the serial reference, batch by batch).

The driver (``tests.spark_bridge.drivers.ingest_driver``) runs the Streaming Ledger application
``tests/spark_bridge/app_ledger.py`` (``EXECUTOR = "tpg"``), real Spark, one JSON-lines file per batch:

1. held **inside the flush of batch 1** — the PostgreSQL transaction holds batch 1's final state, its
   dead letters and its ledger row, uncommitted (checked: one open transaction, only batch 0 in the
   ledger) — and SIGKILLed with its JVM; PostgreSQL rolls batch 1 back;
2. restarted with the same checkpoint: Spark re-runs batch 1 with the same id, the ledger does not have
   it, it is applied — once — and the stream runs to its end.

Compared with the serial reference: every account and asset, the ledger (each batch once, its counts),
the dead letters (the aborted transfers, each once, with their reasons).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import sqlalchemy as sa

import activedb
from tests.spark_bridge.drivers.crash_driver import kill_driver, read_log, wait_for_line
from tests.spark_bridge.drivers.ingest_driver import start_ingest_driver
from tests.spark_bridge import app_ledger
from tests.spark_bridge._streams import assert_flush_is_open, write_files
from tests.spark_bridge._waits import drivers, finish_driver

pytestmark = [pytest.mark.spark, pytest.mark.slow]

APP = str(Path(app_ledger.__file__).resolve())
FILES, ROWS_PER_FILE = 4, 100
SEED = int(os.environ.get("ACTIVEDB_CRASH_SEED", "20261122"))
TIMEOUT_SECONDS = 300


def _files(directory: Path) -> list[list[dict]]:
    rows = app_ledger.rows(seed=SEED, size=FILES * ROWS_PER_FILE)
    batches = [rows[start:start + ROWS_PER_FILE] for start in range(0, len(rows), ROWS_PER_FILE)]
    write_files(directory, batches)
    return batches


def test_killed_inside_the_commit_of_a_tpg_batch_then_restarted_equals_the_serial_reference(
        tmp_path, make_database_url):
    batches = _files(tmp_path / "in")
    url = make_database_url("tpg_crashed")
    setup = activedb.connect(url)
    setup.upgrade_app(app_ledger.MIGRATIONS)
    app_ledger.reset(setup)
    setup.close()
    common = dict(app=APP, url=url, source=tmp_path / "in", checkpoint=tmp_path / "checkpoint", query_name="ledger")
    with drivers() as processes:
        first = start_ingest_driver(log=tmp_path / "run1.log", hold="flush:1", output=tmp_path / "run1.out", **common)
        processes.append(first)
        wait_for_line(tmp_path / "run1.log", lambda words: words[:1] == ["holding"], timeout=TIMEOUT_SECONDS,
                      process=first)
        assert_flush_is_open(url)
        kill_driver(first)
        second = start_ingest_driver(log=tmp_path / "run2.log", output=tmp_path / "run2.out", **common)
        processes.append(second)
        finish_driver(tmp_path / "run2.log", second, output=tmp_path / "run2.out", what="run 2's 'finished' line",
                      timeout=TIMEOUT_SECONDS)

    steps = [[words for _, words in read_log(tmp_path / log) if words[0] in ("fetched", "flush", "committed",
                                                                             "skipped")]
             for log in ("run1.log", "run2.log")]
    assert steps[0][-1] == ["flush", "1"]                                   # killed inside the commit
    assert steps[1][0] == ["fetched", "1"] and ["committed", "1"] in steps[1]   # batch 1 re-run, applied

    final, outcomes = app_ledger.serial_reference(batches)
    database = activedb.connect(url)
    try:
        assert app_ledger.stored_state(database) == final
        with database.engine.connect() as connection:
            ledger = connection.execute(sa.text(
                "SELECT batch_id, events, dead_letters FROM activedb_ingestion_ledger ORDER BY batch_id")).all()
            letters = connection.execute(sa.text("SELECT batch_id, reason FROM activedb_dead_letters")).all()
        assert [tuple(row) for row in ledger] == [(index, committed, len(aborted))
                                                  for index, (committed, aborted) in enumerate(outcomes)]
        assert sorted((batch_id, reason.removeprefix("aborted: ")) for batch_id, reason in letters) == sorted(
            (index, reason) for index, (_, aborted) in enumerate(outcomes) for reason in aborted)
        assert outcomes[1][1], "batch 1 must abort some transfers (its dead letters are checked once)"
    finally:
        database.close()
