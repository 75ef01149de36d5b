"""The rule path: every event of a batch in its own subtransaction, the rules on ``db.stream(type)`` firing
inside it — every connector's default (:class:`RulesHandler`) — or, when each type's one rule is a
declared rule (``activedb.batch.declared``) and firing them one by one is the same as running their
declarations as one batch, the batch at commit — through the :class:`BatchLowering` the rule's action offers
(``activedb.batch`` provides it; this module imports nothing of that package).  Design note: the package's
``README.md`` ("The interface"; ``activedb/batch/README.md``, "Declared rules"); ``_failures.py`` tells an
event's failure from a batch's.

Thread-safety: one batch at a time (its cache of lowered rules, ``last_lowered``); one batch's events run
one after the other in the calling thread.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from activedb.errors import InvalidKey, InvalidValue, RuleFailed, check_switch, check_whole_number
from activedb.ingest._failures import is_poison_failure, rejection_reason, run_as_event
from activedb.ingest._ledger import IngestionLedger
from activedb.ingest._mapping import RawEvent
from activedb.ingest._protocol import BatchHandler, BatchInput
from activedb.ingest.errors import IngestError, NoRuleRegistered

if TYPE_CHECKING:  # pragma: no cover
    from activedb.ingest._database import IngestDatabase
    from activedb.rules import RuleManager
    from activedb.store import TableInfo
    from activedb.txn import Transaction

__all__ = ["BatchLowering", "RulesHandler"]


_NAMES: dict[str, str] = {}     # event type -> the name of its events' subtransactions ("event:<type>")
_MAX_NAMES = 1024


class BatchLowering(Protocol):
    """How the rules fired by a batch's event types run as one batch of state transactions at commit, when
    that is the same as firing them one by one.  A rule's action offers one as its ``batch_lowering``
    attribute (``activedb.batch.DeclaredAction`` does), and the database as ``rule_lowering`` (for plain rules
    whose lowering is learned: ``activedb.batch``, "Plain rules lowered"); the rule path asks the action of the
    first event type's one rule, else the database.  Stateless; its ``cache`` is the caller's."""

    def lower(self, rules: Any, transaction: Transaction, event_types: Iterable[str], cache: dict[object, object]) -> Any | None:
        """What :meth:`apply` needs to run the events of ``event_types`` as one batch, or None when firing them
        one by one would differ (``activedb.batch.lower``)."""
        ...

    def apply(self, rules: Any, transaction: Transaction, events: Iterable[RawEvent], lowered: Any, *,
              rejection: Callable[[RuleFailed], str] | None = None, **at_commit: Any) -> Any:
        """Run ``events`` as one batch at the commit of ``transaction``, the firing record kept; returns the
        pending batch (``activedb.batch.apply_lowered``; ``at_commit``: ``BatchInput.at_commit``'s).
        ``rejection(failure)``: the dead-letter reason of an event whose rule raised (the rule path's own, so that a
        lowered batch names it as firing does)."""
        ...

    def refused(self, failure: BaseException) -> bool:
        """Whether the failed commit ``failure`` is the lowering refusing its own attempt (a learned rule did what
        its lowered form cannot): the batch is then run again event by event."""
        ...


def _emit(sub: Any, event: RawEvent) -> None:
    """The body of an event's subtransaction: hand it to the rules on ``db.stream(type)``."""
    sub.emit(event.event_type, key=event.key, ts=event.ts, payload=event.payload)


class RulesHandler(BatchHandler):
    """Runs each event of a batch through the rules of the database it is bound to (module docstring) — every
    connector's default.  ``prefetch``: ``{table: how}`` tables loaded in one query per batch before the events
    run (``how``: None — the event's key is the row key —, a payload field name, or a callable
    ``RawEvent -> key``); ``event_attempts``: attempts of an event whose rule is chosen as deadlock victim;
    ``lower_declared``: see the attribute.  A batch with events of a database whose rule registry holds no rule at
    all is refused before anything of it is applied or recorded (:class:`~activedb.ingest.errors.NoRuleRegistered`: its
    events would count as applied, no rule run); rules that are all disabled let it apply, no rule run."""

    name = "rules"
    searches_poison = True

    def __init__(self, prefetch: Mapping[str, Any] | None = None, event_attempts: int = 3, *,
                 lower_declared: bool = True) -> None:
        check_switch("RulesHandler", "lower_declared", lower_declared, error=IngestError)
        check_whole_number("RulesHandler", "event_attempts", event_attempts, 1, error=IngestError)
        if (prefetch is not None and not isinstance(prefetch, Mapping)) or any(
                not isinstance(table, str) or not (how is None or isinstance(how, str) or callable(how))
                for table, how in (prefetch or {}).items()):
            raise IngestError(f"prefetch maps each table's name to how an event names its row — None (the event's "
                              f"key), a payload field's name or a callable RawEvent -> key: {{'counters': None}}; got "
                              f"{prefetch!r:.80}")
        self.db: IngestDatabase | None = None           # set once by bind()
        self.prefetch = dict(prefetch or {})
        self.event_attempts = event_attempts
        #: Run a batch whose rules are all declared rules, or plain rules that only read and write their event's
        #: row, as one batch of state transactions at commit when that is the same as firing them
        #: (``activedb.batch.lower``; the name predates the plain ones); False: always event by event.
        self.lower_declared = lower_declared
        self._lowered: dict[object, object] = {}      # the lowering's cache (one batch at a time)
        # The (query id, batch id) of the last batch that was lowered (not its pending batch: what that holds goes
        # when its transaction ends), and that of a batch whose lowered attempt PostgreSQL refused for a value an
        # event wrote: its further attempts run event by event, where each such event is refused alone, with its
        # reason.
        self._last_lowered: tuple[str, int] | None = None
        self._last_lowering: BatchLowering | None = None
        self._event_by_event: tuple[str, int] | None = None
        #: The event whose subtransaction runs now (read by another thread at a rule's deadline).
        self._running: RawEvent | None = None

    def bind(self, db: IngestDatabase, mapping: object) -> None:
        """Fire the rules of ``db`` (a handler serves one database)."""
        if self.db is not None and self.db is not db:
            raise IngestError("this RulesHandler already feeds another database; give each ingestion its own")
        self.db = db

    def _rules(self) -> RuleManager:
        """The rules of the database this handler is bound to."""
        if self.db is None:
            raise IngestError("this RulesHandler is not bound to a database: an Ingestion binds it (give it as "
                              "Ingestion(db, handler=...), feed(db, handler=...) or ingest(db, handler=...))")
        return self.db.rules

    @property
    def last_lowered(self) -> tuple[str, int] | None:
        """The ``(query id, batch id)`` of the last batch this handler ran if it was lowered, else None (a batch the
        ledger skipped, already committed, is not run: this stays what it was)."""
        return self._last_lowered

    def accepted_types(self) -> frozenset[str] | None:
        """The stream types the enabled rules of ``db`` listen to now (None — anything — if none: the batch then
        applies, no rule run, when rules exist but are all disabled; with no rule at all :meth:`handle` refuses it,
        :class:`~activedb.ingest.errors.NoRuleRegistered`)."""
        return self._rules().stream_types() or None

    def is_refusal(self, failure: BaseException) -> bool:
        """A poison failure (``BatchHandler.is_refusal``), or the lowering refusing its own attempt of the last
        batch (``BatchLowering.refused``: a learned plain rule's action did what its lowered form cannot)."""
        if is_poison_failure(failure):
            return True
        lowering = self._last_lowering
        return self._last_lowered is not None and lowering is not None and lowering.refused(failure)

    def retries_refused(self, batch: BatchInput, failure: BaseException) -> bool:
        """A lowered attempt PostgreSQL refused (a value an event's declaration wrote), or the lowering refused (a
        learned rule's action did what its lowered form cannot): its trials would run event by event, so the
        batch's next attempt does (``_event_by_event``), where each such event fails alone, with its reason."""
        this = (batch.query_id, batch.batch_id)
        if self._last_lowered == this:
            self._event_by_event = this
            return True
        return False

    def handle(self, tx: Transaction, batch: BatchInput, ledger: IngestionLedger) -> None:
        if batch.events:
            # (A batch without events, its rows all dead letters or none, loses nothing: it applies.)
            NoRuleRegistered.unless_registered(self._rules(), lambda: f"batch {batch.batch_id} of {batch.query_id}")
        this = (batch.query_id, batch.batch_id)
        self._last_lowered = None
        if self.lower_declared and batch.events and self._event_by_event != this:
            lowering = self._lowering(batch.events[0].event_type)
            lowered = None if lowering is None else lowering.lower(
                self._rules(), tx, {event.event_type for event in batch.events}, self._lowered)
            if lowering is not None and lowered is not None:
                self._last_lowering = lowering
                # One batch of state transactions at commit, the firing record kept (``batch.apply_lowered``).
                lowering.apply(self._rules(), tx, batch.events, lowered,
                               rejection=rejection_reason, **batch.at_commit(ledger, refused_may_come_again=True))
                self._last_lowered = this
                return
        self._prefetch_rows(tx, batch.events)
        failed: list[tuple[RawEvent, str]] = []
        for event in batch.events:     # run_batch has paused the cyclic collector (activedb._gc.no_cyclic_gc)
            reason = self._apply_event(tx, event)
            if reason is not None:
                failed.append((event, reason))
        letters = list(batch.letters) + batch.dead_letters.for_events(failed)
        if failed and ledger.query_name is not None:   # the ids of the events applied: a rejected one may come again
            refused = {id(event) for event, _ in failed}
            ledger.event_ids = [event.event_id for event in batch.events if id(event) not in refused]
        batch.dead_letters.insert(tx, letters)
        ledger.events = len(batch.events) - len(failed)
        ledger.dead_letters = len(letters)

    def _lowering(self, event_type: str) -> BatchLowering | None:
        """The :class:`BatchLowering` the action of the one rule ``event_type`` fires offers, else the database's
        (``rule_lowering``: plain rules and chains of them), if it fires any (a batch is lowered only when every
        type's rules can be: ``lower`` checks the rest)."""
        fired = self._rules().on_stream(event_type)
        if not fired:
            return None
        offered: BatchLowering | None = (getattr(fired[0].action_function(), "batch_lowering", None)
                                         if len(fired) == 1 else None)
        return offered if offered is not None else self.db.rule_lowering  # type: ignore[union-attr]  # (bound)

    def apply_events(self, tx: Transaction, events: list[RawEvent]) -> None:
        self._prefetch_rows(tx, events)
        for event in events:
            self._apply_event(tx, event)

    def _apply_event(self, tx: Transaction, event: RawEvent) -> str | None:
        """Run ``event`` in its own subtransaction of ``tx``; None if it committed, else why not.

        Raises when the batch itself cannot go on (``tx`` unusable, PostgreSQL down)."""
        name = _NAMES.get(event.event_type)
        if name is None:
            name = f"event:{event.event_type}"
            if len(_NAMES) < _MAX_NAMES:      # (types come from the data: the cache stays bounded)
                _NAMES[event.event_type] = name
        self._running = event
        try:
            return run_as_event(tx, _emit, event, name, self.event_attempts)
        finally:
            self._running = None

    def event_in_progress(self) -> RawEvent | None:
        """The event whose subtransaction runs now (None between events: at the batch's commit)."""
        return self._running

    def _prefetch_rows(self, tx: Transaction, events: tuple[RawEvent, ...] | list[RawEvent]) -> None:
        """Load the rows ``prefetch`` names.  It only saves round trips: an event for which no row can be named —
        ``how`` raises, or gives what is no key of the table — is left out, and its rule meets the problem itself
        (its event a dead letter at worst); one event's data never fails the batch."""
        for table, how in self.prefetch.items():
            if how is None:
                keys: list[Any] = [event.key for event in events]
            elif callable(how):
                keys = []
                for event in events:
                    try:
                        keys.append(how(event))
                    except Exception:       # (e.g. a payload field this event lacks)
                        continue
            else:
                keys = [event.payload.get(how) for event in events]
            try:
                unique = dict.fromkeys(keys)
            except TypeError:               # (a value that cannot be a key: a list)
                unique = dict.fromkeys(key for key in keys if _hashable(key))
            keys = [key for key in unique if key is not None]
            if not keys:
                continue
            try:
                tx.prefetch(table, keys)
            except (InvalidKey, InvalidValue):     # (checked before anything is locked or read)
                info = tx.manager.catalog.table_info(table)
                keys = [key for key in keys if _key_of(info, key)]
                if keys:
                    tx.prefetch(table, keys)


def _hashable(value: object) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


def _key_of(info: TableInfo, key: object) -> bool:
    """Whether ``key`` is a key of the table ``info`` describes."""
    try:
        info.key(key)
    except (InvalidKey, InvalidValue):
        return False
    return True
