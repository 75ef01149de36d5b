"""A composition engine's state follows the transactions its batches ran in: :class:`Rollback`
snapshots it before a top-level transaction's first batch and enlists, in the transaction that batch runs in, a
commit participant that forgets the snapshot on the top-level commit and restores it on abort (under the engine's mutex, which the
participant takes itself — it is called by the transaction, outside every engine call).
"""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import TYPE_CHECKING, ContextManager, TypedDict

from activedb import lowlevel
from activedb.composite._evaluation import Evaluation, EvaluationSnapshot
from activedb.composite._input import InputNode, InputSnapshot
from activedb.composite._members import Members, MembersSnapshot
from activedb.composite.errors import CompositeError
from activedb.txn import CommitParticipant, TxnState

if TYPE_CHECKING:  # pragma: no cover
    from activedb.txn import Transaction


class _Snapshot(TypedDict):
    members: MembersSnapshot
    evaluation: EvaluationSnapshot
    inputs: InputSnapshot
    counts: collections.Counter[str]


class _Participant(CommitParticipant):
    """Restores the engine's state if the transaction a batch ran in aborts (a CommitParticipant)."""

    def __init__(self, rollback: "Rollback", root: Transaction, snapshot: _Snapshot, node: Transaction) -> None:
        self.rollback = rollback
        self.root = root
        self.snapshot = snapshot
        self.node = node            # the transaction its batches run in (enlisted there: root or a subtransaction)

    def committed(self, transaction: Transaction) -> None:
        self.rollback.forget(self)

    def aborted(self, transaction: Transaction, error: BaseException | None) -> None:
        self.rollback.restore(self)


@dataclass(eq=False)
class Rollback:
    """The snapshot of the state before the current top-level transaction's first batch."""

    guard: ContextManager[None]              # the engine's mutex, as a context manager
    members: Members
    evaluation: Evaluation
    inputs: InputNode
    counts: collections.Counter[str]
    current: _Participant | None = None

    def enlist(self, tx: Transaction) -> None:
        """Precondition: the caller holds the engine's mutex.  Snapshot the state and enlist in ``tx`` (the
        transaction the batch runs in, whose abort — a subtransaction's too — restores the snapshot) unless its tree
        already ran a batch; a batch of another node of that tree is refused (``CompositeError``), but in the parent
        of the committed subtransaction that ran it (the participant moved there)."""
        current = self.current
        if current is not None and current.root is tx.root:
            node = current.node
            if node is not tx:
                if node.parent is not tx or node.state is not TxnState.COMMITTED:
                    raise CompositeError(
                        f"this composition engine ran a batch in transaction {node.id} of this tree, which is "
                        f"{node.state.value}; process the tree's batches in that transaction (or, once it committed, "
                        f"in its parent): the engine's state follows the outcome of the transaction its batch ran in")
                current.node = tx
            return
        participant = _Participant(self, tx.root, self.snapshot(), tx)
        lowlevel.enlist(tx, participant)        # (first: a transaction that cannot take it leaves no snapshot behind)
        self.current = participant

    def restore(self, participant: _Participant) -> None:
        with self.guard:
            if self.current is not participant:
                return
            self.put_back(participant.snapshot)
            self.current = None

    def snapshot(self) -> _Snapshot:
        """The engine's state now.  Precondition: the caller holds the engine's mutex."""
        return {"members": self.members.snapshot(), "evaluation": self.evaluation.snapshot(),
                "inputs": self.inputs.snapshot(), "counts": collections.Counter(self.counts)}

    def put_back(self, snapshot: _Snapshot) -> None:
        """Return the engine to ``snapshot``, which is used up (the state shares its lists: take a new snapshot to
        return to the same state again).  Precondition: the caller holds the engine's mutex."""
        self.evaluation.restore(snapshot["evaluation"])
        self.members.restore(snapshot["members"])
        self.inputs.restore(snapshot["inputs"])
        self.counts.clear()
        self.counts.update(snapshot["counts"])

    def keep_membership(self) -> None:
        """A ``join`` or ``leave`` just happened (or an exclusion after a timeout): carry it, and the count of
        exclusions, into the snapshot the current transaction's abort restores (membership is no part of a batch).
        Precondition: the caller holds the engine's mutex."""
        if self.current is not None:
            self.members.carry_membership(self.current.snapshot["members"])
            self.current.snapshot["counts"]["excluded"] = self.counts["excluded"]

    def forget(self, participant: _Participant) -> None:
        with self.guard:
            if self.current is participant:
                self.current = None
