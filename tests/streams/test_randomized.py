"""Randomised: random streams and random query/rule sets — every SEI history passes the
Definition 6 checker, and replaying the same stream disordered, in micro-batches with
punctuations, gives the same store and outputs.

Seeded with ``ACTIVEDB_STREAMS_SEED`` (default fixed); ``ACTIVEDB_STREAMS_CASES`` sets the
number of cases (default 8, each a fresh query/rule set and stream).
"""

from __future__ import annotations

import os
import random

import pytest
import sqlalchemy as sa

from activedb import streams
from activedb.testing import check_stream_history

SEED = int(os.environ.get("ACTIVEDB_STREAMS_SEED", "20110901"))
CASES = int(os.environ.get("ACTIVEDB_STREAMS_CASES", "8"))
TYPES = ("A", "B", "C", "N")


def random_definitions(rng: random.Random) -> str:
    statements = []
    for number in range(rng.randint(1, 3)):
        length = rng.randint(1, 3)
        positives = [f"{rng.choice('ABC')} p{index}" for index in range(length)]
        items = list(positives)
        if length >= 2 and rng.random() < 0.6:
            items.insert(1, "!N n")
        accepting = f"p{length - 1}"
        terms = []
        if rng.random() < 0.7:
            terms.append("[k]")
        if length >= 2 and rng.random() < 0.5:
            terms.append(f"p0.x <= {accepting}.x")
        if "!N n" in items and rng.random() < 0.5:
            terms.append("n.x = p0.x")
        if number == 0 or rng.random() < 0.7:          # the first query always reads the store
            threshold = rng.randint(-1, 6)
            terms.append(f"(SELECT value FROM stream_cells WHERE cell = {accepting}.k) <= {threshold}")
        if rng.random() < 0.3:
            terms.append(f"NOT EXISTS (SELECT * FROM stream_cells WHERE cell = {accepting}.x)")
        where = f"WHERE {' AND '.join(terms)}" if terms else ""
        within = f"WITHIN {rng.randint(3, 15)} sec" if rng.random() < 0.8 else ""
        matching = "MATCHING SKIP TILL NEXT MATCH" if rng.random() < 0.4 else ""
        statements.append(f"CREATE QUERY Q{number} PATTERN SEQ({', '.join(items)}) {where} {within} {matching} "
                          f"RETURN {accepting}.k, {accepting}.x")
        for rule in range(rng.randint(1 if number == 0 else 0, 2)):
            action = rng.choice([
                "UPDATE stream_cells SET value = value + NEW.x WHERE cell = NEW.k",
                "UPDATE stream_cells SET value = value - 1, note = 'dec' WHERE cell = NEW.x",
                "INSERT INTO stream_alerts (worker, at) VALUES ('q', NEW.x)",
                "DELETE FROM stream_cells WHERE cell = NEW.x",
            ])
            when = " WHEN (SELECT value FROM stream_cells WHERE cell = NEW.k) < 4" if rng.random() < 0.3 else ""
            statements.append(f"CREATE RULE R{number}_{rule} ON OUTPUT Q{number}{when} "
                              f"PRIORITY {rng.randint(0, 2)} BEGIN {action} END")
    return ";\n".join(statements)


def random_events(rng: random.Random, count: int) -> list[streams.StreamEvent]:
    events, ts = [], 0
    for _ in range(count):
        ts += rng.choice((0, 1, 1, 2, 4))
        events.append(streams.StreamEvent(rng.choice(TYPES), ts, {"k": rng.randrange(4), "x": rng.randrange(6)}))
    return events


def reset(db) -> None:
    with db.engine.begin() as connection:
        connection.execute(sa.text("TRUNCATE stream_cells, stream_alerts, activedb_stream_state"))
        connection.execute(sa.text("INSERT INTO stream_cells (cell, value) SELECT g, 0 FROM generate_series(0, 5) g"))


def snapshot(db, outputs) -> tuple:
    with db.engine.connect() as connection:
        cells = connection.execute(sa.text("SELECT cell, value, note FROM stream_cells ORDER BY cell")).all()
        alerts = connection.execute(sa.text("SELECT worker, at FROM stream_alerts ORDER BY id")).all()
    # Alert ids come from cached sequence blocks (not in application order across TRUNCATE): compare as multisets.
    return ([tuple(row) for row in cells], sorted(tuple(row) for row in alerts),
            [(output.query, output.ts, dict(output.attributes)) for output in outputs])


def engine_for(db, text: str, name: str) -> streams.StreamEngine:
    engine = streams.StreamEngine(db, name=name, record_history=True)
    engine.create_stream("s", types=TYPES, attributes=("k", "x"), priorities={"N": 1})
    engine.define(text)
    return engine


@pytest.mark.parametrize("case", range(CASES))
def test_random_sei_histories_pass_definition_6(db, case):
    rng = random.Random(SEED * 1000 + case)
    text = random_definitions(rng)
    events = random_events(rng, 80)

    reset(db)
    sorted_engine = engine_for(db, text, f"random-sorted-{case}")
    result = sorted_engine.feed(events, punctuation=streams.END_OF_STREAM)
    report = check_stream_history(sorted_engine.history.snapshot())
    assert report.ok, f"{text}\n{report.violations[:3]}"
    assert report.reads > 0 and sorted_engine.statistics().store_reads == report.reads
    expected = snapshot(db, list(result.outputs))

    reset(db)
    batched = engine_for(db, text, f"random-batched-{case}")
    arrival = [event for _, event in sorted(((index + rng.uniform(0, 6), event) for index, event in enumerate(events)),
                                            key=lambda item: item[0])]
    outputs, seen = [], None
    for start in range(0, len(arrival), 16):
        batch = arrival[start:start + 16]
        with sa_transaction(db) as tx:
            outputs.extend(batched.process(tx, batch, punctuation=None if seen is None else seen - 30).outputs)
        seen = max([seen or 0] + [event.ts for event in batch])
    outputs.extend(batched.feed([], punctuation=streams.END_OF_STREAM).outputs)
    assert snapshot(db, outputs) == expected, text
    check_stream_history(batched.history.snapshot()).assert_ok()


def sa_transaction(db):
    return db.transaction(name="random-batch")
