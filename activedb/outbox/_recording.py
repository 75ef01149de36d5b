"""Recording detached-family firings in the flush of their trigger's tree (:class:`TreeFirings`, one commit
participant per tree).  Design note: the package's ``README.md`` ("The life of a firing", "Replayed
attempts").

Thread-safety: ``TreeFirings.mutex`` protects its entry list (firings occur on any thread of the tree);
the decision and the SQL run in the committing thread after every node of the tree ended.
"""

from __future__ import annotations

import threading
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, NamedTuple

from coupling import Coupling, may_run_after
from lockmgr import TxnState

from activedb.errors import OutboxError
from activedb.events import EventKind
from activedb.outbox._records import NewRecord, encode_event
from activedb.txn import CommitParticipant, outcome_unknown

if TYPE_CHECKING:  # pragma: no cover
    import sqlalchemy as sa

    from activedb.outbox._outbox import Outbox
    from activedb.rules import Firing
    from activedb.txn import Transaction

_COMMITTED = TxnState.COMMITTED


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
        if node.state is not _COMMITTED:
            return False
        node = node.parent  # type: ignore[assignment]  # (below root: a parent)
    return True


# ``may_run_after``'s answers for the detached family by the trigger's outcome (``RUNS_IF[committed]``): a tuple's
# ``in`` per firing at each flush, without a call (nor an enum's hash) each.
RUNS_IF = tuple(tuple(mode for mode in Coupling if not mode.runs_as_subtransaction and may_run_after(mode, outcome))
                for outcome in (False, True))


def requires_commit(firing: "Firing", trigger: "Transaction | Decided") -> bool:
    """A firing on a top-level transaction's own ``committed`` event: it exists only if that commit happens."""
    return not isinstance(trigger, Decided) and trigger.parent is None and firing.event.kind is EventKind.COMMITTED


class Decided(NamedTuple):
    """The trigger of a firing whose outcome was decided before the firing was recorded: an event of a batch run at
    commit, which has no transaction of its own (``id``: the batch's), ``committed`` unless the batch rejected it."""

    id: str
    committed: bool


class Unsettled(NamedTuple):
    """A tree whose commit outcome a lost connection hid (README, "The outcome is unknown"): what its firings become
    once its transaction-log row (``log_id``) can be read.  Committed: the records its flush ``written``,
    ``(record id, firing)``, run (and ``cancelled_if_committed`` count as cancelled); not: ``keep``, the items its
    abort records (``Outbox.record_now``'s), are recorded and run (and ``cancelled_if_aborted`` count)."""

    log_id: str
    written: list[tuple[int, "Firing"]]
    cancelled_if_committed: list["Firing"]
    keep: list[tuple["Firing", str, str | None, bool]]
    cancelled_if_aborted: list["Firing"]


class TreeFirings(CommitParticipant):
    """The detached-family firings of one tree, recorded in its flush (see the module docstring).  ``entries``:
    ``(firing, trigger)`` in the order they occurred, appended under ``mutex`` (``Outbox.record``)."""

    def __init__(self, outbox: "Outbox", state: TreeState):
        self._outbox = outbox
        self._state = state
        self.mutex = threading.Lock()         # protects entries
        self.entries: list[tuple[Firing, Transaction | Decided]] = []
        self._seen = 0                        # entries decided in before_flush; later ones (Decided) in write
        self._early: tuple[list[NewRecord], int, list[Firing], list[Firing]] = ([], 0, [], [])
        self._records: list[NewRecord] = []
        self._recorded: list[Firing] = []     # the firings behind _records, same order
        self._cancelled: list[Firing] = []
        self._ran: set[int] = set()           # ids of the decided firings the batch ran in its commit (``set_decided``)

    # --- the commit participant -----------------------------------------------------------------

    def set_decided(self, items: list[tuple["Firing", str, bool]],
                    ran: Collection[tuple["Firing", str, bool]] = ()) -> None:
        """Firings whose triggers' outcomes are already decided, ``(firing, trigger id, committed)``, given before
        this participant's ``write`` (by a participant enlisted before it, in its own ``write``): decided and recorded
        there.  They replace those given before: a flush retried after a conflict writes again, each attempt
        giving its own.  ``ran``: those the caller ran in the commit itself (a lowered batch: "Detached firings that
        only insert") — not recorded in ``write``, but handled as the others if the root aborts (their rows went
        with it)."""
        with self.mutex:
            del self.entries[self._seen:]
            triggers: dict[tuple[str, bool], Decided] = {}      # (one per trigger and outcome: a batch has two)
            for firing, trigger_id, committed in items:
                trigger = triggers.get((trigger_id, committed))
                if trigger is None:
                    trigger = triggers[trigger_id, committed] = Decided(trigger_id, committed)
                self.entries.append((firing, trigger))
            self._ran = {id(firing) for firing, _, _ in ran}

    def before_flush(self, transaction: "Transaction") -> None:
        with self.mutex:
            entries = list(self.entries)
        self._seen = len(entries)
        self._early = self._decide(transaction, entries)
        self._records, _, self._recorded, self._cancelled = self._early

    def _decide(self, transaction: "Transaction", entries: list[tuple["Firing", "Transaction | Decided"]]
                ) -> tuple[list[NewRecord], int, list["Firing"], list["Firing"]]:
        """The records of ``entries`` the modes allow on their triggers' effective outcomes (their ids drawn), the
        storage of those ids, the firings recorded, and those cancelled."""
        recorded: list[tuple[Firing, Transaction | Decided, bool]] = []
        cancelled: list[Firing] = []
        if_aborted, if_committed = RUNS_IF
        for firing, trigger in entries:
            if isinstance(trigger, Decided):
                committed = trigger.committed
            elif trigger.parent is transaction:    # (effectively_committed's common case, without its call)
                committed = trigger.state is _COMMITTED
            else:
                committed = effectively_committed(trigger, transaction)
            if firing.coupling in (if_committed if committed else if_aborted):
                recorded.append((firing, trigger, committed))
            else:
                cancelled.append(firing)
        ids, storage = self._outbox.draw_ids(len(recorded), transaction.began_at) if recorded else ([], 0)
        log_id = transaction.log_id
        return ([new_record(record_id, firing, trigger.id, log_id, committed)
                 for record_id, (firing, trigger, committed) in zip(ids, recorded)], storage,
                [firing for firing, _, _ in recorded], cancelled)

    def write(self, transaction: "Transaction", connection: "sa.Connection") -> None:
        records, storage, recorded, cancelled = self._early
        self._outbox.insert(connection, records, storage)
        with self.mutex:
            late = self.entries[self._seen:]
            if self._ran:
                late = [entry for entry in late if id(entry[0]) not in self._ran]
        if late:        # (decided firings a batch gave in its write, before this one: ``set_decided``)
            more, more_storage, more_recorded, more_cancelled = self._decide(transaction, late)
            self._outbox.insert(connection, more, more_storage)
            records, recorded, cancelled = records + more, recorded + more_recorded, cancelled + more_cancelled
        self._records, self._recorded, self._cancelled = records, recorded, cancelled

    def committed(self, transaction: "Transaction") -> None:
        self._outbox.count(self._cancelled, "cancelled")
        self._outbox.run_recorded([(record.id, firing, 0) for record, firing in zip(self._records, self._recorded)])
        self._forget()

    def _forget(self) -> None:
        """The tree's outcome is told: its entries go now.  (Each holds its trigger, a node of the tree;
        a root refers to itself, so what it keeps would wait for the cyclic collector — a batch of events
        keeps thousands of nodes.)"""
        with self.mutex:
            self.entries = []
        self._records, self._recorded, self._cancelled = [], [], []

    def aborted(self, transaction: "Transaction", error: BaseException | None) -> None:
        with self.mutex:
            entries, self.entries = self.entries, []
        if transaction.parent is not None:
            # A recorder of decided firings (``Outbox.decided``) whose subtransaction aborted, its tree alive or
            # aborting: what it was given (a lowered batch's firings, each trigger aborted) is the tree's to decide
            # at its end, as the firings on an aborted subtransaction's events are.
            if entries:
                self._outbox.to_tree(transaction.root, entries)
            return
        # What the flush's last write inserted: committed after all if the outcome is unknown (below).
        written = [(record.id, firing) for record, firing in zip(self._records, self._recorded)]
        cancelled_if_committed = self._cancelled
        state = self._state
        with state.mutex:
            state.aborted, state.abort_error = True, error
            replayed = state.replayed()
        self._forget()
        keep: list[tuple[Firing, str, str | None, bool]] = []
        cancelled: list[Firing] = []
        for firing, trigger in entries:
            # (Replayed: the owner re-runs the same input — as after a crash, the attempt leaves nothing; its firings,
            # fired, are cancelled by the abort, as the tree's immediate and deferred ones are.)
            if not replayed and firing.coupling in RUNS_IF[False] and not requires_commit(firing, trigger):
                keep.append((firing, trigger.id, None, False))
            else:
                cancelled.append(firing)
        if outcome_unknown(transaction):
            # The connection broke at the flush and the log could not be read: PostgreSQL may have committed the
            # tree, records included.  Its log row decides, once it can be read (README, "The outcome is unknown").
            self._outbox.settle_later(Unsettled(transaction.log_id, written, cancelled_if_committed, keep, cancelled))
            return
        self._outbox.count(cancelled, "cancelled")
        self._outbox.record_now(keep)


def new_record(record_id: int, firing: "Firing", trigger_id: str, log_id: str | None, committed: bool) -> NewRecord:
    """The outbox record of ``firing``, whose trigger ``trigger_id`` (of the tree logged as ``log_id``)
    committed or not; :class:`OutboxError` if its event holds a value the record cannot keep."""
    try:
        event = encode_event(firing.event)
    except Exception as error:     # (exact_json pickles what JSON cannot hold: pickle's TypeError, PicklingError, …)
        raise OutboxError(
            f"detached rule {firing.rule.name!r} fired on {firing.event.describe()}, whose values the outbox cannot "
            f"keep ({type(error).__name__}: {error}): the event of a detached-family firing is recorded exactly in "
            f"PostgreSQL — give it JSON values, datetimes, decimals, bytes, tuples, sets, UUIDs or other picklable "
            f"values (an id rather than a lock, a connection or a function)") from error
    return NewRecord(record_id, firing.rule.name, firing.coupling.value, event,
                     list(firing.chain), trigger_id, log_id, "committed" if committed else "aborted")
