"""The history checker (``activedb.testing.check_history``) on small hand-built histories: the ACTA axioms
of parallel nested transactions it checks each catch what breaks them."""

from __future__ import annotations

import pytest

import activedb
from activedb.store import Entry, EntryKind
from activedb.streams import StreamHistory
from activedb.testing import check_history, check_stream_history, replay
from activedb.txn import HistoryOp, HistoryRecorder


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


def test_a_committed_tree_whose_writes_were_never_flushed_breaks_axiom_2():
    """A committed top-level transaction's flush was checked against its delegated writes only when a flush was
    recorded: a tree that committed with writes and flushed nothing (every committed root flushes, with an empty
    write set too) passed, so the checker could not see the writes of a whole tree lost."""
    written = Entry(EntryKind.PATCH, {"stock": 4})
    history = _tree(("begin", "T", None), ("begin", "T.1", "T"))
    history.append(HistoryOp(len(history), "write", "T.1", parent="T", root="T", table="items", key=(1,),
                             value=written))
    history += [HistoryOp(len(history) + n, kind, transaction, parent=parent, root="T")
                for n, (kind, transaction, parent) in enumerate([("commit", "T.1", "T"), ("commit", "T", None)])]
    report = check_history(history)
    assert report.violations == ["T committed its delegated writes but flushed none of them: "
                                 "missing [('items', (1,))]"], report.violations
    flushed = [*history, HistoryOp(len(history), "flush", "T", root="T", value={("items", (1,)): written})]
    assert check_history(flushed).ok, check_history(flushed).violations


def test_replay_applies_a_history_given_as_an_iterator():
    # replay read the ops twice (the commits, then the flushes): an iterator was used up by the first pass and
    # the state came back as the initial one, as if nothing had committed.
    history = _tree(("begin", "T", None), ("commit", "T", None))
    history.append(HistoryOp(len(history), "flush", "T", root="T",
                             value={("items", (1,)): Entry(EntryKind.PATCH, {"stock": 4})}))
    initial = {("items", (1,)): {"id": 1, "stock": 5}}
    assert replay(iter(history), initial) == replay(history, initial) == {("items", (1,)): {"id": 1, "stock": 4}}


@pytest.mark.parametrize("given", [None, 5, "begin", HistoryRecorder(), [None], [[]]],
                         ids=["none", "a-number", "a-text", "the-recorder", "a-none-op", "a-snapshot-in-a-list"])
def test_check_history_of_what_is_no_list_of_operations_says_what_to_give(given):
    """``check_history(None)`` (a number, the recorder itself: ``check_history(db.history)``) failed with a bare
    TypeError ('object is not iterable'); a text was read letter by letter (AttributeError: no 'sequence'), and so was
    a list holding what is no operation (``[db.history.snapshot()]``, a None)."""
    with pytest.raises(activedb.BadArgument, match=r"check_history takes the recorded operations: "
                                                   r"db\.history\.snapshot\(\)"):
        check_history(given)


@pytest.mark.parametrize("given", [None, 5, "read", StreamHistory(), [None], [[]]],
                         ids=["none", "a-number", "a-text", "the-history", "a-none-op", "a-snapshot-in-a-list"])
def test_check_stream_history_of_what_is_no_list_of_operations_says_what_to_give(given):
    """As check_history: ``check_stream_history(engine.history)`` or None failed with a bare TypeError, a list
    holding what is no operation with AttributeError (no 'sequence')."""
    with pytest.raises(activedb.BadArgument, match=r"check_stream_history takes the recorded operations: "
                                                   r"engine\.history\.snapshot\(\)"):
        check_stream_history(given)


@pytest.mark.parametrize("given", [None, 5, HistoryRecorder(), [None], iter([[]])],
                         ids=["none", "a-number", "the-recorder", "a-none-op", "a-snapshot-in-an-iterator"])
def test_replay_of_what_is_no_list_of_operations_says_what_to_give(given):
    """As check_history, which is given the same operations: ``replay(db.history, initial)`` or None failed with a
    bare TypeError ('object is not iterable')."""
    with pytest.raises(activedb.BadArgument, match=r"replay takes the recorded operations: db\.history\.snapshot\(\)"):
        replay(given, {})
