"""Saving the engine's state in the batch's own transaction (exactly once across restarts):
:func:`save` writes what a batch changed into ``activedb_stream_state`` with ``tx.write`` /
``tx.delete``, :func:`load` reads it back for a new engine object.  The layout and the
protocol are in the design note ``activedb/streams/README.md``, "Exactly once".
"""

from __future__ import annotations

import contextlib
import datetime as dt
import decimal
import heapq
import json
from typing import TYPE_CHECKING, Any, Callable, ContextManager, Iterator, Mapping

import sqlalchemy as sa

from activedb.store import Json, json_problem, jsonable, text_problem
from activedb.streams._events import (END_OF_STREAM, Punctuation, StreamEvent, _End, event_row, order_key, ts_extreme,
                                      ts_less)
from activedb.streams._matcher import PartitionState
from activedb.streams.errors import StreamStateError

if TYPE_CHECKING:  # pragma: no cover
    from activedb._handle import DatabaseHandle
    from activedb.store import Key
    from activedb.streams._engine import StreamEngine
    from activedb.streams._state import Pending, State
    from activedb.txn import Transaction

TABLE = "activedb_stream_state"


def encode_value(value: object, tuples: bool = True) -> Json:
    """``value`` as the state saves it (:func:`decode_value` gives it back); ``tuples=False``: a tuple as a list
    (a dead letter's ``raw``, plain JSON), not tagged — a tuple must come back a tuple, as it may key a partition."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if value is END_OF_STREAM:
        return {"$end": True}
    if isinstance(value, dt.datetime):
        return {"$dt": value.isoformat()}
    if isinstance(value, dt.date):
        return {"$d": value.isoformat()}
    if isinstance(value, decimal.Decimal):
        return {"$dec": str(value)}
    if isinstance(value, list) or isinstance(value, tuple) and not tuples:
        return [encode_value(item, tuples) for item in value]
    if isinstance(value, tuple):
        return {"$tup": [encode_value(item) for item in value]}
    if isinstance(value, dict):
        return {"$map": [[key, encode_value(item, tuples)] for key, item in value.items()]}
    raise StreamStateError(f"cannot save {value!r} ({type(value).__name__}) in the engine's state; event "
                           f"attributes must be numbers, text, booleans, dates or datetimes — or use "
                           f"StreamEngine(durable=False)")


def unsaveable(event: StreamEvent, engine: str) -> str | None:
    """Why durable engine ``engine``'s state could not save ``event`` (an attribute :func:`encode_value` refuses or
    JSON cannot hold), or None — asked when the event is admitted, so that it is a dead letter rather than a
    batch that fails when its state is saved, every retry alike."""
    for name, value in event.attributes.items():
        if name.__class__ is not str or not name.isascii() or "\x00" in name:
            problem = f"{type(name).__name__}, no text" if not isinstance(name, str) else text_problem(name)
            if problem is not None:
                return (f"rejected: attribute name {name!r} of {event.describe()} cannot be saved in durable engine "
                        f"{engine}'s state ({problem}); give attributes text names, or use StreamEngine(durable=False)")
        kind = value.__class__
        if kind is int or kind is bool or value is None or kind is dt.datetime or (
                kind is float and value - value == 0.0) or (   # (the plain values first; NaN and inf fail)
                kind is str and value.isascii() and "\x00" not in value):
            continue
        try:
            problem = json_problem(encode_value(value))
        except StreamStateError:
            problem = "not a value the state saves"
        if problem is not None:
            return (f"rejected: attribute {name!r} of {event.describe()} is {value!r} ({kind.__name__}), which "
                    f"cannot be saved in durable engine {engine}'s state ({problem}); give numbers, text, "
                    f"booleans, dates or datetimes (lists and dicts of them), or use StreamEngine(durable=False)")
    return None


def shown_row(event: StreamEvent) -> dict[str, Json]:
    """A dead letter's ``raw`` for ``event``: its row with each value as :func:`shown_value` shows it, and the whole
    as :func:`~activedb.store.jsonable` shows it if PostgreSQL still cannot store it (a type, a stream or an
    attribute's name with a NUL or a lone surrogate)."""
    row = event_row(event, shown_value)
    return row if json_problem(row) is None else jsonable(row)  # type: ignore[return-value]  # (event_row's values)


def shown_value(value: object) -> Json:
    """``value`` as a dead letter's ``raw`` shows it: as the engine's state saves it, or — a value the state cannot
    save or JSON cannot hold (a set, an object, a NaN) — as :func:`~activedb.store.jsonable` shows it (a dead
    letter must be recorded whatever its event carries)."""
    try:
        encoded = encode_value(value, tuples=False)
    except StreamStateError:
        return jsonable(value)
    return encoded if json_problem(encoded) is None else jsonable(value)


_DECODERS: dict[str, Callable[[Any], object]] = {"$dt": dt.datetime.fromisoformat, "$d": dt.date.fromisoformat, "$dec": decimal.Decimal,
             "$end": lambda _: END_OF_STREAM,
             "$tup": lambda items: tuple(decode_value(item) for item in items),
             "$map": lambda pairs: {key: decode_value(item) for key, item in pairs}}


def decode_value(value: Json) -> object:
    if isinstance(value, list):
        return [decode_value(item) for item in value]
    if isinstance(value, dict):
        for tag, decode in _DECODERS.items():
            if tag in value:
                return decode(value[tag])
    return value


# Reading a saved row: each part checked for the kind it must be (a TypeError, which ``_readable`` reports with the row).

def _text(value: Json) -> str:
    if isinstance(value, str):
        return value
    raise TypeError(f"{value!r} is not text")


def _whole(value: Json) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise TypeError(f"{value!r} is not a whole number")


def _items(value: Json) -> list[Json]:
    if isinstance(value, list):
        return value
    raise TypeError(f"{value!r} is not a list")


def _fields(value: Json) -> dict[str, Json]:
    if isinstance(value, dict):
        return value
    raise TypeError(f"{value!r} is not an object")


def _punctuation(value: object) -> Punctuation:
    if isinstance(value, (int, float, dt.datetime, _End)) and not isinstance(value, bool):
        return value
    raise TypeError(f"{value!r} is not a punctuation")


def encode_event(event: StreamEvent) -> list[Json]:
    return [event.type, encode_value(event.ts), event.stream, event.position,
            {key: encode_value(value) for key, value in dict(event.attributes).items()}]


def decode_event(data: Json) -> StreamEvent:
    """An event saved by :func:`encode_event` (or as the earlier ``{"t", "ts", "s", "p", "a"}`` object)."""
    kind, ts, stream, position, attributes = (data["t"], data["ts"], data["s"], data["p"], data["a"]) \
        if isinstance(data, dict) else _items(data)
    return StreamEvent(type=_text(kind), ts=decode_value(ts), stream=None if stream is None else _text(stream),
                       position=None if position is None else _whole(position),
                       attributes={key: decode_value(value) for key, value in _fields(attributes).items()})


ABSENT: dict[str, Json] = {"$absent": True}        # an attribute the event lacks (encode_value never gives it)


def encode_events(events: list[StreamEvent]) -> dict[str, Json]:
    """``events`` as columns, one list per field and per attribute: a batch's chunk of the buffer is
    then about two thirds of the JSON (and of the quotes the flush escapes) of one list per event.  A column
    whose values are all one value is that value once (``{"$all": value}``): the stream of a one-stream
    engine, the positions of events not yet released."""
    names = dict.fromkeys(name for event in events for name in event.attributes)
    plain = _PLAIN          # (values of these classes are their own encoding: no call for them)
    return {"t": _column([event.type for event in events]),
            "ts": _column([ts if (ts := event.ts).__class__ in plain else encode_value(ts) for event in events]),
            "s": _column([event.stream for event in events]), "p": _column([event.position for event in events]),
            "a": {name: _column([(value if (value := attributes[name]).__class__ in plain else encode_value(value))
                                 if name in (attributes := event.attributes) else ABSENT
                                 for event in events]) for name in names}}


_PLAIN = frozenset({str, int, float, bool, type(None)})


def _column(values: list[Json]) -> Json:
    """``values``, or ``{"$all": value}`` if they are all one text or all null (timestamps never are: a chunk's
    ``ts`` column is always the list whose length is the number of events)."""
    first = values[0] if values else None
    if len(values) > 1 and (first is None or first.__class__ is str) and values.count(first) == len(values):
        return {"$all": first}
    return values


def _expand(column: Json, count: int) -> list[Json]:
    return [column["$all"]] * count if isinstance(column, dict) else _items(column)


def decode_events(data: dict[str, Json]) -> list[StreamEvent]:
    count = len(_items(data["ts"]))
    columns = [(name, _expand(values, count)) for name, values in _fields(data["a"]).items()]
    return [StreamEvent(type=_text(kind), ts=decode_value(ts), stream=None if stream is None else _text(stream),
                        position=None if position is None else _whole(position),
                        attributes={name: decode_value(values[index]) for name, values in columns
                                    if values[index] != ABSENT})
            for index, (kind, ts, stream, position) in enumerate(zip(
                *(_expand(data[field], count) for field in ("t", "ts", "s", "p"))))]


class BufferChunks:
    """The saved chunks of the buffer (the design note's "Exactly once": one ``buffer`` row per batch with the events
    it left buffered), each by the latest timestamp of its events: ``latest[item]``.  :meth:`release` finds the chunks
    a released punctuation empties by a heap of those timestamps — a look at each chunk released and one more, not
    at every chunk saved.

    Invariant: every chunk in ``latest`` whose latest timestamp is not None has one entry in ``_heap``, and the heap
    holds no other.  (Timestamps of one engine compare: admission gives them one kind; ties order by item.)
    Mutated only by :func:`save` and :func:`load`, as :class:`PartitionRows`: a batch whose transaction aborts after
    its save changed them makes the engine load its state again.  Not locked: the engine has one batch in progress
    at a time, whose save alone changes it."""

    def __init__(self) -> None:
        self.latest: dict[str, Punctuation | None] = {}
        self._heap: list[tuple[Punctuation, str]] = []

    def add(self, item: str, latest: Punctuation | None) -> None:
        """Chunk ``item`` is saved, its latest event at ``latest`` (None: it has none, and is never released)."""
        self.latest[item] = latest
        if latest is not None:
            heapq.heappush(self._heap, (latest, item))

    def release(self, released: Punctuation) -> list[str]:
        """Forget the chunks whose every event is older than ``released`` (released: the buffer holds none of them
        any more) and return their items, to delete."""
        heap, gone = self._heap, []
        while heap and ts_less(heap[0][0], released):
            _, item = heapq.heappop(heap)
            del self.latest[item]
            gone.append(item)
        return gone


class PartitionRows:
    """Which saved rows hold the partitions' states (the design note's "Exactly once": one ``partitions`` row per
    batch with the partitions it changed, each row kept while it holds a partition's latest state).

    ``latest[(query, key)]`` is ``(item, emptied)``: the row with the partition's latest entry, and whether that
    entry says the partition became empty (its state None).  ``holders[(query, key)]``: the rows with an entry
    for it; ``entries[item]``: the partitions with an entry in that row.  ``legacy``: partitions whose state is
    in a row of the earlier layout (kind ``partition``, one row per partition), rewritten on their next change.

    Invariant: a row is needed while one of its entries is its partition's latest and is a state, or is an
    emptied entry with an older row still holding an entry for the partition (which loading would otherwise
    take); every other row is deleted by the save that makes it so.  Mutated only by :func:`save` and
    :func:`load`; a batch whose transaction aborts after saving makes the engine load its state again."""

    def __init__(self) -> None:
        self.latest: dict[tuple[str, Key], tuple[str, bool]] = {}
        self.holders: dict[tuple[str, Key], set[str]] = {}
        self.entries: dict[str, set[tuple[str, Key]]] = {}
        self.legacy: set[tuple[str, Key]] = set()
        # Invariant: no row added (saved or loaded) has an item after ``newest`` (loading applies rows by item).
        self.newest: str | None = None

    def next_item(self, position: int) -> str:
        """The item of a new row saved at release position ``position``: the position (12 digits), or — a row was
        saved at that position already (a batch that released nothing and pruned, or a second save in one
        transaction) — that row's item with a serial after a dot, so that the new row neither overwrites it nor
        sorts before it (``.`` sorts before every digit; the serial has 6 digits)."""
        item = f"{position:012d}"
        newest = self.newest
        if newest is None or newest < item:
            return item
        base, _, serial = newest.partition(".")
        return f"{base}.{int(serial or 0) + 1:06d}"

    def add(self, item: str, partitions: Mapping[tuple[str, Key], PartitionState | None]) -> set[str]:
        """Row ``item`` holds the latest entry of each of ``partitions`` (a state, or None: emptied).  Returns the
        older rows those partitions had entries in (the rows that may no longer be needed)."""
        older: set[str] = set()
        for partition, state in partitions.items():
            holders = self.holders.setdefault(partition, set())
            older |= holders
            holders.add(item)
            self.latest[partition] = (item, state is None)
        self.entries[item] = set(partitions)
        if self.newest is None or self.newest < item:
            self.newest = item
        return older

    def record(self, item: str, partitions: Mapping[tuple[str, Key], PartitionState | None]
               ) -> tuple[dict[tuple[str, Key], PartitionState | None], list[str]]:
        """A new row ``item`` with the latest entries of ``partitions`` (:meth:`add`): returns the entries it must
        hold — none: the row is not written — and the older rows no longer needed (:meth:`unneeded`), to delete.

        An emptied entry whose partition no older row holds once those are gone is needed by nothing (the
        invariant): it is left out, not written — a partition pruned in the batch after the one that saved it, with
        every other partition of that row, costs the delete of that row and nothing more."""
        gone = self.unneeded(self.add(item, partitions) - {item})
        if item in gone:                                  # (every entry of it was such an emptied one)
            gone.remove(item)
            return {}, gone
        kept = self.entries[item]
        for partition, state in partitions.items():
            if state is None and self.holders[partition] == {item}:
                kept.discard(partition)
                del self.holders[partition], self.latest[partition]
        return {partition: partitions[partition] for partition in partitions if partition in kept}, gone

    def unneeded(self, candidates: set[str]) -> list[str]:
        """Forget every row among ``candidates`` that is no longer needed (the class invariant), and the rows that
        are no longer needed once those are gone; returns their items, to delete."""
        gone: list[str] = []
        queue = list(candidates)
        while queue:
            item = queue.pop()
            partitions = self.entries.get(item)
            if partitions is None or any(self._needs(item, partition) for partition in partitions):
                continue
            gone.append(item)
            del self.entries[item]
            for partition in partitions:
                holders = self.holders[partition]
                holders.discard(item)
                latest, _ = self.latest.get(partition, (None, True))
                if latest == item:                  # an emptied entry nothing older needed
                    del self.latest[partition]
                elif latest is not None:
                    queue.append(latest)           # its emptied entry may be needed no more
                if not holders:
                    del self.holders[partition]
        return gone

    def _needs(self, item: str, partition: tuple[str, Key]) -> bool:
        latest, emptied = self.latest[partition]
        return latest == item and (not emptied or len(self.holders[partition]) > 1)


def _partition_item(partition: tuple[str, Key]) -> str:
    """The item of ``partition``'s row in the earlier layout (kind ``partition``)."""
    query, key = partition
    return json.dumps([query, _encode_key(key)], separators=(",", ":"))


def _encode_states(recorded: Mapping[tuple[str, Key], PartitionState | None]) -> dict[str, object]:
    """A ``partitions`` row's value: the events of every state once, as columns (``encode_events``), and an entry
    ``[query, key, {"b": buffers, "r": runs}]`` per partition, each buffer and run a list of indices into those
    events (or ``[query, key, null]``: emptied)."""
    indices: dict[int, int] = {}        # id(event) -> its index (the states hold the events while this runs)
    events: list[StreamEvent] = []

    def index(event: StreamEvent) -> int:
        found = indices.get(id(event))
        if found is None:
            found = indices[id(event)] = len(events)
            events.append(event)
        return found

    entries = []
    for (query, key), state in recorded.items():
        encoded = None if state is None else {"b": [[index(event) for event in buffer] for buffer in state.buffers],
                                              "r": [[index(event) for event in run] for run in state.runs]}
        entries.append([query, _encode_key(key), encoded])
    return {"events": encode_events(events), "entries": entries}


def _decode_entry(saved: Json, events: list[StreamEvent]) -> PartitionState | None:
    """One entry's state: by indices into the row's ``events``, or (rows saved before) with its events inline."""
    if saved is None:
        return None
    entry = _fields(saved)
    if "b" in entry:
        return PartitionState(*(tuple(tuple(events[_whole(index)] for index in _items(part)) for part in _items(entry[name]))
                                for name in ("b", "r")))
    return _decode_state(entry)


def _decode_state(value: dict[str, Json]) -> PartitionState:
    """A state with its events inline (rows of the layouts before shared events; ``decode_event``)."""
    return PartitionState(*(tuple(tuple(decode_event(event) for event in _items(part)) for part in _items(value[name]))
                            for name in ("buffers", "runs")))


def save(engine: StreamEngine, tx: Transaction, pending: Pending) -> int:
    """Write what ``pending`` changed since its last save into ``tx`` (see the module docstring): the partitions set
    since then (``Pending.unsaved``), not every one its transaction's earlier batches set.  Returns how many
    partitions it looked at."""
    name = engine.name
    chunks = pending.base.chunks
    for item in chunks.release(pending.released) if pending.released is not None else ():
        tx.delete(TABLE, (name, "buffer", item))       # every event of the chunk was released
        pending.saved_rows = True
    if pending.buffer_added:
        item = f"{min(pending.buffer_added):012d}"
        tx.write(TABLE, (name, "buffer", item),
                 value={"arrivals": list(pending.buffer_added), **encode_events(list(pending.buffer_added.values()))})
        chunks.add(item, ts_extreme((event.ts for event in pending.buffer_added.values()), latest=True))
        pending.buffer_added = {}
        pending.saved_rows = True
    saved, written, overlay = pending.base.partitions, pending.written, pending.overlay
    changed: dict[tuple[str, Key], PartitionState | None] = {}
    unsaved, pending.unsaved = pending.unsaved, {}
    for partition in unsaved:
        state = overlay[partition]
        if state == (written[partition] if partition in written else saved.get(partition)):
            continue                                   # the rows already hold it (or there is none)
        written[partition] = changed[partition] = state
    if changed:
        rows: PartitionRows = pending.base.partition_rows
        pending.saved_rows = True
        for partition in [partition for partition in changed if partition in rows.legacy]:
            tx.delete(TABLE, (name, "partition", _partition_item(partition)))
            rows.legacy.discard(partition)
        # An emptied partition needs an entry only if a row holds an older one (else nothing would load it).
        recorded = {partition: state for partition, state in changed.items()
                    if state is not None or partition in rows.holders}
        if recorded:
            item = rows.next_item(pending.position)   # one row per save that changed partitions
            entries, gone_rows = rows.record(item, recorded)
            if entries:
                tx.write(TABLE, (name, "partitions", item), value=_encode_states(entries))
            for gone in gone_rows:
                tx.delete(TABLE, (name, "partitions", gone))
    meta = {"released": encode_value(pending.released),
            "punctuations": {stream: encode_value(value) for stream, value in pending.punctuations.items()},
            "position": pending.position, "arrivals": pending.arrivals, "time_kind": pending.time_kind,
            "fingerprints": {query.name: query.fingerprint for query in engine.queries.values()}}
    tx.write(TABLE, (name, "meta", ""), value=meta)
    return len(unsaved)


def load(engine: StreamEngine) -> State:
    """The engine's saved state (an empty one if it has none).  A row it cannot read raises
    ``StreamStateError`` naming the row (nothing is changed)."""
    from activedb.streams._state import State

    table = engine.db.table(TABLE)
    with _connection(engine, begin=False) as connection:
        rows = connection.execute(sa.select(table.c.kind, table.c.item, table.c.value)
                                  .where(table.c.engine == engine.name)).all()
    state = State()
    if not rows:
        return state
    streams = engine.streams
    buffered: list[tuple[int, StreamEvent]] = []
    batches: list[tuple[str, dict[str, Json]]] = []
    for kind, item, value in rows:
        with _readable(engine, kind, item):
            if kind == "partitions":
                batches.append((item, _fields(value)))
            else:
                _load_row(engine, state, kind, item, value, buffered)
    for item, value in sorted(batches, key=lambda batch: batch[0]):     # older rows first: the latest entry wins
        with _readable(engine, "partitions", item):
            changed: dict[tuple[str, Key], PartitionState | None] = {}
            events = decode_events(_fields(value["events"])) if "events" in value else []
            for entry in _items(value["entries"]):
                query, key, saved = _items(entry)
                partition = _decode_partition(query, key)
                decoded = changed[partition] = _decode_entry(saved, events)
                if decoded is None:
                    state.partitions.pop(partition, None)
                else:
                    state.partitions[partition] = decoded
        state.partition_rows.add(item, changed)
    for arrival, event in buffered:
        if state.released is not None and ts_less(event.ts, state.released):
            continue
        stream = streams.get(event.stream)  # type: ignore[arg-type]  # (None finds none: refused below)
        if stream is None:
            raise StreamStateError(f"engine {engine.name}: a buffered event belongs to stream {event.stream!r}, "
                                   f"which is not declared; declare it before the first batch")
        tie = stream.tie_key(event) if stream.tie_key is not None else None
        state.buffer.append((order_key(event, stream.priority(event.type), tie), arrival, event))
    state.buffer.sort(key=lambda entry: (entry[0], entry[1]))
    return state


def _load_row(engine: StreamEngine, state: State, kind: str, item: str, value: Json,
              buffered: list[tuple[int, StreamEvent]]) -> None:
    """Load one saved row other than a ``partitions`` row (those are applied oldest first, by ``load``)."""
    if kind == "meta":
        queries = engine.queries
        meta = _fields(value)
        for query, fingerprint in _fields(meta.get("fingerprints", {})).items():
            current = queries.get(query)
            if current is not None and current.fingerprint != fingerprint:
                raise StreamStateError(
                    f"engine {engine.name}: query {query} is not defined as it was when its state was saved "
                    f"(its partial matches may not fit); call engine.reset_state() to start it over, or "
                    f"restore the old definition")
        released = decode_value(meta["released"])
        state.released = None if released is None else _punctuation(released)
        state.punctuations = {stream: _punctuation(decode_value(mark))
                              for stream, mark in _fields(meta["punctuations"]).items()}
        state.position, state.arrivals = _whole(meta["position"]), _whole(meta["arrivals"])
        time_kind = meta["time_kind"]
        state.time_kind = None if time_kind is None else _text(time_kind)
    elif kind == "buffer":
        # One row per batch's chunk of buffered events; those older than the released
        # punctuation were released by a later batch (the buffer holds no older event).
        events = list(zip(map(_whole, _items(value["arrivals"])), decode_events(value))) \
            if isinstance(value, dict) and "arrivals" in value \
            else [(int(item), decode_event(value))]       # a row of one event (the earlier layout)
        state.chunks.add(item, ts_extreme((event.ts for _, event in events), latest=True))
        buffered.extend(events)
    elif kind == "partition":             # the earlier layout: one row per partition
        partition = _decode_partition(*json.loads(item))
        state.partitions[partition] = _decode_state(_fields(value))
        state.partition_rows.legacy.add(partition)


@contextlib.contextmanager
def _readable(engine: StreamEngine, kind: str, item: str) -> Iterator[None]:
    """Turn a malformed saved row (a missing field, an index out of range, a value of the wrong kind) into a
    ``StreamStateError`` that names it."""
    try:
        yield
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as error:
        raise StreamStateError(
            f"engine {engine.name}: its saved state row (kind {kind!r}, item {item!r}) in {TABLE} cannot be read "
            f"({type(error).__name__}: {error}); nothing was loaded or changed — restore the row, or call "
            f"engine.reset_state() to start the engine over") from error


def _decode_partition(query: Json, key: Json) -> tuple[str, Key]:
    return _text(query), tuple(decode_value(value) for value in _items(key))


def _encode_key(key: Key) -> list[object]:
    return [encode_value(value) for value in key]


def delete(engine: StreamEngine) -> None:
    table = engine.db.table(TABLE)
    with _connection(engine, begin=True) as connection:
        connection.execute(sa.delete(table).where(table.c.engine == engine.name))


def _connection(engine: StreamEngine, *, begin: bool) -> ContextManager[sa.Connection]:
    """A connection of ``engine``'s database for reading (``begin``: in a transaction committed at the end) the saved
    state outside a batch — refused once that ``Database`` is closed (:func:`require_open`): its disposed pool would
    still connect, and ``reset_state`` delete the state the engine made anew on the next ``Database`` is to load."""
    require_open(engine.db)
    return engine.db.engine.begin() if begin else engine.db.engine.connect()


def require_open(db: DatabaseHandle) -> None:
    """Raise, if ``db`` is closed, the error its ``transaction()`` raises (the Database's own ``TransactionError``:
    closed, connect again and make the engine on the new one)."""
    if db.transactions.pool.closed:
        db.transaction()     # (raises)
