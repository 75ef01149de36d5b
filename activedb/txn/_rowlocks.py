"""Rows read for update (``tx.read(table, key, for_update=True)``), locked ``FOR UPDATE`` in PostgreSQL on a
connection the tree keeps until its flush, which runs in that same transaction: ``README.md``, "Reads for
update (hot keys)" (the UPDATE mode, the bounded lock wait, the trees that flush at SERIALIZABLE).

Thread-safety: ``_mutex`` protects the connection and ``rows``; it is a leaf held while a statement runs on
the connection (a connection runs one statement at a time), never while taking any other mutex.
"""

from __future__ import annotations

import contextlib
import threading
from typing import TYPE_CHECKING, Literal, overload

import sqlalchemy as sa

from activedb.errors import Failure, SerializationConflict, classify
from activedb.store import IsolationLevel, lock_row
from activedb.txn._participants import CommitParticipant

if TYPE_CHECKING:  # pragma: no cover
    from activedb.store import Key, TableInfo
    from activedb.txn._tree import Transaction

#: How long a read for update waits for another process's row lock before giving up (a retryable conflict).
LOCK_TIMEOUT = "10s"

#: How long :meth:`RowLocks.abandon` waits for a cancelled statement's thread to let go of the connection.
ABANDON_WAIT_SECONDS = 5.0




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
        #: (table, key) of every row this tree holds ``FOR UPDATE``.
        self.rows: set[tuple[str, "Key"]] = set()

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

    def lock(self, info: "TableInfo", key: "Key") -> dict[str, object] | None:
        """The committed image of row ``key``, locked ``FOR UPDATE`` until the tree ends (None: no row)."""
        row = (info.name, key)
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
                sqlstate = getattr(error.orig, "sqlstate", None)
                if sqlstate == "55P03" or classify(error) in (Failure.SERIALIZATION_CONFLICT, Failure.DEADLOCK):
                    raise SerializationConflict(
                        f"row {key!r} of {info.name!r} stayed locked by another process (SQLSTATE {sqlstate}); "
                        f"nothing was written — re-run the transaction (Database.run(fn) does)") from None
                raise self._root.manager.catalog.database_failure(
                    error, f"locking row {key!r} of {info.name!r}") from error
            self.rows.add(row)
        return image

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
        """Roll back (the locks go) and close."""
        with self._mutex:
            self._close()

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
        finally:
            self._mutex.release()

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
