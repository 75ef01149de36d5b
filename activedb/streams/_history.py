"""The stream history (``record_history=True``): every Read and Write of the shared store
by the engine's queries and rules, stamped (Active CEP §4.1), in system-time order
(``sequence``), with ``begin``/``end`` records bracketing each unit of execution (an
s-transaction; one query's evaluation of one event in the unscheduled mode) so that
:func:`activedb.testing.check_stream_history` (Definition 6) ignores aborted work.

Thread-safety: ``_mutex`` protects everything; recording happens while the operation's
store lock is held, so no conflicting write of this engine can slip between the
operation and its record.
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Hashable, Literal, TypeAlias

if TYPE_CHECKING:  # pragma: no cover
    from activedb.events import Instant

#: A row's key (its primary-key values).
Key = tuple[Hashable, ...]
#: What a Read saw: the sequence of the Write it read (None: the initial value), or per key for a table read.
ReadFrom: TypeAlias = "int | dict[Key, int] | None"


@dataclass(frozen=True, slots=True)
class StreamOp:
    sequence: int
    kind: str                      # read | write | begin | end
    unit: str                      # the unit of execution (s-transaction or query evaluation)
    stransaction: str              # the s-transaction (one per input event)
    event: str                     # the event, as Active CEP writes it (exit^2)
    ts: Instant | None             # the s-transaction's T.ts = e.ts (Def. 6 compares these); None: a batch's abort
    # (position, step): the place in the declared order (decides Def. 6 case 4); step = (phase, query rank, n),
    # phase 0 the queries' reads in query order, phase 1 the rules per output, per rule by priority.
    order: tuple[object, ...]
    origin: str | None = None      # the query or rule that performed it
    table: str | None = None
    key: Key | None = None       # None: a table read (scan)
    value: object = None           # read: the image(s) seen; write: the values written
    # read: sequence of the write seen (None = initial); scan: {key: sequence}.  Derived by the
    # recorder on a single-version store (the last not-aborted Write); a multi-version store passes it.
    read_from: ReadFrom = None
    operation: str | None = None   # write: write | insert | delete; end: committed | aborted

    def describe(self) -> str:
        if self.kind == "read":
            target = f"{self.table}[{show_key(self.key)}]" if self.key is not None else f"{self.table} (table)"
            return f"#{self.sequence} Read by {self.origin} of {target} at ts {self.ts} ({self.event})"
        if self.kind == "write":
            shown = show_key(self.key)  # type: ignore[arg-type]  # (a write has a key)
            return (f"#{self.sequence} Write ({self.operation}) by {self.origin} of {self.table}[{shown}] "
                    f"at ts {self.ts} ({self.event})")
        return f"#{self.sequence} {self.kind} {self.unit} ({self.event})"


def show_key(key: Key) -> str:
    return repr(key[0]) if len(key) == 1 else repr(key)


class StreamHistory:
    """The recorded operations: tuples in :class:`StreamOp`'s field order (cheap to append while an
    operation's lock is held); :meth:`snapshot` makes them ``StreamOp`` values for the checker."""

    def __init__(self) -> None:
        self.ops: list[tuple[Any, ...]] = []  # StreamOp's fields, made into StreamOps when read
        self._mutex = threading.Lock()
        self._sequence = itertools.count(1)
        # Invariant: _last_write[row] is the sequence of the latest write of a unit that has not aborted.
        self._last_write: dict[tuple[str, Key], int] = {}
        self._undo: dict[str, list[tuple[tuple[str, Key], int | None]]] = {}

    def begin(self, unit: str, stransaction: str, event: str, ts: Instant, order: tuple[object, ...]) -> None:
        with self._mutex:
            self.ops.append((next(self._sequence), "begin", unit, stransaction, event, ts, order))
            self._undo[unit] = []

    def end(self, unit: str, stransaction: str, event: str, ts: Instant, order: tuple[object, ...],
            committed: bool) -> None:
        with self._mutex:
            self.ops.append((next(self._sequence), "end", unit, stransaction, event, ts, order, None, None, None,
                             None, None, "committed" if committed else "aborted"))
            undo = self._undo.pop(unit, None)
            if not committed and undo:
                for row, previous in reversed(undo):
                    if previous is None:
                        self._last_write.pop(row, None)
                    else:
                        self._last_write[row] = previous

    def read(self, unit: str, stransaction: str, event: str, ts: Instant, order: tuple[object, ...], origin: str,
             table: str, key: Key | None, value: object, read_from: ReadFrom | Literal["derive"] = "derive") -> None:
        """Record a Read of one row, or of the whole table (a scan: ``key`` None, ``value`` its rows)."""
        with self._mutex:
            if read_from == "derive":
                read_from = self._last_write.get((table, key)) if key is not None else self._last_writes(table)
            self.ops.append((next(self._sequence), "read", unit, stransaction, event, ts, order, origin, table, key,
                             value, read_from))

    def write(self, unit: str, stransaction: str, event: str, ts: Instant, order: tuple[object, ...], origin: str,
              table: str, key: Key, value: object, operation: str) -> int:
        """Record a Write; returns its sequence (a multi-version store keeps it with the version)."""
        with self._mutex:
            sequence = next(self._sequence)
            self.ops.append((sequence, "write", unit, stransaction, event, ts, order, origin, table, key, value, None,
                             operation))
            row = (table, key)
            self._undo.setdefault(unit, []).append((row, self._last_write.get(row)))
            self._last_write[row] = sequence
            return sequence

    def last_writes(self, table: str) -> dict[Key, int]:
        """The sequence of the latest not-aborted Write of each row of ``table`` (what a Read of
        the row before the next Write sees): a multi-version store takes it for its base images."""
        with self._mutex:
            return self._last_writes(table)

    def _last_writes(self, table: str) -> dict[Key, int]:
        """Precondition: the caller holds ``_mutex``."""
        return {row[1]: sequence for row, sequence in self._last_write.items() if row[0] == table}

    def abort_units(self, units: list[str]) -> None:
        """Units that ended committed but whose top-level transaction then aborted: record
        them aborted (a later ``end`` overrides an earlier one) and forget their writes."""
        with self._mutex:
            gone = set(units)
            for unit in units:
                self.ops.append((next(self._sequence), "end", unit, "", "", None, (), None, None, None, None, None,
                                 "aborted"))
            ended = {op[2]: op[12] for op in self.ops if op[1] == "end"}
            self._last_write = {}
            for op in self.ops:
                if op[1] == "write" and op[2] not in gone and ended.get(op[2]) != "aborted":
                    self._last_write[(op[8], op[9])] = op[0]

    def snapshot(self) -> list[StreamOp]:
        with self._mutex:
            ops = list(self.ops)
        return [StreamOp(*op) for op in ops]
