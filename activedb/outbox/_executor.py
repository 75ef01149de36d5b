"""Running recorded firings: group commit, retries, failures.  Design note: the package's ``README.md``
("Group commit, and why subtransactions", "Failures and retries").

Thread-safety: ``_mutex`` protects ``_ready``, ``_parked``, ``_runners``, ``_running``, ``_taken``, ``_groups`` (and
the fields of its ``_GroupRun``s), ``_given_up``, ``_runner_threads``, ``_watcher`` and ``_pacer``; runners take work
under it and run groups without it.  No mutex is held while running a group, calling the pacer, or giving a firing up
(its SQL, its log).
"""

from __future__ import annotations

import collections
import logging
import sys
import threading
import traceback
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import psycopg
import sqlalchemy as sa

from activedb import lowlevel
from activedb.errors import (DuplicateKey, Failure, LockWaitTimeout, RecordsTakenOver, RuleDeadlineExceeded,
                             RuleFailed, TransactionError, causes, classify, rule_past_deadline, shown_error,
                             sqlstate_of)
from activedb.outbox import _records
from activedb.store import is_connection_failure, storable_text
from activedb.txn import Along, CommitParticipant, FiringOutcome

if TYPE_CHECKING:  # pragma: no cover
    from activedb.outbox._outbox import Outbox
    from activedb.rules import Firing, RuleCounter
    from activedb.txn import Transaction

logger = logging.getLogger("activedb.outbox")

#: The name of every group transaction (a top-level transaction whose children are the firings it runs).
GROUP_TRANSACTION = "outbox"

class TakePacer(Protocol):
    """Paces the group runners' takes (:meth:`Outbox.pace_takes`; the interleaving runner of ``activedb.testing``
    makes each take a step of its run): a runner about to take the ready firings as its next group calls
    :meth:`before_take` first, in its own thread, with no mutex held — and takes what is ready when it returns."""

    def before_take(self) -> None:
        """A group runner is about to take the ready firings (up to ``group_size``) as its next group: return when it
        may.  What it raises is logged, and the runner takes its group as if it had returned."""


def is_retryable(error: BaseException, *, raised_by_rule: bool = False) -> bool:
    """A failure PostgreSQL or the lock manager caused (:func:`activedb.errors.classify`: a transient one, or
    the lock manager's timeout), not the rule's.  ``raised_by_rule``: ``error`` is what a firing raised — its
    context (what the rule was handling when it raised it, in an ``except`` block) is not read: that error is the
    rule's own, even raised while it handled a conflict."""
    contexts = not raised_by_rule
    return (classify(error, contexts=contexts).transient
            or any(isinstance(cause, LockWaitTimeout) for cause in causes(error, contexts=contexts)))


def interrupts_the_process(error: BaseException) -> bool:
    """Whether ``error`` is a Ctrl-C of the process: a KeyboardInterrupt on the main thread, where Python raises the
    signal's (a group runner runs on a worker thread: one raised there is what a rule raised, its failure)."""
    return isinstance(error, KeyboardInterrupt) and threading.current_thread() is threading.main_thread()


def describe_error(error: BaseException) -> str:
    """``Type: message`` of what went wrong — for a rule that raised, of what the rule raised (the record
    names the rule and the event already).  A driver's error is summarised in one line (:func:`_driver_summary`):
    its text holds the statement and its parameters, user data that logs and records must not keep."""
    while isinstance(error, RuleFailed) and error.__cause__ is not None:
        error = error.__cause__
    said = shown_error(error, message=True)
    text = _driver_summary(error) or (f"{type(error).__name__}: {said}" if said else type(error).__name__)
    cause = error.__cause__
    if cause is not None:
        message = shown_error(cause, message=True)
        said = _driver_summary(cause) or f"{type(cause).__name__}: {message}"
        if message not in text and said not in text:
            text += f" (caused by {said})"
    return storable_text(text)


def _record_error(outcome: FiringOutcome, error: BaseException | None) -> str:
    """What a record that ends failed keeps (:func:`describe_error`): for a firing the rule manager counted
    ``cancelled`` — its action let a nested firing's failure or the cascade limit through — that it was cancelled,
    and by what, naming the nested rule that failed."""
    if error is None:
        return "failed"
    if outcome is not FiringOutcome.CANCELLED:
        return describe_error(error)
    if isinstance(error, RuleFailed):
        return storable_text(f"cancelled: rule {error.rule!r}, fired by its action, failed: {describe_error(error)}")
    return storable_text(f"cancelled: {describe_error(error)}")


def _undone(outbox: "Outbox", works: list[Work]) -> None:
    """Count ``cancelled`` the last run of each of ``works`` that executed in a group whose abort undid it
    (``Work.uncounted``): its attempt's one outcome, now that the work runs again or elsewhere."""
    undone = [work for work in works if work.uncounted]
    for work in undone:
        work.uncounted = False
    if undone:
        outbox.count([work.firing for work in undone], "cancelled")


def _dropped(outbox: "Outbox", works: list[Work]) -> None:
    """Count ``cancelled`` the attempt of each of ``works``, dropped from memory once the outbox closed (their records
    stay pending, for the database's next process), that awaits an outcome here: its last run executed in a group
    whose abort undid it (``Work.uncounted``, :func:`_undone`), or it never ran here and no recovery pass claimed it
    (the dispatch that recorded it counted its ``fired``: ``Work.ran``, ``Work.claimed``).  The next process's run of
    a record is an attempt of its own there."""
    unrun = [work for work in works if not (work.ran or work.claimed or work.uncounted)]
    _undone(outbox, works)
    if unrun:
        outbox.count([work.firing for work in unrun], "cancelled")


def _driver_summary(error: BaseException) -> str | None:
    """``Type (SQLSTATE s): PostgreSQL's first line`` of a driver's error (SQLAlchemy's, or psycopg's own), as
    :func:`activedb.errors.database_failure` reads it: without the statement, its parameters or PostgreSQL's
    DETAIL (which quotes the values); None for any other error."""
    if not isinstance(error, (sa.exc.StatementError, psycopg.Error)):
        return None
    orig = getattr(error, "orig", None) or error
    lines = str(orig).strip().splitlines()
    sqlstate = sqlstate_of(error)
    state = f" (SQLSTATE {sqlstate})" if sqlstate else ""
    return f"{type(orig).__name__}{state}: {lines[0] if lines else 'no message'}"


@dataclass(eq=False)
class Work:
    """A recorded firing ready to run (``attempts``: how often it failed retryably so far in this process's run of
    it — not the record's stored ``attempts``, which counts its finishes).  Each run is an attempt with one outcome in
    the rule manager's counters (rules README, "Counters count attempts"): ``ran``, whether this process ran it
    before (a run after the first counts ``fired`` once more); ``claimed``, whether a recovery pass claimed its record
    (a dead process's, or one ``retry_failed`` made pending: no dispatch here counted ``fired`` for this run — that
    process's did, or the attempt here that ended failed —, so its first run here counts it too); ``uncounted``,
    whether its last run executed and its group has not committed yet (its ``executed`` is counted then;
    ``cancelled`` if the group's abort undid it and it runs again, here or — dropped by ``close()`` — in the next process,
    ``failed`` if it fails for good)."""

    record_id: int
    firing: "Firing"
    attempts: int = 0
    executed: bool = False        # its condition held and its action ran (set when it committed)
    ran: bool = False
    claimed: bool = False
    uncounted: bool = False


@dataclass(eq=False)
class _GroupRun:
    """What a group runner runs now (``Executor._groups``, by its thread), for the rule deadline: the group it took,
    the group transaction of its current attempt, the firing running in it — or whether that transaction commits —
    and since when (the outbox's clock).  Fields are the executor's ``_mutex``'s."""

    works: list[Work]
    thread: int
    root: "Transaction | None" = None
    work: Work | None = None             # the firing running now (None between firings)
    since: float = 0.0
    settled: set[int] = field(default_factory=set)   # id() of the works settled: committed, failed, parked, re-queued
    given_up: RuleDeadlineExceeded | None = None     # Invariant: set => this run is in _given_up, not in _groups
    committing: bool = False             # its group transaction commits now (every firing of the attempt returned)
    # Its runner was released while its commit waited past the rule deadline (Invariant: set => its thread is neither
    # in _runners nor in _runner_threads; it ends once its group is settled).
    released: bool = False


class _GivenUp(Exception):
    """Raised in a runner whose firing was given up past the rule deadline, once its thread returns: its group
    transaction aborts, and the runner ends without settling anything (the deadline watcher did)."""


class _Outcome:
    DONE = "done"            # its subtransaction committed (condition true or false)
    RETRY = "retry"          # failed retryably; stays pending
    FAILED = "failed"        # failed for good


@dataclass(eq=False)
class GroupMarks(CommitParticipant):
    """Marks a group's records done or failed in the group root's flush, in its last round trip (raises
    ``RecordsTakenOver`` there if one of them is no longer this process's)."""

    owner: int
    done: list[int] = field(default_factory=list)
    failed: list[tuple[int, str]] = field(default_factory=list)

    def statements_along(self, transaction: "Transaction") -> tuple[Along, ...]:
        if not (self.done or self.failed):
            return ()
        sql, parameters = _records.finishing(self.owner, done=self.done, failed=self.failed, log_id=transaction.log_id)
        return (Along(sql, parameters, _records.taken_over),)


class Executor:
    """Runs ready firings in groups on the transaction manager's worker pool.  Thread-safe."""

    def __init__(self, outbox: "Outbox", *, group_size: int, max_groups: int, max_attempts: int,
                 rule_deadline: float | None = None):
        if group_size < 1 or max_groups < 1 or max_attempts < 1:
            raise ValueError("group_size, max_groups and max_attempts must be at least 1")
        self._outbox = outbox
        self.group_size = group_size
        self.max_groups = max_groups
        self.max_attempts = max_attempts
        self.rule_deadline = rule_deadline
        self._mutex = threading.Lock()
        self._idle = threading.Condition(self._mutex)
        self._ready: collections.deque[Work] = collections.deque()
        self._parked: list[Work] = []            # waiting for PostgreSQL to come back
        self._runners = 0                        # Invariant: 0 <= _runners <= max_groups
        self._running = 0                        # works taken by runners and not yet settled
        self._taken: collections.Counter[int] = collections.Counter()   # their record ids (Invariant: total == _running)
        # The groups runners run now, by runner thread (Invariant: their works are _running's).
        self._groups: dict[int, _GroupRun] = {}
        # Runs given up past the rule deadline whose threads have not returned, by thread (their works are not
        # _running's, their runners not _runners: released when given up).
        self._given_up: dict[int, _GroupRun] = {}
        self._watcher: threading.Thread | None = None   # gives up firings past the rule deadline (started with one)
        self._watch_wake = threading.Event()           # a firing started, or close(): the watcher looks again
        self._runner_threads: set[int] = set()    # the threads running a runner now (close() must not wait for its own)
        self._idle_waiters = 0                   # threads in wait_idle
        self._closed = False
        self._pacer: TakePacer | None = None     # (Outbox.pace_takes)
        self.groups = 0                          # group transactions committed
        self.splits = 0                          # groups split to isolate a failure

    # --- queue ------------------------------------------------------------------------------

    def submit(self, works: list[Work]) -> None:
        """Queue ``works`` to run; once closed, drop them as :meth:`close` drops the queued ones (:meth:`_drop`: a
        tree that committed while ``close()`` ran hands its recorded firings over, a group its retried members)."""
        if not works:
            return
        start = 0
        with self._mutex:
            closed = self._closed
            if not closed:
                self._ready.extend(works)
                start = self._start_runners()
        if closed:
            self._drop(works, "handed to the outbox after it closed")
            return
        for _ in range(start):
            self._submit_runner()

    def _start_runners(self) -> int:
        """Caller holds ``_mutex``: how many runners to start now (and counts them as started)."""
        if self._closed:
            return 0
        start = max(0, min(self.max_groups, -(-len(self._ready) // self.group_size)) - self._runners)
        self._runners += start
        return start

    def _submit_runner(self) -> None:
        try:
            self._outbox.transactions.pool.submit(self._runner)
        except TransactionError:        # the pool is shut down (the Database was closed)
            with self._mutex:
                self._runners -= 1
                self._idle.notify_all()

    def pace(self, pacer: TakePacer | None) -> TakePacer | None:
        """Have ``pacer`` called before each take from now on (None: no more); returns the pacer it replaces."""
        with self._mutex:
            replaced, self._pacer = self._pacer, pacer
        return replaced

    def unpark(self) -> None:
        with self._mutex:
            works, self._parked = self._parked, []
        self.submit(works)

    def record_ids(self) -> set[int]:
        """The record ids of the works queued, running or parked."""
        with self._mutex:
            return ({work.record_id for work in self._ready} | {work.record_id for work in self._parked}
                    | set(self._taken))

    @property
    def runners(self) -> int:
        """Runners started and not finished."""
        with self._mutex:
            return self._runners

    @property
    def backlog(self) -> int:
        """Works queued, running or parked."""
        with self._mutex:
            return len(self._ready) + self._running + len(self._parked)

    @property
    def idle_waiters(self) -> int:
        """Threads in :meth:`wait_idle` now."""
        with self._mutex:
            return self._idle_waiters

    def statistics(self) -> dict[str, int]:
        with self._mutex:
            return {"ready": len(self._ready), "running": self._running, "parked": len(self._parked),
                    "groups": self.groups, "splits": self.splits, "given_up": len(self._given_up)}

    def running_rules(self) -> tuple[int, collections.Counter[str]]:
        """How many groups run now, and how many of their firings each rule has (the members of a group a runner runs:
        one of them is running, the others wait for it or ran already)."""
        with self._mutex:
            groups = [run.works for run in self._groups.values()]
        return len(groups), collections.Counter(work.firing.rule.name if work.firing is not None else "(none)"
                                                for group in groups for work in group)

    def running_firings(self) -> tuple[list[str], list[str]]:
        """The firings the group runners run now, and those given up past the rule deadline whose threads still run:
        each as ``rule 'r' on <event> (record N)``."""
        with self._mutex:
            running = [run.work for run in self._groups.values() if run.work is not None]
            given_up = [run.work for run in self._given_up.values() if run.work is not None]
        return [_described(work) for work in running], [_described(work) for work in given_up]

    def wait_idle(self, timeout: float | None) -> bool:
        bounded = None if timeout is None else min(timeout, threading.TIMEOUT_MAX)  # (inf: no thread waits so long)
        with self._idle:
            self._idle_waiters += 1
            try:
                return self._idle.wait_for(lambda: not self._ready and self._running == 0 and self._runners == 0,
                                           bounded)
            finally:
                self._idle_waiters -= 1

    def close(self, wait: float = 0.0) -> bool:
        """Run no more groups (the queued and parked works are dropped: their records stay pending in PostgreSQL, for
        the next process) and wait up to ``wait`` seconds for the groups running now (not for one whose runner is the
        calling thread); False if some still run.  A dropped work whose attempt awaits an outcome here — its last run
        executed in a group whose abort undid it, or it never ran (:func:`_dropped`) — has that attempt counted
        ``cancelled``: it runs again elsewhere, as :func:`_undone` counts a run again here."""
        with self._idle:
            self._closed = True
            dropped = [*self._ready, *self._parked]
            self._ready.clear()
            self._parked.clear()
            self._idle.notify_all()
            mine = 1 if threading.get_ident() in self._runner_threads else 0
            self._watch_wake.set()
        _dropped(self._outbox, dropped)         # (no mutex held: it calls the rule manager)
        with self._idle:       # (a runner released while its group commits still runs that group)
            return self._idle.wait_for(
                lambda: self._runners + sum(run.released for run in self._groups.values()) <= mine, wait)

    # --- runners ----------------------------------------------------------------------------

    def _runner(self) -> None:
        me = threading.get_ident()
        with self._mutex:
            self._runner_threads.add(me)
        while True:
            with self._mutex:
                pacer = self._pacer if self._ready and not self._closed else None
            if pacer is not None:           # (only while paced: a test's interleaving runner)
                try:
                    pacer.before_take()
                except Exception:
                    logger.exception("outbox: the group runners' pacer failed; the runner takes its group")
            with self._mutex:
                if not self._ready or self._closed:
                    self._runners -= 1
                    self._runner_threads.discard(me)
                    self._idle.notify_all()
                    return
                group = self._take()
                self._running += len(group)
                self._taken.update(work.record_id for work in group)
                self._groups[me] = _GroupRun(group, me)
            try:
                self._run(group, retried=False)
            except _GivenUp:                # (the watcher settled its group and released this runner)
                pass
            except BaseException as error:  # never lose the accounting; the records stay pending in PostgreSQL
                if interrupts_the_process(error):      # (Ctrl-C: parked, and the program stops)
                    self._park(group)
                    raise
                where = _where_parked(self._park(group), f"its {len(group)} record(s)")
                if isinstance(error, Exception) and classify(error) is not Failure.BUG:   # (an outage, a refusal)
                    logger.warning("outbox group runner stopped: %s; %s", describe_error(error), where)
                else:                       # a bug: its traceback
                    logger.exception("outbox group runner failed; %s", where)
            finally:
                with self._mutex:
                    run = self._given_up.pop(me, None)
                    if run is None:
                        run = self._groups.pop(me)
                        self._release(run)
                    self._idle.notify_all()
                self._watch_wake.set()      # (the deadline watcher looks again: it ends with the last group once closed)
            if run.given_up is not None or run.released:    # (its runner was released past the deadline)
                return

    def _park(self, works: list[Work]) -> bool:
        """Park ``works`` until the next recovery pass (PostgreSQL unreachable, or their runner stopped) — or, once
        closed, drop them as :meth:`close` drops the parked ones (their records stay pending, for the database's next
        process).  Returns whether they were parked (False: dropped)."""
        with self._mutex:
            if not self._closed:
                self._parked.extend(works)
                return True
        _dropped(self._outbox, works)
        return False

    def _drop(self, works: list[Work], why: str) -> None:
        """Drop ``works``, which reached the queue once closed (``why``), as :meth:`close` drops the queued ones
        (:func:`_dropped`), and say so: their records stay pending, for the database's next process."""
        _dropped(self._outbox, works)
        rules = ", ".join(sorted({repr(work.firing.rule.name) for work in works}))
        logger.warning("outbox: %d firing(s) of rule(s) %s %s are not run here; %s", len(works), rules, why,
                       _where_parked(False, f"their {len(works)} record(s)"))

    def _release(self, run: _GroupRun) -> None:
        """Caller holds ``_mutex``: ``run``'s works are no longer running (``_running``, ``_taken``)."""
        self._running -= len(run.works)
        self._taken.subtract(work.record_id for work in run.works)
        self._taken += collections.Counter()        # (drops the ids at zero)

    def _settled(self, works: list[Work]) -> None:
        """``works``, of the calling runner's group, are settled (committed, failed, parked or queued again): a firing
        of the group given up later leaves them as they are."""
        with self._mutex:
            run = self._groups.get(threading.get_ident())
            if run is not None:
                run.settled.update(id(work) for work in works)

    def _take(self) -> list[Work]:
        """Caller holds ``_mutex``, with ``_ready`` not empty: the next group, taken from ``_ready`` — the first ready
        firing alone if its rule is kept recorded (``rules.detached.kept_recorded``: a compensation undoes its
        transaction whole — one naming it, ``rule:<name>``, or the rule's own —, so the firing's must be a transaction
        of its own), else, in order, up to
        ``group_size`` ready firings of the other rules (those of kept rules stay queued, in order, for the next
        takes).  README, "Group commit, and why subtransactions"."""
        kept = self._outbox.rules.detached.kept_recorded
        if not kept:
            return [self._ready.popleft() for _ in range(min(self.group_size, len(self._ready)))]
        if self._ready[0].firing.rule.name in kept:
            return [self._ready.popleft()]
        group: list[Work] = []
        skipped: list[Work] = []
        while self._ready and len(group) < self.group_size:
            work = self._ready.popleft()
            (skipped if work.firing.rule.name in kept else group).append(work)
        self._ready.extendleft(reversed(skipped))
        return group

    def _run(self, group: list[Work], *, retried: bool) -> None:
        outbox = self._outbox
        failure: Exception | None = None
        try:
            outcomes: list[str] | None = self._attempt(group)
        except Exception as error:
            outcomes, failure = None, error
        # What runs the group's members again runs outside the except clause: there, what a rule raised would get the
        # group's failure as its context (``__context__``), which ``is_retryable`` reads — a rule's own error after a
        # take-over or a conflict would pass for that conflict and be retried instead of failing for good.
        if isinstance(failure, _GivenUp):
            raise failure
        if outcomes is not None:
            self._settle(group, outcomes)
        elif isinstance(failure, RecordsTakenOver):
            mine = outbox.still_owned([work.record_id for work in group])
            remaining = [work for work in group if work.record_id in mine]
            # (Those another process runs now: this attempt, which the group's abort undid, was this process's last.)
            _undone(outbox, [work for work in group if work.record_id not in mine])
            self._settled([work for work in group if work.record_id not in mine])
            logger.warning("%d outbox record(s) were taken over by another process; running the %d still ours",
                           len(group) - len(remaining), len(remaining))
            if remaining:
                self._run(remaining, retried=retried)
        else:
            assert failure is not None
            self._group_failed(group, failure, retried)

    def _group_failed(self, group: list[Work], error: Exception, retried: bool) -> None:
        outbox = self._outbox
        if isinstance(error, DuplicateKey):
            outbox.catalog.invalidate_key_blocks()
        if is_connection_failure(error):
            self._settled(group)
            logger.warning("outbox: PostgreSQL unreachable while running %d firing(s) (%s); %s", len(group),
                           describe_error(error), _where_parked(self._park(group), "they"))
            return
        retryable = is_retryable(error) or isinstance(error, DuplicateKey)
        if len(group) > 1:
            if retryable and not retried:
                self._run(group, retried=True)
                return
            with self._mutex:
                self.splits += 1
            middle = len(group) // 2
            self._run(group[:middle], retried=False)
            self._run(group[middle:], retried=False)
            return
        work = group[0]
        work.attempts += 1
        if retryable and work.attempts < self.max_attempts:
            self._run(group, retried=True)
            return
        self._settled(group)
        outbox.fail_alone(work, error)

    def _attempt(self, group: list[Work]) -> list[str]:
        """One group transaction; returns each member's outcome (raises if the group could not commit).  A member
        is ``rules.fire`` in a subtransaction of the group's root, which tells its outcome as the rule manager counted
        it; one that failed or was cancelled was counted and logged by the rule manager — a BaseException that is no Exception (SystemExit, a KeyboardInterrupt of the rule's own)
        too, as failed (logged here), unless it is a Ctrl-C of the process (:func:`interrupts_the_process`)."""
        outbox = self._outbox
        marks = GroupMarks(outbox.owner)
        outcomes: list[str] = []
        # A run after an attempt the group's abort undid: that attempt ends cancelled (``Work.uncounted``).
        _undone(outbox, group)
        try:
            with outbox.transactions.transaction(name=GROUP_TRANSACTION, participants=[marks]) as root:
                self._attempt_members(root, group, marks, outcomes)
                self._commit_starts()
        finally:
            self._commit_ended()
        return outcomes

    def _attempt_members(self, root: "Transaction", group: list[Work], marks: GroupMarks, outcomes: list[str]) -> None:
        """Run each of ``group`` in a subtransaction of the group transaction ``root`` (:meth:`_attempt`), adding its
        outcome to ``outcomes`` and its mark to ``marks``."""
        fire = self._outbox.rules.fire
        for work in group:
            firing = work.firing
            again, work.ran = work.ran or work.claimed, True
            self._firing_starts(root, work)
            # (What the rule manager counted for this attempt as its run ended: also when an error of the
            # transaction itself came through after it — its group doomed meanwhile, given up.)
            counted: list[FiringOutcome] = []
            try:
                # (The rule manager's outcome, as its counters count it: ``fire`` runs it in a subtransaction; a
                # run after the first, or a claimed record's first, is an attempt of its own: ``fired`` once more.)
                [(outcome, error)] = fire(root, [firing], again=again, counted=counted)
            except BaseException as raised:
                if interrupts_the_process(raised):
                    raise
                if not isinstance(raised, Exception):   # (the rule manager counted it failed, logged it not)
                    logger.error("detached rule %r raised %s on %s: it failed for good", firing.rule.name,
                                 describe_error(raised), firing.event.describe())
                outcome, error = FiringOutcome.FAILED, raised
            self._firing_ended(work, counted[0] if counted else None)
            if outcome is FiringOutcome.EXECUTED or outcome is FiringOutcome.CONDITION_FALSE:
                work.executed = work.uncounted = outcome is FiringOutcome.EXECUTED
                outcomes.append(_Outcome.DONE)
                marks.done.append(work.record_id)
            elif (error is not None and is_retryable(error, raised_by_rule=True)
                  and work.attempts + 1 < self.max_attempts):
                outcomes.append(_Outcome.RETRY)
            else:
                outcomes.append(_Outcome.FAILED)
                marks.failed.append((work.record_id, _record_error(outcome, error)))

    def _settle(self, group: list[Work], outcomes: list[str]) -> None:
        """After the group committed: count (once per rule), and queue the retryable members again."""
        outbox = self._outbox
        outbox.count([work.firing for work, outcome in zip(group, outcomes)
                      if outcome is _Outcome.DONE and work.executed], "executed")
        for work in group:
            work.uncounted = False
        again = [work for work, outcome in zip(group, outcomes) if outcome is _Outcome.RETRY]
        for work in again:
            work.attempts += 1
        self._settled(group)
        with self._mutex:
            self.groups += 1
        if again:
            self.submit(again)


    # --- the rule deadline (README, "A rule that never returns") --------------------------------

    def _firing_starts(self, root: "Transaction", work: Work) -> None:
        """The calling runner starts ``work``'s firing in its group transaction ``root`` (what ``close()`` names if it
        does not return); timed, if there is a rule deadline (the watcher is started with the first)."""
        now = self._outbox.clock.now() if self.rule_deadline is not None else 0.0
        with self._mutex:
            run = self._groups[threading.get_ident()]
            run.root, run.work, run.since = root, work, now
            if self.rule_deadline is None:
                return
            if self._watcher is None:
                self._watcher = threading.Thread(target=self._watch, name="activedb-outbox-deadlines", daemon=True)
                self._watcher.start()
        self._watch_wake.set()

    def _firing_ended(self, work: Work, outcome: FiringOutcome | None) -> None:
        """``work``'s firing returned (``outcome``, as the rule manager counted it as its run ended — also when an error
        of the transaction itself, a doomed one's, came through after —; None: its run never ended, the error came
        through before); raises :class:`_GivenUp` if it was
        given up meanwhile — after taking back the outcome the rule manager counted for it
        (``_COUNTED_BY_THE_RULE_MANAGER``), as the give-up counted that attempt failed (rules README, "Counters count
        attempts"); an EXECUTED one is counted by :meth:`_settle` only, which a given-up firing never reaches."""
        with self._mutex:
            run = self._given_up.get(threading.get_ident())
            if run is None:
                self._groups[threading.get_ident()].work = None
                return
        counted = None if outcome is None else _COUNTED_BY_THE_RULE_MANAGER.get(outcome)
        if counted is not None:
            self._outbox.rules.count(work.firing.rule, counted, -1)
        raise _GivenUp(f"the firing of rule {work.firing.rule.name!r} returned after it was given up")

    def _commit_starts(self) -> None:
        """Every firing of the calling runner's group attempt returned, and its group transaction commits now: timed as
        a firing is, if there is a rule deadline (:meth:`_release_committing`)."""
        if self.rule_deadline is None:
            return
        now = self._outbox.clock.now()
        with self._mutex:
            run = self._groups[threading.get_ident()]
            run.committing, run.since = True, now
        self._watch_wake.set()

    def _commit_ended(self) -> None:
        """The calling runner's group transaction ended (committed, or aborted: also before its commit)."""
        if self.rule_deadline is None:
            return
        with self._mutex:
            run = self._groups.get(threading.get_ident())
            if run is not None:
                run.committing = False

    def _release_committing(self, run: _GroupRun, since: float, seconds: float) -> None:
        """``run``'s group transaction has been committing ``seconds`` (since ``since``): release its runner, unless its
        commit ended meanwhile, and start one for what is queued.  The group is not given up — its commit may be under
        way in PostgreSQL, and only its end says whether its firings committed —: its thread settles it when the commit
        returns, and then ends (README, "A rule that never returns")."""
        with self._mutex:
            if self._groups.get(run.thread) is not run or not run.committing or run.since != since or run.released:
                return
            run.released = True
            self._runners -= 1
            self._runner_threads.discard(run.thread)
            rules = sorted({work.firing.rule.name for work in run.works})
            start = self._start_runners()
            self._idle.notify_all()
        logger.warning("outbox: a group transaction of %d firing(s) (rules %s) has waited %s s in its commit, past the "
                       "rule deadline of %s s (PostgreSQL: another session may hold a row it writes); its runner is "
                       "released and the firings queued after it run on another; it settles its firings when its "
                       "commit returns", len(run.works), ", ".join(repr(rule) for rule in rules), f"{seconds:,.0f}",
                       f"{self.rule_deadline:,}")
        for _ in range(start):
            self._submit_runner()

    def _watch(self) -> None:
        """The watcher's thread: gives up each firing that has run ``rule_deadline`` seconds (the outbox's clock),
        waking when a firing starts and when the first deadline comes; ends once closed with no group running."""
        clock, deadline = self._outbox.clock, self.rule_deadline
        assert deadline is not None
        while True:
            with self._mutex:
                if self._closed and not self._groups:
                    self._watcher = None
                    return
                self._watch_wake.clear()        # (under the mutex: a firing that starts after sets it again)
                timed = [(run, run.work, run.since) for run in self._groups.values()
                         if run.work is not None or (run.committing and not run.released)]
            now = clock.now()
            soonest: float | None = None        # the first deadline to come, on the clock's now() scale
            for run, work, since in timed:
                due = since + deadline
                if due > now:
                    soonest = due if soonest is None else min(soonest, due)
                elif work is not None:
                    self._give_up(run, work, since, now - since)
                else:
                    self._release_committing(run, since, now - since)
            # (until the deadline, not for the time left: a clock moved since the read above still wakes it)
            clock.wait_until(self._watch_wake, soonest)

    def _give_up(self, run: _GroupRun, work: Work, since: float, seconds: float) -> None:
        """Give up ``work``'s firing, which ``run``'s runner has run ``seconds`` (since ``since``) unless it has
        returned meanwhile: under the mutex, its run leaves the running groups (its runner released); then its group
        transaction is abandoned (``lowlevel.abandon``: doomed, its reads for update ended), its record marked failed
        and counted so, the stuck thread's stack logged, and the group's other unsettled works queued again."""
        assert self.rule_deadline is not None
        rule = work.firing.rule.name
        error = RuleDeadlineExceeded(
            f"{rule_past_deadline(rule, self.rule_deadline)} (it ran {seconds:,.0f} s on "
            f"{work.firing.event.describe()}): its firing was given up and nothing it wrote commits, even if it "
            f"returns; make the rule return (a lock or statement timeout, a timeout of its own), then run it again "
            f"with `activedb outbox --retry {work.record_id}`", rule=rule, record_id=work.record_id)
        with self._mutex:
            if self._groups.get(run.thread) is not run or run.work is not work or run.since != since:
                return                          # (it returned, or the runner went on: nothing to give up)
            run.given_up = error
            del self._groups[run.thread]
            self._given_up[run.thread] = run
            self._release(run)
            if not run.released:        # (a runner released while its commit waited counts no more already)
                self._runners -= 1
                self._runner_threads.discard(run.thread)
            # (Its group's other works not settled yet run again, first: what ran in the doomed group never commits;
            # once closed, they are dropped as close() drops the queued ones.)
            again = [other for other in run.works if other is not work and id(other) not in run.settled]
            dropped = again if self._closed else []
            if not dropped:
                self._ready.extendleft(reversed(again))
            start = self._start_runners()
            self._idle.notify_all()
        if run.root is not None:
            lowlevel.abandon(run.root, error)
        frame = sys._current_frames().get(run.thread)
        stack = "".join(traceback.format_stack(frame)) if frame is not None else "(its thread has ended)\n"
        logger.error("outbox: %s. Its thread still runs, at:\n%s", error, stack.rstrip())
        if dropped:
            self._drop(dropped, f"of the group whose firing of rule {rule!r} was given up past the rule deadline")
        if self._outbox.mark_failed(work.record_id, error):
            self._outbox.count([work.firing], "failed")
        for _ in range(start):
            self._submit_runner()


#: The outcomes of a detached firing that the rule manager counts as its run returns (``RuleManager._execute``), by
#: the counter it adds to; EXECUTED is not among them: the outbox counts it once the group commits (``_settle``).
_COUNTED_BY_THE_RULE_MANAGER: dict[FiringOutcome, RuleCounter] = {
    FiringOutcome.FAILED: "failed", FiringOutcome.CANCELLED: "cancelled",
    FiringOutcome.CONDITION_FALSE: "condition_false"}


def _where_parked(parked: bool, works: str) -> str:
    """What became of ``works`` (``they``, ``its 2 record(s)``) that :meth:`Executor._park` parked (``parked``) or,
    the outbox closed, dropped: what a log line about them says."""
    if parked:
        return f"{works} wait for the next recovery pass"
    return f"the outbox is closed: {works} stay pending in PostgreSQL for the database's next process"


def _described(work: Work) -> str:
    return f"rule {work.firing.rule.name!r} on {work.firing.event.describe()} (record {work.record_id})"
