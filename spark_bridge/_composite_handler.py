"""The composite path: micro-batches into a composition engine (``activedb.composite``), for
``ingest(db, frame, mapping=EventMapping(…, producer_column=…), composition=engine)``.  The engine reads
the rows itself (``validates_rows = False``: a heartbeat row has no key, and the order that matters is
per producer).  Design note and limits: the package's ``README.md`` ("Composite: many producers").
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from activedb import composite

from spark_bridge._handler import BatchHandler, BatchInput
from spark_bridge._ledger import IngestionLedger
from spark_bridge.composite_feed import feed_batch
from spark_bridge.errors import IngestError

if TYPE_CHECKING:  # pragma: no cover
    from activedb import Transaction

__all__ = ["CompositeHandler"]


class CompositeHandler(BatchHandler):
    """Feeds each batch to a composition engine (module docstring).  Thread-safety: one batch at a
    time (the engine's own mutex guards its state)."""

    name = "composite"
    late_rows_are_dead_letters = False
    validates_rows = False

    def __init__(self, engine: Any, mapping: Any) -> None:
        if not isinstance(engine, composite.CompositionEngine):
            raise IngestError(f"composition= takes an activedb.composite.CompositionEngine; got {engine!r}")
        if mapping.producer_column is None:
            raise IngestError(
                "composition= needs a mapping that names the producer: EventMapping(…, producer_column='producer', "
                "accuracy_column='accuracy', heartbeat_type='heartbeat')")
        self.engine = engine
        self.mapping = mapping

    def handle(self, tx: Transaction, batch: BatchInput, ledger: IngestionLedger) -> None:
        result = feed_batch(self.engine, batch.rows, self.mapping, tx=tx)
        letters = list(batch.letters) + batch.dead_letters.rejected(result.rejected)
        batch.dead_letters.insert(tx, letters)
        ledger.events = len(result.composites)
        ledger.dead_letters = len(letters)
