"""``activedb bench locks``: the lock manager (package ``lockmgr``) against simple baselines, same run.

1. Uncontended tuple locks in a 3-level tree vs a bare dict lock table (target >= 40 %); the same on 1-8
   threads (4-thread aggregate >= 50 % of one).
2. Deadlock check per new wait edge on graphs of 100-10,000 transactions vs a full ``networkx.find_cycle``
   (<= 20 us median, >= 1,000x faster).
3. Commit with inheritance, per lock (<= 2 us, linear; depth 50 <= 2x depth 1).
4. A queue of 100 and 300 writers of one row, queued behind a holder and drained, per writer (no target).

``--quick`` uses small sizes (a smoke test; noisy figures).  Details: the bench design note.
"""

from __future__ import annotations

import functools
import random
import statistics
import threading
import time
from dataclasses import dataclass, field

from activedb.progress import Progress
from benchmarks.report import BenchReport, Row, Series

_TABLE = "bench"


class _BareTable:
    """The baseline: a dict behind one mutex, no modes, no tree (what a naive lock table does)."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()  # protects _owners
        self._owners: dict = {}

    def acquire(self, owner, table, key) -> bool:
        resource = (table, key)
        with self._mutex:
            if resource in self._owners:
                return False
            self._owners[resource] = owner
            return True

    def release(self, owner, table, key) -> None:
        with self._mutex:
            del self._owners[(table, key)]

    def release_all(self, owner, resources: list) -> None:
        """The stricter baseline: one mutex round trip releases a whole transaction's locks (as an abort
        or commit does in lockmgr)."""
        owners = self._owners
        with self._mutex:
            for resource in resources:
                del owners[resource]


def _bare_pairs(table: _BareTable, owner, keys: range, rounds: int) -> None:
    acquire, release = table.acquire, table.release
    for _ in range(rounds):
        for key in keys:
            acquire(owner, _TABLE, key)
        for key in keys:
            release(owner, _TABLE, key)


def _bare_batched_pairs(table: _BareTable, owner, keys: range, rounds: int) -> None:
    acquire = table.acquire
    for _ in range(rounds):
        mine = []
        for key in keys:
            acquire(owner, _TABLE, key)
            mine.append((_TABLE, key))
        table.release_all(owner, mine)


def _tree(lm, name) -> str:
    """A top-level transaction and a child; returns the child's id (the leaves' parent)."""
    lm.begin((name, "root"))
    lm.begin((name, "child"), parent=(name, "root"))
    return (name, "child")


def _lockmgr_pairs(lm, parent, leaf, keys: range, rounds: int) -> None:
    from lockmgr import Mode

    write = Mode.WRITE
    for _ in range(rounds):
        lm.begin(leaf, parent=parent)
        acquire_tuple = lm.acquire_tuple
        for key in keys:
            acquire_tuple(leaf, _TABLE, key, write)
        lm.abort(leaf)


def _uncontended(report: BenchReport, quick: bool) -> None:
    from lockmgr import LockManager

    keys = range(1000)
    rounds = 20 if quick else 100
    repeat = 3 if quick else 7
    lm = LockManager()
    parent = _tree(lm, "solo")
    bare_times, batched_times, lock_times = [], [], []
    for _ in range(repeat):  # interleaved, best of each: the machine is shared
        bare_times.append(_seconds(_bare_pairs, _BareTable(), "leaf", keys, rounds))
        batched_times.append(_seconds(_bare_batched_pairs, _BareTable(), "leaf", keys, rounds))
        lock_times.append(_seconds(_lockmgr_pairs, lm, parent, "leaf", keys, rounds))
    pairs = len(keys) * rounds
    bare, batched, locked = pairs / min(bare_times), pairs / min(batched_times), pairs / min(lock_times)
    ratio = locked / bare
    report.add(Row(name="uncontended tuple acquire+release, leaf of a 3-level tree", value=locked, unit="pairs/s",
                   baseline_name="bare dict table, one mutex", baseline=bare, ratio=ratio,
                   target=">= 0.40 of the bare table", met=ratio >= 0.40, goal=0.40,
                   extra={"pairs_per_run": pairs, "ns_per_pair": 1e9 / locked, "bare_ns_per_pair": 1e9 / bare}))
    report.add(Row(name="same, vs a bare table that releases a transaction's keys in one batch (no target)",
                   value=locked, unit="pairs/s", baseline_name="bare table, batched release", baseline=batched,
                   ratio=locked / batched))


def _seconds(function, *args) -> float:
    start = time.perf_counter()
    function(*args)
    return time.perf_counter() - start


def _aggregate(threads: int, prepare, keys_per_round: int, rounds: int) -> float:
    """Pairs/s of ``threads`` threads together, thread ``number`` running ``prepare(number)(keys, rounds)`` on
    keys of its own once every thread is ready."""
    barrier = threading.Barrier(threads + 1)

    def body(run, keys: range) -> None:
        barrier.wait()
        run(keys, rounds)
    workers = [threading.Thread(target=body, daemon=True, args=(
        prepare(number), range(number * 1_000_000, number * 1_000_000 + keys_per_round))) for number in range(threads)]
    for worker in workers:
        worker.start()
    barrier.wait()
    start = time.perf_counter()
    for worker in workers:
        worker.join()
    return threads * keys_per_round * rounds / (time.perf_counter() - start)


def _threads(report: BenchReport, quick: bool) -> None:
    from lockmgr import LockManager

    keys_per_round = 500
    rounds = 10 if quick else 40
    repeat = 1 if quick else 5

    def lockmgr_threads(lm):
        def prepare(number):
            return functools.partial(_lockmgr_pairs, lm, _tree(lm, f"thread{number}"), ("leaf", number))
        return prepare

    def bare_threads(table):
        return lambda number: functools.partial(_bare_pairs, table, number)

    results: dict[int, float] = {}
    bare_results: dict[int, float] = {}
    for _ in range(repeat):  # interleaved, best of each: the machine is shared
        for threads in (1, 2, 4, 8):
            rate = _aggregate(threads, lockmgr_threads(LockManager()), keys_per_round, rounds)
            results[threads] = max(results.get(threads, 0.0), rate)
        for threads in (1, 4):
            rate = _aggregate(threads, bare_threads(_BareTable()), keys_per_round, rounds)
            bare_results[threads] = max(bare_results.get(threads, 0.0), rate)
    single = results[1]
    for threads, rate in results.items():
        ratio = rate / single
        row = Row(name=f"aggregate pairs/s, {threads} thread{'s' if threads > 1 else ''}, disjoint keys",
                  value=rate, unit="pairs/s", baseline_name="lockmgr, 1 thread", baseline=single, ratio=ratio)
        if threads == 4:
            row.target, row.met = ">= 0.50 of 1 thread", ratio >= 0.50
        report.add(row)
    report.add(Row(name="bare one-mutex table, 4 threads (for contrast)", value=bare_results[4], unit="pairs/s",
                   baseline_name="bare table, 1 thread", baseline=bare_results[1],
                   ratio=bare_results[4] / bare_results[1]))


@dataclass(slots=True, eq=False)
class _Node:
    """A wait-for graph node with the shape ``lockmgr.find_cycle`` walks (``lockmgr.GraphNode``)."""

    tid: int
    waits: dict = field(default_factory=dict)
    children: set = field(default_factory=set)
    external: tuple = ()


_PARENT_IN_TREE = (None, 0, 1, 1, 0, 4, 4)      # a tree's 7 members depth first: root, child, 2 grandchildren, ...


def _wait_for_graph(size: int, seed: int):
    """``size`` transactions as the lock manager's graph would hold them (trees of a root, 2 children, 4
    grandchildren: "commit" edges parent -> child) where half of the leaves wait for a random transaction
    of an earlier tree (so the graph is acyclic).  Returns (nodes by tid, networkx graph)."""
    import networkx

    rng = random.Random(seed)
    records = {number: _Node(number) for number in range(size)}
    for number, record in records.items():
        parent = _PARENT_IN_TREE[number % 7]
        if parent is not None:
            records[number - number % 7 + parent].children.add(record)
    trees = [list(range(start, min(start + 7, size))) for start in range(0, size, 7)]
    for index, members in enumerate(trees[1:], start=1):
        for member in members:
            record = records[member]
            if not record.children and rng.random() < 0.5:
                target = rng.choice(trees[rng.randrange(index)])
                record.waits = {records[target]: "held"}
    graph = networkx.DiGraph()
    for record in records.values():
        graph.add_node(record.tid)
        graph.add_edges_from((record.tid, child.tid) for child in record.children)
        graph.add_edges_from((record.tid, target.tid) for target in record.waits)
    return records, graph


def _deadlock_check(report: BenchReport, quick: bool) -> None:
    import networkx

    from lockmgr import find_cycle

    samples = 500 if quick else 5000
    for size in (100, 1000, 10_000):
        records, graph = _wait_for_graph(size, seed=size)
        nodes = list(records.values())
        rng = random.Random(size)
        timings = []
        found = 0
        clock = time.perf_counter_ns
        for _ in range(samples):
            waiter, target = rng.choice(nodes), rng.choice(nodes)
            if waiter is target:
                continue
            start = clock()
            cycle = find_cycle(waiter, [target])
            timings.append(clock() - start)
            found += cycle is not None
        ours = statistics.median(timings) / 1000
        full_scans = []
        runs = 1 if quick else (3 if size == 10_000 else 5)
        for _ in range(runs):
            waiter, target = rng.choice(nodes), rng.choice(nodes)
            graph.add_edge(waiter.tid, target.tid)  # the new wait edge
            start = time.perf_counter_ns()
            try:
                networkx.find_cycle(graph)
            except networkx.NetworkXNoCycle:
                pass
            full_scans.append(time.perf_counter_ns() - start)
            graph.remove_edge(waiter.tid, target.tid)
            if records[waiter.tid].waits.get(target) or target in records[waiter.tid].children:
                graph.add_edge(waiter.tid, target.tid)  # it was there before: put it back
        full = statistics.median(full_scans) / 1000
        speedup = full / ours
        row = Row(name=f"deadlock check per new wait edge, {size:,} transactions", value=ours, unit="us (median)",
                  baseline_name="networkx.find_cycle, full scan", baseline=full, ratio=speedup,
                  extra={"edges": graph.number_of_edges(), "samples": len(timings), "cycles_found": found,
                         "p90_us": statistics.quantiles(timings, n=10)[-1] / 1000, "full_scan_runs": runs})
        if size == 10_000:
            row.target = "<= 20 us median and >= 1000x faster"
            row.met = ours <= 20 and speedup >= 1000
        report.add(row)


def _commit_cost(report: BenchReport, quick: bool) -> None:
    from lockmgr import LockManager, Mode

    rounds = 20 if quick else 100
    per_lock = {}
    subcommit = {}
    for count in (10, 100, 1000):
        lm = LockManager()
        keys = range(count)
        inherit, release, bare = [], [], []
        for round_number in range(rounds):
            top, child = ("top", round_number), ("child", round_number)
            lm.begin(top)
            lm.begin(child, parent=top)
            for key in keys:
                lm.acquire_tuple(child, _TABLE, key, Mode.WRITE)
            start = time.perf_counter_ns()
            lm.commit(child)
            middle = time.perf_counter_ns()
            lm.commit(top)
            end = time.perf_counter_ns()
            inherit.append(middle - start)
            release.append(end - middle)
            table = _BareTable()
            for key in keys:
                table.acquire(child, _TABLE, key)
            start = time.perf_counter_ns()
            for key in keys:
                table.release(child, _TABLE, key)
            bare.append(time.perf_counter_ns() - start)
        locks = count + 1  # the tuples and the table's intention lock
        cost = (statistics.median(inherit) + statistics.median(release)) / locks / 1000
        baseline = statistics.median(bare) / count / 1000
        per_lock[count] = cost
        subcommit[count] = statistics.median(inherit) / 1000
        report.add(Row(
            name=f"commit with inheritance, {count:,} tuple locks: subtransaction commit + top-level release",
            value=cost, unit="us/lock", baseline_name="bare table release", baseline=baseline, ratio=baseline / cost,
            target="<= 2 us/lock", met=cost <= 2.0,
            extra={"median_subtransaction_commit_us": subcommit[count],
                   "median_top_level_commit_us": statistics.median(release) / 1000, "locks": locks}))
    growth = per_lock[1000] / per_lock[100]
    report.add(Row(name="commit linearity: per-lock cost at 1,000 / at 100 locks", value=growth, unit="x",
                   target="0.5 .. 2 (linear)", met=0.5 <= growth <= 2.0))
    for count in (10, 100, 1000):
        handed = subcommit[count] / (count + 1)
        row = Row(name=f"subtransaction commit alone, {count:,} tuple locks handed to the parent",
                  value=subcommit[count], unit="us (median)", baseline_name="the same with 10 locks",
                  baseline=subcommit[10], ratio=subcommit[10] / subcommit[count],
                  extra={"us_per_lock_handed_over": handed})
        if count == 1000:
            row.target, row.met = "<= 0.05 us per lock handed over", handed <= 0.05
        report.add(row)
    _chain_cost(report, rounds)


def _chain_cost(report: BenchReport, rounds: int) -> None:
    """``count`` tuple locks acquired by the leaf of a chain of ``depth`` subtransactions, then every level
    commits, bottom-up, and the top level: what the locks add to those commits, per lock (the median with
    the locks minus the median of the same chain without them)."""
    from lockmgr import LockManager, Mode

    count = 200
    per_lock = {}
    medians = {}
    for depth in (1, 10, 50):
        lm = LockManager()
        timings: dict[int, list[int]] = {count: [], 0: []}
        for round_number in range(rounds):
            for locks in (count, 0):
                chain = [("chain", round_number, locks, level) for level in range(depth + 1)]
                lm.begin(chain[0])
                for level in range(1, depth + 1):
                    lm.begin(chain[level], parent=chain[level - 1])
                for key in range(locks):
                    lm.acquire_tuple(chain[-1], _TABLE, key, Mode.WRITE)
                start = time.perf_counter_ns()
                for tid in reversed(chain):
                    lm.commit(tid)
                timings[locks].append(time.perf_counter_ns() - start)
        medians[depth] = (statistics.median(timings[count]) / 1000, statistics.median(timings[0]) / 1000)
        per_lock[depth] = max(medians[depth][0] - medians[depth][1], 0.001) / (count + 1)
    for depth, cost in per_lock.items():
        row = Row(name=f"{count} locks acquired at depth {depth}, committed level by level and released",
                  value=cost, unit="us/lock", baseline_name="the same at depth 1", baseline=per_lock[1],
                  ratio=per_lock[1] / cost,
                  extra={"median_commits_us": medians[depth][0], "median_commits_without_locks_us": medians[depth][1]})
        if depth == 50:
            row.target, row.met = "<= 2x depth 1", cost <= 2 * per_lock[1]
        report.add(row)


def _writers_of_one_row(count: int) -> tuple[float, float]:
    """``count`` top-level writers of one resource, each on its own thread, queue behind a holder and drain (each
    commits as soon as it is granted): seconds until all of them wait, and from the holder's commit until all
    have committed."""
    from lockmgr import LockManager, Mode
    from lockmgr.testing import wait_until

    lm = LockManager()
    lm.begin("holder")
    lm.acquire("holder", "row", Mode.WRITE)
    failures: list[BaseException] = []

    def writer(number: int) -> None:
        try:
            lm.begin(("writer", number))
            lm.acquire(("writer", number), "row", Mode.WRITE)
            lm.commit(("writer", number))
        except BaseException as error:  # reported below
            failures.append(error)

    threads = [threading.Thread(target=writer, args=(number,), daemon=True) for number in range(count)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    wait_until(lambda: lm.statistics().waiting == count, 600, f"{count} writers of one row waiting")
    queued = time.perf_counter()
    lm.commit("holder")
    for thread in threads:
        thread.join(600)
    drained = time.perf_counter()
    if failures or any(thread.is_alive() for thread in threads):
        raise RuntimeError(f"the queue of {count} writers did not drain: {failures[:3]!r}")
    return queued - start, drained - queued


def _queue_cost(report: BenchReport, quick: bool) -> None:
    sizes = (20, 50) if quick else (100, 300)
    per_writer = {}
    for count in sizes:
        queue_seconds, drain_seconds = _writers_of_one_row(count)
        per_writer[count] = (queue_seconds + drain_seconds) / count * 1000
        report.add(Row(name=f"a queue of writers of one row, queued and drained, {count:,} writers",
                       value=per_writer[count], unit="ms/writer", baseline_name=f"the same with {sizes[0]:,} writers",
                       baseline=per_writer[sizes[0]], ratio=per_writer[sizes[0]] / per_writer[count],
                       extra={"queue_s": queue_seconds, "drain_s": drain_seconds}))


def run(quick: bool = False, progress: Progress | None = None) -> BenchReport:
    progress = progress or Progress.none()
    report = BenchReport(title="locks" + (" (quick)" if quick else ""))
    progress.start("bench locks", total=5)
    with progress.step("uncontended tuple locks vs a bare table"):
        _uncontended(report, quick)
    with progress.step("1-8 threads on disjoint keys"):
        _threads(report, quick)
    with progress.step("deadlock check per new wait edge"):
        _deadlock_check(report, quick)
    with progress.step("commit with inheritance"):
        _commit_cost(report, quick)
    with progress.step("a queue of writers of one row"):
        _queue_cost(report, quick)
    _series(report)
    report.notes.extend([
        "pairs: acquire_tuple (IW on the table, WRITE on the tuple) by a depth-2 leaf, released by the leaf's "
        "abort (Rule 4); the bare table gets the same (table, key) calls and releases key by key (the "
        "target's baseline) or, in the informational row, all of a transaction's keys under one mutex hold",
        "threads: CPython with the GIL, so the target is that striping keeps the aggregate from collapsing, "
        "not parallel speed-up; each thread has its own tree and keys, all in one table",
        "deadlock check: lockmgr._graph.find_cycle on the manager's own transaction records (trees of 7, half "
        "the leaves waiting across trees), timed per edge; networkx.find_cycle timed without building the graph",
        "commit: medians over rounds of lm.commit(child) for a child holding N tuple locks plus the table's IW, "
        "and of the top-level commit after it; chain: median of all the commits of a chain whose leaf holds "
        "the locks",
        "queue: n top-level writers of one resource, a thread each, all started at once behind a holder, until "
        "statistics().waiting is n; then the holder commits and each writer commits as soon as it is granted; "
        "wall-clock seconds (threads included), per writer",
        "ratios are value/baseline where higher is better and baseline/value for times",
    ])
    return report


def _series(report: BenchReport) -> None:
    """The sweeps of the rows, for ``--plot``."""
    def points(prefix: str, number, field: str = "value") -> list[tuple[float, float]]:
        return [(number(row), getattr(row, field)) for row in report.rows if row.name.startswith(prefix)]

    def size(row: Row) -> int:          # the number in the name's last part ("..., 1,000 transactions")
        return int(row.name.rsplit(", ", 1)[1].split()[0].replace(",", ""))

    report.add_series(Series("threads on disjoint keys (aggregate)", "lockmgr", "threads", "pairs/s",
                             points("aggregate pairs/s, ", lambda row: int(row.name.split(", ")[1].split()[0]))))
    for label, attribute in (("lockmgr (median)", "value"), ("networkx.find_cycle (full scan)", "baseline")):
        report.add_series(Series("deadlock check per new wait edge", label, "transactions in the graph",
                                 "µs per check", points("deadlock check", size, attribute), log_x=True, log_y=True))
    report.add_series(Series("commit with inheritance", "lockmgr", "tuple locks", "µs per lock",
                             points("commit with inheritance", size), log_x=True))
