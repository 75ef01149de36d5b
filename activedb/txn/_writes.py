"""What a node writes and the events it raises (a mixin of :class:`~activedb.txn.Transaction`, stateless).
Every row change goes through ``_modify``: the hot-key note, the WRITE lock (none when ``write_many`` took
the table's), the write-set entry and the data event the extensions (the rule manager) hear of.
"""

from __future__ import annotations

import datetime
from typing import TYPE_CHECKING, Hashable, Mapping

from lockmgr import Mode, TxnState

from activedb.errors import BadArgument, DuplicateKey, InvalidKey, InvalidTime
from activedb.events import AccuracyInterval, EventKind, Timestamp, check_time, new_event
from activedb.store import (EXACT_DEPTH, JSONABLE_DEPTH, NESTED_TYPES, Checked, Entry, EntryKind, Key, RowImage,
                            TableInfo, TableRef, copy_nested, own_image)
from activedb.txn import _view
from activedb.txn._hotkeys import HotKeys
from activedb.txn._reads import BulkLock

if TYPE_CHECKING:  # pragma: no cover
    from activedb.txn._hooks import HookRegistry, TransactionExtension
    from activedb.txn._tree import Transaction

# Enum members as module constants: cheaper than the class attribute lookup on the hot path.
_PATCH, _INSERT, _DELETE = EntryKind.PATCH, EntryKind.INSERT, EntryKind.DELETE
_WRITE, _STREAM, _SIGNAL = Mode.WRITE, EventKind.STREAM, EventKind.SIGNAL
_INSERTED, _UPDATED, _DELETED = EventKind.INSERTED, EventKind.UPDATED, EventKind.DELETED
_WRITE_LOCKS = (BulkLock.WRITE, BulkLock.TABLE)       # what a write may take
_ABORTED, _ACTIVE = TxnState.ABORTED, TxnState.ACTIVE


class Writes:
    """The write operations and events of a node (see the module docstring)."""

    # Its methods take ``self: Transaction``: the only class it is mixed into (mypy asks a self type to be a
    # supertype of the class; each ``ignore[misc]`` below is that).
    __slots__ = ()

    def write(self: Transaction, table: TableRef, key: Hashable, /, **values: object) -> None:  # type: ignore[misc]
        """Upsert: update the given columns of row ``key``, or insert it.  (``table`` and ``key`` are positional: a
        column named ``key`` or ``table`` is a value like any other.)  The values are taken as they are at the call —
        a JSON or ARRAY column's list or dict is copied —, as ``insert`` and ``write_many`` take theirs: changing a
        list after writing it changes nothing written."""
        self._check_active("write")
        info = self.manager.catalog.table_info(table)
        key = info.key(key)
        values = info.values_without_key(key, values)
        if info.nested:     # (a JSON or ARRAY column's list or dict as it is now: the caller's stays the caller's)
            copy_nested(values, info.nested, EXACT_DEPTH)
        self._modify(info, key, Entry(_PATCH, values))

    def insert(self: Transaction, table: TableRef, /, **values: object) -> Hashable:  # type: ignore[misc]
        """Insert a new row; returns its key.  A table whose key the database generates
        (identity/serial) may omit it: the next sequence value is taken.  A key ``GENERATED ALWAYS AS IDENTITY``
        must be omitted (PostgreSQL takes no key the application gives such a column: ``InvalidKey``).
        (``table`` is positional: a column named ``table`` is a value.)"""
        self._check_active("insert")
        info = self.manager.catalog.table_info(table)
        values = info.check_values(values, copy=False)     # (its keyword arguments: a dict of its own)
        if info.always_generated:
            info.refuse_given_identity(values, f"insert into {info.name!r}", "omit {name}: insert() draws the key "
                                                                              "from the identity and returns it")
        generated = any(values.get(name) is None for name in info.key_columns)
        if generated:
            values = {**values, **_generated_key(self, info, values)}
        key = info.key(info.key_from_values(values))
        values = {name: value for name, value in values.items() if name not in info.key_columns}
        if info.nested:     # (as ``write``'s)
            copy_nested(values, info.nested, EXACT_DEPTH)
        self._modify(info, key, Entry(_INSERT, values), must_not_exist=not generated)
        return key[0] if len(key) == 1 else key

    def delete(self: Transaction, table: TableRef, key: Hashable) -> None:  # type: ignore[misc]
        """Delete row ``key`` if it exists."""
        self._check_active("delete")
        info = self.manager.catalog.table_info(table)
        key = info.key(key)
        self._modify(info, key, Entry(_DELETE))

    def _modify(self: Transaction, info: TableInfo, key: Key, entry: Entry, *,  # type: ignore[misc]
                must_not_exist: bool = False, lock: bool = True) -> None:
        slots = self.root._slots          # (``_slot(HotKeys, create=False)`` without its call: every write)
        hot = slots.get(HotKeys) if slots is not None else None
        if hot is not None and (info.name, key) in hot.plain_reads:
            hot.read_then_written.add(info.name)    # before the lock: a conversion may be the victim
        if lock:   # False: the node took a table lock covering the row (write_many)
            self.manager.locking.acquire(self, info, key, _WRITE)
        extensions = self.manager.extensions
        observed = False
        for wants in extensions.wants_old_images:
            if wants(info.name):
                observed = True
                break
        if entry.kind is _INSERT and not must_not_exist:
            old = None   # a fresh sequence value: no row
        else:
            observed = observed or must_not_exist
            # An insert's existence check is not validated at the flush (a concurrent insert
            # of the same key makes the flush's INSERT fail instead): no relied-on read.
            old = (_view.read_row(self, info, key, record=False, relied=not must_not_exist)
                   if observed else None)
        if must_not_exist and old is not None:
            raise DuplicateKey(
                f"insert into {info.name!r}: a row with key {key!r} already exists; use write() to upsert"
            )
        row = (info.name, key)
        if self._frame:
            write_in_parent(self, row, entry, info.name)
        else:
            if self.parent is not None:
                self._tree_rows.written.add(row)    # before the entry (``_view.TreeRows``)
            with self._mutex:
                previous = self._writes.get(row)
                self._writes[row] = previous.then(entry, info.name) if previous else entry
        recorder = self.manager.recorder
        if recorder:
            recorder.record("write", self.id, root=self.root.id, table=info.name, key=key, value=entry)
        if observed and (entry.kind is not _DELETE or old is not None):
            data_event(self, info, key, entry, old, extensions)


    def write_many(self: Transaction, table: TableRef,  # type: ignore[misc]
                   rows: Mapping[Hashable, Mapping[str, object] | None], *, lock: BulkLock = BulkLock.WRITE) -> int:
        """``write(table, key, **values)`` for every ``key: values`` of ``rows`` (``None``: ``delete``),
        with the same data events; ``lock=BulkLock.TABLE``: one table WRITE lock instead of one per row
        (``BulkLock.WRITE``, the default).  Returns the number of rows."""
        self._check_active("write_many")
        lock = BulkLock.parse(lock, "write_many(lock=...)", allowed=_WRITE_LOCKS)
        info = self.manager.catalog.table_info(table)
        try:
            items = rows.items()
        except AttributeError:
            raise TypeError(f"write_many({info.name!r}, rows) takes a mapping {{key: values or None}} (None deletes "
                            f"the row), got a {type(rows).__name__}; write {{key: {{'column': value}}}}, e.g. "
                            f"dict(pairs) for a list of (key, values) pairs") from None
        by_table = lock is BulkLock.TABLE
        if by_table:
            self.manager.locking.acquire(self, info, None, _WRITE)
        for given, values in items:
            key = info.key(given)
            if values is None:
                entry = Entry(_DELETE)
            else:
                try:
                    columns = dict(values)
                except (TypeError, ValueError):
                    raise TypeError(f"write_many({info.name!r}, rows): the values of row {given!r} are {values!r} "
                                    f"({type(values).__name__}), not a mapping of columns (or None, which deletes the "
                                    f"row); write {{key: {{'column': value}}}}") from None
                columns = info.values_without_key(key, columns)
                if info.nested:     # (as ``write``'s)
                    copy_nested(columns, info.nested, EXACT_DEPTH)
                entry = Entry(_PATCH, columns)
            self._modify(info, key, entry, lock=not by_table)
        return len(rows)


    def signal(self: Transaction, name: str, /, **payload: object) -> None:  # type: ignore[misc]
        """Raise an application event ``name`` with ``payload`` (rules on ``db.signalled(name)`` react; ``name`` is
        positional: a payload field named ``name`` is a value).  The event's payload is a copy, its lists and dicts
        too: changing a list given here afterwards changes no rule's event.  A field nested deeper than
        ``activedb.store.JSONABLE_DEPTH`` levels is refused: :class:`~activedb.errors.NestedTooDeep`."""
        if self._doomed is not None or self._state is not _ACTIVE:     # (``_check_active``'s call only to raise)
            self._check_active("signal")
        if not isinstance(name, str) or not name:      # (db.signalled refuses it: no rule could name the event)
            raise BadArgument(f"tx.signal({name!r}) takes the event's name, a non-empty text, as in "
                              f"db.signalled(name); e.g. tx.signal('status_changed', worker=...)")
        # (``payload``: the keyword arguments' own dict; its lists and dicts are the caller's: copied, ``own_image``)
        for value in payload.values():
            if type(value) in NESTED_TYPES:  # (``own_image`` inline for a payload of scalars, which has nothing to copy)
                payload = own_image(payload, fresh=True, levels=JSONABLE_DEPTH)
                break
        event = new_event(_SIGNAL, name, None, None, None, payload, None, self.id)
        for hook in self.manager.extensions.on_event:
            hook(self, event)

    def emit(self: Transaction, event_type: str, *, key: Hashable = None, ts: object = None,  # type: ignore[misc]
             payload: Mapping[str, object] | None = None) -> None:
        """Hand a stream event (``db.stream(event_type)``) to the rules, in this transaction.  ``ts``: the event's
        time, a finite number of seconds, an aware datetime, a :class:`~activedb.events.Timestamp` or
        :class:`~activedb.events.AccuracyInterval`, or None (no time); another value raises
        :class:`~activedb.errors.InvalidTime`, as a batch's or a stream's event with it is refused.  The event's
        payload is a copy of ``payload``, its lists and dicts too: changing ``payload`` afterwards changes no rule's
        event.  A field nested deeper than ``activedb.store.JSONABLE_DEPTH`` levels is refused:
        :class:`~activedb.errors.NestedTooDeep`, saying how deep it is."""
        if self._doomed is not None or self._state is not _ACTIVE:     # (``_check_active``'s call only to raise)
            self._check_active("emit")
        if not isinstance(event_type, str) or not event_type:  # (db.stream refuses it: no rule could name the event)
            raise BadArgument(f"tx.emit({event_type!r}) takes the event's type, a non-empty text, as in "
                              f"db.stream(event_type); e.g. tx.emit('reading', key=..., payload={{...}})")
        if ts is not None:
            # ``check_time`` inline for the common times (a finite float, an int a float holds, an aware datetime):
            # emit runs per event; anything else (a Timestamp, a subclass, a value to refuse) is judged by it.
            kind = ts.__class__
            if not (kind is float and ts - ts == 0.0 or kind is int and -_INT_SECONDS < ts < _INT_SECONDS  # type: ignore[operator]
                    or kind is _DATETIME and ts.tzinfo is not None):  # type: ignore[attr-defined]
                _check_emitted_ts(event_type, ts)
        try:
            values = dict(payload or {})
        except (TypeError, ValueError):
            raise BadArgument(f"tx.emit({event_type!r}, payload=...) takes a mapping of the event's values, got "
                              f"{payload!r} ({type(payload).__name__}); write payload={{'field': value}}") from None
        for value in values.values():       # (the payload as raised, its lists and dicts too: ``signal``'s)
            if type(value) in NESTED_TYPES:
                values = own_image(values, fresh=True, levels=JSONABLE_DEPTH)
                break
        event = new_event(_STREAM, event_type, key, None, None, values, ts, self.id)
        for hook in self.manager.extensions.on_event:
            hook(self, event)


_DATETIME = datetime.datetime
_INT_SECONDS = 2 ** 1023     # (an int within it is finite as a float; one beyond goes to ``check_time``)


def _check_emitted_ts(event_type: str, ts: object) -> None:
    """Raise :class:`InvalidTime` unless ``ts`` is a time an event takes (``check_time``'s, or a Timestamp or
    AccuracyInterval) — ``emit``'s check of the times it does not judge inline."""
    if isinstance(ts, (Timestamp, AccuracyInterval)):
        return
    try:
        check_time(ts, f"tx.emit({event_type!r}): ts")
    except InvalidTime as error:
        raise InvalidTime(f"{error}; give ts a finite number of seconds, an aware datetime (UTC) or an "
                          f"activedb.events.Timestamp, or leave it None (no time)") from None


def data_event(node: "Transaction", info: TableInfo, key: Key, entry: Entry, old: RowImage | None,
               extensions: "HookRegistry[TransactionExtension]") -> None:
    """The data event of ``node``'s change ``entry`` of row ``key`` (whose image was ``old``), heard by the
    extensions (``_modify``, once the entry is written)."""
    if entry.kind is _DELETE:
        kind, new = _DELETED, None
    else:
        new = entry.apply(old)
        if old is None:
            kind = _INSERTED
            # The stored row: every column (constant defaults for the ones not given) and the key.
            new = {**info.blank_row, **new, **info.full_key_row(key)}  # type: ignore[dict-item]  # (not a delete)
        else:
            kind = _UPDATED
        if info.nested:
            # The event's own lists and dicts: ``new``'s are the write entry's (and ``old``'s, for a column not
            # written), which a rule changing ``event.new["tags"]`` in place would change.
            copy_nested(new, info.nested)     # type: ignore[arg-type]  # (not a delete)
    event = new_event(kind, info.name, key[0] if len(key) == 1 else key, old, new, None, None, node.id)
    for hook in extensions.on_event:
        hook(node, event)


def write_in_parent(node: "Transaction", row: tuple[str, Key], entry: Entry, table: str) -> None:
    """The frame ``node`` writes ``entry`` into its parent's write set, composed with the parent's entry
    as its commit would compose it, and marks the row in ``node._undo``: (the parent's entry before the
    frame's first write of the row or None, the frame's own entry).  No mutex: the parent has no other
    child and its thread runs the frame (README, "Frames")."""
    parent: Transaction = node.parent  # type: ignore[assignment]  # (a frame has its parent; so has a frame's)
    while parent._frame:                     # a frame in a frame: the write set below both (README, "Frames in frames")
        parent = parent.parent  # type: ignore[assignment]
    if parent.parent is not None:
        node._tree_rows.written.add(row)    # the entry is on a node below the root (``_view.TreeRows``)
    writes = parent._writes
    current = writes.get(row)
    undo = node._undo
    mark = undo.get(row) if undo is not None else None
    own = mark[1].then(entry, table) if mark is not None else entry      # raises as the frame's own would
    composed = current.then(entry, table) if current is not None else entry
    if undo is None:
        node._undo = {row: (current, own)}
    elif mark is None:
        undo[row] = (current, own)
    else:
        undo[row] = (mark[0], own)
    writes[row] = composed


def take_back_writes(node: "Transaction", *, keep: bool) -> None:
    """The frame ``node``'s writes leave its parent's write set (each row's entry as it was before the
    frame's first write of it): discarded (it aborts), or ``keep``: its own write set from now on (it
    materializes).  Called by the frame's thread."""
    undo, node._undo = node._undo, None
    if keep:
        node._tree_rows.written.update(undo or ())     # before the entries: node is below the root
        node._writes = {row: own for row, (_, own) in undo.items()} if undo else {}
    if not undo:
        return
    parent: Transaction = node.parent  # type: ignore[assignment]  # (as in ``write_in_parent``)
    while parent._frame:                     # the write set its writes are in (``write_in_parent``)
        parent = parent.parent  # type: ignore[assignment]
    with parent._mutex:
        if parent._state is _ABORTED:
            return                               # its write set is gone with it
        writes = parent._writes
        for row, (previous, _) in undo.items():
            if previous is None:
                writes.pop(row, None)
            else:
                writes[row] = previous


def _generated_key(node: "Transaction", info: TableInfo, values: Mapping[str, object]) -> dict[str, object]:
    """The key column of ``info`` with the next value of its sequence (for ``node``'s tree); ``values``: the
    insert's, a key column of them missing."""
    if len(info.key_columns) != 1:      # (no sequence draws a key of several columns)
        missing = [name for name in info.key_columns if values.get(name) is None]
        raise InvalidKey(f"insert into {info.name!r} needs the key columns {', '.join(info.key_columns)}: give "
                         f"{', '.join(missing)}; {Checked.WRITE.undone}")
    column = info.key_columns[0]
    catalog = node.manager.catalog
    sequence = catalog.sequence_of(info, column)
    if sequence is None:
        default = getattr(getattr(info.columns[column].server_default, "arg", None), "text", None)
        if default is not None:
            # A default that is no sequence (``gen_random_uuid()``) is computed at the INSERT, but the key is needed
            # before it is sent (the row's lock, the write set).
            raise InvalidKey(
                f"insert into {info.name!r} needs a value for the key column {column!r}: its default ({default}) is "
                f"no identity or serial sequence, which activedb cannot draw before the row is sent; give the key "
                f"(e.g. {column}=uuid.uuid4() for a uuid); {Checked.WRITE.undone}")
        raise InvalidKey(
            f"insert into {info.name!r} needs a value for the key column {column!r} "
            f"(it has no identity or serial default); {Checked.WRITE.undone}")
    return {column: catalog.next_generated_key(sequence, node.root.began_at)}
