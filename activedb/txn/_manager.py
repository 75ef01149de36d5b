"""The transaction manager of one ``Database``: creates trees and owns what they share (the lock manager,
the worker pool, the read base, the hook registries, the history recorder, and per thread the stack of
transactions it runs, which makes waits edges of the one wait-for graph: :meth:`TransactionManager.waiting`).

Thread-safety: every method may be called from any thread.  ``_ids`` is an ``itertools.count`` (atomic
``next`` under the GIL); the registries publish immutable tuples; the per-thread stacks are thread-local;
``_live_mutex`` (a leaf) protects ``_live``, the running top-level transactions.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import threading
import types
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator

import lockmgr

from activedb.errors import DeadlockDetected, LockWaitTimeout, TransactionAborted, TransactionError, check_switch
from activedb.txn import _help_edges, _ids
from activedb.txn._children import Subtransactions, before_waiting_for_children
from activedb.txn._history import HistoryRecorder
from activedb.txn._hotkeys import HotKeys
from activedb.txn._hooks import HookRegistry, Observer, TransactionExtension, WaitKind
from activedb.txn._locking import Locking
from activedb.txn._participants import CommitParticipant
from activedb.txn._pool import WorkerPool
from activedb.txn._rowlocks import RowLockOwners
from activedb.txn._serverwaits import ServerWaits
from activedb.txn._tree import Transaction
from activedb.txn._view import CommittedRows, ReadBase

if TYPE_CHECKING:  # pragma: no cover
    from activedb.store import Catalog


_LIVE = (lockmgr.TxnState.ACTIVE, lockmgr.TxnState.COMMITTING)


class TransactionManager:
    """Creates transaction trees for one ``Database``.  Thread-safe."""

    def __init__(self, catalog: "Catalog", *, max_workers: int = 32,
                 victim_policy: lockmgr.VictimPolicy | lockmgr.VictimChooser = lockmgr.VictimPolicy.REQUESTER,
                 flush_retries: int = 10, record_history: bool = False, lock_timeout: float | None = None,
                 snapshot_on_deadlock: bool = False, subtransactions: Subtransactions = Subtransactions.FRAMES):
        self.catalog = catalog
        # Declared commit edges: a parent waits for its children only while it says so (see _locking.py).
        # ``before_wait``: a lock request that may wait first registers the wait edges of the children this
        # thread helps (``_help_edges``).  A deadlock's victim and a lock wait that timed out raise activedb's
        # errors (``activedb.errors``: they are also lockmgr's).
        self.locks = lockmgr.LockManager(victim_policy=victim_policy, commit_edges=lockmgr.CommitEdges.DECLARED,
                                         snapshot_on_deadlock=snapshot_on_deadlock, before_wait=self._before_lock_wait,
                                         error_classes=lockmgr.ErrorClasses(deadlock=DeadlockDetected,
                                                                            lock_timeout=LockWaitTimeout))
        self.locking = Locking(self.locks, lock_timeout)
        #: The rows the trees of this process hold locked in PostgreSQL (``_rowlocks``), for the flush's waits.
        self.row_lock_owners = RowLockOwners()
        #: Their backends and statements that wait there, asked of PostgreSQL when they wait long (``_serverwaits``).
        self.server_waits = ServerWaits(catalog, self.locks)
        #: How inline subtransactions are represented (see ``Subtransactions``; README, "Lazy inline
        #: subtransactions" and "Frames"): ``FRAMES`` (the default) or ``MATERIALIZED``
        #: (every node registered from its start, the reference the equivalence tests compare with).  A
        #: constructor argument (the tests set the attribute between runs), never the environment.
        self.subtransactions = Subtransactions.parse(subtransactions, "TransactionManager(subtransactions=...)")
        self.pool = WorkerPool(max_workers)
        self.flush_retries = flush_retries
        self.recorder: HistoryRecorder | None = HistoryRecorder() if record_history else None
        self.read_base: ReadBase = CommittedRows(catalog, self.recorder)
        self.extensions = HookRegistry(TransactionExtension, passive=False)
        self.observers = HookRegistry(Observer, passive=True)
        self.process_tag = _ids.new_process_tag()
        self._ids = itertools.count(1)
        self._local = threading.local()     # .running: the transactions this thread runs, innermost last
        self._live_mutex = threading.Lock()  # protects _live (a leaf: nothing else is taken while holding it)
        # Invariant: _live holds exactly the top-level transactions whose ``transaction()`` block is running.
        self._live: dict[str, Transaction] = {}

    def _before_lock_wait(self, tid: object) -> None:
        """The lock manager's ``before_wait``: this thread's request may wait (README, "A helped child's wait
        edge, registered when needed")."""
        _help_edges.flush()

    @property
    def lock_timeout(self) -> float | None:
        return self.locking.lock_timeout

    def live_transactions(self) -> list[Transaction]:
        """The top-level transactions running now (their ``with`` block has not ended), oldest first.  Their
        descendants are reachable through ``children``; ``activedb.explain`` draws them."""
        with self._live_mutex:
            return list(self._live.values())

    # --- top-level transactions -----------------------------------------------------------------

    @contextlib.contextmanager
    def transaction(self, *, name: str | None = None, participants: Iterable[CommitParticipant] = (),
                    read_base: ReadBase | None = None,
                    prepare: Callable[[Transaction], None] | None = None,
                    update_intent: frozenset[str] = frozenset()) -> Iterator[Transaction]:
        """``with manager.transaction() as tx:`` — a top-level transaction, committed when the block ends
        normally and aborted when it raises.  ``prepare(tx)`` runs before the extensions hear of its begin
        (the rule manager uses it to attach the firing a detached rule runs).  ``update_intent``: tables
        whose plain reads take update intent in this tree (``Database.run``'s hot-key learning)."""
        transaction = Transaction(self, None, name=name, read_base=read_base)
        if update_intent:
            transaction._slot(HotKeys).update_intent = frozenset(update_intent)
        outer = self.current()
        nesting = None
        with self._live_mutex:
            self._live[transaction.id] = transaction
        try:
            for participant in participants:
                transaction._enlist(participant)
            if outer is not None:
                # This thread runs ``outer`` and now blocks inside a new top-level transaction until it
                # ends: ``outer`` waits for it.  Its own holds become retains (it runs no operation
                # meanwhile), and the wait is an edge of the wait-for graph, so that the new transaction
                # waiting for a row ``outer``'s tree keeps is a deadlock reported at once.
                before_waiting_for_children(outer)
                try:
                    _help_edges.flush()     # (edges of children this thread helps: before its own)
                    nesting = self.locks.add_wait(outer.id, [transaction.id], kind=WaitKind.NESTED)
                except lockmgr.TransactionNotActive as error:
                    # ``outer``'s ancestor aborted (``doom`` came first): activedb's error, not the lock
                    # manager's.
                    if outer._doomed is None:
                        raise
                    raise TransactionAborted(
                        f"transaction {outer.id} was aborted ({outer._doomed}); start a new transaction"
                    ) from error
            with self.running(transaction):
                if prepare is not None:
                    prepare(transaction)
                self.extensions.call("on_begin", transaction)
                self.observers.call("on_begin", transaction)
                try:
                    yield transaction
                except BaseException as error:
                    if transaction.state in (lockmgr.TxnState.ACTIVE, lockmgr.TxnState.COMMITTING):
                        transaction.abort(error)
                    raise
                if transaction.state is lockmgr.TxnState.ACTIVE:
                    transaction.commit()
        except BaseException as error:
            if transaction.state is lockmgr.TxnState.ACTIVE:
                transaction.abort(error)
            raise
        finally:
            with self._live_mutex:
                self._live.pop(transaction.id, None)
            if nesting is not None:
                nesting.release()

    def lock_snapshot(self) -> lockmgr.LockTableSnapshot:
        """The lock table as the transaction trees see it: the lock manager's snapshot with every lazy
        inline subtransaction shown as the transaction it stands for (what its parent holds is its own,
        see README, "Lazy inline subtransactions") — the same picture whichever representation runs; and with
        the wait of a thread that runs a child it helps as an edge, registered in the lock manager or not yet
        (README, "A helped child's wait edge, registered when needed")."""
        helped = _help_edges.unregistered(self)      # (read first: an edge registered since is in the snapshot)
        snapshot = self.locks.snapshot()
        with self._live_mutex:
            pending = list(self._live.values())
        lazy = []
        while pending:
            node = pending.pop()
            children = node.children
            pending.extend(children)
            if node._lazy and node.state in _LIVE:
                lazy.append(node)
        snapshot = self.locking.logical_snapshot(snapshot, lazy)
        live = snapshot.transactions
        helped = [(waiter, target, kind) for waiter, target, kind in helped if waiter in live and target in live]
        if not helped:
            return snapshot
        waits = {waiter: dict(edges) for waiter, edges in snapshot.waits.items()}
        for waiter, target, kind in helped:
            waits.setdefault(waiter, {}).setdefault(target, (kind, None))
        return dataclasses.replace(snapshot, waits=types.MappingProxyType(
            {waiter: types.MappingProxyType(edges) for waiter, edges in waits.items()}))

    # --- what threads run and wait for ------------------------------------------------------------

    def current(self) -> Transaction | None:
        """The innermost transaction the calling thread runs (None outside any)."""
        running = getattr(self._local, "running", None)
        return running[-1] if running else None

    def push_running(self, transaction: Transaction) -> None:
        """The calling thread now runs ``transaction`` (until :meth:`pop_running`)."""
        local = self._local
        try:
            local.running.append(transaction)
        except AttributeError:
            local.running = [transaction]

    def pop_running(self) -> None:
        self._local.running.pop()

    @contextlib.contextmanager
    def running(self, transaction: Transaction) -> Iterator[None]:
        """Mark ``transaction`` as run by the calling thread for the duration of the block."""
        self.push_running(transaction)
        try:
            yield
        finally:
            self.pop_running()

    def waiting(self, node: Transaction, kind: WaitKind, target: str | None,
                on_victim: Callable[[BaseException], None] | None = None,
                preferred_victim: bool = False, targets: list[str] | None = None, helps: bool = False,
                late: bool = False) -> "_Waiting":
        """``with manager.waiting(node, kind, target):`` — the calling thread waits on behalf of ``node``
        (kind ``children``: for ``target`` or all of ``node``'s children; ``dependency``: in the coupling
        gate for the transaction ``target``).

        The holds of the transaction this thread runs become retains first; the wait is an edge of the one
        wait-for graph (README, "One wait-for graph"; ``on_victim``/``preferred_victim`` as in
        ``lockmgr.LockManager.add_wait``: ``preferred_victim`` is True or False, a :class:`BadArgument` otherwise).  ``targets``: several of ``node``'s children at once (``target`` None).
        The calling thread is about to block, so the worker pool gives its queued tasks workers first
        (``WorkerPool.before_blocking``) — unless ``helps``: it waits for tasks of the pool, running them itself
        while nobody has started them (``Task.wait``, which tells the pool when it does block).  ``late``: the
        calling thread runs ``target`` itself (claimed from the pool), so the edge is kept on the thread and
        registered only if the thread is about to block meanwhile (``_help_edges``; README, "A helped child's
        wait edge, registered when needed") — only where no observer hears waits begin and end.
        """
        if preferred_victim is not False:      # (the lock manager's add_wait takes a bool: 'no' would volunteer)
            check_switch("TransactionManager.waiting", "preferred_victim", preferred_victim)
        return _Waiting(self, node, kind, target, on_victim, preferred_victim, targets, helps, late)


class _Waiting:
    """The context of one wait (see :meth:`TransactionManager.waiting`)."""

    __slots__ = ("manager", "node", "kind", "target", "on_victim", "preferred_victim", "registered", "targets",
                 "helps", "late", "kept")

    registered: lockmgr.ExternalWait | None     # (annotation only: a slot, set in ``__init__``)

    def __init__(self, manager: TransactionManager, node: Transaction, kind: WaitKind, target: str | None,
                 on_victim: Callable[[BaseException], None] | None, preferred_victim: bool,
                 targets: list[str] | None = None, helps: bool = False, late: bool = False) -> None:
        self.manager, self.node, self.kind, self.target = manager, node, kind, target
        self.on_victim, self.preferred_victim, self.registered = on_victim, preferred_victim, None
        self.targets, self.helps, self.late = targets, helps, late
        self.kept: _help_edges.HelpEdge | None = None      # the edge kept on the thread (``late``)

    def __enter__(self) -> None:
        manager, node, kind, target = self.manager, self.node, self.kind, self.target
        waiter = manager.current()
        if waiter is not None:
            before_waiting_for_children(waiter)   # (materialized: a wait is an edge of the wait-for graph)
            if waiter.state not in _LIVE:    # an aborting node waits for its children unregistered
                if not self.late:
                    self._refuse_wait_for_itself()
            else:
                targets = ([target] if target is not None else self.targets if self.targets is not None
                           else [child.id for child in node.children])
                if kind is WaitKind.CHILDREN and waiter is node:
                    kind = WaitKind.COMMIT   # a parent waiting for its own children: the declared commit edge
                try:
                    if self.late:
                        # (``late`` waits always name their one target.)
                        self.kept = _help_edges.HelpEdge(waiter, target, kind)  # type: ignore[arg-type]
                        _help_edges.push(self.kept)
                    else:
                        _help_edges.flush()    # (edges of children this thread helps: before its own)
                        self.registered = manager.locks.add_wait(
                            waiter.id, targets, kind=kind, on_victim=self.on_victim,
                            preferred_victim=self.preferred_victim)
                except lockmgr.TransactionNotActive:
                    # An ancestor's abort reached the lock manager but not yet this thread (``doom`` comes
                    # first, so the node is doomed): it waits unregistered, as an aborting node does, and
                    # learns of the abort from what it waits for (its children are doomed too).
                    if waiter._doomed is None:
                        raise
                    self._refuse_wait_for_itself()
                except lockmgr.WaitForItself as error:
                    # (Its own handle's result, or its parent's children waited for from inside it: never.)
                    raise self._waits_for_itself(waiter) from error
        if not self.helps:
            manager.pool.before_blocking()
        observers = manager.observers
        if observers.on_wait_start:
            observers.call("on_wait_start", node, self.kind, target)

    def _refuse_wait_for_itself(self) -> None:
        """A wait the lock manager does not see (its waiter aborted, or doomed by an ancestor's abort) is refused as
        the lock manager refuses a registered one (``WaitForItself``) when it would wait for a transaction this thread
        runs — the waiter itself after ``child.abort()``, say, waiting on its own handle: that one ends only after its
        function returns, so the wait would never end."""
        node = self.node
        targets = ([self.target] if self.target is not None else self.targets if self.targets is not None
                   else [child.id for child in node.children])
        running = getattr(self.manager._local, "running", None) or []
        for transaction in running:
            if transaction.id in targets:
                raise self._waits_for_itself(transaction)

    def _waits_for_itself(self, waiter: Transaction) -> TransactionError:
        """The error of a wait of ``waiter`` for itself."""
        return TransactionError(
            f"{waiter.id} would wait for itself, which this thread runs (a wait for "
            f"{self.target or 'the children'} of {self.node.id}): it ends only after its function returns; wait for "
            f"it from outside it, e.g. in its parent's block")

    def __exit__(self, *exc_info: object) -> None:
        registered = self.registered
        if registered is not None:
            registered.release()
        if self.kept is not None:
            _help_edges.pop()
        observers = self.manager.observers
        if observers.on_wait_end:
            observers.call("on_wait_end", self.node, self.kind, self.target)
