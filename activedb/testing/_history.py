"""Conflict serializability and the ACTA axioms of a recorded history (``check_history``), and ``replay``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Iterator, Mapping, TypeAlias, TypeVar

import networkx as nx

from activedb.errors import BadArgument
from activedb.store import Entry, RowImage
from activedb.txn import HistoryOp

#: A row as the history names it: ``(table, key)``.
_Row: TypeAlias = "tuple[str | None, tuple[object, ...] | None]"
_Op = TypeVar("_Op")
_FROM_DATABASE = "db.history.snapshot() of a database connected with record_history=True"


@dataclass
class HistoryReport:
    violations: list[str] = field(default_factory=list)
    committed_roots: list[str] = field(default_factory=list)
    precedence: nx.DiGraph[str] = field(default_factory=nx.DiGraph)

    @property
    def ok(self) -> bool:
        return not self.violations

    def assert_ok(self) -> None:
        if self.violations:
            shown = "\n  ".join(self.violations[:20])
            raise AssertionError(f"{len(self.violations)} history violation(s):\n  {shown}")


def check_history(ops: Iterable[HistoryOp]) -> HistoryReport:
    """Conflict serializability of the committed top-level transactions (their precedence graph is acyclic)
    and the ACTA axioms of Concurrent Rule Execution §3.3.1 that apply to parallel nested transactions:
    (1) a parent commits only after all its children ended; (2) a committed child's operations are
    delegated to its parent — the write set a top-level transaction flushed is exactly the composition, in
    order, of the writes of its transactions whose every ancestor committed; (3) an aborted transaction's
    operations are all undone (none reaches a flush); (4) the abort of a parent aborts its active children."""
    ops = sorted(_operations("check_history", ops, HistoryOp, _FROM_DATABASE), key=lambda op: op.sequence)
    report = HistoryReport()
    parent_of: dict[str, str | None] = {}
    children: dict[str, list[str]] = {}
    ended: dict[str, tuple[str, int]] = {}
    for op in ops:
        if op.kind == "begin":
            parent_of[op.transaction] = op.parent
            if op.parent:
                children.setdefault(op.parent, []).append(op.transaction)
        elif op.kind in ("commit", "abort"):
            if op.transaction in ended:
                report.violations.append(f"{op.transaction} ended twice")
            ended[op.transaction] = (op.kind, op.sequence)

    def ancestors(tid: str) -> Iterator[str]:
        parent = parent_of.get(tid)
        while parent is not None:
            yield parent
            parent = parent_of.get(parent)

    # Axiom 1: children end before the parent commits.  Axiom 4: no descendant commits after an ancestor
    # aborted; active ones end aborted.
    for tid, (kind, sequence) in ended.items():
        for child in children.get(tid, []):
            child_end = ended.get(child)
            if kind == "commit" and (child_end is None or child_end[1] > sequence):
                report.violations.append(f"{tid} committed (#{sequence}) before its child {child} ended")
            elif kind == "abort" and child_end is None:
                report.violations.append(f"{child} never ended although its parent {tid} aborted")
            elif kind == "abort" and child_end[0] == "commit" and child_end[1] > sequence:  # type: ignore[index]
                report.violations.append(f"{child} committed after its parent {tid} aborted")

    # Axioms 2 and 3: the flushed write set is the composition of the effective writes.
    flushes = {op.transaction: op for op in ops if op.kind == "flush"}
    effective: dict[str | None, dict[_Row, Entry]] = {}
    for op in ops:
        if op.kind != "write":
            continue
        chain = [op.transaction, *ancestors(op.transaction)]
        if all(ended.get(tid, ("", 0))[0] == "commit" for tid in chain):
            rows = effective.setdefault(op.root, {})
            row = (op.table, op.key)
            rows[row] = rows[row].then(op.value, op.table) if row in rows else op.value  # type: ignore[arg-type]
    for root, flush in flushes.items():
        expected = effective.get(root, {})
        if flush.value != expected:
            missing = set(expected) - set(flush.value)
            extra = set(flush.value) - set(expected)
            differing = [row for row in set(expected) & set(flush.value) if expected[row] != flush.value[row]]
            report.violations.append(
                f"flush of {root} differs from its delegated writes: missing {sorted(missing)[:3]}, "
                f"from aborted transactions {sorted(extra)[:3]}, different {sorted(differing)[:3]}"
            )
    for tid, (kind, _) in ended.items():
        if kind == "abort" and parent_of.get(tid) is None and tid in flushes:
            report.violations.append(f"aborted top-level transaction {tid} flushed writes")
        elif kind == "commit" and parent_of.get(tid) is None and tid not in flushes and effective.get(tid):
            # (every committed top-level transaction flushes, its write set empty or not)
            report.violations.append(f"{tid} committed its delegated writes but flushed none of them: "
                                     f"missing {sorted(effective[tid])[:3]}")

    # Conflict serializability of committed top-level transactions.
    committed_roots = [op.transaction for op in ops if op.kind == "flush"
                       and ended.get(op.transaction, ("", 0))[0] == "commit"]
    report.committed_roots = committed_roots
    graph = report.precedence
    graph.add_nodes_from(committed_roots)
    committed = set(committed_roots)
    versions: dict[_Row, list[str]] = {}
    for op in ops:
        if op.kind == "flush" and op.transaction in committed:
            for row in op.value:
                writers = versions.setdefault(row, [])
                if writers:
                    graph.add_edge(writers[-1], op.transaction, kind="ww", row=row)
                writers.append(op.transaction)
    for op in ops:
        if op.kind != "read" or op.source != "committed" or op.root not in committed:
            continue
        # Reads of aborted subtransactions are undone with them (committed projection).
        if not all(ended.get(tid, ("", 0))[0] == "commit" for tid in [op.transaction, *ancestors(op.transaction)]):
            continue
        row = (op.table, op.key)
        writers = versions.get(row, [])
        writer = op.read_from
        if writer != "initial" and writer != op.root:
            graph.add_edge(writer, op.root, kind="wr", row=row)  # type: ignore[arg-type]  # (a committed read)
        position = writers.index(writer) + 1 if writer in writers else 0
        for later in writers[position:]:
            if later != op.root:
                graph.add_edge(op.root, later, kind="rw", row=row)
                break
    try:
        cycle = nx.find_cycle(graph)
    except nx.NetworkXNoCycle:
        cycle = None
    if cycle:
        report.violations.append(f"not conflict serializable: precedence cycle {cycle}")
    return report


def replay(ops: Iterable[HistoryOp], initial: dict[_Row, RowImage],
           key_columns: dict[str, list[str]] | None = None) -> dict[_Row, RowImage]:
    """Apply the committed flushes in commit order to ``initial`` ({(table, key): row}).

    ``key_columns`` ({table: [column, ...]}) adds the key columns to rows created by the replay."""
    ops = sorted(_operations("replay", ops, HistoryOp, _FROM_DATABASE), key=lambda op: op.sequence)   # (read twice: not an iterator's one pass)
    ended = {op.transaction: op.kind for op in ops if op.kind in ("commit", "abort")}
    state = {row: dict(image) for row, image in initial.items()}
    for op in ops:
        if op.kind != "flush" or ended.get(op.transaction) != "commit":
            continue
        for row, entry in op.value.items():
            image = entry.apply(state.get(row))
            if image is None:
                state.pop(row, None)
            else:
                columns = (key_columns or {}).get(row[0], [])
                state[row] = {**dict(zip(columns, row[1])), **image}
    return state


def _operations(function: str, ops: object, kind: type[_Op], source: str) -> list[_Op]:
    """``ops`` as a list; BadArgument (saying what to give: ``source``, what records them) for what is no
    collection of recorded operations (``kind``)."""
    what = f"{function} takes the recorded operations: {source}"
    if isinstance(ops, (str, bytes, Mapping)) or not isinstance(ops, Iterable):
        raise BadArgument(f"{what}, got {type(ops).__name__} {ops!r:.80}")
    listed = list(ops)
    for op in listed:
        if not isinstance(op, kind):
            raise BadArgument(f"{what}, got {type(op).__name__} {op!r:.80} among them")
    return listed
