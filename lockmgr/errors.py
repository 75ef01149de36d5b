"""Every error the lock manager raises, all subclasses of :class:`LockError`; each message says what
happened and what to do next.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Hashable

if TYPE_CHECKING:  # pragma: no cover
    from lockmgr._modes import Mode
    from lockmgr._records import LockTableSnapshot


class Lazy:
    """Text formatted only when shown: ``Lazy("acquire {} on {!r}", mode.name, resource)``.

    Errors and their details are created while the manager holds a mutex, and ``repr`` of a transaction
    id or a resource is user code, so nothing is formatted until someone reads the message.
    """

    __slots__ = ("template", "values")

    def __init__(self, template: str, *values: object) -> None:
        self.template = template
        self.values = values

    def __str__(self) -> str:
        return self.template.format(*self.values)

    def __bool__(self) -> bool:
        return bool(self.template)


class LockError(Exception):
    """Base class of every lock-manager error; its message is built in ``__str__`` from the attributes each
    class stores (lazily, for the reason :class:`Lazy` gives), and its ``repr`` shows that message (an error
    quoted by its ``repr`` — a rule's failure — reads as its message, not as the transaction ids it stores)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self)!r})"


class _OnTransaction(LockError):
    """An error about transaction ``tid``."""

    def __init__(self, tid: Hashable) -> None:
        super().__init__(tid)
        self.tid = tid


class _OnResource(LockError):
    """An error about transaction ``tid`` and one ``resource``."""

    def __init__(self, tid: Hashable, resource: Hashable) -> None:
        super().__init__(tid, resource)
        self.tid = tid
        self.resource = resource


@dataclass(frozen=True)
class WaitEdge:
    """One edge of the wait-for graph: ``waiter`` cannot finish before ``target`` does something.

    ``kind`` is one of

    * ``"held"``     -- ``waiter`` waits for a lock ``target`` holds in a conflicting mode;
    * ``"retained"`` -- ``waiter`` waits for a lock ``target`` retains in a conflicting mode and ``target`` is
      not an ancestor of ``waiter``: the wait ends when an ancestor of ``waiter`` inherits it, or on release;
    * ``"queued"``   -- ``waiter`` is queued behind ``target``'s earlier conflicting request (fairness);
    * ``"commit"``   -- ``waiter`` is the parent of the active child ``target`` and cannot commit before it;
    * any other kind -- a wait registered with ``LockManager.add_wait`` (e.g. ``"dependency"``: a coupling
      gate wait for ``target``'s end; ``"nested"``: a thread running ``waiter`` is blocked inside ``target``).

    ``resource`` is the resource waited for (None for commit edges and registered waits).
    """

    waiter: Hashable
    target: Hashable
    kind: str
    resource: Hashable | None = None

    def describe(self) -> str:
        if self.resource is None:
            return f"{self.waiter!r} -[{self.kind}]-> {self.target!r}"
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

    def __init__(self, victim: Hashable, requester: Hashable, cycle: tuple[WaitEdge, ...], policy: str,
                 snapshot: "LockTableSnapshot | None" = None, note: "str | Lazy" = "") -> None:
        super().__init__(victim, requester)
        self.victim = victim
        self.requester = requester
        self.cycle = cycle
        self.policy = policy
        self.snapshot = snapshot
        self.note = note

    def __str__(self) -> str:
        path = "; ".join(edge.describe() for edge in self.cycle)
        return (f"deadlock: transaction {self.victim!r} was chosen as the victim (policy {self.policy!r}) of the "
                f"wait-for cycle [{path}]. Its wait was withdrawn; abort it with lm.abort({self.victim!r}) "
                f"and retry its work in a new transaction.{f' {self.note}' if self.note else ''}")


class LockTimeout(_OnResource):
    """``acquire(..., timeout=t)`` was not granted within ``t`` seconds.

    The request was withdrawn; the transaction keeps every lock it already had.  Retry, or abort it.
    """

    def __init__(self, tid: Hashable, resource: Hashable, mode: Mode, timeout: float,
                 blockers: tuple[Hashable, ...]) -> None:
        super().__init__(tid, resource)
        self.mode = mode
        self.timeout = timeout
        self.blockers = blockers

    def __str__(self) -> str:
        blockers = ", ".join(sorted(repr(blocker) for blocker in self.blockers)) or "nobody any more"
        return (f"transaction {self.tid!r} waited {self.timeout:g} s for {getattr(self.mode, 'name', self.mode)} on "
                f"{self.resource!r} (blocked by {blockers}); the request was withdrawn and {self.tid!r} keeps its "
                f"other locks: retry later or abort it.")


class UnknownTransaction(_OnTransaction):
    """The tid is not known: it was never begun (or it ended so long ago that it is forgotten)."""

    def __str__(self) -> str:
        return (f"transaction {self.tid!r} is unknown to this lock manager: call lm.begin({self.tid!r}) (or "
                f"lm.begin({self.tid!r}, parent=...)) before using it")


class DuplicateTransaction(_OnTransaction):
    """``begin`` with a tid that is still active."""

    def __str__(self) -> str:
        return (f"transaction {self.tid!r} is already active; transaction ids must be unique among active "
                f"transactions: end it first or use another id")


class TransactionNotActive(LockError):
    """The operation needs an ACTIVE transaction but this one is committing or has ended."""

    def __init__(self, tid: Hashable, state: str, operation: "str | Lazy", detail: "str | Lazy" = "") -> None:
        super().__init__(tid, state)
        self.tid = tid
        self.state = state
        self.operation = operation
        self.detail = detail

    def __str__(self) -> str:
        detail = f" ({self.detail})" if self.detail else ""
        return (f"cannot {self.operation}: transaction {self.tid!r} is {self.state}{detail}; only an active "
                f"transaction can do that: begin a new transaction")


class AbortedTransaction(TransactionNotActive):
    """The transaction was aborted -- by itself, by another thread, or because an ancestor aborted.

    Raised from a waiting ``acquire`` whose transaction is aborted meanwhile, and from later calls.
    Its locks are already released; stop its work (its ancestors that are still active continue).
    """

    def __init__(self, tid: Hashable, operation: "str | Lazy", detail: "str | Lazy" = "") -> None:
        super().__init__(tid, "aborted", operation, detail)


class ActiveChildren(_OnTransaction):
    """``commit`` of a transaction whose children are still active (the wait-for-commit rule)."""

    def __init__(self, tid: Hashable, children: tuple[Hashable, ...]) -> None:
        super().__init__(tid)
        self.children = children

    def __str__(self) -> str:
        children = ", ".join(sorted(repr(child) for child in self.children))
        return (f"cannot commit transaction {self.tid!r}: its children {children} are still active. A parent "
                f"commits only after all its children have committed or aborted: finish them first (or abort "
                f"{self.tid!r}, which aborts them too)")


class WaitForItself(_OnTransaction):
    """``add_wait`` of a transaction for itself (among its ``targets``): the wait would never end, as the waiter's
    end comes only after its own wait."""

    def __init__(self, tid: Hashable, kind: str) -> None:
        super().__init__(tid)
        self.kind = kind

    def __str__(self) -> str:
        return (f"transaction {self.tid!r} cannot wait ({self.kind}) for itself: it ends only after this wait would, "
                f"so the wait would never end; nothing was registered. Wait for it from another transaction (e.g. "
                f"its parent), or leave it out of the targets")


class RequestPending(_OnResource):
    """A transaction waits for one lock at a time; a second concurrent ``acquire`` is refused."""

    def __str__(self) -> str:
        return (f"transaction {self.tid!r} is waiting for a lock on {self.resource!r} in another thread; it can "
                f"wait for one lock at a time and cannot commit meanwhile: run concurrent work in "
                f"subtransactions (lm.begin(child, parent={self.tid!r}))")


class InvalidDowngrade(_OnResource):
    """``downgrade`` to a mode that is not strictly weaker than the mode held."""

    def __init__(self, tid: Hashable, resource: Hashable, held: Mode, requested: Mode) -> None:
        super().__init__(tid, resource)
        self.held = held
        self.requested = requested

    def __str__(self) -> str:
        return (f"transaction {self.tid!r} holds {self.resource!r} in {self.held.name}; {self.requested.name} is "
                f"not a weaker mode (Rule 5 only weakens a lock). To get a stronger mode call acquire() instead")


class LockNotHeld(_OnResource):
    """``downgrade`` of a lock that the transaction does not hold."""

    def __str__(self) -> str:
        return (f"transaction {self.tid!r} does not hold a lock on {self.resource!r} (a retained lock cannot be "
                f"downgraded); acquire it first")


@dataclass(frozen=True)
class ErrorClasses:
    """The classes a :class:`~lockmgr.LockManager` raises for the two errors its caller is expected to handle
    (``LockManager(error_classes=...)``): each a subclass of lockmgr's own, so that an embedder makes them part
    of its own error hierarchy (activedb's ``DeadlockDetected`` is also an ``ActivedbError``) while lockmgr
    knows nothing of it, and ``except lockmgr.Deadlock`` still catches them.  Each is constructed with the
    arguments of the class it replaces."""

    deadlock: type[Deadlock] = Deadlock
    lock_timeout: type[LockTimeout] = LockTimeout

    def __post_init__(self) -> None:
        for name, base in (("deadlock", Deadlock), ("lock_timeout", LockTimeout)):
            given = getattr(self, name)
            if not (isinstance(given, type) and issubclass(given, base)):
                raise TypeError(f"ErrorClasses({name}={given!r}): give a subclass of lockmgr.{base.__name__}")
