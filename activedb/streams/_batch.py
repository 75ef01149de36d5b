"""One batch's s-transactions: :class:`STransaction` (Active CEP Def. 7), :class:`BatchRun`
(a ``process`` call's s-transactions, pending state and results, and the ways a scheduler
runs them), :func:`prefetch`.  The design note is ``activedb/streams/README.md`` ("Schedulers").

Thread-safety: ``BatchRun._mutex`` protects the outputs, dead letters, counters and the
pending state's overlay; it is taken after the engine's mutex and never held while user
code, the store or the scheduler runs.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

import sqlalchemy as sa

from lockmgr import Deadlock, LockTimeout

from activedb.errors import (DatabaseUnavailable, DuplicateKey, SchemaError, SerializationConflict,
                             TransactionError)
from activedb.streams._compile import CompiledQuery, CompiledRule, Ctx
from activedb.streams._events import DeadLetter, Output, StreamEvent
from activedb.streams._matcher import Matcher, PartitionState
from activedb.streams._overlay import Overlay
from activedb.streams._state import Pending
from activedb.streams._view import Stamp, StoreView
from activedb.streams.errors import ActionFailed, StreamError

if TYPE_CHECKING:
    from activedb.txn import Transaction
    from activedb.streams._definitions import Definitions
    from activedb.streams._engine import StreamEngine

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


class _once:
    """``functools.cached_property`` without Python 3.11's lock per access (a race computes an equal value)."""

    def __init__(self, function: Callable[[Any], Any]):
        self.function, self.name = function, function.__name__

    def __get__(self, instance: Any, owner: type) -> Any:
        value = instance.__dict__[self.name] = self.function(instance)
        return value


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

    @_once
    def described(self) -> str:
        """``type^ts`` of its event (computed once: every history record and stamp names it)."""
        return self.event.describe()

    @_once
    def plan(self) -> AccessPlan:
        """Algorithm 1's locks for this s-transaction (computed once)."""
        return self.engine.access_plan(self.event)


# --- one batch ----------------------------------------------------------------------------------

# Failures that end the batch, not just the event's s-transaction.
_INFRASTRUCTURE = (DatabaseUnavailable, SerializationConflict, Deadlock, LockTimeout, TransactionError,
                   sa.exc.SQLAlchemyError)


def _event_failure(error: BaseException) -> bool:
    """True if ``error`` is the event's own fault (the event becomes a dead letter), False if
    the batch cannot go on (PostgreSQL unusable, lock trouble, the transaction aborted)."""
    return isinstance(error, (DuplicateKey, StreamError, SchemaError))


class BatchRun:
    """The s-transactions of one ``process`` call and what the scheduler calls to run them."""

    def __init__(self, engine: "StreamEngine", tx: Transaction, pending: Pending, stransactions: list[STransaction], *,
                 serial: int, definitions: "Definitions"):
        self.engine = engine
        self.tx = tx
        self.pending = pending
        self.stransactions = stransactions
        self._mutex = threading.Lock()       # protects outputs, dead_letters, counters, pending.overlay
        self.outputs: list[Output] = []
        self.dead_letters: list[DeadLetter] = []
        self.processed = self.failed = 0
        self.lowered = 0                      # s-transactions run on the overlay (execute_on; SEI's thread only)
        self.view_factory: Callable[[Any, Stamp], Any] = (
            lambda tx, stamp: StoreView(tx, stamp, engine.history, engine.operation_cost))
        self.serial = serial                 # unique across the engine's batches (history unit ids)
        self.definitions = definitions        # the engine's queries and rules (rules_by_query)
        # Invariant: _installed_at[partition] is the position of the s-transaction whose state is in the
        # overlay; a state from an earlier position never replaces a later one (concurrent schedulers may
        # end s-transactions out of order; only those that cannot change a partition's state run unordered).
        self._installed_at: dict[tuple[str, tuple], int] = {}
        #: A concurrent scheduler's answer to "on which state of partition ``key`` of ``query``
        #: is ``stransaction`` matched"; None: the batch's current state (SEI: the previous one's).
        self.state_source: Callable[[STransaction, str, tuple], PartitionState | None] | None = None
        #: Called on the s-transaction's thread as each query matched (its partition's new state,
        #: ``certain`` False), then once all did, before the rules run (every new state, ``certain``:
        #: no rule is left to run): the design note's "Matching order".
        self.on_matched: Callable[[STransaction, dict, bool], None] | None = None
        # Figures per s-transaction matched, run, succeeded (list.append: any thread, no lock): publish_metrics().
        self._matched: list[tuple] = []
        self._bodies: list[tuple] = []
        self._successes: list[tuple] = []

    def partition(self, query: str, key: tuple) -> PartitionState | None:
        with self._mutex:
            return self.pending.partition((query, key))

    def _install(self, touched: dict[tuple[str, tuple], PartitionState], position: int | None) -> None:
        """Precondition: the caller holds ``_mutex``."""
        installed_at = self._installed_at
        for key, state in touched.items():
            if position is not None:
                if installed_at.get(key, -1) > position:
                    continue
                installed_at[key] = position
            self.pending.overlay[key] = state if any(state.buffers) or any(state.runs) else None

    # --- the whole s-transaction (SEI and schedulers that lock ahead) ---------------------------

    def execute(self, stransaction: STransaction, parent: Any = None) -> bool:
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
                touched, outputs = self._body(child, stransaction, unit)
                started = time.perf_counter()
            commit = time.perf_counter() - started      # the commit into the parent
        except BaseException as error:
            self._history("end", unit, stransaction, False)
            if not _event_failure(error):
                raise
            self._failed(stransaction, error)
            return False
        self._history("end", unit, stransaction, True)
        self._succeeded(touched, outputs, stransaction.event.position, commit)
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
            view = overlay.view(Stamp(stransaction.id, stransaction.id, None, event.ts, event.position))
            unit = stransaction.id
        else:
            unit = self._unit(stransaction.id)
            self._history("begin", unit, stransaction)
            view = overlay.view(Stamp(unit, stransaction.id, stransaction.described, event.ts, event.position))
        mark = overlay.mark()
        try:
            touched, outputs = self._body(self.tx, stransaction, unit, view=view)
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
        self._succeeded(touched, outputs, event.position, 0.0)
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
        return Overlay(self.tx, self.engine.history, self.engine.operation_cost)

    def new_unit(self, stransaction: STransaction, attempt: int = 0) -> str:
        """The history unit of ``stransaction`` (of its ``attempt``-th restart) when a scheduler
        runs it with ``execute_in``."""
        return self._unit(f"{stransaction.id}/r{attempt}" if attempt else stransaction.id)

    def execute_in(self, stransaction: STransaction, tx: Transaction, unit: str,
                   ranks: list[int] | None = None) -> tuple:
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

    def finish(self, stransaction: STransaction, unit: str, committed: bool, result: tuple | None) -> None:
        """``stransaction``'s subtransaction (see :meth:`execute_in`) committed or aborted:
        record its end; if committed, its partitions' states and outputs become the batch's."""
        self._history("end", unit, stransaction, committed)
        if committed and result is not None:
            touched, outputs = result
            self._succeeded(touched, outputs, stransaction.event.position)

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
            touched, outputs = self.execute_in(stransaction, tx, unit, [rank])
        except BaseException:
            self._history("end", unit, stransaction, False)
            raise
        # The unit's commit is the caller's (the subtransaction ends when this returns).
        self._history("end", unit, stransaction, True)
        self._succeeded(touched, outputs, None)
        return True

    def _body(self, tx: Transaction, stransaction: STransaction, unit: str, ranks: list[int] | None = None,
              view: Any = None):
        """Match every consuming query (those of ``ranks``, default all), then run the rules on their outputs
        (through ``view``, default the scheduler's view of ``tx``)."""
        clock = time.perf_counter
        event = stransaction.event
        if view is None:
            view = self.view_factory(tx, Stamp(unit, stransaction.id, stransaction.described, event.ts,
                                               event.position))
        touched: dict[tuple[str, tuple], PartitionState] = {}
        produced: list[tuple[int, CompiledQuery, list[Output]]] = []
        evaluated: list[tuple[str, int]] = []            # (query, outputs) for the metrics
        source = self.state_source
        matching = reading = 0.0
        for rank, matcher in stransaction.matchers:
            if ranks is not None and rank not in ranks:
                continue
            query = matcher.query
            key = matcher.partition_key(event)
            started = clock()
            state = self.partition(query.name, key) if source is None else source(stransaction, query.name, key)
            step = matcher.prepare(state, event)
            prepared = clock()
            view.at(0, rank, query.name)
            outputs, state = step.complete(view)
            matching += prepared - started
            reading += clock() - prepared
            evaluated.append((query.name, len(outputs)))
            touched[(query.name, key)] = state
            if self.on_matched is not None:
                self.on_matched(stransaction, {(query.name, key): state}, False)
            produced.append((rank, query, outputs))
        self._matched.append((matching, reading, evaluated))
        rules_by_query = self.definitions.rules_by_query
        if self.on_matched is not None:
            self.on_matched(stransaction, dict(touched),
                            not any(outputs and rules_by_query.get(query.name) for _, query, outputs in produced))
        started = clock()
        rule_latency = 0.0
        instances = 0
        all_outputs = []
        for rank, query, outputs in produced:
            rules = rules_by_query.get(query.name, ())
            for output in outputs:
                all_outputs.append(output)
                for rule in rules:
                    view.at(1, rank, rule.name)
                    _run_rule(rule, output, view)
                    instances += 1
                    rule_latency += clock() - output.sts
        self._bodies.append((instances, rule_latency, view.reads, view.writes, clock() - started))
        return touched, all_outputs

    def publish_metrics(self) -> None:
        """Add the batch's s-transaction figures to the engine's metrics (once: the scheduler has returned)."""
        metrics, matched, bodies, ended = self.engine.metrics, self._matched, self._bodies, self._successes
        self._matched, self._bodies, self._successes = [], [], []
        metrics.queries([item for _, _, evaluated in matched for item in evaluated])
        metrics.phase(match=sum(row[0] for row in matched), reads=sum(row[1] for row in matched),
                      rules=sum(row[4] for row in bodies), commit=sum(row[2] or 0.0 for row in ended))
        metrics.add(rule_instances=sum(row[0] for row in bodies), rule_latency=sum(row[1] for row in bodies),
                    reads=sum(row[2] for row in bodies), writes=sum(row[3] for row in bodies), processed=len(ended),
                    lowered=self.lowered,
                    outputs=sum(row[0] for row in ended), query_latency=sum(row[1] for row in ended))

    def _succeeded(self, touched, outputs: list[Output], position: int | None, commit: float | None = None) -> None:
        latency = 0.0
        for output in outputs:
            arrivals = [event.sts for event in output.constituents if event.sts is not None]
            if arrivals:
                latency += output.sts - max(arrivals)
        self._successes.append((len(outputs), latency, commit))
        with self._mutex:
            self._install(touched, position)
            self.processed += 1
            if self.engine.keep_outputs:
                self.outputs.extend(outputs)

    def _failed(self, stransaction: STransaction, error: BaseException) -> None:
        cause = error if isinstance(error, ActionFailed) else f"{type(error).__name__}: {error}"
        reason = f"s-transaction of {stransaction.event.describe()} aborted: {cause}"
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
    except (StreamError, SchemaError, DuplicateKey, *_INFRASTRUCTURE):
        raise
    except Exception as error:
        raise ActionFailed(f"rule {rule.name} raised {type(error).__name__}: {error}", rule.name) from error


def prefetch(tx: Transaction, stransactions: list[STransaction]) -> None:
    """Load, in one query per table, the rows the batch's access plans name (Algorithm 1
    at work): the s-transactions' reads then need no round trip."""
    keys: dict[str, dict[tuple, None]] = {}
    for stransaction in stransactions:
        if not stransaction.matchers:
            continue
        plan = stransaction.plan
        for resources in (plan.reads, plan.writes):
            for resource in resources:
                key = resource.key
                if key is not None and None not in key:     # a NULL key names no row
                    keys.setdefault(resource.table, {})[key] = None
    for table, wanted in keys.items():
        tx.prefetch(table, list(wanted))
