"""Every error ``activedb.batch`` raises on purpose (messages say what to do next; all are
``activedb.errors.ActivedbError``, which the CLI prints as one line).
"""

from __future__ import annotations

from activedb.errors import ActivedbError


class BatchError(ActivedbError):
    """Base class of the batch (TPG) executor's errors."""


class DeclarationError(BatchError):
    """A state transaction was declared wrongly (bad key, a key written twice, an unknown op)."""


class UnknownEventType(DeclarationError):
    """No state transaction is declared for an event type."""


class StrategyError(BatchError):
    """A strategy name or combination is not understood."""


class ExecutionInvariantBroken(BatchError):
    """The executor found its own bookkeeping inconsistent (a bug: please report it with the batch)."""


class WorkerFailed(BatchError):
    """A worker process failed while running a component of the batch."""


class BatchNotCommitted(BatchError):
    """The result of a batch run at commit was read before its transaction committed (or after
    it aborted)."""


class LoweringRefused(BatchError):
    """A lowered batch met an event of a learned plain rule that its lowered form cannot run as firing the rule
    would (the action raised, or did more than read and write its event's row): the attempt is refused inside
    the commit, nothing of it is kept, and the batch is to run event by event (the ingestion's rule path does
    that by itself)."""
