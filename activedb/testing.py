"""Test helpers: history checks, observable-state waits and a watchdog.

* :func:`check_history` verifies a recorded history (``connect(record_history=True)``):
  conflict serializability of the committed top-level transactions (their
  precedence graph is acyclic, checked with networkx) and the ACTA axioms of
  Concurrent Rule Execution §3.3.1 that apply to parallel nested transactions:

  1. a parent commits only after all its children ended;
  2. a committed child's operations are delegated to its parent — the write set a
     top-level transaction flushed is exactly the composition, in order, of the
     writes of its transactions whose every ancestor committed;
  3. an aborted transaction's operations are all undone (none reaches a flush);
  4. the abort of a parent aborts its active children (no descendant commits after
     its ancestor aborted).

* :func:`replay` gives the state a serial execution of the committed top-level
  transactions, in commit order, produces from an initial state.
* :func:`check_stream_history` checks Active CEP's Definition 6 on a stream history
  (``StreamEngine(record_history=True)``) and reports every read-too-late and
  write-too-late with the operations involved.
* :func:`wait_until` waits for observable state with a hard timeout;
  :class:`Watchdog` turns a hang into a test failure that prints the wait-for graph;
  :class:`Sequencer` orders blocks of several threads (re-exported from ``lockmgr.testing``).
"""

from __future__ import annotations

import bisect
import enum
from dataclasses import dataclass, field
from typing import Any, Iterable

import networkx as nx

from lockmgr.testing import Sequencer, Watchdog, wait_until  # the project's one copy of each

from activedb.txn import HistoryOp
from activedb.store import Entry


__all__ = ["HistoryReport", "Sequencer", "StreamAnomaly", "StreamHistoryReport", "StreamViolation", "Watchdog",
           "check_history", "check_stream_history", "replay", "wait_until"]


@dataclass
class HistoryReport:
    violations: list[str] = field(default_factory=list)
    committed_roots: list[str] = field(default_factory=list)
    precedence: nx.DiGraph = field(default_factory=nx.DiGraph)

    @property
    def ok(self) -> bool:
        return not self.violations

    def assert_ok(self) -> None:
        if self.violations:
            shown = "\n  ".join(self.violations[:20])
            raise AssertionError(f"{len(self.violations)} history violation(s):\n  {shown}")


def check_history(ops: Iterable[HistoryOp]) -> HistoryReport:
    ops = sorted(ops, key=lambda op: op.sequence)
    report = HistoryReport()
    parent_of: dict[str, str | None] = {}
    root_of: dict[str, str] = {}
    children: dict[str, list[str]] = {}
    ended: dict[str, tuple[str, int]] = {}
    for op in ops:
        if op.kind == "begin":
            parent_of[op.transaction] = op.parent
            root_of[op.transaction] = op.root
            if op.parent:
                children.setdefault(op.parent, []).append(op.transaction)
        elif op.kind in ("commit", "abort"):
            if op.transaction in ended:
                report.violations.append(f"{op.transaction} ended twice")
            ended[op.transaction] = (op.kind, op.sequence)

    def ancestors(tid: str):
        parent = parent_of.get(tid)
        while parent is not None:
            yield parent
            parent = parent_of.get(parent)

    # Axiom 1: children end before the parent commits.
    for tid, (kind, sequence) in ended.items():
        if kind != "commit":
            continue
        for child in children.get(tid, []):
            child_end = ended.get(child)
            if child_end is None or child_end[1] > sequence:
                report.violations.append(f"{tid} committed (#{sequence}) before its child {child} ended")

    # Axiom 4: no descendant commits after an ancestor aborted; active ones end aborted.
    for tid, (kind, sequence) in ended.items():
        if kind != "abort":
            continue
        for child in children.get(tid, []):
            child_end = ended.get(child)
            if child_end is None:
                report.violations.append(f"{child} never ended although its parent {tid} aborted")
            elif child_end[0] == "commit" and child_end[1] > sequence:
                report.violations.append(f"{child} committed after its parent {tid} aborted")

    # Axioms 2 and 3: the flushed write set is the composition of the effective writes.
    flushes = {op.transaction: op for op in ops if op.kind == "flush"}
    effective: dict[str, dict[tuple, Entry]] = {}
    for op in ops:
        if op.kind != "write":
            continue
        chain = [op.transaction, *ancestors(op.transaction)]
        if all(ended.get(tid, ("", 0))[0] == "commit" for tid in chain):
            rows = effective.setdefault(op.root, {})
            row = (op.table, op.key)
            rows[row] = rows[row].then(op.value, op.table) if row in rows else op.value
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

    # Conflict serializability of committed top-level transactions.
    committed_roots = [op.transaction for op in ops if op.kind == "flush"
                       and ended.get(op.transaction, ("", 0))[0] == "commit"]
    report.committed_roots = committed_roots
    graph = report.precedence
    graph.add_nodes_from(committed_roots)
    committed = set(committed_roots)
    versions: dict[tuple, list[str]] = {}
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
            graph.add_edge(writer, op.root, kind="wr", row=row)
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


def replay(ops: Iterable[HistoryOp], initial: dict[tuple, dict],
           key_columns: dict[str, list[str]] | None = None) -> dict[tuple, dict]:
    """Apply the committed flushes in commit order to ``initial`` ({(table, key): row}).

    ``key_columns`` ({table: [column, ...]}) adds the key columns to rows created by the replay."""
    ended = {op.transaction: op.kind for op in ops if op.kind in ("commit", "abort")}
    state = {row: dict(image) for row, image in initial.items()}
    for op in sorted(ops, key=lambda op: op.sequence):
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


class StreamAnomaly(enum.Enum):
    """Active CEP §2's anomalies.

    * ``READ_TOO_LATE`` (Example 2; Def. 6 (3)): a Read saw a Write that comes *after* it in
      the declared order (a larger timestamp, or an equal one declared later) — the Read
      ran too late;
    * ``WRITE_TOO_LATE`` (Example 3; Def. 6 (1)): a Read did not see a Write that comes
      before it in the declared order — the Write ran too late; or (Def. 6 (2)) two Writes
      of one row ran against their declared order;
    * ``DIRTY_READ``: a Read saw a Write of aborted work (outside Def. 6, never correct).
    """

    READ_TOO_LATE = "read-too-late"
    WRITE_TOO_LATE = "write-too-late"
    DIRTY_READ = "dirty read"


@dataclass(frozen=True)
class StreamViolation:
    """One violation of Definition 6 with the operations involved.

    ``read``: the Read (None for two Writes out of order); ``write``: the Write the
    violation is about (seen too early, or missed); ``seen``: the Write whose value the
    Read actually saw (None: the value from before the history), or, for two Writes, the
    Write that ran first although declared later."""

    kind: StreamAnomaly
    clause: str
    read: Any
    write: Any
    seen: Any
    message: str


@dataclass
class StreamHistoryReport:
    violations: list[StreamViolation] = field(default_factory=list)
    reads: int = 0
    writes: int = 0

    @property
    def ok(self) -> bool:
        return not self.violations

    def of_kind(self, kind: StreamAnomaly) -> list[StreamViolation]:
        return [violation for violation in self.violations if violation.kind is kind]

    def assert_ok(self) -> None:
        if self.violations:
            shown = "\n  ".join(violation.message for violation in self.violations[:20])
            raise AssertionError(f"{len(self.violations)} Definition 6 violation(s):\n  {shown}")


def check_stream_history(ops: Iterable[Any]) -> StreamHistoryReport:
    """Check Active CEP Definition 6 on a recorded stream history.

    Only operations of committed units count.  The declared order of operations is their
    ``order`` — timestamp order, with equal timestamps ordered as the application
    declared (Def. 6 (4)).  The check is on the *values* read (a Read must see exactly the
    latest Write before it in the declared order: case (1) and, semantically, case (3) —
    a multi-version store may let a Read run after a later Write if it reads the older
    version) and on the system-time order of the Writes of each row (case (2)).
    """
    ops = sorted(ops, key=lambda op: op.sequence)
    ended = {op.unit: op.operation for op in ops if op.kind == "end"}
    committed = [op for op in ops if op.kind in ("read", "write") and ended.get(op.unit) == "committed"]
    aborted_writes = {op.sequence: op for op in ops if op.kind == "write" and ended.get(op.unit) != "committed"}
    report = StreamHistoryReport()
    writes_by_row: dict[tuple, list] = {}
    by_sequence = {}
    for op in committed:
        if op.kind == "write":
            writes_by_row.setdefault((op.table, op.key), []).append(op)
            by_sequence[op.sequence] = op
            report.writes += 1
        else:
            report.reads += 1
    orders: dict[tuple, list] = {}
    for row, writes in writes_by_row.items():
        writes.sort(key=lambda op: op.order)
        orders[row] = [op.order for op in writes]

    def check_read(read, row, seen_sequence) -> None:
        writes = writes_by_row.get(row, [])
        index = bisect.bisect_left(orders.get(row, []), read.order)
        expected = writes[index - 1] if index else None
        if seen_sequence is not None and seen_sequence not in by_sequence:
            dirty = aborted_writes.get(seen_sequence)
            report.violations.append(StreamViolation(
                StreamAnomaly.DIRTY_READ, "-", read, dirty, dirty,
                f"dirty read: {read.describe()} saw #{seen_sequence}, a write of aborted work"))
            return
        seen = by_sequence.get(seen_sequence) if seen_sequence is not None else None
        if seen is not None and seen.order > read.order:
            report.violations.append(StreamViolation(
                StreamAnomaly.READ_TOO_LATE, "(3)", read, seen, seen,
                f"read-too-late: {read.describe()} saw {seen.describe()}, whose timestamp comes after the read's "
                f"(Def. 6 (3): the read must precede that write; it ran after it)"))
        elif expected is not None and (seen is None or seen.order < expected.order):
            what = seen.describe() if seen is not None else "the value from before the history"
            report.violations.append(StreamViolation(
                StreamAnomaly.WRITE_TOO_LATE, "(1)", read, expected, seen,
                f"write-too-late: {read.describe()} should have seen {expected.describe()} but saw {what} "
                f"(Def. 6 (1): the write must precede the read; it ran after it)"))

    for op in committed:
        if op.kind != "read":
            continue
        if op.key is not None:
            check_read(op, (op.table, op.key), op.read_from)
        else:
            seen_by_key = op.read_from or {}
            for row in writes_by_row:
                if row[0] == op.table:
                    check_read(op, row, seen_by_key.get(row[1]))
    for row, writes in writes_by_row.items():
        latest = None
        for write in writes:
            if latest is not None and write.sequence < latest.sequence:
                report.violations.append(StreamViolation(
                    StreamAnomaly.WRITE_TOO_LATE, "(2)", None, latest, write,
                    f"write-too-late: {latest.describe()} ran after {write.describe()}, whose timestamp is later "
                    f"(Def. 6 (2): writes run in timestamp order)"))
            if latest is None or write.sequence > latest.sequence:
                latest = write
    return report
