"""Partially ordered lists (the paper's ``POList<E>``: :class:`Item`, :class:`POList`, ``oldest``,
``oldest_following``, ``newest``, ``newest_before``) and the per-producer progress that decides
stability (:class:`Producer`: sync-points, ``covers``).  The formulas, reconstructed, are in the design
note ``activedb/composite/README.md``.  Not thread-safe by themselves: used under ``CompositionEngine._mutex``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Iterable, Literal, Sequence, TypeAlias

from activedb.events import Instant, LocalClock, Order, Timestamp, earlier, local_order
from activedb.streams import StreamEvent

EXACT_CLOCK = LocalClock()


@dataclass(eq=False, slots=True)
class Item:
    """An event in a node's lists.  ``number`` is its arrival number (identity only — never used to order);
    ``processed`` marks, in recent consumption, an event whose own composition was decided.  Items compare
    by identity."""

    event: StreamEvent
    ts: Timestamp
    number: int
    processed: bool = False

    def sort_key(self) -> tuple[Instant, Instant, str | None, Instant, str, str]:
        ts = self.ts
        return (ts.lower, ts.upper, ts.producer, ts.local if ts.local is not None else ts.lower,
                self.event.type, repr(sorted(dict(self.event.attributes).items())))

    def __repr__(self) -> str:
        return f"<Item {self.event.type}{self.ts}>"


def before(a: Timestamp, b: Timestamp) -> bool:
    """``a < b``: interval order, refined by the local order of one producer's events."""
    if earlier(a.interval.upper, b.interval.lower):
        return True
    if earlier(b.interval.upper, a.interval.lower):
        return False
    return local_order(a, b) is Order.BEFORE


def oldest(items: Sequence[Item]) -> list[Item]:
    if not items:
        return []
    lowest_upper = min(item.ts.interval.upper for item in items)
    # Anything whose lower bound is above the lowest upper bound is preceded by that item; nothing
    # precedes a candidate in interval order (it would end before lower(candidate) <= lowest_upper), so
    # only the local order of one producer can still rule a candidate out.
    candidates = [item for item in items if not earlier(lowest_upper, item.ts.interval.lower)]
    return [item for item in candidates if not _locally_preceded(item, items)]


def newest(items: Sequence[Item]) -> list[Item]:
    if not items:
        return []
    highest_lower = max(item.ts.interval.lower for item in items)
    candidates = [item for item in items if not earlier(item.ts.interval.upper, highest_lower)]
    return [item for item in candidates if not _locally_preceded(item, items, followed=True)]


def _locally_preceded(item: Item, items: Sequence[Item], *, followed: bool = False) -> bool:
    """Some other item of ``items`` from the same producer is local-before ``item`` (``followed``: after it)."""
    ts = item.ts
    if ts.local is None:
        return False
    return any(other is not item and other.ts.producer == ts.producer and other.ts.local is not None
               and (local_order(ts, other.ts) if followed else local_order(other.ts, ts)) is Order.BEFORE
               for other in items)


def oldest_following(items: Iterable[Item], anchor: Item) -> list[Item]:
    """The oldest items that follow ``anchor`` (``anchor < e`` or ``anchor ⊥ e``)."""
    return oldest([item for item in items if item is not anchor and not before(item.ts, anchor.ts)])


def newest_before(items: Iterable[Item], anchor: Item) -> list[Item]:
    """The newest items that precede ``anchor`` (``e < anchor`` or ``e ⊥ anchor``)."""
    return newest([item for item in items if item is not anchor and not before(anchor.ts, item.ts)])


#: What the application decided about an uncertainty: ``("use", item)`` or ``("drop", items)``.
Decision: TypeAlias = "tuple[Literal['use'], Item] | tuple[Literal['drop'], list[Item]]"


class POList(list[Item]):
    """The paper's ``POList<E>``: the items that may play one component of a node, in arrival order (a
    list; the order that matters is the partial one the methods compute)."""

    def oldest(self) -> list[Item]:
        return oldest(self)

    def newest(self) -> list[Item]:
        return newest(self)

    def oldest_following(self, anchor: Item) -> list[Item]:
        return oldest_following(self, anchor)

    def newest_before(self, anchor: Item) -> list[Item]:
        return newest_before(self, anchor)


class Membership(enum.Enum):
    """A producer's state in the engine's membership (atomic or weak, see ``Producer.weak``)."""

    JOINED = "joined"
    LEFT = "left"


@dataclass(eq=False, slots=True)
class Producer:
    """One producer's progress, as the composition engine knows it.

    Invariant: ``sync`` never decreases; no event of this producer not yet received has a lower bound
    below ``sync`` (the per-producer FIFO channel and monotone lower bounds make it so; a late event that
    breaks it is accepted only if no decision relied on its absence)."""

    name: str
    types: frozenset[str]
    sync: Instant | None
    clock: LocalClock | None
    last_seen: float
    weak: bool = False        # weak membership: admitted late; its old events are checked against the past
    latest_local: Instant | None = None
    state: Membership = Membership.JOINED
    events: int = 0
    heartbeats: int = 0

    def advance(self, ts: Timestamp) -> bool:
        """Move the sync-point to ``lower(ts)`` (and the latest local reading); True if it moved."""
        moved = False
        lower = ts.interval.lower
        if self.sync is None or earlier(self.sync, lower):
            self.sync = lower
            moved = True
        if ts.local is not None and (self.latest_local is None or earlier(self.latest_local, ts.local)):
            self.latest_local = ts.local
            moved = True
        return moved

    def covers(self, stamps: Sequence[Timestamp]) -> bool:
        """Every event of this producer not yet received certainly follows the candidates ``stamps``:
        the candidate with the lowest upper bound ends before the sync-point, or all candidates are this
        producer's own and local-before its latest local reading."""
        if not stamps:
            return False
        if self.state is Membership.LEFT:
            return True
        lowest_upper = min(stamp.interval.upper for stamp in stamps)
        if self.sync is not None and earlier(lowest_upper, self.sync):
            return True
        if self.latest_local is None:
            return False
        for stamp in stamps:
            if stamp.producer != self.name or stamp.local is None:
                return False
            clock = stamp.clock or self.clock or EXACT_CLOCK
            if not clock.orders(stamp.local, self.latest_local):
                return False
        return True

    def __repr__(self) -> str:
        return f"<Producer {self.name} {sorted(self.types)} sync={self.sync!r} {self.state.value}>"
