"""The six modes and the dependencies each one creates (Concurrent Rule Execution §3.3.2, axioms 18-23;
the table in coupling/README.md)."""

from __future__ import annotations

import pytest

import coupling
from coupling import (
    ACTION_COUPLINGS,
    Coupling,
    CouplingError,
    Dependency,
    DependencyKind,
    InvalidActionCoupling,
    UnknownCoupling,
    action_dependencies_for,
    dependencies_for,
    has_own_deferred_queue,
    may_run_after,
)
from coupling.errors import UnsupportedByGate

CD, AD, WD, ED, SQD, CRD = (DependencyKind[name] for name in ("CD", "AD", "WD", "ED", "SQD", "CRD"))
DETACHED_FAMILY = [
    Coupling.DETACHED,
    Coupling.DETACHED_CAUSALLY_DEPENDENT,
    Coupling.SEQUENTIAL_CAUSALLY_DEPENDENT,
    Coupling.EXCLUSIVE_CAUSALLY_DEPENDENT,
]


def test_every_refusal_of_bad_input_is_a_coupling_error():
    """``coupling.errors``' promise: every error the package raises on purpose is a ``CouplingError`` (a
    ``ValueError`` too, for bad input), so ``except CouplingError`` also catches a bad dependency or cycle bound."""
    refusals = {"an unknown dependency kind": lambda: Dependency("XD", "j", "i"),
                "a transaction depending on itself": lambda: Dependency(CD, "t", "t"),
                "a cycle bound below 1": lambda: coupling.DeferredQueue(max_cycles=0)}
    for what, make in refusals.items():
        with pytest.raises(CouplingError) as refused:
            make()
        assert isinstance(refused.value, ValueError), what


def test_the_contract_names_are_exported():
    for name in (
        "Coupling DependencyKind Dependency dependencies_for ACTION_COUPLINGS DependencyGate Verdict "
        "DeferredQueue priority_groups HistoryEvent check_dependencies CouplingError"
    ).split():
        assert name in coupling.__all__ and hasattr(coupling, name)


def test_six_modes_with_their_own_docstrings_and_primitives():
    assert len(Coupling) == 6
    docs = [mode.__doc__ for mode in Coupling]
    assert all(doc and len(doc) > 80 for doc in docs)
    assert len(set(docs)) == 6
    assert [mode.primitive for mode in Coupling] == [
        "Spawn_Imm", "Spawn_Def", "Spawn_Detached", "Spawn_Caus", "Spawn_Seq", "Spawn_Exc",
    ]


def test_where_each_mode_runs():
    assert {mode for mode in Coupling if mode.runs_as_subtransaction} == {Coupling.IMMEDIATE, Coupling.DEFERRED}
    assert [mode for mode in Coupling if mode.runs_as_top_level] == DETACHED_FAMILY


@pytest.mark.parametrize(
    "text, mode",
    [
        ("deferred", Coupling.DEFERRED),
        ("DEFERRED", Coupling.DEFERRED),
        (" Immediate ", Coupling.IMMEDIATE),
        ("detached", Coupling.DETACHED),
        ("detached-causally-dependent", Coupling.DETACHED_CAUSALLY_DEPENDENT),
        ("Sequential Causally Dependent", Coupling.SEQUENTIAL_CAUSALLY_DEPENDENT),
        ("EXCLUSIVE_CAUSALLY_DEPENDENT", Coupling.EXCLUSIVE_CAUSALLY_DEPENDENT),
        (Coupling.DETACHED, Coupling.DETACHED),
    ],
)
def test_parse_is_case_insensitive(text, mode):
    assert Coupling.parse(text) is mode


@pytest.mark.parametrize("bad", ["defered", "", "causal", 3, None, b"deferred", bytearray(b"detached")])
def test_parse_rejects_unknown_names_listing_the_valid_ones(bad):
    # (A name as bytes has strip() and lower() but no replace() taking texts: it was a bare TypeError, 'a bytes-like
    # object is required, not 'str'', where every other name that is no mode is an UnknownCoupling.)
    with pytest.raises(UnknownCoupling) as caught:
        Coupling.parse(bad)
    assert isinstance(caught.value, CouplingError) and isinstance(caught.value, ValueError)
    for mode in Coupling:
        assert mode.value in str(caught.value)


def test_action_couplings():
    assert ACTION_COUPLINGS == frozenset({Coupling.IMMEDIATE, Coupling.SEQUENTIAL_CAUSALLY_DEPENDENT})
    assert Coupling.parse_action("sequential_causally_dependent") is Coupling.SEQUENTIAL_CAUSALLY_DEPENDENT
    assert [mode.is_valid_action_coupling for mode in Coupling] == [True, False, False, False, True, False]
    with pytest.raises(InvalidActionCoupling, match="immediate, sequential_causally_dependent"):
        Coupling.parse_action("deferred")


def test_dependencies_for_is_designs_table():
    child, parent = "child", "parent"
    expected = {
        Coupling.IMMEDIATE: {Dependency(WD, child, parent), Dependency(CD, parent, child)},
        Coupling.DEFERRED: {Dependency(WD, child, parent), Dependency(CD, parent, child)},
        Coupling.DETACHED: set(),
        Coupling.DETACHED_CAUSALLY_DEPENDENT: {Dependency(AD, child, parent), Dependency(CD, child, parent)},
        Coupling.SEQUENTIAL_CAUSALLY_DEPENDENT: {Dependency(SQD, child, parent)},
        Coupling.EXCLUSIVE_CAUSALLY_DEPENDENT: {Dependency(ED, child, parent)},
    }
    for mode, dependencies in expected.items():
        assert dependencies_for(mode, child, parent) == frozenset(dependencies), mode
        assert dependencies_for(mode.value.upper(), child, parent) == frozenset(dependencies), mode


def test_action_dependencies():
    assert action_dependencies_for("immediate", "action", "condition") == frozenset()
    assert action_dependencies_for(Coupling.SEQUENTIAL_CAUSALLY_DEPENDENT, "action", "condition") == {
        Dependency(AD, "action", "condition"),
        Dependency(CRD, "action", "condition"),
    }
    for mode in set(Coupling) - ACTION_COUPLINGS:
        with pytest.raises(InvalidActionCoupling):
            action_dependencies_for(mode, "action", "condition")


def test_dependency_notation_and_direction():
    dependency = Dependency(ED, "compensation", "trigger")
    assert str(dependency) == "compensation ED trigger"
    assert dependency.describe() == "if trigger commits, compensation aborts (compensation ED trigger)"
    assert Dependency("cd", "j", "i").kind is CD  # kinds may be given by name
    assert Dependency("BCD", "j", "i").kind is SQD
    with pytest.raises(ValueError, match="use one of: CD, AD, WD, ED, SQD, BCD, CRD"):
        Dependency("XD", "j", "i")
    assert DependencyKind.BCD is SQD  # ACTA's begin-on-commit dependency is the SQD
    assert all(kind.__doc__ and "=>" in kind.__doc__ for kind in DependencyKind)
    with pytest.raises(ValueError, match="cannot depend on itself"):
        Dependency(CD, "t", "t")
    assert {Dependency(CD, 1, 2), Dependency(CD, 1, 2)} == {Dependency(CD, 1, 2)}  # hashable values


def test_who_owns_a_deferred_queue():
    # Top-level and immediate transactions run cycles; deferred ones hand their deferred firings on.
    assert has_own_deferred_queue(None)
    assert has_own_deferred_queue(Coupling.IMMEDIATE)
    assert not has_own_deferred_queue(Coupling.DEFERRED)
    assert not has_own_deferred_queue("deferred")
    assert all(has_own_deferred_queue(mode) for mode in DETACHED_FAMILY)


@pytest.mark.parametrize("committed", [False, True])
@pytest.mark.parametrize("mode", list(Coupling))
def test_may_run_after_answers_from_its_table_what_the_dependencies_say(mode, committed):
    """``may_run_after`` looks the detached family up in a table made at import; the table says what the
    dependencies say (AD and SQD: the trigger committed; ED: it aborted; CD alone: either way), by mode or its
    name, and the in-trigger modes are refused as before."""
    from coupling._dependencies import _may_run_after

    if mode.runs_as_subtransaction:
        with pytest.raises(UnsupportedByGate):
            may_run_after(mode, committed)
        return
    expected = {Coupling.DETACHED: True, Coupling.DETACHED_CAUSALLY_DEPENDENT: committed,
                Coupling.SEQUENTIAL_CAUSALLY_DEPENDENT: committed,
                Coupling.EXCLUSIVE_CAUSALLY_DEPENDENT: not committed}[mode]
    assert may_run_after(mode, committed) is expected
    assert may_run_after(mode.value, committed) is expected
    assert _may_run_after(mode, committed) is expected


@pytest.mark.parametrize("bad", ["nope", ["detached"], None])
def test_may_run_after_refuses_what_is_no_mode_as_before(bad):
    with pytest.raises(UnknownCoupling):
        may_run_after(bad, True)


@pytest.mark.parametrize("outcome", ["no", None, "False"])
@pytest.mark.parametrize("mode", DETACHED_FAMILY)
def test_may_run_after_refuses_an_outcome_that_is_no_bool(mode, outcome):
    """``trigger_committed`` is a bool: a string such as ``"no"`` was read by its truth value and returned
    as the answer itself (``"no"``, truthy), so a dependent whose trigger aborted looked allowed to run."""
    with pytest.raises(coupling.errors.InvalidArgument, match="trigger_committed"):
        may_run_after(mode, outcome)
