"""The interleaving runner (``activedb.testing.Interleavings``) on a real PostgreSQL: detached firings run by the
outbox are steps of a run too; a deadlock victim is an actor's failure unless expected, and a retry makes it a
pass; a run that depends on something the runner does not control is reported, and so is a thread that
neither pauses nor blocks.  (The planted lost update and its correct version: ``tests/examples/test_orders.py``.)"""

from __future__ import annotations

import ast
import itertools
import re
import threading
import time
from collections.abc import Callable

import pytest
import sqlalchemy as sa

import activedb
from activedb import Coupling, Database, DeadlockDetected, Event, RuleFailed, Transaction
from activedb.testing import (Interleavings, InterleavingHang, InvalidSchedule, NondeterministicRun, Sequencer,
                              Verdict)
from tests.conftest import APP_MIGRATIONS

pytestmark = pytest.mark.activedb(migrations=[APP_MIGRATIONS])


@pytest.fixture
def fresh(activedb_make_url):
    """A database of its own for each test (its rules stay with it), recording its history."""
    database = activedb.connect(activedb_make_url(), record_history=True)
    yield database
    database.close()


@pytest.mark.parametrize("actors, keywords, message", [
    ({}, {}, "at least one actor"), ({"a/b": print}, {}, "one word without '/'"),
    ({5: print}, {}, "one word without '/'"), ({None: print}, {}, "one word without '/'"),
    ([print], {"step_timeout": 0}, r"step_timeout=0\) takes a finite number of seconds above 0"),
    ([print], {"step_timeout": float("inf")}, r"step_timeout=inf\) takes a finite number of seconds above 0"),
    ([print], {"idle_timeout": -1}, r"idle_timeout=-1\) takes a finite number of seconds above 0"),
    ([print], {"idle_timeout": True}, r"idle_timeout=True\) takes a finite number of seconds above 0"),
    ({"A": 5}, {}, r"actor 'A' is 5: give a function"), ([print], {"setup": "reset"}, r"setup='reset'\) takes a function"),
    ([print], {"invariant": True}, r"invariant=True\) takes a function"),
    (print, {}, r"^Interleavings\(actors=<built-in function print>\) takes \{name: actor\} or a list of actors .*, "
                r"not one builtin_function_or_method: give \[actor\]"),
    (None, {}, r"^Interleavings\(actors=None\) takes \{name: actor\} or a list of actors"),
    ("ab", {}, r"^Interleavings\(actors='ab'\) takes \{name: actor\} or a list of actors"),
])
def test_arguments_the_runner_cannot_take_are_an_activedb_error(fresh, actors, keywords, message):
    """No actor or an actor's name with '/' was a bare ValueError (no ActivedbError), an actor named by a number a
    bare TypeError ("argument of type 'int' is not iterable"); a step_timeout of 0 or below failed every run as a
    hang, and inf ended the run's thread with OverflowError from its wait.  An actor that is no function failed each
    run as an actor that raised ("TypeError: 'int' object is not callable"), a setup or invariant that is none the
    exploration with a bare TypeError.  One actor given as itself (not in a list), or None, was a bare TypeError
    ("'function' object is not iterable"); a text was taken letter by letter ("actor 'A1' is 'a'")."""
    with pytest.raises(activedb.BadArgument, match=message):
        Interleavings(fresh, actors, **keywords)


def test_a_runner_given_no_database_says_what_to_give_without_the_urls_password(fresh):
    """``Interleavings(activedb_url, …)`` (the fixture next to ``activedb_db``) or None failed with a bare
    AttributeError ("'str' object has no attribute 'history'"), no ActivedbError and no word of what to give."""
    url = fresh.engine.url.render_as_string(hide_password=False)
    for given in (url, None):
        with pytest.raises(activedb.BadArgument, match=r"^Interleavings\(db=\.\.\.\) takes an activedb.Database "
                                                       r"connected with record_history=True .*, got (str|NoneType)$") \
                as caught:
            Interleavings(given, [print])
        assert fresh.engine.url.password not in str(caught.value)


@pytest.mark.parametrize("expected", [[ValueError], ValueError, (ValueError,), {ValueError}])
def test_expected_errors_given_as_a_list_or_one_class_are_expected(fresh, expected):
    """``expected_errors=[ValueError]`` (a list, not the tuple the signature says) was taken, and the first run in
    which an actor raised failed the whole exploration with isinstance()'s TypeError ('arg 2 must be a type, a
    tuple of types, or a union') instead of a report."""
    def raises(db: Database) -> None:
        raise ValueError("expected here")

    exploration = Interleavings(fresh, [raises], expected_errors=expected).explore(2)
    assert exploration.ok, exploration.describe()


@pytest.mark.parametrize("keywords, message", [
    ({"expected_errors": ["ValueError"]}, r"expected_errors=\['ValueError'\]\) takes exception classes"),
    ({"expected_errors": 5}, r"expected_errors=5\) takes exception classes"),
])
def test_expected_errors_that_are_no_exception_classes_are_refused(fresh, keywords, message):
    with pytest.raises(activedb.BadArgument, match=message):
        Interleavings(fresh, [print], **keywords)


@pytest.mark.parametrize("runs", [0, -1, "3", True, None])
def test_explore_refuses_a_number_of_runs_that_runs_nothing(fresh, runs):
    """``explore(0)`` (or -1) ran no interleaving and reported "0 interleavings passed": assert_ok() passed a test
    that had checked nothing; '3' failed with a TypeError ('<' between int and str)."""
    with pytest.raises(activedb.BadArgument, match=r"explore\(runs=.*\) takes a whole number of at least 1"):
        Interleavings(fresh, [print]).explore(runs)


@pytest.mark.parametrize("seed", ["1", 1.5, True])
def test_explore_refuses_a_seed_that_is_no_whole_number(fresh, seed):
    with pytest.raises(activedb.BadArgument, match=r"explore\(seed=.*\) takes a whole number"):
        Interleavings(fresh, [print]).explore(1, seed=seed)


def test_a_random_seed_is_drawn_and_named_so_the_failure_it_found_can_be_reproduced(fresh):
    """``explore(seed=None)`` seeded the walk at random and reported "interleaving 1 of seed None failed": the
    failing interleaving could not be explored again.  None now draws a whole-number seed, which the exploration
    names and which explores the same interleavings again."""
    def fails(db: Database) -> None:
        raise ValueError("always")

    interleavings = Interleavings(fresh, {"A": fails, "B": insert_item("b")}, setup=one_account)
    drawn = interleavings.explore(3, seed=None, stop_at_failure=False)
    assert isinstance(drawn.seed, int) and not isinstance(drawn.seed, bool), drawn.seed
    assert f"of seed {drawn.seed} failed" in drawn.describe(), drawn.describe()
    again = interleavings.explore(3, seed=drawn.seed, stop_at_failure=False)
    assert [run.schedule for run in again.runs] == [run.schedule for run in drawn.runs]


def one_account(db: Database) -> None:
    with db.engine.begin() as connection:
        connection.execute(sa.text("DELETE FROM items; DELETE FROM accounts; "
                                   "INSERT INTO accounts (id, balance) VALUES (1, 0)"))


def balance(db: Database) -> int:
    with db.engine.connect() as connection:
        return connection.execute(sa.text("SELECT balance FROM accounts WHERE id = 1")).scalar_one()


def insert_item(key: str):
    def actor(db: Database) -> None:
        with db.transaction() as tx:
            tx.insert("items", key=key, value=1)
    return actor


def test_detached_firings_are_steps_of_the_run_and_replay_exactly(fresh):
    @fresh.rule(on=fresh.inserted("items"), coupling=Coupling.DETACHED, name="count_item")
    def count_item(tx: Transaction, event: Event) -> None:
        account = tx.read("accounts", 1, for_update=True)
        tx.write("accounts", 1, balance=account["balance"] + 1)

    def counted(db: Database) -> None:
        assert balance(db) == 2, f"balance {balance(db)} after two items"

    interleavings = Interleavings(fresh, [insert_item("a"), insert_item("b")], setup=one_account, invariant=counted)
    exploration = interleavings.explore(6, seed=2)
    exploration.assert_ok()
    steps = {step for run in exploration.runs for step in run.schedule.steps}
    assert "outbox/rule:count_item: write accounts[1]" in steps and "outbox: begin" in steps, sorted(steps)
    first = exploration.runs[0]
    again = interleavings.replay(first.schedule)        # names included: the same steps, one by one
    assert again.trace == first.trace and again.ok


def read_then_write(tx: Transaction) -> None:
    account = tx.read("accounts", 1)                    # a plain read: two of them meet at the upgrade
    tx.write("accounts", 1, balance=account["balance"] + 1)


def test_a_deadlock_victim_fails_its_actor_unless_expected_and_a_retry_makes_it_pass(fresh):
    def once(db: Database) -> None:
        with db.transaction() as tx:
            read_then_write(tx)

    def both_counted(db: Database) -> None:
        assert balance(db) == 2

    plain = Interleavings(fresh, [once, once], setup=one_account).explore(20, seed=1)
    failure = plain.failure
    assert failure is not None and failure.verdict is Verdict.ACTOR_FAILED, plain.describe()
    assert any(isinstance(error, DeadlockDetected) for error in failure.errors.values())
    expected = Interleavings(fresh, [once, once], setup=one_account,
                             expected_errors=(DeadlockDetected,)).replay(failure.schedule)
    assert expected.ok and expected.trace == failure.trace       # (transaction ids in messages are labels)

    def retried(db: Database) -> None:         # (not db.run: what it learns from a conflict outlives the run)
        for _ in range(5):
            try:
                with db.transaction() as tx:
                    read_then_write(tx)
                return
            except DeadlockDetected:
                continue

    Interleavings(fresh, [retried, retried], setup=one_account, invariant=both_counted).explore(8, seed=1).assert_ok()


def test_an_expected_error_is_accepted_as_the_cause_of_a_rule_s_failure(fresh):
    """Two sibling firings that each read and then write one row deadlock at the upgrade; the actor that set them off
    raises ``RuleFailed`` with the ``DeadlockDetected`` as its cause, which ``expected_errors=(DeadlockDetected,)``
    (as the how-to writes it) accepts."""
    for name in ("first_count", "second_count"):
        fresh.rule(on=fresh.inserted("items"), name=name)(lambda tx, event: read_then_write(tx))

    plain = Interleavings(fresh, [insert_item("a")], setup=one_account).explore(20, seed=1)
    failure = plain.failure
    assert failure is not None and failure.verdict is Verdict.ACTOR_FAILED, plain.describe()
    (error,) = failure.errors.values()
    assert isinstance(error, RuleFailed) and isinstance(error.__cause__, DeadlockDetected), repr(error)
    expected = Interleavings(fresh, [insert_item("a")], setup=one_account,
                             expected_errors=(DeadlockDetected,)).replay(failure.schedule)
    assert expected.ok, expected.describe()


def test_what_an_actor_raised_names_the_run_s_transactions_by_their_labels_in_the_trace_and_the_report(fresh):
    """activedb's messages name a transaction bare ("rule 'refuse' failed on inserted items key='a' in T5", "transaction
    T5.6 was aborted"): the trace's line of what an actor raised kept those ids — which differ from run to run and
    appear nowhere else in the report — since only ids in quotes were replaced by labels; a replay of the failing
    schedule then had another trace than the run it replayed.  The report's own line ("actor A1 raised RuleFailed: …
    in T5") printed the exception whole, with the ids, after the trace had labels: the report keeps that text with
    labels (``RunReport.raised``) beside the exception (``RunReport.errors``, unchanged)."""
    @fresh.rule(on=fresh.inserted("items"), name="refuse")
    def refuse(tx: Transaction, event: Event) -> None:
        raise ValueError(f"no item {event.key} today")

    runner = Interleavings(fresh, [insert_item("a"), insert_item("b")], setup=one_account)
    failure = runner.explore(5, seed=1).failure
    assert failure is not None and failure.verdict is Verdict.ACTOR_FAILED
    traced = [line for line in failure.trace if " raised " in line]
    reported = [line for line in failure.describe().splitlines() if line.startswith("  actor ")]
    for raised in (traced, reported):
        assert raised and all(re.search(r"\bT\d", line) is None for line in raised), raised
        assert any(re.search(r"in A[12]: ValueError", line) for line in raised), raised
    assert set(failure.raised) == set(failure.errors), (failure.raised, failure.errors)
    assert all(isinstance(error, RuleFailed) for error in failure.errors.values()), failure.errors
    again = runner.replay(failure.schedule)
    assert again.trace == failure.trace and again.describe() == failure.describe(), (again.describe(),
                                                                                     failure.describe())


@pytest.mark.parametrize("schedule", [None, 5, ["0", "1"]], ids=["none", "a-number", "a-list"])
def test_replay_of_what_is_no_schedule_is_an_invalid_schedule_and_runs_nothing(fresh, schedule):
    """``replay(None)`` (a number, a list of choices) failed with a bare AttributeError ('NoneType' object has no
    attribute 'choices'), no ActivedbError; replay takes a Schedule or its text, as an InvalidSchedule says."""
    ran = []
    interleavings = Interleavings(fresh, [lambda db: ran.append(1)])
    with pytest.raises(InvalidSchedule, match=r"replay takes a Schedule or its text \('0\.2\.1\.0'; .*got "):
        interleavings.replay(schedule)
    assert ran == []


def test_a_run_that_depends_on_what_the_runner_does_not_control_is_reported(fresh):
    runs = itertools.count()

    def changes_its_mind(db: Database) -> None:
        with db.transaction() as tx:
            tx.write("items", "x" if next(runs) == 0 else "y", value=1)

    interleavings = Interleavings(fresh, [changes_its_mind], setup=one_account)
    first = interleavings.replay("")
    assert first.schedule.steps == ("A1 start", "A1: write items['x']", "A1: commit")
    with pytest.raises(NondeterministicRun, match=r"chose \"A1: write items\['x'\]\" here, the run offers "
                                                  r"\[\"A1: write items\['y'\]\"\]"):
        interleavings.replay(first.schedule)


def test_a_nondeterministic_run_found_by_explore_names_its_interleaving_its_seed_and_the_replay(fresh):
    """A NondeterministicRun met while exploring said only where the steps differed ("after A1 start ; … the runner
    offered …"), not which interleaving of which seed (explore(seed=None) drew one nobody saw) nor how to run that
    prefix again, as a hang's message and a failing run's report say ("replay: interleavings.replay(…)")."""
    runs = itertools.count()

    def changes_its_mind(db: Database) -> None:
        with db.transaction() as tx:
            tx.write("items", "x" if next(runs) == 0 else "y", value=1)

    def steady(db: Database) -> None:
        with db.transaction() as tx:
            tx.write("items", "z", value=1)

    interleavings = Interleavings(fresh, {"A": changes_its_mind, "B": steady}, setup=one_account)
    with pytest.raises(NondeterministicRun) as raised:
        interleavings.explore(30, seed=7)
    message = str(raised.value)
    where = re.match(r"interleaving (\d+) of seed 7: after (.*) the runner offered \[.*RESTART IDENTITY.*\n"
                     r"schedule so far: ([0-9.]+|-)\nreplay: interleavings\.replay\('\3'\)$", message, re.DOTALL)
    assert where is not None and int(where.group(1)) > 1, message
    again = interleavings.replay(where.group(3))           # the printed prefix runs to the point reported
    prefix = where.group(2).split(" ; ")
    assert list(again.schedule.steps[:len(prefix)]) == prefix, (again.describe(), message)


def test_a_generated_key_setup_does_not_restart_is_reported_saying_what_to_restore(fresh):
    def seen(db: Database) -> None:
        with db.transaction() as tx:
            tx.insert("events_seen", rule="actor")          # an identity key: 1 on the first run, 2 on the next

    def no_rows(db: Database) -> None:
        with db.engine.begin() as connection:
            connection.execute(sa.text("DELETE FROM events_seen"))     # (not RESTART IDENTITY)

    interleavings = Interleavings(fresh, [seen], setup=no_rows)
    first = interleavings.replay("")
    with pytest.raises(NondeterministicRun, match=r"RESTART IDENTITY"):
        interleavings.replay(first.schedule)

    def restarted(db: Database) -> None:            # what the error says: each run then writes events_seen[1]
        with db.engine.begin() as connection:
            connection.execute(sa.text("TRUNCATE events_seen RESTART IDENTITY"))

    interleavings = Interleavings(fresh, [seen], setup=restarted)
    first = interleavings.replay("")
    assert first.ok and "A1: write events_seen[1]" in first.schedule.steps, first.describe()
    again = interleavings.replay(first.schedule)
    assert again.ok, again.describe()


def _hang_of_an_actor_waiting_outside_the_run(db: Database, step_timeout: float = 3.0) -> str:
    """The message of the InterleavingHang of a run whose one actor, W, writes and then waits for the test.

    ``step_timeout`` bounds W's first steps too (its write is its first statement on ``items``): 1 s was not enough
    on a busy CI machine, where W was called hung before it reached the write the callers look for."""
    released = threading.Event()

    def waits_for_the_test(db: Database) -> None:
        with db.transaction() as tx:
            tx.write("items", "x", value=1)
            released.wait(60)                           # not a wait the runner can see (a write needs no round trip)

    try:
        with pytest.raises(InterleavingHang) as hang:
            Interleavings(db, {"W": waits_for_the_test}, setup=one_account, step_timeout=step_timeout).replay("")
    finally:
        released.set()
    message = str(hang.value)
    assert f"W neither paused at a step nor blocked within {step_timeout} s" in message, message
    return message


def test_a_thread_that_neither_pauses_nor_blocks_is_a_hang_with_what_each_transaction_did(fresh):
    message = _hang_of_an_actor_waiting_outside_the_run(fresh)
    assert "steps:\n  W start\n  W: write items['x']" in message and "wait-for graph:" in message


def test_a_hangs_steps_are_those_of_the_run_not_what_its_clean_up_did(fresh):
    """The hang's steps were read after the clean-up, which appends to them (the abort of W's tree: "W aborted"):
    the report showed as the run's a step the run never took.  They are copied before the clean-up now."""
    message = _hang_of_an_actor_waiting_outside_the_run(fresh)
    steps = message.split("\nsteps:\n", 1)[1].split("\ntransactions:", 1)[0]
    assert steps == "  W start\n  W: write items['x']", message


def test_a_hang_of_two_stuck_actors_is_reported_after_one_timeout_to_find_it_and_one_to_clean_up(fresh):
    """The clean-up after a hang waited ``step_timeout`` for each tree's abort and then again for the actors, and
    ran twice (as the hang was described, then on the run's way out), waiting for the stuck actors again: two actors
    stuck outside the run were reported after three times the timeout or more.  The clean-up runs once and has
    ``step_timeout`` in all now: the hang comes after about twice the timeout, however many actors are stuck (the
    bound below leaves a loaded machine six seconds more; the old clean-up took three timeouts, 24 s)."""
    released = threading.Event()

    def waits_for_the_test(key: str) -> Callable[[Database], None]:
        def actor(db: Database) -> None:
            with db.transaction() as tx:
                tx.write("items", key, value=1)
                released.wait(60)                       # not a wait the runner can see
        return actor

    step_timeout = 8.0
    started = time.monotonic()
    try:
        with pytest.raises(InterleavingHang) as hang:
            Interleavings(fresh, {"V": waits_for_the_test("v"), "W": waits_for_the_test("w")}, setup=one_account,
                          step_timeout=step_timeout).replay("")
        took = time.monotonic() - started
    finally:
        released.set()
    assert "neither paused at a step nor blocked within 8.0 s" in str(hang.value), hang.value
    assert took < 2 * step_timeout + 6, f"the hang was reported after {took:.1f} s, step_timeout {step_timeout} s"


def test_a_hang_found_by_explore_names_its_interleaving_its_seed_and_the_replay_that_hangs_again(fresh):
    """A hang met while exploring said "schedule so far: 0.0" and nothing else of where it was: neither which
    interleaving of which seed (explore(seed=None) drew one nobody saw) nor how to run it again, as a failing run's
    report says ("replay: interleavings.replay(…)")."""
    released = threading.Event()

    def waits_for_the_test(db: Database) -> None:
        with db.transaction() as tx:
            tx.write("items", "x", value=1)
            released.wait(60)                           # not a wait the runner can see

    interleavings = Interleavings(fresh, {"W": waits_for_the_test}, setup=one_account, step_timeout=3.0)
    try:
        with pytest.raises(InterleavingHang) as hang:
            interleavings.explore(3, seed=7)
        message = str(hang.value)
        found = re.search(r"replay: interleavings\.replay\('([0-9.]+|-)'\)", message)
        assert message.startswith("interleaving 1 of seed 7 hung: ") and found, message
        released.set()
        released.clear()
        with pytest.raises(InterleavingHang) as again:           # the schedule runs into the same hang
            interleavings.replay(found.group(1))
        assert f"schedule so far: {found.group(1)}\n" in str(again.value), str(again.value)
    finally:
        released.set()


def test_a_rule_blocked_outside_the_run_is_a_hang_although_its_tree_cannot_be_aborted(fresh):
    """The clean-up's abort of a tree waits for its children; a rule firing blocked on something outside the run
    never ends, so the tree is abandoned after ``step_timeout`` and the run reports the hang (it waited for ever)."""
    released = threading.Event()

    def blocks(tx: Transaction, event: Event) -> None:
        released.wait()                                 # never set until the run has ended

    for name in ("blocks_one", "blocks_two"):       # (one priority: a group of children, run on threads)
        fresh.rule(on=fresh.stream("stuck"), coupling=Coupling.IMMEDIATE, name=name)(blocks)

    def emits(db: Database) -> None:
        with db.transaction() as tx:
            tx.emit("stuck", key=1)

    try:
        with pytest.raises(InterleavingHang) as hang:
            Interleavings(fresh, {"E": emits}, setup=one_account, step_timeout=2.0).replay("")
    finally:
        released.set()
    message = str(hang.value)
    assert "neither paused at a step nor blocked within 2.0 s" in message, message


def test_an_invariant_that_raises_another_error_breaks_the_run_that_names_its_schedule(fresh):
    """The how-to's invariant "raises (or returns False) when broken", and its example reads with ``.one()``, which
    raises NoResultFound when the row is gone: an invariant raising anything but an AssertionError escaped
    explore() and replay() as itself — no interleaving, no schedule, no replay, the exploration lost."""
    def no_row_left(db: Database) -> None:
        with db.engine.connect() as connection:
            connection.execute(sa.text("SELECT balance FROM accounts WHERE id = 2")).one()

    interleavings = Interleavings(fresh, [insert_item("a")], setup=one_account, invariant=no_row_left)
    exploration = interleavings.explore(3, seed=1)
    failure = exploration.failure
    assert failure is not None and failure.verdict is Verdict.INVARIANT_BROKEN, exploration.describe()
    assert failure.invariant is not None and failure.invariant.startswith("NoResultFound: "), failure.invariant
    assert "replay: interleavings.replay(" in exploration.describe()
    again = interleavings.replay(failure.schedule)
    assert again.verdict is Verdict.INVARIANT_BROKEN and again.trace == failure.trace


def test_a_detached_rule_the_setup_fired_that_never_returns_is_a_hang_that_prints_the_graph(fresh):
    """The runner waits for what the setup fired before a run starts: that wait was db.rules.wait_idle()'s default
    30 s, and its end a bare TimeoutError ("1 detached rule firing(s) still queued or running after 30.0 s") — not
    an InterleavingHang, neither the setup named nor the wait-for graph printed.  Now it is the run's hang, saying
    so, after ``idle_timeout`` (30 s unless given: a test waited for the whole default)."""
    released = threading.Event()

    @fresh.rule(on=fresh.inserted("items"), coupling=Coupling.DETACHED, name="never_returns")
    def never_returns(tx: Transaction, event: Event) -> None:
        released.wait(60)

    def setup(db: Database) -> None:
        one_account(db)
        with db.transaction() as tx:
            tx.insert("items", key="s", value=1)

    try:
        with pytest.raises(InterleavingHang) as hang:
            Interleavings(fresh, [insert_item("a")], setup=setup, step_timeout=3.0, idle_timeout=2.0).replay("")
        assert not released.is_set()
    finally:
        released.set()
    message = str(hang.value)
    assert "interleaving hung: before the run, what the setup fired did not finish" in message, message
    assert "1 detached rule firing(s) still queued or running after 2.0 s" in message, message
    assert "wait-for graph:" in message, message
    # (it ended with the graph: no schedule, no replay, as every other hang's report ends)
    hint = re.search(r"\nschedule so far: -\nreplay: interleavings\.replay\(('')\)$", message)
    assert hint is not None, message
    again = Interleavings(fresh, [insert_item("a")], setup=setup, step_timeout=3.0, idle_timeout=30.0)
    assert again.replay(ast.literal_eval(hint.group(1))).ok      # the rule released: the hint's replay runs


def test_a_thread_holding_the_graph_mutex_is_a_hang_saying_so_not_a_run_that_waits_for_it(fresh, monkeypatch):
    """The runner's watching (``_settle``, between steps) read the wait-for graph without a bound: a thread that
    hung holding the lock manager's graph mutex hung the run — the watchdog printed the stacks and the run went on
    waiting.  Now the read is bounded by ``step_timeout`` and the run fails as a hang that says what it could not
    read.  (The actor holds the real mutex, outside its transactions, until the test ends.)"""
    from lockmgr import testing as lockmgr_testing

    monkeypatch.setattr(lockmgr_testing, "DIAGNOSTIC_SECONDS", 0.2)     # (the hang's own reads of the graph)
    released = threading.Event()
    locks = fresh.transactions.locks

    def holds_the_graph_mutex(db: Database) -> None:
        with db.transaction() as tx:
            tx.write("items", "x", value=1)
        with locks._graph_mutex:                        # as a hung thread of the lock manager would
            released.wait(30)

    try:
        with pytest.raises(InterleavingHang) as hang:
            # (step_timeout bounds the graph's read, and also each step: 1 s was too little for W's first step on a
            # busy machine, seen once in CI)
            Interleavings(fresh, {"W": holds_the_graph_mutex}, setup=one_account, step_timeout=3.0).replay("")
        assert not released.is_set()
    finally:
        released.set()
    message = str(hang.value)
    assert "could not read the lock manager's wait-for graph within 3.0 s" in message, message
    assert "steps:\n  W start\n  W: write items['x']\n  W: commit" in message, message


@pytest.mark.parametrize("graph", ["raises", "is held"])
def test_a_hang_whose_description_fails_or_waits_is_still_the_hang_within_a_bound(fresh, monkeypatch, graph):
    """The runner's description of a hang read the wait-for graph (under the lock manager's graph mutex) without a
    bound and unguarded, as it did the clean-up and the transactions' states: a graph read that raised replaced the
    InterleavingHang by its own error, and one that waited (a hung thread holding the graph mutex) hung the run.  Now
    each part that fails or is not done within ``lockmgr.testing.DIAGNOSTIC_SECONDS`` is a line of the hang's
    message.  (The graph read fails only where the hang is described: the run's own watching reads it as usual.)"""
    import sys

    from lockmgr import testing as lockmgr_testing

    if graph == "is held":      # (a raising read keeps the default bound: a busy machine may not run it in 0.2 s)
        monkeypatch.setattr(lockmgr_testing, "DIAGNOSTIC_SECONDS", 0.2)
    released = threading.Event()
    locks = fresh.transactions.locks
    read = locks.wait_for_graph

    def describing_fails(timeout=None):
        if sys._getframe(1).f_code.co_name != "_settle":    # (the run's watching reads it as usual)
            if graph == "raises":
                raise RuntimeError("the graph broke")
            released.wait(30)                           # as behind a hung thread holding the graph mutex
        return read(timeout)

    monkeypatch.setattr(locks, "wait_for_graph", describing_fails)
    try:
        message = _hang_of_an_actor_waiting_outside_the_run(fresh)
    finally:
        released.set()
    assert "steps:\n  W start\n  W: write items['x']" in message, message
    said = ("could not read the wait-for graph: RuntimeError('the graph broke')" if graph == "raises"
            else "could not read the wait-for graph within 0.2 s")
    assert said in message, message


def test_a_detached_update_two_actors_lose_is_found_and_its_printed_replay_loses_it_again(fresh):
    """Two actors' detached firings run as members of one outbox group when both triggers committed before the group
    runner takes its ready firings: a member that reads committed data outside its transaction (``db.engine``) then
    misses the other member's write, not yet flushed.  The runner let the group runner take the first actor's firing
    before any other step, so that order never ran and the lost update was never found; taking the ready firings is
    a step of the run now."""
    @fresh.rule(on=fresh.inserted("items"), coupling=Coupling.DETACHED, name="count_item")
    def count_item(tx: Transaction, event: Event) -> None:
        with fresh.engine.connect() as connection:      # the mistake: committed data, outside the transaction
            seen = connection.execute(sa.text("SELECT balance FROM accounts WHERE id = 1")).scalar_one()
        tx.write("accounts", 1, balance=seen + 1)

    def counted(db: Database) -> None:
        assert balance(db) == 2, f"balance {balance(db)} after two items"

    interleavings = Interleavings(fresh, [insert_item("a"), insert_item("b")], setup=one_account, invariant=counted)
    exploration = interleavings.explore(40, seed=1)
    failure = exploration.failure
    assert failure is not None and failure.verdict is Verdict.INVARIANT_BROKEN, exploration.describe()
    assert "balance 1 after two items" in exploration.describe(), exploration.describe()
    printed = re.search(r"replay: interleavings\.replay\('([0-9.\-]*)'\)", exploration.describe())
    assert printed is not None, exploration.describe()
    again = interleavings.replay(printed.group(1))
    assert again.verdict is Verdict.INVARIANT_BROKEN and again.trace == failure.trace, again.describe()



def test_a_top_level_transaction_a_detached_rule_opens_is_part_of_the_run_not_a_hang(fresh):
    """A detached rule that writes in a top-level transaction of its own (``with db.transaction()`` inside the rule:
    an audit row that stays whatever becomes of the firing) was reported as an ``InterleavingHang`` on the first run
    ("every transaction of the run waits and none can go on") while that transaction ran: only a top-level
    transaction begun in an actor's thread was the run's, so this one's steps were never offered, and the rule's
    wait for it (the lock manager's nested top-level edge) counted as a wait for something outside the run.  It is
    a transaction of the run now, named after the one that opened it."""
    @fresh.rule(on=fresh.inserted("items"), coupling=Coupling.DETACHED, name="count_item")
    def count_item(tx: Transaction, event: Event) -> None:
        with fresh.transaction() as audit:              # committed whatever becomes of the firing
            audit.insert("pairs", a=1 if event.key == "a" else 2, b=0, value=event.key)
        account = tx.read("accounts", 1, for_update=True)
        tx.write("accounts", 1, balance=account["balance"] + 1)

    def setup(db: Database) -> None:
        one_account(db)
        with db.engine.begin() as connection:
            connection.execute(sa.text("DELETE FROM pairs"))

    def counted(db: Database) -> None:
        with db.engine.connect() as connection:
            audited = connection.execute(sa.text("SELECT count(*) FROM pairs")).scalar_one()
        assert (balance(db), audited) == (2, 2), f"balance {balance(db)}, {audited} audit rows after two items"

    interleavings = Interleavings(fresh, [insert_item("a"), insert_item("b")], setup=setup, invariant=counted,
                                  step_timeout=10.0)
    exploration = interleavings.explore(10, seed=1)
    exploration.assert_ok()
    steps = {step for run in exploration.runs for step in run.schedule.steps}
    assert "outbox/rule:count_item (top-level): write pairs[1, 0]" in steps, sorted(steps)
    first = exploration.runs[0]
    again = interleavings.replay(first.schedule)
    assert again.trace == first.trace and again.ok, again.describe()


def test_a_detached_rule_that_fails_for_good_fails_the_run_naming_the_rule_and_the_event(fresh):
    """A detached rule that raised was recorded failed in the outbox, and the run passed: no actor raised, and an
    invariant that does not look at what the rule was to do sees nothing — ``explore(...).assert_ok()`` passed a
    test whose rule divided by zero on every event.  A firing of the run that the outbox records as failed for good
    fails the run now (``Verdict.RULE_FAILED``), naming the rule, the event and the error; ``expected_errors``
    accepts it when the rule's error is (or was caused by) one of them."""
    @fresh.rule(on=fresh.inserted("items"), coupling=Coupling.DETACHED, name="broken")
    def broken(tx: Transaction, event: Event) -> None:
        raise ZeroDivisionError(f"no count for {event.key}")

    exploration = Interleavings(fresh, [insert_item("a")], setup=one_account).explore(3, seed=1)
    failure = exploration.failure
    assert failure is not None and failure.verdict is Verdict.RULE_FAILED, exploration.describe()
    assert re.search(r"^  rule 'broken' failed on inserted items key='a' in A1: ZeroDivisionError\('no count for a'\)$",
                     exploration.describe(), re.M), exploration.describe()
    expected = Interleavings(fresh, [insert_item("a")], setup=one_account,
                             expected_errors=(ZeroDivisionError,)).replay(failure.schedule)
    assert expected.ok, expected.describe()


def test_a_sequencer_in_the_actors_is_a_hang_that_says_the_runner_orders_the_steps_itself(fresh):
    """A user who had ordered two threads with ``Sequencer`` (or ``wait_until``) in a test, as the kit's other tools
    do, and gave those functions to the runner as actors met an ``InterleavingHang`` saying only that the waiting
    actor "neither paused at a step nor blocked": nothing said that the wait was the actor's own ordering, which the
    runner cannot see and does not need.  The message now says so, and what to do instead."""
    sequence = Sequencer(timeout=30)

    def first(db: Database) -> None:
        with sequence(0):
            insert_item("a")(db)

    def second(db: Database) -> None:
        with sequence(1):
            insert_item("b")(db)

    with pytest.raises(InterleavingHang) as hang:
        Interleavings(fresh, {"A1": first, "A2": second}, setup=one_account, step_timeout=10.0).replay("0.1")
    message = str(hang.value)
    assert "A2 (outside a transaction) neither paused at a step nor blocked within 10.0 s" in message, message
    assert ("a wait for another thread of the run (a Sequencer, wait_until or an event in an actor: the runner orders "
            "the steps itself — drop it, and replay(schedule) for one order)") in message, message


@pytest.mark.parametrize("schedule, says", [
    ("0.x.1", r"not a schedule: '0\.x\.1' \(expected choices like '0\.2\.1\.0'\)"),
    ("7", r"choice 7 of the schedule, but the run offers 2 step\(s\): \['A1 start', 'A2 start'\]"),
], ids=["not-numbers", "a-choice-beyond-the-steps"])
def test_replay_of_a_schedule_text_this_run_cannot_follow_is_an_invalid_schedule_and_runs_no_actor(fresh, schedule,
                                                                                                   says):
    """A schedule's text that is no choices, or a choice beyond the steps the run offers (a schedule of another
    run, say), is refused before any actor's step runs."""
    ran = []
    interleavings = Interleavings(fresh, {"A1": lambda db: ran.append("A1"), "A2": lambda db: ran.append("A2")})
    with pytest.raises(InvalidSchedule, match=says):
        interleavings.replay(schedule)
    assert ran == []
