"""Where ``activedb run``'s events come from: the ``--source`` forms, and the streaming frame built for one.

:func:`parse_source` turns ``file:DIR``, ``rate``, ``socket:HOST:PORT`` or ``kafka:BROKERS/TOPIC`` into a
:class:`SourceSpec` before Spark starts (a bad form is a ``click.BadParameter`` naming the forms);
:func:`build_stream` reads it against the app's ``SCHEMA`` plus Spark's corrupt-record column, so a line that is
not JSON or does not fit the schema reaches the sink with its original text and becomes a dead letter there; a
blank line of a JSON-lines source (file, socket, Kafka) is skipped and counted (:data:`SOURCE_OBSERVATION`).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import click

from activedb.errors import BadArgument

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from activedb.cli.application import LoadedApp

__all__ = ["CORRUPT_COLUMN", "LINE_COLUMN", "SOURCE_OBSERVATION", "SourceSpec", "build_stream", "parse_source",
           "with_corrupt_column", "write_event_files"]

@dataclass(frozen=True)
class SourceSpec:
    """A parsed ``--source``. Immutable."""

    kind: str  # file | rate | socket | kafka
    path: str | None = None
    host: str | None = None
    port: int | None = None
    brokers: str | None = None
    topic: str | None = None

    def describe(self) -> str:
        return {"file": f"files in {self.path}", "socket": f"socket {self.host}:{self.port}",
                "kafka": f"Kafka topic {self.topic} at {self.brokers}"}.get(self.kind, "the rate source")


SOURCE_FORMS = "file:DIR, rate, socket:HOST:PORT or kafka:BROKERS/TOPIC"


def parse_source(text: str) -> SourceSpec:
    """Parse ``--source``; raises ``click.BadParameter`` saying which forms exist."""
    kind, _, rest = text.partition(":")
    if kind == "rate" and not rest:
        return SourceSpec("rate")
    if kind == "file" and rest:
        if not Path(rest).is_dir():   # before Spark starts: say it in a second, not after five
            raise click.BadParameter(f"file:{rest}: no such directory (Spark watches a directory for new files)",
                                     param_hint="--source")
        return SourceSpec("file", path=rest)
    if kind == "socket":
        host, _, port = rest.rpartition(":")
        if host and port.isascii() and port.isdigit() and 0 < int(port) < 65536:
            return SourceSpec("socket", host=host, port=int(port))
    if kind == "kafka":
        brokers, _, topic = rest.rpartition("/")
        if brokers and topic:
            return SourceSpec("kafka", brokers=brokers, topic=topic)
    raise click.BadParameter(f"{text!r} is not a source; use {SOURCE_FORMS}", param_hint="--source")


def write_event_files(directory: Path, events: list[dict[str, object]], per_file: int, first_mtime: float) -> None:
    """``events`` as JSON-lines files of ``per_file`` events in the new ``directory``, the n-th modified at
    ``first_mtime + n``: a file source reads them one micro-batch each (``maxFilesPerTrigger=1``) in that
    order (it takes files in modification-time order)."""
    from activedb.lowlevel import check_whole_number     # (here: the command line imports this module to list itself)

    check_whole_number("write_event_files", "per_file", per_file, 1)
    lines = []          # (every event first: a directory holding part of them would be read as the stream)
    for position, event in enumerate(events):
        try:
            lines.append(json.dumps(event) + "\n")
        except (TypeError, ValueError) as error:
            raise BadArgument(f"write_event_files: event {position} ({event!r}) cannot be written as JSON "
                              f"({error}); give JSON values, e.g. a time as text (datetime.isoformat()); nothing was "
                              f"written") from None
    try:
        directory.mkdir(parents=True)
    except FileExistsError:
        raise BadArgument(f"write_event_files: {directory} exists; the events go to a new directory, as a file source "
                          f"reads every file in its directory as the stream: give a directory that does not exist yet "
                          f"(or remove this one)") from None
    for number, start in enumerate(range(0, len(events), per_file)):
        path = directory / f"part-{number:04d}.json"
        path.write_text("".join(lines[start:start + per_file]))
        os.utime(path, (first_mtime + number, first_mtime + number))


def kafka_hint() -> str:
    import pyspark

    package = f"org.apache.spark:spark-sql-kafka-0-10_2.13:{getattr(pyspark, '__version__', '4.0.0')}"
    return (
        "Spark's Kafka connector is not on the classpath. Add it with\n"
        f"  activedb run APP --source kafka:... --packages {package}\n"
        f"(or --spark-conf spark.jars.packages={package}; Spark downloads it from Maven Central on first use), "
        "or put the connector jar and its kafka-clients dependency into pyspark's jars directory.")


def is_missing_data_source(error: BaseException) -> bool:
    text = str(error)
    return "DATA_SOURCE_NOT_FOUND" in text or "Failed to find data source" in text


CORRUPT_COLUMN = "_corrupt_record"
LINE_COLUMN = "_line"        # EventMapping.line_column's default


def with_corrupt_column(schema: str | StructType) -> StructType:
    """``schema`` (a DDL string or ``StructType``) plus Spark's corrupt-record column (text): a line
    Spark cannot read against the schema keeps its original text there (``columnNameOfCorruptRecord``)."""
    from pyspark.sql import types

    struct = _struct_schema(schema)
    assert struct is not None, "a schema is a DDL string or a StructType"
    if CORRUPT_COLUMN in struct.fieldNames():
        return struct
    return types.StructType([*struct.fields, types.StructField(CORRUPT_COLUMN, types.StringType(), True)])


#: The observation (``DataFrame.observe``) a line source's frame reports in each batch's Spark progress:
#: ``query.lastProgress["observedMetrics"][SOURCE_OBSERVATION]["blank_lines"]``, the blank lines it skipped.
SOURCE_OBSERVATION = "activedb_source"


def _parsed_json(frame: DataFrame, schema: str | StructType) -> DataFrame:
    """``frame``'s JSON text column ``value`` parsed against ``schema``, keeping each row's line in ``_line`` (the
    mapping's ``line_column``: a lone surrogate, which Spark's conversion turns into ``?``, is found there).

    A blank line (empty, or whitespace only) carries nothing — a keep-alive, a doubled newline —, so it is
    skipped, not made an event whose every field is null (a dead letter, as if a row had been lost), and
    counted in the batch's progress (:data:`SOURCE_OBSERVATION`).  A null value (a Kafka tombstone) is not
    blank: it stays a row, and a dead letter."""
    from pyspark.sql import functions

    options = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT_COLUMN}
    line = functions.col("value").cast("string")
    blank = functions.coalesce(line.rlike(r"^\s*$"), functions.lit(False))
    frame = frame.observe(SOURCE_OBSERVATION, functions.count(functions.when(blank, 1)).alias("blank_lines"))
    parsed = functions.from_json(line, with_corrupt_column(schema), options)
    return (frame.where(~blank).select(parsed.alias("event"), line.alias(LINE_COLUMN))
            .select("event.*", LINE_COLUMN))


def _synthetic_rate_columns(frame: DataFrame, loaded: LoadedApp, event_types: list[str]) -> DataFrame:
    """The rate source's ``(timestamp, value)`` as the app's columns (no ``from_rate``)."""
    from pyspark.sql import functions, types

    mapping = loaded.mapping
    assert mapping is not None, "run loads the app with require_mapping=True"
    value = functions.col("value")
    columns = {
        mapping.type_column: functions.lit(event_types[0] if event_types else "rate"),
        mapping.key_column: functions.concat(functions.lit("k"), (value % 10).cast("string")),
        mapping.ts_column: functions.col("timestamp"),
    }
    schema = _struct_schema(loaded.schema)
    payload = list(mapping.payload_columns or ())
    if schema is not None:
        for field in schema.fields:
            if field.name in columns:
                continue
            if isinstance(field.dataType, types.NumericType):
                columns[field.name] = (value % 100).cast(field.dataType)
            elif isinstance(field.dataType, types.StringType):
                columns[field.name] = value.cast("string")
            else:
                columns[field.name] = functions.lit(None).cast(field.dataType)
    for name in payload:
        columns.setdefault(name, value)
    if not payload and schema is None:
        columns["value"] = value
    return frame.select(*[expression.alias(name) for name, expression in columns.items()])


def _struct_schema(schema: str | StructType | None) -> StructType | None:
    """``schema`` as a ``StructType`` (None: no schema, or not a DDL string or ``StructType``)."""
    from pyspark.sql import types

    if isinstance(schema, types.StructType):
        return schema
    if not isinstance(schema, str):
        return None
    from spark_bridge.errors import SourceError, first_line

    try:
        parsed = types._parse_datatype_string(schema)
    except Exception as error:      # (pyspark's ParseException: a type or a comma Spark does not read)
        raise SourceError(f"SCHEMA {schema!r} is not a schema Spark reads ({first_line(error)}); write it as "
                          f"'name TYPE, …' (e.g. 'type STRING, key STRING, ts TIMESTAMP')") from None
    if not isinstance(parsed, types.StructType):
        raise SourceError(f"SCHEMA {schema!r} is one type, not a row of named columns: write it as "
                          f"'name TYPE, …' (e.g. 'type STRING, key STRING, ts TIMESTAMP')")
    return parsed


def build_stream(spark: SparkSession, source: SourceSpec, loaded: LoadedApp, *, file_format: str,
                 max_files_per_trigger: int | None, rows_per_second: int, event_types: list[str]) -> DataFrame:
    """The streaming DataFrame for ``source``, in the app's columns."""
    from spark_bridge.errors import SourceError

    schema = loaded.schema
    if source.kind == "file":
        if schema is None:
            raise SourceError(f"a file source needs the rows' schema: define SCHEMA in {loaded.name} "
                              f"(e.g. SCHEMA = 'type STRING, key STRING, ts TIMESTAMP, room STRING')")
        if file_format == "json":      # read as text and parsed here: each row keeps its line (lone surrogates)
            reader = spark.readStream.format("text")
        elif file_format == "csv":
            reader = (spark.readStream.format("csv").schema(with_corrupt_column(schema)).option("header", "true")
                      .option("columnNameOfCorruptRecord", CORRUPT_COLUMN).option("mode", "PERMISSIVE"))
        else:
            reader = spark.readStream.format(file_format).schema(_struct_schema(schema) or schema)
        if max_files_per_trigger:
            reader = reader.option("maxFilesPerTrigger", max_files_per_trigger)
        frame = reader.load(source.path)
        if file_format != "json":
            return frame
        return _parsed_json(frame, schema)
    if source.kind == "rate":
        frame = spark.readStream.format("rate").option("rowsPerSecond", rows_per_second).load()
        if loaded.from_rate is not None:
            return loaded.from_rate(frame)
        return _synthetic_rate_columns(frame, loaded, event_types)
    if schema is None:
        raise SourceError(f"a {source.kind} source delivers JSON text; define SCHEMA in {loaded.name} to parse it")
    if source.kind == "socket":
        frame = (spark.readStream.format("socket").option("host", source.host).option("port", source.port).load())
        return _parsed_json(frame, schema)
    return _parsed_json(kafka_records(spark, source), schema)


def kafka_records(spark: SparkSession, source: SourceSpec) -> DataFrame:
    """The Kafka topic of ``source`` as Spark's Kafka source delivers it: one row per record, its ``value``
    the record's bytes (``binary``), beside ``key``, ``topic``, ``partition``, ``offset`` and ``timestamp``."""
    from spark_bridge.errors import SourceError

    try:
        return (spark.readStream.format("kafka").option("kafka.bootstrap.servers", source.brokers)
                .option("subscribe", source.topic).load())
    except Exception as error:
        if is_missing_data_source(error):
            raise SourceError(kafka_hint()) from None
        raise
