"""Every error and warning of ``activedb.atomic`` (atomic batches: lineage, scover, compensation)."""

from __future__ import annotations

from collections.abc import Sequence

from activedb.errors import ActivedbError


class AtomicBatchError(ActivedbError):
    """Base class of the errors of ``activedb.atomic``."""


class LineageError(AtomicBatchError):
    """Lineage was recorded wrongly (outside a transaction, on a finished one, with bad ids)."""


class UnknownBatch(AtomicBatchError):
    """No recorded transaction consumed or produced the batch that was named."""

    @classmethod
    def not_consumed(cls, batch: object, known: Sequence[str] | None = None) -> UnknownBatch:
        """The error for compensating ``batch`` (a ``BatchRef``), which no recorded transaction consumed: raised by
        ``db.batches.compensate``, and by ``activedb batches compensate`` on a database without activedb's tables.
        ``known``: the batch ids of its query that recorded transactions consumed (None: not looked up)."""
        query = str(getattr(batch, "query_id", ""))
        said = ""
        if known is not None:
            ordered = sorted(known, key=lambda batch_id: (not batch_id.isdigit(), int(batch_id) if batch_id.isdigit()
                                                          else 0, batch_id))
            more = f" and {len(ordered) - _LISTED} more" if len(ordered) > _LISTED else ""
            said = (f"; lineage knows batches {', '.join(ordered[:_LISTED])}{more} of {query}" if ordered
                    else f"; lineage knows no batch of {query}")
        source, mark, partition = query.rpartition("#p")
        if mark and partition.isdigit():
            said += (f"; each partition of a split batch records the source batch, {source} without #p{partition}: "
                     f"name that")
        return cls(f"no recorded transaction consumed batch {batch}{said} (lineage older than the retention may have "
                   f"been pruned)")


#: How many of a query's batch ids an :class:`UnknownBatch` names.
_LISTED = 10


class NoCompensation(AtomicBatchError):
    """A transaction to compensate has nothing that undoes it (no declared compensation, no undo images)."""


class UnsafeUndo(AtomicBatchError):
    """A before-image undo would overwrite rows a later transaction wrote or read after the one being
    undone: the logical caveat of generic undo (Vidyasankar, *On Atomic Batch Executions in Stream
    Processing*, §1, on sagas)."""


class PartitionFailed(AtomicBatchError):
    """A partition of a split source batch failed for good and the ingestion stops: with
    ``on_partition_failure="forward"`` (fix the cause and restart it; the batch completes), when PostgreSQL was
    unusable (restart once it is back), or when compensating the committed partitions failed (declare the
    compensation; a restart resumes it)."""


class BatchNotSettled(AtomicBatchError):
    """A split source batch to compensate has partitions the ledger does not hold yet (still being ingested, or
    pending completion under ``on_partition_failure="forward"``): compensating it now would undo the committed
    partitions while the others commit later.  Nothing was compensated."""


class CompensationFailed(AtomicBatchError):
    """A compensating transaction failed; the ones before it committed and are recorded, so running the
    same compensation again resumes after them."""
