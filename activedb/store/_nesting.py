"""How deep a value's lists, dicts and tuples may nest: the bound of an event's payload and of a value's readable
form (:data:`JSONABLE_DEPTH`), the more generous one of a stored JSON value and of its exact form
(:data:`EXACT_DEPTH`), and the refusal of a deeper value (:func:`too_deep`: :class:`~activedb.errors.NestedTooDeep`).
Pure code, thread-safe.

The walks that recurse over a value (``own_value`` and ``copy_nested``, ``exact_json`` and ``from_exact_json``,
``json_problem`` and an array column's check in ``TableInfo.check_value``, ``jsonable`` and ``from_jsonable``) count the levels left as they go and stop at their bound —
raising :class:`Deeper`, which their public entry turns into ``too_deep`` of the whole value (:func:`within`, but
``jsonable``, which shows a text in its place) —, so no value exhausts Python's stack in them, however deep it is or
if it holds itself.  The walks that compare (``same_image``, ``holds_nan``) take no bound: they keep their pending
items in a list, not on the stack.  Only the refusal measures the value (:func:`nesting_depth`, without recursion),
to say how deep it is.
"""

from __future__ import annotations

from itertools import chain
from typing import Callable, Iterable, Iterator, Mapping, TypeVar

from activedb.errors import NestedTooDeep

#: How many levels of nested lists, dicts and tuples a field of an event's payload may have where it enters the
#: engine (``tx.emit``, ``tx.signal``: their copy refuses a deeper one), and how many
#: :func:`~activedb.store.jsonable` shows (there the row, the mapping of the values, is the first level).
JSONABLE_DEPTH = 100

#: How many levels a column's value may have where it enters the engine (``tx.write``, ``insert``, ``write_many``:
#: their copy refuses a deeper one), and how many :func:`~activedb.store.exact_json` encodes.  Twice
#: ``JSONABLE_DEPTH``: activedb's own tables keep the application's values inside envelopes of their own, exactly
#: (a dead letter's original, a stream's saved events, an outbox record's event), which nest a few levels more
#: than the values — and a dead letter keeps the exact original of a row refused for its depth unless it is far
#: deeper.  The copy, the encoding and the decoding take a few frames per level: within Python's stack.
EXACT_DEPTH = 2 * JSONABLE_DEPTH

#: The levels of a walk that is not bounded (they never count down to 0): a copy of what is in the engine already
#: — a row read back, an event's image — is as deep as the database and the driver gave it.
UNBOUNDED = -1

#: How many containers :func:`nesting_depth` looks at before it gives up (a value too large to measure).
_MEASURED = 1_000_000


class Deeper(Exception):
    """A recursive walk reached its bound (a signal between a walk and its public entry, which raises
    :func:`too_deep`; never seen outside the store)."""


def nesting_depth(value: object) -> int | None:
    """How many levels of lists, tuples, sets and mappings (their keys and values) nest in ``value`` (0: it is none
    of them); None if it holds itself, or holds more than ``_MEASURED`` of them.  Walks without recursion."""
    deepest = 0
    looked = 0
    walking: list[Iterator[object]] = []   # per container being walked: its children left ...
    identities: list[int] = []             # ... and its id()
    on_path: set[int] = set()         # Invariant: on_path == set(identities)
    item: object = value
    while True:
        children: Iterable[object] | None = None
        kind = item.__class__
        if kind is list or kind is tuple:               # (the common containers first: an ABC's check is slow)
            children = item  # type: ignore[assignment]
        elif kind is dict:
            children = chain(item.keys(), item.values())  # type: ignore[attr-defined]
        elif isinstance(item, Mapping):
            children = chain(item.keys(), item.values())
        elif isinstance(item, (list, tuple, set, frozenset)):
            children = item
        if children is not None:
            looked += 1
            identity = id(item)
            if identity in on_path or looked > _MEASURED:
                return None
            walking.append(iter(children))
            identities.append(identity)
            on_path.add(identity)
            if len(walking) > deepest:
                deepest = len(walking)
        while walking:
            item = next(walking[-1], _END)
            if item is not _END:
                break
            walking.pop()
            on_path.discard(identities.pop())
        else:
            return deepest


_END = object()


#: What to do about a value refused for its depth where it enters the engine (:func:`too_deep`'s default).
FLATTEN_IT = "flatten it or store it as JSON text"


def too_deep(value: object, bound: int, name: str | None = None, advice: str = FLATTEN_IT) -> NestedTooDeep:
    """The refusal of ``value`` (the value of field or column ``name``, if given), nested deeper than ``bound``
    levels: how deep it is, the bound and what to do (``advice``)."""
    what = f"{name!r} is a {type(value).__name__}" if name is not None else f"a {type(value).__name__}"
    depth = nesting_depth(value)
    how = (f"nested {depth:,} levels deep, deeper than the {bound} levels a value may nest" if depth is not None else
           f"nested deeper than the {bound} levels a value may nest (it holds itself, or is too large to measure)")
    return NestedTooDeep(f"{what} {how}; {advice}")


_Walked = TypeVar("_Walked")
_Result = TypeVar("_Result")


def within(walk: Callable[[_Walked, int], _Result], value: _Walked, bound: int, name: str | None = None,
           advice: str = FLATTEN_IT) -> _Result:
    """``walk(value, bound)``: a walk over ``value`` that recurses with its nesting, allowed ``bound`` levels, raising
    :class:`Deeper` beyond them (``UNBOUNDED``: never) — its Deeper made the refusal of the whole value
    (:func:`too_deep` with ``name`` and ``advice``).  The one place a walk's bound becomes its caller's error."""
    try:
        return walk(value, bound)
    except Deeper:
        raise too_deep(value, bound, name, advice) from None
