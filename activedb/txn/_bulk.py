"""Bulk operations of a node: many rows of one table per call (``tx.read_many``, ``tx.write_many``).

A batch that already knows every row it will touch (a TPG batch, a sink applying a micro-batch)
pays per row for what a per-row API does per call: a lock-manager request, a key check, a
round trip to find the committed image.  The bulk forms take the locks at the granularity
asked for and load the committed images of all rows in one query:

* ``read_many(table, keys, lock="read" | "write" | "table")`` → ``{key: image or None}``, the
  rows as the node sees them.  ``"read"`` takes READ row locks (as ``prefetch``), ``"write"``
  takes WRITE row locks at once (no READ→WRITE upgrade later, so two batches on shared rows
  cannot deadlock on the upgrade), ``"table"`` one WRITE lock on the whole table and no row lock
  at all.  The images are relied on (validated at the flush) like those of ``read``.
* ``write_many(table, {key: values or None}, lock="row" | "table")`` — ``write`` (upsert the
  given columns) or, for ``None``, ``delete``, row by row in the node's write set, raising the
  same data events (rules observing the table fire as for ``write``).  ``"table"`` takes one
  table WRITE lock instead of a lock per row.

Both run in the calling node's thread and follow the node's rules (``_check_active``, locks
through :class:`~activedb.txn._locking.Locking`, what a node sees through ``_view``).  The only
hook in ``_tree.py``: the two methods that call these, and ``_modify(..., lock=False)`` (the
entry of a row whose table lock the node already took).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Mapping

from lockmgr import Mode

from activedb.store import Entry, EntryKind
from activedb.txn import _view

if TYPE_CHECKING:  # pragma: no cover
    from activedb.txn._tree import Transaction

__all__ = ["read_many", "write_many"]

_READ_LOCKS = {"read": Mode.READ, "write": Mode.WRITE}
_CHUNK = 10_000   # keys per query of read_many


def read_many(node: "Transaction", table: Any, keys: Iterable[Any], lock: str = "read") -> dict[Any, dict | None]:
    node._check_active("read_many")
    if lock not in ("read", "write", "table"):
        raise ValueError(f"read_many(lock={lock!r}): use 'read', 'write' or 'table'")
    info = node.manager.catalog.table_info(table)
    normalised: dict[Any, Any] = {}
    for given in keys:
        if given not in normalised:
            normalised[given] = info.key(given)
    locking = node.manager.locking
    if lock == "table":
        locking.acquire(node, info, None, Mode.WRITE)
    else:
        mode = _READ_LOCKS[lock]
        for key in normalised.values():
            locking.acquire(node, info, key, mode)
    chain = (node, *node.ancestors())
    name = info.name
    wanted = list(dict.fromkeys(key for key in normalised.values()
                                if not any((name, key) in member._db_reads for member in chain)))
    read_base = node.root._read_base
    for start in range(0, len(wanted), _CHUNK):   # PostgreSQL takes at most 65,535 parameters a statement
        read_base.read_many(node, info, wanted[start:start + _CHUNK])
    return {given: _view.read_row(node, info, key) for given, key in normalised.items()}


def write_many(node: "Transaction", table: Any, rows: Mapping[Any, Mapping[str, Any] | None], lock: str = "row") -> int:
    node._check_active("write_many")
    if lock not in ("row", "table"):
        raise ValueError(f"write_many(lock={lock!r}): use 'row' or 'table'")
    info = node.manager.catalog.table_info(table)
    by_table = lock == "table"
    if by_table:
        node.manager.locking.acquire(node, info, None, Mode.WRITE)
    count = 0
    for given, values in rows.items():
        key = info.key(given)
        if values is None:
            entry = Entry(EntryKind.DELETE)
        else:
            entry = Entry(EntryKind.PATCH, node._values_without_key(info, key, dict(values)))
        node._modify(info, key, entry, lock=not by_table)
        count += 1
    return count
