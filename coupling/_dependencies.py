"""ACTA dependencies (:class:`Dependency`, ``dependent X trigger``) and the ones each coupling mode creates.
The direction of a dependency and the mode table: ``coupling/README.md``.  Everything here is immutable.
"""

from __future__ import annotations

import enum
from collections.abc import Hashable
from dataclasses import dataclass

from ._modes import Coupling
from .errors import InvalidArgument, UnsupportedByGate


class DependencyKind(enum.Enum):
    """The dependencies of *Concurrent Rule Execution* §3.3; each docstring is the definition (``H`` the
    history, ``e -> f``: ``e`` precedes ``f`` in ``H``, ``j`` the dependent and ``i`` the trigger of ``j X i``)."""

    CD = ("CD", "Commit dependency, j CD i: if both commit, i commits before j. Commit_j in H => (Commit_i in H "
                "=> Commit_i -> Commit_j). (ACTA; Concurrent Rule Execution §3.3)")
    AD = ("AD", "Abort dependency, j AD i: if i aborts, j aborts. Abort_i in H => Abort_j in H. (ACTA; Concurrent "
                "Rule Execution §3.3)")
    WD = ("WD", "Weak-abort dependency, j WD i: if i aborts and j has not committed before that, j aborts. "
                "Abort_i in H => (not (Commit_j -> Abort_i) => Abort_j in H). (ACTA; Concurrent Rule Execution §3.3)")
    ED = ("ED", "Exclusion dependency, j ED i: if i commits, j aborts. Commit_i in H => Abort_j in H. (ACTA; "
                "Concurrent Rule Execution §3.3)")
    SQD = ("SQD", "Sequential dependency, j SQD i: j begins only after i has committed. Begin_j in H => Commit_i "
                  "-> Begin_j. This is ACTA's begin-on-commit dependency (BCD; DependencyKind.BCD is an alias), with "
                  "the operands of Concurrent Rule Execution's axiom 22, not of its §3.3.2 definition (design note, "
                  "note 1).")
    BCD = SQD  # alias: ACTA's begin-on-commit dependency is the same constraint
    CRD = ("CRD", "Condition-result dependency, j CRD i (our name; Concurrent Rule Execution §3.3.2 uses it without "
                  "naming it): j commits only after i has committed *and* i (a rule's condition) returned true. "
                  "Commit_j in H => (Commit_i -> Commit_j and result(i) = true). Used between a condition and its "
                  "action under sequential causally dependent C-A coupling.")

    _value_: str

    def __new__(cls, value: str, doc: str) -> "DependencyKind":
        member = object.__new__(cls)
        member._value_ = value
        member.__doc__ = doc
        return member

    def __str__(self) -> str:
        return self._value_


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
        kind: object = self.kind     # (as given: a name is taken too)
        if not isinstance(kind, DependencyKind):
            try:
                object.__setattr__(self, "kind", DependencyKind[str(kind).upper()])
            except KeyError:
                raise InvalidArgument(f"unknown dependency kind {kind!r}; use one of: "
                                      f"{', '.join(DependencyKind.__members__)}") from None
        if self.dependent == self.trigger:
            raise InvalidArgument(f"a transaction cannot depend on itself: {self.dependent!r} {self.kind} "
                                  f"{self.trigger!r}")

    def __str__(self) -> str:
        return f"{self.dependent} {self.kind} {self.trigger}"

    def describe(self) -> str:
        """The dependency in words, e.g. ``"T2 commits only if T1 aborts (T2 ED T1)"``."""
        dependent, trigger = self.dependent, self.trigger
        text = {DependencyKind.CD: f"if both commit, {trigger} commits before {dependent}",
                DependencyKind.AD: f"if {trigger} aborts, {dependent} aborts",
                DependencyKind.WD: f"if {trigger} aborts before {dependent} committed, {dependent} aborts",
                DependencyKind.ED: f"if {trigger} commits, {dependent} aborts",
                DependencyKind.SQD: f"{dependent} begins only after {trigger} committed",
                DependencyKind.CRD: f"{dependent} commits only after {trigger} committed and returned true"}[self.kind]
        return f"{text} ({self})"


# The dependent's dependencies on its trigger for the detached family (axioms 20-23).
_TOP_LEVEL_KINDS = {Coupling.DETACHED: (),
                    Coupling.DETACHED_CAUSALLY_DEPENDENT: (DependencyKind.AD, DependencyKind.CD),
                    Coupling.SEQUENTIAL_CAUSALLY_DEPENDENT: (DependencyKind.SQD,),
                    Coupling.EXCLUSIVE_CAUSALLY_DEPENDENT: (DependencyKind.ED,)}


def dependencies_for(coupling: Coupling | str, dependent: Hashable, trigger: Hashable) -> frozenset[Dependency]:
    """The ACTA dependencies created when ``trigger`` (the triggering transaction) spawns ``dependent``
    (the rule's transaction) with E-C ``coupling``: the mode table of the design note (axioms 19-23).
    Between a condition and its action: :func:`action_dependencies_for`."""
    mode = Coupling.parse(coupling)
    if mode.runs_as_subtransaction:  # axiom 19: the child WD its parent, the parent CD its child
        return frozenset({Dependency(DependencyKind.WD, dependent, trigger),
                          Dependency(DependencyKind.CD, trigger, dependent)})
    return frozenset(Dependency(kind, dependent, trigger) for kind in _TOP_LEVEL_KINDS[mode])


def action_dependencies_for(coupling: Coupling | str, action: Hashable, condition: Hashable) -> frozenset[Dependency]:
    """The dependencies between a rule's ``condition`` transaction and its ``action`` transaction
    (*Concurrent Rule Execution* §3.3.2, last paragraph; the design note's "C-A coupling"): none for
    immediate (the action runs in the condition's transaction; as its own child of it, use
    ``dependencies_for(IMMEDIATE, action, condition)``), ``action AD condition`` and ``action CRD
    condition`` for sequential causally dependent (the action may begin at once; CRD orders the commits).

    Raises :class:`~coupling.errors.InvalidActionCoupling` for the other four modes.
    """
    mode = Coupling.parse_action(coupling)
    if mode is Coupling.IMMEDIATE:
        return frozenset()
    return frozenset({Dependency(DependencyKind.AD, action, condition),
                      Dependency(DependencyKind.CRD, action, condition)})


def may_run_after(coupling: Coupling | str, trigger_committed: bool) -> bool:
    """Whether a detached-family dependent that begins only after its trigger ended may run to its
    commit, given the trigger's outcome (``trigger_committed``): AD and SQD need the trigger committed, ED
    needs it aborted, CD holds either way.  Immediate and deferred rules never run after their trigger:
    :class:`~coupling.errors.UnsupportedByGate`.
    """
    try:
        answer = _MAY_RUN_AFTER.get((coupling, trigger_committed))   # (a Coupling and a bool: one lookup)
    except TypeError:        # unhashable: ``Coupling.parse`` says what is wrong with it
        answer = None
    if answer is not None:
        return answer
    if not isinstance(trigger_committed, bool):
        raise InvalidArgument(f"trigger_committed must be True or False (the trigger's outcome), not "
                              f"{trigger_committed!r}")
    return _may_run_after(Coupling.parse(coupling), trigger_committed)


def _may_run_after(mode: Coupling, trigger_committed: bool) -> bool:
    """:func:`may_run_after` from the dependencies themselves (the table ``_MAY_RUN_AFTER`` is made of it)."""
    if mode.runs_as_subtransaction:
        raise UnsupportedByGate(f"{mode} rules run inside their trigger, never after it")
    allowed = True
    for dependency in dependencies_for(mode, "dependent", "trigger"):
        if dependency.kind in (DependencyKind.AD, DependencyKind.SQD):
            allowed = allowed and trigger_committed
        elif dependency.kind is DependencyKind.ED:
            allowed = allowed and not trigger_committed
    return allowed


# The answers of ``_may_run_after`` for the detached family, by (mode, outcome): an outbox asks once per
# recorded firing at each flush.
_MAY_RUN_AFTER: dict[tuple[Coupling | str, bool], bool] = {
    (mode, committed): _may_run_after(mode, committed)
    for mode in _TOP_LEVEL_KINDS for committed in (False, True)}
