"""The s-transaction's stamped view of the store.

Queries, rules and Python actions touch the shared store only through a
:class:`StoreView`: it forwards to the public ``Transaction`` API of the (sub)transaction
the scheduler runs the work in (``tx.read``, ``tx.scan``, ``tx.write``, ``tx.insert``,
``tx.delete``) and records each operation, stamped with the s-transaction's timestamp
and declared order, in the engine's stream history (when it keeps one).

A scheduler over a multi-version store supplies another view with the same methods
(reads at a timestamp); nothing else in the engine needs to change.

Thread-safety: a view belongs to the thread running its unit of work.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

from activedb.streams.errors import UndeclaredAccess


@dataclass(frozen=True)
class Stamp:
    """Who performs the operations: the unit, its s-transaction, the event, ``T.ts``, position."""

    unit: str
    stransaction: str
    event: str
    ts: Any
    position: int


def _as_key(key: Any) -> tuple:
    return key if isinstance(key, tuple) else (key,)


class StoreView:
    """Stamped store access for one unit of work (see the module docstring)."""

    def __init__(self, tx: Any, stamp: Stamp, history: Any = None, cost: Callable[[str], None] | None = None):
        self.tx = tx
        self.stamp = stamp
        self._history = history
        self._cost = cost
        self._phase = 0
        self._rank = 0
        self._counter = 0
        self.origin: str | None = None
        self.reads = 0
        self.writes = 0

    @property
    def ts(self) -> Any:
        """The application time of the s-transaction (every operation's timestamp)."""
        return self.stamp.ts

    def at(self, phase: int, rank: int, origin: str) -> None:
        """Operations from now on are ``origin``'s, at step ``(phase, rank, …)``."""
        if (phase, rank) != (self._phase, self._rank):
            self._phase, self._rank, self._counter = phase, rank, 0
        self.origin = origin

    def _order(self) -> tuple:
        self._counter += 1
        return (self.stamp.position, (self._phase, self._rank, self._counter))

    def _record(self, method: str, *args: Any, **kwargs: Any) -> Any:
        stamp = self.stamp
        return getattr(self._history, method)(stamp.unit, stamp.stransaction, stamp.event, stamp.ts, self._order(),
                                              self.origin, *args, **kwargs)

    def _before(self, kind: str, table: str, key: tuple | None) -> None:
        """Runs before every operation (``kind`` read/write; ``key`` None: the table or a
        generated key).  A locking scheduler's view waits for its lock here."""
        if self._cost is not None:
            self._cost(kind)

    # --- the store API --------------------------------------------------------------------------

    def read(self, table: str, key: Any) -> dict | None:
        self._before("read", table, _as_key(key))
        row = self.tx.read(table, key)
        self.reads += 1
        if self._history is not None:
            self._record("read", table, _as_key(key), row)
        return row

    def scan(self, table: str, where: Mapping[str, Any] | None = None) -> list[dict]:
        self._before("read", table, None)
        rows = self.tx.scan(table, where)
        self.reads += 1
        if self._history is not None:
            self._record("scan", table, rows)
        return rows

    def write(self, table: str, key: Any, **values: Any) -> None:
        self._before("write", table, _as_key(key))
        self.tx.write(table, key, **values)
        self.writes += 1
        if self._history is not None:
            self._record("write", table, _as_key(key), dict(values), "write")

    def insert(self, table: str, **values: Any) -> Any:
        self._before("write", table, self._key_of_values(table, values))
        key = self.tx.insert(table, **values)
        self.writes += 1
        if self._history is not None:
            self._record("write", table, _as_key(key), dict(values), "insert")
        return key

    def delete(self, table: str, key: Any) -> None:
        self._before("write", table, _as_key(key))
        self.tx.delete(table, key)
        self.writes += 1
        if self._history is not None:
            self._record("write", table, _as_key(key), None, "delete")

    def _key_of_values(self, table: str, values: Mapping[str, Any]) -> tuple | None:
        """The key an insert names (None if the database generates it); only locking views need it."""
        return None

    def declared(self, reads: frozenset[str] | None, writes: frozenset[str] | None) -> "DeclaredView":
        return DeclaredView(self, reads or frozenset(), writes or frozenset())


class DeclaredView:
    """A view that lets a Python action touch only the tables it declared."""

    def __init__(self, view: StoreView, reads: frozenset[str], writes: frozenset[str]):
        self._view = view
        self._reads = reads | writes
        self._writes = writes

    @property
    def ts(self) -> Any:
        return self._view.ts

    def _check(self, table: str, allowed: frozenset[str], what: str) -> None:
        if table not in allowed:
            raise UndeclaredAccess(
                f"rule {self._view.origin} {what} table {table!r}, which it did not declare; add it to "
                f"{'writes' if what == 'writes' else 'reads'}=[…] of the rule (schedulers lock ahead from them)")

    def read(self, table: str, key: Any) -> dict | None:
        self._check(table, self._reads, "reads")
        return self._view.read(table, key)

    def scan(self, table: str, where: Mapping[str, Any] | None = None) -> list[dict]:
        self._check(table, self._reads, "reads")
        return self._view.scan(table, where)

    def write(self, table: str, key: Any, **values: Any) -> None:
        self._check(table, self._writes, "writes")
        self._view.write(table, key, **values)

    def insert(self, table: str, **values: Any) -> Any:
        self._check(table, self._writes, "writes")
        return self._view.insert(table, **values)

    def delete(self, table: str, key: Any) -> None:
        self._check(table, self._writes, "writes")
        self._view.delete(table, key)
