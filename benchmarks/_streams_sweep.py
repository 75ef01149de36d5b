"""``activedb bench streams``' sweep of the workload choices that decide LWM's lead over S2PL with tuple locks, on a
mix written from Active CEP's text rather than the benchmark's own pool (the design note's benchmark section).

**The mix.**  Every s-transaction reads its worker's status ``readN`` times — ``readN`` reader queries on its event,
writers included (Table 1's readN is the *average* Reads per s-transaction) — and a quarter of them, ``W``
events, also write it: the writer pair ``QW``/``RW`` (an ``UPDATE``: a Read and a Write).  Events spread evenly
at random over ``keys`` workers, one status tuple each.  In the benchmark's own pool a writer is its pair alone;
here a writer also reads, which is what kept LWM's write lock through those Reads before it wrote first.

**The sweep** (one parameter at a time around the centre, each point a readN sweep 1–6 at tuple locks):

* ``keys`` — workers (status tuples) per s-transactions in flight: LWM's lead is its locks granted where S2PL
  waits, so it needs conflicts; the centre has a quarter as many workers as s-transactions in flight (Fig. 5's
  setting, as in the throughput sweeps);
* ``workers`` — s-transactions in flight (the scheduler's window), the keys kept at a quarter of it;
* the cost model — ``sleep`` (a store one round trip away: ``time.sleep`` after the lock, the GIL released) of
  1 ms and 2 ms, and ``postgres`` (a real round trip: ``SELECT pg_sleep`` on a connection of the
  s-transaction's thread).

Beyond the sweep, three points say where the lead ends and why (no target): many keys (no conflicts: the
locks bind neither scheduler), a wait of 0.25 ms (the CPU around each operation, serialised by the GIL, bounds
both first) and a CPU cost (``spin``: operations cannot overlap under the GIL).

Per point: throughput (processed / T_proc, best of ``REPEAT`` runs in turns, each checked against Definition 6),
the lock-rule model's throughput (:func:`benchmarks._streams_model.model_throughput`: no CPU, no GIL), and
L_combined at 2,000 events/s on the Fig. 11 mix with the point's keys, workers and cost (median of ``REPEAT``).
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

import psycopg

from activedb import streams
from benchmarks._streams_model import ModelTransaction, SleepCost, best_of, median_of, model_throughput, smoke_run
from benchmarks.report import BenchReport, Row

MIX_EVENTS = 600
MIX_BATCH = 300
WRITE_SHARE = 0.25
READ_N = (1, 2, 3, 4, 5, 6)
REPEAT = 3
LATENCY_RATE = 2000.0
LATENCY_SECONDS = 1.5


@dataclass(frozen=True)
class Point:
    """One point of the sweep: ``keys`` workers, ``workers`` s-transactions at once, the cost model."""

    keys: int
    workers: int
    cost: str                # "sleep" | "postgres" | "spin"
    cost_ms: float
    target: bool = True      # under the acceptance (False: beyond the sweep, shown with its reason)

    @property
    def label(self) -> str:
        return f"keys {self.keys}, workers {self.workers}, {self.cost} {self.cost_ms:g} ms"


CENTRE = Point(keys=4, workers=16, cost="sleep", cost_ms=1.0)
POINTS = (CENTRE, Point(2, 16, "sleep", 1.0), Point(8, 16, "sleep", 1.0), Point(2, 8, "sleep", 1.0),
          Point(8, 32, "sleep", 1.0), Point(4, 16, "sleep", 2.0), Point(4, 16, "postgres", 1.0),
          # Beyond the sweep: no conflicts; operations whose waits are short against the CPU around them; CPU work.
          Point(64, 16, "sleep", 1.0, target=False), Point(4, 16, "sleep", 0.25, target=False),
          Point(4, 16, "spin", 0.25, target=False))
QUICK_POINTS = (CENTRE,)


def mix_definitions(read_n: int) -> str:
    """``readN`` reader queries on each of ``R`` and ``W``, and the writer pair on ``W``."""
    reader = ("CREATE QUERY Q{type}{index} ON bstream PATTERN SEQ({type}) WHERE 'violation' != (SELECT status FROM "
              "workerStatus WHERE workerID = {type}.HCW-ID) RETURN {type}.HCW-ID")
    parts = [reader.format(type=event_type, index=index) for event_type in ("R", "W")
             for index in range(1, read_n + 1)]
    parts.append("CREATE QUERY QW ON bstream PATTERN SEQ(W) RETURN W.HCW-ID, W.next")
    parts.append("CREATE RULE RW ON OUTPUT QW BEGIN UPDATE workerStatus SET status = NEW.next "
                 "WHERE workerID = NEW.HCW-ID END")
    return "\n".join(parts)


def mix_events(count: int, keys: int, rng: random.Random, spacing: float = 0.01) -> list[streams.StreamEvent]:
    """``count`` events on ``keys`` workers at random, a share ``WRITE_SHARE`` of them ``W``."""
    return [streams.StreamEvent("W" if rng.random() < WRITE_SHARE else "R", round(index * spacing, 6),
                                {"HCW-ID": f"w{rng.randrange(keys):02d}", "next": rng.choice(("safe", "warning")),
                                 "reads": 0})
            for index in range(count)]


def mix_model(events: list[streams.StreamEvent], read_n: int, scheduler: str, window: int) -> float:
    """:func:`model_throughput` of the mix in operations per unit: a reader's ``readN`` Reads; a writer's Reads
    and its pair's Read and Write — under LWM the pair first and its write lock released after it (it writes
    first), under S2PL in the engine's order (queries, then the rule) and every lock to the end."""
    transactions = []
    for event in events:
        key = event.attributes["HCW-ID"]
        reads = [("r", key)] * read_n
        if event.type != "W":
            transactions.append(ModelTransaction(reads))
        elif scheduler == "lwm":
            transactions.append(ModelTransaction([("r", key), ("w", key), *reads], release=2))
        else:
            transactions.append(ModelTransaction([*reads, ("r", key), ("w", key)]))
    return model_throughput(transactions, scheduler, window)


class PostgresCost:
    """A store operation that is a real round trip: ``SELECT pg_sleep(seconds)`` (prepared) on a connection of the
    calling thread, opened at its first operation (psycopg, autocommit).  Not through SQLAlchemy's pool: its
    checkout, statement and result path costs several times the round trip's own client CPU, all of it under the
    GIL, and would make this point CPU-bound for both schedulers like ``spin`` (benchmarks/RESULTS.md)."""

    def __init__(self, database: Any, seconds: float):
        self.seconds = seconds
        self._conninfo = database.engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
        self._local = threading.local()
        self._connections: list[psycopg.Connection[Any]] = []
        self._lock = threading.Lock()

    def __call__(self, kind: str) -> None:
        connection = getattr(self._local, "connection", None)
        if connection is None:
            connection = self._local.connection = psycopg.connect(self._conninfo, autocommit=True)
            with self._lock:
                self._connections.append(connection)
        connection.execute("SELECT pg_sleep(%s)", (self.seconds,), prepare=True)

    @property
    def connections(self) -> tuple[psycopg.Connection[Any], ...]:
        """The threads' connections opened so far (one per thread that operated)."""
        with self._lock:
            return tuple(self._connections)

    def close(self) -> None:
        with self._lock:
            connections, self._connections = self._connections, []
        for connection in connections:
            connection.close()


class SpinCost:
    """A store operation that is CPU work (a busy wait, the GIL held): nothing can overlap it in CPython."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    def __call__(self, kind: str) -> None:
        until = time.perf_counter() + self.seconds
        while time.perf_counter() < until:
            pass


def cost_of(database: Any, point: Point) -> Callable[[str], None]:
    seconds = point.cost_ms / 1000
    if point.cost == "postgres":
        return PostgresCost(database, seconds)
    if point.cost == "spin":
        return SpinCost(seconds)
    return SleepCost(seconds)


def run_sweep(database: Any, quick: bool, rng: random.Random, *, throughput_once: Callable[..., dict],
              measure_realtime: Callable[..., dict], pattern_definitions: Callable[..., str],
              pattern_events: Callable[..., list]) -> dict[str, Any]:
    """Every point's readN sweep (S2PL and LWM, tuple locks) and its latency at 2,000 events/s (the functions of
    ``benchmarks.streams`` that measure a run are passed in)."""
    points = QUICK_POINTS if quick else POINTS
    read_ns = (1, 6) if quick else READ_N
    repeat = 1 if quick else REPEAT
    count = 60 if quick else MIX_EVENTS
    seconds = 0.25 if quick else LATENCY_SECONDS
    found: dict[str, Any] = {"readN": list(read_ns), "points": []}
    types = ["T1", "T2", "T3", "X"]
    for point in points:
        cost = cost_of(database, point)
        try:
            series: dict[str, list] = {"s2pl": [], "lwm": []}
            for read_n in read_ns:
                events = mix_events(count, point.keys, rng)
                runs: dict[str, list] = {"s2pl": [], "lwm": []}
                for turn in range(repeat):
                    for name in (("s2pl", "lwm") if turn % 2 == 0 else ("lwm", "s2pl")):
                        make = streams.S2PLScheduler if name == "s2pl" else streams.LWMScheduler
                        runs[name].append(throughput_once(
                            database, lambda: make(granularity="tuple", workers=point.workers), events,
                            mix_definitions(read_n), ("R", "W"), cost, MIX_BATCH))
                for name in ("s2pl", "lwm"):
                    best = best_of(runs[name])
                    best["model"] = round(mix_model(events, read_n, name, point.workers) / (point.cost_ms / 1000), 1)
                    series[name].append(best)
            latency: dict[str, Any] = {}
            events = pattern_events(max(20, int(LATENCY_RATE * seconds)), types, rng, 1 / LATENCY_RATE,
                                    hcws=point.keys)
            latency_runs: dict[str, list] = {"s2pl": [], "lwm": []}
            for turn in range(repeat):
                for name in (("s2pl", "lwm") if turn % 2 == 0 else ("lwm", "s2pl")):
                    make = streams.S2PLScheduler if name == "s2pl" else streams.LWMScheduler
                    latency_runs[name].append(measure_realtime(
                        database, make(granularity="tuple", workers=point.workers), events, LATENCY_RATE,
                        pattern_definitions(3, readers=True), tuple(types), cost))
            for name in ("s2pl", "lwm"):
                latency[name] = median_of(latency_runs[name], "L_combined_ms")
        finally:
            if isinstance(cost, PostgresCost):
                cost.close()
        found["points"].append({"point": point.__dict__ | {"label": point.label}, **series, "latency": latency})
    return found


def sweep_rows(report: BenchReport, sweep: dict[str, Any]) -> None:
    """Per point: LWM >= S2PL at every readN, flatter (readN 6 over readN 1), L_combined at 2,000 events/s LWM <=
    S2PL — each with its target (beyond the sweep: shown, no target); then how many points meet all three."""
    read_ns = sweep["readN"]
    met_points = total = 0
    for entry in sweep["points"]:
        point = Point(**{key: value for key, value in entry["point"].items() if key != "label"})
        s2pl = [item["throughput"] for item in entry["s2pl"]]
        lwm = [item["throughput"] for item in entry["lwm"]]
        ahead = [a >= b for a, b in zip(lwm, s2pl)]
        flat_lwm, flat_s2pl = lwm[-1] / lwm[0], s2pl[-1] / s2pl[0]
        model = {name: [item["model"] for item in entry[name]] for name in ("s2pl", "lwm")}
        latency = {name: entry["latency"][name]["L_combined_ms"] for name in ("s2pl", "lwm")}
        later = latency["lwm"] is not None and latency["s2pl"] is not None and latency["lwm"] <= latency["s2pl"]
        target = point.target
        extra = {"readN": read_ns, "lwm": [round(value, 1) for value in lwm], "s2pl": [round(value, 1) for value in s2pl],
                 "lwm_over_s2pl": [round(a / b, 2) for a, b in zip(lwm, s2pl)],
                 "model_lwm_over_s2pl": [round(a / b, 2) for a, b in zip(model["lwm"], model["s2pl"])],
                 "model_events_per_s": model,
                 "lock_waits": {name: [item.get("lock_waits") for item in entry[name]] for name in ("s2pl", "lwm")},
                 "early_releases_lwm": [item.get("early_releases") for item in entry["lwm"]],
                 "deferred_writes_lwm": [item.get("deferred_writes") for item in entry["lwm"]],
                 "runs": {name: [item.get("runs") for item in entry[name]] for name in ("s2pl", "lwm")},
                 "cpu_us_per_event": {name: [item.get("cpu_us_per_event") for item in entry[name]]
                                      for name in ("s2pl", "lwm")},
                 "violations": sum(item["violations"] for name in ("s2pl", "lwm") for item in entry[name])}
        report.add(Row(name=f"independent mix, {point.label}: readN points with LWM >= S2PL, tuple locks",
                       value=sum(ahead), unit="points", target=f"{len(ahead)} of {len(ahead)}" if target else None,
                       met=all(ahead) if target else None, extra=extra))
        report.add(Row(name=f"independent mix, {point.label}: LWM keeps of its readN {read_ns[0]} throughput at "
                            f"readN {read_ns[-1]}", value=round(flat_lwm, 3), unit="x", baseline_name="S2PL keeps",
                       baseline=round(flat_s2pl, 3), ratio=round(flat_lwm, 3) / round(flat_s2pl, 3),
                       target="above S2PL's (the paper's Fig. 5: LWM scales more gracefully)" if target else None,
                       met=flat_lwm > flat_s2pl if target else None,
                       extra={"model": {name: round(values[-1] / values[0], 3) for name, values in model.items()}}))
        report.add(Row(name=f"independent mix, {point.label}: L_combined at 2,000 events/s, LWM",
                       value=latency["lwm"] or 0.0, unit="ms", baseline_name="S2PL", baseline=latency["s2pl"],
                       ratio=(latency["s2pl"] / latency["lwm"]) if latency["lwm"] and latency["s2pl"] else None,
                       target="<= S2PL" if target else None, met=later if target else None,
                       extra={name: {key: entry["latency"][name].get(key) for key in (
                           "L_combined_ms", "runs", "throughput", "lock_waits", "order_waits", "violations")}
                           for name in ("s2pl", "lwm")}))
        violations = extra["violations"] + sum(entry["latency"][name]["violations"] for name in ("s2pl", "lwm"))
        report.add(Row(name=f"Definition 6 violations, independent mix, {point.label} (every run checked)",
                       value=violations, unit="violations", target="0 (Active CEP Def. 6)", met=violations == 0))
        if target:
            total += 1
            met_points += all(ahead) and flat_lwm > flat_s2pl and later
    report.add(Row(name="independent mix: sweep points where LWM >= S2PL at every readN, flatter, and L_combined "
                        "<= S2PL at 2,000 events/s", value=met_points, unit=f"of {total} points",
                   target="all", met=met_points == total))


def run_alone(quick: bool = False) -> BenchReport:
    """Only this part (``ACTIVEDB_BENCH_STREAMS_ONLY=independent-mix activedb bench streams``): a quarter of an hour."""
    import os

    from benchmarks import streams as bench
    from benchmarks._streams_report import write_alone

    report = BenchReport("stream transactions: LWM vs S2PL on the independent mix (activedb bench streams)")
    database = bench.connect()
    try:
        load = round(os.getloadavg()[0], 2)
        with smoke_run() if quick else contextlib.nullcontext():
            sweep = run_sweep(database, quick, random.Random(bench.SEED), throughput_once=bench.throughput_once,
                              measure_realtime=bench.measure_realtime, pattern_definitions=bench.pattern_definitions,
                              pattern_events=bench.pattern_events)
    finally:
        database.close()
    sweep_rows(report, sweep)
    write_alone(report, "streams-independent-mix.json", {"sweep": sweep}, load)
    return report
