"""SEI on the batch's overlay (the design note ``activedb/streams/README.md``, "SEI without a subtransaction
per event", with its invariant): :class:`Overlay` keeps the rows a micro-batch's s-transactions read and write
in Python, with an undo log per s-transaction, and writes the batch's net change into the batch's transaction
once; :class:`OverlayView` is the s-transaction's store view over it.

Thread-safety: none — SEI runs a batch in the caller's thread; an overlay belongs to that thread.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Hashable, Mapping

from activedb.errors import DuplicateKey
from activedb.store import Checked, Entry, EntryKind, copy_nested, matches, own_image, own_value
from activedb.streams._view import Stamp, StoreView, _as_key

if TYPE_CHECKING:  # pragma: no cover
    from activedb.store import Key, RowImage, TableInfo
    from activedb.txn import Transaction
    from activedb.streams._batch import AccessPlan, STransaction
    from activedb.streams._history import StreamHistory

_PATCH, _INSERT, _DELETE, _REPLACE = EntryKind.PATCH, EntryKind.INSERT, EntryKind.DELETE, EntryKind.REPLACE
_DELETE_ENTRY = Entry(_DELETE)


_UNREAD = object()


def _own(info: "TableInfo", image: RowImage | None) -> RowImage | None:
    """``image`` (the overlay's own) as a reader gets it: a copy, with the lists and dicts of the table's JSON and
    ARRAY columns copied too (``TableInfo.nested``; as ``tx.read``'s), so that a reader changing it in place changes
    neither the row as the tree showed it nor the batch's change."""
    if image is None:
        return None
    return image.copy() if not info.nested else copy_nested(image.copy(), info.nested)


class _Row:
    """One row of the overlay: ``base`` the image the tree showed (read when first needed: a write alone reads
    nothing, as ``tx.write`` does not), ``entry`` the batch's change."""

    __slots__ = ("info", "key", "base", "entry")
    base: object        # RowImage | None once read; _UNREAD before
    entry: Entry | None

    def __init__(self, info: "TableInfo", key: Key) -> None:
        self.info, self.key, self.base, self.entry = info, key, _UNREAD, None

    def image(self, tx: "Transaction") -> RowImage | None:
        base = self.base
        if base is _UNREAD:
            # Read through the tree: its lock, and the image the batch's prefetch loaded.
            base = self.base = tx.read(self.info.name, self.key)
        entry = self.entry
        if entry is None:
            return base  # type: ignore[return-value]  # (read above)
        image = entry.apply(base)  # type: ignore[arg-type]
        if image is not None and (base is None or entry.kind is not _PATCH):
            # A row created in the batch: every column, the ones not given at their constant default (as the tree
            # shows it, ``tx.read``).
            info = self.info
            image = {**info.blank_row, **image, **info.full_key_row(self.key)}
        return image


class Overlay:
    """The rows of one batch under SEI (module docstring).  ``mark``/``rollback``/``keep`` bracket one
    s-transaction; ``write_back`` puts the batch's change into its transaction and empties the overlay."""

    def __init__(self, tx: "Transaction", history: StreamHistory | None = None,
                 cost: Callable[[str], None] | None = None):
        self._tx = tx
        self._view = OverlayView(self, tx, None, history, cost)  # type: ignore[arg-type]  # (stamped per use: view())
        self._given: dict[tuple[Any, Hashable, type], _Row] = {}          # (table, key) as the view was given them
        self._table_info: Callable[[Any], "TableInfo"] = tx.manager.catalog.table_info
        self._rows: dict[tuple[str, Key], _Row] = {}
        self._undo: list[tuple[_Row, Entry | None]] = []     # (row, its entry before) since the last keep()
        self._observed: dict[str, bool] = {}
        self._taken: dict[int, tuple[Any, bool]] = {}          # id(plan): (plan, takes it)
        extensions = tx.manager.extensions
        self._wants_old_images: Callable[[str], bool] = lambda table: extensions.any("wants_old_images", table)

    # --- which s-transactions it takes -----------------------------------------------------------------

    def takes(self, stransaction: "STransaction") -> bool:
        """Can ``stransaction`` run on the overlay: it names every row it may touch (no table, no key with a
        NULL, no Python action without declared tables — those run in a subtransaction, README) and nothing
        hears the changes of the tables it writes (a data event per write, which the overlay does not make)?"""
        plan = stransaction.plan
        known = self._taken.get(id(plan))       # (events with the same keys share their plan)
        if known is not None and known[0] is plan:
            return known[1]
        taken = self._takes(plan)
        self._taken[id(plan)] = (plan, taken)
        return taken

    def _takes(self, plan: AccessPlan) -> bool:
        if plan.opaque:
            return False
        for resources in (plan.reads, plan.writes):
            for resource in resources:
                key = resource.key
                if key is None or None in key:
                    return False
        observed = self._observed
        for resource in plan.writes:
            table = resource.table
            seen = observed.get(table)
            if seen is None:
                seen = observed[table] = self._wants_old_images(self._table_info(table).name)
            if seen:
                return False
        return True

    # --- one s-transaction ----------------------------------------------------------------------------

    def view(self, stamp: Stamp) -> "OverlayView":
        """The store view of the s-transaction ``stamp`` names (one view, stamped again for each)."""
        view = self._view
        view.restamp(stamp)
        return view

    def mark(self) -> int:
        return len(self._undo)

    def rollback(self, mark: int) -> None:
        """Undo every change since ``mark`` (the s-transaction aborted)."""
        undo = self._undo
        while len(undo) > mark:
            row, entry = undo.pop()
            row.entry = entry

    def keep(self) -> None:
        """The s-transaction committed: its changes are the batch's (no undo left to keep)."""
        self._undo.clear()

    # --- the store operations -------------------------------------------------------------------------

    def _row(self, table: str, key: Key, checked: Checked = Checked.WRITE) -> _Row:
        """The row ``key`` (a tuple, as the view gives it) of ``table``.  A one-column key is looked up first as
        it was given, with its value's class (``1``, ``1.0`` and ``True`` are equal keys of a dict, not equally
        valid keys of a table), so that only a row's first touch pays for the checks of its table and key
        (``checked``: what the key is for — ``Checked.READ`` from a Read —, which a refusal names)."""
        if len(key) != 1:
            return self._find(table, key, checked)
        value = key[0]
        given = (table, value, value.__class__)
        try:
            return self._given[given]
        except KeyError:
            pass
        except TypeError:               # (an unhashable key: the checks say what is wrong with it)
            return self._find(table, key, checked)
        row = self._given[given] = self._find(table, key, checked)
        return row

    def _find(self, table: str, key: Key, checked: Checked) -> _Row:
        info = self._table_info(table)
        key = info.key(key[0] if len(key) == 1 else key, checked)
        row = self._rows.get((info.name, key))
        if row is None:
            row = self._rows[(info.name, key)] = _Row(info, key)
        return row

    def read(self, table: str, key: Key) -> RowImage | None:
        """The row as the s-transaction sees it, a copy of the caller's own (``_own``)."""
        row = self._row(table, key)
        return _own(row.info, self._image(row))

    def _image(self, row: _Row) -> RowImage | None:
        """The row as the s-transaction sees it — the overlay's own dict: the caller must not change it."""
        return row.base if row.entry is None and row.base is not _UNREAD else row.image(self._tx)  # type: ignore[return-value]

    def write(self, table: str, key: Key, values: RowImage) -> None:
        row = self._row(table, key)
        self._change(row, Entry(_PATCH, row.info.values_without_key(row.key, values)))

    def insert(self, table: str, values: RowImage) -> Key:
        info = self._table_info(table)
        values = info.check_values(values)
        row = self._row(info.name, info.key_from_values(values))
        if row.image(self._tx) is not None:
            raise DuplicateKey(f"insert into {info.name!r}: a row with key {row.key!r} already exists; use write() "
                               f"to upsert")
        self._change(row, Entry(_INSERT, {name: value for name, value in values.items()
                                          if name not in info.key_columns}))
        return row.key

    def delete(self, table: str, key: Key) -> None:
        self._change(self._row(table, key), _DELETE_ENTRY)

    def scan(self, table: str, where: Mapping[str, object] | None) -> list[RowImage]:
        """The tree's rows of ``table`` matching ``where``, with the overlay's changes over them."""
        info = self._table_info(table)
        columns = info.key_columns
        rows = {tuple(image[column] for column in columns): image for image in self._tx.scan(info.name, where)}
        # (checked by ``tx.scan``; as it compares them: as PostgreSQL gives the values back)
        equal = ({column: info.normalised(column, value) for column, value in where.items()}
                 if isinstance(where, Mapping) else None)
        for (name, key), row in self._rows.items():
            if name == info.name and row.entry is not None:
                rows.pop(key, None)
                image = row.image(self._tx)     # (with an entry: a new dict, whose lists are the entry's and base's)
                if image is None:
                    continue
                if info.nested:                 # (before matching: a predicate gets what is handed out)
                    copy_nested(image, info.nested)
                # (the overlay's row holds values as written — a uuid's text, a float of a numeric column, a tuple of
                # an array — as ``tx.scan``'s written rows do: compared as PostgreSQL gives them back, ``normalised``)
                if matches(info.normalised_row(image, equal), equal) if equal is not None else matches(image, where):
                    rows[key] = image
        return list(rows.values())

    def _change(self, row: _Row, entry: Entry) -> None:
        previous = row.entry
        row.entry = previous.then(entry, row.info.name) if previous is not None else entry
        self._undo.append((row, previous))

    # --- the end --------------------------------------------------------------------------------------

    def write_back(self) -> int:
        """Write every changed row into the batch's transaction — the write-set entry its s-transactions'
        subtransactions would have left — and empty the overlay.  Returns the number of rows written."""
        tx, rows = self._tx, self._rows
        self._rows, self._undo, self._given = {}, [], {}
        written = 0
        for row in rows.values():
            entry = row.entry
            if entry is None:
                continue
            written += 1
            info, key = row.info, row.key
            kind = entry.kind
            if kind is _PATCH:
                tx.write(info.name, key, **entry.values)
            elif kind is _INSERT:
                tx.insert(info.name, **entry.values, **info.full_key_row(key))
            elif kind is _DELETE:
                tx.delete(info.name, key)
            elif kind is _REPLACE:          # deleted, then written: the same two operations
                tx.delete(info.name, key)
                tx.write(info.name, key, **entry.values)
            else:                           # EntryKind.ABSENT: inserted, then deleted
                tx.insert(info.name, **info.full_key_row(key))
                tx.delete(info.name, key)
        return written


class OverlayView(StoreView):
    """An s-transaction's view of the store under SEI on the overlay: the operations of :class:`StoreView`
    (stamped, recorded, costed alike), answered by the batch's :class:`Overlay` instead of a subtransaction."""

    def __init__(self, overlay: Overlay, tx: "Transaction", stamp: Stamp, history: StreamHistory | None = None,
                 cost: Callable[[str], None] | None = None):
        super().__init__(tx, stamp, history, cost)
        self._overlay = overlay

    def read(self, table: str, key: Hashable) -> RowImage | None:
        row, image = self._image(table, key)
        return _own(row.info, image)

    def read_value(self, table: str, key: Hashable, column: str) -> object:
        row, image = self._image(table, key)      # (only one value of it leaves: a copy of that one if it can change)
        if image is None:
            return None
        value = image.get(column)
        return value if column not in row.info.nested else own_value(value)

    def _image(self, table: str, key: Hashable) -> tuple[_Row, RowImage | None]:
        """A Read's steps (StoreView's, inline: the one operation of most s-transactions) with the row and the
        overlay's own image of it — the caller copies what it hands out."""
        if key.__class__ is not tuple:
            key = _as_key(self.tx, table, key, Checked.READ)
        if self._cost is not None:
            self._cost("read")
        overlay = self._overlay
        row = overlay._row(table, key, Checked.READ)
        image = overlay._image(row)
        self.reads += 1
        if self._history is not None:
            self._record(self._history.read, table, _as_key(self.tx, table, key),
                         None if image is None else own_image(image), "derive")    # (lists too: ``_view._kept``)
        return row, image

    def scan(self, table: str, where: Mapping[str, object] | None = None) -> list[RowImage]:
        self._before("read", table, None)
        return self._read(table, None, self._overlay.scan(table, where))

    def write(self, table: str, key: Hashable, /, **values: object) -> None:
        key = _as_key(self.tx, table, key)
        self._before("write", table, key)
        self._overlay.write(table, key, dict(values))
        self._written(table, key, values, "write")

    def insert(self, table: str, /, **values: object) -> Hashable:
        self._before("write", table, None)
        key = self._overlay.insert(table, values)
        self._written(table, key, dict(values), "insert")
        return key[0] if len(key) == 1 else key

    def delete(self, table: str, key: Hashable) -> None:
        key = _as_key(self.tx, table, key)
        self._before("write", table, key)
        self._overlay.delete(table, key)
        self._written(table, key, None, "delete")
