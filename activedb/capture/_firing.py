"""Planning and running a capture batch's firings: the changes in commit order, each change's rules in
priority groups, run through the rule manager's ``fire`` (which says each one's ``FiringOutcome``) — in
chunks sharing one subtransaction when that cannot be told apart from one subtransaction each.  Design
note: ``README.md`` in this package."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from coupling import Coupling, priority_groups

from activedb import lowlevel
from activedb.capture._fetch import Entry
from activedb.capture._position import CapturedChange, DeadLetter
from activedb.errors import DeadlockDetected, SerializationConflict
from activedb.events import Origin
from activedb.rules import Fired, Firing, FiringOutcome, Rule

if TYPE_CHECKING:  # pragma: no cover
    from activedb._handle import DatabaseHandle as Database
    from activedb.txn import Transaction

logger = logging.getLogger("activedb.capture")

#: A firing that is a deadlock victim or meets a serialization conflict runs again this often in its
#: batch; then the whole batch is retried.
FIRING_ATTEMPTS = 3
#: Firings run together in one subtransaction (when that cannot be told apart from one each).
CHUNK_FIRINGS = 100
#: Failures after which a firing (or the batch) runs again.
TRANSIENT = (DeadlockDetected, SerializationConflict)

Planned = tuple[CapturedChange, Firing]


@dataclass
class Result:
    """What one firing of a batch came to."""

    change: CapturedChange
    firing: Firing
    outcome: FiringOutcome
    error: BaseException | None


class RetryBatch(Exception):
    """A firing kept failing transiently: abort the batch and run it again."""


def rules_by_table(database: "Database") -> dict[str, list[Rule]]:
    """The enabled rules on captured changes, per table."""
    found: dict[str, list[Rule]] = {}
    for rule in database.rules:
        if rule.enabled and rule.on.origin is Origin.EXTERNAL:
            found.setdefault(rule.on.source, []).append(rule)
    return found


def plan(database: "Database", name: str, changes: list[Entry], dead_letters: list[DeadLetter],
         number: Callable[[], int]) -> list[Planned]:
    """The batch's firings in order: changes in commit order, each change's rules in priority groups
    (equal priorities in declaration order).  Changes that cannot become events go to ``dead_letters``;
    ``number()`` gives each firing its number."""
    by_table = rules_by_table(database)
    planned = []
    for change, event, problem in changes:
        if event is None:
            dead_letters.append(DeadLetter(change, problem))
            logger.error("capture consumer %r: %s", name, problem)
            continue
        candidates = [rule for rule in by_table.get(change.table, ()) if rule.on.matches(event)]
        firings = [Firing(rule, event, (rule.name,), rule.coupling, number()) for rule in candidates]
        for group in (priority_groups(firings) if len(firings) > 1 else (firings,)):
            planned.extend((change, firing) for firing in group)
    return planned


def may_share_a_subtransaction(database: "Database", planned: list[Planned]) -> bool:
    """Whether firings may run together in one subtransaction (re-run one by one if any fails): only if
    that cannot be told apart from one subtransaction each — no deferred rule is enabled (a deferred
    rule fired by a firing runs when the firing's transaction commits) and every rule couples its
    action immediately (C-A sequential needs the rule manager's parallel siblings)."""
    if any(rule.enabled and rule.coupling is Coupling.DEFERRED for rule in database.rules):
        return False
    return all(firing.rule.action_coupling is Coupling.IMMEDIATE for _, firing in planned)


def run_chunk(database: "Database", name: str, transaction: "Transaction", chunk: list[Planned],
              inline: bool) -> list[Result]:
    """Run ``chunk``'s firings through the rule manager: together in one subtransaction if ``inline`` (the
    fast path), and one subtransaction each if not, or if any of them raised there (nothing of the
    shared one is kept)."""
    if inline and chunk:
        try:
            fired = lowlevel.run_subtransaction(transaction, database.rules.fire, [firing for _, firing in chunk],
                                                   shared=True, name=f"capture:{name}:rules")
            return [Result(change, firing, outcome, None) for (change, firing), (outcome, _) in zip(chunk, fired)]
        except Exception as error:       # re-run one by one: the failing firing alone is discarded
            logger.info("capture consumer %r: a firing of a chunk of %d raised (%r); running them one by one",
                        name, len(chunk), error)
    return [Result(change, firing, *fire(database, transaction, firing)) for change, firing in chunk]


def fire(database: "Database", transaction: "Transaction", firing: Firing) -> Fired:
    """Run one firing in its own subtransaction of the batch, again while it fails transiently."""
    transient: BaseException | None = None
    for _ in range(FIRING_ATTEMPTS):
        try:
            (fired,) = database.rules.fire(transaction, [firing])
            if not isinstance(fired.error, TRANSIENT):
                return fired
            transient = fired.error
        except TRANSIENT as error:
            transient = error
    raise RetryBatch(f"rule {firing.rule.name!r} kept failing on {firing.event.describe()}: {transient!r}")
