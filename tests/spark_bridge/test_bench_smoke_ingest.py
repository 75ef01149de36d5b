"""``activedb bench ingest`` runs in quick mode and reports its figures (no timing assertions)."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from benchmarks import BenchReport
from benchmarks._profile import server_cpu_seconds
from benchmarks.ingest import SPLIT_BATCHES, _paired_ratio, _pairing, run

pytestmark = [pytest.mark.spark, pytest.mark.slow]


@pytest.mark.timeout(900)      # (quick mode is about a minute on an idle machine; Spark under load is slow)
def test_ingest_benchmark_quick(spark, database_url, monkeypatch):
    monkeypatch.setenv("ACTIVEDB_DATABASE_URL", database_url)     # the test's database, not the user's
    # Two rounds of the scale-out row (one in quick mode): the second, its own, runs one task and two anew.
    monkeypatch.setattr("benchmarks.ingest.QUICK_SCALE_OUT_ROUNDS", 2)
    report = run(quick=True)
    assert isinstance(report, BenchReport)
    names = [row.name for row in report.rows]
    counter_peers = ["PL/pgSQL counter trigger (COPY)", "psycopg executemany ON CONFLICT"]
    labels = ("threads", "inline", "declared rule, lowered", "inline, scale-out 2 partitions")
    one_rule = [name for label in labels for name in (
        f"1,000 events/batch: one immediate rule per event ({label})",
        *(f"1,000 events/batch: one-rule counter upsert ({label}) vs the {name}" for name in counter_peers),
        *(["1,000 events/batch: engine cost per event, one immediate rule (inline)"] if label == "inline" else []))]
    assert names == [
        "1,000 events/batch: plain write (COPY, no rules)",
        "1,000 events/batch: PL/pgSQL row triggers (COPY, the peer)",
        "1,000 events/batch: hand-hygiene rules vs the PL/pgSQL peer",
        "1,000 events/batch: hand-hygiene as declared rules vs the PL/pgSQL peer",
        "1,000 events/batch: hand-hygiene rules vs plain write",
        "1,000 events/batch: hand-hygiene rules vs the goal",
        "1,000 events/batch: hand-hygiene end to end, detached effects included",
        "1,000 events/batch: hand-hygiene rules, scale-out 2 partitions vs one task",
        *(f"1,000 events/batch: {name}, the one-rule peer" for name in counter_peers),
        *one_rule,
        "1,000 events/batch: one immediate rule (inline), time per event by phase, without Spark",
        "1,000 events/batch: hand-hygiene as declared rules, time per event by phase, without Spark",
        "1,000 events/batch: hand-hygiene ECA rules, where the time goes: the sink's Python vs PostgreSQL's server "
        "time per event, without Spark",
    ]
    rows = {row.name: row for row in report.rows}
    # The ECA application on the scale-out path (two tasks): its tables are the peer's, its rate against one task's.
    scaled_out = rows["1,000 events/batch: hand-hygiene rules, scale-out 2 partitions vs one task"]
    assert scaled_out.extra["same_result_as_the_peer"] is True and scaled_out.value > 0
    assert scaled_out.met is None                                                                   # (a goal at 100k)
    # Paired as the peer rows are: each round's one-task and scale-out runs adjacent, the ratio the median of the
    # rounds' own ratios; each measured batch's rows split between the two partitions (the ledger's row counts).
    paired = scaled_out.extra
    assert paired["rounds"] == 2 and len(paired["ratio_per_round"]) == 2
    assert scaled_out.ratio == pytest.approx(sum(paired["ratio_per_round"]) / 2, abs=1e-3)
    assert paired["ratio_of_medians"] == round(scaled_out.value / scaled_out.baseline, 3)
    assert [len(steal) for steal in paired["steal_per_round"].values()] == [2, 2]
    per_partition = paired["rows_per_partition_per_round"]
    assert len(per_partition) == 2 and all(len(rows) == 2 and sum(rows) == 2_000 and min(rows) > 0
                                           for rows in per_partition)
    # Where an ECA event's time goes: CPU per event of the sink's thread, the other threads and the local server,
    # the rules' and the peer's on the same events (the same tables), the Python against the server's.
    eca = report.rows[-1]
    assert eca.unit == "µs/event" and eca.value == eca.extra["python_cpu_us"] > 0
    assert eca.extra["same_result_as_the_peer"] is True and eca.extra["measured_events"] == (SPLIT_BATCHES - 1) * 1_000
    engine = sa.create_engine(database_url)
    try:
        local_server = server_cpu_seconds(engine) is not None
    finally:
        engine.dispose()
    if not local_server:              # (ACTIVEDB_TEST_SERVER on another machine: no /proc to read)
        assert eca.ratio is None and eca.met is None and eca.extra["peer_server_cpu_us"] is None
    else:
        assert eca.baseline == eca.extra["rules_server_cpu_us"] > 0 and eca.extra["peer_server_cpu_us"] > 0
        assert eca.ratio == round(eca.value / eca.baseline, 2) and eca.met == (eca.ratio <= 3.0)
    plain, peer, versus_peer, declared_app, versus_plain, versus_goal, end_to_end = report.rows[:7]
    trigger, executemany = (rows[f"1,000 events/batch: {name}, the one-rule peer"] for name in counter_peers)
    threads, inline, declared, scale_out = (rows[f"1,000 events/batch: one immediate rule per event ({label})"]
                                            for label in labels)
    engine_cost = rows["1,000 events/batch: engine cost per event, one immediate rule (inline)"]
    minimal = [threads, inline, declared, scale_out]
    # The declared rule's batches ran lowered (one batch of state transactions at commit), and so did the plain
    # rule's (its action only reads and writes its event's row: activedb/batch/README.md, "Plain rules lowered");
    # the scale-out row's batches ran in the tasks' own handlers, not the sink's (its flag says nothing).
    assert [row.extra["lowered"] for row in minimal] == [True, True, True, False]
    # The one-rule counter upsert: its two peers and every rule run leave the same counters.
    assert trigger.value > 0 and executemany.value > 0
    assert all(row.extra["same_counters_as_the_trigger"] is True for row in [trigger, executemany, *minimal])
    for label, row in zip(labels, minimal):
        for peer_row, peer_name in zip((trigger, executemany), counter_peers):
            versus = rows[f"1,000 events/batch: one-rule counter upsert ({label}) vs the {peer_name}"]
            assert versus.baseline == peer_row.value and versus.ratio == row.value / peer_row.value
            assert versus.met == (versus.ratio >= 1.0)
    # The engine's own time per event of the inline run, against the core redesign's goal.
    assert engine_cost.unit == "µs/event" and engine_cost.value == pytest.approx(inline.extra["engine_us_per_event"],
                                                                                abs=0.1)
    assert engine_cost.met == (engine_cost.value <= 40)
    assert plain.unit == "events/s" and plain.value > 0
    # The PL/pgSQL peer applies the same logic: the same tables as the rules (generated ids aside).
    assert peer.value > 0 and peer.extra["same_result_as_activedb"] is True
    assert versus_peer.baseline == peer.value and versus_peer.ratio == versus_peer.value / peer.value
    # The declared version of the application: lowered, and the same tables as the peer.
    assert declared_app.extra["lowered"] is True and declared_app.extra["same_result_as_the_peer"] is True
    assert declared_app.baseline == peer.value and declared_app.ratio == declared_app.value / peer.value
    # (One round in quick mode: the paired median is the ratio of the two rates; with rounds, it pairs them.)
    assert declared_app.extra["ratio_of_medians"] == round(declared_app.value / peer.value, 3)
    assert _paired_ratio([10.0, 20.0, 30.0], [5.0, 40.0, 20.0]) == 1.5     # rounds 2, 0.5, 1.5 (medians: 20 / 20)
    assert _pairing([10.0, 20.0, 30.0], [5.0, 40.0, 20.0]) == {"rounds": 3, "ratio_per_round": [2.0, 0.5, 1.5],
                                                               "ratio_of_medians": 1.0}
    assert declared_app.extra["applied"] + declared_app.extra["dead_letters"] == 2_000
    assert versus_plain.baseline == plain.value and versus_plain.ratio == versus_plain.value / plain.value
    assert versus_goal.target == ">= 5,000 events/s" and versus_goal.met == (versus_goal.value >= 5_000)
    outbox = end_to_end.extra["outbox"]
    assert outbox["detached_executed"] > 0 and outbox["failed"] == outbox["pending"] == 0
    extra = versus_plain.extra
    assert extra["measured_batches"] == 2 and extra["applied"] + extra["dead_letters"] == 2_000
    for phase in ("spark", "to_arrow", "validate", "engine", "commit", "flush"):
        assert extra[f"{phase}_us_per_event"] >= 0
    assert all(row.value > 0 and row.baseline == plain.value for row in minimal)
    # Where an event's time goes (profiled, scaled to an unprofiled batch): every phase, Python vs PostgreSQL.
    split = rows["1,000 events/batch: one immediate rule (inline), time per event by phase, without Spark"]
    assert split.unit == "µs/event" and split.value > 0
    phases = split.extra["phases_us_per_event"]
    assert {"validate", "match", "lock", "read", "write", "child create", "child commit", "flush",
            "dispatch and firing record"} <= set(phases)
    assert sum(phases.values()) == pytest.approx(split.value, rel=0.05)
    assert split.extra["postgresql_share"] + split.extra["python_share"] == pytest.approx(1.0)
    declared_split = rows["1,000 events/batch: hand-hygiene as declared rules, time per event by phase, without Spark"]
    assert declared_split.unit == "µs/event" and declared_split.value > 0
    declared_phases = declared_split.extra["phases_us_per_event"]
    assert set(declared_phases) == {"validate", "lower and enlist", "lock and read (FOR UPDATE)",
                                    "declare and execute (Python)", "write (UPDATE, INSERTs)",
                                    "rest of the flush (ledger, lineage, COMMIT)"}
    assert all(value >= 0 for value in declared_phases.values()) and declared_phases["declare and execute (Python)"] > 0
    assert sum(declared_phases.values()) <= declared_split.value * 1.05
    assert declared_split.extra["postgresql_share"] + declared_split.extra["python_share"] == pytest.approx(1.0)
    assert report.to_json()["notes"]
    assert spark.sparkContext._jsc is not None   # the caller's session was left running
