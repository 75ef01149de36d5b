"""Every error and warning of ``activedb.atomic`` (atomic batches: lineage, scover, compensation)."""

from __future__ import annotations

from activedb.errors import ActivedbError


class AtomicBatchError(ActivedbError):
    """Base class of the errors of ``activedb.atomic``."""


class LineageError(AtomicBatchError):
    """Lineage was recorded wrongly (outside a transaction, on a finished one, with bad ids)."""


class UnknownBatch(AtomicBatchError):
    """No recorded transaction consumed or produced the batch that was named."""

    @classmethod
    def not_consumed(cls, batch: object) -> UnknownBatch:
        """The error for compensating ``batch`` (a ``BatchRef``), which no recorded transaction consumed: raised by
        ``db.batches.compensate``, and by ``activedb batches compensate`` on a database without activedb's tables."""
        return cls(f"no recorded transaction consumed batch {batch}; `activedb batches show` lists what lineage knows "
                   f"(lineage older than the retention may have been pruned)")


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


class CompensationFailed(AtomicBatchError):
    """A compensating transaction failed; the ones before it committed and are recorded, so running the
    same compensation again resumes after them."""
