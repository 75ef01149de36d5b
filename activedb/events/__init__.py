"""Events, their kinds and event specifications.  Design note: ``README.md``."""

from activedb.events._model import Event, EventKind, EventSpec, Origin, new_event
from activedb.events._progress import Punctuations, Watermark
from activedb.events._time import (AccuracyInterval, LocalClock, Order, TimeUnit, Timestamp, as_timestamp, check_time,
                                   hull, local_order, order, precedes, seconds, uncertain)

__all__ = ["AccuracyInterval", "Event", "EventKind", "EventSpec", "LocalClock", "Order", "Origin", "Punctuations", "Watermark",
           "TimeUnit", "Timestamp", "as_timestamp", "check_time", "hull", "local_order", "new_event", "order", "precedes", "seconds", "uncertain"]
