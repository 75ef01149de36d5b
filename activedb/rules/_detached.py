"""The detached family: rules that run as transactions of their own, after their trigger's (effective)
outcome.  This runner does not run firings: it hands each to the attached recorder (the ``Database``'s
outbox), which records it with the outcome that allows it and runs it once that outcome is durable
(``README.md``, "Coupling modes").  What stays here: the gate waits of C-A sequential causally dependent
actions, as edges of the one wait-for graph, and the reports of their ends.

Thread-safety: the recorder is attached once, before the first firing; everything else is stateless or
the gate's (whose mutex is a leaf).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Collection
from typing import TYPE_CHECKING, Protocol

from coupling import CouplingError, DependencyGate, Verdict

from activedb.errors import RuleError
from activedb.rules._context import GateKey, RuleContext
from activedb.txn import WaitKind, slot

if TYPE_CHECKING:  # pragma: no cover
    from activedb.rules._manager import RuleManager
    from activedb.rules._model import Firing
    from activedb.txn import Transaction, TransactionManager

logger = logging.getLogger("activedb.rules")


class DependencyAbort(Exception):
    """The dependency gate said ABORT/CANCEL: not a rule failure."""


class RecordFiring(Protocol):
    """``FiringRecorder.record``'s signature: what ``DetachedRunner.start`` is."""

    def __call__(self, trigger: "Transaction", firing: "Firing", *, ended: bool) -> None: ...


class FiringRecorder(Protocol):
    """Where detached-family firings go (the outbox)."""

    def record(self, trigger: "Transaction", firing: "Firing", *, ended: bool) -> None:
        """``firing`` occurred in ``trigger`` (``ended``: a top-level transaction's own end event — its abort maybe
        one that hides a commit, ``lowlevel.outcome_unknown(trigger)``: the recorder then decides it by the tree's
        transaction-log row, not by the abort)."""

    def wait_idle(self, timeout: float | None) -> None:
        """Wait until every firing handed over so far has run."""

    def rules_changed(self) -> None:
        """A rule was registered or removed."""

    @property
    def running(self) -> int:
        """Firings handed over and not yet run."""

    def decided(self, transaction: "Transaction") -> "DecidedFirings":
        """Where firings whose triggers' outcomes are already decided go (a batch run at commit), enlisted on
        ``transaction`` now (moving to its root's commit with the participants enlisted before it, in their order):
        after those, whose ``write`` and ``aborted`` may add to it."""

    @property
    def inserts_in_commit(self) -> bool:
        """Whether a batch run at commit may run, in its own commit, the firings whose actions only insert rows
        (``activedb.batch``: "Detached firings that only insert") instead of handing them to :meth:`decided`."""


class DecidedFirings(Protocol):
    """What ``FiringRecorder.decided`` returns."""

    def set_decided(self, items: list[tuple["Firing", str, bool]],
                    ran: Collection[tuple["Firing", str, bool]] = ()) -> None:
        """``(firing, trigger id, committed)``: each firing occurred on an event whose transaction committed (or not),
        recorded if its mode allows that outcome, in the commit of the root it was made for; they replace those set
        before (a retried flush sets its own).  ``ran``: those of ``items`` the caller ran in that commit itself —
        not recorded if the root commits, handled as the others if it aborts."""


class DetachedRunner:
    """Hands detached-family firings to the attached recorder; runs the C-A gate waits.  Thread-safe."""

    def __init__(self, rules: "RuleManager", transactions: "TransactionManager"):
        self.rules = rules
        self.transactions = transactions
        self.gate = DependencyGate()
        self.recorder: FiringRecorder | None = None
        self._kept_recorded: frozenset[str] = frozenset()
        self._kept_mutex = threading.Lock()      # (a leaf)
        #: ``start(trigger, firing, *, ended=...)``: ``firing`` (detached family) occurred in ``trigger`` — the
        #: attached recorder's ``record`` itself (no call of this runner's between the dispatch and the recorder).
        self.start: RecordFiring = self._no_recorder

    def attach(self, recorder: FiringRecorder) -> None:
        """Send every detached-family firing to ``recorder`` from now on."""
        self.recorder = recorder
        self.start = recorder.record

    @staticmethod
    def _no_recorder(trigger: "Transaction", firing: "Firing", *, ended: bool) -> None:
        raise RuleError("detached-family rules need a recorder (the Database attaches its outbox); this "
                        "RuleManager has none — create it through activedb.connect()")

    @property
    def running(self) -> int:
        return self.recorder.running if self.recorder is not None else 0

    def decided(self, transaction: "Transaction") -> DecidedFirings:
        """The attached recorder's ``decided(transaction)`` (``FiringRecorder.decided``)."""
        if self.recorder is None:
            self._no_recorder(transaction, None, ended=False)  # type: ignore[arg-type]  # (raises)
        assert self.recorder is not None
        return self.recorder.decided(transaction)

    @property
    def inserts_in_commit(self) -> bool:
        """The attached recorder's ``inserts_in_commit`` (False without one)."""
        return self.recorder is not None and self.recorder.inserts_in_commit

    @property
    def kept_recorded(self) -> frozenset[str]:
        """The rules whose firings are recorded and run in transactions of their own even where a lowered batch would
        run them in its commit (:meth:`keep_recorded`)."""
        return self._kept_recorded

    def keep_recorded(self, rule: str) -> None:
        """Record every firing of rule ``rule`` and run it in a transaction of its own (``rule:<name>``), also where a
        lowered batch would run it in its commit: a compensation undoes that transaction whole (one that names it, or
        the rule's compensation of each firing noted in it)."""
        with self._kept_mutex:      # (a new frozenset each time: readers need no lock)
            self._kept_recorded = self._kept_recorded | {rule}

    def wait_idle(self, timeout: float | None = 30.0) -> None:
        if self.recorder is not None:
            self.recorder.wait_idle(timeout)

    def rules_changed(self) -> None:
        if self.recorder is not None:
            self.recorder.rules_changed()

    # --- hearing of ends (C-A coupling) ----------------------------------------------------------

    def transaction_ended(self, transaction: "Transaction", committed: bool) -> None:
        context = slot(transaction, RuleContext, create=False)
        if context is not None and context.gate_report is not None:
            self._report_end(context.gate_report, committed)

    def _report_end(self, key: GateKey, committed: bool) -> None:
        try:
            self.gate.trigger_ended(key, committed)
        except CouplingError as error:   # e.g. committed without a grant: report, never crash the pool
            logger.error("dependency gate: %s", error)
        # Each key is one firing's condition or action, registered before either ran: no dependency on it comes
        # later, so the gate may drop its outcome once nothing registered refers to it (a condition's: when its
        # action has ended too).
        self.gate.forget(key)

    # --- waiting in the gate ---------------------------------------------------------------------

    def wait_may_commit(self, transaction: "Transaction", context: RuleContext) -> Verdict:
        """Ask the gate whether ``transaction`` (a dependent: a C-A action) may commit, as an edge of the
        wait-for graph to what it waits for; raises ``DeadlockDetected`` if it is the victim of a cycle through that
        wait."""
        key = context.gate_key
        gate = self.gate
        def interrupt(error: BaseException) -> None:
            gate.interrupt(key, error)

        with self.transactions.waiting(transaction, WaitKind.DEPENDENCY, context.gate_wait_target,
                                       on_victim=interrupt, preferred_victim=True):
            return gate.wait_may_commit(key)
