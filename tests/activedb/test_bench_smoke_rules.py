"""``activedb bench rules`` runs in quick mode and reports its figures (no timing assertions)."""

from __future__ import annotations

import sqlalchemy as sa

from benchmarks import BenchReport
from benchmarks._profile import server_cpu_seconds
from benchmarks.rules import run


def test_rules_benchmark_quick(database_url, monkeypatch):
    monkeypatch.setenv("ACTIVEDB_DATABASE_URL", database_url)     # the test's database, not the user's
    report = run(quick=True)
    engine = sa.create_engine(database_url)
    try:
        local_server = server_cpu_seconds(engine) is not None
    finally:
        engine.dispose()
    assert isinstance(report, BenchReport)
    names = [row.name for row in report.rows]
    firing_rows = ["immediate rules, inline", "deferred rules, inline", "immediate rules, threads",
                   "deferred rules, threads"]
    counter_rows = [f"{path}, {size}/batch vs {peer}"
                    for path in ("counter upsert rule, inline", "counter upsert rule, its batch lowered",
                                 "counter upsert as a declared rule, lowered")
                    for size in ("1,000", "10,000") for peer in ("trigger", "executemany")]
    ceiling_rows = [f"counter as one set-based upsert (the ceiling), {size}/batch vs trigger"
                    for size in ("1,000", "10,000")]
    assert sorted(names) == sorted(firing_rows + counter_rows + ceiling_rows)
    for row in report.rows:
        assert row.value > 0 and row.baseline > 0
        assert row.ratio == row.value / row.baseline
        if row.name in firing_rows:
            assert row.unit == "firings/s" and row.extra["firings_per_transaction"] == 200
            assert len(row.extra["ratio_per_pair"]) == row.extra["repeat"]      # one ratio per alternation
            assert all(ratio > 0 for ratio in row.extra["ratio_per_pair"])
        else:
            assert row.unit == "events/s" and row.extra["events"] == 10_000
            if row.name in ceiling_rows:        # a bound, not a path of the product: no target
                assert row.target is None and row.met is None
            else:
                assert row.target == ">= 1.0 of the peer" and row.met == (row.ratio >= 1.0)     # at 1k and at 10k
            # CPU per event of the path and of its peer: the client's, the (local) server's, their sum.
            mine, peer = row.extra["cpu_us_per_event"], row.extra["peer_cpu_us_per_event"]
            assert mine["client"] > 0
            if not local_server:            # (ACTIVEDB_TEST_SERVER on another machine: no /proc to read)
                assert mine["server"] is None and row.extra["cpu_ratio"] is None
                continue
            assert peer["server"] > 0 and mine["total"] == round(mine["client"] + mine["server"], 2)
            assert row.extra["cpu_ratio"] == round(peer["total"] / mine["total"], 3)
    phases = next(row for row in report.rows if row.name == "immediate rules, inline").extra["phases_us_per_event"]
    for phase in ("match", "condition", "child create", "lock", "write", "child commit", "firing record", "flush",
                  "postgresql share", "python share"):
        assert phases[phase] >= 0, phases
    document = report.to_json()
    assert len(document["rows"]) == 18 and document["notes"]
    assert not any("check the rule log" in note for note in report.notes)   # every firing executed
    assert not any("different counters" in note for note in report.notes)  # the six paths agree
