"""activedb.lowlevel — the extender tier (as ``trio.lowlevel`` is trio's).

An application needs ``activedb`` only: ``connect``, ``Database``, ``Transaction``'s methods (``read``,
``read_many``, ``prefetch``, ``scan``, ``write``, ``write_many``, ``insert``, ``delete``, ``signal``, ``emit``,
``spawn``, ``subtransaction``, ``retry``, ``commit``, ``abort``), the rule decorators and the errors.  A package
that *extends* activedb — a rule engine, a stream engine, an ingestion handler, a commit participant, a tool that
draws transactions — needs more, and finds it here, in one place and documented as such:

* a transaction's extender calls, as functions of the transaction: :func:`slot` / :func:`set_slot` (a package's
  per-transaction state, in a type it owns), :func:`enlist` (a :class:`CommitParticipant` in the top-level
  commit), :func:`doom` (mark a subtree for abort), :func:`abandon` (give up a tree whose thread may never return:
  doomed, its PostgreSQL row locks released now, and its lock-manager locks if it had not begun to commit), :func:`want_end_hooks` and :func:`materialize` (frames and
  lazy subtransactions, txn README "Frames"), :func:`wait_children`, :func:`run_subtransaction` and
  :func:`run_inline` (an inline child as one call), :func:`run_group` (siblings that may run concurrently),
  :func:`read_then_written` (hot-key learning), :func:`outcome_unknown` (an abort that may hide a commit: the
  connection broke at the flush and the transaction log could not be read), :func:`deadlock_with_another_tree` (a
  deadlock that re-running a subtransaction inside its tree may meet again: abort the tree);
* the seams: :class:`CommitParticipant` (with :class:`Along`), :class:`TransactionExtension`, :class:`Observer`,
  :class:`HookRegistry`, :class:`ReadBase` (with :class:`CommittedRows`), :class:`WaitKind`, and
  :class:`HistoryRecorder` (``db.history`` with ``connect(record_history=True)``: every operation as a
  :class:`HistoryOp`, told to its listeners in the thread that did it — the interleaving runner of
  ``activedb.testing`` pauses threads there);
* the machinery: :class:`TransactionManager` (``db.transactions``), :class:`Subtransactions` (how inline
  subtransactions are represented), :class:`InlineSubtransaction`, and :class:`DatabaseHandle`, the protocol
  a parameter that takes the database is typed with;
* the argument checks: :func:`check_whole_number`, :func:`check_switch` and :func:`check_seconds` (defined in
  ``activedb.errors``) raise :class:`~activedb.errors.BadArgument`, or the ``error=`` class a package raises for its
  own arguments (``CaptureError``), saying ``owner(name=value) takes …``: what to give.

These are stable in what their docstrings promise, but closer to the implementation than the application tier:
read the design note of ``activedb/txn`` (``README.md``, "Seams") before using them.
"""

from activedb._handle import DatabaseHandle
from activedb.errors import check_seconds, check_switch, check_whole_number
from activedb.txn import (Along, CommitParticipant, CommittedRows, HistoryOp, HistoryRecorder, HookRegistry,
                          InlineSubtransaction, Observer, ReadBase, Subtransactions, TransactionExtension,
                          TransactionManager, WaitKind, abandon, deadlock_with_another_tree, doom, enlist, materialize,
                          outcome_unknown,
                          read_then_written, run_group, run_inline, run_subtransaction, set_slot, slot, wait_children,
                          want_end_hooks)

__all__ = [
    # a transaction's extender calls
    "slot", "set_slot", "enlist", "doom", "abandon", "want_end_hooks", "materialize", "wait_children", "run_subtransaction",
    "run_inline", "run_group", "read_then_written", "outcome_unknown", "deadlock_with_another_tree",
    # seams
    "CommitParticipant", "Along", "TransactionExtension", "Observer", "HookRegistry", "ReadBase", "CommittedRows",
    "WaitKind", "HistoryRecorder", "HistoryOp",
    # machinery
    "TransactionManager", "Subtransactions", "InlineSubtransaction", "DatabaseHandle",
    # argument checks
    "check_whole_number", "check_switch", "check_seconds",
]
