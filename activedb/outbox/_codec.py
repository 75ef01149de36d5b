"""Events as JSON an outbox record can hold, and back — exactly.

A rule run from a record must see the event it would have seen in memory: ``event.ts`` stays a
``datetime``, a composite key stays a tuple, a ``Decimal`` stays a ``Decimal``, a string with a NUL
character (which ``jsonb`` cannot hold) comes back with its NUL.  Plain JSON values (None, bools, ints,
finite floats, storable strings, lists, dicts with plain string keys) are stored as themselves; every
other value is a one-key object whose key starts with ``$`` (a dict whose keys could be mistaken for
such a tag is stored as ``{"$map": [[key, value], ...]}``).  A value of a type the codec does not know is
pickled (``{"$pickle": base64}``): exact, though opaque in ``activedb status``.

Pure functions, thread-safe.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import math
import pickle
import uuid
from typing import Any

from activedb.events import Event, EventKind
from activedb.store import text_problem

_TAG = "$"


def _storable(text: str) -> bool:
    return text_problem(text) is None


def encode(value: Any) -> Any:
    """``value`` as JSON ``jsonb`` accepts, decodable by :func:`decode` into an equal value."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value if type(value) is int else {"$pickle": _pickled(value)}
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return {"$float": repr(value)}
    if isinstance(value, str):
        if type(value) is not str:        # a str Enum (e.g. EventKind): its plain value
            value = str.__str__(value) if not hasattr(value, "value") else value.value
        if _storable(value):
            return value
        return {"$str": base64.b64encode(value.encode("utf-8", "surrogatepass")).decode("ascii")}
    if isinstance(value, dt.datetime):
        return {"$datetime": value.isoformat()}
    if isinstance(value, dt.date):
        return {"$date": value.isoformat()}
    if isinstance(value, dt.time):
        return {"$time": value.isoformat()}
    if isinstance(value, dt.timedelta):
        return {"$timedelta": [value.days, value.seconds, value.microseconds]}
    if isinstance(value, decimal.Decimal):
        return {"$decimal": str(value)}
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"$bytes": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, uuid.UUID):
        return {"$uuid": str(value)}
    if isinstance(value, tuple):
        return {"$tuple": [encode(item) for item in value]}
    if isinstance(value, list):
        return [encode(item) for item in value]
    if isinstance(value, (set, frozenset)):
        return {"$set" if isinstance(value, set) else "$frozenset": [encode(item) for item in value]}
    if isinstance(value, dict):
        if all(type(key) is str and not key.startswith(_TAG) and _storable(key) for key in value):
            return {key: encode(item) for key, item in value.items()}
        return {"$map": [[encode(key), encode(item)] for key, item in value.items()]}
    return {"$pickle": _pickled(value)}


def _pickled(value: Any) -> str:
    return base64.b64encode(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)).decode("ascii")


_DECODERS = {
    "$float": float,
    "$str": lambda text: base64.b64decode(text).decode("utf-8", "surrogatepass"),
    "$datetime": dt.datetime.fromisoformat,
    "$date": dt.date.fromisoformat,
    "$time": dt.time.fromisoformat,
    "$timedelta": lambda parts: dt.timedelta(days=parts[0], seconds=parts[1], microseconds=parts[2]),
    "$decimal": decimal.Decimal,
    "$bytes": lambda text: base64.b64decode(text),
    "$uuid": uuid.UUID,
    "$tuple": lambda items: tuple(decode(item) for item in items),
    "$set": lambda items: {decode(item) for item in items},
    "$frozenset": lambda items: frozenset(decode(item) for item in items),
    "$map": lambda pairs: {decode(key): decode(item) for key, item in pairs},
    "$pickle": lambda text: pickle.loads(base64.b64decode(text)),
}


def decode(value: Any) -> Any:
    """The inverse of :func:`encode`."""
    if isinstance(value, list):
        return [decode(item) for item in value]
    if isinstance(value, dict):
        if len(value) == 1:
            (key, item), = value.items()
            decoder = _DECODERS.get(key)
            if decoder is not None:
                return decoder(item)
        return {key: decode(item) for key, item in value.items()}
    return value


def encode_event(event: Event) -> dict:
    """``event`` as one JSON object (every field)."""
    return {
        "kind": event.kind.value,
        "source": encode(event.source),
        "key": encode(event.key),
        "old": encode(event.old),
        "new": encode(event.new),
        "payload": encode(event.payload),
        "ts": encode(event.ts),
        "transaction": encode(event.transaction),
    }


def decode_event(data: dict) -> Event:
    return Event(EventKind(data["kind"]), decode(data["source"]), key=decode(data["key"]), old=decode(data["old"]),
                 new=decode(data["new"]), payload=decode(data["payload"]) or {}, ts=decode(data["ts"]),
                 transaction=decode(data["transaction"]))
