"""The lock manager's records (``_Txn``, ``_Lock``, ``_Stripe``, ``_Request``) and the two walks over the
transaction tree every other module needs: ``_owner_of`` (lazy Rule 2) and ``_committed_members``.
Invariants and the mutex each field is protected by: design note §4-§6.
"""

from __future__ import annotations

import enum
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Hashable, TypeAlias

from lockmgr._modes import CONFLICTS, COVERS, JOIN, Mode
from lockmgr._records import TxnState
from lockmgr.errors import Lazy, AbortedTransaction, TransactionNotActive, UnknownTransaction

if TYPE_CHECKING:
    from lockmgr._manager import ExternalWait

#: New wait edges to check for a deadlock (``LockManager._resolve``): the lock request or registered wait
#: that has them, and their targets.
EdgeEvent: TypeAlias = "tuple[_Request | ExternalWait, list[_Txn]]"
#: A savepoint's grant (``LockManager.try_retain``): resource, the mode granted, and what the transaction retained
#: there before (a mode, None: nothing, or ``UNCHANGED``: the grant changed nothing).
Grant: TypeAlias = "tuple[Hashable, Mode, Mode | str | None]"

ACTIVE = TxnState.ACTIVE
COMMITTING = TxnState.COMMITTING
COMMITTED = TxnState.COMMITTED
ABORTED = TxnState.ABORTED


class _RequestStatus(enum.Enum):
    """A queued request's state.  WAITING -> GRANTED | VICTIM | TIMED_OUT | ABORTED, exactly once, with the
    graph mutex held (``WaitQueues.dequeue`` is the only place that leaves WAITING)."""

    WAITING = "waiting"
    GRANTED = "granted"
    VICTIM = "victim"
    TIMED_OUT = "timed out"
    ABORTED = "aborted"


WAITING = _RequestStatus.WAITING
GRANTED = _RequestStatus.GRANTED
VICTIM = _RequestStatus.VICTIM
TIMED_OUT = _RequestStatus.TIMED_OUT
WITHDRAWN_BY_ABORT = _RequestStatus.ABORTED

_NO_WAITS: dict[_Txn, str] = {}  # shared "no out-edges" value; never mutated (waits are replaced, not edited)
# What a committed subtransaction keeps of the fields it no longer needs (shared, never mutated): its record
# lives on until its tree ends, and the fewer objects it holds the less the cyclic GC has to scan.
_NO_HOLDS: dict[Hashable, _Lock] = {}
_NO_CHILDREN: frozenset[_Txn] = frozenset()


def _check_joins_conflict_as_their_parts() -> None:
    """One mode per transaction and resource (the join of what it acquired, inherited or kept) is exact only
    if a join conflicts with exactly the modes one of its parts conflicts with.  Lazy inheritance relies on
    it too: Rule 1 checks a committed member's entry on its own until a fold joins it into its owner's, and
    both must decide alike.  Checked at import, like the table itself in ``_modes``."""
    for first in Mode:
        for second in Mode:
            for wanted in Mode:
                joined = CONFLICTS[JOIN[first][second]][wanted]
                assert joined == (CONFLICTS[first][wanted] or CONFLICTS[second][wanted]), (
                    f"{JOIN[first][second].name} = join({first.name}, {second.name}) conflicts with "
                    f"{wanted.name} differently from its parts: lockmgr keeps one joined mode per transaction "
                    f"and resource, which needs the conflict set of a join to be the union of its parts'")


_check_joins_conflict_as_their_parts()


class _Txn:
    """One transaction.  Not thread-safe by itself: each field names the mutex that guards it.

    A record outlives its commit while its tree runs: a committed subtransaction keeps its lock entries
    (lazy Rule 2, see ``owner``) until the top-level commit or an abort releases them."""

    __slots__ = (
        "tid", "parent", "serial", "depth", "ancestors",
        "children", "state", "locks", "holding", "mutex", "waits", "request", "external", "awaited",
        "owner", "committed", "blocked",
    )

    def __init__(self, tid: Hashable, parent: "_Txn | None", serial: int, awaited: bool = False) -> None:
        self.tid = tid
        self.parent = parent  # immutable
        self.serial = serial  # immutable; begin order, larger is younger
        if parent is None:
            self.depth = 0
            self.ancestors: frozenset[_Txn] = frozenset()
        else:
            self.depth = parent.depth + 1
            # Excludes self.  Immutable while self is ACTIVE; emptied when it commits (nobody reads them then).
            self.ancestors = parent.ancestors | {parent}
        # Guarded by the graph mutex.  Invariant: exactly the children whose state is ACTIVE (a child leaves
        # when it commits or aborts); these are the "commit" edges.  A shared empty set once self commits.
        self.children: set[_Txn] = set()
        # Written with the graph mutex AND self.mutex held; read under either (or racily, as a hint).
        self.state = ACTIVE
        # Guarded by self.mutex.  resource -> _Lock: the locks of self's own entries.  Invariant: self has a
        # held or retained entry in every lock listed here (so a listed lock is in its stripe's table) --
        # except for a moment in a committed subtransaction: a fold moves its entry to its owner, then drops
        # the listing; a release that took the list in between finds no entry and does nothing.  After self
        # commits only a fold changes it.
        self.locks: dict[Hashable, _Lock] = {}
        # Guarded by self.mutex.  resource -> _Lock.  Invariant: while self is ACTIVE, exactly the locks in
        # which self has a held entry (a subset of ``locks``); ``retain`` converts them in place without
        # looking at the others.  Emptied when self commits or aborts.
        self.holding: dict[Hashable, _Lock] = {}
        self.mutex = threading.Lock()  # protects state, locks and holding
        # Guarded by the graph mutex.  Out-edges for the pending request: target _Txn -> kind.
        # Invariant: non-empty iff request is not None (a waiting request always has a blocker); every
        # target is an owner (``_owner_of(target) is target``: never a committed subtransaction).
        self.waits: dict[_Txn, str] = _NO_WAITS
        self.request: _Request | None = None  # guarded by the graph mutex; the WAITING request, if any
        # Guarded by the graph mutex: the registered waits (add_wait) that are not lock waits, each with
        # out-edges ``targets``.  Replaced whole, never mutated in place (find_cycle iterates it).
        self.external: tuple[ExternalWait, ...] = ()
        # Immutable.  True: the parent waits for this child for its whole life (it runs inline in the
        # parent's thread), so with declared commit edges "parent -> self" is an edge of the graph.
        self.awaited = awaited
        # Lazy Rule 2 (a union-find forest over the tree).  ``owner is self`` unless self is a committed
        # subtransaction; then it is an ancestor ``a`` of self such that every transaction strictly between
        # self and ``a`` is a committed subtransaction too.  ``_owner_of`` follows the links to the first
        # transaction that is not a committed subtransaction -- the one that retains self's entries now --
        # and compresses the path.  Written to self's parent by ``commit`` (graph mutex), shortened by any
        # thread that resolves it (an attribute store; every value ever written satisfies the invariant).
        self.owner: _Txn = self
        # Guarded by the graph mutex until self ends, then immutable.  The committed children whose entries
        # self's subtree owns (each with its own ``committed``): what the top-level commit or an abort of
        # self or an ancestor must also release.  A child that locked nothing and owns nothing is left out.
        self.committed: list[_Txn] | None = None
        # Guarded by the graph mutex.  The waiting transactions whose ``waits`` name self -- the reverse of
        # those edges, so that a commit re-evaluates exactly the requests it redirects.
        # Invariant: ``waiter in self.blocked`` iff ``self in waiter.waits``.
        self.blocked: set[_Txn] | None = None

    def __repr__(self) -> str:
        return f"<txn {self.tid!r} {self.state.value}>"


class _Lock:
    """The lock-table entry of one resource.  Every field is guarded by ``stripe.mutex``; while ``waiters`` is
    not None, changes to ``held``, ``retained`` and ``waiters`` additionally need the graph mutex.

    Entries are keyed by the transaction that made them, which may since have committed as a subtransaction
    (lazy Rule 2): an entry of ``x`` *counts as* held by ``x`` if it is in ``held`` and ``_owner_of(x) is x``,
    and otherwise as retained by ``_owner_of(x)`` (a committed subtransaction's held entry included).  What
    the entries count as is exactly what eager inheritance would have stored (one mode per owner: the join).

    Invariants (with the stripe mutex held):
      * the modes of two entries that count as held by different transactions never conflict;
      * if an entry of ``x`` conflicts with an entry that counts as held by ``h``, ``x is not h`` and
        ``o = _owner_of(x)`` is not ``h``, then ``o`` is an ancestor of ``h``;
      * the entry is in ``stripe.locks`` iff ``held`` or ``retained`` or ``waiters`` is non-empty;
      * ``waiters`` is None or a non-empty FIFO list of WAITING requests.
    """

    __slots__ = ("resource", "stripe", "held", "retained", "waiters")

    def __init__(self, resource: Hashable, stripe: "_Stripe") -> None:
        self.resource = resource
        self.stripe = stripe
        self.held: dict[_Txn, Mode] = {}  # holder -> the one mode it holds (join of what it acquired)
        self.retained: dict[_Txn, Mode] | None = None  # retainer -> the one mode it retains (join)
        self.waiters: list[_Request] | None = None


class _Stripe:
    """One partition of the lock table (resources are spread over stripes by hash).  Every field is guarded
    by ``mutex``; see lockmgr/README.md for the order in which mutexes may be taken."""

    __slots__ = ("mutex", "locks", "free", "folded")

    def __init__(self) -> None:
        self.mutex = threading.Lock()  # protects `locks`, `free`, `folded` and every field of its _Lock objects
        self.locks: dict[Hashable, _Lock] = {}
        self.folded = 0  # entries of committed subtransactions merged into their owner's here (``_fold``)
        # Empty _Lock objects of this stripe for reuse (creating one is a fifth of an uncontended
        # acquire+release).  Safe because nothing refers to a discarded entry: a transaction lists only
        # locks it has an entry in, and a request refers to its lock only while it waits.
        self.free: list[_Lock] = []


def _lock_entry(stripe: _Stripe, resource: Hashable) -> _Lock:
    """The entry of ``resource`` in ``stripe``; if it has none, an empty one (reused if possible), inserted.
    Caller holds ``stripe.mutex``."""
    lock = stripe.locks.get(resource)
    return lock if lock is not None else _new_lock_entry(stripe, resource)


def _new_lock_entry(stripe: _Stripe, resource: Hashable) -> _Lock:
    """An empty entry of ``resource`` (reused from ``stripe.free`` if possible), inserted; for a caller that found
    none.  Caller holds ``stripe.mutex``."""
    lock = stripe.free.pop() if stripe.free else _Lock(resource, stripe)
    lock.resource = resource
    stripe.locks[resource] = lock
    return lock


def _covered(lock: _Lock, txn: _Txn, mode: Mode) -> bool:
    """Whether ``txn`` holds ``lock`` already in a mode that covers ``mode``.  Caller holds the stripe's mutex."""
    current = lock.held.get(txn)
    return current is not None and COVERS[current][mode]


class _Request:
    """A lock request that had to go through the slow path.  Guarded by the graph mutex (and, while queued,
    also by its lock's stripe mutex for ``target``)."""

    __slots__ = ("txn", "lock", "mode", "target", "status", "error", "condition", "jumped")

    def __init__(self, txn: _Txn, lock: _Lock, mode: Mode) -> None:
        self.txn = txn
        self.lock = lock
        self.mode = mode
        self.target = mode  # the mode it would hold if granted: join(current held mode, mode)
        self.status = WAITING
        self.error: BaseException | None = None
        self.condition: threading.Condition | None = None  # on the graph mutex; created when it waits
        self.jumped = False  # True: exempt from queueing behind earlier requests (set to break a cycle)


def _owner_of(txn: _Txn) -> _Txn:
    """The transaction whose entries ``txn``'s entries count as now: ``txn`` unless it is a committed
    subtransaction, else the nearest ancestor that is not one (the one that would retain them after
    eager inheritance).  Follows the ``owner`` links and points every link on the way at the result.

    Safe with only a stripe mutex held (or none): links only ever move up the chain of committed ancestors
    and every value stored is valid.  Without the graph mutex the answer may be stale -- a descendant of
    the true owner, because the owner committed meanwhile -- never an ancestor of it; and a result that is
    an ancestor-or-self of an active transaction cannot be stale (it cannot commit before it)."""
    owner = txn.owner
    if owner is txn:
        return txn
    following = owner.owner
    if following is owner:
        return owner
    path = [txn]
    while following is not owner:
        path.append(owner)
        owner = following
        following = owner.owner
    for member in path:  # path compression: each of them is a committed descendant of owner
        member.owner = owner
    return owner


def _committed_members(txn: _Txn) -> list[_Txn]:
    """Every committed descendant whose entries ``txn``'s subtree owns (the ``committed`` lists, walked).
    Caller holds the graph mutex, or ``txn``'s subtree has no active member left."""
    committed = txn.committed
    if not committed:
        return []
    members: list[_Txn] = []
    stack = list(committed)
    while stack:
        member = stack.pop()
        members.append(member)
        if member.committed:
            stack.extend(member.committed)
    return members


class EndedLog:
    """The last ``size`` ended transactions (tid -> (state, detail)), only to explain why a tid is refused.
    Guarded by the manager's graph mutex."""

    __slots__ = ("ended", "size")

    def __init__(self, size: int) -> None:
        self.ended: OrderedDict[Hashable, tuple[str, Lazy]] = OrderedDict()
        self.size = size

    def remember(self, tid: Hashable, state: str, detail: Lazy) -> None:
        self.ended[tid] = (state, detail)
        if len(self.ended) > self.size:
            self.ended.popitem(last=False)

    def forget(self, tid: Hashable) -> None:
        self.ended.pop(tid, None)

    def require_active(self, active: dict[Hashable, _Txn], tid: Hashable, operation: "str | Lazy") -> _Txn:
        """``active[tid]`` if it is ACTIVE; else raise why not (not active, aborted, or unknown)."""
        txn = active.get(tid)
        if txn is not None:
            if txn.state is ACTIVE:
                return txn
            raise TransactionNotActive(tid, txn.state.value, operation)
        ended = self.ended.get(tid)
        if ended is None:
            raise UnknownTransaction(tid)
        state, detail = ended
        if state == "aborted":
            raise AbortedTransaction(tid, operation, detail)
        raise TransactionNotActive(tid, state, operation, detail)
