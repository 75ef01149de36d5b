"""A dead letter's readable form (``jsonable(value, tagged=True)``) tags bytes and the floats JSON cannot hold,
``{"$bytes": base64}`` and ``{"$float": "nan"}``, and escapes a key of the value's own that starts with ``$`` (one
more ``$``), so no dict of the user's reads as a tag; ``from_jsonable`` reads it back.  Forms written before the
escape read as before wherever they are unambiguous.  ``exact_json`` keeps such dicts apart its own way (``$map``).
No database."""

from __future__ import annotations

import math

import pytest

from activedb.errors import NestedTooDeep
from activedb.store import EXACT_DEPTH, exact_json, from_exact_json, from_jsonable, jsonable

LOOK_LIKE_TAGS = [{"$bytes": "aGk="}, {"$float": "nan"}, {"$none": True}, {"$$bytes": "aGk="}, {"$": 1, "a": 2}]


def _same(left: object, right: object) -> bool:
    """Equality where NaN equals NaN."""
    if isinstance(left, float) and isinstance(right, float) and math.isnan(left):
        return math.isnan(right)
    if isinstance(left, dict) and isinstance(right, dict):
        return left.keys() == right.keys() and all(_same(left[key], right[key]) for key in left)
    if isinstance(left, list) and isinstance(right, list):
        return len(left) == len(right) and all(map(_same, left, right))
    return type(left) is type(right) and left == right


@pytest.mark.parametrize("value", [b"hi", math.nan, -math.inf, *LOOK_LIKE_TAGS,
                                   {"a": [{"$bytes": b"x"}, b"\x00"], "$float": {"$float": math.inf}},
                                   [[{"$bytes": "aGk="}], {"k": {"$$$x": b"y"}}]])
def test_the_readable_form_reads_back_as_the_value_and_a_users_dict_never_as_a_tag(value):
    shown = jsonable(value, tagged=True)
    assert _same(from_jsonable(shown), value), shown
    assert _same(from_exact_json(exact_json(value)), value)


def test_a_users_dict_and_the_bytes_it_looks_like_are_shown_apart():
    assert jsonable(b"hi", tagged=True) == {"$bytes": "aGk="}
    assert jsonable({"$bytes": "aGk="}, tagged=True) == {"$$bytes": "aGk="}
    assert jsonable({"$float": "nan"}, tagged=True) == {"$$float": "nan"}
    assert jsonable({"n": {"$none": True}}, tagged=True) == {"n": {"$$none": True}}
    assert jsonable({"$bytes": "aGk="}) == {"$bytes": "aGk="}      # (untagged: logs and annotations, as they were)


def test_forms_written_before_the_escape_read_as_before_where_unambiguous():
    before = {"key": "k", "amount": [1, 2.5, None, True], "nested": {"a": {"b": "c"}}, "$type": "not a tag",
              "pair": {"$weird": 1, "other": 2}, "text": "$bytes"}
    assert from_jsonable(before) == before
    assert from_jsonable({"blob": {"$bytes": "eHk="}, "low": {"$float": "-inf"}}) == {"blob": b"xy",
                                                                                      "low": -math.inf}


def test_reading_a_form_nested_beyond_the_bound_is_refused_naming_it_and_one_at_the_bound_reads():
    value: object = {"$bytes": "aGk="}
    for _ in range(EXACT_DEPTH - 1):
        value = [value]
    assert from_jsonable(value) is not None
    for _ in range(100_000):
        value = [value]
    with pytest.raises(NestedTooDeep, match=f"{EXACT_DEPTH} levels"):
        from_jsonable(value)
