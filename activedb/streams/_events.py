"""Input events (:class:`StreamEvent`: application time ``ts`` from the source, system time
``sts`` stamped on arrival with ``time.perf_counter()`` unless the source set it, ``position``
on release — never mixed: windows and correctness use ``ts``, latencies ``sts``), query
outputs (:class:`Output`), dead letters (:class:`DeadLetter`), and the declared total order of
events (:func:`order_key`; the design note ``activedb/streams/README.md``, choice 3).
"""

from __future__ import annotations

import datetime as dt
import enum
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, TypeAlias, Union

from activedb.events import Instant, check_time


@dataclass(frozen=True, slots=True)
class StreamEvent:
    """One input event.  Immutable; safe to share between threads.

    ``origin`` is the caller's own reference (e.g. the raw row it came from); the
    engine hands it back in dead letters and never looks inside it.  ``ts`` is an
    :data:`~activedb.events.Instant` (the engine checks it on admission; a composition engine's
    inputs carry an :class:`~activedb.events.Timestamp`); attribute values are the application's,
    read as they were given (hence ``Any`` in the value position, as SQLAlchemy's row values)."""

    type: str
    ts: Any
    attributes: Mapping[str, Any] = field(default_factory=dict)
    stream: str | None = None
    origin: object = field(default=None, compare=False, repr=False)
    sts: float | None = field(default=None, compare=False, repr=False)
    position: int | None = field(default=None, compare=False)

    def __getitem__(self, attribute: str) -> Any:
        return self.attributes[attribute]

    def describe(self) -> str:
        """``type^ts`` as Active CEP writes events (``exit^2``)."""
        return f"{self.type}^{format_ts(self.ts)}"


def _slot_setters(cls: type) -> tuple[Callable[[object, object], None], ...]:
    return tuple(cls.__dict__[name].__set__ for name in cls.__dataclass_fields__)  # type: ignore[attr-defined]


_EVENT_SLOTS = _slot_setters(StreamEvent)


def make_event(type: str, ts: Instant, attributes: Mapping[str, object], stream: str | None, origin: object,
               sts: float | None,
               position: int | None,
               _new: Callable[[type[StreamEvent]], StreamEvent] = object.__new__) -> StreamEvent:
    """``StreamEvent(type, ts, attributes, stream, origin, sts, position)`` for the engine's own copies of events
    it has checked (admission, release): the slots set directly, without the frozen class's ``__setattr__``
    checks per field (this runs twice for every event)."""
    event = _new(StreamEvent)
    set_type, set_ts, set_attributes, set_stream, set_origin, set_sts, set_position = _EVENT_SLOTS
    set_type(event, type)
    set_ts(event, ts)
    set_attributes(event, attributes)
    set_stream(event, stream)
    set_origin(event, origin)
    set_sts(event, sts)
    set_position(event, position)
    return event


@dataclass(frozen=True, slots=True)
class Output:
    """A composite event: the output of query ``query``.  Immutable.

    ``ts`` = max of the constituents' ``ts`` (Active CEP App. B); ``sts`` = when the query
    produced it; ``position`` = the accepting event's position."""

    query: str
    ts: Any
    attributes: Mapping[str, Any]
    constituents: tuple[StreamEvent, ...]
    sts: float
    position: int

    @property
    def type(self) -> str:
        return self.query

    def __getitem__(self, attribute: str) -> Any:
        return self.attributes[attribute]

    def describe(self) -> str:
        return f"{self.query}^{format_ts(self.ts)}"


_OUTPUT_SLOTS = _slot_setters(Output)


def make_output(query: str, ts: Instant, attributes: Mapping[str, object], constituents: tuple[StreamEvent, ...],
                sts: float, position: int, _new: Callable[[type[Output]], Output] = object.__new__) -> Output:
    """``Output(query, ts, attributes, constituents, sts, position)`` made by the matcher: the slots set
    directly, as :func:`make_event` does."""
    output = _new(Output)
    for setter, value in zip(_OUTPUT_SLOTS, (query, ts, attributes, constituents, sts, position)):
        setter(output, value)
    return output


@dataclass(frozen=True)
class DeadLetter:
    """An event the engine did not process.  ``punctuation`` is set for late events (the
    released punctuation it was older than)."""

    event: StreamEvent
    reason: str
    punctuation: Punctuation | None = None


def event_row(event: StreamEvent, encode: Callable[[object], object] = lambda value: value) -> dict[str, object]:
    """A dead letter's row for ``event``: its fields, kept exactly (or each value ``encode``d: JSON-safe)."""
    return {"type": event.type, "ts": encode(event.ts), "stream": event.stream,
            "attributes": {key: encode(value) for key, value in dict(event.attributes).items()}}


def format_ts(ts: object) -> str:
    if isinstance(ts, dt.datetime):
        return ts.isoformat()
    if isinstance(ts, float) and ts.is_integer():
        return str(int(ts))
    return str(ts)


class _End(enum.Enum):
    """The punctuation that ends a stream: later than every timestamp (an enum: one object, also
    when unpickled)."""

    END_OF_STREAM = "END_OF_STREAM"

    def __repr__(self) -> str:
        return self.value

    __str__ = __repr__


END_OF_STREAM = _End.END_OF_STREAM
#: A punctuation: no event with a lower ``ts`` will come; an instant, or :data:`END_OF_STREAM` (later than all).
Punctuation: TypeAlias = Union[Instant, _End]


def ts_less(a: Punctuation, b: Punctuation) -> bool:
    """``a < b`` for timestamps and punctuations (END_OF_STREAM is the largest)."""
    if isinstance(b, _End):
        return not isinstance(a, _End)
    if isinstance(a, _End):
        return False
    # Two instants of one kind (admission checks every ts and punctuation); a mix raises TypeError here.
    return bool(a < b)  # type: ignore[operator]


def ts_extreme(values: Iterable[Punctuation], *, latest: bool) -> Punctuation | None:
    """The latest (or earliest) of ``values`` by :func:`ts_less`; the first one of equals (None: none)."""
    extreme = None
    for value in values:
        if extreme is None or (ts_less(extreme, value) if latest else ts_less(value, extreme)):
            extreme = value
    return extreme


def check_ts(ts: object) -> str:
    """The kind of timestamp (``"number"`` or ``"datetime"``); raises ValueError otherwise."""
    check_time(ts, "timestamp")
    return "datetime" if isinstance(ts, dt.datetime) else "number"


def order_key(event: StreamEvent, priority: float | None, tie: object) -> tuple[object, ...]:
    """The event's place in the declared total order (ts, type priority, tie key, content)."""
    rank = -priority if priority is not None else math.inf
    tie_part = _NO_TIE if tie is None else (0, tie)
    return (event.ts, rank, tie_part, event.type, _Content(event.attributes))


_NO_TIE = (1, 0)            # (one tuple for every event without a tie key)


class _Content:
    """The last part of an order key: the event's attributes, ordered as the text of their sorted items — made
    only when two keys tie on everything before it, not for every event admitted."""

    __slots__ = ("attributes", "_text")

    def __init__(self, attributes: Mapping[str, object]):
        self.attributes = attributes
        self._text: str | None = None

    def text(self) -> str:
        text = self._text
        if text is None:
            text = self._text = repr(sorted(self.attributes.items()))
        return text

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Content) and self.text() == other.text()

    def __lt__(self, other: "_Content") -> bool:
        return self.text() < other.text()

    def __gt__(self, other: "_Content") -> bool:
        return self.text() > other.text()

    def __hash__(self) -> int:
        return hash(self.text())
