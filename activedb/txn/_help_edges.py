"""Wait edges of helped children, registered only when the helping thread is about to block (txn README,
"A helped child's wait edge, registered when needed").

A thread that waits for a spawned child nobody has started runs it itself; the waiter's edge to the child is kept
here, on the thread, and registered in the lock manager just before the thread's first wait that can be an edge
(``TransactionManager.waiting``, a nested top-level transaction, a lock request's ``before_wait``), outermost edge
first, so that the same cycles are found with the same requester.  ``TransactionManager.lock_snapshot()`` adds the
edges not registered yet (``unregistered``).

Thread-safety: a thread's stack (``_stacks[its ident]``) is changed only by that thread; other threads only
read a copy of it (``unregistered``: a list copy and attribute reads, atomic under the GIL).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

import lockmgr

if TYPE_CHECKING:  # pragma: no cover
    from activedb.txn._tree import Transaction

#: Per thread (its ident) its edges, outermost first; a thread's entry is removed when its stack empties.
_stacks: dict[int, list["HelpEdge"]] = {}
_ident = threading.get_ident


class HelpEdge:
    """``waiter`` waits for ``target`` (an id) while this thread runs ``target`` (the edge's ``kind``), and the
    lock manager's registration of the edge once it has one."""

    __slots__ = ("waiter", "target", "kind", "registration", "skipped")

    def __init__(self, waiter: "Transaction", target: str, kind: str):
        self.waiter, self.target, self.kind = waiter, target, kind
        self.registration: lockmgr.ExternalWait | None = None
        self.skipped = False        # not registered: the waiter's ancestor aborted (it waits unregistered)

    @property
    def flushed(self) -> bool:
        return self.registration is not None or self.skipped


def push(edge: HelpEdge) -> None:
    """This thread now runs ``edge.target`` for ``edge.waiter`` (until :func:`pop`)."""
    ident = _ident()
    stack = _stacks.get(ident)
    if stack is None:
        _stacks[ident] = [edge]
    else:
        stack.append(edge)


def pop() -> None:
    """The innermost help ended: its edge leaves the stack, and the graph if it was registered."""
    ident = _ident()
    stack = _stacks[ident]
    edge = stack.pop()
    if not stack:
        del _stacks[ident]
    if edge.registration is not None:
        edge.registration.release()


def flush() -> None:
    """Register, outermost first, every edge of this thread the lock manager does not know yet (each in its
    waiter's lock manager): the calling thread is about to wait (module docstring)."""
    stack = _stacks.get(_ident())
    if not stack or stack[-1].flushed:
        return
    first = len(stack)
    while first > 0 and not stack[first - 1].flushed:
        first -= 1
    for edge in stack[first:]:
        waiter = edge.waiter
        try:
            edge.registration = waiter.manager.locks.add_wait(waiter.id, [edge.target], kind=edge.kind)
        except lockmgr.TransactionNotActive:
            # As ``TransactionManager.waiting`` does: an ancestor's abort reached the lock manager but not yet
            # this thread (``doom`` comes first, so the waiter is doomed): it waits unregistered.
            if waiter._doomed is None:
                raise
            edge.skipped = True


def unregistered(manager: object) -> list[tuple[str, str, str]]:
    """``(waiter id, target id, kind)`` of every edge of ``manager``'s transactions that some thread keeps
    unregistered now (for the pictures: ``TransactionManager.lock_snapshot``)."""
    found: list[tuple[str, str, str]] = []
    for stack in list(_stacks.values()):
        for edge in list(stack):
            if not edge.flushed and edge.waiter.manager is manager:
                found.append((edge.waiter.id, edge.target, edge.kind))
    return found
