"""``app_counters``' two immediate rules as declared rules (``@batch.declared``): the same ``counters`` rows
— total, number of events, the trail of ``seq`` numbers in the order the rule saw them, the last
timestamp — and the same refusals (a negative ``add``, a ``sub`` below zero: ``batch.Abort``), so that a
batch of these events through the sink's lowered path, event by event, and through ``app_counters``' plain
rules (without its ``milestone`` rule: ``register_plain``) must leave identical ``counters`` tables."""

from __future__ import annotations

from activedb import Coupling, batch

from tests.spark_bridge import app_counters

MAPPING = app_counters.MAPPING
MIGRATIONS = app_counters.MIGRATIONS
TABLES = ("counters",)


def _change(event, delta: int):
    def apply(own):
        row = own or {"total": 0, "events": 0, "trail": ""}
        total = row["total"] + delta
        if total < 0:
            raise batch.Abort(f"{event.key}: {row['total']} - {-delta} < 0")
        trail = f"{row['trail']},{event.payload['seq']}" if row["trail"] else str(event.payload["seq"])
        return {"total": total, "events": row["events"] + 1, "trail": trail, "last_ts": event.ts}
    return apply


@batch.declared
def add(event, ops) -> None:
    amount = event.payload["amount"]
    if amount is None or amount < 0:
        raise batch.Abort(f"add of {amount!r} to {event.key}: amounts must be >= 0")
    ops.write("counters", event.key, _change(event, amount))


@batch.declared
def sub(event, ops) -> None:
    ops.write("counters", event.key, _change(event, -(event.payload["amount"] or 0)))


def register(db) -> None:
    db.rule(on=db.stream("add"), coupling=Coupling.IMMEDIATE, name="declared_add")(add)
    db.rule(on=db.stream("sub"), coupling=Coupling.IMMEDIATE, name="declared_sub")(sub)


def register_plain(db) -> None:
    """``app_counters``' two immediate rules alone."""
    db.rule(on=db.stream("add"), coupling=Coupling.IMMEDIATE, name="apply_add")(app_counters.apply_add)
    db.rule(on=db.stream("sub"), coupling=Coupling.IMMEDIATE, name="apply_sub")(app_counters.apply_sub)
