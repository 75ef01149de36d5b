"""Events and event specifications.

An :class:`Event` is one occurrence; an :class:`EventSpec` says which
occurrences a rule reacts to.  Specs are made by the ``Database`` helpers:
``db.inserted(table)``, ``db.updated(table)``, ``db.deleted(table)``,
``db.modified(table)`` (any of the three), ``db.signalled(name)`` (application
events raised with ``tx.signal``), ``db.began()``, ``db.committed()``,
``db.aborted()`` (transaction events of top-level transactions) and
``db.stream(event_type)`` (events from a stream, e.g. the Spark bridge).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

DATA_KINDS = frozenset({"inserted", "updated", "deleted"})
TRANSACTION_KINDS = frozenset({"began", "committed", "aborted"})
KINDS = DATA_KINDS | TRANSACTION_KINDS | {"modified", "signal", "stream"}


@dataclass(frozen=True)
class Event:
    """One event occurrence, as a rule's condition and action see it.

    * ``kind``: inserted | updated | deleted | signal | stream | began | committed | aborted
    * ``source``: the table (data events), the signal name, or the stream event type
    * ``key``: the row's primary key (data events) or the stream event's key
    * ``old`` / ``new``: row images before and after (data events)
    * ``payload``: the signal's or stream event's fields
    * ``ts``: application timestamp (stream events), else None
    * ``transaction``: id of the transaction in which it occurred
    """

    kind: str
    source: str | None
    key: Any = None
    old: dict | None = None
    new: dict | None = None
    payload: dict = field(default_factory=dict)
    ts: Any = None
    transaction: str | None = None

    def describe(self) -> str:
        where = f" {self.source}" if self.source else ""
        key = f" key={self.key!r}" if self.key is not None else ""
        return f"{self.kind}{where}{key} in {self.transaction}"


@dataclass(frozen=True)
class EventSpec:
    kind: str
    source: str | None = None

    def matches(self, event: Event) -> bool:
        if self.kind == "modified":
            return event.kind in DATA_KINDS and event.source == self.source
        if event.kind != self.kind:
            return False
        return self.source is None or self.source == event.source

    @property
    def is_data(self) -> bool:
        return self.kind in DATA_KINDS or self.kind == "modified"

    def __str__(self) -> str:
        return f"{self.kind}({self.source})" if self.source else f"{self.kind}()"
