"""lockmgr — Härder–Rothermel locking for parallel nested transactions, with deadlock detection.

It imports nothing else of this project (networkx only for ``wait_for_graph``).  The design note, with an
example, the five rules, the conflict table, the invariants and the mutex order: ``lockmgr/README.md``.
"""

from lockmgr._entries import UNCHANGED, fold_grants
from lockmgr._graph import GraphNode, find_cycle
from lockmgr._deadlock import VICTIM_POLICIES, VictimPolicy
from lockmgr._manager import CommitEdges, ExternalWait, LockManager, VictimChooser
from lockmgr._modes import Mode, conflicts, covers, join
from lockmgr._table import Grant
from lockmgr._records import (DeadlockCycle, Holders, LockStatistics, LockTableSnapshot, TransactionInfo, TxnState,
                              VictimCandidate, WaitingRequest)
from lockmgr.errors import (AbortedTransaction, ActiveChildren, Deadlock, DuplicateTransaction, ErrorClasses,
                            InvalidDowngrade, LockError, LockNotHeld, LockTimeout, RequestPending, TransactionNotActive,
                            UnknownTransaction, WaitEdge, WaitForItself)

__all__ = [
    "LockManager", "ExternalWait", "Mode", "Deadlock", "LockTimeout", "find_cycle", "GraphNode",
    "VICTIM_POLICIES", "VictimPolicy", "VictimChooser", "CommitEdges", "ErrorClasses", "UNCHANGED", "Grant", "fold_grants", "conflicts", "covers", "join",
    "DeadlockCycle", "Holders", "LockStatistics", "LockTableSnapshot", "TransactionInfo", "TxnState",
    "VictimCandidate", "WaitingRequest", "WaitEdge",
    "LockError", "ActiveChildren", "DuplicateTransaction", "InvalidDowngrade", "LockNotHeld",
    "RequestPending", "AbortedTransaction", "TransactionNotActive", "UnknownTransaction", "WaitForItself",
]
