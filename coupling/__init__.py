"""coupling -- the coupling-mode semantics of ECA rules (Saygın, Ulusoy, Chakravarthy, *Concurrent Rule
Execution in Active Databases* §2.1, §3.2, §3.3.2, axioms 18-30) as a pure library that imports nothing
else of ours.  The design note, ``coupling/README.md``, describes every public name below.
"""

from ._decisions import Phase
from ._deferred import DeferredCycle, DeferredFiring, DeferredQueue, QueueState
from ._dependencies import Dependency, DependencyKind, action_dependencies_for, dependencies_for, may_run_after
from ._gate import DependencyGate, DependentState, Verdict
from ._history import HistoryEvent, HistoryEventKind, DependencyHistory, check_dependencies
from ._modes import ACTION_COUPLINGS, Coupling, has_own_deferred_queue
from ._priority import priority_groups
from .errors import (CouplingError, DeferredCycleLimitExceeded, DeferredQueueClosed, DependencyTimeout, GateError,
                     GateProtocolError, InvalidActionCoupling, InvalidArgument, InvalidPriority, MalformedHistory,
                     UnknownCoupling, UnsupportedByGate)

__all__ = [
    "ACTION_COUPLINGS", "Coupling", "CouplingError", "DeferredCycle", "DeferredCycleLimitExceeded", "DeferredFiring",
    "DeferredQueue", "DeferredQueueClosed", "Dependency", "DependencyGate", "DependencyKind", "DependencyTimeout",
    "DependentState", "GateError", "GateProtocolError", "HistoryEvent", "HistoryEventKind", "DependencyHistory",
    "InvalidActionCoupling", "InvalidArgument", "InvalidPriority", "MalformedHistory", "Phase", "QueueState",
    "UnknownCoupling", "UnsupportedByGate", "Verdict", "action_dependencies_for", "check_dependencies",
    "dependencies_for", "has_own_deferred_queue", "may_run_after", "priority_groups",
]
