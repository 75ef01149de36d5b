"""The ECA rule manager: declaring rules, firing them, and the six coupling modes.

Design note (the semantics come from package ``coupling``; seed 004 §2.1, §3):

* A **rule** (Sentinel's rule class, seed 004 Fig. 10) has a name, an event spec, a
  condition, an action, an E-C and a C-A coupling, a priority and an enabled flag.
  Rules are registered on one ``Database`` (``db.rule(...)`` / ``db.rules.add``) —
  never in a module-global registry — and persisted in ``activedb_rules``.
* **Firing** is tuple-oriented: every event occurrence fires every enabled rule
  whose spec matches.  Per coupling mode:

  ===========================  ======================================================
  immediate                    a subtransaction of the triggering transaction, run
                               right away; its failure surfaces in the triggering
                               operation as ``RuleFailed`` (like a failed child)
  deferred                     queued on the nearest transaction that owns a
                               deferred queue (``coupling.has_own_deferred_queue``)
                               and run in cycles just before it commits
  detached                     a new top-level transaction, no dependency
  detached causally dependent  new top-level; AD + CD on the trigger (gate)
  sequential causally dep.     new top-level that begins after the trigger commits
  exclusive causally dep.      new top-level that commits only if the trigger aborts
  ===========================  ======================================================

  For the detached family the *trigger* is the transaction the event occurred in,
  and its outcome is its **effective** one: committed only when it and every
  ancestor committed (the top-level commit made its effects durable); aborted as
  soon as it or an ancestor aborted.  The ``coupling.DependencyGate`` enforces the
  dependencies while dependents run in parallel with their trigger.
* **Priorities**: the rules fired by one event run in ``coupling.priority_groups``
  order — a group after the other, the members of a group concurrently (on worker
  threads) — and each deferred cycle the same way.
* **C-A coupling** immediate runs the action in the condition's subtransaction;
  sequential causally dependent runs condition and action as two sibling
  subtransactions in parallel, the action committing only if the condition
  committed and returned true (``gate.register_action``).
* **Cascades** carry the chain of rule names; deeper than ``max_cascade_depth``
  raises ``CascadeLimitExceeded`` in the transaction that would exceed it.
* **Gate waits vs locks**: a dependent waiting in the gate for its trigger may hold
  a lock its trigger waits for — a deadlock the lock manager cannot see.  Gate
  waits are therefore done in short slices; between slices the wait-for graph is
  checked for an edge from the trigger's tree to the dependent's tree, and if there
  is one the dependent aborts (releasing its locks) and is re-run once the trigger
  has ended, if its dependency still allows it.

Thread-safety: ``_mutex`` protects the rule table, the statistics, the tracked
triggers and the detached tasks; no user code, logging or gate wait runs under it.
"""

from __future__ import annotations

import collections
import hashlib
import inspect
import itertools
import json
import logging
import threading
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

import sqlalchemy as sa

from coupling import (
    ACTION_COUPLINGS,
    Coupling,
    CouplingError,
    DeferredCycleLimitExceeded,
    DependencyGate,
    DeferredQueue,
    Verdict,
    has_own_deferred_queue,
    priority_groups,
)
from coupling.errors import DependencyTimeout

from activedb._events import DATA_KINDS, Event, EventSpec
from activedb._transaction import Transaction, TransactionHooks, TxnState
from activedb.errors import (
    CascadeLimitExceeded,
    RuleError,
    RuleFailed,
    TransactionAborted,
    UnknownTable,
)

logger = logging.getLogger("activedb.rules")

GATE_SLICE_SECONDS = 0.05


class RuleDefinitionChangedWarning(UserWarning):
    """A persisted rule was redefined with a different definition (its version is bumped)."""


class Rule:
    """A rule in class form (seed 004 Fig. 10).  Subclass and set the attributes::

        class Alert(activedb.Rule):
            on = db.updated("worker_status")
            coupling = Coupling.DEFERRED
            priority = 10
            def condition(self, tx, event): return event.new["status"] == "violation"
            def action(self, tx, event): tx.insert("alerts", worker=event.key, kind="violation", at=0.0)

        db.rules.add(Alert())
    """

    name: str | None = None
    on: EventSpec | None = None
    coupling: Coupling | str = Coupling.IMMEDIATE
    action_coupling: Coupling | str = Coupling.IMMEDIATE
    priority: float | None = None
    enabled: bool = True

    def condition(self, tx: Transaction, event: Event) -> bool:
        return True

    def action(self, tx: Transaction, event: Event) -> Any:
        raise NotImplementedError(f"rule {self.name!r} has no action")

    # filled in by RuleManager.add
    version: int = 0
    _manager: "RuleManager | None" = None

    def enable(self) -> None:
        self._require_manager().enable(self.name)

    def disable(self) -> None:
        self._require_manager().disable(self.name)

    def _require_manager(self) -> "RuleManager":
        if self._manager is None:
            raise RuleError(f"rule {self.name!r} is not registered on a database; use db.rules.add(rule)")
        return self._manager

    def __repr__(self) -> str:
        state = "enabled" if self.enabled else "disabled"
        return (f"<Rule {self.name!r} on {self.on} {Coupling.parse(self.coupling).value}/"
                f"{Coupling.parse(self.action_coupling).value} priority={self.priority} {state}>")


class FunctionRule(Rule):
    """A rule declared with the ``db.rule(...)`` decorator."""

    def __init__(self, action: Callable, *, on: EventSpec, when: Callable | None, coupling, action_coupling,
                 priority, enabled: bool, name: str | None):
        self._action = action
        self._when = when
        self.on = on
        self.coupling = coupling
        self.action_coupling = action_coupling
        self.priority = priority
        self.enabled = enabled
        self.name = name or getattr(action, "__name__", None)
        self.__doc__ = getattr(action, "__doc__", None)

    def condition(self, tx: Transaction, event: Event) -> bool:
        return True if self._when is None else self._when(tx, event)

    def action(self, tx: Transaction, event: Event) -> Any:
        return self._action(tx, event)

    def __call__(self, tx: Transaction, event: Event) -> Any:
        """The decorated function stays callable directly."""
        return self._action(tx, event)


@dataclass
class Firing:
    """One rule firing: the rule, the event, the cascade chain (names, outermost first)."""

    rule: Rule
    event: Event
    chain: tuple[str, ...]
    coupling: Coupling
    number: int

    @property
    def priority(self):
        return self.rule.priority


@dataclass
class RuleCounters:
    fired: int = 0
    condition_false: int = 0
    executed: int = 0          # condition true, action ran and its transaction committed
    failed: int = 0            # condition or action raised
    cancelled: int = 0         # a dependency stopped it (trigger aborted/committed, condition false)
    rerun_after_wait: int = 0  # detached dependent re-run after a gate-vs-lock conflict


@dataclass(frozen=True)
class RulesStatistics:
    rules: int
    enabled: int
    per_rule: dict[str, RuleCounters]
    per_mode: dict[str, int]
    detached_running: int


class _DependencyAbort(Exception):
    """The dependency gate said ABORT/CANCEL: not a rule failure."""


class _GateDeadlock(Exception):
    """A gate wait would deadlock with the trigger's lock waits: abort and re-run later."""


@dataclass
class _TrackedTrigger:
    key: str
    transaction_id: str
    ended: threading.Event = field(default_factory=threading.Event)
    committed: bool | None = None


def _fingerprint(function: Any) -> str:
    if function is None:
        return "none"
    target = getattr(function, "__func__", function)
    try:
        source = inspect.getsource(target)
    except (OSError, TypeError):
        code = getattr(target, "__code__", None)
        source = repr(code.co_code) + repr(code.co_consts) if code else repr(target)
    return hashlib.sha256(source.encode()).hexdigest()[:16]


class RuleManager(TransactionHooks):
    """The rules of one ``Database``; ``db.rules``.  Thread-safe (see the module docstring)."""

    def __init__(self, database, *, max_cascade_depth: int = 16, max_deferred_cycles: int = 100,
                 execution: str = "threads"):
        if execution not in ("threads", "inline"):
            raise ValueError("execution is 'threads' (equal priorities run concurrently) or 'inline'")
        self.database = database
        self.max_cascade_depth = max_cascade_depth
        self.max_deferred_cycles = max_deferred_cycles
        self.execution = execution
        self.gate = DependencyGate()
        self._mutex = threading.Lock()
        self._rules: dict[str, Rule] = {}
        # Derived from _rules by _reindex(): rules by the event kind they react to, and the tables
        # whose data events are observed (writes there read the old row).
        self._by_kind: dict[str, tuple[Rule, ...]] = {}
        self._observed_tables: frozenset[str] = frozenset()
        self._counters: dict[str, RuleCounters] = collections.defaultdict(RuleCounters)
        self._per_mode: collections.Counter = collections.Counter()
        # root id -> the tracked triggers of that tree (reported True when the root commits)
        self._tracked: dict[str, list[_TrackedTrigger]] = {}
        self._detached_running = 0                                 # detached rule tasks not yet ended
        self._detached_done = threading.Condition(self._mutex)
        self._numbers = itertools.count(1)
        self.redefined: list[tuple[str, int, int]] = []

    # --- declaring ------------------------------------------------------------------------

    def add(self, rule: Rule, *, replace: bool = False) -> Rule:
        """Validate, register and persist ``rule``; returns it."""
        if isinstance(rule, type) and issubclass(rule, Rule):
            rule = rule()
        if not isinstance(rule, Rule):
            raise RuleError(f"db.rules.add() takes a Rule (or Rule subclass), got {rule!r}")
        if not rule.name:
            rule.name = type(rule).__name__
        self._validate(rule)
        with self._mutex:
            if rule.name in self._rules and not replace:
                raise RuleError(
                    f"a rule named {rule.name!r} is already declared on this database; choose another name, "
                    f"or pass replace=True / call db.rules.remove({rule.name!r}) first"
                )
        self._persist(rule)
        rule._manager = self
        with self._mutex:
            self._rules[rule.name] = rule
            self._reindex()
        return rule

    def _validate(self, rule: Rule) -> None:
        name = rule.name
        if not isinstance(rule.on, EventSpec):
            raise RuleError(
                f"rule {name!r}: on= must be an event such as db.updated('table') or db.signalled('name'), "
                f"got {rule.on!r}"
            )
        try:
            rule.coupling = Coupling.parse(rule.coupling)
            rule.action_coupling = Coupling.parse(rule.action_coupling)
        except CouplingError as error:
            raise RuleError(f"rule {name!r}: {error}") from None
        if rule.action_coupling not in ACTION_COUPLINGS:
            raise RuleError(
                f"rule {name!r}: action_coupling must be immediate or sequential_causally_dependent, "
                f"got {rule.action_coupling.value}"
            )
        if rule.priority is not None and (isinstance(rule.priority, bool)
                                          or not isinstance(rule.priority, (int, float))):
            raise RuleError(f"rule {name!r}: priority must be a number (higher runs first) or None")
        for part in ("condition", "action"):
            if not callable(getattr(rule, part, None)):
                raise RuleError(f"rule {name!r}: {part} must be callable")
        if isinstance(rule, FunctionRule):
            if not callable(rule._action):
                raise RuleError(f"rule {name!r}: the action must be callable, got {rule._action!r}")
            if rule._when is not None and not callable(rule._when):
                raise RuleError(f"rule {name!r}: when= must be callable (tx, event) -> bool, got {rule._when!r}")
        spec = rule.on
        if spec.is_data:
            try:
                self.database.table(spec.source)
            except UnknownTable as error:
                raise RuleError(f"rule {name!r}: {error}") from None
        if spec.kind in ("committed", "aborted") and not rule.coupling.runs_as_top_level:
            raise RuleError(
                f"rule {name!r}: on {spec} the triggering transaction has already ended, so the rule must be "
                f"detached (detached, detached_causally_dependent, sequential_causally_dependent or "
                f"exclusive_causally_dependent), not {rule.coupling.value}"
            )

    def _definition(self, rule: Rule) -> dict:
        return {
            "event": str(rule.on),
            "coupling": rule.coupling.value,
            "action_coupling": rule.action_coupling.value,
            "priority": rule.priority,
            "class": f"{type(rule).__module__}.{type(rule).__qualname__}",
            "condition": _fingerprint(rule._when if isinstance(rule, FunctionRule) else rule.condition),
            "action": _fingerprint(rule._action if isinstance(rule, FunctionRule) else rule.action),
        }

    def _persist(self, rule: Rule) -> None:
        definition = self._definition(rule)
        digest = hashlib.sha256(json.dumps(definition, sort_keys=True).encode()).hexdigest()
        table = self.database.table("activedb_rules")
        with self.database.engine.begin() as connection:
            row = connection.execute(sa.select(table).where(table.c.name == rule.name).with_for_update()).first()
            if row is None:
                connection.execute(table.insert().values(
                    name=rule.name, event=str(rule.on), coupling=rule.coupling.value,
                    action_coupling=rule.action_coupling.value, priority=rule.priority, enabled=rule.enabled,
                    definition_hash=digest, definition=definition, version=1))
                rule.version = 1
                return
            if row.definition_hash == digest:
                rule.version = row.version
                rule.enabled = row.enabled           # the persisted flag wins across connect() calls
                return
            version = row.version + 1
            connection.execute(table.update().where(table.c.name == rule.name).values(
                event=str(rule.on), coupling=rule.coupling.value, action_coupling=rule.action_coupling.value,
                priority=rule.priority, definition_hash=digest, definition=definition, version=version,
                enabled=rule.enabled, updated_at=sa.func.now()))
            rule.version = version
        changed = [key for key in definition if row.definition.get(key) != definition[key]]
        message = (f"rule {rule.name!r} was redefined (changed: {', '.join(changed)}); "
                   f"its persisted definition moves from version {row.version} to {version}")
        logger.warning(message)
        warnings.warn(message, RuleDefinitionChangedWarning, stacklevel=4)
        with self._mutex:
            self.redefined.append((rule.name, row.version, version))

    def remove(self, name: str) -> None:
        with self._mutex:
            removed = self._rules.pop(name, None)
            self._reindex()
            if removed is None:
                raise RuleError(f"no rule named {name!r}; declared: {', '.join(self._rules) or 'none'}")

    def _set_enabled(self, name: str, enabled: bool) -> None:
        with self._mutex:
            rule = self._rules.get(name)
        if rule is None:
            raise RuleError(f"no rule named {name!r}; declared: {', '.join(self.names()) or 'none'}")
        table = self.database.table("activedb_rules")
        with self.database.engine.begin() as connection:
            connection.execute(table.update().where(table.c.name == name).values(enabled=enabled,
                                                                                  updated_at=sa.func.now()))
        with self._mutex:
            rule.enabled = enabled
            self._reindex()

    def enable(self, name: str) -> None:
        self._set_enabled(name, True)

    def disable(self, name: str) -> None:
        self._set_enabled(name, False)

    def get(self, name: str) -> Rule:
        with self._mutex:
            rule = self._rules.get(name)
        if rule is None:
            raise RuleError(f"no rule named {name!r}")
        return rule

    def names(self) -> list[str]:
        with self._mutex:
            return list(self._rules)

    def __iter__(self):
        with self._mutex:
            return iter(list(self._rules.values()))

    def persisted(self) -> list[dict]:
        """The registry as stored in PostgreSQL (every rule ever declared on this database)."""
        table = self.database.table("activedb_rules")
        with self.database.engine.connect() as connection:
            return [dict(row._mapping) for row in connection.execute(sa.select(table).order_by(table.c.name))]

    def statistics(self) -> RulesStatistics:
        with self._mutex:
            return RulesStatistics(
                rules=len(self._rules),
                enabled=sum(rule.enabled for rule in self._rules.values()),
                per_rule={name: RuleCounters(**vars(counter)) for name, counter in self._counters.items()},
                per_mode=dict(self._per_mode),
                detached_running=self._detached_running,
            )

    def wait_idle(self, timeout: float | None = 30.0) -> None:
        """Wait until every detached rule transaction started so far has ended."""
        with self._detached_done:
            if not self._detached_done.wait_for(lambda: self._detached_running == 0, timeout):
                raise TimeoutError(
                    f"{self._detached_running} detached rule transaction(s) still running after {timeout} s")

    def _count(self, rule: Rule, what: str) -> None:
        with self._mutex:
            counter = self._counters[rule.name]
            setattr(counter, what, getattr(counter, what) + 1)

    # --- hooks from the transaction manager -------------------------------------------------

    def wants_old_images(self, table: str) -> bool:
        return table in self._observed_tables

    def on_event(self, transaction: Transaction, event: Event) -> None:
        self.dispatch(transaction, event)

    def on_begin(self, transaction: Transaction) -> None:
        if transaction.is_top_level and self._has_rules_for("began"):
            self.dispatch(transaction, Event("began", transaction.name, transaction=transaction.id))

    def before_commit(self, transaction: Transaction) -> None:
        queue = transaction.deferred_queue
        if queue is not None:
            transaction.wait_children()
            try:
                for cycle in queue.cycles():
                    firings = [item.firing for item in cycle]
                    self._run_groups(transaction, firings, f"deferred cycle {cycle.number}")
            except DeferredCycleLimitExceeded as error:
                raise CascadeLimitExceeded(
                    f"deferred rules of {transaction.id} kept firing each other for {queue.max_cycles} cycles; "
                    f"break the cycle or raise max_deferred_cycles", [str(error)]) from error
        gate_key = getattr(transaction, "gate_key", None)
        if gate_key is not None:
            trigger = transaction.firing.event.transaction if transaction.firing else None
            verdict = self._wait_gate(transaction, gate_key, trigger)
            if verdict is not Verdict.COMMIT:
                raise _DependencyAbort(f"{transaction.firing.coupling.value} dependency on {trigger} says abort")

    def after_end(self, transaction: Transaction, committed: bool) -> None:
        root = transaction.root
        if not committed:
            self._report_aborted_subtree(transaction)
        elif transaction.is_top_level:
            self._report_committed_tree(root)
        report = getattr(transaction, "gate_report", None)
        if report is not None:
            self._report_end(report, committed)
        if transaction.is_top_level:
            kind = "committed" if committed else "aborted"
            if self._has_rules_for(kind):
                event = Event(kind, transaction.name, payload=dict(transaction.info), transaction=transaction.id)
                try:
                    self.dispatch(transaction, event, ended=True)
                except Exception as error:   # the transaction has ended: report, never undo its outcome
                    logger.error("rules on %s could not be fired: %r", event.describe(), error)

    def _has_rules_for(self, kind: str) -> bool:
        return any(rule.enabled for rule in self._by_kind.get(kind, ()))

    # --- dispatch ----------------------------------------------------------------------------

    def _matching(self, event: Event) -> list[Rule]:
        return [rule for rule in self._by_kind.get(event.kind, ()) if rule.enabled and rule.on.matches(event)]

    def _reindex(self) -> None:
        """Rebuild the lookup structures after the rule set or an enabled flag changed.

        Caller holds ``self._mutex``.  Readers use the published tuple/frozenset without the
        mutex: each is replaced whole, never mutated.
        """
        by_kind: dict[str, list[Rule]] = {}
        for rule in self._rules.values():
            kinds = DATA_KINDS if rule.on.kind == "modified" else (rule.on.kind,)
            for kind in kinds:
                by_kind.setdefault(kind, []).append(rule)
        self._by_kind = {kind: tuple(rules) for kind, rules in by_kind.items()}
        self._observed_tables = frozenset(rule.on.source for rule in self._rules.values()
                                          if rule.enabled and rule.on.is_data)

    @staticmethod
    def _chain_of(transaction: Transaction) -> tuple[str, ...]:
        node = transaction
        while node is not None:
            if node.firing is not None:
                return node.firing.chain
            node = node.parent
        return ()

    def dispatch(self, transaction: Transaction, event: Event, *, ended: bool = False) -> None:
        """Fire the rules matching ``event``, which occurred in ``transaction``."""
        rules = self._matching(event)
        if not rules:
            return
        chain = self._chain_of(transaction)
        if len(chain) + 1 > self.max_cascade_depth:
            names = " -> ".join((*chain, "|".join(rule.name for rule in rules)))
            raise CascadeLimitExceeded(
                f"rule cascade deeper than {self.max_cascade_depth} in transaction {transaction.id}: {names}; "
                f"break the cycle or raise max_cascade_depth", [*chain, *(rule.name for rule in rules)])
        firings = []
        for rule in rules:
            firing = Firing(rule, event, (*chain, rule.name), rule.coupling, next(self._numbers))
            firings.append(firing)
            self._count(rule, "fired")
            with self._mutex:
                self._per_mode[rule.coupling.value] += 1
                counts = transaction.root.info.setdefault("rule_firings", {})
                counts[rule.name] = counts.get(rule.name, 0) + 1
        immediate = [firing for firing in firings if firing.coupling is Coupling.IMMEDIATE]
        for firing in firings:
            if firing.coupling is Coupling.DEFERRED:
                self._queue_for(transaction).add(firing)
            elif firing.coupling.runs_as_top_level:
                self._start_detached(transaction, firing, ended=ended)
        if immediate:
            self._run_groups(transaction, immediate, "immediate")

    def _queue_for(self, transaction: Transaction) -> DeferredQueue:
        """The deferred queue a firing in ``transaction`` joins (``coupling.has_own_deferred_queue``):
        top-level, immediate-rule, detached-rule and application subtransactions own one; a deferred
        rule's transaction (and its condition/action children) hands its deferred firings to the queue
        it was itself fired from, where they form the next cycle."""
        node = transaction
        while node is not None:
            if has_own_deferred_queue(node.firing.coupling if node.firing is not None else None):
                if node.deferred_queue is None:
                    node.deferred_queue = DeferredQueue(max_cycles=self.max_deferred_cycles, name=node.id)
                return node.deferred_queue
            node = node.parent
        raise AssertionError("a top-level transaction always owns a deferred queue")

    def _run_groups(self, transaction: Transaction, firings: list[Firing], what: str) -> None:
        """Run firings as children of ``transaction``: priority groups in order, a group concurrently."""
        for group in priority_groups(firings):
            failures: list[tuple[Firing, BaseException]] = []
            if self.execution == "inline":
                for firing in group:
                    try:
                        with transaction.subtransaction(name=f"rule:{firing.rule.name}") as child:
                            self._execute(child, firing)
                    except _DependencyAbort:
                        pass
                    except BaseException as error:
                        failures.append((firing, error))
            else:
                handles = [(firing, transaction.spawn(self._execute, firing, name=f"rule:{firing.rule.name}"))
                           for firing in group]
                for firing, handle in handles:
                    try:
                        handle.result()
                    except _DependencyAbort:
                        pass
                    except BaseException as error:
                        failures.append((firing, error))
            if failures:
                firing, error = failures[0]
                if isinstance(error, (RuleFailed, CascadeLimitExceeded)):
                    raise error
                raise RuleFailed(
                    f"{what} rule {firing.rule.name!r} failed on {firing.event.describe()}: {error!r}",
                    firing.rule.name, firing.event) from error

    def _execute(self, transaction: Transaction, firing: Firing) -> bool:
        """Run condition and action of ``firing`` in ``transaction`` (its own transaction)."""
        transaction.firing = firing
        rule, event = firing.rule, firing.event
        try:
            if rule.action_coupling is Coupling.IMMEDIATE:
                if not rule.condition(transaction, event):
                    self._count(rule, "condition_false")
                    return False
                rule.action(transaction, event)
            else:
                if not self._condition_then_action_in_parallel(transaction, firing):
                    return False
            if rule.coupling.runs_as_subtransaction:
                self._count(rule, "executed")   # detached rules count once their top-level commits
        except (_DependencyAbort, CascadeLimitExceeded, RuleFailed, TransactionAborted):
            raise
        except Exception as error:
            self._count(rule, "failed")
            logger.error("rule %r failed on %s: %r", rule.name, event.describe(), error)
            raise RuleFailed(f"rule {rule.name!r} failed on {event.describe()}: {error!r}", rule.name,
                             event) from error
        return True

    def _condition_then_action_in_parallel(self, transaction: Transaction, firing: Firing) -> bool:
        """C-A sequential causally dependent: condition and action as parallel siblings."""
        rule, event = firing.rule, firing.event
        condition_key, action_key = f"C:{transaction.id}", f"A:{transaction.id}"
        self.gate.register_action(action_key, condition_key, Coupling.SEQUENTIAL_CAUSALLY_DEPENDENT)
        outcome: dict[str, Any] = {}

        def condition_body(child: Transaction) -> bool:
            child.firing = firing
            value = bool(rule.condition(child, event))
            outcome["value"] = value
            self.gate.condition_returned(condition_key, value)
            return value

        def action_body(child: Transaction) -> None:
            child.firing = firing
            child.gate_key = action_key
            rule.action(child, event)

        condition_handle = transaction.spawn(self._gated(condition_body, condition_key),
                                             name=f"condition:{rule.name}")
        action_handle = transaction.spawn(self._gated(action_body, action_key, trigger=condition_handle),
                                          name=f"action:{rule.name}")
        condition_value = self._result_or_false(condition_handle)
        try:
            action_handle.result()
        except _GateDeadlock:
            if condition_value:      # the condition held: run the action again, now after it
                with transaction.subtransaction(name=f"action:{rule.name}") as child:
                    child.firing = firing
                    rule.action(child, event)
        except _DependencyAbort:
            pass
        if not condition_value:
            self._count(rule, "condition_false")
        return condition_value

    @staticmethod
    def _result_or_false(handle) -> bool:
        try:
            return bool(handle.result())
        except Exception:
            return False

    def _gated(self, body: Callable, key: str, trigger=None) -> Callable:
        """Wrap a body so that the gate hears the transaction's end (``after_end``) exactly once."""
        def run(child: Transaction):
            child.gate_report = key
            if trigger is not None:
                child.gate_key = key
                child.gate_trigger = trigger.transaction
            return body(child)
        return run

    # --- detached family ---------------------------------------------------------------------

    def _start_detached(self, trigger: Transaction, firing: Firing, *, ended: bool) -> None:
        key = f"F{firing.number}"
        tracked = None
        if firing.coupling is not Coupling.DETACHED:
            tracked = self._track(trigger, ended)
            self.gate.register(key, tracked.key, firing.coupling)

        def run() -> None:
            try:
                self._run_detached(firing, key, tracked)
            finally:
                with self._mutex:
                    self._detached_running -= 1
                    self._detached_done.notify_all()

        with self._mutex:
            self._detached_running += 1
        try:
            self.database.transactions.pool.submit(run)
        except BaseException:
            with self._mutex:
                self._detached_running -= 1
                self._detached_done.notify_all()
            raise

    def _track(self, trigger: Transaction, ended: bool) -> _TrackedTrigger:
        """The effective-outcome record of ``trigger`` (one per transaction, kept on it)."""
        with self._mutex:
            tracked = trigger.tracked_trigger
            if tracked is not None:
                return tracked
            tracked = trigger.tracked_trigger = _TrackedTrigger(key=f"E:{trigger.id}", transaction_id=trigger.id)
            if not ended:
                self._tracked.setdefault(trigger.root.id, []).append(tracked)
        if ended:   # transaction events: the outcome is known already
            tracked.committed = trigger.state is TxnState.COMMITTED
            tracked.ended.set()
            self.gate.trigger_ended(tracked.key, tracked.committed)
        return tracked

    def _report_aborted_subtree(self, transaction: Transaction) -> None:
        """``transaction`` aborted: it and its descendants will never commit effectively."""
        subtree, stack = [], [transaction]
        while stack:                        # outside self._mutex: children takes each node's mutex
            node = stack.pop()
            subtree.append(node)
            stack.extend(node.children)
        self._report(tracked for node in subtree if (tracked := node.tracked_trigger) is not None)
        if transaction.is_top_level:
            with self._mutex:
                self._tracked.pop(transaction.id, None)

    def _report_committed_tree(self, root: Transaction) -> None:
        """``root`` committed: every tracked trigger of its tree not aborted before committed."""
        with self._mutex:
            tracked = self._tracked.pop(root.id, [])
        self._report(tracked, committed=True)

    def _report(self, candidates, committed: bool = False) -> None:
        with self._mutex:
            pending = [tracked for tracked in candidates if not tracked.ended.is_set()]
            for tracked in pending:
                tracked.committed = committed
                tracked.ended.set()
        for tracked in pending:
            self.gate.trigger_ended(tracked.key, committed)
            self.gate.forget(tracked.key)

    def _run_detached(self, firing: Firing, key: str, tracked: _TrackedTrigger | None) -> None:
        rule = firing.rule
        gated = tracked is not None
        committed = False
        try:
            if gated and self.gate.wait_may_begin(key) is not Verdict.BEGIN:
                self._count(rule, "cancelled")
                return
            try:
                with self.database.transaction(name=f"rule:{rule.name}", _firing=firing) as transaction:
                    if gated:
                        transaction.gate_key = key
                        transaction.gate_trigger_tracked = tracked
                    if self._execute(transaction, firing):
                        transaction.info["executed"] = True
                committed = True
                if transaction.info.get("executed"):
                    self._count(rule, "executed")
            except _DependencyAbort:
                self._count(rule, "cancelled")
            except _GateDeadlock:
                self._count(rule, "rerun_after_wait")
                self._report_end(key, False)
                gated = False
                self._rerun_after_trigger(firing, tracked)
            except RuleFailed:
                pass   # counted and logged by _execute; never touches the trigger
            except Exception as error:
                self._count(rule, "failed")
                logger.error("detached rule %r failed on %s: %r", rule.name, firing.event.describe(), error)
        finally:
            if gated:
                self._report_end(key, committed)

    def _report_end(self, key: str, committed: bool) -> None:
        try:
            self.gate.trigger_ended(key, committed)
        except CouplingError as error:   # e.g. committed without a grant: report, never crash the pool
            logger.error("dependency gate: %s", error)

    def _rerun_after_trigger(self, firing: Firing, tracked: _TrackedTrigger) -> None:
        tracked.ended.wait()
        allowed = {
            Coupling.DETACHED_CAUSALLY_DEPENDENT: tracked.committed,
            Coupling.SEQUENTIAL_CAUSALLY_DEPENDENT: tracked.committed,
            Coupling.EXCLUSIVE_CAUSALLY_DEPENDENT: not tracked.committed,
        }[firing.coupling]
        if not allowed:
            self._count(firing.rule, "cancelled")
            return
        try:
            with self.database.transaction(name=f"rule:{firing.rule.name}", _firing=firing) as transaction:
                if self._execute(transaction, firing):
                    transaction.info["executed"] = True
            if transaction.info.get("executed"):
                self._count(firing.rule, "executed")
        except RuleFailed:
            pass

    # --- gate waits that cannot deadlock with lock waits ---------------------------------------

    def _wait_gate(self, dependent: Transaction, key: str, trigger_id: str | None) -> Verdict:
        trigger_tree = getattr(dependent, "gate_trigger", None)
        tracked = getattr(dependent, "gate_trigger_tracked", None)
        trigger_prefix = (trigger_tree.id if trigger_tree is not None
                          else tracked.transaction_id.split(".")[0] if tracked is not None else trigger_id)
        while True:
            try:
                return self.gate.wait_may_commit(key, timeout=GATE_SLICE_SECONDS)
            except DependencyTimeout:
                if trigger_prefix and self._tree_waits_for(trigger_prefix, dependent.id):
                    raise _GateDeadlock(f"{trigger_prefix} waits for a lock held by {dependent.id}")

    def _tree_waits_for(self, waiter_prefix: str, holder_root: str) -> bool:
        locks = self.database.transactions.locks
        if locks.statistics().waiting == 0:
            return False          # nobody waits for a lock: no wait can close a cycle through the gate
        graph = locks.wait_for_graph()

        def in_tree(node: Any, prefix: str) -> bool:
            text = str(node)
            return text == prefix or text.startswith(prefix + ".") or text.startswith(prefix + "#")

        return any(data.get("kind") != "commit" and in_tree(source, waiter_prefix) and in_tree(target, holder_root)
                   for source, target, data in graph.edges(data=True))
