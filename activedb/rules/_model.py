"""Rules, firings and their counters (Sentinel's rule class, Concurrent Rule Execution §4.3: a rule has a name,
an event, a condition, an action, a coupling mode and an enabled flag — see ``README.md``)."""

from __future__ import annotations

import hashlib
import inspect
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Literal, NamedTuple

from coupling import Coupling

from activedb._closedset import ClosedSet
from activedb.errors import RuleError
from activedb.events import Event, EventSpec
from activedb.txn import FiringOutcome

if TYPE_CHECKING:  # pragma: no cover
    from activedb.rules._manager import RuleManager
    from activedb.txn import Transaction


class Rule:
    """A rule in class form (Sentinel's rule class).  Subclass and set the attributes::

        class Alert(activedb.Rule):
            on = db.updated("worker_status")
            coupling = Coupling.DEFERRED
            priority = 10
            def condition(self, tx, event): return event.new["status"] == "violation"
            def action(self, tx, event): tx.insert("alerts", worker=event.key, kind="violation", at=0.0)

        db.rules.add(Alert())
    """

    #: Set when the rule is registered (the class's name when not given): a registered rule always has one.
    name: str = None  # type: ignore[assignment]
    #: Required: registration refuses a rule without one (an event such as ``db.updated("table")``).
    on: EventSpec = None  # type: ignore[assignment]
    coupling: Coupling = Coupling.IMMEDIATE            # a value's string (``"deferred"``) is accepted too
    action_coupling: Coupling = Coupling.IMMEDIATE
    priority: float | None = None
    enabled: bool = True

    def condition(self, tx: "Transaction", event: Event) -> bool:
        return True

    def action(self, tx: "Transaction", event: Event) -> Any:
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
            name = self.name if self.name is not None else type(self).__name__    # (as db.rules.add names it)
            raise RuleError(f"rule {name!r} is not registered on a database; use db.rules.add(rule)")
        return self._manager

    def condition_function(self) -> Callable[..., object] | None:
        """What identifies the condition's code (for the persisted definition's fingerprint)."""
        return self.condition

    def action_function(self) -> Callable[..., object]:
        return self.action

    def __repr__(self) -> str:
        state = "enabled" if self.enabled else "disabled"
        return (f"<Rule {self.name!r} on {self.on} {_coupling_text(self.coupling)}/"
                f"{_coupling_text(self.action_coupling)} priority={self.priority} {state}>")


class FunctionRule(Rule):
    """A rule declared with the ``db.rule(...)`` decorator."""

    def __init__(self, action: Callable[..., object], *, on: EventSpec, when: Callable[..., object] | None,
                 coupling: Coupling, action_coupling: Coupling, priority: float | None, enabled: bool,
                 name: str | None) -> None:
        self._action = action
        self._when = when
        self.on = on
        self.coupling = coupling
        self.action_coupling = action_coupling
        self.priority = priority
        self.enabled = enabled
        # (None: the registry names it; a name given, "" too, is the rule's or refused)
        self.name = name if name is not None else getattr(action, "__name__", None)  # type: ignore[assignment]
        self.__doc__ = getattr(action, "__doc__", None)
        # The functions themselves as ``condition`` and ``action`` (no wrapper call per firing).
        self.action = action  # type: ignore[method-assign]
        self.condition = when if when is not None else always  # type: ignore[method-assign,assignment]

    def condition_function(self) -> Callable[..., object] | None:
        return self._when

    def action_function(self) -> Callable[..., object]:
        return self._action

    def __call__(self, tx: "Transaction", event: Event) -> Any:
        """The decorated function stays callable directly."""
        return self._action(tx, event)


def _coupling_text(coupling: object) -> str:
    """A rule's coupling as its repr shows it: the mode's value, or what was given if it names no mode (a repr never
    raises; declaring the rule refuses it)."""
    try:
        return str(Coupling.parse(coupling).value)  # type: ignore[arg-type]  # (anything: parse refuses what is no mode)
    except Exception:
        return repr(coupling)


def check_body_ran(rule: Rule, part: Literal["condition", "action"], value: object) -> None:
    """Refuse ``value``, what ``rule``'s ``part`` returned, if it is a coroutine, a generator or an async generator
    (what calling an async or generator function returns; ``activedb.errors.body_not_run`` tells such functions): the
    part is a plain function that hands back the body of an ``async def`` (or a generator function) it called —
    ``lambda tx, event: work(tx, event)`` — which the declaration's check of the part itself cannot see, and which no
    firing awaits or iterates.  The object is closed (no "never awaited" warning) and a ``RuleError`` raised: the
    firing fails, as a part that raised."""
    if inspect.iscoroutine(value):
        kind = "a coroutine"
    elif inspect.isgenerator(value):
        kind = "a generator"
    elif inspect.isasyncgen(value):
        kind = "an async generator"
    else:
        return
    what = "when=" if part == "condition" and isinstance(rule, FunctionRule) else f"the {part}"   # (as declared)
    if not inspect.isasyncgen(value):
        value.close()        # (a coroutine or a generator: closed before it began)
    raise RuleError(f"rule {rule.name!r}: {what} returned {kind} ({getattr(value, '__qualname__', value)}), and a "
                    f"firing neither awaits nor iterates what its parts return (rules run in threads, not in an event "
                    f"loop), so none of its body ran; make it a plain def that does its work synchronously")


def always(tx: "Transaction", event: Event) -> bool:
    """The condition of a ``FunctionRule`` declared without one (the dispatch skips calling it)."""
    return True


@dataclass(slots=True)
class Firing:
    """One rule firing: the rule, the event, the cascade chain (names, outermost first)."""

    rule: Rule
    event: Event
    chain: tuple[str, ...]
    coupling: Coupling
    number: int
    #: Its own transaction was given a deferred queue (``deferred_queue_for``): ``RuleManager._execute`` runs that
    #: queue before it tells the firing's outcome (an attribute read per firing, not a slot's lookup).
    deferring: bool = field(default=False, compare=False, repr=False)

    @property
    def priority(self) -> float | None:
        return self.rule.priority


class RuleExecution(ClosedSet):
    """How the rules of one priority group run (``connect(rule_execution=...)``)."""

    THREADS = "threads"    # equal priorities run concurrently, as sibling subtransactions on worker threads
    INLINE = "inline"      # one after the other, as inline subtransactions in the triggering thread


class Fired(NamedTuple):
    """One firing's outcome (:meth:`RuleManager.fire`), as the counters count it; ``error``: the rule's own exception
    when FAILED, what stopped it when CANCELLED (a nested firing's ``RuleFailed`` or the ``CascadeLimitExceeded``
    its action let through, the ``DeadlockDetected`` whose victim was its tree)."""

    outcome: FiringOutcome
    error: BaseException | None = None


@dataclass
class RuleCounters:
    """One rule's counters in this process (``db.rules.statistics().per_rule``).  They count attempts: a firing run
    again — after a serialization conflict, a deadlock, a shared run that failed, a detached group that could not
    commit, or claimed by a recovery pass — counts ``fired`` once more and one more outcome, so ``fired`` is the sum
    of ``condition_false``, ``executed``, ``failed`` and ``cancelled`` (once every firing fired has ended), and
    ``fired`` minus ``executed`` is no count of firings that did not take effect.  Firings, each once, are the
    transaction log's (``db.rules.firing_counts()``, ``activedb rules list``) and an ingestion's (its ledger's
    ``rule_firings``)."""

    fired: int = 0             # attempts: each run of a firing (a re-run counts again), each with one outcome below
    condition_false: int = 0
    executed: int = 0          # condition true, action ran, its transaction committed — and its top-level
                               # transaction too: counted then, once (an attempt re-run after a conflict counts none)
    failed: int = 0            # condition or action raised, or aborted its own transaction (tx.abort())
    cancelled: int = 0         # a dependency stopped it (trigger aborted/committed, condition false), its tree
                               # was chosen as a deadlock's victim (re-running the tree runs it again) or aborted after it
                               # ran (undoing it), or a failing firing before it stopped it from running
    rerun_after_wait: int = 0  # C-A parallel action run again after it gave way in a gate-vs-lock cycle


#: The name of one of :class:`RuleCounters`' fields (what ``RuleManager.count`` adds to).
RuleCounter = Literal["fired", "condition_false", "executed", "failed", "cancelled", "rerun_after_wait"]


@dataclass(frozen=True)
class RulesStatistics:
    rules: int
    enabled: int
    per_rule: dict[str, RuleCounters]
    per_mode: dict[str, int]
    detached_running: int


def fingerprint(function: Any) -> str:
    """A digest of a function's source (or code), to notice a redefinition across runs.  What stands in for the source
    of a part that has none of its own — the repr of a callable object or a ``functools.partial``, the code of a
    function without its file — is taken without memory addresses (``at 0x…``), which differ from run to run."""
    if function is None:
        return "none"
    target = getattr(function, "__func__", function)
    try:
        source = inspect.getsource(target)
    except (OSError, TypeError):
        code = getattr(target, "__code__", None)
        source = _ADDRESS.sub("", repr(code.co_code) + repr(code.co_consts) if code else repr(target))
    return hashlib.sha256(source.encode()).hexdigest()[:16]


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")     # (in a repr: ``<function f at 0x7f…>``, ``<X object at 0x…>``)
