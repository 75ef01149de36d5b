"""The lean run: while a top-level transaction is exclusive, its inline subtransactions are *savepoints* of a run kept
in the root — frames carried to their end (README, "The lean run").

A :class:`Savepoint` is a :class:`~activedb.txn.Transaction` (the same layout: its class changes in place when it
is decoded) whose frame fields are encoded in its root's undo and grants logs; the hot operations (``read``,
``write``, ``insert``, ``delete``) run here when the root's records answer them, anything else first
decodes the chain into the frames it encodes (:meth:`Savepoint._decode`).  The encoding, what decodes it and why it is
equivalent: README, "The lean run".

Thread-safety: a live savepoint is used by the thread that runs its root's run (``Transaction._lean_thread``) and
decoded only there; other threads read what the pictures need (``id``, ``state``, ``parent``, ``children``,
``_grants``, ``_grants_retained``, ``depth``) and doom it, as they do a frame's.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Callable, Hashable, Iterable, Mapping

import lockmgr
from lockmgr import Mode, TxnState

from activedb.errors import DuplicateKey, TransactionAborted
from activedb.store import Checked, Entry, EntryKind, RowImage, TableRef, copy_nested
from activedb.txn import _children
from activedb.txn._children import _EMPTY, run_inline
from activedb.txn._hotkeys import HotKeys
from activedb.txn._participants import CommitParticipant
from activedb.txn._reads import BulkLock
from activedb.txn._locking import _COVERS, _INTENTION, _JOIN, _forget_grants
from activedb.txn._tree import _NO_LOG, _NONE, Transaction
from activedb.txn._writes import data_event

if TYPE_CHECKING:  # pragma: no cover
    from lockmgr import Grant

    from activedb.store import Key, TableInfo

    _Row = tuple[str, Key]
    #: An undo-log record: the row, the root's entry before the write (None: none), the entry written.
    _UndoRecord = tuple[_Row, Entry | None, Entry]
    _Marks = dict[_Row, tuple[Entry | None, Entry]]

_ACTIVE, _COMMITTED, _ABORTED, _COMMITTING = (TxnState.ACTIVE, TxnState.COMMITTED, TxnState.ABORTED,
                                             TxnState.COMMITTING)
_PATCH, _INSERT, _DELETE = EntryKind.PATCH, EntryKind.INSERT, EntryKind.DELETE
_READ, _WRITE = Mode.READ, Mode.WRITE
_UNCHANGED = lockmgr.UNCHANGED
_get_ident = threading.get_ident
_new_node = object.__new__

# The slots of a frame a savepoint computes or keeps as a class constant (written through these when it decodes).
_ID = Transaction.__dict__["id"]
_INFO = Transaction.__dict__["info"]
_SET_ID = _ID.__set__


def _id(node: "Savepoint") -> str:
    """The savepoint's id: its parent's and its number, formatted the first time it is asked for (a frame formats
    it when it is made)."""
    value: str | int = _ID.__get__(node, Savepoint)
    if value.__class__ is int:
        value = f"{node.parent.id}.{value}"     # _ids.child_id
        _ID.__set__(node, value)
    return str(value)


def _info(node: "Savepoint") -> dict[str, object]:
    try:
        value: dict[str, object] = _INFO.__get__(node, Savepoint)
    except AttributeError:
        value = {}
        _INFO.__set__(node, value)
    return value


def _log_end(node: "Savepoint", log: "list[_UndoRecord] | list[Grant]", field: str) -> int:
    """Where ``node``'s part of ``log`` ends: where its live child's starts, or the log's end."""
    child = node._lazy_child
    return int(getattr(child, field)) if type(child) is Savepoint else len(log)


def _undo(node: "Savepoint") -> "_Marks | None":
    """The frame's undo marks ``{row: (entry before its first write of the row, its own entry)}`` (``_writes.
    write_in_parent``), from its part of the undo log; None for a savepoint that has ended."""
    if node._state is not _ACTIVE:
        return None
    log = node.root._lean_undo
    marks: _Marks = {}
    for row, previous, entry in log[node._undo_at:_log_end(node, log, "_undo_at")]:
        mark = marks.get(row)
        marks[row] = (previous, entry) if mark is None else (mark[0], mark[1].then(entry, row[0]))
    return marks or None


def _grants(node: "Savepoint") -> "list[Grant] | None":
    """The frame's grants (``_locking.Locking._grant_lazily``'s list), from its part of the grants log."""
    if node._state is not _ACTIVE:
        return None
    log = node.root._lean_grants
    return log[node._grants_at:_log_end(node, log, "_grants_at")]


def _grants_retained(node: "Savepoint") -> int:
    return node._held_from - node._grants_at if node._state is _ACTIVE else 0


def _children_of(node: "Savepoint") -> list[Transaction]:
    child = node._lazy_child
    return [] if child is None else [child]


class Savepoint(Transaction):
    """An inline subtransaction of an exclusive tree, encoded in its root's run (module docstring)."""

    __slots__ = ()

    parent: Transaction        # (never None: a savepoint is a child)
    root: Transaction

    _encoded = True
    # What every frame has (``Transaction._new_frame``), as constants: read as a frame's, never written.  (The empty
    # read-only mappings and tuples stand for a frame's empty dicts and lists: typed as those.)
    began_at = None
    _children = _tasks = _writes = _db_reads = _EMPTY
    _scans = _participants = _NONE
    _read_base = None
    _holds = False
    _lazy = _frame = True
    _modes_held = _modes_retained = None
    # What a frame keeps and a savepoint computes (never written while encoded).
    id = property(_id)
    info = property(_info)
    depth = property(lambda node: node.parent.depth + 1)
    _undo = property(_undo)
    _grants = property(_grants)
    _grants_retained = property(_grants_retained)
    children = property(_children_of)

    # --- decoding: the frames it encodes --------------------------------------------------------------

    def _decode(self) -> None:
        """Write out the frames this savepoint's run encodes (every live savepoint of its root, outermost first: each
        a frame from now on, with the undo marks and grants of its part of the logs) and empty the logs; a savepoint
        that has ended decodes alone.  Called by the thread running the root's run."""
        root = self.root
        if self._state is not _ACTIVE or type(root._lazy_child) is not Savepoint:
            _write_out(self, None, None, _get_ident())
            return
        if root._lean_thread != _get_ident():
            raise RuntimeError(f"savepoint {self.id} of the lean run of {root.id} is decoded by another thread than "
                               f"the one running it (activedb bug)")
        chain: list[Savepoint] = []
        node: Transaction | None = root._lazy_child
        while isinstance(node, Savepoint):
            chain.append(node)
            node = node._lazy_child
        fields = [(node, node._undo, node._grants, node._grants_retained) for node in chain]
        for node, undo, grants, retained in fields:
            _write_out(node, undo, grants, root._lean_thread, retained)
        root._lean_undo.clear()
        root._lean_grants.clear()

    def _fallback(self) -> Transaction:
        self._decode()
        return self

    # --- the operations it answers from the root's records -----------------------------------------

    def read(self, table: TableRef, key: Hashable, *, for_update: bool = False) -> RowImage | None:
        if (for_update or self._doomed is not None or self._state is not _ACTIVE or self._lazy_child is not None):
            return self._fallback().read(table, key, for_update=for_update)
        manager = self.manager
        root = self.root
        info = manager.catalog.table_info(table)
        key = info.key(key, Checked.READ)
        name = info.name
        row = (name, key)
        slots = root._slots
        hot = slots.get(HotKeys) if slots is not None else None
        entry = root._writes.get(row)
        reads = root._db_reads
        if ((hot is not None and name in hot.update_intent) or name in manager.locking._granularity
                or ((entry is None or entry.kind is _PATCH) and row not in reads)
                or not _lock(self, root, name, key, row, _READ)):
            return self._fallback().read(table, key)
        (hot or root._slot(HotKeys)).plain_reads.add(row)
        if entry is None:
            image = reads[row]          # (the image the root relied on: the caller gets a copy, ``_view.read_row``)
            if image is None:
                return None
            return image.copy() if not info.nested else copy_nested(image.copy(), info.nested)
        return _image(self, root, info, key, row, entry, reads, True)

    def _modify(self, info: "TableInfo", key: "Key", entry: Entry, *, must_not_exist: bool = False,
                lock: bool = True) -> None:
        """``Writes._modify`` of a frame (``write``, ``insert``, ``delete`` call it), in the root's write set with the
        undo log (README, "The lean run")."""
        if self._lazy_child is not None:           # (its object used inside its child's block)
            self._decode()
            Transaction._modify(self, info, key, entry, must_not_exist=must_not_exist, lock=lock)
            return
        root = self.root
        manager = self.manager
        name = info.name
        row = (name, key)
        extensions = manager.extensions
        observed = must_not_exist
        if not observed:
            for wants in extensions.wants_old_images:
                if wants(name):
                    observed = True
                    break
        writes = root._writes
        current = writes.get(row)
        reads = root._db_reads
        needs_old = observed and (entry.kind is not _INSERT or must_not_exist)
        slots = root._slots          # (the hot-key note of ``Writes._modify``, before the lock)
        hot = slots.get(HotKeys) if slots is not None else None
        if hot is not None and row in hot.plain_reads:
            hot.read_then_written.add(name)
        if (not lock or name in manager.locking._granularity
                or (needs_old and (current is None or current.kind is _PATCH) and row not in reads)
                or not _lock(self, root, name, key, row, _WRITE)):
            self._decode()
            Transaction._modify(self, info, key, entry, must_not_exist=must_not_exist, lock=lock)
            return
        old = None
        if needs_old:
            if current is None:
                old = reads.get(row)        # (the image the root relied on: the event's ``old`` is a copy of it)
                if old is not None:
                    old = old.copy() if not info.nested else copy_nested(old.copy(), info.nested)
            else:
                old = _image(self, root, info, key, row, current, reads, False)
            if must_not_exist and old is not None:
                raise DuplicateKey(
                    f"insert into {name!r}: a row with key {key!r} already exists; use write() to upsert")
        # (Composing with the entry before raises exactly when composing the savepoint's own entries would: the
        # write-set composition table, README "The lean run".)
        composed = current.then(entry, name) if current is not None else entry
        root._lean_undo.append((row, current, entry))
        writes[row] = composed
        recorder = manager.recorder
        if recorder:
            recorder.record("write", self.id, root=root.id, table=name, key=key, value=entry)
        if observed and (entry.kind is not _DELETE or old is not None):
            data_event(self, info, key, entry, old, extensions)

    # --- everything else: decoded first ------------------------------------------------------------

    def prefetch(self, table: TableRef, keys: Iterable[Hashable]) -> int:
        return self._fallback().prefetch(table, keys)

    def read_many(self, table: TableRef, keys: Iterable[Hashable], *, lock: BulkLock = BulkLock.READ
                  ) -> dict[Hashable, RowImage | None]:
        return self._fallback().read_many(table, keys, lock=lock)

    def scan(self, table: TableRef, where: Mapping[str, object] | Callable[[RowImage], bool] | None = None
             ) -> list[RowImage]:
        return self._fallback().scan(table, where)

    def write_many(self, table: TableRef, rows: Mapping[Hashable, Mapping[str, object] | None], *,
                   lock: BulkLock = BulkLock.WRITE) -> int:
        return self._fallback().write_many(table, rows, lock=lock)

    def _enlist(self, participant: CommitParticipant) -> None:
        self._fallback()._enlist(participant)

    def _wait_children(self, timeout: float | None = None) -> None:
        """A savepoint has no spawned children (a spawn decodes it first): nothing to wait for."""

    def commit(self) -> None:
        """Called by user code inside its own block (its end is ``end``): it goes on as its frame would."""
        self._fallback().commit()

    def abort(self, reason: BaseException | str | None = None) -> None:
        """The frame's abort (``Transaction.abort``), on the logs: the entries it wrote leave the root's write set,
        its grants are undone (Rule 4, ``LockManager.undo_retains``)."""
        root = self.root
        if self._lazy_child is not None or self._state is not _ACTIVE or root._state is not _ACTIVE:
            self._decode()
            Transaction.abort(self, reason)
            return
        error = reason if isinstance(reason, BaseException) else TransactionAborted(str(reason or "aborted"))
        if self._doomed is None:
            self._doomed = error
        self._state = _ABORTED
        log = root._lean_undo
        at = self._undo_at
        if len(log) > at:
            writes = root._writes
            for row, previous, _ in reversed(log[at:]):
                if previous is None:
                    writes.pop(row, None)
                else:
                    writes[row] = previous
            del log[at:]
        manager = self.manager
        granted = root._lean_grants
        at = self._grants_at
        self.parent._lazy_child = None
        if len(granted) > at:
            grants = granted[at:]
            del granted[at:]
            try:
                manager.locks.undo_retains(root.id, grants)
            except lockmgr.LockError:
                pass
            _forget_grants(root, grants)
        if manager.recorder:
            manager.recorder.record("abort", self.id, parent=self.parent.id, root=root.id,
                                    detail=repr(reason) if reason is not None else None)
        manager.extensions.call("after_end", self, False)
        manager.observers.call("on_abort", self, error)


def _decoding(name: str) -> property:
    """A frame's field a savepoint neither keeps nor computes: reading it goes on with the frame it encodes.  (A property
    per field, not ``__getattr__``: a class with one loses the interpreter's fast attribute loads on every field.)"""
    field = Transaction.__dict__[name]
    return property(lambda node: field.__get__(node._fallback(), Transaction), field.__set__)


for _name in ("_mutex", "_thread", "_tree_rows", "_lean_undo", "_lean_grants", "_lean_thread"):
    setattr(Savepoint, _name, _decoding(_name))


def _write_out(node: Savepoint, undo: "_Marks | None", grants: "list[Grant] | None", thread: int,
               retained: int = 0) -> None:
    """``node`` becomes the frame it encodes: its class is ``Transaction`` again and every field a frame has is set
    (``Transaction._new_frame``), the undo marks and grants given."""
    node_id, info, depth = node.id, node.info, node.depth
    node.__class__ = Transaction    # type: ignore[assignment]  # (in place: the same layout, ``__slots__ = ()``)
    node.id, node.info, node.depth = node_id, info, depth
    node.began_at = None
    node._tree_rows = node.root._tree_rows
    node._read_base = None
    node._mutex = threading.Lock()
    node._children = node._tasks = node._writes = _EMPTY
    node._db_reads = {}
    node._scans = node._participants = _NONE
    node._thread = thread
    node._holds = False
    node._lazy = node._frame = True
    node._modes_held = node._modes_retained = None
    node._grants = grants
    node._grants_retained = retained
    node._undo = undo
    node._lean_undo = node._lean_grants = _NO_LOG
    node._lean_thread = 0


def _lock(node: Savepoint, root: Transaction, name: str, key: "Key", row: "_Row", mode: Mode) -> bool:
    """``node``'s request for ``row`` in ``mode``, when it is answered as a frame's is by ``Locking._grant_lazily``
    with the root as the grantee and no table-level lock of the chain: the table's intention lock from the root's
    retains (a grant that changes nothing), the row from them or from ``try_retain``.  False: the frame would ask
    otherwise (its intention lock not retained yet, a row that is not grantable at once) — nothing was granted."""
    record = root._modes_retained
    if record is None:
        return False
    intention = _INTENTION[mode]
    kept = record.get(name)
    if kept is None or not _COVERS[kept][intention]:
        return False
    log = root._lean_grants
    log.append((("table", name), intention, _UNCHANGED))
    kept = record.get(row)
    resource = ("row", name, key)
    if kept is not None and _COVERS[kept][mode]:
        log.append((resource, mode, _UNCHANGED))
        return True
    try:
        granted = node.manager.locks.try_retain(root.id, resource, mode, log)
    except lockmgr.LockError:
        granted = False
    if not granted:
        log.pop()
        return False
    record[row] = mode if kept is None else _JOIN[kept][mode]
    return True


def _image(node: Savepoint, root: Transaction, info: "TableInfo", key: "Key", row: "_Row", entry: Entry,
           reads: "dict[_Row, RowImage | None]", record: bool) -> RowImage | None:
    """The row as ``node`` sees it (``_view.read_row``): ``entry`` of the root's write set over the image the root
    relied on (needed only under a PATCH); ``record``: the history recorder hears the read."""
    base = reads.get(row) if entry.kind is _PATCH else None
    image = entry.apply(base)
    if image is not None and base is None:
        image = {**info.blank_row, **image, **info.full_key_row(key)}
    if image is not None and info.nested:
        copy_nested(image, info.nested)     # (its lists and dicts are the entries' and the relied-on image's)
    recorder = node.manager.recorder
    if recorder and record:
        recorder.record("read", node.id, root=root.id, table=info.name, key=key, value=image,
                        source=_source(node, root, row))
    return image


def _source(node: Savepoint, root: Transaction, row: "_Row") -> str:
    """Who wrote what ``node`` reads of ``row`` as the recorder names it (``_view.read_row``): the innermost
    savepoint whose part of the undo log has the row, else the root."""
    log = root._lean_undo
    for index in range(len(log) - 1, -1, -1):
        if log[index][0] == row:
            writer: Transaction = node
            while writer._undo_at > index:      # (the root's is 0: it stops there at the latest)
                parent = writer.parent
                assert parent is not None
                writer = parent
            return "own" if writer is node else f"ancestor:{writer.id}"
    return f"ancestor:{root.id}"


# --- opening and ending savepoints (``run_inline`` and ``_begin_inline`` call these) ----------------------------

def open_savepoint(parent: Transaction, name: str | None, slots: "dict[type, object] | None") -> Savepoint | None:
    """A savepoint child of ``parent`` (``_children._open_frame`` for the lean run), or None: ``parent`` is neither a
    running savepoint nor a root that is exclusive (no live child, run by this thread), or something hears of frames."""
    manager = parent.manager
    if manager.subtransactions is not _children._FRAMES or manager.observers.hears_nodes or \
            manager.extensions.hooked_in_frames:
        return None
    if type(parent) is Savepoint:
        if parent._lazy_child is not None:
            return None
        root = parent.root
    elif (parent.parent is not None or parent._lazy_child is not None or parent._children
            or type(parent._read_base) is not _CommittedRows):
        return None
    else:
        root = parent
    if parent._doomed is not None or parent._state is not _ACTIVE:
        parent._check_active("starting a subtransaction")
    if parent is root:
        if root._holds:
            manager.locking.release_holds(root)
        root._lean_thread = _get_ident()
        at, granted = 0, len(root._lean_grants)
    else:
        at, granted = len(root._lean_undo), len(root._lean_grants)
        parent._held_from = granted        # what it was granted so far it retains now (``retain_grants``)
    node = _new_node(Savepoint)
    node.manager = manager
    node.parent = parent
    node.root = root
    _SET_ID(node, next(manager._ids))
    node.name = name
    node.subtransactions_committed = 0
    node._state = _ACTIVE
    node._slots = slots
    node._doomed = node._lazy_child = None
    node._end_hooks = False
    node._undo_at = at
    node._grants_at = node._held_from = granted
    parent._lazy_child = node
    recorder = manager.recorder
    if recorder:
        recorder.record("begin", node.id, parent=parent.id, root=root.id)
        recorder.record("spawn", parent.id, root=root.id, detail=node.id)
    return node


def _doom(node: Savepoint) -> BaseException | None:
    """``node._doomed`` read through a call: after one that may have doomed the node (a hook), where a test of it
    before the call would leave the type checker taking it for still None."""
    return node._doomed


def end(node: Savepoint) -> None:
    """The commit of a savepoint whose body returned (``Transaction.commit`` and ``_end_frame`` of its frame): its
    end hooks if it asked for them, then Rule 2 on the logs — its writes and grants are its parent's part from now
    on (the root's own, once its parent is the root: the logs empty)."""
    manager = node.manager
    extensions = manager.extensions
    if (node._doomed is not None or node._state is not _ACTIVE or manager.observers.hears_nodes
            or extensions.hooked_in_frames):      # (something that hears of frames was registered meanwhile)
        node._decode()
        node.commit()
        return
    if node._end_hooks:
        try:
            for hook in extensions.before_commit:
                hook(node)
        except BaseException as error:
            node.abort(error)
            raise
        if type(node) is not Savepoint:       # the hooks decoded it (a deferred cycle that spawned, waited, ...)
            node._commit_after_hooks()
            return
        doomed = _doom(node)                  # (a hook may have doomed it: read anew)
        if doomed is not None:
            aborted = TransactionAborted(f"transaction {node.id} was aborted ({doomed})")
            node.abort(aborted)
            raise aborted from doomed
    parent = node.parent
    if (parent._state is not _ACTIVE and parent._state is not _COMMITTING) or parent._doomed is not None:
        failure = TransactionAborted(f"the parent {parent.id} of {node.id} was aborted")
        node.abort(failure)
        raise failure
    parent.subtransactions_committed += 1 + node.subtransactions_committed
    parent._lazy_child = None
    root = node.root
    if parent is root:
        root._lean_undo.clear()
        root._lean_grants.clear()
    else:
        parent._held_from = len(root._lean_grants)   # its committed child's grants it retains (Rule 2)
    node._state = _COMMITTED
    if manager.recorder:
        manager.recorder.record("commit", node.id, parent=parent.id, root=root.id)
    if node._end_hooks:      # (without them no extension hears its end: none hooks frames, as checked above)
        for hook in extensions.after_end:
            hook(node, True)


from activedb.txn._view import CommittedRows as _CommittedRows  # noqa: E402

_children.Savepoint = Savepoint
_children.open_savepoint = open_savepoint
_children.end_savepoint = end      # type: ignore[assignment]  # (``run_inline`` calls it on a Savepoint only)
__all__ = ["Savepoint", "run_inline"]
