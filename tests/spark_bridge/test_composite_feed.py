"""Composition fed from micro-batches: the mapping names the interval and producer columns, heartbeats
flow through the same rows, and micro-batch boundaries (with rows shuffled inside each batch, as Spark
does not keep their order) never change a composition's result."""

from __future__ import annotations

import datetime as dt
import os
import random

import pytest

from activedb import composite
from spark_bridge import EventMapping
from activedb.composite._ingest import feed_batch, rows_to_items
from spark_bridge.errors import MappingError
from tests.composite._workload import generate, interleave, policy, reference

SEED = int(os.environ.get("ACTIVEDB_COMPOSITE_SEED", "1999"))
MAPPING = EventMapping("type", "k", "ts", producer_column="producer", accuracy_column="accuracy",
                       local_ts_column="local", heartbeat_type="heartbeat", payload_columns=["id", "true"])


def to_rows(arrivals) -> list[dict]:
    rows = []
    for item in arrivals:
        ts = item.ts
        row = {"producer": ts.producer, "ts": ts.reference, "accuracy": ts.upper - ts.reference, "local": ts.local}
        if isinstance(item, composite.Heartbeat):
            row.update(type="heartbeat", k=None, id=None, true=None)
        else:
            row.update(type=item.type, k=item["k"], id=item["id"], true=item["true"])
        rows.append(row)
    return rows


def engine_for(workload, consumption: str) -> composite.CompositionEngine:
    engine = composite.CompositionEngine(name="spark", clock=composite.ManualClock(), timeout=None,
                                         on_uncertain=policy(consumption))
    engine.create_stream("s", types=["A", "B"], attributes=["id", "true", "k"])
    engine.define(f"CREATE QUERY Q PATTERN SEQ(A, B) WHERE [k] CONSUMING {consumption.upper()} "
                  f"RETURN A.id AS a, B.id AS b")
    for producer, types in workload.producers.items():
        engine.join(producer, types=types)
    return engine


def test_mapping_validates_the_interval_fields():
    with pytest.raises(MappingError, match="need producer_column"):
        EventMapping("type", "k", "ts", accuracy_column="acc")
    with pytest.raises(MappingError, match="not both"):
        EventMapping("type", "k", "ts", producer_column="p", accuracy_column="a", accuracy_minus_column="m",
                     accuracy_plus_column="n")
    with pytest.raises(MappingError, match="go together"):
        EventMapping("type", "k", "ts", producer_column="p", accuracy_minus_column="m")
    with pytest.raises(MappingError, match="two purposes"):
        EventMapping("type", "k", "ts", producer_column="ts")
    assert MAPPING.payload_columns_for(["type", "k", "ts", "producer", "accuracy", "local", "x"]) == ("id", "true")
    assert EventMapping("t", "k", "ts", producer_column="p").payload_columns_for(["t", "k", "ts", "p", "x"]) == ("x",)


def test_rows_become_interval_events_and_heartbeats_with_reasons_for_bad_rows():
    rows = [{"type": "A", "k": 1, "ts": 10.0, "producer": "P0", "accuracy": 0.005, "local": 3.0, "id": "a", "true": 1},
            {"type": "heartbeat", "k": None, "ts": 11.0, "producer": "P0", "accuracy": 0.005, "local": None,
             "id": None, "true": None},
            {"type": "A", "k": 1, "ts": 10.0, "producer": "", "accuracy": 0.005, "local": None, "id": "x", "true": 1},
            {"type": "A", "k": 1, "ts": 10.0, "producer": "P0", "accuracy": -1, "local": None, "id": "y", "true": 1}]
    items, rejected = rows_to_items(rows, MAPPING)
    event, heartbeat = items
    assert event.ts.producer == "P0" and event.ts.local == 3.0
    assert event.ts.lower == dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(seconds=9.995)
    assert isinstance(heartbeat, composite.Heartbeat)
    assert [(item.position, item.reason.split(" is ")[0]) for item in rejected] == [
        (2, "producer ('producer')"), (3, "accuracy ('accuracy')")]


@pytest.mark.parametrize("case", range(4))
def test_micro_batch_boundaries_never_change_the_result(case):
    rng = random.Random(SEED + 100 + case)
    workload = generate(rng, producers=rng.randint(2, 4), events=rng.randint(10, 30), span=0.5)
    events = [item for items in workload.sequences.values() for item in items
              if not isinstance(item, composite.Heartbeat)]
    for consumption in ("chronicle", "recent"):
        expected = reference(events, operator="SEQ", consumption=consumption, partition=True)
        results = []
        for attempt in range(3):
            rows = to_rows(interleave(rng, workload))
            cuts = sorted(rng.sample(range(1, len(rows)), rng.randint(0, min(5, len(rows) - 1))))
            engine = engine_for(workload, consumption)
            produced = []
            for start, end in zip([0] + cuts, cuts + [len(rows)]):
                batch = rows[start:end]
                rng.shuffle(batch)                                # Spark keeps no order inside a batch
                result = feed_batch(engine, batch, MAPPING)
                assert result.rejected == ()
                produced += result.composites
            for producer in sorted(workload.producers):
                produced += engine.leave(producer)
            got = sorted(((item["a"], item["b"]), bool(item.resolutions)) for item in produced)
            assert got == expected, f"case {case} {consumption} attempt {attempt} (cuts {cuts})"
            results.append(got)
        assert results[0] == results[1] == results[2]


@pytest.mark.spark
def test_batches_from_spark(spark):
    rng = random.Random(SEED + 7)
    workload = generate(rng, producers=3, events=18, span=0.5, local=False)
    events = [item for items in workload.sequences.values() for item in items
              if not isinstance(item, composite.Heartbeat)]
    rows = to_rows(interleave(rng, workload))
    for row in rows:
        row["ts"] = dt.datetime.fromtimestamp(row["ts"], dt.timezone.utc)      # a TIMESTAMP column
    frame = spark.createDataFrame(rows, "producer STRING, ts TIMESTAMP, accuracy DOUBLE, local DOUBLE, type STRING, "
                                        "k LONG, id STRING, true DOUBLE")
    table = frame.toArrow()
    engine = engine_for(workload, "chronicle")
    produced = []
    for start in range(0, table.num_rows, 7):                  # three micro-batches
        produced += feed_batch(engine, table.slice(start, 7), MAPPING).composites
    for producer in sorted(workload.producers):
        produced += engine.leave(producer)
    got = sorted(((item["a"], item["b"]), bool(item.resolutions)) for item in produced)
    assert got == reference(events, operator="SEQ", consumption="chronicle", partition=True)
