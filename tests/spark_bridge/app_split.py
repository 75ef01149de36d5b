"""The counters application (``app_counters``' ``apply_add`` / ``apply_sub``) with a poisoned key, for the
tests of a scale-out batch one partition of which fails for good (``test_split_batches.py``).

* An ``add`` of key :data:`POISON_KEY` makes its batch transaction fail at the commit, in every attempt,
  for as long as the fix is missing: the rule ``refuse_poison`` enlists a commit participant that refuses
  the flush (an application check at commit time, raising :class:`PoisonedBatch`) unless ``items`` holds
  the row :data:`FIX_KEY`.  It is not an event failure (those become dead letters) nor a value PostgreSQL
  refuses (those are found by bisection and dead-lettered): the sink cannot apply the partition at all —
  a poisoned partition that replay cannot fix until the fix is in.
* ``counters`` is opted into before-image undo, so a committed partition can be compensated (the driver's
  database registers this app too: the compensation runs there).

No deferred rule on ``counters`` (``app_counters``' milestone): a compensating transaction writes
``counters`` too and would fire it.
"""

from __future__ import annotations

import sqlalchemy as sa

from activedb import lowlevel
from activedb import CommitParticipant, Coupling
from tests.spark_bridge.app_counters import MAPPING, MIGRATIONS, SCHEMA, apply_add, apply_sub

__all__ = ["FIX_KEY", "MAPPING", "MIGRATIONS", "POISON_KEY", "SCHEMA", "PoisonedBatch", "register"]

POISON_KEY = "poison"
FIX_KEY = "app_split:poison-fixed"
TABLES = ("counters",)


class PoisonedBatch(RuntimeError):
    """A batch holding an ``add`` of the poisoned key, refused at its commit until the fix is in."""


class Refusal(CommitParticipant):
    """Refuses the flush of the batch it is enlisted in unless the fix row exists (read in the flush)."""

    def write(self, transaction, connection) -> None:
        fixed = connection.execute(sa.text("SELECT 1 FROM items WHERE key = :key"), {"key": FIX_KEY}).first()
        if fixed is None:
            raise PoisonedBatch(f"key {POISON_KEY!r} is poisoned: its batch cannot commit until the fix is in "
                                f"(items row {FIX_KEY!r})")


def is_poisoned(tx, event) -> bool:
    return event.key == POISON_KEY


def refuse_poison(tx, event) -> None:
    lowlevel.enlist(tx, Refusal())


def register(db) -> None:
    db.rule(on=db.stream("add"), coupling=Coupling.IMMEDIATE, name="apply_add")(apply_add)
    db.rule(on=db.stream("sub"), coupling=Coupling.IMMEDIATE, name="apply_sub")(apply_sub)
    db.rule(on=db.stream("add"), when=is_poisoned, coupling=Coupling.IMMEDIATE, name="refuse_poison")(refuse_poison)
    db.batches.undo_by_before_image("counters")
