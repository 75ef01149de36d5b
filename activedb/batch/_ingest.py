"""The TPG path: batches of any ingestion connector as batches of declared state transactions —
``handler=TpgHandler(state_transactions)``.  The batch is a commit participant enlisted **before** the ledger,
so state, dead letters and ledger row commit together.  Design note: ``README.md`` in this package ("Wiring
ingestion"); the batch protocol is ``activedb/ingest/README.md``.  ``StateTransactions(processes=N)`` runs
components of a batch in N processes; the ingestion's ``close()`` stops them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from activedb.batch._commit import PendingBatch, apply_at_commit
from activedb.batch._declare import StateTransactions
from activedb.ingest import BatchHandler, BatchInput, IngestionLedger
from activedb.ingest.errors import IngestError

if TYPE_CHECKING:  # pragma: no cover
    from activedb.txn import Transaction

__all__ = ["TpgHandler"]


class TpgHandler(BatchHandler):
    """Runs each batch through the TPG planner at commit (module docstring).  Thread-safety: one
    batch at a time."""

    name = "tpg"
    #: A commit PostgreSQL refuses for what events wrote (a unique index two events' rows collide on, a CHECK,
    #: a key beyond its index's row limit) is searched for those events by trial flushes of subsets of the
    #: batch, each a batch of its own (``apply_events``), instead of failing the batch on every restart.
    searches_poison = True

    def __init__(self, transactions: StateTransactions) -> None:
        if not isinstance(transactions, StateTransactions):
            raise IngestError(
                "TpgHandler needs transactions: a batch.StateTransactions() with a @transactions.on(type) "
                f"declaration per event type; got {transactions!r}")
        self.transactions = transactions
        self.last_pending: PendingBatch | None = None     # the last batch's PendingBatch (its mode, seconds, result)

    def accepted_types(self) -> frozenset[str] | None:
        return frozenset(self.transactions.event_types) or None

    def handle(self, tx: Transaction, batch_input: BatchInput, ledger: IngestionLedger) -> None:
        self.last_pending = apply_at_commit(tx, batch_input.events, self.transactions, **batch_input.at_commit(ledger))

    def apply_events(self, tx: Transaction, events: list[object]) -> None:
        """A trial flush's batch: ``events`` as a batch at the commit of ``tx`` (its dead letters not stored)."""
        apply_at_commit(tx, events, self.transactions, dead_letters=None)

    def close(self) -> None:
        """Stop the worker processes of ``StateTransactions(processes=N)``, if any."""
        self.transactions.close()
