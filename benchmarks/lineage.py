"""``activedb bench lineage``: what recording lineage costs, with and without, in the same run.

The shape of a Spark micro-batch as the ingest sink runs it: one top-level transaction per batch, one
inline subtransaction per event that reads and writes a counter row.  Each round runs the same batches
twice, alternately — without lineage, and with ``db.batches.consumed(tx, query, batch)`` (the lineage
row and its batch row written in the batch's own flush) — and the medians are compared.  Batch sizes:
1,000 events (a micro-batch), 10 events, and 1 event (the worst case: a lineage INSERT per
single-event transaction).  The goal is a cost of at most 10 % on ingest-sized batches.
"""

from __future__ import annotations

import statistics
import time
import uuid

from activedb.progress import Progress
from benchmarks._setup import connect
from benchmarks.report import BenchReport, Row

KEYS = 200


def _batch(db, events: int, query: str | None, batch_id: int) -> float:
    started = time.perf_counter()
    with db.transaction(name="bench-batch") as tx:
        if query is not None:
            db.batches.consumed(tx, query, batch_id)
        for number in range(events):
            with tx.subtransaction() as event:
                key = (batch_id * 7919 + number) % KEYS
                row = event.read("bench_objects", key)
                event.write("bench_objects", key, value=row["value"] + 1)
    return time.perf_counter() - started


def run(quick: bool = False, progress: Progress | None = None) -> BenchReport:
    report = BenchReport("lineage recording (activedb bench lineage)")
    progress = progress or Progress.none()
    progress.start("bench lineage", total=3)
    with connect() as database:
        with database.transaction() as tx:
            for key in range(KEYS):
                tx.write("bench_objects", key, value=0)
        query = f"bench-lineage-{uuid.uuid4().hex[:8]}"
        batch_id = 0
        for events, rounds in ((1000, 3 if quick else 10), (10, 20 if quick else 100), (1, 50 if quick else 300)):
            plain, recorded = [], []
            for _ in range(2):                                   # warm-up
                batch_id += 1
                _batch(database, events, None, batch_id)
                _batch(database, events, query, batch_id)
            for _ in range(rounds):
                batch_id += 1
                plain.append(_batch(database, events, None, batch_id))
                recorded.append(_batch(database, events, query, batch_id))
            plain_rate = events / statistics.median(plain)
            recorded_rate = events / statistics.median(recorded)
            ratio = recorded_rate / plain_rate
            goal = events >= 1000
            report.add(Row(f"batch of {events} event(s), lineage recorded", recorded_rate, "events/s",
                           baseline_name="same batches, no lineage", baseline=plain_rate, ratio=ratio,
                           target=">= 0.90 of no lineage" if goal else None, met=(ratio >= 0.90) if goal else None,
                           goal=0.90 if goal else None,
                           extra={"rounds": rounds, "cost_percent": round((1 - ratio) * 100, 1)}))
            progress.update(len(report.rows), f"batches of {events} event(s), with and without lineage")
        database.batches.prune(older_than=0)
        report.notes.append("medians of alternating rounds in one process and one database; the single-event row is "
                            "the worst case (one lineage INSERT per one-event top-level transaction)")
    return report
