"""Detached-family firings a lowered batch runs in its own commit (``activedb/batch/README.md``, "Detached firings that
only insert"): which rules qualify and why not; the tables and counters those firings leave equal what recording
them leaves (``OutboxOptions(inserts_in_commit=False)``), with no outbox record; a firing whose action raises, and
every one of them when the database refuses a row, go through the outbox instead, the batch committing."""

from __future__ import annotations

import datetime as dt
import time
from time import perf_counter

import pytest
import sqlalchemy as sa

import activedb
from activedb import Coupling, batch, lowlevel
from activedb.txn import CommitParticipant
from activedb.batch import why_not_in_commit
from activedb.batch._aftermath import runs_in_commit
from activedb.batch._learn import NotLearned
from activedb.examples.hand_hygiene import MIGRATIONS, app
from activedb.ingest import RulesHandler, feed

WAIT = 120
MAPPING = app.MAPPING
WORKERS, SAFE = app.WORKERS, app.SAFE        # (a rule names them as globals)


def touch(tx, event):
    tx.write(WORKERS, event.key, status=SAFE, changes=0)


def note(tx, event):
    tx.insert("notifications", worker=event.key, channel="badge", at=0.0, message=f"seen in {event.payload['room']}")


def note_unless_bad(tx, event):
    if event.payload["room"] == "bad":
        raise ValueError(f"no note for {event.key}")
    tx.insert("compensations", worker=event.key, event=event.source, at=0.0, reason="noted")


def chatty(tx, event):
    print("sending", event.key)
    tx.insert("notifications", worker=event.key, channel="badge", at=0.0, message="chatty")


def clocked(tx, event):
    tx.insert("notifications", worker=event.key, channel="clock", at=time.time(), message="now")


def timed(tx, event):
    tx.insert("notifications", worker=event.key, channel="clock", at=perf_counter(), message="now")


def reads(tx, event):
    row = tx.read(WORKERS, event.key)
    tx.insert("notifications", worker=event.key, channel="badge", at=0.0, message=str(row))


class Sink:
    """A client object of the module: what it is given is a side effect no commit takes back."""

    def __init__(self):
        self.written = []

    def write(self, value):
        self.written.append(value)
        return value


SINK = Sink()
SINKS = (SINK,)
LABELS = {"r1": "first", "r2": "second"}


def held_in_local(tx, event):
    sink = SINK
    sink.write(event.key)
    tx.insert("notifications", worker=event.key, channel="badge", at=0.0, message="held")


def mapped(tx, event):
    any(map(print, [event.key]))
    tx.insert("notifications", worker=event.key, channel="badge", at=0.0, message="mapped")


def keyed(tx, event):
    sorted([event.key], key=SINK.write)
    tx.insert("notifications", worker=event.key, channel="badge", at=0.0, message="keyed")


def write_to(sink, value):
    sink.write(value)


def passed_on(tx, event):
    write_to(SINK, event.key)
    tx.insert("notifications", worker=event.key, channel="badge", at=0.0, message="passed on")


def in_a_tuple(tx, event):
    SINKS[0].write(event.key)
    tx.insert("notifications", worker=event.key, channel="badge", at=0.0, message="in a tuple")


def write_by_default(value, sink=SINK):
    sink.write(value)


def defaulted(tx, event):
    write_by_default(event.key)
    tx.insert("notifications", worker=event.key, channel="badge", at=0.0, message="defaulted")


def closing_over(sink):
    def closed(tx, event):
        sink.write(event.key)
        tx.insert("notifications", worker=event.key, channel="badge", at=0.0, message="closed")
    return closed


closed = closing_over(SINK)


def computes(tx, event):
    label = LABELS[event.payload["room"]] if isinstance(event.ts, (int, float, dt.datetime)) else ""
    zone = dt.timezone.utc
    names = sorted([event.key, label, str(zone)], key=len)
    tx.insert("notifications", worker=event.key, channel="badge", at=0.0, message=" ".join(map(str, names)))


def declare(database, *more):
    database.upgrade_app(MIGRATIONS)
    database.rule(on=database.stream("ping"), name="touch")(touch)
    database.rule(on=database.stream("ping"), coupling=Coupling.DETACHED_CAUSALLY_DEPENDENT, name="note")(note)
    database.rule(on=database.stream("ping"), coupling=Coupling.DETACHED, name="note_unless_bad")(note_unless_bad)
    for rule, coupling in more:
        database.rule(on=database.stream("ping"), coupling=coupling, name=rule.__name__)(rule)


def rows(*rooms: str, first: int = 0) -> list[dict]:
    return [{"type": "ping", "worker": f"w{first + number}", "ts": float(first + number), "room": room}
            for number, room in enumerate(rooms)]


def state(database) -> dict[str, object]:
    with database.engine.connect() as connection:
        tables = {table: [tuple(row) for row in connection.execute(sa.text(f"SELECT * FROM {table} ORDER BY 1"))]
                  for table in ("worker_status", "notifications", "compensations")}
        outbox = connection.execute(sa.text(
            "SELECT rule, status, coalesce(error, '') FROM activedb_outbox ORDER BY id")).all()
    per_rule = database.rules.statistics().per_rule
    counters = {name: (c.fired, c.executed, c.failed, c.cancelled) for name, c in per_rule.items()}
    return {"tables": tables, "outbox": [tuple(row) for row in outbox], "counters": counters}


def test_which_detached_rules_run_in_their_batchs_commit_and_why_not(make_database_url):
    database = activedb.connect(make_database_url("in_commit_verdicts", migrations=()))
    try:
        declare(database, (chatty, Coupling.DETACHED), (clocked, Coupling.DETACHED), (timed, Coupling.DETACHED),
                (reads, Coupling.DETACHED))
        database.rule(on=database.stream("ping"), coupling=Coupling.DETACHED, when=lambda tx, event: True,
                      name="conditional")(note)
        verdicts = {rule.name: runs_in_commit(rule) for rule in database.rules.on_stream("ping")}
        assert verdicts["note"] == frozenset({"notifications"})
        assert verdicts["note_unless_bad"] == frozenset({"compensations"})
        assert isinstance(verdicts["touch"], NotLearned) and "detached family" in verdicts["touch"]
        assert "chatty() calls print" in verdicts["chatty"]
        assert "clocked() calls time.time: a function of a module" in verdicts["clocked"]
        assert "timed() calls perf_counter: not a module function" in verdicts["timed"]
        assert "reads or writes a row" in verdicts["reads"]
        assert "has a condition" in verdicts["conditional"]
        assert why_not_in_commit(database, "note") is None
        assert "chatty() calls print" in why_not_in_commit(database, "chatty")
        # (the application's detached family qualifies: it inserts rows computed from its events)
        app.register(database)
        for name in ("notify_badge", "badge_light", "report_incident", "compensate_enter"):
            assert not isinstance(runs_in_commit(database.rules.get(name)), NotLearned), name
    finally:
        database.close()


@pytest.fixture
def pair(make_database_url):
    """Two databases with the rules above: firings run in the commit (the default), and every firing recorded."""
    made = [activedb.connect(make_database_url("in_commit_on", migrations=())),
            activedb.connect(make_database_url("in_commit_off", migrations=()),
                             outbox_options={"inserts_in_commit": False})]
    try:
        for database in made:
            declare(database)
        yield made
    finally:
        for database in made:
            database.close()


def test_an_action_that_reaches_a_global_object_is_recorded_not_run_in_the_commit(make_database_url):
    """A side effect run in the trigger's commit happens though that commit fails, and again when the batch re-runs:
    an action that may reach an object of its module (held in a local, passed to a built-in or a function, in a
    tuple, a default or a closure) is recorded; one that reads values of its module still runs in the commit."""
    database = activedb.connect(make_database_url("in_commit_reaches", migrations=()))
    try:
        fooling = (held_in_local, mapped, keyed, passed_on, in_a_tuple, defaulted, closed)
        declare(database, *((rule, Coupling.DETACHED) for rule in fooling + (computes,)))
        for rule in fooling:
            assert isinstance(runs_in_commit(database.rules.get(rule.__name__)), NotLearned), rule.__name__
        assert "sink = SINK" not in why_not_in_commit(database, "held_in_local")
        assert "reads SINK" in why_not_in_commit(database, "held_in_local")
        assert "reads print" in why_not_in_commit(database, "mapped")
        assert "reads SINK" in why_not_in_commit(database, "passed_on")
        assert "default value" in why_not_in_commit(database, "defaulted")
        assert why_not_in_commit(database, "computes") is None
        assert SINK.written == []
    finally:
        database.close()


def test_firings_that_only_insert_leave_in_the_commit_what_recorded_firings_leave(pair):
    in_commit, recorded = pair
    batches = [rows("r1", "r2", "bad", "r3"), rows("r4", "bad", first=10)]
    for database in pair:
        handler = RulesHandler()
        for number, found in enumerate(batches):
            [outcome] = feed(database, [found], source="pings", mapping=MAPPING, handler=handler, run=str(number))
            assert handler.last_lowered is not None and outcome.committed and outcome.dead_letters == 0
        database.rules.wait_idle(WAIT)
    here, there = state(in_commit), state(recorded)
    assert here["tables"] == there["tables"] and here["counters"] == there["counters"]
    assert len(here["tables"]["notifications"]) == 6 and len(here["tables"]["compensations"]) == 4
    assert here["counters"]["note"] == (6, 6, 0, 0) and here["counters"]["note_unless_bad"] == (6, 4, 2, 0)
    # Only the firings whose action raised were recorded here; recorded, every one is.
    assert [(rule, status) for rule, status, _ in here["outbox"]] == [("note_unless_bad", "failed")] * 2
    assert all("no note for" in error for _, _, error in here["outbox"])
    assert sorted(status for _, status, _ in there["outbox"]) == ["done"] * 10 + ["failed"] * 2


def test_a_row_the_database_refuses_sends_those_firings_to_the_outbox_and_the_batch_commits(pair):
    in_commit, _ = pair
    with in_commit.engine.begin() as connection:
        connection.execute(sa.text("CREATE UNIQUE INDEX notifications_once ON notifications (message)"))
    handler = RulesHandler()
    [outcome] = feed(in_commit, [rows("r1", "r1", "r2")], source="twice", mapping=MAPPING, handler=handler)
    in_commit.rules.wait_idle(WAIT)
    assert handler.last_lowered is not None and outcome.committed and outcome.events == 3
    found = state(in_commit)
    assert len(found["tables"]["worker_status"]) == 3 and len(found["tables"]["compensations"]) == 3
    with in_commit.engine.connect() as connection:
        messages = connection.execute(sa.text("SELECT message FROM notifications ORDER BY message")).scalars().all()
    assert messages == ["seen in r1", "seen in r2"]
    statuses = sorted((rule, status) for rule, status, _ in found["outbox"])
    assert statuses == [("note", "done"), ("note", "done"), ("note", "failed"),
                        ("note_unless_bad", "done"), ("note_unless_bad", "done"), ("note_unless_bad", "done")]
    [error] = [error for rule, status, error in found["outbox"] if status == "failed"]
    assert "Key (message)=(seen in r1) already exists" in error, error


def test_firings_whose_transaction_is_compensated_or_whose_table_keeps_before_images_stay_recorded(pair):
    """A compensation declared for a detached rule's transaction (``rule:<name>``) needs that transaction, and
    before-image undo of a table needs the images of every transaction writing it: those firings are recorded and
    run in transactions of their own; the others still run in the batch's commit."""
    in_commit, _ = pair
    in_commit.batches.transaction_compensation("rule:note")(lambda tx, lineage: None)
    assert "a compensation names the transaction of rule 'note'" in why_not_in_commit(in_commit, "note")
    assert why_not_in_commit(in_commit, "note_unless_bad") is None
    assert "inserts_in_commit=False" in why_not_in_commit(pair[1], "note_unless_bad")
    handler = RulesHandler()
    [outcome] = feed(in_commit, [rows("r1", "r2")], source="kept", mapping=MAPPING, handler=handler)
    in_commit.rules.wait_idle(WAIT)
    assert handler.last_lowered is not None and outcome.committed
    assert [(rule, status) for rule, status, _ in state(in_commit)["outbox"]] == [("note", "done")] * 2
    in_commit.batches.undo_by_before_image("compensations")
    assert "old images of 'compensations'" in why_not_in_commit(in_commit, "note_unless_bad")
    [outcome] = feed(in_commit, [rows("r3", first=5)], source="kept", mapping=MAPPING, handler=handler, run="2")
    in_commit.rules.wait_idle(WAIT)
    found = state(in_commit)
    assert sorted({rule for rule, _, _ in found["outbox"]}) == ["note", "note_unless_bad"]
    assert len(found["tables"]["notifications"]) == 3 and len(found["tables"]["compensations"]) == 3


def ticket(tx, event):
    tx.insert("tickets", title=f"seen {event.key} in {event.payload['room']}")


def test_firings_inserting_into_a_table_whose_key_is_generated_always_run_in_the_commit(make_database_url):
    """A detached firing run in its batch's commit inserts its rows with the keys drawn for them from the table's
    sequence: into a table whose key is ``GENERATED ALWAYS AS IDENTITY`` (``tickets``, tests/app_migrations t0009) the
    statement says ``OVERRIDING SYSTEM VALUE``, the keys being the identity's own.  Before, PostgreSQL refused every
    such statement (SQLSTATE 428C9) and every firing on such a table went through the outbox, each in a transaction
    of its own, batch after batch."""
    from tests.conftest import APP_MIGRATIONS

    database = activedb.connect(make_database_url("in_commit_always", migrations=()))
    try:
        declare(database, (ticket, Coupling.DETACHED))
        database.upgrade_app(APP_MIGRATIONS)
        assert why_not_in_commit(database, "ticket") is None
        handler = RulesHandler()
        [outcome] = feed(database, [rows("r1", "r2", "r3")], source="tickets", mapping=MAPPING, handler=handler)
        database.rules.wait_idle(WAIT)
        assert handler.last_lowered is not None and outcome.committed
        with database.engine.connect() as connection:
            titles = connection.execute(sa.text("SELECT title FROM tickets ORDER BY id")).scalars().all()
        assert titles == ["seen w0 in r1", "seen w1 in r2", "seen w2 in r3"]
        assert [rule for rule, _, _ in state(database)["outbox"] if rule == "ticket"] == [], "run in the commit"
    finally:
        database.close()


def hygiene_state(database) -> dict[str, list[str]]:
    """Every application table's rows without their generated ids (a killed process's key blocks are gaps), the
    incident reports' alert ids left out for the same reason; and the outbox's records."""
    with database.engine.connect() as connection:
        state = {table: connection.execute(sa.text(
            f"SELECT regexp_replace((to_jsonb(t) - 'id')::text, '\\(alert [0-9]+\\)', '(alert #)') FROM {table} t "
            f"ORDER BY 1")).scalars().all() for table in app.APP_TABLES}
        state["outbox"] = connection.execute(sa.text("SELECT rule || ' ' || status FROM activedb_outbox")).scalars().all()
        state["ledger"] = connection.execute(sa.text(
            "SELECT batch_id || ' ' || events || ' ' || dead_letters FROM activedb_ingestion_ledger ORDER BY batch_id"
        )).scalars().all()
    return state


def test_a_process_killed_in_the_flush_or_after_the_commit_leaves_each_in_commit_firing_once(make_database_url,
                                                                                           tmp_path):
    """The hand-hygiene application fed by the plain connector, its batches lowered and its detached firings run in
    their batch's commit: run 1 is SIGKILLed inside batch 2's flush (its rows and the firings' rows written, not
    committed), run 2 after batch 4's commit, run 3 feeds the same batches to the end — every table, the ledger and
    the (empty) outbox equal an uninterrupted run's."""
    from tests.ingest.feed_driver import HYGIENE_SOURCE, RUN, hygiene_batches, hygiene_database, killed_and_fed_again

    seed, files = 11, 6
    reference = hygiene_database(make_database_url("hygiene_uninterrupted"))
    try:
        handler = RulesHandler(app.PREFETCH)
        outcomes = feed(reference, hygiene_batches(seed, files), source=HYGIENE_SOURCE, run=RUN, mapping=MAPPING,
                        handler=handler)
        reference.rules.wait_idle(WAIT)
        assert all(outcome.committed for outcome in outcomes) and handler.last_lowered is not None
        expected = hygiene_state(reference)
    finally:
        reference.close()
    assert expected["outbox"] == [] and expected["badge_lights"] and expected["compensations"], expected
    url = make_database_url("hygiene_killed")
    hygiene_database(url).close()
    killed_and_fed_again(url, tmp_path, "--workload", "hygiene", "--seed", str(seed), "--files", str(files))
    database = activedb.connect(url)
    try:
        assert hygiene_state(database) == expected
    finally:
        database.close()


def signal_then_refuse(tx, event):
    tx.write(WORKERS, event.key, status=SAFE, changes=0)
    tx.signal("ponged", worker=event.key)
    if event.payload["room"] == "bad":
        raise ValueError(f"refused after signalling: {event.key}")


def light(tx, event):
    tx.insert("badge_lights", worker=event.payload["worker"], color="green", status=SAFE, at=0.0)


def undo(tx, event):
    tx.insert("compensations", worker=event.payload["worker"], event="pong", at=0.0, reason="undone")


def test_a_firing_its_mode_does_not_run_after_the_outcome_is_cancelled_not_run_in_the_commit(pair):
    """A rule signals, then raises (its event is a dead letter): the detached causally dependent rule on the signal
    must not run, and the exclusive causally dependent one runs only for that event — also when they only insert;
    as recorded, counted cancelled otherwise (regression: the batch's commit ran them whatever the outcome)."""
    for database in pair:
        database.rule(on=database.stream("pong"), name="signal_then_refuse")(signal_then_refuse)
        database.rule(on=database.signalled("ponged"), coupling=Coupling.DETACHED_CAUSALLY_DEPENDENT,
                      name="light")(light)
        database.rule(on=database.signalled("ponged"), coupling=Coupling.EXCLUSIVE_CAUSALLY_DEPENDENT,
                      name="undo")(undo)
        handler = RulesHandler()
        found = [{**row, "type": "pong"} for row in rows("r1", "bad", "r2")]
        [outcome] = feed(database, [found], source="pongs", mapping=MAPPING, handler=handler)
        database.rules.wait_idle(WAIT)
        assert handler.last_lowered is not None and outcome.events == 2 and outcome.dead_letters == 1
    here, there = (state(database) for database in pair)
    assert here["tables"] == there["tables"] and here["counters"] == there["counters"]
    with pair[0].engine.connect() as connection:
        lights = connection.execute(sa.text("SELECT worker FROM badge_lights ORDER BY worker")).scalars().all()
        undone = connection.execute(sa.text("SELECT worker FROM compensations WHERE event = 'pong'")).scalars().all()
    assert lights == ["w0", "w2"] and undone == ["w1"]
    assert here["counters"]["light"] == (3, 2, 0, 1) and here["counters"]["undo"] == (3, 1, 0, 2)
    assert here["outbox"] == []


class RefuseAtCommit(CommitParticipant):
    """Enlisted after the batch: its ``write``, after the batch's, fails the commit."""

    def about_to_commit(self, transaction, connection) -> None:
        raise RuntimeError("refused at the commit")


def test_a_commit_that_fails_after_the_batch_ran_its_firings_records_those_the_abort_runs(pair):
    """A batch lowered in an application's own transaction (no re-run: its abort is an outcome), whose commit fails
    after the batch ran its detached firings in it: their rows go with the transaction, and the recorder handles
    them as any firing of an aborted root — the detached rule's are recorded and run, the causally dependent rule's
    cancelled — as they would have been had they been recorded."""
    in_commit, recorded = pair
    events = [{"type": "ping", "key": f"w{number}", "ts": float(number), "payload": {"room": room}}
              for number, room in enumerate(("r1", "bad", "r2"))]
    for database in pair:
        with pytest.raises(RuntimeError, match="refused at the commit"):
            with database.transaction(name="own") as tx:
                lowered = batch.lower(database.rules, tx, {"ping"})
                assert lowered is not None
                batch.apply_lowered(database.rules, tx, events, lowered)
                lowlevel.enlist(tx, RefuseAtCommit())
        database.rules.wait_idle(WAIT)
    here, there = state(in_commit), state(recorded)
    assert (here["outbox"], here["counters"]) == (there["outbox"], there["counters"])
    # (the keys the batch drew for the rows it ran went with the transaction: gaps)
    assert {table: [row[1:] for row in rows] for table, rows in here["tables"].items()} == {
        table: [row[1:] for row in rows] for table, rows in there["tables"].items()}
    assert here["tables"]["worker_status"] == [] and here["tables"]["notifications"] == []
    assert len(here["tables"]["compensations"]) == 2           # note_unless_bad: detached, run whatever the outcome
    assert here["counters"]["note"] == (3, 0, 0, 3)            # note: causally dependent, cancelled
    assert sorted((rule, status) for rule, status, _ in here["outbox"]) == [
        ("note_unless_bad", "done"), ("note_unless_bad", "done"), ("note_unless_bad", "failed")]
