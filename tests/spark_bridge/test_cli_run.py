"""``activedb run`` (a real subprocess: Spark, a file source, Ctrl-C) and ``activedb status``.

Ctrl-C is simulated as a terminal sends it: SIGINT to the whole process group (pyspark
starts its JVM ignoring SIGINT, so only the Python driver acts on it).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from click.testing import CliRunner

import activedb.ingest
import spark_bridge
from activedb import testing
from activedb.cli import main
from tests.spark_bridge import app_counters
from tests.spark_bridge._streams import (APP_FILE, app_database, app_state, apply_directly, counter_workload,
                                         new_app_database, write_files)
from tests.spark_bridge._waits import DRIVER_WAIT_SECONDS, run_to_completion

TIMEOUT_SECONDS = DRIVER_WAIT_SECONDS      # minutes: holds under 5-8x CPU load, fails with what it saw


def _wait_until(predicate, *, timeout: float, process: subprocess.Popen, output) -> None:
    """``testing.wait_until`` while ``activedb run`` is alive; its output tells what it saw."""
    def reached():
        if process.poll() is not None:
            raise AssertionError(f"activedb run exited with {process.returncode}:\n{output.read_text()[-3000:]}")
        return predicate()

    testing.wait_until(reached, timeout, "the condition", describe=lambda: output.read_text()[-3000:])


@pytest.mark.spark
@pytest.mark.slow
def test_run_ingests_a_file_source_until_ctrl_c_stops_it_cleanly(tmp_path, make_database_url):
    workload = counter_workload(files=3, rows_per_file=30, seed=31)
    write_files(tmp_path / "in", workload.batches)
    url = make_database_url("cli")
    output = tmp_path / "run.out"
    command = [sys.executable, "-m", "activedb.cli", "--url", url, "run", APP_FILE,
               "--source", f"file:{tmp_path / 'in'}", "--checkpoint", str(tmp_path / "checkpoint"),
               "--query-name", "cli", "--max-files-per-trigger", "1"]
    with open(output, "wb") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True,
                                   env={**os.environ, "COLUMNS": "200", "ACTIVEDB_HOME": str(tmp_path / "home")})
    try:
        database = app_database(url)
        try:
            def all_batches_committed() -> bool:
                statuses = activedb.ingest.ingestion_status(database, "cli")
                return bool(statuses) and statuses[0].batches == 3

            _wait_until(all_batches_committed, timeout=TIMEOUT_SECONDS, process=process, output=output)
            os.killpg(process.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
            assert process.wait(timeout=TIMEOUT_SECONDS) == 0, output.read_text()[-3000:]
            text = output.read_text()
            assert re.search(r"stopping: (no batch is in progress|letting batch \d+ finish)", text), text[-3000:]
            assert "stopped cleanly" in text
            assert "cli: batches 3 (last 2)" in text
            assert "Traceback" not in text
            assert " WARN " not in text and "WARNING:" not in text, "Spark's warnings belong in the log file"
            assert (tmp_path / "home" / "logs" / "spark.log").exists()

            direct = new_app_database(make_database_url, "cli_direct")
            try:
                reference = apply_directly(direct, workload.good)
                assert app_state(database) == app_state(direct)
            finally:
                direct.close()
        finally:
            database.close()
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)

    runner = CliRunner()
    result = runner.invoke(main, ["--url", url, "status", "--query-name", "cli", "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.output)
    [status] = document["ingestion"]
    assert set(document) == {"ingestion", "in_progress", "split_batches", "detached", "detached_failures",
                             "detached_pending_without_rule", "capture"}
    assert document["detached"]["failed"] == 0 and document["split_batches"] == []
    assert document["detached_pending_without_rule"] == []
    assert (status["query_name"], status["batches"], status["last_batch_id"]) == ("cli", 3, 2)
    assert status["events"] == reference.applied
    assert status["rule_firings"] == reference.rule_firings
    assert status["dead_letters"] == len(workload.malformed) + reference.rejected

    result = runner.invoke(main, ["--url", url, "status"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "ingestion (activedb_ingestion_ledger)" in result.output
    table_row = next(line for line in result.output.splitlines() if line.startswith("│ cli "))
    assert [cell.strip() for cell in table_row.strip("│").split("│")][:5] == [
        "cli", "3", "2", f"{reference.applied:,}", f"{status['dead_letters']:,}"]
    for rule, count in reference.rule_firings.items():
        assert any(rule in line and f"{count:,}" in line for line in result.output.splitlines())

    result = runner.invoke(main, ["--url", url, "status", "--query-name", "nothing-here"])
    assert result.exit_code == 0
    assert "no ingestion has committed a batch for query 'nothing-here' yet" in result.output


def test_run_help_says_what_an_app_provides():
    text = " ".join(CliRunner().invoke(main, ["run", "--help"]).output.split())
    for name in ("register(db)", "MAPPING", "SCHEMA", "MIGRATIONS", "reset(db)", "--reset",
                 "activedb.examples.hand_hygiene.app", "starts over"):
        assert name in text, name


def test_run_rejects_a_malformed_source_and_an_app_without_mapping(tmp_path, database_url):
    runner = CliRunner()
    result = runner.invoke(main, ["--url", database_url, "run", APP_FILE, "--source", "ftp:somewhere"])
    assert result.exit_code == 2
    assert "is not a source; use file:DIR, rate, socket:HOST:PORT or kafka:BROKERS/TOPIC" in result.output

    bare = tmp_path / "bare_app.py"
    bare.write_text("def register(db):\n    pass\n")
    result = runner.invoke(main, ["--url", database_url, "run", str(bare), "--source", "rate"])
    assert result.exit_code == 1
    assert "has no MAPPING" in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize("option", ["--partitions", "--max-files-per-trigger", "--rows-per-second"])
@pytest.mark.parametrize("value", ["0", "-2"])
def test_run_refuses_a_count_below_one_as_a_usage_error(tmp_path, option, value):
    """Checked before anything is opened or started (no database is given): ``--max-files-per-trigger 0`` was
    silently ignored, and the other values were refused only once Spark had started (after ``--reset`` had emptied
    the tables), by the scale-out sink or by Spark itself."""
    result = CliRunner().invoke(main, ["--url", "postgresql://nobody@/nowhere", "run", APP_FILE, "--source", "rate",
                                       "--checkpoint", str(tmp_path / "checkpoint"), option, value])
    assert result.exit_code == 2 and f"Invalid value for '{option}'" in result.output, result.output


def test_run_refuses_on_partition_failure_without_partitions_as_a_usage_error(tmp_path):
    """``--on-partition-failure`` is for the scale-out path (``--partitions N``): without it the run was refused only
    once Spark had started (after ``--reset`` had emptied the tables), with a message naming the Python keyword
    ``on_partition_failure=`` and ``partition_by_key=N`` instead of the command's options.  It is a usage error now,
    before anything is opened (no database is given)."""
    result = CliRunner().invoke(main, ["--url", "postgresql://nobody@/nowhere", "run", APP_FILE, "--source", "rate",
                                       "--checkpoint", str(tmp_path / "checkpoint"), "--on-partition-failure",
                                       "compensate"])
    assert result.exit_code == 2 and "Invalid value for --on-partition-failure" in result.output, result.output
    assert "--partitions N" in result.output and "on_partition_failure=" not in result.output, result.output


@pytest.mark.parametrize("option", ["--rule-deadline", "--batch-deadline"])
@pytest.mark.parametrize("value", ["inf", "nan"])
def test_run_refuses_a_deadline_that_is_no_number_of_seconds_as_a_usage_error(tmp_path, option, value):
    """A deadline of ``inf`` or ``nan`` passed the option's range (0 or more) and was refused by ``Deadlines`` only once
    the database was opened and Spark had started, naming ``Deadlines(batch=…)`` rather than the option."""
    result = CliRunner().invoke(main, ["--url", "postgresql://nobody@/nowhere", "run", APP_FILE, "--source", "rate",
                                       "--checkpoint", str(tmp_path / "checkpoint"), option, value])
    assert result.exit_code == 2 and f"Invalid value for '{option}'" in result.output, result.output
    assert "no finite number of seconds" in result.output, result.output


def test_run_refuses_a_trigger_with_available_now_as_a_usage_error(tmp_path):
    """``--available-now`` reads what is there and stops; with ``--trigger '5 seconds'`` too, the trigger was
    accepted and silently dropped (the query ran ``availableNow``).  A usage error now, before anything is opened."""
    result = CliRunner().invoke(main, ["--url", "postgresql://nobody@/nowhere", "run", APP_FILE, "--source", "rate",
                                       "--checkpoint", str(tmp_path / "checkpoint"), "--trigger", "5 seconds",
                                       "--available-now"])
    assert result.exit_code == 2 and "Invalid value for --trigger" in result.output, result.output
    assert "--available-now" in result.output, result.output


@pytest.mark.parametrize("option", ["--rule-deadline", "--batch-deadline"])
def test_run_refuses_a_deadline_given_with_partitions_as_a_usage_error(tmp_path, option):
    """The scale-out path's batches run in Spark's tasks, which no deadline watches: run passed no deadlines with
    ``--partitions``, so ``--partitions 2 --rule-deadline 5`` was accepted and the deadline silently unused."""
    result = CliRunner().invoke(main, ["--url", "postgresql://nobody@/nowhere", "run", APP_FILE, "--source", "rate",
                                       "--checkpoint", str(tmp_path / "checkpoint"), "--partitions", "2", option, "5"])
    assert result.exit_code == 2 and f"Invalid value for {option}" in result.output, result.output
    assert "--partitions" in result.output, result.output


def test_run_refuses_partitions_for_an_app_whose_batches_do_not_go_to_the_rules_as_a_usage_error(tmp_path):
    """The scale-out path runs the rules in each Spark task; an application with ``EXECUTOR = "tpg"`` (or ``QUERIES``)
    was refused only once the database was opened, ``--reset`` had emptied its tables and Spark had started (10-30
    s), by ``IngestOptions``, naming ``partition_by_key=`` rather than the command's option."""
    app = str(Path(__file__).with_name("app_ledger.py"))
    result = CliRunner().invoke(main, ["--url", "postgresql://nobody@/nowhere", "run", app, "--source", "rate",
                                       "--checkpoint", str(tmp_path / "checkpoint"), "--partitions", "2"])
    assert result.exit_code == 2 and "Invalid value for --partitions" in result.output, result.output
    assert "EXECUTOR" in result.output, result.output


def _processes_with(marker: str) -> list[str]:
    """Command lines of the running processes that contain ``marker`` (zombies have none)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                line = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if marker in line:
                found.append(f"{entry.name}: {line[:200]}")
    return found


@pytest.mark.spark
@pytest.mark.slow
def test_ctrl_c_while_spark_starts_prints_one_line_and_leaves_no_jvm(tmp_path, make_database_url):
    from activedb.testing import wait_until

    (tmp_path / "in").mkdir()
    marker = f"ctrl-c-start-{uuid.uuid4().hex[:8]}"
    output = tmp_path / "run.out"
    command = [sys.executable, "-m", "activedb.cli", "run", APP_FILE, "--source", f"file:{tmp_path / 'in'}",
               "--checkpoint", str(tmp_path / "checkpoint"), "--query-name", marker]
    with open(output, "wb") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True,
                                   env={**os.environ, "COLUMNS": "200", "ACTIVEDB_HOME": str(tmp_path / "home"),
                                        "ACTIVEDB_DATABASE_URL": make_database_url("ctrl_c_start")})
    try:
        wait_until(lambda: "starting Spark" in output.read_text() or process.poll() is not None, timeout=120,
                   message="activedb run to start Spark", describe=lambda: output.read_text()[-2000:])
        os.killpg(process.pid, signal.SIGINT)                   # what Ctrl-C in a terminal does
        assert process.wait(timeout=TIMEOUT_SECONDS) == 130, output.read_text()[-3000:]
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)
    text = output.read_text()
    assert "stopped while Spark was starting: nothing was ingested, Spark is stopped" in text, text[-3000:]
    for noise in ("Traceback", "py4j", "\tat org.apache", "KeyboardInterrupt"):
        assert noise not in text, text[-3000:]
    wait_until(lambda: not _processes_with(marker), timeout=60, message="the Spark JVM to exit",
               describe=lambda: _processes_with(marker))


_RESETTABLE_APP = """
from tests.spark_bridge.app_counters import MAPPING, MIGRATIONS, SCHEMA, register

def reset(db):
    with db.engine.begin() as connection:
        connection.exec_driver_sql("TRUNCATE counters, milestones")
"""


def test_reset_is_refused_when_the_query_has_progress_in_the_ledger_or_the_checkpoint(tmp_path, make_database_url):
    from activedb.ingest import ledger_query_id
    from tests.spark_bridge.test_sink import _event

    url = make_database_url("reset_guard", migrations=(app_counters.MIGRATIONS,))
    database = app_database(url)
    try:
        sink = spark_bridge.IngestSink(database, spark_bridge.EventMapping("type", "key", "ts", payload_columns=(
            "amount", "seq")), query_name="resumed")
        sink.process([_event(seq, amount=10) for seq in range(1, 4)], 0,
                     query_id=ledger_query_id("resumed", str(uuid.uuid4())))
        sink.close()
        before = app_state(database)
    finally:
        database.close()
    assert before["counters"], "the batch must have written the table --reset would empty"
    application = tmp_path / "resettable_app.py"
    application.write_text(_RESETTABLE_APP)
    (tmp_path / "in").mkdir()
    runner = CliRunner()

    def run(query_name: str, checkpoint: str):
        return runner.invoke(main, ["--url", url, "run", str(application), "--source", f"file:{tmp_path / 'in'}",
                                    "--query-name", query_name, "--checkpoint", checkpoint, "--reset"],
                             env={"COLUMNS": "300", "ACTIVEDB_HOME": str(tmp_path / "home")})

    result = run("resumed", str(tmp_path / "fresh_checkpoint"))        # the ledger has its batch
    assert result.exit_code == 1, result.output
    text = " ".join(result.output.split())
    assert "--reset refused: query 'resumed' has progress (the ledger holds 1 batches (3 events))" in text
    assert "Run without --reset to resume, or start over with a new --query-name" in text
    assert "Traceback" not in result.output

    checkpoint = tmp_path / "old_checkpoint"                            # Spark's checkpoint has a commit
    (checkpoint / "commits").mkdir(parents=True)
    (checkpoint / "commits" / "0").write_text("v1\n{}")
    result = run("another", str(checkpoint))
    assert result.exit_code == 1, result.output
    assert f"the checkpoint {checkpoint} has 1 committed batches" in " ".join(result.output.split())

    database = app_database(url)
    try:
        assert app_state(database) == before, "a refused --reset must leave the tables as they were"
    finally:
        database.close()


@pytest.mark.spark
def test_kafka_without_the_connector_explains_how_to_add_it(spark, tmp_path):
    from spark_bridge._sources import SourceSpec, build_stream
    from spark_bridge.errors import SourceError

    loaded = spark_bridge.load_app(APP_FILE)
    with pytest.raises(SourceError) as raised:
        build_stream(spark, SourceSpec("kafka", brokers="localhost:9092", topic="badges"), loaded,
                     file_format="json", max_files_per_trigger=None, rows_per_second=1, event_types=["add"])
    message = str(raised.value)
    assert "Kafka connector is not on the classpath" in message
    assert "--packages org.apache.spark:spark-sql-kafka-0-10_2.13:" in message
    assert "spark.jars.packages" in message


@pytest.mark.spark
def test_a_failing_batch_prints_the_python_cause_and_what_to_do(tmp_path, make_database_url):
    """A batch that raises stops ``run`` with exit code 1, the Python exception (type, message, where) and
    one line of what to do — not Spark's Java stack trace around a py4j proxy error."""
    workload = counter_workload(files=1, rows_per_file=5, seed=3)
    write_files(tmp_path / "in", workload.batches)
    app = tmp_path / "broken_app.py"
    app.write_text("from tests.spark_bridge.app_counters import MAPPING, SCHEMA, MIGRATIONS, register\n"
                   "PREFETCH = {'no_such_table': None}\n")
    url = make_database_url("cli_fail")
    done = run_to_completion(
        [sys.executable, "-m", "activedb.cli", "--url", url, "run", str(app), "--source", f"file:{tmp_path / 'in'}",
         "--checkpoint", str(tmp_path / "checkpoint"), "--available-now"],
        env={**os.environ, "COLUMNS": "200"})
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    assert "batch 0 failed: UnknownTable: no table 'no_such_table'" in done.stderr
    assert "(at _catalog.py:" in done.stderr
    assert "what to do: fix the application" in done.stderr
    assert "resumes at the failed batch" in done.stderr
    for noise in ("Python Proxy", "py4j", "Traceback", "\tat org.apache"):
        assert noise not in done.stderr, done.stderr[-3000:]


def _run_in_a_process(url: str, app: str, tmp_path: Path) -> subprocess.CompletedProcess:
    """``activedb run APP --available-now`` on the empty file source ``tmp_path/in``, in a process of its own."""
    return run_to_completion(
        [sys.executable, "-m", "activedb.cli", "--url", url, "run", app, "--source", f"file:{tmp_path / 'in'}",
         "--checkpoint", str(tmp_path / "checkpoint"), "--available-now"],
        env={**os.environ, "COLUMNS": "300", "ACTIVEDB_HOME": str(tmp_path / "home")})


_RULELESS_APP = """
from tests.spark_bridge.app_counters import MAPPING, MIGRATIONS, SCHEMA

def register(db):
    pass        # (forgot to declare the rules: they are in another module, never imported)
"""


def test_run_refuses_an_app_that_declares_no_rule_before_spark_starts(tmp_path, make_database_url):
    """An application whose batches go to the rules (no QUERIES, no EXECUTOR) and whose register(db) declares no
    rule: every batch would be refused (NoRuleRegistered).  ``activedb run`` started Spark (10-30 s) and stopped at the
    first batch with that error, whose advice — "run the application with activedb's command, which registers them
    (activedb run APP …)" — is the command the user ran; with no batch yet (--available-now on an empty source) it
    said "the query finished", exit 0, having ingested nothing.  It is refused now once register(db) returned, before
    Spark starts: one line naming the application and what to do, exit 1."""
    url = make_database_url("ruleless_run")
    application = tmp_path / "ruleless_app.py"
    application.write_text(_RULELESS_APP)
    (tmp_path / "in").mkdir()
    result = CliRunner().invoke(main, ["--url", url, "run", str(application), "--source", f"file:{tmp_path / 'in'}",
                                       "--checkpoint", str(tmp_path / "checkpoint"), "--available-now"],
                                env={"COLUMNS": "300", "ACTIVEDB_HOME": str(tmp_path / "home")})
    text = " ".join(result.output.split())
    assert result.exit_code == 1, result.output
    assert "starting Spark" not in text, text
    assert (f"activedb: error: {application}: register(db) declared no rule, and its batches go to the rules (it has "
            f"no QUERIES, and no EXECUTOR = 'tpg'): every batch would be refused (NoRuleRegistered); nothing was "
            f"applied") in text, text
    assert "declare its rules in register(db)" in text, text
    assert "Traceback" not in result.output


_RULELESS_RESET_APP = _RULELESS_APP + """

def reset(db):
    import sqlalchemy as sa

    with db.engine.begin() as connection:
        connection.execute(sa.text("TRUNCATE counters, milestones"))
"""


def test_run_reset_refuses_an_app_that_declares_no_rule_before_emptying_its_tables(tmp_path, make_database_url):
    """``activedb run --reset`` with an application whose batches go to the rules and whose register(db) declares no
    rule: its reset(db) emptied the tables, and then the run was refused ("declared no rule … nothing was applied") —
    the user lost the tables' contents to a run that never started.  The refusal comes before reset(db) now: the
    tables keep what they held."""
    url = make_database_url("ruleless_reset", migrations=(app_counters.MIGRATIONS,))
    database = app_database(url)
    try:
        apply_directly(database, counter_workload(1, 10, seed=3, keys=2).good)
        before = app_state(database)
    finally:
        database.close()
    assert before["counters"], before
    application = tmp_path / "ruleless_reset_app.py"
    application.write_text(_RULELESS_RESET_APP)
    (tmp_path / "in").mkdir()
    result = CliRunner().invoke(main, ["--url", url, "run", str(application), "--source", f"file:{tmp_path / 'in'}",
                                       "--checkpoint", str(tmp_path / "checkpoint"), "--available-now", "--reset"],
                                env={"COLUMNS": "300", "ACTIVEDB_HOME": str(tmp_path / "home")})
    text = " ".join(result.output.split())
    assert result.exit_code == 1 and "register(db) declared no rule" in text, text
    assert "reset:" not in text, text
    database = app_database(url)
    try:
        assert app_state(database) == before
    finally:
        database.close()


def test_run_says_when_every_rule_of_its_app_is_disabled(tmp_path, make_database_url):
    """With every rule of the application disabled (``activedb rules disable``, the operator's choice), ``activedb
    run`` applies its batches with no rule run on their events and records them as done — and said only "3 rules".
    It says so before Spark starts now, naming the command that enables them; the run goes on."""
    url = make_database_url("all_disabled_run", migrations=(app_counters.MIGRATIONS,))
    database = app_database(url)
    try:
        names = database.rules.names()
        for name in names:
            database.rules.disable(name)
    finally:
        database.close()
    (tmp_path / "in").mkdir()
    # (A process of its own: the run starts Spark and stops it at its end — in this process, the session the other
    # tests of this worker share.)
    done = _run_in_a_process(url, APP_FILE, tmp_path)
    text = " ".join(done.stdout.split())
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    said = (f"{APP_FILE}: all {len(names)} of its rules are disabled: its batches apply with no rule run on their "
            f"events, recorded as done (activedb rules enable NAME)")
    assert said in text and text.index(said) < text.index("starting Spark"), text


@pytest.mark.spark
def test_run_does_not_refuse_an_app_without_rules_whose_batches_go_to_the_tpg_executor(tmp_path, make_database_url):
    """The refusal of an application that declares no rule is the rule path's: one whose batches go to the TPG
    executor (``EXECUTOR = "tpg"``, ``app_ledger``: no rules) runs — here on an empty source, to its end."""
    url = make_database_url("tpg_without_rules")
    (tmp_path / "in").mkdir()
    done = _run_in_a_process(url, str(Path(__file__).with_name("app_ledger.py")), tmp_path)    # (as above)
    text = " ".join(done.stdout.split())
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "declared no rule" not in text and "the query finished" in text, text
