"""Hermitage's anomalies in every (or a bounded, seeded sample of) valid permutation, in three pairings.

Martin Kleppmann's *Hermitage* ("Hermitage: Testing the 'I' in ACID", 2014), after Atul Adya's thesis
"Weak Consistency: A Generalized Theory and Optimistic Implementations for Distributed Transactions"
(MIT, 1999) and Fekete, O'Neil and O'Neil's "A Read-Only Transaction Anomaly Under Snapshot Isolation"
(SIGMOD Record, 2004), lists the anomalies
a serializable system must rule out: G0 (write cycles), G1a (aborted reads), G1b (intermediate reads),
G1c (circular information flow), OTV (observed transaction vanishes), PMP (predicate-many-preceders) and
its write variant, P4 (lost update), G-single (read skew) and its predicate and write variants, G2-item
(write skew) and G2 (anti-dependency cycles with predicates, including Fekete's two-edge example).  Each
is a :class:`Scenario` below, written like a PostgreSQL isolation spec: sessions of named steps and
Hermitage's interleaving as an explicit permutation.  Where Hermitage's order asks a session for a step
while our locks block it (Hermitage ran on snapshot-based systems), the permutation is the nearest valid
one — the blocked step's session continues after its blocker's commit; every other valid order is
generated anyway.

**Pairings.**  Every scenario runs between two (or three) top-level transactions, between sibling
subtransactions of one parent, and between a parent and its running child(ren), with either T1 or T2 as
the parent (``parent=T1``, ``parent=T2``).  The parent's spawn is a step of the permutation (``s1`` or
``s2``), placed before any of the parent's steps up to its commit: what the parent did before it is
*retained* (the children may use those rows), what it does after is *held* by its own operations (the
children wait for them).  Between siblings, "T1 commits before T2" means T1's work is merged into the
parent, which retains T1's locks, so T2 may use those rows from then on and sees T1's writes.

**What "T1 commits before T2" means for a parent and its child.**  A parent cannot commit before its
children end (it waits for them; the lock manager's commit edge parent → child).  So in a permutation
where the parent's commit step comes first, that step means "the parent stops operating and waits": its
own operations' locks become *retained* (its segment commits, so Rule 1 grants them to the child), the
step blocks until the child's commit (or abort) step, and then the parent commits — its commit always
takes effect *after* the child's.  Conversely a child's commit merges its work into the parent, which
sees it from then on.  For serializability the child is one unit placed between two of the parent's
own steps (the parent's steps keep their order, and a child comes after the parent's ``Spawn``): the
parent's commit step orders nothing, it is where the parent stops.  A parent's abort aborts its
children; it blocks until each child's next step (which then fails with ``TransactionAborted``) ends it.

**Assertions**, for every permutation run: (1) the committed outcome is serializable — the final state and
every committed session's reads equal those of some serial order of the committed sessions
(:func:`serial_witness`); (2) ``activedb.testing.check_history`` finds the recorded history conflict
serializable and the ACTA axioms hold; (3) no lock-manager transaction outlives the run; (4) the outcome
of a step is a value or one of the expected failures (``Deadlock``, ``SerializationConflict``, the
``TransactionAborted`` of a doomed subtree).  Per scenario and pairing, at least one permutation commits
every session that does not abort on purpose (the checks are not vacuous), and a hang — a step that
neither completes nor blocks within ``STEP_TIMEOUT``, or every session blocked without a deadlock — fails
with the wait-for graph after aborting every transaction of the run.

**Bugs A and B of the tree-isolation regressions** are scenarios of their own among the parent/child permutations (``bug-A``,
``bug-B-commit``, ``bug-B-join``): A, a child re-reading a row its parent wrote before spawning it; B,
a parent locking a row while its child runs and then waiting for the child (commit or ``handle.result``).
With the fix reverted, the generic scenarios find both as well: A as non-serializable reads (a second
read or a predicate re-evaluation returning the committed image instead of an ancestor's newer version —
between siblings too, once a sibling's commit made its writes the parent's), B as hangs the runner
diagnoses as "parent waits for its children while its own operations still hold locks".

**A bug these permutations found** with the fix in place — a doomed child whose function returns
normally never ended — is fixed (``Transaction.commit`` aborts a doomed node); its minimal reproduction
is the last test of this file.

Running it: CI runs every explicit permutation plus a seeded sample of generated ones, at most
``ACTIVEDB_ISOLATION_PERMUTATIONS`` (default 25) per scenario and pairing — about 800 runs, 10–20 s on
two cores — chosen with the seed ``ACTIVEDB_ISOLATION_SEED`` (default 20240609).
``ACTIVEDB_ISOLATION_EXHAUSTIVE=1`` runs every valid permutation (1,843 runs, 25–40 s).
``ACTIVEDB_ISOLATION_STEP_TIMEOUT`` (seconds, default 10) bounds a step that neither completes nor
blocks; after the first hang in a scenario and pairing the rest of it is given up.
"""

from __future__ import annotations

import os
import random
import threading
from dataclasses import dataclass, field

import pytest

import activedb
from activedb import testing
from tests.scenarios._isolation_tester import (
    PARENT_T1,
    PARENT_T2,
    SIBLINGS,
    TOP_LEVEL,
    Abort,
    Commit,
    DeleteWhere,
    Increment,
    Insert,
    InvalidPermutation,
    IsolationHang,
    Join,
    PermutationRunner,
    PermutationTree,
    Predicate,
    Read,
    ReadMany,
    Scan,
    Scenario,
    Spawn,
    UpdateWhere,
    Write,
    serial_witness,
)

pytestmark = pytest.mark.db(record_history=True)

SEED = int(os.environ.get("ACTIVEDB_ISOLATION_SEED", "20240609"))
EXHAUSTIVE = os.environ.get("ACTIVEDB_ISOLATION_EXHAUSTIVE", "") not in ("", "0")
TIMEOUT = 10
CAP = None if EXHAUSTIVE else int(os.environ.get("ACTIVEDB_ISOLATION_PERMUTATIONS", "25"))
MAX_HANGS = 1

ALL = Predicate()
EQ20, EQ30, EQ10 = Predicate(equals=20), Predicate(equals=30), Predicate(equals=10)
MOD3, MOD5 = Predicate(modulo=3), Predicate(modulo=5)

# Initial state everywhere (Hermitage's rows 1 => 10, 2 => 20): x = 10, y = 20.
SCENARIOS = [
    Scenario.of("G0", "write cycles: no dirty write, x and y from the same transaction", {
        "T1": [("w1x", Write("x", 11)), ("w1y", Write("y", 21)), ("c1", Commit())],
        "T2": [("w2x", Write("x", 12)), ("w2y", Write("y", 22)), ("c2", Commit())],
    }, permutations=["w1x w2x w1y c1 w2y c2"]),

    Scenario.of("G1a", "aborted reads: never see an aborted write", {
        "T1": [("w1x", Write("x", 101)), ("a1", Abort())],
        "T2": [("r2x", Read("x")), ("r2x2", Read("x")), ("c2", Commit())],
    }, permutations=["w1x r2x a1 r2x2 c2"]),

    Scenario.of("G1b", "intermediate reads: never see a value its writer overwrote", {
        "T1": [("w1x", Write("x", 101)), ("w1x2", Write("x", 11)), ("c1", Commit())],
        "T2": [("r2x", Read("x")), ("r2x2", Read("x")), ("c2", Commit())],
    }, permutations=["w1x r2x w1x2 c1 r2x2 c2"]),

    Scenario.of("G1c", "circular information flow: not each reading the other's write", {
        "T1": [("w1x", Write("x", 11)), ("r1y", Read("y")), ("c1", Commit())],
        "T2": [("w2y", Write("y", 22)), ("r2x", Read("x")), ("c2", Commit())],
    }, permutations=["w1x w2y r1y r2x c1 c2"]),

    Scenario.of("OTV", "observed transaction vanishes: a reader sees one writer's x and y, not a mix", {
        "T1": [("w1x", Write("x", 11)), ("w1y", Write("y", 19)), ("c1", Commit())],
        "T2": [("w2x", Write("x", 12)), ("w2y", Write("y", 18)), ("c2", Commit())],
        "T3": [("r3x", Read("x")), ("r3y", Read("y")), ("r3y2", Read("y")), ("r3x2", Read("x")), ("c3", Commit())],
    }, permutations=["w1x w1y w2x c1 r3x w2y c2 r3y r3y2 r3x2 c3"]),

    Scenario.of("PMP", "predicate-many-preceders: a predicate read does not miss a row inserted meanwhile", {
        "T1": [("r1p30", Scan(EQ30)), ("r1p3", Scan(MOD3)), ("c1", Commit())],
        "T2": [("i2z", Insert("z", 30)), ("c2", Commit())],
    }, permutations=["r1p30 i2z r1p3 c1 c2"]),

    Scenario.of("PMP-write", "predicate-many-preceders, write: a delete by predicate sees a concurrent update", {
        "T1": [("u1all", UpdateWhere(ALL, add=10)), ("c1", Commit())],
        "T2": [("r2p20", Scan(EQ20)), ("d2p20", DeleteWhere(EQ20)), ("r2p20b", Scan(EQ20)), ("c2", Commit())],
    }, permutations=["u1all r2p20 c1 d2p20 r2p20b c2"]),

    Scenario.of("P4", "lost update: two read-then-write updates of one row", {
        "T1": [("r1x", Read("x")), ("w1x", Write("x", 11)), ("c1", Commit())],
        "T2": [("r2x", Read("x")), ("w2x", Write("x", 11)), ("c2", Commit())],
    }, permutations=["r1x r2x w1x w2x c1 c2"]),

    Scenario.of("G-single", "read skew: a reader sees x and y of the same state", {
        "T1": [("r1x", Read("x")), ("r1y", Read("y")), ("c1", Commit())],
        "T2": [("r2x", Read("x")), ("r2y", Read("y")), ("w2x", Write("x", 12)), ("w2y", Write("y", 18)),
               ("c2", Commit())],
    }, permutations=["r1x r2x r2y w2x r1y c1 w2y c2"]),

    Scenario.of("G-single-predicate", "read skew with predicate dependencies", {
        "T1": [("r1p5", Scan(MOD5)), ("r1p3", Scan(MOD3)), ("c1", Commit())],
        "T2": [("u2p10", UpdateWhere(EQ10, set_to=12)), ("c2", Commit())],
    }, permutations=["r1p5 u2p10 r1p3 c1 c2"]),

    # Hermitage's G-single-write-1 and -2 are one scenario in two orders (T1 aborts there because
    # PostgreSQL fails it; here T1 commits, so the check has something to check).
    Scenario.of("G-single-write", "read skew, write variants: a delete by predicate after a stale read", {
        "T1": [("r1x", Read("x")), ("d1p20", DeleteWhere(EQ20)), ("c1", Commit())],
        "T2": [("r2all", Scan(ALL)), ("w2x", Write("x", 12)), ("w2y", Write("y", 18)), ("c2", Commit())],
    }, permutations=["r1x r2all w2x d1p20 w2y c2 c1", "r1x r2all d1p20 w2x w2y c1 c2"]),

    Scenario.of("G2-item", "write skew: each reads both rows and writes the other", {
        "T1": [("r1xy", ReadMany(("x", "y"))), ("w1y", Write("y", 21)), ("c1", Commit())],
        "T2": [("r2xy", ReadMany(("x", "y"))), ("w2x", Write("x", 11)), ("c2", Commit())],
    }, permutations=["r1xy r2xy w2x w1y c1 c2"]),

    Scenario.of("G2", "anti-dependency cycle with predicates: each inserts a row the other's scan matches", {
        "T1": [("r1p3", Scan(MOD3)), ("i1z", Insert("z", 30)), ("c1", Commit())],
        "T2": [("r2p3", Scan(MOD3)), ("i2v", Insert("v", 42)), ("c2", Commit())],
    }, permutations=["r1p3 r2p3 i1z i2v c1 c2"]),

    Scenario.of("G2-two-edges", "Fekete's read-only anomaly: a reader orders two writers", {
        "T1": [("r1all", Scan(ALL)), ("w1x", Write("x", 0)), ("c1", Commit())],
        "T2": [("inc2y", Increment("y", 5)), ("c2", Commit())],
        "T3": [("r3all", Scan(ALL)), ("c3", Commit())],
    }, permutations=["r1all inc2y w1x c1 c2 r3all c3"]),

    # Bug A (tree isolation): the parent writes x without reading it, spawns the child; the child reads x, then
    # reads it again to increment it.  The buggy read path consulted the child's cached committed image
    # before the parent's write, so the second read returned 10, not 11.
    Scenario.of("bug-A", "a child re-reading a row its parent wrote", {
        "T1": [("w1x", Write("x", 11)), ("s1", Spawn()), ("c1", Commit())],
        "T2": [("r2x", Read("x")), ("inc2x", Increment("x", 1)), ("c2", Commit())],
    }, permutations=["w1x s1 r2x inc2x c2 c1", "w1x s1 r2x inc2x c1 c2"], pairings=["parent=T1"]),

    # Bug B (tree isolation): the parent locks x in its own operations while the child runs, then waits for the
    # child — by committing, or by handle.result() and carrying on.  The buggy parent kept holding x in
    # its segment while it waited for a child that waited for x: a hang the lock manager could not see.
    Scenario.of("bug-B-commit", "a parent that read a row waits (commit) for a child that writes it", {
        "T1": [("r1x", Read("x")), ("c1", Commit())],
        "T2": [("inc2x", Increment("x", 5)), ("c2", Commit())],
    }, permutations=["r1x inc2x c1 c2", "r1x c1 inc2x c2"], pairings=["parent=T1"]),

    Scenario.of("bug-B-join", "a parent that wrote a row waits (handle.result) for a child that updates it", {
        "T1": [("w1x", Write("x", 100)), ("j1", Join()), ("r1x", Read("x")), ("c1", Commit())],
        "T2": [("inc2x", Increment("x", 5)), ("c2", Commit())],
    }, permutations=["w1x inc2x j1 c2 r1x c1", "w1x j1 inc2x c2 r1x c1"], pairings=["parent=T1"]),
]

PAIRINGS = [TOP_LEVEL, SIBLINGS, PARENT_T1, PARENT_T2]
CASES = [pytest.param(scenario, pairing, id=f"{scenario.name}-{pairing.id}")
         for scenario in SCENARIOS for pairing in PAIRINGS if scenario.runs_as(pairing)]

# The failures a step may end with; anything else fails the test.
EXPECTED_ERRORS = (activedb.DeadlockDetected, activedb.SerializationConflict, activedb.TransactionAborted)


class PermutationFailed(AssertionError):
    """One permutation's run broke an assertion (the message shows the run)."""


def check_run(outcome) -> None:
    """The assertions of one permutation run (see the module docstring)."""
    unexpected = {name: error for name, error in outcome.errors.items() if not isinstance(error, EXPECTED_ERRORS)}
    if unexpected:
        raise PermutationFailed(f"unexpected errors {unexpected!r}\n{outcome.describe()}")
    witness, why = serial_witness(outcome)
    if witness is None:
        raise PermutationFailed(f"{why}\n{outcome.describe()}")
    if outcome.leaked_transactions:
        raise PermutationFailed(f"{outcome.leaked_transactions} lock-manager transactions outlived the run\n"
                                f"{outcome.describe()}")
    report = testing.check_history(outcome.history)
    if not report.ok:
        raise PermutationFailed(f"history: {report.violations[:5]}\n{outcome.describe()}")




def run_scenario(db, scenario, pairing, *, cap=CAP, seed=SEED):
    """Every explicit permutation (an invalid one is recorded, not failed), then generated ones until the
    tree is exhausted or ``cap`` runs were made.  A failing permutation is recorded and the others still
    run — until ``MAX_HANGS`` hangs (each costs ``STEP_TIMEOUT``), after which the rest is given up."""
    runner = PermutationRunner(db, scenario, pairing)
    tree = PermutationTree(random.Random(f"{seed}:{scenario.name}:{pairing.id}"))
    result = ScenarioResult(tree)
    explicit = [f"{runner.spawn_step_name} {permutation}" if runner.spawn_step_name else permutation
                for permutation in scenario.permutations]     # Hermitage's orders: the parent spawns first
    while result.hangs < MAX_HANGS:
        if explicit:
            permutation = explicit.pop(0)
        elif tree.exhausted or (cap is not None and result.runs >= cap):
            break
        else:
            permutation = None
        choose, finished = tree.walk(permutation)
        try:
            outcome = runner.run(choose)
        except InvalidPermutation as error:
            result.invalid.append(f"{permutation}: {error}")
            continue
        except IsolationHang as error:
            finished(abandoned=True)
            result.hangs += 1
            result.failures.append(str(error))
            continue
        finished()
        result.outcomes.append(outcome)
        try:
            check_run(outcome)
        except PermutationFailed as error:
            result.failures.append(str(error))
    return result


@dataclass
class ScenarioResult:
    tree: PermutationTree
    outcomes: list = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    invalid: list[str] = field(default_factory=list)
    hangs: int = 0

    @property
    def runs(self) -> int:
        return len(self.outcomes) + self.hangs


def aborts_on_purpose(scenario, session) -> bool:
    return any(isinstance(step.op, Abort) for step in scenario.sessions[session])


@pytest.mark.parametrize(("scenario", "pairing"), CASES)
def test_every_permutation_is_serializable(db, scenario, pairing):
    result = run_scenario(db, scenario, pairing)
    if result.failures:
        pytest.fail(f"{len(result.failures)} of {result.runs} permutations failed"
                    f"{' (the rest was given up after a hang)' if result.hangs >= MAX_HANGS else ''}:\n\n"
                    + "\n\n".join(result.failures[:4]), pytrace=False)
    assert result.outcomes, f"no valid permutation ran; invalid: {result.invalid}"
    should_commit = {name for name in scenario.sessions if not aborts_on_purpose(scenario, name)}
    if pairing.parent is not None and aborts_on_purpose(scenario, pairing.parent):
        should_commit = set()          # a parent's abort aborts its children
    assert any(outcome.committed == should_commit for outcome in result.outcomes), (
        f"no permutation committed all of {sorted(should_commit)}:\n"
        + "\n".join(outcome.describe() for outcome in result.outcomes))


def test_a_doomed_child_whose_function_returns_ends_aborted(db):
    """Found by these permutations (G1a, parent=T1, ``w1x s1 r2x r2x2 a1 c2``): the parent aborts while its
    spawned child runs, then the child's function returns normally.  The child ends ABORTED (and the
    history records it) — it used to stay ACTIVE for good, its commit refusing before aborting it."""
    db.history.clear()
    started, go = threading.Event(), threading.Event()
    with testing.Watchdog(60, db.transactions.locks):
        with db.transaction() as tx:
            handle = tx.spawn(lambda child: (started.set(), go.wait(TIMEOUT)))
            assert started.wait(TIMEOUT)
            aborter = threading.Thread(target=tx.abort, args=("the parent aborts",))
            aborter.start()          # dooms the child, aborts the tree's locks, then waits for the child
            testing.wait_until(lambda: db.transactions.locks.statistics().transactions == 0, TIMEOUT,
                               "the lock manager to abort the tree")
            go.set()                 # the child's function returns normally
            aborter.join(TIMEOUT)
            assert not aborter.is_alive()
    with pytest.raises(activedb.TransactionAborted):
        handle.result(0)
    assert handle.state is activedb.TxnState.ABORTED, f"the child is {handle.state.value}"
    testing.check_history(db.history.snapshot()).assert_ok()
