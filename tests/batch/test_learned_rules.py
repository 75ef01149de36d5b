"""Plain rules lowered (``activedb/batch/README.md``, "Plain rules lowered"): a plain ``@db.rule`` whose action only
reads and writes its event's row of one table runs as one batch of state transactions at commit on the ingestion
core's rule path, with the tables, dead letters and ledger counts of firing it event by event (the same batches fed
with lowering off, ``RulesHandler(lower_declared=False)``); an action that raises makes the batch fall back to
firing, and rules that do anything else are not lowered."""

from __future__ import annotations

import datetime as dt
import logging
import math
import os
import re

import pytest
import sqlalchemy as sa

import activedb
from activedb import Coupling
from activedb import batch
from activedb.batch._learn import learned_table, why_not_learned
from activedb.errors import InvalidValue
from activedb.ingest import Batch, RulesHandler, feed
from tests._unshowable import Unshowable
from tests.spark_bridge import app_counters

BASE = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)


# --- actions that qualify -----------------------------------------------------------------------------------

def count_amount(tx, event):
    row = tx.read("counters", event.key)
    amount = event.payload["amount"]
    if amount == 0:
        return                                  # writes nothing: an absent row stays absent
    if row is None:                             # a new row: the other columns at their defaults
        tx.write("counters", event.key, events=1, trail=f"{event.source}:{event.payload['seq']}")
    else:                                       # (a row made earlier in the batch reads back whole)
        tx.write("counters", event.key, total=row["total"] + amount, events=row["events"] + 1,
                 trail=f"{row['trail']},{event.payload['seq']}", last_ts=event.ts)


def add_or_refuse(tx, event):
    if event.payload["amount"] < 0:
        raise ValueError(f"negative amount {event.payload['amount']} for {event.key}")
    row = tx.read("counters", event.key) or {"total": 0, "events": 0}
    tx.write("counters", event.key, total=row["total"] + event.payload["amount"], events=row["events"] + 1)


def _suffixed(event):
    return f"{event.key}-x"


def count_suffixed(tx, event):
    key = _suffixed(event)                      # a key made of the event: declared by the same expression
    row = tx.read("counters", key)
    tx.write("counters", key, events=1 if row is None else row["events"] + 1)


COUNTERS = "counters"       # a module's constant naming the table
NOT_A_TABLE = 7


def count_by_constant(tx, event):
    row = tx.read(COUNTERS, event.key)
    tx.write(COUNTERS, event.key, events=1 if row is None else row["events"] + 1, total=event.payload["amount"])


def count_by_tuple(tx, event):
    """The key from a tuple assignment, as people unpack an event (``worker, room = event.key, …``)."""
    who, amount = event.key, event.payload["amount"]
    row = tx.read(COUNTERS, who)
    tx.write(COUNTERS, who, events=1 if row is None else row["events"] + 1, total=amount)


def suffixed_by_tuple(tx, event):
    seq, key = event.payload["seq"], _suffixed(event)
    tx.write("counters", key, events=seq)


def key_from_an_unpacked_value(tx, event):
    pair = (event.key, 1)
    who, _ = pair
    tx.write("counters", who, events=1)


def table_not_a_string(tx, event):
    tx.write(NOT_A_TABLE, event.key, events=1)


def table_from_a_local(tx, event):
    table = "counters"
    tx.write(table, event.key, events=1)


def over_five(tx, event):
    """A condition that reads the event's row (after ``count_amount`` wrote it, in a chain)."""
    row = tx.read("counters", event.key)
    return row is not None and row["total"] > 5


def mark_big(tx, event):
    row = tx.read("counters", event.key)
    tx.write("counters", event.key, trail=f"{row['trail']}!", last_ts=event.ts)


def payload_says_so(tx, event):
    """A condition of the event alone (it reads no row)."""
    return event.payload["amount"] % 2 == 1


def stamp(tx, event):
    """Sets only ``last_ts`` to the event's time (as ``count_amount`` does where it sets it): beside it in one priority
    group, either order leaves one row."""
    tx.write("counters", event.key, last_ts=event.ts)


def writes_in_a_condition(tx, event):
    tx.write("counters", event.key, events=0)
    return True


def _price(event):
    return float(event.key)


def relabel_price(tx, event):
    """A row of ``alias_prices`` (a ``numeric`` key) named by a float made of the event's key."""
    key = _price(event)
    row = tx.read("alias_prices", key)
    tx.write("alias_prices", key, label=f"{'' if row is None else row['label']}/{event.payload['seq']}")


def use_token(tx, event):
    """A row of ``alias_tokens`` (a ``uuid`` key) named by the event's key: a uuid's text, in either case."""
    row = tx.read("alias_tokens", event.key)
    tx.write("alias_tokens", event.key, uses=(0 if row is None else row["uses"]) + 1)


# --- actions that do not -------------------------------------------------------------------------------------

def reads_another_table(tx, event):
    seen = tx.read("milestones", (event.key, 0))
    tx.write("counters", event.key, events=1 if seen is None else 2)


def reads_another_key(tx, event):
    other = tx.read("counters", "shared")
    tx.write("counters", event.key, total=0 if other is None else other["total"])


def inserts(tx, event):
    tx.write("counters", event.key, events=1)
    tx.insert("milestones", key=event.key, threshold=event.payload["seq"], seq=event.payload["seq"])


def emits(tx, event):
    tx.write("counters", event.key, events=1)
    tx.emit("unheard", key=event.key)


def _bump(tx, key):
    tx.write("counters", key, total=1)


def passes_tx(tx, event):
    tx.write("counters", event.key, events=1)
    _bump(tx, event.key)


def writes_an_unknown_table(tx, event):
    tx.write("no_such_table", event.key, events=1)


def count_suffixed_milestone(tx, event):
    row = tx.read("milestones", (event.key, 0))
    tx.write("milestones", (event.key, 0), seq=1 if row is None else row["seq"] + 1)


def reads_the_event_otherwise(tx, event):
    tx.write("counters", event.key, trail=event.describe())


def key_from_a_local(tx, event):
    suffix = "-y"
    key = event.key + suffix
    tx.write("counters", key, events=1)


def key_assigned_twice(tx, event):
    key = event.key
    if event.payload["amount"]:
        key = "other"
    tx.write("counters", key, events=1)


def _count_into(tx, event, amount):
    row = tx.read(COUNTERS, event.key)
    tx.write(COUNTERS, event.key, events=1 if row is None else row["events"] + 1,
             total=amount + (0 if row is None else row["total"]))


def count_through_a_helper(tx, event):
    """The counter, its read and write in a helper given ``tx`` and the event."""
    if event.payload["amount"] < 0:
        raise ValueError(f"negative amount {event.payload['amount']} for {event.key}")
    _count_into(tx, event, event.payload["amount"])


def _big(tx, event):
    row = tx.read(COUNTERS, event.key)
    return row is not None and row["total"] > 5


def over_five_through_a_helper(tx, event):
    return _big(tx, event)


def _bump_other(tx, event):
    tx.write(COUNTERS, "other", events=1)


def helper_names_another_row(tx, event):
    tx.write(COUNTERS, event.key, events=1)
    _bump_other(tx, event)


def helper_keeps_tx(tx, event):
    tx.write(COUNTERS, event.key, events=1)
    _keep(tx, event)


KEPT = []


def _keep(tx, event):
    KEPT.append(tx)


def _note(tx, detail):
    tx.insert("events_seen", rule="count_and_note", detail=detail)


def count_and_note(tx, event):
    """The counter, and a row of ``events_seen`` per event through a helper (its key the table's identity); a negative
    amount rejected after both; an amount of 99 names the new row's key, which a batch cannot (it falls back)."""
    row = tx.read(COUNTERS, event.key)
    tx.write(COUNTERS, event.key, events=1 if row is None else row["events"] + 1)
    _note(tx, f"{event.key}:{event.payload['seq']}:{0 if row is None else row['events']}")
    if event.payload["amount"] == 99:
        tx.insert("events_seen", id=10_000 + event.payload["seq"], rule="count_and_note", detail=f"{event.key}:fixed")
    if event.payload["amount"] < 0:
        raise ValueError(f"negative amount {event.payload['amount']} for {event.key}")


def uses_an_inserted_key(tx, event):
    tx.write(COUNTERS, event.key, events=1)
    made = tx.insert("events_seen", rule="x")
    tx.write(COUNTERS, event.key, trail=str(made))


def test_the_static_check():
    assert learned_table(count_amount).table == "counters" and learned_table(count_amount).key is None
    assert learned_table(add_or_refuse).table == "counters"
    assert learned_table(count_suffixed).table == "counters" and learned_table(count_suffixed).key is not None
    assert learned_table(count_by_constant).table == "counters"     # a global name bound to a string
    assert learned_table(count_by_tuple).table == "counters" and learned_table(count_by_tuple).key is None
    assert learned_table(suffixed_by_tuple).key_source == learned_table(count_suffixed).key_source != ""
    assert learned_table(inserts).inserts == {"milestones"} and learned_table(count_and_note).inserts == {"events_seen"}
    for action in (reads_another_table, reads_another_key, uses_an_inserted_key, emits, passes_tx, reads_the_event_otherwise,
                   lambda tx, event: tx.write("counters", event.key, events=1), print, key_from_a_local,
                   key_assigned_twice, table_not_a_string, table_from_a_local, key_from_an_unpacked_value):
        assert learned_table(action) is None, action


@pytest.mark.parametrize(("action", "why"), [
    (reads_another_table, "it names a row by an expression: use event.key"),
    (reads_another_key, "it names a row by an expression"),
    (uses_an_inserted_key, "it uses the key tx.insert returns"),
    (emits, "it calls tx.emit"),
    (passes_tx, "it passes tx to _bump()"),
    (reads_the_event_otherwise, "it uses event other than as event.key"),
    (key_from_a_local, "it computes its key from the local name 'suffix'"),
    (key_assigned_twice, "it names its row by 'key', which is not assigned exactly once"),
    (key_from_an_unpacked_value, "it names its row by 'who', which is not assigned exactly once"),
    (table_not_a_string, "it names a table by an expression"),
    (table_from_a_local, "it names a table by an expression"),
    (lambda tx, event: tx.write("counters", event.key, events=1), "it is a lambda"),
    (helper_names_another_row, "it passes tx to _bump_other() ("),
    (helper_names_another_row, "where it names a row by an expression"),
    (helper_keeps_tx, "it passes tx to _keep() ("),
    (helper_keeps_tx, "where it passes tx to KEPT.append()"),
    (print, "is not a plain Python function"),
])
def test_the_static_check_says_why_it_refuses_with_the_line_to_blame(action, why):
    reason = why_not_learned(action)
    assert reason is not None and why in reason, reason
    assert why_not_learned(count_amount) is None and why_not_learned(over_five, condition=True) is None
    assert why_not_learned(writes_in_a_condition, condition=True).startswith("it calls tx.write (a condition only reads)")
    if action is passes_tx:                     # the line of the call that passes tx on
        import inspect

        first = inspect.getsourcelines(passes_tx)[1]
        here = os.path.relpath(__file__) if __file__.startswith(os.getcwd() + os.sep) else __file__
        assert f"({here}:{first + 2}), where it names a row without being passed the event" in reason, reason


def test_a_source_edited_since_the_import_is_not_the_code_running(tmp_path, monkeypatch):
    module = tmp_path / "edited_rules.py"
    original = ("def bump(tx, event):\n"
                "    row = tx.read('counters', event.key)\n"
                "    tx.write('counters', event.key, events=1 if row is None else row['events'] + 1)\n")
    module.write_text(original)
    monkeypatch.syspath_prepend(str(tmp_path))
    import edited_rules

    assert learned_table(edited_rules.bump).table == "counters"
    import importlib

    edited = importlib.reload(edited_rules)          # a fresh function object: a fresh verdict
    module.write_text(original.replace("events=1 if", "total=7, events=1 if"))
    assert learned_table(edited.bump) is None        # the file says something else than the code running
    import sys

    sys.modules.pop("edited_rules", None)


def rows(batch: int, specs: list[tuple[str, str, int]]) -> Batch:
    """A numbered batch of events ``(type, key, amount)``, a second apart."""
    return Batch(batch, [{"type": kind, "key": key, "ts": BASE + dt.timedelta(seconds=batch * 100 + second),
                          "amount": amount, "seq": batch * 100 + second}
                         for second, (kind, key, amount) in enumerate(specs)], None)


@pytest.fixture(scope="module")
def databases(make_database_url):
    """Two databases with the test application's tables and no rules yet: lowering on, lowering off."""
    made = []
    try:
        for suffix in ("learned_on", "learned_off"):
            database = activedb.connect(make_database_url(suffix, migrations=()))
            made.append(database)
            database.upgrade_app(app_counters.MIGRATIONS)
        yield made
    finally:
        for database in made:
            database.close()


def state(database, prefix: str) -> list[tuple]:
    with database.engine.connect() as connection:
        return [tuple(row) for row in connection.execute(sa.text(
            "SELECT * FROM counters WHERE key LIKE :prefix ORDER BY key"), {"prefix": f"{prefix}%"})]


def letters(database, source: str) -> list[tuple]:
    """``(batch, reason, raw)`` of the source's dead letters (transaction ids and the database's name, which
    differ, left out)."""
    with database.engine.connect() as connection:
        return [(batch, re.sub(r" in T[0-9.]+|learned_o(n|ff)", "", reason), raw) for batch, reason, raw in connection.execute(
            sa.text("SELECT batch_id, reason, raw FROM activedb_dead_letters WHERE query_id LIKE :source ORDER BY id"),
            {"source": f"{source}%"})]


def run_both(databases, source: str, batches: list[Batch], register) -> list[object | None]:
    """Feed ``batches`` one by one into both databases (rules registered by ``register(db)``); per batch, the
    lowering handler's ``last_lowered`` after it.  Asserts equal tables, dead letters and ledger counts."""
    on, off = databases
    register(on)
    register(off)
    lowering, firing = RulesHandler(), RulesHandler(lower_declared=False)
    lowered, outcomes = [], []
    for batch in batches:
        [outcome] = feed(on, [batch], source=source, mapping=app_counters.MAPPING, handler=lowering)
        [reference] = feed(off, [batch], source=source, mapping=app_counters.MAPPING, handler=firing)
        lowered.append(lowering.last_lowered)
        assert firing.last_lowered is None
        assert (outcome.events, outcome.dead_letters, outcome.rule_firings) == (
            reference.events, reference.dead_letters, reference.rule_firings)
    assert state(on, source) == state(off, source)
    assert letters(on, source) == letters(off, source)
    return lowered


def test_a_counter_rule_is_lowered_with_the_tables_of_firing_it(databases):
    def register(database):
        database.rule(on=database.stream("count"), name="count_amount")(count_amount)
        database.rule(on=database.stream("suffixed"), name="count_suffixed")(count_suffixed)

    source = "cnt"
    batches = [rows(0, [("count", "cnt-a", 5), ("count", "cnt-b", 1), ("count", "cnt-a", 2), ("count", "cnt-a", 0)]),
               rows(1, [("count", "cnt-b", 3), ("count", "cnt-c", 0), ("count", "cnt-d", 4), ("count", "cnt-d", 1),
                        ("count", "cnt-a", 1)]),
               rows(2, [("count", "cnt-c", 7), ("suffixed", "cnt-c", 7), ("count", "cnt-c", 7), ("count", "cnt-e", 0),
                        ("suffixed", "cnt-c", 1), ("suffixed", "cnt-f", 1), ("count", "cnt-b", 1)])]
    lowered = run_both(databases, source, batches, register)
    assert all(pending is not None for pending in lowered), lowered
    assert batch.why_not_lowered(databases[0], "count") is None
    assert batch.why_not_lowered(databases[0], "no-rule-here") == "no rule fires on it"
    assert [row[0] for row in state(databases[0], source)] == [
        "cnt-a", "cnt-b", "cnt-c", "cnt-c-x", "cnt-d", "cnt-f-x"]   # (e: none)


PAYLOADS: list[dict] = []


def keep_payload(tx, event):
    """Keeps each event's payload and marks it (both allowed: the payload is the event's own copy)."""
    PAYLOADS.append(event.payload)
    event.payload["kept_as"] = f"{event.source}:{event.key}:{event.payload['seq']}"
    row = tx.read("counters", event.key)
    tx.write("counters", event.key, events=1 if row is None else row["events"] + 1, trail=event.payload["kept_as"])


def test_each_event_of_a_lowered_batch_gives_its_rules_its_own_values_and_payload(databases):
    """The lean run gives a chain's rules one stream event per run, each event's values in turn
    (``key_and_event(into=...)``): a rule that keeps the payload it was given, and writes into it, finds each
    event's own — as firing gives it — and the tables are firing's."""
    def register(database):
        database.rule(on=database.stream("keep"), name="keep_payload")(keep_payload)

    source = "keep"
    batches = [rows(0, [("keep", "keep-a", 1), ("keep", "keep-b", 2), ("keep", "keep-a", 3)]),
               rows(1, [("keep", "keep-c", 4), ("keep", "keep-a", 5)])]
    PAYLOADS.clear()
    lowered = run_both(databases, source, batches, register)
    assert all(pending is not None for pending in lowered), lowered
    marks = [payload["kept_as"] for payload in PAYLOADS]
    # Each run's payloads: the lowered database's batch, then firing's, per batch (``run_both`` feeds them in turn).
    assert marks == ["keep:keep-a:0", "keep:keep-b:1", "keep:keep-a:2"] * 2 + ["keep:keep-c:100", "keep:keep-a:101"] * 2
    assert len({id(payload) for payload in PAYLOADS}) == len(PAYLOADS)
    assert [row[:1] + row[2:3] for row in state(databases[0], source)] == [("keep-a", 3), ("keep-b", 1), ("keep-c", 1)]


KEPT_EVENTS: list[tuple[object, str]] = []


def _kept_key(event):
    """A key function that keeps the event it is given (with its key then), as a cache or a debugging aid might."""
    KEPT_EVENTS.append((event, event.key))
    return f"{event.key}-k"


def count_keeping_events(tx, event):
    key = _kept_key(event)
    row = tx.read("counters", key)
    tx.write("counters", key, events=1 if row is None else row["events"] + 1)


def test_a_key_expression_that_keeps_its_event_gets_each_events_own(databases):
    """A key expression may pass the event itself to a function (``KEY = key_of(event)``), which may keep it: every
    event kept still has its own values, as in firing.  (Such a chain is given no scratch event, ``reuses_event``;
    today its events are also declared before the run, the router not knowing its key, and declared events get
    events of their own.)"""
    assert learned_table(count_keeping_events).passes_event
    assert learned_table(count_suffixed).passes_event
    assert not learned_table(count_amount).passes_event and not learned_table(count_by_tuple).passes_event

    def register(database):
        database.rule(on=database.stream("kept"), name="count_keeping_events")(count_keeping_events)

    KEPT_EVENTS.clear()
    lowered = run_both(databases, "kept", [rows(0, [("kept", "kept-a", 1), ("kept", "kept-b", 2)]),
                                           rows(1, [("kept", "kept-a", 3), ("kept", "kept-b", 4),
                                                    ("kept", "kept-c", 5)])], register)
    assert all(pending is not None for pending in lowered), lowered
    assert KEPT_EVENTS and all(event.key == key for event, key in KEPT_EVENTS), KEPT_EVENTS
    assert {key for _, key in KEPT_EVENTS} == {"kept-a", "kept-b", "kept-c"}


def test_a_table_named_by_a_module_constant_is_lowered_and_a_rebound_constant_falls_back(databases, monkeypatch):
    def register(database):
        database.rule(on=database.stream("const"), name="count_by_constant")(count_by_constant)

    source = "const"
    lowered = run_both(databases, source, [rows(0, [("const", "const-a", 1), ("const", "const-b", 2),
                                                    ("const", "const-a", 3)])], register)
    assert lowered[0] is not None
    assert [row[0] for row in state(databases[0], source)] == ["const-a", "const-b"]
    # Rebound since the verdict: the action names another table than the one learned; the stand-in sees it, the
    # batch fires event by event, and each event fails as firing it fails.
    monkeypatch.setitem(count_by_constant.__globals__, "COUNTERS", "no_such_table")
    lowered = run_both(databases, source, [rows(1, [("const", "const-a", 1), ("const", "const-c", 1)])],
                       lambda database: None)
    assert lowered == [None]
    assert [batch for batch, _, _ in letters(databases[0], source)] == [1, 1]


def counts(database, names) -> dict[str, tuple[int, int, int, int, int]]:
    """Each rule's counters (fired, executed, failed, condition false, cancelled) in ``database``."""
    per_rule = database.rules.statistics().per_rule
    return {name: (per_rule[name].fired, per_rule[name].executed, per_rule[name].failed, per_rule[name].condition_false,
                   per_rule[name].cancelled) for name in names if name in per_rule}


def test_a_key_unpacked_from_a_tuple_assignment_is_lowered_in_a_chain_with_event_key(databases):
    """``who, amount = event.key, …`` names the event's row as ``event.key`` does: with a condition reading the row by
    ``event.key`` the two rules are one chain, lowered with firing's tables."""
    def register(database):
        stream = database.stream("tuple")
        database.rule(on=stream, name="count_by_tuple", priority=2)(count_by_tuple)
        database.rule(on=stream, name="tuple_mark", priority=1, when=over_five)(mark_big)

    source = "tuple"
    lowered = run_both(databases, source, [rows(0, [("tuple", "tuple-a", 3), ("tuple", "tuple-a", 7),
                                                    ("tuple", "tuple-b", 9)])], register)
    assert lowered[0] is not None


def moved_by(then: dict[str, tuple[int, ...]], now: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """Each rule's counters in ``now`` less those in ``then`` (a rule not in ``then``: from zero)."""
    return {name: tuple(a - b for a, b in zip(counters, then.get(name, (0,) * len(counters))))
            for name, counters in now.items()}


def test_an_action_that_raises_rejects_its_event_in_the_lowered_batch_as_firing_does(databases):
    def register(database):
        database.rule(on=database.stream("addr"), name="add_or_refuse")(add_or_refuse)

    source = "raise"
    batches = [rows(0, [("addr", "raise-a", 1), ("addr", "raise-b", 2)]),
               rows(1, [("addr", "raise-a", 3), ("addr", "raise-a", -1), ("addr", "raise-c", 4), ("addr", "raise-a", 5)]),
               rows(2, [("addr", "raise-b", 1), ("addr", "raise-c", 1)])]
    lowered = run_both(databases, source, batches, register)
    # Every batch lowered, the one with the raising event too: that event is its dead letter, named as firing names it.
    assert all(pending is not None for pending in lowered), lowered
    [(batch, reason, _)] = letters(databases[0], source)
    assert batch == 1 and reason == ("rejected by rule 'add_or_refuse': rule 'add_or_refuse' failed on stream addr "
                                     "key='raise-a': ValueError('negative amount -1 for raise-a')")
    on, off = (counts(database, ["add_or_refuse"]) for database in databases)
    assert on == off == {"add_or_refuse": (8, 7, 1, 0, 0)}


class Unshown(Unshowable):
    """A rule's error whose ``repr`` raises, counting its calls (``shown``): each is a description of the failure."""

    shown = 0

    def __repr__(self) -> str:
        type(self).shown += 1
        return super().__repr__()


def add_or_refuse_unshowably(tx, event):
    if event.payload["amount"] < 0:
        raise Unshown()
    row = tx.read("counters", event.key) or {"total": 0, "events": 0}
    tx.write("counters", event.key, total=row["total"] + event.payload["amount"], events=row["events"] + 1)


def test_a_rejected_event_is_logged_as_firing_logs_it_its_error_shown_once(databases, caplog):
    """The record of an event a rule rejects is one, and the same in a lowered batch as in firing event by event
    (``RuleFailed.logged``), and the rule's error is shown once for it: the record and the dead letter's reason share
    the text.  Before, a lowered batch showed the error with ``repr`` of its own, a second time beside the failure's
    message, and firing twice too — and an error whose ``repr`` raises escaped the lowered batch's rejection, which
    refused the attempt: the batch ran again event by event, and so did every later batch of the rule."""
    def register(database):
        database.rule(on=database.stream("unshown"), name="unshowable")(add_or_refuse_unshowably)

    source = "unshown"
    batches = [rows(0, [("unshown", "unshown-a", 1), ("unshown", "unshown-b", -1), ("unshown", "unshown-a", 2)]),
               rows(1, [("unshown", "unshown-a", -2), ("unshown", "unshown-c", 3)])]
    on, off = databases
    register(on)
    register(off)
    lowering, firing = RulesHandler(), RulesHandler(lower_declared=False)
    logged: dict[str, list[str]] = {"on": [], "off": []}
    shown: dict[str, int] = {"on": 0, "off": 0}
    for batch in batches:
        for side, database, handler in (("on", on, lowering), ("off", off, firing)):
            Unshown.shown = 0
            caplog.clear()
            with caplog.at_level(logging.ERROR, logger="activedb.rules"):
                [outcome] = feed(database, [batch], source=source, mapping=app_counters.MAPPING, handler=handler)
            assert (outcome.events, outcome.dead_letters) == (len(batch.rows) - 1, 1), (side, outcome)
            logged[side] += [re.sub(r" in T[0-9.]+", "", record.getMessage()) for record in caplog.records
                             if record.name == "activedb.rules"]
            shown[side] += Unshown.shown
        assert lowering.last_lowered is not None, "the batch with the rejected event ran lowered"
    assert logged["on"] == logged["off"] == [
        f"rule 'unshowable' failed on stream unshown key='{key}': Unshown(<repr failed: RuntimeError: repr broke>)"
        for key in ("unshown-b", "unshown-a")], logged
    assert shown == {"on": 2, "off": 2}, shown
    assert letters(on, source) == letters(off, source)
    assert [reason for _, reason, _ in letters(on, source)] == [f"rejected by rule 'unshowable': {line}"
                                                                  for line in logged["on"]]


class Unrecoverable(activedb.ActivedbError):
    """An error of activedb's own kind raised by a rule: firing treats those by kind, so a lowered batch does not
    take it for the rule's rejection of its event."""


def add_or_refuse_hard(tx, event):
    if event.payload["amount"] < 0:
        raise Unrecoverable(f"negative amount for {event.key}")
    row = tx.read("counters", event.key) or {"total": 0, "events": 0}
    tx.write("counters", event.key, total=row["total"] + event.payload["amount"], events=row["events"] + 1)


def refuse_odd_after_counting(tx, event):
    """In a chain after the counter: a rejection after a rule of the chain wrote the row (firing undoes both)."""
    if event.payload["amount"] % 2:
        raise ValueError(f"odd amount {event.payload['amount']} for {event.key}")


def test_a_rule_raising_inside_a_chain_rejects_its_event_and_the_counters_move_as_firing_moves_them(databases):
    """The counter, then a rule that raises where the amount is odd (after the counter wrote the row), then the counter
    again where the amount is odd (never reached for those): the event's dead letter, no write of it, the first rule
    cancelled (the event's rejection undid it), the second failed, the third not run: cancelled, stopped by that
    failure — as firing it.  (Each firing ends in one outcome: before, the third counted fired and nothing else, on
    both paths.)"""
    names = ("rchain_count", "rchain_refuse", "rchain_again")

    def register(database):
        stream = database.stream("rchain")
        database.rule(on=stream, name="rchain_count", priority=3)(count_amount)
        database.rule(on=stream, name="rchain_refuse", priority=2, when=over_five)(refuse_odd_after_counting)
        database.rule(on=stream, name="rchain_again", priority=1, when=payload_says_so)(count_amount)

    source = "rchain"
    before = [counts(database, names) for database in databases]
    batches = [rows(0, [("rchain", "rchain-a", 3), ("rchain", "rchain-a", 4), ("rchain", "rchain-b", 9),
                        ("rchain", "rchain-a", 2), ("rchain", "rchain-a", 1)]),
               rows(1, [("rchain", "rchain-b", 7), ("rchain", "rchain-c", 2), ("rchain", "rchain-c", 6)])]
    lowered = run_both(databases, source, batches, register)
    assert all(pending is not None for pending in lowered), lowered
    after = [counts(database, names) for database in databases]
    moved = [moved_by(then, now) for now, then in zip(after, before)]
    assert moved[0] == moved[1]
    assert moved[0]["rchain_refuse"][2] > 0 and len(letters(databases[0], source)) == moved[0]["rchain_refuse"][2]
    assert moved[0]["rchain_again"][4] == moved[0]["rchain_refuse"][2], moved[0]
    assert moved[0]["rchain_count"][4] == moved[0]["rchain_refuse"][2], moved[0]      # undone with its event
    assert all(fired == sum(outcomes) for fired, *outcomes in moved[0].values()), moved[0]


def test_a_rule_raising_an_error_of_activedb_makes_the_batch_fall_back_to_firing(databases):
    def register(database):
        database.rule(on=database.stream("hard"), name="add_or_refuse_hard")(add_or_refuse_hard)

    source = "hard"
    batches = [rows(0, [("hard", "hard-a", 1), ("hard", "hard-b", 2)]),
               rows(1, [("hard", "hard-a", 3), ("hard", "hard-a", -1), ("hard", "hard-c", 4)]),
               rows(2, [("hard", "hard-b", 1)])]
    lowered = run_both(databases, source, batches, register)
    # Lowered first; the batch with the raising event ran event by event, and the rule is not tried again.
    assert lowered[0] is not None and lowered[1:] == [None, None]
    [(batch, reason, _)] = letters(databases[0], source)
    assert batch == 1 and "rejected by rule 'add_or_refuse_hard'" in reason


def test_rules_whose_action_and_condition_pass_tx_to_helpers_are_lowered_with_the_tables_of_firing_them(databases):
    """The check follows ``tx`` and the event into module functions (``helper(tx, event, ...)``): a chain whose action
    and condition read and write through helpers is lowered, a raise before the helper rejects its event, and the
    tables, dead letters and counters are firing's."""
    kind = "helper"

    def register(database):
        stream = database.stream(kind)
        database.rule(on=stream, name=f"{kind}-count", priority=2)(count_through_a_helper)
        database.rule(on=stream, name=f"{kind}-mark", priority=1, when=over_five_through_a_helper)(mark_big)

    batches = [rows(0, [(kind, f"{kind}-a", 3), (kind, f"{kind}-b", 2), (kind, f"{kind}-a", 4)]),
               rows(1, [(kind, f"{kind}-a", -1), (kind, f"{kind}-c", 7), (kind, f"{kind}-b", 5)])]
    assert learned_table(count_through_a_helper).table == "counters"
    lowered = run_both(databases, kind, batches, register)
    assert all(pending is not None for pending in lowered), lowered
    assert batch.why_not_lowered(databases[0], kind) is None
    assert len(letters(databases[0], kind)) == 1


def notes(database, prefix: str) -> list[tuple]:
    with database.engine.connect() as connection:
        return [tuple(row) for row in connection.execute(sa.text(
            "SELECT rule, detail FROM events_seen WHERE detail LIKE :prefix ORDER BY id"), {"prefix": f"{prefix}%"})]


def test_a_rule_that_inserts_rows_is_lowered_with_the_rows_of_firing_it(databases):
    """``tx.insert`` into a table whose key is its sequence's (here through a helper): the lowered batch inserts the
    rows firing inserts, in the same order, none of a rejected event; a batch where an action names the new row's key
    falls back to firing."""
    kind = "note"

    def register(database):
        database.rule(on=database.stream(kind), name=kind)(count_and_note)

    batches = [rows(0, [(kind, f"{kind}-a", 3), (kind, f"{kind}-b", 2), (kind, f"{kind}-a", -1), (kind, f"{kind}-a", 4)]),
               rows(1, [(kind, f"{kind}-c", 7), (kind, f"{kind}-b", 5)]),
               rows(2, [(kind, f"{kind}-c", 1), (kind, f"{kind}-d", 99)])]
    lowered = run_both(databases, kind, batches, register)
    assert [pending is not None for pending in lowered] == [True, True, False], lowered
    assert batch.why_not_lowered(databases[0], kind) is None
    made = notes(databases[0], kind)
    assert made == notes(databases[1], kind) and len(made) == 8, made
    assert [detail for _, detail in made][:3] == ["note-a:0:0", "note-b:1:0", "note-a:3:1"]
    assert len(letters(databases[0], kind)) == 1


def _detail(key, payload) -> str:
    """The detail of the event's ``events_seen`` row: holding a NUL, which PostgreSQL cannot store (``tx.insert``
    refuses it), for an amount of 13."""
    return f"{key}:{payload['seq']}" + ("\x00" if payload["amount"] == 13 else "")


def note_or_mark(tx, event):
    """The counter, after a row of ``events_seen``: a row ``tx.insert`` refuses is caught, the counter marked
    ``refused`` instead, and the rule goes on."""
    row = tx.read(COUNTERS, event.key)
    try:
        tx.insert("events_seen", rule="note_or_mark", detail=_detail(event.key, event.payload))
    except InvalidValue:
        tx.write(COUNTERS, event.key, trail="refused")
    tx.write(COUNTERS, event.key, events=1 if row is None else row["events"] + 1)


def note_only(tx, event):
    """A row of ``events_seen``, uncaught: a row ``tx.insert`` refuses fails the rule."""
    tx.insert("events_seen", rule="note_only", detail=_detail(event.key, event.payload))


def test_a_rule_that_catches_the_refusal_of_a_row_it_inserts_is_lowered_as_firing_runs_it(databases):
    """The lowered batch leaves an inserted row's check to its commit (a column at a time); a value it refuses makes it
    run the batch again checking each row as ``tx.insert`` does: a rule that catches the refusal goes on as firing's
    does — the row not inserted, the counter marked — and the batch stays lowered, no dead letter."""
    kind = "catch"

    def register(database):
        database.rule(on=database.stream(kind), name="note_or_mark")(note_or_mark)

    batches = [rows(0, [(kind, f"{kind}-a", 1), (kind, f"{kind}-b", 13), (kind, f"{kind}-a", 2)]),
               rows(1, [(kind, f"{kind}-b", 3), (kind, f"{kind}-c", 13)])]
    lowered = run_both(databases, kind, batches, register)
    assert all(pending is not None for pending in lowered), lowered
    assert [(key, events, trail) for key, _, events, trail, _ in state(databases[0], kind)] == [
        ("catch-a", 2, ""), ("catch-b", 2, "refused"), ("catch-c", 1, "refused")]
    made = sorted(notes(databases[0], kind))
    assert made == sorted(notes(databases[1], kind)) and len(made) == 3, made
    assert letters(databases[0], kind) == []
    on, off = (counts(database, ["note_or_mark"]) for database in databases)
    assert on == off == {"note_or_mark": (5, 5, 0, 0, 0)}


def test_a_chain_whose_first_rule_inserts_a_refused_row_runs_no_later_rule_as_firing_runs_none(databases):
    """A chain: a row of ``events_seen``, then the counter.  An event whose row ``tx.insert`` refuses fails the first
    rule and is a dead letter, the counter not run for it, on both paths: the lowered batch, whose commit finds the
    value, runs the batch again checking each row, where the refusal makes it fire the batch (an error of activedb's,
    not the rule's rejection)."""
    kind = "uncaught"
    names = ("note_only", "count_after_note")

    def register(database):
        stream = database.stream(kind)
        database.rule(on=stream, name="note_only", priority=2)(note_only)
        database.rule(on=stream, name="count_after_note", priority=1)(count_amount)

    before = [counts(database, names) for database in databases]
    batches = [rows(0, [(kind, f"{kind}-a", 1), (kind, f"{kind}-a", 2)]),
               rows(1, [(kind, f"{kind}-a", 13), (kind, f"{kind}-b", 4), (kind, f"{kind}-a", 5)])]
    lowered = run_both(databases, kind, batches, register)
    assert [pending is not None for pending in lowered] == [True, False], lowered
    assert [(key, total, events) for key, total, events, _, _ in state(databases[0], kind)] == [
        ("uncaught-a", 7, 3), ("uncaught-b", 0, 1)]
    # (the rows as a set: firing's come with ids of the process's generated-key block, which an earlier firing into
    # the table may have reserved before the lowered batches' ids)
    made = sorted(notes(databases[0], kind))
    assert made == sorted(notes(databases[1], kind)) and len(made) == 4, made
    [(batch_id, reason, _)] = letters(databases[0], kind)
    assert batch_id == 1 and "InvalidValue" in reason and "NUL" in reason, reason
    moved = [moved_by(then, now) for now, then in zip((counts(database, names) for database in databases), before)]
    assert moved[1] == {"note_only": (5, 4, 1, 0, 0), "count_after_note": (5, 4, 0, 0, 1)}, moved[1]
    # (the lowered attempt the refusal aborted counts its 3 firings per rule as an aborted tree's: fired, cancelled)
    assert moved[0] == {name: (fired + 3, executed, failed, false, cancelled + 3)
                        for name, (fired, executed, failed, false, cancelled) in moved[1].items()}, moved[0]


def test_a_chain_of_rules_with_conditions_is_lowered_with_the_tables_and_counters_of_firing_it(databases):
    """Three rules on one type and one row, in priority order: the counter, then a mark where the row the counter
    just wrote is over five (a condition reading the row after the write), then, where the amount is odd (a condition
    of the event alone), the counter again.  Lowered, each batch leaves what firing leaves, and each rule's counters
    (fired, executed, condition false) move as firing moves them."""
    names = ("chain_count", "chain_mark", "chain_again")

    def register(database):
        stream = database.stream("chain")
        database.rule(on=stream, name="chain_count", priority=3)(count_amount)
        database.rule(on=stream, name="chain_mark", priority=2, when=over_five)(mark_big)
        database.rule(on=stream, name="chain_again", priority=1, when=payload_says_so)(count_amount)

    def counts(database):
        per_rule = database.rules.statistics().per_rule
        return {name: (per_rule[name].fired, per_rule[name].executed, per_rule[name].condition_false)
                for name in names if name in per_rule}

    source = "chain"
    before = [counts(database) for database in databases]
    batches = [rows(0, [("chain", "chain-a", 3), ("chain", "chain-b", 2), ("chain", "chain-a", 4)]),
               rows(1, [("chain", "chain-a", 0), ("chain", "chain-c", 7), ("chain", "chain-b", 5),
                        ("chain", "chain-c", 1)])]
    lowered = run_both(databases, source, batches, register)
    assert all(pending is not None for pending in lowered), lowered
    after = [counts(database) for database in databases]
    moved = [moved_by(then, now) for now, then in zip(after, before)]
    assert moved[0] == moved[1]
    assert moved[0]["chain_count"] == (7, 7, 0) and moved[0]["chain_mark"][0] == 7
    assert 0 < moved[0]["chain_mark"][1] < 7 and 0 < moved[0]["chain_again"][1] < 7


@pytest.mark.parametrize("variant", ["same priority", "two tables", "condition writes"])
def test_chains_that_firing_could_run_otherwise_are_not_lowered(databases, variant):
    """Not lowered: two rules of one priority (they may run concurrently), rules on different tables, a condition that
    writes.  (An exclusive causally dependent rule beside the chain is lowered: the detached family's test.)"""
    kind = f"chain-{variant.replace(' ', '-')}"

    def register(database):
        stream = database.stream(kind)
        database.rule(on=stream, name=f"{kind}-1", priority=2)(count_amount)
        if variant == "same priority":
            database.rule(on=stream, name=f"{kind}-2", priority=2)(stamp)
        elif variant == "two tables":
            database.rule(on=stream, name=f"{kind}-2", priority=1)(count_suffixed_milestone)
        else:
            database.rule(on=stream, name=f"{kind}-2", priority=1, when=writes_in_a_condition)(mark_big)

    lowered = run_both(databases, kind, [rows(0, [(kind, f"{kind}-a", 7), (kind, f"{kind}-b", 2),
                                                  (kind, f"{kind}-a", 3)])], register)
    assert lowered == [None]
    why = {"same priority": f"rules '{kind}-1', '{kind}-2' share priority 2: they may run concurrently",
           "two tables": f"the action of rule '{kind}-2': it names a row by an expression",
           "condition writes": f"the condition of rule '{kind}-2': it calls tx.write (a condition only reads)",
           }[variant]
    assert why in (batch.why_not_lowered(databases[0], kind) or ""), batch.why_not_lowered(databases[0], kind)


@pytest.mark.parametrize("variant", ["another table", "another key", "insert", "emit", "helper", "condition",
                                     "deferred", "unknown table"])
def test_rules_that_do_more_are_not_lowered(databases, variant):
    kind = f"more-{variant.replace(' ', '-')}"

    def register(database):
        stream = database.stream(kind)
        if variant == "condition":
            database.rule(on=stream, when=lambda tx, event: event.payload["amount"] > 1, name=kind)(add_or_refuse)
        elif variant == "deferred":
            database.rule(on=stream, coupling=Coupling.DEFERRED, name=kind)(add_or_refuse)
        else:
            action = {"another table": reads_another_table, "another key": reads_another_key, "insert": inserts,
                      "emit": emits, "helper": passes_tx, "unknown table": writes_an_unknown_table}[variant]
            database.rule(on=stream, name=kind)(action)

    lowered = run_both(databases, kind, [rows(0, [(kind, f"{kind}-a", 1), (kind, f"{kind}-b", 2),
                                                  (kind, f"{kind}-a", 3)])], register)
    assert lowered == [None]
    why = {"another table": f"the action of rule '{kind}': it names a row by an expression",
           "another key": "by an expression", "insert": "a rule inserts into 'milestones', whose key is not one column with a sequence",
           "emit": "it calls tx.emit", "helper": "it passes tx to _bump()",
           "condition": f"the condition of rule '{kind}': it is a lambda", "deferred": "is deferred: a batch runs immediate rules and records the detached family's",
           "unknown table": "no table 'no_such_table'"}[variant]
    assert why in (batch.why_not_lowered(databases[0], kind) or ""), batch.why_not_lowered(databases[0], kind)


@pytest.mark.parametrize("exists", [True, False], ids=["existing rows", "new rows"])
def test_a_row_named_by_two_values_of_its_key_is_one_row_lowered(databases, exists):
    """One batch naming a row of a ``numeric`` key as ``0.1`` (a plain rule) and as ``Decimal('0.1')`` (a declared
    rule), and a row of a ``uuid`` key as its text in either case (a plain rule) and as its ``UUID`` (a declared rule)
    leaves what firing it event by event leaves: the store takes each for one row (``TableInfo.key``), and so does
    the lowered batch.  Before, each value was a state of its own: each read the row as of before the batch, and the
    one written last lost the others' updates (or PostgreSQL refused two inserts of one new row)."""
    import uuid
    from decimal import Decimal

    from activedb import batch

    @batch.declared
    def relabel_decimal(event, ops):
        ops.write("alias_prices", Decimal(event.key),
                  lambda own: {"label": f"{'' if own is None else own['label']}/{event.payload['seq']}"})

    @batch.declared
    def use_uuid(event, ops):
        ops.write("alias_tokens", uuid.UUID(event.key), lambda own: {"uses": (0 if own is None else own["uses"]) + 10})

    token = "6f1c3d2a-9b8e-4c7d-a5f4-3e2d1c0b9a87"
    kinds = {"alias-price": relabel_price, "alias-token": use_token, "alias-decimal": relabel_decimal,
             "alias-uuid": use_uuid}
    for database in databases:
        with database.engine.begin() as connection:
            connection.execute(sa.text("CREATE TABLE IF NOT EXISTS alias_prices (amount numeric PRIMARY KEY, label text);"
                                       "CREATE TABLE IF NOT EXISTS alias_tokens (id uuid PRIMARY KEY, uses integer)"))
            connection.execute(sa.text("TRUNCATE alias_prices, alias_tokens"))
    source = f"alias-{'existing' if exists else 'new'}"
    first = [("alias-price", "0.1"), ("alias-token", token)] if exists else None
    batch_of_aliases = [("alias-price", "0.1"), ("alias-token", token), ("alias-decimal", "0.1"), ("alias-uuid", token),
                        ("alias-token", token.upper()), ("alias-price", "0.1"), ("alias-token", token)]
    batches = [Batch(number, [{"type": kind, "key": key, "ts": BASE + dt.timedelta(seconds=number * 100 + seq),
                               "amount": 0, "seq": seq} for seq, (kind, key) in enumerate(events)], None)
               for number, events in enumerate([events for events in (first, batch_of_aliases) if events])]
    try:
        lowered = run_both(databases, source, batches,
                           lambda database: [database.rule(on=database.stream(kind), name=kind)(action)
                                             for kind, action in kinds.items()])
        assert all(pending is not None for pending in lowered), lowered
        contents = []
        for database in databases:
            with database.engine.connect() as connection:
                contents.append((connection.execute(sa.text("SELECT * FROM alias_prices")).all(),
                                 connection.execute(sa.text("SELECT * FROM alias_tokens")).all()))
        assert contents[0] == contents[1] == ([(Decimal("0.1"), "/0/0/2/5" if exists else "/0/2/5")],
                                              [(uuid.UUID(token), 14 if exists else 13)])
        assert letters(databases[0], source) == []
    finally:
        for database in databases:
            for kind in kinds:
                database.rules.remove(kind)


def _nothing(tx, event):
    """A rule on data events that does nothing: it only has to be there."""


def test_a_rule_on_data_events_keeps_on_the_rule_path_only_the_batches_that_write_its_table(databases):
    """A rule on data events of another table leaves a learned counter lowered, with the tables of firing it; one on
    data events of the counter's own table puts its batches back on the rule path (fired event by event, it hears
    each event's change), and ``why_not_lowered`` says so."""
    kind = "observed"
    added = [f"{kind}-milestones", f"{kind}-counters"]

    def register(database):
        database.rule(on=database.stream(kind), name=kind)(count_amount)
        database.rule(on=database.inserted("milestones"), name=added[0])(_nothing)

    try:
        lowered = run_both(databases, kind, [rows(0, [(kind, f"{kind}-a", 1), (kind, f"{kind}-b", 2),
                                                      (kind, f"{kind}-a", 3)])], register)
        assert all(pending is not None for pending in lowered), lowered
        assert batch.why_not_lowered(databases[0], kind) is None
        for database in databases:
            database.rule(on=database.updated("counters"), name=added[1])(_nothing)
        lowered = run_both(databases, kind, [rows(1, [(kind, f"{kind}-a", 4), (kind, f"{kind}-c", 5)])],
                           lambda database: None)
        assert lowered == [None]
        assert "rules react to data events of counters, which these rules write" in (
            batch.why_not_lowered(databases[0], kind) or "")
    finally:
        for database in databases:
            for name in added:
                if name in database.rules.names():
                    database.rules.remove(name)


def _compensate(tx, event):
    """Exclusive causally dependent: runs only for an event whose processing aborted (a rejected amount)."""
    tx.insert("events_seen", rule="compensate", detail=f"{event.key}:{event.payload['seq']}")


def _notify(tx, event):
    """Detached: runs whatever became of the event."""
    tx.insert("events_seen", rule="notify", detail=f"{event.key}:{event.payload['seq']}")


def _confirm(tx, event):
    """Detached causally dependent: runs only for an event whose processing committed."""
    tx.insert("events_seen", rule="confirm", detail=f"{event.key}:{event.payload['seq']}")


def test_the_detached_family_beside_lowered_rules_runs_with_each_events_outcome_as_firing_runs_it(databases):
    """A type whose immediate rule is lowered may have detached-family rules too: the batch records their firings in
    its commit with each event's outcome — a rejected event's exclusive compensation and detached notice run, its
    causally dependent confirmation is cancelled, and the other way round for an applied event — leaving the rows
    and counters firing leaves."""
    kind = "fam"
    names = [kind, f"{kind}-compensate", f"{kind}-notify", f"{kind}-confirm"]

    def register(database):      # (the detached family declared first: the dead letters still name the right rule)
        stream = database.stream(kind)
        database.rule(on=stream, name=names[1], coupling=Coupling.EXCLUSIVE_CAUSALLY_DEPENDENT)(_compensate)
        database.rule(on=stream, name=names[2], coupling=Coupling.DETACHED)(_notify)
        database.rule(on=stream, name=kind)(add_or_refuse)
        database.rule(on=stream, name=names[3], coupling=Coupling.DETACHED_CAUSALLY_DEPENDENT)(_confirm)

    def seen(database):
        database.rules.wait_idle(120)
        with database.engine.connect() as connection:
            return sorted(tuple(row) for row in connection.execute(sa.text(
                "SELECT rule, detail FROM events_seen WHERE detail LIKE :prefix"), {"prefix": f"{kind}-%"}))

    def counters(database):
        per_rule = database.rules.statistics().per_rule
        return {name: (per_rule[name].fired, per_rule[name].executed, per_rule[name].failed, per_rule[name].cancelled)
                for name in names if name in per_rule}

    batches = [rows(0, [(kind, f"{kind}-a", 3), (kind, f"{kind}-b", -2), (kind, f"{kind}-a", 4)]),
               rows(1, [(kind, f"{kind}-c", -1), (kind, f"{kind}-b", 5)])]
    lowered = run_both(databases, kind, batches, register)
    assert all(pending is not None for pending in lowered), lowered
    assert batch.why_not_lowered(databases[0], kind) is None
    made = [seen(database) for database in databases]
    assert made[0] == made[1]
    assert [detail for rule, detail in made[0] if rule == "compensate"] == ["fam-b:1", "fam-c:100"]
    assert len([1 for rule, _ in made[0] if rule == "notify"]) == 5
    assert len([1 for rule, _ in made[0] if rule == "confirm"]) == 3
    moved = [counters(database) for database in databases]
    assert moved[0] == moved[1], moved
    assert moved[0][names[1]] == (5, 2, 0, 3) and moved[0][names[3]] == (5, 3, 0, 2)


class _ConflictOnce(activedb.lowlevel.CommitParticipant):
    """Fails the first flush it takes part in after every participant wrote — as a serialization failure PostgreSQL
    reports at the commit — so that the flush is tried again (or the batch re-run)."""

    def __init__(self, attempts: list[int]) -> None:
        self.attempts = attempts

    def write(self, transaction, connection) -> None:
        pass

    def about_to_commit(self, transaction, connection) -> None:
        self.attempts.append(1)
        if len(self.attempts) == 1:
            connection.exec_driver_sql(
                "DO $$ BEGIN RAISE EXCEPTION 'conflict for the test' USING ERRCODE = 'serialization_failure'; END $$")


def test_a_lowered_batch_whose_commit_is_tried_again_counts_and_records_its_firings_once(databases):
    """A lowered batch whose flush fails after the batch wrote (a serialization failure at the commit) writes again:
    the rule counters and the detached family's firings are those of the attempt that committed, not of both."""
    database = databases[0]
    kind = "again"
    names = [kind, f"{kind}-notify"]
    database.rule(on=database.stream(kind), name=kind)(add_or_refuse)
    database.rule(on=database.stream(kind), name=names[1], coupling=Coupling.DETACHED)(_notify)

    def counters():
        per_rule = database.rules.statistics().per_rule
        return {name: (per_rule[name].fired, per_rule[name].executed, per_rule[name].failed)
                for name in names if name in per_rule}

    before = counters()
    attempts: list[int] = []
    handler = RulesHandler()
    [outcome] = feed(database, [rows(0, [(kind, f"{kind}-a", 3), (kind, f"{kind}-b", -2), (kind, f"{kind}-a", 4)])],
                     source=kind, mapping=app_counters.MAPPING, handler=handler,
                     participants=lambda batch: [_ConflictOnce(attempts)])
    assert len(attempts) == 2 and handler.last_lowered is not None, attempts
    assert (outcome.committed, outcome.events, outcome.dead_letters) == (True, 2, 1)
    database.rules.wait_idle(120)
    moved = moved_by(before, counters())
    assert moved[kind][1:] == (2, 1) and moved[names[1]][1:] == (3, 0), moved
    with database.engine.connect() as connection:
        notices = connection.execute(sa.text(
            "SELECT detail FROM events_seen WHERE rule = 'notify' AND detail LIKE :prefix"), {"prefix": f"{kind}-%"}).all()
    assert len(notices) == 3, notices
    assert len(state(database, kind)) == 1         # (a; b was refused)


def rounding_counter(tx, event):
    row = tx.read("counters", event.key)
    tx.write("counters", event.key, n=math.floor((row["n"] if row else 0) + 1.5))


def test_an_action_calling_a_function_of_an_imported_module_is_the_code_running():
    """CPython compiles ``math.floor(...)`` on a name the module imports otherwise than alone: the check compiles the
    function's source after the module's imports of the names it uses, so such an action still reads as the code
    running (it was refused as "edited since it was imported")."""
    assert why_not_learned(rounding_counter) is None
    assert learned_table(rounding_counter).table == "counters"


@pytest.mark.parametrize("lowered", [False, True], ids=["event-by-event", "lowered"])
def test_a_batch_run_again_after_a_serialization_conflict_counts_each_executed_firing_once(databases, lowered):
    """A batch whose tree read a row another connection then changed and committed fails its commit with a
    serialization conflict and is run again (``Database.run``, as the ingestion re-runs a batch): the rule's
    ``executed`` counter moves by the firings of the attempt that committed — once per event, on both paths.  Fired
    event by event it counted the aborted attempt's firings too (each firing's subtransaction had committed), twice
    per event; the lowered batch counted once (its counts wait for the commit).  The aborted attempt's firings, fired
    too (counters count attempts), end ``cancelled`` — its abort undid them — on both paths, so ``fired`` is the sum of
    the outcomes; before, they ended in no outcome."""
    # (One database per path: after a conflict ``Database.run`` learns the function's read tables as hot and reads them
    # for update — the other connection's change would then wait for this attempt's lock.)
    database = databases[1 if lowered else 0]
    kind = f"rerun_{'lowered' if lowered else 'by_event'}"
    guard = f"{kind}-guard"
    database.rule(on=database.stream(kind), name=kind)(count_amount)
    with database.engine.begin() as connection:
        connection.execute(sa.text("INSERT INTO counters (key, total, events, trail) VALUES (:key, 0, 0, '')"),
                           {"key": guard})
    events = [{"type": kind, "key": f"{kind}-{n}", "ts": BASE + dt.timedelta(seconds=n),
               "payload": {"amount": 1, "seq": n}} for n in range(3)]

    def executed() -> int:
        counters = database.rules.statistics().per_rule.get(kind)
        return 0 if counters is None else counters.executed

    def fired_and_cancelled() -> tuple[int, int]:
        counters = database.rules.statistics().per_rule.get(kind)
        return (0, 0) if counters is None else (counters.fired, counters.cancelled)

    attempts: list[str] = []

    def run_the_batch(tx):
        attempts.append(tx.id)
        tx.read("counters", guard)
        if len(attempts) == 1:      # another connection changes the row this attempt read, and commits
            with database.engine.begin() as other:
                other.execute(sa.text("UPDATE counters SET events = events + 1 WHERE key = :key"), {"key": guard})
        if lowered:
            plan = batch.lower(database.rules, tx, {kind})
            assert plan is not None, batch.why_not_lowered(database, kind)
            batch.apply_lowered(database.rules, tx, events, plan, dead_letters=None)
        else:
            for event in events:
                tx.emit(kind, key=event["key"], ts=event["ts"], payload=event["payload"])

    before, (fired_before, cancelled_before) = executed(), fired_and_cancelled()
    database.run(run_the_batch, backoff=0)
    assert len(attempts) == 2, f"the batch ran {len(attempts)} time(s), not once again after a conflict: {attempts}"
    assert [row[0] for row in state(database, f"{kind}-") if row[0] != guard] == [event["key"] for event in events]
    assert executed() - before == len(events), (
        f"{kind}: executed moved by {executed() - before} for {len(events)} events that each took effect once")
    fired, cancelled = fired_and_cancelled()
    assert (fired - fired_before, cancelled - cancelled_before) == (2 * len(events), len(events)), (
        f"{kind}: fired moved by {fired - fired_before}, cancelled by {cancelled - cancelled_before} for two attempts "
        f"of {len(events)} events, the first aborted")


# --- lists and dicts a rule changes after handing them over (a JSON column's) -------------------------------------

def append_after_writing(tx, event):
    """Writes the ``lists`` row a list with one more entry, then changes that list and the entry in place: ``tx.write``
    took the values as they were at the call, so neither change is stored."""
    row = tx.read("lists", event.key)
    entry = {"seq": event.payload["seq"]}
    value = [*(row["value"] if row is not None else []), entry]
    tx.write("lists", event.key, value=value)
    entry["late"] = True
    value.append(f"late:{event.payload['seq']}")


def change_what_it_read(tx, event):
    """Changes the list it read, and its entries, in place without writing it back, then reads the row again and
    writes it with one more entry: ``tx.read`` gave a copy, so the changes are not in what the second read sees."""
    row = tx.read("lists", event.key)
    if row is not None:
        row["value"].append("unwritten")
        for entry in row["value"]:
            if isinstance(entry, dict):
                entry["unwritten"] = True
    again = tx.read("lists", event.key)
    tx.write("lists", event.key, value=[*(again["value"] if again is not None else []), {"seq": event.payload["seq"]}])


def insert_then_change(tx, event):
    """Inserts a ``tagged_notes`` row of a list and a dict, then changes both in place: ``tx.insert`` took them as
    they were at the call, so neither change is stored."""
    tags = [event.key]
    meta = {"seq": event.payload["seq"]}
    tx.insert("tagged_notes", tags=tags, meta=meta)
    tags.append("late")
    meta["late"] = True
    tx.write("lists", event.key, value=[event.payload["seq"]])


def _lists_and_notes(database, prefix: str) -> tuple[list[tuple], list[tuple]]:
    with database.engine.connect() as connection:
        return ([tuple(row) for row in connection.execute(sa.text(
                    "SELECT key, value FROM lists WHERE key LIKE :prefix ORDER BY key"), {"prefix": f"{prefix}%"})],
                sorted((row.tags, sorted(row.meta.items())) for row in connection.execute(sa.text(
                    "SELECT tags, meta FROM tagged_notes WHERE tags->>0 LIKE :prefix"), {"prefix": f"{prefix}%"})))


@pytest.mark.parametrize("action", [append_after_writing, change_what_it_read, insert_then_change],
                         ids=["write then change", "read then change", "insert then change"])
def test_a_list_or_dict_a_rule_changes_after_handing_it_over_is_stored_as_firing_stores_it(databases, action):
    """A rule that changes a JSON column's list or dict in place after writing or inserting it, or after reading it
    (without writing it back), leaves in the lowered batch what it leaves fired event by event: ``tx.write`` and
    ``tx.insert`` take the values as they are at the call (``copy_nested``), ``tx.read`` gives a copy — and so does
    the learned chain's stand-in.  (Before, the stand-in's ``write`` and ``insert`` kept the rule's own list or dict:
    the lowered batch stored the changes made after the call.)  The last batch inserts one row alone: its commit
    inserts it as it inserts many (before, a single row of a table with a column of no array form, the ``jsonb`` here,
    failed the commit: ResourceClosedError)."""
    kind = f"nested-{action.__name__}".replace("_", "-")
    for database in databases:
        with database.engine.begin() as connection:
            connection.execute(sa.text("CREATE TABLE IF NOT EXISTS tagged_notes (id bigint GENERATED BY DEFAULT AS "
                                       "IDENTITY PRIMARY KEY, tags jsonb, meta jsonb)"))
    batches = [rows(0, [(kind, f"{kind}-a", 1), (kind, f"{kind}-b", 1), (kind, f"{kind}-a", 1)]),
               rows(1, [(kind, f"{kind}-a", 1), (kind, f"{kind}-c", 1)]), rows(2, [(kind, f"{kind}-d", 1)])]
    try:
        lowered = run_both(databases, kind, batches,
                           lambda database: database.rule(on=database.stream(kind), name=kind)(action))
        assert all(pending is not None for pending in lowered), lowered
        on, off = (_lists_and_notes(database, kind) for database in databases)
        assert on == off, f"lowered {on}\nfired {off}"
        assert on[0], on
    finally:
        for database in databases:
            database.rules.remove(kind)
