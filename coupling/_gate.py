"""Run-time enforcement of ACTA dependencies between transactions that run in parallel: :class:`DependencyGate`.

*Concurrent Rule Execution* §3: "Abort and commit dependencies among the top-level transactions are
enforced by the transaction manager"; the gate is the part of that which does not know what a
transaction is.  Protocol, decision table, locking and deadlock edges: ``coupling/README.md``, "The gate".
"""

from __future__ import annotations

import enum
import threading
import time
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field

from ._decisions import Decision, Phase, decide
from ._dependencies import Dependency, DependencyKind, action_dependencies_for, dependencies_for
from ._modes import Coupling
from .errors import DependencyTimeout, GateProtocolError, InvalidArgument, UnsupportedByGate


class Verdict(enum.Enum):
    """The gate's answer to ``wait_may_begin`` (``BEGIN``/``CANCEL``) or ``wait_may_commit`` (``COMMIT``/``ABORT``).
    ``CANCEL``: never run the body; report an abort (``trigger_ended``; in a history, an abort without begin)."""

    BEGIN = "begin"
    CANCEL = "cancel"
    COMMIT = "commit"
    ABORT = "abort"


class DependentState(enum.Enum):
    """REGISTERED -(BEGIN)-> BEGUN -(COMMIT)-> COMMIT_GRANTED; REGISTERED/BEGUN -(CANCEL/ABORT)-> STOPPED;
    REGISTERED -(COMMIT)-> COMMIT_GRANTED when it has no SQD.  Its end removes the record."""

    REGISTERED = "registered"
    BEGUN = "begun"
    COMMIT_GRANTED = "commit granted"
    STOPPED = "stopped"


@dataclass(frozen=True)
class GateStatistics:
    dependents: int  # registered dependents that have not ended
    dependencies: int  # their registered dependencies
    waiting_to_begin: int  # threads blocked in wait_may_begin
    waiting_to_commit: int  # threads blocked in wait_may_commit
    retained_outcomes: int  # ended transactions whose outcome is kept (see forget)
    begun: int  # verdicts handed out so far, by kind
    cancelled: int
    committed: int
    aborted: int
    timeouts: int


@dataclass(eq=False)
class _DependentRecord:
    """Gate state of one dependent; every field is protected by the gate's ``_mutex``."""

    tid: Hashable
    condition: threading.Condition  # on the gate's _mutex
    dependencies: list[Dependency] = field(default_factory=list)  # Invariant: all have dependent == tid
    state: DependentState = DependentState.REGISTERED
    ended: bool = False  # set when trigger_ended(tid) removed the record while a thread may wait
    waiting_for: tuple[Hashable, ...] = ()  # triggers a blocked wait is waiting for, () if none
    interrupted: BaseException | None = None  # set by interrupt(): the blocked wait raises it


_GATED_KINDS = frozenset({DependencyKind.CD, DependencyKind.AD, DependencyKind.ED, DependencyKind.SQD,
                          DependencyKind.CRD})

# phase -> (the verdict that lets it proceed, the one that stops it, the record's state after proceeding)
_PHASES = {Phase.BEGIN: (Verdict.BEGIN, Verdict.CANCEL, DependentState.BEGUN),
           Phase.COMMIT: (Verdict.COMMIT, Verdict.ABORT, DependentState.COMMIT_GRANTED)}


def _check_may_ask(record: _DependentRecord, phase: Phase) -> None:
    """Raise :class:`GateProtocolError` if ``record`` may not ask for ``phase`` now. Caller holds the gate's mutex."""
    dependent = record.tid
    if phase is Phase.BEGIN:
        if record.state is not DependentState.REGISTERED:
            raise GateProtocolError(f"wait_may_begin({dependent!r}) in state {record.state.value}; call it once, "
                                    "before the dependent runs")
        return
    if record.state not in (DependentState.REGISTERED, DependentState.BEGUN):
        raise GateProtocolError(f"wait_may_commit({dependent!r}) in state {record.state.value}; call it once, before "
                                "the dependent commits, and never after a CANCEL or ABORT verdict")
    if record.state is DependentState.REGISTERED and any(dependency.kind is DependencyKind.SQD
                                                          for dependency in record.dependencies):
        raise GateProtocolError(f"{dependent!r} has a sequential dependency but never got BEGIN from wait_may_begin; "
                                "ask wait_may_begin before running it")


class DependencyGate:
    """Enforces CD, AD, ED, SQD and CRD between concurrently running transactions (design note, "The gate").

    Thread-safe; its mutex is a leaf.  Do not call a blocking ``wait_*`` while holding a mutex a trigger
    needs to end.  A timeout (seconds; ``None`` or infinity waits for ever) is not a verdict: the gate is unchanged.
    """

    def __init__(self) -> None:
        self._mutex = threading.Lock()  # protects every field below and every _DependentRecord
        self._dependents: dict[Hashable, _DependentRecord] = {}  # live (not ended) dependents
        # Invariant: trigger in _dependents_on and dependent in _dependents_on[trigger]
        #            iff some dependency of _dependents[dependent] has that trigger; no empty sets.
        self._dependents_on: dict[Hashable, set[Hashable]] = {}
        self._outcomes: dict[Hashable, bool] = {}  # ended transaction -> committed?
        self._results: dict[Hashable, bool] = {}  # condition transaction -> what it returned
        # Invariant: a tid in _forgettable is dropped from _outcomes/_results as soon as it has
        #            ended and is not in _dependents_on.
        self._forgettable: set[Hashable] = set()
        self._waiting = {Phase.BEGIN: 0, Phase.COMMIT: 0}
        self._verdicts = {verdict: 0 for verdict in Verdict}
        self._timeouts = 0

    # ------------------------------------------------------------------ registration

    def register(self, dependent: Hashable, trigger: Hashable, coupling: Coupling | str) -> frozenset[Dependency]:
        """Register the dependencies of E-C ``coupling`` (``dependencies_for``) and return them; immediate
        and deferred raise :class:`UnsupportedByGate` (the transaction tree enforces theirs)."""
        mode = Coupling.parse(coupling)
        if mode.runs_as_subtransaction:
            raise UnsupportedByGate(f"{mode} rules run as subtransactions: the child's WD on its parent and the "
                                    "parent's CD on its child (Concurrent Rule Execution axiom 19) are enforced by the "
                                    "nested transaction tree (wait-for-commit, abort of descendants), not by the "
                                    "DependencyGate")
        dependencies = dependencies_for(mode, dependent, trigger)
        self._register_all(dependencies)
        return dependencies

    def register_action(self, action: Hashable, condition: Hashable,
                        coupling: Coupling = Coupling.SEQUENTIAL_CAUSALLY_DEPENDENT) -> frozenset[Dependency]:
        """Register the C-A dependencies (``action_dependencies_for``) and return them; report the
        condition's return value with :meth:`condition_returned`.  Immediate registers nothing."""
        dependencies = action_dependencies_for(coupling, action, condition)
        self._register_all(dependencies)
        return dependencies

    def register_dependency(self, dependency: Dependency) -> None:
        """Register one dependency of kind CD, AD, ED, SQD or CRD (WD: :class:`UnsupportedByGate`)."""
        self._register_all([dependency])

    def _register_all(self, dependencies: Iterable[Dependency]) -> None:
        dependencies = list(dependencies)
        with self._mutex:
            for dependency in dependencies:  # validate all first: all or nothing
                self._check_registrable(dependency)
            for dependency in dependencies:
                record = self._dependents.get(dependency.dependent)
                if record is None:
                    record = _DependentRecord(dependency.dependent, threading.Condition(self._mutex))
                    self._dependents[dependency.dependent] = record
                if dependency not in record.dependencies:
                    record.dependencies.append(dependency)
                    self._dependents_on.setdefault(dependency.trigger, set()).add(dependency.dependent)
                record.condition.notify_all()

    def _check_registrable(self, dependency: Dependency) -> None:
        """Raise if ``dependency`` may not be registered now. Caller holds ``self._mutex``."""
        if dependency.kind not in _GATED_KINDS:
            raise UnsupportedByGate(f"{dependency}: the gate does not enforce {dependency.kind} (a weak-abort "
                                    "dependency lets the dependent commit while its trigger runs; only the nested "
                                    "transaction tree can serialise that commit with the trigger's abort)")
        if dependency.dependent in self._outcomes:
            raise GateProtocolError(f"cannot register {dependency}: {dependency.dependent!r} has already ended")
        record = self._dependents.get(dependency.dependent)
        if record is not None:
            if record.state in (DependentState.COMMIT_GRANTED, DependentState.STOPPED):
                raise GateProtocolError(f"cannot register {dependency}: {dependency.dependent!r} was already told to "
                                        f"{'commit' if record.state is DependentState.COMMIT_GRANTED else 'abort'}")
            if record.state is DependentState.BEGUN and dependency.kind is DependencyKind.SQD:
                raise GateProtocolError(f"cannot register {dependency}: {dependency.dependent!r} already began; "
                                        "register a sequential dependency before calling wait_may_begin")
        if self._reaches(dependency.trigger, dependency.dependent):
            raise GateProtocolError(f"cannot register {dependency}: {dependency.dependent!r} already (transitively) "
                                    f"waits for {dependency.trigger!r} ... and {dependency.trigger!r} would wait for "
                                    "it: a cycle of dependencies can never be decided")

    def _reaches(self, start: Hashable, goal: Hashable) -> bool:
        """Whether ``start`` transitively depends on ``goal`` via live dependencies. Caller holds the mutex."""
        seen = {start}
        stack = [start]
        while stack:
            tid = stack.pop()
            if tid == goal:
                return True
            record = self._dependents.get(tid)
            if record is None:
                continue
            for dependency in record.dependencies:
                if dependency.trigger not in seen:
                    seen.add(dependency.trigger)
                    stack.append(dependency.trigger)
        return False

    # ------------------------------------------------------------------ facts

    def trigger_ended(self, tid: Hashable, committed: bool) -> None:
        """Report that ``tid`` committed or aborted: exactly once for *every* transaction in a registered
        dependency, in either role.  A dependent's record is removed (a thread still waiting on its behalf
        gets ``ABORT``/``CANCEL``); a commit the gate did not grant raises :class:`GateProtocolError` after
        the end was recorded.
        """
        if not isinstance(committed, bool):     # ("no" is truthy: an aborted trigger would count as committed)
            raise InvalidArgument(f"trigger_ended({tid!r}, committed={committed!r}): committed is True or False (the "
                                  "transaction's outcome)")
        with self._mutex:
            if tid in self._outcomes:
                raise GateProtocolError(f"{tid!r} reported to end twice (first "
                                        f"{'committed' if self._outcomes[tid] else 'aborted'})")
            self._outcomes[tid] = committed
            problem = None
            record = self._dependents.pop(tid, None)
            if record is not None:
                if committed and record.state is not DependentState.COMMIT_GRANTED:
                    problem = (f"{tid!r} committed although the gate did not grant it (state: "
                               f"{record.state.value}); call wait_may_commit and honour its verdict")
                record.ended = True
                record.condition.notify_all()
                for trigger in {dependency.trigger for dependency in record.dependencies}:
                    waiting = self._dependents_on[trigger]
                    waiting.discard(tid)
                    if not waiting:
                        del self._dependents_on[trigger]
                        self._drop_if_forgotten(trigger)
            self._notify_dependents_of(tid)
            self._drop_if_forgotten(tid)
        if problem is not None:
            raise GateProtocolError(problem)

    def condition_returned(self, condition: Hashable, value: bool) -> None:
        """Report what a rule's condition returned, before its transaction ends (for CRD); after a ``False``
        the actions depending on it may abort at once (``must_abort``)."""
        if not isinstance(value, bool):     # ("no" is truthy: a false condition would let its action commit)
            raise InvalidArgument(f"condition_returned({condition!r}, value={value!r}): value is True or False (what "
                                  "the condition returned, as bool(...) of it)")
        with self._mutex:
            if condition in self._results:
                raise GateProtocolError(f"condition {condition!r} reported to return twice")
            if condition in self._outcomes:
                raise GateProtocolError(f"condition {condition!r} already ended; report its result before "
                                        "trigger_ended")
            self._results[condition] = value
            self._notify_dependents_of(condition)

    def forget(self, tid: Hashable) -> None:
        """Promise that no dependency on ``tid`` will be registered any more: its outcome (and condition
        result) is dropped once it has ended and no registered dependency refers to it (else it is kept for
        ever).  A later dependency on it is a protocol error the gate cannot detect (it treats ``tid`` as running).
        """
        with self._mutex:
            self._forgettable.add(tid)
            self._drop_if_forgotten(tid)

    def _drop_if_forgotten(self, tid: Hashable) -> None:
        """Caller holds ``self._mutex``."""
        if tid in self._forgettable and tid in self._outcomes and tid not in self._dependents_on:
            self._forgettable.discard(tid)
            del self._outcomes[tid]
            self._results.pop(tid, None)

    def _notify_dependents_of(self, trigger: Hashable) -> None:
        """Caller holds ``self._mutex``."""
        for dependent in self._dependents_on.get(trigger, ()):
            self._dependents[dependent].condition.notify_all()

    # ------------------------------------------------------------------ decisions

    def _decide(self, record: _DependentRecord, phase: Phase) -> tuple[Decision, tuple[Hashable, ...]]:
        """``decide`` over the record's dependencies; an ended record STOPs. Caller holds ``self._mutex``."""
        if record.ended:
            return Decision.STOP, ()
        return decide(record.dependencies, phase, self._outcomes, self._results)

    def _wait(self, record: _DependentRecord, phase: Phase, timeout: float | None) -> Decision:
        """Block until ``_decide`` is not WAIT. Caller holds ``self._mutex`` (released while waiting)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        decision, pending = self._decide(record, phase)
        if decision is not Decision.WAIT:
            return decision
        self._waiting[phase] += 1
        try:
            while decision is Decision.WAIT:
                if record.interrupted is not None:
                    error, record.interrupted = record.interrupted, None
                    raise error
                record.waiting_for = pending
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    self._timeouts += 1
                    # remaining is a number: timeout is one
                    raise DependencyTimeout(record.tid, pending, phase, timeout)  # type: ignore[arg-type]
                # (an infinite timeout too: no thread's wait is longer than TIMEOUT_MAX)
                record.condition.wait(None if remaining is None else min(remaining, threading.TIMEOUT_MAX))
                decision, pending = self._decide(record, phase)
            return decision
        finally:
            record.waiting_for = ()
            self._waiting[phase] -= 1

    def wait_may_begin(self, dependent: Hashable, timeout: float | None = None) -> Verdict:
        """Block until ``dependent`` may begin (``BEGIN``) or must never run (``CANCEL``), by the "may begin"
        column of the decision table; no registered dependency: ``BEGIN``.  Raises :class:`DependencyTimeout`."""
        return self._ask(dependent, Phase.BEGIN, timeout)

    def wait_may_commit(self, dependent: Hashable, timeout: float | None = None) -> Verdict:
        """Block until ``dependent`` may commit (``COMMIT``) or must abort (``ABORT``), by the "may commit"
        column; no registered dependency: ``COMMIT``.  After ``COMMIT`` it commits and reports its end (an
        abort if its commit failed).  Raises :class:`DependencyTimeout`."""
        return self._ask(dependent, Phase.COMMIT, timeout)

    def _ask(self, dependent: Hashable, phase: Phase, timeout: float | None) -> Verdict:
        """The one body of ``wait_may_begin`` and ``wait_may_commit``: check the protocol, wait, hand out
        the verdict and move the record to its next state."""
        go, stop, granted = _PHASES[phase]
        if timeout is not None and not (isinstance(timeout, (int, float)) and timeout == timeout):    # (also NaN)
            raise InvalidArgument(f"wait_may_{phase}({dependent!r}, timeout={timeout!r}): give the timeout as a number "
                                  "of seconds, or None to wait without limit")
        with self._mutex:
            record = self._dependents.get(dependent)
            if record is None:
                if dependent in self._outcomes:
                    raise GateProtocolError(f"{dependent!r} asked to {phase} after it was reported to have ended")
                self._verdicts[go] += 1
                return go
            _check_may_ask(record, phase)
            verdict = go if self._wait(record, phase, timeout) is Decision.GO else stop
            if not record.ended:
                record.state = granted if verdict is go else DependentState.STOPPED
            self._verdicts[verdict] += 1
            return verdict

    def must_abort(self, dependent: Hashable) -> bool:
        """Non-blocking: True if ``dependent`` can no longer commit (``wait_may_commit`` would say ``ABORT``)."""
        with self._mutex:
            record = self._dependents.get(dependent)
            if record is None:
                return False
            return record.state is DependentState.STOPPED or decide(
                record.dependencies, Phase.BEGIN, self._outcomes, self._results)[0] is Decision.STOP

    # ------------------------------------------------------------------ introspection

    def state_of(self, dependent: Hashable) -> DependentState | None:
        """The gate state of a live registered dependent, ``None`` otherwise."""
        with self._mutex:
            record = self._dependents.get(dependent)
            return record.state if record is not None else None

    def outcome_of(self, tid: Hashable) -> bool | None:
        """True/False if ``tid`` was reported committed/aborted (and not dropped), else None."""
        with self._mutex:
            return self._outcomes.get(tid)

    def interrupt(self, dependent: Hashable, error: BaseException) -> bool:
        """Make ``dependent``'s blocked ``wait_may_begin``/``wait_may_commit`` raise ``error`` (e.g. the
        ``Deadlock`` of a detector that chose it as the victim of a cycle through this wait).  If it is not
        blocked yet, its next wait that would block raises instead.  The gate's state is unchanged: the
        dependent reports its end as usual.  False if ``dependent`` is not a registered dependent."""
        with self._mutex:
            record = self._dependents.get(dependent)
            if record is None:
                return False
            record.interrupted = error
            record.condition.notify_all()
            return True

    def waiting_edges(self) -> frozenset[tuple[Hashable, Hashable]]:
        """``(dependent, trigger)`` for every blocked wait: the wait-for-trigger edges, for deadlock detection."""
        with self._mutex:
            return frozenset((record.tid, trigger) for record in self._dependents.values()
                             for trigger in record.waiting_for)

    def statistics(self) -> GateStatistics:
        with self._mutex:
            return GateStatistics(dependents=len(self._dependents),
                                  dependencies=sum(len(record.dependencies) for record in self._dependents.values()),
                                  waiting_to_begin=self._waiting[Phase.BEGIN],
                                  waiting_to_commit=self._waiting[Phase.COMMIT],
                                  retained_outcomes=len(self._outcomes),
                                  begun=self._verdicts[Verdict.BEGIN],
                                  cancelled=self._verdicts[Verdict.CANCEL],
                                  committed=self._verdicts[Verdict.COMMIT],
                                  aborted=self._verdicts[Verdict.ABORT],
                                  timeouts=self._timeouts)
