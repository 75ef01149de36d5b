"""Stream transactions: pattern queries over the shared store, rules ON OUTPUT, and event-time
correctness (Wang, Rundensteiner, Ellison, *Active Complex Event Processing over Event Streams*).

Public interface: :class:`StreamEngine` (``create_stream``, ``define`` or ``query``/``rule``,
``process(tx, events, punctuation=…)`` per micro-batch, ``feed``, ``statistics``), :class:`QueriesHandler`
(batches of any ingestion connector into engines: ``handler=QueriesHandler(engine)``), the Python builders
(``seq``, ``event``, ``store``, …), the schedulers and the algebra, and the stream history (:class:`StreamHistory`,
:class:`StreamOp`: what ``activedb.testing.check_stream_history`` checks).  The design note is
``activedb/streams/README.md``.
"""

from activedb.streams import algebra
from activedb.streams._builders import (NEW, EventRef, PatternLike, Ref, Returns, RuleAction, component, conj, delete,
                                        event, exists, insert, lit, not_, query_definition, same, seq, store, update)
from activedb.streams._catalog import StreamSchema, TableAliases
from activedb.streams._compile import CompiledQuery, CompiledRule, compile_query
from activedb.streams._concurrent import (LockingScheduler, LWMScheduler, S2PLScheduler, SchedulerHooks,
                                          SchedulerStatistics)
from activedb.streams._batch import AccessPlan, BatchResult, BatchRun, Resource, STransaction
from activedb.streams._engine import StreamEngine
from activedb.streams._expressions import Ctx, ReadSpec, WriteSpec
from activedb.streams._events import END_OF_STREAM, DeadLetter, Output, Punctuation, StreamEvent
from activedb.streams._history import StreamHistory, StreamOp
from activedb.streams._ingest import Queries, QueriesHandler
from activedb.streams._language import parse
from activedb.streams._locks import LockMode, LWMLockTable, S2PLLockTable, StreamLockTable
from activedb.streams._matcher import PartitionState
from activedb.streams._metrics import QueryCounters, StreamStatistics
from activedb.streams._scheduler import Scheduler, SchedulerKind, SEIScheduler, UnscheduledScheduler
from activedb.streams._versions import DeferredWrite, VersionStatistics, VersionStore
from activedb.streams._view import DeclaredView, StoreView
from activedb.streams.algebra import Consumption, Selection
from activedb.streams import errors

__all__ = ["AccessPlan", "BatchResult", "BatchRun", "CompiledQuery", "CompiledRule", "Consumption", "Ctx",
           "DeadLetter", "DeclaredView", "DeferredWrite", "END_OF_STREAM", "EventRef", "LWMLockTable",
           "LWMScheduler", "LockMode", "LockingScheduler", "NEW", "Output", "PartitionState", "PatternLike",
           "Punctuation", "Queries", "QueriesHandler", "QueryCounters", "ReadSpec", "Ref", "Resource", "Returns",
           "RuleAction", "S2PLLockTable", "S2PLScheduler", "SEIScheduler", "STransaction", "Scheduler",
           "SchedulerKind", "SchedulerHooks", "SchedulerStatistics", "Selection", "StoreView", "StreamEngine",
           "StreamEvent", "StreamHistory", "StreamLockTable", "StreamOp", "StreamSchema", "StreamStatistics",
           "TableAliases", "UnscheduledScheduler", "VersionStatistics", "VersionStore", "WriteSpec", "algebra",
           "compile_query", "component", "conj", "delete", "errors", "event", "exists", "insert", "lit", "not_",
           "parse", "query_definition", "same", "seq", "store", "update"]
