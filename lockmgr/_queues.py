"""``WaitQueues``: appending a request to a lock's FIFO, re-evaluating the FIFO, taking a request out of it,
withdrawing one, dropping a registered wait, and the waiting counters.  Callers hold the manager's graph mutex
(and the stripe mutex each method names, design note §6-§7); methods return the ``(source, new targets)``
events the deadlock check must see.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lockmgr._entries import _blockers, _discard_if_empty, _fold_if_crowded, _hold, _release, _set_waits
from lockmgr._table import _NO_WAITS, GRANTED, WAITING, EdgeEvent, _Lock, _Request, _RequestStatus, _Txn

if TYPE_CHECKING:
    from lockmgr._manager import ExternalWait


class WaitQueues:
    """The queue operations of one lock manager.  Fields are guarded by the manager's graph mutex.

    Invariants: ``waiting`` = number of ``_Request`` objects with status WAITING; ``registered`` = number of
    registered waits (``ExternalWait``) with status WAITING.
    """

    __slots__ = ("waiting", "registered")

    def __init__(self) -> None:
        self.waiting = 0
        self.registered = 0

    def release_deferred(self, deferred: "dict[_Lock, list[_Txn]]") -> list[EdgeEvent]:
        """Release the entries that ``_entries._release_entries`` set aside (locks with waiters) and regrant each
        lock's queue once.  Caller holds the graph mutex and no stripe mutex.  Returns new-edge events."""
        events: list[EdgeEvent] = []
        for lock, owners in deferred.items():
            with lock.stripe.mutex:
                for owner in owners:
                    _release(lock, owner)
                events.extend(self.reevaluate(lock))
                _discard_if_empty(lock)
        return events

    def enqueue(self, request: _Request) -> list[EdgeEvent]:
        """Append the new ``request`` to its lock's FIFO, granting it at once if Rule 1 and the queue allow.
        Returns the new-edge events, as ``reevaluate`` does.  Caller holds the graph mutex and the lock's stripe
        mutex.

        A request appended behind others changes nothing that those wait for (their edges depend on the lock's
        entries and on the requests before them, and are current: design note §5), so a request that must wait
        is the only one looked at: the k-th request costs k Rule-1 steps to queue, not k².  One that is granted
        adds a holder, and the whole queue is re-evaluated."""
        lock = request.lock
        txn = request.txn
        waiters = lock.waiters
        if waiters is not None:
            _fold_if_crowded(lock)  # as reevaluate does (changes no decision)
            request.target, blockers = _blockers(txn, lock, request.mode, waiters, False)
            if blockers:
                waiters.append(request)
                txn.request = request
                self.waiting += 1
                _set_waits(txn, blockers)
                return [(request, list(blockers))]
            waiters.append(request)
        else:
            lock.waiters = [request]
        txn.request = request
        self.waiting += 1
        return self.reevaluate(lock)

    def reevaluate(self, lock: _Lock) -> list[EdgeEvent]:
        """Grant every queued request of ``lock`` that Rule 1 and the queue now allow, in FIFO order, and
        recompute the wait edges of the others.  Returns ``[(request, new targets)]`` for the edges that
        are new, to be checked by ``LockManager._resolve``.  Caller holds the graph mutex and ``lock.stripe.mutex``.
        """
        waiters = lock.waiters
        if waiters is None:
            return []
        _fold_if_crowded(lock)  # fewer entries for every _blockers below (changes no decision)
        before = {request: request.txn.waits for request in waiters}
        while True:
            granted_behind = False
            ahead: list[_Request] = []
            for request in tuple(lock.waiters or ()):
                txn = request.txn
                request.target, blockers = _blockers(txn, lock, request.mode, ahead, request.jumped)
                if blockers:
                    _set_waits(txn, blockers)
                    ahead.append(request)
                else:
                    _hold(lock, txn, request.target)
                    self.dequeue(request, GRANTED, None)
                    granted_behind = granted_behind or bool(ahead)
            # A grant adds a holder, which can change what earlier requests wait for (and exemptions):
            # repeat until a pass grants nothing behind a request left waiting, so every remaining request's
            # edges are current.  (A grant with nobody left waiting before it -- the head of a queue handed
            # the lock -- needs no second pass: every request left waiting was looked at after it.)
            if not granted_behind or lock.waiters is None:
                break
        events: list[EdgeEvent] = []
        for request in lock.waiters or ():
            old = before.get(request, _NO_WAITS)
            new = [target for target in request.txn.waits if target not in old]
            if new:
                events.append((request, new))
        return events

    def dequeue(self, request: _Request, status: _RequestStatus, error: BaseException | None) -> None:
        """Take ``request`` out of its queue with its final ``status`` and wake its thread.
        Caller holds the graph mutex and the request's stripe mutex."""
        assert request.status is WAITING, request.status
        lock = request.lock
        lock.waiters.remove(request)  # type: ignore[union-attr]  # a WAITING request is in its lock's queue
        if not lock.waiters:
            lock.waiters = None
        request.status = status
        request.error = error
        txn = request.txn
        _set_waits(txn, _NO_WAITS)
        txn.request = None
        self.waiting -= 1
        if request.condition is not None:
            request.condition.notify()

    def withdraw(self, request: _Request, status: _RequestStatus, error: BaseException | None) -> list[EdgeEvent]:
        """Withdraw a waiting request (victim, timeout, abort) and regrant its lock's queue.
        Caller holds the graph mutex and no stripe mutex.  Returns new-edge events."""
        lock = request.lock
        with lock.stripe.mutex:
            self.dequeue(request, status, error)
            events = self.reevaluate(lock)
            _discard_if_empty(lock)
        return events

    def drop_wait(self, wait: ExternalWait, status: _RequestStatus, error: BaseException | None) -> None:
        """Remove ``wait``'s edges with its final ``status``.  Caller holds the graph mutex."""
        txn = wait.txn
        txn.external = tuple(other for other in txn.external if other is not wait)
        wait.status = status
        wait.error = error
        wait.targets = {}
        self.registered -= 1
