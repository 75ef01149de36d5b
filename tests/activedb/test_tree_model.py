"""Hypothesis state machine: real activedb transaction trees against a sequential reference model.

Every node of every tree is an *actor* on its own thread -- a top-level transaction on a thread of
the test, a spawned child on activedb's worker pool (``tx.spawn``), an inline child on its parent's
thread (``tx.subtransaction()``) -- that executes the steps the state machine sends it, one at a
time, and reports each result.  Spawned children therefore run concurrently with their parent and
siblings, but every step happens in the order the state machine chose, so failures shrink and
replay.  Nothing is ordered by sleeping: the test waits for the results and ends the model predicts
and, for a step that must block, until the lock table shows exactly the waiting requests the model
predicts (``LockManager.snapshot``), each with a hard timeout that fails with the wait-for graph; a
step that waits for spawned children (``handle.result``, a commit) is settled only once its wait is an
edge of the real wait-for graph (otherwise, on a loaded machine, the next step could overtake it).

The reference model (``_tree_reference.py``) predicts what every step returns, which steps block
and on what (Härder-Rothermel hold/retain locks with declared commit edges), deadlock victims, what each node ends
with, and what the committed table holds.  Rules: begin a tree (at most two live at once); read,
prefetch, write (upsert of some columns), insert, delete, scan (optionally ``where value = v``);
a new child, spawned (``tx.spawn``) or inline (``tx.subtransaction()``); wait for a spawned child
(``handle.result``); commit or abort any node; and a change committed by "another process" (a
plain connection), after which the model expects the ``SerializationConflict`` a child's commit or
the flush must raise.  Generation favours what finds bugs: reads of a row another branch of the
tree relies on, and changes by another process to rows a tree relies on.

Invariants after every rule: each step returned what the model predicts, each node ended as
predicted (state and error), the lock manager's table and transactions equal the model's, every
transaction's state equals the model's, no actor produced anything unexpected, the committed
``items`` table equals the model's, and some node can still take a step (no hang).  At the end of
an example every live node is committed (deepest first) or aborted through the model, the lock
manager must be empty and (unless "another process" wrote) the recorded history must pass
``testing.check_history``.

What the model leaves out (such transitions are not generated): the lock manager's fairness queue,
and deadlocks other than those closed by the request of the step the test just sent (see the
reference model's docstring).  An insert's existence check is carried by the write-set entry, not
validated as a read (``INSERT_CHECK_VALIDATED``); the test at the end checks that it survives a
later delete.

What it catches (each tree-isolation fix (bugs A, B, C of the regression tests) reverted alone, CI defaults): A -- a read returns
the committed image where the model expects the ancestor's write; B -- the lock table shows a
committing parent still holding its rows while its child waits.  C (siblings relying on different
committed images) needs another process's write between two fresh reads of one row in two branches;
the CI examples do not reach it (``ACTIVEDB_TEST_SEED=random`` runs may) -- the regression test and the
two-process list-append test catch it.

Environment (CI runs the defaults: a derandomized, fixed sequence of examples):

* ``ACTIVEDB_TEST_SEED``: an integer seed, or ``random`` for a fresh one (default: derandomized);
* ``ACTIVEDB_MODEL_EXAMPLES`` (default 150) and ``ACTIVEDB_MODEL_STEPS`` (default 40); long runs
  need ``pytest --timeout 0`` (the test allows itself 600 s: a failing example may shrink for 300 s);
* ``ACTIVEDB_MODEL_TIMEOUT``: seconds any single wait may take before the test fails (default 10);
* ``ACTIVEDB_MODEL_EXTERNAL=0`` turns the "another process" rule off;
* ``ACTIVEDB_MODEL_TRACE=1`` prints every example's steps (run pytest with ``-s``);
* ``ACTIVEDB_MODEL_LOCK_TABLE=0`` compares only the number of waiting lock requests instead of the
  whole lock table (held, retained and waiting entries per transaction, as ``LockManager.snapshot``
  reports them);
* ``ACTIVEDB_MODEL_SHRINK=0`` reports the first failing example as found (shrinking an example that
  hangs costs a timeout per attempt).
"""

from __future__ import annotations

import copy
import os
import queue
import threading
from typing import Any, Callable

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, Phase, seed, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule, run_state_machine_as_test

import activedb
from activedb import testing
from activedb.txn import Subtransactions
from tests import _actors as actors
from tests._actors import ABORT, COMMIT
from tests.activedb._tree_reference import Busy, Op, TreeModel
from tests.activedb._tree_reference import Phase as NodePhase

pytestmark = pytest.mark.db(record_history=True)

KEYS = ("a", "b", "c")
INITIAL_ROWS = {
    "a": {"key": "a", "value": 1, "note": None},
    "b": {"key": "b", "value": 2, "note": "b0"},
}
MAX_LIVE_TREES = 2
MAX_NODES_PER_TREE = 5
MAX_NODES_PER_EXAMPLE = 14
MAX_TREES_PER_EXAMPLE = 4
MAX_EXTERNAL_WRITES = 4

EXAMPLES = int(os.environ.get("ACTIVEDB_MODEL_EXAMPLES", "150"))
STEPS = int(os.environ.get("ACTIVEDB_MODEL_STEPS", "40"))
TIMEOUT = float(os.environ.get("ACTIVEDB_MODEL_TIMEOUT", "10"))
EXTERNAL = os.environ.get("ACTIVEDB_MODEL_EXTERNAL", "1") != "0"
SEED = os.environ.get("ACTIVEDB_TEST_SEED")
PRINT_TRACES = os.environ.get("ACTIVEDB_MODEL_TRACE") == "1"
SHRINK = os.environ.get("ACTIVEDB_MODEL_SHRINK", "1") != "0"
COMPARE_LOCK_TABLE = os.environ.get("ACTIVEDB_MODEL_LOCK_TABLE", "1") != "0"
IDLE_LIMIT = 30 * TIMEOUT      # an actor nobody talks to for this long aborts its node (leak guard)
EXAMPLE_TIMEOUT = 20 * TIMEOUT


class Actor(actors.Actor):
    """A node as an actor (``tests/_actors.py``): announces itself, survives ``DuplicateKey``; a spawned
    node's ``handle``, or an inline/top-level node's end (``ended``, set by whoever ran its body)."""

    def __init__(self, name: str):
        super().__init__(name, idle_timeout=IDLE_LIMIT, announce=True, survivable=(activedb.DuplicateKey,))
        self.handle: activedb.SubtransactionHandle | None = None    # a spawned node's
        self.top_level = False
        self.ended = threading.Event()      # set by whoever ran the body (not for spawned nodes)
        self.final_state: activedb.TxnState | None = None
        self.error: BaseException | None = None

    def record_end(self, error: BaseException | None) -> None:
        self.error = error
        self.final_state = self.tx.state if self.tx is not None else None
        self.ended.set()

    def serve_within(self, begin: Callable) -> None:
        """Serve inside the transaction ``begin()`` opens (``with begin() as tx``) and record how it ended."""
        error = None
        try:
            with begin() as tx:
                self.serve(tx)
        except BaseException as caught:
            error = caught
        self.record_end(error)

    def is_ended(self) -> bool:
        if self.handle is not None:
            return self.handle.done()
        return self.ended.is_set()

    def end_state(self) -> tuple[str | None, str | None]:
        if self.handle is not None:
            try:
                self.handle.result(0)
                error = None
            except BaseException as caught:
                error = caught
            return self.handle.state.value, type(error).__name__ if error else None
        state = self.final_state.value if self.final_state else None
        return state, type(self.error).__name__ if self.error else None


# --- steps, run on the node's thread ------------------------------------------------------------

def op_step(op: Op) -> Callable:
    def run(tx):
        if op.kind == "read":
            return tx.read("items", op.key)
        if op.kind == "write":
            return tx.write("items", op.key, **dict(op.values))
        if op.kind == "insert":
            return tx.insert("items", key=op.key, **dict(op.values))
        if op.kind == "delete":
            return tx.delete("items", op.key)
        if op.kind == "scan":
            return sorted(tx.scan("items", dict(op.where) if op.where else None), key=lambda row: row["key"])
        if op.kind == "prefetch":
            return tx.prefetch("items", list(op.keys))
        raise AssertionError(op)
    return run


def spawn_step(child: Actor) -> Callable:
    def run(tx):
        child.handle = tx.spawn(child.serve)
        return None
    return run


def inline_step(child: Actor) -> Callable:
    def run(tx):
        child.serve_within(tx.subtransaction)
        return "inline ended"
    return run


def join_step(child: Actor) -> Callable:
    def run(tx):
        try:
            child.handle.result(IDLE_LIMIT)
            return "committed"
        except BaseException as error:
            return f"failed:{type(error).__name__}"
    return run


# --- the state machine ----------------------------------------------------------------------------

class TreeMachine(RuleBasedStateMachine):
    def __init__(self, db):
        super().__init__()
        self.db = db
        self.locks = db.transactions.locks
        self.model = TreeModel(INITIAL_ROWS)
        self.actors: dict[str, Actor] = {}
        self.tids: dict[str, str] = {}          # activedb transaction id -> model node name
        self.trace: list[str] = []
        self.broken = False
        testing.wait_until(lambda: self.locks.statistics().transactions == 0, TIMEOUT,
                           "the previous example's transactions to end")
        with db.engine.begin() as connection:
            connection.execute(sa.text("DELETE FROM items"))
            for row in INITIAL_ROWS.values():
                connection.execute(sa.text("INSERT INTO items (key, value, note) VALUES (:key, :value, :note)"), row)
        db.history.clear()
        self.watchdog = testing.Watchdog(EXAMPLE_TIMEOUT, self.locks, describe=self._describe)
        self.watchdog.__enter__()

    # --- rules ---------------------------------------------------------------------------------

    @initialize()
    def first_tree(self):
        self.begin_tree()

    @precondition(lambda self: not self.model.live() or (
        len(self.model.live_trees()) < MAX_LIVE_TREES
        and sum(node.parent is None for node in self.model.nodes.values()) < MAX_TREES_PER_EXAMPLE))
    @rule()
    def begin_tree(self):
        self._transition(None, lambda model: model.begin_tree(), lambda name: self._start_tree(name),
                         lambda name: f"begin tree {name}")

    @precondition(lambda self: self.model.ready())
    @rule(data=st.data())
    def read(self, data):
        """Reads favour (node, row) pairs that meet the tree's isolation rules:

        * *fresh* -- the node would read afresh a row another branch of its tree already relies on
          (read from committed data): after another process wrote it, the tree has two images of the
          row, which a child's commit or the flush must refuse; pairs whose row another process has
          already changed (*stale*) most of all;
        * *inherited* -- a row an ancestor of the node wrote: every read of the node must see the
          ancestor's version, never a committed image it cached at an earlier read."""
        ready = self._ready_names()
        fresh = [(name, key) for name in ready for key in self._fresh_in_tree(name)]
        stale = [(name, key) for name, key in fresh if self._changed_since_relied(name, key)]
        inherited = [(name, key) for name in ready for key in self._written_by_ancestors(name)]
        name, key = data.draw(st.sampled_from(stale * 6 + fresh * 3 + inherited * 3
                                              + [(name, key) for name in ready for key in KEYS]
                                              + [(name, None) for name in ready]), label="reader")
        self._operate(data, lambda _: [("read", key) if key else ("prefetch", KEYS)], name=name)

    def _written_by_ancestors(self, name: str) -> list[str]:
        """Rows an ancestor of ``name`` wrote (and ``name`` did not)."""
        found: set[str] = set()
        current = self.model.nodes[name].parent
        while current is not None:
            found |= set(self.model.nodes[current].writes)
            current = self.model.nodes[current].parent
        return sorted(found - set(self.model.nodes[name].writes))

    def _changed_since_relied(self, name: str, key: str) -> bool:
        """Another process changed ``key`` after some node of ``name``'s tree relied on it."""
        root = self.model.root_of(name)
        return any(key in node.db_reads and node.db_reads[key] != self.model.table.get(key)
                   for node in self.model.live() if self.model.root_of(node.name) == root)

    def _fresh_in_tree(self, name: str) -> list[str]:
        """Rows some node of ``name``'s tree relies on but neither ``name`` nor its ancestors do."""
        root = self.model.root_of(name)
        in_tree = {key for node in self.model.live() if self.model.root_of(node.name) == root
                   for key in node.db_reads}
        current: str | None = name
        while current is not None:
            in_tree -= set(self.model.nodes[current].db_reads)
            current = self.model.nodes[current].parent
        return sorted(in_tree)

    @precondition(lambda self: self.model.ready())
    @rule(data=st.data())
    def write(self, data):
        self._operate(data, lambda name: [("write", key, columns) for key in KEYS
                                          for columns in (("value",), ("note",), ("value", "note"))])

    @precondition(lambda self: self.model.ready())
    @rule(data=st.data())
    def insert_or_delete(self, data):
        self._operate(data, lambda name: [(kind, key) for key in KEYS for kind in ("insert", "delete")])

    @precondition(lambda self: self.model.ready())
    @rule(data=st.data())
    def scan(self, data):
        self._operate(data, lambda name: [("scan", None)] + [("scan", value)
                                                             for value in self.model.values_in_use()[-3:]])

    @precondition(lambda self: self._can_grow())
    @rule(data=st.data(), how=st.sampled_from(["spawn", "spawn", "inline"]))
    def new_child(self, data, how):
        """A spawned child (twice as likely: it runs beside its parent) or an inline one."""
        if how == "spawn":
            self._transition(self._growing(), lambda model, name: model.spawn(name),
                             lambda child, name: self._send(name, spawn_step(self.actors[child])),
                             lambda child, name: f"{name} spawns {child}", data=data)
        else:
            self._transition(self._growing(), lambda model, name: model.inline(name),
                             lambda child, name: self._send(name, inline_step(self.actors[child])),
                             lambda child, name: f"{name} opens inline {child}", data=data)

    @precondition(lambda self: self._joinable())
    @rule(data=st.data())
    def join(self, data):
        self._transition(self._joinable(), lambda model, pair: model.join(*pair),
                         lambda _, pair: self._send(pair[0], join_step(self.actors[pair[1]])),
                         lambda _, pair: f"{pair[0]} waits for its child {pair[1]} (handle.result)", data=data)

    @precondition(lambda self: self.model.ready())
    @rule(data=st.data())
    def commit(self, data):
        self._transition(self._ready_names(), lambda model, name: model.commit(name),
                         lambda _, name: self._send(name, COMMIT), lambda _, name: f"commit {name}", data=data)

    @precondition(lambda self: self.model.ready())
    @rule(data=st.data())
    def abort(self, data):
        self._transition(self._ready_names(), lambda model, name: model.abort(name),
                         lambda _, name: self._send(name, ABORT), lambda _, name: f"abort {name}", data=data)

    @precondition(lambda self: EXTERNAL and self.model.live() and self.model.external_writes < MAX_EXTERNAL_WRITES)
    @rule(data=st.data(), delete=st.booleans())
    def another_process_writes(self, data, delete):
        """Another process commits a change, preferably to a row one branch of a tree relies on and
        another could still read afresh (then a child's commit must fail), else to a row a live tree
        relies on (then its flush must fail)."""
        fresh = sorted({key for name in self._ready_names() for key in self._fresh_in_tree(name)})
        relied = sorted({key for node in self.model.live() for key in node.db_reads})
        key = data.draw(st.sampled_from(fresh or relied or KEYS), label="key")

        def change(model):
            value = None if delete else model.fresh_value()
            model.external_write(key, value)
            return value

        self._transition(None, change, lambda value: self._write_externally(key, value),
                         lambda value: f"another process {'deletes' if value is None else f'sets value={value} of'} "
                                       f"{key!r}")

    # --- choosing and applying transitions -------------------------------------------------------

    def _ready_names(self) -> list[str]:
        return [node.name for node in self.model.ready()]

    def _can_grow(self) -> bool:
        return bool(self._growing())

    def _growing(self) -> list[str]:
        return [name for name in self._ready_names()
                if self.model.tree_size(self.model.root_of(name)) < MAX_NODES_PER_TREE
                and len(self.model.nodes) < MAX_NODES_PER_EXAMPLE]

    def _joinable(self) -> list[tuple[str, str]]:
        return [(node.name, child) for node in self.model.ready() for child in node.children
                if self.model.nodes[child].how == "spawn" and self.model.nodes[child].busy is not Busy.ENDED]

    def _operate(self, data, templates_for: Callable[[str], list[tuple]], name: str | None = None) -> None:
        if name is None:
            name = data.draw(st.sampled_from(self._ready_names()), label="node")
        templates = templates_for(name)

        def change(model, template):
            op = self._concrete(model, template)
            model.operate(name, op)
            return op

        self._transition(templates, change, lambda op, _: self._send(name, op_step(op)),
                         lambda op, _: f"{name} {op!r}", data=data)

    @staticmethod
    def _concrete(model: TreeModel, template: tuple) -> Op:
        kind, key = template[0], template[1]
        if kind == "scan":
            return Op("scan", where=None if key is None else (("value", key),))
        if kind == "write":
            values = []
            for column in template[2]:
                value = model.fresh_value()
                values.append((column, value if column == "value" else f"n{value}"))
            return Op("write", key, tuple(values))
        if kind == "insert":
            return Op("insert", key, (("value", model.fresh_value()),))
        if kind == "prefetch":
            return Op("prefetch", keys=key)
        return Op(kind, key)

    def _transition(self, candidates, change, send, describe, data=None) -> None:
        """Try ``change`` on a copy of the model for a candidate (drawn from ``candidates``; None: no
        choice), skip candidates whose outcome the model cannot predict, then perform the chosen one
        on the real system and check everything the model predicts."""
        options = [None] if candidates is None else list(candidates)
        while options:
            choice = options[0] if candidates is None else data.draw(st.sampled_from(options), label="choice")
            model = copy.deepcopy(self.model)
            model.start_transition()
            value = change(model) if candidates is None else change(model, choice)
            if model.ambiguous is None:
                break
            options.remove(choice)
        else:
            self.trace.append(f"(skipped: every choice was ambiguous for the model, e.g. {model.ambiguous})")
            return
        self.model = model
        for name in model.nodes:
            self.actors.setdefault(name, Actor(name))
        label = describe(value) if candidates is None else describe(value, choice)
        self.trace.append(label + _predictions(model))
        try:
            if candidates is None:
                send(value)
            else:
                send(value, choice)
            self._send_abort_messages(label)
            self._observe(label)
            self._check_settled(label)
        except BaseException:
            self.broken = True
            raise

    def _send_abort_messages(self, label: str) -> None:
        """Tell every node the transition doomed to abort once it is idle -- but only after its
        ancestor's abort has reached the lock manager (the node is no longer active there): told
        earlier, its own abort would release its locks before the ancestor's and let a waiter in."""
        for name in self.model.abort_messages:
            tid = self.actors[name].tx.id
            if not self._wait(lambda: not self.locks.is_active(tid)):
                self._fail(label, f"{name} ({tid}) is still active in the lock manager although the model "
                                  f"has it aborted with an ancestor")
            self.actors[name].inbox.put(ABORT)

    def _start_tree(self, name: str) -> None:
        actor = self.actors[name]
        actor.top_level = True
        threading.Thread(target=actor.serve_within, args=(self.db.transaction,), name=f"tree-{name}", daemon=True).start()

    def _send(self, name: str, message: Any) -> None:
        self.actors[name].inbox.put(message)

    def _write_externally(self, key: str, value: int | None) -> None:
        with self.db.engine.begin() as connection:
            if value is None:
                connection.execute(sa.text("DELETE FROM items WHERE key = :k"), {"k": key})
            else:
                connection.execute(sa.text(
                    "INSERT INTO items (key, value) VALUES (:k, :v) ON CONFLICT (key) DO UPDATE SET value = :v"),
                    {"k": key, "v": value})

    # --- checks ------------------------------------------------------------------------------------

    def _observe(self, label: str) -> None:
        for expectation in self.model.expected:
            actor = self.actors[expectation.node]
            if expectation.what == "started":
                kind, tid = self._take(actor, "start", label)
                if kind != "started":
                    self._fail(label, f"{actor.name} sent {kind} {tid!r} before it started")
                self.tids[tid] = actor.name
            elif expectation.what == "result":
                kind, value = self._take(actor, f"finish its step with {expectation.value!r}", label)
                actual = (kind, type(value).__name__ if kind == "error" else value)
                if actual != expectation.value:
                    detail = f" ({value})" if kind == "error" else ""
                    self._fail(label, f"{actor.name}'s step returned {actual!r}{detail}; the model expects "
                                      f"{expectation.value!r}")
            else:
                if not self._wait(actor.is_ended):
                    self._fail(label, f"{actor.name} did not end within {TIMEOUT} s (the model expects "
                                      f"{expectation.value!r})")
                actual = actor.end_state()
                if actual != expectation.value:
                    self._fail(label, f"{actor.name} ended {actual!r}; the model expects {expectation.value!r}")

    def _check_settled(self, label: str) -> None:
        expected = self.model.lock_picture()
        if not COMPARE_LOCK_TABLE:
            expected = sum(len(waiting) for _, _, waiting in expected[1].values())
        if not self._wait(lambda: self._lock_picture() == expected and not self._state_differences()
                          and not self._waits_not_begun()):
            actual = self._lock_picture()
            if COMPARE_LOCK_TABLE:
                locks = (f"  transactions: real {sorted(actual[0])} model {sorted(expected[0])}\n"
                         + _diff("lock", actual[1], expected[1]))
            else:
                locks = f"  waiting lock requests: real {actual}, model {expected}"
            self._fail(label, "the lock table or the transaction states differ from the model's:\n" + locks
                              + "".join(f"\n  state: {line}" for line in self._state_differences())
                              + "".join(f"\n  wait not begun: {waiter} -> {target}"
                                        for waiter, target in self._waits_not_begun()))
        for name, actor in self.actors.items():
            if not actor.outbox.empty():
                self._fail(label, f"{name} reported {actor.outbox.get()!r}, which the model does not expect "
                                  f"(it is {self.model.nodes[name].busy.value})")
            model_ended = self.model.nodes[name].busy is Busy.ENDED
            if actor.is_ended() != model_ended:
                self._fail(label, f"{name} has {'' if actor.is_ended() else 'not '}ended; the model "
                                  f"{'expects it ended' if model_ended else 'does not'}")
        table = self._table()
        if table != self.model.table:
            self._fail(label, f"the committed table differs from the model's:\n  real  {table}\n  model "
                              f"{self.model.table}")
        if self.model.live() and not self.model.ready():
            self._fail(label, "every live node is blocked, yet the model sees no deadlock: a hang")

    def _waits_not_begun(self) -> list[tuple[str, str]]:
        """The model's waits for spawned children (``handle.result``, a commit) that are not edges of the real
        wait-for graph yet (registered or kept by a helping thread: ``lock_snapshot``).  A step sent to a node
        whose wait has not begun would be taken as a step before the wait: a child's lock request that closes
        a cycle through its waiting parent would find no cycle yet, and the parent's wait would close it
        instead, with the parent as the victim -- another history than the one the model predicts.  So the
        next step is sent only once the waits the model has begun are in the graph."""
        expected = []
        for name, node in self.model.nodes.items():
            if node.doomed or node.phase not in (NodePhase.ACTIVE, NodePhase.COMMITTING):
                continue        # (an aborting node waits unregistered)
            if node.busy is Busy.JOIN_WAIT and node.waits_for is not None:
                expected.append((name, node.waits_for))
            elif node.busy is Busy.COMMIT_WAIT:
                expected.extend((name, child) for child in self.model.live_spawned(node))
        if not expected:
            return []
        waits = self.db.transactions.lock_snapshot().waits
        # (not started, or ended: the other checks tell whether the model agrees)
        return [(waiter, target) for waiter, target in expected
                if self.actors[target].tx is not None and not self.actors[target].is_ended()
                and self.actors[target].tx.id not in waits.get(self.actors[waiter].tx.id, ())]

    def _state_differences(self) -> list[str]:
        found = []
        for name, actor in self.actors.items():
            if actor.tx is not None and actor.tx.state.value != self.model.nodes[name].phase.value:
                found.append(f"{name} ({actor.tx.id}) is {actor.tx.state.value}, model "
                             f"{self.model.nodes[name].phase.value}")
        return found

    def _lock_picture(self) -> tuple:
        if not COMPARE_LOCK_TABLE:
            return self.locks.statistics().waiting
        snapshot = self.db.transactions.lock_snapshot()     # lazy nodes shown as the nodes they are
        transactions = {self._owner(tid) for tid in snapshot.transactions}
        resources = {}
        for resource, holders in snapshot.resources.items():
            if holders:
                resources[resource] = (
                    {self._owner(tid): mode for tid, mode in holders.held.items()},
                    {self._owner(tid): mode for tid, mode in holders.retained.items()},
                    tuple((self._owner(request.tid), request.mode) for request in holders.waiting),
                )
        return transactions, resources

    def _owner(self, tid) -> str:
        """A lock-manager transaction id as a model owner: the node's name (a node's own operations
        lock as the node itself)."""
        return self.tids.get(str(tid), f"?{tid}")

    def _table(self) -> dict:
        with self.db.engine.connect() as connection:
            rows = connection.execute(sa.text("SELECT key, value, note FROM items")).mappings().all()
        return {row["key"]: dict(row) for row in rows}

    def _take(self, actor: Actor, what: str, label: str) -> tuple:
        try:
            return actor.outbox.get(timeout=TIMEOUT)
        except queue.Empty:
            self._fail(label, f"{actor.name} did not {what} within {TIMEOUT} s")

    @staticmethod
    def _wait(predicate: Callable[[], Any]) -> bool:
        """Wait for observable state (``testing.wait_until``); False after TIMEOUT s (the caller reports)."""
        try:
            testing.wait_until(predicate, TIMEOUT)
        except AssertionError:           # wait_until's ScenarioError
            return False
        return True

    def _fail(self, label: str, message: str) -> None:
        self.broken = True
        raise AssertionError(f"after step '{label}': {message}\n{self._describe()}")

    def _describe(self) -> str:
        graph = self.locks.wait_for_graph()
        edges = "\n".join(f"    {self._owner(a)} -> {self._owner(b)} ({data.get('kind')})"
                          for a, b, data in graph.edges(data=True))
        steps = "\n".join(f"    {number}. {line}" for number, line in enumerate(self.trace, 1))
        ids = ", ".join(f"{name}={tid}" for tid, name in self.tids.items())
        return (f"steps:\n{steps}\nids: {ids}\nwait-for graph (real):\n{edges or '    (no edges)'}\n"
                f"model:\n{self.model.describe()}")

    # --- the end of an example -----------------------------------------------------------------------

    def teardown(self):
        try:
            if not self.broken:
                self._end_live_trees()
        finally:
            if PRINT_TRACES:
                print("--- example:\n" + "\n".join(f"  {line}" for line in self.trace), flush=True)
            try:
                self._force_cleanup()
            finally:
                self.watchdog.__exit__(None, None, None)
        if not self.broken and self.model.external_writes == 0:
            testing.check_history(self.db.history.snapshot()).assert_ok()

    def _end_live_trees(self) -> None:
        """End what is still live through the model (every prediction is still checked): commit the
        deepest ready node first -- so children delegate before their parents and every tree reaches
        its flush -- or abort it where the model cannot predict the commit."""
        while self.model.live():
            ready = sorted(self.model.ready(), key=lambda node: (-self._depth(node.name), node.name))
            for node, ending in ((node, ending) for node in ready for ending in ("commit", "abort")):
                model = copy.deepcopy(self.model)
                model.start_transition()
                getattr(model, ending)(node.name)
                if model.ambiguous is None:
                    self.model = model
                    label = f"(end of example) {ending} {node.name}"
                    self.trace.append(label + _predictions(model))
                    self._send(node.name, COMMIT if ending == "commit" else ABORT)
                    self._send_abort_messages(label)
                    self._observe(label)
                    self._check_settled(label)
                    break
            else:
                self.broken = True
                return

    def _depth(self, name: str) -> int:
        depth = 0
        while self.model.nodes[name].parent is not None:
            name = self.model.nodes[name].parent
            depth += 1
        return depth

    def _force_cleanup(self) -> None:
        """Make every actor end, whatever state the example left (after a failure)."""
        live = [actor for actor in self.actors.values() if not actor.is_ended()]
        for actor in live:
            actor.inbox.put(ABORT)
        for actor in live:
            if actor.top_level and actor.tx is not None and not actor.is_ended():
                threading.Thread(target=actor.tx.abort, args=("the test cleans up",), daemon=True).start()
        if not self._wait(lambda: all(actor.is_ended() for actor in self.actors.values())):
            stuck = [actor.name for actor in self.actors.values() if not actor.is_ended()]
            raise AssertionError(f"actors {stuck} did not end when the test cleaned up\n{self._describe()}")
        if not self._wait(lambda: self.locks.statistics().transactions == 0):
            raise AssertionError(f"lock-manager transactions left after the example: "
                                 f"{sorted(map(str, self.locks.snapshot().transactions))}")


def _predictions(model: TreeModel) -> str:
    """What the model predicts for a transition, for the trace."""
    parts = []
    for expectation in model.expected:
        if expectation.what == "result":
            kind, value = expectation.value
            parts.append(f"{expectation.node}: {value!r}" if kind == "ok" else f"{expectation.node} raises {value}")
        elif expectation.what == "ended":
            state, error = expectation.value
            parts.append(f"{expectation.node} ends {state}" + (f" ({error})" if error else ""))
    waiting = [node.name for node in model.nodes.values() if node.busy is Busy.LOCK_WAIT]
    if waiting:
        parts.append(f"waiting for locks: {', '.join(waiting)}")
    return f"  => {'; '.join(parts)}" if parts else ""


def _diff(what: str, actual: dict, expected: dict) -> str:
    lines = []
    for key in sorted(set(actual) | set(expected), key=repr):
        if actual.get(key) != expected.get(key):
            lines.append(f"  {what} {key!r}: real {actual.get(key)!r} model {expected.get(key)!r}")
    return "\n".join(lines)


class _NodeWatcher(activedb.Observer):
    """Hears of every node's begin: while it is registered no inline child is a savepoint or a frame, so
    ``frames`` makes lazy nodes (no lock-manager transaction until one is needed)."""

    def on_begin(self, transaction) -> None:
        pass


@pytest.fixture(autouse=True, params=[representation.value for representation in Subtransactions] + ["lazy"])
def representation(request, db):
    """Every representation of inline subtransactions (``frames``: a savepoint or a frame on its parent when it
    can be one; ``materialized``: every node registered from its start) must match the one model; and so must
    the lazy nodes ``frames`` makes where a frame cannot be (``lazy``: ``frames`` with an observer of nodes)."""
    saved = db.transactions.subtransactions
    watcher = db.observe(_NodeWatcher()) if request.param == "lazy" else None
    db.transactions.subtransactions = Subtransactions.FRAMES if watcher else Subtransactions(request.param)
    yield request.param
    db.transactions.subtransactions = saved
    if watcher is not None:
        db.transactions.observers.remove(watcher)


@pytest.mark.timeout(600)
def test_transaction_trees_match_the_reference_model(db):
    def factory():
        return TreeMachine(db)

    if SEED not in (None, "random"):
        factory = seed(int(SEED))(factory)
    run_state_machine_as_test(factory, settings=settings(
        max_examples=EXAMPLES,
        stateful_step_count=STEPS,
        deadline=None,
        derandomize=SEED is None,
        database=None,
        suppress_health_check=list(HealthCheck),
        report_multiple_bugs=False,
        phases=list(Phase) if SHRINK else [phase for phase in Phase if phase is not Phase.shrink],
    ))


@pytest.mark.parametrize("then_insert_again", [False, True], ids=["insert-delete", "insert-delete-insert"])
def test_insert_then_delete_keeps_a_row_another_process_inserted(db, then_insert_again):
    """With the other process first, the tree's insert fails; with the tree first, the other process's
    row survives.  The tree must not commit over it: an INSERT keeps its "must not exist" through a
    later DELETE (the write set's ABSENT entry, checked at the flush), so the commit fails."""
    with db.engine.begin() as connection:
        connection.execute(sa.text("DELETE FROM items"))
    committed = True
    try:
        with db.transaction() as tx:
            tx.insert("items", key="k", value=1)        # checks that no row 'k' exists
            tx.delete("items", "k")
            if then_insert_again:
                tx.insert("items", key="k", value=3)
            with db.engine.begin() as connection:      # another process inserts 'k' and commits
                connection.execute(sa.text("INSERT INTO items (key, value) VALUES ('k', 2)"))
    except (activedb.SerializationConflict, activedb.DuplicateKey):
        committed = False
    with db.engine.connect() as connection:
        rows = dict(connection.execute(sa.text("SELECT key, value FROM items")).all())
    assert not committed and rows == {"k": 2}, f"the tree committed={committed}; items now {rows}"
