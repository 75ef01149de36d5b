"""Statements of this process's trees that wait in PostgreSQL for a row lock, and what PostgreSQL says blocks them:
``README.md``, "What PostgreSQL says blocks a statement".

The edges ``RowLockOwners`` registers are guesses made before a statement is sent (the row's listed holders, the
flushes locking it); PostgreSQL may answer two requests for one row in the other order, and a flush's validation may
lock a row first while a claimant waits for it.  So a statement that runs longer than :data:`CHECK_AFTER` is asked
about: one checker thread per transaction manager runs ``pg_blocking_pids`` for such statements, maps the blocking backends to
the trees whose connections they are (:meth:`ServerWaits.holding`), and registers the statement's wait for those
trees with the lock manager (``WaitKind.ROW_LOCK``), with ``on_victim``: a cycle found then, or later, through such an
edge makes the statement a victim it can be told — its statement is cancelled, and its thread raises the
``DeadlockDetected`` instead of the cancellation (:attr:`Flight.victim`).  Like PostgreSQL's own detector, which
looks after ``deadlock_timeout``, it asks nothing until a statement has waited.  A statement that waits for a backend
of no tree of this engine's makes the checker publish this engine's part of any cycle through other engines (and
search for one: ``_acrossengines``, ``README.md``, "Cycles across engines").

Thread-safety: ``ServerWaits._mutex`` (a leaf) protects the sessions, the flights and the checker; it is held while
a victim's statement is cancelled, so a cancellation never reaches a later statement of its connection: the flight
lands (and its thread goes on) only after the cancel request was delivered.  It is not held while registering or
releasing a wait with the lock manager.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
from typing import TYPE_CHECKING, Iterator

import sqlalchemy as sa

import lockmgr

from activedb import errors
from activedb.errors import TransactionAborted
from activedb.txn import _acrossengines
from activedb.txn._hooks import WaitKind

if TYPE_CHECKING:  # pragma: no cover
    from activedb.store import Catalog

#: Seconds a statement runs before PostgreSQL is asked what blocks it (a tenth of PostgreSQL's default
#: ``deadlock_timeout``: a row lock held by a flush that commits is shorter; a wait this long rarely ends soon).
CHECK_AFTER = 0.1

#: At most this many seconds between two asks about one statement: it is asked after ``CHECK_AFTER``, then after
#: twice as long each time — ``pg_blocking_pids`` takes the server's lock-manager partitions for a moment, and under
#: contention across processes many statements wait that long for rows no tree of this process holds.
MAX_INTERVAL = 1.6

#: Seconds the checker thread stays with no statement in flight before it ends (the next flight starts it again).
IDLE_EXIT = 5.0

logger = logging.getLogger("activedb.transaction")


def backend_pid(connection: sa.Connection) -> int:
    """The PostgreSQL backend process of ``connection`` (known to the driver: no round trip)."""
    return connection.connection.driver_connection.info.backend_pid  # type: ignore[union-attr, no-any-return]


class Flight:
    """One statement of ``waiter`` (a transaction id the lock manager knows) of tree ``root`` running on the backend
    ``pid`` (``driver``: its psycopg connection).  ``victim`` is the ``DeadlockDetected`` of a cycle through its wait
    once it was chosen, or a ``TransactionAborted`` once its transaction was found aborted: its statement was
    cancelled, and its thread raises ``victim`` instead of the cancellation's error.  Its fields but ``victim`` are
    the checker's (under ``ServerWaits._mutex``)."""

    __slots__ = ("waiter", "root", "pid", "driver", "due", "interval", "running", "victim", "waits", "targets",
                 "foreign")

    def __init__(self, waiter: str, root: str, pid: int, driver: object) -> None:
        self.waiter, self.root, self.pid, self.driver = waiter, root, pid, driver
        self.due = time.monotonic() + CHECK_AFTER      # when it is asked about (next)
        self.interval = CHECK_AFTER                     # doubled at each ask (``_check_while_in_flight``)
        self.running = True
        self.victim: BaseException | None = None
        self.waits: list[lockmgr.ExternalWait] | None = None   # registered by the checker
        self.targets: frozenset[str] = frozenset()               # the trees those waits are for
        self.foreign: frozenset[int] = frozenset()   # the backends blocking it at the last ask that are no tree's here


class ServerWaits:
    """The backends of the connections on which this process's trees hold row locks, and their statements in flight
    (one per transaction manager).  Thread-safe."""

    def __init__(self, catalog: "Catalog", locks: lockmgr.LockManager) -> None:
        self._catalog = catalog
        self._locks = locks
        self._mutex = threading.Lock()
        self._sessions: dict[int, str] = {}      # backend pid -> the root id of the tree holding row locks there
        self._flights: set[Flight] = set()
        self._checker: threading.Thread | None = None
        self._closed = False
        #: The checker thread's name (one per transaction manager).
        self.thread_name = f"activedb-server-waits-{id(self):x}"

    # --- sessions: which tree a backend's row locks belong to ------------------------------------------

    def hold(self, pid: int, root: str) -> None:
        """Row locks the backend ``pid`` takes from now belong to the tree ``root`` (until :meth:`let_go`)."""
        with self._mutex:
            self._sessions[pid] = root

    def let_go(self, pid: int, root: str) -> None:
        """The backend ``pid`` holds no row lock of ``root`` any more (a no-op if another tree holds it since)."""
        with self._mutex:
            if self._sessions.get(pid) == root:
                del self._sessions[pid]

    @contextlib.contextmanager
    def holding(self, connection: sa.Connection, root: str) -> Iterator[None]:
        """While the block runs, the row locks ``connection``'s backend takes are the tree ``root``'s."""
        pid = backend_pid(connection)
        self.hold(pid, root)
        try:
            yield
        finally:
            self.let_go(pid, root)

    # --- flights ---------------------------------------------------------------------------------------

    def take_off(self, waiter: str, root: str, pid: int, driver: object) -> Flight:
        """One statement of ``waiter`` (of tree ``root``) that may wait for a row lock is about to be sent on the
        backend ``pid``: asked about after :data:`CHECK_AFTER`.  Call :meth:`land` when it returned or failed (in a
        ``finally``; two calls, not a context manager: this is on every read for update's path)."""
        flight = Flight(waiter, root, pid, driver)
        with self._mutex:
            self._flights.add(flight)
            if self._checker is None and not self._closed:
                self._checker = threading.Thread(target=self._check_while_in_flight, name=self.thread_name,
                                                 daemon=True)
                self._checker.start()
        return flight

    def close(self) -> None:
        """The database closes: the checker thread ends at its next look (a statement still in flight is left to its
        own lock timeout)."""
        with self._mutex:
            self._closed = True

    def land(self, flight: Flight) -> None:
        """``flight``'s statement ended: the waits the checker registered for it are released."""
        with self._mutex:
            flight.running = False
            self._flights.discard(flight)
            waits = flight.waits
        if waits:
            for wait in waits:
                wait.release()

    @contextlib.contextmanager
    def flight(self, waiter: str, root: str, connection: sa.Connection) -> Iterator[Flight]:
        """:meth:`take_off` and :meth:`land` around a block running one statement on ``connection``."""
        flight = self.take_off(waiter, root, backend_pid(connection), connection.connection.driver_connection)
        try:
            yield flight
        finally:
            self.land(flight)

    def _tell(self, flight: Flight, error: BaseException) -> None:
        """``flight``'s wait is a deadlock's victim (``on_victim``), or its transaction was aborted: cancel its
        statement if it still runs; its thread raises ``error`` instead of the cancellation's.  Under the mutex, so
        that the cancel request has reached the server before the flight can land and its thread send another
        statement (a cancel arriving between statements is ignored by the server)."""
        with self._mutex:
            if not flight.running:
                return          # (it returned meanwhile: the wait, and with it the cycle, is over)
            flight.victim = error
            with contextlib.suppress(Exception):
                flight.driver.cancel()  # type: ignore[attr-defined]

    def _check_while_in_flight(self) -> None:
        """The checker thread: every :data:`CHECK_AFTER`, asks about the statements in flight that are due (run
        :data:`CHECK_AFTER`, then twice as long as at their last ask, up to :data:`MAX_INTERVAL`), and keeps its
        board's edges current while a statement waits for another engine's backend (:meth:`_across_engines`); ends
        after :data:`IDLE_EXIT` with none, or once closed.  It is never woken: a flight taking off only adds itself
        (waking the thread at every read for update would cost a switch of threads, and the GIL, each time)."""
        idle = 0.0
        board = _acrossengines.Board(self._catalog.engine)
        try:
            while True:
                time.sleep(CHECK_AFTER)
                with self._mutex:
                    landed = not self._flights
                    if landed or self._closed:
                        idle += CHECK_AFTER
                        if idle >= IDLE_EXIT or self._closed:
                            self._checker = None
                            return
                if landed:
                    if board.published:
                        board.close()       # (every statement landed: no edge is true any more)
                    continue
                with self._mutex:
                    idle = 0.0
                    now = time.monotonic()
                    due = [flight for flight in self._flights if flight.due <= now]
                    for flight in due:      # (asked again after twice as long: the question has a price, above)
                        flight.interval = min(2 * flight.interval, MAX_INTERVAL)
                        flight.due = now + flight.interval
                    sessions = dict(self._sessions)
                try:
                    if due:
                        self._check(due, sessions)
                    self._across_engines(board, due, sessions)
                except Exception:       # (a lost connection: the statements' own bounds remain; looked at again)
                    logger.debug("asking PostgreSQL what blocks %d statements failed", len(due), exc_info=True)
        finally:
            board.close()

    def _check(self, due: list[Flight], sessions: dict[int, str]) -> None:
        roots = set(sessions.values())
        due = [flight for flight in due if roots - {flight.root}]     # (no other tree holds a row: nothing to find)
        if not due:
            return
        connection = self._catalog.idle.take()
        try:
            blocking: dict[int, list[int] | None] = dict(connection.exec_driver_sql(
                "SELECT pid, pg_blocking_pids(pid) FROM unnest(%s::int[]) AS pid",
                ([flight.pid for flight in due],)).all())
        finally:
            self._catalog.idle.give_back(connection)
        for flight in due:
            blockers = blocking.get(flight.pid) or ()
            with self._mutex:
                flight.foreign = frozenset(pid for pid in blockers if pid not in sessions)
            trees = {sessions[pid] for pid in blockers if pid in sessions}
            new = sorted(trees - flight.targets - {flight.root, flight.waiter})
            if not new:
                continue
            try:
                wait = self._locks.add_wait(flight.waiter, new, kind=WaitKind.ROW_LOCK,
                                            on_victim=functools.partial(self._tell, flight))
            except lockmgr.Deadlock as error:
                self._tell(flight, error)
                continue
            except lockmgr.UnknownTransaction:
                continue        # (its waiter is not registered with the lock manager: no cycle runs through it)
            except lockmgr.TransactionNotActive as error:
                # Its tree was aborted (another of its nodes was a victim, its root's thread gave up) while this
                # statement waits: cancelled, the tree's row locks go now rather than when the wait ends.
                self._tell(flight, TransactionAborted(
                    f"{flight.waiter} waited in PostgreSQL for a row lock after its transaction was aborted "
                    f"({error}): its statement was cancelled; run the transaction again"))
                continue
            with self._mutex:
                if flight.running:
                    flight.waits = (flight.waits or []) + [wait]
                    flight.targets = flight.targets | set(new)
                    continue
            wait.release()      # (it landed meanwhile)

    def _across_engines(self, board: _acrossengines.Board, due: list[Flight], sessions: dict[int, str]) -> None:
        """Publish this engine's edges (``_acrossengines``) for its statements that wait for another engine's
        backend, or withdraw them once none does; then search for a cycle through each such statement due, and tell
        the one that is its victim."""
        with self._mutex:
            blocked = [flight for flight in self._flights if flight.running and flight.foreign]
        if not blocked and not board.published:
            return
        edges: set[tuple[int, int]] = set()
        if blocked and len(set(sessions.values())) > 1:     # (one tree: nothing here waits for another tree)
            waiting = _acrossengines.trees_waiting_for(self._locks.wait_for_graph(),
                                                       {flight.root for flight in blocked})
            for flight in blocked:
                trees = waiting[flight.root] | {flight.root}
                edges.update((pid, flight.pid) for pid, root in sessions.items() if root in trees and pid != flight.pid)
        board.publish(edges)
        searched = [flight for flight in due if flight in blocked and flight.pid in {target for _, target in edges}]
        if not searched:
            return      # (no tree here waits for a statement due: none of this engine's is a cycle's candidate)
        connection = self._catalog.idle.take()
        try:
            published = _acrossengines.read_published(connection)
            if board.lost(published):       # (its session ended since: its edges are published again)
                board.close()
                board.publish(edges)
                published = _acrossengines.read_published(connection)
            candidates = _acrossengines.targets_of(published)
            known: dict[int, tuple[int, ...]] = {}
            # The first flight a cycle is found from is told (a flight with none is no cycle's highest candidate:
            # another engine's search finds its victim); the other side's backends are described now, gone soon after.
            found = next(((flight, cycle) for flight in searched if flight.pid in candidates
                          if (cycle := _acrossengines.find_cycle(
                              flight.pid, published, functools.partial(_acrossengines.blocking, connection), known))
                          is not None), None)
            outside = sorted({pid for edge in found[1] for pid in edge[:2]} - set(sessions)) if found else []
            about = _acrossengines.described(connection, outside) if outside else {}
        finally:
            self._catalog.idle.give_back(connection)
        if found is None:
            return
        told, cycle = found

        def node(pid: int) -> str:      # (a tree of this engine by its id; another's backend by its pid)
            return sessions.get(pid) or f"backend {pid}"

        self._tell(told, errors.DeadlockDetected(
            told.waiter, told.waiter,
            tuple(lockmgr.WaitEdge(node(waiter), node(target), kind) for waiter, target, kind in cycle),
            "highest backend pid across engines",
            self._locks.snapshot() if self._locks.snapshot_on_deadlock else None,
            note=(f"The cycle runs through PostgreSQL's row locks and the lock managers of more than one "
                  f"process (or of this one and another client of the database): a \"row-lock\" edge is a "
                  f"statement waiting in PostgreSQL, a \"tree\" edge a tree (of this process: its id; of "
                  f"another: its backend) waiting in its process's lock manager for the tree of the statement on "
                  f"the next.  The statement of {told.waiter!r} on backend {told.pid} was cancelled."
                  + "".join(f"  Backend {pid}: {about[pid]}." for pid in sorted(about))),
            outside={node(pid): about[pid] for pid in sorted(about)}))
