"""Atomic batches (Vidyasankar, *On Atomic Batch Executions in Stream Processing*): lineage, the paper's
scover and independent scover, and compensation of a source batch, exactly once.

Public interface: ``db.batches`` (:class:`Batches`) — ``consumed / produced / triggered_by / note``,
``compensation / rule_compensation / transaction_compensation / undo_by_before_image``, ``composite /
scover / independent_scover / graph``, ``plan / compensate``, ``prune``; the CLI ``activedb batches``; a split
source batch one partition of which fails for good (``declare_policy``, ``settle_failed_partition`` and
``failed_partition`` in the failed task, ``combined_outcome``, ``settle``, ``unsettled_batches``,
``after_replay``, ``split_status``, ``declared_layout`` (a run's partitions, key and salt), ``choose_salt`` and ``murmur3_int`` (the salt a run's
split records), ``check_layout`` of a
batch run again: what a connector that splits batches —
Spark's scale-out path — calls).
Design note: ``README.md`` here.  (``activedb.batch``, singular, is the unrelated TPG executor.)
"""

from typing import TYPE_CHECKING

from activedb.atomic import errors
from activedb import lazy

__all__ = ["SALTS", "Batches", "BatchRef", "BoundReached", "CompensationPlan", "CompensationReport", "IndependentScover",
           "CompensationMode", "CompensationScope", "LayoutTerms", "PartitionReport", "SplitBatchStatus", "SplitFailure",
           "SplitState", "TransactionLineage", "Unsafe", "after_replay", "as_policy", "check_layout", "choose_salt",
           "combined_outcome", "compensate_split", "declare_policy", "declared_layout", "errors", "failed_partition", "murmur3_int",
           "settle", "settle_failed_partition", "split_status", "unsettled_batches"]

# imported on first use: `import activedb.atomic` stays fast (the CLI's start)
__getattr__, __dir__ = lazy.exports(__name__, {
    "activedb.atomic._batches": ["Batches", "SplitFailure"],
    "activedb.atomic._compensate": ["CompensationMode", "CompensationPlan", "CompensationReport", "CompensationScope", "Unsafe"],
    "activedb.atomic._graph": ["BoundReached", "IndependentScover", "TransactionLineage"],
    "activedb.atomic._lineage": ["BatchRef"],
    "activedb.atomic._split": ["SALTS", "LayoutTerms", "PartitionReport", "SplitBatchStatus", "SplitState", "after_replay", "as_policy",
                               "check_layout", "choose_salt", "combined_outcome", "compensate_split",
                               "declare_policy", "declared_layout", "failed_partition", "murmur3_int", "settle", "settle_failed_partition", "split_status",
                               "unsettled_batches"],
})

if TYPE_CHECKING:  # the names above, for type checkers (tests/test_typing.py keeps both lists equal)
    from activedb.atomic._batches import Batches as Batches, SplitFailure as SplitFailure
    from activedb.atomic._compensate import (
        CompensationMode as CompensationMode, CompensationPlan as CompensationPlan,
        CompensationReport as CompensationReport, CompensationScope as CompensationScope, Unsafe as Unsafe)
    from activedb.atomic._graph import (
        BoundReached as BoundReached, IndependentScover as IndependentScover, TransactionLineage as TransactionLineage)
    from activedb.atomic._lineage import BatchRef as BatchRef
    from activedb.atomic._split import (
        SALTS as SALTS, LayoutTerms as LayoutTerms, PartitionReport as PartitionReport, SplitBatchStatus as SplitBatchStatus,
        SplitState as SplitState, after_replay as after_replay, as_policy as as_policy, check_layout as check_layout,
        choose_salt as choose_salt, murmur3_int as murmur3_int, combined_outcome as combined_outcome, failed_partition as failed_partition,
        compensate_split as compensate_split, declare_policy as declare_policy, declared_layout as declared_layout,
        settle as settle, settle_failed_partition as settle_failed_partition, split_status as split_status,
        unsettled_batches as unsettled_batches)
