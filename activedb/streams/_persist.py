"""Saving the engine's state in the batch's own transaction (exactly once across restarts):
:func:`save` writes what a batch changed into ``activedb_stream_state`` with ``tx.write`` /
``tx.delete``, :func:`load` reads it back for a new engine object.  The layout and the
protocol are in the design note ``activedb/streams/README.md``, "Exactly once".
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from activedb.streams._events import END_OF_STREAM, StreamEvent, order_key, ts_extreme, ts_less
from activedb.streams._matcher import PartitionState
from activedb.streams.errors import StreamStateError

if TYPE_CHECKING:  # pragma: no cover
    from activedb.txn import Transaction

TABLE = "activedb_stream_state"


def encode_value(value: Any) -> Any:
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
    if isinstance(value, (list, tuple)):
        return [encode_value(item) for item in value]
    if isinstance(value, dict):
        return {"$map": [[key, encode_value(item)] for key, item in value.items()]}
    raise StreamStateError(f"cannot save {value!r} ({type(value).__name__}) in the engine's state; event "
                           f"attributes must be numbers, text, booleans, dates or datetimes — or use "
                           f"StreamEngine(durable=False)")


_DECODERS = {"$dt": dt.datetime.fromisoformat, "$d": dt.date.fromisoformat, "$dec": decimal.Decimal,
             "$end": lambda _: END_OF_STREAM,
             "$map": lambda pairs: {key: decode_value(item) for key, item in pairs}}


def decode_value(value: Any) -> Any:
    if isinstance(value, list):
        return [decode_value(item) for item in value]
    if isinstance(value, dict):
        for tag, decode in _DECODERS.items():
            if tag in value:
                return decode(value[tag])
    return value


def encode_event(event: StreamEvent) -> list:
    return [event.type, encode_value(event.ts), event.stream, event.position,
            {key: encode_value(value) for key, value in dict(event.attributes).items()}]


def decode_event(data: list | dict) -> StreamEvent:
    """An event saved by :func:`encode_event` (or as the earlier ``{"t", "ts", "s", "p", "a"}`` object)."""
    kind, ts, stream, position, attributes = (data["t"], data["ts"], data["s"], data["p"], data["a"]) \
        if isinstance(data, dict) else data
    return StreamEvent(type=kind, ts=decode_value(ts), stream=stream, position=position,
                       attributes={key: decode_value(value) for key, value in attributes.items()})


ABSENT = {"$absent": True}        # an attribute the event lacks (encode_value never gives it)


def encode_events(events: list[StreamEvent]) -> dict:
    """``events`` as columns, one list per field and per attribute: a batch's chunk of the buffer is
    then about two thirds of the JSON (and of the quotes the flush escapes) of one list per event."""
    names = dict.fromkeys(name for event in events for name in event.attributes)
    return {"t": [event.type for event in events], "ts": [encode_value(event.ts) for event in events],
            "s": [event.stream for event in events], "p": [event.position for event in events],
            "a": {name: [encode_value(event.attributes[name]) if name in event.attributes else ABSENT
                         for event in events] for name in names}}


def decode_events(data: dict) -> list[StreamEvent]:
    columns = data["a"].items()
    return [StreamEvent(type=kind, ts=decode_value(ts), stream=stream, position=position,
                        attributes={name: decode_value(values[index]) for name, values in columns
                                    if values[index] != ABSENT})
            for index, (kind, ts, stream, position) in enumerate(zip(data["t"], data["ts"], data["s"], data["p"]))]


def save(engine: Any, tx: Transaction, pending: Any) -> None:
    """Write what ``pending`` changed into ``tx`` (see the module docstring)."""
    name = engine.name
    chunks, released = pending.chunks, pending.released
    for item in [item for item, latest in chunks.items() if released is not None and ts_less(latest, released)]:
        tx.delete(TABLE, (name, "buffer", item))       # every event of the chunk was released
        del chunks[item]
    if pending.buffer_added:
        item = f"{min(pending.buffer_added):012d}"
        tx.write(TABLE, (name, "buffer", item),
                 value={"arrivals": list(pending.buffer_added), **encode_events(list(pending.buffer_added.values()))})
        chunks[item] = ts_extreme((event.ts for event in pending.buffer_added.values()), latest=True)
        pending.buffer_added = {}
    saved, written = pending.base.partitions, pending.written
    for (query, key), state in pending.overlay.items():
        if state == (written[query, key] if (query, key) in written else saved.get((query, key))):
            continue                                   # the row already holds it (or there is none)
        written[query, key] = state
        item = json.dumps([query, [encode_value(value) for value in key]], separators=(",", ":"))
        if state is None:
            tx.delete(TABLE, (name, "partition", item))
        else:
            tx.write(TABLE, (name, "partition", item), value={
                "buffers": [[encode_event(event) for event in buffer] for buffer in state.buffers],
                "runs": [[encode_event(event) for event in run] for run in state.runs]})
    meta = {"released": encode_value(pending.released),
            "punctuations": {stream: encode_value(value) for stream, value in pending.punctuations.items()},
            "position": pending.position, "arrivals": pending.arrivals, "time_kind": pending.time_kind,
            "fingerprints": {query.name: query.fingerprint for query in engine.queries.values()}}
    tx.write(TABLE, (name, "meta", ""), value=meta)


def load(engine: Any) -> Any:
    """The engine's saved state (an empty one if it has none)."""
    from activedb.streams._state import State

    table = engine.db.table(TABLE)
    with engine.db.engine.connect() as connection:
        rows = connection.execute(sa.select(table.c.kind, table.c.item, table.c.value)
                                  .where(table.c.engine == engine.name)).all()
    state = State()
    if not rows:
        return state
    streams = engine.streams
    queries = engine.queries
    buffered: list[tuple[int, StreamEvent]] = []
    for kind, item, value in rows:
        if kind == "meta":
            for query, fingerprint in value.get("fingerprints", {}).items():
                current = queries.get(query)
                if current is not None and current.fingerprint != fingerprint:
                    raise StreamStateError(
                        f"engine {engine.name}: query {query} is not defined as it was when its state was saved "
                        f"(its partial matches may not fit); call engine.reset_state() to start it over, or "
                        f"restore the old definition")
            state.released = decode_value(value["released"])
            state.punctuations = {stream: decode_value(mark) for stream, mark in value["punctuations"].items()}
            state.position = value["position"]
            state.arrivals = value["arrivals"]
            state.time_kind = value["time_kind"]
        elif kind == "buffer":
            # One row per batch's chunk of buffered events; those older than the released
            # punctuation were released by a later batch (the buffer holds no older event).
            events = list(zip(value["arrivals"], decode_events(value))) if "arrivals" in value \
                else [(int(item), decode_event(value))]       # a row of one event (the earlier layout)
            state.chunks[item] = ts_extreme((event.ts for _, event in events), latest=True)
            buffered.extend(events)
        elif kind == "partition":
            query, key = json.loads(item)
            key = tuple(decode_value(value_) for value_ in key)
            state.partitions[(query, key)] = PartitionState(
                tuple(tuple(decode_event(event) for event in buffer) for buffer in value["buffers"]),
                tuple(tuple(decode_event(event) for event in run) for run in value["runs"]))
    for arrival, event in buffered:
        if state.released is not None and ts_less(event.ts, state.released):
            continue
        stream = streams.get(event.stream)
        if stream is None:
            raise StreamStateError(f"engine {engine.name}: a buffered event belongs to stream {event.stream!r}, "
                                   f"which is not declared; declare it before the first batch")
        tie = stream.tie_key(event) if stream.tie_key is not None else None
        state.buffer.append((order_key(event, stream.priority(event.type), tie), arrival, event))
    state.buffer.sort(key=lambda entry: (entry[0], entry[1]))
    return state


def delete(engine: Any) -> None:
    table = engine.db.table(TABLE)
    with engine.db.engine.begin() as connection:
        connection.execute(sa.delete(table).where(table.c.engine == engine.name))
