"""Mistakes a user of ``activedb.streams`` can make — in a definition's text, a builder's arguments, an engine's or a
scheduler's options, an ingestion's handler, or a call in the wrong state — are refused with the error class of the
layer and a message that says what to do instead."""

from __future__ import annotations

import copy
import json
import threading

import pytest
import sqlalchemy as sa

from activedb import composite, streams
from activedb.ingest import EventMapping, feed
from activedb.ingest.errors import IngestError
from activedb.streams import algebra as ast
from activedb.streams.errors import (
    DefinitionError,
    SchedulerError,
    StreamError,
    StreamStateError,
)
from tests.conftest import open_db
from tests.streams.conftest import BADGE_TYPES, badge

MAPPING = EventMapping("type", "HCW-ID", "ts", payload_columns=["location"])
Q = "CREATE QUERY Q ON estream PATTERN SEQ(EXIT, ENTER) WHERE [HCW-ID] RETURN ENTER.HCW-ID, ENTER.location\n"


def engine_for(db, name="definition_errors", **options) -> streams.StreamEngine:
    engine = streams.StreamEngine(db, name=name, durable=False, **options)
    engine.create_stream("estream", types=BADGE_TYPES, attributes=("HCW-ID", "location"))
    return engine


def query_text(pattern="SEQ(EXIT, ENTER)", where="[HCW-ID]", returns="ENTER.HCW-ID") -> str:
    return f"CREATE QUERY Q ON estream PATTERN {pattern} WHERE {where} RETURN {returns}"


def rule_text(*actions: str) -> str:
    return Q + "CREATE RULE R ON OUTPUT Q\nBEGIN\n" + "\n".join(actions) + "\nEND"


# --- the textual language ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, match", [
    (query_text(pattern="SEQ(EXIT, ENTER, EXIT)"), (r"EXIT appears twice in the pattern; give each occurrence its own "
                                                   r"alias \(SEQ\(EXIT a, …, EXIT b\)\)")),
    (query_text(pattern="SEQ(EXIT, !SANITIZE, !MASK, ENTER)", where="SANITIZE.location = MASK.location"),
     r"one WHERE term may mention only one negative event"),
    (query_text(pattern="SEQ(EXIT, !SANITIZE, ENTER)",
                where="'safe' = (SELECT status FROM workerStatus WHERE workerID = SANITIZE.HCW-ID)"),
     r"a WHERE term on a negative event cannot read the store"),
    (query_text(pattern="SEQ(EXIT, !SANITIZE, ENTER, MASK)", where="SANITIZE.location = MASK.location"),
     r"a term on !SANITIZE may mention only the events up to the positive event right after it, not MASK"),
    (query_text(returns="ENTER.location, EXIT.location"), r"RETURN names 'location' twice; rename one with AS"),
    (query_text(where="NOT [HCW-ID]"),
     r"\[HCW-ID\] \(the equivalence test\) is only allowed as a top-level AND term of a query's WHERE"),
    (query_text(where="[HCW-ID] OR ENTER.location = 'a'"), r"only allowed as a top-level AND term"),
    (query_text(where="'safe' = (SELECT status FROM workerStatus WHERE workerID = ENTER.HCW-ID "
                      "AND workerid = EXIT.HCW-ID)"),
     r"column workerid appears twice in the subquery's WHERE"),
    (query_text(where="'safe' = (SELECT status FROM workerStatus WHERE workerID = "
                      "(SELECT status FROM workerStatus WHERE workerID = ENTER.HCW-ID))"),
     r"nested subqueries are not supported; use a Python action"),
    (rule_text("INSERT INTO stream_alerts VALUES (NEW.HCW-ID)"),
     r"INSERT INTO stream_alerts gives 1 values for 4 columns; name the columns"),
    (rule_text("INSERT INTO stream_alerts (location) VALUES (NEW.location)"),
     r"INSERT INTO stream_alerts must give worker \(NOT NULL without a default\)"),
    (rule_text("UPDATE workerStatus SET status = 'x' WHERE workerID = NEW.HCW-ID AND workerid = NEW.location"),
     r"key column workerid appears twice"),
    (rule_text("UPDATE workerStatus SET workerID = 'w9' WHERE workerID = NEW.HCW-ID"),
     r"UPDATE cannot change the key column workerID"),
    (Q + Q.replace("QUERY Q ", "QUERY q "), r"query q is already defined; give the new one another name"),
], ids=["alias-twice", "two-negatives-in-a-term", "negative-reads-store", "negative-term-too-late",
        "return-name-twice", "equivalence-under-not", "equivalence-under-or", "subquery-column-twice",
        "nested-subquery", "insert-values-without-columns", "insert-misses-not-null", "update-key-twice",
        "update-sets-key", "query-defined-twice"])
def test_a_definition_text_with_a_mistake_is_refused_with_what_to_do(db, text, match):
    engine = engine_for(db)
    with pytest.raises(DefinitionError, match=match) as caught:
        engine.define(text)
    assert caught.value.line is not None           # the text's errors point into the text
    assert (engine.queries, engine.rules) == ({}, {})       # all of the text, or none of it


def test_a_query_without_on_names_its_stream_when_the_engine_has_several(db):
    engine = engine_for(db)
    engine.create_stream("other", types=["PING"], attributes=("HCW-ID",))
    with pytest.raises(DefinitionError, match=r"query Q: name its stream with ON <stream> \(the engine has 2 streams: "
                                              r"estream, other\)"):
        engine.define("CREATE QUERY Q PATTERN SEQ(EXIT, ENTER) RETURN ENTER.HCW-ID")
    assert engine.queries == {}


def test_a_query_on_an_engine_without_streams_says_to_declare_one(db):
    engine = streams.StreamEngine(db, name="no_streams", durable=False)
    with pytest.raises(DefinitionError, match=r"name its stream with ON <stream> \(the engine has 0 streams: none — "
                                              r"declare one first\)"):
        engine.define("CREATE QUERY Q PATTERN SEQ(EXIT, ENTER) RETURN ENTER.HCW-ID")


def test_a_negative_event_in_and_is_refused_by_the_composition_engine():
    composer = composite.CompositionEngine(timeout=None)
    composer.create_stream("s", types=["A", "B", "C"], attributes=("x",))
    with pytest.raises(DefinitionError, match=r"AND\(…\) has no place for a negative event \(!B\): negation means "
                                              r"'not between two events', which only SEQ has"):
        composer.define("CREATE QUERY Q PATTERN AND(A, !B, C) RETURN A.x")


def test_an_event_type_declared_twice_is_refused(db):
    engine = streams.StreamEngine(db, name="types_twice", durable=False)
    with pytest.raises(DefinitionError, match=r"stream estream: event type 'exit' is declared twice"):
        engine.create_stream("estream", types=["EXIT", "ENTER", "exit"])
    assert engine.streams == {}


@pytest.fixture
def keyless_table(db):
    with db.engine.begin() as connection:
        connection.execute(sa.text("CREATE TABLE stream_keyless (worker text, note text)"))
    yield "stream_keyless"
    with db.engine.begin() as connection:
        connection.execute(sa.text("DROP TABLE stream_keyless"))


def test_a_table_without_a_primary_key_is_refused_at_definition_time(db, keyless_table):
    engine = engine_for(db)
    with pytest.raises(DefinitionError, match=r"table 'stream_keyless' has no primary key; the store addresses rows "
                                              r"by key"):
        engine.define(rule_text("INSERT INTO stream_keyless (worker) VALUES (NEW.HCW-ID)"))
    assert (engine.queries, engine.rules) == ({}, {})


# --- the Python builders -------------------------------------------------------------------------------------------

ENTER, EXIT = streams.event("ENTER"), streams.event("EXIT")


@pytest.mark.parametrize("build, match", [
    (lambda: streams.lit("w1") == EXIT, r"event\('EXIT'\) is an event; name one of its attributes \(EXIT\['attribute'\]\)"),
    (lambda: streams.store("workerStatus", "status", workerID=ENTER), r"event\('ENTER'\) is an event; name one of"),
], ids=["compared", "subquery-condition"])
def test_an_event_where_an_attribute_belongs_is_refused(build, match):
    with pytest.raises(DefinitionError, match=match):
        build()


def test_an_event_reference_has_no_special_methods_but_its_attributes():
    """``EXIT.location`` names an attribute; a protocol's special name does not (copy and hasattr see none)."""
    assert not hasattr(EXIT, "__deepcopy_hook__")
    assert copy.deepcopy(EXIT).alias == "EXIT"
    assert repr(EXIT.location) == repr(EXIT["location"])


@pytest.mark.parametrize("options, match", [
    ({"returns": [ENTER["HCW-ID"], ENTER.location + 1]}, (r"name the returned expression .*: returns=\{'name': "
                                                         r"expression\}")),
    ({"returns": [streams.lit("alert")]}, r"name the returned expression Literal"),
    ({"pattern": ["EXIT", "ENTER"]}, r"query Q: pattern must be seq\(…\) or an event type, got \['EXIT', 'ENTER'\]"),
    ({"pattern": 5}, r"query Q: pattern must be seq\(…\) or an event type, got 5"),
    ({"pattern": streams.seq()}, r"query Q: SEQ\(\) needs at least one event"),
    ({"pattern": ast.Pattern()}, r"query Q: only SEQ and AND patterns are supported"),
], ids=["unnamed-expression", "unnamed-literal", "pattern-list", "pattern-number", "empty-seq", "bare-pattern"])
def test_a_python_query_with_a_wrong_argument_is_refused(db, options, match):
    engine = engine_for(db)
    arguments = {"pattern": streams.seq("EXIT", "ENTER"), "returns": [ENTER["HCW-ID"]], **options}
    with pytest.raises(DefinitionError, match=match):
        engine.query("Q", **arguments)
    assert engine.queries == {}


@pytest.mark.parametrize("action, match", [
    ("UPDATE workerStatus SET status = 'warning'", (r"rule R: an action is update\(…\), insert\(…\), delete\(…\) or a "
                                                   r"callable \(tx, new\), got \"UPDATE workerStatus")),
    ([streams.delete("workerStatus", workerID=streams.NEW["HCW-ID"]), 5], r"an action is update\(…\).*got 5"),
    (ast.CallAction(5), r"rule R: action 5 is not callable; it is called as function\(tx, new\)"),
    (streams.update("workerStatus", set={"status": "x"},
                    where={"workerID": streams.NEW["HCW-ID"], "WORKERID": streams.NEW.location}),
     r"rule R: key column WORKERID appears twice"),
    (streams.update("workerStatus", set={"workerID": "w9"}, where={"workerID": streams.NEW["HCW-ID"]}),
     r"UPDATE cannot change the key column workerID"),
], ids=["text", "number-in-list", "not-callable", "key-twice", "sets-key"])
def test_a_python_rule_with_a_wrong_action_is_refused(db, action, match):
    engine = engine_for(db)
    engine.define(Q)
    with pytest.raises(DefinitionError, match=match):
        engine.rule("R", on_output="Q", action=action)
    assert engine.rules == {}


# --- engines and schedulers ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("options, error, match", [
    ({"name": ""}, StreamError, r"a StreamEngine needs a non-empty name \(it keys the engine's saved state\)"),
    ({"name": "   "}, StreamError, r"needs a non-empty name"),
    ({"name": None}, StreamError, r"needs a non-empty name"),
    ({"scheduler": "fifo"}, StreamError, (r"unknown scheduler 'fifo': use one of sei, s2pl, lwm \(SchedulerKind\), or "
                                         r"pass a Scheduler instance$")),
    ({"scheduler": streams.S2PLScheduler}, StreamError, (r"scheduler=S2PLScheduler is a Scheduler class: pass an "
                                                         r"instance, S2PLScheduler\(\) \(with its options\)")),
], ids=["empty-name", "blank-name", "no-name", "unknown-scheduler", "scheduler-class"])
def test_an_engine_with_a_wrong_option_is_refused(db, options, error, match):
    with pytest.raises(error, match=match):
        streams.StreamEngine(db, **{"name": "options", "durable": False, **options})


@pytest.mark.parametrize("scheduler, options, match", [
    (streams.S2PLScheduler, {"granularity": "row"}, (r"granularity 'row': use Granularity.TUPLE \('tuple'\) or "
                                                     r"Granularity.TABLE \('table'\)")),
    (streams.LWMScheduler, {"granularity": None}, r"granularity None: use Granularity.TUPLE"),
    (streams.S2PLScheduler, {"workers": 0}, r"workers=0: give a positive number of s-transactions to run at once"),
    (streams.LWMScheduler, {"workers": "8"}, r"workers='8': give a positive number"),
], ids=["s2pl-row", "lwm-none", "s2pl-zero-workers", "lwm-text-workers"])
def test_a_scheduler_with_a_wrong_option_is_refused(scheduler, options, match):
    with pytest.raises(SchedulerError, match=match):
        scheduler(**options)


def test_a_batch_on_an_engine_without_a_stream_says_to_declare_one(db):
    engine = streams.StreamEngine(db, name="streamless", durable=False)
    with pytest.raises(StreamStateError, match=r"engine streamless has no stream; declare one with "
                                               r"engine.create_stream\(\)"):
        engine.feed([])
    engine.create_stream("estream", types=BADGE_TYPES, attributes=("HCW-ID", "location"))
    assert engine.feed([badge("EXIT", 1)]).buffered == 1      # the refused batch left nothing behind


def test_a_batch_while_another_transaction_holds_one_says_to_finish_that_first(db):
    engine = engine_for(db)
    with db.transaction() as first:
        engine.process(first, [badge("EXIT", 1)])
        still_active = (rf"engine definition_errors has a batch in transaction {first.id} that is still active; "
                        rf"commit or abort it before the next batch")
        with db.transaction() as second, pytest.raises(StreamStateError, match=still_active):
            engine.process(second, [badge("EXIT", 2)])
    assert engine.feed([]).buffered == 1


def test_reset_state_during_a_batch_says_to_finish_it_first(db):
    engine = engine_for(db)
    with db.transaction() as tx:
        engine.process(tx, [badge("EXIT", 1)])
        with pytest.raises(StreamStateError, match=r"engine definition_errors has a batch in progress; finish it "
                                                   r"first"):
            engine.reset_state()
    assert [(event.type, event.ts) for event in engine.buffered()] == [("EXIT", 1)]     # the batch committed
    engine.reset_state()
    assert engine.buffered() == []


def test_a_second_batch_from_another_thread_while_one_runs_is_refused(db):
    engine = engine_for(db)
    engine.define(Q)
    refused: list[BaseException] = []

    def from_another_thread(tx, new):
        def other():
            try:
                engine.process(tx, [])
            except StreamError as error:      # (kept for the assertion below)
                refused.append(error)
        thread = threading.Thread(target=other)
        thread.start()
        thread.join()

    engine.rule("R", on_output="Q", action=from_another_thread)
    result = engine.feed([badge("EXIT", 1), badge("ENTER", 2)], punctuation=streams.END_OF_STREAM)
    assert len(result.outputs) == 1 and not result.dead_letters
    assert len(refused) == 1 and isinstance(refused[0], StreamStateError)
    assert str(refused[0]) == ("engine definition_errors is already processing a batch in another thread; batches of "
                               "one engine run one at a time")


def test_a_batch_started_by_the_engine_s_own_rule_action_is_refused_without_blaming_another_thread(db):
    engine = engine_for(db)
    engine.define(Q)
    engine.rule("R", on_output="Q", action=lambda tx, new: engine.feed([]))
    result = engine.feed([badge("EXIT", 1), badge("ENTER", 2)], punctuation=streams.END_OF_STREAM)
    (letter,) = result.dead_letters
    assert "StreamStateError: engine definition_errors is already processing a batch" in letter.reason
    assert "another thread" not in letter.reason
    assert "in this thread" in letter.reason and "feed those events after this batch returns" in letter.reason


def test_a_saved_buffered_event_of_a_stream_no_longer_declared_is_refused(db):
    before = streams.StreamEngine(db, name="renamed_stream")
    before.create_stream("estream", types=BADGE_TYPES, attributes=("HCW-ID", "location"))
    assert before.feed([badge("EXIT", 5)], punctuation=1).buffered == 1
    after = streams.StreamEngine(db, name="renamed_stream")
    after.create_stream("badges", types=BADGE_TYPES, attributes=("HCW-ID", "location"))
    with pytest.raises(StreamStateError, match=r"engine renamed_stream: a buffered event belongs to stream 'estream', "
                                               r"which is not declared; declare it before the first batch"):
        after.feed([])


@pytest.mark.parametrize("kind, corrupt, words", [
    ("meta", lambda value: [], "[] is not an object"),
    ("meta", lambda value: {**value, "released": "soon"}, "'soon' is not a punctuation"),
    ("meta", lambda value: {**value, "time_kind": 5}, "5 is not text"),
    ("buffer", lambda value: {**value, "arrivals": 7}, "7 is not a list"),
], ids=["meta-not-an-object", "released-not-a-punctuation", "time-kind-not-text", "arrivals-not-a-list"])
def test_a_malformed_saved_state_row_is_named_with_how_to_start_over(db, kind, corrupt, words):
    before = streams.StreamEngine(db, name="malformed")
    before.create_stream("estream", types=BADGE_TYPES, attributes=("HCW-ID", "location"))
    before.feed([badge("EXIT", 5)], punctuation=1)
    with db.engine.begin() as connection:
        item, value = connection.execute(sa.text("SELECT item, value FROM activedb_stream_state "
                                                 "WHERE engine = 'malformed' AND kind = :kind"), {"kind": kind}).one()
        connection.execute(sa.text("UPDATE activedb_stream_state SET value = CAST(:value AS json) "
                                   "WHERE engine = 'malformed' AND kind = :kind"),
                           {"kind": kind, "value": json.dumps(corrupt(value))})
    after = streams.StreamEngine(db, name="malformed")
    after.create_stream("estream", types=BADGE_TYPES, attributes=("HCW-ID", "location"))
    with pytest.raises(StreamStateError, match=r"call engine.reset_state\(\) to start the engine over") as caught:
        after.feed([])
    assert f"saved state row (kind {kind!r}, item {item!r})" in str(caught.value)
    assert f"(TypeError: {words}); nothing was loaded or changed" in str(caught.value)
    after.reset_state()
    assert after.feed([badge("EXIT", 6)]).buffered == 1


# --- the queries path of an ingestion ------------------------------------------------------------------------------

def ingestible(db, name="ingested", **options) -> streams.StreamEngine:
    return engine_for(db, name=name, record_dead_letters=False, **options)


def _rows() -> list[dict]:
    return [{"type": "EXIT", "HCW-ID": "w1", "ts": "2026-01-01T00:00:00+00:00", "location": "a"}]


def test_a_queries_handler_with_a_scheduler_of_the_wrong_kind_is_refused(db):
    with pytest.raises(IngestError, match=r"scheduler must be one of sei, s2pl, lwm or a streams.Scheduler such as "
                                          r"streams.LWMScheduler\(granularity='table'\); got 5"):
        streams.QueriesHandler(ingestible(db), scheduler=5)


@pytest.mark.parametrize("queries, match", [
    (lambda db: "not an engine", r"QueriesHandler takes a streams.StreamEngine, a list of them, or a factory"),
    (lambda db: [], r"QueriesHandler takes a streams.StreamEngine"),
    (lambda db: [ingestible(db, "twin"), ingestible(db, "twin")],
     r"two engines are named 'twin': the name keys an engine's saved state, give each its own StreamEngine\(name=…\)"),
    (lambda db: streams.StreamEngine(db, name="bare", durable=False, record_dead_letters=False),
     r"engine 'bare' has no stream: declare one with engine.create_stream\(…\) before feeding it"),
], ids=["factory-of-text", "factory-of-nothing", "same-name", "no-stream"])
def test_a_queries_handler_with_wrong_engines_is_refused_when_the_ingestion_takes_it(db, queries, match):
    with pytest.raises(IngestError, match=match):
        feed(db, [_rows()], source="refused", mapping=MAPPING, handler=streams.QueriesHandler(queries))


def test_a_queries_handler_with_an_engine_of_another_database_is_refused(db, database_url, db_options):
    other = open_db(database_url, db_options)
    try:
        engine = ingestible(other, "elsewhere")
        with pytest.raises(IngestError, match=r"engine 'elsewhere' was built on another Database than the one it is "
                                              r"fed into; build it with StreamEngine\(db, …\) on the same db"):
            feed(db, [_rows()], source="elsewhere", mapping=MAPPING, handler=streams.QueriesHandler(engine))
    finally:
        other.close()


def test_a_queries_handler_feeds_one_ingestion_and_needs_a_mapping(db):
    handler = streams.QueriesHandler(ingestible(db))
    with pytest.raises(IngestError, match=r"the queries path needs a mapping: its key column names the attribute an "
                                          r"event's key becomes"):
        handler.bind(db, None)
    handler.bind(db, MAPPING)
    with pytest.raises(IngestError, match=r"this QueriesHandler already feeds an ingestion; give each ingestion its "
                                          r"own"):
        handler.bind(db, MAPPING)
