"""``activedb capture consume --metrics-port``: a scrape of the running consumer (a real subprocess on real
PostgreSQL) shows its changes, batches and firings, its rules' firings, and the backlog going to zero."""

from __future__ import annotations

import sys

import activedb
from tests.capture import _app
from tests.capture.conftest import MIGRATIONS, libpq
from tests.metrics._served import ServingProcess, scrape, total

TIMEOUT = 120


def test_a_scrape_of_a_running_consumer(database_url, tmp_path):
    database = activedb.connect(database_url)
    database.upgrade_app(MIGRATIONS)
    database.close()
    command = [sys.executable, "-m", "activedb.cli", "--url", database_url, "capture", "consume", _app.__file__,
               "--name", "metered", "--metrics-port", "127.0.0.1:0"]
    with ServingProcess(command, tmp_path / "consume.out", {}) as served:
        endpoint = served.endpoint(TIMEOUT)
        served.wait_for(lambda: "running" in served.output.read_text(), "the consumer to run", TIMEOUT)
        transactions = _app.workload(seed=5, transactions=8)
        _app.run_workload(libpq(database_url), transactions)
        # One change per statement of a committed transaction (each names one row).
        changes = sum(len(statements) for statements in transactions if statements[-1][0] != "ROLLBACK")

        # The consumer counts a batch's changes after the ingestion counted the batch, which is after its position
        # committed (what the backlog reads), and a scrape reads those three one after the other: a scrape in between
        # saw the backlog at zero with the changes of the batches before only, and more ingestion batches than
        # consumer batches.  Once the consumer has counted every change, every later scrape sees them all settled.
        served.wait_for(lambda: total(scrape(endpoint), "activedb_capture_consumer_changes", consumer="metered")
                        == changes, f"the consumer to count the workload's {changes} changes", TIMEOUT)
        families = scrape(endpoint)
        assert total(families, "activedb_capture_consumer_changes", consumer="metered") == changes
        assert total(families, "activedb_capture_backlog_changes", consumer="metered") == 0
        assert total(families, "activedb_capture_consumer_batches", consumer="metered") > 0
        assert total(families, "activedb_capture_consumer_firings", consumer="metered") > 0
        assert total(families, "activedb_capture_consumer_failed", consumer="metered") == 0
        # its batches are batches of the ingestion core, counted as every connector's
        assert total(families, "activedb_ingest_batches", query="capture:metered") == total(
            families, "activedb_capture_consumer_batches", consumer="metered")
        # the detached rules run after the consumer's batch commits (through the outbox): wait for them
        served.wait_for(lambda: total(scrape(endpoint), "activedb_rule_firings", rule="log_change",
                                      outcome="executed") == changes, "every change's log_change firing", TIMEOUT)
        assert {sample.labels["status"] for sample in families["activedb_outbox_firings"]} == {
            "pending", "done", "failed"}
        served.interrupt(TIMEOUT)
