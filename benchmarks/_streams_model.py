"""``activedb bench streams``' cost model: the timed store operation (:class:`SleepCost`) and the engine
that pays it (:class:`CostedEngine`), LWM's
writer chain timed link by link (:class:`WriterChain`) and each point's critical path in store
operations (:func:`model_operations`); how its runs are taken (:func:`quiet_heap`) and reduced
(:func:`best_of`, :func:`median_of`).  What they measure: ``activedb bench streams --help`` and
``activedb/streams/README.md``'s benchmark section."""

from __future__ import annotations

import contextlib
import contextvars
import gc
import heapq
import threading
import time
from typing import Any, Callable

from activedb import streams

THREADS = 16                        # s-transactions S2PL and LWM run at once


class SleepCost:
    """The cost model's store operation: ``time.sleep(seconds)``, and how long each sleep really
    lasted; ``take()`` returns the operations and seconds slept since the last ``take``."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self._mutex = threading.Lock()
        self._count = 0
        self.slept = 0.0

    def __call__(self, kind: str) -> None:
        started = time.perf_counter()
        time.sleep(self.seconds)
        slept = time.perf_counter() - started
        with self._mutex:
            self._count += 1
            self.slept += slept

    def take(self) -> tuple[int, float]:
        with self._mutex:
            taken = self._count, self.slept
            self._count, self.slept = 0, 0.0
        return taken


class CostedEngine(streams.StreamEngine):
    """A stream engine whose every store operation runs ``cost(kind)`` once its lock is granted: the cost
    model, through the engine's extension hook ``StreamEngine.store_operation``."""

    def __init__(self, *args: Any, cost: Callable[[str], None], **options: Any):
        self.operation_cost = cost
        super().__init__(*args, **options)

    def store_operation(self, kind: str) -> None:
        self.operation_cost(kind)


def slept(cost: Callable[[str], None] | None) -> dict[str, Any]:
    """The run's operations and the mean length of their sleeps (ms), if the cost measures them."""
    if not isinstance(cost, SleepCost):
        return {}
    count, seconds = cost.take()
    return {"operations": count, "sleep_ms_mean": round(seconds / count * 1000, 4) if count else None}


class WriterChain(streams.SchedulerHooks):
    """LWM's critical path at table locks, timed per writer: a scheduler hook notes which
    s-transaction a worker thread runs (``started``); ``timed(cost)`` wraps the cost model's
    operation to note when each operation began and ended; ``figures()`` splits each link of the
    chain as the design note's benchmark section says."""

    def __init__(self) -> None:
        self._local = threading.local()
        self._mutex = threading.Lock()
        self._batch = 0
        # (batch, position) -> (a writer?, [(start, end) of each operation])
        self._operations: dict[tuple[int, Any], tuple[bool, list[tuple[float, float]]]] = {}

    def started(self, stransaction) -> None:
        self._local.current = (self._batch, stransaction.event.position, stransaction.event.type == "W")

    def next_batch(self) -> None:
        self._batch += 1

    def timed(self, cost: Callable[[str], None]) -> Callable[[str], None]:
        def operation(kind: str) -> None:
            started = time.perf_counter()
            cost(kind)
            ended = time.perf_counter()
            current = getattr(self._local, "current", None)
            if current is not None:
                with self._mutex:
                    entry = self._operations.setdefault(current[:2], (current[2], []))
                    entry[1].append((started, ended))
        return operation

    def figures(self) -> dict[str, Any]:
        """Means over the links of the chain, in ms (operations per writer as measured)."""
        with self._mutex:
            entries = sorted((key, spans) for key, (writer, spans) in self._operations.items() if writer and spans)
        links, sleeps, between, handovers, counts = [], [], [], [], []
        previous = None
        for (batch, _), spans in entries:
            if previous is not None and previous[0] == batch and spans[0][0] >= previous[1]:
                links.append(spans[-1][1] - previous[1])
                handovers.append(spans[0][0] - previous[1])
                sleeps.extend(end - start for start, end in spans)
                between.extend(spans[index][0] - spans[index - 1][1] for index in range(1, len(spans)))
                counts.append(len(spans))
            previous = (batch, spans[-1][1])

        def ms(values: list[float]) -> float | None:
            return round(sum(values) / len(values) * 1000, 3) if values else None
        return {"links": len(links), "link_ms": ms(links), "operations": round(sum(counts) / len(counts), 2) if counts else None,
                "sleep_ms": ms(sleeps), "between_operations_ms": ms(between), "handover_ms": ms(handovers)}


def model_operations(events: list, read_n: int, batch: int, threads: int = THREADS,
                     granularity: str = "table") -> dict[str, int]:
    """Each scheduler's critical path, in store operations, for ``events`` of the pool in
    micro-batches of ``batch`` (one after another): an event does its ``reads`` Reads (``read_n``
    if it has no such attribute), a ``W`` event then its Write.  What each scheduler's path is
    (per HCW at ``granularity="tuple"``): ``activedb/streams/README.md``, the benchmark section;
    an idle machine with exact sleeps reaches it."""
    totals = {"sei": 0, "s2pl": 0, "lwm": 0}
    for start in range(0, len(events), batch):
        chunk = events[start:start + batch]
        groups: dict[Any, list] = {}
        for event in chunk:
            key = event.attributes.get("HCW-ID") if granularity == "tuple" else None
            groups.setdefault(key, []).append((event.type == "W", event.attributes.get("reads", read_n)))
        operations = sum(reads + writer for group in groups.values() for writer, reads in group)
        totals["sei"] += operations
        floor = -(-operations // threads)
        paths = [_paths(group, threads) for group in groups.values()]
        totals["s2pl"] += max([floor, *(s2pl for s2pl, _ in paths)])
        totals["lwm"] += max([floor, *(lwm for _, lwm in paths)])
    return totals


def _paths(chunk: list[tuple[bool, int]], threads: int) -> tuple[int, int]:
    """S2PL's and LWM's critical paths over ``(writer?, reads)`` s-transactions that all conflict
    (S2PL runs the readers between two writers ``threads`` at a time, the most-reading counting)."""
    s2pl, run = 0, []
    for writer, reads in [*chunk, (True, -1)]:
        if not writer:
            run.append(reads)
            continue
        s2pl += sum(max(run[index:index + threads]) for index in range(0, len(run), threads)) + reads + 1
        run = []
    chain = lwm = 0
    for writer, reads in chunk:
        if writer:
            chain += reads + 1
        lwm = max(lwm, chain if writer else chain + reads)
    return s2pl, lwm


#: False inside :func:`smoke_run`: :func:`quiet_heap` leaves the heap alone.
_SETTLE_HEAP: contextvars.ContextVar[bool] = contextvars.ContextVar("settle_heap", default=True)


@contextlib.contextmanager
def quiet_heap():
    """Collect the garbage of earlier runs, then freeze what is left for the measured run, so that
    no full collection of the process's heap falls into one run and not another's (not in a
    :func:`smoke_run`)."""
    if not _SETTLE_HEAP.get():
        yield
        return
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


@contextlib.contextmanager
def smoke_run():
    """A ``--quick`` run: every path and row, figures not meant to be compared, so its runs are taken without
    :func:`quiet_heap`'s full collection each — which walks the whole heap of the calling process (a test
    session's holds millions of objects) and then costs more than the runs themselves."""
    token = _SETTLE_HEAP.set(False)
    try:
        yield
    finally:
        _SETTLE_HEAP.reset(token)


def best_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the highest throughput; ``cpu_us_per_event`` the least of the runs (the
    process's CPU time per event, all threads); ``violations`` summed over every run;
    ``runs`` every run's throughput (their spread says how far one point can be trusted)."""
    best = dict(max(runs, key=lambda point: point["throughput"]))
    best["cpu_us_per_event"] = min(point["cpu_us_per_event"] for point in runs)
    best["violations"] = sum(point["violations"] for point in runs)
    best["runs"] = [round(point["throughput"], 1) for point in runs]
    return best


def median_of(runs: list[dict[str, Any]], figure: str) -> dict[str, Any]:
    """The run with the median ``figure`` (the lower middle one of an even number);
    ``violations`` summed over every run; ``runs`` every run's ``figure``."""
    ordered = sorted(runs, key=lambda point: point[figure] if point[figure] is not None else float("inf"))
    middle = dict(ordered[(len(ordered) - 1) // 2])
    middle["violations"] = sum(point["violations"] for point in runs)
    middle["runs"] = [point[figure] for point in runs]
    return middle


class ModelTransaction(tuple):
    """One s-transaction for :func:`model_throughput`: ``ops`` — ``("r" | "w", key)`` in the order it runs them —
    and ``release`` — after how many of them LWM releases its write locks (all of them, or fewer when it writes
    first)."""

    __slots__ = ()

    def __new__(cls, ops: list[tuple[str, Any]], release: int | None = None) -> "ModelTransaction":
        return tuple.__new__(cls, (tuple(ops), len(ops) if release is None else release))


def model_throughput(transactions: list[ModelTransaction], scheduler: str, window: int) -> float:
    """The lock rules as ``activedb.streams`` implements them, on an idle machine whose every store operation takes
    one unit of time and nothing else any: S2PL (an s-transaction's request on a key is a write request if it writes
    it; a request waits for every earlier conflicting one until its owner ends) or LWM (a Read or Write on a key
    waits for every earlier write lock on it until its owner released it); at most ``window`` s-transactions
    unfinished at once, the next one starting when one ends.  Returns s-transactions per unit of time (× 1 / cost:
    per second).  A model: no CPU, no GIL, no commit — what the lock rules alone allow."""
    count = len(transactions)
    writes = [{key for kind, key in ops if kind == "w"} for ops, _ in transactions]
    touched = [{key for _, key in ops} for ops, _ in transactions]
    # Per key, the positions that hold it back from later ones, with lazy deletion (heaps of positions).
    writers: dict[Any, list[int]] = {}
    requesters: dict[Any, list[int]] = {}
    for index in range(count):
        for key in writes[index]:
            writers.setdefault(key, []).append(index)
        for key in touched[index]:
            requesters.setdefault(key, []).append(index)
    freed = [False] * count                  # LWM: write locks released; S2PL: ended
    done = [False] * count
    step = [0] * count
    busy = [False] * count
    lwm = scheduler == "lwm"

    def first(queue: list[int]) -> int | None:
        while queue and freed[queue[0]]:
            heapq.heappop(queue)
        return queue[0] if queue else None

    def blocked(index: int, kind: str, key: Any) -> bool:
        if lwm or key not in writes[index]:
            earliest = first(writers.get(key, []))
        else:
            earliest = first(requesters.get(key, []))
        return earliest is not None and earliest < index

    for queue in (*writers.values(), *requesters.values()):
        heapq.heapify(queue)
    events: list[tuple[float, int]] = []
    running: list[int] = []
    started = finished = 0
    now = 0.0
    while finished < count:
        while started < count and started - finished < window:
            running.append(started)
            started += 1
        progressed = True
        while progressed:
            progressed = False
            for index in list(running):
                if busy[index]:
                    continue
                ops, release = transactions[index]
                if lwm and step[index] >= release:
                    freed[index] = True
                if step[index] == len(ops):
                    freed[index] = done[index] = True
                    running.remove(index)
                    finished += 1
                    progressed = True
                    while started < count and started - finished < window:
                        running.append(started)
                        started += 1
                    continue
                kind, key = ops[step[index]]
                if not blocked(index, kind, key):
                    busy[index] = True
                    heapq.heappush(events, (now + 1.0, index))
        if finished == count:
            break
        now, index = heapq.heappop(events)
        busy[index] = False
        step[index] += 1
        while events and events[0][0] == now:
            _, other = heapq.heappop(events)
            busy[other] = False
            step[other] += 1
    return count / now if now else float("inf")
