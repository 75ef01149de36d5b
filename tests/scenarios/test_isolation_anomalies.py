"""Adya/Hermitage isolation anomalies, as named steps in explicit orders.

Each scenario is run twice: between two top-level transactions, and between two
sibling subtransactions of one parent.  These are single, hand-checked interleavings
with their expected outcomes spelled out; ``test_isolation_permutations.py`` runs the
same anomalies (and more) in every valid interleaving and three pairings, with a
generic serializability check.  Every transaction is an *actor* on its
own thread that executes the steps it is sent; the test sends steps in the
scenario's order and, for a step that must block, waits until the lock manager
shows one more waiter (observable state), never by sleeping.
"""

from __future__ import annotations

import threading

import pytest
import sqlalchemy as sa

import activedb
from activedb import testing
from lockmgr import Deadlock
from tests import _actors as actors

pytestmark = pytest.mark.db(record_history=True)

TIMEOUT = 20
BLOCKED = "blocked"


@pytest.fixture(autouse=True)
def initial_state(db):
    with db.engine.begin() as connection:
        connection.execute(sa.text("DELETE FROM items"))
        connection.execute(sa.text("INSERT INTO items (key, value) VALUES ('x', 10), ('y', 20)"))
    db.history.clear()
    yield
    testing.check_history(db.history.snapshot()).assert_ok()


class Actor(actors.Actor):
    """One transaction as an actor (``tests/_actors.py``); ``step`` returns the result or BLOCKED."""

    def __init__(self, db, name: str):
        super().__init__(name, idle_timeout=TIMEOUT)
        self.db = db
        self.outcome: str | None = None
        self.error: BaseException | None = None

    def step(self, function, *, blocks: bool = False):
        waiting_before = self.db.transactions.locks.statistics().waiting
        self.inbox.put(function)
        if blocks:
            testing.wait_until(
                lambda: not self.outbox.empty() or self.db.transactions.locks.statistics().waiting > waiting_before,
                TIMEOUT, f"{self.name} to block")
            if not self.outbox.empty():
                raise AssertionError(f"{self.name}'s step was expected to block but completed: "
                                     f"{self.take(TIMEOUT)!r}")
            return BLOCKED
        return self.take(TIMEOUT)

    def resume(self):
        """The result of a step that blocked earlier."""
        return self.take(TIMEOUT)

    def finish(self, commit: bool = True) -> None:
        self.inbox.put(actors.COMMIT if commit else actors.ABORT)


class TopLevelPair:
    """Two top-level transactions."""

    def __init__(self, db):
        self.db = db
        self.actors = [Actor(db, "T1"), Actor(db, "T2")]
        self.threads = [threading.Thread(target=self._run, args=(actor,)) for actor in self.actors]
        for thread in self.threads:
            thread.start()

    def _run(self, actor: Actor) -> None:
        try:
            with self.db.transaction() as tx:
                actor.serve(tx)
            actor.outcome = "committed"
        except BaseException as error:
            actor.outcome, actor.error = "aborted", error

    def wait_ended(self, actor: Actor) -> str:
        self.threads[self.actors.index(actor)].join(TIMEOUT)
        assert actor.outcome is not None, f"{actor.name} did not end"
        return actor.outcome

    def close(self) -> None:
        for thread in self.threads:
            thread.join(TIMEOUT)
            assert not thread.is_alive()


class SiblingPair(TopLevelPair):
    """Two sibling subtransactions of one top-level parent."""

    def __init__(self, db):
        self.db = db
        self.actors = [Actor(db, "S1"), Actor(db, "S2")]
        self._ended = {actor.name: threading.Event() for actor in self.actors}
        self.parent_thread = threading.Thread(target=self._parent)
        self.parent_thread.start()
        self.threads = []

    def _parent(self) -> None:
        with self.db.transaction() as tx:
            handles = [tx.spawn(self._child, actor) for actor in self.actors]
            for handle in handles:
                try:
                    handle.result(TIMEOUT)
                except BaseException:
                    pass   # the child's outcome is recorded; the parent decides to commit anyway

    def _child(self, tx, actor: Actor) -> None:
        try:
            actor.serve(tx)
            actor.outcome = "committed"   # the child commits right after its body returns
        except BaseException as error:
            actor.outcome, actor.error = "aborted", error
            raise
        finally:
            self._ended[actor.name].set()

    def wait_ended(self, actor: Actor) -> str:
        assert self._ended[actor.name].wait(TIMEOUT), f"{actor.name} did not end"
        final = (activedb.TxnState.COMMITTED, activedb.TxnState.ABORTED)
        state = testing.wait_until(lambda: actor.tx.state in final and actor.tx.state, TIMEOUT, "child end")
        return "committed" if state is activedb.TxnState.COMMITTED else "aborted"

    def close(self) -> None:
        self.parent_thread.join(TIMEOUT)
        assert not self.parent_thread.is_alive()


PAIRS = {"top-level": TopLevelPair, "siblings": SiblingPair}


def read(key):
    return lambda tx: (tx.read("items", key) or {}).get("value")


def write(key, value):
    return lambda tx: tx.write("items", key, value=value)


def committed_values(db):
    with db.engine.connect() as connection:
        return dict(connection.execute(sa.text("SELECT key, value FROM items")).all())


@pytest.mark.parametrize("kind", PAIRS)
def test_g0_dirty_write(db, kind):
    pair = PAIRS[kind](db)
    t1, t2 = pair.actors
    t1.step(write("x", 11))
    assert t2.step(write("x", 12), blocks=True) == BLOCKED
    t1.step(write("y", 21))
    t1.finish()
    assert pair.wait_ended(t1) == "committed"
    t2.resume()
    t2.step(write("y", 22))
    t2.finish()
    assert pair.wait_ended(t2) == "committed"
    pair.close()
    assert committed_values(db) == {"x": 12, "y": 22}    # never x from one and y from the other


@pytest.mark.parametrize("kind", PAIRS)
def test_g1a_aborted_read(db, kind):
    pair = PAIRS[kind](db)
    t1, t2 = pair.actors
    t1.step(write("x", 101))
    assert t2.step(read("x"), blocks=True) == BLOCKED
    t1.finish(commit=False)
    assert pair.wait_ended(t1) == "aborted"
    assert t2.resume() == 10
    t2.finish()
    pair.close()
    assert committed_values(db) == {"x": 10, "y": 20}


@pytest.mark.parametrize("kind", PAIRS)
def test_g1b_intermediate_read(db, kind):
    pair = PAIRS[kind](db)
    t1, t2 = pair.actors
    t1.step(write("x", 101))
    assert t2.step(read("x"), blocks=True) == BLOCKED
    t1.step(write("x", 11))
    t1.finish()
    pair.wait_ended(t1)
    assert t2.resume() == 11          # never the intermediate 101
    t2.finish()
    pair.close()


@pytest.mark.parametrize("kind", PAIRS)
def test_g1c_circular_information_flow(db, kind):
    pair = PAIRS[kind](db)
    t1, t2 = pair.actors
    t1.step(write("x", 11))
    t2.step(write("y", 22))
    assert t1.step(read("y"), blocks=True) == BLOCKED
    with pytest.raises(Deadlock):      # T2 closes the cycle: the requester is the victim
        t2.step(read("x"))
    assert pair.wait_ended(t2) == "aborted"
    assert t1.resume() == 20           # T2's write vanished with its abort
    t1.finish()
    assert pair.wait_ended(t1) == "committed"
    pair.close()
    assert committed_values(db) == {"x": 11, "y": 20}


@pytest.mark.parametrize("kind", PAIRS)
def test_otv_observed_transaction_vanishes(db, kind):
    pair = PAIRS[kind](db)
    t1, t2 = pair.actors
    t1.step(write("x", 11))
    t1.step(write("y", 19))
    assert t2.step(write("x", 12), blocks=True) == BLOCKED
    t1.finish()
    pair.wait_ended(t1)
    t2.resume()
    t2.step(write("y", 18))
    t2.finish()
    pair.wait_ended(t2)
    pair.close()
    with db.transaction() as tx:
        assert (tx.read("items", "x")["value"], tx.read("items", "y")["value"]) == (12, 18)


@pytest.mark.parametrize("kind", PAIRS)
def test_lost_update(db, kind):
    pair = PAIRS[kind](db)
    t1, t2 = pair.actors
    assert t1.step(read("x")) == 10
    assert t2.step(read("x")) == 10
    assert t1.step(write("x", 11), blocks=True) == BLOCKED      # upgrade waits for T2's read lock
    with pytest.raises(Deadlock):                              # conversion deadlock; T2 is the victim
        t2.step(write("x", 11))
    pair.wait_ended(t2)
    t1.resume()
    t1.finish()
    pair.wait_ended(t1)
    pair.close()
    assert committed_values(db)["x"] == 11   # T2's update was not silently lost: T2 aborted


@pytest.mark.parametrize("kind", PAIRS)
def test_read_skew(db, kind):
    pair = PAIRS[kind](db)
    t1, t2 = pair.actors
    assert t1.step(read("x")) == 10
    assert t2.step(read("x")) == 10
    assert t2.step(read("y")) == 20
    assert t2.step(write("x", 12), blocks=True) == BLOCKED
    assert t1.step(read("y")) == 20     # consistent with the x it read
    t1.finish()
    pair.wait_ended(t1)
    t2.resume()
    t2.step(write("y", 18))
    t2.finish()
    pair.wait_ended(t2)
    pair.close()
    assert committed_values(db) == {"x": 12, "y": 18}


@pytest.mark.parametrize("kind", PAIRS)
def test_write_skew(db, kind):
    pair = PAIRS[kind](db)
    t1, t2 = pair.actors
    t1.step(read("x")), t1.step(read("y"))
    t2.step(read("x")), t2.step(read("y"))
    assert t1.step(write("x", 11), blocks=True) == BLOCKED
    with pytest.raises(Deadlock):
        t2.step(write("y", 21))
    pair.wait_ended(t2)
    t1.resume()
    t1.finish()
    pair.wait_ended(t1)
    pair.close()
    assert committed_values(db) == {"x": 11, "y": 20}
