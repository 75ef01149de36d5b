"""ACTA dependencies between transactions and the dependencies each coupling mode creates.

Notation (ACTA, Concurrent Rule Execution §3.3): ``t_j X t_i`` -- read "t_j is X-dependent on t_i" -- constrains the
events of ``t_j`` (the *dependent*) by the events of ``t_i`` (the *trigger* of the dependency, whose
begin/commit/abort decides what ``t_j`` may do). A :class:`Dependency` stores exactly that pair:
``Dependency(kind, dependent=t_j, trigger=t_i)`` and prints as ``"t_j X t_i"``.

Beware that "trigger" here is the right-hand operand of the dependency, which is *not always* the
rule's triggering transaction: for an immediate rule the parent's commit dependency on its child is
``Dependency(CD, dependent=parent, trigger=child)``.

Thread-safety: everything here is immutable and may be shared freely.
"""

from __future__ import annotations

import enum
from collections.abc import Hashable
from dataclasses import dataclass

from ._modes import ACTION_COUPLINGS, Coupling
from .errors import InvalidActionCoupling


class DependencyKind(enum.Enum):
    """The dependencies used by Concurrent Rule Execution §3.3 for the coupling modes; each docstring is the
    definition.

    ``H`` is the history, ``e -> f`` means event ``e`` precedes event ``f`` in ``H``; ``j`` is the
    dependent and ``i`` the trigger of the dependency (``j X i``).
    """

    CD = (
        "CD",
        "Commit dependency, j CD i: if both commit, i commits before j. "
        "Commit_j in H => (Commit_i in H => Commit_i -> Commit_j). (ACTA; Concurrent Rule Execution §3.3)",
    )
    AD = (
        "AD",
        "Abort dependency, j AD i: if i aborts, j aborts. Abort_i in H => Abort_j in H. "
        "(ACTA; Concurrent Rule Execution §3.3)",
    )
    WD = (
        "WD",
        "Weak-abort dependency, j WD i: if i aborts and j has not committed before that, j aborts. "
        "Abort_i in H => (not (Commit_j -> Abort_i) => Abort_j in H). (ACTA; Concurrent Rule Execution §3.3)",
    )
    ED = (
        "ED",
        "Exclusion dependency, j ED i: if i commits, j aborts. Commit_i in H => Abort_j in H. "
        "(ACTA; Concurrent Rule Execution §3.3)",
    )
    SQD = (
        "SQD",
        "Sequential dependency, j SQD i: j begins only after i has committed. "
        "Begin_j in H => Commit_i -> Begin_j. This is ACTA's begin-on-commit dependency (BCD; "
        "DependencyKind.BCD is an alias). Concurrent Rule Execution §3.3.2 writes the definition with the operands "
        "the other way round (t_i SQD t_j <=> (Begin_tj in H => Commit_ti -> Begin_tj)), which "
        "contradicts its own axiom 22 (Spawn_Seq_tp[tc] => tc SQD tp, 'tc can start its execution only "
        "if tp commits'); we follow axiom 22 and the ACTA convention of the other dependencies.",
    )
    BCD = SQD  # alias: ACTA's begin-on-commit dependency is the same constraint
    CRD = (
        "CRD",
        "Condition-result dependency, j CRD i (our name; Concurrent Rule Execution §3.3.2 uses it without naming it): "
        "j commits only after i has committed *and* i (a rule's condition) returned true. "
        "Commit_j in H => (Commit_i -> Commit_j and result(i) = true). Used between a condition and "
        "its action under sequential causally dependent C-A coupling.",
    )

    def __new__(cls, value: str, doc: str) -> "DependencyKind":
        member = object.__new__(cls)
        member._value_ = value
        member.__doc__ = doc
        return member

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Dependency:
    """One ACTA dependency ``dependent <kind> trigger``; immutable and hashable.

    ``dependent`` (ACTA's left operand, ``t_j``) is the transaction whose events are constrained;
    ``trigger`` (the right operand, ``t_i``) is the transaction whose events constrain it. Transaction
    ids may be any hashable value.
    """

    kind: DependencyKind
    dependent: Hashable
    trigger: Hashable

    def __post_init__(self) -> None:
        if not isinstance(self.kind, DependencyKind):
            try:
                object.__setattr__(self, "kind", DependencyKind[str(self.kind).upper()])
            except KeyError:
                raise ValueError(
                    f"unknown dependency kind {self.kind!r}; use one of: "
                    f"{', '.join(DependencyKind.__members__)}"
                ) from None
        if self.dependent == self.trigger:
            raise ValueError(
                f"a transaction cannot depend on itself: {self.dependent!r} {self.kind} {self.trigger!r}"
            )

    def __str__(self) -> str:
        return f"{self.dependent} {self.kind} {self.trigger}"

    def describe(self) -> str:
        """The dependency in words, e.g. ``"T2 commits only if T1 aborts (T2 ED T1)"``."""
        dependent, trigger = self.dependent, self.trigger
        text = {
            DependencyKind.CD: f"if both commit, {trigger} commits before {dependent}",
            DependencyKind.AD: f"if {trigger} aborts, {dependent} aborts",
            DependencyKind.WD: f"if {trigger} aborts before {dependent} committed, {dependent} aborts",
            DependencyKind.ED: f"if {trigger} commits, {dependent} aborts",
            DependencyKind.SQD: f"{dependent} begins only after {trigger} committed",
            DependencyKind.CRD: f"{dependent} commits only after {trigger} committed and returned true",
        }[self.kind]
        return f"{text} ({self})"


def dependencies_for(coupling: Coupling | str, dependent: Hashable, trigger: Hashable) -> frozenset[Dependency]:
    """The ACTA dependencies created when ``trigger`` spawns ``dependent`` with E-C ``coupling``.

    ``dependent`` is the transaction the rule runs in; ``trigger`` is the triggering transaction
    (its parent for immediate/deferred). Exactly the table of coupling/README.md, from Concurrent Rule Execution
    axioms 19-23:

    ==============================  =====================================================
    immediate, deferred (ax. 19)    ``dependent WD trigger`` and ``trigger CD dependent``:
                                    the child aborts if the parent aborts before the child
                                    committed; if both commit the child commits first (the
                                    parent waits for its children).
    detached (ax. 20)               none.
    detached causally dep. (ax. 21) ``dependent AD trigger`` and ``dependent CD trigger``:
                                    aborts if the trigger aborts; commits only after it.
    sequential causally dep. (22)   ``dependent SQD trigger``: begins only after the trigger
                                    committed (never, if it aborts).
    exclusive causally dep. (23)    ``dependent ED trigger``: if the trigger commits the
                                    dependent aborts, i.e. it commits only if the trigger
                                    aborts.
    ==============================  =====================================================

    For the dependencies between a condition and its action use :func:`action_dependencies_for`.
    """
    mode = Coupling.parse(coupling)
    if mode in (Coupling.IMMEDIATE, Coupling.DEFERRED):
        return frozenset(
            {
                Dependency(DependencyKind.WD, dependent, trigger),
                Dependency(DependencyKind.CD, trigger, dependent),
            }
        )
    if mode is Coupling.DETACHED:
        return frozenset()
    if mode is Coupling.DETACHED_CAUSALLY_DEPENDENT:
        return frozenset(
            {
                Dependency(DependencyKind.AD, dependent, trigger),
                Dependency(DependencyKind.CD, dependent, trigger),
            }
        )
    if mode is Coupling.SEQUENTIAL_CAUSALLY_DEPENDENT:
        return frozenset({Dependency(DependencyKind.SQD, dependent, trigger)})
    assert mode is Coupling.EXCLUSIVE_CAUSALLY_DEPENDENT, mode
    return frozenset({Dependency(DependencyKind.ED, dependent, trigger)})


def action_dependencies_for(coupling: Coupling | str, action: Hashable, condition: Hashable) -> frozenset[Dependency]:
    """The dependencies between a rule's ``condition`` transaction and its ``action`` transaction.

    Concurrent Rule Execution §3.3.2 (last paragraph): the C-A coupling is immediate or sequential causally dependent.

    * immediate: none -- "condition evaluation is followed by execution of the action only if the
      condition evaluates to true", inside the condition's transaction. (If the action is run as its
      own child of the condition's transaction, use ``dependencies_for(IMMEDIATE, action, condition)``.)
    * sequential causally dependent: ``action AD condition`` and ``action CRD condition`` -- "action
      execution starts before condition evaluation is completed [...] The transaction in which the
      action is executed can commit only if the condition commits and returns true." The action may
      therefore begin at once (no SQD); CRD includes the commit order (condition commits first).

    Raises :class:`~coupling.errors.InvalidActionCoupling` for the other four modes.
    """
    mode = Coupling.parse(coupling)
    if mode not in ACTION_COUPLINGS:
        raise InvalidActionCoupling(mode.value, [member.value for member in ACTION_COUPLINGS])
    if mode is Coupling.IMMEDIATE:
        return frozenset()
    return frozenset(
        {
            Dependency(DependencyKind.AD, action, condition),
            Dependency(DependencyKind.CRD, action, condition),
        }
    )


def may_run_after(coupling: Coupling | str, trigger_committed: bool) -> bool:
    """Whether a detached-family dependent may run to its commit once its trigger's outcome is known
    (``trigger_committed``) — the decision every dependency of :func:`dependencies_for` allows when the
    dependent begins *after* the trigger ended: AD and SQD need the trigger committed, ED needs it aborted,
    CD holds either way (the trigger ended first).  Detached: always.  This is how a dependent that is only
    started after the outcome is durable (activedb's outbox) satisfies its mode without waiting.

    Immediate and deferred rules are children of their trigger and never run after it:
    :class:`~coupling.errors.UnsupportedByGate`.
    """
    mode = Coupling.parse(coupling)
    if mode.runs_as_subtransaction:
        from .errors import UnsupportedByGate

        raise UnsupportedByGate(f"{mode} rules run inside their trigger, never after it")
    allowed = True
    for dependency in dependencies_for(mode, "dependent", "trigger"):
        if dependency.kind in (DependencyKind.AD, DependencyKind.SQD):
            allowed = allowed and trigger_committed
        elif dependency.kind is DependencyKind.ED:
            allowed = allowed and not trigger_committed
    return allowed
