"""Declared rules: a rule whose action is a declared state transaction (``@batch.declared``), run per firing
through the firing's transaction, and a micro-batch of its stream events lowered to one batch of state
transactions (:func:`lower`) when that is the same as firing them one by one.  Design note: the package
README, "Declared rules".

Thread-safety: a :class:`DeclaredAction` keeps no state (any thread may fire it); :class:`Lowered` is
immutable after :func:`lower` made it, its ``transactions`` one batch at a time (``StateTransactions``).
"""

from __future__ import annotations

import functools
import operator
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from itertools import repeat
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple, TypeAlias, cast

import sqlalchemy as sa
from coupling import Coupling, may_run_after, priority_groups

from activedb import lowlevel
from activedb.batch._aftermath import InCommit, plan_in_commit
from activedb.batch._commit import PendingBatch, apply_at_commit
from activedb.batch._learn import (
    Learned, LearnedDeclaration, NotLearned, Rejection, Step, _stream_event, learned_condition, learned_table,
    why_not_learned)
from activedb.batch._declare import (
    Abort, BatchEvent, Declaring, Inserted, OpKind, Ops, OpSpec, State, StateTransactions, canonical_key, inserted,
    inserted_parts, state_of)
from activedb.batch._result import BatchResult
from activedb.batch._state import WRITTEN_TWICE, given, merge_image, outside_candidates
from activedb.batch.errors import DeclarationError, LoweringRefused
from activedb.errors import SchemaError, causes, check_plain_function
from activedb.events import Event, EventKind, EventSpec, new_event
from activedb.store import KeysCheck, RowImage, TableInfo
from activedb.txn import CommitParticipant

if TYPE_CHECKING:  # pragma: no cover
    from activedb._handle import DatabaseHandle
    from activedb.rules import DecidedFirings, Firing, Rule, RuleCounter, RuleManager
    from activedb.txn import Transaction, TransactionManager

__all__ = ["DeclaredAction", "Lowered", "RULE_LOWERING", "apply_lowered", "declared", "lower", "lowerable",
           "why_not_lowered"]

_READ, _WRITE, _CHECK = OpKind.READ, OpKind.WRITE, OpKind.CHECK
_ND_READ, _ND_WRITE, _INSERT = OpKind.ND_READ, OpKind.ND_WRITE, OpKind.INSERT
_MISSING = object()
_EVENT_TYPE = operator.attrgetter("event_type")     # a batch event's type


class DeclaredAction:
    """A rule action made of a declaring function ``fn(event, ops)`` (the ``StateTransactions.on`` form):
    called as an action ``(tx, event)``, it declares the event's operations and performs them in ``tx``, the
    firing's transaction — every row read as of before the firing (reads first, rows to be written read
    with ``for_update=True``), then the writes; :class:`~activedb.batch.Abort` or an error of a function
    raises before anything is written.  Window operations need a batch (their versions): here they raise
    :class:`~activedb.batch.errors.DeclarationError`.  ``declaration`` is ``fn``; the action is named and
    fingerprinted as ``fn`` (``__wrapped__``).  ``fn`` is a plain function: an ``async def`` or a generator function
    (whose call runs none of its body) is refused with a ``DeclarationError``."""

    #: How the ingestion core's rule path runs a batch whose rules are all declared rules as one batch
    #: (``activedb.ingest.BatchLowering``: :func:`lower` and :func:`apply_lowered`); set below the class.
    batch_lowering: ClassVar["_DeclaredRules"]

    def __init__(self, fn: Declaring) -> None:
        if not callable(fn):
            raise DeclarationError(f"@batch.declared decorates a function (event, ops), got {fn!r}")
        # (an async def, a generator function: each firing would declare nothing — its call runs none of its body)
        check_plain_function("@batch.declared", fn, error=DeclarationError)
        self.declaration = fn
        functools.update_wrapper(self, fn)
        # (how its repr and errors name it: any callable may declare — an object with __call__, a partial — not only
        # a function with a __qualname__)
        self._shown: str = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)

    def check_declared_on(self, rule: str, on: EventSpec) -> None:
        """Refuse, where rule ``rule`` is declared (the rule registry asks), an event a declared rule cannot react to:
        any but stream events."""
        if on.kind is not EventKind.STREAM:
            raise DeclarationError(
                f"rule {rule!r}: the declared rule {self._shown!r} is declared on {on}; a declared rule reacts to "
                f"stream events only — declare it on=db.stream(type), or write a plain action (tx, event)")

    def __call__(self, tx: "Transaction", event: Event) -> None:
        if getattr(event, "kind", None) is not EventKind.STREAM:
            raise DeclarationError(
                f"the declared rule {self._shown!r} fired on {event.describe()}; a declared rule "
                f"reacts to stream events (on=db.stream(type)) — declare it on a stream, or write a plain action")
        # (The stream event's own payload, as a plain rule gets it: emit made it the event's copy.)
        batch_event = BatchEvent(event.source, event.key, event.ts, event.payload, 0)  # type: ignore[arg-type]
        ops = Ops(batch_event)
        self.declaration(batch_event, ops)
        if ops.named_insert:        # (as a batch refuses it: its event a dead letter)
            ops.refuse_names_shared_with_inserts()
        if not ops.specs:
            raise DeclarationError(f"the declared rule {self._shown!r} declared no operation for "
                                   f"{event.describe()}; declare at least one (ops.read, ops.write, …)")
        perform_in(tx, ops.specs)

    def __repr__(self) -> str:
        return f"<declared rule action {self._shown}>"


def declared(fn: Declaring) -> DeclaredAction:
    """Decorator: ``fn(event, ops)`` as a rule's action (under ``@db.rule(on=db.stream(type))``)::

        @db.rule(on=db.stream("badge"), name="count_badges")
        @batch.declared
        def count(event, ops):
            ops.write("counters", event.key, lambda own: {"n": (own or {"n": 0})["n"] + 1})

    Fired in a transaction, it runs as any immediate rule does, in a subtransaction; a micro-batch of its
    events (the Spark sink) runs as one batch of state transactions when :func:`lower` allows it."""
    return DeclaredAction(fn)


def perform_in(tx: "Transaction", specs: list[OpSpec]) -> None:
    """Perform the declared operations ``specs`` of one event in ``tx`` (see :class:`DeclaredAction`)."""
    written = {spec.state for spec in specs if spec.kind is _WRITE}
    images: dict[State, RowImage | None] = {}

    def image(state: State, for_update: bool = False) -> RowImage | None:
        found = images.get(state, _MISSING)
        if found is _MISSING:
            found = images[state] = tx.read(state[0], state[1], for_update=for_update or state in written)
        return found  # type: ignore[return-value]  # (not _MISSING)

    writes: list[tuple[State, RowImage | None, RowImage | None]] = []
    inserts: list[Inserted] = []
    for spec in specs:
        kind = spec.kind
        if kind is _WRITE:
            state = state_of(spec)
            own = image(state, True)
            # (Each function gets copies, ``_state.given``: ``own`` stays the image the changes are computed from.)
            result = (spec.fn(given(own), *[given(image(param)) for param in spec.params]) if spec.params
                      else spec.fn(given(own)))
            writes.append((state, own, merge_image(own, result, spec)))
        elif kind is _READ:
            image(state_of(spec))
        elif kind is _CHECK:
            if spec.fn(given(image(state_of(spec))), *[given(image(param)) for param in spec.params]):
                raise Abort(spec.reason or "condition failed")
        elif kind is _INSERT:
            inserts.extend(inserted_parts(inserted(spec, spec.fn(*[given(image(param)) for param in spec.params]))))
        elif kind is _ND_READ or kind is _ND_WRITE:
            params = [given(image(param)) for param in spec.params]
            key = canonical_key(spec.key_fn(*params))
            if spec.candidates is not None and key not in spec.candidates:
                raise outside_candidates(kind, spec.table, key)
            state = (spec.table, key)
            if kind is _ND_WRITE:
                if state in written:        # (as in a batch: ``WRITTEN_TWICE`` aborts the event's transaction)
                    raise DeclarationError(WRITTEN_TWICE.removeprefix("DeclarationError: "))
                written.add(state)
                own = image(state, True)
                writes.append((state, own, merge_image(own, spec.fn(given(own), *params), spec)))
            else:
                image(state)
        else:
            raise DeclarationError(
                f"{kind.value} on {spec.table}: window operations read the versions of a batch, which a rule "
                f"fired in a transaction does not have; run these events as a batch (batch.apply_at_commit) "
                f"or declare the rule without window operations")
    for (table, key), own, new in writes:           # each row from ``own`` to ``new``: the columns that changed
        if new is None:
            if own is not None:
                tx.delete(table, key)
            continue
        changes = new if own is None else {column: value for column, value in new.items()
                                           if own.get(column, _MISSING) != value}
        if changes or own is None:
            tx.write(table, key, **changes)
    for table, rows in inserts:
        for row in rows:
            tx.insert(table, **row)


@dataclass(frozen=True)
class Lowered:
    """Stream event types whose rules :func:`lower` lowered: ``transactions`` declares each type's state
    transaction (its one rule's declaration, a declared rule's, or the :class:`LearnedDeclaration` of its chain of
    learned plain rules), ``rules`` names the rules each type fires, in the order firing runs them; ``learned`` maps
    the types whose rules are learned to their declaration, ``deviated`` is the caller's record of the learned rules
    whose lowered attempt was refused (shared across batches through the cache; :func:`apply_lowered` adds to it)."""

    transactions: StateTransactions
    rules: dict[str, tuple["Rule", ...]]
    learned: dict[str, LearnedDeclaration] = field(default_factory=dict)
    deviated: set["Rule"] = field(default_factory=set)
    #: The tables the batch writes (None: not known before it runs — a declared rule may write any): a batch is not
    #: lowered while a rule reacts to data events of one of them.
    writes: frozenset[str] | None = None
    #: Per type, its detached-family rules (recorded with each event's outcome: :func:`apply_lowered`).
    detached: dict[str, tuple["Rule", ...]] = field(default_factory=dict)
    #: What the learned chains' signals and inserted rows fire beside them (:class:`Reactions`, merged over the types).
    reactions: "Reactions | None" = None


def lowerable(rule: "Rule") -> DeclaredAction | Callable[..., object] | None:
    """``rule``'s action if firing it is the same as running a declaration as a state transaction of the event:
    an immediate rule (event–condition and condition–action) without a condition whose action is declared
    (a :class:`DeclaredAction`) or a plain function that only reads and writes its event's row of one table
    (``_learn.learned_table``: the package README, "Plain rules lowered")."""
    if (rule.condition_function() is not None or Coupling.parse(rule.coupling) is not Coupling.IMMEDIATE
            or Coupling.parse(rule.action_coupling) is not Coupling.IMMEDIATE):
        return None
    action = rule.action_function()
    if isinstance(action, DeclaredAction) or learned_table(action) is not None:
        return action
    return None


#: The rules an event of a kind and source fires (``RuleManager.fired_by``).
FiredBy: TypeAlias = "Callable[[EventKind, str], tuple[Rule, ...]]"


class Reactions(NamedTuple):
    """What a learned chain's signals and inserted rows fire beside its steps: per signalled name, its ``deferred``
    rules (run with the chain, in the order their queue runs them) and ``steps`` (theirs, for the declaration); per
    ``(EventKind.SIGNAL, name)`` and ``(EventKind.INSERTED, table)``, the ``detached``-family rules a batch records
    with the outcome; ``keyed``, the tables whose inserted rows rules hear, with their key's sequence (each row's key
    drawn as it is inserted); ``depends``, every ``(kind, source)`` looked up with the rules found (a batch lowered
    with these reactions is the same as firing only while they are)."""

    deferred: dict[str, tuple["Rule", ...]]
    steps: dict[str, tuple[Step, ...]]
    detached: dict[tuple[EventKind, str], tuple["Rule", ...]]
    keyed: dict[str, str]
    depends: dict[tuple[EventKind, str], tuple["Rule", ...]]

    def merged(self, other: "Reactions") -> "Reactions":
        return Reactions({**self.deferred, **other.deferred}, {**self.steps, **other.steps},
                         {**self.detached, **other.detached}, {**self.keyed, **other.keyed},
                         {**self.depends, **other.depends})


_NO_REACTIONS = Reactions({}, {}, {}, {}, {})


def learned_chain(fired: tuple["Rule", ...]) -> tuple[tuple[Step, ...], Learned, tuple["Rule", ...]] | NotLearned:
    """The steps of a :class:`LearnedDeclaration` that runs the rules a stream event fires (``fired``, in the order
    the dispatch fires them), and what was learned of the row they name, if firing them is the same as running one
    state transaction of the event's row (the package README, "Plain rules lowered"): every rule immediate (event–
    condition and condition–action), its action a plain function that only reads and writes its event's row of one
    table (``learned_table``) or at most reads it (``learned_condition``: a check that raises to reject its event),
    one action at least writing, and its condition, if any, one that at most reads that row (``learned_condition``) —
    one table and one key expression for all; and no two of one priority (such a group may run concurrently, in an
    order no batch can know).  Rules of the detached family beside them (:func:`detached_rules`) are no steps: they
    are recorded with each event's outcome.  Also the rules of the steps, in their order.  Otherwise why not, naming
    the rule."""
    immediate = _split(fired)
    if isinstance(immediate, NotLearned):
        return immediate
    ordered = _in_priority_order(immediate[0])
    if isinstance(ordered, NotLearned):
        return ordered
    steps: list[Step] = []
    named: list[tuple[str, Learned]] = []     # what each condition and action names (a table "": no row)
    inserts: frozenset[str] = frozenset()
    signals: frozenset[str] = frozenset()
    for rule in ordered:
        action = rule.action_function()
        # An action that writes the row or inserts, or one that at most reads it (a check that raises to reject its
        # event).
        learned = learned_table(action) or learned_condition(action)
        if learned is None:
            return NotLearned(f"the action of rule {rule.name!r}: {why_not_learned(action)}")
        named.append((rule.name, learned))
        inserts |= learned.inserts
        signals |= learned.signals
        condition = rule.condition_function()
        if condition is not None:
            reads = learned_condition(condition)
            if reads is None:
                return NotLearned(f"the condition of rule {rule.name!r}: {why_not_learned(condition, True)}")
            named.append((rule.name, reads))
        steps.append((condition, action))
    chain = next((learned for _, learned in named if learned.table), None)     # the first function's that names the row
    if chain is None:
        return NotLearned("no rule reads or writes the event's row")
    if not any(learned_table(action) is not None for _, action in steps):
        return NotLearned("no rule's action writes the event's row or inserts one")
    for name, learned in named:
        if learned.table and (learned.table, learned.key_source) != (chain.table, chain.key_source):
            return NotLearned(f"rule {name!r} names another row than the chain's first ({learned.table!r} "
                              f"by {'event.key' if not learned.key_source else 'another key expression'}, not "
                              f"{chain.table!r}): all rules of a type must name one row")
    chain = chain._replace(inserts=inserts, signals=signals)
    return tuple(steps), chain, ordered


def _in_priority_order(fired: tuple["Rule", ...], where: str = "") -> tuple["Rule", ...] | NotLearned:
    """``fired`` in the order firing runs them, by priority, or why not: two rules of one priority (``where``: what
    the message says of them besides) may run concurrently, in an order no batch can know."""
    groups = priority_groups(fired, key=lambda rule: rule.priority)
    for group in groups:
        if len(group) > 1:
            return NotLearned(f"rules {', '.join(repr(rule.name) for rule in group)}{where} share priority "
                              f"{group[0].priority}: they may run concurrently, in an order a batch cannot know")
    return tuple(rule for group in groups for rule in group)


def _reactions(chain: Learned, fired_by: FiredBy) -> tuple[Reactions, frozenset[str]] | NotLearned:
    """What ``chain``'s signals and inserted rows fire, if a batch can run and record it as firing does, and every table
    the chain and those rules insert into; otherwise why not (naming the rule).  On a signal: deferred rules (event–
    condition deferred, condition–action immediate) of distinct priorities, each condition and action passing the
    static check on a signal (``on_signal``: it reads or writes at most the chain's row, by any expression of the
    signal, checked at run time) and signalling nothing; and rules of the detached family.  On the rows inserted into
    a table: rules of the detached family only (their keys are drawn as the rows are inserted: ``keyed``, its
    sequences filled in by the caller)."""
    if not chain.signals and not chain.inserts:
        return _NO_REACTIONS, frozenset()
    deferred: dict[str, tuple[Rule, ...]] = {}
    steps: dict[str, tuple[Step, ...]] = {}
    detached: dict[tuple[EventKind, str], tuple[Rule, ...]] = {}
    depends: dict[tuple[EventKind, str], tuple[Rule, ...]] = {}
    inserts = set(chain.inserts)
    for name in sorted(chain.signals):
        found = depends[EventKind.SIGNAL, name] = fired_by(EventKind.SIGNAL, name)
        split = _split(found, Coupling.DEFERRED)
        if isinstance(split, NotLearned):
            return NotLearned(f"{split} (on the signal {name!r})")
        ordered = _in_priority_order(split[0], f", deferred on the signal {name!r},")
        if isinstance(ordered, NotLearned):
            return ordered
        found_steps: list[Step] = []
        for rule in ordered:
            action, condition = rule.action_function(), rule.condition_function()
            learned = learned_table(action, on_signal=True) or learned_condition(action, on_signal=True)
            if learned is None:
                return NotLearned(f"the action of rule {rule.name!r} (on the signal {name!r}): "
                                  f"{why_not_learned(action, on_signal=True)}")
            reads = learned_condition(condition, on_signal=True) if condition is not None else None
            if condition is not None and reads is None:
                return NotLearned(f"the condition of rule {rule.name!r} (on the signal {name!r}): "
                                  f"{why_not_learned(condition, True, on_signal=True)}")
            if learned.signals:
                return NotLearned(f"rule {rule.name!r}, deferred on the signal {name!r}, signals "
                                  f"{', '.join(sorted(learned.signals))} in turn")
            for what in (learned, reads):
                if what is not None and what.table and what.table != chain.table:
                    return NotLearned(f"rule {rule.name!r} on the signal {name!r} names a row of {what.table!r}, not "
                                      f"of {chain.table!r}: all rules of a type must name one row")
            inserts |= learned.inserts
            found_steps.append((condition, action))
        deferred[name], steps[name] = ordered, tuple(found_steps)
        if split[1]:
            detached[EventKind.SIGNAL, name] = split[1]
    keyed: dict[str, str] = {}
    for table in sorted(inserts):
        found = depends[EventKind.INSERTED, table] = fired_by(EventKind.INSERTED, table)
        if not found:
            continue
        split = _split(found)
        if isinstance(split, NotLearned) or split[0]:
            why = split if isinstance(split, NotLearned) else f"rule {split[0][0].name!r} is immediate"
            return NotLearned(f"{why} (on rows inserted into {table!r}): a batch records only the detached family's "
                              f"firings on the rows its rules insert")
        detached[EventKind.INSERTED, table] = split[1]
        keyed[table] = ""
    return Reactions(deferred, steps, detached, keyed, depends), frozenset(inserts)


def _split(fired: tuple["Rule", ...], runs: Coupling = Coupling.IMMEDIATE
           ) -> tuple[tuple["Rule", ...], tuple["Rule", ...]] | NotLearned:
    """``fired`` as the rules a batch runs in each event's state transaction — those of coupling ``runs``: immediate
    on a stream event, deferred on a chain's signal — and the detached-family rules it records with each event's
    outcome (their condition–action coupling immediate: no gate to wait in), or why not (another coupling that runs
    as a subtransaction, a C-A coupling of another mode)."""
    immediate: list[Rule] = []
    detached: list[Rule] = []
    for rule in fired:
        coupling, action_coupling = Coupling.parse(rule.coupling), Coupling.parse(rule.action_coupling)
        if action_coupling is not Coupling.IMMEDIATE or (coupling.runs_as_subtransaction and coupling is not runs):
            mode = coupling if action_coupling is Coupling.IMMEDIATE else action_coupling
            return NotLearned(f"rule {rule.name!r} is {mode.value.replace('_', ' ')}" + (
                " (condition-action)" if mode is action_coupling and mode is not coupling else "") +
                f": a batch runs {runs.value} rules and records the detached family's")
        (immediate if coupling.runs_as_subtransaction else detached).append(rule)
    return tuple(immediate), tuple(detached)


def detached_rules(fired: tuple["Rule", ...]) -> tuple["Rule", ...]:
    """The detached-family rules among ``fired`` (a batch records them with each event's outcome)."""
    split = _split(fired)
    return () if isinstance(split, NotLearned) else split[1]


def _process_refusal(rules: "RuleManager", manager: "TransactionManager") -> str | None:
    """Why no batch of this process lowers (something hears what firing does event by event), or None."""
    if manager.recorder is not None:
        return "the history recorder records every firing (record_history)"
    if any(True for _ in manager.observers):
        return "an observer hears every transaction and firing (db.observe, explain_deadlocks)"
    if any(getattr(hook, "__self__", None) is not rules for hook in manager.extensions.on_event):
        return "another extension hears emitted events (pattern queries, composite events, capture)"
    return None


def _type_refusal(manager: "TransactionManager", fired: tuple["Rule", ...], fired_by: FiredBy
                  ) -> tuple[Declaring, Reactions] | NotLearned:
    """How a type's ``fired`` rules run as one state transaction per event (a declared rule's declaration, or the
    :class:`LearnedDeclaration` of a chain) with what its signals and inserted rows fire (:func:`_reactions`;
    ``fired_by``: the rules of a kind and source), or why not (the tables rules observe aside:
    :func:`_observed_refusal`)."""
    if not fired:
        return NotLearned("no rule fires on it")
    split = _split(fired)
    if isinstance(split, NotLearned):
        return split
    immediate = split[0]
    if not immediate:
        return NotLearned("no immediate rule fires on it: nothing to run in a batch")
    action = immediate[0].action_function()
    if len(immediate) == 1 and isinstance(action, DeclaredAction):
        if lowerable(immediate[0]) is None:
            return NotLearned(f"the declared rule {immediate[0].name!r} has a condition or is not immediate")
        return action.declaration, _NO_REACTIONS
    found = learned_chain(fired)
    if isinstance(found, NotLearned):
        return found
    steps, learned_from, ordered = found
    reacting = _reactions(learned_from, fired_by)
    if isinstance(reacting, NotLearned):
        return reacting
    reactions, every_insert = reacting
    catalog = manager.catalog
    inserts: dict[str, TableInfo] = {}
    try:
        info = catalog.table_info(learned_from.table)
        for table in every_insert:
            inserts[table] = inserted = catalog.table_info(table)
            sequence = None if len(inserted.key_columns) != 1 else catalog.sequence_of(inserted, inserted.key_columns[0])
            if table == learned_from.table or sequence is None:
                return NotLearned(f"a rule inserts into {table!r}, " + (
                    "the table of the row its rules name" if table == learned_from.table
                    else "whose key is not one column with a sequence (identity, serial)") +
                    ": a batch knows an inserted row's key only at commit")
            if table in reactions.keyed:
                reactions.keyed[table] = sequence
    except SchemaError as error:     # no such table: each firing fails with its own reason
        return NotLearned(str(error))
    return LearnedDeclaration(steps, learned_from, info, [rule.name for rule in ordered], inserts, reactions.steps,
                              reactions.keyed, catalog.next_generated_key), reactions


def _observed_refusal(writes: frozenset[str] | None, observed: frozenset[str]) -> str | None:
    """Why rules on data events keep a batch writing ``writes`` (None: any table, a declared rule's) from being
    lowered, or None: fired event by event they hear each event's change of a row, while a batch at commit changes
    each row once, outside the tree."""
    touched = observed if writes is None else writes & observed
    if not touched:
        return None
    return (f"rules react to data events of {', '.join(sorted(touched))}, which "
            f"{'a declared rule may write' if writes is None else 'these rules write'}: fired event by event they hear "
            f"each change of a row, a batch at commit changes each row once")


def _writes(declaration: Declaring) -> frozenset[str] | None:
    """The tables whose rows a lowered type's declaration changes: a learned chain's one table, or None (a declared
    rule's: known only when it runs).  (The rows a chain inserts fire only the rules on inserted rows, which
    :func:`_reactions` checked.)"""
    if isinstance(declaration, LearnedDeclaration):
        return frozenset((declaration.table,))
    return None


def why_not_lowered(db: "DatabaseHandle", event_type: str) -> str | None:
    """Why the ingestion core's rule path fires a batch of ``event_type``'s events on ``db`` event by event instead
    of lowering it to one batch of state transactions (:func:`lower`), or None if it lowers them — as the rules and
    this process stand now (a learned rule whose lowered attempt a handler saw refused is not known here).  The
    reason names the rule and, where one line of its source is to blame, ``file:line``.  From a shell: ``activedb
    rules lowering APP``.  Both the process's reason and the type's own are given where both hold."""
    verdict = _type_refusal(db.transactions, db.rules.on_stream(event_type), db.rules.fired_by)
    observed = None if isinstance(verdict, NotLearned) else _observed_refusal(_writes(verdict[0]),
                                                                             db.rules.observed_tables())
    reasons = [reason for reason in (_process_refusal(db.rules, db.transactions), verdict, observed)
               if isinstance(reason, str)]
    return "; and ".join(reasons) or None


def lower(rules: "RuleManager", transaction: "Transaction", event_types: Iterable[str],
          cache: dict[object, object] | None = None) -> Lowered | None:
    """The state transactions that fire the rules of ``event_types`` in ``transaction`` as one batch, or None
    when firing them event by event is not the same: every type must fire one :func:`lowerable` declared rule, or
    plain rules that form a :func:`learned_chain` (none refused before: ``Lowered.deviated``);
    nothing else may listen — no other extension hears emitted events, no observer hears node or firing events,
    no history is recorded; and no rule reacts to data events of a table the batch writes (a learned chain's one
    table; any table, for a declared rule): fired event by event it hears each event's change of a row, while a
    batch (``apply_at_commit``, outside the tree) changes each row once.  Why a type is not
    lowered: :func:`why_not_lowered`.

    ``cache``: a dict of the caller's that keeps one :class:`Lowered` per set of rules, so that its
    ``StateTransactions`` learns across batches (its decision model and routes), and the learned rules whose
    lowered attempt was refused; a caller that runs batches concurrently keeps one cache per thread, as a
    ``StateTransactions`` runs one batch at a time."""
    manager = transaction.manager
    if _process_refusal(rules, manager) is not None:
        return None
    deviated = cast("set[Rule]", cache.setdefault(_DEVIATED, set())) if cache is not None else set()
    chosen: dict[str, tuple[Rule, ...]] = {}
    for event_type in sorted(event_types):
        fired = rules.on_stream(event_type)
        if not fired or not deviated.isdisjoint(fired):
            return None
        chosen[event_type] = fired
    key = tuple(chosen.items())
    lowered = cast("Lowered | None", cache.get(key)) if cache is not None else None
    if lowered is not None and lowered.reactions is not None and any(
            rules.fired_by(kind, source) != found for (kind, source), found in lowered.reactions.depends.items()):
        lowered = None         # (a rule on a signal or on inserted rows was declared, dropped or disabled since)
    if lowered is None:
        transactions = StateTransactions("declared rules")
        learned: dict[str, LearnedDeclaration] = {}
        reactions = _NO_REACTIONS
        for event_type, fired in chosen.items():
            verdict = _type_refusal(manager, fired, rules.fired_by)
            if isinstance(verdict, NotLearned):
                return None
            declaration, reacting = verdict
            reactions = reactions.merged(reacting)
            if isinstance(declaration, LearnedDeclaration):
                learned[event_type] = declaration
            transactions.on(event_type)(declaration)
        writes: frozenset[str] | None = frozenset()
        for declaration in transactions.declarations.values():
            tables = _writes(declaration)
            writes = None if tables is None or writes is None else writes | tables
        # A row one type inserts is no state of the batch (its key is drawn at commit): no other type may name rows
        # of that table (as firing, it would see the row).
        inserted = frozenset(table for declaration in learned.values() for table in declaration.inserts)
        if inserted and (writes is None or any(declaration.table in inserted for declaration in learned.values())):
            return None
        detached = {event_type: found for event_type, fired in chosen.items() if (found := detached_rules(fired))}
        lowered = Lowered(transactions, {event_type: tuple(rule for rule in fired if rule not in detached.get(event_type, ()))
                                         for event_type, fired in chosen.items()}, learned, deviated, writes, detached,
                          reactions if reactions.depends else None)
        if cache is not None:
            if len(cache) >= _MAX_CACHED:      # (rules redeclared again and again: keep it bounded)
                cache.clear()
                cache[_DEVIATED] = deviated
            cache[key] = lowered
    observed = rules.observed_tables()
    if observed and _observed_refusal(lowered.writes, observed) is not None:
        return None
    return lowered


def _count_chain(tally: "_Tally", chain: tuple["Rule", ...], declaration: LearnedDeclaration,
                 positions: list[int]) -> None:
    """Add to ``tally`` what the learned ``chain`` did for the events at ``positions`` of a batch, as firing counts it:
    per event, each rule ``executed`` (or ``condition_false``) up to the rule that raised, if one did (``failed``); the
    rules after it did not run (``cancelled``: stopped by that failure), and those before it that ran were undone with
    the event's subtransaction (``cancelled`` too: the rejection undid them, though the batch commits)."""
    executed, condition_false, failed = [0] * len(chain), [0] * len(chain), [0] * len(chain)
    cancelled = [0] * len(chain)
    outcomes, rejected = declaration.outcomes, declaration.rejected
    everything = (True,) * len(chain)
    # The events counted per (the rule that raised, which conditions held): a few kinds, each counted once (the pairs
    # made by ``zip`` and ``map`` over the positions, in C: no Python step per event).
    kinds = Counter(zip(map(rejected.get, positions), map(outcomes.get, positions, repeat(everything))
                        if declaration.conditional else repeat(everything)))
    for (raised, ran), count in kinds.items():
        for index in range(len(chain) if raised is None else raised):
            if ran[index]:
                (executed if raised is None else cancelled)[index] += count
            else:
                condition_false[index] += count
        if raised is not None:
            failed[raised] += count
            for index in range(raised + 1, len(chain)):
                cancelled[index] += count
    for index, rule in enumerate(chain):
        tally.add(rule, "executed", executed[index])
        tally.add(rule, "condition_false", condition_false[index])
        tally.add(rule, "failed", failed[index])
        tally.add(rule, "cancelled", cancelled[index])


class _Tally(CommitParticipant):
    """The rules' counters a lowered batch moves, told to ``rules`` once its transaction committed (enlisted after the
    batch): a flush retried after a conflict runs the batch's ``write`` again, which starts the tally afresh
    (``reset``), so only the attempt that committed counts.  If the transaction aborts, the firings of rules that run
    in it (immediate, deferred) count as firing counts them in a tree that aborted: ``condition_false`` and ``failed``
    as the last attempt found them, every other one ``cancelled`` — the abort undid it, or it never ran.  The detached
    family's are the outbox's to count: on the abort the tally hands the outbox's recorder of decided firings
    (``decides``; enlisted after the tally on the same transaction, so it hears the abort after it, on a
    subtransaction that committed into its parent too) every detached-family firing on the
    batch's events with an aborted outcome — the last attempt's, and those it did not make (a mode that does not run
    after its event's outcome, or every one if no attempt ran: the transaction aborted before its flush) —, which it
    ends as a tree's aborted firings.  Once the transaction ended, the learned chains forget the batch
    (``LearnedDeclaration.release``)."""

    def __init__(self, rules: "RuleManager", learned: Iterable[LearnedDeclaration]) -> None:
        self._rules = rules
        self._learned = tuple(learned)
        self._counts: list[tuple[Rule, RuleCounter, int]] = []
        self._fired: dict[Rule, int] = {}
        self._dispatched: Counter[Rule] = Counter()     # (``fired_in_bulk``: the firings of the batch's events)
        self._decided: DecidedFirings | None = None
        self._unmade: Callable[[set[int] | None], list[tuple[Firing, str, bool]]] | None = None
        # The last attempt's detached-family firings and the positions of the events it rejected (None: no attempt).
        self._attempt: tuple[list[tuple[Firing, str, bool]], set[int]] | None = None

    def decides(self, decided: "DecidedFirings",
                unmade: Callable[[set[int] | None], list[tuple["Firing", str, bool]]]) -> None:
        """The batch's detached-family firings go to ``decided``; ``unmade(rejected)``: the firings on the batch's
        events an attempt that rejected ``rejected`` (None: no attempt) did not make, each with an aborted outcome."""
        self._decided, self._unmade = decided, unmade

    def attempted(self, firings: list[tuple["Firing", str, bool]], rejected: set[int]) -> None:
        """This attempt made ``firings`` (what it hands ``decided``), rejecting the events at ``rejected``."""
        self._attempt = firings, rejected

    def dispatched(self, transaction: "Transaction", rule: "Rule", count: int) -> None:
        """``rule`` fired ``count`` times on the batch's events: recorded in the tree's firing record now."""
        self._rules.fired_in_bulk(transaction, rule, count)
        self._dispatched[rule] += count

    def reset(self) -> None:
        self._counts = []
        self._attempt = None

    def fired(self, transaction: "Transaction", rule: "Rule", total: int) -> None:
        """``rule`` fired ``total`` times in this attempt (on what the batch's rules did: signals, inserted rows),
        recorded in the tree's firing record now (its log row is written after the participants' writes): an
        attempt again records the difference with the last one's."""
        delta = total - self._fired.get(rule, 0)
        if delta:
            self._rules.fired_in_bulk(transaction, rule, delta)
            self._fired[rule] = total

    def add(self, rule: "Rule", what: "RuleCounter", amount: int) -> None:
        if amount:
            self._counts.append((rule, what, amount))

    def write(self, transaction: "Transaction", connection: sa.Connection) -> None:
        pass

    def committed(self, transaction: "Transaction") -> None:
        counts, self._counts = self._counts, []
        for rule, what, amount in counts:
            self._rules.count(rule, what, amount)
        for declaration in self._learned:
            declaration.release()

    def aborted(self, transaction: "Transaction", error: BaseException | None) -> None:
        counts, self._counts = self._counts, []
        fired = self._dispatched + Counter(self._fired)
        ended: Counter[Rule] = Counter()
        for rule, what, amount in counts:
            if (what == "condition_false" or what == "failed") and rule.coupling.runs_as_subtransaction:
                self._rules.count(rule, what, amount)
                ended[rule] += amount
        for rule, total in fired.items():
            if rule.coupling.runs_as_subtransaction and total > ended[rule]:
                self._rules.count(rule, "cancelled", total - ended[rule])
        if self._decided is not None and self._unmade is not None:
            # Every trigger aborted with the tree: the recorder (aborted after this) ends them all as firing's
            # aborted tree does — runs those whose mode runs after an abort, cancels the others.
            made, rejected = self._attempt if self._attempt is not None else ([], None)
            self._decided.set_decided([(firing, trigger, False) for firing, trigger, _ in made]
                                      + self._unmade(rejected))
        for declaration in self._learned:
            declaration.release()


#: The key of ``lower``'s cache under which the learned rules refused before are kept.
_DEVIATED = ("learned rules whose lowered attempt was refused",)
_MAX_CACHED = 64


def apply_lowered(rules: "RuleManager", transaction: "Transaction", events: Iterable[object], lowered: Lowered, *,
                  on_result: Callable[[BatchResult, sa.Connection], None] | None = None,
                  rejection: Rejection | None = None, **options: Any) -> PendingBatch:
    """Run ``events`` — their types lowered by :func:`lower` — as one batch at the commit of ``transaction``
    (:func:`~activedb.batch.apply_at_commit` with ``options``) and keep the rules' firing record as firing them
    would: each event's firing recorded as dispatched at once (``rules.fired_in_bulk``: the tree's
    ``rule_firings``), ``executed`` and ``failed`` counted once it committed (the attempt that committed: a flush tried
    again writes the batch again), the detached family's firings recorded in the commit; ``on_result(result,
    connection)`` inside the commit.  Raises what ``apply_at_commit`` raises, with nothing recorded; ``lowered`` None (what
    :func:`lower` returns when the events cannot be lowered) is refused with what to do instead.
    ``rejection(failure)``: the dead-letter reason of an event whose learned plain rule raised an error of its own,
    given the ``RuleFailed`` firing would raise (the ingestion core's rule path passes its own): the event is then a
    dead letter of the lowered batch, as firing makes it one; None: such an event makes the lowered attempt
    refused (``LoweringRefused``), the batch to run event by event."""
    if lowered is None:
        raise DeclarationError(
            "apply_lowered(..., lowered=None): lower() found these events' rules cannot run as one batch (a type "
            "fires another rule too, or a rule with a condition or another coupling, a rule reacts to data events, "
            "or an observer or the history recorder listens); fire them one by one instead: tx.emit(type, ...) "
            "per event, each in tx.subtransaction() if one may fail alone")
    # The detached family's firings and the rows of those that run in the commit are made while PostgreSQL runs the
    # batch's statements (``sent``), then written and counted once those are (``counted``).
    planned: list[tuple[list[tuple[Firing, str, bool]], InCommit | None]] = []

    def sent(result: BatchResult) -> None:
        planned.clear()
        tally.reset()          # (a retried flush writes the batch again: its counts and firings replace these)
        failed = Counter(event.event_type for event, _ in result.dead_letters)
        learned = lowered.learned
        refused = sorted({event.event_type for event, _ in result.dead_letters if event.event_type in learned
                          and event.position not in learned[event.event_type].rejected})
        if refused:
            # A learned rule's action raised or did what its lowered form cannot (or the store refused an event
            # of it): only firing event by event gives the true outcome and reason.  Nothing is written.
            chains = [rule for event_type in refused for rule in lowered.rules[event_type]]
            lowered.deviated.update(chains)
            raise LoweringRefused(
                f"the lowered batch of the plain rule(s) {', '.join(rule.name for rule in chains)} met "
                f"{sum(failed[t] for t in refused)} event(s) its lowered form cannot run as firing would; run the "
                f"batch again event by event (the ingestion's rule path does so by itself)")
        positions: dict[str, list[int]] | None = None       # (per type, made when a learned chain needs them)
        for event_type, count in per_type.items():
            chain = lowered.rules[event_type]
            declaration = lowered.learned.get(event_type)
            if declaration is None or not (declaration.conditional or declaration.rejected):
                # A declared rule, or a chain without conditions none of whose rules raised: each action ran for
                # each event not refused.
                for rule in chain:
                    tally.add(rule, "executed", count - failed[event_type])
                    tally.add(rule, "failed", failed[event_type])
                continue
            # A learned chain: each rule's action ran where its condition held, up to a rule that raised, if one did
            # (its event a dead letter: that rule failed, the rules after it did not run).
            if positions is None:
                # (Each type's list made first: an ``append`` per event, not a ``setdefault`` and an ``append``.)
                positions = {kind: [] for kind in per_type}
                for event in pending.batch:
                    positions[event.event_type].append(event.position)
            _count_chain(tally, chain, declaration, positions.get(event_type, []))
        inserted = result.inserted() if reactions is not None and reactions.keyed else {}
        if reactions is not None:
            _count_reactions(tally, transaction, lowered, reactions, inserted)
        if decided is not None:
            rejected = {event.position for event, _ in result.dead_letters}
            firings = _detached_firings(rules, transaction, pending.batch, per_type, lowered, rejected, inserted,
                                        tally)
            tally.attempted(firings, rejected)
            planned.append((firings, plan_in_commit(rules, transaction, firings) if in_commit else None))

    def counted(result: BatchResult, connection: sa.Connection) -> None:
        for firings, plan in planned:
            # Those that only insert run here, in this commit; the others are recorded for the outbox's runners (and
            # those too if the commit fails after all: the recorder handles them as a tree's firings on the abort).
            ran = plan.insert(connection, catalog) if plan is not None else []
            for rule, count in Counter(firing.rule for firing, _, _ in ran).items():
                tally.add(rule, "executed", count)
            decided.set_decided(firings, ran)  # type: ignore[union-attr]  # (planned only when decided)
        if on_result is not None:
            on_result(result, connection)

    reactions = lowered.reactions
    since = transaction.root.began_at
    for declaration in lowered.learned.values():
        declaration.prepare(transaction.id, rejection, since)
    catalog = transaction.manager.catalog

    def keys_check() -> KeysCheck | None:
        """The check that the keys the rules' inserted rows drew are still the sequences' (as a flush checks a
        tree's)."""
        drawn: dict[str, list[int]] = {}
        for declaration in lowered.learned.values():
            if declaration.reset is not None:
                raise declaration.reset
            for sequence, keys in declaration.drawn.items():
                drawn.setdefault(sequence, []).extend(keys)
        return catalog.generated_keys_check(drawn, since) if drawn else None

    if reactions is not None and reactions.keyed:
        options["keys_check"], options["heard"] = keys_check, frozenset(reactions.keyed)
    def check_rows() -> None:
        """The learned chains' inserted rows checked as each is made, from now on (``apply_at_commit``)."""
        for declaration in lowered.learned.values():
            declaration.check_rows()

    pending = apply_at_commit(transaction, events, lowered.transactions, on_sent=sent, on_result=counted,
                              check_rows=check_rows, **options)
    # Enlisted after the batch, whose write decides each event's outcome: the detached family's firings are
    # recorded in the same commit, each with its event's outcome (a rejected event's subtransaction aborted); the
    # counters are told once it committed.  The tally before the recorder: on an abort it hands the recorder the
    # firings first.  All three on ``transaction``: a subtransaction that commits hands them to its parent in this
    # order (the recorder enlisted on the root, the batch's write and the tally's abort would come after its own).
    tally = _Tally(rules, lowered.learned.values())
    lowlevel.enlist(transaction, tally)
    decided = (rules.detached.decided(transaction)
               if lowered.detached or (reactions is not None and reactions.detached) else None)
    in_commit = decided is not None and rules.detached.inserts_in_commit
    if decided is not None:
        tally.decides(decided, functools.partial(_unmade_firings, rules, transaction.id, pending.batch, lowered))
    per_type = Counter(map(_EVENT_TYPE, pending.batch))      # (the events as apply_at_commit read them)
    for event_type, count in per_type.items():
        for rule in (*lowered.rules[event_type], *lowered.detached.get(event_type, ())):
            tally.dispatched(transaction, rule, count)
    return pending


def _count_reactions(tally: _Tally, transaction: "Transaction", lowered: Lowered, reactions: Reactions,
                     inserted: dict[str, list[RowImage]]) -> None:
    """Add to ``tally`` what the rules on the chains' signals and inserted rows did in this attempt, as firing counts
    it: each fired once per signal or per row inserted (a rejected event's too: firing dispatched them before the
    event's subtransaction aborted), a deferred rule ``executed`` or ``condition_false`` per signal whose deferred
    queue ran."""
    fired: Counter[Rule] = Counter()
    executed: Counter[Rule] = Counter()
    condition_false: Counter[Rule] = Counter()
    signal = EventKind.SIGNAL
    # The signals per name, and the deferred runs per name and which of its rules ran, counted first: the rules' counts
    # are theirs times each rule.
    signalled: Counter[str] = Counter()
    deferred_runs: Counter[tuple[str, tuple[bool, ...]]] = Counter()
    for declaration in lowered.learned.values():
        signalled.update(event.source  # type: ignore[misc]  # (a signal's name)
                         for signals in declaration.signals.values() for event in signals)
        deferred_runs.update((event.source, ran)  # type: ignore[misc]
                             for runs in declaration.deferred.values() for event, ran in runs)
        for rows in declaration.rejected_rows.values():
            for table, found in rows.items():
                for rule in reactions.detached.get((EventKind.INSERTED, table), ()):
                    fired[rule] += len(found)
    for name, count in signalled.items():
        for rule in (*reactions.deferred.get(name, ()), *reactions.detached.get((signal, name), ())):
            fired[rule] += count
    for (name, ran), count in deferred_runs.items():
        for rule, did in zip(reactions.deferred[name], ran):
            (executed if did else condition_false)[rule] += count
    for table in reactions.keyed:
        for rule in reactions.detached.get((EventKind.INSERTED, table), ()):
            fired[rule] += len(inserted.get(table, ()))
    for rules in reactions.depends.values():
        for rule in rules:
            tally.fired(transaction, rule, fired[rule])
    for rule, count in executed.items():
        tally.add(rule, "executed", count)
    for rule, count in condition_false.items():
        tally.add(rule, "condition_false", count)


def _detached_firings(rules: "RuleManager", transaction: "Transaction", batch: Iterable[BatchEvent],
                      per_type: Mapping[str, int], lowered: Lowered, rejected: set[int],
                      inserted: dict[str, list[RowImage]], tally: _Tally) -> list[tuple["Firing", str, bool]]:
    """Each event's detached-family firings — on the event itself, on the signals its chain raised — its outcome
    committed unless it is ``rejected`` (by position), then those on the rows the batch inserted (committed; a
    rejected event's, aborted): what the outbox records in the tree's flush for events of subtransactions of their
    own, which the batch does not have (each firing's trigger is the batch's transaction).  A rule on the event
    itself whose mode does not run after its event's outcome (an exclusive causally dependent rule on an event that
    committed) is counted ``cancelled`` in ``tally`` at once, as the outbox would count it, without a firing (made
    if the transaction aborts after all: :func:`_unmade_firings`).  ``per_type``: the batch's events per type."""
    firings: list[tuple[Firing, str, bool]] = []
    detached, reactions, tid = lowered.detached, lowered.reactions, transaction.id
    events = batch if isinstance(batch, list) else list(batch)
    # Per type and outcome, the rules that run after it; the others are cancelled (counted per event).
    running: dict[tuple[str, bool], tuple[Rule, ...]] = {}
    for event_type, found in detached.items():
        for committed in (False, True):
            running[event_type, committed] = tuple(rule for rule in found if may_run_after(rule.coupling, committed))
    # The events that need a look: a rejected one, one of a type with rules that run after a commit, one whose
    # chain signalled or that inserted rows before it was rejected (in the batch's order: the dispatch's).
    wanted = set(rejected)
    after_commit = {event_type for (event_type, committed), runs in running.items() if committed and runs}
    if after_commit:
        wanted.update(event.position for event in events if event.event_type in after_commit)
    for declaration in lowered.learned.values():
        wanted.update(declaration.signals)
        wanted.update(declaration.rejected_rows)
    firing, learned, append = rules.firing, lowered.learned if reactions is not None else {}, firings.append
    on_signal = reactions.detached if reactions is not None else {}
    signal_kind = EventKind.SIGNAL
    for event in (events[position] for position in sorted(wanted)) if len(wanted) < len(events) else events:
        committed = event.position not in rejected
        runs = running.get((event.event_type, committed))
        if runs:
            stream_event = _stream_event(event, tid)
            for rule in runs:
                append((firing(rule, stream_event), tid, committed))
        chain = learned.get(event.event_type)
        if chain is not None:
            signals = chain.signals.get(event.position)
            if signals:
                for signal in signals:
                    for rule in on_signal.get((signal_kind, signal.source), ()):  # type: ignore[arg-type]
                        append((firing(rule, signal), tid, committed))
            rows = chain.rejected_rows.get(event.position)
            if rows:
                firings.extend(_on_rows(rules, transaction, reactions, rows, False))  # type: ignore[arg-type]
    # Cancelled: per type, its events of each outcome times the rules that do not run after it.
    refused = Counter(events[position].event_type for position in rejected)
    for event_type, rules_of_type in detached.items():
        accepted = per_type.get(event_type, 0) - refused[event_type]
        for committed, count in ((False, refused[event_type]), (True, accepted)):
            if count:
                for rule in rules_of_type:
                    if rule not in running[event_type, committed]:
                        tally.add(rule, "cancelled", count)
    if reactions is not None and inserted:
        firings.extend(_on_rows(rules, transaction, reactions, inserted, True))
    return firings


def _unmade_firings(rules: "RuleManager", tid: str, batch: Iterable[BatchEvent], lowered: Lowered,
                    rejected: set[int] | None) -> list[tuple["Firing", str, bool]]:
    """The detached-family firings on the batch's events themselves that an attempt which rejected the events at
    ``rejected`` did not make (:func:`_detached_firings` makes only those whose mode runs after the event's outcome)
    — every one if no attempt ran (``rejected`` None: the transaction aborted before its flush) —, each with an
    aborted outcome: for the batch's transaction that aborted, whose recorder ends them as firing's aborted tree
    does."""
    detached, firing = lowered.detached, rules.firing
    unmade: list[tuple[Firing, str, bool]] = []
    for event in batch:
        found = detached.get(event.event_type)
        if not found:
            continue
        committed = rejected is not None and event.position not in rejected
        stream_event: Event | None = None
        for rule in found:
            if rejected is None or not may_run_after(rule.coupling, committed):
                if stream_event is None:
                    stream_event = _stream_event(event, tid)
                unmade.append((firing(rule, stream_event), tid, False))
    return unmade


def _on_rows(rules: "RuleManager", transaction: "Transaction", reactions: Reactions,
             rows: dict[str, list[RowImage]], committed: bool) -> list[tuple["Firing", str, bool]]:
    """The detached-family firings on ``rows`` inserted into ``keyed`` tables (each row its key drawn), each on the
    data event ``tx.insert`` raises: the stored row — every column, those not given at their constant defaults."""
    firings: list[tuple[Firing, str, bool]] = []
    catalog = transaction.manager.catalog
    for table in sorted(reactions.keyed):
        found, inserted = reactions.detached.get((EventKind.INSERTED, table)), rows.get(table)
        if not found or not inserted:
            continue
        info = catalog.table_info(table)
        column, blank = info.key_columns[0], info.blank_row
        for row in inserted:
            event = new_event(EventKind.INSERTED, table, row[column], None, {**blank, **row}, None, None,
                              transaction.id)
            firings.extend((rules.firing(rule, event), transaction.id, committed) for rule in found)
    return firings


class _DeclaredRules:
    """The batch form of declared rules and of learned plain rules (``activedb.ingest``'s ``BatchLowering``):
    :func:`lower`, :func:`apply_lowered`, and :meth:`refused`.  Stateless."""

    lower = staticmethod(lower)
    apply = staticmethod(apply_lowered)

    @staticmethod
    def refused(failure: BaseException) -> bool:
        """Whether ``failure`` (a failed commit) is a lowered attempt refused because a learned rule's action
        did something its lowered form cannot do (:class:`~activedb.batch.errors.LoweringRefused`): the batch is
        to run event by event."""
        return any(isinstance(cause, LoweringRefused) for cause in causes(failure))


#: The lowering of rules the ingestion core's rule path uses (``activedb.ingest.BatchLowering``): offered by a
#: declared rule's action (``DeclaredAction.batch_lowering``) and by the database (``Database.rule_lowering``).
RULE_LOWERING = _DeclaredRules()
DeclaredAction.batch_lowering = RULE_LOWERING
