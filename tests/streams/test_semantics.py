"""Pattern semantics and rule actions: selection, negation, window, partitions, the
composite timestamp, UPDATE/INSERT/DELETE/Python actions, WHEN, s-atomicity, and the
access plan (Active CEP Algorithm 1) a locking scheduler will use."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from activedb import streams
from activedb.streams.errors import UndeclaredAccess
from activedb.testing import check_stream_history
from tests.streams.conftest import BADGE_TYPES, Q1_R1, badge, set_status, statuses


def make(db, text: str = "", *, name="semantics", **options) -> streams.StreamEngine:
    engine = streams.StreamEngine(db, name=name, record_history=True, durable=False, **options)
    engine.create_stream("s", types=("A", "B", "C", "N"), attributes=("k", "x"))
    if text:
        engine.define(text)
    return engine


def ev(event_type, ts, k="k1", x=0):
    return streams.StreamEvent(event_type, ts, {"k": k, "x": x})


def outputs(result):
    return [(output.query, output.ts, tuple(event.ts for event in output.constituents)) for output in result.outputs]


SEQ_ABC = "CREATE QUERY P PATTERN SEQ(A, B, C) WHERE [k] WITHIN 10 sec {matching} RETURN C.k"


@pytest.mark.parametrize("matching, expected", [
    # A1 A2 B3 C4 C5: any-match: one output per C, from the most recent A and B;
    ("", [("P", 4, (2, 3, 4)), ("P", 5, (2, 3, 5))]),
    # next-match: a run per A; each binds the next B and the next C, and ends with its output.
    ("MATCHING SKIP TILL NEXT MATCH", [("P", 4, (1, 3, 4)), ("P", 4, (2, 3, 4))]),
])
def test_selection_semantics(db, matching, expected):
    engine = make(db, SEQ_ABC.format(matching=matching))
    result = engine.feed([ev("A", 1), ev("A", 2), ev("B", 3), ev("C", 4), ev("C", 5)],
                         punctuation=streams.END_OF_STREAM)
    assert outputs(result) == expected


def test_negation_window_and_partitions(db):
    engine = make(db, "CREATE QUERY P PATTERN SEQ(A, !N, C) WHERE [k] AND N.x = A.x WITHIN 10 sec RETURN C.k, A.x")
    result = engine.feed([
        ev("A", 1, "k1", 7), ev("N", 2, "k1", 8),          # N of another x: does not kill
        ev("A", 3, "k2", 1), ev("N", 4, "k2", 1),          # kills k2's A^3
        ev("C", 5, "k1"), ev("C", 6, "k2"),
        ev("A", 10, "k3"), ev("C", 21, "k3"),              # 11 s apart: outside the window
        ev("C", 11, "k1"),                                 # 10 s after A^1: inside (span <= window)
    ], punctuation=streams.END_OF_STREAM)
    assert [(output.ts, output["k"], output["x"]) for output in result.outputs] == [(5, "k1", 7), (11, "k1", 7)]


def test_events_without_the_partition_attribute_share_the_partition_of_none_unless_the_query_refuses_them(db):
    """The streams design note: an event whose ``[attr]`` attribute is None is in the partition of None (as SQL's
    ``PARTITION BY`` puts NULLs together), so such events match each other; ``IS NOT NULL`` terms keep them out."""
    events = [ev("A", 1, None), ev("B", 2, None), ev("C", 3, None), ev("A", 4, "k1"), ev("B", 5, "k1"), ev("C", 6, "k1")]
    together = make(db, SEQ_ABC.format(matching=""), name="partition_of_none")
    assert outputs(together.feed(events, punctuation=streams.END_OF_STREAM)) == [("P", 3, (1, 2, 3)), ("P", 6, (4, 5, 6))]
    refused = make(db, "CREATE QUERY P PATTERN SEQ(A, B, C) WHERE [k] AND A.k IS NOT NULL AND B.k IS NOT NULL AND "
                       "C.k IS NOT NULL WITHIN 10 sec RETURN C.k", name="partition_of_none_refused")
    assert outputs(refused.feed(events, punctuation=streams.END_OF_STREAM)) == [("P", 6, (4, 5, 6))]


def test_values_compare_as_python_compares_them_and_an_unorderable_pair_is_the_event_s_dead_letter(db):
    """The streams design note, choice 10: a boolean compares as a number (TRUE = 1), and a text against a number is
    an error of that event — a dead letter — while the stream goes on."""
    engine = make(db, "CREATE QUERY P PATTERN SEQ(A, C) WHERE [k] AND A.x > 0 WITHIN 10 sec RETURN C.k",
                  name="python_comparisons")
    result = engine.feed([ev("A", 1, "k1", True), ev("C", 2, "k1"), ev("A", 3, "k2", "text"), ev("C", 4, "k2")],
                         punctuation=streams.END_OF_STREAM)
    assert outputs(result) == [("P", 2, (1, 2))]
    assert [letter.event.ts for letter in result.dead_letters] == [3]
    assert "cannot compare" in result.dead_letters[0].reason


def test_composite_timestamp_is_the_maximum(db):
    engine = make(db, "CREATE QUERY P PATTERN SEQ(A, B) RETURN A.x AS first, B.x AS last")
    (output,) = engine.feed([ev("A", 1.5, x=1), ev("B", 2.25, x=2)], punctuation=streams.END_OF_STREAM).outputs
    assert output.ts == 2.25 and dict(output.attributes) == {"first": 1, "last": 2}


def test_store_predicates_read_at_the_accepting_event(db):
    """A WHERE term on the store is a Read at the accepting event's time, for every
    accepting event (also when no sequence precedes it)."""
    set_status(db, k1="on")
    engine = make(db, "CREATE QUERY P PATTERN SEQ(A, C) WHERE [k] AND "
                      "(SELECT status FROM workerstatus WHERE workerid = C.k) = 'on' RETURN C.k")
    engine.feed([ev("C", 1), ev("A", 2), ev("B", 3), ev("C", 4)], punctuation=streams.END_OF_STREAM)
    assert [(op.ts, op.origin) for op in engine.history.snapshot() if op.kind == "read"] == [(1, "P"), (4, "P")]


def test_actions_update_insert_delete_and_when(db):
    set_status(db, k1="safe", k2="safe", k9="gone")
    engine = make(db, """
        CREATE QUERY P PATTERN SEQ(A, C) WHERE [k] RETURN C.k, C.x, A.x AS ax;
        CREATE RULE Mark ON OUTPUT P WHEN NEW.x > 10 PRIORITY 2
            BEGIN UPDATE workerStatus SET status = 'hot' WHERE workerID = NEW.k END;
        CREATE RULE Log ON OUTPUT P PRIORITY 1
            BEGIN
              INSERT INTO stream_alerts (worker, location, at) VALUES (NEW.k, 'seen', NEW.x + NEW.ax);
              DELETE FROM workerStatus WHERE workerID = 'k9'
            END
        CREATE RULE Missing ON OUTPUT P BEGIN UPDATE workerStatus SET status = 'x' WHERE workerID = 'nobody' END
    """)
    engine.feed([ev("A", 1, "k1", 1), ev("C", 2, "k1", 50), ev("A", 3, "k2", 1), ev("C", 4, "k2", 5)],
                punctuation=streams.END_OF_STREAM)
    assert statuses(db) == {"k1": "hot", "k2": "safe"}          # WHEN held only for k1; k9 deleted; no 'nobody'
    with db.engine.connect() as connection:
        rows = connection.execute(sa.text("SELECT worker, location, at FROM stream_alerts ORDER BY id")).all()
    assert [tuple(row) for row in rows] == [("k1", "seen", 51.0), ("k2", "seen", 6.0)]
    check_stream_history(engine.history.snapshot()).assert_ok()


def test_update_can_use_the_row(db):
    with db.engine.begin() as connection:
        connection.execute(sa.text("INSERT INTO stream_cells (cell, value) VALUES (1, 10)"))
    engine = make(db, """CREATE QUERY P PATTERN SEQ(C) RETURN C.x;
                         CREATE RULE Add ON OUTPUT P BEGIN UPDATE stream_cells SET value = value + NEW.x WHERE cell = 1 END""")
    engine.feed([ev("C", 1, x=5), ev("C", 2, x=7)], punctuation=streams.END_OF_STREAM)
    with db.engine.connect() as connection:
        assert connection.execute(sa.text("SELECT value FROM stream_cells WHERE cell = 1")).scalar() == 22


def test_python_actions_declare_their_tables(db):
    engine = make(db, "CREATE QUERY P PATTERN SEQ(C) RETURN C.k, C.x")

    @engine.on_output("P", writes=["stream_cells"])
    def count(tx, new):
        row = tx.read("stream_cells", new["x"])
        tx.write("stream_cells", new["x"], value=(row or {}).get("value", 0) + 1, note=str(tx.ts))

    engine.rule("Sneaky", on_output="P", action=lambda tx, new: tx.write("workerstatus", "k", status="x"),
                writes=["stream_cells"], when=streams.NEW["x"] == 99)
    result = engine.feed([ev("C", 1, x=3), ev("C", 2, x=3), ev("C", 3, x=99)], punctuation=streams.END_OF_STREAM)
    with db.engine.connect() as connection:
        assert connection.execute(sa.text("SELECT value, note FROM stream_cells WHERE cell = 3")).one() == (2, "2")
    (letter,) = result.dead_letters                               # C^3: Sneaky wrote an undeclared table
    assert letter.event.ts == 3
    assert "UndeclaredAccess: rule Sneaky writes table 'workerstatus', which it did not declare" in letter.reason
    assert issubclass(UndeclaredAccess, streams.errors.StreamError)


def test_a_failing_rule_aborts_only_its_s_transaction(db):
    """s-atomic: the failed event changes neither the store nor the matcher; it is a dead letter."""
    set_status(db, k1="safe")
    engine = make(db, """CREATE QUERY P PATTERN SEQ(A, C) WHERE [k] RETURN C.k, C.x;
                         CREATE RULE Warn ON OUTPUT P PRIORITY 2
                           BEGIN UPDATE workerStatus SET status = 'warning' WHERE workerID = NEW.k END""")

    def explode(tx, new):
        if new["x"] == 13:
            raise RuntimeError("unlucky")
    engine.rule("Explode", on_output="P", action=explode, priority=1)
    result = engine.feed([ev("A", 1), ev("C", 2, x=13), ev("C", 3, x=1)], punctuation=streams.END_OF_STREAM)
    assert [letter.event.ts for letter in result.dead_letters] == [2]
    assert "rule Explode raised RuntimeError: unlucky" in result.dead_letters[0].reason
    assert [output.ts for output in result.outputs] == [3]       # C^3 still matches A^1: C^2 left no trace
    assert statuses(db) == {"k1": "warning"}
    statistics = engine.statistics()
    assert (statistics.events_failed, statistics.events_processed, statistics.dead_letters) == (1, 2, 1)
    with db.engine.connect() as connection:
        assert connection.execute(sa.text("SELECT count(*) FROM activedb_dead_letters")).scalar() == 1
    check_stream_history(engine.history.snapshot()).assert_ok()


def test_access_plan_is_algorithm_1(db):
    engine = streams.StreamEngine(db, name="plan", durable=False)
    engine.create_stream("estream", types=BADGE_TYPES, attributes=("HCW-ID", "location"))
    engine.define(Q1_R1)
    engine.rule("Opaque", on_output="Q1", action=lambda tx, new: None)
    enter = badge("ENTER", 10, "w7")
    plan = engine.access_plan(enter)
    key = streams.Resource("workerstatus", ("w7",))
    assert plan.reads == {key} and plan.writes == {key} and plan.opaque
    assert engine.access_plan(badge("SANITIZE", 3, "w7")) == streams.AccessPlan(frozenset(), frozenset())
    # A key the definitions cannot derive from the event is the whole table.
    engine.define("CREATE QUERY Q3 PATTERN SEQ(EXIT) RETURN EXIT.location AS room;"
                  "CREATE RULE R3 ON OUTPUT Q3 BEGIN UPDATE workerStatus SET status = 'x' WHERE workerID = NEW.room END")
    assert streams.Resource("workerstatus", ("room1",)) in engine.access_plan(badge("EXIT", 1)).writes


def test_metrics_keep_application_and_system_time_apart(db):
    set_status(db, w1="safe")
    engine = streams.StreamEngine(db, name="metrics", durable=False)
    engine.create_stream("estream", types=BADGE_TYPES, attributes=("HCW-ID", "location"))
    engine.define(Q1_R1)
    # Application times far in the future: latencies must not see them.
    result = engine.feed([badge("EXIT", 1e9, location="a"), badge("ENTER", 1e9 + 5, location="b")],
                         punctuation=streams.END_OF_STREAM)
    assert len(result.outputs) == 1
    statistics = engine.statistics()
    assert statistics.outputs == 1 and statistics.rule_instances == 1
    assert 0 <= statistics.l_query < 60 and 0 <= statistics.l_rule < 60
    assert statistics.l_combined == pytest.approx(statistics.l_query + statistics.l_rule)
    assert statistics.throughput > 0 and statistics.processing_seconds > 0
    assert statistics.per_query["Q1"].outputs == 1


@pytest.mark.parametrize("scheduler", ["sei", "lwm"])
def test_a_query_that_cannot_be_evaluated_on_an_event_names_itself_in_the_dead_letter(db, scheduler):
    """An event several queries consume, one of whose conditions cannot be evaluated on it (``A.x / C.x`` with
    C.x = 0; a scalar subquery finding two rows), is a dead letter (choice 10).  Its reason was the expression's
    error alone — "s-transaction of C^2 aborted: EvaluationError: cannot compute 1 / 0: division by zero" — naming
    no query, where a failing rule's names the rule; the application could not tell which definition to correct."""
    set_status(db, k1="safe")
    engine = make(db, """CREATE QUERY Fine PATTERN SEQ(A, C) WHERE [k] RETURN C.k;
                         CREATE QUERY Ratio PATTERN SEQ(A, C) WHERE [k] AND A.x / C.x > 0 RETURN C.k""",
                  scheduler=scheduler)
    result = engine.feed([ev("A", 1, x=1), ev("C", 2, x=0), ev("C", 3, x=1)], punctuation=streams.END_OF_STREAM)
    assert [letter.event.ts for letter in result.dead_letters] == [2]
    reason = result.dead_letters[0].reason
    assert "query Ratio cannot be evaluated on C^2: cannot compute 1 / 0" in reason, reason
    assert "correct the event or the query" in reason, reason
    assert outputs(result) == [("Fine", 3, (1, 3)), ("Ratio", 3, (1, 3))]


def test_a_rule_whose_expression_cannot_be_computed_names_itself_in_the_dead_letter(db):
    """A text rule whose SET (or WHEN) cannot be computed on an output aborts its s-transaction, the event a dead
    letter.  The reason was the expression's error alone (a Python action's failure names its rule), so with several
    rules on a query the application could not tell which to correct."""
    engine = make(db, """CREATE QUERY P PATTERN SEQ(A, C) WHERE [k] RETURN C.k, C.x;
                         CREATE RULE Fine ON OUTPUT P INSERT INTO stream_alerts (worker) VALUES (NEW.k);
                         CREATE RULE Ratio ON OUTPUT P WHEN 1 / NEW.x > 0
                           INSERT INTO stream_alerts (worker, at) VALUES (NEW.k, NEW.x)""")
    result = engine.feed([ev("A", 1), ev("C", 2, x=0), ev("C", 3, x=1)], punctuation=streams.END_OF_STREAM)
    assert [letter.event.ts for letter in result.dead_letters] == [2]
    reason = result.dead_letters[0].reason
    assert "rule Ratio cannot be evaluated on the output P^2: cannot compute 1 / 0" in reason, reason
    assert [output.ts for output in result.outputs] == [3]
