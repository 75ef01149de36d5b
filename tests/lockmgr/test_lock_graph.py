"""The incremental cycle check (lockmgr._graph.find_cycle) against networkx on random wait-for graphs."""

from __future__ import annotations

import networkx
from hypothesis import given, settings
from hypothesis import strategies as st

from lockmgr._graph import edge_kind, find_cycle


class Node:
    def __init__(self, name: int) -> None:
        self.name = name
        self.waits: dict = {}
        self.children: set = set()
        self.external: tuple = ()

    def __repr__(self) -> str:
        return f"N{self.name}"


@st.composite
def graphs(draw):
    size = draw(st.integers(2, 14))
    nodes = [Node(number) for number in range(size)]
    pairs = st.tuples(st.integers(0, size - 1), st.integers(0, size - 1), st.sampled_from(["held", "retained",
                                                                                         "queued", "commit"]))
    for source, target, kind in draw(st.lists(pairs, max_size=3 * size)):
        if source == target:
            continue
        if kind == "commit":
            nodes[source].children.add(nodes[target])
        else:
            nodes[source].waits[nodes[target]] = kind
    source = draw(st.integers(0, size - 1))
    targets = draw(st.lists(st.integers(0, size - 1), min_size=1, max_size=3))
    return nodes, nodes[source], [nodes[target] for target in targets if target != source]


@given(graphs())
@settings(max_examples=300, deadline=None)
def test_find_cycle_agrees_with_networkx(case):
    nodes, source, targets = case
    graph = networkx.DiGraph()
    graph.add_nodes_from(nodes)
    for node in nodes:
        graph.add_edges_from((node, following) for following in node.waits)
        graph.add_edges_from((node, following) for following in node.children)
    closes = any(networkx.has_path(graph, target, source) for target in targets)
    path = find_cycle(source, targets)
    assert (path is not None) == closes
    if path is not None:
        assert path[0] is source and path[1] in targets
        assert len(set(path)) == len(path), "a simple cycle"
        for node, following in zip(path[1:], path[2:] + [source]):
            edge_kind(node, following)  # raises KeyError if the edge does not exist


def test_a_wait_edge_wins_over_a_commit_edge_between_the_same_pair():
    parent, child = Node(0), Node(1)
    parent.children.add(child)
    parent.waits[child] = "held"
    assert edge_kind(parent, child) == "held"
    del parent.waits[child]
    assert edge_kind(parent, child) == "commit"


def test_the_sequencer_orders_blocks_and_a_broken_sequence_fails():
    import threading

    import pytest

    from lockmgr.testing import ScenarioError, Sequencer

    sequencer, order = Sequencer(timeout=5), []

    def worker(positions):
        for position in positions:
            with sequencer(position):
                order.append(position)

    threads = [threading.Thread(target=worker, args=(positions,)) for positions in ([1, 3], [0, 2, 4])]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert order == [0, 1, 2, 3, 4]
    broken = Sequencer(timeout=0.05)
    with pytest.raises(ScenarioError, match="waited"):
        with broken(2):                               # block 1 never runs
            pass
    with pytest.raises(ScenarioError, match="used twice"):
        with broken(2):
            pass


def test_the_test_kits_waits_take_an_infinite_timeout_as_no_limit():
    """Sequencer(timeout=inf) and Scenario(lm, timeout=inf) raised OverflowError ('timestamp out of range for
    platform time_t') wherever they had to wait — a block waiting for the one before it, a blocked step's finish,
    the sessions' end — as the Watchdog did before ce54bec; they wait without limit."""
    import threading

    from lockmgr import LockManager, Mode
    from lockmgr.testing import Scenario, Sequencer, wait_until

    sequencer, order, errors = Sequencer(timeout=float("inf")), [], []

    def second():
        try:
            with sequencer(1):
                order.append(1)
        except BaseException as error:          # reported below
            errors.append(error)

    thread = threading.Thread(target=second)
    thread.start()
    # (The condition's waiters are what tells that the block waits for block 0.)
    wait_until(lambda: errors or sequencer._condition._waiters, 5, "block 1 to wait for block 0")
    with sequencer(0):
        order.append(0)
    thread.join(5)
    assert errors == [] and order == [0, 1]

    lm = LockManager()
    for tid in ("A", "B"):
        lm.begin(tid)
    lm.acquire("A", "x", Mode.WRITE)
    with Scenario(lm, timeout=float("inf")) as scenario:
        reader = scenario.run("B", "read x", lambda: lm.acquire("B", "x", Mode.READ), blocks=True)
        scenario.run("A", "commit", lambda: lm.commit("A"))
        scenario.finish(reader)
    assert lm.holders("x").held == {"B": Mode.READ}


def _raised_within(seconds, call, what):
    """What ``call()`` raised (a list: empty if nothing), run on a thread joined within ``seconds`` — a wait that never
    ends fails the test, naming ``what``, instead of hanging it."""
    import threading

    raised: list[BaseException] = []

    def run():
        try:
            call()
        except BaseException as error:
            raised.append(error)

    waiter = threading.Thread(target=run, daemon=True)
    waiter.start()
    waiter.join(seconds)
    assert not waiter.is_alive(), f"{what} still waiting after {seconds} s"
    return raised


def test_wait_until_refuses_a_timeout_that_is_no_number_of_seconds():
    """``wait_until(predicate, timeout=nan)`` never timed out (no time is later than a NaN deadline): a test meant to
    fail after a bound hung instead.  A timeout that is NaN, negative or no number is refused at once; infinity still
    waits without limit (here: the predicate holds at once)."""
    import math

    from lockmgr.testing import wait_until


    for timeout in (math.nan, -1.0, "10", None, True):
        raised = _raised_within(30, lambda timeout=timeout: wait_until(lambda: False, timeout),
                                f"wait_until(timeout={timeout!r})")
        assert len(raised) == 1 and isinstance(raised[0], ValueError), (timeout, raised)
        assert "takes a number of seconds" in str(raised[0]) and f"timeout={timeout!r}" in str(raised[0])
    assert wait_until(lambda: "ready", math.inf) == "ready"


def test_a_watchdog_refuses_a_timeout_that_is_no_number_of_seconds():
    """``Watchdog("5")`` (``activedb.testing.Watchdog``, a number read from an environment variable) started, and its
    thread then died of a TypeError ('<' between float and str): no watchdog at all, so the hung test it was there
    for hung the suite; a NaN, 0 or negative timeout fired at once and failed a test that had not hung.  As
    wait_until's, a timeout that is no number of seconds above 0 is refused when the watchdog is made, before its
    thread starts; infinity never fires."""
    import math

    import pytest

    from lockmgr.testing import Watchdog

    for timeout in ("5", math.nan, 0, -1.0, None, True):
        with pytest.raises(ValueError, match=r"Watchdog\(timeout=.*\) takes a number of seconds above 0"):
            Watchdog(timeout)
    with Watchdog(math.inf) as watchdog:
        pass
    assert not watchdog.fired.is_set()


def test_a_sequencer_refuses_a_timeout_that_is_no_number_of_seconds():
    """``Sequencer(timeout=nan)`` (``activedb.testing.Sequencer``) waited for ever at a block whose predecessor never
    ran — no time is later than a NaN bound — where a broken sequence is to fail after ``timeout``; '5' failed only at
    the first wait, with a TypeError ('<' between float and str).  As wait_until's, a timeout that is NaN, negative,
    a bool or no number is refused when the sequencer is made; infinity still waits without limit."""
    import math

    import pytest

    from lockmgr.testing import Sequencer

    for timeout in (math.nan, -1.0, "5", None, True):
        with pytest.raises(ValueError, match=r"Sequencer\(timeout=.*\) takes a number of seconds >= 0"):
            Sequencer(timeout=timeout)
    with Sequencer(timeout=math.inf)(0):
        pass


def test_a_watchdog_whose_describe_fails_or_whose_graph_is_held_still_prints_the_stacks_and_interrupts(capfd,
                                                                                                      monkeypatch):
    """A fired Watchdog called ``describe()`` unguarded and read the wait-for graph under the lock manager's graph
    mutex without a bound: a describe that raised (the interleaving runner's reads its own state) killed the
    watchdog's thread, and a hung thread holding the graph mutex blocked it — either way before the stacks and
    ``on_fire()`` (the interrupt), so the hang it was there for stayed a hang.  Now a failing describe prints its own
    error, a graph not read within ``DIAGNOSTIC_SECONDS`` says so, and the watchdog goes on to the stacks and the
    interrupt."""
    import threading

    from lockmgr import LockManager
    from lockmgr import testing

    import pytest

    monkeypatch.setattr(testing, "DIAGNOSTIC_SECONDS", 0.2, raising=False)

    def broken() -> str:
        raise RuntimeError("describe broke")

    lm = LockManager()
    interrupted = threading.Event()
    watchdog = testing.Watchdog(0.1, lm, describe=broken, on_fire=interrupted.set)
    lm._graph_mutex.acquire()           # (as a thread hung inside the lock manager holds it)
    try:
        with pytest.raises(AssertionError, match="watchdog fired"):
            with watchdog:
                called = interrupted.wait(10)
                lm._graph_mutex.release()
    finally:
        if lm._graph_mutex.locked():
            lm._graph_mutex.release()
    assert called, "the watchdog never called on_fire (the interrupt)"
    printed = capfd.readouterr().err
    assert "WATCHDOG: test still running after 0.1 s" in printed
    assert "could not read the wait-for graph within 0.2 s" in printed
    assert "could not describe the state: RuntimeError('describe broke')" in printed
    assert "most recent call first" in printed       # faulthandler's stacks


def test_a_watchdog_under_capsys_still_prints_the_stacks_and_interrupts(capsys):
    """Under pytest's ``capsys`` ``sys.stderr`` has no file descriptor, and ``faulthandler.dump_traceback`` raised
    io.UnsupportedOperation on the watchdog's thread, which died before ``on_fire()``: a hung test using capsys stayed
    hung.  The stacks are then printed with ``traceback`` instead, and the interrupt follows."""
    import threading

    import pytest

    from lockmgr.testing import Watchdog

    interrupted = threading.Event()
    with pytest.raises(AssertionError, match="watchdog fired"):
        with Watchdog(0.1, on_fire=interrupted.set):
            called = interrupted.wait(10)
    assert called, "the watchdog never called on_fire (the interrupt)"
    printed = capsys.readouterr().err
    assert "WATCHDOG: test still running after 0.1 s" in printed
    assert "test_a_watchdog_under_capsys_still_prints_the_stacks_and_interrupts" in printed   # this thread's stack


def test_a_scenario_ending_with_a_step_pending_while_the_graph_mutex_is_held_fails_within_a_bound(monkeypatch):
    """``Scenario.__exit__`` with a step still pending read the wait-for graph, then aborted every transaction
    (``snapshot``, ``abort``), all under the lock manager's graph mutex and without a bound: a hung thread holding
    that mutex (the hang the scenario was there to catch) hung the test's ``with`` block for ever instead of failing
    it with what it saw.  Now the graph and the clean-up are each waited for at most ``DIAGNOSTIC_SECONDS`` and the
    scenario fails, saying the graph could not be read; ``finish`` of a step that never ends likewise."""
    import threading

    from lockmgr import LockManager, Mode
    from lockmgr import testing

    import pytest

    monkeypatch.setattr(testing, "DIAGNOSTIC_SECONDS", 0.2, raising=False)
    lm = LockManager()
    lm.begin("A")
    lm.begin("B")
    lm.acquire("A", "x", Mode.WRITE)
    outcome: list[BaseException | None] = []
    ended = threading.Event()
    blocked = threading.Event()
    held = threading.Event()
    release = threading.Event()

    def scenario_body() -> None:
        try:
            with testing.Scenario(lm, timeout=3) as scenario:   # (its waits: a step to block, to finish)
                pending = scenario.run("b", "B wants x", lambda: lm.acquire("B", "x", Mode.WRITE), blocks=True)
                blocked.set()
                held.wait(10)
                try:
                    scenario.finish(pending)
                except testing.ScenarioError as error:
                    outcome.append(error)
            outcome.append(None)
        except BaseException as error:     # (the scenario's own failure: what this test wants)
            outcome.append(error)
        finally:
            ended.set()

    def hold_graph_mutex() -> None:      # as a thread hung inside the lock manager holds it
        with lm._graph_mutex:
            held.set()
            release.wait(30)

    holder = threading.Thread(target=hold_graph_mutex, daemon=True)
    body = threading.Thread(target=scenario_body, daemon=True)
    body.start()
    assert blocked.wait(10), "B's step did not block"
    holder.start()
    try:
        finished = ended.wait(30)         # (bounded by the scenario's waits: 3 s each, 0.2 s each diagnostic)
    finally:
        release.set()
    assert finished, "the scenario's with block did not end while the graph mutex was held"
    assert len(outcome) == 2, outcome
    finish_error, exit_error = outcome
    assert "did not finish within 3 s" in str(finish_error)
    assert "could not read the wait-for graph within 0.2 s" in str(finish_error)
    assert isinstance(exit_error, testing.ScenarioError), exit_error
    assert "steps still pending at the end of the scenario" in str(exit_error)
    assert "could not read the wait-for graph within 0.2 s" in str(exit_error)
    body.join(10)


def test_wait_until_that_times_out_fails_saying_so_whatever_its_describe_does(monkeypatch):
    """``describe()`` is what a failing wait reads of the state — the state that may be hung: a describe that raised
    replaced the timeout's ScenarioError with its own error (the test failed on a KeyError, not on the wait), and one
    blocked on a mutex a hung thread holds (``db.explain()``) kept the wait from failing at all.  It is read as the
    watchdog reads its own (``diagnostic``): within ``DIAGNOSTIC_SECONDS``, else a line saying why not."""
    import threading

    import lockmgr.testing
    from lockmgr.testing import ScenarioError, wait_until

    monkeypatch.setattr(lockmgr.testing, "DIAGNOSTIC_SECONDS", 0.2)
    never = threading.Event()

    def missing() -> object:
        return {}["orders"]

    for describe, said in ((missing, "(could not describe the state: KeyError('orders'))"),
                           (never.wait, "(could not describe the state within 0.2 s")):
        raised = _raised_within(30, lambda describe=describe: wait_until(lambda: False, 0.01, "the order",
                                                                           describe=describe),
                                f"wait_until with describe={describe!r}")
        assert len(raised) == 1 and isinstance(raised[0], ScenarioError), raised
        assert str(raised[0]).startswith("timed out after 0.01 s waiting for the order; state: " + said), raised[0]
    never.set()
