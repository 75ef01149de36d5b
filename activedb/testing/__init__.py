"""The test kit: checkers of recorded histories (:func:`check_history` and :func:`replay`,
:func:`check_list_append`, :func:`check_stream_history`), the interleaving runner (:class:`Interleavings`), the
waits concurrency tests use (:func:`wait_until`, :class:`Watchdog`, :class:`Sequencer`) and the manual clock
(:class:`ManualClock`, from ``activedb.clock``); the pytest plugin is ``activedb.testing.pytest_plugin``.  What
each checker checks, by paper and section, and how to test an application's rules: the design note
``activedb/testing/README.md``.

The names are imported on first use (PEP 562): pytest loads the plugin at every start, and it needs none of them.
"""

from activedb import lazy
from activedb.testing.errors import (DatabaseFixtureError, InterleavingError, InterleavingFailed, InterleavingHang,
                                     InvalidSchedule, NondeterministicRun)

__all__ = ["Anomaly", "AnomalyKind", "ChoiceTree", "DatabaseFixtureError", "Dependency", "DependencyKind",
           "Exploration", "HistoryReport", "InterleavingError", "InterleavingFailed", "InterleavingHang",
           "Interleavings", "InvalidSchedule", "ListAppendReport", "ListAppendStatistics", "ManualClock",
           "NondeterministicRun", "Outcome", "RecordedTransaction", "RunReport", "Schedule", "Sequencer", "StepKind",
           "StreamAnomaly", "StreamHistoryReport", "StreamViolation", "Verdict", "Watchdog", "check_history",
           "check_list_append", "check_stream_history", "replay", "wait_until"]

__getattr__, __dir__ = lazy.exports(__name__, {
    "lockmgr.testing": ["Sequencer", "Watchdog", "wait_until"],        # the project's one copy of each
    "activedb.clock": ["ManualClock"],
    "activedb.testing._append_history": ["Anomaly", "AnomalyKind", "Dependency", "DependencyKind", "ListAppendReport",
                                         "ListAppendStatistics", "Outcome", "RecordedTransaction"],
    "activedb.testing._choices": ["ChoiceTree"],
    "activedb.testing._history": ["HistoryReport", "check_history", "replay"],
    "activedb.testing._interleavings": ["Exploration", "Interleavings", "RunReport", "Schedule", "StepKind", "Verdict"],
    "activedb.testing._list_append": ["check_list_append"],
    "activedb.testing._streams": ["StreamAnomaly", "StreamHistoryReport", "StreamViolation", "check_stream_history"],
})
