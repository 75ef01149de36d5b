"""``activedb run``: Spark ingestion from the command line (its options: ``activedb run --help``).

``APP`` is what :func:`activedb.cli.application.load_app` loads (``activedb dead-letters replay APP`` takes the
same).  What ``run`` shows, how it stops and what it says
when a batch fails: the package's ``README.md`` ("Statistics and the CLI", "The console").
:func:`register_commands` adds the commands to the ``activedb`` group (``activedb status`` is
``activedb.cli.status``'s and ``dead-letters replay`` ``activedb.cli.dead_letters``': the ledger and replay are the
ingestion core's; where the events come from, ``_sources.py``).
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

import click

from activedb.cli.running import (StopRequest, command_home, dead_letter_hint, deadline_options, deadlines_of,
                                  default_source_name, describe_in_progress, exit_at_once, ledger_progress,
                                  progress_line, refuse_reset_with_progress, restart, restart_after_deadline,
                                  rules_log_for_command, status, what_to_do, where_raised)
from activedb.extras import Extra, require
from activedb.metrics import metrics_port_option, start_metrics

from spark_bridge._file_order import FileOrder, check_file_order, files_read
from spark_bridge._sources import SOURCE_FORMS, build_stream, is_missing_data_source, kafka_hint, parse_source
from spark_bridge.errors import IngestError, SparkBridgeError, describe, first_line

if TYPE_CHECKING:  # pragma: no cover
    from pyspark import SparkContext
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming.query import StreamingQuery
    from rich.console import Console

    from activedb import Database
    from activedb.cli.application import LoadedApp
    from activedb.ingest import Ingestion

__all__ = ["register_commands", "run_command"]

SINK_IDLE_TIMEOUT_SECONDS = 120.0
DETACHED_TIMEOUT_SECONDS = 60.0
REFRESH_SECONDS = 0.5
PLAIN_PROGRESS_SECONDS = 10.0  # progress line period when stdout is not a terminal
STARTING = "Spark plans the query and reads the source"  # what the wait for the first micro-batch is


def _watch(query: StreamingQuery, sink: Ingestion, console: Console, stop: StopRequest) -> str:
    """Refresh the progress line until the query ends or a stop is requested.

    On a terminal the line is live and *transient*: it is erased when watching ends (Ctrl-C echoes
    ``^C`` into it), and the caller prints the final line in full.  Returns ``"stopped"`` or ``"ended"``."""
    from rich.live import Live
    from rich.text import Text

    started = time.monotonic()

    def progress() -> str:
        return progress_line(sink.statistics(), started, sink.batch_in_progress(), starting=STARTING)

    def live_line() -> Text:
        # Three columns short of the width: the ``^C`` a terminal echoes must not wrap the line, or the
        # erase at the end would miss it.
        line = progress()
        room = max(20, console.width - 3)
        return Text(line if len(line) <= room else line[:room - 1] + "…", no_wrap=True)

    live = Live(live_line(), console=console, refresh_per_second=4, transient=True) if console.is_terminal else None
    last_print = time.monotonic()
    with live or contextlib.nullcontext():
        while not stop.event.wait(REFRESH_SECONDS):
            if live is not None:
                live.update(live_line())
            if not query.isActive:
                return "ended"
            if live is None and time.monotonic() - last_print >= PLAIN_PROGRESS_SECONDS:
                console.print(progress(), highlight=False, soft_wrap=True)
                last_print = time.monotonic()
    return "stopped"


def _stop_query(query: StreamingQuery, sink: Ingestion, stop: StopRequest, console: Console) -> None:
    """Let the batch in progress finish (unless forced), then stop the query."""
    batch = sink.batch_in_progress()
    doing = ("no batch is in progress" if batch is None else
             f"letting batch {batch.batch_id} finish ({describe_in_progress(batch)})")
    console.print(f"\nstopping: {doing} — Ctrl-C again to stop at once", highlight=False)
    deadline = time.monotonic() + SINK_IDLE_TIMEOUT_SECONDS
    while not stop.forced.is_set() and time.monotonic() < deadline:
        if sink.wait_idle(timeout=REFRESH_SECONDS):
            break
    query.stop()


# --- commands ----------------------------------------------------------------------------------

def _spark_conf(packages: str | None, entries: tuple[str, ...]) -> dict[str, str]:
    conf: dict[str, str] = {}
    for entry in entries:
        key, sep, value = entry.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{entry!r} is not KEY=VALUE", param_hint="--spark-conf")
        conf[key.strip()] = value.strip()
    if packages:
        existing = conf.get("spark.jars.packages")
        conf["spark.jars.packages"] = f"{existing},{packages}" if existing else packages
    return conf


def _started_spark() -> SparkSession | SparkContext | None:
    """What an interrupted start left running (a session, or a bare SparkContext), to be stopped; or None."""
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    return SparkSession.getActiveSession() or getattr(SparkContext, "_active_spark_context", None)


def _quiet_query_failures(spark: SparkSession) -> None:
    """``run`` reports a failed query itself (the Python cause, what to do): keep Spark from logging the same
    failure as a Java stack trace ("Query ... terminated with error", logged at ERROR by the stream's
    execution class)."""
    try:
        jvm = spark.sparkContext._jvm
        if jvm is None:
            return
        level = jvm.org.apache.logging.log4j.Level.FATAL
        for logger_name in ("org.apache.spark.sql.execution.streaming.runtime.MicroBatchExecution",
                            "org.apache.spark.sql.execution.streaming.MicroBatchExecution"):
            jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(logger_name, level)
    except Exception:          # another logging backend: the trace is printed, the message below too
        pass


def failure_message(sink: Ingestion, failure: BaseException, app: str) -> str:
    """What ``run`` prints when the query failed: the Python cause and one line of what to do."""
    found = sink.last_failure()
    if found is not None:
        batch, error = found
        cause = f"batch {batch} failed: {describe(error)}{where_raised(error)}"
        return f"{cause}\n  what to do: {what_to_do(error, app)}"
    if "CONCURRENT_STREAM_LOG_UPDATE" in str(failure):
        return (f"the streaming query failed: another process runs this query too, on the same checkpoint (Spark "
                f"found its log written by another writer: CONCURRENT_STREAM_LOG_UPDATE)\n  what to do: stop the "
                f"other one, or run this one with its own --query-name (or --checkpoint); the batches it committed "
                f"stay committed, exactly once")
    text = first_line(failure).split("Reason: ", 1)[-1]
    return (f"the streaming query failed: {text}\n  what to do: check the source and the Spark options, then "
            f"run the same command again: it resumes from the checkpoint")


def _progress(database: Database, name: str, checkpoint_dir: Path) -> list[str]:
    """What query ``name`` has done so far, in words (empty: it starts over): its ledger rows, its checkpoint's
    committed micro-batches."""
    found = ledger_progress(database, name)
    commits = checkpoint_dir / "commits"         # Spark's log of the micro-batches it committed
    committed = sum(1 for path in commits.iterdir() if path.name.isdigit()) if commits.is_dir() else 0
    if committed:
        found.append(f"the checkpoint {checkpoint_dir} has {committed:,} committed batches")
    return found


class CheckpointInUse(click.ClickException):
    """Another ``activedb run`` holds the query's checkpoint."""


@contextlib.contextmanager
def _checkpoint_lock(checkpoint_dir: Path, name: str) -> Iterator[None]:
    """Hold ``checkpoint_dir/.activedb-run.lock`` (an exclusive ``flock``, released when this process ends,
    however it ends) while ``run`` uses the checkpoint: two runs of one query on one checkpoint would both
    write Spark's logs there, and the later writer fails in the middle of a batch."""
    import fcntl

    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    path = checkpoint_dir / ".activedb-run.lock"
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(descriptor, 64, 0).decode(errors="replace").strip() or "?"
            raise CheckpointInUse(
                f"query {name!r} is running in another process (pid {holder}), on the same checkpoint "
                f"{checkpoint_dir}: two runs of one query cannot share it. Stop that one first (Ctrl-C), or give "
                f"this run another --query-name (or --checkpoint)") from None
        os.ftruncate(descriptor, 0)
        os.pwrite(descriptor, str(os.getpid()).encode(), 0)
        yield
    finally:
        os.close(descriptor)


@click.command("run")
@click.argument("app")
@click.option("--source", "source_text", required=True, help=f"Where events come from: {SOURCE_FORMS}.")
@click.option("--checkpoint", type=click.Path(file_okay=False), default=None,
              help="Spark checkpoint directory (default: ACTIVEDB_HOME/checkpoints/QUERY_NAME). Restarting from it "
                   "resumes the query exactly once.")
@click.option("--query-name", default=None,
              help="Stable name of the query (default: the app's name). A new name (or a new --checkpoint) starts "
                   "over: every file of a file source is read again.")
@click.option("--reset", is_flag=True, help="Empty the application's tables first (calls the app's reset(db)); "
                                            "without it, a run continues from what earlier runs left. Refused "
                                            "when the query already has progress (ledger or checkpoint): use a "
                                            "new --query-name to start over.")
@click.option("--format", "file_format", type=click.Choice(["json", "csv", "parquet"]), default="json",
              show_default=True, help="File format of a file source.")
@click.option("--max-files-per-trigger", type=click.IntRange(min=1), default=None,
              help="File source: files per micro-batch.")
@click.option("--file-order", type=click.Choice([order.value for order in FileOrder]), default=FileOrder.CHECK.value,
              show_default=True,
              help="File source with --max-files-per-trigger (JSON lines): Spark reads files oldest-modified first, "
                   "so files whose modification times contradict their events (a copy that did not keep them) "
                   "would make events late. check: refuse to start, saying which; events: set the times in the "
                   "order of the events first; as-is: read them as they are.")
@click.option("--rows-per-second", type=click.IntRange(min=1), default=100, show_default=True,
              help="Rate source: rows per second.")
@click.option("--trigger", default=None, help="Processing-time trigger, e.g. '5 seconds' (default: back to back).")
@click.option("--available-now", is_flag=True, help="Process what is available now, then stop.")
@click.option("--watermark-delay", default=None, help="Event-time watermark delay, e.g. '30 seconds'.")
@click.option("--partitions", type=click.IntRange(min=1), default=None,
              help="Scale-out path: repartition each batch by key over N Spark tasks, each with its own engine.")
@click.option("--on-partition-failure", type=click.Choice(["forward", "compensate"]), default=None,
              help="Scale-out path: when a partition fails for good, stop and complete the batch after the fix "
                   "(forward, the default) or compensate the committed partitions and go on (compensate).")
@click.option("--master", default="local[2]", show_default=True, metavar="URL",
              help="Spark master: local[N] (this machine) or a cluster's (spark://HOST:7077, yarn, k8s://...). On a "
                   "cluster the scale-out tasks (--partitions) connect to PostgreSQL from the executors: a server "
                   "they reach over TCP (spark_bridge/README.md, 'Running on a cluster').")
@click.option("--py-files", "py_files", multiple=True, metavar="FILES",
              help="Comma-separated .py, .zip or .egg files the executors' Python workers import, as spark-submit's "
                   "--py-files (repeatable); an APP given as a .py file is sent to them by itself.")
@click.option("--packages", default=None, help="Maven coordinates added to spark.jars.packages "
                                               "(e.g. the Kafka connector).")
@click.option("--spark-conf", "spark_conf_entries", multiple=True, metavar="KEY=VALUE",
              help="Extra Spark configuration (repeatable).")
@click.option("--verbose", is_flag=True, help="Also log each event the rules reject (they go to the dead-letter "
                                              "table either way).")
@deadline_options(unwatched="; not with --partitions")
@click.option("--record-detached", is_flag=True,
              help="Record every detached-family rule firing in the outbox, to run in a transaction of its own; by "
                   "default a batch runs those whose action only inserts rows in its own commit, with no record.")
@metrics_port_option
@click.pass_context
def run_command(ctx: click.Context, app: str, source_text: str, checkpoint: str | None, query_name: str | None,
                reset: bool, file_format: str, max_files_per_trigger: int | None, file_order: str, rows_per_second: int,
                trigger: str | None, available_now: bool, watermark_delay: str | None, partitions: int | None,
                packages: str | None, spark_conf_entries: tuple[str, ...], verbose: bool,
                on_partition_failure: str | None = None, metrics_port: str | None = None, master: str = "local[2]",
                py_files: tuple[str, ...] = (), rule_deadline: float = 0.0, batch_deadline: float = 0.0,
                record_detached: bool = False) -> None:
    """Ingest a stream into APP's rules until stopped (Ctrl-C stops cleanly).

    \b
    APP is a module name (package.module) or a .py file that provides:
      register(db)   declares its rules on db (required)
      MAPPING        which columns make an event: a spark_bridge.EventMapping, or the dict
                     {"type_column": ..., "key_column": ..., "ts_column": ..., "payload_columns": [...]}
                     (required)
      SCHEMA         the rows' Spark schema, e.g. "type STRING, key STRING, ts DOUBLE" (file, socket
                     and Kafka sources need it)
      MIGRATIONS     its Alembic directory, upgraded before ingesting (optional)
      PREFETCH, KNOWN_TYPES, WATERMARK_DELAY, from_rate(df), reset(db)   (optional)
    Example: activedb.examples.hand_hygiene.app (events: `activedb demo --write-events DIR`).

    \b
    Each micro-batch commits to PostgreSQL with its ledger row, exactly once; restarting with the
    same --checkpoint and --query-name resumes. Rows the rules reject go to the dead letters
    (`activedb dead-letters list`). The application's tables keep what earlier runs left: events
    older than that state may be rejected as late; --reset starts from empty tables (refused once
    the query has progress in the ledger or the checkpoint: a resumed run would lose data).
    """
    import spark_bridge
    from activedb import mask_secrets
    from activedb.cli import console as make_console, open_database, register_app
    from activedb.cli.application import app_handler, disabled_rules_note, require_rules
    from activedb.ingest import RulesHandler
    from spark_bridge._cluster import check_database_for_executors

    source = parse_source(source_text)
    conf = _spark_conf(packages, spark_conf_entries)
    files = [path for entry in py_files for path in entry.split(",") if path]
    for path in files:
        if not Path(path).is_file():
            raise click.BadParameter(f"no such file: {path}", param_hint="--py-files")
    if trigger is not None and available_now:
        raise click.BadParameter("does not combine with --available-now, which reads what is there in batches back to "
                                 "back and stops: give one of them", param_hint="--trigger")
    for option, parameter, seconds in (("--rule-deadline", "rule_deadline", rule_deadline),
                                       ("--batch-deadline", "batch_deadline", batch_deadline)):
        if partitions and seconds and ctx.get_parameter_source(parameter) is not click.core.ParameterSource.DEFAULT:
            raise click.BadParameter("does not combine with --partitions: the scale-out path's batches run in Spark's "
                                     "tasks, which no deadline watches; leave it out, or run without --partitions",
                                     param_hint=option)
    if on_partition_failure is not None and not partitions:
        raise click.BadParameter("is for the scale-out path only (with --partitions N); without it a batch is one "
                                 "transaction, atomic by itself", param_hint="--on-partition-failure")
    # Before anything is written (the schemas, the rules): the run would need it halfway, as `activedb demo` does.
    require(Extra.SPARK, "`activedb run` (it ingests through Spark)")
    obj = ctx.find_root().obj or {}
    console = make_console()
    loaded = _load_app(app, verbose)
    assert loaded.mapping is not None, "loaded with require_mapping=True"
    if partitions and (loaded.queries is not None or loaded.executor == "tpg"):
        elsewhere = ("its pattern queries (QUERIES; for concurrency inside a batch set SCHEDULER = 's2pl' or 'lwm')"
                     if loaded.queries is not None else
                     "the TPG executor (EXECUTOR; it splits a batch itself: StateTransactions(processes=N))")
        raise click.BadParameter(f"runs the rules in each Spark task, but {loaded.name} sends its batches to "
                                 f"{elsewhere}: leave --partitions out", param_hint="--partitions")
    try:        # (before anything is changed: QUERIES with EXECUTOR, a bad EXECUTOR or PREFETCH is refused here)
        handler = app_handler(loaded)
    except IngestError as error:
        raise click.ClickException(str(error)) from None
    name = query_name or default_source_name(app)
    home = command_home(obj.get("home"))
    checkpoint_dir = Path(checkpoint) if checkpoint else home / "checkpoints" / name

    if reset and loaded.reset is None:
        raise click.ClickException(f"--reset: application {loaded.name} has no reset(db) function")
    if source.kind == "file" and max_files_per_trigger and file_format == "json":     # before anything is read
        try:
            retimed = check_file_order(Path(str(source.path)), loaded.mapping.ts_column, max_files_per_trigger,
                                       FileOrder(file_order), read=files_read(checkpoint_dir))
        except SparkBridgeError as error:
            raise click.ClickException(str(error)) from None
        if retimed:
            console.print(retimed, highlight=False)
    held = contextlib.ExitStack()        # the checkpoint's lock, until the end of the run
    held.enter_context(_checkpoint_lock(checkpoint_dir, name))
    try:
        database = open_database(ctx, writes=True, outbox_options={"inserts_in_commit": not record_detached,
                                                                   "rule_deadline": rule_deadline or None})
    except BaseException:
        held.close()
        raise
    held.callback(database.close)
    if partitions:
        try:        # before Spark starts: a cluster's executors cannot use a socket-only database
            check_database_for_executors(database.url, conf.get("spark.master", master))
        except SparkBridgeError as error:
            held.close()
            raise click.ClickException(str(error)) from None
    from activedb.explain import serve_on_signal

    serve_on_signal(database, home / "explain")   # `activedb explain --pid PID` draws it
    spark: SparkSession | SparkContext | None = None
    metrics = None
    restart_environment: dict[str, str] | None = None   # to restart this command in (a deadline passed)
    stop = StopRequest()
    stop.at_once = functools.partial(exit_at_once, console)
    try:
        metrics = start_metrics(database, metrics_port)
        if metrics is not None:
            console.print(f"metrics: {metrics.url}", highlight=False)
        if loaded.migrations is not None:
            database.upgrade_app(loaded.migrations)
        progress = _progress(database, name, checkpoint_dir)
        if reset:
            refuse_reset_with_progress(progress, name)
        register_app(loaded.register, database, loaded.name)
        if isinstance(handler, RulesHandler):       # (before Spark starts: each batch would be refused)
            require_rules(database, loaded.name, "its batches go to the rules (it has no QUERIES, and no EXECUTOR "
                                                 "= 'tpg')")
        # Every refusal decided up front came first: --reset empties the tables only for a run that goes on.
        if reset and loaded.reset is not None:        # (--reset without reset(db) was refused above)
            loaded.reset(database)
            console.print(f"reset: {loaded.name}'s tables are empty", highlight=False)
        if isinstance(handler, RulesHandler):
            note = disabled_rules_note(database, loaded.name)
            if note is not None:
                console.print(note, style="yellow", markup=False, highlight=False, soft_wrap=True)
        # The event types the stream rules name (a rule on every stream event, db.stream spec without a source,
        # names none: the rate source's events are then of type 'rate').
        event_types = sorted({rule.on.source for rule in database.rules
                              if rule.on.kind == "stream" and rule.on.source is not None})
        console.print(f"[bold]activedb run[/bold] {loaded.name}: {len(database.rules.names())} rules, "
                      f"source {source.describe()}, query {name!r}, checkpoint {checkpoint_dir}", highlight=False)
        spark_log = home / "logs" / "spark.log"
        stop.install()      # from here Ctrl-C is a request: Spark's start is not cut halfway (no orphaned JVM)
        try:
            try:
                with status(console, f"starting Spark (10-30 s; its warnings go to {spark_log}) ..."):
                    spark = spark_bridge.get_spark(f"activedb-run-{name}", master=master, conf=conf,
                                                   warnings_to=spark_log, py_files=files)
            except KeyboardInterrupt:          # pyspark's own SIGINT handler, installed with its SparkContext
                stop.event.set()
                spark = _started_spark()
            stop.install()
            from pyspark.sql import SparkSession

            if stop.event.is_set() or not isinstance(spark, SparkSession):     # (get_spark returns a session)
                console.print("stopped while Spark was starting: nothing was ingested, Spark is stopped",
                              highlight=False)
                ctx.exit(130)
            _quiet_query_failures(spark)
            frame = build_stream(spark, source, loaded, file_format=file_format,
                                 max_files_per_trigger=max_files_per_trigger, rows_per_second=rows_per_second,
                                 event_types=event_types)
            query = spark_bridge.ingest(
                database, frame, mapping=loaded.mapping, query_name=name, checkpoint_location=str(checkpoint_dir),
                trigger={"availableNow": True} if available_now else trigger, known_types=loaded.known_types,
                watermark_delay=watermark_delay or loaded.watermark_delay, handler=handler,
                deadlines=None if partitions else deadlines_of(rule_deadline, batch_deadline),
                partition_by_key=partitions, app=app if partitions else None, on_partition_failure=on_partition_failure,
            )
        except (SparkBridgeError, IngestError) as error:
            raise click.ClickException(str(error)) from None
        sink = spark_bridge.sink_of(query)
        stop.at_once = functools.partial(exit_at_once, console, sink)
        if metrics is not None:
            metrics.watch_ingestion(sink)
        stop.install()
        how = _watch(query, sink, console, stop)
        if how == "stopped":
            _stop_query(query, sink, stop, console)
        failure = query.exception()
        try:
            database.rules.wait_idle(DETACHED_TIMEOUT_SECONDS)
        except TimeoutError as error:
            console.print(f"[yellow]{error}[/yellow]")
        final = sink.statistics()
        console.print(progress_line(final), highlight=False, soft_wrap=True)
        if final.dead_letters:
            console.print(f"{final.dead_letters:,} rows went to the dead letters: `activedb dead-letters list --query "
                          f"{name}` shows why", highlight=False, soft_wrap=True)
            for line in dead_letter_hint(database, app, name, started_over=not progress, reset=reset,
                                         source=source_text):
                console.print(line, highlight=False, soft_wrap=True)
        if failure is not None and how != "stopped":
            if is_missing_data_source(failure) and source.kind == "kafka":
                raise click.ClickException(f"the streaming query failed: {kafka_hint()}")
            restart_environment = restart_after_deadline(sink, console, final.batches > 0)
            if restart_environment is None:
                raise click.ClickException(mask_secrets(failure_message(sink, failure, loaded.name)))
        else:
            console.print("stopped cleanly; restart with the same --checkpoint and --query-name to resume"
                          if how == "stopped" else "the query finished", highlight=False)
    finally:
        stop.restore()
        if spark is not None:
            spark.stop()
        if metrics is not None:
            metrics.close()
        held.close()                     # the database, then the checkpoint's lock
    if restart_environment is not None:
        restart(restart_environment)


def _load_app(app: str, verbose: bool) -> LoadedApp:
    """``load_app(app, require_mapping=True)`` for a command (its error one line), the rules' log set for the command
    (``rules_log_for_command``)."""
    import spark_bridge

    rules_log_for_command(verbose)
    try:
        return spark_bridge.load_app(app, require_mapping=True)
    except (SparkBridgeError, IngestError) as error:
        raise click.ClickException(str(error)) from None


def register_commands(main_group: click.Group) -> None:
    """Add ``run`` to the ``activedb`` command group."""
    main_group.add_command(run_command, "run")
