"""Nested transactions over the shared store: visibility, delegation, aborts, bad input."""

import datetime
import logging
import threading

import re

import pytest
import sqlalchemy as sa

import activedb
from activedb import testing
from activedb import TxnState
from activedb.txn import _pool
from activedb.errors import InvalidTime
from activedb.events import Timestamp
from activedb.store import Granularity
from lockmgr import Deadlock, Mode
from tests._sessions import end_sessions

pytestmark = pytest.mark.db(record_history=True)


@pytest.fixture(autouse=True)
def clean_tables(db):
    with db.engine.begin() as connection:
        for table in ("accounts", "items", "pairs", "events_seen"):
            connection.execute(sa.text(f"DELETE FROM {table}"))
    db.history.clear() if db.history else None
    yield


def committed(db, table):
    with db.engine.connect() as connection:
        return {tuple(row[:1]) if len(row) else row: dict(row._mapping)
                for row in connection.execute(sa.text(f"SELECT * FROM {table} ORDER BY 1"))}


def test_top_level_commit_reaches_postgresql_and_log(db):
    with db.transaction() as tx:
        tx.write("accounts", 1, owner="ann", balance=10)
        tx.insert("items", key="a", value=1)
        log_id = tx.log_id
    assert committed(db, "accounts")[(1,)]["balance"] == 10
    with db.engine.connect() as connection:
        row = connection.execute(sa.text("SELECT rows_written, tables FROM activedb_transaction_log "
                                         "WHERE transaction_id = :t"), {"t": log_id}).one()
    assert row.rows_written == 2 and row.tables == ["accounts", "items"]
    testing.check_history(db.history.snapshot()).assert_ok()


def test_exception_aborts_and_writes_nothing(db):
    with pytest.raises(RuntimeError):
        with db.transaction() as tx:
            tx.write("accounts", 1, balance=5)
            raise RuntimeError("boom")
    assert tx.state is TxnState.ABORTED
    assert committed(db, "accounts") == {}


def test_an_aborted_transaction_names_a_reason_without_a_message_by_its_type(db):
    """A reason with no message of its own (``assert``'s, a bare ``raise KeyError``) is named by its class in the
    error of the next operation, not shown as empty parentheses."""
    with pytest.raises(activedb.TransactionAborted, match=r"it was aborted \(AssertionError\)"):
        with db.transaction() as tx:
            tx.abort(AssertionError())
            tx.read("items", "x")


def test_a_child_ended_inside_its_block_is_not_ended_again_at_the_exit(db):
    """``with tx.subtransaction() as child: child.abort()`` undoes the child alone and the parent goes on, as an
    exception in the block would (and as ``with db.transaction() as tx: tx.abort()`` leaves the caller alone); a
    ``child.commit()`` inside the block is its commit, not one more at the exit.  Before, the exit committed the
    aborted child again, whose TransactionAborted aborted the whole top-level transaction."""
    with db.transaction() as tx:
        tx.write("items", "keep", value=1)
        with tx.subtransaction() as child:
            child.write("items", "drop", value=2)
            child.abort()
        with tx.subtransaction() as child:
            child.write("items", "also", value=3)
            child.commit()
        assert tx.read("items", "drop") is None and tx.read("items", "also")["value"] == 3
    assert set(committed(db, "items")) == {("keep",), ("also",)}


@pytest.mark.parametrize("representation", ["frames", "materialized"])
def test_a_commit_inside_a_running_inline_childs_block_is_refused_and_changes_nothing(db, representation):
    """``outer.commit()`` (or the top-level ``tx.commit()``) called inside the block of its running inline child is a
    TransactionError naming the child, and nothing changes: the blocks go on and commit as usual.  Before, the outer
    child's writes reached its parent and then the lock manager refused (its ActiveChildren), so the child ended
    ABORTED with its writes kept (every node registered) or committed under the running inner one (frames); a
    top-level commit flushed to PostgreSQL without the child's writes, then stayed COMMITTING with its locks held
    in the lock manager for good."""
    db.transactions.subtransactions = activedb.lowlevel.Subtransactions(representation)
    try:
        with db.transaction() as tx:
            tx.write("items", "x", value=0)
            with tx.subtransaction() as outer:
                outer.write("items", "y", value=1)
                with outer.subtransaction() as inner:
                    inner.write("items", "z", value=2)
                    with pytest.raises(activedb.TransactionError, match=f"{inner.id}"):
                        outer.commit()
                    with pytest.raises(activedb.TransactionError, match=f"{outer.id}"):
                        tx.commit()
                    assert (tx.state, outer.state, inner.state) == (TxnState.ACTIVE,) * 3
    finally:
        db.transactions.subtransactions = activedb.lowlevel.Subtransactions.FRAMES
    assert sorted(committed(db, "items")) == [("x",), ("y",), ("z",)]
    assert db.transactions.locks.statistics().transactions == 0


def test_a_child_its_function_committed_is_not_committed_again(db):
    """A function run as a subtransaction that commits its child itself (``child.commit()``, then returns) has
    committed it: ``tx.retry``, ``run_subtransaction`` and a spawned child's ``handle.result()`` return its value, as
    ``with tx.subtransaction()`` leaves a child its block committed.  Before, each committed the ended child again
    and raised TransactionError ('which is committed') although the child had committed."""
    def commits_itself(child, key):
        child.write("items", key, value=1)
        child.commit()
        return key

    with db.transaction() as tx:
        assert tx.retry(commits_itself, "retried") == "retried"
        assert activedb.lowlevel.run_subtransaction(tx, commits_itself, "inline") == "inline"
        handle = tx.spawn(commits_itself, "spawned")
        assert handle.result() == "spawned" and handle.state is TxnState.COMMITTED
    assert sorted(committed(db, "items")) == [("inline",), ("retried",), ("spawned",)]


def _in_bounded_thread(body, seconds=60.0):
    """Run ``body()`` on a thread of its own and return ``("returned", value)`` or ``("raised", error)``; a body still
    running after ``seconds`` (a hang) fails the test instead of hanging the suite (its daemon thread is left)."""
    outcome = []

    def run():
        try:
            outcome.append(("returned", body()))
        except BaseException as error:
            outcome.append(("raised", error))

    thread = threading.Thread(target=run, name="bounded-body", daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still running after {seconds} s (hung); live: {thread}"
    return outcome[0]


@pytest.mark.parametrize("eager", [False, True], ids=["helped", "on-a-worker"])
def test_a_spawned_child_that_aborts_its_parent_dooms_it_and_returns(db, eager):
    """``child.parent.abort()`` called by a running spawned child dooms the parent's tree and returns at once; the
    parent's abort ends (its hooks, its ``abort`` in the history) once its children ended, the child's own among them.
    Before, the abort waited for the parent's children — the calling child's own task too, which could never end: the
    thread hung (the root left in ``live_transactions()``), whether the parent's thread ran the child or a worker."""
    returned = threading.Event()

    def aborts_parent(child):
        child.parent.abort()
        returned.set()
        child.write("items", "late", value=2)         # doomed with its parent: raises

    def body():
        with db.transaction() as tx:
            tx.write("items", "parent", value=1)
            box["tx"] = tx
            tx.spawn(aborts_parent, eager=eager).result(timeout=30)

    box = {}
    kind, error = _in_bounded_thread(body)
    tx = box["tx"]
    assert kind == "raised" and isinstance(error, activedb.TransactionAborted), error
    assert returned.is_set()
    assert tx.state is TxnState.ABORTED and tx not in db.transactions.live_transactions()
    ops = [(op.kind, op.transaction) for op in db.history.snapshot() if op.kind in ("commit", "abort")]
    child_id = next(op.transaction for op in db.history.snapshot() if op.kind == "begin" and op.parent == tx.id)
    assert ops == [("abort", child_id), ("abort", tx.id)]         # the parent's abort ends after its child's
    assert committed(db, "items") == {}
    assert db.transactions.locks.statistics().transactions == 0


@pytest.mark.parametrize("eager", [False, True], ids=["helped", "on-a-worker"])
def test_a_commit_of_its_parent_from_a_spawned_child_is_refused(db, eager):
    """``child.parent.commit()`` (or the root's, from a grandchild) called by a running spawned child is a
    TransactionError naming the child, and nothing changes: the parent commits when its own block ends.  Before, the
    commit waited for the parent's children, the calling child among them, and the thread hung with the parent
    COMMITTING."""
    def commits_ancestor(child, ancestor):
        with pytest.raises(activedb.TransactionError, match=f"inside its subtransaction {child.id}"):
            ancestor.commit()
        child.write("items", child.id, value=1)
        return child.state

    def commits_root(child):
        child.write("items", child.id, value=1)
        return child.spawn(commits_ancestor, child.parent, eager=eager).result(timeout=30)

    def body():
        with db.transaction() as tx:
            box["tx"] = tx
            first = tx.spawn(lambda child: commits_ancestor(child, child.parent), eager=eager).result(timeout=30)
            second = tx.spawn(commits_root, eager=eager).result(timeout=30)
            return first, second, tx.state

    box = {}
    assert _in_bounded_thread(body) == ("returned", (TxnState.ACTIVE, TxnState.ACTIVE, TxnState.ACTIVE))
    assert box["tx"].state is TxnState.COMMITTED and len(committed(db, "items")) == 3
    assert db.transactions.locks.statistics().transactions == 0


@pytest.mark.parametrize("wait", ["own handle", "wait_children of its parent"])
def test_a_spawned_child_waiting_for_itself_is_refused_at_once(db, wait):
    """A spawned child that waits for itself — ``handle.result()`` of its own handle, or
    ``lowlevel.wait_children(child.parent)`` (the parent's children, itself among them) — gets a TransactionError naming
    it, and goes on.  Before, the lock manager dropped the wait's edge to itself and the thread waited for the task it
    was running: for ever."""
    def waits_for_itself(child):
        if wait == "own handle":
            call = box["handle"].result
        else:
            call = lambda: activedb.lowlevel.wait_children(child.parent)   # noqa: E731
        with pytest.raises(activedb.TransactionError, match=f"{child.id} would wait for itself"):
            call()
        child.write("items", "after", value=1)
        return "went on"

    def body():
        with db.transaction() as tx:
            box["handle"] = tx.spawn(waits_for_itself, eager=True)
            return box["handle"].result(timeout=30)

    box = {}
    assert _in_bounded_thread(body) == ("returned", "went on")
    assert committed(db, "items")[("after",)]["value"] == 1
    assert db.transactions.locks.statistics().transactions == 0


@pytest.mark.parametrize("call", ["wait", "result"])
@pytest.mark.parametrize("how", ["aborted itself", "aborted its parent", "aborted its inline child"])
def test_a_spawned_child_waiting_for_its_own_handle_after_its_abort_is_refused(db, how, call):
    """A spawned child that waits on its own handle after it aborted itself (``child.abort()``) or its parent
    (``child.parent.abort()``, which dooms it), or from its inline child's block after aborting that child, gets the
    TransactionError of a wait for itself at once, as a live child does.  Before, the aborted (or doomed) waiter's wait
    was not registered in the lock manager, which is where a wait for itself is refused: the thread waited for the task
    it was running, for ever."""
    def waits_for_itself(child):
        if how == "aborted itself":
            child.abort()
        elif how == "aborted its parent":
            child.parent.abort()
        try:
            if how == "aborted its inline child":
                with child.subtransaction() as inner:
                    inner.abort()
                    getattr(box["handle"], call)()
            else:
                getattr(box["handle"], call)()
        except activedb.TransactionError as error:
            box["error"] = error
        return "returned"

    def body():
        with db.transaction() as tx:
            box["handle"] = tx.spawn(waits_for_itself, eager=True)
            box["handle"].wait(timeout=30)
            tx.write("items", "parent", value=1)

    box = {}
    _in_bounded_thread(body)
    assert box["handle"].done()
    assert f"{box['handle'].transaction.id} would wait for itself" in str(box.get("error")), box
    assert db.transactions.locks.statistics().transactions == 0
    assert db.transactions.live_transactions() == []


@pytest.mark.parametrize("preferred_victim", ["no", 1, None])
@pytest.mark.parametrize("where", ["in the parent", "outside any transaction"])
def test_waiting_refuses_a_preferred_victim_that_is_no_bool(db, where, preferred_victim):
    """``db.transactions.waiting(node, kind, target, preferred_victim=...)`` (the extender tier's way to make a wait an
    edge of the wait-for graph) takes True or False: anything else is a BadArgument naming the call, before anything
    is registered.  Before, the lock manager's ``add_wait`` raised a bare TypeError naming itself when the wait was
    registered, and the value was taken without a word when it was not (no transaction on the thread, or late)."""
    from activedb.lowlevel import WaitKind
    with db.transaction() as tx:
        handle = tx.spawn(lambda child: "done")

        def wait():
            with db.transactions.waiting(tx, WaitKind.CHILDREN, handle.transaction.id,
                                         preferred_victim=preferred_victim):
                pass

        with pytest.raises(activedb.BadArgument, match=r"TransactionManager\.waiting\(preferred_victim="):
            if where == "in the parent":
                wait()
            else:       # (a thread that runs no transaction: nothing to register)
                kind, outcome = _in_bounded_thread(wait)
                if kind == "raised":
                    raise outcome
        assert db.transactions.locks.statistics().waiting == 0
        assert handle.result(timeout=30) == "done"
    assert db.transactions.locks.statistics().transactions == 0


def test_a_spawned_child_aborted_before_it_started_never_runs_its_function(db):
    """A queued spawned child its parent aborted (``handle.transaction.abort()``) ends there: its task, run later by
    whoever takes it, raises TransactionAborted without calling the function or the begin hooks.  Before, the abort
    took its task out of the parent's list (the parent's commit no longer waited for it) and the function still ran
    later, on the aborted node, after its parent had committed — an observer heard the child begin after its abort."""
    ran, heard = [], []

    class Hears(activedb.Observer):
        def on_begin(self, transaction):
            heard.append(("begin", transaction.id))

        def on_abort(self, transaction, reason):
            heard.append(("abort", transaction.id))

    observer = db.observe(Hears())
    pool = db.transactions.pool
    before, pool.hand_off_after = pool.hand_off_after, 3600.0     # (the task stays queued until it is waited for)
    try:
        with db.transaction() as tx:
            handle = tx.spawn(lambda child: ran.append(child.state))
            handle.transaction.abort()
        assert tx.state is TxnState.COMMITTED
        with pytest.raises(activedb.TransactionAborted):
            handle.result(timeout=30)                   # (this thread takes the task and runs it)
    finally:
        pool.hand_off_after = before
        db.transactions.observers.remove(observer)
    child = handle.transaction.id
    assert ran == [] and handle.state is TxnState.ABORTED
    assert [event for event in heard if event[1] == child] == [("abort", child)]


def test_a_spawn_after_the_database_was_closed_says_so(database_url):
    """``tx.spawn`` in a tree still running when another thread closed its ``Database`` is a TransactionError (an
    ActivedbError) saying the database was closed, and the child ends aborted.  Before, it was the worker pool's bare
    RuntimeError ('the worker pool is shut down'), which a caller catching activedb's errors missed."""
    database = activedb.connect(database_url)
    try:
        with pytest.raises(activedb.TransactionError):
            with database.transaction() as tx:
                closer = threading.Thread(target=database.close)
                closer.start()
                closer.join(30)
                assert not closer.is_alive()
                with pytest.raises(activedb.TransactionError, match="the Database was closed") as raised:
                    tx.spawn(lambda child: None)
                assert [child.state for child in tx.children] == []
                raise raised.value
    finally:
        database.close()


async def _async_work(tx):
    tx.write("accounts", 1, balance=1)


def _generator_work(tx):
    tx.write("accounts", 1, balance=1)
    yield


async def _async_generator_work(tx):
    tx.write("accounts", 1, balance=1)
    yield


@pytest.mark.parametrize("work, kind", [(_async_work, "an async function"), (_generator_work, "a generator function"),
                                        (_async_generator_work, "an async generator function")],
                         ids=["async", "generator", "async-generator"])
def test_db_run_spawn_and_retry_refuse_a_function_whose_call_runs_none_of_its_body(db, work, kind):
    """``db.run(work)`` of an ``async def work`` (or a generator function) called it, got a coroutine (a generator) that
    nothing awaits, committed an empty transaction and returned the coroutine: the work never happened, and Python
    warned only "coroutine ... was never awaited" when it was collected; ``tx.spawn`` and ``tx.retry`` the same, the
    child committing empty.  Each is refused at the call, naming the function and what to write instead, and nothing
    is written."""
    pattern = rf"{{call}}\(_{work.__name__[1:]}\) takes a plain function.*{kind}.*runs none of its body.*plain def"
    with pytest.raises(activedb.BadArgument, match=pattern.format(call="db.run")):
        db.run(work)
    with db.transaction() as tx:
        with pytest.raises(activedb.BadArgument, match=pattern.format(call="tx.spawn")):
            tx.spawn(work)
        with pytest.raises(activedb.BadArgument, match=pattern.format(call="tx.retry")):
            tx.retry(work)
    assert committed(db, "accounts") == {}


def test_a_transactions_block_used_as_the_transaction_says_to_enter_it(db):
    """``tx = db.transaction(); tx.write(...)`` — the block used without ``with`` — failed with Python's
    "'_GeneratorContextManager' object has no attribute 'write'" (``tx.subtransaction().write``: "'InlineSubtransaction'
    object …"), naming neither activedb's call nor what to write.  The AttributeError now says the call returns the
    transaction's block and to enter it with ``with``; a name no transaction has keeps Python's message, and nothing
    began (no transaction is live)."""
    block = db.transaction()
    with pytest.raises(AttributeError, match=r"db\.transaction\(\) returns the block of a transaction.*"
                                             r"with db\.transaction\(\) as tx:.*tx\.write\("):
        block.write("accounts", 1, balance=1)
    with pytest.raises(AttributeError, match=r"has no attribute 'no_such_thing'$"):
        block.no_such_thing
    assert not hasattr(block, "no_such_thing")
    assert db.transactions.live_transactions() == []
    with db.transaction() as tx:
        with pytest.raises(AttributeError, match=r"tx\.subtransaction\(\) returns the block of a transaction.*"
                                                 r"with tx\.subtransaction\(\) as child:.*child\.read\("):
            tx.subtransaction().read("accounts", 1)
        with block as entered:          # (the block is still one: entered, it runs the transaction)
            entered.write("accounts", 2, balance=2)
    assert committed(db, "accounts") == {(2,): {"id": 2, "owner": None, "balance": 2}}


def test_reads_see_own_then_ancestor_then_committed(db):
    db.run(lambda tx: tx.write("items", "x", value=1, note="committed"))
    with db.transaction() as tx:
        assert tx.read("items", "x")["value"] == 1
        tx.write("items", "x", value=2)
        with tx.subtransaction() as child:
            assert child.read("items", "x") == {"key": "x", "value": 2, "note": "committed"}
            child.write("items", "x", note="child")
            assert child.read("items", "x")["note"] == "child"
            with child.subtransaction() as grandchild:
                assert grandchild.read("items", "x") == {"key": "x", "value": 2, "note": "child"}
        assert tx.read("items", "x") == {"key": "x", "value": 2, "note": "child"}
        # Nothing reached PostgreSQL before the top-level commit.
        assert committed(db, "items")[("x",)]["value"] == 1
    assert committed(db, "items")[("x",)] == {"key": "x", "value": 2, "note": "child"}
    testing.check_history(db.history.snapshot()).assert_ok()


def test_aborted_child_is_undone_parent_continues(db):
    with db.transaction() as tx:
        tx.write("items", "keep", value=1)
        with pytest.raises(ValueError):
            with tx.subtransaction() as child:
                child.write("items", "drop", value=2)
                child.write("items", "keep", value=99)
                raise ValueError("child fails")
        assert tx.read("items", "keep")["value"] == 1
        assert tx.read("items", "drop") is None
    assert set(committed(db, "items")) == {("keep",)}
    testing.check_history(db.history.snapshot()).assert_ok()


def test_spawned_children_run_in_parallel_with_parent_and_siblings(db):
    barrier = threading.Barrier(4, timeout=10)

    def child(tx, number):
        barrier.wait()            # all three children and the parent are running at once
        tx.write("accounts", number, balance=number)
        return number

    with db.transaction() as tx:
        handles = [tx.spawn(child, number) for number in (1, 2, 3)]
        barrier.wait()
        assert sorted(handle.result(timeout=10) for handle in handles) == [1, 2, 3]
    assert set(committed(db, "accounts")) == {(1,), (2,), (3,)}


def test_failed_spawn_reraises_in_parent_which_decides(db):
    def failing(tx):
        tx.write("items", "f", value=1)
        raise KeyError("nope")

    with db.transaction() as tx:
        handle = tx.spawn(failing)
        with pytest.raises(KeyError):
            handle.result(timeout=10)
        assert handle.state is TxnState.ABORTED
        tx.write("items", "g", value=2)
    assert set(committed(db, "items")) == {("g",)}


def test_parent_commit_waits_for_children(db):
    release = threading.Event()

    def slow(tx):
        assert release.wait(10)
        tx.write("items", "late", value=1)

    with db.transaction() as tx:
        handle = tx.spawn(slow)
        # The child may write only once its parent is committing: if the commit did not wait for
        # it, the flush would come first and "late" would be missing from PostgreSQL.
        releaser = threading.Thread(target=lambda: (
            testing.wait_until(lambda: tx.state is TxnState.COMMITTING, 10, "parent to commit"), release.set()))
        releaser.start()
    releaser.join()
    assert handle.state is TxnState.COMMITTED
    assert ("late",) in committed(db, "items")


def test_deep_and_wide_trees_progress_with_a_tiny_pool(database_url):
    database = activedb.connect(database_url, max_workers=2)
    try:
        def node(tx, depth):
            if depth == 0:
                tx.write("pairs", (depth, int(tx.id.split(".")[-1])), value=tx.id)
                return 1
            handles = [tx.spawn(node, depth - 1) for _ in range(3)]
            return sum(handle.result(timeout=60) for handle in handles)

        with testing.Watchdog(60, database.transactions.locks):
            with database.transaction() as tx:
                assert node(tx, 4) == 81
        with database.engine.connect() as connection:
            assert connection.execute(sa.text("SELECT count(*) FROM pairs")).scalar() == 81
    finally:
        database.close()


def test_sibling_sees_committed_sibling_via_parent(db):
    with db.transaction() as tx:
        tx.spawn(lambda child: child.write("items", "s", value=7)).result(timeout=10)
        assert tx.spawn(lambda child: child.read("items", "s")["value"]).result(timeout=10) == 7


def test_parent_and_child_on_same_row_wait_not_deadlock(db):
    """The parent's own write is retained when it spawns; the child may then write the row."""
    with db.transaction() as tx:
        tx.write("accounts", 7, balance=1)
        handle = tx.spawn(lambda child: child.write("accounts", 7, balance=child.read("accounts", 7)["balance"] + 1))
        handle.result(timeout=10)
        assert tx.read("accounts", 7)["balance"] == 2
    assert committed(db, "accounts")[(7,)]["balance"] == 2


def test_scan_sees_write_sets_and_committed_rows(db):
    db.run(lambda tx: [tx.write("accounts", n, owner="x" if n % 2 else "y", balance=n) for n in range(5)])
    with db.transaction() as tx:
        tx.write("accounts", 10, owner="x", balance=10)
        tx.delete("accounts", 1)
        rows = tx.scan("accounts", {"owner": "x"})
        assert sorted(row["id"] for row in rows) == [3, 10]
        assert [row["id"] for row in tx.scan("accounts", lambda row: row["balance"] > 3)] != []


def test_table_granularity(db):
    db.schema.set_granularity("pairs", "table")
    try:
        with db.transaction() as tx:
            tx.write("pairs", (1, 2), value="t")
        assert committed(db, "pairs")
    finally:
        db.schema.set_granularity("pairs", "tuple")


def test_table_granularity_set_by_the_sqlalchemy_table_locks_the_table(db):
    """set_granularity takes a table as every call does, by name or as a sqlalchemy Table: given the Table, it was
    taken (the name checked) and kept under the Table object, which no lookup by name ever finds — the rows were
    still locked one by one, without a word."""
    table = db.schema.catalog.table("items")
    db.schema.set_granularity(table, Granularity.TABLE)
    try:
        with db.transaction() as tx:
            tx.write("items", "g", value=1)
            assert db.transactions.locks.holders(("table", "items")).held == {tx.id: Mode.WRITE}
            assert not db.transactions.locks.holders(("row", "items", ("g",)))
    finally:
        db.schema.set_granularity("items", Granularity.TUPLE)
    assert committed(db, "items")[("g",)]["value"] == 1


def test_identity_key_is_generated_on_insert(db):
    with db.transaction() as tx:
        first = tx.insert("events_seen", rule="r", detail="a")
        second = tx.insert("events_seen", rule="r", detail="b")
        assert second != first and tx.read("events_seen", first)["detail"] == "a"


def test_retry_helper_reruns_a_deadlock_victim(db):
    """Two siblings deadlock for real; the victim's work is re-run by tx.retry and then succeeds."""
    db.run(lambda tx: [tx.write("items", key, value=0) for key in ("x", "y")])
    a_wrote_x = threading.Event()
    attempts = []

    def body_a(attempt_tx):
        attempts.append(attempt_tx.id)
        attempt_tx.write("items", "x", value=1)
        a_wrote_x.set()
        if len(attempts) == 1:
            # B now holds y and waits for x: reading y closes the cycle, and A (the requester) is the victim.
            testing.wait_until(lambda: db.transactions.locks.statistics().waiting == 1, 10, "B to wait for x")
        return attempt_tx.read("items", "y")["value"]

    def sibling_b(child):
        child.write("items", "y", value=2)
        assert a_wrote_x.wait(10)
        child.read("items", "x")

    with testing.Watchdog(30, db.transactions.locks):
        with db.transaction() as tx:
            handle_a = tx.spawn(lambda child: child.retry(body_a, attempts=3))
            assert a_wrote_x.wait(10)
            handle_b = tx.spawn(sibling_b)
            assert handle_a.result(timeout=20) == 2          # the retry read B's committed y
            handle_b.result(timeout=20)
    assert len(attempts) == 2
    assert {key: row["value"] for (key,), row in committed(db, "items").items()} == {"x": 1, "y": 2}


def test_run_reruns_a_transaction_whose_rule_firings_deadlock(db, caplog):
    """A deadlock among the rule firings a transaction set off reaches ``db.run`` as ``RuleFailed`` (its cause the
    ``DeadlockDetected``); it is the transaction's deadlock all the same, and ``db.run`` runs the transaction again.
    The victim rule did not fail: it is counted cancelled, not failed, and no ERROR is logged for it; the other rule's
    first firing ran, and the aborted attempt undid it: cancelled too.  Each rule fired twice (once per attempt) and
    executed once."""
    db.run(lambda tx: tx.insert("accounts", id=1, balance=0))
    both_read = threading.Barrier(2, timeout=10)
    attempts = []

    def add_one(tx, event):                 # two siblings: each reads, then writes the row the other read
        account = tx.read("accounts", 1)
        if len(attempts) == 1:
            both_read.wait()                # the first attempt: both hold the read lock, so the upgrades deadlock
        tx.write("accounts", 1, balance=account["balance"] + 1)

    for name in ("first_add", "second_add"):
        db.rule(on=db.inserted("items"), name=name)(add_one)

    def insert_item(tx):
        attempts.append(tx.id)
        tx.insert("items", key="a", value=1)

    try:
        with testing.Watchdog(30, db.transactions.locks), caplog.at_level(logging.INFO, logger="activedb"):
            db.run(insert_item, retries=3)
        counters = [db.rules.statistics().per_rule[name] for name in ("first_add", "second_add")]
    finally:
        for name in ("first_add", "second_add"):          # (the module's tests share the database)
            db.rules.remove(name)
    assert len(attempts) == 2
    assert committed(db, "accounts")[(1,)]["balance"] == 2
    assert [counter.failed for counter in counters] == [0, 0], counters
    assert [(counter.fired, counter.executed, counter.cancelled) for counter in counters] == [(2, 1, 1)] * 2, counters
    assert not [record.getMessage() for record in caplog.records if record.levelno >= logging.ERROR]
    assert any("deadlock" in record.getMessage() for record in caplog.records), caplog.text


def test_retry_reruns_a_subtransaction_whose_rule_firings_deadlock(db):
    """A deadlock among the rule firings a retried subtransaction set off reaches ``tx.retry`` as ``RuleFailed`` (its
    cause the ``DeadlockDetected``, whose message says tx.retry re-runs a subtransaction); ``tx.retry`` runs the
    subtransaction again, as ``db.run`` does a transaction — it let the RuleFailed through on the first attempt."""
    db.run(lambda tx: tx.insert("accounts", id=1, balance=0))
    both_read = threading.Barrier(2, timeout=10)
    attempts = []

    def add_one(tx, event):                 # two siblings: each reads, then writes the row the other read
        if len(attempts) == 1:
            account = tx.read("accounts", 1)
            both_read.wait()                # the first attempt: both hold the read lock, so the upgrades deadlock
        else:                               # a re-run: the siblings queue at the read
            account = tx.read("accounts", 1, for_update=True)
        tx.write("accounts", 1, balance=account["balance"] + 1)

    for name in ("first_add_in_retry", "second_add_in_retry"):
        db.rule(on=db.inserted("items"), name=name)(add_one)

    def insert_item(child):
        attempts.append(child.id)
        child.insert("items", key="a", value=1)

    try:
        with testing.Watchdog(30, db.transactions.locks):
            with db.transaction() as tx:
                tx.retry(insert_item, attempts=3)
    finally:
        for name in ("first_add_in_retry", "second_add_in_retry"):          # (the module's tests share the database)
            db.rules.remove(name)
    assert len(attempts) == 2
    assert committed(db, "accounts")[(1,)]["balance"] == 2
    assert set(committed(db, "items")) == {("a",)}


def test_retry_lets_a_rule_failure_of_another_cause_through_at_once(db):
    """Only a deadlock or a serialization conflict is re-run: a rule that raised for another reason fails the
    first attempt."""
    attempts = []

    def refuse(tx, event):
        raise LookupError("no such item")

    db.rule(on=db.inserted("items"), name="refuse")(refuse)

    def insert_item(child):
        attempts.append(child.id)
        child.insert("items", key="b", value=1)

    try:
        with pytest.raises(activedb.RuleFailed, match="no such item"):
            with db.transaction() as tx:
                tx.retry(insert_item, attempts=3)
    finally:
        db.rules.remove("refuse")
    assert len(attempts) == 1
    assert committed(db, "items") == {}


# --- bad input ------------------------------------------------------------------------------

def test_unknown_table(db):
    with db.transaction() as tx:
        with pytest.raises(activedb.UnknownTable, match="no table 'nope'"):
            tx.read("nope", 1)


def test_unknown_column(db):
    with pytest.raises(activedb.UnknownColumn, match="no column 'colour'.*balance"):
        with db.transaction() as tx:
            tx.write("accounts", 1, colour="red")


def test_wrong_type(db):
    with pytest.raises(activedb.InvalidValue, match="accounts.balance is INTEGER.*'ten'"):
        with db.transaction() as tx:
            tx.write("accounts", 1, balance="ten")
    with pytest.raises(activedb.InvalidValue):
        with db.transaction() as tx:
            tx.write("accounts", 1, balance=True)


def test_none_for_a_not_null_column_with_a_default_is_refused_at_the_write(db):
    """``None`` is SQL NULL, never "the default": PostgreSQL refuses it for a NOT NULL column whether or not the column
    has a default (``accounts.balance``: NOT NULL DEFAULT 0), so the write refuses it with ``InvalidValue`` naming the
    column and saying to omit it for the default.  Before, the check let ``None`` through for a column with a server
    default and the commit failed (SQLSTATE 23502, a ``DatabaseError``), the transaction's other work lost with it."""
    with db.engine.begin() as connection:
        connection.execute(sa.text("DELETE FROM accounts"))
    db.run(lambda tx: tx.write("accounts", 1, balance=5))
    with db.transaction() as tx:
        with pytest.raises(activedb.InvalidValue, match=r"accounts\.balance is NOT NULL; got None.*omit"):
            tx.write("accounts", 1, balance=None)
        with pytest.raises(activedb.InvalidValue, match=r"accounts\.balance is NOT NULL; got None"):
            tx.write("accounts", 2, balance=None)
        tx.write("accounts", 2, owner="ann")                   # omitted: the default
    assert committed(db, "accounts") == {(1,): {"id": 1, "owner": None, "balance": 5},
                                         (2,): {"id": 2, "owner": "ann", "balance": 0}}


def test_wrong_key_arity(db):
    with db.transaction() as tx:
        with pytest.raises(activedb.InvalidKey, match=r"primary key \(a, b\)"):
            tx.read("pairs", 1)


def test_duplicate_insert(db):
    db.run(lambda tx: tx.insert("items", key="d", value=1))
    with pytest.raises(activedb.DuplicateKey, match="already exists"):
        with db.transaction() as tx:
            tx.insert("items", key="d", value=2)
    assert committed(db, "items")[("d",)]["value"] == 1


def test_writing_after_commit(db):
    with db.transaction() as tx:
        tx.write("items", "w", value=1)
    with pytest.raises(activedb.TransactionError, match="committed.*start a new transaction"):
        tx.write("items", "w", value=2)
    assert committed(db, "items")[("w",)]["value"] == 1


def test_spawning_from_a_finished_transaction(db):
    with db.transaction() as tx:
        pass
    with pytest.raises(activedb.TransactionError, match="starting a subtransaction.*committed"):
        tx.spawn(lambda child: None)


def test_run_with_negative_retries_is_refused_instead_of_running_nothing(db):
    """``retries`` counts the runs after the first: a negative number is refused, never a call that silently runs
    nothing and returns None."""
    ran = []
    with pytest.raises(ValueError, match=r"retries=-1.*at least 0"):
        db.run(lambda tx: ran.append(tx.id) or "done", retries=-1)
    assert ran == []
    assert db.run(lambda tx: ran.append(tx.id) or "done", retries=0) == "done" and len(ran) == 1


@pytest.mark.parametrize("keywords, message", [
    ({"retries": -1}, r"retries=-1.*at least 0"), ({"retries": "3"}, r"retries='3'.*at least 0"),
    ({"backoff": -0.5}, r"backoff=-0.5.*at least 0"), ({"backoff": "fast"}, r"backoff='fast'.*at least 0"),
])
def test_run_refuses_retries_and_backoff_it_cannot_take_before_the_first_attempt(db, keywords, message):
    """retries=-1 was a bare ValueError (no ActivedbError), retries='3' a TypeError from a comparison; a negative
    backoff was taken, and the first conflict then ended in time.sleep's ValueError instead of the retry."""
    ran = []

    def conflicting_once(tx):
        ran.append(tx.id)
        if len(ran) == 1:
            raise activedb.SerializationConflict("another writer won")
        return "done"

    with pytest.raises(activedb.BadArgument, match=message):
        db.run(conflicting_once, **keywords)
    assert ran == []
    assert db.run(conflicting_once, backoff=0) == "done" and len(ran) == 2


@pytest.mark.parametrize("attempts", [0, -1, "3", 2.5, True, None])
def test_retry_refuses_attempts_that_are_no_whole_number_of_at_least_one(db, attempts):
    """attempts=0 was a bare ValueError (no ActivedbError), '3' and None a TypeError from a comparison, 2.5 range()'s
    TypeError, and True was taken as one attempt; each is a BadArgument naming it, and nothing runs."""
    ran = []
    with db.transaction() as tx:
        with pytest.raises(activedb.BadArgument, match=rf"tx.retry\(attempts={attempts!r}\).*at least 1"):
            tx.retry(lambda child: ran.append(child.id), attempts=attempts)
        assert tx.retry(lambda child: ran.append(child.id) or "done", attempts=1) == "done"
    assert len(ran) == 1


@pytest.mark.parametrize("call", ["result", "wait"])
def test_a_spawned_childs_handle_waits_without_limit_for_an_infinite_timeout_and_refuses_no_number(db, call):
    """handle.result/wait(timeout=inf) raised OverflowError ('timestamp out of range for platform time_t') while the
    child ran; -1 waited for ever (a lock's acquire reads it so), -2 and NaN raised a bare ValueError and a text a
    TypeError.  An infinite timeout now waits without limit and the others are a BadArgument naming the timeout,
    the child left running."""
    locks = db.transactions.locks
    started, gate = threading.Event(), threading.Event()

    def child(tx):
        started.set()                       # a worker runs it: the parent's wait below blocks
        assert gate.wait(10)
        # The parent's wait for this child is an edge of the wait-for graph before its thread blocks.
        testing.wait_until(lambda: locks.statistics().registered_waits == 1, 10, "the parent to wait for the child")
        return "done"

    with testing.Watchdog(30, locks):
        with db.transaction() as tx:
            handle = tx.spawn(child, eager=True)
            assert started.wait(10)
            for timeout in (-1, -2, float("nan"), "5"):
                with pytest.raises(activedb.BadArgument, match=rf"handle.{call}\(timeout={timeout!r}\)"):
                    getattr(handle, call)(timeout=timeout)
            assert handle.state is TxnState.ACTIVE and not handle.done()
            gate.set()
            assert getattr(handle, call)(timeout=float("inf")) in ("done", True)
            assert handle.result(timeout=1e300) == "done"
    assert handle.state is TxnState.COMMITTED


@pytest.mark.parametrize("where", ["balance = 1", [("balance", 1)], 5])
def test_scan_refuses_a_where_that_is_no_mapping_nor_predicate_before_locking_the_table(db, where):
    """A where given as SQL text, a list of pairs or a number failed with a bare AttributeError ('str' object has no
    attribute 'items'), no ActivedbError, after the table's READ lock was taken; it is a BadArgument saying what a
    where is, and nothing is locked."""
    db.run(lambda tx: tx.write("accounts", 1, balance=1))
    with db.transaction() as tx:
        with pytest.raises(activedb.BadArgument, match=r"tx.scan\('accounts', where=.*mapping of column.*predicate"):
            tx.scan("accounts", where)
        assert not db.transactions.locks.holders(("table", "accounts")), "the failed scan locked the table"
        assert [row["id"] for row in tx.scan("accounts", {"balance": 1})] == [1]


@pytest.mark.parametrize("function", [5, None, "child_body"])
def test_spawn_refuses_what_is_not_callable_before_making_a_child(db, function):
    """tx.spawn(5) was taken: the child was queued, failed when it ran ('int' object is not callable) and aborted
    alone, so a transaction whose caller never asked for the result committed without the child's work and without
    a word.  It is a BadArgument naming the value, and no child is made."""
    with db.transaction() as tx:
        with pytest.raises(activedb.BadArgument, match=rf"tx.spawn\({function!r}\).*function"):
            tx.spawn(function)
        assert tx.children == []
        tx.write("items", "s", value=1)
    assert tx.state is TxnState.COMMITTED and committed(db, "items")[("s",)]["value"] == 1


def test_bad_input_leaves_committed_data_alone(db):
    db.run(lambda tx: tx.write("accounts", 1, balance=100))
    with pytest.raises(activedb.InvalidValue):
        with db.transaction() as tx:
            tx.write("accounts", 1, balance=0)
            tx.write("accounts", 2, balance="oops")
    assert committed(db, "accounts") == {(1,): {"id": 1, "owner": None, "balance": 100}}


def test_prefetch_loads_rows_once_for_the_tree(db):
    db.run(lambda tx: [tx.write("accounts", n, balance=n) for n in range(10)])
    with db.transaction() as tx:
        assert tx.prefetch("accounts", range(12)) == 10
        statements = []

        def record(connection, cursor, statement, *rest):
            statements.append(statement)

        sa.event.listen(db.engine, "before_cursor_execute", record)
        try:
            with tx.subtransaction() as child:
                assert child.read("accounts", 3)["balance"] == 3
                assert child.read("accounts", 11) is None
                child.write("accounts", 3, balance=33)
        finally:
            sa.event.remove(db.engine, "before_cursor_execute", record)
        assert not any("FROM accounts" in statement for statement in statements)
    assert committed(db, "accounts")[(3,)]["balance"] == 33
    testing.check_history(db.history.snapshot()).assert_ok()


def test_punctuation_never_moves_backwards(db):
    assert db.watermark("s") is None
    db.punctuate("s", 10.0)
    db.punctuate("s", 5.0)
    assert db.watermark("s") == 10.0


@pytest.mark.parametrize("watermark", [float("nan"), float("inf"), "10", None, True,
                                       datetime.datetime(2026, 1, 1), 10**400])
def test_a_punctuation_that_is_no_time_is_refused(db, request, watermark):
    # NaN compared with anything is False: a NaN watermark never advanced and streams reported it on every batch.
    source = f"bad-{request.node.callspec.id}"
    with pytest.raises(activedb.InvalidTime, match=f"watermark of source '{source}'"):
        db.punctuate(source, watermark)
    assert db.watermark(source) is None
    db.punctuate(source, 3.0)
    with pytest.raises(activedb.InvalidTime, match=f"watermark of source '{source}'"):
        db.punctuate(source, float("nan"))
    assert db.watermark(source) == 3.0


def test_a_punctuation_of_the_other_kind_of_time_is_refused(db):
    db.punctuate("kinds", 10.0)
    with pytest.raises(activedb.InvalidTime, match="numbers of seconds"):
        db.punctuate("kinds", datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc))
    assert db.watermark("kinds") == 10.0


def test_partial_write_of_existing_row_keeps_not_null_columns(db):
    db.run(lambda tx: tx.write("accounts", 5, owner="eve", balance=3))
    db.run(lambda tx: tx.write("accounts", 5, owner="eva"))          # balance (NOT NULL) not given
    assert committed(db, "accounts")[(5,)] == {"id": 5, "owner": "eva", "balance": 3}


def test_partial_write_creating_a_row_without_required_column_is_clear(db, database_url):
    database = activedb.connect(database_url)
    try:
        with database.engine.begin() as connection:
            connection.execute(sa.text("ALTER TABLE pairs ALTER COLUMN value SET NOT NULL"))
        database.schema.refresh()
        with pytest.raises(activedb.InvalidValue, match=r"new row \(4, 4\) without the NOT NULL column\(s\) value"):
            with database.transaction() as tx:
                tx.write("items", "ok", value=1)
                tx.write("pairs", (4, 4))
        assert ("ok",) not in committed(database, "items")           # nothing of the transaction was written
    finally:
        with database.engine.begin() as connection:
            connection.execute(sa.text("ALTER TABLE pairs ALTER COLUMN value DROP NOT NULL"))
        database.close()
        db.schema.refresh()


def test_new_row_reads_back_with_every_column(db):
    with db.transaction() as tx:
        tx.write("accounts", 9, owner="new")
        assert tx.read("accounts", 9) == {"id": 9, "owner": "new", "balance": 0}   # balance DEFAULT 0


def test_concurrent_inserts_of_generated_keys_do_not_conflict(db):
    failures = []

    def worker():
        for _ in range(20):
            try:
                db.run(lambda tx: tx.insert("events_seen", rule="concurrent", detail="x"), retries=0)
            except activedb.ActivedbError as error:
                failures.append(error)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert failures == []
    with db.engine.connect() as connection:
        assert connection.execute(sa.text("SELECT count(*) FROM events_seen WHERE rule='concurrent'")).scalar() == 160


def test_lost_connection_is_a_clear_error_and_loses_nothing(db):
    db.run(lambda tx: tx.write("accounts", 1, balance=100))
    end_sessions(db)
    with pytest.raises(activedb.DatabaseUnavailable, match="lost the connection to PostgreSQL.*nothing"):
        with db.transaction() as tx:
            for number in range(30):        # every pooled connection is dead: reads meet one of them
                tx.read("accounts", 1000 + number)
    db.engine.dispose()     # only connections opened from here on: all of them live, then all killed
    db.run(lambda tx: tx.write("accounts", 2, balance=5))       # works again after the failure
    end_sessions(db)
    with pytest.raises(activedb.DatabaseUnavailable, match="lost the connection.*nothing was written"):
        with db.transaction() as tx:
            tx.write("accounts", 1, balance=0)    # blind write: only the flush talks to PostgreSQL
    assert committed(db, "accounts")[(1,)]["balance"] == 100   # committed data intact
    assert committed(db, "accounts")[(2,)]["balance"] == 5


@pytest.mark.parametrize("table, key, values, problem", [
    ("items", "nul", {"note": "a\x00b"}, "NUL character"),
    ("items", "surrogate", {"note": "a\ud800b"}, "lone surrogate"),
    ("items", "range", {"value": 2**31}, "outside the column's range"),
    ("accounts", 2**40, {"balance": 1}, "outside the column's range"),
])
def test_values_postgresql_would_reject_fail_at_the_write(db, table, key, values, problem):
    with db.transaction() as tx:
        with pytest.raises(activedb.InvalidValue, match=problem):
            tx.write(table, key, **values)


@pytest.mark.parametrize("raw, problem", [
    ({"x": float("nan")}, "nan"),
    ({"x": object()}, "not a JSON value"),
    ({1: "x"}, "JSON object keys are strings"),
    ({"x": ["ok", "a\x00"]}, r"\$\.x\[1\].*NUL"),
])
def test_json_values_postgresql_would_reject_fail_at_the_write(db, raw, problem):
    with db.transaction() as tx:
        with pytest.raises(activedb.InvalidValue, match=problem):
            tx.insert("activedb_dead_letters", query_id="q", batch_id=1, reason="r", raw=raw)


def test_a_commit_postgresql_refuses_says_what_happened_not_lost_connection(db):
    import os

    huge_key = os.urandom(600_000).hex()          # incompressible: beyond the btree index row limit
    with pytest.raises(activedb.DatabaseError, match="SQLSTATE 54000.*nothing was written") as raised:
        with db.transaction() as tx:
            tx.write("items", "fine", value=1)
            tx.write("items", huge_key, value=2)
    message = str(raised.value)
    assert "connection" not in message and huge_key[:100] not in message and len(message) < 1000
    assert committed(db, "items") == {}


@pytest.mark.parametrize("flush_retries", [0, 1, 3])
def test_flush_retries_is_how_often_a_failed_flush_is_run_again(db, migrated, flush_retries):
    """``connect(flush_retries=N)``: a flush that fails on a serialization failure is re-run N times (N + 1 attempts,
    as ``db.run(fn, retries=N)`` runs ``fn``) before ``SerializationConflict``; nothing is written."""
    class Conflicts(activedb.CommitParticipant):
        attempts = 0

        def write(self, transaction, connection):
            Conflicts.attempts += 1
            connection.exec_driver_sql("DO $$ BEGIN RAISE EXCEPTION 'made up' USING ERRCODE = '40001'; END $$")

    database = activedb.connect(migrated, flush_retries=flush_retries)
    try:
        with pytest.raises(activedb.SerializationConflict, match=rf"failed {flush_retries + 1} times"):
            with database.transaction(participants=[Conflicts()]) as tx:
                tx.write("items", "flushed", value=1)
    finally:
        database.close()
    assert Conflicts.attempts == flush_retries + 1
    assert committed(db, "items") == {}


def test_a_tree_that_read_more_rows_than_one_statement_can_bind_commits(db):
    """PostgreSQL binds at most 65,535 parameters per statement: reads by key (prefetch, validation at the
    flush) are split into several statements."""
    keys = list(range(70_000))
    with db.engine.begin() as connection:
        connection.execute(sa.text("INSERT INTO accounts (id, balance) SELECT g, 1 FROM generate_series(0, 69999) g"))
    try:
        with db.transaction() as tx:
            db.schema.set_granularity("accounts", "table")
            assert tx.prefetch("accounts", keys) == 70_000
            tx.write("accounts", 5, balance=2)
        assert committed(db, "accounts")[(5,)]["balance"] == 2
    finally:
        db.schema.set_granularity("accounts", "tuple")


def test_a_group_of_spawned_children_is_waited_for_at_once(db):
    """``SubtransactionHandle.wait_all``: one wait of the parent for several children; each handle then
    has its outcome (a child that raised keeps its error, its siblings commit)."""
    release, started = threading.Event(), threading.Event()

    def blocked(child, n):
        started.set()
        assert release.wait(10)
        child.write("items", f"w{n}", value=n)

    def fails(child):
        raise ValueError("this child fails")

    with db.transaction() as tx:
        first = tx.spawn(blocked, 0)
        assert started.wait(10)                 # a worker runs it: a wait with no time left says not done
        assert not first.wait(0.0) and not first.done()
        handles = [first] + [tx.spawn(blocked, n) for n in (1, 2)] + [tx.spawn(fails)]
        release.set()
        activedb.SubtransactionHandle.wait_all(handles)
        assert all(handle.done() for handle in handles)
        with pytest.raises(ValueError, match="this child fails"):
            handles[-1].result()
        assert [handle.result() for handle in handles[:3]] == [None, None, None]
    assert sorted(committed(db, "items")) == [("w0",), ("w1",), ("w2",)]


def test_a_spawned_child_without_children_commits_its_holds_into_its_parents_retains(db):
    """A committing subtransaction with no live child skips making its holds retained first (its commit
    makes the parent retain them, and until then holding keeps out exactly what retaining would): after
    the commit the parent retains the row, a later sibling may write it, another tree may not.  The task's
    state moves QUEUED -> RUNNING -> DONE on the claim, whoever claims it."""
    locking = db.transactions.locking

    def write(child, value):
        child.write("items", "shared", value=value)
        assert locking.holders("items", ("shared",)).held.get(child.id) is Mode.WRITE

    with db.transaction() as tx:
        first = tx.spawn(write, 1)
        first.result()
        holders = locking.holders("items", ("shared",))
        assert holders.held == {} and holders.retained == {tx.id: Mode.WRITE}
        tx.spawn(write, 2).result()                       # a sibling: inside the retainer's sphere
        with db.transaction() as other:
            assert not db.transactions.locks.try_acquire(other.id, ("row", "items", ("shared",)),
                                                         Mode.READ), "another tree is kept out"
        task = _pool.Task(lambda: 7)
        assert task.state is _pool.TaskState.QUEUED
        assert task.claim() and not task.claim()
        assert task.state is _pool.TaskState.RUNNING
        task.run()
        assert task.state is _pool.TaskState.DONE and task.wait(0) and task.result == 7
    assert committed(db, "items")[("shared",)]["value"] == 2


def test_columns_named_key_table_and_name_are_written_as_values(db):
    """``tx.write(table, key, **values)``, ``tx.insert(table, **values)`` and ``tx.signal(name, **payload)`` take their
    own leading parameters positionally only, so a column — or a payload field — named ``key``, ``table`` or
    ``name`` is a value like any other (before, Python refused the call: "got multiple values for argument")."""
    heard = []
    db.rule(on=db.signalled("setting_changed"), name="hear_setting")(lambda tx, event: heard.append(event.payload))
    try:
        with db.engine.begin() as connection:
            connection.execute(sa.text("DELETE FROM settings"))
        with db.transaction() as tx:
            tx.write("settings", 1, key="colour", table="themes", name="first")
            tx.insert("settings", id=2, key="size", table="fonts", name="second")
            tx.write("settings", 1, name="renamed")
            assert tx.read("settings", 1) == {"id": 1, "key": "colour", "table": "themes", "name": "renamed"}
            tx.signal("setting_changed", name="colour", key=1, table="settings")
        assert committed(db, "settings") == {
            (1,): {"id": 1, "key": "colour", "table": "themes", "name": "renamed"},
            (2,): {"id": 2, "key": "size", "table": "fonts", "name": "second"}}
        assert heard == [{"name": "colour", "key": 1, "table": "settings"}]
    finally:
        db.rules.remove("hear_setting")


# --- awkward tables (tests/app_migrations/versions/t0006_awkward_tables.py): what a new user's schema may have ---


def _empty(db, *tables):
    with db.engine.begin() as connection:
        for table in tables:
            connection.execute(sa.text(f'DELETE FROM "{table}"'))


def test_a_mixed_case_table_generates_its_key(db):
    """A table named in mixed case (quoted in SQL) with an identity key: ``insert`` without the key draws it from
    the table's sequence (before, PostgreSQL was asked for the sequence of the unquoted name, ``tallies``, and a
    SQLAlchemy ``ProgrammingError`` — no ``ActivedbError`` — reached the caller)."""
    _empty(db, "Tallies")
    with db.transaction() as tx:
        first = tx.insert("Tallies", Label="one")
        second = tx.insert("Tallies", Label="two")
        assert tx.read("Tallies", second) == {"Id": second, "Label": "two"}
    assert isinstance(first, int) and second > first
    assert [row["Label"] for row in committed(db, '"Tallies"').values()] == ["one", "two"]


def test_a_key_generated_always_is_drawn_by_insert_and_refused_when_given(db):
    """A key ``GENERATED ALWAYS AS IDENTITY`` (``tickets``): ``insert`` without the key draws it from the identity's
    sequence and PostgreSQL takes it (the statement says ``OVERRIDING SYSTEM VALUE``: the value is the identity's
    own); a key the application gives is refused at the call with ``InvalidKey`` saying to omit it, and a ``write``
    that would create a row by a key of its own is refused with nothing written, while one of an existing row
    updates it.  Before, every insert failed at the commit with a bare ``DatabaseError`` (SQLSTATE 428C9, "cannot
    insert a non-DEFAULT value into column"), naming no table of activedb's and saying nothing to do."""
    _empty(db, "tickets")
    with db.transaction() as tx:
        first = tx.insert("tickets", title="one")
        second = tx.insert("tickets", title="two", note="b")
        assert tx.read("tickets", second) == {"id": second, "title": "two", "note": "b"}
    assert isinstance(first, int) and second > first
    assert committed(db, "tickets") == {(first,): {"id": first, "title": "one", "note": None},
                                        (second,): {"id": second, "title": "two", "note": "b"}}
    with db.transaction() as tx:
        with pytest.raises(activedb.InvalidKey, match=r"tickets\.id is GENERATED ALWAYS AS IDENTITY.*omit"):
            tx.insert("tickets", id=second + 100, title="mine")
        tx.write("tickets", first, title="uno", note="a")        # every NOT NULL column: no upsert of the key
        tx.write("tickets", second, note="bb")
    assert committed(db, "tickets") == {(first,): {"id": first, "title": "uno", "note": "a"},
                                        (second,): {"id": second, "title": "two", "note": "bb"}}
    with pytest.raises(activedb.InvalidKey, match=r"tickets\.id is GENERATED ALWAYS AS IDENTITY.*insert"):
        with db.transaction() as tx:
            tx.write("tickets", first, note="kept?")
            tx.write("tickets", second + 100, title="mine")
    assert committed(db, "tickets")[(first,)]["note"] == "a", "nothing of the refused commit was written"


def test_a_generated_column_is_refused_at_the_write_and_computed_by_postgresql(db):
    """A stored generated column (``line_items.total``, ``GENERATED ALWAYS AS (quantity * price) STORED``) takes no
    value: ``write`` and ``insert`` naming it raise ``InvalidValue`` at the call, saying PostgreSQL computes it and to
    omit it; written without it, the row holds what PostgreSQL computed.  Before, the write was accepted and the commit
    failed with a bare ``DatabaseError`` (SQLSTATE 428C9), the transaction's other work lost with it."""
    import decimal

    _empty(db, "line_items")
    with db.transaction() as tx:
        with pytest.raises(activedb.InvalidValue, match=r"line_items\.total is a generated column.*omit"):
            tx.write("line_items", 1, quantity=2, price=decimal.Decimal("3.50"), total=decimal.Decimal("7.00"))
        with pytest.raises(activedb.InvalidValue, match=r"line_items\.total is a generated column.*omit"):
            tx.insert("line_items", id=2, quantity=1, price=1.5, total=1.5)
        tx.write("line_items", 1, quantity=2, price=decimal.Decimal("3.50"))
    assert committed(db, "line_items") == {(1,): {"id": 1, "quantity": 2, "price": decimal.Decimal("3.50"),
                                                  "total": decimal.Decimal("7.00")}}
    with db.transaction() as tx:
        with pytest.raises(activedb.InvalidValue, match=r"line_items\.total is a generated column"):
            tx.write("line_items", 1, total=decimal.Decimal("1.00"))
        tx.write("line_items", 1, quantity=3)
    assert committed(db, "line_items")[(1,)]["total"] == decimal.Decimal("10.50")


def test_a_value_an_enum_does_not_list_is_refused_at_the_write(db):
    """An enum column (``moods.mood``: 'happy', 'sad') takes its labels only: another text is refused at the write with
    ``InvalidValue`` naming the labels, one row or many.  Before, it was taken for any text and the commit failed
    with a ``DatabaseError`` (SQLSTATE 22P02), the transaction's other work lost with it."""
    _empty(db, "moods")
    with db.transaction() as tx:
        with pytest.raises(activedb.InvalidValue, match=r"moods\.mood.*'angry'.*happy, sad"):
            tx.write("moods", 1, mood="angry")
        with pytest.raises(activedb.InvalidValue, match=r"moods\.mood.*'Happy'.*happy, sad"):
            tx.write_many("moods", {2: {"mood": "sad"}, 3: {"mood": "Happy"}})
        tx.write("moods", 1, mood="happy")
        tx.write("moods", 2, mood=None)
    assert committed(db, "moods") == {(1,): {"id": 1, "mood": "happy"}, (2,): {"id": 2, "mood": None}}


def test_a_generated_key_taken_already_says_to_set_the_sequence_past_the_tables_keys(db):
    """Rows inserted with keys of their own (here by SQL) past the table's sequence: ``insert`` without the key draws
    a key a row has already, and the commit's ``DuplicateKey`` says the sequence is behind the table's keys and how to
    set it past them — the next insert, once it is, draws a free key.  Before, the message said only "use write() to
    upsert", which a caller who gave no key cannot do."""
    _empty(db, "Tallies")
    with db.transaction() as tx:
        first = tx.insert("Tallies", Label="one")
    with db.engine.begin() as connection:
        connection.execute(sa.text('INSERT INTO "Tallies" ("Id", "Label") SELECT g, \'loaded\' '
                                   'FROM generate_series(CAST(:low AS bigint), CAST(:high AS bigint)) AS g'),
                           {"low": first + 1, "high": first + 5000})
    with pytest.raises(activedb.DuplicateKey, match=r"behind the table's keys.*setval"):
        with db.transaction() as tx:
            tx.insert("Tallies", Label="two")
    with db.engine.begin() as connection:
        connection.execute(sa.text('SELECT setval(pg_get_serial_sequence(\'"Tallies"\', \'Id\'), max("Id")) '
                                   'FROM "Tallies"'))
    with db.transaction() as tx:
        assert tx.insert("Tallies", Label="two") > first + 5000


def test_percent_signs_in_table_and_column_names_are_sent_once(db):
    """``%`` in a table's or a column's name: the driver SQL activedb builds names them as PostgreSQL has them
    (before, each was doubled twice — by SQLAlchemy's quoting for the ``%s`` parameter style, and again by hand —
    and every read and write of the table failed: 'column "50%%% off" does not exist')."""
    _empty(db, "rate%")
    with db.transaction() as tx:
        tx.write("rate%", 1, **{"50% off": 10})
        tx.write_many("rate%", {2: {"50% off": 20}, 3: {"50% off": 30}, 4: {"50% off": 40}})  # one unnest statement
    with db.transaction() as tx:
        tx.write("rate%", 1, note="first")                    # an UPDATE of some columns
        tx.delete("rate%", 4)
        assert tx.read("rate%", 2, for_update=True) == {"id": 2, "50% off": 20, "note": None}
        assert tx.read("rate%", 9) is None                    # absence: the table is locked at the flush
        assert [row["id"] for row in tx.scan("rate%", {"50% off": 30})] == [3]
        assert tx.read_many("rate%", [1, 3]) == {1: {"id": 1, "50% off": 10, "note": "first"},
                                                   3: {"id": 3, "50% off": 30, "note": None}}
    assert committed(db, '"rate%"') == {(1,): {"id": 1, "50% off": 10, "note": "first"},
                                         (2,): {"id": 2, "50% off": 20, "note": None},
                                         (3,): {"id": 3, "50% off": 30, "note": None}}


def test_a_write_of_no_columns_to_an_existing_row_changes_nothing(db):
    """``write(table, key)`` with no values upserts nothing into an existing row, also where the table has NOT NULL
    columns without a default (``rate%``: ``50% off``) or a key generated always (``tickets``), whose writes are
    updates of the rows found; a new row still needs its NOT NULL columns.  Before, the update of no columns was sent
    as ``UPDATE … SET WHERE …`` and the commit failed with a ``DatabaseError`` (SQLSTATE 42601, a syntax error)."""
    _empty(db, "rate%", "tickets")
    with db.transaction() as tx:
        tx.write("rate%", 1, **{"50% off": 10})
        ticket = tx.insert("tickets", title="one")
    with db.transaction() as tx:
        tx.write("rate%", 1)
        tx.write_many("rate%", {1: {}})
        tx.write("tickets", ticket)
    assert committed(db, '"rate%"') == {(1,): {"id": 1, "50% off": 10, "note": None}}
    assert committed(db, "tickets") == {(ticket,): {"id": ticket, "title": "one", "note": None}}
    with pytest.raises(activedb.InvalidValue, match="without the NOT NULL column"):
        with db.transaction() as tx:
            tx.write("rate%", 2)


def test_a_uuid_given_as_text_names_the_same_row_as_the_uuid(db):
    """A uuid column takes a ``uuid.UUID`` or its text (as SQLAlchemy and psycopg do), and PostgreSQL gives back a
    ``UUID``: a key given as text is the same row as the ``UUID`` — read back, read after a write in the same
    transaction, written once — and a scan's equality on text finds the rows.  Before, ``read(table, text)`` of an
    existing row returned None, a write by text was not seen by a read by ``UUID``, and text that is no uuid
    failed only at the commit."""
    import uuid

    _empty(db, "tokens")
    token, owner = uuid.uuid4(), uuid.uuid4()
    with db.transaction() as tx:
        tx.write("tokens", token, owner=owner, uses=1)
    with db.transaction() as tx:
        assert tx.read("tokens", str(token)) == {"id": token, "owner": owner, "uses": 1}
        tx.write("tokens", str(token), uses=2)
        assert tx.read("tokens", token)["uses"] == 2
        tx.write("tokens", token, uses=3)                     # the same row's entry: one upsert at the commit
        assert [row["id"] for row in tx.scan("tokens", {"owner": str(owner)})] == [token]
        assert tx.insert("tokens", id=str(uuid.UUID(int=1)), uses=0) == uuid.UUID(int=1)
    assert committed(db, "tokens")[(token,)] == {"id": token, "owner": owner, "uses": 3}
    with db.transaction() as tx:
        with pytest.raises(activedb.InvalidValue, match="'nope' is not a UUID"):
            tx.write("tokens", "nope", uses=1)
        with pytest.raises(activedb.InvalidValue, match="is not a UUID"):
            tx.write("tokens", token, owner="also-not-one")


def test_a_row_holding_nan_can_be_read_by_a_transaction_that_commits(db):
    """``NaN`` in a ``double precision`` or ``numeric`` column is a value like any other: a transaction that reads
    the row (plainly, for update, by a scan, in a subtransaction and its parent) commits.  Before, the commit's
    check of what it read compared the images with ``==``, NaN never equals NaN, and every such transaction failed
    with ``SerializationConflict`` — ``Database.run`` retried it to no end."""
    import decimal
    import math

    _empty(db, "measures")
    with db.transaction() as tx:
        tx.write("measures", 1, reading=float("nan"), exact=decimal.Decimal("NaN"))
        tx.write("measures", 2, reading=1.5, exact=decimal.Decimal("2"))

    def read_it(tx):
        row = tx.read("measures", 1)
        with tx.subtransaction() as child:
            assert child.read("measures", 1)["exact"].is_nan()
        assert len(tx.scan("measures")) == 2
        return row

    row = db.run(read_it, retries=0)
    assert math.isnan(row["reading"]) and row["exact"].is_nan()
    with db.transaction() as tx:
        assert math.isnan(tx.read("measures", 1, for_update=True)["reading"])
        tx.write("measures", 2, reading=2.5)
    assert committed(db, "measures")[(2,)]["reading"] == 2.5


def test_a_scan_equality_with_nan_finds_the_rows_holding_nan(db):
    """A scan's equality ``{'reading': nan}`` finds the rows holding NaN, as PostgreSQL's ``=`` does (``'NaN' =
    'NaN'`` is true there) — the committed rows and the transaction's own writes alike, in ``double precision`` and
    ``numeric`` columns.  Before, PostgreSQL returned them and the scan's second look in Python (``store.matches``,
    ``==``, never true for NaN) dropped every one: the scan found nothing."""
    import decimal

    _empty(db, "measures")
    db.run(lambda tx: [tx.write("measures", 1, reading=float("nan"), exact=decimal.Decimal("NaN")),
                       tx.write("measures", 2, reading=1.5, exact=decimal.Decimal("2"))])
    with db.transaction() as tx:
        tx.write("measures", 3, reading=float("nan"), exact=decimal.Decimal("3"))
        assert sorted(row["id"] for row in tx.scan("measures", {"reading": float("nan")})) == [1, 3]
        assert [row["id"] for row in tx.scan("measures", {"exact": decimal.Decimal("NaN")})] == [1]
        assert [row["id"] for row in tx.scan("measures", {"reading": 1.5})] == [2]


def test_a_scan_equality_on_a_json_column_compares_as_jsonb(db):
    """``json`` (SQLAlchemy's ``sa.JSON`` on PostgreSQL) has no ``=`` in PostgreSQL: a scan's equality on such a
    column compares the values as ``jsonb`` (equal as the dicts read back are).  Before, the scan raised
    SQLAlchemy's ``ProgrammingError`` ('operator does not exist: json = json'), not an ``ActivedbError``."""
    _empty(db, "documents")
    with db.transaction() as tx:
        tx.write("documents", 1, body={"kind": "memo", "tags": ["a", "é"]})
        tx.write("documents", 2, body={"kind": "note"})
    with db.transaction() as tx:
        assert [row["id"] for row in tx.scan("documents", {"body": {"tags": ["a", "é"], "kind": "memo"}})] == [1]


def test_a_scan_equality_finds_the_rows_the_transaction_wrote_and_committed_rows_given_a_tuple(db):
    """A scan's equality finds a row the transaction itself wrote as it finds the row once committed: a value kept
    as given (a uuid as text, a float of a ``numeric`` column, a tuple of an array or inside JSON) is compared as
    PostgreSQL gives it back, as the equality's own value is (``TableInfo.normalised``). And a tuple in the equality
    of an array or JSON column finds the rows holding that list. Before, the tree's own rows were compared as
    written: ``{'ref': text}`` missed the row written with that very text (the equality was the ``UUID``), ``{'price':
    0.1}`` the row written with ``0.1``; and ``{'counts': (1, 2)}`` found no committed row (PostgreSQL matched it, the
    second look in Python compared ``[1, 2]`` with the tuple)."""
    import uuid

    with db.engine.begin() as connection:
        connection.execute(sa.text("CREATE TABLE scanned_as_stored (id integer PRIMARY KEY, ref uuid, "
                                   "price numeric(10, 2), counts integer[], body jsonb)"))
    db.schema.refresh()
    ref = str(uuid.UUID(int=7))
    row = dict(ref=ref, price=0.1, counts=(1, 2), body={"pair": (1, 2)})
    with db.transaction() as tx:
        tx.write("scanned_as_stored", 1, **row)
    wheres = [{"ref": ref}, {"ref": ref.upper()}, {"price": 0.1}, {"price": 0.104}, {"counts": (1, 2)},
              {"counts": [1, 2]}, {"body": {"pair": (1, 2)}}, {"body": {"pair": [1, 2]}}]
    with db.transaction() as tx:
        assert {str(where): [found["id"] for found in tx.scan("scanned_as_stored", where)] for where in wheres} == {
            str(where): [1] for where in wheres}
        tx.write("scanned_as_stored", 2, **row)
        assert {str(where): sorted(found["id"] for found in tx.scan("scanned_as_stored", where)) for where in wheres
                } == {str(where): [1, 2] for where in wheres}
        tx.abort()


def test_a_naive_datetime_key_of_a_timestamptz_column_is_refused_saying_to_give_an_aware_one(db):
    """A ``timestamptz`` column gives back aware datetimes: a naive key would be written (PostgreSQL reads it in the
    session's time zone) but a read by the same key would not find the row (keyed by an aware datetime, never equal
    to a naive one).  Such a key is refused at the write, saying what to give (and nothing is written); an aware
    key names its row."""
    import datetime as dt

    _empty(db, "stamps")
    naive = dt.datetime(2024, 1, 1, 12)
    with pytest.raises(activedb.InvalidKey, match="give an aware datetime"):
        with db.transaction() as tx:
            tx.write("stamps", naive, count=1)
    assert committed(db, "stamps") == {}
    aware = naive.replace(tzinfo=dt.timezone.utc)
    with db.transaction() as tx:
        tx.write("stamps", aware, count=1)
    with db.transaction() as tx:
        assert tx.read("stamps", aware)["count"] == 1


def test_a_naive_key_of_a_datetime_subclass_is_refused_as_a_naive_datetime_is(db):
    """The naive-or-aware check of a datetime key looked at ``datetime`` itself only: a naive key of a subclass (a
    pandas ``Timestamp``, an application's own) of a ``timestamptz`` column was written, and a read by the same key
    found no row.  Now it is refused as a naive ``datetime`` is, and nothing is written."""
    import datetime as dt

    class Stamp(dt.datetime):
        pass

    _empty(db, "stamps")
    pandas = pytest.importorskip("pandas")
    for naive in (Stamp(2024, 1, 1, 12), pandas.Timestamp(2024, 1, 1, 12)):
        with pytest.raises(activedb.InvalidKey, match="give an aware datetime"):
            with db.transaction() as tx:
                tx.write("stamps", naive, count=1)
    assert committed(db, "stamps") == {}
    aware = Stamp(2024, 1, 1, 12, tzinfo=dt.timezone.utc)
    with db.transaction() as tx:
        tx.write("stamps", aware, count=1)
    with db.transaction() as tx:
        assert tx.read("stamps", aware)["count"] == 1


def test_pandas_nat_as_a_time_is_refused_naming_the_column_and_nothing_unreadable_is_stored(db):
    """pandas' ``NaT`` (what a DataFrame gives for an empty time cell) is a ``datetime`` that is no time: a write
    or insert of it into a ``timestamptz`` column was stored as a timestamp past the year 10000, and every later
    read of the table failed in the driver ("timestamp too large").  It is refused where values are checked,
    naming the column and saying to use None for a missing time — as a key and in a ``date`` column too (there
    the check of a datetime's time of day raised pandas' ValueError) — and nothing is written."""
    import datetime as dt

    pandas = pytest.importorskip("pandas")
    _empty(db, "counters", "stamps", "days")
    with pytest.raises(activedb.InvalidValue, match=r"counters\.last_ts .*NaT.*use None"):
        with db.transaction() as tx:
            tx.write("counters", "a", last_ts=pandas.NaT)
    with pytest.raises(activedb.InvalidValue, match=r"counters\.last_ts .*NaT.*use None"):
        with db.transaction() as tx:
            tx.insert("counters", key="b", last_ts=pandas.NaT)
    with pytest.raises(activedb.InvalidValue, match=r"stamps\.at .*NaT"):
        with db.transaction() as tx:
            tx.write("stamps", pandas.NaT, count=1)
    with pytest.raises(activedb.InvalidValue, match=r"days\.due .*NaT"):
        with db.transaction() as tx:
            tx.write("days", dt.date(2026, 1, 1), due=pandas.NaT)
    assert committed(db, "counters") == committed(db, "stamps") == committed(db, "days") == {}
    stamp = pandas.Timestamp(2026, 1, 1, 12, tz="UTC")
    with db.transaction() as tx:
        tx.write("counters", "a", last_ts=stamp)
        tx.write("counters", "b", last_ts=None)
    assert {key: row["last_ts"] for key, row in committed(db, "counters").items()} == {("a",): stamp, ("b",): None}


# --- keys given as another Python value than PostgreSQL gives back, a schema (t0007_keys_by_value.py) ---


def test_a_date_column_refuses_a_datetime_with_a_time_of_day(db):
    """A ``date`` column holds a day: a ``datetime`` with a time of day (or an aware one, whose date PostgreSQL
    would take in the session's time zone) is refused at the write, naming the column and what to pass, and a
    naive midnight one is its date — as a key too, so a read by it finds the row.  Before, ``datetime(2026, 1, 1,
    13, 45)`` was stored as 2026-01-01 without a word (the time lost), and a read by the datetime key of the row it
    had written returned None."""
    import datetime as dt

    _empty(db, "days")
    with pytest.raises(activedb.InvalidValue, match=r"days\.due \(DATE\).* has a time of day.*value\.date\(\)"):
        with db.transaction() as tx:
            tx.write("days", dt.date(2026, 1, 1), due=dt.datetime(2026, 1, 1, 13, 45))
    with pytest.raises(activedb.InvalidValue, match=r"days\.day \(DATE\).* has a time of day"):
        with db.transaction() as tx:
            tx.write("days", dt.datetime(2026, 1, 1, 13, 45), count=1)
    with pytest.raises(activedb.InvalidValue, match="aware datetime.*pass a date"):
        with db.transaction() as tx:
            tx.write("days", dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc), count=1)
    assert committed(db, "days") == {}
    with db.transaction() as tx:
        tx.write("days", dt.datetime(2026, 1, 2), due=dt.datetime(2026, 1, 9), count=1)
        tx.write("days", dt.date(2026, 1, 2), count=2)          # the same row
    with db.transaction() as tx:
        assert tx.read("days", dt.datetime(2026, 1, 2)) == {"day": dt.date(2026, 1, 2), "due": dt.date(2026, 1, 9),
                                                            "count": 2}
        assert [row["day"] for row in tx.scan("days", {"due": dt.datetime(2026, 1, 9)})] == [dt.date(2026, 1, 2)]
    assert list(committed(db, "days")) == [(dt.date(2026, 1, 2),)]


def test_a_float_key_of_a_numeric_column_names_the_row_of_its_decimal(db):
    """A ``numeric`` column gives back ``Decimal``s, which equal an ``int`` of the same number but not every float
    (``Decimal('0.1') != 0.1``): a float key is taken as the decimal it prints as, so ``int``, ``float`` and
    ``Decimal`` keys that denote one number name one row — read back, read after a write, written once — and so
    does a scan's equality.  Before, ``tx.read(table, 0.1)`` of the row written as ``Decimal('0.1')`` returned None
    (``1.5`` happened to work: a binary fraction equals its decimal)."""
    from decimal import Decimal

    _empty(db, "prices")
    with db.transaction() as tx:
        tx.write("prices", Decimal("0.1"), label="tenth")
        tx.write("prices", 2, label="two")
    with db.transaction() as tx:
        assert tx.read("prices", 0.1) == {"amount": Decimal("0.1"), "label": "tenth"}
        assert tx.read("prices", 2.0)["label"] == tx.read("prices", Decimal("2.00"))["label"] == "two"
        tx.write("prices", 0.1, label="a tenth")
        assert tx.read("prices", Decimal("0.1"))["label"] == "a tenth"
        tx.write("prices", 0.1 + 0.2, label="not quite")      # 0.30000000000000004, not 0.3
        assert tx.read("prices", Decimal("0.30000000000000004"))["label"] == "not quite"
        assert tx.read("prices", 0.3) is None
        assert [row["label"] for row in tx.scan("prices", {"amount": 0.1})] == ["a tenth"]
    assert committed(db, "prices") == {(Decimal("0.1"),): {"amount": Decimal("0.1"), "label": "a tenth"},
                                       (Decimal("0.30000000000000004"),): {"amount": Decimal("0.30000000000000004"),
                                                                           "label": "not quite"},
                                       (Decimal("2"),): {"amount": Decimal("2"), "label": "two"}}


def test_a_key_with_more_places_than_its_numeric_scale_names_the_row_it_rounds_to(db):
    """PostgreSQL rounds a value of a ``numeric(10, 2)`` column to two places, half away from zero: a key given with
    more (``Decimal('1.005')``, the float ``1.005``) names the row of the rounded key — a read, a write, a delete, a
    read of several keys and the row's lock take it so, and a write that names the key column too keeps it.  Before,
    the write set kept ``1.005`` and ``1.01`` as two rows (the commit failed: "ON CONFLICT DO UPDATE command cannot
    affect row a second time") and a read of ``1.01`` after a write of ``1.005`` found nothing."""
    from decimal import Decimal

    _empty(db, "cents")
    with db.transaction() as tx:
        tx.write("cents", Decimal("1.005"), label="a")
        assert tx.read("cents", Decimal("1.01")) == {"amount": Decimal("1.01"), "label": "a"}
        tx.write("cents", 1.009, amount=1.009, label="b")              # the same row
        tx.write("cents", Decimal("-2.345"), label="gone")
        tx.delete("cents", Decimal("-2.35"))
        assert tx.read_many("cents", [1.005, Decimal("-2.345")]) == {1.005: {"amount": Decimal("1.01"), "label": "b"},
                                                                     Decimal("-2.345"): None}
    assert committed(db, "cents") == {(Decimal("1.01"),): {"amount": Decimal("1.01"), "label": "b"}}
    with db.transaction() as tx:
        assert tx.read("cents", 1.0051, for_update=True)["label"] == "b"
        tx.write("cents", Decimal("1.01"), label="c")
        assert [row["label"] for row in tx.scan("cents", {"amount": Decimal("1.005")})] == ["c"]
    assert committed(db, "cents") == {(Decimal("1.01"),): {"amount": Decimal("1.01"), "label": "c"}}


def test_a_key_of_several_columns_given_as_a_list_names_the_row_of_the_tuple(db):
    """A key of several columns may be given as a list of its values, as a tuple: no one column's value could stand
    for such a key, so the list is not ambiguous (a one-column key keeps a list as its value, which only an array or
    JSON column takes), in a read of several keys too.  A key of the wrong length says to pass a tuple.  Before,
    ``[1, 2]`` was refused with "has primary key (a, b); got 1 value(s): ([1, 2],)"."""
    with db.transaction() as tx:
        tx.write("pairs", [1, 2], value="listed")
        assert tx.read("pairs", (1, 2)) == {"a": 1, "b": 2, "value": "listed"}
        tx.write("pairs", (1, 2), value="tupled")
        assert tx.read("pairs", [1, 2])["value"] == "tupled"
        # several keys: the result names a listed key by its tuple (before: TypeError, unhashable type: 'list')
        assert tx.read_many("pairs", [[1, 2], (1, 3), [1, 3]], lock="write") == {(1, 2): tx.read("pairs", (1, 2)),
                                                                                 (1, 3): None}
        with pytest.raises(activedb.InvalidKey, match=r"got 1 value\(s\): \(1,\) — pass the key as a tuple \(a, b\)"):
            tx.read("pairs", 1)
        with pytest.raises(activedb.InvalidValue, match=r"accounts\.id is INTEGER; got \[1\] \(list\)"):
            tx.read("accounts", [1])
    assert committed(db, "pairs") == {(1,): {"a": 1, "b": 2, "value": "tupled"}}


def test_a_schema_qualified_table_is_refused_saying_to_put_its_schema_on_the_search_path(db, migrated):
    """A table is named without its schema, as the connection's search path finds it: ``schema.table`` (or a
    ``sqlalchemy.Table`` of another schema) is an ``UnknownTable`` saying so and what to do, and with the schema on
    the search path the table is read and written by its name.  Before, the error said there was no such table and
    to create it by a migration; a ``Table`` of another schema was taken for the default schema's table of its
    name."""
    with db.transaction() as tx:
        with pytest.raises(activedb.UnknownTable, match=r"no table elsewhere\.things .*schema-qualified names are "
                                                        r"not supported.* name it 'things' and put its schema on the "
                                                        r"search path .*search_path%3Dpublic,elsewhere"):
            tx.read("elsewhere.things", 1)
        with pytest.raises(activedb.UnknownTable, match="schema-qualified names are not supported"):
            tx.write(sa.Table("accounts", sa.MetaData(), schema="elsewhere"), 1, balance=1)
        with pytest.raises(activedb.UnknownTable, match=r"no table public\.accounts .* — name it 'accounts'$"):
            tx.read("public.accounts", 1)
        assert tx.read(sa.Table("accounts", sa.MetaData(), schema="public"), 1) is None
    url = sa.make_url(migrated).update_query_dict({"options": "-csearch_path=public,elsewhere"})
    with activedb.connect(url.render_as_string(hide_password=False)) as other:
        with other.transaction() as tx:
            tx.write("things", 1, note="found")
        with other.transaction() as tx:
            assert tx.read("things", 1) == {"id": 1, "note": "found"}
    assert committed(db, "elsewhere.things") == {(1,): {"id": 1, "note": "found"}}


@pytest.mark.parametrize("quoted, name", [('"accounts"', "accounts"), ('"public.accounts"', "public.accounts")])
def test_a_table_named_with_sqls_double_quotes_is_refused_saying_to_name_it_without_them(db, quoted, name):
    """activedb takes a table's name as PostgreSQL stores it (``MixedCase``, ``we.ird``), so a name written with SQL's
    double quotes (``activedb capture enable '"MixedCase"'``) names no table: the error says to drop the quotes.  It
    gave the advice for a table never created, and for a quoted name with a dot the schema-qualified advice cut at the
    dot ('name it \'accounts"\' and put its schema on the search path … search_path=public,"public')."""
    with pytest.raises(activedb.UnknownTable, match=rf"no table '\\?{re.escape(quoted)}'.*without SQL's double "
                                                    rf"quotes.* name it {re.escape(repr(name))}$") as refused:
        db.table(quoted)
    assert "search_path" not in str(refused.value) and "migrations" not in str(refused.value), refused.value


@pytest.mark.parametrize("payload, shown", [("ann", r"'ann' \(str\)"), (5, r"5 \(int\)")])
def test_emit_with_a_payload_that_is_no_mapping_says_what_it_takes(db, payload, shown):
    """A payload that is no mapping was a bare TypeError, which a caller catching activedb's errors missed: it is a
    BadArgument (an ActivedbError) saying what to write."""
    with db.transaction() as tx:
        with pytest.raises(activedb.BadArgument, match=r"tx.emit\('ping', payload=...\) takes a mapping of the event's "
                                                       rf"values, got {shown}; write payload=\{{'field': value\}}"):
            tx.emit("ping", key=1, payload=payload)
        tx.emit("ping", key=1, payload={"name": "ann"})      # (the transaction goes on)


@pytest.mark.parametrize("name", [None, 5, ""])
def test_signal_refuses_a_name_no_rule_can_name(db, name):
    """tx.signal(None), tx.signal(5) and tx.signal('') were raised as events although db.signalled refuses each of
    those names ('no event is named by …'): no rule on a name could hear them, and the rules on every signal
    (db.signalled(None)) fired on an event without a name.  Each is a BadArgument saying to name the event, and
    nothing fires."""
    heard = []
    db.rule(on=db.signalled(None), name="any_signal")(lambda tx, event: heard.append(event.source))
    try:
        with db.transaction() as tx:
            with pytest.raises(activedb.BadArgument, match=rf"tx.signal\({name!r}\).*non-empty text"):
                tx.signal(name, field=1)
            tx.signal("ping", field=1)                          # (the transaction goes on)
    finally:
        db.rules.remove("any_signal")
    assert heard == ["ping"]


@pytest.mark.parametrize("event_type", [None, 5, ""])
def test_emit_refuses_an_event_type_no_rule_can_name(db, event_type):
    """tx.emit(None), tx.emit(5) and tx.emit('') were handed to the rules although db.stream refuses each of those
    types, as the ingestion's mapping does: no rule on a type could hear them, while the rules on every stream event
    (db.stream(None)) fired on an event without a type.  Each is a BadArgument saying to name the type."""
    heard = []
    db.rule(on=db.stream(None), name="any_stream_event")(lambda tx, event: heard.append(event.source))
    try:
        with db.transaction() as tx:
            with pytest.raises(activedb.BadArgument, match=rf"tx.emit\({event_type!r}\).*non-empty text"):
                tx.emit(event_type, key=1)
            tx.emit("ping", key=1)                              # (the transaction goes on)
    finally:
        db.rules.remove("any_stream_event")
    assert heard == ["ping"]


@pytest.mark.parametrize("ts, said", [
    ("yesterday", "is neither a number of seconds nor an aware datetime"), (True, "is a boolean, not a time"),
    (float("nan"), "is not finite"), (float("inf"), "is not finite"),
    pytest.param(10 ** 400, "is not finite", id="int-no-float-holds"),
    pytest.param(datetime.datetime(2026, 1, 1), "has no time zone", id="naive-datetime")])
def test_emit_refuses_a_ts_that_is_no_time_as_a_batch_does(db, ts, said):
    """tx.emit(..., ts='yesterday') handed the rules an event whose ts was that text, while a batch's event and a
    stream's event with that ts are refused (``check_time``): a rule windowing or ordering by it, or a batch run of
    the event, failed later and elsewhere.  The emit raises InvalidTime naming the value, nothing fires, and the
    transaction goes on; the times it takes (a number, an aware datetime, a Timestamp, none) are emitted."""
    heard = []
    db.rule(on=db.stream("ping"), name="hears_ping")(lambda tx, event: heard.append(event.ts))
    utc = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)
    stamp = Timestamp.point(2.5, producer="p")
    try:
        with db.transaction() as tx:
            with pytest.raises(InvalidTime, match=rf"tx.emit\('ping'\): ts .*{re.escape(said)}.*; give ts "):
                tx.emit("ping", key=1, ts=ts)
            for fine in (None, 0, 1.5, 2 ** 62, utc, stamp):
                tx.emit("ping", key=1, ts=fine)          # (the transaction goes on)
    finally:
        db.rules.remove("hears_ping")
    assert heard == [None, 0, 1.5, 2 ** 62, utc, stamp]


def test_wait_all_refuses_handles_of_different_parents(db):
    """``SubtransactionHandle.wait_all`` waits as the first handle's parent for all: handles of two parents
    registered a wait of that parent on the other's child — an edge that does not exist, so the deadlock detector
    judged a false wait-for graph.  Now it refuses, saying to wait for each parent's children apart."""
    with db.transaction() as tx:
        outer = tx.spawn(lambda child: None)
        with tx.subtransaction() as inner:
            handles = [outer, inner.spawn(lambda child: None)]
            with pytest.raises(activedb.BadArgument, match="wait_all.*parent"):
                activedb.SubtransactionHandle.wait_all(handles)
            handles[1].wait()
        outer.wait()


def test_wait_all_waits_for_handles_given_as_an_iterator(db):
    """``SubtransactionHandle.wait_all`` takes the handles once: given a generator (``wait_all(h for h in
    handles)``) it checked their parents by running through it and then found no handle left to wait for,
    returning at once with every child still queued."""
    with db.transaction() as tx:
        handles = [tx.spawn(lambda child, n: child.write("items", f"i{n}", value=n), n) for n in range(3)]
        activedb.SubtransactionHandle.wait_all(handle for handle in handles)
        assert all(handle.done() for handle in handles)
        assert [handle.state for handle in handles] == [TxnState.COMMITTED] * 3
    assert sorted(committed(db, "items")) == [("i0",), ("i1",), ("i2",)]


@pytest.mark.parametrize("eager", ["no", 1, None], ids=["text", "number", "none"])
def test_spawn_eager_that_is_no_switch_is_a_bad_argument(db, eager):
    """``tx.spawn(f, eager="no")`` was read as true (a worker woken at once), as any non-empty text is to Python."""
    with db.transaction() as tx:
        with pytest.raises(activedb.BadArgument, match=r"tx.spawn\(eager="):
            tx.spawn(lambda child: None, eager=eager)


@pytest.mark.parametrize("name", [5, b"tx", ["t"]], ids=["number", "bytes", "list"])
def test_a_transaction_or_subtransaction_name_that_is_no_text_is_a_bad_argument(db, name):
    """``db.transaction(name=5)``, ``tx.subtransaction(name=5)`` and ``tx.spawn(f, name=5)`` were taken: a name no
    ``db.transaction_event(kind, name)`` can match (it takes texts only), shown as a number in histories."""
    with pytest.raises(activedb.BadArgument, match=r"db.transaction\(name="):
        with db.transaction(name=name):
            pass
    with db.transaction() as tx:
        with pytest.raises(activedb.BadArgument, match=r"tx.subtransaction\(name="):
            with tx.subtransaction(name=name):
                pass
        with pytest.raises(activedb.BadArgument, match=r"tx.spawn\(name="):
            tx.spawn(lambda child: None, name=name)


@pytest.mark.parametrize("name", [5, b"tx"], ids=["number", "bytes"])
def test_a_retried_or_run_subtransactions_name_that_is_no_text_is_a_bad_argument(db, name):
    """``tx.retry(f, name=5)`` and ``lowlevel.run_subtransaction(tx, f, name=5)`` name their subtransaction as
    ``tx.subtransaction(name=...)`` does, and refuse what it refuses, before the function runs: they took the name
    (one no ``db.transaction_event`` can match) when the other calls were made to refuse it (5048997)."""
    ran = []
    with db.transaction() as tx:
        with pytest.raises(activedb.BadArgument, match=r"tx.retry\(name="):
            tx.retry(lambda child: ran.append(child), name=name)
        with pytest.raises(activedb.BadArgument, match=r"run_subtransaction\(name="):
            activedb.lowlevel.run_subtransaction(tx, lambda child: ran.append(child), name=name)
    assert ran == []


@pytest.mark.parametrize("for_update", ["no", 1], ids=["text", "number"])
def test_read_for_update_that_is_no_switch_is_a_bad_argument(db, for_update):
    """``tx.read(table, key, for_update="no")`` was read as true, as any non-empty text is to Python: an UPDATE lock
    and the row locked ``FOR UPDATE`` in PostgreSQL until the tree ended, although the caller asked for a plain read
    (as ``tx.spawn(f, eager="no")`` woke a worker, eb2bb87).  Now it is refused before anything is locked."""
    with db.transaction() as tx:
        with pytest.raises(activedb.BadArgument, match=r"tx.read\(for_update="):
            tx.read("items", "k", for_update=for_update)
        assert not db.transactions.locking.holders("items", ("k",))
        assert tx.read("items", "k", for_update=False) is None


def test_insert_without_a_key_whose_default_is_no_sequence_says_to_give_the_key(db):
    """A uuid key with a default that is no sequence (``gen_random_uuid()``): ``insert`` without the key cannot
    draw it (the key is needed before the row is sent), so ``InvalidKey`` says to give the key — before, it said
    the column "has no identity or serial default", which is wrong for a column that has a default."""
    with db.engine.begin() as connection:
        connection.execute(sa.text("CREATE TABLE badges (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), label text)"))
    try:
        with pytest.raises(activedb.InvalidKey, match=r"badges.*gen_random_uuid\(\).*give the key") as raised:
            with db.transaction() as tx:
                tx.insert("badges", label="one")
        assert "no identity or serial default" not in str(raised.value)
    finally:
        with db.engine.begin() as connection:
            connection.execute(sa.text("DROP TABLE badges"))


# --- the row read is the caller's: changing it changes nothing until written ---------------------------------------

def _seed_account(db, balance=100):
    db.run(lambda tx: tx.write("accounts", 1, owner="ann", balance=balance))


@pytest.mark.parametrize("representation", ["frames", "materialized"])
def test_a_read_row_changed_and_written_back_commits_in_the_top_level_and_a_subtransaction(db, representation):
    """``row = tx.read(...); row["balance"] -= 10; tx.write(..., balance=row["balance"])`` commits the new balance,
    in a top-level transaction and in a subtransaction (frames and savepoints, or nodes).  Before, ``tx.read``
    returned the image the tree relied on, so the change reached it: the flush, comparing it with PostgreSQL,
    failed with a SerializationConflict saying another process changed the row — on every re-run."""
    _seed_account(db)
    db.transactions.subtransactions = activedb.lowlevel.Subtransactions(representation)
    try:
        with db.transaction() as tx:
            row = tx.read("accounts", 1)
            row["balance"] -= 10
            tx.write("accounts", 1, balance=row["balance"])
        assert committed(db, "accounts")[(1,)]["balance"] == 90
        with db.transaction() as tx:
            tx.read("accounts", 1)          # the root relies on the row: the child's read is answered from it
            with tx.subtransaction() as child:
                row = child.read("accounts", 1)
                row["balance"] -= 10
                child.write("accounts", 1, balance=row["balance"])
            with tx.subtransaction() as child:     # a child that reads it first
                with child.subtransaction() as grandchild:
                    row = grandchild.read("items", "fresh")
                    assert row is None
                    grandchild.write("items", "fresh", value=1)
                    row = grandchild.read("items", "fresh")
                    row["value"] = 99                # (an image composed of writes: changing it changes nothing)
                assert child.read("items", "fresh")["value"] == 1
    finally:
        db.transactions.subtransactions = activedb.lowlevel.Subtransactions.FRAMES
    assert committed(db, "accounts")[(1,)]["balance"] == 80
    assert committed(db, "items")[("fresh",)]["value"] == 1


@pytest.mark.parametrize("representation", ["frames", "materialized"])
def test_a_read_row_changed_and_not_written_changes_neither_later_reads_nor_the_flush(db, representation):
    """A change to what ``read``, ``read_many`` and ``scan`` returned is not seen by a later read of the row (at the
    top level, in a child, after the child) and is not flushed; the commit succeeds.  Before, the later reads
    returned the changed dict and the commit failed with a SerializationConflict."""
    _seed_account(db)
    db.run(lambda tx: tx.write("accounts", 2, owner="bob", balance=5))
    db.transactions.subtransactions = activedb.lowlevel.Subtransactions(representation)
    try:
        with db.transaction() as tx:
            tx.read("accounts", 1)["balance"] = -1
            assert tx.read("accounts", 1) == {"id": 1, "owner": "ann", "balance": 100}
            with tx.subtransaction() as child:
                child.read("accounts", 1)["owner"] = "mallory"
                assert child.read("accounts", 1)["owner"] == "ann"
                child.read_many("accounts", [2])[2]["balance"] = -2
                assert child.read("accounts", 2)["balance"] == 5
            assert tx.read("accounts", 1)["owner"] == "ann"
            for row in tx.scan("accounts"):
                row["balance"] = -3
            tx.scan("accounts", lambda row: row.update(owner="eve") or True)
            assert sorted(row["balance"] for row in tx.scan("accounts", {"owner": "ann"})) == [100]
            assert tx.read("accounts", 2) == {"id": 2, "owner": "bob", "balance": 5}
    finally:
        db.transactions.subtransactions = activedb.lowlevel.Subtransactions.FRAMES
    assert committed(db, "accounts") == {(1,): {"id": 1, "owner": "ann", "balance": 100},
                                         (2,): {"id": 2, "owner": "bob", "balance": 5}}


def test_a_rule_that_changes_the_row_it_read_and_writes_it_back_commits(db):
    """The same in an immediate rule fired inline (a frame, or a savepoint of the lean run): the rule reads the row,
    changes the dict and writes it back.  Before, every transaction that fired it failed at its flush."""
    _seed_account(db)

    @db.rule(on=db.signalled("pay"), coupling="immediate")
    def pay(tx, event):
        row = tx.read("accounts", 1)
        row["balance"] -= event.payload["amount"]
        tx.write("accounts", 1, balance=row["balance"])

    @db.rule(on=db.signalled("peek"), coupling="immediate")
    def peek(tx, event):
        tx.read("accounts", 1)["balance"] = 0     # changed, never written

    try:
        with db.transaction() as tx:
            tx.signal("pay", amount=10)
            tx.signal("peek")
            tx.signal("pay", amount=5)
            assert tx.read("accounts", 1)["balance"] == 85
        with db.transaction() as tx:
            tx.read("accounts", 1)       # relied on by the root first: the rules' reads are answered from it
            tx.signal("peek")
            tx.signal("pay", amount=1)
    finally:
        db.rules.remove("pay")
        db.rules.remove("peek")
    assert committed(db, "accounts")[(1,)]["balance"] == 84


@pytest.mark.parametrize("relied_first", [False, True])
def test_a_rule_that_changes_its_events_images_changes_neither_the_row_nor_another_rules_event(db, relied_first):
    """``event.old`` / ``event.new`` / ``event.payload`` changed by a rule: a later read of the row, the flush and
    the other rules on the same event (an immediate one of lower priority, a deferred one run at the commit) see the
    event as it was raised.  Before, ``event.old`` was the image the tree relied on (the commit failed with a
    SerializationConflict — also when a savepoint wrote a row its root had read, ``relied_first``), and every rule
    on the event got the one ``Event`` (the next rule saw the first one's changes)."""
    _seed_account(db)
    seen = []

    @db.rule(on=db.updated("accounts"), coupling="immediate", priority=2)
    def vandal(tx, event):
        event.old["balance"] = -1
        event.new["owner"] = "mallory"

    @db.rule(on=db.updated("accounts"), coupling="immediate", priority=1)
    def witness(tx, event):
        seen.append(("immediate", event.old["balance"], event.new["owner"], tx.read("accounts", 1)["balance"]))

    @db.rule(on=db.updated("accounts"), coupling="deferred")
    def later(tx, event):
        seen.append(("deferred", event.old["balance"], event.new["owner"], tx.read("accounts", 1)["balance"]))

    try:
        with db.transaction() as tx:
            if relied_first:
                tx.read("accounts", 1)
            with tx.subtransaction() as child:
                child.write("accounts", 1, balance=90)
            assert tx.read("accounts", 1) == {"id": 1, "owner": "ann", "balance": 90}
    finally:
        for name in ("vandal", "witness", "later"):
            db.rules.remove(name)
    assert seen == [("immediate", 100, "ann", 90), ("deferred", 100, "ann", 90)]
    assert committed(db, "accounts")[(1,)] == {"id": 1, "owner": "ann", "balance": 90}


def test_a_cleared_history_names_no_writer_of_before_the_clear(db):
    """``db.history.clear()`` emptied the operations but kept the recorder's last writer of each row, so a committed
    read after the clear recorded ``read_from`` naming a transaction of before it (the interleaving runner clears the
    history between its runs: a read of the next run named a transaction of an earlier one, absent from the history
    it was in).  What was written before the clear is the new history's initial state: ``read_from="initial"``."""
    with db.transaction() as tx:
        tx.insert("items", key="c", value=1)
        writer = tx.id
    db.history.clear()
    with db.transaction() as tx:
        tx.read("items", "c")
    reads = [op for op in db.history.snapshot() if op.kind == "read" and op.table == "items"]
    assert [(op.source, op.read_from) for op in reads] == [("committed", "initial")], (writer, reads)
    testing.check_history(db.history.snapshot()).assert_ok()


def test_the_recorded_history_keeps_the_image_a_read_returned_as_it_was_read(db):
    """The history recorder (``record_history=True``) keeps what each read saw: a change the reader then makes to the
    dict it got does not rewrite the history that ``testing.check_history`` judges.  Before, a read of a row the tree
    wrote recorded the very dict it returned."""
    with db.transaction() as tx:
        tx.write("items", "h", value=1)
        tx.read("items", "h")["value"] = 2
        with tx.subtransaction() as child:
            child.read("items", "h")["value"] = 3
    reads = [op.value for op in db.history.snapshot() if op.kind == "read" and op.table == "items"
             and op.source != "committed"]
    assert reads == [{"key": "h", "value": 1, "note": None}] * 2
    testing.check_history(db.history.snapshot()).assert_ok()


# --- the copies reach into a JSON column's lists and dicts (``TableInfo.nested``) -------------------------------------

def _seed_list(db, value):
    _empty(db, "lists")
    db.run(lambda tx: tx.write("lists", "k", value=value))


@pytest.mark.parametrize("representation", ["frames", "materialized"])
def test_a_json_list_read_appended_to_and_written_back_commits_and_unwritten_appends_change_nothing(db, representation):
    """``row = tx.read("lists", k); row["value"].append("b"); tx.write(..., value=row["value"])`` commits the longer
    list (at the top level and in a subtransaction whose root read the row first); an append to what ``read``,
    ``read_many`` or ``scan`` returned that is not written is seen by no later read and not flushed, also an append
    to a row written in the tree made by a subtransaction that then aborts.  Before, the copies were shallow: the
    list was the one in the image the tree relied on (the commit failed with a SerializationConflict, on every
    re-run) or in the write entry (the aborted subtransaction's append was committed)."""
    _seed_list(db, ["a"])
    db.transactions.subtransactions = activedb.lowlevel.Subtransactions(representation)
    try:
        with db.transaction() as tx:
            row = tx.read("lists", "k")
            row["value"].append("b")
            assert tx.read("lists", "k")["value"] == ["a"]
            tx.write("lists", "k", value=row["value"])
        assert committed(db, "lists")[("k",)]["value"] == ["a", "b"]
        with db.transaction() as tx:
            tx.read("lists", "k")           # relied on by the root: the child's read is answered from it
            with tx.subtransaction() as child:
                row = child.read("lists", "k")
                row["value"].append("c")
                child.write("lists", "k", value=row["value"])
            for row in tx.scan("lists"):
                row["value"].append("scanned")
            tx.read_many("lists", ["k"])["k"]["value"].append("many")
            assert tx.read("lists", "k")["value"] == ["a", "b", "c"]
            with pytest.raises(RuntimeError, match="abort it"):
                with tx.subtransaction() as child:
                    child.read("lists", "k")["value"].append("aborted")
                    raise RuntimeError("abort it")
            assert tx.read("lists", "k")["value"] == ["a", "b", "c"]
    finally:
        db.transactions.subtransactions = activedb.lowlevel.Subtransactions.FRAMES
    assert committed(db, "lists")[("k",)]["value"] == ["a", "b", "c"]


@pytest.mark.parametrize("relied_first", [False, True])
def test_a_rule_that_appends_to_its_events_json_lists_changes_neither_the_row_nor_another_rules_event(db, relied_first):
    """A rule that appends to ``event.old["value"]`` and ``event.new["value"]`` (a JSONB list) changes no other
    rule's event (an immediate one of lower priority, a deferred one), no later read and not the stored row; a rule
    that reads the row, appends and writes it back commits.  Before, ``old``'s list was the image the tree relied on
    (a SerializationConflict at the commit), ``new``'s the write entry's (the append was stored) and each further
    rule's event a shallow copy sharing both."""
    _seed_list(db, ["a"])
    seen = []
    suffix = f"_{int(relied_first)}"     # (each run's rules their own persisted definitions: no redefinition warning)

    @db.rule(on=db.updated("lists"), coupling="immediate", priority=2, name="vandal" + suffix)
    def vandal(tx, event):
        event.old["value"].append("old")
        event.new["value"].append("new")

    @db.rule(on=db.updated("lists"), coupling="immediate", priority=1, name="witness" + suffix)
    def witness(tx, event):
        seen.append(("immediate", event.old["value"], event.new["value"], tx.read("lists", "k")["value"]))

    @db.rule(on=db.updated("lists"), coupling="deferred", name="later" + suffix)
    def later(tx, event):
        seen.append(("deferred", event.old["value"], event.new["value"], tx.read("lists", "k")["value"]))

    @db.rule(on=db.signalled("append"), coupling="immediate", name="append" + suffix)
    def append(tx, event):
        row = tx.read("lists", "k")
        row["value"].append(event.payload["item"])
        tx.write("lists", "k", value=row["value"])

    try:
        with db.transaction() as tx:
            if relied_first:
                tx.read("lists", "k")
            with tx.subtransaction() as child:
                child.write("lists", "k", value=["a", "b"])
            assert tx.read("lists", "k")["value"] == ["a", "b"]
        assert seen == [("immediate", ["a"], ["a", "b"], ["a", "b"]), ("deferred", ["a"], ["a", "b"], ["a", "b"])]
        assert committed(db, "lists")[("k",)]["value"] == ["a", "b"]
        db.rules.remove("vandal" + suffix)
        with db.transaction() as tx:
            if relied_first:
                tx.read("lists", "k")
            tx.signal("append", item="c")
    finally:
        for name in ("vandal", "witness", "later", "append"):
            if name + suffix in db.rules.names():
                db.rules.remove(name + suffix)
    assert committed(db, "lists")[("k",)]["value"] == ["a", "b", "c"]


def test_the_recorded_history_keeps_a_json_list_read_as_it_was_read(db):
    """The history recorder keeps its own copy of a read's lists too: an append the reader then makes does not
    rewrite the recorded read.  Before, the recorded image shared the list with the reader's."""
    _seed_list(db, ["a"])
    db.history.clear()
    with db.transaction() as tx:
        tx.write("lists", "k", value=["a", "b"])
        tx.read("lists", "k")["value"].append("x")
    reads = [op.value for op in db.history.snapshot()
             if op.kind == "read" and op.table == "lists" and op.source != "committed"]
    assert reads == [{"key": "k", "value": ["a", "b"]}]


def test_an_events_payload_is_the_one_raised_its_lists_and_dicts_too(db):
    """``tx.signal`` and ``tx.emit`` take the payload as it is when the event is raised, its lists and dicts too (as
    a data event's ``new``): the raiser appending to its list afterwards changes nothing a deferred rule sees, and a
    rule appending to the payload's list does not change the raiser's.  Before, only the payload dict was copied:
    the deferred rules saw ['a', 'after'] and {'n': [1, 2]}, and the raiser's list got the rule's 'rule'."""
    seen = []

    @db.rule(on=db.signalled("payload_tagged"), coupling="deferred", name="payload_tagged_later")
    def tagged(tx, event):
        seen.append(("signal", event.payload["tags"]))

    @db.rule(on=db.stream("payload_reading"), coupling="deferred", name="payload_reading_later")
    def reading(tx, event):
        seen.append(("emit", event.payload["tags"], event.payload["doc"]))

    @db.rule(on=db.signalled("payload_vandalised"), coupling="immediate", name="payload_vandal")
    def vandal(tx, event):
        event.payload["tags"].append("rule")

    tags, doc, mine = ["a"], {"n": [1]}, ["a"]
    try:
        with db.transaction() as tx:
            tx.signal("payload_tagged", tags=tags)
            tx.emit("payload_reading", key=1, payload={"tags": tags, "doc": doc})
            tags.append("after")
            doc["n"].append(2)
            tx.signal("payload_vandalised", tags=mine)
            assert mine == ["a"]
    finally:
        for name in ("payload_tagged_later", "payload_reading_later", "payload_vandal"):
            if name in db.rules.names():
                db.rules.remove(name)
    assert seen == [("signal", ["a"]), ("emit", ["a"], {"n": [1]})]


@pytest.mark.parametrize("representation", ["frames", "materialized"])
def test_a_json_list_written_is_the_value_at_the_write(db, representation):
    """``tx.write``, ``tx.insert`` and ``write_many`` take a JSON column's list as it is at the call, as the data
    event's ``new`` does (the events design note: an event's ``new`` is the stored row): the caller appending to its
    list afterwards changes neither a later read, nor what a deferred rule on the change sees, nor the stored row, and
    an append made for a subtransaction that then aborts is not committed.  Before, the write entry kept the caller's
    list: the row was stored as ['a', 'b', 'after'] while the rule had seen ['a', 'b'], and the aborted append was
    committed."""
    _seed_list(db, ["a"])
    seen = []
    name = f"written_list_{representation}"

    @db.rule(on=db.modified("lists"), coupling="deferred", name=name)
    def later(tx, event):
        seen.append((event.key, event.new["value"]))

    db.transactions.subtransactions = activedb.lowlevel.Subtransactions(representation)
    try:
        mine, theirs, many = ["a", "b"], ["x"], ["m"]
        with db.transaction() as tx:
            tx.write("lists", "k", value=mine)
            tx.insert("lists", key="i", value=theirs)
            tx.write_many("lists", {"w": {"value": many}})
            for written in (mine, theirs, many):
                written.append("after")
            assert [tx.read("lists", key)["value"] for key in ("k", "i", "w")] == [["a", "b"], ["x"], ["m"]]
        kept = ["a"]
        with db.transaction() as tx:
            tx.write("lists", "j", value=kept)
            with pytest.raises(RuntimeError, match="abort it"):
                with tx.subtransaction() as child:
                    kept.append("aborted")
                    child.write("lists", "j", value=kept)
                    raise RuntimeError("abort it")
            assert tx.read("lists", "j")["value"] == ["a"]
    finally:
        db.transactions.subtransactions = activedb.lowlevel.Subtransactions.FRAMES
        db.rules.remove(name)
    stored = committed(db, "lists")
    assert {key: stored[(key,)]["value"] for key in ("k", "i", "w", "j")} == {
        "k": ["a", "b"], "i": ["x"], "w": ["m"], "j": ["a"]}
    assert sorted(seen) == [("i", ["x"]), ("j", ["a"]), ("k", ["a", "b"]), ("w", ["m"])]


def _nested_lists(levels):
    value = []
    for _ in range(levels - 1):
        value = [value]
    return value


@pytest.mark.parametrize("call", ["write", "insert", "write_many", "emit", "signal"])
def test_a_value_nested_deeper_than_the_bound_is_refused_where_it_enters_saying_how_deep(db, call):
    """A list of 10,000 nested lists given to ``tx.emit`` (or a JSON column's ``tx.write``) raised RecursionError
    from the copy of its lists (or the JSON check's walk); one of a few hundred levels was taken.  Now a payload's
    field of more than ``JSONABLE_DEPTH`` levels, a column's value of more than ``EXACT_DEPTH``, is refused where it
    enters with ``NestedTooDeep``, which says how deep it is and the bound; one at the bound is taken and copied."""
    from activedb.errors import InvalidValue, NestedTooDeep
    from activedb.store import EXACT_DEPTH, JSONABLE_DEPTH

    _empty(db, "lists")
    bound = JSONABLE_DEPTH if call in ("emit", "signal") else EXACT_DEPTH

    def enter(tx, value):
        if call == "write":
            tx.write("lists", "k", value=value)
        elif call == "insert":
            tx.insert("lists", key="k", value=value)
        elif call == "write_many":
            tx.write_many("lists", {"k": {"value": value}})
        elif call == "emit":
            tx.emit("reading", key="k", payload={"value": value})
        else:
            tx.signal("reading", value=value)

    undone = "; nothing was written" if call in ("write", "insert", "write_many") else ""   # (a column's value)
    for levels in (bound + 1, 10_000):
        with pytest.raises(NestedTooDeep, match=rf"^'value' is a list nested {levels:,} levels deep, deeper than the "
                                                rf"{bound} levels a value may nest; flatten it or store it as "
                                                rf"JSON text{undone}$") as caught:
            db.run(lambda tx: enter(tx, _nested_lists(levels)))
        assert isinstance(caught.value, InvalidValue)
    db.run(lambda tx: enter(tx, _nested_lists(bound)))
    if call in ("write", "insert", "write_many"):
        value, levels = committed(db, "lists")[("k",)]["value"], 1
        while value:
            value, levels = value[0], levels + 1
        assert levels == bound


def test_a_cyclic_value_is_refused_as_nested_too_deep(db):
    """A list that holds itself has no depth: its copy is refused at the bound, and the walk that measures it for
    the message stops, saying so."""
    from activedb.errors import NestedTooDeep

    cyclic = []
    cyclic.append(cyclic)
    with pytest.raises(NestedTooDeep, match=r"^'value' is a list nested deeper than the 100 levels a value may nest "
                                            r"\(it holds itself, or is too large to measure\); flatten it"):
        db.run(lambda tx: tx.emit("reading", key="k", payload={"value": cyclic}))


def test_a_row_stored_deeper_than_a_write_takes_is_read_and_its_event_given(db):
    """The bound is where a value enters: a JSON value another client stored deeper than ``EXACT_DEPTH`` levels is
    read back whole (``tx.read``'s copy is not bounded), and a rule on its update gets it in ``event.old``."""
    from activedb.store import EXACT_DEPTH

    levels = EXACT_DEPTH + 100
    _empty(db, "lists")
    with db.engine.begin() as connection:
        connection.execute(sa.text("INSERT INTO lists (key, value) VALUES ('k', CAST(:value AS jsonb))"),
                           {"value": "[" * levels + "]" * levels})
    seen = []

    @db.rule(on=db.updated("lists"), coupling="immediate", name="deep_old")
    def deep_old(tx, event):
        seen.append(event.old["value"] == _nested_lists(levels))

    try:
        assert db.run(lambda tx: tx.read("lists", "k"))["value"] == _nested_lists(levels)
        db.run(lambda tx: tx.write("lists", "k", value=["flat"]))
    finally:
        db.rules.remove("deep_old")
    assert seen == [True]
