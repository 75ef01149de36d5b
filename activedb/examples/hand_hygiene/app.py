"""The hand-hygiene application (HyReminder, from *Active Complex Event Processing over Event Streams*) as
ECA rules on activedb; what ``activedb run`` and ``activedb bench ingest`` use.

Public interface: :func:`register` ``(db) -> dict[str, Rule]`` (every rule, on an explicit database),
:func:`reset_tables`, and the vocabulary :data:`BADGE_EVENTS`, :data:`SAFE` / :data:`WARNING` /
:data:`VIOLATION`, :data:`COLORS`, :data:`STATUS_CHANGED`, :data:`APP_TABLES`.  The application, its
edges and why each rule has its coupling mode: ``README.md`` in this package.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import sqlalchemy as sa

from activedb import Coupling, Event, Rule, Transaction
from activedb.examples.hand_hygiene import MIGRATIONS as _MIGRATIONS
from activedb.examples.hand_hygiene.errors import ImpossibleTransition, LateBadgeEvent, MalformedBadgeEvent

BADGE_EVENTS = ("enter", "exit", "sanitize", "mask")
SAFE, WARNING, VIOLATION = "safe", "warning", "violation"
COLORS = {SAFE: "green", WARNING: "yellow", VIOLATION: "red"}
# What ``activedb run activedb.examples.hand_hygiene.app --source file:DIR`` needs: which columns of
# the rows (JSON lines {"type": ..., "worker": ..., "ts": seconds, "room": ...}, as ``activedb demo
# --write-events DIR`` writes them, see ``demo.write_event_files``) make an event — the arguments of
# spark_bridge's EventMapping, as plain data (no import of it).
MAPPING = {"type_column": "type", "key_column": "worker", "ts_column": "ts", "payload_columns": ["room"]}
SCHEMA = "type STRING, worker STRING, ts DOUBLE, room STRING"
PREFETCH = {"worker_status": None}      # each batch loads its workers' rows in one query
MIGRATIONS = _MIGRATIONS

STATUS_CHANGED = "status_changed"
WORKERS = "worker_status"
APP_TABLES = ("worker_status", "alerts", "notifications", "compensations", "status_changes", "badge_lights")

Q1_WINDOW_SECONDS = 45.0    # SEQ(EXIT, !SANITIZE, ENTER) WITHIN 45 sec
Q2_WINDOW_SECONDS = 5.0     # SEQ(MASK, EXIT) WITHIN 5 sec

PRIORITY_TRACK = 100
PRIORITY_TRANSITION = 50
PRIORITY_ALERT = 20
PRIORITY_AUDIT = 10


def seconds(ts: Any) -> float:
    """Application time as float seconds (a ``datetime`` becomes epoch seconds)."""
    if isinstance(ts, bool):
        raise MalformedBadgeEvent(f"timestamp {ts!r} is not a time")
    if isinstance(ts, (int, float)):
        return float(ts)
    if isinstance(ts, dt.datetime):
        return (ts.replace(tzinfo=dt.timezone.utc) if ts.tzinfo is None else ts).timestamp()
    raise MalformedBadgeEvent(f"timestamp {ts!r} is neither seconds nor a datetime")


# --- immediate: tracking and validation (priority 100) ------------------------------------------
#
# Rows are read with row.get(column) for the pattern columns: a row this transaction created with
# write() reads back with only the columns written so far (the others are absent, not None) until the
# top-level commit — reported to the engine's owner.

def track_badge(tx: Transaction, event: Event) -> None:
    """Validate a badge event against the worker's state and record it.

    Raises a ``BadgeEventRejected`` (aborting the event's subtransaction) for a late
    event or an impossible transition; otherwise updates location and pattern state.
    """
    worker, room, ts = event.key, event.payload.get("room"), seconds(event.ts)
    if not isinstance(worker, str) or not worker:
        raise MalformedBadgeEvent(f"{event.source} event without a worker id (key={worker!r})")
    row = tx.read(WORKERS, worker)
    new_worker = row is None
    if new_worker:                      # a badge seen for the first time starts safe, in the corridor
        row = {"status": SAFE, "room": None, "last_ts": None, "changes": 0}
    last_ts = row.get("last_ts")
    if last_ts is not None and ts < last_ts:
        raise LateBadgeEvent(f"{event.source} of {worker} at t={ts:g} is older than his last applied event "
                             f"(t={last_ts:g})")
    check_reading(worker, event.source, room, row.get("room"), ts)
    updates = reading(event.source, room, ts)
    if new_worker:
        updates["changes"] = 0
    # status is written back unchanged: activedb flushes write() as INSERT ... ON CONFLICT DO UPDATE,
    # and PostgreSQL checks NOT NULL before it finds the conflict, so a write() of an existing row
    # that omits the NOT NULL column status fails at commit (reported to the engine's owner).
    updates["status"] = row["status"]
    tx.write(WORKERS, worker, **updates)


def contradiction(worker: str, kind: str, room: Any, was_in: str | None, ts: float) -> str | None:
    """Why a ``kind`` reading of ``worker`` in ``room`` at ``ts`` contradicts where his badge placed him
    (``was_in``, None: the corridor), or None."""
    if kind == "enter":
        if not isinstance(room, str) or not room:
            return f"enter of {worker} at t={ts:g} names no room"
        if was_in is not None:
            return f"{worker} enters {room} at t={ts:g} but his badge places him in {was_in} (no exit seen)"
    elif kind == "exit" and was_in != room:
        return f"{worker} exits {room} at t={ts:g} but his badge places him in {was_in or 'the corridor'}"
    return None


def check_reading(worker: str, kind: str, room: Any, was_in: str | None, ts: float) -> None:
    """Raise the :func:`contradiction` of the reading, if any: a missing room is malformed, the rest impossible."""
    reason = contradiction(worker, kind, room, was_in, ts)
    if reason is not None:
        raise (MalformedBadgeEvent if reason.endswith("names no room") else ImpossibleTransition)(reason)


def reading(kind: str, room: Any, ts: float) -> dict[str, Any]:
    """The columns of ``worker_status`` a ``kind`` reading in ``room`` at ``ts`` writes, besides the status."""
    values: dict[str, Any] = {"last_event": kind, "last_ts": ts}
    if kind == "enter":
        values["room"] = room
    elif kind == "exit":
        values.update(room=None, last_exit_room=room, last_exit_ts=ts)
    elif kind == "sanitize":
        values["last_sanitize_ts"] = ts
    elif kind == "mask":
        values["last_mask_ts"] = ts
    return values


# --- immediate: the status transitions (priority 50) ---------------------------------------------

def unsanitized_entry(tx: Transaction, event: Event) -> bool:
    """Q1: SEQ(EXIT, !SANITIZE, ENTER) within 45 s into another room, for a worker who is safe."""
    row = tx.read(WORKERS, event.key)
    if row is None or row["status"] != SAFE or row.get("last_exit_ts") is None:
        return False
    exit_ts, sanitize_ts = row.get("last_exit_ts"), row.get("last_sanitize_ts")
    within = seconds(event.ts) - exit_ts <= Q1_WINDOW_SECONDS
    other_room = row.get("last_exit_room") != event.payload.get("room")
    sanitized = sanitize_ts is not None and sanitize_ts >= exit_ts
    return within and other_room and not sanitized


def unmasked_exit_while_warned(tx: Transaction, event: Event) -> bool:
    """A worker in warning leaves the room without sanitizing; Q2's SEQ(MASK, EXIT) within 5 s excuses."""
    row = tx.read(WORKERS, event.key)
    if row is None or row["status"] != WARNING:
        return False
    mask_ts = row.get("last_mask_ts")
    masked = mask_ts is not None and 0.0 <= seconds(event.ts) - mask_ts <= Q2_WINDOW_SECONDS
    return not masked


def not_safe(tx: Transaction, event: Event) -> bool:
    row = tx.read(WORKERS, event.key)
    return row is not None and row["status"] != SAFE


def change_status(tx: Transaction, event: Event, new_status: str) -> None:
    """Move the worker of ``event`` to ``new_status`` and announce it (``status_changed``)."""
    row = tx.read(WORKERS, event.key)
    ts = seconds(event.ts)
    tx.write(WORKERS, event.key, status=new_status, status_ts=ts, changes=row["changes"] + 1)
    tx.signal(STATUS_CHANGED, worker=event.key, old=row["status"], new=new_status, ts=ts, event=event.source)


def warn(tx: Transaction, event: Event) -> None:
    change_status(tx, event, WARNING)


def escalate(tx: Transaction, event: Event) -> None:
    change_status(tx, event, VIOLATION)


def clear(tx: Transaction, event: Event) -> None:
    change_status(tx, event, SAFE)


# --- deferred: alert and audit, just before the transition commits -------------------------------

def final_status_is_violation(tx: Transaction, event: Event) -> bool:
    row = tx.read(WORKERS, event.payload["worker"])
    return row is not None and row["status"] == VIOLATION


def alert_violation(tx: Transaction, event: Event) -> None:
    tx.insert("alerts", worker=event.payload["worker"], kind=VIOLATION, at=event.payload["ts"])


def audit_transition(tx: Transaction, event: Event) -> None:
    payload = event.payload
    tx.insert("status_changes", worker=payload["worker"], old_status=payload["old"], new_status=payload["new"],
              event=payload["event"], at=payload["ts"])


# --- the detached family ------------------------------------------------------------------------

def notify_badge(tx: Transaction, event: Event) -> None:
    """Detached: the reminder goes to the badge at once, whatever becomes of the stream transaction."""
    alert = event.new
    tx.insert("notifications", worker=alert["worker"], channel="badge", at=alert["at"],
              message=f"hygiene violation at t={alert['at']:g}: sanitize your hands now")


def badge_light(tx: Transaction, event: Event) -> None:
    """Detached causally dependent: the light command commits only if the status change does."""
    payload = event.payload
    tx.insert("badge_lights", worker=payload["worker"], color=COLORS[payload["new"]],
              status=payload["new"], at=payload["ts"])


def report_incident(tx: Transaction, event: Event) -> None:
    """Sequential causally dependent: reported to infection control once the alert is durable."""
    alert = event.new
    tx.insert("notifications", worker=alert["worker"], channel="infection_control", at=alert["at"],
              message=f"incident: {alert['worker']} in hygiene violation at t={alert['at']:g} "
                      f"(alert {event.key})")


def compensate_rejected(tx: Transaction, event: Event) -> None:
    """Exclusive causally dependent: commits only if the badge event's processing aborted."""
    try:
        ts = seconds(event.ts)
    except MalformedBadgeEvent:
        ts = 0.0
    insert_compensation(tx, event.key, event.source, event.payload.get("room"), ts)


def insert_compensation(tx: Transaction, worker: Any, kind: Any, room: Any, ts: float, why: str = "") -> None:
    """Insert the :func:`compensation` of a rejected reading."""
    tx.insert("compensations", **compensation(worker, kind, room, ts, why))


def compensation(worker: Any, kind: Any, room: Any, ts: float, why: str = "") -> dict[str, Any]:
    """The row of ``compensations`` for a rejected ``kind`` reading of ``worker`` (``why``: after "rejected")."""
    where = f" {room}" if room else ""
    return {"worker": str(worker), "event": str(kind), "at": ts,
            "reason": f"{kind}{where} at t={ts:g} was rejected{why}: badge reader flagged for re-sync, worker asked "
                      f"to badge again"}


# --- registration ---------------------------------------------------------------------------------

def register(db) -> dict[str, Rule]:
    """Declare the application's rules on ``db`` and return them by name.

    Precondition: the application's migrations ran (``db.upgrade_app(MIGRATIONS)``).
    """
    rules: dict[str, Rule] = {}
    declare = declarer(db, rules)
    for event_type in BADGE_EVENTS:
        declare(track_badge, on=db.stream(event_type), coupling=Coupling.IMMEDIATE, priority=PRIORITY_TRACK,
                name=f"track_{event_type}")
        declare(compensate_rejected, on=db.stream(event_type), coupling=Coupling.EXCLUSIVE_CAUSALLY_DEPENDENT,
                name=f"compensate_{event_type}")
    declare(warn, on=db.stream("enter"), when=unsanitized_entry, coupling=Coupling.IMMEDIATE,
            priority=PRIORITY_TRANSITION, name="warn_unsanitized_entry")
    declare(escalate, on=db.stream("exit"), when=unmasked_exit_while_warned, coupling=Coupling.IMMEDIATE,
            priority=PRIORITY_TRANSITION, name="escalate_unmasked_exit")
    declare(clear, on=db.stream("sanitize"), when=not_safe, coupling=Coupling.IMMEDIATE,
            priority=PRIORITY_TRANSITION, name="clear_on_sanitize")
    declare_status_rules(db, declare)
    return rules


def declarer(db, rules: dict[str, Rule]):
    """``declare(action, **options)``: ``db.rule(**options)(action)``, kept in ``rules`` by name."""
    def declare(action, **options) -> None:
        rule = db.rule(**options)(action)
        rules[rule.name] = rule

    return declare


def declare_status_rules(db, declare) -> None:
    """The rules on ``status_changed`` and on alerts, the same in both versions of the application."""
    declare(alert_violation, on=db.signalled(STATUS_CHANGED), when=final_status_is_violation,
            coupling=Coupling.DEFERRED, priority=PRIORITY_ALERT, name="alert_violation")
    declare(audit_transition, on=db.signalled(STATUS_CHANGED), coupling=Coupling.DEFERRED,
            priority=PRIORITY_AUDIT, name="audit_transition")
    declare(notify_badge, on=db.inserted("alerts"), coupling=Coupling.DETACHED, name="notify_badge")
    declare(badge_light, on=db.signalled(STATUS_CHANGED), coupling=Coupling.DETACHED_CAUSALLY_DEPENDENT,
            name="badge_light")
    declare(report_incident, on=db.inserted("alerts"), coupling=Coupling.SEQUENTIAL_CAUSALLY_DEPENDENT,
            name="report_incident")


def reset_tables(db) -> None:
    """Empty the application's tables (identities restart); rules and their registry stay."""
    with db.engine.begin() as connection:
        connection.execute(sa.text(f"TRUNCATE {', '.join(APP_TABLES)} RESTART IDENTITY"))


reset = reset_tables      # what ``activedb run APP --reset`` calls
