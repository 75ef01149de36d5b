"""spark_bridge — PySpark Structured Streaming into activedb, exactly once.

Public interface:

* :func:`ingest` (its options: :class:`IngestOptions`, or their fields as keywords) — attach a
  streaming DataFrame to a database: each micro-batch becomes one top-level transaction (an
  event per subtransaction, the rules on ``db.stream(type)`` fire inside it), committed
  together with its ledger row; bad rows and rejected events go to the dead-letter table;
  the batch's watermark becomes a punctuation. With ``partition_by_key=N`` the batch is split
  by key over ``N`` Spark tasks, each with its own engine (the scale-out path). Returns the
  ``StreamingQuery``;
* :class:`IngestSink` (the ``foreachBatch`` callable, also usable without Spark through
  :meth:`IngestSink.process`), :class:`PartitionedIngestSink`, :func:`sink_of`,
  :class:`IngestStatistics`, :class:`BatchOutcome`, :class:`PhaseTimings`;
* ``ingest(…, queries=engine, scheduler=…)`` (stream engines), ``ingest(…, executor="tpg",
  transactions=…)`` (declared state transactions), ``ingest(…, composition=engine)`` (many
  producers) — each path, the rules' too, a :class:`BatchHandler` (given a :class:`BatchInput`) run
  by the one batch protocol (``IngestSink(…, handler=…)`` takes one of your own); :func:`end_of_stream`
  releases what a stream engine still buffers once a bounded source ended;
* :func:`ingestion_status`, :class:`QueryStatus` — what the ledger says was committed;
  :func:`ledger_query_id`, :func:`parse_ledger_query_id`;
* :func:`load_app`, :class:`LoadedApp` — an application module (``register(db)``,
  ``MAPPING``, ...) for ``activedb run`` and the scale-out tasks;
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
from activedb import lazy

__all__ = [
    "BatchHandler",
    "BatchInput",
    "BatchOutcome",
    "EventMapping",
    "IngestionLedger",
    "IngestOptions",
    "IngestSink",
    "IngestStatistics",
    "LoadedApp",
    "PartitionedIngestSink",
    "PhaseTimings",
    "QueryStatus",
    "RawEvent",
    "Rejected",
    "as_mapping",
    "batch_committed",
    "end_of_stream",
    "errors",
    "get_spark",
    "ingest",
    "ingestion_status",
    "ledger_query_id",
    "load_app",
    "parse_ledger_query_id",
    "rows_to_events",
    "sink_of",
]

# imported on first use: `import spark_bridge` stays fast (the CLI's start)
__getattr__, __dir__ = lazy.exports(__name__, {
    "spark_bridge._app": ["LoadedApp", "load_app"],
    "spark_bridge._handler": ["BatchHandler", "BatchInput", "end_of_stream"],
    "spark_bridge._ingest": ["IngestOptions", "ingest", "sink_of"],
    "spark_bridge._ledger": [
        "IngestionLedger", "QueryStatus", "batch_committed", "ingestion_status", "ledger_query_id",
        "parse_ledger_query_id",
    ],
    "spark_bridge._scaleout": ["PartitionedIngestSink"],
    "spark_bridge._sink": ["BatchOutcome", "IngestSink", "IngestStatistics", "PhaseTimings"],
    "spark_bridge.mapping": ["EventMapping", "RawEvent", "Rejected", "as_mapping", "rows_to_events"],
    "spark_bridge.session": ["get_spark"],
})
