"""The batch latency histogram, filled from a source's recent batches at scrape time (each batch counted
once; the design note, ``README.md``, "Invariants").
"""

from __future__ import annotations

import bisect
import itertools
import threading
from collections.abc import Sequence
from typing import Protocol

class Timed(Protocol):
    """A batch's outcome as the histogram reads it (``activedb.ingest.BatchOutcome`` is one)."""

    @property
    def seconds(self) -> float: ...


#: Upper bounds (seconds) of the histogram's buckets; ``+Inf`` is implied.
BUCKETS: tuple[float, ...] = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


class BatchLatency:
    """Cumulative histogram of batch seconds.  Thread-safe: ``_mutex`` protects every field below it."""

    def __init__(self, buckets: Sequence[float] = BUCKETS) -> None:
        self.buckets = tuple(sorted(buckets))
        self._mutex = threading.Lock()
        self._counts = [0] * (len(self.buckets) + 1)    # per bucket, not cumulative; the last is +Inf
        self._sum = 0.0
        # Invariant: _last is the newest outcome counted (kept alive, so ``is`` never matches a newcomer).
        self._last: Timed | None = None

    def absorb(self, outcomes: Sequence[Timed]) -> int:
        """Count the outcomes after the last one counted (``outcomes`` oldest first); returns how many."""
        with self._mutex:
            start = next((index + 1 for index in range(len(outcomes) - 1, -1, -1) if outcomes[index] is self._last), 0)
            fresh = outcomes[start:]
            for outcome in fresh:
                seconds = float(outcome.seconds)
                self._counts[bisect.bisect_left(self.buckets, seconds)] += 1
                self._sum += seconds
            if fresh:
                self._last = fresh[-1]
            return len(fresh)

    def snapshot(self) -> tuple[list[tuple[str, int]], float]:
        """``([(upper bound, cumulative count), ...], sum)`` in the Prometheus client's bucket format."""
        with self._mutex:
            counts, total = list(self._counts), self._sum
        bounds = [*(repr(float(bound)) for bound in self.buckets), "+Inf"]
        return list(zip(bounds, itertools.accumulate(counts))), total
