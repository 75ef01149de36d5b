"""The engine's kept state under a released punctuation (the design note's "State between batches"): a partition's
events that a punctuation has put outside its query's ``WITHIN`` of every later event are dropped then, under every
scheduler, in memory and in the saved state — a stream of ever new keys (an order number) keeps only what can
still match — and nothing that can still match is dropped (the outputs are those of one batch with no punctuation
before the end)."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import random

import pytest
import sqlalchemy as sa

from activedb import streams
from activedb.streams import _persist
from activedb.streams._matcher import Matcher, PartitionState

WINDOW = 10        # WITHIN 10 sec

QUERIES = f"""
CREATE QUERY Shipped ON orders
PATTERN SEQ(PLACED, !CANCELLED, SHIPPED)
WHERE [orderno]
WITHIN {WINDOW} sec
RETURN SHIPPED.orderno;
CREATE QUERY NextShipped ON orders
PATTERN SEQ(PLACED, SHIPPED)
WHERE [orderno]
WITHIN {WINDOW} sec
MATCHING SKIP TILL NEXT MATCH
RETURN SHIPPED.orderno;
CREATE QUERY Ever ON orders
PATTERN SEQ(PLACED, SHIPPED)
WHERE [orderno]
RETURN SHIPPED.orderno
"""
WINDOWED = ("Shipped", "NextShipped")


def orders_engine(db, name: str, scheduler: str = "sei", **options: object) -> streams.StreamEngine:
    engine = streams.StreamEngine(db, name=name, scheduler=scheduler, **options)  # type: ignore[arg-type]
    engine.create_stream("orders", types=("PLACED", "CANCELLED", "SHIPPED"), attributes=("orderno",))
    engine.define(QUERIES)
    return engine


def order(event_type: str, ts: object, number: int) -> streams.StreamEvent:
    return streams.StreamEvent(event_type, ts, {"orderno": number})


def kept(engine: streams.StreamEngine, query: str) -> dict[tuple[object, ...], int]:
    """The events ``engine`` keeps for ``query``, by partition (its committed state)."""
    return {key: state.size() for key, state in engine.partitions(query).items()}


def saved_partition_events(db, name: str) -> int:
    """How many events the saved partition rows of engine ``name`` hold (each event once per row)."""
    with db.engine.connect() as connection:
        values = connection.execute(sa.text("SELECT value FROM activedb_stream_state WHERE engine = :name AND "
                                            "kind = 'partitions'"), {"name": name}).scalars().all()
    return sum(len((value if isinstance(value, dict) else json.loads(value))["events"]["ts"]) for value in values)


def outputs(result: streams.BatchResult) -> list[tuple[str, object, object]]:
    return sorted((output.query, output.ts, output.attributes["orderno"]) for output in result.outputs)


@pytest.mark.parametrize("scheduler", ["sei", "s2pl", "lwm"])
def test_a_punctuation_drops_the_partitions_of_keys_that_never_come_again(db, scheduler):
    """Orders placed once each, never shipped, fed in batches each punctuated past its events: a partition whose
    events are all more than WITHIN before the released punctuation is dropped by that batch, in memory and in the
    saved state.  Before, every partition stayed (a key that never came again was never looked at), so the state
    grew with every batch — 30 batches of 20 orders kept 600 partitions, and the saved rows their 600 events."""
    name = f"orders-{scheduler}"
    engine = orders_engine(db, name, scheduler)
    size = 20
    for batch in range(30):
        first = batch * size
        engine.feed([order("PLACED", ts, ts) for ts in range(first, first + size)], punctuation=first + size)
    punctuation = 30 * size
    # What can still match: a later event has ts >= the punctuation, and WITHIN keeps an event it is at most
    # WINDOW after — so the orders placed at punctuation - WINDOW and later.
    still = {(number,): 1 for number in range(punctuation - WINDOW, punctuation)}
    for query in WINDOWED:
        assert kept(engine, query) == still, query
    assert len(kept(engine, "Ever")) == punctuation          # no WITHIN: every partition is kept (until the end)
    restarted = orders_engine(db, name, scheduler)            # the saved state, read by a new engine object
    for query in WINDOWED:
        assert kept(restarted, query) == still, query
    # The saved rows hold each kept event once (the queries share it): the kept orders, and Ever's every order.
    assert saved_partition_events(db, name) == punctuation


@pytest.mark.parametrize("scheduler", ["sei", "s2pl", "lwm"])
def test_an_event_within_the_window_of_the_punctuation_is_kept_and_still_matches(db, scheduler):
    """The boundary is the matcher's: an event exactly WITHIN before the punctuation may still pair with an event
    at the punctuation (WITHIN includes its bound), so it is kept and matches; one a little earlier is dropped and
    could not match anyway.  The outputs equal those of one batch with no punctuation before the end."""
    events = [order("PLACED", 100, 1), order("PLACED", 89.5, 2), order("PLACED", 95, 3), order("CANCELLED", 96, 3),
              order("PLACED", 99, 4), order("CANCELLED", 88, 4), order("PLACED", 90, 5)]
    later = [order("SHIPPED", 100, 1), order("SHIPPED", 100, 2), order("SHIPPED", 100, 3), order("SHIPPED", 100, 4),
             order("SHIPPED", 100, 5)]
    engine = orders_engine(db, f"boundary-{scheduler}", scheduler)
    engine.feed(events, punctuation=100)         # releases all but order 1's PLACED (at the punctuation)
    for query in WINDOWED:
        assert set(kept(engine, query)) == {(3,), (4,), (5,)}, query        # order 2 (at 89.5) is dropped
    # Order 4's CANCELLED (at 88) is dropped; order 3's (at 96) is kept: it may still sit between a kept PLACED and
    # a SHIPPED.
    assert kept(engine, "Shipped") == {(3,): 2, (4,): 1, (5,): 1}
    got = engine.feed(later, punctuation=streams.END_OF_STREAM)
    reference = orders_engine(db, f"boundary-reference-{scheduler}", scheduler, durable=False)
    expected = reference.feed(events + later, punctuation=streams.END_OF_STREAM)
    assert outputs(got) == outputs(expected)
    assert ("Shipped", 100, 5) in outputs(got) and ("NextShipped", 100, 5) in outputs(got)      # exactly WITHIN
    assert ("Shipped", 100, 3) not in outputs(got)        # cancelled in between: the kept negative still kills it
    assert not [found for found in outputs(got) if found[0] != "Ever" and found[2] == 2]


def test_the_end_of_the_stream_drops_every_partition(db):
    """After END_OF_STREAM no event is admitted, so no partition can match any more: the end drops them all, those
    of a query without WITHIN too."""
    engine = orders_engine(db, "ended")
    engine.feed([order("PLACED", ts, ts) for ts in range(5)], punctuation=3)
    assert kept(engine, "Ever") == {(number,): 1 for number in range(3)}
    engine.feed([], punctuation=streams.END_OF_STREAM)
    assert not any(kept(engine, query) for query in ("Shipped", "NextShipped", "Ever"))
    assert saved_partition_events(db, "ended") == 0
    assert not any(kept(orders_engine(db, "ended"), query) for query in ("Shipped", "NextShipped", "Ever"))


def test_datetime_timestamps_are_pruned_by_the_same_window(db):
    """Timestamps that are datetimes: WITHIN counts seconds of their difference, as the matcher does."""
    start = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)

    def at(seconds: float) -> dt.datetime:
        return start + dt.timedelta(seconds=seconds)

    engine = orders_engine(db, "datetimes")
    engine.feed([order("PLACED", at(ts), ts) for ts in range(40)], punctuation=at(40))
    for query in WINDOWED:
        assert set(kept(engine, query)) == {(number,) for number in range(40 - WINDOW, 40)}, query
    result = engine.feed([order("SHIPPED", at(40), 30), order("SHIPPED", at(40), 29)], punctuation=at(41))
    assert sorted((output.query, output.attributes["orderno"]) for output in result.outputs) == [
        ("Ever", 29), ("Ever", 30), ("NextShipped", 30), ("Shipped", 30)]


def test_a_batch_that_aborts_after_pruning_leaves_the_partitions_to_the_next_one(db):
    """A batch's pruning is part of its state: when its transaction aborts the partitions stay as committed, and the
    next batch that passes them drops them."""
    engine = orders_engine(db, "aborted")
    engine.feed([order("PLACED", ts, ts) for ts in range(20)], punctuation=20)
    before = kept(engine, "Shipped")
    assert set(before) == {(number,) for number in range(10, 20)}
    with pytest.raises(RuntimeError, match="gives up"):
        with db.transaction() as tx:
            engine.process(tx, [], punctuation=100)
            raise RuntimeError("the caller gives up")
    assert kept(engine, "Shipped") == before
    assert kept(orders_engine(db, "aborted"), "Shipped") == before
    engine.feed([], punctuation=25)
    assert set(kept(engine, "Shipped")) == {(number,) for number in range(15, 20)}
    engine.feed([], punctuation=100)
    assert not kept(engine, "Shipped") and not kept(engine, "NextShipped")
    assert not kept(orders_engine(db, "aborted"), "Shipped")


def test_a_punctuation_looks_only_at_the_partitions_it_prunes(db, monkeypatch):
    """The partitions to prune are found by their earliest event (``WindowIndex``): a batch whose punctuation puts one
    more order out of the window prunes that partition of each windowed query and looks at none of those that stay
    (nor at the query without WITHIN)."""
    engine = orders_engine(db, "indexed", durable=False)
    engine.feed([order("PLACED", ts, ts) for ts in range(1000)], punctuation=1000)
    looked: list[tuple[str, object]] = []
    expire = Matcher.expire

    def counted(self: Matcher, state: PartitionState, punctuation: object) -> PartitionState | None:
        looked.append((self.query.name, punctuation))
        return expire(self, state, punctuation)  # type: ignore[arg-type]

    monkeypatch.setattr(Matcher, "expire", counted)
    engine.feed([order("PLACED", 1000, 1000)], punctuation=1001)
    assert sorted(looked) == [("NextShipped", 1001), ("Shipped", 1001)]
    for query in WINDOWED:
        assert set(kept(engine, query)) == {(number,) for number in range(1001 - WINDOW, 1001)}, query


def test_many_calls_in_one_transaction_each_visit_only_what_they_changed(db):
    """A caller that calls ``process`` many times in one transaction: each call's end looks at the partitions that
    call changed and those its punctuation prunes (``statistics().partitions_visited``), not at every partition the
    transaction changed before it — the window index and the save each walked the whole pending overlay, so N calls
    of new orders looked at N(N+1)/2 calls' worth of partitions.  Every other call gives no punctuation (its events
    wait in the buffer for the next call's).  A call looks at as many as it would in a transaction of its own, as
    many as the same kind of call before it, and the state saved at the commit is the one in memory."""
    size, calls = 10, 60

    def run(name: str, one_transaction: bool) -> list[int]:
        engine = orders_engine(db, name)
        visits = []
        with (db.transaction() if one_transaction else contextlib.nullcontext()) as together:
            for call in range(calls):
                first = call * size
                events = [order("PLACED", ts, ts) for ts in range(first, first + size)]
                punctuation = first + size if call % 2 else None
                before = engine.statistics().partitions_visited
                if together is not None:
                    engine.process(together, events, punctuation=punctuation)
                else:
                    engine.feed(events, punctuation=punctuation)
                visits.append(engine.statistics().partitions_visited - before)
        loaded = orders_engine(db, name)
        for query in (*WINDOWED, "Ever"):
            assert kept(loaded, query) == kept(engine, query), query
        return visits

    together, apart = run("calls-together", True), run("calls-apart", False)
    assert together == apart                      # (a call looks at what a transaction of its own would)
    steady = together[10:]
    assert len(set(steady[::2])) == 1 and len(set(steady[1::2])) == 1, together
    for query in WINDOWED:
        assert set(kept(orders_engine(db, "calls-together"), query)) == {
            (number,) for number in range(calls * size - WINDOW, calls * size)}, query


def saved(db, name: str, query: str) -> dict[tuple[object, ...], int]:
    """The events a new engine object loads for ``query`` of engine ``name``, by partition (the saved state)."""
    return kept(orders_engine(db, name), query)


@pytest.mark.parametrize("together", [False, True], ids=["a-transaction-each", "one-transaction"])
def test_a_batch_that_prunes_and_releases_nothing_keeps_the_saved_rows_of_the_batch_before(db, together):
    """A batch that releases no event but a later punctuation prunes partitions, at the release position of the
    batch before it: its ``partitions`` row had that batch's item (the next release position) and overwrote that
    batch's row, so the partitions that stayed lost their saved state — after a restart orders 15-19 were gone
    from every query (and Ever's every order).  Each save's row now has an item of its own, after the one before.
    The same in one transaction (two calls of ``process``, the second releasing nothing)."""
    name = f"same-position-{'together' if together else 'apart'}"
    engine = orders_engine(db, name)
    placed = [order("PLACED", ts, ts) for ts in range(20)]
    if together:
        with db.transaction() as tx:
            engine.process(tx, placed, punctuation=20)
            engine.process(tx, [], punctuation=25)
    else:
        engine.feed(placed, punctuation=20)
        engine.feed([], punctuation=25)
    assert set(kept(engine, "Shipped")) == {(number,) for number in range(15, 20)}
    for query in (*WINDOWED, "Ever"):
        assert saved(db, name, query) == kept(engine, query), query
    engine.feed([], punctuation=27)                             # (a third save at that position)
    engine.feed([order("PLACED", 30, 30)], punctuation=31)      # (and one after it)
    for query in (*WINDOWED, "Ever"):
        assert saved(db, name, query) == kept(engine, query), query
    assert set(kept(engine, "Shipped")) == {(30,)} and len(kept(engine, "Ever")) == 21


def test_a_partition_pruned_with_the_rest_of_its_row_is_not_saved_again_as_an_emptied_entry(db, monkeypatch):
    """A pruned partition needs an emptied (null) entry only while an older saved row still holds it (else loading
    would bring it back): when the pruning leaves that row needed by no partition, the row is deleted and the
    partition is written nowhere.  Before, every pruned partition was written again as an emptied entry in the
    batch's row — and that row, holding nothing any older row still had, was deleted by the same save: the orders
    10-19 of both windowed queries, pruned together, were 20 emptied entries written to be deleted (on the
    benchmark's orders, most of what the pruning cost).  An emptied entry still needed is still written, and a new
    engine object loads what the engine holds in memory after each batch."""
    engine = streams.StreamEngine(db, name="pruned-rows")
    engine.create_stream("orders", types=("PLACED", "CANCELLED", "SHIPPED"), attributes=("orderno",))
    engine.define(";".join(QUERIES.split(";")[:2]))           # the windowed queries (Ever would hold every row)
    written: list[dict[tuple[str, tuple[object, ...]], object]] = []
    encode = _persist._encode_states
    monkeypatch.setattr(_persist, "_encode_states", lambda recorded: written.append(dict(recorded)) or encode(recorded))

    def loaded_as_kept() -> None:
        restarted = streams.StreamEngine(db, name="pruned-rows")
        restarted.create_stream("orders", types=("PLACED", "CANCELLED", "SHIPPED"), attributes=("orderno",))
        restarted.define(";".join(QUERIES.split(";")[:2]))
        for query in WINDOWED:
            assert kept(restarted, query) == kept(engine, query), query

    engine.feed([order("PLACED", ts, ts) for ts in range(20)], punctuation=20)
    assert [sorted(key for (_, key), state in row.items() if state is not None) for row in written] == [
        sorted([(number,) for number in range(10, 20)] * 2)]  # (0-9 were pruned before the save)
    written.clear()
    engine.feed([], punctuation=40)                             # prunes every partition of that row
    assert written == [] and saved_partition_events(db, "pruned-rows") == 0
    loaded_as_kept()
    engine.feed([order("PLACED", ts, ts) for ts in range(40, 60)], punctuation=60)      # a row of orders 50-59
    written.clear()
    engine.feed([order("PLACED", 60, 60)], punctuation=65)     # prunes 50-54: the row still holds 55-59
    assert [sorted((query, key, state is None) for (query, key), state in row.items()) for row in written] == [
        sorted([(query, (number,), True) for query in WINDOWED for number in range(50, 55)]
               + [(query, (60,), False) for query in WINDOWED])]
    loaded_as_kept()


SEED = int(os.environ.get("ACTIVEDB_STREAMS_SEED", "20110901"))


@pytest.mark.parametrize("case", range(4))
def test_random_batches_and_punctuations_load_as_the_engine_holds_them(db, case):
    """Randomised (``ACTIVEDB_STREAMS_SEED``): orders whose numbers come again, in calls of random sizes — some
    calls in one transaction, some transactions aborted, punctuations that advance, stay or are absent, so that
    batches prune partitions saved by rows of every age, release nothing, or both — and after every transaction a
    new engine object loads exactly the partitions the engine holds in memory, for every query."""
    rng = random.Random(SEED * 100 + case)
    name = f"random-rows-{case}"
    engine = orders_engine(db, name)
    ts, punctuation = 0, 0
    for _ in range(40):
        with contextlib.suppress(RuntimeError), db.transaction() as tx:
            for _ in range(rng.choice((1, 1, 2, 3))):
                events = []
                for _ in range(rng.choice((0, 1, 3, 8))):
                    ts += rng.choice((0, 1, 2, 5))
                    events.append(order(rng.choice(("PLACED", "PLACED", "CANCELLED", "SHIPPED")), ts,
                                        rng.randrange(12)))
                if rng.random() < 0.7:
                    punctuation = max(punctuation, ts - rng.choice((0, 3, 12)))
                engine.process(tx, events, punctuation=punctuation if rng.random() < 0.8 else None)
            if rng.random() < 0.15:
                raise RuntimeError("the caller gives up")       # (the engine keeps its state before the batch)
        restarted = orders_engine(db, name)
        for query in (*WINDOWED, "Ever"):
            assert kept(restarted, query) == kept(engine, query), (query, case)


def buffer_rows(db, name: str) -> int:
    with db.engine.connect() as connection:
        return connection.execute(sa.text("SELECT count(*) FROM activedb_stream_state WHERE engine = :name AND "
                                          "kind = 'buffer'"), {"name": name}).scalar_one()


def test_a_save_looks_only_at_the_buffer_chunks_its_punctuation_releases(db, monkeypatch):
    """Each batch's events left in the buffer are one saved chunk (a ``buffer`` row), deleted by the save of the
    batch that releases its last event.  A save finds those chunks by their latest event, not by comparing every
    chunk saved so far with the released punctuation: with a chunk more left buffered by every batch, each batch's
    save compared as many chunks as the batches before it (counted: the save's timestamp comparisons).  Releasing
    them costs a comparison per chunk released; a transaction that aborts keeps them (in memory and saved), and a
    new engine object loads the buffer the engine holds."""
    name = "chunk-visits"
    engine = orders_engine(db, name)
    compared: list[None] = []
    saves: list[int] = []                 # per save: the timestamp comparisons it made
    less, save = _persist.ts_less, _persist.save

    def counted_save(*arguments: object) -> int:
        compared.clear()
        visited = save(*arguments)  # type: ignore[arg-type]
        saves.append(len(compared))
        return visited

    monkeypatch.setattr(_persist, "ts_less", lambda first, second: compared.append(None) or less(first, second))
    monkeypatch.setattr(_persist, "save", counted_save)
    for call in range(40):         # an order released now, and one far ahead that stays buffered: a chunk a call
        engine.feed([order("PLACED", call, call), order("PLACED", 1000 + call, 1000 + call)], punctuation=call + 1)
    assert len(saves) == 40 and len(set(saves[2:])) == 1, saves
    assert buffer_rows(db, name) == 40 and orders_engine(db, name).buffered() == engine.buffered()
    with pytest.raises(RuntimeError, match="gives up"):
        with db.transaction() as tx:
            engine.process(tx, [], punctuation=1010)
            raise RuntimeError("the caller gives up")
    assert len(engine.buffered()) == 40 and buffer_rows(db, name) == 40
    engine.feed([], punctuation=1010)             # releases the chunks of 1000-1009
    assert buffer_rows(db, name) == 30 and len(engine.buffered()) == 30
    assert saves[-1] == saves[39] + 10, saves            # (a comparison per chunk released, and the one left first)
    assert orders_engine(db, name).buffered() == engine.buffered()


class CountingBuffer(list):  # type: ignore[type-arg]
    """A committed buffer that counts the entries read from it (iterated, indexed or sliced)."""

    read = 0

    def __iter__(self):  # type: ignore[no-untyped-def]
        CountingBuffer.read += len(self)
        return super().__iter__()

    def __getitem__(self, index):  # type: ignore[no-untyped-def]
        CountingBuffer.read += len(range(*index.indices(len(self)))) if isinstance(index, slice) else 1
        return super().__getitem__(index)


def test_a_call_reads_the_buffer_entries_it_changes_not_every_buffered_one(db):
    """A stream whose punctuation lags keeps many events buffered: each call read the whole buffer (a batch's pending
    state began with a copy of it), so a call cost as much as the events waiting.  A call reads a few entries per
    event it admits (a binary search for its place) and the ones it releases (counted: the entries read from the
    committed buffer), in its own transaction or not; an aborted batch leaves the buffer as it was, and a new engine
    object loads the buffer the engine holds."""
    name = "buffer-reads"
    engine = orders_engine(db, name)
    waiting = 2000
    engine.feed([order("PLACED", 10_000 + number, number) for number in range(waiting)])   # far ahead: they wait
    reads = []
    with db.transaction() as together:
        for call in range(20):
            engine._state.buffer = CountingBuffer(engine._state.buffer)
            CountingBuffer.read = 0
            # An order in time, one late (before the one in time: out of order), and one far ahead that waits.
            events = [order("PLACED", 100 + call, 1), order("PLACED", 99 + call - 0.5, 2),
                      order("PLACED", 20_000 + call, 3)]
            if call < 10:
                engine.feed(events, punctuation=99 + call)
            else:
                engine.process(together, events, punctuation=99 + call)
            reads.append(CountingBuffer.read)
    # (a binary search of the committed buffer per event admitted, and one for the release: none is released from it)
    assert max(reads) <= 4 * (waiting.bit_length() + 1), reads
    assert len(engine.buffered()) == waiting + 20 + 2
    with pytest.raises(RuntimeError, match="gives up"):
        with db.transaction() as tx:
            engine.process(tx, [order("PLACED", 30_000, 4)], punctuation=15_000)
            raise RuntimeError("the caller gives up")
    buffered = engine.buffered()
    assert len(buffered) == waiting + 22 and buffered == sorted(buffered, key=lambda event: event.ts)
    assert orders_engine(db, name).buffered() == buffered
    engine.feed([order("PLACED", 15_000, 5)], punctuation=15_000)
    assert [event.ts for event in engine.buffered()] == [15_000, *(20_000 + call for call in range(20))]
    assert orders_engine(db, name).buffered() == engine.buffered()
