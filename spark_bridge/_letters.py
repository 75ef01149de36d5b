"""The dead letters of one micro-batch: each keeps the row exactly as Spark (or the caller) delivered it.

:class:`BatchLetters` is the typed dead-letter sink every Spark path gets for a batch (the rule path,
the stream-query, TPG and composition handlers, the scale-out tasks): it makes
:class:`activedb.deadletters.Letter` objects for rejected rows and for events of the batch — the original
being the one-row ``pyarrow.Table`` of the row (schema included) or the dict the caller passed — and
inserts them through :func:`activedb.deadletters.insert`, the table's one owner.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from activedb import deadletters
from activedb.deadletters import Letter
from activedb.store import jsonable

from spark_bridge.mapping import RawEvent, Rejected

if TYPE_CHECKING:  # pragma: no cover
    from activedb import Transaction

__all__ = ["BatchLetters"]


class BatchLetters:
    """Dead letters of batch ``batch_id`` of ledger query ``query_id``, whose rows are ``rows`` (a
    ``pyarrow.Table``/``RecordBatch`` or a list).  Immutable after construction; safe to share."""

    def __init__(self, db: Any, rows: Any, query_id: str, batch_id: int | None):
        self._catalog = db.catalog
        self._rows = rows
        self.query_id = query_id
        self.batch_id = batch_id

    def rejected(self, bad: Iterable[Rejected]) -> list[Letter]:
        """Letters for rows ``rows_to_events`` rejected."""
        bad = list(bad)
        from_rows = [item for item in bad if item.position >= 0]
        originals = dict(zip(map(id, from_rows), self._originals([item.position for item in from_rows])))
        # A rejection that is no row of the batch (position -1: e.g. a composition heartbeat out of order)
        # keeps what it describes.
        return [Letter(item.reason, originals.get(id(item), item.row), item.row) for item in bad]

    def for_events(self, failed: Sequence[tuple[RawEvent, str]]) -> list[Letter]:
        """Letters for events of this batch, each ``(event, reason)``, with the row each came from."""
        originals = self._originals([event.position for event, _ in failed])
        return [Letter(reason, original, _shown(original)) for (_, reason), original in zip(failed, originals)]

    def insert(self, tx: Transaction, letters: Sequence[Letter]) -> None:
        """Insert ``letters`` in ``tx`` (they commit with the batch)."""
        deadletters.insert(tx, self._catalog, self.query_id, self.batch_id, letters)

    def _originals(self, positions: list[int]) -> list[Any]:
        rows = self._rows
        if hasattr(rows, "take"):
            return [rows.take([position]) for position in positions]
        return [rows[position] for position in positions]


def _shown(original: Any) -> dict:
    """The readable form of a row (``raw``): its columns made storable JSON."""
    if hasattr(original, "to_pylist") and hasattr(original, "schema"):
        from spark_bridge._arrow import jsonable_rows

        return jsonable_rows(original)[0]
    shown = jsonable(original)
    return shown if isinstance(shown, Mapping) else {"value": shown}
