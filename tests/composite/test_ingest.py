"""Rows to a composition engine's inputs (``activedb.composite.rows_to_items``) and through ``CompositeHandler``: bad
rows, and rows the engine refuses, are rejected (dead letters), never raised."""

from __future__ import annotations

import types

import pytest
import sqlalchemy as sa

import activedb
from activedb import composite
from activedb.composite import Heartbeat, rows_to_items
from activedb.composite._ingest import feed_batch
from activedb.ingest import EventMapping, feed
from tests.composite._workload import pair_rows, pairs_engine

MAPPING = EventMapping("kind", "id", "ts", payload_columns=[], producer_column="producer", accuracy_column="accuracy",
                       type_map={"a": "A", 2: "B"}, heartbeat_type="beat")

#: The rows of the tests of a composition whose RETURN (``A.x / B.y``) raises on y = 0: their mapping, a row, and a
#: heartbeat of both producers.
RATIO_MAPPING = EventMapping("type", "k", "ts", producer_column="producer", accuracy_column="accuracy",
                             heartbeat_type="heartbeat", payload_columns=["id", "x", "y"])


def ratio_row(kind, ts, producer, ident=None, x=None, y=None):
    return {"type": kind, "k": "x" if ident else None, "ts": ts, "producer": producer, "accuracy": 0.01,
            "id": ident, "x": x, "y": y}


def ratio_beats(ts):
    return [ratio_row("heartbeat", ts, "P0"), ratio_row("heartbeat", ts, "P1")]


def test_a_row_whose_type_cannot_be_looked_up_in_the_type_map_is_rejected_and_the_others_are_taken():
    """With ``type_map``, a row whose type is a list (an array column) is a rejected row naming the field, as any
    other bad type is — not a TypeError (unhashable) that failed the whole batch."""
    rows = [{"producer": "P", "kind": "a", "ts": 1.0, "id": "x", "accuracy": 0.001},
            {"producer": "P", "kind": ["a"], "ts": 2.0, "id": "y", "accuracy": 0.001},
            {"producer": "P", "kind": 2, "ts": 3.0, "id": "z", "accuracy": 0.001},
            {"producer": "P", "kind": "beat", "ts": 4.0, "id": None, "accuracy": 0.001}]
    items, rejected = rows_to_items(rows, MAPPING)
    assert [item.type if not isinstance(item, Heartbeat) else "heartbeat" for item in items] == ["A", "B",
                                                                                                  "heartbeat"]
    assert [(row.position, row.reason) for row in rejected] == [(1, "event type ('kind') is ['a'], need a "
                                                                    "non-empty string")]


def test_a_row_whose_accuracy_puts_its_interval_out_of_range_is_rejected_and_the_others_are_taken():
    """An accuracy so large that ``[ts − α, ts + α]`` leaves the datetimes' range (years 1 to 9999) is a rejected
    row naming the field — rows_to_items raised OverflowError, which failed the whole batch, every retry alike."""
    rows = [{"producer": "P", "kind": "a", "ts": 1.0, "id": "x", "accuracy": 1e300},
            {"producer": "P", "kind": "a", "ts": 2.0, "id": "y", "accuracy": 1e11},
            {"producer": "P", "kind": "a", "ts": 3.0, "id": "z", "accuracy": 0.001}]
    items, rejected = rows_to_items(rows, MAPPING)
    assert [item.attributes["id"] for item in items] == ["z"]
    assert [row.position for row in rejected] == [0, 1]
    for row in rejected:
        assert row.reason.startswith("accuracy ('accuracy') is "), row.reason
        assert "out of the representable range" in row.reason, row.reason


def test_an_accuracy_or_local_timestamp_that_is_an_int_no_float_holds_is_rejected_and_the_others_are_taken():
    """An accuracy or a local timestamp of 10**400 (an int no float holds) is a rejected row naming the field, as an
    infinite one is — rows_to_items raised OverflowError (math.isfinite of it), which failed the whole batch, every
    retry alike."""
    mapping = EventMapping("kind", "id", "ts", payload_columns=[], producer_column="producer",
                           accuracy_column="accuracy", local_ts_column="local")
    rows = [{"producer": "P", "kind": "a", "ts": 1.0, "id": "x", "accuracy": 10**400, "local": 1.0},
            {"producer": "P", "kind": "a", "ts": 2.0, "id": "y", "accuracy": 0.001, "local": -10**400},
            {"producer": "P", "kind": "a", "ts": 3.0, "id": "z", "accuracy": 0.001, "local": 3}]
    items, rejected = rows_to_items(rows, mapping)
    assert [item.attributes["id"] for item in items] == ["z"]
    assert [(row.position, row.reason.split(" is ")[0]) for row in rejected] == [
        (0, "accuracy ('accuracy')"), (1, "local timestamp ('local')")]
    assert [row.reason.split(", ")[-1] for row in rejected] == ["need a non-negative number of seconds",
                                                                "need a number or a timestamp"]


def test_a_rejected_timestamp_names_its_field():
    """A timestamp that is no time is rejected with a reason naming the field, as the ingestion core words it
    (``timestamp ('ts') is 'yesterday' (str), not an ISO-8601 timestamp``) — it said only ``is 'yesterday' (str),
    not an ISO-8601 timestamp``, naming nothing."""
    rows = [{"producer": "P", "kind": "a", "ts": "yesterday", "id": "x", "accuracy": 0.001},
            {"producer": "P", "kind": "a", "ts": float("nan"), "id": "y", "accuracy": 0.001}]
    _, rejected = rows_to_items(rows, MAPPING)
    assert [row.reason for row in rejected] == ["timestamp ('ts') is 'yesterday' (str), not an ISO-8601 timestamp",
                                                "timestamp ('ts') is nan (float), not a finite number"]


def test_a_row_is_any_mapping_and_what_is_no_mapping_is_rejected_as_such():
    """Rows are mappings of column to value, as the ingestion core takes them: one that is no ``dict`` (a
    ``MappingProxyType``) is taken — it was rejected as having no producer —, and what is no mapping at all is
    rejected saying so, not ``producer ('producer') is None``."""
    good = {"producer": "P", "kind": "a", "ts": 1.0, "id": "x", "accuracy": 0.001}
    items, rejected = rows_to_items([types.MappingProxyType(good), 5], MAPPING)
    assert [item.attributes["id"] for item in items] == ["x"]
    assert [(row.position, row.reason, row.row) for row in rejected] == [
        (1, "row is 5 (int), not a mapping of column to value", {"value": 5})]


def test_a_row_the_engine_refuses_is_rejected_at_its_position_so_that_its_dead_letter_keeps_the_row():
    """A row the engine refuses (late, or of a producer that has not joined) is rejected with its position in the
    batch, as a row validation rejects: its dead letter then keeps the row as delivered (what a replay applies) —
    it was position -1, whose letter kept only the producer and the time (the row's other fields were lost)."""
    mapping = EventMapping("type", "k", "ts", producer_column="producer", accuracy_column="accuracy",
                           heartbeat_type="heartbeat", payload_columns=["id"])
    rows = pair_rows()
    late = {"type": "B", "k": "x", "ts": 100.5, "producer": "P1", "accuracy": 0.01, "id": "late"}
    stranger = {"type": "A", "k": "y", "ts": 130.0, "producer": "P9", "accuracy": 0.01, "id": "stranger"}
    engine = pairs_engine(None)
    feed_batch(engine, rows[:12], mapping)
    batch = [*rows[12:18], late, stranger, *rows[18:]]
    result = feed_batch(engine, batch, mapping)
    assert sorted((row.position, row.reason.split(":")[0]) for row in result.rejected) == [
        (6, "LateEvent"), (7, "producer 'P9' has not joined the composition engine (atomic membership")]


def test_a_row_a_query_s_condition_cannot_be_evaluated_on_is_rejected_and_the_others_are_taken():
    """A row whose event a query's event-only condition cannot be evaluated on (``A.x > 5`` on a text) is refused
    by the engine before it changes anything — a refusal, as a late row is, so it is rejected at its position and
    the rest of the batch is taken.  Before, its EvaluationError failed the whole batch, and a connector delivering
    the batch again met it again, for ever: the stream stopped for good."""
    mapping = EventMapping("type", "k", "ts", producer_column="producer", accuracy_column="accuracy",
                           heartbeat_type="heartbeat", payload_columns=["id", "x"])
    engine = composite.CompositionEngine(None, name="filtered", clock=composite.ManualClock(), timeout=None)
    engine.create_stream("s", types=["A", "B"], attributes=["id", "k", "x"])
    engine.define("CREATE QUERY Q PATTERN SEQ(A, B) WHERE A.x > 5 RETURN A.id AS a, B.id AS b")
    engine.join("P0", types=["A"])
    engine.join("P1", types=["B"])
    rows = [{"type": "A", "k": "x", "ts": 100.0, "producer": "P0", "accuracy": 0.01, "id": "a0", "x": 7},
            {"type": "A", "k": "x", "ts": 101.0, "producer": "P0", "accuracy": 0.01, "id": "bad", "x": "abc"},
            {"type": "B", "k": "x", "ts": 102.0, "producer": "P1", "accuracy": 0.01, "id": "b0", "x": None},
            {"type": "heartbeat", "k": None, "ts": 110.0, "producer": "P0", "accuracy": 0.01, "id": None, "x": None},
            {"type": "heartbeat", "k": None, "ts": 110.0, "producer": "P1", "accuracy": 0.01, "id": None, "x": None}]
    result = feed_batch(engine, rows, mapping)
    assert [(row.position, row.reason.split(":")[0]) for row in result.rejected] == [(1, "EventRejected")]
    assert "cannot compare" in result.rejected[0].reason and result.rejected[0].row["id"] == "bad"
    assert [(item.payload()["a"], item.payload()["b"]) for item in result.composites] == [("a0", "b0")]
    assert engine.statistics().events == 2


def test_a_row_the_engine_refuses_as_late_is_a_dead_letter_and_the_batch_commits(make_database_url):
    """A producer's row that comes a batch after rows it detected later (decisions relied on its absence) is
    refused by the engine with ``LateEvent``.  Through ``CompositeHandler`` it is a dead letter with that
    refusal, and the rest of its batch is applied: the composites are those of the batches without it.  Before,
    the refusal failed the whole batch, and a connector delivering the batch again met it again, for ever."""
    mapping = EventMapping("type", "k", "ts", producer_column="producer", accuracy_column="accuracy",
                           heartbeat_type="heartbeat", payload_columns=["id"])
    rows = pair_rows()
    late = {"type": "B", "k": "x", "ts": 100.5, "producer": "P1", "accuracy": 0.01, "id": "late"}
    batches = [rows[:12], [*rows[12:18], late, *rows[18:]]]

    direct = pairs_engine(None)
    expected = [dict(item.payload()) for batch in (batches[0], [row for row in batches[1] if row is not late])
                for item in feed_batch(direct, batch, mapping).composites]
    assert expected, "the rows must compose"
    database = activedb.connect(make_database_url("late", migrations=()))
    try:
        engine = pairs_engine(database)
        outcomes = feed(database, batches, source="pairs", mapping=mapping,
                        handler=composite.CompositeHandler(engine))
        assert [outcome.committed for outcome in outcomes] == [True, True]
        assert (sum(outcome.events for outcome in outcomes), [outcome.dead_letters for outcome in outcomes]) == \
            (len(expected), [0, 1])
        with database.engine.connect() as connection:
            [(reason, raw)] = connection.execute(sa.text("SELECT reason, raw FROM activedb_dead_letters")).all()
        assert reason.startswith("LateEvent: ") and "P1" in reason, reason
        assert raw == late
    finally:
        database.close()


def test_an_event_completing_a_composition_whose_return_raises_is_a_dead_letter_and_the_stream_goes_on():
    """A composition whose RETURN raises (``A.x / B.y`` with y = 0) failed the whole batch, on every delivery: the
    stream stopped for good.  Now the event that completed the composition (the constituent that arrived last) is
    rejected with the query and the error — at its row, or, come in an earlier batch and completed by a
    heartbeat, as no row of the batch (position -1) showing the event — and the other constituents stay."""
    mapping, row, beats = RATIO_MAPPING, ratio_row, ratio_beats

    engine = composite.CompositionEngine(None, name="ratio", clock=composite.ManualClock(), timeout=None)
    engine.create_stream("s", types=["A", "B"], attributes=["id", "k", "x", "y"])
    engine.define("CREATE QUERY Q PATTERN SEQ(A, B) RETURN A.id AS a, B.id AS b, A.x / B.y AS r")
    engine.join("P0", types=["A"])
    engine.join("P1", types=["B"])
    first = feed_batch(engine, [row("A", 100.0, "P0", "a0", x=1), row("B", 101.0, "P1", "b0", y=0), *beats(110.0)],
                       mapping)
    assert [(rejected.position, rejected.row["id"]) for rejected in first.rejected] == [(1, "b0")]
    reason = first.rejected[0].reason
    assert reason.startswith("EventRejected: ") and "query Q" in reason and "1 / 0" in reason, reason
    assert first.composites == ()
    second = feed_batch(engine, [row("B", 111.0, "P1", "b1", y=2), *beats(120.0)], mapping)
    assert (second.rejected, [(item["a"], item["b"], item["r"]) for item in second.composites]) == \
        ((), [("a0", "b1", 0.5)])                         # a0 stayed in its list
    # Completed by the heartbeats of a later batch: the event is no row of it.
    assert feed_batch(engine, [row("A", 121.0, "P0", "a1", x=3), row("B", 122.0, "P1", "b2", y=0)],
                      mapping).rejected == ()
    third = feed_batch(engine, beats(130.0), mapping)
    assert [(rejected.position, rejected.row["id"], rejected.row["type"]) for rejected in third.rejected] == \
        [(-1, "b2", "B")]
    assert third.composites == () and engine.statistics().waiting == 1          # a1 waits for a B


def test_a_batch_with_a_composition_whose_return_raises_commits_with_a_dead_letter(make_database_url):
    """Through ``CompositeHandler`` (``feed``): the batch with a composition whose RETURN raises commits, the event
    that completed it is a dead letter naming the query, and the next batch composes with the events that stayed."""
    mapping, row = RATIO_MAPPING, ratio_row

    beats = [row("heartbeat", 110.0, "P0"), row("heartbeat", 110.0, "P1")]
    later = [row("heartbeat", 120.0, "P0"), row("heartbeat", 120.0, "P1")]
    bad = row("B", 101.0, "P1", "b0", y=0)
    database = activedb.connect(make_database_url("ratio", migrations=()))
    try:
        engine = composite.CompositionEngine(database, name="ratio", clock=composite.ManualClock(), timeout=None)
        engine.create_stream("s", types=["A", "B"], attributes=["id", "k", "x", "y"])
        engine.define("CREATE QUERY Q PATTERN SEQ(A, B) RETURN A.id AS a, B.id AS b, A.x / B.y AS r")
        engine.join("P0", types=["A"])
        engine.join("P1", types=["B"])
        outcomes = feed(database, [[row("A", 100.0, "P0", "a0", x=1), bad, *beats],
                                   [row("B", 111.0, "P1", "b1", y=2), *later]],
                        source="ratio", mapping=mapping, handler=composite.CompositeHandler(engine))
        assert [(outcome.committed, outcome.events, outcome.dead_letters) for outcome in outcomes] == \
            [(True, 0, 1), (True, 1, 0)]
        with database.engine.connect() as connection:
            [(reason, raw)] = connection.execute(sa.text("SELECT reason, raw FROM activedb_dead_letters")).all()
        assert reason.startswith("EventRejected: ") and "query Q" in reason and "1 / 0" in reason, reason
        assert raw == bad
    finally:
        database.close()


def test_rows_that_are_no_batch_and_a_mapping_that_is_none_are_refused_saying_what_to_give():
    """One row where a batch belongs was taken apart — each of its column names a rejected "row" — and None (or
    ``mapping=None``) failed with a TypeError (AttributeError), no ActivedbError saying what to give."""
    engine = pairs_engine(None)
    row = {"kind": "a", "id": "a0", "ts": 100.0, "producer": "P0", "accuracy": 0.01}
    for rows in (row, None, "rows", 5):
        with pytest.raises(activedb.ingest.errors.IngestError, match=r"not a batch of rows: .*\[row\]"):
            feed_batch(engine, rows, MAPPING)
        with pytest.raises(activedb.ingest.errors.IngestError, match=r"not a batch of rows"):
            rows_to_items(rows, MAPPING)
    with pytest.raises(activedb.ingest.errors.MappingError, match=r"take an activedb.ingest.EventMapping"):
        feed_batch(engine, [row], None)
    assert engine.statistics().events == 0


def test_an_uncertain_order_without_on_uncertain_is_a_dead_letter_and_the_stream_goes_on(make_database_url):
    """Without ``on_uncertain`` the engine raises ``UncertainOrder`` and keeps raising until the application
    decides: inside an ingestion batch that failed the batch, its transaction's abort returned the engine to its
    snapshot, and every delivery of the batch raised again — the stream stopped for good.  Now the uncertain
    candidate is a dead letter whose reason names the uncertainty and says what to do (give ``on_uncertain``, then
    replay), it leaves the engine's lists, the rest of the batch and the later batches go on, and a replay feeds it
    again."""
    mapping = EventMapping("type", "k", "ts", producer_column="producer", accuracy_column="accuracy",
                           heartbeat_type="heartbeat", payload_columns=["id"])

    def row(kind, ts, producer, ident=None, accuracy=0.01):
        return {"type": kind, "k": "x" if ident else None, "ts": ts, "producer": producer, "accuracy": accuracy,
                "id": ident}

    def beats(ts):
        return [row("heartbeat", ts, "P0"), row("heartbeat", ts, "P1")]

    def make(database, on_uncertain=None):
        engine = composite.CompositionEngine(database, name="pairs", clock=composite.ManualClock(), timeout=None,
                                             on_uncertain=on_uncertain)
        engine.create_stream("s", types=["A", "B"], attributes=["id", "k"])
        engine.define("CREATE QUERY Q PATTERN SEQ(A, B) RETURN A.id AS a, B.id AS b")
        engine.join("P0", types=["A"])
        engine.join("P1", types=["B"])
        return engine

    uncertain = row("B", 100.2, "P1", "b0", accuracy=0.5)            # its order against a0 is uncertain
    batches = [[row("A", 100.0, "P0", "a0", accuracy=0.5), uncertain, *beats(110.0)],
               [row("A", 111.0, "P0", "a1"), row("B", 112.0, "P1", "b1"), *beats(120.0)]]
    database = activedb.connect(make_database_url("uncertain", migrations=()))
    try:
        engine = make(database)
        outcomes = feed(database, batches, source="pairs", mapping=mapping,
                        handler=composite.CompositeHandler(engine))
        assert [(outcome.committed, outcome.events, outcome.dead_letters) for outcome in outcomes] == \
            [(True, 0, 1), (True, 1, 0)]
        assert [(item.payload()["a"], item.payload()["b"]) for item in engine.window().composites] == [("a0", "b1")]
        assert [event["id"] for lists in engine.waiting().values() for events in lists["lists"].values()
                for event in events] == ["a1"]
        with database.engine.connect() as connection:
            [letter] = connection.execute(sa.text("SELECT * FROM activedb_dead_letters")).mappings().all()
        assert letter["reason"].startswith("UncertainOrder: query Q: "), letter["reason"]
        assert "on_uncertain" in letter["reason"] and "replay" in letter["reason"], letter["reason"]
        assert letter["raw"] == uncertain
        # Once the application decides, replaying the letter feeds the event again.
        decided = make(database, on_uncertain=lambda uncertainty: uncertainty.candidates[0])
        app = types.SimpleNamespace(mapping=mapping, known_types=None, prefetch=None)
        [replayed] = activedb.ingest.replay_dead_letters(database, app, [dict(letter)],
                                                          handler=lambda: composite.CompositeHandler(decided))
        assert replayed.query_id == "replay:pairs"
        assert [event["id"] for lists in decided.waiting().values() for events in lists["lists"].values()
                for event in events] == ["b0"]
    finally:
        database.close()


def test_an_event_whose_return_raises_in_one_query_is_composed_once_by_every_query_when_its_letter_is_replayed(
        make_database_url):
    """Two queries over one stream, the RETURN of one (``A.x / B.y``) raising on ``b0`` (y = 0): the event left that
    query's lists only and the other query composed it, so its dead letter could never be replayed to give each
    query the event once — replayed (corrected), it was refused as late (``LateEvent``: the other query's composition
    had relied on its absence), and the query whose RETURN raised never composed it; replayed into a fresh engine,
    the other query would take it a second time.  Now the batch is taken as if without the event (it leaves every
    list, as an uncertain order's candidate does), and the corrected letter replayed is composed by each query
    exactly once."""
    mapping, row, beats = RATIO_MAPPING, ratio_row, ratio_beats

    bad = row("B", 101.0, "P1", "b0", y=0)
    database = activedb.connect(make_database_url("ratios", migrations=()))
    try:
        engine = composite.CompositionEngine(database, name="ratios", clock=composite.ManualClock(), timeout=None)
        engine.create_stream("s", types=["A", "B"], attributes=["id", "k", "x", "y"])
        engine.define("CREATE QUERY R PATTERN SEQ(A, B) RETURN A.id AS a, B.id AS b, A.x / B.y AS r")
        engine.define("CREATE QUERY Q PATTERN SEQ(A, B) RETURN A.id AS a, B.id AS b")
        engine.join("P0", types=["A"])
        engine.join("P1", types=["B"])
        outcomes = feed(database, [[row("A", 100.0, "P0", "a0", x=1), bad, *beats(110.0)]], source="ratios",
                        mapping=mapping, handler=composite.CompositeHandler(engine))
        assert [(outcome.committed, outcome.events, outcome.dead_letters) for outcome in outcomes] == [(True, 0, 1)]
        with database.engine.connect() as connection:
            [letter] = connection.execute(sa.text("SELECT * FROM activedb_dead_letters")).mappings().all()
        assert letter["reason"].startswith("EventRejected: ") and "query R" in letter["reason"], letter["reason"]
        assert letter["raw"] == bad
        # Corrected (y = 2) and replayed: each query composes it once.
        corrected = dict(letter)
        corrected["raw"] = corrected["original"] = {**bad, "y": 2}
        app = types.SimpleNamespace(mapping=mapping, known_types=None, prefetch=None)
        [replayed] = activedb.ingest.replay_dead_letters(database, app, [corrected],
                                                          handler=lambda: composite.CompositeHandler(engine))
        assert replayed.outcome is activedb.ingest.ReplayResult.APPLIED, replayed
        assert sorted((item.query, item.payload()["a"], item.payload()["b"])
                      for item in engine.window().composites) == [("Q", "a0", "b0"), ("R", "a0", "b0")]
    finally:
        database.close()


def seq_engine(database, name):
    """An engine of ``SEQ(A, B)`` (query Q) over producers P0 (A) and P1 (B), without timeouts."""
    engine = composite.CompositionEngine(database, name=name, clock=composite.ManualClock(), timeout=None)
    engine.create_stream("s", types=["A", "B"], attributes=["id", "k"])
    engine.define("CREATE QUERY Q PATTERN SEQ(A, B) RETURN A.id AS a, B.id AS b")
    engine.join("P0", types=["A"])
    engine.join("P1", types=["B"])
    return engine


def test_a_mapping_with_an_event_id_column_is_refused_since_the_handler_reads_its_rows_itself(make_database_url):
    """``EventMapping(id_column=…)`` promises that an event whose id was already ingested, or comes twice in a
    batch, is a dead letter (``duplicate: …``).  The ingestion core checks the ids only of the rows it validates,
    and ``CompositeHandler`` reads its rows itself: the column was silently ignored — a row delivered twice reached
    the engine twice, the two copies were an uncertain order, and both left the lists as one ``UncertainOrder`` dead
    letter, so the event was lost and no pair composed.  Now the ingestion refuses the mapping, saying why and what
    to do, before any batch."""
    mapping = EventMapping("type", "k", "ts", producer_column="producer", accuracy_column="accuracy",
                           heartbeat_type="heartbeat", payload_columns=["id"], id_column="id")
    a0 = ratio_row("A", 100.0, "P0", "a0")
    database = activedb.connect(make_database_url("ids", migrations=()))
    try:
        engine = seq_engine(database, "ids")
        with pytest.raises(activedb.ingest.errors.IngestError,
                           match=r"id_column='id'.*composite.*reads the rows itself.*duplicate"):
            feed(database, [[a0, dict(a0), ratio_row("B", 101.0, "P1", "b0"), *ratio_beats(110.0)]],
                 source="ids", mapping=mapping, handler=composite.CompositeHandler(engine))
        with database.engine.connect() as connection:
            assert connection.execute(sa.text("SELECT count(*) FROM activedb_dead_letters")).scalar() == 0
        assert engine.statistics().events == 0
    finally:
        database.close()


def test_a_row_delivered_twice_in_a_batch_is_two_dead_letters_when_both_copies_are_refused(make_database_url):
    """Two equal rows of one producer (a source that sent one twice) are two equal events whose order is uncertain;
    without ``on_uncertain`` both are refused and leave the lists.  Each is a row of the batch, and each must be a dead
    letter at its own position — before, the letters were told apart by equality, so the second copy was dropped
    with no letter at all: a row of the batch neither applied nor a dead letter."""
    mapping = EventMapping("type", "k", "ts", producer_column="producer", accuracy_column="accuracy",
                           heartbeat_type="heartbeat", payload_columns=["id"])
    a0 = ratio_row("A", 100.0, "P0", "a0")
    database = activedb.connect(make_database_url("twice", migrations=()))
    try:
        engine = seq_engine(database, "twice")
        [outcome] = feed(database, [[a0, dict(a0), ratio_row("B", 101.0, "P1", "b0"), *ratio_beats(110.0)]],
                         source="twice", mapping=mapping, handler=composite.CompositeHandler(engine))
        assert (outcome.committed, outcome.events, outcome.dead_letters) == (True, 0, 2), outcome
        with database.engine.connect() as connection:
            letters = connection.execute(sa.text("SELECT raw, reason FROM activedb_dead_letters")).all()
        assert [raw for raw, _ in letters] == [a0, a0], letters
        assert all(reason.startswith("UncertainOrder: query Q: ") for _, reason in letters), letters
        # Each at its own row: the batch fed to an engine of its own, outside a transaction.
        batch = [a0, dict(a0), ratio_row("B", 101.0, "P1", "b0"), *ratio_beats(110.0)]
        result = feed_batch(seq_engine(None, "twice"), batch, mapping)
        assert sorted(rejected.position for rejected in result.rejected) == [0, 1], result.rejected
    finally:
        database.close()


def test_a_rule_that_raises_on_a_composite_makes_its_constituents_dead_letters_and_the_stream_goes_on(
        make_database_url):
    """A rule on a composite event that raises: ``tx.emit`` raised ``RuleFailed`` through ``CompositeHandler``, the
    whole batch failed, its abort returned the engine to its snapshot, and every delivery composed the same
    composite and failed the same way — the stream stopped for good.  Now the composite's emission is aborted alone
    (as the rule path aborts an event's subtransaction), its constituents' rows are dead letters carrying the
    rule's error, the rest of the batch commits, the next batch is applied, and feeding the same batches again
    applies nothing twice."""
    from tests.conftest import open_db
    from tests._tables import item_values

    mapping = EventMapping("type", "k", "ts", producer_column="producer", accuracy_column="accuracy",
                           heartbeat_type="heartbeat", payload_columns=["id"])
    a0, b0 = ratio_row("A", 100.0, "P0", "a0"), ratio_row("B", 101.0, "P1", "b0")
    a1, b1 = ratio_row("A", 102.0, "P0", "a1"), ratio_row("B", 103.0, "P1", "b1")
    a2, b2 = ratio_row("A", 111.0, "P0", "a2"), ratio_row("B", 112.0, "P1", "b2")
    batches = [[a0, b0, a1, b1, *ratio_beats(110.0)], [a2, b2, *ratio_beats(120.0)]]
    database = open_db(make_database_url("rulefails", migrations=()), {})
    try:
        engine = seq_engine(database, "rulefails")

        @database.rule(on=engine.spec("Q"), name="store_pair")
        def store(tx, event):
            if event.payload["a"] == "a0":
                raise ValueError("pair a0 refused by the application")
            tx.insert("items", key=f"{event.payload['a']}&{event.payload['b']}", value=1)

        outcomes = feed(database, batches, source="rulefails", mapping=mapping,
                        handler=composite.CompositeHandler(engine))
        assert [(outcome.committed, outcome.events, outcome.dead_letters) for outcome in outcomes] == \
            [(True, 1, 2), (True, 1, 0)], outcomes
        assert item_values(database) == {"a1&b1": 1, "a2&b2": 1}
        with database.engine.connect() as connection:
            letters = connection.execute(sa.text("SELECT raw, reason FROM activedb_dead_letters ORDER BY id")).all()
        assert [raw for raw, _ in letters] == [a0, b0], letters
        for _, reason in letters:
            assert reason.startswith("rejected by rule 'store_pair': ") and "a0 refused" in reason, reason
            assert "query Q" in reason, reason
        assert engine.statistics().waiting == 0                 # a0 and b0 were consumed by the failed composite
        # Exactly once: the same batches again apply nothing.
        again = feed(database, batches, source="rulefails", mapping=mapping,
                     handler=composite.CompositeHandler(engine))
        assert [outcome.committed for outcome in again] == [False, False], again
        assert item_values(database) == {"a1&b1": 1, "a2&b2": 1}
        with database.engine.connect() as connection:
            assert connection.execute(sa.text("SELECT count(*) FROM activedb_dead_letters")).scalar() == 2
    finally:
        database.close()


def test_an_ingestion_refuses_an_engine_whose_timeout_raises_and_with_exclude_the_stream_goes_on(make_database_url):
    """A producer silent past the engine's timeout under the default ``on_timeout=RAISE``: inside an ingestion
    ``ProducerTimeout`` failed the batch, and every delivery raised again (the clock had only moved on) — the stream
    stopped for good.  Now the ingestion refuses such an engine before any batch, saying which ``on_timeout`` to
    choose; with ``'exclude'`` the silent producer is excluded, its later row is a dead letter saying so, the
    stream goes on, and feeding the same batches again applies nothing twice."""
    mapping = EventMapping("type", "k", "ts", producer_column="producer", accuracy_column="accuracy",
                           heartbeat_type="heartbeat", payload_columns=["id"])
    b1 = ratio_row("B", 122.0, "P1", "b1")

    def engine_on(database, name, **options):
        engine = composite.CompositionEngine(database, name=name, clock=composite.ManualClock(), timeout=5,
                                             **options)
        engine.create_stream("s", types=["A", "B"], attributes=["id", "k"])
        engine.define("CREATE QUERY Q PATTERN SEQ(A, B) RETURN A.id AS a, B.id AS b")
        engine.join("P0", types=["A", "B"])
        engine.join("P1", types=["B"])
        return engine

    def batches(engine):
        """Three batches; P1 falls silent after the first, for longer than the timeout."""
        yield [ratio_row("A", 100.0, "P0", "a0"), ratio_row("B", 101.0, "P1", "b0"), *ratio_beats(110.0)]
        engine.clock.advance(10.0)
        # (a1, bx) waits for P1's sync-point to pass it: no B of P1 may come before bx.
        yield [ratio_row("A", 111.0, "P0", "a1"), ratio_row("B", 112.0, "P0", "bx"), ratio_row("heartbeat", 120.0, "P0")]
        yield [b1, ratio_row("A", 123.0, "P0", "a2")]

    database = activedb.connect(make_database_url("timeout", migrations=()))
    try:
        raising = engine_on(database, "raising")
        with pytest.raises(activedb.ingest.errors.IngestError, match=r"on_timeout='exclude'.*timeout=None"):
            feed(database, batches(raising), source="raising", mapping=mapping,
                 handler=composite.CompositeHandler(raising))
        with database.engine.connect() as connection:
            assert connection.execute(sa.text("SELECT count(*) FROM activedb_ingestion_ledger")).scalar() == 0
        engine = engine_on(database, "excluding", on_timeout="exclude")
        outcomes = feed(database, batches(engine), source="excluding", mapping=mapping,
                        handler=composite.CompositeHandler(engine))
        assert [(outcome.committed, outcome.events, outcome.dead_letters) for outcome in outcomes] == \
            [(True, 1, 0), (True, 0, 0), (True, 1, 1)], outcomes      # (a1, bx): once P1 was excluded
        assert engine.producers()["P1"].state == "left"
        with database.engine.connect() as connection:
            [(raw, reason)] = connection.execute(sa.text("SELECT raw, reason FROM activedb_dead_letters")).all()
        assert raw == b1 and "P1" in reason and "excluded" in reason, reason
        again = feed(database, batches(engine_on(database, "again", on_timeout="exclude")), source="excluding",
                     mapping=mapping, handler=composite.CompositeHandler(engine))
        assert [outcome.committed for outcome in again] == [False, False, False], again
    finally:
        database.close()
