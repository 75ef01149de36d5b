"""A split source batch one partition of which fails for good: the policy (``forward`` or ``compensate``) a
connector that splits batches declares (the Spark scale-out path), the failed partition's side (its rows
dead letters, ``Ingestion.reject``), the driver's decision and compensation (``db.batches``), and what
``activedb status`` shows (the tables ``activedb_split_queries`` and ``activedb_split_failures``).  Lineage —
every batch transaction records the source batch it consumed — is the ingestion core's
(``activedb.ingest.Ingestion(lineage=True)``).  Design note: ``README.md`` in this package ("Split batches").

Thread-safety: stateless functions; :class:`FailureRow` is used by one flush at a time.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NotRequired, Protocol, TypedDict

import sqlalchemy as sa

from activedb._handle import DatabaseHandle
from activedb.atomic._batches import Batches, SplitFailure
from activedb.atomic.errors import AtomicBatchError, PartitionFailed, UnknownBatch
from activedb.errors import Failure
from activedb.ingest import BatchOutcome, Ingestion, LedgerId, Rows
from activedb.ingest.errors import IngestError, describe
from activedb.txn import CommitParticipant

if TYPE_CHECKING:  # pragma: no cover
    from activedb.txn import Transaction

__all__ = ["PartitionReport", "SplitBatchStatus", "SplitState", "as_policy", "split_status"]

logger = logging.getLogger("activedb.atomic")

QUERIES_TABLE = "activedb_split_queries"
FAILURES_TABLE = "activedb_split_failures"


class SplitState(enum.Enum):
    """The state of a failed partition of a source batch (``activedb_split_failures.state``).

    Transitions: PENDING_COMPLETION → COMPLETED (forward: the batch was re-run after the fix and the
    partition committed); PENDING_COMPLETION → COMPENSATING (the query was restarted with
    ``on_partition_failure="compensate"`` and the partition failed again); COMPENSATING → COMPENSATED."""

    PENDING_COMPLETION = "pending completion"
    COMPLETED = "completed"
    COMPENSATING = "compensating"
    COMPENSATED = "compensated"


class PartitionReport(TypedDict):
    """What the task of one partition of a split batch reports to the driver: its outcome, and for a partition
    whose batch transaction failed (``failed``) the error, whether it was not the partition's fault
    (``infrastructure``: a transient failure — PostgreSQL unusable, a conflict or deadlock that used up the
    attempts), what it was (``failure``: ``activedb.errors.classify``'s) and the top-level attempts the batch
    had (``attempts``: its ``batch_attempts``, for a conflict)."""

    partition: int
    outcome: BatchOutcome
    failed: NotRequired[bool]
    error: NotRequired[str]
    infrastructure: NotRequired[bool]
    failure: NotRequired[Failure]
    attempts: NotRequired[int]


def as_policy(value: object) -> SplitFailure:
    """``on_partition_failure`` as a :class:`activedb.atomic.SplitFailure`, or a clear error."""
    raw = value.value if isinstance(value, enum.Enum) else value
    if isinstance(raw, str) and raw in {member.value for member in SplitFailure}:
        return SplitFailure(raw)
    raise IngestError(f"on_partition_failure must be 'forward' (re-run the failed partition after the fix) or "
                          f"'compensate' (undo the committed partitions), got {value!r}")


# --- the policy a query declared -------------------------------------------------------------------------

def declare_policy(db: DatabaseHandle, query_id: str, query_name: str, partitions: int, policy: SplitFailure,
                   partition_key: tuple[str, str] | None = None) -> None:
    """Record (upsert) the scale-out query's partition count and policy, for ``activedb status``, and
    ``partition_key`` — (column, type as the connector names it) the batches are partitioned by, or None when the
    connector does not say —, which a replayed batch's layout is checked against (the connector's check)."""
    column, column_type = partition_key if partition_key is not None else (None, None)
    with db.engine.begin() as connection:
        connection.execute(sa.text(
            f"INSERT INTO {QUERIES_TABLE} (query_id, query_name, partitions, on_partition_failure, partition_key, "
            "partition_key_type) VALUES (:q, :name, :n, :policy, :key, :key_type) ON CONFLICT (query_id) DO UPDATE "
            "SET partitions = EXCLUDED.partitions, on_partition_failure = EXCLUDED.on_partition_failure, "
            "partition_key = EXCLUDED.partition_key, partition_key_type = EXCLUDED.partition_key_type, "
            "declared_at = now()"),
            {"q": query_id, "name": query_name, "n": partitions, "policy": policy.value, "key": column,
             "key_type": column_type})


# --- the failed task's side ---------------------------------------------------------------------------------

class FailureRow(CommitParticipant):
    """Writes (upserts) a failed partition's ``activedb_split_failures`` row inside a flush, or on a
    connection of its own (:meth:`upsert`)."""

    def __init__(self, query_id: str, batch_id: int, partition: int, partitions: int, policy: SplitFailure,
                 state: SplitState, error: str):
        self.values = {"q": query_id, "b": batch_id, "p": partition, "n": partitions, "policy": policy.value,
                       "state": state.value, "error": error}

    def write(self, transaction: Transaction, connection: sa.Connection) -> None:
        self.upsert(connection)

    def upsert(self, connection: sa.Connection) -> None:
        connection.execute(sa.text(
            f"INSERT INTO {FAILURES_TABLE} (query_id, batch_id, partition, partitions, policy, state, error) "
            "VALUES (:q, :b, :p, :n, :policy, :state, :error) ON CONFLICT (query_id, batch_id, partition) DO UPDATE "
            "SET policy = EXCLUDED.policy, state = EXCLUDED.state, error = EXCLUDED.error, failed_at = now(), "
            "settled_at = NULL, compensated = NULL"), dict(self.values))


def settle_failed_partition(sink: Ingestion, rows: Rows, query_id: str, batch_id: int,
                            partition: int, partitions: int, error: BaseException) -> int:
    """Policy *compensate*, in the failed task: the partition's rows become dead letters, with its ledger row
    (0 events) and its failure row (*compensating*), in one transaction (``Ingestion.reject``, exactly once as
    every batch).  Returns the number of letters.

    From then on a replay of the batch skips this partition (the ledger has it), and the driver — now or
    after a restart — compensates the partitions that committed."""
    reason = (f"partition {partition} of batch {batch_id} failed for good ({describe(error)}); the source batch "
              f"was compensated (on_partition_failure='compensate') — replay these rows once the cause is fixed")
    failure = FailureRow(str(LedgerId.parse(query_id).whole()), batch_id, partition, partitions,
                         SplitFailure.COMPENSATE, SplitState.COMPENSATING, describe(error))
    outcome = sink.reject(rows, batch_id, query_id=query_id, reason=reason, participants=(failure,))
    return outcome.dead_letters


# --- the driver's side ------------------------------------------------------------------------------------------

class SplitDriverDatabase(DatabaseHandle, Protocol):
    """The driver's database, as the decision and compensation of a split batch use it: a
    :class:`~activedb._handle.DatabaseHandle` with its atomic batches (``db.batches``: an ``activedb.Database``
    has them)."""

    @property
    def batches(self) -> Batches: ...


def compensate_split(db: SplitDriverDatabase, source: str, batch_id: int) -> int:
    """Compensate the committed partitions of ``(source, batch_id)`` and mark its *compensating* rows
    *compensated*; the number of transactions compensated (by this call and before).  Resumable."""
    try:
        report = db.batches.settle_failed_split((source, batch_id), on_failure=SplitFailure.COMPENSATE)
        assert report is not None, "settle_failed_split(on_failure=COMPENSATE) always reports"
        compensated = len(report.compensated) + len(report.plan.already)
    except UnknownBatch:
        compensated = 0          # no partition committed (or lineage is off): nothing to undo
    except AtomicBatchError as error:     # (NoCompensation, UnsafeUndo, CompensationFailed, LineageError)
        raise PartitionFailed(
            f"batch {batch_id} of {source}: a partition failed for good and compensating the committed ones "
            f"failed: {error}. The failed partition's rows are dead letters; fix the cause (declare the "
            f"compensation on the driver's database) and restart the query from its checkpoint — the "
            f"compensation resumes where it stopped") from error
    with db.engine.begin() as connection:
        _settle_rows(connection, source, batch_id, SplitState.COMPENSATING, SplitState.COMPENSATED, compensated)
    logger.warning("batch %s of %s: a partition failed for good; %d committed transaction(s) compensated, the "
                   "failed partition's rows are dead letters", batch_id, source, compensated)
    return compensated


def _settle_rows(connection: sa.Connection, source: str, batch_id: int, state: SplitState, settled: SplitState,
                 compensated: int | None = None) -> None:
    """The batch's failure rows in ``state`` are ``settled`` now (``compensated``: how many transactions)."""
    connection.execute(sa.text(
        f"UPDATE {FAILURES_TABLE} SET state = :settled, settled_at = now(), compensated = coalesce(:n, compensated) "
        "WHERE query_id = :q AND batch_id = :b AND state = :state"),
        {"settled": settled.value, "n": compensated, "q": source, "b": batch_id, "state": state.value})


def after_replay(db: SplitDriverDatabase, source: str, batch_id: int) -> None:
    """A batch some partitions of which the ledger skipped (Spark re-ran it) has no failure now: a forward
    failure of it is *completed*; an interrupted compensation of it is resumed."""
    with db.engine.begin() as connection:
        _settle_rows(connection, source, batch_id, SplitState.PENDING_COMPLETION, SplitState.COMPLETED)
        compensating = connection.execute(sa.text(
            f"SELECT 1 FROM {FAILURES_TABLE} WHERE query_id = :q AND batch_id = :b AND state = :compensating"),
            {"q": source, "b": batch_id, "compensating": SplitState.COMPENSATING.value}).first()
    if compensating is not None:
        compensate_split(db, source, batch_id)


def settle(db: SplitDriverDatabase, source: str, batch_id: int, partitions: int, policy: SplitFailure,
           failures: Sequence[PartitionReport]) -> None:
    """The driver's decision for a batch some partitions of which failed (their task reports): raises
    :class:`PartitionFailed` when the query must stop (forward, or a transient failure: PostgreSQL unusable, a
    conflict or deadlock that used up the attempts), else compensates."""
    which = ", ".join(f"partition {failure['partition']}: {failure['error']}" for failure in failures)
    transient = [failure for failure in failures if failure["infrastructure"]]
    if transient:
        raise PartitionFailed(_transient_message(source, batch_id, transient))
    if policy is SplitFailure.FORWARD:          # each failed partition is *pending completion*
        with db.engine.begin() as connection:
            for failure in failures:
                FailureRow(source, batch_id, failure["partition"], partitions, SplitFailure.FORWARD,
                           SplitState.PENDING_COMPLETION, failure["error"]).upsert(connection)
        others = ("the other partitions committed" if len({failure["partition"] for failure in failures}) < partitions
                  else "no partition committed")
        raise PartitionFailed(
            f"batch {batch_id} of {source} is split and {which} failed for good; {others} "
            f"(on_partition_failure='forward'). Fix the cause and restart the query from its "
            f"checkpoint: Spark re-runs the batch, the committed partitions are skipped and the failed one is "
            f"applied. To undo the committed partitions instead, restart with on_partition_failure='compensate'")
    compensate_split(db, source, batch_id)


_CONTENDED = (Failure.SERIALIZATION_CONFLICT, Failure.DEADLOCK)


def _transient_message(source: str, batch_id: int, failures: Sequence[PartitionReport]) -> str:
    """Why the query stops for partitions that failed through no fault of theirs, and what to do: a conflict or
    deadlock (another writer got in the way on every attempt) is told from PostgreSQL being unusable."""
    def what(failure: PartitionReport) -> str:
        kind = failure.get("failure")
        if kind in _CONTENDED:
            attempts = failure.get("attempts")
            tries = f" on each of its {attempts} attempts" if attempts else ""
            return f"partition {failure['partition']} met a {kind.value}{tries} ({failure['error']})"
        met = f" ({kind.value})" if kind is not None else ""
        return f"partition {failure['partition']}: PostgreSQL was unusable{met} ({failure['error']})"

    kinds = {failure.get("failure") for failure in failures}
    advice = []
    if kinds - set(_CONTENDED):
        advice.append("once PostgreSQL is back")
    if kinds & set(_CONTENDED):
        advice.append("when the other writers of the rows this batch writes are done (if the conflicts recur, "
                      "give the sink more attempts — batch_attempts=N — or keep other writers off those rows "
                      "while the query runs)")
    return (f"batch {batch_id} of {source}: {'; '.join(what(failure) for failure in failures)}. Nothing is "
            f"compensated for a failure that is not the partition's fault: restart the query from its checkpoint "
            f"{' and '.join(advice)} — Spark re-runs the batch, the committed partitions are skipped and the "
            f"others applied")


# --- status ---------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SplitBatchStatus:
    """One source batch of a scale-out query with a failed partition (or the query's policy alone, with
    ``batch_id`` None). Immutable."""

    query_name: str
    query_id: str
    on_partition_failure: str | None
    partitions: int | None
    batch_id: int | None = None
    state: str | None = None                  # the batch's least settled partition state
    failed_partitions: tuple[int, ...] = ()
    error: str | None = None
    compensated: int | None = None
    #: (column, type) the query's batches are partitioned by (the query's row only; None: not recorded).
    partition_key: tuple[str, str] | None = None


def split_status(db: DatabaseHandle, query_name: str | None = None) -> list[SplitBatchStatus]:
    """The scale-out queries' declared policies and their batches with a partition that failed for good,
    from PostgreSQL (``activedb status``)."""
    with db.engine.connect() as connection:
        queries = connection.execute(sa.text(
            f"SELECT query_id, query_name, partitions, on_partition_failure, partition_key, partition_key_type "
            f"FROM {QUERIES_TABLE}")).all()
        failures = connection.execute(sa.text(
            f"SELECT query_id, batch_id, partition, partitions, policy, state, error, compensated "
            f"FROM {FAILURES_TABLE} ORDER BY query_id, batch_id, partition")).all()
    declared = {row.query_id: row for row in queries}
    order = [state.value for state in (SplitState.PENDING_COMPLETION, SplitState.COMPENSATING,
                                       SplitState.COMPLETED, SplitState.COMPENSATED)]
    grouped: dict[tuple[str, int], list[Any]] = {}
    for row in failures:
        grouped.setdefault((row.query_id, row.batch_id), []).append(row)
    result = [SplitBatchStatus(row.query_name, query_id, row.on_partition_failure, row.partitions,
                               partition_key=None if row.partition_key is None else (row.partition_key,
                                                                                     row.partition_key_type))
              for query_id, row in sorted(declared.items()) if query_name is None or row.query_name == query_name]
    for (query_id, batch_id), rows in sorted(grouped.items()):
        name = LedgerId.parse(query_id).source
        if query_name is not None and name != query_name:
            continue
        state = min((row.state for row in rows), key=order.index)
        result.append(SplitBatchStatus(
            name, query_id, rows[0].policy, rows[0].partitions, batch_id, state,
            tuple(row.partition for row in rows), rows[0].error,
            max((row.compensated for row in rows if row.compensated is not None), default=None)))
    return result
