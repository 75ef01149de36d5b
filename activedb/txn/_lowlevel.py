"""A transaction's extender tier, as functions of the transaction (re-exported by :mod:`activedb.lowlevel`).

An application uses ``Transaction``'s methods (``read``, ``write``, ``spawn``, …); a package that extends
activedb (a rule engine, a commit participant, an ingestion handler) uses these.  ``slot``, ``set_slot``,
``doom``, ``materialize`` and ``run_subtransaction`` *are* the methods they name (the same function objects: no
call is added on a hot path; no subclass overrides them); the others call the transaction's method, which a
group's member frame overrides (``_group.GuardedFrame`` brackets them with the group's guard).
"""

from __future__ import annotations

from activedb.txn._participants import CommitParticipant
from activedb.txn._tree import Transaction

#: ``slot(tx, kind, *, create=True)``: the transaction's object of type ``kind`` (a package's per-transaction state).
slot = Transaction.slot
#: ``set_slot(tx, kind, value)``: make ``value`` the transaction's object of type ``kind``.
set_slot = Transaction.set_slot
#: ``doom(tx, reason)``: mark the transaction and its active descendants for abort.
doom = Transaction.doom
#: ``materialize(tx)``: give a lazy inline subtransaction its own lock-manager transaction now.
materialize = Transaction.materialize
#: ``run_subtransaction(tx, function, *args, name=None, **kwargs)``: ``function(child, ...)`` inline, its result.
run_subtransaction = Transaction.run_subtransaction


def enlist(transaction: Transaction, participant: CommitParticipant) -> None:
    """Make ``participant`` take part in the top-level commit of ``transaction``'s tree (see ``CommitParticipant``;
    ``Transaction.enlist``)."""
    transaction.enlist(participant)


def want_end_hooks(transaction: Transaction) -> None:
    """Make the extensions that skip frames hear ``transaction``'s end (``Transaction.want_end_hooks``)."""
    transaction.want_end_hooks()


def wait_children(transaction: Transaction, timeout: float | None = None) -> None:
    """Wait until every child of ``transaction`` has ended, running queued ones in this thread."""
    transaction.wait_children(timeout)


def read_then_written(transaction: Transaction) -> frozenset[str]:
    """The tables of which ``transaction``'s tree read a row plainly and then wrote it (``Database.run``'s
    hot-key learning)."""
    return transaction.read_then_written()


__all__ = ["slot", "set_slot", "enlist", "doom", "want_end_hooks", "materialize", "wait_children",
           "run_subtransaction", "read_then_written"]
