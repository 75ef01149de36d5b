"""``ingest()``: attach a Structured Streaming DataFrame to an activedb database.

See ``spark_bridge/README.md`` (exactly once, the watermark, the scale-out path) and the
docstrings of :mod:`spark_bridge._sink` and :mod:`spark_bridge._scaleout`.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from activedb.ingest._mapping import EventMapping, as_mapping
from activedb.ingest._protocol import BatchHandler

from spark_bridge._app import portable_spec
from spark_bridge._foreach import foreach_batch
from spark_bridge._scaleout import PartitionedIngestSink
from spark_bridge._sink import IngestSink, QueryRun
from spark_bridge.errors import IngestError, MappingError

__all__ = ["IngestOptions", "ingest", "sink_of"]

#: The attribute of the returned StreamingQuery (or DataStreamWriter) holding the sink.
SINK_ATTRIBUTE = "activedb_sink"


def _check_columns(streaming_df: Any, mapping: EventMapping) -> None:
    columns = list(streaming_df.columns)
    wanted = [mapping.type_column, mapping.key_column, mapping.ts_column, *(mapping.payload_columns or ())]
    missing = [column for column in wanted if column not in columns]
    if missing:
        raise IngestError(
            f"the stream has no column {missing[0]!r} named by the mapping (its columns: {columns}); "
            f"fix the EventMapping or select/rename the columns before ingest()")


@dataclass(frozen=True)
class IngestOptions:
    """How :func:`ingest` runs a query beyond its mapping, name and checkpoint; checked when built
    (every check of ``ingest()``'s options is here).  Immutable.  ``ingest(…, **fields)`` builds one.

    * ``trigger`` — ``None`` (batches back to back), ``"5 seconds"``/``5``, or keyword arguments for
      ``DataStreamWriter.trigger`` (``{"availableNow": True}``);
    * ``known_types`` — accepted event types (default: the path's, for the rules the types they listen to);
    * ``prefetch`` — rule path: ``{table: None | payload field | callable}``, rows loaded per batch in one
      query (``None``: the event key is the row key);
    * ``lower_declared`` — rule path: a batch whose every event type fires one declared rule
      (``@batch.declared``) runs as one batch of state transactions at commit when that is the same as
      firing them (default True; ``activedb/batch/README.md``, "Declared rules"); False fires them event
      by event (to compare, or to debug one firing at a time);
    * ``watermark_delay`` — applies ``withWatermark(mapping.ts_column, delay)`` (the column must be a Spark
      timestamp); a watermark declared on the frame works as well.  The batch's Spark watermark is
      punctuated after the batch commits (``db.punctuate(query_name, watermark)``) and events older than it
      are dead letters;
    * ``start=False`` — return the ``DataStreamWriter`` (sink in ``writer.activedb_sink``) to configure and
      start; ``on_phase(phase, batch_id)`` — a seam for crash tests (``_outcome.PHASES``);
    * ``lineage`` — every batch transaction records the source batch it consumed (``db.batches``);
    * the path of a batch, at most one (the rules without any): ``queries`` (+ ``scheduler``) — stream
      engines (``activedb.streams.StreamEngine`` built with ``record_dead_letters=False``; one, a list, or a
      factory ``factory(db, scheduler=…)``), the watermark as punctuation, ``scheduler`` (``"sei"``,
      ``"s2pl"``, ``"lwm"`` or a ``streams.Scheduler``) the engines' own; ``executor="tpg"`` and
      ``transactions`` (``activedb.batch.StateTransactions``, planned per batch at commit);
      ``composition`` (an ``activedb.composite.CompositionEngine``, a mapping with ``producer_column``);
    * the scale-out path (``_scaleout.py``), rules only: ``partition_by_key=N`` — each batch repartitioned by
      key into ``N`` Spark tasks, each applying its partition in its own engine that registers ``app``'s
      rules (``connect_options`` go to its ``activedb.connect``); ``on_partition_failure`` — ``"forward"``
      (default: the query fails; after the fix a restart completes the batch) or ``"compensate"`` (the
      committed partitions are compensated, the failed one's rows become dead letters; ``_atomic.py``).
    """

    trigger: Any = None
    known_types: Collection[str] | None = None
    prefetch: Mapping[str, Any] | None = None
    lower_declared: bool = True
    watermark_delay: str | dt.timedelta | None = None
    start: bool = True
    on_phase: Callable[[str, int], None] | None = None
    lineage: bool = True
    queries: Any = None
    scheduler: Any = None
    executor: str | None = None
    transactions: Any = None
    composition: Any = None
    partition_by_key: int | None = None
    app: str | Callable[[Any], Any] | None = None
    connect_options: Mapping[str, Any] | None = None
    on_partition_failure: str | None = None

    def __post_init__(self) -> None:
        if self.executor not in (None, "rules", "tpg"):
            raise IngestError(f"executor must be 'rules' (the default: events through the rules, one subtransaction "
                              f"each) or 'tpg' (declared state transactions planned per batch); got {self.executor!r}")
        path = self.path()
        if self.transactions is not None and self.executor != "tpg":
            raise IngestError("transactions= is for executor='tpg': pass ingest(…, executor='tpg', transactions=…)")
        if self.executor == "tpg" and self.transactions is None:
            raise IngestError("executor='tpg' needs transactions=batch.StateTransactions() declaring each event "
                              "type's state transaction (see activedb/batch/README.md)")
        if self.scheduler is not None and self.queries is None:
            raise IngestError("scheduler= chooses the stream engine's scheduler (sei, s2pl, lwm): pass queries=engine "
                              "too; the rule path and executor='tpg' have no such choice")
        if path is not None and self.partition_by_key is not None:
            instead = {"queries=": "for concurrency inside a batch use scheduler='s2pl' or 'lwm' (one engine orders "
                                   "events across keys)",
                       "executor='tpg'": "the planner splits a batch into independent components itself: use "
                                         "batch.StateTransactions(processes=N)",
                       "composition=": "a composition spans producers and keys, so it runs in one engine"}[path]
            raise IngestError(f"partition_by_key= (the scale-out path) does not combine with {path}: {instead}")
        if not isinstance(self.lower_declared, bool):
            raise IngestError(f"lower_declared must be True or False, got {self.lower_declared!r}")
        if path is not None and not self.lower_declared:
            raise IngestError(f"lower_declared= is for the rule path (declared rules fired by the events); {path} "
                              f"runs no rules per event")
        if path is not None and self.prefetch:
            raise IngestError(f"prefetch= is for the rule path; with {path} rows are loaded by the engine (stream "
                              f"engines prefetch what their access plans name; the TPG batch reads its declared rows "
                              f"FOR UPDATE)")
        if self.partition_by_key is None and (self.app is not None or self.on_partition_failure is not None):
            raise IngestError(f"{'app=' if self.app is not None else 'on_partition_failure='} is for the scale-out "
                              f"path only (with partition_by_key=N); without it a batch is one transaction, atomic "
                              f"by itself, and the rules registered on db are used")
        if not (self.trigger is None or isinstance(self.trigger, (str, Mapping))
                or (isinstance(self.trigger, (int, float)) and not isinstance(self.trigger, bool))):
            raise IngestError(
                f"trigger must be None, a processing-time interval ('5 seconds' or 5), or keyword arguments of "
                f"DataStreamWriter.trigger such as {{'availableNow': True}}; got {self.trigger!r}")

    def path(self) -> str | None:
        """The option choosing a batch's path other than the rules (``"queries="``, …), or None."""
        given = {"queries=": self.queries is not None, "executor='tpg'": self.executor == "tpg",
                 "composition=": self.composition is not None}
        chosen = [name for name, present in given.items() if present]
        if len(chosen) > 1:
            raise IngestError(
                f"{' and '.join(chosen)} are different paths for a batch; choose one per query (start two ingest() "
                f"queries over the same source, each with its own query_name and checkpoint, to feed both)")
        return chosen[0] if chosen else None

    def handler(self, db: Any, mapping: EventMapping) -> BatchHandler | None:
        """The path's handler (None: the sink's rule path)."""
        if self.queries is not None:
            from activedb.streams._ingest import QueriesHandler, build_engines

            return QueriesHandler(build_engines(db, self.queries, self.scheduler), mapping.key_column)
        if self.executor == "tpg":
            from activedb.batch._ingest import TpgHandler

            return TpgHandler(self.transactions)
        if self.composition is not None:
            from activedb.composite._ingest import CompositeHandler

            return CompositeHandler(self.composition, mapping)
        return None


def ingest(db: Any, streaming_df: Any, *, mapping: EventMapping, query_name: str,
           checkpoint_location: str | None = None, options: IngestOptions | None = None, **fields: Any) -> Any:
    """Feed ``streaming_df`` into ``db``'s rules (or the path ``options`` choose), one micro-batch per
    top-level transaction, exactly once; return the started ``StreamingQuery`` (its sink is
    ``query.activedb_sink``).

    * ``mapping`` — which columns give the event type, key, timestamp and payload;
    * ``query_name`` — the query's stable name: Spark's query name, the punctuation source,
      and the first half of the ledger's query id ``NAME@SPARK_QUERY_ID`` (the second half
      comes from the checkpoint, so a new checkpoint is a new query in the ledger);
    * ``checkpoint_location`` — required: where Spark keeps the query id and the offsets of
      every planned batch; restarting from it re-runs the last unfinished batch with the
      same id, which the ledger then applies or skips;
    * ``options`` — an :class:`IngestOptions`, or its fields as keywords (``trigger=``, ``known_types=``,
      ``prefetch=``, ``watermark_delay=``, ``queries=``, ``partition_by_key=``, …).

    pyspark is needed only for the DataFrame itself; nothing else here imports it.
    """
    if not checkpoint_location:
        raise IngestError(
            "ingest() needs checkpoint_location=DIR: Spark keeps the query's id and every planned batch's "
            "offsets there, and exactly-once rests on re-running an unfinished batch with the same id after a "
            "restart. Pass a directory that survives restarts, one per query, e.g. "
            "checkpoint_location='/var/lib/myapp/checkpoints/" + str(query_name) + "'")
    if options is not None and fields:
        raise IngestError(f"pass options=IngestOptions(…) or its fields as keywords, not both (got options= and "
                          f"{', '.join(sorted(fields))}=)")
    unknown = sorted(set(fields) - {field.name for field in dataclasses.fields(IngestOptions)})
    if unknown:
        raise IngestError(f"ingest() has no option {unknown[0]!r}; the options are the fields of IngestOptions: "
                          f"{', '.join(field.name for field in dataclasses.fields(IngestOptions))}")
    options = options or IngestOptions(**fields)
    try:
        mapping = as_mapping(mapping)
    except MappingError as error:
        raise IngestError(f"mapping: {error}") from None
    if not getattr(streaming_df, "isStreaming", False):
        raise IngestError(
            "ingest() needs a streaming DataFrame (spark.readStream...); for a static DataFrame use "
            "IngestSink(db, mapping, query_name=...).process(df.toArrow(), batch_id, query_id=...)")
    _check_columns(streaming_df, mapping)
    if options.watermark_delay is not None:
        delay = options.watermark_delay
        if isinstance(delay, dt.timedelta):
            delay = f"{int(delay.total_seconds() * 1000)} milliseconds"
        column_type = dict(streaming_df.dtypes).get(mapping.ts_column)
        if column_type not in ("timestamp", "timestamp_ntz"):
            raise IngestError(
                f"watermark_delay needs {mapping.ts_column!r} to be a Spark timestamp, but it is {column_type}; "
                f"convert it first, e.g. df.withColumn({mapping.ts_column!r}, "
                f"F.timestamp_seconds({mapping.ts_column!r}))")
        streaming_df = streaming_df.withWatermark(mapping.ts_column, delay)

    session = streaming_df.sparkSession
    common = dict(query_name=query_name, known_types=options.known_types, prefetch=options.prefetch,
                  spark_session=session, on_phase=options.on_phase, lower_declared=options.lower_declared)
    if options.partition_by_key is None:
        sink: IngestSink = IngestSink(db, mapping, handler=options.handler(db, mapping), **common)
        sink.record_lineage = options.lineage
    else:
        sink = PartitionedIngestSink(db, mapping, partitions=options.partition_by_key,
                                     app=None if options.app is None else portable_spec(options.app),
                                     connect_options=options.connect_options,
                                     on_partition_failure=options.on_partition_failure or "forward",
                                     lineage=options.lineage, **common)
    run = QueryRun(sink)      # told the query once start() returns: its batches need not ask Spark for it
    # One session wrapper per run (_foreach): only for the run started here — a writer handed back could be
    # started more than once, each start a run of its own with a session of its own.
    writer = streaming_df.writeStream
    writer = (foreach_batch(writer, run) if options.start else writer.foreachBatch(run)).queryName(query_name)
    writer = writer.option("checkpointLocation", str(checkpoint_location))
    trigger = options.trigger
    if isinstance(trigger, (int, float)):
        trigger = f"{trigger} seconds"
    if isinstance(trigger, str):
        writer = writer.trigger(processingTime=trigger)
    elif trigger is not None:
        writer = writer.trigger(**trigger)         # a Mapping (IngestOptions checked it)
    setattr(writer, SINK_ATTRIBUTE, sink)
    if not options.start:
        return writer
    query = writer.start()
    run.started(query)
    setattr(query, SINK_ATTRIBUTE, sink)
    return query


def sink_of(query_or_writer: Any) -> IngestSink:
    """The :class:`IngestSink` behind a query (or writer) made by :func:`ingest`."""
    sink = getattr(query_or_writer, SINK_ATTRIBUTE, None)
    if sink is None:
        raise IngestError("this query was not started by spark_bridge.ingest()")
    return sink
