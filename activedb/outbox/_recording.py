"""Recording detached-family firings in the flush of their trigger's tree (:class:`TreeFirings`, one commit
participant per tree).  Design note: the package's ``README.md`` ("The life of a firing", "Replayed
attempts").

Thread-safety: ``TreeFirings._mutex`` protects its entry list (firings occur on any thread of the tree);
the decision and the SQL run in the committing thread after every node of the tree ended.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from coupling import may_run_after
from lockmgr import TxnState

from activedb.outbox._records import NewRecord, encode_event
from activedb.txn import CommitParticipant

if TYPE_CHECKING:  # pragma: no cover
    import sqlalchemy as sa

    from activedb.outbox._outbox import Outbox
    from activedb.rules import Firing
    from activedb.txn import Transaction


@dataclass(eq=False, slots=True)
class Entry:
    """A firing kept on its tree until the tree's outcome is known."""

    firing: "Firing"
    trigger: "Transaction"
    requires_commit: bool = False     # a firing on the root's own ``committed`` event


@dataclass(eq=False)
class TreeState:
    """The outbox's per-tree state (``lowlevel.slot(root, TreeState)``): the participant, and whether an abort of
    the tree is an outcome.  ``mutex`` protects every field."""

    mutex: threading.Lock = field(default_factory=threading.Lock)
    participant: TreeFirings | None = None
    # Set by Outbox.mark_replayed: which abort reasons the tree's owner answers with a re-run of the
    # same input (None: the tree's abort is an outcome).
    replay_when: Callable[[BaseException | None], bool] | None = None
    aborted: bool = False        # the participant heard the abort (None enlisted: nothing heard)
    abort_error: BaseException | None = None

    def replayed(self) -> bool:
        """The tree aborted and its owner re-runs it: the abort is not an outcome.  Caller holds ``mutex``.
        A tree that enlisted no participant heard no reason: only a policy accepting any (``always``) holds."""
        when = self.replay_when
        if when is None:
            return False
        if self.aborted:
            return bool(when(self.abort_error))
        return self.participant is None and when is always


def always(_: BaseException | None) -> bool:
    """The replay policy that accepts any abort."""
    return True


def effectively_committed(trigger: "Transaction", root: "Transaction") -> bool:
    """At ``root``'s flush (every node ended): did ``trigger`` and each ancestor below the root commit?"""
    node = trigger
    while node is not root:
        if node.state is not TxnState.COMMITTED:
            return False
        node = node.parent  # type: ignore[assignment]  # (below root: a parent)
    return True


class TreeFirings(CommitParticipant):
    """The detached-family firings of one tree, recorded in its flush (see the module docstring)."""

    def __init__(self, outbox: "Outbox", state: TreeState):
        self._outbox = outbox
        self._state = state
        self._mutex = threading.Lock()        # protects _entries
        self._entries: list[Entry] = []
        self._records: list[NewRecord] = []
        self._storage = 0                     # of the sequence that gave the records' ids
        self._recorded: list[Entry] = []      # the entries behind _records, same order
        self._cancelled: list[Entry] = []

    def add(self, entry: Entry) -> None:
        with self._mutex:
            self._entries.append(entry)

    # --- the commit participant -----------------------------------------------------------------

    def before_flush(self, transaction: "Transaction") -> None:
        with self._mutex:
            entries = list(self._entries)
        recorded: list[tuple[Entry, bool]] = []
        cancelled: list[tuple[Entry, bool]] = []
        for entry in entries:
            committed = entry.requires_commit or effectively_committed(entry.trigger, transaction)
            (recorded if may_run_after(entry.firing.coupling, committed) else cancelled).append((entry, committed))
        ids, self._storage = self._outbox.draw_ids(len(recorded), transaction.began_at) if recorded else ([], 0)
        log_id = transaction.log_id
        self._records = [new_record(record_id, entry.firing, entry.trigger.id, log_id, committed)
                         for record_id, (entry, committed) in zip(ids, recorded)]
        self._recorded = [entry for entry, _ in recorded]
        self._cancelled = [entry for entry, _ in cancelled]

    def write(self, transaction: "Transaction", connection: "sa.Connection") -> None:
        self._outbox.insert(connection, self._records, self._storage)

    def committed(self, transaction: "Transaction") -> None:
        self._outbox.count_cancelled(self._cancelled)
        self._outbox.run_recorded([(record.id, entry.firing, 0) for record, entry in zip(self._records,
                                                                                           self._recorded)])
        self._forget()

    def _forget(self) -> None:
        """The tree's outcome is told: its entries go now.  (Each holds its trigger, a node of the tree;
        a root refers to itself, so what it keeps would wait for the cyclic collector — a batch of events
        keeps thousands of nodes.)"""
        with self._mutex:
            self._entries = []
        self._records, self._recorded, self._cancelled = [], [], []

    def aborted(self, transaction: "Transaction", error: BaseException | None) -> None:
        with self._mutex:
            entries, self._entries = self._entries, []
        state = self._state
        with state.mutex:
            state.aborted, state.abort_error = True, error
            replayed = state.replayed()
        self._forget()
        if replayed:
            return        # the owner re-runs the same input: as after a crash, the attempt left nothing
        keep = [entry for entry in entries
                if not entry.requires_commit and may_run_after(entry.firing.coupling, False)]
        kept = set(map(id, keep))
        self._outbox.count_cancelled([entry for entry in entries if id(entry) not in kept])
        self._outbox.record_now([(entry.firing, entry.trigger.id, None, False) for entry in keep])


def new_record(record_id: int, firing: "Firing", trigger_id: str, log_id: str | None, committed: bool) -> NewRecord:
    """The outbox record of ``firing``, whose trigger ``trigger_id`` (of the tree logged as ``log_id``)
    committed or not."""
    return NewRecord(record_id, firing.rule.name, firing.coupling.value, encode_event(firing.event),
                     list(firing.chain), trigger_id, log_id, "committed" if committed else "aborted")
