"""Badge events for the hand-hygiene application: a deterministic generator and a direct feeder.

* :func:`generate` ``(workers, events, seed) -> list[dict]`` — a reproducible stream of badge events
  ``{"type", "worker", "ts", "room"}`` (``ts``: application time in float seconds), in *arrival* order,
  with sensor glitches and late arrivals (``README.md`` in this package); ``activedb demo --write-events
  DIR`` writes it as files for ``activedb run … --source file:DIR``;
* :func:`apply_directly` ``(db, events) -> ApplyResult`` — feeds events through activedb transactions
  without Spark (sorted by ``ts``; one top-level transaction per chunk, one subtransaction per event).
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field
from typing import Any, Iterable

from activedb.errors import CascadeLimitExceeded, RuleFailed
from activedb.examples.hand_hygiene.app import BADGE_EVENTS, seconds
from activedb.examples.hand_hygiene.errors import BadgeEventRejected, MalformedBadgeEvent

CORRIDOR = "corridor"
DEFAULT_CHUNK_SIZE = 50

# (event type, weight) by where the worker is.
_IN_CORRIDOR = (("enter", 0.65), ("sanitize", 0.25), ("mask", 0.10))
_IN_ROOM = (("exit", 0.55), ("sanitize", 0.25), ("mask", 0.20))


def generate(workers: int, events: int, seed: int, *, rooms: int = 6, glitch_rate: float = 0.03,
             disorder_rate: float = 0.02) -> list[dict]:
    """``events`` badge events of ``workers`` workers (``w00``, ``w01``, …), reproducible from ``seed``.

    Each event is ``{"type": enter|exit|sanitize|mask, "worker": str, "ts": float, "room": str}``;
    ``room`` is the room entered or left, or where the worker sanitized/masked (``"corridor"``
    outside rooms).  The list is in arrival order; timestamps are exact to the millisecond.
    """
    if workers < 1 or events < 0 or rooms < 2:
        raise ValueError("generate() needs workers >= 1, events >= 0 and rooms >= 2")
    rng = random.Random(seed)
    names = [f"w{number:02d}" for number in range(workers)]
    room_names = [f"room{number}" for number in range(1, rooms + 1)]
    location: dict[str, str | None] = {name: None for name in names}
    clock = [(round(rng.uniform(0.0, 10.0), 3), name) for name in names]
    heapq.heapify(clock)
    stream: list[dict] = []
    while len(stream) < events:
        ts, worker = heapq.heappop(clock)
        here = location[worker]
        if rng.random() < glitch_rate:
            # A misread: the worker's real location does not change.
            if here is None:
                stream.append({"type": "exit", "worker": worker, "ts": ts, "room": rng.choice(room_names)})
            else:
                other = rng.choice([room for room in room_names if room != here])
                stream.append({"type": "enter", "worker": worker, "ts": ts, "room": other})
        else:
            choices = _IN_CORRIDOR if here is None else _IN_ROOM
            kind = rng.choices([name for name, _ in choices], weights=[weight for _, weight in choices])[0]
            if kind == "enter":
                room = rng.choice(room_names)
                location[worker] = room
            elif kind == "exit":
                room = here
                location[worker] = None
            else:
                room = here or CORRIDOR
            stream.append({"type": kind, "worker": worker, "ts": ts, "room": room})
        heapq.heappush(clock, (round(ts + rng.uniform(1.0, 30.0), 3), worker))
    for position in range(len(stream) - 1):
        if rng.random() < disorder_rate:
            late = stream.pop(position)
            stream.insert(min(len(stream), position + rng.randint(1, 3)), late)
    return stream


@dataclass(frozen=True)
class Rejection:
    """A badge event whose processing aborted (its subtransaction only), and why."""

    event: dict
    reason: str


@dataclass(frozen=True)
class ApplyResult:
    events: int
    applied: int
    rejected: list[Rejection] = field(default_factory=list)
    chunks: int = 0


def apply_directly(db, events: Iterable[dict], *, chunk_size: int = DEFAULT_CHUNK_SIZE) -> ApplyResult:
    """Process ``events`` in timestamp order through activedb, without Spark.

    One top-level transaction per ``chunk_size`` events (re-run on a serialization
    conflict or deadlock, ``Database.run``); each event runs in its own subtransaction
    that emits it (``sub.emit(type, key=worker, ts=ts, payload={...})``), so the rules
    on ``db.stream(type)`` fire inside it.  An event whose processing raises aborts only
    its subtransaction: it is reported in ``ApplyResult.rejected`` and the chunk goes on.
    A chunk re-run after a conflict leaves nothing of its aborted attempt behind (see ``Database.run``).
    """
    if chunk_size < 1:
        raise ValueError("chunk_size must be at least 1")
    ordered, malformed = [], []
    for event in events:
        try:
            _check(event)
        except MalformedBadgeEvent as error:
            malformed.append(Rejection(dict(event) if isinstance(event, dict) else {"value": event}, str(error)))
            continue
        ordered.append(event)
    ordered.sort(key=lambda event: seconds(event["ts"]))      # stable: equal timestamps keep arrival order
    starts = range(0, len(ordered), chunk_size)
    applied, rejected = 0, list(malformed)
    for start in starts:
        chunk_applied, chunk_rejected = db.run(_apply_chunk, ordered[start:start + chunk_size])
        applied += chunk_applied
        rejected.extend(chunk_rejected)
    return ApplyResult(events=len(ordered) + len(malformed), applied=applied, rejected=rejected, chunks=len(starts))


def _apply_chunk(tx, chunk: list[dict]) -> tuple[int, list[Rejection]]:
    rejected = []
    for event in chunk:
        payload = {name: value for name, value in event.items() if name not in ("type", "worker", "ts")}
        try:
            with tx.subtransaction(name=f"badge:{event['type']}:{event['worker']}") as sub:
                sub.emit(event["type"], key=event["worker"], ts=event["ts"], payload=payload)
        except (RuleFailed, CascadeLimitExceeded) as error:
            cause = error.__cause__           # the rule's own rejection, if it is one
            rejected.append(Rejection(event, str(cause if isinstance(cause, BadgeEventRejected) else error)))
    return len(chunk) - len(rejected), rejected


def _check(event: Any) -> None:
    if not isinstance(event, dict):
        raise MalformedBadgeEvent(f"a badge event is a dict, got {event!r}")
    if event.get("type") not in BADGE_EVENTS:
        raise MalformedBadgeEvent(f"badge event type must be one of {', '.join(BADGE_EVENTS)}, got "
                                  f"{event.get('type')!r}")
    if not isinstance(event.get("worker"), str) or not event["worker"]:
        raise MalformedBadgeEvent(f"badge event without a worker id: {event!r}")
    seconds(event.get("ts"))
