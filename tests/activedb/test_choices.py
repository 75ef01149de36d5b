"""Closed sets at the public boundary (issue 55, "no string parameter where a closed set is meant"): each takes
its enum's members and their values' strings, and anything else is an ``InvalidChoice`` naming the members — a
``ValueError`` and an ``ActivedbError`` — before anything is locked, read or written."""

from __future__ import annotations

import re

import pytest
import sqlalchemy as sa

import activedb
from activedb.errors import InvalidChoice
from activedb.events import Origin
from activedb.rules import RuleExecution
from activedb.store import Granularity
from activedb.txn import BulkLock


@pytest.fixture(autouse=True)
def clean_items(db):
    with db.engine.begin() as connection:
        connection.execute(sa.text("DELETE FROM items"))
    yield
    db.schema.set_granularity("items", Granularity.TUPLE)


def test_bulk_reads_and_writes_share_one_lock_vocabulary(db):
    with db.transaction() as tx:
        assert tx.write_many("items", {"a": {"value": 1}, "b": {"value": 2}}, lock=BulkLock.TABLE) == 2
        assert tx.read_many("items", ["a", "b"], lock="write") == {"a": {"key": "a", "value": 1, "note": None},
                                                                  "b": {"key": "b", "value": 2, "note": None}}
    with db.transaction() as tx:
        with pytest.raises(InvalidChoice, match=r"read_many\(lock=\.\.\.\)='rows' is not a BulkLock: use one of "
                                                r"BulkLock.READ \('read'\), BulkLock.WRITE \('write'\), "
                                                r"BulkLock.TABLE \('table'\)") as caught:
            tx.read_many("items", ["a"], lock="rows")
        assert isinstance(caught.value, ValueError)
        with pytest.raises(InvalidChoice, match=r"write_many\(lock=\.\.\.\)=BulkLock.READ is not taken here: use one "
                                                r"of BulkLock.WRITE \('write'\), BulkLock.TABLE \('table'\)"):
            tx.write_many("items", {"a": {"value": 3}}, lock=BulkLock.READ)
        with pytest.raises(InvalidChoice, match="is not a BulkLock"):
            tx.write_many("items", {"a": {"value": 3}}, lock="row")      # the old second vocabulary
        assert db.transactions.locks.holders(("row", "items", ("a",))).held == {}     # refused before locking
    with db.engine.connect() as connection:
        assert connection.execute(sa.text("SELECT value FROM items WHERE key = 'a'")).scalar() == 1


def test_the_schema_and_the_connection_take_their_enums(db, database_url):
    db.schema.set_granularity("items", "table")
    assert db.transactions.locking.granularity("items") is Granularity.TABLE
    with pytest.raises(InvalidChoice, match=r"'rows' is not a Granularity: use one of Granularity.TUPLE"):
        db.schema.set_granularity("items", "rows")
    with pytest.raises(InvalidChoice, match=r"'parallel' is not a RuleExecution: use one of "
                                            r"RuleExecution.THREADS \('threads'\), RuleExecution.INLINE \('inline'\)"):
        activedb.connect(database_url, rule_execution="parallel")
    inline = activedb.connect(database_url, rule_execution="inline", upgrade=False)
    try:
        assert inline.rules.execution is RuleExecution.INLINE
    finally:
        inline.close()


@pytest.mark.parametrize("arguments, message", [
    ({"kind": "insert"}, r"EventSpec\(kind=\.\.\.\)='insert' is not a EventKind: use one of EventKind.INSERTED"),
    ({"kind": "signal", "origin": "outside"},
     r"EventSpec\(origin=\.\.\.\)='outside' is not a Origin: use one of Origin.ACTIVEDB \('activedb'\)"),
], ids=["kind", "origin"])
def test_an_event_spec_s_kind_or_origin_that_is_none_is_an_invalid_choice(arguments, message):
    """``EventSpec("insert")`` (a rule's ``on=``) raised the enum's bare ValueError ("'insert' is not a valid
    EventKind"), no ActivedbError and no list of the kinds."""
    with pytest.raises(InvalidChoice, match=message):
        activedb.EventSpec(**arguments)


@pytest.mark.parametrize("kind", ["signal", "stream", "committed"])
def test_an_external_event_spec_of_no_data_kind_is_an_activedb_error_saying_what_to_give(kind):
    """Only data changes come from other PostgreSQL clients: ``EventSpec(kind, origin=Origin.EXTERNAL)`` of any other
    kind raised a bare ValueError (no ActivedbError), which a caller catching activedb's errors did not catch."""
    with pytest.raises(activedb.BadArgument, match=rf"EventSpec\(kind='{kind}', origin=Origin.EXTERNAL\).*give "
                                                  r"inserted, updated, deleted or modified, or origin=Origin.ACTIVEDB"):
        activedb.EventSpec(kind, "t", origin=Origin.EXTERNAL)


@pytest.mark.parametrize("source", [5, "", b"reading"], ids=["number", "empty", "bytes"])
def test_an_event_spec_s_source_that_no_event_can_have_is_an_activedb_error(source):
    """``EventSpec("stream", 5)`` or ``EventSpec("stream", "")`` (a rule's ``on=``) was accepted, and the rule never
    fired: an event's source is a non-empty text (``tx.emit``, ``tx.signal`` and ``db.stream`` refuse any other), so
    nothing matched it, without a word.  It is a BadArgument saying what to give."""
    with pytest.raises(activedb.BadArgument, match=rf"EventSpec\(kind='stream', source={re.escape(repr(source))}\): the source is a "
                                                  r"table, signal or stream type name \(a non-empty text\), or None"):
        activedb.EventSpec("stream", source)
    assert activedb.EventSpec("stream", None).source is None and activedb.EventSpec("stream", "r").source == "r"
