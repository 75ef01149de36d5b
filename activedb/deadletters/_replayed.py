"""Marking a dead letter replayed, inside the replay's own PostgreSQL transaction."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from activedb.errors import BatchAlreadyCommitted
from activedb.txn import CommitParticipant

from activedb.deadletters._letters import TABLE

if TYPE_CHECKING:  # pragma: no cover
    from activedb.txn import Transaction

__all__ = ["LetterReplayed"]


class LetterReplayed(CommitParticipant):
    """Marks dead letter ``letter_id`` replayed (``replayed_at``, ``replay_query_id``) in the flush of the
    transaction that replays it, so the replay's effects and the mark commit together or not at all; a
    letter already marked raises ``BatchAlreadyCommitted`` there (the replay is skipped, nothing applied)."""

    def __init__(self, database: Any, letter_id: int, replay_query_id: str):
        self._table = database.table(TABLE)
        self.letter_id = letter_id
        self.replay_query_id = replay_query_id

    def write(self, transaction: Transaction, connection: Any) -> None:
        table = self._table
        marked = connection.execute(
            table.update().where(table.c.id == self.letter_id, table.c.replayed_at.is_(None))
            .values(replayed_at=sa.func.now(), replay_query_id=self.replay_query_id).returning(table.c.id)).first()
        if marked is None:
            raise BatchAlreadyCommitted(f"dead letter {self.letter_id} was replayed already; it is not applied twice")
