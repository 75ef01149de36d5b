"""Batches of declared state transactions on a task precedence graph (MorphStream).

Public interface::

    from activedb import batch

    transactions = batch.StateTransactions()          # an explicit object, no global registry

    @transactions.on("deposit")
    def deposit(event, ops):
        ops.write("accounts", event.key, lambda own: {"balance": (own or {"balance": 0})["balance"]
                                                      + event.payload["amount"]})

    with db.transaction() as tx:                                  # the caller owns the transaction
        pending = batch.apply_at_commit(tx, events, transactions) # runs inside the commit (rows locked
        tx.enlist(ledger)                                         # FOR UPDATE); dead letters stored
    pending.result                                                # -> BatchResult, once committed

    with db.transaction(participants=[...]) as tx:                # or through the transaction tree
        result = batch.apply_batch(tx, events, transactions)      # -> BatchResult (rules observing the
        ...                                                       # written tables fire)

    batch.run_batch(db, events, transactions)                     # convenience: its own transaction
    batch.run_in_memory(transactions, events, state)              # no database (tests, benchmarks)
    batch.render_tpg(transactions, events, "tpg.png")             # the picture of a small batch

Strategies: ``"auto"`` (the decision model: the lean serial executor in one process, components
over processes when they pay), ``"lean"``, ``"serial"`` (the reference meaning), ``"tpg"`` (the
decision model's pick among the TPG strategies, on the graph just built), or
``"bfs|dfs|ns / f|c / e|l"`` (see :mod:`activedb.batch._strategy`).  The design note is
``activedb/batch/README.md``.
"""

from activedb.batch._declare import DELETE, Abort, BatchEvent, OpKind, Ops, StateTransactions
from activedb.batch._decide import DecisionModel
from activedb.batch._plan import EdgeKind, OpState
from activedb.batch._result import BatchResult, BatchStatistics, TransactionResult
from activedb.batch._runtime import normalise_events, run_in_memory
from activedb.batch._store import apply_batch, dead_letter_row, run_batch
from activedb.batch._commit import PendingBatch, PendingState, apply_at_commit
from activedb.batch._strategy import AbortMode, Exploration, Granularity, Strategy, all_strategies, parse_strategy
from activedb.batch._picture import render_tpg, tpg_graph
from activedb.batch import errors

__all__ = ["Abort", "AbortMode", "all_strategies", "apply_at_commit", "apply_batch", "BatchEvent",
           "BatchResult", "BatchStatistics", "dead_letter_row", "DecisionModel", "DELETE", "EdgeKind",
           "errors", "Exploration", "Granularity", "normalise_events", "OpKind", "Ops", "OpState",
           "parse_strategy", "PendingBatch", "PendingState", "render_tpg", "run_batch", "run_in_memory",
           "StateTransactions", "Strategy", "tpg_graph", "TransactionResult"]
