"""The paper's worked examples (Vidyasankar, *On Atomic Batch Executions in Stream Processing*, Figs.
1–5 and the isolated case) as lineage recorded by real transactions in real PostgreSQL: 𝒯(b), scover,
the independent scover (and its bound), and compensation — full, non-intrusive, of the independent
scover — with interference and partially dropped batches."""

from __future__ import annotations

import pytest

from activedb.atomic import BoundReached

from tests.atomic import _figures


@pytest.fixture
def fig_db(db):
    _figures.declare(db)
    return db


def test_isolated_batch(fig_db):
    db = fig_db
    fig = _figures.isolated(db)
    assert fig.name_set(db.batches.composite(fig.a(1))) == {"T11", "T21", "T31"}
    assert fig.name_set(db.batches.composite(fig.batch("P1", 1))) == {"T21", "T31"}
    assert fig.sources(db.batches.scover(fig.batch("P1", 1))) == {"a1"}
    cover = db.batches.independent_scover(fig.batch("P1", 1))
    assert fig.sources(cover.batches) == {"a1"} and cover.complete
    report = db.batches.compensate(fig.a(1))
    assert [fig.names[tid] for tid in report.compensated] == ["T31", "T21", "T11"]   # reverse order
    assert not report.plan.interfering and not report.plan.partially_dropped
    assert fig.in_effect() == set()
    # The compensating transactions are recorded in the lineage themselves.
    for tid in report.compensated:
        assert db.batches.transaction(tid).compensated_by == report.compensating[tid]
        assert db.batches.transaction(report.compensating[tid]).compensates == tid
    assert db.batches.compensate(fig.a(1)).compensated == []    # nothing twice


def test_figure1_splits(fig_db):
    db = fig_db
    fig = _figures.figure1(db)
    assert fig.name_set(db.batches.composite(fig.batch("P1", "1.1"))) == {"T2,11", "T3,111", "T3,112"}
    assert fig.sources(db.batches.scover(fig.batch("P1", "1.1"))) == {"a1"}
    assert len(db.batches.composite(fig.a(1))) == 10
    report = db.batches.compensate(fig.a(1))
    assert len(report.compensated) == 10 and not report.plan.interfering
    order = [fig.names[tid] for tid in report.compensated]
    assert order[-1] == "T11" and all(order.index(f"T3,1{j}{k}") < order.index(f"T2,1{j}")
                                      for j in (1, 2, 3) for k in (1, 2))
    assert fig.in_effect() == set()


def test_figure2_merges_three_options(fig_db):
    db = fig_db
    fig = _figures.figure2(db)
    assert fig.name_set(db.batches.composite(fig.a(1))) == {"T11", "T21", "T31"}
    assert fig.name_set(db.batches.composite(fig.a(2))) == {"T12", "T21", "T31"}

    # (a) T11 only: non-intrusive (breaks a1's monotonic execution: T21, T31 stay).
    plan_a = db.batches.plan(fig.a(1), mode="non-intrusive")
    assert fig.name_set(plan_a.order) == {"T11"} and not plan_a.interfering
    assert fig.name_set(plan_a.kept) == {"T21", "T31"}
    # (b) full compensation of 𝒯(a1): interfering, drops a'2, b'2, b'3.
    plan_b = db.batches.plan(fig.a(1), mode="full")
    assert [fig.names[tid] for tid in plan_b.order] == ["T31", "T21", "T11"]
    assert plan_b.interfering
    assert fig.sources(plan_b.losing_completion) == {"a2", "a3", "a4", "a5", "a6"}
    assert fig.sources(plan_b.partially_dropped) == {"P1/2", "P2/2", "P2/3"}
    # (c) full compensation of the independent scover {a1..a6}: everything, interfering with nobody.
    plan_c = db.batches.plan(fig.a(1), mode="full", scope="independent")
    assert fig.sources(plan_c.cover.batches) == {f"a{i}" for i in range(1, 7)}
    assert len(plan_c.order) == 10 and not plan_c.interfering and not plan_c.partially_dropped

    dry = db.batches.compensate(fig.a(1), mode="non-intrusive", dry_run=True)
    assert dry.compensated == [] and len(fig.in_effect()) == 10       # a dry run changes nothing
    db.batches.compensate(fig.a(1), mode="non-intrusive")
    assert fig.in_effect() == {f"T1{i}" for i in range(2, 7)} | {"T21", "T22", "T23", "T31"}
    # Widening it later compensates only what is left (T11 is not compensated twice).
    report = db.batches.compensate(fig.a(1), mode="full")
    assert fig.name_set(report.plan.already) == {"T11"}
    assert [fig.names[tid] for tid in report.compensated] == ["T31", "T21"]
    report = db.batches.compensate(fig.a(1), mode="full", scope="independent")
    assert len(report.compensated) == 7 and fig.in_effect() == set()


def test_figure3_splits_and_merges_share_a_transaction(fig_db):
    db = fig_db
    fig = _figures.figure3(db)
    t_a1 = fig.name_set(db.batches.composite(fig.a(1)))
    t_a2 = fig.name_set(db.batches.composite(fig.a(2)))
    assert t_a1 == {"T11", "T2,11", "T2,12", "T2,13", "T3,11", "T3,12"}
    assert t_a2 == {"T12", "T2,21", "T2,22", "T2,23", "T3,12", "T3,13"}
    assert t_a1 & t_a2 == {"T3,12"}
    for source in (1, 2):
        assert fig.sources(db.batches.independent_scover(fig.a(source)).batches) == {"a1", "a2"}
    full = db.batches.plan(fig.a(1), mode="full")
    assert full.interfering and fig.sources(full.losing_completion) == {"a2"}
    assert fig.sources(full.partially_dropped) == {"P2/2.1"}          # b'21 dropped from c12
    non_intrusive = db.batches.plan(fig.a(1), mode="non-intrusive")
    assert fig.name_set(non_intrusive.order) == t_a1 - {"T3,12"} and not non_intrusive.interfering


def test_figure4_overlap_is_cut_at_the_bound(fig_db):
    db = fig_db
    fig = _figures.figure4(db, sources=5)
    report = db.batches.plan(fig.a(3), mode="full")
    assert len(report.order) == 3 + 2 + 2                             # every transaction of the figure
    assert fig.sources(report.partially_dropped) >= {"a4", "a5"}
    # Continue the pattern: the closure grows by a window each round.
    long = _figures.figure4(db, sources=14)
    cut = db.batches.independent_scover(long.a(3), max_rounds=2)
    assert cut.cut is BoundReached.ROUNDS and not cut.complete and cut.frontier
    assert cut.rounds == 2
    cut = db.batches.independent_scover(long.a(3), max_transactions=10)
    assert cut.cut is BoundReached.TRANSACTIONS
    whole = db.batches.independent_scover(long.a(3))
    assert whole.complete and long.sources(whole.batches) == {f"a{i}" for i in range(1, 15)}
    assert whole.rounds > 2
    plan = db.batches.plan(long.a(3), mode="full", scope="independent", max_rounds=2)
    assert plan.cover.cut is BoundReached.ROUNDS and plan.interfering


def test_figure5_relaxed_batch_order(fig_db):
    db = fig_db
    fig = _figures.figure5(db)
    b1 = [fig.batch("P1", 1), fig.batch("P1", 3)]                    # P2's input b1 = a'3·a'1
    assert fig.sources(db.batches.scover(*b1)) == {"a1", "a3"}
    assert fig.sources(db.batches.scover(*b1, consecutive=True)) == {"a1", "a2", "a3"}
    assert fig.sources(db.batches.independent_scover(fig.a(1)).batches) == {"a1", "a3"}
    consecutive = db.batches.independent_scover(fig.a(1), consecutive=True)
    assert fig.sources(consecutive.batches) == {f"a{i}" for i in range(1, 7)}
