"""Instructions per event of the sink's thread, counted by valgrind's callgrind: a figure the machine's load does
not change (issue 54's measure while other work shares the cores; ``perf stat`` needs hardware counters, which a
virtual machine may lack).

``python -m benchmarks.instructions WORKLOAD [--size 1000] [--batches 2]`` runs this module twice under
``valgrind --tool=callgrind --separate-threads=yes``: once to the end of a warm-up batch (phase ``setup``), once
with ``--batches`` more batches (phase ``run``), both with ``PYTHONHASHSEED=0`` and after a setup run outside
valgrind (a database's first run of a workload creates its tables, in neither measured run); the difference of the main
thread's instruction totals over the events of those batches is the sink's own work per event (validate, the
engine, the flush's Python and driver calls; not the outbox's runner threads, not PostgreSQL).  WORKLOAD:
``eca`` (the hand-hygiene application, ``app.py``: every coupling mode), ``declared`` (its declared version,
lowered), ``counter`` (the one-rule counter upsert as a plain ``@db.rule``); ``immediate`` and ``direct``: ``bench
rules``' first row without the sink — a batch is one top-level transaction emitting ``--size`` events that each fire one
immediate rule inline, or calling the rule's function directly as many times (their ratio is the row's).
``lowered`` and ``executemany``: ``bench rules``' counter row without the sink — a batch is the plain counter rule's
``--size`` events lowered and applied at the commit of one top-level transaction (the batch of
``_counter_rule_lowered``), or its peer's ``executemany`` upsert and commit; each event of a batch has a key of its own
among ``2 × --size`` keys, as in that row at 1,000 per batch (20,000 events, 2,000 keys), and two warm-up batches insert
every key's row, so that the measured batches update them.  After the warm-up both runs collect and freeze what the
garbage collector tracks (``gc.freeze``): a full collection then
walks only what the measured batches left, not the whole process's heap, whose walk — in one run and not the other —
would shift the count by tens of thousands per event.  Neither total counts libpq's connection set-up (a
connection's authentication, ~50 million instructions: a run that opened one more than the other would differ by
~25,000 per event of 2,000): the pool is filled before and after the warm-up, and what ``PQconnectPoll`` cost is
subtracted.  The database is ``activedb.connect()``'s
(embedded, or ``ACTIVEDB_DATABASE_URL``), held open by this process across both runs so that both find the server
the same way; the application's tables are emptied first.  Run nothing else on the same database meanwhile.  Each run under valgrind takes
a minute or more (a 1k batch is about 50 times slower there).
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

WORKLOADS = ("eca", "declared", "counter", "immediate", "direct", "lowered", "executemany")
SEED = 11


def instructions_per_event(workload: str, size: int = 1_000, batches: int = 2) -> float:
    """The main thread's instructions per event of ``batches`` batches of ``size`` (module docstring).  Raises
    ``RuntimeError`` saying what is missing when valgrind is not installed or a run failed."""
    if shutil.which("valgrind") is None:
        raise RuntimeError("valgrind is not installed (Debian: apt-get install valgrind)")
    import activedb

    totals = []
    # Connected here for both runs: an embedded server then stays up, and each run reuses it the same way (one
    # that started it and one that found it running would differ by the start, not by the batches).
    keeper = activedb.connect()
    with keeper, tempfile.TemporaryDirectory(prefix="activedb-instructions-") as folder:
        # A setup run first, not measured: on a database that has not seen the workload yet, its migrations
        # (the tables, their reflection) would run in the measured setup run only, and the difference of the two
        # runs would come out smaller by their cost spread over the events.
        subprocess.run([sys.executable, "-m", "benchmarks.instructions", workload, "--size", str(size), "--batches",
                        str(batches), "--phase", "setup"], capture_output=True, text=True, check=True)
        for phase in ("setup", "run"):
            out = Path(folder) / phase
            completed = subprocess.run(
                ["valgrind", "--tool=callgrind", "--separate-threads=yes", f"--callgrind-out-file={out}.%p",
                 sys.executable, "-m", "benchmarks.instructions", workload, "--size", str(size), "--batches",
                 str(batches), "--phase", phase],
                capture_output=True, text=True, env={**os.environ, "PYTHONHASHSEED": "0"})
            if completed.returncode != 0:
                raise RuntimeError(f"the {phase} run failed under valgrind: {completed.stderr[-2000:]}")
            main = sorted(Path(folder).glob(f"{phase}.*-01"))
            if len(main) != 1:
                raise RuntimeError(f"no callgrind output of the main thread for the {phase} run in {folder}")
            totals.append(_total(main[0]))
    return (totals[1] - totals[0]) / (size * batches)


def _total(path: Path) -> int:
    """The instruction total of a callgrind output file (its ``totals:`` or ``summary:`` line) less libpq's
    connection set-up in it (``PQconnectPoll``, inclusive; the module docstring says why)."""
    for line in path.read_text().splitlines():
        if line.startswith(("totals:", "summary:")):
            total = int(line.split()[1])
            break
    else:
        raise RuntimeError(f"{path} has no totals line")
    listing = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--threshold=100", str(path)],
                             capture_output=True, text=True, check=True).stdout
    # Its lines: "count (share)  file:function [object]".
    return total - sum(int(line.split()[0].replace(",", "")) for line in listing.splitlines()
                       if ":PQconnectPoll [" in line or line.rstrip().endswith(":PQconnectPoll"))


def _run(workload: str, size: int, batches: int, phase: str) -> None:
    """Set up ``workload``, run a warm-up batch and, in phase ``run``, ``batches`` more (the measured part); the
    rules' log quiet meanwhile (rejected badge events are the workload's), as it was after."""
    from benchmarks._setup import rule_log_quiet

    rule_log_quiet(_run_workload)(workload, size, batches, phase)


def _run_workload(workload: str, size: int, batches: int, phase: str) -> None:
    if workload in ("immediate", "direct", "lowered", "executemany"):
        _run_rules(workload, size, batches, phase)
        return
    import pyarrow as pa

    import activedb
    from activedb.examples.hand_hygiene import MIGRATIONS
    from activedb.examples.hand_hygiene.app import reset_tables
    from activedb.examples.hand_hygiene.events import generate
    from activedb.ingest import RulesHandler
    from spark_bridge import EventMapping, IngestSink

    from benchmarks import MIGRATIONS as BENCH_MIGRATIONS
    from benchmarks.ingest import register_minimal, _worker_number

    database = activedb.connect()
    database.upgrade_app(MIGRATIONS)
    database.upgrade_app(BENCH_MIGRATIONS)
    prefetch: dict | None = {"worker_status": None}
    if workload == "eca":
        from activedb.examples.hand_hygiene.app import register
        register(database)
    elif workload == "declared":
        from activedb.examples.hand_hygiene.declared import register
        register(database)
        prefetch = None
    else:
        register_minimal(database)
        prefetch = {"bench_counters": _worker_number}
    reset_tables(database)
    with database.engine.begin() as connection:
        connection.exec_driver_sql("TRUNCATE bench_counters")
    events = generate(100, size * (1 + batches), SEED)
    tables = [pa.Table.from_pylist([{"type": event["type"], "worker": event["worker"], "ts": event["ts"],
                                     "room": event["room"]} for event in events[start:start + size]])
              for start in range(0, len(events), size)]
    sink = IngestSink(database, EventMapping("type", "worker", "ts", payload_columns=("room",)),
                      query_name="bench-instructions", handler=RulesHandler(prefetch))
    query_id = f"bench-instructions@{workload}-{os.getpid()}"      # (a run of the sink's source)
    try:
        _fill_pool(database.engine)
        sink.process(tables[0], 0, query_id=query_id)                 # warm-up: statements, caches, threads
        database.rules.wait_idle(600)
        _fill_pool(database.engine)
        _settle()
        if phase == "run":
            for number in range(1, 1 + batches):
                sink.process(tables[number], number, query_id=query_id)
        database.rules.wait_idle(600)
    finally:
        sink.close()
        with database.engine.begin() as connection:
            connection.exec_driver_sql("DELETE FROM activedb_ingestion_ledger WHERE query_id = %s", (query_id,))
        reset_tables(database)
        database.close()


def _run_rules(workload: str, size: int, batches: int, phase: str) -> None:
    """``_run`` for ``bench rules``' immediate inline firings (``immediate``) and their direct calls (``direct``), and
    its counter's lowered batches (``lowered``) and their ``executemany`` peer (``executemany``)."""
    from benchmarks._setup import connect
    if workload in ("lowered", "executemany"):
        _run_counter(workload, size, batches, phase)
        return
    from benchmarks.rules import IMMEDIATE_EVENT, _declare, _direct, _fire

    run = _fire if workload == "immediate" else _direct
    with connect(rule_execution="inline") as database:
        _declare(database)
        run(database, IMMEDIATE_EVENT, size)                          # warm-up: statements, caches
        _settle()
        for _ in range(batches if phase == "run" else 0):
            run(database, IMMEDIATE_EVENT, size)


def _run_counter(workload: str, size: int, batches: int, phase: str) -> None:
    """``_run_rules`` for ``lowered`` and ``executemany`` (the module docstring)."""
    from benchmarks._setup import connect
    from benchmarks.rules import COUNTER_EVENT, _declare, _executemany_upsert, _lowered_batch

    keys = 2 * size
    with connect(rule_execution="inline") as database:
        _declare(database)
        raw = database.engine.raw_connection()
        try:
            lowered_cache: dict = {}

            def one(number: int) -> None:
                numbers = range(number * size, (number + 1) * size)
                if workload == "lowered":
                    _lowered_batch(database, COUNTER_EVENT, numbers, keys, lowered_cache)
                    return
                with raw.driver_connection.cursor() as cursor:
                    _executemany_upsert(cursor, [number % keys for number in numbers])
                raw.driver_connection.commit()

            one(0)                                                      # warm-up: every key's row, statements
            one(1)
            _settle()
            for number in range(2, 2 + (batches if phase == "run" else 0)):
                one(number)
        finally:
            raw.close()


def _fill_pool(engine) -> None:
    """The pool's connections opened now, as many as it keeps (before the warm-up, so that both runs open the same
    number, and after it): one opened during the measured batches, when the sink and the outbox's runners happen to
    want more at once than before, would count its authentication — tens of thousands of instructions per event, in
    one run and not the other."""
    connections = [engine.connect() for _ in range(engine.pool.size())]
    for connection in connections:
        connection.close()


def _settle() -> None:
    """After the warm-up: the heap so far collected and frozen (the module docstring says why)."""
    gc.collect()
    gc.freeze()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.instructions", description=__doc__.split("\n\n")[0])
    parser.add_argument("workload", choices=WORKLOADS)
    parser.add_argument("--size", type=int, default=1_000, help="events per batch (default 1000)")
    parser.add_argument("--batches", type=int, default=2, help="measured batches (default 2)")
    parser.add_argument("--phase", choices=("setup", "run"), help=argparse.SUPPRESS)   # (the runs under valgrind)
    options = parser.parse_args(argv)
    if options.phase is not None:
        _run(options.workload, options.size, options.batches, options.phase)
        return
    try:
        per_event = instructions_per_event(options.workload, options.size, options.batches)
    except RuntimeError as error:
        raise SystemExit(f"error: {error}") from None
    print(f"{options.workload}: {per_event:,.0f} instructions per event on the sink's thread "
          f"({options.batches} batches of {options.size:,}, valgrind callgrind)")


if __name__ == "__main__":
    main()
