"""Smoke test of ``activedb bench locks`` in quick mode: it runs and reports every figure (no timing checks)."""

from __future__ import annotations


def test_locks_benchmark_reports_every_figure():
    from benchmarks.locks import run

    report = run(quick=True)
    names = [row.name for row in report.rows]
    expected_prefixes = [
        "uncontended tuple acquire+release",
        "aggregate pairs/s, 1 thread",
        "aggregate pairs/s, 2 threads",
        "aggregate pairs/s, 4 threads",
        "aggregate pairs/s, 8 threads",
        "deadlock check per new wait edge, 100 transactions",
        "deadlock check per new wait edge, 1,000 transactions",
        "deadlock check per new wait edge, 10,000 transactions",
        "commit with inheritance, 10 tuple locks",
        "commit with inheritance, 100 tuple locks",
        "commit with inheritance, 1,000 tuple locks",
        "commit linearity",
        "subtransaction commit alone, 10 tuple locks",
        "subtransaction commit alone, 1,000 tuple locks",
        "200 locks acquired at depth 1,",
        "200 locks acquired at depth 50,",
        "a queue of writers of one row, queued and drained, 20 writers",
        "a queue of writers of one row, queued and drained, 50 writers",
    ]
    for prefix in expected_prefixes:
        assert any(name.startswith(prefix) for name in names), prefix
    for row in report.rows:
        assert row.value > 0
        if row.target is not None:
            assert row.met in (True, False)
        if row.baseline is not None:
            assert row.baseline > 0 and row.ratio is not None
    document = report.to_json()
    assert document["benchmark"].startswith("locks") and len(document["rows"]) == len(report.rows)
