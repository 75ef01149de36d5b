"""What to lock, and how a node's own operations hold locks (the ``lmgr.c`` layer over ``lockmgr``).

* **Resources.** A row is ``("row", table, key)`` under ``("table", table)``: IR/IW on the table, then
  READ/WRITE on the row.  ``Locking.set_granularity(table, TABLE)`` locks the whole table instead; a scan
  takes a table READ lock.
* **Segments.** A node's own operations run under an internal lock-manager child of the node, its
  *segment* (``<node id>#<n>``, see :mod:`activedb.txn._ids`).  Before the node creates a child or waits
  for its children, the segment commits (:meth:`Locking.release_holds`): the node then *retains* what it
  touched, so its descendants may use those rows (Rule 1) while other trees may not.  Holding through a
  segment rather than the node itself keeps the lock manager's structural edge "a parent waits for its
  children" from turning a child's temporary wait for a row the running parent holds into a reported
  deadlock: the parent releases its holds before it actually waits.
* **Errors.** Lock-manager errors are translated here, and only here: ``Deadlock`` and ``LockTimeout`` doom
  the node (it and its subtree must abort) and propagate; any other error of an aborted node becomes
  :class:`activedb.errors.TransactionAborted`.

Thread-safety: ``_mutex`` protects ``_granularity``.  A node's segment fields are touched only by the
thread running the node (``Transaction._thread``) and by its abort, under the node's ``_mutex``.
"""

from __future__ import annotations

import enum
import threading
from typing import TYPE_CHECKING, Any

import lockmgr
from lockmgr import Deadlock, LockTimeout, Mode

from activedb.errors import TransactionAborted
from activedb.txn import _ids

if TYPE_CHECKING:  # pragma: no cover
    from activedb.store import Key, TableInfo
    from activedb.txn._tree import Transaction


class Granularity(enum.Enum):
    TUPLE = "tuple"
    TABLE = "table"


class Locking:
    """Locks of every transaction of one manager, on one :class:`lockmgr.LockManager`."""

    def __init__(self, lock_manager: lockmgr.LockManager, lock_timeout: float | None):
        self.lock_manager = lock_manager
        self.lock_timeout = lock_timeout
        self._mutex = threading.Lock()        # protects _granularity (replaced whole on change)
        self._granularity: dict[str, Granularity] = {}

    def set_granularity(self, table: str, granularity: str | Granularity) -> None:
        granularity = Granularity(granularity)
        with self._mutex:
            self._granularity = {**self._granularity, table: granularity}

    def granularity(self, table: str) -> Granularity:
        return self._granularity.get(table, Granularity.TUPLE)

    # --- the node's life in the lock manager ------------------------------------------------------

    def begin(self, node: "Transaction") -> None:
        parent = node.parent
        self.lock_manager.begin(node.id, parent=parent.id if parent is not None else None)

    def commit(self, node: "Transaction") -> None:
        """Rule 2 (a subtransaction: the parent retains what it held and retained) or Rule 3 (top-level:
        release everything).  Precondition: the segment is closed and every child ended."""
        self.lock_manager.commit(node.id)

    def abort(self, node: "Transaction") -> None:
        """Rule 4 for the node, its segment and its active descendants."""
        try:
            self.lock_manager.abort(node.id)
        except lockmgr.LockError:
            pass   # already gone with an aborted ancestor

    # --- the node's own operations ------------------------------------------------------------

    def acquire(self, node: "Transaction", info: "TableInfo", key: "Key | None", mode: Mode) -> None:
        """Lock ``key`` of ``info`` (``None``: the whole table) in ``mode`` for ``node``'s own operation."""
        segment = node._segment or self._open_segment(node)
        locks = self.lock_manager
        timeout = self.lock_timeout
        name = info.name
        try:
            if key is None or self._granularity.get(name) is Granularity.TABLE:
                locks.acquire(segment, ("table", name), mode, timeout=timeout)
            else:
                locks.acquire(segment, ("table", name), Mode.IR if mode is Mode.READ else Mode.IW, timeout=timeout)
                locks.acquire(segment, ("row", name, key), mode, timeout=timeout)
        except (Deadlock, LockTimeout) as error:
            node.doom(error)
            raise
        except lockmgr.LockError as error:
            if node._doomed is not None:
                raise TransactionAborted(f"transaction {node.id} was aborted ({node._doomed})") from error
            raise

    def _open_segment(self, node: "Transaction") -> str:
        with node._mutex:
            node._segment_number += 1
            segment = _ids.segment_id(node.id, node._segment_number)
            node._segment = segment
        self.lock_manager.begin(segment, parent=node.id)
        return segment

    def release_holds(self, node: "Transaction") -> None:
        """Commit ``node``'s segment: the node now *retains* what its own operations locked (Rule 2), so
        its descendants may have it.  Called before it creates a child or waits for its children."""
        with node._mutex:
            segment, node._segment = node._segment, None
        if segment is not None:
            self.lock_manager.commit(segment)

    def holders(self, table: str, key: Any = None) -> lockmgr.Holders:
        """Who holds, retains and waits for a row (or, with ``key=None``, the table) — for tests and tools."""
        return self.lock_manager.holders(("table", table) if key is None else ("row", table, key))
