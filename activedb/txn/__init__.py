"""Parallel nested transactions over the shared store.  Design note: ``README.md`` in this package.

Public names: :class:`TransactionManager`, :class:`Transaction`, :class:`SubtransactionHandle`,
:class:`TransactionBlock` (what ``db.transaction()`` returns), :class:`TxnState`, :class:`Granularity`, :class:`Subtransactions`, :func:`run_inline`, :func:`run_group`, :func:`stack_is_deep`, and the seams :class:`CommitParticipant`
(with :class:`Along`), :class:`TransactionExtension`, :class:`Observer`, :class:`ReadBase`; a transaction's extender
tier as functions (``_lowlevel.py``: :func:`slot`, :func:`enlist`, …), which :mod:`activedb.lowlevel` re-exports.
"""

from lockmgr import TxnState

from activedb.txn._history import HistoryOp, HistoryRecorder
from activedb.txn._hooks import (FiringOutcome, FiringView, HookRegistry, Observer, RuleView, TransactionExtension,
                                 WaitKind)
from activedb.store import Granularity
from activedb.txn._manager import TransactionManager
from activedb.txn._participants import Along, CommitParticipant
from activedb.txn._children import (InlineSubtransaction, SubtransactionHandle, Subtransactions, TransactionBlock,
                                    run_inline)
from activedb.txn._tree import Transaction
from activedb.txn._reads import BulkLock
from activedb.txn._group import run_group
from activedb.txn._pool import stack_is_deep
from activedb.txn._view import CommittedRows, ReadBase
from activedb.txn._lowlevel import (abandon, deadlock_with_another_tree, doom, enlist, materialize, outcome_unknown,
                                    read_then_written, run_subtransaction, set_slot, slot, wait_children,
                                    want_end_hooks)

__all__ = ["BulkLock", "FiringOutcome", "FiringView", "RuleView", "WaitKind", "TransactionManager", "Transaction", "SubtransactionHandle", "InlineSubtransaction", "TransactionBlock", "TxnState",
           "Granularity", "Along", "CommitParticipant", "TransactionExtension", "Observer", "HookRegistry", "ReadBase",
           "CommittedRows", "HistoryOp", "HistoryRecorder", "Subtransactions", "run_inline", "run_group", "stack_is_deep",
           "abandon", "deadlock_with_another_tree", "doom", "enlist", "materialize", "outcome_unknown", "read_then_written", "run_subtransaction", "set_slot", "slot", "wait_children",
           "want_end_hooks"]
