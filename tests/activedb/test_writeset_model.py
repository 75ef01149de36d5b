"""The write-set algebra (``Entry.then`` and ``resolve``) against a plain model of one row.

The model is the row's state as a dict of columns, or None when the row does not exist; the
four kinds of write do to it what the store's design note ("Write-set composition") says:

* PATCH(values)   -- upsert: update the given columns, or create the row with them;
* INSERT(values)  -- the row must not exist (else ``DuplicateKey``), then it is ``values``;
* DELETE          -- the row is gone (whether it existed or not);
* REPLACE(values) -- the row is exactly ``values``.

A state machine plays a parent and its child writing one row over a committed base, the way a
transaction tree uses write sets: a write composes into the child's entry, a child's commit merges
its entry into the parent's (delegation), an abort drops it, a top-level commit applies the
parent's entry to the base (with the flush's meaning of each kind).  What the tree sees
(``resolve`` of the chain of entries) must always be what the model says.  Two property tests
check the algebra directly: composing is faithful to applying entries one by one, and associative
(a child's composed entry merged into its parent's equals the writes applied one by one).

It uses ``activedb.store``'s write-set entries (pure code: no database, no threads).

The last test is the gap it found (an INSERT composed with a later DELETE became a plain DELETE, or
with DELETE and INSERT a REPLACE, so a row another process inserted after the check was deleted or
overwritten at the flush): an INSERT now keeps its "must not exist" through later writes (ABSENT).
"""

from __future__ import annotations

import os

import pytest
from hypothesis import Phase, example, given, seed, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test

from activedb.errors import DuplicateKey
from activedb.store import Entry, EntryKind, resolve

# CI: a fixed (derandomized) run; ACTIVEDB_TEST_SEED=<int> or "random" and ACTIVEDB_WRITESET_EXAMPLES for long runs.
EXAMPLES = int(os.environ.get("ACTIVEDB_WRITESET_EXAMPLES", "150"))
SEED = os.environ.get("ACTIVEDB_TEST_SEED")
SETTINGS = settings(max_examples=EXAMPLES, derandomize=SEED is None, database=None, deadline=None)


def seeded(test):
    """Apply ``ACTIVEDB_TEST_SEED`` if it is an integer."""
    return seed(int(SEED))(test) if SEED not in (None, "random") else test

COLUMNS = ("value", "note")
values_strategy = st.dictionaries(st.sampled_from(COLUMNS), st.integers(0, 3), min_size=1)
rows = st.none() | st.fixed_dictionaries({"value": st.integers(0, 3), "note": st.integers(0, 3)})
# What a node writes (ABSENT is made only by composition: an INSERT, then a DELETE).
kinds = st.sampled_from([kind for kind in EntryKind if kind is not EntryKind.ABSENT])


def entry_of(kind: EntryKind, values: dict) -> Entry:
    return Entry(kind) if kind is EntryKind.DELETE else Entry(kind, dict(values))


entries = st.builds(entry_of, kinds, values_strategy)


def model_apply(kind: EntryKind, values: dict, state: dict | None) -> dict | None:
    """The plain model of one write on a row's state (may raise DuplicateKey)."""
    if kind is EntryKind.PATCH:
        return dict(values) if state is None else {**state, **values}
    if kind is EntryKind.INSERT:
        if state is not None:
            raise DuplicateKey("the row exists")
        return dict(values)
    if kind is EntryKind.DELETE:
        return None
    return dict(values)


def flush_apply(entry: Entry, base: dict | None) -> dict | None:
    """What the flush (``activedb.store.apply_write_set``) does with one row's entry: PATCH upserts,
    INSERT inserts (PostgreSQL refuses an existing key), REPLACE deletes then inserts, DELETE deletes,
    ABSENT checks that the row does not exist and writes nothing."""
    if entry.kind in (EntryKind.INSERT, EntryKind.ABSENT) and base is not None:
        raise DuplicateKey("the flush's INSERT found the row")
    return entry.apply(base)


def compose(chain: list[Entry]) -> Entry | None:
    composed = None
    for entry in chain:
        composed = entry if composed is None else composed.then(entry, "items")
    return composed


class ParentChildWrites(RuleBasedStateMachine):
    """A parent and its current child writing one row over a committed base."""

    def __init__(self):
        super().__init__()
        self.base: dict | None = None
        self.parent: Entry | None = None
        self.child: Entry | None = None
        self.parent_view: dict | None = None     # the model: what the parent sees
        self.child_view: dict | None = None      # the model: what the child sees

    @rule(row=rows)
    def set_base(self, row):
        """Only before anything is written (the base of a tree does not change under its locks)."""
        if self.parent is None and self.child is None:
            self.base = self.parent_view = self.child_view = row

    @rule(kind=kinds, values=values_strategy)
    def write_in_child(self, kind, values):
        try:
            expected = model_apply(kind, values, self.child_view)
        except DuplicateKey:
            # activedb checks an insert against what the child sees before writing anything ...
            assert self._seen_by_child() is not None
            # ... and composing an INSERT after an entry that leaves the row in place refuses too.
            if self.child is not None:
                with pytest.raises(DuplicateKey):
                    self.child.then(entry_of(kind, values), "items")
            return
        entry = entry_of(kind, values)
        self.child = entry if self.child is None else self.child.then(entry, "items")
        self.child_view = expected

    @precondition(lambda self: self.child is not None)
    @rule()
    def commit_child(self):
        self.parent = self.child if self.parent is None else self.parent.then(self.child, "items")
        self.child = None
        self.parent_view = self.child_view

    @rule()
    def abort_child(self):
        self.child = None
        self.child_view = self.parent_view

    @precondition(lambda self: self.child is None and self.parent is not None)
    @rule()
    def flush(self):
        self.base = flush_apply(self.parent, self.base)
        assert self.base == self.parent_view
        self.parent = None

    def _seen_by_child(self) -> dict | None:
        return resolve([entry for entry in (self.parent, self.child) if entry is not None], self.base)

    @invariant()
    def reads_see_the_model(self):
        assert self._seen_by_child() == self.child_view
        assert resolve([self.parent] if self.parent else [], self.base) == self.parent_view

    @invariant()
    def merging_the_child_now_is_what_it_sees(self):
        if self.parent is not None and self.child is not None:
            assert self.parent.then(self.child, "items").apply(self.base) == self.child_view


def test_parent_and_child_writes_match_the_model():
    def factory():
        return ParentChildWrites()

    run_state_machine_as_test(seeded(factory), settings=settings(
        SETTINGS, max_examples=max(1, EXAMPLES // 2), stateful_step_count=30))


@seeded
@SETTINGS
@given(st.lists(entries, max_size=6), rows)
def test_composing_is_applying_one_by_one(chain, base):
    """For every chain the store composes, the composed entry does what the entries do in turn."""
    try:
        composed = compose(chain)
    except DuplicateKey:
        return
    expected = resolve(chain, base)
    assert (composed.apply(base) if composed else base) == expected


@seeded
@SETTINGS
@given(entries, entries, entries)
def test_merging_a_child_is_associative(first, second, third):
    """``first`` (the parent's entry) then the child's ``second.then(third)`` equals composing the three
    in turn -- whenever composing them in turn is allowed."""
    try:
        left = first.then(second, "items").then(third, "items")
    except DuplicateKey:
        return
    assert first.then(second.then(third, "items"), "items") == left


def checked_chain(writes, base) -> tuple[list, dict | None] | None:
    """The entries of ``writes``, each checked against what the tree sees (the model, from ``base``), and the
    model's row after them; None when the model refuses one (a duplicate insert)."""
    state = base
    chain = []
    for kind, values in writes:
        try:
            state = model_apply(kind, values, state)
        except DuplicateKey:
            return None
        chain.append(entry_of(kind, values))
    return chain, state


@seeded
@SETTINGS
@given(st.lists(st.tuples(kinds, values_strategy), min_size=1, max_size=5), rows)
def test_valid_writes_flush_to_the_model(writes, base):
    """Writes each valid against what the tree saw, flushed on the base they saw, give the model's row."""
    checked = checked_chain(writes, base)
    if checked is None:
        return
    chain, state = checked
    assert flush_apply(compose(chain), base) == state


@seeded
@settings(SETTINGS, phases=[Phase.explicit, Phase.generate])     # a counterexample is enough: no shrinking
@example(writes=[(EntryKind.INSERT, {"value": 1}), (EntryKind.DELETE, {})], appeared={"value": 2, "note": 0})
@given(st.lists(st.tuples(kinds, values_strategy), min_size=1, max_size=4), st.fixed_dictionaries(
    {"value": st.integers(0, 3), "note": st.integers(0, 3)}))
def test_flush_on_a_row_that_appeared_since_fails_or_is_serializable(writes, appeared):
    """The writes were checked against an absent row; by the flush another process inserted
    ``appeared``.  The flush must either fail or give what running the writes after that insert
    gives (a serial order)."""
    checked = checked_chain(writes, None)
    if checked is None:
        return
    chain, _ = checked
    try:
        flushed = flush_apply(compose(chain), appeared)
    except DuplicateKey:
        return                                          # the commit fails: nothing written
    serial = appeared
    try:
        for kind, values in writes:
            serial = model_apply(kind, values, serial)
    except DuplicateKey:
        serial = "the tree's insert fails"
    assert flushed == serial, f"flush gave {flushed!r}; after the other insert the tree gives {serial!r}"
