"""Compensation of a source batch (Vidyasankar, *On Atomic Batch Executions in Stream Processing*, §2–§4).

:func:`plan` decides from the recorded graph, changing nothing (scope, mode, interference, partially
dropped batches, kept transactions, unsafe undo); :func:`execute` runs it, exactly once across crashes.
The paper's words mapped to these: the package README, "Compensation".
"""

from __future__ import annotations

import base64
import datetime
import decimal
import json
import logging
import re
import threading
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping

import networkx as nx
import sqlalchemy as sa

from activedb._closedset import ClosedSet
from activedb.events import Event, EventKind, Origin
from activedb.errors import UNIQUE_VIOLATION, DatabaseError, UnknownTable
from activedb.store import jsonable

from activedb.atomic._graph import (IndependentScover, LineageExplorer, TransactionLineage, composite,
                                    independent_scover, source_batches)
from activedb.atomic._lineage import BatchRef, record_of, row_images
from activedb.atomic.errors import CompensationFailed, LineageError, NoCompensation, UnknownBatch, UnsafeUndo

if TYPE_CHECKING:  # pragma: no cover
    from activedb._handle import DatabaseHandle
    from activedb.txn import Transaction

logger = logging.getLogger("activedb.atomic")


def _declared(function: Callable[..., object] | None, missing: str) -> Callable[..., object]:
    if function is None:
        raise LineageError(f"{missing}, then compensate again")
    return function


class Compensations:
    """The compensations declared in this process (``db.batches`` declares them; compensating looks them up).

    Thread-safe: ``_mutex`` protects the three maps and is a leaf (nothing is called while it is held)."""

    def __init__(self, db: "DatabaseHandle") -> None:
        self.db = db
        self._mutex = threading.Lock()
        self._actions: dict[str, Callable[..., object]] = {}              # name -> fn(tx, **args)
        self._rule_actions: dict[str, Callable[..., object]] = {}         # rule name -> fn(tx, event)
        self._transaction_actions: dict[str, Callable[..., object]] = {}  # transaction name -> fn(tx, lineage)

    def declare(self, name: str, function: Callable[..., object], *, rule: bool = False,
                transaction: bool = False) -> None:
        """Declare ``function`` as the compensation ``name``, or of rule ``name``, or of transaction ``name``."""
        table = self._rule_actions if rule else self._transaction_actions if transaction else self._actions
        with self._mutex:
            table[name] = function

    def declares(self, name: str) -> bool:
        """Whether a compensation named ``name`` (``db.batches.compensation``) is declared."""
        with self._mutex:
            return name in self._actions

    def has_rule_compensation(self, rule_name: str) -> bool:
        return rule_name in self._rule_actions

    def rule_compensation_of(self, rule_name: str) -> Callable[..., object]:
        return _declared(self._rule_actions.get(rule_name), f"a firing of rule {rule_name!r} was noted but no "
                         f"rule_compensation is declared for it in this process; declare it")

    def compensation_of(self, name: str) -> Callable[..., object]:
        return _declared(self._actions.get(name), f"compensation {name!r} was noted but is not declared in this "
                         f"process; declare it with @db.batches.compensation({name!r})")

    def transaction_compensation_of(self, name: str) -> Callable[..., object] | None:
        return self._transaction_actions.get(name)

    def has_compensation_for(self, node: TransactionLineage) -> bool:
        return bool(node.notes) or (node.name is not None and node.name in self._transaction_actions)

    def undeclared(self, node: TransactionLineage) -> list[str]:
        """The compensations ``node``'s notes name that this process does not declare (as a user declares them),
        each once: running them would fail midway through a compensation."""
        with self._mutex:
            found = [f"compensation {note['action']!r}" if note.get("kind") != "rule" else
                     f"rule_compensation of rule {note['rule']!r}" for note in node.notes
                     if (note["rule"] not in self._rule_actions if note.get("kind") == "rule"
                         else note["action"] not in self._actions)]
        return list(dict.fromkeys(found))


class CompensationMode(ClosedSet):
    """What a compensation undoes of a batch's transactions."""

    FULL = "full"                      # all of them (𝒯(b))
    NON_INTRUSIVE = "non-intrusive"    # the prefix shared with no other batch


class CompensationScope(ClosedSet):
    """Which transactions a compensation starts from."""

    BATCH = "batch"                    # the batch's own
    INDEPENDENT = "independent"        # its independent scover


@dataclass
class UndoRow:
    transaction_id: str
    table: str
    key: Any
    before: dict[str, Any] | None
    after: dict[str, Any] | None


@dataclass
class Unsafe:
    """A before-image undo that would lose or contradict what a later transaction did."""

    transaction_id: str
    table: str | None
    key: Any
    reason: str


@dataclass
class CompensationPlan:
    batch: BatchRef
    mode: CompensationMode
    scope: CompensationScope
    targets: set[BatchRef]
    order: list[str]                       # reverse topological order: what runs, first to last
    already: set[str]                      # compensated before (skipped)
    losing_completion: set[BatchRef]       # source batches outside the scope whose 𝒯 loses a transaction
    partially_dropped: set[BatchRef]
    kept: set[str]                         # of 𝒯(targets), left in place (non-intrusive)
    unsafe: list[Unsafe]
    missing: list[str]                     # transactions with effects and nothing that undoes them
    cover: IndependentScover | None = None
    nodes: dict[str, TransactionLineage] = field(default_factory=dict)
    undo: dict[str, list[UndoRow]] = field(default_factory=dict)

    @property
    def interfering(self) -> bool:
        return bool(self.losing_completion)

    def describe(self) -> dict[str, object]:
        return {
            "batch": str(self.batch), "mode": self.mode.value, "scope": self.scope.value,
            "targets": sorted(map(str, self.targets)),
            "compensate_in_order": [self._label(tid) for tid in self.order],
            "already_compensated": sorted(self.already),
            "interfering": self.interfering,
            "losing_completion": sorted(map(str, self.losing_completion)),
            "partially_dropped": sorted(map(str, self.partially_dropped)),
            "kept": sorted(self._label(tid) for tid in self.kept),
            "unsafe": [f"{item.transaction_id} {item.table or ''} {item.key if item.key is not None else ''}: "
                       f"{item.reason}".replace("  ", " ") for item in self.unsafe],
            "missing_compensation": sorted(self.missing),
            "independent_scover": None if self.cover is None else {
                "batches": sorted(map(str, self.cover.batches)), "rounds": self.cover.rounds,
                "cut_at_bound": None if self.cover.cut is None else self.cover.cut.value},
        }

    def _label(self, tid: str) -> str:
        node = self.nodes.get(tid)
        return f"{tid} ({node.name})" if node is not None and node.name else tid


@dataclass
class CompensationReport:
    plan: CompensationPlan
    dry_run: bool
    compensated: list[str] = field(default_factory=list)   # by this call, in order
    compensating: dict[str, str] = field(default_factory=dict)   # compensated -> compensating log id

    def describe(self) -> dict[str, object]:
        return {**self.plan.describe(), "dry_run": self.dry_run, "compensated": self.compensated,
                "compensating_transactions": self.compensating}


def plan(batches: Compensations, explorer: LineageExplorer, batch: BatchRef, *, mode: CompensationMode, scope: CompensationScope,
         max_rounds: int, max_transactions: int, consecutive: bool) -> CompensationPlan:
    if not explorer.consumers([batch]):
        raise UnknownBatch.not_consumed(batch, explorer.known_batches(batch.query_id))
    cover = None
    if scope is CompensationScope.INDEPENDENT:
        cover = independent_scover(explorer, batch, max_rounds=max_rounds, max_transactions=max_transactions,
                                   consecutive=consecutive)
        targets = set(cover.batches) | {batch}
    else:
        targets = {batch}
    everything: set[str] = set().union(*(composite(explorer, target)[0] for target in targets))
    # The other source batches b with tid ∈ 𝒯(b): those consumed by tid or an ancestor.
    others = {tid: source_batches(explorer, explorer.ancestors_or_self([tid])[0]) - targets for tid in everything}
    chosen = set(everything) if mode is CompensationMode.FULL else {tid for tid in everything if not others[tid]}
    nodes = explorer.load(everything)
    already = {tid for tid in chosen if nodes[tid].compensated_by is not None}
    graph = explorer.graph(chosen)
    try:
        # Siblings newest first: the reverse of the order in which they committed (recorded_at), which is a
        # topological one (a transaction commits before those it triggers), so each undo meets its own after-image.
        ran = nx.lexicographical_topological_sort(graph, key=lambda tid: (nodes[tid].recorded_at, tid))
        order = [tid for tid in reversed(list(ran)) if tid not in already]
    except nx.NetworkXUnfeasible:
        edges = nx.find_cycle(graph)
        cycle = " → ".join([tid for tid, _ in edges] + [edges[0][0]])
        raise LineageError(f"compensating {batch}: the recorded lineage has a cycle {cycle} — a transaction consumed "
                           f"a batch it or a transaction it triggered produced, or names one of them in triggered_by "
                           f"— so no reverse order exists; nothing was compensated. Record each batch as the output of "
                           f"the transaction that made it (db.batches.produced) and the input of those that read it "
                           f"(consumed)") from None
    losing = set().union(*(others[tid] for tid in chosen))
    partially = _partially_dropped(explorer, chosen, targets)
    kept = everything - chosen
    undo = _undo_rows(batches, explorer.connection, batch, order)
    unsafe = _unsafe(batches, explorer, chosen, undo, order)
    missing = _missing(batches, explorer.connection, nodes, order, undo)
    return CompensationPlan(batch, mode, scope, targets, order, already, losing, partially, kept, unsafe,
                            missing, cover, nodes, undo)


def _partially_dropped(explorer: LineageExplorer, chosen: set[str], targets: set[BatchRef]) -> set[BatchRef]:
    result: set[BatchRef] = set()
    for node in explorer.load(chosen).values():
        for ref in node.consumed:
            producers = explorer.producers([ref])
            still_exists = (ref not in targets) if not producers else not producers <= chosen
            if still_exists:
                result.add(ref)
    return result


def _undo_rows(batches: Compensations, connection: sa.Connection, batch: BatchRef, ids: list[str]
               ) -> dict[str, list[UndoRow]]:
    rows: dict[str, list[UndoRow]] = {}
    for row in connection.execute(sa.text(
            "SELECT transaction_id, table_name, row_key, before_image, after_image FROM activedb_lineage_undo "
            " WHERE transaction_id = ANY(:ids) ORDER BY transaction_id, seq"), {"ids": list(ids)}):
        try:
            key = _typed_key(batches, row.table_name, row.row_key)
        except UnknownTable as error:
            raise UnknownTable(
                f"compensating {batch}: {row.transaction_id} kept before-images of table {row.table_name!r}, which "
                f"the database no longer has (dropped or renamed since): its rows cannot be restored, and nothing "
                f"was compensated. Create the table again (db.schema.refresh() once it exists) to compensate the "
                f"batch; a batch you will not compensate is forgotten with db.batches.prune") from error
        rows.setdefault(row.transaction_id, []).append(
            UndoRow(row.transaction_id, row.table_name, key, row.before_image, row.after_image))
    return rows


def _unsafe(batches: Compensations, explorer: LineageExplorer, chosen: set[str],
            undo: dict[str, list[UndoRow]], order: list[str]) -> list[Unsafe]:
    found: list[Unsafe] = []
    current = row_images(batches.db.catalog, explorer.connection,
                         [(row.table, row.key) for rows in undo.values() for row in rows], lock=False)
    # The image each undo row meets when its transaction's turn comes: compensating in ``order`` restores first the
    # before-images of the transactions undone earlier (a later writer of the row that is compensated too), as
    # ``_apply`` then checks in turn.
    images: dict[tuple[str, object], object] = {row_id: jsonable(image) for row_id, image in current.items()}
    met: dict[tuple[str, int], object] = {}
    for tid in order:
        for index, row in reversed(list(enumerate(undo.get(tid, [])))):
            met[(tid, index)] = images[(row.table, row.key)]
            images[(row.table, row.key)] = row.before
    for tid, rows in undo.items():
        readers = explorer.children([tid]) - chosen
        if readers:
            found.append(Unsafe(tid, None, None, f"its output was read by transactions that are not compensated: "
                                                 f"{', '.join(sorted(readers))}"))
        for index, row in enumerate(rows):
            changed, added = _changes(row.after, met[(tid, index)])
            if changed:
                later = _later_writers(explorer.connection, row, chosen)
                who = f" (recorded later writers: {', '.join(later)})" if later else ""
                found.append(Unsafe(tid, row.table, row.key, f"a later transaction changed the row after it{who}: "
                                                             f"restoring its before-image would lose that change"))
            elif added:
                found.append(Unsafe(tid, row.table, row.key, f"the row holds a value in a column added to the table "
                                                             f"since ({', '.join(added)}): restoring its before-image "
                                                             f"would lose it"))
    return found


def _changes(after: Mapping[str, object] | None, met: object) -> tuple[bool, list[str]]:
    """How the row an undo meets (``met``, JSON values) differs from the after-image its transaction left:
    ``(changed, added)`` — whether it was deleted, made again or a column of the after-image holds another value,
    and the columns added to the table since that hold a value (not null).  A column dropped since is no
    difference: nothing of it is left to lose, or to restore."""
    if after is None or not isinstance(met, Mapping):
        return after is not met, []
    changed = any(after[name] != met[name] for name in after.keys() & met.keys())
    return changed, sorted(name for name in met.keys() - after.keys() if met[name] is not None)


def _later_writers(connection: sa.Connection, row: UndoRow, chosen: set[str]) -> list[str]:
    found = connection.execute(sa.text(
        "SELECT u.transaction_id FROM activedb_lineage_undo u JOIN activedb_lineage l USING (transaction_id) "
        " WHERE u.table_name = :t AND u.row_key = CAST(:k AS jsonb) AND l.recorded_at >= "
        "       (SELECT recorded_at FROM activedb_lineage WHERE transaction_id = :id) AND u.transaction_id <> :id"),
        {"t": row.table, "k": json.dumps(jsonable(row.key)), "id": row.transaction_id}).scalars()
    return sorted(tid for tid in found if tid not in chosen)


def _missing(batches: Compensations, connection: sa.Connection, nodes: dict[str, TransactionLineage], order: list[str],
             undo: dict[str, list[UndoRow]]) -> list[str]:
    """The transactions of ``order`` nothing undoes: rows written and no compensation, or a noted compensation this
    process does not declare (whether it wrote rows or not: the note says something must be undone)."""
    candidates = [tid for tid in order if not batches.has_compensation_for(nodes[tid]) and tid not in undo]
    written: dict[str, int] = {} if not candidates else dict(connection.execute(sa.text(
        "SELECT transaction_id, rows_written FROM activedb_transaction_log WHERE transaction_id = ANY(:ids)"),
        {"ids": candidates}).all())
    return [tid for tid in order if written.get(tid, 0) or batches.undeclared(nodes[tid])]


# --- execution ------------------------------------------------------------------------------------

def execute(batches: Compensations, compensation: CompensationPlan, *, allow_unsafe: bool) -> CompensationReport:
    report = CompensationReport(compensation, dry_run=False)
    if compensation.missing:
        def why(tid: str) -> str:
            node = compensation.nodes[tid]
            undeclared = batches.undeclared(node)
            if undeclared:
                return f"{tid} (its notes name {', '.join(undeclared)}, not declared in this process)"
            if len(node.rules) > 1:
                return (f"{tid} (it wrote rows: one outbox group transaction ran detached firings of rules "
                        f"{', '.join(map(repr, node.rules))} together, so no rule's transaction compensation "
                        f"(rule:<name>) applies to it — a rule's firings run in transactions of their own once its "
                        f"transaction_compensation or rule_compensation is declared in the process that runs them, not "
                        f"before; this group's "
                        f"rows are to be undone by hand)")
            return f"{tid} (it wrote rows)"
        raise NoCompensation(
            f"compensating {compensation.batch}: {', '.join(map(why, compensation.missing))} — nothing undoes them; "
            f"declare the compensation (db.batches.compensation / rule_compensation / transaction_compensation; on the "
            f"command line --app) or opt their tables into db.batches.undo_by_before_image(...) — nothing was "
            f"compensated")
    if compensation.unsafe and not allow_unsafe:
        details = "; ".join(f"{item.transaction_id}: {item.reason}" for item in compensation.unsafe)
        raise UnsafeUndo(
            f"compensating {compensation.batch} by before-images is unsafe: {details}. Nothing was compensated; "
            f"compensate with mode='full' (or a larger scope), declare logical compensations, or pass "
            f"allow_unsafe=True to restore the images anyway")
    for tid in compensation.order:
        try:
            with batches.db.transaction(name=f"compensate:{tid}") as tx:
                record = record_of(tx)
                with record.mutex:
                    record.compensates = tid
                _apply(batches, tx, compensation.nodes[tid], compensation.undo.get(tid, []), allow_unsafe)
                log_id = tx.log_id
        except UnsafeUndo as error:         # (a row changed since the plan: by a compensation that ran before)
            if not report.compensated:
                raise
            raise UnsafeUndo(
                f"{error}; {len(report.compensated)} transaction(s) before it ({', '.join(report.compensated)}) were "
                f"compensated and recorded — set the row back, or pass allow_unsafe=True to restore the images "
                f"anyway, and run the same compensation again: it resumes after them") from error
        except NoCompensation:
            raise
        except Exception as error:
            if isinstance(error, DatabaseError) and error.sqlstate == UNIQUE_VIOLATION and _compensated(batches, tid):
                logger.info("%s was compensated meanwhile by another run; skipped", tid)
                continue
            cause = error if isinstance(error, DatabaseError) else repr(error)
            raise CompensationFailed(
                f"compensating {tid} failed: {cause}; {len(report.compensated)} transaction(s) before it were "
                f"compensated and recorded — fix the cause and run the same compensation again to resume") from error
        report.compensating[tid] = log_id          # (once committed: a run that lost the race above names none)
        report.compensated.append(tid)
    return report


def _compensated(batches: Compensations, tid: str) -> bool:
    with batches.db.engine.connect() as connection:
        return connection.execute(sa.text("SELECT 1 FROM activedb_lineage WHERE compensates = :id"),
                                  {"id": tid}).first() is not None


def _apply(batches: Compensations, tx: Transaction, node: TransactionLineage, undo: list[UndoRow], allow_unsafe: bool) -> None:
    """Undo ``node`` inside ``tx``: its notes newest first, its named-transaction compensation, then the
    before-images of its undoable rows, newest first."""
    for note in reversed(node.notes):
        if note.get("kind") == "rule":
            function = batches.rule_compensation_of(note["rule"])
            function(tx, decode_event(note["event"]))
        else:
            function = batches.compensation_of(note["action"])
            function(tx, **note.get("args", {}))
    compensation = None if node.name is None else batches.transaction_compensation_of(node.name)
    if compensation is not None:
        compensation(tx, node)
    for row in reversed(undo):
        current = tx.read(row.table, row.key)
        if any(_changes(row.after, jsonable(current))) and not allow_unsafe:
            raise UnsafeUndo(f"row {row.key!r} of {row.table!r} changed after {row.transaction_id} wrote it; "
                             f"nothing of this compensation step was written")
        if row.before is None:
            if current is not None:
                tx.delete(row.table, row.key)
        else:
            tx.write(row.table, row.key, **_typed(batches, row.table, row.before))


def _typed(batches: Compensations, table_name: str, image: Mapping[str, object]) -> dict[str, object]:
    """A JSON image back into the column types (:func:`_decoded`)."""
    table = batches.db.table(table_name)
    keys = {column.name for column in table.primary_key.columns}
    return {name: _decoded(table.c[name].type, value) for name, value in image.items()
            if name not in keys and name in table.c}


def _typed_key(batches: Compensations, table_name: str, key: object) -> object:
    """A JSON key back as the row's key (:func:`_decoded`): a tuple for a key of several columns."""
    columns = list(batches.db.table(table_name).primary_key.columns)
    if len(columns) == 1:
        return _decoded(columns[0].type, key)
    values = key if isinstance(key, list) else [key]
    return tuple(_decoded(column.type, value) for column, value in zip(columns, values))


def _decoded(column_type: sa.types.TypeEngine[Any], value: object) -> object:
    """A value of a column of type ``column_type`` as ``jsonable`` stored it, back as the column's Python type:
    datetimes, dates and times from ISO-8601 text, a decimal or a non-finite float from its text, a ``UUID`` from its
    ``repr``, bytes from base64, a ``timedelta`` (an interval) from its ``repr``; an array's elements (a list, nested
    for more dimensions) each as its element type."""
    if isinstance(value, list) and isinstance(column_type, sa.ARRAY):
        return [_decoded(column_type.item_type, item) if not isinstance(item, list)
                else _decoded(column_type, item) for item in value]
    if not isinstance(value, str):
        return value
    try:
        python_type = column_type.python_type
    except NotImplementedError:
        return value
    if python_type in (datetime.datetime, datetime.date, datetime.time):
        return python_type.fromisoformat(value)
    if python_type in (decimal.Decimal, float):
        return python_type(value)
    if python_type is uuid.UUID:
        return uuid.UUID(value.removeprefix("UUID('").removesuffix("')"))
    if python_type is bytes:
        return base64.b64decode(value)
    if python_type is datetime.timedelta:          # (its repr: "datetime.timedelta(days=1, seconds=5)")
        return datetime.timedelta(**{unit: int(amount) for unit, amount in _TIMEDELTA_FIELD.findall(value)})
    return value


_TIMEDELTA_FIELD = re.compile(r"(days|seconds|microseconds)=(-?\d+)")


def decode_event(data: Mapping[str, Any]) -> Event:
    """A recorded event (JSON) back as an :class:`activedb.Event`; values are as JSON stored them.  A note recorded
    before notes kept the origin has none: activedb's own."""
    key = tuple(data["key"]) if isinstance(data.get("key"), list) else data.get("key")
    return Event(EventKind(data["kind"]), data.get("source"), key, data.get("old"), data.get("new"),
                 data.get("payload") or {}, data.get("ts"), data.get("transaction"),
                 Origin(data.get("origin", Origin.ACTIVEDB.value)))
