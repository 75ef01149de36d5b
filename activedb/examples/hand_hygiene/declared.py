"""The hand-hygiene application as declared rules: one ``@batch.declared`` rule per badge event type, whose
state transaction does what ``app.py``'s rules do to the same tables — the reading, the transition, the audit
row, the alert, the badge light, both notifications, and for a rejected event its compensation — so that the
Spark sink runs a micro-batch of badge events as one batch of state transactions at commit (``batch.lower``).

Public interface: :func:`register` ``(db) -> dict[str, Rule]``, :func:`badge_event` (the declaring function),
:func:`outcome` (what one reading does to a worker's row: a pure function); and what ``activedb run
activedb.examples.hand_hygiene.declared --source file:DIR`` needs, as ``app.py`` has it (``MAPPING``, ``SCHEMA``,
``MIGRATIONS``, ``reset``).  How it differs from ``app.py``
(every effect in the event's own transaction, a rejection is not an abort, the incident report names the
alert by its time): ``README.md`` in this package, "The declared version".
"""

from __future__ import annotations

from typing import Any, NamedTuple

from activedb import batch
from activedb.batch import DELETE
from activedb.examples.hand_hygiene.app import (
    BADGE_EVENTS, COLORS, MAPPING, MIGRATIONS, Q1_WINDOW_SECONDS, Q2_WINDOW_SECONDS, SAFE, SCHEMA, VIOLATION, WARNING,
    WORKERS, compensation, contradiction, reading, reset_tables, seconds)
from activedb.examples.hand_hygiene.errors import MalformedBadgeEvent

__all__ = ["EFFECT_TABLES", "MAPPING", "MIGRATIONS", "Outcome", "SCHEMA", "badge_event", "outcome", "register",
           "reset"]

reset = reset_tables      # what ``activedb run APP --reset`` calls

#: The tables a badge event of each type may insert into, besides writing its worker's row: a rejection's
#: compensation; a transition's audit row and badge light (no MASK moves a worker); a violation's alert and
#: notifications (only an EXIT escalates).
EFFECT_TABLES = {
    "enter": ("compensations", "status_changes", "badge_lights"),
    "exit": ("compensations", "status_changes", "badge_lights", "alerts", "notifications"),
    "sanitize": ("compensations", "status_changes", "badge_lights"),
    "mask": ("compensations",),
}


class Outcome(NamedTuple):
    """What one reading does: ``row`` the worker's row to write (the columns; DELETE: none, for a rejected first
    reading), ``effects`` table → the rows it inserts."""

    row: Any
    effects: dict[str, list[dict]]


def outcome(worker: str, kind: str, room: Any, ts: float, row: dict | None) -> Outcome:
    """A ``kind`` reading of ``worker`` in ``room`` at ``ts`` against his row before it (None: first seen): the
    tracking of ``app.track_badge``, then the transition of the rule whose condition holds (``warn``,
    ``escalate``, ``clear``) with its audit row, badge light and, for a violation, the alert and both
    notifications; or, for a late or impossible reading, the row unchanged and the compensation."""
    current = row if row is not None else {"status": SAFE, "room": None, "last_ts": None, "changes": 0}
    last_ts = current.get("last_ts")
    if (last_ts is not None and ts < last_ts) or contradiction(worker, kind, room, current.get("room"), ts):
        return Outcome(DELETE if row is None else {}, {"compensations": [compensation(worker, kind, room, ts)]})
    updates = reading(kind, room, ts)
    if row is None:
        updates["changes"] = 0
    updates["status"] = status = current["status"]
    after = {**current, **updates}
    new = _transition(kind, room, ts, after)
    if new is None:
        return Outcome(updates, {})
    updates.update(status=new, status_ts=ts, changes=after["changes"] + 1)
    effects = {"status_changes": [{"worker": worker, "old_status": status, "new_status": new, "event": kind,
                                   "at": ts}],
               "badge_lights": [{"worker": worker, "color": COLORS[new], "status": new, "at": ts}]}
    if new == VIOLATION:
        effects["alerts"] = [{"worker": worker, "kind": VIOLATION, "at": ts}]
        effects["notifications"] = [
            {"worker": worker, "channel": "badge", "at": ts,
             "message": f"hygiene violation at t={ts:g}: sanitize your hands now"},
            {"worker": worker, "channel": "infection_control", "at": ts,
             "message": f"incident: {worker} in hygiene violation at t={ts:g} (alert of t={ts:g})"}]
    return Outcome(updates, effects)


def _transition(kind: str, room: Any, ts: float, row: dict) -> str | None:
    """The new status the conditions of ``app.py``'s transition rules give (after the reading), or None."""
    status = row["status"]
    if kind == "enter" and status == SAFE:
        exit_ts, sanitize_ts = row.get("last_exit_ts"), row.get("last_sanitize_ts")
        if (exit_ts is not None and ts - exit_ts <= Q1_WINDOW_SECONDS and row.get("last_exit_room") != room
                and not (sanitize_ts is not None and sanitize_ts >= exit_ts)):
            return WARNING
    elif kind == "exit" and status == WARNING:
        mask_ts = row.get("last_mask_ts")
        if not (mask_ts is not None and 0.0 <= ts - mask_ts <= Q2_WINDOW_SECONDS):
            return VIOLATION
    elif kind == "sanitize" and status != SAFE:
        return SAFE
    return None


@batch.declared
def badge_event(event, ops) -> None:
    """A badge event's state transaction: its worker's row written with the :func:`outcome` of the reading
    (from the row as of before the event), and the outcome's rows inserted into the tables its type may
    insert into (:data:`EFFECT_TABLES`, one ``insert_into``).  An event without a worker or a time is only
    compensated."""
    worker, kind, room = event.key, event.event_type, event.payload.get("room")
    try:
        ts = seconds(event.ts)
    except MalformedBadgeEvent:
        ts = None
    if ts is None or not isinstance(worker, str) or not worker:
        ops.insert("compensations", compensation(worker, kind, room, ts if ts is not None else 0.0))
        return
    decided: list = [None, None]            # (the row it was decided for, the outcome): once per event

    def decide(row: dict | None) -> Outcome:
        if decided[1] is None or decided[0] is not row:
            decided[0], decided[1] = row, outcome(worker, kind, room, ts, row)
        return decided[1]

    ops.write(WORKERS, worker, lambda own: decide(own).row)
    tables = EFFECT_TABLES.get(kind)
    if tables:
        ops.insert_into(tables, lambda own: decide(own).effects, reads=[(WORKERS, worker)])


def register(db) -> dict[str, Any]:
    """Declare :func:`badge_event` on ``db`` for every badge event type and return the rules by name.

    Precondition: the application's migrations ran (``db.upgrade_app(MIGRATIONS)``)."""
    rules = {}
    for event_type in BADGE_EVENTS:
        rule = db.rule(on=db.stream(event_type), name=f"declared_{event_type}")(badge_event)
        rules[rule.name] = rule
    return rules
