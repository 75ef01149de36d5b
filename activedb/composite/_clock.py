"""System time for input-node timeouts, injectable so that tests never read the wall clock:
:class:`MonotonicClock` (the default) and :class:`ManualClock` (moved by ``advance``).  Never mixed
with application time (the accuracy intervals).
"""

from __future__ import annotations

import threading
import time


class MonotonicClock:
    """``now()`` in seconds from ``time.monotonic()``.  Thread-safe."""

    def now(self) -> float:
        return time.monotonic()


class ManualClock:
    """A clock that moves only when told.  Thread-safe (``_mutex`` protects ``_now``, a leaf)."""

    def __init__(self, start: float = 0.0):
        self._mutex = threading.Lock()
        self._now = float(start)

    def now(self) -> float:
        with self._mutex:
            return self._now

    def advance(self, seconds: float) -> float:
        if seconds < 0:
            raise ValueError("a clock does not move backwards; advance by a non-negative amount")
        with self._mutex:
            self._now += seconds
            return self._now
