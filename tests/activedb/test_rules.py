"""ECA rules: the six coupling modes, deferred cycles, priorities, cascades, the registry.

Each coupling-mode test records the history, turns it into ACTA begin/commit/abort
events and checks the mode's dependencies with ``coupling.check_dependencies``;
what each mode allows is shown with the recorded history, never with sleeps: immediate rules run
inside the trigger's body, deferred ones after it, and the detached family — recorded in the outbox
with the trigger's outcome, so that each firing runs exactly once — after the trigger's outcome is
durable.
"""

from __future__ import annotations

import functools
import logging
import re
import sys
import threading
import warnings

import pytest
import sqlalchemy as sa

from activedb import lowlevel
import activedb
from activedb import Coupling, Observer, testing
from activedb.errors import CascadeLimitExceeded, RuleError, RuleFailed, UnknownTable
from activedb.rules import Firing, FiringOutcome, RuleContext
from coupling import HistoryEvent, check_dependencies, dependencies_for
from lockmgr.testing import Watchdog, wait_until

WAIT = 20


@pytest.fixture
def db(migrated):
    database = activedb.connect(migrated, record_history=True)
    with database.engine.begin() as connection:
        connection.execute(sa.text("TRUNCATE accounts, items, pairs, events_seen, activedb_rules"))
        connection.execute(sa.text("INSERT INTO accounts (id, balance) VALUES (1, 100)"))
    yield database
    database.rules.wait_idle(WAIT)
    database.close()


def acta_history(db) -> list[HistoryEvent]:
    events = []
    for op in db.history.snapshot():
        if op.kind in ("begin", "commit", "abort"):
            events.append(HistoryEvent(op.transaction, op.kind, op.sequence))
    return events


def sequence_of(db, transaction: str, kind: str) -> int | None:
    for op in db.history.snapshot():
        if op.transaction == transaction and op.kind == kind:
            return op.sequence
    return None


def effect_committed(db) -> bool:
    with db.engine.connect() as connection:
        return connection.execute(sa.text("SELECT count(*) FROM items WHERE key = 'effect'")).scalar() == 1


def trigger_committed(db) -> bool:
    with db.engine.connect() as connection:
        return connection.execute(sa.text("SELECT balance FROM accounts WHERE id = 1")).scalar() == 50


class TriggerAborts(Exception):
    pass


MODES = list(Coupling)
OUTCOMES = ["trigger commits", "trigger aborts", "rule fails"]


@pytest.mark.parametrize("outcome", OUTCOMES)
@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.value)
def test_coupling_mode_dependencies(db, mode, outcome):
    rule_transactions: list[str] = []
    body_finished = threading.Event()
    observations = {}

    @db.rule(on=db.updated("accounts"), coupling=mode)
    def effect(tx, event):
        rule_transactions.append(tx.id)
        observations["after_body"] = body_finished.is_set()
        tx.write("items", "effect", value=event.new["balance"])
        if outcome == "rule fails":
            raise ValueError("the rule's action fails")

    trigger_id = None
    raised = None
    try:
        with db.transaction() as tx:
            trigger_id = tx.id
            tx.write("accounts", 1, balance=50)
            body_finished.set()
            if outcome == "trigger aborts":
                raise TriggerAborts()
    except (TriggerAborts, RuleFailed) as error:
        raised = error
    db.rules.wait_idle(WAIT)

    # What the mode's dependencies must produce, per outcome.
    if mode.runs_as_subtransaction:
        expect_trigger = outcome == "trigger commits"
        expect_effect = outcome == "trigger commits"
        if outcome == "rule fails":
            assert isinstance(raised, RuleFailed) and raised.rule == "effect"
    else:
        expect_trigger = outcome != "trigger aborts"
        rule_ok = outcome != "rule fails"
        expect_effect = rule_ok and {
            Coupling.DETACHED: True,
            Coupling.DETACHED_CAUSALLY_DEPENDENT: outcome == "trigger commits",
            Coupling.SEQUENTIAL_CAUSALLY_DEPENDENT: outcome == "trigger commits",
            Coupling.EXCLUSIVE_CAUSALLY_DEPENDENT: outcome == "trigger aborts",
        }[mode]
        if outcome == "rule fails" and mode is not Coupling.SEQUENTIAL_CAUSALLY_DEPENDENT:
            assert raised is None      # a detached rule's failure never touches its trigger
    assert trigger_committed(db) is expect_trigger
    assert effect_committed(db) is expect_effect

    if mode is Coupling.DEFERRED and rule_transactions:
        assert observations["after_body"], "a deferred rule runs after the trigger's body"
    if mode is Coupling.IMMEDIATE:
        assert observations["after_body"] is False, "an immediate rule runs right away"
    if mode is Coupling.SEQUENTIAL_CAUSALLY_DEPENDENT and outcome == "trigger aborts":
        assert rule_transactions == []          # never began
    if mode.runs_as_top_level:
        # Recorded with the trigger's outcome, run from the record: it begins once that outcome is durable.
        trigger_end = sequence_of(db, trigger_id, "commit") or sequence_of(db, trigger_id, "abort")
        for dependent in rule_transactions:
            assert sequence_of(db, dependent, "begin") > trigger_end

    history = acta_history(db)
    for dependent in rule_transactions:
        dependencies = dependencies_for(mode, dependent, trigger_id)
        assert check_dependencies(history, dependencies, strict=True) == [], (mode, outcome)
    testing.check_history(db.history.snapshot()).assert_ok()


def test_action_sequential_causally_dependent_runs_in_parallel_and_needs_true(db):
    condition_may_return = threading.Event()
    action_started = threading.Event()
    results = {}

    def condition(tx, event):
        assert action_started.wait(WAIT), "the action starts before the condition finishes"
        condition_may_return.wait(WAIT)
        return event.new["balance"] < 75

    @db.rule(on=db.updated("accounts"), when=condition, action_coupling=Coupling.SEQUENTIAL_CAUSALLY_DEPENDENT)
    def act(tx, event):
        action_started.set()
        tx.write("items", f"act{event.new['balance']}", value=event.new["balance"])

    condition_may_return.set()
    with db.transaction() as tx:
        tx.write("accounts", 1, balance=50)      # condition true: the action commits
    with db.transaction() as tx:
        action_started.clear()
        tx.write("accounts", 1, balance=90)      # condition false: the action aborts
    with db.engine.connect() as connection:
        keys = {row[0] for row in connection.execute(sa.text("SELECT key FROM items"))}
    assert keys == {"act50"}
    counters = db.rules.statistics().per_rule["act"]
    assert counters.fired == 2 and counters.condition_false == 1


@pytest.mark.parametrize("holds", [True, False], ids=["condition true", "condition false"])
def test_a_deferred_firing_raised_by_a_parallel_action_runs_only_if_the_action_commits(db, holds):
    """A deferred rule with C-A sequential causally dependent coupling: its action, running beside its condition,
    signals an event with a deferred rule on it, then the condition returns.  That deferred firing joins the queue the
    deferred rule came from (the next cycle) — only if the action commits: a condition returning false aborts the
    action, its write and its signal with it, and the firing of an event that never happened must not run.  It ran
    (the action's firing went straight to the owner's queue, which an aborted action does not own), so 'late' was
    written though 'action' was not.  The condition waits until the action has signalled (an event)."""
    signalled = threading.Event()

    def condition(tx, event):
        assert signalled.wait(WAIT), "the action signals before the condition returns"
        return holds

    @db.rule(on=db.signalled("checked"), coupling=Coupling.DEFERRED, when=condition,
             action_coupling=Coupling.SEQUENTIAL_CAUSALLY_DEPENDENT, name="checked")
    def checked(tx, event):
        tx.write("items", "action", value=1)
        tx.signal("late")
        signalled.set()

    @db.rule(on=db.signalled("late"), coupling=Coupling.DEFERRED, name="late")
    def late(tx, event):
        tx.write("items", "late", value=1)

    with Watchdog(WAIT, db.transactions.locks):
        with db.transaction() as tx:
            tx.signal("checked")
    with db.engine.connect() as connection:
        keys = set(connection.execute(sa.text("SELECT key FROM items")).scalars())
    assert keys == ({"action", "late"} if holds else set())


def test_action_sequential_causally_dependent_firings_leave_nothing_in_the_gate(db):
    """Every C-A sequential causally dependent firing registers its condition and action in the coupling gate; once
    both ended, nothing of them stays there (the gate keeps an ended transaction's outcome until told to forget it),
    whatever the condition returned or raised — else a long-running process keeps two outcomes per firing for ever."""
    def condition(tx, event):
        if event.new["balance"] == 13:
            raise ValueError("unlucky")
        return event.new["balance"] < 75

    @db.rule(on=db.updated("accounts"), when=condition, action_coupling=Coupling.SEQUENTIAL_CAUSALLY_DEPENDENT)
    def act(tx, event):
        tx.write("items", f"act{event.new['balance']}", value=event.new["balance"])

    for balance in (50, 90, 60, 95):
        with db.transaction() as tx:
            tx.write("accounts", 1, balance=balance)
    with pytest.raises(RuleFailed, match="unlucky"):
        with db.transaction() as tx:
            tx.write("accounts", 1, balance=13)
    statistics = db.rules.gate.statistics()
    assert (statistics.committed, statistics.aborted) == (2, 3)      # the gate did decide every firing
    assert (statistics.dependents, statistics.retained_outcomes) == (0, 0), statistics


def test_a_parallel_firing_whose_condition_raises_fails_with_the_condition_s_error_even_if_the_action_raised(db):
    """C-A sequential causally dependent: a condition that raises fails the firing with its error, as under immediate
    C-A coupling (rules README) — the action, begun in parallel, also raised (it ran on an event its condition was to
    rule out), and the firing failed with the action's error, which hid why the firing did not run."""
    def condition(tx, event):
        raise KeyError("the condition broke")

    @db.rule(on=db.signalled("go"), when=condition, action_coupling=Coupling.SEQUENTIAL_CAUSALLY_DEPENDENT)
    def act(tx, event):
        raise ValueError("the action broke")

    with pytest.raises(RuleFailed) as raised:
        with db.transaction() as tx:
            tx.signal("go")
    assert "the condition broke" in str(raised.value) and isinstance(raised.value.__cause__, KeyError), raised.value
    assert db.rules.gate.statistics().dependents == 0


def test_a_parallel_firing_whose_condition_is_false_is_condition_false_even_if_the_action_raised(db, caplog):
    """C-A sequential causally dependent: the action, begun in parallel, raised on an event its condition rules out —
    it could never have committed, so the firing is condition_false (the action's error logged at DEBUG with the rule's
    name), not a failure; before, the trigger's operation raised RuleFailed with the action's error."""
    @db.rule(on=db.signalled("go"), when=lambda tx, event: False,
             action_coupling=Coupling.SEQUENTIAL_CAUSALLY_DEPENDENT)
    def guarded(tx, event):
        raise ValueError("the action broke")

    with caplog.at_level(logging.DEBUG, logger="activedb.rules"):
        with db.transaction() as tx:
            tx.signal("go")
    counters = db.rules.statistics().per_rule["guarded"]
    assert (counters.fired, counters.condition_false, counters.executed, counters.failed) == (1, 1, 0, 0), counters
    assert any(record.levelno == logging.DEBUG and "'guarded'" in record.getMessage()
               and "the action broke" in record.getMessage() for record in caplog.records), caplog.text
    assert db.rules.gate.statistics().dependents == 0


@pytest.mark.parametrize("doomed_at", ["firing start", "condition spawned"])
def test_a_parallel_firing_whose_tree_is_doomed_before_its_parts_start_leaves_nothing_in_the_gate(db, doomed_at):
    """C-A sequential causally dependent coupling registers the condition and the action in the coupling gate before
    either is spawned; a tree doomed meanwhile (another thread's lowlevel.abandon at an ingestion's deadline, here done
    by an observer at that moment) refuses the spawn of the parts that did not start.  Their ends are still reported
    and forgotten: else the action's record and the condition's outcome stay in the gate for ever, per such firing."""
    class Doom(activedb.Observer):
        def on_firing_start(self, transaction, firing):
            if doomed_at == "firing start":
                lowlevel.doom(transaction, TimeoutError("deadline passed"))

        def on_spawn(self, parent, child):
            if doomed_at == "condition spawned" and (child.name or "").startswith("condition:"):
                lowlevel.doom(parent, TimeoutError("deadline passed"))

    db.observe(Doom())

    @db.rule(on=db.updated("accounts"), when=lambda tx, event: True,
             action_coupling=Coupling.SEQUENTIAL_CAUSALLY_DEPENDENT)
    def act(tx, event):
        tx.write("items", "act", value=1)

    with pytest.raises(RuleFailed, match="deadline passed"):
        with db.transaction() as tx:
            tx.write("accounts", 1, balance=5)
    statistics = db.rules.gate.statistics()
    assert (statistics.dependents, statistics.retained_outcomes) == (0, 0), statistics


def test_a_firing_whose_wait_for_its_parallel_action_is_the_victim_fails_without_running_the_action_again(db):
    """C-A sequential causally dependent coupling, a real cycle through the firing's own wait: tree B holds y and waits
    for x, which the condition wrote (retained by the firing once the condition committed); the action waits for y.
    The firing's wait for the action closes the cycle and is its victim, the action still waiting: the firing fails
    with the deadlock and the action ran once — never again beside its live first run (as when the action itself
    gave way, aborted).  Events and lock-manager state waits, under a watchdog."""
    locks = db.transactions.locks
    action_started, x_written, b_holds_y, b_done = (threading.Event() for _ in range(4))
    runs, outcome = [], {}

    def condition(tx, event):
        assert action_started.wait(WAIT)
        tx.write("items", "x", value=1)
        x_written.set()
        wait_until(lambda: locks.statistics().waiting == 2, WAIT, "B waiting for x and the action for y")
        return True

    @db.rule(on=db.signalled("go"), when=condition, action_coupling=Coupling.SEQUENTIAL_CAUSALLY_DEPENDENT)
    def act(tx, event):
        runs.append(tx.id)
        action_started.set()
        if len(runs) == 1:           # (a second run, as the code before the fix made, goes straight to y)
            wait_until(lambda: locks.statistics().waiting == 1, WAIT, "B waiting for x")
        tx.write("items", "y", value=1)

    def tree_b():
        try:
            with db.transaction(name="B") as tx:
                tx.write("items", "y", value=2)
                b_holds_y.set()
                assert x_written.wait(WAIT)
                tx.write("items", "x", value=2)               # waits for the condition's x
            outcome["B"] = "committed"
        except BaseException as error:                         # reported below
            outcome["B"] = error
        finally:
            b_done.set()

    thread = threading.Thread(target=tree_b)
    thread.start()
    assert b_holds_y.wait(WAIT)
    with Watchdog(WAIT * 3, locks):
        with pytest.raises(RuleFailed) as raised:
            with db.transaction(name="T") as tx:
                tx.signal("go")
        assert b_done.wait(WAIT)
        thread.join(WAIT)
    deadlock = raised.value.__cause__
    assert isinstance(deadlock, activedb.DeadlockDetected), raised.value
    [firing] = {edge.waiter for edge in deadlock.cycle if edge.kind == "commit"}
    assert deadlock.victim == firing, deadlock           # the firing's wait, not the action's request
    assert len(runs) == 1, runs
    assert outcome["B"] == "committed"
    with db.engine.connect() as connection:
        assert dict(connection.execute(sa.text("SELECT key, value FROM items WHERE key IN ('x', 'y')")).all()) == \
            {"x": 2, "y": 2}


def test_deferred_cycles_run_in_order(db):
    order = []

    @db.rule(on=db.signalled("s0"), coupling="deferred")
    def first(tx, event):
        order.append(("first", lowlevel.slot(tx, RuleContext).deferred_queue is None))
        tx.signal("s1")

    @db.rule(on=db.signalled("s1"), coupling="deferred")
    def second(tx, event):
        order.append(("second",))
        tx.signal("s2")

    @db.rule(on=db.signalled("s2"), coupling="deferred")
    def third(tx, event):
        order.append(("third",))

    with db.transaction() as tx:
        tx.signal("s0")
        assert order == []                     # nothing before the commit point
        queue_of_trigger = tx
    assert [entry[0] for entry in order] == ["first", "second", "third"]
    statistics = lowlevel.slot(queue_of_trigger, RuleContext).deferred_queue.statistics()
    assert statistics.cycles_run == 3          # cycle 0, 1, 2 on the trigger's own queue


def test_deferred_fired_by_immediate_runs_in_extra_cycle_before_it_commits(db):
    order = []

    @db.rule(on=db.signalled("go"), coupling="immediate")
    def immediate(tx, event):
        order.append(("immediate", tx.id))
        tx.signal("later")

    @db.rule(on=db.signalled("later"), coupling="deferred")
    def deferred_from_immediate(tx, event):
        order.append(("deferred", tx.parent.id))

    @db.rule(on=db.signalled("go"), coupling="deferred")
    def deferred_from_trigger(tx, event):
        order.append(("deferred-from-trigger", tx.parent.id))

    with db.transaction() as tx:
        tx.signal("go")
        trigger = tx.id
    immediate_id = order[0][1]
    assert order == [("immediate", immediate_id), ("deferred", immediate_id),
                     ("deferred-from-trigger", trigger)]


def test_priorities_order_groups_and_run_equal_priorities_concurrently(db):
    order = []
    order_mutex = threading.Lock()
    both_high = threading.Barrier(2, timeout=WAIT)

    def make(name, priority, barrier=None):
        @db.rule(on=db.signalled("p"), priority=priority, name=name)
        def rule(tx, event):
            if barrier is not None:
                barrier.wait()                 # only passes if both priority-10 rules run at once
            with order_mutex:
                order.append(name)

    make("high-a", 10, both_high)
    make("high-b", 10, both_high)
    make("low", 5)
    make("none", None)
    with db.transaction() as tx:
        tx.signal("p")
    assert set(order[:2]) == {"high-a", "high-b"} and order[2:] == ["low", "none"]


@pytest.mark.parametrize("shape", ["alone", "by priority", "in a group"])
@pytest.mark.parametrize("interruption", [KeyboardInterrupt, SystemExit])
def test_an_interrupt_in_an_immediate_rule_goes_through_not_as_a_rule_failure(db, shape, interruption):
    """Ctrl-C or sys.exit() inside an immediate rule (a BaseException that is no Exception) reaches the caller as
    itself, not as a RuleFailed the caller may catch and go on; its transaction aborts, leaving nothing."""
    priorities = {"alone": [None], "by priority": [10, 5], "in a group": [10, 10]}[shape]

    def interrupted(tx, event):
        tx.write("items", "interrupted", value=1)
        raise interruption()

    for number, priority in enumerate(priorities):
        action = interrupted if number == 0 else (lambda tx, event: None)
        db.rule(on=db.signalled("stop"), priority=priority, name=f"stop-{number}")(action)
    with pytest.raises(interruption):
        with db.transaction() as tx:
            tx.write("items", "trigger", value=0)
            tx.signal("stop")
    with db.engine.connect() as connection:
        assert connection.execute(sa.text("SELECT count(*) FROM items")).scalar() == 0
    with db.transaction() as tx:        # (nothing left held)
        tx.write("items", "after", value=2)


def test_deferred_priorities(db):
    order = []
    for name, priority in [("d-low", 1), ("d-none", None), ("d-high", 9)]:
        db.rule(on=db.signalled("q"), coupling="deferred", priority=priority, name=name)(
            lambda tx, event, name=name: order.append(name))
    with db.transaction() as tx:
        tx.signal("q")
    assert order == ["d-high", "d-low", "d-none"]


def test_cascade_limit_names_the_chain(migrated):
    database = activedb.connect(migrated, max_cascade_depth=4)
    try:
        @database.rule(on=database.signalled("ping"), name="pinger")
        def ping(tx, event):
            tx.signal("ping")

        with pytest.raises(CascadeLimitExceeded) as caught:
            with database.transaction() as tx:
                tx.signal("ping")
        assert caught.value.chain == ["pinger"] * 5
        assert "pinger -> pinger" in str(caught.value)
    finally:
        database.close()


def test_an_immediate_cascade_too_deep_for_python_s_stack_is_a_cascade_limit_not_a_recursion_error(migrated):
    """Each immediate firing runs nested in the Python call of the one that fired it, a few frames a level: with
    ``max_cascade_depth`` above what Python's recursion limit lets nest (about 190 here), a runaway cascade failed at
    wherever the stack ran out with RuleFailed(RecursionError) — anywhere in the firing's machinery, not the documented
    CascadeLimitExceeded.  It now stops with CascadeLimitExceeded naming the chain, the recursion limit and what to do
    once the stack holds three quarters of the limit, and the database goes on; a cascade 100 deep still runs."""
    database = activedb.connect(migrated, max_cascade_depth=1000)
    try:
        reached: list[int] = []

        @database.rule(on=database.signalled("deeper"), name="deeper")
        def deeper(tx, event):
            reached.append(event.payload["n"])
            if event.payload["n"] < event.payload["until"]:
                tx.signal("deeper", n=event.payload["n"] + 1, until=event.payload["until"])

        with database.transaction() as tx:
            tx.signal("deeper", n=1, until=100)
        assert reached[-1] == 100
        with pytest.raises(CascadeLimitExceeded, match=r"rule cascade \d+ deep .*Python's recursion limit "
                                                       r"\(sys.getrecursionlimit\(\) = \d+\).*max_cascade_depth=1000"
                                                       r".*deferred") as caught:
            with database.transaction() as tx:
                tx.signal("deeper", n=1, until=999)
        assert 100 < len(caught.value.chain) < 999 and set(caught.value.chain) == {"deeper"}
        with database.transaction() as tx:
            tx.write("items", "after", value=1)
        with database.engine.connect() as connection:
            assert connection.execute(sa.text("SELECT value FROM items WHERE key = 'after'")).scalar() == 1
    finally:
        database.close()


def test_a_deferred_cycle_bound_below_one_is_refused_at_connect(migrated):
    """``connect(max_deferred_cycles=0)`` could never run a deferred firing: refused when connecting, by its name —
    not accepted, to fail each transaction that fires a deferred rule with coupling's ``max_cycles`` error."""
    for bound in (0, -1, "5", 2.0):
        with pytest.raises(activedb.BadArgument, match=rf"max_deferred_cycles={bound!r}\) takes a whole number of "
                                                       rf"at least 1"):
            activedb.connect(migrated, max_deferred_cycles=bound).close()


def test_enable_disable(db):
    seen = []
    rule = db.rule(on=db.signalled("e"))(lambda tx, event: seen.append(1))
    rule.disable()
    with db.transaction() as tx:
        tx.signal("e")
    assert seen == []
    rule.enable()
    with db.transaction() as tx:
        tx.signal("e")
    assert seen == [1]


def test_disabling_a_rule_leaves_its_firings_already_queued_alone(db):
    """The rules design note: disabling stops new firings only; a deferred firing already queued runs at commit."""
    seen = []
    rule = db.rule(on=db.signalled("queued"), coupling=Coupling.DEFERRED, name="queued_then_disabled")(
        lambda tx, event: seen.append(event.payload["n"]))
    with db.transaction() as tx:
        tx.signal("queued", n=1)         # queued for the commit
        rule.disable()
        tx.signal("queued", n=2)         # fires nothing
    assert seen == [1]


def test_enable_and_disable_from_two_threads_leave_the_process_and_the_registry_agreeing(db):
    """One thread enables a rule while another disables it: whichever wrote the registry's row last, this process's
    flag must say the same.  set_enabled wrote and committed the row, then set the flag, so an enable whose commit came
    first but whose flag came last left the row disabled and the rule firing here.  The enabling thread is held after
    its commit (its connection's return to the pool, a SQLAlchemy pool event) until the disabling one has returned."""
    rule = db.rule(on=db.signalled("flip"), name="flip", enabled=False)(lambda tx, event: tx.write("items", "flip", value=1))
    disabled = threading.Event()
    enabling: list[int] = []

    def hold_the_enabling_thread(dbapi_connection, record):
        if enabling and threading.get_ident() == enabling[0]:
            enabling.clear()
            assert disabled.wait(WAIT), "the disabling thread returned"

    def enable():
        enabling.append(threading.get_ident())
        db.rules.enable("flip")

    sa.event.listen(db.engine.pool, "checkin", hold_the_enabling_thread)
    try:
        with Watchdog(WAIT):
            enabler = threading.Thread(target=enable)
            enabler.start()
            wait_until(lambda: not enabling, WAIT, "the enabling thread's commit")
            db.rules.disable("flip")
            disabled.set()
            enabler.join(WAIT)
    finally:
        sa.event.remove(db.engine.pool, "checkin", hold_the_enabling_thread)
    persisted = [row["enabled"] for row in db.rules.persisted() if row["name"] == "flip"]
    assert persisted == [False] and rule.enabled is False, (persisted, rule.enabled)
    with db.transaction() as tx:
        tx.signal("flip")
    with db.engine.connect() as connection:
        assert connection.execute(sa.text("SELECT count(*) FROM items")).scalar() == 0


def test_a_rule_object_declared_on_one_database_is_refused_by_another(migrated, db):
    """A Rule object is one database's: the registry keeps its version, enabled flag and database on it.  Added to a
    second Database as well, it was shared: ``rule.disable()`` then acted on the second (the last to add it), and the
    first, whose index still held the rule, went on firing it while ``db.rules.get(name).enabled`` said False.  A second
    database refuses it, saying to make another object; once removed from the first, another may take it."""
    class Shared(activedb.Rule):
        on = db.signalled("shared")

        def action(self, tx, event):
            tx.write("items", "shared", value=1)

    rule = db.rules.add(Shared())
    second = activedb.connect(migrated)
    try:
        with pytest.raises(RuleError, match=r"rule 'Shared' is declared on another Database.*another object"):
            second.rules.add(rule)
        assert "Shared" not in second.rules.names()
        rule.disable()
        assert db.rules.get("Shared").enabled is False
        with db.transaction() as tx:
            tx.signal("shared")
        with db.engine.connect() as connection:
            assert connection.execute(sa.text("SELECT count(*) FROM items")).scalar() == 0
        db.rules.remove("Shared")
        assert second.rules.add(rule) is rule and second.rules.get("Shared") is rule
    finally:
        second.close()


def test_registry_persists_across_connect(migrated, db):
    def action(tx, event):
        tx.write("items", "persist", value=1)

    first = db.rule(on=db.updated("accounts"), coupling="deferred", priority=3, name="persisted")(action)
    first.disable()
    second_db = activedb.connect(migrated)
    try:
        stored = {row["name"]: row for row in second_db.rules.persisted()}
        assert stored["persisted"]["coupling"] == "deferred" and stored["persisted"]["enabled"] is False
        again = second_db.rule(on=second_db.updated("accounts"), coupling="deferred", priority=3,
                               name="persisted")(action)
        assert again.enabled is False and again.version == 1      # same definition: persisted state wins
        third_db = activedb.connect(migrated)
        try:
            with pytest.warns(activedb.RuleDefinitionChangedWarning, match="coupling"):
                changed = third_db.rule(on=third_db.updated("accounts"), coupling="immediate", priority=3,
                                        name="persisted")(action)
            assert changed.version == 2
            assert {row["name"]: row for row in third_db.rules.persisted()}["persisted"]["version"] == 2
        finally:
            third_db.close()
    finally:
        second_db.close()


def test_a_disabled_rule_redefined_by_the_next_process_stays_disabled(migrated, db):
    """The persisted ``enabled`` flag wins at declaration for a new version too (a rule an operator disabled stays
    disabled across a redeploy that changed it); a removed rule declared again is back, as declared."""
    seen = []

    def action(tx, event):
        seen.append(event.source)

    db.rule(on=db.signalled("redeployed"), name="redeployed")(action)
    db.rules.disable("redeployed")
    db.rule(on=db.signalled("came_back"), name="came_back")(action)
    db.rules.disable("came_back")
    db.rules.remove("came_back")
    second_db = activedb.connect(migrated)
    try:
        with pytest.warns(activedb.RuleDefinitionChangedWarning, match="priority"):
            changed = second_db.rule(on=second_db.signalled("redeployed"), name="redeployed", priority=5)(action)
        with pytest.warns(activedb.RuleDefinitionChangedWarning, match="priority"):
            back = second_db.rule(on=second_db.signalled("came_back"), name="came_back", priority=5)(action)
        assert changed.version == 2 and changed.enabled is False
        assert back.version == 2 and back.enabled is True
        stored = {row["name"]: row for row in second_db.rules.persisted()}
        assert stored["redeployed"]["enabled"] is False and stored["came_back"]["enabled"] is True
        with second_db.transaction() as tx:
            tx.signal("redeployed")
            tx.signal("came_back")
        assert seen == ["came_back"]
    finally:
        second_db.close()


def test_a_rule_of_callable_objects_declared_again_by_the_next_process_keeps_its_version(migrated, db):
    """A condition or an action without source of its own — a ``functools.partial``, a callable object — is
    fingerprinted without where it lives in memory: the next process declaring the same rule (new objects, the same
    code) finds its persisted definition unchanged, with no redefinition warning and no new version."""
    def declare(database):
        def above(limit, tx, event):
            return event.payload["value"] > limit

        class Notify:
            def __call__(self, tx, event):
                tx.write("items", "notified", value=1)

        return database.rule(on=database.signalled("again"), when=functools.partial(above, 10),
                             name="callable_parts")(Notify())

    assert declare(db).version == 1
    second_db = activedb.connect(migrated)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", activedb.RuleDefinitionChangedWarning)
            assert declare(second_db).version == 1
        assert {row["name"]: row for row in second_db.rules.persisted()}["callable_parts"]["version"] == 1
    finally:
        second_db.close()


def test_persisted_rules_of_a_module_are_its_own_and_its_submodules_not_a_lookalikes(db):
    """``persisted(module=...)`` (``activedb rules list/remove --module``) keeps the module and the modules under it;
    ``_`` and ``%`` in a module's name are its characters, not wildcards: ``shop_v2`` is not ``shop.v2``."""
    for module in ("shop_v2", "shop_v2.rules", "shop.v2.rules"):
        namespace: dict[str, object] = {"__name__": module}
        exec("def action(tx, event):\n    pass\n", namespace)
        db.rule(on=db.signalled("modules"), name=f"of {module}")(namespace["action"])
    assert [row["name"] for row in db.rules.persisted(module="shop_v2")] == ["of shop_v2", "of shop_v2.rules"]
    assert [row["name"] for row in db.rules.persisted(module="shop.v2")] == ["of shop.v2.rules"]


def test_a_rule_redefined_by_another_module_says_whose_name_it_took(migrated, db):
    db.rule(on=db.updated("accounts"), name="common_name")(lambda tx, event: None)
    other: dict[str, object] = {"__name__": "billing.rules"}
    exec("def common_name(tx, event):\n    tx.write('items', 'billing', value=1)\n", other)
    second_db = activedb.connect(migrated)
    try:
        with pytest.warns(activedb.RuleDefinitionChangedWarning,
                          match=r"'common_name' was redefined by billing.rules, but tests.activedb.test_rules declared "
                                r"it \(rule names are one namespace per database: rename one of them"):
            second_db.rule(on=second_db.updated("accounts"))(other["common_name"])
    finally:
        second_db.close()


def test_a_redefinition_warning_names_the_line_that_declared_the_rule(db):
    """The RuleDefinitionChangedWarning of a redefinition is attributed to the user's line that declared the rule —
    the decorator's and ``db.rules.add(rule)``'s alike (where a warnings filter by module, or Python's one report per
    line, looks).  ``db.rules.add`` is one call less deep than the decorator, and its warning named the frame above the
    user's line (here: pytest's)."""
    class Audited(activedb.Rule):
        on = db.signalled("audited")

        def action(self, tx, event):
            pass

    db.rules.add(Audited())
    Audited.priority = 3
    with pytest.warns(activedb.RuleDefinitionChangedWarning, match="'Audited' was redefined") as added:
        added_at = sys._getframe().f_lineno + 1
        db.rules.add(Audited(), replace=True)
    with pytest.warns(activedb.RuleDefinitionChangedWarning, match="'Audited' was redefined") as decorated:
        decorated_at = sys._getframe().f_lineno + 1
        db.rule(on=db.signalled("audited"), name="Audited", replace=True)(lambda tx, event: None)
    assert [(warned.filename, warned.lineno) for warned in added] == [(__file__, added_at)]
    assert [(warned.filename, warned.lineno) for warned in decorated] == [(__file__, decorated_at)]


def test_bad_rule_definitions_are_rejected_at_declaration(db):
    with pytest.raises(UnknownTable, match="no table 'nope'"):
        db.rule(on=db.updated("nope"))(lambda tx, event: None)
    with pytest.raises(RuleError, match="on= must be an event"):
        db.rule(on="updated:accounts")(lambda tx, event: None)
    with pytest.raises(RuleError, match="decorates a function"):
        db.rule(on=db.updated("accounts"))(42)
    with pytest.raises(RuleError, match="when= must be callable"):
        db.rule(on=db.updated("accounts"), when=5)(lambda tx, event: None)
    with pytest.raises(RuleError, match="unknown coupling|immediate"):
        db.rule(on=db.updated("accounts"), coupling="eventually")(lambda tx, event: None)
    with pytest.raises(RuleError, match="action_coupling"):
        db.rule(on=db.updated("accounts"), action_coupling="deferred")(lambda tx, event: None)
    with pytest.raises(RuleError, match="must be detached"):
        db.rule(on=db.transaction_event("committed"), coupling="immediate")(lambda tx, event: None)
    with pytest.raises(RuleError, match="one of began, committed, aborted"):
        db.transaction_event("inserted")
    with pytest.raises(RuleError, match=r"'one_argument': when= is called with \(tx, event\), but <lambda>\(event\)"):
        db.rule(on=db.updated("accounts"), when=lambda event: True, name="one_argument")(lambda tx, event: None)
    with pytest.raises(RuleError, match=r"the action is called with \(tx, event\), but .*<lambda>\(tx, event, extra\)"):
        db.rule(on=db.updated("accounts"))(lambda tx, event, extra: None)
    db.rule(on=db.updated("accounts"), when=lambda *given: True, name="any_arguments")(lambda tx, event, extra=0: None)
    db.rule(on=db.updated("accounts"), name="twice")(lambda tx, event: None)
    with pytest.raises(RuleError, match="already declared.*replace=True"):
        db.rule(on=db.updated("accounts"), name="twice")(lambda tx, event: None)
    # What the error says works (a module or notebook cell run again): the second takes the first's place.
    with pytest.warns(activedb.RuleDefinitionChangedWarning, match="'twice' was redefined.*priority"):
        second = db.rule(on=db.updated("accounts"), name="twice", priority=3, replace=True)(lambda tx, event: None)
    assert db.rules.get("twice") is second and second.priority == 3


def test_a_rule_name_holding_a_nul_character_is_refused_at_declaration(db):
    """PostgreSQL text cannot hold NUL: a rule name with one failed its registry row's write with SQLAlchemy's
    DataError, no activedb error saying what to do."""
    with pytest.raises(RuleError, match=r"name= cannot hold a NUL character .*'bad\\x00name'"):
        db.rule(on=db.signalled("named"), name="bad\x00name")(lambda tx, event: None)
    assert "bad\x00name" not in db.rules.names()


@pytest.mark.parametrize("spec, name, message", [
    (("signalled", "named"), "bad\ud800name", r"rule 'bad\\ud800name': its name .*lone surrogate '\\ud800' at position 3"),
    (("stream", "bad\x00stream"), "on_nul_stream", r"rule 'on_nul_stream': its event.s name .*NUL character at position 3"),
    (("stream", "bad\ud800stream"), "on_lone_stream", r"rule 'on_lone_stream': its event.s name .*lone surrogate"),
    (("signalled", "bad\x00signal"), "on_nul_signal", r"rule 'on_nul_signal': its event.s name .*NUL character")])
def test_a_rule_name_or_event_postgresql_text_cannot_hold_is_refused_at_declaration(db, spec, name, message):
    """The registry row keeps the rule's name and event as text: a lone surrogate in the name failed the declaration
    with a bare UnicodeEncodeError of the driver, and a stream or signal name holding NUL or a lone surrogate with
    psycopg's DataError or that UnicodeEncodeError — no activedb error saying what to change."""
    kind, event_name = spec
    with pytest.raises(RuleError, match=message):
        db.rule(on=getattr(db, kind)(event_name), name=name)(lambda tx, event: None)
    assert name not in db.rules.names()


@pytest.mark.parametrize("module", [5, ("shop",), b"shop"])
def test_persisted_given_a_module_that_is_no_text_says_what_to_give(db, module):
    """``persisted(module=5)`` sent the number to PostgreSQL as the module column's value: psycopg's
    ProgrammingError (or a TypeError of startswith) instead of an activedb error."""
    with pytest.raises(RuleError, match=r"persisted\(module=.*\) takes the name of a module \(text\)"):
        db.rules.persisted(module=module)


@pytest.mark.parametrize("names", [None, 5, [None], ["kept", 5]])
def test_purge_given_no_list_of_names_says_what_to_give_and_forgets_nothing(db, names):
    """``purge(None)`` failed with a bare TypeError (list(None)); a list holding a name that is no text took the
    rules it did name out of this process before the SQL failed.  Both are refused before anything is forgotten."""
    db.rule(on=db.signalled("kept"), name="kept")(lambda tx, event: None)
    with pytest.raises(RuleError, match=r"purge\(\) takes a list of rule names \(text\)"):
        db.rules.purge(names)
    assert "kept" in db.rules.names() and [row["name"] for row in db.rules.persisted()] == ["kept"]


@pytest.mark.parametrize("call", ["enable", "disable", "remove", "get"])
@pytest.mark.parametrize("name", [123, 1.5, None, b"kept"], ids=["int", "float", "None", "bytes"])
def test_a_rule_name_that_is_no_text_given_to_enable_disable_remove_or_get_says_what_to_give(db, call, name):
    """``db.rules.enable(123)`` and ``remove(1.5)`` failed with PostgreSQL's ProgrammingError ('operator does not exist:
    text = integer', the SQL of the registry's row), ``disable(None)`` said "no rule named None" as if a rule could be
    named so.  Each is refused with a RuleError saying that it takes a rule's name, as text; nothing changes."""
    db.rule(on=db.signalled("kept"), name="kept")(lambda tx, event: None)
    with pytest.raises(RuleError, match=rf"db\.rules\.{call}\(\) takes a rule's name \(text\).*got {re.escape(repr(name))}"):
        getattr(db.rules, call)(name)
    assert db.rules.get("kept").enabled
    assert [(row["name"], row["enabled"], row["removed_at"]) for row in db.rules.persisted()] == [("kept", True, None)]


def test_a_rule_name_that_is_no_text_is_refused_at_declaration(db):
    """A rule's name is text (the persisted row's key, what ``activedb rules enable NAME`` takes): ``name=5`` was
    declared, and from then on every "no rule named ..." error of ``db.rules`` — enable, disable, remove of a
    misspelt name — failed with a TypeError of its own ('sequence item 0: expected str instance, int found'), the
    names listed in it being joined as text."""
    with pytest.raises(RuleError, match=r"name= must be a non-empty text .*, got 5"):
        db.rule(on=db.signalled("named"), name=5)(lambda tx, event: None)

    class Numbered(activedb.Rule):
        name = ("a", "tuple")
        on = db.signalled("named")

        def action(self, tx, event):
            pass

    with pytest.raises(RuleError, match=r"name= must be a non-empty text .*, got \('a', 'tuple'\)"):
        db.rules.add(Numbered())
    assert 5 not in db.rules.names()
    with pytest.raises(RuleError, match="no rule named 'misspelt'"):
        db.rules.enable("misspelt")


@pytest.mark.parametrize("name", ["", 0, False], ids=["empty", "zero", "false"])
def test_a_rule_name_given_empty_or_false_is_refused_not_replaced_by_the_functions(db, name):
    """``name=""`` (a name read from empty configuration, ``name=0``) was dropped for the function's ``__name__``: the
    rule was declared under a name its author never gave, and a second such rule of another function in the module was
    declared under that function's name — or refused as "already declared" when the functions shared one (two lambdas).
    Such a name is refused as any other name that is no non-empty text; a Rule subclass decorated or added with it
    too."""
    def act(tx, event):
        pass

    with pytest.raises(RuleError, match=rf"name= must be a non-empty text .*, got {name!r}"):
        db.rule(on=db.signalled("named"), name=name)(act)

    class Blank(activedb.Rule):
        on = db.signalled("named")

        def action(self, tx, event):
            pass

    with pytest.raises(RuleError, match=rf"name= must be a non-empty text .*, got {name!r}"):
        db.rule(on=db.signalled("named"), name=name)(Blank)
    blank = Blank()
    blank.name = name
    with pytest.raises(RuleError, match=rf"name= must be a non-empty text .*, got {name!r}"):
        db.rules.add(blank)
    assert db.rules.names() == []
    assert db.rules.add(Blank()).name == "Blank"         # (no name at all: the class's, as before)


def test_declaring_a_rule_on_a_closed_database_is_refused_and_writes_nothing(migrated):
    """``db.rule(...)`` (``db.rules.add``) after ``db.close()`` declared the rule and wrote its row in
    ``activedb_rules`` through the closed handle's engine, which opens connections again: the program went on as if
    the rule were in force, but no transaction can start on the handle and its outbox is stopped, so it never fired.
    It is refused, saying to connect again, and no row is written."""
    database = activedb.connect(migrated)
    database.close()
    with pytest.raises(RuleError, match=r"this Database is closed.*never fire.*activedb\.connect\(\) again"):
        database.rule(on=database.signalled("late"), name="late")(lambda tx, event: None)

    late = type("Late", (activedb.Rule,), {"on": database.signalled("late"), "action": lambda self, tx, event: None})
    with pytest.raises(RuleError, match=r"this Database is closed"):
        database.rules.add(late())
    assert database.rules.names() == []
    with activedb.connect(migrated) as other:
        assert not {"late", "Late"} & {row["name"] for row in other.rules.persisted()}


@pytest.mark.parametrize("value", ["false", "no", 1, None], ids=["false-text", "no-text", "one", "none"])
def test_replace_that_is_no_bool_is_refused_and_replaces_nothing(db, value):
    """``replace="false"`` is true to Python: the second declaration silently took the first rule's place (its
    action the one that fired), the opposite of what was written.  ``replace=`` takes True or False, as every switch of
    activedb does (``check_switch``), on ``db.rule`` and on ``db.rules.add``; the first rule stays."""
    db.rule(on=db.signalled("once"), name="once")(lambda tx, event: tx.write("items", "first", value=1))
    with pytest.raises(RuleError, match=rf"db\.rule\(replace={value!r}\) takes True or False"):
        db.rule(on=db.signalled("once"), name="once", replace=value)(
            lambda tx, event: tx.write("items", "second", value=1))

    class Once(activedb.Rule):
        name = "once"
        on = db.signalled("once")

        def action(self, tx, event):
            tx.write("items", "third", value=1)

    with pytest.raises(RuleError, match=rf"db\.rules\.add\(replace={value!r}\) takes True or False"):
        db.rules.add(Once(), replace=value)
    with db.transaction() as tx:
        tx.signal("once")
    with db.engine.connect() as connection:
        assert connection.execute(sa.text("SELECT key FROM items")).scalars().all() == ["first"]


def test_a_decorated_callable_without_a_name_must_be_given_one(db):
    """A ``functools.partial`` or a callable object has no ``__name__``: its rule was named ``FunctionRule``, and the
    second such rule was refused as "already declared" under a name its author never gave."""
    def act(tx, event, value):
        pass

    with pytest.raises(RuleError, match=r"has no __name__.*name='"):
        db.rule(on=db.signalled("unnamed"))(functools.partial(act, value=1))
    assert "FunctionRule" not in db.rules.names()
    assert db.rule(on=db.signalled("unnamed"), name="named_partial")(functools.partial(act, value=2)).name == \
        "named_partial"


@pytest.mark.parametrize("make", [lambda db: db.signalled(5), lambda db: db.signalled(""),
                                  lambda db: db.stream(("badge", "exit")), lambda db: db.stream(""),
                                  lambda db: db.transaction_event("committed", 3)])
def test_an_event_name_that_is_no_name_is_refused_where_it_is_given(db, make):
    """A signal's, stream's or transaction's name is a non-empty text (None: any): db.signalled(5) or
    db.stream(('badge', 'exit')) made a spec no event ever matches, so the rule declared on it never fired and
    nothing said why; db.signalled('') the same (tx.signal names are texts), as db.inserted(5) is refused."""
    with pytest.raises(RuleError, match=r"takes a name \(a non-empty text, or None for any\)"):
        make(db)
    assert db.signalled(None).source is None and db.stream("badge").source == "badge"


def test_an_enabled_flag_that_is_no_boolean_is_refused_at_declaration(db):
    """``enabled=`` is True or False: ``enabled="no"`` failed the declaration with SQLAlchemy's StatementError ('Not a
    boolean value') and ``enabled=None`` with PostgreSQL's NotNullViolation, neither saying what to give; ``enabled=1``
    and ``enabled=1.0`` (equal to True) were declared, and a Rule subclass's ``enabled = 1`` too."""
    for given in ("no", None, 1, 1.0, 0):
        with pytest.raises(RuleError, match=rf"db\.rule\(enabled={re.escape(repr(given))}\) takes True or False"):
            db.rule(on=db.signalled("flagged"), name="flagged", enabled=given)(lambda tx, event: None)
    assert "flagged" not in db.rules.names()

    class Flagged(activedb.Rule):
        on = db.signalled("flagged")
        name = "flagged"
        enabled = 1

        def action(self, tx, event):
            pass

    with pytest.raises(RuleError, match=r"rule 'flagged': Flagged\(enabled=1\) takes True or False"):
        db.rules.add(Flagged())
    assert "flagged" not in db.rules.names()


def test_a_class_form_rule_whose_condition_cannot_take_tx_and_event_is_told_of_its_condition(db):
    """A ``Rule`` subclass has no ``when=``: a condition method of the wrong signature is named as what it is."""
    class OneArgument(activedb.Rule):
        on = db.updated("accounts")

        def condition(self, event):
            return True

        def action(self, tx, event):
            pass

    with pytest.raises(RuleError) as refused:
        db.rules.add(OneArgument())
    assert "'OneArgument': the condition is called with (tx, event), but condition(event)" in str(refused.value)
    assert "when=" not in str(refused.value)


@pytest.mark.parametrize("priority", [float("nan"), float("inf"), float("-inf"), 10 ** 400])
def test_a_priority_that_is_no_finite_number_is_refused_as_a_rule_error(db, priority):
    """NaN (not a priority: no order) and the infinities (no JSON for the persisted definition) are refused at
    declaration with a RuleError saying what a priority is — not PostgreSQL's DataError from the registry's insert.
    So is an integer beyond a float's range (no double precision column holds it), which the check itself let out
    as an OverflowError ('int too large to convert to float')."""
    with pytest.raises(RuleError, match=r"'unordered': priority must be a finite int or float") as refused:
        db.rule(on=db.signalled("unordered"), priority=priority, name="unordered")(lambda tx, event: None)
    assert len(str(refused.value)) < 200, str(refused.value)       # (10**400 shown cut, not its 401 digits)
    assert "unordered" not in db.rules.names()
    assert "unordered" not in {row["name"] for row in db.rules.persisted()}


def test_a_priority_of_a_numpy_number_is_refused_saying_which_numbers_a_priority_is(db):
    """A numpy scalar priority (np.int64(5), read from an array) was refused as "not a finite number" — which it is;
    the error now says a priority is an int or a float and how to give one."""
    numpy = pytest.importorskip("numpy")
    for given in (numpy.int64(5), numpy.float32(0.5)):
        with pytest.raises(RuleError, match=r"'ranked': priority must be a finite int or float.*got "
                                            rf"{re.escape(repr(given))}, a numpy\.\w+: give int\(priority\) or "
                                            r"float\(priority\)"):
            db.rule(on=db.signalled("ranked"), priority=given, name="ranked")(lambda tx, event: None)
    assert "ranked" not in db.rules.names()


def test_a_rule_s_repr_shows_a_coupling_it_cannot_parse_instead_of_raising():
    """``repr(rule)`` parsed the rule's couplings, so a Rule subclass with ``coupling = "eventually"`` (refused only when
    declared) raised UnknownCoupling from its repr — in a log line, a debugger, a test's report of its locals.  The
    repr now shows the value as given; declaring the rule still refuses it."""
    class Misconfigured(activedb.Rule):
        coupling = "eventually"
        action_coupling = "later"

        def action(self, tx, event):
            pass

    assert repr(Misconfigured()) == "<Rule None on None 'eventually'/'later' priority=None enabled>"

    class Configured(activedb.Rule):
        coupling = "Deferred"

        def action(self, tx, event):
            pass

    assert repr(Configured()) == "<Rule None on None deferred/immediate priority=None enabled>"


def test_a_class_form_rule_without_an_action_is_refused_at_declaration(db):
    """A ``Rule`` subclass that defines no ``action`` (forgotten, or misspelt) could only fail each firing with the
    base class's ``NotImplementedError``: it is refused when it is declared, naming what to define."""
    class Misspelt(activedb.Rule):
        on = db.signalled("unacted")

        def actoin(self, tx, event):
            pass

    with pytest.raises(RuleError, match=r"rule 'Misspelt': .*no action.*def action\(self, tx, event\)"):
        db.rules.add(Misspelt())
    assert "Misspelt" not in db.rules.names()


def test_purge_given_one_name_as_a_string_is_refused_instead_of_purging_its_letters(db):
    """``db.rules.purge(names)`` takes names: a string is not read as its characters, each a rule name."""
    db.rule(on=db.signalled("p"), name="x")(lambda tx, event: None)
    db.rule(on=db.signalled("p"), name="xy")(lambda tx, event: None)
    with pytest.raises(RuleError, match=r"purge\(\['xy'\]\)"):
        db.rules.purge("xy")
    assert {"x", "xy"} <= set(db.rules.names())
    assert {"x", "xy"} <= {row["name"] for row in db.rules.persisted()}
    assert db.rules.purge(["xy"]) == 1 and "xy" not in db.rules.names() and "x" in db.rules.names()


def test_failing_rule_is_logged_with_name_and_event(db, caplog):
    @db.rule(on=db.signalled("bad"), coupling="detached")
    def broken(tx, event):
        raise ZeroDivisionError("oops")

    with caplog.at_level(logging.ERROR, logger="activedb.rules"):
        with db.transaction() as tx:
            tx.signal("bad", reason="test")
        db.rules.wait_idle(WAIT)
    assert any("broken" in record.getMessage() and "signal bad" in record.getMessage()
               for record in caplog.records)
    assert db.rules.statistics().per_rule["broken"].failed == 1


def test_class_form_rule(db):
    class Doubler(activedb.Rule):
        on = db.updated("accounts")
        coupling = Coupling.DEFERRED
        priority = 1

        def condition(self, tx, event):
            return event.new["balance"] % 2 == 0

        def action(self, tx, event):
            tx.write("items", "doubled", value=event.new["balance"] * 2)

    db.rules.add(Doubler())
    with db.transaction() as tx:
        tx.write("accounts", 1, balance=21)
    with db.transaction() as tx:
        tx.write("accounts", 1, balance=50)
    with db.engine.connect() as connection:
        assert connection.execute(sa.text("SELECT value FROM items WHERE key='doubled'")).scalar() == 100


@pytest.mark.parametrize("kind, coupling, runs", [
    ("committed", Coupling.EXCLUSIVE_CAUSALLY_DEPENDENT, "detached, detached_causally_dependent, "
                                                         "sequential_causally_dependent"),
    ("aborted", Coupling.DETACHED_CAUSALLY_DEPENDENT, "detached, exclusive_causally_dependent"),
    ("aborted", Coupling.SEQUENTIAL_CAUSALLY_DEPENDENT, "detached, exclusive_causally_dependent"),
])
def test_a_rule_on_a_transaction_end_whose_coupling_can_never_run_is_rejected_at_declaration(db, kind, coupling,
                                                                                             runs):
    """A rule on a transaction's end is triggered by that transaction, whose outcome is its end: an exclusive
    causally dependent rule on ``committed`` (it runs only if its trigger aborts), a detached or sequential causally
    dependent one on ``aborted`` (only if it commits) was declared without a word and never ran — every firing
    counted as cancelled — as the same rule on a captured change is refused."""
    with pytest.raises(RuleError, match=rf"on {kind}\(\) .*{coupling.value} .* never run.*use one of: {runs}$"):
        db.rule(on=db.transaction_event(kind), coupling=coupling, name="never")(lambda tx, event: None)
    with pytest.raises(RuleError, match=rf"must be detached \(one of: {runs}\)"):
        db.rule(on=db.transaction_event(kind), coupling="immediate", name="never")(lambda tx, event: None)
    assert "never" not in db.rules.names()


def test_transaction_events_fire_detached_rules(db):
    seen = []

    @db.rule(on=db.transaction_event("committed", "payment"), coupling="detached")
    def after_commit(tx, event):
        seen.append((event.transaction, event.source))

    @db.rule(on=db.transaction_event("aborted", "payment"), coupling="detached")
    def after_abort(tx, event):
        seen.append(("aborted", event.transaction))

    with db.transaction(name="payment") as tx:
        tx.write("accounts", 1, balance=7)
        trigger = tx.id
    with db.transaction(name="other") as tx:
        tx.write("accounts", 1, balance=8)
    with pytest.raises(TriggerAborts):
        with db.transaction(name="payment") as tx:
            failed = tx.id
            raise TriggerAborts()
    db.rules.wait_idle(WAIT)
    assert sorted(seen) == sorted([(trigger, "payment"), ("aborted", failed)])


def test_fire_runs_planned_firings_and_tells_each_outcome(db):
    """``db.rules.fire``: firings a caller planned (as the capture consumer does) run in the caller's
    transaction, each in a subtransaction of its own; a failing one is FAILED with the rule's own error and
    its writes are gone, the others' stay; shared, the first failure propagates."""
    @db.rule(on=db.signalled("planned"), coupling="detached", name="writes")
    def writes(tx, event):
        tx.write("items", event.payload["key"], value=1)

    @db.rule(on=db.signalled("planned"), coupling="detached", name="never", when=lambda tx, event: False)
    def never(tx, event):
        raise AssertionError("its condition is false")

    @db.rule(on=db.signalled("planned"), coupling="detached", name="breaks")
    def breaks(tx, event):
        tx.write("items", "broken", value=2)
        raise ZeroDivisionError("oops")

    def firings(key):
        event = activedb.Event(activedb.EventKind.SIGNAL, "planned", payload={"key": key})
        return [Firing(rule, event, (rule.name,), rule.coupling, number)
                for number, rule in enumerate((writes, never, breaks))]

    with db.transaction() as tx:
        fired = db.rules.fire(tx, firings("kept"))
    assert [outcome for outcome, _ in fired] == [FiringOutcome.EXECUTED, FiringOutcome.CONDITION_FALSE,
                                                 FiringOutcome.FAILED]
    assert isinstance(fired[2].error, ZeroDivisionError) and fired[0].error is None
    with db.engine.connect() as connection:
        assert connection.execute(sa.text("SELECT key FROM items ORDER BY key")).scalars().all() == ["kept"]

    with pytest.raises(RuleFailed, match="breaks"):
        with db.transaction() as tx:
            lowlevel.run_subtransaction(tx, db.rules.fire, firings("shared"), shared=True)
    assert db.rules.statistics().per_rule["breaks"].failed == 2


def test_firing_counts_reach_the_statistics_once_the_tree_ends_committed_or_aborted(db):
    """The firing record is per tree (the root's ``RuleContext``): ``statistics()`` adds a tree's counts once,
    when it ends — committed or aborted, and a rule on the abort itself counted too."""
    db.rule(on=db.signalled("counted"), name="counted")(lambda tx, event: None)
    db.rule(on=db.transaction_event("aborted", "counted-tree"), coupling="detached", name="on_abort")(lambda tx, event: None)

    def fired(name):
        counter = db.rules.statistics().per_rule.get(name)
        return counter.fired if counter is not None else 0

    with db.transaction() as tx:
        tx.signal("counted")
        tx.signal("counted")
        assert db.rules.firings_in(tx) == {"counted": 2}
    assert fired("counted") == 2
    with pytest.raises(RuntimeError):
        with db.transaction(name="counted-tree") as tx:
            tx.signal("counted")
            raise RuntimeError("abort the tree")
    assert fired("counted") == 3
    assert fired("on_abort") == 1


def test_firings_counted_into_a_tree_that_ended_with_its_firings_taken_back_reach_the_statistics(db):
    """A tree whose firings were all taken back (``fired_in_bulk`` with a negative count: a flush tried again) ends
    folded like any other: a firing counted into it afterwards reaches ``statistics()`` at once."""
    rule = db.rule(on=db.signalled("bulk"), name="bulk")(lambda tx, event: None)
    with db.transaction() as tx:
        db.rules.fired_in_bulk(tx, rule, 2)
        db.rules.fired_in_bulk(tx, rule, -2)
        assert db.rules.firings_in(tx) == {}
    assert "bulk" not in db.rules.statistics().per_rule or db.rules.statistics().per_rule["bulk"].fired == 0
    db.rules.fired_in_bulk(tx, rule, 1)
    assert db.rules.statistics().per_rule["bulk"].fired == 1


def test_firings_counted_into_a_tree_that_ended_without_firing_reach_the_statistics(db):
    """A tree that ended, committed or aborted, without a firing (no firing record) is as ended as one that fired: a
    firing counted into it afterwards (``fired_in_bulk``) reaches ``statistics()`` at once, as ``firings_in`` shows
    it.  Before, its end was taken for a tree not yet folded: the firing waited for a fold that never came, and
    ``statistics()`` never counted it."""
    rule = db.rule(on=db.signalled("late"), name="late")(lambda tx, event: None)
    with db.transaction() as tx:
        pass                                     # (no rule fires: the tree has no firing record)
    db.rules.fired_in_bulk(tx, rule, 1)
    assert db.rules.firings_in(tx) == {"late": 1}
    assert db.rules.statistics().per_rule["late"].fired == 1
    with pytest.raises(RuntimeError):
        with db.transaction() as aborted:       # (aborted, without a firing either)
            raise RuntimeError("abort the tree")
    db.rules.fired_in_bulk(aborted, rule, 2)
    assert db.rules.statistics().per_rule["late"].fired == 3


def test_rule_counter_names_exactly_the_fields_of_rule_counters():
    """``RuleCounter`` (a ``Literal``, for the type checker) and ``RuleCounters`` (the dataclass) list one set of
    counters twice: a field added to one must be added to the other."""
    import dataclasses
    import typing

    from activedb.rules import RuleCounter, RuleCounters

    assert typing.get_args(RuleCounter) == tuple(field.name for field in dataclasses.fields(RuleCounters))


@pytest.mark.parametrize("priority", [2.5, 1e12, -3])
def test_a_rule_s_priority_is_stored_as_the_number_it_is(db, priority):
    """The registry keeps a priority as given (revision 0016): 2.5 was stored and listed as 2, and a priority
    beyond a 32-bit integer failed the declaration with PostgreSQL's 'integer out of range'."""
    name = f"prioritised_{str(priority).replace('.', '_').replace('+', '').replace('-', 'minus_')}"
    db.rule(on=db.signalled("prioritised"), priority=priority, name=name)(lambda tx, event: None)
    try:
        assert {row["name"]: row["priority"] for row in db.rules.persisted()}[name] == priority
    finally:
        db.rules.remove(name)


def test_a_rule_class_decorated_with_db_rule_takes_the_decorators_settings(db):
    """``@db.rule(on=…, enabled=False, when=…, coupling=…, priority=…)`` on a ``Rule`` subclass ignored every setting
    but the name: ``on=`` given there (the decorator requires it) was 'on= must be an event …, got None', and
    ``enabled=False`` or a ``when=`` that is never true registered a rule that fired.  The class's own settings
    stand where the decorator leaves its default."""
    seen = []

    @db.rule(on=db.signalled("decorated"), coupling=Coupling.DEFERRED, priority=5)
    class Decorated(activedb.Rule):
        action_coupling = Coupling.IMMEDIATE

        def action(self, tx, event):
            seen.append("decorated")

    assert (Decorated.on, Coupling.parse(Decorated.coupling), Decorated.priority) == \
        (db.signalled("decorated"), Coupling.DEFERRED, 5)

    @db.rule(on=db.signalled("quiet"), enabled=False)
    class Quiet(activedb.Rule):
        def action(self, tx, event):
            seen.append("quiet")

    @db.rule(on=db.signalled("never"), when=lambda tx, event: False)
    class Never(activedb.Rule):
        def action(self, tx, event):
            seen.append("never")

    @db.rule(on=db.signalled("own"))
    class Own(activedb.Rule):
        coupling = Coupling.DEFERRED

        def action(self, tx, event):
            seen.append("own")

    assert not Quiet.enabled and Coupling.parse(Own.coupling) is Coupling.DEFERRED
    with db.transaction() as tx:
        for name in ("decorated", "quiet", "never", "own"):
            tx.signal(name)
    assert sorted(seen) == ["decorated", "own"]


async def _async_part(tx, event):
    tx.write("items", "async", value=1)
    return False


def _generator_part(tx, event):
    tx.write("items", "generator", value=1)
    yield False


async def _async_generator_part(tx, event):
    tx.write("items", "async generator", value=1)
    yield False


class _AsyncCall:
    async def __call__(self, tx, event):
        tx.write("items", "async call", value=1)


@pytest.mark.parametrize("part, kind", [(_async_part, "an async function"), (_generator_part, "a generator function"),
                                        (_async_generator_part, "an async generator function"),
                                        (_AsyncCall(), "an async function")],
                         ids=["async", "generator", "async-generator", "async-call"])
def test_an_async_or_generator_action_or_condition_is_refused_at_declaration(db, part, kind):
    """Calling an ``async def`` (or a generator) function runs none of its body: it returns a coroutine (a generator),
    which the firing never awaits (iterates).  Declared as an action, such a rule fired, wrote nothing and counted as
    executed, Python warning only "coroutine ... was never awaited"; as a condition, the coroutine (generator) object
    is true, so the action always ran. Both are refused when the rule is declared, saying what to write instead."""
    with pytest.raises(RuleError, match=rf"rule 'acting': the action is {kind}: .*runs none of its body.*plain def"):
        db.rule(on=db.signalled("go"), name="acting")(part)
    with pytest.raises(RuleError, match=rf"rule 'testing': when= is {kind}: .*runs none of its body.*plain def"):
        db.rule(on=db.signalled("go"), when=part, name="testing")(lambda tx, event: tx.write("items", "ran", value=1))

    class Awaiting(activedb.Rule):
        on = db.signalled("go")
        action = part if not isinstance(part, _AsyncCall) else staticmethod(part)

    with pytest.raises(RuleError, match=rf"rule 'Awaiting': the action is {kind}"):
        db.rules.add(Awaiting())
    assert not {"acting", "testing", "Awaiting"} & set(db.rules.names())
    with db.transaction() as tx:
        tx.signal("go")
    with db.engine.connect() as connection:
        assert connection.execute(sa.text("SELECT count(*) FROM items")).scalar() == 0


@pytest.mark.parametrize("coupling", [Coupling.IMMEDIATE, Coupling.SEQUENTIAL_CAUSALLY_DEPENDENT],
                         ids=["c-a-immediate", "c-a-parallel"])
@pytest.mark.parametrize("part", [_async_part, _generator_part, _async_generator_part],
                         ids=["async", "generator", "async-generator"])
def test_an_action_or_condition_that_returns_a_coroutine_fails_its_firing(db, part, coupling):
    """A plain function that returns a coroutine (a generator) — ``lambda tx, event: work(tx, event)`` of an ``async
    def work`` — passes the declaration's check, and a firing runs none of the body it hands back.  The action's
    firing counted as executed, having written nothing (Python warning only "coroutine ... was never awaited"); the
    condition's coroutine object was true, so its action ran.  Now the firing fails with RuleFailed naming the rule,
    what it returned and what to write instead; the returned object is closed (no "never awaited" warning)."""
    db.rule(on=db.signalled("go"), name="acting", action_coupling=coupling)(lambda tx, event: part(tx, event))
    with warnings.catch_warnings():
        warnings.simplefilter("error")       # (a coroutine left unawaited warns when it is collected)
        with pytest.raises(RuleFailed, match=r"rule 'acting'.*the action returned an? (coroutine|generator|async "
                                             r"generator).*none of its body ran.*plain def"):
            with db.transaction() as tx:
                tx.signal("go")
    db.rules.remove("acting")
    db.rule(on=db.signalled("test"), name="testing", action_coupling=coupling,
            when=lambda tx, event: part(tx, event))(lambda tx, event: tx.write("items", "ran", value=1))
    with pytest.raises(RuleFailed, match=r"rule 'testing'.*when= returned an? (coroutine|generator|async generator)"):
        with db.transaction() as tx:
            tx.signal("test")
    counters = db.rules.statistics().per_rule
    assert (counters["acting"].executed, counters["acting"].failed) == (0, 1)
    assert (counters["testing"].executed, counters["testing"].failed) == (0, 1)
    with db.engine.connect() as connection:
        assert connection.execute(sa.text("SELECT count(*) FROM items")).scalar() == 0


def test_two_threads_declaring_one_rule_name_at_once_one_is_refused(db):
    """Two threads declaring a rule of one name (without replace=True) at the same time: one is declared, the other
    refused with the RuleError a second declaration in one thread gets.  The check for a declared name came before the
    registry's row was written and the rule taken in, so both passed it while neither had been taken in yet, and both
    were declared — the second silently took the first's place (its action the one that fired).  The first thread is
    held inside its registry write by a table lock another connection keeps; the second is started once PostgreSQL
    shows the first waiting."""
    outcomes: dict[str, object] = {}

    def declare(who: str) -> None:
        try:
            db.rule(on=db.signalled("clash"), name="clash")(lambda tx, event, who=who: tx.write("items", who, value=1))
            outcomes[who] = "declared"
        except RuleError as error:
            outcomes[who] = error

    def waiting_for_the_table() -> int:
        with db.engine.connect() as probe:
            return probe.execute(sa.text("SELECT count(*) FROM pg_locks WHERE NOT granted "
                                         "AND relation = 'activedb_rules'::regclass")).scalar()

    with Watchdog(WAIT), db.engine.connect() as holder:
        with holder.begin():
            holder.execute(sa.text("LOCK TABLE activedb_rules IN EXCLUSIVE MODE"))
            first = threading.Thread(target=declare, args=("first",))
            first.start()
            wait_until(lambda: waiting_for_the_table() == 1, WAIT, "the first declaration waiting for the table lock")
            second = threading.Thread(target=declare, args=("second",))
            second.start()
            wait_until(lambda: not second.is_alive() or waiting_for_the_table() == 2, WAIT,
                       "the second declaration refused or waiting for the table lock",
                       describe=lambda: outcomes)
        first.join(WAIT)
        second.join(WAIT)
    assert outcomes["first"] == "declared", outcomes
    assert isinstance(outcomes["second"], RuleError), outcomes
    assert "'clash' is already" in str(outcomes["second"]) and "replace=True" in str(outcomes["second"])
    with db.transaction() as tx:
        tx.signal("clash")
    with db.engine.connect() as connection:
        assert connection.execute(sa.text("SELECT key FROM items")).scalars().all() == ["first"]
    assert [row["version"] for row in db.rules.persisted() if row["name"] == "clash"] == [1]


@pytest.mark.parametrize("then", ["returns", "writes", "condition returns false"])
@pytest.mark.parametrize("coupling", ["immediate", "deferred"])
def test_an_action_that_aborts_its_own_transaction_counts_failed(db, then, coupling):
    """An action (a condition) that calls ``tx.abort()`` on its own transaction (then returns, or writes again)
    makes its trigger fail with RuleFailed caused by the TransactionAborted; the firing is counted failed, so
    ``fired`` is the sum of its outcomes (what the metrics and ``bench rules`` check).  Before, it moved none of
    executed, failed or cancelled (a condition that returned false: condition_false, and its trigger failed)."""
    name = f"aborts_itself_{coupling}_{then.replace(' ', '_')}"

    def condition(tx, event):
        tx.abort()
        return False

    @db.rule(on=db.signalled(name), coupling=coupling, name=name,
             **({"when": condition} if then.startswith("condition") else {}))
    def aborts_itself(tx, event):
        tx.abort()
        if then == "writes":
            tx.write("items", "after_abort", value=1)

    with pytest.raises(RuleFailed) as caught:
        with db.transaction() as tx:
            tx.signal(name)
    assert "TransactionAborted" in repr(caught.value.__cause__) or "aborted" in str(caught.value), caught.value
    counters = db.rules.statistics().per_rule[name]
    assert counters.fired == 1 and (counters.executed, counters.failed, counters.cancelled,
                                    counters.condition_false) == (0, 1, 0, 0), counters


@pytest.mark.parametrize("trigger", ["top-level", "subtransaction"])
def test_a_deferred_firing_whose_trigger_aborts_before_its_commit_counts_cancelled(db, trigger):
    """A deferred firing waits for its trigger's commit; a trigger that aborts first (here ``tx.abort()`` of the
    top-level transaction, or a subtransaction that raises inside a tree that commits) takes it along unrun.  The
    dependency stopped it, so it is counted ``cancelled`` and ``fired`` is the sum of its outcomes.  Before, the
    trigger's deferred queue was dropped with it unread: fired 1 and no outcome at all."""
    name = f"deferred_behind_{trigger.replace('-', '_')}"
    ran = []

    @db.rule(on=db.signalled(name), coupling=Coupling.DEFERRED, name=name)
    def behind(tx, event):
        ran.append(event)

    try:
        if trigger == "top-level":
            with db.transaction() as tx:
                tx.signal(name)
                tx.abort()
        else:
            with db.transaction() as tx:
                with pytest.raises(RuntimeError):
                    with tx.subtransaction() as child:
                        child.signal(name)
                        raise RuntimeError("the trigger fails")
        counters = db.rules.statistics().per_rule[name]
    finally:
        db.rules.remove(name)
    assert ran == []
    assert counters.fired == 1 and (counters.executed, counters.failed, counters.cancelled,
                                    counters.condition_false) == (0, 0, 1, 0), counters


def _outcomes(db, names):
    per_rule = db.rules.statistics().per_rule
    return {name: (per_rule[name].fired, per_rule[name].executed, per_rule[name].failed, per_rule[name].cancelled,
                   per_rule[name].condition_false) for name in names}


def test_an_immediate_firing_that_ran_in_a_tree_that_then_aborts_counts_cancelled(db):
    """An immediate firing ran and its subtransaction committed; then its tree aborted (``tx.abort()``), undoing
    its work.  Counted ``cancelled`` — the abort, not the rule, stopped it — so ``fired`` is the sum of the outcomes.
    Before, its ``executed`` was dropped with the tree and it ended in no outcome: fired 1, nothing else."""
    name = "ran_then_tree_aborted"
    ran = []
    db.rule(on=db.signalled(name), name=name)(lambda tx, event: ran.append(event))
    try:
        with db.transaction() as tx:
            tx.signal(name)
            tx.abort()
        counters = _outcomes(db, [name])
    finally:
        db.rules.remove(name)
    assert len(ran) == 1
    assert counters == {name: (1, 0, 0, 1, 0)}, counters       # fired, executed, failed, cancelled, condition false


@pytest.mark.parametrize("coupling", [Coupling.IMMEDIATE, Coupling.DEFERRED])
@pytest.mark.parametrize("priorities", ["each its own", "a group of two"])
def test_firings_before_and_after_a_failing_firing_of_their_event_count_cancelled(db, coupling, priorities):
    """Four rules on one signal, by priority: ``first`` (and, in a group with it, ``beside``) run and commit their
    subtransactions, ``breaks`` raises, ``last`` never runs — the failure stops the rest of the event's firings (of
    a deferred cycle's), and the trigger's tree aborts.  ``breaks`` is failed; the others are cancelled: the abort
    undid the work of ``first`` and ``beside``, and ``last`` never ran.  Before, ``first``'s ``executed`` was
    dropped with the tree and ``last`` ended in no outcome: each fired 1, nothing else."""
    tag = f"{coupling.value}_{priorities.replace(' ', '_')}"
    names = {part: f"{part}_{tag}" for part in ("first", "beside", "breaks", "last")}
    ran: list[str] = []
    event = db.signalled(tag)
    db.rule(on=event, name=names["first"], priority=4, coupling=coupling)(lambda tx, e: ran.append("first"))
    if priorities == "a group of two":
        db.rule(on=event, name=names["beside"], priority=4, coupling=coupling)(lambda tx, e: ran.append("beside"))

    def breaks(tx, e):
        ran.append("breaks")
        raise ValueError("the rule breaks")

    db.rule(on=event, name=names["breaks"], priority=3, coupling=coupling)(breaks)
    db.rule(on=event, name=names["last"], priority=2, coupling=coupling)(lambda tx, e: ran.append("last"))
    present = [name for part, name in names.items() if part != "beside" or priorities == "a group of two"]
    try:
        with pytest.raises(RuleFailed):
            with db.transaction() as tx:
                tx.signal(tag)
        counters = _outcomes(db, present)
    finally:
        for name in present:
            db.rules.remove(name)
    assert "last" not in ran and "breaks" in ran and "first" in ran, ran
    expected = {name: (1, 0, 0, 1, 0) for name in present}
    expected[names["breaks"]] = (1, 0, 1, 0, 0)
    assert counters == expected, counters


def test_a_deferred_firing_raised_by_a_parallel_action_that_aborts_counts_cancelled(db):
    """A deferred rule with C-A sequential causally dependent coupling: its action, begun beside its condition,
    signals a deferred rule's event (the firing is held on the action until it commits: it joins the trigger's
    deferred queue then); the condition returns false, so the action aborts, its events undone — the held firing
    never runs.  Counted ``cancelled``.  Before, it was dropped with the action: fired 1, nothing else."""
    name = "held_behind_a_parallel_action"
    began = threading.Event()

    def condition(tx, event):
        assert began.wait(30), "the action never signalled"
        return False

    ran = []
    db.rule(on=db.signalled(f"{name}_go"), name=f"{name}_parallel", when=condition, coupling=Coupling.DEFERRED,
            action_coupling=Coupling.SEQUENTIAL_CAUSALLY_DEPENDENT)(
        lambda tx, event: (tx.signal(name), began.set()))
    db.rule(on=db.signalled(name), name=name, coupling=Coupling.DEFERRED)(lambda tx, event: ran.append(event))
    try:
        with db.transaction() as tx:
            tx.signal(f"{name}_go")
        counters = _outcomes(db, [name])
    finally:
        for rule in (f"{name}_parallel", name):
            db.rules.remove(rule)
    assert ran == []
    assert counters == {name: (1, 0, 0, 1, 0)}, counters


@pytest.mark.parametrize("coupling", [Coupling.DEFERRED, Coupling.IMMEDIATE])
def test_firings_past_a_cascade_limit_count_cancelled(db, coupling):
    """A rule that fires itself again meets its limit: a deferred one ``max_deferred_cycles`` (each cycle fires the
    next), an immediate one ``max_cascade_depth`` (the dispatch refuses the next level with CascadeLimitExceeded,
    which passes through every firing of the chain).  The tree aborts with CascadeLimitExceeded: the firings that ran
    were undone, a deferred one still pending never runs — each stopped by the limit, not by its own code: all
    cancelled.  Before, the pending deferred one ended in no outcome (and those that ran too), and so did the
    immediate chain's (fired 3, nothing else)."""
    name = f"{coupling.value}_again_and_again"
    db.rule(on=db.signalled(name), name=name, coupling=coupling)(lambda tx, event: tx.signal(name))
    setting = "max_deferred_cycles" if coupling is Coupling.DEFERRED else "max_cascade_depth"
    limit = getattr(db.rules, setting)
    setattr(db.rules, setting, 3)
    try:
        with pytest.raises(CascadeLimitExceeded):
            with db.transaction() as tx:
                tx.signal(name)
        counters = _outcomes(db, [name])
    finally:
        setattr(db.rules, setting, limit)
        db.rules.remove(name)
    fired = 4 if coupling is Coupling.DEFERRED else 3
    assert counters == {name: (fired, 0, 0, fired, 0)}, counters


@pytest.mark.parametrize("raised", ["RuleFailed", "CascadeLimitExceeded"])
@pytest.mark.parametrize("coupling", [Coupling.IMMEDIATE, Coupling.DEFERRED, Coupling.DETACHED])
def test_a_rule_that_raises_a_rules_error_itself_counts_failed(db, coupling, raised):
    """A condition or action that raises ``RuleFailed`` or ``CascadeLimitExceeded`` of its own making (no nested firing
    failed, no cascade reached the rule manager's limit: the rule uses the error for a refusal or a limit of its own)
    ended its firing itself, as one that raises any other error: counted ``failed``, observers told so, the trigger
    gets a RuleFailed naming the rule, and a detached firing's outbox record says what the rule raised, not that it
    was cancelled.  Only a nested firing's failure and the limits the rule manager raised — the dispatch's cascade
    depth, the deferred cycles — stop a firing from outside (cancelled).  Before, the rule manager took either for
    one of those let through: counted ``cancelled`` — no firing counted the failure at all —, the trigger got the
    rule's own error unwrapped, not naming the rule, and a detached record said "cancelled: …"."""
    name = f"raises_{raised}_{coupling.value}".lower()
    message = "the order is refused"
    ends: list[tuple[str, FiringOutcome]] = []

    class Ends(Observer):
        def on_firing_end(self, transaction, firing, outcome):
            ends.append((firing.rule.name, outcome))

    @db.rule(on=db.signalled(name), name=name, coupling=coupling)
    def refuses(tx, event):
        if raised == "RuleFailed":
            raise RuleFailed(message, name, event)
        raise CascadeLimitExceeded(message, ["clerk", "manager"])

    ends_observer = db.observe(Ends())
    try:
        if coupling is Coupling.DETACHED:
            with db.transaction() as tx:
                tx.signal(name)
            db.rules.wait_idle(WAIT)
            [failure] = [failure for failure in db.outbox.failures() if failure.rule == name]
            assert failure.error == f"{raised}: {message}", failure.error
        else:
            with pytest.raises(RuleFailed, match=rf"rule '{name}' failed on signal {name}.*{message}"):
                with db.transaction() as tx:
                    tx.signal(name)
        counters = _outcomes(db, [name])
    finally:
        db.transactions.observers.remove(ends_observer)
        db.rules.remove(name)
    assert ends == [(name, FiringOutcome.FAILED)], ends
    assert counters == {name: (1, 0, 1, 0, 0)}, counters


def _nested_failure(db, outer, outer_coupling, inner, inner_coupling, trigger):
    """``outer``'s action signals ``inner``, whose rule raises; the trigger ``lets it abort the tree`` or ``catches
    it and commits``.  What observers were told (rule name, outcome) and the two rules' ``_outcomes``."""
    ends: list[tuple[str, FiringOutcome]] = []

    class Ends(Observer):
        def on_firing_end(self, transaction, firing, outcome):
            ends.append((firing.rule.name, outcome))

    db.rule(on=db.signalled(outer), name=outer, coupling=outer_coupling)(lambda tx, event: tx.signal(inner))

    @db.rule(on=db.signalled(inner), name=inner, coupling=inner_coupling)
    def breaks(tx, event):
        raise ValueError("the nested rule breaks")

    ends_observer = db.observe(Ends())
    try:
        if trigger == "lets it abort the tree":
            with pytest.raises(RuleFailed):
                with db.transaction() as tx:
                    tx.signal(outer)
        else:
            with db.transaction() as tx:
                with pytest.raises(RuleFailed):
                    tx.signal(outer)
        return ends, _outcomes(db, [outer, inner])
    finally:
        db.transactions.observers.remove(ends_observer)
        for name in (outer, inner):
            db.rules.remove(name)


@pytest.mark.parametrize("coupling, trigger", [(Coupling.IMMEDIATE, "lets it abort the tree"),
                                               (Coupling.DEFERRED, "lets it abort the tree"),
                                               (Coupling.IMMEDIATE, "catches it and commits")])
def test_a_firing_whose_action_lets_a_nested_rules_failure_through_counts_cancelled(db, coupling, trigger):
    """``outer``'s action signals an event whose immediate rule ``inner`` raises, and lets the RuleFailed through:
    ``inner`` is counted failed (it ended itself), ``outer`` — stopped by another firing's failure, as observers are
    told (``cancelled``) — cancelled, whether the trigger lets the error abort its tree or (immediate) catches it and
    commits.
    Before, ``outer`` ended in no outcome: fired 1, nothing else."""
    tag = f"{coupling.value}_{trigger.split()[0]}"
    outer, inner = f"lets_through_{tag}", f"breaks_inside_{tag}"
    ends, counters = _nested_failure(db, outer, coupling, inner, Coupling.IMMEDIATE, trigger)
    assert (outer, FiringOutcome.CANCELLED) in ends, ends
    assert counters == {outer: (1, 0, 0, 1, 0), inner: (1, 0, 1, 0, 0)}, counters


@pytest.mark.parametrize("coupling", [Coupling.IMMEDIATE, Coupling.DEFERRED])
@pytest.mark.parametrize("nested_in", ["an application subtransaction", "a rule's action"])
def test_a_firing_an_aborted_subtransaction_undid_counts_cancelled_though_its_tree_committed(db, coupling, nested_in):
    """A firing ran and its subtransaction committed inside a subtransaction (an application's, or an immediate
    rule's that catches the error it raises itself and so undoes only that subtransaction) which then aborted; the
    tree committed.  The abort undid the firing's work: counted ``cancelled``, as a lowered batch counts it
    (``_Tally.aborted``).  Before, it counted ``executed`` — its record went to the tree's root at once."""
    tag = f"{coupling.value}_{nested_in.split()[1].strip(chr(39) + 's')}"
    name, outer = f"undone_by_a_sub_{tag}", f"undoes_{tag}"
    ran = []
    db.rule(on=db.signalled(name), name=name, coupling=coupling)(lambda tx, event: ran.append(event))

    def signal_then_undo(tx, event=None):
        with pytest.raises(ValueError):
            with tx.subtransaction() as sub:
                with sub.subtransaction() as inner:       # commits (a deferred firing runs at this commit)
                    inner.signal(name)
                raise ValueError("undo the subtransaction")

    db.rule(on=db.signalled(outer), name=outer)(signal_then_undo)
    try:
        with db.transaction() as tx:
            if nested_in == "a rule's action":
                tx.signal(outer)
            else:
                signal_then_undo(tx)
        counters = _outcomes(db, [name])
    finally:
        db.rules.remove(name)
        db.rules.remove(outer)
    assert len(ran) == 1
    assert counters == {name: (1, 0, 0, 1, 0)}, counters       # fired, executed, failed, cancelled, condition false


@pytest.mark.parametrize("trigger", ["lets it abort the tree", "catches it and commits"])
def test_an_immediate_firing_whose_deferred_rule_fails_at_its_commit_counts_cancelled(db, trigger):
    """``outer`` (immediate) signals an event whose deferred rule ``inner`` raises: ``inner`` runs at the commit of
    ``outer``'s subtransaction, fails, and that commit fails with it.  Nothing of ``outer`` took effect, and what
    stopped it was another firing's failure: ``cancelled`` — counted once, and observers are told so, never
    ``executed``.  Before, observers were told ``executed`` (the action had returned) and the counters held no
    outcome for it: fired 1, nothing else."""
    tag = trigger.split()[0]
    outer, inner = f"defers_a_failure_{tag}", f"fails_deferred_{tag}"
    ends, counters = _nested_failure(db, outer, Coupling.IMMEDIATE, inner, Coupling.DEFERRED, trigger)
    assert sorted(ends) == sorted([(inner, FiringOutcome.FAILED), (outer, FiringOutcome.CANCELLED)]), ends
    assert counters == {outer: (1, 0, 0, 1, 0), inner: (1, 0, 1, 0, 0)}, counters
