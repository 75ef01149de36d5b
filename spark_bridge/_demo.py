"""The ``spark`` event feed of ``activedb demo`` (entry point ``activedb.feeds``): the demo's events
through Spark Structured Streaming into the application's rules, exactly once."""

from __future__ import annotations

import functools
import tempfile
import threading
import time
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import sqlalchemy as sa

from activedb.cli.running import StopRequest, exit_at_once
from activedb.progress import many
from spark_bridge._cli import _stop_query
from spark_bridge._sources import write_event_files
from spark_bridge.errors import SparkBridgeError, describe, first_line

if TYPE_CHECKING:  # pragma: no cover
    from rich.console import Console

    from activedb import Database
    from activedb.ingest import IngestStatistics, Ingestion
    from activedb.progress import Progress
    from activedb.streams import StreamEngine
    from pyspark.sql import SparkSession

SPARK_FILES = 4                 # the stream is written as this many files (micro-batches)


def feed(db: Database, events: list[dict[str, object]], app: ModuleType, console: Console, progress: Progress,
         engine: StreamEngine) -> dict[str, object]:
    """Feed ``events`` through Spark Structured Streaming into ``engine``'s pattern queries
    (``spark_bridge.ingest(…, handler=streams.QueriesHandler(engine))``; an ``activedb.streams.StreamEngine``
    built with ``record_dead_letters=False``).

    The events are written as JSON files (one micro-batch each, ``app.SCHEMA``), read as a file stream
    with a checkpoint in the same temporary folder, renamed to the paper's vocabulary (``ENTER``…,
    ``HCW-ID``, ``location``), the time a Spark timestamp with a 30 s watermark (each batch's
    punctuation), and run to the end (``availableNow``), then ``END_OF_STREAM``.  What is printed comes
    from the ledger, read back from PostgreSQL; ``progress`` (an ``activedb.progress.Progress``) hears of
    Spark's start and of every committed micro-batch.  Returns ``{"dead_letter_query": ledger query id}``
    (where the run's dead letters are kept).
    """
    import activedb
    import spark_bridge
    from activedb.ingest import END_OF_STREAM_BATCH

    progress.start("micro-batches", total=SPARK_FILES)
    progress.note("starting Spark (local[2]; about 10 s) ...")
    # Spark's warnings go to a log file, not between the demo's lines.
    log = activedb.default_home() / "logs" / "spark.log"
    # Ctrl-C is a request from here on, acted on between py4j calls: pyspark's own SIGINT handler (installed with its
    # SparkContext) calls into the JVM and raises wherever the main thread is — inside a py4j call, py4j then logs
    # its tracebacks.  The first Ctrl-C lets the batch in progress finish, stops the query and ends the demo
    # (KeyboardInterrupt: `activedb: interrupted`, exit 130), as `activedb run` stops; the second at once.
    # (Python handles signals in the main thread only: a demo fed from another thread has no Ctrl-C of its own.)
    in_main_thread = threading.current_thread() is threading.main_thread()
    stop = StopRequest()
    stop.at_once = functools.partial(exit_at_once, console)
    if in_main_thread:
        stop.install()
    try:
        spark = spark_bridge.get_spark(warnings_to=log)
        if in_main_thread:
            stop.install()               # (again: the SparkContext just put pyspark's handler in its place)
        if stop.event.is_set():
            raise KeyboardInterrupt
        statistics, released = _run(db, spark, events, app, progress, engine, log, stop, console)
    finally:
        stop.restore()
    if stop.event.is_set():             # (asked for while the stream's end was released: it is done by now)
        raise KeyboardInterrupt
    console.print(
        f"fed {many(len(events), 'event')} through Spark Structured Streaming into the pattern queries: "
        f"{many(statistics.batches, 'micro-batch', 'micro-batches')} (each one transaction, punctuated by Spark's "
        f"watermark) and the end-of-stream release, {many(statistics.events, 'stream transaction')} committed "
        f"({released} released at the end of the stream), {many(statistics.dead_letters, 'dead letter')} (late, "
        f"rejected or malformed)")
    ledger = db.table("activedb_ingestion_ledger")
    with db.engine.connect() as connection:      # this run's rows only: its query id is new with its checkpoint
        batches, last, applied, letters = connection.execute(sa.select(
            sa.func.count().filter(ledger.c.batch_id != END_OF_STREAM_BATCH), sa.func.max(ledger.c.batch_id),
            sa.func.sum(ledger.c.events), sa.func.sum(ledger.c.dead_letters)).where(
                ledger.c.query_id == statistics.query_id)).one()
    console.print(f"ingestion ledger in PostgreSQL for query {statistics.query_id}: "
                  f"{many(batches, 'batch', 'batches')} committed (last batch id {last}) and the end-of-stream release "
                  f"(batch {END_OF_STREAM_BATCH}), {many(applied, 'event')}, {many(letters, 'dead letter')} — "
                  f"{applied + letters} of the {many(len(events), 'row')}")
    return {"dead_letter_query": statistics.query_id}


def _run(db: Database, spark: SparkSession, events: list[dict[str, object]], app: ModuleType, progress: Progress,
         engine: StreamEngine, log: Path, stop: StopRequest, console: Console) -> tuple[IngestStatistics, int]:
    """The events through Spark into ``engine`` to the end of the stream: the sink's statistics and how many events
    the end of the stream released.  ``stop`` set (Ctrl-C) stops the query and raises ``KeyboardInterrupt``."""
    import spark_bridge
    from activedb.streams import QueriesHandler
    from pyspark.errors import StreamingQueryException
    from pyspark.sql import functions as F

    with tempfile.TemporaryDirectory(prefix="activedb-demo-") as folder:
        source = Path(folder) / "badge-events"
        write_event_files(source, events, max(1, -(-len(events) // SPARK_FILES)), time.time() - SPARK_FILES)
        frame = (spark.readStream.schema(app.SCHEMA).option("maxFilesPerTrigger", 1).json(str(source))
                 .select(F.upper(F.col("type")).alias("type"), F.col("worker").alias("HCW-ID"),
                         F.col("room").alias("location"), F.timestamp_seconds(F.col("ts")).alias("ts")))
        query = spark_bridge.ingest(db, frame, mapping=spark_bridge.EventMapping(
                                        "type", "HCW-ID", "ts", payload_columns=("location",)),
                                    query_name="hand_hygiene_demo_queries",
                                    checkpoint_location=str(Path(folder) / "checkpoint"),
                                    trigger={"availableNow": True}, handler=QueriesHandler(engine),
                                    watermark_delay="30 seconds")
        sink = spark_bridge.sink_of(query)
        stop.at_once = functools.partial(exit_at_once, console, sink)
        progress.note("waiting for the first micro-batch ...")
        try:
            while not query.awaitTermination(0.5):  # type: ignore[arg-type]  # (seconds: pyspark takes a float too)
                if stop.event.is_set():       # (the batch in progress first: stopped halfway, Spark prints traces)
                    _stop_query(query, sink, stop, console)
                    raise KeyboardInterrupt
                done = sink.statistics().batches
                if done:
                    progress.update(done, f"micro-batches committed ({sink.statistics().events} events)")
        except StreamingQueryException:     # (the query failed: awaitTermination raises it)
            pass
        progress.update(sink.statistics().batches, f"micro-batches committed ({sink.statistics().events} events)")
        failure = query.exception()
        if failure is not None:
            raise SparkBridgeError(_failure(sink, failure, log))
        released = spark_bridge.end_of_stream(query)
        statistics = sink.statistics()          # the release included: its events and dead letters
    return statistics, released


def _failure(sink: Ingestion, failure: BaseException, log: Path) -> str:
    """One line for ``activedb demo`` when the query failed: the failed batch's Python cause (Spark's message wraps
    it in a Java stack trace), or Spark's first line."""
    found = sink.last_failure()
    cause = (f"batch {found[0]} failed: {describe(found[1])}" if found is not None else
             first_line(failure).split("Reason: ", 1)[-1])
    return (f"the demo's streaming query failed: {cause} (Spark's log: {log}); fix the cause and run the demo again, "
            f"or run it without Spark (activedb demo --no-spark)")
