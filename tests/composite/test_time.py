"""The time model on hand-built timestamps: interval order, uncertain order, local timestamp order.

Liebig, Cilia, Buchmann, *Event Composition in Time-dependent Distributed Systems* §III.D: the interval
order is strict (``upper(a) < lower(b)``), touching or overlapping intervals are uncertain, and events of
one producer are ordered by their local readings when the local timestamp order can tell."""

from __future__ import annotations

import datetime as dt

import pytest

import activedb

from activedb.events import AccuracyInterval, Event, EventKind, LocalClock, Order, Timestamp, as_timestamp, hull, order


def test_disjoint_intervals_are_ordered_both_ways():
    a = Timestamp.at(10.0, 0.005, producer="P1")
    b = Timestamp.at(10.011, 0.005, producer="P2")
    assert order(a, b) is Order.BEFORE
    assert order(b, a) is Order.AFTER


def test_touching_intervals_are_uncertain():
    a = Timestamp.between(1.0, 2.0, producer="P1")
    b = Timestamp.between(2.0, 3.0, producer="P2")            # upper(a) == lower(b): not strictly before
    assert order(a, b) is Order.UNCERTAIN
    assert order(b, a) is Order.UNCERTAIN
    just_apart = Timestamp.between(2.000001, 3.0, producer="P2")
    assert order(a, just_apart) is Order.BEFORE


def test_overlapping_and_identical_timestamps_are_uncertain():
    a = Timestamp.at(5.0, 0.010, producer="P1")
    assert order(a, Timestamp.at(5.015, 0.010, producer="P2")) is Order.UNCERTAIN
    assert order(a, a) is Order.UNCERTAIN
    # Points are the special case alpha = 0: different points are ordered, equal points are not.
    assert order(3, 4) is Order.BEFORE
    assert order(Timestamp.point(4), 4) is Order.UNCERTAIN


def test_asymmetric_accuracy_and_datetimes():
    base = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)
    a = Timestamp.at(base, minus=0.030, plus=0.010, producer="P1")      # ldd widens the lower side
    assert a.lower == base - dt.timedelta(milliseconds=30) and a.upper == base + dt.timedelta(milliseconds=10)
    b = Timestamp.at(base + dt.timedelta(milliseconds=45), minus=0.030, plus=0.0, producer="P2")
    assert order(a, b) is Order.BEFORE                    # 10 ms after base < 15 ms after base
    c = Timestamp.at(base + dt.timedelta(milliseconds=40), minus=0.030, plus=0.0, producer="P2")
    assert order(a, c) is Order.UNCERTAIN                 # touches at base + 10 ms


def test_local_timestamps_order_one_producers_events_only():
    a = Timestamp.at(7.0, 0.050, producer="P", local=100.000)
    b = Timestamp.at(7.010, 0.050, producer="P", local=100.010)
    assert order(a, b) is Order.BEFORE                    # global intervals overlap; local readings order them
    other = Timestamp.at(7.010, 0.050, producer="Q", local=100.010)
    assert order(a, other) is Order.UNCERTAIN             # local readings of different producers mean nothing
    # The local order respects detection delay, granularity, rate adjustment and drift (§III.D).
    clock = LocalClock(detection_delay=0.008, granularity=0.001, rate_adjustment=0.0005, drift=1e-5)
    slow_a = Timestamp.at(7.0, 0.050, producer="P", local=100.000, clock=clock)
    slow_b = Timestamp.at(7.010, 0.050, producer="P", local=100.009, clock=clock)
    assert order(slow_a, slow_b) is Order.UNCERTAIN       # 9 ms − 1 ms − 0.5 ms < 8 ms of detection delay
    slow_c = Timestamp.at(7.010, 0.050, producer="P", local=100.0096, clock=clock)
    assert order(slow_a, slow_c) is Order.BEFORE


def test_invalid_timestamps_are_refused_with_reasons():
    with pytest.raises(ValueError, match="ends before it begins"):
        AccuracyInterval(2.0, 1.0)
    with pytest.raises(ValueError, match="non-negative"):
        Timestamp.at(1.0, -0.1)
    with pytest.raises(ValueError, match="time zone"):
        Timestamp.at(dt.datetime(2024, 1, 1), 0.1)
    with pytest.raises(ValueError, match="interval, not a point"):
        Timestamp.at(1.0, 0.1).point_value


def test_hull_and_backward_compatible_event_ts():
    stamps = [Timestamp.at(1.0, 0.1, producer="P"), Timestamp.at(3.0, 0.2, producer="Q")]
    whole = hull(stamps, producer="AB")
    assert (whole.lower, whole.upper, whole.producer) == (0.9, 3.2, "AB")
    assert as_timestamp(5).is_point and as_timestamp(5).point_value == 5
    # Event.ts keeps holding plain numbers; it may now hold a Timestamp too.
    assert Event(EventKind.STREAM, "A", ts=5).ts == 5
    assert Event(EventKind.STREAM, "AB", ts=whole).ts.interval == AccuracyInterval(0.9, 3.2)


def test_polist_oldest_and_oldest_following_on_hand_built_events():
    from activedb import streams
    from activedb.composite import Item, POList

    def item(number, lower, upper, producer="P", local=None):
        return Item(streams.StreamEvent("E", None, {}), Timestamp.between(lower, upper, producer=producer,
                                                                          local=local), number)

    a = item(1, 1.0, 2.0)
    b = item(2, 2.0, 3.0, "Q")          # touches a: uncertain, so both are oldest
    c = item(3, 3.5, 4.0)               # preceded by a and b
    polist = POList([c, b, a])
    assert {x.number for x in polist.oldest()} == {1, 2}
    assert {x.number for x in polist.newest()} == {3}
    anchor = item(9, 1.5, 1.6, "R")     # a ⊥ anchor, anchor < b, anchor < c
    assert {x.number for x in polist.oldest_following(anchor)} == {1, 2}
    assert {x.number for x in POList([b, c]).oldest_following(anchor)} == {2}
    # One producer's local readings order what the intervals cannot.
    early, late = item(4, 1.0, 2.0, "P", local=10.0), item(5, 1.0, 2.0, "P", local=10.5)
    assert [x.number for x in POList([late, early]).oldest()] == [4]
    assert [x.number for x in POList([late, early]).newest_before(item(6, 5.0, 6.0, "Q"))] == [5]


@pytest.mark.parametrize("make", [
    lambda: Timestamp.at(1.0, accuracy=-1), lambda: Timestamp.at(1.0, accuracy="1"),
    lambda: Timestamp.at(1.0, accuracy=10**400), lambda: AccuracyInterval(2.0, 1.0),
    lambda: AccuracyInterval(1.0, dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)),
    lambda: LocalClock(drift=-1), lambda: LocalClock(granularity=10**400),
], ids=["negative-accuracy", "text-accuracy", "huge-accuracy", "reversed", "mixed", "negative-drift", "huge-granularity"])
def test_a_time_refused_is_an_invalid_time(make):
    """Every time, duration or clock parameter activedb.events refuses is an ``InvalidTime`` (an ActivedbError and
    a ValueError, as ``check_time`` raises): an accuracy, an interval or a LocalClock field was a bare ValueError, and
    an integer no float holds an OverflowError."""
    with pytest.raises(activedb.InvalidTime):
        make()


@pytest.mark.parametrize("make", [
    lambda: Timestamp.at(dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc), accuracy=1e12),
    lambda: Timestamp.at(dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc), minus=0, plus=dt.timedelta(days=4e6)),
    lambda: AccuracyInterval.around(dt.datetime(2, 1, 1, tzinfo=dt.timezone.utc), 1e8),
    lambda: AccuracyInterval.around(dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc), 1e15),
], ids=["past-year-9999", "timedelta-past-year-9999", "before-year-1", "no-timedelta-holds"])
def test_an_accuracy_that_takes_a_datetime_out_of_range_is_an_invalid_time(make):
    """``[reference ± α]`` of a datetime beyond the datetimes Python holds (year 1 to 9999) is an ``InvalidTime`` naming
    the reference and the accuracy — it was an OverflowError ('date value out of range'), no ActivedbError."""
    with pytest.raises(activedb.InvalidTime, match=r"accuracy .* takes .* beyond the datetimes"):
        make()


@pytest.mark.parametrize("make", [
    lambda: Timestamp.at(1.0, producer=5), lambda: Timestamp.at(1.0, producer=""),
    lambda: Timestamp.point(1.0, producer=["P"]), lambda: Timestamp.at(1.0, clock=5),
    lambda: Timestamp.between(1.0, 2.0, clock="exact"),
], ids=["number-producer", "empty-producer", "list-producer", "number-clock", "text-clock"])
def test_a_timestamp_s_producer_or_clock_of_the_wrong_kind_is_a_bad_argument(make):
    """A Timestamp's producer is a non-empty text and its clock a LocalClock: a producer of another kind was a bare
    ValueError (no ActivedbError), and a clock of another kind was taken, failing later where the producer's local
    order is asked (``'int' object has no attribute 'orders'``)."""
    with pytest.raises(activedb.BadArgument, match=r"Timestamp\(producer=|Timestamp\(clock="):
        make()


@pytest.mark.parametrize("age, expected", [(10**400, float("inf")), (-10**400, None), (10**20, float("inf"))],
                         ids=["beyond-any-float", "negative-beyond-any-float", "beyond-forever"])
def test_an_age_given_as_an_int_no_float_holds_is_read_as_any_other(age, expected):
    """age_seconds (db.outbox.prune's, db.batches.prune's, capture's retention) let float()'s OverflowError out for
    10**400 — an age beyond FOREVER_SECONDS is 'for ever' (inf), a negative one the caller's error — as check_time
    reads such an int as not finite (b2decec)."""
    from activedb.events import age_seconds

    if expected is None:
        with pytest.raises(activedb.BadArgument, match=r"older_than takes a non-negative age"):
            age_seconds(age, "older_than", activedb.BadArgument)
    else:
        assert age_seconds(age, "older_than", activedb.BadArgument) == expected


def test_a_timestamp_of_no_interval_and_the_hull_of_nothing_are_activedb_errors():
    """``Timestamp(interval=None)`` was a bare TypeError and ``hull([])`` a bare ValueError (no ActivedbError)."""
    with pytest.raises(activedb.errors.InvalidTime, match=r"Timestamp.interval.*AccuracyInterval"):
        Timestamp(None)  # type: ignore[arg-type]
    with pytest.raises(activedb.BadArgument, match="hull.*at least one"):
        hull([])


@pytest.mark.parametrize("source", [None, 5, "", ["a"]], ids=["none", "number", "empty", "list"])
def test_a_punctuation_of_a_source_that_is_no_name_is_a_bad_argument(source):
    """``Punctuations.punctuate`` (``db.punctuate``) took any source: None or 5 was recorded under a key no stream's
    name ever matches (the punctuation lost without a word), a list failed with a bare TypeError."""
    from activedb.events import Punctuations
    punctuations = Punctuations()
    with pytest.raises(activedb.BadArgument, match="source"):
        punctuations.punctuate(source, 1.0)
    assert punctuations.watermark("a") is None
