"""Ingestion: the one batch protocol every source goes through — exactly once, with a ledger row, dead letters
with their true reasons, poison search and the same statistics for every connector (Spark, change capture, a
plain Python feed, the replay of dead letters).  Design note: ``README.md`` in this package.

Public names:

* the interface — :class:`LedgerId`, :class:`Batch`, :class:`Source`, :class:`Phase`, ``Rows``,
  :class:`ReservedSource` (the source names the replay of dead letters and change capture own);
* :func:`feed` (the plain connector), :func:`drive` (any pull :class:`Source`), :func:`replay_dead_letters` (and
  :func:`original_query_name`, the source a dead letter came from);
* :class:`Ingestion` (what a connector holds: ``process``, ``reject``, ``statistics``, …) on an
  :class:`IngestDatabase` (``activedb.Database`` is one), :class:`BatchHandler` and
  :class:`BatchInput` (where a batch goes), :class:`RulesHandler` (the rule path, every connector's default),
  :class:`BatchLowering`, :func:`run_as_event` (a handler's unit run in its own subtransaction as the rule path
  runs an event: its failure a dead-letter reason, the batch going on);
* the ledger — :class:`IngestionLedger`, :func:`batch_committed`, :func:`ingestion_status`, :class:`QueryStatus`,
  :func:`ledger_query_id`, :func:`parse_ledger_query_id`, :func:`sources_of_run`, :func:`forget_run`,
  :func:`unfit_source_name` (why the ledger cannot hold a source name: a connector's names say it in their words);
* validation — :class:`EventMapping`, :func:`as_mapping`, :func:`check_columns` (a stream's columns against the
  mapping), :func:`rows_to_events`, :class:`RawEvent`,
  :class:`Rejected`; for an engine's handler converting rows itself (``activedb.composite``), :func:`to_utc` (one
  timestamp, as the mapping converts it; raises :class:`~activedb.ingest.errors.InvalidField`) and
  :func:`is_arrow`;
* outcomes — :class:`BatchOutcome`, :class:`IngestStatistics`, :class:`PhaseTimings`;
* deadlines and the batch in progress — :class:`Deadlines`, :class:`BatchInProgress`, :class:`FiringInProgress`,
  :func:`batches_in_progress`, :class:`BatchReport`;
* :mod:`activedb.ingest.errors`.

Importing this package imports nothing of Spark or pyarrow.
"""

from typing import TYPE_CHECKING

from activedb import lazy
from activedb.ingest import errors

# imported on first use: `import activedb.ingest` (and `activedb.ingest.errors`, which the command line's plugins
# import to name an error) stays fast — the engine comes with the first name used
__getattr__, __dir__ = lazy.exports(__name__, {
    "activedb.ingest._database": ["IngestDatabase"],
    "activedb.ingest._failures": ["run_as_event"],
    "activedb.ingest._feed": ["RowBatches", "drive", "feed"],
    "activedb.ingest._ingestion": ["Ingestion"],
    "activedb.ingest._interface": ["Batch", "LedgerId", "Phase", "ReservedSource", "Rows", "Source"],
    "activedb.ingest._ledger": ["END_OF_STREAM_BATCH", "IngestionLedger", "QueryStatus", "batch_committed",
                                "forget_run", "ingestion_status", "ledger_query_id", "parse_ledger_query_id",
                                "sources_of_run", "unfit_source_name"],
    "activedb.ingest._mapping": ["EventMapping", "RawEvent", "Rejected", "as_mapping", "check_columns", "is_arrow",
                                 "known_type_names", "rows_to_events", "to_utc"],
    "activedb.ingest._outcome": ["BatchInProgress", "BatchOutcome", "FiringInProgress", "IngestStatistics",
                                 "PhaseTimings"],
    "activedb.ingest._protocol": ["BatchHandler", "BatchInput"],
    "activedb.ingest._replay": ["ReplayOutcome", "ReplayResult", "Replayable", "original_query_name",
                                "replay_dead_letters"],
    "activedb.ingest._rules": ["BatchLowering", "RulesHandler"],
    "activedb.ingest._watch": ["BatchReport", "Deadlines", "batches_in_progress"],
})

if TYPE_CHECKING:  # the names above, for type checkers (tests/test_typing.py keeps both lists equal)
    from activedb.ingest._database import (IngestDatabase as IngestDatabase)
    from activedb.ingest._failures import (run_as_event as run_as_event)
    from activedb.ingest._feed import (RowBatches as RowBatches, drive as drive, feed as feed)
    from activedb.ingest._ingestion import (Ingestion as Ingestion)
    from activedb.ingest._interface import (Batch as Batch, LedgerId as LedgerId, Phase as Phase, ReservedSource as
                                            ReservedSource, Rows as Rows, Source as Source)
    from activedb.ingest._ledger import (END_OF_STREAM_BATCH as END_OF_STREAM_BATCH, IngestionLedger as IngestionLedger,
                                         QueryStatus as QueryStatus, batch_committed as batch_committed, forget_run as
                                         forget_run, ingestion_status as ingestion_status, ledger_query_id as
                                         ledger_query_id, parse_ledger_query_id as parse_ledger_query_id, sources_of_run
                                         as sources_of_run, unfit_source_name as unfit_source_name)
    from activedb.ingest._mapping import (EventMapping as EventMapping, RawEvent as RawEvent, Rejected as Rejected,
                                          as_mapping as as_mapping, check_columns as check_columns, is_arrow as
                                          is_arrow, known_type_names as known_type_names, rows_to_events as
                                          rows_to_events, to_utc as to_utc)
    from activedb.ingest._outcome import (BatchInProgress as BatchInProgress, BatchOutcome as BatchOutcome,
                                          FiringInProgress as FiringInProgress, IngestStatistics as IngestStatistics,
                                          PhaseTimings as PhaseTimings)
    from activedb.ingest._protocol import (BatchHandler as BatchHandler, BatchInput as BatchInput)
    from activedb.ingest._replay import (ReplayOutcome as ReplayOutcome, ReplayResult as ReplayResult, Replayable as
                                         Replayable, original_query_name as original_query_name, replay_dead_letters as
                                         replay_dead_letters)
    from activedb.ingest._rules import (BatchLowering as BatchLowering, RulesHandler as RulesHandler)
    from activedb.ingest._watch import (BatchReport as BatchReport, Deadlines as Deadlines, batches_in_progress as
                                        batches_in_progress)

__all__ = ["END_OF_STREAM_BATCH", "Batch", "BatchHandler", "BatchInProgress", "BatchReport", "Deadlines", "FiringInProgress",
           "batches_in_progress", "BatchInput", "BatchLowering", "BatchOutcome", "EventMapping", "IngestDatabase",
           "IngestStatistics", "Ingestion", "IngestionLedger", "LedgerId", "Phase", "PhaseTimings", "QueryStatus", "RawEvent", "Rejected",
           "Replayable", "ReplayOutcome", "ReservedSource", "ReplayResult", "RowBatches", "Rows", "RulesHandler", "Source", "as_mapping",
           "batch_committed", "check_columns", "drive", "errors", "feed", "forget_run", "ingestion_status", "is_arrow", "known_type_names", "ledger_query_id",
           "original_query_name", "parse_ledger_query_id", "replay_dead_letters", "rows_to_events", "run_as_event", "sources_of_run", "to_utc",
           "unfit_source_name"]
