"""``db.rules`` refuses a rule it cannot run — no Rule at all, an action or condition that is not callable, a data
event of an unknown table — and a name it does not know or has removed, with a ``RuleError`` that says what to do,
registering nothing."""

from __future__ import annotations

import pytest

import activedb
from activedb import Coupling, EventKind, EventSpec
from activedb.errors import RuleError
from activedb.rules import FunctionRule


def noop(tx, event):
    pass


@pytest.mark.parametrize("rule", [5, "audit", noop], ids=["a-number", "a-name", "a-function"])
def test_adding_what_is_no_rule_is_refused(db, rule):
    with pytest.raises(RuleError, match=r"db\.rules\.add\(\) takes a Rule \(or Rule subclass\), got"):
        db.rules.add(rule)


def test_a_function_rule_whose_action_is_not_callable_is_refused(db):
    rule = FunctionRule(5, on=db.inserted("items"), when=None, coupling=Coupling.IMMEDIATE,
                        action_coupling=Coupling.IMMEDIATE, priority=None, enabled=True, name="uncallable_action")
    with pytest.raises(RuleError, match=r"rule 'uncallable_action': the action must be callable, got 5"):
        db.rules.add(rule)
    assert "uncallable_action" not in db.rules.names()


@pytest.mark.parametrize("part", ["condition", "action"])
def test_a_rule_class_whose_condition_or_action_is_no_method_is_refused(db, part):
    namespace = {"on": db.inserted("items"), "action": noop, part: 5}
    rule = type(f"NotCallable_{part}", (activedb.Rule,), namespace)
    with pytest.raises(RuleError, match=rf"rule 'NotCallable_{part}': {part} must be callable"):
        db.rules.add(rule)
    assert f"NotCallable_{part}" not in db.rules.names()


def test_a_rule_on_the_data_events_of_an_unknown_table_is_refused(db):
    class OnNoTable(activedb.Rule):
        on = EventSpec(EventKind.INSERTED, "no_such_table")

        def action(self, tx, event):
            pass

    with pytest.raises(RuleError, match=r"rule 'OnNoTable': .*no_such_table"):
        db.rules.add(OnNoTable)
    assert "OnNoTable" not in db.rules.names()


@pytest.mark.parametrize("call", ["remove", "enable", "disable"])
def test_a_rule_name_that_was_never_declared_is_refused_naming_the_declared_ones(db, call):
    with pytest.raises(RuleError, match=r"no rule named 'never_declared'; declared here: .*\(`activedb rules list` "
                                        r"shows the persisted ones\)"):
        getattr(db.rules, call)("never_declared")


class Unregistered(activedb.Rule):
    on = EventSpec(EventKind.INSERTED, "items")

    def action(self, tx, event):
        pass


@pytest.mark.parametrize("call", ["enable", "disable"])
def test_a_rule_that_is_not_registered_says_to_add_it(call):
    with pytest.raises(RuleError, match=r"is not registered on a database; use db\.rules\.add\(rule\)"):
        getattr(Unregistered(), call)()


def test_a_rule_that_is_not_registered_is_named_after_its_class():
    with pytest.raises(RuleError, match=r"rule 'Unregistered' is not registered on a database"):
        Unregistered().enable()


@pytest.mark.parametrize("call", ["enable", "disable"])
def test_enabling_a_removed_rule_says_it_comes_back_when_declared_again(db, call):
    name = f"removed_then_{call}d"
    db.rule(on=db.inserted("items"), name=name)(noop)
    db.rules.remove(name)
    with pytest.raises(RuleError, match=rf"rule '{name}' was removed; it comes back when its application declares "
                                        rf"it again \(or delete it for good: activedb rules remove --purge {name}\)"):
        getattr(db.rules, call)(name)
    assert name not in db.rules.names()
