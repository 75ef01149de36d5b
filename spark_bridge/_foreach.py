"""``foreachBatch`` for a :class:`~spark_bridge._sink.QueryRun`, without PySpark's per-batch session wrapper.

PySpark's ``DataStreamWriter.foreachBatch(func)`` registers a Python callback (``ForeachBatchFunction``) that, for
every micro-batch, asks the JVM for the batch's session and builds a new Python ``SparkSession`` around it before it
calls ``func`` — three py4j calls and a few more in the constructor, each slow after Spark's turn, for a session that is the same object for every batch of a run (Spark
clones the session once per ``StreamExecution``).  :func:`foreach_batch` registers a subclass that wraps the first
batch's session once and hands every batch ``DataFrame(jdf, that session)``; errors are recorded as PySpark's own
wrapper records them.

What a failed batch raises to Spark (from the sink, or from here) is :func:`for_spark`'s :class:`BatchFailed`: a
bounded message, no chained traceback (:func:`for_spark` says why); the error itself stays with the sink
(``last_failure()``, what ``activedb run`` and the demo print) and its log.  ``KeyboardInterrupt`` and the other
``BaseException``\ s go to py4j as they are.

It uses PySpark internals (``DataStreamWriter._spark`` and ``._jwrite``, ``PythonForeachBatchHelper``,
``ensure_callback_server_started``): where they are missing (another PySpark, Spark Connect) the public
``foreachBatch`` is used instead, with the same result.
"""

from __future__ import annotations

import functools
import re
from typing import TYPE_CHECKING, Callable

from activedb.errors import shown_error
from spark_bridge.errors import SparkBridgeError, first_line

if TYPE_CHECKING:  # pragma: no cover
    from py4j.java_gateway import JavaObject
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.readwriter import DataStreamWriter

__all__ = ["BatchFailed", "for_spark", "foreach_batch"]

#: The most :func:`for_spark` keeps of an error's message (its Java stack frames left out).
_MESSAGE_CHARS = 2000
#: The longest line :func:`for_spark` keeps of a Java exception's messages.
_LINE_CHARS = 160
#: The type of a Java call's error as the traceback py4j sends to the JVM names it.
_PY4J_ERROR = "py4j.protocol.Py4JJavaError"
#: Where Spark's pattern starts matching (its ``.`` any character but a line's end, as Python's).
_PATTERN_START = re.compile(r"py4j.protocol.Py4JJavaError: An error occurred while calling")


class BatchFailed(SparkBridgeError):
    """What a batch that failed raises to Spark in place of its error (:func:`for_spark`): the error's type and
    message, and for an error of a Java call the Java exception's first line, a cancelled job's and the last."""


def for_spark(error: Exception, batch_id: int) -> BatchFailed:
    """The error to raise to Spark for batch ``batch_id``, which failed with ``error``: a bounded message, without
    ``error``'s traceback or its chained errors.

    py4j hands the JVM the text of the traceback of what ``foreachBatch`` raised, and Spark, when the query is being
    stopped, matches it against a pattern of the form ``py4j.protocol.Py4JJavaError: An error occurred while
    calling((.|\\n)*)(java.lang.InterruptedException|…)`` to tell an interrupted batch from a failed one.
    ``java.util.regex`` recurses once per character from the pattern's start to the end of the text: a Java stack
    trace after a ``Py4JJavaError`` (every Java exception pyspark does not convert: a job cancelled by the stop, an
    interrupted call) overflows the stream thread's stack, which dies with ``StackOverflowError`` printed on the
    console.  The text made here ends with what Spark's two checks look for — the ``Py4JJavaError`` line, then the
    Java exception's first line, a cancelled job's line (with its job group) and the last line (the root cause: an
    interruption's name) — each line cut at ``_LINE_CHARS``, so that a few hundred characters follow the pattern's
    start; before it, the error's type and message (its Java stack frames left out, cut where Spark's pattern would
    start, at most ``_MESSAGE_CHARS``).  The error itself is ``last_failure()``'s, whole, with its traceback."""
    java_lines: list[str] = []
    for cause in _chain(error):              # (the innermost Java error: the call that failed first)
        if _is_java_error(cause):
            header, *rest = shown_error(cause, message=True).splitlines() or [""]
            thrown = [line for line in rest if line.strip() and not line[:1].isspace()]   # (not its "\tat" frames)
            cancelled = [line for line in thrown if "cancelled" in line][:1]
            java_lines = [f"{_PY4J_ERROR}: {header}", *dict.fromkeys(thrown[:1] + cancelled + thrown[-1:])]
    if _is_java_error(error):
        message = first_line(error)           # (the rest: java_lines)
    else:
        message = "\n".join(line for line in shown_error(error, message=True).splitlines()
                            if not line.startswith(("\tat ", "\t... ")))
        start = _PATTERN_START.search(message)
        message = message if start is None else f"{message[:start.start()]}…"
        message = message if len(message) <= _MESSAGE_CHARS else f"{message[:_MESSAGE_CHARS - 1]}…"
    said = f"{type(error).__name__}: {message}" if message.strip() else type(error).__name__
    return BatchFailed("\n".join([f"batch {batch_id} failed: {said}",
                                  *(line if len(line) <= _LINE_CHARS else f"{line[:_LINE_CHARS - 1]}…"
                                    for line in java_lines)]))


def _is_java_error(error: BaseException) -> bool:
    """Whether ``error`` is py4j's error of a Java call (py4j is not imported here: no pyspark before Spark)."""
    return f"{type(error).__module__}.{type(error).__name__}" == _PY4J_ERROR


def _chain(error: BaseException) -> list[BaseException]:
    """``error`` and the errors it was raised from or while handling, outermost first, as a traceback shows them."""
    found: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and current not in found:
        found.append(current)
        current = current.__cause__ or (None if current.__suppress_context__ else current.__context__)
    return found


def foreach_batch(writer: DataStreamWriter, func: Callable[[DataFrame, int], None]) -> DataStreamWriter:
    """``writer.foreachBatch(func)`` for the batches of one run: the batch DataFrames share one session wrapper."""
    try:
        from py4j.java_gateway import java_import
        from pyspark.java_gateway import ensure_callback_server_started

        spark, jwrite = writer._spark, writer._jwrite
        gateway = spark._sc._gateway
        function = _function_class()(spark, func)
    except (ImportError, AttributeError):
        return writer.foreachBatch(func)
    if gateway is None:                 # (no JVM gateway: not a classic session)
        return writer.foreachBatch(func)
    java_import(gateway.jvm, "org.apache.spark.sql.execution.streaming.sources.*")
    gateway.jvm.PythonForeachBatchHelper.callForeachBatch(jwrite, function)
    ensure_callback_server_started(gateway)  # type: ignore[no-untyped-call]  # (py4j: untyped)
    return writer


@functools.cache
def _function_class() -> type:
    """The subclass, made on first use (importing this module imports no pyspark)."""
    from pyspark.sql.utils import ForeachBatchFunction

    class RunBatchFunction(ForeachBatchFunction):
        """PySpark's ``ForeachBatchFunction`` with the batch session's Python wrapper made once (module
        docstring)."""

        session_of_run: SparkSession | None = None

        def call(self, jdf: JavaObject, batch_id: int) -> None:
            from pyspark.sql.dataframe import DataFrame
            from pyspark.sql.session import SparkSession

            try:
                session = self.session_of_run
                if session is None:
                    session = self.session_of_run = SparkSession(self.session.sparkContext, jdf.sparkSession())
                self.func(DataFrame(jdf, session), batch_id)
            except BatchFailed as error:          # (the sink's: bounded already)
                self.error = error
                raise
            except Exception as error:
                self.error = error
                raise for_spark(error, batch_id) from None

    return RunBatchFunction
