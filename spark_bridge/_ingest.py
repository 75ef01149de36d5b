"""``ingest()``: attach a Structured Streaming DataFrame to an activedb database.

See ``spark_bridge/README.md`` (exactly once, the watermark, the scale-out path) and the
docstrings of :mod:`spark_bridge._sink` and :mod:`spark_bridge._scaleout`.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Collection, Mapping
from typing import Any

from spark_bridge._app import portable_spec
from spark_bridge._handler import choose_handler
from spark_bridge._scaleout import PartitionedIngestSink
from spark_bridge._sink import IngestSink
from spark_bridge.errors import IngestError, MappingError
from spark_bridge.mapping import EventMapping, as_mapping

__all__ = ["ingest", "sink_of"]

#: The attribute of the returned StreamingQuery (or DataStreamWriter) holding the sink.
SINK_ATTRIBUTE = "activedb_sink"


def _apply_trigger(writer: Any, trigger: Any) -> Any:
    if trigger is None:
        return writer
    if isinstance(trigger, str):
        return writer.trigger(processingTime=trigger)
    if isinstance(trigger, (int, float)) and not isinstance(trigger, bool):
        return writer.trigger(processingTime=f"{trigger} seconds")
    if isinstance(trigger, Mapping):
        return writer.trigger(**trigger)
    raise IngestError(
        f"trigger must be None, a processing-time interval ('5 seconds' or 5), or keyword arguments of "
        f"DataStreamWriter.trigger such as {{'availableNow': True}}; got {trigger!r}"
    )


def _check_columns(streaming_df: Any, mapping: EventMapping) -> None:
    columns = list(streaming_df.columns)
    wanted = [mapping.type_column, mapping.key_column, mapping.ts_column, *(mapping.payload_columns or ())]
    missing = [column for column in wanted if column not in columns]
    if missing:
        raise IngestError(
            f"the stream has no column {missing[0]!r} named by the mapping (its columns: {columns}); "
            f"fix the EventMapping or select/rename the columns before ingest()"
        )


def ingest(
    db: Any,
    streaming_df: Any,
    *,
    mapping: EventMapping,
    query_name: str,
    checkpoint_location: str | None = None,
    trigger: Any = None,
    known_types: Collection[str] | None = None,
    prefetch: Mapping[str, Any] | None = None,
    partition_by_key: int | None = None,
    app: str | Callable[[Any], Any] | None = None,
    watermark_delay: str | dt.timedelta | None = None,
    start: bool = True,
    on_phase: Callable[[str, int], None] | None = None,
    connect_options: Mapping[str, Any] | None = None,
    queries: Any = None,
    scheduler: Any = None,
    executor: str | None = None,
    transactions: Any = None,
    composition: Any = None,
    on_partition_failure: str | None = None,
    lineage: bool = True,
) -> Any:
    """Feed ``streaming_df`` into ``db``'s rules, one micro-batch per top-level transaction,
    exactly once; return the started ``StreamingQuery`` (its sink is ``query.activedb_sink``).

    * ``mapping`` — which columns give the event type, key, timestamp and payload;
    * ``query_name`` — the query's stable name: Spark's query name, the punctuation source,
      and the first half of the ledger's query id ``NAME@SPARK_QUERY_ID`` (the second half
      comes from the checkpoint, so a new checkpoint is a new query in the ledger);
    * ``checkpoint_location`` — required: where Spark keeps the query id and the offsets of
      every planned batch; restarting from it re-runs the last unfinished batch with the
      same id, which the ledger then applies or skips;
    * ``trigger`` — ``None`` (batches back to back), ``"5 seconds"``/``5``, or keyword
      arguments for ``DataStreamWriter.trigger`` (``{"availableNow": True}``);
    * ``known_types`` — accepted event types (default: the types the rules listen to);
    * ``prefetch`` — ``{table: None | payload field | callable}``: rows loaded per batch in
      one query (``None``: the event key is the row key);
    * ``watermark_delay`` — applies ``withWatermark(mapping.ts_column, delay)`` (the column
      must be a Spark timestamp); a watermark declared on ``streaming_df`` works as well.
      The batch's Spark watermark is punctuated after the batch commits
      (``db.punctuate(query_name, watermark)``) and events older than it are dead letters;
    * ``partition_by_key=N`` and ``app`` — the scale-out path (``_scaleout.py``): each batch
      is repartitioned by key into ``N`` Spark tasks, each applying its partition in its
      own engine that registers ``app``'s rules; ``connect_options`` go to their
      ``activedb.connect``;
    * ``on_partition_failure`` — scale-out only: when a partition fails for good, ``"forward"``
      (default: the query fails; after the fix a restart completes the batch) or ``"compensate"``
      (the committed partitions are compensated, the failed one's rows become dead letters, the
      query goes on: the batch is all-or-nothing); see ``_atomic.py``;
    * ``lineage`` — every batch transaction records the source batch it consumed
      (``db.batches``, in the same flush); on by default;
    * ``start=False`` returns the ``DataStreamWriter`` (sink in ``writer.activedb_sink``)
      for the caller to configure and start;
    * ``on_phase(phase, batch_id)`` — a seam for crash tests (``_sink.PHASES``);
    * ``queries`` (+ ``scheduler``) — the queries path: each batch goes to stream engines
      (``activedb.streams.StreamEngine``, built with ``record_dead_letters=False``; one, a list, or
      a factory ``factory(db, scheduler=…)``) with the watermark as punctuation; ``scheduler``
      (``"sei"``, ``"s2pl"``, ``"lwm"`` or a ``streams.Scheduler``) must be the engines' own;
    * ``executor="tpg"`` and ``transactions`` — the TPG path: each batch runs as declared state
      transactions (``activedb.batch.StateTransactions``) through the planner at commit;
    * ``composition`` — the composite path (a mapping with ``producer_column``): each batch goes
      to an ``activedb.composite.CompositionEngine``.
      These paths exclude each other and the scale-out path (``_handler.choose_handler`` says why).

    pyspark is needed only for the DataFrame itself; nothing else here imports it.
    """
    if not checkpoint_location:
        raise IngestError(
            "ingest() needs checkpoint_location=DIR: Spark keeps the query's id and every planned batch's "
            "offsets there, and exactly-once rests on re-running an unfinished batch with the same id after a "
            "restart. Pass a directory that survives restarts, one per query, e.g. "
            "checkpoint_location='/var/lib/myapp/checkpoints/" + str(query_name) + "'"
        )
    try:
        mapping = as_mapping(mapping)
    except MappingError as error:
        raise IngestError(f"mapping: {error}") from None
    if not getattr(streaming_df, "isStreaming", False):
        raise IngestError(
            "ingest() needs a streaming DataFrame (spark.readStream...); for a static DataFrame use "
            "IngestSink(db, mapping, query_name=...).process(df.toArrow(), batch_id, query_id=...)"
        )
    _check_columns(streaming_df, mapping)
    if watermark_delay is not None:
        delay = watermark_delay
        if isinstance(delay, dt.timedelta):
            delay = f"{int(delay.total_seconds() * 1000)} milliseconds"
        column_type = dict(streaming_df.dtypes).get(mapping.ts_column)
        if column_type not in ("timestamp", "timestamp_ntz"):
            raise IngestError(
                f"watermark_delay needs {mapping.ts_column!r} to be a Spark timestamp, but it is {column_type}; "
                f"convert it first, e.g. df.withColumn({mapping.ts_column!r}, "
                f"F.timestamp_seconds({mapping.ts_column!r}))"
            )
        streaming_df = streaming_df.withWatermark(mapping.ts_column, delay)

    session = streaming_df.sparkSession
    handler = choose_handler(db, mapping, queries=queries, scheduler=scheduler, executor=executor,
                             transactions=transactions, composition=composition,
                             partition_by_key=partition_by_key, prefetch=prefetch)
    if partition_by_key is None:
        if app is not None or on_partition_failure is not None:
            raise IngestError(f"{'app=' if app is not None else 'on_partition_failure='} is for the scale-out "
                              f"path only (with partition_by_key=N); without it a batch is one transaction, "
                              f"atomic by itself, and the rules registered on db are used")
        sink: IngestSink = IngestSink(db, mapping, query_name=query_name, known_types=known_types,
                                      prefetch=prefetch, spark_session=session, on_phase=on_phase,
                                      handler=handler)
        sink.record_lineage = lineage
    else:
        sink = PartitionedIngestSink(db, mapping, query_name=query_name, partitions=partition_by_key,
                                     app=None if app is None else portable_spec(app), known_types=known_types,
                                     prefetch=prefetch, spark_session=session, on_phase=on_phase,
                                     connect_options=connect_options,
                                     on_partition_failure=on_partition_failure or "forward", lineage=lineage)
    writer = (streaming_df.writeStream.foreachBatch(sink).queryName(query_name)
              .option("checkpointLocation", str(checkpoint_location)))
    writer = _apply_trigger(writer, trigger)
    setattr(writer, SINK_ATTRIBUTE, sink)
    if not start:
        return writer
    query = writer.start()
    setattr(query, SINK_ATTRIBUTE, sink)
    return query


def sink_of(query_or_writer: Any) -> IngestSink:
    """The :class:`IngestSink` behind a query (or writer) made by :func:`ingest`."""
    sink = getattr(query_or_writer, SINK_ATTRIBUTE, None)
    if sink is None:
        raise IngestError("this query was not started by spark_bridge.ingest()")
    return sink
