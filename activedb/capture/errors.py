"""Every error and warning ``activedb.capture`` raises on purpose.  Messages say what happened and what
to do next."""

from __future__ import annotations

from activedb.errors import ActivedbError


class CaptureError(ActivedbError):
    """Base class of the change-capture layer's errors."""


class CaptureNotInstalled(CaptureError):
    """activedb's capture tables (revision ``0004_capture``) are not in the database."""


class CapturePendingChanges(CaptureError):
    """Stopping capture of a table would drop changes of it some consumer has not handled yet (``pending`` of them):
    nothing was changed.  Let the consumers catch up first, or pass ``discard_pending=True``."""

    def __init__(self, message: str, pending: int):
        super().__init__(message)
        self.pending = pending


class CaptureConflict(CaptureError):
    """A consumer's position moved under it (another process consuming under the same name took over):
    the batch was not committed, nothing of it is kept; the consumer re-reads its position."""


class ConsumerStopped(CaptureError):
    """The consumer was stopped (``stop()``/``close()``) and cannot run batches any more."""


class CaptureNotEnabledWarning(UserWarning):
    """A rule was declared on ``db.captured(table)`` for a table that is not captured (yet)."""
