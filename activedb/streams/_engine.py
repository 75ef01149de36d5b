"""The stream engine: :class:`StreamEngine`, the coordinator of a batch's steps — admit,
release, run the s-transactions on the scheduler, record dead letters and save the state in
the caller's transaction.  The design note (steps, exactly once, mutex order) is
``activedb/streams/README.md``.

Thread-safety: ``_mutex`` protects ``_state``, ``_pending``, ``_windows`` and the definitions; it is taken
before ``BatchRun._mutex`` and never held while running user code, the store or the scheduler.
"""

from __future__ import annotations

import contextlib
import itertools
import reprlib
import threading
import time
from typing import TYPE_CHECKING, Callable, Hashable, Iterable, Mapping, Sequence, TypeVar, cast

from activedb import lowlevel
from activedb import deadletters
from activedb.errors import check_switch
from activedb.txn import TxnState
from activedb.streams import _persist
from activedb.streams import algebra as ast
from activedb.streams._batch import AccessPlan, BatchResult, BatchRun, STransaction, prefetch
from activedb.streams._builders import PatternLike, Returns, RuleAction, query_definition, rule_definition
from activedb.streams._catalog import StoreCatalog, StreamSchema, TableAliases, fold
from activedb.streams._compile import CompiledQuery, CompiledRule
from activedb.streams._definitions import Definitions
from activedb.streams._events import DeadLetter, Punctuation, StreamEvent, ts_less
from activedb.streams._history import StreamHistory
from activedb.streams._matcher import PartitionState
from activedb.streams._metrics import Metrics, StreamStatistics
from activedb.streams._reorder import ReorderBuffer, letter_rows
from activedb.streams._scheduler import Scheduler, SchedulerKind, make_scheduler
from activedb.streams._state import BatchOutcome, Pending, State, WindowIndex
from activedb.streams.errors import StreamError, StreamStateError, UnknownQuery

if TYPE_CHECKING:  # pragma: no cover
    from activedb._handle import DatabaseHandle
    from activedb.txn import Transaction

_Action = TypeVar("_Action", bound=Callable[..., object])


class StreamEngine:
    """Pattern queries and ON OUTPUT rules over a stream, with s-transactions on ``db``'s store.

    * ``name`` — identifies the engine's saved state and its dead letters
      (``query_id = "streams:<name>"``);
    * ``scheduler`` — ``"sei"`` (default), ``"s2pl"``, ``"lwm"`` (tuple locks, 8 s-transactions at a
      time), ``"unscheduled"`` (tests) or a :class:`Scheduler` instance
      (``streams.LWMScheduler(granularity="table", workers=16)``);
    * ``aliases`` — map logical table/column names of definitions to the store's
      (``{"workerStatus": ("worker_status", {"workerID": "worker"})}``);
    * ``record_history`` — keep the stream history for ``activedb.testing.check_stream_history``;
    * ``durable`` — save the buffer and matcher state in ``activedb_stream_state`` within each
      batch's transaction (exactly once across restarts); ``False`` keeps it in memory only;
    * ``record_dead_letters`` — insert dead letters into ``activedb_dead_letters`` in the
      batch's transaction (``False``: only return them, e.g. when the caller records its own);
    * ``keep_outputs`` — return every output in ``BatchResult.outputs``;
    * ``prefetch`` — before a batch's s-transactions run, load the rows their access plans
      name with one ``tx.prefetch`` per table (read-locks them for the batch);
    * ``lowered`` — under SEI, run an s-transaction that names every row it touches on the batch's
      overlay instead of a subtransaction of its own (the same result, at a fraction of the cost; the
      design note's "SEI without a subtransaction per event"); ``False`` gives each its subtransaction.

    ``db`` closed already is refused with its own ``TransactionError`` (connect again, make the engine on the new
    ``Database``), as the engine's first batch would be.

    Extension hook: :meth:`store_operation`, which a subclass overrides.

    Thread-safety: definitions and ``statistics()`` may be used from any thread; batches
    are processed one at a time (a second concurrent batch raises ``StreamStateError``).
    """

    def __init__(self, db: DatabaseHandle, *, name: str = "streams",
                 scheduler: SchedulerKind | Scheduler = SchedulerKind.SEI,
                 aliases: TableAliases | None = None, record_history: bool = False, durable: bool = True,
                 record_dead_letters: bool = True, keep_outputs: bool = True, prefetch: bool = True,
                 lowered: bool = True):
        if not isinstance(name, str) or not name.strip():
            raise StreamError("a StreamEngine needs a non-empty name (it keys the engine's saved state)")
        switches = {"record_history": record_history, "durable": durable, "record_dead_letters": record_dead_letters,
                    "keep_outputs": keep_outputs, "prefetch": prefetch, "lowered": lowered}
        for switch, value in switches.items():
            check_switch("StreamEngine", switch, value, error=StreamError)
        _persist.require_open(db)       # (an engine on a closed Database would fail only at its first batch)
        self.db = db
        self.name = name
        self.scheduler = make_scheduler(scheduler)
        self.catalog = StoreCatalog(db, aliases)
        self.history: StreamHistory | None = StreamHistory() if record_history else None
        self.durable = durable
        self.record_dead_letters = record_dead_letters
        self.keep_outputs = keep_outputs
        self.prefetch = prefetch
        self.lowered = lowered
        # The views call the hook only when a subclass overrides it: an engine that does not pays nothing.
        overridden = type(self).store_operation is not StreamEngine.store_operation
        self._operation_hook: Callable[[str], None] | None = self.store_operation if overridden else None
        self.metrics = Metrics(self.scheduler.name)
        self._mutex = threading.RLock()
        self._definitions = Definitions(self.catalog, self._mutex)
        self._reorder = ReorderBuffer(name, self.metrics, lambda: self.db.punctuations.marks(),
                                      self._definitions.unkeyable,
                                      (lambda event: _persist.unsaveable(event, name)) if durable else None)
        self._state = State()
        self._pending: Pending | None = None
        # The partitions of queries with WITHIN by their earliest event (a hint: cleared whenever the state is read
        # or a batch's is dropped).
        self._windows = WindowIndex()
        self._loaded = not durable
        self._processing = threading.Lock()
        self._processing_thread: int | None = None     # (whose batch it is: a re-entry is told apart)
        self._batch_serials = itertools.count(1)

    # --- definitions (kept by Definitions) -----------------------------------------------------

    def create_stream(self, name: str, *, types: Sequence[str] | None = None, attributes: Sequence[str] = (),
                      type_attributes: Mapping[str, Sequence[str]] | None = None,
                      priorities: Mapping[str, float] | None = None,
                      tie_key: Callable[[StreamEvent], object] | None = None) -> StreamSchema:
        """Declare an input stream (see :class:`~activedb.streams._catalog.StreamSchema`)."""
        return self._definitions.add_stream(StreamSchema(name, types, attributes,  # type: ignore[arg-type]
                                                         type_attributes, priorities, tie_key))  # type: ignore[arg-type]

    def define(self, text: str) -> list[CompiledQuery | CompiledRule]:
        """Define every ``CREATE QUERY`` / ``CREATE RULE`` of ``text``, in order — all of them, or none when one is
        refused (a ``DefinitionError`` with its line and column)."""
        return self._definitions.define(text)

    def query(self, name: str, *, pattern: PatternLike, returns: Returns, where: object = None,
              within: float | None = None,
              stream: str | None = None, selection: ast.Selection | str = ast.Selection.SKIP_TILL_ANY_MATCH,
              priority: float | None = None) -> CompiledQuery:
        """Define a query in Python (see ``activedb.streams.seq``, ``event``, ``store``)."""
        return cast(CompiledQuery, self._definitions.add(query_definition(
            name, pattern=pattern, returns=returns, where=where, within=within, stream=stream, selection=selection,
            priority=priority)))

    def rule(self, name: str, *, on_output: str, action: RuleAction | Sequence[RuleAction], when: object = None,
             priority: float | None = None,
             new: str = "NEW", reads: Iterable[str] | None = None, writes: Iterable[str] | None = None,
             replace: bool = False) -> CompiledRule:
        """Define an ON OUTPUT rule in Python.  ``action``: an action built with
        ``streams.update``/``insert``/``delete``, a list of them, or a callable ``(tx, new)``
        (``reads``/``writes`` declare the tables a callable may touch)."""
        return cast(CompiledRule, self._definitions.add(rule_definition(
            name, on_output=on_output, action=action, when=when, priority=priority, new=new, reads=reads,
            writes=writes, replace=replace)))

    def on_output(self, query: str, *, name: str | None = None, when: object = None, priority: float | None = None,
                  new: str = "NEW", reads: Iterable[str] | None = None, writes: Iterable[str] | None = None,
                  replace: bool = False) -> Callable[[_Action], _Action]:
        """Decorator: ``@engine.on_output("Q1", writes=["alerts"])`` over ``def f(tx, new)`` (the keywords: as
        :meth:`rule`'s)."""
        def decorate(function: _Action) -> _Action:
            self.rule(name or function.__name__, on_output=query, action=function, when=when, priority=priority,
                      new=new, reads=reads, writes=writes, replace=replace)
            return function
        return decorate

    @property
    def queries(self) -> dict[str, CompiledQuery]:
        return self._definitions.queries()

    @property
    def rules(self) -> dict[str, CompiledRule]:
        return self._definitions.rules()

    @property
    def streams(self) -> dict[str, StreamSchema]:
        return self._definitions.streams()

    def access_plan(self, event: StreamEvent) -> AccessPlan:
        """The store resources ``event``'s s-transaction may read and write (Active CEP
        Algorithm 1, narrowed to what this engine can do: queries read the store only at
        their accepting events, rules fire only there).  A key comes from the event when
        the definitions derive it from the event's attributes, as the store names the row
        (``TableInfo.key``); otherwise the table."""
        return self._definitions.access_plan(event)

    # --- extension hook ---------------------------------------------------------------------------

    def store_operation(self, kind: str) -> None:
        """Called before every store operation of an s-transaction, once its lock is granted, with ``kind``
        ``"read"`` or ``"write"``, in the thread that runs the s-transaction; it may sleep or raise (the error
        fails the s-transaction as the operation's own would).  Does nothing here; a subclass overrides it to
        model a store whose operations cost a round trip (the repository's ``benchmarks/streams.py``) or to
        fail at a chosen operation.  Only an engine whose class overrides it calls it at all."""

    # --- processing ------------------------------------------------------------------------------

    def process(self, tx: Transaction, events: Iterable[StreamEvent | Mapping[str, object]], *,
                punctuation: Punctuation | None = None, punctuations: Mapping[str, Punctuation] | None = None,
                batch_id: int | None = None) -> BatchResult:
        """Admit ``events``, release what the punctuations allow, and run the released
        events' s-transactions inside ``tx`` (the steps: see the design note).

        ``punctuation`` applies to the engine's only stream (or every stream);
        ``punctuations`` gives one per stream, named as an event's ``stream=`` names it (the one spelled so, else
        the one equal to it ignoring case; an unknown name, or one stream named twice, is a ``StreamError``); each
        stream's ``db.punctuate`` is taken as well, its source found the same way (``db.watermark(stream)``, or
        the one source equal to it ignoring case).  A stream's punctuation is the greatest it was given; a lower one
        changes nothing.  ``END_OF_STREAM`` releases everything.  ``batch_id`` is written
        with the dead letters.  Raises only when the batch cannot go on (then ``tx``
        should be aborted; the engine's state stays as before the batch) — except a refused
        punctuation (``StreamError``), which changes nothing: the call may be made again in ``tx``."""
        if isinstance(events, (StreamEvent, Mapping, str, bytes)) or not isinstance(events, Iterable):
            # (One event where a batch belongs would be taken apart: a mapping's keys each a dead letter.)
            raise StreamError(f"events is {type(events).__name__} {reprlib.repr(events)}, not a collection of events: give a "
                              f"list of StreamEvent objects or mappings — a batch of one event is [event]; nothing "
                              f"was processed")
        if batch_id is not None and (isinstance(batch_id, bool) or not isinstance(batch_id, int)
                                     or not -2 ** 63 <= batch_id < 2 ** 63):
            raise StreamError(f"process(batch_id={reprlib.repr(batch_id)}) takes a whole number (written with the batch's dead "
                              f"letters, a 64-bit integer) or None; nothing was processed")
        if punctuations is not None and not isinstance(punctuations, Mapping):
            raise StreamError(f"punctuations= maps each stream's name to its punctuation ({{'stream': 5}}), got "
                              f"{reprlib.repr(punctuations)}; for every stream at once give punctuation=; nothing was processed")
        if not self._processing.acquire(blocking=False):
            if self._processing_thread == threading.get_ident():
                raise StreamStateError(f"engine {self.name} is already processing a batch in this thread (a rule "
                                       f"action or callback of the batch started another): a batch cannot start "
                                       f"inside a batch of the same engine; feed those events after this batch "
                                       f"returns")
            raise StreamStateError(f"engine {self.name} is already processing a batch in another thread; batches "
                                   f"of one engine run one at a time")
        self._processing_thread = threading.get_ident()
        try:
            return self._process(tx, events, punctuation, punctuations, batch_id)
        finally:
            self._processing_thread = None
            self._processing.release()

    def feed(self, events: Iterable[StreamEvent | Mapping[str, object]], *, punctuation: Punctuation | None = None,
             punctuations: Mapping[str, Punctuation] | None = None) -> BatchResult:
        """``process`` in a top-level transaction of its own (committed before returning)."""
        with self.db.transaction(name=f"streams:{self.name}") as tx:
            return self.process(tx, events, punctuation=punctuation, punctuations=punctuations)

    def _process(self, tx: Transaction, events: Iterable[StreamEvent | Mapping[str, object]],
                 punctuation: Punctuation | None, punctuations: Mapping[str, Punctuation] | None,
                 batch_id: int | None) -> BatchResult:
        began = time.perf_counter()
        root = tx.root
        with self._mutex:
            self._load()
            pending = self._pending
            if pending is not None and pending.root is not root:
                raise StreamStateError(
                    f"engine {self.name} has a batch in transaction {pending.root.id} that is still "
                    f"{pending.root.state.value}; commit or abort it before the next batch")
            if pending is not None and pending.node is not tx:
                # (The state follows the node its batches ran in: a batch of another node would follow the wrong one.)
                node = pending.node
                if node.parent is not tx or node.state is not TxnState.COMMITTED:
                    raise StreamStateError(
                        f"engine {self.name} ran a batch in transaction {node.id} of this tree, which is "
                        f"{node.state.value}; process the tree's batches in that transaction (or, once it committed, "
                        f"in its parent): the engine's state follows the outcome of the transaction its batch ran in")
                pending.node = tx           # (its batch is tx's now: its participant moved to tx)
            if pending is None:
                pending = Pending(self._state, tx)
                lowlevel.enlist(tx, BatchOutcome(pending, self._settle))     # raises if tx cannot take a batch
                self._pending = pending
            streams = self._definitions.streams()
        if not streams:
            raise StreamStateError(f"engine {self.name} has no stream; declare one with engine.create_stream()")
        events = list(events)
        now = time.perf_counter()
        # A refused punctuation (StreamError) changes nothing: the admission is taken back, so a caller that retries
        # in the same transaction admits the events once.  (Admission comes first: the batch's first admitted event
        # fixes the kind of the engine's timestamps the punctuation is checked against.)
        mark = self._reorder.mark(pending)
        letters: list[DeadLetter] = self._reorder.admit_all(events, now, pending, streams)
        try:
            bound = self._reorder.bound(pending, streams, punctuation, punctuations)
        except StreamError:
            self._reorder.undo(pending, mark)
            raise
        self.metrics.arrived(len(events), now)
        admitted = len(events) - len(letters)
        previous = pending.released
        released = self._reorder.release(pending, bound, now)
        self.metrics.phase(buffer=time.perf_counter() - began)
        matchers = self._definitions.matchers
        # (a released event names its stream)
        stransactions = [STransaction(f"S{event.position}", event, matchers(event.stream, event.type),  # type: ignore[arg-type]
                                      self, plan)
                         for event, plan in zip(released, self._definitions.access_plans(released))]
        if self.prefetch and stransactions:
            prefetch(tx, stransactions)
        run = BatchRun(self, tx, pending, stransactions, serial=next(self._batch_serials),
                       definitions=self._definitions, one_thread=self.scheduler.one_thread)
        try:
            self.scheduler.run(run)
        finally:
            run.publish_metrics()
        # A concurrent scheduler ends s-transactions out of order: report in the declared order.
        run.outputs.sort(key=lambda output: output.position)
        run.dead_letters.sort(key=lambda letter: letter.event.position)  # type: ignore[arg-type,return-value]
        letters.extend(run.dead_letters)
        started = time.perf_counter()
        if pending.released is not None and (previous is None or ts_less(previous, pending.released)):
            # Every released event is matched: drop what the punctuation put out of every window.
            with self._mutex:
                visited = self._windows.expire(pending, self._definitions.matchers_by_query(), pending.released)
        else:
            visited = 0
        if letters and self.record_dead_letters:
            deadletters.insert(tx, f"streams:{self.name}", batch_id, [
                deadletters.Letter(letter.reason, *letter_rows(letter.event)) for letter in letters])
        if self.durable:
            visited += _persist.save(self, tx, pending)
        self.metrics.phase(state=time.perf_counter() - started)
        self.metrics.add(processing=time.perf_counter() - began, visited=visited)
        return BatchResult(admitted=admitted, released=len(released), processed=run.processed, failed=run.failed,
                           outputs=tuple(run.outputs), dead_letters=tuple(letters), buffered=len(pending.buffer),
                           punctuation=pending.released)

    # --- state -------------------------------------------------------------------------------

    def _settle(self, pending: Pending, committed: bool) -> None:
        """The top-level transaction of ``pending``'s batch ended (its ``BatchOutcome`` says so):
        committed, the pending state becomes the engine's; aborted, it is dropped."""
        with self._mutex:
            if self._pending is not pending:
                return
            self._pending = None
            if committed:
                self._state = pending.materialize()
                return
            self._windows.clear()       # (the batch's pruning took entries of partitions the state still holds)
            if self.history is not None and pending.units:
                self.history.abort_units(pending.units)     # their subtransactions were undone with the batch
            if pending.saved_rows:
                self._loaded = False        # its save changed which rows hold the partitions: load them again

    def _load(self) -> None:
        """Read the saved state unless it was read (a durable engine's first use, or after an aborted batch's save).
        Precondition: the caller holds ``_mutex``."""
        if not self._loaded:
            self._state, self._loaded = _persist.load(self), True
            self._windows.clear()

    def _committed(self) -> State:
        """The committed state, for inspection: the in-memory one, or (not yet loaded) the saved one, read but not
        kept — the batch that loads it checks the queries defined by then, which an inspection before ``define``
        would skip.  Precondition: the caller holds ``_mutex``."""
        return self._state if self._loaded else _persist.load(self)

    def reset_state(self) -> None:
        """Forget the buffer, partial matches and punctuations, in memory and (if durable)
        in the database.  Precondition: no batch is in progress.  A durable engine whose ``Database`` is closed raises
        its ``TransactionError`` (the saved state stays, for an engine made anew on the next ``Database``)."""
        with self._mutex:
            if self._pending is not None:
                raise StreamStateError(f"engine {self.name} has a batch in progress; finish it first")
            if self.durable:
                _persist.delete(self)
            self._state = State()
            self._windows.clear()
            self._loaded = True

    def buffered(self) -> list[StreamEvent]:
        """The events waiting in the reorder buffer, in their release order (a durable engine's saved ones too,
        before its first batch)."""
        with self._mutex:
            source = self._pending.buffer if self._pending is not None else self._committed().buffer
            return [event for _, _, event in source]

    def partitions(self, query: str) -> dict[tuple[Hashable, ...], PartitionState]:
        """The committed matcher states of ``query`` by partition key (for inspection; a durable engine's saved
        ones too, before its first batch).  ``query`` is found as definitions find it (ignoring case); one neither
        defined nor in the saved state raises :class:`~activedb.streams.errors.UnknownQuery`."""
        with self._mutex:
            partitions = self._committed().partitions
            found = None if not isinstance(query, str) else (
                fold(query, self.queries) or fold(query, {name for name, _ in partitions}))
            if found is None:
                raise UnknownQuery(f"engine {self.name}: partitions({query!r}) — no such query (defined: "
                                   f"{', '.join(self.queries) or 'none'})")
            return {key: state for (name, key), state in partitions.items() if name == found}

    def statistics(self) -> StreamStatistics:
        """The engine's figures; ``buffered`` and ``released_punctuation`` are those ``buffered()`` shows (a durable
        engine's saved state before its first batch).  A saved state that cannot be read leaves them the in-memory
        ones: statistics are polled, and the batch raises that error saying what to do."""
        with self._mutex:
            current: Pending | State = self._state
            if self._pending is not None:
                current = self._pending
            elif not self._loaded:
                with contextlib.suppress(StreamStateError):     # (the next batch, or buffered(), raises it)
                    current = self._committed()
            return self.metrics.snapshot(len(current.buffer), current.released)

    def __repr__(self) -> str:
        return f"<StreamEngine {self.name} {self.scheduler.name}: {len(self.queries)} queries, {len(self.rules)} rules>"
