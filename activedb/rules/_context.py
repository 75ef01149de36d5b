"""The rule manager's per-transaction state, kept in the transaction's typed slot
(``slot(tx, RuleContext)``) instead of attributes on the transaction, and the typed keys of the
coupling gate, and the two walks up a tree that read it (the cascade chain, the deferred queue).  Owned by
the rules package; nobody else reads it."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING

from coupling import DeferredQueue, has_own_deferred_queue

from activedb.rules._model import Firing
from activedb.txn import slot, want_end_hooks

if TYPE_CHECKING:  # pragma: no cover
    from coupling import Coupling

    from activedb.txn import Transaction


class GateRole(enum.Enum):
    """What a key of the coupling gate stands for."""

    CONDITION = "condition"   # the condition subtransaction of a C-A sequential firing
    ACTION = "action"         # its action subtransaction (the dependent)


@dataclass(frozen=True)
class GateKey:
    """A typed key of the coupling gate: a role and the firing number or transaction id it stands for."""

    role: GateRole
    ident: object

    def __str__(self) -> str:
        return f"{self.role.value}:{self.ident}"


class RuleContext:
    """The rules' state of one transaction (created on first use by ``slot(tx, RuleContext)``).  The firing a
    transaction executes is its other slot, ``slot(tx, Firing)`` (none for application transactions): the
    dispatch gives a firing's transaction its ``Firing`` as it begins (``run_inline``'s ``kind``), so a firing
    that raises no event and queues no deferred firing makes no ``RuleContext``.

    * ``deferred_queue``: deferred firings waiting for this transaction's commit (if it owns a queue);
    * ``gate_key``: the gate key it must ask ``wait_may_commit`` for before committing (a dependent);
    * ``gate_wait_target``: the transaction id that gate wait waits for (an edge of the wait-for graph);
    * ``gate_report``: the gate key whose end this transaction reports (``trigger_ended``);
    * ``firings``: per rule, the firings dispatched in this tree (kept on the top-level transaction, None
      until the first; also the tree's firing record, added to the manager's counters when the tree ends);
    * ``couplings``: the coupling of each rule of ``firings`` (for the per-mode counters);
    * ``executed``: per rule, the firings run as children of this transaction (and of its committed descendants)
      whose action ran and whose subtransaction committed (None until the first): passed on to the parent when this
      transaction commits, counted ``cancelled`` when it aborts (``FiringRecord.passed_on``); the top-level
      transaction's are added to the manager's ``executed`` counters if the tree commits, to ``cancelled`` if it
      aborts (an attempt re-run after a conflict counts none executed);
    * ``held_deferred``: deferred firings raised in this transaction, a C-A action of a deferred firing (which owns no
      queue, and aborts on its own when its condition says so), held until it commits (:func:`defer`).

    A plain class whose fields default to the class's None (one is created per rule firing: it must cost
    little, and ``RuleContext()`` runs no Python code).
    """

    deferred_queue: "DeferredQueue[Firing] | None" = None
    gate_key: GateKey | None = None
    gate_wait_target: str | None = None
    gate_report: GateKey | None = None
    firings: dict[str, int] | None = None
    couplings: dict[str, "Coupling"] | None = None
    executed: dict[str, int] | None = None
    held_deferred: "list[Firing] | None" = None


def chain_of(transaction: "Transaction") -> tuple[str, ...]:
    """The cascade of rule names that led to ``transaction``: its nearest firing's chain (() if none)."""
    node: Transaction | None = transaction
    while node is not None:
        firing = slot(node, Firing, create=False)
        if firing is not None:
            return firing.chain
        node = node.parent
    return ()


def deferred_queue_for(transaction: "Transaction", max_cycles: int) -> DeferredQueue[Firing]:
    """The deferred queue a firing in ``transaction`` joins (``coupling.has_own_deferred_queue``):
    top-level, immediate-rule, detached-rule and application subtransactions own one; a deferred
    rule's transaction (and its condition/action children) hands its deferred firings to the queue
    it was itself fired from, where they form the next cycle."""
    node: Transaction | None = transaction
    while node is not None:
        firing = slot(node, Firing, create=False)
        if has_own_deferred_queue(firing.coupling if firing is not None else None):
            context = slot(node, RuleContext)
            if context.deferred_queue is None:
                want_end_hooks(node)    # a frame stays one: its before_commit runs the queue
                context.deferred_queue = DeferredQueue(max_cycles=max_cycles, name=node.id)
                if firing is not None:
                    firing.deferring = True     # (a firing's own queue: run before its outcome is told)
            return context.deferred_queue
        node = node.parent
    raise AssertionError("a top-level transaction always owns a deferred queue")


def defer(transaction: "Transaction", firing: Firing, max_cycles: int) -> None:
    """Queue deferred ``firing``, raised in ``transaction``, where it runs: the queue of :func:`deferred_queue_for` —
    unless a C-A sequential causally dependent action (a dependent of the gate: ``gate_key``) that owns no queue lies on
    the way there.  Such an action aborts on its own when its condition returns false (or it gave way in a deadlock
    and runs again), its events undone with it: the firing is held on it (``held_deferred``) and queued when it
    commits (``RuleManager.after_end``), dropped if it aborts."""
    node: Transaction | None = transaction
    while node is not None:
        own = slot(node, Firing, create=False)
        if has_own_deferred_queue(own.coupling if own is not None else None):
            break
        context = slot(node, RuleContext, create=False)
        if context is not None and context.gate_key is not None:
            if context.held_deferred is None:
                context.held_deferred = []
            context.held_deferred.append(firing)
            return
        node = node.parent
    deferred_queue_for(transaction, max_cycles).add(firing)
