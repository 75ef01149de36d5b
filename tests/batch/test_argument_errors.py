"""Declared state transactions refuse what they cannot run — an operation over no rows, ``@batch.declared`` on
what is no function or on an event that is no stream event, an unknown strategy, a computed key outside its
declared candidates — with a ``DeclarationError`` (``StrategyError``) that says what to write instead."""

from __future__ import annotations

import re

import pytest
import sqlalchemy as sa

from activedb import batch
from activedb.batch.errors import DeclarationError, StrategyError
from activedb.errors import RuleFailed

OUTSIDE = ("the key function of a non-deterministic nd_write on items returned 'elsewhere', which is not among its "
           "declared candidates: add it to candidates=, or make the key function return one of them")


def declare_over_no_rows(ops, operation):
    if operation == "abort_if":
        ops.abort_if(lambda: True, reads=[], reason="never")
    elif operation == "window_read":
        ops.window_read("items", [], size=1.0, aggregate=len)
    else:
        ops.window_write("items", "k", lambda own, windows: {}, over=[], size=1.0)


@pytest.mark.parametrize("operation, message", [
    ("abort_if", r"abort_if needs at least one \(table, key\) in reads"),
    ("window_read", r"window_read needs at least one key"),
    ("window_write", r"window_write needs at least one \(table, key\) in over"),
])
def test_an_operation_over_no_rows_is_refused_where_it_is_declared(operation, message):
    ops = batch.Ops(batch.BatchEvent("e", "k"))
    with pytest.raises(DeclarationError, match=message):
        declare_over_no_rows(ops, operation)
    assert ops.specs == []


@pytest.mark.parametrize("given", [5, None, "declaration"], ids=["a-number", "none", "a-name"])
def test_declared_takes_a_function(given):
    with pytest.raises(DeclarationError, match=r"@batch\.declared decorates a function \(event, ops\), got"):
        batch.declared(given)


def test_a_declared_rule_on_an_event_that_is_no_stream_event_is_refused_where_it_is_declared(db):
    def write(event, ops):
        ops.write("items", event.key, lambda own: {"value": 1})

    with pytest.raises(DeclarationError, match=r"rule 'declared_on_insert': the declared rule .*write' is declared on "
                                               r"inserted\(items\); a declared rule reacts to stream events only — "
                                               r"declare it on=db\.stream\(type\), or write a plain action"):
        db.rule(on=db.inserted("items"), name="declared_on_insert")(batch.declared(write))
    assert "declared_on_insert" not in db.rules.names()


@pytest.mark.parametrize("strategy", ["fast", "bfs/f", "bfs/f/e/x", "zz/f/e"],
                         ids=["a-word", "two-parts", "four-parts", "unknown-exploration"])
def test_an_unknown_strategy_says_how_one_is_written(strategy):
    with pytest.raises(StrategyError, match=rf"unknown strategy '{strategy}': write exploration/granularity/abort, "
                                            r"e\.g\. 'ns/f/e'"):
        batch.parse_strategy(strategy)
    with pytest.raises(StrategyError, match=rf"unknown strategy '{strategy}'"):
        batch.run_in_memory(batch.StateTransactions(), [], {}, strategy=strategy)


def computed_elsewhere(event, ops):
    ops.write_any("items", lambda: "elsewhere", lambda own: {"value": 1}, candidates=["a", "b"])


@pytest.mark.parametrize("strategy", ["serial", "lean", "tpg"])
def test_in_a_batch_a_computed_key_outside_its_candidates_makes_its_event_a_dead_letter(strategy):
    transactions = batch.StateTransactions()
    transactions.on("computed_elsewhere")(computed_elsewhere)
    events = [{"type": "computed_elsewhere", "key": "a", "ts": 0.0}]
    result = batch.run_in_memory(transactions, events, {}, strategy=strategy)
    assert [(event.key, OUTSIDE in reason) for event, reason in result.dead_letters] == [("a", True)]
    assert result.final == {}


def test_fired_in_a_transaction_a_computed_key_outside_its_candidates_fails_the_rule(db):
    if "computed_elsewhere" not in db.rules.names():
        db.rule(on=db.stream("computed_elsewhere"), name="computed_elsewhere")(batch.declared(computed_elsewhere))
    with db.engine.begin() as connection:
        connection.execute(sa.text("DELETE FROM items"))
    failed = rf"rule 'computed_elsewhere' failed .*DeclarationError\(\"{re.escape(OUTSIDE)}\"\)"
    with pytest.raises(RuleFailed, match=failed), db.transaction() as tx:
        tx.emit("computed_elsewhere", key="a", ts=0.0, payload={})
    with db.engine.connect() as connection:
        assert connection.execute(sa.text("SELECT count(*) FROM items")).scalar() == 0
