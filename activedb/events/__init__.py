"""Events, their kinds and event specifications.  Design note: ``README.md``."""

from activedb.events._model import Event, EventKind, EventSpec, Origin, new_event
from activedb.events._progress import Punctuations, Watermark
from activedb.events._time import (FOREVER_SECONDS, AccuracyInterval, Duration, Instant, LocalClock, Order, TimeLike, TimeUnit, Timestamp,
                                   age_seconds, as_timestamp, check_time, earlier, elapsed, hull, local_order, order, precedes,
                                   seconds, uncertain)

__all__ = ["AccuracyInterval", "Duration", "Event", "EventKind", "EventSpec", "Instant", "LocalClock", "Order", "Origin",
           "Punctuations", "TimeLike", "Watermark", "TimeUnit", "Timestamp", "FOREVER_SECONDS", "age_seconds", "as_timestamp", "check_time", "earlier",
           "elapsed", "hull", "local_order", "new_event", "order", "precedes", "seconds", "uncertain"]
