"""One batch, in memory: declare → decide → execute (lean, the reference, or a TPG strategy; in
this process or split over worker processes) → :class:`~activedb.batch._result.BatchResult`.

Strategies: the package's ``__init__`` docstring.  ``_store.py`` and ``_commit.py`` wrap this with
loading and writing; tests and benchmarks call it directly with a dict of base images.
"""

from __future__ import annotations

import abc
import dataclasses
import datetime as dt
import itertools
import operator
import reprlib
import time
from collections.abc import Callable, Hashable, Iterable, Mapping
from concurrent.futures import BrokenExecutor, Future
from dataclasses import dataclass, field
from typing import Any, cast

from activedb._gc import no_cyclic_gc
from activedb.batch._declare import BatchEvent, OpSpec, State, StateTransactions, specs_of
from activedb.batch._decide import Decision, DecisionModel
from activedb.batch._execute import TpgExecutor, run_serial
from activedb.batch._lean import Progress, RouteMissed, run_lean, time_of
from activedb.batch._parallel import WorkerPool
from activedb.batch._plan import Txn, build_tpg
from activedb.batch._result import BatchResult, BatchStatistics, Part
from activedb.batch._route import Allowed, Router, Routing, route, touched_states
from activedb.batch._state import Loader, NestedColumns, WriteCheck
from activedb.batch._strategy import DecisionRule, Split, Strategy, parse_strategy
from activedb.batch.errors import DeclarationError, WorkerFailed
from activedb.errors import BadArgument, InvalidTime, check_whole_number, finite_number
from activedb.events import check_time
from activedb.store import RowImage
from activedb.versions import Versions

AUTO = "auto"
LEAN = "lean"
SERIAL = "serial"
TPG = "tpg"
_MODES = (AUTO, LEAN, SERIAL, TPG)


def ping() -> bool:
    """Run in a worker to start it (imports this module there)."""
    return True


class Runtime:
    """Per :class:`StateTransactions`: the decision model's memory, the route plans, the worker
    pool, and whether its batches have window operations (the lean executor then keeps versions)."""

    def __init__(self, processes: int, rule: DecisionRule = DecisionRule.MORPHSTREAM) -> None:
        self.model = DecisionModel(rule=rule)
        self.router = Router()
        self.pool = WorkerPool(processes - 1, ping) if processes > 1 else None
        self.versions = False

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()


def runtime_of(transactions: StateTransactions) -> Runtime:
    if transactions._runtime is None:
        transactions._runtime = Runtime(transactions.processes, transactions.decision_rule)
    return transactions._runtime


# --- events ---------------------------------------------------------------------------------

_new_event = tuple.__new__


#: Per type: whether its instances carry an event as attributes (neither a BatchEvent nor a mapping: a sink's
#: validated rows, stream ``activedb.Event``\ s), so that ``_as_batch_event`` asks ``isinstance`` of the abstract
#: ``Mapping`` (a walk of its registry) once per type, not once per event; forgotten when an ABC registers a class
#: (``abc.get_cache_token`` changes), as ``isinstance``'s own caches are.
_ATTRIBUTE_EVENT_TYPES: dict[type, bool] = {}
_ATTRIBUTE_EVENT_TOKEN = [abc.get_cache_token()]


def _carries_attributes(event: object) -> bool:
    """Whether ``event``'s type carries an event as attributes (neither a BatchEvent nor a mapping), asked of the
    abstract ``Mapping`` once per type and remembered in ``_ATTRIBUTE_EVENT_TYPES``."""
    kind_of = type(event)
    attributes = _ATTRIBUTE_EVENT_TYPES.get(kind_of)
    if attributes is None:
        attributes = not isinstance(event, (BatchEvent, Mapping))
        if len(_ATTRIBUTE_EVENT_TYPES) < 256:
            _ATTRIBUTE_EVENT_TYPES[kind_of] = attributes
    return attributes


def _as_batch_event(event: Any, position: int) -> BatchEvent:
    """``event`` as a :class:`BatchEvent` at ``position``.  Precondition: ``_ATTRIBUTE_EVENT_TYPES`` is current
    (``normalise_events`` checks the ABC cache token once per batch)."""
    kind_of = type(event)
    if kind_of is dict:
        kind = event.get("event_type")
        if kind is None:
            kind = event.get("type")
        payload = event.get("payload")
        try:
            payload = dict(payload) if payload else {}
        except (TypeError, ValueError):
            raise _no_mapping(payload, position) from None
        return _new_event(BatchEvent, (kind, event.get("key"), event.get("ts"), payload, position))
    if _carries_attributes(event):
        kind = getattr(event, "event_type", None)
        if kind is None and getattr(event, "kind", None) == "stream":   # activedb.Event of a stream
            kind = event.source
        payload = getattr(event, "payload", None)
        try:
            payload = dict(payload) if payload else {}
        except (TypeError, ValueError):
            raise _no_mapping(payload, position) from None
        return _new_event(BatchEvent, (kind, getattr(event, "key", None), getattr(event, "ts", None), payload,
                                       position))
    if isinstance(event, BatchEvent):
        return event if event.position == position else event._replace(position=position)
    kind = event.get("event_type", event.get("type"))
    return BatchEvent(kind, event.get("key"), event.get("ts"), _payload_of(event.get("payload"), position), position)


def _payload_of(payload: object, position: int) -> dict[str, object]:
    """The payload of the event at ``position`` as a dict of its own (``{}`` for None or an empty one), as
    ``_as_batch_event`` makes it in line for a dict and an event with attributes; a payload that is no mapping is a DeclarationError naming the event."""
    try:
        return dict(payload) if payload else {}  # type: ignore[call-overload]  # (any iterable of pairs; else refused)
    except (TypeError, ValueError):
        raise _no_mapping(payload, position) from None


def _no_mapping(payload: object, position: int) -> DeclarationError:
    return DeclarationError(f"the event at position {position} of the batch has the payload {payload!r}, which is no "
                            f"mapping; give an event's payload as a mapping of its fields (a dict), or None for none")


_by_ts = operator.itemgetter(2)
_EVENT_FIELDS = tuple(map(operator.attrgetter, ("event_type", "key", "ts", "payload")))


def _of_one_attribute_type(events: Iterable[object]) -> list[BatchEvent] | None:
    """``events`` as ``_as_batch_event`` makes them, made column by column when they are all of one type that carries
    an event as attributes, ``event_type`` among them and set (a sink's validated rows): each field of all the events
    read by one ``map`` of an ``attrgetter``, the payloads copied by one ``map`` of ``dict``, the BatchEvents made by
    one ``map`` over the columns zipped — loops in C, no Python step per event; else None (the caller takes them one
    by one, and names an event whose payload is no mapping)."""
    if not isinstance(events, list) or not events or not _carries_attributes(events[0]):
        return None
    if set(map(type, events)) != {type(events[0])}:
        return None
    try:
        kinds, keys, timestamps, payloads = (list(map(field, events)) for field in _EVENT_FIELDS)
    except AttributeError:
        return None
    if None in kinds:
        return None
    try:
        try:
            copies = list(map(dict, payloads))
        except TypeError:   # (a None among them, say: the per-event reading's ``{}`` for a payload that is falsy)
            copies = [dict(payload) if payload else {} for payload in payloads]
    except (TypeError, ValueError):      # a payload that is no mapping: the caller's pass names its event
        return None
    return list(map(_new_event, itertools.repeat(BatchEvent), zip(kinds, keys, timestamps, copies, itertools.count())))


_PLAIN_DICTS = frozenset((dict,))


def _of_plain_dicts(events: Iterable[object]) -> list[BatchEvent] | None:
    """``events`` as ``_as_batch_event`` makes them, made in one comprehension when they are a list of plain dicts only
    (no subclass, no other mapping: those keep ``_as_batch_event``'s reading): each field read once by ``dict.get``,
    each payload once — None and a dict in line, any other by ``_payload_of`` (which names the first event, in the
    order given, whose payload is no mapping); else None (the caller takes them one by one)."""
    if type(events) is not list or not events or type(events[0]) is not dict or set(map(type, events)) != _PLAIN_DICTS:
        return None
    dicts = cast("list[dict[str, Any]]", events)
    return [_new_event(BatchEvent, (event.get("type") if (kind := event.get("event_type")) is None else kind,
                                    event.get("key"), event.get("ts"),
                                    {} if (payload := event.get("payload")) is None
                                    else dict(payload) if type(payload) is dict else _payload_of(payload, position),
                                    position))
            for position, event in enumerate(dicts)]


def check_events(owner: str, events: object) -> None:
    """Raise :class:`~activedb.errors.BadArgument` unless ``events`` (given as ``owner(events=...)``) is an iterable of
    events: not None or a number, and neither a text nor one event on its own (a mapping, a BatchEvent), whose items
    would be read as events one by one."""
    if isinstance(events, (str, bytes, bytearray)):
        given = f"a {type(events).__name__} (read letter by letter, each letter would be an event)"
    elif isinstance(events, (Mapping, BatchEvent)):
        given = "one event on its own (its fields would be read as events); give a list of it: [event]"
    elif not isinstance(events, Iterable):
        given = "None" if events is None else f"a {type(events).__name__}, which is no iterable"
    else:
        return
    raise BadArgument(f"{owner}(events={reprlib.repr(events)}) takes an iterable of events — BatchEvents, mappings "
                      f"with 'type' (or 'event_type'), 'key' and optionally 'ts' and 'payload', or event objects with "
                      f"those attributes — not {given}; give a list of them (an empty one for no events)")


def normalise_events(events: Iterable[object], *, owner: str = "normalise_events") -> list[BatchEvent]:
    """Events as :class:`BatchEvent` in timestamp order: stably sorted by ``ts`` when events have one (out-of-order
    arrival, C1 of the paper), else in the order given.
    Accepts BatchEvents, ``spark_bridge`` RawEvents (``event_type, key, ts, payload``),
    stream ``activedb.Event``s, and mappings with those keys; a payload that is no mapping is a DeclarationError
    naming its event's position, before anything runs, and so is a ts that is no time of the batch's kind
    (``timed_batch`` says which; a batch run makes such an event a dead letter instead); ``events`` that are no
    iterable of events (``check_events``) a BadArgument naming ``owner``, the call they were given to."""
    batch, refused = timed_batch(events, owner=owner)
    if refused:
        raise DeclarationError(next(iter(refused.values())).removeprefix(_REFUSED))
    return batch


def timed_batch(events: Iterable[object], *, owner: str) -> tuple[list[BatchEvent], dict[int, str]]:
    """``events`` as ``normalise_events`` makes them, and ``{t: reason}`` for those whose ``ts`` is no time of the
    batch's kind: every ts must be a finite number of seconds or an aware datetime (``activedb.events.check_time``,
    as a stream's), of one kind — the kind of the first event (in the order given) whose ts is a time; in a batch
    with times, an event without one is refused too (a batch without any ts runs in the order given).  The refused
    events come last (``batch[t]`` for each ``t`` of the reasons), in the order given; the others are sorted by ts.
    The reasons read as a rejected declaration's (``DeclarationError: …``): the caller hands them to the executors
    as ``declared``, so each is that event's dead letter and the rest of the batch goes on."""
    check_events(owner, events)
    token = abc.get_cache_token()
    if _ATTRIBUTE_EVENT_TOKEN[0] != token:
        _ATTRIBUTE_EVENT_TYPES.clear()
        _ATTRIBUTE_EVENT_TOKEN[0] = token
    batch = _of_one_attribute_type(events)
    if batch is None:
        batch = _of_plain_dicts(events)
    if batch is None:
        batch = list(map(_as_batch_event, events, itertools.count()))     # (each event at its position)
    if not batch:
        return batch, {}
    timestamps = list(map(_by_ts, batch))
    kinds = set(map(type, timestamps))      # (one type check per event, in C)
    if kinds <= _NUMBERS:
        # Numbers: NaN alone is unequal to itself, an infinity sorts to an end (both passes in C).
        if all(map(operator.eq, timestamps, timestamps)):
            batch.sort(key=_by_ts)
            if finite_number(batch[0].ts) and finite_number(batch[-1].ts):
                return batch, {}
    elif kinds == _DATETIMES and None not in map(_tzinfo, timestamps):
        batch.sort(key=_by_ts)
        return batch, {}
    elif kinds == _NONE:
        return batch, {}
    return _refuse_untimed(batch)


_NUMBERS = frozenset((int, float))
_DATETIMES = frozenset((dt.datetime,))
_NONE = frozenset((type(None),))
_tzinfo = operator.attrgetter("tzinfo")
_REFUSED = "DeclarationError: "


def _refuse_untimed(batch: list[BatchEvent]) -> tuple[list[BatchEvent], dict[int, str]]:
    """``timed_batch`` for a batch whose timestamps are not all finite numbers, nor all aware datetimes, nor all
    missing: each event checked on its own (``check_time``) against the kind of the first one whose ts is a time."""
    given = sorted(batch, key=_position)        # (the order given: a batch of numbers may have been sorted)
    first = next((event for event in given if _is_time(event.ts)), None)
    timed: list[BatchEvent] = []
    refused: list[tuple[BatchEvent, str]] = []
    for event in given:
        ts = event.ts
        if ts is None:
            if first is None:
                timed.append(event)
            else:
                refused.append((event, f"has no ts, where the batch's events have one (the first at position "
                                       f"{first.position})"))
            continue
        try:
            check_time(ts, "ts")
        except InvalidTime as error:
            refused.append((event, f"has a ts that is no time: {error}"))
            continue
        kind, first_kind = _time_kind(ts), _time_kind(first.ts)  # type: ignore[union-attr]  # (a time was found)
        if kind != first_kind:
            refused.append((event, f"has a ts of another kind: ts {ts!r} is a {kind}, where the batch's "
                                   f"first timed event (position {first.position}) has a "  # type: ignore[union-attr]
                                   f"{first_kind}"))
            continue
        timed.append(event)
    if first is not None:
        timed.sort(key=_by_ts)
    reasons = {len(timed) + index: f"{_REFUSED}the event at position {event.position} of the batch {why}; {_GIVE_TS}"
               for index, (event, why) in enumerate(refused)}
    return timed + [event for event, _ in refused], reasons


def _is_time(ts: object) -> bool:
    try:
        check_time(ts, "ts")
    except InvalidTime:
        return False
    return True


_GIVE_TS = ("give each event a finite number of seconds or an aware datetime as its ts, of one kind in a batch (the "
            "batch runs in ts order)")
_position = operator.attrgetter("position")


def _time_kind(ts: object) -> str:
    return "datetime" if isinstance(ts, dt.datetime) else "number of seconds"


def check_processes(owner: str, processes: object) -> None:
    """Raise :class:`~activedb.errors.BadArgument` unless ``processes`` (given as ``owner(processes=...)``) is None
    (the StateTransactions' own) or a whole number of at least 1."""
    if processes is not None:
        check_whole_number(owner, "processes", processes, 1,
                           " (the processes the batch may use, this one included), or None for the StateTransactions'")


# --- declaring (for the reference and the TPG strategies) -----------------------------------

@dataclass
class Prepared:
    """A declared batch: ``txns[i]``/``specs[i]`` for the i-th declared event in timestamp
    order (``txns[i].t`` its timestamp in the whole batch); ``times[t]`` its event time;
    ``batch`` = every event in timestamp order (``batch[t]``)."""

    txns: list[Txn]
    specs: list[list[OpSpec]]
    rejected: list[tuple[int, str]]      # (t, why the event at t could not be declared)
    times: _Times
    seconds: float
    batch: list[BatchEvent] = field(default_factory=list)

    def states_by_table(self) -> dict[str, list[Hashable]]:
        """The keys to prefetch, per table (every declared own, parameter and candidate row)."""
        tables: dict[str, dict[Hashable, None]] = {}
        for declared in self.specs:
            for table, key in touched_states(declared)[0]:
                tables.setdefault(table, {})[key] = None
        return {table: list(keys) for table, keys in tables.items()}

    def declared(self) -> dict[int, list[OpSpec] | str]:
        """``t`` → the specs of the event at ``t``, or the reason it was rejected."""
        return {**{txn.t: specs for txn, specs in zip(self.txns, self.specs)}, **dict(self.rejected)}


@no_cyclic_gc()
def decide(transactions: StateTransactions, events: Iterable[object], *, vdd: float | None = None,
           model: DecisionModel | None = None) -> Decision:
    """What the decision model (``model``, default a new one: no earlier batch measured) picks among the TPG
    strategies for ``events``, and why, on their TPG — built, not run.  ``vdd`` states the vertex degree
    distribution as a Zipf θ, as MorphStream's generator feeds its tree, instead of measuring it."""
    prepared = prepare(transactions, events)
    return (model or DecisionModel(rule=transactions.decision_rule)).decide(build_tpg(prepared.txns, prepared.specs),
                                                                            vdd=vdd)


def prepare(transactions: StateTransactions, events: Iterable[object]) -> Prepared:
    """PRE_PROCESS: normalise and declare every event; events that cannot be declared (or whose ts is no time of
    the batch's kind: ``timed_batch``) are rejected with the reason (they become dead letters)."""
    started = time.perf_counter()
    batch, refused = timed_batch(events, owner="decide")
    return _declare_all(transactions, list(enumerate(batch)), batch, refused or None, started)


def _declare_all(transactions: StateTransactions, items: list[tuple[int, BatchEvent]],
                 batch: Mapping[int, BatchEvent] | list[BatchEvent],
                 declared: Mapping[int, list[OpSpec] | str] | None, started: float) -> Prepared:
    txns: list[Txn] = []
    specs: list[list[OpSpec]] = []
    rejected: list[tuple[int, str]] = []
    declare = transactions.declare
    for t, event in items:
        known = specs_of(declare, event, declared.get(t) if declared is not None else None)
        if isinstance(known, str):
            rejected.append((t, known))
            continue
        txns.append(Txn(t, event))
        specs.append(known)
    times = _Times(batch)
    return Prepared(txns, specs, rejected, times, time.perf_counter() - started,
                    batch)  # type: ignore[arg-type]  # (a worker's part: a dict by t, read as batch[t] alike)


class _Times:
    """``times[t]``: the time of the event at ``t`` (computed on demand)."""

    __slots__ = ("_batch", "_cache")

    def __init__(self, batch: Mapping[int, BatchEvent] | list[BatchEvent]) -> None:
        self._batch = batch
        self._cache: dict[int, float] = {}

    def __getitem__(self, t: int) -> float:
        value = self._cache.get(t)
        if value is None:
            value = self._cache[t] = time_of(self._batch[t])
        return value


# --- one part of a batch --------------------------------------------------------------------

def _run_part(transactions: StateTransactions, mode: str | Strategy, batch: Mapping[int, BatchEvent] | list[BatchEvent],
              items: list[tuple[int, BatchEvent]], declared: Mapping[int, list[OpSpec] | str] | None,
              base: Mapping[State, RowImage | None], loader: Loader | None, allowed: Allowed | None,
              model: DecisionModel, versions: bool, nested: NestedColumns | None = None,
              progress: Progress | None = None) -> Part:
    """Run ``items`` (``(t, event)``) with ``mode`` (``nested``, ``progress``: ``run_lean``'s; only a lean run tells
    its progress)."""
    seconds: dict[str, float] = {}
    if mode == LEAN:
        return run_lean(transactions.declarations, items, base, loader=loader, declared=declared,
                        versions=versions, allowed=allowed, nested=nested, progress=progress)
    started = time.perf_counter()
    prepared = _declare_all(transactions, items, batch, declared, started)
    seconds["declare"] = prepared.seconds
    table: Versions[RowImage | None] = Versions(
        base, times=prepared.times, loader=_checked_loader(loader, allowed))  # type: ignore[arg-type]  # (State keys; times by t)
    txns, specs = prepared.txns, prepared.specs
    started = time.perf_counter()
    decision: tuple[str, ...] = ()
    if mode == SERIAL:
        outcomes = run_serial(txns, specs, table)
        seconds["execute"] = time.perf_counter() - started
        executions = sum(len(declared_specs) for declared_specs in specs)
        name, statistics, plan = SERIAL, None, {"operations": executions}
    else:
        tpg = build_tpg(txns, specs)
        seconds["plan"] = time.perf_counter() - started
        if mode == TPG:
            started = time.perf_counter()
            chosen = model.decide(tpg)
            seconds["decide"] = time.perf_counter() - started
            chosen_strategy, decision = chosen.strategy, chosen.reasons
        else:
            chosen_strategy = parse_strategy(mode)
        executor = TpgExecutor(tpg, chosen_strategy, table)
        statistics = executor.run()
        started = time.perf_counter()
        outcomes = executor.outcomes(specs)
        tpg.release(executor.units)
        seconds["execute"] = statistics.seconds + time.perf_counter() - started
        counts = tpg.ops_per_state      # the plan's counts, named as BatchStatistics names them (and for the skew)
        plan = {"operations": len(tpg.ops), "td_edges": tpg.td_edges, "pd_edges": tpg.pd_edges,
                "ld_pairs": tpg.ld_pairs, "nd_ops": tpg.nd_ops, "window_ops": tpg.window_ops, "states": len(counts),
                "busiest": max(counts.values(), default=0), "on_states": sum(counts.values())}
        name, executions = chosen_strategy.name, statistics.executions
    final: dict[State, RowImage | None] = table.final()  # type: ignore[assignment]  # (its keys are States)
    return Part(*outcomes, prepared.rejected, final, {state: table.base(state) for state in final}, name,
                decision, statistics, plan, seconds, executions)


def _checked_loader(loader: Loader | None, allowed: Allowed | None) -> Callable[[Hashable], RowImage | None] | None:
    if allowed is None and loader is None:
        return None

    def load(state: Hashable) -> RowImage | None:
        if allowed is not None and state not in allowed:
            raise RouteMissed(state, -1)  # type: ignore[arg-type]  # (a State)
        return loader(*state) if loader is not None else None  # type: ignore[misc]  # (a State)

    return load


@no_cyclic_gc()
def run_in_worker(transactions: StateTransactions, shipped: list[tuple[object, ...]], base: dict[State, RowImage | None],
                  absent: list[State], mode: str, model: DecisionModel, versions: bool) -> Part | _Missed:
    """Worker-process entry: ``shipped`` = ``(t, event_type, key, ts, payload, position)`` per
    transaction (ascending ``t``); ``base`` = the images of the part's states, ``absent`` = its
    states without a row (a part with unbounded tables stays in the caller)."""
    items: list[tuple[int, BatchEvent]] = [(item[0], _new_event(BatchEvent, item[1:])) for item in shipped]  # type: ignore[misc]
    allowed = Allowed(set(base).union(absent))
    batch = dict(items)     # batch[t] for the (t, event) pairs this worker has
    try:
        part = _run_part(transactions, mode, batch, items, None, base, None, allowed, model, versions)
    except RouteMissed as missed:
        return _Missed(missed.state, missed.t)
    part.before = None      # the caller has the images before the batch: not shipped back
    return part


@dataclass
class _Missed:
    """A part's prediction missed (the worker's answer instead of a part)."""

    state: State
    t: int


# --- a batch --------------------------------------------------------------------------------

def execute_batch(transactions: StateTransactions, batch: list[BatchEvent], base: Mapping[State, RowImage | None], *,
                  loader: Loader | None = None, declared: Mapping[int, list[OpSpec] | str] | None = None,
                  strategy: str | Strategy = AUTO, processes: int | None = None, split: Split = Split.AUTO,
                  declare_seconds: float = 0.0, check: WriteCheck | None = None, nested: NestedColumns | None = None,
                  progress: Progress | None = None) -> BatchResult:
    """Run the normalised ``batch`` (``batch[t]``, timestamp order) over ``base`` (images before
    the batch; missing states come from ``loader`` or are absent rows).  ``declared[t]``: specs
    (or a rejection reason) already known for the event at ``t``.  ``processes`` defaults to the
    object's; ``split``: ``"auto"`` (the decision model's rule), ``"always"`` (whenever the batch
    has two components or more and processes are allowed), ``"never"``.  ``check``: the lean executor's
    per-transaction check (``run_lean``); given, the batch runs lean in this process.  The caller pauses the cyclic
    garbage collector (``no_cyclic_gc``), as every caller here does.  ``nested``: the tables' list and dict columns,
    where the caller has the catalog (the lean executor in this process then copies a function's argument by its
    table's, not by looking at every value: ``run_lean``).  ``progress``: ``run_lean``'s, told only when the batch runs
    lean in this process, unsplit, without ``check`` (else never)."""
    runtime = runtime_of(transactions)
    mode = strategy if isinstance(strategy, str) and strategy in _MODES else parse_strategy(strategy)
    split = Split.parse(split, "split")
    allowed_processes = transactions.processes if processes is None else processes
    model = runtime.model
    notes: list[str] = []
    seconds: dict[str, float] = {"declare": declare_seconds} if declare_seconds else {}
    decision: tuple[str, ...] = ()
    if check is not None:
        part = run_lean(transactions.declarations, list(enumerate(batch)), base, loader=loader, declared=declared,
                        versions=runtime.versions, check=check, nested=nested)
        return _assemble(batch, [part], LEAN, seconds, 0, 1.0, runtime, notes, decision)
    if mode == AUTO:
        mode, decision = model.choose_execution(threads=1)
    parts: list[Part] = []
    components, largest_share = 0, 1.0
    if (allowed_processes > 1 and len(batch) > 1 and runtime.pool is not None and split is not Split.NEVER):
        started = time.perf_counter()
        count = min(allowed_processes, runtime.pool.workers + 1)
        routing = route(runtime.router, transactions.declare, batch, count, declared)
        seconds["route"] = time.perf_counter() - started
        components, largest_share = routing.components, routing.largest_share
        splitting, why = (True, "split='always'") if split is Split.ALWAYS else model.should_split(
            sum(routing.weights), routing.bin_share, allowed_processes)
        if splitting and sum(1 for members in routing.bins if members) < 2:
            splitting, why = False, "one component"
        notes.append(("split: " if splitting else "not split: ") + why +
                      f" ({routing.predicted} of {len(batch)} events routed by plans)")
        if splitting:
            parts = _run_split(transactions, runtime, mode, batch, routing, base, loader, declared, notes, seconds)
    if not parts:
        parts = [_run_part(transactions, mode, batch, list(enumerate(batch)), declared, base, loader, None, model,
                           runtime.versions, nested, progress)]
    return _assemble(batch, parts, mode, seconds, components, largest_share, runtime, notes, decision)


def _run_split(transactions: StateTransactions, runtime: Runtime, mode: str | Strategy, batch: list[BatchEvent],
               routing: Routing, base: Mapping[State, RowImage | None], loader: Loader | None,
               declared: Mapping[int, list[OpSpec] | str] | None, notes: list[str], seconds: dict[str, float]
               ) -> list[Part]:
    """Bins 1.. to the workers (compact tuples: the events, the part's images), bin 0 here, at
    the same time; a missed prediction anywhere runs the batch again unsplit."""
    started = time.perf_counter()
    model = runtime.model
    name = mode if isinstance(mode, str) else mode.name
    shipped_model = dataclasses.replace(model, history=[])      # what a part decides by, without the history
    futures: list[tuple[int, Future[Part | _Missed]]] = []
    pool = runtime.pool
    assert pool is not None     # (a split needs the workers)
    base_get = base.get
    for number in range(1, len(routing.bins)):
        members = routing.bins[number]
        if not members:
            continue
        shipped = [(index, *batch[index]) for index in members]
        part_base: dict[State, RowImage | None] = {}
        absent: list[State] = []
        for state in routing.states[number]:
            image = base_get(state, _ABSENT)
            if image is _ABSENT:
                absent.append(state)
            else:
                part_base[state] = image  # type: ignore[assignment]  # (not _ABSENT)
        futures.append((number, pool.submit(run_in_worker, transactions, shipped, part_base, absent, name,
                                                    shipped_model, runtime.versions)))
    seconds["ship"] = time.perf_counter() - started
    answers: list[Part | _Missed] = [_run_local(transactions, mode, batch, routing, 0, base, loader, runtime)]
    for number, future in futures:
        try:
            answers.append(future.result())
        except Exception as error:   # e.g. a declaring function that cannot be pickled
            if isinstance(error, BrokenExecutor):     # a worker died: its pool is unusable for good
                pool.close()
                raise WorkerFailed(f"a worker process ended while it ran {len(routing.bins[number])} transactions "
                                   f"of the batch ({error}); nothing of the batch is kept and the next batch starts "
                                   f"new workers: run the batch again (if a worker dies again, see why: memory, a "
                                   f"signal; processes=1 runs every batch in this process)") from error
            if not _is_pickling_problem(error):
                raise WorkerFailed(f"a worker process failed on {len(routing.bins[number])} transactions: "
                                   f"{type(error).__name__}: {error}") from error
            notes.append(f"ran a part in this process: {type(error).__name__}: {error} (declare the "
                         f"state transactions at module level so worker processes can import them)")
            answers.append(_run_local(transactions, mode, batch, routing, number, base, loader, runtime))
    missed = [answer for answer in answers if isinstance(answer, _Missed)]
    if missed:
        dropped = sorted({batch[miss.t].event_type for miss in missed if miss.t >= 0})
        for event_type in dropped:
            runtime.router.drop(event_type)
        notes.append(f"split abandoned: a route plan missed {missed[0].state!r}; ran unsplit; plans dropped for "
                     f"{dropped or 'no type'}")
        return [_run_part(transactions, mode, batch, list(enumerate(batch)), declared, base, loader, None, model,
                          runtime.versions)]
    parts = [answer for answer in answers if isinstance(answer, Part)]
    for part in parts:
        if part.before is None:     # shipped back without: the caller has the images before the batch
            part.before = {state: base_get(state) for state in part.final}
    return parts


def _run_local(transactions: StateTransactions, mode: str | Strategy, batch: list[BatchEvent], routing: Routing,
               number: int, base: Mapping[State, RowImage | None], loader: Loader | None, runtime: Runtime
               ) -> Part | _Missed:
    """Bin ``number`` in this process, over its own images only (so a missed prediction shows)."""
    states, tables = routing.states[number], routing.unbounded[number]
    if tables:
        local_base = {state: image for state, image in base.items() if state in states or state[0] in tables}
    else:
        local_base = {state: base[state] for state in states if state in base}
    members = routing.bins[number]
    known = routing.declared
    local_declared = {index: known[index] for index in members if index in known}
    try:
        return _run_part(transactions, mode, batch, [(index, batch[index]) for index in members], local_declared,
                         local_base, loader, Allowed(states, tables), runtime.model, runtime.versions)
    except RouteMissed as missed:
        return _Missed(missed.state, missed.t)


_ABSENT = object()


def _is_pickling_problem(error: BaseException) -> bool:
    import pickle

    return isinstance(error, (pickle.PicklingError, AttributeError, TypeError)) and (
        "pickle" in str(error).lower() or "Can't get" in str(error) or "Can't pickle" in str(error))


def _before(part: Part) -> dict[State, RowImage | None]:
    """``part.before``: a part shipped back without it had it filled in by ``_run_split`` first."""
    if part.before is None:
        raise AssertionError("a part shipped back without its images before the batch was not given them")
    return part.before


def _assemble(batch: list[BatchEvent], parts: list[Part], mode: str | Strategy, seconds: dict[str, float], components: int,
              largest_share: float, runtime: Runtime, notes: list[str], decision: tuple[str, ...]) -> BatchResult:
    if len(parts) == 1:
        # One part (every batch not split): its own lists and dicts, made for it by its run and dropped with it here,
        # are the result's — no copy of each.
        only = parts[0]
        ts, aborted, outputs, final, before = only.ts, only.aborted, only.outputs, only.final, _before(only)
        rejected_at = sorted(only.rejected)
    else:
        ts, aborted, outputs, final, before, rejected_at = [], {}, {}, {}, {}, []
        for part in parts:
            ts.extend(part.ts)
            aborted.update(part.aborted)
            outputs.update(part.outputs)
            final.update(part.final)
            before.update(_before(part))
            rejected_at.extend(part.rejected)
        rejected_at.sort()
    ts.sort()
    rejected = [(batch[t], reason) for t, reason in rejected_at]
    totals = dict.fromkeys(("operations", "td_edges", "pd_edges", "ld_pairs", "nd_ops", "window_ops", "states",
                            "on_states"), 0)
    execution = {"executions": 0, "rollbacks": 0, "aborts_applied": 0, "revoked": 0, "passes": 0, "units": 0,
                 "cyclic_ops": 0, "strata": 0}
    busiest = 0
    part_seconds: dict[str, float] = {}
    for part in parts:
        for name, value in part.plan.items():
            if name == "busiest":
                busiest = max(busiest, value)
            else:
                totals[name] = totals.get(name, 0) + value
        if part.execution is not None:
            for name in execution:
                value = getattr(part.execution, name)
                execution[name] = max(execution[name], value) if name in ("passes", "strata") else (
                    execution[name] + value)
        else:
            execution["executions"] += part.executions
        for name, spent in part.seconds.items():
            part_seconds[name] = max(part_seconds.get(name, 0.0), spent) if len(parts) > 1 else spent
        if part.versions:
            runtime.versions = True
    seconds.update(part_seconds)
    on_states = totals.pop("on_states")
    mean = on_states / totals["states"] if on_states and totals["states"] else 1.0
    strategies = sorted({part.strategy for part in parts})
    statistics = BatchStatistics(
        transactions=len(ts), rejected=len(rejected), **totals, skew=(busiest / mean) if mean and busiest else 1.0,
        components=components, largest_component_share=largest_share, processes=len(parts), seconds=seconds,
        decision=decision or parts[0].decision, **execution)
    if mode != SERIAL:
        runtime.model.observe(len(ts), len(aborted), execution["executions"], seconds.get("execute", 0.0),
                              lean=all(part.execution is None for part in parts),
                              total_seconds=sum(seconds.get(phase, 0.0) for phase in ("execute", "plan", "decide")))
    runtime.model.history.append("+".join(strategies))
    return BatchResult(batch, ts, aborted, outputs, rejected, final, before, "+".join(strategies), statistics, notes)


@no_cyclic_gc()
def run_in_memory(transactions: StateTransactions, events: Iterable[object],
                  state: Mapping[State, RowImage | None] | None = None, *, strategy: str | Strategy = AUTO,
                  processes: int | None = None, split: Split = Split.AUTO) -> BatchResult:
    """Declare and run a batch over ``state`` (images before the batch; absent = no row)."""
    check_processes("run_in_memory", processes)
    started = time.perf_counter()
    batch, refused = timed_batch(events, owner="run_in_memory")
    normalised = time.perf_counter() - started
    result = execute_batch(transactions, batch, dict(state or {}), declared=refused or None, strategy=strategy,
                           processes=processes, split=split)
    if result.statistics is not None:
        result.statistics.seconds["normalise"] = normalised
    return result
