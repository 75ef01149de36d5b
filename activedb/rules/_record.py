"""The firing record of one rule manager (``db.rules.statistics()``): per rule its ``RuleCounters``, per
E-C coupling its firings.  A tree's firings are counted on its root's ``RuleContext`` (also its
transaction-log row's ``rule_firings``) and added here once, when the tree ends (``fold``), not per firing; so are
its executed firings (``executed``), added as ``executed`` if the tree committed and as ``cancelled`` if it aborted.
An executed firing is recorded on the transaction it ran under (its parent), which passes it on as it ends
(``passed_on``): to its own parent when it commits, as ``cancelled`` when it aborts — up to the root.
``_mutex`` (a leaf) protects the counters and the ``firings``/``couplings``/``executed`` of the contexts.
"""

from __future__ import annotations

import collections
import threading
from typing import TYPE_CHECKING, Iterable

from coupling import Coupling

from activedb.rules._context import RuleContext
from activedb.rules._model import RuleCounter, RuleCounters
from activedb.txn import TxnState, slot

if TYPE_CHECKING:  # pragma: no cover
    from activedb.rules._model import Firing, Rule
    from activedb.txn import Transaction


#: The states of a tree that has ended (its root's): ``FiringRecord.fold`` has run for it, or will not find a firing.
_ENDED = frozenset({TxnState.COMMITTED, TxnState.ABORTED})


class FiringRecord:
    """The counters of one rule manager (see the module docstring)."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._counters: dict[str, RuleCounters] = collections.defaultdict(RuleCounters)
        self._per_mode: collections.Counter[Coupling] = collections.Counter()

    def dispatched(self, root: "Transaction", context: RuleContext, rules: "Iterable[Rule]") -> None:
        """``rules`` fired in ``root``'s tree, whose ``RuleContext`` is ``context`` (a tree that has ended
        already is counted at once)."""
        mutex = self._mutex
        mutex.acquire()         # (not ``with``: half its cost)
        try:
            tally = context.firings
            if tally is not None and context.couplings is not None:
                for rule in rules:
                    name = rule.name
                    if name in tally:
                        tally[name] += 1        # (what ``_tally`` does for a rule the live tree counted already)
                    else:
                        self._tally(root, context, rule)
            else:
                for rule in rules:
                    self._tally(root, context, rule)
        finally:
            mutex.release()

    def dispatched_many(self, root: "Transaction", context: RuleContext, rule: "Rule", count: int) -> None:
        """``count`` firings of ``rule`` in ``root``'s tree: what ``dispatched`` with ``rule`` ``count`` times
        records, in one step (a lowered batch fires a rule once per event)."""
        with self._mutex:
            self._tally(root, context, rule, count)

    def ran(self, root: "Transaction", context: RuleContext, rule: "Rule", executed: bool) -> None:
        """One firing of ``rule`` in ``root``'s tree ran (the dispatch of a single immediate firing counts it
        when it has ended, not before): ``dispatched`` and, if ``executed`` (its action ran and its
        subtransaction committed), :meth:`executed` — one mutex section and one call per firing."""
        name = rule.name
        mutex = self._mutex
        mutex.acquire()
        try:
            tally = context.firings
            if tally is not None and context.couplings is not None and name in tally:
                tally[name] += 1        # (what ``_tally`` does for a rule the live tree counted already)
            else:
                self._tally(root, context, rule)
            if executed:
                done = context.executed
                if done is None:
                    context.executed = {name: 1}
                else:
                    done[name] = done.get(name, 0) + 1
        finally:
            mutex.release()

    def _tally(self, root: "Transaction", context: RuleContext, rule: "Rule", firings: int = 1) -> None:
        """Count ``firings`` firings of ``rule`` in the tree of ``root`` (``context``: its ``RuleContext``).
        Caller holds ``_mutex``."""
        tally = context.firings
        if tally is None:
            # The tree's first firing.  A tree that ended without one was not folded (``fold`` had nothing to add),
            # yet it has ended as a folded one has: its firings are counted at once (``couplings`` stays None).
            tally = context.firings = {}
            if root.state not in _ENDED:
                context.couplings = {}
            root.info.setdefault("rule_firings", tally)
        name = rule.name
        count = tally.get(name)
        tally[name] = firings if count is None else count + firings
        couplings = context.couplings
        if not tally[name] and couplings is not None:     # (firings taken back: ``dispatched_many``)
            del tally[name]
            couplings.pop(name, None)
            return
        if couplings is None:         # the tree has ended and was folded: count at once
            self._counters[name].fired += firings
            self._per_mode[rule.coupling] += firings
        elif count is None:
            couplings[name] = rule.coupling

    def fold(self, root: "Transaction") -> None:
        """``root``'s tree ended: add its firing record to the counters, and its executed firings — as ``executed`` if
        it committed, as ``cancelled`` if it aborted (the abort undid them).
        (Called after the root's state became COMMITTED or ABORTED: a tree with no firing yet has nothing to fold,
        and ``_tally`` counts a firing into it at once by that state.)"""
        context = slot(root, RuleContext, create=False)
        if context is None or (context.couplings is None and context.executed is None):
            return
        committed = root.state is TxnState.COMMITTED
        with self._mutex:
            executed, context.executed = context.executed, None
            if executed:
                # An aborted tree undid their work: the abort, not the rule, stopped them — cancelled.
                outcome = "executed" if committed else "cancelled"
                for name, count in executed.items():
                    counter = self._counters[name]
                    setattr(counter, outcome, getattr(counter, outcome) + count)
            couplings = context.couplings
            if couplings is None:
                return
            # (Folded even when empty — every firing taken back: ``couplings`` None is what makes a firing
            # counted into the ended tree later reach the counters at once.)
            context.couplings = None
            for name, count in (context.firings or {}).items():
                self._counters[name].fired += count
                self._per_mode[couplings[name]] += count

    def attempted(self, firings: "Iterable[Firing]") -> None:
        """``firings``, planned and run before in their tree, run again: each counts ``fired`` once more, an attempt,
        at once (``RuleManager.fire(again=True)``); the tree's firing record keeps them planned once."""
        with self._mutex:
            for firing in firings:
                self._counters[firing.rule.name].fired += 1
                self._per_mode[firing.rule.coupling] += 1

    def count(self, name: str, what: RuleCounter, amount: int = 1) -> None:
        """Add ``amount`` to counter ``what`` (a ``RuleCounters`` field) of rule ``name``."""
        with self._mutex:
            counter = self._counters[name]
            setattr(counter, what, getattr(counter, what) + amount)

    def executed(self, context: RuleContext, names: "list[str]") -> None:
        """Firings of the rules ``names`` (one name per firing) executed — their actions ran and their subtransactions
        committed — under the transaction whose ``RuleContext`` is ``context`` (the root's, or a subtransaction's,
        which passes them on: ``passed_on``): counted ``executed`` when the tree commits (``fold``), ``cancelled`` if
        it or a subtransaction they ran under aborts.  One mutex section for them all."""
        mutex = self._mutex
        mutex.acquire()
        try:
            done = context.executed
            if done is None:
                done = context.executed = {}
            for name in names:
                done[name] = done.get(name, 0) + 1
        finally:
            mutex.release()

    def passed_on(self, context: RuleContext, parent: RuleContext | None) -> None:
        """A subtransaction whose ``RuleContext`` is ``context`` ended, with executed firings recorded on it
        (:meth:`executed`): they go to ``parent``, its parent's ``RuleContext``, if it committed, and count
        ``cancelled`` if it aborted (``parent`` None) — the abort undid them, even if their tree commits."""
        with self._mutex:
            executed, context.executed = context.executed, None
            if not executed:
                return
            if parent is None:
                for name, count in executed.items():
                    self._counters[name].cancelled += count
                return
            done = parent.executed
            if done is None:
                parent.executed = executed
            else:
                for name, count in executed.items():
                    done[name] = done.get(name, 0) + count

    def snapshot(self) -> tuple[dict[str, RuleCounters], dict[str, int]]:
        """Copies of the per-rule counters and of the per-coupling firings (by the coupling's value)."""
        with self._mutex:
            counters = {name: RuleCounters(**vars(counter)) for name, counter in self._counters.items()}
            per_mode = {coupling.value: count for coupling, count in self._per_mode.items()}
        return counters, per_mode
