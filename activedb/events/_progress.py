"""Punctuations (Active CEP, Appendix F): per source, the event time before which no more events will
come; monotone.  Thread-safety: ``_mutex`` protects ``_marks`` (a leaf: nothing is called while it is
held).
"""

from __future__ import annotations

import datetime as dt
import threading
from typing import TypeAlias

from activedb.errors import BadArgument, InvalidTime
from activedb.events._time import Instant, check_time

#: An event time a punctuation names (an :data:`~activedb.events.Instant`): Spark's watermarks are datetimes, the
#: engines' own clocks numbers.
Watermark: TypeAlias = Instant


class Punctuations:
    """The latest punctuation of every source (in memory; the bridge re-seeds it from its ledger)."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._marks: dict[str, Watermark] = {}

    def punctuate(self, source: str, watermark: Watermark) -> bool:
        """Record that no event of ``source`` older than ``watermark`` will come; True if it advanced.

        Raises :class:`~activedb.errors.InvalidTime` unless ``watermark`` is a finite number of seconds or an aware
        datetime, of the kind of the source's earlier punctuations (a NaN would never be passed)."""
        if not isinstance(source, str) or not source:
            raise BadArgument(f"punctuate(source={source!r}): a source is the non-empty name of a stream or query")
        what = f"the watermark of source {source!r}"
        check_time(watermark, what)
        with self._mutex:
            current = self._marks.get(source)
            if current is not None and isinstance(current, dt.datetime) != isinstance(watermark, dt.datetime):
                kind = "aware datetimes" if isinstance(current, dt.datetime) else "numbers of seconds"
                raise InvalidTime(f"{what} {watermark!r} is not of the kind of its earlier punctuations "
                                  f"({current!r}); give {kind}, as before")
            if current is None or watermark > current:     # type: ignore[operator]  # one kind per source
                self._marks[source] = watermark
                return True
            return False

    def watermark(self, source: str) -> Watermark | None:
        """The latest punctuation of ``source`` (None before the first)."""
        return self._marks.get(source)

    def marks(self) -> dict[str, Watermark]:
        """Every source's latest punctuation (a copy): for a reader that finds its source otherwise than by its
        exact spelling (a stream engine finds a stream's ignoring case, as a query's ``ON`` does)."""
        with self._mutex:
            return dict(self._marks)
