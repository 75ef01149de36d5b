"""The stream engine's state: the committed :class:`State` between batches, a batch's
:class:`Pending` laid over it (partitions as an overlay, the rest as copies), and the
:class:`BatchOutcome` participant that settles it when the batch's transaction ends.  Neither
state class locks: the engine's ``_mutex`` protects the committed state and the pointer to the
pending one, and ``BatchRun._mutex`` the overlay while a batch runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Hashable

from activedb.streams._events import Punctuation, StreamEvent
from activedb.streams._matcher import PartitionState
from activedb.streams._persist import PartitionRows
from activedb.txn import CommitParticipant

if TYPE_CHECKING:  # pragma: no cover
    from activedb.txn import Transaction


@dataclass
class State:
    """The engine's state between batches (the committed one) or during one (pending)."""

    partitions: dict[tuple[str, tuple[Hashable, ...]], PartitionState] = field(default_factory=dict)
    # Invariant: sorted by (order key, arrival number); no entry is older than `released`.
    buffer: list[tuple[tuple[object, ...], int, StreamEvent]] = field(default_factory=list)
    released: Punctuation | None = None   # every event older than this was released (None: nothing yet)
    punctuations: dict[str, Punctuation] = field(default_factory=dict)
    position: int = 0                 # the next release position
    arrivals: int = 0                 # the next arrival number
    time_kind: str | None = None      # "number" or "datetime", fixed by the first event admitted or punctuation
    # The saved chunks of the buffer (durable engines): row item -> the latest ts of its events.
    chunks: dict[str, Punctuation | None] = field(default_factory=dict)
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
        self.buffer = list(base.buffer)
        self.released = base.released
        self.punctuations = dict(base.punctuations)
        self.position = base.position
        self.arrivals = base.arrivals
        self.time_kind = base.time_kind
        self.chunks = dict(base.chunks)
        self.buffer_added: dict[int, StreamEvent] = {}     # arrival -> event, admitted and still buffered
        self.written: dict[tuple[str, tuple[Hashable, ...]], PartitionState | None] = {}    # partitions saved in this batch
        self.units: list[str] = []          # history units run in this batch (aborted with it)
        self.saved_rows = False             # the batch's save changed base.partition_rows (undone by loading again)

    def partition(self, key: tuple[str, tuple[Hashable, ...]]) -> PartitionState | None:
        if key in self.overlay:
            return self.overlay[key]
        return self.base.partitions.get(key)

    def materialize(self) -> State:
        partitions = self.base.partitions
        for key, value in self.overlay.items():
            if value is None:
                partitions.pop(key, None)
            else:
                partitions[key] = value
        return State(partitions=partitions, buffer=self.buffer, released=self.released,
                     punctuations=self.punctuations, position=self.position, arrivals=self.arrivals,
                     time_kind=self.time_kind, chunks=self.chunks, partition_rows=self.base.partition_rows)


class BatchOutcome(CommitParticipant):
    """Tells the engine how the transaction of a batch ended — aborted (its own abort or its tree's), or committed at
    the top level: ``settle(pending, committed)``, called once, after the outcome is known (outside the
    transaction's locks).

    It lets go of the pending state when it has told: the transaction keeps its participants, and the pending
    state names its transaction (``root``), so holding on would keep every batch's pending state — its copy of
    the buffer, its partition states — alive until Python's cyclic collector finds the pair."""

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
