"""What one operation does to the multi-version state: :func:`perform`, shared by the TPG executor and
the serial reference (it reads through callables; the state is an :class:`activedb.versions.Versions`).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from typing import TypeAlias

from activedb.batch._declare import DELETE, Abort, OpKind, OpSpec, State, canonical_key, inserted
from activedb.batch.errors import DeclarationError
from activedb.errors import SchemaError
from activedb.store import RowImage, TableInfo, own_image

#: ``read(state, t)``: the image of ``state`` as of before the transaction at ``t`` (None: no row).
Read: TypeAlias = "Callable[[State, int], RowImage | None]"
#: ``window(state, t, size)``: the images ``state`` had in ``[time(t) - size, time(t))``, oldest first.
Window: TypeAlias = "Callable[[State, int, float], list[RowImage | None]]"
#: ``loader(table, key)``: a row's image from the store, for a state the batch was not given (None: no row).
Loader: TypeAlias = "Callable[[str, Hashable], RowImage | None]"
#: ``check(writes, outputs)``: why one transaction's written ``(state, image)`` pairs and outputs cannot be
#: stored, or None (``_store.store_check``).
WriteCheck: TypeAlias = "Callable[[list[tuple[State, RowImage | None]], dict[str, object] | None], str | None]"


#: Why a transaction aborts whose non-deterministic write resolved to a row it also writes (the declaration could
#: not see it: ``Ops`` refuses a row declared twice).
WRITTEN_TWICE = ("DeclarationError: a non-deterministic write resolved to a row its transaction also writes; a state "
                 "transaction writes a row at most once: compute both changes in one write function")


class NestedColumns(dict[str, "frozenset[str]"]):
    """``nested[table]``: the list and dict columns of ``table`` (``TableInfo.nested``: a JSON, JSONB, ARRAY or
    HSTORE column's), looked up in the catalog once per table and kept — what an executor that knows the store
    copies of a function's argument besides the dict (empty for most tables: they pay one lookup).  A table the
    catalog cannot name (its :class:`~activedb.errors.SchemaError`) has none (loading its rows fails on its own); any
    other error of the lookup (a lost connection) is raised, and the table looked up again next time.  One batch's, used by one thread."""

    def __init__(self, table_info: Callable[[str], TableInfo]) -> None:
        super().__init__()
        self._table_info = table_info

    def __missing__(self, table: str) -> frozenset[str]:
        try:
            columns = self._table_info(table).nested
        except SchemaError:             # (no such table: its rows are never loaded; a lost connection is raised)
            columns = frozenset()
        self[table] = columns
        return columns


def given(image: RowImage | None) -> RowImage | None:
    """``image`` as an operation's function gets it: a copy of its own (the image stays the state's, and a function
    that changes its argument in place changes nothing — a transaction that then aborts leaves the state as it was,
    as ``tx.read``'s copy does for the same rule fired in a transaction); its lists and dicts (a JSON or ARRAY
    column's) are copies too (``own_image``)."""
    return image if image is None else own_image(image)


def merge_image(own: RowImage | None, result: object, spec: OpSpec) -> RowImage | None:
    """The image a write function's ``result`` makes of ``own`` (the columns merged; DELETE: None)."""
    if result is DELETE:
        return None
    if not isinstance(result, Mapping):
        raise DeclarationError(f"the write function of {spec.kind.value} {spec.table} returned {result!r}; "
                               f"return a mapping of the columns to set, or batch.DELETE")
    return dict(result) if own is None else {**own, **result}


def outside_candidates(kind: OpKind, table: str, key: Hashable) -> DeclarationError:
    """What a non-deterministic operation whose key function returned ``key``, none of its declared candidates,
    fails with (in a batch and in a firing's transaction alike)."""
    return DeclarationError(f"the key function of a non-deterministic {kind.value} on {table} returned {key!r}, "
                            f"which is not among its declared candidates: add it to candidates=, or make the key "
                            f"function return one of them")


def perform(spec: OpSpec, t: int, read: Read, window: Window) -> tuple[State | None, RowImage | None, object]:
    """Run one operation of the transaction at ``t``: returns ``(state written or None, image
    written, output)``.  Raises :class:`Abort` (or whatever the user's function raised)."""
    kind = spec.kind
    if kind is OpKind.WRITE:
        state = (spec.table, spec.key)
        own = read(state, t)
        if spec.params:
            result = spec.fn(given(own), *[given(read(param, t)) for param in spec.params])
        else:
            result = spec.fn(given(own))
        image = merge_image(own, result, spec)
        return state, image, image
    if kind is OpKind.READ:
        return None, None, read((spec.table, spec.key), t)
    if kind is OpKind.CHECK:
        values = [given(read((spec.table, spec.key), t)), *[given(read(param, t)) for param in spec.params]]
        if spec.fn(*values):
            raise Abort(spec.reason or "condition failed")
        return None, None, None
    if kind is OpKind.WINDOW_READ:
        windows = [[given(image) for image in window(state, t, spec.size)]
                   for state in ((spec.table, spec.key), *spec.params)]
        return None, None, spec.fn(windows)
    if kind is OpKind.WINDOW_WRITE:
        state = (spec.table, spec.key)
        own = read(state, t)
        image = merge_image(own, spec.fn(given(own), [[given(image) for image in window(param, t, spec.size)]
                                                      for param in spec.params]), spec)
        return state, image, image
    params = [given(read(param, t)) for param in spec.params]
    if kind is OpKind.INSERT:
        return None, None, inserted(spec, spec.fn(*params))
    key = canonical_key(spec.key_fn(*params))
    if spec.candidates is not None and key not in spec.candidates:
        raise outside_candidates(kind, spec.table, key)
    state = (spec.table, key)
    if kind is OpKind.ND_READ:
        return None, None, read(state, t)
    own = read(state, t)
    image = merge_image(own, spec.fn(given(own), *params), spec)
    return state, image, image


def failure_reason(spec: OpSpec, error: BaseException) -> str:
    if isinstance(error, Abort):
        reason = error.args[0] if len(error.args) == 1 else None
        return reason if isinstance(reason, str) and reason else str(error) or "aborted"   # (a FinalReason kept)
    return f"{spec.kind.value} on {spec.table} raised {type(error).__name__}: {error}"
