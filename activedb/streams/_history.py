"""The stream history: every Read and Write of the shared store, stamped (Active CEP §4.1).

An engine made with ``record_history=True`` records, in system-time order (``sequence``),
each store operation its queries and rules perform:

* ``ts`` — the application time of the operation: the s-transaction's ``T.ts = e.ts``
  (a query's Read at the accepting event's time, a rule's Write at its trigger's time);
* ``order`` — its place in the **declared** order: ``(position, step)`` where
  ``position`` is the s-transaction's event's place in the stream's total order and
  ``step = (phase, query rank, n)`` its place inside the s-transaction (phase 0: the
  queries' reads, in query order; phase 1: the rules, per output in order, per rule in
  priority order).  Def. 6 case (4) — equal timestamps — is decided by this order;
* ``read_from`` — for a Read, the ``sequence`` of the Write whose value it saw (None:
  the value from before the engine's first write); for a table read, a dict per key.
  On a single-version store the recorder derives it (the last committed-or-own Write
  in system order); a multi-version store passes the version it read.

``begin``/``end`` records bracket each unit of execution (an s-transaction under SEI;
one query's evaluation of one event in the unscheduled mode) with its outcome, so that
the checker ignores aborted work.  :func:`activedb.testing.check_stream_history` checks
Definition 6 on a snapshot.

Thread-safety: ``_mutex`` protects everything; recording happens while the operation's
store lock is held, so no conflicting write of this engine can slip between the
operation and its record.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class StreamOp:
    sequence: int
    kind: str                      # read | write | begin | end
    unit: str                      # the unit of execution (s-transaction or query evaluation)
    stransaction: str              # the s-transaction (one per input event)
    event: str                     # the event, as Active CEP writes it (exit^2)
    ts: Any
    order: tuple                   # (position, step)
    origin: str | None = None      # the query or rule that performed it
    table: str | None = None
    key: tuple | None = None       # None: a table read (scan)
    value: Any = None              # read: the image(s) seen; write: the values written
    read_from: Any = None          # read: sequence of the write seen (None = initial); scan: {key: sequence}
    operation: str | None = None   # write: write | insert | delete; end: committed | aborted
    detail: Any = None

    def describe(self) -> str:
        if self.kind == "read":
            target = f"{self.table}[{_key(self.key)}]" if self.key is not None else f"{self.table} (table)"
            return f"#{self.sequence} Read by {self.origin} of {target} at ts {self.ts} ({self.event})"
        if self.kind == "write":
            return (f"#{self.sequence} Write ({self.operation}) by {self.origin} of {self.table}[{_key(self.key)}] "
                    f"at ts {self.ts} ({self.event})")
        return f"#{self.sequence} {self.kind} {self.unit} ({self.event})"


def _key(key: tuple | None) -> str:
    if key is None:
        return "*"
    return repr(key[0]) if len(key) == 1 else repr(key)


@dataclass
class StreamHistory:
    ops: list[StreamOp] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._mutex = threading.Lock()
        self._sequence = 0
        # Invariant: _last_write[row] is the sequence of the latest write of a unit that has not aborted.
        self._last_write: dict[tuple[str, tuple], int] = {}
        self._undo: dict[str, list[tuple[tuple[str, tuple], int | None]]] = {}

    def _next(self) -> int:
        self._sequence += 1
        return self._sequence

    def begin(self, unit: str, stransaction: str, event: str, ts: Any, order: tuple) -> None:
        with self._mutex:
            self.ops.append(StreamOp(self._next(), "begin", unit, stransaction, event, ts, order))
            self._undo[unit] = []

    def end(self, unit: str, stransaction: str, event: str, ts: Any, order: tuple, committed: bool) -> None:
        with self._mutex:
            self.ops.append(StreamOp(self._next(), "end", unit, stransaction, event, ts, order,
                                     operation="committed" if committed else "aborted"))
            undo = self._undo.pop(unit, [])
            if not committed:
                for row, previous in reversed(undo):
                    if previous is None:
                        self._last_write.pop(row, None)
                    else:
                        self._last_write[row] = previous

    def read(self, unit: str, stransaction: str, event: str, ts: Any, order: tuple, origin: str, table: str,
             key: tuple, value: Any, read_from: Any = "derive") -> None:
        with self._mutex:
            if read_from == "derive":
                read_from = self._last_write.get((table, key))
            self.ops.append(StreamOp(self._next(), "read", unit, stransaction, event, ts, order, origin, table, key,
                                     value, read_from))

    def scan(self, unit: str, stransaction: str, event: str, ts: Any, order: tuple, origin: str, table: str,
             value: Any, read_from: Any = "derive") -> None:
        with self._mutex:
            if read_from == "derive":
                read_from = {row[1]: sequence for row, sequence in self._last_write.items() if row[0] == table}
            self.ops.append(StreamOp(self._next(), "read", unit, stransaction, event, ts, order, origin, table, None,
                                     value, read_from))

    def write(self, unit: str, stransaction: str, event: str, ts: Any, order: tuple, origin: str, table: str,
              key: tuple, value: Any, operation: str) -> int:
        """Record a Write; returns its sequence (a multi-version store keeps it with the version)."""
        with self._mutex:
            sequence = self._next()
            self.ops.append(StreamOp(sequence, "write", unit, stransaction, event, ts, order, origin, table, key,
                                     value, operation=operation))
            row = (table, key)
            self._undo.setdefault(unit, []).append((row, self._last_write.get(row)))
            self._last_write[row] = sequence
            return sequence

    def last_writes(self, table: str) -> dict[tuple, int]:
        """The sequence of the latest not-aborted Write of each row of ``table`` (what a Read of
        the row before the next Write sees): a multi-version store takes it for its base images."""
        with self._mutex:
            return {row[1]: sequence for row, sequence in self._last_write.items() if row[0] == table}

    def abort_units(self, units: list[str]) -> None:
        """Units that ended committed but whose top-level transaction then aborted: record
        them aborted (a later ``end`` overrides an earlier one) and forget their writes."""
        with self._mutex:
            gone = set(units)
            for unit in units:
                self.ops.append(StreamOp(self._next(), "end", unit, "", "", None, (), operation="aborted"))
            ended = {op.unit: op.operation for op in self.ops if op.kind == "end"}
            self._last_write = {}
            for op in self.ops:
                if op.kind == "write" and op.unit not in gone and ended.get(op.unit) != "aborted":
                    self._last_write[(op.table, op.key)] = op.sequence

    def snapshot(self) -> list[StreamOp]:
        with self._mutex:
            return list(self.ops)

    def clear(self) -> None:
        with self._mutex:
            self.ops.clear()
