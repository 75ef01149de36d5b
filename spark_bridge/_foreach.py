"""``foreachBatch`` for a :class:`~spark_bridge._sink.QueryRun`, without PySpark's per-batch session wrapper.

PySpark's ``DataStreamWriter.foreachBatch(func)`` registers a Python callback (``ForeachBatchFunction``) that, for
every micro-batch, asks the JVM for the batch's session and builds a new Python ``SparkSession`` around it before it
calls ``func`` — three py4j calls and a few more in the constructor, each slow after Spark's turn, for a session that is the same object for every batch of a run (Spark
clones the session once per ``StreamExecution``).  :func:`foreach_batch` registers a subclass that wraps the first
batch's session once and hands every batch ``DataFrame(jdf, that session)``; errors are recorded and re-raised as
PySpark's own wrapper does.

It uses PySpark internals (``DataStreamWriter._spark`` and ``._jwrite``, ``PythonForeachBatchHelper``,
``ensure_callback_server_started``): where they are missing (another PySpark, Spark Connect) the public
``foreachBatch`` is used instead, with the same result.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:  # pragma: no cover
    from py4j.java_gateway import JavaObject
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.readwriter import DataStreamWriter

__all__ = ["foreach_batch"]


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
                raise error

    return RunBatchFunction
