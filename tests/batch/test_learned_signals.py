"""Plain rules that signal, lowered (``activedb/batch/README.md``, "Signals, deferred rules and inserted rows"): the
hand-hygiene application as users write it (``app.py``: immediate rules that signal, deferred rules on the signal that
insert alerts, detached-family rules on the signal and on the inserted alerts) runs a micro-batch as one batch of state
transactions, with the tables — generated ids and the texts naming them included —, ledger counts, rule counters and
detached outcomes of firing it event by event; what a batch cannot run as firing would falls back or is not lowered."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

import activedb
from activedb import Coupling, batch
from activedb.examples.hand_hygiene import MIGRATIONS, app
from activedb.examples.hand_hygiene.events import generate
from activedb.ingest import RulesHandler, feed

WAIT = 120
MAPPING = app.MAPPING
WORKERS, STATUS_CHANGED, SAFE = app.WORKERS, app.STATUS_CHANGED, app.SAFE    # (a rule names them as globals)
TABLES = {table: f"SELECT * FROM {table} ORDER BY 1" for table in app.APP_TABLES}


@pytest.fixture(scope="module")
def databases(make_database_url):
    """Two databases with the application's tables and rules: lowering on, lowering off."""
    made = []
    try:
        for suffix in ("signals_on", "signals_off"):
            database = activedb.connect(make_database_url(suffix, migrations=()))
            made.append(database)
            database.upgrade_app(MIGRATIONS)
            app.register(database)
        yield made
    finally:
        for database in made:
            database.close()


def tables(database) -> dict[str, list[tuple]]:
    with database.engine.connect() as connection:
        return {table: [tuple(row) for row in connection.execute(sa.text(query))] for table, query in TABLES.items()}


def counters(database) -> dict[str, tuple[int, ...]]:
    per_rule = database.rules.statistics().per_rule
    return {name: (c.fired, c.executed, c.failed, c.condition_false, c.cancelled) for name, c in per_rule.items()}


def run_both(databases, batches, source: str) -> list[bool]:
    """Feed ``batches`` into both databases (lowering on, off) from empty tables; per batch whether it was lowered.
    Asserts equal ledger outcomes per batch, then equal tables and rule counters once the detached family ran."""
    on, off = databases
    for database in databases:
        app.reset_tables(database)
    lowering, firing = RulesHandler(app.PREFETCH), RulesHandler(app.PREFETCH, lower_declared=False)
    lowered = []
    for number, rows in enumerate(batches):
        [outcome] = feed(on, [rows], source=source, mapping=MAPPING, handler=lowering, run="r")
        [reference] = feed(off, [rows], source=source, mapping=MAPPING, handler=firing, run="r")
        lowered.append(lowering.last_lowered is not None)
        assert (outcome.events, outcome.dead_letters, outcome.rule_firings) == (
            reference.events, reference.dead_letters, reference.rule_firings), number
    for database in databases:
        database.rules.wait_idle(WAIT)
    assert tables(on) == tables(off)
    assert counters(on) == counters(off)
    return lowered


def test_a_lowered_batch_leaves_nothing_of_itself_once_its_transaction_ended(make_database_url):
    """With the cyclic collector off, nothing of a lowered batch outlives its transaction: no reference cycle and no
    reference from the handler, the tree or the learned chains keeps its pending batch or its events — nor does the
    log record of a rejected event's rule, which this test's log capture keeps (it holds the error as text)."""
    import gc

    database = activedb.connect(make_database_url("garbage", migrations=()))
    enabled = gc.isenabled()
    try:
        database.upgrade_app(MIGRATIONS)
        app.register(database)
        handler = RulesHandler(app.PREFETCH)
        events = generate(10, 400, 7)
        feed(database, [events[:200]], source="hh-garbage", mapping=MAPPING, handler=handler, run="warm")
        gc.collect()
        gc.disable()
        kinds = (batch.PendingBatch, batch.BatchEvent)
        before = [found for found in gc.get_objects() if isinstance(found, kinds)]   # (other tests' in this process;
        known = {id(found) for found in before}                                     # held: no id is used again)
        [outcome] = feed(database, [events[200:]], source="hh-garbage", mapping=MAPPING, handler=handler, run="r")
        left = [type(found).__name__ for found in gc.get_objects() if isinstance(found, kinds)
                and id(found) not in known]
    finally:
        if enabled:
            gc.enable()
        database.close()
    assert handler.last_lowered == ("hh-garbage@r", 0) and outcome.committed, (handler.last_lowered, outcome)
    assert left == [], f"{len(left)} objects of the batch left: {sorted(set(left))}"


def test_the_hand_hygiene_rules_lower_with_the_tables_counters_and_detached_outcomes_of_firing(databases):
    events = generate(10, 600, 7)
    batches = [events[start:start + 200] for start in range(0, len(events), 200)]
    assert run_both(databases, batches, "hh") == [True, True, True]
    found = tables(databases[0])
    assert found["alerts"] and found["badge_lights"] and found["compensations"] and found["status_changes"]
    channels = {row[-1] for row in found["notifications"]}
    assert channels == {"badge", "infection_control"}, channels        # both rules on the inserted alerts ran
    for event_type in app.BADGE_EVENTS:
        assert batch.why_not_lowered(databases[0], event_type) is None


# --- what falls back, and what is not lowered ---------------------------------------------------------------

def signal_twice(tx, event):
    row = tx.read(WORKERS, event.key)
    tx.write(WORKERS, event.key, changes=(row or {"changes": 0})["changes"] + 1, status=SAFE)
    tx.signal(STATUS_CHANGED, worker=event.key, old=SAFE, new=SAFE, ts=1.0, event=event.source)
    if event.payload.get("room") == "twice":
        tx.signal(STATUS_CHANGED, worker=event.key, old=SAFE, new=SAFE, ts=2.0, event=event.source)


def test_a_rule_signalling_twice_falls_back_to_firing(make_database_url):
    database = activedb.connect(make_database_url("signal_twice", migrations=()))
    try:
        database.upgrade_app(MIGRATIONS)
        app.declare_status_rules(database, app.declarer(database, {}))
        database.rule(on=database.stream("ping"), name="signal_twice")(signal_twice)
        assert batch.why_not_lowered(database, "ping") is None
        handler = RulesHandler()
        rows = [{"type": "ping", "worker": "w1", "ts": 1.0, "room": "once"}]
        feed(database, [rows], source="twice", mapping=MAPPING, handler=handler)
        assert handler.last_lowered is not None
        rows = [{"type": "ping", "worker": "w2", "ts": 3.0, "room": "once"},
                {"type": "ping", "worker": "w3", "ts": 4.0, "room": "twice"}]
        [outcome] = feed(database, [rows], source="twice", mapping=MAPPING, handler=handler, run="2")
        assert handler.last_lowered is None and outcome.events == 2 and outcome.dead_letters == 0
        database.rules.wait_idle(WAIT)
        with database.engine.connect() as connection:
            audited = connection.execute(sa.text("SELECT worker, at FROM status_changes ORDER BY id")).all()
        assert audited == [("w1", 1.0), ("w2", 1.0), ("w3", 1.0), ("w3", 2.0)]
    finally:
        database.close()


def mark(tx, event):
    tx.write(WORKERS, event.key, status=SAFE, changes=0)
    tx.signal("marked", worker=event.key)


def refuse_mark(tx, event):
    raise ValueError(f"no mark for {event.payload['worker']}")


def audit_mark(tx, event):
    tx.insert("status_changes", worker=event.payload["worker"], old_status="-", new_status="-", event="mark", at=0.0)


def test_rules_on_a_signal_a_batch_cannot_run_keep_the_type_on_the_rule_path(make_database_url):
    database = activedb.connect(make_database_url("signal_refusals", migrations=()))
    try:
        database.upgrade_app(MIGRATIONS)
        database.rule(on=database.stream("mark"), name="mark")(mark)
        assert batch.why_not_lowered(database, "mark") is None        # a signal no rule hears
        database.rule(on=database.signalled("marked"), name="audit_now")(audit_mark)
        assert "rule 'audit_now' is immediate" in batch.why_not_lowered(database, "mark")
        database.rules.disable("audit_now")
        database.rule(on=database.signalled("marked"), coupling=Coupling.DEFERRED, name="audit_a")(audit_mark)
        assert batch.why_not_lowered(database, "mark") is None
        database.rule(on=database.signalled("marked"), coupling=Coupling.DEFERRED, name="audit_b")(audit_mark)
        assert "share priority" in batch.why_not_lowered(database, "mark")
        database.rules.disable("audit_a")
        # A deferred rule that raises: firing fails the signalling rule with it; the lowered attempt falls back and
        # each event fails as firing fails it.
        database.rule(on=database.signalled("marked"), coupling=Coupling.DEFERRED, priority=5,
                      name="refuse_mark")(refuse_mark)
        handler = RulesHandler()
        rows = [{"type": "mark", "worker": "w1", "ts": 1.0, "room": None}]
        [outcome] = feed(database, [rows], source="refused", mapping=MAPPING, handler=handler)
        assert handler.last_lowered is None and outcome.dead_letters == 1
    finally:
        database.close()


def test_after_the_tables_are_reset_a_lowered_batch_draws_its_keys_afresh(databases):
    """``reset_tables`` (TRUNCATE … RESTART IDENTITY) between two batches: the second batch's first attempt draws
    alert ids from blocks the reset gave away again; its commit finds that before it commits (a conflict, re-run) — the
    batch stays lowered and its alerts are numbered from 1, as a fresh database numbers them."""
    database = databases[0]
    events = generate(10, 800, 5)
    handler = RulesHandler(app.PREFETCH)
    app.reset_tables(database)
    feed(database, [events[:400]], source="reset-a", mapping=MAPPING, handler=handler)
    database.rules.wait_idle(WAIT)
    assert handler.last_lowered is not None
    app.reset_tables(database)
    [outcome] = feed(database, [events[400:]], source="reset-b", mapping=MAPPING, handler=handler)
    database.rules.wait_idle(WAIT)
    assert handler.last_lowered is not None and outcome.committed
    with database.engine.connect() as connection:
        ids = connection.execute(sa.text("SELECT id FROM alerts ORDER BY id")).scalars().all()
        reports = connection.execute(sa.text(
            "SELECT message FROM notifications WHERE channel = 'infection_control'")).scalars().all()
    assert ids == list(range(1, len(ids) + 1)) and ids, ids
    assert sorted(int(report.rsplit("(alert ", 1)[1].rstrip(")")) for report in reports) == ids


def touch_and_ticket(tx, event):
    tx.write(WORKERS, event.key, status=SAFE, changes=0)
    tx.insert("tickets", title=f"seen {event.key}")


def heard_ticket(tx, event):
    tx.insert("notifications", worker=event.new["title"], channel="badge", at=0.0, message=f"ticket {event.new['id']}")


def test_a_lowered_batch_inserts_rows_with_drawn_keys_into_a_table_whose_key_is_generated_always(make_database_url):
    """A rule inserting into a table whose key is ``GENERATED ALWAYS AS IDENTITY`` (``tickets``, tests/app_migrations
    t0009), whose inserted rows a detached rule hears: the lowered batch draws each row's key from the identity's
    sequence (the table is keyed) and inserts it ``OVERRIDING SYSTEM VALUE``.  Before, PostgreSQL refused the batch's
    statement (SQLSTATE 428C9) and ``feed`` raised ``DatabaseError`` for every such batch: the stream stopped."""
    from tests.conftest import APP_MIGRATIONS

    database = activedb.connect(make_database_url("keyed_always", migrations=()))
    try:
        database.upgrade_app(MIGRATIONS)
        database.upgrade_app(APP_MIGRATIONS)
        database.rule(on=database.stream("ping"), name="touch_and_ticket")(touch_and_ticket)
        database.rule(on=database.inserted("tickets"), coupling=Coupling.DETACHED, name="heard_ticket")(heard_ticket)
        assert batch.why_not_lowered(database, "ping") is None
        handler = RulesHandler()
        rows = [{"type": "ping", "worker": f"w{number}", "ts": float(number), "room": "r"} for number in range(3)]
        [outcome] = feed(database, [rows], source="tickets", mapping=MAPPING, handler=handler)
        assert handler.last_lowered is not None and outcome.committed and outcome.events == 3
        database.rules.wait_idle(WAIT)
        with database.engine.connect() as connection:
            tickets = connection.execute(sa.text("SELECT id, title FROM tickets ORDER BY id")).all()
            heard = connection.execute(sa.text("SELECT worker, message FROM notifications ORDER BY 1")).all()
        assert [title for _, title in tickets] == ["seen w0", "seen w1", "seen w2"]
        assert heard == [(title, f"ticket {key}") for key, title in tickets]
    finally:
        database.close()


def ticket_by_number(tx, event):
    tx.write("tickets", int(event.key[1:]) + 100, title=f"seen {event.key}")


def test_a_rule_writing_a_new_row_under_its_own_key_into_a_generated_always_table_makes_dead_letters(
        make_database_url):
    """A rule that writes a *new* row of a table whose key is ``GENERATED ALWAYS AS IDENTITY`` under a key of its own
    (``tickets``): PostgreSQL takes no such key, and the flush refuses the write with InvalidKey (insert without the
    key).  The ingestion core did not count InvalidKey among the refusals an event causes, so ``feed`` raised it for
    the batch on every delivery: the stream stopped for good.  Now the events become dead letters with that reason
    and the stream goes on."""
    from tests.conftest import APP_MIGRATIONS

    database = activedb.connect(make_database_url("keyed_always_own", migrations=()))
    try:
        database.upgrade_app(MIGRATIONS)
        database.upgrade_app(APP_MIGRATIONS)
        database.rule(on=database.stream("ping"), name="ticket_by_number")(ticket_by_number)
        rows = [{"type": "ping", "worker": f"w{number}", "ts": float(number), "room": "r"} for number in range(3)]
        [outcome] = feed(database, [rows], source="tickets_own", mapping=MAPPING, handler=RulesHandler())
        assert outcome.committed and outcome.dead_letters == 3 and outcome.events == 0
        with database.engine.connect() as connection:
            assert connection.execute(sa.text("SELECT count(*) FROM tickets")).scalar() == 0
            reasons = connection.execute(sa.text(
                "SELECT reason FROM activedb_dead_letters WHERE query_id LIKE 'tickets_own%'")).scalars().all()
        assert len(reasons) == 3 and all("GENERATED ALWAYS" in reason for reason in reasons), reasons
    finally:
        database.close()


def ticket_by_key(tx, event):
    tx.write("tickets", event.key, title="seen")


def test_a_lowered_rule_writing_a_new_row_under_the_event_key_into_a_generated_always_table_makes_dead_letters(
        make_database_url):
    """The lowered twin of the test above: a rule (lowered: its key is ``event.key``) writing a *new* row of
    ``tickets`` (key ``GENERATED ALWAYS AS IDENTITY``) under the event's key.  The lowered commit inserted the row under
    that key and PostgreSQL refused the batch (SQLSTATE 428C9): ``feed`` raised DatabaseError on every delivery.  Now the
    lowered commit refuses it as the flush does (InvalidKey, before anything is sent): the lowering hands the batch to
    the rule path, whose flush makes those events dead letters; the existing row is updated."""
    from tests.conftest import APP_MIGRATIONS

    database = activedb.connect(make_database_url("keyed_always_lowered", migrations=()))
    try:
        database.upgrade_app(MIGRATIONS)
        database.upgrade_app(APP_MIGRATIONS)
        with database.transaction() as tx:
            existing = tx.insert("tickets", title="old")
        database.rule(on=database.stream("ping"), name="ticket_by_key")(ticket_by_key)
        assert batch.why_not_lowered(database, "ping") is None
        handler = RulesHandler()
        rows = [{"type": "ping", "worker": key, "ts": float(number), "room": "r"}
                for number, key in enumerate([existing + 100, existing, existing + 101])]
        [outcome] = feed(database, [rows], source="tickets_lowered", mapping=MAPPING, handler=handler)
        assert outcome.committed and outcome.dead_letters == 2 and outcome.events == 1
        with database.engine.connect() as connection:
            assert connection.execute(sa.text("SELECT id, title FROM tickets")).all() == [(existing, "seen")]
            reasons = connection.execute(sa.text(
                "SELECT reason FROM activedb_dead_letters WHERE query_id LIKE 'tickets_lowered%'")).scalars().all()
        assert len(reasons) == 2 and all("GENERATED ALWAYS" in reason for reason in reasons), reasons
    finally:
        database.close()


def mark_tagged(tx, event):
    tx.write(WORKERS, event.key, status=SAFE, changes=0)
    tags = ["a"]
    tx.signal("tagged", worker=event.key, tags=tags)
    tags.append("after")        # (the signal was raised with ['a'])


def audit_tagged(tx, event):
    tx.insert("status_changes", worker=event.payload["worker"], old_status="-", new_status="-",
              event=",".join(event.payload["tags"]), at=0.0)


@pytest.mark.parametrize("lower", [True, False], ids=["lowered", "fired"])
def test_a_signals_payload_is_the_one_raised_lowered_as_fired(make_database_url, lower):
    """A rule that signals with a list and then appends to it: the deferred rule on the signal sees the list as
    signalled, lowered as fired (``tx.signal`` copies the payload's lists).  Before, the fired rule saw 'a,after' —
    and, once ``tx.signal`` copied, the lowered one still did (the learned stand-in's signal copied the dict only)."""
    database = activedb.connect(make_database_url(f"signal_payload_{int(lower)}", migrations=()))
    try:
        database.upgrade_app(MIGRATIONS)
        database.rule(on=database.stream("tag"), name="mark_tagged")(mark_tagged)
        database.rule(on=database.signalled("tagged"), coupling=Coupling.DEFERRED, name="audit_tagged")(audit_tagged)
        assert batch.why_not_lowered(database, "tag") is None
        handler = RulesHandler(lower_declared=lower)
        rows = [{"type": "tag", "worker": "w1", "ts": 1.0, "room": None}]
        [outcome] = feed(database, [rows], source="tagged", mapping=MAPPING, handler=handler)
        assert (handler.last_lowered is not None) == lower and outcome.dead_letters == 0, outcome
        database.rules.wait_idle(WAIT)
        with database.engine.connect() as connection:
            audited = connection.execute(sa.text("SELECT worker, event FROM status_changes ORDER BY id")).all()
        assert audited == [("w1", "a")]
    finally:
        database.close()
