"""``activedb bench streams`` runs in quick mode and reports its figures (no timing assertions)."""

from __future__ import annotations

import json

from activedb import streams
from benchmarks import BenchReport
from benchmarks._streams_model import ModelTransaction, model_throughput
from benchmarks.streams import model_operations, run


def test_cost_model_critical_paths_at_table_locks():
    """The model's critical path per scheduler, by hand: readN = 2, an E does 2 operations, a W 3."""
    events = [streams.StreamEvent(kind, float(index), {}) for index, kind in enumerate("EEWEWE")]
    # SEI: all 14 in a row; S2PL: EE together (2), W (3), E (2), W (3), E (2); LWM: W, W chained, the last E after.
    assert model_operations(events, 2, batch=6) == {"sei": 14, "s2pl": 12, "lwm": 8}
    # Two batches EEW | EWE: S2PL 2 + 3 | 2 + 3 + 2; LWM 3 | 3 + 2.
    assert model_operations(events, 2, batch=3) == {"sei": 14, "s2pl": 12, "lwm": 8}
    # One s-transaction at a time: S2PL's EE run costs two rounds.
    assert model_operations(events, 2, batch=6, threads=1)["s2pl"] == 14
    # No writer in a batch: every reader at once.
    assert model_operations(events[:2], 2, batch=6) == {"sei": 4, "s2pl": 2, "lwm": 2}
    # At most `threads` s-transactions at once: 14 operations need 7 rounds of 2.
    assert model_operations(events, 2, batch=6, threads=2) == {"sei": 14, "s2pl": 12, "lwm": 8}
    assert model_operations(events[:2], 2, batch=6, threads=1) == {"sei": 4, "s2pl": 4, "lwm": 4}


def test_cost_model_per_event_reads_and_tuple_locks():
    """Each event's own Reads (``reads``), and at tuple locks each HCW's path on its own."""
    def event(kind: str, index: int, hcw: str, reads: int) -> streams.StreamEvent:
        return streams.StreamEvent(kind, float(index), {"HCW-ID": hcw, "reads": reads})
    events = [event("E", 0, "a", 3), event("W", 1, "a", 1), event("E", 2, "b", 4), event("W", 3, "b", 1),
              event("E", 4, "a", 2)]
    # SEI 3 + 2 + 4 + 2 + 2; S2PL: E(3), W(2), E(4), W(2), E(2); LWM: W, W chained (4), the last E after (6),
    # the second E after the first W (2 + 4).
    assert model_operations(events, 9, batch=5) == {"sei": 13, "s2pl": 13, "lwm": 6}
    # Per HCW: a: E(3) W(2) E(2) under S2PL = 7, LWM: 2 + 2 = 4; b: E(4) W(2) = 6, LWM 2 and 4 -> 4.
    assert model_operations(events, 9, batch=5, granularity="tuple") == {"sei": 13, "s2pl": 7, "lwm": 4}


def test_lock_rule_model_with_a_window():
    """One key: a reader, a writer (its Read and Write), a reader.  S2PL: the writer's request waits for the
    first reader's end, the second reader for the writer's end (4 units); LWM: only the second reader waits, for
    the writer's release (3).  A writer with two more Reads that writes first and releases after its Write lets
    the second reader go at 2 (4 units in all) — without the early release it would wait for them (5)."""
    reader, writer = ModelTransaction([("r", "a")]), ModelTransaction([("r", "a"), ("w", "a")])
    assert model_throughput([reader, writer, reader], "s2pl", window=3) == 3 / 4
    assert model_throughput([reader, writer, reader], "lwm", window=3) == 3 / 3
    reads_after = [("r", "a"), ("w", "a"), ("r", "a"), ("r", "a")]
    assert model_throughput([reader, ModelTransaction(reads_after, release=2), reader], "lwm", window=3) == 3 / 4
    assert model_throughput([reader, ModelTransaction(reads_after), reader], "lwm", window=3) == 3 / 5
    assert model_throughput([reader, writer, reader], "lwm", window=1) == 3 / 4      # one at a time


def test_streams_benchmark_quick(database_url, monkeypatch, tmp_path):
    monkeypatch.setenv("ACTIVEDB_DATABASE_URL", database_url)     # the test's database, not the user's
    monkeypatch.setenv("ACTIVEDB_BENCH_DIR", str(tmp_path))        # the JSON and the plot go here
    report = run(quick=True)
    assert isinstance(report, BenchReport)
    names = [row.name for row in report.rows]
    assert names[:2] == ["SEI, 1,000 events", "SEI L_combined, 1,000 events"]
    sei = report.rows[0]
    assert sei.unit == "events/s" and sei.value > 0 and sei.baseline > 0
    assert sei.extra["processed"] == 1000 and sei.extra["late"] == 0
    assert sei.extra["outputs"] > 0 and sei.extra["rule_instances"] == sei.extra["outputs"]
    assert sei.extra["L_combined_ms"] == report.rows[1].value
    assert set(sei.extra["us_per_event"]) >= {"buffer", "match", "reads", "rules", "commit", "state",
                                              "top_level_commit"}
    # Part 2: the goals as rows with their targets (met or not: no timing assertion); the paper's figure beside
    targets = {row.name: row for row in report.rows if row.target and row.unit == "x"}
    assert {"LWM / S2PL throughput, table locks, mean over readN", "LWM / SEI throughput, table locks, mean over "
            "readN", "S2PL / LWM L_combined at 2,000 events/s"} <= set(targets)
    assert all("the paper" in row.target for row in targets.values())
    assert all(row.value > 0 and row.met in (True, False) for row in targets.values())
    # Beside each measured ratio the cost model's, per readN; each scheduler's share of its model.
    ratio = targets["LWM / S2PL throughput, table locks, mean over readN"]
    assert len(ratio.extra["cost_model_per_readN"]) == len(ratio.extra["measured_per_readN"]) == 2
    # ... and printed: each point's measured ratio beside its model, at table and at tuple locks.
    assert any(note.startswith("Per readN, table locks, measured (cost model): LWM/S2PL 1: ") for note in report.notes)
    assert any(note.startswith("Per readN, tuple locks, LWM over S2PL in % measured (cost model per HCW")
               for note in report.notes)
    shares = {row.name.split()[0]: row for row in report.rows if row.unit == "of model"}
    assert set(shares) == {"SEI", "S2PL", "LWM"}
    for row in shares.values():
        assert all(share > 0 for share in row.extra["share_of_model"])
        assert all(slept is not None for slept in row.extra["sleep_ms_mean"])     # every sleep measured
    chain = shares["LWM"].extra["writer_chain_ms"]      # LWM's writers' chain, timed link by link
    # A writer's s-transaction is the writer pair alone, a Read and a Write, at every readN.
    assert all(links > 0 for links in chain["links"]) and chain["operations"] == [2.0, 2.0]
    tuple_order = next(row for row in report.rows if row.name == "readN points where LWM >= S2PL, tuple locks")
    assert len(tuple_order.extra["spread_of_repetitions_percent"]) == 2
    latency = targets["S2PL / LWM L_combined at 2,000 events/s"]
    assert all(value > 0 for value in latency.extra["capacity_events_per_s_at_2000"].values())
    saved = json.loads((tmp_path / "streams.json").read_text())
    experiments = saved["experiments"]
    for figure in ("throughput_vs_readN", "throughput_vs_writeN", "latency_vs_seqL", "latency_vs_rate"):
        assert figure in experiments
    for name in ("sei", "s2pl", "lwm"):
        points = experiments["throughput_vs_readN"]["table"][name]
        assert len(points) == len(experiments["throughput_vs_readN"]["readN"])
        assert all(point["throughput"] > 0 and point["reads_per_event"] > 0 for point in points)
    assert experiments["latency_vs_rate"]["lwm"][0]["memory_kib"] > 0
    assert (tmp_path / "streams.png").stat().st_size > 10_000
    # Every run's history is checked against Definition 6: one row per experiment and scheduler,
    # per point, and no violation under any scheduler.
    checked = [row for row in report.rows if row.name.startswith("Definition 6 violations")]
    assert len(checked) == 1 + 2 * 2 * 3 + 4 + 3 + 1, [row.name for row in checked]     # (+ the independent mix)
    promised = [row for row in checked if row.target]
    assert len(promised) == len(checked) - 1          # the no-scheduler baseline promises nothing
    assert all(row.value == 0 and row.met for row in promised), [(row.name, row.extra) for row in promised]
    assert all(point["violations"] == 0 for name in ("sei", "s2pl", "lwm")
               for point in experiments["throughput_vs_readN"]["tuple"][name])
    assert sei.extra["definition_6"]["reads"] > 0 and sei.extra["definition_6"]["violations"] == 0
    # Part 3: the independent mix, its centre point in quick mode, each figure with the lock-rule model beside.
    mix = [row for row in report.rows if row.name.startswith("independent mix")]
    centre = "independent mix, keys 4, workers 16, sleep 1 ms: "
    assert [row.name[len(centre):] if row.name.startswith(centre) else row.name for row in mix] == [
        "readN points with LWM >= S2PL, tuple locks", "LWM keeps of its readN 1 throughput at readN 6",
        "L_combined at 2,000 events/s, LWM", "independent mix: sweep points where LWM >= S2PL at every readN, "
        "flatter, and L_combined <= S2PL at 2,000 events/s"]
    assert all(row.met in (True, False) for row in mix) and mix[0].extra["model_lwm_over_s2pl"][0] > 1
    assert experiments["independent_mix"]["points"][0]["lwm"][0]["early_releases"] > 0


def test_the_postgres_cost_keeps_one_connection_per_calling_thread_and_closes_them(db):
    """The sweep's ``postgres`` cost: each thread that operates opens one connection of its own and keeps it for
    its next operations (``pg_sleep`` round trips); ``close`` closes them all."""
    import threading

    from benchmarks._streams_sweep import Point, cost_of

    cost = cost_of(db, Point(4, 16, "postgres", 1.0))
    barrier = threading.Barrier(2)

    def operate() -> None:
        barrier.wait(timeout=60)
        for _ in range(3):
            cost("r")

    threads = [threading.Thread(target=operate) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads)
    connections = cost.connections
    assert len(connections) == 2 and all(not connection.closed for connection in connections)
    cost.close()
    assert all(connection.closed for connection in connections)
