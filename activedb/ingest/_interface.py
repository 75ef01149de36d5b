"""The typed interface between a connector and the ingestion core: :class:`LedgerId` (which run of which source
a batch belongs to), :class:`Batch` (one batch of rows), :class:`Source` (a connector the core pulls batches
from), :class:`Phase` (the points of a batch that ``on_phase`` hears) and :class:`ReservedSource` (the source
names activedb's own connectors own).  Design note: ``README.md`` in this
package ("The interface").

Everything here is immutable and safe to share between threads.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypeAlias, runtime_checkable

from activedb._closedset import ClosedSet
from activedb.errors import BadArgument

if TYPE_CHECKING:  # pragma: no cover
    import pyarrow

__all__ = ["Batch", "LedgerId", "Phase", "ReservedSource", "RowEvent", "Rows", "Source", "row_count"]

#: A batch's rows: mappings of column to value, or an Arrow table (``DataFrame.toArrow()``, Flight, Parquet).
Rows: TypeAlias = "Sequence[Mapping[str, object]] | pyarrow.Table | pyarrow.RecordBatch"


def row_count(rows: Rows) -> int:
    """How many rows ``rows`` holds (an Arrow table's ``num_rows``, else its length)."""
    return rows.num_rows if hasattr(rows, "num_rows") else len(rows)


class RowEvent(Protocol):
    """An event of a batch as the core handles it: ``position`` is the index of its row in the batch (the row
    its dead letter keeps).  ``RawEvent`` is one; so is an event a connector makes itself (change capture)."""

    @property
    def position(self) -> int: ...

#: ``RUN[#pN]`` after the last ``@`` of a ledger id: the whole rest (``\Z``; ``$`` also matches before a final line
#: break), N in the digits ``str`` prints (0-9).
_RUN = re.compile(r"^(?P<run>[^@#]+)(?:#p(?P<partition>[0-9]+))?\Z")


@dataclass(frozen=True)
class LedgerId:
    """The ledger's key of one run of a source, without the batch number; written ``SOURCE[@RUN[#pN]]``.

    ``source`` is the stable name (``ingest(query_name=…)``, ``capture:<consumer>``, ``feed(source=…)``,
    ``replay:<query>``): what ``activedb status`` groups by and what dead letters are filed under.  ``run`` is
    an epoch whose batch numbers are new — Spark's query id, read from the checkpoint, so a new checkpoint
    never mistakes its batch 0 for the old one's; ``None`` for a source that never numbers its batches anew.
    ``partition`` names one part of a split source batch (the Spark scale-out path).

    Invariant: ``LedgerId.parse(str(ledger_id)) == ledger_id`` — a run holds neither ``@`` nor ``#`` (the
    constructor refuses it), a source without a run holds no ``@RUN`` of its own, and only a run has partitions
    (both refused too).  A run of only whitespace is refused, built or parsed, in the words of
    ``check_source_name``, which refuses it on every path that makes a run — except in an id read from the
    database (:meth:`read`): feed took a blank run until it refused one, so the ledger and the dead letters may
    hold such ids (``read(str(ledger_id)) == ledger_id`` then).
    """

    source: str
    run: str | None = None
    partition: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.source, str) or not self.source:
            raise BadArgument(f"a ledger id's source is a non-empty string, got {self.source!r}")
        if self.run is None and _split(self.source) is not None:
            raise BadArgument(f"{self.source!r} reads as SOURCE@RUN: pass LedgerId.parse({self.source!r}), or "
                              f"a source without '@'")
        if self.run is not None and (not isinstance(self.run, str) or _RUN.match(self.run) is None
                                     or "#" in self.run):
            raise BadArgument(f"a ledger id's run is a non-empty string without '@' or '#', got {self.run!r}")
        if self.run is not None and not self.run.strip():     # (no ingestion writes one: check_source_name's words)
            from activedb.ingest._ledger import unfit_source_name

            raise BadArgument(f"LedgerId(run={self.run!r}) {unfit_source_name(self.run, run=True)}")
        if self.partition is not None and (isinstance(self.partition, bool) or not isinstance(self.partition, int)
                                           or self.partition < 0):
            raise BadArgument(f"a ledger id's partition is a number from 0, got {self.partition!r}")
        if self.partition is not None and self.run is None:
            raise BadArgument("a partition belongs to a run: LedgerId(source, run, partition)")

    def __str__(self) -> str:
        text = self.source if self.run is None else f"{self.source}@{self.run}"
        return text if self.partition is None else f"{text}#p{self.partition}"

    @classmethod
    def parse(cls, text: str) -> LedgerId:
        """The id written as ``text``.  Text without ``@`` (``capture:orders``, ``replay:badges``, the plain-write
        baseline's bare Spark ids) is a source without a run; so is text whose part after the last ``@`` is no
        run (it then belongs to the source's name).  A run of only whitespace (``badges@ ``) is refused
        (:class:`BadArgument`): no ingestion writes one."""
        if not isinstance(text, str):
            raise BadArgument(f"a ledger id is the text SOURCE@RUN[#pN] (or a source's name without a run), got "
                              f"{text!r}")
        parts = _split(text)
        return cls(text) if parts is None else cls(*parts)

    @classmethod
    def read(cls, text: str) -> LedgerId:
        """The id of a row the ledger or the dead letters hold, as it was written: :meth:`parse`'s, except that a run
        of only whitespace (``badges@  ``) is read, not refused — feed took one (``feed(run="  ")``) until it refused
        it, so an earlier activedb may have written such rows, and reading them (``activedb status``, ``activedb
        batches``, a dead letter's source) must not fail.  Text a user gives is :meth:`parse`'s."""
        parts = _split(text) if isinstance(text, str) else None
        if parts is None or parts[1].strip():
            return cls.parse(text)
        return cls._as_written(*parts)

    @classmethod
    def _as_written(cls, source: str, run: str | None, partition: int | None) -> LedgerId:
        """The id of these parts without the constructor's checks: for parts of an id already checked, or read from
        the database (:meth:`read`)."""
        ledger_id = object.__new__(cls)
        for name, value in (("source", source), ("run", run), ("partition", partition)):
            object.__setattr__(ledger_id, name, value)
        return ledger_id

    def whole(self) -> LedgerId:
        """The id of the source batch a partition belongs to (itself, without a partition)."""
        return self if self.partition is None else self._as_written(self.source, self.run, None)

    def partitioned(self, partition: int) -> LedgerId:
        """The id of ``partition`` of this run's batches."""
        return LedgerId(self.source, self.run, partition)


def _split(text: str) -> tuple[str, str, int | None] | None:
    """``(source, run, partition)`` of ``SOURCE@RUN[#pN]``, or None if ``text`` is not of that form."""
    source, at, rest = text.rpartition("@")
    match = _RUN.match(rest) if at and source else None
    if match is None:
        return None
    partition = match.group("partition")
    return source, match.group("run"), None if partition is None else int(partition)


@dataclass(frozen=True)
class Batch:
    """One batch of a source run, as a connector hands it to the core.

    Contract (exactly once rests on it): the same ``number`` of a run always carries the same ``rows``; numbers
    of one run are distinct (a batch the ledger has that comes again with another number of rows is refused).  A
    connector that delivers them in increasing order saves the ledger's question for each batch that follows the
    last one committed.  ``watermark``: the source's punctuation for the batch
    (UTC; events older are late, and it is punctuated after the commit), or None."""

    number: int
    rows: Rows
    watermark: dt.datetime | None = None

    def __post_init__(self) -> None:
        if isinstance(self.number, bool) or not isinstance(self.number, int) or not 0 <= self.number < 2**63:
            raise BadArgument(f"a batch number is an integer from 0 (below 2**63: the ledger's bigint holds it), "
                              f"got {self.number!r}")
        watermark = self.watermark
        if watermark is not None and (not isinstance(watermark, dt.datetime) or watermark.tzinfo is None):
            raise BadArgument(f"a batch's watermark is an aware datetime (UTC), got {self.watermark!r}")

    @property
    def row_count(self) -> int:
        return row_count(self.rows)


@runtime_checkable
class Source(Protocol):
    """A connector the core pulls batches from (``activedb.ingest.drive``, ``feed``).

    ``ledger_id`` names the run; ``batches()`` yields its batches in order.  Contract: iterating ``batches()``
    again — after a crash, in another process — yields the same batches with the same numbers (:class:`Batch`'s
    contract), so the ledger skips those committed before.  A connector whose source pushes (Spark's
    ``foreachBatch``, the capture consumer) calls ``Ingestion.process`` itself under the same contract."""

    @property
    def ledger_id(self) -> LedgerId:
        """The run whose batches :meth:`batches` yields."""
        ...

    def batches(self) -> Iterable[Batch]:
        """The run's batches, in order of their numbers."""
        ...


class Phase(ClosedSet):
    """The points of a batch that ``on_phase(phase, batch_number)`` hears (a seam for crash tests and
    monitoring).  ``on_phase`` is always called with a member; a member is a ``str`` (``Phase.FLUSH == "flush"``),
    so a callback typed ``(str, int)`` fits.  Where a phase is given (``Ingestion.phase``), its value's string is
    accepted too; anything else is an :class:`~activedb.errors.InvalidChoice` naming the members."""

    FETCHED = "fetched"      # the rows are in Python, nothing written (a connector says so)
    FLUSH = "flush"          # inside the flush: everything written, PostgreSQL's COMMIT is next
    COMMITTED = "committed"  # the batch committed (before its punctuation)
    SKIPPED = "skipped"      # the ledger already had the batch


class ReservedSource(ClosedSet):
    """The beginnings of source names that activedb's own connectors own: their batch numbers mean something
    there, so a source of another under such a name would fill their ledger slots.  An :class:`Ingestion` (and
    :func:`feed`) under such a name is refused unless its owner is given, as a member (``owner=`` — the extender
    tier: no string is taken for it); :meth:`source` is the owner's name for one of its sources."""

    REPLAY = "replay:"      # the replay of dead letters: replay:NAME, batch number = the letter's id
    CAPTURE = "capture:"    # a change-capture consumer: capture:NAME, batch number = its first change's id

    def source(self, name: str) -> str:
        """The source name ``name`` has under this owner (``ReservedSource.REPLAY.source("badges")`` is
        ``replay:badges``)."""
        return f"{self.value}{name}"

    @property
    def owner(self) -> str:
        """Who owns the names, and what its batch numbers are, for messages."""
        return {ReservedSource.REPLAY: "the replay of dead letters (activedb dead-letters replay), whose batch "
                                       "numbers are the letters' ids",
                ReservedSource.CAPTURE: "change capture's consumers (db.capture), whose batch numbers are change "
                                        "ids"}[self]
