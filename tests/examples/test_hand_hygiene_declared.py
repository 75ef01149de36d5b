"""The hand-hygiene application as declared rules (``activedb.examples.hand_hygiene.declared``) leaves the
tables the rule version (``app.py``, every coupling mode) and the PL/pgSQL peer of ``activedb bench ingest``
leave, on the same badge events with their glitches and late arrivals: lowered on the sink (one batch of state
transactions per micro-batch, with INSERT operations), and fired event by event.  Real PostgreSQL; no Spark
(``IngestSink.process``)."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

import activedb
from activedb.examples.hand_hygiene import MIGRATIONS, app, declared
from activedb.examples.hand_hygiene.events import generate
from activedb.ingest import RulesHandler
from benchmarks import MIGRATIONS as BENCH_MIGRATIONS
from spark_bridge import EventMapping, IngestSink

WAIT = 120
MAPPING = EventMapping("type", "worker", "ts", payload_columns=("room",))


# The test kit's plugin makes the module's database (activedb_url) with the app's tables and the PL/pgSQL peer's
# (hh_badge_events and its trigger).
pytestmark = pytest.mark.activedb(migrations=[MIGRATIONS, BENCH_MIGRATIONS])


@pytest.fixture(scope="module")
def url(activedb_url):
    return activedb_url


def _state(database, *, texts: bool = False) -> dict[str, list[tuple]]:
    """The application's tables, generated ids left out (and the texts that carry them unless ``texts``)."""
    queries = {
        "worker_status": "SELECT * FROM worker_status",
        "alerts": "SELECT worker, kind, at FROM alerts",
        "status_changes": "SELECT worker, old_status, new_status, event, at FROM status_changes",
        "badge_lights": "SELECT worker, color, status, at FROM badge_lights",
        "notifications": "SELECT worker, channel, at" + (", message" if texts else "") + " FROM notifications"
                         + (" WHERE channel = 'badge'" if texts else ""),
        "compensations": "SELECT worker, event, at" + (", reason" if texts else "") + " FROM compensations",
    }
    with database.engine.connect() as connection:
        return {table: sorted(tuple(row) for row in connection.execute(sa.text(query)))
                for table, query in queries.items()}


def _batches(seed: int) -> list[list[dict]]:
    events = generate(12, 900, seed)
    return [events[start:start + 300] for start in range(0, len(events), 300)]


def _through_sink(database, batches, query: str, *, lower: bool = True, prefetch=None) -> list[bool]:
    sink = IngestSink(database, MAPPING, query_name=query, handler=RulesHandler(prefetch, lower_declared=lower))
    lowered = []
    try:
        for number, rows in enumerate(batches):
            assert sink.process(rows, number, query_id=f"{query}@test").committed
            lowered.append(sink.handler.last_lowered is not None)
    finally:
        sink.close()
    database.rules.wait_idle(WAIT)
    return lowered


def _through_peer(database, batches) -> None:
    """Each batch in one transaction, its rows in time order into hh_badge_events (the row trigger applies them)."""
    with database.engine.begin() as connection:
        connection.execute(sa.text("TRUNCATE hh_badge_events"))
    for rows in batches:
        with database.engine.begin() as connection:
            connection.execute(sa.text("INSERT INTO hh_badge_events (type, worker, ts, room) "
                                       "VALUES (:type, :worker, :ts, :room)"),
                               sorted(rows, key=lambda row: row["ts"]))


@pytest.mark.parametrize("seed", [3, 11])
def test_the_declared_app_leaves_the_tables_of_the_rule_app_and_of_the_plpgsql_peer(url, seed):
    batches = _batches(seed)
    rules_db, declared_db = activedb.connect(url), activedb.connect(url, rule_execution="inline")
    try:
        app.register(rules_db)
        declared.register(declared_db)

        app.reset_tables(rules_db)
        _through_sink(rules_db, batches, f"rules-{seed}", prefetch=app.PREFETCH)
        by_rules, by_rules_texts = _state(rules_db), _state(rules_db, texts=True)

        app.reset_tables(declared_db)
        assert _through_sink(declared_db, batches, f"declared-{seed}") == [True, True, True]
        lowered, lowered_texts = _state(declared_db), _state(declared_db, texts=True)

        app.reset_tables(declared_db)
        assert _through_sink(declared_db, batches, f"by-event-{seed}", lower=False) == [False, False, False]
        by_event, by_event_texts = _state(declared_db), _state(declared_db, texts=True)

        app.reset_tables(declared_db)
        _through_peer(declared_db, batches)
        by_peer = _state(declared_db)
    finally:
        rules_db.close()
        declared_db.close()
    assert by_rules["alerts"] and by_rules["compensations"] and by_rules["status_changes"]   # every path taken
    assert lowered == by_rules == by_peer
    assert lowered_texts == by_rules_texts
    assert by_event == lowered and by_event_texts == lowered_texts


def test_an_incident_report_names_its_alert_by_time(url):
    """What differs from the rule version: the alert's id is the store's to draw at commit, so the incident
    report names the alert by its time."""
    database = activedb.connect(url, rule_execution="inline")
    try:
        declared.register(database)
        app.reset_tables(database)
        rows = [{"type": "exit", "worker": "w1", "ts": 1.0, "room": "r1"},       # (rejected: not in r1)
                {"type": "enter", "worker": "w1", "ts": 2.0, "room": "r1"},
                {"type": "exit", "worker": "w1", "ts": 3.0, "room": "r1"},
                {"type": "enter", "worker": "w1", "ts": 4.0, "room": "r2"},      # warning
                {"type": "exit", "worker": "w1", "ts": 9.5, "room": "r2"}]       # violation
        assert _through_sink(database, [rows], "incident") == [True]
        with database.engine.connect() as connection:
            reports = connection.execute(sa.text(
                "SELECT message FROM notifications WHERE channel = 'infection_control'")).scalars().all()
            statuses = connection.execute(sa.text("SELECT status, changes FROM worker_status")).all()
            compensated = connection.execute(sa.text("SELECT event, at FROM compensations")).all()
    finally:
        database.close()
    assert reports == ["incident: w1 in hygiene violation at t=9.5 (alert of t=9.5)"]
    assert statuses == [("violation", 2)] and compensated == [("exit", 1.0)]


def test_it_is_an_application_activedb_run_can_load():
    """``activedb run activedb.examples.hand_hygiene.declared --source file:DIR`` finds what it needs."""
    from activedb.cli.application import load_app

    loaded = load_app("activedb.examples.hand_hygiene.declared", require_mapping=True)
    assert loaded.register is declared.register and loaded.reset is declared.reset
    assert loaded.mapping.type_column == "type" and loaded.schema == app.SCHEMA and loaded.migrations == MIGRATIONS
