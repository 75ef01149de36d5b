"""Runs a rule set under many interleavings of its concurrent transactions and checks each outcome: the user's
invariant over the database, the serializability of the recorded history, and what the actors raised.  The model
(actors, steps, settled threads), how threads are paused, how steps are named so that a seed replays a run, and
what a run cannot see: the design note ``activedb/testing/README.md``, "The interleaving runner".

Thread-safety: a runner is driven by one thread (the test's); the listener and the observer run in the run's
threads and meet the driver under ``_Run.condition`` (a leaf: nothing else is taken under it, and no thread waits
for its step while holding it).
"""

from __future__ import annotations

import collections
import contextlib
import math
import random
import re
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Hashable, Iterable, Mapping, Sequence

from lockmgr.testing import Watchdog, diagnostic

from activedb._closedset import ClosedSet
from activedb.errors import BadArgument, RuleFailed, causes, check_whole_number
from activedb.outbox import GROUP_TRANSACTION, FailedFiring
from activedb.testing._choices import ChoiceTree, Chooser
from activedb.testing._history import HistoryReport, check_history
from activedb.testing.errors import (InterleavingError, InterleavingFailed, InterleavingHang, InvalidSchedule,
                                     NondeterministicRun)
from activedb.lowlevel import HistoryOp, Observer, TransactionExtension, WaitKind, abandon
from activedb import Database, Transaction, TxnState

if TYPE_CHECKING:  # pragma: no cover
    import lockmgr
    import networkx as nx

__all__ = ["Actor", "Exploration", "Interleavings", "RunReport", "Schedule", "StepKind", "Verdict"]

#: An actor: runs top-level transactions on ``db`` (the database the runner was given).
Actor = Callable[["Database"], object]

#: An invariant over the database after a run: raises (``AssertionError`` or another exception) or returns False when
#: broken.
Invariant = Callable[["Database"], object]

_ACTIVE = (TxnState.ACTIVE, TxnState.COMMITTING)
#: A transaction id in a message ("T5", "T5.6"): not inside a word, nor followed by more of an id.
_TRANSACTION_ID = re.compile(r"(?<![\w.])T\d+(?:\.\d+)*(?!\w|\.\d)")


class StepKind(ClosedSet):
    """What a step of a run is."""

    START = "start"     # an actor's thread starts
    TAKE = "take"       # an outbox group runner takes the firings ready then as its next group
    BEGIN = "begin"     # a transaction that runs beside others (a child, an outbox group) begins
    READ = "read"
    WRITE = "write"
    COMMIT = "commit"
    ABORT = "abort"


class Verdict(ClosedSet):
    """How a run ended."""

    PASSED = "passed"
    INVARIANT_BROKEN = "invariant broken"
    NOT_SERIALIZABLE = "not serializable"
    ACTOR_FAILED = "actor failed"
    RULE_FAILED = "rule failed"        # a detached firing of the run the outbox recorded as failed for good


#: The recorded operations that are steps (a commit is a step before it happens: ``_Run.before_commit``).
_PAUSING = {"read": StepKind.READ, "write": StepKind.WRITE, "abort": StepKind.ABORT}


@dataclass(frozen=True)
class Schedule:
    """The choices of one run: at each point, the index of the chosen step among the offered ones (sorted), and
    the steps' names.  ``str(schedule)`` is the compact form (``"0.2.1.0"``) that :meth:`parse` reads back;
    replaying a schedule that has its names also checks that the run offers the same steps."""

    choices: tuple[int, ...]
    steps: tuple[str, ...] = ()

    def __str__(self) -> str:
        return ".".join(str(choice) for choice in self.choices) or "-"

    @classmethod
    def parse(cls, text: str) -> "Schedule":
        """The schedule of ``str(schedule)`` (choices only)."""
        text = text.strip()
        if text in ("", "-"):
            return cls(())
        try:
            return cls(tuple(int(part) for part in text.split(".")))
        except ValueError:
            raise InvalidSchedule(f"not a schedule: {text!r} (expected choices like '0.2.1.0')") from None


@dataclass(frozen=True)
class RunReport:
    """What one run did and how it ended."""

    schedule: Schedule
    verdict: Verdict
    trace: tuple[str, ...]                       # the steps in the order they were chosen, and what ended
    errors: Mapping[str, BaseException] = field(default_factory=dict)   # actor -> what it raised, unexpectedly
    invariant: str | None = None                 # why the invariant failed (the first line of what it raised)
    history: HistoryReport | None = None
    # actor -> what it raised as text (``str(error)`` of ``errors``), the run's transactions named by their labels
    raised: Mapping[str, str] = field(default_factory=dict)
    # the detached firings of the run that failed for good (the outbox recorded them failed), unexpectedly: what
    # their rules raised as text (``str`` of the ``RuleFailed``: the rule, the event, the error), with labels for ids
    rules_failed: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.verdict is Verdict.PASSED

    def describe(self) -> str:
        lines = [f"{self.verdict.value}: schedule {self.schedule} ({len(self.schedule.choices)} steps)"]
        if self.invariant is not None:
            lines.append(f"  invariant: {self.invariant}")
        for actor, error in self.errors.items():
            lines.append(f"  actor {actor} raised {type(error).__name__}: {self.raised.get(actor, error)}")
        lines += [f"  {failed}" for failed in self.rules_failed]
        if self.history is not None and not self.history.ok:
            lines += [f"  history: {violation}" for violation in self.history.violations[:5]]
        lines.append("  steps:")
        lines += [f"    {line}" for line in self.trace]
        lines.append(f"  replay: interleavings.replay({str(self.schedule)!r})")
        return "\n".join(lines)


@dataclass(frozen=True)
class Exploration:
    """The runs of :meth:`Interleavings.explore`: the first failing one (if any), whether every interleaving was
    run (``exhaustive``), and the seed that reproduces them."""

    seed: int
    runs: tuple[RunReport, ...]
    exhaustive: bool

    @property
    def failure(self) -> RunReport | None:
        return next((run for run in self.runs if not run.ok), None)

    @property
    def ok(self) -> bool:
        return self.failure is None

    def describe(self) -> str:
        failure = self.failure
        how = "every interleaving" if self.exhaustive else f"{len(self.runs)} interleavings"
        if failure is None:
            return f"{how} passed (seed {self.seed})"
        number = self.runs.index(failure) + 1
        return f"interleaving {number} of seed {self.seed} failed — {failure.describe()}"

    def assert_ok(self) -> None:
        """Raise :class:`InterleavingFailed` with the failing interleaving and how to replay it."""
        if self.failure is not None:
            raise InterleavingFailed(self.describe())


#: The databases on which a run was reported hung (:class:`InterleavingHang`): what hung may still run there, and
#: the pytest plugin's teardown does not wait for it a second time (:func:`reported_hung`).
_hung: "weakref.WeakSet[Database]" = weakref.WeakSet()
#: Per database, the ids of the outbox's failed records the runs judged (reported, or accepted as expected): the
#: pytest plugin's teardown does not warn of them again (:func:`judged_failures`).
_judged: "weakref.WeakKeyDictionary[Database, set[int]]" = weakref.WeakKeyDictionary()
_reported_mutex = threading.Lock()      # protects _hung and _judged (a leaf)


def _reported(db: Database) -> None:
    with _reported_mutex:
        _hung.add(db)


def reported_hung(db: Database) -> bool:
    """Whether the interleaving runner reported a hang of a run on ``db`` (its rules may still be running)."""
    with _reported_mutex:
        return db in _hung


def judged_failures(db: Database) -> frozenset[int]:
    """The ids of the outbox's failed records of ``db`` that runs of the interleaving runner judged: reported as
    ``Verdict.RULE_FAILED``, or accepted by ``expected_errors``."""
    with _reported_mutex:
        return frozenset(_judged.get(db, ()))


def failed_count(db: Database) -> int:
    """How many firings the outbox of ``db`` holds as failed for good: the mark :func:`failed_since` counts from."""
    return db.outbox.statistics().failed


def failed_since(db: Database, before: int) -> list[FailedFiring]:
    """The firings the outbox of ``db`` recorded as failed for good since it held ``before`` (:func:`failed_count`
    then), oldest first — the interleaving runner's comparison after a run, and the pytest plugin's after a test."""
    new = failed_count(db) - before
    return list(reversed(db.outbox.failures(new))) if new > 0 else []


def failed_text(firing: FailedFiring) -> str:
    """A failed record as one line: its rule, its event and its error."""
    return f"rule {firing.rule!r} failed on {firing.event}: {firing.error}"


class Interleavings:
    """Runs ``actors`` on ``db`` under interleavings of their transactions (the design note says how).

    * ``db`` — connected with ``record_history=True`` (the pytest plugin: ``@pytest.mark.activedb(record_history=
      True)``), its rules registered;
    * ``actors`` — ``{name: actor}`` or a sequence (named ``A1``, ``A2``, …); each ``actor(db)`` runs top-level
      transactions (``with db.transaction()``, ``db.run``);
    * ``setup(db)`` — puts the database in the state every run starts from (runs before each run, unobserved;
      the detached firings it causes are waited for, as ``db.rules.wait_idle(idle_timeout)`` waits, else the run is
      an :class:`InterleavingHang`; generated keys are drawn afresh after it: a setup that restarts the sequences
      makes a run's keys its own);
    * ``invariant(db)`` — checked after each run; raises (``AssertionError``, or any other exception) or returns False
      when broken: the run is reported with its schedule either way;
    * ``serializable`` — also check the recorded history (:func:`~activedb.testing.check_history`: conflict
      serializability of the committed top-level transactions and the axioms of nested transactions);
    * ``expected_errors`` — what an actor may raise, or what may have caused what it raised, without failing the
      run (say ``DeadlockDetected`` for an actor that does not retry: a rule's reaches it as ``RuleFailed``), and what
      a detached rule may raise: a firing of the run the outbox records as failed for good fails the run otherwise
      (``Verdict.RULE_FAILED``); one exception class or a tuple (or list) of them;
    * ``step_timeout`` — seconds a step may take to pause again or block before the run fails as a hang;
    * ``idle_timeout`` — seconds the detached firings queued before a run (by ``setup``, by earlier runs) may take to
      end before the run fails as a hang.
    """

    def __init__(self, db: "Database", actors: Mapping[str, Actor] | Sequence[Actor], *,
                 setup: Callable[["Database"], object] | None = None, invariant: Invariant | None = None,
                 serializable: bool = True, expected_errors: tuple[type[BaseException], ...] = (),
                 step_timeout: float = 30.0, idle_timeout: float = 30.0) -> None:
        if not isinstance(db, Database):         # (its type only: a URL's text holds the password)
            raise BadArgument(f"Interleavings(db=...) takes an activedb.Database connected with record_history=True "
                              f"(the activedb_db fixture with @pytest.mark.activedb(record_history=True), or "
                              f"activedb.connect(url, record_history=True)), got {type(db).__name__}")
        if db.history is None:
            raise InterleavingError(
                "Interleavings needs a database connected with record_history=True (with the pytest plugin: "
                "@pytest.mark.activedb(record_history=True)); its history recorder is how the runner pauses steps")
        given: object = actors       # (as given: any value a caller passed is checked)
        if isinstance(given, (str, bytes)) or not isinstance(given, (Mapping, Iterable)):
            one = f"one {type(given).__name__}: give [actor]" if callable(given) else type(given).__name__
            raise BadArgument(f"Interleavings(actors={given!r:.80}) takes {{name: actor}} or a list of actors (each a "
                              f"function that runs transactions on the database it is given, actor(db)), not {one}")
        named = dict(actors) if isinstance(actors, Mapping) else {f"A{n}": actor for n, actor in enumerate(actors, 1)}
        if not named:
            raise BadArgument("Interleavings needs at least one actor")
        for name, actor in named.items():
            if not isinstance(name, str) or not name or "/" in name or " " in name:
                raise BadArgument(f"an actor's name is one word without '/': {name!r}")
            if not callable(actor):
                raise BadArgument(f"actor {name!r} is {actor!r:.80}: give a function that runs transactions on the "
                                  f"database it is given (actor(db))")
        for keyword, function in (("setup", setup), ("invariant", invariant)):
            if function is not None and not callable(function):
                raise BadArgument(f"Interleavings({keyword}={function!r:.80}) takes a function of the database "
                                  f"({keyword}(db)), or None")
        # (0 or less fails every run as a hang; no thread may wait for ever)
        for keyword, seconds in (("step_timeout", step_timeout), ("idle_timeout", idle_timeout)):
            number = isinstance(seconds, (int, float)) and not isinstance(seconds, bool)
            if not number or not 0 < seconds < math.inf:
                raise BadArgument(f"Interleavings({keyword}={seconds!r}) takes a finite number of seconds above 0")
        self.db = db
        self.actors: dict[str, Actor] = named
        self.setup = setup
        self.invariant = invariant
        self.serializable = serializable
        self.expected_errors = _exception_classes(expected_errors)
        self.step_timeout = step_timeout
        self.idle_timeout = idle_timeout

    def explore(self, runs: int = 30, *, seed: int | None = 0, stop_at_failure: bool = True) -> Exploration:
        """Run up to ``runs`` interleavings chosen at random (``seed``; None draws one, which the exploration
        names: it explores the same interleavings again), none twice, fewer if every interleaving has been run
        (``runs`` is at least 1); stop at the first failing one unless ``stop_at_failure=False``."""
        check_whole_number("Interleavings.explore", "runs", runs, 1, " (the interleavings to run: 0 checks nothing)")
        if seed is None:         # drawn here, so that a failure names the seed that reproduces it
            seed = random.SystemRandom().randrange(2 ** 32)
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise BadArgument(f"Interleavings.explore(seed={seed!r}) takes a whole number (None draws one, which "
                              f"the exploration names)")
        tree = ChoiceTree(random.Random(seed))
        reports: list[RunReport] = []
        while len(reports) < runs and not tree.exhausted:
            choose, finished = tree.walk()
            try:
                report = self._run(choose)
            except InterleavingHang as hang:     # where it was found: the seed explores the same interleavings again
                raise InterleavingHang(f"interleaving {len(reports) + 1} of seed {seed} hung: "
                                       f"{str(hang).removeprefix('interleaving hung: ')}") from None
            except NondeterministicRun as differed:
                raise NondeterministicRun(f"interleaving {len(reports) + 1} of seed {seed}: {differed}") from None
            finished(abandoned=not report.ok)
            reports.append(report)
            if not report.ok and stop_at_failure:
                break
        return Exploration(seed, tuple(reports), tree.exhausted)

    def replay(self, schedule: Schedule | str = "") -> RunReport:
        """Run the interleaving ``schedule`` names (a :class:`Schedule`, or its text ``"0.2.1.0"``).  Past its end
        the run goes on with the first step offered — the steps sort by actor, so ``replay("")`` runs the actors
        one after the other, in the order of their names, each with its immediate and deferred firings; the outbox's
        steps sort after the actors', so its first take waits for the last actor's steps and the detached firings
        ready then run in one group."""
        if isinstance(schedule, str):
            schedule = Schedule.parse(schedule)
        if not isinstance(schedule, Schedule):
            raise InvalidSchedule(f"replay takes a Schedule or its text ('0.2.1.0'; '' runs the actors one after the "
                                  f"other), got {schedule!r}")
        choices = list(schedule.choices)
        names = list(schedule.steps)

        def choose(available: list[str]) -> str | None:
            if not available:
                return None
            index = choices.pop(0) if choices else 0
            if not 0 <= index < len(available):
                raise InvalidSchedule(f"choice {index} of the schedule, but the run offers {len(available)} "
                                      f"step(s): {available}")
            chosen = available[index]
            if names:
                expected = names.pop(0)
                if chosen != expected:
                    raise NondeterministicRun(f"the schedule chose {expected!r} here, the run offers {available}"
                                              f"{NondeterministicRun.WHAT_TO_DO}")
            return chosen
        return self._run(choose)

    def _run(self, choose: Chooser) -> RunReport:
        db = self.db
        self._wait_idle("the detached rule firings from before the run")
        if self.setup is not None:
            self.setup(db)
        self._wait_idle("what the setup fired")       # before the run's history starts
        db.catalog.invalidate_key_blocks()     # generated keys come from the sequences as setup left them
        failed_before = failed_count(db)
        history = db.history
        assert history is not None
        history.clear()
        run = _Run(self, choose)
        run.execute()
        problem = None
        if self.invariant is not None:
            try:
                if self.invariant(db) is False:
                    problem = "returned False"
            except AssertionError as error:      # its first line: the message (pytest adds its explanation below)
                problem = str(error).strip().splitlines()[0] if str(error).strip() else "AssertionError"
            except Exception as error:           # (a read that found no row, …): broken too, in this run's schedule
                said = str(error).strip().splitlines()
                problem = f"{type(error).__name__}: {said[0]}" if said else type(error).__name__
        checked = check_history(history.snapshot()) if self.serializable else None
        errors = {name: error for name, error in run.errors.items()      # (a rule's deadlock: RuleFailed from it)
                  if not any(isinstance(cause, self.expected_errors) for cause in causes(error))}
        rules_failed = self._rules_failed(run, failed_before)
        verdict = (Verdict.ACTOR_FAILED if errors else Verdict.RULE_FAILED if rules_failed
                   else Verdict.INVARIANT_BROKEN if problem is not None
                   else Verdict.NOT_SERIALIZABLE if checked is not None and not checked.ok else Verdict.PASSED)
        raised = {name: run.raised[name] for name in errors}
        return RunReport(Schedule(tuple(run.choices), tuple(run.chosen)), verdict, tuple(run.trace), errors, problem,
                         checked, raised, rules_failed)

    def _rules_failed(self, run: "_Run", failed_before: int) -> tuple[str, ...]:
        """The detached firings of ``run`` the outbox recorded as failed for good (its failed records beyond the
        ``failed_before`` there were before the run), each as its rule's ``RuleFailed`` said it (the run's
        transactions named by their labels) — unless what the rule raised is, or was caused by, an expected error."""
        failed = failed_since(self.db, failed_before)
        if not failed:
            return ()
        with _reported_mutex:
            _judged.setdefault(self.db, set()).update(firing.id for firing in failed)
        said = []
        for firing in failed:
            reasons = [reason for reason in run.rule_failures
                       if reason.rule == firing.rule and _described(reason.event) == firing.event]
            if reasons and any(isinstance(cause, self.expected_errors) for cause in causes(reasons[-1])):
                continue
            text = str(reasons[-1]) if reasons else failed_text(firing)
            with run.condition:
                said.append(run._by_label(text))
        return tuple(said)

    def _wait_idle(self, what: str) -> None:
        """Wait at most ``idle_timeout`` for the detached firings queued so far (``what``: whose) to run, as
        ``db.rules.wait_idle()`` does; if they do not (a rule that never returns), the :class:`InterleavingHang` saying
        so, with the wait-for graph."""
        try:
            self.db.rules.wait_idle(self.idle_timeout)
        except TimeoutError as error:
            graph = diagnostic("read the wait-for graph", lambda: _graph_text(self.db.transactions.locks))
            _reported(self.db)
            raise InterleavingHang(f"interleaving hung: before the run, {what} did not finish ({error}) — a rule "
                                   f"that never returns?\nwait-for graph:\n{graph}\nschedule so far: "
                                   f"{Schedule(())}\n{_replay_hint(Schedule(()))}") from None


def _replay_hint(schedule: Schedule) -> str:
    """The line that ends a hang's or a nondeterministic run's report: the replay that runs to its point again —
    ``replay('')`` for a run that took no step (the empty schedule, shown as ``-``)."""
    return f"replay: interleavings.replay({str(schedule) if schedule.choices else ''!r})"


def _graph_text(locks: "lockmgr.LockManager") -> str:
    """The wait-for graph's edges, one a line (the caller bounds the read: ``diagnostic``)."""
    graph = locks.wait_for_graph()
    edges = [f"  {waiter} -[{data.get('kind')} {data.get('resource', '')}]-> {target}"
             for waiter, target, data in sorted(graph.edges(data=True), key=repr)]
    return "\n".join(edges) or "  (no edges)"


def _exception_classes(given: object) -> tuple[type[BaseException], ...]:
    """``expected_errors`` as the tuple ``isinstance`` takes: one exception class or a collection of them (a list
    too); :class:`BadArgument` for anything else — found only when an actor raised, it failed the exploration."""
    listed = (given,) if isinstance(given, type) else tuple(given) if isinstance(given, (tuple, list, set,
                                                                                        frozenset)) else None
    if listed is None or not all(isinstance(kind, type) and issubclass(kind, BaseException) for kind in listed):
        raise BadArgument(f"Interleavings(expected_errors={given!r}) takes exception classes: one, or a tuple of them "
                          f"(e.g. (DeadlockDetected,))")
    return listed


# --- one run -------------------------------------------------------------------------------------

@dataclass(eq=False)
class _Pause:
    """A thread waiting at its next step until the runner chooses it."""

    label: str
    transaction: str | None      # the transaction's id (None: an actor's start, an outbox runner's take)
    starts: str | None = None    # the actor whose start it is
    take: bool = False           # an outbox group runner's take
    go: threading.Event = field(default_factory=threading.Event)


@dataclass(eq=False)
class _Tracked:
    """A transaction of the run, as the observer and the listener saw it."""

    tx: Transaction
    label: str
    parent: str | None
    thread: int | None = None    # the thread its body runs in (None: spawned, not started yet)
    ended: bool = False
    # The waits the observer heard begin and not end: (kind, the transaction waited for; None: all children).
    waits: list[tuple[WaitKind, str | None]] = field(default_factory=list)
    children: collections.Counter[str] = field(default_factory=collections.Counter)   # per name
    kids: list[str] = field(default_factory=list)       # its children's ids


class _BeforeCommit(TransactionExtension):
    """Pauses a transaction of the run just before it commits (a step): hooks of the transaction manager are either
    active or passive, and a commit step has to hold a thread back."""

    def __init__(self, run: "_Run") -> None:
        self.run = run

    def before_commit(self, transaction: Transaction) -> None:
        self.run.before_commit(transaction)


class _Run(Observer):
    """One run: the threads, the pauses, the transactions, and the driver's loop (:meth:`execute`)."""

    def __init__(self, runner: Interleavings, choose: Chooser) -> None:
        self.runner = runner
        self.db = runner.db
        self.choose = choose
        self.condition = threading.Condition()      # protects everything below; a leaf
        self.open = True                             # False once the run is torn down: nothing pauses any more
        self.torn_down: str | None = None            # what _tear_down found still stuck, once it ran
        self.paused: dict[int, _Pause] = {}          # thread -> its pause
        self.tracked: dict[str, _Tracked] = {}       # transaction id -> what we know of it
        self.local = threading.local()               # .actor: the actor an actor's thread runs
        self.actor_roots: collections.Counter[str] = collections.Counter()
        self.other_roots: collections.Counter[str] = collections.Counter()
        self.takes: collections.Counter[str] = collections.Counter()
        self.last_read: dict[int, tuple[Any, ...]] = {}   # thread -> (transaction, table, key, scan) it read last
        self.alive: dict[str, threading.Thread] = {}
        self.waiting_to_start: dict[str, _Pause] = {}
        self.errors: dict[str, BaseException] = {}
        self.raised: dict[str, str] = {}             # actor -> str() of what it raised, with labels for ids
        self.rule_failures: list[RuleFailed] = []    # the run's rules' failures, in the order their firings aborted
        self.choices: list[int] = []
        self.chosen: list[str] = []
        self.trace: list[str] = []

    # --- the driver ---------------------------------------------------------------------------

    def execute(self) -> None:
        runner = self.runner
        manager = self.db.transactions
        recorder = self.db.history
        assert recorder is not None
        self.db.observe(self)
        commits = manager.extensions.add(_BeforeCommit(self))
        stop_pacing = self.db.outbox.pace_takes(self)
        stop_listening = recorder.listen(self._on_op)
        try:
            with Watchdog(runner.step_timeout * 3 + 30, manager.locks, describe=self._describe):
                for name in runner.actors:
                    self.waiting_to_start[name] = _Pause(f"{name} start", None, starts=name)
                while True:
                    self._settle()
                    with self.condition:
                        offered = {pause.label: pause for pause in (*self.paused.values(),
                                                                     *self.waiting_to_start.values())}
                    if not offered:
                        if self._finished():
                            break
                        raise self._hang("every transaction of the run waits and none can go on (a wait the lock "
                                         "manager cannot see, or something outside the run)")
                    available = sorted(offered)
                    try:
                        picked = self.choose(available)
                    except NondeterministicRun as error:    # where: the prefix that runs to this point again
                        schedule = Schedule(tuple(self.choices))
                        raise NondeterministicRun(f"{error}\nschedule so far: {schedule}\n"
                                                  f"{_replay_hint(schedule)}") from None
                    if picked is None or picked not in offered:
                        raise InvalidSchedule(f"the chooser picked {picked!r}; the run offers {available}")
                    self.choices.append(available.index(picked))
                    self.chosen.append(picked)
                    self.trace.append(picked)
                    self._release(offered[picked])
        except BaseException:
            self._tear_down()
            raise
        finally:
            stop_listening()
            stop_pacing()
            manager.extensions.remove(commits)
            manager.observers.remove(self)
        self._tear_down()

    def _release(self, pause: _Pause) -> None:
        if pause.starts is not None:            # an actor's start
            name = pause.starts
            with self.condition:
                del self.waiting_to_start[name]
            thread = threading.Thread(target=self._actor, args=(name,), name=f"interleavings-{name}", daemon=True)
            with self.condition:
                self.alive[name] = thread
            thread.start()
            return
        pause.go.set()
        with self.condition:                    # the released thread leaves ``paused`` itself; wait for it
            went_on = self.condition.wait_for(lambda: pause not in self.paused.values(), self.runner.step_timeout)
        if not went_on:                         # (described without ``condition`` held: _hang reads it elsewhere)
            raise self._hang(f"step {pause.label} was released but its thread did not go on")

    def _actor(self, name: str) -> None:
        self.local.actor = name
        try:
            self.runner.actors[name](self.db)
        except BaseException as error:        # an outcome of the run, judged by the runner
            with self.condition:
                self.errors[name] = error
                self.raised[name] = said = self._by_label(str(error))
                said = said.splitlines()[0][:200] if said else ""
                self.trace.append(f"{name} raised {type(error).__name__}" + (f": {said}" if said else ""))
        finally:
            with self.condition:
                del self.alive[name]
                self.condition.notify_all()

    def _by_label(self, text: str) -> str:
        """``text`` with the transaction ids of the run (which differ from run to run) replaced by their labels,
        quoted or bare ("in T5", "transaction T5.6 was aborted": a whole id, not the start of a longer one).  Caller
        holds ``condition``."""
        def label(found: re.Match[str]) -> str:
            tracked = self.tracked.get(found.group(0))
            return tracked.label if tracked is not None else found.group(0)
        return _TRANSACTION_ID.sub(label, text)

    def _finished(self) -> bool:
        with self.condition:
            if self.alive or self.waiting_to_start or any(not t.ended for t in self.tracked.values()):
                return False
        outbox = self.db.outbox
        return outbox.runners == 0 and outbox.running == 0

    def _settle(self) -> None:
        """Wait until every thread of the run is paused, blocked or done (nothing sleeps: the waits are on the
        condition, which every hook notifies, and at most 1 ms when the wait-for graph must be looked at again).
        Each read of the wait-for graph waits at most ``step_timeout`` for the lock manager's graph mutex: a thread
        hung holding it is a hang too."""
        timeout = self.runner.step_timeout
        deadline = time.monotonic() + timeout
        while True:
            try:
                graph = self.db.transactions.locks.wait_for_graph(timeout=timeout)
            except TimeoutError:
                raise self._hang(f"could not read the lock manager's wait-for graph within {timeout} s (a thread "
                                 f"holds its graph mutex)") from None
            runners = self.db.outbox.runners
            with self.condition:
                running = self._running(graph, runners)
                if not running:
                    return
                if time.monotonic() > deadline:
                    break
                self.condition.wait(0.001)
        raise self._hang(f"{', '.join(running)} neither paused at a step nor blocked within "
                         f"{self.runner.step_timeout} s: a wait the runner cannot see — for something outside the run "
                         f"(an event, a sleep, a thread of the application's), or a wait for another thread of the run "
                         f"(a Sequencer, wait_until or an event in an actor: the runner orders the steps itself — drop "
                         f"it, and replay(schedule) for one order) —, or work that takes longer than step_timeout")

    def _running(self, graph: "nx.DiGraph[Hashable]", runners: int) -> list[str]:
        """What is still running (empty: settled), given the wait-for graph and the outbox's runners.  Caller holds
        ``condition``."""
        paused_transactions = {pause.transaction for pause in self.paused.values()}
        running = []
        for tid, tracked in self.tracked.items():
            if tracked.ended or tid in paused_transactions or self._waits(tid, tracked, graph):
                continue
            if tracked.thread is None:
                running.append(f"{tracked.label} (spawned, not started)")
            elif not self._covered(tid, tracked, paused_transactions, graph):
                running.append(tracked.label)
        busy_threads = {tracked.thread for tracked in self.tracked.values() if not tracked.ended}
        for name, thread in self.alive.items():
            if thread.ident not in busy_threads and thread.ident not in self.paused:
                running.append(f"actor {name} (outside a transaction)")
        groups = sum(1 for tracked in self.tracked.values()
                     if not tracked.ended and tracked.parent is None and tracked.tx.name == GROUP_TRANSACTION)
        takes = sum(1 for pause in self.paused.values() if pause.take)
        if runners > groups + takes:
            running.append("the outbox (a group transaction about to begin)")
        return running

    def _waits(self, tid: str, tracked: _Tracked, graph: "nx.DiGraph[Hashable]") -> bool:
        """Blocked: in a wait the observer heard begin (for children, a coupling dependency) or one of the wait-for
        graph (a lock, a nested top-level transaction) — and for something that has not ended: a wait whose every
        transaction has ended is about to end too (the waiter is woken, not blocked).  Caller holds ``condition``."""
        targets: set[Hashable] = set()
        if tid in graph:
            targets.update(graph.successors(tid))
            if not targets and "waiting_for" in graph.nodes[tid]:
                return True
        for _, target in tracked.waits:
            if target is not None:
                targets.add(target)
            else:
                targets.update(tracked.kids)
        return any(target not in self.tracked or not self.tracked[target].ended for target in targets)

    def _covered(self, tid: str, tracked: _Tracked, paused_transactions: set[str | None],
                 graph: "nx.DiGraph[Hashable]") -> bool:
        """``tid``'s thread is paused or blocked on behalf of one of its descendants (an inline child, a child it
        runs while it waits for it)."""
        for other, candidate in self.tracked.items():
            if (other != tid and not candidate.ended and candidate.thread == tracked.thread
                    and self._descends(other, tid)
                    and (other in paused_transactions or self._waits(other, candidate, graph))):
                return True
        return False

    def _descends(self, tid: str, ancestor: str) -> bool:
        parent = self.tracked[tid].parent
        while parent is not None:
            if parent == ancestor:
                return True
            parent = self.tracked[parent].parent if parent in self.tracked else None
        return False

    # --- the hooks (in the run's threads) ----------------------------------------------------------

    def _on_op(self, op: HistoryOp) -> None:
        kind = _PAUSING.get(op.kind)
        if kind is None:
            return
        thread = threading.get_ident()
        with self.condition:
            tracked = self.tracked.get(op.transaction)
            if not self.open or tracked is None:
                return
            if kind is StepKind.READ:
                scan = op.source == "scan"
                seen = (op.transaction, op.table, None if scan else op.key)
                if self.last_read.get(thread) == seen:
                    return                      # the next row of the same scan, or the same row read again
                self.last_read[thread] = seen
                what = f"read {op.table}" + ("" if scan else _key(op.key))
            else:
                self.last_read.pop(thread, None)
                what = f"{kind.value} {op.table}{_key(op.key)}" if kind is StepKind.WRITE else kind.value
            pause = self._register_pause(thread, tracked, what, op.transaction)
        self._wait_for_turn(thread, pause)

    def _register_pause(self, thread: int, tracked: _Tracked, what: str, transaction_id: str) -> _Pause:
        """Register that ``thread`` pauses before ``what`` of ``tracked`` (the caller holds ``condition``)."""
        tracked.thread = thread
        pause = _Pause(f"{tracked.label}: {what}", transaction_id)
        self.paused[thread] = pause
        self.condition.notify_all()
        return pause

    def _wait_for_turn(self, thread: int, pause: _Pause) -> None:
        """Block this thread at ``pause`` (registered in ``paused``) until the driver chooses it."""
        self.db.transactions.pool.before_blocking()     # queued tasks get workers: none waits for this thread
        pause.go.wait()
        with self.condition:
            self.paused.pop(thread, None)
            self.condition.notify_all()

    def before_commit(self, transaction: Transaction) -> None:
        thread = threading.get_ident()
        with self.condition:
            tracked = self.tracked.get(transaction.id)
            if not self.open or tracked is None:
                return
            self.last_read.pop(thread, None)
            pause = self._register_pause(thread, tracked, "commit", transaction.id)
        self._wait_for_turn(thread, pause)

    def before_take(self) -> None:
        """An outbox group runner (in its thread) is about to take the ready firings as its next group (the run is its
        :class:`~activedb.outbox.TakePacer`): a step — the firings of trees that commit before it is chosen join
        that group."""
        thread = threading.get_ident()
        with self.condition:
            if not self.open:
                return
            pause = _Pause(_numbered(self.takes, f"{GROUP_TRANSACTION}: take"), None, take=True)
            self.paused[thread] = pause
            self.condition.notify_all()
        self._wait_for_turn(thread, pause)

    def on_spawn(self, parent: Transaction, child: Transaction) -> None:
        with self.condition:
            above = self.tracked.get(parent.id)
            if above is None or child.id in self.tracked:
                return
            self.tracked[child.id] = _Tracked(child, self._child_label(above, child), parent.id)
            above.kids.append(child.id)
            self.condition.notify_all()

    def on_begin(self, transaction: Transaction) -> None:
        thread = threading.get_ident()
        with self.condition:
            tracked = self.tracked.get(transaction.id)
            if tracked is None:
                parent = transaction.parent
                if parent is None:
                    label = self._root_label(transaction, thread)
                elif parent.id in self.tracked:
                    label = self._child_label(self.tracked[parent.id], transaction)
                    self.tracked[parent.id].kids.append(transaction.id)
                else:
                    return                      # a transaction outside the run
                if label is None:
                    return
                tracked = self.tracked[transaction.id] = _Tracked(transaction, label,
                                                                  parent.id if parent is not None else None)
            tracked.thread = thread
            self.condition.notify_all()
            # A transaction that may run beside others (a child, a group transaction of the outbox) starts when
            # the driver says: its first step is its begin.  (Any other top-level transaction of the run — an
            # actor's own, one a transaction of the run opens — starts in a thread of the run, which runs alone
            # until it pauses.)
            if not self.open or tracked.parent is None and tracked.tx.name != GROUP_TRANSACTION:
                return
            pause = self._register_pause(thread, tracked, "begin", transaction.id)
        self._wait_for_turn(thread, pause)

    def on_commit(self, transaction: Transaction) -> None:
        self._ended(transaction, "committed")

    def on_abort(self, transaction: Transaction, reason: BaseException | None) -> None:
        if isinstance(reason, RuleFailed):
            with self.condition:
                if transaction.id in self.tracked:
                    self.rule_failures.append(reason)
        self._ended(transaction, f"aborted ({type(reason).__name__})" if reason is not None else "aborted")

    def on_wait_start(self, transaction: Transaction, kind: WaitKind, detail: str | None) -> None:
        with self.condition:
            tracked = self.tracked.get(transaction.id)
            if tracked is not None:
                tracked.waits.append((kind, detail if isinstance(detail, str) else None))
                self.condition.notify_all()

    def on_wait_end(self, transaction: Transaction, kind: WaitKind, detail: str | None) -> None:
        with self.condition:
            tracked = self.tracked.get(transaction.id)
            wait = (kind, detail if isinstance(detail, str) else None)
            if tracked is not None and wait in tracked.waits:
                tracked.waits.remove(wait)
                self.condition.notify_all()

    def _ended(self, transaction: Transaction, how: str) -> None:
        with self.condition:
            tracked = self.tracked.get(transaction.id)
            if tracked is None or tracked.ended:
                return
            tracked.ended = True
            if tracked.parent is None or how != "committed":
                self.trace.append(f"  {tracked.label} {how}")
            self.condition.notify_all()

    def _root_label(self, transaction: Transaction, thread: int) -> str | None:
        """The label of a top-level transaction begun in ``thread``: an actor's (``A1``, ``A1#2``), an outbox group
        (``outbox``, ``outbox#2``), one a transaction of the run opens in its thread — a rule of an outbox group that
        runs ``with db.transaction()`` — (``outbox/rule:count (top-level)``), or None: not the run's.  Caller holds
        ``condition``."""
        actor: str | None = getattr(self.local, "actor", None)
        if actor is not None:
            return _numbered(self.actor_roots, actor)
        if transaction.name == GROUP_TRANSACTION:
            return _numbered(self.other_roots, GROUP_TRANSACTION)
        outer = [tracked for tracked in self.tracked.values() if tracked.thread == thread and not tracked.ended]
        if outer:                               # (the last begun: the one the thread runs now, blocked in this one)
            return _numbered(self.other_roots, f"{outer[-1].label} (top-level)")
        return None                             # not the run's (the application's own threads, recovery)

    @staticmethod
    def _child_label(parent: _Tracked, child: Transaction) -> str:
        return f"{parent.label}/{_numbered(parent.children, child.name or 'sub')}"

    # --- the end ------------------------------------------------------------------------------------

    def _tear_down(self) -> str:
        """Release every pause for good, abort what is still active, wait for the actors — all of it within one
        ``step_timeout``, however many trees and actors are stuck, so that a hang is reported about two timeouts after
        its last step.  Returns what is still stuck ("" if nothing).  An abort waits for the tree's children: one still
        running at the end of the clean-up's time (a rule blocked on something outside the run) is abandoned instead
        (``lowlevel.abandon``: doomed, its PostgreSQL transaction ended), so that the run ends and says so.  Once: a
        hang tears the run down as it is described, and the run's own clean-up on the way out (every error's) then
        returns what that found, waiting for nothing again."""
        deadline = time.monotonic() + self.runner.step_timeout
        with self.condition:
            if self.torn_down is not None:
                return self.torn_down
            self.open = False
            pauses = list(self.paused.values())
            self.waiting_to_start.clear()
            roots = [t.tx for t in self.tracked.values() if t.parent is None and not t.ended]
        for pause in pauses:
            pause.go.set()
        for root in roots:
            if root.state in _ACTIVE and not self._abort_within(root, max(0.0, deadline - time.monotonic())):
                abandon(root, InterleavingHang(f"{root.id} abandoned by the interleaving runner's clean-up: its abort "
                                               f"still waited for its children at the end of the clean-up's "
                                               f"{self.runner.step_timeout} s"))
        with self.condition:
            self.condition.wait_for(lambda: not self.alive, max(0.0, deadline - time.monotonic()))
            stuck = sorted(self.alive)
            self.torn_down = f"actors still running after the clean-up: {stuck}" if stuck else ""
            return self.torn_down

    @staticmethod
    def _abort_within(root: Transaction, seconds: float) -> bool:
        """Abort ``root`` (on a thread of its own: an abort waits for the tree's children); whether it ended within
        ``seconds``."""
        ended = threading.Event()

        def abort() -> None:
            with contextlib.suppress(Exception):
                root.abort("aborted by the interleaving runner's clean-up")
            ended.set()

        threading.Thread(target=abort, name=f"abort {root.id}", daemon=True).start()
        return ended.wait(seconds)

    def _hang(self, reason: str) -> InterleavingHang:
        """The hang, described; then the run torn down.  Every part of the description is read within
        ``lockmgr.testing.DIAGNOSTIC_SECONDS`` and one that fails or takes longer (a hung thread holding the graph
        mutex, or ``condition``) is a line saying so: the hang is reported whatever its state.  Caller does not hold
        ``condition``."""
        _reported(self.db)
        # The run's steps and schedule as the hang found them, copied before the clean-up, whose aborts and actors'
        # ends append to the trace.  (Copied without ``condition``, which a hung thread may hold: ``list()`` of a
        # list is one step for other threads; ``choices`` is this thread's alone.)
        steps, schedule = list(self.trace), Schedule(tuple(self.choices))
        locks = self.db.transactions.locks
        edges = diagnostic("read the wait-for graph", lambda: _graph_text(locks))
        described = diagnostic("describe the transactions", self._describe)
        try:                                    # (bounded itself: step_timeout in all)
            stuck = self._tear_down()
        except Exception as error:
            stuck = f"the clean-up failed: {error!r}"
        return InterleavingHang(
            f"interleaving hung: {reason}\nschedule so far: {schedule}\nsteps:\n"
            + "\n".join(f"  {line}" for line in steps) + "\n" + described + "\nwait-for graph:\n" + edges
            + (f"\n{stuck}" if stuck else "") + f"\n{_replay_hint(schedule)}")

    def _describe(self) -> str:
        with self.condition:
            paused = {pause.transaction: pause.label for pause in self.paused.values()}
            lines = ["transactions:"]
            for tid, tracked in self.tracked.items():
                if tracked.ended:
                    continue
                state = (f"paused at {paused[tid]!r}" if tid in paused else f"waiting {tracked.waits}" if tracked.waits
                         else "not started" if tracked.thread is None else "running or blocked")
                lines.append(f"  {tracked.label} ({tid}, {tracked.tx.state.value}): {state}")
            lines.append(f"actors running: {sorted(self.alive)}; outbox runners: {self.db.outbox.runners}")
        return "\n".join(lines)


def _described(event: object) -> str:
    """An event as the outbox describes it in its failed records."""
    describe = getattr(event, "describe", None)
    return str(describe()) if callable(describe) else str(event)


def _numbered(counter: collections.Counter[str], name: str) -> str:
    """``name`` counted once more in ``counter``: ``name`` the first time, then ``name#2``, ``name#3``, …"""
    counter[name] += 1
    return name if counter[name] == 1 else f"{name}#{counter[name]}"


def _key(key: object) -> str:
    if key is None:
        return ""
    parts = key if isinstance(key, tuple) else (key,)
    return "[" + ", ".join(repr(part) for part in parts) + "]"

