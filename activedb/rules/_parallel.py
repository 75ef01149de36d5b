"""C-A sequential causally dependent coupling: a firing's condition and action as parallel sibling
subtransactions; the action commits only if the condition committed and returned true (it waits for that in
the coupling gate, an edge of the wait-for graph, README "Waiting for a condition without invisible
deadlocks").  A condition that raises fails the firing exactly as with immediate C-A coupling, with its own error
also when the action raised too; a condition that returns false makes the firing condition_false also when the
action raised (its error is logged at DEBUG: it could not have committed)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from coupling import Coupling

from activedb.errors import DeadlockDetected, shown_error
from activedb.rules._context import GateKey, GateRole, RuleContext
from activedb.rules._detached import DependencyAbort
from activedb.rules._model import Firing, check_body_ran
from activedb.txn import TxnState, run_subtransaction, set_slot, slot

if TYPE_CHECKING:  # pragma: no cover
    from activedb.events import Event
    from activedb.rules._manager import RuleManager
    from activedb.rules._model import Rule
    from activedb.txn import Transaction

logger = logging.getLogger("activedb.rules")


def condition_then_action(manager: "RuleManager", transaction: "Transaction", firing: "Firing") -> bool:
    """Run ``firing`` with its condition and action in parallel, as children of ``transaction``; True if
    the condition held (the action then ran)."""
    rule, event = firing.rule, firing.event
    gate = manager.gate
    condition_key, action_key = GateKey(GateRole.CONDITION, transaction.id), GateKey(GateRole.ACTION, transaction.id)
    gate.register_action(action_key, condition_key, Coupling.SEQUENTIAL_CAUSALLY_DEPENDENT)

    def condition_body(child: "Transaction") -> bool:
        set_slot(child, Firing, firing)
        slot(child, RuleContext).gate_report = condition_key
        held: object = rule.condition(child, event)    # (typed bool: what a user's condition returns is checked)
        if held is not True and held is not False:
            check_body_ran(rule, "condition", held)
        value = bool(held)
        gate.condition_returned(condition_key, value)
        return value

    def action_body(child: "Transaction") -> None:
        set_slot(child, Firing, firing)
        context = slot(child, RuleContext)
        context.gate_report, context.gate_key = action_key, action_key
        context.gate_wait_target = condition_handle.transaction.id
        _act(rule, child, event)

    # A part whose spawn is refused (the tree was doomed meanwhile: an ancestor's abort, ``lowlevel.abandon``) never
    # runs, so it never reports its end: it is reported here, as aborted, and forgotten — else the gate keeps the
    # action's record and the condition's outcome for ever.
    try:
        condition_handle = transaction.spawn(condition_body, name=f"condition:{rule.name}")
    except BaseException:
        _never_ran(manager, condition_key, action_key)
        raise
    try:
        action_handle = transaction.spawn(action_body, name=f"action:{rule.name}")
    except BaseException:
        _never_ran(manager, action_key)     # (the condition, spawned, reports its own end)
        raise
    condition_error: BaseException | None = None
    try:
        condition_value = bool(condition_handle.result())
    except BaseException as error:
        condition_value, condition_error = False, error
    try:
        action_handle.result()
    except DeadlockDetected:
        if action_handle.state is not TxnState.ABORTED:
            # This firing's own wait for the action was the victim, and the action goes on, waiting in the cycle
            # (``SubtransactionHandle.result``): the firing gives way, the action with it — never a second run of
            # the action beside a live first one.
            raise
        if condition_value:      # the action gave way to its condition: run it again, now after it
            manager.count(rule, "rerun_after_wait")
            run_subtransaction(transaction, _run_action_again, firing, name=f"action:{rule.name}")
    except DependencyAbort:
        pass
    except Exception as error:
        # The action began in parallel and raised.  It fails the firing only if its condition held; else it could
        # never have committed: a condition that raised is the firing's failure (as under immediate C-A coupling) and
        # the action's error would hide why; a condition that returned false makes the firing condition_false, as
        # under immediate C-A coupling, where the action would not have run at all.
        if condition_error is None:
            if condition_value:
                raise
            logger.debug("rule %r: its condition was false on %s; the action, begun in parallel, raised %s "
                         "(dropped: it could not have committed)", rule.name, event.describe(), shown_error(error))
    if condition_error is not None:
        raise condition_error
    if not condition_value:
        manager.count(rule, "condition_false")
    return condition_value


def _never_ran(manager: "RuleManager", *keys: GateKey) -> None:
    """Report the ends of the parts ``keys`` of a firing that were never spawned (aborted) and forget them."""
    for key in keys:
        manager.detached._report_end(key, False)     # (as DetachedRunner.transaction_ended does for a part that ran)


def _run_action_again(child: "Transaction", firing: "Firing") -> None:
    set_slot(child, Firing, firing)
    _act(firing.rule, child, firing.event)


def _act(rule: "Rule", child: "Transaction", event: "Event") -> None:
    """Run ``rule``'s action in ``child``, refusing a coroutine or generator it returns (``check_body_ran``)."""
    returned = rule.action(child, event)
    if returned is not None:
        check_body_ran(rule, "action", returned)
