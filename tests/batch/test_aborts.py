"""Aborts: an abort found by one operation rolls back exactly its transaction under eager and
lazy abort — including the versions later operations had already read, which are redone —
and an abort that depended on a rolled-back version is withdrawn."""

from __future__ import annotations

import pytest

from activedb import batch
from activedb.batch._execute import TpgExecutor
from activedb.batch._plan import OpState, build_tpg
from activedb.batch._runtime import prepare
from activedb.versions import Versions


def _transactions() -> batch.StateTransactions:
    transactions = batch.StateTransactions("aborts")

    @transactions.on("add")
    def add(event, ops):
        for key, amount in event.payload["adds"]:
            ops.write("t", key, lambda own, amount=amount: {"v": (own["v"] if own else 0) + amount})
        if event.payload.get("fail_on"):
            def refuse(own):
                raise batch.Abort("refused")

            ops.write("t", event.payload["fail_on"], refuse)

    @transactions.on("copy")
    def copy(event, ops):
        source, target = event.payload["source"], event.payload["target"]
        ops.write("t", target, lambda own, row: {"v": row["v"] if row else None}, reads=[("t", source)])

    @transactions.on("take")
    def take(event, ops):
        amount = event.payload["amount"]

        def debit(own):
            if own["v"] < amount:
                raise batch.Abort("would go negative")
            return {"v": own["v"] - amount}

        ops.write("t", event.key, debit)

    return transactions


def _run(events, state, strategy):
    prepared = prepare(_transactions(), events)
    tpg = build_tpg(prepared.txns, prepared.specs)
    table = Versions(state, times=prepared.times)
    executor = TpgExecutor(tpg, batch.parse_strategy(strategy), table)
    statistics = executor.run()
    return tpg, table, statistics, executor.outcomes(prepared.specs)


# txn 0 writes A, then fails on F: its A version is read by txn 1 (copy A → C) and txn 2 (A += 1)
# before the failure is known under dfs (depth first) and under any lazy strategy.
EVENTS = [{"type": "add", "payload": {"adds": [("A", 5)], "fail_on": "F"}},
          {"type": "copy", "payload": {"source": "A", "target": "C"}},
          {"type": "add", "payload": {"adds": [("A", 1)]}},
          {"type": "add", "payload": {"adds": [("B", 7)]}}]
STATE = {("t", "A"): {"v": 10}, ("t", "F"): {"v": 0}}


@pytest.mark.parametrize("strategy", ["dfs/f/e", "dfs/c/e", "ns/f/l", "bfs/f/l", "ns/c/l", "bfs/f/e"])
def test_abort_rolls_back_exactly_its_transaction(strategy):
    tpg, table, statistics, outcomes = _run(EVENTS, STATE, strategy)
    ts, aborted, _ = outcomes
    assert [t not in aborted for t in ts] == [False, True, True, True]
    assert aborted[ts[0]] == "refused"
    # Exactly txn 0's versions are gone; the readers were redone on the version before it.
    assert table.final() == {("t", "A"): {"v": 11}, ("t", "C"): {"v": 10}, ("t", "B"): {"v": 7}}
    assert table.read(("t", "A"), 2) == {"v": 10}
    assert [op.state for op in tpg.txns[0].ops] == [OpState.ABT, OpState.ABT]
    assert all(op.state is OpState.EXE for txn in tpg.txns[1:] for op in txn.ops)
    readers = [tpg.txns[1].ops[0], tpg.txns[2].ops[0]]
    if strategy.startswith("bfs") and strategy.endswith("/e"):
        # Layered: the failure is handled at the barrier of stratum 0, before any reader ran.
        assert [op.executions for op in readers] == [1, 1]
    else:
        assert [op.executions for op in readers] == [2, 2], "the readers of the removed version were redone"
        assert statistics.rollbacks >= 3
    # The unrelated transaction ran once.
    assert tpg.txns[3].ops[0].executions == 1


@pytest.mark.parametrize("strategy", [strategy.name for strategy in batch.all_strategies()])
def test_abort_that_read_an_aborted_version_is_withdrawn(strategy):
    """txn 1 takes 8 of 10 and fails on a second operation that waits for txn 0; txn 2 takes 5:
    run early it sees 2 and fails, but serially it sees 10 and commits (the executor must
    withdraw its abort when txn 1's version goes)."""
    transactions = _transactions()

    @transactions.on("take_then_fail")
    def take_then_fail(event, ops):
        ops.write("t", "X", lambda own: {"v": own["v"] - 8})
        ops.write("t", "G", lambda own, x: (_ for _ in ()).throw(batch.Abort("late failure")), reads=[("t", "Y")])

    @transactions.on("slow")
    def slow(event, ops):
        ops.write("t", "Y", lambda own: {"v": 1})

    events = [{"type": "slow"}, {"type": "take_then_fail"}, {"type": "take", "key": "X", "payload": {"amount": 5}}]
    reference = batch.run_in_memory(transactions, events, {("t", "X"): {"v": 10}}, strategy="serial")
    result = batch.run_in_memory(transactions, events, {("t", "X"): {"v": 10}}, strategy=strategy)
    assert [outcome.committed for outcome in reference.transactions] == [True, False, True]
    assert [(outcome.committed, outcome.reason) for outcome in result.transactions] == [
        (outcome.committed, outcome.reason) for outcome in reference.transactions]
    assert result.final[("t", "X")] == {"v": 5}


@pytest.mark.parametrize("strategy", ["auto", "lean", "serial"])
def test_a_non_deterministic_write_that_resolves_to_a_row_its_transaction_writes_aborts_that_transaction(strategy):
    """A transaction writes a row at most once; a non-deterministic write whose key resolves at run time to a row the
    transaction also writes breaks that rule where the declaration could not see it: that transaction aborts with
    the reason (a dead letter), the rest of the batch goes on.  Before, the whole batch raised — the lean run an
    ExecutionInvariantBroken ("a bug: please report it"), the serial reference a VersionInvariantBroken."""
    transactions = batch.StateTransactions()

    @transactions.on("e")
    def both(event, ops):
        ops.write("t", event.key, lambda own: {"v": 1})
        ops.write_any("t", lambda: event.payload["to"], lambda own: {"w": 2})

    events = [{"type": "e", "key": "a", "ts": 0, "payload": {"to": "a"}},
              {"type": "e", "key": "b", "ts": 1, "payload": {"to": "c"}}]
    result = batch.run_in_memory(transactions, events, {}, strategy=strategy)
    assert [(event.key, "resolved to a row its transaction also writes" in reason)
            for event, reason in result.dead_letters] == [
        ("a", True)]
    assert result.final == {("t", "b"): {"v": 1}, ("t", "c"): {"w": 2}}


@pytest.mark.parametrize("strategy", ["tpg"] + [strategy.name for strategy in batch.all_strategies()])
def test_under_every_tpg_strategy_a_write_resolved_to_a_row_its_transaction_writes_aborts_that_transaction(strategy):
    """The same under the TPG strategies, as the serial reference has it: that transaction alone aborts with the
    reason, its other write is rolled back (a later transaction reads the row as of before it) and the rest of the
    batch goes on.  Before, the whole batch raised ``VersionInvariantBroken`` ('already has a version at stamp …')."""
    transactions = batch.StateTransactions()

    @transactions.on("e")
    def both(event, ops):
        ops.write("t", event.key, lambda own: {"v": (own["v"] if own else 0) + 1})
        ops.write_any("t", lambda: event.payload["to"], lambda own: {"w": 2})

    events = [{"type": "e", "key": "a", "ts": 0, "payload": {"to": "a"}},
              {"type": "e", "key": "b", "ts": 1, "payload": {"to": "c"}},
              {"type": "e", "key": "a", "ts": 2, "payload": {"to": "d"}}]
    reference = batch.run_in_memory(transactions, events, {}, strategy="serial")
    result = batch.run_in_memory(transactions, events, {}, strategy=strategy)
    assert [(event.key, "resolved to a row its transaction also writes" in reason)
            for event, reason in result.dead_letters] == [("a", True)]
    assert [(outcome.committed, outcome.reason) for outcome in result.transactions] == [
        (outcome.committed, outcome.reason) for outcome in reference.transactions]
    assert result.final == reference.final == {("t", "a"): {"v": 1}, ("t", "b"): {"v": 1}, ("t", "c"): {"w": 2},
                                               ("t", "d"): {"w": 2}}
