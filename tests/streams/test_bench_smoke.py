"""``activedb bench streams`` runs in quick mode and reports its figures (no timing assertions)."""

from __future__ import annotations

import json

from activedb.bench import BenchReport
from activedb.bench.streams import run


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
    assert len(checked) == 1 + 2 * 2 * 3 + 4 + 3, [row.name for row in checked]
    promised = [row for row in checked if row.target]
    assert len(promised) == len(checked) - 1          # the no-scheduler baseline promises nothing
    assert all(row.value == 0 and row.met for row in promised), [(row.name, row.extra) for row in promised]
    assert all(point["violations"] == 0 for name in ("sei", "s2pl", "lwm")
               for point in experiments["throughput_vs_readN"]["tuple"][name])
    assert sei.extra["definition_6"]["reads"] > 0 and sei.extra["definition_6"]["violations"] == 0
