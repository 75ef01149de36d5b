"""A :class:`~activedb.clock.ManualClock` that lets a test act between a thread's reading of the clock and what the
thread does next: the race of a caller that computes a deadline from ``now()`` and then sleeps until it."""

from __future__ import annotations

import threading

from activedb.clock import ManualClock

TIMEOUT = 60


class ReadPausingClock(ManualClock):
    """A manual clock whose next :meth:`now` on the thread named by :meth:`pause_next_read` stops after reading: it
    sets :attr:`read` and returns (the value it read) only once the test sets :attr:`go` — the test advances the clock
    in between.  Thread-safety: as ``ManualClock``'s; ``_armed`` is written by the test before the read it arms."""

    def __init__(self) -> None:
        super().__init__()
        self._armed: str | None = None
        self.read = threading.Event()
        self.go = threading.Event()

    def pause_next_read(self, thread_name: str) -> None:
        """Stop the next :meth:`now` read on the thread named ``thread_name``."""
        self.read.clear()
        self.go.clear()
        self._armed = thread_name

    def now(self) -> float:
        value = super().now()
        if self._armed is not None and threading.current_thread().name == self._armed:
            self._armed = None
            self.read.set()
            if not self.go.wait(TIMEOUT):
                raise AssertionError(f"ReadPausingClock: the test did not let the read of {value} go on")
        return value
