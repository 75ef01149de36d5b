"""``foreachBatch`` for a :class:`~spark_bridge._sink.QueryRun`: a run's batches share one wrapper of the run's Spark
session (PySpark's wraps each batch's anew; its public ``foreachBatch`` where its internals differ); and what a failed
batch raises to Spark (:func:`for_spark`).  The package README, "One micro-batch" (step 0) and "Facts about Spark…".
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Callable

from activedb.errors import causes, shown_error
from spark_bridge.errors import SparkBridgeError, first_line

if TYPE_CHECKING:  # pragma: no cover
    from py4j.java_gateway import JavaObject
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.readwriter import DataStreamWriter

__all__ = ["BatchFailed", "for_spark", "foreach_batch"]

#: The most a failed batch's message keeps for Spark, and the longest line of its Java error (:func:`for_spark`).
_MESSAGE_CHARS, _LINE_CHARS = 2000, 160
_PY4J_ERROR = "py4j.protocol.Py4JJavaError"     # (a Java call's error, as a traceback names it)


class BatchFailed(SparkBridgeError):
    """What a failed batch raises to Spark in place of an error of a Java call (:func:`for_spark`)."""


def for_spark(error: Exception, batch_id: int) -> Exception:
    """What batch ``batch_id``, failed with ``error``, raises to Spark: ``error``, or if a Java call's error is among
    its causes a bounded :class:`BatchFailed` (the package README, "Facts about Spark…": what it keeps, and why)."""
    java = [one for one in causes(error, shown=True) if f"{type(one).__module__}.{type(one).__name__}" == _PY4J_ERROR]
    if not java:
        return error
    message = first_line(error) if java[0] is error else shown_error(error, message=True)
    lines = [f"batch {batch_id} failed: {type(error).__name__}: {message.split(_PY4J_ERROR)[0][:_MESSAGE_CHARS]}"]
    header, *rest = shown_error(java[-1], message=True).splitlines() or [""]
    thrown = [line for line in rest if line.strip() and not line[:1].isspace()]   # (not its "\tat" frames)
    cancelled = [line for line in thrown if "cancelled" in line][:1]
    lines += [line if len(line) <= _LINE_CHARS else f"{line[:_LINE_CHARS - 1]}…" for line in
              [f"{_PY4J_ERROR}: {header}", *dict.fromkeys(thrown[:1] + cancelled + thrown[-1:])]]
    return BatchFailed("\n".join(lines))


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
            except Exception as error:
                self.error = error
                if (bounded := for_spark(error, batch_id)) is error:     # (the sink's BatchFailed: as it is)
                    raise
                raise bounded from None

    return RunBatchFunction
