"""What a batch run returns: per transaction its outcome, the final versions, statistics."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from activedb.batch._declare import NOTHING_INTO, BatchEvent, State, inserted_parts
from activedb.batch._execute import ExecutionStatistics
from activedb.store import RowImage


class TransactionResult(NamedTuple):
    """One declared state transaction: committed with its outputs, or aborted with why.
    Immutable (a named tuple: a batch makes one per event)."""

    event: BatchEvent
    committed: bool
    reason: str | None
    outputs: dict[str, Any]


@dataclass(frozen=True)
class BatchStatistics:
    transactions: int
    rejected: int
    operations: int
    td_edges: int
    pd_edges: int
    ld_pairs: int
    nd_ops: int
    window_ops: int
    states: int
    skew: float
    components: int                 # connected components over the states (0: not computed)
    largest_component_share: float
    processes: int                  # processes that executed a part of the batch
    executions: int
    rollbacks: int
    aborts_applied: int
    revoked: int
    passes: int
    units: int
    cyclic_ops: int
    strata: int
    seconds: dict[str, float]       # phase -> seconds (declare, plan, execute, ... )
    decision: tuple[str, ...] = ()  # the decision model's reasons (empty for fixed strategies)


@dataclass
class Part:
    """What one process computed for its transactions (picklable: no events, no functions):
    ``ts`` = the timestamps of its declared transactions (ascending), ``aborted`` = t → reason,
    ``outputs`` = t → outputs of committed transactions that have any, ``rejected`` = (t, why the event
    could not be declared), ``final`` = the last image of every state a committed transaction wrote (None =
    deleted), ``before`` = their images before the batch; ``plan`` = the counts of the plan;
    ``executions`` = operation runs (when ``execution`` is None); ``versions``: window versions were kept."""

    ts: list[int]
    aborted: dict[int, str]
    outputs: dict[int, dict[str, object]]
    rejected: list[tuple[int, str]]
    final: dict[State, RowImage | None]
    before: dict[State, RowImage | None] | None     # None: not shipped back (the caller has them)
    strategy: str
    decision: tuple[str, ...]
    execution: ExecutionStatistics | None     # None without a TPG
    plan: dict[str, int]
    seconds: dict[str, float]
    executions: int = 0
    versions: bool = False


def _handed(outputs: dict[str, object]) -> dict[str, object]:
    """One transaction's outputs as its result hands them out: a row image (a READ's, a WRITE's) is a copy, for the
    run keeps the image itself as the state's (``final``, other outputs of it); other outputs are the caller's already
    (a function's value, ``Inserted``)."""
    return {name: output.copy() if type(output) is dict else output for name, output in outputs.items()}


class BatchResult:
    """``transactions`` in timestamp order; ``rejected`` = events that could not be declared
    (unknown type, a declaring function that raised); ``final`` = the last version of every
    state written by a committed transaction (None = deleted); ``before`` = their images
    before the batch.  The :class:`TransactionResult` objects are made only when ``transactions``,
    ``committed`` or ``aborted`` is first read (a sink that stores dead letters and counts never makes them); their
    outputs' row images are copies, so changing one changes neither ``final`` nor another output.
    Thread-safety: read-only once returned; the lazy list is made at most once per thread race
    (the same list either way)."""

    def __init__(self, events: list[BatchEvent], ts: list[int], aborted: dict[int, str],
                 outputs: dict[int, dict[str, object]], rejected: list[tuple[BatchEvent, str]],
                 final: dict[State, RowImage | None], before: dict[State, RowImage | None], strategy: str,
                 statistics: BatchStatistics | None = None, notes: list[str] | None = None) -> None:
        self._events = events          # the batch, by timestamp (events[t])
        self._ts = ts                  # timestamps of the declared transactions, ascending
        self._aborted = aborted        # t -> reason
        self._outputs = outputs        # t -> outputs (committed transactions with outputs)
        self._transactions: list[TransactionResult] | None = None
        self._inserted: dict[str, list[RowImage]] | None = None
        self.rejected = rejected
        self.final = final
        self.before = before
        self.strategy = strategy
        self.statistics = statistics
        self.notes = notes if notes is not None else []

    @property
    def transactions(self) -> list[TransactionResult]:
        if self._transactions is None:
            events, aborted, outputs = self._events, self._aborted, self._outputs
            new = tuple.__new__
            self._transactions = [
                new(TransactionResult, (events[t], False, aborted[t], {})) if t in aborted
                else new(TransactionResult, (events[t], True, None, _handed(outputs[t]) if t in outputs else {}))
                for t in self._ts]
        return self._transactions

    @property
    def committed_count(self) -> int:
        return len(self._ts) - len(self._aborted)

    @property
    def aborted_count(self) -> int:
        return len(self._aborted)

    @property
    def committed(self) -> list[TransactionResult]:
        return [result for result in self.transactions if result.committed]

    @property
    def aborted(self) -> list[TransactionResult]:
        return [result for result in self.transactions if not result.committed]

    @property
    def dead_letters(self) -> list[tuple[BatchEvent, str]]:
        """Every event without effect, with the reason, in batch position order."""
        events = self._events
        letters = [(events[t], reason or "aborted") for t, reason in self._aborted.items()] + list(self.rejected)
        return sorted(letters, key=lambda letter: letter[0].position)

    def inserted(self) -> dict[str, list[RowImage]]:
        """Table → the rows the committed transactions' INSERT operations add, in timestamp order (made once: the
        caller must not change it)."""
        if self._inserted is not None:
            return self._inserted
        rows: dict[str, list[RowImage]] = {}
        outputs = self._outputs
        for t in sorted(outputs):
            for output in outputs[t].values():
                if output is NOTHING_INTO:      # (a learned chain's insert of an event that added no row: the most)
                    continue
                for part in inserted_parts(output):
                    found = rows.get(part.table)
                    if found is None:
                        rows[part.table] = list(part.rows)
                    else:
                        found.extend(part.rows)
        self._inserted = rows
        return rows

    def changes(self) -> dict[State, RowImage | None]:
        """The states whose final image differs from the image before the batch."""
        return {state: image for state, image in self.final.items() if self.before.get(state) != image}

    def __repr__(self) -> str:
        return (f"<BatchResult {self.strategy}: {self.committed_count} committed, {self.aborted_count} aborted, "
                f"{len(self.rejected)} rejected, {len(self.final)} rows written>")
