"""``activedb capture consume --metrics-port``: a scrape of the running consumer (a real subprocess on real
PostgreSQL) shows its changes, batches and firings, its rules' firings, and the backlog going to zero."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

import activedb
from activedb.testing import wait_until
from tests.capture import _app
from tests.capture.conftest import MIGRATIONS, libpq

TIMEOUT = 120


def _scrape(url: str) -> dict[str, float]:
    """``{sample name{labels}: value}`` of one scrape."""
    with urllib.request.urlopen(url, timeout=30) as response:
        text = response.read().decode()
    return {sample.name + str(sorted(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def test_a_scrape_of_a_running_consumer(database_url, tmp_path):
    database = activedb.connect(database_url)
    database.upgrade_app(MIGRATIONS)
    database.close()
    workload = _app.workload(seed=5, transactions=8)
    output = tmp_path / "consume.out"
    command = [sys.executable, "-m", "activedb.cli", "--url", database_url, "capture", "consume", _app.__file__,
               "--name", "metered", "--metrics-port", "127.0.0.1:0"]
    with open(output, "wb") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True,
                                   env={**os.environ, "PYTHONUNBUFFERED": "1"})

    def seen() -> str:
        return f"exit code {process.poll()}; output:\n{output.read_text()[-3000:]}"

    def alive(predicate):
        def check():
            assert process.poll() is None, seen()
            return predicate()
        return check

    try:
        match = wait_until(alive(lambda: re.search(r"metrics: (http://\S+/metrics)", output.read_text())),
                           TIMEOUT, "the metrics line", seen)
        wait_until(alive(lambda: "running" in output.read_text()), TIMEOUT, "the consumer to run", seen)
        _app.run_workload(libpq(database_url), workload)
        endpoint = match.group(1)
        consumer = "[('consumer', 'metered')]"

        def caught_up():
            values = _scrape(endpoint)
            changes = values.get("activedb_capture_consumer_changes_total" + consumer, 0)
            waiting = sum(value for name, value in values.items()
                          if name.startswith("activedb_capture_backlog_changes") and "metered" in name)
            return (values, changes) if changes > 0 and waiting == 0 else None

        values, changes = wait_until(alive(caught_up), TIMEOUT, "the consumer to catch up", seen)
        assert values["activedb_capture_consumer_batches_total" + consumer] > 0
        assert values["activedb_capture_consumer_firings_total" + consumer] > 0
        assert values["activedb_capture_consumer_failed_total" + consumer] == 0
        assert values["activedb_rule_firings_total[('outcome', 'fired'), ('rule', 'log_change')]"] == changes
        assert {"pending", "done", "failed"} <= {name.split("'")[3] for name in values
                                                  if name.startswith("activedb_outbox_firings[")}

        os.killpg(process.pid, signal.SIGINT)
        assert process.wait(timeout=TIMEOUT) == 0, seen()
        assert "Traceback" not in output.read_text()
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)
