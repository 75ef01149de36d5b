"""Savepoints, frames, lazy and materialized inline subtransactions are the same thing to a rule program.

Random rule programs (immediate and deferred rules whose actions read, write, emit further events,
fail, and open inline or spawned subtransactions whose failure they catch) run once with frames (the
default: savepoints of the lean run wherever the tree is exclusive), once with frames while an observer hears
of every node (so inline children are lazy nodes, neither savepoints nor frames), and once with every node
registered in the lock manager from its start (the reference); the final table, every value read (by which rule, in which order), the
firing counts and the outcome of the top-level transaction must be equal.  Spawning and a caught failure
of a child exercise the mixed trees: a frame or lazy node that materializes (it spawns, or opens an inline
child of its own) and one that aborts while it is a frame or lazy.

``ACTIVEDB_LAZY_EXAMPLES`` (default 60) sets how many programs are tried.
"""

from __future__ import annotations

import os
import threading

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from activedb import lowlevel
import activedb
from activedb import Coupling, testing
from activedb.txn import Subtransactions, run_inline
from tests.conftest import APP_MIGRATIONS

KEYS = ("a", "b", "c")
RULES = 4                     # rule i reacts to stream event "lazy{i}"; rule 3 is deferred
EXAMPLES = int(os.environ.get("ACTIVEDB_LAZY_EXAMPLES", "60"))


class Program:
    """What the rules do in the current example (the rules are declared once and look it up)."""

    def __init__(self) -> None:
        self.actions: list[list] = [[] for _ in range(RULES)]
        self.reads: list[tuple] = []
        self.mutex = threading.Lock()


PROGRAM = Program()


class Planned(Exception):
    """A failure the program asked for."""


def _clear_items(db) -> None:
    with db.engine.begin() as connection:
        connection.execute(sa.text("DELETE FROM items"))


def _items(db) -> dict:
    """The table ``items`` as ``{key: value}``."""
    with db.engine.connect() as connection:
        return dict(connection.execute(sa.text("SELECT key, value FROM items ORDER BY key")).all())


def run_ops(tx, ops: list, who: str) -> None:
    for op in ops:
        kind = op[0]
        if kind == "read":
            row = tx.read("items", op[1])
            with PROGRAM.mutex:
                PROGRAM.reads.append((who, op[1], None if row is None else row["value"]))
        elif kind == "write":
            row = tx.read("items", op[1])
            tx.write("items", op[1], value=(0 if row is None else row["value"] or 0) + op[2])
        elif kind == "emit":
            tx.emit(f"lazy{op[1]}")
        elif kind == "fail":
            raise Planned(who)
        elif kind == "inline":
            try:
                with tx.subtransaction() as child:
                    run_ops(child, op[1], who + "/inline")
            except Exception:
                pass                                   # the child aborted; its parent goes on
        elif kind == "spawn":
            try:
                tx.spawn(run_ops, op[1], who + "/spawn").result(30)
            except Exception:
                pass


def _rule_action(number: int):
    def action(tx, event) -> None:
        run_ops(tx, PROGRAM.actions[number], f"rule{number}")
    return action


@pytest.fixture(scope="module")
def db(database_url):
    database = activedb.connect(database_url, rule_execution="inline")
    database.upgrade_app(APP_MIGRATIONS)
    for number in range(RULES):
        coupling = Coupling.DEFERRED if number == RULES - 1 else Coupling.IMMEDIATE
        database.rule(on=database.stream(f"lazy{number}"), coupling=coupling,
                      name=f"lazy_equivalence_{number}")(_rule_action(number))
    yield database
    database.close()


def _ops(depth: int, rule: int | None):
    """Operations of a rule action (``rule``: its number; it emits only later rules: no endless cascade)
    or of a transaction body (``rule`` None)."""
    first = 0 if rule is None else rule + 1
    simple = [st.tuples(st.just("read"), st.sampled_from(KEYS)),
              st.tuples(st.just("write"), st.sampled_from(KEYS), st.integers(1, 9)),
              st.tuples(st.just("fail"))]
    if first < RULES:
        simple.append(st.tuples(st.just("emit"), st.integers(first, RULES - 1)))
    if depth == 0:
        return st.lists(st.one_of(simple), max_size=4)
    nested = _ops(depth - 1, rule)
    return st.lists(st.one_of(*simple, st.tuples(st.just("inline"), nested), st.tuples(st.just("spawn"), nested)),
                    max_size=4)


PROGRAMS = st.tuples(
    st.tuples(*[_ops(1, number) for number in range(RULES)]),
    _ops(2, None),
)


REPRESENTATIONS = [representation.value for representation in Subtransactions]


@pytest.fixture
def use(db):
    """``use(representation)`` makes ``db``'s inline subtransactions that representation; frames (the default)
    again after the test."""
    def use(representation) -> None:
        db.transactions.subtransactions = Subtransactions(representation)
    yield use
    db.transactions.subtransactions = Subtransactions.FRAMES


class _NodeWatcher(activedb.Observer):
    """Hears of every node's begin: with it registered an inline child is a lazy node, never a frame or a
    savepoint (txn README, "Frames": a frame is made only when no observer listens to node events)."""

    def on_begin(self, transaction) -> None:
        pass


def _run(db, program, representation: Subtransactions, *, watched: bool = False) -> tuple:
    """Run ``program``; ``watched``: with a :class:`_NodeWatcher` registered meanwhile."""
    if watched:
        watcher = db.observe(_NodeWatcher())
        try:
            return _run(db, program, representation)
        finally:
            db.transactions.observers.remove(watcher)
    actions, body = program
    db.transactions.subtransactions = representation
    with db.engine.begin() as connection:
        connection.execute(sa.text("DELETE FROM items"))
        connection.execute(sa.text("INSERT INTO items (key, value) VALUES ('a', 1), ('b', 2)"))
    PROGRAM.actions = list(actions)
    PROGRAM.reads = []
    before = {name: counter.fired for name, counter in db.rules.statistics().per_rule.items()}
    outcome = "committed"
    try:
        with db.transaction() as tx:
            run_ops(tx, body, "top")
    except Exception as error:
        outcome = type(error).__name__
    after = {name: counter.fired for name, counter in db.rules.statistics().per_rule.items()}
    fired = {name: count - before.get(name, 0) for name, count in after.items() if count != before.get(name, 0)}
    table = _items(db)
    return outcome, table, list(PROGRAM.reads), fired


@pytest.mark.timeout(900)
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None,
          derandomize=os.environ.get("ACTIVEDB_TEST_SEED") in (None, ""))
@given(program=PROGRAMS)
def test_rule_programs_behave_alike_with_frames_lazy_and_materialized_subtransactions(db, program):
    try:
        frames = _run(db, program, Subtransactions.FRAMES)
        lazy = _run(db, program, Subtransactions.FRAMES, watched=True)
        materialized = _run(db, program, Subtransactions.MATERIALIZED)
    finally:
        db.transactions.subtransactions = Subtransactions.FRAMES
    assert frames == materialized
    assert lazy == materialized
    assert db.transactions.locks.statistics().transactions == 0     # nothing left in the lock manager


def _picture(db, names: dict) -> dict:
    """The lock table (``lock_snapshot``: lazy nodes as themselves) with ids replaced by ``names``."""
    snapshot = db.transactions.lock_snapshot()
    return {resource: ({names.get(tid, "?"): mode.name for tid, mode in holders.held.items()},
                       {names.get(tid, "?"): mode.name for tid, mode in holders.retained.items()})
            for resource, holders in snapshot.resources.items() if holders}


@pytest.mark.parametrize("representation", REPRESENTATIONS)
def test_a_parent_locking_while_its_child_runs_keeps_its_own_lock_when_the_child_aborts(db, use, representation):
    """The parent's object used inside its inline child's block: the parent's own lock is its own (the
    lazy child materializes first and takes its locks with it), so the child's abort releases only the
    child's.  Same pictures in both representations."""
    use(representation)
    pictures = []
    with db.transaction() as tx:
        names = {tx.id: "parent"}
        try:
            with tx.subtransaction() as child:
                names[child.id] = "child"
                child.write("items", "a", value=5)
                tx.read("items", "b")
                pictures.append(_picture(db, names))
                raise Planned("child")
        except Planned:
            pass
        pictures.append(_picture(db, names))
    inside, after = pictures
    assert inside[("row", "items", ("a",))] == ({"child": "WRITE"}, {})
    assert inside[("row", "items", ("b",))] == ({"parent": "READ"}, {})
    assert ("row", "items", ("a",)) not in after                       # Rule 4: the child's lock is gone
    assert after[("row", "items", ("b",))] == ({"parent": "READ"}, {})  # the parent's stays


@pytest.mark.parametrize("representation", REPRESENTATIONS)
def test_an_outer_child_aborted_inside_its_inner_childs_block_undoes_both(db, use, representation):
    """``outer.abort()`` inside its inline child's block (the parent's object used in its child's block) undoes
    both children: their writes and their locks go, in every representation, and the inner block's end raises
    TransactionAborted (it was doomed).  Before, with frames, the outer frame's abort took back only its own writes
    and grants; the inner one's, which lie on top of them, were taken back at its end to what they were after the
    outer one's — the aborted outer child's write of ``a`` came back and was committed, and its read lock on ``b``
    stayed retained by the root."""
    use(representation)
    _clear_items(db)
    with db.transaction() as tx:
        names = {tx.id: "root"}
        tx.write("items", "a", value=0)
        with pytest.raises(activedb.TransactionAborted):
            with tx.subtransaction() as outer:
                names[outer.id] = "outer"
                outer.write("items", "a", value=1)
                outer.read("items", "b")
                with outer.subtransaction() as inner:
                    names[inner.id] = "inner"
                    inner.write("items", "a", value=2)
                    inner.write("items", "b", value=2)
                    outer.abort()
        picture = _picture(db, names)
        seen = (tx.read("items", "a")["value"], tx.read("items", "b"))
    assert ("row", "items", ("b",)) not in picture
    assert picture[("row", "items", ("a",))] == ({}, {"root": "WRITE"})
    assert seen == (0, None)
    assert _items(db) == {"a": 0}


@pytest.mark.parametrize("representation", REPRESENTATIONS)
def test_a_childs_intention_lock_answered_from_its_parents_retain_is_its_own_in_every_picture(db, use, representation):
    """A second inline child writes a row of the table whose intention lock its parent retains from the
    first one: the lazy child asks the lock manager for the row only, yet the pictures show it holding the
    intention lock, before and after it materializes (it spawns) and after it aborts — as the registered
    child does.  Likewise its read and write of the first one's row, answered from the parent's record of its
    retains without the lock manager (txn README, "Requests answered from the records")."""
    use(representation)
    pictures = []
    table = ("table", "items")
    with db.transaction() as tx:
        names = {tx.id: "parent"}
        with tx.subtransaction() as first:
            first.write("items", "a", value=1)
        try:
            with tx.subtransaction() as second:
                names[second.id] = "second"
                second.write("items", "b", value=2)
                second.write("items", "a", value=second.read("items", "a")["value"] + 1)
                pictures.append(_picture(db, names))
                second.spawn(lambda grandchild: None).result()      # materializes a lazy child
                pictures.append(_picture(db, names))
                raise Planned("second")
        except Planned:
            pass
        pictures.append(_picture(db, names))
    running, materialized, after = pictures
    assert running[table] == ({"second": "IW"}, {"parent": "IW"})
    assert running[("row", "items", ("b",))] == ({"second": "WRITE"}, {})
    # Spawning, the child's holds became retained (in its own name once it materialized).
    assert materialized[table] == ({}, {"parent": "IW", "second": "IW"})
    assert materialized[("row", "items", ("b",))] == ({}, {"second": "WRITE"})
    assert after[table] == ({}, {"parent": "IW"})                  # Rule 4: the child's gone, the retain stays
    assert ("row", "items", ("b",)) not in after
    row = ("row", "items", ("a",))
    assert running[row] == ({"second": "WRITE"}, {"parent": "WRITE"})
    assert materialized[row] == ({}, {"parent": "WRITE", "second": "WRITE"})
    assert after[row] == ({}, {"parent": "WRITE"})


@pytest.mark.parametrize("materialize", [False, True], ids=["stays-lazy", "materializes"])
@pytest.mark.parametrize("representation", REPRESENTATIONS)
def test_a_child_upgrading_a_row_its_parent_retains_leaves_the_parents_mode_when_it_aborts(db, use, representation,
                                                                                          materialize):
    """The first child reads a row (its parent then retains READ); the second writes it (an upgrade of the
    parent's retained entry when the second is lazy) and aborts, maybe after materializing (it spawns): the
    pictures show the second holding WRITE over the parent's READ, and after its abort the parent's READ
    alone — as with registered children."""
    use(representation)
    pictures = []
    row = ("row", "items", ("a",))
    with db.transaction() as tx:
        names = {tx.id: "parent"}
        with tx.subtransaction() as first:
            first.read("items", "a")
        try:
            with tx.subtransaction() as second:
                names[second.id] = "second"
                second.write("items", "a", value=3)
                pictures.append(_picture(db, names))
                if materialize:
                    second.spawn(lambda grandchild: None).result()
                    pictures.append(_picture(db, names))
                raise Planned("second")
        except Planned:
            pass
        pictures.append(_picture(db, names))
        seen = tx.read("items", "a")
    assert pictures[0][row] == ({"second": "WRITE"}, {"parent": "READ"})
    if materialize:
        assert pictures[1][row] == ({}, {"parent": "READ", "second": "WRITE"})
    assert pictures[-1][row] == ({}, {"parent": "READ"})
    assert seen is None or seen.get("value") != 3


@pytest.mark.parametrize("materialize", [False, True], ids=["stays-lazy", "materializes"])
@pytest.mark.parametrize("representation", REPRESENTATIONS)
def test_a_childs_upgrade_that_aborted_does_not_answer_a_later_childs_request(db, use, representation, materialize):
    """What a parent retains is answered from its record only as far as its committed children and its own
    holds left it: the first child reads row a (the parent retains READ); the second writes a (the parent's
    entry upgraded to WRITE in the lock manager when the child is lazy) and aborts, which leaves READ; another
    tree then reads a.  A third child's write of a must wait for that tree, in every representation — had the
    aborted upgrade been remembered, it would have been granted at once beside the other tree's READ.  Also
    when the second became a node (it spawns) before it aborted: its grant went to it from the parent."""
    use(representation)
    locks = db.transactions.locks
    other_read, other_may_commit = threading.Event(), threading.Event()
    waited: list[bool] = []

    def other() -> None:
        try:
            with db.transaction() as other_tx:
                other_tx.read("items", "a")
                other_read.set()
                assert other_may_commit.wait(60)
        finally:
            other_read.set()

    def release() -> None:
        try:
            testing.wait_until(lambda: locks.statistics().waiting == 1, 60, "the third child's write to wait")
            waited.append(True)
        finally:
            other_may_commit.set()

    with testing.Watchdog(120, locks):
        with db.transaction() as tx:
            with tx.subtransaction() as first:
                first.read("items", "a")
            try:
                with tx.subtransaction() as second:
                    second.write("items", "a", value=3)
                    if materialize:
                        second.spawn(lambda grandchild: None).result()
                    raise Planned("second")
            except Planned:
                pass
            reader = threading.Thread(target=other)
            reader.start()
            assert other_read.wait(60)
            releaser = threading.Thread(target=release)
            releaser.start()
            with tx.subtransaction() as third:
                third.write("items", "a", value=4)          # waits until the other tree has committed
            releaser.join(90)
            reader.join(90)
    assert waited == [True]
    assert _items(db)["a"] == 4


def _frames_in_frames(db, representation: Subtransactions) -> tuple:
    """An inline child opening inline children of its own (an event's subtransaction whose rule fires inside
    it, README "Frames in frames"): pictures while the inner one runs, after it committed, after the outer
    one locked again, after a second inner one aborted and after the outer one materialized (it spawns)."""
    db.transactions.subtransactions = representation
    _clear_items(db)
    pictures = []
    try:
        with db.transaction() as tx:
            names = {tx.id: "root"}
            with tx.subtransaction() as outer:
                names[outer.id] = "outer"
                outer.write("items", "a", value=1)
                with outer.subtransaction() as inner:
                    names[inner.id] = "inner"
                    inner.read("items", "a")
                    inner.write("items", "b", value=inner.read("items", "a")["value"] + 1)
                    pictures.append(_picture(db, names))
                pictures.append(_picture(db, names))
                outer.write("items", "c", value=3)
                pictures.append(_picture(db, names))
                try:
                    with outer.subtransaction() as second:
                        names[second.id] = "second"
                        second.write("items", "a", value=9)
                        second.write("items", "d", value=4)
                        pictures.append(_picture(db, names))
                        raise Planned("second")
                except Planned:
                    pass
                pictures.append(_picture(db, names))
                seen = (outer.read("items", "a"), outer.read("items", "b"), outer.read("items", "d"))
                with outer.subtransaction() as third:
                    names[third.id] = "third"
                    third.write("items", "g", value=7)
                    outer.write("items", "f", value=6)    # the parent's object in its child's block: both become nodes
                    pictures.append(_picture(db, names))
                outer.spawn(lambda grandchild: grandchild.write("items", "e", value=5)).result()
                pictures.append(_picture(db, names))
    finally:
        db.transactions.subtransactions = Subtransactions.FRAMES
    table = _items(db)
    return pictures, seen, table


def test_frames_in_frames_leave_the_pictures_reads_and_table_of_registered_children(db):
    """With frames, an inline child's inline child is a frame too, its grants in the name of the nearest
    ancestor that is not lazy (README, "Frames in frames"); every picture, read and the table are those of
    the materialized tree."""
    results = {representation: _frames_in_frames(db, representation) for representation in Subtransactions}
    assert results[Subtransactions.FRAMES] == results[Subtransactions.MATERIALIZED]
    pictures, seen, table = results[Subtransactions.FRAMES]
    assert [row and row["value"] for row in seen] == [1, 2, None]      # the second child's writes undone
    assert table == {"a": 1, "b": 2, "c": 3, "e": 5, "f": 6, "g": 7}


def test_an_events_subtransaction_with_its_rule_inside_begins_nothing_in_the_lock_manager(db, use):
    """The spark sink's shape: every event in its own inline subtransaction, an immediate rule firing inside
    it.  With frames both are frames (no transaction of the lock manager per event); the table is the one
    the materialized run leaves."""
    locks = db.transactions.locks
    tables = {}
    for representation in (Subtransactions.FRAMES.value, Subtransactions.MATERIALIZED.value):
        use(representation)
        PROGRAM.actions[0] = [("write", "a", 1), ("write", "b", 2)]
        try:
            _clear_items(db)
            begun = locks.statistics().begun
            with db.transaction() as tx:
                for _ in range(5):
                    lowlevel.run_subtransaction(tx, lambda event_tx, _: event_tx.emit("lazy0"), None)
            if representation == Subtransactions.FRAMES.value:
                assert locks.statistics().begun - begun == 1        # the top-level transaction only
            else:
                assert locks.statistics().begun - begun == 1 + 5 * 2
        finally:
            PROGRAM.actions[0] = []
        tables[representation] = _items(db)
    assert tables[Subtransactions.FRAMES.value] == tables[Subtransactions.MATERIALIZED.value] == {"a": 5, "b": 10}


def _named_write(names: dict, node, name: str, key: str, value: int) -> None:
    names[node.id] = name
    node.write("items", key, value=value)


def _mixed_tree(db, representation: Subtransactions) -> tuple:
    """Inline children that stay frames, abort as frames, and become nodes (an inline child of their own, a
    spawned child, a nested top-level transaction: a wait): the lock pictures, every value read and the final
    table."""
    db.transactions.subtransactions = representation
    _clear_items(db)
    pictures, seen = [], []
    try:
        with db.transaction() as tx:
            names = {tx.id: "parent"}
            tx.write("items", "a", value=1)
            with tx.subtransaction() as first:                  # a frame throughout
                names[first.id] = "first"
                seen.append(first.read("items", "a"))          # its ancestor's write
                first.write("items", "b", value=2)
                pictures.append(_picture(db, names))
            try:
                with tx.subtransaction() as second:             # aborts while a frame
                    names[second.id] = "second"
                    second.write("items", "a", value=99)
                    second.write("items", "c", value=3)
                    seen.append(second.read("items", "a"))
                    pictures.append(_picture(db, names))
                    raise Planned("second")
            except Planned:
                pass
            pictures.append(_picture(db, names))
            seen.append((tx.read("items", "a"), tx.read("items", "c")))   # the parent is intact
            with tx.subtransaction() as third:                  # becomes a node: a child of its own
                _named_write(names, third, "third", "c", 4)
                with third.subtransaction() as grandchild:
                    _named_write(names, grandchild, "grandchild", "a", 5)
                    pictures.append(_picture(db, names))
                third.spawn(lambda spawned: spawned.write("items", "b", value=6)).result(30)
                pictures.append(_picture(db, names))
            with tx.subtransaction() as fourth:                 # becomes a node: it waits (a nested tree)
                _named_write(names, fourth, "fourth", "b", 7)
                with db.transaction() as nested:
                    _named_write(names, nested, "nested", "d", 8)
                    pictures.append(_picture(db, names))
                seen.append(fourth.read("items", "b"))
            pictures.append(_picture(db, names))
            seen.append(db.rules.firings_in(tx))
    finally:
        db.transactions.subtransactions = Subtransactions.FRAMES
    table = _items(db)
    return pictures, seen, table


def test_a_mixed_tree_of_frames_behaves_as_the_materialized_tree(db):
    """Frames that stay frames, abort, or become nodes (they open an inline child, spawn, or wait) leave
    the same lock pictures, reads and table as lazy and as registered nodes."""
    results = {representation: _mixed_tree(db, representation) for representation in Subtransactions}
    assert results[Subtransactions.FRAMES] == results[Subtransactions.MATERIALIZED]
    pictures, seen, table = results[Subtransactions.FRAMES]
    assert seen[0]["value"] == 1 and seen[1]["value"] == 99
    assert seen[2][0]["value"] == 1 and seen[2][1] is None          # the aborted frame left nothing behind
    assert pictures[1][("row", "items", ("c",))] == ({"second": "WRITE"}, {})
    assert ("row", "items", ("c",)) not in pictures[2]                # Rule 4 for the frame's own lock
    assert pictures[2][("row", "items", ("a",))] == ({}, {"parent": "WRITE"})   # the parent's retain stays
    assert table == {"a": 5, "b": 7, "c": 4, "d": 8}
    assert db.transactions.locks.statistics().transactions == 0


def test_an_inline_child_is_a_frame_until_it_needs_a_node(db, use):
    """With frames (the default) an inline child of a node without other children is a frame, not among
    its parent's registered children, until it spawns; with ``materialized`` it never is one."""
    for representation, expected in ((Subtransactions.FRAMES, True), (Subtransactions.MATERIALIZED, False)):
        use(representation)
        with db.transaction() as tx:
            with tx.subtransaction() as child:
                child.write("items", "a", value=1)
                assert child._frame is expected
                assert tx.children == [child]
                child.spawn(lambda spawned: None).result(30)
                assert child._frame is False
                assert tx.children == [child]
            assert tx.children == []


def _overwrites(db, representation: Subtransactions) -> tuple:
    """Children overwriting their ancestors' writes of one row: one aborts while it is a frame, a chain of
    three nested children whose middle one aborts after its child committed, and a frame that writes, then
    falls back to a node (it opens a child) and writes again: every value read and the final table."""
    db.transactions.subtransactions = representation
    _clear_items(db)
    seen = []
    try:
        with db.transaction() as tx:
            tx.write("items", "a", value=1)
            try:
                with tx.subtransaction() as child:              # overwrites its parent's write, then aborts
                    child.write("items", "a", value=2)
                    child.insert("items", key="n", value=9)
                    seen.append(child.read("items", "a"))
                    raise Planned("child")
            except Planned:
                pass
            seen.append((tx.read("items", "a"), tx.read("items", "n")))
            with tx.subtransaction() as first:
                first.write("items", "a", value=3)
                try:
                    with first.subtransaction() as middle:
                        middle.write("items", "a", value=4)
                        with middle.subtransaction() as inner:
                            inner.write("items", "a", value=5)
                        seen.append(middle.read("items", "a"))
                        raise Planned("middle")
                except Planned:
                    pass
                seen.append(first.read("items", "a"))
            seen.append(tx.read("items", "a"))
            with tx.subtransaction() as late:                   # writes, falls back to a node, writes again
                late.write("items", "b", value=6)
                late.write("items", "a", value=7)
                with late.subtransaction() as grandchild:
                    seen.append(grandchild.read("items", "b"))
                    grandchild.write("items", "b", value=8)
                late.write("items", "a", value=10)
                seen.append((late.read("items", "a"), late.read("items", "b")))
            seen.append((tx.read("items", "a"), tx.read("items", "b")))
    finally:
        db.transactions.subtransactions = Subtransactions.FRAMES
    table = _items(db)
    return seen, table


def test_overwrites_of_an_ancestors_write_undo_and_fall_back_alike_in_every_representation(db):
    """A child's write over its parent's, discarded by its abort (also in the middle of a nested chain) or
    kept through its fallback to a node, leaves the same reads and table in every representation."""
    results = {representation: _overwrites(db, representation) for representation in Subtransactions}
    assert results[Subtransactions.FRAMES] == results[Subtransactions.MATERIALIZED]
    seen, table = results[Subtransactions.FRAMES]
    values = [row["value"] if isinstance(row, dict) else tuple(item and item["value"] for item in row)
              for row in seen]
    assert values == [2, (1, None), 5, 3, 3, 6, (10, 8), (10, 8)]
    assert table == {"a": 10, "b": 8}
    assert db.transactions.locks.statistics().transactions == 0


class _EndHooks(activedb.TransactionExtension):
    """Records, per rule transaction, which of the begin/commit/end hooks it got and whether it was a frame
    at its ``before_commit`` (an extension with the default ``frame_hooks``: every node, frames included)."""

    def __init__(self) -> None:
        self.seen: list[tuple] = []

    def on_begin(self, transaction) -> None:
        if transaction.name:
            self.seen.append(("begin", transaction.name))

    def before_commit(self, transaction) -> None:
        if transaction.name:
            self.seen.append(("before_commit", transaction.name, transaction._frame))

    def after_end(self, transaction, committed: bool) -> None:
        if transaction.name:
            self.seen.append(("after_end", transaction.name, committed))


def test_a_frame_that_queues_a_deferred_firing_stays_a_frame_and_runs_it_at_its_commit(db):
    """An immediate rule's frame that raises a deferred rule's event stays a frame: the rule manager, which
    skips frames' hooks, asks for this one's end hooks (``want_end_hooks``) and its ``before_commit`` runs the
    deferred queue — the deferred rule runs at that frame's commit, as a frame in the frame, before the
    emitting transaction goes on, alike in every representation, and no lock-manager transaction is begun
    but the top-level one; an extension with the default ``frame_hooks`` hears of frames as of any node."""
    actions = ([("write", "a", 5), ("emit", 3), ("read", "b")], [], [], [("read", "a"), ("write", "b", 10)])
    program = (actions, [("emit", 0), ("read", "b")])
    hooks, begun = {}, {}
    locks = db.transactions.locks
    try:
        for representation in Subtransactions:
            extension = db.transactions.extensions.add(_EndHooks())
            try:
                before = locks.statistics().begun
                hooks[representation] = (_run(db, program, representation), extension.seen)
                begun[representation] = locks.statistics().begun - before
            finally:
                db.transactions.extensions.remove(extension)
    finally:
        db.transactions.subtransactions = Subtransactions.FRAMES
    (outcome, table, reads, fired), seen = hooks[Subtransactions.FRAMES]
    assert (outcome, table) == ("committed", {"a": 6, "b": 12})
    assert reads == [("rule0", "b", 2), ("rule3", "a", 6), ("top", "b", 12)]
    assert fired == {"lazy_equivalence_0": 1, "lazy_equivalence_3": 1}
    assert hooks[Subtransactions.MATERIALIZED][0] == hooks[Subtransactions.FRAMES][0]
    rule0, rule3 = "rule:lazy_equivalence_0", "rule:lazy_equivalence_3"
    # (The rule manager's before_commit, which runs rule 3, comes before this extension's: added first.)
    assert seen == [("begin", rule0), ("begin", rule3), ("before_commit", rule3, True), ("after_end", rule3, True),
                    ("before_commit", rule0, True), ("after_end", rule0, True)]
    assert [entry[:2] for entry in hooks[Subtransactions.MATERIALIZED][1]] == [entry[:2] for entry in seen]
    # The top-level transaction only; registered nodes: it, rule 0 and rule 3.
    assert (begun[Subtransactions.FRAMES], begun[Subtransactions.MATERIALIZED]) == (1, 3)
    assert db.transactions.locks.statistics().transactions == 0


def test_a_frames_deferred_rule_that_fails_aborts_the_frame_alone_alike_in_every_representation(db):
    """The deferred rule a frame queued raises at the frame's commit: the frame aborts with what it wrote (its
    undo marks), its emitter catches the failure and goes on with its own writes intact — alike in every
    representation (the emitter here is an inline child, which catches it)."""
    actions = ([("write", "a", 5), ("emit", 3)], [], [], [("write", "b", 10), ("fail",)])
    body = [("write", "b", 1), ("inline", [("emit", 0)]), ("read", "a"), ("read", "b")]
    results = {}
    try:
        for representation in Subtransactions:
            results[representation] = _run(db, (actions, body), representation)
    finally:
        db.transactions.subtransactions = Subtransactions.FRAMES
    assert results[Subtransactions.FRAMES] == results[Subtransactions.MATERIALIZED]
    outcome, table, reads, fired = results[Subtransactions.FRAMES]
    assert (outcome, table) == ("committed", {"a": 1, "b": 3})
    assert reads == [("top", "a", 1), ("top", "b", 3)]
    assert db.transactions.locks.statistics().transactions == 0


def test_a_frames_deferred_group_on_threads_makes_it_a_node_alike_in_every_representation(database_url):
    """With rules on threads, the deferred cycle a frame runs at its commit is a group of spawned children
    when two deferred rules of one priority fire: the spawn makes the frame (and its chain) a node during its
    own ``before_commit``, and its commit goes on as a node's — table and reads as in the other
    representations, nothing left in the lock manager."""
    database = activedb.connect(database_url, rule_execution="threads")
    try:
        database.upgrade_app(APP_MIGRATIONS)
        seen: list[tuple] = []
        mutex = threading.Lock()

        def bump(tx, key: str, amount: int) -> None:
            row = tx.read("items", key)
            tx.write("items", key, value=(0 if row is None else row["value"]) + amount)

        @database.rule(on=database.stream("frame_threads_0"), name="frame_threads_emitter")
        def emitter(tx, event):
            bump(tx, "a", 5)
            tx.emit("frame_threads_1")

        for key, amount in (("b", 10), ("c", 20)):
            @database.rule(on=database.stream("frame_threads_1"), coupling=Coupling.DEFERRED,
                           name=f"frame_threads_deferred_{key}")
            def deferred(tx, event, key=key, amount=amount):
                row = tx.read("items", "a")
                with mutex:
                    seen.append((key, row["value"]))
                bump(tx, key, amount)

        results = {}
        for representation in Subtransactions:
            database.transactions.subtransactions = representation
            seen.clear()
            with database.engine.begin() as connection:
                connection.execute(sa.text("DELETE FROM items"))
                connection.execute(sa.text("INSERT INTO items (key, value) VALUES ('a', 1), ('b', 2)"))
            extension = database.transactions.extensions.add(_EndHooks())   # after the rule manager's
            try:
                with database.transaction() as tx:
                    with tx.subtransaction() as event:      # the sink's shape: the event's own subtransaction
                        event.emit("frame_threads_0")
                    reads = [tx.read("items", key)["value"] for key in KEYS]
            finally:
                database.transactions.extensions.remove(extension)
            # The emitter's commit: a frame until its deferred group spawned (FRAMES), a node after it.
            assert ("before_commit", "rule:frame_threads_emitter", False) in extension.seen
            results[representation] = (_items(database), reads, sorted(seen))
            assert database.transactions.locks.statistics().transactions == 0
        assert results[Subtransactions.FRAMES] == results[Subtransactions.MATERIALIZED]
        assert results[Subtransactions.FRAMES] == ({"a": 6, "b": 12, "c": 20}, [6, 12, 20], [("b", 6), ("c", 6)])
    finally:
        database.close()


class _AsksForEndHooks(_EndHooks):
    """``_EndHooks`` as an extension that skips frames (``frame_hooks = False``) and asks for the end hooks of
    the frames in which a ``hook_me`` stream event is emitted (what the rule manager does for a frame's
    deferred queue)."""

    frame_hooks = False

    def on_event(self, transaction, event) -> None:
        if event.source == "hook_me":
            lowlevel.want_end_hooks(transaction)


def test_an_extension_that_skips_frames_hears_the_end_of_the_frames_it_asked_for(db, use):
    """``want_end_hooks``: of three frames, the extension hears the end of the one that asked (it stays a
    frame), not of the others; as a node (materialized) it hears every end, as before."""
    heard = {}
    for representation in (Subtransactions.FRAMES, Subtransactions.MATERIALIZED):
        use(representation)
        extension = db.transactions.extensions.add(_AsksForEndHooks())
        try:
            with db.transaction() as tx:
                for name, event in (("first", "plain"), ("asks", "hook_me"), ("last", "plain")):
                    with tx.subtransaction(name) as child:
                        child.emit(event)
        finally:
            db.transactions.extensions.remove(extension)
        heard[representation] = [entry for entry in extension.seen if entry[0] != "begin"]
    assert heard[Subtransactions.FRAMES] == [("before_commit", "asks", True), ("after_end", "asks", True)]
    assert heard[Subtransactions.MATERIALIZED] == [
        ("before_commit", name, False) if what == "before_commit" else ("after_end", name, True)
        for name in ("first", "asks", "last") for what in ("before_commit", "after_end")]


def test_a_frame_kept_after_its_firing_ended_refuses_work_as_its_node_would(db, use):
    """A rule action that keeps its transaction: after the firing ended, using it fails clearly (it is
    committed), with frames as with registered nodes."""
    for representation in (Subtransactions.FRAMES, Subtransactions.MATERIALIZED):
        use(representation)
        kept = []
        PROGRAM.actions = [[], [], [], []]
        rule = db.rules.get("lazy_equivalence_1")
        original = rule.action
        rule.action = lambda tx, event: kept.append(tx)
        try:
            with db.transaction() as tx:
                tx.emit("lazy1")
                with pytest.raises(activedb.TransactionError, match="committed"):
                    kept[0].write("items", "z", value=1)
        finally:
            rule.action = original
        assert kept[0].state is activedb.TxnState.COMMITTED


def test_run_subtransaction_takes_any_arguments_alike_in_every_representation(db, use):
    """A firing runs through ``run_inline`` (one positional argument); ``run_subtransaction`` with one
    argument goes the same way, with several or with keywords through a closure: each returns the
    function's value and commits into its parent, or aborts (re-raising) and leaves the parent intact."""
    def put(child, key, value=1):
        child.write("items", key, value=value)
        return (child.id.count("."), key, value)

    def fail(child, key):
        child.write("items", key, value=99)
        raise Planned(key)

    outcomes = {}
    for representation in Subtransactions:
        use(representation)
        _clear_items(db)
        with db.transaction() as tx:
            returned = [lowlevel.run_subtransaction(tx, put, "a"), lowlevel.run_subtransaction(tx, put, "b", 2),
                        lowlevel.run_subtransaction(tx, put, "c", value=3)]
            with pytest.raises(Planned):
                lowlevel.run_subtransaction(tx, fail, "a")
            seen = tx.read("items", "a")["value"]
        table = _items(db)
        outcomes[representation] = (returned, seen, table, tx.subtransactions_committed)
    assert outcomes[Subtransactions.FRAMES] == outcomes[Subtransactions.MATERIALIZED]
    assert outcomes[Subtransactions.FRAMES] == ([(1, "a", 1), (1, "b", 2), (1, "c", 3)], 1,
                                                {"a": 1, "b": 2, "c": 3}, 3)


def test_a_function_rule_without_a_condition_has_the_always_true_one(db):
    """A ``db.rule`` declared without ``when`` has ``rules.always`` as its condition, which the dispatch does
    not call; one declared with ``when`` calls it per firing."""
    from activedb.rules._model import always
    rule = db.rules.get("lazy_equivalence_1")
    assert rule.condition is always and rule.condition_function() is None
    calls = []
    def when(tx, event):
        calls.append(event.source)
        return False
    original = rule.condition
    rule.condition = when
    try:
        with db.transaction() as tx:
            tx.emit("lazy1")
        assert calls == ["lazy1"] and db.rules.firings_in(tx) == {"lazy_equivalence_1": 1}
    finally:
        rule.condition = original


def test_a_frame_has_every_field_a_node_has(db, use):
    """A frame is built by ``Transaction._new_frame`` (or written out by a savepoint of the lean run as it decodes,
    ``_lean._write_out``), a node by the constructor: each sets every field of the class (a field added to one and
    forgotten in another fails here), and ``run_inline``'s ``kind`` makes the argument the child's slot of that type
    from its begin, in every representation."""
    fields = [name for name in activedb.Transaction.__slots__ if name != "__weakref__"]
    argument = object()
    seen = {}
    for representation in Subtransactions:
        use(representation)
        with db.transaction() as tx:
            def look(child, given):
                lean = type(child) is not activedb.Transaction
                if lean:
                    child._decode()      # the frame it encodes (README, "The lean run")
                inner = []
                with child.subtransaction() as grandchild:      # a frame's frame (no savepoint after a decode)
                    inner.append((grandchild._frame, [name for name in fields if not hasattr(grandchild, name)]))
                seen[representation] = (lean, child._frame, [name for name in fields if not hasattr(child, name)],
                                        lowlevel.slot(child, object, create=False) is given, inner[0])
            run_inline(tx, look, argument, "look", object)
    assert seen[Subtransactions.FRAMES] == (True, True, [], True, (True, []))
    assert seen[Subtransactions.MATERIALIZED] == (False, False, [], True, (False, []))


class _RefusesRuleCommits(activedb.TransactionExtension):
    """Makes the commit of every rule firing's transaction fail after the rule's action ran."""

    def before_commit(self, transaction) -> None:
        if (transaction.name or "").startswith("rule:"):
            raise RuntimeError("this extension refuses the firing's commit")


def test_a_firing_whose_commit_fails_counts_as_fired_not_executed(db, use):
    """``executed`` counts a firing whose action ran and whose transaction committed: a firing whose commit
    fails after its action ran is fired (it counts in the tree's record) but not executed, in every
    representation."""
    outcome = {}
    for representation in Subtransactions:
        use(representation)
        extension = db.transactions.extensions.add(_RefusesRuleCommits())
        before = db.rules.statistics().per_rule.get("lazy_equivalence_1")
        before = (before.fired, before.executed) if before is not None else (0, 0)
        try:
            with pytest.raises(activedb.errors.RuleFailed, match="refuses the firing's commit"):
                with db.transaction() as tx:
                    tx.emit("lazy1")
        finally:
            db.transactions.extensions.remove(extension)
        after = db.rules.statistics().per_rule["lazy_equivalence_1"]
        outcome[representation] = (after.fired - before[0], after.executed - before[1])
    assert outcome == {representation: (1, 0) for representation in Subtransactions}
