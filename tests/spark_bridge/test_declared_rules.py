"""Declared rules (``@batch.declared``) on the sink: a micro-batch whose every type fires one declared rule runs
as one batch of state transactions at commit (``batch.lower``), and leaves what firing them event by event
leaves — the same rows, dead letters for the same events, the same firing counts — which is also what the
plain rules of the same logic leave.  Anything that makes the two differ (a second rule on a type, a condition,
an observer) keeps the event-by-event path.  Real PostgreSQL; no Spark (``IngestSink.process``)."""

from __future__ import annotations

import datetime as dt
import random
import uuid

import pytest
import sqlalchemy as sa

import activedb
from activedb import Coupling, batch
from activedb.errors import RuleFailed
from activedb.ingest import RulesHandler
from spark_bridge import IngestSink
from tests.spark_bridge import app_declared
from tests.spark_bridge._streams import BASE_TIME, dead_letters, ledger


@pytest.fixture()
def database(make_database_url, request):
    database = activedb.connect(make_database_url(request.node.name[5:40], migrations=(app_declared.MIGRATIONS,)))
    database.upgrade_app(app_declared.MIGRATIONS)
    yield database
    database.close()


def _events(count: int, seed: int) -> list[dict]:
    """Adds and subs over four keys in shuffled arrival order (the sink sorts by time); some adds negative and
    some subs overdraw: refused."""
    generator = random.Random(seed)
    rows = [{"type": generator.choice(("add", "add", "sub")), "key": f"k{generator.randrange(4)}",
             "ts": BASE_TIME + dt.timedelta(seconds=seq), "amount": generator.randrange(-5, 60), "seq": seq}
            for seq in range(1, count + 1)]
    generator.shuffle(rows)
    return rows


def _counters(database) -> list[tuple]:
    with database.engine.begin() as connection:
        rows = sorted(tuple(row) for row in connection.execute(sa.text("SELECT * FROM counters")))
        connection.execute(sa.text("TRUNCATE counters, activedb_dead_letters"))
    return rows


def _run(database, batches: list[list[dict]], query: str, *, lower: bool = True):
    """The batches through a new sink; its counters rows, the seq of each dead letter per batch, the firing
    counts of the rules and whether every batch was lowered."""
    sink = IngestSink(database, app_declared.MAPPING, query_name=query, handler=RulesHandler(lower_declared=lower))
    before = {name: (counters.fired, counters.executed, counters.failed)
              for name, counters in database.rules.statistics().per_rule.items()}
    lowered = []
    for number, rows in enumerate(batches):
        outcome = sink.process(rows, number, query_id=f"{query}@test")
        assert outcome.committed
        lowered.append(sink.handler.last_lowered is not None)
    refused = sorted((batch_id, raw["seq"]) for query_id, batch_id, _, raw in dead_letters(database)
                     if query_id == f"{query}@test")
    firings = {name: tuple(now - then for now, then in zip((counters.fired, counters.executed, counters.failed),
                                                            before.get(name, (0, 0, 0))))
               for name, counters in database.rules.statistics().per_rule.items()}
    return _counters(database), refused, {name: counts for name, counts in firings.items() if any(counts)}, lowered


def test_a_lowered_batch_leaves_what_firing_event_by_event_leaves_and_what_the_plain_rules_leave(database):
    app_declared.register(database)
    batches = [_events(200, seed) for seed in (1, 2, 3)]
    lowered = _run(database, batches, "lowered")
    by_event = _run(database, batches, "by-event", lower=False)
    assert lowered[3] == [True, True, True] and by_event[3] == [False, False, False]
    assert lowered[0] == by_event[0] and lowered[0]               # the same rows
    assert lowered[1] == by_event[1] and lowered[1]               # the same events refused
    assert lowered[2] == by_event[2]                              # fired, executed, failed per rule
    assert sum(fired for fired, _, _ in lowered[2].values()) == 600
    assert ledger(database)[0][2:] == (200 - sum(1 for batch_id, _ in lowered[1] if batch_id == 0),
                                       sum(1 for batch_id, _ in lowered[1] if batch_id == 0))

    plain = activedb.connect(database.url)
    try:
        app_declared.register_plain(plain)
        rows, refused, _, was_lowered = _run(plain, batches, "plain")
    finally:
        plain.close()
    assert was_lowered == [True, True, True]      # (their reads and writes in a helper the check follows)
    assert (rows, refused) == (lowered[0], lowered[1])


def test_a_refused_event_is_a_dead_letter_with_the_abort_reason_and_its_row_untouched(database):
    app_declared.register(database)
    sink = IngestSink(database, app_declared.MAPPING, query_name="q")
    rows = [{"type": "add", "key": "a", "ts": BASE_TIME, "amount": 10, "seq": 1},
            {"type": "sub", "key": "a", "ts": BASE_TIME + dt.timedelta(seconds=1), "amount": 25, "seq": 2},
            {"type": "add", "key": "a", "ts": BASE_TIME + dt.timedelta(seconds=2), "amount": -1, "seq": 3}]
    outcome = sink.process(rows, 0, query_id="q@refused")
    assert sink.handler.last_lowered is not None
    assert (outcome.events, outcome.dead_letters) == (1, 2)
    reasons = {raw["seq"]: reason for _, _, reason, raw in dead_letters(database)}
    assert reasons[2] == "aborted: a: 10 - 25 < 0"
    assert "amounts must be >= 0" in reasons[3]
    assert [row[:4] for row in _counters(database)] == [("a", 10, 1, "1")]


def _not_lowered(database) -> bool:
    sink = IngestSink(database, app_declared.MAPPING, query_name="q")
    sink.process([{"type": "add", "key": "a", "ts": BASE_TIME, "amount": 1, "seq": 1}], 0,
                 query_id=f"q@{uuid.uuid4()}")
    return sink.handler.last_lowered is None and _counters(database)[0][:4] == ("a", 1, 1, "1")


def test_a_second_rule_on_a_type_keeps_the_event_by_event_path(database):
    app_declared.register(database)
    database.rule(on=database.stream("add"), name="also")(lambda tx, event: None)
    assert _not_lowered(database)


def test_a_declared_rule_with_a_condition_or_a_deferred_coupling_is_fired_event_by_event(database):
    database.rule(on=database.stream("add"), when=lambda tx, event: True, name="guarded")(app_declared.add)
    assert _not_lowered(database)
    database.rules.remove("guarded")
    database.rule(on=database.stream("add"), coupling=Coupling.DEFERRED, name="later")(app_declared.add)
    assert _not_lowered(database)


def test_a_rule_on_a_written_table_keeps_the_event_by_event_path(database):
    """A rule on changes of ``counters`` hears each event's change event by event; a batch would change each
    row once (``apply_at_commit`` through the tree), so the batch is not lowered."""
    app_declared.register(database)
    heard = []
    database.rule(on=database.modified("counters"), name="watch")(lambda tx, event: heard.append(event.new["total"]))
    sink = IngestSink(database, app_declared.MAPPING, query_name="q")
    sink.process([{"type": "add", "key": "a", "ts": BASE_TIME + dt.timedelta(seconds=seq), "amount": 60, "seq": seq}
                  for seq in (1, 2)], 0, query_id="q@watched")
    assert sink.handler.last_lowered is None and heard == [60, 120]


def test_an_observer_keeps_the_event_by_event_path(database):
    app_declared.register(database)
    heard = []

    class Firings(activedb.Observer):
        def on_firing_end(self, transaction, firing, outcome):
            heard.append(firing.rule.name)

    observer = database.transactions.observers.add(Firings())
    try:
        assert _not_lowered(database)
    finally:
        database.transactions.observers.remove(observer)
    assert heard == ["declared_add"]


def test_fired_in_a_transaction_a_declared_rule_reads_as_of_before_the_firing_and_aborts_as_a_rule(database):
    """``batch.declared`` as an ordinary rule: its operations read the rows as they were before the firing
    (a write's parameter is the row's old image, as a state transaction's is) and an Abort fails the rule."""
    @batch.declared
    def move(event, ops):
        # Both rows' new values computed from the images before this firing.
        ops.write("counters", "b", lambda own, a: {"total": (a or {"total": 0})["total"], "events": 0,
                                                   "trail": "", "last_ts": None}, reads=[("counters", "a")])
        ops.write("counters", "a", lambda own: {"total": own["total"] + 100})
        ops.abort_if(lambda a: a["total"] > 150, reads=[("counters", "a")], reason="too much")

    database.rule(on=database.stream("move"), name="move")(move)
    with database.transaction() as tx:
        tx.write("counters", "a", total=7, events=0, trail="", last_ts=None)
    with database.transaction() as tx:
        tx.emit("move", key="a")
    assert [row[:2] for row in _counters(database)] == [("a", 107), ("b", 7)]

    with database.transaction() as tx:
        tx.write("counters", "a", total=200, events=0, trail="", last_ts=None)
    with pytest.raises(RuleFailed, match="too much"):
        with database.transaction() as tx:
            tx.emit("move", key="a")
    assert [row[:2] for row in _counters(database)] == [("a", 200)]


def test_a_declared_rule_on_a_data_event_or_with_a_window_says_what_to_do(database):
    @batch.declared
    def windowed(event, ops):
        ops.window_read("counters", ["a"], size=10, aggregate=lambda windows: None)

    database.rule(on=database.stream("w"), name="windowed")(windowed)
    with pytest.raises(RuleFailed, match="window operations read the versions of a batch"):
        with database.transaction() as tx:
            tx.emit("w", key="a")
    # (Refused where it is declared: before, taken, and each insert into counters then failed with RuleFailed.)
    with pytest.raises(batch.errors.DeclarationError, match=r"reacts to stream events only — declare it on=db\.stream"):
        database.rule(on=database.inserted("counters"), name="on_insert")(app_declared.add)
    assert "on_insert" not in database.rules.names()


def test_rows_postgresql_cannot_store_are_dead_letters_on_the_lowered_path_too(database):
    """A key with a NUL character, a lone surrogate, a 1 MB key: each one dead letter with its reason, the
    batch's other events applied — as on the event-by-event path (``tests/spark_bridge/test_poison.py``)."""
    from tests.spark_bridge.test_poison import BIG_KEY

    app_declared.register(database)
    good = [{"type": "add", "key": f"k{seq % 3}", "ts": BASE_TIME + dt.timedelta(seconds=seq), "amount": 5,
             "seq": seq} for seq in range(1, 21)]
    poison = [{**good[0], "key": key, "seq": seq, "ts": BASE_TIME + dt.timedelta(seconds=seq)}
              for seq, key in ((21, "k\x00nul"), (22, "k\ud800surrogate"), (23, BIG_KEY))]
    sink = IngestSink(database, app_declared.MAPPING, query_name="poison")
    outcome = sink.process(good[:7] + poison[:1] + good[7:12] + poison[1:] + good[12:], 0, query_id="poison@declared")
    assert (outcome.committed, outcome.events, outcome.dead_letters) == (True, 20, 3)
    letters = {raw["seq"]: reason for _, _, reason, raw in dead_letters(database)}
    assert sorted(letters) == [21, 22, 23]
    assert "NUL character" in letters[21] and "lone surrogate" in letters[22]
    assert "PostgreSQL refused this event's writes at the commit" in letters[23] and "54000" in letters[23]
    assert [row[:3] for row in _counters(database)] == [("k0", 30, 6), ("k1", 35, 7), ("k2", 35, 7)]


def test_a_key_of_the_wrong_type_or_an_unknown_table_refuses_that_event_alone(database):
    """What a batch's events declared is refused as a whole before its commit (a key the table's column cannot
    hold, a table that does not exist); the batch then runs event by event and only those events are refused."""
    @batch.declared
    def mark(event, ops):
        threshold = event.payload["amount"] if event.payload["amount"] >= 0 else "not a number"
        table = "milestones" if event.payload["seq"] != 3 else "no_such_table"
        ops.write(table, (event.key, threshold), lambda own: {"seq": event.payload["seq"]})

    database.rule(on=database.stream("add"), name="mark")(mark)
    sink = IngestSink(database, app_declared.MAPPING, query_name="q")
    rows = [{"type": "add", "key": "a", "ts": BASE_TIME + dt.timedelta(seconds=seq), "amount": amount, "seq": seq}
            for seq, amount in ((1, 100), (2, -1), (3, 200), (4, 300))]
    outcome = sink.process(rows, 0, query_id="q@refused-keys")
    assert (outcome.committed, outcome.events, outcome.dead_letters) == (True, 2, 2)
    reasons = {raw["seq"]: reason for _, _, reason, raw in dead_letters(database)}
    assert sorted(reasons) == [2, 3] and "threshold" in reasons[2] and "no_such_table" in reasons[3]
    with database.engine.connect() as connection:
        assert sorted(connection.execute(sa.text("SELECT threshold, seq FROM milestones")).all()) == [(100, 1), (300, 4)]


def test_rows_an_insert_cannot_store_are_dead_letters_and_the_rest_is_inserted(database):
    """A declared rule adding rows (``ops.insert``) that the table cannot take — a column it does not have, a
    NUL character, None for a NOT NULL column, a table that does not exist — refuses those events alone, each a
    dead letter with its reason; the batch's other rows are inserted, and the stream goes on."""
    @batch.declared
    def log(event, ops):
        seq = event.payload["seq"]
        row = {2: {"rule": "add", "colour": "blue"}, 3: {"rule": "add", "detail": "nul\x00"},
               4: {"rule": None, "detail": "no rule"}}.get(seq, {"rule": "add", "detail": f"seq {seq}"})
        ops.insert("events_seen" if seq != 5 else "no_such_log", lambda own: row, reads=[("counters", event.key)])

    database.rule(on=database.stream("add"), name="log_adds")(log)
    with database.engine.begin() as connection:
        connection.execute(sa.text("TRUNCATE events_seen"))
    sink = IngestSink(database, app_declared.MAPPING, query_name="inserts")
    rows = [{"type": "add", "key": "a", "ts": BASE_TIME + dt.timedelta(seconds=seq), "amount": 1, "seq": seq}
            for seq in range(1, 8)]
    outcome = sink.process(rows, 0, query_id="inserts@refused")
    assert (outcome.committed, outcome.events, outcome.dead_letters) == (True, 3, 4)
    reasons = {raw["seq"]: reason for _, _, reason, raw in dead_letters(database)}
    assert sorted(reasons) == [2, 3, 4, 5]
    assert "colour" in reasons[2] and "NUL" in reasons[3] and "NOT NULL" in reasons[4] and "no_such_log" in reasons[5]
    with database.engine.connect() as connection:
        assert connection.execute(sa.text("SELECT detail FROM events_seen ORDER BY id")).scalars().all() == [
            "seq 1", "seq 6", "seq 7"]
    assert sink.process(rows[:1], 1, query_id="inserts@refused").committed      # the next batch goes on
