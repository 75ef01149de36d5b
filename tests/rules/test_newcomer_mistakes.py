"""What a newcomer gets wrong with the rules API, and what activedb then says: each error an ``ActivedbError`` that
says what to do next (STYLE.md), the committed data untouched."""

from __future__ import annotations

import threading

import pytest

import activedb
from activedb.errors import RuleError
from tests.conftest import open_db

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


def no_child():
    return "ran"


def child_and_amount(child, amount):
    return amount


class Account:
    def deposit(self, child, amount):
        return amount


@pytest.mark.parametrize("function, args, expected", [
    (lambda: "ran", (), r"<lambda>\(\) cannot be: too many positional arguments"),
    (no_child, (), r"no_child\(\) cannot be: too many positional arguments"),
    (child_and_amount, (), r"child_and_amount\(child, amount\) cannot be: missing a required argument: 'amount'"),
    (child_and_amount, (1, 2), r"child_and_amount\(child, amount\) cannot be: too many positional arguments"),
    (Account().deposit, (), r"deposit\(child, amount\) cannot be: missing a required argument: 'amount'"),
], ids=["lambda-without-child", "def-without-child", "an-argument-missing", "an-argument-too-many", "a-method"])
def test_spawning_a_function_that_cannot_take_the_child_is_refused_at_the_spawn(db, function, args, expected):
    """``tx.spawn(lambda: ...)`` queued the child, whose call raised ``TypeError`` where it ran: the child aborted,
    and a parent that did not ask its handle committed without its work, with no word anywhere (the spawn refuses
    what is not callable, or an ``async def``, for that reason).  A call Python would refuse for its count of
    arguments is refused at the spawn, before anything runs."""
    with db.transaction() as tx:
        with pytest.raises(activedb.BadArgument, match=r"tx\.spawn runs function\(child, \*args, \*\*kwargs\); "
                                                       + expected):
            tx.spawn(function, *args)
        assert not tx.children


@pytest.mark.parametrize("function, args, kwargs", [
    (lambda child: "ran", (), {}),
    (lambda child, *rest: rest, (1, 2), {}),
    (lambda *anything: anything, (), {}),
    (child_and_amount, (), {"amount": 3}),
    (lambda child, amount=1: amount, (), {}),
    (lambda child, *, amount: amount, (), {"amount": 2}),
    (Account().deposit, (5,), {}),
    (print, (), {}),
], ids=["child", "varargs", "only-varargs", "keyword", "a-default", "keyword-only", "a-method", "a-builtin"])
def test_a_function_that_can_take_the_child_is_spawned(db, function, args, kwargs):
    with db.transaction() as tx:
        tx.spawn(function, *args, **kwargs).result(timeout=TIMEOUT)


def forgot_self_in_action(on):
    class ForgotSelf_action(activedb.Rule):
        def action(tx, event):      # (as a newcomer writes it: no self)
            pass
    ForgotSelf_action.on = on
    return ForgotSelf_action


def forgot_self_in_condition(on):
    class ForgotSelf_condition(activedb.Rule):
        def condition(tx, event):
            return True

        def action(self, tx, event):
            pass
    ForgotSelf_condition.on = on
    return ForgotSelf_condition


@pytest.mark.parametrize("part, make", [("action", forgot_self_in_action), ("condition", forgot_self_in_condition)])
def test_a_rule_class_method_without_self_is_refused_saying_to_add_self(db, part, make):
    """A ``Rule`` subclass whose ``def action(tx, event)`` forgot ``self`` was refused as "``action(event)`` cannot be:
    too many positional arguments" — the signature shown without the parameter the instance took, not as written."""
    with pytest.raises(RuleError, match=rf"rule 'ForgotSelf_{part}': the {part} is called with \(tx, event\), but "
                                        rf"{part}\(tx, event\) cannot be, as a method: it takes self first; write "
                                        rf"def {part}\(self, tx, event\)"):
        db.rules.add(make(db.stream("forgot_self")))
    assert f"ForgotSelf_{part}" not in db.rules.names()


class SpawnWatcher(activedb.Observer):
    def on_spawn(self, parent, child):
        pass


@pytest.mark.parametrize("observed", [False, True], ids=["as-frames", "as-spawned-children"])
def test_a_priority_group_that_cannot_start_counts_each_of_its_firings_cancelled(database_url, observed):
    """``db.close()`` while a transaction runs (another thread's, or its own) shuts the worker pool down; an event of
    that transaction whose rules form a group of equal priority then could not start them.  The firings were counted
    ``fired`` and never given an outcome, against the record's rule that every fired firing ends in exactly one.
    (An observer of spawns makes the group spawned children, whose refused spawn raised out of the group.)"""
    db = open_db(database_url, {})
    if observed:
        db.observe(SpawnWatcher())
    try:
        @db.rule(on=db.stream("closed_under_group"), priority=1, name="first_of_group")
        def first_of_group(tx, event):
            pass

        @db.rule(on=db.stream("closed_under_group"), priority=1, name="second_of_group")
        def second_of_group(tx, event):
            pass

        with pytest.raises(activedb.TransactionError, match="the Database was closed"):
            with db.transaction() as tx:
                db.close()
                tx.emit("closed_under_group", key="k")
    finally:
        db.close()
    counters = db.rules.statistics().per_rule
    for name in ("first_of_group", "second_of_group"):
        seen = counters[name]
        assert seen.fired == 1, seen
        assert seen.condition_false + seen.executed + seen.failed + seen.cancelled == 1, seen
        assert seen.cancelled == 1, seen
