"""What a node sees: its own writes → its ancestors' writes (nearest first) → a pluggable :class:`ReadBase`
(default :class:`CommittedRows`, PostgreSQL's committed data, the images relied on remembered for the
flush to validate); :class:`TreeRows` lets most reads skip the walk up.  The walk, its invariants and why a
read costs the same at any depth: ``README.md``, "What a node sees".

Thread-safety: a node's ``_writes`` and ``_db_reads`` are written under its ``_mutex`` and read without it
(one dict lookup, atomic); the lock on the row, taken before any read, orders every writer of the row.
A row joins a ``TreeRows`` set before the entry or image that needs it is installed, and never leaves it.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Mapping, Protocol

import sqlalchemy as sa

from activedb.errors import SerializationConflict
from activedb.store import (Entry, EntryKind, Key, TableInfo, copy_nested, fetch_rows, resolve, rows_by_key,
                            same_image)
from activedb.txn._rowlocks import RowLocks

if TYPE_CHECKING:  # pragma: no cover
    from activedb.store import Catalog
    from activedb.txn._history import HistoryRecorder
    from activedb.txn._tree import Transaction

_PATCH = EntryKind.PATCH   # (an Enum member as a constant: cheaper on the hot path)


class TreeRows:
    """The rows of one tree that a node below its root ever wrote (``written``: a write entry, made by
    ``Writes._modify``) or relied on (``relied``: an image in its ``_db_reads``).  Monotone: a row stays
    after the entry or image is gone (delegated, discarded), which only costs the walk.  Invariant: a
    non-root node of the tree has a write entry (an image relied on) for a row only if the row is in
    ``written`` (``relied``); delegation moves entries and images between nodes of one tree, whose rows
    are in the sets already (a child below the root made them)."""

    __slots__ = ("written", "relied")

    def __init__(self) -> None:
        self.written: set[tuple[str, Key]] = set()
        self.relied: set[tuple[str, Key]] = set()


class ReadBase(Protocol):
    """Where a tree's reads go when no write entry of the node or its ancestors decides the row."""

    def read(self, node: "Transaction", info: TableInfo, key: Key, *, relied: bool, for_update: bool = False
             ) -> dict[str, object] | None:
        """The image of ``key`` underneath ``node``'s write entries (None: no row).  ``relied=False``:
        the caller only checks existence and will not rely on the image for a decision the flush must
        validate (an insert's duplicate check).  ``for_update``: the caller will write the row — a base
        over a database locks it there until the tree ends (``CommittedRows``: ``FOR UPDATE``)."""

    def read_many(self, node: "Transaction", info: TableInfo, keys: list[Key]) -> int:
        """Load the images of ``keys`` in one go for later reads by ``node`` and its descendants;
        returns how many rows exist."""

    def scan(self, node: "Transaction", info: TableInfo, where: object) -> dict[Key, dict[str, object]]:
        """Every row of the table matching ``where`` (a dict of equalities or None), by key."""


class CommittedRows:
    """The default read base: PostgreSQL's committed rows, each image remembered for validation."""

    def __init__(self, catalog: "Catalog", recorder: "HistoryRecorder | None"):
        self.catalog = catalog
        self.recorder = recorder

    def read(self, node: "Transaction", info: TableInfo, key: Key, *, relied: bool, for_update: bool = False
             ) -> dict[str, object] | None:
        row = (info.name, key)
        if for_update:
            return self._read_for_update(node, info, key)
        below_root = node.parent is not None
        if below_root and row not in node._tree_rows.relied:
            reads = node.root._db_reads        # no node below the root relied on the row: only the root may
            if row in reads:
                return reads[row]
        else:
            ancestor: Transaction | None = node
            while ancestor is not None:           # the nearest image this node or an ancestor relied on
                reads = ancestor._db_reads
                if row in reads:
                    return reads[row]
                ancestor = ancestor.parent
        node.manager.pool.before_blocking()        # a round trip: queued tasks need not wait for it
        with self.catalog.autocommit_connection() as connection:
            image = fetch_rows(connection, info, [key]).get(key)
        return self._rely(node, info, key, image) if relied else image

    def _rely(self, node: "Transaction", info: TableInfo, key: Key, image: dict[str, object] | None
              ) -> dict[str, object] | None:
        """``node`` relies on ``image`` of the row from now on (the first image relied on stays: returned)."""
        row = (info.name, key)
        if node.parent is not None:
            node._tree_rows.relied.add(row)    # before the image (``TreeRows``)
        with node._mutex:
            image = node._db_reads.setdefault(row, image)
        if self.recorder:
            self.recorder.record_committed_read(node.id, node.root.id, info.name, key, image)
        return image

    def _read_for_update(self, node: "Transaction", info: TableInfo, key: Key) -> dict[str, object] | None:
        """The row locked ``FOR UPDATE`` in PostgreSQL for the rest of the tree (``_rowlocks``); it must agree
        with any image the tree relied on before (else another process changed it in between)."""
        row = (info.name, key)
        session = RowLocks.of(node.root)
        if row in session.rows:
            ancestor: Transaction | None = node
            while ancestor is not None:
                if row in ancestor._db_reads:
                    return ancestor._db_reads[row]
                ancestor = ancestor.parent
        node.manager.pool.before_blocking()        # a round trip (maybe a row lock's wait)
        image = session.lock(node, info, key)
        ancestor = node
        while ancestor is not None:
            reads = ancestor._db_reads
            if row in reads and not same_image(reads[row], image):
                raise SerializationConflict(
                    f"row {key!r} of {info.name!r} changed in PostgreSQL between an earlier read of this transaction "
                    f"and its read for update (another process committed in between); nothing was written — "
                    f"re-run the transaction (Database.run(fn, retries=N) does)")
            ancestor = ancestor.parent
        return self._rely(node, info, key, image)

    def read_many(self, node: "Transaction", info: TableInfo, keys: list[Key]) -> int:
        node.manager.pool.before_blocking()        # a round trip: queued tasks need not wait for it
        with self.catalog.autocommit_connection() as connection:
            found = fetch_rows(connection, info, keys)
        if node.parent is not None:
            node._tree_rows.relied.update((info.name, key) for key in keys)
        with node._mutex:
            for key in keys:
                node._db_reads.setdefault((info.name, key), found.get(key))
        if self.recorder:
            for key in keys:
                self.recorder.record_committed_read(node.id, node.root.id, info.name, key, found.get(key))
        return len(found)

    def scan(self, node: "Transaction", info: TableInfo, where: object) -> dict[Key, dict[str, object]]:
        node.manager.pool.before_blocking()        # a round trip: queued tasks need not wait for it
        fetched = scan_rows(self.catalog, info, where)
        with node._mutex:
            node._scans = [*node._scans, (info.name, where if isinstance(where, Mapping) else None, fetched)]
        return fetched


def scan_rows(catalog_or_connection: "Catalog | sa.Connection", info: TableInfo, where: object, *,
              lock: str | None = None, nowait: bool = False) -> dict[Key, dict[str, object]]:
    """Rows of ``info`` matching the equality dict ``where`` (anything else: all rows), by key;
    ``lock="share"`` (a connection only) locks them ``FOR SHARE`` (``nowait``: SQLSTATE 55P03 instead of
    waiting for a row another transaction has locked)."""
    statement = sa.select(info.table)
    if isinstance(where, Mapping):
        statement = statement.where(*[info.equals(column, value) for column, value in where.items()])
    if lock == "share":
        statement = statement.with_for_update(read=True, nowait=nowait)
    with (contextlib.nullcontext(catalog_or_connection) if isinstance(catalog_or_connection, sa.Connection)
          else catalog_or_connection.autocommit_connection()) as connection:
        return rows_by_key(connection.execute(statement), info.key_columns)


def read_row(node: "Transaction", info: TableInfo, key: Key, *, record: bool = True, relied: bool = True,
             for_update: bool = False) -> dict[str, object] | None:
    """The row as ``node`` sees it (module docstring).  Precondition: ``node`` holds a lock on the row."""
    row = (info.name, key)
    chain: list[Entry] = []
    # Below the root, a row no node below the root wrote has an entry on the root at most (TreeRows).
    ancestor: Transaction | None = (node.root if node.parent is not None and row not in node._tree_rows.written
                                    else node)
    source = None
    needs_base = True
    while ancestor is not None:
        entry = ancestor._writes.get(row)
        if entry is not None:
            chain.append(entry)
            if source is None:
                source = ancestor
            if entry.kind is not _PATCH:
                needs_base = False
                break
        ancestor = ancestor.parent
    if not needs_base:
        base = None
    elif for_update:
        base = node.root._read_base.read(  # type: ignore[union-attr]  # (a root has its read base)
            node, info, key, relied=relied, for_update=True)
    else:
        base = node.root._read_base.read(node, info, key, relied=relied)  # type: ignore[union-attr]  # (as above)
    if node._doomed is not None:
        # An ancestor aborted while this read ran: it is doomed before its writes are discarded, so a
        # chain read without them is never returned (a doomed node sees no state that never existed).
        node._check_active("read")
    if not chain:
        # The caller's own copy (``tx.read``'s contract): ``base`` is the image the tree relied on, which the
        # flush validates; a change made to what was read must change nothing until written — to a JSON or
        # ARRAY column's list or dict too (``copy_nested``, for tables that have such columns).
        if base is None:
            return None
        return base.copy() if not info.nested else copy_nested(base.copy(), info.nested)
    chain.reverse()
    image = resolve(chain, base)
    if image is not None and base is None:
        # A row created in this tree: every column, the ones not given at their constant default.
        image = {**info.blank_row, **image, **info.full_key_row(key)}
    if image is not None and info.nested:
        # (A new dict, but its lists and dicts are the write entries' and the relied-on image's.)
        copy_nested(image, info.nested)
    recorder = node.manager.recorder
    if recorder and record:
        if source is not node and not (node._undo and row in node._undo):
            # A frame's write lies in the write set below it: the nearest frame whose marks list the row wrote it.
            # (``source`` is an ancestor of ``node``: the walk up meets it before the root's None parent.)
            frame: Transaction = node.parent  # type: ignore[assignment]
            while frame is not source and frame._frame and not (frame._undo and row in frame._undo):
                frame = frame.parent  # type: ignore[assignment]
            if frame._frame:
                source = frame
        recorder.record("read", node.id, root=node.root.id, table=info.name, key=key, value=image,
                        source="own" if source is node or (node._undo and row in node._undo)
                        else f"ancestor:{source.id}")  # type: ignore[union-attr]  # (a chain has its source)
    return image


def written_keys(node: "Transaction", table_name: str) -> set[Key]:
    """Keys of ``table_name`` that ``node`` or an ancestor wrote."""
    keys: set[Key] = set()
    ancestor: Transaction | None = node
    while ancestor is not None:
        keys.update(key for (name, key) in list(ancestor._writes) if name == table_name)
        ancestor = ancestor.parent
    return keys
