"""The multi-version store (``README.md``: its operations, invariants, and the papers' definitions).

A *state* is any hashable (both engines use ``(table, key)``); a *stamp* an int ordering the
writers.  A read before stamp ``b`` sees the latest version with a stamp ``< b``, else the base.
Thread-safety: none; the engine using a store serializes its calls.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Hashable, Iterator, Mapping
from typing import Generic, Protocol, TypeVar

from activedb.versions.errors import VersionInvariantBroken

_MISSING = object()
_Value = TypeVar("_Value")


class Times(Protocol):
    """``times[stamp]``: the writer's time in seconds (a list, or a lookup computed on demand)."""

    def __getitem__(self, stamp: int, /) -> float: ...


class Versions(Generic[_Value]):
    """Base values (given, or loaded on first read through ``loader``; else ``default``) and
    the versions of every state, stamps sorted; ``times[stamp]`` is the writer's time in seconds (``window``'s
    ``size`` too)."""

    def __init__(self, base: Mapping[Hashable, _Value | None] | None = None, *, times: Times | None = None,
                 loader: Callable[[Hashable], _Value | None] | None = None, default: _Value | None = None) -> None:
        self._base: dict[Hashable, _Value | None] = dict(base or {})
        self._versions: dict[Hashable, tuple[list[int], list[_Value]]] = {}   # state -> (stamps, values)
        self._times: Times = [] if times is None else times
        self._loader = loader
        self._default = default

    def __contains__(self, state: Hashable) -> bool:
        return state in self._base or state in self._versions

    def states(self) -> Iterator[Hashable]:
        """Every state with a base or a version: base order first, then first-write order."""
        yield from self._base
        yield from (state for state in self._versions if state not in self._base)

    def set_base(self, state: Hashable, value: _Value | None) -> None:
        """The base of ``state``, unless it has one already."""
        self._base.setdefault(state, value)

    def base(self, state: Hashable) -> _Value | None:
        value = self._base.get(state, _MISSING)
        if value is _MISSING:
            value = self._loader(state) if self._loader is not None else self._default
            self._base[state] = value
        return value  # type: ignore[return-value]  # (not _MISSING here)

    def read(self, state: Hashable, before: int) -> _Value | None:
        entry = self._versions.get(state)
        if entry is not None:
            index = bisect_left(entry[0], before)
            if index:
                return entry[1][index - 1]
        return self.base(state)

    def write(self, state: Hashable, stamp: int, value: _Value, *, replace: bool = False) -> bool:
        """Add the version of ``stamp``; returns False if it replaced one (only with ``replace``)."""
        entry = self._versions.get(state)
        if entry is None:
            self._versions[state] = ([stamp], [value])
            return True
        stamps, values = entry
        if not stamps or stamps[-1] < stamp:
            stamps.append(stamp)
            values.append(value)
            return True
        index = bisect_left(stamps, stamp)
        if stamps[index] == stamp:
            if not replace:
                raise VersionInvariantBroken(f"{state!r} already has a version at stamp {stamp}; remove it first")
            values[index] = value
            return False
        stamps.insert(index, stamp)
        values.insert(index, value)
        return True

    def remove(self, state: Hashable, stamp: int) -> None:
        entry = self._versions.get(state)
        index = -1 if entry is None else bisect_left(entry[0], stamp)
        if entry is None or index == len(entry[0]) or entry[0][index] != stamp:
            raise VersionInvariantBroken(f"no version of {state!r} at stamp {stamp} to remove")
        del entry[0][index]
        del entry[1][index]

    def collect(self, state: Hashable, floor: int) -> int:
        """Of the versions below ``floor`` only the latest can still be read (by a reader at
        ``floor`` or later): drop the older ones and the base (its value becomes ``default``);
        returns how many versions went."""
        entry = self._versions.get(state)
        if entry is None or not entry[0] or entry[0][0] >= floor:
            return 0
        stamps, values = entry
        if state in self._base:
            self._base[state] = self._default
        dropped = bisect_left(stamps, floor) - 1
        if dropped:
            del stamps[:dropped]
            del values[:dropped]
        return dropped

    def window(self, state: Hashable, before: int, size: float) -> list[_Value]:
        """The versions of ``state`` with a stamp below ``before`` whose writer's time is at least
        ``times[before] - size``: an earlier writer at the reader's own time is included (ties), so ``size=0``
        gives those."""
        entry = self._versions.get(state)
        if entry is None:
            return []
        stamps, values = entry
        index = bisect_left(stamps, before)
        times = self._times
        lower = times[before] - size
        first = index
        while first > 0 and times[stamps[first - 1]] >= lower:
            first -= 1
        return values[first:index]

    def final(self) -> dict[Hashable, _Value]:
        """The last version of every state written (states only read are absent)."""
        return {state: values[-1] for state, (stamps, values) in self._versions.items() if stamps}
