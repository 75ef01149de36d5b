"""priority_groups: Concurrent Rule Execution §3.2 and axioms 29-30."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from coupling import InvalidPriority, priority_groups


@dataclass(frozen=True)
class Rule:
    name: str
    priority: float | None


def names(groups):
    return [[rule.name for rule in group] for group in groups]


def test_descending_priority_equal_priorities_share_a_group():
    rules = [Rule("a", 1), Rule("b", 5), Rule("c", 1), Rule("d", 10), Rule("e", 5)]
    assert names(priority_groups(rules)) == [["d"], ["b", "e"], ["a", "c"]]


def test_no_priority_is_the_lowest_even_below_negative_ones():
    rules = [Rule("none1", None), Rule("neg", -100), Rule("zero", 0), Rule("none2", None)]
    assert names(priority_groups(rules)) == [["zero"], ["neg"], ["none1", "none2"]]


def test_ints_and_floats_of_equal_value_share_a_group():
    assert names(priority_groups([Rule("int", 2), Rule("float", 2.0), Rule("half", 2.5)])) == [["half"], ["int", "float"]]


def test_key_function_and_empty_input():
    assert priority_groups([("x", 3), ("y", None), ("z", 3)], key=lambda item: item[1]) == [
        [("x", 3), ("z", 3)],
        [("y", None)],
    ]
    assert priority_groups([]) == []


@pytest.mark.parametrize("bad", [True, "high", math.nan, [1]])
def test_invalid_priorities_are_rejected(bad):
    with pytest.raises(InvalidPriority, match="real number"):
        priority_groups([Rule("x", bad)])


def test_missing_priority_attribute_asks_for_a_key():
    with pytest.raises(InvalidPriority, match="key="):
        priority_groups([object()])


@given(st.lists(st.tuples(st.integers(0, 1000), st.one_of(st.none(), st.integers(-3, 3))), max_size=40))
def test_groups_against_a_reference(items):
    # Items are (unique id, priority); make ids unique by position.
    items = [(index, priority) for index, (_, priority) in enumerate(items)]
    groups = priority_groups(items, key=lambda item: item[1])
    # A permutation of the input, every group non-empty and of one priority.
    assert sorted(item for group in groups for item in group) == sorted(items)
    assert all(group and len({item[1] for item in group}) == 1 for group in groups)
    # Strictly descending, None last.
    priorities = [group[0][1] for group in groups]
    numbers = [priority for priority in priorities if priority is not None]
    assert numbers == sorted(set(numbers), reverse=True)
    assert None not in priorities[:-1]
    # Stable inside a group: input order.
    assert all([item[0] for item in group] == sorted(item[0] for item in group) for group in groups)
