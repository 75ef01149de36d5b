"""The outbox: detached-family rule firings recorded durably, run exactly once.  Design note: ``README.md``.

Public names: :class:`Outbox` (``db.outbox``), :class:`OutboxStatistics`, :class:`FailedFiring`,
:data:`GROUP_TRANSACTION` (the name of the top-level transactions that run recorded firings), :class:`TakePacer`
(extender tier: what :meth:`Outbox.pace_takes` takes).
"""

from activedb.outbox._executor import GROUP_TRANSACTION, TakePacer
from activedb.outbox._outbox import FailedFiring, Outbox, OutboxOptions, OutboxStatistics

__all__ = ["Outbox", "OutboxOptions", "OutboxStatistics", "FailedFiring", "GROUP_TRANSACTION", "TakePacer"]
