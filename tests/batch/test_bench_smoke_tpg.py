"""``activedb bench tpg`` runs on a tiny batch and reports its rows (no timing assertions)."""

from __future__ import annotations

import io
import json

from benchmarks import Progress
from benchmarks.tpg import run


def test_tpg_benchmark_smoke(database_url, monkeypatch, tmp_path):
    monkeypatch.setenv("ACTIVEDB_DATABASE_URL", database_url)     # the test's database, not the user's
    monkeypatch.setenv("ACTIVEDB_BENCH_DIR", str(tmp_path))
    monkeypatch.delenv("ACTIVEDB_BENCH_INSTRUCTIONS", raising=False)
    steps = io.StringIO()
    report = run(quick=True, size=128, progress=Progress.for_stream(steps, label="bench tpg"))
    lines = steps.getvalue().splitlines()
    assert lines[0] == "[bench tpg] 1/12 the decision model's choices against MorphStream's tree", lines
    assert lines[1] == "[bench tpg] 2/12 SL in memory: every strategy against the serial reference", lines
    assert len(lines) == 12 and lines[-1].startswith("[bench tpg] 12/12 SL sweep of batch size"), lines
    names = [row.name for row in report.rows]
    decisions = [row for row in report.rows if row.name.startswith("decision model vs MorphStream's tree: ")]
    assert len(decisions) == 13 and all(row.extra["decision_model"] and row.extra["paper_tree"] for row in decisions)
    assert "decision model = MorphStream's tree on the stated skew" in names
    for workload in ("SL", "GS", "TP"):
        assert f"{workload} in memory: serial reference" in names
        # serial, auto (lean), the decision model on the TPG, 12 fixed strategies
        assert sum(name.startswith(f"{workload} in memory: ") for name in names) == 15
        for path in ("TPG at commit (", "TPG through the tree", "per-event nested path", "plain write path"):
            assert any(name.startswith(f"{workload} end to end, C = 0 us: {path}") for name in names), path
    assert any(name.startswith("SL (8 key groups, C = 10 us) in memory: 2 processes") for name in names)
    assert any(name.startswith("SL (8 key groups) in memory: 2 processes vs 1 (ns/f/e)") for name in names)
    for row in report.rows:
        assert row.value > 0 or row in decisions       # (a measured VDD may be 0)
        if row.baseline is not None:
            assert row.ratio == row.value / row.baseline or abs(row.ratio - row.value / row.baseline) < 1e-9
    for parameter in ("theta", "abort_ratio", "batch"):
        assert (tmp_path / f"tpg-sweep-{parameter}.png").read_bytes()[:4] == b"\x89PNG"
    assert json.loads((tmp_path / "tpg-bench.json").read_text())["rows"]
