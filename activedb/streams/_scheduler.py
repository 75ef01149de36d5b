"""Schedulers: how the s-transactions of a micro-batch run (the design note
``activedb/streams/README.md``, "Schedulers"): the interface, :class:`SEIScheduler` (Active CEP
§5.1, the reference) and :class:`UnscheduledScheduler` (tests); S2PL and LWM are in ``_concurrent.py``.
"""

from __future__ import annotations

import abc
import collections
import logging
import queue
from typing import TYPE_CHECKING, Any, Callable

from activedb._closedset import ClosedSet
from activedb.errors import InvalidChoice
from activedb.streams.errors import StreamError

if TYPE_CHECKING:  # pragma: no cover
    from activedb.streams._batch import BatchRun, STransaction
    from activedb.txn import SubtransactionHandle, Transaction


logger = logging.getLogger("activedb.streams")


class Scheduler(abc.ABC):
    """Base class of schedulers.  One instance serves one engine; ``run`` is called with
    one batch at a time (the engine serialises batches)."""

    name: str = "scheduler"
    #: True if ``run`` runs every s-transaction of a batch in the calling thread, one after the other, in their
    #: order (the batch then keeps its figures and state without a mutex); False (the default) for any other.
    one_thread: bool = False

    @abc.abstractmethod
    def run(self, batch: BatchRun) -> None:
        """Run every s-transaction of ``batch.stransactions``.  Precondition: called in the
        thread that owns ``batch.tx``.  Returns when all of them have ended."""


class SEIScheduler(Scheduler):
    """Single-Event-Initiated (Active CEP §5.1): one s-transaction at a time, in order."""

    name = "sei"
    one_thread = True

    def run(self, batch: BatchRun) -> None:
        overlay = batch.overlay()
        if overlay is None:
            for stransaction in batch.stransactions:
                batch.execute(stransaction)
            return
        # On the overlay (the design note's "SEI without a subtransaction per event"); an s-transaction it cannot
        # take runs in its own subtransaction once the overlay's changes are in the tree.
        try:
            for stransaction in batch.stransactions:
                if overlay.takes(stransaction):
                    batch.execute_on(stransaction, overlay)
                else:
                    overlay.write_back()
                    batch.execute(stransaction)
        except BaseException:
            # The batch cannot go on (the failing s-transaction's changes are undone): the tree gets what the
            # committed ones did, as their subtransactions would have left it.  A write-back that fails too adds
            # nothing to the error the caller sees.
            try:
                overlay.write_back()
            except Exception:
                logger.warning("the overlay's write-back after a failed batch failed too (the batch's own error "
                               "follows; abort its transaction)", exc_info=True)
            raise
        overlay.write_back()


StepHook = Callable[[str, Any], None]


class UnscheduledScheduler(Scheduler):
    """**For tests**: Active CEP §2's push-based execution.  Every query is an operator with
    its own input queue; operators run concurrently on worker threads, each taking its events
    in arrival order and running the rules on its outputs at once — no s-transactions, no
    synchronisation between queries (``batch.execute_unit``), so the Definition 6 checker finds
    the read-too-late and write-too-late anomalies of Examples 2 and 3.

    ``before_step(query, event)`` runs on the operator's thread before the query
    evaluates the event (it may block, e.g. on a test's sequencer); ``after_step`` runs in
    the dispatching thread once that evaluation and its rules have committed.
    """

    name = "unscheduled"

    def __init__(self, before_step: StepHook | None = None, after_step: StepHook | None = None):
        self.before_step = before_step
        self.after_step = after_step

    def run(self, batch: BatchRun) -> None:
        queues: dict[str, collections.deque[tuple[STransaction, int]]] = {}
        for stransaction in batch.stransactions:
            for rank, matcher in stransaction.matchers:
                queues.setdefault(matcher.query.name, collections.deque()).append((stransaction, rank))
        finished: queue.Queue[str] = queue.Queue()
        running: dict[str, tuple[SubtransactionHandle, STransaction]] = {}
        errors: list[BaseException] = []

        def start(query_name: str) -> None:
            stransaction, rank = queues[query_name].popleft()

            def operator_step(child: Transaction) -> None:
                try:
                    if self.before_step is not None:
                        self.before_step(query_name, stransaction.event)
                    batch.execute_unit(stransaction, rank, child)
                finally:
                    finished.put(query_name)
            handle = batch.tx.spawn(operator_step, name=f"{query_name} evaluates {stransaction.event.describe()}",
                                    eager=True)
            running[query_name] = (handle, stransaction)

        for query_name in queues:       # each has an event: queues are made by their first one
            start(query_name)
        while running:
            query_name = finished.get()
            handle, stransaction = running.pop(query_name)
            handle.wait()
            try:
                handle.result()
            except StreamError:
                pass                      # the engine already made the event a dead letter
            except BaseException as error:   # noqa: BLE001 - re-raised below, after the others end
                errors.append(error)
            if self.after_step is not None:
                self.after_step(query_name, stransaction.event)
            if queues[query_name] and not errors:
                start(query_name)
        if errors:
            raise errors[0]


class SchedulerKind(ClosedSet):
    """The stream-transaction schedulers a ``StreamEngine`` makes by name (``scheduler=``; a ``Scheduler``
    instance is taken as it is)."""

    SEI = "sei"                    # serial execution in event-time order (the default)
    S2PL = "s2pl"                  # strict two-phase locking, s-transactions concurrent
    LWM = "lwm"                    # low-watermark versions: readers need not wait for earlier writers
    UNSCHEDULED = "unscheduled"    # no ordering at all (tests that need the anomalies)


#: The schedulers an application names (``UNSCHEDULED`` is for tests that need the anomalies, not offered).
NAMED = tuple(kind.value for kind in SchedulerKind if kind is not SchedulerKind.UNSCHEDULED)


def make_scheduler(scheduler: SchedulerKind | Scheduler) -> Scheduler:
    if isinstance(scheduler, Scheduler):
        return scheduler
    given: object = scheduler       # (an untyped caller's class, where an instance belongs)
    if isinstance(given, type) and issubclass(given, Scheduler):
        raise StreamError(f"scheduler={given.__name__} is a Scheduler class: pass an instance, "
                          f"{given.__name__}() (with its options), or one of {', '.join(NAMED)}")
    try:
        kind = SchedulerKind(scheduler)
    except InvalidChoice as error:
        raise StreamError(f"unknown scheduler {scheduler!r}: use one of {', '.join(NAMED)} (SchedulerKind), or pass "
                          f"a Scheduler instance") from error
    if kind is SchedulerKind.SEI:
        return SEIScheduler()
    if kind is SchedulerKind.UNSCHEDULED:
        return UnscheduledScheduler()
    from activedb.streams._concurrent import LWMScheduler, S2PLScheduler

    return S2PLScheduler() if kind is SchedulerKind.S2PL else LWMScheduler()
