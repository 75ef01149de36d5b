"""The values the composition engine takes and gives: heartbeats, composite events, uncertainties and the
application's choices.  All immutable (safe to share between threads)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Hashable, Mapping, TypeAlias

from activedb.errors import BadArgument
from activedb.events import Instant, TimeLike, Timestamp
from activedb.streams import StreamEvent

#: A partition of a query: the values of its partition attributes, in order (``()``: the query is not partitioned).
Partition: TypeAlias = "tuple[Hashable, ...]"


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """A producer's promise: none of its events not yet received has a lower bound below
    ``lower(ts)`` (and, with a local reading, none was detected before ``ts.local``).  A heartbeat row
    in a stream, or ``engine.heartbeat(producer, ts)`` for producers fed directly."""

    producer: str
    ts: TimeLike


class UncertaintyKind(enum.Enum):
    """Why a composition could not go on without a decision.

    * ``MULTIPLE``: several candidates of one component are mutually uncertain (``|oldest()| > 1``,
      the paper's "exception (multiple a)"), so chronicle/recent cannot say which one to take;
    * ``UNORDERED``: the one candidate's order relative to the event it must follow (SEQ) or precede
      (recent) is uncertain (``a ⊥ b``) — the case the printed SEQ algorithm would compose silently."""

    MULTIPLE = "multiple"
    UNORDERED = "unordered"


@dataclass(frozen=True)
class Uncertainty:
    """One undecidable step of a composition: which query, partition and component, the candidates, and
    the constituents chosen so far (in component order)."""

    query: str
    partition: Partition
    component: str
    kind: UncertaintyKind
    candidates: tuple[StreamEvent, ...]
    chosen: tuple[StreamEvent, ...] = ()
    relative_to: StreamEvent | None = None

    def describe(self) -> str:
        names = ", ".join(describe_event(event) for event in self.candidates)
        where = f" (partition {self.partition!r})" if self.partition else ""
        if self.kind is UncertaintyKind.MULTIPLE:
            return (f"query {self.query}{where}: component {self.component} has {len(self.candidates)} candidates "
                    f"whose order is uncertain: {names}")
        return (f"query {self.query}{where}: the order of component {self.component}'s candidate {names} and "
                f"{describe_event(self.relative_to)} is uncertain (their accuracy intervals overlap or touch)")


@dataclass(slots=True, repr=False, eq=False)
class Choice:
    """What an ``on_uncertain`` callback returns: :meth:`use` one candidate, or :meth:`drop` candidates
    (they leave their lists without composing).  Returning a candidate event itself means ``use`` it;
    returning None declines (the engine raises :class:`~activedb.composite.errors.UncertainOrder`)."""

    use_event: StreamEvent | None = None
    dropped: tuple[StreamEvent, ...] = ()

    @classmethod
    def use(cls, event: StreamEvent) -> "Choice":
        return cls(use_event=event)

    @classmethod
    def drop(cls, *events: StreamEvent) -> "Choice":
        if not events:
            raise BadArgument("Choice.drop needs at least one candidate to drop; to decline, return None (the engine "
                              "then raises UncertainOrder)")
        return cls(dropped=tuple(events))

    def __repr__(self) -> str:
        if self.use_event is not None:
            return f"Choice.use({describe_event(self.use_event)})"
        return f"Choice.drop({', '.join(describe_event(event) for event in self.dropped)})"


@dataclass(frozen=True)
class Resolution:
    """An uncertainty and what the application decided (recorded with the composite event)."""

    uncertainty: Uncertainty
    chosen: StreamEvent | None
    dropped: tuple[StreamEvent, ...] = ()

    def describe(self) -> str:
        if self.chosen is not None:
            return f"{self.uncertainty.describe()} -> the application chose {describe_event(self.chosen)}"
        return (f"{self.uncertainty.describe()} -> the application dropped "
                f"{', '.join(describe_event(event) for event in self.dropped)}")


@dataclass(frozen=True)
class CompositeEvent:
    """A composite event: its query, the constituents (in component order, named by ``components``),
    its interval timestamp (the hull of the constituents': it began no earlier than the lowest bound and
    ended no later than the highest), the RETURN attributes, the partition (``[attr]`` values) and the
    application's decisions it rests on (``resolutions``, empty when the order was certain)."""

    query: str
    ts: Timestamp
    attributes: Mapping[str, Any]
    constituents: tuple[StreamEvent, ...]
    components: tuple[str, ...]
    partition: Partition = ()
    resolutions: tuple[Resolution, ...] = ()
    consumption: str = "chronicle"
    operator: str = "AND"
    sts: float | None = field(default=None, compare=False, repr=False)

    @property
    def type(self) -> str:
        return self.query

    def __getitem__(self, attribute: str) -> Any:
        return self.attributes[attribute]

    def payload(self) -> dict[str, object]:
        """What a rule on the composite event sees as ``event.payload``: the RETURN attributes, plus
        ``constituents`` (the events), ``components`` and ``resolutions``."""
        payload: dict[str, object] = dict(self.attributes)
        payload.setdefault("constituents", self.constituents)
        payload.setdefault("components", self.components)
        payload.setdefault("resolutions", self.resolutions)
        return payload

    def describe(self) -> str:
        parts = " & " if self.operator == "AND" else " ; "
        inner = parts.join(describe_event(event) for event in self.constituents)
        decided = f" (decided by the application: {len(self.resolutions)})" if self.resolutions else ""
        return f"{self.query}({inner}) {self.ts.interval}{decided}"

    def to_stream_event(self, stream: str | None = None) -> StreamEvent:
        """This composite as an input event of another composition (its producer is the query)."""
        return StreamEvent(self.query, self.ts, dict(self.attributes), stream=stream)


@dataclass(frozen=True)
class Invalidation:
    """Weak membership's notice (the paper's §IV): an event of a late-joining producer arrived after
    compositions were decided that relied on no such event being in transit, and it would have changed
    them — it is older than (chronicle) or possibly newer than (recent) a constituent of the same
    component, or its order against it is uncertain.  ``composites`` are those compositions (in the
    order they were produced); ``relied`` is the instant up to which decisions about the event's type
    relied on its absence.  The event itself was taken like any other."""

    producer: str
    event: StreamEvent
    composites: tuple[CompositeEvent, ...]
    relied: Instant | None

    def describe(self) -> str:
        shown = "; ".join(composite.describe() for composite in self.composites)
        return (f"{describe_event(self.event)} of {self.producer} (weak membership) arrived after decisions "
                f"relied on no {self.event.type} before {self.relied!r} being in transit; it would have changed "
                f"{len(self.composites)} composite(s): {shown}")


def describe_event(event: StreamEvent | None) -> str:
    if event is None:
        return "nothing"
    attributes = dict(event.attributes)
    key = f"#{attributes['id']}" if "id" in attributes else ""
    return f"{event.type}{key}{event.ts}"


def same_event(item: object, event: StreamEvent) -> bool:
    """``item`` (of a batch) is ``event`` as the engine holds it, whatever clock the engine gave its timestamp."""
    if not isinstance(item, StreamEvent):
        return False
    if item == event:
        return True
    return (isinstance(item.ts, Timestamp) and item.type == event.type
            and dict(item.attributes) == dict(event.attributes)
            and (item.ts.lower, item.ts.upper, item.ts.producer) == (event.ts.lower, event.ts.upper, event.ts.producer))
