"""The hand-hygiene application as pattern queries (*Active Complex Event Processing over Event Streams*,
§1–§3 and App. C) — what ``activedb demo`` runs.  Its edges, which of them are the paper's, and the
coupling-mode rules: ``README.md`` in this package.

Public interface:

* :func:`make_engine` ``(db, scheduler="sei", **options) -> streams.StreamEngine`` — the stream
  ``estream`` and every query and ON OUTPUT rule, over the demo's own tables;
* :func:`register_rules` ``(db) -> dict[str, Rule]`` — the ECA rules of the six coupling modes that
  react to what the queries' rules do;
* :func:`to_stream_events` — the demo's badge-event dicts as ``streams.StreamEvent`` s;
* :func:`feed` ``(db, engine, events, …) -> FeedResult`` — micro-batches without Spark;
* :func:`reset` — empties the application's tables, the engine's saved state and its dead letters;
* :data:`Q1_R1` (the paper's text, verbatim), :data:`APP_QUERIES`, :data:`EDGES`, :data:`ENGINE_NAME`.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any, Iterable

from activedb import Coupling, Event, Rule, Transaction, deadletters, streams
from activedb.errors import RuleFailed
from activedb.ingest import forget_run
from activedb.progress import Progress
from activedb.examples.hand_hygiene import app
from activedb.examples.hand_hygiene.app import SAFE, STATUS_CHANGED, WORKERS
from activedb.examples.hand_hygiene.errors import BadgeEventRejected

ENGINE_NAME = "hand_hygiene"
STREAM = "estream"
EVENT_TYPES = ("EXIT", "SANITIZE", "ENTER", "MASK")
ATTRIBUTES = ("HCW-ID", "location")
ALIASES = {"workerStatus": (WORKERS, {"workerID": "worker"})}
TIE_PRIORITIES = {"SANITIZE": 2, "MASK": 1}      # equal timestamps: SANITIZE, MASK, then the others
DEFAULT_CHUNK_SIZE = 50
PUNCTUATION_DELAY = 30.0     # a chunk's punctuation: the largest ts seen before it minus this (like a watermark)

#: Q1 and R1 exactly as printed in Active CEP §3.1 (the streams README and ``activedb bench streams`` run the
#: same text).
Q1_R1 = """\
CREATE QUERY Q1 ON estream
PATTERN SEQ(EXIT, !SANITIZE, ENTER)
WHERE [HCW-ID] AND
EXIT.location != ENTER.location AND
'safe'=(SELECT status FROM workerStatus
WHERE workerID=ENTER.HCW-ID)
WITHIN 45 sec
RETURN ENTER.HCW-ID, ENTER.location

CREATE RULE R1
ON OUTPUT Q1
REFERENCING NEW AS newEvent
FOR EACH EVENT
BEGIN
UPDATE workerStatus SET status = 'warning'
WHERE workerID = newEvent.HCW-ID
END
"""

#: Q2's pattern is the paper's (§2); R2, Q3/R3 and Q4/R4 are the app's own (see the package's README.md).
APP_QUERIES = """
-- Q2: the paper's pattern; its rule R2 (back to safe) is the app's choice, after App. C.
CREATE QUERY Q2 ON estream PATTERN SEQ(MASK, EXIT)
WHERE [HCW-ID] AND 'warning' = (SELECT status FROM workerStatus WHERE workerID = EXIT.HCW-ID)
WITHIN 5 sec
RETURN EXIT.HCW-ID, EXIT.location
PRIORITY 20

CREATE RULE R2 ON OUTPUT Q2 REFERENCING NEW AS n FOR EACH EVENT
BEGIN UPDATE workerStatus SET status = 'safe' WHERE workerID = n.HCW-ID END

-- Q3 (the app's own): sanitizing while in warning or violation -> safe.
CREATE QUERY Q3 ON estream PATTERN SANITIZE
WHERE 'safe' != (SELECT status FROM workerStatus WHERE workerID = SANITIZE.HCW-ID)
RETURN SANITIZE.HCW-ID, SANITIZE.location

CREATE RULE R3 ON OUTPUT Q3 REFERENCING NEW AS n FOR EACH EVENT
BEGIN UPDATE workerStatus SET status = 'safe' WHERE workerID = n.HCW-ID END

-- Q4 (the app's own): leaving a room in warning -> violation, unless R2 has just excused it (Q2 runs first).
CREATE QUERY Q4 ON estream PATTERN EXIT
WHERE 'warning' = (SELECT status FROM workerStatus WHERE workerID = EXIT.HCW-ID)
RETURN EXIT.HCW-ID, EXIT.location
PRIORITY 10

CREATE RULE R4 ON OUTPUT Q4 REFERENCING NEW AS n FOR EACH EVENT
WHEN 'warning' = (SELECT status FROM workerStatus WHERE workerID = n.HCW-ID)
BEGIN UPDATE workerStatus SET status = 'violation' WHERE workerID = n.HCW-ID END
"""

SEEN_PRIORITY = 100

#: (old status, new status, badge event) → (query/rule, source, why) — how the story explains a transition.
EDGES = {
    ("safe", "warning", "enter"): ("Q1/R1", "paper", "entered another room within 45 s of leaving one, unsanitized"),
    ("warning", "safe", "exit"): ("Q2/R2", "paper's pattern, app's rule", "masked, then left within 5 s"),
    ("warning", "safe", "sanitize"): ("Q3/R3", "app", "sanitized"),
    ("violation", "safe", "sanitize"): ("Q3/R3", "app", "sanitized"),
    ("warning", "violation", "exit"): ("Q4/R4", "app", "left a room in warning without a mask"),
}


# --- the engine -----------------------------------------------------------------------------------

def make_engine(db, scheduler: str | streams.Scheduler = "sei", **options: Any) -> streams.StreamEngine:
    """The application's stream engine on ``db`` (its tables at head: ``db.upgrade_app(MIGRATIONS)``).

    ``options`` go to :class:`~activedb.streams.StreamEngine` (e.g. ``record_dead_letters=False`` when
    the Spark bridge stores the dead letters, ``keep_outputs=False``).  Under ``"s2pl"``/``"lwm"`` every
    Python action here declares the tables it touches, as those schedulers require."""
    options.setdefault("name", ENGINE_NAME)
    options.setdefault("aliases", ALIASES)
    engine = streams.StreamEngine(db, scheduler=scheduler, **options)
    engine.create_stream(STREAM, types=EVENT_TYPES, attributes=ATTRIBUTES, priorities=TIE_PRIORITIES)
    for event_type in EVENT_TYPES:
        accepting = streams.event(event_type)
        engine.query(f"SEEN_{event_type}", stream=STREAM, pattern=streams.seq(event_type),
                     returns=[accepting["HCW-ID"], accepting["location"]], priority=SEEN_PRIORITY)
        engine.rule(f"record_{event_type.lower()}", on_output=f"SEEN_{event_type}", action=record_badge,
                    reads=[WORKERS], writes=[WORKERS])
    engine.define(Q1_R1)
    engine.define(APP_QUERIES)
    return engine


def record_badge(tx, new) -> None:
    """Rule on SEEN_<type> (the app's own): record where the badge places the worker and his last event.

    A badge seen for the first time starts ``safe`` in the corridor.  The status is written back
    unchanged (a write that keeps the status is a reading, see the README).  The immediate
    rule ``reject_impossible_move`` checks the reading inside this write; its rejection aborts the
    s-transaction."""
    worker, room = new["HCW-ID"], new["location"]
    kind = new.constituents[-1].type.lower()
    ts = app.seconds(new.ts) if isinstance(new.ts, dt.datetime) else new.ts     # Spark delivers datetimes
    row = tx.read(WORKERS, worker)
    values = app.reading(kind, room, ts)
    if row is None:
        values.update(status=SAFE, changes=0)
    else:
        values["status"] = row["status"]
    try:
        tx.write(WORKERS, worker, **values)
    except RuleFailed as failure:
        if isinstance(failure.__cause__, BadgeEventRejected):
            raise failure.__cause__ from failure
        raise


def to_stream_events(events: Iterable[dict]) -> list[streams.StreamEvent]:
    """The demo's badge events (:func:`.events.generate`) as stream events: type upper-cased, ``worker`` →
    ``HCW-ID``, ``room`` → ``location``, ``ts`` in seconds (a ``datetime`` becomes epoch seconds).  A
    malformed event is still converted as far as it goes: the engine makes it a dead letter."""
    converted = []
    for raw in events:
        kind, ts = raw.get("type"), raw.get("ts")
        ts = app.seconds(ts) if isinstance(ts, dt.datetime) else ts
        converted.append(streams.StreamEvent(kind.upper() if isinstance(kind, str) else kind, ts,
                                             {"HCW-ID": raw.get("worker"), "location": raw.get("room")},
                                             stream=STREAM, origin=raw))
    return converted


# --- the coupling modes: ECA rules on what the queries' rules write -------------------------------

def is_reading(tx: Transaction, event: Event) -> bool:
    """A write of ``worker_status`` that records a badge reading (the status unchanged, or a new row)."""
    return event.old is None or event.old.get("status") == event.new.get("status")


def _reading_of(event: Event) -> tuple:
    """The reading in ``event`` against the worker's previous row, as :func:`app.contradiction` takes it."""
    new, kind = event.new, event.new.get("last_event")
    return (event.key, kind, new.get("room") if kind == "enter" else new.get("last_exit_room"),
            (event.old or {}).get("room"), new["last_ts"])


def impossible_move(tx: Transaction, event: Event) -> bool:
    return is_reading(tx, event) and app.contradiction(*_reading_of(event)) is not None


def reject_impossible_move(tx: Transaction, event: Event) -> None:
    """Immediate: reject the reading (its s-transaction aborts; ``compensate_rejected_badge`` commits)."""
    app.check_reading(*_reading_of(event))


def status_differs(tx: Transaction, event: Event) -> bool:
    return event.old is not None and event.old.get("status") != event.new.get("status")


def announce_status_change(tx: Transaction, event: Event) -> None:
    """Immediate: a transition made by R1–R4 becomes the application event ``status_changed``.

    Its time and cause are the reading's that the same s-transaction recorded just before (the SEEN_*
    queries run first), so ``ts`` is the badge event's application time."""
    new = event.new
    tx.signal(STATUS_CHANGED, worker=event.key, old=event.old["status"], new=new["status"], ts=new["last_ts"],
              event=new["last_event"])


def compensate_rejected_badge(tx: Transaction, event: Event) -> None:
    """Exclusive causally dependent: commits only if the reading's s-transaction aborted."""
    worker, kind, room, _, ts = reading = _reading_of(event)
    reason = app.contradiction(*reading) or "its s-transaction aborted"
    app.insert_compensation(tx, worker, kind, room, float(ts), f" ({reason})")


def register_rules(db) -> dict[str, Rule]:
    """Declare the coupling-mode rules on ``db`` and return them by name.  Precondition: the
    application's migrations ran (``db.upgrade_app(MIGRATIONS)``)."""
    rules: dict[str, Rule] = {}
    declare = app.declarer(db, rules)
    declare(reject_impossible_move, on=db.modified(WORKERS), when=impossible_move, coupling=Coupling.IMMEDIATE,
            priority=app.PRIORITY_TRACK, name="reject_impossible_move")
    declare(announce_status_change, on=db.updated(WORKERS), when=status_differs, coupling=Coupling.IMMEDIATE,
            priority=app.PRIORITY_TRANSITION, name="announce_status_change")
    app.declare_status_rules(db, declare)
    declare(compensate_rejected_badge, on=db.modified(WORKERS), when=is_reading,
            coupling=Coupling.EXCLUSIVE_CAUSALLY_DEPENDENT, name="compensate_rejected_badge")
    return rules


# --- feeding without Spark ---------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class FeedResult:
    """What :func:`feed` did (its engine's counters for this feed). The dead letters are also in
    ``activedb_dead_letters`` (query ``streams:<engine name>``): written by the engine, or — built with
    ``record_dead_letters=False`` — by :func:`feed` as the badge rows they were, which ``activedb
    dead-letters replay activedb.examples.hand_hygiene.app`` re-submits."""

    events: int
    batches: int                  # top-level transactions, the final END_OF_STREAM one included
    processed: int                # s-transactions committed
    failed: int                   # s-transactions aborted (rejected badge events)
    dead_letters: tuple[streams.DeadLetter, ...]


def feed(db, engine: streams.StreamEngine, events: Iterable[dict], *, chunk_size: int = DEFAULT_CHUNK_SIZE,
         delay: float = PUNCTUATION_DELAY, progress=None) -> FeedResult:
    """Feed the demo's badge events, in **arrival** order, as micro-batches of ``chunk_size``: one
    top-level transaction per chunk (``db.run``: re-run on a serialization conflict; the engine's
    pending state of an aborted attempt is dropped), ``engine.process(tx, chunk, punctuation=p,
    batch_id=n)`` with ``p`` = the largest timestamp seen in earlier chunks minus ``delay`` (a
    watermark), and a last transaction with ``END_OF_STREAM``.  ``progress`` (an
    ``activedb.progress.Progress``) hears of every batch."""
    if chunk_size < 1:
        raise ValueError("chunk_size must be at least 1")
    converted = to_stream_events(events)
    chunks = [converted[start:start + chunk_size] for start in range(0, len(converted), chunk_size)]
    plan: list[tuple[list, Any]] = []
    seen = None
    for chunk in chunks:
        plan.append((chunk, None if seen is None else seen - delay))
        stamps = [event.ts for event in chunk if isinstance(event.ts, (int, float)) and not isinstance(event.ts, bool)]
        if stamps:
            seen = max(stamps) if seen is None else max(seen, *stamps)
    plan.append(([], streams.END_OF_STREAM))
    results: list[streams.BatchResult] = []
    progress = progress or Progress.none()
    progress.start("micro-batches", total=len(plan))
    for number, (chunk, punctuation) in enumerate(plan):
        label = "end of stream" if punctuation is streams.END_OF_STREAM else (
            f"events {number * chunk_size + 1}-{number * chunk_size + len(chunk)} of {len(converted)}")
        with progress.step(label):
            results.append(db.run(_process, engine, chunk, punctuation, number))
    return FeedResult(events=len(converted), batches=len(plan), processed=sum(result.processed for result in results),
                      failed=sum(result.failed for result in results),
                      dead_letters=tuple(letter for result in results for letter in result.dead_letters))


def _process(tx, engine: streams.StreamEngine, chunk: list, punctuation: Any, batch_id: int) -> streams.BatchResult:
    result = engine.process(tx, chunk, punctuation=punctuation, batch_id=batch_id)
    if not engine.record_dead_letters:          # as the badge rows they were: replayable through the app
        deadletters.insert(tx, f"streams:{engine.name}", batch_id,
                           [deadletters.Letter(letter.reason, badge_row(letter.event)) for letter in result.dead_letters])
    return result


def badge_row(event: streams.StreamEvent) -> dict:
    """The demo's badge event (:func:`.events.generate`'s form, the rule-based app's ``MAPPING``) a stream
    event came from — the inverse of :func:`to_stream_events`."""
    attributes = dict(event.attributes)
    kind = event.type.lower() if isinstance(event.type, str) else event.type
    ts = event.ts if isinstance(event.ts, (int, float, str)) or event.ts is None else str(event.ts)
    return {"type": kind, "worker": attributes.get("HCW-ID"), "ts": ts, "room": attributes.get("location")}


def reset(db, engine: streams.StreamEngine) -> None:
    """Start clean: empty the application's tables, forget ``engine``'s saved state (buffer, partial
    matches, punctuations), delete its dead letters (``query_id = "streams:<name>"``) and forget the batches
    fed to it under that source (``activedb.ingest.forget_run``: the demo feeds them again)."""
    app.reset_tables(db)
    engine.reset_state()
    deadletters.purge(db, deadletters.LetterFilter(query=f"streams:{engine.name}"))
    with db.engine.begin() as connection:
        forget_run(connection, f"streams:{engine.name}")
