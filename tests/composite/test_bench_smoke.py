"""The composite benchmark's pieces run (tiny sizes; figures are the benchmark's business, not a test's)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from benchmarks import composite as bench


def test_benchmark_pieces_produce_composites_on_both_time_models():
    arrivals = bench.workload(3, 0.010, 200, 0.010, seed=1, delay=0.002)
    names = ["P0", "P1", "P2"]
    _, _, interval = bench.throughput("SEQ", 3, [entry[1] for entry in arrivals], names)
    _, _, point = bench.throughput("SEQ", 3, [entry[2] for entry in arrivals], names)
    assert point.composites > 0 and point.uncertainties == 0
    assert interval.composites > 0 and interval.uncertainties > 0
    latencies = bench.latency("AND", 3, arrivals, use_point=False)
    assert latencies and min(latencies) >= 0


def test_the_quick_cli_run_shows_progress_says_it_is_quick_and_writes_nothing_into_the_current_directory(
        database_url, tmp_path, monkeypatch):
    from click.testing import CliRunner

    from activedb.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("ACTIVEDB_BENCH_DIR", raising=False)
    before = {name: os.environ.get(name) for name in ("ACTIVEDB_DATABASE_URL", "ACTIVEDB_HOME")}
    result = CliRunner().invoke(main, ["--url", database_url, "bench", "composite", "--quick"],
                                env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    # The command hands --url to the benchmark through the environment, for its run only: run in-process it
    # leaves the environment as it found it (later tests in this process would connect to this database).
    assert {name: os.environ.get(name) for name in before} == before
    assert "[bench composite] 6/6 latency to stability of SEQ" in result.output      # progress (stderr)
    assert "its figures are not meant to meet the targets" in " ".join(result.output.split())
    assert list(tmp_path.iterdir()) == [], "files go to a folder the notes name, not the current directory"
    plot = next(line for line in result.output.splitlines() if line.startswith("- plot: ")).split(": ", 1)[1]
    assert plot.endswith("activedb-bench-composite.png") and not plot.startswith(str(tmp_path))
    shutil.rmtree(Path(plot).parent)       # the new temporary folder the notes name: the test's own, not left behind
