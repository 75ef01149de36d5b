"""Stream lock tables (Active CEP §5.2, §5.3): :class:`S2PLLockTable` and :class:`LWMLockTable`.
The rules, the queues and whom a waiter sleeps behind: the design note
``activedb/streams/README.md``, "The lock tables".

Thread-safety: ``_mutex`` protects every queue, every request's ``held``, every owner's
``ended``/``waiters`` and the counters; it is a leaf (nothing else is taken while it is
held, and no user code runs under it).  ``Owner.wake`` is set outside it.
"""

from __future__ import annotations

import contextlib
import enum
import heapq
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Iterable

from activedb.streams._events import Punctuation, ts_less
from activedb.streams._history import Key, show_key
from activedb.txn import WaitKind
from activedb.streams.errors import SchedulerError, UnplannedAccess


class LockMode(enum.Enum):
    READ = "read"
    WRITE = "write"

    def covers(self, other: "LockMode") -> bool:
        return self is LockMode.WRITE or other is LockMode.READ


@dataclass(eq=False, slots=True)
class Owner:
    """One s-transaction as the lock table sees it: its stamp and whether it ended.

    ``node`` is the activedb (sub)transaction running it (the target of wait-for edges);
    ``victim`` is set if the lock manager chose it as a deadlock victim while it waited."""

    position: int
    ts: Any
    name: str
    node: Any = None
    # Invariant: ended only moves False -> True, under the table's _mutex; then waiters is empty.
    ended: bool = False
    # Its requests are gone (at its end, or earlier: StreamLockTable.release); ended implies released.
    released: bool = False
    waiters: list[Owner] = field(default_factory=list)
    wake: threading.Event = field(default_factory=threading.Event)
    victim: BaseException | None = None
    requests: dict[tuple[str, Key | None], Request] = field(default_factory=dict)

    def __repr__(self) -> str:
        return f"<Owner {self.name} @{self.position}{' ended' if self.ended else ''}>"


@dataclass(eq=False)
class Request:
    """A lock request of ``owner`` on ``table`` (``key`` None: the whole table)."""

    owner: Owner
    table: str
    key: Key | None
    mode: LockMode
    held: bool = False           # granted to an operation of its owner at least once

    def describe(self) -> str:
        letter = "xl" if self.mode is LockMode.WRITE else "sl"
        target = self.table if self.key is None else f"{self.table}[{show_key(self.key)}]"
        return f"{letter}_{self.owner.name}({target})"


@dataclass(eq=False, slots=True)
class _Queue:
    """A min-heap of (position, serial, owner); released owners are dropped lazily."""

    heap: list[tuple[int, int, Owner]] = field(default_factory=list)

    def push(self, owner: Owner, serial: int) -> None:
        heapq.heappush(self.heap, (owner.position, serial, owner))

    def first(self) -> Owner | None:
        """The earliest owner whose requests are not released.  Caller holds the table's mutex."""
        heap = self.heap
        while heap and heap[0][2].released:
            heapq.heappop(heap)
        return heap[0][2] if heap else None


def _latest_before(position: int, queues: Iterable[_Queue | None]) -> Owner | None:
    """The latest owner before ``position`` not released (a scan: only for a waiter)."""
    best: Owner | None = None
    for queue in queues:
        if queue is None:
            continue
        for entry_position, _, owner in queue.heap:
            if entry_position < position and not owner.released and (best is None or entry_position > best.position):
                best = owner
    return best


def _earliest_before(position: int, queues: Iterable[_Queue | None]) -> Owner | None:
    best: Owner | None = None
    for queue in queues:
        if queue is None:
            continue
        owner = queue.first()
        if owner is not None and owner.position < position and (best is None or owner.position < best.position):
            best = owner
    return best


@dataclass
class _Table:
    """The queues of one table (the design note's "The lock tables")."""

    table_reads: _Queue = field(default_factory=_Queue)
    table_writes: _Queue = field(default_factory=_Queue)
    tuple_reads: defaultdict[Key, _Queue] = field(default_factory=lambda: defaultdict(_Queue))
    tuple_writes: defaultdict[Key, _Queue] = field(default_factory=lambda: defaultdict(_Queue))
    any_tuple_reads: _Queue = field(default_factory=_Queue)
    any_tuple_writes: _Queue = field(default_factory=_Queue)
    requests: list[Request] = field(default_factory=list)     # every request, in insertion order

    def writes_on(self, key: Key | None) -> tuple[_Queue | None, ...]:
        """The write queues overlapping a request on ``key`` (None: the whole table)."""
        return self.table_writes, self.any_tuple_writes if key is None else self.tuple_writes.get(key)

    def reads_on(self, key: Key | None) -> tuple[_Queue | None, ...]:
        return self.table_reads, self.any_tuple_reads if key is None else self.tuple_reads.get(key)


@dataclass(frozen=True)
class LockTableStatistics:
    """Counters of one lock table (one batch).  Immutable."""

    requests: int                 # lock requests inserted (read + write)
    write_requests: int
    grants: int                   # operations granted (an owner's request may be used several times)
    waits: int                    # operations that had to wait for an earlier owner
    punctuation_waits: int        # LWM reads/writes that waited for a punctuation
    waiting: int                  # waiting right now
    wait_seconds: float           # time spent waiting (lock and order waits), summed over the waiters


@dataclass(frozen=True)
class Wait:
    """Who waits right now, for what and behind whom (``blocker`` None: the punctuation)."""

    waiter: str
    request: str
    blocker: str | None


WaitingContext = Callable[[Owner, Owner, Request], ContextManager[object]]


def _no_registration(owner: Owner, blocker: Owner, request: Request) -> ContextManager[object]:
    return contextlib.nullcontext()


class StreamLockTable:
    """What S2PL and LWM share: insertion by the dispatcher, waiting, ending.  Subclasses
    say which earlier owner blocks a request (:meth:`blocker`)."""

    kind = WaitKind.STREAM
    #: S2PL's queues are first-come-first-served: requests must arrive in the declared order.
    #: LWM may take them in arrival order with punctuations (App. F).
    ordered_insertion = True

    def __init__(self, waiting: WaitingContext = _no_registration):
        #: How a wait becomes an edge of the wait-for graph (the scheduler's ``db.transactions.waiting``).
        self.waiting = waiting
        self._mutex = threading.Lock()
        self._tables: dict[str, _Table] = {}
        self._serial = 0
        self._last_position: int | None = None
        self._waiting: dict[Owner, tuple[Request | None, Owner | None]] = {}
        self._gated: list[Owner] = []        # owners waiting for a punctuation (LWM)
        # The counters of LockTableStatistics (all but ``waiting``, which is len(_waiting)).
        self._counts: dict[str, float] = Counter(  # type: ignore[call-overload]  # (wait_seconds: a float)
            requests=0, write_requests=0, grants=0, waits=0, punctuation_waits=0, wait_seconds=0.0)

    # --- the dispatcher ---------------------------------------------------------------------

    def insert(self, owner: Owner, resources: Iterable[tuple[str, Key | None, LockMode]]) -> None:
        """Insert ``owner``'s requests (one per resource, the strongest mode asked).
        Precondition: an owner's requests are inserted before it runs; S2PL: owners in
        increasing position (LWM: any order, a punctuation published once every owner
        older than it is in)."""
        merged: dict[tuple[str, Key | None], LockMode] = {}
        for table, key, mode in resources:
            previous = merged.get((table, key))
            merged[(table, key)] = mode if previous is None or mode is LockMode.WRITE else previous
        with self._mutex:
            if self.ordered_insertion and self._last_position is not None and owner.position <= self._last_position:
                raise SchedulerError(f"lock requests of {owner.name} inserted after a later s-transaction's; "
                                     f"{type(self).__name__} needs them in the declared order (use a reorder buffer "
                                     f"in front of it, Active CEP App. F)")
            self._last_position = owner.position
            for (table, key), mode in merged.items():
                request = Request(owner, table, key, mode)
                owner.requests[(table, key)] = request
                entry = self._tables.setdefault(table, _Table())
                entry.requests.append(request)
                self._enqueue(entry, request)
                self._counts["requests"] += 1
                if mode is LockMode.WRITE:
                    self._counts["write_requests"] += 1

    def _enqueue(self, table: _Table, request: Request) -> None:
        """Push ``request`` onto the heaps of ``table`` it belongs to.  Caller holds ``_mutex``."""
        self._serial += 1
        serial, owner, key = self._serial, request.owner, request.key
        write = request.mode is LockMode.WRITE
        if key is None:
            (table.table_writes if write else table.table_reads).push(owner, serial)
        else:
            (table.tuple_writes if write else table.tuple_reads)[key].push(owner, serial)
            (table.any_tuple_writes if write else table.any_tuple_reads).push(owner, serial)

    # --- the workers ------------------------------------------------------------------------

    def request_for(self, owner: Owner, table: str, key: Key | None, mode: LockMode) -> Request:
        """The request of ``owner`` that covers an operation on ``(table, key)`` in ``mode``."""
        requests = owner.requests
        for candidate in ((table, key), (table, None)) if key is not None else ((table, None),):
            request = requests.get(candidate)
            if request is not None and request.mode.covers(mode):
                return request
        target = table if key is None else f"{table}[{show_key(key)}]"
        planned = ", ".join(request.describe() for request in requests.values()) or "none"
        raise UnplannedAccess(
            f"s-transaction {owner.name} {'reads' if mode is LockMode.READ else 'writes'} {target}, which its access "
            f"plan (Algorithm 1) did not lock (its locks: {planned}); a rule must declare every table it touches "
            f"(reads=[…], writes=[…])")

    def acquire(self, owner: Owner, table: str, key: Key | None, mode: LockMode) -> Request:
        """Block until the operation of ``owner`` on ``(table, key)`` in ``mode`` may run.
        Called on the thread running ``owner``; raises the deadlock error if it was chosen
        as a victim while it waited (cannot happen by construction, see the design note)."""
        request = self.request_for(owner, table, key, mode)
        while True:
            with self._mutex:
                if owner.victim is not None:
                    raise owner.victim
                blocker, gated = self.blocker(request, mode)
                if blocker is None and not gated:
                    request.held = True
                    self._counts["grants"] += 1
                    return request
                owner.wake.clear()
                if blocker is not None:
                    blocker = self.wait_target(request, blocker)
                    blocker.waiters.append(owner)
                    self._counts["waits"] += 1
                else:
                    self._counts["punctuation_waits"] += 1
                    self._gated.append(owner)
                self._waiting[owner] = (request, blocker)
            self._sleep(owner, blocker, request)

    def wait_for(self, owner: Owner, blocker: Owner, why: Request | None = None, *,
                 ready: Callable[[], bool] | None = None) -> None:
        """Block until ``blocker`` ended — or until ``ready()`` (evaluated under the mutex; it
        turns true when ``blocker`` publishes partition states, :meth:`matched`) — an order
        dependency that is not a lock (the matcher state of a partition); registered like a lock wait."""
        while True:
            with self._mutex:
                if owner.victim is not None:
                    raise owner.victim
                if blocker.ended or (ready is not None and ready()):
                    return
                owner.wake.clear()
                blocker.waiters.append(owner)
                self._waiting[owner] = (why, blocker)
            self._sleep(owner, blocker, why)

    def _sleep(self, owner: Owner, blocker: Owner | None, why: Request | None) -> None:
        """Wait until ``owner`` is woken: an edge to ``blocker`` of the wait-for graph (None: the
        punctuation, no edge).  Caller registered the wait in ``_waiting``; this ends it."""
        started = time.perf_counter()
        try:
            with self.waiting(owner, blocker, why) if blocker is not None else contextlib.nullcontext():  # type: ignore[arg-type]
                owner.wake.wait()
        finally:
            with self._mutex:
                self._waiting.pop(owner, None)
                self._counts["wait_seconds"] += time.perf_counter() - started

    def matched(self, owner: Owner) -> None:
        """``owner`` published partition states: wake its order waiters (no request) to look again; its locks stay."""
        with self._mutex:
            woken = [waiter for waiter in owner.waiters if self._waiting.get(waiter, (None, None))[0] is None]
            owner.waiters = [waiter for waiter in owner.waiters if waiter not in woken]
        for waiter in woken:
            waiter.wake.set()

    def release(self, owner: Owner) -> None:
        """``owner``'s requests disappear before it ends: wake its lock waiters, not its order waiters."""
        with self._mutex:
            owner.released = True
            woken = [waiter for waiter in owner.waiters if self._waiting.get(waiter, (None, None))[0] is not None]
            owner.waiters = [waiter for waiter in owner.waiters if waiter not in woken]
        for waiter in woken:
            waiter.wake.set()

    def reinstate(self, owner: Owner) -> None:
        """``owner`` released its requests early and is run again (LWM: its attempt was matched on a state or a
        version that was withdrawn): they are back, as at dispatch, before it undoes anything.  Caller: the
        owner's thread; it has not ended."""
        with self._mutex:
            if owner.ended or not owner.released:
                return
            owner.released = False
            for request in owner.requests.values():
                self._enqueue(self._tables[request.table], request)

    def granted(self, owner: Owner, table: str, key: Key | None, mode: LockMode) -> bool:
        """Whether an operation of ``owner`` on ``(table, key)`` in ``mode`` may run right now (its request is
        still grantable: an earlier owner's requests were not reinstated since it was granted)."""
        request = self.request_for(owner, table, key, mode)
        with self._mutex:
            blocker, gated = self.blocker(request, mode)
            return blocker is None and not gated

    def end(self, owner: Owner) -> None:
        """``owner`` committed or aborted: its requests disappear; wake who waited for it."""
        with self._mutex:
            owner.ended = owner.released = True
            waiters, owner.waiters = owner.waiters, []
        for waiter in waiters:
            waiter.wake.set()

    def make_victim(self, owner: Owner, error: BaseException) -> None:
        """The lock manager chose ``owner`` as a deadlock victim while it waited: wake it."""
        with self._mutex:
            owner.victim = error
        owner.wake.set()

    # --- the rule --------------------------------------------------------------------------

    def blocker(self, request: Request, mode: LockMode) -> tuple[Owner | None, bool]:
        """``(earliest owner whose end the operation must wait for, held back by the
        punctuation)``; ``(None, False)``: grant.  Caller holds ``_mutex``."""
        raise NotImplementedError

    def _queues(self, request: Request) -> tuple[_Queue | None, ...]:
        """The queues whose earlier requests block ``request``.  Caller holds ``_mutex``."""
        raise NotImplementedError

    def wait_target(self, request: Request, blocker: Owner) -> Owner:
        """Whose end a waiter blocked by ``blocker`` (what :meth:`blocker` named) sleeps until:
        the *latest* earlier owner on :meth:`_queues` (the design note's "The lock tables"), or
        ``blocker`` itself under a subclass's rule of its own.  Caller holds ``_mutex``."""
        if type(self).blocker not in _OWN_RULES:
            return blocker
        return _latest_before(request.owner.position, self._queues(request)) or blocker

    # --- inspection -------------------------------------------------------------------------

    def blocking(self, request: Request) -> Owner | None:
        """The owner whose end ``request`` (in its own mode) would wait for right now."""
        with self._mutex:
            return self.blocker(request, request.mode)[0]

    def requests(self, table: str) -> list[Request]:
        """Every request on ``table``, in insertion order (for tests and tools)."""
        with self._mutex:
            entry = self._tables.get(table)
            return list(entry.requests) if entry is not None else []

    def waits(self) -> list[Wait]:
        with self._mutex:
            return [Wait(owner.name, request.describe() if request is not None else "(order)",
                         blocker.name if blocker is not None else None)
                    for owner, (request, blocker) in self._waiting.items()]

    def statistics(self) -> LockTableStatistics:
        with self._mutex:
            return LockTableStatistics(waiting=len(self._waiting), **self._counts)  # type: ignore[arg-type]


class S2PLLockTable(StreamLockTable):
    """Active CEP §5.2 with timestamp-ordered queues and no overtaking (the design note)."""

    kind = WaitKind.STREAM_S2PL

    def _queues(self, request: Request) -> tuple[_Queue | None, ...]:
        table = self._tables[request.table]
        writes = table.writes_on(request.key)
        return writes + table.reads_on(request.key) if request.mode is LockMode.WRITE else writes

    def blocker(self, request: Request, mode: LockMode) -> tuple[Owner | None, bool]:
        return _earliest_before(request.owner.position, self._queues(request)), False


class LWMLockTable(StreamLockTable):
    """Active CEP §5.3 / Algorithm 2 with App. F's punctuation guard (the design note)."""

    kind = WaitKind.STREAM_LWM
    ordered_insertion = False

    def __init__(self, waiting: WaitingContext = _no_registration):
        super().__init__(waiting)
        # The most recent punctuation the dispatcher published (None: none yet, which holds nothing
        # back: an engine whose input is ordered needs none).
        self.mrp: Punctuation | None = None

    def publish(self, punctuation: Punctuation) -> None:
        """The dispatcher inserted the locks of every event older than ``punctuation``."""
        with self._mutex:
            if self.mrp is None or ts_less(self.mrp, punctuation):
                self.mrp = punctuation
            gated, self._gated = self._gated, []
        for owner in gated:
            owner.wake.set()

    def lwm(self, table: str, key: Key | None = None) -> Owner | None:
        """The owner of the oldest write lock a request on ``(table, key)`` must respect
        (None: no write lock, lwm = +∞) — for tests and tools."""
        with self._mutex:
            entry = self._tables.get(table)
            return None if entry is None else _earliest_before(float("inf"), entry.writes_on(key))  # type: ignore

    def _queues(self, request: Request) -> tuple[_Queue | None, ...]:
        return self._tables[request.table].writes_on(request.key)

    def blocker(self, request: Request, mode: LockMode) -> tuple[Owner | None, bool]:
        owner = request.owner
        # Reads and writes alike: every earlier write lock on an overlapping resource is gone
        # (a Read at s <= lwm; a Write whose lock is the oldest, s = lwm).  Reads never block.
        blocker = _earliest_before(owner.position, self._queues(request))
        mrp = self.mrp
        gated = blocker is None and mrp is not None and ts_less(mrp, owner.ts)
        return blocker, gated


_OWN_RULES = (S2PLLockTable.blocker, LWMLockTable.blocker)
