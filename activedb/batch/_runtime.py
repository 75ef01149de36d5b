"""One batch, in memory: declare → plan → decide → execute (in this process or split over
worker processes) → :class:`~activedb.batch._result.BatchResult`.

The store integration (``_store.py``) wraps this with prefetching and writing back; tests
and benchmarks call it directly with a dict of base images.
"""

from __future__ import annotations

import datetime as dt
import gc
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from activedb.batch._declare import BatchEvent, OpKind, OpSpec, StateTransactions
from activedb.batch._decide import DecisionModel, measure
from activedb.batch._execute import ExecutionStatistics, TpgExecutor, TxnOutcome, run_serial
from activedb.batch._parallel import WorkerPool, bins_of, components_of
from activedb.batch._plan import Tpg, Txn, build_tpg
from activedb.batch._result import BatchResult, BatchStatistics, TransactionResult
from activedb.batch._state import VersionTable
from activedb.batch._strategy import Strategy, parse_strategy
from activedb.batch.errors import WorkerFailed

__all__ = ["Prepared", "Runtime", "execute", "normalise_events", "ping", "prepare"]

SERIAL = "serial"
AUTO = "auto"


def ping() -> bool:
    """Run in a worker to start it (imports this module there)."""
    return True


class Runtime:
    """Per :class:`StateTransactions`: the decision model's memory and the worker pool."""

    def __init__(self, processes: int) -> None:
        self.model = DecisionModel()
        self.pool = WorkerPool(processes - 1) if processes > 1 else None

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()


def runtime_of(transactions: StateTransactions) -> Runtime:
    if transactions._runtime is None:
        transactions._runtime = Runtime(transactions.processes)
    return transactions._runtime


# --- events ---------------------------------------------------------------------------------

def _as_batch_event(event: Any, position: int) -> BatchEvent:
    if isinstance(event, BatchEvent):
        return event if event.position == position else BatchEvent(event.event_type, event.key, event.ts,
                                                                   event.payload, position)
    if isinstance(event, Mapping):
        kind = event.get("event_type", event.get("type"))
        return BatchEvent(kind, event.get("key"), event.get("ts"), dict(event.get("payload") or {}), position)
    kind = getattr(event, "event_type", None)
    if kind is None and getattr(event, "kind", None) == "stream":   # activedb.Event of a stream
        kind = event.source
    return BatchEvent(kind, getattr(event, "key", None), getattr(event, "ts", None),
                      dict(getattr(event, "payload", None) or {}), position)


def normalise_events(events: Iterable[Any]) -> list[BatchEvent]:
    """Events as :class:`BatchEvent` in timestamp order: stably sorted by ``ts`` when every
    event has one (out-of-order arrival, C1 of the paper), else in the order given.
    Accepts BatchEvents, ``spark_bridge`` RawEvents (``event_type, key, ts, payload``),
    stream ``activedb.Event``s, and mappings with those keys."""
    batch = [_as_batch_event(event, position) for position, event in enumerate(events)]
    if batch and all(event.ts is not None for event in batch):
        try:
            batch.sort(key=lambda event: event.ts)
        except TypeError:
            pass   # incomparable timestamps: keep arrival order
    return batch


def _time_of(event: BatchEvent) -> Any:
    if event.ts is None:
        return event.position
    if isinstance(event.ts, dt.datetime):
        return event.ts.timestamp()
    return event.ts


# --- declaring ------------------------------------------------------------------------------

@dataclass
class Prepared:
    """A declared batch: ``txns[i]``/``specs[i]`` for the i-th declared event in timestamp
    order (``txns[i].t`` its timestamp in the whole batch); ``times[t]`` its event time."""

    txns: list[Txn]
    specs: list[list[OpSpec]]
    rejected: list[tuple[BatchEvent, str]]
    times: list[Any]
    seconds: float

    def touched(self) -> list[list[tuple[str, Any]]]:
        """Per transaction, the states it touches (ND without candidates: a table marker)."""
        result = []
        for declared in self.specs:
            states = []
            for spec in declared:
                if spec.key is not None:
                    states.append((spec.table, spec.key))
                elif spec.candidates is not None:
                    states.extend((spec.table, key) for key in spec.candidates)
                else:
                    states.append(("#table", spec.table))
                states.extend(spec.params)
            result.append(states)
        return result

    def states_by_table(self) -> dict[str, list[Any]]:
        """The keys to prefetch, per table (every declared own, parameter and candidate row)."""
        tables: dict[str, dict[Any, None]] = {}
        for states in self.touched():
            for table, key in states:
                if table != "#table":
                    tables.setdefault(table, {})[key] = None
        return {table: list(keys) for table, keys in tables.items()}


class _NoCyclicGc:
    """The TPG is a graph of many small objects with cycles (parents ↔ children); the cyclic
    garbage collector would walk it again and again while it is built.  Nothing in a batch
    needs it: pause it for the batch (reference counting still frees everything acyclic)."""

    def __enter__(self):
        self.enabled = gc.isenabled()
        gc.disable()

    def __exit__(self, *exc_info):
        if self.enabled:
            gc.enable()


def prepare(transactions: StateTransactions, events: Iterable[Any]) -> Prepared:
    """PRE_PROCESS: normalise and declare every event; events that cannot be declared are
    rejected with the reason (they become dead letters)."""
    with _NoCyclicGc():
        return _prepare(transactions, events)


def _prepare(transactions: StateTransactions, events: Iterable[Any]) -> Prepared:
    started = time.perf_counter()
    batch = normalise_events(events)
    times = [_time_of(event) for event in batch]
    txns: list[Txn] = []
    specs: list[list[OpSpec]] = []
    rejected: list[tuple[BatchEvent, str]] = []
    declare = transactions.declare
    for t, event in enumerate(batch):
        try:
            declared = declare(event)
        except Exception as error:
            rejected.append((event, f"{type(error).__name__}: {error}"))
            continue
        txns.append(Txn(t, event, times[t]))
        specs.append(declared)
    return Prepared(txns, specs, rejected, times, time.perf_counter() - started)


# --- executing ------------------------------------------------------------------------------

@dataclass
class _Part:
    outcomes: list[TxnOutcome]
    final: dict
    before: dict
    strategy: str
    decision: tuple[str, ...]
    execution: ExecutionStatistics | None
    plan: dict[str, Any]
    seconds: dict[str, float]


def _plan_counts(tpg: Tpg | None, txns: list[Txn], specs: list[list[OpSpec]]) -> dict[str, Any]:
    if tpg is None:
        operations = sum(len(declared) for declared in specs)
        return {"operations": operations, "td": 0, "pd": 0, "ld": 0, "nd": 0, "window": 0, "states": 0,
                "busiest": 0, "on_states": 0}
    counts = tpg.ops_per_state
    return {"operations": len(tpg.ops), "td": tpg.td_edges, "pd": tpg.pd_edges, "ld": tpg.ld_pairs,
            "nd": tpg.nd_ops, "window": tpg.window_ops, "states": len(counts),
            "busiest": max(counts.values(), default=0), "on_states": sum(counts.values())}


def _run_part(txns: list[Txn], specs: list[list[OpSpec]], base: Mapping, loader, strategy: str | Strategy,
              times: list[Any], model: DecisionModel) -> _Part:
    seconds: dict[str, float] = {}
    table = VersionTable(base, times=times, loader=loader)
    if strategy == SERIAL:
        started = time.perf_counter()
        outcomes = run_serial(txns, specs, table)
        seconds["execute"] = time.perf_counter() - started
        final = table.final()
        return _Part(outcomes, final, {state: table.base(state) for state in final}, SERIAL, (), None,
                     _plan_counts(None, txns, specs), seconds)
    started = time.perf_counter()
    tpg = build_tpg(txns, specs)
    seconds["plan"] = time.perf_counter() - started
    decision: tuple[str, ...] = ()
    if strategy == AUTO:
        started = time.perf_counter()
        chosen = model.decide(tpg)
        seconds["decide"] = time.perf_counter() - started
        chosen_strategy, decision = chosen.strategy, chosen.reasons
    else:
        chosen_strategy = parse_strategy(strategy)
    executor = TpgExecutor(tpg, chosen_strategy, table)
    statistics = executor.run()
    started = time.perf_counter()
    outcomes = executor.outcomes(specs)
    tpg.release(executor.units)
    seconds["execute"] = statistics.seconds + time.perf_counter() - started
    final = table.final()
    return _Part(outcomes, final, {state: table.base(state) for state in final}, chosen_strategy.name, decision,
                 statistics, _plan_counts(tpg, txns, specs), seconds)


def run_in_worker(transactions: StateTransactions, events: list[BatchEvent], ts: list[int], base: dict,
                  strategy: str, times: list[Any], model_state: tuple) -> _Part:
    """Worker-process entry: re-declare ``events`` (timestamps ``ts``), plan, execute."""
    txns, specs = [], []
    for t, event in zip(ts, events):
        specs.append(transactions.declare(event))
        txns.append(Txn(t, event, times[t]))
    model = DecisionModel(abort_ratio=model_state[0], seconds_per_op=model_state[1], batches=model_state[2])
    with _NoCyclicGc():
        return _run_part(txns, specs, base, None, strategy, times, model)


def execute(transactions: StateTransactions, prepared: Prepared, base: Mapping[tuple[str, Any], dict | None],
            *, loader: Callable[[str, Any], dict | None] | None = None, strategy: str | Strategy = AUTO,
            processes: int | None = None, split: str = "auto") -> BatchResult:
    """Run a declared batch over ``base`` (images before the batch; missing states come from
    ``loader`` or are absent rows).  ``strategy``: ``"auto"`` (decision model), ``"serial"``
    (reference), or a :class:`Strategy` / its name.  ``processes`` defaults to the object's.
    ``split``: ``"auto"`` (the decision model's rule 4), ``"always"`` (whenever the batch has
    two components or more and processes are allowed), ``"never"``."""
    with _NoCyclicGc():
        return _execute(transactions, prepared, base, loader, strategy, processes, split)


def _execute(transactions, prepared, base, loader, strategy, processes, split) -> BatchResult:
    runtime = runtime_of(transactions)
    if not isinstance(strategy, str) or strategy not in (AUTO, SERIAL):
        strategy = parse_strategy(strategy)
    allowed = transactions.processes if processes is None else processes
    txns, specs = prepared.txns, prepared.specs
    notes: list[str] = []
    seconds: dict[str, float] = {"declare": prepared.seconds}
    components = 0
    largest_share = 1.0
    parts: list[_Part] = []
    if split not in ("auto", "always", "never"):
        raise ValueError(f"split is 'auto', 'always' or 'never', not {split!r}")
    if allowed > 1 and len(txns) > 1 and runtime.pool is not None and split != "never":
        started = time.perf_counter()
        touched = prepared.touched()
        groups = components_of(touched)
        weights = [len(declared) for declared in specs]
        pinned = {index for index, declared in enumerate(specs)
                  if any(spec.key is None and spec.candidates is None for spec in declared)}
        total = max(1, sum(weights))
        components = len(groups)
        largest_share = max(sum(weights[index] for index in members) for members in groups) / total
        bins = bins_of(groups, weights, min(allowed, runtime.pool.workers + 1), pinned)
        bin_share = max(sum(weights[index] for index in members) for members in bins) / total
        if split == "always":
            splitting, why = True, "split='always'"
        else:
            splitting, why = runtime.model.should_split(total, bin_share, allowed)
        if splitting and sum(1 for members in bins if members) < 2:
            splitting, why = False, "one component"
        notes.append(("split: " if splitting else "not split: ") + why)
        seconds["components"] = time.perf_counter() - started
        if splitting:
            futures = []
            model_state = (runtime.model.abort_ratio, runtime.model.seconds_per_op, runtime.model.batches)
            for members in bins[1:]:
                if not members:
                    continue
                states = {state for index in members for state in touched[index] if state[0] != "#table"}
                part_base = {state: base[state] for state in states if state in base}
                futures.append((members, runtime.pool.submit(
                    run_in_worker, transactions, [txns[index].event for index in members],
                    [txns[index].t for index in members], part_base,
                    strategy if isinstance(strategy, str) else strategy.name, prepared.times, model_state)))
            local = bins[0]
            parts.append(_run_part([txns[index] for index in local], [specs[index] for index in local], base, loader,
                                   strategy, prepared.times, runtime.model))
            for members, future in futures:
                try:
                    parts.append(future.result())
                except Exception as error:   # e.g. a declaring function that cannot be pickled
                    if not _is_pickling_problem(error):
                        raise WorkerFailed(f"a worker process failed on {len(members)} transactions: "
                                           f"{type(error).__name__}: {error}") from error
                    notes.append(f"ran a part in this process: {type(error).__name__}: {error} (declare the "
                                 f"state transactions at module level so worker processes can import them)")
                    parts.append(_run_part([txns[index] for index in members], [specs[index] for index in members],
                                           base, loader, strategy, prepared.times, runtime.model))
    if not parts:
        parts = [_run_part(txns, specs, base, loader, strategy, prepared.times, runtime.model)]
    return _assemble(prepared, parts, strategy, seconds, components, largest_share, runtime, notes)


def _is_pickling_problem(error: BaseException) -> bool:
    import pickle

    return isinstance(error, (pickle.PicklingError, AttributeError, TypeError)) and (
        "pickle" in str(error).lower() or "Can't get" in str(error) or "Can't pickle" in str(error))


def _assemble(prepared: Prepared, parts: list[_Part], strategy, seconds: dict[str, float], components: int,
              largest_share: float, runtime: Runtime, notes: list[str]) -> BatchResult:
    outcome_of: dict[int, TxnOutcome] = {}
    final: dict = {}
    before: dict = {}
    totals: dict[str, Any] = {}
    execution = {"executions": 0, "rollbacks": 0, "aborts_applied": 0, "revoked": 0, "passes": 0, "units": 0,
                 "cyclic_ops": 0, "strata": 0}
    busiest = 0
    part_seconds: dict[str, float] = {}
    for part in parts:
        for outcome in part.outcomes:
            outcome_of[outcome.t] = outcome
        final.update(part.final)
        before.update(part.before)
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
        for name, value in part.seconds.items():
            part_seconds[name] = max(part_seconds.get(name, 0.0), value) if len(parts) > 1 else value
    seconds.update(part_seconds)
    transactions = []
    aborted = 0
    for txn in prepared.txns:
        outcome = outcome_of[txn.t]
        aborted += not outcome.committed
        transactions.append(TransactionResult(txn.event, outcome.committed, outcome.reason, outcome.outputs))
    mean = totals.get("on_states", 0) / totals["states"] if totals.get("states") else 1.0
    strategies = sorted({part.strategy for part in parts})
    statistics = BatchStatistics(
        transactions=len(prepared.txns), rejected=len(prepared.rejected), operations=totals.get("operations", 0),
        td_edges=totals.get("td", 0), pd_edges=totals.get("pd", 0), ld_pairs=totals.get("ld", 0),
        nd_ops=totals.get("nd", 0), window_ops=totals.get("window", 0), states=totals.get("states", 0),
        skew=(busiest / mean) if mean else 1.0, components=components, largest_component_share=largest_share,
        processes=len(parts), seconds=seconds, decision=parts[0].decision, **execution)
    if parts[0].execution is not None and strategy != SERIAL:
        runtime.model.observe(len(prepared.txns), aborted, execution["executions"], seconds.get("execute", 0.0))
    runtime.model.history.append("+".join(strategies))
    return BatchResult(transactions, list(prepared.rejected), final, before, "+".join(strategies), statistics, notes)


def run_in_memory(transactions: StateTransactions, events: Iterable[Any],
                  state: Mapping[tuple[str, Any], dict | None] | None = None, *, strategy: str | Strategy = AUTO,
                  processes: int | None = None, split: str = "auto") -> BatchResult:
    """Declare and run a batch over ``state`` (images before the batch; absent = no row)."""
    prepared = prepare(transactions, events)
    return execute(transactions, prepared, dict(state or {}), strategy=strategy, processes=processes, split=split)
