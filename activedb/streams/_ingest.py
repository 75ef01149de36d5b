"""The queries path: batches of any ingestion connector into ``activedb.streams`` engines —
``handler=QueriesHandler(engine_or_list_or_factory, scheduler=…)``.  Design note: ``README.md`` in this
package ("Ingestion"); the batch protocol is ``activedb/ingest/README.md``.

Thread-safety: one batch at a time (``StreamEngine.process`` refuses a second concurrent one).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TypeAlias, Union

from activedb.deadletters import Letter
from activedb.ingest import BatchHandler, BatchInput, IngestionLedger
from activedb.ingest.errors import IngestError
from activedb.streams._engine import StreamEngine
from activedb.streams._events import END_OF_STREAM, DeadLetter, StreamEvent, event_row
from activedb.streams._metrics import StreamStatistics
from activedb.streams._scheduler import NAMED, Scheduler, SchedulerKind

if TYPE_CHECKING:  # pragma: no cover
    from activedb._handle import DatabaseHandle
    from activedb.ingest import EventMapping
    from activedb.txn import Transaction

__all__ = ["QueriesHandler", "build_engines"]


def _check_scheduler(scheduler: object) -> None:
    if scheduler is not None and not isinstance(scheduler, (str, Scheduler)):
        raise IngestError(f"scheduler must be one of {', '.join(NAMED)} or a streams.Scheduler such as "
                          f"streams.LWMScheduler(granularity='table'); got {scheduler!r}")
    if isinstance(scheduler, str) and scheduler not in NAMED:
        raise IngestError(f"unknown scheduler {scheduler!r}: use one of {', '.join(NAMED)} "
                          f"(or a configured streams.S2PLScheduler/LWMScheduler)")


#: What a :class:`QueriesHandler` runs: an engine, a list of them, or a factory ``factory(db, scheduler=…)`` (or
#: ``factory(db)``) returning one or a list.
Queries: TypeAlias = Union[StreamEngine, Sequence[StreamEngine],
                           Callable[..., Union[StreamEngine, Sequence[StreamEngine]]]]


def build_engines(db: DatabaseHandle, queries: Queries, scheduler: SchedulerKind | Scheduler | str | None
                  ) -> list[StreamEngine]:
    """The engines behind ``QueriesHandler(queries, scheduler)`` on ``db``, checked.

    ``queries`` is a :class:`~activedb.StreamEngine`, a list of them, or a factory
    ``factory(db, scheduler=…)`` (``factory(db)`` without ``scheduler=``) returning one or a list.
    ``scheduler`` (``"sei"``, ``"s2pl"``, ``"lwm"`` or a ``Scheduler``) must be the one each
    engine was built with (``QueriesHandler`` checked its kind)."""
    built: object = queries
    if callable(queries) and not isinstance(queries, StreamEngine):
        built = queries(db) if scheduler is None else queries(db, scheduler=scheduler)
    given = list(built) if isinstance(built, (list, tuple)) else [built]
    engines = [engine for engine in given if isinstance(engine, StreamEngine)]
    if not engines or len(engines) != len(given):
        raise IngestError(
            "QueriesHandler takes a streams.StreamEngine, a list of them, or a factory(db, scheduler=…) returning "
            f"them; got {queries!r}")
    names = [engine.name for engine in engines]
    if len(set(names)) != len(names):
        raise IngestError(f"two engines are named {sorted({n for n in names if names.count(n) > 1})[0]!r}: the name "
                          f"keys an engine's saved state, give each its own StreamEngine(name=…)")
    for engine in engines:
        if engine.db is not db:
            raise IngestError(f"engine {engine.name!r} was built on another Database than the one it is fed into; "
                              f"build it with StreamEngine(db, …) on the same db")
        if engine.record_dead_letters:
            raise IngestError(
                f"engine {engine.name!r} records its own dead letters (under 'streams:{engine.name}', without the "
                f"raw row); an ingestion stores them with the batch's raw rows under the run's ledger id: build it "
                f"with StreamEngine(db, …, record_dead_letters=False)")
        if not engine.streams:
            raise IngestError(f"engine {engine.name!r} has no stream: declare one with engine.create_stream(…) "
                              f"before feeding it")
        if scheduler is None:
            continue
        have = engine.scheduler
        agrees = have.name == scheduler if isinstance(scheduler, str) else have is scheduler
        if not agrees:
            wanted = scheduler if isinstance(scheduler, str) else type(scheduler).__name__
            raise IngestError(
                f"engine {engine.name!r} runs scheduler {have.name!r}, but QueriesHandler was given {wanted!r}: "
                f"build the engine with StreamEngine(db, …, scheduler={wanted!r}) (or pass a factory "
                f"QueriesHandler(lambda db, scheduler: …, scheduler=…) that does), or leave scheduler= out to use "
                f"the engine's")
    return engines


class QueriesHandler(BatchHandler):
    """Feeds each batch to stream engines (module docstring): ``queries`` is a :class:`StreamEngine` built with
    ``record_dead_letters=False``, a list of them, or a factory ``factory(db, scheduler=…)`` (``factory(db)``
    without ``scheduler``) returning one or a list, built when an ingestion takes the handler; ``scheduler``
    (``"sei"``, ``"s2pl"``, ``"lwm"`` or a configured :class:`Scheduler`) must be the engines' own — None: theirs.
    An event's key becomes the attribute named by the mapping's key column."""

    name = "queries"
    late_rows_are_dead_letters = False      # the engine's reorder buffer decides lateness

    def __init__(self, queries: Queries, scheduler: SchedulerKind | Scheduler | str | None = None) -> None:
        _check_scheduler(scheduler)
        self.queries = queries
        self.scheduler = scheduler
        self.engines: tuple[StreamEngine, ...] = ()      # set once by bind()
        self.key_attribute: str | None = None
        # Per engine: event type -> the stream to name (None: the engine's only stream), and the stream of any
        # type that takes every other type (None: such a row is not this engine's).
        self._routes: list[dict[str, str | None] | None] = []
        self._any_type: list[str | None] = []

    def bind(self, db: DatabaseHandle, mapping: EventMapping | None) -> None:
        """Build (or check) the engines on ``db``; an event's key becomes ``mapping.key_column``."""
        if self.engines:
            raise IngestError("this QueriesHandler already feeds an ingestion; give each ingestion its own")
        if mapping is None:
            raise IngestError("the queries path needs a mapping: its key column names the attribute an event's key "
                              "becomes")
        engines = tuple(build_engines(db, self.queries, self.scheduler))
        all_routes: list[dict[str, str | None] | None] = []
        any_types: list[str | None] = []
        for engine in engines:
            schemas = engine.streams
            any_type = [name for name, schema in schemas.items() if schema.types is None]
            if len(any_type) > 1:
                raise IngestError(f"engine {engine.name!r} has several streams that take any event type "
                                  f"({', '.join(any_type)}): which one a row belongs to is ambiguous; declare their "
                                  f"types with engine.create_stream(…, types=[…]) (one stream may take the rest)")
            any_types.append(any_type[0] if any_type and len(schemas) > 1 else None)
            if any_type and len(schemas) == 1:
                all_routes.append(None)
                continue
            routes: dict[str, str | None] = {}
            for name, schema in schemas.items():
                for event_type in schema.types or ():
                    routes.setdefault(event_type, None if len(schemas) == 1 else name)
            all_routes.append(routes)
        self.engines, self.key_attribute = engines, mapping.key_column
        self._routes, self._any_type = all_routes, any_types

    def accepted_types(self) -> frozenset[str] | None:
        types: set[str] = set()
        for engine in self.engines:
            for schema in engine.streams.values():
                if schema.types is None:
                    return None
                types.update(schema.types)
        return frozenset(types)

    def _events_for(self, index: int, batch: BatchInput) -> list[StreamEvent]:
        routes, any_type = self._routes[index], self._any_type[index]
        events = []
        for raw in batch.events:
            if routes is None:
                stream = None
            elif raw.event_type in routes:
                stream = routes[raw.event_type]
            elif any_type is not None:
                stream = any_type
            else:
                continue
            attributes = {**raw.payload, self.key_attribute: raw.key}
            events.append(StreamEvent(raw.event_type, raw.ts, attributes, stream=stream, origin=raw))
        return events

    def handle(self, tx: Transaction, batch: BatchInput, ledger: IngestionLedger) -> None:
        processed = 0
        letters = list(batch.letters)
        for index, engine in enumerate(self.engines):
            result = engine.process(tx, self._events_for(index, batch), punctuation=batch.watermark,
                                    batch_id=batch.batch_id)
            processed += result.processed
            letters += self._letters(engine, batch, result.dead_letters)
        batch.dead_letters.insert(tx, letters)
        ledger.events = processed
        ledger.dead_letters = len(letters)

    def _letters(self, engine: StreamEngine, batch: BatchInput, dead: Sequence[DeadLetter]) -> list[Letter]:
        letters = []
        for letter in dead:
            reason = (letter.reason if engine.name in letter.reason
                      else f"{letter.reason} (stream engine {engine.name!r})")
            origin = letter.event.origin
            if batch.holds(origin):
                letters += batch.dead_letters.for_events([(origin, reason)])
            else:                  # buffered by an earlier batch (or loaded from the saved state): the event itself
                letters.append(Letter(reason, event_row(letter.event)))
        return letters

    holds_back = True        # the engines' reorder buffers

    def release(self, tx: Transaction, batch: BatchInput, ledger: IngestionLedger) -> None:
        """``engine.process(tx, [], punctuation=END_OF_STREAM)`` for every engine, in the run's end-of-stream
        batch: the events released count in its ledger row, their dead letters are kept under it.  The engines'
        saved state records the release too, so a later one releases nothing."""
        processed = 0
        letters = []
        for engine in self.engines:
            result = engine.process(tx, [], punctuation=END_OF_STREAM)
            processed += result.processed
            letters += [Letter(letter.reason, event_row(letter.event)) for letter in result.dead_letters]
        batch.dead_letters.insert(tx, letters)
        ledger.events = processed
        ledger.dead_letters = len(letters)

    def statistics(self) -> dict[str, StreamStatistics]:
        """``{engine name: StreamStatistics}`` (throughput, L_query, L_rule, …) of every engine."""
        return {engine.name: engine.statistics() for engine in self.engines}
