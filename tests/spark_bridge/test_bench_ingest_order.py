"""``activedb bench ingest``'s scale-out row: the order of each round's one-task and scale-out runs is balanced."""

from __future__ import annotations

from benchmarks.ingest import QUICK_SCALE_OUT_ROUNDS, SCALE_OUT_ROUNDS, scale_out_order


def test_each_side_of_the_scale_out_row_runs_first_in_as_many_rounds_as_the_other() -> None:
    orders = [scale_out_order(round_) for round_ in range(SCALE_OUT_ROUNDS)]
    assert all(sorted(order) == ["rules", "scale-out"] for order in orders)
    # The first round's one-task run is the rules run of that size's round: the one task first there.
    assert orders[0] == ("rules", "scale-out")
    firsts = [order[0] for order in orders]
    assert SCALE_OUT_ROUNDS % 2 == 0 and firsts.count("rules") == firsts.count("scale-out"), firsts
    # ABBA: over four rounds a steady drift of the machine favours neither side.
    assert firsts[:4] == ["rules", "scale-out", "scale-out", "rules"]
    # (Quick mode runs one round: no order to balance.)
    assert QUICK_SCALE_OUT_ROUNDS == 1
