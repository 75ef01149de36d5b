"""The multi-version state table (§6.2) and what one operation does to it (its semantics).

:class:`VersionTable` keeps, per state ``(table, key)``, the base image (committed before the
batch, from the store or a caller's dict) and the versions written in this batch, each
stamped with the writing transaction's timestamp ``t``:

* ``read(state, t)``  — the latest version with timestamp < ``t`` (else the base image);
* ``write(state, t, image)`` — add the version of ``t`` (EXE);
* ``remove(state, t)`` — drop it (an ABT operation, or a rollback before a redo);
* ``window(state, t, size)`` — the versions with timestamp < ``t`` whose transaction time
  lies in ``[time(t) - size, time(t))``, oldest first.

Invariant: per state, at most one version per timestamp (a transaction writes a row at
most once), and the timestamp list is sorted.

:func:`perform` is the meaning of one operation, shared by the TPG executor and the serial
reference: it reads through callables, so each executor supplies its own state.
Thread-safety: none; one executor owns a table.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Mapping
from typing import Any

from activedb.batch._declare import DELETE, Abort, OpKind, OpSpec
from activedb.batch.errors import DeclarationError, ExecutionInvariantBroken

__all__ = ["VersionTable", "failure_reason", "merge_image", "perform"]

_MISSING = object()


class VersionTable:
    def __init__(self, base: Mapping[tuple[str, Any], dict | None] | None = None, *,
                 times: list[Any] | None = None, loader: Callable[[str, Any], dict | None] | None = None) -> None:
        self._base: dict[tuple[str, Any], dict | None] = dict(base or {})
        # state -> (timestamps, images); timestamps sorted
        self._versions: dict[tuple[str, Any], tuple[list[int], list[Any]]] = {}
        self._times = times or []
        self._loader = loader

    def base(self, state: tuple[str, Any]) -> dict | None:
        image = self._base.get(state, _MISSING)
        if image is _MISSING:
            image = self._loader(state[0], state[1]) if self._loader is not None else None
            self._base[state] = image
        return image

    def read(self, state: tuple[str, Any], t: int) -> dict | None:
        entry = self._versions.get(state)
        if entry is not None:
            stamps = entry[0]
            position = bisect_left(stamps, t)
            if position:
                return entry[1][position - 1]
        return self.base(state)

    def write(self, state: tuple[str, Any], t: int, image: dict | None) -> None:
        entry = self._versions.get(state)
        if entry is None:
            self._versions[state] = ([t], [image])
            return
        stamps, images = entry
        if not stamps or stamps[-1] < t:
            stamps.append(t)
            images.append(image)
            return
        position = bisect_left(stamps, t)
        if stamps[position] == t:
            raise ExecutionInvariantBroken(f"{state!r} already has a version at t={t}; it must be removed first")
        stamps.insert(position, t)
        images.insert(position, image)

    def remove(self, state: tuple[str, Any], t: int) -> None:
        entry = self._versions.get(state)
        position = -1 if entry is None else bisect_left(entry[0], t)
        if entry is None or position == len(entry[0]) or entry[0][position] != t:
            raise ExecutionInvariantBroken(f"no version of {state!r} at t={t} to remove")
        del entry[0][position]
        del entry[1][position]

    def window(self, state: tuple[str, Any], t: int, size: Any) -> list[dict | None]:
        entry = self._versions.get(state)
        if entry is None:
            return []
        stamps, images = entry
        position = bisect_left(stamps, t)
        times = self._times
        lower = times[t] - size
        first = position
        while first > 0 and times[stamps[first - 1]] >= lower:
            first -= 1
        return images[first:position]

    def final(self) -> dict[tuple[str, Any], dict | None]:
        """The last version of every state written in the batch (states only read are absent)."""
        return {state: images[-1] for state, (stamps, images) in self._versions.items() if stamps}

    def version_count(self) -> int:
        return sum(len(stamps) for stamps, _ in self._versions.values())


def merge_image(own: dict | None, result: Any, spec: OpSpec) -> dict | None:
    """The image a write function's ``result`` makes of ``own`` (the columns merged; DELETE: None)."""
    if result is DELETE:
        return None
    if not isinstance(result, Mapping):
        raise DeclarationError(f"the write function of {spec.kind.value} {spec.table} returned {result!r}; "
                               f"return a mapping of the columns to set, or batch.DELETE")
    if own is None:
        return dict(result)
    merged = dict(own)
    merged.update(result)
    return merged


def perform(spec: OpSpec, t: int, read: Callable[[tuple[str, Any], int], Any],
            window: Callable[[tuple[str, Any], int, Any], list]) -> tuple[tuple[str, Any] | None, Any, Any]:
    """Run one operation of the transaction at ``t``: returns ``(state written or None, image
    written, output)``.  Raises :class:`Abort` (or whatever the user's function raised)."""
    kind = spec.kind
    if kind is OpKind.WRITE:
        state = (spec.table, spec.key)
        own = read(state, t)
        if spec.params:
            result = spec.fn(own, *[read(param, t) for param in spec.params])
        else:
            result = spec.fn(own)
        image = merge_image(own, result, spec)
        return state, image, image
    if kind is OpKind.READ:
        return None, None, read((spec.table, spec.key), t)
    if kind is OpKind.CHECK:
        values = [read((spec.table, spec.key), t), *[read(param, t) for param in spec.params]]
        if spec.fn(*values):
            raise Abort(spec.reason or "condition failed")
        return None, None, None
    if kind is OpKind.WINDOW_READ:
        windows = [window((spec.table, spec.key), t, spec.size), *[window(param, t, spec.size) for param in spec.params]]
        return None, None, spec.fn(windows)
    if kind is OpKind.WINDOW_WRITE:
        state = (spec.table, spec.key)
        own = read(state, t)
        image = merge_image(own, spec.fn(own, [window(param, t, spec.size) for param in spec.params]), spec)
        return state, image, image
    params = [read(param, t) for param in spec.params]
    key = spec.key_fn(*params)
    if spec.candidates is not None and key not in spec.candidates:
        raise DeclarationError(f"the key function of a non-deterministic {kind.value} on {spec.table} returned "
                               f"{key!r}, which is not among its declared candidates")
    state = (spec.table, key)
    if kind is OpKind.ND_READ:
        return None, None, read(state, t)
    own = read(state, t)
    image = merge_image(own, spec.fn(own, *params), spec)
    return state, image, image


def failure_reason(spec: OpSpec, error: BaseException) -> str:
    if isinstance(error, Abort):
        return str(error) or "aborted"
    return f"{spec.kind.value} on {spec.table} raised {type(error).__name__}: {error}"
