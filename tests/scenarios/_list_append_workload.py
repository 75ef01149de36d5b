"""The randomized list-append workload of ``test_list_append_history.py``, and its second process.

Each worker thread runs top-level transactions one after the other.  A transaction's body (and
every child's) draws 2–5 steps at random over a few hot keys of the ``lists`` table, mostly the two
keys its tree favors (so that siblings meet on the same lists more often than whole trees do):

* **read** a list (``tx.read``), or all of them at once (``tx.scan``);
* **append** a unique element: read the list, write it back one element longer — either after a
  ``tx.read`` of that key (with ``for_update``, a share of them a read for update: the row locked in
  PostgreSQL until the tree ends, where a plain reader's flush meets it — the lock manager's and PostgreSQL's
  waits in one cycle, ``RowLockOwners``) or after a ``tx.scan`` of the table (then the tree holds a write of
  the row without any row read of it, and a descendant's reads must compose that write over a committed
  image they fetch themselves);
* create a child: **spawned** on a worker thread (``tx.spawn``, joined later with
  ``handle.result(timeout)`` — or never, then the parent's commit waits for it) or **inline**
  (``with tx.subtransaction()``); children run concurrently with their siblings and with their
  parent's own operations, and may have children themselves (depth ≤ 2);
* **join** a spawned child that is still pending.

A child starts by reading one of its tree's favorite lists, and some top-level transactions start by
spawning two children before doing anything themselves: two nodes of one tree then read a row for
the first time while the other is still running — the window in which another process may commit
a new version of it.

Some children and some top-level transactions raise ``IntentionalAbort``.  ``Deadlock``,
``TransactionAborted`` and ``SerializationConflict`` are expected outcomes: the node aborts and
its parent goes on without it.  Every micro-operation is recorded per node by this module (never
by activedb's own history recorder), with ``spawn``/``join`` markers in the parent, and the
outcome of every node is read from its ``state`` once its top-level transaction has ended.

The scripts are deterministic: each node draws its steps from its own ``random.Random`` seeded
by its parent's, so a seed fixes what every tree *tries* to do; the interleaving is up to the
threads (and the other process).

As a second process (``PYTHONPATH`` = the repository root)::

    python -m tests.scenarios._list_append_workload URL PROCESS SEED THREADS TRANSACTIONS OUTPUT REPRESENTATION FOR_UPDATE

connects, picks REPRESENTATION (a ``Subtransactions`` value) for inline subtransactions and FOR_UPDATE (the
workload's ``for_update``), prints ``ready`` and
it, waits for a line on stdin, runs the same workers and writes
``{"history": [...], "unended": [...], "errors": [...], "outcomes": {...}}`` as JSON to OUTPUT.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import sys
import threading
import time
import traceback
from collections import Counter
from typing import Any

import activedb
from activedb import testing
from activedb.lowlevel import Subtransactions
from activedb.testing import Outcome, RecordedTransaction

TABLE = "lists"
KEYS = ("k0", "k1", "k2", "k3", "k4")
SEEDED_KEYS = KEYS[:3]         # rows that exist at the start; the first append creates the others
MAX_DEPTH = 2
# A run still going after this many seconds is a hang: the watchdog prints the wait-for graph and
# every stack (a CI-sized run takes 5-25 s on two idle cores).
WATCHDOG_TIMEOUT = float(os.environ.get("ACTIVEDB_LIST_APPEND_WATCHDOG", "120"))
RESULT_TIMEOUT = 60.0          # a child that takes longer is a hang
FAVORITE = 0.75               # a step's key is one of its tree's two favorite keys this often
FAN_OUT = 0.25                # a top-level transaction starts by spawning two children this often
TOP_LEVEL_ABORT = 0.08
CHILD_ABORT = 0.15


class IntentionalAbort(Exception):
    """Raised by a node whose script decided to abort it."""


EXPECTED = (activedb.DeadlockDetected, activedb.TransactionAborted, activedb.SerializationConflict, IntentionalAbort)


def breaks_hold_retain(error: BaseException) -> bool:
    """A deadlock is an expected outcome, but not one in which a node waits for its own child (a
    ``commit`` edge) while another transaction waits for a lock that node *holds*: a node's own locks
    become retained before it waits for its children (``activedb/txn/README.md``), so a waiting
    parent holds nothing."""
    if not isinstance(error, activedb.DeadlockDetected):
        return False
    waiting_for_children = {edge.waiter for edge in error.cycle if edge.kind == "commit"}
    return any(edge.kind == "held" and edge.target in waiting_for_children for edge in error.cycle)


class NodeRecord:
    """What the workload recorded for one node of a tree.

    Thread-safety: ``ops`` is appended to only by the thread running the node's body; the
    counters are used only by that thread too.  ``transaction`` is set once, before the node's
    record is handed to the :class:`Recorder`."""

    def __init__(self, node_id: str, parent: str | None):
        self.id = node_id
        self.parent = parent
        self.ops: list[tuple] = []
        self.transaction: activedb.Transaction | None = None
        self._appends = itertools.count()
        self._children = itertools.count(1)

    def next_element(self) -> str:
        return f"{self.id}:{next(self._appends)}"

    def next_child_id(self) -> str:
        return f"{self.id}.{next(self._children)}"

    def recorded(self) -> tuple[RecordedTransaction, bool]:
        """The node as the checker takes it, and whether it ended (committed or aborted).

        A node that did not end although its top-level transaction did is an activedb defect the
        test reports on its own; for the anomaly check it counts as aborted (none of its work can
        have reached its parent: a commit that delegates also ends the node).
        Precondition: its top-level transaction has ended."""
        state = self.transaction.state
        outcome = Outcome.COMMITTED if state is activedb.TxnState.COMMITTED else Outcome.ABORTED
        ended = state in (activedb.TxnState.COMMITTED, activedb.TxnState.ABORTED)
        return RecordedTransaction(self.id, self.parent, outcome, tuple(self.ops)), ended


class Recorder:
    """Collects node records, outcome counts and unexpected errors from every worker thread.

    Thread-safety: ``_mutex`` protects ``_records``, ``outcomes`` and ``errors``."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._records: list[NodeRecord] = []
        self.outcomes: Counter = Counter()   # "top-level committed", "child aborted: Deadlock", ...
        self.errors: list[str] = []
        self._reported: set[int] = set()

    def add(self, record: NodeRecord) -> None:
        with self._mutex:
            self._records.append(record)

    def count(self, what: str, error: BaseException | None = None) -> None:
        """Count an outcome; an expected error that breaks the locking discipline is unexpected."""
        if error is not None and breaks_hold_retain(error):
            self.unexpected(what, error)
        through_row_lock = isinstance(error, activedb.DeadlockDetected) and any(
            edge.kind == "row-lock" for edge in error.cycle)
        with self._mutex:
            self.outcomes[what] += 1
            self.outcomes["deadlocks through a row lock"] += through_row_lock

    def unexpected(self, where: str, error: BaseException) -> None:
        """An error that is not an expected outcome: the test fails with its traceback."""
        with self._mutex:
            if id(error) in self._reported:
                return
            self._reported.add(id(error))
            self.errors.append(f"{where}: " + "".join(traceback.format_exception(error)))

    def history(self) -> tuple[list[RecordedTransaction], list[str]]:
        """Every recorded node, and the ids of those still not ended (see ``NodeRecord.recorded``).
        Precondition: every worker has finished."""
        with self._mutex:
            records = list(self._records)
        history, unended = [], []
        for record in records:
            transaction, ended = record.recorded()
            history.append(transaction)
            if not ended:
                unended.append(f"{record.id} ({record.transaction.state.value}, {record.transaction.id})")
        return history, unended


class Workload:
    """One process's workers.  Thread-safe: each worker thread uses its own trees and random streams.
    ``for_update``: the share of the appends after a row read whose read is for update (0: none, and the scripts
    draw what they drew before the option existed)."""

    def __init__(self, db: activedb.Database, process: str, seed: int | str, for_update: float = 0.0):
        self.db = db
        self.process = process
        self.seed = seed
        self.for_update = for_update
        self.recorder = Recorder()

    # --- micro-operations ---------------------------------------------------------------------

    @staticmethod
    def read(tx: activedb.Transaction, record: NodeRecord, key: str, for_update: bool = False) -> list:
        row = tx.read(TABLE, key, for_update=for_update)
        seen = list(row["value"]) if row is not None else []
        record.ops.append(("read", key, seen))
        return seen

    @staticmethod
    def scan(tx: activedb.Transaction, record: NodeRecord) -> dict[str, list]:
        rows = {row["key"]: list(row["value"]) for row in tx.scan(TABLE)}
        for key in KEYS:
            record.ops.append(("read", key, rows.get(key, [])))
        return rows

    @staticmethod
    def write_appended(tx: activedb.Transaction, record: NodeRecord, key: str, seen: list) -> None:
        element = record.next_element()
        tx.write(TABLE, key, value=seen + [element])
        record.ops.append(("append", key, element))

    # --- trees ----------------------------------------------------------------------------------

    def body(self, tx: activedb.Transaction, record: NodeRecord, rng: random.Random, depth: int,
             favorites: tuple[str, ...]) -> None:
        pending: list[tuple[NodeRecord, activedb.SubtransactionHandle]] = []
        if depth > 0:
            # A child starts by reading one of its tree's lists, often while its parent or a sibling
            # reads it too: two first reads of a row in one tree, which another process may commit
            # between.
            self.read(tx, record, rng.choice(favorites))
        elif rng.random() < FAN_OUT:
            # Children first, then the parent's own steps: the parent reads rows for the first
            # time while its children run (and have read them already).
            pending.extend(self.spawn(tx, record, rng, depth, favorites) for _ in range(2))
        for _ in range(rng.randint(2, 5)):
            roll = rng.random()
            key = rng.choice(favorites if rng.random() < FAVORITE else KEYS)
            can_nest = depth < MAX_DEPTH
            if roll < 0.22:
                self.read(tx, record, key)
            elif roll < 0.50:
                update = bool(self.for_update) and rng.random() < self.for_update
                if update:
                    self.recorder.count("read for update")
                self.write_appended(tx, record, key, self.read(tx, record, key, update))
            elif roll < 0.55:
                self.scan(tx, record)
            elif roll < 0.61:
                self.write_appended(tx, record, key, self.scan(tx, record).get(key, []))
            elif roll < 0.76 and can_nest:
                pending.append(self.spawn(tx, record, rng, depth, favorites))
            elif roll < 0.84 and can_nest:
                self.inline(tx, record, rng, depth, favorites)
            elif pending:
                self.join(record, *pending.pop(rng.randrange(len(pending))))
            else:
                self.read(tx, record, key)
        for child_record, handle in pending:
            if rng.random() < 0.6:
                self.join(record, child_record, handle)     # the others: the commit waits for them
        if depth > 0 and rng.random() < CHILD_ABORT:
            raise IntentionalAbort(f"{record.id} aborts by its script")

    def child_body(self, child: activedb.Transaction, record: NodeRecord, seed: int, depth: int,
                   favorites: tuple[str, ...]) -> None:
        try:
            self.body(child, record, random.Random(seed), depth, favorites)
        except EXPECTED:
            raise
        except BaseException as error:
            self.recorder.unexpected(record.id, error)
            raise

    def spawn(self, tx: activedb.Transaction, record: NodeRecord, rng: random.Random, depth: int,
              favorites: tuple[str, ...]) -> tuple[NodeRecord, activedb.SubtransactionHandle]:
        child_record = NodeRecord(record.next_child_id(), record.id)
        handle = tx.spawn(self.child_body, child_record, rng.getrandbits(64), depth + 1, favorites)
        child_record.transaction = handle.transaction
        self.recorder.add(child_record)
        record.ops.append(("spawn", child_record.id))
        return child_record, handle

    def join(self, record: NodeRecord, child_record: NodeRecord, handle: activedb.SubtransactionHandle) -> None:
        """Wait for a spawned child and record the join, which orders the parent's later operations after the
        child's.  A wait that closed a deadlock cycle and was its victim raises ``DeadlockDetected`` while the child
        goes on (``SubtransactionHandle.result``): the parent did not wait, so no join is recorded (its commit
        waits for the child)."""
        try:
            handle.result(RESULT_TIMEOUT)
            self.recorder.count("child committed")
        except EXPECTED as error:
            if handle.transaction.state not in (activedb.TxnState.COMMITTED, activedb.TxnState.ABORTED):
                self.recorder.count(f"wait refused, child running: {type(error).__name__}", error)
                return
            self.recorder.count(f"child aborted: {type(error).__name__}", error)
        record.ops.append(("join", child_record.id))

    def inline(self, tx: activedb.Transaction, record: NodeRecord, rng: random.Random, depth: int,
               favorites: tuple[str, ...]) -> None:
        child_record = NodeRecord(record.next_child_id(), record.id)
        seed = rng.getrandbits(64)
        created = False
        try:
            with tx.subtransaction() as child:
                child_record.transaction = child
                self.recorder.add(child_record)
                record.ops.append(("spawn", child_record.id))
                created = True
                self.child_body(child, child_record, seed, depth + 1, favorites)
            self.recorder.count("child committed")
        except EXPECTED as error:
            self.recorder.count(f"child aborted: {type(error).__name__}", error)
        finally:
            if created:
                record.ops.append(("join", child_record.id))

    def top_level(self, name: str, rng: random.Random) -> None:
        record = NodeRecord(name, None)
        seed = rng.getrandbits(64)
        abort = rng.random() < TOP_LEVEL_ABORT
        favorites = tuple(rng.sample(KEYS, 2))
        try:
            with self.db.transaction() as tx:
                record.transaction = tx
                self.recorder.add(record)
                self.body(tx, record, random.Random(seed), 0, favorites)
                if abort:
                    raise IntentionalAbort(f"{name} aborts by its script")
            self.recorder.count("top-level committed")
        except EXPECTED as error:
            self.recorder.count(f"top-level aborted: {type(error).__name__}", error)

    def worker(self, number: int, transactions: int) -> None:
        prefix = f"{self.process}w{number}"
        rng = random.Random(f"{self.seed}:{prefix}")
        try:
            for index in range(transactions):
                self.top_level(f"{prefix}t{index}", rng)
        except BaseException as error:
            self.recorder.unexpected(prefix, error)

    def run(self, threads: int, transactions: int, watchdog_timeout: float) -> Recorder:
        """Run ``threads`` workers of ``transactions`` top-level transactions each, under a watchdog.

        Raises ``AssertionError`` if a worker is still running after the watchdog fired (a hang)."""
        workers = [threading.Thread(target=self.worker, args=(number, transactions), daemon=True,
                                    name=f"list-append-{self.process}-{number}") for number in range(threads)]
        with testing.Watchdog(watchdog_timeout, self.db.transactions.locks):
            for worker in workers:
                worker.start()
            deadline = time.monotonic() + watchdog_timeout + 10
            for worker in workers:
                worker.join(max(0.0, deadline - time.monotonic()))
            hung = [worker.name for worker in workers if worker.is_alive()]
            if hung:
                raise AssertionError(
                    f"process {self.process}: workers {', '.join(hung)} still running {watchdog_timeout + 10:.0f} s "
                    f"after the start — a hang (the watchdog printed the wait-for graph and every stack above)")
        return self.recorder


def reset(db: activedb.Database) -> None:
    """Empty the lists; the seeded keys start as empty lists, the others as missing rows."""
    import sqlalchemy as sa

    with db.engine.begin() as connection:
        connection.execute(sa.text("DELETE FROM lists"))
        for key in SEEDED_KEYS:
            connection.execute(sa.text("INSERT INTO lists (key, value) VALUES (:key, '[]')"), {"key": key})


def final_lists(db: activedb.Database) -> dict[str, list]:
    import sqlalchemy as sa

    with db.engine.connect() as connection:
        return {key: list(value) for key, value in connection.execute(sa.text("SELECT key, value FROM lists"))}


def main(argv: list[str]) -> int:
    url, process, seed, threads, transactions, output, representation, for_update = argv
    db = activedb.connect(url)
    db.transactions.subtransactions = Subtransactions(representation)
    print(f"ready {db.transactions.subtransactions.value}", flush=True)
    sys.stdin.readline()
    try:
        recorder = Workload(db, process, seed, float(for_update)).run(int(threads), int(transactions), WATCHDOG_TIMEOUT)
    except AssertionError as error:
        print(error, file=sys.stderr, flush=True)
        os._exit(2)     # worker threads are stuck: do not wait for them
    history, unended = recorder.history()
    result: dict[str, Any] = {
        "history": [transaction.to_json() for transaction in history],
        "unended": unended,
        "errors": recorder.errors,
        "outcomes": dict(recorder.outcomes),
    }
    with open(output, "w") as file:
        json.dump(result, file)
    db.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
