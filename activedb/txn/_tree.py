"""A node of a transaction tree: its state machine, its children, its operations.

The node delegates: locking to :mod:`activedb.txn._locking`, what it sees to :mod:`activedb.txn._view`,
the top-level commit to :mod:`activedb.txn._flush`; extensions (the rule manager) and observers hear of
its life through the manager's registries (:mod:`activedb.txn._hooks`).  See ``README.md`` in this
package for the whole design: what a node sees, what the flush validates, the mutex order.

State machine (``TxnState``, shared with ``lockmgr``)::

    ACTIVE ──commit()──▶ COMMITTING ──▶ COMMITTED
      │                      │
      └──────abort()─────────┴──────▶ ABORTED

Every operation checks the state it needs (``_check_active``) and says what to do otherwise.

Thread-safety: a ``Transaction`` is used by the thread running it (``_thread``); its parent's and
children's threads touch it only through ``_mutex``, which protects ``_state``, ``_children``, ``_tasks``,
``_writes``, ``_db_reads``, ``_scans``, ``_participants`` and ``_slots``.  Order: a child's
``_mutex`` before its parent's, never the reverse; no ``_mutex`` is held while calling the lock manager,
PostgreSQL, a hook or user code.
"""

from __future__ import annotations

import datetime
import logging
import threading
import time
import types
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, TypeVar

from lockmgr import Deadlock, Mode, TxnState

from activedb.errors import (
    DuplicateKey,
    InvalidKey,
    SerializationConflict,
    TransactionAborted,
    TransactionError,
)
from activedb.events import Event, EventKind
from activedb.store import Entry, EntryKind, Key, TableInfo
from activedb.txn import _bulk, _flush, _ids, _view
from activedb.txn._hotkeys import HotKeys
from activedb.txn._participants import CommitParticipant
from activedb.txn._pool import Task

if TYPE_CHECKING:  # pragma: no cover
    from activedb.txn._manager import TransactionManager
    from activedb.txn._view import ReadBase

logger = logging.getLogger("activedb.transaction")

SlotType = TypeVar("SlotType")


_EMPTY: Mapping = types.MappingProxyType({})   # a node's children or tasks until its first (read-only)
_NONE: tuple = ()                              # its scans or participants until its first


class SubtransactionHandle:
    """The handle ``spawn`` returns: ``result(timeout)``, ``wait(timeout)``, ``done()``, ``state``."""

    def __init__(self, transaction: "Transaction", task: Task):
        self.transaction = transaction
        self._task = task

    @property
    def state(self) -> TxnState:
        return self.transaction.state

    def done(self) -> bool:
        return self._task.done()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until the subtransaction ended (runs it here if no worker started it)."""
        task = self._task
        if task.done():
            return True
        with self.transaction.parent._waiting_for(self.transaction):
            return task.wait(timeout)

    @staticmethod
    def wait_all(handles: "list[SubtransactionHandle]") -> None:
        """Wait until every one of ``handles`` (children of one parent) ended, running queued ones in this
        thread: one wait of the parent for all of them (one registration in the wait-for graph, with an
        edge to each), not one per handle."""
        pending = [handle for handle in handles if not handle._task.done()]
        if not pending:
            return
        if len(pending) == 1:
            pending[0].wait()
            return
        parent = pending[0].transaction.parent
        manager = parent.manager
        with manager.waiting(parent, "children", None, targets=[handle.transaction.id for handle in pending]):
            for handle in pending:
                handle._task.wait(None)     # runs it in this thread if no worker has started it

    def result(self, timeout: float | None = None) -> Any:
        """The function's return value once the subtransaction committed; re-raises its error."""
        if not self.wait(timeout):
            raise TimeoutError(f"subtransaction {self.transaction.id} did not end within {timeout} s")
        if self._task.error is not None:
            raise self._task.error
        return self._task.result

    def __repr__(self) -> str:
        return f"<SubtransactionHandle {self.transaction.id} {self.state.value}>"


class Transaction:
    """A node of a transaction tree.  See the module docstring."""

    __slots__ = ("manager", "parent", "root", "depth", "id", "name", "began_at", "info", "subtransactions_committed",
                 "_mutex", "_state", "_children", "_tasks", "_writes", "_db_reads", "_scans", "_participants",
                 "_slots", "_doomed", "_thread", "_read_base", "_holds", "_lazy", "_lazy_child", "_table_held",
                 "_table_retained", "_implied", "__weakref__")

    def __init__(self, manager: "TransactionManager", parent: "Transaction | None", *,
                 name: str | None = None, read_base: "ReadBase | None" = None, inline: bool = False,
                 lazy: bool = False):
        self.manager = manager
        self.parent = parent
        self.root: Transaction = parent.root if parent is not None else self
        self.depth = parent.depth + 1 if parent is not None else 0
        number = next(manager._ids)
        self.id = f"{parent.id}.{number}" if parent is not None else _ids.top_level_id(number)   # _ids.child_id
        self.name = name
        # When the tree began (the transaction log's began_at); only a top-level transaction needs it.
        self.began_at = datetime.datetime.now(datetime.timezone.utc) if parent is None else None
        #: Free-form JSON annotations of this transaction; a top-level transaction's are written into
        #: its transaction-log row (``activedb_transaction_log.info``).
        self.info: dict[str, Any] = {}
        self.subtransactions_committed = 0
        self._mutex = threading.Lock()
        # Invariant: _state only moves ACTIVE -> COMMITTING -> COMMITTED, or to ABORTED from a non-final state.
        self._state = TxnState.ACTIVE
        # Invariant: exactly the children that have not ended (a child removes itself once it committed
        # or aborted: a long tree — a micro-batch of events — keeps no finished nodes alive).
        # (``_children``, ``_tasks``, ``_scans`` and ``_participants`` start as shared empty read-only values
        # and get their own container on first use: a tree may hold thousands of nodes until it commits, and
        # every container is work for the garbage collector.)
        self._children: dict[str, Transaction] = _EMPTY
        self._tasks: dict[str, Task] = _EMPTY
        self._writes: dict[tuple[str, Key], Entry] = {}
        # Committed images this node relied on (None: no row), validated at the flush (see _view).
        self._db_reads: dict[tuple[str, Key], dict | None] = {}
        self._scans: list[tuple[str, Any, dict]] = _NONE
        self._participants: list[CommitParticipant] = _NONE
        self._slots: dict[type, Any] | None = None
        self._doomed: BaseException | None = None
        # The thread that runs this node's operations (set again by a spawned child's worker).
        self._thread = threading.get_ident()
        # True once an operation of this node took a lock since its holds were last made retained
        # (written by the node's thread only).
        self._holds = False
        # The tree's read base (see _view.ReadBase); only the root has one.
        self._read_base = (read_base or manager.read_base) if parent is None else None
        # True while this inline child has no lock-manager transaction of its own: its locks are taken in
        # its parent's name (README, "Lazy inline subtransactions"); ``materialize`` ends it.
        self._lazy = lazy
        # This node's live lazy child, if any (while it runs, what this node holds is the child's).
        self._lazy_child: Transaction | None = None
        # What this node holds and retains at table level, per table (intention modes included), as far as
        # its own successful requests tell (``_locking.py``, "intention locks answered from retains"); and,
        # on a lazy node, the intention locks answered from its parent's retained ones.  Written by the
        # node's thread only.
        self._table_held: dict[str, Mode] | None = None
        self._table_retained: dict[str, Mode] | None = None
        self._implied: dict[str, Mode] | None = None
        if not lazy:
            manager.locking.begin(self, awaited=inline)
        recorder = manager.recorder
        if recorder:
            recorder.record("begin", self.id, parent=parent.id if parent is not None else None, root=self.root.id)

    # --- state ----------------------------------------------------------------------------

    @property
    def state(self) -> TxnState:
        return self._state

    @property
    def is_top_level(self) -> bool:
        return self.parent is None

    @property
    def children(self) -> list["Transaction"]:
        with self._mutex:
            return list(self._children.values())

    def ancestors(self) -> Iterator["Transaction"]:
        node = self.parent
        while node is not None:
            yield node
            node = node.parent

    @property
    def log_id(self) -> str:
        """The id of this tree's row in ``activedb_transaction_log``."""
        return _ids.log_id(self.manager.process_tag, self.root.id)

    def _check_active(self, operation: str) -> None:
        if self._doomed is not None:
            raise TransactionAborted(
                f"{operation} in transaction {self.id}: it was aborted ({self._doomed}); "
                f"start a new transaction"
            ) from self._doomed
        state = self._state
        if state is not TxnState.ACTIVE:
            raise TransactionError(
                f"{operation} in transaction {self.id}, which is {state.value}; operations are only allowed "
                f"while it is active — start a new transaction"
            )

    def doom(self, reason: BaseException) -> None:
        """Mark this node and its active descendants for abort (they raise at their next operation)."""
        pending = [self]
        while pending:
            node = pending.pop()
            if node._doomed is None and node._state in (TxnState.ACTIVE, TxnState.COMMITTING):
                node._doomed = reason
            pending.extend(node.children)

    # --- extension seams ------------------------------------------------------------------------

    def enlist(self, participant: CommitParticipant) -> None:
        """Make ``participant`` take part in the top-level commit (see ``CommitParticipant``).  Enlisted in
        a subtransaction, it moves to the parent when the subtransaction commits and is dropped (its
        ``aborted`` called) if it aborts.  Allowed while the transaction is active or waiting for its
        children to commit."""
        if not isinstance(participant, CommitParticipant):
            raise TypeError(f"enlist() takes a CommitParticipant, got {participant!r}")
        # Also while COMMITTING (waiting for its children, before it delegates or flushes): a running child
        # may enlist in its root (the outbox does); the commit reads the list only after every child ended.
        if not (self._state is TxnState.COMMITTING and self._doomed is None):
            self._check_active("enlist")
        with self._mutex:
            if self._participants is _NONE:
                self._participants = []
            self._participants.append(participant)

    def slot(self, kind: type[SlotType], *, create: bool = True) -> SlotType | None:
        """This transaction's object of type ``kind`` (one per type, created with ``kind()`` on first use;
        ``create=False``: None if there is none).  A package keeps its per-transaction state here, in a
        type it owns (e.g. the rule manager's ``RuleContext``), instead of attributes on the transaction."""
        slots = self._slots
        if slots is not None:
            value = slots.get(kind)
            if value is not None or not create:
                return value
        elif not create:
            return None
        with self._mutex:
            if self._slots is None:
                self._slots = {}
            value = self._slots.get(kind)
            if value is None:
                value = self._slots[kind] = kind()
        return value

    # --- reads ----------------------------------------------------------------------------

    def read(self, table: Any, key: Any, *, for_update: bool = False) -> dict | None:
        """The row with primary key ``key`` as a dict, or None; takes a READ lock.  ``for_update=True``: read
        with intent to write it — an UPDATE lock (two read-modify-writes of the row queue here instead of
        deadlocking when both upgrade), and the row locked in PostgreSQL until the tree commits (see
        ``_rowlocks.py``)."""
        self._check_active("read")
        info = self.manager.catalog.table_info(table)
        key = info.key(key)
        hot = self.root.slot(HotKeys, create=False)
        if for_update or (hot is not None and info.name in hot.update_intent):
            self.manager.locking.acquire(self, info, key, Mode.UPDATE)
            return _view.read_row(self, info, key, for_update=True)
        self.manager.locking.acquire(self, info, key, Mode.READ)
        (hot or self.root.slot(HotKeys)).plain_reads.add((info.name, key))
        return _view.read_row(self, info, key)

    def read_then_written(self) -> frozenset[str]:
        """The tables of which this tree read a row plainly (``tx.read`` without ``for_update``) and then
        wrote it: where two such trees convert their read locks to write locks and one must give way.
        ``Database.run`` learns them from an attempt that failed (see README, "Hot keys")."""
        hot = self.root.slot(HotKeys, create=False)
        return frozenset(hot.read_then_written) if hot is not None else frozenset()

    def prefetch(self, table: Any, keys: Any) -> int:
        """Read-lock ``keys`` of ``table`` and load their committed images in one query, so that
        later reads in this tree (this node and its descendants) need no round trip.  Returns the
        number of rows found.  Useful before processing a batch of events on known keys."""
        self._check_active("prefetch")
        info = self.manager.catalog.table_info(table)
        wanted = []
        for key in keys:
            key = info.key(key)
            row = (info.name, key)
            if any(row in node._db_reads or row in node._writes for node in (self, *self.ancestors())):
                continue
            wanted.append(key)
        wanted = list(dict.fromkeys(wanted))
        locking = self.manager.locking
        for key in wanted:
            locking.acquire(self, info, key, Mode.READ)
        if not wanted:
            return 0
        return self.root._read_base.read_many(self, info, wanted)

    def read_many(self, table: Any, keys: Any, *, lock: str = "read") -> dict[Any, dict | None]:
        """The rows ``keys`` of ``table`` as this transaction sees them, ``{key: dict or None}``, with
        their committed images loaded in one query.  ``lock``: ``"read"`` (READ row locks, as
        ``prefetch``), ``"write"`` (WRITE row locks now: no upgrade when the rows are written later),
        ``"table"`` (one WRITE lock on the table, no row locks).  See ``_bulk.py``."""
        return _bulk.read_many(self, table, keys, lock)

    def write_many(self, table: Any, rows: Mapping[Any, Mapping[str, Any] | None], *, lock: str = "row") -> int:
        """``write(table, key, **values)`` for every ``key: values`` of ``rows`` (``None``: ``delete``),
        with the same data events; ``lock="table"``: one table WRITE lock instead of one per row.
        Returns the number of rows.  See ``_bulk.py``."""
        return _bulk.write_many(self, table, rows, lock)

    def scan(self, table: Any, where: Mapping[str, Any] | Callable[[dict], bool] | None = None) -> list[dict]:
        """All rows of ``table`` matching ``where`` (a dict of equalities or a predicate on the row
        dict), as this transaction sees them; takes a table-level READ lock."""
        self._check_active("scan")
        info = self.manager.catalog.table_info(table)
        if isinstance(where, Mapping):
            for column, value in where.items():
                info.check_value(column, value)
        self.manager.locking.acquire(self, info, None, Mode.READ)
        rows = dict(self.root._read_base.scan(self, info, where))
        for key in _view.written_keys(self, info.name):
            rows[key] = _view.read_row(self, info, key, record=False)
        # An ancestor that aborted during the scan was doomed before its writes were discarded: a scan
        # that merged the tree's writes without them is never returned (as ``_view.read_row`` does).
        self._check_active("scan")
        result = [image for image in rows.values() if image is not None and _view.matches(image, where)]
        recorder = self.manager.recorder
        if recorder:
            for key, image in rows.items():
                recorder.record("read", self.id, root=self.root.id, table=info.name, key=key, value=image,
                                source="scan")
        return result

    # --- writes ---------------------------------------------------------------------------

    def write(self, table: Any, key: Any, **values: Any) -> None:
        """Upsert: update the given columns of row ``key``, or insert it."""
        self._check_active("write")
        info = self.manager.catalog.table_info(table)
        key = info.key(key)
        values = self._values_without_key(info, key, values)
        self._modify(info, key, Entry(EntryKind.PATCH, values))

    def insert(self, table: Any, **values: Any) -> Key | Any:
        """Insert a new row; returns its key.  A table whose key the database generates
        (identity/serial) may omit it: the next sequence value is taken."""
        self._check_active("insert")
        info = self.manager.catalog.table_info(table)
        values = info.check_values(values)
        generated = any(values.get(name) is None for name in info.key_columns)
        if generated:
            values = {**values, **self._generated_key(info)}
        key = info.key(info.key_from_values(values))
        values = {name: value for name, value in values.items() if name not in info.key_columns}
        self._modify(info, key, Entry(EntryKind.INSERT, values), must_not_exist=not generated)
        return key[0] if len(key) == 1 else key

    def delete(self, table: Any, key: Any) -> None:
        """Delete row ``key`` if it exists."""
        self._check_active("delete")
        info = self.manager.catalog.table_info(table)
        key = info.key(key)
        self._modify(info, key, Entry(EntryKind.DELETE))

    def _values_without_key(self, info: TableInfo, key: Key, values: dict) -> dict:
        values = info.check_values(values)
        for name, key_value in zip(info.key_columns, key):
            if name in values:
                if values.pop(name) != key_value:
                    raise InvalidKey(f"{info.name}.{name} is part of the key {key!r}; it cannot be changed by write()")
        return values

    def _generated_key(self, info: TableInfo) -> dict:
        if len(info.key_columns) != 1:
            raise InvalidKey(f"insert into {info.name!r} needs the key columns {', '.join(info.key_columns)}")
        column = info.key_columns[0]
        catalog = self.manager.catalog
        sequence = catalog.sequence_of(info, column)
        if sequence is None:
            raise InvalidKey(
                f"insert into {info.name!r} needs a value for the key column {column!r} "
                f"(it has no identity or serial default)"
            )
        return {column: catalog.next_generated_key(sequence, self.root.began_at)}

    def _modify(self, info: TableInfo, key: Key, entry: Entry, *, must_not_exist: bool = False,
                lock: bool = True) -> None:
        hot = self.root.slot(HotKeys, create=False)
        if hot is not None and (info.name, key) in hot.plain_reads:
            hot.read_then_written.add(info.name)    # before the lock: a conversion may be the victim
        if lock:   # False: the node took a table lock covering the row (write_many, _bulk.py)
            self.manager.locking.acquire(self, info, key, Mode.WRITE)
        extensions = self.manager.extensions
        observed = False
        for wants in extensions.wants_old_images:
            if wants(info.name):
                observed = True
                break
        if entry.kind is EntryKind.INSERT and not must_not_exist:
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
        with self._mutex:
            previous = self._writes.get(row)
            self._writes[row] = previous.then(entry, info.name) if previous else entry
        recorder = self.manager.recorder
        if recorder:
            recorder.record("write", self.id, root=self.root.id, table=info.name, key=key, value=entry)
        if observed and (entry.kind is not EntryKind.DELETE or old is not None):
            if entry.kind is EntryKind.DELETE:
                kind, new = EventKind.DELETED, None
            else:
                new = entry.apply(old)
                if old is None:
                    kind = EventKind.INSERTED
                    # The stored row: every column (constant defaults for the ones not given) and the key.
                    new = {**info.blank_row, **new, **info.full_key_row(key)}
                else:
                    kind = EventKind.UPDATED
            display_key = key[0] if len(key) == 1 else key
            event = Event(kind, info.name, display_key, old, new, transaction=self.id)
            for hook in extensions.on_event:
                hook(self, event)

    # --- subtransactions --------------------------------------------------------------------

    def materialize(self) -> None:
        """Give this lazy inline subtransaction its own lock-manager transaction now (it is about to
        create a child, wait, or wait for a lock); a no-op for any other node.  Called by the thread
        running it.  See README, "Lazy inline subtransactions"."""
        if self._lazy:
            self.manager.locking.materialize(self)

    def _new_child(self, name: str | None = None, *, inline: bool = False) -> "Transaction":
        if self._doomed is not None or self._state is not TxnState.ACTIVE:
            self._check_active("starting a subtransaction")
        manager = self.manager
        if self._lazy:
            self.materialize()
        manager.locking.release_holds(self)
        # Lazy: an inline child of a node with no other live child (so no sibling can conflict with it).
        lazy = inline and manager.lazy_subtransactions and not self._children
        child = Transaction(manager, self, name=name, inline=inline, lazy=lazy)
        if lazy:
            self._lazy_child = child
        with self._mutex:
            if self._children is _EMPTY:
                self._children = {}
            self._children[child.id] = child
        if manager.recorder:
            manager.recorder.record("spawn", self.id, root=self.root.id, detail=child.id)
        if manager.observers.on_spawn:
            manager.observers.call("on_spawn", self, child)
        return child

    def spawn(self, function: Callable[..., Any], *args: Any, name: str | None = None,
              **kwargs: Any) -> SubtransactionHandle:
        """Run ``function(child, *args, **kwargs)`` as a subtransaction on a worker thread.

        The child commits when the function returns and aborts (with its descendants)
        if it raises; ``handle.result()`` returns the value or re-raises the error.
        """
        child = self._new_child(name)
        task = self.manager.pool.submit(child._run_body, function, args, kwargs)
        with self._mutex:
            if child.id in self._children:      # not already ended (and forgotten) on a worker
                if self._tasks is _EMPTY:
                    self._tasks = {}
                self._tasks[child.id] = task
        return SubtransactionHandle(child, task)

    def subtransaction(self, name: str | None = None) -> "InlineSubtransaction":
        """``with tx.subtransaction() as child:`` runs a subtransaction inline in this thread."""
        return InlineSubtransaction(self, name)

    def run_subtransaction(self, function: Callable[..., Any], *args: Any, name: str | None = None,
                           **kwargs: Any) -> Any:
        """Run ``function(child, ...)`` as an inline subtransaction and return its result; the child
        commits when it returns and aborts (re-raising) when it raises — ``with tx.subtransaction()`` as
        one call, for code that needs the outcome without managing a context."""
        child = self._begin_inline(name)
        try:
            result = function(child, *args, **kwargs)
        except BaseException as error:
            child._end_inline(error)
            raise
        child._end_inline(None)
        return result

    def _begin_inline(self, name: str | None) -> "Transaction":
        """Create an inline child and make it the transaction this thread runs; extensions and observers
        hear of its begin."""
        child = self._new_child(name, inline=True)
        manager = self.manager
        manager.push_running(child)
        try:
            for hook in manager.extensions.on_begin:
                hook(child)
            if manager.observers.on_begin:
                manager.observers.call("on_begin", child)
        except BaseException as error:
            child.abort(error)
            manager.pop_running()
            raise
        return child

    def _end_inline(self, error: BaseException | None) -> None:
        """End this inline child: commit it, or abort it because its block raised ``error``."""
        try:
            if error is not None:
                self.abort(error)
            else:
                self.commit()
        finally:
            self.manager.pop_running()

    def retry(self, function: Callable[..., Any], *args: Any, attempts: int = 3, **kwargs: Any) -> Any:
        """Run ``function(child, ...)`` as an inline subtransaction, re-running it (in a fresh
        subtransaction) when it is chosen as a deadlock victim or its commit finds that another process
        changed a row it read, at most ``attempts`` times."""
        if attempts < 1:
            raise ValueError("attempts must be at least 1")
        for attempt in range(1, attempts + 1):
            try:
                return self.run_subtransaction(function, *args, **kwargs)
            except (Deadlock, SerializationConflict) as error:
                if attempt == attempts:
                    raise
                logger.info("subtransaction of %s failed (%s); retry %d of %d", self.id,
                            type(error).__name__, attempt, attempts)

    def _run_body(self, function: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        self._thread = threading.get_ident()
        manager = self.manager
        manager.push_running(self)
        try:
            try:
                for hook in manager.extensions.on_begin:
                    hook(self)
                if manager.observers.on_begin:
                    manager.observers.call("on_begin", self)
                result = function(self, *args, **kwargs)
            except BaseException as error:
                self.abort(error)
                raise
            self.commit()
        finally:
            manager.pop_running()
        return result

    def _waiting_for(self, child: "Transaction"):
        """Context of a wait of this node for ``child`` (a handle's ``wait``/``result``)."""
        return self.manager.waiting(self, "children", child.id)

    def _before_waiting_for_children(self) -> None:
        """The thread running this node is about to wait for its children: it uses none of its locks
        while it waits, so they become *retained* (in place) and Rule 1 grants them to its descendants.
        Otherwise a child asking for a row this node's own operations locked would wait for a holder that
        waits for the child.  Only the node's own thread may do this (a lock it just acquired for an
        operation in progress must stay held); a wait by another thread is registered with the lock
        manager instead (``TransactionManager.waiting``)."""
        if self._thread == threading.get_ident() and self._state in (TxnState.ACTIVE, TxnState.COMMITTING):
            self.manager.locking.release_holds(self)

    def wait_children(self, timeout: float | None = None) -> None:
        """Wait until every child has ended, running queued ones in this thread."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._mutex:
                pending = [task for task in self._tasks.values() if not task.done()]
            if not pending:
                return
            with self.manager.waiting(self, "children", None):
                for task in pending:
                    remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
                    if not task.wait(remaining):
                        raise TimeoutError(f"children of {self.id} did not end within {timeout} s")

    # --- signals ----------------------------------------------------------------------------

    def signal(self, name: str, **payload: Any) -> None:
        """Raise an application event ``name`` with ``payload`` (rules on ``db.signalled(name)`` react)."""
        self._check_active("signal")
        event = Event(EventKind.SIGNAL, name, payload=dict(payload), transaction=self.id)
        for hook in self.manager.extensions.on_event:
            hook(self, event)

    def emit(self, event_type: str, *, key: Any = None, ts: Any = None, payload: Mapping[str, Any] | None = None
             ) -> None:
        """Hand a stream event (``db.stream(event_type)``) to the rules, in this transaction."""
        self._check_active("emit")
        event = Event(EventKind.STREAM, event_type, key=key, payload=dict(payload or {}), ts=ts,
                      transaction=self.id)
        for hook in self.manager.extensions.on_event:
            hook(self, event)

    # --- commit and abort -------------------------------------------------------------------

    def commit(self) -> None:
        """Commit: wait for children, then delegate to the parent or flush to PostgreSQL.  A node that
        was doomed meanwhile (an ancestor aborted, a deadlock) aborts instead and raises why."""
        doomed = self._doomed
        if doomed is not None and self._state is TxnState.ACTIVE:
            self.abort(doomed)
        if doomed is not None or self._state is not TxnState.ACTIVE:
            self._check_active("commit")
        manager = self.manager
        try:
            for hook in manager.extensions.before_commit:
                hook(self)
        except BaseException as error:
            self.abort(error)
            raise
        with self._mutex:
            if self._state is not TxnState.ACTIVE:
                raise TransactionError(f"commit of {self.id}, which is {self._state.value}")
            self._state = TxnState.COMMITTING
        try:
            # COMMITTING: no operation of this node runs any more, so what its own operations hold
            # becomes retained before it waits for its children (they may need those rows).  (A lazy node
            # holds nothing itself and has no children.)
            if not self._lazy:
                manager.locking.release_holds(self)
            if self._tasks:                # only spawned children have tasks (an inline child has ended)
                self.wait_children()
            if self._doomed is not None:
                raise TransactionAborted(f"transaction {self.id} was aborted ({self._doomed})") from self._doomed
            if self.parent is not None:
                self._delegate_to_parent()
            else:
                _flush.flush(self)
        except BaseException as error:
            self.abort(error)
            raise
        manager.locking.commit(self)   # subtransaction: parent inherits and retains; top-level: releases all
        with self._mutex:
            self._state = TxnState.COMMITTED
        parent = self.parent
        if parent is None:
            for participant in self._participants:
                try:
                    participant.committed(self)
                except Exception:
                    logger.exception("commit participant %r raised after %s committed", participant, self.id)
        if manager.recorder:
            manager.recorder.record("commit", self.id, parent=parent.id if parent else None, root=self.root.id)
        for hook in manager.extensions.after_end:
            hook(self, True)
        if manager.observers.on_commit:
            manager.observers.call("on_commit", self)
        if parent is not None:
            parent._forget(self)

    def _forget(self, child: "Transaction") -> None:
        """``child`` ended: drop it (its effects were delegated, or discarded)."""
        with self._mutex:
            if self._children:
                self._children.pop(child.id, None)
            if self._tasks:
                self._tasks.pop(child.id, None)

    def _delegate_to_parent(self) -> None:
        parent = self.parent
        with self._mutex:
            writes, reads, scans = self._writes, self._db_reads, self._scans
            participants = self._participants
        with parent._mutex:
            if parent._state not in (TxnState.ACTIVE, TxnState.COMMITTING) or parent._doomed is not None:
                raise TransactionAborted(f"the parent {parent.id} of {self.id} was aborted")
            # Check and compose everything first, then install: a failure leaves the parent untouched.
            parent_reads = parent._db_reads
            for row, image in reads.items():
                relied = parent_reads.get(row, image)
                if relied != image:
                    # Another process committed between two reads of the tree: the parent (or a
                    # sibling that committed into it) relied on one image, this child on another.
                    # Keeping both is not serializable; the child's commit fails and its work is
                    # discarded, the parent keeps its own image (validated again at the flush).
                    raise SerializationConflict(
                        f"commit of {self.id}: row {row[1]!r} of {row[0]!r} changed in PostgreSQL between "
                        f"this subtransaction's read and a read by {parent.id} or a sibling (another process "
                        f"committed in between); nothing of {self.id} is kept — re-run it "
                        f"(tx.retry(fn) does, or the whole transaction: Database.run(fn, retries=N))"
                    )
            if writes:
                parent_writes = parent._writes
                merged = {}
                for row, entry in writes.items():
                    previous = parent_writes.get(row)
                    merged[row] = previous.then(entry, row[0]) if previous is not None else entry
                parent_writes.update(merged)
            for row, image in reads.items():
                parent_reads.setdefault(row, image)
            if scans:
                parent._scans = [*parent._scans, *scans]
            if participants:
                parent._participants = [*parent._participants, *participants]
            parent.subtransactions_committed += 1 + self.subtransactions_committed

    def abort(self, reason: BaseException | str | None = None) -> None:
        """Abort this node and its active descendants: write sets discarded, locks released."""
        with self._mutex:
            if self._state in (TxnState.COMMITTED, TxnState.ABORTED):
                if self._state is TxnState.COMMITTED:
                    raise TransactionError(f"abort of {self.id}, which is already committed")
                return
        error = reason if isinstance(reason, BaseException) else TransactionAborted(str(reason or "aborted"))
        # Doom the subtree before its writes are discarded: a descendant reading meanwhile then raises
        # instead of returning the row without them (``_view.read_row`` checks after reading).
        self.doom(error)
        with self._mutex:
            if self._state in (TxnState.COMMITTED, TxnState.ABORTED):
                if self._state is TxnState.COMMITTED:
                    raise TransactionError(f"abort of {self.id}, which is already committed")
                return
            self._state = TxnState.ABORTED
            self._writes = {}
            participants, self._participants = self._participants, _NONE
        manager = self.manager
        manager.locking.abort(self)
        self.wait_children()
        for participant in participants:
            try:
                participant.aborted(self, error)
            except Exception:
                logger.exception("commit participant %r raised while %s aborted", participant, self.id)
        if manager.recorder:
            manager.recorder.record("abort", self.id, parent=self.parent.id if self.parent else None,
                                    root=self.root.id, detail=repr(reason) if reason is not None else None)
        manager.extensions.call("after_end", self, False)
        manager.observers.call("on_abort", self, error)
        if self.parent is not None:
            self.parent._forget(self)

    def __repr__(self) -> str:
        return f"<Transaction {self.id} {self._state.value}>"


class InlineSubtransaction:
    """``with tx.subtransaction() as child:``: commit on normal exit, abort (re-raising) on an exception."""

    __slots__ = ("_parent", "_name", "transaction")

    def __init__(self, parent: Transaction, name: str | None):
        self._parent = parent
        self._name = name
        self.transaction: Transaction | None = None

    def __enter__(self) -> Transaction:
        child = self.transaction = self._parent._begin_inline(self._name)
        return child

    def __exit__(self, exc_type, exc, traceback) -> bool:
        self.transaction._end_inline(exc)
        return False
