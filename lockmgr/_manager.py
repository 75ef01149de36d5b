"""The Härder–Rothermel lock manager.  The design note (rules, invariants, mutex order) is lockmgr/README.md.

Thread-safety: every public method of :class:`LockManager` may be called from any thread.  A transaction
may be used from several threads, but it waits for at most one lock at a time (``RequestPending``).
"""

from __future__ import annotations

import enum
import threading
import time
from typing import TYPE_CHECKING, Callable, Hashable, Iterable

from lockmgr._deadlock import Cycle, VictimNotifier, VictimPolicy, choose_victim, policy_name, queue_jumper
from lockmgr._entries import (UNCHANGED, _blockers, _discard_if_empty, _downgrade, _fast_grant, _hold, _release_entries,
                              _resource_count, _retain_entry, _retain_if_compatible, _undo_grant, fold_grants)
from lockmgr._export import add_wait_for_graph, holders_of, snapshot_of
from lockmgr._graph import find_cycle
from lockmgr._modes import COVERS, INTENTION_FOR, JOIN, Mode
from lockmgr._queues import WaitQueues
from lockmgr._records import DeadlockCycle, Holders, LockStatistics, LockTableSnapshot
from lockmgr._table import (ABORTED, ACTIVE, COMMITTED, COMMITTING, GRANTED, TIMED_OUT, VICTIM, WAITING,
                            WITHDRAWN_BY_ABORT, EdgeEvent, EndedLog, Grant, _committed_members, _covered, _Lock,
                            _lock_entry, _NO_CHILDREN, _NO_HOLDS, _Request, _Stripe, _Txn)
from lockmgr.errors import (AbortedTransaction, ActiveChildren, Deadlock, DuplicateTransaction, ErrorClasses, Lazy,
                            LockNotHeld, RequestPending, WaitForItself)

if TYPE_CHECKING:
    import networkx


class CommitEdges(enum.StrEnum):
    """Which parent -> child edges the wait-for graph has (README, "Commit edges: structural or declared")."""

    STRUCTURAL = "structural"    # every parent -> active child is an edge (a parent always waits for them)
    DECLARED = "declared"        # only while the parent says so: add_wait(parent, children, kind="commit"),
                                 # or a child begun with awaited=True


#: A callable victim policy: ``policy(cycle) -> tid``, one of ``cycle.candidates``.
VictimChooser = Callable[[DeadlockCycle], Hashable]

_NO_DETAIL = Lazy("")  # immutable


# What a transaction's own table lock already gives a tuple request (``_tuple_request``).
_COVERED = "covered"
_INTENTION_HELD = "intention held"
class ExternalWait:
    """A registered wait that is not a lock wait (``LockManager.add_wait``; design note §8): ``waiter``
    cannot go on before each of ``targets`` ends.  Call :meth:`release` when the wait is over (in a
    ``finally``).  A victim's edges are removed, ``error`` is its :class:`~lockmgr.Deadlock`, and
    ``on_victim(error)`` (called from the notifier thread, no mutex held) must wake the waiting thread.

    Thread-safety: ``status``, ``error`` and ``targets`` are guarded by the manager's graph mutex; the
    methods may be called from any thread.
    """

    __slots__ = ("manager", "txn", "targets", "kind", "on_victim", "preferred", "status", "error")

    def __init__(self, manager: "LockManager", txn: "_Txn", targets: dict[_Txn, str], kind: str,
                 on_victim: "Callable[[Deadlock], None] | None",
                 preferred: bool = False) -> None:
        self.manager = manager
        self.txn = txn
        self.targets = targets  # {_Txn: kind}
        self.kind = kind
        self.on_victim = on_victim
        self.preferred = preferred  # volunteers as the victim of any cycle through it (it can be re-run)
        self.status = WAITING
        self.error: BaseException | None = None

    @property
    def waiter(self) -> Hashable:
        return self.txn.tid

    @property
    def cancelled(self) -> bool:
        """True once the waiter was chosen as a deadlock victim (``error`` says why)."""
        return self.status is VICTIM

    def release(self) -> None:
        """End the wait: remove its edges (idempotent)."""
        manager = self.manager
        with manager._graph_mutex:
            if self.status is WAITING:
                manager._queues.drop_wait(self, GRANTED, None)

    def __enter__(self) -> "ExternalWait":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"<ExternalWait {self.kind} {self.txn.tid!r} -> {[t.tid for t in self.targets]!r} {self.status.value}>"


class LockManager:
    """Härder–Rothermel locking for nested transactions, with incremental deadlock detection.

    ``victim_policy`` chooses which waiting transaction of a deadlock cycle is told (gets ``Deadlock``):
    ``"requester"`` (the one whose new wait edge closed the cycle; the paper's choice, the default),
    ``"youngest"`` (latest ``begin``), ``"smallest_tree"`` (fewest transactions in its subtree, then fewest
    locks), or a callable ``policy(cycle: DeadlockCycle) -> tid`` returning one of ``cycle.candidates``
    (called without any mutex held; if it raises or returns a non-candidate, the requester is chosen).

    ``stripes`` is the number of lock-table partitions (rounded up to a power of two).  With
    ``snapshot_on_deadlock=True`` every ``Deadlock`` carries a :class:`LockTableSnapshot` taken when the cycle
    was found (for tests and post-mortems; costs a full snapshot per deadlock).  ``before_wait(tid)``, if given,
    is called on the requesting thread with no mutex held before every request the uncontended path could not
    grant (it may wait): where an embedder registers waits it kept out of the graph until its thread could
    block (README §8).

    Thread-safety: all methods are thread-safe.  See lockmgr/README.md for the mutex order.
    """

    def __init__(self, victim_policy: VictimPolicy | VictimChooser = VictimPolicy.REQUESTER, *, stripes: int = 256,
                 snapshot_on_deadlock: bool = False, remember_ended: int = 4096,
                 commit_edges: CommitEdges = CommitEdges.STRUCTURAL,
                 before_wait: "Callable[[Hashable], None] | None" = None,
                 error_classes: ErrorClasses = ErrorClasses()) -> None:
        if not callable(victim_policy):
            try:
                victim_policy = VictimPolicy(victim_policy)
            except ValueError:
                raise ValueError(f"unknown victim_policy {victim_policy!r}: use one of {', '.join(VictimPolicy)} "
                                 f"(lockmgr.VictimPolicy) or a callable taking a DeadlockCycle and returning a tid"
                                 ) from None
        if stripes < 1:
            raise ValueError("stripes must be at least 1")
        if snapshot_on_deadlock is not True and snapshot_on_deadlock is not False:
            raise TypeError(f"LockManager(snapshot_on_deadlock={snapshot_on_deadlock!r}) takes True or False (attach a "
                            f"snapshot of the lock table to every Deadlock, or not)")
        try:
            commit_edges = CommitEdges(commit_edges)
        except ValueError:
            raise ValueError(f"unknown commit_edges {commit_edges!r}: CommitEdges.STRUCTURAL ('structural': a "
                             "parent always waits for its active children) or CommitEdges.DECLARED ('declared': only "
                             "while it says so, add_wait(parent, children, kind='commit'))") from None
        if not isinstance(error_classes, ErrorClasses):
            raise TypeError(f"error_classes must be a lockmgr.ErrorClasses, not {error_classes!r}")
        if before_wait is not None and not callable(before_wait):
            raise TypeError(f"before_wait must be None or a callable before_wait(tid), not {before_wait!r}")
        # Immutable.  True: every parent -> active child is an edge of the wait-for graph.  False: only the
        # waits for children that the embedder registers (it retains before it waits; see the README).
        self._structural = commit_edges is CommitEdges.STRUCTURAL
        # Immutable.  The classes raised for a deadlock's victim and a lock wait that timed out.
        self._deadlock_error = error_classes.deadlock
        self._timeout_error = error_classes.lock_timeout
        count = 1 << (stripes - 1).bit_length()     # (the next power of two)
        self._victim_policy = victim_policy
        self._snapshot_on_deadlock = snapshot_on_deadlock
        self._stripes = tuple(_Stripe() for _ in range(count))
        self._stripe_mask = count - 1
        # The graph mutex protects: the transaction registry (_active, _ended), the tree (children, state
        # transitions), the wait-for graph (waits, request, every _Request), the counters below, and -- with
        # the stripe mutex -- every lock that has waiters.
        self._graph_mutex = threading.Lock()
        # The wait queues' counters, guarded by the graph mutex (``_queues``).
        self._queues = WaitQueues()
        # tid -> _Txn of every ACTIVE or COMMITTING transaction.  Written with the graph mutex held; the fast
        # path reads it without (one dict lookup, atomic).
        self._active: dict[Hashable, _Txn] = {}
        self._ended = EndedLog(remember_ended)  # recent ends, for messages
        self._serial = 0
        self._counters = dict.fromkeys(
            ("begun", "committed", "aborted", "waits", "deadlocks", "queue_jumps", "timeouts", "inherited"), 0)
        # Victims of cycles that are registered waits: (callback, error), run by the notifier thread so that
        # no callback runs with a mutex held.  The thread is started on the first add_wait with on_victim.
        self._notifier = VictimNotifier()
        # Immutable.  Called as ``before_wait(tid)`` on the requesting thread, with no mutex held, before a
        # request the uncontended path could not grant (it may wait): the embedder's last chance to register
        # waits of its own that a cycle through this request needs (README §8, "Registered waits").
        self._before_wait = before_wait

    # ------------------------------------------------------------------ transactions

    def begin(self, tid: Hashable, parent: Hashable | None = None, *, awaited: bool = False) -> None:
        """Register a top-level transaction (``parent=None``) or a subtransaction of the active ``parent``.
        ``awaited=True``: the parent waits for this child from now until it ends (e.g. the child runs
        inline in the parent's thread); with declared commit edges that makes "parent waits for child" an
        edge of the wait-for graph for the child's whole life."""
        if tid is None:
            raise ValueError("a transaction id must not be None (None means 'no parent')")
        with self._graph_mutex:
            if tid in self._active:
                raise DuplicateTransaction(tid)
            parent_txn = None
            if parent is not None:
                parent_txn = self._active.get(parent)
                if parent_txn is None or parent_txn.state is not ACTIVE:
                    self._ended.require_active(self._active, parent, Lazy("begin a child {!r} of it", tid))  # raises why
            self._serial += 1
            txn = _Txn(tid, parent_txn, self._serial, awaited)
            if parent_txn is not None:
                parent_txn.children.add(txn)
            self._active[tid] = txn
            self._ended.forget(tid)
            self._counters["begun"] += 1

    def is_active(self, tid: Hashable) -> bool:
        """True while ``tid`` is begun and has not started to commit or abort."""
        txn = self._active.get(tid)
        return txn is not None and txn.state is ACTIVE

    def commit(self, tid: Hashable) -> None:
        """Commit ``tid``.  A subtransaction hands its held and retained locks to its parent, which retains
        them in the same modes (Rule 2, lazily: O(1) plus the requests that waited for it, design note §9);
        a top-level transaction releases all of them (Rule 3).

        Raises ``ActiveChildren`` if a child of ``tid`` is still active, ``RequestPending`` if ``tid`` is
        waiting for a lock in another thread.
        """
        graph = self._graph_mutex
        with graph:
            txn = self._active.get(tid)
            if txn is None or txn.state is not ACTIVE:
                txn = self._ended.require_active(self._active, tid, "commit")   # raises why
            if txn.request is not None:
                raise RequestPending(tid, txn.request.lock.resource)
            if txn.children:
                raise ActiveChildren(tid, tuple(child.tid for child in txn.children))
            parent = txn.parent
            if parent is not None:
                self._commit_subtransaction(txn, parent)
                return
            with txn.mutex:
                txn.state = COMMITTING
                locks = txn.locks
                txn.locks = {}
                txn.holding = {}
        # Rule 3.  The tree has no active member left, so its committed lists no longer change.  Locks
        # without waiters are released under their stripe mutex only (no edge of the wait-for graph depends
        # on them); locks with waiters are redone below with the graph mutex.
        deferred = _release_entries(locks, txn, _committed_members(txn))
        txn.committed = None
        with graph:
            events = self._queues.release_deferred(deferred)
            with txn.mutex:
                txn.state = COMMITTED
            for wait in txn.external:  # waits its owner did not release: they end with it
                self._queues.drop_wait(wait, GRANTED, None)
            del self._active[tid]
            self._ended.remember(tid, "committed", _NO_DETAIL)
            self._counters["committed"] += 1
            if events:
                self._resolve(events)

    def _commit_subtransaction(self, txn: _Txn, parent: _Txn) -> None:
        """Lazy Rule 2 for an ACTIVE ``txn`` without children or a pending request.  Caller holds the graph
        mutex (so ``parent`` is ACTIVE: an abort of an ancestor would have aborted ``txn`` first)."""
        with txn.mutex:
            txn.state = COMMITTED
            handed = len(txn.locks)
            txn.holding = _NO_HOLDS
        # empty already; nothing adds to a committed transaction's children (a shared frozenset)
        txn.children = _NO_CHILDREN  # type: ignore[assignment]
        txn.ancestors = _NO_CHILDREN  # only a request of txn reads them, and none is granted any more
        # From here on txn's entries, and those its committed descendants made, count as retained by
        # parent's owner.  Readers without the graph mutex may still see txn as their owner for a while:
        # that only makes them wait where they need not (a commit only ever loosens Rule 1).
        txn.owner = parent
        parent.children.discard(txn)
        if handed or txn.committed:
            if parent.committed is None:
                parent.committed = [txn]
            else:
                parent.committed.append(txn)
        self._counters["inherited"] += handed
        # The requests waiting for txn now wait for parent's owner -- or for nothing, if that is an ancestor
        # of theirs.  Concurrent Rule Execution in Active Databases (§4.2.2) checks for deadlock "just before
        # lock inheritance"; the new edges are checked here, as part of it, with the same outcome.  No other request's edges change (see the README, §9).
        events: list[EdgeEvent] = []
        if txn.blocked:
            # every waiter blocked by txn has a pending request (Invariant of _Txn.blocked)
            for lock in {waiter.request.lock: None for waiter in txn.blocked}:  # type: ignore[union-attr]
                with lock.stripe.mutex:
                    events.extend(self._queues.reevaluate(lock))
            assert not txn.blocked, txn.blocked
        for wait in txn.external:  # waits its owner did not release: they end with it
            self._queues.drop_wait(wait, GRANTED, None)
        del self._active[txn.tid]
        self._ended.remember(txn.tid, "committed", _NO_DETAIL)
        self._counters["committed"] += 1
        if events:
            self._resolve(events)

    def abort(self, tid: Hashable) -> None:
        """Abort ``tid`` and its active descendants: release every lock they hold or retain (Rule 4) --
        including the entries of their committed descendants, which they retain; ancestors keep theirs.
        A descendant waiting in ``acquire`` gets ``AbortedTransaction``."""
        graph = self._graph_mutex
        with graph:
            txn = self._ended.require_active(self._active, tid, "abort")
            members: list[_Txn] = []
            stack = [txn]
            while stack:
                member = stack.pop()
                stack.extend(member.children)
                members.append(member)  # children are ACTIVE (a committing subtransaction is never seen)
            released: list[tuple[_Txn, dict[Hashable, _Lock]]] = []
            events: list[EdgeEvent] = []
            for member in members:
                with member.mutex:
                    member.state = ABORTED
                    released.append((member, member.locks))
                    member.locks = {}
                    member.holding = {}
                detail = Lazy("it aborted") if member is txn else Lazy("its ancestor {!r} aborted", tid)
                if member.request is not None:
                    request = member.request
                    error = AbortedTransaction(member.tid, Lazy("acquire {} on {!r}", request.mode.name,
                                                                request.lock.resource),
                                               Lazy("{} while it was waiting", detail))
                    events.extend(self._queues.withdraw(request, WITHDRAWN_BY_ABORT, error))
                member.children.clear()
                for wait in member.external:
                    self._queues.drop_wait(wait, WITHDRAWN_BY_ABORT, None)
                del self._active[member.tid]
                self._ended.remember(member.tid, "aborted", detail)
                self._counters["aborted"] += 1
            if txn.parent is not None:
                txn.parent.children.discard(txn)
            self._resolve(events)
        # Every member is ABORTED now, so their committed lists no longer change.
        deferred: dict[_Lock, list[_Txn]] = {}
        for member, locks in released:
            _release_entries(locks, member, _committed_members(member), deferred)
            member.committed = None
        if deferred:
            with graph:
                self._resolve(self._queues.release_deferred(deferred))

    # ------------------------------------------------------------------ locks

    def acquire(self, tid: Hashable, resource: Hashable, mode: Mode, timeout: float | None = None) -> None:
        """Acquire (or upgrade to) ``mode`` on ``resource`` for ``tid``, blocking until Rule 1 allows it.

        Re-acquiring a mode already covered returns at once.  Raises ``Deadlock`` if ``tid`` is chosen as a
        deadlock victim, ``LockTimeout`` if ``timeout`` seconds pass (the request is then withdrawn),
        ``AbortedTransaction`` if ``tid`` is aborted while waiting.
        """
        txn = self._active.get(tid)
        if txn is not None and mode.__class__ is Mode and _fast_grant(
                self._stripes[hash(resource) & self._stripe_mask], txn, resource, mode):
            return
        self._acquire_slow(tid, resource, mode, timeout)

    def try_acquire(self, tid: Hashable, resource: Hashable, mode: Mode) -> bool:
        """Like ``acquire`` but never blocks: True if granted now, False otherwise (nothing is queued).

        It obeys the same fairness queue as ``acquire``: it does not overtake an earlier conflicting waiter.
        """
        txn = self._active.get(tid)
        if txn is not None and mode.__class__ is Mode and _fast_grant(
                self._stripes[hash(resource) & self._stripe_mask], txn, resource, mode):
            return True
        _check_mode(mode)
        with self._graph_mutex:
            txn, stripe = self._requester(tid, "try_acquire", resource, mode)
            with stripe.mutex:
                lock = _lock_entry(stripe, resource)
                if _covered(lock, txn, mode):
                    return True
                target, blockers = _blockers(txn, lock, mode, list(lock.waiters or ()), False)
                if blockers:
                    _discard_if_empty(lock)
                    return False
                _hold(lock, txn, target)
                events = self._queues.reevaluate(lock)
            self._resolve(events)
            return True

    def acquire_tuple(self, tid: Hashable, table: Hashable, key: Hashable, mode: Mode, timeout: float | None = None,
                      resource: Hashable | None = None) -> None:
        """Lock the tuple ``(table, key)`` in ``mode`` (READ, UPDATE or WRITE) after the matching intention lock
        (IR or IW) on ``table``.  Nothing is locked at tuple level if ``tid`` already holds ``table`` in a
        mode that covers ``mode`` (e.g. a table READ covers reading every tuple), and the intention lock is
        not asked for again if ``tid`` already holds one that covers it.  The tuple's resource is the pair
        ``(table, key)``, or ``resource`` if given (an embedder's own naming); ``timeout`` applies to each
        of the two requests.
        """
        intention, resource, txn, held = _tuple_request(self._active, tid, table, key, mode, resource, "acquire_tuple")
        if held is _COVERED:
            return  # e.g. a table READ already covers reading every tuple
        if held is _INTENTION_HELD:
            # held is set only for a transaction found active
            if _fast_grant(self._stripes[hash(resource) & self._stripe_mask], txn, resource, mode):  # type: ignore[arg-type]
                return
            self._acquire_slow(tid, resource, mode, timeout)
            return
        self.acquire(tid, table, intention, timeout)
        self.acquire(tid, resource, mode, timeout)

    def acquire_tuples(self, tid: Hashable, table: Hashable, keys: "Iterable[Hashable]", mode: Mode,
                       timeout: float | None = None, resources: "Iterable[Hashable] | None" = None) -> None:
        """``acquire_tuple`` of each of ``keys`` in order (``resources``: their resources, in the same order), the
        table's entry looked at once: after the first, each tuple granted at once costs one stripe-mutex section.
        An error (a deadlock, a timeout) leaves the tuples before it locked, as a loop of ``acquire_tuple`` does."""
        if isinstance(keys, (str, bytes)):      # (a text would be read as its letters: each a tuple's key)
            raise TypeError(f"acquire_tuples({tid!r}, {table!r}, {keys!r}): keys is a collection of keys; one key "
                            f"is written [{keys!r}]")
        keys = list(keys)
        named = [(table, key) for key in keys] if resources is None else list(resources)
        if len(named) != len(keys):
            raise ValueError(f"acquire_tuples: {len(keys)} keys but {len(named)} resources")
        if not keys:
            return
        self.acquire_tuple(tid, table, keys[0], mode, timeout, named[0])     # (takes the intention lock)
        _, _, txn, held = _tuple_request(self._active, tid, table, keys[0], mode, named[0], "acquire_tuples")
        if held is _COVERED:
            return
        stripes, mask = self._stripes, self._stripe_mask
        for index in range(1, len(keys)):
            resource = named[index]
            stripe = stripes[hash(resource) & mask]
            if held is not _INTENTION_HELD or not _fast_grant(stripe, txn, resource, mode):  # type: ignore[arg-type]
                self.acquire_tuple(tid, table, keys[index], mode, timeout, resource)

    def try_acquire_tuple(self, tid: Hashable, table: Hashable, key: Hashable, mode: Mode,
                          resource: Hashable | None = None) -> bool:
        """``acquire_tuple`` that never blocks: True if the tuple (and its intention lock) is granted now,
        False otherwise (nothing is queued; an intention lock granted before the refusal stays)."""
        intention, resource, _, held = _tuple_request(self._active, tid, table, key, mode, resource, "try_acquire_tuple")
        if held is _COVERED:
            return True
        if held is _INTENTION_HELD:
            return self.try_acquire(tid, resource, mode)
        return self.try_acquire(tid, table, intention) and self.try_acquire(tid, resource, mode)

    def downgrade(self, tid: Hashable, resource: Hashable, mode: Mode) -> None:
        """Rule 5: weaken the mode ``tid`` holds on ``resource`` to ``mode``; ``tid`` then retains the old
        mode, so transactions outside its subtree still cannot get a conflicting lock.  Waiters that the
        weaker mode admits (its descendants, typically) are granted."""
        _check_mode(mode)
        txn = self._active.get(tid)
        stripe = self._stripes[hash(resource) & self._stripe_mask]
        if txn is not None and txn.state is ACTIVE:
            with stripe.mutex:
                lock = stripe.locks.get(resource)
                if lock is not None and lock.waiters is None:
                    _downgrade(lock, txn, mode)
                    return
        with self._graph_mutex:
            txn = self._ended.require_active(self._active, tid, Lazy("downgrade {!r} to {}", resource, mode.name))
            with stripe.mutex:
                lock = stripe.locks.get(resource)
                if lock is None:
                    raise LockNotHeld(tid, resource)
                _downgrade(lock, txn, mode)
                events = self._queues.reevaluate(lock)
            self._resolve(events)

    def retain(self, tid: Hashable) -> None:
        """Everything ``tid`` holds becomes *retained*, in place (Rule 5, down to holding nothing): ``tid``
        keeps transactions outside its subtree away but no longer excludes its descendants, whose waiting
        requests are granted if Rule 1 now allows them.  For a transaction that is about to wait for its
        children (or to let them run): it uses none of its locks meanwhile.  Call it from the thread that
        runs ``tid``'s operations.  Cost: the locks it holds, not the ones it retains."""
        txn = self._active.get(tid)
        if txn is None or not txn.holding:
            if txn is None:
                with self._graph_mutex:
                    self._ended.require_active(self._active, tid, "retain")
            return
        with txn.mutex:
            holding, txn.holding = txn.holding, {}
        deferred = []
        for lock in holding.values():
            mutex = lock.stripe.mutex
            mutex.acquire()
            try:
                if lock.waiters is None:
                    _retain_entry(lock, txn)
                else:
                    deferred.append(lock)
            finally:
                mutex.release()
        if deferred:
            with self._graph_mutex:
                events = []
                for lock in deferred:
                    with lock.stripe.mutex:
                        _retain_entry(lock, txn)
                        events.extend(self._queues.reevaluate(lock))
                self._resolve(events)

    def drop_holds(self, tid: Hashable) -> None:
        """Release what ``tid`` *holds*, keep what it retains: Rule 4 for a savepoint.  An embedder that
        runs a subtransaction lazily (without a transaction of its own here) takes that subtransaction's
        locks in its parent's name, after making the parent's own holds retained; when the
        subtransaction aborts, the parent's holds are exactly its locks, and this releases them.  Waiters
        that Rule 1 now admits are granted."""
        with self._graph_mutex:
            txn = self._ended.require_active(self._active, tid, "drop_holds")
            with txn.mutex:
                holding, txn.holding = txn.holding, {}
            events: list[EdgeEvent] = []
            for resource, lock in holding.items():
                with lock.stripe.mutex:
                    lock.held.pop(txn, None)
                    if not (lock.retained and txn in lock.retained):
                        with txn.mutex:
                            txn.locks.pop(resource, None)
                    events.extend(self._queues.reevaluate(lock))
                    _discard_if_empty(lock)
            self._resolve(events)

    def try_retain(self, tid: Hashable, resource: Hashable, mode: Mode, grants: list[Grant]) -> bool:
        """Grant ``mode`` on ``resource`` to ``tid`` *retained* at once, if Rule 1 admits it now and nobody waits
        for it (never blocks; False: refused, nothing changed).  For an embedder running a savepoint S of
        ``tid`` without registering it (README §9): while ``tid`` holds nothing and S is its only live
        descendant, "``tid`` retains it" and "S holds it" are decided alike by Rule 1 for every other
        transaction, and S's commit (Rule 2) then costs nothing here.  The grant is appended to ``grants``
        as ``(resource, mode, previous)``: the mode ``tid`` retained before, None, or ``UNCHANGED`` (what
        ``tid`` held or retained covered it); ``undo_retains`` (S aborts) and ``hand_down_retains`` (S gets
        a transaction of its own) take that list."""
        txn = self._active.get(tid)
        if txn is None or mode.__class__ is not Mode:
            _check_mode(mode)
            with self._graph_mutex:
                self._requester(tid, "try_retain", resource, mode)   # raises for an ended transaction
            return False
        return _retain_if_compatible(self._stripes[hash(resource) & self._stripe_mask], txn, resource, mode, grants)

    def undo_retains(self, tid: Hashable, grants: list[Grant]) -> None:
        """Rule 4 for a savepoint whose locks ``try_retain`` granted: ``tid`` retains again, on each resource
        of ``grants``, what it retained before (the grants undone newest first); waiters that Rule 1 now
        admits are granted.  A ``tid`` that has ended already lost them all."""
        with self._graph_mutex:
            txn = self._active.get(tid)
            if txn is None:
                return
            events: list[EdgeEvent] = []
            for resource, _, previous in reversed(grants):
                if previous is UNCHANGED:
                    continue
                stripe = self._stripes[hash(resource) & self._stripe_mask]
                with stripe.mutex:
                    lock = stripe.locks.get(resource)
                    if lock is None:
                        continue
                    _undo_grant(lock, txn, previous)  # type: ignore[arg-type]  # not UNCHANGED (above)
                    events.extend(self._queues.reevaluate(lock))
                    _discard_if_empty(lock)
            self._resolve(events)

    def hand_down_retains(self, tid: Hashable, child: Hashable, grants: list[Grant], *, retained: bool = False) -> None:
        """``try_retain``'s savepoint now has a transaction of its own, ``child`` (begun as a descendant of
        ``tid``, whose every ancestor below ``tid`` is a savepoint of ``tid`` too): under the graph mutex,
        ``tid`` retains again what it retained before ``grants`` and ``child`` holds each granted mode
        (joined per resource; ``retained``: retains it — a savepoint's locks from a committed savepoint of
        its own) — the table ``child`` would have had; each lock's queue is re-evaluated, so wait edges that
        named ``tid`` for those grants name ``child``.  Grants of several savepoints are handed down newest
        first (each call restores ``tid``'s entries to what they were before its own grants)."""
        with self._graph_mutex:
            txn = self._ended.require_active(self._active, tid, Lazy("hand its retains down to {!r}", child))
            heir = self._ended.require_active(self._active, child, Lazy("take the retains of {!r}", tid))
            ancestor = heir.parent
            while ancestor is not None and ancestor is not txn:
                ancestor = ancestor.parent
            if ancestor is None:
                raise ValueError(f"hand_down_retains: {child!r} is not a descendant of {tid!r}")
            wanted, before = fold_grants(grants)
            events: list[EdgeEvent] = []
            for resource, mode in wanted.items():
                stripe = self._stripes[hash(resource) & self._stripe_mask]
                with stripe.mutex:
                    lock = _lock_entry(stripe, resource)
                    if resource in before:
                        _undo_grant(lock, txn, before[resource])  # type: ignore[arg-type]  # never UNCHANGED
                    if retained:
                        kept = lock.retained
                        if kept is None:
                            kept = lock.retained = {}
                        previous = kept.get(heir)
                        kept[heir] = mode if previous is None else JOIN[previous][mode]
                        with heir.mutex:
                            heir.locks[resource] = lock
                    else:
                        _hold(lock, heir, mode if heir not in lock.held else JOIN[lock.held[heir]][mode])
                    events.extend(self._queues.reevaluate(lock))
            self._resolve(events)

    def hand_down(self, tid: Hashable, child: Hashable) -> None:
        """Move everything ``tid`` holds to its active ``child``, which then holds it in the same modes;
        ``tid`` keeps what it retains.  For an embedder whose lazily run subtransaction took its locks in
        its parent's name (see ``drop_holds``) and now gets a transaction of its own here: afterwards the
        locks are the child's, exactly as if it had acquired them itself.  Wait edges that named ``tid``
        as the holder now name ``child`` (and are checked for cycles)."""
        with self._graph_mutex:
            txn = self._ended.require_active(self._active, tid, Lazy("hand its holds down to {!r}", child))
            heir = self._ended.require_active(self._active, child, Lazy("take the holds of {!r}", tid))
            if heir.parent is not txn:
                raise ValueError(f"hand_down: {child!r} is not a child of {tid!r}")
            with txn.mutex:
                holding, txn.holding = txn.holding, {}
            events: list[EdgeEvent] = []
            for resource, lock in holding.items():
                with lock.stripe.mutex:
                    mode = lock.held.pop(txn, None)
                    if mode is None:
                        continue
                    current = lock.held.get(heir)
                    lock.held[heir] = mode if current is None else JOIN[current][mode]
                    with heir.mutex:
                        heir.locks[resource] = lock
                        heir.holding[resource] = lock
                    if not (lock.retained and txn in lock.retained):
                        with txn.mutex:
                            txn.locks.pop(resource, None)
                    events.extend(self._queues.reevaluate(lock))
            self._resolve(events)

    # ------------------------------------------------------------------ registered waits

    def add_wait(self, waiter: Hashable, targets: "Iterable[Hashable]", kind: str = "external",
                 on_victim: "Callable[[Deadlock], None] | None" = None, preferred_victim: bool = False) -> ExternalWait:
        """Register that ``waiter`` waits for each of ``targets`` for a reason other than a lock (design
        note §8, "Registered waits"): the edges ``waiter -> target`` (of ``kind``) join the wait-for graph and
        are checked for a cycle now.  Chosen as the victim now: ``Deadlock`` is raised and nothing registered;
        later: its edges are removed and ``on_victim(error)`` is called (without it, it is never chosen
        later).  ``preferred_victim=True`` volunteers whatever the policy.  Targets that are not active add no
        edge; ``waiter`` must be active or committing, and not among the targets (``WaitForItself``).  Returns the handle; ``release()`` it when the wait ends.
        """
        if preferred_victim is not True and preferred_victim is not False:   # ('no' would volunteer by its truth)
            raise TypeError(f"add_wait(preferred_victim={preferred_victim!r}) takes True or False (volunteer the waiter "
                            f"as the victim of any cycle through it, or not)")
        if isinstance(targets, (str, bytes)):       # (a text would be read as its letters: tids that may be active)
            raise TypeError(f"add_wait({waiter!r}, {targets!r}): targets is a collection of transaction ids; one "
                            f"target is written [{targets!r}]")
        with self._graph_mutex:
            txn = self._active.get(waiter)
            if txn is None:     # raises: waiter is not active
                txn = self._ended.require_active(self._active, waiter, Lazy("wait ({}) for {!r}", kind, targets))
            edges: dict[_Txn, str] = {}
            for tid in targets:
                target = self._active.get(tid)
                if target is not None:
                    if target is txn:       # (an edge to itself would be a wait that never ends: refused, not dropped)
                        raise WaitForItself(waiter, kind)
                    edges[target] = kind
            wait = ExternalWait(self, txn, edges, kind, on_victim, preferred_victim)
            if not edges:
                wait.status = GRANTED
                return wait
            txn.external = txn.external + (wait,)
            self._queues.registered += 1
            self._resolve([(wait, list(edges))])
            if wait.status is VICTIM:
                assert wait.error is not None, "a victim has its error"
                raise wait.error
        if on_victim is not None:
            self._notifier.start()
        return wait

    # ------------------------------------------------------------------ inspection

    def holders(self, resource: Hashable) -> Holders:
        """Who holds, retains and waits for ``resource`` right now (modes by tid)."""
        stripe = self._stripes[hash(resource) & self._stripe_mask]
        with stripe.mutex:
            lock = stripe.locks.get(resource)
            return holders_of(resource, lock)

    def statistics(self) -> LockStatistics:
        """Counters; ``waiting`` is exact (tests wait on it), ``locks`` is summed stripe by stripe."""
        with self._graph_mutex:
            counters = dict(self._counters)
            transactions = len(self._active)
            waiting = self._queues.waiting
            registered = self._queues.registered
        locks = sum(len(stripe.locks) for stripe in self._stripes)
        folded = sum(stripe.folded for stripe in self._stripes)
        return LockStatistics(transactions=transactions, locks=locks, waiting=waiting, registered_waits=registered,
                              folded=folded, **counters)

    @property
    def snapshot_on_deadlock(self) -> bool:
        """Whether every ``Deadlock`` carries a snapshot of the lock table (the constructor's argument): what a
        caller that raises a ``Deadlock`` of its own (a cycle it found outside the lock manager) follows."""
        return self._snapshot_on_deadlock

    def snapshot(self) -> LockTableSnapshot:
        """A consistent copy of the whole lock table, the tree and the wait-for graph (takes every mutex,
        in the documented order; meant for tests, debugging and reports, not for hot paths)."""
        with self._graph_mutex:
            return snapshot_of(self._stripes, self._active, self._structural)

    def wait_for_graph(self, timeout: float | None = None) -> networkx.DiGraph[Hashable]:
        """The wait-for graph as a ``networkx.DiGraph``.

        Nodes are the tids of active transactions (attributes ``parent``, ``state``, ``depth``, and for a
        waiting one ``waiting_for`` and ``mode``); edges carry ``kind`` ("held", "retained", "queued",
        "commit", or the kind of a registered wait, e.g. "dependency") and, for lock-wait edges, ``resource``.  Built under the graph mutex, so it is consistent.
        ``timeout``: seconds to wait for the graph mutex (None: no limit) — a watcher of a test that may hang
        bounds its read so; ``TimeoutError`` if a thread holds the mutex that long.
        """
        import networkx

        if timeout is not None and not timeout >= 0:     # (also NaN)
            raise ValueError(f"timeout must be None or a number >= 0, not {timeout!r}")
        graph: networkx.DiGraph[Hashable] = networkx.DiGraph()
        if not self._graph_mutex.acquire(timeout=-1 if timeout is None else min(timeout, threading.TIMEOUT_MAX)):
            raise TimeoutError(f"the wait-for graph was not read within {timeout} s: a thread holds the lock "
                               f"manager's graph mutex")
        try:
            add_wait_for_graph(graph, self._active, self._structural)
        finally:
            self._graph_mutex.release()
        return graph

    # ------------------------------------------------------------------ slow paths (graph mutex)

    def _requester(self, tid: Hashable, verb: str, resource: Hashable, mode: Mode) -> tuple[_Txn, _Stripe]:
        """``tid``'s transaction, about to ask for ``resource`` in ``mode`` (it must be active and not waiting
        already), and the stripe of ``resource``.  Caller holds the graph mutex."""
        txn = self._ended.require_active(self._active, tid, Lazy("{} {} on {!r}", verb, mode.name, resource))
        if txn.request is not None:
            raise RequestPending(tid, txn.request.lock.resource)
        return txn, self._stripes[hash(resource) & self._stripe_mask]

    def _acquire_slow(self, tid: Hashable, resource: Hashable, mode: Mode, timeout: float | None) -> None:
        _check_mode(mode)
        if timeout is not None and not timeout >= 0:     # (also NaN)
            raise ValueError(f"timeout must be None or a number >= 0, not {timeout!r}")
        if self._before_wait is not None:
            self._before_wait(tid)
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._graph_mutex:
            txn, stripe = self._requester(tid, "acquire", resource, mode)
            with stripe.mutex:
                lock = _lock_entry(stripe, resource)
                if _covered(lock, txn, mode):
                    return
                request = _Request(txn, lock, mode)
                events = self._queues.enqueue(request)
            if request.status is GRANTED:
                return
            self._counters["waits"] += 1
            request.condition = threading.Condition(self._graph_mutex)
            self._resolve(events)
            while request.status is WAITING:
                if deadline is None:
                    request.condition.wait()
                    continue
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    blockers = tuple(blocker.tid for blocker in txn.waits)
                    self._counters["timeouts"] += 1
                    self._resolve(self._queues.withdraw(request, TIMED_OUT, None))
                    # deadline is set: timeout is a number
                    raise self._timeout_error(tid, resource, mode, timeout, blockers)  # type: ignore[arg-type]
                request.condition.wait(min(remaining, threading.TIMEOUT_MAX))   # (an infinite timeout too)
            if request.status is GRANTED:
                return
            assert request.error is not None
            raise request.error

    def _resolve(self, events: list[EdgeEvent]) -> None:
        """Check each new wait edge for a cycle and break every cycle found.

        ``events`` are ``(source, new targets)`` where ``source`` is a waiting lock ``_Request`` or a
        registered :class:`ExternalWait`.  A cycle that exists only because of the fairness queue (some
        request on it is blocked by queued requests alone) is broken by letting that request go first; any
        other cycle by telling a victim.  Caller holds the graph mutex and no stripe mutex.  (A callable
        victim policy runs with the graph mutex released; the cycle is re-validated afterwards.)
        """
        while events:
            source, targets = events.pop()
            if source.status is not WAITING:
                continue
            txn = source.txn
            current = source.targets if source.__class__ is ExternalWait else txn.waits
            live = [target for target in targets if target in current]
            if not live:
                continue
            path = find_cycle(txn, live, self._structural)
            if path is None:
                continue
            jumper = queue_jumper(path)
            if jumper is not None:
                jumping = jumper.request
                assert jumping is not None, "a queue jumper waits on a lock request"
                jumping.jumped = True
                self._counters["queue_jumps"] += 1
                with jumping.lock.stripe.mutex:
                    events.extend(self._queues.reevaluate(jumping.lock))
                events.append((source, live))
                continue
            cycle = Cycle(path, txn, source)
            if cycle.requester is None:  # nobody on the cycle can be told (registered waits without on_victim)
                continue
            victim, note = choose_victim(self._victim_policy, cycle, self._graph_mutex, _resource_count)
            if victim is None:  # the cycle changed while a victim policy ran: look again
                events.append((source, live))
                continue
            self._counters["deadlocks"] += 1
            snapshot = snapshot_of(self._stripes, self._active, self._structural) if self._snapshot_on_deadlock else None
            error = self._deadlock_error(victim.tid, txn.tid, cycle.wait_edges, policy_name(self._victim_policy),
                                         snapshot, note)
            told = cycle.wait_of_victim(victim)
            if isinstance(told, _Request):
                events.extend(self._queues.withdraw(told, VICTIM, error))
            else:
                self._queues.drop_wait(told, VICTIM, error)
                if told is not source and told.on_victim is not None:
                    self._notifier.tell(told.on_victim, error)
            if victim is not txn or told is not source:
                events.append((source, live))


def _check_mode(mode: object) -> None:
    if mode.__class__ is not Mode:
        raise TypeError(f"mode must be a lockmgr.Mode (IR, IW, READ, UPDATE, RIW or WRITE), not {mode!r}")


def _tuple_request(active: dict[Hashable, _Txn], tid: Hashable, table: Hashable, key: Hashable, mode: Mode,
                   resource: Hashable | None, operation: str) -> tuple[Mode, Hashable, _Txn | None, str | None]:
    """``(intention, resource, txn, what tid's table lock already gives)`` for a tuple request: a hint
    read of tid's own table entry without its mutex (a stale answer only means the full path)."""
    intention = INTENTION_FOR.get(mode)
    if intention is None:
        raise ValueError(f"{operation} takes Mode.READ, Mode.UPDATE or Mode.WRITE, not {mode!r}")
    if resource is None:
        resource = (table, key)
    txn = active.get(tid)
    if txn is not None:
        table_lock = txn.locks.get(table)
        table_mode = None if table_lock is None else table_lock.held.get(txn)
        if table_mode is not None and txn.state is ACTIVE:
            covers = COVERS[table_mode]
            if covers[mode]:
                return intention, resource, txn, _COVERED
            if covers[intention]:
                return intention, resource, txn, _INTENTION_HELD
    return intention, resource, txn, None
