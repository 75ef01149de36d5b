"""Components over worker processes: the split, its bins, and the fallback for declaring
functions a worker cannot import."""

from __future__ import annotations

from activedb import batch
from activedb.batch import workloads
from activedb.batch._parallel import bins_of, components_of


def test_components_follow_shared_states_including_multi_key_transactions():
    touched = [[("a", 1), ("a", 2)],      # a transfer 1 -> 2
               [("a", 3)],
               [("a", 2), ("b", 9)],      # joins 1, 2 and b9
               [("b", 9)],
               [("a", 4), ("a", 3)]]
    assert components_of(touched) == [[0, 2, 3], [1, 4]]
    assert bins_of([[0, 2, 3], [1, 4]], [1, 1, 1, 1, 1], 2, pinned={4}) == [[1, 4], [0, 2, 3]]


def test_local_declarations_fall_back_to_this_process_with_a_note():
    transactions = batch.StateTransactions("local", processes=2)

    @transactions.on("add")
    def add(event, ops):          # a local function: worker processes cannot import it
        ops.write("t", event.key, lambda own: {"v": (own["v"] if own else 0) + 1})

    events = [{"type": "add", "key": key % 4} for key in range(40)]
    try:
        result = batch.run_in_memory(transactions, events, {}, strategy="ns/f/e", split="always")
    finally:
        transactions.close()
    assert result.final == {("t", key): {"v": 10} for key in range(4)}
    assert any("declare the state transactions at module level" in note for note in result.notes), result.notes


def test_workload_split_over_two_processes_equals_one():
    events = workloads.generate_ledger(workloads.Workload(batch=600, keys=64, partitions=4, cost_us=0, seed=3,
                                                          abort_ratio=0.2))
    state = workloads.initial_state("sl", 64)
    with workloads.ledger(processes=2) as transactions:
        split = batch.run_in_memory(transactions, events, state, strategy="auto", split="always")
    reference = batch.run_in_memory(workloads.ledger(), events, state, strategy="serial")
    assert split.statistics.processes == 2 and split.statistics.components >= 4
    assert split.final == reference.final
    assert split.dead_letters == reference.dead_letters
