"""The history checker (``activedb.testing.check_history``) on small hand-built histories: the ACTA axioms
of parallel nested transactions it checks each catch what breaks them."""

from __future__ import annotations

from activedb.testing import check_history
from activedb.txn import HistoryOp


def _tree(*ops: tuple) -> list[HistoryOp]:
    """``(kind, transaction, parent)`` in order; every transaction's root is ``T``."""
    return [HistoryOp(sequence, kind, transaction, parent=parent, root="T")
            for sequence, (kind, transaction, parent) in enumerate(ops)]


def test_a_well_nested_history_passes():
    report = check_history(_tree(("begin", "T", None), ("begin", "T.1", "T"), ("begin", "T.2", "T"),
                                 ("commit", "T.1", "T"), ("abort", "T.2", "T"), ("commit", "T", None)))
    assert report.ok, report.violations


def test_a_parent_committing_before_its_child_ended_breaks_axiom_1():
    report = check_history(_tree(("begin", "T", None), ("begin", "T.1", "T"), ("commit", "T", None),
                                 ("commit", "T.1", "T")))
    assert report.violations == ["T committed (#2) before its child T.1 ended"]


def test_a_child_outliving_its_aborted_parent_breaks_axiom_4():
    report = check_history(_tree(("begin", "T", None), ("begin", "T.1", "T"), ("begin", "T.2", "T"),
                                 ("abort", "T", None), ("commit", "T.1", "T")))
    assert sorted(report.violations) == ["T.1 committed after its parent T aborted",
                                         "T.2 never ended although its parent T aborted"]
