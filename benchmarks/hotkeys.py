"""``activedb bench hotkeys``: read-modify-write on hot keys, against plain psycopg in the same run.

Workload: ``THREADS`` threads increment ``COUNTERS`` counters (rows of ``bench_objects``), thread ``t``'s
``i``-th increment going to counter ``(t + i) % COUNTERS``: read the value, write value + 1, commit.

* **baseline** — psycopg, one connection per thread: ``SELECT value … FOR UPDATE``, ``UPDATE``, ``COMMIT``;
* **activedb, update lock** — ``db.run(fn)`` with ``tx.read(…, for_update=True)`` then ``tx.write``: an UPDATE
  lock in the lock manager, the row locked ``FOR UPDATE`` in PostgreSQL on the tree's connection, the
  flush in that transaction;
* **activedb, plain read** — ``tx.read`` then ``tx.write`` (what an application wrote before the update
  lock existed): both readers convert to WRITE and one is a deadlock victim (or, across processes, the
  later flush waits for the earlier one at its validation — the row locked ``FOR UPDATE`` there — and
  fails its check), re-run by ``db.run`` — which learns from that failure to read the table for update
  in every later run of the function (the first failures of each process are the price).

**Pairs** (``PROCESSES`` processes only): each commit increments two of ``PAIR_COUNTERS`` counters, read for update
in a random order, so that transactions deadlock — within a process (the lock manager sees the cycle at once), between two
processes' backends (PostgreSQL's detector, after its ``deadlock_timeout``), and through two processes' lock managers
and PostgreSQL's row locks (each process publishes its part of such a cycle, and one waiting read is its victim) —
against psycopg doing the same, re-run on PostgreSQL's deadlock error.

Each runs for ``seconds`` in one process, then again in ``PROCESSES`` processes (each with ``THREADS``
threads; started, then released together through their stdin), measuring commits/s, re-runs and
failures, and the commit latency's median and 99th percentile.  The counters' final sum must equal the
commits counted (checked after every run).  Figures are ratios against the baseline of the same run.

Where the time of an update-lock commit goes: one thread, no contention, ``PHASE_COMMITS`` commits under
``cProfile`` with the thread's CPU clock (waits for the server do not count), each phase's CPU per commit
scaled to the unprofiled CPU per commit measured just before, next to psycopg's CPU per commit for the same
increment — CPU is what eight threads share under the GIL, and what three processes share with the server.
"""

from __future__ import annotations

import cProfile
import json
import os
import pstats
import random
import statistics
import subprocess
import sys
import threading
import time
from typing import Any


from benchmarks._profile import phase_seconds, scaled
from benchmarks.report import BenchReport, Row

THREADS = 8
COUNTERS = 4
#: Pairs: counters each commit picks two of (with ``COUNTERS`` every commit of 24 threads would be in a cycle; with
#: these, a few in a hundred are — the workload measures how deadlocks are resolved, not how they queue).
PAIR_COUNTERS = 32
PROCESSES = 3
GOAL = 0.6              # update lock vs psycopg FOR UPDATE
PLAIN_GOAL = 0.3        # plain read-then-write re-run by db.run vs psycopg FOR UPDATE, several processes
MODES = ("psycopg", "update-lock", "plain-read")
PAIR_MODES = ("psycopg", "update-lock")
PHASE_COMMITS = 2000
#: ``--quick`` (a smoke run: every mode, every row and the no-lost-update check, figures not meant to be read):
#: seconds per run (a thread counts the commit it began before the end: every run commits) and commits profiled.
QUICK_SECONDS = 0.5
QUICK_PHASE_COMMITS = 100
#: The phases of one update-lock commit: (phase, [(file suffix, function)] whose cumulative CPU it is, [phases
#: whose time is inside those functions and is subtracted]); the rest (tree create and end, ``db.run``) is
#: what is left of the total.
_PHASES = (
    ("read for update: SQL (BEGIN + SELECT … FOR UPDATE)", [("activedb/store/_sql.py", "lock_row")], []),
    ("read for update: lock request and the rest", [("activedb/txn/_reads.py", "read")],
     ["read for update: SQL (BEGIN + SELECT … FOR UPDATE)"]),
    ("write (lock conversion, write set)", [("activedb/txn/_writes.py", "write")], []),
    ("flush: write set + log row + COMMIT (SQL)", [("activedb/store/_sql.py", "apply_write_set")], []),
    ("outbox participant: in the flush", [("activedb/outbox/_recording.py", "before_flush"),
                                          ("activedb/outbox/_recording.py", "write")], []),
    ("outbox: db.run's replay mark (and the participant, if a firing enlisted it)",
     [("activedb/outbox/_outbox.py", "mark_replayed"), ("activedb/outbox/_recording.py", "committed")], []),
    ("flush: the rest", [("activedb/txn/_flush.py", "flush")],
     ["flush: write set + log row + COMMIT (SQL)", "outbox participant: in the flush"]),
    ("lock manager at begin and commit", [("activedb/txn/_locking.py", "begin"), ("activedb/txn/_locking.py", "commit"),
                                          ("activedb/txn/_locking.py", "release_holds")], []),
)


_SELECT_FOR_UPDATE = "SELECT value FROM bench_objects WHERE id = %s FOR UPDATE"
_UPDATE = "UPDATE bench_objects SET value = %s WHERE id = %s"


def _conninfo(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


def _reset(url: str) -> None:
    import psycopg

    with psycopg.connect(_conninfo(url), autocommit=True) as connection:
        connection.execute("DELETE FROM bench_objects WHERE id <= %s", (PAIR_COUNTERS,))
        connection.execute("INSERT INTO bench_objects (id, value) SELECT n, 0 FROM generate_series(1, %s) AS n",
                           (PAIR_COUNTERS,))
        # Every run starts from the same table: without it the dead versions the runs before left behind (tens
        # of thousands of updates of four rows) are still there, and each later mode pays for the earlier ones.
        connection.execute("VACUUM bench_objects")


def _total(url: str) -> int:
    import psycopg

    with psycopg.connect(_conninfo(url), autocommit=True) as connection:
        return connection.execute("SELECT coalesce(sum(value), 0) FROM bench_objects WHERE id <= %s",
                                  (PAIR_COUNTERS,)).fetchone()[0]


def _increment_for_update(tx, key: int) -> None:
    row = tx.read("bench_objects", key, for_update=True)
    tx.write("bench_objects", key, value=row["value"] + 1)


def _increment_plain(tx, key: int) -> None:
    row = tx.read("bench_objects", key)
    tx.write("bench_objects", key, value=row["value"] + 1)


def _increment_pair(tx, keys: tuple[int, int]) -> None:
    rows = [tx.read("bench_objects", key, for_update=True) for key in keys]
    for row in rows:
        tx.write("bench_objects", row["id"], value=row["value"] + 1)


def _workers(mode: str, url: str, threads: int, seconds: float, start: threading.Event,
             pairs: bool = False) -> dict[str, Any]:
    """Run ``threads`` threads of ``mode`` for ``seconds`` once ``start`` is set; their summed figures (``pairs``:
    each commit increments two counters in a random order, module docstring)."""
    import psycopg

    import activedb
    from activedb.errors import SerializationConflict

    database = activedb.connect(url, upgrade=False) if mode != "psycopg" else None
    results: list[dict[str, Any]] = [{} for _ in range(threads)]

    def work(number: int) -> None:
        latencies, commits, attempts, failures = [], 0, 0, 0
        connection = psycopg.connect(_conninfo(url)) if mode == "psycopg" else None
        counter = [0]

        def counted(function):
            def wrapped(tx, key):
                counter[0] += 1
                return function(tx, key)
            return wrapped

        increment = counted(_increment_pair if pairs else _increment_for_update if mode == "update-lock"
                            else _increment_plain)
        choose = random.Random(f"{os.getpid()} {number}")      # (pairs: each thread its own sequence of pairs)
        start.wait()
        deadline = time.perf_counter() + seconds
        step = 0
        while time.perf_counter() < deadline:
            keys: Any = tuple(choose.sample(range(1, PAIR_COUNTERS + 1), 2)) if pairs else 1 + (number + step) % COUNTERS
            step += 1
            began = time.perf_counter()
            try:
                if connection is not None:
                    while True:
                        attempts += 1
                        try:
                            with connection.transaction():
                                for key in keys if pairs else (keys,):
                                    value = connection.execute(_SELECT_FOR_UPDATE, (key,)).fetchone()[0]
                                    connection.execute(_UPDATE, (value + 1, key))
                            break
                        except psycopg.errors.DeadlockDetected:
                            continue        # (pairs: PostgreSQL's victim, re-run as db.run re-runs its own)
                else:
                    database.run(increment, keys, retries=20)
            except (activedb.DeadlockDetected, SerializationConflict, activedb.TransactionAborted):
                failures += 1
                continue
            commits += 1
            latencies.append(time.perf_counter() - began)
        if connection is not None:
            connection.close()
        results[number] = {"commits": commits, "attempts": attempts + counter[0], "failures": failures,
                           "latencies": latencies}

    workers = [threading.Thread(target=work, args=(number,)) for number in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    if database is not None:
        database.close()
    latencies = [latency for result in results for latency in result["latencies"]]
    return {"commits": sum(result["commits"] for result in results),
            "attempts": sum(result["attempts"] for result in results),
            "failures": sum(result["failures"] for result in results),
            "latencies": latencies}


def _in_processes(mode: str, url: str, processes: int, threads: int, seconds: float,
                  pairs: bool = False) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))}
    children = [subprocess.Popen([sys.executable, "-m", "benchmarks.hotkeys", mode, str(threads), str(seconds),
                                  "pairs" if pairs else "single"],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                 env={**env, "ACTIVEDB_BENCH_URL": url}) for _ in range(processes)]
    try:
        for child in children:                 # every child connected and its threads are waiting
            if child.stdout.readline().strip() != "ready":
                raise RuntimeError(f"a hotkeys benchmark worker did not start ({mode})")
        for child in children:
            child.stdin.write("go\n")
            child.stdin.flush()
        reports = [json.loads(child.stdout.readline()) for child in children]
    finally:
        for child in children:
            child.wait(timeout=seconds + 120)
    return {"commits": sum(report["commits"] for report in reports),
            "attempts": sum(report["attempts"] for report in reports),
            "failures": sum(report["failures"] for report in reports),
            "latencies": [latency for report in reports for latency in report["latencies"]]}


def _child(mode: str, threads: int, seconds: float, pairs: bool) -> None:
    """A worker process: connect, say ``ready``, wait for ``go`` on stdin, run, print the figures."""
    url = os.environ["ACTIVEDB_BENCH_URL"]
    start = threading.Event()
    outcome: dict[str, Any] = {}
    runner = threading.Thread(target=lambda: outcome.update(_workers(mode, url, threads, seconds, start, pairs)))
    runner.start()
    print("ready", flush=True)
    sys.stdin.readline()
    start.set()
    runner.join()
    print(json.dumps(outcome), flush=True)


def _cpu_per_commit(commit, count: int) -> float:
    """Microseconds of this thread's CPU per ``commit()`` call, over ``count`` calls."""
    began = time.thread_time()
    for step in range(count):
        commit(step)
    return (time.thread_time() - began) / count * 1e6


def _phases(url: str, count: int) -> dict[str, float]:
    """CPU per update-lock commit by phase, and psycopg's CPU per commit, one thread (module docstring)."""
    import psycopg

    import activedb

    _reset(url)
    database = activedb.connect(url, upgrade=False)
    connection = psycopg.connect(_conninfo(url))

    def ours(step: int) -> None:
        database.run(_increment_for_update, 1 + step % COUNTERS)

    def theirs(step: int) -> None:
        with connection.transaction():
            key = 1 + step % COUNTERS
            value = connection.execute(_SELECT_FOR_UPDATE, (key,)).fetchone()[0]
            connection.execute(_UPDATE, (value + 1, key))

    try:
        _cpu_per_commit(ours, count // 10)                      # warm up: statements, connections
        _cpu_per_commit(theirs, count // 10)
        psycopg_us = _cpu_per_commit(theirs, count)
        activedb_us = _cpu_per_commit(ours, count)
        profile = cProfile.Profile(time.thread_time)
        profile.enable()
        _cpu_per_commit(ours, count)
        profile.disable()
    finally:
        connection.close()
        database.close()
    stats = pstats.Stats(profile)
    raw, total = phase_seconds(stats, _PHASES)
    raw["rest (tree create and end, db.run)"] = total - sum(raw.values())
    result = scaled(raw, total, count, activedb_us, 1)
    driver = sum(row[2] for (filename, _, _), row in stats.stats.items()
                 if "/psycopg/" in filename.replace("\\", "/"))
    result["psycopg share"] = round(driver / total, 3) if total else 0.0
    result["activedb cpu per commit"] = round(activedb_us, 1)
    result["psycopg cpu per commit"] = round(psycopg_us, 1)
    return result


def _measure(mode: str, url: str, processes: int, seconds: float, pairs: bool = False) -> dict[str, Any]:
    _reset(url)
    if processes == 1:
        start = threading.Event()
        start.set()
        figures = _workers(mode, url, THREADS, seconds, start, pairs)
    else:
        figures = _in_processes(mode, url, processes, THREADS, seconds, pairs)
    total, increments = _total(url), figures["commits"] * (2 if pairs else 1)
    if total != increments:
        raise AssertionError(f"{mode}: the counters sum to {total} but {increments} increments committed")
    latencies = sorted(figures["latencies"]) or [0.0]
    return {"rate": figures["commits"] / seconds, "commits": figures["commits"],
            "reruns": figures["attempts"] - figures["commits"] - figures["failures"], "failures": figures["failures"],
            "p50_ms": round(statistics.median(latencies) * 1000, 2),
            "p99_ms": round(latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1000, 2)}


def run(quick: bool = False) -> BenchReport:
    from benchmarks._setup import connect as bench_connect

    seconds = QUICK_SECONDS if quick else 8.0
    report = BenchReport("Hot keys: read-modify-write (activedb bench hotkeys)")
    database = bench_connect()
    url = database.url.render_as_string(hide_password=False)
    database.close()
    for processes in (1, PROCESSES):
        where = "one process" if processes == 1 else f"{processes} processes"
        measured = {mode: _measure(mode, url, processes, seconds) for mode in MODES}
        baseline = measured["psycopg"]
        for mode in MODES[1:]:
            figures = measured[mode]
            ratio = figures["rate"] / baseline["rate"] if baseline["rate"] else 0.0
            report.add(Row(
                name=f"{THREADS} threads x {COUNTERS} counters, {where}: activedb {mode} vs psycopg FOR UPDATE",
                value=figures["rate"], unit="commits/s", baseline_name="psycopg SELECT ... FOR UPDATE + UPDATE",
                baseline=baseline["rate"], ratio=ratio,
                target=(f">= {GOAL} of psycopg" if mode == "update-lock"
                        else f">= {PLAIN_GOAL} of psycopg" if processes > 1 else None),
                met=(ratio >= GOAL if mode == "update-lock" else ratio >= PLAIN_GOAL if processes > 1 else None),
                goal=GOAL if mode == "update-lock" else PLAIN_GOAL if processes > 1 else None,
                extra={**{key: value for key, value in figures.items() if key != "rate"},
                       "baseline_p50_ms": baseline["p50_ms"], "baseline_p99_ms": baseline["p99_ms"]}))
    measured = {mode: _measure(mode, url, PROCESSES, seconds, pairs=True) for mode in PAIR_MODES}
    baseline, figures = measured["psycopg"], measured["update-lock"]
    report.add(Row(
        name=f"{THREADS} threads x {PAIR_COUNTERS} counters, {PROCESSES} processes, pairs in a random order: activedb "
             f"update-lock vs psycopg FOR UPDATE",
        value=figures["rate"], unit="commits/s", baseline_name="psycopg, re-run on PostgreSQL's deadlock error",
        baseline=baseline["rate"], ratio=figures["rate"] / baseline["rate"] if baseline["rate"] else 0.0,
        extra={**{key: value for key, value in figures.items() if key != "rate"},
               "baseline_reruns": baseline["reruns"], "baseline_p50_ms": baseline["p50_ms"],
               "baseline_p99_ms": baseline["p99_ms"]}))
    phases = _phases(url, QUICK_PHASE_COMMITS if quick else PHASE_COMMITS)
    report.rows[0].extra["phases_cpu_us_per_commit"] = phases
    report.notes.append("update-lock commit, one thread, CPU µs per commit by phase (profiled, scaled to the "
                        "unprofiled CPU): " + ", ".join(f"{phase} {value}" for phase, value in phases.items()))
    report.notes.append(f"{seconds:g} s per run; threads per process {THREADS}; counters {COUNTERS}; "
                        f"reruns = attempts db.run made beyond the first (deadlock victims, conflicts); the "
                        f"counters' final sum equals the commits counted in every run (pairs: twice the commits)")
    return report


if __name__ == "__main__":    # a worker process of the multi-process runs
    _child(sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4] == "pairs")
