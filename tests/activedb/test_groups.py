"""A priority group of firings on threads runs as frames on the waiting thread until a sibling has to start on
another thread (txn README, "Groups on threads"; ``activedb/txn/_group.py``).

The group's members are frames while one thread runs them (no transaction of the lock manager each); a sibling
started elsewhere makes the running frame a node first — between two of its writes, so that the sibling waits
for its rows as it waits for a node's; a member started by a worker is a child its parent waits for (a deadlock
through it is found); and random programs of deferred rules on threads leave the same table, reads, firing counts
and outcome with frames as with every node registered.  No sleeps: barriers and observable-state waits with
generous bounds, under a watchdog.
"""

from __future__ import annotations

import os
import threading

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import activedb
from activedb import Coupling
from activedb.errors import RuleFailed
from activedb.txn import Subtransactions
from lockmgr import Deadlock
from lockmgr.testing import Watchdog, wait_until
from tests.conftest import APP_MIGRATIONS

BOUND = 60.0       # seconds: a generous bound for a loaded machine
EXAMPLES = int(os.environ.get("ACTIVEDB_LAZY_EXAMPLES", "60")) // 2


def _items(db) -> dict:
    with db.engine.connect() as connection:
        return dict(connection.execute(sa.text("SELECT key, value FROM items ORDER BY key")).all())


def _clear(db) -> None:
    with db.engine.begin() as connection:
        connection.execute(sa.text("DELETE FROM items"))


def test_a_group_that_nothing_blocks_runs_as_frames_on_the_committing_thread(db):
    """Twenty deferred firings of one cycle, one write each: all on the committing thread, and the lock manager
    begins the top-level transaction only (with every node registered: one more per firing)."""
    assert db.rules.execution == "threads"
    ran_on: list[int] = []

    @db.rule(on=db.stream("group_frames"), coupling="deferred", name="group_frames")
    def record(tx, event):
        ran_on.append(threading.get_ident())
        tx.write("items", f"frames-{event.key}", value=event.key)

    locks = db.transactions.locks
    begun = {}
    pool = db.transactions.pool
    before, pool.hand_off_after = pool.hand_off_after, 3600.0     # (no hand-off on a pause of a loaded machine)
    try:
        for representation in (Subtransactions.FRAMES, Subtransactions.MATERIALIZED):
            db.transactions.subtransactions = representation
            ran_on.clear()
            start = locks.statistics().begun
            with Watchdog(BOUND, locks):
                with db.transaction() as tx:
                    for number in range(20):
                        tx.emit("group_frames", key=number)
            begun[representation] = locks.statistics().begun - start
            assert ran_on == [threading.get_ident()] * 20
    finally:
        db.transactions.subtransactions = Subtransactions.FRAMES
        pool.hand_off_after = before
    assert begun == {Subtransactions.FRAMES: 1, Subtransactions.MATERIALIZED: 21}
    assert {key: value for key, value in _items(db).items() if key.startswith("frames-")} == {
        f"frames-{number}": number for number in range(20)}


@pytest.mark.parametrize("representation", list(Subtransactions))
def test_a_group_with_more_or_fewer_names_than_arguments_is_refused(db, representation):
    """``run_group(parent, function, arguments, names)`` names each member: a names list of another length is a
    BadArgument, before any member runs.  Before, run as frames the members beyond the names failed each with an
    IndexError, and run as spawned children (``zip``) they were dropped: three arguments, one result."""
    ran = []
    db.transactions.subtransactions = representation
    try:
        with db.transaction() as tx:
            with pytest.raises(activedb.BadArgument, match="names"):
                activedb.lowlevel.run_group(tx, lambda child, argument: ran.append(argument), [1, 2, 3], ["one"])
    finally:
        db.transactions.subtransactions = Subtransactions.FRAMES
    assert ran == []


def test_a_member_its_function_committed_is_not_committed_again(db):
    """``run_group`` with a function that commits its child itself (``child.commit()``, then returns): each member's
    result is its value, run as frames or as spawned children, as a spawned child's ``handle.result()`` is.  Before,
    the end of the member committed the ended child again: ``(False, TransactionError)`` for a committed member."""
    def commits_itself(child, key):
        child.write("items", key, value=1)
        child.commit()
        return key

    _clear(db)
    try:
        for representation in (Subtransactions.FRAMES, Subtransactions.MATERIALIZED):
            db.transactions.subtransactions = representation
            keys = [f"self-{representation.value}-{number}" for number in range(2)]
            with Watchdog(BOUND, db.transactions.locks):
                with db.transaction() as tx:
                    assert activedb.lowlevel.run_group(tx, commits_itself, keys, [None, None]) == [
                        (True, key) for key in keys]
    finally:
        db.transactions.subtransactions = Subtransactions.FRAMES
    assert sorted(_items(db)) == sorted(f"self-{representation.value}-{number}" for number in range(2)
                                        for representation in (Subtransactions.FRAMES, Subtransactions.MATERIALIZED))


def test_a_sibling_started_elsewhere_makes_the_running_frame_a_node_between_two_writes(db):
    """Two deferred firings of one group write and read row ``x``.  The first, a frame on the committing thread,
    writes ``x`` = 1 and meets the second at a barrier — which only a worker can start: it makes the waiting
    frame a node first.  After the barrier the first writes ``x`` = 2 and commits only once the second waits
    for ``x``: the second must wait for its sibling's row (a frame's locks are its parent's, which would let
    the sibling read the uncommitted 1 at once) and then read the committed 2."""
    _clear(db)
    meet = threading.Barrier(2, timeout=BOUND)
    locks = db.transactions.locks
    ids: dict[str, str] = {}
    seen: dict[str, object] = {}
    edges: list = []

    def first(tx, event):
        ids["first"] = tx.id
        tx.write("items", "x", value=1)
        meet.wait()
        tx.write("items", "x", value=2)

        def second_waits():
            graph = locks.wait_for_graph()
            return "second" in ids and graph.has_edge(ids["second"], tx.id) and list(graph.edges(data=True))

        edges.extend(wait_until(second_waits, BOUND, "the second firing waiting for the first one's row",
                                lambda: list(locks.wait_for_graph().edges(data=True))))

    def second(tx, event):
        meet.wait()
        ids["second"] = tx.id
        row = tx.read("items", "x")
        seen["x"] = None if row is None else row["value"]

    db.rule(on=db.stream("group_meet"), coupling="deferred", name="group_meet_first")(first)
    db.rule(on=db.stream("group_meet"), coupling="deferred", name="group_meet_second")(second)
    with Watchdog(BOUND * 2, locks):
        with db.transaction() as tx:
            tx.emit("group_meet")
    assert seen == {"x": 2}
    assert _items(db)["x"] == 2
    assert any(source == ids["second"] and target == ids["first"] for source, target, _ in edges)
    statistics = db.rules.statistics().per_rule
    assert statistics["group_meet_first"].executed == statistics["group_meet_second"].executed == 1


def test_a_deadlock_through_a_member_started_by_a_worker_is_found(db):
    """Tree P writes ``gx``; tree T writes ``gy`` and waits for ``gx`` (P retains it); P's commit runs a deferred
    group whose two firings meet at a barrier (so the second starts on a worker, a node made when it starts) and
    the second then writes ``gy``: P waits for that member, the member for T, T for P — a cycle, found when the
    member asks (P's edge to it is registered with it); the member is the victim, P's commit fails with
    ``RuleFailed`` from ``Deadlock``, and T goes on and commits."""
    _clear(db)
    meet = threading.Barrier(2, timeout=BOUND)
    locks = db.transactions.locks
    outcome: dict[str, object] = {}

    def meets(tx, event):
        meet.wait()

    def meets_then_writes(tx, event):
        meet.wait()
        tx.write("items", "gy", value=1)

    db.rule(on=db.stream("group_deadlock"), coupling="deferred", name="group_deadlock_meets")(meets)
    db.rule(on=db.stream("group_deadlock"), coupling="deferred", name="group_deadlock_writes")(meets_then_writes)
    t_has_gy = threading.Event()

    def other_tree():
        try:
            with db.transaction() as t:
                t.write("items", "gy", value=2)
                t_has_gy.set()
                t.write("items", "gx", value=2)
            outcome["T"] = "committed"
        except BaseException as error:        # reported below
            outcome["T"] = error

    with Watchdog(BOUND * 2, locks):
        with pytest.raises(RuleFailed) as failed:
            with db.transaction() as p:
                p.write("items", "gx", value=1)
                thread = threading.Thread(target=other_tree)
                thread.start()
                assert t_has_gy.wait(BOUND)
                wait_until(lambda: locks.statistics().waiting >= 1, BOUND, "T waiting for gx",
                           lambda: list(locks.wait_for_graph().edges(data=True)))
                p.emit("group_deadlock")
        thread.join(BOUND)
    assert isinstance(failed.value.__cause__, Deadlock)
    assert outcome == {"T": "committed"}
    assert {key: _items(db)[key] for key in ("gx", "gy")} == {"gx": 2, "gy": 2}


# --- random programs of deferred rules on threads, frames against registered nodes -------------------------------

GROUP_RULES = 3            # deferred rule i, all on event "group_eq", keeps to row f"k{i}-{event key}": no two
#                            firings share a row, so every order of them is the same


class _Program:
    def __init__(self) -> None:
        self.actions: list[list] = [[] for _ in range(GROUP_RULES)]
        self.reads: dict[str, list] = {}
        self.mutex = threading.Lock()


PROGRAM = _Program()


class Planned(Exception):
    """A failure the program asked for."""


def _run_ops(tx, ops: list, who: str, key: str) -> None:
    for op in ops:
        kind = op[0]
        if kind == "read":
            row = tx.read("items", key)
            with PROGRAM.mutex:
                PROGRAM.reads.setdefault(who, []).append(None if row is None else row["value"])
        elif kind == "write":
            row = tx.read("items", key)
            tx.write("items", key, value=(0 if row is None else row["value"] or 0) + op[1])
        elif kind == "echo":          # an immediate rule inside the member (an inline child: it is a node then)
            tx.emit("group_echo", key=key, payload={"add": op[1]})
        elif kind == "fail":
            raise Planned(who)
        elif kind == "inline":
            try:
                with tx.subtransaction() as child:
                    _run_ops(child, op[1], who + "/inline", key)
            except Exception:
                pass
        elif kind == "spawn":
            try:
                tx.spawn(_run_ops, op[1], who + "/spawn", key).result(BOUND)
            except Exception:
                pass


@pytest.fixture(scope="module")
def threads_db(database_url):
    database = activedb.connect(database_url, rule_execution="threads")
    database.upgrade_app(APP_MIGRATIONS)
    for number in range(GROUP_RULES):
        database.rule(on=database.stream("group_eq"), coupling=Coupling.DEFERRED, name=f"group_eq_{number}")(
            lambda tx, event, number=number: _run_ops(tx, PROGRAM.actions[number], f"rule{number}-{event.key}",
                                                      f"k{number}-{event.key}"))

    @database.rule(on=database.stream("group_echo"), coupling=Coupling.IMMEDIATE, name="group_echo")
    def echo(tx, event):
        row = tx.read("items", event.key)
        tx.write("items", event.key, value=(0 if row is None else row["value"] or 0) + event.payload["add"])

    yield database
    database.close()


def _member_ops(depth: int):
    simple = [st.tuples(st.just("read")), st.tuples(st.just("write"), st.integers(1, 9)),
              st.tuples(st.just("echo"), st.integers(1, 9)), st.tuples(st.just("fail"))]
    if depth == 0:
        return st.lists(st.one_of(simple), max_size=4)
    nested = _member_ops(depth - 1)
    return st.lists(st.one_of(*simple, st.tuples(st.just("inline"), nested), st.tuples(st.just("spawn"), nested)),
                    max_size=4)


GROUP_PROGRAMS = st.tuples(
    st.tuples(*[_member_ops(1) for _ in range(GROUP_RULES)]),
    st.lists(st.tuples(st.sampled_from([f"k{number}-{event}" for number in range(GROUP_RULES) for event in (0, 1)]),
                       st.integers(1, 9)),
             max_size=3),
    st.integers(1, 2),
)


def _run_group_program(db, program, representation: Subtransactions) -> tuple:
    actions, writes, events = program
    db.transactions.subtransactions = representation
    with db.engine.begin() as connection:
        connection.execute(sa.text("DELETE FROM items"))
        connection.execute(sa.text("INSERT INTO items (key, value) VALUES ('k0-0', 1), ('k1-0', 2), ('k1-1', 3)"))
    PROGRAM.actions = list(actions)
    PROGRAM.reads = {}
    before = {name: counter.executed for name, counter in db.rules.statistics().per_rule.items()}
    outcome = "committed"
    try:
        with db.transaction() as tx:
            for key, add in writes:
                tx.write("items", key, value=add)
            for event in range(events):
                tx.emit("group_eq", key=event)
    except RuleFailed as error:
        outcome = f"RuleFailed({error.rule})"
    after = {name: counter.executed for name, counter in db.rules.statistics().per_rule.items()}
    executed = {name: count - before.get(name, 0) for name, count in after.items() if count != before.get(name, 0)}
    return outcome, _items(db), PROGRAM.reads, executed


@pytest.mark.timeout(900)
@settings(max_examples=max(EXAMPLES, 10), deadline=None, suppress_health_check=list(HealthCheck), database=None,
          derandomize=os.environ.get("ACTIVEDB_TEST_SEED") in (None, ""))
@given(program=GROUP_PROGRAMS)
def test_deferred_groups_on_threads_behave_alike_with_frames_and_registered_nodes(threads_db, program):
    """Random deferred rules on threads — members that read (PostgreSQL: a worker may take the group over),
    write, fire an immediate rule, fail, open inline and spawned children — each keeping to a row of its own, so
    that every order of the members is the same: table, each rule's reads, counts and outcome are equal."""
    try:
        with Watchdog(BOUND * 4, threads_db.transactions.locks):
            frames = _run_group_program(threads_db, program, Subtransactions.FRAMES)
            materialized = _run_group_program(threads_db, program, Subtransactions.MATERIALIZED)
    finally:
        threads_db.transactions.subtransactions = Subtransactions.FRAMES
    assert frames == materialized
    assert threads_db.transactions.locks.statistics().transactions == 0     # nothing left in the lock manager


def test_a_take_over_that_meets_the_trees_abort_ends_every_member_with_a_result(db):
    """A worker that takes a group over after an ancestor's abort reached the lock manager cannot make the running
    frame a node (``materialize_now`` raises TransactionAborted): every member nobody has started ends with that
    error, unstarted, and the owner's frame ends as its own.  Before, the take-over stopped there: the members nobody
    had started never ran and ``run_group`` returned None for them, which its caller then unpacked."""
    from activedb.txn._group import _GROUPS

    started, go = threading.Event(), threading.Event()
    box: dict = {}

    def member(child, argument):
        if argument == 0:
            box["group"] = _GROUPS[child]
            started.set()
            assert go.wait(BOUND), "the take-over never ran"
        return argument

    def runs_group(node):
        box["results"] = activedb.lowlevel.run_group(node, member, [0, 1, 2], [None, None, None])

    def lets_member_go():
        try:
            wait_until(lambda: box["group"].token.done(), BOUND, "a worker to take the group over")
        finally:
            go.set()

    pool = db.transactions.pool
    before, pool.hand_off_after = pool.hand_off_after, 3600.0    # (the token is taken when the abort waits only)
    try:
        with Watchdog(BOUND, db.transactions.locks):
            with db.transaction() as tx:
                tx.spawn(runs_group, eager=True)
                assert started.wait(BOUND)
                helper = threading.Thread(target=lets_member_go, daemon=True)
                helper.start()
                tx.abort()           # dooms the tree, then its wait for the child gives the token a worker
            helper.join(BOUND)
    finally:
        pool.hand_off_after = before
    results = box["results"]
    assert [result and result[0] for result in results] == [False, False, False], results     # (None: no result)
    assert all(isinstance(result[1], activedb.TransactionAborted) for result in results), results
    assert db.transactions.locks.statistics().transactions == 0
