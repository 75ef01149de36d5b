"""DependencyGate under real threads: every detached-family mode x trigger outcome, C-A coupling,
chains, timeouts, misuse, and a property test against a reference model.

Threads are ordered only by events, barriers and observable gate state (never by sleep); every
history is checked against the mode's ACTA dependencies (strictly), and the tests also show that
nothing more restrictive holds (the dependent runs concurrently with its trigger where it may).
"""

from __future__ import annotations

import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coupling import (
    Coupling,
    Dependency,
    DependencyGate,
    DependencyKind,
    DependencyTimeout,
    DependentState,
    GateProtocolError,
    DependencyHistory,
    InvalidArgument,
    UnsupportedByGate,
    Verdict,
    check_dependencies,
)

BEGIN, CANCEL, COMMIT, ABORT = Verdict.BEGIN, Verdict.CANCEL, Verdict.COMMIT, Verdict.ABORT
CD, AD, WD, ED, SQD, CRD = (DependencyKind[name] for name in ("CD", "AD", "WD", "ED", "SQD", "CRD"))
TIMEOUT = 5.0


def position(history, tid, kind):
    return next(event.seq for event in history.events() if event.tid == tid and event.kind == kind)


def run_dependent(gate: DependencyGate, history: DependencyHistory, tid, body_done: threading.Event | None = None):
    """What the transaction manager does for a dependent: ask, run, ask, end, report."""
    begin = gate.wait_may_begin(tid, timeout=TIMEOUT)
    if begin is CANCEL:
        history.abort(tid)
        gate.trigger_ended(tid, committed=False)
        return begin, None
    history.begin(tid)
    if body_done is not None:
        body_done.set()
    commit = gate.wait_may_commit(tid, timeout=TIMEOUT)
    if commit is COMMIT:
        history.commit(tid)
    else:
        history.abort(tid)
    gate.trigger_ended(tid, committed=commit is COMMIT)
    return begin, commit


def end_trigger(gate, history, tid, committed: bool, result: bool | None = None):
    if committed:
        history.commit(tid, result=result)
    else:
        history.abort(tid)
    gate.trigger_ended(tid, committed)


# mode, trigger commits?, where the dependent must block ("begin", "commit" or None), verdicts
SCENARIOS = [
    (Coupling.DETACHED, True, None, (BEGIN, COMMIT)),
    (Coupling.DETACHED, False, None, (BEGIN, COMMIT)),
    (Coupling.DETACHED_CAUSALLY_DEPENDENT, True, "commit", (BEGIN, COMMIT)),
    (Coupling.DETACHED_CAUSALLY_DEPENDENT, False, "commit", (BEGIN, ABORT)),
    (Coupling.SEQUENTIAL_CAUSALLY_DEPENDENT, True, "begin", (BEGIN, COMMIT)),
    (Coupling.SEQUENTIAL_CAUSALLY_DEPENDENT, False, "begin", (CANCEL, None)),
    (Coupling.EXCLUSIVE_CAUSALLY_DEPENDENT, True, "commit", (BEGIN, ABORT)),
    (Coupling.EXCLUSIVE_CAUSALLY_DEPENDENT, False, "commit", (BEGIN, COMMIT)),
]


@pytest.mark.parametrize(
    "mode, trigger_commits, blocks_at, verdicts",
    SCENARIOS,
    ids=[f"{mode.value}-trigger-{'commits' if commits else 'aborts'}" for mode, commits, _, _ in SCENARIOS],
)
def test_mode_by_trigger_outcome(threads, wait_until, mode, trigger_commits, blocks_at, verdicts):
    gate, history = DependencyGate(), DependencyHistory()
    threads.describe = lambda: (gate.statistics(), gate.waiting_edges(), history.events())
    history.begin("T")
    dependencies = gate.register("D", "T", mode)
    release_trigger = threading.Event()

    def trigger():
        assert release_trigger.wait(TIMEOUT)
        end_trigger(gate, history, "T", trigger_commits)

    threads.start("trigger", trigger)
    threads.start("dependent", run_dependent, gate, history, "D")
    if blocks_at is None:
        threads.join("dependent")  # finishes while the trigger is still running: no dependency at all
    else:
        waiting = "waiting_to_begin" if blocks_at == "begin" else "waiting_to_commit"
        wait_until(lambda: getattr(gate.statistics(), waiting) == 1, threads.describe)
        assert gate.waiting_edges() == {("D", "T")}
        assert not gate.must_abort("D")
    release_trigger.set()
    threads.join()

    assert threads.results["dependent"] == verdicts
    assert check_dependencies(history.events(), dependencies, strict=True) == []
    assert check_dependencies(history.events(), dependencies) == []
    trigger_end = position(history, "T", "commit" if trigger_commits else "abort")
    if blocks_at is None:  # detached: began and committed before the trigger ended
        assert position(history, "D", "commit") < trigger_end
    elif blocks_at == "commit":  # ran in parallel with the trigger, only its end waited
        assert position(history, "D", "begin") < trigger_end
    elif verdicts[0] is BEGIN:  # sequential: began right after the trigger committed
        assert trigger_end < position(history, "D", "begin")
    stats = gate.statistics()
    assert (stats.dependents, stats.waiting_to_begin, stats.waiting_to_commit) == (0, 0, 0)


def test_a_failing_rule_never_touches_its_trigger(threads):
    # The dependent (a detached causally dependent rule) raises and aborts while its trigger runs.
    gate, history = DependencyGate(), DependencyHistory()
    history.begin("T")
    dependencies = gate.register("D", "T", Coupling.DETACHED_CAUSALLY_DEPENDENT)
    assert gate.wait_may_begin("D") is BEGIN
    history.begin("D")
    history.abort("D")
    gate.trigger_ended("D", committed=False)
    assert gate.statistics().dependents == 0
    end_trigger(gate, history, "T", committed=True)
    assert check_dependencies(history.events(), dependencies, strict=True) == []


# ---------------------------------------------------------------- condition -> action (C-A)

CA_SCENARIOS = [
    # condition returns, condition commits?, action verdict
    (True, True, COMMIT),
    (False, True, ABORT),
    (True, False, ABORT),
    (None, False, ABORT),  # condition transaction failed before returning
]


@pytest.mark.parametrize("returned, condition_commits, verdict", CA_SCENARIOS)
def test_action_sequential_causally_dependent(threads, wait_until, returned, condition_commits, verdict):
    gate, history = DependencyGate(), DependencyHistory()
    threads.describe = lambda: (gate.statistics(), gate.waiting_edges(), history.events())
    history.begin("C")
    dependencies = gate.register_action("A", "C")
    action_began = threading.Event()
    finish_condition = threading.Event()

    def condition():
        assert finish_condition.wait(TIMEOUT)
        if returned is not None:
            gate.condition_returned("C", returned)
        end_trigger(gate, history, "C", condition_commits, returned if condition_commits else None)

    threads.start("condition", condition)
    threads.start("action", run_dependent, gate, history, "A", action_began)
    assert action_began.wait(TIMEOUT)  # the action began before the condition finished
    wait_until(lambda: gate.statistics().waiting_to_commit == 1, threads.describe)
    finish_condition.set()
    threads.join()
    assert threads.results["action"] == (BEGIN, verdict)
    assert position(history, "A", "begin") < position(history, "C", "commit" if condition_commits else "abort")
    assert check_dependencies(history.events(), dependencies, strict=True) == []


def test_action_aborts_as_soon_as_the_condition_returns_false(threads, wait_until):
    gate = DependencyGate()
    gate.register_action("A", "C")
    assert gate.wait_may_begin("A") is BEGIN
    threads.start("action", gate.wait_may_commit, "A", TIMEOUT)
    wait_until(lambda: gate.statistics().waiting_to_commit == 1, gate.statistics)
    gate.condition_returned("C", False)  # the condition's transaction is still running
    threads.join("action")
    assert threads.results["action"] is ABORT
    assert gate.outcome_of("C") is None


def test_immediate_action_coupling_needs_no_gate():
    gate = DependencyGate()
    assert gate.register_action("A", "C", Coupling.IMMEDIATE) == frozenset()
    assert gate.wait_may_begin("A") is BEGIN and gate.wait_may_commit("A") is COMMIT


# ---------------------------------------------------------------- several triggers and dependents


def test_one_forced_abort_wins_without_waiting_for_other_triggers():
    gate = DependencyGate()
    gate.register("D", "T1", Coupling.DETACHED_CAUSALLY_DEPENDENT)
    gate.register("D", "T2", Coupling.EXCLUSIVE_CAUSALLY_DEPENDENT)
    assert gate.wait_may_begin("D") is BEGIN
    gate.trigger_ended("T2", committed=True)  # T1 still running
    assert gate.must_abort("D")
    assert gate.wait_may_commit("D", timeout=TIMEOUT) is ABORT


def test_waits_for_all_triggers_before_commit(threads, wait_until):
    gate = DependencyGate()
    gate.register("D", "T1", Coupling.DETACHED_CAUSALLY_DEPENDENT)
    gate.register("D", "T2", Coupling.DETACHED_CAUSALLY_DEPENDENT)
    threads.start("dependent", gate.wait_may_commit, "D", TIMEOUT)
    wait_until(lambda: gate.waiting_edges() == {("D", "T1"), ("D", "T2")}, gate.waiting_edges)
    gate.trigger_ended("T1", committed=True)
    wait_until(lambda: gate.waiting_edges() == {("D", "T2")}, gate.waiting_edges)
    gate.trigger_ended("T2", committed=True)
    threads.join()
    assert threads.results["dependent"] is COMMIT


def test_a_chain_of_causal_dependencies_aborts_end_to_end(threads, wait_until):
    gate, history = DependencyGate(), DependencyHistory()
    history.begin("T")
    dependencies = gate.register("D1", "T", Coupling.DETACHED_CAUSALLY_DEPENDENT) | gate.register(
        "D2", "D1", Coupling.DETACHED_CAUSALLY_DEPENDENT
    )
    threads.start("D1", run_dependent, gate, history, "D1")
    threads.start("D2", run_dependent, gate, history, "D2")
    wait_until(lambda: gate.statistics().waiting_to_commit == 2, gate.statistics)
    end_trigger(gate, history, "T", committed=False)
    threads.join()
    assert threads.results == {"D1": (BEGIN, ABORT), "D2": (BEGIN, ABORT)}
    assert check_dependencies(history.events(), dependencies, strict=True) == []


@pytest.mark.parametrize("round_number", range(25))
def test_many_dependents_released_together_lose_no_wakeup(threads, round_number):
    modes = [Coupling.DETACHED_CAUSALLY_DEPENDENT, Coupling.SEQUENTIAL_CAUSALLY_DEPENDENT,
             Coupling.EXCLUSIVE_CAUSALLY_DEPENDENT, Coupling.DETACHED]
    trigger_commits = round_number % 2 == 0
    gate, history = DependencyGate(), DependencyHistory()
    threads.describe = lambda: (gate.statistics(), gate.waiting_edges())
    history.begin("T")
    dependencies = set()
    names = [f"D{index}" for index in range(12)]
    for index, name in enumerate(names):
        dependencies |= gate.register(name, "T", modes[index % len(modes)])
    barrier = threading.Barrier(len(names) + 1)

    def dependent(name):
        barrier.wait(timeout=TIMEOUT)
        return run_dependent(gate, history, name)

    def trigger():
        barrier.wait(timeout=TIMEOUT)
        end_trigger(gate, history, "T", trigger_commits)

    for name in names:
        threads.start(name, dependent, name)
    threads.start("T", trigger)
    threads.join()
    runs = {(BEGIN, COMMIT)}
    doomed = {(BEGIN, ABORT), (CANCEL, None)}  # CANCEL if the trigger ended before it asked to begin
    expected = {
        Coupling.DETACHED_CAUSALLY_DEPENDENT: runs if trigger_commits else doomed,
        Coupling.SEQUENTIAL_CAUSALLY_DEPENDENT: runs if trigger_commits else {(CANCEL, None)},
        Coupling.EXCLUSIVE_CAUSALLY_DEPENDENT: doomed if trigger_commits else runs,
        Coupling.DETACHED: runs,
    }
    for index, name in enumerate(names):
        assert threads.results[name] in expected[modes[index % len(modes)]], name
    assert check_dependencies(history.events(), dependencies, strict=True) == []


# ---------------------------------------------------------------- non-blocking checks, late facts


@pytest.mark.parametrize(
    "kind, committed, result, doomed",
    [
        (AD, False, None, True), (AD, True, None, False),
        (ED, True, None, True), (ED, False, None, False),
        (SQD, False, None, True), (SQD, True, None, False),
        (CD, False, None, False), (CD, True, None, False),
        (CRD, True, True, False), (CRD, True, False, True), (CRD, True, None, True), (CRD, False, True, True),
    ],
)
def test_must_abort(kind, committed, result, doomed):
    gate = DependencyGate()
    gate.register_dependency(Dependency(kind, "D", "T"))
    assert gate.must_abort("D") is False  # nothing is decided while T runs
    if result is not None:
        gate.condition_returned("T", result)
    gate.trigger_ended("T", committed)
    assert gate.must_abort("D") is doomed
    assert gate.wait_may_begin("D", timeout=0) is (CANCEL if doomed else BEGIN)
    if not doomed:
        assert gate.wait_may_commit("D", timeout=0) is COMMIT


def test_registering_on_an_ended_trigger_decides_at_once():
    # E.g. a rule on the trigger's "committed" event fires after the trigger ended.
    gate = DependencyGate()
    gate.trigger_ended("T", committed=True)
    gate.register("D", "T", Coupling.DETACHED_CAUSALLY_DEPENDENT)
    gate.register("E", "T", Coupling.EXCLUSIVE_CAUSALLY_DEPENDENT)
    assert gate.wait_may_commit("D", timeout=0) is COMMIT
    assert gate.wait_may_begin("E", timeout=0) is CANCEL


@pytest.mark.parametrize("outcome", ["no", "False", None, 0])
def test_an_end_whose_outcome_is_no_bool_is_refused_and_decides_nothing(outcome):
    """``trigger_ended(tid, committed)`` read the outcome by its truth value: an aborted trigger given as ``"no"`` or
    ``"False"`` was recorded as committed, so its AD dependent was told to COMMIT (as ``may_run_after`` did before it
    refused such an outcome).  Now it is an InvalidArgument naming ``committed``, and nothing is recorded."""
    gate = DependencyGate()
    gate.register("D", "T", Coupling.DETACHED_CAUSALLY_DEPENDENT)
    with pytest.raises(InvalidArgument, match=r"trigger_ended\('T', committed=.*\): committed is True or False"):
        gate.trigger_ended("T", outcome)
    assert gate.outcome_of("T") is None and gate.must_abort("D") is False
    gate.trigger_ended("T", committed=False)
    assert gate.wait_may_commit("D", timeout=0) is ABORT


@pytest.mark.parametrize("returned", ["no", "False", None, 0, 1])
def test_a_condition_result_that_is_no_bool_is_refused_and_decides_nothing(returned):
    """``condition_returned(condition, value)`` read the result by its truth value: a condition reported as having
    returned ``"no"`` or ``"False"`` counted as true, so its CRD action was let commit.  Now it is an InvalidArgument
    naming ``value``, and nothing is recorded: the real result can still be reported."""
    gate = DependencyGate()
    gate.register_action("A", "C")
    with pytest.raises(InvalidArgument, match=r"condition_returned\('C', value=.*\): value is True or False"):
        gate.condition_returned("C", returned)
    assert gate.must_abort("A") is False
    gate.condition_returned("C", False)
    assert gate.must_abort("A") is True


def test_unregistered_transactions_are_never_held_up():
    gate = DependencyGate()
    assert gate.wait_may_begin("X", timeout=0) is BEGIN
    assert gate.wait_may_commit("X", timeout=0) is COMMIT
    assert gate.register("X", "T", Coupling.DETACHED) == frozenset()
    assert gate.must_abort("X") is False


def test_timeout_raises_and_leaves_the_gate_unchanged():
    gate = DependencyGate()
    gate.register("D", "T", Coupling.DETACHED_CAUSALLY_DEPENDENT)
    with pytest.raises(DependencyTimeout) as caught:
        gate.wait_may_commit("D", timeout=0.01)
    assert caught.value.dependent == "D" and caught.value.waiting_for == ("T",)
    assert "'T'" in str(caught.value) and "trigger_ended" in str(caught.value)
    assert isinstance(caught.value, TimeoutError)
    assert gate.statistics().timeouts == 1 and gate.state_of("D") is DependentState.REGISTERED
    assert gate.statistics().waiting_to_commit == 0 and gate.waiting_edges() == frozenset()
    gate.trigger_ended("T", committed=True)
    assert gate.wait_may_commit("D", timeout=0) is COMMIT


@pytest.mark.parametrize("timeout", [float("inf"), 1e300])
def test_a_timeout_of_infinity_waits_without_limit(threads, wait_until, timeout):
    """A timeout the clock cannot add (infinity, 1e300) made the wait raise OverflowError ('timestamp out of range
    for platform time_t'): it waits without limit, as timeout=None does."""
    gate = DependencyGate()
    gate.register("D", "T", Coupling.DETACHED_CAUSALLY_DEPENDENT)
    assert gate.wait_may_begin("D", timeout=0) is BEGIN
    threads.start("D", gate.wait_may_commit, "D", timeout)
    threads.describe = gate.statistics
    wait_until(lambda: gate.statistics().waiting_to_commit == 1, gate.statistics)
    gate.trigger_ended("T", committed=True)
    threads.join("D")
    assert threads.results["D"] is COMMIT


@pytest.mark.parametrize("timeout", [float("nan"), "5"])
def test_a_timeout_that_is_no_number_is_refused_and_leaves_the_gate_unchanged(timeout):
    """timeout=NaN never ran out and never blocked: the wait asked the condition for a NaN wait, which returns at
    once, so the thread spun for ever on the gate's mutex; a text failed with a bare TypeError."""
    gate = DependencyGate()
    gate.register("D", "T", Coupling.DETACHED_CAUSALLY_DEPENDENT)
    for wait in (gate.wait_may_begin, gate.wait_may_commit):
        with pytest.raises(InvalidArgument, match="timeout"):
            wait("D", timeout=timeout)
    statistics = gate.statistics()
    assert gate.state_of("D") is DependentState.REGISTERED and statistics.waiting_to_commit == 0
    assert statistics.begun == statistics.committed == statistics.timeouts == 0
    assert gate.wait_may_begin("D", timeout=0) is BEGIN


def test_a_dependent_that_ends_while_waiting_wakes_up_aborted(threads, wait_until):
    gate = DependencyGate()
    gate.register("D", "T", Coupling.EXCLUSIVE_CAUSALLY_DEPENDENT)
    threads.start("waiter", gate.wait_may_commit, "D", TIMEOUT)
    wait_until(lambda: gate.statistics().waiting_to_commit == 1, gate.statistics)
    gate.trigger_ended("D", committed=False)  # e.g. chosen as a deadlock victim by another thread
    threads.join()
    assert threads.results["waiter"] is ABORT


def test_outcomes_are_kept_until_forgotten_and_unreferenced():
    gate = DependencyGate()
    gate.register("D", "T", Coupling.DETACHED_CAUSALLY_DEPENDENT)
    gate.trigger_ended("T", committed=True)
    gate.forget("T")
    assert gate.outcome_of("T") is True  # D still needs it
    assert gate.wait_may_commit("D") is COMMIT
    gate.trigger_ended("D", committed=True)
    assert gate.outcome_of("T") is None  # dropped: forgotten and no longer referenced
    assert gate.outcome_of("D") is True  # kept: not forgotten
    gate.forget("D")
    gate.forget("U")  # forgetting before the end drops the outcome at the end
    gate.trigger_ended("U", committed=False)
    assert gate.statistics().retained_outcomes == 0


# ---------------------------------------------------------------- misuse


def test_subtransaction_modes_and_weak_abort_are_refused():
    gate = DependencyGate()
    for mode in (Coupling.IMMEDIATE, "deferred"):
        with pytest.raises(UnsupportedByGate, match="transaction tree"):
            gate.register("child", "parent", mode)
    with pytest.raises(UnsupportedByGate, match="WD"):
        gate.register_dependency(Dependency(WD, "child", "parent"))
    assert gate.statistics().dependencies == 0


def refused(match: str, call, *args, **keywords) -> None:
    """``call(*args, **keywords)`` raises ``GateProtocolError`` with ``match`` in its message."""
    with pytest.raises(GateProtocolError, match=match):
        call(*args, **keywords)


def test_protocol_errors():
    gate = DependencyGate()
    gate.register("S", "T", Coupling.SEQUENTIAL_CAUSALLY_DEPENDENT)
    refused("never got BEGIN", gate.wait_may_commit, "S")
    gate.register("D", "T", Coupling.DETACHED_CAUSALLY_DEPENDENT)
    assert gate.wait_may_begin("D") is BEGIN
    refused("in state begun", gate.wait_may_begin, "D")
    refused("before calling wait_may_begin", gate.register, "D", "U", Coupling.SEQUENTIAL_CAUSALLY_DEPENDENT)
    refused("cycle", gate.register, "T", "D", Coupling.EXCLUSIVE_CAUSALLY_DEPENDENT)
    refused("did not grant", gate.trigger_ended, "D", committed=True)  # committed without asking
    refused("end twice", gate.trigger_ended, "D", committed=False)
    refused("already ended", gate.register, "D", "T", Coupling.DETACHED_CAUSALLY_DEPENDENT)
    refused("after it was reported to have ended", gate.wait_may_commit, "D")
    gate.condition_returned("C", True)
    refused("twice", gate.condition_returned, "C", True)
    gate.trigger_ended("E", committed=True)
    refused("before trigger_ended", gate.condition_returned, "E", True)


def test_a_dependent_told_to_abort_cannot_commit():
    gate = DependencyGate()
    gate.register("D", "T", Coupling.EXCLUSIVE_CAUSALLY_DEPENDENT)
    gate.trigger_ended("T", committed=True)
    assert gate.wait_may_commit("D") is ABORT
    refused("in state stopped", gate.wait_may_commit, "D")
    refused("already told to abort", gate.register, "D", "U", Coupling.DETACHED_CAUSALLY_DEPENDENT)
    refused("did not grant", gate.trigger_ended, "D", committed=True)


# ---------------------------------------------------------------- property: against a reference model

GATED = [CD, AD, ED, SQD, CRD]


def reference_verdicts(kinds_and_triggers, outcomes, results):
    """What a dependent must get once all its triggers have ended."""
    for kind, trigger in kinds_and_triggers:
        committed, result = outcomes[trigger], results.get(trigger)
        if kind is SQD and not committed:
            return (CANCEL, None)
        if kind is AD and not committed or kind is ED and committed:
            return (CANCEL, None)
        if kind is CRD and not (committed and result is True):
            return (CANCEL, None)
    return (BEGIN, COMMIT)


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_sequential_interleavings_match_the_reference(data):
    triggers = ["T0", "T1", "T2"]
    dependents = ["D0", "D1", "D2"]
    gate, history = DependencyGate(), DependencyHistory()
    registered = {}
    all_dependencies = set()
    for dependent in dependents:
        chosen = data.draw(
            st.lists(st.tuples(st.sampled_from(GATED), st.sampled_from(triggers)), min_size=1, max_size=3,
                     unique_by=lambda pair: pair[1]),
            label=f"dependencies of {dependent}",
        )
        registered[dependent] = chosen
        for kind, trigger in chosen:
            dependency = Dependency(kind, dependent, trigger)
            gate.register_dependency(dependency)
            all_dependencies.add(dependency)
    outcomes = {trigger: data.draw(st.booleans(), label=f"{trigger} commits") for trigger in triggers}
    results = {trigger: data.draw(st.sampled_from([True, False, None]), label=f"{trigger} returns") for trigger in triggers}
    for trigger in triggers:
        history.begin(trigger)
    # Interleave: each step either ends a trigger or advances a dependent one stage (non-blocking).
    stage = {dependent: "begin" for dependent in dependents}
    verdicts = {dependent: [] for dependent in dependents}
    pending_triggers = list(triggers)
    while pending_triggers or any(value != "done" for value in stage.values()):
        movable = [dependent for dependent in dependents if stage[dependent] != "done"]
        choice = data.draw(st.sampled_from(pending_triggers + movable), label="step")
        if choice in pending_triggers:
            pending_triggers.remove(choice)
            if outcomes[choice] and results[choice] is not None:
                gate.condition_returned(choice, results[choice])
            end_trigger(gate, history, choice, outcomes[choice], results[choice] if outcomes[choice] else None)
            continue
        dependent = choice
        try:
            if stage[dependent] == "begin":
                verdict = gate.wait_may_begin(dependent, timeout=0)
                verdicts[dependent].append(verdict)
                if verdict is BEGIN:
                    history.begin(dependent)
                    stage[dependent] = "commit"
                else:
                    history.abort(dependent)
                    gate.trigger_ended(dependent, committed=False)
                    stage[dependent] = "done"
            else:
                verdict = gate.wait_may_commit(dependent, timeout=0)
                verdicts[dependent].append(verdict)
                if verdict is COMMIT:
                    history.commit(dependent)
                else:
                    history.abort(dependent)
                gate.trigger_ended(dependent, committed=verdict is COMMIT)
                stage[dependent] = "done"
        except DependencyTimeout:
            assert pending_triggers, "waited although every trigger had ended"
    assert check_dependencies(history.events(), all_dependencies, strict=True) == []
    for dependent in dependents:
        expected = reference_verdicts(registered[dependent], outcomes, results)
        got = tuple(verdicts[dependent]) + (None,) * (2 - len(verdicts[dependent]))
        if expected == (BEGIN, COMMIT):
            assert got == expected, (dependent, registered[dependent])
        else:  # stopped at begin, or (decided later) at commit
            assert got in {(CANCEL, None), (BEGIN, ABORT)}, (dependent, registered[dependent], got)
