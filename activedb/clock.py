"""activedb.clock — the one seam through which activedb reads the time of the process.

activedb keeps two kinds of time apart and never mixes them:

* **application time** — an event's ``ts`` and a punctuation (``db.punctuate``, Spark's watermark): windows
  (``WITHIN``), the declared order of stream transactions and lateness are decided by these alone.  They are
  values the application gives; no clock of the process is ever read for them (a test controls them by the
  events and punctuations it feeds, e.g. from a :class:`ManualClock`'s :meth:`~ManualClock.now`).
* **system time** — what the process measures: a composite engine's producer timeouts and a composite's
  ``sts`` (``activedb.composite``), the outbox's recovery passes, an ingestion's deadlines (how long a watched
  batch and its firings have run, ``activedb.ingest.Deadlines``), and whatever an application's rules read as
  "now" (``db.clock.now()``, ``db.clock.wall()``).  These read a :class:`Clock`: the :class:`SystemClock` by
  default, a :class:`ManualClock` in tests (``activedb.connect(clock=ManualClock())``; the pytest plugin's
  ``activedb_clock``), which moves only when told — Drools' pseudo-clock, for activedb.

Not behind the clock, on purpose: waits that bound how long a thread waits for another (lock waits,
``handle.result(timeout)``, ``wait_idle``) and the jittered back-off before a re-run — a manual clock there
would turn a failing test into a hanging one; figures that measure the process itself (phase timings, stream
latencies); and timestamps compared with the server's (the transaction log's ``began_at``, change capture's
lag), which must be the server's calendar.

Sleeping on a clock is until a deadline on its own :meth:`~Clock.now` scale (:meth:`Clock.wait_until`), never for
a number of seconds: a caller with a deadline — the outbox's rule-deadline watcher and recovery passes, an
ingestion's :class:`~activedb.ingest.Deadlines` — reads ``now()``, decides when to wake, and sleeps until then.  A
relative sleep would start counting when the sleep begins, so a :class:`ManualClock` advanced by a test between the
caller's read and its sleep would move the caller's deadline later by the advance (the watcher missing its deadline,
the test hanging); slept until the deadline, an advance past it before the sleep ends the sleep at once.  A test
still waits for a sleeper (``clock.sleepers``) before advancing when it means the advance to find the caller
asleep, but no longer to keep the caller's deadline where it was.

:class:`SystemClock` and :class:`ManualClock` also keep ``wait(wake, seconds)``, the relative sleep of the earlier
protocol, for an application's own code that calls it (``db.clock.wait(...)``): ``wait_until(wake, now() +
seconds)``, counted from its own reading of :meth:`~Clock.now`.  It is a convenience of these two classes, not part
of :class:`Clock`: activedb never calls it, and a clock of one's own need not have it.

A clock of one's own implements :class:`Clock`: ``now``, ``wall`` and ``wait_until``.  A class written for the
earlier protocol — ``wait(wake, seconds)``, relative, and no ``wait_until`` — is refused where a clock is given
with an activedb error saying to add ``wait_until`` (:func:`outdated_clock`): a
:class:`~activedb.errors.BadArgument` from ``connect(clock=...)`` and ``Config``, a ``CompositeError`` from a
``CompositionEngine``, a ``DatabaseFixtureError`` from the pytest plugin's mark.

Thread-safety: every clock may be used from any thread.  ``ManualClock._mutex`` is a leaf.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from typing import Protocol, runtime_checkable

from activedb.errors import BadArgument, finite_number

__all__ = ["Clock", "ManualClock", "SystemClock", "SYSTEM_CLOCK"]

_UTC = dt.timezone.utc


@runtime_checkable
class Clock(Protocol):
    """What activedb asks of a clock (see the module docstring for what reads one)."""

    def now(self) -> float:
        """Seconds on a monotonic scale (its origin means nothing): for durations and timeouts."""
        ...

    def wall(self) -> dt.datetime:
        """The time of day, an aware ``datetime`` in UTC."""
        ...

    def wait_until(self, wake: threading.Event, deadline: float | None) -> bool:
        """Block until ``wake`` is set (True) or this clock's :meth:`now` has reached ``deadline`` (False: also at
        once if it has already); None: no time limit.  ``deadline`` is on :meth:`now`'s scale, so time that passes
        between the caller's reading of :meth:`now` and this call counts.  A clock may set ``wake`` itself when the
        time has come (a manual clock wakes its waiters that way): a caller that waits again clears it first."""
        ...


class SystemClock:
    """The process's clocks: ``time.monotonic`` and the system's calendar.  Thread-safe."""

    def now(self) -> float:
        return time.monotonic()

    def wall(self) -> dt.datetime:
        return dt.datetime.now(_UTC)

    def wait_until(self, wake: threading.Event, deadline: float | None) -> bool:
        if deadline is None:
            return wake.wait()
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return wake.is_set()
            # (no thread wait may be longer than TIMEOUT_MAX: a later deadline is slept towards in steps)
            if wake.wait(min(remaining, threading.TIMEOUT_MAX)):
                return True

    def wait(self, wake: threading.Event, seconds: float | None) -> bool:
        """Block until ``wake`` is set (True) or ``seconds`` have passed (False); None: no time limit (see
        :func:`_wait_for`).  A convenience, not part of :class:`Clock`."""
        return _wait_for(self, wake, seconds)

    def __repr__(self) -> str:
        return "SystemClock()"


#: The default clock of every ``Database`` and engine.
SYSTEM_CLOCK = SystemClock()

#: Where a :class:`ManualClock`'s calendar starts unless told (a round date: easy to read in a failing test).
DEFAULT_WALL = dt.datetime(2000, 1, 1, tzinfo=_UTC)


@dataclass(eq=False)
class _Sleeper:
    deadline: float
    wake: threading.Event
    expired: bool = False


class ManualClock:
    """A clock that moves only when told (:meth:`advance`), for tests: ``now()`` starts at ``start`` and
    ``wall()`` at ``wall`` (default 2000-01-01 UTC); both move together.  Times are floats: a ``Decimal`` or
    ``Fraction`` given for ``start`` or to :meth:`advance` is taken as the float nearest it.  A thread in
    :meth:`wait_until` wakes when the clock is advanced to its deadline (or when its event is set), never by itself;
    :attr:`sleepers` tells a test how many wait (``wait_until(lambda: clock.sleepers == 1)`` before it advances).

    Thread-safety: ``_mutex`` (a leaf) protects ``_now`` and ``_sleepers``.
    """

    def __init__(self, start: float | Decimal | Fraction = 0.0, *, wall: dt.datetime = DEFAULT_WALL) -> None:
        if not isinstance(wall, dt.datetime) or wall.tzinfo is None:
            shown = wall.isoformat() if isinstance(wall, dt.datetime) else repr(wall)
            raise BadArgument(f"ManualClock(wall=...) needs an aware datetime (UTC), got {shown}")
        start = _finite_seconds(start, "ManualClock(start=...)", "a finite number of seconds")
        self._mutex = threading.Lock()
        self._start = start
        self._now = start
        try:
            self._wall = wall.astimezone(_UTC)
        except OverflowError:
            raise BadArgument(f"ManualClock(wall={wall.isoformat()}) is past the end of the calendar (year 9999) in "
                              "UTC; give an earlier wall") from None
        self._sleepers: list[_Sleeper] = []

    def now(self) -> float:
        with self._mutex:
            return self._now

    def wall(self) -> dt.datetime:
        with self._mutex:
            return self._wall + dt.timedelta(seconds=self._now - self._start)

    def advance(self, seconds: float | Decimal | Fraction | dt.timedelta) -> float:
        """Move the clock forward by ``seconds`` (a number — a ``Decimal`` or ``Fraction`` as the float nearest
        it — or a ``timedelta``), wake the waiters whose time
        has come, and return the new :meth:`now`."""
        amount = _finite_seconds(seconds.total_seconds() if isinstance(seconds, dt.timedelta) else seconds,
                                 "ManualClock.advance(...)", "a finite number of seconds or a timedelta")
        if not amount >= 0:
            raise BadArgument(f"ManualClock.advance: a clock does not move backwards; advance by a non-negative amount, "
                              f"not {seconds!r}")
        with self._mutex:
            try:        # (wall() must stay a datetime: refused before anything changes)
                self._wall + dt.timedelta(seconds=self._now + amount - self._start)
            except OverflowError:
                wall = self._wall + dt.timedelta(seconds=self._now - self._start)
                left = (dt.datetime.max.replace(tzinfo=_UTC) - wall).total_seconds()
                raise BadArgument(f"ManualClock.advance: advancing by {seconds!r} takes wall() past the end of the "
                                  f"calendar (year 9999); advance by at most {left!r} seconds") from None
            self._now += amount
            now = self._now
            due = [sleeper for sleeper in self._sleepers if sleeper.deadline <= now]
            for sleeper in due:
                sleeper.expired = True
                self._sleepers.remove(sleeper)
        for sleeper in due:
            sleeper.wake.set()
        return now

    @property
    def sleepers(self) -> int:
        """How many threads wait in :meth:`wait_until` for the clock to move."""
        with self._mutex:
            return len(self._sleepers)

    def wait_until(self, wake: threading.Event, deadline: float | None) -> bool:
        """Block until ``wake`` is set (True) or the clock has been advanced to ``deadline`` (False: ``wake`` is
        then set by :meth:`advance`; at once if :meth:`now` is there already — also when an advance came after the
        caller read :meth:`now` and before this call)."""
        if deadline is None:
            return wake.wait()
        with self._mutex:
            if wake.is_set():
                return True
            sleeper = _Sleeper(float(deadline), wake)
            if sleeper.deadline <= self._now:
                return False
            self._sleepers.append(sleeper)
        wake.wait()
        with self._mutex:
            if sleeper in self._sleepers:
                self._sleepers.remove(sleeper)
            return not sleeper.expired

    def wait(self, wake: threading.Event, seconds: float | None) -> bool:
        """Block until ``wake`` is set (True) or the clock has been advanced by ``seconds`` from its :meth:`now`
        as this call reads it (False); None: no time limit (see :func:`_wait_for`).  A convenience, not part of
        :class:`Clock`."""
        return _wait_for(self, wake, seconds)

    def __repr__(self) -> str:
        if "_mutex" not in vars(self):        # (its __init__ raised: seen in a traceback's locals, a debugger)
            return "ManualClock(<not made>)"
        return f"ManualClock(now={self.now()!r}, wall={self.wall().isoformat()})"


def outdated_clock(value: object, given: str) -> str | None:
    """What to tell the user who gave ``value`` as ``given`` (e.g. ``"Config(clock=...)"``) if it is a clock written
    for activedb's earlier :class:`Clock` protocol — ``now``, ``wall`` and a relative ``wait(wake, seconds)``, but no
    ``wait_until`` —; None otherwise (a clock, or something that is no clock at all, which its caller refuses as it
    does).  The callers raise their :class:`~activedb.errors.ActivedbError` with it."""
    if isinstance(value, (Clock, type)) or not all(callable(getattr(value, name, None))
                                                   for name in ("now", "wall", "wait")):
        return None
    return (f"{given}: {value!r} is a clock of activedb's earlier Clock protocol: it has wait(wake, seconds), a "
            f"relative sleep, but not wait_until(wake, deadline). activedb now sleeps until a deadline on the clock's "
            f"own now() scale, so that a clock moved between reading now() and sleeping still wakes the sleeper: give "
            f"{type(value).__name__} a method wait_until(wake, deadline) that returns True once wake is set and False "
            f"once now() has reached deadline (None: no limit), as activedb.clock.Clock says, or use ManualClock or "
            f"SystemClock")


def _wait_for(clock: Clock, wake: threading.Event, seconds: float | None) -> bool:
    """The built-in clocks' relative sleep: ``clock.wait_until(wake, clock.now() + seconds)`` (None: no time limit; a
    negative number of seconds as 0 — ``wake``'s state at once, as ``threading.Event.wait`` gives it).  A ``Decimal``
    or ``Fraction`` is taken as the float nearest it; anything else that is no finite number is a
    :class:`BadArgument` saying what ``wait`` takes."""
    if seconds is None:
        return clock.wait_until(wake, None)
    amount = _finite_seconds(seconds, f"{type(clock).__name__}.wait(wake, seconds)",
                             "a finite number of seconds, or None for no time limit")
    return clock.wait_until(wake, clock.now() + max(0.0, amount))


def _finite_seconds(value: object, given: str, what: str) -> float:
    """``value`` as a float of seconds; :class:`BadArgument` (saying ``given`` takes ``what``) unless it is a number
    (not a bool) that a float holds finitely — a NaN or an infinity would stop the clock's arithmetic for good.  A
    ``Decimal`` or ``Fraction`` is the float nearest it (a signalling NaN, or one past a float's range, is refused)."""
    if isinstance(value, (Decimal, Fraction)):
        try:
            value = float(value)
        except (ValueError, OverflowError):        # (a signalling NaN; a Fraction past a float's range)
            pass
    if isinstance(value, (int, float)) and not isinstance(value, bool) and finite_number(value):
        return float(value)
    raise BadArgument(f"{given} takes {what}, not {value!r}")
