"""``json_problem`` checks the exact built-in types before the ABCs; its answer — None or the message, with
the path of the first problem — is the same for every value as that of the check by ABCs alone (kept here
as the oracle)."""

from __future__ import annotations

import collections
import math
from collections.abc import Mapping
from typing import Any

import pytest

from activedb.store import json_problem, text_problem


def abc_json_problem(value: Any, path: str = "$") -> str | None:
    """The check by ``isinstance`` against the ABCs only (the store's check before its fast path)."""
    if value is None or isinstance(value, (bool, int)):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{path} is {value!r}, which JSON cannot represent"
    if isinstance(value, str):
        problem = text_problem(value)
        return None if problem is None else f"{path}: {problem}"
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                return f"{path} has the key {key!r} ({type(key).__name__}); JSON object keys are strings"
            problem = text_problem(key) or abc_json_problem(item, f"{path}.{key}")
            if problem is not None:
                return problem
        return None
    if isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            problem = abc_json_problem(item, f"{path}[{index}]")
            if problem is not None:
                return problem
        return None
    return f"{path} is a {type(value).__name__} ({value!r:.60}), which is not a JSON value"


class Text(str):
    pass


class Number(int):
    pass


class Real(float):
    pass


class Row(dict):
    pass


class Items(list):
    pass


class Frozen(Mapping):
    """A Mapping that is no dict."""

    def __init__(self, items: dict) -> None:
        self._items = items

    def __getitem__(self, key):
        return self._items[key]

    def __iter__(self):
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)


class ListMapping(list, Mapping):
    """Both a list and a Mapping: checked as an object (the ABC check looks at Mapping first)."""

    def __getitem__(self, key):
        return {"k": "\x00"}[key] if key == "k" else list.__getitem__(self, key)

    def keys(self):
        return ["k"]

    def items(self):
        return [("k", "\x00")]


VALUES = [
    None, True, False, 0, -1, 2**70, Number(5), 1.5, -0.0, Real(2.5), float("nan"), float("inf"), -math.inf,
    Real("nan"), "", "plain", 'quote " and \\ backslash', "ünïcødé ☃ 𝄞", "nul\x00here", "lone \ud800 surrogate",
    Text("sub"), Text("nul\x00"), {}, [], (), {"a": 1, "b": [1, 2, {"c": None}]}, Row(a=1), Row(a=float("nan")),
    Items([1, "x\x00"]), (1, 2, (3, math.nan)), Frozen({"x": 1}), Frozen({"x": [1, b"bytes"]}), {1: "int key"},
    {"ok": 1, 2.5: "float key"}, {None: 1}, {Text("k"): 1}, {"bad\x00key": 1}, {"\udc80": 1},
    {"a": {"b": [0, {"c": float("-inf")}]}}, {"a": [{"b": set()}]}, {"a": {"b": {1: 2}}},
    [[[[["deep\ud800"]]]]], {"ok": "fine", "later": ValueError("no JSON")}, b"bytes", bytearray(b"x"),
    {1, 2}, object, 1 + 2j, [1, 2, 3, ..., 5], collections.OrderedDict(a=1, b=math.nan),
    collections.defaultdict(int, {"x": [1, {"y": b"z"}]}), ListMapping([1, 2]), "x" * 200, ["y" * 200, {1}],
]


@pytest.mark.parametrize("value", VALUES, ids=[f"v{index}" for index in range(len(VALUES))])
def test_the_same_answer_as_the_abc_check(value):
    expected = abc_json_problem(value)
    assert json_problem(value) == expected
    assert json_problem(value, "$.column[3]") == abc_json_problem(value, "$.column[3]")


def test_the_table_has_problems_at_depth():
    """The table is not all valid values: nested problems are reported with their paths."""
    assert json_problem({"a": {"b": [0, {"c": float("-inf")}]}}) == "$.a.b[1].c is -inf, which JSON cannot represent"
    assert json_problem({"ok": 1, 2.5: "x"}) == "$ has the key 2.5 (float); JSON object keys are strings"
    assert json_problem(ListMapping([1, 2])).startswith("$.k: the text contains a NUL character")
    assert sum(abc_json_problem(value) is not None for value in VALUES) >= 25
