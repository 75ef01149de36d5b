"""The scale-out path: a micro-batch partitioned by key, each partition in its own engine.

:class:`PartitionedIngestSink` is the ``foreachBatch`` callable when ``ingest(..., partition_by_key=N,
app=...)``: one Spark job per batch, each task applying its partition with an ``activedb.ingest.Ingestion`` on
its own ``activedb.Database`` as batch ``(q#pK, b)``.  Why it is safe, when to use it and what a failed partition
means: the package's ``README.md`` ("The scale-out path", "Atomic batches").  ``_worker_mutex`` protects
the per-process caches ``_worker_databases`` and ``_worker_sinks``; it is a leaf (no SQL, no Spark, no
user code while held).
"""

from __future__ import annotations

import datetime as dt
import functools
import importlib
import os
import pickle
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Unpack

from activedb import atomic
from activedb.atomic import PartitionReport, SplitFailure
from activedb.cli.application import Register, app_name, load_app
from activedb.extras import Extra, needs
from activedb.ingest import EventMapping, Ingestion, LedgerId, Phase, PhaseTimings, RulesHandler, as_mapping
from activedb.lowlevel import check_whole_number

from spark_bridge import _cluster
from spark_bridge._sink import (IngestSink, SinkOptions, by_position, check_arrow_types, check_columns,
                                check_key_type, check_layout)
from spark_bridge.errors import IngestError

if TYPE_CHECKING:  # pragma: no cover
    import pyarrow as pa
    from py4j.java_gateway import JavaObject
    from pyspark.sql import DataFrame

    from activedb import Database

__all__ = ["PartitionedIngestSink"]

#: The one column of what a task answers: its report, pickled (``_PartitionTask``).
REPORT_COLUMN = "report"


# Per Python worker process (see the module docstring). _worker_mutex protects both dicts.
_worker_mutex = threading.Lock()
_worker_databases: dict[tuple[str, str, object], Database] = {}
_worker_sinks: dict[tuple[object, ...], Ingestion] = {}


def _options_key(connect_options: Iterable[tuple[str, object]]) -> object:
    """``connect_options`` (name, value pairs) as part of a cache key: the pairs when they hash, else pickled as Spark
    pickles a task (a dict value, such as ``outbox_options``, does not hash)."""
    pairs = tuple(sorted(connect_options, key=lambda pair: pair[0]))
    try:
        hash(pairs)
    except TypeError:
        from pyspark import cloudpickle

        return bytes(cloudpickle.dumps(pairs))  # type: ignore[no-untyped-call]  # (pyspark's vendored cloudpickle)
    return pairs


def _worker_database(url: str, app: str | Register, connect_options: Mapping[str, object]) -> Database:
    """The worker process's ``Database`` for (URL, app, ``connect_options``), connected with those options and with the
    app's rules declared.

    The connection and the app's ``register`` run with no mutex held (they do SQL and run user code):
    two threads of one worker that race build two, and the first to publish wins — the other is closed.
    Declaring a rule is idempotent across processes (``INSERT … ON CONFLICT`` in the registry)."""
    import activedb

    key = (url, app_name(app), _options_key(connect_options.items()))
    with _worker_mutex:
        database = _worker_databases.get(key)
    if database is not None:
        return database
    register = load_app(app).register
    # The driver's sink checked the options (_check_options); this process's activedb may take other values.  Checked
    # here the same way, before connecting, so that a refused one is told as such, whatever error refuses it, and
    # anything connect raises after is about the connection.
    _check_options(connect_options)
    try:
        database = activedb.connect(url, upgrade=False, **dict(connect_options))  # type: ignore[arg-type]
    except Exception as error:
        raise _cluster.connect_failed(url, error) from error
    try:
        register(database)
    except BaseException:
        database.close()
        raise
    with _worker_mutex:
        published = _worker_databases.setdefault(key, database)
    if published is not database:
        database.close()
    return published


@dataclass(frozen=True)
class _PartitionTask:
    """The function ``mapInArrow`` runs on each partition of one batch: it applies the partition's rows (Arrow record
    batches) and answers one row, its :class:`~activedb.atomic.PartitionReport` pickled.  Picklable; runs in a
    Spark Python worker. Immutable."""

    url: str
    app: str | Register  # module name, absolute .py path, or an importable register(db) callable
    mapping: EventMapping
    query_name: str
    query_id: str  # the query's ledger id; the task appends #p<partition>
    batch_id: int
    watermark: dt.datetime | None
    known_types: frozenset[str] | None
    prefetch: tuple[tuple[str, object], ...]
    connect_options: tuple[tuple[str, object], ...]
    detached_timeout: float
    partitions: int = 1
    on_partition_failure: SplitFailure = SplitFailure.FORWARD
    lineage: bool = True
    lower_declared: bool = True
    app_shipped: bool = False   # app is the driver's path of a file shipped to the executors (_cluster.ship_app)
    #: The batch's column names, in order: the rows come named apart by position (:func:`_by_key`); None: as they are.
    columns: tuple[str, ...] | None = None
    batch_attempts: int = 3          # (the sink's: top-level attempts of a partition's batch on conflicts)
    event_ids_under: str | None = None  # (the sink's: the source whose ingested event ids count for duplicates)

    def __call__(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa
        from pyspark import TaskContext

        started = time.perf_counter()
        received = list(batches)
        # The partition's rows as Spark hands them to the task (Arrow, as ``toArrow`` hands a batch to the one-task
        # path: the same validation and dead letters); an empty partition as no rows (it is skipped by itself).
        rows: pa.Table | list[dict[str, object]] = pa.Table.from_batches(received) if received else []
        if self.columns is not None and isinstance(rows, pa.Table):
            rows = rows.rename_columns(list(self.columns))
        fetched = time.perf_counter() - started
        context = TaskContext.get()
        assert context is not None          # (a task's Python worker always has one)
        partition = context.partitionId()   # (the repartition's: 0 … partitions - 1)
        sink = self._sink()
        query_id = str(LedgerId.parse(self.query_id).partitioned(partition))
        try:
            report: PartitionReport = {"partition": partition, "outcome": sink.process(
                rows, self.batch_id, query_id=query_id, watermark=self.watermark, punctuate=False,
                extra_timings=PhaseTimings(to_arrow=fetched))}
        except Exception as error:      # reported to the driver, which decides (README.md, "Atomic batches")
            report = self._failure(sink, partition, query_id, rows, error)
        sink.db.rules.wait_idle(self.detached_timeout)
        yield pa.RecordBatch.from_pydict({REPORT_COLUMN: [pickle.dumps(report)]})

    def _failure(self, sink: Ingestion, partition: int, query_id: str, batch: pa.Table | list[dict[str, object]],
                 error: BaseException) -> PartitionReport:
        """The report of a partition whose batch transaction failed: :func:`activedb.atomic.failed_partition`, with
        this task's policy and ``batch_attempts``."""
        return atomic.failed_partition(sink, batch, query_id, self.batch_id, partition, self.partitions,
                                       self.on_partition_failure, error, attempts=self.batch_attempts)

    def _sink(self) -> Ingestion:
        key = (self.url, app_name(self.app), _options_key(self.connect_options), self.query_name, self.mapping,
               self.known_types, self.prefetch, self.lineage, self.lower_declared, self.batch_attempts,
               self.event_ids_under)
        with _worker_mutex:
            sink = _worker_sinks.get(key)
        if sink is not None:
            return sink
        app = _cluster.shipped_app(self.app) if self.app_shipped and isinstance(self.app, str) else self.app
        database = _worker_database(self.url, app, dict(self.connect_options))
        sink = Ingestion(database, self.mapping, source=self.query_name, known_types=self.known_types,
                         handler=RulesHandler(dict(self.prefetch), lower_declared=self.lower_declared),
                         lineage=self.lineage, batch_attempts=self.batch_attempts,
                         event_ids_under=self.event_ids_under)
        with _worker_mutex:
            return _worker_sinks.setdefault(key, sink)


def _check_options(options: Mapping[str, object]) -> None:
    """Refuse ``options`` (the tasks' ``activedb.connect`` keywords) that ``activedb.connect`` would — an unknown
    keyword, a value out of range or of the wrong kind, ``upgrade`` (a task never upgrades the schema: its connect
    sets it) — with an :class:`IngestError` saying to fix ``ingest(connect_options=…)``, raised by the sink's
    constructor (``ingest()``, before the query starts), where the first batch's tasks would raise it; and by each
    task before it connects (:func:`_worker_database`), for an executor's activedb that refuses what the driver's
    took."""
    import activedb

    try:
        if "upgrade" in options:
            raise TypeError("upgrade is not a task's to give: the tasks connect with upgrade=False, the driver's "
                            "connect upgrades the schema")
        activedb.Config(upgrade=False).with_keywords(**options)  # type: ignore[arg-type]  # (checked here)
    except (TypeError, ValueError) as error:     # (ValueError: BadArgument, InvalidChoice, a value a field refuses)
        raise IngestError(f"the scale-out tasks' connect_options were refused by activedb.connect ({error}); fix "
                          f"ingest(connect_options=…): each task connects with them") from None


def _check_sendable(options: Mapping[str, object]) -> None:
    """Each of ``options`` (the tasks' ``activedb.connect`` keywords) pickled as Spark pickles a task (cloudpickle): one
    that cannot be is an :class:`IngestError` naming it, raised by ``ingest()``, where Spark would fail the first
    batch's job with "Could not serialize object", naming neither the option nor what to do."""
    from pyspark import cloudpickle

    for name, value in options.items():
        try:
            cloudpickle.dumps(value)  # type: ignore[no-untyped-call]  # (pyspark's vendored cloudpickle: untyped)
        except Exception as error:
            raise IngestError(
                f"connect_options[{name!r}] = {value!r} cannot be sent to the scale-out path's Spark tasks, which "
                f"connect with these options in their own processes ({type(error).__name__}: {error}); give a value "
                f"that pickles, or leave it out (a ManualClock, which holds a lock, cannot move another process's "
                f"time)") from None


def _by_key(batch_df: DataFrame, key_column: str, partitions: int, salt: int = 0) -> DataFrame:
    """``batch_df`` hash-partitioned into ``partitions`` by the column named exactly ``key_column`` and the run's
    ``salt`` (:func:`activedb.atomic.choose_salt`; 0: by the key alone), its columns named apart by position
    (:func:`~spark_bridge._sink.by_position`; the task gives them their names back: :attr:`_PartitionTask.columns`):
    with another column named like the key but for case, ``repartition(N, col(key))`` — and ``mapInArrow``, which
    passes every column by its name — would be ambiguous and fail every batch.  A row's partition is
    ``pmod(hash(key, salt), N)`` (``pmod(hash(key), N)`` for salt 0; Spark's Murmur3 hash, :func:`salted_hash`): a
    function of the key's value, the salt and N only, whatever the column is called, so a batch lands in the
    partitions it did before."""
    from pyspark.sql import functions

    apart, names = by_position(batch_df)
    key = functions.col(apart.columns[names.index(key_column)])
    if not salt:
        return apart.repartition(partitions, key)
    return apart.repartition(partitions, key, functions.lit(salt).cast("int"))


def salted_hash(key_hash: int, salt: int) -> int:
    """Spark's ``hash(key, salt)`` (``salt`` an int) from ``key_hash``, Spark's ``hash(key)``: Murmur3 hashes the
    pair's second value with the first's hash as its seed (:func:`activedb.atomic.murmur3_int`), so the key's type does
    not matter here; ``key_hash`` itself for salt 0 (no salt term: :func:`_by_key`)."""
    return atomic.murmur3_int(salt, key_hash) if salt else key_hash


#: A first batch with more distinct key hashes than this is split with salt 0: with that many keys the hash alone
#: splits evenly, and the count stays small for the driver to collect.
SALT_KEYS = 100_000


def _first_batch_salt(batch_df: DataFrame, key_column: str, partitions: int) -> int:
    """The salt for a run whose first batch is ``batch_df`` (:func:`activedb.atomic.choose_salt` of its rows per key
    hash, one Spark job, split by :func:`salted_hash`); 0 with one partition, or with more than :data:`SALT_KEYS`."""
    if partitions <= 1:
        return 0
    from pyspark.sql import functions

    apart, names = by_position(batch_df)
    key_hash = functions.hash(functions.col(apart.columns[names.index(key_column)]))
    counts = [(row[0], row[1]) for row in apart.groupBy(key_hash).count().limit(SALT_KEYS + 1).collect()]
    return 0 if len(counts) > SALT_KEYS else atomic.choose_salt(counts, partitions, salted_hash)


class PartitionedIngestSink(IngestSink):
    """``foreachBatch`` callable of the scale-out path (the module docstring); ``partitions``, ``app``,
    ``connect_options`` (default: the driver's ``rule_execution``), ``on_partition_failure`` and
    ``lineage`` are ``ingest()``'s (:class:`~spark_bridge.IngestOptions`); ``rules``: the rule path's handler
    whose ``prefetch`` and ``lower_declared`` the tasks' own handlers take (default: ``RulesHandler()``).  The
    driver's ``db`` keeps the statistics, checks the query name against the ledger, punctuates and runs the
    compensations (declare them there too); the events are applied by the tasks' engines.  Thread-safety: as
    :class:`IngestSink`.
    """

    def __init__(self, db: Database, mapping: EventMapping, *, partitions: int, app: str | Register | None,
                 connect_options: Mapping[str, object] | None = None, detached_timeout: float = 300.0,
                 on_partition_failure: SplitFailure | str = SplitFailure.FORWARD, lineage: bool = True,
                 rules: RulesHandler | None = None, **sink_options: Unpack[SinkOptions]) -> None:
        """``sink_options``: those of :class:`IngestSink` (``query_name``, ``known_types``, …)."""
        with needs(Extra.SPARK, "the scale-out path (partition_by_key=N: its tasks take their rows through "
                                "pyspark's mapInArrow)"):
            importlib.import_module("pandas")     # (pyspark refuses mapInArrow without it)
        rules = RulesHandler() if rules is None else rules
        super().__init__(db, mapping, handler=rules, lineage=lineage, **sink_options)
        check_whole_number("ingest", "partition_by_key", partitions, 1, " (partitions of the scale-out path)",
                           error=IngestError)
        if app is None:
            raise IngestError(
                "the scale-out path (partition_by_key=N) needs app=: each Spark task starts its own engine and "
                "must declare the rules there; pass the module name or .py path of the app (it provides "
                "register(db)), or an importable register(db) function")
        if isinstance(app, (str, os.PathLike)) and str(app).endswith(".py") and not Path(app).is_file():
            raise IngestError(
                f"app={str(app)!r}: no such file; each Spark task of the scale-out path loads the application from it "
                f"(on a cluster ingest() sends the driver's copy to the executors): give the path of the "
                f"application's .py file, or a module name the tasks can import")
        session = sink_options.get("spark_session")
        if session is not None:
            _cluster.check_database_for_executors(db.url, str(session.sparkContext.master))
        self.partitions = partitions
        self.app = app
        self.on_partition_failure = atomic.as_policy(on_partition_failure)
        if self.on_partition_failure is SplitFailure.COMPENSATE and not lineage:
            raise IngestError(
                "on_partition_failure='compensate' needs lineage: the committed partitions of a failed batch are "
                "undone by the transactions recorded as consuming it, and with lineage=False none is recorded — "
                "nothing would be undone, and the batch reported compensated. Leave lineage=True (the default), or "
                "use on_partition_failure='forward'")
        #: Ledger query ids whose policy was recorded, and the salt each run's batches are split with (_declare);
        #: under self._mutex.
        self._salts: dict[str, int] = {}
        #: (ledger query id, batch id) of the batches with a failed partition not settled yet (pending completion,
        #: compensating): read once per run (``_declare``), kept up to date here; under self._mutex.
        self._unsettled: set[tuple[str, int]] = set()
        self.lower_declared = rules.lower_declared
        options = {"rule_execution": db.rules.execution, "outbox": db.outbox.options, **(connect_options or {})}
        _check_options(options)
        _check_sendable(options)
        #: A batch's task, given its ``query_id``, ``batch_id`` and ``watermark``: the rest is the run's.
        self._task = functools.partial(
            _PartitionTask, url=db.url.render_as_string(hide_password=False), app=app,
            mapping=as_mapping(mapping), query_name=self.query_name, known_types=self.context.known_types,
            prefetch=tuple(sorted(rules.prefetch.items())), connect_options=tuple(sorted(options.items())),
            detached_timeout=detached_timeout, partitions=partitions, on_partition_failure=self.on_partition_failure,
            lineage=lineage, lower_declared=rules.lower_declared, app_shipped=_cluster.ship_app(session, app),
            batch_attempts=self.context.batch_attempts, event_ids_under=self.context.event_ids_under)

    def _spark_batch(self, batch_df: DataFrame, batch_id: int, spark_query_id: str, query_id: str, *,
                     execution: JavaObject | None = None) -> None:
        # ingest()'s checks of the stream's columns, for a sink wired with foreachBatch directly: a mapped column
        # missing would make every row a dead letter, a year-month interval fail every batch's job in the tasks.
        schema = batch_df.schema
        check_columns(schema.names, self.mapping)  # type: ignore[arg-type]  # (the scale-out path has a mapping)
        check_key_type(schema, self.mapping)  # type: ignore[arg-type]  # (the scale-out path has a mapping)
        check_arrow_types(schema, scale_out=True)
        key = self.mapping.key_column  # type: ignore[union-attr]
        salt = self._declare(query_id, batch_id, (key, schema[key].dataType.simpleString()), batch_df)
        began = time.perf_counter()
        watermark = self.spark_watermark(spark_query_id, current=execution)
        task = self._task(query_id=query_id, batch_id=batch_id, watermark=watermark, columns=tuple(schema.names))
        self.phase(Phase.FETCHED, batch_id)
        # Always run the job, also for a batch whose partitions all committed: running it
        # feeds Spark's event-time statistics (see _sink.py), and each task skips by itself.
        try:
            reports = (_by_key(batch_df, key, self.partitions, salt)
                       .mapInArrow(task, f"{REPORT_COLUMN} binary").collect())
        except Exception as error:
            failure = _cluster.task_failure(error)      # what the task's Python raised, not Spark's Java trace
            if failure is None:
                raise
            raise failure from error
        # (unpickled: the tasks' own reports, from the Python workers of this job)
        results: list[PartitionReport] = [pickle.loads(row[0]) for row in reports]  # noqa: S301
        failures = [row for row in results if row.get("failed")]
        with self._mutex:
            unsettled = (query_id, batch_id) in self._unsettled
            self._unsettled.add((query_id, batch_id))       # (until settled below: settle raises to stop the query)
        if failures:
            atomic.settle(self.db, query_id, batch_id, self.partitions, self.on_partition_failure, failures)
        elif unsettled or any(not row["outcome"].committed for row in results):
            # A replay: partitions the ledger skipped, or a failed batch applied again whole (all its partitions
            # had failed).
            atomic.after_replay(self.db, query_id, batch_id)
        with self._mutex:
            self._unsettled.discard((query_id, batch_id))
        outcome = atomic.combined_outcome(query_id, batch_id, watermark, results)
        if outcome.committed:
            self.phase(Phase.COMMITTED, batch_id)
            if watermark is not None:
                self.db.punctuate(self.query_name, watermark)
        else:
            self.phase(Phase.SKIPPED, batch_id)
        self.context.book.record(outcome, began)

    def _check_layout(self, query_id: str, batch_id: int) -> None:
        """Nothing here: :meth:`_declare` checks the layout of the run's first batch, once it knows the key's type
        from the batch's schema."""

    def _declare(self, query_id: str, batch_id: int, partition_key: tuple[str, str], batch_df: DataFrame) -> int:
        """The salt the run ``query_id`` splits its batches with (:func:`_by_key`).  At the run's first batch,
        ``batch_id`` (``batch_df``): the salt the run recorded (a run recorded before salts: 0), or, for a run not
        recorded yet, the one chosen for this batch (:func:`_first_batch_salt`); check that batch's layout in the
        ledger against this sink's partitions, ``partition_key`` (the key column and its Spark type) and the salt
        (:func:`~spark_bridge._sink.check_layout`), then record them and the policy (``activedb status`` shows them),
        and read which of the query's batches have a failure to settle when they come again."""
        with self._mutex:
            if query_id in self._salts:
                return self._salts[query_id]
        recorded = atomic.declared_layout(self.db, query_id)
        if recorded is not None:
            salt = recorded.salt or 0
        else:
            salt = _first_batch_salt(batch_df, partition_key[0], self.partitions)
        check_layout(self.db, query_id, batch_id, self.partitions, partition_key, salt)
        atomic.declare_policy(self.db, query_id, self.query_name, self.partitions, self.on_partition_failure,
                              partition_key, None if recorded is not None and recorded.salt is None else salt)
        unsettled = {(query_id, batch) for batch in atomic.unsettled_batches(self.db, query_id)}
        with self._mutex:
            self._salts[query_id] = salt
            self._unsettled |= unsettled
        return salt
