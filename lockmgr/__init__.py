"""lockmgr — Härder–Rothermel locking for parallel nested transactions, with deadlock detection.

Usable on its own (it imports nothing else of this project; networkx only for ``wait_for_graph``)::

    from lockmgr import LockManager, Mode, Deadlock, LockTimeout

    lm = LockManager()                          # victim_policy="requester" | "youngest" | "smallest_tree" | callable
    lm.begin("T"); lm.begin("T.1", parent="T")  # a top-level transaction and a subtransaction
    lm.acquire_tuple("T.1", "accounts", 7, Mode.WRITE)   # IW on the table, WRITE on ("accounts", 7)
    lm.commit("T.1")                            # T inherits and retains T.1's locks (Rule 2)
    lm.commit("T")                              # releases everything (Rule 3)

The design note -- the five rules, the conflict table, the wait-for graph, the invariants, the mutex
order, the fairness and victim policies -- is ``lockmgr/README.md``.
"""

from lockmgr._entries import UNCHANGED
from lockmgr._graph import GraphNode, find_cycle
from lockmgr._manager import VICTIM_POLICIES, ExternalWait, LockManager
from lockmgr._modes import Mode, conflicts, covers, join
from lockmgr._records import (
    DeadlockCycle,
    Holders,
    LockStatistics,
    LockTableSnapshot,
    TransactionInfo,
    TxnState,
    VictimCandidate,
    WaitingRequest,
)
from lockmgr.errors import (
    ActiveChildren,
    Deadlock,
    DuplicateTransaction,
    InvalidDowngrade,
    LockError,
    LockNotHeld,
    LockTimeout,
    RequestPending,
    AbortedTransaction,
    TransactionNotActive,
    UnknownTransaction,
    WaitEdge,
)

__all__ = [
    "LockManager", "ExternalWait", "Mode", "Deadlock", "LockTimeout", "find_cycle", "GraphNode",
    "VICTIM_POLICIES", "UNCHANGED", "conflicts", "covers", "join",
    "DeadlockCycle", "Holders", "LockStatistics", "LockTableSnapshot", "TransactionInfo", "TxnState",
    "VictimCandidate", "WaitingRequest", "WaitEdge",
    "LockError", "ActiveChildren", "DuplicateTransaction", "InvalidDowngrade", "LockNotHeld",
    "RequestPending", "AbortedTransaction", "TransactionNotActive", "UnknownTransaction",
]
