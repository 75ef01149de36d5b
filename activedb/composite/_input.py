"""The input node of one composition engine (the paper's InputNode, §IV and §V.C; design note
``activedb/composite/README.md``).  Not thread-safe by itself: used under ``CompositionEngine._mutex``.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime as dt
from typing import Mapping, TypedDict

from activedb.clock import Clock
from activedb.composite._evaluation import Evaluation
from activedb.composite._members import Members
from activedb.composite._model import CompositeEvent, Heartbeat, Invalidation, Partition, describe_event
from activedb.composite._polist import Item, Producer
from activedb.composite._records import WindowEntry
from activedb.composite.errors import EventRejected, LateEvent, MembershipError
from activedb.events import Timestamp, as_timestamp, earlier, precedes
from activedb.store import holds_nan
from activedb.streams import CompiledQuery, Ctx, StreamEvent
from activedb.streams.errors import EvaluationError


class InputSnapshot(TypedDict):
    """What :meth:`InputNode.snapshot` saves."""

    numbers: int
    invalidations: list[Invalidation]
    datetimes: bool | None
    entries: list[WindowEntry]


class InputNode:
    """Takes the events and heartbeats of engine ``name``, checks them against their producer's membership
    and FIFO promise, and routes them into the lists of the nodes whose queries consume them."""

    def __init__(self, name: str, clock: Clock, counts: collections.Counter[str], members: Members,
                 evaluation: Evaluation, window: int):
        self.name = name
        self.clock = clock
        self.counts = counts
        self.members = members
        self.evaluation = evaluation
        self.by_type: dict[str, list[tuple[CompiledQuery, tuple[int, ...]]]] = {}
        self.numbers = 0
        self.entries: collections.deque[WindowEntry] = collections.deque(maxlen=window)
        self.invalidations: list[Invalidation] = []          # the record (weak membership)
        self.notices: list[Invalidation] = []                # not yet handed to on_invalidation
        # Invariant: every input taken has times of one kind — datetimes (True) or numbers of seconds (False); None
        # before the first.  An input of the other kind is refused before it changes anything.
        self.datetimes: bool | None = None

    def route(self, query: CompiledQuery) -> None:
        """Events of ``query``'s positive components' types go to its nodes from now on."""
        ranks: dict[str, list[int]] = {}
        for rank, index in enumerate(query.positives):
            ranks.setdefault(query.types[index], []).append(rank)
        for event_type, positions in ranks.items():
            self.by_type.setdefault(event_type, []).append((query, tuple(positions)))

    def unroute(self, query: CompiledQuery) -> None:
        """Undo :meth:`route` (a script that defined ``query`` was refused)."""
        for event_type in list(self.by_type):
            kept = [entry for entry in self.by_type[event_type] if entry[0] is not query]
            if kept:
                self.by_type[event_type] = kept
            else:
                del self.by_type[event_type]

    def take(self, raw: StreamEvent | Heartbeat | Mapping[str, object], *, refuse_unevaluable: bool = False) -> None:
        """Precondition: the caller holds the engine's mutex.  ``refuse_unevaluable``: an event a query's condition
        cannot be evaluated on is an ``EventRejected`` (a refusal: an ingestion's dead letter), not the
        ``EvaluationError`` itself; either way it changes nothing."""
        if isinstance(raw, Heartbeat):
            self._heartbeat(raw)
            return
        if isinstance(raw, Mapping):
            event_type, attributes, stream = raw.get("type"), raw.get("attributes", {}), raw.get("stream")
            if not isinstance(event_type, str) or not isinstance(attributes, Mapping) or \
                    not isinstance(stream, (str, type(None))):
                raise EventRejected(f"engine {self.name}: an event given as a mapping has a text 'type', a mapping "
                                    f"'attributes' and optionally a text 'stream', got {raw!r}")
            raw = StreamEvent(event_type, raw.get("ts"), dict(attributes), stream)
        if not isinstance(raw, StreamEvent):
            raise EventRejected(f"engine {self.name} takes StreamEvent or Heartbeat objects, got {raw!r}")
        if not isinstance(raw.attributes, Mapping):
            raise EventRejected(f"engine {self.name}: the attributes of event {raw.type} are a "
                                f"{type(raw.attributes).__name__}, not a mapping; give them as a dict")
        producer_name = raw.ts.producer if isinstance(raw.ts, Timestamp) else None
        if producer_name is None:
            producer_name = dict(raw.attributes).get("producer")
        try:
            ts = as_timestamp(raw.ts, producer_name)
        except (TypeError, ValueError) as error:
            raise EventRejected(f"{raw.type}: bad timestamp: {error}") from None
        if ts.producer is None:
            raise EventRejected(f"event {raw.type}{ts} names no producer; give it Timestamp(…, producer=…) "
                                f"(the engine orders and waits per producer)")
        self._check_kind(ts, f"event {raw.type}{ts}")
        producer = self.members.member(ts.producer)
        self._check_local_kind(producer, ts, f"event {raw.type}{ts}")
        if raw.type not in producer.types:
            raise EventRejected(f"producer {producer.name} joined for {', '.join(sorted(producer.types))}, not "
                                f"{raw.type}; join it with every type it produces")
        if ts.clock is None and producer.clock is not None:
            # (the local clock the producer joined with orders its events, as it decides their stability)
            ts = dataclasses.replace(ts, clock=producer.clock)
        event = raw if raw.ts is ts else dataclasses.replace(raw, ts=ts)
        # Which nodes it enters, found before anything changes: a filter that raises refuses the event whole.
        routes: list[tuple[CompiledQuery, Partition, list[int]]] = []
        for query, ranks in self.by_type.get(event.type, ()):
            ctx = Ctx([None] * len(query.types))
            accepted = []
            for rank in ranks:
                index = query.positives[rank]
                ctx.events[index] = event
                try:
                    passed = all(check(ctx) is True for check in query.local.get(index, ()))
                except EvaluationError as error:
                    why = (f"event {describe_event(event)}: the condition of query {query.name} cannot be evaluated "
                           f"on it ({error}); it changed nothing — correct the event, or the query's condition")
                    if not refuse_unevaluable:
                        raise EvaluationError(why) from error
                    raise EventRejected(why) from None
                if passed:
                    accepted.append(rank)
                ctx.events[index] = None
            if accepted:
                partition = tuple(dict(event.attributes).get(attribute) for attribute in query.partition)
                try:
                    hash(partition)
                except TypeError:
                    raise EventRejected(f"event {describe_event(event)}: query {query.name} is partitioned by "
                                        f"[{', '.join(query.partition)}], and {partition!r} cannot key a partition "
                                        f"(a list or a dict); give such attributes as texts, numbers or tuples"
                                        ) from None
                if holds_nan(partition):
                    # (A NaN equals nothing, itself included: a dict would tell two apart by the object alone.)
                    raise EventRejected(f"event {describe_event(event)}: query {query.name} is partitioned by "
                                        f"[{', '.join(query.partition)}], and {partition!r} cannot key a partition: a "
                                        f"NaN equals nothing, not even itself; give None for a missing value")
                routes.append((query, partition, accepted))
        now = self.clock.now()
        old = self._check_late(producer, ts, event.type, f"event {describe_event(event)}")
        self.datetimes = isinstance(ts.lower, dt.datetime)
        producer.last_seen = now
        producer.events += 1
        self.counts["events"] += 1
        moved = producer.advance(ts)
        self.numbers += 1
        item = Item(event, ts, self.numbers)
        self.entries.append(WindowEntry("event", producer.name, event.type, ts, producer.sync, now,
                                         describe_event(event)))
        touched = []
        entered: dict[tuple[str, Partition], list[int]] = {}
        for query, partition, accepted in routes:
            key = (query.name, partition)
            node = self.evaluation.node(query, partition)
            for rank in accepted:
                node.lists[rank].append(item)
            touched.append(node)
            entered[key] = accepted
        if old:
            self._invalidate(producer, event, entered)
        for node in touched:
            self.evaluation.evaluate(node)
        if moved:
            self.evaluation.wake(producer.types, skip=touched)

    def _invalidate(self, producer: Producer, event: StreamEvent, entered: dict[tuple[str, Partition], list[int]]) -> None:
        """Weak membership: the compositions already produced (of the nodes ``event`` entered, with the
        components it entered: ``entered``) that ``event`` would have changed (as the design note's
        "Membership: atomic and weak" defines it), recorded and queued for ``on_invalidation``."""
        changed = []
        for composite in self.evaluation.composites:
            ranks = entered.get((composite.query, composite.partition))
            if ranks and any(self._would_change(composite, rank, event.ts) for rank in ranks):
                changed.append(composite)
        if changed:
            notice = Invalidation(producer.name, event, tuple(changed), self.members.relied.get(event.type))
            self.invalidations.append(notice)
            self.notices.append(notice)
            self.counts["invalidations"] += 1

    @staticmethod
    def _would_change(composite: CompositeEvent, rank: int, ts: Timestamp) -> bool:
        constituents = composite.constituents
        own = constituents[rank].ts
        if composite.consumption == "recent":
            changed = not precedes(ts, own)          # possibly newer than the one recent consumption took
        else:
            changed = not precedes(own, ts)          # possibly older than the one chronicle took
        if changed and composite.operator == "SEQ":
            if rank > 0 and precedes(ts, constituents[rank - 1].ts):
                return False                         # it cannot follow the previous component's constituent
            if rank + 1 < len(constituents) and precedes(constituents[rank + 1].ts, ts):
                return False                         # nor precede the next one's
        return changed

    def _heartbeat(self, heartbeat: Heartbeat) -> None:
        producer = self.members.member(heartbeat.producer)
        try:
            ts = as_timestamp(heartbeat.ts, producer.name)
        except (TypeError, ValueError) as error:
            raise EventRejected(f"heartbeat of {producer.name}: bad timestamp: {error}") from None
        self._check_kind(ts, f"heartbeat of {producer.name}: {ts}")
        self._check_local_kind(producer, ts, f"heartbeat of {producer.name}: {ts}")
        now = self.clock.now()
        producer.last_seen = now
        producer.heartbeats += 1
        self.counts["heartbeats"] += 1
        for event_type in producer.types:
            self._check_late(producer, ts, event_type, f"heartbeat {ts} of {producer.name}", heartbeat=True)
        self.datetimes = isinstance(ts.lower, dt.datetime)
        moved = producer.advance(ts)
        self.entries.append(WindowEntry("heartbeat", producer.name, None, ts, producer.sync, now,
                                         f"heartbeat {producer.name}"))
        if moved:
            self.evaluation.wake(producer.types)

    def join_since(self, producer: str, since: Timestamp) -> None:
        """Refuse (``MembershipError``) a producer's ``since`` not of the kind of the engine's times; before any
        input, the first ``since`` sets the kind."""
        try:
            self._check_kind(since, f"producer {producer}: since={since}")
        except EventRejected as error:
            raise MembershipError(str(error)) from None
        if self.datetimes is None:
            self.datetimes = isinstance(since.lower, dt.datetime)

    def _check_kind(self, ts: Timestamp, what: str) -> None:
        """Refuse an input whose time is not of the kind of the inputs taken before (it could not be compared)."""
        datetimes = isinstance(ts.lower, dt.datetime)
        if self.datetimes is not None and datetimes != self.datetimes:
            kinds = ("a datetime", "numbers of seconds") if datetimes else ("a number of seconds", "aware datetimes")
            raise EventRejected(f"{what} is {kinds[0]}, but the times of engine {self.name} are {kinds[1]}; give "
                                f"every time of one kind")

    @staticmethod
    def _check_local_kind(producer: Producer, ts: Timestamp, what: str) -> None:
        """Refuse an input whose local clock reading is not of the kind of its producer's latest one (they are
        compared)."""
        latest = producer.latest_local
        if ts.local is not None and latest is not None and \
                isinstance(ts.local, dt.datetime) != isinstance(latest, dt.datetime):
            raise EventRejected(f"{what}: its local reading {ts.local!r} is not of the kind of producer "
                                f"{producer.name}'s earlier ones ({latest!r}); give its local readings of one kind")

    def _check_late(self, producer: Producer, ts: Timestamp, event_type: str, what: str,
                    heartbeat: bool = False) -> bool:
        """Refuse a late input as the design note's "Late inputs" says.  Returns True for an *old* event of
        a weak member (it keeps its FIFO promise, but decisions relied on its absence)."""
        lower = ts.interval.lower
        behind = producer.sync is not None and earlier(lower, producer.sync)
        local_behind = ts.local is not None and producer.latest_local is not None and \
            earlier(ts.local, producer.latest_local)
        if heartbeat:
            if producer.sync is None:
                behind = False
            if behind or local_behind:
                return False            # an old heartbeat says nothing new; sync-points never move back
        relied = self.members.relied.get(event_type)
        if producer.weak and not heartbeat and not (behind or local_behind):
            return relied is not None and not earlier(relied, lower)
        if producer.sync is None and not heartbeat:
            if relied is not None and not earlier(relied, lower):
                self.counts["late_refused"] += 1
                raise LateEvent(f"{what} is the first of producer {producer.name}, which joined without since=, "
                                f"but compositions of {event_type} already relied on no event before {relied!r} "
                                f"being in transit; join producers with since= before they send (atomic membership), "
                                f"or join it with membership='weak' to be told which compositions it changes")
            return False
        if not (behind or local_behind):
            return False
        if local_behind or (relied is not None and not earlier(relied, lower)):
            self.counts["late_refused"] += 1
            raise LateEvent(f"{what} arrived after its producer's sync-point {producer.sync!r} moved past it, and "
                            f"compositions of {event_type} already relied on no event before {relied!r} being in "
                            f"transit; a producer must send its events in detection order (FIFO) with "
                            f"non-decreasing lower bounds — send a heartbeat instead of an event from the past")
        self.counts["late_accepted"] += 1
        return False

    def snapshot(self) -> InputSnapshot:
        return {"numbers": self.numbers, "invalidations": list(self.invalidations), "datetimes": self.datetimes,
                "entries": list(self.entries)}

    def restore(self, snapshot: InputSnapshot) -> None:
        self.numbers = snapshot["numbers"]
        self.invalidations = snapshot["invalidations"]
        self.datetimes = snapshot["datetimes"]
        self.entries.clear()
        self.entries.extend(snapshot["entries"])
        self.notices = []
