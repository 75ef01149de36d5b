"""``activedb bench nested``: the cost of parallel nested transactions.

1. §5 of *Concurrent Rule Execution in Active Databases*: CPU per hierarchy vs fanout 1–5 and vs 5–70
   transactions (≤ 15 % growth across each sweep).
2. Spawn + commit of an empty child vs a ``ThreadPoolExecutor`` round trip (≤ 1.5×).
3. Top-level commit of 100 writes vs raw psycopg ``executemany`` (≥ 60 % of the raw rate).

Details: the bench design note.
"""

from __future__ import annotations

import gc
import random
import statistics
import time
from concurrent.futures import ThreadPoolExecutor


from activedb.progress import Progress
from benchmarks.report import BenchReport, Row, Series
from benchmarks._setup import connect

#: The most a sweep's CPU per hierarchy may grow across its points (max / min - 1 of the medians).
GROWTH_TARGET = 0.15


def _hierarchy(database, transactions: int, fanout: int, total_objects: int, seed: int) -> float:
    """CPU seconds used by one hierarchy of ``transactions`` nodes with ``fanout``."""
    per_transaction = max(1, total_objects // transactions)
    rng = random.Random(seed)
    objects = rng.sample(range(total_objects * 4), per_transaction * transactions)
    plans = [objects[index * per_transaction:(index + 1) * per_transaction] for index in range(transactions)]
    writes = [[rng.random() < 0.2 for _ in plan] for plan in plans]
    # Breadth-first tree shape: node n's children are n*fanout+1 .. n*fanout+fanout.
    def children_of(node: int) -> list[int]:
        return [child for child in range(node * fanout + 1, node * fanout + fanout + 1) if child < transactions]

    def body(tx, node: int) -> None:
        handles = [tx.spawn(body, child) for child in children_of(node)]
        for object_id, is_write in zip(plans[node], writes[node]):
            if is_write:
                tx.write("bench_objects", object_id, value=node)
            else:
                tx.read("bench_objects", object_id)
        for handle in handles:
            handle.result()

    start = time.process_time()
    with database.transaction() as tx:
        tx.prefetch("bench_objects", objects)   # the objects are "in the buffer", as in the paper
        body(tx, 0)
    return time.process_time() - start


def _sweep(database, report: BenchReport, label: str, configurations, total_objects: int, repeat: int,
           x_label: str, x_of) -> None:
    """Each configuration ``repeat`` times, interleaved (round r runs every configuration once, so that a
    change of the machine's load hits all of them alike), each sample after a full garbage collection
    (untimed: a collection of the whole heap takes longer than a hierarchy, and would land on whichever
    sample crossed the threshold).  The growth is taken between medians; the spread is the largest
    interquartile range relative to its median (the samples' dispersion), the noise the half-widths of the 95 %
    confidence intervals of the two medians compared (order statistics, no distribution assumed): the growth
    is above the noise when it exceeds their sum."""
    samples: dict[tuple[int, int], list[float]] = {config: [] for config in configurations}
    for round_number in range(repeat):
        for transactions, fanout in configurations:
            gc.collect()
            samples[(transactions, fanout)].append(
                _hierarchy(database, transactions, fanout, total_objects, round_number))
    timings = [(config, statistics.median(values)) for config, values in samples.items()]
    baseline_config, baseline = timings[0]
    spreads, noise = [], {}
    for (transactions, fanout), cpu in timings:
        values = samples[(transactions, fanout)]
        low, high = _quartiles(values)
        spreads.append((high - low) / cpu)
        ci_low, ci_high = _median_interval(values)
        noise[(transactions, fanout)] = (ci_high - ci_low) / 2 / cpu
        report.add(Row(
            name=f"{label}: {transactions} transactions, fanout {fanout}", value=cpu * 1000, unit="ms CPU",
            baseline_name=f"{baseline_config[0]} tx, fanout {baseline_config[1]}", baseline=baseline * 1000,
            ratio=baseline / cpu,         # > 1: less CPU than the first point (the table's convention)
            extra={"median_ms": round(cpu * 1000, 3), "quartiles_ms": [round(low * 1000, 3), round(high * 1000, 3)],
                   "min_ms": round(min(values) * 1000, 3), "max_ms": round(max(values) * 1000, 3),
                   "median_ci95_ms": [round(bound * 1000, 3) for bound in _median_interval(values)],
                   "samples": len(values)},
        ))
    (highest, top), (lowest, bottom) = max(timings, key=lambda item: item[1]), min(timings, key=lambda item: item[1])
    growth = top / bottom - 1
    spread, margin = max(spreads), noise[highest] + noise[lowest]
    report.add(Row(name=f"{label}: growth across the sweep (max/min - 1 of the medians)", value=growth * 100,
                   unit="%", target=f"<= {GROWTH_TARGET * 100:g} %", met=growth <= GROWTH_TARGET,
                   extra={"largest_interquartile_range_pct": round(spread * 100, 1), "samples_per_point": repeat,
                          "median_ci95_halfwidths_pct": round(margin * 100, 1), "growth_above_noise": growth > margin}))
    points = [(x_of(config), cpu * 1000) for config, cpu in timings]
    report.add_series(Series(label, "CPU per hierarchy (median of the repeats)", x_label, "ms CPU", points))
    xs, limit_ms = [x for x, _ in points], bottom * (1 + GROWTH_TARGET) * 1000
    report.add_series(Series(label, f"the target: the lowest median + {GROWTH_TARGET * 100:g} %", x_label, "ms CPU",
                             [(min(xs), limit_ms), (max(xs), limit_ms)], reference=True))


def _quartiles(values: list[float]) -> tuple[float, float]:
    """First and third quartiles (the values themselves when there are too few for quartiles)."""
    if len(values) < 4:
        return min(values), max(values)
    quartiles = statistics.quantiles(values, n=4)
    return quartiles[0], quartiles[2]


def _median_interval(values: list[float]) -> tuple[float, float]:
    """A distribution-free 95 % confidence interval of the median: the order statistics n/2 ± 0.98·√n."""
    ordered, count = sorted(values), len(values)
    half = 0.98 * count ** 0.5
    return ordered[max(0, int(count / 2 - half))], ordered[min(count - 1, int(count / 2 + half + 0.999))]


def _spawn_vs_executor(database, report: BenchReport, count: int) -> None:
    executor = ThreadPoolExecutor(max_workers=4)
    def noop():
        return None
    executor.submit(noop).result()
    start = time.perf_counter()
    for _ in range(count):
        executor.submit(noop).result()
    executor_us = (time.perf_counter() - start) / count * 1e6
    executor.shutdown()

    def empty(child):
        return None
    with database.transaction() as tx:
        start = time.perf_counter()
        for _ in range(count):
            tx.spawn(empty).result()
        spawn_us = (time.perf_counter() - start) / count * 1e6
        # Spawn ten at a time so that workers, not the waiting parent, run most of them.
        start = time.perf_counter()
        for _ in range(count // 10):
            handles = [tx.spawn(empty) for _ in range(10)]
            for handle in handles:
                handle.result()
        batch_us = (time.perf_counter() - start) / (count // 10 * 10) * 1e6
    report.add(Row(name="spawn + commit of an empty child, result() right away", value=spawn_us, unit="µs",
                   baseline_name="ThreadPoolExecutor submit->result", baseline=executor_us,
                   ratio=executor_us / spawn_us, target="<= 1.5x executor", met=spawn_us <= 1.5 * executor_us, goal=1 / 1.5,
                   extra={"note": "a waiting parent runs a not-yet-started child inline (help-while-waiting)"}))
    report.add(Row(name="spawn + commit of an empty child, 10 in flight", value=batch_us, unit="µs",
                   baseline_name="ThreadPoolExecutor submit->result", baseline=executor_us,
                   ratio=executor_us / batch_us, target="<= 1.5x executor", met=batch_us <= 1.5 * executor_us,
                   goal=1 / 1.5))


def _commit_100_writes(database, report: BenchReport, repeat: int) -> None:
    rows = [{"id": number, "a": number, "b": f"row {number}"} for number in range(100)]

    def layer() -> None:
        with database.transaction() as tx:
            for row in rows:
                tx.write("bench_rows", row["id"], a=row["a"], b=row["b"])

    import psycopg

    url = database.engine.url
    conninfo = url.render_as_string(hide_password=False).replace("postgresql+psycopg://", "postgresql://")
    raw_sql = ("INSERT INTO bench_rows (id, a, b) VALUES (%(id)s, %(a)s, %(b)s) "
               "ON CONFLICT (id) DO UPDATE SET a = EXCLUDED.a, b = EXCLUDED.b")
    with psycopg.connect(conninfo) as connection:
        def raw() -> None:
            with connection.transaction():
                with connection.cursor() as cursor:
                    cursor.executemany(raw_sql, rows)

        for function in (layer, raw):
            function()  # warm up
        layer_times, raw_times = [], []
        for _ in range(repeat):
            start = time.perf_counter(); layer(); layer_times.append(time.perf_counter() - start)
            start = time.perf_counter(); raw(); raw_times.append(time.perf_counter() - start)
    layer_rate = 100 / statistics.median(layer_times)
    raw_rate = 100 / statistics.median(raw_times)
    report.add(Row(name="top-level commit of 100 writes", value=layer_rate, unit="rows/s",
                   baseline_name="psycopg executemany, one transaction", baseline=raw_rate,
                   ratio=layer_rate / raw_rate, target=">= 60 % of raw", met=layer_rate >= 0.6 * raw_rate, goal=0.6))


def run(quick: bool = False, progress: Progress | None = None) -> BenchReport:
    progress = progress or Progress.none()
    report = BenchReport("nested transactions (activedb bench nested)")
    progress.start("bench nested", total=5)
    with connect(max_workers=32) as database:
        total_objects = 350 if quick else 1400
        repeat = 1 if quick else 41
        # Every object a hierarchy may touch is a row from the start, so every sample meets the same table:
        # otherwise a round's first configuration runs before that round's writes have created their rows
        # and fetches (prefetch, validation) a fifth fewer rows than the configurations after it.
        with database.engine.begin() as connection:
            connection.exec_driver_sql("INSERT INTO bench_objects (id, value) SELECT n, 0 FROM "
                                       f"generate_series(0, {total_objects * 4 - 1}) AS n")
        with progress.step("warm-up"):
            for seed in range(3):   # warm up: connections, statement caches, worker threads
                _hierarchy(database, 70, 3, total_objects, seed)
        with progress.step("fanout sweep (70 transactions, fanout 1-5)"):
            _sweep(database, report, "fanout sweep", [(70, fanout) for fanout in range(1, 6)], total_objects,
                   repeat, "fanout (70 transactions)", lambda config: config[1])
        with progress.step("size sweep (5-70 transactions, fanout 3)"):
            _sweep(database, report, "size sweep", [(count, 3) for count in (5, 10, 20, 30, 40, 50, 60, 70)],
                   total_objects, repeat, "transactions (fanout 3)", lambda config: config[0])
        with progress.step("spawn vs ThreadPoolExecutor"):
            _spawn_vs_executor(database, report, 200 if quick else 3000)
        with progress.step("top-level commit of 100 writes vs psycopg"):
            _commit_100_writes(database, report, 5 if quick else 50)
        report.notes.append(f"{total_objects} objects per hierarchy (prefetched by the root in one query), 20 % "
                            f"written; CPU = time.process_time() of the whole process (all threads), including "
                            f"the top-level flush; median of {repeat} interleaved samples, each after gc.collect() "
                            f"(untimed); spread = interquartile range / median")
    return report
