"""What ``activedb run`` says when the trouble is not the application's: a query that started over on tables
earlier runs filled (its events are late: the hint points at that state and at ``--reset``, not at a replay
that would reject them again), a second ``run`` of a query on its checkpoint (refused at once, naming the
process that runs it, instead of Spark's ``CONCURRENT_STREAM_LOG_UPDATE`` in the middle of a batch).

One real ``activedb run`` subprocess (Spark ``local[2]``, a file source); the second run is refused before
Spark starts.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
import sqlalchemy as sa

import activedb
import activedb.ingest
import spark_bridge
from activedb import testing
from activedb.examples.hand_hygiene import MIGRATIONS
from activedb.examples.hand_hygiene.demo import write_event_files
from tests.spark_bridge._waits import DRIVER_WAIT_SECONDS

APP = "activedb.examples.hand_hygiene.app"


def _command(url: str, events, checkpoint, *extra: str) -> list[str]:
    return [sys.executable, "-m", "activedb.cli", "--url", url, "run", APP, "--source", f"file:{events}",
            "--checkpoint", str(checkpoint), "--query-name", "again", *extra]


@pytest.mark.spark
@pytest.mark.slow
def test_a_query_started_over_on_filled_tables_points_at_the_state_and_a_second_run_is_refused(
        tmp_path, make_database_url):
    url = make_database_url("hints")
    files = write_event_files(tmp_path / "events", events=60, workers=3, seed=5)
    database = activedb.connect(url)
    try:
        database.upgrade_app(MIGRATIONS)
        with database.engine.begin() as connection:      # what an earlier run left: every worker far later
            for worker in ("w00", "w01", "w02"):
                connection.execute(sa.text(
                    "INSERT INTO worker_status (worker, status, last_ts, changes) VALUES (:w, 'safe', 1e9, 1)"),
                    {"w": worker})
        environment = {**os.environ, "COLUMNS": "250", "ACTIVEDB_HOME": str(tmp_path / "home")}
        output = tmp_path / "run.out"
        with open(output, "wb") as sink:
            first = subprocess.Popen(_command(url, tmp_path / "events", tmp_path / "checkpoint"), stdout=sink,
                                     stderr=subprocess.STDOUT, start_new_session=True, env=environment)
        try:
            def committed() -> bool:
                if first.poll() is not None:
                    raise AssertionError(f"activedb run exited with {first.returncode}:\n{output.read_text()[-3000:]}")
                statuses = activedb.ingest.ingestion_status(database, "again")
                return bool(statuses) and statuses[0].batches >= 1

            testing.wait_until(committed, DRIVER_WAIT_SECONDS, "the first run's batch",
                               describe=lambda: output.read_text()[-3000:])
            # A second run of the query on its checkpoint: refused before Spark starts, naming the first.
            second = subprocess.run(_command(url, tmp_path / "events", tmp_path / "checkpoint", "--available-now"),
                                    capture_output=True, text=True, env=environment, timeout=DRIVER_WAIT_SECONDS)
            assert second.returncode == 1, second.stdout + second.stderr
            assert f"query 'again' is running in another process (pid {first.pid})" in second.stderr, second.stderr
            assert "starting Spark" not in second.stdout
            os.killpg(first.pid, signal.SIGINT)
            assert first.wait(timeout=DRIVER_WAIT_SECONDS) == 0, output.read_text()[-3000:]
        finally:
            if first.poll() is None:
                os.killpg(first.pid, signal.SIGKILL)
                first.wait(timeout=60)
    finally:
        database.close()
    text = " ".join(output.read_text().split())
    rows = sum(len(path.read_text().splitlines()) for path in files)
    assert f"{rows} rows went to the dead letters" in text, text[-3000:]
    assert f"{rows} of query again's dead letters are late" in text and "would reject them again" in text
    assert "query 'again' is new and started over without --reset" in text
    assert "--query-name NEW --reset" in text
    assert "re-submits" not in text, "a replay of late events would reject them again: not the advice"


class _NoBatchFailed:
    """A sink whose batches all committed: the query itself failed (what ``failure_message`` is told)."""

    def last_failure(self):
        return None


def test_spark_finding_its_log_written_by_another_writer_says_another_process_runs_the_query():
    from spark_bridge._cli import failure_message

    failure = RuntimeError("[CONCURRENT_STREAM_LOG_UPDATE] Concurrent update to the log. Multiple streaming jobs "
                           "detected for 3.\nPlease make sure only one streaming job runs on a specific checkpoint "
                           "location at a time. SQLSTATE: 40000")      # Spark's error-conditions.json
    message = failure_message(_NoBatchFailed(), failure, APP)
    assert "another process runs this query too, on the same checkpoint" in message
    assert "check the source and the Spark options" not in message
