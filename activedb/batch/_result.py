"""What a batch run returns: per transaction its outcome, the final versions, statistics."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from activedb.batch._declare import BatchEvent

__all__ = ["BatchResult", "BatchStatistics", "TransactionResult"]


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
class BatchResult:
    """``transactions`` in timestamp order; ``rejected`` = events that could not be declared
    (unknown type, a declaring function that raised); ``final`` = the last version of every
    state written by a committed transaction (None = deleted); ``before`` = their images
    before the batch."""

    transactions: list[TransactionResult]
    rejected: list[tuple[BatchEvent, str]]
    final: dict[tuple[str, Any], dict | None]
    before: dict[tuple[str, Any], dict | None]
    strategy: str
    statistics: BatchStatistics | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def committed(self) -> list[TransactionResult]:
        return [result for result in self.transactions if result.committed]

    @property
    def aborted(self) -> list[TransactionResult]:
        return [result for result in self.transactions if not result.committed]

    @property
    def dead_letters(self) -> list[tuple[BatchEvent, str]]:
        """Every event without effect, with the reason, in batch position order."""
        letters = [(result.event, result.reason or "aborted") for result in self.aborted] + list(self.rejected)
        return sorted(letters, key=lambda letter: letter[0].position)

    def changes(self) -> dict[tuple[str, Any], dict | None]:
        """The states whose final image differs from the image before the batch."""
        return {state: image for state, image in self.final.items() if self.before.get(state) != image}
