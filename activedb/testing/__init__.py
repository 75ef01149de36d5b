"""Test helpers: checkers of recorded histories (:func:`check_history` and :func:`replay`,
:func:`check_list_append`, :func:`check_stream_history`) and the waits concurrency tests use
(:func:`wait_until`, :class:`Watchdog`, :class:`Sequencer`).  What each checker checks, by paper and
section, is the design note ``activedb/testing/README.md``.
"""

from lockmgr.testing import Sequencer, Watchdog, wait_until  # the project's one copy of each

from activedb.testing._append_history import (Anomaly, AnomalyKind, Dependency, DependencyKind, ListAppendReport,
                                              ListAppendStatistics, Outcome, RecordedTransaction)
from activedb.testing._history import HistoryReport, check_history, replay
from activedb.testing._list_append import check_list_append
from activedb.testing._streams import StreamAnomaly, StreamHistoryReport, StreamViolation, check_stream_history

__all__ = ["Anomaly", "AnomalyKind", "Dependency", "DependencyKind", "HistoryReport", "ListAppendReport",
           "ListAppendStatistics", "Outcome", "RecordedTransaction", "Sequencer", "StreamAnomaly",
           "StreamHistoryReport", "StreamViolation", "Watchdog", "check_history", "check_list_append",
           "check_stream_history", "replay", "wait_until"]
