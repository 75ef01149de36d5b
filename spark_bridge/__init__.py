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

from typing import TYPE_CHECKING

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

if TYPE_CHECKING:  # the names above, for type checkers (tests/test_typing.py keeps both lists equal)
    from spark_bridge._app import LoadedApp as LoadedApp, load_app as load_app
    from activedb.ingest._protocol import (
        BatchHandler as BatchHandler, BatchInput as BatchInput, end_of_stream as end_of_stream)
    from spark_bridge._ingest import IngestOptions as IngestOptions, ingest as ingest, sink_of as sink_of
    from activedb.ingest._ledger import (
        IngestionLedger as IngestionLedger, QueryStatus as QueryStatus, batch_committed as batch_committed,
        ingestion_status as ingestion_status, ledger_query_id as ledger_query_id,
        parse_ledger_query_id as parse_ledger_query_id)
    from activedb.ingest._outcome import (
        BatchOutcome as BatchOutcome, IngestStatistics as IngestStatistics, PhaseTimings as PhaseTimings)
    from spark_bridge._scaleout import PartitionedIngestSink as PartitionedIngestSink
    from spark_bridge._sink import IngestSink as IngestSink
    from activedb.ingest._mapping import (
        EventMapping as EventMapping, RawEvent as RawEvent, Rejected as Rejected, as_mapping as as_mapping,
        rows_to_events as rows_to_events)
    from spark_bridge.session import get_spark as get_spark
