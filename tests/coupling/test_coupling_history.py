"""check_dependencies against hand-made histories: each kind's violations are caught, valid ones pass."""

from __future__ import annotations

import threading

import pytest

from coupling import (
    Coupling,
    Dependency,
    DependencyKind,
    HistoryEvent,
    HistoryEventKind,
    DependencyHistory,
    InvalidArgument,
    MalformedHistory,
    check_dependencies,
    dependencies_for,
)

CD, AD, WD, ED, SQD, CRD = (DependencyKind[name] for name in ("CD", "AD", "WD", "ED", "SQD", "CRD"))


def history(*steps: str) -> list[HistoryEvent]:
    """``history("b T", "c T:true", "a D")``: begin/commit/abort events numbered in the given order."""
    events = []
    for seq, step in enumerate(steps):
        kind, tid = step.split()
        tid, _, result = tid.partition(":")
        kind = {"b": "begin", "c": "commit", "a": "abort"}[kind]
        events.append(HistoryEvent(tid, kind, seq, {"": None, "true": True, "false": False}[result]))
    return events


def violations(dependency: Dependency, *steps: str, strict: bool = False) -> list[str]:
    return check_dependencies(history(*steps), [dependency], strict=strict)


# ---------------------------------------------------------------- one table per kind: (steps, ok?)

CASES = {
    # D CD T: if both commit, T commits first.
    Dependency(CD, "D", "T"): [
        (["b T", "b D", "c T", "c D"], True),
        (["b T", "b D", "c D", "c T"], False),
        (["b T", "b D", "c D", "a T"], True),  # T aborted: no constraint
        (["b T", "b D", "a D", "c T"], True),
        (["b D", "c D"], True),  # T never committed (yet)
    ],
    # D AD T: if T aborts, D aborts.
    Dependency(AD, "D", "T"): [
        (["b T", "b D", "a T", "a D"], True),
        (["b T", "b D", "a D", "a T"], True),
        (["b T", "b D", "a T", "c D"], False),
        (["b T", "b D", "c D", "a T"], False),  # committed too early: cannot abort any more
        (["b T", "b D", "a T"], False),  # the consequence has not happened
        (["b T", "b D", "c T", "c D"], True),
    ],
    # D WD T: if T aborts before D committed, D aborts.
    Dependency(WD, "D", "T"): [
        (["b T", "b D", "c D", "a T"], True),  # the nested case: committed child, aborted parent
        (["b T", "b D", "a T", "a D"], True),
        (["b T", "b D", "a T", "c D"], False),
        (["b T", "b D", "a T"], False),
        (["b T", "b D", "c T", "c D"], True),
    ],
    # D ED T: if T commits, D aborts.
    Dependency(ED, "D", "T"): [
        (["b T", "b D", "a T", "c D"], True),
        (["b T", "b D", "c T", "a D"], True),
        (["b T", "b D", "c T", "c D"], False),
        (["b T", "b D", "c D", "c T"], False),
        (["b T", "a D", "c T"], True),  # cancelled before it ran
    ],
    # D SQD T: D begins only after T committed.
    Dependency(SQD, "D", "T"): [
        (["b T", "c T", "b D", "c D"], True),
        (["b T", "b D", "c T", "c D"], False),
        (["b T", "a T", "b D", "c D"], False),
        (["b T", "a T", "a D"], True),  # never began
        (["b T", "a T"], True),
    ],
    # D CRD T: D commits only after T committed and returned true.
    Dependency(CRD, "D", "T"): [
        (["b T", "b D", "c T:true", "c D"], True),
        (["b T", "b D", "c T:false", "c D"], False),
        (["b T", "b D", "c T", "c D"], False),  # result not recorded
        (["b T", "b D", "c D", "c T:true"], False),
        (["b T", "b D", "a T", "c D"], False),
        (["b T", "b D", "c T:false", "a D"], True),
    ],
}


@pytest.mark.parametrize(
    "dependency, steps, ok",
    [(dependency, steps, ok) for dependency, cases in CASES.items() for steps, ok in cases],
    ids=lambda value: " ".join(value) if isinstance(value, list) else str(value),
)
def test_definition(dependency, steps, ok):
    found = violations(dependency, *steps)
    assert (found == []) is ok, found
    if not ok:
        assert found[0].startswith(f"{dependency} violated")


def test_strict_rejects_lucky_ad_and_ed_histories():
    # D committed while T was running, and T happened to end the right way afterwards.
    assert violations(Dependency(AD, "D", "T"), "b T", "b D", "c D", "c T") == []
    assert violations(Dependency(AD, "D", "T"), "b T", "b D", "c D", "c T", strict=True)
    assert violations(Dependency(AD, "D", "T"), "b T", "b D", "c T", "c D", strict=True) == []
    assert violations(Dependency(ED, "D", "T"), "b T", "b D", "c D", "a T") == []
    assert violations(Dependency(ED, "D", "T"), "b T", "b D", "c D", "a T", strict=True)
    assert violations(Dependency(ED, "D", "T"), "b T", "b D", "a T", "c D", strict=True) == []


def test_each_mode_on_a_valid_and_an_invalid_history():
    child, parent = "D", "T"
    valid_and_invalid = {
        Coupling.IMMEDIATE: (["b T", "b D", "c D", "c T"], ["b T", "b D", "c T", "c D"]),
        Coupling.DEFERRED: (["b T", "b D", "c D", "a T"], ["b T", "b D", "a T", "c D"]),
        Coupling.DETACHED_CAUSALLY_DEPENDENT: (["b T", "b D", "c T", "c D"], ["b T", "b D", "c D", "c T"]),
        Coupling.SEQUENTIAL_CAUSALLY_DEPENDENT: (["b T", "c T", "b D", "c D"], ["b T", "b D", "c T", "c D"]),
        Coupling.EXCLUSIVE_CAUSALLY_DEPENDENT: (["b T", "b D", "a T", "c D"], ["b T", "b D", "c T", "c D"]),
    }
    for mode, (valid, invalid) in valid_and_invalid.items():
        dependencies = dependencies_for(mode, child, parent)
        assert check_dependencies(history(*valid), dependencies, strict=True) == [], mode
        assert check_dependencies(history(*invalid), dependencies), mode
    # Detached: anything goes.
    assert check_dependencies(history("b T", "b D", "c D", "a T"), dependencies_for("detached", child, parent)) == []


def test_reports_every_violation_with_its_dependency():
    dependencies = [Dependency(ED, "D", "T"), Dependency(CD, "E", "T"), Dependency(SQD, "F", "T")]
    found = check_dependencies(history("b T", "b D", "b E", "b F", "c E", "c D", "c T", "c F"), dependencies)
    assert [line.split(" violated")[0] for line in found] == ["D ED T", "E CD T", "F SQD T"]


@pytest.mark.parametrize(
    "steps, message",
    [
        (["b T", "b T"], "begins twice"),
        (["b T", "c T", "a T"], "ends twice"),
        (["b T", "c T", "c T"], "ends twice"),
        (["c T"], "without a begin"),
        (["a T", "b T"], "after it ended"),
    ],
)
def test_malformed_histories_raise(steps, message):
    with pytest.raises(MalformedHistory, match=message):
        check_dependencies(history(*steps), [])


def test_events_need_distinct_positions_and_known_kinds():
    with pytest.raises(MalformedHistory, match="same position"):
        check_dependencies([HistoryEvent("T", "begin", 1), HistoryEvent("D", "begin", 1)], [])
    with pytest.raises(MalformedHistory, match="unknown history event kind"):
        HistoryEvent("T", "spawn", 1)
    with pytest.raises(MalformedHistory, match="only a commit"):
        HistoryEvent("T", "abort", 1, result=False)
    assert HistoryEvent("T", "COMMIT", 3).kind is HistoryEventKind.COMMIT
    assert HistoryEvent("T", "commit", 3).kind == "commit"


def test_order_is_by_seq_not_by_list_position():
    events = history("b T", "b D", "c T", "c D")[::-1]
    assert check_dependencies(events, [Dependency(CD, "D", "T")]) == []


def test_recorder_numbers_events_from_many_threads(threads):
    recorder = DependencyHistory()
    barrier = threading.Barrier(8)

    def work(number: int) -> None:
        barrier.wait(timeout=5)
        for index in range(50):
            tid = f"t{number}.{index}"
            recorder.begin(tid)
            recorder.commit(tid, result=True)

    for number in range(8):
        threads.start(f"worker {number}", work, number)
    threads.join()
    events = recorder.events()
    assert [event.seq for event in events] == list(range(800))
    assert check_dependencies(events, []) == []  # well formed: each begin precedes its commit


@pytest.mark.parametrize("strict", ["no", "false", None, 0, 1])
def test_a_strict_that_is_no_bool_is_refused(strict):
    """``check_dependencies(..., strict=...)`` read the switch by its truth value: ``strict="no"`` (or "false" from a
    configuration file) checked strictly, reporting a lucky AD history the caller meant to accept; 0 and None were
    lenient by accident.  Now it is an InvalidArgument naming ``strict``."""
    lucky = history("b T", "b D", "c D", "c T")
    assert check_dependencies(lucky, [Dependency(AD, "D", "T")]) == []
    with pytest.raises(InvalidArgument, match=r"check_dependencies\(strict=.*\) takes True or False"):
        check_dependencies(lucky, [Dependency(AD, "D", "T")], strict=strict)
