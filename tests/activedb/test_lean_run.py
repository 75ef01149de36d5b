"""The lean run (txn README, "The lean run"): inline subtransactions of an exclusive tree are savepoints of a run kept
in the root, which decode into frames the moment anything else is asked of them.

Each scenario runs with ``frames`` (savepoints wherever the tree is exclusive) and with ``materialized`` (every node
registered: the reference): the lock pictures (``lock_snapshot``, taken in the tree's thread and by another thread),
every value read and the final table must be equal, and with ``frames`` the inner subtransaction must have been a
savepoint before it left the lean state and a frame (or node) after.
"""

from __future__ import annotations

import threading
import time

import pytest
import sqlalchemy as sa

import activedb
from activedb import Coupling, lowlevel
from activedb.txn import Subtransactions, run_inline
from tests.activedb.test_lazy_equivalence import _picture
from tests.conftest import APP_MIGRATIONS

WAIT = 60.0          # a bounded wait for the other thread (fails with what it saw)


class Planned(Exception):
    """A failure the scenario asked for."""


@pytest.fixture(scope="module")
def db(database_url):
    database = activedb.connect(database_url, rule_execution="inline")
    database.upgrade_app(APP_MIGRATIONS)

    @database.rule(on=database.stream("lean_bump"), coupling=Coupling.IMMEDIATE, name="lean_bump")
    def bump(tx, event):
        row = tx.read("items", event.key)
        tx.write("items", event.key, value=(row["value"] if row else 0) + 1)
        if event.payload.get("deferred"):
            tx.signal("lean_later", number=event.payload["n"])
        SEEN.append(type(tx).__name__)

    @database.rule(on=database.signalled("lean_later"), coupling=Coupling.DEFERRED, name="lean_later")
    def later(tx, event):
        tx.write("items", f"later{event.payload['number']}", value=event.payload["number"])
        SEEN.append(type(tx).__name__)

    @database.rule(on=database.stream("lean_fail"), coupling=Coupling.IMMEDIATE, name="lean_fail")
    def fail(tx, event):
        tx.write("items", event.key, value=-1)
        raise Planned(event.key)

    yield database
    database.close()


SEEN: list[str] = []


def _reset(db, rows: dict) -> None:
    with db.engine.begin() as connection:
        connection.execute(sa.text("DELETE FROM items"))
        for key, value in rows.items():
            connection.execute(sa.text("INSERT INTO items (key, value) VALUES (:key, :value)"),
                               {"key": key, "value": value})


def _items(db) -> dict:
    with db.engine.connect() as connection:
        return dict(connection.execute(sa.text("SELECT key, value FROM items ORDER BY key")).all())


def _from_another_thread(db, names: dict) -> tuple:
    """The picture and ``explain``'s transactions as another thread sees them now."""
    seen: list = []

    def look() -> None:
        explanation = db.explain()
        seen.append((_picture(db, names),
                     sorted((names.get(node.tid, "?"), node.state, node.depth) for node in explanation.nodes
                            if node.tid in names)))
    thread = threading.Thread(target=look)
    thread.start()
    thread.join(WAIT)
    assert seen, "the other thread did not take its picture"
    return seen[0]


def _wait_for_lock_wait(db, expected: int = 1) -> None:
    """Until ``expected`` lock requests wait (a bounded state wait: fails with the lock table it saw).  Counted in the
    resources' queues: the wait edges also list a parent's declared wait for its child's commit, which a tree of
    savepoints has from its start — counted as a lock wait, the other tree was released before the request it was
    to answer (one run in about thirty on a busy machine)."""
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        snapshot = db.transactions.lock_snapshot()
        if sum(len(holders.waiting) for holders in snapshot.resources.values()) >= expected:
            return
        time.sleep(0.01)
    raise AssertionError(f"no lock request waited within {WAIT} s: {db.transactions.lock_snapshot()}")


class _Quiet(activedb.Observer):
    """An observer of nodes (it makes every later inline child a lazy node, never a savepoint or a frame)."""

    def on_begin(self, transaction) -> None:
        pass


def _leave(how: str, db, inner, names: dict, seen: list, pictures: list) -> None:
    """What makes ``inner`` (a savepoint with ``frames``) leave the lean state."""
    if how == "spawn":
        inner.spawn(lambda child: child.write("items", "e", value=5)).result(WAIT)
    elif how == "wait":                                  # a nested top-level transaction: a wait of ``inner``
        with db.transaction() as nested:
            names[nested.id] = "nested"
            nested.write("items", "f", value=6)
            pictures.append(_picture(db, names))
    elif how == "lock":                                  # another tree holds the row: the request must wait
        holding, release = threading.Event(), threading.Event()

        def other() -> None:
            with db.transaction() as tree:
                names[tree.id] = "other"
                tree.write("items", "g", value=70)
                holding.set()
                assert release.wait(WAIT)

        thread = threading.Thread(target=other)
        thread.start()
        assert holding.wait(WAIT)

        def releaser() -> None:
            _wait_for_lock_wait(db)
            pictures.append(_picture(db, names))
            release.set()

        helper = threading.Thread(target=releaser)
        helper.start()
        try:
            inner.write("items", "g", value=7)           # waits for the other tree's commit
        finally:
            release.set()
            helper.join(WAIT)
            thread.join(WAIT)
    elif how == "abort":                                 # an inner savepoint aborts after its writes: no decode
        try:
            with inner.subtransaction() as deepest:
                names[deepest.id] = "deepest"
                deepest.write("items", "a", value=99)
                deepest.write("items", "h", value=8)
                seen.append(deepest.read("items", "a"))
                pictures.append(_picture(db, names))
                raise Planned("deepest")
        except Planned:
            pass
    elif how == "scan":
        seen.append(sorted(row["key"] for row in inner.scan("items")))
    elif how == "fresh read":                            # a row nobody prefetched: a round trip
        seen.append(inner.read("items", "z"))
    elif how == "observer":                              # an observer registered meanwhile: its next child decodes it
        observer = db.observe(_Quiet())
        try:
            with inner.subtransaction() as child:
                names[child.id] = "child"
                child.write("items", "i", value=9)
                pictures.append(_picture(db, names))
        finally:
            db.transactions.observers.remove(observer)
    elif how == "parent used":                           # its parent's object used inside its block
        inner.parent.write("items", "j", value=10)
    elif how == "frame field":                           # a field only its frame keeps, read: the frame goes on
        seen.append(inner._thread == threading.get_ident())
    else:
        raise AssertionError(how)


def _scenario(db, representation: Subtransactions, how: str) -> tuple:
    db.transactions.subtransactions = representation
    _reset(db, {"a": 1, "b": 2, "c": 3})
    pictures, seen, kinds, others = [], [], [], []
    try:
        with db.transaction() as tx:
            names = {tx.id: "root"}
            tx.prefetch("items", ["a", "b", "c", "d", "e", "h"])
            with tx.subtransaction() as warm:              # the tree's first write of the table: IW retained after
                names[warm.id] = "warm"
                warm.write("items", "a", value=10)
            with tx.subtransaction() as outer:
                names[outer.id] = "outer"
                outer.write("items", "b", value=20)
                with outer.subtransaction() as inner:
                    names[inner.id] = "inner"
                    seen.append(inner.read("items", "b"))
                    inner.write("items", "c", value=30)
                    inner.delete("items", "d")
                    kinds.append(type(inner).__name__)
                    pictures.append(_picture(db, names))
                    others.append(_from_another_thread(db, names))
                    kinds.append(type(inner).__name__)     # (another thread's look decodes nothing)
                    _leave(how, db, inner, names, seen, pictures)
                    kinds.append(type(inner).__name__)
                    pictures.append(_picture(db, names))
                    inner.write("items", "c", value=31)
                    seen.append(inner.read("items", "c"))
                seen.append(outer.read("items", "c"))
                seen.append(outer.subtransactions_committed)
                pictures.append(_picture(db, names))
            pictures.append(_picture(db, names))
            seen.append(tx.subtransactions_committed)
    finally:
        db.transactions.subtransactions = Subtransactions.FRAMES
    assert db.transactions.locks.statistics().transactions == 0
    return (pictures, seen, _items(db), others), kinds


LEAVING = ["spawn", "wait", "lock", "abort", "scan", "fresh read", "observer", "parent used", "frame field"]


@pytest.mark.parametrize("how", LEAVING)
def test_a_savepoint_that_leaves_the_lean_state_halfway_behaves_as_the_materialized_tree(db, how):
    """Savepoints that write, delete and read, then leave the lean state (they spawn, wait, meet a lock another
    tree holds, open a scan or a read PostgreSQL must answer, meet an observer registered meanwhile, have their
    parent's object used, have a field only a frame keeps read) leave the pictures — also another thread's, with ``explain``'s transactions — reads and
    table of the materialized tree; until then they are savepoints, which another thread's look does not decode."""
    frames, kinds = _scenario(db, Subtransactions.FRAMES, how)
    materialized, _ = _scenario(db, Subtransactions.MATERIALIZED, how)
    assert frames == materialized
    # (An inner savepoint's abort is answered on the logs: its parent stays a savepoint.)
    assert kinds == ["Savepoint", "Savepoint", "Savepoint" if how == "abort" else "Transaction"]
    pictures, seen, table, others = frames
    assert seen[0]["value"] == 20 and seen[-4]["value"] == 31 and seen[-3]["value"] == 31
    assert others[0][0] == pictures[0]                                  # another thread sees the same picture
    assert pictures[0][("row", "items", ("c",))] == ({"inner": "WRITE"}, {"root": "READ"})
    assert table["a"] == 10 and table["b"] == 20 and table["c"] == 31 and "d" not in table


def _outer_aborts(db, representation: Subtransactions) -> tuple:
    """An outer savepoint aborts after its inner one committed writes (both undone), then the next event's."""
    db.transactions.subtransactions = representation
    _reset(db, {"a": 1, "b": 2})
    seen = []
    try:
        with db.transaction() as tx:
            names = {tx.id: "root"}
            tx.prefetch("items", ["a", "b", "c"])
            tx.write("items", "b", value=2)   # (the root's own table lock: the savepoints' is retained)
            try:
                with tx.subtransaction() as outer:
                    names[outer.id] = "outer"
                    outer.write("items", "a", value=10)
                    with outer.subtransaction() as inner:
                        names[inner.id] = "inner"
                        inner.write("items", "a", value=11)
                        inner.insert("items", key="c", value=3)
                    seen.append(outer.read("items", "a"))
                    seen.append(_picture(db, names))
                    seen.append(type(outer).__name__)
                    raise Planned("outer")
            except Planned:
                pass
            seen.append(_picture(db, names))
            seen.append((tx.read("items", "a"), tx.read("items", "c")))
            with tx.subtransaction() as again:
                names[again.id] = "again"
                again.insert("items", key="c", value=30)
                seen.append(_picture(db, names))
    finally:
        db.transactions.subtransactions = Subtransactions.FRAMES
    return seen, _items(db)


def test_an_outer_savepoint_aborting_after_its_inner_one_committed_undoes_both(db):
    """Rule 4 on the logs: the entries of both leave the root's write set, their grants are undone (the root's
    record too: the next savepoint's insert of the same row is granted afresh), as in the materialized tree."""
    frames = _outer_aborts(db, Subtransactions.FRAMES)
    materialized = _outer_aborts(db, Subtransactions.MATERIALIZED)
    assert frames[0].pop(2) == "Savepoint" and materialized[0].pop(2) == "Transaction"
    assert frames == materialized
    seen, table = frames
    assert seen[0]["value"] == 11 and seen[3][0]["value"] == 1 and seen[3][1] is None
    assert table == {"a": 1, "b": 2, "c": 30}


class _FiringClock(activedb.Observer):
    """An observer of firings, as a watched ingestion registers one (``activedb run``'s rule deadline): it keeps the
    firings running and what it heard (each transaction by its depth and its order of appearance: ids differ from tree
    to tree); at every third firing's start another thread looks at the running firings' transactions as the watch's
    report does (id, root, state) and at their class (a look must decode nothing)."""

    def __init__(self) -> None:
        self.running: dict = {}
        self.heard: list = []
        self.looked: list = []
        self.classes: set = set()
        self._names: dict = {}

    def _name(self, transaction) -> tuple:
        return (transaction.id.count("."), self._names.setdefault(transaction.id, len(self._names)))

    def on_firing_start(self, transaction, firing) -> None:
        self.running[id(firing)] = transaction
        self.heard.append(("start", firing.rule.name, self._name(transaction), transaction.name))
        if len(self.heard) % 3 == 0:
            seen: list = []

            def report() -> None:
                for tx in list(self.running.values()):
                    seen.append((self._name(tx), tx.root.id == tx.id.split(".")[0], str(tx.state)))
                    self.classes.add(type(tx).__name__)
            thread = threading.Thread(target=report)
            thread.start()
            thread.join(WAIT)
            self.looked.append(sorted(seen))

    def on_firing_end(self, transaction, firing, outcome) -> None:
        self.running.pop(id(firing), None)
        self.heard.append(("end", firing.rule.name, self._name(transaction), str(outcome)))

    def on_abort(self, transaction, reason) -> None:      # (as ``connect(explain_deadlocks=True)``'s observer)
        self.heard.append(("abort", self._name(transaction), transaction.name, type(reason).__name__))


def _events(db, representation: Subtransactions, halfway=lambda: None) -> tuple:
    """The Spark sink's shape: each event in its own inline subtransaction of one top-level transaction, its rules
    inside it (an immediate rule that reads and writes, a deferred rule at that one's commit, a rule that fails);
    ``halfway`` is called before the seventh event."""
    db.transactions.subtransactions = representation
    _reset(db, {"k0": 0})
    SEEN.clear()
    locks = db.transactions.locks
    begun = locks.statistics().begun
    failed = []
    try:
        with db.transaction() as tx:
            tx.prefetch("items", ["k0", "k1", "k2"])
            tx.write("items", "k0", value=0)        # (the root's own write lock on the table: each event's is retained)
            for number in range(12):
                if number == 6:
                    halfway()
                kind = "lean_fail" if number % 5 == 4 else "lean_bump"
                try:
                    lowlevel.run_subtransaction(
                        tx, lambda sub, n: sub.emit(kind, key=f"k{n % 3}", payload={"deferred": n % 3 == 1, "n": n}),
                        number)
                except activedb.RuleFailed as error:
                    failed.append(error.rule)
            committed = tx.subtransactions_committed
            fired = db.rules.firings_in(tx)
    finally:
        db.transactions.subtransactions = Subtransactions.FRAMES
    return (_items(db), failed, committed, fired), locks.statistics().begun - begun, list(SEEN)


def test_the_sinks_shape_runs_as_savepoints_and_leaves_the_materialized_result(db):
    """Events, their immediate and deferred firings and a failing rule run as savepoints only: nothing begins in
    the lock manager but the top-level transaction, every rule's transaction is a savepoint, and the table,
    failures, counts and firings are the materialized tree's."""
    frames, begun, seen = _events(db, Subtransactions.FRAMES)
    materialized, begun_materialized, _ = _events(db, Subtransactions.MATERIALIZED)
    assert frames == materialized
    assert begun == 1 and begun_materialized > 12
    assert seen and set(seen) == {"Savepoint"}
    table, failed, committed, fired = frames
    assert failed == ["lean_fail", "lean_fail"]
    assert table == {"k0": 3, "k1": 3, "k2": 4, "later1": 1, "later7": 7, "later10": 10}


class _HearsFrames(lowlevel.TransactionExtension):
    """An extension that hears of every begin, frames' too (``frame_hooks`` true)."""

    def __init__(self) -> None:
        self.begun: list = []

    def on_begin(self, transaction) -> None:
        self.begun.append((transaction.name, transaction.depth))


def test_an_extension_hearing_frames_registered_halfway_ends_the_lean_run_from_there(db):
    """Whether an inline child may be a savepoint is decided as it opens: once an extension that hears of frames is
    registered halfway through the sink's shape, the later events and firings are frames it hears of as it hears of
    the materialized tree's nodes, the earlier ones stayed savepoints, and the table, failures, counts and firings
    are the materialized tree's."""
    heard, results = {}, {}
    for representation in (Subtransactions.FRAMES, Subtransactions.MATERIALIZED):
        extension = heard[representation] = _HearsFrames()
        try:
            results[representation] = _events(db, representation, lambda: db.transactions.extensions.add(extension))
        finally:
            db.transactions.extensions.remove(extension)
    (frames, _, seen), (materialized, _, _) = results[Subtransactions.FRAMES], results[Subtransactions.MATERIALIZED]
    assert frames == materialized
    assert heard[Subtransactions.FRAMES].begun == heard[Subtransactions.MATERIALIZED].begun
    assert len(heard[Subtransactions.FRAMES].begun) >= 6
    assert seen[0] == "Savepoint" and seen[-1] == "Transaction"


def test_an_observer_of_firings_and_aborts_keeps_the_sinks_shape_on_savepoints(db):
    """An observer of firings (a watched ingestion's: ``activedb run``'s rule deadline) and of aborts
    (``explain_deadlocks``'s) does not stop the lean run: with it registered the sink's shape still runs as savepoints
    only, the observer hears the same firings and aborts of the same transactions (ids, names, outcomes, reasons) as in
    the materialized tree, another thread's look at the running firings' transactions decodes nothing, and the table,
    failures, counts and firings are the materialized tree's."""
    clocks = {}
    results = {}
    for representation in (Subtransactions.FRAMES, Subtransactions.MATERIALIZED):
        clock = clocks[representation] = _FiringClock()
        observer = db.observe(clock)
        try:
            results[representation] = _events(db, representation)
        finally:
            db.transactions.observers.remove(observer)
    (frames, begun, seen), (materialized, _, _) = results[Subtransactions.FRAMES], results[Subtransactions.MATERIALIZED]
    assert frames == materialized
    assert begun == 1 and seen and set(seen) == {"Savepoint"}
    lean, reference = clocks[Subtransactions.FRAMES], clocks[Subtransactions.MATERIALIZED]
    assert lean.heard == reference.heard and lean.looked == reference.looked
    outcomes = {(rule, outcome) for what, rule, _, outcome in lean.heard if what == "end"}
    assert outcomes == {("lean_bump", "executed"), ("lean_later", "executed"), ("lean_fail", "failed")}
    assert [heard for heard in lean.heard if heard[0] == "abort"], "no abort heard"
    assert lean.looked and all(lean.looked)       # (a look at a firing's start sees at least that firing)
    assert lean.classes == {"Savepoint"} and reference.classes == {"Transaction"}


def test_a_savepoint_kept_after_it_ended_refuses_work_and_tells_its_outcome(db):
    """A savepoint user code keeps after its end answers ``state``, ``parent`` and ``id`` as its frame would, and
    refuses work as a committed frame does; a call that needs a frame (a read: a savepoint answers one from its
    root's records only while it runs) decodes it alone, into a frame of the same tree."""
    kept = []
    with db.transaction() as tx:
        run_inline(tx, lambda child, _: kept.append(child), None, "kept")
        assert type(kept[0]).__name__ == "Savepoint"
        assert kept[0].state is activedb.TxnState.COMMITTED and kept[0].parent is tx
        assert kept[0].id.startswith(f"{tx.id}.")
        with pytest.raises(activedb.TransactionError, match="committed"):
            kept[0].write("items", "a", value=1)
        assert type(kept[0]).__name__ == "Savepoint"
        with pytest.raises(activedb.TransactionError, match="committed"):
            kept[0].read("items", "a")
        assert type(kept[0]).__name__ == "Transaction" and kept[0].root is tx
        assert kept[0].state is activedb.TxnState.COMMITTED and kept[0].parent is tx


def test_events_raised_after_the_tree_was_aborted_halfway_are_refused(db):
    """``emit`` and ``signal`` call ``_check_active`` only when their transaction is doomed or not active: a run of
    events whose tree is aborted halfway (the root's object used inside a savepoint's block) refuses the savepoint's
    next events as aborted and the root's as ended; nothing of the run reaches the table."""
    _reset(db, {})
    with pytest.raises(Planned, match="done"):
        with db.transaction() as tx:
            tx.prefetch("items", ["a", "b", "c", "d"])
            tx.emit("lean_bump", key="a")
            with pytest.raises(activedb.TransactionAborted, match="commit in transaction .*aborted"):
                with tx.subtransaction() as savepoint:
                    savepoint.emit("lean_bump", key="b")
                    assert type(savepoint).__name__ == "Savepoint"
                    savepoint.signal("lean_later", number=1)
                    tx.abort(Planned("halfway"))
                    for raise_event in (lambda: savepoint.emit("lean_bump", key="c"),
                                        lambda: savepoint.signal("lean_later", number=2)):
                        with pytest.raises(activedb.TransactionAborted, match="(emit|signal) in transaction .*aborted"):
                            raise_event()
            with pytest.raises(activedb.TransactionAborted, match="emit in transaction .*aborted"):
                tx.emit("lean_bump", key="d")
            raise Planned("done")
    assert _items(db) == {}
