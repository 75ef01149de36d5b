"""The rule manager (``db.rules``): the registry's public face, and the extension through which rules fire
inside transactions — dispatch, priority groups, immediate and deferred execution.  Design: ``README.md``.

Thread-safety: the manager has no mutex of its own; the firing record, the registry and the detached
runner have theirs.  No user code, logging or gate wait runs under any of them.
"""

from __future__ import annotations

import itertools
import logging
import sys
import weakref
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, NoReturn, TypeVar

from coupling import Coupling, DeferredCycleLimitExceeded, Verdict, priority_groups

from activedb.errors import (CascadeLimitExceeded, DeadlockDetected, RuleError, RuleFailed, TransactionAborted,
                             check_switch, shown_error)
from activedb.events import Event, EventKind, Origin, new_event
from activedb.rules._context import RuleContext, chain_of, defer
from activedb.rules._detached import DetachedRunner, DependencyAbort
from activedb.rules._model import (Fired, Firing, Rule, RuleCounter, RuleExecution, RulesStatistics, always,
                                   check_body_ran)
from activedb.rules._parallel import condition_then_action
from activedb.rules._record import FiringRecord
from activedb.rules._registry import RuleRegistry
from activedb.store import own_image
from activedb.txn import (FiringOutcome, Transaction, TransactionExtension, TxnState, run_group, run_inline, set_slot,
                          slot, stack_is_deep, wait_children, want_end_hooks)

if TYPE_CHECKING:  # pragma: no cover
    from coupling import DeferredQueue

    from activedb.store import Catalog
    from activedb.txn import TransactionManager

logger = logging.getLogger("activedb.rules")

_ABORTED = TxnState.ABORTED
_EXECUTED, _CONDITION_FALSE, _FAILED, _CANCELLED = (FiringOutcome.EXECUTED, FiringOutcome.CONDITION_FALSE,
                                                   FiringOutcome.FAILED, FiringOutcome.CANCELLED)
_IMMEDIATE, _DEFERRED = Coupling.IMMEDIATE, Coupling.DEFERRED
_ACTIVEDB = Origin.ACTIVEDB
#: The errors the rule manager raised itself: the ``RuleFailed`` of a nested firing's failure (``_raise_failure``) and
#: the ``CascadeLimitExceeded`` of its cascade limits (``_limit``).  An action that lets one through passes it on —
#: cancelled —, told apart from the same error a rule raises of its own making — failed.
_RAISED_BY_RULES: "weakref.WeakSet[RuleFailed | CascadeLimitExceeded]" = weakref.WeakSet()


class RuleManager(TransactionExtension):
    """The rules of one ``Database``; ``db.rules``.  Thread-safe (see the module docstring)."""

    def __init__(self, catalog: "Catalog", transactions: "TransactionManager", *, max_cascade_depth: int = 16,
                 max_deferred_cycles: int = 100, execution: RuleExecution = RuleExecution.THREADS):
        execution = RuleExecution.parse(execution, "RuleManager(execution=...)")
        self.transactions = transactions
        self.registry = RuleRegistry(catalog)
        self.max_cascade_depth = max_cascade_depth
        self.max_deferred_cycles = max_deferred_cycles
        self.execution = execution
        self.record = FiringRecord()
        self._numbers = itertools.count(1)
        self._plans: dict[tuple[Rule, ...], _Plan] = {}       # per matching rule set (``on_event``)
        self._orders: dict[tuple[Rule, ...], _Order] = {}     # per rule set of a deferred cycle (``_run_groups``)
        # ``_execute`` bound once: what ``run_inline`` calls per firing (loading ``self._execute`` makes a new bound
        # method object each time).
        self._run_firing = self._execute
        self.detached = DetachedRunner(self, transactions)
        self.gate = self.detached.gate
        transactions.extensions.add(self)

    # --- the registry, publicly -------------------------------------------------------------

    def add(self, rule: Rule, *, replace: bool = False) -> Rule:
        """Validate, register and persist ``rule``; returns it.  (Recorded firings of it that no living
        process runs — e.g. left by a process that died — are claimed and run soon after.)  Refused once the
        ``Database`` is closed."""
        check_switch("db.rules.add", "replace", replace, error=RuleError)   # ("false" is true: it would replace)
        if self.transactions.pool.closed:      # (its engine would still write the row: a rule that never fires)
            raise RuleError("this Database is closed: a rule declared on it would never fire (no transaction starts "
                            "on it, its outbox is stopped); call activedb.connect() again and declare the rule on the "
                            "new Database")
        added = self.registry.add(rule, replace=replace, manager=self)
        self._plans, self._orders = {}, {}      # (a rule added again may have another coupling or priority)
        self.detached.rules_changed()
        return added

    def remove(self, name: str) -> None:
        """Stop rule ``name`` firing here and mark it removed in ``activedb_rules`` (also a rule only
        persisted, declared by another process); a later declaration brings it back."""
        self.registry.remove(name)
        self._plans, self._orders = {}, {}
        self.detached.rules_changed()

    def purge(self, names: Iterable[str]) -> int:
        """Delete the persisted rows of ``names`` (see ``RuleRegistry.purge``); returns how many."""
        return self.registry.purge(names)

    def enable(self, name: str) -> None:
        """Enable ``name`` here (if declared) and in ``activedb_rules``."""
        self.registry.set_enabled(name, True)

    def disable(self, name: str) -> None:
        """Disable ``name`` here (if declared) and in ``activedb_rules``."""
        self.registry.set_enabled(name, False)

    def get(self, name: str) -> Rule:
        return self.registry.get(name)

    def names(self) -> list[str]:
        return self.registry.names()

    def __iter__(self) -> Iterator[Rule]:
        return iter(self.registry)

    def persisted(self, *, include_removed: bool = True, module: str | None = None) -> list[dict[str, Any]]:
        """The registry as stored in PostgreSQL (every rule ever declared on this database); see
        ``RuleRegistry.persisted`` for the filters."""
        return self.registry.persisted(include_removed=include_removed, module=module)

    def firing_counts(self) -> dict[str, dict[str, Any]]:
        """Per rule name, firings recorded by committed transactions (``activedb_transaction_log``):
        ``{"fired": n, "last": datetime of the last such commit}``."""
        return self.registry.firing_counts()

    def observes(self, table: str) -> bool:
        """Whether an enabled rule reacts to data events (insert/update/delete) on ``table``: a
        writer that bypasses the transaction tree (e.g. a batch written at commit) would keep
        those rules from firing, so it must write through the tree when this is true."""
        return table in self.registry.observed_tables

    def stream_types(self) -> frozenset[str]:
        """The stream event types enabled rules listen to (``db.stream(type)``)."""
        return self.registry.stream_types()

    def observed_tables(self) -> frozenset[str]:
        """The tables whose data events (insert/update/delete) enabled rules react to (see :meth:`observes`)."""
        return self.registry.observed_tables

    def on_stream(self, event_type: str) -> tuple[Rule, ...]:
        """The enabled rules a stream event of ``event_type`` (``db.stream(event_type)``) fires, in the
        order the dispatch fires them."""
        return self.registry.matching(Event(EventKind.STREAM, event_type))

    def fired_by(self, kind: EventKind, source: str) -> tuple[Rule, ...]:
        """The enabled rules an event of ``kind`` from ``source`` fires (a signal's name, a table's data event), in
        the order the dispatch fires them."""
        return self.registry.matching(Event(kind, source))

    def fired_in_bulk(self, transaction: Transaction, rule: Rule, count: int) -> None:
        """Record ``count`` firings of ``rule`` dispatched in ``transaction``'s tree that its caller runs
        in a lowered form instead of one subtransaction each (``activedb.batch``, "Declared rules"): they
        count as fired in the tree's firing record (its transaction-log row) as dispatched ones do.  The
        caller adds ``executed`` and ``failed`` (:meth:`count`) once it knows them.  A negative ``count`` takes back
        firings recorded so (a flush tried again records its own attempt's)."""
        if count:
            root = transaction.root
            self.record.dispatched_many(root, slot(root, RuleContext), rule, count)

    def firings_in(self, transaction: Transaction) -> dict[str, int]:
        """Per rule, how many firings were dispatched in ``transaction``'s tree so far."""
        context = slot(transaction.root, RuleContext, create=False)
        return dict(context.firings) if context is not None and context.firings else {}

    def statistics(self) -> RulesStatistics:
        counters, per_mode = self.record.snapshot()
        return RulesStatistics(rules=len(self.registry), enabled=sum(rule.enabled for rule in self.registry),
                               per_rule=counters, per_mode=per_mode, detached_running=self.detached.running)

    def wait_idle(self, timeout: float | None = 30.0) -> None:
        """Wait until every detached-family firing recorded so far by this process has run; raises
        :class:`~activedb.errors.WaitTimeout` (a ``TimeoutError``) naming the rules still running after ``timeout``
        seconds (None: no limit)."""
        self.detached.wait_idle(timeout)

    def count(self, rule: Rule, what: RuleCounter, amount: int = 1) -> None:
        self.record.count(rule.name, what, amount)

    # --- the extension hooks -------------------------------------------------------------------

    #: A frame's hooks would do nothing here unless it has a deferred queue (``deferred_queue_for`` gives it
    #: one and asks for its end hooks: ``want_end_hooks``) or executed firings to pass on (``_record_executed`` asks
    #: too); gate keys are a spawned child's or a top-level's.
    frame_hooks = False

    def wants_old_images(self, table: str) -> bool:
        return table in self.registry.observed_tables      # (``observes``, without its call: every write asks)

    def on_begin(self, transaction: Transaction) -> None:
        if transaction.parent is None and self.registry.by_kind.get(EventKind.BEGAN):
            self.on_event(transaction, Event(EventKind.BEGAN, transaction.name, transaction=transaction.id))

    def before_commit(self, transaction: Transaction) -> None:
        context = slot(transaction, RuleContext, create=False)
        if context is not None:
            queue = context.deferred_queue
            if queue is not None:
                self._run_deferred(transaction, queue)
            if context.gate_key is not None:
                verdict = self.detached.wait_may_commit(transaction, context)
                if verdict is not Verdict.COMMIT:
                    # (A gated tree has its firing: the gate key comes from it.)
                    coupling = slot(transaction, Firing, create=False).coupling  # type: ignore[union-attr]
                    raise DependencyAbort(f"{coupling.value} dependency of {transaction.id} says abort")
        if transaction.parent is None and self.registry.by_kind.get(EventKind.COMMITTED):
            # Rules on this transaction's commit (all of the detached family) fire now, just before its
            # flush, so that the outbox records them in it: they run if and only if the commit happens.
            self.on_event(transaction, Event(EventKind.COMMITTED, transaction.name, payload=dict(transaction.info),
                                             transaction=transaction.id))

    def _run_deferred(self, transaction: Transaction, queue: "DeferredQueue[Firing]") -> None:
        """Run ``queue``, the deferred firings waiting for ``transaction``'s commit, cycle after cycle, once its
        children ended (then the queue is closed)."""
        wait_children(transaction)
        try:
            for cycle in queue.cycles():
                # (The cycle's firings as they are: iterating it makes a ``DeferredFiring`` of each.)
                self._run_groups(transaction, list(cycle.firings), f"deferred cycle {cycle.number}")
        except DeferredCycleLimitExceeded as error:
            self._never_ran(error.pending)  # type: ignore[arg-type]  # (the queue's firings)
            raise _limit(CascadeLimitExceeded(
                f"deferred rules of {transaction.id} kept firing each other for {queue.max_cycles} cycles; "
                f"break the cycle or raise max_deferred_cycles", [str(error)])) from error

    def after_end(self, transaction: Transaction, committed: bool) -> None:
        context = slot(transaction, RuleContext, create=False)
        if not committed and context is not None and context.deferred_queue is not None:
            # Its deferred firings were waiting for its commit: stopped by that dependency, they count cancelled.
            self._never_ran(context.deferred_queue.discard())
        if context is not None and context.gate_report is not None:
            self.detached.transaction_ended(transaction, committed)
            held = context.held_deferred
            if held and committed and transaction.parent is not None:
                # A C-A action of a deferred firing committed: the deferred firings it raised join their queue now
                # (``defer``; dropped had it aborted).  Its parent, the firing, is still running.
                context.held_deferred = None
                for firing in held:
                    defer(transaction.parent, firing, self.max_deferred_cycles)
            elif held and not committed:
                # Its events undone with it, the deferred firings it raised never run.
                context.held_deferred = None
                self._never_ran(held)
        if transaction.parent is not None:
            if context is not None and context.executed is not None:
                # Firings that ran and committed under it: its parent's now, or undone by its abort — cancelled.
                parent = transaction.parent if committed else None
                if parent is not None and parent.parent is not None:
                    want_end_hooks(parent)      # (a frame's end too, to pass them on in turn)
                self.record.passed_on(context, None if parent is None else slot(parent, RuleContext))
            return
        if not committed and self.registry.by_kind.get(EventKind.ABORTED):
            # (Also when the abort may hide a commit, ``outcome_unknown``: the firings, all of the detached family,
            # go to the recorder, which settles them by the tree's log row.)
            event = Event(EventKind.ABORTED, transaction.name, payload=dict(transaction.info),
                          transaction=transaction.id)
            try:
                self.on_event(transaction, event, ended=True)
            except Exception as error:   # the transaction has ended: report, never undo its outcome
                logger.error("rules on %s could not be fired: %s", event.describe(), shown_error(error))
        self.record.fold(transaction)

    # --- dispatch ----------------------------------------------------------------------------

    def firing(self, rule: Rule, event: Event) -> Firing:
        """A firing of ``rule`` on ``event`` as the dispatch makes it for an event emitted at the top of a tree
        (numbered by this manager; not recorded): for a batch that dispatches its events' detached-family rules
        without a transaction per event (``activedb.batch.apply_lowered``)."""
        return Firing(rule, event, (rule.name,), rule.coupling, next(self._numbers))

    def on_event(self, transaction: Transaction, event: Event, *, ended: bool = False) -> None:
        """Dispatch: fire the rules matching ``event``, which occurred in ``transaction`` (``ended``: an
        event of a transaction that has ended, its ``aborted``)."""
        registry = self.registry
        # (``registry.matching``'s remembered answer, without its call; it answers what it has not remembered.)
        rules = registry._matching.get((event.kind, event.source)) if event.origin is _ACTIVEDB else None
        if rules is None:
            rules = registry.matching(event)
        if not rules:
            return
        root = transaction.root
        tree = slot(root, RuleContext)       # the tree's firing record
        # (``chain_of(transaction)``, without its call.)
        node: Transaction | None = transaction
        chain: tuple[str, ...] = ()
        while node is not None:
            nearest = slot(node, Firing, create=False)
            if nearest is not None:
                chain = nearest.chain
                break
            node = node.parent
        if len(chain) >= self.max_cascade_depth:
            names = " -> ".join((*chain, "|".join(rule.name for rule in rules)))
            raise _limit(CascadeLimitExceeded(
                f"rule cascade deeper than {self.max_cascade_depth} in transaction {transaction.id}: {names}; "
                f"break the cycle or raise max_cascade_depth", [*chain, *(rule.name for rule in rules)]))
        if len(chain) >= _STACK_CHECKED_FROM and stack_is_deep(0.75):
            # Each immediate firing runs inside the call of the one that fired it: stop while the rest of the stack
            # still holds a level (a firing, its action, the SQL under it), not at a RecursionError wherever it hits.
            names = " -> ".join((*chain, "|".join(rule.name for rule in rules)))
            raise _limit(CascadeLimitExceeded(
                f"rule cascade {len(chain) + 1} deep in transaction {transaction.id} nests deeper than Python's "
                f"recursion limit (sys.getrecursionlimit() = {sys.getrecursionlimit()}) allows, below "
                f"max_cascade_depth={self.max_cascade_depth}: {names}; each immediate firing runs inside the one that "
                f"fired it: break the cycle, make a rule of it deferred (deferred firings run in cycles, one after "
                f"another), or lower max_cascade_depth (or raise sys.setrecursionlimit)",
                [*chain, *(rule.name for rule in rules)]))
        if len(rules) == 1:                 # the common case, without the comprehension's call and lists
            rule = rules[0]
            firing = Firing(rule, event, chain + (rule.name,), rule.coupling, next(self._numbers))
            if firing.coupling is _IMMEDIATE:
                # One group of one firing, without _run_groups' loops, counted once it has ended (README,
                # "The firing record").
                executed = False
                try:
                    name = _NAMES.get(rule.name) or _transaction_name(rule)       # (its call only the first time)
                    executed = run_inline(transaction, self._run_firing, firing, name, Firing)
                except DependencyAbort:
                    pass
                except BaseException as error:
                    _raise_failure(firing, error, "immediate")
                finally:
                    if executed and transaction is not root:
                        # (Under a subtransaction, whose abort would undo it: recorded there, ``_record_executed``.)
                        self.record.ran(root, tree, rule, False)
                        self._record_executed(transaction, [rule.name])
                    else:
                        self.record.ran(root, tree, rule, executed)
                return
            self.record.dispatched(root, tree, rules)
            if firing.coupling is _DEFERRED:
                defer(transaction, firing, self.max_deferred_cycles)
            else:
                self.detached.start(transaction, firing, ended=ended)
            return
        plan = self._plans.get(rules) or _remember(self._plans, rules, _Plan)
        self.record.dispatched(root, tree, rules)
        numbers = self._numbers
        # Each firing its own event (``own_event``): a rule that changes its event changes no other rule's.
        firings = [Firing(rule, event if index == 0 else own_event(event), chain + (rule.name,), rule.coupling,
                          next(numbers)) for index, rule in enumerate(rules)]
        if plan.others:
            for index in plan.others:
                firing = firings[index]
                if firing.coupling is _DEFERRED:
                    defer(transaction, firing, self.max_deferred_cycles)
                else:
                    self.detached.start(transaction, firing, ended=ended)
        if plan.groups is not None:
            self._run_in_groups(transaction, [[firings[index] for index in group] for group in plan.groups],
                                "immediate")
        elif plan.order:
            self._run_each(transaction, firings, plan.order, plan.names, "immediate")

    def _run_groups(self, transaction: Transaction, firings: list[Firing], what: str) -> None:
        """Run firings as children of ``transaction``: priority groups in order, a group concurrently.  (Several
        firings whose priorities all differ — a deferred cycle's alert and audit rules — run one after the other,
        in the order planned once for their rule set: ``_Order``.)"""
        if len(firings) > 1:
            rules = tuple([firing.rule for firing in firings])
            order = self._orders.get(rules) or _remember(self._orders, rules, _Order)
            if order.order:
                self._run_each(transaction, firings, order.order, order.names, what)
                return
        if len(firings) > 1:
            self._run_in_groups(transaction, priority_groups(firings), what)
        else:
            self._run_group(firings, transaction, what)

    def _run_in_groups(self, transaction: Transaction, groups: list[list[Firing]], what: str) -> None:
        """Run ``groups`` (priority groups, highest first) one after the other; a group that raises stops the rest,
        whose firings, never run, count ``cancelled`` (what stopped them was another firing's failure)."""
        for number, group in enumerate(groups):
            try:
                self._run_group(group, transaction, what)
            except BaseException:
                self._never_ran([firing for later in groups[number + 1:] for firing in later])
                raise

    def _never_ran(self, firings: "Iterable[Firing]") -> None:
        """``firings``, dispatched, will never run (a firing before them failed, their trigger or the queue holding
        them ended first): each counted ``cancelled``, its one outcome."""
        for firing in firings:
            self.count(firing.rule, "cancelled")

    def _run_group(self, group: list[Firing], transaction: Transaction, what: str) -> None:
        """Run one priority group of firings as children of ``transaction``, concurrently; raise the first failure
        once every member ended."""
        failures: list[tuple[Firing, BaseException]] = []
        if self.execution is RuleExecution.INLINE or len(group) == 1:
            executed = []
            for firing in group:
                try:
                    if run_inline(transaction, self._run_firing, firing, _transaction_name(firing.rule), Firing):
                        executed.append(firing)
                except DependencyAbort:
                    pass
                except BaseException as error:
                    failures.append((firing, error))
            self._executed(transaction, executed)
        else:
            # Siblings that may run concurrently, run one after another by this thread until one of them
            # has to run elsewhere (txn README, "Groups on threads").
            begun: set[int] = set()     # the numbers of the members whose run began: ``execute`` counts their outcome

            def run(child: Transaction, firing: Firing) -> bool:
                begun.add(firing.number)
                return self.execute(child, firing)

            try:
                outcomes = run_group(transaction, run, group, [_transaction_name(firing.rule) for firing in group])
            except BaseException:       # (refused before any member began: the tree ended, the pool shut down)
                self._never_ran([firing for firing in group if firing.number not in begun])
                raise
            # A member whose subtransaction was refused never began: its outcome is counted here.
            self._never_ran([firing for firing, (ok, _) in zip(group, outcomes)
                             if not ok and firing.number not in begun])
            self._executed(transaction, [firing for firing, (ok, value) in zip(group, outcomes) if ok and value])
            for firing, (ok, outcome) in zip(group, outcomes):
                if not ok and not isinstance(outcome, DependencyAbort):
                    failures.append((firing, outcome))
        if failures:
            _raise_failure(*failures[0], what)

    def _run_each(self, transaction: Transaction, firings: list[Firing], order: tuple[int, ...],
                  names: tuple[str, ...], what: str) -> None:
        """``_run_groups`` for priority groups of one firing each, ``order`` their indices in ``firings`` (``names``:
        the names of their transactions, by the same indices): one after the other, each inline; the first failure
        stops the rest (as its group's failure does)."""
        executed: list[str] = []
        try:
            for position, index in enumerate(order):
                firing = firings[index]
                try:
                    if run_inline(transaction, self._run_firing, firing, names[index], Firing):
                        executed.append(firing.rule.name)
                except DependencyAbort:
                    pass
                except BaseException as error:
                    self._never_ran([firings[later] for later in order[position + 1:]])
                    _raise_failure(firing, error, what)
        finally:
            if executed:
                self._record_executed(transaction, executed)

    def plan(self, transaction: Transaction, event: Event) -> list[Firing]:
        """The firings ``event`` causes in ``transaction``, in the order a dispatch runs them: the enabled rules
        matching it — of any origin: a captured change's (``Origin.EXTERNAL``), which no transaction's events
        reach, included — in priority groups (higher first; equal priorities in declaration order), each
        numbered by this manager and recorded in the tree's firing record (``firings_in``, the transaction-log
        row).  Runs nothing: the caller runs them (:meth:`fire`; the capture consumer's batches)."""
        rules = self.registry.matching(event)
        if not rules:
            return []
        root = transaction.root
        self.record.dispatched(root, slot(root, RuleContext), rules)
        chain = chain_of(transaction)
        firings = [Firing(rule, event if index == 0 else own_event(event), chain + (rule.name,), rule.coupling,
                          next(self._numbers)) for index, rule in enumerate(rules)]     # (as ``on_event``'s)
        if len(firings) == 1:
            return firings
        return [firing for group in priority_groups(firings) for firing in group]

    def fire(self, transaction: Transaction, firings: list[Firing], *, shared: bool = False,
             again: bool = False, counted: list[FiringOutcome] | None = None) -> list[Fired]:
        """Run ``firings`` (:meth:`plan`'s: the capture consumer's) in order, each as :meth:`execute` does
        in a subtransaction of its own, and tell each one's :class:`FiringOutcome` as :meth:`execute` counted it (a
        rule that raises is FAILED; one whose action let a nested firing's failure or the cascade limit through, or
        whose tree was a deadlock's victim, CANCELLED — ``Fired.error`` says what stopped it —; the others go on);
        ``shared``: all in ``transaction`` itself, the first error propagates.
        An error of the transaction itself (deadlock, serialization conflict) propagates either way.
        ``again``: the firings ran before in this tree, in an attempt that did not last (a shared run that failed, a
        transient failure): each counts ``fired`` once more, an attempt with an outcome of its own, in the counters
        (``statistics``) — not in the tree's firing record (its transaction-log row), which has each planned once.
        ``counted``: each firing's outcome as its run counted it is appended to it as the run ends, also when an error
        then propagates — a condition that returned false counted CONDITION_FALSE before its subtransaction's commit
        raised (its tree doomed meanwhile); EXECUTED is counted when its tree commits (a detached firing's, by the
        caller), not by its run."""
        if again:
            self.record.attempted(firings)
        fired = []
        for firing in firings:
            ended: list[Fired] = []
            try:
                if shared:
                    set_slot(transaction, Firing, firing)
                    executed = self._execute(transaction, firing, ended)
                else:
                    def run(child: Transaction, firing: Firing, ended: list[Fired] = ended) -> bool:
                        return self._execute(child, firing, ended)
                    try:
                        executed = run_inline(transaction, run, firing, _transaction_name(firing.rule), Firing)
                    except (RuleFailed, CascadeLimitExceeded) as error:
                        # As ``_execute`` ended it (and counted it); a failure it did not see — raised by the
                        # firing's commit after its run, a deferred firing an observer queued then — stopped it from
                        # outside: cancelled.
                        fired.append(ended[0] if ended and ended[0].outcome in (_FAILED, _CANCELLED)
                                     else Fired(_CANCELLED, error))
                        continue
            finally:
                if counted is not None and ended:
                    counted.append(ended[0].outcome)
            if executed:
                self._executed(transaction, [firing])
            fired.append(Fired(FiringOutcome.EXECUTED if executed else FiringOutcome.CONDITION_FALSE))
        return fired

    def execute(self, transaction: Transaction, firing: Firing) -> bool:
        """Run condition and action of ``firing`` in ``transaction`` (its own transaction); True if the
        condition held and the action ran.  ``firing`` becomes the transaction's ``Firing`` slot.  Its caller
        records it as executed once that transaction committed (``_executed``; the single immediate firing's
        dispatch: ``FiringRecord.ran``), counted when the tree commits."""
        set_slot(transaction, Firing, firing)
        return self._execute(transaction, firing)

    def _execute(self, transaction: Transaction, firing: Firing, ended: "list[Fired] | None" = None) -> bool:
        """:meth:`execute` in a transaction whose ``Firing`` slot is ``firing`` already (``run_inline``'s
        ``kind``).  The one classification of a firing's outcome: what it counts, what observers are told and what
        it appends to ``ended`` (:meth:`fire`'s, with the error that ended it) are the same outcome."""
        rule, event = firing.rule, firing.event
        observers = self.transactions.observers
        if observers.on_firing_start:
            observers.call("on_firing_start", transaction, firing)
        outcome = _FAILED
        stopped_by: BaseException | None = None
        try:
            if rule.action_coupling is _IMMEDIATE:
                condition = rule.condition
                if condition is not always:
                    held: object = condition(transaction, event)   # (typed bool: what it returns is checked)
                    if held is not True and held is not False:
                        check_body_ran(rule, "condition", held)
                    if transaction.state is _ABORTED:
                        _aborted_itself(rule, "condition", transaction)
                    if not held:
                        self.count(rule, "condition_false")
                        outcome = _CONDITION_FALSE
                        return False
                returned = rule.action(transaction, event)
                if returned is not None:
                    check_body_ran(rule, "action", returned)
                if transaction.state is _ABORTED:       # (its commit would raise: the trigger gets RuleFailed)
                    _aborted_itself(rule, "action", transaction)
            elif not condition_then_action(self, transaction, firing):
                outcome = _CONDITION_FALSE
                return False
            if firing.deferring:
                # The deferred firings its action raised (immediate and detached firings own a queue) run at its
                # commit: run now, before its outcome is told, a failing one ends this firing as it is counted and
                # told — cancelled, undone by another firing's failure —, not executed.  (Deferred after this, by
                # an observer, they run at the commit: a queue of their own.)
                context = slot(transaction, RuleContext, create=False)
                if context is not None and context.deferred_queue is not None:
                    self._run_deferred(transaction, context.deferred_queue)
                    context.deferred_queue = None
            outcome = _EXECUTED
        except (DependencyAbort, CascadeLimitExceeded, RuleFailed, TransactionAborted) as error:
            stopped_by = error
            if isinstance(error, TransactionAborted) and transaction.state is _ABORTED:
                # Its own transaction aborted by the condition or action itself (``tx.abort()``), not by an ancestor
                # (which dooms it: it stays active until it ends): the rule's failure, as the trigger sees it.
                self._failed(rule, event, error)
            if isinstance(error, (RuleFailed, CascadeLimitExceeded)) and error not in _RAISED_BY_RULES:
                # Raised by the condition or action itself, of its own making — not a nested firing's failure, not a
                # cascade limit of this manager's —: its failure.
                self._failed(rule, event, error)
            # Something else ended it — a nested rule's failure or the cascade limit its action let through, a
            # dependency, a doomed tree's abort —: cancelled, as observers are told (the nested rule counted its own
            # failure).
            outcome = _CANCELLED
            self.count(rule, "cancelled")
            raise
        except DeadlockDetected as error:
            stopped_by = error
            if not _victim_is(transaction, error):      # e.g. a top-level transaction the action opened itself
                self._failed(rule, event, error)
            # Not the rule's failure: its transaction (or one it runs in) was chosen as a deadlock's victim, and
            # re-running that transaction runs it again (``Database.run``, ``tx.retry``).  Counted cancelled and
            # logged at INFO; the caller gets RuleFailed with this cause, as for any failure.
            outcome = _CANCELLED
            self.count(rule, "cancelled")
            logger.info("rule %r on %s was aborted, not failed: %s", rule.name, event.describe(), shown_error(error))
            raise RuleFailed.raised(rule.name, event, error) from error
        except Exception as error:
            stopped_by = error
            self._failed(rule, event, error)
        except BaseException as error:
            stopped_by = error
            # KeyboardInterrupt, SystemExit: raised as itself (``_raise_failure``), yet the firing ended failed —
            # counted so, or ``fired`` would exceed its outcomes (the outbox settles a detached one as failed).
            self.count(rule, "failed")
            raise
        finally:
            if ended is not None:
                ended.append(Fired(outcome, stopped_by))
            if observers.on_firing_end:
                observers.call("on_firing_end", transaction, firing, outcome)
        return True

    def _failed(self, rule: Rule, event: Event, error: Exception) -> NoReturn:
        """Count and log the failure of ``rule``'s condition or action, which raised ``error`` on ``event``, and raise
        it as ``RuleFailed``."""
        self.count(rule, "failed")
        raise RuleFailed.logged(rule.name, event, error) from error

    def _executed(self, transaction: Transaction, firings: "list[Firing]") -> None:
        """The actions of ``firings`` ran and their transactions (children of ``transaction``) committed: counted
        ``executed`` if ``transaction``'s tree commits (immediate and deferred firings; a detached one counts once its
        own top-level transaction commits), in one call of the record."""
        names = [firing.rule.name for firing in firings
                 if firing.coupling is _IMMEDIATE or firing.coupling is _DEFERRED]     # runs_as_subtransaction
        if names:
            self._record_executed(transaction, names)

    def _record_executed(self, transaction: Transaction, names: "list[str]") -> None:
        """Firings of the rules ``names`` (one name per firing) ran as children of ``transaction`` and committed:
        recorded on ``transaction`` itself, whose end passes them on — to its parent when it commits, as
        ``cancelled`` when it aborts, which undid them (``after_end``) — up to the root, whose end counts them
        (``FiringRecord.fold``)."""
        if transaction.parent is not None:
            want_end_hooks(transaction)         # (a frame's end too: ``after_end`` passes its record on)
        self.record.executed(slot(transaction, RuleContext), names)


def _aborted_itself(rule: Rule, part: str, transaction: Transaction) -> NoReturn:
    """Raise the TransactionAborted of ``rule``'s ``part`` (condition, action) that aborted ``transaction``, the
    firing's own, and returned (``_execute`` counts it failed)."""
    raise TransactionAborted(f"the {part} of rule {rule.name!r} aborted its own transaction {transaction.id} "
                             f"(tx.abort()) and returned")


def _victim_is(transaction: Transaction, error: "DeadlockDetected") -> bool:
    """Whether ``error``'s victim is ``transaction`` or one of its ancestors: the firing's own tree was chosen, not
    a separate top-level transaction its action opened."""
    return error.victim == transaction.id or any(error.victim == node.id for node in transaction.ancestors)


def own_event(event: Event) -> Event:
    """``event`` with dicts of its own (``old``, ``new``, ``payload``) for one more rule it fires: an ``Event`` is
    immutable, but its row images and payload are plain dicts, which a rule may change — that must not change what
    another rule on the same event (run now, deferred, or recorded for later by the outbox) sees.  Made only when an
    event fires several rules; one rule keeps the event itself (nobody else reads it: a data event's ``old`` is the
    reader's copy, ``tx.read``'s contract).  Their lists and dicts (a JSON column's, a payload's list) are copied
    too (``own_image``)."""
    old, new = event.old, event.new
    return new_event(event.kind, event.source, event.key, None if old is None else own_image(old),
                     None if new is None else own_image(new), own_image(event.payload), event.ts,
                     event.transaction, event.origin)


_NAMES: dict[str, str] = {}     # rule name -> the name of its firings' transactions (``_transaction_name``)
_STACK_CHECKED_FROM = 16        # cascade depth from which ``on_event`` checks Python's stack (a walk of frames)
_PLANS = 1024                   # rule sets whose plans ``on_event`` keeps before it starts afresh

_Planned = TypeVar("_Planned")


def _remember(cache: dict[tuple[Rule, ...], _Planned], rules: tuple[Rule, ...],
              make: Callable[[tuple[Rule, ...]], _Planned]) -> _Planned:
    """``make(rules)``, kept in ``cache`` (emptied first once it holds ``_PLANS`` rule sets)."""
    if len(cache) >= _PLANS:
        cache.clear()
    planned = cache[rules] = make(rules)
    return planned


class _Plan:
    """How ``on_event`` runs the firings of one matching rule set of several rules (what the dispatch would find out
    per event): ``others``, the indices of the deferred and detached ones, in the rule set's order; the immediate
    ones' priority groups as index tuples (``groups``), or, when each group has one firing, ``order``, their indices
    in the order the groups run (``coupling.priority_groups``)."""

    __slots__ = ("others", "groups", "order", "names")

    def __init__(self, rules: tuple[Rule, ...]):
        self.names = tuple(_transaction_name(rule) for rule in rules)
        self.others = tuple(index for index, rule in enumerate(rules) if rule.coupling is not _IMMEDIATE)
        immediate = [index for index, rule in enumerate(rules) if rule.coupling is _IMMEDIATE]
        groups = priority_groups(immediate, key=lambda index: rules[index].priority)
        if all(len(group) == 1 for group in groups):
            self.groups, self.order = None, tuple(group[0] for group in groups)
        else:
            self.groups, self.order = tuple(tuple(group) for group in groups), ()


class _Order:
    """How ``_run_groups`` runs the firings of one rule set (a deferred cycle's), all as subtransactions: ``order``,
    their indices in the order the priority groups run when each group has one firing (else ``()``: by groups),
    and ``names``, the names of their transactions."""

    __slots__ = ("order", "names")

    def __init__(self, rules: tuple[Rule, ...]):
        groups = priority_groups(range(len(rules)), key=lambda index: rules[index].priority)
        self.order = tuple(group[0] for group in groups) if all(len(group) == 1 for group in groups) else ()
        self.names = tuple(_transaction_name(rule) for rule in rules)


def _transaction_name(rule: Rule) -> str:
    """``rule:<name>``, the name of the transactions that run ``rule``'s firings (made once per rule name)."""
    return _NAMES.get(rule.name) or _NAMES.setdefault(rule.name, f"rule:{rule.name}")


def _raise_failure(firing: Firing, error: BaseException, what: str) -> None:
    """Raise what a failed ``firing`` (it raised ``error``) makes its parent raise: ``error`` itself if it is no
    ``Exception`` (KeyboardInterrupt, SystemExit: Ctrl-C in a rule stops its caller, which cannot take it for a rule
    failure and go on; the firing's subtransaction has aborted on its way out, as its trigger's does on the caller's)."""
    if isinstance(error, RuleFailed):
        _RAISED_BY_RULES.add(error)         # (a firing's failure, not one of the trigger's own making)
    if isinstance(error, (RuleFailed, CascadeLimitExceeded)) or not isinstance(error, Exception):
        raise error
    failure = RuleFailed(f"{what} rule {firing.rule.name!r} failed on {firing.event.describe()}: {shown_error(error)}",
                         firing.rule.name, firing.event)
    _RAISED_BY_RULES.add(failure)
    raise failure from error


def _limit(error: CascadeLimitExceeded) -> CascadeLimitExceeded:
    """``error``, a cascade limit this manager raises, remembered as its own (``_RAISED_BY_RULES``): a firing whose
    action lets it through is cancelled by it, while one that raises a CascadeLimitExceeded of its own failed."""
    _RAISED_BY_RULES.add(error)
    return error
