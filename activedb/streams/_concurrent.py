"""The concurrent schedulers: Strict 2PL (Active CEP §5.2) and Low-Water-Mark (§5.3, App. E, F).

Both run a batch as :class:`LockingScheduler` does; they differ in their lock table (:mod:`activedb.streams._locks`)
and in what a Read sees (the design note ``activedb/streams/README.md``, "S2PL and LWM: one dispatcher, worker
threads, ends heard by an observer").

Thread-safety: a scheduler object serves one engine, one batch at a time (``run`` is not
re-entrant); ``_mutex`` protects the counters and the run's progress (``_Run.done``);
it is a leaf.  The observer's hooks run in the ending subtransaction's thread.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, ContextManager, Hashable

from activedb.errors import InvalidChoice
from activedb.store import Granularity
from activedb.streams._batch import AccessPlan, BatchRun, STransaction, _Fired, _Touched, loadable
from activedb.streams._locks import (LockMode, LockTableStatistics, LWMLockTable, Owner, Request, S2PLLockTable,
                                     StreamLockTable)
from activedb.streams._matcher import PartitionState
from activedb.streams._scheduler import Scheduler
from activedb.streams._versions import VersionStatistics, VersionStore
from activedb.streams._view import LockedView, Stamp, StoreView, VersionedView
from activedb.streams.errors import SchedulerError, StreamError
from activedb.txn import Observer, WaitKind

if TYPE_CHECKING:  # pragma: no cover
    from activedb.store import Key
    from activedb.txn import Transaction, TransactionManager

logger = logging.getLogger("activedb.streams")


class SchedulerHooks:
    """Points where a test can hold an s-transaction (named-step scenarios).  Both run on
    the s-transaction's worker thread; the default does nothing."""

    def started(self, stransaction: STransaction) -> None:
        """The s-transaction's subtransaction runs; nothing of it has waited or run yet."""

    def finishing(self, stransaction: STransaction) -> None:
        """Its queries and rules ran; it holds every lock it took (LWM: but its write locks if it wrote first and
        released them: the design note's "Writes first under LWM"); it has not committed.  Called once per
        attempt: an attempt matched on a state that is not final yet calls it before it waits for that
        state's owner (the commit dependency).  An error raised here fails the batch."""


@dataclass(frozen=True)
class SchedulerStatistics:
    """Counters of a concurrent scheduler over every batch it ran.  Immutable."""

    scheduler: str
    granularity: str
    workers: int
    batches: int
    stransactions: int            # run on workers (s-transactions no query consumes are not)
    lock_requests: int
    write_lock_requests: int
    lock_waits: int               # operations that waited for an earlier s-transaction's lock
    order_waits: int              # s-transactions that waited for a partition's previous one
    restarts: int                 # attempts matched on a state (or a version) that was not installed, run again
    early_releases: int           # LWM: s-transactions that released their write locks once written
    deferred_writes: int          # LWM: Writes that stayed in the versions, made in the batch's transaction at its end
    punctuation_waits: int
    wait_seconds: float           # time s-transactions spent waiting (locks, order), summed
    max_in_flight: int            # most s-transactions running at once
    versions_peak: int            # LWM: most versions held at once in a batch
    versions_written: int


@dataclass(eq=False, slots=True)
class _Work:
    """One s-transaction of the run: its lock-table owner, its unit, what it depends on."""

    stransaction: STransaction
    index: int
    owner: Owner
    unit: str = ""
    # For each partition it consumes: the latest earlier s-transaction that may change it (None: none).
    inputs: dict[tuple[str, Key], _Work | None] = field(default_factory=dict)
    # Per partition, whose published state (and attempt) this attempt is matched on (None: the batch's); also
    # ("version", writer's position) for a version it read early.
    sources: dict[tuple[str, Hashable], tuple[_Work | None, int]] = field(default_factory=dict)
    result: tuple[_Touched, _Fired] | None = None
    # Its partitions' states as its queries matched (this attempt; replaced, never cleared, on a restart).
    states: dict[tuple[str, Key], PartitionState] = field(default_factory=dict)
    final: bool = False                # its states will be installed unless the batch fails
    changes: bool = False              # it may change a partition (someone may be matched on its states)
    # Its locks at the scheduler's granularity: (table, key or None, mode).
    resources: list[tuple[str, Key | None, LockMode]] = field(default_factory=list)
    writes_first: bool = False         # LWM: it writes first and may release its write locks once written
    may_read_early: bool = False       # an earlier one may release a write lock it needs before being decided
    released_early: bool = False       # it released its write locks once written, before it was decided
    in_attempt: bool = False           # its current attempt runs in a subtransaction of its own (restartable)
    attempt: int = 0
    committed: bool = False
    started: bool = False              # its body began on a worker
    ending: bool = False
    done: bool = False                 # ended, and its locks released
    handle: Any = None


class _Run(Observer):
    """One batch under a locking scheduler; as an observer it hears the s-transactions'
    subtransactions end (step 3 of the design note's "S2PL and LWM")."""

    def __init__(self, scheduler: "LockingScheduler", batch: BatchRun, table: StreamLockTable):
        self.scheduler = scheduler
        self.batch = batch
        self.table = table
        self.works: list[_Work] = []
        self.by_position: dict[int, _Work] = {}
        self.by_node: dict[str, _Work] = {}
        self.base_states: dict[tuple[str, Key], PartitionState | None] = {}
        self.versions: VersionStore | None = None
        # Protects by_node, floor_index, ended, in_flight, max_in_flight, each work's started/ending/done (a leaf).
        self._mutex = threading.Lock()
        self.floor_index = 0               # works[:floor_index] have all ended
        self.ended = 0                     # works done; `wake` is notified at each
        self.wake = threading.Condition(self._mutex)
        self.in_flight = self.max_in_flight = self.order_waits = self.restarts = 0
        self.broken: BaseException | None = None     # an infrastructure failure in a worker
        # Per table an s-transaction may write: whether a rule of the database hears it (``_heard``).
        self.heard: dict[str, bool] = {}
        # LWM: the tables some plan of the batch writes without naming the row (their Writes go into the tree,
        # where a Read of the whole table finds them).
        self.unkeyed_writes: set[str] = set()
        self.deferred_writes = 0          # LWM: the Writes made in the batch's transaction at its end

    def on_commit(self, transaction: Transaction) -> None:
        self._end(transaction, True)

    def on_abort(self, transaction: Transaction, reason: BaseException | None) -> None:
        self._end(transaction, False)

    def _end(self, transaction: Transaction, committed: bool) -> None:
        with self._mutex:
            work = self.by_node.pop(transaction.id, None)
        if work is None:
            return
        try:
            self.scheduler._ended(self, work, committed)
        except Exception as error:        # the owner ended anyway (see _ended); fail the batch, keep listening
            logger.exception("ending %s failed", work.stransaction.id)
            self.broken = self.broken or error


def _overlap(writer: _Work, work: _Work) -> bool:
    """Whether a write lock of ``writer`` overlaps a lock of ``work`` (a table overlaps its rows)."""
    for table, key, mode in writer.resources:
        if mode is LockMode.WRITE:
            for other_table, other_key, _ in work.resources:
                if table == other_table and (key is None or other_key is None or key == other_key):
                    return True
    return False


class _Restart(BaseException):
    """Aborts an attempt matched on a state (or that saw a version) that was not installed
    (``LockingScheduler._work``).  A BaseException: a rule's ``except Exception`` must not turn it into the
    event's failure."""


class LockingScheduler(Scheduler):
    """What S2PL and LWM share (module docstring).

    * ``granularity`` — ``"tuple"`` (a row where Algorithm 1 derives its key from the
      event, else the table) or ``"table"`` (every lock on its table);
    * ``workers`` — how many s-transactions may be unfinished at once (they run on ``db``'s
      worker pool, whose size bounds it too);
    * ``hooks`` — :class:`SchedulerHooks` for tests;
    * ``lock_table`` — the lock-table class (tests give deliberately broken ones).
    """

    lock_table_class: type[StreamLockTable] = StreamLockTable

    def __init__(self, *, granularity: Granularity = Granularity.TUPLE, workers: int = 8,
                 hooks: SchedulerHooks | None = None,
                 lock_table: type[StreamLockTable] | None = None):
        try:
            granularity = Granularity(granularity)
        except InvalidChoice:
            raise SchedulerError(f"granularity {granularity!r}: use Granularity.TUPLE ('tuple') or "
                                 f"Granularity.TABLE ('table')") from None
        if not isinstance(workers, int) or workers < 1:
            raise SchedulerError(f"workers={workers!r}: give a positive number of s-transactions to run at once")
        self.granularity = granularity
        self.workers = workers
        self.hooks = hooks or SchedulerHooks()
        self.lock_table_factory = lock_table or self.lock_table_class
        #: The lock table of the latest batch (for inspection by tests and tools).
        self.last_lock_table: StreamLockTable | None = None
        self._mutex = threading.Lock()     # protects _totals (a leaf)
        # The counters of SchedulerStatistics over every batch run so far.
        self._totals: dict[str, float] = Counter(  # type: ignore[call-overload]  # (wait_seconds: a float)
            batches=0, stransactions=0, lock_requests=0, write_lock_requests=0, lock_waits=0, order_waits=0, restarts=0,
            early_releases=0, deferred_writes=0, punctuation_waits=0, wait_seconds=0.0, max_in_flight=0,
            versions_peak=0, versions_written=0)

    # --- a batch ----------------------------------------------------------------------------

    def run(self, batch: BatchRun) -> None:
        db = batch.engine.db
        runnable = [stransaction for stransaction in batch.stransactions if stransaction.matchers]
        for stransaction in runnable:
            if stransaction.plan.opaque:
                raise SchedulerError(
                    f"{self.name.upper()} inserts every lock of an s-transaction before it runs (Active CEP Algorithm "
                    f"1), but a rule on a query consuming {stransaction.event.type} events is a Python action that "
                    f"declared no tables; give it reads=[…]/writes=[…] or use scheduler='sei'")
        manager = db.transactions
        table = self.lock_table_factory()
        table.waiting = self._waiting_context(manager, table)
        run = _Run(self, batch, table)
        self.last_lock_table = table
        for stransaction in batch.stransactions:
            if not stransaction.matchers:
                batch.count_empty()
        self._prepare(run, runnable)
        batch.view_factory = lambda tx, stamp: self._view(run, tx, stamp)
        batch.state_source = lambda stransaction, query, key: self._input_state(run, stransaction, query, key)
        batch.on_matched = lambda stransaction, touched, certain: self._matched(run, stransaction, touched, certain)
        ends = db.observe(run)
        try:
            self._spawn_all(run, runnable)
            self._write_back(run)
        finally:
            manager.observers.remove(ends)
            self._account(run)

    def _dispatch(self, run: _Run, stransaction: STransaction, last_changer: dict[tuple[str, Key], _Work]) -> _Work:
        """Insert the next s-transaction's locks (the declared order) and note its partition
        order (step 1); ``last_changer`` carries the partition order from one call to the next."""
        batch = run.batch
        event = stransaction.event
        work = _Work(stransaction, len(run.works), Owner(event.position, event.ts, stransaction.id),  # type: ignore[arg-type]
                     batch.new_unit(stransaction))
        work.resources = self._resources(batch, stransaction.plan)
        run.table.insert(work.owner, work.resources)
        self._may_read_early(run, work)
        for _, matcher in stransaction.matchers:
            partition = (matcher.query.name, matcher.partition_key(event))
            if partition not in work.inputs:
                work.inputs[partition] = last_changer.get(partition)
                if partition not in run.base_states:
                    # No earlier s-transaction of the batch consumes it: no state of it is installed yet.
                    run.base_states[partition] = batch.partition(*partition)
            if matcher.may_change(event.type):
                last_changer[partition] = work
                work.changes = True
        run.by_position[event.position] = work  # type: ignore[index]
        run.works.append(work)
        self._dispatched(run, work)
        return work

    def _resources(self, batch: BatchRun, plan: AccessPlan) -> list[tuple[str, Key | None, LockMode]]:
        """The plan's resources at this scheduler's granularity: a row stays a row only at tuple
        granularity, on a table activedb locks by row, and with no NULL in its key."""
        locking = batch.engine.db.transactions.locking
        table_level = self.granularity is Granularity.TABLE
        resources = []
        for resources_of, mode in ((plan.reads, LockMode.READ), (plan.writes, LockMode.WRITE)):
            for resource in resources_of:
                key = resource.key
                if key is not None and (table_level or any(value is None for value in key)
                                        or locking.granularity(resource.table) is Granularity.TABLE):
                    key = None
                resources.append((resource.table, key, mode))
        return resources

    def _may_read_early(self, run: _Run, work: _Work) -> None:
        """At dispatch: whether ``work`` releases its write locks once written (LWM), and whether an earlier
        one that may do so writes what ``work`` reads or writes (then ``work`` runs in an attempt, to be run
        again if that one aborts after it read its version: the design note's "Writes first under LWM")."""

    def _prepare(self, run: _Run, runnable: list[STransaction]) -> None:
        """Before the first s-transaction is dispatched (LWM loads its base images here)."""

    def _dispatched(self, run: _Run, work: _Work | None) -> None:
        """``work``'s locks are in, and so are those of every s-transaction before it; it is
        not spawned yet (None: every s-transaction of the batch is dispatched)."""

    def _write_back(self, run: _Run) -> None:
        """Every s-transaction of the batch ended: what the scheduler kept outside the tree goes into the
        batch's transaction (LWM: the Writes that stayed in its versions)."""

    def _heard(self, run: _Run, table: str) -> bool:
        """Whether a rule of the database hears ``table``'s changes (cached per batch; workers fill the cache
        without a lock: a race computes an equal value)."""
        heard = run.heard
        found = heard.get(table)
        if found is None:
            found = heard[table] = run.batch.tx.manager.extensions.any("wants_old_images", table)
        return found

    def _input_state(self, run: _Run, stransaction: STransaction, query: str, key: Key) -> PartitionState | None:
        """The state ``stransaction`` is matched on: the one its attempt chose (``_choose``)."""
        partition = (query, key)
        source, _ = run.by_position[stransaction.event.position].sources.get(partition, (None, 0))  # type: ignore[index]
        return run.base_states.get(partition) if source is None else source.states.get(partition)

    def _matched(self, run: _Run, stransaction: STransaction, touched: _Touched, certain: bool) -> None:
        """``BatchRun.on_matched``: publish a query's new state, or (``certain``) that all are final; wake waiters."""
        work = run.by_position[stransaction.event.position]  # type: ignore[index]
        if not work.changes:
            return
        if certain:
            work.final = self._sources_final(work)
        else:
            work.states.update(touched)
        run.table.matched(work.owner)

    def _spawn_all(self, run: _Run, runnable: list[STransaction]) -> None:
        """Dispatch and spawn in the declared order, each s-transaction as soon as its locks are in."""
        tx = run.batch.tx
        manager = tx.manager
        works = run.works
        last_changer: dict[tuple[str, Key], _Work] = {}
        for stransaction in runnable:
            work = self._dispatch(run, stransaction, last_changer)
            # At most `workers` unfinished s-transactions: wait until one ends (a parent waiting for
            # its children; if the oldest is queued and no worker is free, this thread runs it).
            while True:
                with run._mutex:
                    if work.index - run.ended < self.workers:
                        break
                    oldest = works[run.floor_index]          # the earliest unfinished one
                    running = oldest.started
                pool = manager.pool.statistics()
                if not running and not pool["idle"] and pool["threads"] >= manager.pool.max_workers:
                    self._settle(run, oldest)
                    continue
                with manager.waiting(tx, WaitKind.CHILDREN, oldest.handle.transaction.id), run._mutex:
                    if work.index - run.ended >= self.workers:
                        run.wake.wait()
            if run.broken is not None:
                break
            work.handle = tx.spawn(self._work, run, work, name=f"s-transaction {work.stransaction.event.describe()}",
                                   eager=True)
            # Known before any later s-transaction exists: the target of the edges of waits for it.
            work.owner.node = work.handle.transaction
        else:
            self._dispatched(run, None)
        errors: list[BaseException] = []
        for work in works:
            if work.handle is None:
                continue
            self._settle(run, work)
            try:
                work.handle.result()
            except StreamError:
                pass                      # the event is a dead letter already
            except BaseException as error:   # noqa: BLE001 - re-raised once every s-transaction ended
                errors.append(error)
        if errors:
            raise errors[0]
        if run.broken is not None:        # pragma: no cover - a failure that was not the worker's result
            raise run.broken

    def _settle(self, run: _Run, work: _Work) -> None:
        """Wait until ``work``'s subtransaction ended.  If it ended without its body having
        run (its parent was aborted first), the observer never knew it: end it here, so
        that nobody waits for it forever."""
        work.handle.wait()
        if not work.done:
            self._ended(run, work, False)

    def _work(self, node: Transaction, run: _Run, work: _Work) -> None:
        """The body of one s-transaction's subtransaction (on a worker thread)."""
        work.owner.node = node
        with run._mutex:
            run.by_node[node.id] = work
            work.started = True
            run.in_flight += 1
            run.max_in_flight = max(run.max_in_flight, run.in_flight)
        stransaction = work.stransaction
        self.hooks.started(stransaction)
        while True:
            speculative = work.in_attempt = self._choose(run, work)
            finishing = True              # the finishing hook is still to be called for this attempt
            try:
                if not speculative:
                    work.result = run.batch.execute_in(stransaction, node, work.unit)
                    break
                with node.subtransaction(name=f"attempt {work.attempt} of {stransaction.described}") as attempt:
                    work.result = run.batch.execute_in(stransaction, attempt, work.unit)
                    if not self._sources_final(work):
                        # It waits for a commit of an earlier s-transaction: everything but its own commit
                        # (and the release of its locks) is done first.
                        finishing = False
                        self._finishing(run, work)
                    if self._confirmed(run, work):
                        break
                    raise _Restart()
            except _Restart:
                self._restart(run, work)
            except StreamError:
                if not speculative or self._confirmed(run, work):
                    raise                 # the event's failure: its subtransaction aborts
                run.batch.withdraw(stransaction)      # it failed on a state that was not installed
                self._restart(run, work)
            except BaseException as error:
                run.broken = error        # the batch cannot go on: spawn no more
                raise
        self._decided(run, work)
        if finishing:
            self._finishing(run, work)
        self._finished(run, work)

    def _finishing(self, run: _Run, work: _Work) -> None:
        """The ``finishing`` hook.  An error in it fails the batch: the s-transaction may already be final
        (``_decided``), and later ones may have committed on its states."""
        try:
            self.hooks.finishing(work.stransaction)
        except BaseException as error:
            run.broken = run.broken or error
            raise

    def _choose(self, run: _Run, work: _Work) -> bool:
        """Per partition, wait until the latest earlier changer that did not abort published its
        state (an order wait) and match on that; True if one of them is not final (speculative)."""
        waited = False
        speculative = work.may_read_early      # (it may read a version whose writer is not decided yet)
        work.sources = {}
        for partition, source in work.inputs.items():
            while source is not None:
                attempt = source.attempt              # read before its states (see _restart)
                if not source.owner.ended and partition not in source.states:
                    waited = True
                    run.table.wait_for(work.owner, source.owner, ready=lambda s=source: partition in s.states)  # type: ignore[misc]
                if source.owner.ended and not source.committed:
                    source = source.inputs.get(partition)       # it aborted: the one before it hands over
                elif partition in source.states or source.committed:
                    break
            work.sources[partition] = (source, 0 if source is None else attempt)
            speculative |= source is not None and not (source.final or source.committed)
        if waited:
            with run._mutex:
                run.order_waits += 1
        return speculative

    def _sources_final(self, work: _Work) -> bool:
        """Whether every state this attempt was matched on is final already (its commit dependency
        holds without a wait)."""
        return all(source is None or (source.attempt == attempt and (source.final or source.committed))
                   for source, attempt in work.sources.values())

    def _decided(self, run: _Run, work: _Work) -> None:
        """Its queries and rules ran without error and every state (and version) it was matched on is final: its
        own states and versions are final too — it can no longer abort for a reason of its own — unless its
        commit still runs the database's rules (a rule of the database hears a table its plan writes:
        a deferred one runs at that commit and may fail).  Then later s-transactions matched on its
        states wait for its commit (the design note's "Matching order")."""
        if work.final:
            return
        for resource in work.stransaction.plan.writes:
            if self._heard(run, resource.table):
                return
        if self._sources_final(work):
            work.final = True
            run.table.matched(work.owner)

    def _confirmed(self, run: _Run, work: _Work) -> bool:
        """The commit dependency: wait until every state this attempt used is final or its owner
        ended; False if one was not installed (its owner aborted, or restarted after publishing it)."""
        for source, attempt in work.sources.values():
            if source is not None:
                run.table.wait_for(work.owner, source.owner, ready=lambda s=source: s.final)  # type: ignore[misc]
                if source.attempt != attempt or (source.owner.ended and not source.committed):
                    return False
        return True

    def _restart(self, run: _Run, work: _Work) -> None:
        """Its attempt (a subtransaction, aborted) was matched on a state that was not installed: record
        the attempt aborted and match again on what is (nobody committed on its effects: it held every lock,
        or — LWM, released early — whoever read its versions depends on it)."""
        if work.released_early:           # its locks are back before its versions go (a Read between waits)
            run.table.reinstate(work.owner)
            work.released_early = False
        self._discard(run, work)
        run.batch.finish(work.stransaction, work.unit, False, None)
        work.states = {}
        work.attempt += 1                 # after the states: a reader of the old attempt number sees it change
        work.unit = run.batch.new_unit(work.stransaction, work.attempt)
        with run._mutex:
            run.restarts += 1

    def _finished(self, run: _Run, work: _Work) -> None:
        """``work``'s queries and rules ran without error; its subtransaction has not committed."""

    def _ended(self, run: _Run, work: _Work, committed: bool) -> None:
        """Step 3 (from the observer): record, install, then release — in that order."""
        with run._mutex:
            if work.done or work.ending:
                return
            work.ending = True
            ran = work.started
        try:
            work.committed = committed
            run.batch.finish(work.stransaction, work.unit, committed, work.result if committed else None)
            if not committed:
                self._discard(run, work)
        finally:
            run.table.end(work.owner)
            with run._mutex:
                work.done = True
                run.ended += 1
                run.wake.notify()
                if ran:
                    run.in_flight -= 1
                works = run.works
                index = run.floor_index
                while index < len(works) and works[index].done:
                    index += 1
                run.floor_index = index
                floor = works[index].owner.position if index < len(works) else None
            if run.versions is not None and floor is not None:
                run.versions.advance(floor)

    def _discard(self, run: _Run, work: _Work) -> None:
        """An aborted s-transaction's effects outside activedb's tree (LWM: its versions)."""

    def _waiting_context(self, manager: TransactionManager, table: StreamLockTable
                         ) -> Callable[[Owner, Owner, Request | None], ContextManager[object]]:
        """How a wait of the lock table becomes an edge of the one wait-for graph."""
        def waiting(owner: Owner, blocker: Owner, request: Request | None) -> ContextManager[object]:
            context: ContextManager[object] = manager.waiting(
                owner.node, table.kind if request is not None else WaitKind.STREAM_ORDER, blocker.node.id,
                on_victim=lambda error: table.make_victim(owner, error))
            return context
        return waiting

    # --- the store view ---------------------------------------------------------------------

    def _view(self, run: _Run, tx: Transaction, stamp: Stamp) -> StoreView:
        raise NotImplementedError

    # --- statistics -------------------------------------------------------------------------

    def _account(self, run: _Run) -> None:
        table: LockTableStatistics = run.table.statistics()
        versions: VersionStatistics | None = run.versions.statistics() if run.versions is not None else None
        with self._mutex:
            totals = self._totals
            totals.update(batches=1, stransactions=len(run.works), lock_requests=table.requests,
                          write_lock_requests=table.write_requests, lock_waits=table.waits,
                          punctuation_waits=table.punctuation_waits, order_waits=run.order_waits, restarts=run.restarts,
                          early_releases=sum(work.released_early for work in run.works),
                          deferred_writes=run.deferred_writes,
                          wait_seconds=table.wait_seconds)
            totals["max_in_flight"] = max(totals["max_in_flight"], run.max_in_flight)
            if versions is not None:
                totals["versions_peak"] = max(totals["versions_peak"], versions.peak_versions)
                totals["versions_written"] += versions.appended

    def statistics(self) -> SchedulerStatistics:
        with self._mutex:
            return SchedulerStatistics(scheduler=self.name, granularity=self.granularity, workers=self.workers,
                                       **self._totals)  # type: ignore[arg-type]


class S2PLScheduler(LockingScheduler):
    """Strict two-phase locking with locks inserted at arrival (Active CEP §5.2, Algorithm 1)."""

    name = "s2pl"
    lock_table_class = S2PLLockTable

    def _view(self, run: _Run, tx: Transaction, stamp: Stamp) -> StoreView:
        engine = run.batch.engine
        return LockedView(tx, stamp, engine.history, engine._operation_hook, table=run.table,
                          owner=run.by_position[stamp.position].owner, catalog=engine.catalog)


class LWMScheduler(LockingScheduler):
    """The Low-Water-Mark scheduler over a multi-version store (Active CEP §5.3, Algorithm 2,
    App. F's punctuation guard)."""

    name = "lwm"
    lock_table_class = LWMLockTable

    def _may_read_early(self, run: _Run, work: _Work) -> None:
        batch = run.batch
        stransaction = work.stransaction
        work.writes_first = bool(stransaction.plan.writes) and batch.split_by_rules(stransaction.matchers) is not None
        work.may_read_early = any(earlier.writes_first and not earlier.done and _overlap(earlier, work)
                                  for earlier in run.works[run.floor_index:])

    def _written(self, run: _Run, stransaction: STransaction) -> None:
        """``BatchRun.on_written``: it will write nothing more.  Release its write locks now — the lwm moves
        past it before its other queries ran — if it can be run again (an attempt: its locks are reinstated
        first, ``_restart``), or if it never will be: nothing it was matched on, and no version it may still
        read, can be withdrawn (every earlier s-transaction that writes what it reads or writes is decided)."""
        work = run.by_position[stransaction.event.position]  # type: ignore[index]
        if not work.writes_first:
            return
        if not work.in_attempt:
            if not self._sources_final(work):
                return
            if any(not (earlier.final or earlier.done) and _overlap(earlier, work)
                   for earlier in run.works[run.floor_index:work.index]):
                return
        work.released_early = True
        run.table.release(work.owner)

    def _validate(self, run: _Run, work: _Work, kind: str, table: str, key: Key | None) -> None:
        """An operation of ``work`` (in an attempt) has seen the versions: if its lock is no longer granted —
        an earlier s-transaction that released early was run again and reinstated its locks in between —
        what it saw may be withdrawn: run this attempt again."""
        if not run.table.granted(work.owner, table, key, LockMode.READ if kind == "read" else LockMode.WRITE):
            raise _Restart()

    def _version_read(self, run: _Run, work: _Work, writer: int) -> None:
        """A Read of ``work`` returned a version written at position ``writer``: if that s-transaction released
        its write locks before it was decided, ``work`` depends on it (a commit dependency, as on a pattern
        state; run again if it aborts)."""
        source = run.by_position.get(writer)
        if source is None or not source.released_early or source.final or source.committed:
            return
        if not work.may_read_early:       # (dispatch marks every s-transaction that may: an attempt)
            raise SchedulerError(f"internal: {work.stransaction.id} read a version of {source.stransaction.id}, "
                                 f"not decided yet, outside an attempt")
        work.sources.setdefault(("version", writer), (source, source.attempt))

    def _prepare(self, run: _Run, runnable: list[STransaction]) -> None:
        """Load the base image of every row the batch may read (before any s-transaction writes)."""
        batch = run.batch
        batch.on_written = lambda stransaction: self._written(run, stransaction)
        tx = batch.tx
        engine = batch.engine
        history = engine.history
        versions = run.versions = VersionStore()
        whole: set[str] = set()
        rows: dict[str, dict[Key, None]] = {}
        run.unkeyed_writes = {resource.table for stransaction in runnable for resource in stransaction.plan.writes
                              if resource.key is None or None in resource.key}
        for stransaction in runnable:
            for resource in stransaction.plan.reads:
                if resource.key is None:
                    whole.add(resource.table)
                elif all(value is not None for value in resource.key):
                    rows.setdefault(resource.table, {})[resource.key] = None
        started = time.perf_counter()
        for table in whole:
            columns = engine.catalog.table(table).key_columns
            images = {tuple(image[column] for column in columns): image for image in tx.scan(table)}
            versions.load_table(table, images, history.last_writes(table) if history is not None else {})
        for table, keys in rows.items():
            if table in whole:
                continue
            wanted = loadable(tx, table, keys)
            tx.prefetch(table, wanted)
            sequences = history.last_writes(table) if history is not None else {}
            for key in wanted:
                versions.load_row(table, key, tx.read(table, key), sequences.get(key))
        engine.metrics.phase(reads=time.perf_counter() - started)
        if runnable:
            versions.advance(runnable[0].event.position)  # type: ignore[arg-type]

    def _dispatched(self, run: _Run, work: _Work | None) -> None:
        """Publish App. F's punctuation: ``work``'s timestamp, or after the last the released bound."""
        table = run.table
        assert isinstance(table, LWMLockTable)
        punctuation = run.batch.pending.released if work is None else work.owner.ts
        if punctuation is not None:
            table.publish(punctuation)

    def _finished(self, run: _Run, work: _Work) -> None:
        """Release its write locks before its commit (the design note, step 3, says why)."""
        run.table.release(work.owner)

    def _discard(self, run: _Run, work: _Work) -> None:
        if run.versions is not None:
            run.versions.drop(work.owner.position)

    def _view(self, run: _Run, tx: Transaction, stamp: Stamp) -> StoreView:
        engine = run.batch.engine
        work = run.by_position[stamp.position]
        validate = ((lambda kind, table, key: self._validate(run, work, kind, table, key)) if work.may_read_early
                    else None)
        return VersionedView(tx, stamp, engine.history, engine._operation_hook, table=run.table, owner=work.owner,
                             catalog=engine.catalog, versions=run.versions,  # type: ignore[arg-type]
                             on_version=lambda writer: self._version_read(run, work, writer), validate=validate,
                             deferred=lambda table: table not in run.unkeyed_writes and not self._heard(run, table))

    def _write_back(self, run: _Run) -> None:
        """The Writes that stayed in the versions, made in the batch's transaction in position order — the
        write set the s-transactions' subtransactions would have left, values as given (a column not given
        keeps PostgreSQL's default) — on the dispatcher's thread, which runs the batch's transaction, once
        every s-transaction has ended."""
        if run.versions is None:
            return
        tx = run.batch.tx
        writes = run.versions.deferred_writes()
        run.deferred_writes = len(writes)
        for write in writes:
            key = write.key[0] if len(write.key) == 1 else write.key
            if write.operation == "delete":
                tx.delete(write.table, key)
            elif write.operation == "insert":
                tx.insert(write.table, **(write.values or {}))
            else:
                tx.write(write.table, key, **(write.values or {}))
