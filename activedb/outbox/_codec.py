"""Events as JSON an outbox record can hold, and back — exactly.

A rule run from a record must see the event it would have seen in memory: every field goes through
:func:`activedb.store.exact_json` (``event.ts`` stays a ``datetime``, a composite key a tuple, a string with
a NUL character comes back with its NUL).

Pure functions, thread-safe.
"""

from __future__ import annotations

from activedb.events import Event, EventKind
from activedb.store import exact_json as encode
from activedb.store import from_exact_json as decode

__all__ = ["decode", "decode_event", "encode", "encode_event"]


_FIELDS = ("key", "old", "new", "payload", "ts", "transaction")     # besides ``kind`` and ``source``


def encode_event(event: Event) -> dict:
    """``event`` as one JSON object (every field)."""
    return {"kind": event.kind.value, "source": encode(event.source),
            **{name: encode(getattr(event, name)) for name in _FIELDS}}


def decode_event(data: dict) -> Event:
    fields = {name: decode(data[name]) for name in _FIELDS}
    return Event(EventKind(data["kind"]), decode(data["source"]), **{**fields, "payload": fields["payload"] or {}})
