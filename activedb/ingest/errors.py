"""Errors of the ingestion core.  Every one says what to do next and derives from
:class:`activedb.errors.ActivedbError`; a connector's own errors (``spark_bridge.errors``) build on them."""

from __future__ import annotations

from activedb.errors import ActivedbError

__all__ = ["AppLoadError", "IngestError", "MappingError", "describe", "first_line"]


def first_line(error: BaseException) -> str:
    """The first line of ``error``'s message, or its type's name when it has none."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def describe(error: BaseException) -> str:
    """``Type: first line of the message`` (just ``Type`` without a message)."""
    return f"{type(error).__name__}: {first_line(error)}" if str(error).strip() else type(error).__name__


class IngestError(ActivedbError):
    """An ingestion was set up in a way that cannot work (an empty source name, a handler that does not fit
    the mapping, a connector's argument missing, …).  The message says which argument to change."""


class AppLoadError(IngestError):
    """An application module or file (``activedb run``, ``activedb dead-letters replay``, the scale-out tasks)
    could not be loaded, or lacks ``register(db)`` / ``MAPPING``."""


class MappingError(IngestError, ValueError):
    """An :class:`~activedb.ingest.EventMapping` is itself malformed.

    This is about the mapping's configuration (for example an empty column name), never about a data row:
    bad rows are *rejected*, not raised.
    """
