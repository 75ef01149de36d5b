"""``activedb bench ingest``: Spark → rules → PostgreSQL, end to end, vs the plain write path.

The workload is the hand-hygiene application (``activedb.examples.hand_hygiene``): badge
events from ``events.generate`` (100 workers, seed 7; about 3 % sensor glitches the rules
reject, 2 % out-of-order arrivals), written as JSON-lines files of ``S`` events each, one
file per micro-batch (``maxFilesPerTrigger=1``, ``availableNow``), ``S`` = 1k (21 batches), 10k (3) and
100k (2): after the first batch of each run (warm-up), 20k events at 1k and at 10k per batch, 100k at 100k.

For each ``S``, in the same run on the same Spark session and PostgreSQL:

1. **rules** — ``spark_bridge.ingest`` with the application's rules (``register``) and
   ``prefetch={"worker_status": None}``: per batch one top-level transaction, one
   subtransaction per event, ledger + effects + dead letters + the detached family's outbox
   records in one flush; the detached firings then run in group transactions (exactly once);
2. **plain** — the same rows written by ``PlainWriteSink`` from ``foreachBatch`` with no
   rules (``toArrow`` → ``COPY`` + ledger row in one transaction), into the 4-column table
   ``notifications`` (``worker``, ``room`` as ``message``, ``ts`` as ``at``, ``type`` as
   ``channel``: the same four values per row);
2a. **the declared version** — ``activedb.examples.hand_hygiene.declared``: the same application as one declared
   rule per badge type (``@batch.declared``, with ``ops.insert_into`` for the audit rows, alerts, badge lights,
   notifications and compensations), which the sink lowers to one batch of state transactions per micro-batch;
   its tables are compared with the peer's as the rules' are (``same_result_as_the_peer``);
2b. **the PL/pgSQL peer** — what a PostgreSQL user would write instead: the same rows, sorted by
   time, ``COPY``'d (one transaction per batch, with its ledger row) into ``hh_badge_events``, whose
   ``BEFORE INSERT`` row trigger applies the same hand-hygiene logic to the same tables (Alembic
   revision ``b0005`` of the benchmark's migrations; detached actions as inserts in the same
   transaction).  Its final tables are compared with the rule run's (generated ids aside): the
   ``same_result_as_activedb`` figure; its time per event is split as the sink's is: Spark's own part,
   ``toArrow``, and the database (the sort, ``COPY`` with its triggers, the ledger row, the commit) — the part
   that competes with the sink's validate, engine and flush;
3. **minimal rules** — ``ingest`` with one immediate rule per event, the per-key counter upsert
   (read the worker's row of ``bench_counters`` and write it back with ``n + 1``): what the bridge and
   the engine cost without the application's rules, with the engine's default
   ``rule_execution="threads"``, with ``"inline"``, and (10k and 100k; 1k in quick mode) inline on the
   scale-out path with two partitions (two Spark tasks, two engines); and the same counter as a **declared
   rule** (``@batch.declared``: ``ops.write`` of the worker's row with ``n + 1``), which the sink lowers — a
   batch whose every type fires one declared rule runs as one batch of state transactions at commit
   (``batch.lower``; ``lowered`` in the row's extra: the run's last batch was).  The plain rule only reads and
   writes its event's row, so the sink lowers it too (``activedb/batch/README.md``, "Plain rules lowered"): its
   rows measure that lowered path unless ``lowered`` says otherwise;
3b. **its two peers** — the same counters without activedb: the worker numbers ``COPY``'d into
   ``bench_counter_events``, whose ``BEFORE INSERT`` row trigger upserts ``bench_counters`` (Alembic
   revision ``b0006``), and psycopg ``executemany`` of ``INSERT … ON CONFLICT (key) DO UPDATE`` into
   ``bench_counters``; each in one transaction per batch with its ledger row.  Each rule run's counters
   are compared with the trigger's: ``same_counters_as_the_trigger``.

4. **where an event's time goes** — the declared application's lowered batch without Spark (validate, lower,
   and inside the commit lock and read, declare and execute, write, the rest of the flush; µs per event of the
   median of five unprofiled batches, the PostgreSQL share from a profiled one); and the minimal rule inline once
   more, without Spark (``IngestSink.process`` of hand-hygiene rows, 10k per batch, 1k in quick mode): µs per
   event by phase (validate, match, lock, read, write, child create, child commit, dispatch and firing record,
   flush, the rest) from a cProfile of one batch scaled to the median unprofiled one, and the share spent
   waiting for PostgreSQL against Python's.  Both take their batches as ``pyarrow`` tables, as
   ``DataFrame.toArrow()`` hands them to the sink;
5. **where a hand-hygiene ECA event's time goes** — ``app.py``'s rules at 1k per batch without Spark, and the
   PL/pgSQL peer on the same events: CPU time per event of the sink's thread, of the process's other threads (the
   outbox runners: the detached family) and of the PostgreSQL server's processes (read from ``/proc``: the server
   must run on this machine), whatever else the machine runs; the row is the Python (both threads' CPU) against
   the server's, with the goal that the first is at most 3x the second;
6. **the ECA application on the scale-out path** — at the plan's largest size (100k; 1k in ``--quick``), ``app.py``
   with ``partition_by_key=2`` (two Spark tasks, an engine each) against one task (``spark_bridge.ingest``'s sink
   on the driver), paired as the peer rows are: four rounds (one in ``--quick``) of a one-task run and a scale-out
   run adjacent in time — the first round's one-task run is the rules run of that size's round; the other rounds run
   both anew —, its tables compared with the peer's, its rows per partition read from the ledger (``NAME@RUN#pK``'s
   ``row_count``); goal at 100k: 1.6x one task on two cores.  The rounds' order is ABBA (``scale_out_order``: one
   task first, then the scale-out run first twice, then one task first again), so that each side runs first in as
   many rounds as the other and a drift of the machine over the four rounds weighs on both alike — three rounds in
   alternating order ran the one task first twice.  (Paired because one batch a side, minutes apart, spread widely
   from run to run: benchmarks/RESULTS.md.)

Events/s is steady state: rows / Spark's ``triggerExecution`` time of each batch (planning,
offset and commit logs, the sink), summed over every batch but the first of each run.  The PL/pgSQL
peer, the hand-hygiene rules and their declared version run in interleaved rounds (the rules first, then the peer and
the declared rules in alternating order: 7 rounds at 1k, where Spark's share makes the rounds spread most, 3 at
10k, one at 100k and in ``--quick``); their rows show the median rates, and the ratio is the median of the rounds'
own ratios (``ratio_per_round``): the two runs of a round are adjacent in time, so the pairing removes the drift of
the machine they share — the ratio of the two medians (``ratio_of_medians``) mixes rounds, and over nine runs at 1k
spread 0.95–1.13 where the paired median spread 1.00–1.08 (as ``bench ingest-lineage`` pairs its batches).  At 1k a
round's own ratio spreads by about ±5 % (Spark's part of both runs, 80–90 µs per event, varies that much from run
to run), against a difference of the two paths' own work of 3–5 %: seven rounds (five before) narrow the median's
spread by about a sixth (√(5/7)), for about half a minute more.  The per-event split is the median run's.
The ECA row also gives, per round, the share of the CPUs' time the hypervisor of a virtual machine took during
each of the two runs (``steal_per_round``, from ``/proc/stat``): a round whose runs lost different shares is
not a fair pair.
The time per event is split into Spark's own part (``triggerExecution`` minus the sink) and the
sink's phases (``PhaseTimings``, from ``IngestSink.recent_outcomes()``). Detached rule transactions
run on the engine's worker threads concurrently with later batches and are waited for between runs
(not inside any measured batch).  The machine's load average is in the notes: the ratios compare runs
of the same benchmark, one after the other on the same machine.

Goals: 5,000 events/s end to end for the hand-hygiene rules (detached effects included:
``events_per_second_including_start_and_detached``), at least 1.0x the PL/pgSQL peer at 1k and at
10k events per batch; the rule layer at most 3x the plain path; the one-rule counter upsert at least
1.0x its trigger and 1.0x ``executemany``.  ``--quick``: 1k events per batch, 3 batches.  The full run
takes several minutes (the 100k-event runs of the hand-hygiene rules, on one task and on two, are most of it);
``--quick`` about a minute.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa

import activedb
from activedb import Coupling
from activedb.progress import Progress
from benchmarks._setup import rule_log_quiet
from benchmarks.report import BenchReport, Row, Series, cpu_times, machine_during
from spark_bridge import write_event_files

SCHEMA = "type STRING, worker STRING, ts DOUBLE, room STRING"
WORKERS = 100
SEED = 7
GOAL_EVENTS_PER_SECOND = 5_000
MAX_RULE_COST = 3.0
PEER_GOAL = 1.0
#: events per batch -> batches (the first of each run is the warm-up); ``--quick`` runs QUICK_PLAN.
PLAN = {1_000: 21, 10_000: 3, 100_000: 2}
QUICK_PLAN = {1_000: 3}
#: Rounds of (the PL/pgSQL peer, the hand-hygiene rules), interleaved, per batch size: the rates are medians.
ROUNDS = {1_000: 7, 10_000: 3, 100_000: 1}
#: Rounds of (the hand-hygiene rules on one task, on the scale-out path), at the plan's largest size, outside
#: ``--quick`` (there ``QUICK_SCALE_OUT_ROUNDS``): the first ``ROUNDS`` of them pair the rounds' own one-task runs, the
#: rest run both anew; in the order ``scale_out_order`` gives (even: each side first in half of them).
SCALE_OUT_ROUNDS = 4
QUICK_SCALE_OUT_ROUNDS = 1
COUNTER_TRIGGER = "PL/pgSQL counter trigger (COPY)"
COUNTER_EXECUTEMANY = "psycopg executemany ON CONFLICT"
#: Engine time per event with one immediate rule, run inline (µs): the core redesign's goal.
ENGINE_GOAL_US = 40.0
#: The hand-hygiene ECA application at 1k per batch: the sink's own Python work per event at most this many times
#: PostgreSQL's server time per event (issue 54's "where the time goes" row).
ECA_PYTHON_GOAL = 3.0
#: The scale-out path with two partitions on two cores, independent keys, 100k events per batch: at least this many
#: times one task's rate (issue 54).
SCALE_OUT_GOAL = 1.6
HAND_HYGIENE_APP = "activedb.examples.hand_hygiene.app"     # what the scale-out tasks import and register
QUERY_PREFIX = "bench-ingest"
PHASES = ("spark", "to_arrow", "validate", "engine", "commit", "flush")


def _steady(progress: list[dict]) -> tuple[int, float, list[dict]]:
    """(rows, seconds, batches) of every batch with rows but the first (warm-up)."""
    batches = sorted((entry for entry in progress if entry.get("numInputRows")), key=lambda entry: entry["batchId"])
    measured = batches[1:] if len(batches) > 1 else batches
    rows = sum(entry["numInputRows"] for entry in measured)
    seconds = sum(entry["durationMs"]["triggerExecution"] for entry in measured) / 1000
    return rows, seconds, measured


def scale_out_order(round_: int) -> tuple[str, str]:
    """The order of round ``round_``'s one-task (``"rules"``) and scale-out runs: ABBA over every four rounds (one
    task first in rounds 0 and 3, the scale-out run first in 1 and 2), so that over an even number of rounds each runs
    first as often as the other, and over four a steady drift of the machine favours neither (module docstring)."""
    return ("rules", "scale-out") if round_ % 4 in (0, 3) else ("scale-out", "rules")


def _paired_ratio(rates: list[float], peer_rates: list[float]) -> float:
    """The median of the rounds' own ratios, ``rates[i] / peer_rates[i]``: the two runs of a round are adjacent in
    time, so the pairing removes the drift they share (the ratio of the two medians mixes rounds; module
    docstring)."""
    return statistics.median(rate / peer for rate, peer in zip(rates, peer_rates))


def _pairing(rates: list[float], peer_rates: list[float]) -> dict[str, Any]:
    """A paired row's ``extra``: its ``rounds``, each round's own ratio (``ratio_per_round``, whose median is
    :func:`_paired_ratio`) and the ratio of the two medians (``ratio_of_medians``)."""
    return {"rounds": len(rates),
            "ratio_per_round": [round(rate / peer, 3) for rate, peer in zip(rates, peer_rates)],
            "ratio_of_medians": round(statistics.median(rates) / statistics.median(peer_rates), 3)}


def _rows_per_partition(database: Any, name: str, batch_ids: list[int]) -> list[int]:
    """Rows of each partition (0, 1, …) of the scale-out run ``name``'s batches ``batch_ids``, summed over them: the
    ledger's ``row_count`` of the rows ``NAME@RUN#pK`` each partition's task commits."""
    from activedb.ingest import parse_ledger_query_id

    ledger = database.table("activedb_ingestion_ledger")
    with database.engine.connect() as connection:
        found = connection.execute(sa.select(ledger.c.query_id, ledger.c.row_count).where(
            ledger.c.query_id.startswith(f"{name}@", autoescape=True), ledger.c.batch_id.in_(batch_ids))).all()
    rows: dict[int, int] = {}
    for query_id, count in found:
        partition = parse_ledger_query_id(query_id)[2]
        if partition is not None and count is not None:
            rows[partition] = rows.get(partition, 0) + count
    return [rows[partition] for partition in sorted(rows)]


def _run_query(query: Any, timeout: float) -> list[dict]:
    if not query.awaitTermination(timeout):
        query.stop()
        raise TimeoutError(f"benchmark query {query.name} did not finish in {timeout} s")
    if query.exception() is not None:
        raise RuntimeError(f"benchmark query {query.name} failed: {query.exception()}")
    return list(query.recentProgress)


def _source(spark: Any, source: Path) -> Any:
    """The benchmark's event files as a stream, one file per micro-batch."""
    return spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(str(source))


def _run_plain_sink(frame: Any, handler: Any, sink: Any, checkpoint: Path, timeout: float) -> dict[str, Any]:
    """Run ``frame`` through ``foreachBatch(handler)`` until it has read everything (``availableNow``), close
    ``sink`` (a ``PlainWriteSink``) and return its ``_steady`` figures (``measured``: the batches')."""
    query = (frame.writeStream.foreachBatch(handler).option("checkpointLocation", str(checkpoint))
             .trigger(availableNow=True).start())
    try:
        progress = _run_query(query, timeout)
    finally:
        sink.close()
    rows, seconds, measured = _steady(progress)
    return {"rows": rows, "seconds": seconds, "batches": len(measured), "query_id": str(query.id),
            "measured": measured}


def _rule_run(spark, database, source: Path, checkpoint: Path, name: str, mapping, prefetch, timeout: float,
              **options: Any) -> dict[str, Any]:
    import spark_bridge
    from activedb.ingest import RulesHandler

    started = time.perf_counter()
    frame = _source(spark, source)
    query = spark_bridge.ingest(database, frame, mapping=mapping, query_name=name,
                                checkpoint_location=str(checkpoint), trigger={"availableNow": True},
                                handler=RulesHandler(prefetch), **options)
    progress = _run_query(query, timeout)
    sink = spark_bridge.sink_of(query)
    outcomes = {outcome.batch_id: outcome for outcome in sink.recent_outcomes()}
    rows, seconds, measured = _steady(progress)
    per_phase = dict.fromkeys(PHASES, 0.0)
    events = dead_letters = 0
    for entry in measured:
        outcome = outcomes[entry["batchId"]]
        for phase, value in zip(PHASES[1:], dataclasses.astuple(outcome.timings)):
            per_phase[phase] += value
        per_phase["spark"] += max(0.0, entry["durationMs"]["triggerExecution"] / 1000 - outcome.seconds)
        events += outcome.events
        dead_letters += outcome.dead_letters
    sink.close()
    stream_done = time.perf_counter()
    database.rules.wait_idle(timeout)
    finished = time.perf_counter()
    all_rows = sum(entry.get("numInputRows", 0) for entry in progress)
    partitioned = ({"rows_per_partition": _rows_per_partition(database, name, [entry["batchId"] for entry in measured])}
                   if options.get("partition_by_key") else {})
    return {**partitioned, "rows": rows, "seconds": seconds, "batches": len(measured), "events": events,
            "dead_letters": dead_letters, "per_phase": per_phase,
            "lowered": getattr(sink.handler, "last_lowered", None) is not None,
            "detached_drain_seconds": round(finished - stream_done, 2),
            "events_per_second_including_start_and_detached": round(all_rows / (finished - started), 1)}


def _plain_run(spark, url: str, source: Path, checkpoint: Path, timeout: float) -> dict[str, Any]:
    from benchmarks.plain_write import PlainWriteSink

    per_batch: dict[int, tuple[float, float]] = {}
    sink = PlainWriteSink(url, "notifications", ledger_values={"transaction_id": "bench-plain-write"},
                          ledger_count_column="events",
                          on_phase=lambda phase, batch: phase == "committed" and per_batch.__setitem__(
                              batch, (sink.statistics().seconds_to_arrow, sink.statistics().seconds_in_database)))
    frame = _source(spark, source).selectExpr("worker", "room AS message", "ts AS at", "type AS channel")
    figures = _run_plain_sink(frame, sink, sink, checkpoint, timeout)
    per_phase = {"spark": 0.0, "to_arrow": 0.0, "database": 0.0}
    for entry in figures["measured"]:
        batch = entry["batchId"]
        before = per_batch.get(batch - 1, (0.0, 0.0))
        to_arrow, database = (now - then for now, then in zip(per_batch[batch], before))
        per_phase["to_arrow"] += to_arrow
        per_phase["database"] += database
        per_phase["spark"] += max(0.0, entry["durationMs"]["triggerExecution"] / 1000 - to_arrow - database)
    return {**figures, "per_phase": per_phase}


def _peer_run(spark, url: str, source: Path, checkpoint: Path, timeout: float) -> dict[str, Any]:
    """The PL/pgSQL peer: each batch's rows sorted by time and COPY'd into hh_badge_events (its trigger applies
    the rules), one transaction with its ledger row."""
    from benchmarks.plain_write import PlainWriteSink
    from spark_bridge import streaming_query_id

    sink = PlainWriteSink(url, "hh_badge_events", columns=("type", "worker", "ts", "room"),
                          ledger_values={"transaction_id": "bench-plpgsql-peer"}, ledger_count_column="events")
    per_batch: dict[int, tuple[float, float]] = {}       # batch id -> (toArrow, the sort and the database)

    def write(batch_df: Any, batch_id: int) -> None:
        started = time.perf_counter()
        table = batch_df.toArrow()
        fetched = time.perf_counter()
        sink.write_batch(table.select(["type", "worker", "ts", "room"]).sort_by("ts"), batch_id,
                         streaming_query_id(batch_df))
        per_batch[batch_id] = (fetched - started, time.perf_counter() - fetched)

    figures = _run_plain_sink(_source(spark, source), write, sink, checkpoint, timeout)
    per_phase = {"spark": 0.0, "to_arrow": 0.0, "database": 0.0}
    for entry in figures["measured"]:
        to_arrow, database = per_batch.get(entry["batchId"], (0.0, 0.0))
        per_phase["to_arrow"] += to_arrow
        per_phase["database"] += database
        per_phase["spark"] += max(0.0, entry["durationMs"]["triggerExecution"] / 1000 - to_arrow - database)
    return {**figures, "per_phase": per_phase}


def _counter_peer_run(spark, url: str, source: Path, checkpoint: Path, timeout: float,
                      method: str) -> dict[str, Any]:
    """The one-rule case without activedb: each batch's worker numbers either COPY'd into
    bench_counter_events (``method="copy"``: its row trigger upserts bench_counters) or upserted into
    bench_counters by ``executemany`` (``INSERT … ON CONFLICT``), one transaction with its ledger row."""
    from benchmarks.plain_write import PlainWriteSink

    worker_number = "CAST(substring(worker, 2) AS INT) AS key"
    if method == "copy":
        sink = PlainWriteSink(url, "bench_counter_events", ledger_values={"transaction_id": "bench-counter-trigger"},
                              ledger_count_column="events")
        columns = [worker_number]
    else:
        sink = PlainWriteSink(url, "bench_counters", method="executemany", ledger_count_column="events",
                              ledger_values={"transaction_id": "bench-counter-executemany"},
                              on_conflict="(key) DO UPDATE SET n = bench_counters.n + EXCLUDED.n")
        columns = [worker_number, "CAST(1 AS BIGINT) AS n"]
    return _run_plain_sink(_source(spark, source).selectExpr(*columns), sink, sink, checkpoint, timeout)


def _counters(database) -> list[tuple]:
    with database.engine.connect() as connection:
        return sorted(tuple(row) for row in connection.execute(sa.text("SELECT key, n FROM bench_counters")))


def _reset_counters(database) -> None:
    with database.engine.begin() as connection:
        connection.execute(sa.text("TRUNCATE bench_counters, bench_counter_events"))


def _app_state(database) -> dict[str, list[tuple]]:
    """The hand-hygiene tables, generated ids and the texts that carry them left out."""
    queries = {
        "worker_status": "SELECT * FROM worker_status",
        "alerts": "SELECT worker, kind, at FROM alerts",
        "status_changes": "SELECT worker, old_status, new_status, event, at FROM status_changes",
        "badge_lights": "SELECT worker, color, status, at FROM badge_lights",
        "notifications": "SELECT worker, channel, at FROM notifications",
        "compensations": "SELECT worker, event, at FROM compensations",
    }
    with database.engine.connect() as connection:
        return {table: sorted(tuple(row) for row in connection.execute(sa.text(query)))
                for table, query in queries.items()}


def _microseconds(per_phase: dict[str, float], rows: int) -> dict[str, float]:
    return {f"{phase}_us_per_event": round(seconds / rows * 1e6, 1) for phase, seconds in per_phase.items()} if rows \
        else {}


def _outbox_figures(database) -> dict[str, Any]:
    """The outbox's records, and how many detached-family firings ran (recorded, or in their batch's commit)."""
    statistics = database.outbox.statistics()
    per_rule = database.rules.statistics().per_rule
    detached = sum(counter.executed for name, counter in per_rule.items()
                   if not Coupling.parse(database.rules.get(name).coupling).runs_as_subtransaction)
    return {"done": statistics.done, "failed": statistics.failed, "pending": statistics.pending,
            "groups": statistics.groups, "splits": statistics.splits, "detached_executed": detached}


def _worker_number(event: Any) -> int:
    return int(str(event.key).lstrip("w") or 0)


def count_badge(tx, event) -> None:
    """The minimal rule, a per-key counter upsert: read the worker's row of bench_counters, write n + 1."""
    key = _worker_number(event)
    row = tx.read("bench_counters", key)
    tx.write("bench_counters", key, n=(row["n"] if row else 0) + 1)


def register_minimal(database) -> None:
    """One immediate rule per badge event (the scale-out tasks import this by reference)."""
    for event_type in ("enter", "exit", "sanitize", "mask"):
        database.rule(on=database.stream(event_type), name=f"bench_count_{event_type}")(count_badge)


def _one_more(own: dict | None) -> dict:
    return {"n": 1 if own is None else own["n"] + 1}


@activedb.batch.declared
def count_badge_declared(event, ops) -> None:
    """The minimal rule as a declared rule: the worker's row of bench_counters written with n + 1."""
    ops.write("bench_counters", _worker_number(event), _one_more)


def register_declared(database) -> None:
    """The minimal rule per badge event as a declared rule: the sink lowers a batch of them (one batch of
    state transactions at commit)."""
    for event_type in ("enter", "exit", "sanitize", "mask"):
        database.rule(on=database.stream(event_type), name=f"bench_count_declared_{event_type}")(count_badge_declared)


def _cleanup(database, plain_ids: list[str]) -> None:
    ledger = database.table("activedb_ingestion_ledger")
    letters = database.table("activedb_dead_letters")
    with database.engine.begin() as connection:
        for table in (ledger, letters):
            connection.execute(table.delete().where(sa.or_(table.c.query_id.like(f"{QUERY_PREFIX}%"),
                                                           table.c.query_id.in_(plain_ids))))
        connection.execute(sa.text("TRUNCATE hh_badge_events, bench_counters, bench_counter_events"))
        connection.execute(sa.text("DELETE FROM activedb_outbox WHERE status = 'done'"))


#: The phases of an event on the rule path with the minimal rule, inline (as ``bench rules`` splits a firing,
#: ``benchmarks.phase_seconds``): (phase, [(file suffix, function)], [phases inside them, subtracted]).
_EVENT_PHASES = (
    ("validate", [("activedb/ingest/_mapping.py", "rows_to_events")], []),
    ("match", [("activedb/rules/_registry.py", "matching")], []),
    ("lock", [("activedb/txn/_locking.py", "acquire")], []),
    ("read", [("activedb/txn/_reads.py", "read")], ["lock"]),
    ("write", [("activedb/txn/_writes.py", "write")], ["lock"]),
    ("child create", [("activedb/txn/_children.py", "_begin_inline")], []),
    ("flush", [("activedb/txn/_flush.py", "flush")], []),
    ("child commit", [("activedb/txn/_tree.py", "commit")], ["flush"]),
)


def _event_phases(database, size: int) -> dict[str, Any]:
    """Where an event's time goes on the rule path with the minimal rule, inline, without Spark:
    ``IngestSink.process`` of ``pyarrow`` tables of ``size`` hand-hygiene rows (a warm-up, five timed batches, then
    one under cProfile), µs per event by phase scaled to the median timed batch, and the share of the time
    spent waiting for PostgreSQL (psycopg's ``Connection.wait``) against the rest, Python."""
    import pstats

    from activedb.examples.hand_hygiene.events import generate
    from activedb.ingest import EventMapping, RulesHandler
    from benchmarks import add_frame_ends, called_from, cumulative, database_wait, phase_seconds, scaled
    from spark_bridge import IngestSink

    batches = _arrow_batches(generate(WORKERS, size * TIMED_BATCHES, SEED + 1), size)
    sink = IngestSink(database, EventMapping("type", "worker", "ts", payload_columns=("room",)),
                      query_name=f"{QUERY_PREFIX}-phases", handler=RulesHandler({"bench_counters": _worker_number}),
                      lineage=False)
    per_event_us, _, _, profile = _timed_and_profiled(database, sink, batches, f"{QUERY_PREFIX}-phases")
    stats = pstats.Stats(profile)
    raw, total = phase_seconds(stats, _EVENT_PHASES)
    add_frame_ends(stats, raw)
    # The dispatch around the firing it runs: on_event less the rule's subtransaction (run_inline called from
    # on_event; the event's own run_inline encloses on_event) and the match.
    dispatch = ("activedb/rules/_manager.py", "on_event")
    raw["dispatch and firing record"] = (cumulative(stats, dispatch) - raw["match"]
                                         - called_from(stats, ("activedb/txn/_children.py", "run_inline"), dispatch))
    raw["rest (the sink's loop, emit, the rule's own code)"] = total - sum(raw.values())
    phases = scaled(raw, total, size, per_event_us, 2)
    waiting = database_wait(stats)
    return {"us_per_event": round(per_event_us, 1), "phases_us_per_event": phases,
            "postgresql_share": round(waiting / total, 3) if total else 0.0,
            "python_share": round(1 - waiting / total, 3) if total else 0.0}


#: Batches of each split without Spark: a warm-up, the timed ones (the median's figures), a profiled one.
TIMED_BATCHES = 7
#: Batches of the ECA application's CPU split: a warm-up and the measured ones.  The server's CPU time is read from
#: ``/proc`` in clock ticks (10 ms on Linux), so the split's resolution is one tick over the measured events: 0.5 µs
#: per event over 20,000 (1.7 µs over the 6,000 of ``TIMED_BATCHES``).
SPLIT_BATCHES = 21


def _arrow_batches(events: list[dict], size: int) -> list[Any]:
    """``events`` of the generator in batches of ``size`` rows as ``pyarrow`` tables, the columns of the bench's
    JSON files: what ``DataFrame.toArrow()`` hands the sink."""
    import pyarrow as pa

    return [pa.Table.from_pylist([{"type": event["type"], "worker": event["worker"], "ts": event["ts"],
                                   "room": event["room"]} for event in events[start:start + size]])
            for start in range(0, len(events), size)]


def _timed_and_profiled(database, sink: Any, batches: list[Any], query: str) -> tuple[float, Any, Any, Any]:
    """``batches`` of one size through ``sink`` (``IngestSink.process``, no Spark): a warm-up, the timed batches, a
    profiled batch (the last); returns µs per event of the median timed batch, its outcome, the handler's
    ``last_lowered`` after it (the batch's id if it was lowered), and the profile.  Closes the sink and deletes the
    ledger rows."""
    import cProfile

    query_id = f"{query}@{time.time_ns()}"
    try:
        sink.process(batches[0], 0, query_id=query_id)                      # warm-up
        timed = []
        for number in range(1, len(batches) - 1):
            started = time.perf_counter()
            outcome = sink.process(batches[number], number, query_id=query_id)
            seconds = time.perf_counter() - started
            timed.append((seconds, number, outcome, getattr(sink.handler, "last_lowered", None)))
        seconds, _, outcome, pending = sorted(timed, key=lambda entry: entry[:2])[len(timed) // 2]
        per_event_us = seconds / batches[1].num_rows * 1e6
        profile = cProfile.Profile()
        profile.enable()
        sink.process(batches[-1], len(batches) - 1, query_id=query_id)
        profile.disable()
    finally:
        sink.close()
        with database.engine.begin() as connection:
            connection.execute(sa.text("DELETE FROM activedb_ingestion_ledger WHERE query_id = :q"), {"q": query_id})
    return per_event_us, outcome, pending, profile


def _declared_phases(database, size: int) -> dict[str, Any]:
    """Where an event's time goes on the declared hand-hygiene application's lowered path, without Spark:
    ``IngestSink.process`` of ``pyarrow`` tables of ``size`` hand-hygiene rows (a warm-up, five timed batches, then
    one under cProfile), µs per event by phase of the median timed batch — validate (``rows_to_events``), lower
    (``batch.lower`` and enlisting the batch), and inside the commit lock and read (``FOR UPDATE``), declare and
    execute (the state transactions, in Python), write (the statements) — those three from the profiled batch,
    scaled to the median timed one —, and the rest of the flush (ledger, lineage, COMMIT); and the share spent
    waiting for PostgreSQL."""
    import pstats

    from activedb.examples.hand_hygiene.app import reset_tables
    from activedb.examples.hand_hygiene.events import generate
    from activedb.ingest import EventMapping
    from benchmarks import cumulative, database_wait, phase_seconds
    from spark_bridge import IngestSink

    batches = _arrow_batches(generate(WORKERS, size * TIMED_BATCHES, SEED + 2), size)
    reset_tables(database)
    sink = IngestSink(database, EventMapping("type", "worker", "ts", payload_columns=("room",)),
                      query_name=f"{QUERY_PREFIX}-declared-phases")
    try:
        per_event_us, outcome, lowered, profile = _timed_and_profiled(database, sink, batches,
                                                                      f"{QUERY_PREFIX}-declared-phases")
    finally:
        reset_tables(database)
    if lowered is None:
        raise RuntimeError("the declared hand-hygiene batch was not lowered (an observer or another rule?)")
    stats = pstats.Stats(profile)
    total = phase_seconds(stats, ())[1] or 1.0                                   # all the profiled time
    scale = per_event_us * size / 1e6 / total            # the profiled batch's seconds as the median timed batch's
    commit_parts = {phase: cumulative(stats, function) * scale for phase, function in (
        ("lock and read (FOR UPDATE)", ("activedb/batch/_commit.py", "_lock_and_read")),
        ("declare and execute (Python)", ("activedb/batch/_runtime.py", "execute_batch")),
        ("write (UPDATE, INSERTs)", ("activedb/batch/_commit.py", "_send")))}
    timings = outcome.timings
    # The three parts are the profiled batch's, scaled; they are shares of the median batch's commit, never more (a
    # busy machine can stall the profiled batch's statements more than the median one's: its parts would then add
    # up to more than the median batch's whole commit).
    commit = timings.flush + timings.commit
    if sum(commit_parts.values()) > commit:
        commit_parts = {phase: seconds * commit / sum(commit_parts.values()) for phase, seconds in commit_parts.items()}
    phases = {"validate": timings.validate, "lower and enlist": timings.engine, **commit_parts,
              "rest of the flush (ledger, lineage, COMMIT)": max(0.0, commit - sum(commit_parts.values()))}
    waiting = database_wait(stats)
    return {"us_per_event": round(per_event_us, 1),
            "phases_us_per_event": {phase: round(seconds / size * 1e6, 2) for phase, seconds in phases.items()},
            "postgresql_share": round(waiting / total, 3), "python_share": round(1 - waiting / total, 3)}


def _wait_outbox_drained(database, timeout: float) -> None:
    """Wait until no recorded detached firing is pending (the scale-out tasks' engines run theirs in Spark's Python
    workers, which the driver's ``wait_idle`` does not see)."""
    deadline = time.monotonic() + timeout
    while True:
        with database.engine.connect() as connection:
            pending = connection.execute(sa.text("SELECT count(*) FROM activedb_outbox WHERE status = 'pending'")).scalar()
        if not pending:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{pending} detached firings still pending after {timeout:g} s")
        time.sleep(0.2)


def _eca_split(database, url: str, size: int) -> dict[str, Any]:
    """Where a hand-hygiene ECA event's time goes at ``size`` events per batch, without Spark: the same events
    through ``IngestSink.process`` with ``app.py``'s rules (every coupling mode; a warm-up batch, then the measured
    ones, the detached family's runs waited for inside the window) and through the PL/pgSQL peer (sorted, ``COPY``
    into ``hh_badge_events``), each measured as CPU time per event — of the sink's thread (its own Python: validate,
    the engine, the flush's Python and driver calls), of the process's other threads over the same window (the
    outbox's group runners running the detached family) and of the PostgreSQL server's processes
    (``server_cpu_seconds``: the flush, the outbox's statements, the peer's triggers).  CPU times, not wall times:
    what each side does, whatever else the machine runs.  Also the wall time per event of the median batch of each,
    and whether the two left the same tables."""
    from activedb.examples.hand_hygiene.app import reset_tables
    from activedb.examples.hand_hygiene.events import generate
    from activedb.ingest import RulesHandler
    from benchmarks._profile import server_cpu_seconds

    from spark_bridge import EventMapping, IngestSink
    from benchmarks.plain_write import PlainWriteSink

    batches = _arrow_batches(generate(WORKERS, size * SPLIT_BATCHES, SEED + 3), size)
    measured = sum(batch.num_rows for batch in batches[1:])
    query_id = f"{QUERY_PREFIX}-eca-split@{time.time_ns()}"

    def window(process_batch, settle) -> dict[str, Any]:
        process_batch(0)                                         # warm-up
        settle()
        server, process, thread = server_cpu_seconds(database.engine), time.process_time(), time.thread_time()
        walls = []
        for number in range(1, len(batches)):
            started = time.perf_counter()
            process_batch(number)
            walls.append(time.perf_counter() - started)
        settle()
        thread, process = time.thread_time() - thread, time.process_time() - process
        server_after = server_cpu_seconds(database.engine)
        server = None if server is None or server_after is None else server_after - server
        return {"sink_thread_cpu_us": round(thread / measured * 1e6, 1),
                "other_threads_cpu_us": round(max(0.0, process - thread) / measured * 1e6, 1),
                "server_cpu_us": None if server is None else round(server / measured * 1e6, 1),
                "wall_us_median_batch": round(statistics.median(walls) / size * 1e6, 1)}

    reset_tables(database)
    sink = IngestSink(database, EventMapping("type", "worker", "ts", payload_columns=("room",)),
                      query_name=f"{QUERY_PREFIX}-eca-split", handler=RulesHandler({"worker_status": None}))
    try:
        rules = window(lambda number: sink.process(batches[number], number, query_id=query_id),
                       lambda: database.rules.wait_idle(600))
    finally:
        sink.close()
    rules_state = _app_state(database)
    reset_tables(database)
    with database.engine.begin() as connection:
        connection.execute(sa.text("TRUNCATE hh_badge_events"))
    peer_sink = PlainWriteSink(url, "hh_badge_events", columns=("type", "worker", "ts", "room"),
                               ledger_values={"transaction_id": "bench-plpgsql-peer"}, ledger_count_column="events")
    try:
        peer = window(lambda number: peer_sink.write_batch(batches[number].sort_by("ts"), number,
                                                           f"{query_id}-peer"),
                      lambda: None)
    finally:
        peer_sink.close()
    same = _app_state(database) == rules_state
    with database.engine.begin() as connection:
        connection.execute(sa.text("DELETE FROM activedb_ingestion_ledger WHERE query_id LIKE :q"),
                           {"q": f"{query_id}%"})
        connection.execute(sa.text("TRUNCATE hh_badge_events"))
    reset_tables(database)
    python_us = rules["sink_thread_cpu_us"] + rules["other_threads_cpu_us"]
    return {"events_per_batch": size, "measured_events": measured, "python_cpu_us": round(python_us, 1),
            **{f"rules_{name}": value for name, value in rules.items()},
            **{f"peer_{name}": value for name, value in peer.items()},
            "same_result_as_the_peer": same}


def _series(report: BenchReport) -> None:
    """events/s against the batch size, per path (for ``--plot``)."""
    paths: dict[str, list[tuple[float, float]]] = {}
    drawn: set[tuple[str, float]] = set()
    for row in report.rows:
        size_text, _, label = row.name.partition(" events/batch: ")
        if not label or row.unit != "events/s" or (size_text, row.value) in drawn:   # (µs: not a rate)
            continue                                                                 # (a rate drawn already)
        drawn.add((size_text, row.value))
        label = label.replace(" vs plain write", "").replace(" vs the PL/pgSQL peer", "")
        if label.endswith("vs the goal") or " vs the " in label:
            continue
        paths.setdefault(label, []).append((int(size_text.replace(",", "")), row.value))
    for label, points in paths.items():
        report.add_series(Series("events/s by batch size", label, "events per micro-batch", "events/s",
                                 points, log_x=True, log_y=True))


@rule_log_quiet     # (rule failures and rejected events are the workload's)
def run(quick: bool = False, progress: Progress | None = None) -> BenchReport:
    import spark_bridge
    from activedb.examples.hand_hygiene import MIGRATIONS
    from activedb.examples.hand_hygiene.app import register, reset_tables
    from activedb.examples.hand_hygiene.declared import register as register_hh_declared
    from activedb.examples.hand_hygiene.events import generate
    from benchmarks import connect_database as bench_connect

    progress = progress or Progress.none()
    report = BenchReport("Spark ingestion end to end (activedb bench ingest)")
    plan = dict(QUICK_PLAN if quick else PLAN)
    scale_out_from = 1_000 if quick else 10_000
    rounds_of = {size: 1 if quick else ROUNDS.get(size, 1) for size in plan}
    scale_out_rounds = max(QUICK_SCALE_OUT_ROUNDS if quick else SCALE_OUT_ROUNDS, rounds_of[max(plan)])
    # (at the largest size: every round's scale-out run, and the one-task runs of the scale-out row's own rounds)
    progress.start("bench ingest", total=3 + sum(6 + 3 * rounds_of[size] + (1 if size >= scale_out_from else 0)
                                             + (2 * scale_out_rounds - rounds_of[size] if size == max(plan) else 0)
                                             for size in plan))
    progress.note("starting Spark and the databases ...")
    timeout = 600.0 if quick else 3600.0

    started = time.perf_counter()
    database = activedb.connect()
    database.upgrade_app(MIGRATIONS)
    reset_tables(database)
    register(database)
    minimal = bench_connect()
    register_minimal(minimal)
    minimal_inline = bench_connect(rule_execution="inline")
    register_minimal(minimal_inline)
    minimal_declared = bench_connect(rule_execution="inline")
    register_declared(minimal_declared)
    hh_declared = bench_connect(rule_execution="inline")
    register_hh_declared(hh_declared)
    url = database.url.render_as_string(hide_password=False)
    from pyspark.sql import SparkSession

    own_session = SparkSession.getActiveSession() is None   # never stop a caller's session
    spark = spark_bridge.get_spark("activedb-bench-ingest")
    mapping = spark_bridge.EventMapping("type", "worker", "ts", payload_columns=("room",))
    folder = Path(tempfile.mkdtemp(prefix="activedb-bench-ingest-"))
    plain_ids: list[str] = []
    try:
        for size, batches in plan.items():
            events = generate(WORKERS, size * batches, SEED)
            source = folder / f"events-{size}"
            write_event_files(source, events, size, 1_700_000_000)

            with progress.step(f"{size:,} events/batch: plain write"):
                if size == next(iter(plan)):
                    # The session's first query pays for the JVM's warm-up (its Spark and ``toArrow`` parts): it
                    # runs unmeasured, so that the plain row compares with the runs after it.
                    plain_ids.append(_plain_run(spark, url, source, folder / "plain-warm-up", timeout)["query_id"])
                plain = _plain_run(spark, url, source, folder / f"plain-{size}", timeout)
            plain_ids.append(plain["query_id"])
            plain_rate = plain["rows"] / plain["seconds"]
            report.add(Row(name=f"{size:,} events/batch: plain write (COPY, no rules)", value=plain_rate,
                           unit="events/s", extra={"events_per_batch": size, "measured_batches": plain["batches"],
                                                   **_microseconds(plain["per_phase"], plain["rows"])}))
            rounds = rounds_of[size]
            # At the plan's largest size, the scale-out path (the batch partitioned by worker: two Spark tasks, an
            # engine each in Spark's Python workers) runs next to each round's one-task rules run, and then in
            # rounds of its own with a one-task run of their own, each round's two in ABBA order (``scale_out_order``):
            # its row is paired as the peer rows are.
            scaled = size == max(plan)
            peer_runs, rule_runs, declared_runs, same, same_declared = [], [], [], True, True
            scaled_runs, one_task_runs, same_scaled = [], [], True
            # Per path, the share of the CPUs' time the hypervisor took during each round's run (None: unknown).
            stolen: dict[str, list[float | None]] = {}
            for round_ in range(scale_out_rounds if scaled else rounds):
                # Interleaved: the rules first (their detached transactions and dead rows weigh on whatever runs
                # next; at the largest size, the rules and the scale-out run in ``scale_out_order``), then the peer and
                # the declared rules in alternating order, so that neither of the two compared at 1.0 always follows
                # the rules run, or the other one.
                total = scale_out_rounds if scaled else rounds
                tag = f"{size}" if total == 1 else f"{size}-{round_ + 1}"
                suffix = "" if total == 1 else f" (round {round_ + 1} of {total})"
                states = {}
                if round_ >= rounds:            # (a round of the scale-out row alone)
                    paths: tuple[str, ...] = scale_out_order(round_)
                else:
                    paths = (*(scale_out_order(round_) if scaled else ("rules",)),
                             *(("peer", "declared") if round_ % 2 == 0 else ("declared", "peer")))
                for path in paths:
                    reset_tables(database)
                    counters = cpu_times()
                    if path == "scale-out":
                        with progress.step(f"{size:,} events/batch: hand-hygiene rules, scale-out 2 partitions{suffix}"):
                            scaled_runs.append(_rule_run(spark, database, source, folder / f"rules-p2-{tag}",
                                                         f"{QUERY_PREFIX}-p2-{tag}", mapping, {"worker_status": None},
                                                         timeout, partition_by_key=2, app=HAND_HYGIENE_APP))
                        _wait_outbox_drained(database, timeout)
                    elif path == "rules" and round_ >= rounds:
                        with progress.step(f"{size:,} events/batch: hand-hygiene rules, one task{suffix}"):
                            one_task_runs.append(_rule_run(spark, database, source, folder / f"rules-{tag}",
                                                           f"{QUERY_PREFIX}-{tag}", mapping, {"worker_status": None},
                                                           timeout))
                    elif path == "peer":
                        with progress.step(f"{size:,} events/batch: PL/pgSQL peer{suffix}"):
                            peer_runs.append(_peer_run(spark, url, source, folder / f"peer-{tag}", timeout))
                        plain_ids.append(peer_runs[-1]["query_id"])
                    elif path == "rules":
                        with progress.step(f"{size:,} events/batch: hand-hygiene rules{suffix}"):
                            rule_runs.append(_rule_run(spark, database, source, folder / f"rules-{tag}",
                                                       f"{QUERY_PREFIX}-{tag}", mapping, {"worker_status": None},
                                                       timeout))
                    else:
                        with progress.step(f"{size:,} events/batch: hand-hygiene as declared rules{suffix}"):
                            declared_runs.append(_rule_run(spark, hh_declared, source, folder / f"declared-{tag}",
                                                           f"{QUERY_PREFIX}-declared-{tag}", mapping, None, timeout))
                    states[path] = _app_state(database)
                    stolen.setdefault("one task" if path == "rules" and round_ >= rounds else path, []).append(
                        machine_during(counters).get("cpu_share", {}).get("steal"))
                if round_ < rounds:
                    same = same and states["rules"] == states["peer"]
                    same_declared = same_declared and states["declared"] == states["peer"]
                    peer_state = states["peer"]
                if scaled:
                    same_scaled = same_scaled and states["scale-out"] == peer_state
            peer_rates = [run["rows"] / run["seconds"] for run in peer_runs]
            rule_rates = [run["rows"] / run["seconds"] for run in rule_runs]
            peer, peer_rate = peer_runs[0], statistics.median(peer_rates)
            rules = sorted(rule_runs, key=lambda run: run["rows"] / run["seconds"])[len(rule_runs) // 2]
            rule_rate = statistics.median(rule_rates)
            rule_ratio = _paired_ratio(rule_rates, peer_rates)
            end_to_end = rules["events_per_second_including_start_and_detached"]
            peer_median = sorted(peer_runs, key=lambda run: run["rows"] / run["seconds"])[len(peer_runs) // 2]
            report.add(Row(name=f"{size:,} events/batch: PL/pgSQL row triggers (COPY, the peer)", value=peer_rate,
                           unit="events/s", extra={"events_per_batch": size, "measured_batches": peer["batches"],
                                                   "same_result_as_activedb": same,
                                                   **_microseconds(peer_median["per_phase"], peer_median["rows"])}))
            report.add(Row(name=f"{size:,} events/batch: hand-hygiene rules vs the PL/pgSQL peer", value=rule_rate,
                           unit="events/s", baseline_name="PL/pgSQL row triggers", baseline=peer_rate,
                           ratio=rule_ratio, target=f">= {PEER_GOAL} of the peer", met=rule_ratio >= PEER_GOAL, goal=PEER_GOAL,
                           extra={"same_result_as_activedb": same, **_pairing(rule_rates, peer_rates),
                                  "steal_per_round": {"rules": stolen.get("rules"), "peer": stolen.get("peer")},
                                  "end_to_end_ratio": round(end_to_end / peer_rate, 3)}))
            declared_rates = [run["rows"] / run["seconds"] for run in declared_runs]
            declared_rate = statistics.median(declared_rates)
            declared_ratio = _paired_ratio(declared_rates, peer_rates)
            declared_median = sorted(declared_runs, key=lambda run: run["rows"] / run["seconds"])[len(declared_runs) // 2]
            report.add(Row(name=f"{size:,} events/batch: hand-hygiene as declared rules vs the PL/pgSQL peer",
                           value=declared_rate, unit="events/s", baseline_name="PL/pgSQL row triggers",
                           baseline=peer_rate, ratio=declared_ratio, target=f">= {PEER_GOAL} of the peer",
                           met=declared_ratio >= PEER_GOAL, goal=PEER_GOAL,
                           extra={"same_result_as_the_peer": same_declared, **_pairing(declared_rates, peer_rates),
                                  "lowered": declared_median["lowered"],
                                  "applied": declared_median["events"], "dead_letters": declared_median["dead_letters"],
                                  **_microseconds(declared_median["per_phase"], declared_median["rows"])}))
            ratio = rule_rate / plain_rate
            extra = {"events_per_batch": size, "measured_batches": rules["batches"], "applied": rules["events"],
                     "dead_letters": rules["dead_letters"], **_microseconds(rules["per_phase"], rules["rows"]),
                     "rule_cost_x_plain": round(plain_rate / rule_rate, 1),
                     "detached_drain_seconds": rules["detached_drain_seconds"],
                     "events_per_second_including_start_and_detached":
                         rules["events_per_second_including_start_and_detached"]}
            report.add(Row(name=f"{size:,} events/batch: hand-hygiene rules vs plain write", value=rule_rate,
                           unit="events/s", baseline_name="plain write (COPY, no rules)", baseline=plain_rate,
                           ratio=ratio, target=f"rule layer <= {MAX_RULE_COST:g}x plain (ratio >= 0.33)",
                           met=ratio >= 1 / MAX_RULE_COST, goal=1 / MAX_RULE_COST, extra=extra))
            report.add(Row(name=f"{size:,} events/batch: hand-hygiene rules vs the goal", value=rule_rate,
                           unit="events/s", target=f">= {GOAL_EVENTS_PER_SECOND:,} events/s",
                           met=rule_rate >= GOAL_EVENTS_PER_SECOND))
            report.add(Row(name=f"{size:,} events/batch: hand-hygiene end to end, detached effects included",
                           value=end_to_end, unit="events/s", target=f">= {GOAL_EVENTS_PER_SECOND:,} events/s",
                           met=end_to_end >= GOAL_EVENTS_PER_SECOND,
                           extra={"detached_drain_seconds": rules["detached_drain_seconds"],
                                  "outbox": _outbox_figures(database)}))
            if scaled:
                # The ECA application on the scale-out path against the one-task runs of its rounds (the rounds'
                # own rules runs, then its own): the median of the rounds' own ratios, as the peer rows'.
                one_task_rates = [run["rows"] / run["seconds"] for run in rule_runs + one_task_runs]
                scaled_rates = [run["rows"] / run["seconds"] for run in scaled_runs]
                one_task_rate, scaled_rate = statistics.median(one_task_rates), statistics.median(scaled_rates)
                scaled_ratio = _paired_ratio(scaled_rates, one_task_rates)
                scaled_median = sorted(scaled_runs, key=lambda run: run["rows"] / run["seconds"])[len(scaled_runs) // 2]
                goal = size >= 100_000
                report.add(Row(name=f"{size:,} events/batch: hand-hygiene rules, scale-out 2 partitions vs one task",
                               value=scaled_rate, unit="events/s", baseline_name="hand-hygiene rules, one task",
                               baseline=one_task_rate, ratio=scaled_ratio,
                               target=f">= {SCALE_OUT_GOAL:g} of one task" if goal else None,
                               met=scaled_ratio >= SCALE_OUT_GOAL if goal else None,
                               goal=SCALE_OUT_GOAL if goal else None,
                               extra={"partitions": 2, "cores": os.cpu_count(),
                                      "measured_batches": scaled_median["batches"],
                                      **_pairing(scaled_rates, one_task_rates),
                                      "rows_per_partition_per_round": [run["rows_per_partition"]
                                                                       for run in scaled_runs],
                                      "steal_per_round": {"one_task": stolen["rules"] + stolen.get("one task", []),
                                                          "two_partitions": stolen.get("scale-out")},
                                      "same_result_as_the_peer": same_scaled,
                                      **_microseconds(scaled_median["per_phase"], scaled_median["rows"])}))
            counter_peers: dict[str, float] = {}
            trigger_counters: list[tuple] = []
            for peer_name, method in ((COUNTER_TRIGGER, "copy"), (COUNTER_EXECUTEMANY, "executemany")):
                _reset_counters(database)
                with progress.step(f"{size:,} events/batch: {peer_name}"):
                    counted = _counter_peer_run(spark, url, source, folder / f"counter-{method}-{size}", timeout,
                                                method)
                plain_ids.append(counted["query_id"])
                counter_peers[peer_name] = counted["rows"] / counted["seconds"]
                counters = _counters(database)
                if method == "copy":
                    trigger_counters = counters
                report.add(Row(name=f"{size:,} events/batch: {peer_name}, the one-rule peer",
                               value=counter_peers[peer_name], unit="events/s",
                               extra={"events_per_batch": size, "measured_batches": counted["batches"],
                                      "same_counters_as_the_trigger": counters == trigger_counters}))
            variants = [("threads", minimal, {}), ("inline", minimal_inline, {}),
                        ("declared rule, lowered", minimal_declared, {})]
            if size >= scale_out_from:
                variants.append(("inline, scale-out 2 partitions", minimal_inline,
                                 {"partition_by_key": 2, "app": register_minimal}))
            for label, engine, options in variants:
                tag = label.split(",")[0].replace(" ", "-") + ("-p2" if options else "")
                _reset_counters(database)
                with progress.step(f"{size:,} events/batch: one immediate rule ({label})"):
                    light = _rule_run(spark, engine, source, folder / f"minimal-{tag}-{size}",
                                      f"{QUERY_PREFIX}-min-{tag}-{size}", mapping,
                                      {"bench_counters": _worker_number}, timeout, **options)
                light_rate = light["rows"] / light["seconds"]
                same_counters = _counters(database) == trigger_counters
                report.add(Row(name=f"{size:,} events/batch: one immediate rule per event ({label})",
                               value=light_rate, unit="events/s", baseline_name="plain write (COPY, no rules)",
                               baseline=plain_rate, ratio=light_rate / plain_rate,
                               target=f">= {GOAL_EVENTS_PER_SECOND:,} events/s",
                               met=light_rate >= GOAL_EVENTS_PER_SECOND,
                               extra={"events_per_batch": size, "measured_batches": light["batches"],
                                      "rule_cost_x_plain": round(plain_rate / light_rate, 1),
                                      "same_counters_as_the_trigger": same_counters,
                                      "lowered": light["lowered"],
                                      **_microseconds(light["per_phase"], light["rows"])}))
                for peer_name, peer_value in counter_peers.items():
                    report.add(Row(name=f"{size:,} events/batch: one-rule counter upsert ({label}) vs the "
                                        f"{peer_name}", value=light_rate, unit="events/s",
                                   baseline_name=peer_name, baseline=peer_value, ratio=light_rate / peer_value,
                                   target=f">= {PEER_GOAL} of the peer", met=light_rate / peer_value >= PEER_GOAL,
                                   goal=PEER_GOAL,
                                   extra={"same_counters_as_the_trigger": same_counters}))
                if label == "inline" and light["rows"]:
                    engine_us = light["per_phase"].get("engine", 0.0) / light["rows"] * 1e6
                    report.add(Row(name=f"{size:,} events/batch: engine cost per event, one immediate rule "
                                        f"(inline)", value=engine_us, unit="µs/event",
                                   target=f"<= {ENGINE_GOAL_US:g} µs", met=engine_us <= ENGINE_GOAL_US,
                                   extra={"what": "wall time of the sink's engine phase per event (the per-event "
                                                  "subtransactions with their rule, or the lowered batch when "
                                                  "the row's run was lowered), steady-state batches",
                                          "lowered": light["lowered"]}))
        split_size = max(plan)
        with progress.step(f"{split_size:,} events/batch: where an event's time goes (no Spark, profiled)"):
            split = _event_phases(minimal_inline, min(split_size, 10_000))
        report.add(Row(name=f"{min(split_size, 10_000):,} events/batch: one immediate rule (inline), time per event "
                            f"by phase, without Spark", value=split["us_per_event"], unit="µs/event", extra=split))
        with progress.step(f"{split_size:,} events/batch: where a declared hand-hygiene event's time goes (no Spark)"):
            declared_split = _declared_phases(hh_declared, min(split_size, 10_000))
        report.add(Row(name=f"{min(split_size, 10_000):,} events/batch: hand-hygiene as declared rules, time per "
                            f"event by phase, without Spark", value=declared_split["us_per_event"], unit="µs/event",
                       extra=declared_split))
        with progress.step("1,000 events/batch: where a hand-hygiene ECA event's time goes (no Spark, CPU times)"):
            eca = _eca_split(database, url, 1_000)
        server_us = eca["rules_server_cpu_us"]
        times = None if not server_us else eca["python_cpu_us"] / server_us
        report.add(Row(name="1,000 events/batch: hand-hygiene ECA rules, where the time goes: the sink's Python vs "
                            "PostgreSQL's server time per event, without Spark", value=eca["python_cpu_us"],
                       unit="µs/event", baseline_name="PostgreSQL server CPU per event (same run)", baseline=server_us,
                       ratio=None if times is None else round(times, 2),
                       target=f"Python <= {ECA_PYTHON_GOAL:g}x PostgreSQL's server time",
                       met=None if times is None else times <= ECA_PYTHON_GOAL, extra=eca))
        _series(report)
        report.notes.append(
            f"hand-hygiene workload: events.generate({WORKERS} workers, seed {SEED}); {dict(plan)} "
            f"(events per batch: batches); steady state = every batch but the first, rows / Spark triggerExecution")
        report.notes.append(
            "rows against the PL/pgSQL peer (interleaved rounds): value and baseline are the median rates; ratio = "
            "the median of the rounds' own ratios (ratio_per_round; each round's runs are adjacent in time), the "
            "ratio of the two medians is ratio_of_medians")
        report.notes.append(
            "per-event split (extra): spark = triggerExecution minus the sink (planning, offset/commit logs); "
            "to_arrow, validate (rows_to_events), engine (event subtransactions with immediate/deferred rules, "
            "dead letters), commit (top-level deferred rules), flush (PostgreSQL transaction)")
        report.notes.append(
            f"rules run with prefetch={{'worker_status': None}} and rule_execution="
            f"{database.rules.execution!r}; detached rule transactions overlap later batches and are waited for "
            f"between runs; total wall time {time.perf_counter() - started:.0f} s; load average at the end "
            f"{', '.join(f'{load:.1f}' for load in os.getloadavg())} (1, 5, 15 min)")
    finally:
        _cleanup(database, plain_ids)
        reset_tables(database)
        if own_session:
            spark.stop()
        minimal.close()
        minimal_inline.close()
        minimal_declared.close()
        hh_declared.close()
        database.close()
        shutil.rmtree(folder, ignore_errors=True)
    return report
