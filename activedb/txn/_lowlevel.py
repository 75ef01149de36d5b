"""A transaction's extender tier, as functions of the transaction (re-exported by :mod:`activedb.lowlevel`).

An application uses ``Transaction``'s methods (``read``, ``write``, ``spawn``, …); a package that extends
activedb (a rule engine, a commit participant, an ingestion handler) uses these, and only these: the methods
behind them are private.  ``slot``, ``set_slot``, ``doom``, ``materialize`` and ``run_subtransaction`` *are* the
methods they name (the same function objects: no call is added on a hot path; no subclass overrides them); the
others call the transaction's method, which a group's member frame overrides (``_group.GuardedFrame`` brackets
them with the group's guard).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import lockmgr
from lockmgr import TxnState

from activedb.errors import causes
from activedb.txn import _ids
from activedb.txn._children import _wait_seconds
from activedb.txn._flush import OutcomeUnknown
from activedb.txn._tree import Transaction

if TYPE_CHECKING:  # pragma: no cover
    from activedb.txn._participants import CommitParticipant

#: ``slot(tx, kind, *, create=True)``: ``tx``'s object of type ``kind``, one per type, created with ``kind()`` on
#: first use (``create=False``: None if there is none).  A package keeps its per-transaction state here, in a type
#: it owns (the rule manager's ``RuleContext``), instead of attributes on the transaction.
slot = Transaction._slot
#: ``set_slot(tx, kind, value)``: make ``value`` ``tx``'s object of type ``kind``, in place of any.
set_slot = Transaction._set_slot
#: ``doom(tx, reason)``: mark ``tx`` and its active descendants for abort (they raise at their next operation).
doom = Transaction._doom
#: ``materialize(tx)``: give a lazy inline subtransaction its own lock-manager transaction now (txn README, "Lazy
#: inline subtransactions"); a no-op for any other node.  Called by the thread running it.
materialize = Transaction._materialize
#: ``run_subtransaction(tx, function, *args, name=None, **kwargs)``: ``function(child, *args, **kwargs)`` as an
#: inline subtransaction; its result (the child commits), or its error re-raised (the child aborts).
run_subtransaction = Transaction._run_subtransaction


def enlist(transaction: Transaction, participant: CommitParticipant) -> None:
    """Make ``participant`` take part in the top-level commit of ``transaction``'s tree (see ``CommitParticipant``).
    Enlisted in a subtransaction, it moves to the parent when that commits and is dropped (its ``aborted`` called)
    if it aborts.  Allowed while the transaction is active or waiting for its children to commit."""
    transaction._enlist(participant)


def want_end_hooks(transaction: Transaction) -> None:
    """Make the extensions that skip frames (``TransactionExtension.frame_hooks = False``) hear ``transaction``'s
    end — ``before_commit`` and ``after_end`` — even while it is a frame (txn README, "Frames"); a no-op for a node
    (they hear every node's).  Called by the thread running it, before its commit: an extension that keeps work for
    its ``before_commit`` (the rule manager's deferred queue) asks for it so instead of materializing the frame."""
    transaction._want_end_hooks()


def wait_children(transaction: Transaction, timeout: float | None = None) -> None:
    """Wait until every child of ``transaction`` has ended, running queued ones in this thread; ``timeout``: seconds
    (None or infinity: without limit), then ``TimeoutError``."""
    transaction._wait_children(_wait_seconds("lowlevel.wait_children", timeout))


def abandon(transaction: Transaction, reason: BaseException) -> None:
    """For a tree whose thread may never return (an ingestion's or a detached rule's deadline: Python cannot stop a
    thread), from another thread: doom ``transaction``'s whole tree, so that it never commits and its thread raises
    ``reason`` at its next operation, and end what it holds now — the transaction of its reads for update is rolled
    back (a statement running on it cancelled, its connection closed), so other processes get its rows' locks; and,
    if the tree had not begun to commit (its root still active), its lock-manager transaction is aborted, so other
    trees of this process get its locks (a lock request of its thread waiting then fails; its later ones raise
    ``reason``).  A tree that was committing keeps its lock-manager locks until its thread ends it: its flush may be
    under way, and what it writes must stay isolated until PostgreSQL has it.  Nothing waits for the tree's threads
    (txn README, "Abandoning a tree")."""
    from activedb.txn._rowlocks import RowLocks

    root = transaction.root
    root._doom(reason)
    session = RowLocks.of(root, create=False)
    if session is not None:
        session.abandon()
    # Doomed first, then seen active under the root's mutex: its commit, which leaves ACTIVE under that mutex, then
    # finds the doom before its flush (``Transaction._commit_after_hooks``) and aborts — it never flushes.
    with root._mutex:
        before_its_commit = root._state is TxnState.ACTIVE
    if before_its_commit:
        root.manager.locking.abort(root)


def outcome_unknown(transaction: Transaction) -> bool:
    """Whether ``transaction`` is a top-level transaction whose abort is not known to be one: its flush lost the
    connection and its ``activedb_transaction_log`` row could not be read either (its commit raised
    ``DatabaseUnavailable`` with ``unknown_outcome``), so it ended ABORTED in memory although PostgreSQL may have
    committed it — that row (``transaction.log_id``) says which, once the server answers.  What hears the abort (a
    participant's ``aborted``, an extension's ``after_end(tx, False)``) must not act on it as an outcome then: the
    outbox settles the tree's detached-family firings, those on its ``aborted`` event included, by that row (outbox
    README, "The outcome is unknown").  False for any other transaction; changes nothing."""
    return transaction._slot(OutcomeUnknown, create=False) is not None


def read_then_written(transaction: Transaction) -> frozenset[str]:
    """The tables of which ``transaction``'s tree read a row plainly (``tx.read`` without ``for_update``) and then
    wrote it: where two such trees convert their read locks to write locks and one must give way.  ``Database.run``
    learns them from an attempt that failed (docs/howto/hot-keys.md; txn README, "Reads for update")."""
    return transaction._read_then_written()


def deadlock_with_another_tree(transaction: Transaction, error: BaseException) -> bool:
    """Whether ``error`` is, or was caused by, a lock-manager deadlock (``DeadlockDetected``) whose wait-for cycle
    holds a transaction of another tree than ``transaction``'s: running the victim's work again inside this tree may
    meet it again — the tree keeps the locks of its committed subtransactions, which the other waits for —, where
    aborting the whole tree lets the other go on.  False for a deadlock within the tree, or any other error."""
    root = transaction.root.id
    deadlock = next((cause for cause in causes(error) if isinstance(cause, lockmgr.Deadlock)), None)
    return deadlock is not None and any(not _ids.in_tree(tid, root) for edge in deadlock.cycle
                                        for tid in (edge.waiter, edge.target))


__all__ = ["slot", "set_slot", "enlist", "doom", "abandon", "want_end_hooks", "materialize", "wait_children",
           "run_subtransaction", "read_then_written", "outcome_unknown", "deadlock_with_another_tree"]
