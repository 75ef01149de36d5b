"""The rule manager's per-transaction state, kept in the transaction's typed slot
(``tx.slot(RuleContext)``) instead of attributes on the transaction, and the typed keys of the
coupling gate.  Owned by the rules package; nobody else reads it."""

from __future__ import annotations

import enum
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from coupling import DeferredQueue

    from activedb.rules._model import Firing


class GateRole(enum.Enum):
    """What a key of the coupling gate stands for."""

    FIRING = "firing"         # a detached-family rule firing (the dependent)
    TRIGGER = "trigger"       # a transaction whose effective outcome dependents wait for
    CONDITION = "condition"   # the condition subtransaction of a C-A sequential firing
    ACTION = "action"         # its action subtransaction (the dependent)


@dataclass(frozen=True)
class GateKey:
    """A typed key of the coupling gate: a role and the firing number or transaction id it stands for."""

    role: GateRole
    ident: object

    def __str__(self) -> str:
        return f"{self.role.value}:{self.ident}"


@dataclass(eq=False)
class TrackedTrigger:
    """The effective outcome of a transaction some detached-family rule depends on: committed only
    when it and every ancestor committed (the top-level commit made it durable); aborted as soon as it
    or an ancestor aborted.  ``root_id`` is the tree's top-level transaction (what dependents wait for)."""

    key: GateKey
    transaction_id: str
    root_id: str
    ended: threading.Event = field(default_factory=threading.Event)
    committed: bool | None = None


@dataclass(eq=False, slots=True)
class RuleContext:
    """The rules' state of one transaction (created on first use by ``tx.slot(RuleContext)``).

    * ``firing``: the rule firing this transaction executes (None for application transactions);
    * ``deferred_queue``: deferred firings waiting for this transaction's commit (if it owns a queue);
    * ``tracked``: its effective-outcome record, once a causally dependent rule depends on it;
    * ``gate_key``: the gate key it must ask ``wait_may_commit`` for before committing (a dependent);
    * ``gate_wait_target``: the transaction id that gate wait waits for (an edge of the wait-for graph);
    * ``gate_report``: the gate key whose end this transaction reports (``trigger_ended``);
    * ``firings``: per rule, the firings dispatched in this tree (kept on the top-level transaction);
    * ``inherited``: the tracked triggers of committed descendants (a committed subtransaction hands its
      own and its inherited ones to its parent: an ancestor's abort must still report them aborted).
    """

    firing: "Firing | None" = None
    deferred_queue: "DeferredQueue | None" = None
    tracked: TrackedTrigger | None = None
    gate_key: GateKey | None = None
    gate_wait_target: str | None = None
    gate_report: GateKey | None = None
    firings: dict[str, int] = field(default_factory=dict)
    inherited: list[TrackedTrigger] | None = None
