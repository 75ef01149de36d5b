"""Atomic batches (Vidyasankar, *On Atomic Batch Executions in Stream Processing*): lineage, the paper's
scover and independent scover, and compensation of a source batch, exactly once.

Public interface: ``db.batches`` (:class:`Batches`) — ``consumed / produced / triggered_by / note``,
``compensation / rule_compensation / transaction_compensation / undo_by_before_image``, ``composite /
scover / independent_scover / graph``, ``plan / compensate``, ``prune``; the CLI ``activedb batches``.
Design note: ``README.md`` here.  (``activedb.batch``, singular, is the unrelated TPG executor.)
"""

from typing import TYPE_CHECKING

from activedb.atomic import errors
from activedb import lazy

__all__ = ["Batches", "BatchRef", "BoundReached", "CompensationPlan", "CompensationReport", "IndependentScover",
           "CompensationMode", "CompensationScope", "SplitFailure", "TransactionLineage", "Unsafe", "errors"]

# imported on first use: `import activedb.atomic` stays fast (the CLI's start)
__getattr__, __dir__ = lazy.exports(__name__, {
    "activedb.atomic._batches": ["Batches", "SplitFailure"],
    "activedb.atomic._compensate": ["CompensationMode", "CompensationPlan", "CompensationReport", "CompensationScope", "Unsafe"],
    "activedb.atomic._graph": ["BoundReached", "IndependentScover", "TransactionLineage"],
    "activedb.atomic._lineage": ["BatchRef"],
})

if TYPE_CHECKING:  # the names above, for type checkers (tests/test_typing.py keeps both lists equal)
    from activedb.atomic._batches import Batches as Batches, SplitFailure as SplitFailure
    from activedb.atomic._compensate import (
        CompensationMode as CompensationMode, CompensationPlan as CompensationPlan,
        CompensationReport as CompensationReport, CompensationScope as CompensationScope, Unsafe as Unsafe)
    from activedb.atomic._graph import (
        BoundReached as BoundReached, IndependentScover as IndependentScover, TransactionLineage as TransactionLineage)
    from activedb.atomic._lineage import BatchRef as BatchRef
