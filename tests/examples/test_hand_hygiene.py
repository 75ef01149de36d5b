"""The hand-hygiene application (HyReminder, from Active CEP §1) on a real PostgreSQL.

* hand-written badge sequences drive exact final statuses, audit trails, alerts and
  badge lights, read back from PostgreSQL;
* the detached notification and the exclusive causally dependent compensation happen
  exactly when their modes say: the notification whenever an alert is raised, even if
  the stream transaction later aborts; the compensation exactly for the events whose
  processing aborted (a rejected event, or every event of an aborted transaction);
* ``run_demo`` through Spark Structured Streaming gives the state of the same application fed
  directly (the demo without Spark: ``test_hand_hygiene_queries.py``).
"""

from __future__ import annotations

import json
import random
import re

import pytest

import activedb

from activedb.examples.hand_hygiene import MIGRATIONS
from activedb.examples.hand_hygiene.app import COLORS, register, reset_tables
from activedb.examples.hand_hygiene.demo import run_demo
from activedb.examples.hand_hygiene.events import apply_directly, generate
from tests.examples._story import STORY, badge, rows

WAIT = 60


# The test kit's plugin makes the module's database (activedb_db) with the app's tables.
pytestmark = pytest.mark.activedb(migrations=[MIGRATIONS])


@pytest.fixture(scope="module")
def hygiene(activedb_db):
    rules = register(activedb_db)
    return activedb_db, rules


@pytest.fixture
def app(hygiene):
    db, rules = hygiene
    db.rules.wait_idle(WAIT)
    reset_tables(db)
    return db


def statuses(db) -> dict[str, str]:
    return dict(rows(db, "SELECT worker, status FROM worker_status"))


def counters(db, name: str):
    return db.rules.statistics().per_rule.get(name)


SEQUENCE = STORY


def test_badge_events_drive_the_statuses(app):
    db = app
    arrival = list(SEQUENCE)
    random.Random(5).shuffle(arrival)                 # arrival order is not timestamp order
    compensate = {name: counters(db, f"compensate_{name}") for name in ("enter", "exit", "sanitize", "mask")}
    before = {name: (c.executed, c.cancelled) if c else (0, 0) for name, c in compensate.items()}

    result = apply_directly(db, arrival, chunk_size=4)
    db.rules.wait_idle(WAIT)

    assert result.events == len(SEQUENCE) and result.applied == len(SEQUENCE) - 2 and result.chunks == 10
    assert sorted((r.event["worker"], r.event["type"], r.event["ts"]) for r in result.rejected) == [
        ("w8", "enter", 5.0), ("w9", "exit", 12.0)]
    assert any("places him in room1" in r.reason for r in result.rejected)
    assert statuses(db) == {"w1": "violation", "w2": "safe", "w3": "safe", "w4": "safe", "w5": "warning",
                            "w6": "safe", "w7": "safe", "w8": "safe", "w9": "safe"}
    assert dict(rows(db, "SELECT worker, changes FROM worker_status")) == {
        "w1": 2, "w2": 0, "w3": 0, "w4": 0, "w5": 1, "w6": 2, "w7": 3, "w8": 0, "w9": 2}
    assert dict(rows(db, "SELECT worker, room FROM worker_status WHERE room IS NOT NULL")) == {
        "w2": "room2", "w3": "room2", "w4": "room3", "w9": "room2"}
    # the deferred audit: every transition, in application time
    assert rows(db, "SELECT worker, old_status, new_status, event, at FROM status_changes ORDER BY worker, at") == [
        ("w1", "safe", "warning", "enter", 10.0), ("w1", "warning", "violation", "exit", 15.0),
        ("w5", "safe", "warning", "enter", 10.2),
        ("w6", "safe", "warning", "enter", 10.3), ("w6", "warning", "safe", "sanitize", 12.3),
        ("w7", "safe", "warning", "enter", 10.4), ("w7", "warning", "violation", "exit", 15.4),
        ("w7", "violation", "safe", "sanitize", 20.0),
        ("w9", "safe", "warning", "enter", 10.7), ("w9", "warning", "safe", "sanitize", 14.0),
    ]
    # the deferred alert: exactly the violations
    assert rows(db, "SELECT worker, kind, at FROM alerts ORDER BY at") == [
        ("w1", "violation", 15.0), ("w7", "violation", 15.4)]
    # detached notification and sequential causally dependent report: one each per alert
    assert rows(db, "SELECT channel, worker, at FROM notifications ORDER BY channel, at") == [
        ("badge", "w1", 15.0), ("badge", "w7", 15.4),
        ("infection_control", "w1", 15.0), ("infection_control", "w7", 15.4)]
    # detached causally dependent badge lights: one command per committed change, last one = status
    assert len(rows(db, "SELECT id FROM badge_lights")) == 10
    latest = dict(rows(db, "SELECT DISTINCT ON (worker) worker, color FROM badge_lights ORDER BY worker, at DESC"))
    assert latest == {worker: COLORS[status] for worker, status in statuses(db).items() if worker in latest}
    assert set(latest) == {"w1", "w5", "w6", "w7", "w9"}
    # exclusive causally dependent compensation: exactly the two rejected events, nothing else
    assert rows(db, "SELECT worker, event, at FROM compensations ORDER BY at") == [
        ("w8", "enter", 5.0), ("w9", "exit", 12.0)]
    after = {name: (counters(db, f"compensate_{name}").executed, counters(db, f"compensate_{name}").cancelled)
             for name in before}
    fired = {kind: sum(1 for event in SEQUENCE if event["type"] == kind) for kind in before}
    assert {name: after[name][0] - before[name][0] for name in before} == {
        "enter": 1, "exit": 1, "sanitize": 0, "mask": 0}
    assert {name: after[name][1] - before[name][1] for name in before} == {
        "enter": fired["enter"] - 1, "exit": fired["exit"] - 1, "sanitize": fired["sanitize"], "mask": fired["mask"]}


def test_late_and_malformed_events_abort_only_themselves(app):
    db = app
    first = apply_directly(db, [badge("enter", "w1", 100.0, "room1"), badge("sanitize", "w2", 100.0)])
    assert first.applied == 2 and not first.rejected
    late = apply_directly(db, [badge("exit", "w1", 50.0, "room1"), {"type": "exit", "ts": 60.0, "room": "room1"},
                               badge("mask", "w2", 101.0)])
    db.rules.wait_idle(WAIT)
    assert late.applied == 1
    reasons = sorted(rejection.reason for rejection in late.rejected)
    assert len(reasons) == 2
    assert "older than his last applied event" in reasons[1] and "without a worker id" in reasons[0]
    assert rows(db, "SELECT worker, room, last_event, last_ts FROM worker_status ORDER BY worker") == [
        ("w1", "room1", "enter", 100.0), ("w2", None, "mask", 101.0)]
    # the late event was processed and aborted: compensated; the malformed one never started a transaction
    assert rows(db, "SELECT worker, event, at FROM compensations") == [("w1", "exit", 50.0)]


VIOLATION_OF_W10 = [badge("enter", "w10", 0.0, "room1"), badge("exit", "w10", 2.0, "room1"),
                    badge("enter", "w10", 10.0, "room2"), badge("exit", "w10", 15.0, "room2")]


def test_when_the_stream_transaction_aborts(app):
    """Detached: the badge reminder is sent anyway.  Detached/sequential causally dependent: the light
    and the incident report never happen.  Exclusive causally dependent: every event is compensated."""
    db = app

    class StreamFailure(Exception):
        pass

    with pytest.raises(StreamFailure):
        with db.transaction(name="failing-chunk") as tx:
            for event in VIOLATION_OF_W10:
                with tx.subtransaction() as sub:
                    sub.emit(event["type"], key=event["worker"], ts=event["ts"], payload={"room": event["room"]})
            assert tx.read("worker_status", "w10")["status"] == "violation"    # seen inside, before the abort
            raise StreamFailure("the micro-batch failed after the violation was detected")
    db.rules.wait_idle(WAIT)

    assert statuses(db) == {}
    assert rows(db, "SELECT count(*) FROM alerts") == [(0,)]
    assert rows(db, "SELECT count(*) FROM status_changes") == [(0,)]
    assert rows(db, "SELECT count(*) FROM badge_lights") == [(0,)]
    assert rows(db, "SELECT channel, worker, at FROM notifications") == [("badge", "w10", 15.0)]
    assert rows(db, "SELECT worker, event, at FROM compensations ORDER BY at") == [
        ("w10", event["type"], event["ts"]) for event in VIOLATION_OF_W10]


def test_the_same_events_committed(app):
    db = app
    result = apply_directly(db, VIOLATION_OF_W10)
    db.rules.wait_idle(WAIT)
    assert result.applied == 4 and statuses(db) == {"w10": "violation"}
    assert rows(db, "SELECT channel, worker FROM notifications ORDER BY channel") == [
        ("badge", "w10"), ("infection_control", "w10")]
    assert rows(db, "SELECT color FROM badge_lights ORDER BY at") == [("yellow",), ("red",)]
    assert rows(db, "SELECT count(*) FROM compensations") == [(0,)]


def test_generator_is_deterministic():
    stream = generate(5, 300, seed=11)
    assert stream == generate(5, 300, seed=11) and stream != generate(5, 300, seed=12)
    assert len(stream) == 300
    assert all(set(event) == {"type", "worker", "ts", "room"} for event in stream)
    assert {event["type"] for event in stream} == {"enter", "exit", "sanitize", "mask"}
    assert any(later["ts"] < earlier["ts"] for earlier, later in zip(stream, stream[1:]))   # disordered arrival


# run_demo end to end without Spark (the query-based app): tests/examples/test_hand_hygiene_queries.py.


def test_demo_writes_event_files_for_activedb_run(tmp_path):
    from click.testing import CliRunner

    from activedb.cli import main

    result = CliRunner().invoke(main, ["demo", "--write-events", str(tmp_path / "events"), "--events", "250"])
    assert result.exit_code == 0, result.output
    files = sorted((tmp_path / "events").glob("*.json"))
    lines = [line for path in files for line in path.read_text().splitlines()]
    assert len(files) == 3 and len(lines) == 250
    assert [json.loads(line) for line in lines] == generate(12, 250, 7)
    assert "activedb run activedb.examples.hand_hygiene.app --source file:" in " ".join(result.output.split())


@pytest.mark.spark
def test_run_demo_through_spark_matches_the_direct_path(app, activedb_url, activedb_make_url, spark, capsys):
    """The Spark feed gives the state the same application gives without Spark: the pattern queries
    through ``ingest(…, handler=QueriesHandler(engine))``, whose dead letters (the run's ledger id, those released at the
    end of the stream included) are the rejected events."""
    db = app
    through_spark = run_demo(url=activedb_url, events=120, workers=4, seed=5, use_spark=True)
    output = " ".join(capsys.readouterr().out.split())      # rich wraps long lines
    assert through_spark.path == "spark"
    assert "batches committed (last batch id 3)" in output and "4 micro-batches" in output
    spark_compensations = rows(db, "SELECT count(*) FROM compensations")
    assert through_spark.statuses == statuses(db)
    direct = run_demo(url=activedb_make_url(), events=120, workers=4, seed=5, use_spark=False)
    assert through_spark.statuses == direct.statuses
    assert spark_compensations == [(direct.rejected,)]
    assert f"Dead letters of this run (activedb_dead_letters): {direct.rejected}, of them 0 late" in output
    # every number about the run agrees with its ledger, which accounts for every row (the release included)
    fed = re.search(r"stream transactions committed \(\d+ released at the end of the stream\), (\d+) dead letters",
                    output)
    held = re.search(r"(\d+) events, (\d+) dead letters — (\d+) of the 120 rows", output)
    assert fed and held, output[-3000:]
    assert int(fed.group(1)) == int(held.group(2)) == direct.rejected and int(held.group(3)) == 120


def test_a_batch_after_the_tables_were_reset_equals_a_fresh_run(app, activedb_make_url):
    """The benchmark's pattern: ``reset_tables`` (TRUNCATE … RESTART IDENTITY) between two runs on one
    engine, whose cached generated keys predate the reset.  A batch that needs more keys than were cached
    must not collide with its own (it is re-run with fresh ones): the result equals a fresh engine's."""
    from spark_bridge import IngestSink
    from activedb.examples.hand_hygiene.app import MAPPING

    db = app
    events = generate(20, 1500, 3)
    IngestSink(db, MAPPING, query_name="first").process(events[:40], 0, query_id="first@x")
    db.rules.wait_idle(WAIT)
    reset_tables(db)
    outcome = IngestSink(db, MAPPING, query_name="again").process(events, 0, query_id="again@x")
    db.rules.wait_idle(WAIT)
    fresh = activedb.connect(activedb_make_url())
    try:
        fresh.upgrade_app(MIGRATIONS)
        register(fresh)
        reference = IngestSink(fresh, MAPPING, query_name="again").process(events, 0, query_id="again@x")
        fresh.rules.wait_idle(WAIT)
        assert (outcome.events, outcome.dead_letters) == (reference.events, reference.dead_letters)
        query = ("SELECT worker, status, changes FROM worker_status ORDER BY worker",
                 "SELECT worker, new_status, at FROM status_changes ORDER BY worker, at",
                 "SELECT worker, color, at FROM badge_lights ORDER BY worker, at",
                 "SELECT worker, channel, at FROM notifications ORDER BY worker, channel, at",
                 "SELECT worker, event, at FROM compensations ORDER BY worker, at")
        for sql in query:
            assert rows(db, sql) == rows(fresh, sql), sql
    finally:
        fresh.close()


def test_demo_write_events_into_a_folder_that_holds_files_is_refused_and_writes_nothing(tmp_path):
    """A second ``--write-events`` into the same folder appended its files to the first one's and said "into 3 files"
    while the folder held 6, and the `run` it suggested read both copies (every event of the second late: dead
    letters). A folder that holds anything is refused, nothing written; an empty one (made by the user) is taken."""
    from click.testing import CliRunner

    from activedb.cli import main

    events = tmp_path / "events"
    events.mkdir()
    first = CliRunner().invoke(main, ["demo", "--write-events", str(events), "--events", "250"])
    assert first.exit_code == 0, first.output
    before = {path.name: path.read_bytes() for path in events.iterdir()}
    assert len(before) == 3
    again = CliRunner().invoke(main, ["demo", "--write-events", str(events), "--events", "250"])
    output = " ".join(again.output.split())
    assert again.exit_code == 1, output
    assert output.startswith(f"activedb: error: cannot write the events into {events}: it holds 3 files"), output
    assert "give an empty or new folder" in output and "activedb run" in output, output
    assert {path.name: path.read_bytes() for path in events.iterdir()} == before
