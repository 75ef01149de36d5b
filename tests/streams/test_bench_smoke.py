"""``activedb bench streams`` runs in quick mode and reports its figures (no timing assertions)."""

from __future__ import annotations

from activedb.bench import BenchReport
from activedb.bench.streams import run


def test_streams_benchmark_quick(database_url, monkeypatch):
    monkeypatch.setenv("ACTIVEDB_DATABASE_URL", database_url)     # the test's database, not the user's
    report = run(quick=True)
    assert isinstance(report, BenchReport)
    assert [row.name for row in report.rows] == ["SEI, 1,000 events", "SEI L_combined, 1,000 events"]
    sei = report.rows[0]
    assert sei.unit == "events/s" and sei.value > 0 and sei.baseline > 0
    assert sei.extra["processed"] == 1000 and sei.extra["late"] == 0
    assert sei.extra["outputs"] > 0 and sei.extra["rule_instances"] == sei.extra["outputs"]
    assert sei.extra["L_combined_ms"] == report.rows[1].value
    assert set(sei.extra["us_per_event"]) >= {"buffer", "match", "reads", "rules", "commit", "state",
                                              "top_level_commit"}
