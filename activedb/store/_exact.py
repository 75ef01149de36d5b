"""Values as JSON PostgreSQL's ``jsonb`` holds, and back — exactly (:func:`exact_json`,
:func:`from_exact_json`; ``jsonable`` is the readable, lossy twin, whose tagged form :func:`from_jsonable` reads).

Plain JSON values are stored as themselves; every other value is a one-key object whose key starts with
``$`` (a dict whose keys could be mistaken for such a tag is ``{"$map": [[key, value], ...]}``); a value of
a type the codec does not know is pickled (``{"$pickle": base64}``).  Pure functions, thread-safe.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import functools
import math
import pickle
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from activedb.store._nesting import EXACT_DEPTH, Deeper, within
from activedb.store._schema import text_problem

if TYPE_CHECKING:  # pragma: no cover
    from activedb.store._sql import Json

__all__ = ["exact_json", "from_exact_json", "from_jsonable"]

_TAG = "$"


def exact_json(value: object) -> Json:
    """``value`` as JSON ``jsonb`` accepts, decodable by :func:`from_exact_json` into an equal value.  A value whose
    lists, dicts, tuples and sets nest deeper than ``EXACT_DEPTH`` levels is refused:
    :class:`~activedb.errors.NestedTooDeep` (its encoding and decoding would run out of Python's stack)."""
    return within(_exact, value, EXACT_DEPTH)


def _exact(value: object, levels: int) -> Json:
    """:func:`exact_json` of ``value``, allowed ``levels`` more levels of nesting (:class:`Deeper` beyond them)."""
    # The exact built-in types an event carries (str, dict, int, bool, None, float, datetime, list) first,
    # without the ``isinstance`` cascade (every outbox record and dead letter encodes a whole event); anything
    # else, subclasses included, by the general rules below.
    if type(value) is str:
        if value.isascii() and "\x00" not in value:
            return value
    elif type(value) is dict:
        if not levels:
            raise Deeper
        # Its plain values (a str of ASCII without NUL, None, an int, a bool) as themselves, without a call each
        # (an outbox record's event holds a row or a payload of them); the rest by this function.
        encoded: dict[str, Json] = {}
        for key, item in value.items():
            if type(key) is not str or key.startswith(_TAG) or "\x00" in key or (
                    not key.isascii() and text_problem(key) is not None):
                break
            if type(item) is str:
                encoded[key] = item if item.isascii() and "\x00" not in item else _exact(item, levels - 1)
            elif item is None or type(item) is int or type(item) is bool:
                encoded[key] = item
            else:
                encoded[key] = _exact(item, levels - 1)
        else:
            return encoded
    elif value is None or type(value) is int or type(value) is bool:
        return value
    elif type(value) is float:
        # Plain iff its ``repr`` is positive decimal notation: ``repr`` writes an exponent exactly below 1e-4
        # and from 1e16 on (NaN and infinities fail both comparisons).
        if 1e-4 <= value < 1e16 or value == 0.0 and math.copysign(1.0, value) > 0:
            return value
    elif type(value) is dt.datetime:
        return {"$datetime": value.isoformat()}
    elif type(value) is list:
        if not levels:
            raise Deeper
        levels -= 1     # (its ints, bools and Nones as themselves, without a call each, as a dict's)
        return [item if type(item) is int or type(item) is bool or item is None else _exact(item, levels)
                for item in value]
    return _exact_json(value, levels)


def _exact_json(value: object, levels: int) -> Json:
    """:func:`exact_json` by the general rules (every type, its subclasses included); ``levels`` as ``_exact``'s."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value if type(value) is int else {"$pickle": _pickled(value)}
    if isinstance(value, float):
        if type(value) is float and math.isfinite(value) and "e" not in repr(value) and math.copysign(1.0, value) > 0:
            return value
        return {"$float": repr(float(value))}
    if isinstance(value, str):
        if type(value) is not str:        # a str Enum (e.g. EventKind): its plain value
            value = str.__str__(value) if not hasattr(value, "value") else getattr(value, "value")
        if text_problem(value) is None:
            return value
        return {"$str": base64.b64encode(value.encode("utf-8", "surrogatepass")).decode("ascii")}
    if isinstance(value, dt.datetime):
        return {"$datetime": value.isoformat()}
    if isinstance(value, dt.date):
        return {"$date": value.isoformat()}
    if isinstance(value, dt.time):
        return {"$time": value.isoformat()}
    if isinstance(value, dt.timedelta):
        return {"$timedelta": [value.days, value.seconds, value.microseconds]}
    if isinstance(value, decimal.Decimal):
        return {"$decimal": str(value)}
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"$bytes": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, uuid.UUID):
        return {"$uuid": str(value)}
    if isinstance(value, (tuple, list, set, frozenset, dict)):
        if not levels:
            raise Deeper
        levels -= 1
    if isinstance(value, tuple):
        return {"$tuple": [_exact(item, levels) for item in value]}
    if isinstance(value, list):
        return [_exact(item, levels) for item in value]
    if isinstance(value, (set, frozenset)):
        return {"$set" if isinstance(value, set) else "$frozenset": [_exact(item, levels) for item in value]}
    if isinstance(value, dict):
        if all(type(key) is str and not key.startswith(_TAG) and text_problem(key) is None for key in value):
            return {key: _exact(item, levels) for key, item in value.items()}
        return {"$map": [[_exact(key, levels), _exact(item, levels)] for key, item in value.items()]}
    return {"$pickle": _pickled(value)}


def _pickled(value: object) -> str:
    return base64.b64encode(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)).decode("ascii")


# The tags of values that nest nothing: the value decoded from the tag's item.
_DECODERS: dict[str, Callable[[Any], object]] = {
    "$float": float,
    "$str": lambda text: base64.b64decode(text).decode("utf-8", "surrogatepass"),
    "$datetime": dt.datetime.fromisoformat,
    "$date": dt.date.fromisoformat,
    "$time": dt.time.fromisoformat,
    "$timedelta": lambda parts: dt.timedelta(days=parts[0], seconds=parts[1], microseconds=parts[2]),
    "$decimal": decimal.Decimal,
    "$bytes": base64.b64decode,
    "$uuid": uuid.UUID,
    "$pickle": lambda text: pickle.loads(base64.b64decode(text)),
}
# The tags of collections, one level of nesting each (as ``exact_json`` counts them): the collection of the
# decoded items of the tag's list.
_COLLECTIONS: dict[str, Callable[[list[object]], object]] = {"$tuple": tuple, "$set": set, "$frozenset": frozenset}


@dataclass(frozen=True)
class _Form:
    """What the tags of a JSON form are, for :func:`_decoded`: ``scalars``, the tags of values that nest nothing, and
    the value each stands for; ``collections``: whether the tags of collections (``_COLLECTIONS``, ``$map``) are
    read; ``escaped``: whether a key that starts with ``$$`` is a key of the value's own escaped (``tagged_key``)."""

    scalars: dict[str, Callable[[Any], object]]
    collections: bool
    escaped: bool


_EXACT = _Form(_DECODERS, True, False)
# (Never ``$pickle``: a readable form is no exact one, and a letter written before keys were escaped may hold any
# user's dict; a tag whose item is no text is such a dict, and stays one.)
_READABLE = _Form({"$bytes": lambda text: base64.b64decode(text) if isinstance(text, str) else {"$bytes": text},
                   "$float": lambda text: float(text) if isinstance(text, str) else {"$float": text}}, False, True)

#: What to do about a stored value nested deeper than ``from_exact_json`` decodes (``exact_json`` writes none).
_NOT_EXACT = ("exact_json writes none so deep, so something else wrote it: read it as plain JSON, or write it again "
              "through activedb")


def from_exact_json(value: Any) -> Any:
    """The inverse of :func:`exact_json`.  A value that nests deeper than ``EXACT_DEPTH`` levels as ``exact_json``
    counts them (its lists, dicts, tuples, sets and ``$map`` pairs), which ``exact_json`` never writes, is refused:
    :class:`~activedb.errors.NestedTooDeep` (its decoding would run out of Python's stack)."""
    return within(_decoded, value, EXACT_DEPTH, advice=_NOT_EXACT)


def from_jsonable(value: Json) -> object:
    """The value :func:`~activedb.store.jsonable` ``(…, tagged=True)`` showed as ``value``, as far as that form keeps
    it: a tag (``{"$bytes": base64}``, ``{"$float": "nan"}``: a one-key object) is the value it stands for, a key
    escaped (:func:`~activedb.store.tagged_key`: ``$$bytes``) loses its added ``$``, everything else is itself
    (datetimes stay ISO text, tuples lists).  A form written before keys were escaped reads alike unless a mapping in
    it had a key starting with ``$$``, or was itself ``{"$bytes": text}`` or ``{"$float": text}``.  A form nested
    deeper than ``EXACT_DEPTH`` levels (``jsonable`` writes none deeper than ``JSONABLE_DEPTH``) is refused:
    :class:`~activedb.errors.NestedTooDeep`."""
    return within(functools.partial(_decoded, form=_READABLE), value, EXACT_DEPTH,
                  advice="jsonable writes none so deep: read it as plain JSON")


def _decoded(value: Any, levels: int, form: _Form = _EXACT) -> Any:
    """The value of ``value``, JSON of ``form``, allowed ``levels`` more levels of nesting (:class:`Deeper` beyond
    them)."""
    if isinstance(value, list):
        if not levels:
            raise Deeper
        levels -= 1     # (its plain items as themselves, without a call each, as ``_exact``'s)
        return [item if type(item) in _PLAIN else _decoded(item, levels, form) for item in value]
    if isinstance(value, dict):
        if len(value) == 1:
            (key, item), = value.items()
            decoder = form.scalars.get(key)
            if decoder is not None:
                return decoder(item)
            collection = _COLLECTIONS.get(key)
            if form.collections and (collection is not None or key == "$map"):
                if not levels:
                    raise Deeper
                if collection is not None:
                    return collection([_decoded(element, levels - 1, form) for element in item])
                return {_decoded(pair_key, levels - 1, form): _decoded(pair_item, levels - 1, form)
                        for pair_key, pair_item in item}
        if not levels:
            raise Deeper
        levels -= 1
        if form.escaped:
            return {key[1:] if key.startswith("$$") else key:
                    item if type(item) in _PLAIN else _decoded(item, levels, form) for key, item in value.items()}
        return {key: item if type(item) in _PLAIN else _decoded(item, levels, form) for key, item in value.items()}
    return value


#: The types of JSON values that are themselves, decoded.
_PLAIN = frozenset((str, int, float, bool, type(None)))
