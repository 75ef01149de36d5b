"""Immutable records the lock manager hands out (statistics, holders, snapshots, deadlock cycles): frozen
dataclasses over immutable values, safe to share between threads.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Hashable, Mapping

from lockmgr._modes import Mode
from lockmgr.errors import WaitEdge


class TxnState(enum.Enum):
    """Life cycle of a transaction in the lock manager.

    ACTIVE -> COMMITTING -> COMMITTED      (top-level commit: only from ACTIVE, only without active
                                           children; COMMITTING while its tree's locks are released)
    ACTIVE -> COMMITTED                    (subtransaction commit, the same conditions: one step, since
                                           lazy inheritance touches no lock)
    ACTIVE -> ABORTED                      (abort of itself or of an ancestor)
    """

    ACTIVE = "active"
    COMMITTING = "committing"
    COMMITTED = "committed"
    ABORTED = "aborted"


_EMPTY: Mapping[Hashable, Mode] = MappingProxyType({})


@dataclass(frozen=True)
class WaitingRequest:
    """A request queued on a resource: who, the mode asked for, and whether it may jump the queue."""

    tid: Hashable
    mode: Mode
    jumped: bool = False


@dataclass(frozen=True)
class Holders:
    """Who holds, retains and waits for one resource (``LockManager.holders``)."""

    resource: Hashable
    held: Mapping[Hashable, Mode] = field(default_factory=lambda: _EMPTY)
    retained: Mapping[Hashable, Mode] = field(default_factory=lambda: _EMPTY)
    waiting: tuple[WaitingRequest, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.held or self.retained or self.waiting)


@dataclass(frozen=True)
class TransactionInfo:
    """One transaction in a snapshot."""

    tid: Hashable
    parent: Hashable | None
    state: TxnState
    serial: int


@dataclass(frozen=True)
class LockTableSnapshot:
    """A consistent picture of the whole manager, taken with every mutex held (``LockManager.snapshot``).

    ``waits[tid]`` maps each target of ``tid``'s current wait edges to ``(kind, resource)``: the edges of
    ``wait_for_graph()``, with a declared commit edge (to a child begun ``awaited=True``) as ``("commit", None)``;
    structural commit edges are not listed (they are ``parent -> child`` for every pair in ``transactions``).
    """

    transactions: Mapping[Hashable, TransactionInfo]
    resources: Mapping[Hashable, Holders]
    waits: Mapping[Hashable, Mapping[Hashable, tuple[str, Hashable | None]]]


@dataclass(frozen=True)
class LockStatistics:
    """Counters of one lock manager.  ``waiting`` is exact at the moment of the call."""

    transactions: int  #: active transactions (top-level and sub)
    locks: int  #: resources with at least one holder, retainer or waiter
    waiting: int  #: lock requests currently waiting
    begun: int  #: transactions begun since creation
    committed: int
    aborted: int
    waits: int  #: requests that had to wait
    deadlocks: int  #: cycles resolved by choosing a victim
    queue_jumps: int  #: cycles caused only by the fairness queue, resolved by letting a request go first
    timeouts: int
    #: lock entries handed from a committing subtransaction to its parent, each counted once: at the commit
    #: of the subtransaction whose entry it is (lazy inheritance: later commits pass it on untouched)
    inherited: int
    registered_waits: int = 0  #: waits registered with add_wait that are still in the graph
    #: entries of committed subtransactions merged into their owner's entry by a later request on the lock
    folded: int = 0


@dataclass(frozen=True)
class VictimCandidate:
    """A transaction on a deadlock cycle that can be told: it waits for a lock, or in a registered wait
    (``add_wait``) that can be cancelled."""

    tid: Hashable
    serial: int  #: begin order; larger is younger
    depth: int  #: 0 for a top-level transaction
    subtree_size: int  #: itself plus its active descendants (what aborting it would abort)
    locks: int  #: resources it holds or retains


@dataclass(frozen=True)
class DeadlockCycle:
    """What a victim policy sees: the cycle, the requester, and the candidates it may choose from."""

    edges: tuple[WaitEdge, ...]
    requester: Hashable
    candidates: tuple[VictimCandidate, ...] = field(default=())
