"""Composition on hand-built events: the Figure 2/Figure 3 scenario of Liebig, Cilia, Buchmann (*Event
Composition in Time-dependent Distributed Systems* §V: one A-producer, two B-producers, ``A & B``,
chronicle), SEQ across producers, recent consumption, uncertainty raised or decided by the application."""

from __future__ import annotations

import types

import pytest

from activedb import composite, streams
from activedb.composite import Choice, UncertainOrder, UncertaintyKind
from activedb.events import LocalClock, Punctuations, Timestamp
from activedb.streams.errors import DefinitionError

from tests.composite.conftest import FIG2, ev, make_engine, names

AND_CHRONICLE = "CREATE QUERY AB PATTERN AND(A, B) CONSUMING CHRONICLE RETURN A.id AS a, B.id AS b"
SEQ_CHRONICLE = "CREATE QUERY AthenB PATTERN SEQ(A, B) RETURN A.id AS a, B.id AS b"


def test_fig3_no_composite_before_stability_then_the_right_pair():
    engine = make_engine(AND_CHRONICLE, FIG2)
    assert engine.signal(ev("B", 1.002, "P1B", "b1_0")) == []      # t1: a tentative a0 & b1_0 at most
    assert engine.signal(ev("A", 1.000, "PA", "a0")) == []         # another A may be in transit
    assert engine.signal(ev("A", 2.000, "PA", "a1")) == []         # t2: a0 is the oldest A, but B is not stable
    assert engine.waiting()[("AB", ())]["blocked_on"] == ["P1B", "P2B"]
    assert engine.signal(ev("B", 2.000, "P1B", "b1_1")) == []      # P2B may still send an older B
    assert engine.waiting()[("AB", ())]["blocked_on"] == ["P2B"]
    produced = engine.signal(ev("B", 1.500, "P2B", "b2_0"))        # P2B's sync-point passes b1_0
    assert names(produced) == [("a0", "b1_0")]
    (pair,) = produced
    assert (pair.ts.lower, pair.ts.upper) == pytest.approx((0.995, 1.007))
    assert pair.resolutions == () and pair.attributes == {"a": "a0", "b": "b1_0"}
    assert names(engine.heartbeat("P2B", Timestamp.at(2.5, 0.005))) == []   # a1 & b2_0 needs PA to pass 1.505 …
    assert names(engine.heartbeat("PA", Timestamp.at(2.6, 0.005))) == [("a1", "b2_0")]   # … chronicle: oldest B


def fig3_uncertain(engine):
    for event in (ev("B", 1.002, "P1B", "b1_0"), ev("A", 1.000, "PA", "a0"), ev("A", 2.0, "PA", "a1"),
                  ev("B", 2.0, "P1B", "b1_1"), ev("B", 1.004, "P2B", "b2_0")):   # b1_0 ⊥ b2_0
        assert engine.signal(event) == []
    return engine.heartbeat("P2B", Timestamp.at(1.6, 0.005))        # oldest_b = {b1_0, b2_0} becomes stable


def test_fig3_uncertain_oldest_b_raises_naming_both_candidates():
    engine = make_engine(AND_CHRONICLE, FIG2)
    with pytest.raises(UncertainOrder) as raised:
        fig3_uncertain(engine)
    uncertainty = raised.value.uncertainty
    assert uncertainty.kind is UncertaintyKind.MULTIPLE and uncertainty.component == "B"
    assert sorted(event["id"] for event in uncertainty.candidates) == ["b1_0", "b2_0"]
    assert "b1_0" in str(raised.value) and "b2_0" in str(raised.value) and "on_uncertain" in str(raised.value)
    # Nothing was consumed; the same question is raised again until the application decides.
    with pytest.raises(UncertainOrder):
        engine.heartbeat("P2B", Timestamp.at(1.7, 0.005))
    (b2_0,) = [event for event in uncertainty.candidates if event["id"] == "b2_0"]
    assert names(engine.discard(b2_0)) == [("a0", "b1_0")]


def test_fig3_uncertain_oldest_b_handed_to_the_application_and_recorded():
    asked = []

    def choose(uncertainty):
        asked.append(uncertainty)
        return max(uncertainty.candidates, key=lambda event: event["id"])          # the application's policy

    engine = make_engine(AND_CHRONICLE, FIG2, on_uncertain=choose)
    produced = fig3_uncertain(engine)
    assert names(produced) == [("a0", "b2_0")]
    (resolution,) = produced[0].resolutions
    assert resolution.chosen["id"] == "b2_0" and resolution.uncertainty is asked[0]
    assert len(asked) == 1 and engine.statistics().decisions == 1


def test_seq_across_producers_with_uncertain_order_raises_instead_of_composing():
    # One candidate each, but a ⊥ b: the printed algorithm would compose (size 1); we raise (gap (c)).
    engine = make_engine(SEQ_CHRONICLE, {"PA": ["A"], "PB": ["B"]})
    engine.signal(ev("A", 1.000, "PA", "a0"))
    engine.signal(ev("B", 1.008, "PB", "b0"))                       # [0.995,1.005] vs [1.003,1.013]: overlap
    engine.heartbeat("PA", Timestamp.at(5.0, 0.005))
    with pytest.raises(UncertainOrder) as raised:
        engine.heartbeat("PB", Timestamp.at(5.0, 0.005))
    assert raised.value.uncertainty.kind is UncertaintyKind.UNORDERED
    assert raised.value.uncertainty.relative_to["id"] == "a0"
    assert engine.statistics().composites == 0


def test_seq_certain_order_composes_and_a_b_before_every_a_is_discarded():
    engine = make_engine(SEQ_CHRONICLE, {"PA": ["A"], "PB": ["B"]})
    assert engine.signal(ev("B", 0.5, "PB", "early")) == []
    assert engine.signal(ev("A", 1.0, "PA", "a0")) == []
    assert engine.signal(ev("B", 1.1, "PB", "b0")) == []            # a0 is not stable yet (PA may send older)
    assert names(engine.heartbeat("PA", Timestamp.at(2.0, 0.005))) == []   # PB may still send a B before b0
    assert names(engine.heartbeat("PB", Timestamp.at(2.0, 0.005))) == [("a0", "b0")]
    assert engine.statistics().discarded == 1                       # "early" precedes every A, present or to come
    assert engine.waiting() == {}


def test_seq_with_one_producer_uses_local_timestamps():
    # 50 ms accuracy makes the two events' intervals overlap; their local readings order them.
    engine = make_engine(SEQ_CHRONICLE, {"P": ["A", "B"]})
    engine.signal(ev("A", 1.000, "P", "a0", accuracy=0.05, local=10.000))
    produced = engine.signal(ev("B", 1.010, "P", "b0", accuracy=0.05, local=10.010))
    assert produced == []            # P may still send a B with the same local reading as b0
    produced = engine.signal(ev("B", 1.020, "P", "b1", accuracy=0.05, local=10.020))
    assert names(produced) == [("a0", "b0")]


def test_recent_seq_pairs_each_b_with_the_newest_a_before_it():
    engine = make_engine("CREATE QUERY R PATTERN SEQ(A, B) CONSUMING RECENT RETURN A.id AS a, B.id AS b",
                         {"PA": ["A"], "PB": ["B"]})
    for event in (ev("A", 1.0, "PA", "a0"), ev("A", 2.0, "PA", "a1"), ev("B", 2.5, "PB", "b0"),
                  ev("B", 2.7, "PB", "b1")):
        assert engine.signal(event) == []                           # PA may still send an A before b0
    produced = engine.signal(ev("A", 3.0, "PA", "a2"))              # now it cannot
    assert engine.signal(ev("B", 3.5, "PB", "b2")) == []
    produced += engine.heartbeat("PA", Timestamp.at(9.0, 0.005))
    assert names(produced) == [("a1", "b0"), ("a1", "b1"), ("a2", "b2")]
    assert all(item.consumption == "recent" for item in produced)
    assert engine.statistics().discarded >= 1                       # a0 was ruled out by a1 (and a1 by a2)


def test_recent_and_combines_every_event_with_the_newest_of_the_other_component():
    engine = make_engine("CREATE QUERY R PATTERN AND(A, B) CONSUMING RECENT RETURN A.id AS a, B.id AS b",
                         {"PA": ["A"], "PB": ["B"]})
    produced = []
    for event in (ev("A", 1.0, "PA", "a0"), ev("B", 2.0, "PB", "b0"), ev("A", 3.0, "PA", "a1"),
                  ev("B", 3.5, "PB", "b1")):
        produced += engine.signal(event)
    produced += engine.heartbeat("PB", Timestamp.at(9.0, 0.005))
    produced += engine.heartbeat("PA", Timestamp.at(9.0, 0.005))
    assert names(produced) == [("a0", "b0"), ("a1", "b0"), ("a1", "b1")]


def test_recent_uncertain_newest_raises():
    engine = make_engine("CREATE QUERY R PATTERN SEQ(A, B) CONSUMING RECENT RETURN A.id AS a",
                         {"P1": ["A"], "P2": ["A"], "PB": ["B"]})
    engine.signal(ev("A", 1.000, "P1", "a_1"))
    engine.signal(ev("A", 1.003, "P2", "a_2"))                      # ⊥ a_1: which is the newest A before b?
    engine.signal(ev("B", 2.0, "PB", "b0"))
    engine.heartbeat("P1", Timestamp.at(3.0, 0.005))
    with pytest.raises(UncertainOrder) as raised:
        engine.heartbeat("P2", Timestamp.at(3.0, 0.005))
    assert raised.value.uncertainty.kind is UncertaintyKind.MULTIPLE
    assert sorted(event["id"] for event in raised.value.uncertainty.candidates) == ["a_1", "a_2"]


def test_drop_choice_and_partitions():
    def drop_all(uncertainty):
        return Choice.drop(*uncertainty.candidates)

    engine = make_engine("CREATE QUERY AB PATTERN AND(A, B) WHERE [k] RETURN A.id AS a, B.id AS b",
                         FIG2, attributes=("id", "k"), on_uncertain=drop_all)
    engine.signal(ev("A", 1.0, "PA", "a0", k=1))
    engine.signal(ev("A", 1.0, "PA", "x0", k=2))                    # another partition
    engine.signal(ev("B", 1.002, "P1B", "b1", k=1))
    engine.signal(ev("B", 1.003, "P2B", "b2", k=1))                 # ⊥ b1 in partition 1
    engine.signal(ev("B", 1.5, "P1B", "y1", k=2))
    engine.heartbeat("PA", Timestamp.at(3.0, 0.005))
    produced = engine.heartbeat("P1B", Timestamp.at(3.0, 0.005))
    produced += engine.heartbeat("P2B", Timestamp.at(3.0, 0.005))
    assert sorted(names(produced)) == [("x0", "y1")]
    assert engine.statistics().dropped == 2
    assert ("AB", (1,)) in engine.waiting()                         # a0 waits for a B of its own partition


def test_events_without_the_partition_attribute_share_the_partition_of_none_unless_the_query_refuses_them():
    """The design note (as streams'): an event whose ``[attr]`` attribute is missing or None is in the partition of
    None, as SQL's ``PARTITION BY`` puts NULLs together, so such events compose with each other; an event-only
    ``IS NOT NULL`` term per component keeps them out."""
    events = [ev("A", 1.0, "PA", "a-missing"), ev("B", 1.5, "PB", "b-none", k=None),
              ev("A", 2.0, "PA", "a1", k=1), ev("B", 2.5, "PB", "b1", k=1)]
    beats = [composite.Heartbeat(producer, Timestamp.at(5.0, 0.005)) for producer in ("PA", "PB")]
    together = make_engine("CREATE QUERY AB PATTERN SEQ(A, B) WHERE [k] RETURN A.id AS a",
                           {"PA": ["A"], "PB": ["B"]}, attributes=("id", "k"))
    produced = together.submit([*events, *beats])
    assert sorted((names(produced)[index], item.partition) for index, item in enumerate(produced)) == [
        (("a-missing", "b-none"), (None,)), (("a1", "b1"), (1,))]
    refused = make_engine("CREATE QUERY AB PATTERN SEQ(A, B) WHERE [k] AND A.k IS NOT NULL AND B.k IS NOT NULL "
                          "RETURN A.id AS a", {"PA": ["A"], "PB": ["B"]}, attributes=("id", "k"))
    assert names(refused.submit([*events, *beats])) == [("a1", "b1")]


def test_definitions_the_interval_model_does_not_run_are_refused():
    engine = make_engine(AND_CHRONICLE, FIG2, attributes=("id", "x"))
    with pytest.raises(DefinitionError, match="negation"):
        engine.define("CREATE QUERY N PATTERN SEQ(A, !B, A a2) RETURN A.id")
    with pytest.raises(DefinitionError, match="WITHIN"):
        engine.define("CREATE QUERY W PATTERN SEQ(A, B) WITHIN 5 sec RETURN A.id")
    with pytest.raises(DefinitionError, match="cannot read the store"):
        engine.define("CREATE QUERY S PATTERN SEQ(A, B) WHERE (SELECT v FROM t WHERE k = A.x) = 1 RETURN A.id")
    with pytest.raises(DefinitionError, match=r"\[attr\]"):
        engine.define("CREATE QUERY J PATTERN AND(A, B) WHERE A.x = B.x RETURN A.id")
    # Local filters are fine: they decide which list an event enters.
    engine.define("CREATE QUERY F PATTERN AND(A, B) WHERE A.x > 1 RETURN A.id AS a, B.id AS b")


def test_a_script_with_a_refused_statement_defines_none_of_its_queries():
    """``define(text)`` is all or nothing: a script whose later statement is refused (a rule, which composite events
    reach as activedb rules; a query the interval model does not run) defines none of its queries, so the corrected
    script can be defined on the same engine.  Before, the queries before it stayed defined (and routed events),
    and the corrected script failed with 'query AB is already defined'."""
    engine = make_engine(AND_CHRONICLE, FIG2, attributes=("id", "x"))
    script = "CREATE QUERY AthenB PATTERN SEQ(A, B) RETURN A.id AS a, B.id AS b\n"
    with pytest.raises(DefinitionError, match="queries only"):
        engine.define(script + "CREATE RULE R ON OUTPUT AthenB UPDATE t SET v = 1 WHERE k = 1")
    with pytest.raises(DefinitionError, match="negation"):
        engine.define(script + "CREATE QUERY N PATTERN SEQ(A, !B, A a2) RETURN A.id")
    assert list(engine.queries) == ["AB"]
    assert [query.name for query in engine.define(script)] == ["AthenB"]
    assert sorted(engine.queries) == ["AB", "AthenB"]


def test_the_point_time_engine_refuses_and_and_consumption(db_less_stream_engine):
    with pytest.raises(DefinitionError, match="activedb.composite"):
        db_less_stream_engine.define("CREATE QUERY AB PATTERN AND(A, B) RETURN A.id")


@pytest.fixture
def db_less_stream_engine():
    class NoDb:
        punctuations = Punctuations()           # (what the engine reads of the database's punctuations)
        # (what StreamEngine asks when it is made: whether the Database is closed — its worker pool's flag)
        transactions = types.SimpleNamespace(pool=types.SimpleNamespace(closed=False))

    engine = streams.StreamEngine(NoDb(), name="t", durable=False)
    engine.create_stream("s", types=["A", "B"], attributes=["id"])
    return engine


def test_composites_feed_a_further_composition_as_a_producer():
    first = make_engine(AND_CHRONICLE, FIG2)
    second = make_engine("CREATE QUERY ABthenC PATTERN SEQ(AB, C) RETURN AB.a AS a, C.id AS c",
                         {"AB": ["AB"], "PC": ["C"]}, attributes=("id", "a", "b"))
    forwarded = []

    def forward(composites):
        for item in composites:
            forwarded.extend(second.signal(item.to_stream_event()))
        progress = first.progress("AB")
        if progress is not None:
            forwarded.extend(second.heartbeat("AB", progress))

    for event in (ev("A", 1.0, "PA", "a0"), ev("B", 1.1, "P1B", "b0"), ev("B", 1.2, "P2B", "b1")):
        forward(first.signal(event))
    assert second.signal(ev("C", 3.0, "PC", "c0")) == []            # a0 & b0 has not happened yet
    for producer in ("PA", "P1B", "P2B"):
        forward(first.heartbeat(producer, Timestamp.at(2.0, 0.005)))
    forwarded += second.heartbeat("PC", Timestamp.at(4.0, 0.005))
    assert [(item["a"], item["c"]) for item in forwarded] == [("a0", "c0")]
    (result,) = forwarded
    assert result.constituents[0].ts.producer == "AB" and result.ts.lower == pytest.approx(0.995)


def test_discarding_the_last_event_of_a_node_removes_it():
    """``discard`` of a node's only event: the node, now empty, goes (before: RuntimeError: dictionary changed
    size during iteration, the event already removed but the call failed)."""
    engine = make_engine(SEQ_CHRONICLE, {"PA": ["A"], "PB": ["B"]})
    event = ev("A", 1.0, "PA", "a0")
    engine.signal(event)
    assert engine.discard(event) == []
    assert engine.statistics().dropped == 1 and engine.waiting() == {}


def test_discard_finds_an_event_signalled_with_a_point_timestamp_and_its_producer_attribute():
    """``signal`` takes an event whose ts is a number with ``attributes['producer']``; ``discard`` of that same
    event removes it (before: "is in no list", the list holding it with its ts made a Timestamp)."""
    engine = make_engine(SEQ_CHRONICLE, {"PA": ["A"], "PB": ["B"]}, attributes=("id", "producer"))
    event = streams.StreamEvent("A", 1.0, {"id": "a0", "producer": "PA"})
    engine.signal(event)
    assert [waiting["lists"]["A"] for waiting in engine.waiting().values()] != [[]]
    assert engine.discard(event) == []
    assert engine.statistics().dropped == 1 and engine.waiting() == {}


@pytest.mark.parametrize("given", [None, "a0", {"type": "A", "ts": 1.0}], ids=["none", "a-text", "a-mapping"])
def test_discard_of_what_is_no_event_is_a_composite_error_and_changes_nothing(given):
    """``discard`` takes the StreamEvent as it was signalled: None, a text or a mapping failed with a bare
    AttributeError ('has no attribute ts'), no ActivedbError."""
    engine = make_engine(SEQ_CHRONICLE, {"PA": ["A"], "PB": ["B"]})
    engine.signal(ev("A", 1.0, "PA", "a0"))
    with pytest.raises(composite.CompositeError, match=r"discard\(\) takes the StreamEvent"):
        engine.discard(given)
    assert engine.statistics().dropped == 0 and engine.waiting() != {}


@pytest.mark.parametrize("given", [ev("A", 1.0, "PA", "a0"), None, 5, "a0", {"type": "A", "ts": 1.0}],
                         ids=["one-event", "none", "a-number", "a-text", "a-mapping"])
def test_submit_of_what_is_no_collection_of_inputs_is_a_composite_error_and_changes_nothing(given):
    """``submit(items)`` takes a collection of inputs: one StreamEvent failed with a bare KeyError (0), None or a number
    with a TypeError ('object is not iterable'), none an ActivedbError; one input is ``signal(item)`` or ``[item]``."""
    engine = make_engine(SEQ_CHRONICLE, {"PA": ["A"], "PB": ["B"]})
    with pytest.raises(composite.CompositeError, match=r"items is .*, not a collection of inputs: .*\[item\]"):
        engine.submit(given)
    assert engine.statistics().events == 0 and engine.waiting() == {}


def test_an_input_whose_local_reading_is_not_of_its_producers_kind_is_refused_and_the_engine_goes_on():
    """A producer's local clock readings are numbers or aware datetimes, one kind: an event or heartbeat whose reading
    is of the other kind is an ``EventRejected`` that changes nothing — it failed with a bare ``TypeError`` (mixed
    times) comparing it with the producer's latest reading, a heartbeat after it was counted and its producer's
    silence reset."""
    import datetime as dt

    engine = make_engine(SEQ_CHRONICLE, {"PA": ["A"], "PB": ["B"]})
    engine.signal(streams.StreamEvent("A", Timestamp.at(1.0, 0.1, producer="PA", local=1.0), {"id": "a0"}))
    before = engine.statistics()
    moment = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    with pytest.raises(composite.EventRejected, match=r"local reading .* producer PA's .*; give its local readings"):
        engine.signal(streams.StreamEvent("A", Timestamp.at(2.0, 0.1, producer="PA", local=moment), {"id": "a1"}))
    with pytest.raises(composite.EventRejected, match=r"local reading .* producer PA's .*; give its local readings"):
        engine.heartbeat("PA", Timestamp.at(3.0, 0.1, local=moment))
    assert engine.statistics() == before and engine.producers()["PA"].latest_local == 1.0
    engine.heartbeat("PA", Timestamp.at(3.0, 0.1, local=3.0))
    assert engine.statistics().heartbeats == 1


def test_an_input_whose_time_is_not_of_the_engines_kind_is_refused_and_the_engine_goes_on():
    """Times are numbers or aware datetimes, one kind per engine: an input of the other kind is an
    ``EventRejected`` that changes nothing — a heartbeat given a datetime in a numeric engine was taken, and
    every later input of its producer failed with a bare ``TypeError`` (mixed times), for good."""
    import datetime as dt

    from tests.composite._workload import pairs_engine

    engine = pairs_engine(None)
    engine.signal(streams.StreamEvent("A", Timestamp.point(5.0, producer="P0"), {"k": "x", "id": "a"}))
    before = engine.statistics()
    with pytest.raises(composite.EventRejected, match=r"heartbeat of P1: .* is a datetime, but the times of engine "
                                                      r"pairs are numbers of seconds; give every time of one kind"):
        engine.heartbeat("P1", dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc))
    with pytest.raises(composite.EventRejected, match=r"event B.* is a datetime, but the times of engine pairs"):
        engine.signal(streams.StreamEvent("B", Timestamp.point(dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc),
                                                       producer="P1"), {"k": "x", "id": "b"}))
    assert engine.statistics() == before
    composites = engine.signal(streams.StreamEvent("B", Timestamp.point(6.0, producer="P1"), {"k": "x", "id": "b"}))
    composites += engine.heartbeat("P0", 20.0) + engine.heartbeat("P1", 20.0)
    assert [(item.payload()["a"], item.payload()["b"]) for item in composites] == [("a", "b")]


@pytest.mark.parametrize("options, message", [
    ({"clock": 5}, r"clock is an activedb\.clock\.Clock"), ({"clock": composite.ManualClock}, r"clock is an activedb"),
    ({"on_uncertain": 5}, r"on_uncertain is a function"), ({"on_invalidation": "log"}, r"on_invalidation is a function"),
], ids=["clock-number", "clock-class", "on-uncertain-number", "on-invalidation-text"])
def test_an_engine_s_clock_or_callback_of_the_wrong_kind_is_refused_when_made(options, message):
    """CompositionEngine(clock=5) was taken and failed at the first join with a bare AttributeError ('int' object has
    no attribute 'now'); on_uncertain=5 (on_invalidation='log') at the first uncertainty (invalidation), mid-call,
    with a TypeError ('int' object is not callable) — no ActivedbError, and nothing naming the argument."""
    with pytest.raises(composite.CompositeError, match=message):
        composite.CompositionEngine(None, **options)


def test_the_local_clock_a_producer_joined_with_orders_its_events_as_one_its_timestamps_carry():
    """join(…, clock=LocalClock(detection_delay=1.0)) says the producer's local readings order its events only when
    more than a second apart.  Stability used that clock, but the order of the candidates used an exact one, so two
    overlapping events 0.2 s apart locally were composed as certainly ordered — the engine picked silently where the
    same clock given with each timestamp raises UncertainOrder."""
    engine = composite.CompositionEngine(None, timeout=None)
    engine.create_stream("s", types=["A", "B"], attributes=["id"])
    engine.define("CREATE QUERY AB PATTERN SEQ(A, B) RETURN A.id AS a, B.id AS b")
    engine.join("P", types=["A", "B"], clock=LocalClock(detection_delay=1.0))
    engine.submit([streams.StreamEvent("A", Timestamp.at(1.0, 0.5, producer="P", local=1.0), {"id": "a"}),
                   streams.StreamEvent("B", Timestamp.at(1.2, 0.5, producer="P", local=1.2), {"id": "b"})])
    with pytest.raises(UncertainOrder) as raised:
        engine.heartbeat("P", Timestamp.at(10.0, 0.5, local=10.0))
    assert raised.value.uncertainty.kind is UncertaintyKind.UNORDERED
    assert engine.take_outputs() == []


def test_a_producer_s_local_clock_of_the_wrong_kind_is_refused_when_it_joins():
    """join(…, clock=5) was taken, and the producer's first two events with local readings failed with a bare
    AttributeError ('int' object has no attribute 'orders') after both were counted and put into the lists."""
    engine = composite.CompositionEngine(None, timeout=None)
    engine.create_stream("s", types=["A", "B"])
    engine.query("AB", pattern=streams.seq("A", "B"))
    with pytest.raises(composite.MembershipError, match=r"producer P: clock is an activedb\.events\.LocalClock"):
        engine.join("P", types=["A", "B"], clock=5)
    assert engine.producers() == {}
    engine.join("P", types=["A", "B"], clock=LocalClock())
    events = [streams.StreamEvent("A", Timestamp.at(1.0, 0.5, producer="P", local=1.0), {}),
              streams.StreamEvent("B", Timestamp.at(1.2, 0.5, producer="P", local=1.2), {})]
    assert engine.submit(events) == [] and engine.statistics().waiting == 2


@pytest.mark.parametrize("consumption", ["latest", 5, "RECENT"], ids=["unknown", "a-number", "upper-case"])
def test_a_query_s_consumption_that_is_none_of_the_consumptions_is_a_definition_error(consumption):
    """``engine.query(…, consumption="latest")`` failed with the enum's bare ValueError ("'latest' is not a valid
    Consumption"), no ActivedbError and no list of what it takes — where selection=… given the same way is a
    DefinitionError listing the selections (9a0c8b8): both are read by query_definition, one was fixed."""
    engine = composite.CompositionEngine(None)
    engine.create_stream("s", types=["A", "B"], attributes=["id"])
    with pytest.raises(DefinitionError, match=r"query AB: consumption is an activedb\.streams\.Consumption or one of "
                                              r"'chronicle', 'recent'"):
        engine.query("AB", pattern=streams.conj("A", "B"), returns=[streams.event("A")["id"]], consumption=consumption)
    assert engine.queries == {}


@pytest.mark.parametrize("call, message", [
    (lambda: composite.CompositionEngine(None, timeout="5"),
     r"CompositionEngine\(timeout='5'\) takes None \(wait forever\) or a number of seconds above 0"),
    (lambda: composite.CompositionEngine(None, window="5"), r"CompositionEngine\(window='5'\) takes a whole number of at least 0"),
    (lambda: composite.CompositionEngine(None, window=-1), r"CompositionEngine\(window=-1\) takes a whole number of at least 0"),
    (lambda: composite.CompositionEngine(None).join("P", types=None), r"types is a collection of event type names"),
    (lambda: composite.CompositionEngine(None).join("P", types=5), r"types is a collection of event type names"),
], ids=["timeout-text", "window-text", "window-negative", "types-none", "types-number"])
def test_an_argument_of_the_wrong_type_is_a_composite_error_saying_what_to_give(call, message):
    """A timeout or window that is no number, or join(types=…) given no collection, is a CompositeError saying what
    to give — they were TypeErrors ('>' not supported between 'str' and 'int', 'an integer is required', 'NoneType'
    object is not iterable) or deque's ValueError."""
    with pytest.raises(composite.CompositeError, match=message):
        call()


def test_a_join_since_a_time_of_the_other_kind_is_refused():
    """``join(since=…)`` gives the producer's first sync-point: a time not of the kind of the engine's times is a
    MembershipError — it was taken, and every later input of that producer failed with a bare TypeError (mixed
    times), a heartbeat after being counted.  Before any input, the first since= sets the kind."""
    import datetime as dt

    from tests.composite._workload import pairs_engine

    moment = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    engine = pairs_engine(None)
    engine.signal(streams.StreamEvent("A", Timestamp.point(5.0, producer="P0"), {"k": "x", "id": "a"}))
    with pytest.raises(composite.MembershipError, match=r"producer P2: since=.* is a datetime, but the times of "
                                                         r"engine pairs are numbers of seconds"):
        engine.join("P2", types=["B"], since=moment)
    assert "P2" not in engine.producers()
    fresh = pairs_engine(None)
    fresh.join("P2", types=["B"], since=moment)
    with pytest.raises(composite.EventRejected, match=r"is a number of seconds, but the times of engine pairs are "
                                                      r"aware datetimes"):
        fresh.signal(streams.StreamEvent("A", Timestamp.point(5.0, producer="P0"), {"k": "x", "id": "a"}))


def test_choice_drop_of_no_candidate_is_a_bad_argument_saying_what_to_give():
    """``Choice.drop()`` (an on_uncertain callback unpacking an empty selection) was a bare ValueError, no
    ActivedbError."""
    import activedb

    with pytest.raises(activedb.BadArgument, match=r"Choice\.drop needs at least one candidate"):
        Choice.drop()


@pytest.mark.parametrize("query", [
    "CREATE QUERY AB PATTERN AND(A, B) CONSUMING CHRONICLE RETURN A.id AS a, A.x / B.y AS r",
    "CREATE QUERY AthenB PATTERN SEQ(A, B) CONSUMING RECENT RETURN A.id AS a, A.x / B.y AS r",
    "CREATE QUERY AB PATTERN AND(A, B) CONSUMING RECENT RETURN A.id AS a, A.x / B.y AS r",
], ids=["chronicle", "recent-seq", "recent-and"])
def test_a_return_that_raises_leaves_the_pair_in_the_lists(query):
    """The chosen pair left the lists before RETURN was computed, so a RETURN that raises (``A.x / B.y`` with y = 0)
    lost both events outside any transaction: the error was raised once, and the next call saw empty lists.  Now
    the pair stays, and each evaluation raises the same error until the application discards an event.  Recent AND
    marked the event processed before computing RETURN, so there too the error was raised once and the pair lost."""
    engine = make_engine(query, FIG2, attributes=("id", "x", "y"))
    a0, b0 = ev("A", 1.0, "PA", "a0", x=1, y=1), ev("B", 1.1, "P1B", "b0", x=1, y=0)
    raised = 0
    for step in (lambda: engine.signal(a0), lambda: engine.signal(b0), lambda: engine.heartbeat("PA", 1.5),
                 lambda: engine.heartbeat("P1B", 1.5), lambda: engine.heartbeat("P2B", 1.5)):
        try:
            step()
        except streams.errors.EvaluationError as error:      # where the pair is decided (SEQ: sooner than AND)
            assert "1 / 0" in str(error)
            raised += 1
    assert raised >= 1 and engine.statistics().waiting == 2
    with pytest.raises(streams.errors.EvaluationError, match="1 / 0"):
        engine.heartbeat("P2B", 1.6)
    engine.discard(b0)
    assert engine.heartbeat("P2B", 1.7) == [] and engine.statistics().waiting == 1


def test_a_return_that_raises_says_which_query_and_events_and_what_to_do():
    """Outside an ingestion a RETURN that raises is raised (README, "Ingestion"): the error was the expression's
    own, "cannot compute 1 / 0: division by zero", naming neither the query nor the events that stay in its lists and
    raise it again at every evaluation, nor what to do — nor that the call stopped there, the inputs after the one
    that led to it not taken.  It now says all of it, and is still an EvaluationError."""
    engine = make_engine("CREATE QUERY AthenB PATTERN SEQ(A, B) RETURN A.id AS a, A.x / B.y AS r",
                         {"PA": ["A"], "PB": ["B"]}, attributes=("id", "x", "y"))
    a0, b0 = ev("A", 1.0, "PA", "a0", x=1, y=1), ev("B", 1.1, "PB", "b0", x=1, y=0)
    later = ev("A", 3.0, "PA", "a1", x=1, y=1)
    engine.submit([a0, b0])
    with pytest.raises(streams.errors.EvaluationError) as caught:
        engine.submit([composite.Heartbeat("PA", Timestamp.at(2.0, 0.005)),
                       composite.Heartbeat("PB", Timestamp.at(2.0, 0.005)), later])
    message = str(caught.value)
    assert "query AthenB" in message and "1 / 0" in message, message
    assert "A#a0" in message and "B#b0" in message, message
    assert "engine.discard(event)" in message and "not taken" in message, message
    assert engine.statistics().events == 2      # (the call stopped: the later event was not taken)


def test_a_refused_input_of_submit_says_how_many_were_taken_and_which_one_stopped_the_call():
    """``submit`` takes its inputs in order and stops at the first it refuses: the inputs after it were not taken,
    and the error (an EventRejected, a LateEvent, a MembershipError) said only what was wrong with that one — not that
    the call stopped there, how many inputs were taken, nor which one it was.  It says all of it now, and is still
    of its class."""
    engine = make_engine("CREATE QUERY AthenB PATTERN SEQ(A, B) RETURN A.id AS a", {"PA": ["A"], "PB": ["B"]})
    a0, wrong, b0 = ev("A", 1.0, "PA", "a0"), ev("B", 1.1, "PA", "b-from-PA"), ev("B", 1.2, "PB", "b0")
    with pytest.raises(composite.EventRejected) as caught:
        engine.submit([a0, wrong, b0])
    message = str(caught.value)
    assert message.startswith("producer PA joined for A, not B"), message
    assert ("input 1 of the call (B#b-from-PA" in message and "the 1 input before it was taken" in message
            and "those after it were not taken" in message), message
    assert engine.statistics().events == 1      # (a0 only: b0 was not taken)
    unknown = ev("A", 2.0, "PX", "ax")
    with pytest.raises(composite.MembershipError,
                       match=r"input 2 of the call \(A#ax.*the 2 inputs before it were taken"):
        engine.submit([b0, ev("A", 1.5, "PA", "a1"), unknown])
    engine = make_engine("CREATE QUERY AB PATTERN AND(A, B) RETURN A.id AS a", FIG2)
    engine.submit([ev("A", 1.0, "PA", "a0"), ev("B", 5.0, "P1B", "b5"),
                   composite.Heartbeat("P2B", Timestamp.at(6.0, 0.005)),
                   composite.Heartbeat("PA", Timestamp.at(5.0, 0.005)),
                   composite.Heartbeat("P1B", Timestamp.at(6.0, 0.005))])
    assert engine.statistics().composites == 1                  # (it relied on no B before 5 in transit)
    with pytest.raises(composite.LateEvent,
                       match=r"input 0 of the call \(B#late.*no input before it was taken"):
        engine.submit([ev("B", 2.0, "P1B", "late"), ev("A", 9.0, "PA", "a9")])
    assert engine.statistics().events == 2


def test_discard_of_an_event_signalled_twice_removes_one_copy():
    """``discard(event)`` removes the event it is given — one candidate (README: the application ``discard(event)``s a
    candidate) — from every list it entered.  An event signalled twice (a producer's duplicate, equal in type, time
    and attributes) is two candidates: discarding one leaves the other, which still composes.  Before, every equal
    copy went (both dropped), and the application had no way to keep one."""
    engine = make_engine(SEQ_CHRONICLE, {"PA": ["A"], "PB": ["B"]})
    event = ev("A", 1.0, "PA", "a0")
    engine.signal(event)
    engine.signal(event)
    assert engine.discard(event) == []
    assert engine.statistics().dropped == 1
    assert [waiting["lists"]["A"] for waiting in engine.waiting().values()] == [[event]]
    engine.signal(ev("B", 1.1, "PB", "b0"))
    engine.heartbeat("PA", Timestamp.at(2.0, 0.005))
    assert names(engine.heartbeat("PB", Timestamp.at(2.0, 0.005))) == [("a0", "b0")]
