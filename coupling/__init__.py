"""coupling -- the coupling-mode semantics of ECA rules, with no SQL and no Spark.

Saygın, Ulusoy, Chakravarthy, *Concurrent Rule Execution in Active Databases* §2.1, §3.2, §3.3.2 and
axioms 18-30 (the papers are listed in docs/papers.md), as a pure library that imports nothing else of ours:

* :class:`Coupling` -- the six coupling modes; :data:`ACTION_COUPLINGS` -- the valid C-A couplings;
  :func:`has_own_deferred_queue` -- which transactions run deferred cycles.
* :class:`DependencyKind`, :class:`Dependency`, :func:`dependencies_for`,
  :func:`action_dependencies_for` -- the ACTA dependencies (CD, AD, WD, ED, SQD, CRD) each mode creates;
  :func:`may_run_after` -- whether a detached-family dependent started after its trigger ended may run.
* :class:`DependencyGate`, :class:`Verdict` -- run-time enforcement of those dependencies between
  transactions that run in parallel (the detached family, C-A sequential causally dependent).
* :class:`DeferredQueue` -- deferred firings handed out in cycles just before a commit.
* :func:`priority_groups` -- rule priorities as execution groups.
* :class:`HistoryEvent`, :class:`DependencyHistory`, :func:`check_dependencies` -- checking a recorded
  history against ACTA dependencies.
* :mod:`coupling.errors` -- every error, all subclasses of :class:`CouplingError`.

The design note is ``coupling/README.md``.
"""

from ._deferred import (
    DEFAULT_MAX_CYCLES,
    DeferredCycle,
    DeferredFiring,
    DeferredQueue,
    DeferredQueueStatistics,
    QueueState,
)
from ._dependencies import Dependency, DependencyKind, action_dependencies_for, dependencies_for, may_run_after
from ._gate import DependencyGate, DependentState, GateStatistics, Verdict
from ._history import HistoryEvent, HistoryEventKind, DependencyHistory, check_dependencies
from ._modes import ACTION_COUPLINGS, Coupling, has_own_deferred_queue
from ._priority import priority_groups
from .errors import (
    CouplingError,
    DeferredCycleLimitExceeded,
    DeferredQueueClosed,
    DependencyTimeout,
    GateError,
    GateProtocolError,
    InvalidActionCoupling,
    InvalidPriority,
    MalformedHistory,
    UnknownCoupling,
    UnsupportedByGate,
)

__all__ = [
    "ACTION_COUPLINGS",
    "DEFAULT_MAX_CYCLES",
    "Coupling",
    "CouplingError",
    "DeferredCycle",
    "DeferredCycleLimitExceeded",
    "DeferredFiring",
    "DeferredQueue",
    "DeferredQueueClosed",
    "DeferredQueueStatistics",
    "Dependency",
    "DependencyGate",
    "DependencyKind",
    "DependencyTimeout",
    "DependentState",
    "GateError",
    "GateProtocolError",
    "GateStatistics",
    "HistoryEvent",
    "HistoryEventKind",
    "DependencyHistory",
    "InvalidActionCoupling",
    "InvalidPriority",
    "MalformedHistory",
    "QueueState",
    "UnknownCoupling",
    "UnsupportedByGate",
    "Verdict",
    "action_dependencies_for",
    "check_dependencies",
    "dependencies_for",
    "has_own_deferred_queue",
    "may_run_after",
    "priority_groups",
]
