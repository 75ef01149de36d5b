"""Commit participants: how other packages take part in a top-level commit without editing it (modelled on
PostgreSQL's transaction callbacks).  The order of the calls, delegation to the parent and retries:
``README.md``, "Seams".
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    import sqlalchemy as sa

    from activedb.txn._tree import Transaction


class CommitParticipant:
    """Takes part in the top-level commit of the transaction it is enlisted in.  Every method is a
    no-op by default; override what you need.  ``committed`` and ``aborted`` must not raise."""

    def before_flush(self, transaction: "Transaction") -> None:
        """Before the PostgreSQL transaction opens (the tree has ended: no more operations)."""

    def write(self, transaction: "Transaction", connection: "sa.Connection") -> None:
        """Inside the PostgreSQL transaction, before the write set is applied."""

    def about_to_commit(self, transaction: "Transaction", connection: "sa.Connection") -> None:
        """Inside the PostgreSQL transaction, after everything was written, just before COMMIT."""

    def acts_before_commit(self, transaction: "Transaction") -> bool:
        """Whether ``about_to_commit`` has anything to do in this flush; asked after ``write``.  When no participant
        has, ``about_to_commit`` is not called and the COMMIT rides in the round trip of the flush's last statement.
        Default: whether the class overrides ``about_to_commit``; a participant that acts only sometimes says when."""
        return type(self).about_to_commit is not CommitParticipant.about_to_commit

    def committed(self, transaction: "Transaction") -> None:
        """After PostgreSQL committed (the top-level transaction's locks are still held)."""

    def aborted(self, transaction: "Transaction", error: BaseException | None) -> None:
        """The node the participant was enlisted in (or an ancestor, or the flush) aborted."""
