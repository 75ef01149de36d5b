"""``activedb bench ingest-lineage``: what the Spark sink's lineage recording costs, with and without it,
in the same run.

The sink's own per-batch path without Spark (``IngestSink.process``, exactly what ``foreachBatch`` and
every scale-out task run after ``toArrow``): validation, one top-level transaction with the ledger
participant, one inline subtransaction per event whose one immediate rule reads and writes a row of
``bench_counters`` (the minimal rule of ``activedb bench ingest``), the flush.  Two sinks on one database
take turns batch by batch (which goes first alternates) — lineage off, lineage on (``db.batches.consuming(source, batch)``: one
``INSERT … WITH … INSERT`` in the batch's flush) — and the medians are compared.  Batch sizes: 1,000
events (a micro-batch; 10,000 without ``--quick``) and 10 events (small batches: the worst case a
stream sees).  Besides the ratio of the medians, the median of the paired differences (the two batches
of a round run back to back) is reported: on a shared machine it is the steadier figure.  The goal is at most 10 % on micro-batches.  Spark itself is left out: it
adds the same fixed cost to both, so the ratio here is the pessimistic one.
"""

from __future__ import annotations

import datetime as dt
import statistics
import time
import uuid
from typing import Any

import sqlalchemy as sa

from activedb.ingest import EventMapping
from benchmarks.ingest import register_minimal
from benchmarks.report import BenchReport, Row

QUERY_PREFIX = "bench-ingest-lineage"
WORKERS = 100
MAPPING = EventMapping("type", "worker", "ts", payload_columns=("room",))
_BASE = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)


def _rows(batch_id: int, events: int) -> list[dict]:
    kinds = ("enter", "exit", "sanitize", "mask")
    return [{"type": kinds[number % 4], "worker": f"w{(batch_id * 7919 + number) % WORKERS}",
             "ts": _BASE + dt.timedelta(seconds=batch_id, microseconds=number), "room": "r1"}
            for number in range(events)]


def _cleanup(database, queries: list[str]) -> None:
    with database.engine.begin() as connection:
        for query in queries:
            connection.execute(sa.text(
                "DELETE FROM activedb_lineage WHERE transaction_id IN (SELECT transaction_id FROM "
                "activedb_lineage_batches WHERE query_id = :q)"), {"q": query})
            connection.execute(sa.text("DELETE FROM activedb_ingestion_ledger WHERE query_id = :q"), {"q": query})


def run(quick: bool = False, progress: Any = None) -> BenchReport:
    """``progress``: an ``activedb.progress.Progress`` that hears of each batch size."""
    from activedb.progress import Progress
    from benchmarks import connect_database as connect
    from spark_bridge import IngestSink

    report = BenchReport("lineage recording on the ingest sink (activedb bench ingest-lineage)")
    database = connect(rule_execution="inline")
    register_minimal(database)
    run_id = uuid.uuid4()
    queries = [f"{QUERY_PREFIX}-off@{run_id}", f"{QUERY_PREFIX}-on@{run_id}"]
    plain = IngestSink(database, MAPPING, query_name=f"{QUERY_PREFIX}-off", lineage=False)
    recorded = IngestSink(database, MAPPING, query_name=f"{QUERY_PREFIX}-on")
    try:
        batch_id = 0
        shapes = ((1_000, 10), (10, 100)) if quick else ((10_000, 6), (1_000, 30), (10, 300))
        progress = progress or Progress.none()
        progress.start("bench ingest-lineage", total=len(shapes))
        for events, rounds in shapes:
            timings: dict[bool, list[float]] = {False: [], True: []}
            for round_number in range(rounds + 1):                 # round 0 warms up
                batch_id += 1
                rows = _rows(batch_id, events)
                turns = ((False, plain), (True, recorded))
                for with_lineage, sink in (turns if round_number % 2 else turns[::-1]):   # who goes first alternates
                    query = queries[with_lineage]
                    started = time.perf_counter()
                    outcome = sink.process(rows, batch_id, query_id=query)
                    elapsed = time.perf_counter() - started
                    assert outcome.committed and outcome.events == events, outcome
                    if round_number:
                        timings[with_lineage].append(elapsed)
            off = events / statistics.median(timings[False])
            on = events / statistics.median(timings[True])
            # Paired: the two batches of a round ran back to back, so their difference cancels the drift of a
            # shared machine's load, which the medians of each side do not.
            added = statistics.median(with_ - without for with_, without in zip(timings[True], timings[False]))
            ratio = on / off
            goal = events >= 1_000
            report.add(Row(
                name=f"IngestSink.process, {events:,} events per batch, lineage recorded", value=on,
                unit="events/s", baseline_name="same batches, lineage off", baseline=off, ratio=ratio,
                target=">= 0.90 of lineage off" if goal else None, met=(ratio >= 0.90) if goal else None,
                goal=0.90 if goal else None,
                extra={"rounds": rounds, "cost_percent": round((1 - ratio) * 100, 1),
                       "added_ms_per_batch_paired_median": round(added * 1000, 2),
                       "paired_cost_percent": round(added / statistics.median(timings[False]) * 100, 1)}))
            progress.update(len(report.rows), f"{events:,} events per batch, lineage on and off")
        with database.engine.connect() as connection:
            recorded_batches = connection.execute(sa.text(
                "SELECT count(*) FROM activedb_lineage_batches WHERE query_id = :q"), {"q": queries[1]}).scalar()
        report.notes.append(f"medians of alternating batches in one process and one database; {recorded_batches} "
                            f"batches recorded in lineage by the 'on' sink, none by the 'off' sink")
    finally:
        _cleanup(database, queries)
        database.close()
    return report


if __name__ == "__main__":  # pragma: no cover
    run(quick=True).print()
