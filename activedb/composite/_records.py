"""The composition engine's public records: the timeout policy, what it tells of producers and of
itself (statistics), and the window of its history a picture is drawn from.  Immutable values."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Mapping

from activedb.composite._model import CompositeEvent, Uncertainty
from activedb._closedset import ClosedSet
from activedb.events import Instant, Timestamp


class MembershipKind(ClosedSet):
    """How a producer joins a composition engine (the design note's "Membership: atomic and weak")."""

    ATOMIC = "atomic"      # before it sends; compositions wait for it
    WEAK = "weak"          # admitted at once; compositions its old events change are reported as invalidations


class TimeoutPolicy(enum.Enum):
    """What an input node does when a producer it waits for stays silent past the timeout.

    * ``RAISE`` (default): raise :class:`ProducerTimeout` at the consumer (the paper's choice);
    * ``EXCLUDE``: the producer leaves the membership (its later events are refused), composition goes on
      without it — only for applications that accept losing its late events."""

    RAISE = "raise"
    EXCLUDE = "exclude"


@dataclass(frozen=True)
class ProducerInfo:
    """What the engine knows of one producer (``engine.producers()``)."""

    name: str
    types: tuple[str, ...]
    sync: Instant | None
    latest_local: Instant | None
    state: str
    events: int
    heartbeats: int
    silent_for: float
    membership: MembershipKind = MembershipKind.ATOMIC


@dataclass(frozen=True)
class CompositeStatistics:
    """Counters of one engine (``engine.statistics()``)."""

    events: int
    heartbeats: int
    composites: int
    uncertainties: int
    decisions: int
    dropped: int
    discarded: int
    unmatched: int
    late_refused: int
    late_accepted: int
    waiting: int                     # events in the lists
    blocked_nodes: int               # nodes waiting for sync-points
    invalidations: int = 0           # weak membership's notices (engine.invalidations())
    excluded: int = 0                # producers excluded after a timeout (on_timeout=TimeoutPolicy.EXCLUDE)


@dataclass(frozen=True)
class WindowEntry:
    """One thing that arrived (an event or a heartbeat), for the picture."""

    kind: str                         # "event" | "heartbeat"
    producer: str
    type: str | None
    ts: Timestamp
    sync_after: Instant | None         # the producer's sync-point after it
    arrival: float                    # system time
    label: str


@dataclass(frozen=True)
class Window:
    """A window of the engine's history: per producer the intervals of its events and heartbeats, the
    sync-points, and the composite events chosen (see ``activedb.composite.plot``)."""

    entries: tuple[WindowEntry, ...]
    composites: tuple[CompositeEvent, ...]
    sync_points: Mapping[str, Instant | None]
    producers: Mapping[str, tuple[str, ...]]
    uncertainties: tuple[Uncertainty, ...] = ()
