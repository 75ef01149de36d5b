"""``exact_json``'s fast path for the exact built-in types (str, dict, int, bool, None, float, datetime, list)
gives the general rules' text, and every value comes back equal through ``from_exact_json`` — NUL characters,
lone surrogates, keys that look like tags, floats at the edges of decimal notation, subclasses of the fast
path's types.  The oracle is the general rules (``_exact_json``).  No database."""

from __future__ import annotations

import datetime as dt
import decimal
import enum
import json
import math
import uuid
from unittest import mock

from hypothesis import given
from hypothesis import strategies as st

from activedb.store import EXACT_DEPTH, _exact, exact_json, from_exact_json
from activedb.store._exact import _exact_json


class Kind(enum.StrEnum):
    STREAM = "stream"


class Count(int):
    """An ``int`` subclass: pickled, never taken as a plain ``int``."""


class Tagged(dict):
    """A ``dict`` subclass: encoded by the general rules."""


TEXT = st.text(alphabet=st.characters(codec=None, exclude_categories=()), max_size=8) | st.sampled_from(
    ["", "$float", "$x", "a\x00b", "\ud800", "plain", "naïve"])
SCALARS = (st.none() | st.booleans() | st.integers(min_value=-2**70, max_value=2**70) | TEXT
           | st.floats(allow_nan=False) | st.just(-0.0) | st.just(Kind.STREAM)
           | st.integers(min_value=-5, max_value=5).map(Count)
           | st.datetimes(timezones=st.none() | st.just(dt.timezone.utc)) | st.dates()
           | st.decimals(allow_nan=False, allow_infinity=False, places=3) | st.binary(max_size=4)
           | st.uuids())
KEYS = TEXT | st.integers(min_value=-3, max_value=3) | st.tuples(st.integers(0, 3), TEXT)
VALUES = st.recursive(
    SCALARS,
    lambda children: (st.lists(children, max_size=3) | st.tuples(children, children)
                      | st.dictionaries(KEYS, children, max_size=3)
                      | st.dictionaries(TEXT, children, max_size=3)
                      | st.dictionaries(TEXT, children, max_size=2).map(Tagged)),
    max_leaves=12)


def general(value: object) -> object:
    """``value`` by the general rules all the way down (its items too, not only at the top)."""
    with mock.patch.object(_exact, "_exact", _exact_json):
        return _exact_json(value, EXACT_DEPTH)


@given(VALUES)
def test_the_fast_path_agrees_with_the_general_rules_and_every_value_comes_back(value):
    encoded = exact_json(value)
    # plain JSON (no NaN, no infinity, no object), the same text as the general rules' (floats and ints alike)
    assert json.dumps(encoded, allow_nan=False) == json.dumps(general(value))
    decoded = from_exact_json(encoded)
    assert decoded == value
    assert type(decoded) is (dict if type(value) is Tagged else type(value)) or isinstance(value, enum.Enum)


def test_floats_at_the_edges_of_decimal_notation_are_plain_exactly_when_the_general_rules_say_so():
    # ``repr`` writes an exponent below 1e-4 and from 1e16 on: each edge, its neighbours, both signs.
    for edge in (0.0, 5e-324, 1e-4, 1e16, math.inf):
        for value in (edge, math.nextafter(edge, 0.0), math.nextafter(edge, math.inf)):
            for signed in (value, -value):
                assert json.dumps(exact_json(signed)) == json.dumps(general(signed)), signed


def test_text_postgresql_cannot_hold_and_floats_json_cannot_are_tagged():
    assert exact_json("a\x00b") == {"$str": "YQBi"}
    assert from_exact_json(exact_json("\ud800")) == "\ud800"
    assert exact_json({"$float": 1}) == {"$map": [["$float", 1]]}
    assert math.isnan(from_exact_json(exact_json(math.nan)))
    assert exact_json(Count(3)) != 3 and from_exact_json(exact_json(Count(3))) == 3
    assert exact_json(Kind.STREAM) == "stream"
    assert exact_json(decimal.Decimal("1.50")) == {"$decimal": "1.50"}
    assert from_exact_json(exact_json(uuid.UUID(int=5))) == uuid.UUID(int=5)
