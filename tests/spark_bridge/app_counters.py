"""A small activedb application for the Spark bridge's tests (and ``activedb run``).

Events ``add`` and ``sub`` carry an ``amount`` and a sequence number ``seq`` for a key.

* ``apply_add`` / ``apply_sub`` (immediate): update the key's ``counters`` row — total,
  number of events, and the *trail* of ``seq`` numbers in the order the rule saw them
  (so the tests can check the application-time order); ``apply_add`` rejects a negative
  amount and ``apply_sub`` a subtraction below zero (the event becomes a dead letter);
* ``milestone`` (deferred, on any change of ``counters``): records each multiple of 100
  the total crossed upwards.

Everything is a function of the events in application-time order, so two runs over the
same events — through Spark or directly — must leave identical tables.
"""

from __future__ import annotations

from pathlib import Path

from activedb import Coupling
from activedb.ingest import EventMapping

MAPPING = EventMapping("type", "key", "ts", payload_columns=("amount", "seq"))
SCHEMA = "type STRING, key STRING, ts TIMESTAMP, amount INT, seq INT"
MIGRATIONS = Path(__file__).resolve().parents[1] / "app_migrations"
TABLES = ("counters", "milestones")


class NegativeAmount(ValueError):
    """An ``add`` with a negative amount."""


class Overdrawn(ValueError):
    """A ``sub`` that would take the total below zero."""


def _update(tx, event, delta: int) -> None:
    row = tx.read("counters", event.key) or {"total": 0, "events": 0, "trail": ""}
    total = row["total"] + delta
    if total < 0:
        raise Overdrawn(f"{event.key}: {row['total']} - {-delta} < 0")
    trail = f"{row['trail']},{event.payload['seq']}" if row["trail"] else str(event.payload["seq"])
    tx.write("counters", event.key, total=total, events=row["events"] + 1, trail=trail, last_ts=event.ts)


def apply_add(tx, event) -> None:
    amount = event.payload["amount"]
    if amount is None or amount < 0:
        raise NegativeAmount(f"add of {amount!r} to {event.key}: amounts must be >= 0")
    _update(tx, event, amount)


def apply_sub(tx, event) -> None:
    _update(tx, event, -(event.payload["amount"] or 0))


def crossed_a_hundred(tx, event) -> bool:
    before = (event.old or {}).get("total", 0) or 0
    after = (event.new or {}).get("total", 0) or 0
    return after // 100 > before // 100


def milestone(tx, event) -> None:
    threshold = event.new["total"] // 100 * 100
    seq = int(event.new["trail"].rsplit(",", 1)[-1])
    tx.write("milestones", (event.key, threshold), seq=seq)


def register(db) -> None:
    db.rule(on=db.stream("add"), coupling=Coupling.IMMEDIATE, name="apply_add")(apply_add)
    db.rule(on=db.stream("sub"), coupling=Coupling.IMMEDIATE, name="apply_sub")(apply_sub)
    db.rule(on=db.modified("counters"), when=crossed_a_hundred, coupling=Coupling.DEFERRED,
            name="milestone")(milestone)
