"""``activedb bench rules`` runs in quick mode and reports its figures (no timing assertions)."""

from __future__ import annotations

from activedb.bench import BenchReport
from activedb.bench.rules import run


def test_rules_benchmark_quick(database_url, monkeypatch):
    monkeypatch.setenv("ACTIVEDB_DATABASE_URL", database_url)     # the test's database, not the user's
    report = run(quick=True)
    assert isinstance(report, BenchReport)
    names = [row.name for row in report.rows]
    assert names == ["immediate rules, inline", "deferred rules, inline",
                     "immediate rules, threads", "deferred rules, threads"]
    for row in report.rows:
        assert row.unit == "firings/s" and row.value > 0 and row.baseline > 0
        assert row.ratio == row.value / row.baseline
        assert row.extra["firings_per_transaction"] == 200
    document = report.to_json()
    assert len(document["rows"]) == 4 and document["notes"]
    assert not any("check the rule log" in note for note in report.notes)   # every firing executed
