"""Parallel nested transactions over the PostgreSQL shared store.

Design note (see also activedb/README.md):

* A **tree** of :class:`Transaction` nodes: a top-level transaction and
  subtransactions spawned by any node, on worker threads (``spawn``) or inline
  (``subtransaction``).  Any node may run while its children run.
* **Storage**: each node writes to a private write set; reads see the node's own
  writes, then its ancestors', then committed data.  A child's commit merges its
  write set into its parent's (delegation); only the top-level commit touches
  PostgreSQL, in one database transaction (``_flush``).
* **Locking** (Härder–Rothermel, package ``lockmgr``): a node's own operations run
  under an internal lock-manager child of the node, its *segment*.  Before the
  node creates a child, the segment commits, so the node *retains* what it
  accessed: its descendants may then use those rows, transactions outside the
  tree may not.  A parent cannot commit before its children end
  (wait-for-commit); a committing child's locks are inherited by its parent.
* **Across processes**: every row the tree read from PostgreSQL is remembered with
  the image it saw.  The top-level flush runs at SERIALIZABLE isolation, re-reads
  those rows ``FOR SHARE`` and compares: a change by another process raises
  :class:`SerializationConflict` (the tree's work is discarded, nothing is
  written; ``Database.run(fn, retries=N)`` re-runs it).  PostgreSQL's own
  serialization failures (SQLSTATE 40001/40P01) of the flush are retried a
  bounded number of times, re-validating each time.
* **States**: ``TxnState`` ACTIVE → COMMITTING → COMMITTED, or → ABORTED.  Every
  operation checks the state it needs and raises a clear error otherwise.

Thread-safety: a ``Transaction`` may be used by the thread running it; its
parent's and children's threads touch it only through ``_mutex``, which
protects ``_state``, ``_children``, ``_writes``, ``_db_reads``, ``_scans`` and
``_segment``.  Locking order: a child's ``_mutex`` before its parent's, never
the other way round; no ``_mutex`` is held while calling the lock manager, the
database, or user code.
"""

from __future__ import annotations

import contextlib
import datetime
import enum
import itertools
import logging
import os
import random
import threading
import time
import uuid
from typing import Any, Callable, Iterator, Mapping

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

import lockmgr
from lockmgr import Deadlock, LockTimeout, Mode

from activedb import _store
from activedb._events import Event
from activedb._history import HistoryRecorder
from activedb._pool import Task, WorkerPool
from activedb._store import Entry, EntryKind, Key, TableInfo
from activedb.errors import (
    BatchAlreadyCommitted,
    DatabaseUnavailable,
    DuplicateKey,
    InvalidKey,
    SerializationConflict,
    TransactionAborted,
    TransactionError,
)

logger = logging.getLogger("activedb.transaction")

_RETRYABLE_SQLSTATES = {"40001", "40P01"}


class TxnState(enum.Enum):
    ACTIVE = "active"
    COMMITTING = "committing"
    COMMITTED = "committed"
    ABORTED = "aborted"


class Granularity(enum.Enum):
    TUPLE = "tuple"
    TABLE = "table"


class TransactionHooks:
    """What the rule manager plugs into the transaction manager.

    The default does nothing; each method's docstring is its contract.
    """

    def wants_old_images(self, table: str) -> bool:
        """True if data events on ``table`` are observed (writes then read the old row)."""
        return False

    def on_event(self, transaction: "Transaction", event: Event) -> None:
        """Called in the transaction's thread after a write (with its locks held), a
        ``signal`` or an ``emit``; may raise to fail the operation (e.g. a failed immediate rule)."""

    def on_begin(self, transaction: "Transaction") -> None:
        """Called when a transaction starts, in its thread."""

    def before_commit(self, transaction: "Transaction") -> None:
        """Called when ``transaction`` is about to commit (after its body, before
        waiting for children): deferred rules run here."""

    def after_end(self, transaction: "Transaction", committed: bool) -> None:
        """Called once the transaction committed or aborted (top-level: after PostgreSQL)."""


class TransactionManager:
    """Creates transaction trees for one ``Database``.  Thread-safe."""

    def __init__(self, database, *, max_workers: int = 32, victim_policy: Any = "requester",
                 flush_retries: int = 10, record_history: bool = False, lock_timeout: float | None = None):
        self.database = database
        self.locks = lockmgr.LockManager(victim_policy=victim_policy)
        self.pool = WorkerPool(max_workers)
        self.flush_retries = flush_retries
        self.lock_timeout = lock_timeout
        self.recorder: HistoryRecorder | None = HistoryRecorder() if record_history else None
        self.hooks: TransactionHooks = TransactionHooks()
        self.process_tag = f"{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self._ids = itertools.count(1)
        self._mutex = threading.Lock()   # protects _infos, _granularity, _sequences and _key_blocks
        self._infos: dict[str, TableInfo] = {}
        self._granularity: dict[str, Granularity] = {}
        self._sequences: dict[tuple[str, str], str | None] = {}
        self._key_blocks: dict[str, list[int]] = {}     # sequence -> drawn, unused values (largest first)

    def next_id(self) -> int:
        return next(self._ids)

    @contextlib.contextmanager
    def reader(self) -> Iterator[sa.Connection]:
        """A connection for one-statement reads of committed data: autocommit, so no
        BEGIN/ROLLBACK round trips around the statement (a read is atomic on its own).
        A lost connection becomes ``DatabaseUnavailable`` (the pool reconnects next time)."""
        try:
            with self.database.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
                yield connection
        except sa.exc.OperationalError as error:
            reason = str(error.orig or error).strip().splitlines()[0]
            raise DatabaseUnavailable(
                f"lost the connection to PostgreSQL ({self.database.describe()}) while reading: {reason}; "
                f"nothing committed is affected — retry the transaction (db.run(fn, retries=N) does not retry "
                f"this: check that the server is up)"
            ) from error

    KEY_BLOCK = 64

    def next_generated_key(self, sequence: str) -> int:
        """The next value of ``sequence``, drawn ``KEY_BLOCK`` at a time (one round trip per
        block; unused values of a block are gaps, as after any rollback in PostgreSQL)."""
        with self._mutex:
            block = self._key_blocks.get(sequence)
            if block:
                return block.pop()
        with self.reader() as connection:
            values = connection.execute(sa.text("SELECT nextval(:s) FROM generate_series(1, :n)"),
                                        {"s": sequence, "n": self.KEY_BLOCK}).scalars().all()
        values.sort(reverse=True)
        first = values.pop()
        with self._mutex:
            self._key_blocks.setdefault(sequence, []).extend(values)
        return first

    def sequence_of(self, info: TableInfo, column: str) -> str | None:
        """The sequence behind a serial/identity ``column`` (cached per table)."""
        key = (info.name, column)
        if key not in self._sequences:
            with self.reader() as connection:
                name = connection.execute(sa.text("SELECT pg_get_serial_sequence(:t, :c)"),
                                          {"t": info.name, "c": column}).scalar()
            with self._mutex:
                self._sequences[key] = name
        return self._sequences[key]

    def info(self, table: Any) -> TableInfo:
        name = table if isinstance(table, str) else getattr(table, "name", None)
        if not isinstance(name, str):
            raise TransactionError(f"a table is named by a string or a sqlalchemy Table, got {table!r}")
        info = self._infos.get(name)
        if info is None:
            info = TableInfo(self.database.table(name))
            with self._mutex:
                self._infos.setdefault(name, info)
        return info

    def forget_schema(self) -> None:
        with self._mutex:
            self._infos.clear()
            self._sequences.clear()
            self._key_blocks.clear()

    def set_granularity(self, table: str, granularity: str | Granularity) -> None:
        self.info(table)   # validates the table name
        with self._mutex:
            self._granularity[table] = Granularity(granularity)

    def granularity(self, table: str) -> Granularity:
        return self._granularity.get(table, Granularity.TUPLE)

    def begin(self, *, batch: tuple[str, int] | None = None, name: str | None = None) -> "Transaction":
        return Transaction(self, None, name=name, batch=batch)


class SubtransactionHandle:
    """The handle ``spawn`` returns: ``result(timeout)``, ``done()``, ``state``."""

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
        self.transaction.parent._before_waiting_for_children()
        return self._task.wait(timeout)

    def result(self, timeout: float | None = None) -> Any:
        """The function's return value once the subtransaction committed; re-raises its error."""
        self.transaction.parent._before_waiting_for_children()
        if not self._task.wait(timeout):
            raise TimeoutError(f"subtransaction {self.transaction.id} did not end within {timeout} s")
        if self._task.error is not None:
            raise self._task.error
        return self._task.result

    def __repr__(self) -> str:
        return f"<SubtransactionHandle {self.transaction.id} {self.state.value}>"


class Transaction:
    """A node of a transaction tree.  See the module docstring."""

    def __init__(self, manager: TransactionManager, parent: "Transaction | None", *,
                 name: str | None = None, batch: tuple[str, int] | None = None):
        self.manager = manager
        self.parent = parent
        self.root: Transaction = parent.root if parent else self
        self.depth = parent.depth + 1 if parent else 0
        self.id = f"{parent.id}.{manager.next_id()}" if parent else f"T{manager.next_id()}"
        self.name = name
        self.batch = batch
        self.began_at = datetime.datetime.now(datetime.timezone.utc)
        self.info: dict[str, Any] = {}       # free-form annotations (rules, ingestion) for the log
        self._mutex = threading.Lock()
        # Invariant: _state only moves ACTIVE -> COMMITTING -> COMMITTED, or to ABORTED from a non-final state.
        self._state = TxnState.ACTIVE
        self._children: list[Transaction] = []
        self._tasks: dict[str, Task] = {}
        self._writes: dict[tuple[str, Key], Entry] = {}
        # Rows read from committed data, with the image seen (None: no row); validated at the flush.
        self._db_reads: dict[tuple[str, Key], dict | None] = {}
        self._scans: list[tuple[str, Any, dict]] = []
        self._segment: str | None = None
        # The thread that runs this node's operations (set again by a spawned child's worker).
        self._thread = threading.get_ident()
        self._segment_number = 0
        self._doomed: BaseException | None = None
        self.subtransactions_committed = 0
        # Set by the rule manager: the rule firing this transaction executes, and its deferred queue.
        self.firing: Any = None
        self.deferred_queue: Any = None
        self.tracked_trigger: Any = None     # its effective outcome, if a causally dependent rule waits
        manager.locks.begin(self.id, parent=parent.id if parent else None)
        recorder = manager.recorder
        if recorder:
            recorder.record("begin", self.id, parent=parent.id if parent else None, root=self.root.id)

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
            return list(self._children)

    def ancestors(self) -> Iterator["Transaction"]:
        node = self.parent
        while node is not None:
            yield node
            node = node.parent

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

    # --- locking --------------------------------------------------------------------------

    def _ensure_segment(self) -> str:
        segment = self._segment
        if segment is None:
            with self._mutex:
                self._segment_number += 1
                segment = f"{self.id}#{self._segment_number}"
                self._segment = segment
            self.manager.locks.begin(segment, parent=self.id)
        return segment

    def _before_waiting_for_children(self) -> None:
        """The thread running this node is about to wait for its children: it uses none of its locks
        while it waits, so they become *retained* (its segment commits) and Rule 1 grants them to its
        descendants.  Otherwise a child asking for a row this node's own operations locked would
        wait for a holder that waits for the child — a deadlock the lock manager could not see, since
        the holder is the node's segment, not the node.  Only the node's own thread may do this (the
        segment is in use while that thread runs an operation); waits by other threads leave it."""
        if (self._segment is not None and self._thread == threading.get_ident()
                and self._state in (TxnState.ACTIVE, TxnState.COMMITTING)):
            self._close_segment()

    def _close_segment(self) -> None:
        """Commit the segment: this node retains what its own operations locked (Rule 2)."""
        with self._mutex:
            segment, self._segment = self._segment, None
        if segment is not None:
            self.manager.locks.commit(segment)

    def _lock(self, info: TableInfo, key: Key | None, mode: Mode) -> None:
        segment = self._ensure_segment()
        locks = self.manager.locks
        timeout = self.manager.lock_timeout
        try:
            if key is None or self.manager.granularity(info.name) is Granularity.TABLE:
                locks.acquire(segment, ("table", info.name), mode, timeout=timeout)
            else:
                intention = Mode.IW if mode is Mode.WRITE else Mode.IR
                locks.acquire(segment, ("table", info.name), intention, timeout=timeout)
                locks.acquire(segment, ("row", info.name, key), mode, timeout=timeout)
        except (Deadlock, LockTimeout) as error:
            self.doom(error)
            raise
        except lockmgr.LockError as error:
            if self._doomed is not None:
                raise TransactionAborted(f"transaction {self.id} was aborted ({self._doomed})") from error
            raise

    # --- reads ----------------------------------------------------------------------------

    def read(self, table: Any, key: Any) -> dict | None:
        """The row with primary key ``key`` as a dict, or None; takes a READ lock."""
        self._check_active("read")
        info = self.manager.info(table)
        key = info.key(key)
        self._lock(info, key, Mode.READ)
        return self._read_locked(info, key)

    def _read_locked(self, info: TableInfo, key: Key, *, record: bool = True, validate: bool = True
                     ) -> dict | None:
        """The row as this node sees it: own entry, then the ancestors' entries (nearest first, down
        to the first one that does not depend on what was there before), then the committed image
        this node or its nearest ancestor already relied on, else a fresh one from PostgreSQL.

        Every write entry of the ancestor chain is consulted *before* any committed image: an image
        cached by this node must never hide an ancestor's newer version.  Precondition: this node's
        segment holds a lock on the row.
        """
        row = (info.name, key)
        chain: list[Entry] = []
        node: Transaction | None = self
        source = "committed"
        needs_base = True
        while node is not None:
            entry = node._writes.get(row)
            if entry is not None:
                chain.append(entry)
                if source == "committed":
                    source = "own" if node is self else f"ancestor:{node.id}"
                if entry.kind is not EntryKind.PATCH:
                    needs_base = False
                    break
            node = node.parent
        base: dict | None = None
        if needs_base:
            found, base = self._relied_image(row)
            if not found:
                base = self._fetch_committed(info, key, validate=validate)
        image = _store.resolve(list(reversed(chain)), base)
        if image is not None and base is None:
            # A row created in this tree: every column, the ones not given at their constant default.
            image = {**info.blank_row, **image, **info.full_key_row(key)}
        recorder = self.manager.recorder
        if recorder and record and source != "committed":
            recorder.record("read", self.id, root=self.root.id, table=info.name, key=key, value=image,
                            source=source)
        return image

    def _relied_image(self, row: tuple[str, Key]) -> tuple[bool, dict | None]:
        """``(True, image)`` if this node or an ancestor already read ``row`` from committed data
        (the nearest one's image: a committed child's reads were delegated to its parent), else
        ``(False, None)``."""
        node: Transaction | None = self
        while node is not None:
            reads = node._db_reads
            if row in reads:
                return True, reads[row]
            node = node.parent
        return False, None

    def _fetch_committed(self, info: TableInfo, key: Key, *, validate: bool = True) -> dict | None:
        with self.manager.reader() as connection:
            image = _store.fetch_rows(connection, info, [key]).get(key)
        if not validate:
            return image
        with self._mutex:
            self._db_reads.setdefault((info.name, key), image)
        recorder = self.manager.recorder
        if recorder:
            recorder.record_committed_read(self.id, self.root.id, info.name, key, image)
        return image

    def prefetch(self, table: Any, keys: Any) -> int:
        """Read-lock ``keys`` of ``table`` and load their committed images in one query, so that
        later reads in this tree (this node and its descendants) need no round trip.  Returns the
        number of rows found.  Useful before processing a batch of events on known keys."""
        self._check_active("prefetch")
        info = self.manager.info(table)
        wanted = []
        for key in keys:
            key = info.key(key)
            row = (info.name, key)
            if any(row in node._db_reads or row in node._writes for node in (self, *self.ancestors())):
                continue
            wanted.append(key)
        wanted = list(dict.fromkeys(wanted))
        for key in wanted:
            self._lock(info, key, Mode.READ)
        if not wanted:
            return 0
        with self.manager.reader() as connection:
            found = _store.fetch_rows(connection, info, wanted)
        recorder = self.manager.recorder
        with self._mutex:
            for key in wanted:
                self._db_reads.setdefault((info.name, key), found.get(key))
        if recorder:
            for key in wanted:
                recorder.record_committed_read(self.id, self.root.id, info.name, key, found.get(key))
        return len(found)

    def scan(self, table: Any, where: Mapping[str, Any] | Callable[[dict], bool] | None = None) -> list[dict]:
        """All rows of ``table`` matching ``where`` (a dict of equalities or a predicate on the row
        dict), as this transaction sees them; takes a table-level READ lock."""
        self._check_active("scan")
        info = self.manager.info(table)
        if isinstance(where, Mapping):
            for column, value in where.items():
                info.check_value(column, value)
        self._lock(info, None, Mode.READ)
        statement = sa.select(info.table)
        if isinstance(where, Mapping):
            statement = statement.where(*[info.table.c[column] == value for column, value in where.items()])
        with self.manager.reader() as connection:
            fetched = {tuple(row[n] for n in info.key_columns): dict(row)
                       for row in connection.execute(statement).mappings()}
        with self._mutex:
            self._scans.append((info.name, where, fetched))
        rows = dict(fetched)
        for key in self._written_keys(info.name):
            rows[key] = self._read_locked(info, key, record=False)
        matches = [image for image in rows.values() if image is not None and _matches(image, where)]
        recorder = self.manager.recorder
        if recorder:
            for key, image in rows.items():
                recorder.record("read", self.id, root=self.root.id, table=info.name, key=key, value=image,
                                source="scan")
        return matches

    def _written_keys(self, table_name: str) -> set[Key]:
        keys: set[Key] = set()
        node: Transaction | None = self
        while node is not None:
            keys.update(key for (name, key) in list(node._writes) if name == table_name)
            node = node.parent
        return keys

    # --- writes ---------------------------------------------------------------------------

    def write(self, table: Any, key: Any, **values: Any) -> None:
        """Upsert: update the given columns of row ``key``, or insert it."""
        self._check_active("write")
        info = self.manager.info(table)
        key = info.key(key)
        values = self._values_without_key(info, key, values)
        self._modify(info, key, Entry(EntryKind.PATCH, values))

    def insert(self, table: Any, **values: Any) -> Key | Any:
        """Insert a new row; returns its key.  A table whose key the database generates
        (identity/serial) may omit it: the next sequence value is taken."""
        self._check_active("insert")
        info = self.manager.info(table)
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
        info = self.manager.info(table)
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
        sequence = self.manager.sequence_of(info, column)
        if sequence is None:
            raise InvalidKey(
                f"insert into {info.name!r} needs a value for the key column {column!r} "
                f"(it has no identity or serial default)"
            )
        return {column: self.manager.next_generated_key(sequence)}

    def _modify(self, info: TableInfo, key: Key, entry: Entry, *, must_not_exist: bool = False) -> None:
        self._lock(info, key, Mode.WRITE)
        hooks = self.manager.hooks
        if entry.kind is EntryKind.INSERT and not must_not_exist:
            observed, old = hooks.wants_old_images(info.name), None     # a fresh sequence value: no row
        else:
            observed = must_not_exist or hooks.wants_old_images(info.name)
            # An insert's existence check is not validated at the flush (a concurrent insert
            # of the same key makes the flush's INSERT fail instead): no predicate read.
            old = (self._read_locked(info, key, record=False, validate=not must_not_exist)
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
            new = None if entry.kind is EntryKind.DELETE else entry.apply(old)
            kind = "deleted" if entry.kind is EntryKind.DELETE else ("inserted" if old is None else "updated")
            display_key = key[0] if len(key) == 1 else key
            hooks.on_event(self, Event(kind, info.name, display_key, old, new, transaction=self.id))

    # --- subtransactions --------------------------------------------------------------------

    def _new_child(self, name: str | None = None) -> "Transaction":
        self._check_active("starting a subtransaction")
        self._close_segment()
        child = Transaction(self.manager, self, name=name)
        with self._mutex:
            self._children.append(child)
        recorder = self.manager.recorder
        if recorder:
            recorder.record("spawn", self.id, root=self.root.id, detail=child.id)
        return child

    def spawn(self, function: Callable[..., Any], *args: Any, name: str | None = None,
              **kwargs: Any) -> SubtransactionHandle:
        """Run ``function(child, *args, **kwargs)`` as a subtransaction on a worker thread.

        The child commits when the function returns and aborts (with its descendants)
        if it raises; ``handle.result()`` returns the value or re-raises the error.
        """
        child = self._new_child(name)
        task = self.manager.pool.submit(lambda: child._run_body(function, args, kwargs))
        with self._mutex:
            self._tasks[child.id] = task
        return SubtransactionHandle(child, task)

    def subtransaction(self, name: str | None = None) -> "_InlineSubtransaction":
        """``with tx.subtransaction() as child:`` runs a subtransaction inline in this thread."""
        return _InlineSubtransaction(self, name)

    def retry(self, function: Callable[..., Any], *args: Any, attempts: int = 3, **kwargs: Any) -> Any:
        """Run ``function(child, ...)`` as an inline subtransaction, re-running it (in a fresh
        subtransaction) when it is chosen as a deadlock victim, at most ``attempts`` times."""
        if attempts < 1:
            raise ValueError("attempts must be at least 1")
        for attempt in range(1, attempts + 1):
            try:
                with self.subtransaction() as child:
                    return function(child, *args, **kwargs)
            except Deadlock:
                if attempt == attempts:
                    raise
                logger.info("subtransaction of %s was a deadlock victim; retry %d of %d", self.id, attempt, attempts)

    def _run_body(self, function: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        self._thread = threading.get_ident()
        try:
            self.manager.hooks.on_begin(self)
            result = function(self, *args, **kwargs)
        except BaseException as error:
            self.abort(error)
            raise
        self.commit()
        return result

    def wait_children(self, timeout: float | None = None) -> None:
        """Wait until every child has ended, running queued ones in this thread."""
        self._before_waiting_for_children()
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._mutex:
                pending = [self._tasks[child.id] for child in self._children
                           if child.id in self._tasks and not self._tasks[child.id].done()]
            if not pending:
                return
            for task in pending:
                remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
                if not task.wait(remaining):
                    raise TimeoutError(f"children of {self.id} did not end within {timeout} s")

    # --- signals ----------------------------------------------------------------------------

    def signal(self, name: str, **payload: Any) -> None:
        """Raise an application event ``name`` with ``payload`` (rules on ``db.signalled(name)`` react)."""
        self._check_active("signal")
        self.manager.hooks.on_event(self, Event("signal", name, payload=dict(payload), transaction=self.id))

    def emit(self, event_type: str, *, key: Any = None, ts: Any = None, payload: Mapping[str, Any] | None = None
             ) -> None:
        """Hand a stream event (``db.stream(event_type)``) to the rules, in this transaction."""
        self._check_active("emit")
        self.manager.hooks.on_event(self, Event("stream", event_type, key=key, payload=dict(payload or {}),
                                                ts=ts, transaction=self.id))

    # --- commit and abort -------------------------------------------------------------------

    def commit(self) -> None:
        """Commit: wait for children, then delegate to the parent or flush to PostgreSQL."""
        self._check_active("commit")
        try:
            self.manager.hooks.before_commit(self)
        except BaseException as error:
            self.abort(error)
            raise
        with self._mutex:
            if self._state is not TxnState.ACTIVE:
                raise TransactionError(f"commit of {self.id}, which is {self._state.value}")
            self._state = TxnState.COMMITTING
        try:
            # COMMITTING: no operation of this node runs any more, so what its own operations hold
            # becomes retained before it waits for its children (they may need those rows).
            self._close_segment()
            self.wait_children()
            if self._doomed is not None:
                raise TransactionAborted(f"transaction {self.id} was aborted ({self._doomed})") from self._doomed
            if self.parent is not None:
                self._delegate_to_parent()
            else:
                self._flush()
        except BaseException as error:
            self.abort(error)
            raise
        locks = self.manager.locks
        locks.commit(self.id)   # subtransaction: parent inherits and retains; top-level: releases all
        with self._mutex:
            self._state = TxnState.COMMITTED
        recorder = self.manager.recorder
        if recorder:
            recorder.record("commit", self.id, parent=self.parent.id if self.parent else None, root=self.root.id)
        self.manager.hooks.after_end(self, True)

    def _delegate_to_parent(self) -> None:
        parent = self.parent
        with self._mutex:
            writes, reads, scans = self._writes, self._db_reads, self._scans
        with parent._mutex:
            if parent._state not in (TxnState.ACTIVE, TxnState.COMMITTING) or parent._doomed is not None:
                raise TransactionAborted(f"the parent {parent.id} of {self.id} was aborted")
            # Check and compose everything first, then install: a failure leaves the parent untouched.
            for row, image in reads.items():
                relied = parent._db_reads.get(row, image)
                if relied != image:
                    # Another process committed between two reads of the tree: the parent (or a
                    # sibling that committed into it) relied on one image, this child on another.
                    # Keeping both is not serializable; the child's commit fails and its work is
                    # discarded, the parent keeps its own image (validated again at the flush).
                    raise SerializationConflict(
                        f"commit of {self.id}: row {row[1]!r} of {row[0]!r} changed in PostgreSQL between "
                        f"this subtransaction's read and a read by {parent.id} or a sibling (another process "
                        f"committed in between); nothing of {self.id} is kept — re-run it "
                        f"(or the whole transaction: Database.run(fn, retries=N))"
                    )
            merged = {}
            for row, entry in writes.items():
                previous = parent._writes.get(row)
                merged[row] = previous.then(entry, row[0]) if previous else entry
            parent._writes.update(merged)
            for row, image in reads.items():
                parent._db_reads.setdefault(row, image)
            parent._scans.extend(scans)
            parent.subtransactions_committed += 1 + self.subtransactions_committed

    def abort(self, reason: BaseException | str | None = None) -> None:
        """Abort this node and its active descendants: write sets discarded, locks released."""
        with self._mutex:
            if self._state in (TxnState.COMMITTED, TxnState.ABORTED):
                if self._state is TxnState.COMMITTED:
                    raise TransactionError(f"abort of {self.id}, which is already committed")
                return
            self._state = TxnState.ABORTED
            self._writes = {}
            self._segment = None     # the lock manager aborts it with this node (a descendant)
        error = reason if isinstance(reason, BaseException) else TransactionAborted(str(reason or "aborted"))
        self.doom(error)
        try:
            self.manager.locks.abort(self.id)
        except lockmgr.LockError:
            logger.debug("lock state of %s was already gone", self.id)
        try:
            self.wait_children()
        except TimeoutError:  # pragma: no cover - wait_children without timeout never raises
            pass
        recorder = self.manager.recorder
        if recorder:
            recorder.record("abort", self.id, parent=self.parent.id if self.parent else None,
                            root=self.root.id, detail=repr(reason) if reason is not None else None)
        self.manager.hooks.after_end(self, False)

    # --- the top-level flush ----------------------------------------------------------------

    def _flush(self) -> None:
        """Apply the merged write set in one SERIALIZABLE PostgreSQL transaction.

        Precondition: this is the top-level node, all children have ended, it is COMMITTING.
        """
        manager = self.manager
        database = manager.database
        with self._mutex:
            writes, reads, scans = dict(self._writes), dict(self._db_reads), list(self._scans)
        infos = {name: manager.info(name) for name in {row[0] for row in writes} | {row[0] for row in reads}
                 | {scan[0] for scan in scans}}
        # Rows read and still there are re-read FOR SHARE and compared: with the row locks of the
        # writes that is two-phase locking, serializable at READ COMMITTED.  Rows read as absent
        # and scans (phantoms) need PostgreSQL's SERIALIZABLE predicate locks as well.
        needs_predicates = bool(scans) or any(image is None for image in reads.values())
        isolation = "SERIALIZABLE" if needs_predicates else "READ COMMITTED"
        attempt = 0
        while True:
            attempt += 1
            try:
                with database.engine.connect().execution_options(isolation_level=isolation) as connection:
                    with connection.begin():
                        self._validate(connection, infos, reads, scans)
                        if self.batch is not None:
                            self._record_batch(connection)
                        _store.apply_write_set(connection, infos, writes)
                        self._log(connection, writes)
                break
            except sa.exc.OperationalError as error:
                sqlstate = getattr(error.orig, "sqlstate", None)
                if sqlstate in _RETRYABLE_SQLSTATES and attempt < manager.flush_retries:
                    # Jittered back-off between retries of the flush (not used to order threads).
                    time.sleep(random.uniform(0.5, 1.5) * min(0.2, 0.002 * 2 ** attempt))
                    continue
                if sqlstate in _RETRYABLE_SQLSTATES:
                    raise SerializationConflict(
                        f"commit of {self.id} failed {attempt} times on concurrent updates by another process; "
                        f"nothing was written — re-run the transaction (Database.run(fn, retries=N) does)"
                    ) from error
                self._raise_unknown_outcome(error)
            except sa.exc.DBAPIError as error:
                if error.connection_invalidated:
                    self._raise_unknown_outcome(error)
                raise
        recorder = manager.recorder
        if recorder:
            recorder.record_flush(self.id, writes)

    def _validate(self, connection, infos, reads, scans) -> None:
        by_table: dict[str, list[Key]] = {}
        for (table_name, key) in reads:
            by_table.setdefault(table_name, []).append(key)
        for table_name, keys in by_table.items():
            current = _store.fetch_rows(connection, infos[table_name], keys, lock="share")
            for key in keys:
                if current.get(key) != reads[(table_name, key)]:
                    raise SerializationConflict(
                        f"commit of {self.id}: row {key!r} of {table_name!r} was changed by another process "
                        f"after this transaction read it; nothing was written — re-run the transaction "
                        f"(Database.run(fn, retries=N) does)"
                    )
        for table_name, where, fetched in scans:
            info = infos[table_name]
            statement = sa.select(info.table)
            if isinstance(where, Mapping):
                statement = statement.where(*[info.table.c[c] == v for c, v in where.items()])
            now = {tuple(row[n] for n in info.key_columns): dict(row)
                   for row in connection.execute(statement).mappings()}
            if now != fetched:
                raise SerializationConflict(
                    f"commit of {self.id}: rows of {table_name!r} it scanned were changed by another process; "
                    f"nothing was written — re-run the transaction"
                )

    def _record_batch(self, connection) -> None:
        query_id, batch_id = self.batch
        ledger = self.manager.database.table("activedb_ingestion_ledger")
        statement = (
            postgresql.insert(ledger)
            .values(query_id=query_id, batch_id=batch_id, transaction_id=self.log_id,
                    events=int(self.info.get("events", 0)), dead_letters=int(self.info.get("dead_letters", 0)),
                    watermark=self.info.get("watermark"), rule_firings=self.info.get("rule_firings", {}))
            .on_conflict_do_nothing()
            .returning(ledger.c.batch_id)
        )
        if connection.execute(statement).first() is None:
            raise BatchAlreadyCommitted(
                f"batch {batch_id} of query {query_id!r} was already committed; its effects are not applied twice"
            )

    @property
    def log_id(self) -> str:
        return f"{self.manager.process_tag}:{self.root.id}"

    def _log(self, connection, writes) -> None:
        log = self.manager.database.table("activedb_transaction_log")
        connection.execute(log.insert().values(
            transaction_id=self.log_id,
            began_at=self.began_at,
            subtransactions=self.subtransactions_committed,
            rows_written=len(writes),
            tables=sorted({row[0] for row in writes}),
            query_id=self.batch[0] if self.batch else None,
            batch_id=self.batch[1] if self.batch else None,
            info=_store.jsonable({key: value for key, value in self.info.items() if key != "watermark"}),
        ))

    def _raise_unknown_outcome(self, error: BaseException) -> None:
        """The connection broke during the flush: find out from the log whether it committed."""
        database = self.manager.database
        log = database.table("activedb_transaction_log")
        try:
            with database.engine.connect() as connection:
                committed = connection.execute(
                    sa.select(log.c.id).where(log.c.transaction_id == self.log_id)).first() is not None
        except sa.exc.DBAPIError:
            raise DatabaseUnavailable(
                f"lost the connection to PostgreSQL ({database.describe()}) while committing {self.id}; "
                f"PostgreSQL applied all of it or nothing — look for transaction_id {self.log_id!r} in "
                f"activedb_transaction_log once the server is back"
            ) from error
        if committed:
            logger.warning("connection lost after %s committed; the log confirms the commit", self.id)
            return
        raise DatabaseUnavailable(
            f"lost the connection to PostgreSQL ({database.describe()}) while committing {self.id}; nothing was "
            f"written (activedb_transaction_log has no {self.log_id!r}) — re-run the transaction"
        ) from error

    def __repr__(self) -> str:
        return f"<Transaction {self.id} {self._state.value}>"


class _InlineSubtransaction:
    def __init__(self, parent: Transaction, name: str | None):
        self._parent = parent
        self._name = name
        self.transaction: Transaction | None = None

    def __enter__(self) -> Transaction:
        self.transaction = self._parent._new_child(self._name)
        self._parent.manager.hooks.on_begin(self.transaction)
        return self.transaction

    def __exit__(self, exc_type, exc, traceback) -> bool:
        child = self.transaction
        if exc is not None:
            child.abort(exc)
            return False
        child.commit()
        return False


def _matches(image: dict, where) -> bool:
    if where is None:
        return True
    if callable(where) and not isinstance(where, Mapping):
        return bool(where(image))
    return all(image.get(column) == value for column, value in where.items())
