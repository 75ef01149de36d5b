"""What a batch run hands out (``BatchResult``): its transactions' outputs are the caller's, apart from the state."""

from __future__ import annotations

import pytest

from activedb import batch


@pytest.mark.parametrize("strategy", ["serial", "lean", "tpg"])
def test_changing_an_output_changes_neither_the_final_images_nor_another_output(strategy):
    """A WRITE's output was the image the state keeps, and a READ's output the state's image itself (``_lean`` and
    ``_state.perform`` handed both out as they are), so a caller that changed an output in place — a sink adding a
    column, ``on_result`` normalising a row — changed ``result.final`` (what the batch wrote, and what a later
    batch may start from) and every other output of the same image.  The outputs are now copies of their own,
    made when ``result.transactions`` is first read (never on the run's path)."""
    transactions = batch.StateTransactions("t")

    @transactions.on("write")
    def write(event, ops):
        ops.write("t", "B", lambda own: {"v": own["v"] + 1}, name="wrote")

    @transactions.on("read")
    def read(event, ops):
        ops.read("t", "B", name="seen")
        ops.read("t", "A", name="untouched")

    events = [{"type": "write", "key": 1}, {"type": "read", "key": 1}]
    result = batch.run_in_memory(transactions, events, {("t", "A"): {"v": 1}, ("t", "B"): {"v": 10}},
                                 strategy=strategy)
    first, second = result.transactions
    assert first.outputs == {"wrote": {"v": 11}} and second.outputs == {"seen": {"v": 11}, "untouched": {"v": 1}}
    second.outputs["seen"]["v"] = 99
    first.outputs["wrote"]["v"] = 77
    second.outputs["untouched"]["v"] = 55
    assert result.final == {("t", "B"): {"v": 11}}
    assert result.changes() == {("t", "B"): {"v": 11}}
    assert result.before.get(("t", "A"), {"v": 1}) == {"v": 1}
    assert result.transactions[1].outputs["seen"] == {"v": 99}      # (the caller's copy stays the caller's)
