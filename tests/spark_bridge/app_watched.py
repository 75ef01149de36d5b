"""The counters application (``app_counters``) with a watcher, a staged deadlock and a pager that is down: the
metrics test's application for ``activedb run``.

* ``watch_large_add`` (immediate, the same priority as ``apply_add``) fires on every ``add`` too, so the two rules
  run at the same time as sibling subtransactions of the event's subtransaction; its condition reads the key's
  ``counters`` row that ``apply_add`` is writing, so one of the two waits for the other's lock now and then (a lock
  wait in the run's metrics, out of the application's ordinary work).  For an ``add`` of at least half the key's
  total it emits a ``large_add`` event.
* ``page_on_large_add`` (detached, on ``large_add``) stands for a notification service that is down during the run:
  every firing raises, so it fails for good in the outbox (failed outbox firings in the metrics).
* ``lock_left`` / ``lock_right`` (immediate, siblings of ``apply_add``) stage one deadlock, on the first ``add``
  this process sees: both read the same ``milestones`` row (a READ lock each), meet at a barrier, and both ask to
  write it — each waits for the other's READ lock, the lock manager finds the cycle and aborts one of them (a
  deadlock in the metrics).  The event's subtransaction fails with it, and the sink runs the event again (a
  deadlock is not the event's fault); by then the stage is over, both conditions are false, and nothing the two
  rules wrote was kept.  So the tables are those of ``app_counters``, as if neither rule existed.
"""

from __future__ import annotations

import threading

from activedb import Coupling

from tests.spark_bridge import app_counters
from tests.spark_bridge.app_counters import MAPPING, MIGRATIONS, SCHEMA, TABLES  # noqa: F401  (``activedb run``)

BARRIER_SECONDS = 120      # both rules reach the barrier within the same event; generous for a loaded machine


class PagerUnreachable(RuntimeError):
    """The notification service of ``page_on_large_add`` is down."""


class StagedDeadlock:
    """Once per process: two sibling rules READ one row, meet, then both write it (a wait-for cycle)."""

    def __init__(self) -> None:
        self._barrier = threading.Barrier(2, timeout=BARRIER_SECONDS)
        self._mutex = threading.Lock()
        self._staged = False

    def armed(self, tx, event) -> bool:
        with self._mutex:
            return not self._staged

    def act(self, tx, event) -> None:
        row = (event.key, -1)
        tx.read("milestones", row)
        self._barrier.wait()          # both hold their READ lock now
        with self._mutex:
            self._staged = True
        tx.write("milestones", row, seq=-1)


def is_large(tx, event) -> bool:
    row = tx.read("counters", event.key) or {"total": 0}
    amount = event.payload["amount"] or 0
    return amount > 0 and 2 * amount >= row["total"]


def report_large(tx, event) -> None:
    tx.emit("large_add", key=event.key, ts=event.ts, payload={"amount": event.payload["amount"]})


def page(tx, event) -> None:
    raise PagerUnreachable(f"cannot page about a large add of {event.payload['amount']} to {event.key}: "
                           f"the pager service is down")


def register(db) -> None:
    app_counters.register(db)
    db.rule(on=db.stream("add"), when=is_large, coupling=Coupling.IMMEDIATE, name="watch_large_add")(report_large)
    db.rule(on=db.stream("large_add"), coupling=Coupling.DETACHED, name="page_on_large_add")(page)
    stage = StagedDeadlock()
    for name in ("lock_left", "lock_right"):
        db.rule(on=db.stream("add"), when=stage.armed, coupling=Coupling.IMMEDIATE, name=name)(stage.act)
