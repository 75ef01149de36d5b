"""The rule manager's per-transaction state, kept in the transaction's typed slot
(``tx.slot(RuleContext)``) instead of attributes on the transaction, and the typed keys of the
coupling gate.  Owned by the rules package; nobody else reads it."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from coupling import Coupling, DeferredQueue

    from activedb.rules._model import Firing


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
    """The rules' state of one transaction (created on first use by ``tx.slot(RuleContext)``).

    * ``firing``: the rule firing this transaction executes (None for application transactions);
    * ``deferred_queue``: deferred firings waiting for this transaction's commit (if it owns a queue);
    * ``gate_key``: the gate key it must ask ``wait_may_commit`` for before committing (a dependent);
    * ``gate_wait_target``: the transaction id that gate wait waits for (an edge of the wait-for graph);
    * ``gate_report``: the gate key whose end this transaction reports (``trigger_ended``);
    * ``firings``: per rule, the firings dispatched in this tree (kept on the top-level transaction, None
      until the first; also the tree's firing record, added to the manager's counters when the tree ends);
    * ``couplings``: the coupling of each rule of ``firings`` (for the per-mode counters).

    A plain class with slots (one is created per rule firing: it must cost little).
    """

    __slots__ = ("firing", "deferred_queue", "gate_key", "gate_wait_target", "gate_report", "firings",
                 "couplings")

    def __init__(self) -> None:
        self.firing: "Firing | None" = None
        self.deferred_queue: "DeferredQueue | None" = None
        self.gate_key: GateKey | None = None
        self.gate_wait_target: str | None = None
        self.gate_report: GateKey | None = None
        self.firings: dict[str, int] | None = None
        self.couplings: dict[str, "Coupling"] | None = None
