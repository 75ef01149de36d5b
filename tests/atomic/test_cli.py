"""``activedb batches show`` and ``compensate`` on Fig. 2 of the paper (merges)."""

from __future__ import annotations

import json

from click.testing import CliRunner

from activedb.cli import main

from tests.atomic import _figures


def test_show_and_compensate_figure2(db, database_url, tmp_path):
    _figures.declare(db)
    fig = _figures.figure2(db)
    query, batch = fig.a(1)
    runner = CliRunner()

    def run(*args):
        result = runner.invoke(main, ["--url", database_url, "batches", *args], catch_exceptions=False)
        assert result.exit_code == 0, result.output
        return result.output

    picture = tmp_path / "fig2.png"
    shown = run("show", query, batch, "--png", str(picture))
    assert "𝒯(" in shown and "3 transaction(s)" in shown and "T31" in shown
    assert "independent scover (2 rounds, complete)" in shown
    assert picture.stat().st_size > 1000
    data = json.loads(run("show", query, batch, "--json"))
    assert fig.name_set(data["composite"]) == {"T11", "T21", "T31"} and len(data["independent_scover"]) == 6
    dry = run("compensate", query, batch, "--dry-run")
    assert "would compensate 3 transaction(s)" in dry and "interfering: yes" in dry
    assert len(fig.in_effect()) == 10
    done = json.loads(run("compensate", query, batch, "--mode", "non-intrusive", "--app", "tests.atomic._fig_app",
                          "--json"))
    assert not done["interfering"] and len(done["compensated"]) == 1
    assert "T11" not in fig.in_effect() and len(fig.in_effect()) == 9

    unknown = runner.invoke(main, ["--url", database_url, "batches", "show", "badges", "1"])
    assert unknown.exit_code == 1
    assert "a batch Spark ingestion consumed is named NAME@SPARK_QUERY_ID, e.g. `activedb batches show " \
           "badges@<id> BATCH`" in unknown.output


def test_prune_refuses_a_negative_age_as_a_usage_error():
    """Checked before anything is opened (no database is given): ``--older-than -5`` reached PostgreSQL as "recorded
    before five seconds from now" and forgot every transaction's lineage — the compensation of any batch needs it."""
    result = CliRunner().invoke(main, ["--url", "postgresql://nobody@/nowhere", "batches", "prune", "--older-than",
                                       "-5"])
    assert result.exit_code == 2 and "Invalid value for '--older-than'" in result.output, result.output


def test_show_of_a_lineage_with_a_cycle_draws_it_and_says_so(db, database_url, tmp_path):
    """A transaction that consumed a batch it produced (a self-loop), and two that each consumed the other's batch: the
    text tree listed nothing for them (no transaction without a predecessor to start from) and --png raised networkx's
    NetworkXUnfeasible; show now lists them, names the cycle (compensation refuses such a lineage) and draws it."""
    import uuid

    query = f"q{uuid.uuid4().hex[:8]}"
    with db.transaction(name="loop") as loop:
        db.batches.consumed(loop, query, 1)
        db.batches.produced(loop, query, 1)
    with db.transaction(name="ping") as ping:
        db.batches.consumed(ping, query, 2)
        db.batches.produced(ping, query, 3)
    with db.transaction(name="pong") as pong:
        db.batches.consumed(pong, query, 3)
        db.batches.produced(pong, query, 2)
    runner = CliRunner()
    for batch, members, cycle in (("1", [loop], f"{loop.log_id} → {loop.log_id}"),
                                  ("2", [ping, pong], None)):
        picture = tmp_path / f"cycle{batch}.png"
        result = runner.invoke(main, ["--url", database_url, "batches", "show", query, batch, "--png", str(picture)])
        assert result.exit_code == 0, result.output
        for member in members:
            assert f"{member.log_id} {member.name}" in result.output, result.output
        assert "cycle " in result.output and "compensation refuses" in result.output, result.output
        if cycle is not None:
            assert cycle in result.output
        assert picture.stat().st_size > 1000


def test_compensate_prints_how_many_it_compensated_not_how_many_it_planned(db, database_url, tmp_path):
    """Two compensations of one batch racing: the losing run compensates nothing (the other did it meanwhile), but
    printed 'compensated 1 transaction(s)' — the plan's count.  The race made deterministic: X's compensation, declared
    by --app, runs the other compensation of the batch first, which commits before it."""
    import uuid

    query = f"q{uuid.uuid4().hex[:8]}"
    app = tmp_path / "racing_app.py"
    app.write_text(f'''
calls = []


def register(db):
    @db.batches.compensation("unsee-{query}")
    def unsee(tx, detail):
        calls.append(tx.id)
        if len(calls) == 1:              # the other run, inside this one's compensating transaction
            db.batches.compensate(("{query}", 1))
        for row in tx.scan("events_seen", {{"detail": detail}}):
            tx.delete("events_seen", row["id"])
''')
    db.batches.compensation(f"unsee-{query}")(lambda tx, detail: None)    # (noted here, run by the CLI's --app)
    with db.transaction(name="load") as tx:
        db.batches.consumed(tx, query, 1)
        tx.insert("events_seen", rule="load", detail=query)
        db.batches.note(tx, f"unsee-{query}", detail=query)
    result = CliRunner().invoke(main, ["--url", database_url, "batches", "compensate", query, "1", "--app", str(app)])
    assert result.exit_code == 0, result.output
    assert f"compensated 0 transaction(s) of {query}/1" in result.output, result.output
    assert f"compensated meanwhile by another run: {tx.log_id}" in result.output, result.output


def test_a_max_rounds_below_one_is_a_usage_error_naming_the_option():
    """Checked before anything is opened (no database is given): it failed with exit status 1 once the batch was
    found, as "independent_scover(max_rounds=0) takes …", naming a function the command line never showed."""
    runner = CliRunner()
    for command in ("show", "compensate"):
        result = runner.invoke(main, ["--url", "postgresql://nobody@/nowhere", "batches", command, "badges", "1",
                                      "--max-rounds", "0"])
        assert result.exit_code == 2, result.output
        assert "Invalid value for '--max-rounds': 0 is not in the range x>=1" in result.output
