"""Recording lineage: what a top-level transaction consumed, produced, who triggered it, what undoes it,
on the transaction manager's seams (the package README's module table and "Lineage, recorded").

Thread-safety: ``LineageRecord.mutex`` protects the record's lists and its writer; every other object
is immutable after construction or used by one flush at a time.
"""

from __future__ import annotations

import json
import threading
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterable, TypeAlias

import sqlalchemy as sa

from activedb import lowlevel
from activedb.rules import FiringOutcome
from activedb.txn import Along, CommitParticipant, FiringView, Observer, TransactionExtension, TxnState
from activedb.store import jsonable

from activedb.atomic.errors import LineageError

if TYPE_CHECKING:  # pragma: no cover
    from activedb.events import Event
    from activedb.store import Catalog
    from activedb.store import Key
    from activedb.txn import Transaction

#: A row: its table and its key.
RowId: TypeAlias = "tuple[str, Key]"


@dataclass(frozen=True, order=True)
class BatchRef:
    """A batch of a stream: ``(query_id, batch_id)``; ids are text (a Spark batch id ``7`` is ``"7"``)."""

    query_id: str
    batch_id: str

    @classmethod
    def of(cls, query_id: object, batch_id: object) -> "BatchRef":
        if isinstance(query_id, BatchRef):
            return query_id
        if not isinstance(query_id, str) or not query_id:
            raise LineageError(f"a batch is (query_id, batch_id) with a non-empty text query id, got {query_id!r}")
        if batch_id is None:
            raise LineageError(f"batch of {query_id!r}: the batch id is missing")
        return cls(query_id, str(batch_id))

    def __str__(self) -> str:
        return f"{self.query_id}/{self.batch_id}"


@dataclass(eq=False)
class LineageRecord:
    """The lineage of one tree (the slot of its root).  ``mutex`` protects every field."""

    mutex: threading.Lock = field(default_factory=threading.Lock)
    consumed: dict[BatchRef, None] = field(default_factory=dict)     # ordered sets
    produced: dict[BatchRef, None] = field(default_factory=dict)
    parents: dict[str, None] = field(default_factory=dict)
    compensates: str | None = None
    notes: list[dict[str, object]] = field(default_factory=list)                 # filled by the notes' before_flush
    undo_keys: dict[RowId, None] = field(default_factory=dict)
    # Invariant: at most one LineageWriter per tree is enlisted at a time (None: none yet, or the node it
    # was enlisted in aborted before delegating it).
    writer: "LineageWriter | None" = None


def record_of(transaction: "Transaction") -> LineageRecord:
    """The lineage record of ``transaction``'s tree, with its writer enlisted (on the root while the root
    is active, else on ``transaction`` itself, whence it is delegated to the root)."""
    root = transaction.root
    if transaction.state in (TxnState.COMMITTED, TxnState.ABORTED) or root.state in (TxnState.COMMITTED,
                                                                                    TxnState.ABORTED):
        raise LineageError(f"cannot record lineage in {transaction.id}: its tree has ended "
                           f"({root.state.value}); record it while the transaction runs")
    record = lowlevel.slot(root, LineageRecord)
    with record.mutex:
        if record.writer is not None:
            return record
        writer = record.writer = LineageWriter(record)
    target = root if root.state is TxnState.ACTIVE else transaction
    try:
        lowlevel.enlist(target, writer)
    except Exception as error:
        with record.mutex:
            record.writer = None
        raise LineageError(f"cannot record lineage in {transaction.id}: {error}; record it while the transaction "
                           f"is active") from error
    return record


#: The lineage row and its batch references, one statement; driver SQL (``exec_driver_sql``): it runs in every
#: flush that consumes or produces a batch, where building and compiling a SQLAlchemy statement cost more than
#: PostgreSQL's work for it.
_LINEAGE_ROWS = """
    WITH row AS (
        INSERT INTO activedb_lineage (transaction_id, name, parents, compensates, notes)
        VALUES (%(id)s, %(name)s, %(parents)s, %(compensates)s, CAST(%(notes)s AS jsonb))
        RETURNING transaction_id)
    INSERT INTO activedb_lineage_batches (transaction_id, role, query_id, batch_id)
    SELECT row.transaction_id, b.role, b.query_id, b.batch_id
      FROM row, unnest(CAST(%(roles)s AS text[]), CAST(%(queries)s AS text[]), CAST(%(batches)s AS text[]))
           AS b(role, query_id, batch_id)
    ON CONFLICT DO NOTHING"""


class LineageWriter(CommitParticipant):
    """Writes a tree's :class:`LineageRecord` in its flush (the package README, "Lineage, recorded")."""

    def __init__(self, record: LineageRecord):
        self.record = record
        # The connection of the flush attempt that wrote already (a retried flush, on a new connection,
        # writes again; a writer enlisted twice writes once).  A weak reference: a dead connection's
        # id may be reused by the next one.
        self._written_on: weakref.ref[sa.Connection] | None = None
        self._before: dict[RowId, dict[str, object] | None] = {}
        # The lineage rows of this flush attempt, until the flush takes them (statements_along): they ride in its
        # last round trip, before the undo rows of ``about_to_commit`` that refer to them.
        self._along: tuple[Along, ...] = ()

    def write(self, transaction: "Transaction", connection: sa.Connection) -> None:
        if self._written_on is not None and self._written_on() is connection:
            return
        self._written_on = weakref.ref(connection)
        record = self.record
        with record.mutex:
            consumed, produced = list(record.consumed), list(record.produced)
            parents, notes, keys = list(record.parents), list(record.notes), list(record.undo_keys)
            compensates = record.compensates
        refs = consumed + produced
        self._along = (Along(_LINEAGE_ROWS, {
            "id": transaction.log_id, "name": transaction.name, "parents": parents, "compensates": compensates,
            "notes": json.dumps(notes), "roles": ["C"] * len(consumed) + ["P"] * len(produced),
            "queries": [ref.query_id for ref in refs], "batches": [ref.batch_id for ref in refs]}),)
        self._before = row_images(transaction.manager.catalog, connection, keys, lock=True) if keys else {}

    def statements_along(self, transaction: "Transaction") -> tuple[Along, ...]:
        along, self._along = self._along, ()
        return along

    def acts_before_commit(self, transaction: "Transaction") -> bool:
        return bool(self._before)         # the after-images of undo keys, read before COMMIT

    def about_to_commit(self, transaction: "Transaction", connection: sa.Connection) -> None:
        before = self._before
        if not before:
            return
        after = row_images(transaction.manager.catalog, connection, list(before), lock=False)
        rows: list[dict[str, object]] = []
        for (table_name, key), image in before.items():
            new = after[(table_name, key)]
            if new == image:
                continue       # an aborted subtransaction's key, or a write of the same values
            rows.append({"id": transaction.log_id, "seq": len(rows), "table": table_name,
                         "key": json.dumps(jsonable(key)), "before": _json(image), "after": _json(new)})
        if rows:
            connection.execute(sa.text(
                "INSERT INTO activedb_lineage_undo (transaction_id, seq, table_name, row_key, before_image, "
                "after_image) VALUES (:id, :seq, :table, CAST(:key AS jsonb), CAST(:before AS jsonb), "
                "CAST(:after AS jsonb))"), rows)

    def aborted(self, transaction: "Transaction", error: BaseException | None) -> None:
        record = self.record
        with record.mutex:
            if record.writer is self and not transaction.is_top_level:
                record.writer = None    # dropped with a subtransaction: the next fact enlists a new one


def _json(image: dict[str, object] | None) -> str | None:
    return None if image is None else json.dumps(jsonable(image))


def row_images(catalog: Catalog, connection: sa.Connection, keys: list[RowId], *, lock: bool
               ) -> dict[RowId, dict[str, object] | None]:
    """The images of ``(table, display key)`` rows as ``connection`` sees them; None where there is none."""
    by_table: dict[str, list[Key]] = {}
    for table_name, key in keys:
        by_table.setdefault(table_name, []).append(key)
    images: dict[RowId, dict[str, object] | None] = {}
    for table_name, display_keys in by_table.items():
        table = catalog.table(table_name)
        columns = [column for column in table.primary_key.columns]
        normal = [key if isinstance(key, tuple) else (key,) for key in display_keys]
        condition = (sa.tuple_(*columns).in_(normal) if len(columns) > 1
                     else columns[0].in_([key[0] for key in normal]))
        statement = sa.select(table).where(condition)
        if lock:
            statement = statement.with_for_update()
        found = {tuple(row[column.name] for column in columns): dict(row)
                 for row in connection.execute(statement).mappings()}
        for display_key, key in zip(display_keys, normal):
            images[(table_name, display_key)] = found.get(key)
    return images


class NoteParticipant(CommitParticipant):
    """One compensation note, enlisted on the node that made it; reaches the root's record by delegation."""

    def __init__(self, record: LineageRecord, note: dict[str, object]) -> None:
        self.record = record
        self.note = note

    def before_flush(self, transaction: "Transaction") -> None:
        with self.record.mutex:
            self.record.notes.append(self.note)


class ConsumedBatches(CommitParticipant):
    """Records, at the flush of the tree it is enlisted in, that the tree consumed ``refs``
    (``db.batches.consuming(query, batch)``); why it may run a lineage writer itself: the package README,
    "Split batches".  Reusable across attempts (a re-run batch enlists it in a new tree); one flush at a time."""

    def __init__(self, refs: Iterable[BatchRef]):
        self.refs = tuple(refs)
        self._writer: LineageWriter | None = None   # the writer this participant runs (no other one enlisted)

    def before_flush(self, transaction: "Transaction") -> None:
        record = lowlevel.slot(transaction.root, LineageRecord)
        self._writer = None
        with record.mutex:
            for ref in self.refs:
                record.consumed[ref] = None
            if record.writer is None:
                # Invariant kept: the record's one writer is this participant's (enlisted through it).
                record.writer = self._writer = LineageWriter(record)

    def write(self, transaction: "Transaction", connection: sa.Connection) -> None:
        if self._writer is not None:
            self._writer.write(transaction, connection)

    def statements_along(self, transaction: "Transaction") -> tuple[Along, ...]:
        return self._writer.statements_along(transaction) if self._writer is not None else ()

    def acts_before_commit(self, transaction: "Transaction") -> bool:
        return self._writer is not None and self._writer.acts_before_commit(transaction)

    def about_to_commit(self, transaction: "Transaction", connection: sa.Connection) -> None:
        if self._writer is not None:
            self._writer.about_to_commit(transaction, connection)


def add_note(transaction: "Transaction", note: dict[str, object]) -> None:
    record = record_of(transaction)
    lowlevel.enlist(transaction, NoteParticipant(record, note))


def encode_event(event: Event) -> dict[str, object]:
    """``event`` as a note keeps it for a rule compensation (``decode_event``): every field, its ``origin`` too — a
    captured change (``Origin.EXTERNAL``) must reach the compensation as one."""
    encoded: dict[str, object] = jsonable({"kind": getattr(event.kind, "value", event.kind), "source": event.source, "key": event.key,
                     "old": event.old, "new": event.new, "payload": event.payload, "ts": event.ts,
                     "transaction": event.transaction, "origin": getattr(event.origin, "value", event.origin)})
    return encoded


class UndoKeys(TransactionExtension):
    """Collects the keys written in tables opted into before-image undo."""

    def __init__(self, tables: Iterable[str] = ()):
        self.tables = frozenset(tables)

    def wants_old_images(self, table: str) -> bool:
        return table in self.tables

    def on_event(self, transaction: "Transaction", event: Event) -> None:
        if (event.source not in self.tables or event.old is event.new is None
                or getattr(event.kind, "value", None) not in ("inserted", "updated", "deleted")):
            return
        key = event.key if not isinstance(event.key, list) else tuple(event.key)
        record = record_of(transaction)
        with record.mutex:
            record.undo_keys[(event.source, key)] = None


class RuleNotes(Observer):
    """Notes every firing of a rule that ``has_compensation(name)``, in the firing's own transaction, with its event
    as the rule got it: encoded as the firing starts (``_FiredEvents``), since a rule may change its event's dicts.

    Thread-safety: keeps nothing itself; what it encodes lives in the firing's transaction's slot."""

    def __init__(self, has_compensation: Callable[[str], bool]):
        self.has_compensation = has_compensation

    def on_firing_start(self, transaction: "Transaction", firing: FiringView) -> None:
        if self.has_compensation(firing.rule.name):
            lowlevel.slot(transaction, _FiredEvents).encoded[id(firing)] = encode_event(firing.event)

    def on_firing_end(self, transaction: "Transaction", firing: FiringView, outcome: FiringOutcome) -> None:
        # Called in the firing's own transaction, before it commits: the note commits (or is dropped)
        # with the firing's effects.
        fired = lowlevel.slot(transaction, _FiredEvents, create=False)
        encoded = fired.encoded.pop(id(firing), None) if fired is not None else None
        if outcome is not FiringOutcome.EXECUTED or encoded is None:
            return
        add_note(transaction, {"kind": "rule", "rule": firing.rule.name, "event": encoded})


class _FiredEvents:
    """A firing transaction's events of rules with compensations, encoded as each firing started (``RuleNotes``).

    Thread-safety: a transaction's firings start and end on the thread that runs the transaction."""

    def __init__(self) -> None:
        # id of a running firing -> its event as encoded at its start (removed at its end)
        self.encoded: dict[int, dict[str, object]] = {}
