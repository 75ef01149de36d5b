"""Commit participants: how other packages take part in a top-level commit without editing it.

Modelled on PostgreSQL's transaction callbacks and resource owners: the commit is a sequence of
participants behind one interface.  Any node enlists one with ``tx.enlist(participant)``; a committing
child hands its participants to its parent with its writes (delegation), an aborting node drops them and
calls their :meth:`CommitParticipant.aborted`.  At the top-level commit:

1. ``before_flush(tx)`` for every participant, in enlistment order, before the PostgreSQL transaction
   opens (compute, validate; raise to abort the whole transaction — nothing is written);
2. one PostgreSQL transaction: the core validates every committed image the tree relied on, then calls
   ``write(tx, connection)`` of every participant in enlistment order, then applies the merged write set
   and writes the transaction log, then ``about_to_commit(tx, connection)`` of every participant (the
   last point at which everything is written and nothing committed), then COMMIT;
3. ``committed(tx)`` for every participant after PostgreSQL committed — or ``aborted(tx, error)`` if the
   transaction aborted at any point (including a failed flush).

If PostgreSQL reports a serialization failure the database transaction is retried: ``write`` and
``about_to_commit`` may then run again on a fresh connection (everything they wrote before was rolled
back).  ``committed`` and ``aborted`` run once, after the outcome is known; they must not raise (an
exception there is logged, never undoes the outcome).

The core's own parts of the flush (validating reads, the write set, the log) are fixed steps, not
enlisted participants: they always run, in that order, around the enlisted ones.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    import sqlalchemy as sa

    from activedb.txn._tree import Transaction


class CommitParticipant:
    """Takes part in the top-level commit of the transaction it is enlisted in.  Every method is a
    no-op by default; override what you need.  See the module docstring for the order."""

    def before_flush(self, transaction: "Transaction") -> None:
        """Before the PostgreSQL transaction opens (the tree has ended: no more operations)."""

    def write(self, transaction: "Transaction", connection: "sa.Connection") -> None:
        """Inside the PostgreSQL transaction, before the write set is applied."""

    def about_to_commit(self, transaction: "Transaction", connection: "sa.Connection") -> None:
        """Inside the PostgreSQL transaction, after everything was written, just before COMMIT."""

    def committed(self, transaction: "Transaction") -> None:
        """After PostgreSQL committed (the top-level transaction's locks are still held)."""

    def aborted(self, transaction: "Transaction", error: BaseException | None) -> None:
        """The node the participant was enlisted in (or an ancestor, or the flush) aborted."""
