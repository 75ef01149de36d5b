"""``activedb bench capture`` runs in quick mode and reports its figures (no timing assertions)."""

from __future__ import annotations

import io

from benchmarks import BenchReport, Progress
from benchmarks.capture import run


def test_capture_benchmark_quick(database_url, monkeypatch):
    monkeypatch.setenv("ACTIVEDB_DATABASE_URL", database_url)     # the test's database, not the user's
    steps = io.StringIO()
    report = run(quick=True, progress=Progress.for_stream(steps, label="bench capture"))
    assert isinstance(report, BenchReport)
    lines = steps.getvalue().splitlines()
    assert len(lines) == 7 and lines[-1] == "[bench capture] 7/7 activedb as the writer of a captured table", lines
    rows = {row.name: row for row in report.rows}
    single = rows["writer: single-row insert, captured table"]
    assert single.value > 0 and single.baseline > 0 and single.met is not None
    end_to_end = rows["end to end: executemany of 1,000 rows -> rule effects committed"]
    assert end_to_end.extra["changes"] == 1000 and end_to_end.value > 0
    assert rows["activedb writer: db.run(insert) into the captured table"].extra["own_changes_delivered"] == 0
    assert not any("latency sample" in note for note in report.notes)
    assert len(report.to_json()["rows"]) == 8
    untrusted = rows["capture row trigger: server time per row, untrusted writer"]    # the embedded superuser
    assert untrusted.value > 0 and untrusted.baseline > 0                                 # may create the role
    assert rows["4 writers: single-row inserts, captured table"].value > 0
