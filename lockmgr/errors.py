"""Every error the lock manager raises.  Each message says what happened and what to do next.

Hierarchy::

    LockError
    ├── Deadlock                 the caller's transaction was chosen as the victim of a wait-for cycle
    ├── LockTimeout              acquire(timeout=...) expired; the request was withdrawn
    ├── UnknownTransaction       the tid was never begun (or ended long ago)
    ├── DuplicateTransaction     begin() with a tid that is still active
    ├── TransactionNotActive     the transaction is committing or has ended
    │   └── TransactionAborted   ... because it (or an ancestor) aborted, possibly while it was waiting
    ├── ActiveChildren           commit() while children are still active (a parent waits for its children)
    ├── RequestPending           a second acquire() for a transaction that is already waiting
    ├── InvalidDowngrade         downgrade() to a mode that is not weaker than the held one
    └── LockNotHeld              downgrade() of a lock the transaction does not hold
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Hashable

if TYPE_CHECKING:  # pragma: no cover
    from lockmgr._records import LockTableSnapshot


class LockError(Exception):
    """Base class of every lock-manager error."""


@dataclass(frozen=True)
class WaitEdge:
    """One edge of the wait-for graph: ``waiter`` cannot finish before ``target`` does something.

    ``kind`` is one of

    * ``"held"``     -- ``waiter`` waits for a lock ``target`` holds in a conflicting mode;
    * ``"retained"`` -- ``waiter`` waits for a lock ``target`` retains in a conflicting mode and ``target`` is
      not an ancestor of ``waiter``: the wait ends when an ancestor of ``waiter`` inherits it, or on release;
    * ``"queued"``   -- ``waiter`` is queued behind ``target``'s earlier conflicting request (fairness);
    * ``"commit"``   -- ``waiter`` is the parent of the active child ``target`` and cannot commit before it.

    ``resource`` is the resource waited for (None for commit edges).
    """

    waiter: Hashable
    target: Hashable
    kind: str
    resource: Any = None

    def describe(self) -> str:
        if self.kind == "commit":
            return f"{self.waiter!r} -[commit]-> {self.target!r}"
        return f"{self.waiter!r} -[{self.kind} {self.resource!r}]-> {self.target!r}"


class Deadlock(LockError):
    """The calling transaction's lock request closed (or sat on) a wait-for cycle and was chosen as victim.

    Only the victim is told; every other transaction of the cycle keeps waiting.  The victim's request was
    withdrawn, but it still holds and retains everything it had: abort it (``lm.abort(victim)``, which also
    aborts its descendants) and retry its work in a new transaction.

    Attributes: ``victim`` (tid), ``requester`` (the tid whose new wait edge closed the cycle), ``cycle``
    (tuple of :class:`WaitEdge`, each edge's target is the next edge's waiter), ``policy`` (the victim
    policy's name), ``snapshot`` (a :class:`~lockmgr.LockTableSnapshot` taken when the cycle was found, if the
    manager was created with ``snapshot_on_deadlock=True``; else None).
    """

    def __init__(
        self,
        victim: Hashable,
        requester: Hashable,
        cycle: tuple[WaitEdge, ...],
        policy: str,
        snapshot: "LockTableSnapshot | None" = None,
        note: str = "",
    ) -> None:
        self.victim = victim
        self.requester = requester
        self.cycle = cycle
        self.policy = policy
        self.snapshot = snapshot
        path = "; ".join(edge.describe() for edge in cycle)
        super().__init__(
            f"deadlock: transaction {victim!r} was chosen as the victim (policy {policy!r}) of the wait-for "
            f"cycle [{path}]. Its lock request was withdrawn; abort it with lm.abort({victim!r}) and retry "
            f"its work in a new transaction.{(' ' + note) if note else ''}"
        )

    @property
    def transactions(self) -> tuple[Hashable, ...]:
        """The transactions on the cycle, in cycle order."""
        return tuple(edge.waiter for edge in self.cycle)


class LockTimeout(LockError):
    """``acquire(..., timeout=t)`` was not granted within ``t`` seconds.

    The request was withdrawn; the transaction keeps every lock it already had.  Retry, or abort it.
    """

    def __init__(self, tid: Hashable, resource: Any, mode: Any, timeout: float, blockers: tuple) -> None:
        self.tid = tid
        self.resource = resource
        self.mode = mode
        self.timeout = timeout
        self.blockers = blockers
        super().__init__(
            f"transaction {tid!r} waited {timeout:g} s for {getattr(mode, 'name', mode)} on {resource!r} "
            f"(blocked by {', '.join(repr(b) for b in blockers) or 'nobody any more'}); the request was "
            f"withdrawn and {tid!r} keeps its other locks: retry later or abort it."
        )


class UnknownTransaction(LockError):
    """The tid is not known: it was never begun (or it ended so long ago that it is forgotten)."""

    def __init__(self, tid: Hashable) -> None:
        self.tid = tid
        super().__init__(
            f"transaction {tid!r} is unknown to this lock manager: call lm.begin({tid!r}) (or "
            f"lm.begin({tid!r}, parent=...)) before using it"
        )


class DuplicateTransaction(LockError):
    """``begin`` with a tid that is still active."""

    def __init__(self, tid: Hashable) -> None:
        self.tid = tid
        super().__init__(
            f"transaction {tid!r} is already active; transaction ids must be unique among active "
            f"transactions: end it first or use another id"
        )


class TransactionNotActive(LockError):
    """The operation needs an ACTIVE transaction but this one is committing or has ended."""

    def __init__(self, tid: Hashable, state: str, operation: str, detail: str = "") -> None:
        self.tid = tid
        self.state = state
        self.operation = operation
        super().__init__(
            f"cannot {operation}: transaction {tid!r} is {state}{(' (' + detail + ')') if detail else ''}; "
            f"only an active transaction can do that: begin a new transaction"
        )


class TransactionAborted(TransactionNotActive):
    """The transaction was aborted -- by itself, by another thread, or because an ancestor aborted.

    Raised from a waiting ``acquire`` whose transaction is aborted meanwhile, and from later calls.
    Its locks are already released; stop its work (its ancestors that are still active continue).
    """

    def __init__(self, tid: Hashable, operation: str, detail: str = "") -> None:
        super().__init__(tid, "aborted", operation, detail)


class ActiveChildren(LockError):
    """``commit`` of a transaction whose children are still active (the wait-for-commit rule)."""

    def __init__(self, tid: Hashable, children: tuple) -> None:
        self.tid = tid
        self.children = children
        super().__init__(
            f"cannot commit transaction {tid!r}: its children {', '.join(repr(c) for c in children)} are "
            f"still active. A parent commits only after all its children have committed or aborted: "
            f"finish them first (or abort {tid!r}, which aborts them too)"
        )


class RequestPending(LockError):
    """A transaction waits for one lock at a time; a second concurrent ``acquire`` is refused."""

    def __init__(self, tid: Hashable, resource: Any) -> None:
        self.tid = tid
        self.resource = resource
        super().__init__(
            f"transaction {tid!r} is already waiting for a lock on {resource!r}; a transaction can wait for "
            f"one lock at a time: run concurrent work in subtransactions (lm.begin(child, parent={tid!r}))"
        )


class InvalidDowngrade(LockError):
    """``downgrade`` to a mode that is not strictly weaker than the mode held."""

    def __init__(self, tid: Hashable, resource: Any, held: Any, requested: Any) -> None:
        self.tid = tid
        self.resource = resource
        super().__init__(
            f"transaction {tid!r} holds {resource!r} in {held.name}; {requested.name} is not a weaker mode "
            f"(Rule 5 only weakens a lock). To get a stronger mode call acquire() instead"
        )


class LockNotHeld(LockError):
    """``downgrade`` of a lock that the transaction does not hold."""

    def __init__(self, tid: Hashable, resource: Any) -> None:
        self.tid = tid
        self.resource = resource
        super().__init__(
            f"transaction {tid!r} does not hold a lock on {resource!r} (a retained lock cannot be "
            f"downgraded); acquire it first"
        )
