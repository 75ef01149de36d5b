"""The counters application (``app_counters``) with a watcher: the metrics test's application for ``activedb run``.

``watch_large_add`` (immediate, the same priority as ``apply_add``) fires on every ``add`` too, so the two rules run
at the same time as sibling subtransactions of the event's subtransaction; its condition reads the key's
``counters`` row that ``apply_add`` is writing, so one of the two waits for the other's lock now and then (a lock
wait in the run's metrics, out of the application's ordinary work).  For an ``add`` of at least half the key's
total it emits a ``large_add`` event (no rule is on it).  It writes nothing, so the tables are those of
``app_counters``.
"""

from __future__ import annotations

from activedb import Coupling

from tests.spark_bridge import app_counters
from tests.spark_bridge.app_counters import MAPPING, MIGRATIONS, SCHEMA, TABLES  # noqa: F401  (``activedb run``)


def is_large(tx, event) -> bool:
    row = tx.read("counters", event.key) or {"total": 0}
    amount = event.payload["amount"] or 0
    return amount > 0 and 2 * amount >= row["total"]


def report_large(tx, event) -> None:
    tx.emit("large_add", key=event.key, ts=event.ts, payload={"amount": event.payload["amount"]})


def register(db) -> None:
    app_counters.register(db)
    db.rule(on=db.stream("add"), when=is_large, coupling=Coupling.IMMEDIATE, name="watch_large_add")(report_large)
