"""``activedb run --metrics-port``: a Prometheus scrape during a real run (Spark ``local[2]``, a file source,
PostgreSQL) returns the metric families an operator watches, with the run's numbers in them — lock waits, a deadlock and
failed outbox firings included: the application (``app_watched``) has sibling rules that read and write one row, a
deadlock staged once between two of them, and a detached rule whose service is down."""

from __future__ import annotations

import sys

import pytest
import sqlalchemy as sa
from click.testing import CliRunner

import activedb.ingest
import spark_bridge
from activedb.cli import main
from tests.metrics._served import ServingProcess, scrape, total
from tests.spark_bridge import app_watched
from tests.spark_bridge._streams import app_database, counter_workload, write_files

TIMEOUT_SECONDS = 180
APP_FILE = app_watched.__file__


@pytest.mark.spark
@pytest.mark.slow
def test_a_scrape_during_a_run_returns_the_families_with_the_runs_numbers(tmp_path, make_database_url):
    write_files(tmp_path / "in", counter_workload(files=3, rows_per_file=30, seed=41).batches)
    url = make_database_url("metrics")
    database = app_database(url, app_watched)
    database.capture("items")                   # another program's writes wait for a consumer: a backlog
    with database.engine.begin() as connection:
        connection.execute(sa.text("INSERT INTO items (key, value) VALUES ('x', 1), ('y', 2)"))
    command = [sys.executable, "-m", "activedb.cli", "--url", url, "run", APP_FILE,
               "--source", f"file:{tmp_path / 'in'}", "--checkpoint", str(tmp_path / "checkpoint"),
               "--query-name", "metered", "--max-files-per-trigger", "1", "--metrics-port", "127.0.0.1:0"]
    try:
        with ServingProcess(command, tmp_path / "run.out",
                            {"COLUMNS": "200", "ACTIVEDB_HOME": str(tmp_path / "home")}) as served:
            endpoint = served.endpoint(TIMEOUT_SECONDS)
            served.wait_for(lambda: [status.batches for status in activedb.ingest.ingestion_status(database, "metered")]
                            == [3], "three committed batches", TIMEOUT_SECONDS)
            # the sink counts a batch after its commit, and detached firings run after it: wait for the scrape to
            # show the third batch and the outbox's failed firings
            def complete(families):
                done = (total(families, "activedb_ingest_batches", query="metered") == 3
                        and total(families, "activedb_outbox_firings", status="failed") > 0
                        and total(families, "activedb_outbox_firings", status="pending") == 0)
                return families if done else None

            families = served.wait_for(lambda: complete(scrape(endpoint)),
                                       "the scrape to show three batches and no pending outbox firing",
                                       TIMEOUT_SECONDS)

            [status] = activedb.ingest.ingestion_status(database, "metered")
            assert total(families, "activedb_ingest_events", query="metered") == status.events > 0
            assert total(families, "activedb_ingest_dead_letters", query="metered") == status.dead_letters > 0
            for rule, count in status.rule_firings.items():
                assert total(families, "activedb_ingest_rule_firings", query="metered", rule=rule) == count
            assert total(families, "activedb_rule_firings", rule="apply_add", outcome="executed") > 0
            assert total(families, "activedb_rule_firings", rule="apply_add", outcome="failed") > 0
            assert total(families, "activedb_dead_letters") == status.dead_letters
            assert len({sample.labels["reason"] for sample in families["activedb_dead_letters"] if sample.value}) >= 2
            assert total(families, "activedb_capture_backlog_changes", consumer="", table="items") == 2
            [count] = [sample.value for sample in families["activedb_batch_seconds"]
                       if sample.name == "activedb_batch_seconds_count"]
            assert count == 3
            assert total(families, "activedb_transactions", event="committed") > 0
            assert total(families, "activedb_rule_firings", rule="watch_large_add", outcome="executed") > 0
            # apply_add and watch_large_add on one row, at the same time: some requests wait (8 of about 55 adds
            # in an engine-only run of these events); lock_left and lock_right deadlock once, on the first add
            assert total(families, "activedb_lock_waits") > 0
            assert total(families, "activedb_deadlocks") >= 1
            # every large add fails for good in the outbox (the pager is down)
            assert total(families, "activedb_outbox_firings", status="failed") > 0
            assert total(families, "activedb_rule_firings", rule="page_on_large_add", outcome="failed") > 0
            # the deadlock's event ran again: no event was lost to it, and the stage wrote nothing that stayed
            with database.engine.connect() as connection:
                assert connection.execute(sa.text("SELECT count(*) FROM milestones WHERE threshold = -1")).scalar() == 0
            assert all(sample.value == 1 for sample in families["activedb_metrics_source_up"])
            served.interrupt(TIMEOUT_SECONDS)
    finally:
        database.capture.remove("items", discard_pending=True)
        database.close()


def test_a_bad_metrics_port_is_one_line_before_spark_starts(tmp_path, database_url):
    runner = CliRunner()
    for value, message, code in (("nonsense", "give a port (e.g. 9464) or ADDRESS:PORT", 2),
                                 ("203.0.113.7:9464", "cannot serve metrics on 203.0.113.7:9464", 1)):
        result = runner.invoke(main, ["--url", database_url, "--home", str(tmp_path / "home"), "run", APP_FILE,
                                      "--source", f"file:{tmp_path}", "--metrics-port", value])
        assert result.exit_code == code, result.output
        assert message in result.output and "Traceback" not in result.output
        assert "starting Spark" not in result.output


def test_a_metrics_port_that_is_no_port_is_a_usage_error_before_anything_is_written(tmp_path, make_database_url):
    """``run APP --metrics-port notaport`` was refused only when the exporter started — after the command had
    created activedb's tables in a new database and upgraded the application's (exit 1).  It is click's usage error
    now (exit 2), and the database is as it was."""
    url = make_database_url("metrics_notaport")
    result = CliRunner().invoke(main, ["--url", url, "--home", str(tmp_path / "home"), "run", APP_FILE,
                                       "--source", f"file:{tmp_path}", "--metrics-port", "notaport"])
    assert result.exit_code == 2 and "--metrics-port" in result.output, result.output
    assert "give a port (e.g. 9464) or ADDRESS:PORT" in result.output, result.output
    engine = sa.create_engine(url)
    try:
        with engine.connect() as connection:
            assert connection.execute(sa.text(
                "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'")).scalar() == 0
    finally:
        engine.dispose()
