"""Walks over a value that recurse with its nesting — ``from_exact_json``, ``same_image`` (and ``matches``, which
compares with it), ``holds_nan``, ``json_problem`` — meet a value nested far deeper than Python's stack goes (built
iteratively, 100,000 levels): each either refuses it with ``NestedTooDeep`` naming the bound (``EXACT_DEPTH``) or walks
it without recursion, and takes a value nested to the bound.  Pure logic: no database."""

from __future__ import annotations

import math

import pytest

from activedb.errors import NestedTooDeep
from activedb.store import EXACT_DEPTH, exact_json, from_exact_json, holds_nan, json_problem, matches, same_image

FAR = 100_000


def _nested(levels: int, inner: object = 1, kind: type = list) -> object:
    """``inner`` inside ``levels`` levels of ``kind`` (list, tuple or dict), built without recursion."""
    value = inner
    for _ in range(levels):
        value = [value] if kind is list else (value,) if kind is tuple else {"a": value}
    return value


@pytest.mark.parametrize("kind", [list, dict])
def test_from_exact_json_refuses_a_value_nested_beyond_its_bound_naming_it(kind):
    with pytest.raises(NestedTooDeep, match=f"{EXACT_DEPTH} levels"):
        from_exact_json(_nested(FAR, kind=kind))
    with pytest.raises(NestedTooDeep, match=f"{EXACT_DEPTH} levels"):
        from_exact_json(_nested(EXACT_DEPTH + 1, kind=kind))


@pytest.mark.parametrize("kind", [list, dict, tuple])
def test_from_exact_json_decodes_what_exact_json_writes_at_the_bound(kind):
    value = _nested(EXACT_DEPTH, math.nan, kind)
    decoded = from_exact_json(exact_json(value))
    assert same_image(decoded, value)
    inner = decoded
    for _ in range(EXACT_DEPTH):
        inner = inner["a"] if kind is dict else inner[0]
    assert math.isnan(inner)


def test_from_exact_json_counts_a_tagged_tuple_set_and_map_as_one_level_each():
    value: object = 1
    for level in range(EXACT_DEPTH):
        value = ((value,), frozenset({level}), {(level,): value})[level % 3]
    assert from_exact_json(exact_json(value)) == value


def test_same_image_and_matches_compare_values_nested_far_beyond_the_stack():
    one, other, different = _nested(FAR, math.nan), _nested(FAR, math.nan), _nested(FAR, 2.0)
    assert same_image(one, other)
    assert not same_image(one, different)
    assert same_image(_nested(FAR, kind=dict), _nested(FAR, kind=dict))
    assert not same_image(_nested(FAR, kind=dict), _nested(FAR, 2, kind=dict))
    assert matches({"a": one}, {"a": other})
    assert not matches({"a": one}, {"a": different})
    at_bound = _nested(EXACT_DEPTH, math.nan)
    assert same_image(at_bound, _nested(EXACT_DEPTH, math.nan)) and not same_image(at_bound, _nested(EXACT_DEPTH))


def test_same_image_of_values_that_hold_themselves_ends():
    one: list[object] = [math.nan]
    one.append(one)
    other: list[object] = [math.nan]
    other.append(other)
    assert same_image(one, other)
    assert not same_image(one, [math.nan, [1.0]])


def test_holds_nan_walks_a_tuple_nested_far_beyond_the_stack():
    assert holds_nan(_nested(FAR, math.nan, tuple))
    assert not holds_nan(_nested(FAR, 1.0, tuple))
    assert holds_nan((1, _nested(EXACT_DEPTH, math.nan, tuple)))


def test_json_problem_refuses_a_value_nested_beyond_its_bound_naming_it():
    for value in (_nested(FAR), _nested(FAR, math.nan), _nested(FAR, kind=dict), _nested(FAR, kind=tuple)):
        with pytest.raises(NestedTooDeep, match=f"{EXACT_DEPTH} levels a value may nest"):
            json_problem(value)


def test_json_problem_checks_a_value_nested_to_its_bound():
    assert json_problem(_nested(EXACT_DEPTH)) is None
    assert json_problem(_nested(EXACT_DEPTH, kind=dict)) is None
    problem = json_problem(_nested(EXACT_DEPTH, math.nan))
    assert problem is not None and "nan" in problem
