"""The batch latency histogram, filled from a source's recent batches at scrape time (each batch counted
once; the design note, ``README.md``, "Invariants").
"""

from __future__ import annotations

import bisect
import itertools
import math
import threading
from collections.abc import Sequence
from typing import Protocol

from activedb.errors import finite_number
from activedb.metrics.errors import MetricsError

class Timed(Protocol):
    """A batch's outcome as the histogram reads it (``activedb.ingest.BatchOutcome`` is one)."""

    @property
    def seconds(self) -> float: ...


#: Upper bounds (seconds) of the histogram's buckets; ``+Inf`` is implied.
BUCKETS: tuple[float, ...] = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


class BatchLatency:
    """Cumulative histogram of batch seconds.  Thread-safe: ``_mutex`` protects every field below it."""

    def __init__(self, buckets: Sequence[float] = BUCKETS) -> None:
        # (two equal bounds, or inf beside the implied +Inf, export two buckets of one label: an invalid exposition)
        listed = list(buckets) if not isinstance(buckets, (str, bytes)) else None
        if listed is None or not all(isinstance(bound, (int, float)) and not isinstance(bound, bool)
                                     and finite_number(bound) for bound in listed) or len(set(listed)) < len(listed):
            raise MetricsError(f"BatchLatency(buckets={buckets!r:.200}) takes distinct finite numbers of seconds, "
                               f"the buckets' upper bounds (+Inf is implied), e.g. (0.1, 1.0, 10.0)")
        self.buckets = tuple(sorted(float(bound) for bound in listed))
        self._mutex = threading.Lock()
        self._counts = [0] * (len(self.buckets) + 1)    # per bucket, not cumulative; the last is +Inf
        self._sum = 0.0
        # Outcomes whose seconds are no duration (NaN, negative, infinite, no number): left out of the counts and
        # the sum, which one of them would corrupt for good (a NaN or infinite sum, a sum that goes down).
        self._skipped = 0
        # Invariant: _last is the newest outcome counted (kept alive, so ``is`` never matches a newcomer).
        self._last: Timed | None = None

    @property
    def skipped(self) -> int:
        """How many outcomes were left out because their ``seconds`` is no duration (NaN, negative, infinite, no
        number)."""
        with self._mutex:
            return self._skipped

    def absorb(self, outcomes: Sequence[Timed]) -> int:
        """Count the outcomes after the last one read (``outcomes`` oldest first); returns how many were counted.
        One whose ``seconds`` is no duration is read, left out and counted in :attr:`skipped`."""
        with self._mutex:
            start = next((index + 1 for index in range(len(outcomes) - 1, -1, -1) if outcomes[index] is self._last), 0)
            fresh = outcomes[start:]
            counted = 0
            for outcome in fresh:
                seconds = _duration(outcome.seconds)
                if not 0 <= seconds < math.inf:
                    self._skipped += 1
                    continue
                self._counts[bisect.bisect_left(self.buckets, seconds)] += 1
                self._sum += seconds
                counted += 1
            if fresh:
                self._last = fresh[-1]
            return counted

    def snapshot(self) -> tuple[list[tuple[str, int]], float]:
        """``([(upper bound, cumulative count), ...], sum)`` in the Prometheus client's bucket format."""
        with self._mutex:
            counts, total = list(self._counts), self._sum
        bounds = [*(repr(float(bound)) for bound in self.buckets), "+Inf"]
        return list(zip(bounds, itertools.accumulate(counts))), total


def _duration(given: object) -> float:
    """``given`` as seconds, NaN if it is no number (a text, a bool, None)."""
    if isinstance(given, (bool, str, bytes)):
        return math.nan
    try:
        return float(given)     # type: ignore[arg-type]  # (a Decimal, a numpy float: what float() takes)
    except (TypeError, ValueError, OverflowError):
        return math.nan
