"""Operations on one lock's entries: Rule 1, Rules 2-5, lazy inheritance's folds, and a request's wait edges.
Each function says what its caller holds (design note §6); none takes a mutex itself unless it says so.
"""

from __future__ import annotations

from typing import Hashable, Iterable

from lockmgr._modes import CONFLICTS, COVERS, JOIN, Mode
from lockmgr._table import (ACTIVE, _NO_HOLDS, Grant, _committed_members, _Lock, _new_lock_entry, _owner_of,
                            _Request, _Stripe, _Txn)
from lockmgr.errors import InvalidDowngrade, LockNotHeld

_FREE_LOCKS_PER_STRIPE = 16
# A new entry on a lock with this many entries, or a re-evaluation of its queue, first folds the entries of
# committed subtransactions into their owners' (``_fold``): a lock that many committed members touched
# shrinks back to about one entry per owner, at a cost amortized over the entries it folds.  (Tests set it
# to 1 and to "never" to run every path with and without folds.)
_FOLD_AT = 4


def _fold_if_crowded(lock: _Lock) -> None:
    """Fold ``lock`` if it has ``_FOLD_AT`` entries or more (before a re-evaluation of its queue).  Caller
    holds the graph mutex and the lock's stripe mutex."""
    if len(lock.held) + len(lock.retained or ()) >= _FOLD_AT:
        _fold(lock)


def _blockers(txn: _Txn, lock: _Lock, mode: Mode, ahead: list[_Request], jumped: bool) -> tuple[Mode, dict[_Txn, str]]:
    """Rule 1 plus the fairness queue: who blocks ``txn``'s request for ``mode`` on ``lock``.

    ``ahead`` are the requests queued before this one that are still waiting.  Returns the mode the request
    would hold and ``{blocking _Txn: kind}`` (empty: grantable); every blocker is an owner (lazy Rule 2: an
    entry of a committed subtransaction counts as retained by ``_owner_of`` it).  Caller holds the stripe
    mutex (and the graph mutex if the lock has waiters); without the graph mutex an owner may be stale,
    which only errs on the side of blocking (a stale owner is a descendant of the true one).
    """
    held = lock.held
    current = held.get(txn)
    target = mode if current is None else JOIN[current][mode]
    row = CONFLICTS[target]
    blockers: dict[_Txn, str] = {}
    ancestors = txn.ancestors
    retainers: list[_Txn] = []  # owners of conflicting entries that count as retained
    # Rule 1a: no other transaction holds the lock in a conflicting mode.
    for holder, held_mode in held.items():
        if row[held_mode] and holder is not txn:
            if holder.owner is holder:
                blockers[holder] = "held"
            else:  # a committed subtransaction's held entry: retained by its owner
                retainers.append(_owner_of(holder))
    # Rule 1b: every transaction retaining it in a conflicting mode is an ancestor (or txn itself).
    retained = lock.retained
    if retained:
        for retainer, retained_mode in retained.items():
            if row[retained_mode] and retainer is not txn:
                retainers.append(retainer if retainer.owner is retainer else _owner_of(retainer))
    for retainer in retainers:
        if retainer is not txn and retainer not in ancestors and retainer not in blockers:
            blockers[retainer] = "retained"
    # Fairness: FIFO among conflicting requests, except behind an ancestor or behind a request that txn
    # or one of its ancestors is blocking (queueing there would be a certain deadlock).
    # (Cheapest tests first: a re-evaluation of a queue of n runs this body about n²/2 times.)
    if not jumped:
        for earlier in ahead:
            if not row[earlier.target]:
                continue
            other = earlier.txn
            if other in blockers:
                continue
            waits = other.waits
            if txn in waits:
                continue
            if ancestors and (other in ancestors or not ancestors.isdisjoint(waits)):
                continue
            blockers[other] = "queued"
    return target, blockers


def _grant_if_compatible(txn: _Txn, lock: _Lock, mode: Mode) -> bool:
    """Fast path of Rule 1 for a lock without waiters: grant and return True, or return False.

    An entry of a committed subtransaction counts as retained by its owner (lazy Rule 2); only a
    conflicting entry needs its owner resolved, so entries that do not conflict cost what they did."""
    held = lock.held
    current = held.get(txn)
    if current is None:
        target = mode
    else:
        target = JOIN[current][mode]
        if target is current:
            return txn.state is ACTIVE
    if not _admits(txn, lock, CONFLICTS[target]):
        return False
    retained = lock.retained
    if current is None:
        if len(held) + (len(retained) if retained else 0) >= _FOLD_AT:
            _fold(lock)  # a new entry: keep the lock near one entry per owner (changes no decision)
        txn_mutex = txn.mutex
        txn_mutex.acquire()
        try:
            if txn.state is not ACTIVE:
                return False
            txn.locks[lock.resource] = lock
            txn.holding[lock.resource] = lock
        finally:
            txn_mutex.release()
    elif txn.state is not ACTIVE:
        return False
    held[txn] = target
    return True


def _admits(txn: _Txn, lock: _Lock, row: tuple[bool, ...]) -> bool:
    """Rule 1 without the queue: no other transaction holds ``lock`` in a mode of ``row`` (the conflict row of
    the mode ``txn`` would have), and every one retaining it so is ``txn`` or an ancestor.  An entry of a
    committed subtransaction counts as retained by its owner (lazy Rule 2); only a conflicting entry needs
    its owner resolved.  Caller holds the stripe mutex."""
    for holder, held_mode in lock.held.items():
        if row[held_mode] and holder is not txn:
            if holder.owner is holder:
                return False
            owner = _owner_of(holder)
            if owner is not txn and owner not in txn.ancestors:
                return False
    retained = lock.retained
    if retained:
        ancestors = txn.ancestors
        for retainer, retained_mode in retained.items():
            if row[retained_mode] and retainer is not txn and retainer not in ancestors:
                if retainer.owner is retainer:
                    return False
                owner = _owner_of(retainer)  # never an ancestor itself: it committed, txn is active
                if owner is not txn and owner not in ancestors:
                    return False
    return True


#: ``previous`` of a savepoint grant that changed nothing: what the transaction held or retained covered it.
UNCHANGED = "unchanged"


def fold_grants(grants: Iterable[Grant]) -> tuple[dict[Hashable, Mode], dict[Hashable, Mode | str | None]]:
    """A savepoint's grants (``LockManager.try_retain``'s list) read per resource: ``(wanted, before)`` —
    the join of the modes granted on each resource, and what the transaction retained there before the
    first grant that changed it (None: nothing; resources no grant changed are absent)."""
    wanted: dict[Hashable, Mode] = {}
    before: dict[Hashable, Mode | str | None] = {}
    for resource, mode, previous in grants:
        current = wanted.get(resource)
        wanted[resource] = mode if current is None else JOIN[current][mode]
        if previous is not UNCHANGED and resource not in before:
            before[resource] = previous
    return wanted, before


def _retain_if_compatible(stripe: "_Stripe", txn: _Txn, resource: Hashable, mode: Mode, grants: list[Grant]) -> bool:
    """``LockManager.try_retain``'s grant: ``mode`` on ``resource`` retained by ``txn`` at once if nobody waits
    for it and Rule 1 admits it, recorded in ``grants``.  False: refused (or ``txn`` is not active).  Takes
    ``stripe.mutex`` (with ``acquire``/``release``, cheaper than ``with``, on every lock a savepoint takes)."""
    mutex = stripe.mutex
    mutex.acquire()
    try:
        lock = stripe.locks.get(resource)
        if lock is None:
            txn_mutex = txn.mutex
            txn_mutex.acquire()
            try:
                if txn.state is not ACTIVE:
                    return False
                lock = _new_lock_entry(stripe, resource)     # (found missing above: no second lookup)
                lock.retained = {txn: mode}
                txn.locks[resource] = lock
            finally:
                txn_mutex.release()
            grants.append((resource, mode, None))
            return True
        if lock.waiters is not None:
            return False
        held = lock.held.get(txn)
        if held is not None and COVERS[held][mode]:
            grants.append((resource, mode, UNCHANGED))
            return txn.state is ACTIVE
        # The committed members' entries first go into their owners' (so ``txn``'s entry is all that
        # ``txn``'s subtree has here, and an undo restoring it loses nothing that counted as its).
        _fold(lock)
        retained = lock.retained
        previous = retained.get(txn) if retained is not None else None
        if previous is not None and COVERS[previous][mode]:
            grants.append((resource, mode, UNCHANGED))
            return txn.state is ACTIVE
        target = mode if previous is None else JOIN[previous][mode]
        if not _admits(txn, lock, CONFLICTS[target]):
            return False
        with txn.mutex:
            if txn.state is not ACTIVE:
                return False
            txn.locks[resource] = lock
        if retained is None:
            lock.retained = {txn: target}
        else:
            retained[txn] = target
        grants.append((resource, mode, previous))
        return True
    finally:
        mutex.release()


def _undo_grant(lock: _Lock, txn: _Txn, previous: "Mode | None") -> None:
    """``txn`` retains ``previous`` on ``lock`` again (None: nothing; it stops listing the lock unless it
    holds it).  Caller holds the stripe mutex."""
    retained = lock.retained
    if previous is not None:
        retained[txn] = previous  # type: ignore[index]  # it retained previous: retained is a dict
        return
    if retained is not None:
        retained.pop(txn, None)
        if not retained:
            lock.retained = None
    if txn not in lock.held:
        with txn.mutex:
            if txn.locks.get(lock.resource) is lock:
                del txn.locks[lock.resource]


def _fold(lock: _Lock) -> None:
    """Lazy Rule 2 made physical for one lock: merge each entry of a committed subtransaction into the
    retained entry of its owner, where that owner is ACTIVE (joined with what it retains; the owner now
    lists the lock, the member no longer does).  Folding changes nothing that Rule 1 decides -- the entry
    counted as the owner's already -- but keeps a lock near one entry per owner, as eager inheritance did,
    so that a Rule-1 scan does not grow with the number of committed members.  An entry whose owner is no
    longer ACTIVE is left where it is (its tree is ending; the release drops it).

    Caller holds ``lock.stripe.mutex`` (and the graph mutex if the lock has waiters); takes transaction
    mutexes one at a time (the owner's, then the member's)."""
    held = lock.held
    members = [member for member in held if member.owner is not member]
    retained = lock.retained
    if retained:
        for member in retained:
            if member.owner is not member and member not in held:
                members.append(member)
    if not members:
        return
    resource = lock.resource
    moved = 0
    for member in members:
        owner = _owner_of(member)
        owner_mutex = owner.mutex
        owner_mutex.acquire()
        try:
            if owner.state is not ACTIVE:
                continue
            mode = held.pop(member, None)
            retained = lock.retained
            if retained is None:
                retained = lock.retained = {}
            else:
                kept = retained.pop(member, None)
                if kept is not None:
                    mode = kept if mode is None else JOIN[mode][kept]
            previous = retained.get(owner)
            # mode is not None: member has an entry here, held or retained
            retained[owner] = mode if previous is None else JOIN[previous][mode]  # type: ignore[assignment,index]
            owner.locks[resource] = lock
        finally:
            owner_mutex.release()
        moved += 1
        member_mutex = member.mutex
        member_mutex.acquire()
        try:
            if member.locks.get(resource) is lock:
                del member.locks[resource]
        finally:
            member_mutex.release()
    lock.stripe.folded += moved


def _set_waits(txn: _Txn, waits: dict[_Txn, str]) -> None:
    """Replace ``txn``'s wait edges, keeping the reverse index ``blocked`` in step.  Caller holds the graph
    mutex."""
    old = txn.waits
    for target in old:
        if target not in waits:
            target.blocked.discard(txn)  # type: ignore[union-attr]  # Invariant: txn in target.blocked
    for target in waits:
        if target not in old:
            blocked = target.blocked
            if blocked is None:
                target.blocked = {txn}
            else:
                blocked.add(txn)
    txn.waits = waits


def _hold(lock: _Lock, txn: _Txn, target: Mode) -> None:
    if txn not in lock.held:
        with txn.mutex:
            txn.locks[lock.resource] = lock
            txn.holding[lock.resource] = lock
    lock.held[txn] = target


def _retain_entry(lock: _Lock, txn: _Txn) -> None:
    """``txn`` stops holding ``lock`` and retains the mode it held (joined with what it retained)."""
    mode = lock.held.pop(txn, None)
    if mode is None:
        return
    retained = lock.retained
    if retained is None:
        retained = lock.retained = {}
    previous = retained.get(txn)
    retained[txn] = mode if previous is None else JOIN[previous][mode]


def _release(lock: _Lock, txn: _Txn) -> None:
    """Rules 3 and 4: drop everything ``txn`` holds or retains on ``lock``."""
    lock.held.pop(txn, None)
    retained = lock.retained
    if retained is not None:
        retained.pop(txn, None)
        if not retained:
            lock.retained = None
    _discard_if_empty(lock)


def _release_all(locks: dict[Hashable, _Lock], txn: _Txn) -> list[_Lock]:
    """Release ``txn``'s entries in every lock of ``locks`` that has no waiters, each under its stripe mutex
    only (no wait edge depends on a lock without waiters).  Returns the locks with waiters, which the
    caller must release with the graph mutex held and then regrant.  (``_release`` and ``_discard_if_empty``,
    inlined: this loop is the release half of every acquire+release pair, and of every lock a lazily run
    savepoint had retained in its parent's name.)"""
    deferred = []
    for resource, lock in locks.items():
        mutex = lock.stripe.mutex
        mutex.acquire()
        try:
            if lock.waiters is None:
                held = lock.held
                held.pop(txn, None)
                retained = lock.retained
                if retained is not None:
                    retained.pop(txn, None)
                    if not retained:
                        lock.retained = retained = None
                if not held and retained is None:
                    stripe = lock.stripe
                    del stripe.locks[resource]  # listed in txn.locks => still in the table (invariant)
                    free = stripe.free
                    if len(free) < _FREE_LOCKS_PER_STRIPE:
                        free.append(lock)
            else:
                deferred.append(lock)
        finally:
            mutex.release()
    return deferred


def _release_entries(locks: dict[Hashable, _Lock], txn: _Txn, members: list[_Txn],
                     deferred: "dict[_Lock, list[_Txn]] | None" = None) -> "dict[_Lock, list[_Txn]]":
    """Rules 3 and 4 for a subtree: release ``txn``'s entries (in ``locks``, its list taken from it) and
    those of its committed ``members`` (each list taken under the member's mutex), lock by lock without the
    graph mutex where nobody waits.  Returns ``deferred``: each lock with waiters and whose entries on it to release,
    for ``WaitQueues.release_deferred`` (``_queues``)."""
    if deferred is None:
        deferred = {}
    for lock in _release_all(locks, txn):
        deferred.setdefault(lock, []).append(txn)
    for member in members:
        mutex = member.mutex
        mutex.acquire()  # a fold may be dropping a listing (its owner was ACTIVE when it looked)
        try:
            listed = member.locks
            member.locks = _NO_HOLDS
        finally:
            mutex.release()
        if listed:
            for lock in _release_all(listed, member):
                deferred.setdefault(lock, []).append(member)
    return deferred


def _fast_grant(stripe: "_Stripe", txn: _Txn, resource: Hashable, mode: Mode) -> bool:
    """The uncontended path of every acquire: grant ``mode`` at once if nobody waits for
    ``resource`` and Rule 1 allows it, under the stripe mutex only (and ``txn``'s, for a new
    entry).  False sends the caller to the slow path, which queues, waits or refuses."""
    mutex = stripe.mutex
    mutex.acquire()
    try:
        lock = stripe.locks.get(resource)
        if lock is None:
            txn_mutex = txn.mutex
            txn_mutex.acquire()
            try:
                if txn.state is not ACTIVE:
                    return False
                free = stripe.free
                if free:
                    lock = free.pop()
                    lock.resource = resource
                else:
                    lock = _Lock(resource, stripe)
                lock.held[txn] = mode
                stripe.locks[resource] = lock
                txn.locks[resource] = lock
                txn.holding[resource] = lock
                return True
            finally:
                txn_mutex.release()
        return lock.waiters is None and _grant_if_compatible(txn, lock, mode)
    finally:
        mutex.release()


def _downgrade(lock: _Lock, txn: _Txn, mode: Mode) -> None:
    held_mode = lock.held.get(txn)
    if held_mode is None:
        raise LockNotHeld(txn.tid, lock.resource)
    if held_mode is mode or not COVERS[held_mode][mode]:
        raise InvalidDowngrade(txn.tid, lock.resource, held_mode, mode)
    lock.held[txn] = mode
    if lock.retained is None:
        lock.retained = {}
    previous = lock.retained.get(txn)
    lock.retained[txn] = held_mode if previous is None else JOIN[previous][held_mode]


def _discard_if_empty(lock: _Lock) -> None:
    if not lock.held and not lock.retained and lock.waiters is None:
        stripe = lock.stripe
        table = stripe.locks
        if table.get(lock.resource) is lock:
            del table[lock.resource]
            lock.retained = None
            if len(stripe.free) < _FREE_LOCKS_PER_STRIPE:
                stripe.free.append(lock)


def _resource_count(txn: _Txn) -> int:
    """How many resources ``txn`` holds or retains, its committed members' entries included.  Caller holds
    the graph mutex (deadlock resolution only: it walks the committed members)."""
    with txn.mutex:
        resources = set(txn.locks)
    for member in _committed_members(txn):
        with member.mutex:
            resources.update(member.locks)
    return len(resources)
