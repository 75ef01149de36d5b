"""The stream engine: definitions, the reorder buffer, s-transactions, the batch's state.

:class:`StreamEngine` is the public object (one per application, explicit — no module
globals).  Per micro-batch the caller owns one top-level transaction and calls
``engine.process(tx, events, punctuation=…)``:

1. **admit** every event: check its stream, type and timestamp; an event older than the
   punctuation already released is a *late* dead letter (the reason names that
   punctuation); the others go into the reorder buffer, ordered by the declared total
   order (``_events.order_key``);
2. **release** every buffered event older than the new bound ``min over the engine's
   streams of their most recent punctuation`` (explicit ``punctuation=``, or
   ``db.watermark(stream)``): strictly older — events *at* the bound wait, since an event
   with that timestamp may still come;
3. give the released events positions in the total order and hand their s-transactions
   to the **scheduler** (SEI by default) — each runs inside ``tx``;
4. record dead letters and save the engine's state (buffer, matcher partitions,
   punctuations) **in ``tx``**, so they commit — or vanish — with the batch's effects
   and the caller's ledger row: exactly once.

The engine's in-memory state follows the batch's outcome: the state a batch produced is
kept *pending* until its top-level transaction is seen committed (then it becomes the
engine's state) or aborted (then it is dropped, and a re-run of the batch starts from
the state before it).  ``feed(events)`` does all of it in a transaction of its own.

Thread-safety: ``_mutex`` protects ``_state``, ``_pending`` and the definitions; a batch's
own structures are protected by ``BatchRun._mutex`` (the unscheduled mode uses threads).
Lock order: ``_mutex`` before ``BatchRun._mutex``; neither is held while running user
code, the store or the scheduler.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import itertools
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

import sqlalchemy as sa

from activedb import deadletters
from activedb.txn import TxnState
from activedb.errors import DuplicateKey, SchemaError
from activedb.streams import _language
from activedb.streams import algebra as ast
from activedb.streams._catalog import StoreCatalog, StreamSchema
from activedb.streams._compile import CompiledQuery, CompiledRule, Ctx, compile_query, compile_rule
from activedb.streams._events import (
    DeadLetter,
    Output,
    StreamEvent,
    check_ts,
    format_ts,
    order_key,
    ts_less,
)
from activedb.streams._history import StreamHistory
from activedb.streams._matcher import Matcher, PartitionState
from activedb.streams._metrics import Metrics, StreamStatistics
from activedb.streams._scheduler import Scheduler, make_scheduler
from activedb.streams._view import Stamp, StoreView
from activedb.streams.errors import (
    ActionFailed,
    DefinitionError,
    StreamError,
    StreamStateError,
    UnknownName,
)

logger = logging.getLogger("activedb.streams")


# --- results and plans ------------------------------------------------------------------------

@dataclass(frozen=True)
class BatchResult:
    """What one ``process``/``feed`` call did.  Immutable."""

    admitted: int                      # events put into the reorder buffer
    released: int                      # events released (their s-transactions ran)
    processed: int                     # s-transactions committed
    failed: int                        # s-transactions aborted (dead letters)
    outputs: tuple[Output, ...]        # query outputs, in order (empty with keep_outputs=False)
    dead_letters: tuple[DeadLetter, ...]
    buffered: int                      # still waiting for a punctuation
    punctuation: Any                   # the released bound after this call


@dataclass(frozen=True)
class Resource:
    """A table (``key`` None) or one row of it."""

    table: str
    key: tuple | None = None


@dataclass(frozen=True)
class AccessPlan:
    """What an event's s-transaction may read and write (Active CEP Algorithm 1), derived
    from the definitions alone.  ``opaque``: a Python action declared no tables."""

    reads: frozenset[Resource]
    writes: frozenset[Resource]
    opaque: bool = False


@dataclass
class STransaction:
    """The s-transaction of one released event (Def. 7): ``T.ts = event.ts``."""

    id: str
    event: StreamEvent
    matchers: tuple[tuple[int, Matcher], ...]        # (query rank, matcher), in query order
    engine: "StreamEngine" = field(repr=False)

    @property
    def ts(self) -> Any:
        return self.event.ts

    @functools.cached_property
    def plan(self) -> AccessPlan:
        """Algorithm 1's locks for this s-transaction (computed once)."""
        return self.engine.access_plan(self.event)


# --- state ------------------------------------------------------------------------------------

@dataclass
class _State:
    """The engine's state between batches (the committed one) or during one (pending)."""

    partitions: dict[tuple[str, tuple], PartitionState] = field(default_factory=dict)
    # Invariant: sorted by (order key, arrival number); no entry is older than `released`.
    buffer: list[tuple[tuple, int, StreamEvent]] = field(default_factory=list)
    released: Any = None              # every event older than this was released (None: nothing yet)
    punctuations: dict[str, Any] = field(default_factory=dict)
    position: int = 0                 # the next release position
    arrivals: int = 0                 # the next arrival number
    time_kind: str | None = None      # "number" or "datetime", fixed by the first event


class _Pending:
    """A batch's state on top of the committed one (partitions as an overlay)."""

    def __init__(self, root: Any, base: _State):
        self.root = root
        self.base = base
        self.overlay: dict[tuple[str, tuple], PartitionState | None] = {}
        self.buffer = list(base.buffer)
        self.released = base.released
        self.punctuations = dict(base.punctuations)
        self.position = base.position
        self.arrivals = base.arrivals
        self.time_kind = base.time_kind
        self.buffer_added: dict[int, StreamEvent] = {}
        self.buffer_removed: set[int] = set()
        self.units: list[str] = []          # history units run in this batch (aborted with it)

    def partition(self, key: tuple[str, tuple]) -> PartitionState | None:
        if key in self.overlay:
            return self.overlay[key]
        return self.base.partitions.get(key)

    def materialize(self) -> _State:
        partitions = self.base.partitions
        for key, value in self.overlay.items():
            if value is None:
                partitions.pop(key, None)
            else:
                partitions[key] = value
        return _State(partitions=partitions, buffer=self.buffer, released=self.released,
                      punctuations=self.punctuations, position=self.position, arrivals=self.arrivals,
                      time_kind=self.time_kind)


# --- one batch ----------------------------------------------------------------------------------

_INFRASTRUCTURE: tuple[type[BaseException], ...] = ()


def _infrastructure() -> tuple[type[BaseException], ...]:
    global _INFRASTRUCTURE
    if not _INFRASTRUCTURE:
        from lockmgr import Deadlock, LockTimeout

        from activedb.errors import DatabaseUnavailable, SerializationConflict, TransactionError

        _INFRASTRUCTURE = (DatabaseUnavailable, SerializationConflict, Deadlock, LockTimeout, TransactionError,
                           sa.exc.SQLAlchemyError)
    return _INFRASTRUCTURE


def _event_failure(error: BaseException) -> bool:
    """True if ``error`` is the event's own fault (the event becomes a dead letter), False if
    the batch cannot go on (PostgreSQL unusable, lock trouble, the transaction aborted)."""
    if isinstance(error, DuplicateKey):
        return True
    if isinstance(error, (StreamError, SchemaError)):
        return True
    return False


class BatchRun:
    """The s-transactions of one ``process`` call and what the scheduler calls to run them."""

    def __init__(self, engine: "StreamEngine", tx: Any, pending: _Pending, stransactions: list[STransaction]):
        self.engine = engine
        self.tx = tx
        self.pending = pending
        self.stransactions = stransactions
        self._mutex = threading.Lock()       # protects outputs, dead_letters, counters, pending.overlay
        self.outputs: list[Output] = []
        self.dead_letters: list[DeadLetter] = []
        self.processed = 0
        self.failed = 0
        self.view_factory: Callable[[Any, Stamp], Any] = (
            lambda tx, stamp: StoreView(tx, stamp, engine.history, engine.operation_cost))
        self.serial = next(engine._batch_serials)
        # Invariant: _installed_at[partition] is the position of the s-transaction whose state is in the
        # overlay; a state from an earlier position never replaces a later one (concurrent schedulers may
        # end s-transactions out of order; only those that cannot change a partition's state run unordered).
        self._installed_at: dict[tuple[str, tuple], int] = {}
        #: A concurrent scheduler's answer to "on which state of partition ``key`` of ``query``
        #: is ``stransaction`` matched" (``state_source(stransaction, query, key)``); None: the
        #: batch's current state (SEI: the previous s-transaction's).
        self.state_source: Callable[[STransaction, str, tuple], PartitionState | None] | None = None
        #: Called on the s-transaction's thread once its queries matched, before its rules run:
        #: ``on_matched(stransaction, touched, certain)`` with the partitions' new states;
        #: ``certain``: no rule instance is left to run, so nothing after this point can abort it
        #: for its event (its states are final as soon as it commits, which it will unless the
        #: whole batch fails).  A concurrent scheduler lets the next s-transaction of a
        #: partition be matched on them at once (Active CEP Example 5).
        self.on_matched: Callable[[STransaction, dict, bool], None] | None = None

    def partition(self, query: str, key: tuple) -> PartitionState | None:
        with self._mutex:
            return self.pending.partition((query, key))

    def _install(self, touched: dict[tuple[str, tuple], PartitionState], position: int | None) -> None:
        with self._mutex:
            installed_at = self._installed_at
            for key, state in touched.items():
                if position is not None:
                    if installed_at.get(key, -1) > position:
                        continue
                    installed_at[key] = position
                self.pending.overlay[key] = state if state.size() else None

    # --- the whole s-transaction (SEI and schedulers that lock ahead) ---------------------------

    def execute(self, stransaction: STransaction, parent: Any = None) -> bool:
        """Run ``stransaction`` as one subtransaction of ``parent`` (default: the batch's
        transaction).  True if it committed; False if it aborted (its event is then a dead
        letter).  Raises only when the batch cannot go on."""
        parent = self.tx if parent is None else parent
        return self._run(stransaction, parent, self._unit(stransaction.id),
                         [rank for rank, _ in stransaction.matchers])

    def new_unit(self, stransaction: STransaction) -> str:
        """The history unit of ``stransaction`` when a scheduler runs it with ``execute_in``."""
        return self._unit(stransaction.id)

    def execute_in(self, stransaction: STransaction, tx: Any, unit: str) -> tuple:
        """Run the whole s-transaction in ``tx``, a subtransaction the scheduler made for it
        (e.g. spawned on a worker thread): every consuming query, then the rules on their
        outputs.  The caller's subtransaction ends it: when it has committed or aborted, the
        scheduler calls :meth:`finish` with what this returned.  Raises the event's failure
        as a StreamError (after recording the dead letter) so that ``tx`` aborts, and
        infrastructure errors as they are."""
        history = self.engine.history
        event = stransaction.event
        if history is not None:
            history.begin(unit, stransaction.id, event.describe(), event.ts, (event.position, ()))
        try:
            return self._body(tx, stransaction, unit, [rank for rank, _ in stransaction.matchers])
        except BaseException as error:
            if _event_failure(error):
                self._failed(stransaction, error)
                if not isinstance(error, StreamError):
                    raise ActionFailed(str(error), rule="") from error
            raise

    def finish(self, stransaction: STransaction, unit: str, committed: bool, result: tuple | None) -> None:
        """``stransaction``'s subtransaction (see :meth:`execute_in`) committed or aborted:
        record its end; if committed, its partitions' states and outputs become the batch's."""
        history = self.engine.history
        event = stransaction.event
        if history is not None:
            history.end(unit, stransaction.id, event.describe(), event.ts, (event.position, ()), committed)
        if committed and result is not None:
            touched, outputs = result
            self._succeeded(touched, outputs, event.position)

    def count_empty(self) -> None:
        """An s-transaction no query consumes: nothing to run, it counts as processed."""
        self.engine.metrics.add(processed=1)
        with self._mutex:
            self.processed += 1

    def _unit(self, name: str) -> str:
        """A unit id unique across batches (a re-run batch reuses positions)."""
        unit = f"{name}.b{self.serial}"
        with self._mutex:
            self.pending.units.append(unit)
        return unit

    def execute_unit(self, stransaction: STransaction, rank: int, tx: Any) -> bool:
        """Run only the query of ``rank`` (and the rules on its outputs) in ``tx`` itself, as
        its own unit — the unscheduled mode.  Raises the event's failure as a StreamError
        (after recording the dead letter) so that ``tx`` aborts."""
        unit = self._unit(f"{stransaction.id}/{rank}")
        history = self.engine.history
        event = stransaction.event
        if history is not None:
            history.begin(unit, stransaction.id, event.describe(), event.ts, (event.position, ()))
        try:
            touched, outputs = self._body(tx, stransaction, unit, [rank])
        except BaseException as error:
            if history is not None:
                history.end(unit, stransaction.id, event.describe(), event.ts, (event.position, ()), False)
            if _event_failure(error):
                self._failed(stransaction, error)
                if not isinstance(error, StreamError):
                    raise ActionFailed(str(error), rule="") from error
            raise
        # The unit's commit is the caller's (the subtransaction ends when this returns).
        if history is not None:
            history.end(unit, stransaction.id, event.describe(), event.ts, (event.position, ()), True)
        self._succeeded(touched, outputs, None)
        return True

    def _run(self, stransaction: STransaction, parent: Any, unit: str, ranks: list[int]) -> bool:
        engine = self.engine
        history = engine.history
        event = stransaction.event
        order = (event.position, ())
        if not ranks:                       # no query consumes the event: an empty s-transaction
            self.count_empty()
            return True
        if history is not None:
            history.begin(unit, stransaction.id, event.describe(), event.ts, order)
        context = parent.subtransaction(name=f"s-transaction {event.describe()}")
        child = context.__enter__()
        committed = False
        try:
            try:
                touched, outputs = self._body(child, stransaction, unit, ranks)
            except BaseException as error:
                context.__exit__(type(error), error, error.__traceback__)
                raise
            started = time.perf_counter()
            context.__exit__(None, None, None)     # commit into the parent
            engine.metrics.phase("commit", time.perf_counter() - started)
            committed = True
        except BaseException as error:
            if history is not None:
                history.end(unit, stransaction.id, event.describe(), event.ts, order, False)
            if not _event_failure(error):
                raise
            self._failed(stransaction, error)
            return False
        if history is not None:
            history.end(unit, stransaction.id, event.describe(), event.ts, order, committed)
        self._succeeded(touched, outputs, event.position)
        return True

    def _body(self, tx: Any, stransaction: STransaction, unit: str, ranks: list[int]):
        engine = self.engine
        metrics = engine.metrics
        event = stransaction.event
        view = self.view_factory(tx, Stamp(unit, stransaction.id, event.describe(), event.ts, event.position))
        touched: dict[tuple[str, tuple], PartitionState] = {}
        produced: list[tuple[int, CompiledQuery, list[Output]]] = []
        wanted = set(ranks)
        for rank, matcher in stransaction.matchers:
            if rank not in wanted:
                continue
            query = matcher.query
            key = matcher.partition_key(event)
            started = time.perf_counter()
            source = self.state_source
            state = self.partition(query.name, key) if source is None else source(stransaction, query.name, key)
            step = matcher.prepare(state, event)
            prepared = time.perf_counter()
            view.at(0, rank, query.name)
            outputs, state = step.complete(view)
            metrics.phase("match", prepared - started)
            metrics.phase("reads", time.perf_counter() - prepared)
            metrics.query(query.name, len(outputs))
            touched[(query.name, key)] = state
            produced.append((rank, query, outputs))
        if self.on_matched is not None:
            self.on_matched(stransaction, dict(touched),
                            not any(outputs and engine._rules_by_query.get(query.name) for _, query, outputs in produced))
        started = time.perf_counter()
        rule_latency = 0.0
        instances = 0
        all_outputs = []
        for rank, query, outputs in produced:
            rules = engine._rules_by_query.get(query.name, ())
            for output in outputs:
                all_outputs.append(output)
                for rule in rules:
                    view.at(1, rank, rule.name)
                    _run_rule(rule, output, view)
                    instances += 1
                    rule_latency += time.perf_counter() - output.sts
        metrics.phase("rules", time.perf_counter() - started)
        metrics.add(rule_instances=instances, rule_latency=rule_latency, reads=view.reads, writes=view.writes)
        return touched, all_outputs

    def _succeeded(self, touched, outputs: list[Output], position: int | None) -> None:
        self._install(touched, position)
        latency = 0.0
        for output in outputs:
            arrivals = [event.sts for event in output.constituents if event.sts is not None]
            if arrivals:
                latency += output.sts - max(arrivals)
        self.engine.metrics.add(processed=1, outputs=len(outputs), query_latency=latency)
        with self._mutex:
            self.processed += 1
            if self.engine.keep_outputs:
                self.outputs.extend(outputs)

    def _failed(self, stransaction: STransaction, error: BaseException) -> None:
        reason = (f"s-transaction of {stransaction.event.describe()} aborted: {type(error).__name__}: {error}"
                  if not isinstance(error, ActionFailed) else f"s-transaction of {stransaction.event.describe()} "
                                                              f"aborted: {error}")
        logger.info("%s", reason)
        with self._mutex:
            self.failed += 1
            self.dead_letters.append(DeadLetter(stransaction.event, reason))
        self.engine.metrics.add(failed=1, dead_letters=1)


def _run_rule(rule: CompiledRule, output: Output, view: Any) -> None:
    ctx = Ctx(output, view)
    try:
        if rule.when is not None and rule.when(ctx) is not True:
            return
        for action in rule.actions:
            action(ctx)
    except (StreamError, SchemaError, DuplicateKey):
        raise
    except _infrastructure():
        raise
    except Exception as error:
        raise ActionFailed(f"rule {rule.name} raised {type(error).__name__}: {error}", rule.name) from error


# --- the engine ----------------------------------------------------------------------------------

class StreamEngine:
    """Pattern queries and ON OUTPUT rules over a stream, with s-transactions on ``db``'s store.

    * ``name`` — identifies the engine's saved state and its dead letters
      (``query_id = "streams:<name>"``);
    * ``scheduler`` — ``"sei"`` (default), ``"unscheduled"`` (tests) or a :class:`Scheduler`;
    * ``aliases`` — map logical table/column names of definitions to the store's
      (``{"workerStatus": ("worker_status", {"workerID": "worker"})}``);
    * ``record_history`` — keep the stream history for ``activedb.testing.check_stream_history``;
    * ``durable`` — save the buffer and matcher state in ``activedb_stream_state`` within each
      batch's transaction (exactly once across restarts); ``False`` keeps it in memory only;
    * ``record_dead_letters`` — insert dead letters into ``activedb_dead_letters`` in the
      batch's transaction (``False``: only return them, e.g. when the caller records its own);
    * ``keep_outputs`` — return every output in ``BatchResult.outputs``;
    * ``prefetch`` — before a batch's s-transactions run, load the rows their access plans
      name with one ``tx.prefetch`` per table (read-locks them for the batch);
    * ``operation_cost`` — **for benchmarks**: a callable ``cost(kind)`` (``"read"`` or
      ``"write"``) run before every store operation of an s-transaction, once its lock is
      granted — how ``activedb bench streams`` models a store whose operations cost a round
      trip.  Applications and tests leave it None.

    ``scheduler``: ``"sei"``, ``"s2pl"``, ``"lwm"`` (the defaults of
    :class:`S2PLScheduler`/:class:`LWMScheduler`: tuple locks, 8 s-transactions at a time),
    ``"unscheduled"`` (tests only), or a :class:`Scheduler` instance
    (``streams.LWMScheduler(granularity="table", workers=16)``).

    Thread-safety: definitions and ``statistics()`` may be used from any thread; batches
    are processed one at a time (a second concurrent batch raises ``StreamStateError``).
    """

    def __init__(self, db: Any, *, name: str = "streams", scheduler: str | Scheduler = "sei",
                 aliases: Mapping[str, Any] | None = None, record_history: bool = False, durable: bool = True,
                 record_dead_letters: bool = True, keep_outputs: bool = True, prefetch: bool = True,
                 operation_cost: Callable[[str], None] | None = None):
        if not isinstance(name, str) or not name.strip():
            raise StreamError("a StreamEngine needs a non-empty name (it keys the engine's saved state)")
        self.db = db
        self.name = name
        self.scheduler = make_scheduler(scheduler)
        self.catalog = StoreCatalog(db, aliases)
        self.history: StreamHistory | None = StreamHistory() if record_history else None
        self.durable = durable
        self.record_dead_letters = record_dead_letters
        self.keep_outputs = keep_outputs
        self.prefetch = prefetch
        self.operation_cost = operation_cost
        self.metrics = Metrics(self.scheduler.name)
        self._mutex = threading.RLock()
        self._streams: dict[str, StreamSchema] = {}
        self._queries: dict[str, CompiledQuery] = {}
        self._matchers: dict[str, Matcher] = {}
        self._rules: dict[str, CompiledRule] = {}
        self._rules_by_query: dict[str, tuple[CompiledRule, ...]] = {}
        self._by_type: dict[tuple[str, str], tuple[tuple[int, Matcher], ...]] = {}
        self._plans: dict[tuple[str, str], tuple] = {}     # access-plan templates, see _plan_template
        self._state = _State()
        self._pending: _Pending | None = None
        self._loaded = not durable
        self._processing = threading.Lock()
        self._batch_serials = itertools.count(1)

    # --- definitions ---------------------------------------------------------------------------

    def create_stream(self, name: str, *, types: Sequence[str] | None = None, attributes: Sequence[str] = (),
                      type_attributes: Mapping[str, Sequence[str]] | None = None,
                      priorities: Mapping[str, float] | None = None, tie_key: Callable[[StreamEvent], Any] | None = None
                      ) -> StreamSchema:
        """Declare an input stream (see :class:`~activedb.streams._catalog.StreamSchema`)."""
        schema = StreamSchema(name=name, types=tuple(types) if types is not None else None,
                              attributes=tuple(attributes),
                              type_attributes={key: tuple(value) for key, value in (type_attributes or {}).items()},
                              priorities=dict(priorities or {}), tie_key=tie_key)
        with self._mutex:
            if name in self._streams:
                raise DefinitionError(f"stream {name!r} is already declared")
            self._streams[name] = schema
        return schema

    def define(self, text: str) -> list[CompiledQuery | CompiledRule]:
        """Define every ``CREATE QUERY`` / ``CREATE RULE`` of ``text``, in order."""
        defined = []
        for definition in _language.parse(text):
            try:
                defined.append(self._add(definition))
            except DefinitionError as error:
                if error.line is not None and "\n" not in str(error):
                    raise type(error)(error.reason, line=error.line, column=error.column, text=text) from None
                raise
        return defined

    def create_query(self, definition: str | ast.QueryDefinition) -> CompiledQuery:
        """Define a query from its text or an :class:`~algebra.QueryDefinition`."""
        if isinstance(definition, str):
            (compiled,) = self._define_text(definition, ast.QueryDefinition)
            return compiled
        return self._add(definition)

    def create_rule(self, definition: str | ast.RuleDefinition) -> CompiledRule:
        """Define an ON OUTPUT rule from its text or an :class:`~algebra.RuleDefinition`."""
        if isinstance(definition, str):
            (compiled,) = self._define_text(definition, ast.RuleDefinition)
            return compiled
        return self._add(definition)

    def query(self, name: str, *, pattern: Any, returns: Any, where: Any = None, within: float | None = None,
              stream: str | None = None, selection: ast.Selection | str = ast.Selection.SKIP_TILL_ANY_MATCH,
              priority: float | None = None) -> CompiledQuery:
        """Define a query in Python (see ``activedb.streams.seq``, ``event``, ``store``)."""
        from activedb.streams._builders import query_definition

        return self._add(query_definition(name, pattern=pattern, returns=returns, where=where, within=within,
                                          stream=stream, selection=selection, priority=priority))

    def rule(self, name: str, *, on_output: str, action: Any, when: Any = None, priority: float | None = None,
             new: str = "NEW", reads: Iterable[str] | None = None, writes: Iterable[str] | None = None,
             replace: bool = False) -> CompiledRule:
        """Define an ON OUTPUT rule in Python.  ``action``: an action built with
        ``streams.update``/``insert``/``delete``, a list of them, or a callable ``(tx, new)``
        (``reads``/``writes`` declare the tables a callable may touch)."""
        from activedb.streams._builders import rule_definition

        return self._add(rule_definition(name, on_output=on_output, action=action, when=when, priority=priority,
                                         new=new, reads=reads, writes=writes, replace=replace))

    def on_output(self, query: str, *, name: str | None = None, **options: Any):
        """Decorator: ``@engine.on_output("Q1", writes=["alerts"])`` over ``def f(tx, new)``."""
        def decorate(function):
            self.rule(name or function.__name__, on_output=query, action=function, **options)
            return function
        return decorate

    def _define_text(self, text: str, kind: type) -> list:
        definitions = _language.parse(text)
        for definition in definitions:
            if not isinstance(definition, kind):
                what = "CREATE QUERY" if kind is ast.QueryDefinition else "CREATE RULE"
                position = definition.position
                raise DefinitionError(f"expected {what} here; use engine.define() for a script of both",
                                      line=position.line if position else None,
                                      column=position.column if position else None, text=text)
        try:
            return [self._add(definition) for definition in definitions]
        except DefinitionError as error:
            if error.line is not None and "\n" not in str(error):
                raise type(error)(error.reason, line=error.line, column=error.column, text=text) from None
            raise

    def _add(self, definition: Any) -> CompiledQuery | CompiledRule:
        with self._mutex:
            if isinstance(definition, ast.QueryDefinition):
                if isinstance(definition.pattern, ast.Conj) or definition.consumption is not None:
                    what = "AND(…)" if isinstance(definition.pattern, ast.Conj) else "CONSUMING"
                    raise DefinitionError(
                        f"query {definition.name}: {what} belongs to the interval time model (events from many "
                        f"producers, order possibly uncertain); define it on an activedb.composite."
                        f"CompositionEngine — this engine's total order of point timestamps runs SEQ only",
                        **_at(definition))
                if any(name.casefold() == definition.name.casefold() for name in self._queries):
                    raise DefinitionError(f"query {definition.name} is already defined; give the new one "
                                          f"another name", **_at(definition))
                compiled = compile_query(definition, self._streams, self.catalog)
                self._queries[compiled.name] = compiled
                self._matchers[compiled.name] = Matcher(compiled)
                self._reindex()
                return compiled
            if isinstance(definition, ast.RuleDefinition):
                existing = [name for name in self._rules if name.casefold() == definition.name.casefold()]
                if existing and not definition.replace:
                    raise DefinitionError(f"rule {definition.name} is already defined; use CREATE OR REPLACE RULE "
                                          f"(replace=True) to redefine it", **_at(definition))
                compiled = compile_rule(definition, self._queries, self.catalog)
                for name in existing:
                    del self._rules[name]
                self._rules[compiled.name] = compiled
                self._reindex()
                return compiled
        raise DefinitionError(f"not a query or rule definition: {definition!r}")

    def _reindex(self) -> None:
        """Precondition: the caller holds ``_mutex``."""
        ordered = sorted(self._queries.values(), key=_priority_then_name)
        self._query_order = [query.name for query in ordered]
        by_type: dict[tuple[str, str], list[tuple[int, Matcher]]] = {}
        for rank, query in enumerate(ordered):
            for event_type in dict.fromkeys(query.types):
                by_type.setdefault((query.stream.name, event_type), []).append((rank, self._matchers[query.name]))
        self._by_type = {key: tuple(value) for key, value in by_type.items()}
        self._plans = {}
        rules: dict[str, list[CompiledRule]] = {}
        for rule in self._rules.values():
            rules.setdefault(rule.query, []).append(rule)
        self._rules_by_query = {query: tuple(sorted(group, key=_priority_then_name)) for query, group in rules.items()}

    @property
    def queries(self) -> dict[str, CompiledQuery]:
        with self._mutex:
            return dict(self._queries)

    @property
    def rules(self) -> dict[str, CompiledRule]:
        with self._mutex:
            return dict(self._rules)

    @property
    def streams(self) -> dict[str, StreamSchema]:
        with self._mutex:
            return dict(self._streams)

    # --- Algorithm 1 -----------------------------------------------------------------------------

    def access_plan(self, event: StreamEvent) -> AccessPlan:
        """The store resources ``event``'s s-transaction may read and write (Active CEP
        Algorithm 1, narrowed to what this engine can do: queries read the store only at
        their accepting events, rules fire only there).  A key comes from the event when
        the definitions derive it from the event's attributes; otherwise the table."""
        stream = self._stream_of(event)
        template = self._plans.get((stream.name, event.type))
        if template is None:
            template = self._plan_template(stream.name, event.type)
        reads, writes, opaque = template
        return AccessPlan(frozenset(Resource(table, _key_of(extract, event)) for table, extract in reads),
                          frozenset(Resource(table, _key_of(extract, event)) for table, extract in writes), opaque)

    def _plan_template(self, stream: str, event_type: str):
        """Per (stream, type): the tables and how each key is taken from the event (cached
        until the definitions change)."""
        reads: dict[tuple, None] = {}
        writes: dict[tuple, None] = {}
        opaque = False
        with self._mutex:
            for _, matcher in self._by_type.get((stream, event_type), ()):
                query = matcher.query
                if event_type != query.accepting_type:
                    continue
                for spec in query.reads:
                    reads[(spec.table, _key_extractor(spec.key, query, None))] = None
                for rule in self._rules_by_query.get(query.name, ()):
                    opaque = opaque or rule.opaque
                    for spec in rule.reads:
                        reads[(spec.table, _key_extractor(spec.key, query, rule))] = None
                    for spec in rule.writes:
                        writes[(spec.table, _key_extractor(spec.key, query, rule))] = None
            template = (tuple(reads), tuple(writes), opaque)
            self._plans[(stream, event_type)] = template
        return template

    # --- processing ------------------------------------------------------------------------------

    def process(self, tx: Any, events: Iterable[StreamEvent | Mapping[str, Any]], *, punctuation: Any = None,
                punctuations: Mapping[str, Any] | None = None, batch_id: int | None = None) -> BatchResult:
        """Admit ``events``, release what the punctuations allow, and run the released
        events' s-transactions inside ``tx`` (see the module docstring).

        ``punctuation`` applies to the engine's only stream (or every stream);
        ``punctuations`` gives one per stream; each stream's ``db.watermark(stream)`` is
        taken as well.  ``END_OF_STREAM`` releases everything.  ``batch_id`` is written
        with the dead letters.  Raises only when the batch cannot go on (then ``tx``
        should be aborted; the engine's state stays as before the batch)."""
        if not self._processing.acquire(blocking=False):
            raise StreamStateError(f"engine {self.name} is already processing a batch in another thread; batches "
                                   f"of one engine run one at a time")
        try:
            return self._process(tx, events, punctuation, punctuations, batch_id)
        finally:
            self._processing.release()

    def feed(self, events: Iterable[StreamEvent | Mapping[str, Any]], *, punctuation: Any = None,
             punctuations: Mapping[str, Any] | None = None) -> BatchResult:
        """``process`` in a top-level transaction of its own (committed before returning)."""
        with self.db.transaction(name=f"streams:{self.name}") as tx:
            result = self.process(tx, events, punctuation=punctuation, punctuations=punctuations)
        self._resolve()
        return result

    def _process(self, tx, events, punctuation, punctuations, batch_id) -> BatchResult:
        began = time.perf_counter()
        root = tx.root
        with self._mutex:
            self._resolve_locked()
            if not self._loaded:
                self._load_locked()
            pending = self._pending
            if pending is not None and pending.root is not root:
                raise StreamStateError(
                    f"engine {self.name} has a batch in transaction {pending.root.id} that is still "
                    f"{pending.root.state.value}; commit or abort it before the next batch")
            if pending is None:
                pending = self._pending = _Pending(root, self._state)
            streams = dict(self._streams)
        if not streams:
            raise StreamStateError(f"engine {self.name} has no stream; declare one with engine.create_stream()")
        letters: list[DeadLetter] = []
        events = list(events)
        now = time.perf_counter()
        self.metrics.arrived(len(events), now)
        admitted = 0
        for raw in events:
            event, problem = self._admit(raw, now, pending, streams)
            if problem is not None:
                letters.append(problem)
                continue
            admitted += 1
        bound = self._new_bound(pending, streams, punctuation, punctuations)
        released = self._release(pending, bound, now)
        self.metrics.phase("buffer", time.perf_counter() - began)
        stransactions = []
        for event in released:
            matchers = self._by_type.get((event.stream, event.type), ())
            stransactions.append(STransaction(f"S{event.position}", event, matchers, self))
        if self.prefetch and stransactions:
            self._prefetch(tx, stransactions)
        run = BatchRun(self, tx, pending, stransactions)
        self.scheduler.run(run)
        # A concurrent scheduler ends s-transactions out of order: report in the declared order.
        run.outputs.sort(key=lambda output: output.position)
        run.dead_letters.sort(key=lambda letter: letter.event.position)
        letters.extend(run.dead_letters)
        started = time.perf_counter()
        if letters and self.record_dead_letters:
            self._record_dead_letters(tx, letters, batch_id)
        if self.durable:
            from activedb.streams import _persist

            _persist.save(self, tx, pending)
        self.metrics.phase("state", time.perf_counter() - started)
        self.metrics.add(processing=time.perf_counter() - began)
        return BatchResult(admitted=admitted, released=len(released), processed=run.processed, failed=run.failed,
                           outputs=tuple(run.outputs), dead_letters=tuple(letters), buffered=len(pending.buffer),
                           punctuation=pending.released)

    def _prefetch(self, tx: Any, stransactions: list[STransaction]) -> None:
        """Load, in one query per table, the rows the batch's access plans name (Algorithm 1
        at work): the s-transactions' reads then need no round trip."""
        keys: dict[str, dict[tuple, None]] = {}
        for stransaction in stransactions:
            if not stransaction.matchers:
                continue
            plan = stransaction.plan
            for resource in plan.reads | plan.writes:
                if resource.key is not None and all(value is not None for value in resource.key):
                    keys.setdefault(resource.table, {})[resource.key] = None
        for table, wanted in keys.items():
            tx.prefetch(table, list(wanted))

    def _stream_of(self, event: StreamEvent) -> StreamSchema:
        if event.stream is not None:
            stream = self._streams.get(event.stream)
            if stream is None:
                raise UnknownName(f"no stream {event.stream!r}")
            return stream
        if len(self._streams) == 1:
            return next(iter(self._streams.values()))
        raise UnknownName("the event names no stream and the engine has several")

    def _admit(self, raw, now: float, pending: _Pending, streams: dict[str, StreamSchema]):
        """Put one event into the buffer; returns (event, None) or (None, dead letter)."""
        if isinstance(raw, Mapping):
            raw = _event_from_mapping(raw)
        if not isinstance(raw, StreamEvent):
            return None, DeadLetter(StreamEvent("?", None, {}, origin=raw),
                                    f"rejected: not an event ({type(raw).__name__}); give StreamEvent objects or "
                                    f"dicts with type, ts and attributes")
        event = raw
        if event.stream is None:
            if len(streams) != 1:
                return None, self._reject(event, f"rejected: the event names no stream and engine {self.name} has "
                                                 f"{len(streams)} ({', '.join(streams)})")
            stream = next(iter(streams.values()))
        else:
            stream = streams.get(event.stream)
            if stream is None:
                return None, self._reject(event, f"rejected: no stream {event.stream!r} in engine {self.name} "
                                                 f"(streams: {', '.join(streams)})")
        event_type = stream.resolve_type(event.type) if isinstance(event.type, str) else None
        if event_type is None:
            return None, self._reject(event, f"rejected: stream {stream.name} has no event type {event.type!r} "
                                             f"(types: {', '.join(stream.types or ())})")
        event = dataclasses.replace(event, type=event_type, stream=stream.name,
                                    sts=event.sts if event.sts is not None else now)
        try:
            kind = check_ts(event.ts)
        except ValueError as error:
            return None, self._reject(event, f"rejected: {error}")
        if pending.time_kind is None:
            pending.time_kind = kind
        elif kind != pending.time_kind:
            return None, self._reject(event, f"rejected: timestamp {event.ts!r} is a {kind}, but this engine's "
                                             f"events carry {pending.time_kind}s")
        released = pending.released
        if released is not None and ts_less(event.ts, released):
            self.metrics.add(late=1)
            return None, self._reject(
                event, f"late: {event.describe()} (ts {format_ts(event.ts)}) is older than the punctuation "
                       f"{format_ts(released)} already released by engine {self.name}; every event before it has "
                       f"been processed, so this one can no longer be put in order", punctuation=released)
        tie = stream.tie_key(event) if stream.tie_key is not None else None
        key = order_key(event, stream.priority(event_type), tie)
        arrival = pending.arrivals
        pending.arrivals += 1
        bisect.insort(pending.buffer, (key, arrival, event))
        pending.buffer_added[arrival] = event
        return event, None

    def _reject(self, event: StreamEvent, reason: str, punctuation: Any = None) -> DeadLetter:
        self.metrics.add(dead_letters=1)
        return DeadLetter(event, reason, punctuation)

    def _new_bound(self, pending: _Pending, streams, punctuation, punctuations) -> Any:
        given = dict(punctuations or {})
        if punctuation is not None:
            for name in streams:
                given.setdefault(name, punctuation)
        for name in streams:
            candidates = [value for value in (given.get(name), self.db.watermark(name),
                                              pending.punctuations.get(name)) if value is not None]
            if not candidates:
                continue
            best = candidates[0]
            for value in candidates[1:]:
                if ts_less(best, value):
                    best = value
            pending.punctuations[name] = best
        if any(name not in pending.punctuations for name in streams):
            return pending.released
        bound = None
        for name in streams:
            value = pending.punctuations[name]
            if bound is None or ts_less(value, bound):
                bound = value
        if pending.released is not None and not ts_less(pending.released, bound):
            return pending.released
        return bound

    def _release(self, pending: _Pending, bound: Any, now: float) -> list[StreamEvent]:
        if bound is None or bound is pending.released and not pending.buffer:
            return []
        buffer = pending.buffer
        cut = 0
        while cut < len(buffer) and ts_less(buffer[cut][2].ts, bound):
            cut += 1
        pending.released = bound
        if not cut:
            return []
        released = []
        ties = 0
        previous = None
        delay = 0.0
        for key, arrival, event in buffer[:cut]:
            if previous is not None and previous[:4] == key[:4]:
                ties += 1
            previous = key
            event = dataclasses.replace(event, position=pending.position)
            pending.position += 1
            released.append(event)
            if event.sts is not None:
                delay += now - event.sts
            if arrival in pending.buffer_added:
                del pending.buffer_added[arrival]
            else:
                pending.buffer_removed.add(arrival)
        del buffer[:cut]
        self.metrics.add(released=len(released), reorder_delay=delay, ties_by_content=ties)
        return released

    def _record_dead_letters(self, tx: Any, letters: list[DeadLetter], batch_id: int | None) -> None:
        deadletters.insert(tx, self.db.catalog, f"streams:{self.name}", batch_id, [
            deadletters.Letter(letter.reason, _event_row(letter.event), _jsonable_event(letter.event))
            for letter in letters])

    # --- state -------------------------------------------------------------------------------

    def _resolve(self) -> None:
        with self._mutex:
            self._resolve_locked()

    def _resolve_locked(self) -> None:
        pending = self._pending
        if pending is None:
            return
        state = pending.root.state
        if state is TxnState.COMMITTED:
            self._state = pending.materialize()
            self._pending = None
        elif state is TxnState.ABORTED:
            self._pending = None
            if self.history is not None and pending.units:
                self.history.abort_units(pending.units)     # their subtransactions were undone with the batch

    def _load_locked(self) -> None:
        from activedb.streams import _persist

        self._state = _persist.load(self)
        self._loaded = True

    def reset_state(self) -> None:
        """Forget the buffer, partial matches and punctuations, in memory and (if durable)
        in the database.  Precondition: no batch is in progress."""
        with self._mutex:
            self._resolve_locked()
            if self._pending is not None:
                raise StreamStateError(f"engine {self.name} has a batch in progress; finish it first")
            if self.durable:
                from activedb.streams import _persist

                _persist.delete(self)
            self._state = _State()
            self._loaded = True

    def buffered(self) -> list[StreamEvent]:
        """The events waiting in the reorder buffer, in their release order."""
        with self._mutex:
            self._resolve_locked()
            source = self._pending.buffer if self._pending is not None else self._state.buffer
            return [event for _, _, event in source]

    def partitions(self, query: str) -> dict[tuple, PartitionState]:
        """The committed matcher states of ``query`` by partition key (for inspection)."""
        with self._mutex:
            self._resolve_locked()
            return {key: state for (name, key), state in self._state.partitions.items() if name == query}

    def statistics(self) -> StreamStatistics:
        with self._mutex:
            self._resolve_locked()
            current = self._pending if self._pending is not None else self._state
            return self.metrics.snapshot(len(current.buffer), current.released)

    def __repr__(self) -> str:
        return (f"<StreamEngine {self.name} {self.scheduler.name}: {len(self._queries)} queries, "
                f"{len(self._rules)} rules>")


def _priority_then_name(item: Any) -> tuple:
    priority = item.priority
    return (0, -priority, item.name) if priority is not None else (1, 0, item.name)


def _at(node: Any) -> dict:
    position = getattr(node, "position", None)
    return {"line": position.line, "column": position.column} if position else {}


def _event_from_mapping(raw: Mapping[str, Any]) -> StreamEvent:
    attributes = raw.get("attributes")
    if attributes is None:
        attributes = {key: value for key, value in raw.items() if key not in ("type", "ts", "stream")}
    return StreamEvent(type=raw.get("type"), ts=raw.get("ts"), attributes=dict(attributes), stream=raw.get("stream"),
                       origin=raw)


def _event_row(event: StreamEvent) -> dict:
    """A dead letter's original row for ``event``: its fields, kept exactly."""
    return {"type": event.type, "ts": event.ts, "stream": event.stream, "attributes": dict(event.attributes)}


def _jsonable_event(event: StreamEvent) -> dict:
    from activedb.streams._persist import encode_value

    return {"type": event.type, "ts": encode_value(event.ts), "stream": event.stream,
            "attributes": {key: encode_value(value) for key, value in dict(event.attributes).items()}}


def _key_of(extract: tuple | None, event: StreamEvent) -> tuple | None:
    if extract is None:
        return None
    attributes = event.attributes
    return tuple(value if is_literal else attributes.get(value) for is_literal, value in extract)


def _key_extractor(key_spec: Any, query: CompiledQuery, rule: CompiledRule | None) -> tuple | None:
    """How to take a read/write spec's key from an accepting event of ``query``: per key
    column ``(True, constant)`` or ``(False, attribute)``; None if it cannot be (the table)."""
    if key_spec is None:
        return None
    values = []
    for _, source in key_spec:
        if isinstance(source, ast.Literal):
            values.append((True, source.value))
            continue
        if not isinstance(source, ast.AttributeRef):
            return None
        if rule is not None and source.alias.casefold() in (rule.definition.new_alias.casefold(),
                                                            query.name.casefold()):
            expression = dict((name, item.expression) for name, item in
                              ((item.name, item) for item in query.definition.returns)).get(source.attribute)
            if isinstance(expression, ast.Literal):
                values.append((True, expression.value))
                continue
            if not isinstance(expression, ast.AttributeRef):
                return None
            source = expression
        attribute = _attribute_from_event(source, query)
        if attribute is None:
            return None
        values.append((False, attribute))
    return tuple(values)


def _attribute_from_event(source: ast.AttributeRef, query: CompiledQuery) -> str | None:
    """The attribute of the accepting ``event`` that has the value of ``source``, if any:
    ``source`` names the accepting component, or a partition attribute (same value on every
    event of a match)."""
    components = query.definition.pattern.components()
    alias = source.alias.casefold()
    for index, component in enumerate(components):
        if component.name.casefold() == alias:
            stream = query.stream
            attribute = stream.resolve_attribute(query.types[index], source.attribute, None)
            if index == query.accepting or attribute in query.partition:
                return attribute
            return None
    return None
