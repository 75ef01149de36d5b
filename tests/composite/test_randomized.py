"""Randomised: producers with random clock errors within their declared accuracy.

For random workloads and every query shape (AND / SEQ × chronicle / recent, with and without ``[k]``):

* the engine's composites equal an offline reference computed from the paper's set definitions with
  every event known — whatever the arrival interleaving (FIFO per producer) and however the arrivals are
  cut into calls: no composite before stability, none missed after it;
* every uncertainty reached the application (the reference's decisions and the engine's recorded
  resolutions are the same): never a silent tie-break;
* every SEQ composite the engine decided alone has its constituents in their true occurrence order: never
  an erroneously ordered composite event.

Seeded with ``ACTIVEDB_COMPOSITE_SEED`` (default fixed); ``ACTIVEDB_COMPOSITE_CASES`` sets the number of
workloads (default 12).
"""

from __future__ import annotations

import os
import random

import pytest

from activedb import composite

from tests.composite._workload import generate, interleave, policy, reference

SEED = int(os.environ.get("ACTIVEDB_COMPOSITE_SEED", "1999"))
CASES = int(os.environ.get("ACTIVEDB_COMPOSITE_CASES", "12"))
SHAPES = [(operator, consumption, partition) for operator in ("AND", "SEQ") for consumption in ("chronicle", "recent")
          for partition in (False, True)]


def run(workload, arrivals, shape, cuts=None):
    operator, consumption, partition = shape
    engine = composite.CompositionEngine(name="random", clock=composite.ManualClock(), timeout=None,
                                         on_uncertain=policy(consumption))
    engine.create_stream("s", types=["A", "B"], attributes=["id", "true", "k"])
    where = "WHERE [k] " if partition else ""
    engine.define(f"CREATE QUERY Q PATTERN {operator}(A, B) {where}CONSUMING {consumption.upper()} "
                  f"RETURN A.id AS a, B.id AS b")
    for producer, types in workload.producers.items():
        engine.join(producer, types=types)
    produced = []
    if cuts is None:
        for item in arrivals:
            produced += engine.signal(item)
    else:
        start = 0
        for cut in cuts + [len(arrivals)]:
            produced += engine.submit(arrivals[start:cut])
            start = cut
    for producer in sorted(workload.producers):
        produced += engine.leave(producer)
    return produced


@pytest.mark.parametrize("case", range(CASES))
def test_random_producers_compose_like_the_offline_reference(case):
    rng = random.Random(SEED + case)
    workload = generate(rng, producers=rng.randint(2, 5), events=rng.randint(6, 30), span=rng.choice([0.2, 1.0]),
                        accuracy_range=rng.choice([(0.0005, 0.002), (0.001, 0.050)]))
    events = [item for items in workload.sequences.values() for item in items
              if not isinstance(item, composite.Heartbeat)]
    for shape in SHAPES:
        operator, consumption, partition = shape
        expected = reference(list(events), operator=operator, consumption=consumption, partition=partition)
        for attempt in range(3):
            arrivals = interleave(rng, workload)
            cuts = sorted(rng.sample(range(1, len(arrivals)), min(3, len(arrivals) - 1))) if attempt == 2 else None
            produced = run(workload, arrivals, shape, cuts)
            got = sorted(((item["a"], item["b"]), bool(item.resolutions)) for item in produced)
            assert got == expected, (f"case {case} {shape} attempt {attempt}: engine {got} != reference {expected} "
                                     f"(seed {SEED + case})")
            for item in produced:
                if operator == "SEQ" and not item.resolutions:
                    first, second = item.constituents
                    assert first["true"] < second["true"], f"erroneously ordered: {item.describe()}"
