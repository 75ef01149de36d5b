"""The s-transaction's stamped view of the store: :class:`StoreView` forwards to the public
``Transaction`` API and records each operation in the stream history, stamped with the
s-transaction's timestamp and declared order; :class:`LockedView` (S2PL: a lock first) and
:class:`VersionedView` (LWM: versions) are the concurrent schedulers' views with the same
methods.  Thread-safety: a view belongs to the thread running its unit of work.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Hashable, Mapping, NamedTuple, TypeVar

from activedb.errors import DuplicateKey
from activedb.store import Checked, own_image
from activedb.streams._locks import LockMode
from activedb.streams._versions import DeferredWrite
from activedb.streams.errors import UndeclaredAccess

_Value = TypeVar("_Value")

if TYPE_CHECKING:  # pragma: no cover
    from activedb.events import Instant
    from activedb.store import Key, RowImage, TableInfo
    from activedb.txn import Transaction
    from activedb.streams._locks import Owner, StreamLockTable
    from activedb.streams._versions import VersionStore
    from activedb.streams._catalog import StoreCatalog
    from activedb.streams._history import StreamHistory


class Stamp(NamedTuple):
    """Who performs the operations: the unit, its s-transaction, the event, ``T.ts``, position
    (a tuple: one is made per s-transaction)."""

    unit: str
    stransaction: str
    event: str
    ts: Instant
    position: int


def _as_key(tx: Transaction, table: str, key: object, checked: Checked = Checked.WRITE) -> Key:
    """``key`` as the store names its row (``TableInfo.key``: ``0.1`` of a numeric key is ``Decimal('0.1')``, a uuid's
    text its ``UUID``, a list of a key of several columns the tuple of its values): what an operation locks, versions
    and records, so that two values of one row are one row, as in a plan (``Definitions.access_plans``).  A key the
    table refuses raises the tree's error (``checked``: what the key is for, which the refusal names)."""
    return tx.manager.catalog.table_info(table).key(key, checked)


def _kept(value: object) -> object:
    """What the stream history keeps of a Read's or a Write's ``value`` (a row image or a Write's values, None, or a
    scan's list of rows): a copy, lists and dicts in the rows too (``store.own_image``), since the reader owns what it
    got and the writer what it wrote, and either may change it in place (``row["value"] += 1`` before writing it, an
    append to a list written), which would rewrite the history ``check_stream_history`` judges."""
    if isinstance(value, dict):
        return own_image(value)
    if isinstance(value, list):
        return [own_image(row) for row in value]
    return value


class StoreView:
    """Stamped store access for one unit of work."""

    def __init__(self, tx: Transaction, stamp: Stamp, history: StreamHistory | None = None,
                 cost: Callable[[str], None] | None = None):
        self.tx = tx
        self._history = history
        self._cost = cost
        self.restamp(stamp)

    @property
    def ts(self) -> Instant:
        """The application time of the s-transaction (every operation's timestamp)."""
        return self.stamp.ts

    def restamp(self, stamp: Stamp) -> None:
        """Serve the unit of work ``stamp`` names from its first step, counted from zero (a view used again)."""
        self.stamp = stamp
        self._phase = self._rank = self._counter = 0      # the step of the next operation (see at())
        self.origin: str | None = None
        self.reads = self.writes = 0

    def at(self, phase: int, rank: int, origin: str) -> None:
        """Operations from now on are ``origin``'s, at step ``(phase, rank, …)``."""
        if phase != self._phase or rank != self._rank:
            self._phase, self._rank, self._counter = phase, rank, 0
        self.origin = origin

    def _record(self, record: Callable[..., int | None], *args: object) -> int | None:
        """``record`` (the history's ``read`` or ``write``) the operation, stamped, at the next step."""
        unit, stransaction, event, ts, position = self.stamp
        self._counter += 1
        return record(unit, stransaction, event, ts, (position, (self._phase, self._rank, self._counter)),
                      self.origin, *args)

    def _before(self, kind: str, table: str, key: Key | None) -> None:
        """Runs before every operation (``kind`` read/write; ``key`` None: the table or a
        generated key).  A locking scheduler's view waits for its lock here."""
        if self._cost is not None:
            self._cost(kind)

    # --- the store API --------------------------------------------------------------------------

    def read(self, table: str, key: Hashable) -> RowImage | None:
        key = _as_key(self.tx, table, key, Checked.READ)
        self._before("read", table, key)
        return self._read(table, key, self.tx.read(table, key))

    def read_value(self, table: str, key: Hashable, column: str) -> object:
        """``column`` of the row ``key`` (None if there is no such row): a scalar subquery's read — one read,
        counted, recorded and locked as :meth:`read` is."""
        row = self.read(table, key)
        return None if row is None else row.get(column)

    def scan(self, table: str, where: Mapping[str, object] | None = None) -> list[RowImage]:
        self._before("read", table, None)
        return self._read(table, None, self.tx.scan(table, where))

    def write(self, table: str, key: Hashable, /, **values: object) -> None:
        row = _as_key(self.tx, table, key)
        self._before("write", table, row)
        self.tx.write(table, key, **values)
        self._written(table, row, dict(values), "write")

    def insert(self, table: str, /, **values: object) -> Hashable:
        self._before("write", table, self._key_of_values(table, values))
        key = self.tx.insert(table, **values)
        self._written(table, _as_key(self.tx, table, key), dict(values), "insert")
        return key

    def delete(self, table: str, key: Hashable) -> None:
        row = _as_key(self.tx, table, key)
        self._before("write", table, row)
        self.tx.delete(table, key)
        self._written(table, row, None, "delete")

    def _read(self, table: str, key: Key | None, value: _Value, read_from: object = "derive") -> _Value:
        """Count and record a Read that has happened (``key`` None: a scan); returns ``value``.  The history keeps a
        copy (``_kept``): ``value`` is the caller's, who may change it."""
        self.reads += 1
        if self._history is not None:
            self._record(self._history.read, table, key, _kept(value), read_from)
        return value

    def _written(self, table: str, key: Key, values: RowImage | None, operation: str) -> int | None:
        """Count and record a Write that has happened (the history keeps a copy: ``_kept``); returns its history
        sequence (None: no history)."""
        self.writes += 1
        if self._history is None:
            return None
        return self._record(self._history.write, table, key, _kept(values), operation)

    def _key_of_values(self, table: str, values: Mapping[str, object]) -> Key | None:
        """The key an insert names (None if the database generates it); only locking views need it."""
        return None

    def declared(self, reads: frozenset[str] | None, writes: frozenset[str] | None) -> "DeclaredView":
        return DeclaredView(self, reads or frozenset(), writes or frozenset())


class DeclaredView:
    """A view that lets a Python action touch only the tables it declared (``read``/``scan``:
    those it reads or writes; ``write``/``insert``/``delete``: those it writes), then does what the
    view does."""

    def __init__(self, view: StoreView, reads: frozenset[str], writes: frozenset[str]):
        self._view = view
        self._reads = reads | writes
        self._writes = writes

    @property
    def ts(self) -> Instant:
        return self._view.ts

    def _check(self, table: str, kind: str) -> None:
        if table not in (self._writes if kind == "writes" else self._reads):
            raise UndeclaredAccess(
                f"rule {self._view.origin} {kind} table {table!r}, which it did not declare; add it to "
                f"{kind}=[…] of the rule (schedulers lock ahead from them)")

    def read(self, table: str, key: Hashable) -> RowImage | None:
        self._check(table, "reads")
        return self._view.read(table, key)

    def scan(self, table: str, where: Mapping[str, object] | None = None) -> list[RowImage]:
        self._check(table, "reads")
        return self._view.scan(table, where)

    def write(self, table: str, key: Hashable, /, **values: object) -> None:
        self._check(table, "writes")
        self._view.write(table, key, **values)

    def insert(self, table: str, /, **values: object) -> Hashable:
        self._check(table, "writes")
        return self._view.insert(table, **values)

    def delete(self, table: str, key: Hashable) -> None:
        self._check(table, "writes")
        self._view.delete(table, key)


# --- the concurrent schedulers' views -------------------------------------------------------------

class LockedView(StoreView):
    """A view whose every operation first waits for its lock in the batch's stream lock
    table (``table``; ``owner``: the s-transaction's lock owner) — S2PL's view."""

    def __init__(self, tx: Transaction, stamp: Stamp, history: StreamHistory | None,
                 cost: Callable[[str], None] | None, *,
                 table: "StreamLockTable", owner: "Owner", catalog: StoreCatalog):
        super().__init__(tx, stamp, history, cost)
        self._owner = owner
        self._table = table
        self._catalog = catalog

    def _before(self, kind: str, table: str, key: Key | None) -> None:
        self._table.acquire(self._owner, table, key, LockMode.READ if kind == "read" else LockMode.WRITE)
        super()._before(kind, table, key)

    def _key_of_values(self, table: str, values: Mapping[str, object]) -> Key | None:
        columns = self._catalog.table(table).key_columns
        if all(values.get(column) is not None for column in columns):
            return _as_key(self.tx, table, tuple(values[column] for column in columns))
        return None


class VersionedView(LockedView):
    """LWM's view: Reads from the version store (``versions``) at the s-transaction's position; Writes
    (granted in timestamp order) leave a version — and nothing else when ``deferred(table)`` says the
    batch writes that table back from its versions at its end (the design note's "What a Read sees"),
    else they go into the s-transaction's subtransaction too."""

    def __init__(self, tx: Transaction, stamp: Stamp, history: StreamHistory | None,
                 cost: Callable[[str], None] | None, *,
                 table: "StreamLockTable", owner: "Owner", catalog: StoreCatalog, versions: "VersionStore",
                 on_version: Callable[[int], None] | None = None,
                 validate: Callable[[str, str, Key | None], None] | None = None,
                 deferred: Callable[[str], bool] | None = None):
        super().__init__(tx, stamp, history, cost, table=table, owner=owner, catalog=catalog)
        self._versions = versions
        #: Whether this view's Writes of a table the versions track stay in the versions (written back later).
        self._deferred = deferred
        #: Told the position of every other s-transaction whose version a Read returned (the scheduler notes
        #: a commit dependency on one that may still abort).
        self._on_version = on_version
        #: Called with (kind, table, key) once an operation has seen the versions: raises if its lock is no
        #: longer granted (an earlier s-transaction that released its write locks early is run again).
        self._validate = validate

    def read(self, table: str, key: Hashable) -> RowImage | None:
        key = _as_key(self.tx, table, key, Checked.READ)
        if not self._versions.tracks(table, key):
            # No plan of the batch reads the row: the tree shows it as this Read must see it
            # (the design note's "What a Read sees").
            return super().read(table, key)
        self._before("read", table, key)
        # A query's Read (phase 0) sees the row as it was before its own s-transaction's Writes, which may
        # already have run (writes first); a rule's sees them.
        image, sequence, writer = self._versions.read(self.stamp.position, table, key, own=self._phase != 0)
        self._saw("read", table, key, writer)
        return self._read(table, key, image, sequence)

    def scan(self, table: str, where: Mapping[str, object] | None = None) -> list[RowImage]:
        if not self._versions.tracks_table(table):
            return super().scan(table, where)          # as for read: covered by its own write lock only
        self._before("read", table, None)
        rows, seen, writers = self._versions.scan(self.stamp.position, table, where, own=self._phase != 0)
        self._saw("read", table, None, *writers)
        return self._read(table, None, rows, seen)

    def _saw(self, kind: str, table: str, key: Key | None, *writers: int | None) -> None:
        """An operation of ``kind`` saw the versions written at ``writers`` (None: the base image): each other
        s-transaction's is a dependency (``on_version``), and the operation's lock must still be granted
        (``validate``)."""
        if self._on_version is not None:
            for writer in writers:
                if writer is not None and writer != self.stamp.position:
                    self._on_version(writer)
        if self._validate is not None:
            self._validate(kind, table, key)

    # --- Writes that stay in the versions (``deferred``) ------------------------------------------------

    def write(self, table: str, key: object, /, **values: object) -> None:
        key = _as_key(self.tx, table, key)
        if not self._defers(table, key):
            return super().write(table, key, **values)
        self._before("write", table, key)
        info, row_key = self._checked(table, key)
        patch = info.values_without_key(row_key, dict(values))
        previous = self._previous(table, key)
        image = ({**previous, **patch} if previous is not None
                 else {**info.blank_row, **patch, **info.full_key_row(row_key)})      # (an upsert creates it)
        self._version(table, key, image, dict(values), "write")

    def insert(self, table: str, /, **values: object) -> Hashable:
        key = self._key_of_values(table, values)
        if key is None or not self._defers(table, key):
            return super().insert(table, **values)
        self._before("write", table, key)
        info = self.tx.manager.catalog.table_info(table)
        checked = info.check_values(values)
        row_key = info.key(info.key_from_values(checked))
        if self._previous(table, key) is not None:
            raise DuplicateKey(f"insert into {info.name!r}: a row with key {row_key!r} already exists; use "
                               f"write() to upsert")
        self._version(table, key, {**info.blank_row, **checked, **info.full_key_row(row_key)}, dict(values),
                      "insert")
        return row_key[0] if len(row_key) == 1 else row_key

    def delete(self, table: str, key: object) -> None:
        key = _as_key(self.tx, table, key)
        if not self._defers(table, key):
            return super().delete(table, key)
        self._before("write", table, key)
        self._checked(table, key)
        self._previous(table, key)
        self._version(table, key, None, None, "delete")

    def _defers(self, table: str, key: Key) -> bool:
        return self._deferred is not None and self._versions.tracks(table, key) and self._deferred(table)

    def _checked(self, table: str, key: Key) -> tuple[TableInfo, Key]:
        """The table's info and the key as the table takes it (the tree's checks, which raise its errors)."""
        info = self.tx.manager.catalog.table_info(table)
        return info, info.key(key[0] if len(key) == 1 else key)

    def _previous(self, table: str, key: Key) -> RowImage | None:
        """The row as this s-transaction's Write finds it (its own earlier Writes included); the version it
        came from is a dependency, and the Write's lock must still be granted."""
        previous, _, writer = self._versions.read(self.stamp.position, table, key)
        self._saw("write", table, key, writer)          # the new image is built on that version
        return previous

    def _version(self, table: str, key: Key, image: RowImage | None, values: RowImage | None, operation: str) -> None:
        """Record the Write (history, counts) and leave its version, to be written back at the batch's end."""
        sequence = StoreView._written(self, table, key, values, operation)
        self._versions.append(self.stamp.position, table, key, image, sequence,
                              deferred=DeferredWrite(table, key, operation, values))

    def _written(self, table: str, key: Key, values: RowImage | None, operation: str) -> int | None:
        """A Write that went into the subtransaction: also leave the row's new version (its Writes are
        granted in position order)."""
        versions = self._versions
        tracked = versions.tracks(table, key)
        if tracked and values is not None:
            # (``values``: StoreView's dict of the Write's values, whose lists are the action's, which it may change
            # after writing them — ``tx.write`` took them as they were: so does the version built of them)
            values = own_image(values, fresh=True)
        sequence = super()._written(table, key, values, operation)
        if tracked:
            image = None
            if operation == "write":
                # A write patches the row: over the version this s-transaction sees (every earlier
                # writer ended), the new image is that one with the values; activedb stores values
                # as given (checked, not converted).  A row it creates is read back from the tree.
                previous = self._previous(table, key)
                image = {**previous, **values} if previous is not None else self.tx.read(table, key)  # type: ignore[dict-item]
            elif operation == "insert":
                image = self.tx.read(table, key)
            versions.append(self.stamp.position, table, key, image, sequence)
        return sequence
