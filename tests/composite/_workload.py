"""Random producers with clocks that err within their declared accuracy, and an offline reference
composition (every event known, nothing in transit) written from the paper's set definitions alone.

Each producer's clock reads ``C(t) = t + offset(t)`` with ``|offset| <= accuracy`` and ``C`` monotone (the
offset wanders slower than time passes), so its events' lower bounds never decrease — the FIFO promise
sync-points rest on.  Events carry their true occurrence time in ``true`` (for checking only)."""

from __future__ import annotations

import random
from dataclasses import dataclass

from activedb import composite, streams
from activedb.composite import Choice, UncertaintyKind
from activedb.events import Timestamp


@dataclass
class Workload:
    producers: dict[str, list[str]]             # producer -> types it produces
    accuracy: dict[str, float]
    sequences: dict[str, list]                  # producer -> its events and heartbeats, in detection order


def generate(rng: random.Random, *, producers: int, events: int, types=("A", "B"), span: float = 2.0,
             accuracy_range=(0.001, 0.050), heartbeat_probability: float = 0.3, local: bool = True) -> Workload:
    names = [f"P{index}" for index in range(producers)]
    produced = {}
    for index, name in enumerate(names):
        if index < len(types):
            produced[name] = [types[index]]
        else:
            produced[name] = rng.sample(list(types), rng.randint(1, len(types)))
    accuracy = {name: rng.uniform(*accuracy_range) for name in names}
    sequences = {}
    counter = 0
    for name in names:
        count = max(1, events // producers + rng.randint(-2, 2))
        times = sorted(rng.uniform(0.0, span) for _ in range(count))
        offset = rng.uniform(-accuracy[name], accuracy[name])
        previous_time = 0.0
        items = []
        with_local = local and rng.random() < 0.5
        for true in times:
            for heartbeat in (True, False):
                if heartbeat and rng.random() > heartbeat_probability:
                    continue
                at = rng.uniform(previous_time, true) if heartbeat else true
                gap = at - previous_time
                step = min(accuracy[name] / 4, gap)
                offset = max(-accuracy[name], min(accuracy[name], offset + rng.uniform(-step, step)))
                reading = at + offset
                previous_time = at
                stamp = Timestamp.at(reading, accuracy[name], producer=name, local=at if with_local else None)
                if heartbeat:
                    items.append(composite.Heartbeat(name, stamp))
                    continue
                counter += 1
                event_type = rng.choice(produced[name])
                items.append(streams.StreamEvent(event_type, stamp, {"id": f"{name}-{counter:04d}", "true": true,
                                                                      "k": rng.randint(0, 1)}))
        sequences[name] = items
    return Workload(produced, accuracy, sequences)


def interleave(rng: random.Random, workload: Workload) -> list:
    """One arrival order: a random merge that keeps every producer's own order (FIFO channels)."""
    queues = {name: list(items) for name, items in workload.sequences.items()}
    merged = []
    while queues:
        name = rng.choice(sorted(queues))
        merged.append(queues[name].pop(0))
        if not queues[name]:
            del queues[name]
    return merged


def policy(consumption: str):
    """The application's deterministic choice: for several candidates the one with the smallest id; for an
    uncertain order relative to the other constituent, under chronicle drop the candidate (never compose a
    guess), under recent use it anyway (the composite then records that the application decided)."""
    def choose(uncertainty):
        if uncertainty.kind is UncertaintyKind.UNORDERED:
            if consumption == "chronicle":
                return Choice.drop(*uncertainty.candidates)
            return uncertainty.candidates[0]
        return min(uncertainty.candidates, key=lambda event: event["id"])
    return choose


# --- the offline reference ----------------------------------------------------------------------------

def _before(a, b) -> bool:
    a, b = a.ts, b.ts
    if a.upper < b.lower:
        return True
    if b.upper < a.lower:
        return False
    return a.producer == b.producer and a.local is not None and b.local is not None and a.local < b.local


def _oldest(items):
    return [e for e in items if not any(x is not e and _before(x, e) for x in items)]


def _newest(items):
    return [e for e in items if not any(x is not e and _before(e, x) for x in items)]


def reference(events: list, *, operator: str, consumption: str, partition: bool) -> list[tuple]:
    """The composites of ``events`` (all known) as (ids, decided-by-application) tuples, via the paper's
    formulas: oldest / oldestFollowing for chronicle, newest-before for recent, the same policy."""
    groups: dict = {}
    for event in events:
        groups.setdefault(event["k"] if partition else None, []).append(event)
    results = []
    for _, group in sorted(groups.items(), key=lambda pair: repr(pair[0])):
        lists = [[e for e in group if e.type == "A"], [e for e in group if e.type == "B"]]
        if consumption == "chronicle":
            results.extend(_chronicle(lists, operator))
        else:
            results.extend(_recent(lists, operator))
    return sorted(results)


def _pick(candidates, anchor, kind_uncertain_order):
    """Apply the policy: returns (chosen or None, decided, dropped list)."""
    decided = False
    if len(candidates) > 1:
        chosen = min(candidates, key=lambda event: event["id"])
        decided = True
    else:
        chosen = candidates[0]
    if anchor is not None and not kind_uncertain_order(anchor, chosen):
        return None, True, [chosen]
    return chosen, decided, []


def _chronicle(lists, operator):
    results = []
    decided = False
    while all(lists):
        a_candidates = _oldest(lists[0])
        a, flag, _ = _pick(a_candidates, None, None)
        decided |= flag
        if operator == "AND":
            b, flag, _ = _pick(_oldest(lists[1]), None, None)
            decided |= flag
        else:
            following = [e for e in lists[1] if not _before(e, a)]
            if not following:
                break
            b, flag, dropped = _pick(_oldest(following), a, _before)
            decided |= flag
            if b is None:
                lists[1] = [e for e in lists[1] if e is not dropped[0]]
                continue
        results.append(((a["id"], b["id"]), decided))
        decided = False
        lists[0] = [e for e in lists[0] if e is not a]
        lists[1] = [e for e in lists[1] if e is not b]
    return results


def _recent(lists, operator):
    results = []
    if operator == "SEQ":
        terminators, others = [(e, 1) for e in lists[1]], {1: lists[0]}
    else:
        terminators, others = [(e, 0) for e in lists[0]] + [(e, 1) for e in lists[1]], {0: lists[1], 1: lists[0]}
    for event, own in terminators:
        candidates = _newest([x for x in others[own] if not _before(event, x)])
        if not candidates:
            continue
        chosen, decided, _ = _pick(candidates, None, None)
        if not _before(chosen, event):
            decided = True                      # the policy uses it anyway, recorded as a decision
        pair = (chosen["id"], event["id"]) if own == 1 else (event["id"], chosen["id"])
        results.append((pair, decided))
    return results


def pair_rows() -> list[dict]:
    """Rows of a composition of pairs (the ingestion tests'): A from P0 and B from P1, 2 s apart, a heartbeat of its
    producer after each."""
    rows = []
    for step in range(12):
        producer, event_type = ("P0", "A") if step % 2 == 0 else ("P1", "B")
        rows.append({"type": event_type, "k": "x", "ts": 100.0 + 2 * step, "producer": producer, "accuracy": 0.01,
                     "id": f"{event_type}{step}"})
        rows.append({"type": "heartbeat", "k": None, "ts": 101.0 + 2 * step, "producer": producer,
                     "accuracy": 0.01, "id": None})
    return rows


def pairs_engine(db) -> composite.CompositionEngine:
    """The engine :func:`pair_rows` feed (``db`` None: without a database): ``SEQ(A, B)`` per ``k``, chronicle."""
    engine = composite.CompositionEngine(db, name="pairs", clock=composite.ManualClock(), timeout=None)
    engine.create_stream("s", types=["A", "B"], attributes=["id", "k"])
    engine.define("CREATE QUERY Q PATTERN SEQ(A, B) WHERE [k] CONSUMING CHRONICLE RETURN A.id AS a, B.id AS b")
    engine.join("P0", types=["A"])
    engine.join("P1", types=["B"])
    return engine
