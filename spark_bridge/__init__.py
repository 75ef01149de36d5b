"""spark_bridge — PySpark Structured Streaming into activedb.

Public interface (so far; the engine-facing ``ingest`` comes with the nested-transaction
engine):

* :func:`get_spark` — a local SparkSession set up for ingestion (UI off, two shuffle
  partitions, WARN logging, fast checkpoint log), with Java found or provided first;
* :class:`EventMapping`, :func:`rows_to_events`, :class:`RawEvent`, :class:`Rejected` —
  which columns make an event, and the validation that splits a micro-batch into
  events (sorted by application time) and rejected rows (with a reason);
* :mod:`spark_bridge.errors` — every error this package raises.

Importing this package never imports pyspark or starts Java; :func:`get_spark` does.
The design note is ``spark_bridge/README.md``.
"""

from spark_bridge import errors
from spark_bridge.mapping import EventMapping, RawEvent, Rejected, rows_to_events
from spark_bridge.session import get_spark

__all__ = ["EventMapping", "RawEvent", "Rejected", "errors", "get_spark", "rows_to_events"]
