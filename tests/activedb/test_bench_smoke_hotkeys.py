"""``activedb bench hotkeys`` runs in quick mode, in one process and in several, and with pairs of counters that
deadlock, and reports its figures — each run has checked that the counters' final sum equals the increments it
counted (no lost update); no timing assertions."""

from __future__ import annotations

from benchmarks import BenchReport
from benchmarks.hotkeys import PROCESSES, run


def test_hotkeys_benchmark_quick(database_url, monkeypatch):
    monkeypatch.setenv("ACTIVEDB_DATABASE_URL", database_url)     # the test's database, not the user's
    report = run(quick=True)          # raises AssertionError if a run lost an update
    assert isinstance(report, BenchReport)
    assert [row.name.split(": ")[1] for row in report.rows] == [
        f"activedb {mode} vs psycopg FOR UPDATE" for mode in ("update-lock", "plain-read") * 2 + ("update-lock",)]
    where = [row.name.split(": ")[0].split(", ")[1:] for row in report.rows]
    assert where == [["one process"]] * 2 + [[f"{PROCESSES} processes"]] * 2 + [
        [f"{PROCESSES} processes", "pairs in a random order"]]
    for row in report.rows:
        assert row.value > 0 and row.baseline > 0 and row.ratio == row.value / row.baseline
        assert row.extra["commits"] > 0 and row.extra["failures"] == 0, row.extra
        assert row.extra["reruns"] >= 0
        if "update-lock" in row.name and "pairs" not in row.name:
            assert row.extra["reruns"] == 0, row.extra          # the update lock queues: nothing re-runs
    assert any("counters' final sum equals the commits" in note for note in report.notes)
    phases = report.rows[0].extra["phases_cpu_us_per_commit"]       # where an update-lock commit's CPU goes
    assert phases["activedb cpu per commit"] > 0 and phases["psycopg cpu per commit"] > 0
    assert phases["read for update: SQL (BEGIN + SELECT … FOR UPDATE)"] > 0
    assert phases["flush: write set + log row + COMMIT (SQL)"] > 0
    assert 0 < phases["psycopg share"] < 1
    assert any("CPU µs per commit by phase" in note for note in report.notes)
