"""ECA rules: declaring, persisting and firing them in all six coupling modes.  Design note: ``README.md``.

Public names: :class:`RuleManager` (``db.rules``), :class:`Rule`, :class:`FunctionRule`, :class:`Firing`,
:class:`FiringOutcome` and :class:`Fired` (:meth:`RuleManager.fire`),
:class:`RuleCounters`, :class:`RulesStatistics`, :class:`RuleContext` (the rules' per-transaction slot).
"""

from activedb.rules._context import GateKey, GateRole, RuleContext
from activedb.rules._manager import RuleManager
from activedb.rules._model import Fired, FunctionRule, Firing, Rule, RuleCounters, RuleExecution, RulesStatistics
from activedb.txn import FiringOutcome      # (the observers' vocabulary: activedb.txn owns it)

__all__ = ["RuleManager", "Rule", "FunctionRule", "Firing", "FiringOutcome", "Fired", "RuleCounters", "RuleExecution",
           "RulesStatistics", "RuleContext", "GateKey", "GateRole"]
