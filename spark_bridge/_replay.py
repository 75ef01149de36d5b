"""Replaying dead letters: ``activedb dead-letters replay APP`` re-submits rows of ``activedb_dead_letters``
through the same path a micro-batch takes (:meth:`spark_bridge.IngestSink.process`: validation, one
subtransaction per event, the rules, the ledger), exactly once.

Each dead letter ``d`` is replayed as batch ``d.id`` of the ledger query ``replay:NAME`` (``NAME`` the
query name of the row it came from), and the batch's PostgreSQL transaction also marks ``d`` replayed
(:class:`DeadLetterReplayed`, a commit participant) — effects, ledger row and mark commit together or not
at all.  A second replay of ``d`` finds the ledger row (skipped) or the mark (skipped); an event that
fails again becomes a new dead letter of ``replay:NAME`` (batch ``d.id``), itself replayable.

Public here: :func:`replay_dead_letters`, :class:`ReplayOutcome`, :class:`DeadLetterReplayed`,
:data:`REPLAY_PREFIX`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from activedb import CommitParticipant
from activedb.errors import BatchAlreadyCommitted

from spark_bridge._ledger import DEAD_LETTER_TABLE, parse_ledger_query_id

__all__ = ["DeadLetterReplayed", "ReplayOutcome", "REPLAY_PREFIX", "replay_dead_letters", "replay_query_name"]

REPLAY_PREFIX = "replay:"


def replay_query_name(query_id: str | None) -> str:
    """``replay:NAME`` for a dead letter of the ledger query ``query_id`` (``NAME@SPARK_ID[#pN]``,
    ``replay:NAME`` itself, or anything else)."""
    name = parse_ledger_query_id(query_id)[0] if query_id else "unknown"
    while name.startswith(REPLAY_PREFIX):
        name = name[len(REPLAY_PREFIX):]
    return f"{REPLAY_PREFIX}{name}"


class DeadLetterReplayed(CommitParticipant):
    """Marks dead letter ``letter_id`` replayed, inside the replay's PostgreSQL transaction; a letter that
    is already marked raises ``BatchAlreadyCommitted`` there (the replay is then skipped, nothing applied)."""

    def __init__(self, db: Any, letter_id: int, replay_query_id: str):
        self._table = db.table(DEAD_LETTER_TABLE)
        self.letter_id = letter_id
        self.replay_query_id = replay_query_id

    def write(self, transaction: Any, connection: Any) -> None:
        import sqlalchemy as sa

        table = self._table
        marked = connection.execute(
            table.update().where(table.c.id == self.letter_id, table.c.replayed_at.is_(None))
            .values(replayed_at=sa.func.now(), replay_query_id=self.replay_query_id).returning(table.c.id)).first()
        if marked is None:
            raise BatchAlreadyCommitted(f"dead letter {self.letter_id} was replayed already; it is not applied twice")


@dataclass(frozen=True)
class ReplayOutcome:
    """What became of one dead letter. Immutable."""

    letter_id: int
    query_id: str          # the ledger query of the replay: replay:NAME
    outcome: str           # "applied" | "rejected again" | "already replayed"


def replay_dead_letters(db: Any, app: Any, letters: Iterable[Mapping[str, Any]]) -> list[ReplayOutcome]:
    """Replay ``letters`` (rows of ``activedb_dead_letters`` as dicts) into ``db``, whose rules ``app`` (a
    :class:`~spark_bridge.LoadedApp` with a ``MAPPING``) declared already; waits for the detached rules."""
    from spark_bridge._sink import IngestSink

    sinks: dict[str, IngestSink] = {}
    outcomes = []
    for letter in letters:
        query_id = replay_query_name(letter.get("query_id"))
        sink = sinks.get(query_id)
        if sink is None:
            sink = sinks[query_id] = IngestSink(db, app.mapping, query_name=query_id, known_types=app.known_types,
                                                prefetch=app.prefetch)
        raw = letter["raw"] if isinstance(letter["raw"], Mapping) else {"value": letter["raw"]}
        outcome = sink.process([dict(raw)], int(letter["id"]), query_id=query_id, punctuate=False,
                               participants=[DeadLetterReplayed(db, int(letter["id"]), query_id)])
        if not outcome.committed:
            result = "already replayed"
        elif outcome.events:
            result = "applied"
        else:
            result = "rejected again"
        outcomes.append(ReplayOutcome(int(letter["id"]), query_id, result))
    db.rules.wait_idle(120)
    return outcomes
