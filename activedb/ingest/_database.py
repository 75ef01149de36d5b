""":class:`IngestDatabase`: the database as the ingestion core uses it — a
:class:`~activedb._handle.DatabaseHandle` with the two services of the layers above that a batch may ask for,
typed by what the core calls on them (``activedb.Database`` has both).  Design note: ``README.md`` in this
package."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from activedb._handle import DatabaseHandle
from activedb.ingest.errors import IngestError

if TYPE_CHECKING:  # pragma: no cover
    from activedb.ingest._rules import BatchLowering
    from activedb.txn import CommitParticipant, Transaction

__all__ = ["IngestDatabase", "check_database"]


class _Lineage(Protocol):
    """``db.batches`` as the core asks it (``activedb.atomic.Batches``)."""

    def consuming(self, query_id: str, batch_id: object = None) -> CommitParticipant: ...


class _ReplayMarker(Protocol):
    """``db.outbox`` as the core asks it (``activedb.outbox.Outbox``)."""

    def mark_replayed(self, transaction: Transaction) -> None: ...


class IngestDatabase(DatabaseHandle, Protocol):
    """:class:`~activedb._handle.DatabaseHandle`, the lineage of batches (``db.batches``, asked only by an
    ``Ingestion(lineage=True)``), the outbox (``db.outbox``: a trial flush of the poison search marks its
    transaction replayed, so its outbox records are not sent) and the lowering of plain rules
    (``db.rule_lowering``, asked by the rule path)."""

    @property
    def batches(self) -> _Lineage: ...

    @property
    def outbox(self) -> _ReplayMarker: ...

    @property
    def rule_lowering(self) -> BatchLowering:
        """How the rule path runs a batch of plain rules as one batch when that is the same as firing them
        (``activedb.batch``, "Plain rules lowered")."""
        ...


#: What an ingestion asks of its database at once, checked before anything else is (:func:`check_database`).
_NEEDED = ("catalog", "transactions", "rules", "clock", "transaction", "punctuate")


def check_database(call: str, db: object) -> None:
    """Raise :class:`IngestError` unless ``db`` (given to ``call``) is a database as :func:`activedb.connect` returns
    it — a URL or an SQLAlchemy engine failed later, naming an attribute it lacks."""
    if not all(hasattr(db, name) for name in _NEEDED):
        raise IngestError(f"{call}(db={db!r:.80}) takes the Database activedb.connect(url) returns, not "
                          f"{'an' if type(db).__name__[:1] in 'AEIOU' else 'a'} {type(db).__name__}: "
                          f"db = activedb.connect(url), then {call}(db, ...); nothing was applied")
