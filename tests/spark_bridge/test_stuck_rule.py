"""A rule that never returns (``app_stuck``: it holds a ``FOR UPDATE`` row lock and waits forever) can be seen and
stopped, and a deadline gets the stream going again, exactly once.

1. ``activedb run`` without a rule deadline: ``activedb status`` (and the metrics) show batch 1 in progress and its
   oldest firing, the rule on that event; the first Ctrl-C waits for the batch, the second ends the process at once
   — its row lock is gone with it and only batch 0 is in the ledger.
2. The same command with a rule deadline: the batch is re-run, the rule passes its deadline, the event becomes a
   dead letter saying so, the batch's transaction is rolled back and the process restarts itself; the batch is
   applied without the event and the run finishes. The tables equal the events applied directly without it, and
   the ledger accounts for every row.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import sqlalchemy as sa
from click.testing import CliRunner

import activedb
from activedb import deadletters, testing
from activedb.cli import main
from tests.spark_bridge import app_stuck
from tests.spark_bridge._streams import (BASE_TIME, app_state, apply_directly, counter_locked, iso,
                                        ledger, new_app_database)
from tests.spark_bridge._waits import DRIVER_WAIT_SECONDS

APP_FILE = str(Path(app_stuck.__file__).resolve())


def _row(batch: int, offset: int, seq: int, key: str, amount: int, kind: str = "add") -> dict:
    moment = BASE_TIME + dt.timedelta(minutes=batch, seconds=offset)
    return {"type": kind, "key": key, "ts": iso(moment), "amount": amount, "seq": seq}


BATCHES = [[_row(0, 1, 1, "k1", 30), _row(0, 2, 2, "k2", 40), _row(0, 3, 3, "k1", 20)],
           [_row(1, 1, app_stuck.STUCK_SEQ, "k1", 5), _row(1, 2, 4, "k2", 10)],
           [_row(2, 1, 5, "k1", 60), _row(2, 2, 6, "k2", 15, "sub")]]
ROWS = [row for batch in BATCHES for row in batch]
# Part 2's rule deadline: the stuck firing is waited for this long before it becomes a dead letter (the test waits
# on the process, not on the clock).  Short, because the test pays it in full; only the stuck firing can come near it:
# every other one reads and writes one row on a connection and tables the app warmed before the stream started
# (``app_stuck.warm_up``) — at most 10 ms measured at load 9 on 2 cores, where a process's first firing on a table
# not yet warmed took up to 98 ms.
RULE_DEADLINE_SECONDS = 5


def _write(directory: Path) -> None:
    directory.mkdir()
    for number, rows in enumerate(BATCHES):
        path = directory / f"part-{number:04d}.json"
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
        os.utime(path, (1_700_000_000 + number, 1_700_000_000 + number))


def _start(command: list[str], output: Path, home: Path) -> subprocess.Popen:
    with open(output, "ab") as sink:
        return subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, "COLUMNS": "200", "ACTIVEDB_HOME": str(home)})


def _wait(predicate, process: subprocess.Popen, output: Path, what: str) -> None:
    def reached():
        if process.poll() is not None:
            raise AssertionError(f"activedb run exited ({process.returncode}) waiting for {what}:\n"
                                 f"{output.read_text()[-3000:]}")
        return predicate()

    testing.wait_until(reached, DRIVER_WAIT_SECONDS, what, describe=lambda: output.read_text()[-3000:])


def _status(url: str) -> dict:
    result = CliRunner().invoke(main, ["--url", url, "status", "--query-name", "stuck", "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def _row_locked(url: str, key: str) -> bool:
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        return counter_locked(engine, key)
    finally:
        engine.dispose()


@pytest.mark.spark
@pytest.mark.slow
def test_a_rule_that_never_returns_is_seen_stopped_and_passed_by_its_deadline(tmp_path, make_database_url):
    url = make_database_url("stuck")
    _write(tmp_path / "in")
    output, home = tmp_path / "run.out", tmp_path / "home"
    command = [sys.executable, "-m", "activedb.cli", "--url", url, "run", APP_FILE, "--source",
               f"file:{tmp_path / 'in'}", "--max-files-per-trigger", "1", "--checkpoint", str(tmp_path / "checkpoint"),
               "--query-name", "stuck"]
    process = _start([*command, "--rule-deadline", "0", "--batch-deadline", "0", "--metrics-port", "0"], output, home)
    try:
        # 1. seen: the batch in progress and its oldest firing, in status and the metrics
        def stuck_in_status() -> bool:
            result = CliRunner().invoke(main, ["--url", url, "status", "--query-name", "stuck", "--json"])
            if result.exit_code != 0:            # (before run has created activedb's tables)
                return False
            found = json.loads(result.output)["in_progress"]
            return bool(found) and found[0]["firing_rule"] == "apply_add"

        _wait(stuck_in_status, process, output, "status to show batch 1 in progress")
        [progress] = _status(url)["in_progress"]
        assert (progress["query_name"], progress["batch_id"], progress["rows"], progress["pid"]) == (
            "stuck", 1, 2, process.pid)
        assert "k1" in progress["firing_event"] and progress["deadline_at"] is None and not progress["stale"]
        assert _row_locked(url, "k1")                 # the rule holds its row lock, as the issue says
        text = CliRunner().invoke(main, ["--url", url, "status"], env={"COLUMNS": "200"}).output
        assert re.search(r"batch 1 of query stuck in progress for \d+ s .*rule apply_add", text), text

        metrics_url = re.search(r"metrics: (http://\S+)", output.read_text()).group(1)
        scraped = urllib.request.urlopen(metrics_url, timeout=60).read().decode()
        assert re.search(r'activedb_ingest_batch_in_progress_seconds\{query="stuck"\} [1-9]', scraped), scraped
        assert re.search(r'activedb_ingest_oldest_firing_seconds\{query="stuck",rule="apply_add"\} [1-9]', scraped)

        # stopped: the first Ctrl-C waits for the batch, the second ends the process at once
        os.killpg(process.pid, signal.SIGINT)
        _wait(lambda: "stopping: letting batch 1 finish" in output.read_text(), process, output, "the first stop")
        os.killpg(process.pid, signal.SIGINT)
        assert process.wait(timeout=120) == 130, output.read_text()[-3000:]
        assert "stopped at once" in output.read_text()
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=60)
    # Gone with the process's connection — once its backend has seen the connection close, which it does on its own
    # time after the process ended: waited for, bounded.
    testing.wait_until(lambda: not _row_locked(url, "k1"), DRIVER_WAIT_SECONDS,
                       "the row lock of the ended process's connection to go")
    database = activedb.connect(url)                   # a reader: the run's rules stay as app_stuck declared them
    try:
        assert [row[1] for row in ledger(database)] == [0]

        # 2. passed: the deadline makes the event a dead letter, the process restarts itself, the run finishes
        process = _start([*command, "--rule-deadline", str(RULE_DEADLINE_SECONDS), "--available-now"], output, home)
        try:
            assert process.wait(timeout=DRIVER_WAIT_SECONDS) == 0, output.read_text()[-3000:]
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
        text = output.read_text()
        passed = f"did not return within its deadline of {RULE_DEADLINE_SECONDS} s"
        assert passed in text and "restarting" in text, text[-3000:]
        assert "the query finished" in text

        batches = ledger(database)
        assert [row[1] for row in batches] == [0, 1, 2]
        assert sum(row[2] + row[3] for row in batches) == len(ROWS)
        [letter] = deadletters.select(database)
        assert letter.batch_id == 1 and letter.raw["seq"] == app_stuck.STUCK_SEQ
        assert f"rule 'apply_add' {passed}" in letter.reason, letter.reason
        assert _status(url)["in_progress"] == []

        direct = new_app_database(make_database_url, "stuck_direct")
        try:
            apply_directly(direct, [row for row in ROWS if row["seq"] != app_stuck.STUCK_SEQ])
            assert app_state(database) == app_state(direct)
        finally:
            direct.close()
    finally:
        database.close()
