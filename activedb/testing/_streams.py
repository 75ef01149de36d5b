"""Active CEP's Definition 6 on a recorded stream history (``check_stream_history``)."""

from __future__ import annotations

import bisect
import decimal
import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Hashable, Iterable, Mapping, TypeAlias

from activedb.testing._history import _operations

if TYPE_CHECKING:  # pragma: no cover
    from activedb.streams import StreamOp

#: A row as the history names it: ``(table, key)``.
_Row: TypeAlias = "tuple[str | None, Hashable]"


class StreamAnomaly(enum.Enum):
    """Active CEP §2's anomalies.

    * ``READ_TOO_LATE`` (Example 2; Def. 6 (3)): a Read saw a Write that comes *after* it in
      the declared order (a larger timestamp, or an equal one declared later) — the Read
      ran too late;
    * ``WRITE_TOO_LATE`` (Example 3; Def. 6 (1)): a Read did not see a Write that comes
      before it in the declared order — the Write ran too late; or (Def. 6 (2)) two Writes
      of one row ran against their declared order;
    * ``DIRTY_READ``: a Read saw a Write of aborted work (outside Def. 6, never correct);
    * ``WRONG_VALUE``: the value a Read returned is not the one the Write it saw left (a
      column that Write set differs, or the Write deleted the row and the Read found one) —
      the recorded ``read_from`` cannot be trusted for it.
    """

    READ_TOO_LATE = "read-too-late"
    WRITE_TOO_LATE = "write-too-late"
    DIRTY_READ = "dirty read"
    WRONG_VALUE = "wrong value"


@dataclass(frozen=True)
class StreamViolation:
    """One violation of Definition 6 with the operations involved.

    ``read``: the Read (None for two Writes out of order); ``write``: the Write the
    violation is about (seen too early, or missed); ``seen``: the Write whose value the
    Read actually saw (None: the value from before the history), or, for two Writes, the
    Write that ran first although declared later."""

    kind: StreamAnomaly
    clause: str
    read: StreamOp | None
    write: StreamOp | None
    seen: StreamOp | None
    message: str


@dataclass
class StreamHistoryReport:
    violations: list[StreamViolation] = field(default_factory=list)
    reads: int = 0
    writes: int = 0

    @property
    def ok(self) -> bool:
        return not self.violations

    def assert_ok(self) -> None:
        if self.violations:
            shown = "\n  ".join(violation.message for violation in self.violations[:20])
            raise AssertionError(f"{len(self.violations)} Definition 6 violation(s):\n  {shown}")


def check_stream_history(ops: Iterable[StreamOp]) -> StreamHistoryReport:
    """Check Active CEP Definition 6 on a recorded stream history, by timestamps (only operations of
    committed units count; what is checked: the design note, ``README.md``, "check_stream_history")."""
    from activedb.streams import StreamOp

    ops = sorted(_operations("check_stream_history", ops, StreamOp,
                             "engine.history.snapshot() of a StreamEngine(record_history=True)"),
                 key=lambda op: op.sequence)
    ended = {op.unit: op.operation for op in ops if op.kind == "end"}
    committed = [op for op in ops if op.kind in ("read", "write") and ended.get(op.unit) == "committed"]
    aborted_writes = {op.sequence: op for op in ops if op.kind == "write" and ended.get(op.unit) != "committed"}
    report = StreamHistoryReport()
    writes_by_row: dict[_Row, list[StreamOp]] = {}
    by_sequence: dict[int, StreamOp] = {}
    for op in committed:
        if op.kind == "write":
            writes_by_row.setdefault((op.table, op.key), []).append(op)
            by_sequence[op.sequence] = op
            report.writes += 1
        else:
            report.reads += 1
    declared: dict[_Row, list[tuple[object, ...]]] = {}
    for row, writes in writes_by_row.items():
        writes.sort(key=_declared)
        declared[row] = [_declared(op) for op in writes]

    def check_read(read: StreamOp, row: _Row, seen_sequence: int | None) -> None:
        writes = writes_by_row.get(row, [])
        index = bisect.bisect_left(declared.get(row, []), _declared(read))
        expected = writes[index - 1] if index else None
        if seen_sequence is not None and seen_sequence not in by_sequence:
            dirty = aborted_writes.get(seen_sequence)
            report.violations.append(StreamViolation(
                StreamAnomaly.DIRTY_READ, "-", read, dirty, dirty,
                f"dirty read: {read.describe()} saw #{seen_sequence}, a write of aborted work"))
            return
        seen = by_sequence.get(seen_sequence) if seen_sequence is not None else None
        if seen is not None and read.key is not None and not _agrees(read.value, seen):
            report.violations.append(StreamViolation(
                StreamAnomaly.WRONG_VALUE, "-", read, seen, seen,
                f"wrong value: {read.describe()} returned {read.value!r}, but {seen.describe()}, the write it saw, "
                f"left {seen.value!r}"))
        if seen is not None and _declared(seen) > _declared(read):
            report.violations.append(StreamViolation(
                StreamAnomaly.READ_TOO_LATE, "(3)", read, seen, seen,
                f"read-too-late: {read.describe()} saw {seen.describe()}, whose timestamp comes after the read's "
                f"(Def. 6 (3): the read must precede that write; it ran after it)"))
        elif expected is not None and (seen is None or _declared(seen) < _declared(expected)):
            what = seen.describe() if seen is not None else "the value from before the history"
            report.violations.append(StreamViolation(
                StreamAnomaly.WRITE_TOO_LATE, "(1)", read, expected, seen,
                f"write-too-late: {read.describe()} should have seen {expected.describe()} but saw {what} "
                f"(Def. 6 (1): the write must precede the read; it ran after it)"))

    for op in committed:
        if op.kind != "read":
            continue
        read_from = op.read_from
        if op.key is not None:
            check_read(op, (op.table, op.key), read_from if isinstance(read_from, int) else None)
        else:
            seen_by_key = read_from if isinstance(read_from, dict) else {}
            # every row committed work wrote, and every row the scan saw (one only aborted work wrote: a dirty read)
            rows = dict.fromkeys([row for row in writes_by_row if row[0] == op.table]
                                 + [(op.table, key) for key in seen_by_key])
            for row in rows:
                key = row[1]               # (a written row's key: a tuple)
                check_read(op, row, seen_by_key.get(key) if isinstance(key, tuple) else None)
    for row, writes in writes_by_row.items():
        latest: StreamOp | None = None
        for write in writes:
            if latest is not None and write.sequence < latest.sequence:
                report.violations.append(StreamViolation(
                    StreamAnomaly.WRITE_TOO_LATE, "(2)", None, latest, write,
                    f"write-too-late: {latest.describe()} ran after {write.describe()}, whose timestamp is later "
                    f"(Def. 6 (2): writes run in timestamp order)"))
            if latest is None or write.sequence > latest.sequence:
                latest = write
    return report

def _agrees(value: object, write: StreamOp) -> bool:
    """Does the image a Read returned agree with ``write``, the last Write of its row?"""
    if write.operation == "delete":
        return value is None
    if not isinstance(write.value, Mapping) or not isinstance(value, Mapping):
        return True                     # nothing comparable was recorded
    return all(value[column] == written for column, written in write.value.items()
               if column in value and _comparable(value[column], written))


def _comparable(read: object, written: object) -> bool:
    """Values the store returns as written: same type, or both numbers (a column's type may
    turn a written string into a date, which is no wrong value)."""
    numbers = (int, float, decimal.Decimal)
    return type(read) is type(written) or (isinstance(read, numbers) and isinstance(written, numbers))


def _declared(op: StreamOp) -> tuple[object, ...]:
    """An operation's place in Definition 6's order: its timestamp; equal timestamps in the
    order the application declared (the recorded ``order``)."""
    return (op.ts, op.order)

