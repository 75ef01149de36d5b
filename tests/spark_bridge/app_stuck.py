"""The counters application (``app_counters``) with a rule that never returns: the ``add`` whose ``seq`` is
:data:`STUCK_SEQ` reads its key's row for update (a ``FOR UPDATE`` row lock in PostgreSQL) and then waits forever.
Every other event is applied as ``app_counters`` applies it.  ``register`` warms the app's tables up (``warm_up``), so
that only the stuck firing can come near the test's short rule deadline."""

from __future__ import annotations

import threading

from activedb import Coupling
from tests.spark_bridge.app_counters import (  # noqa: F401  (what activedb run reads of an app)
    MAPPING, MIGRATIONS, SCHEMA, TABLES, apply_add, apply_sub, crossed_a_hundred, milestone,
)

STUCK_SEQ = 99


def apply_add_or_hang(tx, event) -> None:
    if event.payload["seq"] == STUCK_SEQ:
        tx.read("counters", event.key, for_update=True)
        threading.Event().wait()           # never returns
    apply_add(tx, event)


def register(db) -> None:
    db.rule(on=db.stream("add"), coupling=Coupling.IMMEDIATE, name="apply_add")(apply_add_or_hang)
    db.rule(on=db.stream("sub"), coupling=Coupling.IMMEDIATE, name="apply_sub")(apply_sub)
    db.rule(on=db.modified("counters"), when=crossed_a_hundred, coupling=Coupling.DEFERRED,
            name="milestone")(milestone)
    warm_up(db)


def warm_up(db) -> None:
    """Pay, before any batch, what a process's first firing on each table would pay inside its rule deadline: a pooled
    connection, the table's reflection, the code of a read — so that only the stuck firing can come near the test's
    short deadline on a busy machine (at load 7 on 2 cores a process's first ``milestone`` firing took 98 ms without it;
    with it, at load 9, no firing took more than 10 ms).  It reads two rows that need not exist and writes nothing."""
    with db.transaction(name="app_stuck: warm up") as tx:
        tx.read("counters", "")
        tx.read("milestones", ("", 0))
