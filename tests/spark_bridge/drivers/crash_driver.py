"""Kill a streaming driver with SIGKILL mid-stream and restart it from its checkpoint.

Two halves:

* **the driver** (``python -m tests.spark_bridge.drivers.crash_driver ...``): a file-source
  stream (JSON lines, one file per micro-batch) through :func:`spark_bridge.get_spark`
  into :class:`~benchmarks.plain_write.PlainWriteSink`. It appends one line per step
  to an event log (``started``, ``batch <id> <rows> <first key>``, ``written <id>``,
  ``committed <id>``, ``skipped <id>``, ``finished``), flushed and fsynced, so the log
  survives the kill. With ``--hold PHASE:BATCH`` it writes ``holding PHASE <id>`` and
  blocks forever when batch ``BATCH`` reaches ``PHASE``: ``arrow`` (rows fetched,
  nothing written), ``written`` (rows and ledger row written, transaction not yet
  committed) or ``committed`` (transaction committed, Spark's commit log not yet
  written);
* **the parent's helpers**: :func:`start_driver`, :func:`wait_for_line` (polls the log
  for observable state with a hard timeout), :func:`kill_driver` (SIGKILL to the whole
  process group: the Python driver and its JVM die together, like a crashed machine)
  and :func:`read_log`.

Used by ``tests/spark_bridge/test_crash_restart.py``; the engine's crash tests can reuse
the parent half with their own driver.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

__all__ = ["HOLD_PHASES", "kill_driver", "read_log", "start_driver", "wait_for_line"]

HOLD_PHASES = ("arrow", "written", "committed")
SCHEMA = "type STRING, key STRING, ts TIMESTAMP, room INT"


# --- driver side --------------------------------------------------------------------------


class _EventLog:
    """Append-only, fsynced log lines. Thread-safety: ``self._mutex`` protects the file."""

    def __init__(self, path: Path) -> None:
        self._mutex = threading.Lock()
        self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - lives as long as the process

    def write(self, line: str) -> None:
        with self._mutex:
            self._file.write(f"{time.time():.6f} {line}\n")
            self._file.flush()
            os.fsync(self._file.fileno())


def start_log(
    parser: argparse.ArgumentParser, options: argparse.Namespace, phases: Sequence[str]
) -> tuple[_EventLog, str | None, int | None]:
    """A driver's start: check ``--hold PHASE:BATCH`` against ``phases``, open the ``--log`` and write
    ``started pid=...``; return the log, the phase and the batch to hold at (None, None: none)."""
    hold_phase, hold_batch = None, None
    if options.hold:
        hold_phase, _, batch_text = options.hold.partition(":")
        if hold_phase not in phases:
            parser.error(f"--hold phase must be one of {tuple(phases)}")
        hold_batch = int(batch_text)
    log = _EventLog(options.log)
    log.write(f"started pid={os.getpid()}")
    return log, hold_phase, hold_batch


def _driver(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="crash_driver", description=__doc__)
    parser.add_argument("--source", required=True, type=Path)
    parser.add_argument("--checkpoint", required=True, type=Path)
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--table", required=True)
    parser.add_argument("--ledger", required=True)
    parser.add_argument("--log", required=True, type=Path)
    parser.add_argument("--hold", default=None, help="PHASE:BATCH, PHASE one of " + ", ".join(HOLD_PHASES))
    parser.add_argument("--fast-checkpoints", choices=("on", "off"), default="on")
    options = parser.parse_args(argv)

    log, hold_phase, hold_batch = start_log(parser, options, HOLD_PHASES)

    def maybe_hold(phase: str, batch_id: int) -> None:
        if phase == hold_phase and batch_id == hold_batch:
            log.write(f"holding {phase} {batch_id}")
            threading.Event().wait()  # until SIGKILL

    from benchmarks.plain_write import PlainWriteSink
    from spark_bridge.session import get_spark

    def on_phase(phase: str, batch_id: int) -> None:
        log.write(f"{phase} {batch_id}")
        maybe_hold(phase, batch_id)

    sink = PlainWriteSink(
        options.dsn, options.table, ledger_table=options.ledger, ledger_count_column="row_count", on_phase=on_phase
    )

    def handle(batch_df, batch_id):
        table = batch_df.toArrow()
        first_key = table.column("key")[0].as_py() if table.num_rows else "-"
        query_id = batch_df.sparkSession.sparkContext.getLocalProperty("sql.streaming.queryId")
        log.write(f"batch {batch_id} {table.num_rows} {first_key} {query_id}")
        maybe_hold("arrow", batch_id)
        sink.write_batch(table, batch_id, query_id)

    spark = get_spark("crash-driver", fast_checkpoints=options.fast_checkpoints == "on")
    log.write("spark-ready")
    query = (
        spark.readStream.schema(SCHEMA)
        .option("maxFilesPerTrigger", 1)
        .json(str(options.source))
        .writeStream.foreachBatch(handle)
        .option("checkpointLocation", str(options.checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    sink.close()
    log.write("finished")
    spark.stop()
    return 0


# --- parent side --------------------------------------------------------------------------


def start_driver(
    *,
    source: Path,
    checkpoint: Path,
    dsn: str,
    table: str,
    ledger: str,
    log: Path,
    hold: str | None = None,
    fast_checkpoints: bool = True,
    output: Path | None = None,
) -> subprocess.Popen:
    """Start the driver in its own process group (so :func:`kill_driver` gets the JVM too)."""
    command = [
        sys.executable, "-m", "tests.spark_bridge.drivers.crash_driver",
        "--source", os.fspath(source), "--checkpoint", os.fspath(checkpoint), "--dsn", dsn,
        "--table", table, "--ledger", ledger, "--log", os.fspath(log),
        "--fast-checkpoints", "on" if fast_checkpoints else "off",
    ]
    return spawn_driver(command, hold, output)


def spawn_driver(command: list[str], hold: str | None, output: Path | None) -> subprocess.Popen:
    """Start ``command`` (plus ``--hold hold``) in its own process group, its output appended to ``output``
    (or dropped), so that :func:`kill_driver` gets the JVM too."""
    if hold:
        command = [*command, "--hold", hold]
    sink = open(output, "ab") if output is not None else subprocess.DEVNULL  # noqa: SIM115
    try:
        return subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    finally:
        if output is not None:
            sink.close()


def read_log(path: Path) -> list[tuple[float, list[str]]]:
    """``[(unix time, words), ...]`` from a driver's event log (missing file: empty)."""
    if not path.exists():
        return []
    entries = []
    for line in path.read_text(encoding="utf-8").splitlines():
        stamp, _, rest = line.partition(" ")
        entries.append((float(stamp), rest.split()))
    return entries


def wait_for_line(
    path: Path,
    predicate: Callable[[list[str]], bool],
    *,
    timeout: float,
    process: subprocess.Popen | None = None,
) -> tuple[float, list[str]]:
    """Wait until a log line satisfies ``predicate``; return it.

    Raises ``TimeoutError`` after ``timeout`` seconds, or ``RuntimeError`` as soon as
    ``process`` exits without having written such a line.
    """
    deadline = time.monotonic() + timeout
    while True:
        for entry in read_log(path):
            if predicate(entry[1]):
                return entry
        if process is not None and process.poll() is not None:
            for entry in read_log(path):  # it may have written the line just before exiting
                if predicate(entry[1]):
                    return entry
            raise RuntimeError(f"driver exited with {process.returncode} before the awaited log line")
        if time.monotonic() > deadline:
            raise TimeoutError(f"no matching line in {path} after {timeout} s")
        time.sleep(0.05)  # polling a file: this orders nothing, it only paces the check


def kill_driver(process: subprocess.Popen, *, timeout: float = 30.0) -> None:
    """SIGKILL the driver's whole process group (Python and JVM) and reap it."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait(timeout=timeout)


if __name__ == "__main__":
    sys.exit(_driver(sys.argv[1:]))
