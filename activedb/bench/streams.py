"""``activedb bench streams``: pattern queries and ON OUTPUT rules under SEI vs the plain write path.

Workload: the hand-hygiene badge events of ``activedb.examples.hand_hygiene.events.generate``
(100 workers, seed 7, about 2 % out-of-order arrivals and 3 % sensor glitches), ``N`` = 1k,
10k and 100k events, fed in micro-batches of 1,000 events, each batch one top-level
transaction; each batch is punctuated like Spark's watermark (the largest timestamp seen
before it minus 30 s) and a last empty batch punctuates ``END_OF_STREAM``.

Queries and rules (``engine.define``; Active CEP's names mapped onto ``bench_worker_status``
with ``aliases``):

* Q1/R1 — Active CEP §3.1 verbatim: ``SEQ(EXIT, !SANITIZE, ENTER)`` within 45 s into another
  room for a worker who is safe at his ENTER → warning;
* Q2/R2 — Q2's pattern (Active CEP §2): ``SEQ(MASK, EXIT)`` within 5 s for a worker in warning;
  R2 (the benchmark's choice, after Appendix C's reading) puts him back to safe;
* Q3/R3 — the benchmark's own edge: ``SANITIZE`` while in warning → safe.

Rows, for each ``N``, measured in the same run on the same database:

1. **SEI** — ``StreamEngine.process`` per batch: events/s end to end (batches' wall time,
   commits included) next to **plain** — the same events written with one ``tx.write`` each
   into ``bench_stream_events``, one top-level transaction per batch (the store's write
   path with no query, no s-transaction);
2. the App. G.2 metrics of the SEI run (``engine.statistics()``): throughput
   ``numIn / T_proc`` (T_proc: time inside ``process``), ``L_query``, ``L_rule``,
   ``L_combined``, in milliseconds of system time;
3. where the time goes: microseconds per event in each phase of the engine (buffer,
   match, reads, rules, s-transaction commits, saving state) and in the top-level commit.

``--quick`` runs N = 1k only.
"""

from __future__ import annotations

import time
from typing import Any

import sqlalchemy as sa

from activedb import streams
from activedb.bench.report import BenchReport, Row
from activedb.bench._setup import connect

WORKERS = 100
SEED = 7
BATCH = 1000
DELAY = 30.0
ALIASES = {"workerStatus": ("bench_worker_status", {"workerID": "worker_id"})}

DEFINITIONS = """
CREATE QUERY Q1 ON estream
PATTERN SEQ(EXIT, !SANITIZE, ENTER)
WHERE [HCW-ID] AND
EXIT.location != ENTER.location AND
'safe'=(SELECT status FROM workerStatus
WHERE workerID=ENTER.HCW-ID)
WITHIN 45 sec
RETURN ENTER.HCW-ID, ENTER.location

CREATE RULE R1
ON OUTPUT Q1
REFERENCING NEW AS newEvent
FOR EACH EVENT
BEGIN
UPDATE workerStatus SET status = 'warning'
WHERE workerID = newEvent.HCW-ID
END

CREATE QUERY Q2 ON estream PATTERN SEQ(MASK, EXIT)
WHERE [HCW-ID] AND 'warning' = (SELECT status FROM workerStatus WHERE workerID = EXIT.HCW-ID)
WITHIN 5 sec RETURN EXIT.HCW-ID

CREATE RULE R2 ON OUTPUT Q2 REFERENCING NEW AS n FOR EACH EVENT
BEGIN UPDATE workerStatus SET status = 'safe' WHERE workerID = n.HCW-ID END

CREATE QUERY Q3 ON estream PATTERN SEQ(SANITIZE)
WHERE 'warning' = (SELECT status FROM workerStatus WHERE workerID = SANITIZE.HCW-ID)
RETURN SANITIZE.HCW-ID

CREATE RULE R3 ON OUTPUT Q3 REFERENCING NEW AS n FOR EACH EVENT
BEGIN UPDATE workerStatus SET status = 'safe' WHERE workerID = n.HCW-ID END
"""


def workload(count: int) -> list[streams.StreamEvent]:
    from activedb.examples.hand_hygiene.events import generate

    return [streams.StreamEvent(raw["type"].upper(), raw["ts"], {"HCW-ID": raw["worker"], "location": raw["room"]})
            for raw in generate(WORKERS, count, SEED)]


def _reset(database) -> None:
    with database.engine.begin() as connection:
        connection.execute(sa.text("TRUNCATE bench_worker_status, bench_stream_events"))
        connection.execute(sa.text("INSERT INTO bench_worker_status (worker_id, status) "
                                   "SELECT 'w' || lpad(g::text, 2, '0'), 'safe' FROM generate_series(0, :n - 1) g"),
                           {"n": WORKERS})


def _batches(events: list) -> list[tuple[list, Any]]:
    batches, seen = [], None
    for start in range(0, len(events), BATCH):
        chunk = events[start:start + BATCH]
        batches.append((chunk, None if seen is None else seen - DELAY))
        seen = max([seen if seen is not None else float("-inf")] + [event.ts for event in chunk])
    batches.append(([], streams.END_OF_STREAM))
    return batches


def run_sei(database, events: list, name: str) -> dict[str, Any]:
    _reset(database)
    engine = streams.StreamEngine(database, name=name, aliases=ALIASES, keep_outputs=False,
                                  record_dead_letters=False)
    engine.create_stream("estream", types=("EXIT", "SANITIZE", "ENTER", "MASK"), attributes=("HCW-ID", "location"),
                         priorities={"SANITIZE": 2, "MASK": 1})
    engine.define(DEFINITIONS)
    engine.reset_state()
    commit = 0.0
    started = time.perf_counter()
    for chunk, punctuation in _batches(events):
        with database.transaction(name="bench:streams") as tx:
            engine.process(tx, chunk, punctuation=punctuation)
            leaving = time.perf_counter()
        commit += time.perf_counter() - leaving
    seconds = time.perf_counter() - started
    statistics = engine.statistics()
    engine.reset_state()
    return {"seconds": seconds, "commit": commit, "statistics": statistics}


def run_plain(database, events: list) -> float:
    _reset(database)
    started = time.perf_counter()
    number = 0
    for chunk, _ in _batches(events):
        with database.transaction(name="bench:plain") as tx:
            for event in chunk:
                tx.write("bench_stream_events", number, type=event.type, worker=event.attributes["HCW-ID"],
                         ts=event.ts, room=event.attributes["location"])
                number += 1
    return time.perf_counter() - started


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value * 1000, 3)


def run(quick: bool = False) -> BenchReport:
    report = BenchReport("stream transactions under SEI (activedb bench streams)")
    sizes = (1000,) if quick else (1000, 10_000, 100_000)
    database = connect()
    try:
        warm = workload(200)
        run_sei(database, warm, "bench-warmup")
        run_plain(database, warm)
        for size in sizes:
            events = workload(size)
            sei = run_sei(database, events, f"bench-{size}")
            plain_seconds = run_plain(database, events)
            statistics = sei["statistics"]
            rate = statistics.events_processed / sei["seconds"]
            plain_rate = size / plain_seconds
            per_event = {phase: round(seconds / size * 1e6, 1) for phase, seconds in statistics.phase_seconds.items()}
            per_event["top_level_commit"] = round(sei["commit"] / size * 1e6, 1)
            accounted = sum(statistics.phase_seconds.values()) + sei["commit"]
            per_event["other"] = round(max(0.0, sei["seconds"] - accounted) / size * 1e6, 1)
            report.add(Row(
                name=f"SEI, {size:,} events", value=rate, unit="events/s",
                baseline_name="plain write path (one tx.write per event)", baseline=plain_rate,
                ratio=rate / plain_rate,
                extra={
                    "events": size, "processed": statistics.events_processed,
                    "dead_letters": statistics.dead_letters, "late": statistics.late_events,
                    "outputs": statistics.outputs, "rule_instances": statistics.rule_instances,
                    "store_reads": statistics.store_reads, "store_writes": statistics.store_writes,
                    "throughput_T_proc": round(statistics.throughput, 1),
                    "L_query_ms": _ms(statistics.l_query), "L_rule_ms": _ms(statistics.l_rule),
                    "L_combined_ms": _ms(statistics.l_combined),
                    "mean_reorder_delay_ms": _ms(statistics.mean_reorder_delay),
                    "us_per_event": per_event,
                },
            ))
            report.add(Row(name=f"SEI L_combined, {size:,} events", value=_ms(statistics.l_combined) or 0.0,
                           unit="ms", extra={"L_query_ms": _ms(statistics.l_query),
                                             "L_rule_ms": _ms(statistics.l_rule)}))
    finally:
        database.close()
    report.notes.append(
        f"{WORKERS} workers, micro-batches of {BATCH} events, punctuation = max ts seen before the batch - "
        f"{DELAY:g} s (like Spark's watermark), END_OF_STREAM last. events/s = events / wall time of all batches "
        f"(commits included); throughput_T_proc = events / time inside engine.process (Active CEP App. G.2). "
        f"L_query counts from the latest constituent's arrival (batch admission), so it includes reorder "
        f"buffering and SEI's wait for the earlier s-transactions of the batch.")
    report.notes.append("us_per_event: buffer (admission, reordering, release), match (pure pattern matching), "
                        "reads (query evaluation with store reads), rules, commit (the s-transactions' "
                        "subtransaction commits), state (saving buffer/partitions into the batch transaction), "
                        "top_level_commit (the batch's PostgreSQL flush), other (the rest: subtransaction "
                        "creation, prefetch, bookkeeping)")
    return report
