"""The badge story both hand-hygiene tests run (the plain-rule app and the pattern-query app): nine workers,
each a case of Active CEP's Examples 1–3 or of the app's own rules; each test asserts what its app makes
of it.  Also the app's tables as comparable rows (``table_state``), for the tests that compare two runs."""

from __future__ import annotations

import sqlalchemy as sa


def badge(kind: str, worker: str, ts: float, room: str = "corridor") -> dict:
    return {"type": kind, "worker": worker, "ts": ts, "room": room}


def rows(db, query: str, **parameters) -> list[tuple]:
    with db.engine.connect() as connection:
        return [tuple(row) for row in connection.execute(sa.text(query), parameters)]


#: The hand-hygiene app's tables, generated ids left out (detached rows get theirs in whatever order they run).
APP_TABLES = {
    "worker_status": "SELECT * FROM worker_status",
    "alerts": "SELECT worker, kind, at FROM alerts",
    "status_changes": "SELECT worker, old_status, new_status, event, at FROM status_changes",
    # an incident report names its alert's generated id: left out too
    "notifications": "SELECT worker, regexp_replace(message, '\\(alert [0-9]+\\)', ''), at, channel "
                     "FROM notifications",
    "badge_lights": "SELECT worker, color, status, at FROM badge_lights",
    "compensations": "SELECT worker, reason, at, event FROM compensations",
}


def table_state(database, queries: dict[str, str] = APP_TABLES) -> dict[str, list[tuple]]:
    """Each of ``queries``' rows, sorted, by its name."""
    with database.engine.connect() as connection:
        return {table: sorted(tuple(row) for row in connection.execute(sa.text(query)))
                for table, query in queries.items()}


STORY = [
    # w1 — Active CEP's Example 1: exit^2, enter^10 matches Q1 (safe -> warning); exit^15 in warning, unmasked,
    # so he leaves the room still unsanitized -> violation.
    badge("enter", "w1", 0.0, "room1"), badge("exit", "w1", 2.0, "room1"),
    badge("enter", "w1", 10.0, "room2"), badge("exit", "w1", 15.0, "room2"),
    # w2 — sanitizes between the rooms: !SANITIZE fails, Q1 does not match.
    badge("enter", "w2", 0.5, "room1"), badge("exit", "w2", 2.5, "room1"),
    badge("sanitize", "w2", 5.0), badge("enter", "w2", 10.5, "room2"),
    # w3 — enters the next room after the 45 s window.
    badge("enter", "w3", 1.0, "room1"), badge("exit", "w3", 3.0, "room1"), badge("enter", "w3", 60.0, "room2"),
    # w4 — goes back into the same room (EXIT.location = ENTER.location).
    badge("enter", "w4", 1.5, "room3"), badge("exit", "w4", 3.5, "room3"), badge("enter", "w4", 11.0, "room3"),
    # w5 — warned, masks, and leaves within 5 s: Q2's SEQ(MASK, EXIT) matches (the rule app keeps him in
    # warning; the query app's R2, its own choice, makes him safe, so R4's WHEN then sees safe).
    badge("enter", "w5", 0.2, "room1"), badge("exit", "w5", 2.2, "room1"), badge("enter", "w5", 10.2, "room2"),
    badge("mask", "w5", 12.0, "room2"), badge("exit", "w5", 15.2, "room2"),
    # w6 — warned, sanitizes in the room -> safe (the query app: Q3/R3); leaving is then fine.
    badge("enter", "w6", 0.3, "room1"), badge("exit", "w6", 2.3, "room1"), badge("enter", "w6", 10.3, "room2"),
    badge("sanitize", "w6", 12.3, "room2"), badge("exit", "w6", 15.3, "room2"),
    # w7 — violation, then sanitizes in the corridor -> safe.
    badge("enter", "w7", 0.4, "room1"), badge("exit", "w7", 2.4, "room1"), badge("enter", "w7", 10.4, "room2"),
    badge("exit", "w7", 15.4, "room2"), badge("sanitize", "w7", 20.0),
    # w8 — an ENTER while badged in room1 is impossible: rejected (and compensated), the rest applies.
    badge("enter", "w8", 0.6, "room1"), badge("enter", "w8", 5.0, "room2"), badge("exit", "w8", 8.0, "room1"),
    # w9 — warned; an EXIT from a room he is not in is rejected *before* the escalation (the rule app's rule of
    # priority 100 over 50, the query app's Q4) could turn it into a violation; then sanitizes.
    badge("enter", "w9", 0.7, "room1"), badge("exit", "w9", 2.7, "room1"), badge("enter", "w9", 10.7, "room2"),
    badge("exit", "w9", 12.0, "room3"), badge("sanitize", "w9", 14.0, "room2"),
]
