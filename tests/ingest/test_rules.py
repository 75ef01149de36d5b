"""The rule path's handler (``activedb.ingest.RulesHandler``): what its constructor refuses."""

from __future__ import annotations

import re

import pytest

from activedb.ingest import RulesHandler
from activedb.ingest.errors import IngestError
from tests._unshowable import Unshowable


@pytest.mark.parametrize("prefetch", [5, ["items"], [("items", None)], "items", {"items": 5}, {5: None}],
                         ids=["a-number", "a-list-of-names", "a-list-of-pairs", "a-text", "a-number-as-how",
                              "a-number-as-table"])
def test_a_prefetch_that_is_no_mapping_of_table_to_how_is_refused_saying_what_to_give(prefetch):
    """``prefetch`` maps each table to how an event names its row (None: the event's key; a payload field's name; a
    callable): a number failed with dict()'s TypeError, a list of names or a text with its ValueError ('dictionary
    update sequence element #0 has length 5'), a list of pairs was taken, and a number as the how (or the table)
    read a payload field that cannot exist, prefetching nothing."""
    with pytest.raises(IngestError, match=r"prefetch maps each table's name to how an event names its row"):
        RulesHandler(prefetch)


def test_a_prefetch_of_tables_to_keys_fields_and_callables_is_taken():
    def key(event):
        return event.key

    handler = RulesHandler({"counters": None, "items": "item", "others": key})
    assert handler.prefetch == {"counters": None, "items": "item", "others": key}
    assert RulesHandler(None).prefetch == {} and RulesHandler({}).prefetch == {}


def test_a_prefetch_key_an_event_cannot_give_never_fails_its_batch(db):
    """``prefetch`` only saves round trips: an event for which it cannot name a row — its callable raises (a payload
    field the event lacks), the field holds a list, or a value the table's key cannot be — is left out of the
    prefetch, and the event runs as any other (its rule reads its row itself, or rejects the event).  Each failed
    the whole batch with a bare KeyError, TypeError or InvalidKey, and so did every re-delivery of it: one event's
    data stopped the stream for good.  (Event by event: a lowered batch prefetches nothing.)"""
    import datetime as dt

    import sqlalchemy as sa

    from activedb import Coupling
    from activedb.ingest import EventMapping, feed

    def price(tx, event):
        tx.write("items", event.key, value=event.payload["value"])

    db.rule(on=db.stream("price"), coupling=Coupling.IMMEDIATE, name="price_item")(price)
    try:
        ts = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
        rows = [{"type": "price", "key": "pa", "ts": ts, "item": "pa", "account": 1, "value": 1},
                {"type": "price", "key": "pb", "ts": ts, "value": 2},                              # no item, no account
                {"type": "price", "key": "pc", "ts": ts, "item": ["pc"], "account": "x", "value": 3}]
        mapping = EventMapping("type", "key", "ts")
        for number, prefetch in enumerate(({"items": lambda event: event.payload["item"]}, {"items": "item"},
                                           {"accounts": "account"})):
            [outcome] = feed(db, [rows], source=f"prefetched{number}", mapping=mapping, handler=RulesHandler(prefetch, lower_declared=False))
            assert outcome.committed and (outcome.events, outcome.dead_letters) == (3, 0), (prefetch, outcome)
        with db.engine.connect() as connection:
            assert connection.execute(sa.text("SELECT key, value FROM items WHERE key IN ('pa', 'pb', 'pc') "
                                              "ORDER BY key")).all() == [("pa", 1), ("pb", 2), ("pc", 3)]
    finally:
        db.rules.remove("price_item")


def test_a_rule_error_whose_repr_raises_is_named_in_the_dead_letter_and_the_rule_counts_failed(db):
    """The dead letter's reason names the rule and the type of what it raised, saying the error could not be shown,
    and the rule counts the failure: before, ``repr`` of the rule's error was taken while reporting the failure, and
    the reason named the repr's own error as what the rule raised — "rejected by rule 'divide': immediate rule 'divide'
    failed on …: RuntimeError('repr broke')" — never saying it raised a ZeroDivisionError."""
    import datetime as dt

    from activedb import Coupling
    from activedb.ingest import EventMapping, feed
    from tests.spark_bridge._streams import dead_letters

    def divide(tx, event):
        raise Unshowable()

    db.rule(on=db.stream("unshowable"), coupling=Coupling.IMMEDIATE, name="divide")(divide)
    try:
        rows = [{"type": "unshowable", "key": "u", "ts": dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)}]
        [outcome] = feed(db, [rows], source="unshowable", mapping=EventMapping("type", "key", "ts"),
                         handler=RulesHandler(lower_declared=False))
        assert outcome.committed and (outcome.events, outcome.dead_letters) == (0, 1), outcome
        [(_, _, reason, _)] = [letter for letter in dead_letters(db) if letter[0] == "unshowable"]
        assert re.fullmatch(r"rejected by rule 'divide': rule 'divide' failed on stream unshowable key='u' in T[0-9.]+: "
                            r"Unshowable\(<repr failed: RuntimeError: repr broke>\)", reason), reason
        assert db.rules.statistics().per_rule["divide"].failed == 1
    finally:
        db.rules.remove("divide")


def test_a_feed_to_a_database_without_any_rule_is_refused_and_nothing_of_it_is_applied_or_recorded(db):
    """A database whose rule registry holds no rule at all — the module declaring them was not imported — took every
    batch as applied, no rule run on its events, and recorded it in the ledger, so that feeding it again, once the
    rules were registered, skipped it: every event lost, and nothing said.  Now the rule path refuses the batch with
    ``NoRuleRegistered`` before anything of it is applied or recorded, and the same batch applies once the rules are
    there.  Rules that exist but are all disabled are the operator's choice: their batches still apply, no rule
    run."""
    import datetime as dt

    from activedb import Coupling
    from activedb.ingest import EventMapping, batch_committed, feed, ingestion_status
    from activedb.ingest.errors import NoRuleRegistered
    from tests.spark_bridge._streams import dead_letters

    assert db.rules.names() == []
    ts = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    rows = [{"type": "arrived", "key": f"n{number}", "ts": ts} for number in range(3)] + [{"type": "arrived", "ts": ts}]
    mapping = EventMapping("type", "key", "ts")
    with pytest.raises(NoRuleRegistered, match=r"^batch 0 of unregistered: no rule is registered on this database, "
                                               r".* nothing of it was applied or recorded\. Register the rules first: "
                                               r"import the module that declares them") as refused:
        feed(db, [rows], source="unregistered", mapping=mapping)
    assert isinstance(refused.value, IngestError)
    assert not batch_committed(db, "unregistered", 0) and ingestion_status(db, "unregistered") == []
    assert [letter for letter in dead_letters(db) if letter[0] == "unregistered"] == []     # (the keyless row's)
    empty, keyless = feed(db, [[], rows[-1:]], source="eventless", mapping=mapping)   # (no event: nothing lost)
    assert empty.committed and keyless.committed and (keyless.events, keyless.dead_letters) == (0, 1), keyless

    heard: list[str] = []
    db.rule(on=db.stream("arrived"), coupling=Coupling.IMMEDIATE, name="arrival")(
        lambda tx, event: heard.append(event.key))
    try:
        [outcome] = feed(db, [rows], source="unregistered", mapping=mapping, handler=RulesHandler(lower_declared=False))
        assert outcome.committed and (outcome.events, outcome.dead_letters) == (3, 1), outcome
        assert heard == ["n0", "n1", "n2"]
        db.rules.disable("arrival")
        [outcome] = feed(db, [rows], source="all-disabled", mapping=mapping)
        assert outcome.committed and (outcome.events, outcome.dead_letters) == (3, 1), outcome
        assert heard == ["n0", "n1", "n2"]
    finally:
        db.rules.remove("arrival")
