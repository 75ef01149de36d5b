"""Events (:class:`Event`), their kinds and origins, and event specifications (:class:`EventSpec`, made
by ``db.inserted(table)``, ``db.signalled(name)``, ``db.stream(event_type)``, ``db.captured(table, kind)``,
…).  Design note: ``activedb/events/README.md``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Hashable, Mapping

from activedb.errors import BadArgument, InvalidChoice


class EventKind(enum.StrEnum):
    """What happened.  ``MODIFIED`` appears only in specs (any data event on a table)."""

    INSERTED = "inserted"
    UPDATED = "updated"
    DELETED = "deleted"
    MODIFIED = "modified"
    SIGNAL = "signal"
    STREAM = "stream"
    BEGAN = "began"
    COMMITTED = "committed"
    ABORTED = "aborted"

    @property
    def is_transaction_end(self) -> bool:
        return self in (EventKind.COMMITTED, EventKind.ABORTED)


class Origin(enum.StrEnum):
    """Who made a data change.  ``ACTIVEDB``: a transaction of activedb (its in-process events, raised
    while the transaction runs); ``EXTERNAL``: any other PostgreSQL client, heard through
    ``activedb.capture`` after the writer committed."""

    ACTIVEDB = "activedb"
    EXTERNAL = "external"


DATA_KINDS = frozenset({EventKind.INSERTED, EventKind.UPDATED, EventKind.DELETED})
DATA_SPEC_KINDS = DATA_KINDS | {EventKind.MODIFIED}


@dataclass(frozen=True)
class Event:
    """One event occurrence, as a rule's condition and action see it.

    * ``kind``: an :class:`EventKind` (inserted | updated | deleted | signal | stream | began | committed |
      aborted)
    * ``source``: the table (data events), the signal name, or the stream event type
    * ``key``: the row's primary key (data events) or the stream event's key
    * ``old`` / ``new``: row images before and after (data events; an insert's ``new`` is the stored row,
      every column)
    * ``payload``: the signal's or stream event's fields
    * ``ts``: application timestamp (stream events), else None: a number or datetime (a point), or an
      :class:`~activedb.events.Timestamp` (an accuracy interval with its producer; composite events)
    * ``transaction``: id of the transaction in which it occurred (a captured change: ``pg:<xid>``, the
      writing PostgreSQL transaction; its commit order is in ``payload``, see ``activedb.capture``)
    * ``origin``: :class:`Origin` — ``ACTIVEDB`` for activedb's own events, ``EXTERNAL`` for captured changes
    """

    kind: EventKind
    source: str | None
    key: Any = None
    old: dict[str, Any] | None = None
    new: dict[str, Any] | None = None
    payload: dict[str, Any] = field(default_factory=dict)
    ts: Any = None
    transaction: str | None = None
    origin: Origin = Origin.ACTIVEDB

    def describe(self) -> str:
        where = f" {self.source}" if self.source else ""
        key = f" key={self.key!r}" if self.key is not None else ""
        return f"{self.kind}{where}{key} in {self.transaction}"


_new_object = object.__new__
_ACTIVEDB_ORIGIN = Origin.ACTIVEDB


def new_event(kind: EventKind, source: str | None, key: Hashable = None, old: Mapping[str, object] | None = None,
              new: Mapping[str, object] | None = None, payload: Mapping[str, object] | None = None, ts: object = None, transaction: str | None = None,
              origin: Origin = _ACTIVEDB_ORIGIN) -> Event:
    """``Event(kind, source, ...)`` — equal to it, as frozen — its fields stored in the instance's dictionary: the
    dataclass's ``__init__`` sets each of the nine through ``object.__setattr__``, a call per field, and every event
    a transaction raises (``emit``, ``signal``, each data event) is made here.  (Item by item into the dictionary the
    new instance has, not a new dictionary given to ``__dict__``, whose replacement costs more than the nine stores.)
    The arguments are not checked (no ``__post_init__`` exists to run); ``payload`` None is an empty dict."""
    event = _new_object(Event)
    fields = event.__dict__
    fields["kind"] = kind
    fields["source"] = source
    fields["key"] = key
    fields["old"] = old
    fields["new"] = new
    fields["payload"] = {} if payload is None else payload
    fields["ts"] = ts
    fields["transaction"] = transaction
    fields["origin"] = origin
    return event


@dataclass(frozen=True)
class EventSpec:
    """Which events a rule reacts to: a kind and, optionally, a source (table, signal or stream type),
    and for data specs the :class:`Origin` of the changes (``EXTERNAL``: ``db.captured(table, kind)``)."""

    kind: EventKind
    source: str | None = None
    origin: Origin = Origin.ACTIVEDB

    def __post_init__(self) -> None:
        for name, choices in (("kind", EventKind), ("origin", Origin)):
            try:
                object.__setattr__(self, name, choices(getattr(self, name)))
            except ValueError:
                raise InvalidChoice(choices, getattr(self, name), f"EventSpec({name}=...)") from None
        source = self.source
        if source is not None and (not isinstance(source, str) or not source):   # (no event has such a source)
            raise BadArgument(f"EventSpec(kind={self.kind.value!r}, source={source!r}): the source is a table, signal or "
                              f"stream type name (a non-empty text), or None for any; no event would match "
                              f"{source!r}")
        if self.origin is Origin.EXTERNAL and self.kind not in DATA_SPEC_KINDS:
            raise BadArgument(f"EventSpec(kind={self.kind.value!r}, origin=Origin.EXTERNAL): only data events come "
                              f"from external writers; give inserted, updated, deleted or modified, or "
                              f"origin=Origin.ACTIVEDB for {self.kind} events of activedb's own")

    def matches(self, event: Event) -> bool:
        if event.origin is not self.origin:
            return False
        if self.kind is EventKind.MODIFIED:
            return event.kind in DATA_KINDS and event.source == self.source
        if event.kind != self.kind:
            return False
        return self.source is None or self.source == event.source

    @property
    def is_data(self) -> bool:
        return self.kind in DATA_SPEC_KINDS

    def kinds(self) -> frozenset[EventKind]:
        """The event kinds this spec matches (``MODIFIED``: the three data kinds)."""
        return DATA_KINDS if self.kind is EventKind.MODIFIED else frozenset({self.kind})

    def __str__(self) -> str:
        text = f"{self.kind}({self.source})" if self.source else f"{self.kind}()"
        return f"captured {text}" if self.origin is Origin.EXTERNAL else text
