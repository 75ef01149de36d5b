"""Disordered input (Active CEP App. F): the reorder buffer, punctuations, late events,
equal timestamps, and the engine's state across micro-batches, aborts and restarts.

Randomised parts use ``random.Random(seed)``; the seed is fixed, overridable with the
environment variable ``ACTIVEDB_STREAMS_SEED``.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import random
import re

import pytest
import sqlalchemy as sa

import activedb
from activedb import streams
from activedb.streams.errors import StreamError, StreamStateError
from activedb.testing import check_stream_history
from tests.streams.conftest import BADGE_TYPES, Q1_R1, Q2, badge, feed_in_batches, set_status, statuses

SEED = int(os.environ.get("ACTIVEDB_STREAMS_SEED", "20110901"))

# The app-level edges used here (not Active CEP's): Q2's output moves the worker back to safe
# (Appendix C's reading), and every Q1 output is logged in stream_alerts.
EXTRA_RULES = """
CREATE RULE R2 ON OUTPUT Q2 REFERENCING NEW AS n FOR EACH EVENT
BEGIN UPDATE workerStatus SET status = 'safe' WHERE workerID = n.HCW-ID END;
CREATE RULE LogQ1 ON OUTPUT Q1 REFERENCING NEW AS n PRIORITY 5
BEGIN INSERT INTO stream_alerts (worker, location, at) VALUES (n.HCW-ID, n.location, 0) END
"""


def engine(db, name="disorder", *, record_history=True, **options) -> streams.StreamEngine:
    """The badge stream (SANITIZE before EXIT before ENTER at equal timestamps) with Q1/R1, Q2 and
    ``EXTRA_RULES``."""
    made = streams.StreamEngine(db, name=name, record_history=record_history, **options)
    made.create_stream("estream", types=BADGE_TYPES, attributes=("HCW-ID", "location"),
                       priorities={"SANITIZE": 3, "EXIT": 2, "ENTER": 1})
    made.define(Q1_R1)
    made.define(Q2)
    made.define(EXTRA_RULES)
    return made


def random_stream(rng: random.Random, count: int, workers: int = 4) -> list[streams.StreamEvent]:
    """Badge events in timestamp order: integer timestamps (so ties happen), 4 rooms."""
    events, ts = [], 0
    for _ in range(count):
        ts += rng.choice((0, 1, 1, 2, 3, 5))
        events.append(badge(rng.choice(BADGE_TYPES), ts, f"w{rng.randrange(workers)}", f"r{rng.randrange(4)}"))
    return events


def shuffle_bounded(rng: random.Random, events: list, slack: int) -> list:
    """Each event moves at most ``slack`` places later (a K-slack disorder)."""
    keyed = [(index + rng.uniform(0, slack), event) for index, event in enumerate(events)]
    return [event for _, event in sorted(keyed, key=lambda item: item[0])]


def observe(db, result_outputs) -> tuple:
    with db.engine.connect() as connection:
        alerts = connection.execute(sa.text("SELECT worker, location FROM stream_alerts ")).all()
    return (statuses(db), sorted(tuple(row) for row in alerts),
            [(output.query, output.ts, dict(output.attributes)) for output in result_outputs])


def reset(db, workers: int = 4) -> None:
    with db.engine.begin() as connection:
        connection.execute(sa.text("TRUNCATE workerstatus, stream_alerts, activedb_stream_state"))
    set_status(db, **{f"w{number}": "safe" for number in range(workers)})


def run_sorted(db, events, name="sorted"):
    reset(db)
    made = engine(db, name=name)
    result = made.feed(sorted(events, key=lambda event: event.ts), punctuation=streams.END_OF_STREAM)
    return observe(db, result.outputs), made


def run_batches(db, arrival, *, batch_size: int, delay: int, name="batches"):
    """Micro-batches of ``arrival``; each batch punctuated like Spark's watermark: the largest
    timestamp seen before the batch minus ``delay``."""
    reset(db)
    made = engine(db, name=name)
    outputs, letters = feed_in_batches(db, made, arrival, size=batch_size, delay=delay, numbered=True)
    return observe(db, outputs), letters, made


def test_disordered_input_with_punctuations_equals_sorted_input(db):
    rng = random.Random(SEED)
    events = random_stream(rng, 300)
    expected, reference = run_sorted(db, events)
    assert expected[2], "the random stream should make Q1 match at least once"
    arrival = shuffle_bounded(rng, events, slack=12)
    assert arrival != events
    got, letters, made = run_batches(db, arrival, batch_size=25, delay=40)
    assert letters == []
    assert got == expected
    check_stream_history(made.history.snapshot()).assert_ok()
    statistics = made.statistics()
    assert statistics.late_events == 0 and statistics.buffered == 0
    assert statistics.events_processed == len(events)


def test_equal_timestamps_follow_the_declared_order_not_the_arrival(db):
    """SANITIZE (priority 3) before ENTER (1) at the same time: the ENTER is sanitized, in any arrival order."""
    results = []
    for order in ((0, 1, 2), (0, 2, 1)):
        reset(db)
        made = engine(db, name=f"ties{order}")
        stream = [badge("EXIT", 1, "w0", "a"), badge("SANITIZE", 5, "w0", "hall"), badge("ENTER", 5, "w0", "b")]
        result = made.feed([stream[index] for index in order], punctuation=streams.END_OF_STREAM)
        results.append(observe(db, result.outputs))
        assert [output.query for output in result.outputs] == []
        assert statuses(db)["w0"] == "safe"
    assert results[0] == results[1]


def test_events_at_the_punctuation_wait_and_late_events_are_dead_letters(db):
    reset(db)
    made = engine(db, name="late")
    with db.transaction() as tx:
        first = made.process(tx, [badge("EXIT", 1, "w0", "a"), badge("ENTER", 10, "w0", "b")], punctuation=10,
                             batch_id=7)
    assert (first.released, first.buffered, first.punctuation) == (1, 1, 10)   # ENTER^10 waits: ts 10 may still come
    with db.transaction() as tx:
        second = made.process(tx, [badge("SANITIZE", 10, "w0", "hall"), badge("MASK", 4, "w0", "a")],
                              punctuation=12, batch_id=8)
    # SANITIZE^10 is not late (the punctuation said: nothing *older* than 10); MASK^4 is.
    assert [letter.event.describe() for letter in second.dead_letters] == ["MASK^4"]
    (letter,) = second.dead_letters
    assert letter.punctuation == 10
    assert "older than the punctuation 10" in letter.reason and "late" in letter.reason
    assert second.released == 2 and second.outputs == ()      # SANITIZE^10 orders before ENTER^10 (priority)
    with db.engine.connect() as connection:
        rows = connection.execute(sa.text("SELECT query_id, batch_id, reason, raw FROM activedb_dead_letters")).all()
    assert [(row.query_id, row.batch_id) for row in rows] == [("streams:late", 8)]
    assert rows[0].raw == {"type": "MASK", "ts": 4, "stream": "estream", "attributes": {"HCW-ID": "w0",
                                                                                          "location": "a"}}
    assert made.statistics().late_events == 1


def test_db_punctuate_is_a_punctuation(db):
    reset(db)
    made = streams.StreamEngine(db, name="watermarked", durable=False)
    made.create_stream("watermarked_stream", types=BADGE_TYPES, attributes=("HCW-ID", "location"))
    result = made.feed([badge("EXIT", 3, "w0"), badge("EXIT", 8, "w0")])
    assert (result.released, result.buffered) == (0, 2)           # no punctuation yet
    db.punctuate("watermarked_stream", 5)
    result = made.feed([])
    assert (result.released, result.buffered, result.punctuation) == (1, 1, 5)


def test_an_aborted_batch_leaves_the_engine_as_before(db):
    rng = random.Random(SEED + 1)
    events = random_stream(rng, 120)
    expected, _ = run_sorted(db, events, name="reference")
    reset(db)
    made = engine(db, name="aborting")
    half = len(events) // 2
    first = made.feed(events[:half], punctuation=events[half].ts)

    class Crash(Exception):
        pass

    with pytest.raises(Crash):
        with db.transaction() as tx:
            made.process(tx, events[half:], punctuation=streams.END_OF_STREAM)
            raise Crash()
    assert made.statistics().buffered == first.buffered          # the aborted batch's admissions are gone
    rest = made.feed(events[half:], punctuation=streams.END_OF_STREAM)   # the batch re-run
    assert observe(db, first.outputs + rest.outputs) == expected
    check_stream_history(made.history.snapshot()).assert_ok()     # the aborted batch's operations do not count


@pytest.mark.parametrize("durable", [False, True], ids=["in-memory", "durable"])
def test_a_batch_in_a_subtransaction_follows_that_subtransaction_s_outcome(db, durable):
    """A batch processed in a subtransaction (a rule's, or one the caller opened) that aborts leaves nothing in the
    engine, though the top-level transaction commits: its writes and its saved state went with the subtransaction,
    so its admissions and matcher states go too, and the batch re-run gives the uninterrupted run's result.  Another
    node of the tree cannot add a batch to one a subtransaction still holds (StreamStateError saying where the
    batch runs); once that subtransaction committed, its parent can.  Before, the engine followed the top-level
    transaction only: the aborted batch's events stayed buffered and matched in memory, not in the saved state."""
    rng = random.Random(SEED + 1)
    events = random_stream(rng, 120)
    expected, _ = run_sorted(db, events, name="reference")
    reset(db)
    made = engine(db, name=f"in-a-subtransaction-{durable}", durable=durable)
    half = len(events) // 2
    first = made.feed(events[:half], punctuation=events[half].ts)
    partitions, buffered = {name: made.partitions(name) for name in made.queries}, made.buffered()

    class Crash(Exception):
        pass

    with db.transaction() as tx:
        with pytest.raises(Crash):
            with tx.subtransaction() as child:
                made.process(child, events[half:], punctuation=streams.END_OF_STREAM)
                raise Crash()
    assert (made.statistics().buffered, made.buffered()) == (first.buffered, buffered)
    assert {name: made.partitions(name) for name in made.queries} == partitions
    with db.transaction() as tx:
        with tx.subtransaction() as child:
            made.process(child, [], punctuation=None)
            with pytest.raises(StreamStateError, match="ran a batch in transaction"):
                made.process(tx, [], punctuation=None)
        rest = made.process(tx, events[half:], punctuation=streams.END_OF_STREAM)    # (the child committed)
    assert observe(db, first.outputs + rest.outputs) == expected


def test_the_engine_learns_its_batch_s_outcome_when_the_transaction_ends(db):
    """The engine enlists in the batch's top-level transaction: an abort is applied as it
    happens — the batch's units are recorded aborted before the engine is called again."""
    reset(db)
    made = engine(db, name="outcome")
    events = random_stream(random.Random(SEED + 5), 30)

    class Crash(Exception):
        pass

    with pytest.raises(Crash):
        with db.transaction() as tx:
            made.process(tx, events, punctuation=streams.END_OF_STREAM)
            ran = {op.unit for op in made.history.snapshot() if op.kind == "begin"}
            assert ran, "the doomed batch ran no s-transaction; the test needs one"
            raise Crash()
    aborted = {op.unit for op in made.history.snapshot() if op.kind == "end" and op.operation == "aborted"}
    assert ran <= aborted, f"units of the aborted batch not recorded aborted: {sorted(ran - aborted)}"
    result = made.feed(events, punctuation=streams.END_OF_STREAM)     # no batch in progress any more
    assert result.released == len(events)
    check_stream_history(made.history.snapshot()).assert_ok()


def test_a_new_engine_object_resumes_from_the_saved_state(db):
    """Buffered events and partial matches survive a restart (they commit with each batch)."""
    rng = random.Random(SEED + 2)
    events = random_stream(rng, 160)
    expected, _ = run_sorted(db, events, name="reference2")
    reset(db)
    half = len(events) // 2
    before = engine(db, name="restart")
    first = before.feed(events[:half], punctuation=events[half - 10].ts)
    assert first.buffered > 0 and before.partitions("Q1")
    after = engine(db, name="restart")                    # e.g. the driver restarted
    rest = after.feed(events[half:], punctuation=streams.END_OF_STREAM)
    assert observe(db, first.outputs + rest.outputs) == expected
    changed = streams.StreamEngine(db, name="restart")
    changed.create_stream("estream", types=BADGE_TYPES, attributes=("HCW-ID", "location"))
    changed.define(Q1_R1.replace("WITHIN 45 sec", "WITHIN 50 sec"))
    with pytest.raises(StreamStateError, match="reset_state"):
        changed.feed([])
    changed.reset_state()
    assert changed.feed([]).buffered == 0


def test_tuple_attributes_survive_a_restart_as_tuples(db):
    """An attribute given as a tuple (what a dead letter for a list key tells to give) keys a partition; saved in
    the engine's state it comes back a tuple — a partition key, a buffered event and an output equal to the
    uninterrupted run's.  Before, the state saved it as a JSON list and decoded a list: the partitions row could not
    be read (unhashable type: 'list'), so every batch after the restart failed until reset_state()."""
    def made(name):
        engine = streams.StreamEngine(db, name=name)
        engine.create_stream("estream", types=BADGE_TYPES, attributes=("HCW-ID", "location"))
        engine.define("CREATE QUERY Q ON estream PATTERN SEQ(EXIT, ENTER) WHERE [HCW-ID] "
                      "RETURN ENTER.HCW-ID, EXIT.location AS left, ENTER.location")
        return engine

    worker = ("w", (1, 2))
    first = [streams.StreamEvent("EXIT", 1, {"HCW-ID": worker, "location": ("a", 1)}),
             streams.StreamEvent("EXIT", 5, {"HCW-ID": worker, "location": ["b", [2]]})]
    rest = [streams.StreamEvent("ENTER", 6, {"HCW-ID": worker, "location": "c"})]
    uninterrupted = made("tuples-reference")
    uninterrupted.feed(first, punctuation=2)
    expected = uninterrupted.feed(rest, punctuation=streams.END_OF_STREAM).outputs
    made("tuples").feed(first, punctuation=2)
    restarted = made("tuples")                          # e.g. the driver restarted
    assert list(restarted.partitions("Q")) == [(worker,)]
    assert [event.attributes for event in restarted.buffered()] == [first[1].attributes]
    outputs = restarted.feed(rest, punctuation=streams.END_OF_STREAM).outputs
    assert [dict(output.attributes) for output in outputs] == [dict(output.attributes) for output in expected] == [
        {"HCW-ID": worker, "left": ["b", [2]], "location": "c"}]


def test_a_new_engine_object_shows_the_saved_buffer_and_partial_matches_before_its_first_batch(db):
    """``buffered()`` and ``partitions(query)`` of a durable engine show its saved state also before the new
    object's first batch (a restarted process inspecting what waits) — they showed an empty buffer and no partial
    match until a batch had loaded the state."""
    rng = random.Random(SEED + 2)
    events = random_stream(rng, 80)
    reset(db)
    before = engine(db, name="inspected")
    before.feed(events[:60], punctuation=events[50].ts)
    assert before.buffered() and before.partitions("Q1")
    after = engine(db, name="inspected")                  # e.g. the driver restarted
    assert after.buffered() == before.buffered()
    assert after.partitions("Q1") == before.partitions("Q1")


def test_statistics_of_a_new_engine_object_count_the_saved_buffer_and_never_raise_for_an_unreadable_state(db):
    """``statistics()`` agrees with ``buffered()`` before a new object's first batch: its ``buffered`` and
    ``released_punctuation`` are the saved state's (they were 0 and None while events waited).  A saved state that
    cannot be read leaves them the in-memory figures — statistics are polled; the batch raises, saying what to do."""
    rng = random.Random(SEED + 2)
    events = random_stream(rng, 80)
    reset(db)
    before = engine(db, name="counted_saved")
    before.feed(events[:60], punctuation=events[50].ts)
    after = engine(db, name="counted_saved")
    assert after.statistics().buffered == len(before.buffered()) > 0
    assert after.statistics().released_punctuation == before.statistics().released_punctuation is not None
    with db.engine.begin() as connection:
        connection.execute(sa.text("UPDATE activedb_stream_state SET value = CAST(json_build_object('position', 'x') "
                                   "AS json) WHERE engine = 'counted_saved' AND kind = 'meta'"))
    unreadable = engine(db, name="counted_saved")
    assert unreadable.statistics().buffered == 0
    with pytest.raises(StreamStateError, match="reset_state"):
        unreadable.feed([])


def test_inspecting_a_new_engine_object_before_its_queries_are_defined_still_refuses_a_changed_query(db):
    """A new engine object checks, when it loads the saved state, that each query is defined as it was; a
    ``buffered()`` or ``partitions()`` before ``define`` loaded the state with no query to check and kept it, so a
    changed query then ran on the partial matches of the old one (no ``StreamStateError``)."""
    rng = random.Random(SEED + 2)
    events = random_stream(rng, 80)
    reset(db)
    before = engine(db, name="inspected_early")
    before.feed(events[:60], punctuation=events[50].ts)
    assert before.partitions("Q1")
    changed = streams.StreamEngine(db, name="inspected_early")
    changed.create_stream("estream", types=BADGE_TYPES, attributes=("HCW-ID", "location"),
                          priorities={"SANITIZE": 3, "EXIT": 2, "ENTER": 1})
    assert changed.buffered() == before.buffered() and changed.partitions("Q1") == before.partitions("Q1")
    changed.define(Q1_R1.replace("WITHIN 45 sec", "WITHIN 50 sec"))
    with pytest.raises(StreamStateError, match="reset_state"):
        changed.feed([])


def test_a_restart_between_batches_that_release_part_of_a_saved_chunk(db):
    """Each batch saves its still-buffered events as one chunk; a later batch releases part of
    a chunk: a new engine object must resume exactly the unreleased ones, the partial matches
    and the outputs of an uninterrupted run, and no chunk row outlives its last event."""
    rng = random.Random(SEED + 3)
    events = shuffle_bounded(rng, random_stream(rng, 200), slack=6)
    expected, _ = run_sorted(db, events, name="reference3")
    reset(db)
    chunks, outputs = [events[start:start + 40] for start in range(0, 160, 40)], []
    before, seen = engine(db, name="chunks"), None
    for chunk in chunks:
        punctuation = None if seen is None else seen - 4      # part of the previous chunk stays buffered
        outputs += before.feed(chunk, punctuation=punctuation).outputs
        seen = max([event.ts for event in chunk] + ([seen] if seen is not None else []))
    assert before.buffered(), "nothing buffered at the restart; the test needs a partially released chunk"
    after = engine(db, name="chunks")
    outputs += after.feed([]).outputs                       # loads the saved state, releases nothing new
    assert after.buffered() == before.buffered()
    assert after.partitions("Q1") == before.partitions("Q1") and after.partitions("Q2") == before.partitions("Q2")
    outputs += after.feed(events[160:], punctuation=streams.END_OF_STREAM).outputs
    assert observe(db, outputs) == expected
    with db.engine.connect() as connection:
        left = connection.execute(sa.text("SELECT count(*) FROM activedb_stream_state "
                                          "WHERE engine = 'chunks' AND kind = 'buffer'")).scalar()
    assert left == 0, f"{left} saved buffer chunk(s) left after END_OF_STREAM released every event"


def test_a_buffer_saved_in_the_earlier_layouts_still_loads(db):
    """State saved before the buffer was chunked (one row per buffered event, the event as a list or
    as the earlier ``{"t", "ts", "s", "p", "a"}`` object) loads into the same buffer: an upgrade
    must not drop buffered events nor stop the stream."""
    import json

    from activedb.streams import _persist

    rng = random.Random(SEED + 4)
    events = shuffle_bounded(rng, random_stream(rng, 120), slack=6)
    before, seen = engine(db, name="old_layout"), None
    for chunk in (events[:40], events[40:80]):
        punctuation = None if seen is None else seen - 4
        before.feed(chunk, punctuation=punctuation)
        seen = max([event.ts for event in chunk] + ([seen] if seen is not None else []))
    assert before.buffered(), "nothing buffered; the test needs saved buffer rows"
    with db.engine.begin() as connection:
        chunks = connection.execute(sa.text("SELECT value FROM activedb_stream_state "
                                            "WHERE engine = 'old_layout' AND kind = 'buffer'")).scalars().all()
        connection.execute(sa.text("DELETE FROM activedb_stream_state WHERE engine = 'old_layout' AND kind = 'buffer'"))
        for number, (arrival, event) in enumerate((arrival, event) for chunk in chunks
                                                  for arrival, event in zip(chunk["arrivals"],
                                                                            _persist.decode_events(chunk))):
            saved = _persist.encode_event(event)
            if number % 2:
                saved = dict(zip(("t", "ts", "s", "p", "a"), saved))
            connection.execute(sa.text("INSERT INTO activedb_stream_state (engine, kind, item, value) "
                                       "VALUES ('old_layout', 'buffer', :item, CAST(:value AS json))"),
                               {"item": str(arrival), "value": json.dumps(saved)})
    after = engine(db, name="old_layout")
    after.feed([])                                          # loads the saved state, releases nothing new
    assert after.buffered() == before.buffered()


def test_a_saved_chunk_of_events_decodes_to_the_same_events():
    """The buffer's chunks are saved as columns: events with different attribute sets, a None
    attribute and a missing one, numbers and datetimes come back equal (through JSON, as the table stores it)."""
    import datetime as dt
    import json

    from activedb.streams import _persist

    events = [streams.StreamEvent("EXIT", 3.5, {"HCW-ID": "w1", "location": None}, stream="estream", position=4),
              streams.StreamEvent("MASK", 7, {"HCW-ID": "w2"}, stream="estream"),
              streams.StreamEvent("ENTER", dt.datetime(2011, 9, 1, 8, 30), {"room": 12, "flag": True}, stream="other")]
    decoded = _persist.decode_events(json.loads(json.dumps(_persist.encode_events(events))))
    assert decoded == events
    # Columns of one value (one stream, one type, nothing released yet) are saved once; one event is a list.
    alike = [streams.StreamEvent("EXIT", ts, {"HCW-ID": "w1", "location": room}, stream="estream")
             for ts, room in ((1, "r1"), (2.5, "r2"), (2.5, None))]
    for chunk in (alike, alike[:1], []):
        saved = json.loads(json.dumps(_persist.encode_events(chunk)))
        assert _persist.decode_events(saved) == chunk
        if len(chunk) > 1:
            assert saved["s"] == {"$all": "estream"} and saved["t"] == {"$all": "EXIT"}
            assert saved["p"] == {"$all": None} and saved["a"]["HCW-ID"] == {"$all": "w1"}
            assert isinstance(saved["a"]["location"], list) and isinstance(saved["ts"], list)
    assert [sorted(event.attributes) for event in decoded] == [["HCW-ID", "location"], ["HCW-ID"], ["flag", "room"]]


def _partition_rows(db, name: str) -> list[tuple[str, list]]:
    with db.engine.connect() as connection:
        return [(item, value["entries"]) for item, value in connection.execute(sa.text(
            "SELECT item, value FROM activedb_stream_state WHERE engine = :name AND kind = 'partitions' ORDER BY item"),
            {"name": name}).all()]


def _every_row_is_needed(rows: list[tuple[str, list]]) -> list[str]:
    """The rows none of whose entries loading needs: not the latest for its partition, or an emptied latest entry
    with no older row holding the partition (read from the table, not from the engine's index)."""
    holders: dict[str, list[str]] = {}
    for item, entries in rows:
        for query, key, _ in entries:
            holders.setdefault(repr((query, key)), []).append(item)
    unneeded = []
    for item, entries in rows:
        if not any(max(holders[repr((query, key))]) == item and (state is not None or len(holders[repr((query, key))]) > 1)
                   for query, key, state in entries):
            unneeded.append(item)
    return unneeded


def test_a_batch_saves_the_partitions_it_changed_in_one_row_and_no_row_outlives_its_need(db):
    """Thirty micro-batches over eight workers, half of them quiet in the second half (their partitions empty
    out: emptied entries), a new engine object every few batches (e.g. the driver restarted): after every batch
    the partial matches equal those of a run that never restarted, each batch wrote at most one row of
    partitions, every row left is one loading needs, and a new engine loads exactly the running one's state."""
    rng = random.Random(SEED + 5)
    events, ts = [], 0
    for number in range(600):
        ts += rng.choice((0, 1, 2, 3))
        workers = 8 if number < 300 else 4
        events.append(badge(rng.choice(BADGE_TYPES), ts, f"w{rng.randrange(workers)}", f"r{rng.randrange(3)}"))
    batches = [events[start:start + 20] for start in range(0, len(events), 20)]

    def run(name: str, restart_every: int | None) -> tuple[list, int]:
        reset(db, workers=8)
        made, seen, states, emptied = engine(db, name=name, record_history=False), None, [], 0
        for number, batch in enumerate(batches):
            if restart_every and number % restart_every == 0:
                made = engine(db, name=name, record_history=False)
            rows_before = len(_partition_rows(db, name))
            made.feed(batch, punctuation=None if seen is None else seen - 10)
            seen = max([event.ts for event in batch] + ([seen] if seen is not None else []))
            rows = _partition_rows(db, name)
            assert len(rows) <= rows_before + 1, f"batch {number} wrote {len(rows) - rows_before} rows of partitions"
            assert _every_row_is_needed(rows) == [], f"batch {number}: rows nothing needs"
            emptied += sum(state is None for _, entries in rows for *_, state in entries)
            states.append((made.partitions("Q1"), made.partitions("Q2")))
        fresh = engine(db, name=name, record_history=False)
        fresh.feed([])
        assert (fresh.partitions("Q1"), fresh.partitions("Q2")) == states[-1]
        return states, emptied

    restarted, emptied = run("rows-restarted", restart_every=3)
    continuous, _ = run("rows-continuous", restart_every=None)
    assert restarted == continuous
    assert emptied, "no emptied entry was ever needed: the test does not reach them"


def _inline_state(state) -> dict:
    """A partition state as the versions before rows of shared events wrote it: every event inline."""
    from activedb.streams import _persist

    def inline(events):
        return [_persist.encode_event(event) for event in events]
    return {"buffers": [inline(buffer) for buffer in state.buffers], "runs": [inline(run) for run in state.runs]}


def _saved_state(name: str, before) -> dict:
    """``before``'s partitions by the item of their row in the layout of one row per partition."""
    import json

    return {json.dumps([query, list(key)], separators=(",", ":")): _inline_state(state)
            for query in ("Q1", "Q2") for key, state in before.partitions(query).items()}


def test_partitions_saved_in_the_earlier_layout_still_load_and_move_to_the_new_one(db):
    """One row per partition (the layout before rows per batch) loads into the same partial matches; a batch
    that changes such a partition deletes its row, and the state still loads whole."""
    import json

    rng = random.Random(SEED + 6)
    events = random_stream(rng, 160)
    reset(db)
    before = engine(db, name="old_partitions", record_history=False)
    before.feed(events[:80], punctuation=events[70].ts)
    latest = _saved_state("old_partitions", before)
    assert latest
    with db.engine.begin() as connection:
        connection.execute(sa.text("DELETE FROM activedb_stream_state WHERE engine = 'old_partitions' "
                                   "AND kind = 'partitions'"))
        for item, state in latest.items():
            connection.execute(sa.text("INSERT INTO activedb_stream_state (engine, kind, item, value) "
                                       "VALUES ('old_partitions', 'partition', :item, CAST(:value AS json))"),
                               {"item": item, "value": json.dumps(state)})
    legacy = len(latest)
    after = engine(db, name="old_partitions", record_history=False)
    after.feed([])
    assert (after.partitions("Q1"), after.partitions("Q2")) == (before.partitions("Q1"), before.partitions("Q2"))
    after.feed(events[80:], punctuation=streams.END_OF_STREAM)
    with db.engine.connect() as connection:
        left = connection.execute(sa.text("SELECT count(*) FROM activedb_stream_state WHERE engine = 'old_partitions' "
                                          "AND kind = 'partition'")).scalar()
    assert left < legacy
    fresh = engine(db, name="old_partitions", record_history=False)
    fresh.feed([])
    assert (fresh.partitions("Q1"), fresh.partitions("Q2")) == (after.partitions("Q1"), after.partitions("Q2"))


def test_rows_of_partitions_and_chunks_with_every_event_inline_still_load(db):
    """Rows per batch as the version before shared events wrote them — a partition's events inline in its entry,
    every column of a buffer chunk a full list — load into the same buffer and partial matches, and the engine
    goes on from them as the uninterrupted one does."""
    import json

    rng = random.Random(SEED + 7)
    events = random_stream(rng, 160)
    reset(db)
    uninterrupted = engine(db, name="inline_rows_reference", record_history=False)
    uninterrupted.feed(events[:80], punctuation=events[60].ts)
    expected = uninterrupted.feed(events[80:], punctuation=streams.END_OF_STREAM)
    expected_statuses = statuses(db)
    reset(db)
    before = engine(db, name="inline_rows", record_history=False)
    before.feed(events[:80], punctuation=events[60].ts)
    with db.engine.connect() as connection:
        rows = connection.execute(sa.text("SELECT kind, item, value FROM activedb_stream_state "
                                          "WHERE engine = 'inline_rows' AND kind IN ('buffer', 'partitions')")).all()
    chunks = [(item, value) for kind, item, value in rows if kind == "buffer"]
    assert chunks and any("$all" in json.dumps(value) for _, value in chunks), "no chunk has a column of one value"
    assert any(kind == "partitions" and value["events"]["t"] for kind, _, value in rows)

    def full(column, count):
        return [column["$all"]] * count if isinstance(column, dict) else column

    with db.engine.begin() as connection:
        connection.execute(sa.text("DELETE FROM activedb_stream_state WHERE engine = 'inline_rows' "
                                   "AND kind IN ('buffer', 'partitions')"))
        for item, value in chunks:
            count = len(value["arrivals"])
            value = {"arrivals": value["arrivals"], **{field: full(value[field], count) for field in ("t", "ts", "s", "p")},
                     "a": {name: full(column, count) for name, column in value["a"].items()}}
            connection.execute(sa.text("INSERT INTO activedb_stream_state (engine, kind, item, value) "
                                       "VALUES ('inline_rows', 'buffer', :item, CAST(:value AS json))"),
                               {"item": item, "value": json.dumps(value)})
        entries = [[query, list(key), _inline_state(state)]
                   for query in ("Q1", "Q2") for key, state in before.partitions(query).items()]
        connection.execute(sa.text("INSERT INTO activedb_stream_state (engine, kind, item, value) "
                                   "VALUES ('inline_rows', 'partitions', '000000000000', CAST(:value AS json))"),
                           {"value": json.dumps({"entries": entries})})
    after = engine(db, name="inline_rows", record_history=False)
    after.feed([])
    assert after.buffered() == before.buffered()
    assert (after.partitions("Q1"), after.partitions("Q2")) == (before.partitions("Q1"), before.partitions("Q2"))
    rest = after.feed(events[80:], punctuation=streams.END_OF_STREAM)
    assert expected.outputs, "the second half has no output: the test compares nothing"
    assert [(output.query, output.attributes) for output in rest.outputs] == \
        [(output.query, output.attributes) for output in expected.outputs]
    assert statuses(db) == expected_statuses


def test_the_saved_state_keeps_through_the_revision_that_stores_it_as_json(db, database_url):
    """Revision 0012 changes ``activedb_stream_state.value`` from ``jsonb`` to ``json`` (stored uncompressed both
    ways): state saved before it loads after it, and the downgrade gives the rows back as ``jsonb``."""
    import activedb

    rng = random.Random(SEED + 8)
    events = random_stream(rng, 120)
    reset(db)
    before = engine(db, name="revised", record_history=False)
    before.feed(events[:80], punctuation=events[60].ts)
    assert before.buffered() and (before.partitions("Q1") or before.partitions("Q2"))

    def column() -> tuple:
        with db.engine.connect() as connection:
            return tuple(connection.execute(sa.text(
                "SELECT format_type(atttypid, atttypmod), attstorage FROM pg_attribute "
                "WHERE attrelid = 'activedb_stream_state'::regclass AND attname = 'value'")).one())

    def loaded() -> tuple:
        fresh = engine(db, name="revised", record_history=False)
        fresh.feed([])
        return fresh.buffered(), fresh.partitions("Q1"), fresh.partitions("Q2")

    expected = (before.buffered(), before.partitions("Q1"), before.partitions("Q2"))
    assert column() == ("json", "e")
    database = activedb.connect(database_url)
    try:
        database.schema.downgrade("0011_uncompressed_stream_state")
        assert column() == ("jsonb", "e")
        assert loaded() == expected
        database.schema.upgrade("head")
    finally:
        database.close()
    assert column() == ("json", "e")
    assert loaded() == expected


def test_a_settled_batch_leaves_its_pending_state_to_reference_counting(db):
    """When a batch's transaction has ended, nothing holds its pending state any more (the transaction keeps its
    participants; the participant lets go of the state once it has told the engine): it is freed at once, not
    left — with its copy of the buffer and its partition states — for Python's cyclic collector."""
    import gc
    import weakref

    rng = random.Random(SEED + 9)
    events = random_stream(rng, 60)
    reset(db)
    made = engine(db, name="freed", record_history=False)
    enabled = gc.isenabled()
    gc.disable()
    try:
        for outcome in ("commit", "abort"):
            with pytest.raises(RuntimeError) if outcome == "abort" else contextlib.nullcontext(), \
                    db.transaction() as tx:
                made.process(tx, events[:30], punctuation=events[10].ts)
                pending = weakref.ref(made._pending)
                if outcome == "abort":
                    raise RuntimeError("abort the batch")
            del tx
            assert pending() is None, f"after the {outcome}, the batch's pending state is still referenced"
    finally:
        if enabled:
            gc.enable()



def test_a_saved_row_that_cannot_be_read_is_named_and_left_as_it_was(db):
    """A malformed row of the saved state (here a partitions row whose state points past its events) stops the
    engine's load with a StreamStateError that names the row and says what to do; nothing is changed, and once
    the row is restored the engine loads and goes on."""
    import json

    rng = random.Random(SEED + 10)
    events = random_stream(rng, 80)
    reset(db)
    before = engine(db, name="malformed", record_history=False)
    before.feed(events[:60], punctuation=events[40].ts)
    expected = (before.partitions("Q1"), before.partitions("Q2"))
    with db.engine.begin() as connection:
        item, value = connection.execute(sa.text(
            "SELECT item, value FROM activedb_stream_state WHERE engine = 'malformed' AND kind = 'partitions' "
            "ORDER BY item DESC LIMIT 1")).one()
        broken = json.loads(json.dumps(value))
        entry = next(entry for entry in broken["entries"] if entry[2] is not None and any(entry[2]["b"]))
        next(buffer for buffer in entry[2]["b"] if buffer)[0] = 10_000
        connection.execute(sa.text("UPDATE activedb_stream_state SET value = CAST(:value AS json) "
                                   "WHERE engine = 'malformed' AND kind = 'partitions' AND item = :item"),
                           {"value": json.dumps(broken), "item": item})
    after = engine(db, name="malformed", record_history=False)
    with pytest.raises(StreamStateError, match=rf"row \(kind 'partitions', item '{item}'\).*reset_state"):
        after.feed([])
    with db.engine.begin() as connection:
        assert connection.execute(sa.text("SELECT value FROM activedb_stream_state WHERE engine = 'malformed' "
                                          "AND kind = 'partitions' AND item = :item"), {"item": item}).scalar() == broken
        connection.execute(sa.text("UPDATE activedb_stream_state SET value = CAST(:value AS json) "
                                   "WHERE engine = 'malformed' AND kind = 'partitions' AND item = :item"),
                           {"value": json.dumps(value), "item": item})
    after.feed([])
    assert (after.partitions("Q1"), after.partitions("Q2")) == expected


def test_a_saved_meta_row_with_a_field_of_the_wrong_kind_is_named(db):
    """A saved meta row whose position is text (not a whole number) stops the load with a StreamStateError naming
    the row, instead of loading a text position that would fail at the next release."""
    reset(db)
    engine(db, name="wrong_kind", record_history=False).feed(random_stream(random.Random(SEED + 11), 20))
    with db.engine.begin() as connection:
        connection.execute(sa.text("UPDATE activedb_stream_state SET value = CAST(json_build_object('position', 'x', "
                                   "'arrivals', 0, 'released', NULL, 'punctuations', json_build_object(), 'time_kind', "
                                   "NULL) AS json) WHERE engine = 'wrong_kind' AND kind = 'meta'"))
    with pytest.raises(StreamStateError, match=r"row \(kind 'meta', item ''\).*not a whole number.*reset_state"):
        engine(db, name="wrong_kind", record_history=False).feed([])


def test_events_given_as_mappings_equal_the_same_stream_events(db):
    """``process``/``feed`` take an event as a mapping (type, ts, attributes, stream) too: the same outputs and
    store effects as the StreamEvent objects, attributes and stream kept."""
    events = random_stream(random.Random(SEED + 1), 120)
    expected, _ = run_sorted(db, events, name="as-objects")
    assert expected[2], "the random stream should make Q1 match at least once"
    reset(db)
    made = engine(db, name="as-mappings")
    mappings = [{"type": event.type, "ts": event.ts, "attributes": dict(event.attributes), "stream": "estream"}
                for event in sorted(events, key=lambda event: event.ts)]
    result = made.feed(mappings, punctuation=streams.END_OF_STREAM)
    assert result.dead_letters == ()
    assert observe(db, result.outputs) == expected


def _fed_with(db, malformed, *, seed: int = SEED + 2, name: str = "malformed", **options) -> tuple:
    """A random stream (of ``seed``) fed with ``malformed`` in its middle by the engine ``with-{name}`` (``options``:
    the engine's, e.g. its scheduler), and what the stream gives without it (``without-{name}``): the result and the
    expected observation."""
    events = random_stream(random.Random(seed), 60)
    expected, _ = run_sorted(db, events, name=f"without-{name}")
    reset(db)
    made = engine(db, name=f"with-{name}", **options)
    ordered = sorted(events, key=lambda event: event.ts)
    result = made.feed([*ordered[:30], malformed, *ordered[30:]], punctuation=streams.END_OF_STREAM)
    return result, expected


@pytest.mark.parametrize("malformed", [
    {"type": "ENTER", "ts": 1, "attributes": 5, "stream": "estream"},
    {"type": "ENTER", "ts": 1, "attributes": {"HCW-ID": "w0", "location": "r0"}, "stream": 7},
    {"type": 5, "ts": 1, "attributes": {"HCW-ID": "w0", "location": "r0"}, "stream": "estream"},
    {"type": "NO_SUCH_TYPE", "ts": 1, "attributes": {"HCW-ID": "w0", "location": "r0"}, "stream": "estream"},
    {"type": "ENTER", "ts": 1, "attributes": None, "stream": "estream"},
], ids=["attributes-not-a-mapping", "stream-not-a-name", "type-not-a-name", "unknown-type", "attributes-none"])
def test_a_malformed_mapping_is_a_dead_letter_and_the_stream_goes_on(db, malformed):
    """A mapping that does not describe an event becomes a dead letter keeping the mapping as given; the events
    around it are processed as if it had not been there.  Its reason is the one the same StreamEvent gets: a mapping
    whose attributes were None was taken with one attribute, 'attributes' (None), where StreamEvent(…, None) is
    refused, and attributes or a stream of the wrong kind were refused as "not an event (dict)", although the
    mapping had its type, ts and attributes."""
    result, expected = _fed_with(db, malformed)
    assert [letter.event.origin for letter in result.dead_letters] == [malformed]
    assert observe(db, result.outputs) == expected
    if not isinstance(malformed["attributes"], dict) or not isinstance(malformed["stream"], str):
        assert re.match(r"rejected: the (attributes|stream) of 'ENTER' at 1 (are|is) a (int|NoneType), not a",
                        result.dead_letters[0].reason), result.dead_letters[0].reason


@pytest.mark.parametrize("malformed", [
    streams.StreamEvent("ENTER", 1, None, stream="estream"),                                 # type: ignore[arg-type]
    streams.StreamEvent("ENTER", 1, [("HCW-ID", "w0")], stream="estream"),                   # type: ignore[arg-type]
    streams.StreamEvent("ENTER", 1, {"HCW-ID": "w0", "location": "r0"}, stream=["estream"]),  # type: ignore[arg-type]
], ids=["attributes-none", "attributes-a-list", "stream-a-list"])
def test_a_malformed_stream_event_is_a_dead_letter_and_the_stream_goes_on(db, malformed):
    """A StreamEvent built with attributes that are not a mapping, or a stream that is not a name, is refused as
    a mapping describing it is: one dead letter keeping the event as given, recorded with the batch, and the events
    around it processed as if it had not been there."""
    result, expected = _fed_with(db, malformed)
    assert [letter.event.origin for letter in result.dead_letters] == [malformed]
    assert "rejected" in result.dead_letters[0].reason
    assert observe(db, result.outputs) == expected
    with db.engine.connect() as connection:
        assert connection.execute(sa.text("SELECT count(*) FROM activedb_dead_letters")).scalar() == 1


@pytest.mark.parametrize("durable", [True, False], ids=["durable", "in-memory"])
def test_a_dead_letter_whose_attributes_json_cannot_hold_is_recorded_and_the_stream_goes_on(db, durable):
    """A dead letter's ``raw`` shows an attribute the engine's state could not save (a set, an object, a NaN) as
    ``jsonable`` does, instead of failing the batch — every retry alike — with "cannot save ... in the engine's
    state" (said also to an engine that is not durable)."""
    reset(db)
    with db.engine.begin() as connection:
        connection.execute(sa.text("DELETE FROM activedb_dead_letters"))
    made = engine(db, name=f"unshowable_{durable}", durable=durable, record_history=False)
    made.feed([badge("EXIT", 10, "w0")], punctuation=10)
    result = made.feed([streams.StreamEvent("NO_SUCH_TYPE", 11, {"HCW-ID": "w0", "location": {"r1"}}),
                        streams.StreamEvent("ENTER", 2, {"HCW-ID": "w0", "location": float("nan")}),
                        streams.StreamEvent("ENTER", 3, {"HCW-ID": "w0", "location": "r\x001"})])
    assert [letter.reason.split(":")[0] for letter in result.dead_letters] == ["rejected", "late", "late"]
    with db.engine.connect() as connection:
        raws = connection.execute(sa.text("SELECT raw FROM activedb_dead_letters ORDER BY id")).scalars().all()
    assert [raw["attributes"] for raw in raws] == [{"HCW-ID": "w0", "location": ["r1"]},
                                                   {"HCW-ID": "w0", "location": "nan"},
                                                   {"HCW-ID": "w0", "location": "r\\u00001"}]


@pytest.mark.parametrize("name", ["x\x00", 5, "\ud800"], ids=["text-with-nul", "a-number", "lone-surrogate"])
def test_a_durable_engine_refuses_an_attribute_name_its_state_cannot_save_and_the_stream_goes_on(db, name):
    """An attribute's name is saved with its value: a name that is no text, or text PostgreSQL cannot hold, makes
    the event a dead letter when a durable engine admits it — the batch failed when the state was saved."""
    reset(db)
    made = engine(db, name="unsaveable_names", durable=True, record_history=False)
    result = made.feed([streams.StreamEvent("EXIT", 5, {"HCW-ID": "w0", name: 1}), badge("ENTER", 6, "w0")],
                       punctuation=0)
    (letter,) = result.dead_letters
    assert re.search(r"rejected: attribute name .* of EXIT\^5 cannot be saved in durable engine unsaveable_names's "
                     r"state .*; give attributes text names", letter.reason), letter.reason
    assert made.feed([], punctuation=streams.END_OF_STREAM).released == 1


@pytest.mark.parametrize("durable", [True, False], ids=["durable", "in-memory"])
def test_a_dead_letter_whose_type_or_stream_postgresql_cannot_hold_is_recorded_and_the_stream_goes_on(db, durable):
    """An event refused for its type or stream, whose type or stream name holds text PostgreSQL cannot store (a NUL,
    a lone surrogate), is a dead letter whose raw shows it storably — its insert failed the whole batch
    (InvalidValue), every retry alike."""
    reset(db)
    with db.engine.begin() as connection:
        connection.execute(sa.text("DELETE FROM activedb_dead_letters"))
    made = engine(db, name=f"unshowable_names_{durable}", durable=durable, record_history=False)
    result = made.feed([streams.StreamEvent("E\x00X", 1, {"HCW-ID": "w0"}),
                        streams.StreamEvent("EXIT", 1, {"HCW-ID": "w0"}, stream="es\ud800")])
    assert [letter.reason.split(":")[0] for letter in result.dead_letters] == ["rejected", "rejected"]
    with db.engine.connect() as connection:
        raws = connection.execute(sa.text("SELECT raw FROM activedb_dead_letters ORDER BY id")).scalars().all()
    assert [(raw["type"], raw["stream"]) for raw in raws] == [("E\\u0000X", None), ("EXIT", "es\\ud800")]


@pytest.mark.parametrize("value", [{"r1"}, object(), float("nan"), "r\x001", "\ud800"],
                         ids=["a-set", "an-object", "nan", "text-with-nul", "lone-surrogate"])
def test_a_durable_engine_refuses_an_attribute_its_state_cannot_save_and_the_stream_goes_on(db, value):
    """A durable engine's state holds the events it buffers: an event with an attribute the state cannot save is
    a dead letter saying so when it is admitted — before, the batch failed when the state was saved, every retry
    of it alike (the stream stopped for good)."""
    reset(db)
    made = engine(db, name="unsaveable", durable=True, record_history=False)
    bad = streams.StreamEvent("EXIT", 5, {"HCW-ID": "w0", "location": value})
    result = made.feed([bad, badge("ENTER", 6, "w0")], punctuation=0)
    (letter,) = result.dead_letters
    assert letter.event.attributes["location"] is value
    assert re.search(r"rejected: attribute 'location' of EXIT\^5 .* cannot be saved in durable engine unsaveable's "
                     r"state.*; give .* or use StreamEngine\(durable=False\)", letter.reason), letter.reason
    assert made.feed([], punctuation=streams.END_OF_STREAM).released == 1
    in_memory = engine(db, name="unsaved", durable=False, record_history=False)
    assert in_memory.feed([bad], punctuation=0).dead_letters == ()


@pytest.mark.parametrize("event_type", [None, "", 5], ids=["none", "empty", "a-number"])
def test_an_event_without_a_type_is_a_dead_letter_saying_to_give_each_event_a_type(db, event_type):
    """An event with no type (a dict without "type", ``StreamEvent(None, …)``) was refused as "stream estream has no
    event type None (types: …)" — as if a type of that name were missing from the stream.  It now says the event has
    no type and to give each event one, as a batch's dead letter does; an event of an unknown type keeps its
    reason."""
    reset(db)
    made = engine(db, name="untyped", record_history=False)
    result = made.feed([{"type": event_type, "ts": 1, "HCW-ID": "w0", "location": "r0"},
                        {"type": "WASH", "ts": 2, "HCW-ID": "w0", "location": "r0"}, badge("ENTER", 3, "w0")],
                       punctuation=streams.END_OF_STREAM)
    reasons = [letter.reason for letter in result.dead_letters]
    assert reasons[0].startswith(f"rejected: the event has no type (type {event_type!r}); give each event a type, "
                                 f"the name of one of stream estream's event types ("), reasons
    assert reasons[1].startswith("rejected: stream estream has no event type 'WASH'"), reasons
    assert result.released == 1


def test_feed_after_the_database_closed_says_to_connect_again_and_build_the_engine_on_the_new_one(migrated):
    """After ``db.close()``, ``engine.feed`` raised "this Database is closed; call activedb.connect() again" — but the
    engine keeps the Database it was given, so connecting again alone does not help: the error now says to build the
    engine (and whatever else was made on the closed Database) on the new one."""
    from activedb.errors import TransactionError

    database = activedb.connect(migrated)
    made = streams.StreamEngine(database, name="closed_db", durable=False)
    made.create_stream("estream", types=BADGE_TYPES, attributes=("HCW-ID", "location"))
    database.close()
    with pytest.raises(TransactionError, match=r"this Database is closed; call activedb.connect\(\) again, and make "
                                               r"anew on the new Database .*a StreamEngine"):
        made.feed([badge("EXIT", 1, "w0")])


def test_an_event_whose_integer_timestamp_no_float_can_hold_is_a_dead_letter_and_the_stream_goes_on(db):
    """A timestamp of 10**400 (an int beyond any float) is rejected as not finite, as an infinity is — check_time
    let math.isfinite's OverflowError out, and the whole batch failed, every retry alike."""
    reset(db)
    made = engine(db, name="huge_ts", record_history=False)
    result = made.feed([badge("EXIT", 10**400, "w0"), badge("ENTER", 3, "w0")], punctuation=streams.END_OF_STREAM)
    assert [letter.reason for letter in result.dead_letters] == [
        "rejected: timestamp " + repr(10**400) + " is not finite"]
    assert result.released == 1


@pytest.mark.parametrize("events", [badge("EXIT", 1, "w0"), {"type": "EXIT", "ts": 1, "HCW-ID": "w0"}, "EXIT", None,
                                    5], ids=["one-event", "one-mapping", "a-text", "none", "a-number"])
def test_events_that_are_no_collection_of_events_are_refused_saying_what_to_give(db, events):
    """``feed``/``process`` take a collection of events: one event, or one mapping, where the batch belongs was
    taken apart — a mapping's keys (a text's letters) each became a dead letter 'not an event' and the event itself
    was lost —, and None or a number failed with a TypeError; now a StreamError says what to give, and nothing
    changes."""
    reset(db)
    made = engine(db, name="one_event", record_history=False)
    with pytest.raises(StreamError, match=r"events is .*, not a collection of events: .*\[event\]"):
        made.feed(events, punctuation=streams.END_OF_STREAM)
    assert made.statistics().dead_letters == 0
    assert made.feed([badge("EXIT", 1, "w0")], punctuation=streams.END_OF_STREAM).released == 1


def test_a_punctuation_below_an_earlier_one_of_its_stream_changes_nothing(db):
    """A punctuation says no older event will come, so a lower one later (a source's clock stepped back, a
    watermark recomputed) cannot take that back: the stream's punctuation stays the greatest given (or punctuated
    with ``db.punctuate``), nothing released is released again, and an event between the two is late, not
    buffered.  The design note said 'their latest punctuation', which reads as the last one given."""
    reset(db)
    made = engine(db, name="backwards", record_history=False)
    assert made.feed([badge("EXIT", 1, "w0")], punctuation=20).released == 1
    lowered = made.feed([badge("EXIT", 10, "w1"), badge("EXIT", 25, "w2")], punctuation=5)
    assert [letter.event.describe() for letter in lowered.dead_letters] == ["EXIT^10"]
    assert (lowered.punctuation, lowered.released, lowered.buffered) == (20, 0, 1)
    assert made.feed([], punctuation=30).released == 1


def test_an_event_after_the_end_of_the_stream_is_a_late_letter_saying_how_to_start_a_new_run(db):
    """A durable engine keeps END_OF_STREAM in its saved state: every event of a later run (the script run again, a
    second bounded feed) is a late dead letter.  Its reason read 'older than the punctuation END_OF_STREAM … can no
    longer be put in order', which said neither that the stream had ended nor how to start again; it says both now
    (``reset_state()``, or an engine of another name), and the engine made anew on the same name goes on after it."""
    reset(db)
    made = engine(db, name="ended", record_history=False)
    assert made.feed([badge("EXIT", 1, "w0")], punctuation=streams.END_OF_STREAM).released == 1
    again = engine(db, name="ended", record_history=False)
    (letter,) = again.feed([badge("EXIT", 2, "w0")], punctuation=3).dead_letters
    assert letter.reason.startswith("late: EXIT^2 (ts 2) came after the end of the stream (the punctuation "
                                    "END_OF_STREAM), which engine ended released"), letter.reason
    assert "engine.reset_state()" in letter.reason and "another name" in letter.reason, letter.reason
    again.reset_state()
    assert again.feed([badge("EXIT", 2, "w0")], punctuation=3).released == 1


def test_a_refused_argument_too_long_to_show_is_shown_cut_where_its_cut_is_marked(db):
    """An argument a refusal shows is cut as ``reprlib`` cuts it, with ``...`` where it is cut: it was cut after 80
    characters, so one event in place of a batch read 'attributes={…}, , not a collection of events' (a repr missing
    its end, the comma doubled) and a batch_id of 400 digits was shown as an 80-digit number, another than given."""
    reset(db)
    made = engine(db, name="cut_arguments", record_history=False)
    with pytest.raises(StreamError) as refused:
        made.feed(badge("EXIT", 1, "w0", location="room " * 20), punctuation=streams.END_OF_STREAM)
    assert re.match(r"events is StreamEvent StreamEvent\(\S+\.\.\.\S+\), not a collection of events", str(refused.value))
    with pytest.raises(StreamError) as refused, db.transaction() as tx:
        made.process(tx, [badge("EXIT", 1, "w0")], batch_id=10 ** 400, punctuation=streams.END_OF_STREAM)
    assert re.match(r"process\(batch_id=1\d+\.\.\.0+\) takes a whole number", str(refused.value))
    assert made.feed([badge("EXIT", 1, "w0")], punctuation=streams.END_OF_STREAM).released == 1


@pytest.mark.parametrize("punctuations", [["estream"], [("estream", 5)], 5], ids=["names", "pairs", "a-number"])
def test_punctuations_that_are_no_mapping_are_refused_saying_what_to_give(db, punctuations):
    """``punctuations=`` maps each stream to its punctuation: a list of names failed with dict()'s ValueError
    ('dictionary update sequence element #0 has length 7'), a number with a TypeError; a list of pairs was taken as
    the mapping it is not documented to be."""
    reset(db)
    made = engine(db, name="punctuations_list", record_history=False)
    with pytest.raises(StreamError, match=r"punctuations= maps each stream's name to its punctuation"):
        made.feed([badge("EXIT", 1, "w0")], punctuations=punctuations)
    assert made.feed([badge("EXIT", 1, "w0")], punctuations={"estream": 5}).released == 1


@pytest.mark.parametrize("batch_id", ["x", 1.5, True, 2 ** 63], ids=["a-text", "a-fraction", "a-bool", "too-large"])
def test_a_batch_id_that_is_no_whole_number_is_refused_before_the_batch_runs(db, batch_id):
    """``batch_id`` is written with the batch's dead letters (a BIGINT column): one that is no whole number was taken
    until a batch had a dead letter, and that batch then failed after it had run, with an error naming the column
    ``activedb_dead_letters.batch_id``, not the argument."""
    reset(db)
    made = engine(db, name="batch_ids", record_history=False)
    with db.transaction() as tx:
        with pytest.raises(StreamError, match=r"process\(batch_id=.*\) takes a whole number"):
            made.process(tx, [badge("EXIT", 1, "w0"), {"type": "EXIT"}], batch_id=batch_id)
    with db.transaction() as tx:
        result = made.process(tx, [badge("EXIT", 1, "w0"), {"type": "EXIT"}], punctuation=streams.END_OF_STREAM,
                              batch_id=7)
    assert (result.released, len(result.dead_letters)) == (1, 1)


@pytest.mark.parametrize("switch", ["durable", "record_history", "record_dead_letters", "keep_outputs", "prefetch",
                                    "lowered"])
@pytest.mark.parametrize("value", ["no", 0, None], ids=["a-text", "a-number", "none"])
def test_a_switch_of_the_engine_that_is_no_bool_is_refused_saying_what_to_give(db, switch, value):
    """``StreamEngine``'s switches take True or False: ``durable="no"`` is true to Python, so the engine was
    durable (its state saved in every batch's transaction) while its caller had asked for the opposite."""
    with pytest.raises(StreamError, match=rf"StreamEngine\({switch}=.*\) takes True or False"):
        streams.StreamEngine(db, name="switched", **{switch: value})


def test_statistics_count_every_dead_letter_of_a_batch(db):
    """``statistics().dead_letters`` is late + rejected + failed: an input that is not an event, a malformed
    mapping or StreamEvent, an unknown type and a late event are each one, as many as the batches' letters."""
    reset(db)
    made = engine(db, name="counted")
    first = made.feed([badge("EXIT", 10)], punctuation=20)
    second = made.feed([
        "EXIT",                                                                  # not an event
        {"type": "ENTER", "ts": 21, "attributes": 5, "stream": "estream"},      # attributes not a mapping
        streams.StreamEvent("ENTER", 21, None),                                  # type: ignore[arg-type]
        badge("NO_SUCH_TYPE", 21),                                               # unknown type
        badge("ENTER", 5),                                                       # late
        badge("ENTER", 22),
    ], punctuation=streams.END_OF_STREAM)
    assert len(first.dead_letters) == 0 and len(second.dead_letters) == 5
    statistics = made.statistics()
    assert statistics.late_events == 1
    assert statistics.dead_letters == 5


@pytest.mark.parametrize("durable", [True, False], ids=["durable", "in-memory"])
def test_a_rejected_first_event_does_not_fix_the_kind_of_the_engine_s_timestamps(db, durable):
    """The first event ever admitted fixes whether the engine's timestamps are numbers or datetimes; one that is a
    dead letter for another reason (a row key that cannot key, an unknown type, a value the state cannot save) does
    not.  Before, a first event with a datetime and a list-valued HCW-ID was refused, but had made the engine's
    kind "datetime": every later event with a number timestamp was refused as of the wrong kind, the batch after
    too (a durable engine saved the kind)."""
    reset(db)
    made = engine(db, name=f"first-refused-{durable}", durable=durable, record_history=False)
    at = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    refused = [streams.StreamEvent("EXIT", at, {"HCW-ID": ["w0"], "location": "a"}),
               streams.StreamEvent("COUGH", at, {"HCW-ID": "w0", "location": "a"})]
    if durable:
        refused.append(streams.StreamEvent("EXIT", at, {"HCW-ID": "w0", "location": {1, 2}}))
    first = made.feed([*refused, badge("EXIT", 1, "w0", "a")], punctuation=2)
    assert [letter.event.ts for letter in first.dead_letters] == [at] * len(refused)
    assert first.released == 1
    second = made.feed([badge("ENTER", 3, "w0", "b")], punctuation=streams.END_OF_STREAM)
    assert (second.dead_letters, [output.query for output in second.outputs]) == ((), ["Q1"])


@pytest.mark.parametrize("nan", [float("nan"), ("w", float("nan"))], ids=["a-nan", "a-tuple-holding-a-nan"])
def test_an_event_whose_partition_value_is_a_nan_is_a_dead_letter_saying_why(db, nan):
    """A NaN equals nothing, itself included: as a partition's key (Q1's [HCW-ID]) it made the partition depend on
    the object — an EXIT and an ENTER with ``HCW-ID=math.nan`` (one object) matched, with ``float("nan")`` each (two
    objects) never did, each kept in a partition of its own.  An in-memory engine took both (a durable one refuses a
    NaN it cannot save); such an event is now a dead letter saying why, as one whose value cannot key a partition
    at all (a list)."""
    reset(db)
    made = engine(db, name="nan-partition", durable=False, record_history=False)
    result = made.feed([badge("EXIT", 1, nan, "a"), badge("ENTER", 3, nan, "b")], punctuation=streams.END_OF_STREAM)
    assert (result.released, result.outputs) == (0, ())
    assert [letter.event.type for letter in result.dead_letters] == ["EXIT", "ENTER"]
    for letter in result.dead_letters:
        assert re.fullmatch(r"rejected: \w+\^\d keys a partition or a store row by HCW-ID \(a NaN\), which cannot key "
                            r"one: a NaN equals nothing, not even itself; give None for a missing value", letter.reason
                            ), letter.reason


@pytest.mark.parametrize("durable", [True, False], ids=["durable", "in-memory"])
@pytest.mark.parametrize("bad", [float("nan"), "10", dt.datetime(2026, 1, 1),
                                 dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)],
                         ids=["nan", "a-string", "naive-datetime", "a-datetime-for-number-timestamps"])
def test_a_punctuation_that_is_not_a_time_of_the_engine_s_kind_is_refused_and_the_stream_goes_on(db, bad, durable):
    """A punctuation (``punctuation=``, ``punctuations=`` or ``db.watermark``) is a finite number of seconds or an
    aware datetime of the kind of the engine's timestamps, or END_OF_STREAM: anything else fails the batch with a
    StreamError naming it — not a TypeError from a comparison, an error about JSON, or (not saved) a NaN released
    bound that no later punctuation passes — and the engine goes on as before it."""
    reset(db)
    made = engine(db, name="punctuated", durable=durable, record_history=False)
    made.feed([badge("EXIT", 1, "w0", "a")], punctuation=0)
    with pytest.raises(StreamError, match=r"punctuation .*estream.*END_OF_STREAM"):
        made.feed([badge("ENTER", 3, "w0", "b")], punctuation=bad)
    with pytest.raises(StreamError, match=r"punctuation .*estream.*END_OF_STREAM"):
        made.feed([], punctuations={"estream": bad})
    result = made.feed([badge("ENTER", 3, "w0", "b")], punctuation=5)
    assert (result.released, result.dead_letters, result.punctuation) == (2, (), 5)
    assert [output.query for output in result.outputs] == ["Q1"]

    stream = f"watermarked_{durable}_{len(str(bad))}"
    watermarked = streams.StreamEngine(db, name=stream, durable=durable)
    watermarked.create_stream(stream, types=BADGE_TYPES, attributes=("HCW-ID", "location"))
    watermarked.feed([badge("EXIT", 1, "w0")])
    if bad != dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc):
        # No time at all: db.punctuate refuses it (a NaN kept would fail every later batch of the stream).
        with pytest.raises(activedb.InvalidTime, match=f"watermark of source '{stream}'"):
            db.punctuate(stream, bad)
        assert watermarked.feed([]).dead_letters == ()
        return
    db.punctuate(stream, bad)
    with pytest.raises(StreamError, match=rf"punctuation .*db.watermark\('{stream}'\).*END_OF_STREAM"):
        watermarked.feed([])


def test_a_punctuation_for_a_stream_the_engine_does_not_have_is_refused(db):
    """``punctuations=`` names the engine's streams: a name it does not have (a typo) fails the batch with a
    StreamError listing them, instead of being dropped while the events wait for a punctuation that never
    comes; the engine goes on as before the batch."""
    reset(db)
    made = engine(db, name="misnamed", record_history=False)
    with pytest.raises(StreamError, match=r"no stream 'e_stream' in engine misnamed \(streams: estream\)"):
        made.feed([badge("EXIT", 1, "w0", "a"), badge("ENTER", 3, "w0", "b")], punctuations={"e_stream": 5})
    result = made.feed([badge("EXIT", 1, "w0", "a"), badge("ENTER", 3, "w0", "b")], punctuations={"estream": 5})
    assert (result.released, [output.query for output in result.outputs]) == (2, ["Q1"])


def test_an_event_names_its_stream_as_a_query_s_on_does_ignoring_case(db):
    """An event's ``stream=`` is found as a query's ``ON`` finds a stream: the one spelled so, else the one equal to
    it ignoring case (declared names are told apart ignoring case, so there is at most one).  Before, an event of
    ``stream="ESTREAM"`` was a dead letter ("no stream 'ESTREAM'") though ``ON ESTREAM`` finds ``estream``; it is
    admitted as an event of ``estream``, and the access plan of such an event is that of ``estream``'s."""
    reset(db)
    made = engine(db, name="cased_events", record_history=False)
    made.define("CREATE QUERY QC ON ESTREAM PATTERN SEQ(EXIT, ENTER) RETURN EXIT.location")
    exit_, enter = (streams.StreamEvent(kind, ts, {"HCW-ID": "w0", "location": room}, stream=spelled)
                    for kind, ts, room, spelled in (("EXIT", 1, "a", "ESTREAM"), ("ENTER", 3, "b", "Estream")))
    assert made.access_plan(exit_) == made.access_plan(badge("EXIT", 1, "w0", "a"))
    result = made.feed([exit_, enter], punctuation=5)
    assert result.dead_letters == (), [letter.reason for letter in result.dead_letters]
    assert sorted(output.query for output in result.outputs) == ["Q1", "QC"]
    letter, = made.feed([streams.StreamEvent("EXIT", 6, {"HCW-ID": "w0"}, stream="e_stream")]).dead_letters
    assert "no stream 'e_stream' in engine cased_events (streams: estream)" in letter.reason, letter.reason


def test_a_punctuation_names_its_stream_as_an_event_does_ignoring_case(db):
    """``punctuations=`` keys and ``db.punctuate``'s source find the engine's stream as an event's ``stream=`` and a
    query's ``ON`` do: the one spelled so, else the one equal to it ignoring case.  Before, ``punctuations={"ESTREAM":
    5}`` failed the batch ("no stream 'ESTREAM'") and ``db.punctuate("ESTREAM", 5)`` was never read (the engine asked
    ``db.watermark("estream")``): the events waited for ever.  Two spellings of one stream are refused, naming both."""
    reset(db)
    made = engine(db, name="cased_punctuations", record_history=False, durable=False)
    result = made.feed([badge("EXIT", 1, "w0", "a"), badge("ENTER", 3, "w0", "b")], punctuations={"ESTREAM": 5})
    assert (result.released, [output.query for output in result.outputs]) == (2, ["Q1"])
    with pytest.raises(StreamError, match=r"punctuations= names stream estream twice \('Estream' and 'estream'\)"):
        made.feed([], punctuations={"Estream": 6, "estream": 7})

    punctuated = streams.StreamEngine(db, name="cased_watermark", durable=False)
    punctuated.create_stream("cased_badges", types=BADGE_TYPES, attributes=("HCW-ID", "location"))
    assert punctuated.feed([badge("EXIT", 3, "w0"), badge("EXIT", 8, "w0")]).buffered == 2
    db.punctuate("Cased_Badges", 5)
    result = punctuated.feed([])
    assert (result.released, result.buffered, result.punctuation) == (1, 1, 5)
    db.punctuate("CASED_BADGES", 9)
    with pytest.raises(StreamError, match=r"db.punctuate named stream cased_badges both 'CASED_BADGES' and "
                                          r"'Cased_Badges'"):
        punctuated.feed([])


def test_an_event_the_tie_key_raises_on_is_a_dead_letter_and_the_stream_goes_on(db):
    """A stream's ``tie_key`` is the application's code, as a rule's action is: when it raises on an event, that
    event is a dead letter naming the stream and the error, and the others are ordered and processed as without
    it (before, the error failed the batch, and every retry of the batch)."""
    reset(db)
    made = streams.StreamEngine(db, name="tied", durable=False)
    made.create_stream("estream", types=BADGE_TYPES, attributes=("HCW-ID", "location"),
                       tie_key=lambda event: event["location"].upper())
    made.define(Q1_R1)
    broken = badge("SANITIZE", 2, "w0", None)
    result = made.feed([badge("EXIT", 1, "w0", "a"), broken, badge("ENTER", 3, "w0", "b")],
                       punctuation=streams.END_OF_STREAM)
    assert [(letter.event.describe(), letter.event.attributes) for letter in result.dead_letters] == [
        ("SANITIZE^2", broken.attributes)]
    (letter,) = result.dead_letters
    assert "tie_key of stream estream raised AttributeError" in letter.reason
    assert (result.released, [output.query for output in result.outputs]) == (2, ["Q1"])
    assert made.statistics().dead_letters == 1
    with db.engine.connect() as connection:
        assert connection.execute(sa.text("SELECT count(*) FROM activedb_dead_letters")).scalar() == 1


@pytest.mark.parametrize("durable", [False, True], ids=["in-memory", "durable"])
def test_an_event_whose_tie_key_does_not_compare_is_a_dead_letter_and_the_stream_goes_on(db, durable):
    """A ``tie_key`` that gives a text for one event and a number for another of the same time and priority cannot
    order the two: the later-admitted one is a dead letter saying so, at its place among the batch's letters, and
    the stream goes on — in the batch that brings both, and when the first one waits in the buffer from an earlier
    batch (before, sorting the buffer raised TypeError: the batch failed, and so did every retry of it; once the
    first one was committed to the buffer, every later batch holding an event of its time did)."""
    reset(db)
    made = streams.StreamEngine(db, name="mixed-ties", durable=durable)
    made.create_stream("estream", types=BADGE_TYPES, attributes=("HCW-ID", "location"),
                       tie_key=lambda event: event["location"])
    made.define(Q1_R1)
    numbered = badge("EXIT", 1, "w0", 7)
    result = made.feed([badge("EXIT", 1, "w0", "a"), numbered, "no event", badge("ENTER", 3, "w0", "b")],
                       punctuation=2)
    assert [letter.event.type for letter in result.dead_letters] == ["EXIT", "?"]
    assert result.dead_letters[0].event.attributes == numbered.attributes
    assert "tie_key of stream estream gave 7 for EXIT^1" in result.dead_letters[0].reason
    assert (result.released, result.buffered) == (1, 1)
    # The ENTER at 3 waits in the buffer (committed): a number's tie meets it there.
    result = made.feed([badge("ENTER", 3, "w3", 9), badge("ENTER", 3, "w2", "c"), badge("EXIT", 4, "w0", "d")],
                       punctuation=streams.END_OF_STREAM)
    assert [letter.event.attributes for letter in result.dead_letters] == [{"HCW-ID": "w3", "location": 9}]
    assert [(output.query, output["location"]) for output in result.outputs] == [("Q1", "b")]
    assert made.statistics().dead_letters == 3
    with db.engine.connect() as connection:
        assert connection.execute(sa.text("SELECT count(*) FROM activedb_dead_letters")).scalar() == 3


@pytest.mark.parametrize("scheduler", ["sei", "s2pl", "lwm"])
@pytest.mark.parametrize("malformed", [
    streams.StreamEvent("ENTER", 40, {"HCW-ID": ["w0"], "location": "r0"}, stream="estream"),
    streams.StreamEvent("EXIT", 40, {"HCW-ID": {"id": "w0"}, "location": "r0"}, stream="estream"),
], ids=["row-key-a-list", "partition-a-dict"])
def test_an_event_whose_key_attribute_cannot_key_is_a_dead_letter_and_the_stream_goes_on(db, malformed, scheduler):
    """An event whose value of an attribute that keys a partition ([HCW-ID]) or a store row (workerID =
    ENTER.HCW-ID) is a list or a dict cannot be matched or locked: it is a dead letter naming the attribute, and
    the events around it are processed as if it had not been there — under every scheduler (before, the batch
    failed with TypeError: unhashable type, and so did every retry of it)."""
    result, expected = _fed_with(db, malformed, name="unkeyable", scheduler=scheduler)
    assert [(letter.event.describe(), letter.event.attributes) for letter in result.dead_letters] == [
        (malformed.describe(), malformed.attributes)]
    assert "HCW-ID" in result.dead_letters[0].reason
    assert observe(db, result.outputs) == expected


def test_partitions_finds_a_query_in_any_case_and_refuses_an_unknown_one(db):
    """Definitions compare query names ignoring case, but ``partitions("q1")`` compared them exactly and gave ``{}``
    for the defined Q1 — as it did for a query that does not exist at all, where the engine's other calls refuse
    an unknown query."""
    rng = random.Random(SEED + 5)
    events = random_stream(rng, 80)
    reset(db)
    made = engine(db, name="partitions_case")
    made.feed(events[:60], punctuation=events[50].ts)
    assert made.partitions("Q1")
    assert made.partitions("q1") == made.partitions("Q1")
    with pytest.raises(streams.errors.UnknownQuery, match="Q9.*Q1"):
        made.partitions("Q9")
    for wrong in (None, 1):          # (folding its case raised AttributeError: no ActivedbError)
        with pytest.raises(streams.errors.UnknownQuery, match="no such query.*Q1"):
            made.partitions(wrong)


@pytest.mark.parametrize("malformed, kept", [
    ({"type": "ENTER", "ts": 1, "attributes": 5, "stream": "estream"},
     {"type": "ENTER", "ts": 1, "attributes": 5, "stream": "estream"}),
    (streams.StreamEvent("ENTER", 1, [("HCW-ID", "w0")], stream="estream"),             # type: ignore[arg-type]
     {"type": "ENTER", "ts": 1, "attributes": [("HCW-ID", "w0")], "stream": "estream"}),
    (("ENTER", 1), ("ENTER", 1)),
], ids=["mapping", "stream-event", "no-event"])
def test_the_stored_dead_letter_of_a_malformed_event_keeps_what_arrived(db, malformed, kept):
    """The stored letter (``activedb dead-letters list``; its ``original`` is what a replay sends again) of an input
    that is no well-formed event recorded type "?", no ts and no attributes: only the in-memory letter's origin kept
    the input, so once the process ended nobody could see what had arrived, let alone mend and replay it.  The
    design note of dead letters: "a letter keeps its row exactly"."""
    from activedb import deadletters
    reset(db)
    with db.engine.begin() as connection:
        connection.execute(sa.text("DELETE FROM activedb_dead_letters"))
    made = engine(db, name="kept_malformed", record_history=False)
    result = made.feed([malformed, badge("EXIT", 10, "w0")], punctuation=10)
    assert [letter.event.origin for letter in result.dead_letters] == [malformed]
    [letter] = deadletters.select(db, deadletters.LetterFilter(query="streams:kept_malformed"))
    assert letter.row() == kept and "rejected" in letter.reason
    assert letter.raw != {"type": "?", "ts": None, "stream": None, "attributes": {}}


@pytest.mark.parametrize("scheduler", ["sei", "s2pl", "lwm"])
@pytest.mark.parametrize("malformed", [
    streams.StreamEvent("ENTER", 40, {"HCW-ID": 5, "location": "r0"}, stream="estream"),
    streams.StreamEvent("EXIT", 40, {"HCW-ID": 5, "location": "r0"}, stream="estream"),
], ids=["enter", "exit"])
def test_an_event_whose_row_key_the_table_refuses_is_a_dead_letter_and_the_stream_goes_on(db, malformed, scheduler):
    """An event whose attribute keys a store row by a value the table refuses (HCW-ID 5 for workerStatus.workerID,
    a text column) is a dead letter saying why, and the events around it are processed as if it had not been
    there — under every scheduler, with the batch's prefetch (the default) and LWM's base images (before, the
    prefetch or LWM's loading of the row failed the whole batch with InvalidValue, and so did every retry)."""
    result, expected = _fed_with(db, malformed, seed=SEED + 3, name="refused-key", scheduler=scheduler)
    assert [(letter.event.describe(), letter.event.attributes) for letter in result.dead_letters] == [
        (malformed.describe(), malformed.attributes)]
    assert "workerstatus.workerid is TEXT" in result.dead_letters[0].reason
    assert observe(db, result.outputs) == expected


@pytest.mark.parametrize("scheduler", ["sei", "s2pl", "lwm"])
def test_a_read_key_out_of_the_column_s_range_says_nothing_was_read(db, scheduler):
    """A query's Read whose key the table refuses by its range (2**40 for ``stream_cells.cell``, an integer) is the
    event's dead letter saying nothing was read — not "nothing was written": a Read writes nothing
    (``Checked.READ``).  Under every scheduler's view: SEI's overlay, S2PL's ``LockedView`` and LWM's
    ``VersionedView.read``, whose refusal had no test of its own.  The other event is processed as usual.  Before,
    SEI's Read of a key given as a tuple (a subquery's) was checked by the overlay's row lookup (``Overlay._row``) as
    a key to write, and said "nothing was written"."""
    made = streams.StreamEngine(db, name=f"read-range-{scheduler}", scheduler=scheduler, durable=False)
    made.create_stream("s", types=("A",), attributes=("k",))
    made.define("CREATE QUERY Probe PATTERN SEQ(A) WHERE (SELECT value FROM stream_cells WHERE cell = A.k) <= 5 "
                "RETURN A.k")
    with db.engine.begin() as connection:
        connection.execute(sa.text("INSERT INTO stream_cells (cell, value) VALUES (1, 0)"))
    result = made.feed([streams.StreamEvent("A", 1, {"k": 2**40}), streams.StreamEvent("A", 2, {"k": 1})],
                       punctuation=streams.END_OF_STREAM)
    [letter] = result.dead_letters
    assert letter.event.attributes == {"k": 2**40}
    assert "1099511627776 is outside the column's range" in letter.reason, letter.reason
    assert letter.reason.endswith("; nothing was read") and "nothing was written" not in letter.reason, letter.reason
    assert [output.attributes["k"] for output in result.outputs] == [1]


@pytest.mark.parametrize("bad", [float("nan"), dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)],
                         ids=["nan", "a-datetime-for-number-timestamps"])
@pytest.mark.parametrize("first", [True, False], ids=["first-batch", "later-batch"])
def test_a_refused_punctuation_admits_nothing_so_a_retry_in_the_transaction_admits_the_events_once(db, bad, first):
    """A batch whose punctuation is refused (StreamError) changes nothing: a caller that catches the error and
    processes the batch again in the same transaction, with a good punctuation, gets each event once — one
    Q1 output, two events released.  Before, the refused call had already put its events into the batch's
    buffer, so the retry released them twice (and in the first batch the events had fixed the engine's kind)."""
    reset(db)
    made = engine(db, name="refused", durable=False, record_history=False)
    if not first:
        made.feed([badge("EXIT", 0, "w1", "z")], punctuation=0)
    events = [badge("EXIT", 1, "w0", "a"), badge("ENTER", 3, "w0", "b")]
    with db.transaction() as tx:
        with pytest.raises(StreamError, match=r"punctuation"):
            made.process(tx, events, punctuation=bad)
        with pytest.raises(StreamError, match=r"no stream 'e_stream'"):
            made.process(tx, events, punctuations={"e_stream": 5})
        result = made.process(tx, events, punctuation=5)
    assert (result.released, result.dead_letters, result.buffered) == (2 if first else 3, (), 0)
    assert [output.query for output in result.outputs] == ["Q1"]


def test_reset_state_after_the_database_closed_is_refused_and_leaves_the_saved_state(migrated):
    """After ``db.close()``, ``engine.reset_state()`` of a durable engine opened a connection of the closed Database's
    disposed pool and deleted the engine's saved state (its punctuation, buffered events and partial matches) — the
    one call of the engine that still reached PostgreSQL, while ``feed`` and ``process`` said the Database is closed.
    It now raises that error too, and the saved state stays for the engine made on the new Database."""
    from activedb.errors import TransactionError

    database = activedb.connect(migrated)
    made = streams.StreamEngine(database, name="closed_reset")
    made.create_stream("estream", types=BADGE_TYPES, attributes=("HCW-ID", "location"))
    made.reset_state()
    made.feed([badge("EXIT", 10, "w0")], punctuation=5)          # EXIT^10 stays buffered: saved
    database.close()
    with pytest.raises(TransactionError, match=r"this Database is closed; call activedb.connect\(\) again, and make "
                                               r"anew on the new Database .*a StreamEngine"):
        made.reset_state()
    again = activedb.connect(migrated)
    try:
        anew = streams.StreamEngine(again, name="closed_reset")
        anew.create_stream("estream", types=BADGE_TYPES, attributes=("HCW-ID", "location"))
        assert [(event.type, event.ts) for event in anew.buffered()] == [("EXIT", 10)]
    finally:
        again.close()


def test_an_engine_on_a_closed_database_is_refused_when_made(migrated):
    """``StreamEngine(db)`` on a Database already closed was made, definitions and all, and failed only at its first
    batch (feed, process) — or, durable, at its first load of the saved state.  Now making it raises the closed
    Database's TransactionError (connect again, make the engine on the new Database)."""
    from activedb.errors import TransactionError

    database = activedb.connect(migrated)
    database.close()
    for durable in (False, True):
        with pytest.raises(TransactionError, match=r"this Database is closed; call activedb.connect\(\) again, and "
                                                   r"make anew on the new Database .*a StreamEngine"):
            streams.StreamEngine(database, name="made_closed", durable=durable)
