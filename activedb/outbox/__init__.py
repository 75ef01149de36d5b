"""The outbox: detached-family rule firings recorded durably, run exactly once.  Design note: ``README.md``.

Public names: :class:`Outbox` (``db.outbox``), :class:`OutboxStatistics`, :class:`FailedFiring`.
"""

from activedb.outbox._outbox import FailedFiring, Outbox, OutboxStatistics

__all__ = ["Outbox", "OutboxStatistics", "FailedFiring"]
