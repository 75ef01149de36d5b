"""The hand-hygiene application as pattern queries (``activedb.examples.hand_hygiene.queries``) on a real
PostgreSQL: Q1/R1 as the paper prints them, hand-written badge sequences through the stream engine in
disordered micro-batches (exact statuses, audit trail, alerts, badge lights, compensations, dead
letters, per-query outputs), and ``run_demo`` end to end without Spark, its story checked against the
database.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import sqlalchemy as sa

from activedb import streams
from activedb.examples.hand_hygiene import MIGRATIONS, queries
from activedb.examples.hand_hygiene.demo import run_demo
from tests.examples._story import STORY, badge, rows

WAIT = 60
README = Path(__file__).resolve().parents[2] / "activedb" / "streams" / "README.md"


# The test kit's plugin makes the module's database (activedb_db) with the app's tables.
pytestmark = pytest.mark.activedb(migrations=[MIGRATIONS])


@pytest.fixture(scope="module")
def hygiene(activedb_db):
    rules = queries.register_rules(activedb_db)
    return activedb_db, rules


@pytest.fixture
def engine(hygiene):
    db, _ = hygiene
    db.rules.wait_idle(WAIT)
    engine = queries.make_engine(db)
    queries.reset(db, engine)
    return engine


def test_q1_and_r1_are_the_papers_text():
    """Q1/R1 in queries.py is the text of Active CEP §3.1 as the streams README prints it (and runs it)."""
    readme = README.read_text()
    printed = re.search(r'engine\.define\("""\n(.*?)"""\)', readme, re.S).group(1)
    assert printed.startswith("CREATE QUERY Q1 ON estream\nPATTERN SEQ(EXIT, !SANITIZE, ENTER)")
    assert queries.Q1_R1.strip() == printed.strip()


def test_the_engine_defines_the_edges(hygiene):
    db, _ = hygiene
    engine = queries.make_engine(db, durable=False)
    assert set(engine.queries) == {"Q1", "Q2", "Q3", "Q4", "SEEN_ENTER", "SEEN_EXIT", "SEEN_SANITIZE", "SEEN_MASK"}
    assert {name: rule.query for name, rule in engine.rules.items() if rule.query.startswith("Q")} == {
        "R1": "Q1", "R2": "Q2", "R3": "Q3", "R4": "Q4"}
    reference = streams.StreamEngine(db, name="reference", durable=False, aliases=queries.ALIASES)
    reference.create_stream("estream", types=queries.EVENT_TYPES, attributes=queries.ATTRIBUTES)
    reference.define(queries.Q1_R1)
    assert engine.queries["Q1"].definition == reference.queries["Q1"].definition
    assert engine.rules["R1"].definition == reference.rules["R1"].definition


SEQUENCE = STORY + [
    # w10 — masked too early (more than 5 s before leaving): Q2 does not match, Q4 escalates.
    badge("enter", "w10", 0.8, "room1"), badge("exit", "w10", 2.8, "room1"), badge("enter", "w10", 10.8, "room2"),
    badge("mask", "w10", 11.0, "room2"), badge("exit", "w10", 17.0, "room2"),
]


def test_badge_events_drive_the_statuses_through_the_queries(hygiene, engine):
    db, _ = hygiene
    ordered = sorted(SEQUENCE, key=lambda event: event["ts"])
    # Arrival order is not timestamp order: every block of three arrives reversed (disorder within the delay).
    arrival = [event for start in range(0, len(ordered), 3) for event in reversed(ordered[start:start + 3])]
    assert arrival != ordered
    result = queries.feed(db, engine, arrival, chunk_size=8, delay=10.0)
    db.rules.wait_idle(WAIT)

    assert result.events == len(SEQUENCE) and result.batches == 7
    assert (result.processed, result.failed) == (len(SEQUENCE) - 2, 2)
    assert sorted(letter.event.describe() for letter in result.dead_letters) == ["ENTER^5", "EXIT^12"]
    assert dict(rows(db, "SELECT worker, status FROM worker_status")) == {
        "w1": "violation", "w2": "safe", "w3": "safe", "w4": "safe", "w5": "safe", "w6": "safe", "w7": "safe",
        "w8": "safe", "w9": "safe", "w10": "violation"}
    assert dict(rows(db, "SELECT worker, room FROM worker_status WHERE room IS NOT NULL")) == {
        "w2": "room2", "w3": "room2", "w4": "room3", "w9": "room2"}
    # the deferred audit (announced by the immediate rule on worker_status): every transition, in application time
    assert rows(db, "SELECT worker, old_status, new_status, event, at FROM status_changes ORDER BY worker, at") == [
        ("w1", "safe", "warning", "enter", 10.0), ("w1", "warning", "violation", "exit", 15.0),
        ("w10", "safe", "warning", "enter", 10.8), ("w10", "warning", "violation", "exit", 17.0),
        ("w5", "safe", "warning", "enter", 10.2), ("w5", "warning", "safe", "exit", 15.2),
        ("w6", "safe", "warning", "enter", 10.3), ("w6", "warning", "safe", "sanitize", 12.3),
        ("w7", "safe", "warning", "enter", 10.4), ("w7", "warning", "violation", "exit", 15.4),
        ("w7", "violation", "safe", "sanitize", 20.0),
        ("w9", "safe", "warning", "enter", 10.7), ("w9", "warning", "safe", "sanitize", 14.0),
    ]
    assert rows(db, "SELECT worker, kind, at FROM alerts ORDER BY at") == [
        ("w1", "violation", 15.0), ("w7", "violation", 15.4), ("w10", "violation", 17.0)]
    assert rows(db, "SELECT channel, worker FROM notifications ORDER BY channel, at") == [
        ("badge", "w1"), ("badge", "w7"), ("badge", "w10"),
        ("infection_control", "w1"), ("infection_control", "w7"), ("infection_control", "w10")]
    latest = dict(rows(db, "SELECT DISTINCT ON (worker) worker, color FROM badge_lights ORDER BY worker, at DESC"))
    assert latest == {"w1": "red", "w10": "red", "w5": "green", "w6": "green", "w7": "green", "w9": "green"}
    # exclusive causally dependent: exactly the two rejected readings, whose s-transactions aborted
    assert rows(db, "SELECT worker, event, at FROM compensations ORDER BY at") == [
        ("w8", "enter", 5.0), ("w9", "exit", 12.0)]
    assert rows(db, "SELECT count(*) FROM activedb_dead_letters WHERE query_id = 'streams:hand_hygiene'") == [(2,)]
    outputs = {name: counters.outputs for name, counters in engine.statistics().per_query.items()}
    assert {name: outputs[name] for name in ("Q1", "Q2", "Q3", "Q4")} == {"Q1": 6, "Q2": 1, "Q3": 3, "Q4": 5}


def test_a_late_event_is_a_dead_letter_naming_the_punctuation(hygiene, engine):
    db, _ = hygiene
    first = queries.feed(db, engine, [badge("enter", "w1", 100.0, "room1"), badge("exit", "w1", 110.0, "room1")],
                         chunk_size=1, delay=0.0)
    assert first.processed == 2 and not first.dead_letters
    late = queries.feed(db, engine, [badge("sanitize", "w1", 50.0)])
    db.rules.wait_idle(WAIT)
    assert late.processed == 0 and len(late.dead_letters) == 1
    assert "punctuation" in late.dead_letters[0].reason
    assert rows(db, "SELECT last_event, last_ts FROM worker_status") == [("exit", 110.0)]
    assert rows(db, "SELECT count(*) FROM compensations") == [(0,)]     # never ran: nothing to compensate


def test_run_demo_with_the_queries_tells_what_the_database_holds(activedb_make_url, capsys):
    url = activedb_make_url()
    summary = run_demo(url=url, events=150, workers=5, seed=3, use_spark=False)
    output = " ".join(capsys.readouterr().out.split())          # rich wraps long lines
    assert summary.path == "direct" and summary.events == 150
    engine = sa.create_engine(url)
    try:
        with engine.connect() as connection:
            statuses = dict(connection.execute(sa.text("SELECT worker, status FROM worker_status")).all())
            transitions = connection.execute(sa.text(
                "SELECT old_status, new_status, event, count(*) FROM status_changes GROUP BY 1, 2, 3")).all()
            compensations = connection.execute(sa.text("SELECT count(*) FROM compensations")).scalar_one()
            letters = connection.execute(sa.text(
                "SELECT count(*) FROM activedb_dead_letters WHERE query_id = 'streams:hand_hygiene'")).scalar_one()
    finally:
        engine.dispose()
    assert summary.statuses == statuses and len(statuses) == 5
    assert compensations == summary.rejected == letters
    assert transitions
    for old, new, event, count in transitions:
        label, _, _ = queries.EDGES[(old, new, event)]
        assert f"{count} × {old} → {new} on {event} — {label}" in output
        assert summary.per_query[label.split("/")[0]] >= count
    warned = sum(count for old, new, _, count in transitions if (old, new) == ("safe", "warning"))
    assert warned <= summary.per_query["Q1"]
    for name in ("Q1", "Q2", "Q3", "Q4"):
        assert re.search(rf"│? ?{name} .*? {summary.per_query[name]} │?", output)
    assert "L_query" in output and "L_rule" in output
    for worker, status in statuses.items():
        assert worker in output and status in output
    positions = [output.index(text) for text in ("Hand hygiene in a hospital", "what happened to the workers",
                                                 "under the hood", "pattern queries", "rule firings per coupling mode")]
    assert positions == sorted(positions)
    assert "exclusive_causally_dependent" in output and "compensate_rejected_badge" in output


def test_the_demos_dead_letters_replay_through_the_rule_based_app(activedb_make_url):
    """What the demo's dead letters say to do works: they are the badge rows they were, and `activedb
    dead-letters replay activedb.examples.hand_hygiene.app` takes them (event types as the app spells them)."""
    import activedb
    from click.testing import CliRunner

    from activedb.cli import main
    from activedb.examples.hand_hygiene.events import generate

    url = activedb_make_url()
    db = activedb.connect(url)
    try:
        db.upgrade_app(MIGRATIONS)
        queries.register_rules(db)
        engine = queries.make_engine(db, record_dead_letters=False)       # as the demo builds it
        queries.reset(db, engine)
        result = queries.feed(db, engine, generate(6, 150, 11, disorder_rate=0.2))
        db.rules.wait_idle(WAIT)
        letters = rows(db, "SELECT raw FROM activedb_dead_letters WHERE query_id = 'streams:hand_hygiene'")
    finally:
        db.close()
    assert len(letters) == len(result.dead_letters) > 0, "the workload must leave dead letters to replay"
    assert all(raw["type"] in ("enter", "exit", "sanitize", "mask") and set(raw) == {"type", "worker", "ts", "room"}
               for (raw,) in letters), letters[:3]

    replayed = CliRunner().invoke(main, ["--url", url, "dead-letters", "replay", "activedb.examples.hand_hygiene.app",
                                         "--query", "streams:hand_hygiene"])
    assert replayed.exit_code == 0, replayed.output
    assert f"replayed {len(letters)} dead letter(s) as replay:streams:hand_hygiene" in replayed.output
    db = activedb.connect(url)
    try:
        again = rows(db, "SELECT reason FROM activedb_dead_letters WHERE query_id = 'replay:streams:hand_hygiene'")
    finally:
        db.close()
    assert not [reason for (reason,) in again if "type" in reason.lower() and "unknown" in reason.lower()], again


def test_run_demo_of_one_event_says_one_event_and_no_status_change(activedb_make_url, capsys):
    """With one event and one worker the story said "1 events in 1 micro-batch transactions", "1 are safe … (1
    workers)", and "Every status change below …:" followed by nothing, as no status changed."""
    run_demo(url=activedb_make_url(), events=1, workers=1, seed=3, use_spark=False)
    output = " ".join(capsys.readouterr().out.split())          # rich wraps long lines
    assert "fed 1 event in 1 micro-batch transaction and" in output, output
    assert "1 is safe" in output and "(1 worker)" in output, output
    assert "Every status change below" not in output, output
    assert "No worker's status changed" in output, output
    for wrong in ("1 events", "1 micro-batch transactions", "1 are ", "(1 workers)", "1 stream transactions",
                  "1 rows", "1 violations", "1 badge events", "of 1 workers"):
        # (a count of one, not the end of a larger number or a rate: "51 events/s" in the queries' throughput is fine)
        assert not re.search(rf"(?<![\d.,]){re.escape(wrong)}(?!/s)", output), (wrong, output)
