"""What to lock, and how a node's own operations hold locks (the ``lmgr.c`` layer over ``lockmgr``).

* **Resources.** A row is ``("row", table, key)`` under ``("table", table)``: IR/IW on the table, then
  READ/WRITE on the row.  ``Locking.set_granularity(table, TABLE)`` locks the whole table instead; a scan
  takes a table READ lock.
* **Holds become retains before a node waits.** A node's own operations hold their locks.  Before
  the node creates a child, waits for its children or commits, they become *retained* in place
  (:meth:`Locking.release_holds`, ``LockManager.retain``): its descendants may then use those rows
  (Rule 1) while other trees may not.  The lock manager runs with *declared* commit edges: "a parent
  waits for its children" is an edge of the wait-for graph only while the parent actually waits — for
  the whole life of an inline child (``awaited`` at ``begin``), and while ``TransactionManager.waiting``
  says so for a spawned one — so a child waiting for a row its *running* parent holds is a wait, not a
  reported deadlock: the parent retains the row before it waits for the child.
* **Errors.** Lock-manager errors are translated here, and only here: ``Deadlock`` and ``LockTimeout`` doom
  the node (it and its subtree must abort) and propagate; any other error of an aborted node becomes
  :class:`activedb.errors.TransactionAborted`.

Thread-safety: ``_mutex`` protects ``_granularity``.  Only the thread running a node acquires locks for
it or makes its holds retained (``Transaction._thread``).
"""

from __future__ import annotations

import enum
import threading
from typing import TYPE_CHECKING, Any

import lockmgr
from lockmgr import Deadlock, LockTimeout, Mode

from activedb.errors import TransactionAborted

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

    def begin(self, node: "Transaction", *, awaited: bool = False) -> None:
        """Register ``node``; ``awaited``: its parent waits for it all its life (an inline child)."""
        parent = node.parent
        self.lock_manager.begin(node.id, parent=parent.id if parent is not None else None, awaited=awaited)

    def commit(self, node: "Transaction") -> None:
        """Rule 2 (a subtransaction: the parent retains what it held and retained) or Rule 3 (top-level:
        release everything).  Precondition: its holds are retained and every child ended."""
        self.lock_manager.commit(node.id)

    def abort(self, node: "Transaction") -> None:
        """Rule 4 for the node and its active descendants."""
        try:
            self.lock_manager.abort(node.id)
        except lockmgr.LockError:
            pass   # already gone with an aborted ancestor

    # --- the node's own operations ------------------------------------------------------------

    def acquire(self, node: "Transaction", info: "TableInfo", key: "Key | None", mode: Mode) -> None:
        """Lock ``key`` of ``info`` (``None``: the whole table) in ``mode`` for ``node``'s own operation."""
        locks = self.lock_manager
        timeout = self.lock_timeout
        name = info.name
        tid = node.id
        node._holds = True
        try:
            if key is None or self._granularity.get(name) is Granularity.TABLE:
                locks.acquire(tid, ("table", name), mode, timeout=timeout)
            else:
                locks.acquire_tuple(tid, ("table", name), key, mode, timeout, resource=("row", name, key))
        except (Deadlock, LockTimeout) as error:
            node.doom(error)
            raise
        except lockmgr.LockError as error:
            if node._doomed is not None:
                raise TransactionAborted(f"transaction {node.id} was aborted ({node._doomed})") from error
            raise

    def release_holds(self, node: "Transaction") -> None:
        """What ``node``'s own operations hold becomes *retained*, in place (``LockManager.retain``): its
        descendants may have those rows (Rule 1), other trees still may not.  Called by the thread running
        the node before it creates a child, waits for its children, or commits."""
        if node._holds:
            node._holds = False
            try:
                self.lock_manager.retain(node.id)
            except lockmgr.TransactionNotActive:
                # An ancestor's abort reached the lock manager first (``doom`` comes before it, so the node
                # is doomed): its locks are gone with the ancestor's, there is nothing left to retain.
                if node._doomed is None:
                    raise

    def holders(self, table: str, key: Any = None) -> lockmgr.Holders:
        """Who holds, retains and waits for a row (or, with ``key=None``, the table) — for tests and tools."""
        return self.lock_manager.holders(("table", table) if key is None else ("row", table, key))
