"""Replaying dead letters: ``activedb dead-letters replay APP`` re-submits rows of ``activedb_dead_letters``
through :meth:`spark_bridge.IngestSink.process`, exactly once — letter ``d`` as batch ``d.id`` of the
ledger query ``replay:NAME``, marked replayed in the same transaction.  Design note: the package's
``README.md`` ("Replaying dead letters").
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from activedb.deadletters import LetterRecord, LetterReplayed
from activedb.ingest._ledger import parse_ledger_query_id

__all__ = ["ReplayOutcome", "REPLAY_PREFIX", "replay_dead_letters"]

REPLAY_PREFIX = "replay:"


def original_query_name(query_id: str | None) -> str:
    """``NAME`` for a dead letter of the ledger query ``query_id`` (``NAME@SPARK_ID[#pN]``,
    ``replay:NAME``, or anything else)."""
    name = parse_ledger_query_id(query_id)[0] if query_id else "unknown"
    while name.startswith(REPLAY_PREFIX):
        name = name[len(REPLAY_PREFIX):]
    return name


@dataclass(frozen=True)
class ReplayOutcome:
    """What became of one dead letter. Immutable."""

    letter_id: int
    query_id: str          # the ledger query of the replay: replay:NAME
    outcome: str           # "applied" | "rejected again" | "already replayed"


def replay_dead_letters(db: Any, app: Any, letters: Iterable[LetterRecord | Mapping[str, Any]]
                        ) -> list[ReplayOutcome]:
    """Replay ``letters`` (:class:`~activedb.deadletters.LetterRecord`, or rows of ``activedb_dead_letters``
    as dicts) into ``db``, whose rules ``app`` (a :class:`~spark_bridge.LoadedApp` with a ``MAPPING``)
    declared already; waits for the detached rules."""
    from spark_bridge._sink import IngestSink

    sinks: dict[str, IngestSink] = {}
    outcomes = []
    for letter in letters:
        if not isinstance(letter, LetterRecord):
            letter = LetterRecord.from_mapping(letter)
        query_id = f"{REPLAY_PREFIX}{original_query_name(letter.query_id)}"
        sink = sinks.get(query_id)
        if sink is None:
            sink = sinks[query_id] = IngestSink(db, app.mapping, query_name=query_id, known_types=app.known_types,
                                                prefetch=app.prefetch,
                                                event_ids_under=original_query_name(letter.query_id))
        row = letter.row()
        rows = row if hasattr(row, "num_rows") else [row]
        outcome = sink.process(rows, letter.id, query_id=query_id, punctuate=False,
                               participants=[LetterReplayed(db, letter.id, query_id)])
        result = "already replayed" if not outcome.committed else "applied" if outcome.events else "rejected again"
        outcomes.append(ReplayOutcome(letter.id, query_id, result))
    db.rules.wait_idle(120)
    return outcomes
