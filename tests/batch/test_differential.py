"""Differential test: random SL / GS / TP batches (θ ∈ {0, 0.8}, aborts 0–50 %, deposits and
transfers, cyclic and acyclic key groups, windows, non-deterministic ops) through every
strategy, the decision model and the serial reference: identical final state, outputs, and
aborted transactions with identical reasons.

Seeded: ``ACTIVEDB_TEST_SEED`` (default 7) shifts every generator's seed.
"""

from __future__ import annotations

import os

import pytest

from activedb import batch
from benchmarks import workloads

SEED = int(os.environ.get("ACTIVEDB_TEST_SEED", "7"))
STRATEGIES = ["auto", "lean", "tpg"] + [strategy.name for strategy in batch.all_strategies()]


def _summary(result: batch.BatchResult):
    return (result.final, [(outcome.event.position, outcome.committed, outcome.reason, outcome.outputs)
                           for outcome in result.transactions], result.dead_letters)


def _batch(name: str, theta: float, abort_ratio: float, variant: int):
    keys = 30
    workload = workloads.Workload(theta=theta, abort_ratio=abort_ratio, cost_us=0, batch=160, keys=keys,
                                  seed=SEED * 100 + variant, cyclic=variant % 2 == 1, length=1 + variant % 2)
    if name == "sl":
        events = workloads.generate_ledger(workload)
        # Small balances: besides the injected aborts, transfers fail on balances other
        # transactions changed (aborts that depend on earlier aborts, and revocations).
        state = {state: {**row, **({"balance": 120} if "balance" in row else {"value": 120})}
                 for state, row in workloads.initial_state("sl", keys).items()}
    elif name == "gs":
        events = workloads.generate_grep_sum(workload, window_every=9, window_size=12.0, window_keys=4,
                                             nd_every=7 if variant < 2 else 0)
        state = workloads.initial_state("gs", keys)
    else:
        events = workloads.generate_toll(workload)
        state = {}
    return workloads.workload_transactions(name), events, state


@pytest.mark.parametrize("variant", [0, 1, 2])
@pytest.mark.parametrize("abort_ratio", [0.0, 0.5])
@pytest.mark.parametrize("theta", [0.0, 0.8])
@pytest.mark.parametrize("name", ["sl", "gs", "tp"])
def test_every_strategy_gives_the_serial_result(name, theta, abort_ratio, variant):
    transactions, events, state = _batch(name, theta, abort_ratio, variant)
    reference = batch.run_in_memory(transactions, events, state, strategy="serial")
    if abort_ratio:
        assert reference.aborted, "the batch should abort some transactions"
    for strategy in STRATEGIES:
        result = batch.run_in_memory(transactions, events, state, strategy=strategy)
        assert _summary(result) == _summary(reference), f"{strategy} differs from the serial reference"


def test_the_ledger_batches_exercise_dependent_aborts_and_revocations():
    """The differential test is only as good as its batches: check that they reach the hard
    paths (readers redone after a rollback, aborts withdrawn when their input changed)."""
    rollbacks = revoked = 0
    for variant in range(3):
        transactions, events, state = _batch("sl", 0.8, 0.5, variant)
        for strategy in ("ns/f/l", "bfs/f/l", "dfs/c/e"):
            statistics = batch.run_in_memory(transactions, events, state, strategy=strategy).statistics
            rollbacks += statistics.rollbacks
            revoked += statistics.revoked
    assert rollbacks > 0 and revoked > 0


@pytest.mark.parametrize("strategy", ["serial", *STRATEGIES])
def test_a_function_that_changes_its_argument_in_place_changes_nothing_it_did_not_return(strategy):
    """Every operation's function gets copies of its images: a write function that changes its row in place in a
    transaction that then aborts, a check and a read-dependent write that change theirs, leave the states — and the
    images the caller gave — as the returned values say.  Before, the aborted transaction's change stayed in the
    state (the next transaction saw 90, not 100) and the caller's images were changed."""
    transactions = batch.StateTransactions("in_place")

    @transactions.on("pay")
    def pay(event, ops):
        def debit(own):
            own["balance"] -= event.payload["amount"]
            return {"balance": own["balance"]}

        ops.write("accounts", event.key, debit)
        ops.abort_if(lambda other: other.update(balance=-5), reads=[("accounts", "other")], reason="never")
        if event.payload.get("refuse"):
            def refuse(own):
                raise batch.Abort("refused")

            ops.write("accounts", "other", refuse)

    @transactions.on("note")
    def note(event, ops):
        ops.write("accounts", event.key, lambda own, other: other.update(balance=0) or {"note": str(other["balance"])},
                  reads=[("accounts", "other")])

    state = {("accounts", "a"): {"balance": 100, "note": ""}, ("accounts", "other"): {"balance": 7, "note": ""}}
    given_state = {name: dict(image) for name, image in state.items()}
    events = [{"type": "pay", "key": "a", "payload": {"amount": 10, "refuse": True}},
              {"type": "pay", "key": "a", "payload": {"amount": 1}},
              {"type": "note", "key": "a", "payload": {}}]
    result = batch.run_in_memory(transactions, events, given_state, strategy=strategy)
    assert [outcome.committed for outcome in result.transactions] == [False, True, True]
    assert result.final == {("accounts", "a"): {"balance": 99, "note": "0"}}
    assert given_state == state


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("resolves_to", [3, 2], ids=["another row", "its own row (it aborts)"])
def test_an_unbounded_operation_after_a_non_deterministic_write_depends_on_that_write_s_transaction(
        strategy, resolves_to):
    """Transaction 1 writes row 2 and then, by an unbounded write_any, row ``resolves_to``; transaction 2 reads any
    row (row 2).  Its read must see transaction 1's row 2 when that transaction commits, and row 2 as before it when it
    aborts (its write_any resolved to row 2, which it also writes).  Before, the TPG gave the read no edge from
    transaction 1's write of row 2: the write_any reset the table's writes since the last ND write after its own
    transaction had added to them, so the read depended on the write_any alone — DFS ran it before the write of row
    2 (it read 1, the row as transaction 0 left it), and l-abort left the aborted transaction's row 2 in its read
    (an abort rolls back the children of the writes it undoes)."""
    transactions = batch.StateTransactions("nd_barrier")

    @transactions.on("first")
    def first(event, ops):
        ops.write("t", 2, lambda own: {"v": 1})

    @transactions.on("both")
    def both(event, ops):
        ops.write("t", 2, lambda own: {"v": 2})
        ops.write_any("t", lambda: resolves_to, lambda own: {"v": 3})

    @transactions.on("any")
    def any_row(event, ops):
        ops.read_any("t", lambda: 2, name="seen")

    events = [{"type": "first", "ts": 0.0}, {"type": "both", "ts": 1.0}, {"type": "any", "ts": 2.0}]
    reference = batch.run_in_memory(transactions, events, {}, strategy="serial")
    assert reference.transactions[2].outputs == {"seen": {"v": 2 if resolves_to == 3 else 1}}
    result = batch.run_in_memory(transactions, events, {}, strategy=strategy)
    assert _summary(result) == _summary(reference)


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("later", ["write", "read", "reads="])
def test_an_operation_on_a_row_its_non_deterministic_writer_s_transaction_also_wrote_depends_on_that_write(
        strategy, later):
    """Transaction 1 writes row 2 and an unbounded write_any resolving to row 2 as well, so it aborts (WRITTEN_TWICE);
    a later transaction adds to row 2 (a write, a read, or a write of another row that reads row 2).  It must see row 2
    as before transaction 1 (absent).  Before, the TPG linked it to transaction 1's write of row 2 only, not to the
    write_any (an ND write was skipped when the row's last accessor was its own transaction: ``nd.t > track[0]``):
    when exploration ran the write_any first, the plain write of row 2 failed and the write_any's version stayed
    read — the abort's rollback of the write_any did not redo an operation that was not its child."""
    transactions = batch.StateTransactions("nd_same_transaction")

    @transactions.on("both")
    def both(event, ops):
        ops.write("t", 2, lambda own: {"v": 2})
        ops.write_any("t", lambda: 2, lambda own: {"v": 3})

    @transactions.on("after")
    def after(event, ops):
        if later == "write":
            ops.write("t", 2, lambda own: {"v": (own or {"v": 0})["v"] + 2})
        elif later == "read":
            ops.read("t", 2, name="seen")
        else:
            ops.write("u", 1, lambda own, row: {"v": (row or {"v": 0})["v"] + 2}, reads=[("t", 2)])

    @transactions.on("first")
    def first(event, ops):
        ops.write("t", 1, lambda own: {"v": 9})

    events = [{"type": "first", "ts": 0.0}, {"type": "both", "ts": 1.0}, {"type": "after", "ts": 4.0}]
    reference = batch.run_in_memory(transactions, events, {}, strategy="serial")
    assert [outcome.committed for outcome in reference.transactions] == [True, False, True]
    result = batch.run_in_memory(transactions, events, {}, strategy=strategy)
    assert _summary(result) == _summary(reference)


@pytest.mark.parametrize("strategy", ["serial", *STRATEGIES])
def test_a_function_that_appends_to_a_list_in_its_argument_changes_nothing_it_did_not_return(strategy):
    """The copies a function gets reach into its images' lists and dicts (a JSON or ARRAY column's): a write function
    that appends to its row's list in a transaction that then aborts, and a check that appends to the row it reads,
    leave the states — and the caller's images — as the returned values say.  Before, the copies were shallow: the
    aborted transaction's append stayed in the state (the next transaction appended to ['x', 'pay'])."""
    transactions = batch.StateTransactions("in_place_lists")

    @transactions.on("pay")
    def pay(event, ops):
        def tag(own):
            own["tags"].append("pay")
            return {"tags": own["tags"]}

        ops.write("accounts", event.key, tag)
        ops.abort_if(lambda other: other["tags"].append("checked"), reads=[("accounts", "other")], reason="never")
        if event.payload.get("refuse"):
            def refuse(own):
                raise batch.Abort("refused")

            ops.write("accounts", "other", refuse)

    state = {("accounts", "a"): {"tags": ["x"]}, ("accounts", "other"): {"tags": []}}
    given_state = {name: {"tags": list(image["tags"])} for name, image in state.items()}
    events = [{"type": "pay", "key": "a", "payload": {"refuse": True}},
              {"type": "pay", "key": "a", "payload": {}}]
    result = batch.run_in_memory(transactions, events, given_state, strategy=strategy)
    assert [outcome.committed for outcome in result.transactions] == [False, True]
    assert result.final == {("accounts", "a"): {"tags": ["x", "pay"]}}
    assert given_state == state
