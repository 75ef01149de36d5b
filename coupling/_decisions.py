"""The gate's decision table (``coupling/README.md``, "The gate") as pure, thread-safe functions.

``outcome`` is a trigger's end (``True`` committed, ``False`` aborted, ``None`` running); ``result`` what a
condition trigger returned (``None``: not reported).  The state and the waiting are the gate's.
"""

from __future__ import annotations

import enum
from collections.abc import Hashable, Iterable

from ._dependencies import Dependency, DependencyKind


class Decision(enum.Enum):
    GO = "go"
    WAIT = "wait"
    STOP = "stop"


def crd_failed(outcome: bool | None, result: bool | None) -> bool:
    """The condition aborted, returned false, or committed without reporting true."""
    return outcome is False or result is False or (outcome is True and result is not True)


def begin_decision(dependency: Dependency, outcome: bool | None, result: bool | None) -> Decision:
    """May the dependent of ``dependency`` begin now?"""
    kind = dependency.kind
    if kind is DependencyKind.SQD:
        return Decision.WAIT if outcome is None else (Decision.GO if outcome else Decision.STOP)
    if kind is DependencyKind.AD:
        return Decision.STOP if outcome is False else Decision.GO
    if kind is DependencyKind.ED:
        return Decision.STOP if outcome is True else Decision.GO
    if kind is DependencyKind.CRD:
        return Decision.STOP if crd_failed(outcome, result) else Decision.GO
    return Decision.GO  # CD constrains only the commit


def commit_decision(dependency: Dependency, outcome: bool | None, result: bool | None) -> Decision:
    """May the dependent of ``dependency`` commit now?"""
    kind = dependency.kind
    if kind is DependencyKind.SQD:
        return Decision.GO  # checked at begin; the record's state proves it began with permission
    if kind is DependencyKind.CRD and crd_failed(outcome, result):
        return Decision.STOP
    if outcome is None:
        return Decision.WAIT
    if kind is DependencyKind.AD:
        return Decision.GO if outcome else Decision.STOP
    if kind is DependencyKind.ED:
        return Decision.STOP if outcome else Decision.GO
    return Decision.GO  # CD: the trigger has ended; CRD: committed and returned true


class Phase(enum.StrEnum):
    """What a dependent asks the gate for: to begin, or to commit."""

    BEGIN = "begin"
    COMMIT = "commit"


def decide(dependencies: Iterable[Dependency], phase: Phase, outcomes: dict[Hashable, bool],
           results: dict[Hashable, bool]) -> tuple[Decision, tuple[Hashable, ...]]:
    """Combine the decisions of all ``dependencies`` for ``phase`` (``Phase.BEGIN`` or ``Phase.COMMIT``): STOP wins,
    then WAIT (with the triggers waited for, in order), else GO."""
    decision_of = begin_decision if phase is Phase.BEGIN else commit_decision
    pending: list[Hashable] = []
    for dependency in dependencies:
        trigger = dependency.trigger
        decision = decision_of(dependency, outcomes.get(trigger), results.get(trigger))
        if decision is Decision.STOP:
            return Decision.STOP, ()
        if decision is Decision.WAIT and trigger not in pending:
            pending.append(trigger)
    return (Decision.WAIT, tuple(pending)) if pending else (Decision.GO, ())
