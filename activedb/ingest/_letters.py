"""A batch's dead letters: :class:`BatchLetters`, the typed dead-letter sink every handler gets (letters keep
their rows exactly as delivered — but the source's own line and corrupt-record columns where they hold nothing the
row lacks —, written through ``activedb.deadletters``, the table's owner).  Design note: ``README.md`` in this package."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, TypeVar, overload

from activedb import deadletters
from activedb.deadletters import Letter
from activedb.ingest._interface import row_count
from activedb.ingest._mapping import EventMapping, Rejected, lone_surrogate_reason
from activedb.store import tagged_key

if TYPE_CHECKING:  # pragma: no cover
    import pyarrow as pa

    from activedb.ingest._interface import RowEvent, Rows
    from activedb.store import Json
    from activedb.txn import Transaction

__all__ = ["BatchLetters"]


class BatchLetters:
    """Dead letters of batch ``batch_id`` of the ledger's run ``query_id``, whose rows are ``rows`` (a
    ``pyarrow.Table``/``RecordBatch`` or a list), each keeping its row exactly as the connector delivered it,
    inserted through :func:`activedb.deadletters.insert`.  Immutable after construction; safe to share.

    ``mapping`` (the batch's; None: none) names the columns a source adds of its own (``activedb run``'s): a letter's
    row leaves out its corrupt-record column where it is null, and its line column where the line holds nothing the
    row's other columns lack — kept where it is not UTF-8 or holds a lone surrogate in a field the row has (the
    evidence the parsed columns lost, which makes a replay reject the row again), and null or left out where Spark's
    corrupt-record column holds the line (:func:`_source_columns_left_out`)."""

    def __init__(self, rows: Rows, query_id: str, batch_id: int | None, mapping: EventMapping | None = None):
        self._rows = rows
        self.query_id = query_id
        self.batch_id = batch_id
        self._mapping = mapping

    def rejected(self, bad: Iterable[Rejected]) -> list[Letter]:
        """Letters for rows ``rows_to_events`` rejected."""
        bad = list(bad)
        from_rows = [item for item in bad if item.position >= 0]
        _, originals, left_out = self._taken([item.position for item in from_rows])
        taken = {id(item): (original, names) for item, original, names in zip(from_rows, originals, left_out)}
        # A rejection that is no row of the batch (position -1) keeps what it describes.
        return [Letter(item.reason, taken[id(item)][0], _without(item.row, _shown(taken[id(item)][1])))
                if id(item) in taken else Letter(item.reason, item.row, item.row) for item in bad]

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
        taken, originals, left_out = self._taken(list(range(row_count(self._rows))))
        if taken is None:
            return [Letter(reason, original) for original in originals]
        from activedb.ingest._arrow import _invalid_text_rows, jsonable_rows

        shown = jsonable_rows(_invalid_text_rows(taken, None)[0])
        return [Letter(reason, original, _without(readable, _shown(names)))
                for original, readable, names in zip(originals, shown, left_out)]

    def insert(self, tx: Transaction, letters: Sequence[Letter]) -> None:
        """Insert ``letters`` in ``tx`` (they commit with the batch)."""
        deadletters.insert(tx, self.query_id, self.batch_id, letters)

    def _originals_shown(self, positions: list[int]) -> tuple[list[object], list[dict[str, Json] | None]]:
        """The rows at ``positions`` as :meth:`_taken` gives them, and their readable forms (``raw``; of an Arrow
        table: its columns made storable JSON, in one conversion; None for any other row: ``Letter.raw`` makes it).
        Only for rows validation accepted: a rejected row may hold bytes that are no text (``rejected`` keeps the
        form validation made)."""
        taken, originals, left_out = self._taken(positions)
        if taken is None:
            return originals, [None] * len(originals)
        from activedb.ingest._arrow import jsonable_rows

        return originals, [_without(readable, _shown(names)) for readable, names in zip(jsonable_rows(taken), left_out)]

    def _taken(self, positions: list[int]
               ) -> tuple[pa.Table | pa.RecordBatch | None, list[object], list[tuple[str, ...]]]:
        """The Arrow rows at ``positions`` as one table (None for rows of any other kind); the letters' rows — one-row
        slices of it (one ``take`` for every letter of the batch, not one each), or the rows themselves —, each
        without the source's columns it leaves out; and those columns, per row (:func:`_source_columns_left_out`)."""
        rows, mapping = self._rows, self._mapping
        if not (hasattr(rows, "take") and hasattr(rows, "schema")):
            left_out = [() if mapping is None else _source_columns_left_out(rows[position], mapping)
                        for position in positions]
            return None, [_without(rows[position], names) for position, names in zip(positions, left_out)], left_out
        if not positions:
            return None, [], []
        taken = rows.take(positions)
        left_out = ([()] * len(positions) if mapping is None else _arrow_source_columns_left_out(taken, mapping))
        return taken, [_without_columns(taken.slice(index, 1), names) for index, names in enumerate(left_out)], left_out


def _source_columns_left_out(row: object, mapping: EventMapping) -> tuple[str, ...]:
    """The columns of ``row`` (a mapping; anything else: none) that a source added of its own and that its letter
    leaves out: the corrupt-record column where it is null; the line column where the line is null, or is text whose
    every field the row holds as it was sent — the line is kept where it holds a lone surrogate in a field the row
    has (:func:`~activedb.ingest._mapping.lone_surrogate_reason`), or is no text — and, for a row whose
    corrupt-record column holds the line, where the two are the same."""
    if not isinstance(row, Mapping):
        return ()
    left_out = []
    corrupt, line = mapping.corrupt_column, mapping.line_column
    if corrupt is not None and corrupt in row and row[corrupt] is None:
        left_out.append(corrupt)
    if line is not None and line in row:
        value = row[line]
        if value is None or (isinstance(value, str) and (
                (corrupt is not None and row.get(corrupt) == value)
                or lone_surrogate_reason(value, row.keys()) is None)):
            left_out.append(line)
    return tuple(left_out)


def _arrow_source_columns_left_out(table: pa.Table | pa.RecordBatch, mapping: EventMapping) -> list[tuple[str, ...]]:
    """:func:`_source_columns_left_out` for each row of ``table``: a text value whose bytes are not UTF-8 is no text
    (Arrow does not check what Spark hands it), so such a line is kept."""
    import pyarrow as pa

    names = table.schema.names
    count = table.num_rows
    corrupt = mapping.corrupt_column if mapping.corrupt_column in names else None
    line = mapping.line_column if mapping.line_column in names else None

    def as_bytes(name: str | None) -> list[bytes | None] | None:
        if name is None:
            return None
        column = table.column(name)
        if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
            return None
        values: list[bytes | None] = column.cast(pa.binary() if pa.types.is_string(column.type)
                                                 else pa.large_binary()).to_pylist()
        return values

    corrupt_null = (table.column(corrupt).is_null().to_pylist() if corrupt is not None else [False] * count)
    corrupt_bytes, line_bytes = as_bytes(corrupt), as_bytes(line)
    left_out: list[tuple[str, ...]] = []
    for index in range(count):
        row: list[str] = []
        if corrupt is not None and corrupt_null[index]:
            row.append(corrupt)
        if line is not None and line_bytes is not None:
            data = line_bytes[index]
            if data is None or (corrupt_bytes is not None and corrupt_bytes[index] == data):
                row.append(line)
            else:
                try:
                    text = data.decode("utf-8")
                except UnicodeDecodeError:
                    text = None         # (no text: kept, the bytes are the evidence)
                if text is not None and lone_surrogate_reason(text, names) is None:
                    row.append(line)
        left_out.append(tuple(row))
    return left_out


_Value = TypeVar("_Value")


@overload
def _without(row: dict[str, _Value], names: tuple[str, ...]) -> dict[str, _Value]: ...


@overload
def _without(row: Mapping[str, _Value] | None, names: tuple[str, ...]) -> Mapping[str, _Value] | None: ...


def _without(row: Mapping[str, _Value] | None, names: tuple[str, ...]) -> Mapping[str, _Value] | None:
    """``row`` (a mapping; anything else as it is) without the keys ``names``."""
    if not names or not isinstance(row, Mapping):
        return row
    return {key: value for key, value in row.items() if key not in names}


def _shown(names: tuple[str, ...]) -> tuple[str, ...]:
    """Columns ``names`` as a readable form's keys have them (``tagged_key``: one starting with ``$`` escaped)."""
    return tuple(map(tagged_key, names)) if names else names


def _without_columns(table: pa.Table | pa.RecordBatch, names: tuple[str, ...]) -> pa.Table | pa.RecordBatch:
    """``table`` without the columns ``names``."""
    return table.drop_columns(list(names)) if names else table
