"""A capture batch as a batch of the ingestion core (``activedb.ingest``): :class:`CaptureHandler` fires each
change's rules — planned by the one rule dispatcher (``db.rules.plan``: priority groups, numbering, the firing
record) and run through its ``fire`` (which says each one's ``FiringOutcome``), in chunks sharing one
subtransaction when that cannot be told apart from one subtransaction each — and keeps what fails as dead
letters of the batch.  Design note: ``README.md`` in this package ("Exactly once, in commit order").

Thread-safety: a handler serves one consumer, which runs one batch at a time (its ``_run_mutex``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from coupling import Coupling

from activedb import lowlevel
from activedb.capture._position import CapturedChange, PositionWriter, Step
from activedb.deadletters import Letter
from activedb.errors import DatabaseError, DeadlockDetected, SerializationConflict, classify, shown_error
from activedb.events import Event
from activedb.ingest import BatchHandler, BatchInput, IngestionLedger, ReservedSource
from activedb.ingest.errors import NoRuleRegistered
from activedb.rules import Fired, Firing, FiringOutcome, own_event

if TYPE_CHECKING:  # pragma: no cover
    from activedb._handle import DatabaseHandle as Database
    from activedb.ingest import EventMapping
    from activedb.rules import RuleManager
    from activedb.txn import Transaction

logger = logging.getLogger("activedb.capture")

#: A firing that is a deadlock victim or meets a serialization conflict runs again this often in its
#: batch; then the whole batch is retried.
FIRING_ATTEMPTS = 3
#: Firings run together in one subtransaction (when that cannot be told apart from one each).
CHUNK_FIRINGS = 100
#: Failures after which a firing (or the batch) runs again.
TRANSIENT = (DeadlockDetected, SerializationConflict)


def source_of(consumer: str) -> str:
    """The ingestion source of consumer ``consumer``'s batches (and its ledger id: capture has no runs)."""
    return ReservedSource.CAPTURE.source(consumer)


def is_capture_source(source: str) -> bool:
    """Whether ``source`` (an ingestion source, a dead letter's query without its ``replay:`` prefixes) is a capture
    consumer's (:func:`source_of`): its dead letters describe captured changes and hold no row a replay could read."""
    return source.startswith(source_of(""))


@dataclass(frozen=True, eq=False)
class CapturedEvent:
    """One change of a batch as the ingestion core sees it: ``position``, the index of its row in the batch (the
    row its dead letter keeps), the change, and its event — or None and ``problem``, why it cannot become one."""

    position: int
    change: CapturedChange
    event: Event | None
    problem: str | None = None


@dataclass
class Result:
    """What one firing of a batch came to."""

    change: CapturedChange
    position: int
    firing: Firing
    outcome: FiringOutcome
    error: BaseException | None


class RetryBatch(Exception):
    """A firing kept failing transiently: abort the batch and run it again."""


class CaptureHandler(BatchHandler):
    """The handler of one consumer's batches (module docstring): ``events`` are :class:`CapturedEvent` s; a
    change that cannot become an event, or whose rule fails, is a dead letter and the others go on; a change
    whose reactions PostgreSQL refuses at the commit is found by the core's trial flushes.  A batch of a database
    whose rule registry holds no rule at all is refused (``activedb.ingest.errors.NoRuleRegistered``) before
    anything of it is applied: the position stays.  ``on_step`` hears
    :attr:`Step.FIRED`.  Before each batch the consumer hands over its position writer (:meth:`begin`), which
    records the batch's failures with the position."""

    name = "capture"
    validates_rows = False
    late_rows_are_dead_letters = False
    searches_poison = True

    def __init__(self, consumer: str, on_step: Callable[[Step, int], None]) -> None:
        self.consumer = consumer
        self._on_step = on_step
        self.db: Database | None = None
        self._writer: PositionWriter | None = None
        #: The firings of the last batch that committed (or was last attempted), for the consumer's counters.
        self.results: list[Result] = []
        #: The change whose firing runs now (read by another thread at a rule's deadline: event_in_progress).
        self._running: CapturedEvent | None = None

    def bind(self, db: Database, mapping: EventMapping | None) -> None:
        self.db = db

    def begin(self, writer: PositionWriter) -> None:
        """The next batch advances the position through ``writer``."""
        self._writer = writer
        self.results = []

    def handle(self, tx: Transaction, batch: BatchInput, ledger: IngestionLedger) -> None:
        if batch.events:
            # (Else the position would pass the changes.)
            first = batch.events[0].change
            NoRuleRegistered.unless_registered(self._bound().rules, lambda: (
                f"capture consumer {self.consumer!r}, the batch of {len(batch.events)} change(s) from change "
                f"{first.change_id} (commit position {first.position})"))
        results = self._fire(tx, batch.events)
        letters = list(batch.letters) + batch.dead_letters.for_events(
            [(event, event.problem) for event in batch.events if event.event is None])
        for event in batch.events:
            if event.event is None:
                logger.error("capture consumer %r: %s", self.consumer, event.problem)
        for result in results:
            if result.outcome is FiringOutcome.FAILED or result.outcome is FiringOutcome.CANCELLED:
                # (Took no effect either way; a firing its action's nested firing or the cascade limit stopped is
                # said so, naming what stopped it — the outcome the rule manager counted.)
                firing = result.firing
                ended = "failed" if result.outcome is FiringOutcome.FAILED else "was cancelled"
                letters.append(Letter(
                    f"rule {firing.rule.name!r} {ended} on {result.change.describe()}: {shown_error(result.error)}",
                    {**batch.rows[result.position], "rule": firing.rule.name, "key": firing.event.key}))
        batch.dead_letters.insert(tx, letters)
        ledger.events = sum(event.event is not None for event in batch.events)
        ledger.dead_letters = len(letters)
        if self._writer is not None:
            self._writer.failed = len(letters) + batch.written_ahead     # (a change a deadline gave up, too)
        self.results = results
        self._on_step(Step.FIRED, len(results))

    def apply_events(self, tx: Transaction, events: list[CapturedEvent]) -> None:
        self._fire(tx, events)

    def event_in_progress(self) -> CapturedEvent | None:
        """The change whose rule firing runs now (None between firings): past a rule's deadline
        (``activedb.ingest.Deadlines``) it becomes the dead letter, and the batch's re-run leaves it out."""
        return self._running

    def refusal_reason(self, event: CapturedEvent, refusal: BaseException) -> str:
        return f"the reactions to {event.change.describe()} cannot be committed: {refusal}"

    def is_refusal(self, failure: BaseException) -> bool:
        """Any error of PostgreSQL's about what the batch wrote (not a lost connection, a conflict): a change
        whose reactions cannot commit is looked for and kept aside, so that one never stops the stream."""
        return isinstance(failure, DatabaseError) and not classify(failure).transient

    def _bound(self) -> Database:
        if self.db is None:
            raise RuntimeError("CaptureHandler.bind(db, …) first (the Ingestion that takes it binds it)")
        return self.db

    def _fire(self, tx: Transaction, events: Sequence[CapturedEvent]) -> list[Result]:
        """Plan (``db.rules.plan``) and run the firings of ``events``, in commit order.  No firing gets a
        ``CapturedEvent``'s own event (``plan`` gives it to the first): a batch run again plans from it, so a rule
        that changes its event must not change it (``_afresh``)."""
        rules = self._bound().rules
        planned = [(event, firing if firing.event is not event.event else _afresh(firing, event))
                   for event in events if event.event is not None for firing in rules.plan(tx, event.event)]
        inline = may_share_a_subtransaction(self._bound(), planned)
        results: list[Result] = []
        try:
            for first in range(0, len(planned), CHUNK_FIRINGS):
                results.extend(self._run_chunk(tx, planned[first:first + CHUNK_FIRINGS], inline))
        finally:
            self._running = None
        return results

    def _run_chunk(self, tx: Transaction, chunk: list[tuple[CapturedEvent, Firing]], inline: bool) -> list[Result]:
        """Run ``chunk``'s firings through the rule manager: together in one subtransaction if ``inline`` (the
        fast path), and one subtransaction each if not, or if any of them raised there (nothing of the shared
        one is kept)."""
        rules = self._bound().rules
        ran = 0         # how many of the chunk's firings the shared run began
        if inline and chunk:
            fired: list[Fired] = []

            def shared(child: Transaction) -> list[Fired]:      # (firing by firing: event_in_progress knows each)
                nonlocal ran
                for event, firing in chunk:
                    self._running = event
                    ran += 1
                    fired.extend(rules.fire(child, [firing], shared=True))
                return fired

            try:
                lowlevel.run_subtransaction(tx, shared, name=f"capture:{self.consumer}:rules")
                return [Result(event.change, event.position, firing, outcome, None)
                        for (event, firing), (outcome, _) in zip(chunk, fired)]
            except Exception as error:       # re-run one by one: the failing firing alone is discarded
                logger.info("capture consumer %r: a firing of a chunk of %d raised (%r); running them one by one",
                            self.consumer, len(chunk), error)
                # Counters count attempts (rules README): the shared run's abort undid the firings it had executed —
                # cancelled (a detached firing's ``executed`` is this consumer's to count) —, and each firing it
                # began runs again as an attempt of its own (``fire(again=True)``: ``fired`` once more).
                for (_, firing), (outcome, _) in zip(chunk, fired):
                    if outcome is FiringOutcome.EXECUTED:
                        rules.count(firing.rule, "cancelled")
                # (The shared run's rules may have changed their events: each runs again on the event as captured.)
                chunk = [(event, _afresh(firing, event)) for event, firing in chunk]
        results = []
        for index, (event, firing) in enumerate(chunk):
            self._running = event
            results.append(Result(event.change, event.position, firing,
                                  *fire(rules, tx, firing, event, again=index < ran)))
        return results


def _afresh(firing: Firing, captured: CapturedEvent) -> Firing:
    """``firing`` on a copy of ``captured``'s event (``own_event``: its dicts, and their lists and dicts, its own)."""
    assert captured.event is not None       # (only a change that became an event is planned)
    return Firing(firing.rule, own_event(captured.event), firing.chain, firing.coupling, firing.number)


def may_share_a_subtransaction(database: "Database", planned: list[tuple[CapturedEvent, Firing]]) -> bool:
    """Whether firings may run together in one subtransaction (re-run one by one if any fails): only if
    that cannot be told apart from one subtransaction each — no deferred rule is enabled (a deferred
    rule fired by a firing runs when the firing's transaction commits) and every rule couples its
    action immediately (C-A sequential needs the rule manager's parallel siblings)."""
    if any(rule.enabled and rule.coupling is Coupling.DEFERRED for rule in database.rules):
        return False
    return all(firing.rule.action_coupling is Coupling.IMMEDIATE for _, firing in planned)


def fire(rules: RuleManager, transaction: Transaction, firing: Firing, captured: CapturedEvent, *,
         again: bool = False) -> Fired:
    """Run one firing (of ``captured``) in its own subtransaction of the batch, again while it fails transiently —
    each attempt after the first on the event as captured (``_afresh``): the failed attempt may have changed it.
    Each attempt counts as one (``rules.fire(again=…)``); ``again``: the first too (a shared run began it)."""
    transient: BaseException | None = None
    for attempt in range(FIRING_ATTEMPTS):
        if attempt:
            firing = _afresh(firing, captured)
        try:
            (fired,) = rules.fire(transaction, [firing], again=again or attempt > 0)
            if not isinstance(fired.error, TRANSIENT):
                return fired
            transient = fired.error
        except TRANSIENT as error:
            transient = error
    raise RetryBatch(f"rule {firing.rule.name!r} kept failing on {firing.event.describe()}: {transient!r}")
