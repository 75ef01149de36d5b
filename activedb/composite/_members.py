"""The producers of one composition engine (the paper's §IV membership and §V.A stability; design note
``activedb/composite/README.md``).  Not thread-safe by itself: used under ``CompositionEngine._mutex``.
"""

from __future__ import annotations

import collections
from typing import Callable, Iterable, TypedDict

from activedb.composite._polist import Membership, Producer
from activedb.composite._records import MembershipKind, ProducerInfo
from activedb.composite.errors import MembershipError
from activedb.events import Instant, LocalClock, TimeLike, Timestamp, as_timestamp, earlier


class MembersSnapshot(TypedDict):
    """What :meth:`Members.snapshot` saves: per producer its record and the fields a batch changes (sync, latest
    local time, membership, events, heartbeats, last seen), the producers per type, and ``relied``."""

    producers: dict[str, tuple[Producer, Instant | None, Instant | None, Membership, int, int, float]]
    by_type: dict[str, list[Producer]]
    relied: dict[str, Instant]


class Members:
    """Who may send to engine ``name``, and how far each producer's promise reaches."""

    def __init__(self, name: str, counts: collections.Counter[str]):
        self.name = name
        self.counts = counts
        self.producers: dict[str, Producer] = {}
        self.by_type: dict[str, list[Producer]] = {}
        # Invariant: every decision about type T relied on no event of T with lower bound <= relied[T] still
        # being in transit; an atomic member may therefore only join with ``since`` after it.
        self.relied: dict[str, Instant] = {}

    def join(self, producer: str, types: frozenset[str], since: TimeLike | None, clock: LocalClock | None, now: float,
             weak: bool, check_since: Callable[[str, Timestamp], None] = lambda producer, since: None) -> None:
        """Register ``producer`` (see ``CompositionEngine.join``; its arguments are checked there);
        ``check_since(producer, since)`` refuses a ``since`` the engine cannot take (before anything changes)."""
        existing = self.producers.get(producer)
        if existing is not None and existing.state is Membership.JOINED:
            raise MembershipError(f"producer {producer} has already joined engine {self.name}")
        try:
            stamp = None if since is None else as_timestamp(since)
        except (TypeError, ValueError) as error:
            raise MembershipError(f"producer {producer}: since={since!r} is not a time ({error}); give a number of "
                                  f"seconds, an aware datetime or a Timestamp") from None
        if stamp is not None:
            check_since(producer, stamp)
        start = None if stamp is None else stamp.interval.lower
        if start is not None:
            for event_type in () if weak else types:
                relied = self.relied.get(event_type)
                if relied is not None and not earlier(relied, start):
                    raise MembershipError(
                        f"producer {producer} joins too late: compositions of {event_type} already relied on no "
                        f"event before {relied!r} being in transit, and it may send events from {start!r} on; join "
                        f"producers before they send (atomic membership), or give since= later than {relied!r}")
        state = Producer(producer, types, start, clock, now, weak=weak)
        self.producers[producer] = state
        for event_type in types:
            self.by_type.setdefault(event_type, []).append(state)

    def carry_membership(self, snapshot: MembersSnapshot) -> None:
        """Make ``snapshot`` hold the membership as it is now — who joined, who left — keeping each producer's
        progress as the snapshot saved it: called right after a ``join`` or ``leave``, which are no part of a batch,
        so that the abort of a batch's transaction restoring ``snapshot`` does not undo them."""
        saved = snapshot["producers"]
        for name, state in self.producers.items():
            entry = saved.get(name)
            if entry is None or entry[0] is not state:      # joined (or joined again) since: as it joined
                saved[name] = (state, state.sync, state.latest_local, state.state, state.events, state.heartbeats,
                               state.last_seen)
            elif entry[3] is not state.state:               # left since
                saved[name] = (*entry[:3], state.state, *entry[4:])
        snapshot["by_type"] = {key: list(value) for key, value in self.by_type.items()}

    def leave(self, state: Producer) -> None:
        """``state`` no longer holds compositions back (it left, or was excluded after a timeout)."""
        state.state = Membership.LEFT
        for event_type in state.types:
            self.by_type[event_type] = [other for other in self.by_type[event_type] if other is not state]

    def member(self, producer: str | None) -> Producer:
        """The joined producer ``producer``; raises ``MembershipError`` saying how to join it."""
        state = self.producers.get(producer) if producer is not None else None
        if state is None:
            raise MembershipError(f"producer {producer!r} has not joined engine {self.name} (known: "
                                  f"{', '.join(sorted(self.producers)) or 'none'}); call engine.join(producer, "
                                  f"types=[…]) before it sends (atomic membership)")
        if state.state is Membership.LEFT:
            raise MembershipError(f"producer {producer} has left engine {self.name}; join it again to send more")
        return state

    def info(self, now: float) -> dict[str, ProducerInfo]:
        return {name: ProducerInfo(name, tuple(sorted(state.types)), state.sync, state.latest_local,
                                   state.state.value, state.events, state.heartbeats, now - state.last_seen,
                                   MembershipKind.WEAK if state.weak else MembershipKind.ATOMIC)
                for name, state in self.producers.items()}

    def blocking(self, stamps: list[Timestamp], event_type: str) -> frozenset[str]:
        """The producers of ``event_type`` that may still send an event the candidates ``stamps`` do not
        certainly precede (empty: the candidate set is stable)."""
        return frozenset(producer.name for producer in self.by_type.get(event_type, ()) if not producer.covers(stamps))

    def rely(self, event_type: str, value: Instant) -> None:
        """A decision about ``event_type`` relied on no event before ``value`` being in transit."""
        current = self.relied.get(event_type)
        if current is None or earlier(current, value):
            self.relied[event_type] = value

    def syncs(self, types: Iterable[str]) -> list[Instant] | None:
        """The sync-points of the producers of ``types`` (None if one of them is unknown yet)."""
        syncs = []
        for event_type in set(types):
            for producer in self.by_type.get(event_type, ()):
                if producer.sync is None:
                    return None
                syncs.append(producer.sync)
        return syncs

    def snapshot(self) -> MembersSnapshot:
        return {"producers": {name: (state, state.sync, state.latest_local, state.state, state.events,
                                     state.heartbeats, state.last_seen) for name, state in self.producers.items()},
                "by_type": {key: list(value) for key, value in self.by_type.items()},
                "relied": dict(self.relied)}

    def restore(self, snapshot: MembersSnapshot) -> None:
        self.producers = {}
        for name, (state, sync, local, membership, events, heartbeats, seen) in snapshot["producers"].items():
            state.sync, state.latest_local, state.state = sync, local, membership
            state.events, state.heartbeats, state.last_seen = events, heartbeats, seen
            self.producers[name] = state
        self.by_type = snapshot["by_type"]
        self.relied = snapshot["relied"]
