"""The detached family: rules that run as new top-level transactions, and their dependencies.

* **detached** — a new top-level transaction, no dependency;
* **detached causally dependent** — AD + CD on the trigger: commits only after, and only if, the
  trigger committed;
* **sequential causally dependent** — begins only after the trigger committed;
* **exclusive causally dependent** — commits only if the trigger aborted (a contingency).

The *trigger* is the transaction the event occurred in, and its outcome is its **effective** one
(:class:`~activedb.rules._context.TrackedTrigger`): committed only when it and every ancestor committed,
aborted as soon as it or an ancestor aborted.  The ``coupling.DependencyGate`` enforces the
dependencies while dependents run in parallel with their trigger.

**Waiting without invisible deadlocks.**  A dependent waiting in the gate for its trigger waits for the
trigger's whole tree (its top-level transaction).  The wait is an edge of the lock manager's one wait-for
graph (``TransactionManager.waiting`` → ``LockManager.add_wait``), and the dependent's own holds become
retains first, so a trigger that waits for a row the dependent keeps closes a cycle the lock manager finds
at once.  The dependent volunteers as the victim: its gate wait raises ``Deadlock``, it aborts (releasing
its locks, so the trigger goes on) and is re-run once the trigger has ended, if its dependency still
allows it.  No polling.

Thread-safety: ``_mutex`` protects ``_tracked`` and ``_running``; the gate's mutex is a leaf.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from coupling import Coupling, CouplingError, DependencyGate, Verdict
from lockmgr import Deadlock, TxnState

from activedb.errors import RuleFailed
from activedb.rules._context import GateKey, GateRole, RuleContext, TrackedTrigger

if TYPE_CHECKING:  # pragma: no cover
    from activedb.rules._manager import RuleManager
    from activedb.rules._model import Firing
    from activedb.txn import Transaction, TransactionManager

logger = logging.getLogger("activedb.rules")


class DependencyAbort(Exception):
    """The dependency gate said ABORT/CANCEL: not a rule failure."""


class DetachedRunner:
    """Starts detached-family firings on the worker pool and keeps the gate informed.  Thread-safe."""

    def __init__(self, rules: "RuleManager", transactions: "TransactionManager"):
        self.rules = rules
        self.transactions = transactions
        self.gate = DependencyGate()
        self._mutex = threading.Lock()
        # root id -> the tracked triggers of that tree (reported committed when the root commits)
        self._tracked: dict[str, list[TrackedTrigger]] = {}
        self._running = 0                                 # detached rule tasks not yet ended
        self._done = threading.Condition(self._mutex)

    @property
    def running(self) -> int:
        return self._running

    def wait_idle(self, timeout: float | None = 30.0) -> None:
        with self._done:
            if not self._done.wait_for(lambda: self._running == 0, timeout):
                raise TimeoutError(f"{self._running} detached rule transaction(s) still running after {timeout} s")

    # --- starting ------------------------------------------------------------------------------

    def start(self, trigger: "Transaction", firing: "Firing", *, ended: bool) -> None:
        key = GateKey(GateRole.FIRING, firing.number)
        tracked = None
        if firing.coupling is not Coupling.DETACHED:
            tracked = self._track(trigger, ended)
            self.gate.register(key, tracked.key, firing.coupling)

        def run() -> None:
            try:
                self._run(firing, key, tracked)
            finally:
                with self._mutex:
                    self._running -= 1
                    self._done.notify_all()

        with self._mutex:
            self._running += 1
        try:
            self.transactions.pool.submit(run)
        except BaseException:
            with self._mutex:
                self._running -= 1
                self._done.notify_all()
            raise

    def _track(self, trigger: "Transaction", ended: bool) -> TrackedTrigger:
        """The effective-outcome record of ``trigger`` (one per transaction, kept in its RuleContext)."""
        context = trigger.slot(RuleContext)
        with self._mutex:
            tracked = context.tracked
            if tracked is not None:
                return tracked
            tracked = context.tracked = TrackedTrigger(key=GateKey(GateRole.TRIGGER, trigger.id),
                                                       transaction_id=trigger.id, root_id=trigger.root.id)
            if not ended:
                self._tracked.setdefault(trigger.root.id, []).append(tracked)
        if ended:   # transaction events: the outcome is known already
            tracked.committed = trigger.state is TxnState.COMMITTED
            tracked.ended.set()
            self.gate.trigger_ended(tracked.key, tracked.committed)
        return tracked

    # --- hearing of ends ---------------------------------------------------------------------------

    def transaction_ended(self, transaction: "Transaction", committed: bool) -> None:
        context = transaction.slot(RuleContext, create=False)
        if not committed:
            self._report_aborted_subtree(transaction)
        elif transaction.is_top_level:
            with self._mutex:
                tracked = self._tracked.pop(transaction.id, [])
            self._report(tracked, committed=True)
        elif context is not None and (context.tracked is not None or context.inherited):
            # A committed subtransaction leaves its parent's children: hand its tracked triggers up.
            handed = ([context.tracked] if context.tracked is not None else []) + (context.inherited or [])
            parent_context = transaction.parent.slot(RuleContext)
            with self._mutex:
                parent_context.inherited = (parent_context.inherited or []) + handed
        if context is not None and context.gate_report is not None:
            self._report_end(context.gate_report, committed)

    def _report_aborted_subtree(self, transaction: "Transaction") -> None:
        """``transaction`` aborted: it and its descendants will never commit effectively."""
        subtree, stack = [], [transaction]
        while stack:                        # outside self._mutex: children takes each node's mutex
            node = stack.pop()
            subtree.append(node)
            stack.extend(node.children)
        candidates = []
        for node in subtree:
            context = node.slot(RuleContext, create=False)
            if context is not None:
                if context.tracked is not None:
                    candidates.append(context.tracked)
                candidates.extend(context.inherited or ())
        self._report(candidates)
        if transaction.is_top_level:
            with self._mutex:
                self._tracked.pop(transaction.id, None)

    def _report(self, candidates, committed: bool = False) -> None:
        with self._mutex:
            pending = [tracked for tracked in candidates if not tracked.ended.is_set()]
            for tracked in pending:
                tracked.committed = committed
                tracked.ended.set()
        for tracked in pending:
            self.gate.trigger_ended(tracked.key, committed)
            self.gate.forget(tracked.key)

    def _report_end(self, key: GateKey, committed: bool) -> None:
        try:
            self.gate.trigger_ended(key, committed)
        except CouplingError as error:   # e.g. committed without a grant: report, never crash the pool
            logger.error("dependency gate: %s", error)

    # --- waiting in the gate ---------------------------------------------------------------------

    def wait_may_commit(self, transaction: "Transaction", context: RuleContext) -> Verdict:
        """Ask the gate whether ``transaction`` (a dependent) may commit, as an edge of the wait-for graph
        to what it waits for; raises ``Deadlock`` if it is the victim of a cycle through that wait."""
        key = context.gate_key
        gate = self.gate
        with self.transactions.waiting(transaction, "dependency", context.gate_wait_target,
                                       on_victim=lambda error: gate.interrupt(key, error), preferred_victim=True):
            return gate.wait_may_commit(key)

    # --- running a firing --------------------------------------------------------------------------

    def _prepare(self, firing: "Firing", key: GateKey | None, tracked: TrackedTrigger | None):
        def prepare(transaction: "Transaction") -> None:
            context = transaction.slot(RuleContext)
            context.firing = firing
            if key is not None:
                context.gate_key = context.gate_report = key
                context.gate_wait_target = tracked.root_id
        return prepare

    def _run(self, firing: "Firing", key: GateKey, tracked: TrackedTrigger | None) -> None:
        rules = self.rules
        rule = firing.rule
        gated = tracked is not None
        try:
            if gated and self.gate.wait_may_begin(key) is not Verdict.BEGIN:
                rules.count(rule, "cancelled")
                self._report_end(key, False)
                return
            executed = False
            with self.transactions.transaction(name=f"rule:{rule.name}",
                                               prepare=self._prepare(firing, key if gated else None, tracked)
                                               ) as transaction:
                executed = rules.execute(transaction, firing)
            if executed:
                rules.count(rule, "executed")
        except DependencyAbort:
            rules.count(rule, "cancelled")
        except Deadlock:
            # It gave way to its trigger (a cycle through its gate wait): run it again once the trigger ended.
            rules.count(rule, "rerun_after_wait")
            self._rerun_after_trigger(firing, tracked)
        except RuleFailed:
            pass   # counted and logged by execute; never touches the trigger
        except Exception as error:
            rules.count(rule, "failed")
            logger.error("detached rule %r failed on %s: %r", rule.name, firing.event.describe(), error)

    def _rerun_after_trigger(self, firing: "Firing", tracked: TrackedTrigger | None) -> None:
        rules = self.rules
        if tracked is not None:
            tracked.ended.wait()
            allowed = {
                Coupling.DETACHED_CAUSALLY_DEPENDENT: tracked.committed,
                Coupling.SEQUENTIAL_CAUSALLY_DEPENDENT: tracked.committed,
                Coupling.EXCLUSIVE_CAUSALLY_DEPENDENT: not tracked.committed,
            }.get(firing.coupling, True)
            if not allowed:
                rules.count(firing.rule, "cancelled")
                return
        try:
            with self.transactions.transaction(name=f"rule:{firing.rule.name}",
                                               prepare=self._prepare(firing, None, None)) as transaction:
                executed = rules.execute(transaction, firing)
            if executed:
                rules.count(firing.rule, "executed")
        except RuleFailed:
            pass
