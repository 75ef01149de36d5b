"""Private write sets: entries per row and how they compose (:meth:`Entry.then`, the table of ``README.md``,
"Write-set composition"), and :func:`resolve`, which applies a chain of entries, oldest first, over a base
image.  Pure code (no SQL, no threads).
"""

from __future__ import annotations

import copy
import decimal
import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Hashable, Mapping, TypeAlias

from activedb.errors import DuplicateKey
from activedb.store._nesting import UNBOUNDED, Deeper, nesting_depth, within

if TYPE_CHECKING:  # pragma: no cover
    import sqlalchemy as sa

Key: TypeAlias = "tuple[Hashable, ...]"  # primary-key values, in primary-key column order
Row: TypeAlias = "tuple[str, Key]"  # (table name, Key)
#: A row as activedb hands it to an application (``tx.read``, ``tx.scan``, an event's ``old``/``new``): column name
#: -> value, each of its column's Python type (so ``Any`` for the application's convenience: one alias, documented
#: once; inside the store an image is ``dict[str, object]``).
RowImage: TypeAlias = "dict[str, Any]"
#: A table as the transaction methods take it: its name, or the reflected ``sqlalchemy.Table``.
TableRef: TypeAlias = "str | sa.Table"


class EntryKind(enum.Enum):
    PATCH = "patch"
    INSERT = "insert"
    DELETE = "delete"
    REPLACE = "replace"
    ABSENT = "absent"      # the row must not exist; nothing is written (an INSERT, then a DELETE)


# Its members as module constants: CPython 3.11 looks an Enum class's attributes up through ``EnumType.__getattr__``'s
# slow path, and every write and read of a written row composes or applies entries.
_PATCH, _INSERT, _DELETE_KIND, _REPLACE, _ABSENT_KIND = (EntryKind.PATCH, EntryKind.INSERT, EntryKind.DELETE,
                                                         EntryKind.REPLACE, EntryKind.ABSENT)


@dataclass(frozen=True, slots=True)
class Entry:
    kind: EntryKind
    # None only for DELETE and ABSENT, whose values nothing reads (typed for the other kinds)
    values: Mapping[str, object] = None  # type: ignore[assignment]

    def then(self, later: "Entry", describe: str) -> "Entry":
        """This entry followed by ``later`` on the same row (see the module table)."""
        kind, later_kind = self.kind, later.kind
        must_not_exist = kind is _INSERT or kind is _ABSENT_KIND
        if later_kind is _DELETE_KIND or later_kind is _ABSENT_KIND:
            return _ABSENT if must_not_exist else _DELETE
        if kind is _ABSENT_KIND:
            return Entry(_INSERT, dict(later.values))
        if kind is _DELETE_KIND:
            return Entry(_REPLACE, dict(later.values))
        if later_kind is _INSERT:
            raise DuplicateKey(f"insert into {describe}: the row already exists (written earlier in this transaction)")
        if later_kind is _REPLACE:
            return Entry(_INSERT, dict(later.values)) if must_not_exist else later
        return Entry(kind, {**self.values, **later.values})

    def apply(self, base: dict[str, object] | None) -> dict[str, object] | None:
        """The row image after this entry, given the image before it."""
        kind = self.kind
        if kind is _DELETE_KIND or kind is _ABSENT_KIND:
            return None
        if kind is _PATCH and base is not None:
            return {**base, **self.values}
        return dict(self.values)


_DELETE = Entry(_DELETE_KIND)
_ABSENT = Entry(_ABSENT_KIND)


def resolve(chain: list[Entry], base: dict[str, object] | None) -> dict[str, object] | None:
    """Apply entries oldest-first (ancestors before descendants) to ``base``."""
    image = base
    for entry in chain:
        image = entry.apply(image)
    return image


def copy_nested(image: dict[str, object], names: "frozenset[str]", levels: int = UNBOUNDED) -> dict[str, object]:
    """``image`` (a copy of the caller's own) with the values of columns ``names`` copied too, in place: a JSON,
    JSONB, ARRAY or HSTORE column holds a list or dict, which a shallow copy shares with the image it was copied
    from (the image a transaction relies on, a write entry, another rule's event), so that
    ``row["tags"].append(...)`` would change that image.  ``TableInfo.nested`` names a table's such columns; a
    table without any never calls this.  Returns ``image``.  ``levels``: where a value enters the engine, the bound
    of its nesting — a column's value ``EXACT_DEPTH`` (room for the application's values in the envelopes of
    activedb's own tables: a dead letter's original, a stream's saved events), an event's payload
    ``JSONABLE_DEPTH`` —: a value nested deeper is refused, :class:`~activedb.errors.NestedTooDeep` naming its
    column or field (``image`` then has the values copied before it); ``UNBOUNDED`` (a row read back, an event's
    image: values in the engine already) copies what the database gave."""
    for name in names:
        value = image.get(name)
        if value is not None:
            image[name] = within(_owned, value, levels, name)
    return image


def own_image(image: dict[str, object], *, fresh: bool = False, levels: int = UNBOUNDED) -> dict[str, object]:
    """A copy of ``image`` whose lists and dicts are copies too, for a caller that does not know the image's table
    (a declared function's argument, a further rule's event): a plain copy when no value is a list or dict (one
    pass over the values' types in C), else ``copy_nested`` of the columns that hold one.  ``fresh``: ``image`` is
    a new dict already (composed by the caller): only its lists and dicts are copied, in place.  ``levels``: as
    ``copy_nested``'s."""
    copy = image if fresh else image.copy()
    if NESTED_TYPES.isdisjoint(map(type, copy.values())):
        return copy
    return copy_nested(copy, frozenset(name for name, value in copy.items() if type(value) in NESTED_TYPES), levels)


def own_value(value: object, levels: int = UNBOUNDED) -> object:
    """``value`` with every list and dict in it copied (what a JSON or ARRAY value is made of); anything else — a
    scalar, a tuple of scalars — is kept: it cannot be changed in place.  ``levels``: as ``copy_nested``'s."""
    return within(_owned, value, levels)


def _owned(value: object, levels: int) -> object:
    """``own_value(value)``, ``value`` allowed ``levels`` more levels of nesting (:class:`Deeper` beyond them;
    ``UNBOUNDED``, below 0, never counts down to 0)."""
    # (an item of an immutable built-in type is kept without a call: most of a JSON value's items are)
    kind = type(value)
    if kind is list:
        if levels:
            levels -= 1
            return [item if type(item) in _KEPT else _owned(item, levels)
                    for item in value]      # type: ignore[attr-defined]  # (a list)
    elif kind is dict:
        if levels:
            levels -= 1
            return {name: item if type(item) in _KEPT else _owned(item, levels)
                    for name, item in value.items()}  # type: ignore[attr-defined]  # (a dict)
    elif kind is tuple:
        if levels:
            levels -= 1
            return tuple([item if type(item) in _KEPT else _owned(item, levels)
                          for item in value])  # type: ignore[attr-defined]  # (a tuple)
    elif isinstance(value, (list, dict, set, bytearray)):  # (a subclass: its own copy's way, once measured)
        if levels < 0:
            return copy.deepcopy(value)
        depth = nesting_depth(value)
        if depth is not None and depth <= levels:
            return copy.deepcopy(value)
    else:
        return value
    raise Deeper


#: The value types ``_owned`` keeps as they are without a call (immutable: nothing in them to copy).
_KEPT = frozenset((str, int, float, bool, type(None)))


#: The value types ``own_image`` copies (a row's or payload's lists and dicts): what a caller tests ``type(value) in``
#: to skip the copy of an image that holds none.  Exactly these types, what a JSON or ARRAY column's value is made
#: of: a subclass of them, a set, or a tuple holding a list in an event's payload is kept as given, shared with
#: whoever else holds it (the cost of a test per value on every write and event is what the exact test avoids).
NESTED_TYPES = frozenset((list, dict))


def same_image(one: object, other: object) -> bool:
    """Whether two images read of a row (or two values in them, or two scans' rows by key) hold the same data:
    ``==``, except that a NaN (``float``, ``Decimal``) is the same as a NaN, as PostgreSQL has it (``'NaN' = 'NaN'``
    is true there) — else a row holding one would look changed to every check of a transaction that read it.
    The plain ``==`` decides whenever it finds them equal (the common case costs nothing more); else their dicts,
    lists and tuples are walked without recursion, however deep they nest (a pair of them met again, in values that
    hold themselves, is not walked twice)."""
    try:
        if one == other:
            return True
    except RecursionError:      # (C's ``==`` through values nested deeper than the interpreter's stack: walked here)
        pass
    pending: list[tuple[object, object]] = [(one, other)]
    walked: set[tuple[int, int]] = set()      # the pairs of dicts, lists and tuples walked already, by id()
    while pending:
        left, right = pending.pop()
        if type(left) is dict and type(right) is dict:
            if (id(left), id(right)) not in walked:
                walked.add((id(left), id(right)))
                if left.keys() != right.keys():
                    return False
                pending.extend((value, right[name]) for name, value in left.items())
        elif isinstance(left, (list, tuple)) and type(left) is type(right):
            if (id(left), id(right)) not in walked:
                walked.add((id(left), id(right)))
                if len(left) != len(right):
                    return False
                pending.extend(zip(left, right))
        elif not (left == right or (_is_nan(left) and _is_nan(right))):
            return False
    return True


def _is_nan(value: object) -> bool:
    return (isinstance(value, float) and value != value) or (isinstance(value, decimal.Decimal) and value.is_nan())


def holds_nan(value: object) -> bool:
    """Whether ``value`` is a NaN (``float``, ``Decimal``) or a tuple holding one: equal to nothing, itself included,
    it cannot key a partition or a row — a dict would tell two NaNs apart by the object alone.  Walks nested tuples
    without recursion."""
    if not isinstance(value, tuple):
        return _is_nan(value)
    pending: list[object] = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, tuple):
            pending.extend(item)
        elif _is_nan(item):
            return True
    return False


def matches(image: dict[str, object], where: Mapping[str, object] | Callable[[dict[str, object]], bool] | None) -> bool:
    """Whether a row ``image`` satisfies a scan's ``where``: None (every row), a mapping of column to value
    (all equal, as PostgreSQL's ``=`` finds them: a NaN equals a NaN, ``same_image``), or a predicate on the image."""
    if where is None:
        return True
    if callable(where) and not isinstance(where, Mapping):
        return bool(where(image))
    return all(same_image(image.get(column), value) for column, value in where.items())
