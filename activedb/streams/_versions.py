"""LWM's versions (Active CEP §5.3, Algorithm 2's ``Map<time, string> versions``): one
:class:`VersionStore` per micro-batch over an :class:`activedb.versions.Versions` stamped with
positions, values ``(image, history sequence, writer's position)`` — the design note ``activedb/streams/README.md``
("What a Read sees", choices 13 and 15).

Thread-safety: ``_mutex`` protects ``_store``, ``_tables``, ``_by_position``, ``_deferred``, the counters
and ``floor``; a leaf (the store takes no mutex).  Images handed out are copies, their lists and dicts (a JSON or
ARRAY column's) too (``store.own_image``: the store does not know the tables), and a scan's predicate gets the copy
it hands out: a reader that changes what it got changes no version.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Mapping, NamedTuple, TypeAlias

from activedb.streams.errors import UnplannedAccess
from activedb.store import matches, own_image
from activedb.versions import Versions

if TYPE_CHECKING:
    from activedb.store import Key, RowImage

#: A row's version: its image (None: absent), the sequence of the Write it came from, that Write's position.
_Version: TypeAlias = "tuple[RowImage | None, int | None, int | None]"

_ABSENT = (None, None, None)      # (image, sequence, writer's position) of a row that is not there


class DeferredWrite(NamedTuple):
    """A Write that stayed in the versions (LWM's deferred Writes): what the s-transaction asked of its
    subtransaction, made in the batch's transaction at its end (``operation``: write, insert or delete;
    ``values`` as given, None for a delete)."""

    table: str
    key: Key
    operation: str
    values: RowImage | None


@dataclass(frozen=True)
class VersionStatistics:
    versions: int             # versions held now
    peak_versions: int        # most versions held at once
    appended: int             # versions written
    collected: int            # versions dropped by garbage collection
    dropped: int              # versions of aborted s-transactions


class VersionStore:
    """The versions of one batch (public as ``activedb.streams.VersionStore``: LWM's scheduler makes one per batch;
    an extension scheduler, or a measurement of what a version costs, may make its own).  Thread-safe."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._store: Versions[_Version] = Versions(default=_ABSENT)   # (table, key) -> (image, sequence, writer) by position
        self._tables: set[str] = set()         # tables loaded whole
        self.floor = 0
        self._peak = self._appended = self._collected = self._dropped = 0    # versions: VersionStatistics
        self._by_position: dict[int, list[tuple[str, Key]]] = {}
        self._deferred: dict[int, list[DeferredWrite]] = {}     # by position: its Writes that stayed here

    # --- the dispatcher ---------------------------------------------------------------------

    def load_row(self, table: str, key: Key, image: RowImage | None, sequence: int | None) -> None:
        """The row as the batch found it (``image`` None: absent; ``sequence``: the history's latest Write of it)."""
        with self._mutex:
            self._store.set_base((table, key), (image, sequence, None))

    def load_table(self, table: str, rows: Mapping[Key, RowImage], sequences: Mapping[Key, int]) -> None:
        """Every row of ``table`` (absent keys are absent rows); ``sequences``: the history's
        latest Write of each row, including rows written and then deleted."""
        with self._mutex:
            self._tables.add(table)
            for key, image in rows.items():
                self._store.set_base((table, key), (image, sequences.get(key), None))
            for key, sequence in sequences.items():
                self._store.set_base((table, key), (None, sequence, None))

    def tracks(self, table: str, key: Key) -> bool:
        """True if a Read of the row may happen in this batch (its Writes must leave versions)."""
        with self._mutex:
            return table in self._tables or (table, key) in self._store

    def tracks_table(self, table: str) -> bool:
        """True if the table was loaded whole (a plan of the batch reads it as a table)."""
        with self._mutex:
            return table in self._tables

    # --- the workers ------------------------------------------------------------------------

    def read(self, position: int, table: str, key: Key, own: bool = True
             ) -> tuple[RowImage | None, int | None, int | None]:
        """The image a Read at ``position`` sees — with the s-transaction's own Writes, or (``own`` False) as it
        was before them —, the sequence of the Write it came from and that Write's position (None: the base)."""
        with self._mutex:
            state = (table, key)
            if table not in self._tables and state not in self._store:
                raise UnplannedAccess(f"read of {table}[{key!r}] at position {position}: the row was not in any "
                                      f"access plan of the batch, so LWM has no version of it (a rule must "
                                      f"declare the tables it reads)")
            self._collected += self._store.collect(state, self.floor)   # rows are collected when touched
            image, sequence, writer = self._store.read(state, position + 1 if own else position)  # type: ignore[misc]
        return (own_image(image) if image is not None else None), sequence, writer

    def scan(self, position: int, table: str, where: Mapping[str, object] | Callable[[RowImage], bool] | None,
             own: bool = True) -> tuple[list[RowImage], dict[Key, int], set[int]]:
        """Every row of ``table`` visible at ``position`` (``own`` as for :meth:`read`) matching ``where``, by
        key the sequence of the Write each visible row came from, and the positions of those Writes."""
        with self._mutex:
            if table not in self._tables:
                raise UnplannedAccess(f"scan of {table} at position {position}: no access plan of the batch reads "
                                      f"the whole table, so LWM did not load it (a rule must declare the tables it "
                                      f"reads)")
            rows: list[RowImage] = []
            seen: dict[Key, int] = {}
            writers: set[int] = set()
            before = position + 1 if own else position
            predicate = callable(where) and not isinstance(where, Mapping)
            for state in self._store.states():
                if state[0] != table:  # type: ignore[index]  # (states are (table, key))
                    continue
                self._collected += self._store.collect(state, self.floor)
                image, sequence, writer = self._store.read(state, before)  # type: ignore[misc]  # (a default)
                if sequence is not None:
                    seen[state[1]] = sequence  # type: ignore[index]
                if writer is not None:
                    writers.add(writer)
                if image is None:
                    continue
                if predicate:
                    image = own_image(image)     # (a predicate gets the copy it may keep)
                    if matches(image, where):
                        rows.append(image)
                elif matches(image, where):      # (equalities read the version only)
                    rows.append(own_image(image))
        return rows, seen, writers

    def append(self, position: int, table: str, key: Key, image: RowImage | None, sequence: int | None, *,
               deferred: DeferredWrite | None = None) -> None:
        """The s-transaction at ``position`` wrote the row; ``image`` is the row after it
        (None: deleted).  LWM grants the Writes of a row in position order, so this appends;
        a second write of the s-transaction replaces its version.  ``deferred``: the Write stayed
        here, not in the s-transaction's subtransaction (:meth:`deferred_writes` hands it on)."""
        with self._mutex:
            state = (table, key)
            if deferred is not None:
                self._deferred.setdefault(position, []).append(deferred)
            if self._store.write(state, position, (image, sequence, position), replace=True):
                self._by_position.setdefault(position, []).append(state)
                self._appended += 1
                self._peak = max(self._peak, self._appended - self._collected - self._dropped)
            self._collected += self._store.collect(state, self.floor)

    def drop(self, position: int) -> None:
        """The s-transaction at ``position`` aborted: its versions go (before its locks do)."""
        with self._mutex:
            self._deferred.pop(position, None)
            for state in self._by_position.pop(position, ()):
                self._store.remove(state, position)
                self._dropped += 1

    def deferred_writes(self) -> list[DeferredWrite]:
        """Once every s-transaction of the batch ended: the Writes that stayed here, in position order and
        each s-transaction's in its own order — what its subtransaction would have left in the batch's
        transaction, in SEI's order (those of aborted s-transactions are gone: :meth:`drop`)."""
        with self._mutex:
            return [write for position in sorted(self._deferred) for write in self._deferred[position]]

    def advance(self, floor: int) -> None:
        """Every s-transaction before ``floor`` has ended (rows are collected as they are touched)."""
        with self._mutex:
            self.floor = max(self.floor, floor)

    def statistics(self) -> VersionStatistics:
        with self._mutex:
            return VersionStatistics(versions=self._appended - self._collected - self._dropped,
                                     peak_versions=self._peak, appended=self._appended,
                                     collected=self._collected, dropped=self._dropped)
