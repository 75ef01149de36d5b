"""spark_bridge — the Spark connector of activedb's ingestion core (``activedb.ingest``): PySpark Structured
Streaming into activedb, exactly once.  The design note is ``spark_bridge/README.md``.

Public interface:

* :func:`ingest` (its options: :class:`IngestOptions`, or their fields as keywords; where a batch goes is one
  ``handler=``) — each micro-batch of a streaming DataFrame becomes one top-level transaction committed with its
  ledger row; returns the ``StreamingQuery``; :func:`sink_of`, :func:`end_of_stream`, :class:`IngestSink` (an
  ``activedb.ingest.Ingestion`` with Spark's parts), :class:`PartitionedIngestSink` (the scale-out path);
* :class:`EventMapping` (``activedb.ingest``'s, re-exported: a query's columns);
* :func:`load_app`, :class:`LoadedApp` — an application module for ``activedb run``;
* :func:`get_spark` — a local SparkSession set up for ingestion;
* :func:`streaming_query_id` — inside ``foreachBatch``, the id of the query that produced the batch;
  :func:`write_event_files` — events as JSON-lines files a file source reads one micro-batch each, in order;
* :mod:`spark_bridge.errors` — every error this package raises.

The ledger, validation, handlers, outcomes and replay are ``activedb.ingest``'s.  Importing this package never
imports pyspark or starts Java; :func:`get_spark` does.
"""

from typing import TYPE_CHECKING

from activedb import lazy

from spark_bridge import errors

# imported on first use: `import spark_bridge` stays fast (the CLI's start)
_EXPORTS = {
    "activedb.ingest": ["EventMapping"],
    "activedb.cli.application": ["LoadedApp", "load_app"],
    "spark_bridge._ingest": ["IngestOptions", "end_of_stream", "ingest", "sink_of"],
    "spark_bridge._scaleout": ["PartitionedIngestSink"],
    "spark_bridge._sink": ["IngestSink", "streaming_query_id"],
    "spark_bridge._sources": ["write_event_files"],
    "spark_bridge.session": ["get_spark"],
}
__all__ = ["errors", *sorted(name for names in _EXPORTS.values() for name in names)]
__getattr__, __dir__ = lazy.exports(__name__, _EXPORTS)

if TYPE_CHECKING:  # the names above, for type checkers (tests/test_typing.py keeps both lists equal)
    from activedb.cli.application import LoadedApp as LoadedApp, load_app as load_app
    from activedb.ingest import EventMapping as EventMapping
    from spark_bridge._ingest import (
        IngestOptions as IngestOptions, end_of_stream as end_of_stream, ingest as ingest, sink_of as sink_of)
    from spark_bridge._scaleout import PartitionedIngestSink as PartitionedIngestSink
    from spark_bridge._sink import IngestSink as IngestSink, streaming_query_id as streaming_query_id
    from spark_bridge._sources import write_event_files as write_event_files
    from spark_bridge.session import get_spark as get_spark
