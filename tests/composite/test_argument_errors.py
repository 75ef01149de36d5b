"""A composition engine, its handler and ``rows_to_items`` refuse what they cannot take — an empty name, a query
before any stream, a producer joining twice, an ``on_uncertain`` answer that is no decision on the candidates — with
an activedb error that says what to give instead, and the engine's lists left as they were."""

from __future__ import annotations

import pytest

from activedb import composite
from activedb.composite import Choice, CompositeError, MembershipError
from activedb.ingest import EventMapping
from activedb.ingest.errors import IngestError, MappingError
from activedb.streams.errors import DefinitionError
from tests.composite.conftest import FIG2, ev, make_engine, names
from tests.composite.test_composition import AND_CHRONICLE, fig3_uncertain


def lists(engine) -> dict:
    return {query: sorted(event["id"] for events in waiting["lists"].values() for event in events)
            for query, waiting in engine.waiting().items()}


@pytest.mark.parametrize("name", ["", "   ", None], ids=["empty", "blank", "none"])
def test_an_engine_without_a_name_is_refused(name):
    with pytest.raises(CompositeError, match="a CompositionEngine needs a non-empty name"):
        composite.CompositionEngine(name=name)


def test_a_query_before_any_stream_says_to_create_the_stream_first():
    engine = composite.CompositionEngine(clock=composite.ManualClock(), timeout=None)
    with pytest.raises(DefinitionError, match=r"has no stream; declare its types with engine\.create_stream\("):
        engine.define(AND_CHRONICLE)


def test_the_spec_of_an_unknown_query_names_the_defined_ones():
    engine = make_engine(AND_CHRONICLE, FIG2)
    with pytest.raises(DefinitionError, match=r"no query 'XY' in engine composite \(defined: AB\)"):
        engine.spec("XY")


def test_a_query_with_matching_selection_says_which_consumption_composition_uses():
    query = "CREATE QUERY AB PATTERN SEQ(A, B) MATCHING SKIP TILL NEXT MATCH RETURN A.id AS a"
    with pytest.raises(DefinitionError, match=r"MATCHING is the point-time matcher's selection; composition uses "
                                              r"CONSUMING CHRONICLE\|RECENT"):
        make_engine(query, FIG2)


@pytest.mark.parametrize("producer, types, message", [
    ("", ["A"], r"a producer is a non-empty string, got ''"),
    (None, ["A"], r"a producer is a non-empty string, got None"),
    ("PX", [], r"producer PX must name the event types it produces"),
], ids=["empty-producer", "no-producer", "no-types"])
def test_a_join_without_a_producer_or_its_types_is_refused(producer, types, message):
    engine = make_engine(AND_CHRONICLE, FIG2)
    with pytest.raises(MembershipError, match=message):
        engine.join(producer, types=types)
    assert sorted(engine.producers()) == sorted(FIG2)


def test_a_producer_that_joins_twice_is_refused_and_stays_a_member():
    engine = make_engine(AND_CHRONICLE, FIG2)
    with pytest.raises(MembershipError, match="producer PA has already joined engine composite"):
        engine.join("PA", types=["A"])
    assert sorted(engine.producers()) == sorted(FIG2)


def test_discarding_an_event_the_engine_never_took_is_refused_and_drops_nothing():
    engine = make_engine(AND_CHRONICLE, FIG2)
    engine.signal(ev("A", 1.0, "PA", "a0"))
    before = lists(engine)
    with pytest.raises(CompositeError, match=r"A#zz\[.*\]@PA is in no list of engine composite: discard takes an event the engine still holds"):
        engine.discard(ev("A", 5.0, "PA", "zz"))
    assert lists(engine) == before and engine.statistics().dropped == 0


STRANGER = ev("B", 9.0, "P1B", "zz")


@pytest.mark.parametrize("answer, message", [
    (5, (r"on_uncertain returned 5; return Choice\.use\(event\), Choice\.drop\(\*events\), one of the candidate "
         r"events, or None to raise UncertainOrder")),
    (Choice.use(STRANGER), r"on_uncertain chose B#zz\[.*\]@P1B, which is not one of the candidates \(B#b1_0"),
    (Choice.drop(STRANGER), r"on_uncertain dropped B#zz\[.*\]@P1B, which is not a candidate"),
], ids=["no-choice", "uses-a-stranger", "drops-a-stranger"])
def test_an_on_uncertain_answer_that_decides_nothing_about_the_candidates_is_refused_and_consumes_nothing(
        answer, message):
    engine = make_engine(AND_CHRONICLE, FIG2, on_uncertain=lambda uncertainty: answer)
    with pytest.raises(CompositeError, match=message):
        fig3_uncertain(engine)
    assert lists(engine) == {("AB", ()): ["a0", "a1", "b1_0", "b1_1", "b2_0"]}
    assert engine.statistics().dropped == 0


@pytest.mark.parametrize("answer", [Choice.use(STRANGER), Choice.drop(STRANGER)], ids=["use", "drop"])
def test_a_refused_on_uncertain_choice_is_not_counted_as_a_decision(answer):
    engine = make_engine(AND_CHRONICLE, FIG2, on_uncertain=lambda uncertainty: answer)
    with pytest.raises(CompositeError, match="on_uncertain"):
        fig3_uncertain(engine)
    assert engine.statistics().decisions == 0


def test_an_on_uncertain_callback_that_calls_its_engine_is_told_to_call_it_afterwards():
    engines = []

    def decide_and_peek(uncertainty):
        engines[0].discard(uncertainty.candidates[1])
        return uncertainty.candidates[0]

    engines.append(make_engine(AND_CHRONICLE, FIG2, on_uncertain=decide_and_peek))
    with pytest.raises(CompositeError, match=r"called from inside its own on_uncertain callback; the callback only "
                                             r"decides \(return a Choice\) — call the engine afterwards"):
        fig3_uncertain(engines[0])
    # Not deadlocked: the engine answers afterwards.
    (b2_0,) = [event for events in engines[0].waiting()[("AB", ())]["lists"].values() for event in events
               if event["id"] == "b2_0"]
    assert names(engines[0].discard(b2_0)) == [("a0", "b1_0")]


def test_rows_to_items_without_a_producer_column_says_to_name_it():
    mapping = EventMapping(type_column="type", key_column="key", ts_column="ts")
    with pytest.raises(MappingError, match=r"rows_to_items needs EventMapping\(producer_column=…\)"):
        composite.rows_to_items([{"type": "A", "key": "k", "ts": 1.0}], mapping)


@pytest.mark.parametrize("engine", [None, object(), "composite"], ids=["none", "an-object", "a-name"])
def test_a_composite_handler_takes_an_engine(engine):
    with pytest.raises(IngestError, match=r"CompositeHandler takes an activedb\.composite\.CompositionEngine; got"):
        composite.CompositeHandler(engine)


def test_a_query_defined_twice_says_to_rename_it_and_shows_where_as_the_point_engine_does():
    """A script whose query is already defined (ignoring case) is refused with the line and column of the
    statement, the line shown with a caret, and what to do — as ``StreamEngine.define`` refuses it.  It read
    'query AB is already defined', with no position and no way on; a refusal inside ``compile_query`` (an unknown
    type) showed its position but not the line."""
    engine = make_engine(AND_CHRONICLE, FIG2)
    with pytest.raises(DefinitionError) as refused:
        engine.define("\nCREATE QUERY ab PATTERN AND(A, B) RETURN A.id AS a")
    assert (refused.value.line, refused.value.column) == (2, 1)
    assert str(refused.value) == ("line 2, column 1: query ab is already defined; give the new one another name\n"
                                  "    CREATE QUERY ab PATTERN AND(A, B) RETURN A.id AS a\n"
                                  "    ^")
    with pytest.raises(DefinitionError, match=r"(?s)no event type 'C'.*\n    CREATE QUERY X PATTERN SEQ\(A, C\)"):
        engine.define("CREATE QUERY X PATTERN SEQ(A, C) RETURN A.id")
    assert list(engine.queries) == ["AB"]
