"""``activedb run --metrics-port``: a Prometheus scrape during a real run (Spark ``local[2]``, a file source,
PostgreSQL) returns the metric families an operator watches, with the run's numbers in them."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import urllib.request

import pytest
import sqlalchemy as sa
from prometheus_client.parser import text_string_to_metric_families

import spark_bridge
from activedb.testing import wait_until
from tests.spark_bridge._streams import APP_FILE, app_database, counter_workload, write_files

TIMEOUT_SECONDS = 180


def _scrape(url: str) -> dict[str, list]:
    with urllib.request.urlopen(url, timeout=30) as response:
        text = response.read().decode()
    return {family.name: family.samples for family in text_string_to_metric_families(text)}


def _total(families: dict[str, list], name: str, **labels: str) -> float:
    """The sum of family ``name``'s samples (a counter's ``_total``, a gauge's value) with ``labels``."""
    return sum(sample.value for sample in families[name]
               if sample.name in (name, f"{name}_total")
               and all(sample.labels.get(label) == value for label, value in labels.items()))


@pytest.mark.spark
@pytest.mark.slow
def test_a_scrape_during_a_run_returns_the_families_with_the_runs_numbers(tmp_path, make_database_url):
    workload = counter_workload(files=3, rows_per_file=30, seed=41)
    write_files(tmp_path / "in", workload.batches)
    url = make_database_url("metrics")
    database = app_database(url)
    database.capture("items")                   # another program's writes wait for a consumer: a backlog
    with database.engine.begin() as connection:
        connection.execute(sa.text("INSERT INTO items (key, value) VALUES ('x', 1), ('y', 2)"))
    output = tmp_path / "run.out"
    command = [sys.executable, "-m", "activedb.cli", "--url", url, "run", APP_FILE,
               "--source", f"file:{tmp_path / 'in'}", "--checkpoint", str(tmp_path / "checkpoint"),
               "--query-name", "metered", "--max-files-per-trigger", "1", "--metrics-port", "127.0.0.1:0"]
    with open(output, "wb") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True,
                                   env={**os.environ, "COLUMNS": "200", "ACTIVEDB_HOME": str(tmp_path / "home")})

    def seen() -> str:
        return f"exit code {process.poll()}; output:\n{output.read_text()[-3000:]}"

    def alive(predicate):
        def check():
            assert process.poll() is None, seen()
            return predicate()
        return check

    try:
        match = wait_until(alive(lambda: re.search(r"metrics: (http://\S+/metrics)", output.read_text())),
                           TIMEOUT_SECONDS, "the metrics line", seen)
        endpoint = match.group(1)
        wait_until(alive(lambda: [status.batches for status in spark_bridge.ingestion_status(database, "metered")]
                         == [3]), TIMEOUT_SECONDS, "three committed batches", seen)
        # the sink counts a batch after its commit: wait for the scrape to show the third
        wait_until(alive(lambda: _total(_scrape(endpoint), "activedb_ingest_batches", query="metered") == 3),
                   TIMEOUT_SECONDS, "the scrape to show three batches", seen)
        families = _scrape(endpoint)

        [status] = spark_bridge.ingestion_status(database, "metered")
        assert _total(families, "activedb_ingest_events", query="metered") == status.events > 0
        assert _total(families, "activedb_ingest_dead_letters", query="metered") == status.dead_letters > 0
        for rule, count in status.rule_firings.items():
            assert _total(families, "activedb_ingest_rule_firings", query="metered", rule=rule) == count
        assert _total(families, "activedb_rule_firings", rule="apply_add", outcome="executed") > 0
        assert _total(families, "activedb_rule_firings", rule="apply_add", outcome="failed") > 0
        assert sum(sample.value for sample in families["activedb_dead_letters"]) == status.dead_letters
        assert len({sample.labels["reason"] for sample in families["activedb_dead_letters"]}) >= 2
        assert _total(families, "activedb_capture_backlog_changes", consumer="", table="items") == 2
        [count] = [sample.value for sample in families["activedb_batch_seconds"]
                   if sample.name == "activedb_batch_seconds_count"]
        assert count == 3
        assert _total(families, "activedb_transactions", event="committed") > 0
        for family in ("activedb_lock_waits", "activedb_deadlocks", "activedb_outbox_firings"):
            assert family in families, family          # present; non-zero only when waits/deadlocks happen
        assert all(sample.value == 1 for sample in families["activedb_metrics_source_up"])

        os.killpg(process.pid, signal.SIGINT)       # what Ctrl-C in a terminal does
        assert process.wait(timeout=TIMEOUT_SECONDS) == 0, seen()
        assert "Traceback" not in output.read_text()
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)
        database.capture.remove("items")
        database.close()
