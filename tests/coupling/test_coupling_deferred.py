"""Deferred cycles (Concurrent Rule Execution §2.1, §3.3.2 Cases 1-2, axioms 27-28) and the
deferred-from-immediate choice."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import pytest
from hypothesis import given
from hypothesis import strategies as st

from coupling import (
    Coupling,
    DeferredCycleLimitExceeded,
    DeferredQueue,
    DeferredQueueClosed,
    QueueState,
    has_own_deferred_queue,
)


def test_cycle_zero_holds_what_was_deferred_before_commit_in_order():
    queue = DeferredQueue()
    assert [queue.add(name) for name in "abc"] == [0, 0, 0]
    cycle = queue.next_cycle()
    assert (cycle.number, cycle.firings) == (0, ("a", "b", "c"))
    assert queue.next_cycle() is None
    assert queue.state is QueueState.CLOSED


def test_firings_deferred_during_cycle_k_form_cycle_k_plus_1():
    fires = {"a": ["a1", "a2"], "b": ["b1"], "a1": ["a11"], "a2": [], "b1": [], "a11": []}
    queue = DeferredQueue()
    queue.add("a")
    queue.add("b")
    seen = []
    for cycle in queue.cycles():
        for firing in cycle.firings:
            seen.append((cycle.number, firing))
            for child in fires[firing]:
                assert queue.add(child) == cycle.number + 1
    assert seen == [(0, "a"), (0, "b"), (1, "a1"), (1, "a2"), (1, "b1"), (2, "a11")]
    stats = queue.statistics()
    assert (stats.state, stats.cycles_run, stats.added, stats.pending, stats.current_cycle) == (
        QueueState.CLOSED, 3, 6, 0, 2,
    )


def test_drain_yields_each_firing_with_its_cycle_and_position():
    queue = DeferredQueue()
    queue.add("x")
    queue.add("y")
    out = []
    for item in queue.drain():
        out.append((item.cycle, item.position, item.firing))
        if item.firing == "x":
            queue.add("x1")  # runs after y: next cycle
    assert out == [(0, 0, "x"), (0, 1, "y"), (1, 0, "x1")]


def test_cycle_limit_stops_a_rule_that_re_defers_itself():
    queue = DeferredQueue(max_cycles=3, name="T1")
    queue.add("loop")
    with pytest.raises(DeferredCycleLimitExceeded) as caught:
        for item in queue.drain():
            queue.add(item.firing)
    error = caught.value
    assert (error.max_cycles, error.pending) == (3, ("loop",))
    assert "T1" in str(error) and "3 cycle(s)" in str(error) and "max_cycles" in str(error)
    assert queue.state is QueueState.CLOSED
    with pytest.raises(DeferredQueueClosed):
        queue.add("late")


def test_exactly_max_cycles_is_allowed():
    queue = DeferredQueue(max_cycles=2)
    queue.add("first")
    cycles = []
    for item in queue.drain():
        cycles.append(item.cycle)
        if item.firing == "first":
            queue.add("second")
    assert cycles == [0, 1]
    assert queue.state is QueueState.CLOSED


def test_closed_queue_refuses_firings_and_discard_drops_them():
    queue = DeferredQueue()
    queue.add("a")
    assert queue.discard() == ("a",)
    with pytest.raises(DeferredQueueClosed, match="already ran its deferred cycles"):
        queue.add("b")
    with pytest.raises(DeferredQueueClosed):
        queue.next_cycle()
    with pytest.raises(ValueError):
        DeferredQueue(max_cycles=0)


def test_cycle_groups_by_priority():
    @dataclass(frozen=True)
    class Firing:
        name: str
        priority: int | None

    queue = DeferredQueue()
    for firing in [Firing("low", 1), Firing("none", None), Firing("high", 9), Firing("low2", 1)]:
        queue.add(firing)
    cycle = queue.next_cycle()
    assert [[firing.name for firing in group] for group in cycle.groups()] == [["high"], ["low", "low2"], ["none"]]


def test_concurrent_firings_of_one_cycle_add_to_the_next(threads):
    queue = DeferredQueue()
    for number in range(8):
        queue.add(number)
    cycle = queue.next_cycle()
    barrier = threading.Barrier(len(cycle))
    returned_cycles = []

    def run(firing):
        barrier.wait(timeout=5)
        returned_cycles.extend(queue.add((firing, index)) for index in range(25))

    for firing in cycle.firings:
        threads.start(f"firing {firing}", run, firing)
    threads.join()
    assert set(returned_cycles) == {1}
    following = queue.next_cycle()
    assert following.number == 1 and len(following) == 200
    assert queue.next_cycle() is None


# ------------------------------------------------ the wiring, in a tiny simulated transaction manager


@dataclass
class Simulation:
    """Runs rules the way the lead's transaction manager is meant to use DeferredQueue."""

    fires: dict[str, list[tuple[Coupling, str]]]
    log: list[str] = field(default_factory=list)

    def run(self, name: str, spawned_with: Coupling | None, came_from: DeferredQueue | None) -> None:
        self.log.append(f"begin {name}")
        own = has_own_deferred_queue(spawned_with)
        queue = DeferredQueue(name=name) if own else came_from
        for mode, child in self.fires.get(name, []):
            if mode is Coupling.IMMEDIATE:
                self.run(child, mode, queue)
            else:
                queue.add(child)
        if own:
            for cycle in queue.cycles():
                for firing in cycle.firings:
                    self.log.append(f"{name} cycle {cycle.number}: {firing}")
                    self.run(firing, Coupling.DEFERRED, queue)
        self.log.append(f"commit {name}")


def test_deferred_from_immediate_runs_in_an_extra_cycle_before_the_immediate_rule_commits():
    imm, dfr = Coupling.IMMEDIATE, Coupling.DEFERRED
    simulation = Simulation(
        {
            "T": [(dfr, "D1"), (imm, "I1")],
            "I1": [(dfr, "D2")],  # deferred fired by an immediate rule: before I1 commits
            "D1": [(dfr, "D3"), (imm, "I2")],  # deferred by deferred: next cycle of T; immediate: at once
            "I2": [(dfr, "D4")],
        }
    )
    simulation.run("T", None, None)
    assert simulation.log == [
        "begin T",
        "begin I1",
        "I1 cycle 0: D2",
        "begin D2",
        "commit D2",
        "commit I1",
        "T cycle 0: D1",
        "begin D1",
        "begin I2",
        "I2 cycle 0: D4",
        "begin D4",
        "commit D4",
        "commit I2",
        "commit D1",
        "T cycle 1: D3",
        "begin D3",
        "commit D3",
        "commit T",
    ]


# ------------------------------------------------ property: cycle number == depth of the firing chain

trees = st.recursive(st.just(()), lambda children: st.lists(children, max_size=3).map(tuple), max_leaves=25)


@given(st.lists(trees, min_size=1, max_size=4))
def test_cycles_are_breadth_first_levels(roots):
    levels = []
    level = list(roots)
    while level:
        levels.append(level)
        level = [child for node in level for child in node]
    queue = DeferredQueue(max_cycles=len(levels))
    for root in roots:
        queue.add(root)
    order = []
    for item in queue.drain():
        order.append((item.cycle, item.firing))
        for child in item.firing:
            queue.add(child)
    assert order == [(number, node) for number, level in enumerate(levels) for node in level]
    if len(levels) > 1:  # one cycle fewer is not enough
        short = DeferredQueue(max_cycles=len(levels) - 1)
        for root in roots:
            short.add(root)
        with pytest.raises(DeferredCycleLimitExceeded):
            for item in short.drain():
                for child in item.firing:
                    short.add(child)
