"""``python -m benchmarks.instructions``: the run it counts under valgrind does its batches against a real database,
and the count is read from callgrind's output (no valgrind here: a run under it takes minutes)."""

from __future__ import annotations

import shutil

import pytest
import sqlalchemy as sa

from benchmarks import instructions


def test_the_measured_run_applies_its_batches_and_cleans_up(database_url, monkeypatch):
    monkeypatch.setenv("ACTIVEDB_DATABASE_URL", database_url)     # the test's database, not the user's
    instructions._run("eca", 50, 2, "run")
    engine = sa.create_engine(database_url)
    try:
        with engine.connect() as connection:
            logged = connection.execute(sa.text(
                "SELECT count(*), sum(events + dead_letters) FROM activedb_ingestion_ledger "
                "WHERE query_id LIKE 'bench-instructions-eca-%'")).one()
            workers = connection.execute(sa.text("SELECT count(*) FROM worker_status")).scalar()
            batches = connection.execute(sa.text(
                "SELECT count(*) FROM activedb_transaction_log WHERE info ? 'rule_firings'")).scalar()
    finally:
        engine.dispose()
    assert logged == (0, None) and workers == 0        # its ledger rows and the application's rows are gone
    assert batches >= 3                                 # the warm-up and the two measured batches committed


def test_the_rules_workloads_run_their_batches(database_url, monkeypatch):
    monkeypatch.setenv("ACTIVEDB_DATABASE_URL", database_url)
    instructions._run("direct", 40, 2, "setup")           # (the database migrated: its log exists)
    engine = sa.create_engine(database_url)
    count = "SELECT count(*) FROM activedb_transaction_log WHERE info -> 'rule_firings' ->> 'bench_immediate' = '40'"
    try:
        with engine.connect() as connection:
            before = connection.execute(sa.text(count)).scalar()
        instructions._run("immediate", 40, 2, "run")
        instructions._run("direct", 40, 2, "run")
        with engine.connect() as connection:
            fired = connection.execute(sa.text(count)).scalar() - before
            rows = connection.execute(sa.text("SELECT count(*), min(b), max(b) FROM bench_rows")).one()
    finally:
        engine.dispose()
    assert fired == 3                                     # the warm-up and two measured batches of 40 firings
    assert tuple(rows) == (40, "rule", "rule")            # (``direct`` writes what the rule writes)


def test_the_counter_workloads_leave_the_same_counters(database_url, monkeypatch):
    """``lowered`` and ``executemany``: two warm-up batches and two measured ones, each event of a batch a key of its
    own among twice the batch's size — every counter counted twice, by either path."""
    monkeypatch.setenv("ACTIVEDB_DATABASE_URL", database_url)
    engine = sa.create_engine(database_url)
    counters = {}
    try:
        for workload in ("lowered", "executemany"):
            instructions._run(workload, 40, 2, "run")
            with engine.connect() as connection:
                counters[workload] = dict(connection.execute(sa.text("SELECT key, n FROM bench_counters")).all())
    finally:
        engine.dispose()
    assert counters["lowered"] == counters["executemany"] == {key: 2 for key in range(80)}


def test_the_count_is_the_main_threads_total(tmp_path):
    output = tmp_path / "run.123-01"
    output.write_text("version: 1\ncreator: callgrind-3.19.0\nevents: Ir\nfn=(1) main\n16 5\ntotals: 123456\n")
    assert instructions._total(output) == 123456


@pytest.mark.skipif(shutil.which("callgrind_annotate") is None, reason="valgrind is not installed")
def test_a_count_leaves_out_the_connections_set_up(tmp_path):
    """What libpq's connection set-up cost (``PQconnectPoll``, inclusive: the authentication) is not counted."""
    output = tmp_path / "callgrind.out"
    output.write_text("version: 1\ncreator: test\ncmd: python\nevents: Ir\n"
                      "ob=libpython.so\nfl=ceval.c\nfn=main\n1 100\n"
                      "cob=libpq.so\ncfl=fe-connect.c\ncfn=PQconnectPoll\ncalls=1 0\n1 40\n"
                      "ob=libpq.so\nfl=fe-connect.c\nfn=PQconnectPoll\n1 30\ncfn=scram\ncalls=1 0\n1 10\n"
                      "fn=scram\n1 10\n"
                      "summary: 140\ntotals: 140\n")
    assert instructions._total(output) == 100
