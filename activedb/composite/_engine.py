"""The composition engine: producers and their progress, the nodes of every query, and the outside world
(transactions, rules, the window a picture is drawn from).

Thread-safety: ``_mutex`` protects every field below it (producers, nodes, the outbox, statistics, the
window).  Lock order: ``_mutex`` is taken alone — the engine calls no other lock of ours while holding
it, and it is released before ``tx.emit`` runs rules.  The ``on_uncertain`` callback runs under
``_mutex`` (a decision is part of one evaluation step); the callback must not call back into the engine
(doing so raises ``CompositeError`` instead of deadlocking).
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

from activedb.txn import CommitParticipant
from activedb.composite._clock import MonotonicClock
from activedb.composite._model import (
    Choice,
    CompositeEvent,
    Heartbeat,
    Invalidation,
    Uncertainty,
    describe_event,
)
from activedb.composite._node import Node
from activedb.composite._polist import Item, Membership, POList, Producer
from activedb.composite.errors import (
    CompositeError,
    EventRejected,
    LateEvent,
    MembershipError,
    ProducerTimeout,
    UncertainOrder,
)
from activedb.events import EventSpec, EventKind, LocalClock, Timestamp, as_timestamp, hull, precedes
from activedb.streams import CompiledQuery, Ctx, StreamEvent, StreamSchema, algebra as ast, compile_query, parse
from activedb.streams import query_definition
from activedb.streams.errors import DefinitionError

DEFAULT_TIMEOUT = 30.0


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
    sync: Any
    latest_local: Any
    state: str
    events: int
    heartbeats: int
    silent_for: float
    membership: str = "atomic"        # "atomic" | "weak"


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


@dataclass(frozen=True)
class WindowEntry:
    """One thing that arrived (an event or a heartbeat), for the picture."""

    kind: str                         # "event" | "heartbeat"
    producer: str
    type: str | None
    ts: Timestamp
    sync_after: Any                   # the producer's sync-point after it
    arrival: float                    # system time
    label: str


@dataclass(frozen=True)
class Window:
    """A window of the engine's history: per producer the intervals of its events and heartbeats, the
    sync-points, and the composite events chosen (see ``activedb.composite.plot``)."""

    entries: tuple[WindowEntry, ...]
    composites: tuple[CompositeEvent, ...]
    sync_points: Mapping[str, Any]
    producers: Mapping[str, tuple[str, ...]]
    uncertainties: tuple[Uncertainty, ...] = ()


class _Participant(CommitParticipant):
    """Restores the engine's state if the transaction a batch ran in aborts (a CommitParticipant)."""

    def __init__(self, engine: "CompositionEngine", snapshot: dict):
        self.engine = engine
        self.snapshot = snapshot

    def committed(self, transaction: Any) -> None:
        self.engine._forget_snapshot(self)

    def aborted(self, transaction: Any, error: BaseException | None) -> None:
        self.engine._restore(self)


class CompositionEngine:
    """Composite events from many producers under the accuracy-interval time model.

    * ``db`` — optional: needed only to run rules on composite events (``process(tx, …)``);
    * ``name`` — names the engine (composite events' producer is ``"<query>"``);
    * ``clock`` — system time for timeouts (default ``MonotonicClock``; tests pass a ``ManualClock``);
    * ``timeout`` — seconds an input node waits for a silent producer it is blocked on before
      ``on_timeout`` applies (None: wait forever — not recommended);
    * ``on_uncertain`` — ``callback(uncertainty) -> Choice | event | None``; None (default) raises
      :class:`UncertainOrder`;
    * ``window`` — how many arrivals and composites to keep for ``window()`` / the picture (and for
      weak membership's invalidation check);
    * ``on_invalidation`` — ``callback(invalidation)``, called after the call that took the event (outside
      the engine's mutex) with every :class:`~activedb.composite.Invalidation`; all are also recorded
      (``invalidations()``).

    Membership (the paper's §IV) is **atomic** by default: a producer joins (``join``) before it sends,
    with the event types it produces; events of unknown producers are refused.  ``join(…,
    membership="weak")`` admits a producer discovered late at once; compositions its old events would
    have changed are reported afterwards (``on_invalidation``).  See the README.
    """

    def __init__(self, db: Any = None, *, name: str = "composite", clock: Any = None,
                 timeout: float | None = DEFAULT_TIMEOUT, on_timeout: TimeoutPolicy | str = TimeoutPolicy.RAISE,
                 on_uncertain: Callable[[Uncertainty], Any] | None = None, window: int = 2000,
                 on_invalidation: Callable[[Invalidation], Any] | None = None):
        if not isinstance(name, str) or not name.strip():
            raise CompositeError("a CompositionEngine needs a non-empty name")
        if timeout is not None and not timeout > 0:
            raise CompositeError(f"timeout must be a positive number of seconds or None, got {timeout!r}")
        self.db = db
        self.name = name
        self.clock = clock or MonotonicClock()
        self.timeout = timeout
        self.on_timeout = TimeoutPolicy(on_timeout)
        self.on_uncertain = on_uncertain
        self.on_invalidation = on_invalidation
        self._mutex = threading.Lock()
        self._owner: int | None = None                            # thread holding _mutex (re-entry check)
        self._streams: dict[str, StreamSchema] = {}
        self._queries: dict[str, CompiledQuery] = {}
        self._by_type: dict[str, list[tuple[CompiledQuery, tuple[int, ...]]]] = {}
        self._producers: dict[str, Producer] = {}
        self._by_producer_type: dict[str, list[Producer]] = {}
        self._nodes: dict[tuple[str, tuple], Node] = {}
        self._blocked: set[tuple[str, tuple]] = set()
        # Invariant: every decision about type T relied on no event of T with lower bound <= _relied[T]
        # still being in transit.
        self._relied: dict[str, Any] = {}
        self._numbers = 0
        self._outbox: list[CompositeEvent] = []
        self._raised: list[UncertainOrder] = []              # uncertainties met during the current call
        self._participant: _Participant | None = None
        self._counts = collections.Counter()
        self._window_size = window
        self._entries: collections.deque[WindowEntry] = collections.deque(maxlen=window)
        self._composites: collections.deque[CompositeEvent] = collections.deque(maxlen=window)
        self._uncertainties: collections.deque[Uncertainty] = collections.deque(maxlen=window)
        self._invalidations: list[Invalidation] = []          # the record (weak membership)
        self._notices: list[Invalidation] = []                # not yet handed to on_invalidation

    # --- definitions ------------------------------------------------------------------------------

    def create_stream(self, name: str, *, types: Sequence[str] | None = None, attributes: Sequence[str] = (),
                      type_attributes: Mapping[str, Sequence[str]] | None = None) -> StreamSchema:
        """Declare the event types and attributes queries may name (as ``StreamEngine.create_stream``)."""
        schema = StreamSchema(name=name, types=tuple(types) if types is not None else None,
                              attributes=tuple(attributes),
                              type_attributes={key: tuple(value) for key, value in (type_attributes or {}).items()})
        with self._locked():
            if name in self._streams:
                raise DefinitionError(f"stream {name!r} is already declared")
            self._streams[name] = schema
        return schema

    def define(self, text: str) -> list[CompiledQuery]:
        """Define every ``CREATE QUERY`` of ``text`` (``PATTERN AND(A, B)`` or ``SEQ(A, B)``,
        ``CONSUMING CHRONICLE|RECENT``)."""
        compiled = []
        for definition in parse(text):
            if not isinstance(definition, ast.QueryDefinition):
                raise DefinitionError(f"a composition engine has queries only; rules on composite events are "
                                      f"activedb rules: @db.rule(on=engine.spec({definition.query!r}))")
            compiled.append(self.create_query(definition))
        return compiled

    def query(self, name: str, *, pattern: Any, returns: Any = (), where: Any = None, stream: str | None = None,
              consumption: ast.Consumption | str = ast.Consumption.CHRONICLE) -> CompiledQuery:
        """Define a query in Python: ``pattern=streams.conj("A", "B")`` or ``streams.seq("A", "B")``."""
        return self.create_query(query_definition(name, pattern=pattern, returns=returns, where=where,
                                                  stream=stream, consumption=consumption))

    def create_query(self, definition: ast.QueryDefinition) -> CompiledQuery:
        if definition.consumption is None:
            definition = dataclasses.replace(definition, consumption=ast.Consumption.CHRONICLE)
        with self._locked():
            if not self._streams:
                raise DefinitionError(f"engine {self.name} has no stream; declare its types with "
                                      f"engine.create_stream(name, types=[…], attributes=[…])")
            if any(name.casefold() == definition.name.casefold() for name in self._queries):
                raise DefinitionError(f"query {definition.name} is already defined")
            compiled = compile_query(definition, self._streams, _NoStore())
            _check_composable(compiled)
            self._queries[compiled.name] = compiled
            ranks: dict[str, list[int]] = {}
            for rank, index in enumerate(compiled.positives):
                ranks.setdefault(compiled.types[index], []).append(rank)
            for event_type, positions in ranks.items():
                self._by_type.setdefault(event_type, []).append((compiled, tuple(positions)))
        return compiled

    @property
    def queries(self) -> dict[str, CompiledQuery]:
        with self._locked():
            return dict(self._queries)

    def spec(self, query: str) -> EventSpec:
        """The rule event spec of ``query``'s composite events: ``@db.rule(on=engine.spec("AB"))``.
        Composite events reach rules as stream events (``tx.emit``) whose ``ts`` is the composite's
        interval :class:`~activedb.events.Timestamp` and whose payload is ``CompositeEvent.payload()``."""
        with self._locked():
            if query not in self._queries:
                raise DefinitionError(f"no query {query!r} in engine {self.name}")
        return EventSpec(EventKind.STREAM, query)

    # --- membership ---------------------------------------------------------------------------------

    def join(self, producer: str, *, types: Iterable[str], since: Any = None,
             clock: LocalClock | None = None, membership: str = "atomic") -> None:
        """Register ``producer`` for ``types``.

        ``membership="atomic"`` (default): before it sends.  ``since`` promises that none of its events
        will have a lower bound below it; it must be after every instant compositions already relied on.
        Without it the producer's sync-point is unknown until its first event or heartbeat, and
        compositions of its types wait for that.

        ``membership="weak"``: a producer discovered late is admitted at once, whatever compositions
        already relied on.  Its events are taken like any other's; one that arrives after decisions
        relied on its absence (an *old* event) is checked against the compositions already produced, and
        those it would have changed are reported: an :class:`~activedb.composite.Invalidation` to
        ``on_invalidation`` and in ``invalidations()``."""
        if membership not in ("atomic", "weak"):
            raise MembershipError(f"membership is 'atomic' (join before sending) or 'weak' (admitted late, "
                                  f"invalidated compositions reported), got {membership!r}")
        weak = membership == "weak"
        types = frozenset(types)
        if not producer or not isinstance(producer, str):
            raise MembershipError(f"a producer is a non-empty string, got {producer!r}")
        if not types:
            raise MembershipError(f"producer {producer} must name the event types it produces")
        with self._locked():
            existing = self._producers.get(producer)
            if existing is not None and existing.state is Membership.JOINED:
                raise MembershipError(f"producer {producer} has already joined engine {self.name}")
            if since is not None:
                since = as_timestamp(since).interval.lower
                for event_type in () if weak else types:
                    relied = self._relied.get(event_type)
                    if relied is not None and not relied < since:
                        raise MembershipError(
                            f"producer {producer} joins too late: compositions of {event_type} already relied on no "
                            f"event before {relied!r} being in transit, and it may send events from {since!r} on; "
                            f"join producers before they send (atomic membership), or give since= later than "
                            f"{relied!r}")
            state = Producer(producer, types, since, clock, self.clock.now(), weak=weak)
            self._producers[producer] = state
            for event_type in types:
                self._by_producer_type.setdefault(event_type, []).append(state)

    def leave(self, producer: str) -> list[CompositeEvent]:
        """``producer`` has sent everything (its channel is FIFO, so everything it sent has arrived): it
        no longer holds compositions back.  Returns composites this made possible."""
        with self._locked():
            state = self._member(producer)
            state.state = Membership.LEFT
            for event_type in state.types:
                self._by_producer_type[event_type] = [other for other in self._by_producer_type[event_type]
                                                      if other is not state]
            self._wake(state.types)
        return self._finish()

    def producers(self) -> dict[str, ProducerInfo]:
        with self._locked():
            now = self.clock.now()
            return {name: ProducerInfo(name, tuple(sorted(state.types)), state.sync, state.latest_local,
                                       state.state.value, state.events, state.heartbeats, now - state.last_seen,
                                       "weak" if state.weak else "atomic")
                    for name, state in self._producers.items()}

    def _member(self, producer: str | None) -> Producer:
        state = self._producers.get(producer) if producer is not None else None
        if state is None:
            raise MembershipError(f"producer {producer!r} has not joined engine {self.name} (known: "
                                  f"{', '.join(sorted(self._producers)) or 'none'}); call engine.join(producer, "
                                  f"types=[…]) before it sends (atomic membership)")
        if state.state is Membership.LEFT:
            raise MembershipError(f"producer {producer} has left engine {self.name}; join it again to send more")
        return state

    # --- input ------------------------------------------------------------------------------------------

    def signal(self, event: StreamEvent | Heartbeat) -> list[CompositeEvent]:
        """Take one event (its ``ts`` a :class:`Timestamp` naming its producer, or a number/datetime with
        ``attributes['producer']``) or a :class:`Heartbeat`; return the composite events it made possible."""
        with self._locked():
            self._take(event)
        return self._finish()

    def heartbeat(self, producer: str, ts: Any) -> list[CompositeEvent]:
        """``producer`` is alive and will send nothing with a lower bound below ``lower(ts)``."""
        return self.signal(Heartbeat(producer, ts))

    def submit(self, items: Iterable[StreamEvent | Heartbeat]) -> list[CompositeEvent]:
        """Signal every item in the order given (each producer's items in its order)."""
        with self._locked():
            for item in items:
                self._take(item)
        return self._finish()

    def process(self, tx: Any, items: Iterable[StreamEvent | Heartbeat]) -> list[CompositeEvent]:
        """``submit`` within transaction ``tx``: every composite event is emitted into ``tx`` (rules on
        ``engine.spec(query)`` fire), and if ``tx``'s top-level transaction aborts, the engine's state
        returns to what it was before the first batch of that transaction."""
        with self._locked():
            root = tx.root
            if self._participant is None or self._participant.snapshot.get("root") is not root:
                snapshot = self._snapshot()
                snapshot["root"] = root
                participant = _Participant(self, snapshot)
                self._participant = participant
                root.enlist(participant)
            for item in items:
                self._take(item)
        with self._locked():
            composites, self._outbox = self._outbox, []
        for composite in composites:
            tx.emit(composite.query, key=composite.partition or None, ts=composite.ts, payload=composite.payload())
        self._notify()
        self._raise_uncertain()
        self._check_timeouts()
        return composites

    def poll(self) -> list[CompositeEvent]:
        """Check the input nodes' timeouts (raises :class:`ProducerTimeout`, or excludes silent producers
        under ``TimeoutPolicy.EXCLUDE``); returns composites that became possible."""
        return self._finish()

    def take_outputs(self) -> list[CompositeEvent]:
        """Composite events produced before an error interrupted the call that produced them."""
        with self._locked():
            outputs, self._outbox = self._outbox, []
        return outputs

    def discard(self, event: StreamEvent) -> list[CompositeEvent]:
        """Remove ``event`` from every list (e.g. after ``UncertainOrder``, as the application decides)."""
        with self._locked():
            found = False
            for node in self._nodes.values():
                doomed = [item for item in node.items() if item.event == event]
                if doomed:
                    found = True
                    node.remove(doomed)
                    self._counts["dropped"] += len(doomed)
                    self._wake_node(node)
            if not found:
                raise CompositeError(f"{describe_event(event)} is in no list of engine {self.name}")
        return self._finish()

    # --- inside: taking an input ---------------------------------------------------------------------

    def _take(self, raw: Any) -> None:
        """Precondition: the caller holds ``_mutex``."""
        if isinstance(raw, Heartbeat):
            self._take_heartbeat(raw)
            return
        if isinstance(raw, Mapping):
            raw = StreamEvent(raw.get("type"), raw.get("ts"), dict(raw.get("attributes", {})), raw.get("stream"))
        if not isinstance(raw, StreamEvent):
            raise EventRejected(f"engine {self.name} takes StreamEvent or Heartbeat objects, got {raw!r}")
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
        producer = self._member(ts.producer)
        if raw.type not in producer.types:
            raise EventRejected(f"producer {producer.name} joined for {', '.join(sorted(producer.types))}, not "
                                f"{raw.type}; join it with every type it produces")
        event = raw if raw.ts is ts else dataclasses.replace(raw, ts=ts)
        now = self.clock.now()
        old = self._check_late(producer, ts, event.type, f"event {describe_event(event)}")
        producer.last_seen = now
        producer.events += 1
        self._counts["events"] += 1
        moved = producer.advance(ts)
        self._numbers += 1
        item = Item(event, ts, self._numbers)
        self._entries.append(WindowEntry("event", producer.name, event.type, ts, producer.sync, now,
                                         describe_event(event)))
        touched = []
        entered: dict[tuple[str, tuple], list[int]] = {}
        for query, ranks in self._by_type.get(event.type, ()):
            ctx = Ctx([None] * len(query.types))
            accepted = []
            for rank in ranks:
                index = query.positives[rank]
                ctx.events[index] = event
                if all(check(ctx) is True for check in query.local.get(index, ())):
                    accepted.append(rank)
                ctx.events[index] = None
            if not accepted:
                continue
            partition = tuple(dict(event.attributes).get(attribute) for attribute in query.partition)
            key = (query.name, partition)
            node = self._nodes.get(key)
            if node is None:
                node = self._nodes[key] = Node(query, partition)
            for rank in accepted:
                node.lists[rank].append(item)
            touched.append(node)
            entered[key] = accepted
        if old:
            self._invalidate(producer, event, entered)
        for node in touched:
            self._evaluate(node)
        if moved:
            self._wake(producer.types, skip=touched)

    def _invalidate(self, producer: Producer, event: StreamEvent, entered: dict[tuple[str, tuple], list[int]]
                    ) -> None:
        """Weak membership: the compositions already produced (of the nodes ``event`` entered, with the
        components it entered: ``entered``) that ``event`` would have changed, recorded and queued for
        ``on_invalidation``.  A composition is changed if, for a component the event entered, the event does not certainly come after
        (chronicle: the oldest is taken) or before (recent: the newest is taken) that component's
        constituent, and — under SEQ — could stand between its neighbours' constituents."""
        changed = []
        for composite in self._composites:
            ranks = entered.get((composite.query, composite.partition))
            if ranks and any(self._would_change(composite, rank, event.ts) for rank in ranks):
                changed.append(composite)
        if changed:
            notice = Invalidation(producer.name, event, tuple(changed), self._relied.get(event.type))
            self._invalidations.append(notice)
            self._notices.append(notice)
            self._counts["invalidations"] += 1

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

    def invalidations(self) -> tuple[Invalidation, ...]:
        """Every invalidation notice so far (weak membership), oldest first."""
        with self._locked():
            return tuple(self._invalidations)

    def _take_heartbeat(self, heartbeat: Heartbeat) -> None:
        producer = self._member(heartbeat.producer)
        try:
            ts = as_timestamp(heartbeat.ts, producer.name)
        except (TypeError, ValueError) as error:
            raise EventRejected(f"heartbeat of {producer.name}: bad timestamp: {error}") from None
        now = self.clock.now()
        producer.last_seen = now
        producer.heartbeats += 1
        self._counts["heartbeats"] += 1
        for event_type in producer.types:
            self._check_late(producer, ts, event_type, f"heartbeat {ts} of {producer.name}", heartbeat=True)
        moved = producer.advance(ts)
        self._entries.append(WindowEntry("heartbeat", producer.name, None, ts, producer.sync, now,
                                         f"heartbeat {producer.name}"))
        if moved:
            self._wake(producer.types)

    def _check_late(self, producer: Producer, ts: Timestamp, event_type: str, what: str,
                    heartbeat: bool = False) -> bool:
        """An input below the producer's sync-point (or local reading) breaks its FIFO promise: accept it
        only if no decision about its type relied on its absence.  Returns True for an *old* event of a
        weak member: one that keeps its producer's FIFO promise but that decisions relied on the absence
        of (taken, and checked against the compositions already produced)."""
        lower = ts.interval.lower
        behind = producer.sync is not None and lower < producer.sync
        local_behind = (ts.local is not None and producer.latest_local is not None
                        and ts.local < producer.latest_local)
        if heartbeat:
            if producer.sync is None:
                behind = False
            if behind or local_behind:
                return False            # an old heartbeat says nothing new; sync-points never move back
        relied = self._relied.get(event_type)
        if producer.weak and not heartbeat and not (behind or local_behind):
            return relied is not None and not relied < lower
        if producer.sync is None and not heartbeat:
            if relied is not None and not relied < lower:
                self._counts["late_refused"] += 1
                raise LateEvent(f"{what} is the first of producer {producer.name}, which joined without since=, "
                                f"but compositions of {event_type} already relied on no event before {relied!r} "
                                f"being in transit; join producers with since= before they send (atomic membership), "
                                f"or join it with membership='weak' to be told which compositions it changes")
            return False
        if not (behind or local_behind):
            return False
        if local_behind or (relied is not None and not relied < lower):
            self._counts["late_refused"] += 1
            raise LateEvent(f"{what} arrived after its producer's sync-point {producer.sync!r} moved past it, and "
                            f"compositions of {event_type} already relied on no event before {relied!r} being in "
                            f"transit; a producer must send its events in detection order (FIFO) with "
                            f"non-decreasing lower bounds — send a heartbeat instead of an event from the past")
        self._counts["late_accepted"] += 1
        return False

    # --- inside: evaluation --------------------------------------------------------------------------

    def _evaluate(self, node: Node) -> None:
        key = (node.query.name, node.partition)
        try:
            node.evaluate(self)
        except UncertainOrder as error:
            # Raised at the end of the call (after every input of it was taken); the node keeps its
            # events and raises again whenever it is evaluated, until the application decides.
            if all(str(error) != str(other) for other in self._raised):
                self._raised.append(error)
            self._blocked.add(key)
            return
        if node.blocked_on:
            self._blocked.add(key)
        else:
            self._blocked.discard(key)
        if not node.size() and not node.blocked_on:
            self._nodes.pop(key, None)

    def _wake(self, types: Iterable[str], skip: Sequence[Node] = ()) -> None:
        types = set(types)
        for key in sorted(self._blocked, key=repr):
            node = self._nodes.get(key)
            if node is None or any(node is skipped for skipped in skip):
                continue
            if types & set(node.types):
                self._evaluate(node)

    def _wake_node(self, node: Node) -> None:
        self._evaluate(node)

    def _blocking(self, stamps: list[Timestamp], event_type: str) -> frozenset[str]:
        """The producers of ``event_type`` that may still send an event the candidates ``stamps`` do not
        certainly precede (empty: the candidate set is stable)."""
        return frozenset(producer.name for producer in self._by_producer_type.get(event_type, ())
                         if not producer.covers(stamps))

    def _rely(self, event_type: str, value: Any) -> None:
        current = self._relied.get(event_type)
        if current is None or current < value:
            self._relied[event_type] = value

    def _resolve(self, uncertainty: Uncertainty, candidates: list[Item]) -> tuple:
        self._counts["uncertainties"] += 1
        self._uncertainties.append(uncertainty)
        if self.on_uncertain is None:
            raise UncertainOrder(uncertainty)
        answer = self.on_uncertain(uncertainty)
        if answer is None:
            raise UncertainOrder(uncertainty)
        if isinstance(answer, StreamEvent):
            answer = Choice.use(answer)
        if not isinstance(answer, Choice):
            raise CompositeError(f"on_uncertain returned {answer!r}; return Choice.use(event), Choice.drop(*events), "
                                 f"one of the candidate events, or None to raise UncertainOrder")
        self._counts["decisions"] += 1
        if answer.use_event is not None:
            for item in candidates:
                if item.event == answer.use_event:
                    return ("use", item)
            raise CompositeError(f"on_uncertain chose {describe_event(answer.use_event)}, which is not one of the "
                                 f"candidates ({', '.join(describe_event(item.event) for item in candidates)})")
        dropped = []
        for event in answer.dropped:
            matches = [item for item in candidates if item.event == event]
            if not matches:
                raise CompositeError(f"on_uncertain dropped {describe_event(event)}, which is not a candidate")
            dropped.extend(matches)
        return ("drop", dropped)

    def _compose(self, node: Node, chosen: list[Item]) -> None:
        query = node.query
        events: list[Any] = [None] * len(query.types)
        for rank, item in enumerate(chosen):
            events[query.positives[rank]] = item.event
        ctx = Ctx(events)
        attributes = {name: function(ctx) for name, function in query.returns}
        composite = CompositeEvent(
            query=query.name, ts=hull([item.ts for item in chosen], producer=query.name), attributes=attributes,
            constituents=tuple(item.event for item in chosen), components=node.names, partition=node.partition,
            resolutions=tuple(node.pending_resolutions), consumption=query.definition.consumption.value,
            operator="AND" if node.conjunction else "SEQ", sts=self.clock.now())
        node.pending_resolutions.clear()
        node.decisions.clear()
        self._counts["composites"] += 1
        self._outbox.append(composite)
        self._composites.append(composite)

    def _dropped(self, node: Node, items: list[Item]) -> None:
        self._counts["dropped"] += len(items)
        node.decisions.clear()

    def _discarded(self, node: Node, items: list[Item]) -> None:
        self._counts["discarded"] += len(items)

    def _unmatched(self, node: Node, item: Item) -> None:
        self._counts["unmatched"] += 1

    # --- timeouts --------------------------------------------------------------------------------------

    def _check_timeouts(self) -> None:
        if self.timeout is None:
            return
        with self._locked():
            now = self.clock.now()
            waited: dict[str, list[str]] = {}
            for key in sorted(self._blocked, key=repr):
                node = self._nodes.get(key)
                if node is None:
                    continue
                for name in node.blocked_on:
                    producer = self._producers.get(name)
                    if producer is not None and producer.state is Membership.JOINED \
                            and now - producer.last_seen > self.timeout:
                        waited.setdefault(name, []).append(f"{key[0]}{'/' + repr(key[1]) if key[1] else ''}")
            if not waited:
                return
            silent = {name: now - self._producers[name].last_seen for name in waited}
            if self.on_timeout is TimeoutPolicy.EXCLUDE:
                for name in sorted(waited):
                    state = self._producers[name]
                    state.state = Membership.LEFT
                    for event_type in state.types:
                        self._by_producer_type[event_type] = [other for other in self._by_producer_type[event_type]
                                                              if other is not state]
                    self._counts["excluded"] += 1
                    self._wake(state.types)
                return
        details = "; ".join(f"{name} silent for {silent[name]:.3g} s, blocking {', '.join(sorted(set(nodes)))}"
                            for name, nodes in sorted(waited.items()))
        raise ProducerTimeout(
            f"engine {self.name}: input node timeout ({self.timeout} s): {details}. The producer sent neither "
            f"an event nor a heartbeat, so compositions that need its sync-point cannot become stable; make it "
            f"send heartbeats (engine.heartbeat(producer, ts) or heartbeat rows), engine.leave() it if it is gone, "
            f"or run the engine with on_timeout='exclude'", tuple(sorted(waited)), silent)

    # --- results, locking, snapshots -----------------------------------------------------------------------

    def _finish(self, raise_timeouts: bool = True) -> list[CompositeEvent]:
        """End a call: hand out the invalidation notices, raise the first uncertainty met (the others
        are in ``error.others``; the outputs made before stay for ``take_outputs()``), then the timeouts;
        else return the outputs."""
        self._notify()
        self._raise_uncertain()
        if raise_timeouts:
            self._check_timeouts()
        with self._locked():
            outputs, self._outbox = self._outbox, []
        return outputs

    def _notify(self) -> None:
        """Call ``on_invalidation`` with the notices queued by the call (outside ``_mutex``)."""
        with self._locked():
            notices, self._notices = self._notices, []
        if self.on_invalidation is not None:
            for notice in notices:
                self.on_invalidation(notice)

    def _raise_uncertain(self) -> None:
        with self._locked():
            raised, self._raised = self._raised, []
        if raised:
            first = raised[0]
            first.others = tuple(raised[1:])
            raise first

    def _locked(self):
        return _Holding(self)

    def _snapshot(self) -> dict:
        """Precondition: the caller holds ``_mutex``.  Items are shared (immutable but for the
        ``processed`` flag, which is saved separately)."""
        nodes = {}
        for key, node in self._nodes.items():
            nodes[key] = (node, [POList(items) for items in node.lists], dict(node.decisions), node.blocked_on,
                          list(node.pending_resolutions))
        processed = {item.number: item.processed for node in self._nodes.values() for item in node.items()}
        producers = {name: (state, state.sync, state.latest_local, state.state, state.events, state.heartbeats,
                            state.last_seen) for name, state in self._producers.items()}
        return {"nodes": nodes, "processed": processed, "producers": producers,
                "by_producer_type": {key: list(value) for key, value in self._by_producer_type.items()},
                "blocked": set(self._blocked), "relied": dict(self._relied),
                "counts": collections.Counter(self._counts),
                "numbers": self._numbers, "invalidations": list(self._invalidations)}

    def _restore(self, participant: _Participant) -> None:
        with self._locked():
            if self._participant is not participant:
                return
            snapshot = participant.snapshot
            self._nodes = {}
            items_by_number = {}
            for key, (node, lists, decisions, blocked_on, resolutions) in snapshot["nodes"].items():
                node.lists = lists
                node.decisions = decisions
                node.blocked_on = blocked_on
                node.pending_resolutions = resolutions
                self._nodes[key] = node
                for item in node.items():
                    items_by_number[item.number] = item
            for number, processed in snapshot["processed"].items():
                if number in items_by_number:
                    items_by_number[number].processed = processed
            self._producers = {}
            for name, (state, sync, local, membership, events, heartbeats, seen) in snapshot["producers"].items():
                state.sync, state.latest_local, state.state = sync, local, membership
                state.events, state.heartbeats, state.last_seen = events, heartbeats, seen
                self._producers[name] = state
            self._by_producer_type = snapshot["by_producer_type"]
            self._blocked = snapshot["blocked"]
            self._relied = snapshot["relied"]
            self._counts = snapshot["counts"]
            self._numbers = snapshot["numbers"]
            self._invalidations = snapshot["invalidations"]
            self._notices = []
            self._outbox = []
            self._participant = None

    def _forget_snapshot(self, participant: _Participant) -> None:
        with self._locked():
            if self._participant is participant:
                self._participant = None

    # --- inspection --------------------------------------------------------------------------------------

    def statistics(self) -> CompositeStatistics:
        with self._locked():
            counts = self._counts
            return CompositeStatistics(
                events=counts["events"], heartbeats=counts["heartbeats"], composites=counts["composites"],
                uncertainties=counts["uncertainties"], decisions=counts["decisions"], dropped=counts["dropped"],
                discarded=counts["discarded"], unmatched=counts["unmatched"],
                late_refused=counts["late_refused"], late_accepted=counts["late_accepted"],
                waiting=sum(node.size() for node in self._nodes.values()), blocked_nodes=len(self._blocked),
                invalidations=counts["invalidations"])

    def waiting(self) -> dict[tuple[str, tuple], dict[str, Any]]:
        """Per node that holds events: its lists (as events) and the producers it waits for."""
        with self._locked():
            return {key: {"lists": {name: [item.event for item in items] for name, items in
                                    zip(node.names, node.lists)},
                          "blocked_on": sorted(node.blocked_on)}
                    for key, node in self._nodes.items() if node.size() or node.blocked_on}

    def progress(self, query: str) -> Any:
        """A lower bound of the lower bound of every composite event ``query`` may still produce (None:
        unknown): what a consumer of these composites uses as this query's sync-point
        (``other.heartbeat(query, engine.progress(query))``)."""
        with self._locked():
            compiled = self._queries.get(query)
            if compiled is None:
                raise DefinitionError(f"no query {query!r} in engine {self.name}")
            bounds = []
            for key, node in self._nodes.items():
                if key[0] == query:
                    bounds.extend(item.ts.interval.lower for item in node.items())
            for event_type in set(compiled.types):
                for producer in self._by_producer_type.get(event_type, ()):
                    if producer.sync is None:
                        return None
                    bounds.append(producer.sync)
            return min(bounds) if bounds else None

    def window(self, last: int | None = None) -> Window:
        """The latest arrivals and composites (at most ``last`` arrivals), for ``activedb.composite.plot``."""
        with self._locked():
            entries = tuple(self._entries)[-last:] if last else tuple(self._entries)
            start = min((entry.ts.interval.lower for entry in entries), default=None)
            composites = tuple(composite for composite in self._composites
                               if start is None or not composite.ts.interval.upper < start)
            return Window(entries=entries, composites=composites,
                          sync_points={name: state.sync for name, state in self._producers.items()},
                          producers={name: tuple(sorted(state.types)) for name, state in self._producers.items()},
                          uncertainties=tuple(self._uncertainties))

    def __repr__(self) -> str:
        return f"<CompositionEngine {self.name}: {len(self._queries)} queries, {len(self._producers)} producers>"


class _Holding:
    """``with engine._locked():`` — takes ``_mutex``; a re-entrant call (the on_uncertain callback calling
    the engine) raises instead of deadlocking."""

    __slots__ = ("engine",)

    def __init__(self, engine: CompositionEngine):
        self.engine = engine

    def __enter__(self) -> None:
        engine = self.engine
        if engine._owner == threading.get_ident():
            raise CompositeError(f"engine {engine.name} was called from inside its own on_uncertain callback; "
                                 f"the callback only decides (return a Choice) — call the engine afterwards")
        engine._mutex.acquire()
        engine._owner = threading.get_ident()

    def __exit__(self, *exc_info: object) -> None:
        self.engine._owner = None
        self.engine._mutex.release()


class _NoStore:
    """The store catalog of a composition engine: composite queries do not read the store."""

    def table(self, name: str, position: Any = None):
        raise DefinitionError(f"composition queries cannot read the store (table {name!r}): a composite event is "
                              f"decided from events alone; read the store in a rule on the composite event",
                              line=position.line if position else None,
                              column=position.column if position else None)


def _check_composable(query: CompiledQuery) -> None:
    """What of the algebra the interval evaluator runs (see the README for why the rest does not)."""
    what = f"query {query.name}"
    if query.negatives:
        raise DefinitionError(f"{what}: negation (!E) is not composed under the interval time model yet: 'no E "
                              f"between a and b' needs every E producer stable up to b and is uncertain for any E "
                              f"overlapping a or b; express it as a rule on the composite event")
    if query.joint_backward or query.joint_forward:
        raise DefinitionError(f"{what}: conditions joining several events (other than [attr]) are not supported by "
                              f"composition, whose consumption picks the oldest/newest candidates regardless of "
                              f"such conditions; partition with [attr] or test them in a rule")
    if query.within is not None:
        raise DefinitionError(f"{what}: WITHIN is not supported by composition (a window over intervals is itself "
                              f"uncertain at its edges); test ts.upper − ts.lower in a rule on the composite event")
    if query.selection is not ast.Selection.SKIP_TILL_ANY_MATCH:
        raise DefinitionError(f"{what}: MATCHING is the point-time matcher's selection; composition uses "
                              f"CONSUMING CHRONICLE|RECENT")
