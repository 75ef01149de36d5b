"""``activedb bench composite``: composition of events from many producers under accuracy-interval time.

No database: (1) throughput of ``AND``/``SEQ`` with 1–8 producers whose clocks err within 1, 10 or 50 ms,
against the same events on point timestamps; (2) the latency added by waiting for stability as a
function of the heartbeat period.  ``--quick``: fewer events and configurations; a PNG of both is
written to ``$ACTIVEDB_BENCH_DIR`` (or a new temporary folder).  Details: the bench design note.
"""

from __future__ import annotations

import random
import statistics
import time
from pathlib import Path

from activedb import composite, streams
from activedb.composite import Choice, UncertaintyKind
from activedb.events import Timestamp
from activedb.progress import Progress
from benchmarks.report import BenchReport, Row, output_folder

SEED = 16
PARTITIONS = 8


def _policy(uncertainty):
    if uncertainty.kind is UncertaintyKind.UNORDERED:
        return Choice.drop(*uncertainty.candidates)
    return min(uncertainty.candidates, key=lambda event: event["id"])


def workload(producers: int, accuracy: float, events: int, heartbeat_period: float, seed: int,
             delay: float = 0.0) -> list[tuple[float, object, object]]:
    """Arrivals ``(arrival time, interval input, point input)`` in arrival order (FIFO per producer)."""
    rng = random.Random(seed)
    span = events * 0.002
    names = [f"P{index}" for index in range(producers)]
    arrivals = []
    counter = 0
    for index, name in enumerate(names):
        kinds = ["A", "B"] if producers == 1 else (["A"] if index == 0 else ["B"])
        share = events // producers
        offset = rng.uniform(-accuracy, accuracy)
        times = sorted(rng.uniform(0, span) for _ in range(share))
        beats = [beat * heartbeat_period for beat in range(1, int(span / heartbeat_period) + 2)]
        last_arrival = 0.0
        merged = sorted([(at, False) for at in times] + [(at, True) for at in beats])
        for at, is_heartbeat in merged:
            reading = at + offset
            arrival = max(last_arrival, at + rng.uniform(0, delay))      # FIFO channel
            last_arrival = arrival
            interval = Timestamp.at(reading, accuracy, producer=name)
            point = Timestamp.point(reading, producer=name)
            if is_heartbeat:
                arrivals.append((arrival, composite.Heartbeat(name, interval), composite.Heartbeat(name, point)))
                continue
            counter += 1
            kind = rng.choice(kinds)
            attributes = {"id": f"{name}-{counter:06d}", "k": counter % PARTITIONS}
            arrivals.append((arrival, streams.StreamEvent(kind, interval, attributes),
                             streams.StreamEvent(kind, point, attributes)))
    arrivals.sort(key=lambda entry: entry[0])
    return arrivals


def make_engine(operator: str, producers: int, clock=None) -> composite.CompositionEngine:
    engine = composite.CompositionEngine(name="bench", clock=clock or composite.ManualClock(), timeout=None,
                                         on_uncertain=_policy, window=1)
    engine.create_stream("s", types=["A", "B"], attributes=["id", "k"])
    engine.define(f"CREATE QUERY Q PATTERN {operator}(A, B) WHERE [k] CONSUMING CHRONICLE RETURN A.id AS a")
    for index in range(producers):
        engine.join(f"P{index}", types=["A", "B"] if producers == 1 else (["A"] if index == 0 else ["B"]))
    return engine


def throughput(operator: str, producers: int, items: list, finish: list[str]) -> tuple[float, float, object]:
    engine = make_engine(operator, producers)
    started = time.perf_counter()
    produced = len(engine.submit(items))
    for name in finish:
        produced += len(engine.leave(name))
    elapsed = time.perf_counter() - started
    events = sum(1 for item in items if not isinstance(item, composite.Heartbeat))
    return events / elapsed, produced / elapsed, engine.statistics()


def latency(operator: str, producers: int, arrivals: list, use_point: bool) -> list[float]:
    clock = composite.ManualClock()
    engine = make_engine(operator, producers, clock)
    arrived: dict[str, float] = {}
    latencies = []
    for arrival, interval_item, point_item in arrivals:
        clock.advance(max(0.0, arrival - clock.now()))
        item = point_item if use_point else interval_item
        if not isinstance(item, composite.Heartbeat):
            arrived[item["id"]] = arrival
        for produced in engine.signal(item):
            last = max(arrived[event["id"]] for event in produced.constituents)
            latencies.append(produced.sts - last)
    return latencies


def run(quick: bool = False, progress: Progress | None = None) -> BenchReport:
    report = BenchReport("composite: events from many producers, accuracy-interval time vs point timestamps")
    events = 1000 if quick else 5000
    producer_counts = (1, 4) if quick else (1, 2, 4, 8)
    accuracies = (0.001, 0.050) if quick else (0.001, 0.010, 0.050)
    periods = (0.005, 0.050) if quick else (0.001, 0.005, 0.010, 0.050, 0.100)
    progress = progress or Progress.none()
    progress.start("bench composite", total=2 * len(producer_counts) + 2)
    figures: dict = {"throughput": [], "latency": []}
    for operator in ("AND", "SEQ"):
        for producers in producer_counts:
            for accuracy in accuracies:
                arrivals = workload(producers, accuracy, events, 0.010, SEED)
                names = [f"P{index}" for index in range(producers)]
                rate, composites_rate, stats = throughput(operator, producers, [entry[1] for entry in arrivals], names)
                point_rate, point_composites, point_stats = throughput(operator, producers,
                                                                       [entry[2] for entry in arrivals], names)
                label = f"{operator} chronicle, {producers} producer{'s' if producers > 1 else ''}, accuracy " \
                        f"{accuracy * 1000:g} ms"
                report.add(Row(f"{label}: composite events/s", composites_rate, "composites/s",
                               baseline_name="same events on point timestamps", baseline=point_composites,
                               ratio=composites_rate / point_composites if point_composites else None,
                               extra={"input_events_per_s": rate, "point_input_events_per_s": point_rate,
                                      "composites": stats.composites, "point_composites": point_stats.composites,
                                      "uncertainties": stats.uncertainties,
                                      "point_uncertainties": point_stats.uncertainties,
                                      "dropped": stats.dropped, "events": stats.events}))
                figures["throughput"].append((operator, producers, accuracy, composites_rate, point_composites,
                                              rate, point_rate))
            progress.update(len(figures["throughput"]) // len(accuracies),
                            f"throughput of {operator}, {producers} producer(s), every accuracy")
    for operator in ("AND", "SEQ"):
        for period in periods:
            arrivals = workload(4, 0.005, events // 2, period, SEED + 1, delay=0.002)
            interval_latencies = latency(operator, 4, arrivals, use_point=False)
            point_latencies = latency(operator, 4, arrivals, use_point=True)
            mean = statistics.fmean(interval_latencies) * 1000 if interval_latencies else float("nan")
            point_mean = statistics.fmean(point_latencies) * 1000 if point_latencies else float("nan")
            p95 = _percentile(interval_latencies, 0.95) * 1000
            report.add(Row(f"{operator} chronicle, 4 producers, 5 ms accuracy, heartbeat every {period * 1000:g} ms: "
                           f"mean latency to stability", mean, "ms", baseline_name="point timestamps",
                           baseline=point_mean, ratio=point_mean / mean if mean else None,
                           extra={"p95_ms": p95, "point_p95_ms": _percentile(point_latencies, 0.95) * 1000,
                                  "composites": len(interval_latencies), "point_composites": len(point_latencies)}))
            figures["latency"].append((operator, period, mean, point_mean, p95))
        progress.update(2 * len(producer_counts) + (1 if operator == "AND" else 2),
                        f"latency to stability of {operator}, every heartbeat period")
    report.notes.append("throughput: engine.submit over events and heartbeats (every 10 ms per producer), "
                        "partitioned by attribute k into 8 partitions, uncertainties decided by a callback; "
                        "point timestamps = the same readings with alpha = 0 through the same engine")
    report.notes.append("latency: simulated system time (ManualClock) from the arrival of a composite's last "
                        "constituent to its production; events arrive 0-2 ms after they occur")
    report.notes.append(f"plot: {_plot(figures)}")
    return report


def _percentile(values: list[float], fraction: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def _plot(figures: dict) -> Path:
    from matplotlib.figure import Figure

    figure = Figure(figsize=(12, 4.5))
    left, right = figure.subplots(1, 2)
    for operator, marker in (("AND", "o"), ("SEQ", "s")):
        accuracies = sorted({row[2] for row in figures["throughput"] if row[0] == operator})
        for accuracy in accuracies:
            rows = [row for row in figures["throughput"] if row[0] == operator and row[2] == accuracy]
            left.plot([row[1] for row in rows], [row[3] for row in rows], marker=marker,
                      label=f"{operator}, accuracy {accuracy * 1000:g} ms")
        rows = [row for row in figures["throughput"] if row[0] == operator and row[2] == accuracies[0]]
        left.plot([row[1] for row in rows], [row[4] for row in rows], marker=marker, linestyle="--", color="black",
                  label=f"{operator}, point timestamps")
    left.set(xlabel="producers", ylabel="composite events/s", title="throughput (chronicle)")
    left.legend(fontsize=7)
    for operator, marker in (("AND", "o"), ("SEQ", "s")):
        rows = [row for row in figures["latency"] if row[0] == operator]
        right.plot([row[1] * 1000 for row in rows], [row[2] for row in rows], marker=marker,
                   label=f"{operator}, 5 ms accuracy (mean)")
        right.plot([row[1] * 1000 for row in rows], [row[4] for row in rows], marker=marker, linestyle=":",
                   label=f"{operator}, 5 ms accuracy (p95)")
        right.plot([row[1] * 1000 for row in rows], [row[3] for row in rows], marker=marker, linestyle="--",
                   color="black", label=f"{operator}, point timestamps (mean)")
    right.set(xlabel="heartbeat period (ms)", ylabel="latency to stability (ms)",
              title="latency added by waiting for stability (4 producers)")
    right.legend(fontsize=7)
    figure.tight_layout()
    path = output_folder("composite") / "activedb-bench-composite.png"
    figure.savefig(path, dpi=110)
    return path
