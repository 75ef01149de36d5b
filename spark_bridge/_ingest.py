"""``ingest()``: attach a Structured Streaming DataFrame to an activedb database — the Spark connector of the
ingestion core (``activedb.ingest``); ``sink_of(query)``, ``end_of_stream(query)``.

See ``spark_bridge/README.md`` (the watermark, the scale-out path) and the docstrings of
:mod:`spark_bridge._sink` and :mod:`spark_bridge._scaleout`; the batch protocol is ``activedb/ingest/README.md``.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import difflib
import os
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, overload

import activedb
from activedb.atomic import SplitFailure, as_policy
from activedb.cli.application import Register, portable_spec
from activedb.events import TimeUnit
from activedb.ingest import (BatchHandler, Deadlines, EventMapping, Ingestion, Phase, RulesHandler, as_mapping,
                             known_type_names)
from activedb.lowlevel import check_switch

from spark_bridge._foreach import foreach_batch
from spark_bridge._scaleout import PartitionedIngestSink
from spark_bridge._sink import (WATERMARK_METADATA, IngestSink, QueryRun, SinkOptions, by_position, check_arrow_types,
                                check_columns, check_key_type, check_watermark_column, watermark_columns)
from spark_bridge.errors import IngestError, MappingError, first_line

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame
    from pyspark.sql.streaming.query import StreamingQuery
    from pyspark.sql.streaming.readwriter import DataStreamWriter

    from activedb import Database

__all__ = ["IngestOptions", "end_of_stream", "ingest", "sink_of"]

#: The attribute of the returned StreamingQuery (or DataStreamWriter) holding the sink.
SINK_ATTRIBUTE = "activedb_sink"


#: Options ``ingest()`` had before a batch's path became one handler object: what to pass instead.
_MOVED = {"queries": "handler=streams.QueriesHandler(engine_or_factory, scheduler=…)",
          "scheduler": "handler=streams.QueriesHandler(engine_or_factory, scheduler=…)",
          "executor": "handler=batch.TpgHandler(transactions)",
          "transactions": "handler=batch.TpgHandler(transactions)",
          "composition": "handler=composite.CompositeHandler(engine)",
          "prefetch": "handler=activedb.ingest.RulesHandler(prefetch=…)",
          "lower_declared": "handler=activedb.ingest.RulesHandler(lower_declared=…)"}

#: ``DataStreamWriter.trigger``'s keywords of the triggers that run no micro-batches (Spark refuses ``foreachBatch``
#: with them).
_NO_MICRO_BATCHES = frozenset({"continuous", "realTime"})


@dataclass(frozen=True)
class IngestOptions:
    """How :func:`ingest` runs a query beyond its mapping, name and checkpoint; checked when built
    (every check of ``ingest()``'s options is here).  Immutable.  ``ingest(…, **fields)`` builds one.

    * ``handler`` — where each batch goes (an ``activedb.ingest.BatchHandler``): the rules by default
      (``activedb.ingest.RulesHandler(prefetch=…, lower_declared=…)``), ``streams.QueriesHandler(engine,
      scheduler=…)`` (stream engines; the watermark as punctuation), ``batch.TpgHandler(transactions)`` (declared
      state transactions planned per batch), ``composite.CompositeHandler(engine)`` (a mapping with
      ``producer_column``); one handler object feeds one query;
    * ``trigger`` — ``None`` (batches back to back), ``"5 seconds"``/``5``, or keyword arguments for
      ``DataStreamWriter.trigger`` (``{"availableNow": True}``; not ``continuous`` or ``realTime``, which run no
      micro-batches);
    * ``known_types`` — accepted event types (default: the handler's, for the rules the types they listen to);
    * ``watermark_delay`` — applies ``withWatermark(mapping.ts_column, delay)`` (the column must be a Spark
      timestamp); a watermark declared on the frame works as well, on that column, instead of this option (both
      together are refused: Spark refuses a redefined watermark once the first batch ran; one on another column
      is refused: Spark's watermark would be that column's).  The batch's Spark watermark is
      punctuated after the batch commits (``db.punctuate(query_name, watermark)``) and events older than it
      are dead letters;
    * ``start=False`` — return the ``DataStreamWriter`` (sink in ``writer.activedb_sink``) to configure and
      start; ``on_phase(phase, batch_id)`` — a seam for crash tests (``activedb.ingest.Phase``);
    * ``lineage`` — every batch transaction records the source batch it consumed (``db.batches``; on by default
      here, as the atomic batch features need it: ``on_partition_failure=COMPENSATE`` without it is refused);
    * the scale-out path (``_scaleout.py``), the rule path only: ``partition_by_key=N`` — each batch repartitioned
      by key into ``N`` Spark tasks, each applying its partition in its own engine that registers ``app``'s
      rules (``connect_options`` go to its ``activedb.connect``, pickled with the task: one that cannot be, such as a
      ``ManualClock``, is refused naming it, and so are those ``connect`` would refuse; ``prefetch`` and
      ``lower_declared`` are the handler's); ``on_partition_failure`` — an ``activedb.atomic.SplitFailure``: ``FORWARD`` (default: the query
      fails; after the fix a restart completes the batch) or ``COMPENSATE`` (the committed partitions are
      compensated, the failed one's rows become dead letters; ``activedb.atomic``'s split batches).
    * ``deadlines`` — how long a batch, and a rule firing in it, may run (``activedb.ingest.Deadlines``; the batch
      in progress is then seen by ``activedb status`` and the metrics): past one, the batch fails with
      ``BatchDeadlineExceeded`` (the query stops with it) and the thread that did not return is abandoned — the
      process should end or restart (``activedb run`` restarts itself).  Not on the scale-out path, whose batches
      run in Spark's tasks (refused with ``partition_by_key``).
    """

    handler: BatchHandler | None = None
    trigger: str | float | Mapping[str, object] | None = None
    known_types: Collection[str] | None = None
    watermark_delay: str | dt.timedelta | None = None
    start: bool = True
    on_phase: Callable[[Phase, int], None] | None = None
    lineage: bool = True
    partition_by_key: int | None = None
    app: str | Register | None = None
    connect_options: Mapping[str, object] | None = None
    on_partition_failure: SplitFailure | None = None
    deadlines: Deadlines | None = None

    def __post_init__(self) -> None:
        if self.deadlines is not None and not isinstance(self.deadlines, Deadlines):
            raise IngestError(f"deadlines must be an activedb.ingest.Deadlines (or None), got {self.deadlines!r}")
        if self.handler is not None and not isinstance(self.handler, BatchHandler):
            raise IngestError(f"handler must be an activedb.ingest.BatchHandler (RulesHandler, streams.QueriesHandler, "
                              f"batch.TpgHandler, composite.CompositeHandler, or your own); got {self.handler!r}")
        if self.partition_by_key is not None and not isinstance(self.handler, (RulesHandler, type(None))):
            instead = {"queries": "for concurrency inside a batch use scheduler='s2pl' or 'lwm' (one engine orders "
                                  "events across keys)",
                       "tpg": "the planner splits a batch into independent components itself: use "
                              "batch.StateTransactions(processes=N)",
                       "composite": "a composition spans producers and keys, so it runs in one engine"}
            raise IngestError(f"partition_by_key= (the scale-out path) runs the rules in each Spark task; it does not "
                              f"combine with the {self.handler.name} handler: "
                              f"{instead.get(self.handler.name, 'run it without partition_by_key')}")
        if self.partition_by_key is not None and self.deadlines is not None:
            raise IngestError("deadlines= does not combine with partition_by_key=: the scale-out path's batches run "
                              "in Spark's tasks, processes of their own that no deadline watches; leave deadlines "
                              "out, or run without partition_by_key to have them")
        known_type_names(self.known_types, "known_types", IngestError)
        check_switch("ingest", "start", self.start, error=IngestError)
        if self.on_partition_failure is not None:
            object.__setattr__(self, "on_partition_failure", as_policy(self.on_partition_failure))
        scale_out_only = [name for name in ("app", "on_partition_failure", "connect_options")
                          if getattr(self, name) is not None]
        if self.app is not None and not (callable(self.app) or (isinstance(self.app, (str, os.PathLike))
                                                                and str(self.app).strip())):
            raise IngestError(f"app={self.app!r} names the application whose rules each Spark task of the scale-out "
                              f"path registers: give a module name, a .py path or a register(db) function")
        if self.connect_options is not None and not (isinstance(self.connect_options, Mapping)
                                                     and all(isinstance(name, str) for name in self.connect_options)):
            raise IngestError(f"connect_options={self.connect_options!r} takes a dict of activedb.connect's keywords "
                              f"(the scale-out tasks connect with them), e.g. {{'lock_timeout': 5.0}}")
        if self.partition_by_key is None and scale_out_only:
            raise IngestError(f"{scale_out_only[0]}= is for the scale-out path only (with partition_by_key=N); without "
                              f"it a batch is one transaction, atomic by itself, on db's own connections, and the "
                              f"rules registered on db are used")
        if not (self.trigger is None or isinstance(self.trigger, (str, Mapping))
                or (isinstance(self.trigger, (int, float)) and not isinstance(self.trigger, bool))):
            raise IngestError(
                f"trigger must be None, a processing-time interval ('5 seconds' or 5), or keyword arguments of "
                f"DataStreamWriter.trigger such as {{'availableNow': True}}; got {self.trigger!r}")
        streaming = sorted(set(self.trigger) & _NO_MICRO_BATCHES) if isinstance(self.trigger, Mapping) else []
        if streaming:
            raise IngestError(
                f"trigger={self.trigger!r} runs no micro-batches: ingest() applies each micro-batch in one transaction "
                f"(foreachBatch), which Spark does not run with the {streaming[0]} trigger; give a processing-time "
                f"interval ('5 seconds', or 5), {{'availableNow': True}} or {{'once': True}}, or None (batches back to "
                f"back)")


@overload
def ingest(db: Database, streaming_df: DataFrame, *, mapping: EventMapping, query_name: str,
           checkpoint_location: str | None = None, options: None = None, start: Literal[True] = True,
           **fields: object) -> StreamingQuery: ...


@overload
def ingest(db: Database, streaming_df: DataFrame, *, mapping: EventMapping, query_name: str,
           checkpoint_location: str | None = None, options: None = None, start: Literal[False],
           **fields: object) -> DataStreamWriter: ...


@overload
def ingest(db: Database, streaming_df: DataFrame, *, mapping: EventMapping, query_name: str,
           checkpoint_location: str | None = None, options: IngestOptions) -> StreamingQuery | DataStreamWriter: ...


def ingest(db: Database, streaming_df: DataFrame, *, mapping: EventMapping, query_name: str,
           checkpoint_location: str | None = None, options: IngestOptions | None = None, **fields: object
           ) -> StreamingQuery | DataStreamWriter:
    """Feed ``streaming_df`` into ``db``'s rules (or the handler ``options`` names), one micro-batch per
    top-level transaction, exactly once; return the started ``StreamingQuery`` (its sink is
    ``query.activedb_sink``), or with ``start=False`` the ``DataStreamWriter`` to start.

    * ``mapping`` — which columns give the event type, key, timestamp and payload;
    * ``query_name`` — the query's stable name: Spark's query name, the punctuation source,
      and the first half of the ledger's query id ``NAME@SPARK_QUERY_ID`` (the second half
      comes from the checkpoint, so a new checkpoint is a new query in the ledger);
    * ``checkpoint_location`` — required: where Spark keeps the query id and the offsets of
      every planned batch; restarting from it re-runs the last unfinished batch with the
      same id, which the ledger then applies or skips;
    * ``options`` — an :class:`IngestOptions`, or its fields as keywords (``handler=``, ``trigger=``,
      ``known_types=``, ``watermark_delay=``, ``partition_by_key=``, …).

    pyspark is needed only for the DataFrame itself; nothing else here imports it.  A call that fails leaves
    nothing behind: once the sink is built, Spark's refusal of the trigger or the query closes it.
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
    if options is not None and not isinstance(options, IngestOptions):
        raise IngestError(f"options= takes an IngestOptions(…), got {options!r}; build one "
                          f"(spark_bridge.IngestOptions(trigger=…, …)) or give its fields as keywords of ingest()")
    names = [field.name for field in dataclasses.fields(IngestOptions)]
    unknown = sorted(set(fields) - set(names))
    if unknown:
        hints = []
        for name in difflib.get_close_matches(unknown[0], [*names, *_MOVED], n=1, cutoff=0.75):
            hints += [] if name == unknown[0] else [f"did you mean {name}=?"]
            hints += [f"{name}= is the handler's now: {_MOVED[name]}"] if name in _MOVED else []
        hint = f" ({' '.join(hints)})" if hints else ""
        raise IngestError(f"ingest() has no option {unknown[0]!r}{hint}; the options are the fields of IngestOptions: "
                          f"{', '.join(names)}")
    # (the names were checked above; IngestOptions checks the values)
    options = options or IngestOptions(**fields)  # type: ignore[arg-type]
    try:
        mapping = as_mapping(mapping)
    except MappingError as error:
        raise IngestError(f"mapping: {error}") from None
    if not getattr(streaming_df, "isStreaming", False):
        raise IngestError(
            "ingest() needs a streaming DataFrame (spark.readStream...); for a static DataFrame use "
            "activedb.ingest.feed(db, [df.toArrow()], source=..., mapping=...)")
    if not isinstance(db, activedb.Database):
        raise IngestError(f"ingest() feeds an activedb.Database, got {db!r} as its first argument; connect first: "
                          f"db = activedb.connect(url), then ingest(db, frame, …)")
    check_columns(streaming_df.columns, mapping)
    if options.start and any(query.name == query_name for query in streaming_df.sparkSession.streams.active):
        raise IngestError(
            f"a query named {query_name!r} is already running in this Spark session (Spark runs one query per name); "
            f"stop it (query.stop(), or spark.streams.active lists the running ones) or give another query_name")
    if options.watermark_delay is not None:
        declared = watermark_columns(streaming_df._jdf.queryExecution().analyzed())
        if declared:        # (Spark fails the query's second batch, the first applied: "Redefining watermark …")
            raise IngestError(
                f"watermark_delay={options.watermark_delay!r} would declare a second watermark on the stream, whose "
                f"frame declares one on column {declared[0]!r} already (withWatermark): Spark refuses a redefined "
                f"watermark once the first batch has run, and the query would stop at every restart. Give the delay "
                f"either way, not both: drop watermark_delay=, or the frame's withWatermark(…)")
        delay = options.watermark_delay
        if isinstance(delay, dt.timedelta):
            delay = f"{delay // dt.timedelta(milliseconds=1)} milliseconds"     # (exact: no float on the way)
        column_type = dict(streaming_df.dtypes).get(mapping.ts_column)
        if column_type != "timestamp":      # (Spark declares a watermark on a TIMESTAMP only, not a TIMESTAMP_NTZ)
            raise IngestError(
                f"watermark_delay needs {mapping.ts_column!r} to be a Spark timestamp, but it is {column_type}; "
                f"convert it first, e.g. df.withColumn({mapping.ts_column!r}, "
                f"{_as_timestamp(mapping.ts_column, column_type, mapping.ts_unit)})")
        try:
            streaming_df = _with_watermark(streaming_df, mapping.ts_column, delay)
        except Exception as error:      # (Spark's AnalysisException: an interval it cannot read, a negative one)
            raise IngestError(
                f"watermark_delay={options.watermark_delay!r} is not a delay Spark takes ({first_line(error)}); give "
                f"an interval such as '30 seconds' or '5 minutes', or a datetime.timedelta, not negative") from None
    check_watermark_column(streaming_df._jdf.queryExecution().analyzed(), mapping.ts_column,
                           marked=WATERMARK_METADATA in streaming_df.schema[mapping.ts_column].metadata)
    schema = streaming_df.schema
    check_key_type(schema, mapping)
    check_arrow_types(schema, scale_out=options.partition_by_key is not None)

    session = streaming_df.sparkSession
    common: SinkOptions = {"query_name": query_name, "known_types": options.known_types, "spark_session": session,
                           "on_phase": options.on_phase}
    if options.partition_by_key is None:
        sink: IngestSink = IngestSink(db, mapping, handler=options.handler, deadlines=options.deadlines,
                                      lineage=options.lineage, **common)
    else:
        sink = PartitionedIngestSink(db, mapping, partitions=options.partition_by_key,
                                     app=None if options.app is None else portable_spec(options.app),
                                     connect_options=options.connect_options,
                                     on_partition_failure=options.on_partition_failure or SplitFailure.FORWARD,
                                     lineage=options.lineage, rules=options.handler,  # type: ignore[arg-type]  # (checked: rules)
                                     **common)
    try:
        return _started(sink, streaming_df, query_name, str(checkpoint_location), options)
    except BaseException:
        # Spark refused the trigger or the query: nothing is left of this call — a sink with deadlines watches the
        # database's every firing through an observer, and a database with one lowers no batch of declared rules.
        sink.close()
        raise


def _started(sink: IngestSink, streaming_df: DataFrame, query_name: str, checkpoint_location: str,
             options: IngestOptions) -> StreamingQuery | DataStreamWriter:
    """:func:`ingest`'s writer for ``sink``, started unless ``options.start`` is False."""
    run = QueryRun(sink)      # told the query once start() returns: its batches need not ask Spark for it
    # One session wrapper per run (_foreach): only for the run started here — a writer handed back could be
    # started more than once, each start a run of its own with a session of its own.
    writer = streaming_df.writeStream
    writer = (foreach_batch(writer, run) if options.start else writer.foreachBatch(run)).queryName(query_name)
    writer = writer.option("checkpointLocation", checkpoint_location)
    trigger = options.trigger
    if isinstance(trigger, (int, float)):
        trigger = f"{trigger} seconds"
    try:
        if isinstance(trigger, str):
            writer = writer.trigger(processingTime=trigger)
        elif trigger is not None:
            # (a Mapping of DataStreamWriter.trigger's keywords, as the user gave them: Spark checks their values)
            writer = writer.trigger(**trigger)  # type: ignore[call-overload]
    except Exception as error:      # (Spark's IllegalArgumentException, pyspark's own: an interval or a keyword)
        raise IngestError(
            f"trigger={options.trigger!r} is not one Spark takes ({first_line(error)}); give a processing-time "
            f"interval such as '5 seconds' or '1 minute', a number of seconds (5), or keyword arguments of "
            f"DataStreamWriter.trigger such as {{'availableNow': True}}") from None
    setattr(writer, SINK_ATTRIBUTE, sink)
    if not options.start:
        return writer
    query = writer.start()
    run.started(query)
    setattr(query, SINK_ATTRIBUTE, sink)
    return query


#: The Spark SQL function making a ``TIMESTAMP`` of a number of each unit since the epoch (``EventMapping.ts_unit``).
_FROM_EPOCH = {TimeUnit.S: "timestamp_seconds", TimeUnit.MS: "timestamp_millis", TimeUnit.US: "timestamp_micros"}
#: Spark's names (``DataFrame.dtypes``) of the numeric types, but ``decimal(p,s)``.
_NUMBERS = frozenset({"tinyint", "smallint", "int", "bigint", "float", "double"})


def _as_timestamp(column: str, column_type: str | None, unit: TimeUnit) -> str:
    """The PySpark expression making a Spark ``TIMESTAMP`` of ``column``, of type ``column_type`` (``dtypes``' name):
    an ISO text parsed, a number of ``unit`` since the epoch (the mapping's), anything else cast."""
    if column_type == "string":
        return f"F.to_timestamp({column!r})"
    if column_type in _NUMBERS or (column_type or "").startswith("decimal"):
        return f"F.{_FROM_EPOCH[unit]}({column!r})"
    return f"F.col({column!r}).cast('timestamp')"


def _with_watermark(frame: DataFrame, ts_column: str, delay: str) -> DataFrame:
    """``frame.withWatermark(ts_column, delay)`` on the column named exactly ``ts_column``: with another column named
    like it but for case, which Spark's name resolution cannot tell apart (``AMBIGUOUS_REFERENCE``), it is declared on
    the column's position (:func:`~spark_bridge._sink.by_position`) and the names are given back — Spark's watermark
    metadata stays on the time column, as :func:`~spark_bridge._sink.check_watermark_column` reads it."""
    if sum(name.lower() == ts_column.lower() for name in frame.columns) < 2:
        return frame.withWatermark(ts_column, delay)
    apart, names = by_position(frame)
    return apart.withWatermark(apart.columns[names.index(ts_column)], delay).toDF(*names)


def sink_of(query_or_writer: StreamingQuery | DataStreamWriter) -> IngestSink:
    """The :class:`IngestSink` behind a query (or writer) made by :func:`ingest`."""
    sink: IngestSink | None = getattr(query_or_writer, SINK_ATTRIBUTE, None)
    if sink is None:
        raise IngestError("this query was not started by spark_bridge.ingest()")
    return sink


def end_of_stream(query_or_sink: StreamingQuery | Ingestion) -> int:
    """Tell the engine behind a query made by ``ingest(…, handler=streams.QueriesHandler(…))`` that its (bounded)
    source has ended: events its reorder buffer still holds are released (``punctuation=END_OF_STREAM``) and
    processed in the run's end-of-stream batch (``activedb.ingest.END_OF_STREAM_BATCH``, with its ledger row: the
    ledger then accounts for every row).  Call it after the query terminated (``availableNow``; a query still
    running is refused with :class:`IngestError`); afterwards every
    new event of the engine is late.  Returns how many events that processed (0 for the other handlers, and for a
    second call: the ledger has the release)."""
    sink = query_or_sink if isinstance(query_or_sink, Ingestion) else sink_of(query_or_sink)
    if getattr(query_or_sink, "isActive", False) is True:      # (a StreamingQuery: a writer or a sink has none)
        raise IngestError(f"query {sink.query_name!r} is still running: end_of_stream releases what its engine holds "
                          f"back and makes every later event late, so call it after the query terminated "
                          f"(query.awaitTermination() with trigger={{'availableNow': True}}, or query.stop())")
    return sink.end_of_stream()
