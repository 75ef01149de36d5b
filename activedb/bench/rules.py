"""``activedb bench rules``: the cost of the rule machinery.

One rule action, ``tx.write("bench_rows", n, a=n, b="rule")``, fired once per stream
event (``tx.emit``) ``count`` times inside one top-level transaction, measured as rule
firings per second (the commit, which flushes the ``count`` rows, included).  Each
figure is compared with the **same Python function called directly** ``count`` times
inside one plain top-level transaction (same rows, same commit), measured in the same
run on the same ``Database``; the ratio (firings/s ÷ direct calls/s) is what the rule
machinery — matching, firing records, a subtransaction per firing, priority groups,
deferred queues — leaves of the plain rate.

1. immediate rules executed inline (``connect(rule_execution="inline")``): the rule's
   subtransaction runs in the emitting thread;
2. immediate rules on threads (``rule_execution="threads"``, the default): the rule's
   subtransaction is spawned on the worker pool (the emitter waits for it, and helps
   run it if no worker has started it);
3. deferred rules (both executions): firings are queued and run in one deferred cycle
   just before the top-level commit — one priority group, so on threads they run
   concurrently.

Figures are medians of ``repeat`` alternating runs (rule run, then direct run).
"""

from __future__ import annotations

import statistics
import time

from activedb import Coupling, Event
from activedb.progress import Progress
from activedb.bench.report import BenchReport, Row
from activedb.bench._setup import connect

IMMEDIATE_EVENT = "bench_rule_immediate"
DEFERRED_EVENT = "bench_rule_deferred"


def bump(tx, event: Event) -> None:
    """The rule action, also the function called directly by the baseline."""
    tx.write("bench_rows", event.key, a=event.payload["n"], b="rule")


def _declare(database) -> None:
    database.rule(on=database.stream(IMMEDIATE_EVENT), coupling=Coupling.IMMEDIATE, name="bench_immediate")(bump)
    database.rule(on=database.stream(DEFERRED_EVENT), coupling=Coupling.DEFERRED, name="bench_deferred")(bump)


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
             execution: str) -> None:
    _fire(database, event_type, max(1, count // 10))      # warm up: statements, threads, reflection
    _direct(database, event_type, max(1, count // 10))
    rule_times, direct_times = [], []
    for _ in range(repeat):
        rule_times.append(_fire(database, event_type, count))
        direct_times.append(_direct(database, event_type, count))
    rule_rate = count / statistics.median(rule_times)
    direct_rate = count / statistics.median(direct_times)
    overhead_us = (1 / rule_rate - 1 / direct_rate) * 1e6
    # The goal of the core redesign: immediate rules run inline reach half the rate of calling the action.
    goal = label.startswith("immediate") and execution == "inline"
    report.add(Row(
        name=label, value=rule_rate, unit="firings/s",
        baseline_name="direct calls, one plain transaction", baseline=direct_rate,
        ratio=rule_rate / direct_rate, target=">= 0.5 of direct calls" if goal else None,
        met=rule_rate / direct_rate >= 0.5 if goal else None,
        extra={"rule_execution": execution, "firings_per_transaction": count, "repeat": repeat,
               "machinery_us_per_firing": round(overhead_us, 1)},
    ))


def run(quick: bool = False, progress: Progress | None = None) -> BenchReport:
    progress = progress or Progress.none()
    report = BenchReport("rule firing (activedb bench rules)")
    count = 200 if quick else 2000
    repeat = 1 if quick else 5
    progress.start("bench rules", total=4)
    for execution in ("inline", "threads"):
        with connect(rule_execution=execution) as database:
            _declare(database)
            with progress.step(f"immediate rules, {execution}"):
                _compare(database, report, f"immediate rules, {execution}", IMMEDIATE_EVENT, count, repeat,
                         execution)
            with progress.step(f"deferred rules, {execution}"):
                _compare(database, report, f"deferred rules, {execution}", DEFERRED_EVENT, count, repeat,
                         execution)
            fired = database.rules.statistics().per_rule
            executed = sum(counter.executed for counter in fired.values())
            if executed != sum(counter.fired for counter in fired.values()):
                report.notes.append(f"{execution}: {executed} of the firings executed — check the rule log")
    report.notes.append(
        f"{count} firings per top-level transaction, the commit (flush of {count} rows to PostgreSQL) included "
        f"in both the rule figure and its baseline; median of {repeat}. ratio = firings/s / direct calls/s; "
        f"machinery_us_per_firing = 1/rate - 1/baseline")
    return report
