"""A split source batch one partition of which fails for good: the policy (``forward`` or ``compensate``) a
connector that splits batches declares (the Spark scale-out path), the failed partition's side (its rows
dead letters, ``Ingestion.reject``), the driver's decision and compensation (``db.batches``), and what
``activedb status`` shows (the tables ``activedb_split_queries`` and ``activedb_split_failures``).  Lineage —
every batch transaction records the source batch it consumed — is the ingestion core's
(``activedb.ingest.Ingestion(lineage=True)``).  Design note: ``README.md`` in this package ("Split batches").

Thread-safety: stateless functions; :class:`FailureRow` is used by one flush at a time.
"""

from __future__ import annotations

import collections
import datetime as dt
import enum
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NotRequired, Protocol, TypedDict

import sqlalchemy as sa

from activedb._handle import DatabaseHandle
from activedb.atomic._batches import Batches, SplitFailure
from activedb.atomic.errors import AtomicBatchError, BatchNotSettled, PartitionFailed, UnknownBatch
from activedb.errors import Failure, SerializationConflict, classify
from activedb.ingest import BatchOutcome, Ingestion, LedgerId, PhaseTimings, Rows
from activedb.ingest.errors import IngestError, describe
from activedb.txn import CommitParticipant

if TYPE_CHECKING:  # pragma: no cover
    from activedb.txn import Transaction

__all__ = ["LayoutTerms", "PartitionReport", "SplitBatchStatus", "SplitState", "as_policy", "check_layout",
           "combined_outcome", "declared_layout", "failed_partition", "split_status", "unsettled_batches"]

logger = logging.getLogger("activedb.atomic")

QUERIES_TABLE = "activedb_split_queries"
FAILURES_TABLE = "activedb_split_failures"
_LEDGER_TABLE = "activedb_ingestion_ledger"    # (the ingestion core's ledger: one row per committed batch)


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
                   partition_key: tuple[str, str] | None = None, salt: int | None = None) -> None:
    """Record (upsert) the scale-out query's partition count and policy, for ``activedb status``, and
    ``partition_key`` — (column, type as the connector names it) the batches are partitioned by, or None when the
    connector does not say — and ``salt`` — what the connector mixes into the key's hash to split the run's batches
    (0: nothing; None: not said, which :func:`check_layout` takes as 0) —, which a replayed batch's layout is checked
    against (the connector's check).  A connector chooses a run's salt once and keeps the recorded one
    (:func:`declared_layout`): a batch's split is a function of its keys, the salt and the partition count only."""
    column, column_type = partition_key if partition_key is not None else (None, None)
    with db.engine.begin() as connection:
        connection.execute(sa.text(
            f"INSERT INTO {QUERIES_TABLE} (query_id, query_name, partitions, on_partition_failure, partition_key, "
            "partition_key_type, salt) VALUES (:q, :name, :n, :policy, :key, :key_type, :salt) ON CONFLICT (query_id) "
            "DO UPDATE SET partitions = EXCLUDED.partitions, on_partition_failure = EXCLUDED.on_partition_failure, "
            "partition_key = EXCLUDED.partition_key, partition_key_type = EXCLUDED.partition_key_type, "
            "salt = EXCLUDED.salt, declared_at = now()"),
            {"q": query_id, "name": query_name, "n": partitions, "policy": policy.value, "key": column,
             "key_type": column_type, "salt": salt})


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
    after a restart — compensates the partitions that committed.  The letters' reason says that replaying them
    applies this partition alone (the others stay compensated): the whole batch is ingested again from the source."""
    reason = (f"partition {partition} of batch {batch_id} failed for good ({describe(error)}); the source batch "
              f"was compensated (on_partition_failure='compensate') and its other partitions stay undone: replaying "
              f"these rows applies this partition alone and leaves the batch partial — once the cause is fixed, "
              f"ingest all of the batch's rows again from the source to apply the whole batch (docs/howto/"
              f"atomic-batches.md)")
    failure = FailureRow(str(LedgerId.parse(query_id).whole()), batch_id, partition, partitions,
                         SplitFailure.COMPENSATE, SplitState.COMPENSATING, describe(error))
    outcome = sink.reject(rows, batch_id, query_id=query_id, reason=reason, participants=(failure,))
    return outcome.dead_letters


def failed_partition(sink: Ingestion, rows: Rows, query_id: str, batch_id: int, partition: int, partitions: int,
                     policy: SplitFailure, error: BaseException, *, attempts: int) -> PartitionReport:
    """In the failed task: the report of partition ``partition`` (ledger id ``query_id``, ``#pN`` included) of batch
    ``batch_id``, whose batch transaction in ``sink`` (of ``attempts`` top-level attempts, its ``batch_attempts``)
    failed with ``error``; with the policy ``compensate`` (and not
    an outage) its rows are dead letters first (:func:`settle_failed_partition`).  A transient failure
    (``activedb.errors.classify``: PostgreSQL unusable, a conflict, a deadlock) is not the partition's fault:
    replay completes the batch; the report says which (``failure``) and, for a conflict, how many attempts it used
    up (``attempts``), for the driver's ``PartitionFailed`` (:func:`settle`)."""
    failure = classify(error)
    infrastructure = failure.transient
    letters, settled = 0, False
    if not infrastructure and policy is SplitFailure.COMPENSATE:
        letters = settle_failed_partition(sink, rows, query_id, batch_id, partition, partitions, error)
        settled = True
    count = len(rows) if isinstance(rows, Sequence) else rows.num_rows
    outcome = BatchOutcome(query_id, batch_id, settled, count, 0, letters, {}, None, PhaseTimings())
    report: PartitionReport = {"partition": partition, "outcome": outcome, "failed": True,
                               "error": describe(error), "infrastructure": infrastructure, "failure": failure}
    if isinstance(error, SerializationConflict):    # (Ingestion.process raises one after its last attempt)
        report["attempts"] = attempts
    return report


# --- the driver's side ------------------------------------------------------------------------------------------

def combined_outcome(query_id: str, batch_id: int, watermark: dt.datetime | None,
                     reports: Sequence[PartitionReport]) -> BatchOutcome:
    """The outcome of batch ``batch_id`` of the run ``query_id`` (without a partition) from its partitions'
    ``reports``: committed if one of them committed, their rows, events, dead letters, rule firings and timings
    summed; ``watermark``: the batch's."""
    outcomes = [row["outcome"] for row in reports]
    firings = sum((collections.Counter(outcome.rule_firings) for outcome in outcomes), collections.Counter())
    return BatchOutcome(
        query_id=query_id, batch_id=batch_id, committed=any(outcome.committed for outcome in outcomes),
        rows=sum(outcome.rows for outcome in outcomes), events=sum(outcome.events for outcome in outcomes),
        dead_letters=sum(outcome.dead_letters for outcome in outcomes), rule_firings=dict(firings),
        watermark=watermark, timings=sum((outcome.timings for outcome in outcomes), PhaseTimings()))


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
    #: Of the batch's ``partitions``, how many committed their rows (the ledger's partition rows, a failed
    #: partition's rejection under ``compensate`` not counted); None for the query's row.
    committed_partitions: int | None = None
    #: The batch's partitions the ledger holds no row of (neither committed nor given up as dead letters): still
    #: being ingested, or pending completion.  Empty: the batch is settled — compensating it is final.
    pending_partitions: tuple[int, ...] = ()
    #: The salt the query's batches are split with (the query's row only; None: recorded before revision
    #: 0019_split_salt, which splits as 0 — no salt — did).
    salt: int | None = None


def split_status(db: DatabaseHandle, query_name: str | None = None, *,
                 batch: tuple[str, int] | None = None) -> list[SplitBatchStatus]:
    """The scale-out queries' declared policies and their batches with a partition that failed for good, each with
    how many of its partitions committed and which the ledger does not hold, from PostgreSQL (``activedb status``).
    ``batch`` — (a run's ledger id without a partition, a batch id) —: also that batch when none of its partitions
    failed, if the run declared its partitions and the ledger holds some of them (state None; compensating checks
    that it is settled)."""
    with db.engine.connect() as connection:
        queries = connection.execute(sa.text(
            f"SELECT query_id, query_name, partitions, on_partition_failure, partition_key, partition_key_type, salt "
            f"FROM {QUERIES_TABLE}")).all()
        failures = connection.execute(sa.text(
            f"SELECT query_id, batch_id, partition, partitions, policy, state, error, compensated "
            f"FROM {FAILURES_TABLE} ORDER BY query_id, batch_id, partition")).all()
        wanted = {(row.query_id, row.batch_id) for row in failures
                  if query_name is None or LedgerId.parse(row.query_id).source == query_name}
        committed = _committed_partitions(connection, wanted | ({batch} if batch is not None else set()))
    declared = {row.query_id: row for row in queries}
    order = [state.value for state in (SplitState.PENDING_COMPLETION, SplitState.COMPENSATING,
                                       SplitState.COMPLETED, SplitState.COMPENSATED)]
    grouped: dict[tuple[str, int], list[Any]] = {}
    for row in failures:
        grouped.setdefault((row.query_id, row.batch_id), []).append(row)
    result = [SplitBatchStatus(row.query_name, query_id, row.on_partition_failure, row.partitions,
                               partition_key=None if row.partition_key is None else (row.partition_key,
                                                                                     row.partition_key_type),
                               salt=row.salt)
              for query_id, row in sorted(declared.items()) if query_name is None or row.query_name == query_name]
    for (query_id, batch_id), rows in sorted(grouped.items()):
        name = LedgerId.parse(query_id).source
        if query_name is not None and name != query_name:
            continue
        state = min((row.state for row in rows), key=order.index)
        rejected = {row.partition for row in rows if row.state in (SplitState.COMPENSATING.value,
                                                                   SplitState.COMPENSATED.value)}
        held = committed.get((query_id, batch_id), set())
        result.append(SplitBatchStatus(
            name, query_id, rows[0].policy, rows[0].partitions, batch_id, state,
            tuple(row.partition for row in rows), rows[0].error,
            max((row.compensated for row in rows if row.compensated is not None), default=None),
            committed_partitions=len(held - rejected),
            pending_partitions=tuple(sorted(set(range(rows[0].partitions)) - held))))
    if batch is not None and batch not in grouped and batch[0] in declared and declared[batch[0]].partitions \
            and committed.get(batch):
        run = declared[batch[0]]
        if query_name is None or run.query_name == query_name:
            held = committed[batch]
            result.append(SplitBatchStatus(
                run.query_name, batch[0], run.on_partition_failure, run.partitions, batch[1],
                committed_partitions=len(held), pending_partitions=tuple(sorted(set(range(run.partitions)) - held))))
    return result


#: The salts :func:`choose_salt` tries (0 … SALTS - 1), fewer when the batch has many keys: at most SALT_WORK
#: (keys x salts) hashes.
SALTS = 1000
SALT_WORK = 2_000_000
_MASK = 0xFFFFFFFF


def _rotate(value: int, by: int) -> int:
    return ((value << by) | (value >> (32 - by))) & _MASK


def murmur3_int(value: int, seed: int) -> int:
    """Murmur3 (x86, 32 bits) of the 4-byte int ``value`` with ``seed``, signed 32 bits: the hash a connector that
    splits batches may partition by (Spark's ``hash`` expression computes it; see ``spark_bridge``'s salted split)."""
    k1 = _rotate((value & _MASK) * 0xcc9e2d51 & _MASK, 15) * 0x1b873593 & _MASK
    h1 = (_rotate((seed & _MASK) ^ k1, 13) * 5 + 0xe6546b64) & _MASK
    h1 ^= 4                       # (fmix, with the length of an int)
    h1 ^= h1 >> 16
    h1 = h1 * 0x85ebca6b & _MASK
    h1 ^= h1 >> 13
    h1 = h1 * 0xc2b2ae35 & _MASK
    h1 ^= h1 >> 16
    return h1 - (1 << 32) if h1 >= 1 << 31 else h1


def choose_salt(key_counts: Iterable[tuple[int, int]], partitions: int, salted: Callable[[int, int], int]) -> int:
    """The salt a connector records for a run it splits by ``salted(key_hash, salt) mod partitions``
    (:func:`declare_policy`), from its first batch's ``key_counts`` — (the key's hash, rows): the one whose split
    leaves the largest partition smallest (the partitions run side by side: the largest is the critical path); of
    equal ones the smallest, so 0 (``salted(key_hash, 0)``, the key's hash alone) unless a salt does better.
    Deterministic: a batch's split is a function of its key, the recorded salt and ``partitions`` only."""
    counts = list(key_counts)
    if partitions <= 1 or not counts:
        return 0
    total = sum(rows for _, rows in counts)
    even = -(-total // partitions)          # (no split does better than this)
    best, best_largest = 0, total + 1
    for salt in range(max(1, min(SALTS, SALT_WORK // len(counts)))):
        loads = [0] * partitions
        for key_hash, rows in counts:
            loads[salted(key_hash, salt) % partitions] += rows
        largest = max(loads)
        if largest < best_largest:
            best, best_largest = salt, largest
            if largest <= even:
                break
    return best


def declared_layout(db: DatabaseHandle, query_id: str) -> SplitBatchStatus | None:
    """The layout the run ``query_id`` (a ledger id without a partition) declared (:func:`declare_policy`): its
    partition count, key and salt, as ``activedb status`` shows them; None if it declared none."""
    declared = [row for row in split_status(db, LedgerId.parse(query_id).source)
                if row.query_id == query_id and row.batch_id is None]
    return declared[0] if declared else None


def _committed_partitions(connection: sa.Connection, batches: set[tuple[str, int]]
                          ) -> dict[tuple[str, int], set[int]]:
    """The partitions of each of ``batches`` (a run's ledger id without a partition, a batch id) the ingestion
    ledger holds."""
    if not batches:
        return {}
    ledger = sa.table(_LEDGER_TABLE, sa.column("query_id"), sa.column("batch_id"))
    texts = connection.execute(sa.select(ledger.c.query_id, ledger.c.batch_id).where(sa.or_(*(
        sa.and_(ledger.c.batch_id == batch_id, ledger.c.query_id.startswith(f"{query_id}#p", autoescape=True))
        for query_id, batch_id in sorted(batches))))).all()
    found: dict[tuple[str, int], set[int]] = {}
    for text, batch_id in texts:
        parsed = LedgerId.parse(text)
        if parsed.partition is not None:
            found.setdefault((str(parsed.whole()), batch_id), set()).add(parsed.partition)
    return found


def check_settled(db: DatabaseHandle, query_id: str, batch_id: str) -> None:
    """Raise :class:`~activedb.atomic.errors.BatchNotSettled` if ``(query_id, batch_id)`` — a batch as lineage names
    it — is a split batch of a scale-out run some of whose partitions the ledger does not hold
    (:attr:`SplitBatchStatus.pending_partitions`): compensating it (``db.batches.compensate``) would undo the
    committed partitions while the others commit later and leave their effects.  A batch whose failed partition
    was given up as dead letters (``compensate``) is settled; any other batch passes."""
    parsed = LedgerId.parse(query_id)
    try:
        number = int(batch_id)
    except ValueError:
        return                  # (no batch a connector numbered)
    if parsed.run is None or parsed.partition is not None:
        return
    pending = [row for row in split_status(db, parsed.source, batch=(query_id, number))
               if row.query_id == query_id and row.batch_id == number and row.pending_partitions]
    if not pending:
        return
    [row] = pending
    which = ", ".join(map(str, row.pending_partitions))
    what = (f"partition {which} of its {row.partitions} has" if len(row.pending_partitions) == 1
            else f"partitions {which} of its {row.partitions} have")
    if row.state == SplitState.PENDING_COMPLETION.value:
        raise BatchNotSettled(
            f"batch {number} of {query_id} is not settled: {what} not committed — failed for good and pending "
            f"completion (on_partition_failure='forward'), which restarting the query after the fix applies. "
            f"Compensating now would undo the committed partitions and leave the restart to apply the others; "
            f"nothing was compensated. To undo the batch, restart the query with on_partition_failure='compensate' "
            f"(the failed partition's rows become dead letters and the driver compensates the batch), or compensate "
            f"once the restart has completed it; `activedb status` shows its state")
    raise BatchNotSettled(
        f"batch {number} of {query_id} is not settled: {what} not committed — the query is still ingesting the "
        f"batch, or stopped midway and completes it when restarted from its checkpoint. Compensating now would undo "
        f"the committed partitions while the others commit later and leave their effects; nothing was compensated. "
        f"Wait until every partition of the batch has committed (`activedb status` shows the batches in progress), "
        f"then compensate; if the query will never finish it (its checkpoint is gone), compensate the committed "
        f"partitions with allow_unsafe=True (--allow-unsafe)")


def unsettled_batches(db: DatabaseHandle, query_id: str) -> set[int]:
    """The batches of the run ``query_id`` (a ledger id without a partition) with a failed partition not settled yet
    (*pending completion*, *compensating*): a connector that splits batches reads them once per run, to settle each
    (:func:`after_replay`) when it comes again."""
    settled = {SplitState.COMPLETED.value, SplitState.COMPENSATED.value}
    return {row.batch_id for row in split_status(db, LedgerId.parse(query_id).source)
            if row.query_id == query_id and row.batch_id is not None and row.state not in settled}


# --- the layout of a batch run again ------------------------------------------------------------------------------

def _resume_in(partitions: int | None) -> str:
    """How to run a batch again in the layout ``partitions`` (None: whole), in the ingestion core's words."""
    return "whole" if partitions is None else f"in {partitions} partitions"


@dataclass(frozen=True)
class LayoutTerms:
    """How :func:`check_layout`'s error names a connector's layouts, in the connector's words. Immutable.

    ``runner``: who runs the batch again (``"Spark"``); ``whole``: a batch ingested whole, as the connector says
    it (``"whole, without partition_by_key"``); ``resume(partitions)``: how to resume in a layout — None whole,
    N in N partitions — (``"with partition_by_key=2 (--partitions 2)"``)."""

    runner: str = "the source"
    whole: str = "whole"
    resume: Callable[[int | None], str] = _resume_in


def check_layout(db: DatabaseHandle, query_id: str, batch_id: int, partitions: int | None,
                 partition_key: tuple[str, str] | None = None, *, salt: int | None = None,
                 terms: LayoutTerms = LayoutTerms()) -> None:
    """Raise :class:`~activedb.ingest.errors.IngestError` if the ledger holds batch ``batch_id`` of the run
    ``query_id`` in another layout than ``partitions`` (None: whole, one transaction; N: split into N partitions)
    by ``partition_key`` (the key column and its type, as the connector names them: :func:`declare_policy`'s);
    ``terms`` words the error for the connector.  A connector that splits batches asks it for a run's first batch,
    the one a source re-delivers after a restart: the ledger skips a batch by its ids (``q``, or ``q#pK`` per
    partition), so a batch committed whole and re-run in partitions, committed in partitions and re-run whole, or
    re-run in another number of them or by another key (either hashes its rows to other partitions) would have
    rows applied a second time, or skipped.  The key is compared when the run that ingested the batch recorded it
    (``activedb_split_queries``, since revision 0017_split_key); ``salt``, the one the connector splits with now (None
    as 0), with the run's recorded one (NULL, recorded before revision 0019_split_salt, or no row: 0)."""
    ledger = db.table(_LEDGER_TABLE)
    with db.engine.connect() as connection:
        texts = connection.execute(sa.select(ledger.c.query_id).where(ledger.c.batch_id == batch_id, sa.or_(
            ledger.c.query_id == query_id, ledger.c.query_id.startswith(f"{query_id}#p", autoescape=True)))).scalars()
        found = {LedgerId.parse(text).partition for text in texts}
    if not found:
        return
    before: int | None = None
    key_before: tuple[str, str] | None = None
    salt_before = 0
    if None not in found:     # (the partition count, key and salt the run declared, as activedb status shows them)
        declared = declared_layout(db, query_id)
        before = (declared.partitions if declared is not None and declared.partitions else
                  max(part for part in found if part is not None) + 1)
        key_before = declared.partition_key if declared is not None else None
        salt_before = (declared.salt or 0) if declared is not None else 0
    same_key = key_before is None or partition_key is None or key_before == partition_key
    if before == partitions and same_key and (partitions is None or salt_before == (salt or 0)):
        return
    if before == partitions and same_key:
        raise IngestError(
            f"batch {batch_id} of this checkpoint (ledger id {query_id}) was ingested in {before} partitions split "
            f"with salt {salt_before}, and {terms.runner} runs it again now split with salt {salt or 0}: its rows would "
            f"hash to other partitions, and the ledger, which skips a batch by its partitions, would apply some of "
            f"them a second time and others never. A run splits every batch with the salt it recorded "
            f"({QUERIES_TABLE}.salt, which `activedb status` shows): if that row was changed, set its salt back to "
            f"{salt_before}; or start from a new checkpoint directory")
    if before == partitions:
        assert key_before is not None and partition_key is not None
        raise IngestError(
            f"batch {batch_id} of this checkpoint (ledger id {query_id}) was ingested in {before} partitions, "
            f"partitioned by key {key_before[0]!r} ({key_before[1]}), and {terms.runner} runs it again now "
            f"partitioned by {partition_key[0]!r} ({partition_key[1]}): its rows would hash to other partitions, "
            f"and the ledger, which skips a batch by its partitions, would apply some of them a second time and "
            f"others never. Resume it with the key column {key_before[0]!r} ({key_before[1]}) as the mapping's key; "
            f"once that batch is done the query may go on with another key. Or start from a new checkpoint directory")
    was = terms.whole if before is None else f"in {before} partitions"
    now = "whole" if partitions is None else f"in {partitions} partitions"
    raise IngestError(
        f"batch {batch_id} of this checkpoint (ledger id {query_id}) was ingested {was}, and {terms.runner} runs it "
        f"again now {now}: the ledger, which skips a batch by its partitions, would apply some of its rows a second "
        f"time. Resume it {terms.resume(before)}; once that batch is done the query may go on in another layout. Or "
        f"start from a new checkpoint directory")
