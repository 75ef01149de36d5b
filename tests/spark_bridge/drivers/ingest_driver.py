"""A streaming driver for crash tests of :func:`spark_bridge.ingest` (rules, ledger, dead letters).

Like :mod:`tests.spark_bridge.drivers.crash_driver` (whose parent-side helpers —
:func:`~tests.spark_bridge.drivers.crash_driver.wait_for_line`,
:func:`~tests.spark_bridge.drivers.crash_driver.kill_driver`,
:func:`~tests.spark_bridge.drivers.crash_driver.read_log` — work on this driver's log too),
but the sink is the rule layer: ``python -m tests.spark_bridge.drivers.ingest_driver
--app APP --url URL --source DIR --checkpoint DIR --query-name NAME --log FILE
[--hold PHASE:BATCH] [--schema DDL] [--record-detached]``.

It connects to ``URL``, upgrades the app's ``MIGRATIONS``, registers its rules and runs
a JSON-lines file stream (one file per micro-batch, ``availableNow``) through ``ingest`` — on the
app's path (``QUERIES``/``SCHEDULER``, ``EXECUTOR``/``TRANSACTIONS``, see ``_app.py``).
The ``on_phase`` seam writes ``fetched <id>``, ``flush <id>``, ``committed <id>``,
``skipped <id>`` to the fsynced log, then ``finished``. ``--hold PHASE:BATCH`` writes
``holding PHASE <id>`` and blocks forever at that point of that batch:

* ``fetched`` — rows fetched, nothing written;
* ``flush`` — *inside the engine's flush*: the PostgreSQL transaction holds the ledger row,
  the batch's effects and its dead letters and is about to commit (the hook is the
  engine's SQLAlchemy ``commit`` event on the committing thread);
* ``committed`` — PostgreSQL committed, Spark's commit log not yet written;
* ``detached`` — from batch ``BATCH``'s flush on, every detached-family rule firing is held before it
  runs (their records are pending in the outbox): a crash between a batch's commit and its detached
  rules.  ``holding detached <id>`` is written once the batch committed.

``--record-detached``: every detached-family firing is recorded in the outbox and run by a group transaction of its
own (``OutboxOptions(inserts_in_commit=False)``), also those a lowered batch would run in its own commit.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from activedb.cli.application import app_handler
from tests.spark_bridge.drivers.crash_driver import spawn_driver, start_log

__all__ = ["HOLD_PHASES", "start_ingest_driver"]

HOLD_PHASES = ("fetched", "flush", "committed", "detached")


def _driver(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="ingest_driver", description=__doc__)
    parser.add_argument("--app", required=True)
    parser.add_argument("--url", required=True)
    parser.add_argument("--source", required=True, type=Path)
    parser.add_argument("--checkpoint", required=True, type=Path)
    parser.add_argument("--query-name", required=True)
    parser.add_argument("--log", required=True, type=Path)
    parser.add_argument("--hold", default=None, help="PHASE:BATCH, PHASE one of " + ", ".join(HOLD_PHASES))
    parser.add_argument("--schema", default=None, help="Spark DDL of the rows (default: the app's SCHEMA)")
    parser.add_argument("--record-detached", action="store_true",
                        help="record every detached-family firing in the outbox (none run in a batch's commit)")
    options = parser.parse_args(argv)

    log, hold_phase, hold_batch = start_log(parser, options, HOLD_PHASES)

    import activedb
    import spark_bridge

    loaded = spark_bridge.load_app(options.app, require_mapping=True)
    database = activedb.connect(options.url, outbox_options={"inserts_in_commit": not options.record_detached})
    if loaded.migrations is not None:
        database.upgrade_app(loaded.migrations)
    loaded.register(database)

    hold_detached = threading.Event()

    class _HoldDetached(activedb.Observer):
        def on_firing_start(self, transaction, firing) -> None:
            if hold_detached.is_set() and firing.coupling.runs_as_top_level:
                threading.Event().wait()  # until SIGKILL: the firing's record stays pending

    database.observe(_HoldDetached())

    def on_phase(phase: str, batch_id: int) -> None:
        log.write(f"{phase} {batch_id}")
        if hold_phase == "detached" and batch_id == hold_batch:
            if phase == "flush":
                hold_detached.set()
            elif phase == "committed":
                log.write(f"holding detached {batch_id}")
                threading.Event().wait()  # until SIGKILL
        if phase == hold_phase and batch_id == hold_batch:
            log.write(f"holding {phase} {batch_id}")
            threading.Event().wait()  # until SIGKILL

    spark = spark_bridge.get_spark("ingest-driver")
    log.write("spark-ready")
    frame = (spark.readStream.schema(options.schema or loaded.schema).option("maxFilesPerTrigger", 1)
             .json(str(options.source)))
    query = spark_bridge.ingest(
        database, frame, mapping=loaded.mapping, query_name=options.query_name,
        checkpoint_location=str(options.checkpoint), trigger={"availableNow": True}, on_phase=on_phase,
        handler=app_handler(loaded),     # the app's path: QUERIES/SCHEDULER, EXECUTOR/TRANSACTIONS or the rules
    )
    query.awaitTermination()
    failure = query.exception()
    database.rules.wait_idle(60)
    database.close()
    log.write("finished" if failure is None else f"failed {failure}")
    spark.stop()
    return 0 if failure is None else 1


def start_ingest_driver(
    *,
    app: str,
    url: str,
    source: Path,
    checkpoint: Path,
    query_name: str,
    log: Path,
    hold: str | None = None,
    output: Path | None = None,
    record_detached: bool = False,
) -> subprocess.Popen:
    """Start the driver in its own process group (``crash_driver.kill_driver`` gets the JVM too)."""
    command = [
        sys.executable, "-m", "tests.spark_bridge.drivers.ingest_driver", "--app", app, "--url", url,
        "--source", os.fspath(source), "--checkpoint", os.fspath(checkpoint), "--query-name", query_name,
        "--log", os.fspath(log), *(["--record-detached"] if record_detached else []),
    ]
    return spawn_driver(command, hold, output)


if __name__ == "__main__":
    sys.exit(_driver(sys.argv[1:]))
