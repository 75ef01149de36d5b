"""LWM's multi-version store: what a Read at a timestamp sees (Active CEP §5.3, Algorithm 2's
``Map<time, string> versions``).

One :class:`VersionStore` per micro-batch.  For every row the batch's s-transactions may
read it keeps

* the **base image** — the row as the batch's transaction saw it before any s-transaction
  of the batch ran (loaded by the dispatcher, before the workers start: the rows the
  access plans name, and whole tables where a plan reads a table), with the history
  sequence of the Write it came from (None: from before the history);
* the **versions** written by the batch's s-transactions: ``(position, image, sequence)``,
  in position order — LWM grants the Writes of a row in timestamp order, so appending
  keeps the order; an s-transaction writing a row twice replaces its own version.

A Read by the s-transaction at ``position`` sees the latest version with a position
``≤ position`` — every earlier s-transaction's write (the lwm guarantees they ended) plus
its own writes — else the base.  Versions of other s-transactions with equal timestamps
and later positions are invisible: Def. 6 case (4) decided by the declared order.

An aborted s-transaction's versions are dropped before its locks are released, so nobody
ever reads them (a Read after them waits for the end of their writer).

Garbage collection: ``floor`` is the smallest position of an s-transaction of the batch
that has not ended (every one before it ended; the punctuation bounds the batch: no later
batch reads below it).  Of a row's versions with a position below ``floor`` only the
latest can still be read; older ones and the base are dropped whenever the row is
touched.  When the batch ends the store is dropped whole: its effects are in the batch's
transaction (the Writes went there in timestamp order), and the next batch reads that.

Thread-safety: ``_mutex`` protects ``_rows``, ``_tables``, the counters and ``floor``; a
leaf.  Images handed out are copies.
"""

from __future__ import annotations

import bisect
import threading
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from activedb.streams.errors import UnplannedAccess


class _Row:
    __slots__ = ("base", "base_sequence", "has_base", "positions", "versions")

    def __init__(self, base: dict | None, base_sequence: int | None):
        self.base = base
        self.base_sequence = base_sequence
        self.has_base = True
        self.positions: list[int] = []
        self.versions: list[tuple[dict | None, int | None]] = []   # (image, history sequence)

    def visible(self, position: int) -> tuple[dict | None, int | None]:
        index = bisect.bisect_right(self.positions, position)
        if index:
            return self.versions[index - 1]
        if not self.has_base:
            raise AssertionError("a version needed by an open s-transaction was collected")  # pragma: no cover
        return self.base, self.base_sequence

    def collect(self, floor: int) -> int:
        """Drop what no s-transaction at ``floor`` or later can read; returns versions dropped."""
        index = bisect.bisect_left(self.positions, floor)     # versions [0, index) are below the floor
        if index == 0:
            return 0
        self.has_base = False
        self.base = None
        dropped = index - 1
        if dropped:
            del self.positions[:dropped]
            del self.versions[:dropped]
        return dropped


@dataclass(frozen=True)
class VersionStatistics:
    base_rows: int            # rows whose base image was loaded
    versions: int             # versions held now
    peak_versions: int        # most versions held at once
    appended: int             # versions written
    collected: int            # versions dropped by garbage collection
    dropped: int              # versions of aborted s-transactions


class VersionStore:
    """The versions of one batch (see the module docstring)."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._rows: dict[tuple[str, tuple], _Row] = {}
        self._tables: set[str] = set()         # tables loaded whole
        self.floor = 0
        self._versions = 0
        self._peak = 0
        self._appended = 0
        self._collected = 0
        self._dropped = 0
        self._by_position: dict[int, list[tuple[str, tuple]]] = {}

    # --- the dispatcher ---------------------------------------------------------------------

    def load_row(self, table: str, key: tuple, image: dict | None, sequence: int | None) -> None:
        with self._mutex:
            self._rows.setdefault((table, key), _Row(image, sequence))

    def load_table(self, table: str, rows: Mapping[tuple, dict], sequences: Mapping[tuple, int]) -> None:
        """Every row of ``table`` (absent keys are absent rows); ``sequences``: the history's
        latest Write of each row, including rows written and then deleted."""
        with self._mutex:
            self._tables.add(table)
            for key, image in rows.items():
                self._rows.setdefault((table, key), _Row(image, sequences.get(key)))
            for key, sequence in sequences.items():
                self._rows.setdefault((table, key), _Row(None, sequence))

    def tracks(self, table: str, key: tuple) -> bool:
        """True if a Read of the row may happen in this batch (its Writes must leave versions)."""
        with self._mutex:
            return table in self._tables or (table, key) in self._rows

    def tracks_table(self, table: str) -> bool:
        """True if the table was loaded whole (a plan of the batch reads it as a table)."""
        with self._mutex:
            return table in self._tables

    # --- the workers ------------------------------------------------------------------------

    def read(self, position: int, table: str, key: tuple) -> tuple[dict | None, int | None]:
        """The image a Read at ``position`` sees, and the sequence of the Write it came from."""
        with self._mutex:
            row = self._rows.get((table, key))
            if row is None:
                if table not in self._tables:
                    raise UnplannedAccess(f"read of {table}[{key!r}] at position {position}: the row was not in any "
                                          f"access plan of the batch, so LWM has no version of it (a rule must "
                                          f"declare the tables it reads)")
                return None, None
            self._collect_row(row)
            image, sequence = row.visible(position)
        return (dict(image) if image is not None else None), sequence

    def scan(self, position: int, table: str, where: Mapping[str, Any] | Callable[[dict], bool] | None
             ) -> tuple[list[dict], dict[tuple, int]]:
        """Every row of ``table`` visible at ``position`` matching ``where``, and by key the
        sequence of the Write each visible row came from."""
        with self._mutex:
            if table not in self._tables:
                raise UnplannedAccess(f"scan of {table} at position {position}: no access plan of the batch reads "
                                      f"the whole table, so LWM did not load it (a rule must declare the tables it "
                                      f"reads)")
            rows, seen = [], {}
            for (name, key), row in self._rows.items():
                if name != table:
                    continue
                self._collect_row(row)
                image, sequence = row.visible(position)
                if sequence is not None:
                    seen[key] = sequence
                if image is not None and _matches(image, where):
                    rows.append(dict(image))
        return rows, seen

    def append(self, position: int, table: str, key: tuple, image: dict | None, sequence: int) -> None:
        """The s-transaction at ``position`` wrote the row; ``image`` is the row after it
        (None: deleted).  Precondition: every earlier writer of the row has ended (LWM's
        write grant), so positions stay in order."""
        with self._mutex:
            row = self._rows.get((table, key))
            if row is None:
                row = self._rows[(table, key)] = _Row(None, None)   # a row of a table loaded whole, new
            positions = row.positions
            if positions and positions[-1] == position:
                row.versions[-1] = (image, sequence)
                return
            if positions and positions[-1] > position:
                raise AssertionError(f"version of {table}[{key!r}] at {position} after one at {positions[-1]}: LWM "
                                     f"granted writes of a row out of order")  # pragma: no cover
            positions.append(position)
            row.versions.append((image, sequence))
            self._by_position.setdefault(position, []).append((table, key))
            self._appended += 1
            self._versions += 1
            if self._versions > self._peak:
                self._peak = self._versions
            self._collect_row(row)

    def drop(self, position: int) -> None:
        """The s-transaction at ``position`` aborted: its versions go (before its locks do)."""
        with self._mutex:
            for row_id in self._by_position.pop(position, ()):
                row = self._rows[row_id]
                index = bisect.bisect_left(row.positions, position)
                if index < len(row.positions) and row.positions[index] == position:
                    del row.positions[index]
                    del row.versions[index]
                    self._versions -= 1
                    self._dropped += 1

    def advance(self, floor: int) -> None:
        """Every s-transaction before ``floor`` has ended (rows are collected as they are touched)."""
        with self._mutex:
            if floor > self.floor:
                self.floor = floor

    def _collect_row(self, row: _Row) -> None:
        """Caller holds ``_mutex``."""
        if row.positions and row.positions[0] < self.floor:
            dropped = row.collect(self.floor)
            self._versions -= dropped
            self._collected += dropped

    def statistics(self) -> VersionStatistics:
        with self._mutex:
            return VersionStatistics(base_rows=sum(1 for row in self._rows.values() if row.has_base),
                                     versions=self._versions, peak_versions=self._peak, appended=self._appended,
                                     collected=self._collected, dropped=self._dropped)


def _matches(image: dict, where: Mapping[str, Any] | Callable[[dict], bool] | None) -> bool:
    if where is None:
        return True
    if callable(where) and not isinstance(where, Mapping):
        return bool(where(image))
    return all(image.get(column) == value for column, value in where.items())
