"""The stream engine's state: the committed :class:`State` between batches, a batch's
:class:`Pending` laid over it (partitions and the reorder buffer as overlays, :class:`BufferOverlay` the latter's;
the rest as copies), the
:class:`BatchOutcome` participant that settles it when the batch's transaction ends, and the
:class:`WindowIndex` that finds the partitions a released punctuation has put out of every window.
None of them locks: the engine's ``_mutex`` protects the committed state, the pointer to the
pending one and the index, and ``BatchRun._mutex`` the overlay while a batch runs.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Hashable, Iterator, Mapping

from activedb.events import Instant
from activedb.streams._events import END_OF_STREAM, Punctuation, StreamEvent, ts_less
from activedb.streams._matcher import Matcher, PartitionState, earliest, outside
from activedb.streams._persist import BufferChunks, PartitionRows
from activedb.txn import CommitParticipant

if TYPE_CHECKING:  # pragma: no cover
    from activedb.txn import Transaction


# A buffered event: (order key, arrival number, event).
BufferEntry = tuple[tuple[object, ...], int, StreamEvent]


@dataclass
class State:
    """The engine's state between batches (the committed one) or during one (pending)."""

    partitions: dict[tuple[str, tuple[Hashable, ...]], PartitionState] = field(default_factory=dict)
    # Invariant: sorted by (order key, arrival number); no entry is older than `released`.
    buffer: list[BufferEntry] = field(default_factory=list)
    released: Punctuation | None = None   # every event older than this was released (None: nothing yet)
    punctuations: dict[str, Punctuation] = field(default_factory=dict)
    position: int = 0                 # the next release position
    arrivals: int = 0                 # the next arrival number
    time_kind: str | None = None      # "number" or "datetime", fixed by the first event admitted or punctuation
    # The saved chunks of the buffer (durable engines; ``_persist.BufferChunks``), by the latest ts of their events.
    chunks: BufferChunks = field(default_factory=BufferChunks)
    # Which saved rows hold the partitions' states (durable engines; ``_persist.PartitionRows``).
    partition_rows: PartitionRows = field(default_factory=PartitionRows)


class Pending:
    """A batch's state on top of the committed one (partitions as an overlay)."""

    def __init__(self, base: State, node: Transaction):
        self.root = node.root
        # The transaction the batch runs in (root or a subtransaction), whose outcome the state follows (BatchOutcome is
        # enlisted there: a subtransaction's abort drops it; its commit moves it to the parent).
        self.node = node
        self.base = base
        self.overlay: dict[tuple[str, tuple[Hashable, ...]], PartitionState | None] = {}
        # The partitions whose overlay entry was set (``put``) since the batch's last save (``_persist.save``
        # empties it) and since the window index last looked (``WindowIndex.expire`` empties it): a call of
        # ``process`` visits these, not every partition its transaction changed before it.
        # Invariant: each is a subset of ``overlay``'s keys, and holds every key whose entry was set since then.
        # (Dicts as ordered sets: a save writes its partitions in the order they were set, whatever the hash seed.)
        self.unsaved: dict[tuple[str, tuple[Hashable, ...]], None] = {}
        self.unindexed: dict[tuple[str, tuple[Hashable, ...]], None] = {}
        self.buffer = BufferOverlay(base.buffer)
        self.released = base.released
        self.punctuations = dict(base.punctuations)
        self.position = base.position
        self.arrivals = base.arrivals
        self.time_kind = base.time_kind
        self.buffer_added: dict[int, StreamEvent] = {}     # arrival -> event, admitted and still buffered
        self.written: dict[tuple[str, tuple[Hashable, ...]], PartitionState | None] = {}    # partitions saved in this batch
        self.units: list[str] = []          # history units run in this batch (aborted with it)
        # The batch's save changed base.partition_rows or base.chunks (undone by loading again).
        self.saved_rows = False

    def partition(self, key: tuple[str, tuple[Hashable, ...]]) -> PartitionState | None:
        if key in self.overlay:
            return self.overlay[key]
        return self.base.partitions.get(key)

    def put(self, key: tuple[str, tuple[Hashable, ...]], state: PartitionState | None) -> None:
        """The batch's state of partition ``key`` is ``state`` (None: emptied)."""
        self.overlay[key] = state
        self.unsaved[key] = None
        self.unindexed[key] = None

    def materialize(self) -> State:
        partitions = self.base.partitions
        for key, value in self.overlay.items():
            if value is None:
                partitions.pop(key, None)
            else:
                partitions[key] = value
        return State(partitions=partitions, buffer=self.buffer.commit(), released=self.released,
                     punctuations=self.punctuations, position=self.position, arrivals=self.arrivals,
                     time_kind=self.time_kind, chunks=self.base.chunks, partition_rows=self.base.partition_rows)


class BufferOverlay:
    """A batch's reorder buffer laid over the committed one (``State.buffer``), which it leaves as it is until
    :meth:`commit`: an aborted batch's committed buffer is the one before it, and a call costs what it changes — a
    binary search of the committed buffer per event admitted, a step per event released — not a copy of every
    buffered event.

    The buffer it stands for is ``base[taken:]`` with each entry of ``added`` put before ``base[slot]`` (``parts``).
    Invariant: ``added`` is sorted by (slot, entry) and every slot is in ``taken..len(base)``; ``base[slot - 1]``
    (if any) sorts before the entry and ``base[slot]`` (if any) after it — so the buffer is sorted, and merging the
    two compares no entries.

    Only the batch's thread changes it (as :class:`Pending`); each change replaces ``parts`` whole (new lists, one
    assignment), so an inspection from another thread under the engine's ``_mutex`` (``len``, iteration: the
    engine's ``buffered()`` and ``statistics()``) sees the buffer before or after a change, not half of one."""

    def __init__(self, base: list[BufferEntry]):
        self.base = base                # the committed buffer, unchanged until commit
        # (taken, added): base[:taken] was released by the batch; added holds (slot, entry) of the events the batch
        # admitted and has not released.
        self.parts: tuple[int, list[tuple[int, BufferEntry]]] = (0, [])

    def __len__(self) -> int:
        taken, added = self.parts
        return len(self.base) - taken + len(added)

    def __iter__(self) -> Iterator[BufferEntry]:
        """The entries in their order (for inspection: it visits every one)."""
        taken, added = self.parts
        return iter(self._merged(taken, added, len(self.base), len(added)))

    def add(self, entries: list[BufferEntry]) -> list[tuple[BufferEntry, TypeError]]:
        """Put ``entries`` in the buffer; returns those left out, with the error of comparing their order key with
        an entry's of the same time and priority (two tie keys that do not compare), in their order."""
        base, (taken, added) = self.base, self.parts
        refused: list[tuple[BufferEntry, TypeError]] = []
        placed: list[tuple[int, BufferEntry]] = []
        for entry in entries:
            try:
                placed.append((bisect.bisect_right(base, entry, taken), entry))
            except TypeError as error:
                refused.append((entry, error))
        merged = added + placed
        try:
            merged.sort()
        except TypeError:           # (the list is left part sorted: put them in one by one)
            merged = list(added)
            for slotted in placed:
                try:
                    bisect.insort(merged, slotted)
                except TypeError as error:
                    refused.append((slotted[1], error))
            refused.sort(key=lambda pair: pair[0][1])       # (by arrival: the order they came in)
        self.parts = (taken, merged)
        return refused

    def drop_from(self, arrival: int) -> None:
        """Take out the entries admitted with an arrival number of at least ``arrival`` (none was released)."""
        taken, added = self.parts
        self.parts = (taken, [slotted for slotted in added if slotted[1][1] < arrival])

    def release(self, bound: Punctuation) -> list[BufferEntry]:
        """Take out the entries whose events are older than ``bound`` (all of them for END_OF_STREAM) and return
        them in their order.  The order key's first part is the timestamp: they are the first ones of ``base[taken:]``
        and of ``added``."""
        base, (taken, added) = self.base, self.parts
        if bound is END_OF_STREAM:
            base_cut, added_cut = len(base), len(added)
        else:
            base_cut = bisect.bisect_left(base, True, taken, key=lambda entry: not ts_less(entry[2].ts, bound))
            added_cut = bisect.bisect_left(added, True, key=lambda slotted: not ts_less(slotted[1][2].ts, bound))
        released = self._merged(taken, added, base_cut, added_cut)
        self.parts = (base_cut, added[added_cut:])
        return released

    def _merged(self, taken: int, added: list[tuple[int, BufferEntry]], base_cut: int, added_cut: int
                ) -> list[BufferEntry]:
        """``base[taken:base_cut]`` and ``added[:added_cut]`` in their order.  Precondition: those added entries'
        slots are at most ``base_cut`` (an entry older than a bound is not put after one that is not)."""
        base = self.base
        merged: list[BufferEntry] = []
        start = taken
        for slot, entry in itertools.islice(added, added_cut):
            if slot > start:
                merged.extend(base[start:slot])
                start = slot
            merged.append(entry)
        merged.extend(base[start:base_cut])
        return merged

    def commit(self) -> list[BufferEntry]:
        """The committed buffer with the batch's changes, made in place (an insertion or the deletion of the released
        entries moves the references after it, visiting no entry).  Once, when the batch commits."""
        base, (taken, added) = self.base, self.parts
        end = len(added)
        while end:                      # from the last slot back: an insertion moves no slot still to come
            slot = added[end - 1][0]
            start = end - 1
            while start and added[start - 1][0] == slot:
                start -= 1
            base[slot:slot] = [entry for _, entry in added[start:end]]
            end = start
        del base[:taken]
        self.parts = (0, [])
        return base


class BatchOutcome(CommitParticipant):
    """Tells the engine how the transaction of a batch ended — aborted (its own abort or its tree's), or committed at
    the top level: ``settle(pending, committed)``, called once, after the outcome is known (outside the
    transaction's locks).

    It lets go of the pending state when it has told: the transaction keeps its participants, and the pending
    state names its transaction (``root``), so holding on would keep every batch's pending state —
    the events it admitted, its partition states — alive until Python's cyclic collector finds the pair."""

    def __init__(self, pending: Pending, settle: Callable[[Pending, bool], None]):
        self.pending: Pending | None = pending
        self.settle = settle

    def committed(self, transaction: Transaction) -> None:
        self._tell(True)

    def aborted(self, transaction: Transaction, error: BaseException | None) -> None:
        self._tell(False)

    def _tell(self, committed: bool) -> None:
        pending, self.pending = self.pending, None
        if pending is not None:
            self.settle(pending, committed)


class WindowIndex:
    """The partitions of the queries with ``WITHIN``, by the timestamp of their earliest event: :meth:`expire` finds
    those a released punctuation has put outside every window without visiting the others (the design note's
    "State between batches").

    A hint, never the state.  Invariant: every partition of an indexed query (one in ``_heaps``) that holds events
    in the state :meth:`expire` is given is in ``_indexed`` and has one heap entry, whose timestamp is at most that
    of its earliest event — events are released in timestamp order, so a partition's earliest event only gets
    later (also when it empties and fills again), and an entry stays a lower bound.  A batch that aborts may have
    taken entries of partitions its committed state still holds: the engine then calls :meth:`clear`, and the next
    :meth:`expire` indexes each query anew, as after the saved state is loaded.

    Not thread-safe: the engine's ``_mutex`` protects it."""

    def __init__(self) -> None:
        # Per query: a heap of (earliest event's ts, serial, partition key); the serial orders equal timestamps (two
        # keys need not compare).
        self._heaps: dict[str, list[tuple[Instant, int, tuple[Hashable, ...]]]] = {}
        self._indexed: set[tuple[str, tuple[Hashable, ...]]] = set()
        self._serials = itertools.count()

    def clear(self) -> None:
        """Forget every entry: the next :meth:`expire` indexes each query from the state it is given."""
        self._heaps.clear()
        self._indexed.clear()

    def expire(self, pending: Pending, matchers: Mapping[str, Matcher], punctuation: Punctuation) -> int:
        """Prune ``pending``'s partitions once ``punctuation`` is released (:meth:`Matcher.expire`): the events no
        later event can be matched with are dropped, and a partition left with none is removed (None in the
        overlay, ``Pending.put``, as the matcher removes one it empties), so the batch's save writes the change.
        ``matchers``: the defined queries' by name.  Returns how many partitions it looked at (the engine's
        ``statistics().partitions_visited``).

        Cost: ``END_OF_STREAM`` removes every partition of every query (one pass, once: no event comes after it).
        Otherwise, per query with ``WITHIN``, a look at each partition set in the overlay since the last call
        (``Pending.unindexed``: indexing those new), not at those the transaction's earlier batches set, and one
        heap operation per partition whose earliest event is outside the window — a partition that keeps events is
        entered again by its new earliest one; a query not indexed yet (after the state is loaded, or a batch
        aborted) costs one pass over its partitions.  A query without ``WITHIN`` is not looked at before the end.
        Precondition: every released event has been matched (the batch's s-transactions have ended)."""
        if punctuation is END_OF_STREAM:
            ended = [partition for partition in {**pending.base.partitions, **pending.overlay}
                     if pending.partition(partition) is not None]
            for partition in ended:
                pending.put(partition, None)
            self.clear()
            pending.unindexed.clear()
            return len(ended)
        windowed = {name: matcher for name, matcher in matchers.items() if matcher.query.within is not None}
        heaps, indexed = self._heaps, self._indexed
        unindexed, pending.unindexed = pending.unindexed, {}
        visited = len(unindexed)
        for partition in unindexed:                     # the partitions set since the last call
            if partition[0] in heaps and partition not in indexed:
                state = pending.overlay[partition]
                if state is not None:
                    self._push(partition, state)
        fresh = [name for name in windowed if name not in heaps]
        if fresh:
            for name in fresh:
                heaps[name] = []
            for partition in {**pending.base.partitions, **pending.overlay}:
                if partition[0] in fresh and partition not in indexed:
                    visited += 1
                    state = pending.partition(partition)
                    if state is not None:
                        self._push(partition, state)
        for name, matcher in windowed.items():
            heap = heaps[name]
            within: float = matcher.query.within  # type: ignore[assignment]  # (windowed)
            while heap and outside(punctuation, heap[0][0], within):
                _, _, key = heapq.heappop(heap)
                visited += 1
                partition = (name, key)
                indexed.discard(partition)
                state = pending.partition(partition)
                if state is None:
                    continue                            # (the matcher emptied it)
                pruned = matcher.expire(state, punctuation)
                if pruned is not state:
                    pending.put(partition, pruned)
                if pruned is not None:
                    self._push(partition, pruned)     # (its earliest event is inside the window: the loop ends)
        pending.unindexed.clear()                       # (what this call set: entered again already, or emptied)
        return visited

    def _push(self, partition: tuple[str, tuple[Hashable, ...]], state: PartitionState) -> None:
        """Enter ``partition`` by its earliest event.  Precondition: ``state`` holds an event; the partition's query
        is indexed and the partition is not."""
        heapq.heappush(self._heaps[partition[0]], (earliest(state), next(self._serials), partition[1]))
        self._indexed.add(partition)
