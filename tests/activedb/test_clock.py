"""The clock seam (``activedb.clock``): a ``ManualClock`` moves only when told and wakes its waiters then; a
database's clock is what its composite engines and its outbox's recovery passes read."""

from __future__ import annotations

import datetime as dt
import threading
from decimal import Decimal
from fractions import Fraction

import pytest
import sqlalchemy as sa
from click.testing import CliRunner

import activedb
from activedb import Coupling, composite
from activedb.cli import main
from activedb.clock import SYSTEM_CLOCK, Clock, ManualClock, SystemClock
from activedb.testing import wait_until
from tests._clocks import ReadPausingClock

TIMEOUT = 60


def test_a_manual_clock_moves_only_when_told_and_wakes_its_waiters_then():
    clock = ManualClock(100.0, wall=dt.datetime(2024, 5, 1, 12, tzinfo=dt.timezone.utc))
    assert isinstance(clock, Clock) and isinstance(SYSTEM_CLOCK, Clock) and isinstance(SYSTEM_CLOCK, SystemClock)
    woken, timed_out = threading.Event(), threading.Event()
    results: dict[str, bool] = {}
    threads = [threading.Thread(target=lambda: results.__setitem__("woken", clock.wait_until(woken, 120.0))),
               threading.Thread(target=lambda: results.__setitem__("timed out", clock.wait_until(timed_out, 110.0)))]
    for thread in threads:
        thread.start()
    wait_until(lambda: clock.sleepers == 2, TIMEOUT, "both threads waiting on the clock")
    assert clock.advance(dt.timedelta(seconds=9)) == 109.0 and clock.sleepers == 2
    woken.set()
    threads[0].join(TIMEOUT)
    assert results == {"woken": True} and clock.sleepers == 1
    clock.advance(1)
    threads[1].join(TIMEOUT)
    assert results == {"woken": True, "timed out": False} and clock.sleepers == 0
    assert clock.now() == 110.0 and clock.wall() == dt.datetime(2024, 5, 1, 12, 0, 10, tzinfo=dt.timezone.utc)
    assert clock.wait_until(threading.Event(), 110.0) is False and clock.wait_until(threading.Event(), 0) is False
    with pytest.raises(ValueError, match="does not move backwards"):
        clock.advance(-1)
    with pytest.raises(ValueError, match="aware datetime"):
        ManualClock(wall=dt.datetime(2024, 5, 1))


@pytest.mark.parametrize("make", [
    lambda: ManualClock(wall=dt.datetime(2024, 5, 1)), lambda: ManualClock(wall="2024-05-01"),
    lambda: ManualClock("abc"), lambda: ManualClock(None), lambda: ManualClock(float("nan")),
    lambda: ManualClock(float("inf")), lambda: ManualClock(True),
    lambda: ManualClock().advance(-1), lambda: ManualClock().advance("5"), lambda: ManualClock().advance(None),
    lambda: ManualClock().advance(float("nan")), lambda: ManualClock().advance(float("inf")),
    lambda: ManualClock().advance(10**400), lambda: ManualClock().advance(dt.timedelta(seconds=-1)),
    lambda: ManualClock().advance(1e12), lambda: ManualClock().advance(1e300)])
def test_a_manual_clock_refuses_what_is_no_time_with_a_bad_argument(make):
    """ManualClock(wall=naive) and advance(-1) were bare ValueErrors (no ActivedbError); a text wall an
    AttributeError, start='abc' or advance('5') float()'s ValueError or TypeError, advance(10**400) an OverflowError;
    start=NaN or advance(inf) were taken, after which wall() failed (OverflowError) or now() was NaN for good."""
    with pytest.raises(activedb.BadArgument, match=r"ManualClock"):
        make()


def test_an_advance_past_the_calendars_end_is_refused_and_the_clock_stays_usable():
    """advance(1e12) took the clock past datetime's year 9999: the advance was taken, and from then on wall() and
    repr() failed with a bare OverflowError ('date value out of range') for good.  Now the advance is refused,
    saying how far the calendar reaches, and the clock is as it was."""
    clock = ManualClock(5.0, wall=dt.datetime(9999, 12, 31, 23, 59, tzinfo=dt.timezone.utc))
    with pytest.raises(activedb.BadArgument, match=r"ManualClock.advance.*year 9999.*advance by at most"):
        clock.advance(120)
    assert clock.now() == 5.0 and clock.wall() == dt.datetime(9999, 12, 31, 23, 59, tzinfo=dt.timezone.utc)
    assert clock.advance(59) == 64.0 and clock.wall().second == 59 and "9999-12-31" in repr(clock)


def test_a_databases_clock_is_its_composite_engines_and_its_outboxs(migrated):
    clock = ManualClock()
    database = activedb.connect(migrated, clock=clock, outbox_options={"recovery_interval": 30.0})
    try:
        assert database.clock is clock and database.outbox.clock is clock
        assert composite.CompositionEngine(database).clock is clock
        assert composite.CompositionEngine().clock is SYSTEM_CLOCK
        with activedb.connect(migrated, upgrade=False) as other:
            assert other.clock is SYSTEM_CLOCK
        broken = threading.Event()
        broken.set()

        @database.rule(on=database.signalled("pay"), coupling=Coupling.DETACHED, name="clock_ledger")
        def ledger(tx, event):
            if broken.is_set():
                raise ZeroDivisionError("no rate yet")
            tx.insert("events_seen", rule="clock_ledger", detail=str(event.payload["amount"]))

        with database.transaction() as tx:
            tx.signal("pay", amount=3)
        database.rules.wait_idle(TIMEOUT)
        [failure] = database.outbox.failures()
        broken.clear()
        retried = CliRunner().invoke(main, ["--url", migrated, "outbox", "--retry", str(failure.id)])
        assert retried.exit_code == 0, retried.output
        # The recovery pass that runs the retried firing comes when the database's clock says so.
        wait_until(lambda: clock.sleepers == 1, TIMEOUT, "the outbox's recovery thread waiting on the clock")
        assert seen(database) == []
        clock.advance(30)
        wait_until(lambda: seen(database) == [("clock_ledger", "3")], TIMEOUT, "the retried firing run",
                   describe=lambda: seen(database))
    finally:
        database.close()


def seen(database: activedb.Database) -> list[tuple]:
    with database.engine.connect() as connection:
        return sorted(tuple(row) for row in connection.execute(
            sa.text("SELECT rule, detail FROM events_seen WHERE rule = 'clock_ledger'")))


def test_a_wall_whose_utc_reading_is_past_the_calendars_end_is_a_bad_argument():
    """ManualClock(wall=9999-12-31 23:00 at UTC-5) is 10000-01-01 04:00 UTC: ``astimezone`` failed with a bare
    OverflowError ('date value out of range'), no ActivedbError saying what to give."""
    wall = dt.datetime(9999, 12, 31, 23, tzinfo=dt.timezone(dt.timedelta(hours=-5)))
    with pytest.raises(activedb.BadArgument, match=r"ManualClock\(wall=.*UTC"):
        ManualClock(wall=wall)


def test_a_manual_clock_takes_decimal_and_fraction_seconds_as_the_nearest_float():
    """``ManualClock(Decimal("1.5"))`` and ``advance(Fraction(1, 4))`` were refused as no number of seconds, though
    both are numbers a test reads its times as; they are taken now, each as the float nearest it (what the clock
    holds), and a Decimal NaN, infinity or signalling NaN, or a Fraction past a float's range, is refused as a float
    one is."""
    clock = ManualClock(Decimal("1.5"), wall=dt.datetime(2024, 5, 1, tzinfo=dt.timezone.utc))
    assert clock.now() == 1.5 and type(clock.now()) is float
    assert clock.advance(Fraction(1, 4)) == 1.75 and clock.advance(Decimal("0.25")) == 2.0
    assert clock.advance(Decimal("0.1")) == 2.0 + 0.1
    assert clock.wall() == dt.datetime(2024, 5, 1, 0, 0, 0, 600000, tzinfo=dt.timezone.utc)
    for refused in (Decimal("NaN"), Decimal("sNaN"), Decimal("Infinity"), Fraction(10 ** 400)):
        with pytest.raises(activedb.BadArgument, match=r"ManualClock.advance\(\.\.\.\) takes a finite number"):
            clock.advance(refused)
        with pytest.raises(activedb.BadArgument, match=r"ManualClock\(start=\.\.\.\) takes a finite number"):
            ManualClock(refused)
    with pytest.raises(activedb.BadArgument, match=r"does not move backwards"):
        clock.advance(Decimal("-1"))
    assert clock.now() == 2.1


def test_a_manual_clock_whose_making_failed_has_a_repr_that_says_so():
    """A ManualClock whose ``__init__`` raised (a naive wall) is seen half-made where a traceback shows its frame's
    locals (``pytest --showlocals``, a debugger): its repr raised AttributeError ('_mutex') there."""
    with pytest.raises(activedb.BadArgument) as refused:
        ManualClock(wall=dt.datetime(2024, 5, 1))
    frame = refused.traceback[-1].frame
    half_made = frame.f_locals["self"]
    assert isinstance(half_made, ManualClock) and repr(half_made) == "ManualClock(<not made>)"


def test_a_sleeper_until_a_deadline_wakes_when_the_clock_passed_it_between_its_reading_and_its_sleep():
    """A caller with a deadline read ``now()``, computed the time left and slept that long (``Clock.wait``, relative):
    a ``ManualClock`` advanced between the read and the sleep moved its deadline later by the advance, and it slept
    on.  ``wait_until`` takes the deadline itself, on ``now()``'s scale: the advance passed it, so the sleep ends."""
    clock = ReadPausingClock()
    woken = threading.Event()
    results: list[bool] = []

    def sleeper() -> None:
        deadline = clock.now() + 10.0            # (stopped after this read: the test advances meanwhile)
        results.append(clock.wait_until(woken, deadline))

    clock.pause_next_read("sleeper")
    thread = threading.Thread(target=sleeper, name="sleeper", daemon=True)
    thread.start()
    assert clock.read.wait(TIMEOUT), "the sleeper never read the clock"
    clock.advance(15)
    clock.go.set()
    thread.join(TIMEOUT)
    assert not thread.is_alive(), f"the sleeper still sleeps past its deadline: {clock}, {clock.sleepers} sleeper(s)"
    assert results == [False] and clock.sleepers == 0 and not woken.is_set()


def test_the_system_clock_sleeps_until_a_deadline_on_its_now_scale():
    clock = SystemClock()
    assert clock.wait_until(threading.Event(), clock.now() - 1.0) is False
    assert clock.wait_until(threading.Event(), clock.now() + 0.01) is False
    woken = threading.Event()
    woken.set()
    assert clock.wait_until(woken, clock.now() + 3600.0) is True and clock.wait_until(woken, None) is True


def test_a_databases_built_in_clock_still_sleeps_a_number_of_seconds(migrated):
    """``db.clock.wait(wake, seconds)``, the relative sleep of the earlier protocol, failed with a bare AttributeError
    once the protocol's sleep became ``wait_until``: code of an application that called it on the built-in clocks
    broke.  Both keep it, as ``wait_until(wake, now() + seconds)``: a ``ManualClock``'s sleeper wakes when the clock
    has been advanced by its seconds, not before; what is no number of seconds is a BadArgument saying what it
    takes."""
    with activedb.connect(migrated, upgrade=False) as database:
        assert isinstance(database.clock, SystemClock)
        woken = threading.Event()
        woken.set()
        assert database.clock.wait(woken, 3600) is True and database.clock.wait(woken, None) is True
        assert database.clock.wait(threading.Event(), 0) is False
        assert database.clock.wait(threading.Event(), -1.0) is False
        assert database.clock.wait(threading.Event(), 0.001) is False
        for refused in ("5", float("nan"), float("inf"), True):
            with pytest.raises(activedb.BadArgument, match=r"SystemClock.wait\(wake, seconds\) takes a finite number "
                                                           r"of seconds, or None for no time limit"):
                database.clock.wait(threading.Event(), refused)
    clock = ManualClock(100.0)
    # (no recovery passes: the outbox's thread would sleep on the clock too, and clock.sleepers would count it)
    with activedb.connect(migrated, upgrade=False, clock=clock, outbox_options={"recovery_interval": None}) as database:
        assert database.clock is clock
        timed_out, woken = threading.Event(), threading.Event()
        results: dict[str, bool] = {}
        threads = [
            threading.Thread(target=lambda: results.__setitem__("timed out", database.clock.wait(timed_out, 5)),
                             daemon=True),
            threading.Thread(target=lambda: results.__setitem__("woken", database.clock.wait(woken, None)),
                             daemon=True)]
        for thread in threads:
            thread.start()
        wait_until(lambda: clock.sleepers == 1, TIMEOUT, "the sleeper of 5 seconds waiting on the clock",
                   describe=lambda: f"{clock.sleepers} sleeper(s), {results}")
        clock.advance(4)
        assert clock.sleepers == 1 and threads[0].is_alive() and results == {}
        woken.set()
        threads[1].join(TIMEOUT)
        assert results == {"woken": True}
        clock.advance(1)
        threads[0].join(TIMEOUT)
        assert results == {"woken": True, "timed out": False} and clock.sleepers == 0 and timed_out.is_set()
        assert database.clock.wait(threading.Event(), 0) is False and clock.now() == 105.0
        with pytest.raises(activedb.BadArgument, match=r"ManualClock.wait\(wake, seconds\) takes a finite number"):
            database.clock.wait(threading.Event(), "5")


class EarlierProtocolClock:
    """A user's clock written for the earlier protocol: a relative ``wait`` and no ``wait_until``."""

    def now(self) -> float:
        return 0.0

    def wall(self) -> dt.datetime:
        return dt.datetime(2000, 1, 1, tzinfo=dt.timezone.utc)

    def wait(self, wake: threading.Event, seconds: float | None) -> bool:
        return wake.wait(seconds)


@pytest.mark.parametrize("give", [lambda clock: activedb.Config(clock=clock),
                                  lambda clock: composite.CompositionEngine(clock=clock)],
                         ids=["config", "composition_engine"])
def test_a_clock_of_the_earlier_protocol_is_refused_saying_to_add_wait_until(give):
    """A clock class of one's own with ``wait(wake, seconds)`` but no ``wait_until`` is no ``Clock`` any more: it is
    refused with an activedb error naming the method to add, not a TypeError that it is no clock."""
    with pytest.raises(activedb.ActivedbError, match=r"earlier Clock protocol.*give EarlierProtocolClock a method "
                                                     r"wait_until\(wake, deadline\)"):
        give(EarlierProtocolClock())
    assert not isinstance(EarlierProtocolClock(), Clock)
