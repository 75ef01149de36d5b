"""Rows read for update (``tx.read(table, key, for_update=True)``), locked ``FOR UPDATE`` in PostgreSQL on a
connection the tree keeps until its flush, which runs in that same transaction: ``README.md``, "Reads for
update (hot keys)" (the UPDATE mode, the bounded lock wait, the trees that flush at SERIALIZABLE) and "A PostgreSQL
row wait is an edge of the wait-for graph" (``RowLockOwners``, :func:`row_lock_wait`).

Thread-safety: ``_mutex`` protects the connection, ``rows`` and whose statement runs; it is held while a statement runs
on the connection (a connection runs one statement at a time), and while holding it only ``ServerWaits``' mutex (a
leaf) is taken — the statement's flight, the backend's listing — and a landed flight's waits released in the lock
manager (whose mutexes never take activedb's).  A node that finds it held registers its wait for the node whose
statement runs (:meth:`RowLocks._wait_for_turn`).  :class:`RowLockOwners`' ``_mutex`` is a leaf too.
"""

from __future__ import annotations

import contextlib
import threading
from typing import TYPE_CHECKING, AbstractSet, Collection, Iterable, Iterator, Literal, overload

import sqlalchemy as sa

import lockmgr

from activedb.errors import LOCK_NOT_AVAILABLE, Failure, SerializationConflict, classify
from activedb.store import IsolationLevel, lock_row
from activedb.txn import _help_edges
from activedb.txn._hooks import WaitKind
from activedb.txn._participants import CommitParticipant
from activedb.txn._serverwaits import backend_pid

if TYPE_CHECKING:  # pragma: no cover
    from activedb.store import Key, TableInfo
    from activedb.txn._serverwaits import Flight
    from activedb.txn._tree import Transaction

#: How long a read for update waits for another process's row lock before giving up (a retryable conflict).
LOCK_TIMEOUT = "10s"

#: How long :meth:`RowLocks.abandon` waits for a cancelled statement's thread to let go of the connection.
ABANDON_WAIT_SECONDS = 5.0




class RowLockOwners:
    """Which trees of this process hold (or are about to lock) which rows ``FOR UPDATE`` in PostgreSQL (their
    :class:`RowLocks`), so that a read for update (:meth:`claim`) or a flush about to lock rows ``FOR SHARE`` (or ``FOR
    UPDATE``, :meth:`validating`) says to the lock manager that it waits for those trees.  Without it a cycle
    through both lock systems is seen by neither detector: tree B holds an UPDATE lock (which admits readers) and the
    row in PostgreSQL, and waits in the lock manager to write it for tree A, which read the row; A's flush waits in
    PostgreSQL for B's row lock — each detector sees one edge.  With it the lock manager sees both and makes one of
    them the deadlock's victim.  One per transaction manager; thread-safe."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._owners: dict[tuple[str, "Key"], set[str]] = {}
        #: The rows flushes' validating statements are locking -> those flushes' roots, and per such flush the waits
        #: trees that claimed one of its rows meanwhile registered for it (:meth:`validating`).
        self._validating: dict[tuple[str, "Key"], set[str]] = {}
        self._for_validators: dict[str, list["lockmgr.ExternalWait"]] = {}

    def claim(self, row: tuple[str, "Key"], root: str) -> tuple[list[str], list[str]]:
        """List ``root`` as holding ``row`` — before its ``SELECT … FOR UPDATE`` is sent, so that a flush looking
        meanwhile sees it — and return the other trees listed for the row (the ones it may wait for) and the
        flushes locking it now (which may wait for it: :meth:`wait_for_claimant`)."""
        with self._mutex:
            owners = self._owners.setdefault(row, set())
            owners.add(root)
            return sorted(owners - {root}), sorted(self._validating.get(row, set()) - {root})

    def discard(self, rows: Iterable[tuple[str, "Key"]], root: str) -> None:
        with self._mutex:
            for row in rows:
                owners = self._owners.get(row)
                if owners is not None:
                    owners.discard(root)
                    if not owners:
                        del self._owners[row]

    @contextlib.contextmanager
    def validating(self, root: "Transaction", rows: AbstractSet[tuple[str, "Key"]], tables: Collection[str],
                   connection: sa.Connection) -> Iterator["Flight"]:
        """While ``root``'s flush runs a statement locking ``rows`` (or rows of ``tables``): its wait for the trees
        holding them is registered (:func:`row_lock_wait`; ``DeadlockDetected`` if that closes a cycle), and a tree
        that claims one of ``rows`` meanwhile registers the flush's wait for it too, since its lock may come first
        (:meth:`wait_for_claimant`).  The flush lists its rows and looks the holders up in one step under the mutex,
        as a claim lists and looks: of a claim and a flush on one row, the later sees the earlier.  The statement on
        ``connection`` is a flight (``ServerWaits.flight``): if it is a deadlock's victim, its caller raises
        ``flight.victim`` instead of the cancelled statement's error (and this raises it if the statement returned
        all the same)."""
        with self._mutex:
            if tables or len(self._owners) < len(rows):      # (walk the smaller side)
                found = {owner for row, owners in self._owners.items() if row in rows or row[0] in tables
                         for owner in owners}
            else:
                found = {owner for row in rows for owner in self._owners.get(row, ())}
            for row in rows:
                self._validating.setdefault(row, set()).add(root.id)
            self._for_validators[root.id] = []
        waiting = None
        try:
            waiting = row_lock_wait(root, sorted(found - {root.id}))
            with root.manager.server_waits.flight(root.id, root.id, connection) as flight:
                yield flight
            if flight.victim is not None:
                raise flight.victim     # (told as its statement returned: a victim all the same; the flush rolls back)
        finally:
            if waiting is not None:
                waiting.release()
            with self._mutex:
                for row in rows:
                    validators = self._validating[row]
                    validators.discard(root.id)
                    if not validators:
                        del self._validating[row]
                registered = self._for_validators.pop(root.id)
            for wait in registered:
                wait.release()

    def wait_for_claimant(self, validator: str, root: "Transaction") -> None:
        """The flush of ``validator`` is locking a row ``root``'s tree has just claimed: register the flush's wait for
        the tree (released with the flush's own, :meth:`validating`).  Raises ``DeadlockDetected`` if that closes a
        cycle and the flush is the victim: the claim gives up instead (the flush cannot be told, and without the
        claimant's row lock it does not wait for the tree)."""
        try:
            wait = root.manager.locks.add_wait(validator, [root.id], kind=WaitKind.ROW_LOCK)
        except lockmgr.TransactionNotActive:
            return              # (the flush's tree ended meanwhile)
        with self._mutex:
            registered = self._for_validators.get(validator)
            if registered is not None:
                registered.append(wait)
                return
        wait.release()          # (its statement ended meanwhile)


def row_lock_wait(node: "Transaction", targets: list[str]) -> "lockmgr.ExternalWait | None":
    """Register that ``node`` waits in PostgreSQL for the trees ``targets`` (``WaitKind.ROW_LOCK``; None: no target),
    as the lock manager's transaction that is blocked: ``node`` itself, or for a lazy node the ancestor its locks are
    granted to.  Its holds stay holds: the wait is inside one of its operations, which its descendants must not
    interleave with (unlike ``TransactionManager.waiting``).  Raises ``DeadlockDetected`` if the wait closes a cycle
    and ``node`` is its victim."""
    if not targets:
        return None
    _help_edges.flush()         # (edges of children this thread helps: before its own)
    try:
        return node.manager.locks.add_wait(blocked_id(node), targets, kind=WaitKind.ROW_LOCK)
    except lockmgr.TransactionNotActive:
        return None             # (an ancestor's abort reached the lock manager first: it learns of it after the wait)


def blocked_id(node: "Transaction") -> str:
    """The id of the lock manager's transaction that is blocked while ``node`` waits in PostgreSQL: ``node``, or for a
    lazy node the ancestor its locks are granted to."""
    while node._lazy:
        node = node.parent  # type: ignore[assignment]  # (a lazy node has a parent)
    return node.id


class _Slot:
    """``root._slot(_Slot)``: the tree's session, created once under ``mutex``."""

    def __init__(self) -> None:
        self.mutex = threading.Lock()
        self.session: RowLocks | None = None


class RowLocks(CommitParticipant):
    """The PostgreSQL row locks of one tree (a commit participant of its root).  Thread-safe."""

    def __init__(self, root: "Transaction"):
        self._root = root
        self._mutex = threading.Lock()          # protects connection, _transaction, rows
        self.connection: sa.Connection | None = None
        self._transaction: sa.RootTransaction | None = None
        self._pid: int | None = None            # the connection's backend, listed as the tree's (``ServerWaits``)
        self._driver: object = None             # the connection's psycopg connection (a victim's statement is cancelled)
        self._flying: str | None = None         # whose statement runs now (``blocked_id``; set under ``_mutex``)
        #: (table, key) of every row this tree holds ``FOR UPDATE`` -> its committed image when it was locked (which
        #: it still is: the flush compares the images the tree relied on with these).
        self.rows: dict[tuple[str, "Key"], dict[str, object] | None] = {}

    @overload
    @classmethod
    def of(cls, root: "Transaction", *, create: Literal[True] = True) -> "RowLocks": ...
    @overload
    @classmethod
    def of(cls, root: "Transaction", *, create: bool) -> "RowLocks | None": ...

    @classmethod
    def of(cls, root: "Transaction", *, create: bool = True) -> "RowLocks | None":
        slot = root._slot(_Slot, create=create)
        if slot is None:
            return None
        session = slot.session          # set once, never unset: no mutex needed to find it
        if session is not None:
            return session
        with slot.mutex:
            if slot.session is None and create:
                session = cls(root)
                root._enlist(session)
                slot.session = session
            return slot.session

    def lock(self, node: "Transaction", info: "TableInfo", key: "Key") -> dict[str, object] | None:
        """The committed image of row ``key``, locked ``FOR UPDATE`` until the tree ends (None: no row), for
        ``node``'s read.  The tree is listed as the row's holder first (``RowLockOwners.claim``); if other trees of
        the process are listed, ``node``'s wait for them in PostgreSQL is registered while the statement runs
        (:func:`row_lock_wait`), so a cycle through the lock manager is found when it forms (``DeadlockDetected``
        here, or for another tree's request).  If the statement fails, the transaction and every row lock of the tree
        go: the tree holds no row any more (its flush validates them as rows read plainly)."""
        row = (info.name, key)
        manager = self._root.manager
        owners = manager.row_lock_owners
        unlisted: set[tuple[str, "Key"]] = set() if row in self.rows else {row}   # (unlisted again if this fails)
        waiting = None
        try:
            # The edges of children this thread helps, before the statement: it may wait in PostgreSQL, and the edges
            # the checker finds then (``ServerWaits``) are registered from another thread, which cannot flush them.
            _help_edges.flush()
            holders, validators = owners.claim(row, self._root.id)
            for validator in validators:
                owners.wait_for_claimant(validator, self._root)
            waiting = row_lock_wait(node, holders)
            waiter = blocked_id(node)
            if not self._mutex.acquire(blocking=False):
                self._wait_for_turn(waiter)
            try:
                flight: Flight | None = None
                try:
                    begin = None
                    if self.connection is None:
                        self._open()
                        begin = IsolationLevel.READ_COMMITTED   # the BEGIN rides with the first row's SELECT
                    self._flying = waiter
                    flight = manager.server_waits.take_off(waiter, self._root.id, self._pid,  # type: ignore[arg-type]
                                                           self._driver)
                    try:
                        image = lock_row(self.connection, info, key,  # type: ignore[arg-type]  # (opened above)
                                         lock_timeout=LOCK_TIMEOUT, begin=begin)
                    finally:
                        manager.server_waits.land(flight)
                except sa.exc.DBAPIError as error:
                    self._close()               # the transaction failed: its locks go with it
                    unlisted, self.rows = unlisted | self.rows.keys(), {}
                    if flight is not None and flight.victim is not None:
                        raise flight.victim from None   # (cancelled: a deadlock's victim, or its tree aborted)
                    sqlstate = getattr(error.orig, "sqlstate", None)
                    if (sqlstate == LOCK_NOT_AVAILABLE
                            or classify(error) in (Failure.SERIALIZATION_CONFLICT, Failure.DEADLOCK)):
                        raise SerializationConflict(
                            f"row {key!r} of {info.name!r} stayed locked by another transaction (SQLSTATE {sqlstate}); "
                            f"nothing was written — re-run the transaction (Database.run(fn) does)") from None
                    raise self._root.manager.catalog.database_failure(
                        error, f"locking row {key!r} of {info.name!r}") from error
                if flight.victim is not None:   # (told as its statement returned: a victim all the same)
                    self._close()
                    unlisted, self.rows = unlisted | self.rows.keys(), {}
                    raise flight.victim
                self.rows[row] = image
                unlisted = set()
            finally:
                self._flying = None
                self._mutex.release()
            return image
        finally:
            if waiting is not None:
                waiting.release()
            if unlisted:        # (after ``_mutex``: the owners' mutex is a leaf, taken under no other)
                owners.discard(unlisted, self._root.id)

    def _wait_for_turn(self, waiter: str) -> None:
        """Take ``_mutex``, which another node's statement holds, for a statement of ``waiter`` (``blocked_id``).  That
        statement may wait in PostgreSQL: ``waiter`` waits for its node meanwhile, and says so to the lock manager
        (``WaitKind.ROW_LOCK``) — a cycle through the statement's wait (a guess, or what PostgreSQL named:
        ``ServerWaits``) runs through ``waiter`` too, which may hold what another tree of the cycle waits for."""
        waiting = None
        flying = self._flying       # (read unlocked: a wait registered for a statement that just ended is released
        if flying is not None:      # at once below, when the turn comes)
            with contextlib.suppress(lockmgr.TransactionNotActive, lockmgr.WaitForItself):
                waiting = self._root.manager.locks.add_wait(waiter, [flying], kind=WaitKind.ROW_LOCK)
        try:
            self._mutex.acquire()
        finally:
            if waiting is not None:
                waiting.release()

    def _open(self) -> None:
        """Caller holds ``_mutex``.  The connection is in autocommit at the driver (``Catalog.idle``), so that
        the first row's ``SELECT … FOR UPDATE`` opens the transaction in its own round trip
        (``lock_row(begin=…)``); every later statement runs in that open transaction, and ``commit``/``rollback``
        end it as usual."""
        connection = self._root.manager.catalog.idle.take()
        self._transaction = connection.begin()
        self.connection = connection
        self._driver = connection.connection.driver_connection
        self._pid = backend_pid(connection)
        self._root.manager.server_waits.hold(self._pid, self._root.id)

    def take_connection(self) -> sa.Connection | None:
        """For the flush: the connection in its open transaction (the caller commits or rolls it back and gives
        it back, ``Catalog.idle.give_back``), or None if no row was locked."""
        with self._mutex:
            connection, self.connection, self._transaction = self.connection, None, None
            return connection

    def hand_over(self) -> None:
        """At the root's flush in the held transaction: PostgreSQL's row lock guards the rows read for update
        until COMMIT, so the root stops retaining them in the lock manager now (``undo_retains`` to nothing;
        rows a committed child locked stay until the root's Rule 3) — the next tree asks PostgreSQL for the row
        while this one commits (README, "Reads for update").  Not called while a history is recorded: the lock
        manager then keeps the rows until the flush is recorded (``_flush.flush``)."""
        with self._mutex:
            rows = list(self.rows)
        self._root.manager.locking.stop_retaining(self._root, rows)

    def release(self) -> None:
        """Roll back (the locks go) and close; the tree holds no row any more."""
        with self._mutex:
            self._close()
            rows = list(self.rows)
        self._root.manager.row_lock_owners.discard(rows, self._root.id)

    def abandon(self) -> None:
        """From another thread, for a tree whose thread may never return (``abandon``): end the PostgreSQL
        transaction holding the rows now — a statement running on it is cancelled first (psycopg's ``cancel`` is
        safe from any thread), then the connection is closed, which rolls it back on the server and releases its
        row locks.  If the tree's thread still holds ``_mutex`` after the cancel (``ABANDON_WAIT_SECONDS``), the
        connection is left to the process's end."""
        connection = self.connection
        if connection is None:
            return
        with contextlib.suppress(Exception):
            connection.connection.driver_connection.cancel()  # type: ignore[union-attr]  # (None: suppressed)
        if not self._mutex.acquire(timeout=ABANDON_WAIT_SECONDS):
            return
        try:
            connection, self.connection, self._transaction = self.connection, None, None
            if connection is not None:
                with contextlib.suppress(Exception):
                    connection.invalidate()     # closes the driver's connection: the server rolls back
            if self._pid is not None:
                self._root.manager.server_waits.let_go(self._pid, self._root.id)
                self._pid = None
            rows = list(self.rows)
        finally:
            self._mutex.release()
        self._root.manager.row_lock_owners.discard(rows, self._root.id)    # (its rows are PostgreSQL's again)

    def _close(self) -> None:
        """Caller holds ``_mutex``."""
        connection, self.connection = self.connection, None
        self._transaction = None
        if self._pid is not None:
            self._root.manager.server_waits.let_go(self._pid, self._root.id)
            self._pid = None
        if connection is not None:
            try:
                connection.rollback()
                self._root.manager.catalog.idle.give_back(connection)
            except sa.exc.DBAPIError:
                connection.invalidate()

    # --- the commit participant -----------------------------------------------------------------

    def aborted(self, transaction: "Transaction", error: BaseException | None) -> None:
        self.release()

    def committed(self, transaction: "Transaction") -> None:
        self.release()          # normally already handed to the flush and closed there
