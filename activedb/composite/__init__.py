"""Composite events from many producers: accuracy-interval time, stability, uncertain order raised
(after C. Liebig, M. Cilia, A. Buchmann, *Event Composition in Time-dependent Distributed Systems*).

Public interface: :class:`CompositionEngine` (``create_stream``, ``define``/``query``, ``join``/``leave``,
``signal``/``heartbeat``/``submit``/``process``, ``spec`` for rules, ``window`` for :func:`plot`), its
records and errors; :class:`CompositeHandler` (batches of any ingestion connector into an engine:
``handler=CompositeHandler(engine)``), :func:`rows_to_items`, :func:`feed_batch`.  The example is
docs/howto/composite-events.md's; the design note is
``activedb/composite/README.md``.
"""

from typing import TYPE_CHECKING

from activedb.composite import errors
from activedb import lazy
from activedb.composite.errors import (CompositeError, EventRejected, LateEvent, MembershipError, ProducerTimeout,
                                       UncertainOrder)

__all__ = ["Choice", "CompositeError", "CompositeEvent", "CompositeHandler", "CompositeStatistics", "CompositionEngine",
           "DEFAULT_TIMEOUT", "EventRejected", "FeedResult", "Heartbeat", "Invalidation", "Item", "LateEvent",
           "ManualClock", "MembershipError", "MembershipKind", "MonotonicClock", "POList", "ProducerInfo",
           "ProducerTimeout", "Resolution", "TimeoutPolicy", "UncertainOrder", "Uncertainty", "UncertaintyKind", "Window",
           "WindowEntry", "errors", "feed_batch", "plot", "rows_to_items"]

# imported on first use: `import activedb.composite` stays fast (the CLI's start)
__getattr__, __dir__ = lazy.exports(__name__, {
    "activedb.composite._clock": ["ManualClock", "MonotonicClock"],
    "activedb.composite._engine": ["DEFAULT_TIMEOUT", "CompositionEngine"],
    "activedb.composite._ingest": ["CompositeHandler", "FeedResult", "feed_batch", "rows_to_items"],
    "activedb.composite._records": ["CompositeStatistics", "MembershipKind", "ProducerInfo", "TimeoutPolicy", "Window",
                                    "WindowEntry"],
    "activedb.composite._model": ["Choice", "CompositeEvent", "Heartbeat", "Invalidation", "Resolution", "Uncertainty",
                                  "UncertaintyKind"],
    "activedb.composite._polist": ["Item", "POList"],
    "activedb.composite._plot": ["plot"],
})

if TYPE_CHECKING:  # the names above, for type checkers (tests/test_typing.py keeps both lists equal)
    from activedb.composite._clock import ManualClock as ManualClock, MonotonicClock as MonotonicClock
    from activedb.composite._engine import CompositionEngine as CompositionEngine, DEFAULT_TIMEOUT as DEFAULT_TIMEOUT
    from activedb.composite._ingest import (
        CompositeHandler as CompositeHandler, FeedResult as FeedResult, feed_batch as feed_batch,
        rows_to_items as rows_to_items)
    from activedb.composite._records import (
        CompositeStatistics as CompositeStatistics, MembershipKind as MembershipKind, ProducerInfo as ProducerInfo,
        TimeoutPolicy as TimeoutPolicy, Window as Window, WindowEntry as WindowEntry)
    from activedb.composite._model import (
        Choice as Choice, CompositeEvent as CompositeEvent, Heartbeat as Heartbeat, Invalidation as Invalidation,
        Resolution as Resolution, Uncertainty as Uncertainty, UncertaintyKind as UncertaintyKind)
    from activedb.composite._polist import Item as Item, POList as POList
    from activedb.composite._plot import plot as plot
