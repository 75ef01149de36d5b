"""The plain connector: :func:`feed` — any iterable of row batches into the ingestion core, exactly once —
and :func:`drive`, which runs any pull :class:`~activedb.ingest.Source` through an
:class:`~activedb.ingest.Ingestion`.  Design note: ``README.md`` in this package ("Connectors").

Thread-safety: one call runs its batches one after the other on the calling thread.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from activedb.errors import check_switch
from activedb.ingest._ingestion import Ingestion
from activedb.ingest._database import check_database
from activedb.ingest._interface import Batch, LedgerId, Phase, ReservedSource, Rows, Source
from activedb.ingest._ledger import check_source_name, check_source_owner
from activedb.ingest._mapping import EventMapping
from activedb.ingest._outcome import BatchOutcome
from activedb.ingest._protocol import BatchHandler
from activedb.ingest.errors import IngestError

if TYPE_CHECKING:  # pragma: no cover
    from activedb.ingest._ingestion import IngestDatabase
    from activedb.txn import CommitParticipant

__all__ = ["RowBatches", "drive", "feed"]

#: The commit participants of one batch's transaction, given the batch (a replay marks its letter there).
Participants = Callable[[Batch], Sequence["CommitParticipant"]]


@dataclass(frozen=True)
class RowBatches:
    """A :class:`~activedb.ingest.Source` over ``batches``: each a :class:`Batch`, or rows numbered by their
    position in the iterable (0, 1, …).  Iterating it again yields the same batches if ``batches`` does (a
    list, a re-opened file): the contract exactly once rests on."""

    ledger_id: LedgerId
    rows: Iterable[Rows | Batch]

    def batches(self) -> Iterator[Batch]:
        """The batches in order; a batch number given twice (numbers within a run are distinct) raises
        IngestError when the second is reached — the ledger would take it for the first, already committed,
        and skip its rows."""
        positions: dict[int, int] = {}      # batch number -> its position in ``rows``
        for position, batch in enumerate(self.rows):
            batch = batch if isinstance(batch, Batch) else Batch(position, batch)
            first = positions.setdefault(batch.number, position)
            if first != position:
                raise IngestError(f"batch number {batch.number} of {self.ledger_id} is given twice, at positions "
                                  f"{first} and {position}: numbers within a run are distinct (rows are numbered "
                                  f"by their position, a Batch by its own number) — renumber the batches; the "
                                  f"batches before position {position} were applied")
            yield batch


def drive(ingestion: Ingestion, source: Source, *, participants: Participants | None = None) -> list[BatchOutcome]:
    """Apply every batch of ``source`` (a :class:`~activedb.ingest.Source`) through ``ingestion``, in order;
    their outcomes (a batch the ledger had: ``committed`` False).  Raises what ``Ingestion.process`` raises;
    the batches before it are committed, so driving the same source again applies the rest."""
    query_id = str(source.ledger_id)
    return [ingestion.process(batch.rows, batch.number, query_id=query_id, watermark=batch.watermark,
                              participants=participants(batch) if participants is not None else ())
            for batch in source.batches()]


def feed(db: IngestDatabase, batches: Iterable[Rows | Batch], *, source: str, run: str | None = None,
         mapping: EventMapping | Mapping[str, object] | None = None, handler: BatchHandler | None = None,
         known_types: Collection[str] | None = None, on_phase: Callable[[Phase, int], None] | None = None,
         lineage: bool = False, event_ids_under: str | None = None, participants: Participants | None = None,
         end_of_stream: bool = False, owner: ReservedSource | None = None) -> list[BatchOutcome]:
    """Feed ``batches`` into ``db`` as source ``source`` (run ``run``), exactly once: each batch (rows — mappings
    or an Arrow table —, numbered by position; or a :class:`Batch` with its own number and watermark) in one
    top-level transaction with its ledger row; a batch the ledger has is skipped, so feeding the same batches
    again — after a crash at any point — applies nothing twice (a batch that comes again with another number of
    rows than it was committed with — other batch boundaries — is refused with an IngestError, nothing of it
    applied; on the rules, a batch with events when no rule is registered at all is refused with
    ``NoRuleRegistered``, nothing of it applied or recorded).  ``mapping``, ``handler`` (the rules by
    default), ``known_types``, ``on_phase``, ``lineage`` and ``event_ids_under`` are :class:`Ingestion`'s;
    ``participants(batch)`` adds commit participants to a batch's transaction; ``end_of_stream``: the batches are
    the whole source — after the last, the handler releases what its engine holds back
    (``Ingestion.end_of_stream``); ``owner`` (the extender tier: the replay of dead letters) is :class:`Ingestion`'s —
    a ``source`` beginning with ``replay:`` or ``capture:`` is refused without it.  Returns the outcomes, in
    order."""
    check_database("feed", db)
    if not isinstance(batches, Iterable):
        raise IngestError(f"batches {batches!r} is not a collection of batches: give feed(db, [[row, ...], ...]) — each "
                          f"batch a sequence of rows (mappings), an Arrow table or a Batch; nothing was applied")
    check_switch("feed", "end_of_stream", end_of_stream, error=IngestError)
    check_source_name("feed", "source", source)
    if run is not None:
        check_source_name("feed", "run", run, run=True)
    check_source_owner("feed", source, owner)
    if participants is not None and not callable(participants):
        raise IngestError(f"feed(participants={participants!r}) takes a function of the batch that returns its commit "
                          f"participants (participants=lambda batch: [...]), or None; nothing was applied")
    ingestion = Ingestion(db, mapping, source=source, handler=handler, known_types=known_types, on_phase=on_phase,
                          lineage=lineage, event_ids_under=event_ids_under, owner=owner)
    try:
        if run is None and LedgerId.parse(source).run is not None:
            parsed = LedgerId.parse(source)
            raise IngestError(f"feed(source={source!r}) reads as the ledger id of run {parsed.run!r} of the source "
                              f"{parsed.source!r}: a source without a run holds no '@RUN' — give the run apart, "
                              f"feed(db, batches, source={parsed.source!r}, run={parsed.run!r}), or a name without "
                              f"'@'; nothing was applied")
        ledger_id = LedgerId(source, run)
        outcomes = drive(ingestion, RowBatches(ledger_id, batches), participants=participants)
        if end_of_stream:       # (the run named: without a batch in this call the ingestion saw none)
            ingestion.end_of_stream(str(ledger_id))
        return outcomes
    finally:
        ingestion.close()
