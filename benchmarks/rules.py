"""``activedb bench rules``: the cost of the rule machinery, as rule firings per second against the same
Python function called directly in one plain top-level transaction, same run.

1. Immediate rules executed inline.  2. Immediate rules on threads.  3. Deferred rules (both executions).
4. Where the time of an inline immediate firing goes, by phase (one more run under ``cProfile``).
5. A per-key counter upsert per event vs a PL/pgSQL row trigger fed by ``COPY`` and vs ``executemany`` — as a
   Python rule fired per event (``tx.emit``); as the same plain rule given its events a batch at a time, the batch
   lowered to one batch of state transactions at commit (``batch.lower`` + ``batch.apply_lowered``: what the
   ingestion core's rule path runs, learned from the rule's source); and as a declared rule lowered the same way
   (``@batch.declared``); goal >= 1.0 of
   each peer at 1,000 and 10,000 events per batch.  Beside them, the ceiling of any client-side path: the batch as
   one set-based upsert with no per-event work in Python (``INSERT ... SELECT ... FROM unnest(keys) GROUP BY``),
   against the trigger — what a rule lowered all the way to SQL could reach at best.  Each path's CPU per event is in the rows' extra — this
   process's and the PostgreSQL server's processes' (``benchmarks._profile.server_cpu_seconds``; None for a server
   on another machine) — with ``cpu_ratio``, the peer's total over the path's: figures the machine's load does not
   change, beside the rates it does.

Figures are medians of alternating runs, each after an untimed ``gc.collect()`` (not in ``--quick``, a smoke run:
a full collection walks the calling process's whole heap, a test session's millions of objects).  Details: the
bench design note.
"""

from __future__ import annotations

import cProfile
import gc
import pstats
import statistics
import time
from typing import Callable

from activedb import Coupling, Event, batch
from activedb.progress import Progress
from benchmarks.report import BenchReport, Row
from benchmarks._profile import (add_frame_ends, cumulative, database_wait, phase_seconds, scaled,
                                 server_cpu_seconds)
from benchmarks._setup import connect

IMMEDIATE_EVENT = "bench_rule_immediate"
DEFERRED_EVENT = "bench_rule_deferred"
COUNTER_EVENT = "bench_rule_counter"
DECLARED_COUNTER_EVENT = "bench_rule_counter_declared"


def _no_collection() -> None:
    """What a ``--quick`` run does instead of ``gc.collect()`` before a timed run: nothing."""


def bump(tx, event: Event) -> None:
    """The rule action, also the function called directly by the baseline."""
    tx.write("bench_rows", event.key, a=event.payload["n"], b="rule")


def count_event(tx, event: Event) -> None:
    """The counter rule's action: the per-key counter upsert, read then write."""
    row = tx.read("bench_counters", event.key)
    tx.write("bench_counters", event.key, n=1 if row is None else row["n"] + 1)


def _one_more(own: dict | None) -> dict:
    return {"n": 1 if own is None else own["n"] + 1}


@batch.declared
def count_declared(event, ops) -> None:
    """The counter rule as a declared rule: the key's row of bench_counters written with n + 1."""
    ops.write("bench_counters", event.key, _one_more)


def _declare(database) -> None:
    database.rule(on=database.stream(IMMEDIATE_EVENT), coupling=Coupling.IMMEDIATE, name="bench_immediate")(bump)
    database.rule(on=database.stream(DEFERRED_EVENT), coupling=Coupling.DEFERRED, name="bench_deferred")(bump)
    database.rule(on=database.stream(COUNTER_EVENT), coupling=Coupling.IMMEDIATE, name="bench_counter")(count_event)
    database.rule(on=database.stream(DECLARED_COUNTER_EVENT), name="bench_counter_declared")(count_declared)


def _fire(database, event_type: str, count: int) -> float:
    """Seconds for one top-level transaction emitting ``count`` events (one firing each)."""
    start = time.perf_counter()
    with database.transaction(name="bench:rules") as tx:
        for number in range(count):
            tx.emit(event_type, key=number, payload={"n": number})
    return time.perf_counter() - start


def _direct(database, event_type: str, count: int) -> float:
    """Seconds for one top-level transaction calling the action directly ``count`` times."""
    start = time.perf_counter()
    with database.transaction(name="bench:direct") as tx:
        for number in range(count):
            bump(tx, Event("stream", event_type, key=number, payload={"n": number}, transaction=tx.id))
    return time.perf_counter() - start


def _compare(database, report: BenchReport, label: str, event_type: str, count: int, repeat: int,
             execution: str, settle: Callable[[], object] = gc.collect) -> None:
    _fire(database, event_type, max(1, count // 10))      # warm up: statements, threads, reflection
    _direct(database, event_type, max(1, count // 10))
    rule_times, direct_times = [], []
    for _ in range(repeat):
        settle()
        rule_times.append(_fire(database, event_type, count))
        settle()
        direct_times.append(_direct(database, event_type, count))
    # Each rule run and the direct run right after it, as a pair: their ratio shows the run's noise.
    pairs = [round(direct / rule, 3) for rule, direct in zip(rule_times, direct_times)]
    rule_rate = count / statistics.median(rule_times)
    direct_rate = count / statistics.median(direct_times)
    overhead_us = (1 / rule_rate - 1 / direct_rate) * 1e6
    # The goals: immediate inline 0.9 of calling the action (issue 54's), the others 0.6 (cheap subtransactions').
    goal = 0.9 if label.startswith("immediate") and execution == "inline" else 0.6
    report.add(Row(
        name=label, value=rule_rate, unit="firings/s",
        baseline_name="direct calls, one plain transaction", baseline=direct_rate,
        ratio=rule_rate / direct_rate, target=f">= {goal} of direct calls",
        met=rule_rate / direct_rate >= goal, goal=goal,
        extra={"rule_execution": execution, "firings_per_transaction": count, "repeat": repeat,
               "machinery_us_per_firing": round(overhead_us, 1), "ratio_per_pair": pairs},
    ))
    if repeat > 1:
        report.notes.append(f"{label}: ratio of each rule run to the direct run after it {min(pairs)}–{max(pairs)} "
                            f"(the row: the ratio of the medians)")


#: The phases of an inline immediate firing: (phase, [(file suffix, function)] whose cumulative
#: profiled time it is, [phases whose time is inside those functions and is subtracted]).
_PHASES = (
    ("match", [("activedb/rules/_registry.py", "matching")], []),
    ("condition", [("activedb/rules/_model.py", "condition")], []),
    # (Each phase of a frame's or node's path and of a savepoint's of the lean run, txn README "The lean run".)
    ("lock", [("activedb/txn/_locking.py", "acquire"), ("activedb/txn/_lean.py", "_lock")], []),
    ("write", [("activedb/txn/_writes.py", "write")], ["lock"]),  # (a savepoint: its ``_modify`` inside)
    ("child create", [("activedb/txn/_children.py", "_begin_inline"), ("activedb/txn/_lean.py", "open_savepoint")], []),
    ("flush", [("activedb/txn/_flush.py", "flush")], []),
    # Every commit's time but the flush's: the children's, and the top-level's hooks (small).
    ("child commit", [("activedb/txn/_tree.py", "commit"), ("activedb/txn/_lean.py", "end")], ["flush"]),
)
_DISPATCH = ("activedb/rules/_manager.py", "on_event")
_RUN_FIRING = ("activedb/txn/_children.py", "run_inline")     # called by the dispatch for each firing


def _phases(database, count: int, per_event_us: float) -> dict[str, float]:
    """Microseconds per event of each phase of an inline immediate firing (see the module docstring)."""
    profile = cProfile.Profile()
    profile.enable()
    _fire(database, IMMEDIATE_EVENT, count)
    profile.disable()
    stats = pstats.Stats(profile)
    raw, total = phase_seconds(stats, _PHASES)
    add_frame_ends(stats, raw)
    # What dispatch does around the firing it runs: the firing record (counters, the tree's
    # per-rule count, the Firing) and the choice of the rules (match, reported on its own).
    raw["firing record"] = (cumulative(stats, _DISPATCH) - cumulative(stats, _RUN_FIRING) - raw["match"])
    raw["rest (emit, _execute, bench loop)"] = total - sum(raw.values())
    result = scaled(raw, total, count, per_event_us, 2)
    waiting = database_wait(stats)
    result["postgresql share"] = round(waiting / total, 3) if total else 0.0
    result["python share"] = round(1 - waiting / total, 3) if total else 0.0
    return result


def _counters(database) -> dict[int, int]:
    with database.engine.connect() as connection:
        return dict(connection.exec_driver_sql("SELECT key, n FROM bench_counters").all())


def _reset_counters(database) -> None:
    with database.engine.begin() as connection:
        connection.exec_driver_sql("TRUNCATE bench_counters")


def _counter_rule(database, count: int, size: int) -> float:
    keys = max(1, count // 10)
    start = time.perf_counter()
    for first in range(0, count, size):
        batch = range(first, min(count, first + size))
        with database.transaction(name="bench:counter") as tx:
            # The batch's keys in one query, as a sink does with its PREFETCH (else one read per key).
            tx.prefetch("bench_counters", {number % keys for number in batch})
            for number in batch:
                tx.emit(COUNTER_EVENT, key=number % keys)
    return time.perf_counter() - start


def _counter_lowered(database, count: int, size: int, event_type: str = DECLARED_COUNTER_EVENT) -> float:
    """The same events for the rule of ``event_type`` (the declared rule; or the plain rule, ``COUNTER_EVENT``,
    lowered as learned), each batch lowered as the Spark sink lowers it (``batch.lower``: the one rule of the
    type, nothing else listening) and run at commit (``batch.apply_lowered``: the firing record kept)."""
    keys = max(1, count // 10)
    lowered_cache: dict = {}
    start = time.perf_counter()
    for first in range(0, count, size):
        _lowered_batch(database, event_type, range(first, min(count, first + size)), keys, lowered_cache)
    return time.perf_counter() - start


def _lowered_batch(database, event_type: str, numbers: range, keys: int, lowered_cache: dict) -> None:
    """One batch of ``_counter_lowered``: the events ``numbers`` (key: the number modulo ``keys``) in one top-level
    transaction, lowered and applied at its commit."""
    events = [{"type": event_type, "key": number % keys, "ts": float(number)} for number in numbers]
    with database.transaction(name="bench:counter-lowered") as tx:
        lowered = batch.lower(database.rules, tx, {event_type}, lowered_cache)
        if lowered is None:
            raise RuntimeError(f"the counter rule of {event_type} could not be lowered (an observer or another "
                               "rule?)")
        batch.apply_lowered(database.rules, tx, events, lowered, dead_letters=None)


def _counter_declared(database, count: int, size: int) -> float:
    return _counter_lowered(database, count, size, DECLARED_COUNTER_EVENT)


def _counter_rule_lowered(database, count: int, size: int) -> float:
    return _counter_lowered(database, count, size, COUNTER_EVENT)


def _counter_peer(database, count: int, size: int, apply_batch) -> float:
    """Seconds for ``apply_batch(cursor, keys)`` per batch of ``size`` events, one psycopg transaction each."""
    keys = max(1, count // 10)
    raw = database.engine.raw_connection()
    try:
        connection = raw.driver_connection
        start = time.perf_counter()
        for first in range(0, count, size):
            with connection.cursor() as cursor:
                apply_batch(cursor, [number % keys for number in range(first, min(count, first + size))])
            connection.commit()
        return time.perf_counter() - start
    finally:
        raw.close()


def _copy_into_trigger_table(cursor, keys: list[int]) -> None:
    with cursor.copy("COPY bench_counter_events (key) FROM STDIN") as copy:
        for key in keys:
            copy.write_row((key,))


def _executemany_upsert(cursor, keys: list[int]) -> None:
    cursor.executemany("INSERT INTO bench_counters (key, n) VALUES (%s, 1) "
                       "ON CONFLICT (key) DO UPDATE SET n = bench_counters.n + 1", [(key,) for key in keys])


def _set_based_upsert(cursor, keys: list[int]) -> None:
    """The batch as one statement: each key's events counted by PostgreSQL and added at once."""
    cursor.execute("INSERT INTO bench_counters (key, n) SELECT key, count(*) FROM unnest(%s::int[]) AS key "
                   "GROUP BY key ON CONFLICT (key) DO UPDATE SET n = bench_counters.n + EXCLUDED.n", [keys])


def _counter_set_based(database, count: int, size: int) -> float:
    return _counter_peer(database, count, size, _set_based_upsert)


def _counter_trigger(database, count: int, size: int) -> float:
    return _counter_peer(database, count, size, _copy_into_trigger_table)


def _counter_executemany(database, count: int, size: int) -> float:
    return _counter_peer(database, count, size, _executemany_upsert)


def _compare_counters(database, report: BenchReport, count: int, size: int, repeat: int,
                      settle: Callable[[], object] = gc.collect) -> None:
    timings: dict[str, list[float]] = {"rule": [], "lowered": [], "declared": [], "trigger": [],
                                       "executemany": [], "set-based": []}
    # CPU seconds of each run: this process (the client) and the PostgreSQL server's processes (None when the
    # server is not on this machine) — what each path costs whatever else the machine runs.
    client: dict[str, list[float]] = {name: [] for name in timings}
    server: dict[str, list[float | None]] = {name: [] for name in timings}
    results = {}
    for _ in range(repeat):
        for name, run_once in (("rule", _counter_rule), ("lowered", _counter_rule_lowered),
                               ("declared", _counter_declared),
                               ("trigger", _counter_trigger), ("executemany", _counter_executemany),
                               ("set-based", _counter_set_based)):
            _reset_counters(database)
            settle()
            server_before, client_before = server_cpu_seconds(database.engine), time.process_time()
            timings[name].append(run_once(database, count, size))
            client[name].append(time.process_time() - client_before)
            server_after = server_cpu_seconds(database.engine)
            server[name].append(None if server_before is None or server_after is None
                                else server_after - server_before)
            results[name] = _counters(database)
    if len({tuple(sorted(counters.items())) for counters in results.values()}) != 1:
        report.notes.append(f"counter rule, {size}/batch: the {len(results)} paths left different counters — a bug")
    rates = {name: count / statistics.median(values) for name, values in timings.items()}
    cpu = {name: _cpu_per_event(client[name], server[name], count) for name in timings}
    for path, label_of_path in (("rule", "counter upsert rule, inline"),
                                ("lowered", "counter upsert rule, its batch lowered"),
                                ("declared", "counter upsert as a declared rule, lowered")):
        for peer, label in (("trigger", "PL/pgSQL row trigger fed by COPY"),
                            ("executemany", "psycopg executemany ... ON CONFLICT")):
            ratio = rates[path] / rates[peer]
            both = cpu[path]["total"], cpu[peer]["total"]
            report.add(Row(
                name=f"{label_of_path}, {size:,}/batch vs {peer}", value=rates[path], unit="events/s",
                baseline_name=label, baseline=rates[peer], ratio=ratio,
                target=">= 1.0 of the peer", met=ratio >= 1.0, goal=1.0,
                extra={"events": count, "keys": max(1, count // 10), "events_per_batch": size, "repeat": repeat,
                       "cpu_us_per_event": cpu[path], "peer_cpu_us_per_event": cpu[peer],
                       "cpu_ratio": None if None in both else round(both[1] / both[0], 3)},
            ))
    # The ceiling: no target (it is a bound, not a path of the product) — its ratio is what lowering a rule all the
    # way to SQL could reach at best against the trigger.
    both = cpu["set-based"]["total"], cpu["trigger"]["total"]
    report.add(Row(
        name=f"counter as one set-based upsert (the ceiling), {size:,}/batch vs trigger", value=rates["set-based"],
        unit="events/s", baseline_name="PL/pgSQL row trigger fed by COPY", baseline=rates["trigger"],
        ratio=rates["set-based"] / rates["trigger"],
        extra={"events": count, "keys": max(1, count // 10), "events_per_batch": size, "repeat": repeat,
               "cpu_us_per_event": cpu["set-based"], "peer_cpu_us_per_event": cpu["trigger"],
               "cpu_ratio": None if None in both else round(both[1] / both[0], 3)},
    ))


def _cpu_per_event(client: list[float], server: list[float | None], count: int) -> dict[str, float | None]:
    """Medians over the runs of one path, in µs per event: the client's CPU, the server's (None when unknown),
    and their sum."""
    client_us = statistics.median(client) / count * 1e6
    known = [value for value in server if value is not None]
    server_us = statistics.median(known) / count * 1e6 if len(known) == len(server) else None
    client_us = round(client_us, 2)
    server_us = None if server_us is None else round(server_us, 2)
    # (the sum of the two as shown: the server's figure is read to the nanosecond, so the unrounded sum could round
    # one hundredth away from theirs)
    return {"client": client_us, "server": server_us, "total": None if server_us is None else round(client_us + server_us, 2)}


def run(quick: bool = False, progress: Progress | None = None) -> BenchReport:
    progress = progress or Progress.none()
    report = BenchReport("rule firing (activedb bench rules)")
    count = 200 if quick else 2000
    repeat = 1 if quick else 15     # (a run is 2,000 firings, ≈ 50 ms: fifteen keep the medians above a busy machine's noise)
    settle: Callable[[], object] = _no_collection if quick else gc.collect     # (the module docstring says why)
    progress.start("bench rules", total=6)
    for execution in ("inline", "threads"):
        with connect(rule_execution=execution) as database:
            _declare(database)
            with progress.step(f"immediate rules, {execution}"):
                _compare(database, report, f"immediate rules, {execution}", IMMEDIATE_EVENT, count, repeat,
                         execution, settle)
            if execution == "inline":
                with progress.step("phases of an inline immediate firing (cProfile)"):
                    per_event_us = 1e6 / report.rows[-1].value
                    phases = _phases(database, count, per_event_us)
                    report.rows[-1].extra["phases_us_per_event"] = phases
                    representation = database.transactions.subtransactions.value
                    report.rows[-1].extra["subtransactions"] = representation
                    report.notes.append(f"inline immediate firing ({representation}), µs/event by phase (profiled, "
                                        "scaled to the unprofiled time): " + ", ".join(f"{phase} {value}" for phase, value
                                                                           in phases.items()))
                with progress.step("counter upsert rule (Python, declared) vs PL/pgSQL trigger and executemany"):
                    for size in (1_000, 10_000):
                        _compare_counters(database, report, 10_000 if quick else 20_000, size,
                                          1 if quick else 3, settle)
            with progress.step(f"deferred rules, {execution}"):
                _compare(database, report, f"deferred rules, {execution}", DEFERRED_EVENT, count, repeat,
                         execution, settle)
            fired = database.rules.statistics().per_rule
            executed = sum(counter.executed for counter in fired.values())
            if executed != sum(counter.fired for counter in fired.values()):
                report.notes.append(f"{execution}: {executed} of the firings executed — check the rule log")
    report.notes.append(
        f"{count} firings per top-level transaction, the commit (flush of {count} rows to PostgreSQL) included "
        f"in both the rule figure and its baseline; median of {repeat}. ratio = firings/s / direct calls/s; "
        f"machinery_us_per_firing = 1/rate - 1/baseline")
    return report
