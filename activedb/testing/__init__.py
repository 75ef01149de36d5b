"""Test helpers: history checks, observable-state waits and a watchdog.

* :func:`check_history` verifies a recorded history (``connect(record_history=True)``):
  conflict serializability of the committed top-level transactions (their
  precedence graph is acyclic, checked with networkx) and the ACTA axioms of
  Concurrent Rule Execution §3.3.1 that apply to parallel nested transactions:

  1. a parent commits only after all its children ended;
  2. a committed child's operations are delegated to its parent — the write set a
     top-level transaction flushed is exactly the composition, in order, of the
     writes of its transactions whose every ancestor committed;
  3. an aborted transaction's operations are all undone (none reaches a flush);
  4. the abort of a parent aborts its active children (no descendant commits after
     its ancestor aborted).

* :func:`check_list_append` checks a list-append history that a test recorded itself, in the
  manner of Jepsen's Elle but for transaction trees: every level of a tree (the top-level
  transactions, and the committed children of each node with the node's own operations) must be
  serializable, with no aborted, intermediate or lost append.  Its docstring is the design note; it
  returns a :class:`ListAppendReport` (``ok``, ``anomalies``, ``kinds()``, ``assert_ok()``).
* :func:`replay` gives the state a serial execution of the committed top-level
  transactions, in commit order, produces from an initial state.
* :func:`check_stream_history` checks Active CEP's Definition 6 on a stream history
  (``StreamEngine(record_history=True)``) and reports every read-too-late and
  write-too-late with the operations involved.
* :func:`wait_until` waits for observable state with a hard timeout;
  :class:`Watchdog` turns a hang into a test failure that prints the wait-for graph;
  :class:`Sequencer` orders blocks of several threads (re-exported from ``lockmgr.testing``).
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
