"""Deferred firings executed in cycles just before a transaction commits (*Concurrent Rule Execution* §2.1,
§3.3.2): :class:`DeferredQueue`.  Who owns a queue, the cycles and the states: ``coupling/README.md``,
"Deferred cycles".
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

from ._priority import priority_groups
from .errors import DeferredCycleLimitExceeded, DeferredQueueClosed, InvalidArgument

Firing = TypeVar("Firing")

DEFAULT_MAX_CYCLES = 100


class QueueState(enum.Enum):
    """COLLECTING (the owner runs; firings go to cycle 0) -> DRAINING (cycles run) -> CLOSED."""

    COLLECTING = "collecting"
    DRAINING = "draining"
    CLOSED = "closed"


# (Module constants: CPython 3.11 looks an Enum class's attributes up on a slow path, ``EnumType.__getattr__``.)
_COLLECTING, _DRAINING, _CLOSED = QueueState.COLLECTING, QueueState.DRAINING, QueueState.CLOSED


@dataclass(frozen=True)
class DeferredFiring(Generic[Firing]):
    """A firing as handed out by :meth:`DeferredQueue.drain`: the firing, its cycle, its position in it."""

    firing: Firing
    cycle: int
    position: int


@dataclass(frozen=True)
class DeferredCycle(Generic[Firing]):
    """One cycle: its number (0, 1, ...) and its firings in the order they were added."""

    number: int
    firings: tuple[Firing, ...]

    def groups(self, key: Callable[[Firing], float | None] | None = None) -> list[list[Firing]]:
        """The cycle's firings as :func:`coupling.priority_groups` (highest priority first)."""
        return priority_groups(self.firings, key=key)

    def __iter__(self) -> Iterator[DeferredFiring[Firing]]:
        for position, firing in enumerate(self.firings):
            yield DeferredFiring(firing, self.number, position)

    def __len__(self) -> int:
        return len(self.firings)


@dataclass(frozen=True)
class DeferredQueueStatistics:
    state: QueueState
    current_cycle: int | None  # the cycle being run, None before the first one
    pending: int  # firings waiting for the next cycle
    added: int  # firings added in total
    cycles_run: int  # cycles handed out so far


class DeferredQueue(Generic[Firing]):
    """The deferred firings of one transaction, handed out in cycles (design note, "Deferred cycles").

    ``max_cycles`` (>= 1) bounds the cycles against deferred rules that keep re-firing each other.
    Thread-safe (one mutex, no user code called under it): ``add`` may be called concurrently by the
    firings of the running cycle; ask for the next cycle only after every firing of the current one has
    finished (axiom 28).
    """

    def __init__(self, *, max_cycles: int = DEFAULT_MAX_CYCLES, name: str | None = None) -> None:
        if isinstance(max_cycles, bool) or not isinstance(max_cycles, int) or max_cycles < 1:
            raise InvalidArgument(f"max_cycles must be an int >= 1, not {max_cycles!r}")
        self.max_cycles = max_cycles
        self.name = name
        self._mutex = threading.Lock()  # protects every field below
        self._state = _COLLECTING
        # Invariant: _current_cycle is None iff no cycle has been handed out yet.
        self._current_cycle: int | None = None
        # Invariant: every pending firing runs in cycle (_current_cycle + 1), or 0 when it is None.
        self._pending: list[Firing] = []
        self._added = 0
        self._cycles_run = 0

    def __repr__(self) -> str:
        name = f" {self.name!r}" if self.name else ""
        return f"<DeferredQueue{name} {self._state.value} cycle={self._current_cycle} pending={len(self._pending)}>"

    @property
    def state(self) -> QueueState:
        with self._mutex:
            return self._state

    @property
    def current_cycle(self) -> int | None:
        """The number of the cycle being run, ``None`` before the first one."""
        with self._mutex:
            return self._current_cycle

    def add(self, firing: Firing) -> int:
        """Queue ``firing``; return the number of the cycle it will run in (0 before the cycles start, k+1
        while cycle k runs).  Raises :class:`~coupling.errors.DeferredQueueClosed` once the queue is CLOSED."""
        with self._mutex:
            if self._state is _CLOSED:
                raise DeferredQueueClosed(f"cannot defer {firing!r}: {self!r} already ran its deferred cycles (or was "
                                          "discarded), so its transaction is committing or has ended. Fire the rule "
                                          "before the owner starts committing, or use another coupling mode.")
            self._pending.append(firing)
            self._added += 1
            return 0 if self._current_cycle is None else self._current_cycle + 1

    def next_cycle(self) -> DeferredCycle[Firing] | None:
        """Hand out the next cycle (-> DRAINING), or ``None`` and CLOSED when nothing is pending (CLOSED
        too when the cycle limit is exceeded).  Precondition: every firing of the previous cycle has finished."""
        with self._mutex:
            if self._state is _CLOSED:
                raise DeferredQueueClosed(f"{self!r} is closed; it has no further cycles")
            if not self._pending:
                self._state = _CLOSED
                return None
            number = 0 if self._current_cycle is None else self._current_cycle + 1
            if number >= self.max_cycles:
                self._state = _CLOSED
                pending, self._pending = self._pending, []
                raise DeferredCycleLimitExceeded(self.max_cycles, pending, self.name)
            cycle = DeferredCycle(number, tuple(self._pending))
            self._pending = []
            self._state = _DRAINING
            self._current_cycle = number
            self._cycles_run += 1
            return cycle

    def cycles(self) -> Iterator[DeferredCycle[Firing]]:
        """Iterate :meth:`next_cycle` until the queue is empty (then CLOSED); the next cycle is requested
        when the loop body has finished, so run the whole cycle inside it."""
        while (cycle := self.next_cycle()) is not None:
            yield cycle

    def drain(self) -> Iterator[DeferredFiring[Firing]]:
        """Iterate the firings one by one, cycle after cycle (for sequential execution); firings added
        while cycle k's firings are being iterated form cycle k+1."""
        for cycle in self.cycles():
            yield from cycle

    def discard(self) -> tuple[Firing, ...]:
        """Close the queue without running what is pending (the owner aborted); return the dropped firings."""
        with self._mutex:
            dropped, self._pending = tuple(self._pending), []
            self._state = _CLOSED
            return dropped

    def statistics(self) -> DeferredQueueStatistics:
        with self._mutex:
            return DeferredQueueStatistics(state=self._state,
                                           current_cycle=self._current_cycle,
                                           pending=len(self._pending),
                                           added=self._added,
                                           cycles_run=self._cycles_run)
