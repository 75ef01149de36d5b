"""The composite engine's clocks are activedb's (``activedb.clock``): ``ManualClock``, and ``MonotonicClock``,
the name composite first gave the system clock.  Never mixed with application time (the accuracy intervals)."""

from activedb.clock import ManualClock, SystemClock as MonotonicClock

__all__ = ["ManualClock", "MonotonicClock"]
