"""The store integration: one batch inside a top-level transaction, through the public API.

:func:`apply_batch` is what a caller that owns the transaction (the Spark sink, a user) runs:

1. declare every event (rejected events are returned, not raised);
2. ``tx.prefetch(table, keys)`` once per table for every declared row (own, parameter,
   window source, ND candidate) and take the images with ``tx.read`` (no round trip);
3. execute the TPG in memory (this process, or components over worker processes);
4. write each touched row's **final** version once: ``tx.write(table, key, **changed
   columns)`` or ``tx.delete`` — one write-set entry per key, whatever the number of
   versions the batch made;
5. return the :class:`BatchResult`: aborted transactions with their reasons are the
   caller's dead letters, so the batch's state, its dead letters and (with
   ``db.transaction(batch=...)``) the ingestion-ledger row commit in one PostgreSQL
   transaction.

Rows are locked by ``prefetch`` with READ locks and upgraded to WRITE by ``tx.write`` at
step 4.  Two concurrent batches on shared rows can therefore deadlock on the upgrade; the
lock manager detects it and the victim's batch re-runs (``db.run`` retries).  A
``prefetch(..., for_update=True)`` in the core would take WRITE locks up front (see the
README).  Rows a non-deterministic operation without candidates computes at run time are
read with ``tx.read`` when first needed (so such batches run in this process).
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterable, Mapping
from typing import Any

from activedb.batch._declare import BatchEvent, StateTransactions
from activedb.batch._result import BatchResult
from activedb.batch._runtime import AUTO, execute, prepare
from activedb.batch._strategy import Strategy

__all__ = ["DEAD_LETTER_TABLE", "apply_batch", "dead_letter_row", "run_batch"]

DEAD_LETTER_TABLE = "activedb_dead_letters"
_MISSING = object()


def apply_batch(tx: Any, events: Iterable[Any], transactions: StateTransactions, *,
                strategy: str | Strategy = AUTO, processes: int | None = None, split: str = "auto") -> BatchResult:
    """Run ``events`` as one batch of state transactions inside the open transaction ``tx``
    and leave the final rows in its write set.  Does not commit and does not write dead
    letters: ``result.dead_letters`` lists ``(event, reason)`` for the caller to store."""
    prepared = prepare(transactions, events)
    started = time.perf_counter()
    base: dict[tuple[str, Any], dict | None] = {}
    for table, keys in prepared.states_by_table().items():
        tx.prefetch(table, keys)
        for key in keys:
            base[(table, key)] = tx.read(table, key)
    prefetch_seconds = time.perf_counter() - started
    result = execute(transactions, prepared, base, loader=tx.read, strategy=strategy, processes=processes,
                     split=split)
    started = time.perf_counter()
    written = 0
    for (table, key), image in result.final.items():
        old = result.before.get((table, key), base.get((table, key)))
        if image is None:
            if old is not None:
                tx.delete(table, key)
                written += 1
            continue
        if old is None:
            changes = dict(image)
        else:
            changes = {column: value for column, value in image.items() if old.get(column, _MISSING) != value}
        if changes:
            tx.write(table, key, **changes)
            written += 1
    if result.statistics is not None:
        result.statistics.seconds["prefetch"] = prefetch_seconds
        result.statistics.seconds["write"] = time.perf_counter() - started
    result.notes.append(f"{written} rows written")
    return result


def _jsonable(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(name): _jsonable(item) for name, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(item) for item in value]
    if isinstance(value, (dt.datetime, dt.date)):
        return value.isoformat()
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


def dead_letter_row(event: BatchEvent) -> dict:
    """The ``raw`` JSON of a dead letter for ``event``."""
    return {"event_type": event.event_type, "key": _jsonable(event.key), "ts": _jsonable(event.ts),
            "payload": _jsonable(event.payload)}


def run_batch(db: Any, events: Iterable[Any], transactions: StateTransactions, *,
              strategy: str | Strategy = AUTO, participants: Iterable[Any] = (), query_id: str | None = None,
              batch_id: int | None = None, dead_letters: bool = True, processes: int | None = None,
              split: str = "auto") -> BatchResult:
    """Convenience for users feeding events directly: one top-level transaction that applies the batch and
    inserts its dead letters into ``activedb_dead_letters`` (labelled with ``query_id``/``batch_id`` if
    given); ``participants`` take part in its commit (e.g. a ledger row written in the same PostgreSQL
    transaction); commits on return."""
    with db.transaction(name="batch:tpg", participants=participants) as tx:
        result = apply_batch(tx, events, transactions, strategy=strategy, processes=processes, split=split)
        letters = result.dead_letters
        if dead_letters:
            for event, reason in letters:
                tx.insert(DEAD_LETTER_TABLE, query_id=query_id, batch_id=batch_id, reason=reason,
                          raw=dead_letter_row(event))
        tx.info["events"] = len(result.committed)
        tx.info["dead_letters"] = len(letters)
    return result
