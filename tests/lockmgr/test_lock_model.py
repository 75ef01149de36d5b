"""Hypothesis stateful test: the lock manager against a small sequential reference model of Rules 1–5.

The model (``tests/lockmgr/_reference.py``) is deliberately naive -- a dict of held modes and a dict of
retained modes keyed by (transaction, resource), the rules written as directly as Concurrent Rule Execution §3.1
states them -- and shares no code with lockmgr except the conflict table (which test_lock_rules checks against
the textbook matrix).  Single threaded: requests that the model says would wait go through ``try_acquire``, which must then refuse.

``LOCKMGR_MODEL_EXAMPLES`` (default 200) sets how many histories are tried (e.g. 3000 for a long run).
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from lockmgr import ActiveChildren, InvalidDowngrade, LockManager, LockNotHeld, Mode, conflicts, covers
from tests.lockmgr._reference import ReferenceModel

RESOURCES = ("a", "b")
MODES = tuple(Mode)
MAX_TRANSACTIONS = 9


class LockManagerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.lm = LockManager()
        self.model = ReferenceModel()
        self.counter = 0

    def _new_tid(self) -> str:
        self.counter += 1
        return f"T{self.counter}"

    @precondition(lambda self: len(self.model.active) < MAX_TRANSACTIONS)
    @rule(data=st.data(), top_level=st.sampled_from([True, False, False, False]))
    def begin(self, data, top_level):
        tid = self._new_tid()
        parent = None
        if not top_level and self.model.active:
            parent = data.draw(st.sampled_from(sorted(self.model.active)), label="parent")
        self.lm.begin(tid, parent)
        self.model.begin(tid, parent)

    @precondition(lambda self: self.model.active)
    @rule(data=st.data(), resource=st.sampled_from(RESOURCES), mode=st.sampled_from(MODES), blocking=st.booleans())
    def request(self, data, resource, mode, blocking):
        tid = data.draw(st.sampled_from(sorted(self.model.active)), label="tid")
        expected = self.model.allows(tid, resource, mode)
        if blocking and expected:
            self.lm.acquire(tid, resource, mode)  # must not block: the model says Rule 1 allows it
            granted = True
        else:
            granted = self.lm.try_acquire(tid, resource, mode)
        assert granted == expected, f"{tid} {mode.name} on {resource}: model says {expected}"
        if granted:
            self.model.grant(tid, resource, mode)

    @precondition(lambda self: self.model.active)
    @rule(data=st.data(), resource=st.sampled_from(RESOURCES), mode=st.sampled_from(MODES))
    def child_requests_and_commits(self, data, resource, mode):
        """A short-lived subtransaction: begin, one request, commit -- the inheritance path in one step."""
        parent = data.draw(st.sampled_from(sorted(self.model.active)), label="parent")
        tid = self._new_tid()
        self.lm.begin(tid, parent)
        self.model.begin(tid, parent)
        expected = self.model.allows(tid, resource, mode)
        assert self.lm.try_acquire(tid, resource, mode) == expected
        if expected:
            self.model.grant(tid, resource, mode)
        self.lm.commit(tid)
        self.model.commit(tid)

    @precondition(lambda self: self.model.active)
    @rule(data=st.data(), length=st.integers(2, 4), resource=st.sampled_from(RESOURCES),
          modes=st.lists(st.sampled_from(MODES), min_size=4, max_size=4))
    def chain_requests_and_commits(self, data, length, resource, modes):
        """A chain of nested subtransactions, one request each, committed bottom-up: every commit hands a
        level's locks (and the ones below it) one level further up."""
        parent = data.draw(st.sampled_from(sorted(self.model.active)), label="parent")
        chain = []
        for level in range(length):
            tid = self._new_tid()
            self.lm.begin(tid, parent)
            self.model.begin(tid, parent)
            expected = self.model.allows(tid, resource, modes[level])
            assert self.lm.try_acquire(tid, resource, modes[level]) == expected
            if expected:
                self.model.grant(tid, resource, modes[level])
            chain.append(tid)
            parent = tid
        for tid in reversed(chain):
            self.lm.commit(tid)
            self.model.commit(tid)

    def _leaves(self) -> list[str]:
        return sorted(tid for tid in self.model.active if not self.model.children(tid))

    @precondition(lambda self: self.model.active)
    @rule(data=st.data())
    def commit(self, data):
        """Commit a transaction without active children (Rule 2 or 3)."""
        tid = data.draw(st.sampled_from(self._leaves()), label="tid")
        self.lm.commit(tid)
        self.model.commit(tid)

    @precondition(lambda self: any(self.model.children(tid) for tid in self.model.active))
    @rule(data=st.data())
    def commit_with_active_children(self, data):
        parents = sorted(tid for tid in self.model.active if self.model.children(tid))
        tid = data.draw(st.sampled_from(parents), label="tid")
        try:
            self.lm.commit(tid)
        except ActiveChildren:
            return
        raise AssertionError(f"{tid} committed with active children")

    @precondition(lambda self: self.model.active)
    @rule(data=st.data())
    def abort(self, data):
        tid = data.draw(st.sampled_from(sorted(self.model.active)), label="tid")
        self.lm.abort(tid)
        self.model.abort(tid)

    @precondition(lambda self: self.model.held)
    @rule(data=st.data(), mode=st.sampled_from(MODES))
    def downgrade(self, data, mode):
        tid, resource = data.draw(st.sampled_from(sorted(self.model.held)), label="lock")
        current = self.model.held[(tid, resource)]
        if current is mode or not covers(current, mode):
            try:
                self.lm.downgrade(tid, resource, mode)
            except InvalidDowngrade:
                return
            raise AssertionError(f"downgrade of {current.name} to {mode.name} was accepted")
        self.lm.downgrade(tid, resource, mode)
        self.model.downgrade(tid, resource, mode)

    @precondition(lambda self: self.model.active)
    @rule(data=st.data(), resource=st.sampled_from(RESOURCES), mode=st.sampled_from(MODES))
    def downgrade_unheld(self, data, resource, mode):
        tid = data.draw(st.sampled_from(sorted(self.model.active)), label="tid")
        if (tid, resource) in self.model.held:
            return
        try:
            self.lm.downgrade(tid, resource, mode)
        except LockNotHeld:
            return
        raise AssertionError("downgrade of a lock not held was accepted")

    @invariant()
    def lock_table_matches_the_model(self):
        for resource in RESOURCES:
            holders = self.lm.holders(resource)
            assert dict(holders.held) == {tid: mode for (tid, r), mode in self.model.held.items() if r == resource}
            assert dict(holders.retained) == {
                tid: mode for (tid, r), mode in self.model.retained.items() if r == resource
            }
            assert holders.waiting == ()
        statistics = self.lm.statistics()
        assert statistics.transactions == len(self.model.active)
        assert statistics.locks == len({r for _, r in self.model.held} | {r for _, r in self.model.retained})
        assert statistics.waiting == 0

    @invariant()
    def commit_edges_are_parent_to_active_child(self):
        graph = self.lm.wait_for_graph()
        assert set(graph.nodes) == self.model.active
        assert {(a, b) for a, b, data in graph.edges(data=True) if data["kind"] == "commit"} == {
            (self.model.parent[child], child) for child in self.model.active if self.model.parent[child] is not None
        }

    @invariant()
    def hold_retain_invariants(self):
        """Holders never conflict; a conflicting retainer is always an ancestor of the holder."""
        for (first, resource), first_mode in self.model.held.items():
            for (second, other_resource), second_mode in self.model.held.items():
                if resource == other_resource and first != second:
                    assert not conflicts(first_mode, second_mode)
            for (retainer, other_resource), retained_mode in self.model.retained.items():
                if resource == other_resource and retainer != first and conflicts(first_mode, retained_mode):
                    assert retainer in self.model.ancestors(first)


LockManagerMachine.TestCase.settings = settings(
    max_examples=int(os.environ.get("LOCKMGR_MODEL_EXAMPLES", "200")),
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestLockManagerAgainstModel = LockManagerMachine.TestCase
