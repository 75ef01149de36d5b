"""The Prometheus collector: reads the existing statistics and status queries at scrape time, through
public interfaces only.  The families and their sources, and why a failing source is only skipped: the
design note, ``README.md``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol

from activedb._handle import DatabaseHandle
from activedb.extras import Extra, needs
from activedb.metrics._latency import BatchLatency
from activedb.metrics.errors import MetricsError

with needs(Extra.METRICS, "Prometheus metrics (activedb.metrics)"):
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
    from prometheus_client.registry import Collector

if TYPE_CHECKING:  # pragma: no cover
    from activedb.ingest import BatchInProgress, BatchOutcome, IngestStatistics
    from activedb.capture import CaptureManager, ConsumerStatistics
    from activedb.outbox import Outbox

logger = logging.getLogger("activedb.metrics")

RULE_OUTCOMES = ("fired", "condition_false", "executed", "failed", "cancelled", "rerun_after_wait")


class ScrapedDatabase(DatabaseHandle, Protocol):
    """The database as the collector reads it: the handle, its outbox and its change capture."""

    outbox: Outbox
    capture: CaptureManager


class IngestionSource(Protocol):
    """What an ingestion offers to be watched (the Spark bridge's sink has both)."""

    def statistics(self) -> IngestStatistics:
        """A frozen snapshot of the ingestion's counters."""

    def recent_outcomes(self) -> list[BatchOutcome]:
        """The last batches' outcomes, oldest first."""

    def batch_in_progress(self) -> BatchInProgress | None:
        """The batch running now (``seconds``, ``firing`` with ``rule`` and ``seconds``, or None), or None between
        batches."""


class ConsumerSource(Protocol):
    """What a capture consumer offers to be watched (``db.capture.consumer(...)``)."""

    def statistics(self) -> ConsumerStatistics:
        """A frozen snapshot of the consumer's counters."""


def reason_label(reason: str) -> str:
    """A dead letter's reason as a label of bounded variety: its kind (``activedb.deadletters.ReasonKind``)."""
    from activedb.deadletters import ReasonKind

    return ReasonKind.of(reason).value


def _check_source(call: str, source: object, methods: tuple[str, ...], what: str) -> None:
    """Raise MetricsError unless ``source`` (given to ``call``) has the methods a scrape reads."""
    if not all(callable(getattr(source, method, None)) for method in methods):
        raise MetricsError(f"{call}({source!r}) takes {what}: an object with {', '.join(f'{m}()' for m in methods)}")


class _PartlyRead(Exception):
    """Some parts of a source (watched ingestions or consumers) could not be read: the source is reported down, and
    ``families`` — what the other parts gave — are exported still."""

    def __init__(self, families: list[Metric]) -> None:
        super().__init__("some parts of the source could not be read")
        self.families = families


class ActivedbCollector(Collector):
    """The metric families of one :class:`~activedb.Database` and the sources watched on it.

    Thread-safe: ``_mutex`` protects ``_ingestions``, ``_ingestion_names``, ``_consumers`` and ``_consumer_names`` (the lists, not the sources,
    which are thread-safe themselves); scrapes may run concurrently with ``watch_*``."""

    def __init__(self, database: ScrapedDatabase) -> None:
        self.database = database
        self._mutex = threading.Lock()
        self._ingestions: list[tuple[IngestionSource, BatchLatency]] = []
        self._ingestion_names: set[str] = set()      # the query names of _ingestions (each exported once)
        self._consumers: list[ConsumerSource] = []
        self._consumer_names: set[str] = set()       # the names of _consumers that answered when watched

    def watch_ingestion(self, source: IngestionSource) -> None:
        """Export ``source``'s numbers, labelled with its query name; a second source of a name already watched is
        refused (:class:`MetricsError`): two samples with one label set are an invalid exposition.  One whose
        statistics cannot be read now is watched still (a scrape reports it down while it fails, and leaves it out
        if its name was exported already), as :meth:`watch_consumer` does."""
        _check_source("watch_ingestion", source, ("statistics", "recent_outcomes", "batch_in_progress"),
                      "an ingestion (activedb.ingest.Ingestion, the Spark bridge's sink)")
        try:
            name: str | None = source.statistics().query_name
        except Exception:
            name = None
        with self._mutex:
            if name is not None and name in self._ingestion_names:
                raise MetricsError(f"an ingestion of query {name!r} is watched already: a second would export the same "
                                   f"labels, which Prometheus refuses; give each ingestion its own source name")
            if name is not None:
                self._ingestion_names.add(name)
            self._ingestions.append((source, BatchLatency()))

    def watch_consumer(self, consumer: ConsumerSource) -> None:
        """Export ``consumer``'s numbers, labelled with its name; a second consumer of a name already watched is
        refused (:class:`MetricsError`).  One whose statistics cannot be read now is watched still (a scrape reports
        it down while it fails, and leaves it out if its name was exported already)."""
        _check_source("watch_consumer", consumer, ("statistics",), "a capture consumer (db.capture.consumer(name))")
        try:
            name: str | None = consumer.statistics().name
        except Exception:
            name = None
        with self._mutex:
            if name is not None and name in self._consumer_names:
                raise MetricsError(f"capture consumer {name!r} is watched already: a second would export the same "
                                   f"labels, which Prometheus refuses; watch each consumer once")
            if name is not None:
                self._consumer_names.add(name)
            self._consumers.append(consumer)

    def describe(self) -> list[Metric]:
        return []       # families depend on what is watched: let the registry call collect() lazily

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("activedb_metrics_source_up",
                               "1 if the last scrape could read this source, 0 if it failed (see the log)",
                               labels=["source"])
        for name, read in (("rules", self._rules), ("locks", self._locks), ("outbox", self._outbox),
                           ("capture", self._capture), ("dead_letters", self._dead_letters),
                           ("ingestion", self._ingestion), ("capture_consumers", self._capture_consumers)):
            try:
                families = list(read())
            except _PartlyRead as partial:      # some of the source's parts failed: the others' samples still go out
                up.add_metric([name], 0)
                yield from partial.families
                continue
            except Exception as error:          # a scrape must not fail because one source did
                logger.warning("metrics: could not read %s: %s", name, error)
                up.add_metric([name], 0)
                continue
            up.add_metric([name], 1)
            yield from families
        yield up

    # --- the sources ---------------------------------------------------------------------------

    def _rules(self) -> Iterator[Metric]:
        statistics = self.database.rules.statistics()
        firings = CounterMetricFamily("activedb_rule_firings", "Rule firings of this process, per rule and "
                                      "outcome (fired: triggered, per attempt; then condition_false, executed "
                                      "(took effect: counted once its transaction committed), failed, cancelled, "
                                      "rerun_after_wait)", labels=["rule", "outcome"])
        for rule, counters in sorted(statistics.per_rule.items()):
            for outcome in RULE_OUTCOMES:
                firings.add_metric([rule, outcome], getattr(counters, outcome))
        yield firings
        yield GaugeMetricFamily("activedb_rules", "Rules declared on this database object", value=statistics.rules)
        yield GaugeMetricFamily("activedb_rules_enabled", "Rules enabled", value=statistics.enabled)

    def _locks(self) -> Iterator[Metric]:
        statistics = self.database.transactions.locks.statistics()
        yield CounterMetricFamily("activedb_lock_waits", "Lock requests that had to wait", value=statistics.waits)
        yield CounterMetricFamily("activedb_deadlocks", "Deadlock cycles resolved by choosing a victim",
                                  value=statistics.deadlocks)
        yield CounterMetricFamily("activedb_lock_timeouts", "Lock requests that timed out", value=statistics.timeouts)
        yield GaugeMetricFamily("activedb_lock_waiting", "Lock requests waiting now", value=statistics.waiting)
        yield GaugeMetricFamily("activedb_locks", "Resources with a holder, retainer or waiter now",
                                value=statistics.locks)
        transactions = CounterMetricFamily("activedb_transactions", "Transactions (top-level and nested), "
                                           "per event: begun, committed, aborted", labels=["event"])
        for event in ("begun", "committed", "aborted"):
            transactions.add_metric([event], getattr(statistics, event))
        yield transactions

    def _outbox(self) -> Iterator[Metric]:
        statistics = self.database.outbox.statistics()
        firings = GaugeMetricFamily("activedb_outbox_firings", "Detached rule firings in the outbox, per status",
                                    labels=["status"])
        for status in ("pending", "done", "failed"):
            firings.add_metric([status], getattr(statistics, status))
        yield firings

    def _capture(self) -> Iterator[Metric]:
        status = self.database.capture.status()
        backlog = GaugeMetricFamily("activedb_capture_backlog_changes", "Captured changes waiting for a "
                                    "consumer, per consumer and table (consumer \"\": retained, no consumer)",
                                    labels=["consumer", "table"])
        lag = GaugeMetricFamily("activedb_capture_lag_seconds", "Age of the oldest change waiting for the "
                                "consumer (0: caught up)", labels=["consumer"])
        if status.installed:
            for consumer in status.consumers:
                for table in consumer.tables:
                    backlog.add_metric([consumer.name, table.table], table.changes)
                lag.add_metric([consumer.name], consumer.lag_seconds or 0.0)
            for table in status.unconsumed:
                backlog.add_metric(["", table.table], table.changes)
        yield backlog
        yield lag

    def _dead_letters(self) -> Iterator[Metric]:
        from activedb import deadletters

        letters = GaugeMetricFamily("activedb_dead_letters", "Dead letters not yet replayed, per kind of reason "
                                    "(activedb.deadletters.ReasonKind)", labels=["reason"])
        # (Counted per kind by PostgreSQL, every kind, 0 for those with no letter: a series present from the start,
        # for rates and alerts.)
        for kind, count in deadletters.count_by_kind(self.database, deadletters.LetterFilter(replayed=False)).items():
            letters.add_metric([kind.value], count)
        yield letters

    def _ingestion(self) -> Iterator[Metric]:
        with self._mutex:
            ingestions = list(self._ingestions)
        families = {field: CounterMetricFamily(f"activedb_ingest_{field}", text, labels=["query"]) for field, text in (
            ("batches", "Batches committed"),
            ("batches_skipped", "Batches the ledger already had (delivered again, not applied again)"),
            ("rows", "Rows received"), ("events", "Events applied"),
            ("dead_letters", "Rows that went to the dead letters"))}
        firings = CounterMetricFamily("activedb_ingest_rule_firings", "Rule firings in committed batches",
                                      labels=["query", "rule"])
        lag = GaugeMetricFamily("activedb_ingest_watermark_lag_seconds", "Wall clock minus the stream's "
                                "watermark", labels=["query"])
        latency = HistogramMetricFamily("activedb_batch_seconds", "Seconds a micro-batch took in the sink",
                                        labels=["query"])
        running = GaugeMetricFamily("activedb_ingest_batch_in_progress_seconds", "How long the batch in progress has "
                                    "run (absent between batches)", labels=["query"])
        oldest = GaugeMetricFamily("activedb_ingest_oldest_firing_seconds", "How long the oldest rule firing still "
                                   "running in the batch in progress has run", labels=["query", "rule"])
        exported: set[str] = set()
        failed = 0
        for source, histogram in ingestions:
            try:
                statistics = source.statistics()
                batch = source.batch_in_progress()
                outcomes = source.recent_outcomes()
            except Exception as error:          # one ingestion down must not hide the others' samples
                logger.warning("metrics: could not read ingestion %r: %s", source, error)
                failed += 1
                continue
            if statistics.query_name in exported:       # (an ingestion that could not say its name when watched)
                logger.warning("metrics: two watched ingestions are of query %r; exporting the first",
                               statistics.query_name)
                continue
            exported.add(statistics.query_name)
            if batch is not None:
                running.add_metric([statistics.query_name], batch.seconds)
                if batch.firing is not None:
                    oldest.add_metric([statistics.query_name, batch.firing.rule], batch.firing.seconds)
            skipped = histogram.skipped
            histogram.absorb(outcomes)
            query = statistics.query_name
            if histogram.skipped > skipped:
                logger.warning("metrics: %d batch(es) of query %r reported a duration that is no number of seconds "
                               ">= 0; left out of activedb_batch_seconds", histogram.skipped - skipped, query)
            for field, family in families.items():
                family.add_metric([query], getattr(statistics, field))
            for rule, count in sorted(statistics.rule_firings.items()):
                firings.add_metric([query, rule], count)
            if statistics.watermark_lag_seconds is not None:
                lag.add_metric([query], statistics.watermark_lag_seconds)
            buckets, total = histogram.snapshot()
            latency.add_metric([query], buckets, total)
        if failed:
            raise _PartlyRead([*families.values(), firings, lag, latency, running, oldest])
        yield from families.values()
        yield from (firings, lag, latency, running, oldest)

    def _capture_consumers(self) -> Iterator[Metric]:
        with self._mutex:
            consumers = list(self._consumers)
        families = {
            field: CounterMetricFamily(f"activedb_capture_consumer_{field}", f"Capture consumer's {text}",
                                       labels=["consumer"])
            for field, text in (("batches", "batches committed"), ("changes", "changes handled"),
                                ("firings", "rule firings"), ("failed", "changes kept as dead letters"))
        }
        lag = GaugeMetricFamily("activedb_capture_consumer_lag_seconds", "Age of the oldest change of the "
                                "consumer's last batch when it was read", labels=["consumer"])
        exported: set[str] = set()
        failed = 0
        for consumer in consumers:
            try:
                statistics = consumer.statistics()
            except Exception as error:          # one consumer down must not hide the others' samples
                logger.warning("metrics: could not read capture consumer %r: %s", consumer, error)
                failed += 1
                continue
            if statistics.name in exported:     # (a consumer that could not say its name when watched)
                logger.warning("metrics: two watched capture consumers are named %r; exporting the first", statistics.name)
                continue
            exported.add(statistics.name)
            for field, family in families.items():
                family.add_metric([statistics.name], getattr(statistics, field))
            if statistics.lag_seconds is not None:
                lag.add_metric([statistics.name], statistics.lag_seconds)
        if failed:
            raise _PartlyRead([*families.values(), lag])
        yield from families.values()
        yield lag
