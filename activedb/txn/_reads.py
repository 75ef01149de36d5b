"""What a node reads (a mixin of :class:`~activedb.txn.Transaction`, stateless): ``read`` (also for update),
``prefetch``, ``read_many`` and ``scan``, and the hot-key learning of plain reads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Hashable, Iterable, Mapping

from lockmgr import Mode

from activedb._closedset import ClosedSet
from activedb.errors import BadArgument, check_switch
from activedb.store import Checked, RowImage, TableRef, copy_nested, matches
from activedb.txn import _view
from activedb.txn._hotkeys import HotKeys

if TYPE_CHECKING:  # pragma: no cover
    from activedb.txn._tree import Transaction


class BulkLock(ClosedSet):
    """How ``read_many`` and ``write_many`` lock the rows they touch."""

    READ = "read"          # a READ lock per row (``read_many``'s default)
    WRITE = "write"        # a WRITE lock per row: no READ -> WRITE upgrade later (``write_many``'s default)
    TABLE = "table"        # one WRITE lock on the table, no row locks


_READ_LOCKS = {BulkLock.READ: Mode.READ, BulkLock.WRITE: Mode.WRITE}
_CHUNK = 10_000   # keys per query of read_many (PostgreSQL takes at most 65,535 parameters a statement)


class Reads:
    """The read operations of a node (see the module docstring)."""

    # Its methods take ``self: Transaction``: the only class it is mixed into (mypy asks a self type to be a
    # supertype of the class; each ``ignore[misc]`` below is that).
    __slots__ = ()

    def read(self: Transaction, table: TableRef, key: Hashable, *,  # type: ignore[misc]
             for_update: bool = False) -> RowImage | None:
        """The row with primary key ``key`` as a dict, or None; takes a READ lock.  ``for_update=True``: read
        with intent to write it — an UPDATE lock (two read-modify-writes of the row queue here instead of
        deadlocking when both upgrade), and the row locked in PostgreSQL until the tree commits (see
        ``_rowlocks.py``).  The row read is the caller's: changing it changes nothing until written
        (``row["n"] += 1`` then ``tx.write(table, key, n=row["n"])``); so are ``read_many``'s and ``scan``'s."""
        self._check_active("read")
        if for_update and for_update is not True:   # (a text such as 'no' is true to Python: never taken for a switch)
            # (``for_update`` is typed bool, the type it is meant to have; the test is of what a caller may pass.)
            check_switch("tx.read", "for_update", for_update)  # type: ignore[unreachable]
        info = self.manager.catalog.table_info(table)
        key = info.key(key, Checked.READ)
        slots = self.root._slots          # (``_slot(HotKeys, create=False)`` without its call: every read)
        hot = slots.get(HotKeys) if slots is not None else None
        if for_update or (hot is not None and info.name in hot.update_intent):
            self.manager.locking.acquire(self, info, key, Mode.UPDATE)
            return _view.read_row(self, info, key, for_update=True)
        self.manager.locking.acquire(self, info, key, Mode.READ)
        (hot or self.root._slot(HotKeys)).plain_reads.add((info.name, key))
        return _view.read_row(self, info, key)

    def _read_then_written(self: Transaction) -> frozenset[str]:  # type: ignore[misc]
        """``lowlevel.read_then_written`` (see there)."""
        hot = self.root._slot(HotKeys, create=False)
        return frozenset(hot.read_then_written) if hot is not None else frozenset()

    def prefetch(self: Transaction, table: TableRef, keys: Iterable[Hashable]) -> int:  # type: ignore[misc]
        """Read-lock ``keys`` of ``table`` and load their committed images in one query, so that
        later reads in this tree (this node and its descendants) need no round trip.  Returns the
        number of rows found.  Useful before processing a batch of events on known keys."""
        self._check_active("prefetch")
        info = self.manager.catalog.table_info(table)
        _check_collection("prefetch", info.name, keys)
        chain, name = (self, *self.ancestors), info.name
        keyed = (info.key(given, Checked.READ) for given in keys)
        wanted = list(dict.fromkeys(key for key in keyed if not any(
            (name, key) in node._db_reads or (name, key) in node._writes for node in chain)))
        self.manager.locking.acquire_rows(self, info, wanted, Mode.READ)
        # (A root always has its read base: only a frame's is None.)
        return self.root._read_base.read_many(self, info, wanted) if wanted else 0  # type: ignore[union-attr]

    def read_many(self: Transaction, table: TableRef, keys: Iterable[Hashable], *,  # type: ignore[misc]
                  lock: BulkLock = BulkLock.READ
                  ) -> dict[Hashable, RowImage | None]:
        """The rows ``keys`` of ``table`` as this transaction sees them, ``{key: dict or None}``, with
        their committed images loaded in one query and relied on (validated at the flush) like ``read``'s.
        ``lock``: ``BulkLock.READ``; ``BulkLock.WRITE`` (no READ→WRITE upgrade later, so two batches on shared
        rows cannot deadlock on it); ``BulkLock.TABLE`` (one lock, no row locks)."""
        self._check_active("read_many")
        lock = BulkLock.parse(lock, "read_many(lock=...)")
        info = self.manager.catalog.table_info(table)
        _check_collection("read_many", info.name, keys)
        normalised: dict[Any, Any] = {}
        given: object         # (a key typed Hashable, but a list is taken too: the values of a key of several columns)
        for given in keys:
            if isinstance(given, list):     # (a key of several columns as a list: by its tuple, ``TableInfo.named``)
                given = info.named(given)
            try:
                seen = given in normalised
            except TypeError:   # (unhashable — a one-column key's list, a dict —: no key is; its check says why)
                info.key(given, Checked.READ)
                raise
            if not seen:
                normalised[given] = info.key(given, Checked.READ)
        locking = self.manager.locking
        if lock is BulkLock.TABLE:
            locking.acquire(self, info, None, Mode.WRITE)
        else:
            locking.acquire_rows(self, info, list(normalised.values()), _READ_LOCKS[lock])
        chain = (self, *self.ancestors)
        name = info.name
        wanted = list(dict.fromkeys(key for key in normalised.values()
                                    if not any((name, key) in member._db_reads for member in chain)))
        read_base = self.root._read_base
        for start in range(0, len(wanted), _CHUNK):
            read_base.read_many(self, info, wanted[start:start + _CHUNK])  # type: ignore[union-attr]  # (as above)
        return {given: _view.read_row(self, info, key) for given, key in normalised.items()}

    def scan(self: Transaction, table: TableRef,  # type: ignore[misc]
             where: Mapping[str, object] | Callable[[RowImage], bool] | None = None
             ) -> list[RowImage]:
        """All rows of ``table`` matching ``where`` (a dict of equalities or a predicate on the row
        dict), as this transaction sees them; takes a table-level READ lock."""
        self._check_active("scan")
        info = self.manager.catalog.table_info(table)
        if isinstance(where, Mapping):
            for column, value in where.items():
                info.check_value(column, value, Checked.SCAN)
            # (as the rows read back hold them: the rows PostgreSQL matches are compared again in Python, ``matches``)
            where = {column: info.normalised(column, value) for column, value in where.items()}
        elif where is not None and not callable(where):
            raise BadArgument(f"tx.scan({info.name!r}, where={where!r}) takes a mapping of column to value (the rows "
                              f"equal in each), a predicate on the row dict, or None (every row); got a "
                              f"{type(where).__name__}, e.g. where={{'column': value}}")
        self.manager.locking.acquire(self, info, None, Mode.READ)
        # (The images scanned are kept for the flush to validate: the caller and a predicate get copies, as
        # ``read``'s caller does; an image ``read_row`` composed is a fresh one.)
        rows = {key: image.copy() for key, image in
                self.root._read_base.scan(self, info, where).items()}  # type: ignore[union-attr]  # (a root's)
        if info.nested:     # (their lists and dicts too: ``_view.read_row``)
            for image in rows.values():
                copy_nested(image, info.nested)
        written = _view.written_keys(self, info.name)
        for key in written:
            rows[key] = _view.read_row(self, info, key, record=False)
        # An ancestor that aborted during the scan was doomed before its writes were discarded: a scan
        # that merged the tree's writes without them is never returned (as ``_view.read_row`` does).
        self._check_active("scan")
        if written and isinstance(where, Mapping):
            # (a row of the tree's holds values as written, a uuid's text, a float of a numeric column: compared as
            # PostgreSQL gives them back, as ``where``'s are)
            result = [image for key, image in rows.items() if image is not None and matches(
                info.normalised_row(image, where) if key in written else image, where)]
        else:
            result = [image for image in rows.values() if image is not None and matches(image, where)]
        recorder = self.manager.recorder
        if recorder:
            for key, image in rows.items():
                recorder.record("read", self.id, root=self.root.id, table=info.name, key=key, value=image,
                                source="scan")
        return result


def _check_collection(method: str, table: str, keys: object) -> None:
    """Refuse ``keys``, given to ``method(table, keys)``, if it is one text (a ``TypeError``: an iterable of its letters,
    or of its numbers) or no collection (None, one number: a :class:`BadArgument`; not iterable, it would fail as a
    bare ``TypeError`` inside the loop over the keys)."""
    if isinstance(keys, (str, bytes)):
        raise TypeError(f"{method}({table!r}, keys) takes a collection of keys, got the text {keys!r}; for that one "
                        f"row: {method}({table!r}, [{keys!r}])")
    try:
        iter(keys)  # type: ignore[call-overload]  # (what is checked: any object)
    except TypeError:
        raise BadArgument(f"{method}({table!r}, keys) takes a collection of keys (a list, tuple or set), got {keys!r} "
                          f"({type(keys).__name__}); for one row: {method}({table!r}, [key])") from None
