"""``activedb bench streams``' part 4: what the engine's kept state costs over a stream of ever new keys (the streams
design note's "State between batches").

**The workload.**  Orders, each with a number of its own that never comes again: every ``SPACING`` seconds of
event time an order is ``PLACED``; a tenth are ``CANCELLED`` and half are ``SHIPPED``, each a random delay of 1 to
``SHIP_DELAY`` seconds later — some within the query's window, some past it.  One query, the pattern of the window
tests: ``SEQ(PLACED, !CANCELLED, SHIPPED) WHERE [orderno] WITHIN 30 sec``, no rule (the engine's own cost, not the
store's).  The engine is durable: each batch saves what it changed in its transaction.

**The rows.**

* *Window state*: ``EVENTS`` ordered events in micro-batches of ``BATCH``, each its own transaction, punctuated past
  its last event.  The query with ``WITHIN`` (a released punctuation prunes each partition more than the window
  before it) against the same query without (nothing is pruned before the end: the state grows with the orders).
  In turns, ``REPEAT`` times each; the median run of each.  Beside the rate: the partitions and events the state
  keeps at the end (in memory) and the events its saved rows hold.
* *Calls per transaction*: the windowed query's events in calls of ``CALL`` events, all the calls of a run in one
  transaction (a caller that feeds small batches and commits once), at two sizes, against the same calls each in a
  transaction of its own.  A batch's end that looked at every partition changed so far in its transaction would
  cost more per event the more calls came before it: the larger size would fall behind the smaller.

``ACTIVEDB_BENCH_STREAMS_ONLY=window-state activedb bench streams`` runs this part alone (a few minutes).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import time
from typing import Any

import sqlalchemy as sa

from activedb import streams
from benchmarks._streams_model import quiet_heap, smoke_run
from benchmarks.report import BenchReport, Row

SPACING = 0.01                      # seconds of event time between two orders
SHIP_DELAY = 40.0
WINDOW = 30
EVENTS = 50_000
BATCH = 1000
CALL = 100
CALL_SIZES = (10_000, 40_000)
REPEAT = 3
SEED = 11

QUERY = """
CREATE QUERY Shipped ON orders
PATTERN SEQ(PLACED, !CANCELLED, SHIPPED)
WHERE [orderno]
{within}
RETURN SHIPPED.orderno
"""


def order_events(count: int, rng: random.Random) -> list[streams.StreamEvent]:
    """About ``count`` events of orders placed every ``SPACING`` s (module docstring), in timestamp order."""
    events: list[tuple[float, int, str]] = []
    number = 0
    while len(events) < count:
        placed = round(number * SPACING, 6)
        events.append((placed, number, "PLACED"))
        if rng.random() < 0.1:
            events.append((round(placed + rng.uniform(0.5, SHIP_DELAY), 6), number, "CANCELLED"))
        if rng.random() < 0.5:
            events.append((round(placed + rng.uniform(1.0, SHIP_DELAY), 6), number, "SHIPPED"))
        number += 1
    events.sort()
    return [streams.StreamEvent(kind, ts, {"orderno": number}) for ts, number, kind in events[:count]]


def _engine(database, name: str, windowed: bool) -> streams.StreamEngine:
    engine = streams.StreamEngine(database, name=name, keep_outputs=False, record_dead_letters=False)
    engine.create_stream("orders", types=("PLACED", "CANCELLED", "SHIPPED"), attributes=("orderno",))
    engine.define(QUERY.format(within=f"WITHIN {WINDOW} sec" if windowed else ""))
    engine.reset_state()
    return engine


def _saved_events(database, name: str) -> int:
    """The events the saved partition rows of engine ``name`` hold (each once per row)."""
    with database.engine.connect() as connection:
        values = connection.execute(sa.text("SELECT value FROM activedb_stream_state WHERE engine = :name AND "
                                            "kind = 'partitions'"), {"name": name}).scalars().all()
    return sum(len((value if isinstance(value, dict) else json.loads(value))["events"]["ts"]) for value in values)


def run_once(database, events: list[streams.StreamEvent], *, windowed: bool, size: int,
             one_transaction: bool) -> dict[str, Any]:
    """``events`` in calls of ``size`` events (each in a transaction of its own, or all in one), each punctuated past
    its last event; the rate, and what the state keeps at the end (before ``END_OF_STREAM``)."""
    name = "bench-window" if windowed else "bench-unwindowed"
    engine = _engine(database, name, windowed)
    chunks = [events[start:start + size] for start in range(0, len(events), size)]
    with quiet_heap():
        started, cpu = time.perf_counter(), time.process_time()
        if one_transaction:
            with database.transaction(name="bench:streams-window") as tx:
                for chunk in chunks:
                    engine.process(tx, chunk, punctuation=chunk[-1].ts + 1e-6)
        else:
            for chunk in chunks:
                with database.transaction(name="bench:streams-window") as tx:
                    engine.process(tx, chunk, punctuation=chunk[-1].ts + 1e-6)
        seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    statistics = engine.statistics()
    assert statistics.events_processed == len(events), "every event must be processed"
    kept = engine.partitions("Shipped")
    point = {"events_per_s": len(events) / seconds, "seconds": round(seconds, 3),
             "cpu_us_per_event": round(cpu / len(events) * 1e6, 1), "calls": len(chunks),
             "state_us_per_event": round(statistics.phase_seconds.get("state", 0.0) / len(events) * 1e6, 1),
             "outputs": statistics.outputs, "partitions_kept": len(kept),
             "events_kept": sum(state.size() for state in kept.values()),
             "saved_events": _saved_events(database, name),
             # (the engine's count of what its batches' ends looked at; absent from engines before it)
             "partitions_visited": getattr(statistics, "partitions_visited", None)}
    engine.reset_state()
    return point


def _median(runs: list[dict[str, Any]]) -> dict[str, Any]:
    ordered = sorted(runs, key=lambda point: point["events_per_s"])
    middle = dict(ordered[(len(ordered) - 1) // 2])
    middle["runs"] = [round(point["events_per_s"], 1) for point in runs]
    return middle


def run_window_state(database, quick: bool) -> dict[str, Any]:
    """Both rows' runs (module docstring)."""
    rng = random.Random(SEED)
    count = 2000 if quick else EVENTS
    repeat = 1 if quick else REPEAT
    call_sizes = (500, 2000) if quick else CALL_SIZES
    events = order_events(count, rng)
    run_once(database, events[:500], windowed=True, size=BATCH, one_transaction=False)       # (warm-up)
    runs: dict[str, list[dict[str, Any]]] = {"windowed": [], "unwindowed": []}
    for _ in range(repeat):
        for windowed in (True, False):
            runs["windowed" if windowed else "unwindowed"].append(
                run_once(database, events, windowed=windowed, size=BATCH, one_transaction=False))
    results: dict[str, Any] = {"events": count, "batch": BATCH, "window_seconds": WINDOW,
                               **{name: _median(found) for name, found in runs.items()}, "calls": []}
    for size in call_sizes:
        sized = order_events(size, random.Random(SEED))
        together, apart = [], []
        for _ in range(repeat):
            together.append(run_once(database, sized, windowed=True, size=CALL, one_transaction=True))
            apart.append(run_once(database, sized, windowed=True, size=CALL, one_transaction=False))
        results["calls"].append({"events": size, "call": CALL, "one_transaction": _median(together),
                                 "a_transaction_each": _median(apart)})
    return results


def window_rows(report: BenchReport, results: dict[str, Any]) -> None:
    windowed, unwindowed = results["windowed"], results["unwindowed"]
    report.add(Row(
        name=f"window state: {results['events']:,} order events, a punctuated transaction per {results['batch']:,}, "
             f"WITHIN {results['window_seconds']} s", value=round(windowed["events_per_s"], 1), unit="events/s",
        baseline_name="the same query without WITHIN (nothing pruned before the end)",
        baseline=round(unwindowed["events_per_s"], 1), ratio=round(windowed["events_per_s"] / unwindowed["events_per_s"], 3),
        extra={"windowed": windowed, "unwindowed": unwindowed}))
    for entry in results["calls"]:
        together, apart = entry["one_transaction"], entry["a_transaction_each"]
        report.add(Row(
            name=f"calls per transaction: {entry['events']:,} order events in calls of {entry['call']}, one "
                 f"transaction", value=round(together["events_per_s"], 1), unit="events/s",
            baseline_name="the same calls, a transaction each", baseline=round(apart["events_per_s"], 1),
            ratio=round(together["events_per_s"] / apart["events_per_s"], 3),
            extra={"one_transaction": together, "a_transaction_each": apart}))


def run_alone(quick: bool = False) -> BenchReport:
    """Only this part (``ACTIVEDB_BENCH_STREAMS_ONLY=window-state activedb bench streams``)."""
    from benchmarks._setup import connect
    from benchmarks._streams_report import write_alone

    report = BenchReport("stream transactions: the kept state under punctuations (activedb bench streams)")
    database = connect()
    try:
        load = round(os.getloadavg()[0], 2)
        with smoke_run() if quick else contextlib.nullcontext():
            results = run_window_state(database, quick)
    finally:
        database.close()
    window_rows(report, results)
    write_alone(report, "streams-window-state.json", {"window_state": results}, load)
    return report
