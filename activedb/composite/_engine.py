"""The composition engine (:class:`CompositionEngine`): the public object, coordinating its
collaborators (design note ``activedb/composite/README.md``, "What it owns").

Thread-safety: ``_mutex`` protects every field below it and the collaborators' state (they do not
lock); a leaf, released before ``tx.emit`` runs rules.  What runs under it: the design note, "Threads and
mutexes".
"""

from __future__ import annotations

import collections
import dataclasses
import reprlib
import threading
from typing import TYPE_CHECKING, Callable, Iterable, Mapping, NoReturn, Sequence, TypedDict

from activedb.clock import SYSTEM_CLOCK, Clock, outdated_clock
from activedb.composite._evaluation import Evaluation
from activedb.composite._input import InputNode
from activedb.composite._members import Members
from activedb.composite._model import (Choice, CompositeEvent, Heartbeat, Invalidation, Partition, Uncertainty,
                                       describe_event, same_event)
from activedb.composite._polist import Membership
from activedb.composite._records import CompositeStatistics, MembershipKind, ProducerInfo, TimeoutPolicy, Window
from activedb.composite._rollback import Rollback
from activedb.composite.errors import (CompositeError, EventRejected, LateEvent, MembershipError, ProducerTimeout,
                                      UncertainOrder)
from activedb.errors import check_seconds, check_whole_number
from activedb.events import EventSpec, EventKind, Instant, LocalClock, TimeLike, Timestamp, as_timestamp, earlier
from activedb.streams import CompiledQuery, StreamEvent, StreamSchema, algebra as ast, compile_query, parse
from activedb.streams import PatternLike, Returns, query_definition
from activedb.streams.algebra import Position
from activedb.streams.errors import DefinitionError, EvaluationError, at

if TYPE_CHECKING:  # pragma: no cover
    from activedb._handle import DatabaseHandle
    from activedb.txn import Transaction

DEFAULT_TIMEOUT = 30.0


class Waiting(TypedDict):
    """One node's waiting state (``CompositionEngine.waiting()``): its lists, as events, and the producers
    whose sync-points it waits for."""

    lists: dict[str, list[StreamEvent]]
    blocked_on: list[str]


class CompositionEngine:
    """Composite events from many producers under the accuracy-interval time model.

    * ``db`` — optional: needed only to run rules on composite events (``process(tx, …)``);
    * ``name`` — names the engine (composite events' producer is ``"<query>"``);
    * ``clock`` — system time for timeouts and a composite's ``sts`` (an ``activedb.clock.Clock``; default the
      database's ``db.clock``, without a database the system's; tests pass a ``ManualClock``);
    * ``timeout`` — seconds an input node waits for a silent producer it is blocked on before
      ``on_timeout`` applies (None: wait forever — not recommended); an ingestion (``CompositeHandler``) refuses
      ``on_timeout=RAISE`` with a timeout: choose ``'exclude'`` or ``timeout=None`` there;
    * ``on_uncertain`` — ``callback(uncertainty) -> Choice | event | None``; None (default) raises
      :class:`UncertainOrder`;
    * ``window`` — how many arrivals and composites to keep for ``window()`` / the picture (and for
      weak membership's invalidation check);
    * ``on_invalidation`` — ``callback(invalidation)``, called after the call that took the event (outside
      the engine's mutex) with every :class:`~activedb.composite.Invalidation`; all are also recorded
      (``invalidations()``).

    Membership (the paper's §IV: atomic or weak) is per producer: see :meth:`join`.
    """

    def __init__(self, db: DatabaseHandle | None = None, *, name: str = "composite", clock: Clock | None = None,
                 timeout: float | None = DEFAULT_TIMEOUT, on_timeout: TimeoutPolicy | str = TimeoutPolicy.RAISE,
                 on_uncertain: Callable[[Uncertainty], Choice | StreamEvent | None] | None = None,
                 window: int = 2000, on_invalidation: Callable[[Invalidation], object] | None = None):
        if not isinstance(name, str) or not name.strip():
            raise CompositeError("a CompositionEngine needs a non-empty name")
        check_seconds("CompositionEngine", "timeout", timeout, none="wait forever", zero=False, error=CompositeError)
        check_whole_number("CompositionEngine", "window", window, 0,
                           " (how many arrivals and composites window() keeps)", error=CompositeError)
        outdated = outdated_clock(clock, "CompositionEngine(clock=...)")
        if outdated is not None:
            raise CompositeError(outdated)
        if clock is not None and (not isinstance(clock, Clock) or isinstance(clock, type)):
            raise CompositeError(f"clock is an activedb.clock.Clock (ManualClock() in tests) or None (the database's, "
                                 f"else the system's), got {clock!r}")
        for callback, what in ((on_uncertain, "on_uncertain"), (on_invalidation, "on_invalidation")):
            if callback is not None and not callable(callback):
                raise CompositeError(f"{what} is a function of one argument (or None), got {callback!r}")
        self.db = db
        self.name = name
        self.clock: Clock = clock if clock is not None else db.clock if db is not None else SYSTEM_CLOCK
        self.timeout = timeout
        try:
            self.on_timeout = TimeoutPolicy(on_timeout)
        except ValueError:
            raise CompositeError(f"on_timeout={on_timeout!r} is not a TimeoutPolicy: use one of "
                                 f"{', '.join(repr(policy.value) for policy in TimeoutPolicy)}") from None
        self.on_uncertain = on_uncertain
        self.on_invalidation = on_invalidation
        self._mutex = threading.Lock()
        self._owner: int | None = None                            # thread holding _mutex (re-entry check)
        self._guard = _Holding(self)                              # `with self._guard:` takes _mutex
        self._streams: dict[str, StreamSchema] = {}
        self._queries: dict[str, CompiledQuery] = {}
        self._counts: collections.Counter[str] = collections.Counter()  # shared by the collaborators
        self._members = Members(name, self._counts)
        self._evaluation = Evaluation(self._members, self.clock, self._counts, on_uncertain, window)
        self._input = InputNode(name, self.clock, self._counts, self._members, self._evaluation, window)
        self._rollback = Rollback(self._guard, self._members, self._evaluation, self._input, self._counts)

    # --- definitions ------------------------------------------------------------------------------

    def create_stream(self, name: str, *, types: Sequence[str] | None = None, attributes: Sequence[str] = (),
                      type_attributes: Mapping[str, Sequence[str]] | None = None) -> StreamSchema:
        """Declare the event types and attributes queries may name (as ``StreamEngine.create_stream``)."""
        schema = StreamSchema(name, types, attributes, type_attributes)  # type: ignore[arg-type]  # (made tuples)
        with self._guard:
            schema.check_new(self._streams)
            self._streams[name] = schema
        return schema

    def define(self, text: str) -> list[CompiledQuery]:
        """Define every ``CREATE QUERY`` of ``text`` (``PATTERN AND(A, B)`` or ``SEQ(A, B)``,
        ``CONSUMING CHRONICLE|RECENT``) — all of them, or none when one is refused."""
        definitions = parse(text)
        for definition in definitions:                  # (before anything is defined)
            if not isinstance(definition, ast.QueryDefinition):
                raise DefinitionError(f"a composition engine has queries only; rules on composite events are "
                                      f"activedb rules: @db.rule(on=engine.spec({definition.query!r}))")
        compiled: list[CompiledQuery] = []
        try:
            for definition in definitions:
                compiled.append(self.create_query(definition))      # type: ignore[arg-type]  # (checked above)
        except BaseException as error:
            with self._guard:                       # all or nothing: the script's queries defined so far go
                for query in compiled:
                    del self._queries[query.name]
                    self._input.unroute(query)
            if isinstance(error, DefinitionError) and (shown := error.shown_in(text)) is not error:
                raise shown from None               # (its line of the script shown, as StreamEngine.define does)
            raise
        return compiled

    def query(self, name: str, *, pattern: PatternLike, returns: Returns = (), where: object = None,
              stream: str | None = None,
              consumption: ast.Consumption = ast.Consumption.CHRONICLE) -> CompiledQuery:
        """Define a query in Python: ``pattern=streams.conj("A", "B")`` or ``streams.seq("A", "B")``."""
        return self.create_query(query_definition(name, pattern=pattern, returns=returns, where=where,
                                                  stream=stream, consumption=consumption))

    def create_query(self, definition: ast.QueryDefinition) -> CompiledQuery:
        if definition.consumption is None:
            definition = dataclasses.replace(definition, consumption=ast.Consumption.CHRONICLE)
        with self._guard:
            if not self._streams:
                raise DefinitionError(f"engine {self.name} has no stream; declare its types with "
                                      f"engine.create_stream(name, types=[…], attributes=[…])")
            if any(name.casefold() == definition.name.casefold() for name in self._queries):
                raise DefinitionError(f"query {definition.name} is already defined; give the new one another name",
                                      **at(definition))
            # _NoStore stands in for the store catalog (compile_query names the class, not a protocol)
            compiled = compile_query(definition, self._streams, _NoStore())  # type: ignore[arg-type]
            _check_composable(compiled)
            self._queries[compiled.name] = compiled
            self._input.route(compiled)
        return compiled

    @property
    def queries(self) -> dict[str, CompiledQuery]:
        with self._guard:
            return dict(self._queries)

    def spec(self, query: str) -> EventSpec:
        """The rule event spec of ``query``'s composite events: ``@db.rule(on=engine.spec("AB"))``.
        Composite events reach rules as stream events (``tx.emit``) whose ``ts`` is the composite's
        interval :class:`~activedb.events.Timestamp` and whose payload is ``CompositeEvent.payload()``."""
        with self._guard:
            compiled = self._query(query)
        return EventSpec(EventKind.STREAM, compiled.name)

    def _query(self, query: str) -> CompiledQuery:
        """``query`` as definitions find it (ignoring case).  Caller holds ``_mutex``."""
        compiled = self._queries.get(query)
        if compiled is None:
            folded = [found for name, found in self._queries.items() if name.casefold() == str(query).casefold()]
            if len(folded) != 1:
                raise DefinitionError(f"no query {query!r} in engine {self.name} (defined: "
                                      f"{', '.join(self._queries) or 'none'})")
            compiled = folded[0]
        return compiled

    # --- membership ---------------------------------------------------------------------------------

    def join(self, producer: str, *, types: Iterable[str], since: TimeLike | None = None,
             clock: LocalClock | None = None, membership: MembershipKind = MembershipKind.ATOMIC) -> None:
        """Register ``producer`` for ``types`` (the design note's "Membership: atomic and weak").

        ``MembershipKind.ATOMIC`` (default): before it sends; ``since`` promises that none of its events
        will have a lower bound below it and must be after every instant compositions already relied on
        (without it, compositions of its types wait for its first event or heartbeat).
        ``MembershipKind.WEAK``: admitted at once; compositions its old events would have changed are
        reported (:class:`~activedb.composite.Invalidation` to ``on_invalidation``, ``invalidations()``).
        ``clock``: the producer's :class:`~activedb.events.LocalClock`, how its local readings order its own events
        (and decide their stability) — for the timestamps that carry none."""
        if membership not in set(MembershipKind):
            raise MembershipError(f"membership is MembershipKind.ATOMIC ('atomic': join before sending) or "
                                  f"MembershipKind.WEAK ('weak': admitted late, invalidated compositions reported), "
                                  f"got {membership!r}")
        membership = MembershipKind(membership)
        if isinstance(types, str):
            raise MembershipError(f"types is a collection of event type names, got the text {types!r}: write "
                                  f"types=[{types!r}]")
        try:
            types = frozenset(types)
        except TypeError:
            raise MembershipError(f"types is a collection of event type names, got {types!r}: write "
                                  f"types=['A', …]") from None
        if not producer or not isinstance(producer, str):
            raise MembershipError(f"a producer is a non-empty string, got {producer!r}")
        if not types:
            raise MembershipError(f"producer {producer} must name the event types it produces")
        if clock is not None and not isinstance(clock, LocalClock):
            raise MembershipError(f"producer {producer}: clock is an activedb.events.LocalClock (how its local readings "
                                  f"order its own events) or None, got {clock!r}")
        with self._guard:
            # (An undeclared type is in no query: its events would be taken, counted, and composed never.)
            if all(schema.types is not None for schema in self._streams.values()):
                declared = {name for schema in self._streams.values() for name in schema.types or ()}
                unknown = sorted(types - declared)
                if unknown:
                    raise MembershipError(
                        f"producer {producer} joins for {', '.join(unknown)}, which no stream of engine {self.name} "
                        f"declares (declared: {', '.join(sorted(declared)) or 'none'}): correct the type's name, or "
                        f"declare it first with engine.create_stream(name, types=[…])")
            self._members.join(producer, types, since, clock, self.clock.now(), membership is MembershipKind.WEAK,
                               self._input.join_since)
            self._rollback.keep_membership()        # (no part of a batch: an open batch's abort keeps it)

    def leave(self, producer: str) -> list[CompositeEvent]:
        """``producer`` has sent everything (its channel is FIFO, so everything it sent has arrived): it
        no longer holds compositions back.  Returns composites this made possible."""
        with self._guard:
            state = self._members.member(producer)
            self._members.leave(state)
            self._rollback.keep_membership()        # (no part of a batch: an open batch's abort keeps it)
            self._evaluation.wake(state.types)
        return self._finish()

    def producers(self) -> dict[str, ProducerInfo]:
        with self._guard:
            return self._members.info(self.clock.now())

    # --- input ------------------------------------------------------------------------------------------

    def signal(self, event: StreamEvent | Heartbeat) -> list[CompositeEvent]:
        """Take one event (its ``ts`` a :class:`Timestamp` naming its producer, or a number/datetime with
        ``attributes['producer']``) or a :class:`Heartbeat`; return the composite events it made possible."""
        return self.submit([event])

    def heartbeat(self, producer: str, ts: TimeLike) -> list[CompositeEvent]:
        """``producer`` is alive and will send nothing with a lower bound below ``lower(ts)``."""
        return self.signal(Heartbeat(producer, ts))

    def submit(self, items: Iterable[StreamEvent | Heartbeat]) -> list[CompositeEvent]:
        """Signal every item in the order given (each producer's items in its order).  The first item refused
        (``EventRejected``, ``LateEvent``, ``MembershipError``, an ``EvaluationError``) stops the call: the items
        before it were taken, those after it were not, and the error (of the same class) says so, naming that item
        by its index and event."""
        _check_items(items)
        with self._guard:
            self._take_all(items, "submit")
        return self._finish()

    def process(self, tx: Transaction, items: Iterable[StreamEvent | Heartbeat]) -> list[CompositeEvent]:
        """``submit`` within transaction ``tx``: every composite event is emitted into ``tx`` (rules on
        ``engine.spec(query)`` fire), and if ``tx`` aborts (a subtransaction, or its top-level transaction), the
        engine's state returns to what it was before the first batch of that transaction's tree.  A refused item
        stops the call as in ``submit`` (abort ``tx`` to take back the items taken before it).  A rule on a composite
        that raises makes ``RuleFailed`` leave the call; the composites after that one were not emitted and stay for
        :meth:`take_outputs`."""
        _check_items(items)
        with self._guard:
            self._rollback.enlist(tx)
            self._take_all(items, "process")
        return self._finish(emit_into=tx)

    def _take_all(self, items: Iterable[StreamEvent | Heartbeat], call: str) -> None:
        """Take ``items`` in order; the first refused one raises its error again (the same class, chained) saying
        which item it was and how many were taken.  Caller holds ``_guard``."""
        take = self._input.take
        for index, item in enumerate(items):
            try:
                take(item)
            except (EventRejected, LateEvent, MembershipError, EvaluationError) as error:
                raise _stopped(error, index, item, call) from error

    def _process_refusing(self, tx: Transaction | None, items: Iterable[StreamEvent | Heartbeat],
                          emit: Callable[[CompositeEvent], object] | None = None) -> tuple[list[CompositeEvent], list[tuple[StreamEvent | Heartbeat, CompositeError]]]:
        """``process`` (``submit`` when ``tx`` is None) for an ingestion's batch: an input the engine refuses
        before it changes anything — ``LateEvent``, ``EventRejected`` (also for an event a query's condition cannot be
        evaluated on), ``MembershipError`` — is handed back with
        its error (to become a dead letter) instead of failing the whole batch, which a connector would deliver
        again, to be refused again, for ever.  The result is the one the batch without those inputs gives.  An event
        that completes a composition whose RETURN raises is handed back too (``Evaluation.refuse``), though it may
        have come in an earlier batch; the batch is then run again from the state before it as if without the event
        (come in an earlier batch, it leaves every list first), so that no other query composed it and replaying its
        letter gives it to every query once (the composition's other events stay).  So are
        the candidates of an uncertain order no ``on_uncertain`` callback decides (``Evaluation.resolve``): raised,
        the uncertainty failed the batch, whose abort restored the engine to meet it again on every delivery; refused,
        they leave every list (as ``discard`` does), so that replaying their letters feeds them once more.
        ``emit(composite)``: how each composite is emitted into ``tx`` (``feed_batch``: in a subtransaction of its
        own, a rule's failure a dead letter of its constituents)."""
        items = list(items)
        refused: list[tuple[StreamEvent | Heartbeat, CompositeError]] = []
        with self._guard:
            if tx is not None:
                self._rollback.enlist(tx)
            evaluation = self._evaluation
            before, outbox, raised = self._rollback.snapshot(), list(evaluation.outbox), list(evaluation.raised)
            excluded: list[tuple[StreamEvent, CompositeError]] = []     # events a RETURN refused, with their errors
            evaluation.refusing = True
            try:
                while True:
                    refused = list(excluded)
                    evaluation.discarding = [event for event, _ in excluded]    # (those of earlier batches)
                    self._discard_refused(refused)
                    for item in items:
                        if any(same_event(item, event) for event, _ in excluded):
                            continue
                        try:
                            self._input.take(item, refuse_unevaluable=True)
                        except (LateEvent, EventRejected, MembershipError) as error:
                            refused.append((item, error))
                        self._discard_refused(refused)
                    returned, evaluation.returned = evaluation.returned, []
                    if not returned:
                        break
                    # Run the batch again without them (each round excludes one event more: it ends).
                    excluded.extend((event, error) for event, error in refused if isinstance(event, StreamEvent)
                                    and isinstance(error, EventRejected) and any(event is other for other in returned))
                    self._rollback.put_back(before)
                    before = self._rollback.snapshot()
                    evaluation.outbox, evaluation.raised = list(outbox), list(raised)
            finally:
                evaluation.refusing = False
                evaluation.refused = []
                evaluation.discarding = []
                evaluation.returned = []
        return self._finish(emit_into=tx, emit=emit), refused

    def _discard_refused(self, refused: list[tuple[StreamEvent | Heartbeat, CompositeError]]) -> None:
        """Move the evaluation's refusals into ``refused`` (an arrival once: a row sent twice is two equal events,
        each its own dead letter), and take the refused candidates of
        uncertain orders out of every list, evaluating the nodes that held them (which may refuse more).  Caller
        holds ``_mutex``."""
        evaluation = self._evaluation
        while evaluation.refused or evaluation.discarding:
            for event, error in evaluation.refused:
                if not isinstance(error, UncertainOrder) or not any(
                        isinstance(earlier, UncertainOrder) and other is event for other, earlier in refused):
                    refused.append((event, error))
            evaluation.refused = []
            doomed_events, evaluation.discarding = evaluation.discarding, []
            evaluation.drop(lambda entry: entry.event in doomed_events)

    def poll(self) -> list[CompositeEvent]:
        """Check the input nodes' timeouts (raises :class:`ProducerTimeout`, or excludes silent producers
        under ``TimeoutPolicy.EXCLUDE``); returns composites that became possible."""
        return self._finish()

    def take_outputs(self) -> list[CompositeEvent]:
        """Composite events produced before an error interrupted the call that produced them."""
        with self._guard:
            return self._evaluation.take_outbox()

    def discard(self, event: StreamEvent) -> list[CompositeEvent]:
        """Remove ``event`` from every list it entered (e.g. after ``UncertainOrder``, as the application decides).
        One copy: of an event signalled twice (equal in type, time and attributes) the one that arrived first goes,
        the other stays."""
        if not isinstance(event, StreamEvent):
            raise CompositeError(f"discard() takes the StreamEvent as it was signalled (or the one an "
                                 f"UncertainOrder names), got {type(event).__name__} {reprlib.repr(event)}")
        if not isinstance(event.ts, Timestamp):      # signalled with a point ts: the lists hold it as take() made it
            try:
                event = dataclasses.replace(event, ts=as_timestamp(event.ts, dict(event.attributes).get("producer")))
            except (TypeError, ValueError):
                pass                                 # not a time: in no list (said below)
        with self._guard:
            # (One arrival is one Item, shared by every list it entered: its number names that copy.)
            numbers = [item.number for node in self._evaluation.nodes.values() for item in node.items()
                       if item.event == event]
            if not numbers:
                raise CompositeError(f"{describe_event(event)} is in no list of engine {self.name}: discard takes an "
                                     f"event the engine still holds (signalled, neither composed nor discarded "
                                     f"since), equal in type, time and attributes")
            first = min(numbers)
            self._evaluation.drop(lambda item: item.number == first)
        return self._finish()

    # --- the end of a call -------------------------------------------------------------------------------

    def _finish(self, emit_into: Transaction | None = None,
                emit: Callable[[CompositeEvent], object] | None = None) -> list[CompositeEvent]:
        """End a call: hand the outputs to ``emit_into`` (a transaction: every composite event is emitted
        into it first — by ``emit(composite)`` when given —; if one raises, those after it stay for
        ``take_outputs()``), hand out the invalidation notices (outside ``_mutex``), raise the first
        uncertainty met (the others are in ``error.others``; the outputs made before stay for
        ``take_outputs()`` unless emitted), then the timeouts; else return the outputs."""
        if emit_into is not None:
            with self._guard:
                outputs = self._evaluation.take_outbox()
            for index, composite in enumerate(outputs):
                try:
                    if emit is None:
                        emit_composite(emit_into, composite)
                    else:
                        emit(composite)
                except BaseException:
                    # (A rule raised: the composites after this one were not emitted — take_outputs() has them.)
                    with self._guard:
                        self._evaluation.outbox[:0] = outputs[index + 1:]
                    raise
        with self._guard:
            notices, self._input.notices = self._input.notices, []
        if self.on_invalidation is not None:
            for notice in notices:
                self.on_invalidation(notice)
        with self._guard:
            raised, self._evaluation.raised = self._evaluation.raised, []
        if raised:
            raised[0].others = tuple(raised[1:])
            raise raised[0]
        self._check_timeouts()
        if emit_into is not None:
            return outputs
        with self._guard:
            return self._evaluation.take_outbox()

    def _check_timeouts(self) -> None:
        if self.timeout is None:
            return
        with self._guard:
            now = self.clock.now()
            producers = self._members.producers
            waited: dict[str, list[str]] = {}
            for key, node in self._evaluation.blocked_nodes():
                for name in node.blocked_on:
                    producer = producers.get(name)
                    if producer is not None and producer.state is Membership.JOINED \
                            and now - producer.last_seen > self.timeout:
                        waited.setdefault(name, []).append(f"{key[0]}{'/' + repr(key[1]) if key[1] else ''}")
            if not waited:
                return
            silent = {name: now - producers[name].last_seen for name in waited}
            if self.on_timeout is TimeoutPolicy.EXCLUDE:
                for name in sorted(waited):
                    state = producers[name]
                    self._members.leave(state)
                    self._counts["excluded"] += 1
                    self._evaluation.wake(state.types)
                self._rollback.keep_membership()    # (a leave, membership, not the batch's: an open batch's abort keeps it)
                return
        details = "; ".join(f"{name} silent for {silent[name]:.3g} s, blocking {', '.join(sorted(set(nodes)))}"
                            for name, nodes in sorted(waited.items()))
        raise ProducerTimeout(
            f"engine {self.name}: input node timeout ({self.timeout} s): {details}. The producer sent neither an "
            f"event nor a heartbeat, so compositions that need its sync-point cannot become stable; make it send "
            f"heartbeats (engine.heartbeat(producer, ts) or heartbeat rows), engine.leave() it if it is gone, or run "
            f"the engine with on_timeout='exclude'", tuple(sorted(waited)), silent)

    # --- inspection --------------------------------------------------------------------------------------

    def invalidations(self) -> tuple[Invalidation, ...]:
        """Every invalidation notice so far (weak membership), oldest first."""
        with self._guard:
            return tuple(self._input.invalidations)

    def statistics(self) -> CompositeStatistics:
        with self._guard:
            measured = {"waiting": sum(node.size() for node in self._evaluation.nodes.values()),
                        "blocked_nodes": len(self._evaluation.blocked)}
            return CompositeStatistics(**{field.name: measured.get(field.name, self._counts[field.name])
                                          for field in dataclasses.fields(CompositeStatistics)})

    def waiting(self) -> dict[tuple[str, Partition], Waiting]:
        """Per node that holds events: its lists (as events) and the producers it waits for."""
        with self._guard:
            return {key: {"lists": {name: [item.event for item in items] for name, items in
                                    zip(node.names, node.lists)},
                          "blocked_on": sorted(node.blocked_on)}
                    for key, node in self._evaluation.nodes.items() if node.size() or node.blocked_on}

    def progress(self, query: str) -> Instant | None:
        """A lower bound of the lower bound of every composite event ``query`` may still produce (None:
        unknown): what a consumer of these composites uses as this query's sync-point
        (``other.heartbeat(query, engine.progress(query))``)."""
        with self._guard:
            compiled = self._query(query)
            syncs = self._members.syncs(compiled.types)
            if syncs is None:
                return None
            lowers = [item.ts.interval.lower for (name, _), node in self._evaluation.nodes.items() if name == compiled.name
                      for item in node.items()]
            return min(lowers + syncs, default=None)

    def window(self, last: int | None = None) -> Window:
        """The latest arrivals and composites (at most ``last`` arrivals), for ``activedb.composite.plot``."""
        if last is not None:
            check_whole_number("CompositionEngine.window", "last", last, 0, " (how many arrivals to show; None: all)",
                               error=CompositeError)
        with self._guard:
            entries = tuple(self._input.entries)[-last:] if last else tuple(self._input.entries)
            if last == 0:
                entries = ()
            start = min((entry.ts.interval.lower for entry in entries), default=None)
            composites = tuple(composite for composite in self._evaluation.composites
                               if last != 0 and (start is None or not earlier(composite.ts.interval.upper, start)))
            producers = self._members.producers
            return Window(entries=entries, composites=composites,
                          sync_points={name: state.sync for name, state in producers.items()},
                          producers={name: tuple(sorted(state.types)) for name, state in producers.items()},
                          uncertainties=tuple(self._evaluation.uncertainties))

    def __repr__(self) -> str:
        return (f"<CompositionEngine {self.name}: {len(self._queries)} queries, {len(self._members.producers)} "
                f"producers>")


class _Holding:
    """``with engine._guard:`` — takes ``_mutex``; a re-entrant call (the on_uncertain callback calling
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

    def table(self, name: str, position: Position | None = None) -> NoReturn:
        raise DefinitionError(f"composition queries cannot read the store (table {name!r}): a composite event is "
                              f"decided from events alone; read the store in a rule on the composite event",
                              line=position.line if position else None, column=position.column if position else None)


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


def emit_composite(tx: Transaction, composite: CompositeEvent) -> None:
    """Hand ``composite`` to the rules on its query's spec in ``tx`` (``tx.emit``)."""
    tx.emit(composite.query, key=composite.partition or None, ts=composite.ts, payload=composite.payload())


def _stopped(error: Exception, index: int, item: object, call: str) -> Exception:
    """``error``, raised by the input at ``index`` of a ``submit``/``process`` call, as an error of its class saying
    that the call stopped there."""
    if isinstance(item, StreamEvent):
        what = describe_event(item) if isinstance(item.attributes, Mapping) else f"{item.type}{item.ts}"
    elif isinstance(item, Heartbeat):
        what = f"heartbeat of {item.producer} at {item.ts}"
    else:
        what = f"{reprlib.repr(item)}"
    before = ("no input before it was taken" if index == 0 else
              f"the {index} input{'s' if index > 1 else ''} before it {'were' if index > 1 else 'was'} taken")
    undo = ("; abort tx to take them back (the engine returns to its state before the batch)"
            if call == "process" and index and not isinstance(error, EvaluationError) else "")   # (RETURN's says so)
    stopped = type(error)(f"{error} — input {index} of the call ({what}) was refused, so the call stopped there: "
                          f"{before}, those after it were not taken (give them again){undo}")
    stopped.__dict__.update(error.__dict__)
    return stopped


def _check_items(items: object) -> None:
    """Refuse what is no collection of inputs (one input where they belong would be taken apart) before anything
    changes."""
    if isinstance(items, (StreamEvent, Heartbeat, Mapping, str, bytes)) or not isinstance(items, Iterable):
        raise CompositeError(f"items is {type(items).__name__} {reprlib.repr(items)}, not a collection of inputs: give a list "
                             f"of StreamEvent and Heartbeat objects — one input is [item], or signal(item)")
