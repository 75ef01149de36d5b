"""A batch's dead letters: :class:`BatchLetters`, the typed dead-letter sink every handler gets (letters keep
their rows exactly as delivered, written through ``activedb.deadletters``, the table's owner), and
:func:`no_cyclic_gc`, the collector's pause around a batch.  Design note: ``README.md`` in this package."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING

from activedb import deadletters
from activedb.deadletters import Letter
from activedb.ingest._interface import row_count
from activedb.ingest._mapping import Rejected

if TYPE_CHECKING:  # pragma: no cover
    import pyarrow as pa

    from activedb._handle import DatabaseHandle
    from activedb.ingest._interface import RowEvent, Rows
    from activedb.store import Json
    from activedb.txn import Transaction

__all__ = ["BatchLetters", "no_cyclic_gc"]


class BatchLetters:
    """Dead letters of batch ``batch_id`` of the ledger's run ``query_id``, whose rows are ``rows`` (a
    ``pyarrow.Table``/``RecordBatch`` or a list), each keeping its row exactly as the connector delivered it,
    inserted through :func:`activedb.deadletters.insert`.  Immutable after construction; safe to share."""

    def __init__(self, db: DatabaseHandle, rows: Rows, query_id: str, batch_id: int | None):
        self._rows = rows
        self.query_id = query_id
        self.batch_id = batch_id

    def rejected(self, bad: Iterable[Rejected]) -> list[Letter]:
        """Letters for rows ``rows_to_events`` rejected."""
        bad = list(bad)
        from_rows = [item for item in bad if item.position >= 0]
        originals = dict(zip(map(id, from_rows), self._originals([item.position for item in from_rows])))
        # A rejection that is no row of the batch (position -1) keeps what it describes.
        return [Letter(item.reason, originals.get(id(item), item.row), item.row) for item in bad]

    def for_events(self, failed: Sequence[tuple[RowEvent, str]]) -> list[Letter]:
        """Letters for events of this batch, each ``(event, reason)``, with the row each came from (the event's
        ``position`` in the rows)."""
        originals, shown = self._originals_shown([event.position for event, _ in failed])
        return [Letter(reason, original, readable)
                for (_, reason), original, readable in zip(failed, originals, shown)]

    def all_rows(self, reason: str) -> list[Letter]:
        """A letter with ``reason`` for every row of the batch, each keeping its row as delivered — rows validation
        would reject included: of an Arrow table, text that is not UTF-8 is shown as validation shows it (each bad
        byte as ``\\xNN``; null in a nested column), its original keeps the bytes."""
        taken, originals = self._taken(list(range(row_count(self._rows))))
        if taken is None:
            return [Letter(reason, original) for original in originals]
        from activedb.ingest._arrow import _invalid_text_rows, jsonable_rows

        shown = jsonable_rows(_invalid_text_rows(taken, None)[0])
        return [Letter(reason, original, readable) for original, readable in zip(originals, shown)]

    def insert(self, tx: Transaction, letters: Sequence[Letter]) -> None:
        """Insert ``letters`` in ``tx`` (they commit with the batch)."""
        deadletters.insert(tx, self.query_id, self.batch_id, letters)

    def _originals(self, positions: list[int]) -> list[object]:
        """The rows at ``positions`` as delivered (of an Arrow table: one-row tables, taken at once and sliced — one
        ``take`` for every letter of the batch, not one each)."""
        return self._taken(positions)[1]

    def _originals_shown(self, positions: list[int]) -> tuple[list[object], list[dict[str, Json] | None]]:
        """:meth:`_originals` and their readable forms (``raw``; of an Arrow table: its columns made storable JSON,
        in one conversion; None for any other row: ``Letter.raw`` makes it).  Only for rows validation accepted: a
        rejected row may hold bytes that are no text (``rejected`` keeps the form validation made)."""
        taken, originals = self._taken(positions)
        if taken is None:
            return originals, [None] * len(originals)
        from activedb.ingest._arrow import jsonable_rows

        return originals, list(jsonable_rows(taken))

    def _taken(self, positions: list[int]) -> tuple[pa.Table | pa.RecordBatch | None, list[object]]:
        """The Arrow rows at ``positions`` as one table (None for rows of any other kind) and as one-row slices of it,
        or the rows themselves."""
        rows = self._rows
        if not (hasattr(rows, "take") and hasattr(rows, "schema")):
            return None, [rows[position] for position in positions]
        if not positions:
            return None, []
        taken = rows.take(positions)
        return taken, [taken.slice(index, 1) for index in range(len(positions))]


@contextlib.contextmanager
def no_cyclic_gc() -> Iterator[None]:
    """Pause the cyclic garbage collector for one batch — validation, the events, the commit and its
    flush — and collect the youngest generation once after it: every event leaves records that live until
    the batch's tree ends, which a collector inside the batch would rescan again and again (why and what
    it saves: the package's ``README.md``, "Where the time goes now").  The pause is process-wide.  A
    caller that disabled the collector itself keeps it disabled and gets no collection."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
            gc.collect(0)
