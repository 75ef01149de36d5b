"""The test kit: checkers of recorded histories (:func:`check_history` and :func:`replay`,
:func:`check_list_append`, :func:`check_stream_history`), the interleaving runner (:class:`Interleavings`), the
waits concurrency tests use (:func:`wait_until`, :class:`Watchdog`, :class:`Sequencer`) and the manual clock
(:class:`ManualClock`, from ``activedb.clock``); the pytest plugin is ``activedb.testing.pytest_plugin``.  What
each checker checks, by paper and section, and how to test an application's rules: the design note
``activedb/testing/README.md``.

The names are imported on first use (PEP 562): pytest loads the plugin at every start, and it needs none of them.
"""

from typing import TYPE_CHECKING

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

if TYPE_CHECKING:  # the names above, for type checkers (tests/test_typing.py keeps both lists equal)
    from lockmgr.testing import Sequencer as Sequencer, Watchdog as Watchdog, wait_until as wait_until
    from activedb.clock import ManualClock as ManualClock
    from activedb.testing._append_history import (
        Anomaly as Anomaly, AnomalyKind as AnomalyKind, Dependency as Dependency, DependencyKind as DependencyKind,
        ListAppendReport as ListAppendReport, ListAppendStatistics as ListAppendStatistics, Outcome as Outcome,
        RecordedTransaction as RecordedTransaction)
    from activedb.testing._choices import ChoiceTree as ChoiceTree
    from activedb.testing._history import (
        HistoryReport as HistoryReport, check_history as check_history, replay as replay)
    from activedb.testing._interleavings import (
        Exploration as Exploration, Interleavings as Interleavings, RunReport as RunReport, Schedule as Schedule,
        StepKind as StepKind, Verdict as Verdict)
    from activedb.testing._list_append import check_list_append as check_list_append
    from activedb.testing._streams import (
        StreamAnomaly as StreamAnomaly, StreamHistoryReport as StreamHistoryReport, StreamViolation as StreamViolation,
        check_stream_history as check_stream_history)
