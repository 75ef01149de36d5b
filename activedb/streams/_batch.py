"""One batch's s-transactions: :class:`STransaction` (Active CEP Def. 7), :class:`BatchRun`
(a ``process`` call's s-transactions, pending state and results, and the ways a scheduler
runs them), :func:`prefetch`.  The design note is ``activedb/streams/README.md`` ("Schedulers").

Thread-safety: ``BatchRun._mutex`` protects the outputs, dead letters, counters and the
pending state's overlay; it is taken after the engine's mutex and never held while user
code, the store or the scheduler runs.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterable, TypeAlias

import sqlalchemy as sa

from activedb.errors import (DatabaseUnavailable, DeadlockDetected, DuplicateKey, LockWaitTimeout, SchemaError,
                             SerializationConflict, TransactionError)
from activedb.lazy import once
from activedb.streams._compile import CompiledRule
from activedb.streams._expressions import Ctx
from activedb.streams._events import DeadLetter, Output, Punctuation, StreamEvent
from activedb.streams._matcher import Matcher, PartitionState
from activedb.streams._overlay import Overlay
from activedb.streams._state import Pending
from activedb.streams._view import Stamp, StoreView
from activedb.streams.errors import ActionFailed, EvaluationError, StreamError

if TYPE_CHECKING:
    from activedb.events import Instant
    from activedb.store import Key
    from activedb.txn import Transaction
    from activedb.streams._definitions import Definitions
    from activedb.streams._engine import StreamEngine

logger = logging.getLogger("activedb.streams")

#: What an s-transaction's queries did: the new state of each partition they matched, and ``(rank, query, outputs)``
#: of each query with outputs, in order.
_Touched: TypeAlias = "dict[tuple[str, Key], PartitionState]"
_Fired: TypeAlias = "list[tuple[int, str, list[Output]]]"
#: An event type's matchers split into those with rules and those without.
_Split: TypeAlias = "tuple[tuple[tuple[int, Matcher], ...], tuple[tuple[int, Matcher], ...]]"

_stamp = functools.partial(tuple.__new__, Stamp)     # Stamp(*fields) without the named tuple's __new__ in Python


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
    punctuation: Punctuation | None    # the released bound after this call


@dataclass(frozen=True)
class Resource:
    """A table (``key`` None) or one row of it."""

    table: str
    key: Key | None = None


@dataclass(frozen=True)
class AccessPlan:
    """What an event's s-transaction may read and write (Active CEP Algorithm 1), derived
    from the definitions alone.  ``opaque``: a Python action declared no tables."""

    reads: frozenset[Resource]
    writes: frozenset[Resource]
    opaque: bool = False


@dataclass
class STransaction:
    """The s-transaction of one released event (Def. 7): ``T.ts = event.ts``; ``plan``: Algorithm 1's locks for
    it (``engine.access_plan(event)``: the engine computes a batch's plans at once)."""

    id: str
    event: StreamEvent
    matchers: tuple[tuple[int, Matcher], ...]        # (query rank, matcher), in query order
    engine: "StreamEngine" = field(repr=False)
    plan: AccessPlan = field(repr=False)

    @property
    def ts(self) -> Instant:
        ts: Instant = self.event.ts            # (a released event's ts: admission checked it)
        return ts

    @once
    def described(self) -> str:
        """``type^ts`` of its event (computed once: every history record and stamp names it)."""
        return self.event.describe()


# --- one batch ----------------------------------------------------------------------------------

# Failures that end the batch, not just the event's s-transaction.
_INFRASTRUCTURE = (DatabaseUnavailable, SerializationConflict, DeadlockDetected, LockWaitTimeout, TransactionError,
                   sa.exc.SQLAlchemyError)


def _event_failure(error: BaseException) -> bool:
    """True if ``error`` is the event's own fault (the event becomes a dead letter), False if
    the batch cannot go on (PostgreSQL unusable, lock trouble, the transaction aborted)."""
    return isinstance(error, (DuplicateKey, StreamError, SchemaError))


class BatchRun:
    """The s-transactions of one ``process`` call and what the scheduler calls to run them."""

    def __init__(self, engine: "StreamEngine", tx: Transaction, pending: Pending, stransactions: list[STransaction], *,
                 serial: int, definitions: "Definitions", one_thread: bool = False):
        self.engine = engine
        self.tx = tx
        self.pending = pending
        self.stransactions = stransactions
        self._mutex = threading.Lock()       # protects outputs, dead_letters, counters, pending.overlay
        self.outputs: list[Output] = []
        self.dead_letters: list[DeadLetter] = []
        self.processed = self.failed = 0
        self.lowered = 0                      # s-transactions run on the overlay (execute_on; SEI's thread only)
        self.view_factory: Callable[[Transaction, Stamp], StoreView] = (
            lambda tx, stamp: StoreView(tx, stamp, engine.history, engine._operation_hook))
        self.serial = serial                 # unique across the engine's batches (history unit ids)
        self.definitions = definitions        # the engine's queries and rules (rules_by_query)
        # Invariant: _installed_at[partition] is the position of the s-transaction whose state is in the
        # overlay; a state from an earlier position never replaces a later one (concurrent schedulers may
        # end s-transactions out of order; only those that cannot change a partition's state run unordered).
        self._installed_at: dict[tuple[str, Key], int] = {}
        #: A concurrent scheduler's answer to "on which state of partition ``key`` of ``query``
        #: is ``stransaction`` matched"; None: the batch's current state (SEI: the previous one's).
        self.state_source: Callable[[STransaction, str, Key], PartitionState | None] | None = None
        #: Called on the s-transaction's thread as each query matched (its partition's new state,
        #: ``certain`` False), then once all did, before the rules run (every new state, ``certain``:
        #: no rule is left to run): the design note's "Matching order".
        self.on_matched: Callable[[STransaction, _Touched, bool], None] | None = None
        #: Set by a scheduler whose reads see versions by position (LWM): an s-transaction some of whose queries
        #: fire no rule runs its queries that have rules, then those rules, then calls ``on_written`` (it will
        #: write nothing more), then its other queries — whose Reads exclude its own Writes (the view's phase 0),
        #: so they read what they would have read first.  The rules keep their order, outputs are reported in
        #: query order: the result is the declared order's (the design note's "Writes first under LWM").
        self.on_written: Callable[[STransaction], None] | None = None
        self._splits: dict[int, _Split | None] = {}       # id(matchers) -> (with rules, without) or None
        # The figures of the s-transactions, one _Figures per thread that runs them (summed by publish_metrics()).
        self._local = threading.local()
        self._figures: list[_Figures] = []
        # ``one_thread``: the scheduler runs every s-transaction in the caller's thread, one after the other, in
        # order (``Scheduler.one_thread``): the batch's state and figures are then used without the mutex, and a
        # partition's new state always comes from a later position than the one it replaces.
        self._alone: _Figures | None = None
        if one_thread:
            self._alone = _Figures()
            self._figures.append(self._alone)

    def _mine(self) -> "_Figures":
        """The calling thread's figures for this batch."""
        try:
            figures: _Figures = self._local.figures
            return figures
        except AttributeError:
            figures = self._local.figures = _Figures()
            with self._mutex:
                self._figures.append(figures)
            return figures

    def partition(self, query: str, key: Key) -> PartitionState | None:
        with self._mutex:
            return self.pending.partition((query, key))

    def _install(self, result: tuple[_Touched, _Fired], position: int | None) -> None:
        """A committed s-transaction's partition states and outputs become the batch's (``position`` None: every
        state is newer than the one it replaces).  Precondition: the caller holds ``_mutex``, or the batch runs in
        one thread (``one_thread``)."""
        touched, fired = result
        installed_at = self._installed_at
        put = self.pending.put
        for key, state in touched.items():
            if position is not None:
                if installed_at.get(key, -1) > position:
                    continue
                installed_at[key] = position
            put(key, state if any(state.buffers) or any(state.runs) else None)
        self.processed += 1
        if fired and self.engine.keep_outputs:
            for _, _, outputs in fired:
                self.outputs.extend(outputs)

    # --- the whole s-transaction (SEI and schedulers that lock ahead) ---------------------------

    def execute(self, stransaction: STransaction, parent: Transaction | None = None) -> bool:
        """Run ``stransaction`` as one subtransaction of ``parent`` (default: the batch's
        transaction).  True if it committed; False if it aborted (its event is then a dead
        letter).  Raises only when the batch cannot go on."""
        if not stransaction.matchers:       # no query consumes the event: an empty s-transaction
            self.count_empty()
            return True
        unit = self._unit(stransaction.id)
        self._history("begin", unit, stransaction)
        parent = self.tx if parent is None else parent
        subtransaction = parent.subtransaction(name=f"s-transaction {stransaction.described}")
        try:
            with subtransaction as child:
                result = self._body(child, stransaction, unit)
                started = time.perf_counter()
            commit = time.perf_counter() - started      # the commit into the parent
        except BaseException as error:
            self._history("end", unit, stransaction, False)
            if not _event_failure(error):
                raise
            self._failed(stransaction, error)
            return False
        self._history("end", unit, stransaction, True)
        self._succeeded(result, stransaction.event.position, commit)
        return True

    def execute_on(self, stransaction: STransaction, overlay: Overlay) -> bool:
        """Run ``stransaction`` on the batch's ``overlay`` (SEI without a subtransaction per event: the design
        note's "SEI without a subtransaction per event"; precondition: ``overlay.takes(stransaction)``).  What
        :meth:`execute` does, with the overlay's undo log in place of the subtransaction: True if it committed,
        False if it aborted (its changes undone, its event a dead letter).  Raises only when the batch cannot go on."""
        if not stransaction.matchers:
            self.count_empty()
            return True
        self.lowered += 1
        event = stransaction.event
        history = self.engine.history
        if history is None:         # (a unit and the event's text name history records only)
            view = overlay.view(_stamp((stransaction.id, stransaction.id, None, event.ts, event.position)))
            unit = stransaction.id
        else:
            unit = self._unit(stransaction.id)
            self._history("begin", unit, stransaction)
            view = overlay.view(Stamp(unit, stransaction.id, stransaction.described, event.ts,
                                      event.position))  # type: ignore[arg-type]  # (released: has one)
        mark = overlay.mark()
        try:
            result = self._body(self.tx, stransaction, unit, view=view)
        except BaseException as error:
            overlay.rollback(mark)
            if history is not None:
                self._history("end", unit, stransaction, False)
            if not _event_failure(error):
                raise
            self._failed(stransaction, error)
            return False
        overlay.keep()
        if history is not None:
            self._history("end", unit, stransaction, True)
        self._succeeded(result, event.position, 0.0)
        return True

    def overlay(self) -> Overlay | None:
        """The overlay SEI runs this batch's s-transactions on, or None when it must give each its own
        subtransaction: the engine was made with ``lowered=False``, or something listens to subtransactions
        (an extension's hooks for frames, an observer of node events, the transaction history recorder)."""
        if not self.engine.lowered:
            return None
        manager = self.tx.manager
        extensions, observers = manager.extensions, manager.observers
        if (manager.recorder is not None or extensions.on_begin_in_frames or extensions.before_commit_in_frames
                or extensions.after_end_in_frames or observers.on_begin or observers.on_spawn
                or observers.on_commit or observers.on_abort):
            return None
        return Overlay(self.tx, self.engine.history, self.engine._operation_hook)

    def new_unit(self, stransaction: STransaction, attempt: int = 0) -> str:
        """The history unit of ``stransaction`` (of its ``attempt``-th restart) when a scheduler
        runs it with ``execute_in``."""
        return self._unit(f"{stransaction.id}/r{attempt}" if attempt else stransaction.id)

    def execute_in(self, stransaction: STransaction, tx: Transaction, unit: str,
                   ranks: list[int] | None = None) -> tuple[_Touched, _Fired]:
        """Run the s-transaction's queries (those of ``ranks``, default all), then the rules on
        their outputs, in ``tx``, a subtransaction the scheduler made for it (e.g. spawned on a
        worker thread).  The caller's subtransaction ends it: when it has committed or aborted,
        the scheduler calls :meth:`finish` with what this returned.  Raises the event's failure
        as a StreamError (after recording the dead letter) so that ``tx`` aborts, and
        infrastructure errors as they are."""
        self._history("begin", unit, stransaction)
        try:
            return self._body(tx, stransaction, unit, ranks)
        except BaseException as error:
            if _event_failure(error):
                self._failed(stransaction, error)
                if not isinstance(error, StreamError):
                    raise ActionFailed(str(error), rule="") from error
            raise

    def finish(self, stransaction: STransaction, unit: str, committed: bool,
               result: tuple[_Touched, _Fired] | None) -> None:
        """``stransaction``'s subtransaction (see :meth:`execute_in`) committed or aborted:
        record its end; if committed, its partitions' states and outputs become the batch's."""
        self._history("end", unit, stransaction, committed)
        if committed and result is not None:
            self._succeeded(result, stransaction.event.position)

    def withdraw(self, stransaction: STransaction) -> None:
        """A scheduler runs ``stransaction`` again: the dead letter its failed attempt left goes."""
        with self._mutex:
            self.failed -= 1
            self.dead_letters = [letter for letter in self.dead_letters if letter.event is not stransaction.event]
        self.engine.metrics.add(failed=-1, dead_letters=-1)

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

    def _history(self, step: str, unit: str, stransaction: STransaction, *committed: bool) -> None:
        """Record the ``begin`` or ``end`` (with ``committed``) of ``unit`` in the engine's history."""
        history = self.engine.history
        if history is not None:
            event = stransaction.event
            record = history.begin if step == "begin" else history.end
            record(unit, stransaction.id, stransaction.described, event.ts, (event.position, ()), *committed)

    def execute_unit(self, stransaction: STransaction, rank: int, tx: Transaction) -> bool:
        """Run only the query of ``rank`` (and the rules on its outputs) in ``tx`` itself, as
        its own unit — the unscheduled mode.  Raises the event's failure as a StreamError
        (after recording the dead letter) so that ``tx`` aborts."""
        unit = self._unit(f"{stransaction.id}/{rank}")
        try:
            result = self.execute_in(stransaction, tx, unit, [rank])
        except BaseException:
            self._history("end", unit, stransaction, False)
            raise
        # The unit's commit is the caller's (the subtransaction ends when this returns).
        self._history("end", unit, stransaction, True)
        self._succeeded(result, None)
        return True

    def _body(self, tx: Transaction, stransaction: STransaction, unit: str, ranks: list[int] | None = None,
              view: StoreView | None = None) -> tuple[_Touched, _Fired]:
        """Match every consuming query (those of ``ranks``, default all), then run the rules on their outputs
        (through ``view``, default the scheduler's view of ``tx``).  Returns ``(touched, fired)``: the new state
        of each partition it matched, and ``(rank, query, outputs)`` for each query with outputs, in order."""
        clock = time.perf_counter
        event = stransaction.event
        if view is None:
            view = self.view_factory(tx, Stamp(unit, stransaction.id, stransaction.described, event.ts,
                                               event.position))  # type: ignore[arg-type]
        alone = self._alone
        figures = alone or self._mine()
        # One thread: the batch's partition states are read without the mutex (Pending.partition, inline).
        states, saved = (self.pending.overlay, self.pending.base.partitions) if alone is not None else (None, None)
        stepped = self.engine.history is not None      # (the view's steps order history records only)
        evaluations = figures.evaluations
        touched: dict[tuple[str, Key], PartitionState] = {}
        fired: list[tuple[int, str, list[Output]]] = []
        source, on_matched = self.state_source, self.on_matched
        rules_by_query = self.definitions.rules_by_query
        split = self.split_by_rules(stransaction.matchers) if self.on_written is not None and ranks is None else None
        # Normally one group: every query, then the rules.  Split (writes first): the queries with rules, their
        # rules, ``on_written``, then the queries without rules, at phase 0 (stepped: the view's phase is set).
        groups = split or (stransaction.matchers,)
        stepped = stepped or split is not None
        matching = reading = 0.0
        started = clock()
        for group in groups:
            for rank, matcher in group:
                if ranks is not None and rank not in ranks:
                    continue
                name = matcher.query.name
                key = matcher.partition_key(event)
                if source is not None:
                    state = source(stransaction, name, key)
                elif states is not None:
                    partition = (name, key)
                    state = states[partition] if partition in states else saved.get(partition)  # type: ignore[union-attr]
                else:
                    state = self.partition(name, key)
                try:
                    step = matcher.prepare(state, event)
                    prepared = clock()
                    if stepped:
                        view.at(0, rank, name)
                    outputs, state = step.complete(view)
                except EvaluationError as error:        # (the event's dead letter: say which query to look at)
                    raise EvaluationError(f"query {name} cannot be evaluated on {event.describe()}: {error}; correct "
                                          f"the event or the query") from error
                ended = clock()
                matching += prepared - started
                reading += ended - prepared
                started = ended
                touched[(name, key)] = state
                counters = evaluations.get(name)
                if counters is None:
                    counters = evaluations[name] = [0, 0]
                counters[0] += 1
                if outputs:
                    counters[1] += len(outputs)
                    fired.append((rank, name, outputs))
                if on_matched is not None:
                    on_matched(stransaction, {(name, key): state}, False)
                    started = clock()
            if split is not None and group is split[0]:
                figures.match += matching
                figures.reads += reading
                matching = reading = 0.0
                self._run_rules(fired, view, figures, started)
                self.on_written(stransaction)  # type: ignore[misc]
                started = clock()
        figures.match += matching
        figures.reads += reading
        if on_matched is not None:
            on_matched(stransaction, dict(touched), not any(rules_by_query.get(name) for _, name, _ in fired))
            started = clock()
        if split is not None:
            fired.sort(key=_rank)             # (outputs in query order; the rules ran, in that order)
        elif fired:
            self._run_rules(fired, view, figures, started)
        figures.store_reads += view.reads
        figures.store_writes += view.writes
        return touched, fired

    def _run_rules(self, fired: list[tuple[int, str, list[Output]]], view: StoreView, figures: "_Figures",
                   started: float) -> None:
        """Run the rules on ``fired``'s outputs, per query and output in order, per output by rule priority."""
        if not fired:
            return
        clock = time.perf_counter
        rules_by_query = self.definitions.rules_by_query
        instances = 0
        rule_latency = 0.0
        for rank, name, outputs in fired:
            rules = rules_by_query.get(name, ())
            for output in outputs:
                for rule in rules:
                    view.at(1, rank, rule.name)
                    _run_rule(rule, output, view)
                    instances += 1
                    rule_latency += clock() - output.sts
        figures.rules += clock() - started
        figures.instances += instances
        figures.rule_latency += rule_latency

    def split_by_rules(self, matchers: tuple[tuple[int, Matcher], ...]) -> _Split | None:
        """``(queries with rules, queries without)`` of an event type's queries, if it has both; else None."""
        found = self._splits.get(id(matchers), _UNSPLIT)
        if found is _UNSPLIT:
            rules_by_query = self.definitions.rules_by_query
            with_rules = tuple(item for item in matchers if rules_by_query.get(item[1].query.name))
            without = tuple(item for item in matchers if not rules_by_query.get(item[1].query.name))
            found = self._splits[id(matchers)] = (with_rules, without) if with_rules and without else None
        return found  # type: ignore[return-value]  # (not _UNSPLIT now)

    def publish_metrics(self) -> None:
        """Add the batch's s-transaction figures to the engine's metrics (once: the scheduler has returned)."""
        with self._mutex:
            all_figures, self._figures = self._figures, []
            self._local = threading.local()
        metrics = self.engine.metrics
        for figures in all_figures:
            metrics.queries(figures.evaluations)
        metrics.phase(**{phase: sum(getattr(figures, phase) for figures in all_figures)
                         for phase in ("match", "reads", "rules", "commit")})
        metrics.add(lowered=self.lowered, **{counter: sum(getattr(figures, field) for figures in all_figures)
                                             for counter, field in _COUNTERS})

    def _succeeded(self, result: tuple[_Touched, _Fired], position: int | None, commit: float | None = None) -> None:
        """The s-transaction that ``_body`` returned ``result`` for committed: its partitions' states and outputs
        become the batch's."""
        fired = result[1]
        alone = self._alone
        figures = alone or self._mine()
        figures.processed += 1
        if commit:
            figures.commit += commit
        if fired:
            latency = 0.0
            for _, _, outputs in fired:
                figures.outputs += len(outputs)
                for output in outputs:
                    arrivals = [event.sts for event in output.constituents if event.sts is not None]
                    if arrivals:
                        latency += output.sts - max(arrivals)
            figures.query_latency += latency
        if alone is not None:         # (one thread, in order: no mutex, and every state is newer than the last)
            self._install(result, None)
            return
        with self._mutex:
            self._install(result, position)

    def _failed(self, stransaction: STransaction, error: BaseException) -> None:
        cause = error if isinstance(error, ActionFailed) else f"{type(error).__name__}: {error}"
        reason = f"s-transaction of {stransaction.event.describe()} aborted: {cause}"
        logger.info("%s", reason)
        with self._mutex:
            self.failed += 1
            self.dead_letters.append(DeadLetter(stransaction.event, reason))
        self.engine.metrics.add(failed=1, dead_letters=1)


_UNSPLIT = object()


def _rank(item: tuple[int, str, list[Output]]) -> int:
    return item[0]


class _Figures:
    """One thread's figures of a batch's s-transactions: seconds per phase, counts and latencies, evaluations and
    outputs per query (``evaluations[query] = [evaluations, outputs]``).  Only its thread changes it."""

    __slots__ = ("match", "reads", "rules", "commit", "rule_latency", "query_latency", "instances", "store_reads",
                 "store_writes", "processed", "outputs", "evaluations")

    def __init__(self) -> None:
        self.match = self.reads = self.rules = self.commit = self.rule_latency = self.query_latency = 0.0
        self.instances = self.store_reads = self.store_writes = self.processed = self.outputs = 0
        self.evaluations: dict[str, list[int]] = {}


# The metrics' counters (Metrics.add) and the _Figures fields they sum.
_COUNTERS = (("rule_instances", "instances"), ("rule_latency", "rule_latency"), ("reads", "store_reads"),
             ("writes", "store_writes"), ("processed", "processed"), ("outputs", "outputs"),
             ("query_latency", "query_latency"))


def _run_rule(rule: CompiledRule, output: Output, view: StoreView) -> None:
    ctx = Ctx(output, view)
    try:
        if rule.when is not None and rule.when(ctx) is not True:
            return
        for action in rule.actions:
            action(ctx)
    except EvaluationError as error:        # (its WHEN or an action's expression: the event's dead letter says whose)
        raise EvaluationError(f"rule {rule.name} cannot be evaluated on the output {output.describe()}: {error}; "
                              f"correct the event or the rule") from error
    except (StreamError, SchemaError, DuplicateKey, *_INFRASTRUCTURE):
        raise
    except Exception as error:
        raise ActionFailed(f"rule {rule.name} raised {type(error).__name__}: {error}", rule.name) from error


def prefetch(tx: Transaction, stransactions: list[STransaction]) -> None:
    """Load, in one query per table, the rows the batch's access plans name (Algorithm 1
    at work): the s-transactions' reads then need no round trip."""
    keys: dict[str, dict[Key, None]] = {}
    seen: set[int] = set()          # the plans looked at (events on the same keys share one: Definitions)
    for stransaction in stransactions:
        if not stransaction.matchers:
            continue
        plan = stransaction.plan
        if id(plan) in seen:
            continue
        seen.add(id(plan))
        for resources in (plan.reads, plan.writes):
            for resource in resources:
                key = resource.key
                if key is not None and None not in key:     # a NULL key names no row
                    keys.setdefault(resource.table, {})[key] = None
    for table, wanted in keys.items():
        tx.prefetch(table, loadable(tx, table, wanted))


def loadable(tx: Transaction, table: str, keys: Iterable[Key]) -> list[Key]:
    """The keys of ``keys`` that ``table`` takes: a plan's key the table refuses (HCW-ID 5 for a text key) stays in
    the plan as given (``Definitions.access_plans``) and its operation fails, the event's dead letter saying why —
    loaded ahead with the others, it would fail the whole batch."""
    info = tx.manager.catalog.table_info(table)
    taken = []
    for key in keys:
        try:
            info.key(key)
        except SchemaError:
            continue
        taken.append(key)
    return taken
