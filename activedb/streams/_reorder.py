"""The reorder buffer and punctuations (:class:`ReorderBuffer`): admission, the bound (the minimum
over the engine's streams of their latest punctuation) and release in the declared total order,
strictly older than the bound — the design note ``activedb/streams/README.md``, choice 4.  No state of its own:
it works on the batch's :class:`~activedb.streams._state.Pending` (only the batch's thread touches it).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any, Callable, Iterable, Mapping, cast

from activedb.events import check_time
from activedb.store import Json
from activedb.streams import _persist
from activedb.streams._catalog import StreamSchema, fold
from activedb.streams._events import (END_OF_STREAM, DeadLetter, Punctuation, StreamEvent, check_ts, event_row,
                                      format_ts, make_event, order_key, ts_extreme, ts_less)
from activedb.streams._metrics import Metrics
from activedb.streams._state import Pending
from activedb.streams.errors import StreamError


class ReorderBuffer:
    """Admission, punctuation bounds and release for engine ``name``."""

    def __init__(self, name: str, metrics: Metrics, watermarks: Callable[[], Mapping[str, Punctuation]],
                 unkeyable: Callable[[StreamEvent], str | None] = lambda event: None,
                 unsaveable: Callable[[StreamEvent], str | None] | None = None):
        self.name = name
        self.metrics = metrics
        self.watermarks = watermarks        # every source's latest db.punctuate (db.punctuations.marks())
        self.unkeyable = unkeyable          # why an event cannot key its partitions and rows (None: it can)
        self.unsaveable = unsaveable        # why a durable engine's state cannot save an event (None: not asked)

    def admit_all(self, events: Iterable[object], now: float, pending: Pending,
                  streams: dict[str, StreamSchema]) -> list[DeadLetter]:
        """Put each event (or its mapping) into the buffer; returns the dead letters those that could not be
        became instead, in their order.  The buffer is sorted once for the whole list (its new entries come
        after the ones before them on equal keys: their arrival numbers are larger)."""
        letters: list[DeadLetter] = []
        added: list[tuple[tuple[object, ...], int, StreamEvent]] = []
        slots: list[int] = []               # per added event: how many letters came before it
        stream: StreamSchema
        event_type: str
        priority: float | None
        types: dict[tuple[str | None, Any], tuple[StreamSchema, str, float | None] | str] = {}
        for raw in events:
            event = raw
            if event.__class__ is not StreamEvent:
                if not isinstance(event, StreamEvent) and isinstance(event, Mapping):
                    event = _event_from_mapping(event)     # (checked below, as a StreamEvent given is)
                if not isinstance(event, StreamEvent):
                    letters.append(self._reject(Unreadable("?", None, {}, origin=event),
                                                f"rejected: not an event ({type(event).__name__}); give "
                                                f"StreamEvent objects or dicts with type, ts and attributes"))
                    continue
            malformed = _malformed(event)
            if malformed is not None:
                letters.append(self._reject(Unreadable("?", None, {}, origin=raw), malformed))
                continue
            kind_of = (event.stream, event.type) if isinstance(event.type, str) else None
            resolved = types.get(kind_of) if kind_of is not None else None
            if resolved is None:
                resolved = self._resolve(event, streams)
                if kind_of is not None:
                    types[kind_of] = resolved
            if resolved.__class__ is str:
                letters.append(self._reject(event, resolved))
                continue
            stream, event_type, priority = resolved  # type: ignore[str-unpack,assignment]  # (not a str)
            event = make_event(event_type, event.ts, event.attributes, stream.name, event.origin,   # replace(), faster
                               event.sts if event.sts is not None else now, event.position)
            try:
                ts = event.ts
                kind = "number" if ts.__class__ is float and ts - ts == 0.0 else check_ts(ts)   # (finite floats first)
            except ValueError as error:
                letters.append(self._reject(event, f"rejected: {error}"))
                continue
            if pending.time_kind is not None and kind != pending.time_kind:
                letters.append(self._reject(event, f"rejected: timestamp {event.ts!r} is a {kind}, but this "
                                                   f"engine's events carry {pending.time_kind}s"))
                continue
            released = pending.released
            if released is not None and ts_less(event.ts, released):
                self.metrics.add(late=1)
                letters.append(self._reject(event, self._late(event, released), punctuation=released))
                continue
            unkeyable = self.unkeyable(event)
            if unkeyable is not None:
                letters.append(self._reject(event, unkeyable))
                continue
            if self.unsaveable is not None:
                unsaveable = self.unsaveable(event)
                if unsaveable is not None:
                    letters.append(self._reject(event, unsaveable))
                    continue
            if stream.tie_key is None:
                tie = None
            else:
                try:
                    tie = stream.tie_key(event)
                except Exception as error:          # the application's code, as a rule's action: its event fails
                    letters.append(self._reject(event, f"rejected: the tie_key of stream {stream.name} raised "
                                                       f"{type(error).__name__}: {error} on {event.describe()}; "
                                                       f"fix the tie_key or the event"))
                    continue
            if pending.time_kind is None:
                pending.time_kind = kind            # (by the first event admitted: a dead letter fixes nothing)
            arrival = pending.arrivals
            pending.arrivals += 1
            added.append((order_key(event, priority, tie), arrival, event))
            slots.append(len(letters))
            pending.buffer_added[arrival] = event
        if added:
            self._refuse_incomparable(pending, added, slots, letters)
        return letters

    def _refuse_incomparable(self, pending: Pending, added: list[tuple[tuple[object, ...], int, StreamEvent]],
                             slots: list[int], letters: list[DeadLetter]) -> None:
        """Put ``added`` in the buffer, an event whose tie key does not compare with one it meets (a text and a
        number: sorting would fail every batch from now on) a dead letter instead, at its place among ``letters``
        (``slots``: how many letters came before each added event)."""
        refused = pending.buffer.add(added)
        if not refused:
            return
        first = added[0][1]                 # (the arrival numbers of ``added`` are consecutive)
        shift = 0
        for (key, arrival, event), error in refused:
            tie = cast(tuple[int, object], key[2])[1]       # (order_key's tie part: (0, tie))
            del pending.buffer_added[arrival]
            letters.insert(slots[arrival - first] + shift, self._reject(event, (
                f"rejected: the tie_key of stream {event.stream} gave {tie!r} for {event.describe()}, "
                f"which does not compare with the tie key of an event of the same time and priority ({error}); "
                f"make the tie_key return values of one kind (e.g. all texts)")))
            shift += 1

    def _resolve(self, event: StreamEvent, streams: dict[str, StreamSchema]
                 ) -> tuple[StreamSchema, str, float | None] | str:
        """``event``'s stream, declared type and that type's priority — or why the event is rejected."""
        if event.stream is None:
            if len(streams) != 1:
                return (f"rejected: the event names no stream and engine {self.name} has {len(streams)} "
                        f"({', '.join(streams)})")
            stream = next(iter(streams.values()))
        else:
            named = fold(event.stream, streams)     # (as a query's ON finds it: the design note's "Names in the text")
            found = streams[named] if named is not None else None
            if found is None:
                return f"rejected: no stream {event.stream!r} in engine {self.name} (streams: {', '.join(streams)})"
            stream = found
        if not isinstance(event.type, str) or not event.type:       # (as a batch's event without a type)
            named = (f"the name of one of stream {stream.name}'s event types ({', '.join(stream.types)})"
                     if stream.types is not None else "a non-empty text")
            return f"rejected: the event has no type (type {event.type!r}); give each event a type, {named}"
        event_type = stream.resolve_type(event.type)
        if event_type is None:
            return (f"rejected: stream {stream.name} has no event type {event.type!r} "
                    f"(types: {', '.join(stream.types or ())})")
        return stream, event_type, stream.priority(event_type)

    def _late(self, event: StreamEvent, released: Punctuation) -> str:
        """The reason of ``event``'s letter, older than the ``released`` punctuation.  After END_OF_STREAM (kept in a
        durable engine's saved state, so a later run of the stream meets it) it says how to start a new run."""
        late = f"late: {event.describe()} (ts {format_ts(event.ts)})"
        if released is END_OF_STREAM:
            return (f"{late} came after the end of the stream (the punctuation END_OF_STREAM), which engine "
                    f"{self.name} released; an ended stream takes no more events — to feed a new run of it, call "
                    f"engine.reset_state() first, or give the engine another name")
        return (f"{late} is older than the punctuation {format_ts(released)} already released by engine {self.name}; "
                f"every event before it has been processed, so this one can no longer be put in order")

    def _reject(self, event: StreamEvent, reason: str, punctuation: Punctuation | None = None) -> DeadLetter:
        self.metrics.add(dead_letters=1)
        return DeadLetter(event, reason, punctuation)

    @staticmethod
    def mark(pending: Pending) -> AdmissionMark:
        """What ``admit_all`` and ``bound`` change in ``pending``, to take them back with :meth:`undo`."""
        return AdmissionMark(pending.arrivals, pending.time_kind, dict(pending.punctuations))

    @staticmethod
    def undo(pending: Pending, mark: AdmissionMark) -> None:
        """``pending`` as it was at ``mark``: the events admitted since out of the buffer again, the kind and the
        punctuations as they were."""
        for arrival in range(mark.arrivals, pending.arrivals):
            pending.buffer_added.pop(arrival, None)
        pending.buffer.drop_from(mark.arrivals)
        pending.arrivals, pending.time_kind = mark.arrivals, mark.time_kind
        pending.punctuations = mark.punctuations

    def bound(self, pending: Pending, streams: Mapping[str, StreamSchema], punctuation: Punctuation | None,
              punctuations: Mapping[str, Punctuation] | None) -> Punctuation | None:
        given: dict[str, Punctuation] = {}
        spelled: dict[str, str] = {}
        for name, value in (punctuations or {}).items():
            # (a stream found as an event's stream= and a query's ON find it: the design note's "Names in the text")
            named = fold(name, streams) if isinstance(name, str) else None
            if named is None:
                raise StreamError(f"punctuations= names no stream {name!r} in engine {self.name} (streams: "
                                  f"{', '.join(streams)}); give one punctuation per stream of the engine")
            if named in given:
                raise StreamError(f"punctuations= names stream {named} twice ({' and '.join(map(repr, sorted((spelled[named], name))))})"
                                  f"; give one punctuation per stream of the engine")
            given[named], spelled[named] = value, name
        if punctuation is not None:
            for name in streams:
                given.setdefault(name, punctuation)
        marks = self.watermarks()
        for name in streams:
            source = self._source(name, marks)
            candidates = [self._checked(pending, value, where) for value, where in (
                (given.get(name), f"for stream {name}"),
                (marks.get(source) if source is not None else None, f"db.watermark({source!r}) of stream {name}"))
                if value is not None]
            if name in pending.punctuations:
                candidates.append(pending.punctuations[name])
            latest = ts_extreme(candidates, latest=True)
            if latest is not None:
                pending.punctuations[name] = latest
        if any(name not in pending.punctuations for name in streams):
            return pending.released
        bound = ts_extreme([pending.punctuations[name] for name in streams], latest=False)
        if bound is None or pending.released is not None and not ts_less(pending.released, bound):
            return pending.released
        return bound

    @staticmethod
    def _source(stream: str, marks: Mapping[str, Punctuation]) -> str | None:
        """The source of ``db.punctuate`` that is ``stream``: found as an event's ``stream=`` finds a stream (the one
        spelled so, else the one equal to it ignoring case); None if none is.  Several spelled otherwise but for
        case, none as the stream, is a StreamError: which one is meant is not known."""
        source = fold(stream, marks)
        alike = sorted(name for name in marks if name.casefold() == stream.casefold())
        if source is None and alike:
            raise StreamError(f"db.punctuate named stream {stream} both {' and '.join(map(repr, alike))}, which differ "
                              f"only in case: punctuate it as {stream!r} (that one is taken then)")
        return source

    def _checked(self, pending: Pending, punctuation: Punctuation, where: str) -> Punctuation:
        """``punctuation`` if it is END_OF_STREAM or a time of the engine's kind (it sets the kind when no event
        has yet); raises StreamError otherwise — it could not be compared with the events' timestamps."""
        if punctuation is END_OF_STREAM:
            return punctuation
        try:
            check_time(punctuation, "punctuation")
        except ValueError as error:
            problem = str(error)
        else:
            kind = "datetime" if isinstance(punctuation, dt.datetime) else "number"
            if pending.time_kind is None:
                pending.time_kind = kind
                return punctuation
            if kind == pending.time_kind:
                return punctuation
            problem = (f"punctuation {punctuation!r} is a {kind}, but engine {self.name}'s events carry "
                       f"{pending.time_kind}s")
        raise StreamError(f"{problem} ({where}); give a finite number of seconds or an aware datetime, of the kind "
                          f"of the events' timestamps, or END_OF_STREAM (a db.watermark comes from db.punctuate)")

    def release(self, pending: Pending, bound: Punctuation | None, now: float) -> list[StreamEvent]:
        if bound is None or bound is pending.released and not pending.buffer:
            return []
        pending.released = bound
        entries = pending.buffer.release(bound)
        if not entries:
            return []
        released = []
        ties = 0
        previous = None
        delay = 0.0
        for key, arrival, event in entries:
            if previous is not None and previous[:4] == key[:4]:
                ties += 1
            previous = key
            event = make_event(event.type, event.ts, event.attributes, event.stream, event.origin, event.sts,
                               pending.position)
            pending.position += 1
            released.append(event)
            if event.sts is not None:
                delay += now - event.sts
            pending.buffer_added.pop(arrival, None)
        self.metrics.add(released=len(released), reorder_delay=delay, ties_by_content=ties)
        return released


@dataclasses.dataclass(frozen=True)
class AdmissionMark:
    """A batch's admission state before a call's admission (:meth:`ReorderBuffer.mark`)."""

    arrivals: int
    time_kind: str | None
    punctuations: dict[str, Punctuation]


class Unreadable(StreamEvent):
    """The event of a dead letter for an input that is no well-formed event (no mapping of attributes, a stream
    that is no name, not an event at all): type "?", no time, no attributes; ``origin`` is what arrived, and the
    stored letter keeps that (:func:`letter_rows`)."""

    __slots__ = ()


def letter_rows(event: StreamEvent) -> tuple[object, dict[str, Json] | None]:
    """A dead letter's ``(row, shown)`` for ``event`` (:class:`activedb.deadletters.Letter`): the event's row, or
    for an :class:`Unreadable` what arrived — a mapping as given, a StreamEvent's fields as given, else the value —
    shown as ``jsonable`` shows it."""
    if not isinstance(event, Unreadable):
        return event_row(event), _persist.shown_row(event)
    arrived = event.origin
    if isinstance(arrived, StreamEvent):
        return ({"type": arrived.type, "ts": arrived.ts, "attributes": arrived.attributes, "stream": arrived.stream},
                None)
    if isinstance(arrived, Mapping):
        return dict(arrived), None
    return arrived, None


def _malformed(event: StreamEvent) -> str | None:
    """Why ``event`` (a StreamEvent built by the caller) cannot be put in order — its attributes are not a mapping
    or its stream is not a name — or None."""
    # (As the caller built the event, whatever StreamEvent's annotations say.)
    attributes: object = event.attributes
    stream: object = event.stream
    if attributes.__class__ is not dict and not isinstance(attributes, Mapping):
        return (f"rejected: the attributes of {event.type!r} at {event.ts!r} are a {type(attributes).__name__}, "
                f"not a mapping; give them as a dict of attribute names to values")
    if stream is not None and not isinstance(stream, str):
        return (f"rejected: the stream of {event.type!r} at {event.ts!r} is a {type(stream).__name__}, not a "
                f"name; give the name of a declared stream (or None)")
    return None


def _event_from_mapping(raw: Mapping[str, object]) -> StreamEvent:
    """The event a mapping describes (``type``, ``ts``, ``attributes`` — or, without that key, its other keys —
    and ``stream``), its fields as given: :func:`_malformed` and admission check them as they check a StreamEvent's
    (one check, one reason, whichever way the event came)."""
    if "attributes" in raw:
        attributes = raw["attributes"]
        if isinstance(attributes, Mapping):
            attributes = dict(attributes)
    else:
        attributes = {key: value for key, value in raw.items() if key not in ("type", "ts", "stream")}
    return StreamEvent(type=raw.get("type"), ts=raw.get("ts"),  # type: ignore[arg-type]  # (admission checks)
                       attributes=attributes, stream=raw.get("stream"), origin=raw)  # type: ignore[arg-type]
