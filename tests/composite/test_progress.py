"""Progress per producer: heartbeats, the input-node timeout on an injected clock, membership, late events."""

from __future__ import annotations

import pytest

from activedb import composite, streams
from activedb.composite import (CompositeError, EventRejected, LateEvent, MembershipError, ProducerTimeout,
                                TimeoutPolicy)
from activedb.events import Timestamp
from activedb.streams.errors import EvaluationError

from tests.composite.conftest import FIG2, ev, make_engine, names

AND_CHRONICLE = "CREATE QUERY AB PATTERN AND(A, B) RETURN A.id AS a, B.id AS b"


def test_heartbeats_move_sync_points_like_events():
    engine = make_engine(AND_CHRONICLE, FIG2)
    engine.signal(ev("A", 1.0, "PA", "a0"))
    engine.signal(ev("B", 1.1, "P1B", "b0"))
    assert engine.heartbeat("PA", Timestamp.at(1.5, 0.005)) == []
    assert engine.heartbeat("P1B", Timestamp.at(1.5, 0.005)) == []
    assert names(engine.heartbeat("P2B", 1.2)) == [("a0", "b0")]      # a point heartbeat is alpha = 0
    assert engine.producers()["P2B"].sync == 1.2
    # An old heartbeat never moves a sync-point back.
    engine.heartbeat("P2B", 0.5)
    assert engine.producers()["P2B"].sync == 1.2


def test_silent_producer_times_out_with_a_clear_error_instead_of_stalling(clock):
    engine = make_engine(AND_CHRONICLE, FIG2, clock=clock, timeout=2.0)
    engine.signal(ev("A", 1.0, "PA", "a0"))
    engine.signal(ev("A", 2.0, "PA", "a1"))
    engine.signal(ev("B", 1.1, "P1B", "b0"))
    clock.advance(1.5)
    engine.heartbeat("P1B", Timestamp.at(3.0, 0.005))
    assert engine.poll() == []                                        # P2B silent 1.5 s < 2 s
    clock.advance(1.0)
    with pytest.raises(ProducerTimeout) as raised:                    # P1B keeps talking; P2B does not
        engine.heartbeat("P1B", Timestamp.at(4.0, 0.005))
    with pytest.raises(ProducerTimeout):
        engine.poll()
    assert raised.value.producers == ("P2B",)
    assert "P2B silent for 2.5 s" in str(raised.value) and "heartbeat" in str(raised.value)
    # A producer nobody waits for may stay silent.
    quiet = make_engine(AND_CHRONICLE, FIG2, clock=clock, timeout=2.0)
    clock.advance(100)
    assert quiet.poll() == []


def test_timeout_policy_exclude_lets_composition_go_on(clock):
    engine = make_engine(AND_CHRONICLE, FIG2, clock=clock, timeout=2.0, on_timeout=TimeoutPolicy.EXCLUDE)
    engine.signal(ev("A", 1.0, "PA", "a0"))
    engine.signal(ev("A", 2.0, "PA", "a1"))
    engine.signal(ev("B", 1.1, "P1B", "b0"))
    engine.heartbeat("P1B", Timestamp.at(3.0, 0.005))
    clock.advance(3.0)
    assert names(engine.poll()) == [("a0", "b0")]
    assert engine.producers()["P2B"].state == "left"
    assert engine.statistics().excluded == 1            # (the engine counted it; the statistics did not say)
    with pytest.raises(MembershipError, match="has left"):
        engine.signal(ev("B", 4.0, "P2B", "late"))


def test_a_producer_heard_at_timeout_plus_a_millisecond_stays_joined_and_the_silent_one_is_excluded(clock):
    """Both B producers hold ``a0 & b0`` back; at timeout + 1 ms P2B's heartbeat arrives.  The call takes the heartbeat
    first (P2B was just heard) and checks the timeouts after it: the one excluded is P1B, silent since b0, and each
    producer's status says so — P1B ``left``, P2B ``joined`` (and what it still holds back is P2B's)."""
    engine = make_engine(AND_CHRONICLE, FIG2, clock=clock, timeout=2.0, on_timeout=TimeoutPolicy.EXCLUDE)
    engine.signal(ev("A", 1.0, "PA", "a0"))
    engine.signal(ev("A", 2.0, "PA", "a1"))
    engine.signal(ev("B", 1.1, "P1B", "b0"))
    assert engine.waiting()[("AB", ())]["blocked_on"] == ["P1B", "P2B"]
    clock.advance(2.001)
    assert engine.heartbeat("P2B", Timestamp.at(1.05, 0.005)) == []
    assert engine.statistics().excluded == 1
    assert {name: info.state for name, info in engine.producers().items()} == {
        "PA": "joined", "P1B": "left", "P2B": "joined"}
    assert engine.waiting()[("AB", ())]["blocked_on"] == ["P2B"]


def test_membership_is_atomic_join_before_sending_and_leave():
    engine = make_engine(AND_CHRONICLE, FIG2)
    with pytest.raises(MembershipError, match="has not joined"):
        engine.signal(ev("B", 1.0, "P3B", "x"))
    engine.signal(ev("A", 1.0, "PA", "a0"))
    engine.signal(ev("A", 2.0, "PA", "a1"))
    engine.signal(ev("B", 1.1, "P1B", "b0"))
    engine.signal(ev("B", 2.0, "P1B", "b1"))
    assert names(engine.leave("P2B")) == [("a0", "b0")]               # P2B sent everything: b0 is stable
    with pytest.raises(MembershipError, match="joins too late"):
        engine.join("P3B", types=["B"], since=1.0)                    # a0 & b0 relied on nothing before 1.105
    engine.join("P3B", types=["B"], since=1.9)
    engine.signal(ev("B", 1.95, "P3B", "b3"))
    engine.heartbeat("P3B", Timestamp.at(3.0, 0.005))
    engine.heartbeat("P1B", Timestamp.at(3.0, 0.005))
    assert names(engine.heartbeat("PA", Timestamp.at(3.0, 0.005))) == [("a1", "b3")]
    with pytest.raises(EventRejected, match="joined for B"):
        engine.signal(ev("A", 5.0, "P3B", "wrong type"))


def test_late_events_are_refused_only_when_a_decision_relied_on_their_absence():
    engine = make_engine(AND_CHRONICLE, FIG2)
    engine.signal(ev("A", 1.0, "PA", "a0"))
    engine.signal(ev("B", 5.0, "P1B", "b_late_sync"))
    engine.heartbeat("P2B", Timestamp.at(6.0, 0.005))
    engine.heartbeat("PA", Timestamp.at(5.0, 0.005))
    engine.heartbeat("P1B", Timestamp.at(6.0, 0.005))                 # a0 & b_late_sync composed
    assert engine.statistics().composites == 1
    with pytest.raises(LateEvent, match="FIFO"):
        engine.signal(ev("B", 2.0, "P1B", "b_from_the_past"))         # would have been the oldest B
    # Below the sync-point but after everything decisions relied on: accepted and composed correctly.
    engine.signal(ev("A", 9.0, "PA", "a1"))
    engine.signal(ev("B", 8.0, "P2B", "b_ok"))
    engine.signal(ev("B", 7.0, "P2B", "b_late_but_harmless"))
    assert engine.statistics().late_accepted == 1
    out = []
    for producer in ("P1B", "P2B", "PA"):
        out += engine.heartbeat(producer, Timestamp.at(20.0, 0.005))
    assert names(out) == [("a1", "b_late_but_harmless")]


def _one_pair_decided(**options):
    """``a0 & b1_0`` composed from PA and P1B; decisions about B relied on no B before 1.105 in transit."""
    engine = make_engine(AND_CHRONICLE, {"PA": ["A"], "P1B": ["B"]}, **options)
    engine.signal(ev("A", 1.0, "PA", "a0"))
    engine.signal(ev("A", 3.0, "PA", "a1"))
    engine.signal(ev("B", 1.1, "P1B", "b1_0"))
    assert names(engine.heartbeat("P1B", Timestamp.at(2.0, 0.005))) == [("a0", "b1_0")]
    return engine


def test_atomic_membership_refuses_a_producer_discovered_late():
    engine = _one_pair_decided()
    with pytest.raises(MembershipError, match="joins too late"):
        engine.join("P3B", types=["B"], since=1.0)
    engine.join("P3B", types=["B"])                                   # without since= it may join ...
    with pytest.raises(LateEvent, match="membership='weak'"):
        engine.signal(ev("B", 1.05, "P3B", "b3_0"))                   # ... but its old event is refused
    assert engine.invalidations() == ()


def test_weak_membership_admits_a_late_producer_and_reports_what_its_old_event_changes():
    notices = []
    engine = _one_pair_decided(on_invalidation=notices.append)
    engine.join("P3B", types=["B"], since=1.0, membership="weak")     # admitted at once, whatever was decided
    assert engine.producers()["P3B"].membership == "weak"
    assert engine.producers()["PA"].membership == "atomic"
    # b3_0 certainly precedes b1_0: chronicle would have composed a0 & b3_0.  Taken, and reported.
    assert engine.signal(ev("B", 1.05, "P3B", "b3_0")) == []
    (notice,) = notices
    assert engine.invalidations() == (notice,)                        # recorded
    assert engine.statistics().invalidations == 1
    assert notice.producer == "P3B" and notice.event["id"] == "b3_0"
    assert names(notice.composites) == [("a0", "b1_0")]
    assert notice.relied == pytest.approx(1.105)
    assert "weak membership" in notice.describe() and "AB(" in notice.describe()
    # The old event was taken like any other: once every sync-point passed a1, a1 & b3_0 are composed.
    out = []
    for producer in ("P1B", "P3B", "PA"):
        out += engine.heartbeat(producer, Timestamp.at(4.0, 0.005))
    assert names(out) == [("a1", "b3_0")]
    # An event that changes nothing already decided is not reported.
    engine.signal(ev("B", 4.5, "P3B", "b3_1"))
    assert len(notices) == 1 and len(engine.invalidations()) == 1


def test_weak_membership_reports_only_compositions_the_old_event_would_have_changed():
    """Under chronicle an old event certainly after a composite's constituent of its component changed
    nothing there; under SEQ an event certainly before the previous component's constituent could
    not have followed it."""
    notices = []
    engine = make_engine("CREATE QUERY AthenB PATTERN SEQ(A, B) RETURN A.id AS a, B.id AS b",
                         {"PA": ["A"], "P1B": ["B"]}, on_invalidation=notices.append)
    out = []
    for event in (ev("A", 1.0, "PA", "a0"), ev("B", 1.2, "P1B", "b0"), ev("A", 2.0, "PA", "a1"),
                  ev("B", 2.2, "P1B", "b1")):
        out += engine.signal(event)
    out += engine.heartbeat("PA", Timestamp.at(3.0, 0.005)) + engine.heartbeat("P1B", Timestamp.at(3.0, 0.005))
    assert names(out) == [("a0", "b0"), ("a1", "b1")]
    engine.join("P3B", types=["B"], membership="weak")
    engine.signal(ev("B", 1.1, "P3B", "b3_0"))      # between a0 and b0: a0 ; b3_0 would have been composed
    (notice,) = notices
    assert names(notice.composites) == [("a0", "b0")]                 # not a1 ; b1: b3_0 precedes a1
    engine.signal(ev("B", 1.5, "P3B", "b3_1"))      # after b0, before a1: changes neither composite
    assert len(notices) == 1 and engine.statistics().invalidations == 1


def test_membership_must_be_atomic_or_weak():
    engine = make_engine(AND_CHRONICLE, FIG2)
    with pytest.raises(MembershipError, match="'atomic'"):
        engine.join("P9", types=["B"], membership="eventual")


def test_an_event_a_query_cannot_evaluate_is_refused_whole():
    """An event whose query filter raises (``A.x > 5`` on a text) is refused before it changes anything: its
    producer's sync-point, the counts and the picture stay as they were, so the corrected event is taken as
    if the first had never come."""
    engine = make_engine("CREATE QUERY AthenB PATTERN SEQ(A, B) WHERE A.x > 5 RETURN A.id AS a, B.id AS b",
                         {"PA": ["A"], "PB": ["B"]}, attributes=("id", "x"))
    with pytest.raises(EvaluationError, match="cannot compare"):
        engine.signal(ev("A", 1.0, "PA", "a_bad", x="abc"))
    assert (engine.statistics().events, engine.producers()["PA"].sync, engine.producers()["PA"].events) == (0, None, 0)
    assert engine.window().entries == ()
    engine.signal(ev("A", 1.0, "PA", "a0", x=7))
    engine.signal(ev("B", 2.0, "PB", "b0"))
    engine.heartbeat("PA", Timestamp.at(3.0, 0.005))
    assert names(engine.heartbeat("PB", Timestamp.at(3.0, 0.005))) == [("a0", "b0")]


def test_an_event_a_query_cannot_evaluate_is_refused_naming_the_query():
    """Outside an ingestion the refusal is the ``EvaluationError`` itself: it was the expression's alone ("cannot
    compare 'abc' > 5 …"), naming neither the query nor the event, where an ingestion's dead letter names both.  It
    now says which query's condition, on which event, and that nothing changed."""
    engine = make_engine("CREATE QUERY AthenB PATTERN SEQ(A, B) WHERE A.x > 5 RETURN A.id AS a, B.id AS b",
                         {"PA": ["A"], "PB": ["B"]}, attributes=("id", "x"))
    with pytest.raises(EvaluationError) as caught:
        engine.signal(ev("A", 1.0, "PA", "a_bad", x="abc"))
    message = str(caught.value)
    assert "the condition of query AthenB cannot be evaluated on it" in message and "A#a_bad" in message, message
    assert "cannot compare" in message and "it changed nothing" in message, message


@pytest.mark.parametrize("malformed", [
    streams.StreamEvent("A", Timestamp.at(1.0, 0.005, producer="PA"), None),                    # type: ignore[arg-type]
    streams.StreamEvent("A", Timestamp.at(1.0, 0.005, producer="PA"), [("id", "a0")]),          # type: ignore[arg-type]
    streams.StreamEvent("A", Timestamp.at(1.0, 0.005, producer="PA"), {"id": ["a", "list"]}),
], ids=["attributes-none", "attributes-a-list", "partition-value-unhashable"])
def test_a_malformed_event_is_rejected_with_event_rejected_and_changes_nothing(malformed):
    """An event whose attributes are not a mapping, or whose partition attribute cannot key a node (a list),
    raises EventRejected saying so — not a TypeError from inside the engine — and is not taken."""
    engine = make_engine("CREATE QUERY AthenB PATTERN SEQ(A, B) WHERE [id] RETURN A.id AS a, B.id AS b",
                         {"PA": ["A"], "PB": ["B"]})
    with pytest.raises(EventRejected, match="A"):
        engine.signal(malformed)
    assert (engine.statistics().events, engine.producers()["PA"].sync) == (0, None)


@pytest.mark.parametrize("nan", [float("nan"), (1, float("nan"))], ids=["a-nan", "a-tuple-holding-a-nan"])
def test_an_event_whose_partition_value_is_a_nan_is_rejected_saying_why(nan):
    """A NaN equals nothing, itself included: as a partition's key it made the partition depend on the object —
    ``A`` and ``B`` with ``id=math.nan`` (one object) composed, with ``id=float("nan")`` each (two objects) never did,
    each left alone in a partition of its own for good.  Such an event is now refused, as one whose value cannot
    key a partition at all (a list), saying why and to give None for a missing value."""
    engine = make_engine("CREATE QUERY AthenB PATTERN SEQ(A, B) WHERE [id] RETURN A.id AS a, B.id AS b",
                         {"PA": ["A"], "PB": ["B"]})
    event = streams.StreamEvent("A", Timestamp.at(1.0, 0.005, producer="PA"), {"id": nan})
    with pytest.raises(EventRejected, match=r"query AthenB is partitioned by \[id\], and .*nan.* cannot key a "
                                            r"partition: a NaN equals nothing, not even itself; give None"):
        engine.signal(event)
    assert (engine.statistics().events, engine.producers()["PA"].sync) == (0, None)


def test_join_with_types_given_as_one_text_is_refused():
    """``types=`` is a collection of type names: a text given there (``types="AB"``) is refused with what to
    write, instead of being read letter by letter — which joined the producer for ``A`` and ``B`` silently, so
    that compositions of both waited for a producer that would never send them."""
    engine = make_engine(AND_CHRONICLE, FIG2)
    with pytest.raises(MembershipError, match=r"types=\['AB'\]"):
        engine.join("PQ", types="AB")
    assert "PQ" not in engine.producers()


def test_join_for_a_type_no_stream_declares_is_refused():
    """A producer joined for a type no stream of the engine declares (``types=['Q']``, a typo of ``B``) was taken,
    and so were its events of that type: counted as taken, in no query's list (no query can name an undeclared
    type), never a refusal — through an ingestion, rows accounted for as applied that nothing used.  The design
    note: events of unknown types are refused.  Now the join says which types are declared and changes nothing."""
    engine = make_engine(AND_CHRONICLE, FIG2)
    with pytest.raises(MembershipError, match=r"producer PQ joins for Q, which no stream of engine composite "
                                              r"declares \(declared: A, B\)"):
        engine.join("PQ", types=["B", "Q"])
    with pytest.raises(MembershipError, match=r"no stream of engine composite declares"):
        engine.join("PQ", types=["Q"], membership="weak")
    assert "PQ" not in engine.producers()
    engine.join("PQ", types=["B"])
    open_stream = make_engine(AND_CHRONICLE, FIG2)         # (a stream of any type: types=None)
    open_stream.create_stream("any", types=None, attributes=("id",))
    open_stream.join("PQ", types=["Q"])


@pytest.mark.parametrize("since", ["soon", float("nan")], ids=["a-text", "nan"])
def test_join_with_a_since_that_is_not_a_time_is_a_membership_error(since):
    """``join(…, since=…)`` that is not a time is refused with MembershipError naming the producer (was a bare
    ValueError from the time model), and the producer is not joined."""
    engine = make_engine(AND_CHRONICLE, FIG2)
    with pytest.raises(MembershipError, match="producer PQ: since="):
        engine.join("PQ", types=["A"], since=since)
    assert "PQ" not in engine.producers()


def test_an_unknown_on_timeout_is_a_composite_error_naming_the_policies():
    """``CompositionEngine(on_timeout=…)`` takes a TimeoutPolicy or its value; anything else is refused with a
    CompositeError listing them (was a bare ValueError: 'x' is not a valid TimeoutPolicy)."""
    with pytest.raises(CompositeError, match=r"on_timeout='exclued'.*'raise'.*'exclude'"):
        composite.CompositionEngine(on_timeout="exclued")
    assert composite.CompositionEngine(on_timeout="exclude").on_timeout is TimeoutPolicy.EXCLUDE


def test_window_last_keeps_at_most_that_many_arrivals_and_refuses_a_negative_count():
    """``window(last=0)`` returned every arrival (0 read as "not given"), and ``window(last=-1)`` silently dropped
    the oldest one instead of refusing a count that means nothing."""
    engine = make_engine(AND_CHRONICLE, FIG2)
    for number in range(3):
        engine.signal(ev("A", 1.0 + number, "PA", f"a{number}"))
    assert len(engine.window().entries) == 3 and len(engine.window(last=2).entries) == 2
    assert engine.window(last=0).entries == ()
    for bad in (-1, 1.5, "2", True):
        with pytest.raises(CompositeError, match="window.*last"):
            engine.window(last=bad)


def test_spec_and_progress_find_a_query_ignoring_case_as_definitions_do():
    engine = make_engine(AND_CHRONICLE, FIG2)
    engine.signal(ev("A", 1.0, "PA", "a0"))
    engine.signal(ev("B", 1.1, "P1B", "b0"))
    assert engine.spec("ab") == engine.spec("AB")          # the spec rules match: the name composites carry
    assert engine.progress("ab") == engine.progress("AB")
    with pytest.raises(Exception, match="already defined"):
        engine.define("CREATE QUERY ab PATTERN AND(A, B) RETURN A.id AS a")
