"""The scale-out path on a Spark standalone cluster: the commands of ``spark_bridge/README.md``'s "Running on a
cluster", run in their order on one host, with one executor SIGKILLed while its batch's transaction is open.

The section's ``bash`` block is read from the README and run line by line in a directory of its own (``.venv``
there is this interpreter's environment), with one host's names in place of the README's (``db.example.com:5432``
is the PostgreSQL server the tests use, ``master.example.com`` 127.0.0.1, the master's URL the one it printed) and
``HOME``, ``DB_PASSWORD`` and ``ACTIVEDB_HOME`` set for it; the clone's files a wheel is built from are copied
there for the line that installs ``.`` into the executors' environment (with the user's pip configuration and
cache: ``XDG_CONFIG_HOME``, ``XDG_CACHE_HOME``), which the next line packs with venv-pack.  The master's and
workers' lines run with Spark's variables for a cluster on one host (``_standalone.py``).  The events the demo line
wrote reach ``events/`` one file per micro-batch, each after the previous batch's commit (Spark's commit log).

Batch 1: the test holds ``LOCK TABLE worker_status IN SHARE MODE``, so the tasks' flushes wait on it with their
transactions open; the executor whose Python worker holds one of them (found from the waiting backend's client
port) is SIGKILLed; when it and that Python worker are gone, the lock is released, the master starts another
executor and Spark retries the task.  After the last batch the run is stopped with SIGINT (Ctrl-C).  Then every
application table, the dead letters, the ledger per batch and partition and the outbox equal a run of the same
command on ``local[2]`` (``--available-now --max-files-per-trigger 1``, a database of its own), and the Python
workers caught waiting ran from the unpacked archive (the shared libraries they mapped).

Needs a PostgreSQL server reachable over TCP with password authentication: ``.ci/run``'s server part
(``.ci/with-distribution-postgres``) has one; without ``ACTIVEDB_TEST_SERVER=1`` the test is skipped.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest
import sqlalchemy as sa

import activedb
from lockmgr.testing import wait_until
from spark_bridge import _java
from tests.examples._story import APP_TABLES, table_state
from tests.spark_bridge._standalone import alive, executor_of_connection, standalone_cluster, tail

pytestmark = [pytest.mark.spark, pytest.mark.cluster, pytest.mark.server, pytest.mark.timeout(1200)]

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "spark_bridge" / "README.md"
#: Each wait is on observable state (a log line, Spark's commit log, pg_stat_activity, /proc), bounded
#: by minutes: JVMs start many times slower under load.  It fails with what it saw.
WAIT_SECONDS = 600
QUERY_NAME = "hygiene"                   # activedb run's default for hygiene.py
#: What ``pip install .`` builds the wheel from: the clone's files the README's driver lines need.
CLONE_FILES = ("pyproject.toml", "setup.py", "README.md", "activedb", "coupling", "lockmgr", "spark_bridge",
               "migrations")


#: The comments of the README's block that say where the lines after them run.
HOSTS = {"# every host": "every", "# the driver's host": "driver", "# one host: the master": "cluster"}


def readme_commands() -> list[tuple[str, str]]:
    """``(host, command line)`` of the section's ``bash`` block, continuations joined; ``host`` is ``every``,
    ``driver`` or ``cluster`` (the master's and workers' hosts), from the last comment that named one."""
    text = README.read_text()
    section = text[text.index("## Running on a cluster"):]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    commands, host = [], None
    for line in block.replace("\\\n", " ").splitlines():
        line = re.sub(r"\s+", " ", line).strip()
        if line.startswith("#"):
            host = next((name for prefix, name in HOSTS.items() if line.startswith(prefix)), host)
        elif line:
            assert host is not None, f"the README's cluster commands: which host runs {line!r}?"
            commands.append((host, line))
    return commands


def _state(url: str) -> dict[str, list[tuple]]:
    database = activedb.connect(url)
    try:
        return table_state(database, {
            **APP_TABLES,
            # a rejection names the event's transaction: an id of the run, left out
            "dead letters": "SELECT batch_id, regexp_replace(reason, ' in T[0-9.]+', ''), raw::text "
                            "FROM activedb_dead_letters",
            # the query id's Spark part differs between the runs: only the partition is kept
            "ledger": "SELECT regexp_replace(query_id, '^[^#]*', ''), batch_id, events, dead_letters, "
                      "rule_firings::text FROM activedb_ingestion_ledger",
            "outbox": "SELECT rule, status, trigger_outcome, count(*) FROM activedb_outbox GROUP BY 1, 2, 3",
        })
    finally:
        database.close()


class Script:
    """Runs command lines in ``cwd`` with an environment that ``export`` lines change."""

    def __init__(self, cwd: Path, environment: dict[str, str], names: dict[str, str]) -> None:
        self.cwd, self.environment, self.names = cwd, environment, names

    def line(self, line: str) -> str:
        for placeholder, value in self.names.items():
            line = line.replace(placeholder, value)
        return line

    def run(self, line: str) -> None:
        line = self.line(line)
        if line.startswith("export "):        # keep what it exported: bash evaluates it, prints the environment
            done = subprocess.run(["bash", "-c", f"{line}\nenv -0"], cwd=self.cwd, env=self.environment,
                                  capture_output=True, check=True, timeout=60)
            self.environment = dict(entry.split("=", 1) for entry in done.stdout.decode().split("\0") if "=" in entry)
            return
        done = subprocess.run(["bash", "-c", line], cwd=self.cwd, env=self.environment, capture_output=True,
                              text=True, timeout=WAIT_SECONDS)
        assert done.returncode == 0, activedb.mask_secrets(f"{line}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")


def _python_of(pid: int) -> tuple[str, list[str]]:
    """Where a Python worker runs: its working directory and the files it mapped (its shared libraries, the
    compiled modules it imported), from Linux ``/proc``."""
    fields = (line.split(maxsplit=5) for line in Path(f"/proc/{pid}/maps").read_text().splitlines())
    return os.readlink(f"/proc/{pid}/cwd"), sorted({found[5] for found in fields if len(found) == 6})


def _local_command(run_line: str) -> list[str]:
    """The README's run line for ``local[2]``: without the executors' interpreter and archive, reading what is
    there one file per micro-batch, then stopping."""
    words = shlex.split(run_line)
    while re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):
        words.pop(0)                                            # PYSPARK_PYTHON=…: the archive's
    command: list[str] = []
    skip = False
    for word, following in zip(words, [*words[1:], ""]):
        if skip:
            skip = False
        elif word == "--master":
            command += ["--master", "local[2]"]
            skip = True
        elif word == "--spark-conf" and following.startswith("spark.archives="):
            skip = True
        else:
            command.append(word)
    return [*command, "--available-now", "--max-files-per-trigger", "1"]


def _committed(checkpoint: Path, batch: int) -> bool:
    return (checkpoint / "commits" / str(batch)).exists()


def _in_flight(checkpoint: Path) -> list[int]:
    """Batches Spark planned (offset log) and has not committed."""
    offsets = checkpoint / "offsets"
    planned = [int(path.name) for path in offsets.iterdir() if path.name.isdigit()] if offsets.is_dir() else []
    return sorted(batch for batch in planned if not _committed(checkpoint, batch))


def pending_firings(connection: psycopg.Connection) -> int:
    """Detached firings recorded and not yet run."""
    return connection.execute("SELECT count(*) FROM activedb_outbox WHERE status = 'pending'").fetchone()[0]


def _waiting_on(watcher: psycopg.Connection, holder_pid: int) -> list[tuple[int, int]]:
    """``(backend pid, client port)`` of the sessions waiting for a lock the holder's session has."""
    return [tuple(row) for row in watcher.execute(
        "SELECT pid, client_port FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))", (holder_pid,))]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds the executor's process in /proc")
def test_the_readme_cluster_commands_with_an_executor_killed_mid_batch_equal_a_local_run(
        pg_server, make_database_url, tmp_path):
    if os.environ.get("ACTIVEDB_TEST_SERVER") != "1":
        pytest.skip("needs a PostgreSQL server the executors reach over TCP with a password (the embedded one "
                    "listens on a unix socket only): .ci/run runs it, or .ci/with-distribution-postgres "
                    ".venv/bin/python -m pytest -m cluster")
    environment_root = Path(sys.prefix)
    if sys.prefix == sys.base_prefix or not (environment_root / "bin" / "activedb").exists():
        pytest.skip(f"runs the README's .venv/bin/activedb: {sys.executable} is not in a virtual environment with it")
    server = sa.make_url(pg_server.url("postgres"))
    cluster_url, local_url = make_database_url("cluster"), make_database_url("local")
    host, port, user, password = server.host, server.port, server.username, server.password
    with pytest.raises(psycopg.OperationalError, match="password"):   # else the test shows nothing about it
        psycopg.connect(host=host, port=port, user=user, dbname="postgres", passfile=str(tmp_path / "none"))

    began = time.monotonic()
    timeline: list[str] = []          # when each phase ended: in a failure's message; printed (pytest -s)

    def mark(what: str) -> None:
        timeline.append(f"{time.monotonic() - began:6.1f} s  {what}")
        print(timeline[-1])

    commands = readme_commands()
    names = {   # the README's names for one host's
        "activedb@db.example.com:5432/activedb": f"{user}@{host}:{port}/{sa.make_url(cluster_url).database}",
        "db.example.com:5432:*:activedb:": f"{host}:{port}:*:{user}:",
        "--host master.example.com": "--host 127.0.0.1",
    }
    text = "\n".join(line for _, line in commands)
    for placeholder in [*names, "spark://master.example.com:7077"]:
        assert placeholder in text, f"the README's cluster commands no longer name {placeholder!r}: update the test"
    driver, workers, local, home = (tmp_path / name for name in ("driver", "worker-host", "local", "home"))
    for directory in (driver, workers, local, home):
        directory.mkdir()
        if directory is not home:
            (directory / ".venv").symlink_to(environment_root)
    for name in CLONE_FILES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, driver / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(ROOT / name, driver / name)
    environment = {key: value for key, value in os.environ.items()
                   if key not in ("ACTIVEDB_DATABASE_URL", "PGPASSWORD", "PGPASSFILE", "PYSPARK_PYTHON", "SPARK_HOME")}
    environment.setdefault("XDG_CONFIG_HOME", str(Path.home() / ".config"))     # pip's, for the executors'
    environment.setdefault("XDG_CACHE_HOME", str(Path.home() / ".cache"))       # environment
    environment.update(HOME=str(home), DB_PASSWORD=password, SPARK_LOCAL_IP="127.0.0.1",
                       SPARK_CONF_DIR=str(tmp_path / "spark-conf"))
    (tmp_path / "spark-conf").mkdir()
    _java.ensure_java(environment)
    checkpoint = tmp_path / "activedb-home" / "checkpoints" / QUERY_NAME
    staging = tmp_path / "staging"

    # One host plays all: every host's lines first, then the driver's preparation; the cluster's hosts get
    # what every host's lines exported, not the driver's.
    [run_line] = [line for where, line in commands if where == "driver" and " run " in line]
    # Every detached firing recorded in the outbox (the README's line plus --record-detached): the application's
    # detached rules only insert, which a batch would otherwise run in its own commit; batch 2 below is a kill after
    # a task's commit while its recorded firings wait.
    recording = run_line + " --record-detached"
    [master_line] = [line for where, line in commands if where == "cluster" and ".master.Master" in line]
    [worker_line] = [line for where, line in commands if where == "cluster" and ".worker.Worker" in line]
    assert commands[-1] == ("driver", run_line)
    every = Script(home, environment, names)
    for line in [line for where, line in commands if where == "every"]:
        every.run(line)
    script = Script(driver, {**every.environment, "ACTIVEDB_HOME": str(tmp_path / "activedb-home")}, names)
    hosts = Script(workers, dict(every.environment), names)

    def start_the_reference() -> subprocess.Popen:
        """The reference, on local[2], as soon as the events and the application file are there: it needs neither
        the executors' archive nor the cluster, so its JVM runs while pip installs and packs the executors'
        environment, not while the master, the workers and the driver start theirs (its own database and home;
        the password from the same file)."""
        shutil.copytree(driver / "events", local / "events")
        shutil.copy(driver / "hygiene.py", local / "hygiene.py")
        exported = sa.make_url(script.environment["ACTIVEDB_DATABASE_URL"])
        assert exported.password is None and exported.database == sa.make_url(cluster_url).database
        local_environment = {**script.environment, "ACTIVEDB_HOME": str(tmp_path / "local-home"),
                             "ACTIVEDB_DATABASE_URL": exported.set(database=sa.make_url(local_url).database)
                             .render_as_string(hide_password=False)}
        with open(tmp_path / "local.out", "wb") as output:
            return subprocess.Popen(_local_command(script.line(recording)), cwd=local, env=local_environment,
                                    stdout=output, stderr=subprocess.STDOUT, start_new_session=True)

    reference = run = None
    try:
        for where, line in commands:
            if where == "driver" and line != run_line:
                script.run(line)
                if reference is None and (driver / "hygiene.py").exists():
                    reference = start_the_reference()
                    mark("the reference run on local[2] started")
            elif where == "cluster" and line not in (master_line, worker_line):
                hosts.run(line)
        assert reference is not None, "the README's driver lines no longer write hygiene.py: update the test"
        mark("the README's preparation lines ran")
        events = sorted((driver / "events").iterdir())
        assert len(events) >= 4, events
        staging.mkdir()
        for path in events:
            path.rename(staging / path.name)

        with standalone_cluster(tmp_path / "cluster", hosts.line(master_line),
                                lambda url: hosts.line(worker_line).replace("spark://master.example.com:7077", url),
                                cwd=workers, environment=hosts.environment) as cluster:
            # The driver starts as soon as the master runs, while the workers start (as on hosts of their own).
            line = script.line(recording).replace("spark://master.example.com:7077", cluster.master_url)
            with open(tmp_path / "run.out", "wb") as output:
                run = subprocess.Popen(["bash", "-c", line], cwd=driver, env=script.environment, stdout=output,
                                       stderr=subprocess.STDOUT, start_new_session=True)
            cluster.registered()
            mark("the master and the workers run, the driver started")

            def seen() -> str:
                return activedb.mask_secrets(
                    "--- timeline:\n" + "\n".join(timeline) + f"\n--- run:\n{tail(tmp_path / 'run.out')}\n"
                    f"--- spark log:\n{tail(tmp_path / 'activedb-home' / 'logs' / 'spark.log')}\n{cluster.describe()}")

            def committed(batch: int) -> bool:
                if run.poll() is not None:
                    raise AssertionError(f"the run exited with {run.returncode}\n{seen()}")
                return _committed(checkpoint, batch)

            def feed(batch: int) -> None:
                (staging / events[batch].name).rename(driver / "events" / events[batch].name)

            conninfo = dict(host=host, port=port, user=user, password=password,
                            dbname=sa.make_url(cluster_url).database)

            def kill_the_executor_waiting_on(table: str, batch: int) -> tuple[int, int]:
                """Feed ``batch`` while the test holds a SHARE lock on ``table``; SIGKILL the executor whose
                Python worker's session waits on it; release the lock once both are gone.  Returns what the
                database held at the kill: the batch's ledger rows, and pending outbox records."""
                # Another executor runs the task again at once: none waits for a JVM to start.
                wait_until(lambda: len(cluster.registered_executors()) >= 2, WAIT_SECONDS,
                           "two executors registered with the driver", seen)
                with psycopg.connect(**conninfo, autocommit=True) as watcher, psycopg.connect(**conninfo) as holder:
                    wait_until(lambda: pending_firings(watcher) == 0, WAIT_SECONDS,
                               "earlier batches' detached firings", seen)
                    holder.execute(f"LOCK TABLE {table} IN SHARE MODE")
                    feed(batch)
                    waiting = wait_until(lambda: [found for _, port in _waiting_on(watcher, holder.info.backend_pid)
                                                  if (found := executor_of_connection(port)) is not None],
                                         WAIT_SECONDS, f"a task of batch {batch} waiting on the lock on {table}", seen)
                    executor, python_worker = waiting[0]
                    assert _in_flight(checkpoint) == [batch]
                    pythons.append(_python_of(python_worker))
                    held = watcher.execute("SELECT count(*) FROM activedb_ingestion_ledger WHERE batch_id = %s",
                                           (batch,)).fetchone()[0], pending_firings(watcher)
                    os.kill(executor, signal.SIGKILL)
                    wait_until(lambda: not alive(executor) and not alive(python_worker), WAIT_SECONDS,
                               f"the killed executor {executor} and its Python worker {python_worker} to be gone", seen)
                    holder.commit()
                mark(f"batch {batch}: killed executor {executor} waiting on {table}, lock released")
                return held

            pythons: list[tuple[str, list[str]]] = []      # the Python workers caught waiting
            feed(0)
            wait_until(lambda: committed(0), WAIT_SECONDS, "batch 0's commit", seen)
            mark("batch 0 committed")
            # Batch 1: killed inside a task's flush (every task waits: no partition committed), applied by
            # Spark's new attempt.
            assert kill_the_executor_waiting_on("worker_status", 1)[0] == 0
            wait_until(lambda: committed(1), WAIT_SECONDS, "batch 1's commit", seen)
            mark("batch 1 committed")
            # Batch 2: killed after a task's commit, while its detached rules wait (only they write badge_lights):
            # the new attempt finds the partition in the ledger; the dead process's outbox records are claimed.
            ledger_rows, pending = kill_the_executor_waiting_on("badge_lights", 2)
            assert ledger_rows > 0 and pending > 0
            for batch in range(2, len(events)):
                if batch > 2:
                    feed(batch)
                wait_until(lambda: committed(batch), WAIT_SECONDS, f"batch {batch}'s commit", seen)
                mark(f"batch {batch} committed")
            with psycopg.connect(**conninfo, autocommit=True) as watcher:
                wait_until(lambda: pending_firings(watcher) == 0, WAIT_SECONDS, "the detached firings to be done",
                           seen)
            os.killpg(run.pid, signal.SIGINT)                  # Ctrl-C: lets the running batch finish
            assert run.wait(timeout=WAIT_SECONDS) == 0, seen()
            assert "stopped cleanly" in tail(tmp_path / "run.out"), seen()
            mark("the run stopped (SIGINT)")
            executors = {log.parent: log.read_text(errors="replace") for log in cluster.executor_logs()}
        assert reference.wait(timeout=WAIT_SECONDS) == 0, tail(tmp_path / "local.out")
        mark("the cluster stopped, the local run ended")
    finally:
        for process in (run, reference):
            if process is not None and process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=60)

    assert len(executors) >= 4, "the master started an executor in place of each killed one"
    # Every executor that ran a task fetched the application file the driver sent (and the tasks load that copy).
    ran = [directory for directory, log in executors.items() if "Running task" in log]
    assert all(re.search(r"Fetching spark://\S+/files/hygiene\.py", executors[directory]) for directory in ran)
    # The Python workers caught ran from the archive Spark unpacked in their executor's directory: the compiled
    # modules of activedb's dependencies they mapped are the archive's, none is the driver's environment's; and
    # every executor that ran a task unpacked it.
    driver_environment = os.path.realpath(sys.prefix) + os.sep
    for cwd, mapped in pythons:
        assert not [path for path in mapped if path.startswith(driver_environment)], mapped
        assert [path for path in mapped if path.startswith(f"{cwd}/environment/lib/")], mapped
        assert cwd in map(str, ran), (cwd, ran)
    assert all((directory / "environment" / "bin" / "python").exists() for directory in ran), ran
    expected, actual = _state(local_url), _state(cluster_url)
    for table in expected:
        assert actual[table] == expected[table], (table, set(actual[table]) ^ set(expected[table]))
    assert {batch for _, batch, *_ in actual["ledger"]} == set(range(len(events)))
    assert {status for _, status, _, _ in actual["outbox"]} == {"done"}
    assert actual["notifications"] and actual["badge_lights"] and actual["compensations"]
    mark("the tables compared")
