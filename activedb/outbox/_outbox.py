"""``db.outbox``: durable detached-family rule firings.  The design note is ``README.md`` here.

Thread-safety: every public method may be called from any thread.  ``_mutex`` protects ``_closed``,
``_lost``; the liveness connection has its own mutex (``_records.LivenessLock``: SQL under it, a leaf).  The
executor's and the recording participants' mutexes are leaves; none is held while calling PostgreSQL,
the transaction manager or a rule.
"""

from __future__ import annotations

import collections
import datetime
import logging
import math
import secrets
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping

from coupling import Coupling, may_run_after
from lockmgr import TxnState

from activedb import lowlevel
from activedb.clock import SYSTEM_CLOCK, Clock
from activedb.errors import (BadArgument, DatabaseUnavailable, GeneratedKeysReset, OutboxError, RuleError,
                             WaitTimeout, check_seconds, check_switch, check_whole_number)
from activedb.events import EventKind, age_seconds
from activedb.lazy import once
from activedb.outbox import _records
from activedb.outbox._executor import Executor, TakePacer, Work, describe_error
from activedb.outbox._recording import Decided, TreeFirings, TreeState, Unsettled, always, new_record, requires_commit
from activedb.rules import Firing
from activedb.store import TableInfo

if TYPE_CHECKING:  # pragma: no cover
    import sqlalchemy as sa

    from activedb.rules import RuleCounter, RuleManager
    from activedb.store import Catalog
    from activedb.txn import Transaction, TransactionManager

logger = logging.getLogger("activedb.outbox")

#: Records claimed per query of a recovery pass; a pass claims nothing while the backlog exceeds
#: ``CLAIM_BACKLOG`` (it comes back on the next pass).
CLAIM_LIMIT = 1000
CLAIM_BACKLOG = 20_000
#: Seconds :meth:`Outbox.close` (``Database.close()``) waits for the group transactions running then; a group still
#: running after it (a rule that does not return) commits later or, once another process took its records over,
#: writes nothing.
CLOSE_WAIT = 10.0


@dataclass(frozen=True)
class FailedFiring:
    """A detached-family firing that failed for good (``activedb outbox``, ``activedb status``)."""

    id: int
    rule: str
    coupling: str
    event: str                  # the event, described
    trigger: str                # the trigger's transaction id (and its tree's log id, if it committed)
    trigger_outcome: str
    attempts: int               # how often it ended failed (once, and once more for each retry that failed)
    error: str
    failed_at: Any


@dataclass(frozen=True)
class OutboxStatistics:
    """What the outbox holds (from PostgreSQL) and what this process is doing (in memory)."""

    pending: int
    done: int
    failed: int
    per_rule: Mapping[str, Mapping[str, int]] = field(default_factory=dict)   # rule -> {status: count}
    ready: int = 0              # in this process: queued to run
    running: int = 0            # in this process: in a group transaction now
    parked: int = 0             # in this process: waiting for PostgreSQL to come back
    groups: int = 0             # group transactions this process committed
    splits: int = 0             # groups split to isolate a failing member
    given_up: int = 0           # in this process: firings given up past the rule deadline whose threads still run
    lost: int = 0               # firings this process could not record (PostgreSQL unreachable at an abort); a firing
                                # whose event the outbox cannot keep is no loss: its rule counts it ``failed``


@dataclass(frozen=True)
class OutboxOptions:
    """How an :class:`Outbox` runs recorded firings (``connect(config=Config(outbox=OutboxOptions(...)))``).

    * ``group_size`` — at most this many firings per group transaction;
    * ``max_groups`` — group transactions running at once (each on a worker-pool thread);
    * ``max_attempts`` — runs of a firing that fails retryably (deadlock, serialization conflict, reset
      sequence) before it is recorded as failed;
    * ``recovery_interval`` — seconds between recovery passes (claiming records of dead processes); a
      pass also runs at once when a rule is registered, and on :meth:`Outbox.recover`.  ``None`` (or infinity): only
      then; zero or below is refused (``BadArgument``).  The
      interval is measured on the outbox's ``clock`` (the database's: a test with a ``ManualClock`` moves it to
      start a pass).
    * ``rule_deadline`` — seconds (of the outbox's ``clock``, the database's) a detached-family firing may run before
      it is given up (README, "A rule that never returns"): its group transaction is doomed (nothing it wrote
      commits), its record failed saying so (``activedb outbox --retry ID`` runs it again), its group runner freed for
      the firings after it; a group transaction whose commit waits in PostgreSQL past it frees its runner and
      commits when it can (not given up).  ``None`` (the default): no deadline — a firing that never returns holds its runner, as
      a long one must be free to run; zero or below is refused (``BadArgument``).
    * ``inserts_in_commit`` — a batch run at commit (a lowered micro-batch) runs the detached-family firings whose
      actions only insert rows in its own commit, with no record (``activedb/batch/README.md``, "Detached firings
      that only insert"); False: every firing is recorded here and run by a group transaction of its own.
    """

    group_size: int = 1024
    max_groups: int = 2
    max_attempts: int = 5
    recovery_interval: float | None = 10.0
    inserts_in_commit: bool = True
    rule_deadline: float | None = None

    def __post_init__(self) -> None:
        for name in ("group_size", "max_groups", "max_attempts"):
            check_whole_number("OutboxOptions", name, getattr(self, name), 1)
        # (0 would make the recovery thread run passes without pause; infinity is None: no pass by the clock)
        check_seconds("OutboxOptions", "recovery_interval", self.recovery_interval, zero=False,
                      none="passes only when a rule is registered and on recover()")
        check_switch("OutboxOptions", "inserts_in_commit", self.inserts_in_commit)
        check_seconds("OutboxOptions", "rule_deadline", self.rule_deadline, zero=False, finite=True,
                      none="no deadline")


class Outbox:
    """The durable outbox of one ``Database`` (``db.outbox``), run as ``options`` say (:class:`OutboxOptions`).
    Thread-safe."""

    def __init__(self, catalog: "Catalog", transactions: "TransactionManager", rules: "RuleManager",
                 options: OutboxOptions = OutboxOptions(), *, clock: Clock = SYSTEM_CLOCK):
        self.catalog = catalog
        self.clock = clock
        self.transactions = transactions
        self.rules = rules
        self.options = options
        self.recovery_interval = options.recovery_interval
        #: This process's liveness key (the owner of the records it runs); see ``_records``.
        self.owner = secrets.randbits(62) + 1
        self._executor = Executor(self, group_size=options.group_size, max_groups=options.max_groups,
                                  max_attempts=options.max_attempts, rule_deadline=options.rule_deadline)
        self._mutex = threading.Lock()        # protects _started, _closed, _lost, _thread, _unsettled, _passing
        # Notified when the recovery thread ends a pass or stops (wait_recovery_idle); a condition of ``_mutex``.
        self._recovery_idle = threading.Condition(self._mutex)
        # The recovery thread runs a pass now.  Invariant: set before the thread clears ``_wake`` for that pass, so a
        # wake is never consumed while neither shows (``wait_recovery_idle`` would return with a pass to come).
        self._passing = False
        self._started = False
        self._closed = False
        self._lost = 0
        self._unsettled: list[Unsettled] = []   # trees whose commit outcome is unknown, oldest first (settle)
        # Serialises recovery passes (SQL and the executor's submit under it; no other mutex but the
        # executor's leaf is taken under it): a pass that returns has queued what it claimed.
        self._claim_mutex = threading.Lock()
        # A claim's connection was lost (its COMMIT may have happened): the next pass also claims this process's own
        # pending records that it does not hold in memory.  Protected by _claim_mutex.
        self._claim_unknown = False
        self._liveness = _records.LivenessLock(catalog.engine, self.owner)
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        rules.detached.attach(self)

    # --- life -------------------------------------------------------------------------------

    @property
    def inserts_in_commit(self) -> bool:
        return self.options.inserts_in_commit

    @property
    def info(self) -> TableInfo:
        return self.catalog.table_info(_records.TABLE)

    def start(self) -> None:
        """Take this process's liveness lock and start the recovery thread (``connect()`` does; idempotent).
        Needs the schema at head (the ``activedb_outbox`` table)."""
        with self._mutex:
            if self._started or self._closed:
                return
            self._started = True
        try:
            self._liveness.take()
        except BaseException:
            with self._mutex:           # (not started: the next start, or the next firing's, tries again)
                self._started = False
            raise
        thread = threading.Thread(target=self._recovery_loop, name="activedb-outbox-recovery", daemon=True)
        with self._mutex:
            self._thread = thread
        thread.start()

    def close(self) -> None:
        """Stop running and recovering (records still pending stay in PostgreSQL for the next process): queued firings
        are not run; the group transactions running now are waited for, up to :data:`CLOSE_WAIT` seconds, before the
        liveness lock is released (README, "Closing")."""
        with self._mutex:
            if self._closed:
                return
            self._closed = True
            thread = self._thread
        self._wake.set()
        idle = self._executor.close()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=CLOSE_WAIT)
        if not idle and not self._executor.close(CLOSE_WAIT):
            groups, rules = self._executor.running_rules()
            running, _ = self._executor.running_firings()
            logger.warning("outbox: closing while %d group transaction(s) still run after %g s (rules: %s; running "
                           "now: %s); each commits its firings later or, if another process takes their records over "
                           "meanwhile, writes nothing — the records run once either way", groups, CLOSE_WAIT,
                           ", ".join(sorted(rules)) or "none", "; ".join(running) or "none")
        _, given_up = self._executor.running_firings()
        if given_up:
            logger.warning("outbox: closing while %d firing(s) given up past the rule deadline still run: %s; nothing "
                           "they write commits", len(given_up), "; ".join(given_up))
        self._liveness.release()

    # --- recording (the detached runner's hook) ----------------------------------------------

    def record(self, trigger: "Transaction", firing: "Firing", *, ended: bool) -> None:
        """A detached-family ``firing`` occurred in ``trigger``.  ``ended``: ``trigger`` is a top-level
        transaction that already ended (its ``aborted`` event): decided on its outcome now — unless that abort may
        hide a commit (``lowlevel.outcome_unknown``), when the firing waits for the tree's log row as the tree's own
        firings do (README, "The outcome is unknown")."""
        if not self._started:
            self.start()
        if ended:
            committed = trigger.state is TxnState.COMMITTED
            state = lowlevel.slot(trigger, TreeState, create=False)
            replayed = state is not None and not committed and self._replayed(state)
            runs = not replayed and may_run_after(firing.coupling, committed)
            if not committed and lowlevel.outcome_unknown(trigger):
                # The abort is in memory only: an ``aborted`` event is an outcome only if the row shows no commit.
                keep: list[tuple[Firing, str, str | None, bool]] = [(firing, trigger.id, None, False)] if runs else []
                self.settle_later(Unsettled(trigger.log_id, [], [firing], keep, [] if runs else [firing]))
            elif runs:
                self.record_now([(firing, trigger.id, trigger.log_id if committed else None, committed)])
            else:
                self.count([firing], "cancelled")
            return
        self.to_tree(trigger.root, [(firing, trigger)])

    def to_tree(self, root: "Transaction", entries: list[tuple[Firing, "Transaction | Decided"]]) -> None:
        """``entries`` wait in the participant of ``root``'s tree, decided at its end on their triggers' outcomes —
        or now, if the tree is aborting already (it can take no participant)."""
        state = lowlevel.slot(root, TreeState)
        # (Set once, under the state's mutex, and never unset: once set it is read without the mutex.)
        participant = state.participant
        if participant is None:
            participant = self._participant(root, state)
        if participant is not None:
            with participant.mutex:
                participant.entries.extend(entries)
            return
        # The tree is aborting already (it could not take a participant): its abort decides now.
        with state.mutex:
            replay_policy = state.replay_when is not None
        keep: list[tuple[Firing, str, str | None, bool]] = []
        cancelled: list[Firing] = []
        for firing, trigger in entries:
            if not requires_commit(firing, trigger) and not replay_policy and may_run_after(firing.coupling, False):
                keep.append((firing, trigger.id, None, False))
            else:
                cancelled.append(firing)
        if cancelled:
            self.count(cancelled, "cancelled")
        if keep:
            self.record_now(keep)

    def decided(self, transaction: "Transaction") -> TreeFirings:
        """A recorder of firings whose triggers' outcomes are decided before they are recorded — the events of a
        batch run at commit (``activedb.batch.apply_lowered``), each committed unless the batch rejected it:
        ``set_decided([(firing, trigger id, committed), ...])`` during the flush's write, by a participant enlisted on
        ``transaction`` before this call (its ``write`` runs first, and its ``aborted``); they are decided, recorded
        and run as the tree's own firings are (the same modes' rules, the same abort and replay handling).  Enlisted
        on ``transaction`` now: a subtransaction that commits hands its participants to its parent in their order, so
        the recorder stays after the caller's up to the root's flush; one that aborts leaves what the recorder was
        given (each trigger aborted) in the tree's participant, as the firings on its own events are."""
        if not self._started:
            self.start()
        participant = TreeFirings(self, lowlevel.slot(transaction.root, TreeState))
        lowlevel.enlist(transaction, participant)
        return participant

    def _participant(self, root: "Transaction", state: TreeState) -> TreeFirings | None:
        """The tree's recording participant, enlisted on its root the first time (None if the root can no
        longer take one: it is aborting)."""
        with state.mutex:
            participant = state.participant
            if participant is None:
                participant = TreeFirings(self, state)
                try:
                    lowlevel.enlist(root, participant)
                except Exception:
                    return None
                state.participant = participant
            return participant

    @staticmethod
    def _replayed(state: TreeState) -> bool:
        with state.mutex:
            return state.replayed()

    def mark_replayed(self, transaction: "Transaction",
                      when: Callable[[BaseException | None], bool] | None = None) -> None:
        """Declare that if ``transaction``'s tree aborts (for a reason ``when(reason)`` accepts; default: any),
        its owner runs the same input again until it commits — the Spark sink does (a batch attempt it
        discards is re-run, like a batch Spark replays after a crash), and so does ``Database.run`` for the
        conflicts it retries.  Such an abort is not an outcome: the detached and exclusive causally dependent
        firings of the aborted attempt are dropped, as a crash would have dropped them, instead of recorded —
        the attempt that commits fires its own.  Costs a slot and no participant for a tree that fires no
        detached-family rule (README, "Replayed attempts")."""
        if when is not None and not callable(when):
            raise BadArgument(f"Outbox.mark_replayed(when={when!r}) takes a function of the abort's reason (the "
                              f"exception, or None) that says whether the owner re-runs the attempt, or None (any abort)")
        root = transaction.root
        state = lowlevel.slot(root, TreeState)
        with state.mutex:
            state.replay_when = when if when is not None else always
        # The participant is enlisted at the tree's first firing and hears the abort then.  A tree that fires
        # nothing needs the abort's reason only for a rule on its ``aborted`` event (it fires after the end)
        # under a policy that depends on the reason; only then is the participant enlisted now.
        if when is not None and self.rules.registry.by_kind.get(EventKind.ABORTED):
            self._participant(root, state)

    @once        # (not cached_property: its lock, shared by every Outbox, would be held across the query)
    def _sequence(self) -> str:
        sequence = self.catalog.sequence_of(self.info, "id")
        assert sequence is not None       # (an identity column: revision 0005_outbox)
        return sequence

    def draw_ids(self, count: int, since: "datetime.datetime | None" = None) -> tuple[list[int], int]:
        """``count`` record ids from the catalog's cached blocks of the table's sequence, and the storage they
        came with (for :meth:`insert`); ``since``: when the recording tree began (``Catalog.generated_keys``)."""
        return self.catalog.generated_keys(self._sequence, count, since)

    def insert(self, connection: "sa.Connection", records: list[_records.NewRecord], storage: int) -> None:
        """Insert ``records`` (ids from :meth:`draw_ids` with ``storage``) in the caller's transaction; raises
        ``GeneratedKeysReset`` (retryable, nothing inserted) if the sequence was reset since the ids were drawn."""
        if not _records.insert(connection, records, self.owner, self._sequence, storage):
            raise self.catalog.keys_reset(self._sequence, max(record.id for record in records))

    def record_now(self, items: list[tuple["Firing", str, str | None, bool]], retries: int = 2) -> None:
        """Record ``(firing, trigger id, trigger log id, trigger committed)`` items in a transaction of their
        own, then run them (their outcome is already decided: an ended or aborted trigger).  A sequence reset
        between the draw of their ids and the insert is retried with fresh ids (``retries`` times).  A firing whose
        event the outbox cannot keep (``new_record``'s ``OutboxError``) or whose record is beyond
        ``_records.RECORD_BYTES`` fails for good, counted ``failed`` for its rule; the others are recorded without
        it.  Firings not recorded because PostgreSQL failed are ``lost``."""
        records: list[_records.NewRecord] = []
        firings: list[Firing] = []
        for item in items:
            try:
                # (its id drawn below, once the records are known; meanwhile the widest bigint, so that its size,
                # measured here, is no less than at the insert: one record beyond the bound would refuse them all)
                record = new_record(-2**63, *item)
                _records.encode_record(record)
            except OutboxError as refused:
                self.count([item[0]], "failed")
                logger.error("outbox: the detached firing of rule %r by ended transaction %s fails for good, not "
                             "recorded: %s", item[0].rule.name, item[1], refused)
                continue
            records.append(record)
            firings.append(item[0])
        if records:
            self._insert_now(records, firings, retries)

    def _insert_now(self, records: list[_records.NewRecord], firings: list["Firing"], retries: int) -> None:
        """``record_now``'s transaction: insert ``records`` (of ``firings``) with fresh ids, then run them."""
        try:
            ids, storage = self.draw_ids(len(records))
            for record, record_id in zip(records, ids):
                record.id = record_id
            with self.catalog.engine.begin() as connection:
                self.insert(connection, records, storage)
        except Exception as error:
            if isinstance(error, GeneratedKeysReset) and retries:
                return self._insert_now(records, firings, retries - 1)
            with self._mutex:
                self._lost += len(records)
            logger.error("outbox: could not record %d detached firing(s) of an ended transaction (%s); they are "
                         "lost: %s", len(records), ", ".join(sorted({firing.rule.name for firing in firings})),
                         describe_error(error))
            return
        self.run_recorded([(record_id, firing, 0) for record_id, firing in zip(ids, firings)])

    def settle_later(self, tree: Unsettled) -> None:
        """``tree``'s commit outcome is unknown (its flush lost the connection, and its log row could not be read):
        its firings wait for that row (:meth:`settle`, tried now and at each recovery pass)."""
        with self._mutex:
            self._unsettled.append(tree)
        self.settle()

    def settle(self) -> None:
        """Settle the trees whose commit outcome was unknown by their transaction-log rows: committed, the records
        their flushes wrote run (pending and owned by this process, nobody else would run them); not, their aborts'
        records are written and run, as at an abort.  While PostgreSQL cannot answer, they wait for the next pass.
        (The outcome is settled once PostgreSQL answers: the flush's session has ended by then.)"""
        with self._mutex:
            waiting, self._unsettled = self._unsettled, []
        for index, tree in enumerate(waiting):
            try:
                with self.catalog.autocommit_connection() as connection:
                    committed = _records.logged(connection, tree.log_id)
            except Exception as error:      # (still unreachable: lost connection, refused, schema gone)
                with self._mutex:
                    self._unsettled[:0] = waiting[index:]
                logger.warning("outbox: the detached firings of %d transaction(s) whose commit outcome is unknown "
                               "wait for PostgreSQL to say it: %s", len(waiting) - index, describe_error(error))
                return
            logger.info("outbox: transaction %s %s; its detached firings run accordingly", tree.log_id,
                        "committed" if committed else "did not commit")
            if committed:
                self.count(tree.cancelled_if_committed, "cancelled")
                self.run_recorded([(record_id, firing, 0) for record_id, firing in tree.written])
            else:
                self.count(tree.cancelled_if_aborted, "cancelled")
                self.record_now(tree.keep)

    def run_recorded(self, items: Iterable[tuple[int, "Firing", int]]) -> None:
        """Queue recorded firings ``(record id, firing, attempts)`` to run."""
        self._executor.submit([Work(record_id, firing, attempts) for record_id, firing, attempts in items])

    def count(self, firings: list["Firing"], what: RuleCounter) -> None:
        """Add each of ``firings`` to its rule's counter ``what``: one call of the rule manager per rule."""
        rules = {firing.rule.name: firing.rule for firing in firings}
        for name, count in collections.Counter([firing.rule.name for firing in firings]).items():
            self.rules.count(rules[name], what, count)

    # --- running ------------------------------------------------------------------------------

    def still_owned(self, ids: list[int]) -> set[int]:
        with self.catalog.engine.connect() as connection:
            return _records.still_owned(connection, self.owner, ids)

    def fail_alone(self, work: Work, error: BaseException) -> None:
        """Mark one record failed in a transaction of its own (its group could not commit with it), and count its
        firing failed for its rule once marked, unless the rule manager counted its last run's outcome (it failed or
        was cancelled there; one that executed, ``Work.uncounted``, or never ran, was counted none) — or it never ran
        here and was claimed (``Work.claimed``): no ``fired`` here awaits an outcome then."""
        logger.error("detached rule %r failed for good on %s after %d attempt(s): %s", work.firing.rule.name,
                     work.firing.event.describe(), work.attempts, describe_error(error))
        if self.mark_failed(work.record_id, error) and (work.uncounted or not (work.ran or work.claimed)):
            work.uncounted = False
            self.count([work.firing], "failed")

    def fail_unmade(self, record_id: int, error: BaseException) -> None:
        """Mark record ``record_id``, of which no firing could be made (``error``: an event this version cannot
        decode, say), failed in a transaction of its own; counted for no rule."""
        logger.error("outbox record %d cannot be run: %s", record_id, describe_error(error))
        self.mark_failed(record_id, error)

    def mark_failed(self, record_id: int, error: BaseException) -> bool:
        """Mark record ``record_id`` failed with ``error`` in a transaction of its own; False if that failed (logged:
        the record stays pending)."""
        try:
            with self.catalog.engine.begin() as connection:
                connection.exec_driver_sql(*_records.finishing(self.owner, failed=[(record_id,
                                                                                    describe_error(error))]))
        except Exception as failure:
            logger.error("outbox: could not mark record %d failed (%s); it stays pending", record_id,
                         describe_error(_records.taken_over(failure) or failure))
            return False
        return True

    def wait_idle(self, timeout: float | None = 30.0) -> None:
        """Wait until every firing this process queued has been run (or parked: PostgreSQL unreachable); raises
        :class:`~activedb.errors.WaitTimeout` (a ``TimeoutError``) after ``timeout`` seconds naming the rules of the
        firings in the groups still running."""
        check_seconds("wait_idle", "timeout", timeout, none="no limit")
        if not self._executor.wait_idle(timeout):
            groups, rules = self._executor.running_rules()
            counts = self._executor.statistics()
            running = ", ".join(f"{name} ({count:,})" for name, count in sorted(rules.items())) or "none"
            raise WaitTimeout(
                f"{self._executor.backlog} detached rule firing(s) still queued or running after {timeout} s — "
                f"running: {running}, in {groups} group transaction(s); {counts['ready']:,} queued, "
                f"{counts['parked']:,} parked. A firing runs in a group transaction of its group runner, one after "
                f"another: a rule that never returns holds one of the outbox's group runners (max_groups = "
                f"{self.options.max_groups}) and the firings after it wait; make the rule return (a lock or statement "
                f"timeout, a deadline of its own), give the outbox a rule deadline (OutboxOptions(rule_deadline=…): "
                f"{self._deadline_said()}), or wait longer")

    def _deadline_said(self) -> str:
        deadline = self.options.rule_deadline
        return "none now" if deadline is None else f"{deadline:g} s now"

    @property
    def running(self) -> int:
        """Firings queued, running or parked in this process."""
        return self._executor.backlog

    @property
    def runners(self) -> int:
        """Group runners of this process started and not finished: each runs group transactions (top-level,
        named :data:`GROUP_TRANSACTION`) one after another until no firing is ready (the interleaving runner of
        ``activedb.testing`` waits for the group transactions they are about to begin)."""
        return self._executor.runners

    def pace_takes(self, pacer: TakePacer) -> Callable[[], None]:
        """Extender tier: from now on a group runner calls ``pacer.before_take()`` (:class:`TakePacer`) before it takes
        the ready firings as its next group, and takes what is ready when it returns — the interleaving runner of
        ``activedb.testing`` pauses there, so that firings recorded meanwhile by other trees join the same group or
        not, as the run chooses.  Returns the function that stops it (a runner already in ``before_take`` finishes
        it).  One pacer at a time: :class:`~activedb.errors.OutboxError` if one paces already.  Without a pacer a
        runner takes at once (the default: it costs a runner nothing)."""
        if not callable(getattr(pacer, "before_take", None)):
            raise BadArgument(f"Outbox.pace_takes(pacer={pacer!r:.80}) takes an object with a before_take() method "
                              f"(activedb.outbox.TakePacer)")
        replaced = self._executor.pace(pacer)
        if replaced is not None:
            self._executor.pace(replaced)
            raise OutboxError(f"the outbox's group runners are paced already (by {replaced!r:.80}): stop that pacer "
                              f"(the function its pace_takes returned) before pacing them again")

        def stop() -> None:
            self._executor.pace(None)
        return stop

    @property
    def idle_waiters(self) -> int:
        """Threads in :meth:`wait_idle` now (waiting, or about to, for this process's firings to be run)."""
        return self._executor.idle_waiters

    def wait_recovery_idle(self, timeout: float | None) -> bool:
        """Wait until the recovery thread neither runs a pass nor has one due: it waits for its next wake (a rule
        registered, :meth:`retry_failed`, the ``recovery_interval``) — or it does not run (not started, or closed).
        True then; False if ``timeout`` seconds passed first (None: no limit).  What a test synchronises on before it
        breaks PostgreSQL's sessions: a pass woken by a rule's registration may otherwise run late, meet the broken
        connection first and have the pool reconnect.  Passes run by a direct :meth:`recover` call are not waited
        for."""
        bounded = None if timeout is None else min(timeout, threading.TIMEOUT_MAX)

        def idle() -> bool:
            if self._thread is None or not self._thread.is_alive():
                return True
            return not self._passing and (self._closed or not self._wake.is_set())   # (closed: no pass starts)

        with self._recovery_idle:
            return self._recovery_idle.wait_for(idle, bounded)

    @property
    def recovery_running(self) -> bool:
        """Whether this process's recovery thread runs: started by :meth:`start` (its liveness lock taken), until
        :meth:`close`."""
        with self._mutex:
            thread = self._thread
        return thread is not None and thread.is_alive()

    def recording(self, transaction: "Transaction") -> bool:
        """Whether the outbox records firings of ``transaction``'s tree at its commit: its recording participant is
        enlisted in the tree's root from the tree's first detached-family firing on (a tree that fires none costs
        its commit nothing here).  Changes nothing."""
        state = lowlevel.slot(transaction.root, TreeState, create=False)
        if state is None:
            return False
        with state.mutex:
            return state.participant is not None

    # --- recovery -----------------------------------------------------------------------------

    def rules_changed(self) -> None:
        """A rule was registered: records of it may now be claimable (wakes the recovery thread)."""
        self._wake.set()

    def recover(self, limit: int = CLAIM_LIMIT) -> int:
        """Claim pending records nobody alive runs (their process died, or they were retried) whose rules are
        registered here, and run them; also retry the firings parked while PostgreSQL was unreachable.
        Returns how many records were claimed."""
        check_whole_number("outbox.recover", "limit", limit, 0)
        if not self._started:
            self.start()
        self.settle()
        with self._claim_mutex:       # one pass at a time: a caller waits for a pass in flight to submit
            self._executor.unpark()
            names = [rule.name for rule in self.rules]
            if not names or self._executor.backlog > CLAIM_BACKLOG:
                return 0
            # Own records held here are left out (``record_ids``); one recorded by a flush that committed and not yet
            # queued may be claimed as well and queued twice: the second run's marks fail (``status = 'pending'``),
            # so it writes nothing (README, "Recovery and several processes").
            mine_but = self._executor.record_ids() if self._claim_unknown else None
            try:
                with self.catalog.writing(
                        "claiming pending outbox records",
                        "if the claim committed (the connection broke at its COMMIT) those records are this process's "
                        "now, else they are as they were: either way the next recovery pass (recover(), or every "
                        "recovery_interval) claims them and runs each once") as connection:
                    rows = _records.claim(connection, self.owner, names, limit, mine_but)
            except DatabaseUnavailable:
                self._claim_unknown = True
                raise
            if len(rows) < limit:
                self._claim_unknown = False
            works, unregistered = [], []
            for row in rows:
                try:
                    rule = self.rules.get(row.rule)
                except RuleError:      # removed since the pass read the names: its records are not this pass's
                    unregistered.append(row)
                    continue
                try:
                    firing = Firing(rule, _records.decode_event(row.event), tuple(row.chain),
                                    Coupling(row.coupling), -row.id)  # type: ignore[call-arg]  # (by value)
                except Exception as error:     # e.g. an event this version cannot decode: failed, for a person
                    self.fail_unmade(row.id, error)
                    continue
                # (Its retries start anew: row.attempts counts finishes.  Claimed: its run here counts ``fired``.)
                works.append(Work(row.id, firing, claimed=True))
            self._executor.submit(works)
            if unregistered:
                self._release({row.id: row.rule for row in unregistered})
        if works:
            logger.info("outbox: claimed %d pending detached firing(s)", len(works))
        return len(works)

    def _release(self, rows: dict[int, str]) -> None:
        """Give up the claim of ``rows`` (record id: its rule), claimed by a pass while their rules were removed here:
        they stay pending, unowned, as records of a rule this process does not register (declaring the rule again
        runs them)."""
        rules = ", ".join(sorted(set(rows.values())))
        try:
            with self.catalog.engine.begin() as connection:
                _records.release(connection, self.owner, list(rows))
        except Exception as error:
            logger.warning("outbox: %d claimed record(s) of rule(s) removed meanwhile (%s) stay pending and this "
                           "process's until it ends (their claim could not be given up: %s)", len(rows), rules,
                           describe_error(error))
            return
        logger.info("outbox: %d pending record(s) of rule(s) removed while a recovery pass claimed them (%s) stay "
                    "pending; declaring the rule again runs them", len(rows), rules)

    def _recovery_loop(self) -> None:
        while True:
            interval = self.recovery_interval
            # (the next pass an interval after this one ended; for ever: no pass by the clock, as None)
            self.clock.wait_until(self._wake, None if interval is None or math.isinf(interval)
                                  else self.clock.now() + interval)
            with self._mutex:
                if self._closed:
                    self._recovery_idle.notify_all()
                    return
                self._passing = True
            self._wake.clear()
            try:
                self._liveness.check()
                while self.recover() == CLAIM_LIMIT:
                    pass
            except Exception as error:       # PostgreSQL down, schema missing: try again next pass
                logger.warning("outbox recovery pass failed: %s", describe_error(error))
            finally:
                with self._mutex:
                    self._passing = False
                    self._recovery_idle.notify_all()

    # --- what the outbox holds ------------------------------------------------------------------

    def statistics(self) -> OutboxStatistics:
        with self.catalog.autocommit_connection() as connection:     # (lost: DatabaseUnavailable)
            counts = _records.counts(connection)
        per_rule: dict[str, dict[str, int]] = {}
        for status, by_rule in counts.items():
            for rule, count in by_rule.items():
                per_rule.setdefault(rule, {})[status] = count
        with self._mutex:
            lost = self._lost
            unsettled = sum(max(len(tree.written), len(tree.keep)) for tree in self._unsettled)
        running = self._executor.statistics()      # ready, running, parked, groups, splits
        running["parked"] += unsettled             # (firings of trees whose outcome is unknown: at most that many)
        return OutboxStatistics(
            pending=sum(counts.get("pending", {}).values()), done=sum(counts.get("done", {}).values()),
            failed=sum(counts.get("failed", {}).values()), per_rule=per_rule, lost=lost, **running)

    def failures(self, limit: int = 100, *, ids: Iterable[int] | None = None) -> list[FailedFiring]:
        """The most recent firings that failed for good, newest first; ``ids``: only those of these record ids."""
        check_whole_number("outbox.failures", "limit", limit, 0)
        listed = None if ids is None else _record_ids("outbox.failures", ids)
        with self.catalog.autocommit_connection() as connection:     # (lost: DatabaseUnavailable)
            rows = _records.failed(connection, limit, listed)
        result = []
        for row in rows:
            try:
                event = _records.decode_event(row.event).describe()
            except Exception:
                event = str(row.event)[:200]
            trigger = row.trigger_id + (f" (log {row.trigger_log_id})" if row.trigger_log_id else "")
            result.append(FailedFiring(row.id, row.rule, row.coupling, event, trigger, row.trigger_outcome,
                                       row.attempts, row.error or "", row.finished_at))
        return result

    def prune(self, *, older_than: datetime.timedelta | float) -> int:
        """Delete the records of firings that ran (``done``) more than ``older_than`` ago (a timedelta or seconds);
        returns how many.  A done record is never run again — exactly-once rests on the ingestion ledger and on
        pending records — so the table need not keep it; but compensating a batch (``db.batches``) follows the
        detached firings it triggered through these records: prune only what you will never compensate, as
        ``db.batches.prune`` says of lineage.  Failed and pending records are kept."""
        age = age_seconds(older_than, "outbox.prune(older_than=...)", BadArgument)
        if age == math.inf:
            return 0            # (nothing was done that long ago)
        with self.catalog.writing("pruning the outbox's done records",
                                  "those done records were all deleted or none was — prune again") as connection:
            return _records.prune_done(connection, age)

    def retry_failed(self, ids: Iterable[int] | None = None) -> int:
        """Make failed records pending again (``ids``, or all of them) and run a recovery pass (on the recovery
        thread, the outbox started first if it was not); returns how many were reset."""
        listed = None if ids is None else _record_ids("outbox.retry_failed", ids)
        with self.catalog.writing("making failed outbox records pending again",
                                  "they were all made pending again or none was — call retry_failed again (a record "
                                  "pending already is left as it is)") as connection:
            count = _records.retry(connection, listed)
        if count:
            if not self._started:
                self.start()        # (its recovery thread runs the pass: there is none to wake before start)
            self._wake.set()
        return count


def _record_ids(call: str, ids: object) -> list[int]:
    """``ids`` as a list of record ids; raises ``BadArgument`` naming ``call`` if they are not whole numbers."""
    listed = None if isinstance(ids, (str, bytes)) or not isinstance(ids, Iterable) else list(ids)
    if listed is None or not all(isinstance(one, int) and not isinstance(one, bool) for one in listed):
        raise BadArgument(f"{call}(ids={ids!r}) takes record ids (whole numbers, as db.outbox.failures() and "
                          f"`activedb outbox` show them; one id as [id]), or None for every failed record")
    return listed
