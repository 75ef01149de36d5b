"""Composite events fire activedb rules (through the public rule API) and the engine's state follows the
transaction a batch ran in: an aborted batch leaves the engine as before it."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

import activedb
from activedb import composite
from activedb.events import Timestamp
from tests._tables import item_values
from tests.composite.conftest import FIG2, ev, make_engine, names


@pytest.fixture(autouse=True)
def clean(db):
    with db.engine.begin() as connection:
        connection.execute(sa.text("TRUNCATE items"))
    yield


BATCH_1 = [ev("A", 1.0, "PA", "a0"), ev("B", 1.1, "P1B", "b0"), ev("A", 2.0, "PA", "a1")]
BATCH_2 = [composite.Heartbeat("P1B", Timestamp.at(2.0, 0.005)), composite.Heartbeat("P2B", Timestamp.at(2.0, 0.005))]


def ab_engine(db, **options):
    """An engine of the query AB (an A and a B) over FIG2's producers."""
    return make_engine("CREATE QUERY AB PATTERN AND(A, B) RETURN A.id AS a, B.id AS b", FIG2, db=db, **options)


def after_batch_1(db):
    """``ab_engine`` after BATCH_1 committed: its pair (a0, b0) waits for BATCH_2's heartbeats."""
    engine = ab_engine(db)
    with db.transaction() as tx:
        engine.process(tx, BATCH_1)
    return engine


def compose_then_fail(engine, tx):
    """BATCH_2 in ``tx`` composes the pair (a0, b0), then the batch fails (RuntimeError)."""
    assert names(engine.process(tx, BATCH_2)) == [("a0", "b0")]
    raise RuntimeError("the batch fails after composing")


def test_a_rule_on_a_composite_event_sees_its_interval_and_constituents(db):
    engine = ab_engine(db)
    seen = []

    @db.rule(on=engine.spec("AB"), name="store_composites")
    def store(tx, event):
        seen.append(event)
        tx.insert("items", key=f"{event.payload['a']}&{event.payload['b']}",
                  value=round((event.ts.upper - event.ts.lower) * 1000))

    try:
        with db.transaction() as tx:
            assert engine.process(tx, BATCH_1) == []
        with db.transaction() as tx:
            assert names(engine.process(tx, BATCH_2)) == [("a0", "b0")]
    finally:
        db.rules.remove("store_composites")
    assert item_values(db) == {"a0&b0": 110}                       # [0.995, 1.105] is 110 ms wide
    (event,) = seen
    assert event.kind == "stream" and event.source == "AB"
    assert [constituent["id"] for constituent in event.payload["constituents"]] == ["a0", "b0"]


def test_an_aborted_batch_leaves_the_engine_as_before(db):
    engine = after_batch_1(db)
    before = engine.statistics()
    with pytest.raises(RuntimeError):
        with db.transaction() as tx:
            compose_then_fail(engine, tx)
    assert engine.statistics() == before                      # the composite and the sync-points are undone
    assert engine.producers()["P2B"].sync is None
    with db.transaction() as tx:                              # the re-run composes the same pair again
        assert names(engine.process(tx, BATCH_2)) == [("a0", "b0")]


def test_an_aborted_batch_leaves_no_composite_or_arrival_in_the_engines_window(db):
    """The window (``engine.window()``: the picture, and the composites weak membership checks a late event against)
    kept the arrivals and composites of a batch whose transaction aborted: the picture showed a composite no rule
    ever saw, twice once the batch ran again, and a weak member's old event could be reported as invalidating it."""
    engine = after_batch_1(db)
    before = engine.window()
    with pytest.raises(RuntimeError):
        with db.transaction() as tx:
            compose_then_fail(engine, tx)
    assert engine.window() == before
    with db.transaction() as tx:
        engine.process(tx, BATCH_2)
    assert [composite.describe() for composite in engine.window().composites] == [
        "AB(A#a0[0.995, 1.005]@PA & B#b0[1.095, 1.105]@P1B) [0.995, 1.105]"]


def test_a_batch_in_a_subtransaction_that_aborts_leaves_the_engine_as_before(db):
    """A batch processed in a subtransaction follows that subtransaction: when it aborts (its composites' emits
    undone with it) the engine returns to the state before the batch, though the top-level transaction commits,
    and the batch re-run composes the same pair.  Another node of the tree cannot add a batch to one a
    subtransaction still holds (CompositeError saying where the batch runs); once it committed, its parent can.
    Before, the engine followed the top-level transaction only: the pair was consumed, its rule never ran."""
    engine = after_batch_1(db)
    before = engine.statistics()
    with db.transaction() as tx:
        with pytest.raises(RuntimeError):
            with tx.subtransaction() as child:
                compose_then_fail(engine, child)
    assert engine.statistics() == before
    assert engine.producers()["P2B"].sync is None
    with db.transaction() as tx:
        with tx.subtransaction() as child:
            assert names(engine.process(child, BATCH_2)) == [("a0", "b0")]
            with pytest.raises(composite.CompositeError, match="ran a batch in transaction"):
                engine.process(tx, [])
        assert engine.process(tx, [ev("A", 3.0, "PA", "a2")]) == []       # (the child committed)
    assert engine.statistics().composites == before.composites + 1


def test_a_join_or_leave_during_a_batch_s_transaction_outlives_its_abort(db):
    """``join`` and ``leave`` are no part of a batch: made while a transaction that ran a batch is still open (an
    ingestion runs batch after batch, an application joins producers meanwhile), they stay when that transaction
    aborts, while the batch's own effects go.  Before, the abort restored the membership of its snapshot too: the
    joined producer was gone (its events refused, 'has not joined') and the one that left held compositions back
    again."""
    engine = ab_engine(db)
    with pytest.raises(RuntimeError):
        with db.transaction() as tx:
            engine.process(tx, [ev("A", 1.0, "PA", "a0")])
            engine.join("PC", types=["B"])
            engine.leave("P2B")
            engine.join("PD", types=["B"])
            engine.leave("PD")
            raise RuntimeError("the batch fails")
    producers = engine.producers()
    assert {name: info.state for name, info in producers.items()} == {
        "PA": "joined", "P1B": "joined", "P2B": "left", "PC": "joined", "PD": "left"}
    assert producers["PA"].events == 0 and engine.statistics().events == 0         # the batch itself is undone
    with db.transaction() as tx:
        composed = engine.process(tx, [ev("A", 1.0, "PA", "a0"), ev("B", 1.1, "PC", "c0")] + [
            composite.Heartbeat(producer, Timestamp.at(2.0, 0.005)) for producer in ("PA", "P1B", "PC")])
    assert names(composed) == [("a0", "c0")]          # PC's event taken; P2B, gone, holds nothing back


def test_a_batch_refused_for_an_ended_transaction_leaves_no_stale_snapshot(db):
    """``process`` given a subtransaction that has already committed is refused (it cannot take a batch) and
    changes nothing; the next batch, in its parent, snapshots the engine, so that the parent's abort restores it.
    Before, the refused call's snapshot stayed the current one, and the parent's batch counted as its own (the
    subtransaction had committed into it) without enlisting: the abort restored nothing."""
    engine = after_batch_1(db)
    before = engine.statistics()
    with pytest.raises(RuntimeError):
        with db.transaction() as tx:
            with tx.subtransaction() as child:
                pass
            with pytest.raises(activedb.ActivedbError):
                engine.process(child, BATCH_2)
            assert engine.statistics() == before
            compose_then_fail(engine, tx)
    assert engine.statistics() == before


def test_an_exclusion_after_a_timeout_during_a_batch_s_transaction_outlives_its_abort(db):
    """Under ``on_timeout='exclude'`` a producer silent beyond the timeout leaves without saying so (README,
    'Membership'): that is membership, as ``leave`` is, and no part of the batch whose call found it silent — its
    silence is the clock's, which no abort turns back.  So the abort of the batch's transaction keeps the exclusion
    while the batch's events go, and the batch delivered again composes without waiting for the
    excluded producer.  Before, the abort restored the producer as joined: it held the batch's compositions back
    again, until the end of the call excluded it once more (its composite then left for a later call)."""
    clock = composite.ManualClock()
    engine = ab_engine(db, clock=clock, timeout=2.0, on_timeout="exclude")
    batch = [ev("A", 1.0, "PA", "a0"), ev("B", 1.1, "P1B", "b0")] + [
        composite.Heartbeat(producer, Timestamp.at(3.0, 0.005)) for producer in ("PA", "P1B")]
    with pytest.raises(RuntimeError):
        with db.transaction() as tx:
            assert engine.process(tx, batch) == []          # AB waits for P2B
            clock.advance(3.0)
            engine.process(tx, [])                          # P2B silent for 3 s: excluded
            assert engine.producers()["P2B"].state == "left"
            raise RuntimeError("the batch fails")
    assert engine.producers()["P2B"].state == "left"
    assert engine.statistics().events == 0          # the batch itself is undone
    assert engine.statistics().excluded == 1        # the exclusion is not, nor its count
    with db.transaction() as tx:
        composed = engine.process(tx, batch)
    assert names(composed) == [("a0", "b0")]


def test_a_refused_input_of_process_says_how_many_were_taken_and_to_abort_the_transaction(db):
    """``process(tx, items)`` stops at the first input it refuses, as ``submit`` does: the error says which input
    (index and event), that the ones before it were taken and those after not, and that aborting ``tx`` takes the
    engine back to before the batch — which it does."""
    engine = ab_engine(db)
    before = engine.statistics()
    wrong = ev("B", 1.2, "PA", "b-from-PA")
    with pytest.raises(composite.EventRejected) as caught:
        with db.transaction() as tx:
            engine.process(tx, [*BATCH_1[:2], wrong, BATCH_1[2]])
    message = str(caught.value)
    assert "input 2 of the call (B#b-from-PA" in message and "the 2 inputs before it were taken" in message, message
    assert "abort tx" in message, message
    assert engine.statistics() == before          # (the transaction aborted: the two taken are undone)


def test_composites_after_one_whose_rule_raises_are_left_for_take_outputs(db):
    """``process(tx, …)`` emits its composites one by one; a rule raising on one raises ``RuleFailed`` out of the
    call.  A caller that catches it and commits anyway lost the composites after it: neither emitted nor in
    ``take_outputs()``.  Now they stay for ``take_outputs()``."""
    engine = make_engine("CREATE QUERY AB PATTERN SEQ(A, B) RETURN A.id AS a, B.id AS b", {"PA": ["A"], "PB": ["B"]},
                         db=db)

    @db.rule(on=engine.spec("AB"), name="refuse_a0")
    def refuse(tx, event):
        if event.payload["a"] == "a0":
            raise ValueError("a0 refused")

    try:
        with db.transaction() as tx:
            with pytest.raises(activedb.errors.RuleFailed, match="a0 refused"):
                engine.process(tx, [ev("A", 1.0, "PA", "a0"), ev("B", 1.1, "PB", "b0"), ev("A", 2.0, "PA", "a1"),
                                    ev("B", 2.1, "PB", "b1"), composite.Heartbeat("PA", Timestamp.at(3.0, 0.005)),
                                    composite.Heartbeat("PB", Timestamp.at(3.0, 0.005))])
        assert names(engine.take_outputs()) == [("a1", "b1")]
    finally:
        db.rules.remove("refuse_a0")
