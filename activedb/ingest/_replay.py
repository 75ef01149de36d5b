"""Replaying dead letters through the plain connector, exactly once: letter ``d`` as batch ``d.id`` of the source
``replay:NAME`` (``NAME`` the source it was rejected by), marked replayed in the same transaction
(``activedb.deadletters.LetterReplayed``).  ``activedb dead-letters replay APP`` calls it.  Design note:
``README.md`` in this package ("Connectors").
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from activedb.deadletters import LetterRecord, LetterReplayed
from activedb.ingest._feed import feed
from activedb.ingest._interface import Batch, LedgerId, ReservedSource, Rows
from activedb.ingest._ledger import unfit_source_name
from activedb.ingest._mapping import EventMapping, check_columns, is_arrow
from activedb.ingest._protocol import BatchHandler
from activedb.ingest._rules import RulesHandler
from activedb.ingest.errors import IngestError

if TYPE_CHECKING:  # pragma: no cover
    from activedb.ingest._ingestion import IngestDatabase

__all__ = ["REPLAY_PREFIX", "ReplayOutcome", "ReplayResult", "Replayable", "original_query_name",
           "replay_dead_letters"]

REPLAY_PREFIX = ReservedSource.REPLAY.value


class Replayable(Protocol):
    """What replaying needs of an application (``spark_bridge.LoadedApp`` has it): the ``mapping`` its rows were
    read with, the ``known_types`` it accepts (None: its rules'), the rule path's ``prefetch``."""

    @property
    def mapping(self) -> EventMapping | None: ...

    @property
    def known_types(self) -> Collection[str] | None: ...

    @property
    def prefetch(self) -> Mapping[str, object] | None: ...


class ReplayResult(enum.StrEnum):
    """What became of a replayed letter."""

    APPLIED = "applied"
    REJECTED_AGAIN = "rejected again"
    ALREADY_REPLAYED = "already replayed"
    NOT_FOUND = "not found"         # no such letter in the table (purged since it was read, or no letter's id)


@dataclass(frozen=True)
class ReplayOutcome:
    """What became of one dead letter. Immutable."""

    letter_id: int
    query_id: str          # the replay's ledger id: replay:NAME
    outcome: ReplayResult


def original_query_name(query_id: str | None) -> str:
    """``NAME`` for a dead letter of the ledger id ``query_id`` (``NAME@RUN[#pN]``, ``replay:NAME``, or
    anything else)."""
    name = LedgerId.read(query_id).source if query_id else "unknown"     # (a letter's: as written)
    while name.startswith(REPLAY_PREFIX):
        name = name[len(REPLAY_PREFIX):]
    return name


def replay_dead_letters(db: IngestDatabase, app: Replayable, letters: Iterable[LetterRecord | Mapping[str, object]],
                        *,
                        handler: Callable[[], BatchHandler] | None = None,
                        progress: Callable[[ReplayOutcome, int, int], None] | None = None) -> list[ReplayOutcome]:
    """Replay ``letters`` (:class:`~activedb.deadletters.LetterRecord`, or rows of ``activedb_dead_letters`` as
    dicts) into ``db``, whose rules ``app`` declared already, each through :func:`feed` with the original row
    (the rule path with ``app.prefetch``, or ``handler()``); event ids are checked under the original source.
    ``progress(outcome, done, total)`` is called after each letter's transaction ended (a progress bar's, e.g.
    ``tqdm``'s ``update(1)``; what it raises stops the replay there, the letters replayed so far staying replayed).
    Waits for the detached rules."""
    if isinstance(letters, (LetterRecord, Mapping, str, bytes)) or not isinstance(letters, Iterable):
        raise IngestError(f"letters is one {type(letters).__name__}, not a collection of letters: give a list of "
                          f"LetterRecords or rows of activedb_dead_letters — one letter is [letter]; no letter was "
                          f"replayed")
    records = [letter if isinstance(letter, LetterRecord) else LetterRecord.from_mapping(letter) for letter in letters]
    for letter in records:      # (each is replayed as the batch its id numbers: refuse before replaying any)
        if isinstance(letter.id, bool) or not isinstance(letter.id, int) or letter.id < 0:
            raise IngestError(f"dead letter {letter.reason!r:.60} of {letter.query_id!r} has no id (id={letter.id!r}): "
                              f"replay letters as read from activedb_dead_letters, each with its id; no letter was "
                              f"replayed")
        if letter.cut():
            raise IngestError(f"dead letter {letter.id} of {letter.query_id!r} was cut (its JSON was larger than "
                              f"a letter keeps, activedb.deadletters.LETTER_BYTES): its row was not kept, so it cannot "
                              f"be replayed — feed the row again from its source, and leave the letter out (--id, "
                              f"--query) or purge it; no letter was replayed")
        replay = LedgerId.parse(f"{REPLAY_PREFIX}{original_query_name(letter.query_id)}")
        if replay.run is not None:
            # (A run-less id holds no '@RUN': replay:NAME@x reads as run x of replay:NAME, which LedgerId refuses.)
            raise IngestError(f"dead letter {letter.id} of the source {original_query_name(letter.query_id)!r} cannot "
                              f"be replayed: its replay's ledger id, {REPLAY_PREFIX}"
                              f"{original_query_name(letter.query_id)}, would read as run {replay.run!r} of the "
                              f"source {replay.source!r} — a source named with '@' has no replay; leave its letters "
                              f"out (--query, --id) and feed their rows again under a name without '@'; no letter "
                              f"was replayed")
        unfit = unfit_source_name(replay.source)    # (a source may take every byte of a name: replay:NAME is longer)
        if unfit is not None:
            raise IngestError(f"dead letter {letter.id} of the source {replay.source[len(REPLAY_PREFIX):][:40]!r} "
                              f"cannot be replayed: its replay's source, {REPLAY_PREFIX}NAME, {unfit} — leave its "
                              f"letters out (--query, --id) and feed their rows again under a shorter name; no letter "
                              f"was replayed")
    if records and handler is None and app.known_types is None and not db.rules.stream_types():
        # (The rule path then accepts any type: each letter would count as applied, no rule run on its row.)
        raise IngestError("no enabled rule listens to a stream event type: the rule path would take each letter's row "
                          "as applied with no rule run on it, and mark the letter replayed — declare the application's "
                          "rules (register(db)), or enable those disabled (activedb rules enable), before replaying; no "
                          "letter was replayed")
    batches = [(letter, _rows_of(letter, app.mapping)) for letter in records]   # (each checked before any is replayed)
    outcomes = []
    for letter, rows in batches:
        original = original_query_name(letter.query_id)
        source = f"{REPLAY_PREFIX}{original}"
        mark = LetterReplayed(db, letter.id, source)
        [outcome] = feed(db, [Batch(letter.id, rows)], source=source, mapping=app.mapping,
                         handler=handler() if handler is not None else RulesHandler(app.prefetch),
                         known_types=app.known_types, event_ids_under=original,
                         participants=lambda batch: [mark], owner=ReservedSource.REPLAY)
        result = (ReplayResult.NOT_FOUND if not outcome.committed and mark.missing
                  else ReplayResult.ALREADY_REPLAYED if not outcome.committed
                  else ReplayResult.APPLIED if outcome.events else ReplayResult.REJECTED_AGAIN)
        outcomes.append(ReplayOutcome(letter.id, source, result))
        if progress is not None:
            progress(outcomes[-1], len(outcomes), len(batches))
    db.rules.wait_idle(120)
    return outcomes


def _rows_of(letter: LetterRecord, mapping: EventMapping | None) -> Rows:
    """The batch replaying ``letter``: its row as its writer had it — a one-row Arrow table whose columns are
    checked against ``mapping`` (:func:`~activedb.ingest._mapping.check_columns`: a column the mapping names missing
    would reject it again, under ``replay:NAME``), or one row."""
    row = letter.row()
    if not is_arrow(row):
        return [row]
    if mapping is not None:
        try:
            check_columns(row.schema.names, mapping, before="before replaying it: replay it with the mapping its row "
                                                            "was read with")
        except IngestError as error:
            raise IngestError(f"dead letter {letter.id} of {letter.query_id!r}: {error}; no letter was replayed") from None
    return row
