"""The list-append checker (``activedb.testing.check_list_append``) on small hand-built histories.

Pure logic, no database: each anomaly kind is built once so we know the checker can fail, and a
few correct histories (trees with concurrent children and stretches of their parents' own operations) so we know it passes.
"""

from __future__ import annotations

import json

import pytest

import activedb
from activedb.testing import AnomalyKind, DependencyKind, Outcome, RecordedTransaction, check_list_append

COMMITTED, ABORTED = Outcome.COMMITTED, Outcome.ABORTED


def node(tid: str, *ops: tuple, parent: str | None = None, outcome: Outcome = COMMITTED) -> RecordedTransaction:
    return RecordedTransaction(tid, parent, outcome, ops)


def append(key: str, element: str) -> tuple:
    return ("append", key, element)


def read(key: str, *seen: str) -> tuple:
    return ("read", key, list(seen))


def spawn(child: str) -> tuple:
    return ("spawn", child)


def join(child: str) -> tuple:
    return ("join", child)


def kinds(report) -> set[AnomalyKind]:
    return set(report.kinds())


# --- correct histories pass -------------------------------------------------------------------------

def test_a_serial_history_of_trees_passes():
    history = [
        node("T1", append("x", "1"), spawn("T1.1"), join("T1.1"), read("x", "1", "2")),
        node("T1.1", read("x", "1"), append("x", "2"), parent="T1"),
        node("T2", read("x", "1", "2"), spawn("T2.1"), read("y"), join("T2.1"), read("y")),
        node("T2.1", append("y", "3"), append("y", "4"), parent="T2", outcome=ABORTED),
        node("T3", append("y", "5"), outcome=ABORTED),
    ]
    report = check_list_append(history, {"x": ["1", "2"], "y": []})
    report.assert_ok()
    assert report.statistics.committed_top_level == 2
    assert report.statistics.scopes == 2           # the top level and the children of T1


def test_siblings_running_concurrently_with_their_parent_pass():
    # T runs its own operations while C1 and C2 run; a serial order that explains every read:
    # T/own#0, T/own#1, C1, T/own#2 (appends p2 after c1), C2, T/own#3, T/own#4 (after the joins).
    history = [
        node("T", append("x", "p1"), spawn("C1"), spawn("C2"), read("x", "p1", "c1"), append("x", "p2"),
             join("C1"), join("C2"), read("x", "p1", "c1", "p2", "c2"), read("y", "c2y")),
        node("C1", read("x", "p1"), append("x", "c1"), read("y"), parent="T"),
        node("C2", read("x", "p1", "c1", "p2"), append("x", "c2"), append("y", "c2y"), parent="T"),
        node("U", read("x", "p1", "c1", "p2", "c2"), append("y", "u")),
    ]
    report = check_list_append(history, {"x": ["p1", "c1", "p2", "c2"], "y": ["c2y", "u"]})
    report.assert_ok()
    graph = report.graphs["children of T"]
    assert set(graph.nodes) == {"T/own#0", "T/own#1", "T/own#2", "T/own#3", "T/own#4", "C1", "C2"}
    assert DependencyKind.RW in graph.edges["C1", "C2"]["dependencies"]      # C1 read y before C2 appended
    assert report.statistics.sibling_dependencies == 8      # ww, wr and rw edges in the scope of T's children
    top = report.graphs["top level"]
    assert set(top.edges) == {("T", "U")}


def test_json_round_trip_and_dict_input():
    history = [node("T1", append("x", "a"), spawn("T1.1")), node("T1.1", read("x", "a"), parent="T1")]
    encoded = json.loads(json.dumps([transaction.to_json() for transaction in history]))
    assert [RecordedTransaction.from_json(item) for item in encoded] == history
    check_list_append(encoded, {"x": ["a"]}).assert_ok()


# --- every anomaly kind is found --------------------------------------------------------------------

def test_g0_write_cycle():
    history = [node("T1", append("x", "x1"), append("y", "y1")), node("T2", append("x", "x2"), append("y", "y2"))]
    report = check_list_append(history, {"x": ["x1", "x2"], "y": ["y2", "y1"]})
    assert kinds(report) == {AnomalyKind.G0}
    (anomaly,) = report.anomalies
    assert {step.kind for step in anomaly.cycle} == {DependencyKind.WW}
    with pytest.raises(AssertionError, match=r"G0 \(top level\): cycle T\d -> T\d -> T\d"):
        report.assert_ok()


def test_g1a_aborted_read_also_through_an_aborted_ancestor():
    history = [
        node("T1", append("x", "a"), outcome=ABORTED),
        node("T2", spawn("T2.1"), outcome=ABORTED),
        node("T2.1", append("y", "b"), parent="T2"),            # committed, but its parent aborted
        node("T3", read("x", "a"), read("y", "b")),
    ]
    report = check_list_append(history, {"x": [], "y": []})
    assert [anomaly.kind for anomaly in report.anomalies] == [AnomalyKind.G1A, AnomalyKind.G1A]
    assert "was undone when T2 aborted" in str(report.anomalies[1])
    # An aborted element in the final list is G1a too.
    report = check_list_append(history[:1], {"x": ["a"]})
    assert kinds(report) == {AnomalyKind.G1A}


def test_g1b_intermediate_read():
    history = [node("T1", append("x", "1"), append("x", "2")), node("T2", read("x", "1"))]
    report = check_list_append(history, {"x": ["1", "2"]})
    assert kinds(report) == {AnomalyKind.G1B, AnomalyKind.G_SINGLE}
    assert "intermediate state of T1" in str(report.anomalies[0])


def test_g1c_circular_information_flow():
    history = [node("T1", append("x", "x1"), read("y", "y2")), node("T2", append("y", "y2"), read("x", "x1"))]
    report = check_list_append(history, {"x": ["x1"], "y": ["y2"]})
    assert kinds(report) == {AnomalyKind.G1C}


def test_g_single_read_skew():
    history = [node("T1", read("x"), read("y", "y2")), node("T2", append("x", "x2"), append("y", "y2"))]
    report = check_list_append(history, {"x": ["x2"], "y": ["y2"]})
    assert kinds(report) == {AnomalyKind.G_SINGLE}
    steps = sorted(step.kind.value for step in report.anomalies[0].cycle)
    assert steps == ["rw", "wr"]


def test_g2_item_write_skew():
    history = [node("T1", read("x"), read("y"), append("x", "x1")),
               node("T2", read("x"), read("y"), append("y", "y2"))]
    report = check_list_append(history, {"x": ["x1"], "y": ["y2"]})
    assert kinds(report) == {AnomalyKind.G2_ITEM}
    assert [step.kind for step in report.anomalies[0].cycle] == [DependencyKind.RW, DependencyKind.RW]


def test_lost_append_duplicates_unknown_elements_and_incompatible_orders():
    history = [node("T1", append("x", "1")), node("T2", append("x", "2")), node("T3", read("x", "2"))]
    assert kinds(check_list_append(history, {"x": ["2"]})) == {AnomalyKind.LOST_APPEND}
    assert AnomalyKind.DUPLICATE_ELEMENT in kinds(check_list_append(history, {"x": ["1", "2", "2"]}))
    assert AnomalyKind.UNKNOWN_ELEMENT in kinds(check_list_append(history, {"x": ["1", "2", "9"]}))
    assert AnomalyKind.INCOMPATIBLE_ORDER in kinds(check_list_append(history, {"x": ["1", "2"]}))


def test_backward_reads_within_one_transaction():
    history = [node("T0", append("x", "0")), node("T1", read("x", "0"), read("x"))]
    assert AnomalyKind.BACKWARD_READ in kinds(check_list_append(history, {"x": ["0"]}))
    # Not seeing one's own append is going backwards too (even in an aborted transaction).
    history = [node("T1", append("x", "1"), read("x"), outcome=ABORTED)]
    assert kinds(check_list_append(history, {"x": []})) == {AnomalyKind.BACKWARD_READ}
    check_list_append(history, {"x": []}, aborted_reads=False).assert_ok()


# --- the sibling scope ------------------------------------------------------------------------------

def test_read_skew_between_siblings_is_found_in_their_scope_only():
    history = [
        node("T", spawn("C1"), spawn("C2")),
        node("C1", read("x"), read("y", "y2"), parent="T"),
        node("C2", append("x", "x2"), append("y", "y2"), parent="T"),
    ]
    report = check_list_append(history, {"x": ["x2"], "y": ["y2"]})
    assert [(anomaly.kind, anomaly.scope) for anomaly in report.anomalies] == [(AnomalyKind.G_SINGLE, "children of T")]


def test_a_child_that_misses_what_its_parent_did_before_creating_it():
    # The shape of bug A: the parent appended, then created the child, which read the list without it.
    history = [node("T", append("x", "p"), spawn("C")), node("C", read("x"), parent="T")]
    report = check_list_append(history, {"x": ["p"]})
    (anomaly,) = report.anomalies
    assert (anomaly.kind, anomaly.scope) == (AnomalyKind.G_SINGLE, "children of T")
    assert {step.kind for step in anomaly.cycle} == {DependencyKind.RW, DependencyKind.ORDER}
    assert "program order" in str(anomaly)


def test_a_parent_that_misses_a_child_it_waited_for():
    history = [node("T", spawn("C"), join("C"), read("x")), node("C", append("x", "c"), parent="T")]
    assert kinds(check_list_append(history, {"x": ["c"]})) == {AnomalyKind.G_SINGLE}


def test_an_intermediate_state_of_a_sibling():
    history = [
        node("T", spawn("C1"), spawn("C2")),
        node("C1", append("x", "1"), append("x", "2"), parent="T"),
        node("C2", read("x", "1"), parent="T"),
    ]
    report = check_list_append(history, {"x": ["1", "2"]})
    # C2 read between C1's two appends: G1b, and (as in Elle) the cycle C1 -wr-> C2 -rw-> C1.
    assert [(anomaly.kind, anomaly.scope) for anomaly in report.anomalies] == [
        (AnomalyKind.G1B, "children of T"), (AnomalyKind.G_SINGLE, "children of T")]


def test_an_interleaving_of_a_parent_stretch_and_a_child_is_a_write_cycle():
    # The parent's own operations between two markers are atomic with respect to its children.
    history = [
        node("T", spawn("C"), append("x", "p1"), append("x", "p2")),
        node("C", append("x", "c"), parent="T"),
    ]
    report = check_list_append(history, {"x": ["p1", "c", "p2"]})
    assert kinds(report) == {AnomalyKind.G0}
    assert report.anomalies[0].scope == "children of T"


def test_aborted_children_are_not_units():
    history = [
        node("T", spawn("C1"), join("C1"), spawn("C2"), join("C2"), read("x", "1")),
        node("C1", append("x", "1"), parent="T"),
        # Had C2 committed, its read would be a cycle C1 -> T/own#2 -> C2 -rw-> C1.
        node("C2", read("x"), append("x", "2"), parent="T", outcome=ABORTED),
    ]
    check_list_append(history, {"x": ["1"]}).assert_ok()
    history[2] = node("C2", read("x"), parent="T")
    assert kinds(check_list_append(history, {"x": ["1"]})) == {AnomalyKind.G_SINGLE}


# --- malformed histories ----------------------------------------------------------------------------

@pytest.mark.parametrize("history, message", [
    ([node("T"), node("T")], "recorded twice"),
    ([node("C", parent="T")], "not in the history"),
    ([node("T"), node("C", parent="T")], "has no \\('spawn', 'C'\\)"),
    ([node("T", join("C"), spawn("C")), node("C", parent="T")], "before spawning"),
    ([node("T1", append("x", "a")), node("T2", append("x", "a"))], "appended twice"),
    # (parents that never reach a top-level transaction: the checker recursed up them until a RecursionError)
    ([node("T", spawn("T"), parent="T")], "T is its own ancestor"),
    ([node("A", spawn("B"), parent="B"), node("B", spawn("A"), parent="A")], "A is its own ancestor"),
])
def test_malformed_histories_are_refused(history, message):
    with pytest.raises(ValueError, match=message):
        check_list_append(history, {})


@pytest.mark.parametrize("history", [None, 5, "T", [None]], ids=["none", "a-number", "a-text", "a-none-node"])
def test_a_history_that_is_no_list_of_recorded_transactions_is_refused_saying_what_to_give(history):
    """The docstring promises a ValueError for a malformed history: None or a number failed with a bare TypeError
    ('object is not iterable'), a text or a None node with one from indexing ('string indices must be integers')."""
    with pytest.raises(activedb.BadArgument, match=r"check_list_append takes .*RecordedTransaction"):
        check_list_append(history, {})


@pytest.mark.parametrize("final, shown", [
    ([["a"]], r"final=\[\['a'\]\]"), ({"x": None}, r"final\['x'\] is None"), ({"x": "a"}, r"final\['x'\] is 'a'"),
], ids=["a-list", "a-none-list", "a-text"])
def test_final_lists_that_are_no_lists_are_refused_saying_what_to_give(final, shown):
    """``final`` given as a list of lists failed with AttributeError ('list' object has no attribute 'items'), a key
    read as no row (None) with TypeError ('NoneType' object is not iterable); a text was taken letter by letter."""
    history = [node("T", append("x", "a"))]
    with pytest.raises(activedb.BadArgument, match=shown):
        check_list_append(history, final)


@pytest.mark.parametrize("field", ["id", "outcome"])
def test_a_json_node_without_its_id_or_outcome_is_a_malformed_history(field):
    """A node in JSON form without "id" or "outcome" failed with a bare KeyError ('id'), where the docstring promises
    a ValueError for a malformed history."""
    item = {"id": "T", "parent": None, "outcome": "committed", "ops": [["append", "x", "a"]]}
    del item[field]
    with pytest.raises(ValueError, match=f"has no {field!r}"):
        check_list_append([item], {"x": ["a"]})


def test_malformed_operations_are_refused():
    with pytest.raises(ValueError, match="none of"):
        node("T", ("write", "x", 1))
