"""Batches of declared state transactions on a task precedence graph (MorphStream).

Public interface: :class:`StateTransactions` (an explicit object; ``@transactions.on(type)`` declares an
event type's operations on ``ops``); ``apply_at_commit(tx, events, transactions)`` → :class:`PendingBatch`
(runs inside the commit on rows locked ``FOR UPDATE``; ``.result`` once committed); ``apply_batch(tx,
events, transactions)`` → :class:`BatchResult` (through the transaction tree: rules observing the written
tables fire); ``run_batch(db, events, transactions)`` (its own transaction); ``run_in_memory(transactions,
events, state)`` (no database); ``decide(transactions, events)`` (the decision model's pick for a batch, and
why, without running it); ``render_tpg`` / ``tpg_graph`` (the picture of a small batch); ``@batch.declared`` (a rule whose action is
a declared state transaction), ``lower(db.rules, tx, event_types)`` and ``apply_lowered(db.rules, tx, events,
lowered)`` (a micro-batch of its events as one batch, the firing record kept: the ingestion core's rule path
reaches them through ``DeclaredAction.batch_lowering``, and ``Database.rule_lowering`` — ``RULE_LOWERING`` — for plain
rules whose action only reads and writes its event's row: "Plain rules lowered"; ``why_not_lowered(db, type)``
says why a type's batches are fired event by event instead; ``why_not_in_commit(db, rule)`` why a detached rule's
firings are recorded rather than run in such a batch's commit); :class:`TpgHandler` (batches of any ingestion connector
as batches of state transactions: ``handler=TpgHandler(transactions)``).

Strategies: ``"auto"`` (the decision model: the lean serial executor in one process, components
over processes when they pay), ``"lean"``, ``"serial"`` (the reference meaning), ``"tpg"`` (the
decision model's pick among the TPG strategies, on the graph just built), or
``"bfs|dfs|ns / f|c / e|l"`` (see :mod:`activedb.batch._strategy`).  The design note, with examples, is
``activedb/batch/README.md``.
"""

from activedb.batch._declare import DELETE, Abort, BatchEvent, Inserted, InsertedInto, OpKind, Ops, StateTransactions
from activedb.batch._decide import Decision, DecisionModel, morphstream_name
from activedb.batch._plan import EdgeKind, OpState
from activedb.batch._result import BatchResult, BatchStatistics, TransactionResult
from activedb.batch._runtime import decide, normalise_events, run_in_memory
from activedb.batch._store import apply_batch, dead_letter_row, run_batch
from activedb.batch._commit import PendingBatch, PendingState, apply_at_commit
from activedb.batch._ingest import TpgHandler
from activedb.batch._aftermath import why_not_in_commit
from activedb.batch._rules import (RULE_LOWERING, DeclaredAction, Lowered, apply_lowered, declared, lower,
                                  why_not_lowered)
from activedb.batch._strategy import (AbortMode, DecisionRule, Exploration, Granularity, Split, Strategy, all_strategies,
                                      parse_strategy)
from activedb.batch._picture import render_tpg, tpg_graph
from activedb.batch import errors

__all__ = ["RULE_LOWERING", "Abort", "AbortMode", "DecisionRule", "Split", "all_strategies", "apply_at_commit", "apply_batch", "apply_lowered", "BatchEvent",
           "BatchResult", "BatchStatistics", "dead_letter_row", "decide", "Decision", "DecisionModel", "declared",
           "DeclaredAction", "morphstream_name",
           "DELETE", "EdgeKind", "lower", "Lowered", "why_not_in_commit", "why_not_lowered",
           "errors", "Exploration", "Granularity", "Inserted", "InsertedInto", "normalise_events", "OpKind", "Ops",
           "OpState",
           "parse_strategy", "PendingBatch", "PendingState", "render_tpg", "run_batch", "run_in_memory",
           "StateTransactions", "Strategy", "TpgHandler", "tpg_graph", "TransactionResult"]
