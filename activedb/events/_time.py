"""Time of events from many producers (Liebig, Cilia, Buchmann, *Event Composition in Time-dependent
Distributed Systems*, §III.C–D; the design note ``README.md``, the formulas ``activedb/composite/README.md``).
References are :data:`Instant`\\ s (numbers of seconds or aware datetimes); α⁻/α⁺ are :data:`Duration`\\ s
(seconds or ``timedelta``).  Everything here is immutable and thread-safe.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import math
from dataclasses import dataclass, field
from typing import Iterable, TypeAlias, Union

from activedb._closedset import ClosedSet
from activedb.errors import BadArgument, InvalidTime, finite_number


class TimeUnit(ClosedSet):
    """The unit of a number of seconds' fractions: a numeric timestamp's since the Unix epoch
    (``EventMapping(ts_unit=...)``), a picture's time axis (``activedb.composite``'s ``plot(unit=...)``)."""

    S = "s"
    MS = "ms"
    US = "us"

    @property
    def per_second(self) -> int:
        """How many of this unit make a second."""
        return _PER_SECOND[self]


_PER_SECOND = {TimeUnit.S: 1, TimeUnit.MS: 1_000, TimeUnit.US: 1_000_000}


#: A point in time: a number of seconds (of a clock the producers share, the Unix epoch's by default) or an aware
#: datetime.  One interval, and any two times compared, hold one kind (a mix raises ``TypeError``).
Instant: TypeAlias = Union[float, dt.datetime]
#: A length of time: seconds or a ``timedelta`` (either goes with either kind of :data:`Instant`).
Duration: TypeAlias = Union[float, dt.timedelta]


class Order(enum.Enum):
    """How two timestamps are ordered: the first BEFORE the second, AFTER it, or UNCERTAIN (``⊥``)."""

    BEFORE = "before"
    AFTER = "after"
    UNCERTAIN = "uncertain"


def seconds(difference: Duration) -> float:
    """A difference of two times (a number or a ``timedelta``) in seconds."""
    if isinstance(difference, dt.timedelta):
        return difference.total_seconds()
    return float(difference)


#: An age beyond this many seconds (4,000 years) reaches back before anything a database recorded, and beyond what
#: PostgreSQL can subtract from ``now()`` (its calendar starts in 4713 BC): nothing is that old.
FOREVER_SECONDS = 4000 * 365.25 * 86400


def age_seconds(age: object, parameter: str, error: type[Exception]) -> float:
    """``age`` — how old something must be to be forgotten (a pruning call's ``older_than``, a retention), a
    ``timedelta`` or seconds — in seconds, or ``math.inf`` for "for ever": infinity, or any age beyond
    :data:`FOREVER_SECONDS` (``timedelta.max``), which no row is; a caller forgets nothing then, without asking
    PostgreSQL (which cannot compute ``now()`` minus such an age).  A negative age, NaN or no number raises ``error``
    naming ``parameter``."""
    try:
        number = seconds(age) if isinstance(age, (int, float, dt.timedelta)) and not isinstance(age, bool) \
            else math.nan
    except OverflowError:               # an int no float holds: as far as an infinity, of its sign
        number = math.inf if age > 0 else -math.inf  # type: ignore[operator]  # (an int)
    if not number >= 0:
        raise error(f"{parameter} takes a non-negative age (a timedelta or seconds; inf: forget nothing), "
                    f"got {age!r}")
    return number if number <= FOREVER_SECONDS else math.inf


def _mixed(a: Instant, b: Instant) -> TypeError:
    return TypeError(f"{a!r} and {b!r} mix a datetime and a number of seconds; give every time of one kind")


def earlier(a: Instant, b: Instant) -> bool:
    """``a < b`` for two instants of one kind (``TypeError`` for a datetime against a number)."""
    if isinstance(a, dt.datetime):
        if isinstance(b, dt.datetime):
            return a < b
    elif not isinstance(b, dt.datetime):
        return a < b
    raise _mixed(a, b)


def elapsed(start: Instant, end: Instant) -> float:
    """Seconds from ``start`` to ``end`` (negative if ``end`` is earlier), two instants of one kind."""
    if isinstance(end, dt.datetime):
        if isinstance(start, dt.datetime):
            return (end - start).total_seconds()
    elif not isinstance(start, dt.datetime):
        return float(end - start)
    raise _mixed(start, end)


def _shifted(instant: Instant, amount: Duration) -> Instant:
    """``instant + amount`` (``amount``: seconds or timedelta, either kind of instant)."""
    if isinstance(instant, dt.datetime):
        try:
            return instant + (amount if isinstance(amount, dt.timedelta) else dt.timedelta(seconds=amount))
        except OverflowError:
            raise InvalidTime(f"the accuracy {amount!r} takes {instant.isoformat()} beyond the datetimes Python holds "
                              f"(years 1 to 9999); give a smaller accuracy") from None
    return instant + (amount.total_seconds() if isinstance(amount, dt.timedelta) else amount)


def check_time(value: object, what: str) -> None:
    """Raise :class:`~activedb.errors.InvalidTime` (a ``ValueError``) unless ``value`` is a finite number of seconds
    or an aware datetime."""
    if isinstance(value, bool):
        raise InvalidTime(f"{what} {value!r} is a boolean, not a time")
    if isinstance(value, (int, float)):
        if not finite_number(value):
            raise InvalidTime(f"{what} {value!r} is not finite")
        return
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            raise InvalidTime(f"{what} {value.isoformat()} has no time zone; give aware datetimes (UTC)")
        return
    raise InvalidTime(f"{what} {value!r} is neither a number of seconds nor an aware datetime")


def _check_accuracy(value: object, what: str) -> None:
    number = isinstance(value, (int, float)) and not isinstance(value, bool) and finite_number(value)
    if not (number or isinstance(value, dt.timedelta)) or seconds(value) < 0:  # type: ignore[arg-type]
        raise InvalidTime(f"{what} must be a non-negative number of seconds (or timedelta), got {value!r}")


@dataclass(frozen=True, slots=True)
class AccuracyInterval:
    """``[lower, upper]``: the reference-time instants an event may have occurred at.

    Invariant: ``lower <= upper`` (checked); both of one kind (numbers or aware datetimes)."""

    lower: Instant
    upper: Instant

    def __post_init__(self) -> None:
        check_time(self.lower, "lower bound")
        check_time(self.upper, "upper bound")
        if isinstance(self.lower, dt.datetime) != isinstance(self.upper, dt.datetime):
            raise InvalidTime(f"interval [{self.lower!r}, {self.upper!r}] mixes datetimes and numbers")
        if earlier(self.upper, self.lower):
            raise InvalidTime(f"interval [{self.lower!r}, {self.upper!r}] ends before it begins")

    @classmethod
    def around(cls, reference: Instant, minus: Duration = 0.0, plus: Duration | None = None) -> "AccuracyInterval":
        """``[reference − minus, reference + plus]`` (``plus`` defaults to ``minus``: ``[ref ± α]``)."""
        check_time(reference, "reference time")
        plus = minus if plus is None else plus
        _check_accuracy(minus, "α⁻")
        _check_accuracy(plus, "α⁺")
        return cls(_shifted(reference, -minus), _shifted(reference, plus))

    @classmethod
    def point(cls, instant: Instant) -> "AccuracyInterval":
        return cls(instant, instant)

    @property
    def is_point(self) -> bool:
        return bool(self.lower == self.upper)

    def __str__(self) -> str:
        if self.is_point:
            return f"[{_show(self.lower)}]"
        return f"[{_show(self.lower)}, {_show(self.upper)}]"


def _show(value: object) -> str:
    if isinstance(value, dt.datetime):
        return value.isoformat()
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


@dataclass(frozen=True, slots=True)
class LocalClock:
    """How a producer's local clock readings order its own events (§III.D).

    ``detection_delay`` (ldd), ``granularity`` (G) and ``rate_adjustment`` (u) in seconds; ``drift`` (ρ)
    dimensionless.  All zero (the default) orders readings as numbers, strictly."""

    detection_delay: float = 0.0
    granularity: float = 0.0
    rate_adjustment: float = 0.0
    drift: float = 0.0

    def __post_init__(self) -> None:
        for name in ("detection_delay", "granularity", "rate_adjustment", "drift"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not finite_number(value) or value < 0:
                raise InvalidTime(f"LocalClock.{name} must be a non-negative number, got {value!r}")

    def orders(self, first: Instant, second: Instant) -> bool:
        """``lts(first) < lts(second)`` in the local timestamp order (certainly occurred before)."""
        distance = elapsed(first, second)
        return self.detection_delay < (distance - self.granularity - self.rate_adjustment) / (1.0 + self.drift)


EXACT_CLOCK = LocalClock()


@dataclass(frozen=True, slots=True)
class Timestamp:
    """An event's time: its accuracy interval, its producer, and optionally its local clock reading.

    Build with :meth:`at` (``[ref − α⁻, ref + α⁺]``), :meth:`between` (given bounds) or
    :meth:`point`.  ``reference`` is the clock reading the interval was built around (the
    middle for :meth:`between`); it is what a point-time consumer sees (see :attr:`point_value`)."""

    interval: AccuracyInterval
    producer: str | None = None
    local: Instant | None = None
    clock: LocalClock | None = field(default=None, compare=False)
    # None given (the default) is replaced by the interval's middle in __post_init__, so a Timestamp's reference
    # is always an Instant; typed as what readers get.
    reference: Instant = None  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if not isinstance(self.interval, AccuracyInterval):
            raise InvalidTime(f"Timestamp.interval must be an AccuracyInterval, got {self.interval!r}; build one "
                              "with Timestamp.at, Timestamp.between or Timestamp.point")
        if self.producer is not None and (not isinstance(self.producer, str) or not self.producer):
            raise BadArgument(f"Timestamp(producer={self.producer!r}): a producer is a non-empty string")
        if self.clock is not None and not isinstance(self.clock, LocalClock):
            raise BadArgument(f"Timestamp(clock={self.clock!r}): a clock is an activedb.events.LocalClock (or None)")
        if self.local is not None:
            check_time(self.local, "local timestamp")
        reference: Instant | None = self.reference     # (as given: None, the default, until set here)
        if reference is None:                          # the middle of the interval
            object.__setattr__(self, "reference", _shifted(self.lower, elapsed(self.lower, self.upper) / 2))

    @classmethod
    def at(cls, reference: Instant, accuracy: Duration = 0.0, *, minus: Duration | None = None,
           plus: Duration | None = None, producer: str | None = None, local: Instant | None = None,
           clock: LocalClock | None = None) -> "Timestamp":
        """``[reference − α⁻, reference + α⁺]``; ``accuracy`` gives both unless ``minus``/``plus`` do."""
        minus = accuracy if minus is None else minus
        plus = accuracy if plus is None else plus
        return cls(AccuracyInterval.around(reference, minus, plus), producer, local, clock, reference)

    @classmethod
    def between(cls, lower: Instant, upper: Instant, *, producer: str | None = None, local: Instant | None = None,
                clock: LocalClock | None = None) -> "Timestamp":
        return cls(AccuracyInterval(lower, upper), producer, local, clock)

    @classmethod
    def point(cls, instant: Instant, *, producer: str | None = None, local: Instant | None = None) -> "Timestamp":
        return cls(AccuracyInterval.point(instant), producer, local, None, instant)

    @property
    def lower(self) -> Instant:
        return self.interval.lower

    @property
    def upper(self) -> Instant:
        return self.interval.upper

    @property
    def is_point(self) -> bool:
        return self.interval.is_point

    @property
    def point_value(self) -> Instant:
        """The single instant of a point timestamp; raises ``ValueError`` for a proper interval (a
        point-time consumer would have to guess inside it)."""
        if not self.interval.is_point:
            raise ValueError(f"timestamp {self} is an interval, not a point; a total order of points cannot "
                             f"hold it without guessing — compose it with the interval time model")
        return self.interval.lower

    def __str__(self) -> str:
        who = f"@{self.producer}" if self.producer else ""
        local = f" lts={_show(self.local)}" if self.local is not None else ""
        return f"{self.interval}{who}{local}"


#: What :func:`as_timestamp` (and so :func:`order`, :func:`precedes`, :func:`hull`) takes: a timestamp, an
#: interval, or an instant (a point).
TimeLike: TypeAlias = Union[Timestamp, AccuracyInterval, Instant]


def as_timestamp(value: TimeLike, producer: str | None = None) -> Timestamp:
    """``value`` as a :class:`Timestamp`: one already (its producer filled in if it has none), an
    :class:`AccuracyInterval`, or a number/datetime (a point)."""
    if isinstance(value, Timestamp):
        if value.producer is None and producer is not None:
            return dataclasses.replace(value, producer=producer)
        return value
    if isinstance(value, AccuracyInterval):
        return Timestamp(value, producer)
    check_time(value, "timestamp")
    return Timestamp.point(value, producer=producer)


def local_order(a: Timestamp, b: Timestamp) -> Order | None:
    """The local timestamp order of two events of the same producer (None if it does not apply or
    cannot decide)."""
    if a.producer is None or a.producer != b.producer or a.local is None or b.local is None:
        return None
    clock = a.clock or b.clock or EXACT_CLOCK
    if clock.orders(a.local, b.local):
        return Order.BEFORE
    if clock.orders(b.local, a.local):
        return Order.AFTER
    return None


def order(a: TimeLike, b: TimeLike) -> Order:
    """The order of two timestamps: accuracy-interval order, refined by the local timestamp order for
    events of one producer.  Numbers and datetimes are points."""
    first, second = as_timestamp(a), as_timestamp(b)
    if earlier(first.interval.upper, second.interval.lower):
        return Order.BEFORE
    if earlier(second.interval.upper, first.interval.lower):
        return Order.AFTER
    local = local_order(first, second)
    return local if local is not None else Order.UNCERTAIN


def precedes(a: TimeLike, b: TimeLike) -> bool:
    """``a < b`` (certainly occurred before)."""
    return order(a, b) is Order.BEFORE


def uncertain(a: TimeLike, b: TimeLike) -> bool:
    """``a ⊥ b``."""
    return order(a, b) is Order.UNCERTAIN


def hull(stamps: Iterable[TimeLike], producer: str | None = None) -> Timestamp:
    """The smallest interval containing every given timestamp (a composite event's time: it began no
    earlier than the lowest bound and ended no later than the highest)."""
    given = [as_timestamp(stamp) for stamp in stamps]
    if not given:
        raise BadArgument("the hull of no timestamps is undefined: give hull() at least one timestamp")
    lower = min(stamp.lower for stamp in given)
    upper = max(stamp.upper for stamp in given)
    reference = max(stamp.reference for stamp in given)
    return Timestamp(AccuracyInterval(lower, upper), producer, None, None, reference)
