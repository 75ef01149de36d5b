"""Commit participants: how other packages take part in a top-level commit without editing it (modelled on
PostgreSQL's transaction callbacks).  The order of the calls, delegation to the parent and retries:
``README.md``, "Seams".
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    import sqlalchemy as sa

    from activedb.txn._tree import Transaction


@dataclass(frozen=True)
class Along:
    """A statement a participant writes without reading its result, sent in the flush's last round trip (before the
    write set's last statement, the transaction-log row and the ``COMMIT``) instead of one of its own:
    :meth:`CommitParticipant.statements_along`.  Immutable.

    ``sql`` is driver SQL with ``%s`` or ``%(name)s`` parameters, ``parameters`` their values.  PostgreSQL runs
    nothing of the transaction after a statement that fails, so nothing is committed; ``refused(error)`` (the
    ``sqlalchemy.exc.DBAPIError`` the flush got) returns the exception the flush raises instead when the failure
    is this statement's (e.g. a unique violation that means "done already"), or None."""

    sql: str
    parameters: tuple[object, ...] | dict[str, object] = ()
    refused: Callable[[BaseException], BaseException | None] | None = None


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

    def statements_along(self, transaction: "Transaction") -> Sequence[Along]:
        """Statements to send with the flush's last round trip (:class:`Along`); asked after ``write`` and
        ``acts_before_commit``, once per flush attempt.  They run after every participant's ``write`` and before
        the tree's write set is complete: a participant whose ``write`` or ``about_to_commit`` reads what another
        writes cannot rely on rows sent this way.  Default: none."""
        return ()

    def committed(self, transaction: "Transaction") -> None:
        """After PostgreSQL committed (the top-level transaction's locks are still held)."""

    def aborted(self, transaction: "Transaction", error: BaseException | None) -> None:
        """The node the participant was enlisted in (or an ancestor, or the flush) aborted."""
