"""``spark_bridge._demo``: the ``spark`` feed of ``activedb demo`` on real Spark and PostgreSQL (its successful run
is ``tests/examples/test_hand_hygiene.py``'s)."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys

import pytest
import sqlalchemy as sa
from rich.console import Console

import activedb
from activedb import testing
from activedb.examples.hand_hygiene import MIGRATIONS, app, queries
from activedb.examples.hand_hygiene.events import generate
from activedb.progress import Progress
from spark_bridge import _demo
from spark_bridge.errors import SparkBridgeError
from tests.spark_bridge._waits import DRIVER_WAIT_SECONDS


@pytest.mark.spark
def test_a_failed_demo_query_is_an_activedb_error_naming_the_batch_and_its_cause(spark, database_url):
    """A demo query that failed raised ``RuntimeError`` with Spark's whole message: ``activedb demo`` showed a
    traceback instead of its one line ``activedb: error: …`` (awaitTermination raised Spark's
    StreamingQueryException before the check).  Here PostgreSQL refuses every batch's ledger row: the first batch
    fails for good."""
    database = activedb.connect(database_url)
    progress = Progress.for_stream(label="demo")
    try:
        database.upgrade_app(MIGRATIONS)
        queries.register_rules(database)
        engine = queries.make_engine(database, record_dead_letters=False)
        queries.reset(database, engine)
        with database.engine.begin() as connection:
            connection.execute(sa.text(
                "CREATE FUNCTION refuse_ledger() RETURNS trigger LANGUAGE plpgsql AS "
                "$$ BEGIN RAISE EXCEPTION 'the ledger is closed'; END $$; "
                "CREATE TRIGGER refuse_ledger BEFORE INSERT ON activedb_ingestion_ledger "
                "FOR EACH ROW EXECUTE FUNCTION refuse_ledger()"))
        events = generate(4, 8, 5)
        with pytest.raises(SparkBridgeError, match=r"^the demo's streaming query failed: batch 0 failed: "
                                                   r".*the ledger is closed") as caught:
            _demo.feed(database, events, app, Console(file=io.StringIO()), progress, engine)
        assert isinstance(caught.value, activedb.ActivedbError) and "\n" not in str(caught.value)
    finally:
        progress.close()
        database.close()


@pytest.mark.spark
def test_a_demo_of_one_event_through_spark_says_one_event_not_1_events(spark, make_database_url):
    """The Spark feed's summary of a run of one event said "fed 1 events … 1 micro-batches … 1 stream transactions
    committed … 1 batches committed … 1 of the 1 rows"; a count of one takes its noun in the singular (``activedb.progress.many``, as
    the demo's own lines).  A database of its own: the module's holds the refused-ledger test's trigger."""
    database = activedb.connect(make_database_url("one_event"))
    progress = Progress.for_stream(label="demo")
    said = io.StringIO()
    try:
        database.upgrade_app(MIGRATIONS)
        queries.register_rules(database)
        engine = queries.make_engine(database, record_dead_letters=False)
        queries.reset(database, engine)
        _demo.feed(database, generate(1, 1, 5), app, Console(file=said, width=400), progress, engine)
    finally:
        progress.close()
        database.close()
    text = " ".join(said.getvalue().split())
    assert "fed 1 event through Spark" in text and "1 micro-batch (" in text, text
    assert not any(f" 1 {noun}s" in text for noun in ("event", "micro-batche", "stream transaction", "dead letter",
                                                      "batche", "row")), text


@pytest.mark.spark
@pytest.mark.slow
def test_ctrl_c_while_spark_feeds_the_demo_exits_130_without_a_traceback_and_the_demo_runs_again(tmp_path,
                                                                                               make_database_url):
    """Ctrl-C while Spark fed the demo printed two pages of py4j tracebacks ("ERROR:root:KeyboardInterrupt while
    sending command.", "reentrant call inside <_io.BufferedReader>"): pyspark's own SIGINT handler called into the
    JVM while the main thread was waiting in a py4j call.  Ctrl-C is sent as a terminal sends it, to the process
    group, once Spark's first micro-batch committed (the demo then waits in a py4j call for the next); then the demo
    runs again to its end."""
    output = tmp_path / "demo.out"
    command = [sys.executable, "-m", "activedb.cli", "--url", make_database_url("interrupted"), "demo", "--events", "4000"]
    environment = {**os.environ, "COLUMNS": "200", "ACTIVEDB_HOME": str(tmp_path / "home")}
    with open(output, "wb") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True,
                                   env=environment)
    try:
        def a_batch_committed() -> bool:
            if process.poll() is not None:
                raise AssertionError(f"the demo exited with {process.returncode}:\n{output.read_text()[-3000:]}")
            return "micro-batches committed" in output.read_text()

        testing.wait_until(a_batch_committed, DRIVER_WAIT_SECONDS, "the demo's first micro-batch committed",
                           describe=lambda: output.read_text()[-3000:])
        os.killpg(process.pid, signal.SIGINT)              # what Ctrl-C in a terminal does
        returncode = process.wait(timeout=DRIVER_WAIT_SECONDS)
        text = output.read_text()
        assert returncode == 130, text[-3000:]
        assert "activedb: interrupted" in text, text[-3000:]
        assert "Traceback" not in text and "ERROR:" not in text and "Exception in thread" not in text, text[-3000:]
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)
    again = subprocess.run(command[:-2], capture_output=True, text=True, env=environment, timeout=DRIVER_WAIT_SECONDS)
    assert again.returncode == 0, (again.stdout + again.stderr)[-3000:]
    assert "400 of the 400 rows" in again.stdout, again.stdout[-3000:]
