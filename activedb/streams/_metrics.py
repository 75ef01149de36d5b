"""Active CEP Appendix G.2's metrics, measured in system time only (definitions: the design
note ``activedb/streams/README.md``, "Metrics").

Thread-safety: ``_mutex`` protects every counter; the unscheduled mode updates them from
several threads.
"""

from __future__ import annotations

import collections
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Mapping

if TYPE_CHECKING:  # pragma: no cover
    from activedb.streams._events import Punctuation

PHASES = ("buffer", "match", "reads", "rules", "commit", "state")


@dataclass(frozen=True)
class QueryCounters:
    evaluations: int = 0
    outputs: int = 0


@dataclass(frozen=True)
class StreamStatistics:
    """A consistent snapshot of an engine's counters and App. G.2 metrics.  Immutable.

    Latencies are in seconds (None before the first output / rule instance)."""

    scheduler: str
    events_in: int                     # events handed to process()/feed()
    events_processed: int              # s-transactions committed
    events_failed: int                 # s-transactions aborted (their events are dead letters)
    dead_letters: int                  # late + rejected + failed
    late_events: int
    buffered: int                      # waiting in the reorder buffer for a punctuation
    released_punctuation: Punctuation | None   # every event older than this has been released
    outputs: int
    rule_instances: int
    store_reads: int
    store_writes: int
    processing_seconds: float          # T_proc
    throughput: float                  # events_processed / processing_seconds
    wall_events_per_second: float      # events_processed / (now - first arrival)
    l_query: float | None
    l_rule: float | None
    l_combined: float | None
    mean_reorder_delay: float | None   # release sts - arrival sts, per released event
    ties_by_content: int               # equal-ts events only the content could order
    phase_seconds: Mapping[str, float] = field(default_factory=dict)
    per_query: Mapping[str, QueryCounters] = field(default_factory=dict)
    lowered: int = 0                   # s-transactions SEI ran on the batch's overlay, no subtransaction each
    # Partition states the batches' ends looked at, to index or prune them (queries with WITHIN) and to save them
    # (durable engines): a batch looks at those it changed and those its punctuation prunes, not at the ones the
    # earlier batches of its transaction changed (the design note's "State between batches").
    partitions_visited: int = 0


class Metrics:
    """The engine's counters, summed by :meth:`add` (``processed``, ``failed``, ``dead_letters``, ``late``,
    ``outputs``, ``rule_instances``, ``reads``, ``writes``, ``processing``, ``query_latency``,
    ``rule_latency``, ``reorder_delay``, ``released``, ``ties_by_content``, ``lowered``, ``visited``)."""

    def __init__(self, scheduler: str):
        self.scheduler = scheduler
        self._mutex = threading.Lock()       # protects every field below
        self.events_in = 0
        self.first_arrival: float | None = None
        self.counts: collections.Counter[str] = collections.Counter()
        self.phases = {phase: 0.0 for phase in PHASES}
        self.per_query: dict[str, list[int]] = {}

    def arrived(self, count: int, now: float) -> None:
        with self._mutex:
            self.events_in += count
            if self.first_arrival is None and count:
                self.first_arrival = now

    def add(self, **amounts: float) -> None:
        with self._mutex:
            counts = self.counts
            for name, amount in amounts.items():     # Counter.update(), without its Mapping check per call
                counts[name] += amount  # type: ignore[assignment]  # (seconds are floats: a Counter adds them too)

    def phase(self, **seconds: float) -> None:
        """Add the seconds spent in each named phase (several at once: one lock)."""
        with self._mutex:
            for name, spent in seconds.items():
                self.phases[name] += spent

    def queries(self, evaluations: Mapping[str, list[int]]) -> None:
        """Count, per query ``name``, ``evaluations[name] = [evaluations, outputs]``."""
        with self._mutex:
            for name, (count, outputs) in evaluations.items():
                counters = self.per_query.setdefault(name, [0, 0])
                counters[0] += count
                counters[1] += outputs

    def snapshot(self, buffered: int, released: Punctuation | None) -> StreamStatistics:
        now = time.perf_counter()
        with self._mutex:
            counts = self.counts
            processed, processing, outputs, instances = (counts["processed"], counts["processing"],
                                                         counts["outputs"], counts["rule_instances"])
            l_query = counts["query_latency"] / outputs if outputs else None
            l_rule = counts["rule_latency"] / instances if instances else None
            combined = None if l_query is None and l_rule is None else (l_query or 0.0) + (l_rule or 0.0)
            wall = now - self.first_arrival if self.first_arrival is not None else 0.0
            return StreamStatistics(
                scheduler=self.scheduler, events_in=self.events_in, events_processed=processed,
                events_failed=counts["failed"], dead_letters=counts["dead_letters"], late_events=counts["late"],
                buffered=buffered, released_punctuation=released, outputs=outputs, rule_instances=instances,
                store_reads=counts["reads"], store_writes=counts["writes"], processing_seconds=float(processing),
                throughput=processed / processing if processing > 0 else 0.0,
                wall_events_per_second=processed / wall if wall > 0 else 0.0,
                l_query=l_query, l_rule=l_rule, l_combined=combined,
                mean_reorder_delay=counts["reorder_delay"] / counts["released"] if counts["released"] else None,
                ties_by_content=counts["ties_by_content"], phase_seconds=dict(self.phases),
                per_query={name: QueryCounters(*counters) for name, counters in self.per_query.items()},
                lowered=counts["lowered"], partitions_visited=counts["visited"])
