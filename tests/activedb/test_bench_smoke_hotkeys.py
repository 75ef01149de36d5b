"""``activedb bench hotkeys`` runs in quick mode, in one process and in several, and with pairs of counters that
deadlock, and reports its figures — each run has checked that the counters' final sum equals the increments it
counted (no lost update); no timing assertions."""

from __future__ import annotations

import sqlalchemy as sa

from benchmarks import BenchReport
from benchmarks.hotkeys import PROCESSES, run


def _detect_deadlocks_soon(database_url: str) -> None:
    """The database's sessions look for a deadlock after 50 ms of waiting instead of PostgreSQL's default second
    (``deadlock_timeout``): the pairs' cycles through two processes' backends each waited that second, most of a quick
    run's time.  The detector finds the same cycles, and only real ones, whenever it looks.  A role that may not set
    it (neither a superuser nor granted SET) leaves the default."""
    engine = sa.create_engine(database_url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as connection:
            name = connection.exec_driver_sql("SELECT current_database()").scalar_one()
            try:
                connection.exec_driver_sql(f"ALTER DATABASE \"{name}\" SET deadlock_timeout = '50ms'")
            except sa.exc.ProgrammingError as error:
                assert getattr(error.orig, "sqlstate", None) == "42501", error       # (insufficient privilege)
    finally:
        engine.dispose()


def test_hotkeys_benchmark_quick(database_url, monkeypatch):
    monkeypatch.setenv("ACTIVEDB_DATABASE_URL", database_url)     # the test's database, not the user's
    _detect_deadlocks_soon(database_url)
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
