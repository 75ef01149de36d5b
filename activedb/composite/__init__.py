"""Composite events from many producers: accuracy-interval time, stability, uncertain order raised.

After C. Liebig, M. Cilia, A. Buchmann, *Event Composition in Time-dependent Distributed Systems*.
Events carry accuracy-interval timestamps (``activedb.events.Timestamp``) naming their producer; the
engine keeps per-producer sync-points (moved by events and heartbeats), composes ``AND``/``SEQ`` patterns
of ``activedb.streams``' algebra under chronicle or recent consumption once the candidates are stable, and
raises :class:`UncertainOrder` (or asks ``on_uncertain``) instead of guessing::

    from activedb import composite, streams
    from activedb.events import Timestamp

    engine = composite.CompositionEngine(db, name="fig2", clock=composite.ManualClock())
    engine.create_stream("s", types=["A", "B"], attributes=["id"])
    engine.define("CREATE QUERY AB PATTERN AND(A, B) CONSUMING CHRONICLE RETURN A.id AS a, B.id AS b")
    engine.join("PA", types=["A"]); engine.join("P1B", types=["B"]); engine.join("P2B", types=["B"])
    engine.signal(streams.StreamEvent("A", Timestamp.at(10.0, 0.005, producer="PA"), {"id": "a0"}))
    engine.heartbeat("P2B", Timestamp.at(10.2, 0.005))
    @db.rule(on=engine.spec("AB"))
    def react(tx, event): ...                      # event.ts is the composite's interval
    with db.transaction() as tx:
        engine.process(tx, batch)                  # composites emitted into tx; state restored on abort
    composite.plot(engine.window(), "window.png")

Design note: ``activedb/composite/README.md``.
"""

from activedb.composite import errors
from activedb import lazy
from activedb.composite.errors import (
    CompositeError,
    EventRejected,
    LateEvent,
    MembershipError,
    ProducerTimeout,
    UncertainOrder,
)


def plot(window, path, **options):
    """Draw ``window`` (``engine.window()``) to a PNG at ``path``; see ``activedb.composite._plot.plot``."""
    from activedb.composite._plot import plot as draw

    return draw(window, path, **options)


__all__ = [
    "Choice", "CompositeError", "CompositeEvent", "CompositeStatistics", "CompositionEngine", "DEFAULT_TIMEOUT",
    "EventRejected", "Heartbeat", "Invalidation", "Item", "LateEvent", "ManualClock", "MembershipError", "MonotonicClock", "POList", "ProducerInfo",
    "ProducerTimeout", "Resolution", "TimeoutPolicy", "UncertainOrder", "Uncertainty", "UncertaintyKind", "Window",
    "WindowEntry", "errors", "plot",
]

# imported on first use: `import activedb.composite` stays fast (the CLI's start)
__getattr__, __dir__ = lazy.exports(__name__, {
    "activedb.composite._clock": ["ManualClock", "MonotonicClock"],
    "activedb.composite._engine": ["DEFAULT_TIMEOUT", "CompositionEngine"],
    "activedb.composite._records": ["CompositeStatistics", "ProducerInfo", "TimeoutPolicy", "Window", "WindowEntry"],
    "activedb.composite._model": [
        "Choice", "CompositeEvent", "Heartbeat", "Invalidation", "Resolution", "Uncertainty", "UncertaintyKind",
    ],
    "activedb.composite._polist": ["Item", "POList"],
})
