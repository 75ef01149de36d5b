"""ECA rules: declaring, persisting and firing them in all six coupling modes.  Design note: ``README.md``.

Public names: :class:`RuleManager` (``db.rules``), :class:`Rule`, :class:`FunctionRule`, :class:`Firing`,
:class:`FiringOutcome` and :class:`Fired` (:meth:`RuleManager.fire`),
:class:`RuleCounters` (and :data:`RuleCounter`, the name of one of its fields), :class:`RulesStatistics`,
:class:`RuleContext` (the rules' per-transaction slot), :class:`DecidedFirings` (``db.rules.detached.decided(tx)``:
where a batch run at commit hands its events' detached-family firings), :func:`own_event` (an event with dicts of
its own for one more firing: the capture consumer's attempts).
"""

from activedb.rules._context import GateKey, GateRole, RuleContext
from activedb.rules._detached import DecidedFirings
from activedb.rules._manager import RuleManager, own_event
from activedb.rules._model import (Fired, FunctionRule, Firing, Rule, RuleCounter, RuleCounters, RuleExecution,
                                   RulesStatistics)
from activedb.txn import FiringOutcome      # (the observers' vocabulary: activedb.txn owns it)

__all__ = ["RuleManager", "Rule", "FunctionRule", "Firing", "FiringOutcome", "Fired", "RuleCounter", "RuleCounters",
           "RuleExecution", "RulesStatistics", "RuleContext", "GateKey", "GateRole", "DecidedFirings",
           "own_event"]
