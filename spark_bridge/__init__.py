"""spark_bridge — PySpark Structured Streaming into activedb, exactly once.  The design note is
``spark_bridge/README.md``.

Public interface:

* :func:`ingest` (its options: :class:`IngestOptions`, or their fields as keywords) — each micro-batch of
  a streaming DataFrame becomes one top-level transaction committed with its ledger row; returns the
  ``StreamingQuery``; :func:`sink_of`, :class:`IngestSink` (also without Spark:
  :meth:`IngestSink.process`), :class:`PartitionedIngestSink`, :class:`IngestStatistics`,
  :class:`BatchOutcome`, :class:`PhaseTimings`;
* :class:`BatchHandler`, :class:`BatchInput` — a batch's path (the rules, stream queries, TPG,
  composition, or your own); :func:`end_of_stream`;
* :func:`ingestion_status`, :class:`QueryStatus`, :class:`IngestionLedger`, :func:`batch_committed`,
  :func:`ledger_query_id`, :func:`parse_ledger_query_id` — the ledger;
* :func:`load_app`, :class:`LoadedApp` — an application module for ``activedb run``;
* :func:`get_spark` — a local SparkSession set up for ingestion;
* :class:`EventMapping`, :func:`as_mapping`, :func:`rows_to_events`, :class:`RawEvent`, :class:`Rejected`;
* :mod:`spark_bridge.errors` — every error this package raises.

Importing this package never imports pyspark or starts Java; :func:`get_spark` does.
"""

from activedb import lazy

from spark_bridge import errors

# imported on first use: `import spark_bridge` stays fast (the CLI's start)
_EXPORTS = {
    "spark_bridge._app": ["LoadedApp", "load_app"],
    "activedb.ingest._protocol": ["BatchHandler", "BatchInput", "end_of_stream"],
    "spark_bridge._ingest": ["IngestOptions", "ingest", "sink_of"],
    "activedb.ingest._ledger": ["IngestionLedger", "QueryStatus", "batch_committed", "ingestion_status",
                             "ledger_query_id", "parse_ledger_query_id"],
    "activedb.ingest._outcome": ["BatchOutcome", "IngestStatistics", "PhaseTimings"],
    "spark_bridge._scaleout": ["PartitionedIngestSink"],
    "spark_bridge._sink": ["IngestSink"],
    "activedb.ingest._mapping": ["EventMapping", "RawEvent", "Rejected", "as_mapping", "rows_to_events"],
    "spark_bridge.session": ["get_spark"],
}
__all__ = ["errors", *sorted(name for names in _EXPORTS.values() for name in names)]
__getattr__, __dir__ = lazy.exports(__name__, _EXPORTS)
