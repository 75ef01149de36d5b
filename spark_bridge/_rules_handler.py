"""The rule path: every event of a micro-batch in its own subtransaction, the rules on ``db.stream(type)``
firing inside it — the default of ``ingest()`` and of ``IngestSink``.  Design note: the package's
``README.md`` ("One micro-batch", step 4); ``_failures.py`` tells an event's failure from a batch's.

Thread-safety: stateless after construction; one batch's events run one after the other in the
calling thread.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from activedb import TxnState
from activedb.txn import run_inline
from activedb.errors import Failure, classify

from spark_bridge._failures import conflict_in, is_infrastructure_failure, rejection_reason
from spark_bridge._handler import BatchHandler, BatchInput
from spark_bridge._ledger import IngestionLedger
from spark_bridge.mapping import RawEvent

if TYPE_CHECKING:  # pragma: no cover
    from activedb import Transaction

__all__ = ["RulesHandler"]

_ACTIVE = TxnState.ACTIVE


_NAMES: dict[str, str] = {}     # event type -> the name of its events' subtransactions ("event:<type>")
_MAX_NAMES = 1024


def _emit(sub: Any, event: RawEvent) -> None:
    """The body of an event's subtransaction: hand it to the rules on ``db.stream(type)``."""
    sub.emit(event.event_type, key=event.key, ts=event.ts, payload=event.payload)


class RulesHandler(BatchHandler):
    """Runs each event of a batch through the rules of ``db`` (module docstring).  ``prefetch``:
    ``{table: how}`` tables loaded in one query per batch before the events run (``how``: None — the
    event's key is the row key —, a payload field name, or a callable ``RawEvent -> key``)."""

    name = "rules"
    searches_poison = True

    def __init__(self, db: Any, prefetch: Mapping[str, Any] | None = None, event_attempts: int = 3) -> None:
        self.db = db
        self.prefetch = dict(prefetch or {})
        self.event_attempts = event_attempts

    def accepted_types(self) -> frozenset[str] | None:
        """The stream types the rules of ``db`` listen to now (None — anything — if none)."""
        return self.db.rules.stream_types() or None

    def handle(self, tx: Transaction, batch: BatchInput, ledger: IngestionLedger) -> None:
        self._prefetch_rows(tx, batch.events)
        applied = 0
        failed: list[tuple[RawEvent, str]] = []
        for event in batch.events:     # run_batch has paused the cyclic collector (_batch.no_cyclic_gc)
            reason = self._apply_event(tx, event)
            if reason is None:
                applied += 1
            else:
                failed.append((event, reason))
        letters = list(batch.letters) + batch.dead_letters.for_events(failed)
        if failed and ledger.query_name is not None:   # the ids of the events applied: a rejected one may come again
            refused = {id(event) for event, _ in failed}
            ledger.event_ids = [event.event_id for event in batch.events if id(event) not in refused]
        batch.dead_letters.insert(tx, letters)
        ledger.events = applied
        ledger.dead_letters = len(letters)

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
        for attempt in range(1, self.event_attempts + 1):
            try:
                run_inline(tx, _emit, event, name)     # tx.run_subtransaction(_emit, event, name=name), positional
                return None
            except Exception as failure:
                conflict = conflict_in(failure)
                if conflict is not None:
                    raise conflict from failure   # not the event's fault: the whole batch is re-run
                if is_infrastructure_failure(failure) or tx.state is not _ACTIVE:
                    raise
                if classify(failure) is Failure.DEADLOCK and attempt < self.event_attempts:
                    continue
                return rejection_reason(failure)
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _prefetch_rows(self, tx: Transaction, events: tuple[RawEvent, ...] | list[RawEvent]) -> None:
        for table, how in self.prefetch.items():
            if how is None:
                keys = [event.key for event in events]
            elif callable(how):
                keys = [how(event) for event in events]
            else:
                keys = [event.payload.get(how) for event in events]
            keys = [key for key in dict.fromkeys(keys) if key is not None]
            if keys:
                tx.prefetch(table, keys)
