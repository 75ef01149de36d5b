"""Rows read for update (``tx.read(table, key, for_update=True)``), locked ``FOR UPDATE`` in PostgreSQL on a
connection the tree keeps until its flush, which runs in that same transaction: ``README.md``, "Reads for
update (hot keys)" (the UPDATE mode, the bounded lock wait, the trees that flush at SERIALIZABLE).

Thread-safety: ``_mutex`` protects the connection and ``rows``; it is a leaf held while a statement runs on
the connection (a connection runs one statement at a time), never while taking any other mutex.
:class:`RowLockOwners`' ``_mutex`` is a leaf too.
"""

from __future__ import annotations

import contextlib
import threading
from typing import TYPE_CHECKING, AbstractSet, Collection, Iterable, Literal, overload

import sqlalchemy as sa

import lockmgr

from activedb.errors import Failure, SerializationConflict, classify
from activedb.store import IsolationLevel, lock_row
from activedb.txn import _help_edges
from activedb.txn._hooks import WaitKind
from activedb.txn._participants import CommitParticipant

if TYPE_CHECKING:  # pragma: no cover
    from activedb.store import Key, TableInfo
    from activedb.txn._tree import Transaction

#: How long a read for update waits for another process's row lock before giving up (a retryable conflict).
LOCK_TIMEOUT = "10s"

#: How long :meth:`RowLocks.abandon` waits for a cancelled statement's thread to let go of the connection.
ABANDON_WAIT_SECONDS = 5.0




class RowLockOwners:
    """Which trees of this process hold which rows locked ``FOR UPDATE`` in PostgreSQL (their :class:`RowLocks`),
    so that a flush about to lock rows ``FOR SHARE`` (or ``FOR UPDATE``) says to the lock manager that it waits for
    those trees (:meth:`wait_for_holders`).  Without it a cycle through both lock systems waits forever: tree B
    holds an UPDATE lock (which admits readers) and the row in PostgreSQL, and waits in the lock manager to write it
    for tree A, which read the row; A's flush waits in PostgreSQL for B's row lock — each detector sees one edge.
    With it the lock manager sees both and makes one of them the deadlock's victim.  One per transaction manager;
    thread-safe."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._owners: dict[tuple[str, "Key"], set[str]] = {}

    def __bool__(self) -> bool:
        return bool(self._owners)          # (read without the mutex: a flush's quick test, the common case empty)

    def claim(self, row: tuple[str, "Key"], root: str) -> list[str]:
        """List ``root`` as holding ``row`` — before its ``SELECT … FOR UPDATE`` is sent, so that a flush looking
        meanwhile sees it — and return the other trees listed for the row (the ones it may wait for)."""
        with self._mutex:
            owners = self._owners.setdefault(row, set())
            owners.add(root)
            return sorted(owners - {root})

    def discard(self, rows: Iterable[tuple[str, "Key"]], root: str) -> None:
        with self._mutex:
            for row in rows:
                owners = self._owners.get(row)
                if owners is not None:
                    owners.discard(root)
                    if not owners:
                        del self._owners[row]

    def holders(self, rows: AbstractSet[tuple[str, "Key"]], tables: Collection[str], root: str) -> list[str]:
        """The trees other than ``root`` holding one of ``rows``, or any row of ``tables`` (a scan's), locked."""
        with self._mutex:
            if tables or len(self._owners) < len(rows):      # (walk the smaller side)
                found = {owner for row, owners in self._owners.items() if row in rows or row[0] in tables
                         for owner in owners}
            else:
                found = {owner for row in rows for owner in self._owners.get(row, ())}
        found.discard(root)
        return sorted(found)

    def wait_for_holders(self, root: "Transaction", rows: AbstractSet[tuple[str, "Key"]],
                         tables: Collection[str]) -> "lockmgr.ExternalWait | None":
        """Register that ``root``'s flush waits for the trees holding ``rows`` (or rows of ``tables``) locked in
        PostgreSQL, before it locks them (``WaitKind.ROW_LOCK``; the caller releases the wait once its statements
        ran); None when no other tree holds any.  Raises ``DeadlockDetected`` if that closes a cycle and ``root``
        is its victim; a cycle closed later makes the other tree the victim (its abort lets the rows go)."""
        return row_lock_wait(root, self.holders(rows, tables, root.id))


def row_lock_wait(node: "Transaction", targets: list[str]) -> "lockmgr.ExternalWait | None":
    """Register that ``node`` waits in PostgreSQL for the trees ``targets`` (``WaitKind.ROW_LOCK``; None: no target),
    as the lock manager's transaction that is blocked: ``node`` itself, or for a lazy node the ancestor its locks are
    granted to.  Its holds stay holds: the wait is inside one of its operations, which its descendants must not
    interleave with (unlike ``TransactionManager.waiting``).  Raises ``DeadlockDetected`` if the wait closes a cycle
    and ``node`` is its victim."""
    if not targets:
        return None
    _help_edges.flush()         # (edges of children this thread helps: before its own)
    waiter = node
    while waiter._lazy:
        waiter = waiter.parent  # type: ignore[assignment]  # (a lazy node has a parent)
    try:
        return node.manager.locks.add_wait(waiter.id, targets, kind=WaitKind.ROW_LOCK)
    except lockmgr.TransactionNotActive:
        return None             # (an ancestor's abort reached the lock manager first: it learns of it after the wait)


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
        owners = self._root.manager.row_lock_owners
        unlisted: set[tuple[str, "Key"]] = set() if row in self.rows else {row}   # (unlisted again if this fails)
        waiting = None
        try:
            waiting = row_lock_wait(node, owners.claim(row, self._root.id))
            with self._mutex:
                try:
                    begin = None
                    if self.connection is None:
                        self._open()
                        begin = IsolationLevel.READ_COMMITTED   # the BEGIN rides with the first row's SELECT
                    image = lock_row(self.connection, info, key,  # type: ignore[arg-type]  # (opened just above)
                                     lock_timeout=LOCK_TIMEOUT, begin=begin)
                except sa.exc.DBAPIError as error:
                    self._close()               # the transaction failed: its locks go with it
                    unlisted, self.rows = unlisted | self.rows.keys(), {}
                    sqlstate = getattr(error.orig, "sqlstate", None)
                    if sqlstate == "55P03" or classify(error) in (Failure.SERIALIZATION_CONFLICT, Failure.DEADLOCK):
                        raise SerializationConflict(
                            f"row {key!r} of {info.name!r} stayed locked by another transaction (SQLSTATE {sqlstate}); "
                            f"nothing was written — re-run the transaction (Database.run(fn) does)") from None
                    raise self._root.manager.catalog.database_failure(
                        error, f"locking row {key!r} of {info.name!r}") from error
                self.rows[row] = image
                unlisted = set()
            return image
        finally:
            if waiting is not None:
                waiting.release()
            if unlisted:        # (after ``_mutex``, a leaf: the owners' mutex is another leaf)
                owners.discard(unlisted, self._root.id)

    def _open(self) -> None:
        """Caller holds ``_mutex``.  The connection is in autocommit at the driver (``Catalog.idle``), so that
        the first row's ``SELECT … FOR UPDATE`` opens the transaction in its own round trip
        (``lock_row(begin=…)``); every later statement runs in that open transaction, and ``commit``/``rollback``
        end it as usual."""
        connection = self._root.manager.catalog.idle.take()
        self._transaction = connection.begin()
        self.connection = connection

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
        while this one commits (README, "Reads for update")."""
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
            rows = list(self.rows)
        finally:
            self._mutex.release()
        self._root.manager.row_lock_owners.discard(rows, self._root.id)    # (its rows are PostgreSQL's again)

    def _close(self) -> None:
        """Caller holds ``_mutex``."""
        connection, self.connection = self.connection, None
        self._transaction = None
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
