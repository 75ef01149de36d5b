"""What a newcomer gets wrong with the rules API, and what activedb then says: each error an ``ActivedbError`` that
says what to do next (STYLE.md), the committed data untouched."""

from __future__ import annotations

import threading

import pytest

import activedb
from activedb.errors import RuleError

TIMEOUT = 60


def test_a_subtransaction_that_does_not_end_in_time_raises_an_activedb_error_saying_what_to_do(db):
    """``handle.result(timeout)`` of a child still running raised a bare ``TimeoutError`` that said only that it did
    not end."""
    started, release = threading.Event(), threading.Event()

    def slow(child):
        started.set()
        release.wait(TIMEOUT)
        return "done"

    with db.transaction() as tx:
        handle = tx.spawn(slow, eager=True)
        try:
            assert started.wait(TIMEOUT), "the child never started"
            with pytest.raises(activedb.WaitTimeout, match=r"did not end within 0\.05 s.*timeout=None") as raised:
                handle.result(timeout=0.05)
            assert isinstance(raised.value, TimeoutError)
        finally:
            release.set()
        assert handle.result(timeout=TIMEOUT) == "done"


def test_db_rule_used_without_its_call_is_refused_saying_how_to_write_it(db):
    """``@db.rule`` over a function, without ``(on=...)`` — as ``@pytest.fixture`` or ``@functools.cache`` are
    written — raised Python's ``TypeError: Database.rule() takes 1 positional argument but 2 were given``, which says
    neither what was wrong nor what to write."""
    with pytest.raises(RuleError, match=r"@db\.rule is called with the event: write @db\.rule\(on=db\.stream"
                                        r"\('name'\)\) \(or db\.inserted\('table'\), \.\.\.\) above def "
                                        r"forgot_the_call"):
        @db.rule
        def forgot_the_call(tx, event):
            pass
    assert "forgot_the_call" not in db.rules.names()


def test_db_rule_without_on_is_refused_saying_what_to_give(db):
    """``@db.rule()`` without ``on=`` raised Python's ``TypeError: ... missing 1 required keyword-only argument: 'on'``;
    now a ``RuleError`` that says what to give."""
    with pytest.raises(RuleError, match=r"rule 'no_event': db\.rule\(\) needs on=, the event the rule reacts to: "
                                        r"write @db\.rule\(on=db\.stream\('name'\)\)"):
        @db.rule()
        def no_event(tx, event):
            pass
    assert "no_event" not in db.rules.names()
