"""An isolation tester for activedb, after PostgreSQL's ``isolationtester``.

A :class:`Scenario` is data: *sessions* (``T1``, ``T2``, ...), each an ordered list of named *steps*
(``("w1x", Write("x", 11))``), and explicit *permutations* (strings of step names, like the
``permutation`` lines of an isolation spec).  A :class:`Pairing` says how the sessions' transactions
are related:

* ``top-level`` — every session is a top-level transaction (``db.transaction()``);
* ``siblings`` — every session is a subtransaction spawned by one parent that does nothing else and
  commits once all of them ended;
* ``parent=T<n>`` — session ``T<n>`` is a top-level transaction and every other session is a child it
  spawned (``tx.spawn``), running while the parent keeps operating.  Unless the parent's steps include a
  ``Spawn()`` step of their own, the runner adds one, ``s<n>``, that a permutation may place before any
  of the parent's steps up to its first ``Commit``/``Abort``/``Join`` — so the parent's earlier steps
  are *retained* by the time the children run (Rule 1 lets them at those rows), its later ones *held*
  (they wait).  A ``Join()`` step waits for the children (``handle.result``) and carries on.

:class:`PermutationRunner` runs one permutation the way ``isolationtester`` does: it sends a step to
its session (each session runs on its own thread), then waits until every session is *settled* — its
step completed, or it is blocked — and moves on.  Blocking is observable state, never a sleep: a
session is blocked when a lock request of its transaction (its segment, in activedb's words) waits in
the lock manager, or, for a parent whose step waits for its children (``Commit``, ``Abort``, ``Join``,
or aborting after an error), when its own operations' locks have been handed over (no open segment) and
a child has not ended.  A blocked step resumes when a later step of another session unblocks it.  As in
``isolationtester`` before PostgreSQL 14, a permutation that asks for a step of a blocked session is
*invalid* (:class:`InvalidPermutation`); a step of a session that has already ended (a deadlock victim,
say) is *skipped*.  Deadlock victims (``activedb.DeadlockDetected``), ``SerializationConflict`` and the
``TransactionAborted`` of a doomed subtree are outcomes, recorded per step.

A run fails with :class:`IsolationHang` — a message with the wait-for graph, each session's state and,
for a parent that waits for its children while its own operations still hold locks, a diagnosis (the
tree-isolation bug B: a wait the lock manager cannot see) — when a step neither completes nor blocks within
``STEP_TIMEOUT`` seconds, or when every session with steps left is blocked and the lock manager found no
deadlock.  Before raising, the runner aborts every transaction of the run (which withdraws the waiting
lock requests) and tells every session to stop, so no thread stays stuck; the message says whether all
of them ended.

:class:`PermutationTree` generates permutations: the valid permutations of a scenario form a tree
(at each point, the next step of every session that is not blocked), discovered while running — each
run walks one root-to-leaf path, choosing at random (a seeded ``random.Random``) among the branches not
yet exhausted, so a scenario is enumerated exhaustively without repeats, or sampled evenly when capped.
The runner's blocking is deterministic (one step is sent at a time, and the runner waits until every
session is settled before choosing the next), and the tree checks it: a prefix that offers different
choices on two runs fails with :class:`NondeterministicRun`.

:func:`serial_witness` decides whether a run's committed outcome is serializable: the final committed
state and every committed session's reads must equal those of *some* serial execution of the committed
sessions from the initial state.  Ops have a ``simulate`` twin on a plain dict for that.  For
``parent=...`` the units are the parent's own steps (one by one, in order) and each committed child as a
whole, inserted anywhere after the spawn — a child is atomic with respect to its parent's operations,
and the parent's operations keep their order.

Only the public API of activedb is used (``db.transaction``, ``tx.read/write/insert/delete/scan``,
``tx.spawn`` and its handle, ``tx.commit/abort``, ``tx.id/state/root``), plus ``db.transactions.locks``
(the lock manager's ``wait_for_graph`` and ``statistics``) to observe blocking.

Thread-safety: a runner is driven by one thread (the test's); sessions run on their own threads and
hand results back through ``_Running`` objects (a ``threading.Event`` publishes each).
"""

from __future__ import annotations

import enum
import itertools
import os
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Mapping

import sqlalchemy as sa

import activedb
from activedb import testing
from activedb.testing import ChoiceTree, NondeterministicRun          # (NondeterministicRun: re-exported)
from activedb.testing._choices import Chooser, Finish

#: Seconds a step may run without completing or blocking before the run fails as a hang.
STEP_TIMEOUT = float(os.environ.get("ACTIVEDB_ISOLATION_STEP_TIMEOUT", "10"))
#: A session thread that is sent nothing for this long gives up (no thread outlives a broken run).
ACTOR_TIMEOUT = 120.0
_POLL = 0.0005

TABLE = "items"


# --- operations ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Predicate:
    """A ``where`` clause on the ``value`` column: ``value = equals``, ``value % modulo = 0``, or every row."""

    equals: int | None = None
    modulo: int | None = None

    def where(self) -> Mapping[str, Any] | Callable[[dict], bool] | None:
        """What ``tx.scan`` takes: a dict of equalities (evaluated by PostgreSQL) or a row predicate."""
        if self.equals is not None:
            return {"value": self.equals}
        if self.modulo is not None:
            modulo = self.modulo
            return lambda row: row["value"] is not None and row["value"] % modulo == 0
        return None

    def matches(self, value: int | None) -> bool:
        if self.equals is not None:
            return value == self.equals
        if self.modulo is not None:
            return value is not None and value % self.modulo == 0
        return True

    def __str__(self) -> str:
        if self.equals is not None:
            return f"value = {self.equals}"
        if self.modulo is not None:
            return f"value % {self.modulo} = 0"
        return "true"


EVERY_ROW = Predicate()


class Op:
    """A step's operation.  ``run`` performs it in a transaction; ``simulate`` performs it on the serial
    model (a dict key -> value) and must return what ``run`` returns."""

    control = False   # Commit/Abort/Spawn/Join: executed by the runner, no effect in the model

    def run(self, tx) -> Any:
        raise NotImplementedError

    def simulate(self, state: dict[str, int]) -> Any:
        raise NotImplementedError


def _value(row: dict | None) -> int | None:
    return None if row is None else row["value"]


def _rows(rows: Iterable[dict]) -> tuple[tuple[str, int], ...]:
    return tuple(sorted((row["key"], row["value"]) for row in rows))


@dataclass(frozen=True)
class Read(Op):
    """``select value from items where key = :key`` (READ lock on the row)."""
    key: str

    def run(self, tx):
        return _value(tx.read(TABLE, self.key))

    def simulate(self, state):
        return state.get(self.key)


@dataclass(frozen=True)
class ReadMany(Op):
    """``select ... where key in (...)``: the rows one by one, in order."""
    keys: tuple[str, ...]

    def run(self, tx):
        return tuple(_value(tx.read(TABLE, key)) for key in self.keys)

    def simulate(self, state):
        return tuple(state.get(key) for key in self.keys)


@dataclass(frozen=True)
class Write(Op):
    """``update items set value = :value where key = :key`` (an upsert; WRITE lock, no read)."""
    key: str
    value: int

    def run(self, tx):
        tx.write(TABLE, self.key, value=self.value)

    def simulate(self, state):
        state[self.key] = self.value


@dataclass(frozen=True)
class Increment(Op):
    """``update items set value = value + :delta where key = :key``: read, then write; returns the value read."""
    key: str
    delta: int

    def run(self, tx):
        seen = _value(tx.read(TABLE, self.key))
        tx.write(TABLE, self.key, value=seen + self.delta)
        return seen

    def simulate(self, state):
        seen = state[self.key]
        state[self.key] = seen + self.delta
        return seen


@dataclass(frozen=True)
class Insert(Op):
    key: str
    value: int

    def run(self, tx):
        tx.insert(TABLE, key=self.key, value=self.value)

    def simulate(self, state):
        if self.key in state:
            raise activedb.DuplicateKey(f"model: {self.key!r} exists")
        state[self.key] = self.value


@dataclass(frozen=True)
class Scan(Op):
    """``select * from items where <predicate>`` (a table READ lock); returns the matching (key, value)s."""
    predicate: Predicate = EVERY_ROW

    def run(self, tx):
        return _rows(tx.scan(TABLE, self.predicate.where()))

    def simulate(self, state):
        return tuple(sorted((key, value) for key, value in state.items() if self.predicate.matches(value)))


@dataclass(frozen=True)
class UpdateWhere(Op):
    """``update items set value = <set_to | value + add> where <predicate>``: a scan, then a write per
    matching row; returns the matching rows as they were."""
    predicate: Predicate = EVERY_ROW
    set_to: int | None = None
    add: int | None = None

    def _new(self, value: int) -> int:
        return self.set_to if self.set_to is not None else value + self.add

    def run(self, tx):
        rows = _rows(tx.scan(TABLE, self.predicate.where()))
        for key, value in rows:
            tx.write(TABLE, key, value=self._new(value))
        return rows

    def simulate(self, state):
        rows = Scan(self.predicate).simulate(state)
        for key, value in rows:
            state[key] = self._new(value)
        return rows


@dataclass(frozen=True)
class DeleteWhere(Op):
    """``delete from items where <predicate>``: a scan, then a delete per matching row; returns them."""
    predicate: Predicate

    def run(self, tx):
        rows = _rows(tx.scan(TABLE, self.predicate.where()))
        for key, _ in rows:
            tx.delete(TABLE, key)
        return rows

    def simulate(self, state):
        rows = Scan(self.predicate).simulate(state)
        for key, _ in rows:
            del state[key]
        return rows


class _Control(Op):
    control = True

    def simulate(self, state):
        return None

    def __eq__(self, other):
        return type(self) is type(other)

    def __hash__(self):
        return hash(type(self))

    def __repr__(self):
        return f"{type(self).__name__}()"


class Commit(_Control):
    """Commit.  For a child: its function returns (the child commits into its parent).  For a parent:
    ``tx.commit()``, which first waits for its children."""


class Abort(_Control):
    """Abort.  For a child: its function raises.  For a parent: ``tx.abort()``, which aborts its
    children and waits for them to end."""


class Spawn(_Control):
    """Parent only: spawn the children now (what the parent did before is retained, visible to them)."""


class Join(_Control):
    """Parent only: wait for every child (``handle.result``), ignoring their failures, and carry on."""


ENDING = (Commit, Abort)
WAITS_FOR_CHILDREN = (Commit, Abort, Join)


# --- scenarios -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Step:
    name: str
    op: Op


@dataclass(frozen=True)
class Scenario:
    """Sessions of named steps (``{"T1": [("w1x", Write("x", 11)), ...]}``) and explicit permutations
    (step names separated by blanks).  ``pairings`` restricts where it runs (default: everywhere)."""

    name: str
    title: str
    sessions: Mapping[str, tuple[Step, ...]]
    permutations: tuple[str, ...] = ()
    initial: Mapping[str, int] = field(default_factory=lambda: {"x": 10, "y": 20})
    pairings: tuple[str, ...] | None = None

    @classmethod
    def of(cls, name: str, title: str, sessions: Mapping[str, list[tuple[str, Op]]], *,
           permutations: Iterable[str] = (), initial: Mapping[str, int] | None = None,
           pairings: Iterable[str] | None = None) -> "Scenario":
        built = {session: tuple(Step(step_name, op) for step_name, op in steps) for session, steps in sessions.items()}
        names = [step.name for steps in built.values() for step in steps]
        duplicates = {name for name in names if names.count(name) > 1}
        if duplicates:
            raise ValueError(f"scenario {name}: step names must be unique, {sorted(duplicates)} are not")
        for session, steps in built.items():
            if not steps or not isinstance(steps[-1].op, ENDING):
                raise ValueError(f"scenario {name}: session {session} must end with Commit() or Abort()")
        for permutation in permutations:
            if sorted(permutation.split()) != sorted(names):
                raise ValueError(f"scenario {name}: permutation {permutation!r} must name every step once")
        return cls(name, title, built, tuple(permutations), dict(initial or {"x": 10, "y": 20}),
                   tuple(pairings) if pairings is not None else None)

    def session_of(self, step_name: str) -> str:
        for session, steps in self.sessions.items():
            if any(step.name == step_name for step in steps):
                return session
        raise KeyError(step_name)

    def runs_as(self, pairing: "Pairing") -> bool:
        if self.pairings is not None:
            return pairing.id in self.pairings
        parent_only = any(isinstance(step.op, (Spawn, Join)) for steps in self.sessions.values() for step in steps)
        return not parent_only and (pairing.parent is None or pairing.parent in self.sessions)


class PairingKind(enum.Enum):
    TOP_LEVEL = "top-level"
    SIBLINGS = "siblings"
    PARENT_CHILD = "parent-child"


@dataclass(frozen=True)
class Pairing:
    kind: PairingKind
    parent: str | None = None     # PARENT_CHILD: the session that is the parent

    @property
    def id(self) -> str:
        return f"parent={self.parent}" if self.kind is PairingKind.PARENT_CHILD else self.kind.value


TOP_LEVEL = Pairing(PairingKind.TOP_LEVEL)
SIBLINGS = Pairing(PairingKind.SIBLINGS)
PARENT_T1 = Pairing(PairingKind.PARENT_CHILD, "T1")
PARENT_T2 = Pairing(PairingKind.PARENT_CHILD, "T2")


class Role(enum.Enum):
    TOP_LEVEL = "top-level"
    CHILD = "child"
    PARENT = "parent"


# --- run results ---------------------------------------------------------------------------------

class InvalidPermutation(Exception):
    """An explicit permutation asked for a step of a session that is blocked (or not yet spawned)."""


class IsolationHang(AssertionError):
    """A step neither completed nor blocked in time, or every session is blocked without a deadlock."""


@dataclass
class RunOutcome:
    """What one permutation did."""

    scenario: Scenario
    pairing: Pairing
    permutation: list[str] = field(default_factory=list)   # steps in the order they were started
    trace: list[str] = field(default_factory=list)          # isolationtester-style lines
    results: dict[str, Any] = field(default_factory=dict)   # step -> value, for steps that completed
    errors: dict[str, BaseException] = field(default_factory=dict)
    blocked: list[str] = field(default_factory=list)        # steps seen blocked
    skipped: list[str] = field(default_factory=list)        # steps of sessions that had already ended
    outcomes: dict[str, str] = field(default_factory=dict)  # session -> committed | aborted | never started
    committed: set[str] = field(default_factory=set)        # sessions whose work reached PostgreSQL
    final: dict[str, int] = field(default_factory=dict)     # the items table afterwards
    history: list = field(default_factory=list)
    leaked_transactions: int = 0
    spawn_index: int | None = None       # parent/child: how many of the parent's steps preceded the spawn

    @property
    def deadlocks(self) -> list[str]:
        return [name for name, error in self.errors.items() if isinstance(error, activedb.DeadlockDetected)]

    def describe(self) -> str:
        lines = [f"{self.scenario.name} [{self.pairing.id}] permutation: {' '.join(self.permutation)}"]
        lines += [f"  {line}" for line in self.trace]
        lines.append(f"  outcomes: {self.outcomes}; final state: {self.final}")
        return "\n".join(lines)


@dataclass
class _Running:
    """A step sent to a session, until it completes.  The session thread writes ``value``/``error``/
    ``ends_session`` and then sets ``done`` (children: the runner sees the end as ``handle.done()``)."""

    step: Step
    done: threading.Event = field(default_factory=threading.Event)
    value: Any = None
    error: BaseException | None = None
    ends_session: bool = False
    seen_blocked: bool = False
    # Set by a parent's thread just before it waits for its children (commit, join, abort): the
    # runner counts it as blocked only from then on, and only once its own locks were handed over.
    waits_for_children: bool = False
    aborting: bool = False
    trace_line: int = -1      # the runner's: where the trace shows this step being started


class _Stop(Exception):
    """Sent to a session by the cleanup: abort and end."""


class _Rollback(Exception):
    """A child's Abort step: its function raises this, so the child aborts."""


class _Session:
    def __init__(self, name: str, steps: tuple[Step, ...], role: Role):
        self.name = name
        self.steps = steps
        self.role = role
        self.position = 0
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.running: _Running | None = None
        self.started = threading.Event()    # its transaction exists and its thread serves steps
        self.ended = False                  # (runner's view) its transaction ended; steps left are skipped
        self.tx = None
        self.handle = None                  # CHILD: its SubtransactionHandle
        # PARENT without a Spawn step of its own: the spawn, offered before each of its steps until taken.
        self.floating_spawn: Step | None = None

    def next_step(self) -> Step | None:
        return self.steps[self.position] if self.position < len(self.steps) else None


# --- the runner ----------------------------------------------------------------------------------

class PermutationRunner:
    """Runs permutations of one scenario in one pairing against ``db`` (made with ``record_history=True``)."""

    def __init__(self, db, scenario: Scenario, pairing: Pairing):
        if not scenario.runs_as(pairing):
            raise ValueError(f"scenario {scenario.name} does not run as {pairing.id}")
        self.db = db
        self.locks = db.transactions.locks
        self.scenario = scenario
        self.pairing = pairing

    # The chooser gets the names of the steps that may run next and returns one of them; an explicit
    # permutation may also return a step that is not among them (invalid, or skipped if its session ended).
    def run(self, choose: Callable[[list[str]], str | None]) -> RunOutcome:
        self._reset()
        self.outcome = RunOutcome(self.scenario, self.pairing)
        try:
            with testing.Watchdog(STEP_TIMEOUT * 3 + 30, self.locks, describe=self._describe_sessions):
                self._start()
                self._settle()
                while True:
                    available = self._available()
                    name = choose(available)
                    if name is None:
                        break
                    self._send(name, available)
                    self._settle()
                if any(session.running for session in self.sessions):
                    raise self._hang("every session with steps left is blocked, and the lock manager found no "
                                     "deadlock: a wait it cannot see")
                self._finish()
        except IsolationHang as error:
            raise IsolationHang(f"{error}{self._cleanup()}") from None
        except BaseException:
            self._cleanup()
            raise
        return self.outcome

    # --- setup ------------------------------------------------------------------------------------

    def _reset(self) -> None:
        with self.db.engine.begin() as connection:
            connection.execute(sa.text(f"DELETE FROM {TABLE}"))
            for key, value in self.scenario.initial.items():
                connection.execute(sa.text(f"INSERT INTO {TABLE} (key, value) VALUES (:k, :v)"),
                                   {"k": key, "v": value})
        self.db.history.clear()
        self.threads: list[threading.Thread] = []
        self.roots: list = []
        self.sibling_parent_error: BaseException | None = None
        kind, parent = self.pairing.kind, self.pairing.parent
        self.sessions = [
            _Session(name, steps, Role.TOP_LEVEL if kind is PairingKind.TOP_LEVEL
                     else Role.PARENT if name == parent else Role.CHILD)
            for name, steps in self.scenario.sessions.items()
        ]
        for session in self.sessions:
            if session.role is Role.PARENT and not any(isinstance(step.op, Spawn) for step in session.steps):
                session.floating_spawn = Step(self.spawn_step_name, Spawn())
        self.by_step = {step.name: session for session in self.sessions
                        for step in (*session.steps, *([session.floating_spawn] if session.floating_spawn else []))}
        self.children = [session for session in self.sessions if session.role is Role.CHILD]

    @property
    def spawn_step_name(self) -> str | None:
        """The name of the parent's spawn step when the runner places it (``s1`` for parent T1): offered
        before each of the parent's steps up to the first that waits for children; None if the scenario
        has its own ``Spawn`` step or the pairing has no parent session."""
        parent = self.pairing.parent
        if parent is None or any(isinstance(step.op, Spawn) for step in self.scenario.sessions[parent]):
            return None
        return "s" + "".join(character for character in parent if character.isdigit())

    def _thread(self, target, *args) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True,
                                  name=f"isolation-{self.scenario.name}-{len(self.threads)}")
        self.threads.append(thread)
        thread.start()

    def _start(self) -> None:
        if self.pairing.kind is PairingKind.SIBLINGS:
            ready = threading.Event()
            self._thread(self._sibling_parent, ready)
            if not ready.wait(STEP_TIMEOUT):
                raise self._hang("the siblings' parent did not spawn them")
        else:
            for session in self.sessions:
                if session.role is not Role.CHILD:
                    self._thread(self._top_level, session)
                    if not session.started.wait(STEP_TIMEOUT):
                        raise self._hang(f"{session.name} did not begin")

    def _top_level(self, session: _Session) -> None:
        try:
            with self.db.transaction() as tx:
                self.roots.append(tx)
                self._serve(session, tx)
        except BaseException:   # recorded by _serve; the transaction is over
            pass

    def _sibling_parent(self, ready: threading.Event) -> None:
        try:
            with self.db.transaction() as tx:
                self.roots.append(tx)
                self._spawn_children(tx)
                ready.set()
                for child in self.children:
                    try:
                        child.handle.result(ACTOR_TIMEOUT)
                    except BaseException:
                        pass          # the child's outcome is recorded; the parent commits anyway
        except BaseException as error:
            self.sibling_parent_error = error

    def _spawn_children(self, tx) -> None:
        # One at a time, each started before the next is spawned.  The worker pool counts a worker it
        # has notified as idle until that worker wakes up, so three spawns in a row with two idle
        # workers leave the third task queued (not running, no new thread although max_workers allows
        # one) until somebody waits for it — and the runner needs every child serving its steps.
        for child in self.children:
            child.handle = tx.spawn(self._child_body, child)
            child.tx = child.handle.transaction
            if not child.started.wait(STEP_TIMEOUT):
                raise IsolationHang(f"child {child.name} did not start within {STEP_TIMEOUT} s")

    def _child_body(self, tx, session: _Session) -> None:
        self._serve(session, tx)

    def _serve(self, session: _Session, tx) -> None:
        """The session's thread: run the steps it is sent until its transaction ends.  A child returns
        (commit) or raises (abort) and its handle reports the end; the others commit or abort here."""
        session.tx = tx
        session.started.set()
        child = session.role is Role.CHILD
        while True:
            try:
                running = session.inbox.get(timeout=ACTOR_TIMEOUT)
            except queue.Empty:
                running = None
            if not isinstance(running, _Running):
                error = _Stop("stopped by the runner (cleanup)")
                if not child:
                    _abort_quietly(tx, error)
                raise error
            op = running.step.op
            try:
                if isinstance(op, Commit):
                    running.ends_session = True
                    if child:
                        return
                    running.waits_for_children = True
                    tx.commit()
                elif isinstance(op, Abort):
                    running.ends_session = True
                    if child:
                        raise _Rollback()
                    running.aborting = running.waits_for_children = True
                    tx.abort("the scenario's abort step")
                elif isinstance(op, Spawn):
                    self._spawn_children(tx)
                elif isinstance(op, Join):
                    running.waits_for_children = True
                    for other in self.children:
                        try:
                            other.handle.result(ACTOR_TIMEOUT)
                        except BaseException:
                            pass
                else:
                    running.value = op.run(tx)
            except _Rollback:
                raise
            except BaseException as error:
                running.error = error
                running.ends_session = True
                if child:
                    raise
                running.aborting = running.waits_for_children = True
                _abort_quietly(tx, error)
                running.done.set()
                return
            running.done.set()
            if running.ends_session:
                return

    # --- stepping ---------------------------------------------------------------------------------

    def _available(self) -> list[str]:
        names = []
        for session in self.sessions:
            if not session.started.is_set() or session.ended or session.running is not None:
                continue
            step = session.next_step()
            if step is not None and not (session.floating_spawn and isinstance(step.op, WAITS_FOR_CHILDREN)):
                names.append(step.name)
            if session.floating_spawn is not None:
                names.append(session.floating_spawn.name)
        return names

    def _send(self, name: str, available: list[str]) -> None:
        session = self.by_step.get(name)
        if session is None:
            raise InvalidPermutation(f"no step {name!r} in scenario {self.scenario.name}")
        floating = session.floating_spawn is not None and session.floating_spawn.name == name
        if not floating and (session.next_step() is None or session.next_step().name != name):
            raise InvalidPermutation(f"step {name!r} is not the next step of {session.name} "
                                     f"(next: {session.next_step()})")
        self.outcome.permutation.append(name)
        if session.ended:
            session.position += 1
            self.outcome.skipped.append(name)
            self.outcome.trace.append(f"step {name}: skipped ({session.name} has ended)")
            return
        if name not in available:
            why = ("is blocked" if session.running else "has not been spawned yet" if not session.started.is_set()
                   else "has not spawned its children yet")
            raise InvalidPermutation(f"step {name!r}: session {session.name} {why}")
        if floating:
            step, session.floating_spawn = session.floating_spawn, None
        else:
            step = session.steps[session.position]
            session.position += 1
        if isinstance(step.op, Spawn):
            self.outcome.spawn_index = session.position - (0 if floating else 1)
        running = _Running(step, trace_line=len(self.outcome.trace))
        self.outcome.trace.append(f"step {name}:")
        session.running = running
        session.inbox.put(running)

    def _completed(self, session: _Session, running: _Running) -> bool:
        if running.done.is_set():
            return True
        return session.role is Role.CHILD and running.ends_session and session.handle.done()

    def _blocked(self, session: _Session, graph) -> bool:
        tid = session.tx.id
        if graph.has_node(tid) and "waiting_for" in graph.nodes[tid]:
            return True          # a lock request of its own operations waits
        running = session.running
        if session.role is not Role.PARENT or not running.waits_for_children:
            return False
        if tid in graph:
            if running.aborting:
                return False     # the lock manager has not aborted it (and its children) yet
            # The parent waits for a spawned child once it has said so: its holds became retains and the
            # "commit" edge to the child is in the wait-for graph (the lock manager's declared commit edges).
            child_ids = {child.tx.id for child in self.children if child.tx is not None}
            if not any(graph.has_edge(tid, child) and graph.edges[tid, child].get("kind") == "commit"
                       for child in child_ids):
                return False
        return any(child.handle is not None and not child.handle.done() for child in self.children)

    def _settle(self) -> None:
        """Wait until every running step completed or is blocked (see the module docstring)."""
        deadline = time.monotonic() + STEP_TIMEOUT
        idle = threading.Event()
        while True:
            for session in self.sessions:
                if session.running is not None and self._completed(session, session.running):
                    self._complete(session)
            graph = self.locks.wait_for_graph()
            # A step that completed while the graph was taken may have unblocked another: look again.
            if any(s.running is not None and self._completed(s, s.running) for s in self.sessions):
                continue
            unsettled = []
            for session in self.sessions:
                running = session.running
                if running is None:
                    continue
                if self._blocked(session, graph):
                    if not running.seen_blocked:
                        running.seen_blocked = True
                        self.outcome.blocked.append(running.step.name)
                        self.outcome.trace[running.trace_line] += " <waiting ...>"
                else:
                    unsettled.append(session)
            if not unsettled:
                return
            if time.monotonic() > deadline:
                names = ", ".join(f"{s.name}:{s.running.step.name}" for s in unsettled)
                raise self._hang(f"step(s) {names} neither completed nor blocked within {STEP_TIMEOUT} s")
            idle.wait(_POLL)

    def _complete(self, session: _Session) -> None:
        running = session.running
        session.running = None
        name = running.step.name
        error = running.error
        if error is None and session.role is Role.CHILD and running.ends_session:
            try:
                session.handle.result(0)
            except _Rollback:
                pass
            except BaseException as commit_error:   # e.g. the parent was aborted, or SerializationConflict
                error = commit_error
        if error is not None:
            self.outcome.errors[name] = error
            shown = f" ERROR {type(error).__name__}: {str(error).splitlines()[0][:160] if str(error) else ''}"
        else:
            if not running.step.op.control:
                self.outcome.results[name] = running.value
            shown = "" if running.step.op.control else f" {running.value!r}"
        if running.seen_blocked:      # isolationtester's way: the result shows up where the step completed
            self.outcome.trace.append(f"step {name}: <... completed>{shown}")
        else:
            self.outcome.trace[running.trace_line] += shown
        if running.ends_session or error is not None:
            session.ended = True

    # --- the end ----------------------------------------------------------------------------------

    def _finish(self) -> None:
        for session in self.sessions:
            left = [session.floating_spawn] if session.floating_spawn else []
            self.outcome.skipped += [step.name for step in (*left, *session.steps[session.position:])]
        for thread in self.threads:
            thread.join(STEP_TIMEOUT)
            if thread.is_alive():
                raise self._hang(f"thread {thread.name} did not end after the last step")
        for child in self.children:
            if child.handle is not None and not child.handle.done():
                raise self._hang(f"child {child.name} did not end after the last step")
        for session in self.sessions:
            tx = session.tx
            if tx is None:
                self.outcome.outcomes[session.name] = "never started"
                continue
            committed = tx.state is activedb.TxnState.COMMITTED
            self.outcome.outcomes[session.name] = "committed" if committed else "aborted"
            if committed and tx.root.state is activedb.TxnState.COMMITTED:
                self.outcome.committed.add(session.name)
        if self.sibling_parent_error is not None:
            self.outcome.trace.append(f"the siblings' parent failed: {self.sibling_parent_error!r}")
        with self.db.engine.connect() as connection:
            self.outcome.final = dict(connection.execute(sa.text(f"SELECT key, value FROM {TABLE}")).all())
        self.outcome.history = self.db.history.snapshot()
        self.outcome.leaked_transactions = self.locks.statistics().transactions

    def _describe_sessions(self) -> str:
        lines = []
        for session in getattr(self, "sessions", []):
            running = session.running
            lines.append(f"  {session.name} ({session.role.value}, {session.tx.id if session.tx else '-'}, "
                         f"{session.tx.state.value if session.tx else 'not started'}): "
                         f"{'running ' + running.step.name if running else 'idle'}; "
                         f"next {session.next_step().name if session.next_step() else '-'}")
        return "sessions:\n" + "\n".join(lines)

    def _diagnose(self, graph) -> str:
        """What a parent that waits for its children with its own locks still held means (bug B's shape)."""
        child_ids = {child.tx.id for child in self.children if child.tx is not None}
        for session in self.sessions:
            running = session.running
            if session.role is not Role.PARENT or running is None or not running.waits_for_children:
                continue
            segments = {node for node, data in graph.nodes(data=True)
                        if data.get("parent") == session.tx.id and node not in child_ids}
            if not segments:
                continue
            waiters = sorted({f"{waiter} for {data.get('resource')}" for waiter, target, data in graph.edges(data=True)
                              if target in segments and data.get("kind") != "commit"})
            if waiters:
                return (f"\ndiagnosis: parent {session.name} waits for its children ({running.step.name}) while its "
                        f"own operations (segment {sorted(segments)}) still hold locks that {'; '.join(waiters)} "
                        f"wait(s) for — a deadlock the lock manager cannot see")
            return (f"\ndiagnosis: parent {session.name} waits for its children ({running.step.name}) while its "
                    f"own operations (segment {sorted(segments)}) still hold their locks — a wait the lock manager "
                    f"cannot see; a child asking for one of those locks would hang")
        return ""

    def _hang(self, reason: str) -> IsolationHang:
        graph = self.locks.wait_for_graph()
        edges = [f"  {waiter} -[{data.get('kind')} {data.get('resource', '')}]-> {target}"
                 for waiter, target, data in sorted(graph.edges(data=True), key=repr)]
        return IsolationHang(
            f"{self.scenario.name} [{self.pairing.id}] hung: {reason}{self._diagnose(graph)}\n"
            f"permutation so far: {' '.join(self.outcome.permutation)}\n"
            + "\n".join(f"  {line}" for line in self.outcome.trace) + "\n"
            + "wait-for graph:\n" + ("\n".join(edges) or "  (no edges)") + "\n"
            + self._describe_sessions()
        )

    def _cleanup(self) -> str:
        """Abort every transaction of the run so that no thread stays stuck, then join the threads.
        Returns what is still stuck afterwards ("" if nothing)."""
        for session in getattr(self, "sessions", []):
            session.inbox.put(None)
        for root in list(getattr(self, "roots", [])):
            _abort_quietly(root, _Stop("aborted by the isolation runner's cleanup"))
        for thread in getattr(self, "threads", []):
            thread.join(STEP_TIMEOUT)
        stuck = [thread.name for thread in getattr(self, "threads", []) if thread.is_alive()]
        stuck += [f"child {child.name}" for child in getattr(self, "children", [])
                  if child.handle is not None and not child.handle.done()]
        if stuck:
            return f"\nstill stuck after the cleanup aborted every transaction: {stuck}"
        return "\ncleanup: every transaction aborted, every thread of the run ended"


def _abort_quietly(tx, reason: BaseException) -> None:
    if tx.state in (activedb.TxnState.ACTIVE, activedb.TxnState.COMMITTING):
        try:
            tx.abort(reason)
        except activedb.TransactionError:
            pass


# --- generating permutations ---------------------------------------------------------------------

class PermutationTree(ChoiceTree):
    """The tree of valid permutations of one scenario in one pairing, discovered by running them (the test kit's
    :class:`~activedb.testing.ChoiceTree`, walked by permutation text)."""

    def walk(self, explicit: str | None = None) -> tuple[Chooser, Finish]:   # type: ignore[override]
        """As ``ChoiceTree.walk``, ``explicit`` a permutation's text (step names separated by blanks)."""
        return super().walk(explicit.split() if explicit is not None else None)


# --- the serializability check -------------------------------------------------------------------

@dataclass(frozen=True)
class SerialOrder:
    units: tuple[tuple[str, tuple[Step, ...]], ...]   # (label, steps) in execution order

    def __str__(self) -> str:
        return " ; ".join(label for label, _ in self.units)


def serial_orders(outcome: RunOutcome) -> Iterator[SerialOrder]:
    """Every serial execution of the committed sessions that serializability allows."""
    scenario, pairing = outcome.scenario, outcome.pairing

    def data_steps(session: str) -> tuple[Step, ...]:
        return tuple(step for step in scenario.sessions[session] if not step.op.control)

    if pairing.kind is not PairingKind.PARENT_CHILD:
        committed = [name for name in scenario.sessions if name in outcome.committed]
        for order in itertools.permutations(committed):
            yield SerialOrder(tuple((name, data_steps(name)) for name in order))
        return
    parent = pairing.parent
    if parent not in outcome.committed:
        yield SerialOrder(())
        return
    parent_steps = scenario.sessions[parent]
    spawn_at = outcome.spawn_index if outcome.spawn_index is not None else len(parent_steps)
    # The parent's data steps are units in their order; a child goes anywhere after the spawn.
    units = [(step.name, (step,)) for step in parent_steps if not step.op.control]
    earliest = sum(1 for step in parent_steps[:spawn_at] if not step.op.control)
    children = [name for name in scenario.sessions if name != parent and name in outcome.committed]
    for order in itertools.permutations(children):
        for positions in itertools.combinations_with_replacement(range(earliest, len(units) + 1), len(order)):
            sequence = list(units)
            for offset, (child, position) in enumerate(zip(order, positions)):
                sequence.insert(position + offset, (child, data_steps(child)))
            yield SerialOrder(tuple(sequence))


def simulate(initial: Mapping[str, int], order: SerialOrder) -> tuple[dict[str, Any], dict[str, int]]:
    state = dict(initial)
    results: dict[str, Any] = {}
    for _, steps in order.units:
        for step in steps:
            try:
                results[step.name] = step.op.simulate(state)
            except Exception as error:     # e.g. a duplicate insert: that order cannot be the witness
                results[step.name] = error
    return results, state


def serial_witness(outcome: RunOutcome) -> tuple[SerialOrder | None, str]:
    """A serial order of the committed sessions that gives the same reads and final state, or
    ``(None, explanation)``."""
    observed = {name: value for name, value in outcome.results.items()
                if outcome.scenario.session_of(name) in outcome.committed}
    tried = []
    for order in serial_orders(outcome):
        results, state = simulate(outcome.scenario.initial, order)
        expected = {name: results[name] for name in observed}
        if expected == observed and state == outcome.final:
            return order, ""
        differences = {name: (observed[name], expected[name]) for name in observed if observed[name] != expected[name]}
        tried.append(f"  {order}: reads differing (seen, serial) {differences}; final {state}")
    return None, (f"not serializable: committed {sorted(outcome.committed)}, reads {observed}, final "
                  f"{outcome.final}; no serial order matches:\n" + "\n".join(tried))
