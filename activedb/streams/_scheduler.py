"""Schedulers: how the s-transactions of a micro-batch run.

The engine hands a scheduler a :class:`~activedb.streams._batch.BatchRun`: the batch's
top-level transaction ``tx`` and its s-transactions in the declared total order (each
with its event, the queries consuming it and its access plan — the tables and keys it
may read and write, computed from the definitions by Algorithm 1 of Active CEP).  A
scheduler decides when and on which thread each runs; the engine does the rest
(matching, stamped store access, rules, dead letters, statistics) through:

* ``batch.execute(st, parent=None)`` — the whole s-transaction ``st`` as one
  subtransaction of ``parent`` (default ``batch.tx``): every query consuming the event,
  then every rule fired by their outputs (in-line extension, Def. 7);
* ``batch.execute_unit(st, rank, tx)`` — only the query of rank ``rank`` and the rules on
  its outputs, in the caller's (sub)transaction ``tx``: no s-transaction boundary
  (the unscheduled mode).

Schedulers in this package:

* :class:`SEIScheduler` (Active CEP §5.1) — one s-transaction at a time, in order, each to
  its end before the next starts.  Trivially correct (Def. 6) for ordered input, which
  the reorder buffer provides.  The reference concurrent schedulers are checked against.
* :class:`UnscheduledScheduler` — **for tests**: Active CEP §2's push-based execution.
  Every query is an operator with its own input queue; operators run concurrently on
  worker threads, each taking its events in arrival order and running the rules on its
  outputs at once — no s-transactions, no synchronisation between queries.  The
  ``before_step(query, event)`` / ``after_step(query, event)`` hooks let a test put the
  operators' steps in a chosen order; the Definition 6 checker then finds the
  read-too-late and write-too-late anomalies of Examples 2 and 3.

The schedulers that lock ahead — S2PL and LWM, :mod:`activedb.streams._concurrent` —
read every ``st.plan`` when the batch arrives (before any s-transaction runs), run each
s-transaction with ``batch.execute_in`` in a subtransaction spawned on a worker thread
(``batch.finish`` once it ended), give the engine their store view
(``BatchRun.view_factory``: locks first; LWM reads versions) and say on which matcher
state each s-transaction is matched (``BatchRun.state_source``).
"""

from __future__ import annotations

import abc
import collections
import queue
from typing import TYPE_CHECKING, Any, Callable

from activedb.streams.errors import StreamError

if TYPE_CHECKING:  # pragma: no cover
    from activedb.streams._batch import BatchRun


class Scheduler(abc.ABC):
    """Base class of schedulers.  One instance serves one engine; ``run`` is called with
    one batch at a time (the engine serialises batches)."""

    name: str = "scheduler"

    @abc.abstractmethod
    def run(self, batch: BatchRun) -> None:
        """Run every s-transaction of ``batch.stransactions``.  Precondition: called in the
        thread that owns ``batch.tx``.  Returns when all of them have ended."""

    def describe(self) -> str:
        return self.name


class SEIScheduler(Scheduler):
    """Single-Event-Initiated (Active CEP §5.1): one s-transaction at a time, in order."""

    name = "sei"

    def run(self, batch: BatchRun) -> None:
        for stransaction in batch.stransactions:
            batch.execute(stransaction)


StepHook = Callable[[str, Any], None]


class UnscheduledScheduler(Scheduler):
    """Push-based evaluation without s-transactions (for tests; see the module docstring).

    ``before_step(query, event)`` runs on the operator's thread before the query
    evaluates the event (it may block, e.g. on a test's sequencer); ``after_step`` runs in
    the dispatching thread once that evaluation and its rules have committed.
    """

    name = "unscheduled"

    def __init__(self, before_step: StepHook | None = None, after_step: StepHook | None = None):
        self.before_step = before_step
        self.after_step = after_step

    def run(self, batch: BatchRun) -> None:
        queues: dict[str, collections.deque] = {}
        for stransaction in batch.stransactions:
            for rank, matcher in stransaction.matchers:
                queues.setdefault(matcher.query.name, collections.deque()).append((stransaction, rank))
        finished: queue.Queue = queue.Queue()
        running: dict[str, tuple[Any, Any]] = {}
        tx = batch.tx
        errors: list[BaseException] = []

        def start(query_name: str) -> None:
            stransaction, rank = queues[query_name].popleft()

            def operator_step(child) -> None:
                try:
                    if self.before_step is not None:
                        self.before_step(query_name, stransaction.event)
                    batch.execute_unit(stransaction, rank, child)
                finally:
                    finished.put(query_name)
            handle = tx.spawn(operator_step, name=f"{query_name} evaluates {stransaction.event.describe()}")
            running[query_name] = (handle, stransaction)

        for query_name in queues:
            if queues[query_name]:
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


def make_scheduler(scheduler: str | Scheduler) -> Scheduler:
    if isinstance(scheduler, Scheduler):
        return scheduler
    if scheduler == "sei":
        return SEIScheduler()
    if scheduler == "unscheduled":
        return UnscheduledScheduler()
    if scheduler in ("s2pl", "lwm"):
        from activedb.streams._concurrent import LWMScheduler, S2PLScheduler

        return S2PLScheduler() if scheduler == "s2pl" else LWMScheduler()
    raise StreamError(f"unknown scheduler {scheduler!r}: use 'sei', 's2pl' or 'lwm' (or 'unscheduled' in tests), "
                      f"or pass a Scheduler instance")
