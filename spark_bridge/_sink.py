"""The Spark connector's sink: ``foreachBatch`` → the ingestion core, one micro-batch per batch, exactly once.

:class:`IngestSink` is the ``foreachBatch`` callable behind :func:`spark_bridge.ingest`: an
:class:`activedb.ingest.Ingestion` whose source is the query's name and whose runs are Spark's query ids, plus
what is Spark's — ``toArrow()`` (always, also for a batch that will be skipped), the batch's watermark read
from the query's ``StreamExecution``, the checkpoint-renamed check.  :meth:`~activedb.ingest.Ingestion.process`
also runs without Spark (a ``pyarrow.Table`` or a list of dicts).  Design note: the package's ``README.md``
("One micro-batch"); the batch protocol is ``activedb/ingest/README.md``.

Thread-safety: the ingestion's book keeps the statistics (its own mutex); ``_mutex`` protects the per-query
bookkeeping below.  Spark calls ``foreachBatch`` one batch at a time per query.  No mutex is held while
calling Spark, the handler or PostgreSQL.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Required, TypedDict

from activedb import atomic
from activedb.atomic import LayoutTerms
from activedb.ingest import (BatchHandler, Deadlines, EventMapping, Ingestion, LedgerId, Phase, PhaseTimings,
                             sources_of_run)
from activedb.ingest import check_columns as check_stream_columns

from spark_bridge._foreach import for_spark
from spark_bridge.errors import IngestError, QueryRenamedError, first_line

if TYPE_CHECKING:  # pragma: no cover
    import pyarrow as pa
    from py4j.java_gateway import JavaObject
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery
    from pyspark.sql.types import StructType

    from activedb import Database

__all__ = ["WATERMARK_METADATA", "IngestSink", "QueryRun", "SinkOptions", "by_position", "check_arrow_types",
           "check_columns", "check_watermark_column", "streaming_query_id"]

logger = logging.getLogger("spark_bridge.ingest")
#: A failed batch's error of a Java call with its traceback (Spark gets it bounded: ``_foreach.for_spark``).  Silent
#: unless the application configures logging, as py4j's record of a failed callback is (``activedb run`` prints it).
failures_log = logging.getLogger("spark_bridge.ingest.failed_batches")
failures_log.addHandler(logging.NullHandler())

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
#: Spark sets this local property on the thread that runs foreachBatch: the query's id, which is stored in the
#: checkpoint and therefore survives restarts (unlike runId).
_QUERY_ID_PROPERTY = "sql.streaming.queryId"
_EXECUTIONS_KEPT = 64        # (Spark query ids a long-lived sink has seen: one per run; the cache stays bounded)


class SinkOptions(TypedDict, total=False):
    """:class:`IngestSink`'s keywords that a sink built on it (the scale-out path's) passes through."""

    query_name: Required[str]
    known_types: Collection[str] | None
    spark_session: SparkSession | None
    on_phase: Callable[[Phase, int], None] | None
    batch_attempts: int
    event_ids_under: str | None


class IngestSink(Ingestion):
    """``foreachBatch`` callable applying each micro-batch to ``db`` through its handler (the rules by default).

    ``query_name`` (the ingestion's source), ``known_types``, ``on_phase``, ``handler`` and ``lineage`` are
    ``ingest()``'s (``IngestOptions``); ``spark_session`` — the session the query was started from (to read the
    batch's watermark; ``None``: no watermark unless :meth:`process` is given one); ``batch_attempts`` —
    top-level attempts per batch on serialization conflicts; ``event_ids_under`` — the query name whose
    ingested event ids count for duplicate detection.  Lineage is on by default here: the atomic batch features
    rest on it (compensating a scale-out batch, ``activedb batches`` over ingested batches).

    Thread-safety: see the module docstring.
    """

    #: The driver's database (an ``activedb.Database``: its ``batches`` settle a split batch, its ``url`` is
    #: checked for the executors).
    db: Database

    def __init__(self, db: Database, mapping: EventMapping, *, query_name: str, known_types: Collection[str] | None = None,
                 spark_session: SparkSession | None = None, on_phase: Callable[[Phase, int], None] | None = None,
                 batch_attempts: int = 3, handler: BatchHandler | None = None, event_ids_under: str | None = None,
                 lineage: bool = True, deadlines: Deadlines | None = None) -> None:
        if not isinstance(query_name, str) or not query_name.strip():
            raise IngestError("query_name must be a non-empty string (it names the query in the ledger)")
        super().__init__(db, mapping, source=query_name, handler=handler, known_types=known_types,
                         batch_attempts=batch_attempts, on_phase=on_phase, lineage=lineage,
                         event_ids_under=event_ids_under, deadlines=deadlines)
        self._spark_session = spark_session
        # self._mutex protects the four fields below (the counters are the book's).
        self._mutex = threading.Lock()
        self._checked_spark_ids: set[str] = set()
        self._watermark_warning_given = False
        #: The Arrow types of the key column whose Spark type passed ``check_key_type`` (``_check_key_type``).
        self._key_types_checked: set[pa.DataType] = set()
        #: Spark query id -> (its StreamExecution, a py4j handle; whether its plan declares a watermark): found
        #: once per run of the query (a restart from the checkpoint keeps the id, not the execution), so that a
        #: batch asks the JVM one question without a watermark and four with one, instead of six
        #: (``spark_watermark``).
        self._executions: dict[str, tuple[JavaObject, bool]] = {}

    # -- foreachBatch entry point -------------------------------------------------------------

    def __call__(self, batch_df: DataFrame, batch_id: int) -> None:
        self.call_in_run(batch_df, batch_id, None)

    def call_in_run(self, batch_df: DataFrame, batch_id: int, run: QueryRun | None) -> None:
        """``foreachBatch``'s call, by the :class:`QueryRun` of the query ``ingest()`` started (or None): a run
        that knows its query's id and execution spares the batch two questions to Spark."""
        with self._book.in_batch():
            try:
                spark_query_id, execution = run.known if run is not None else (None, None)
                if spark_query_id is None:
                    spark_query_id = streaming_query_id(batch_df)
                if not spark_query_id:
                    raise IngestError(f"{type(self).__name__} must run as foreachBatch of a streaming query (no "
                                      f"query id)")
                self._spark_batch(batch_df, batch_id, spark_query_id, self._query_id_for(spark_query_id, batch_id),
                                  execution=execution)
            except BaseException as error:
                # Remembered: Spark wraps the error in a Java stack trace (``activedb run`` prints this instead).
                self._book.failed(batch_id, error)
                if not isinstance(error, Exception) or (bounded := for_spark(error, batch_id)) is error:
                    raise       # (KeyboardInterrupt, SystemExit; an error without a Java call's: as they are)
                # Spark gets an error of a Java call bounded (_foreach.for_spark: its Java stack trace would overflow
                # the stream thread's stack when the query is being stopped); the failures' log has it whole.
                failures_log.error("batch %s of %s failed", batch_id, self.source, exc_info=error)
                raise bounded from None

    def _spark_batch(self, batch_df: DataFrame, batch_id: int, spark_query_id: str, query_id: str, *,
                     execution: JavaObject | None = None) -> None:
        """Batch ``batch_id`` of ``foreachBatch`` as ``(query_id, batch_id)`` (the scale-out sink overrides it);
        ``execution``: the query's running ``StreamExecution`` if the caller knows it (``spark_watermark``)."""
        started = time.perf_counter()
        try:
            table = batch_df.toArrow()
        except Exception:
            # A column toArrow cannot take fails every batch: ingest()'s error for it (its check, done here only
            # when toArrow failed: asking Spark for the schema is a py4j call).  A schema that cannot be read
            # either (the session gone) leaves toArrow's error to be raised, as itself.
            schema = _schema_or_none(batch_df)
            if schema is not None:
                check_arrow_types(schema, scale_out=False)
            raise
        to_arrow = time.perf_counter() - started
        if self.mapping is not None:        # (a mapped column missing would make every row a dead letter)
            check_columns(table.column_names, self.mapping)
            self._check_key_type(batch_df, table.schema, self.mapping)
        watermark = self.spark_watermark(spark_query_id, current=execution)
        self.phase(Phase.FETCHED, batch_id)
        self.process(table, batch_id, query_id=query_id, watermark=watermark,
                     extra_timings=PhaseTimings(to_arrow=to_arrow))

    def _check_key_type(self, batch_df: DataFrame, schema: pa.Schema, mapping: EventMapping) -> None:
        """:func:`check_key_type` of the batch's Spark schema (``ingest()`` asked it of its frame; a sink wired with
        ``foreachBatch`` directly would make every row a dead letter), asked once per Arrow type of the key column in
        the batch's ``schema`` (the table ``toArrow()`` made): a batch after the first asks Spark nothing (the schema
        is a py4j call), only a lookup of its key column's type."""
        index = schema.get_field_index(mapping.key_column)
        if index < 0:
            return              # (check_columns says so)
        key_type = schema.field(index).type
        with self._mutex:
            if key_type in self._key_types_checked:
                return
        spark_schema = _schema_or_none(batch_df)
        if spark_schema is None:
            return              # (Spark cannot tell it now: the session gone; the next batch asks again)
        check_key_type(spark_schema, mapping)
        with self._mutex:
            self._key_types_checked.add(key_type)

    def spark_watermark(self, spark_query_id: str, *, current: JavaObject | None = None) -> dt.datetime | None:
        """Spark's event-time watermark of the batch now running in query ``spark_query_id`` (the package's
        ``README.md``, "The watermark"); ``None`` without one, without a ``spark_session``, or when this
        Spark version does not expose it (logged once).  ``current``: the query's ``StreamExecution`` when the
        caller knows it is the running one (a :class:`QueryRun`): not asked whether it still is."""
        session = self._spark_session
        if session is None:
            return None
        try:
            with self._mutex:
                known = self._executions.get(spark_query_id)
            if current is not None:
                if known is None or known[0] is not current:
                    known = self._remember_execution(spark_query_id, current)
            elif known is None or not known[0].isActive():     # (a stopped execution: the query was restarted)
                query = session.streams.get(spark_query_id)
                if query is None:
                    return None
                known = self._remember_execution(spark_query_id, query._jsq.streamingQuery())
            execution, declared = known
            if not declared:
                return None
            # StreamExecution.lastExecution is the IncrementalExecution of the running batch.
            millis = int(execution.lastExecution().offsetSeqMetadata().batchWatermarkMs())
        except IngestError:         # (a watermark on another column: _remember_execution)
            raise
        except Exception as error:  # py4j: an internal API that may move between Spark versions
            with self._mutex:
                warn, self._watermark_warning_given = not self._watermark_warning_given, True
            if warn:
                logger.warning("cannot read the batch watermark from Spark (%r); no punctuation is given", error)
            return None
        return None if millis <= 0 else _EPOCH + dt.timedelta(milliseconds=millis)

    def _remember_execution(self, spark_query_id: str, execution: JavaObject) -> tuple[JavaObject, bool]:
        """``(execution, whether its plan declares a watermark)``, kept as the query's known run; a watermark on
        another column than the mapping's time is refused (:func:`check_watermark_column`: ``ingest()`` checked its
        frame, a sink wired with ``foreachBatch`` directly is checked here, at its run's first batch)."""
        known = (execution, bool(watermark_columns(plan := execution.logicalPlan())))
        if known[1] and self.mapping is not None:   # (the plan's watermark nodes, not its text: a column named
            ts_column = self.mapping.ts_column      # like a watermark would have every batch ask for one)
            check_watermark_column(plan, ts_column, marked=_time_column_marked(plan, ts_column))
        with self._mutex:
            if len(self._executions) >= _EXECUTIONS_KEPT:
                self._executions.clear()
            self._executions[spark_query_id] = known
        return known

    # -- helpers ------------------------------------------------------------------------------

    def _query_id_for(self, spark_query_id: str, batch_id: int) -> str:
        """The ledger id of the run whose Spark query id is ``spark_query_id``; its first batch here, ``batch_id``,
        checks the checkpoint was not renamed, nor that batch ingested in another partition layout
        (:meth:`_check_layout`), and punctuates again what the ledger last recorded (``Ingestion.resume``)."""
        with self._mutex:
            checked = spark_query_id in self._checked_spark_ids
        query_id = str(LedgerId(self.source, spark_query_id))
        if not checked:
            check_not_renamed(self.db, self.source, spark_query_id)
            self._check_layout(query_id, batch_id)
            self.resume(query_id)
            with self._mutex:
                self._checked_spark_ids.add(spark_query_id)
        return query_id

    def _check_layout(self, query_id: str, batch_id: int) -> None:
        """:func:`check_layout` for this sink, which applies a batch whole (the scale-out sink overrides it)."""
        check_layout(self.db, query_id, batch_id, None)


def _schema_or_none(batch_df: DataFrame) -> StructType | None:
    """``batch_df``'s schema, or None when Spark cannot tell it (a py4j call: the session may be gone)."""
    try:
        return batch_df.schema
    except Exception:   # (py4j's errors, pyspark's; the caller raises the error it is handling instead)
        return None


def streaming_query_id(batch_df: DataFrame) -> str | None:
    """The id of the streaming query that produced ``batch_df`` (inside foreachBatch)."""
    value = batch_df.sparkSession.sparkContext.getLocalProperty(_QUERY_ID_PROPERTY)
    return None if value is None else str(value)


def check_not_renamed(db: Database, query_name: str, spark_query_id: str) -> None:
    """Raise :class:`QueryRenamedError` if the ledger holds batches of ``spark_query_id`` (the checkpoint's
    query) under another query name."""
    names = sorted(sources_of_run(db, spark_query_id) - {query_name})
    if names:
        raise QueryRenamedError(
            f"this checkpoint (Spark query id {spark_query_id}) was ingested as query {names[0]!r}, not "
            f"{query_name!r}; resume it with query_name={names[0]!r} (--query-name {names[0]}), or start "
            f"{query_name!r} from a new checkpoint directory")


#: How :func:`activedb.atomic.check_layout` names the Spark connector's layouts (``partition_by_key``, ``--partitions``).
LAYOUT_TERMS = LayoutTerms(
    runner="Spark", whole="whole, without partition_by_key",
    resume=lambda partitions: ("without partition_by_key (activedb run without --partitions)" if partitions is None
                               else f"with partition_by_key={partitions} (--partitions {partitions})"))


def check_layout(db: Database, query_id: str, batch_id: int, partitions: int | None,
                 partition_key: tuple[str, str] | None = None, salt: int | None = None) -> None:
    """:func:`activedb.atomic.check_layout` in the Spark connector's words (:data:`LAYOUT_TERMS`): ``partitions``
    None for the one-task path, N for the scale-out path's; ``partition_key``: its key column and Spark type;
    ``salt``: the scale-out path's salt for the run (``activedb.atomic.choose_salt``)."""
    atomic.check_layout(db, query_id, batch_id, partitions, partition_key, salt=salt, terms=LAYOUT_TERMS)


def check_columns(columns: list[str], mapping: EventMapping) -> None:
    """:func:`activedb.ingest.check_columns` in the Spark connector's words: a stream whose columns lack one the
    mapping names, or repeat one, is refused.  ``ingest()`` asks it of its frame, a sink of each batch (a sink wired
    with ``foreachBatch`` directly), before applying anything."""
    check_stream_columns(columns, mapping, before="before ingest() (or foreachBatch(sink))",
                         rename=" (give each column its own name in the select, alias(...))")


def by_position(frame: DataFrame) -> tuple[DataFrame, list[str]]:
    """``frame`` with its columns renamed apart by position — ``_0``, ``_1``, … (``toDF`` takes them by position) —
    and its names, in order.  Spark resolves a column's name without regard to case (``spark.sql.caseSensitive`` is
    off by default), the mapping and Arrow by the exact name: a column named like another but for case (``key`` and
    ``KEY``), which the one-task path applies, is ambiguous to a Spark call naming it; its position is not."""
    names = frame.columns
    return frame.toDF(*(f"_{index}" for index in range(len(names)))), names


#: The Spark types (``simpleString``, without a length) whose values are keys: an event's key is a string or an integer.
_KEY_TYPES = frozenset({"string", "char", "varchar", "tinyint", "smallint", "int", "bigint"})


def check_key_type(schema: StructType, mapping: EventMapping) -> None:
    """Refuse a stream whose ``mapping``'s key column (in ``schema``, Spark's) is of a type no key can have — an
    event's key is a string or an integer (``activedb.ingest``'s ``check_key``): a map, array, struct, binary,
    float or double, boolean, decimal, date or time column would make every row of every batch a dead letter, and
    the scale-out path hashes a batch's rows to its partitions by it.  ``ingest()`` asks it of its frame, the
    scale-out sink of each batch's schema, the one-task sink of its first batch's (a sink wired with ``foreachBatch``
    directly: ``IngestSink._check_key_type``)."""
    if mapping.key_column not in schema.names:
        return          # (check_columns says so)
    key_type = schema[mapping.key_column].dataType.simpleString()
    if key_type.split("(")[0] not in _KEY_TYPES:
        raise IngestError(
            f"key column {mapping.key_column!r} is {key_type}: an event's key is a string or an integer, so every "
            f"row would be a dead letter; cast it before ingest(), e.g. df.withColumn({mapping.key_column!r}, "
            f"F.col({mapping.key_column!r}).cast('string')), or map the key to another column")


def check_arrow_types(schema: StructType, *, scale_out: bool) -> None:
    """Refuse a column of ``schema`` (a stream's) a batch cannot be converted to Arrow with — every batch of each path
    is, so such a column would fail each one, replay after replay, and the stream stop for good.  The one-task
    path's ``toArrow()`` has pyspark convert the batch's schema first, which refuses some types (a calendar interval
    from ``make_interval``, a year-month interval).  The scale-out path's ``mapInArrow`` (``_scaleout.py``) carries a
    calendar interval, but pyarrow cannot wrap a year-month interval array (``KeyError: 21`` in the task's worker,
    before the task sees a row), and the JVM refuses a struct with two fields of one name
    (``[DUPLICATED_FIELD_NAME_IN_ARROW_STRUCT]``, as ``toArrow()`` does), each at any depth of the column's type.
    ``ingest()`` asks it of its frame; a sink wired with ``foreachBatch`` directly of the batch (the one-task sink
    once ``toArrow()`` failed)."""
    from pyspark.sql.pandas.types import to_arrow_type
    from pyspark.sql.types import ArrayType, DataType, MapType, StructType, YearMonthIntervalType

    def nested(data_type: DataType) -> list[DataType]:
        """``data_type`` and every type inside it."""
        inner = ([data_type.elementType] if isinstance(data_type, ArrayType)
                 else [data_type.keyType, data_type.valueType] if isinstance(data_type, MapType)
                 else [field.dataType for field in data_type.fields] if isinstance(data_type, StructType) else [])
        return [data_type, *(found for each in inner for found in nested(each))]

    for field in schema.fields:
        try:       # (as DataFrame.toArrow converts the schema)
            if scale_out:
                types = nested(field.dataType)
                if any(isinstance(each, YearMonthIntervalType) for each in types):
                    raise TypeError("pyarrow cannot take a year-month interval from Spark's mapInArrow")
                for struct in (each for each in types if isinstance(each, StructType)):
                    names = struct.names
                    twice = [name for index, name in enumerate(names) if name in names[:index]]
                    if twice:
                        raise TypeError(f"duplicate field name {twice[0]!r} in a struct: Spark's mapInArrow refuses "
                                        f"it; rename the struct's fields")
            else:
                to_arrow_type(field.dataType, error_on_duplicated_field_names_in_struct=True, timezone="UTC")
        except Exception as error:      # (pyspark's PySparkTypeError, PySparkValueError)
            raise IngestError(
                f"column {field.name!r} ({field.dataType.simpleString()}) cannot be converted to Arrow, which every "
                f"batch is ({first_line(error)}); drop it, or cast it to a type Arrow takes before ingest() (or "
                f"foreachBatch(sink)), e.g. df.withColumn({field.name!r}, F.col({field.name!r}).cast('string'))"
            ) from None


#: The metadata key Spark puts on the column ``withWatermark`` last declared a watermark on (kept through renames).
WATERMARK_METADATA = "spark.watermarkDelayMs"


def check_watermark_column(plan: JavaObject, ts_column: str, *, marked: bool) -> None:
    """Refuse a query whose ``plan`` (a logical plan, py4j) declares an event-time watermark on a column other than
    ``ts_column``, the mapping's time column; ``marked``: whether that column carries Spark's watermark metadata
    (:data:`WATERMARK_METADATA`: one watermark, on a column renamed to it since).  Spark's watermark of a batch
    (``batchWatermarkMs``, what the sink reads) is the watermark of the column it was declared on — with several,
    their minimum (``spark.sql.streaming.multipleWatermarkPolicy``) —, and the sink judges the time column late by
    it and punctuates with it (the package's ``README.md``, "The watermark").  ``ingest()`` asks it of the frame it
    is given; a sink asks it of its query's plan once per run (a sink wired with ``foreachBatch`` directly)."""
    columns = watermark_columns(plan)
    others = [column for column in columns if column != ts_column]
    if others and not (len(columns) == 1 and marked):
        raise IngestError(
            f"the stream declares an event-time watermark on column {others[0]!r}, not on the mapping's time column "
            f"{ts_column!r}: Spark's watermark of a batch is that column's (with several, their minimum), and "
            f"the sink would make events dead letters as late, and punctuate, by it. Declare the watermark on the "
            f"time column — withWatermark({ts_column!r}, …) or watermark_delay=… — and drop the one on "
            f"{others[0]!r}, or map the time to {others[0]!r}")


def watermark_columns(plan: JavaObject) -> list[str]:
    """The columns of ``plan``'s (a logical plan, py4j) ``EventTimeWatermark`` nodes: one per ``withWatermark`` (or
    SQL's ``WATERMARK``).  A py4j call or four per node of the plan: asked once per run."""
    columns, pending = [], [plan]
    while pending:
        node = pending.pop()
        if str(node.nodeName()) == "EventTimeWatermark":
            columns.append(str(node.eventTime().name()))
        children = node.children()
        pending.extend(children.apply(index) for index in range(children.size()))
    return columns


def _time_column_marked(plan: JavaObject, ts_column: str) -> bool:
    """Whether the column ``ts_column`` of ``plan``'s output carries Spark's watermark metadata."""
    output = plan.output()
    for index in range(output.size()):
        attribute = output.apply(index)
        if str(attribute.name()) == ts_column:
            return bool(attribute.metadata().contains(WATERMARK_METADATA))
    return False


class QueryRun:
    """The ``foreachBatch`` callable of one run of a query that :func:`spark_bridge.ingest` starts: it hands each
    batch to ``sink`` together with what it knows of the run.  Once ``start()`` returned, ``ingest()`` calls
    :meth:`started` with the query: the run then knows the query's id and its ``StreamExecution``, and a batch asks
    Spark for neither — the id (a local property) and whether the execution the sink knows still runs cost a
    py4j call each, slow after Spark's turn.  A batch that began before
    :meth:`started` (the first may) asks, as a sink used directly does.

    One object per run, never handed out (``sink_of`` gives the sink): a restart is a new ``start()`` and so a new
    run, whose id and execution it learns again.  Thread-safety: the two are one tuple, replaced whole once (an
    attribute assignment: a batch on Spark's thread sees the old pair or the new one, never half of it)."""

    def __init__(self, sink: IngestSink) -> None:
        self.sink = sink
        #: (the run's Spark query id, its ``StreamExecution``), or (None, None) before :meth:`started`.
        self.known: tuple[str | None, JavaObject | None] = (None, None)

    def started(self, query: StreamingQuery) -> None:
        """``query`` (the ``StreamingQuery`` ``start()`` returned) is this run's."""
        self.known = (str(query.id), query._jsq.streamingQuery())

    def __call__(self, batch_df: DataFrame, batch_id: int) -> None:
        self.sink.call_in_run(batch_df, batch_id, self)
